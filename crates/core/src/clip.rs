//! Bounds on what a caller can make toolgate store or say back. An agent chooses tool names,
//! `_meta` fields and inputs; whatever it sends that is not refused outright ends up in audit
//! records, traces and pages, so each is bounded where it enters: a name is cut to
//! [`NAME_CHARS`] characters (at a character boundary, saying how much was cut), and inputs larger
//! than [`INPUT_BYTES`] are kept as their size and hash only. And whatever of it is printed for a
//! person — in a terminal or on a page — goes through [`printable`], so a control sequence cannot
//! drive the terminal and a direction override cannot make an IBAN read backwards.

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::canon::{canonical, sha256_tagged};

/// The most characters of a name (a tool, a run, a model) that are stored or echoed.
pub const NAME_CHARS: usize = 128;

/// The most bytes of canonical inputs an audit record holds; larger inputs are summarised.
pub const INPUT_BYTES: usize = 64 * 1024;

/// `s` cut to `max` characters, with a note of how many more there were.
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((at, _)) => {
            let more = s[at..].chars().count();
            Cow::Owned(format!("{}… ({more} more characters)", &s[..at]))
        }
    }
}

/// `inputs` as an audit record may hold them: unchanged up to [`INPUT_BYTES`] of canonical JSON,
/// otherwise `{"$omitted": {"bytes": N, "sha256": …}}` (the hash still ties the record to them).
pub fn bounded_inputs(inputs: &Value) -> Cow<'_, Value> {
    let text = canonical(inputs);
    if text.len() <= INPUT_BYTES {
        return Cow::Borrowed(inputs);
    }
    Cow::Owned(json!({"$omitted": {
        "bytes": text.len(),
        "sha256": sha256_tagged(text.as_bytes()),
    }}))
}

/// Whether `c` changes how the text around it is shown rather than being shown: a control
/// character (C0, DEL, C1), a bidirectional embedding, override, isolate or mark, a zero-width
/// character, a line or paragraph separator, a byte-order mark.
fn hides(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `s` as a person may safely see it on one line: every character that would act instead of
/// being shown (see `hides`: terminal control sequences, newlines, direction overrides,
/// zero-width characters) written out as a visible escape, `\u{202e}` or `\n`. Other text,
/// multi-byte included, is unchanged.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hides) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if hides(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A JSON text with every character `printable` would write out escaped as JSON does
/// (`\u202e`): the same document to a parser, but one a terminal shows instead of obeying.
/// Only string contents can hold such characters, and a JSON escape is valid in any string,
/// so the text stays valid JSON with the same values; it is no longer byte-for-byte the
/// canonical form, so what is hashed is written as it is.
pub fn json_printable(json: &str) -> Cow<'_, str> {
    if !json.chars().any(hides) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        match c {
            // Outside strings only these whitespace characters may appear raw.
            '\n' | '\r' | '\t' => out.push(c),
            c if hides(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_its_values_and_loses_its_power_over_a_terminal() {
        let v = serde_json::json!({"reason": "ok\u{202e}DEVORPPA\u{1b}[31m\u{9b}x", "n": "東京"});
        let text = serde_json::to_string_pretty(&v).unwrap();
        let shown = json_printable(&text);
        // Nothing acts but the document's own line breaks.
        assert!(!shown.chars().any(|c| hides(c) && c != '\n'), "{shown}");
        assert!(
            shown.contains("\\u202e") && shown.contains("\\u009b"),
            "{shown}"
        );
        assert!(shown.contains("東京"), "other text is left alone");
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, v, "the same document");
        assert_eq!(json_printable("{\"a\": 1}"), "{\"a\": 1}");
    }

    #[test]
    fn names_are_cut_at_a_character_boundary_saying_how_much() {
        assert_eq!(clip("short", 10), "short");
        let long = "é".repeat(200);
        let cut = clip(&long, NAME_CHARS);
        assert!(cut.starts_with(&"é".repeat(NAME_CHARS)));
        assert!(cut.ends_with("… (72 more characters)"), "{cut}");
        // Multi-byte text right at the limit is not split.
        assert_eq!(clip("日本語", 2), "日本… (1 more characters)");
    }

    #[test]
    fn what_would_act_instead_of_being_shown_is_written_out() {
        assert_eq!(printable("Zahlung für März"), "Zahlung für März");
        assert_eq!(
            printable("pay\u{1b}[2J\u{1b}]0;x\u{7}now"),
            "pay\\u{001b}[2J\\u{001b}]0;x\\u{0007}now"
        );
        assert_eq!(printable("a\nb\r\tc"), "a\\nb\\r\\tc");
        assert_eq!(
            printable("DE89\u{202e}0003"),
            "DE89\\u{202e}0003",
            "a direction override is shown, not obeyed"
        );
        assert_eq!(
            printable("x\u{200b}y\u{2066}z\u{feff}"),
            "x\\u{200b}y\\u{2066}z\\u{feff}"
        );
        assert_eq!(printable("\u{85}"), "\\u{0085}");
    }

    #[test]
    fn large_inputs_are_kept_as_size_and_hash() {
        let small = json!({"a": "b"});
        assert_eq!(bounded_inputs(&small).as_ref(), &small);
        let big = json!({"text": "x".repeat(INPUT_BYTES)});
        let b = bounded_inputs(&big);
        assert!(b["$omitted"]["bytes"].as_u64().unwrap() > INPUT_BYTES as u64);
        assert!(
            b["$omitted"]["sha256"]
                .as_str()
                .unwrap()
                .starts_with("sha256:")
        );
    }
}

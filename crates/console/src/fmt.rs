//! How times, durations and JSON values read on the page and in the terminal.

use serde_json::Value;
use toolgate_core::Timestamp;

/// `2026-06-11 09:42 UTC`.
pub fn datetime(t: Timestamp) -> String {
    let Ok(dt) = time::OffsetDateTime::from_unix_timestamp_nanos(t.millis() as i128 * 1_000_000)
    else {
        return format!("{} ms", t.millis());
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        dt.year(),
        dt.month() as u8,
        dt.day(),
        dt.hour(),
        dt.minute()
    )
}

/// A duration for people: `3 d 4 h`, `2 h 05 min`, `14 min`, `40 s`.
pub fn duration_ms(ms: i64) -> String {
    let neg = ms < 0;
    let s = ms.unsigned_abs() / 1000;
    let (d, h, m) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    let text = if d > 0 {
        format!("{d} d {h} h")
    } else if h > 0 {
        format!("{h} h {m:02} min")
    } else if m > 0 {
        format!("{m} min")
    } else {
        format!("{s} s")
    };
    if neg { format!("-{text}") } else { text }
}

/// A JSON value as its canonical text (strings quoted, numbers exactly as they will be sent),
/// with anything that would act instead of being shown (a control sequence, a direction
/// override) written out visibly: what a person approves is what is sent, character by character.
pub fn value(v: &Value) -> String {
    toolgate_core::clip::printable(&toolgate_core::canonical(v)).into_owned()
}

/// A scalar as people read it: strings without quotes, everything else canonical; shown as
/// [`value`] shows it.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => text(s),
        other => value(other),
    }
}

/// Text from a caller (a reason, a run id, a name) as people may safely see it.
pub fn text(s: &str) -> String {
    toolgate_core::clip::printable(s).into_owned()
}

/// Text of several lines (an e-mail's body) as people read it: one entry per line, each shown
/// as [`text`] shows it, so a line break reads as one and nothing else acts.
pub fn lines(s: &str) -> Vec<String> {
    s.split('\n').map(text).collect()
}

/// An amount as people write money: thousands separated, two decimals, then the currency
/// (`12,600.50 EUR`; `-1,234.00` without one). A transposed or misplaced digit shows.
pub fn money(x: f64, currency: &str) -> String {
    let cents = (x.abs() * 100.0).round() as u64;
    let whole = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if x < 0.0 && cents > 0 { "-" } else { "" };
    format!("{sign}{grouped}.{:02} {}", cents % 100, text(currency))
        .trim_end()
        .to_string()
}

/// True when a field (its last dotted segment) holds an amount of money.
pub fn is_amount(path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path);
    last == "amount" || last.ends_with("_amount") || last == "total"
}

/// A value as people read it, money formatted when `path` names an amount and the value is a
/// number (`currency` from the same record), otherwise as [`plain`] shows it.
pub fn cell(path: &str, v: &Value, currency: Option<&str>) -> String {
    match v.as_f64() {
        Some(x) if is_amount(path) && v.is_number() => money(x, currency.unwrap_or_default()),
        _ => plain(v),
    }
}

/// The last twelve characters of an id (a run id is the caller's choice: counted in
/// characters, never bytes, and shown as text people may safely see).
pub fn short(id: &str) -> String {
    let chars = id.chars().count();
    let tail = if chars > 13 {
        format!("…{}", id.chars().skip(chars - 12).collect::<String>())
    } else {
        id.to_string()
    };
    text(&tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_and_durations_read_plainly() {
        assert_eq!(datetime(Timestamp::from_millis(0)), "1970-01-01 00:00 UTC");
        assert_eq!(duration_ms(40_000), "40 s");
        assert_eq!(duration_ms(14 * 60_000), "14 min");
        assert_eq!(duration_ms(2 * 3_600_000 + 5 * 60_000), "2 h 05 min");
        assert_eq!(duration_ms(3 * 86_400_000 + 4 * 3_600_000), "3 d 4 h");
        assert_eq!(duration_ms(-60_000), "-1 min");
    }

    #[test]
    fn money_reads_with_separators_and_its_currency() {
        assert_eq!(money(12600.5, "EUR"), "12,600.50 EUR");
        assert_eq!(money(1234567.0, ""), "1,234,567.00");
        assert_eq!(money(-980.0, "EUR"), "-980.00 EUR");
        assert_eq!(money(4180.0, "EUR\u{202e}"), "4,180.00 EUR\\u{202e}");
        let v = serde_json::json!(4810);
        assert_eq!(cell("amount", &v, Some("EUR")), "4,810.00 EUR");
        assert_eq!(
            cell("invoice_id", &serde_json::json!("INV-1"), None),
            "INV-1"
        );
    }
}

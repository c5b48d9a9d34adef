//! How an audit record's text is kept in the `record` column.
//!
//! The chain hashes a record's canonical JSON, and that text is what every reader gets back.
//! What the column holds is either that text itself (it starts with `{`) or the text packed:
//! `z1:` and the base64 of a zstd frame compressed against dictionary 1, a fixed set of typical
//! records ([`DICTIONARY_1`]). Records repeat most of their bytes — field names, the twelve
//! checks and their wording, the tool and its version — so against the dictionary a governed
//! read's 1.7 KB record is kept in about 300 bytes, and the store grows by that much less per
//! call (its pages, its write-ahead log, its backups).
//!
//! - **Both backends, one value.** The packed form is text, so SQLite and PostgreSQL store the
//!   same value in the same column, and the group commit's array statement carries it as is.
//! - **Old records stay as they were.** Records written before packing existed are plain text
//!   and read as before; a record that would not get smaller is kept plain.
//! - **A dictionary is forever.** A packed record can only be read with the dictionary it was
//!   packed against, so dictionary 1 never changes (a test pins its hash). A better dictionary
//!   would be dictionary 2, under its own prefix, with 1 still read.
//! - **Tampering.** A packed record that does not unpack, or unpacks to text that is not its
//!   canonical JSON, is a broken link to `log verify`, as an edited plain record is.

use std::cell::RefCell;
use std::io::Read;
use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use zstd::dict::{DecoderDictionary, EncoderDictionary};

/// Typical canonical records of the example registries (hashes and ids zeroed), one per line;
/// the most common kind, an allowed read, last (nearest the data it helps compress).
const DICTIONARY_1: &[u8] = include_bytes!("packed/dictionary-1.jsonl");

/// The prefix of a record packed against [`DICTIONARY_1`].
const PREFIX_1: &str = "z1:";

/// zstd's level: 3 (its default) packs a read's record in a few microseconds; higher levels
/// saved a few bytes more at several times the time.
const LEVEL: i32 = 3;

/// The largest text a packed record may unpack to. Bigger than any record toolgate writes (a
/// call's inputs are bounded by their schemas and the transport), and small enough that a
/// forged frame cannot make a reader allocate without bound.
const MAX_TEXT: u64 = 64 << 20;

static ENCODER_1: LazyLock<EncoderDictionary<'static>> =
    LazyLock::new(|| EncoderDictionary::copy(DICTIONARY_1, LEVEL));
static DECODER_1: LazyLock<DecoderDictionary<'static>> =
    LazyLock::new(|| DecoderDictionary::copy(DICTIONARY_1));

thread_local! {
    /// One compression context per thread (the group-commit writer packs every record), so a
    /// record costs its compression and not a context's set-up.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
}

/// The value to store for the canonical record `text`: packed, or `text` itself when packing
/// would not make it smaller (or, which zstd does not do in practice, fails).
pub(crate) fn pack(text: String) -> String {
    let frame = COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::bulk::Compressor::with_prepared_dictionary(&ENCODER_1).ok();
        }
        cell.as_mut()?.compress(text.as_bytes()).ok()
    });
    match frame {
        Some(frame) if PREFIX_1.len() + frame.len().div_ceil(3) * 4 < text.len() => {
            let mut packed = String::with_capacity(PREFIX_1.len() + frame.len().div_ceil(3) * 4);
            packed.push_str(PREFIX_1);
            STANDARD.encode_string(&frame, &mut packed);
            packed
        }
        _ => text,
    }
}

/// Why a stored record could not be read back as text.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("it is neither a JSON record nor a packed one (starts {0:?})")]
    UnknownForm(String),
    #[error("its packed form is not valid base64")]
    Base64,
    #[error("its packed form does not decompress: {0}")]
    Frame(#[source] std::io::Error),
    #[error("it unpacks to more than {MAX_TEXT} bytes")]
    TooLarge,
    #[error("it unpacks to text that is not UTF-8")]
    NotUtf8,
}

/// The record text a stored value holds: itself when plain, unpacked when packed.
pub(crate) fn unpack(stored: String) -> Result<String, Unreadable> {
    if stored.starts_with('{') {
        return Ok(stored);
    }
    let Some(b64) = stored.strip_prefix(PREFIX_1) else {
        return Err(Unreadable::UnknownForm(stored.chars().take(8).collect()));
    };
    let frame = STANDARD.decode(b64).map_err(|_| Unreadable::Base64)?;
    let decoder = zstd::stream::read::Decoder::with_prepared_dictionary(&frame[..], &DECODER_1)
        .map_err(Unreadable::Frame)?;
    let mut text = Vec::with_capacity(frame.len() * 6);
    decoder
        .take(MAX_TEXT + 1)
        .read_to_end(&mut text)
        .map_err(Unreadable::Frame)?;
    if text.len() as u64 > MAX_TEXT {
        return Err(Unreadable::TooLarge);
    }
    String::from_utf8(text).map_err(|_| Unreadable::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_1_never_changes() {
        // Records packed against it can only be read with it: a new dictionary is a new prefix.
        assert_eq!(
            toolgate_core::canon::sha256_tagged(DICTIONARY_1),
            "sha256:f84b27933e9d431113fab6a8c0c311e9d3b3861418044fb5bfa5c3a31f96a18b",
            "dictionary 1 changed: records packed against it would no longer unpack"
        );
    }

    #[test]
    fn a_typical_record_packs_small_and_unpacks_to_itself() {
        let text = std::str::from_utf8(DICTIONARY_1)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .replace("0000-0000", "1234-5678")
            .replace("fin-planner", "ap-agent-7");
        let packed = pack(text.clone());
        assert!(packed.starts_with(PREFIX_1), "{packed}");
        assert!(
            packed.len() * 3 < text.len(),
            "{} of {}",
            packed.len(),
            text.len()
        );
        assert_eq!(unpack(packed).unwrap(), text);
    }

    #[test]
    fn text_that_packing_would_not_shrink_is_kept_plain() {
        let text = "{}".to_string();
        assert_eq!(pack(text.clone()), text);
        assert_eq!(unpack(text.clone()).unwrap(), text);
    }

    #[test]
    fn multi_byte_and_control_characters_survive() {
        let text = format!(
            "{{\"inputs\":{{\"memo\":\"Zahlung f\u{fc}r \u{202e}evil\u{202c} \u{1F4B8}\\u0007 {}\"}}}}",
            "\u{4e2d}\u{6587}".repeat(400)
        );
        let packed = pack(text.clone());
        assert!(packed.starts_with(PREFIX_1));
        assert_eq!(unpack(packed).unwrap(), text);
    }

    #[test]
    fn damaged_packed_records_are_named_not_read() {
        let text = std::str::from_utf8(DICTIONARY_1)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_string();
        let packed = pack(text);
        assert!(matches!(unpack("z1:!!!".into()), Err(Unreadable::Base64)));
        assert!(matches!(
            unpack("z1:AAAA".into()),
            Err(Unreadable::Frame(_))
        ));
        assert!(matches!(
            unpack("<record/>".into()),
            Err(Unreadable::UnknownForm(_))
        ));
        // A frame cut short does not decompress.
        let cut = format!("{PREFIX_1}{}", {
            let frame = STANDARD.decode(&packed[PREFIX_1.len()..]).unwrap();
            STANDARD.encode(&frame[..frame.len() - 8])
        });
        let e = unpack(cut).unwrap_err();
        assert!(matches!(e, Unreadable::Frame(_)), "{e}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the decompressor's error is kept as the source"
        );
    }

    #[test]
    fn a_frame_that_unpacks_beyond_the_limit_is_refused() {
        // 65 MiB of one byte compresses to a few kilobytes: a forged record may not make a
        // reader hold all of it.
        let big = vec![b'{'; (MAX_TEXT + (1 << 20)) as usize];
        let frame = zstd::bulk::compress(&big, 1).unwrap();
        let stored = format!("{PREFIX_1}{}", STANDARD.encode(frame));
        assert!(matches!(unpack(stored), Err(Unreadable::TooLarge)));
    }
}

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
}

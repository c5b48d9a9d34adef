//! The call record: one JSON line per delivery of a `tools/call`, written before the answer is
//! sent (or withheld), so a test reading the file sees every effect the fake committed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One delivery of one call, as the target system saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339 UTC time the delivery finished.
    pub ts: String,
    /// Which fake (`finance`, `field`, `conformance`).
    pub server: String,
    /// Order of this delivery among all deliveries to this process (from 1).
    pub seq: u64,
    pub tool: String,
    pub arguments: Value,
    /// The request's `_meta`, as sent.
    pub meta: Value,
    /// `_meta.idempotency_key`, when the caller sent one.
    pub idempotency_key: Option<String>,
    /// 1 for the call as sent; 2 for the copy a `duplicate-delivery` fault injected.
    pub delivery: u32,
    /// Faults that fired on this call.
    pub faults: Vec<String>,
    pub outcome: RecordOutcome,
}

/// What happened at the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordOutcome {
    /// `ok`, `tool_error`, `no_response` (committed, never answered), `error_after_commit`,
    /// `unknown_tool`.
    pub status: String,
    /// Whether this delivery changed the target's state (booked, sent, wrote).
    pub committed: bool,
    /// Whether an earlier result was returned for the same idempotency key.
    pub replayed: bool,
    /// The structured result, or the text of the first content block.
    pub result: Value,
}

/// Appends records to a JSONL file; a no-op without one.
#[derive(Debug, Default)]
pub struct Recorder {
    file: Option<Mutex<File>>,
    seq: Mutex<u64>,
}

impl Recorder {
    /// A recorder writing to `path` (appending; created if missing).
    pub fn to_file(path: &Path) -> std::io::Result<Recorder> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Recorder {
            file: Some(Mutex::new(file)),
            seq: Mutex::new(0),
        })
    }

    /// A recorder that only counts.
    pub fn disabled() -> Recorder {
        Recorder::default()
    }

    /// The next sequence number.
    pub fn next_seq(&self) -> u64 {
        let mut seq = self.seq.lock().expect("record sequence lock");
        *seq += 1;
        *seq
    }

    /// Writes one record as a single line, flushed before returning.
    pub fn write(&self, record: &Record) {
        let Some(file) = &self.file else { return };
        let mut line = serde_json::to_string(record).expect("records serialise");
        line.push('\n');
        let mut f = file.lock().expect("record file lock");
        // One write per line: readers never see half a record.
        if let Err(e) = f.write_all(line.as_bytes()).and_then(|()| f.flush()) {
            eprintln!("toolgate-fake: cannot write the call record: {e}");
        }
    }
}

/// Reads a record file back (for tests and benchmarks).
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
        .collect()
}

/// Now as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(since.as_secs() as i64, since.subsec_millis())
}

/// Formats a Unix time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (proleptic Gregorian, UTC).
pub fn rfc3339(secs: i64, millis: u32) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    let nanos = i128::from(secs) * 1_000_000_000 + i128::from(millis) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_else(|| format!("{secs}.{millis:03} s after the epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_781_170_937, 318), "2026-06-11T09:42:17.318Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
    }
}

//! A server-sent events parser for the lean upstream hop ([`crate::hop`]): an upstream may answer
//! a `tools/call` as `text/event-stream`, with progress and other messages before the answer.
//!
//! Bytes are fed as the network delivers them, so a line (and a UTF-8 character inside it) can
//! be split across chunks at any byte: only complete lines are decoded. Lines end with CRLF, LF
//! or a lone CR, a CRLF may itself be split across chunks; `data:` lines of one event are joined
//! with newlines, comments (`:` lines) and unknown fields are skipped, `id:` is kept (without a
//! NUL, as the format says). An event larger than the limit is an error rather than memory
//! spent on an upstream that never ends its line.

/// One dispatched event. `event` is empty for the default type (`message`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
    /// The last event id seen on the stream when this event was dispatched.
    pub id: Option<String>,
}

/// Why an event stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event of the upstream's stream exceeds {limit} bytes")]
    EventTooLarge { limit: usize },
}

/// An incremental parser: [`SseParser::feed`] each chunk, events come out as they complete.
#[derive(Debug)]
pub struct SseParser {
    /// The current line, not yet ended.
    line: Vec<u8>,
    data: String,
    event: String,
    id: Option<String>,
    limit: usize,
    /// The last line ended with CR: an LF first in the next chunk belongs to it.
    after_cr: bool,
    /// The stream's first bytes, where a byte-order mark is skipped, are still to come.
    at_start: bool,
}

const BOM: &[u8] = "\u{feff}".as_bytes();

impl SseParser {
    /// A parser that refuses events larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        SseParser {
            line: Vec::new(),
            data: String::new(),
            event: String::new(),
            id: None,
            limit,
            after_cr: false,
            at_start: true,
        }
    }

    /// Takes the next chunk of the stream, appending each event it completes to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if chunk.is_empty() {
            return Ok(());
        }
        if self.at_start {
            // Held until it is clear whether the stream starts with a byte-order mark.
            self.line.extend_from_slice(chunk);
            if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
                return Ok(());
            }
            self.at_start = false;
            let held = std::mem::take(&mut self.line);
            return self.feed(held.strip_prefix(BOM).unwrap_or(&held), out);
        }
        if self.after_cr && chunk[0] == b'\n' {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while let Some(end) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.check_size(end)?;
            self.line.extend_from_slice(&chunk[..end]);
            let line = std::mem::take(&mut self.line);
            self.take_line(&line, out);
            let crlf = chunk[end] == b'\r' && chunk.get(end + 1) == Some(&b'\n');
            self.after_cr = chunk[end] == b'\r' && end + 1 == chunk.len();
            chunk = &chunk[end + if crlf { 2 } else { 1 }..];
        }
        self.check_size(chunk.len())?;
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    /// What the event holds so far, with `more` bytes of the open line, must stay in the limit
    /// (comments and ended events are not held, so they do not count).
    fn check_size(&self, more: usize) -> Result<(), SseError> {
        if self.data.len() + self.event.len() + self.line.len() + more > self.limit {
            return Err(SseError::EventTooLarge { limit: self.limit });
        }
        Ok(())
    }

    /// One complete line: a field of the event being read, a comment, or its end.
    fn take_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match name {
            b"data" => {
                self.data.push_str(&value);
                self.data.push('\n');
            }
            b"event" => self.event = value.into_owned(),
            b"id" if !value.contains('\0') => self.id = Some(value.into_owned()),
            // `retry` only matters to a client that reconnects the stream; this one does not.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        out.push(SseEvent {
            event,
            data,
            id: self.id.clone(),
        });
    }
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;

use super::*;

fn parse_chunks(chunks: &[&[u8]]) -> Result<Vec<SseEvent>, SseError> {
    let mut p = SseParser::new(1024);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, &mut out)?;
    }
    Ok(out)
}

fn parse(text: &str) -> Vec<SseEvent> {
    parse_chunks(&[text.as_bytes()]).unwrap()
}

/// Every way of cutting `bytes` in two gives the same events as feeding it whole.
fn same_at_every_split(bytes: &[u8]) -> Vec<SseEvent> {
    let whole = parse_chunks(&[bytes]).unwrap();
    for i in 0..=bytes.len() {
        let (a, b) = bytes.split_at(i);
        assert_eq!(parse_chunks(&[a, b]).unwrap(), whole, "split at byte {i}");
    }
    let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(
        parse_chunks(&bytewise).unwrap(),
        whole,
        "one byte at a time"
    );
    whole
}

fn ev(data: &str) -> SseEvent {
    SseEvent {
        data: data.into(),
        ..SseEvent::default()
    }
}

#[test]
fn an_event_is_its_data_lines_joined() {
    assert_eq!(
        parse("data: {\"a\":\ndata:1}\n\n"),
        vec![ev("{\"a\":\n1}")],
        "one leading space is dropped, a missing one is fine"
    );
    assert_eq!(parse("data:  two spaces\n\n"), vec![ev(" two spaces")]);
    assert_eq!(parse("data\n\n"), vec![ev("")], "a field without a colon");
}

#[test]
fn comments_unknown_fields_and_empty_events_are_skipped() {
    let out = parse(": keep-alive\n\nretry: 300\nfoo: bar\n\ndata: x\n: in the middle\n\n");
    assert_eq!(out, vec![ev("x")]);
}

#[test]
fn event_type_and_id_are_kept_and_id_carries_over() {
    let out = parse("event: message\nid: 7\ndata: a\n\ndata: b\n\nid: bad\0id\ndata: c\n\n");
    assert_eq!(out[0].event, "message");
    assert_eq!(out[0].id.as_deref(), Some("7"));
    assert_eq!(out[1].event, "", "the type is per event");
    assert_eq!(out[1].id.as_deref(), Some("7"), "the last id stays");
    assert_eq!(
        out[2].id.as_deref(),
        Some("7"),
        "an id with a NUL is ignored"
    );
}

#[test]
fn crlf_cr_and_lf_all_end_lines() {
    let want = vec![ev("a\nb"), ev("c")];
    assert_eq!(parse("data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n"), want);
    assert_eq!(parse("data: a\rdata: b\r\rdata: c\r\r"), want);
    assert_eq!(parse("data: a\ndata: b\r\n\rdata: c\n\r\n"), want);
}

#[test]
fn a_crlf_split_across_chunks_is_one_line_end() {
    let out = parse_chunks(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]).unwrap();
    assert_eq!(out, vec![ev("a\nb")]);
    // A lone CR at a chunk's end, then another line: not a blank line in between.
    let out = parse_chunks(&[b"data: a\r", b"data: b\r\r"]).unwrap();
    assert_eq!(out, vec![ev("a\nb")]);
}

#[test]
fn every_split_of_a_realistic_stream_parses_alike() {
    let stream = "id: 1\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n\r\n\
                  : ping\n\nid: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"tg-1\",\n data: \"result\":{}}\n\n";
    let out = same_at_every_split(stream.as_bytes());
    assert_eq!(out.len(), 2);
}

#[test]
fn multi_byte_text_split_inside_a_character() {
    let stream = "data: {\"text\":\"Zahlung über 10 € — 支払い 🙂\"}\n\n";
    let out = same_at_every_split(stream.as_bytes());
    assert_eq!(
        out,
        vec![ev("{\"text\":\"Zahlung über 10 € — 支払い 🙂\"}")]
    );
}

#[test]
fn a_byte_order_mark_at_the_start_is_skipped_even_split() {
    let stream = "\u{feff}data: x\n\n";
    assert_eq!(same_at_every_split(stream.as_bytes()), vec![ev("x")]);
    // Only at the start of the stream.
    assert_eq!(parse("data: a\n\n\u{feff}data: b\n\n").len(), 1);
}

#[test]
fn invalid_utf8_is_replaced_not_fatal() {
    let out = parse_chunks(&[b"data: a\xff\xfeb\n\n"]).unwrap();
    assert_eq!(out, vec![ev("a\u{fffd}\u{fffd}b")]);
}

#[test]
fn an_event_over_the_limit_is_refused_in_one_chunk_or_many() {
    let mut p = SseParser::new(64);
    let mut out = Vec::new();
    let huge = format!("data: {}\n\n", "x".repeat(100));
    assert_eq!(
        p.feed(huge.as_bytes(), &mut out),
        Err(SseError::EventTooLarge { limit: 64 })
    );
    // A line that never ends, fed in small pieces, is refused once past the limit.
    let mut p = SseParser::new(64);
    let mut refused = false;
    for _ in 0..100 {
        if p.feed(b"data: xxxxxxxx", &mut out).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "an endless line must not be held without bound");
    // Many data lines adding up to more than the limit.
    let mut p = SseParser::new(64);
    let many = "data: 0123456789\n".repeat(10);
    assert!(p.feed(many.as_bytes(), &mut out).is_err());
}

#[test]
fn comments_and_ended_events_do_not_count_against_the_limit() {
    let mut p = SseParser::new(64);
    let mut out = Vec::new();
    for _ in 0..1000 {
        p.feed(b": keep-alive comment of some length\n", &mut out)
            .unwrap();
        p.feed(b"data: 0123456789\n\n", &mut out).unwrap();
    }
    assert_eq!(out.len(), 1000);
}

#[test]
fn an_unfinished_event_at_the_end_is_not_dispatched() {
    assert_eq!(parse("data: a\n\ndata: b\n"), vec![ev("a")]);
}

//! Hostile strings from an agent — terminal control sequences, direction overrides, newlines,
//! multi-byte text, huge values — in a tool name, `_meta` and inputs: each is bounded where it
//! enters (what is stored, what is echoed), and the terminal printers people read (`toolgate
//! trace`, `toolgate approvals list|show`) write them out visibly instead of obeying them.

use serde_json::json;

use crate::clients::workspace_binary;
use crate::common::*;

/// Characters that would act on a terminal or reorder text if printed raw.
fn acts(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

const NASTY: &str =
    "Zahlung\u{1b}[2J\u{1b}]0;pwned\u{7} für \u{202e}NABI\u{202c} 日本\r\napproved by alice";

async fn cli(h: &Harness, args: &[&str]) -> String {
    let out = tokio::process::Command::new(workspace_binary("toolgate", "toolgate"))
        .args(args)
        .arg("-c")
        .arg(h.dir.path())
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_strings_are_bounded_where_they_enter_and_shown_not_obeyed() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let run = "run-hostile";

    // A 100,000-character tool name with control characters: refused as unknown; the answer and
    // the record name it in at most 128 characters.
    let name = format!("x{NASTY}{}", "y".repeat(100_000));
    let err = call(&worker, &name, json!({}), json!({"run_id": run}))
        .await
        .unwrap_err();
    assert!(
        err.to_string().len() < 1_000,
        "{} bytes",
        err.to_string().len()
    );

    // Out-of-bounds _meta: refused by the schema check naming the field; nothing stored whole.
    let r = call(
        &worker,
        "note.draft",
        json!({"invoice_id": "INV-20260615", "kind": "query", "text": "fine"}),
        json!({"purpose": "billing", "reason": "r".repeat(3_000), "run_id": run}),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    let facts = r.structured_content.unwrap();
    assert_eq!(facts["check"], "schema", "{facts}");
    assert!(facts.to_string().contains("/_meta/reason"), "{facts}");

    // Hostile text within bounds: a refused input (its pattern) and a reason that is stored, on
    // a payment parked for a person.
    let r = call(
        &worker,
        "note.draft",
        json!({"invoice_id": NASTY, "kind": "query", "text": "x".repeat(70_000)}),
        json!({"purpose": "billing", "reason": NASTY, "run_id": run}),
    )
    .await
    .unwrap();
    assert_eq!(r.structured_content.unwrap()["check"], "schema");
    let pay = json!({"invoice_id": "INV-20260612", "amount": 12600.0, "currency": "EUR",
                     "value_date": "2026-07-03", "reason": format!("Pay it now, PO-77840 {NASTY}")});
    let r = call(
        &worker,
        "payment.schedule",
        pay,
        // Its own run: the refusals above would stop spending in theirs.
        json!({"purpose": "billing", "reason": format!("{NASTY} matched PO-77840"), "run_id": "run-hostile-pay",
               "evidence": [NASTY], "model": "m".repeat(10_000)}),
    )
    .await
    .unwrap();
    let parked = r.structured_content.unwrap();
    assert_eq!(parked["status"], "needs_approval", "{parked}");
    let id = parked["approval_id"].as_str().unwrap().to_string();

    // What was stored is bounded.
    let records = h
        .gateway
        .state
        .store
        .audit_records(None, Some(run))
        .await
        .unwrap();
    let unknown = records
        .iter()
        .find(|r| r.body.tool.starts_with('x'))
        .unwrap();
    assert!(
        unknown.body.tool.chars().count() < 200,
        "{}",
        unknown.body.tool.len()
    );
    let oversized = records
        .iter()
        .find(|r| r.body.inputs.get("$omitted").is_some())
        .expect("the 70 KB refused input is kept as its size and hash");
    assert!(oversized.body.inputs["$omitted"]["sha256"].is_string());
    let paid = h
        .gateway
        .state
        .store
        .audit_records(None, Some("run-hostile-pay"))
        .await
        .unwrap();
    let parked_rec = paid.last().unwrap();
    assert!(
        parked_rec
            .body
            .who
            .actor
            .model
            .as_ref()
            .unwrap()
            .chars()
            .count()
            < 200
    );

    // Every terminal printer shows the hostile characters as escapes, never raw.
    let trace = cli(&h, &["trace", run, "--verbose"]).await
        + &cli(&h, &["trace", "run-hostile-pay", "--verbose"]).await;
    let list = cli(&h, &["approvals", "list"]).await;
    let show = cli(&h, &["approvals", "show", &id]).await;
    for (what, out) in [
        ("trace", &trace),
        ("approvals list", &list),
        ("approvals show", &show),
    ] {
        let raw: Vec<String> = out
            .chars()
            .filter(|c| acts(*c))
            .map(|c| format!("U+{:04X}", c as u32))
            .collect();
        assert!(raw.is_empty(), "{what} printed {raw:?}:\n{out}");
        assert!(
            !out.contains("\napproved by alice"),
            "{what} let a newline forge a line"
        );
    }
    assert!(show.contains("\\u{202e}"), "the override is shown: {show}");
    assert!(show.contains("日本"), "multi-byte text is unchanged");
    assert!(trace.contains("\\u{001b}"), "{trace}");
    h.shutdown().await;
}

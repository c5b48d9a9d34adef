//! Hostile strings from an agent — terminal control sequences, direction overrides, newlines,
//! multi-byte text, huge values — in a tool name, `_meta` and inputs: each is bounded where it
//! enters (what is stored, what is echoed), and what people read (`toolgate trace`, `toolgate
//! approvals list|show`, the approver's page served by `toolgate serve`) writes them out
//! visibly instead of obeying them, and is not taken down by them.

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
    cli_in(h.dir.path(), CLERK_KEY, args).await
}

/// `toolgate ARGS -c DIR` as the holder of `key`; its standard output.
async fn cli_in(dir: &std::path::Path, key: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(workspace_binary("toolgate", "toolgate"))
        .args(args)
        .arg("-c")
        .arg(dir)
        .env("RUST_LOG", "error")
        .env("TOOLGATE_API_KEY", key)
        // The finance example's ERP, started by `approvals show` for the decision facts,
        // knows the bulk invoices the serve test parks.
        .env("TOOLGATE_FAKE_FINANCE_BULK", "1")
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
        .audit_records(None, Some(&run.into()))
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
        .audit_records(None, Some(&"run-hostile-pay".into()))
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

/// Signs in to the approver's page at `base` with `key` over plain HTTP; the session cookie.
async fn page_session(http: &reqwest::Client, base: &str, key: &str) -> String {
    let login = http.get(format!("{base}/login")).send().await.unwrap();
    let cookie = login
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("; ");
    let body = login.text().await.unwrap();
    let at = body.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = &body[at..at + body[at..].find('"').unwrap()];
    let signed = http
        .post(format!("{base}/login"))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        // Both are URL-safe (letters, digits, dashes).
        .body(format!("api_key={key}&csrf={csrf}"))
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), reqwest::StatusCode::SEE_OTHER);
    signed
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .find(|c| c.starts_with("toolgate_session="))
        .unwrap()
}

/// Through the real `toolgate serve`: an agent's run id of multi-byte characters (where a byte
/// slice would cut one in half) and a reason of escape sequences, a bell, CR LF and a direction
/// override. The queue page and the item page answer (nothing panics), show the run id whole
/// and the hostile characters written out; `approvals list` and `show` print none of them raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multibyte_run_id_and_an_escape_reason_through_serve_the_page_and_the_terminal() {
    use crate::approvals_browser::{Setup, WORKER_A, meta, payment, structured};
    let setup = Setup::start_edited(|_| {}).await;
    let a = connect(&setup.mcp, WORKER_A).await;
    let run = format!("run-{}-日本語-é-ü-ß-€-漢字-テスト-🚀", "ü".repeat(7));
    let reason =
        "PO-77812 matched \u{1b}[2J\u{1b}[31mAPPROVED BY CFO\u{7}\r\n\u{202e}NABI\u{202c} done";
    let mut m = meta(&run);
    m["reason"] = serde_json::Value::String(reason.to_string());
    let r = call(
        &a,
        "payment.schedule",
        payment("INV-90000001", 4180.0, reason),
        m,
    )
    .await
    .unwrap();
    assert_eq!(structured(&r)["status"], "needs_approval", "{r:?}");
    let id = structured(&r)["approval_id"].as_str().unwrap().to_string();

    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = format!("http://127.0.0.1:{}/approvals", setup.port);
    let session = page_session(&http, &base, crate::approvals_browser::BOB_KEY).await;
    for page in [base.clone(), format!("{base}/item/{id}")] {
        let r = http
            .get(&page)
            .header("cookie", &session)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::OK, "{page}");
        let html = r.text().await.unwrap();
        let raw: Vec<String> = html
            .chars()
            .filter(|c| acts(*c) && *c != '\r' && *c != '\t')
            .map(|c| format!("U+{:04X}", c as u32))
            .collect();
        assert!(raw.is_empty(), "{page} has {raw:?}");
        assert!(
            html.contains("テスト-🚀"),
            "{page}: the run id's end is whole"
        );
    }
    let item = http
        .get(format!("{base}/item/{id}"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        item.contains("\\u{202e}NABI"),
        "the override is written out"
    );
    assert!(item.contains(&run), "the whole run id is on the item page");

    let dir = setup._tmp.path().join("finance");
    let bob = crate::approvals_browser::BOB_KEY;
    let list = cli_in(&dir, bob, &["approvals", "list"]).await;
    let show = cli_in(&dir, bob, &["approvals", "show", &id]).await;
    for (what, out) in [("approvals list", &list), ("approvals show", &show)] {
        let raw: Vec<String> = out
            .chars()
            .filter(|c| acts(*c))
            .map(|c| format!("U+{:04X}", c as u32))
            .collect();
        assert!(raw.is_empty(), "{what} printed {raw:?}:\n{out}");
        assert!(!out.contains("\nAPPROVED BY CFO"), "{what} forged a line");
        assert!(
            out.contains("🚀"),
            "{what}: the run id's multi-byte end is whole"
        );
    }
    assert!(show.contains(&run), "show prints the run id whole");
    // The decision facts, looked up through the finance example's invoice.search.
    assert!(show.contains("Nordlicht Verpackung GmbH"), "{show}");
    assert!(show.contains("4,180.00 EUR"), "{show}");
    assert!(
        show.contains("••••4931") && !show.contains("DE44500105175407324931"),
        "{show}"
    );
    assert!(show.contains("\\u{001b}[31mAPPROVED BY CFO"), "{show}");
    let mut serve = setup.serve;
    let _ = serve.kill().await;
}

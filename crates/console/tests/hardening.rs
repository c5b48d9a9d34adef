//! What a stranger can reach: sign-in throttled per source address and per key (429 with
//! `Retry-After`, never everybody at once), the security headers on every reply, and what an
//! agent can put on the page (control sequences, direction overrides, huge values): shown,
//! never obeyed.

use std::time::Duration;

use crate::common::*;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_SECURITY_POLICY, RETRY_AFTER, X_CONTENT_TYPE_OPTIONS};
use toolgate_console::{SignInLimits, router};

const REFILL: Duration = Duration::from_millis(300);

fn limited(e: &Env) -> toolgate_console::ConsoleState {
    e.console_with("", |o| {
        o.sign_in = SignInLimits {
            burst: 3,
            refill: REFILL,
            max_entries: 1000,
        }
    })
}

fn from(state: &toolgate_console::ConsoleState, peer: &str) -> Http {
    Http::new(router(state.clone())).at_peer(Some(peer))
}

#[tokio::test]
async fn sign_in_is_throttled_per_source_and_another_source_is_not() {
    let e = env().await;
    let state = limited(&e);
    let mut a = from(&state, "203.0.113.5:41000");
    for i in 0..3 {
        let r = a.sign_in(&format!("wrong-key-{i}")).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    let r = a.sign_in("wrong-key-3").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    let wait: u64 = r.headers[RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!(wait >= 1, "Retry-After {wait}");
    assert!(r.body.contains("Too many failed sign-ins"), "{}", r.body);
    // While throttled even the right key is refused unread: a full bucket confirms nothing.
    let r = a.sign_in(ALICE_KEY).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!a.jar.contains_key("toolgate_session"));

    // Another source (and another address of the same machine's neighbour) is not slowed.
    let mut b = from(&state, "203.0.113.6:41000");
    assert_eq!(
        b.sign_in("wrong-key-b").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(b.sign_in(ALICE_KEY).await.status, StatusCode::SEE_OTHER);

    // After the window the first source signs in with the right key.
    tokio::time::sleep(REFILL + Duration::from_millis(100)).await;
    let r = a.sign_in(ALICE_KEY).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert!(a.jar.contains_key("toolgate_session"));
}

#[tokio::test]
async fn one_key_tried_from_many_sources_is_throttled_but_a_right_key_is_not() {
    let e = env().await;
    let state = limited(&e);
    for i in 0..3 {
        let mut h = from(&state, &format!("198.51.100.{i}:41000"));
        assert_eq!(
            h.sign_in("the-same-wrong-key").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    let mut h = from(&state, "198.51.100.9:41000");
    assert_eq!(
        h.sign_in("the-same-wrong-key").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The refusal charged that source nothing, and a key that is right was never charged.
    assert_eq!(h.sign_in(BOB_KEY).await.status, StatusCode::SEE_OTHER);
    // Right keys give their try back: a person signing in often is never throttled.
    let mut alice = from(&state, "198.51.100.20:41000");
    for _ in 0..5 {
        alice.jar.clear();
        assert_eq!(alice.sign_in(ALICE_KEY).await.status, StatusCode::SEE_OTHER);
    }
}

/// nosniff and a CSP on the reply; for a page, a CSP that allows no inline code but its own.
fn assert_secure(r: &Reply, what: &str) {
    assert_eq!(r.headers[X_CONTENT_TYPE_OPTIONS], "nosniff", "{what}");
    let csp = r.headers[CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{what}: {csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
    assert!(!csp.contains("unsafe-inline"), "{what}: {csp}");
    assert_eq!(r.headers["x-frame-options"], "DENY", "{what}");
}

#[tokio::test]
async fn every_console_and_metrics_reply_carries_nosniff_and_a_strict_csp() {
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let state = e.console_scraped("");
    let mut anon = Http::new(router(state.clone()));
    for path in ["/login", "/", "/item/nope", "/report", "/no-such-page"] {
        let r = anon.get(path).await;
        assert_secure(&r, path);
    }
    let r = anon.post("/login", &[("api_key", ALICE_KEY)]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_secure(&r, "POST /login without CSRF");

    let mut h = Http::new(router(state.clone()));
    let r = h.sign_in(ALICE_KEY).await;
    assert_secure(&r, "sign-in redirect");
    let item = format!("/item/{}", p.approval);
    for path in ["/", item.as_str(), "/report", "/evidence/PO-77840"] {
        let r = h.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_secure(&r, path);
        let csp = r.headers[CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("style-src 'sha256-"), "{path}: {csp}");
        assert!(csp.contains("script-src 'sha256-"), "{path}: {csp}");
    }

    let mut m = Http::new(toolgate_console::metrics_router(state.clone()));
    assert_secure(&m.get("/metrics").await, "/metrics 401");
    assert_secure(&m.get_bearer("/metrics", SCRAPE_TOKEN).await, "/metrics");
}

/// Characters that would act on a terminal or reorder text if shown raw (a newline is the
/// page's own; the agent's are written out).
fn acts(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

fn raw_acting(page: &str) -> Vec<String> {
    page.chars()
        .filter(|c| acts(*c))
        .map(|c| format!("U+{:04X}", c as u32))
        .collect()
}

/// Escape sequences, CR, BEL, every bidi override and isolate, and multi-byte text.
const NASTY: &str = "Zahlung\u{1b}[2J\u{1b}]0;pwned\u{7} \u{202e}NABI\u{202c} \u{2066}iso\u{2069}\u{2067}\u{2068} Zürich 東京 🚀\r\nAPPROVED BY CFO";

/// An agent's hostile text in every part of the newest page parts: its reason (with 100 KB
/// more), a run id with a multi-byte character where ids are shortened and a direction
/// override, evidence ids, an input, a lookup's answer (the decision facts, a mismatch), a
/// duplicate in another run, the run's approval panel, the queue's run filter, the evidence
/// page and the outcome pages. Every page answers, shows none of it raw, and keeps the
/// multi-byte text whole.
#[tokio::test]
async fn agent_text_on_every_page_part_is_shown_not_obeyed() {
    use toolgate_store::{CallStatus, DirectCall};
    let e = env().await;
    e.rec.answers.lock().unwrap().insert(
        "invoice.get".into(),
        serde_json::json!({"supplier_name": NASTY, "iban": "DE89\u{202e}3704\u{1b}[0m", "amount": 1.5}),
    );
    // Multi-byte characters where `short` cuts the id (its last twelve characters).
    let run = format!("run-{}-Zürich-東京🚀-\u{202e}x-ü", "é".repeat(20));
    let huge = format!("{NASTY} {}", "x".repeat(100_000));
    let call = |run: &str, invoice: &str, amount: f64| DirectCall {
        principal: "fin-worker".into(),
        tool: "payment.transfer".into(),
        inputs: serde_json::json!({"supplier_id": "SUP-0001", "invoice_id": invoice, "amount": amount}),
        run_id: run.into(),
        purpose: Some("billing".into()),
        reason: Some(huge.clone()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: vec![NASTY.into(), "PO-77840".into()],
        approvals: vec![],
        actor: Default::default(),
    };
    let mut ids = Vec::new();
    for (invoice, amount) in [("INV-20260701", 600.0), ("INV-20260702", 300.0)] {
        let c = e
            .exec
            .governed_call(call(&run, invoice, amount))
            .await
            .unwrap();
        assert_eq!(c.status, CallStatus::NeedsApproval, "{c:?}");
        ids.push(c.approval_id.unwrap());
    }
    // The same operation as the first, planned in another run: a duplicate.
    let dup = park(
        &e,
        vec![step(
            "payment.transfer",
            serde_json::json!({"supplier_id": "SUP-0001", "invoice_id": "INV-20260701", "amount": 600.0}),
            &[],
        )],
    )
    .await;
    ids.push(dup.approval);

    let mut h = Http::new(router(e.console("")));
    assert_eq!(h.sign_in(ALICE_KEY).await.status, StatusCode::SEE_OTHER);
    let check = |what: &str, r: &Reply| {
        let raw = raw_acting(&r.body);
        let at = r.body.find(acts).unwrap_or(0);
        let from = r.body.floor_char_boundary(at.saturating_sub(300));
        let to = r.body.ceil_char_boundary((at + 100).min(r.body.len()));
        assert!(
            raw.is_empty(),
            "{what} showed {raw:?}: …{}…",
            &r.body[from..to]
        );
        assert!(
            !r.body.contains("\nAPPROVED BY CFO"),
            "{what}: a newline forged a line"
        );
    };

    let queue = h.get("/").await;
    assert_eq!(queue.status, StatusCode::OK);
    check("the queue", &queue);
    assert!(
        queue.body.contains("東京🚀-\\u{202e}x-ü"),
        "the run id, shortened by characters"
    );
    let filtered = h.get(&format!("/?run={}", enc(&run))).await;
    assert_eq!(filtered.status, StatusCode::OK);
    check("the queue filtered by the run", &filtered);
    assert!(filtered.body.contains(&format!("/item/{}", ids[0])));
    // The filter box holds the id as shown; submitted as it is, it still finds the run.
    let shown = toolgate_console::fmt::text(&run);
    assert!(filtered.body.contains(&html_text(&shown)));
    let again = h.get(&format!("/?run={}", enc(&shown))).await;
    assert!(again.body.contains(&format!("/item/{}", ids[0])));

    let item = h.get(&format!("/item/{}", ids[0])).await;
    assert_eq!(item.status, StatusCode::OK);
    check("the item", &item);
    for part in [
        "id=\"facts\"",
        "id=\"mismatch-amount\"",
        "id=\"duplicate-alert\"",
        "id=\"run-approval\" data-count=\"2\"",
        "id=\"reason\"",
    ] {
        assert!(item.body.contains(part), "{part} is on the page");
    }
    // Written out, visibly, and the multi-byte text whole: in the reason, the facts, the run.
    assert!(item.body.contains("\\u{202e}NABI\\u{202c}"));
    assert!(item.body.contains("\\u{001b}[2J"));
    assert!(
        item.body.matches("Zürich 東京 🚀").count() >= 2,
        "reason and payee"
    );
    assert!(item.body.contains(&crate::common::html_text(&format!(
        "run-{}-Zürich-東京🚀-\\u{{202e}}x-ü",
        "é".repeat(20)
    ))));
    assert!(
        item.body.contains(&"x".repeat(100_000)),
        "the reason is shown whole"
    );
    // The evidence link is one path segment, however the id reads.
    assert!(
        item.body
            .contains("href=\"/evidence/Zahlung%1B%5B2J%1B%5D0%3Bpwned%07%20")
    );

    let dup = h.get(&format!("/item/{}", ids[2])).await;
    assert_eq!(dup.status, StatusCode::OK);
    check("the duplicate", &dup);

    let evidence = h.get(&format!("/evidence/{}", enc(NASTY))).await;
    assert_eq!(
        evidence.status,
        StatusCode::NOT_FOUND,
        "not in the ontology"
    );
    check("the evidence page", &evidence);

    let csrf = hidden(&item.body, "csrf").unwrap();
    let rejected = h
        .post(
            &format!("/item/{}/reject", ids[2]),
            &[("csrf", &csrf), ("reason", NASTY)],
        )
        .await;
    assert_eq!(rejected.status, StatusCode::OK, "{}", rejected.body);
    check("the rejection's outcome", &rejected);
    assert!(rejected.body.contains("Zürich 東京 🚀"));

    let set = hidden(&item.body, "set").expect("the run may be approved as one");
    let ran = h
        .post(
            "/run/approve",
            &[("csrf", &csrf), ("run", &run), ("set", &set)],
        )
        .await;
    assert_eq!(ran.status, StatusCode::OK, "{}", ran.body);
    check("the run's outcome", &ran);
    let missing = h.get(&format!("/item/{}", enc(NASTY))).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    check("an unknown item", &missing);
}

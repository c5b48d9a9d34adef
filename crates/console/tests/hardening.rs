//! What a stranger can reach: sign-in throttled per source address and per key (429 with
//! `Retry-After`, never everybody at once), and the security headers on every reply.

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

//! The page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
//! installed by `scripts/install-browser.sh`) driven over WebDriver. An approver signs in,
//! opens a parked payment, sees the exact amount and the new IBAN highlighted, approves it, and
//! the step runs once; another approver rejects one with a reason and the step ends `refused`.
//!
//! Runs when CI=true (installing the browser if it is missing, and failing if it still is);
//! elsewhere it is skipped with a notice when Chromium is not installed.

use std::path::PathBuf;

use crate::common::*;
use toolgate_core::StepStatus;
use toolgate_testkit::browser::{self, Browser};

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Serves the console under `/approvals` on a free port; returns its base URL.
async fn serve(e: &Env) -> String {
    let app = axum::Router::new().nest(
        "/approvals",
        toolgate_console::router(e.console("/approvals")),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    // `localhost` is a secure context for the browser, so the Secure cookie is kept.
    format!("http://localhost:{port}/approvals")
}

/// A screenshot of the window, kept under the target dir; its path.
async fn screenshot(b: &Browser, name: &str) -> PathBuf {
    let path = screenshots_dir().join(name);
    b.screenshot(&path).await;
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_sees_the_new_iban_approves_and_the_payment_runs_once() {
    if !browser::available("the console browser test") {
        return;
    }
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let base = serve(&e).await;
    let b = Browser::start(1280, 1600).await;

    b.sign_in(&base, ALICE_KEY).await;
    assert_eq!(b.text("#who").await, "alice");
    // The queue lists the parked payment; open it from there.
    b.goto(&base).await;
    b.find("a.item").await;
    screenshot(&b, "queue.png").await;
    // Under the pages' CSP (no 'unsafe-inline': the inline stylesheet and script are allowed
    // by their hashes) the stylesheet applies and the queue's j/k script runs.
    assert_eq!(
        b.eval("return getComputedStyle(document.body).marginTop")
            .await,
        "0px",
        "the stylesheet was blocked"
    );
    b.eval("document.body.dispatchEvent(new KeyboardEvent('keydown', {key: 'j', bubbles: true}))")
        .await;
    assert_eq!(
        b.eval("return document.activeElement.classList.contains('item')")
            .await,
        true,
        "the queue's script was blocked"
    );
    b.click(&format!("a.item[href$='{}']", p.approval)).await;
    b.find("#inputs").await;

    assert_eq!(b.text("#field-amount .value").await, "12600.5");
    assert_eq!(b.text("#field-amount .money").await, "= 12,600.50 EUR");
    assert_eq!(
        b.text("#field-iban .value").await,
        format!("\"{NEW_IBAN}\"")
    );
    assert!(
        b.attr("#field-iban", "class")
            .await
            .contains("new-destination"),
        "the IBAN row is not highlighted"
    );
    let alert = b.text("#destination-alert").await;
    assert!(
        alert.contains(NEW_IBAN) && alert.contains(OLD_IBAN),
        "{alert}"
    );
    let shot = screenshot(&b, "approve-new-iban.png").await;
    eprintln!("screenshot: {}", shot.display());
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    assert_eq!(e.rec.count_step(&p.step), 0, "ran before approval");

    b.click("#approve").await;
    let result = b.text("#result").await;
    assert!(
        result.contains("The step ran once: status done"),
        "{result}"
    );
    screenshot(&b, "approved.png").await;
    assert_eq!(e.rec.count_step(&p.step), 1);
    assert_eq!(e.rec.count("payment.schedule"), 2, "history + this one");
    let step = e.store.step(&p.step).await.unwrap();
    assert_eq!(step.status, StepStatus::Done);

    // Back on the item, it is closed: no Approve button, and reloading the POST is refused.
    b.goto(&format!("{base}/item/{}", p.approval)).await;
    b.find("#status").await;
    assert!(!b.exists("#approve").await);
    assert_eq!(e.rec.count_step(&p.step), 1);

    // The surface numbers now count this gate's two approvals.
    b.goto(&format!("{base}/report")).await;
    let gates = b.text("#gates").await;
    assert!(gates.contains("payment.schedule"), "{gates}");
    screenshot(&b, "report.png").await;
    b.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_rejects_with_a_reason_and_the_step_is_refused() {
    if !browser::available("the console browser test") {
        return;
    }
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let base = serve(&e).await;
    let b = Browser::start(1280, 1600).await;

    b.sign_in(&base, BOB_KEY).await;
    b.goto(&format!("{base}/item/{}", p.approval)).await;
    b.find("#destination-alert").await;
    // Reject without a reason: the browser's own check keeps the form from being sent.
    b.click("#reject").await;
    assert!(b.exists("#reject-form").await);
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::NeedsApproval
    );
    b.type_into(
        "#reason-input",
        "IBAN differs from the vendor master; call the supplier",
    )
    .await;
    b.click("#reject").await;
    let result = b.text("#result").await;
    assert!(result.contains("Rejected"), "{result}");
    screenshot(&b, "rejected.png").await;

    let step = e.store.step(&p.step).await.unwrap();
    assert_eq!(step.status, StepStatus::Refused);
    assert!(
        step.outcome
            .unwrap()
            .error
            .unwrap()
            .contains("IBAN differs from the vendor master")
    );
    assert_eq!(e.rec.count_step(&p.step), 0);
    b.quit().await;
}

//! The page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
//! installed by `scripts/install-browser.sh`) driven over WebDriver. An approver signs in,
//! opens a parked payment, sees the exact amount and the new IBAN highlighted, approves it, and
//! the step runs once; another approver rejects one with a reason and the step ends `refused`.
//!
//! Runs when CI=true (installing the browser if it is missing, and failing if it still is);
//! elsewhere it is skipped with a notice when Chromium is not installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use base64::Engine as _;
use serde_json::{Value, json};
use toolgate_core::StepStatus;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// True when the browser is there; under CI installs it first and fails if it cannot.
fn browser_available() -> bool {
    let present = || Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if present() {
        return true;
    }
    if ci() {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-browser.sh");
        let status = Command::new("bash").arg(&script).status();
        assert!(
            present(),
            "CI=true and Chromium is missing ({CHROMIUM}, {CHROMEDRIVER}); {} exited {status:?}",
            script.display()
        );
        return true;
    }
    eprintln!(
        "NOTICE: skipping the browser test: {CHROMIUM} or {CHROMEDRIVER} is missing \
         (run scripts/install-browser.sh; under CI=true this test fails instead)"
    );
    false
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A chromedriver process and one browser session: a minimal W3C WebDriver client.
struct Browser {
    driver: Child,
    http: reqwest::Client,
    url: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http.get(format!("{url}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-quic",
                    "--no-proxy-server", "--window-size=1280,1600",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let r: Value = http
            .post(format!("{url}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {r}"))
            .to_string();
        Browser {
            driver,
            http,
            url,
            session,
            _profile: profile,
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.url, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Waits up to 10 s for an element matching `css`.
    async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self
                .cmd(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            if let Some(id) = v[ELEMENT].as_str() {
                return id.to_string();
            }
            if Instant::now() >= deadline {
                let url = self.cmd(reqwest::Method::GET, "/url", None).await;
                let src = self.cmd(reqwest::Method::GET, "/source", None).await;
                panic!(
                    "no element '{css}' at {url}: {}\npage: {}",
                    v["message"],
                    src.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn exists(&self, css: &str) -> bool {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v.as_array().is_some_and(|a| !a.is_empty())
    }

    async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.cmd(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    async fn attr(&self, css: &str, name: &str) -> String {
        let id = self.find(css).await;
        self.cmd(
            reqwest::Method::GET,
            &format!("/element/{id}/attribute/{name}"),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// Runs `script` in the page (WebDriver's own scripts are not subject to the page's CSP).
    async fn eval(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot data"))
            .unwrap();
        let path = screenshots_dir().join(name);
        std::fs::write(&path, png).unwrap();
        path
    }

    async fn quit(mut self) {
        self.cmd(reqwest::Method::DELETE, "", None).await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
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

/// Signs in with the keyboard: type the key, press Enter.
async fn sign_in(b: &Browser, base: &str, key: &str) {
    b.goto(&format!("{base}/login")).await;
    b.type_into("#api_key", &format!("{key}\u{E007}")).await;
    b.find("#who").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_sees_the_new_iban_approves_and_the_payment_runs_once() {
    if !browser_available() {
        return;
    }
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let base = serve(&e).await;
    let b = Browser::start().await;

    sign_in(&b, &base, ALICE_KEY).await;
    assert_eq!(b.text("#who").await, "alice");
    // The queue lists the parked payment; open it from there.
    b.goto(&base).await;
    b.find("a.item").await;
    b.screenshot("queue.png").await;
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
    let shot = b.screenshot("approve-new-iban.png").await;
    eprintln!("screenshot: {}", shot.display());
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    assert_eq!(e.rec.count_step(&p.step), 0, "ran before approval");

    b.click("#approve").await;
    let result = b.text("#result").await;
    assert!(
        result.contains("The step ran once: status done"),
        "{result}"
    );
    b.screenshot("approved.png").await;
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
    b.screenshot("report.png").await;
    b.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_rejects_with_a_reason_and_the_step_is_refused() {
    if !browser_available() {
        return;
    }
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let base = serve(&e).await;
    let b = Browser::start().await;

    sign_in(&b, &base, BOB_KEY).await;
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
    b.screenshot("rejected.png").await;

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

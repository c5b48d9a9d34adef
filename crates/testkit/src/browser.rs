//! Headless Chromium (Debian's `chromium` and `chromium-driver`, installed by
//! `scripts/install-browser.sh`) driven over W3C WebDriver by a minimal client: enough to sign
//! in, read the page, click, type, press keys and emulate a phone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether the browser is there for `test`. Under `CI=true` it is installed when missing, and
/// its absence fails the test; elsewhere the test is skipped with a notice.
pub fn available(test: &str) -> bool {
    let present = || Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if present() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
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
        "NOTICE: skipping {test}: {CHROMIUM} or {CHROMEDRIVER} is missing (run \
         scripts/install-browser.sh; under CI=true the test fails instead)"
    );
    false
}

/// A chromedriver process and one browser session. Counts the keys pressed and the text typed
/// ([`Browser::keys`]), for tests that measure how many interactions a task takes.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    url: String,
    session: String,
    /// Interactions made with [`Browser::press`] and [`Browser::type_text`].
    pub keys: usize,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless browser with a window of `width`×`height` pixels.
    pub async fn start(width: u32, height: u32) -> Browser {
        let port = crate::free_port();
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
                    "--no-proxy-server", format!("--window-size={width},{height}"),
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
            keys: 0,
            _profile: profile,
        }
    }

    /// One WebDriver command on this session; its `value`.
    pub async fn cmd(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.url, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.cmd(Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The page's URL now.
    pub async fn url_now(&self) -> String {
        self.cmd(Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits up to 10 s for an element matching `css`; panics with the page's source when none
    /// comes.
    pub async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self
                .cmd(
                    Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            if let Some(id) = v[ELEMENT].as_str() {
                return id.to_string();
            }
            if Instant::now() >= deadline {
                let url = self.url_now().await;
                let src = self.cmd(Method::GET, "/source", None).await;
                panic!(
                    "no element '{css}' at {url}: {}\npage: {}",
                    v["message"],
                    src.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many elements match `css` now (no waiting).
    pub async fn count(&self, css: &str) -> usize {
        let v = self
            .cmd(
                Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v.as_array().map_or(0, Vec::len)
    }

    pub async fn exists(&self, css: &str) -> bool {
        self.count(css).await > 0
    }

    pub async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.cmd(Method::GET, &format!("/element/{id}/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn attr(&self, css: &str, name: &str) -> String {
        let id = self.find(css).await;
        self.cmd(
            Method::GET,
            &format!("/element/{id}/attribute/{name}"),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Sends `text` to the element matching `css` (`\u{E007}` is Enter).
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// Runs `script` in the page (WebDriver's own scripts are not subject to the page's CSP).
    pub async fn eval(&self, script: &str) -> Value {
        self.cmd(
            Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Presses keys together (WebDriver key actions on whatever has focus): one interaction.
    pub async fn press(&mut self, keys: &[&str]) {
        let mut actions = Vec::new();
        for k in keys {
            actions.push(json!({"type": "keyDown", "value": k}));
        }
        for k in keys.iter().rev() {
            actions.push(json!({"type": "keyUp", "value": k}));
        }
        self.key_actions(actions).await;
    }

    /// Types text into the focused element: one interaction.
    pub async fn type_text(&mut self, text: &str) {
        let actions: Vec<Value> = text
            .chars()
            .flat_map(|c| {
                [
                    json!({"type": "keyDown", "value": c.to_string()}),
                    json!({"type": "keyUp", "value": c.to_string()}),
                ]
            })
            .collect();
        self.key_actions(actions).await;
    }

    async fn key_actions(&mut self, actions: Vec<Value>) {
        self.cmd(
            Method::POST,
            "/actions",
            Some(json!({"actions": [{"type": "key", "id": "kb", "actions": actions}]})),
        )
        .await;
        self.keys += 1;
    }

    /// Signs in to the approver's page under `base` with the keyboard: the key, then Enter.
    /// Any earlier session's cookie is dropped first.
    pub async fn sign_in(&self, base: &str, key: &str) {
        self.cmd(Method::DELETE, "/cookie", None).await;
        self.goto(&format!("{base}/login")).await;
        self.type_into("#api_key", &format!("{key}\u{E007}")).await;
        self.find("#who").await;
    }

    /// Emulates a phone's viewport of `width`×`height` CSS pixels (Chrome's device metrics,
    /// through chromedriver's CDP endpoint: a headless window may not shrink that far), or
    /// with `None` the window's own again.
    pub async fn phone(&self, size: Option<(u32, u32)>) {
        let body = match size {
            Some((width, height)) => json!({"cmd": "Emulation.setDeviceMetricsOverride",
                "params": {"width": width, "height": height, "deviceScaleFactor": 3, "mobile": true}}),
            None => json!({"cmd": "Emulation.clearDeviceMetricsOverride", "params": {}}),
        };
        self.cmd(Method::POST, "/goog/cdp/execute", Some(body))
            .await;
    }

    /// A PNG of the window, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let v = self.cmd(Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot data"))
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    pub async fn quit(mut self) {
        self.cmd(Method::DELETE, "", None).await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

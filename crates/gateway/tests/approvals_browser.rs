//! The approver's page in a real browser (headless Chromium over WebDriver, installed by
//! `scripts/install-browser.sh`), on a queue of 44 calls parked through the real `toolgate
//! serve` (the finance example's tools and policies, its fake ERP binary with bulk invoices) by
//! real MCP clients (rmcp over streamable HTTP, as any agent connects). Checked: a requester,
//! and the person an agent acts for, cannot approve their own request; a person outside the
//! tool's approvers sees nothing of it and is refused; a payment's decision facts (payee,
//! masked account, invoice amount and status, a mismatch marked) are on the first screen; a
//! duplicate is flagged; an item that would be refused says so before anyone approves; and the
//! whole queue is cleared with the keyboard alone, each approved call then running once by the
//! fake's record; at phone width (390×844) Approve and Reject are on screen, nothing wider. Prints the interactions and page loads per approved and rejected item.
//!
//! Runs when CI=true (installing the browser if missing); elsewhere skipped with a notice
//! without Chromium.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::registry::api_key_hash;
use toolgate_fakes::record::read_records;
use toolgate_store::{ApprovalStatus, Store, StoreConfig};

use crate::clients::workspace_binary;
use crate::common::{call, connect};
use toolgate_testkit::browser::{self, Browser};

pub(crate) const WORKER_A: &str = "tg-test-sod-worker-a-0001";
const WORKER_B: &str = "tg-test-sod-worker-b-0001";
const ALICE: &str = "tg-test-sod-alice-0001";
pub(crate) const BOB_KEY: &str = "tg-test-sod-bob-0001";
const BOB: &str = BOB_KEY;
const SAM: &str = "tg-test-sod-sam-0001";
const VERA: &str = "tg-test-sod-vera-0001";
const WALT: &str = "tg-test-sod-walt-0001";
/// An AP clerk whose grants reach internal data only.
const CARL: &str = "tg-test-sod-carl-0001";
pub(crate) const METRICS_TOKEN: &str = "toolgate-test-metrics-token-0123";
pub(crate) const APPROVAL_KEY: &str = "toolgate-test-approval-key-0123456789abcdef";
pub(crate) const REDACTION_KEY: &str = "toolgate-test-redaction-key-0123456789";

pub(crate) use toolgate_testkit::free_port;

/// Submits an approve form for `id` from the current page (as a crafted request would),
/// with the session's CSRF token; returns the page's text.
async fn post_approve(b: &Browser, base: &str, id: &str, hash: &str) -> String {
    b.eval(&format!(
        "var c = document.querySelector('input[name=csrf]').value;\
         var f = document.createElement('form'); f.method = 'post';\
         f.action = '{base}/item/{id}/approve';\
         [['csrf', c], ['input_hash', '{hash}']].forEach(function (p) {{\
           var i = document.createElement('input'); i.type = 'hidden'; i.name = p[0];\
           i.value = p[1]; f.appendChild(i); }});\
         document.body.appendChild(f); f.submit();"
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.text("main").await
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

fn person(id: &str, role: &str, key: &str, grants: &str) -> String {
    format!(
        "  - id: {id}\n    kind: human\n    role: {role}\n    credentials:\n      - {{id: test, sha256: \"{}\"}}\n{grants}",
        api_key_hash(key)
    )
}

/// The finance example's tools, policies and lock, with test principals: worker-a acts for
/// alice; sam (a person) changes IBANs and may approve others' changes, with the vendor-master
/// leads; the AP clerks approve payments. Per-run and 24 h limits raised for a queue of 44.
pub(crate) fn write_registry(dir: &Path, record: &Path, store: &Path) {
    let ex = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    copy_dir(&ex.join("tools"), &dir.join("tools"));
    copy_dir(&ex.join("policies"), &dir.join("policies"));
    std::fs::copy(ex.join("toolgate.lock"), dir.join("toolgate.lock")).unwrap();
    let pay = dir.join("tools/payments.yaml");
    edit(&pay, "    rate_limit: 3\n", "    rate_limit: 100\n");
    edit(
        &pay,
        "limit: 20000, window: 24h",
        "limit: 10000000, window: 24h",
    );
    let sup = dir.join("tools/suppliers.yaml");
    edit(
        &sup,
        "    approvers: 2\n",
        "    approvers: 2\n    approved_by: {roles: [vendor.lead], people: [sam]}\n",
    );
    let agent = |id: &str, key: &str, extra: &str| {
        format!(
            "  - id: {id}\n    kind: agent\n    role: worker.finance\n{extra}    credentials:\n      - {{id: test, sha256: \"{}\"}}\n    grants:\n      - {{scopes: [invoices:read, purchase_orders:read, payments:write], purposes: [billing], max_tier: spend, max_sensitivity: confidential}}\n    budgets: {{act: 500, spend: 500}}\n",
            api_key_hash(key)
        )
    };
    let clerk = "    grants:\n      - {scopes: [invoices:read, payments:read], purposes: [billing], max_tier: read, max_sensitivity: confidential}\n";
    let principals = format!(
        "roles:\n  planner: {{}}\n  worker.comms: {{}}\n  reviewer: {{}}\n  reconciler: {{}}\n  worker.finance: {{description: \"finance agents (direct calls here)\"}}\n  ap.clerk: {{description: \"approve payments\", approver: true}}\n  supplier.admin: {{description: \"change supplier bank details\"}}\n  vendor.lead: {{description: \"approve IBAN changes\"}}\nprincipals:\n{}{}{}{}{}{}{}{}",
        agent("worker-a", WORKER_A, "    on_behalf_of: alice\n"),
        agent("worker-b", WORKER_B, ""),
        person("alice", "ap.clerk", ALICE, clerk),
        person("bob", "ap.clerk", BOB, clerk),
        person(
            "sam",
            "supplier.admin",
            SAM,
            "    grants:\n      - {scopes: [suppliers:admin, suppliers:read], purposes: [supplier_maintenance], max_tier: act, max_sensitivity: restricted}\n    budgets: {act: 20}\n"
        ),
        person(
            "vera",
            "vendor.lead",
            VERA,
            "    grants:\n      - {scopes: [suppliers:read], purposes: [supplier_maintenance], max_tier: read, max_sensitivity: restricted}\n"
        ),
        person(
            "walt",
            "vendor.lead",
            WALT,
            "    grants:\n      - {scopes: [suppliers:read], purposes: [supplier_maintenance], max_tier: read, max_sensitivity: restricted}\n"
        ),
        person(
            "carl",
            "ap.clerk",
            CARL,
            "    grants:\n      - {scopes: [invoices:read], purposes: [billing], max_tier: read, max_sensitivity: internal}\n"
        ),
    );
    std::fs::write(dir.join("principals.yaml"), principals).unwrap();
    let fake = workspace_binary("toolgate-fake-finance", "toolgate-fakes");
    std::fs::write(
        dir.join("toolgate.yaml"),
        format!(
            "label: approvals-browser\nstore:\n  url: \"sqlite://{}\"\nupstreams:\n  erp:\n    command: {:?}\n    args: [\"--record\", {:?}]\n    env: [TOOLGATE_FAKE_FINANCE_BULK]\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 10\napprovals:\n  expiry_hours: 72\n",
            store.display(),
            fake.display().to_string(),
            record.display().to_string()
        ),
    )
    .unwrap();
    toolgate_gateway::pins::rehome_lock(dir).unwrap();
}

pub(crate) fn payment(invoice: &str, amount: f64, reason: &str) -> Value {
    json!({"invoice_id": invoice, "amount": amount, "currency": "EUR", "value_date": "2026-06-30", "reason": reason})
}

pub(crate) const GOOD: &str = "Three-way match complete against PO-77812; the invoice is approved";

pub(crate) fn meta(run: &str) -> Value {
    json!({"purpose": "billing", "run_id": run})
}

pub(crate) fn structured(r: &rmcp::model::CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

/// `toolgate serve` on the test registry, ready; its fake ERP records to `record`.
pub(crate) struct Setup {
    pub _tmp: tempfile::TempDir,
    pub port: u16,
    pub record: PathBuf,
    pub store_path: PathBuf,
    pub serve: tokio::process::Child,
    pub mcp: String,
    pub base: String,
}

impl Setup {
    async fn start() -> Setup {
        Setup::start_edited(|_| {}).await
    }

    /// As [`Setup::start`], with `edit` run on the registry folder before `serve` starts.
    pub(crate) async fn start_edited(edit: impl FnOnce(&Path)) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("finance");
        std::fs::create_dir_all(&dir).unwrap();
        let record = tmp.path().join("erp-calls.jsonl");
        let store_path = tmp.path().join("store.db");
        write_registry(&dir, &record, &store_path);
        edit(&dir);
        let log = tmp.path().join("serve.log");
        let logf = std::fs::File::create(&log).unwrap();
        let serve = tokio::process::Command::new(workspace_binary("toolgate", "toolgate"))
            .args(["serve", "-c"])
            .arg(&dir)
            .args(["--http", "127.0.0.1:0", "--no-watch"])
            .env("TOOLGATE_APPROVAL_KEY", APPROVAL_KEY)
            .env("TOOLGATE_REDACTION_KEY", REDACTION_KEY)
            .env("TOOLGATE_FAKE_FINANCE_BULK", "1")
            .env("TOOLGATE_METRICS_TOKEN", METRICS_TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let port = toolgate_testkit::served_addr(&dir, serve.id().expect("running"), Some(&log))
            .await
            .port();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "serve not ready: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mcp = format!("http://127.0.0.1:{port}/mcp");
        let base = format!("http://localhost:{port}/approvals");
        Setup {
            _tmp: tmp,
            port,
            record,
            store_path,
            serve,
            mcp,
            base,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_parked_calls_cleared_by_keyboard_with_duties_facts_and_refusals_shown() {
    if !browser::available("the approvals browser test") {
        return;
    }
    let Setup {
        _tmp,
        port,
        record,
        store_path,
        mut serve,
        mcp,
        base,
    } = Setup::start().await;

    // The queue, parked by real MCP clients: 40 payments of distinct invoices by worker-a...
    let a = connect(&mcp, WORKER_A).await;
    let b = connect(&mcp, WORKER_B).await;
    let invoice = |n: usize| format!("INV-9{n:07}");
    for n in 1..=40 {
        let r = call(
            &a,
            "payment.schedule",
            payment(&invoice(n), 4180.0, GOOD),
            meta(&format!("bulk-{n}")),
        )
        .await
        .unwrap();
        assert_eq!(structured(&r)["status"], "needs_approval", "{r:?}");
    }
    // ... the same invoice as #1 asked again by another agent in another run (a duplicate) ...
    let dup = call(
        &b,
        "payment.schedule",
        payment(&invoice(1), 4180.0, GOOD),
        meta("dup-b"),
    )
    .await
    .unwrap();
    let dup_id = structured(&dup)["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    // ... a transposed amount (the invoice says 4,180.00) ...
    let typo = call(
        &a,
        "payment.schedule",
        payment(&invoice(99), 4810.0, GOOD),
        meta("typo"),
    )
    .await
    .unwrap();
    let typo_id = structured(&typo)["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    // ... a payment whose run is then refused once (a reason citing no PO): once approved it
    // would be refused by no-spend-after-denial ...
    let doomed = call(
        &a,
        "payment.schedule",
        payment(&invoice(98), 4180.0, GOOD),
        meta("doomed"),
    )
    .await
    .unwrap();
    let doomed_id = structured(&doomed)["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    let refused = call(
        &a,
        "payment.schedule",
        payment(&invoice(97), 4180.0, "Paying this one today as agreed"),
        meta("doomed"),
    )
    .await
    .unwrap();
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert_ne!(structured(&refused)["status"], "needs_approval");
    // ... and an IBAN change asked for by sam himself, a person.
    let s = connect(&mcp, SAM).await;
    let iban = call(
        &s,
        "supplier.update_iban",
        json!({"supplier_id": "SUP-0002", "iban": "ES7921000813610123456780", "reason": "New bank letter received from Costa Verde on 2026-06-10"}),
        json!({"purpose": "supplier_maintenance", "run_id": "iban-1"}),
    )
    .await
    .unwrap();
    let iban_id = structured(&iban)["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!iban_id.is_empty(), "{iban:?}");

    let store = Store::connect(
        &format!("sqlite://{}", store_path.display()),
        StoreConfig::default(),
    )
    .await
    .unwrap();
    let open = store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap();
    assert_eq!(open.len(), 44, "40 + duplicate + typo + doomed + IBAN");
    let first_a = open
        .iter()
        .find(|r| r.principal == "worker-a" && r.run_id.as_deref() == Some("bulk-1"))
        .unwrap()
        .clone();

    let mut br = Browser::start(1280, 800).await;

    // sam may approve IBAN changes, but not his own: not in his queue, not found, refused.
    br.sign_in(&base, SAM).await;
    br.goto(&base).await;
    br.find("h1").await;
    assert_eq!(br.count("a.item").await, 0, "sam sees his own request");
    br.goto(&format!("{base}/item/{iban_id}")).await;
    assert!(br.text("#error").await.contains("no approval request"));
    let text = post_approve(&br, &base, &iban_id, "sha256:x").await;
    assert!(text.contains("nobody approves their own request"), "{text}");

    // vera approves IBAN changes only: the payments are not shown to her, nor approvable.
    br.sign_in(&base, VERA).await;
    br.goto(&base).await;
    br.find("h1").await;
    assert_eq!(br.count("a.item").await, 1, "only the IBAN change");
    assert!(br.count(&format!("a.item[href$='{iban_id}']")).await == 1);
    br.goto(&format!("{base}/item/{}", first_a.approval_id))
        .await;
    assert!(br.text("#error").await.contains("no approval request"));
    assert!(
        !br.text("main").await.contains("INV-9"),
        "vera was shown the payment"
    );
    let text = post_approve(
        &br,
        &base,
        &first_a.approval_id,
        first_a.input_hash.as_str(),
    )
    .await;
    assert!(text.contains("may not approve payment.schedule"), "{text}");
    // The restricted IBAN is shown to her in clear (her ceiling is restricted).
    br.goto(&format!("{base}/item/{iban_id}")).await;
    assert!(
        br.text("#field-iban .value")
            .await
            .contains("ES7921000813610123456780")
    );

    // carl approves payments, but his grants reach internal data only: the invoice lookup's
    // answer (confidential) is masked whole for him, and no masked value is in the page's HTML.
    br.sign_in(&base, CARL).await;
    br.goto(&format!("{base}/item/{typo_id}")).await;
    br.find("#fact-payee").await;
    let html = br
        .eval("return document.documentElement.outerHTML")
        .await
        .as_str()
        .unwrap()
        .to_string();
    for secret in [
        "Nordlicht Verpackung GmbH",
        "DE44500105175407324931",
        "4,180.00",
    ] {
        assert!(!html.contains(secret), "carl is shown {secret}");
    }
    assert!(br.text("#fact-payee .value").await.contains('•'));
    assert!(br.count("#fact-payee .masked").await == 1);

    // alice is an AP clerk, but worker-a acts for her: only worker-b's request is hers.
    br.sign_in(&base, ALICE).await;
    br.goto(&base).await;
    br.find("h1").await;
    assert_eq!(
        br.count("a.item").await,
        1,
        "alice sees her own agent's requests"
    );
    let text = post_approve(
        &br,
        &base,
        &first_a.approval_id,
        first_a.input_hash.as_str(),
    )
    .await;
    assert!(text.contains("the person behind 'worker-a'"), "{text}");
    assert!(
        store
            .approval(&first_a.approval_id)
            .await
            .unwrap()
            .approved_by
            .is_empty()
    );

    // bob works the payments: 43 of them.
    br.sign_in(&base, BOB).await;
    br.goto(&base).await;
    br.find("h1").await;
    assert_eq!(br.count("a.item").await, 43);
    // The queue fits 1280 px: no sideways scrolling, of the page or of a table.
    let fits = "return document.documentElement.scrollWidth <= window.innerWidth && \
                Array.prototype.every.call(document.querySelectorAll('.scroll'), \
                function (e) { return e.scrollWidth <= e.clientWidth; })";
    let widths = "return document.documentElement.scrollWidth + ' / ' + window.innerWidth + '; ' + \
                  Array.prototype.map.call(document.querySelectorAll('.scroll'), \
                  function (e) { return e.scrollWidth + ' in ' + e.clientWidth; }).join(', ')";
    assert_eq!(
        br.eval(fits).await,
        true,
        "the queue scrolls sideways at 1280 px: {}",
        br.eval(widths).await
    );
    let amount = br
        .eval(
            "return Array.prototype.map.call(document.querySelectorAll('tbody td code'), \
               function (c) { return c.textContent; }).join('|')",
        )
        .await;
    assert!(
        amount.as_str().unwrap_or_default().contains("4,180.00 EUR"),
        "amounts are not formatted in the queue: {amount}"
    );
    // At phone width the page is no wider than the phone (a table scrolls inside its own
    // box), and the first item's link is on screen.
    br.phone(Some((390, 844))).await;
    br.goto(&base).await;
    br.find("a.item").await;
    let page_fits = br
        .eval("return document.documentElement.scrollWidth <= window.innerWidth")
        .await;
    assert_eq!(page_fits, true, "the queue is wider than a phone");
    let link = br
        .eval(
            "var r = document.querySelector('a.item').getBoundingClientRect(); \
               return r.left >= 0 && r.right <= window.innerWidth && r.width > 0",
        )
        .await;
    assert_eq!(link, true, "the first item is not on screen at 390 px");
    br.phone(None).await;

    // The transposed amount: decision facts on the first screen, the mismatch marked.
    br.goto(&format!("{base}/item/{typo_id}")).await;
    assert_eq!(
        br.text("#fact-payee .value").await,
        "Nordlicht Verpackung GmbH"
    );
    assert_eq!(br.text("#fact-invoice_status .value").await, "approved");
    assert_eq!(br.text("#fact-invoice_amount .value").await, "4,180.00 EUR");
    let account = br.text("#fact-account .value").await;
    assert!(
        account.contains("••••4931") && !account.contains("DE4450"),
        "{account}"
    );
    let mismatch = br.text("#mismatch-amount").await;
    assert!(
        mismatch.contains("4,810.00 EUR") && mismatch.contains("4,180.00 EUR"),
        "{mismatch}"
    );
    let top = br
        .eval("return document.getElementById('mismatch-amount').getBoundingClientRect().bottom")
        .await;
    assert!(
        top.as_f64().unwrap() < 800.0,
        "the mismatch is below the fold: {top}"
    );
    let bar = br
        .eval("var r = document.querySelector('.actions').getBoundingClientRect(); return r.top < window.innerHeight && r.bottom > 0")
        .await;
    assert_eq!(bar, true, "the decision bar is not visible at 1280x800");
    let wide = br
        .eval("return document.documentElement.scrollWidth <= window.innerWidth")
        .await;
    assert_eq!(wide, true, "the page is wider than 1280 px");

    // At phone width (390×844), the same item: Approve and Reject are on screen without
    // scrolling sideways, and nothing makes the page wider than the phone.
    br.phone(Some((390, 844))).await;
    br.goto(&format!("{base}/item/{typo_id}")).await;
    br.find("#approve").await;
    let inner = br.eval("return window.innerWidth").await;
    assert!(
        inner.as_f64().unwrap() <= 400.0,
        "the window is {inner} px wide"
    );
    for button in ["approve", "reject"] {
        let on_screen = br
            .eval(&format!(
                "var r = document.getElementById('{button}').getBoundingClientRect(); \
                 return r.left >= 0 && r.right <= window.innerWidth && r.top >= 0 \
                 && r.bottom <= window.innerHeight && r.width > 0"
            ))
            .await;
        assert_eq!(on_screen, true, "#{button} is not on screen at 390x844");
    }
    let fits = br
        .eval("return document.documentElement.scrollWidth <= window.innerWidth")
        .await;
    let widest = br
        .eval(
            "var w = null, x = 0; document.querySelectorAll('body *').forEach(function (e) { \
             var r = e.getBoundingClientRect(); if (r.right > x) { x = r.right; w = e.tagName + '#' + e.id + '.' + e.className; } }); \
             return w + ' ' + x",
        )
        .await;
    assert_eq!(fits, true, "the item page is wider than a phone: {widest}");
    br.phone(None).await;

    // The duplicate: worker-b's request for invoice 1 names worker-a's pending one.
    br.goto(&format!("{base}/item/{dup_id}")).await;
    let alert = br.text("#duplicate-alert").await;
    assert!(
        alert.contains("pending") && alert.contains("worker-a"),
        "{alert}"
    );

    // The doomed payment says so before approval, and offers no Approve.
    br.goto(&format!("{base}/item/{doomed_id}")).await;
    let will = br.text("#will-refuse").await;
    assert!(will.contains("no-spend-after-denial"), "{will}");
    assert_eq!(br.count("#approve").await, 0);

    // Keyboard only: in the queue `j` and `k` move between items and Enter opens one; on an
    // item `a` approves, `r` + note + Ctrl+Enter rejects (a duplicate, a mismatch, or a call
    // that would be refused); each decision opens the next item.
    br.goto(&base).await;
    br.find("a.item").await;
    let first = br
        .eval("return document.querySelector('a.item').getAttribute('href')")
        .await;
    let started = Instant::now();
    let keys_before = br.keys;
    br.press(&["j"]).await;
    br.press(&["j"]).await;
    let focused = "return document.activeElement.getAttribute('href')";
    let second = br
        .eval("return document.querySelectorAll('a.item')[1].getAttribute('href')")
        .await;
    assert_eq!(br.eval(focused).await, second, "j moves to the next item");
    br.press(&["k"]).await;
    assert_eq!(br.eval(focused).await, first, "k moves back");
    br.press(&["\u{E007}"]).await;
    let opening = br.keys - keys_before;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !br.url_now().await.ends_with(first.as_str().unwrap()) {
        assert!(Instant::now() < deadline, "Enter did not open the item");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = port;
    let mut loads = 2;
    let (mut approved, mut rejected) = (0usize, 0usize);
    let (mut keys_approved, mut keys_rejected) = (0usize, 0usize);
    let mut rejected_ids = Vec::new();
    loop {
        br.find("#status").await;
        let here = br.url_now().await;
        let id = here
            .rsplit("/item/")
            .next()
            .unwrap()
            .split('?')
            .next()
            .unwrap()
            .to_string();
        let reject = br.count("#will-refuse").await > 0
            || br.count("#duplicate-alert").await > 0
            || br.count(".mismatch").await > 0;
        let before = br.keys;
        if reject {
            br.press(&["r"]).await;
            br.type_text("Not paying: see the marked facts").await;
            br.press(&["\u{E009}", "\u{E007}"]).await; // Ctrl+Enter
            rejected += 1;
            keys_rejected += br.keys - before;
            rejected_ids.push(id.clone());
        } else {
            br.press(&["a"]).await;
            approved += 1;
            keys_approved += br.keys - before;
        }
        loads += 1;
        // The next page: another item, or the last decision's outcome.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = br.url_now().await;
            if now != here {
                break;
            }
            assert!(Instant::now() < deadline, "no page after deciding {id}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if br.count("#result").await > 0 || br.count("#status").await == 0 {
            break;
        }
        assert!(approved + rejected <= 43, "the queue does not end");
    }
    br.goto(&base).await;
    assert!(br.count("#empty").await == 1, "bob's queue is not empty");
    assert_eq!(approved + rejected, 43);
    // Rejected: both of the duplicate pair (each names the other), the typo and the doomed
    // payment; approved: the other 39.
    assert!(rejected_ids.contains(&typo_id) && rejected_ids.contains(&doomed_id));
    assert!(rejected_ids.contains(&dup_id));
    assert_eq!((approved, rejected), (39, 4), "{rejected_ids:?}");
    let items = approved + rejected;
    eprintln!(
        "MEASURED: keyboard: {approved} approved with {:.2} interaction(s) each, {rejected} rejected with {:.2} each (r, the typed note, Ctrl+Enter); {} to open the first from the queue; {} page loads for {items} items ({:.2} per item); {:.2} s per item in the browser",
        keys_approved as f64 / approved.max(1) as f64,
        keys_rejected as f64 / rejected.max(1) as f64,
        opening,
        loads,
        loads as f64 / items as f64,
        started.elapsed().as_secs_f64() / items as f64
    );

    // The agent retries each approved call once: each runs once, by the fake's record.
    for n in 2..=40 {
        let r = call(
            &a,
            "payment.schedule",
            payment(&invoice(n), 4180.0, GOOD),
            meta(&format!("bulk-{n}")),
        )
        .await
        .unwrap();
        assert_ne!(r.is_error, Some(true), "{n}: {r:?}");
    }
    // Invoice 1 was rejected: its retry hears so, and nothing is sent.
    let r = call(
        &a,
        "payment.schedule",
        payment(&invoice(1), 4180.0, GOOD),
        meta("bulk-1"),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let booked: Vec<_> = read_records(&record)
        .unwrap()
        .into_iter()
        .filter(|r| r.tool == "schedule_payment")
        .collect();
    let mut per_invoice = std::collections::BTreeMap::new();
    for r in &booked {
        *per_invoice
            .entry(
                r.arguments["invoice_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
            .or_insert(0) += 1;
    }
    assert_eq!(per_invoice.len(), 39, "{per_invoice:?}");
    assert!(per_invoice.values().all(|n| *n == 1), "{per_invoice:?}");
    for n in [1, 98, 99] {
        assert!(!per_invoice.contains_key(&invoice(n)), "{n} ran");
    }
    br.quit().await;
    serve.kill().await.ok();
}

/// The approval request id in a parked call's answer.
fn approval_id(r: &rmcp::model::CallToolResult) -> String {
    structured(r)["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("not parked: {r:?}"))
        .to_string()
}

/// Waits until the browser is on a page other than `here`, and returns its address.
async fn left(br: &Browser, here: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = br.url_now().await;
        if now != here {
            return now;
        }
        assert!(Instant::now() < deadline, "still on {here}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Bulk approval on a queue of 41 payments parked through `toolgate serve`: offered only for
/// the like, low-risk ones, with the count and the total; each item kept out says why (a
/// duplicate, a mismatch with the invoice, an amount from the bulk limit, a first-time payee,
/// a call that would be refused); a wrong confirmation and a group whose member changed after
/// it was shown are refused whole, nothing approved; confirmed, each call runs once by the
/// fake's record. Then the supplier's account is changed (two people approve): its payments
/// show "changed today" in red and are decided one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_approval_on_forty_keeps_out_what_is_not_low_risk_and_runs_each_call_once() {
    if !browser::available("the approvals browser test") {
        return;
    }
    let Setup {
        _tmp,
        port: _,
        record,
        store_path,
        mut serve,
        mcp,
        base,
    } = Setup::start().await;
    let a = connect(&mcp, WORKER_A).await;
    let b = connect(&mcp, WORKER_B).await;
    let invoice = |n: usize| format!("INV-9{n:07}");
    let pay = |n: usize| payment(&invoice(n), 4180.0, GOOD);
    let store = Store::connect(
        &format!("sqlite://{}", store_path.display()),
        StoreConfig::default(),
    )
    .await
    .unwrap();
    let mut br = Browser::start(1280, 800).await;
    br.sign_in(&base, BOB).await;

    // History: one payment to Nordlicht (SUP-0001), approved by bob and run.
    let first = approval_id(
        &call(&b, "payment.schedule", pay(1), meta("bulk-1"))
            .await
            .unwrap(),
    );
    br.goto(&format!("{base}/item/{first}")).await;
    br.click("#approve").await;
    br.find("#result").await;
    let r = call(&b, "payment.schedule", pay(1), meta("bulk-1"))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");

    // The queue: 36 like payments (invoices 2 to 37) by worker-b ...
    for n in 2..=37 {
        let r = call(&b, "payment.schedule", pay(n), meta(&format!("bulk-{n}")))
            .await
            .unwrap();
        assert_eq!(structured(&r)["status"], "needs_approval", "{r:?}");
    }
    // ... invoice 37 asked again by worker-a (both are possible duplicates) ...
    let dup = approval_id(
        &call(&a, "payment.schedule", pay(37), meta("dup"))
            .await
            .unwrap(),
    );
    // ... a transposed amount (the invoice says 4,180.00) ...
    let typo = approval_id(
        &call(
            &b,
            "payment.schedule",
            payment(&invoice(99), 4810.0, GOOD),
            meta("typo"),
        )
        .await
        .unwrap(),
    );
    // ... Costa Verde's 12,600.00 freight invoice (from the bulk limit up) ...
    let large = approval_id(
        &call(
            &b,
            "payment.schedule",
            payment(
                "INV-20260612",
                12600.0,
                "Three-way match complete against PO-77840; freight June",
            ),
            meta("large"),
        )
        .await
        .unwrap(),
    );
    // ... Fenland's invoice: nobody paid Fenland before ...
    let new_payee = approval_id(
        &call(
            &b,
            "payment.schedule",
            payment(
                "INV-20260615",
                880.5,
                "Three-way match complete against PO-77901; toner Q2",
            ),
            meta("fenland"),
        )
        .await
        .unwrap(),
    );
    // ... and a payment whose run is then refused once: it would be refused now.
    let doomed = approval_id(
        &call(&b, "payment.schedule", pay(98), meta("doomed"))
            .await
            .unwrap(),
    );
    let refused = call(
        &b,
        "payment.schedule",
        payment(&invoice(97), 4180.0, "Paying this one today as agreed"),
        meta("doomed"),
    )
    .await
    .unwrap();
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let open = store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap();
    assert_eq!(
        open.len(),
        41,
        "36 like, a duplicate, a typo, a large, a new payee, a doomed"
    );

    let loads_before = Instant::now();
    br.goto(&base).await;
    let count = br.attr("form.bulk", "data-count").await;
    assert_eq!(
        count, "35",
        "invoices 2 to 36; 37 and its duplicate are kept out"
    );
    assert_eq!(br.text("form.bulk .bulk-total").await, "146,300.00 EUR");
    let why = |id: &str| {
        format!(
            "var a = document.querySelector(\"a.item[href$='{id}']\"); \
             var k = a && a.closest('tr').querySelector('.kept-out'); \
             return k ? k.getAttribute('data-why') : null"
        )
    };
    for (id, reason) in [
        (&dup, "possible duplicate"),
        (&typo, "facts mismatch"),
        (&large, "amount above the bulk limit"),
        (&new_payee, "first-time payee"),
        (&doomed, "would be refused"),
    ] {
        assert_eq!(br.eval(&why(id)).await, reason, "{id}");
    }
    let shown: Vec<(String, String)> = br
        .eval("return document.querySelector('form.bulk input[name=set]').value")
        .await
        .as_str()
        .unwrap()
        .split(',')
        .map(|m| {
            let (id, h) = m.split_once(':').unwrap();
            (id.to_string(), h.to_string())
        })
        .collect();
    assert_eq!(shown.len(), 35);
    for kept in [&dup, &typo, &large, &new_payee, &doomed] {
        assert!(
            !shown.iter().any(|(id, _)| id == kept),
            "{kept} is in the set"
        );
    }
    let unapproved = |ids: Vec<String>| {
        let store = store.clone();
        async move {
            for id in ids {
                assert!(
                    store
                        .approval(&id.as_str().into())
                        .await
                        .unwrap()
                        .approved_by
                        .is_empty(),
                    "{id} was approved"
                );
            }
        }
    };
    let ids: Vec<String> = shown.iter().map(|(id, _)| id.clone()).collect();

    // A wrong confirmation is refused; nothing is approved.
    br.type_into("form.bulk .bulk-confirm", "approve 34\u{E007}")
        .await;
    let refusal = br.text("#error").await;
    assert!(
        refusal.contains("nothing was approved") && refusal.contains("type 'approve 35'"),
        "{refusal}"
    );
    unapproved(ids.clone()).await;

    // Between showing and confirming, one member is decided elsewhere: refused whole.
    br.goto(&base).await;
    let reg = toolgate_core::Registry::load(_tmp.path().join("finance")).unwrap();
    let now = toolgate_core::Timestamp::from_millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
    );
    store
        .reject(
            &reg,
            &shown[0].0.as_str().into(),
            &"alice".into(),
            "paid by cheque already",
            now,
        )
        .await
        .unwrap();
    br.type_into("form.bulk .bulk-confirm", "approve 35\u{E007}")
        .await;
    let refusal = br.text("#error").await;
    assert!(refusal.contains("nothing was approved"), "{refusal}");
    unapproved(ids[1..].to_vec()).await;

    // Shown again: 34; typed and confirmed, exactly those 34 are approved.
    let started = Instant::now();
    let keys_before = br.keys;
    br.goto(&base).await;
    assert_eq!(br.attr("form.bulk", "data-count").await, "34");
    let here = br.url_now().await;
    br.find("form.bulk .bulk-confirm").await;
    br.eval("document.querySelector('form.bulk .bulk-confirm').focus()")
        .await;
    br.type_text("approve 34").await;
    br.press(&["\u{E007}"]).await;
    left(&br, &here).await;
    let result = br.text("#result").await;
    assert!(result.contains("Approved 34 calls as one"), "{result}");
    let bulk_keys = br.keys - keys_before;
    eprintln!(
        "MEASURED: bulk: 34 approved with {bulk_keys} interaction(s) (the typed phrase, Enter) and 2 page loads: {:.3} interactions and {:.3} page loads per item; {:.3} s per item ({:.1} s for the first queue page of 41 with its offer)",
        bulk_keys as f64 / 34.0,
        2.0 / 34.0,
        started.elapsed().as_secs_f64() / 34.0,
        loads_before.elapsed().as_secs_f64() - started.elapsed().as_secs_f64()
    );
    for id in &ids[1..] {
        assert_eq!(
            store.approval(&id.as_str().into()).await.unwrap().status,
            ApprovalStatus::Approved
        );
    }
    for kept in [&dup, &typo, &large, &new_payee, &doomed] {
        assert!(
            store
                .approval(&kept.as_str().into())
                .await
                .unwrap()
                .approved_by
                .is_empty()
        );
    }
    // The agent retries each, twice: each approved call runs once, the others never.
    for n in 2..=37 {
        for _ in 0..2 {
            call(&b, "payment.schedule", pay(n), meta(&format!("bulk-{n}")))
                .await
                .unwrap();
        }
    }
    let mut per_invoice = std::collections::BTreeMap::new();
    for r in read_records(&record)
        .unwrap()
        .into_iter()
        .filter(|r| r.tool == "schedule_payment")
    {
        *per_invoice
            .entry(
                r.arguments["invoice_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
            .or_insert(0) += 1;
    }
    // Invoice 1 (the history), and 3 to 36 (2 was rejected, 37 is a duplicate pair).
    assert_eq!(per_invoice.len(), 35, "{per_invoice:?}");
    assert!(per_invoice.values().all(|n| *n == 1), "{per_invoice:?}");
    for n in [2, 37, 97, 98, 99] {
        assert!(!per_invoice.contains_key(&invoice(n)), "{n} ran");
    }

    // Nordlicht's account changes: sam asks, vera and walt approve, sam's retry runs it.
    let s = connect(&mcp, SAM).await;
    let change = json!({"supplier_id": "SUP-0001", "iban": "DE89370400440532013000",
                        "reason": "New bank letter received from Nordlicht on 2026-06-10"});
    let change_meta = json!({"purpose": "supplier_maintenance", "run_id": "iban-nordlicht"});
    let iban_id = approval_id(
        &call(
            &s,
            "supplier.update_iban",
            change.clone(),
            change_meta.clone(),
        )
        .await
        .unwrap(),
    );
    for key in [VERA, WALT] {
        br.sign_in(&base, key).await;
        br.goto(&format!("{base}/item/{iban_id}")).await;
        br.click("#approve").await;
        br.find("#result").await;
    }
    let r = call(&s, "supplier.update_iban", change, change_meta)
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    // Two new payments to Nordlicht: its account changed today, so no bulk offer.
    let mut fresh = Vec::new();
    for (n, run) in [(90, "fresh-1"), (91, "fresh-2")] {
        fresh.push(approval_id(
            &call(&b, "payment.schedule", pay(n), meta(run))
                .await
                .unwrap(),
        ));
    }
    br.sign_in(&base, BOB).await;
    br.goto(&base).await;
    br.find("a.item").await;
    assert_eq!(
        br.count("form.bulk").await,
        0,
        "a changed account is offered in bulk"
    );
    for id in &fresh {
        assert_eq!(br.eval(&why(id)).await, "account changed recently", "{id}");
    }
    br.goto(&format!("{base}/item/{}", fresh[0])).await;
    let since = br.text("#fact-account .since").await;
    assert!(since.contains("changed today"), "{since}");
    assert_eq!(br.count("#fact-account .since.recent").await, 1);
    br.quit().await;
    serve.kill().await.ok();
}

//! Rotating the approval key, end to end: a payment parked and approved under key k1 runs on
//! the agent's plain retry after the gateway restarts with k2 and k1 listed as a previous key;
//! a payment approved under k1 and retried after k1 is no longer listed does not run, and the
//! agent reads why. The keys come from toolgate.yaml and the environment through the same
//! loader `serve` uses (`toolgate_gateway::keys::load`), with the environment passed in.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::{Clock, Registry, SystemClock};
use toolgate_gateway::{Gateway, KeySource, ServeOptions, keys};

use crate::common::*;

const KEY_1: &str = "rotation-test-approval-key-one-0123456789";
const KEY_2: &str = "rotation-test-approval-key-two-0123456789";
const REDACTION: &str = "rotation-test-redaction-key-0123456789ab";

/// Builds and serves the gateway of `dir` with `approvals` as toolgate.yaml's approvals section
/// and `vars` as the environment.
async fn serve_with(
    dir: &Path,
    approvals: &str,
    vars: &[(&str, &str)],
) -> (Gateway, String, CancellationToken) {
    let top = dir.join("toolgate.yaml");
    let text = std::fs::read_to_string(&top).unwrap();
    let base = text.split("approvals:\n").next().unwrap().to_string();
    std::fs::write(&top, format!("{base}approvals:\n{approvals}")).unwrap();
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let registry = Registry::load(dir).unwrap();
    let secrets = keys::load(&registry, false, &|n| env.get(n).cloned()).expect("keys load");
    assert!(!secrets.status.is_dev());
    let gateway = Gateway::build(&ServeOptions {
        config_dir: dir.to_path_buf(),
        http: true,
        keys: KeySource::Given(secrets),
        ..ServeOptions::default()
    })
    .await
    .expect("gateway builds");
    let stop = CancellationToken::new();
    let (addr, fut) = gateway
        .bind_http("127.0.0.1:0", stop.clone())
        .await
        .unwrap();
    tokio::spawn(fut);
    (gateway, format!("http://{addr}/mcp"), stop)
}

fn payment(invoice: &str, amount: f64) -> Value {
    json!({"invoice_id": invoice, "amount": amount, "currency": "EUR", "value_date": "2026-07-03",
           "reason": format!("Invoice {invoice} matched against PO-77840")})
}

fn text_of(r: &rmcp::model::CallToolResult) -> String {
    format!(
        "{} {}",
        serde_json::to_string(&r.content).unwrap(),
        r.structured_content.clone().unwrap_or(Value::Null)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_signed_with_a_previous_key_runs_after_rotation_and_one_whose_key_is_gone_does_not()
 {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let record = dir.join("erp-calls.jsonl");
    let (fake, fake_stop) = start_fake_finance(&record, Vec::new()).await;
    write_registry(
        dir,
        &format!(
            "    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 2\n"
        ),
    );
    let scheduled = || {
        if !record.exists() {
            return 0;
        }
        toolgate_fakes::record::read_records(&record)
            .unwrap()
            .into_iter()
            .filter(|r| r.tool == "schedule_payment")
            .count()
    };
    let meta = json!({"purpose": "billing"});

    // 1. Under k1: two payments parked, a person approves both.
    let (gw, url, stop) = serve_with(
        dir,
        "  key_id: k1\n",
        &[
            ("TOOLGATE_APPROVAL_KEY", KEY_1),
            ("TOOLGATE_REDACTION_KEY", REDACTION),
        ],
    )
    .await;
    let agent = connect(&url, WORKER_KEY).await;
    let mut tokens = Vec::new();
    for (invoice, amount) in [("INV-20260612", 12600.0), ("INV-20260613", 4200.0)] {
        let r = call(
            &agent,
            "payment.schedule",
            payment(invoice, amount),
            meta.clone(),
        )
        .await
        .unwrap();
        let facts = r.structured_content.unwrap();
        assert_eq!(facts["status"], "needs_approval", "{facts}");
        let id = facts["approval_id"].as_str().unwrap().to_string();
        let ex = gw.state.executor();
        let token = gw
            .state
            .store
            .approve(
                &ex.registry,
                &ex.keys,
                &id.as_str().into(),
                &"test-clerk".into(),
                SystemClock.now(),
            )
            .await
            .unwrap();
        assert!(token.as_str().starts_with("tg1.k1."), "{}", token.as_str());
        tokens.push(token);
    }
    drop(agent);
    stop.cancel();
    gw.close().await;
    assert_eq!(scheduled(), 0);

    // 2. Rotated: k2 signs, k1 is kept for verification. The first payment's retry runs, once.
    let (gw, url, stop) = serve_with(
        dir,
        "  key_id: k2\n  previous:\n    - id: k1\n      env: TOOLGATE_APPROVAL_KEY_K1\n",
        &[
            ("TOOLGATE_APPROVAL_KEY", KEY_2),
            ("TOOLGATE_APPROVAL_KEY_K1", KEY_1),
            ("TOOLGATE_REDACTION_KEY", REDACTION),
        ],
    )
    .await;
    let agent = connect(&url, WORKER_KEY).await;
    let r = call(
        &agent,
        "payment.schedule",
        payment("INV-20260612", 12600.0),
        meta.clone(),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{}", text_of(&r));
    assert_ne!(
        r.structured_content.as_ref().map(|s| s["status"].clone()),
        Some(json!("needs_approval")),
        "{}",
        text_of(&r)
    );
    assert_eq!(scheduled(), 1, "the approved payment ran once");
    drop(agent);
    stop.cancel();
    gw.close().await;

    // 3. k1 no longer listed: the second payment's approval is refused, readably, and the
    //    payment does not run.
    let (gw, url, stop) = serve_with(
        dir,
        "  key_id: k2\n",
        &[
            ("TOOLGATE_APPROVAL_KEY", KEY_2),
            ("TOOLGATE_REDACTION_KEY", REDACTION),
        ],
    )
    .await;
    let agent = connect(&url, WORKER_KEY).await;
    let r = call(
        &agent,
        "payment.schedule",
        payment("INV-20260613", 4200.0),
        meta.clone(),
    )
    .await
    .unwrap();
    let text = text_of(&r);
    assert_eq!(
        r.structured_content.as_ref().unwrap()["status"],
        "needs_approval",
        "{text}"
    );
    assert!(
        text.contains("the approval token names key 'k1', which is not configured"),
        "{text}"
    );
    assert_eq!(scheduled(), 1, "the payment approved under k1 did not run");
    // The gateway still serves: the first payment's retry replays its outcome.
    let r = call(
        &agent,
        "payment.schedule",
        payment("INV-20260612", 12600.0),
        meta,
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{}", text_of(&r));
    assert_eq!(scheduled(), 1);
    drop(agent);
    stop.cancel();
    gw.close().await;
    fake_stop.cancel();
}

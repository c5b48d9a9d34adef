//! `toolgate serve` works the plan queue itself, as a user meets it: `serve` as a process on
//! the finance example (its ERP the fake binary, recording every call), a plan submitted by a
//! real MCP client (rmcp over streamable HTTP), its payment step parked for a person, approved
//! with the real `toolgate approvals approve` — and the fake's record shows the payment made
//! exactly once, with no `toolgate worker` started. Then `serve` and a `toolgate worker` both
//! working one store: each approved payment is still made exactly once. And `serve
//! --no-worker` leaves an approved step queued for a worker.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::service::RunningService;
use serde_json::{Value, json};
use toolgate_fakes::record::read_records;

use crate::clients::workspace_binary;
use crate::common::{call, connect};

const APPROVAL_KEY: &str = "toolgate-test-approval-key-serve-worker-0123";
const REDACTION_KEY: &str = "toolgate-test-redaction-key-serve-worker-01";
const PLANNER: &str = "tgdev_fin_planner";
const ALICE: &str = "tgdev_fin_alice";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The finance example as shipped (plan-bound workers, its development credentials), its ERP
/// the fake binary with bulk invoices, recording to `record`, its store in the folder, and room
/// in the payment value limit for the test's five payments.
fn write_registry(dir: &Path, record: &Path) {
    let ex = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    copy_dir(&ex, dir);
    copy_dir(&ex.join("tools"), &dir.join("tools"));
    copy_dir(&ex.join("policies"), &dir.join("policies"));
    // Five payments of 4,180 EUR in a day: above the example's 24 h value limit.
    let pay = dir.join("tools/payments.yaml");
    let text = std::fs::read_to_string(&pay).unwrap();
    assert!(text.contains("limit: 20000, window: 24h"), "{text}");
    std::fs::write(
        &pay,
        text.replacen("limit: 20000, window: 24h", "limit: 100000, window: 24h", 1),
    )
    .unwrap();
    let fake = workspace_binary("toolgate-fake-finance", "toolgate-fakes");
    let top = dir.join("toolgate.yaml");
    let text = std::fs::read_to_string(&top).unwrap();
    let text = text
        .replace(
            "    command: toolgate-fake-finance\n",
            &format!("    command: {:?}\n", fake.display().to_string()),
        )
        .replace(
            "    args: []\n",
            &format!(
                "    args: [\"--record\", {:?}]\n    env: [TOOLGATE_FAKE_FINANCE_BULK]\n",
                record.display().to_string()
            ),
        );
    assert!(text.contains("--record"), "{text}");
    std::fs::write(&top, text).unwrap();
    toolgate_gateway::pins::rehome_lock(dir).unwrap();
}

fn toolgate() -> Command {
    let mut c = Command::new(workspace_binary("toolgate", "toolgate"));
    c.env("TOOLGATE_APPROVAL_KEY", APPROVAL_KEY)
        .env("TOOLGATE_REDACTION_KEY", REDACTION_KEY)
        .env("TOOLGATE_FAKE_FINANCE_BULK", "1")
        .env("RUST_LOG", "warn")
        .env_remove("TOOLGATE_CONFIG")
        .env_remove("TOOLGATE_STORE_URL")
        .env_remove("TOOLGATE_API_KEY");
    c
}

/// A long-running `toolgate` process, killed when the test ends; its output in `log`.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn start(args: &[&str], dir: &Path, log: PathBuf) -> Process {
        let f = std::fs::File::create(&log).unwrap();
        let child = toolgate()
            .args(args)
            .arg("-c")
            .arg(dir)
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        Process { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(mut self) {
        #[cfg(unix)]
        {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "did not stop:\n{}", self.log());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `toolgate serve` on `dir` at a port it picks, once `/readyz` says ready; its MCP URL.
async fn serve(dir: &Path, extra: &[&str]) -> (Process, String) {
    let mut args = vec!["serve", "--http", "127.0.0.1:0", "--no-watch"];
    args.extend_from_slice(extra);
    let log = dir.join("serve.log");
    let p = Process::start(&args, dir, log.clone());
    let addr = toolgate_testkit::served_addr(dir, p.child.id(), Some(&log)).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "serve not ready:\n{}", p.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (p, format!("http://{addr}/mcp"))
}

fn billing(reason: &str) -> Value {
    json!({"purpose": "billing", "reason": reason})
}

fn facts(r: &rmcp::model::CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

/// Submits a one-step plan paying `invoice` (a bulk copy of the 4,180.00 EUR invoice); its run.
async fn submit_payment(planner: &RunningService<RoleClient, ()>, invoice: &str) -> String {
    let plan = json!({
        "goal": format!("Pay {invoice}"),
        "steps": [{
            "tool": "payment.schedule",
            "inputs": {"invoice_id": invoice, "amount": 4180.0, "currency": "EUR",
                       "value_date": "2026-06-30",
                       "reason": "Three-way match complete against PO-77812; net-30."},
            "purpose": "billing",
            "justification": "Pay the matched invoice.",
            "evidence": [invoice, "PO-77812"],
        }]
    });
    let r = call(planner, "plan.submit", plan, billing("Plan the payment."))
        .await
        .expect("plan.submit answers");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    facts(&r)["run_id"].as_str().unwrap().to_string()
}

/// The run's only step, as `run.status` shows it.
async fn step(planner: &RunningService<RoleClient, ()>, run: &str) -> Value {
    let r = call(
        planner,
        "run.status",
        json!({"run_id": run}),
        billing("Follow the run."),
    )
    .await
    .expect("run.status answers");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    facts(&r)["steps"][0].clone()
}

/// Waits until the run's step has `status`; the step.
async fn step_becomes(
    planner: &RunningService<RoleClient, ()>,
    run: &str,
    status: &str,
    log: &dyn Fn() -> String,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = step(planner, run).await;
        if s["status"] == status {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "run {run}'s step is {s}, not {status}:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `toolgate approvals show` then `approve` with the hash it printed, as alice.
fn approve(dir: &Path, approval: &str) -> String {
    let show = toolgate()
        .args(["approvals", "show", approval, "-c"])
        .arg(dir)
        .env("TOOLGATE_API_KEY", ALICE)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(show.status.success(), "{text}");
    let hash = text
        .lines()
        .find_map(|l| l.strip_prefix("input hash: "))
        .unwrap_or_else(|| panic!("no input hash in:\n{text}"))
        .trim()
        .to_string();
    let out = toolgate()
        .args([
            "approvals",
            "approve",
            approval,
            "--input-hash",
            &hash,
            "-c",
        ])
        .arg(dir)
        .env("TOOLGATE_API_KEY", ALICE)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// How many times the fake ERP booked a payment of `invoice`.
fn payments_of(record: &Path, invoice: &str) -> usize {
    if !record.exists() {
        return 0;
    }
    read_records(record)
        .unwrap()
        .into_iter()
        .filter(|r| r.tool == "schedule_payment" && r.arguments["invoice_id"] == invoice)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_planned_step_runs_once_in_serve_without_a_worker_and_once_beside_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("finance");
    let record = tmp.path().join("erp-calls.jsonl");
    write_registry(&dir, &record);

    // 1. serve alone: the plan's step is claimed by serve and parked for a person.
    let (server, url) = serve(&dir, &[]).await;
    let planner = connect(&url, PLANNER).await;
    let run = submit_payment(&planner, "INV-90000001").await;
    let parked = step_becomes(&planner, &run, "needs_approval", &|| server.log()).await;
    assert_eq!(parked["rule"], "gate.always", "{parked}");
    assert_eq!(payments_of(&record, "INV-90000001"), 0, "parked, not paid");
    let said = approve(&dir, parked["approval_id"].as_str().unwrap());
    assert!(said.contains("is queued"), "{said}");
    let done = step_becomes(&planner, &run, "done", &|| server.log()).await;
    assert_eq!(done["worker"], "fin-worker", "{done}");
    // Nothing runs it twice: give a second claim time to happen.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        payments_of(&record, "INV-90000001"),
        1,
        "the approved payment was made exactly once by serve alone"
    );

    // 2. serve and a `toolgate worker` on the same store: each approved payment once.
    let worker = Process::start(&["worker"], &dir, tmp.path().join("worker.log"));
    let invoices = ["INV-90000002", "INV-90000003", "INV-90000004"];
    let mut runs = Vec::new();
    for inv in invoices {
        let run = submit_payment(&planner, inv).await;
        let parked = step_becomes(&planner, &run, "needs_approval", &|| {
            format!("{}\n{}", server.log(), worker.log())
        })
        .await;
        runs.push((run, parked["approval_id"].as_str().unwrap().to_string()));
    }
    for (_, approval) in &runs {
        approve(&dir, approval);
    }
    for (run, _) in &runs {
        step_becomes(&planner, run, "done", &|| {
            format!("{}\n{}", server.log(), worker.log())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for inv in invoices {
        assert_eq!(
            payments_of(&record, inv),
            1,
            "{inv} paid exactly once with serve and a worker both working the queue"
        );
    }
    worker.stop();
    planner.cancel().await.ok();
    server.stop();

    // 3. serve --no-worker leaves an approved step queued for a worker.
    let (server, url) = serve(&dir, &["--no-worker"]).await;
    let planner = connect(&url, PLANNER).await;
    let run = submit_payment(&planner, "INV-90000005").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        step(&planner, &run).await["status"],
        "pending",
        "with --no-worker serve claims nothing:\n{}",
        server.log()
    );
    let out = toolgate()
        .args(["worker", "--until-idle", "-c"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let parked = step_becomes(&planner, &run, "needs_approval", &|| server.log()).await;
    approve(&dir, parked["approval_id"].as_str().unwrap());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        step(&planner, &run).await["status"],
        "pending",
        "approved and queued, not run"
    );
    assert_eq!(payments_of(&record, "INV-90000005"), 0, "nobody worked it");
    let out = toolgate()
        .args(["worker", "--until-idle", "-c"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    step_becomes(&planner, &run, "done", &|| server.log()).await;
    assert_eq!(payments_of(&record, "INV-90000005"), 1);
    planner.cancel().await.ok();
    server.stop();
}

/// In process: the queue worked beside the gateway follows a reload. A step claimed before the
/// reload is decided under the version serving then, one submitted after under the new one (by
/// the registry version each audit record names), and stopping returns after the batch in hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_plan_worker_follows_a_reload() {
    use toolgate_gateway::{Gateway, ServeOptions, Trigger};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ex = crate::common::example_dir();
    copy_dir(&ex.join("tools"), &dir.join("tools"));
    copy_dir(&ex.join("policies"), &dir.join("policies"));
    std::fs::copy(ex.join("principals.yaml"), dir.join("principals.yaml")).unwrap();
    let record = dir.join("erp-calls.jsonl");
    let (fake, fake_stop) = crate::common::start_fake_finance(&record, Vec::new()).await;
    let top = || {
        format!(
            "label: reload-test\nstore:\n  url: \"sqlite://toolgate.db\"\nupstreams:\n  erp:\n    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 5\n"
        )
    };
    std::fs::write(dir.join("toolgate.yaml"), top()).unwrap();
    std::fs::copy(ex.join("toolgate.lock"), dir.join("toolgate.lock")).unwrap();
    toolgate_gateway::pins::rehome_lock(dir).unwrap();
    let gateway = Gateway::build(&ServeOptions {
        config_dir: dir.to_path_buf(),
        http: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    })
    .await
    .expect("gateway builds");
    let stop = tokio_util::sync::CancellationToken::new();
    let (addr, fut) = gateway
        .bind_http("127.0.0.1:0", stop.clone())
        .await
        .unwrap();
    tokio::spawn(fut);
    let gateway = std::sync::Arc::new(gateway);
    let working = {
        let (g, s) = (gateway.clone(), stop.clone());
        tokio::spawn(async move { g.work_plans(s).await })
    };
    let planner = connect(&format!("http://{addr}/mcp"), PLANNER).await;
    let note = |text: &str| {
        json!({"goal": "Leave a note", "steps": [{
            "tool": "note.draft", "purpose": "billing", "worker": "fin-worker",
            "inputs": {"invoice_id": "INV-20260611", "kind": "info", "text": text},
            "justification": "Leave a trail on the invoice.", "evidence": ["INV-20260611"]}]})
    };
    let version_of = |run: String| {
        let g = gateway.clone();
        async move {
            let recs = g
                .state
                .store
                .audit_records(None, Some(&run.as_str().into()))
                .await
                .unwrap();
            recs.iter()
                .find(|r| r.body.tool == "note.draft")
                .map(|r| r.body.registry_version.clone())
                .expect("the step is recorded")
        }
    };
    let submit = |text: &'static str| {
        let planner = &planner;
        async move {
            let r = call(planner, "plan.submit", note(text), billing("Plan a note."))
                .await
                .unwrap();
            assert_ne!(r.is_error, Some(true), "{r:?}");
            facts(&r)["run_id"].as_str().unwrap().to_string()
        }
    };
    let before = gateway.state.registry().version.hash.clone();
    let first = submit("Matched against PO-77812.").await;
    step_becomes(&planner, &first, "done", &String::new).await;
    assert_eq!(version_of(first).await, before);

    // A reloadable change: the note tool's per-run limit.
    let notes = dir.join("tools/notes.yaml");
    let text = std::fs::read_to_string(&notes).unwrap();
    assert!(text.contains("    rate_limit: 3\n"), "{text}");
    std::fs::write(
        &notes,
        text.replacen("    rate_limit: 3\n", "    rate_limit: 2\n", 1),
    )
    .unwrap();
    let report = gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(
        report.outcome,
        toolgate_gateway::ReloadOutcome::Applied,
        "{report:?}"
    );
    let after = gateway.state.registry().version.hash.clone();
    assert_ne!(after, before);
    let second = submit("Paid on the value date.").await;
    step_becomes(&planner, &second, "done", &String::new).await;
    assert_eq!(
        version_of(second).await,
        after,
        "decided under the version serving"
    );

    stop.cancel();
    let stats = tokio::time::timeout(Duration::from_secs(30), working)
        .await
        .expect("stops")
        .unwrap();
    assert_eq!((stats.executed, stats.done), (2, 2), "{stats:?}");
    assert_eq!(
        read_records(&record)
            .unwrap()
            .iter()
            .filter(|r| r.tool == "draft_note")
            .count(),
        2
    );
    planner.cancel().await.ok();
    gateway.close().await;
    fake_stop.cancel();
}

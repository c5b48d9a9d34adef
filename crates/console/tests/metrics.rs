//! `/metrics`: refused without the scrape token or from off this host; with it, the report's
//! figures, advanced as records are appended (read from the chain's tail, not re-aggregated),
//! with every label bounded by the registry whatever an agent typed.

use crate::common::*;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use serde_json::json;
use toolgate_console::metrics_router;
use toolgate_core::config::{GatewayFile, MetricsConfig};
use toolgate_core::{StepStatus, Timestamp};
use toolgate_store::audit::{AuditOutcome, AuditWho, AuditWhy};
use toolgate_store::{Actor, AuditDecision, AuditDraft};

async fn scrape(h: &mut Http) -> String {
    let r = h.get_bearer("/metrics", SCRAPE_TOKEN).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body
}

/// The value of the series `series` (name and labels exactly as printed).
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn draft(tool: &str, decision: AuditDecision, rule: Option<&str>, i: i64) -> AuditDraft {
    AuditDraft {
        ts: Timestamp::from_millis(T0.millis() + i),
        run_id: Some(format!("run-m-{i}").into()),
        step_id: None,
        who: AuditWho {
            principal: "fin-worker".into(),
            role: "worker.finance".into(),
            actor: Actor::default(),
        },
        tool: tool.into(),
        tool_version: None,
        effect: None,
        tier: None,
        inputs: json!({"invoice_id": format!("INV-{i}")}),
        redacted: vec![],
        idem_key: None,
        why: AuditWhy {
            purpose: Some("billing".into()),
            reason: None,
            evidence: vec![],
            decision,
            rule: rule.map(toolgate_core::Rule::from),
            checks: vec![],
            shadow: Vec::new(),
        },
        approval: None,
        outcome: AuditOutcome {
            status: if decision == AuditDecision::Allow {
                StepStatus::Done
            } else {
                StepStatus::Refused
            },
            target_ref: None,
            latency_ms: Some(3),
            latency_us: None,
            governance_us: Some(1500),
            error: None,
        },
        registry_version: "test".into(),
    }
}

#[tokio::test]
async fn metrics_needs_the_scrape_token_and_a_peer_on_this_host() {
    let e = env().await;
    // No token configured: no scrape is admitted, whatever it presents.
    let mut closed = Http::new(metrics_router(e.console("")));
    let r = closed.get("/metrics").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.body.contains("none is configured"), "{}", r.body);
    let r = closed.get_bearer("/metrics", SCRAPE_TOKEN).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    let state = e.console_scraped("");
    let mut h = Http::new(metrics_router(state.clone()));
    let r = h.get("/metrics").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.headers[WWW_AUTHENTICATE],
        "Bearer realm=\"toolgate-metrics\""
    );
    assert!(!r.body.contains("toolgate_"), "{}", r.body);
    for wrong in ["scrape-token-for-the-tests-0002", "scrape-token", ""] {
        let r = h.get_bearer("/metrics", wrong).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    }

    // The right token from another host, or from a peer the server did not record: refused.
    for peer in [Some("192.0.2.10:5000"), Some("[2001:db8::1]:5000"), None] {
        let mut far = Http::new(metrics_router(state.clone())).at_peer(peer);
        let r = far.get_bearer("/metrics", SCRAPE_TOKEN).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{peer:?}");
        assert!(r.body.contains("allow_remote"), "{}", r.body);
    }

    // On this host, IPv4 or IPv6 loopback, with the token: the page.
    for peer in [LOOPBACK, "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
        let mut near = Http::new(metrics_router(state.clone())).at_peer(Some(peer));
        let r = near.get_bearer("/metrics", SCRAPE_TOKEN).await;
        assert_eq!(r.status, StatusCode::OK, "{peer}: {}", r.body);
        assert!(
            r.headers[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        assert!(r.body.contains("# TYPE toolgate_calls_total counter"));
    }

    // `allow_remote` admits other hosts, still only with the token.
    let open = e.console_with("", |o| {
        o.metrics.token = Some(toolgate_console::ScrapeToken::new(SCRAPE_TOKEN).unwrap());
        o.metrics.allow_remote = true;
        o.metrics.min_interval = std::time::Duration::ZERO;
    });
    let mut far = Http::new(metrics_router(open)).at_peer(Some("192.0.2.10:5000"));
    assert_eq!(far.get("/metrics").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        far.get_bearer("/metrics", SCRAPE_TOKEN).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn metrics_carry_the_reports_figures_and_advance_as_records_are_appended() {
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    toolgate_console::actions::reject(&e.exec, &p.approval, "alice", "new IBAN")
        .await
        .unwrap();
    let state = e.console_scraped("");
    let mut h = Http::new(metrics_router(state.clone()));
    let page = scrape(&mut h).await;

    let report = toolgate_console::report::gather(&e.store, &e.exec.registry, None, e.clock_now())
        .await
        .unwrap();
    assert!(report.records > 0);
    assert_eq!(
        value(&page, "toolgate_audit_records_total"),
        Some(report.records as f64)
    );
    for ((tool, decision), n) in &report.calls {
        let series = format!("toolgate_calls_total{{tool=\"{tool}\",decision=\"{decision}\"}}");
        assert_eq!(value(&page, &series), Some(*n as f64), "{series}\n{page}");
    }
    for (rule, n) in &report.refusals {
        let series = format!("toolgate_refusals_total{{rule=\"{rule}\"}}");
        assert_eq!(value(&page, &series), Some(*n as f64), "{series}");
    }
    assert_eq!(
        value(&page, "toolgate_duplicates_suppressed_total"),
        Some(report.duplicates_suppressed as f64)
    );
    let g = &report.gates[0];
    let gate = format!("tool=\"{}\",rule=\"{}\"", g.tool, g.rule);
    for (status, n) in [("approved", g.approved), ("rejected", g.rejected)] {
        let series = format!("toolgate_gate_requests_total{{{gate},status=\"{status}\"}}");
        assert_eq!(value(&page, &series), Some(n as f64), "{series}");
    }
    assert_eq!(
        value(&page, &format!("toolgate_gate_rejection_rate{{{gate}}}")),
        g.rejection_rate()
    );
    assert_eq!(
        value(&page, "toolgate_approval_age_seconds_count"),
        Some(report.approval_age.n as f64)
    );
    for b in &report.budgets {
        let series = format!(
            "toolgate_budget_used{{principal=\"{}\",tier=\"{}\"}}",
            b.principal,
            b.tier.as_str()
        );
        assert_eq!(value(&page, &series), Some(b.used as f64), "{series}");
    }

    // Three allowed reads and a denial join the chain; the next scrape counts exactly them.
    let allowed = "toolgate_calls_total{tool=\"invoice.get\",decision=\"allow\"}";
    let before = value(&page, allowed).unwrap_or(0.0);
    let governed = value(&page, "toolgate_governance_latency_seconds_count").unwrap();
    let mut drafts: Vec<AuditDraft> = (0..3)
        .map(|i| draft("invoice.get", AuditDecision::Allow, None, i))
        .collect();
    drafts.push(draft(
        "invoice.get",
        AuditDecision::Deny,
        Some("grant.purpose"),
        3,
    ));
    let seqs = e.store.append_audit(drafts).await.unwrap();
    let next = scrape(&mut h).await;
    assert_eq!(value(&next, allowed), Some(before + 3.0));
    assert_eq!(
        value(&next, "toolgate_audit_records_total"),
        Some(report.records as f64 + 4.0)
    );
    assert_eq!(
        value(&next, "toolgate_refusals_total{rule=\"grant.purpose\"}"),
        Some(report.refusals.get("grant.purpose").copied().unwrap_or(0) as f64 + 1.0)
    );
    assert_eq!(
        value(&next, "toolgate_governance_latency_seconds_count"),
        Some(governed + 4.0)
    );
    assert_eq!(
        value(
            &next,
            "toolgate_governance_latency_seconds_bucket{le=\"0.0025\"}"
        )
        .unwrap()
            - value(
                &page,
                "toolgate_governance_latency_seconds_bucket{le=\"0.0025\"}"
            )
            .unwrap(),
        4.0,
        "1.5 ms falls in the 2.5 ms bucket"
    );
    let tally = state.metrics().tally().await;
    assert_eq!(tally.last_seq, *seqs.last().unwrap());

    // Nothing new: the same figures again.
    assert_eq!(scrape(&mut h).await, next);
}

#[tokio::test]
async fn an_agent_typed_tool_name_is_counted_as_unknown_and_the_page_stays_small() {
    let e = env().await;
    e.history().await;
    let state = e.console_scraped("");
    let mut h = Http::new(metrics_router(state.clone()));
    let baseline = scrape(&mut h).await;

    let long = "x".repeat(100_000);
    let weird_rule = format!("policy.{}", "y".repeat(100_000));
    let mut drafts = vec![
        draft(&long, AuditDecision::Deny, Some("tool.unknown"), 1),
        draft(
            "invoice.get\n# TYPE evil counter",
            AuditDecision::Deny,
            Some("tool.unknown"),
            2,
        ),
        draft("invoice.get", AuditDecision::Deny, Some(&weird_rule), 3),
    ];
    // Many tools an agent made up: one series, however many.
    drafts.extend((0..200).map(|i| {
        draft(
            &format!("made.up.{i}"),
            AuditDecision::Deny,
            Some("tool.unknown"),
            10 + i,
        )
    }));
    e.store.append_audit(drafts).await.unwrap();
    let page = scrape(&mut h).await;
    assert_eq!(
        value(
            &page,
            "toolgate_calls_total{tool=\"unknown\",decision=\"deny\"}"
        ),
        Some(202.0),
        "{page}"
    );
    assert_eq!(
        value(&page, "toolgate_refusals_total{rule=\"other\"}"),
        Some(1.0)
    );
    assert!(!page.contains("xxxxxxxx") && !page.contains("yyyyyyyy"));
    assert!(!page.contains("made.up") && !page.contains("evil"));
    assert!(
        page.len() < baseline.len() + 1024,
        "the page grew from {} to {} bytes",
        baseline.len(),
        page.len()
    );
}

#[test]
fn the_scrape_token_comes_from_a_file_or_the_environment_never_the_yaml() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("secrets")).unwrap();
    std::fs::write(
        dir.path().join("secrets/metrics-token"),
        format!("  {SCRAPE_TOKEN}\n"),
    )
    .unwrap();
    let yaml = "metrics:\n  token_file: secrets/metrics-token\n  allow_remote: true\n";
    let cfg: GatewayFile = toolgate_core::registry::parse_yaml("toolgate.yaml", yaml).unwrap();
    assert_eq!(
        cfg.metrics.token_file.as_deref(),
        Some("secrets/metrics-token")
    );
    assert!(cfg.metrics.allow_remote);
    let opts = toolgate_console::MetricsOptions::from_config(&cfg.metrics, dir.path());
    assert!(opts.token.is_some() && opts.allow_remote);

    // The token itself is not a field of the file.
    let inline = "metrics:\n  token: scrape-token-for-the-tests-0001\n";
    assert!(toolgate_core::registry::parse_yaml::<GatewayFile>("toolgate.yaml", inline).is_err());

    // Too short, or a file that is not there: an error naming what to do; /metrics stays closed.
    std::fs::write(dir.path().join("short"), "abc\n").unwrap();
    let short = MetricsConfig {
        token_file: Some("short".into()),
        ..MetricsConfig::default()
    };
    let err = toolgate_console::ScrapeToken::from_config(&short, dir.path()).unwrap_err();
    assert!(err.to_string().contains("at least 16"), "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept"
    );
    assert!(
        toolgate_console::MetricsOptions::from_config(&short, dir.path())
            .token
            .is_none()
    );
    let missing = MetricsConfig {
        token_file: Some("nowhere".into()),
        ..MetricsConfig::default()
    };
    let err = toolgate_console::ScrapeToken::from_config(&missing, dir.path()).unwrap_err();
    assert!(err.to_string().contains("nowhere"), "{err}");
    let io = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<std::io::Error>());
    assert_eq!(
        io.map(std::io::Error::kind),
        Some(std::io::ErrorKind::NotFound),
        "the operating system's error is kept as the source"
    );

    // An environment variable that is not set: no token (and no error).
    let unset = MetricsConfig {
        token_env: "TOOLGATE_TEST_METRICS_TOKEN_NEVER_SET_7F3A".into(),
        ..MetricsConfig::default()
    };
    assert!(
        toolgate_console::ScrapeToken::from_config(&unset, dir.path())
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_scraper_asking_faster_than_the_interval_waits_for_the_next_page() {
    let e = env().await;
    let interval = std::time::Duration::from_millis(150);
    let state = e.console_with("", |o| {
        o.metrics.token = Some(toolgate_console::ScrapeToken::new(SCRAPE_TOKEN).unwrap());
        o.metrics.min_interval = interval;
    });
    let mut h = Http::new(metrics_router(state));
    // The pacing clock starts when the first page starts rendering, so the three pages are
    // timed from before the first request: the third cannot start before two intervals.
    let t = std::time::Instant::now();
    scrape(&mut h).await;
    scrape(&mut h).await;
    scrape(&mut h).await;
    assert!(
        t.elapsed() >= 2 * interval,
        "three pages came within {:?}",
        t.elapsed()
    );
}

/// The gate figures `/metrics` reports are the report's own: on the two-person tool, a model
/// reviewer's closure, a person's rejection, a request consumed 3 ms after it was raised by
/// nobody's approval, one approved and run, one approved and waiting, and one approved by both
/// people that expired unused. r is 1 / 3 (one person's rejection, two approvals), not 2 / 5.
#[tokio::test]
async fn metrics_count_gates_as_the_report_does_reviewers_and_auto_consumed_apart() {
    let e = env().await;
    let now = e.clock_now().millis();
    let (min, h) = (60_000, 3_600_000);
    let rows: &[RawRequest] = &[
        ("r1", "rejected", &[], None),
        ("r2", "rejected", &[], Some("bob")),
        ("r3", "consumed", &[], None),
        (
            "r4",
            "consumed",
            &[("alice", 10 * min), ("bob", 11 * min)],
            None,
        ),
        (
            "r5",
            "approved",
            &[("alice", 12 * min), ("bob", 13 * min)],
            None,
        ),
        (
            "r6",
            "expired",
            &[("alice", 14 * min), ("bob", 15 * min)],
            None,
        ),
    ];
    let start = now - 5 * h;
    insert_raw_requests(&e, rows, start, min, now + h, start + 3 * h).await;
    let report = toolgate_console::report::gather(&e.store, &e.exec.registry, None, e.clock_now())
        .await
        .unwrap();
    let g = report
        .gates
        .iter()
        .find(|g| g.tool == "payment.urgent")
        .unwrap();
    let mut hh = Http::new(metrics_router(e.console_scraped("")));
    let page = scrape(&mut hh).await;
    let gate = "tool=\"payment.urgent\",rule=\"gate.always\"";
    for (status, n) in [
        ("approved", g.approved),
        ("rejected", g.rejected),
        ("reviewer_closed", g.reviewer_closed),
        ("closed_without_people", g.closed_without_people),
        ("expired", g.expired),
        ("open", g.open),
    ] {
        let series = format!("toolgate_gate_requests_total{{{gate},status=\"{status}\"}}");
        assert_eq!(value(&page, &series), Some(n as f64), "{series}\n{page}");
    }
    assert_eq!(
        (
            g.approved,
            g.rejected,
            g.reviewer_closed,
            g.closed_without_people
        ),
        (2, 1, 1, 1)
    );
    assert_eq!(
        value(
            &page,
            &format!("toolgate_gate_approved_not_run_total{{{gate}}}")
        ),
        Some(g.approved_not_run as f64)
    );
    assert_eq!(g.approved_not_run, 1);
    // Printed to six digits: one person's rejection in three people's decisions, not 2 / 5.
    let r = value(&page, &format!("toolgate_gate_rejection_rate{{{gate}}}")).unwrap();
    assert!((r - 1.0 / 3.0).abs() < 1e-6, "{r}");
    for (who, decision, n) in [
        ("alice", "approved", 3.0),
        ("bob", "approved", 3.0),
        ("bob", "rejected", 1.0),
        ("alice", "rejected", 0.0),
    ] {
        let series = format!(
            "toolgate_approver_decisions_total{{approver=\"{who}\",decision=\"{decision}\"}}"
        );
        assert_eq!(value(&page, &series), Some(n), "{series}\n{page}");
    }
}

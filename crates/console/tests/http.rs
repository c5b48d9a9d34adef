//! The page over HTTP, in process: sign-in, sessions and CSRF, and the refusals that must leave
//! nothing run: an approval posted twice, after expiry, for inputs that changed after they were
//! shown, or without (or with a wrong) CSRF token. Each asserts the fake ERP's call count and
//! the step's status, not only the page.

use crate::common::*;
use axum::http::StatusCode;
use toolgate_core::{ApprovalId, InputHash, StepStatus};
use toolgate_store::ApprovalStatus;

async fn signed_in(e: &Env, key: &str) -> Http {
    let mut h = Http::new(toolgate_console::router(e.console("")));
    let r = h.sign_in(key).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    h
}

/// Opens the item page and returns (csrf, shown input hash, page).
async fn open(h: &mut Http, approval: &str) -> (String, String, String) {
    let page = h.get(&format!("/item/{approval}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let csrf = hidden(&page.body, "csrf").expect("csrf on the item page");
    let hash = hidden(&page.body, "input_hash").unwrap_or_default();
    (csrf, hash, page.body)
}

#[tokio::test]
async fn signing_in_needs_a_human_approver_key_and_sets_a_strict_cookie() {
    let e = env().await;
    let mut h = Http::new(toolgate_console::router(e.console("")));
    let r = h.get("/").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location.as_deref(), Some("/login"));

    for bad in [CAROL_KEY, WORKER_KEY, "not-a-key"] {
        let r = h.sign_in(bad).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{bad}");
        assert!(!h.jar.contains_key("toolgate_session"));
    }
    // The sign-in form itself needs its double-submit token.
    let r = h.post("/login", &[("api_key", ALICE_KEY)]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    let r = h.sign_in(ALICE_KEY).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let cookie = r
        .set_cookies
        .iter()
        .find(|c| c.starts_with("toolgate_session="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Secure"] {
        assert!(cookie.contains(flag), "{cookie} lacks {flag}");
    }
    let q = h.get("/").await;
    assert_eq!(q.status, StatusCode::OK);
    assert!(q.body.contains("Signed in as"), "{}", q.body);
}

#[tokio::test]
async fn approving_runs_the_step_once_and_a_second_post_is_refused() {
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let queue = h.get("/").await.body;
    assert!(
        queue.contains("new iban</span>"),
        "the queue does not flag the new IBAN"
    );
    let (csrf, hash, page) = open(&mut h, &p.approval).await;
    assert!(
        page.contains("destination-alert"),
        "the new IBAN is not flagged"
    );
    assert_eq!(
        hash,
        e.store
            .approval(&p.approval)
            .await
            .unwrap()
            .input_hash
            .as_str()
    );

    let path = format!("/item/{}/approve", p.approval);
    let r = h
        .post(&path, &[("csrf", &csrf), ("input_hash", &hash)])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("The step ran once: status done"),
        "{}",
        r.body
    );
    assert_eq!(e.rec.count_step(&p.step), 1);
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::Done
    );

    let again = h
        .post(&path, &[("csrf", &csrf), ("input_hash", &hash)])
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert_eq!(
        e.rec.count_step(&p.step),
        1,
        "a second approval ran the step again"
    );
    assert_eq!(
        e.store.approval(&p.approval).await.unwrap().status,
        ApprovalStatus::Consumed
    );
}

#[tokio::test]
async fn an_approval_after_expiry_is_refused_and_nothing_runs() {
    let e = env().await;
    let p = e.new_iban_payment().await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let (csrf, hash, _) = open(&mut h, &p.approval).await;
    e.clock.advance_hours(73);

    let page = h.get(&format!("/item/{}", p.approval)).await;
    assert!(
        page.body.contains("data-status=\"expired\""),
        "{}",
        page.body
    );
    assert!(
        !page.body.contains("id=\"approve\""),
        "an expired item offers Approve"
    );

    let r = h
        .post(
            &format!("/item/{}/approve", p.approval),
            &[("csrf", &csrf), ("input_hash", &hash)],
        )
        .await;
    assert_eq!(r.status, StatusCode::GONE, "{}", r.body);
    assert_eq!(e.rec.count("payment.schedule"), 0);
    let req = e.store.approval(&p.approval).await.unwrap();
    assert_eq!(req.status, ApprovalStatus::Expired);
    assert!(req.approved_by.is_empty());
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::NeedsApproval
    );
}

#[tokio::test]
async fn an_approval_for_inputs_that_changed_after_they_were_shown_is_refused() {
    let e = env().await;
    let p = e.new_iban_payment().await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let (csrf, hash, _) = open(&mut h, &p.approval).await;

    // The plan is revised while the page is open: one cent more.
    let revised = payment("SUP-0001", "INV-20260612", 12600.51, NEW_IBAN);
    let canon = toolgate_core::canonical(&revised).replace('\'', "''");
    e.store
        .execute_raw(&format!(
            "UPDATE steps SET inputs = '{canon}', input_hash = '{}' WHERE step_id = '{}'",
            InputHash::of(&revised),
            p.step
        ))
        .await
        .unwrap();

    let r = h
        .post(
            &format!("/item/{}/approve", p.approval),
            &[("csrf", &csrf), ("input_hash", &hash)],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.body.contains("inputs changed"), "{}", r.body);
    assert_eq!(e.rec.count("payment.schedule"), 0);
    assert!(
        e.store
            .approval(&p.approval)
            .await
            .unwrap()
            .approved_by
            .is_empty()
    );
    // And a form carrying a hash other than the request's is refused the same way.
    let other = InputHash::of(&revised).to_string();
    let r = h
        .post(
            &format!("/item/{}/approve", p.approval),
            &[("csrf", &csrf), ("input_hash", &other)],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(e.rec.count("payment.schedule"), 0);
}

#[tokio::test]
async fn state_changes_without_the_csrf_token_are_refused() {
    let e = env().await;
    let p = e.new_iban_payment().await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let (_, hash, _) = open(&mut h, &p.approval).await;
    let approve = format!("/item/{}/approve", p.approval);
    let reject = format!("/item/{}/reject", p.approval);

    let r = h.post(&approve, &[("input_hash", &hash)]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = h
        .post(&approve, &[("csrf", "0000"), ("input_hash", &hash)])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = h.post(&reject, &[("reason", "looks wrong")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Every form that changes something checks the token: approving together, a run's steps,
    // signing out.
    let r = h
        .post("/bulk", &[("set", &p.approval), ("confirm", "1")])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = h
        .post("/run/approve", &[("csrf", "0000"), ("set", &p.approval)])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = h.post("/logout", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let (still, _, _) = open(&mut h, &p.approval).await;
    assert!(!still.is_empty(), "a refused sign-out leaves the session");

    assert_eq!(e.rec.count("payment.schedule"), 0);
    let req = e.store.approval(&p.approval).await.unwrap();
    assert_eq!(req.status, ApprovalStatus::Pending);
    assert!(req.approved_by.is_empty());
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::NeedsApproval
    );

    // Without a session at all, a POST goes to sign-in and changes nothing.
    let mut anon = Http::new(toolgate_console::router(e.console("")));
    let r = anon.post(&approve, &[("input_hash", &hash)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(e.rec.count("payment.schedule"), 0);
}

#[tokio::test]
async fn a_rejection_needs_a_reason_and_refuses_the_step() {
    let e = env().await;
    let p = e.new_iban_payment().await;
    let mut h = signed_in(&e, BOB_KEY).await;
    let (csrf, _, _) = open(&mut h, &p.approval).await;
    let reject = format!("/item/{}/reject", p.approval);

    let r = h.post(&reject, &[("csrf", &csrf), ("reason", "  ")]).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::NeedsApproval
    );

    let r = h
        .post(
            &reject,
            &[("csrf", &csrf), ("reason", "IBAN not in the vendor master")],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let s = e.store.step(&p.step).await.unwrap();
    assert_eq!(s.status, StepStatus::Refused);
    assert!(
        s.outcome
            .unwrap()
            .error
            .unwrap()
            .contains("IBAN not in the vendor master"),
        "the reason is not recorded"
    );
    assert_eq!(e.rec.count("payment.schedule"), 0);
}

#[tokio::test]
async fn a_two_person_tool_needs_two_different_approvers_and_names_the_first() {
    let e = env().await;
    let p = park(
        &e,
        vec![step(
            "payment.urgent",
            serde_json::json!({"supplier_id": "SUP-0001", "invoice_id": "INV-20260613", "amount": 900.0}),
            &[],
        )],
    )
    .await;
    let mut a = signed_in(&e, ALICE_KEY).await;
    let (csrf, hash, _) = open(&mut a, &p.approval).await;
    let approve = format!("/item/{}/approve", p.approval);
    let r = a
        .post(&approve, &[("csrf", &csrf), ("input_hash", &hash)])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("approved first by alice"), "{}", r.body);
    assert_eq!(e.rec.count("payment.urgent"), 0);

    // Alice again: refused, still nothing runs.
    let r = a
        .post(&approve, &[("csrf", &csrf), ("input_hash", &hash)])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(e.rec.count("payment.urgent"), 0);

    let mut b = signed_in(&e, BOB_KEY).await;
    let (csrf_b, hash_b, page) = open(&mut b, &p.approval).await;
    assert!(
        page.contains("id=\"first-approver\">alice<"),
        "the page does not say who approved first"
    );
    let r = b
        .post(&approve, &[("csrf", &csrf_b), ("input_hash", &hash_b)])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("The step ran once"), "{}", r.body);
    assert_eq!(e.rec.count("payment.urgent"), 1);
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::Done
    );
}

#[tokio::test]
async fn the_queue_puts_larger_spend_first_groups_like_calls_and_filters() {
    let e = env().await;
    // Both suppliers were paid to OLD_IBAN before (an account paid for the first time is a
    // new destination, and outranks these).
    e.history().await;
    let known = park(
        &e,
        vec![step(
            "payment.schedule",
            payment("SUP-0002", "INV-20260502", 300.0, OLD_IBAN),
            &[],
        )],
    )
    .await;
    let hash = e.store.approval(&known.approval).await.unwrap().input_hash;
    toolgate_console::actions::approve(&e.exec, &known.approval, "bob", hash.as_str(), true)
        .await
        .unwrap();
    let small = park(
        &e,
        vec![step(
            "payment.schedule",
            payment("SUP-0002", "INV-20260620", 120.0, OLD_IBAN),
            &[],
        )],
    )
    .await;
    e.clock.advance_hours(1);
    let large = park(
        &e,
        vec![step(
            "payment.schedule",
            payment("SUP-0001", "INV-20260621", 9000.0, OLD_IBAN),
            &[],
        )],
    )
    .await;
    let urgent = park(
        &e,
        vec![step(
            "payment.urgent",
            serde_json::json!({"supplier_id": "SUP-0003", "invoice_id": "INV-20260622", "amount": 50.0}),
            &[],
        )],
    )
    .await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let q = h.get("/").await.body;
    let pos = |id: &str| {
        q.find(&format!("/item/{id}"))
            .unwrap_or_else(|| panic!("{id} missing"))
    };
    assert!(
        pos(&large.approval) < pos(&small.approval),
        "larger amount not first"
    );
    // The two-person payment weighs more than either (the people its rule asks for), so its
    // group comes first; the groups keep the order of their riskiest item.
    assert!(
        pos(&urgent.approval) < pos(&large.approval),
        "groups out of order"
    );
    assert_eq!(q.matches("<section class=\"group\">").count(), 2);
    // Within the payment.schedule group, supplier, invoice and amount differ; currency does not.
    assert!(q.contains("class=\"diff\"><code>SUP-0001"), "{q}");
    assert!(!q.contains("class=\"diff\"><code>EUR"));

    let f = h.get(&format!("/?run={}", small.run)).await.body;
    assert!(f.contains(small.approval.as_str()) && !f.contains(large.approval.as_str()));
    let f = h.get("/?tool=payment.urgent").await.body;
    assert!(f.contains(urgent.approval.as_str()) && !f.contains(small.approval.as_str()));
}

#[tokio::test]
async fn the_item_shows_reason_rule_evidence_earlier_steps_and_redaction() {
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let (_, _, page) = open(&mut h, &p.approval).await;
    assert!(
        page.contains("Three-way match complete against PO-77840"),
        "reason"
    );
    assert!(
        page.contains("href=\"/evidence/PO-77840\""),
        "evidence link"
    );
    assert!(page.contains("id=\"earlier\""), "earlier steps");
    assert!(page.contains("invoice.get"));
    assert!(page.contains("redacted in the audit log"));
    assert!(
        page.contains("<code class=\"value\">12600.5</code>"),
        "exact amount"
    );
    let rule = e.store.approval(&p.approval).await.unwrap().rule;
    assert!(page.contains(&format!("id=\"rule\">{rule}<")));
    assert!(
        !page.contains("id=\"reviews\""),
        "no reviewer has checked it yet"
    );

    // A model reviewer's check of the step is shown to the person, as a check, not a vote.
    e.store
        .review_step(
            &e.exec.registry,
            &p.step,
            &toolgate_core::PrincipalId::from("fin-reviewer"),
            toolgate_store::ReviewVerdict::Approved,
            "The IBAN change is backed by the supplier's signed letter.",
            e.clock_now(),
        )
        .await
        .unwrap();
    let (_, _, page) = open(&mut h, &p.approval).await;
    assert!(page.contains("id=\"reviews\""), "reviewer checks");
    assert!(page.contains("<tr class=\"review-approved\"><td>fin-reviewer</td>"));
    assert!(
        page.contains("backed by the supplier&#39;s signed letter")
            || page.contains("backed by the supplier's signed letter")
    );
    assert!(page.contains("It approves nothing"));
    assert!(page.contains("0 of "), "still no person's approval");

    let ev = h.get("/evidence/PO-77840").await;
    assert_eq!(ev.status, StatusCode::OK);
    assert!(ev.body.contains("Cold-chain freight June"), "{}", ev.body);
    let missing = h.get("/evidence/PO-00000").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn metrics_and_report_pages_show_the_gate() {
    let e = env().await;
    e.history().await;
    let p = e.new_iban_payment().await;
    toolgate_console::actions::reject(&e.exec, &p.approval, "alice", "new IBAN")
        .await
        .unwrap();
    let state = e.console_scraped("");
    let mut m = Http::new(toolgate_console::metrics_router(state.clone()));
    let text = m.get_bearer("/metrics", SCRAPE_TOKEN).await.body;
    let rule = e.store.approval(&p.approval).await.unwrap().rule;
    assert!(
        text.contains(&format!(
            "toolgate_gate_rejection_rate{{tool=\"payment.schedule\",rule=\"{rule}\"}} 0.5"
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "toolgate_gate_break_even_ratio{{tool=\"payment.schedule\",rule=\"{rule}\"}} 2"
    )));
    let mut h = signed_in(&e, ALICE_KEY).await;
    let page = h.get("/report").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("<svg"), "no chart");
    assert!(page.body.contains("50.0 %"), "{}", page.body);
    assert!(page.body.contains("No shadow rule matched in this period."));

    // A shadow rule that matched an allowed call: the page says what enforcing it would change.
    let records = e.store.audit_records(None, None).await.unwrap();
    let allowed = records
        .iter()
        .rfind(|r| r.body.why.decision == toolgate_store::AuditDecision::Allow)
        .expect("the history has an allowed call");
    let mut shadowed = allowed.body.clone();
    shadowed.why.shadow = vec![toolgate_core::ShadowRule {
        rule: "shadow-reads-need-a-person".into(),
        would: toolgate_core::ShadowEffect::Gate,
    }];
    let seq = e.store.append_audit(vec![shadowed]).await.unwrap()[0];
    let page = h.get("/report").await.body;
    assert!(page.contains("id=\"shadow\""));
    assert!(
        page.contains(
            "<td><code>shadow-reads-need-a-person</code></td><td>gated</td><td>1</td><td>1</td>"
        ),
        "{page}"
    );
    assert!(page.contains(&format!("#{seq} <code>{}</code>", allowed.body.tool)));
}

/// A plan's two parked payments, approved together from the item page: each is bound to its
/// own hash, runs once, and a set that differs from the run's parked steps approves nothing.
#[tokio::test]
async fn a_runs_parked_steps_are_approved_together_each_running_once() {
    let e = env().await;
    let p = park(
        &e,
        vec![
            step(
                "payment.schedule",
                payment("SUP-0001", "INV-20260612", 12600.5, NEW_IBAN),
                &["INV-20260612", "PO-77840"],
            ),
            step(
                "payment.schedule",
                payment("SUP-0001", "INV-20260613", 980.0, NEW_IBAN),
                &["INV-20260613", "PO-77840"],
            ),
        ],
    )
    .await;
    let parked: Vec<_> = e
        .store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.run_id.as_deref() == Some(p.run.as_str()))
        .collect();
    assert_eq!(parked.len(), 2, "both payments park");

    // Someone who may not decide the run's steps is refused the run as one.
    let carol = toolgate_console::bulk::run_offer(&e.exec, "carol", &p.run)
        .await
        .unwrap()
        .unwrap();
    assert!(
        carol
            .refusal
            .as_deref()
            .is_some_and(|w| w.contains("not yours to decide")),
        "{carol:?}"
    );
    assert!(
        toolgate_console::bulk::approve_run(&e.exec, "carol", &p.run, &carol.set(), true)
            .await
            .is_err()
    );

    let mut h = signed_in(&e, ALICE_KEY).await;
    let (csrf, _, page) = open(&mut h, &p.approval).await;
    assert!(
        page.contains("id=\"run-approval\" data-count=\"2\""),
        "{page}"
    );
    assert!(page.contains("Approve all 2 steps of this run"), "{page}");
    let set = hidden(&page, "set").expect("the run's set on the page");
    let run = hidden(&page, "run").unwrap();
    assert_eq!(run, p.run);

    // One hash altered: the whole set is refused, nothing approved or run.
    let (first, rest) = set.split_once(',').unwrap();
    let tampered = format!("{}:sha256:00{rest}", first.split(':').next().unwrap());
    let r = h
        .post(
            "/run/approve",
            &[("csrf", &csrf), ("run", &run), ("set", &tampered)],
        )
        .await;
    assert_ne!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(e.rec.count("payment.schedule"), 0);
    for a in &parked {
        assert_eq!(
            e.store.approval(&a.approval_id).await.unwrap().status,
            ApprovalStatus::Pending
        );
    }

    let r = h
        .post(
            "/run/approve",
            &[("csrf", &csrf), ("run", &run), ("set", &set)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("Approved the run's 2 parked steps"),
        "{}",
        r.body
    );
    assert_eq!(e.rec.count("payment.schedule"), 2, "each step ran");
    for a in &parked {
        assert_eq!(e.rec.count_step(&a.subject), 1, "{} ran once", a.subject);
        assert_eq!(
            e.store.step(&a.subject_step()).await.unwrap().status,
            StepStatus::Done
        );
    }
    // The same form again approves nothing more.
    let again = h
        .post(
            "/run/approve",
            &[("csrf", &csrf), ("run", &run), ("set", &set)],
        )
        .await;
    assert_ne!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(e.rec.count("payment.schedule"), 2);
}

/// A run approved as one is all or nothing: two transfers that each fit the 10,000 EUR daily
/// window but not together. Each alone would pass (decided alone, dry); decided together, as if
/// approved and run in order, the last is refused by the window, so the run's panel says so
/// and a posted set approves neither (before, the first was approved and paid and the second
/// approved and then refused).
#[tokio::test]
async fn a_run_whose_last_step_would_be_refused_is_approved_not_at_all() {
    let e = env().await;
    let transfer = |invoice: &str, amount: f64| {
        step(
            "payment.transfer",
            serde_json::json!({"supplier_id": "SUP-0001", "invoice_id": invoice, "amount": amount}),
            &[],
        )
    };
    let p = park(
        &e,
        vec![
            transfer("INV-20260701", 6000.0),
            transfer("INV-20260702", 3000.0),
            transfer("INV-20260703", 6000.0),
        ],
    )
    .await;
    let parked: Vec<_> = e
        .store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.run_id.as_deref() == Some(p.run.as_str()))
        .collect();
    assert_eq!(parked.len(), 3, "all three transfers park");
    for r in &parked {
        assert!(
            e.exec.dry_decide(r).await.unwrap().refused_by().is_none(),
            "{} alone would run",
            r.approval_id
        );
    }

    let offer = toolgate_console::bulk::run_offer(&e.exec, "alice", &p.run)
        .await
        .unwrap()
        .unwrap();
    let why = offer.refusal.clone().expect("the run is refused as one");
    assert!(
        why.contains("parked step 3") && why.contains("transfer_value_24h"),
        "{why}"
    );

    // The page offers no "approve all" and says which step and why.
    let mut h = signed_in(&e, ALICE_KEY).await;
    let (csrf, _, page) = open(&mut h, &p.approval).await;
    assert!(page.contains("id=\"run-refusal\""), "{page}");
    assert!(!page.contains("id=\"run-approve\""), "{page}");

    // The set posted anyway (a page opened before, a forged form) approves nothing.
    let r = h
        .post(
            "/run/approve",
            &[("csrf", &csrf), ("run", &p.run), ("set", &offer.set())],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.body.contains("nothing was approved"), "{}", r.body);
    assert_eq!(e.rec.count("payment.transfer"), 0, "nothing ran");
    for a in &parked {
        let now = e.store.approval(&a.approval_id).await.unwrap();
        assert_eq!(now.status, ApprovalStatus::Pending);
        assert!(now.approved_by.is_empty(), "no grant was kept");
        assert_eq!(
            e.store.step(&a.subject_step()).await.unwrap().status,
            StepStatus::NeedsApproval
        );
    }

    // The dry run left no trace: the first transfer approved alone still runs, once.
    let first = &parked
        .iter()
        .find(|r| r.inputs["invoice_id"] == "INV-20260701")
        .unwrap();
    let done = toolgate_console::actions::approve(
        &e.exec,
        &first.approval_id,
        "alice",
        first.input_hash.as_str(),
        true,
    )
    .await
    .unwrap();
    assert!(
        matches!(&done, toolgate_console::actions::Approved::Ran(r) if r.status == StepStatus::Done),
        "{done:?}"
    );
    assert_eq!(e.rec.count("payment.transfer"), 1);
}

/// The store's grants for a set are one transaction: a request in the set that cannot be
/// approved (here one this person already approved) refuses the set, and none of the other
/// grants is kept.
#[tokio::test]
async fn approving_a_set_in_the_store_is_all_or_nothing() {
    let e = env().await;
    let p = park(
        &e,
        vec![
            step(
                "payment.urgent",
                serde_json::json!({"supplier_id": "SUP-0001", "invoice_id": "INV-20260801", "amount": 100.0}),
                &[],
            ),
            step(
                "payment.urgent",
                serde_json::json!({"supplier_id": "SUP-0001", "invoice_id": "INV-20260802", "amount": 200.0}),
                &[],
            ),
        ],
    )
    .await;
    let mut parked: Vec<_> = e
        .store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.run_id.as_deref() == Some(p.run.as_str()))
        .collect();
    parked.sort_by_key(|r| r.created_at);
    assert_eq!(parked.len(), 2);
    // Alice approves the second (two people are needed), then the set of both.
    e.store
        .approve(
            &e.exec.registry,
            &e.exec.keys,
            &parked[1].approval_id,
            &"alice".into(),
            e.clock_now(),
        )
        .await
        .unwrap();
    let ids: Vec<&ApprovalId> = parked.iter().map(|r| &r.approval_id).collect();
    let err = e
        .store
        .approve_all(
            &e.exec.registry,
            &e.exec.keys,
            &ids,
            &"alice".into(),
            e.clock_now(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, toolgate_store::StoreError::SameApprover { .. }),
        "{err}"
    );
    let first = e.store.approval(&parked[0].approval_id).await.unwrap();
    assert!(
        first.approved_by.is_empty(),
        "the first grant was rolled back"
    );
    // Bob's set is taken whole.
    e.store
        .approve_all(
            &e.exec.registry,
            &e.exec.keys,
            &ids,
            &"bob".into(),
            e.clock_now(),
        )
        .await
        .unwrap();
    assert_eq!(
        e.store
            .approval(&parked[1].approval_id)
            .await
            .unwrap()
            .status,
        ApprovalStatus::Approved
    );
    assert_eq!(
        e.store
            .approval(&parked[0].approval_id)
            .await
            .unwrap()
            .approved_by,
        vec!["bob".to_string()]
    );
}

/// Beside the account the decision facts show: how long it has been the supplier's, from the
/// approved calls the store keeps. SUP-0001's account was changed (two people approved the
/// change) two days ago: "changed 2 days ago", marked. SUP-0002 has been paid to its account
/// for five days with no change on record: "unchanged since" the first payment. An account no
/// approved call used says so.
#[tokio::test]
async fn the_account_in_the_decision_facts_says_since_when_it_is_the_suppliers() {
    let e = env().await;
    let t0 = e.clock_now();
    // Five days ago: a payment to SUP-0002's account, approved and run.
    let paid = park(
        &e,
        vec![step(
            "payment.schedule",
            payment("SUP-0002", "INV-20260501", 4180.0, OLD_IBAN),
            &[],
        )],
    )
    .await;
    let hash = e.store.approval(&paid.approval).await.unwrap().input_hash;
    toolgate_console::actions::approve(&e.exec, &paid.approval, "bob", hash.as_str(), true)
        .await
        .unwrap();
    e.clock.advance_hours(3 * 24);
    // Two days ago: SUP-0001's account changed to NEW_IBAN, approved by two people.
    let change = park(
        &e,
        vec![step(
            "supplier.update_iban",
            serde_json::json!({"supplier_id": "SUP-0001", "iban": NEW_IBAN}),
            &[],
        )],
    )
    .await;
    let hash = e.store.approval(&change.approval).await.unwrap().input_hash;
    for who in ["alice", "bob"] {
        toolgate_console::actions::approve(&e.exec, &change.approval, who, hash.as_str(), true)
            .await
            .unwrap();
    }
    assert_eq!(e.rec.count("supplier.update_iban"), 1);
    e.clock.advance_hours(2 * 24);

    let transfer = |supplier: &str, invoice: &str| {
        step(
            "payment.transfer",
            serde_json::json!({"supplier_id": supplier, "invoice_id": invoice, "amount": 600.0}),
            &[],
        )
    };
    let mut h = signed_in(&e, ALICE_KEY).await;
    let account = |iban: &str| {
        e.rec.answers.lock().unwrap().insert(
            "invoice.get".into(),
            serde_json::json!({"supplier_name": "Nordlicht", "iban": iban, "amount": 600.0}),
        );
    };

    account(NEW_IBAN);
    let p = park(&e, vec![transfer("SUP-0001", "INV-20260901")]).await;
    let (_, _, page) = open(&mut h, &p.approval).await;
    let row = fact_row(&page, "account");
    assert!(row.contains(NEW_IBAN), "{row}");
    assert!(
        row.contains("class=\"since recent\"") && row.contains("changed 2 days ago"),
        "{row}"
    );

    account(OLD_IBAN);
    let p = park(&e, vec![transfer("SUP-0002", "INV-20260902")]).await;
    let (_, _, page) = open(&mut h, &p.approval).await;
    let row = fact_row(&page, "account");
    let since = format!("unchanged since {}", toolgate_console::fmt::datetime(t0));
    assert!(row.contains(&since), "{row}");
    assert!(!row.contains("recent"), "{row}");

    account("FR7630006000011234567890189");
    let p = park(&e, vec![transfer("SUP-0003", "INV-20260903")]).await;
    let (_, _, page) = open(&mut h, &p.approval).await;
    assert!(
        fact_row(&page, "account").contains("no approved call on record used it"),
        "{page}"
    );
}

/// The `<tr id="fact-LABEL">` row of a page.
fn fact_row(page: &str, label: &str) -> String {
    let at = page
        .find(&format!("id=\"fact-{label}\""))
        .unwrap_or_else(|| panic!("no fact {label}: {page}"));
    let end = page[at..].find("</tr>").unwrap();
    page[at..at + end].to_string()
}

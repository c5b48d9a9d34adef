//! What a person is shown and what may be approved in bulk, judged for each viewer: a clerk
//! whose grants reach `internal` data only sees a confidential payment's account nowhere on
//! the page (not in the inputs, the facts, the reason, the evidence or the canonical form);
//! a group offered for bulk approval leaves out first-time payees, a mismatch with the looked-up
//! invoice, an account changed recently, amounts from the bulk limit, a step a reviewer rejected
//! and a two-person payment, each with its reason, and totals each currency apart.

use crate::common::*;
use axum::http::StatusCode;
use serde_json::json;
use toolgate_console::facts::Memo;

async fn signed_in(e: &Env, key: &str) -> Http {
    let mut h = Http::new(toolgate_console::router(e.console("")));
    let r = h.sign_in(key).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    h
}

fn answer(e: &Env, supplier: &str, iban: &str, amount: f64) {
    e.rec.answers.lock().unwrap().insert(
        "invoice.get".into(),
        json!({"supplier_name": "Nordlicht Verpackung GmbH", "supplier_id": supplier,
               "iban": iban, "amount": amount}),
    );
}

fn transfer(supplier: &str, invoice: &str, amount: f64) -> toolgate_store::PlannedStep {
    step(
        "payment.transfer",
        json!({"supplier_id": supplier, "invoice_id": invoice, "amount": amount}),
        &[],
    )
}

#[tokio::test]
async fn a_low_ceiling_approver_sees_no_masked_value_anywhere_on_the_page() {
    let e = env().await;
    e.history().await;
    // The agent writes the new account into its reason and its evidence too.
    let mut s = step(
        "payment.schedule",
        payment("SUP-0001", "INV-20260612", 12600.5, NEW_IBAN),
        &["INV-20260612", &format!("bank letter {NEW_IBAN}")],
    );
    s.reason = Some(format!("Pay to {NEW_IBAN} as the letter says"));
    let pay = park(&e, vec![s]).await;
    answer(&e, "SUP-0001", OLD_IBAN, 600.0);
    let xfer = park(&e, vec![transfer("SUP-0001", "INV-20260901", 600.0)]).await;

    // alice's grants reach confidential data: she reads both accounts in clear.
    let mut alice = signed_in(&e, ALICE_KEY).await;
    let page = alice.get(&format!("/item/{}", pay.approval)).await.body;
    assert!(page.contains(NEW_IBAN), "alice does not see the IBAN");
    let page = alice.get(&format!("/item/{}", xfer.approval)).await.body;
    assert!(
        page.contains(OLD_IBAN),
        "alice does not see the account fact"
    );

    // dave's reach only internal data: neither account is anywhere in his pages.
    let mut dave = signed_in(&e, DAVE_KEY).await;
    let r = dave.get(&format!("/item/{}", pay.approval)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(!r.body.contains(NEW_IBAN), "dave sees the IBAN: {}", r.body);
    assert!(!r.body.contains("ES912100"), "a part of the IBAN is shown");
    assert!(r.body.contains("••••1332"), "the masked tail is shown");
    assert!(
        r.body.contains("masked: above your sensitivity ceiling"),
        "{}",
        r.body
    );
    let r = dave.get(&format!("/item/{}", xfer.approval)).await;
    assert!(!r.body.contains(OLD_IBAN), "dave sees the account fact");
    assert!(r.body.contains("••••3000"), "{}", r.body);
    let q = dave.get("/").await;
    assert!(!q.body.contains(NEW_IBAN), "dave's queue shows the IBAN");
}

#[tokio::test]
async fn bulk_leaves_out_what_is_not_low_risk_and_says_why() {
    let e = env().await;
    answer(&e, "SUP-0001", OLD_IBAN, 4180.0);
    // Parked first: the day's transfer limit (10,000) could not hold it after the history.
    let large = park(&e, vec![transfer("SUP-0001", "INV-20260805", 10_000.0)]).await;
    // History: one transfer to SUP-0001, approved by bob and run.
    let first = park(&e, vec![transfer("SUP-0001", "INV-20260800", 4180.0)]).await;
    let hash = e.store.approval(&first.approval).await.unwrap().input_hash;
    toolgate_console::actions::approve(&e.exec, &first.approval, "bob", hash.as_str(), true)
        .await
        .unwrap();
    e.clock.advance_hours(1);

    let like_a = park(&e, vec![transfer("SUP-0001", "INV-20260801", 4180.0)]).await;
    let like_b = park(&e, vec![transfer("SUP-0001", "INV-20260802", 4180.0)]).await;
    let mismatch = park(&e, vec![transfer("SUP-0001", "INV-20260803", 4810.0)]).await;
    let new_payee = park(&e, vec![transfer("SUP-0009", "INV-20260804", 4180.0)]).await;
    // Like the two above in every way but one: a reviewer rejected it, which closes it ...
    let flagged = park(&e, vec![transfer("SUP-0001", "INV-20260806", 4180.0)]).await;
    e.store
        .review_step(
            &e.exec.registry,
            &flagged.step,
            &toolgate_core::PrincipalId::from("model-reviewer"),
            toolgate_store::ReviewVerdict::Rejected,
            "the invoice was disputed",
            e.clock_now(),
        )
        .await
        .unwrap();
    // ... and a small same-day payment that two people approve.
    let urgent = park(
        &e,
        vec![step(
            "payment.urgent",
            json!({"supplier_id": "SUP-0001", "invoice_id": "INV-20260807", "amount": 120.0}),
            &[],
        )],
    )
    .await;

    let all = e.store.approvals(None).await.unwrap();
    let group: Vec<_> = all
        .iter()
        .filter(|r| {
            ["payment.transfer", "payment.urgent"].contains(&r.tool.as_str())
                && r.approval_id != first.approval
        })
        .cloned()
        .collect();
    let (offer, out) =
        toolgate_console::bulk::offer(&e.exec, "alice", &group, &all, &mut Memo::default())
            .await
            .unwrap();
    let why = |id: &str| out.iter().find(|(x, _)| x == id).map(|(_, w)| *w);
    assert_eq!(why(&mismatch.approval), Some("facts mismatch"));
    assert_eq!(why(&new_payee.approval), Some("first-time payee"));
    assert_eq!(why(&large.approval), Some("amount above the bulk limit"));
    assert_eq!(why(&flagged.approval), Some("not open"));
    assert_eq!(why(&urgent.approval), Some("two-person"));
    let offer = offer.expect("the two like transfers are offered");
    let ids: Vec<&str> = offer.members.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?} {out:?}");
    assert!(ids.contains(&like_a.approval.as_str()) && ids.contains(&like_b.approval.as_str()));
    assert_eq!(offer.total_text(), "8,360.00");

    // The bulk form refuses a member that is kept out, whatever the form says.
    let set = format!(
        "{},{}:{}",
        offer.set(),
        mismatch.approval,
        e.store
            .approval(&mismatch.approval)
            .await
            .unwrap()
            .input_hash
    );
    let r = toolgate_console::bulk::approve(&e.exec, "alice", &set, "approve 3", false).await;
    let err = r.unwrap_err().to_string();
    assert!(
        err.contains("nothing was approved") && err.contains("facts mismatch"),
        "{err}"
    );
    for p in [&like_a, &like_b, &mismatch] {
        assert!(
            e.store
                .approval(&p.approval)
                .await
                .unwrap()
                .approved_by
                .is_empty()
        );
    }

    // An account changed two days ago: every transfer to it is decided one at a time.
    let change = park(
        &e,
        vec![step(
            "supplier.update_iban",
            json!({"supplier_id": "SUP-0001", "iban": NEW_IBAN}),
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
    e.clock.advance_hours(48);
    answer(&e, "SUP-0001", NEW_IBAN, 4180.0);
    let all = e.store.approvals(None).await.unwrap();
    let group: Vec<_> = all
        .iter()
        .filter(|r| [&like_a.approval, &like_b.approval].contains(&&r.approval_id))
        .cloned()
        .collect();
    let (offer, out) =
        toolgate_console::bulk::offer(&e.exec, "alice", &group, &all, &mut Memo::default())
            .await
            .unwrap();
    assert!(offer.is_none(), "{offer:?}");
    assert!(
        out.iter().all(|(_, w)| *w == "account changed recently"),
        "{out:?}"
    );
}

/// A text of several lines (a note, an e-mail's body) reads as lines on the item page, not as
/// one JSON string with `\n` escapes; what would act is still written out.
#[tokio::test]
async fn text_of_several_lines_reads_as_lines() {
    let e = env().await;
    let mut inputs = payment("SUP-0001", "INV-20260612", 12600.5, OLD_IBAN);
    inputs["reason"] = json!("Three-way match against PO-77840.\nSecond line\u{202e} here.");
    let p = park(&e, vec![step("payment.schedule", inputs, &[])]).await;
    let mut h = signed_in(&e, ALICE_KEY).await;
    let page = h.get(&format!("/item/{}", p.approval)).await.body;
    let at = page.find("id=\"field-reason\"").expect("the reason row");
    let row = &page[at..at + page[at..].find("</tr>").unwrap()];
    assert!(row.contains("<pre class=\"text-value value\">"), "{row}");
    assert!(
        row.contains("Three-way match against PO-77840.\nSecond line\\u{202e} here."),
        "{row}"
    );
    assert!(!row.contains('\u{202e}'), "{row}");
}

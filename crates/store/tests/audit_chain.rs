//! Tampering with the audit table as someone with write access to the database would (the
//! append-only triggers disabled first): each stored column of one row changed in turn, rows
//! deleted, the head moved back, a history rewritten. `verify_chain` names every edit of a
//! row; truncation and a consistent rewrite pass it, and only a signed checkpoint catches them.

use std::collections::BTreeMap;

use crate::common::*;
use toolgate_core::canon::sha256_tagged;
use toolgate_core::{StepStatus, Timestamp};
use toolgate_store::audit::{AuditOutcome, AuditWho, AuditWhy};
use toolgate_store::{
    Actor, AuditColumn, AuditDecision, AuditDraft, AuditRecord, ChainReport, CheckpointFault,
    CheckpointOutcome, CheckpointPublicKey, CheckpointRefusal, CheckpointSigner, LinkFault,
    SignedCheckpoint, Store, StoreConfig, StoreError, read_checkpoints,
};

both_backends!(
    every_stored_column_is_covered_by_verify,
    rows_selected_by_an_edited_column_are_refused,
    deleted_rows_with_the_head_left_are_caught_by_verify,
    a_head_moved_back_alone_is_caught_by_verify,
    truncation_is_caught_only_with_a_checkpoint,
    a_rewritten_history_is_caught_only_with_a_checkpoint,
    checkpoints_hold_across_appends_and_key_rotation,
    a_checkpoint_of_another_store_is_named_as_such,
    a_broken_or_empty_chain_is_not_signed,
    the_store_identity_never_changes,
);

/// Record `i` (from 1) is `ticket.read` of `T-i` by `worker` in `run-a`, step `step-i`.
fn draft(i: i64) -> AuditDraft {
    AuditDraft {
        ts: Timestamp::from_millis(1_780_000_000_000 + i),
        run_id: Some("run-a".into()),
        step_id: Some(format!("step-{i}").into()),
        who: AuditWho {
            principal: "worker".into(),
            role: "worker".into(),
            actor: Actor::default(),
        },
        tool: "ticket.read".into(),
        tool_version: Some("1.0.0".into()),
        effect: None,
        tier: None,
        inputs: serde_json::json!({"ticket_id": format!("T-{i}")}),
        redacted: vec![],
        idem_key: None,
        why: AuditWhy {
            purpose: Some("ops".into()),
            reason: None,
            evidence: vec![],
            decision: AuditDecision::Allow,
            rule: None,
            checks: vec![],
            shadow: vec![],
        },
        approval: None,
        outcome: AuditOutcome {
            status: StepStatus::Done,
            target_ref: None,
            latency_ms: Some(1),
            latency_us: None,
            governance_us: None,
            error: None,
        },
        registry_version: "v1".into(),
    }
}

async fn store_with(db: &TestDb, records: i64) -> Store {
    let store = db.store(StoreConfig::default()).await;
    append(&store, 1..=records).await;
    store
}

async fn append(store: &Store, seqs: std::ops::RangeInclusive<i64>) {
    let drafts = seqs.map(draft).collect();
    store.append_audit(drafts).await.expect("append");
}

/// What someone with the database's owner rights does first.
async fn disable_triggers(db: &TestDb, store: &Store) {
    let sql = match db.backend {
        Backend::Sqlite => "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;",
        Backend::Postgres => "ALTER TABLE audit DISABLE TRIGGER USER;",
    };
    store.execute_raw(sql).await.expect("disable the triggers");
}

async fn intact(store: &Store, records: i64) {
    let report = store.verify_chain().await.unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, records, "{report}");
}

fn broken(report: &ChainReport) -> (i64, LinkFault) {
    let link = report
        .broken
        .clone()
        .unwrap_or_else(|| panic!("tampering not detected: {report}"));
    (link.seq, link.fault)
}

fn signed(outcome: CheckpointOutcome) -> SignedCheckpoint {
    match outcome {
        CheckpointOutcome::Signed(cp) => cp,
        CheckpointOutcome::Refused(why) => panic!("checkpoint refused: {why}"),
    }
}

async fn every_stored_column_is_covered_by_verify(db: &TestDb) {
    let store = store_with(db, 6).await;
    intact(&store, 6).await;
    disable_triggers(db, &store).await;
    let column = |column, stored: &str, record: &str| LinkFault::Column {
        column,
        stored: stored.into(),
        record: record.into(),
    };
    let zeros = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let ts3 = 1_780_000_000_003i64;
    let records = store.audit_records(None, None).await.unwrap();
    // Record 3 as text, as it is or edited: the column may hold it plain as well as packed.
    let text3 = records[2].canonical();
    let set_record3 = |text: &str| {
        format!(
            "UPDATE audit SET record = '{}' WHERE seq = 3",
            text.replace('\'', "''")
        )
    };
    // (what is changed, tampering SQL, restoring SQL, the link named, the fault)
    let cases: Vec<(&str, String, String, i64, LinkFault)> = vec![
        (
            "ts",
            "UPDATE audit SET ts = ts + 1 WHERE seq = 3".into(),
            "UPDATE audit SET ts = ts - 1 WHERE seq = 3".into(),
            3,
            column(AuditColumn::Ts, &(ts3 + 1).to_string(), &ts3.to_string()),
        ),
        (
            "principal",
            "UPDATE audit SET principal = 'mallory' WHERE seq = 3".into(),
            "UPDATE audit SET principal = 'worker' WHERE seq = 3".into(),
            3,
            column(AuditColumn::Principal, "'mallory'", "'worker'"),
        ),
        (
            "run_id",
            "UPDATE audit SET run_id = 'run-b' WHERE seq = 3".into(),
            "UPDATE audit SET run_id = 'run-a' WHERE seq = 3".into(),
            3,
            column(AuditColumn::RunId, "'run-b'", "'run-a'"),
        ),
        (
            "run_id to null",
            "UPDATE audit SET run_id = NULL WHERE seq = 3".into(),
            "UPDATE audit SET run_id = 'run-a' WHERE seq = 3".into(),
            3,
            column(AuditColumn::RunId, "null", "'run-a'"),
        ),
        (
            "step_id",
            "UPDATE audit SET step_id = 'step-9' WHERE seq = 3".into(),
            "UPDATE audit SET step_id = 'step-3' WHERE seq = 3".into(),
            3,
            column(AuditColumn::StepId, "'step-9'", "'step-3'"),
        ),
        (
            "seq, moved out of its place",
            "UPDATE audit SET seq = 103 WHERE seq = 3".into(),
            "UPDATE audit SET seq = 3 WHERE seq = 103".into(),
            3,
            LinkFault::Missing {
                expected: 3,
                found: 4,
            },
        ),
        (
            "seq, swapped with the next row's",
            "UPDATE audit SET seq = -3 WHERE seq = 3; UPDATE audit SET seq = 3 WHERE seq = 4; \
             UPDATE audit SET seq = 4 WHERE seq = -3"
                .into(),
            "UPDATE audit SET seq = -4 WHERE seq = 4; UPDATE audit SET seq = 4 WHERE seq = 3; \
             UPDATE audit SET seq = 3 WHERE seq = -4"
                .into(),
            3,
            LinkFault::Renumbered {
                stored: 3,
                record: 4,
            },
        ),
        (
            "hash",
            format!("UPDATE audit SET hash = '{zeros}' WHERE seq = 3"),
            String::new(), // restored below from the record's own hash
            3,
            LinkFault::Hash {
                computed: String::new(), // filled below
                stored: zeros.into(),
            },
        ),
        (
            "record",
            set_record3(&text3.replace("\"T-3\"", "\"T-8\"")),
            set_record3(&text3),
            3,
            LinkFault::Hash {
                computed: String::new(), // the edited text's hash, filled below
                stored: String::new(),
            },
        ),
    ];
    let hash3 = sha256_tagged(text3.as_bytes());
    for (what, tamper, restore, seq, mut want) in cases {
        let restore = if restore.is_empty() {
            format!("UPDATE audit SET hash = '{hash3}' WHERE seq = 3")
        } else {
            restore
        };
        store.execute_raw(&tamper).await.unwrap();
        let report = store.verify_chain().await.unwrap();
        let (at, fault) = broken(&report);
        if let (
            LinkFault::Hash { computed, stored },
            LinkFault::Hash {
                computed: got_computed,
                stored: got_stored,
            },
        ) = (&mut want, &fault)
        {
            // The hash case knows what is stored; the record case what is computed.
            if stored.is_empty() {
                assert_eq!(got_stored, &hash3, "{what}: {report}");
                assert_ne!(got_computed, &hash3, "{what}: {report}");
                *stored = got_stored.clone();
            } else {
                assert_eq!(got_computed, &hash3, "{what}: {report}");
            }
            *computed = got_computed.clone();
        }
        assert_eq!((at, &fault), (seq, &want), "{what}: {report}");
        assert!(
            report.to_string().contains("BROKEN at record 3"),
            "{what}: {report}"
        );
        if let LinkFault::Column { column, .. } = &fault {
            assert!(
                report
                    .to_string()
                    .contains(&format!("its {column} column is")),
                "{what}: {report}"
            );
        }
        store.execute_raw(&restore).await.unwrap();
        intact(&store, 6).await;
    }
    // A packed record damaged in place (its frame cut short and re-prefixed) does not unpack:
    // named unreadable at its link, and readers of the record refuse it instead of guessing.
    store
        .execute_raw("UPDATE audit SET record = 'z1:' || substr(record, 4, 24) WHERE seq = 3")
        .await
        .unwrap();
    let report = store.verify_chain().await.unwrap();
    let (at, fault) = broken(&report);
    assert!(
        at == 3 && matches!(fault, LinkFault::Unreadable { .. }),
        "{report}"
    );
    let e = store.audit_records(None, None).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::UnreadableRecord { seq: 3, .. })
            && e.to_string().contains("audit record 3 cannot be read"),
        "{e}"
    );
    store.execute_raw(&set_record3(&text3)).await.unwrap();
    intact(&store, 6).await;
}

async fn rows_selected_by_an_edited_column_are_refused(db: &TestDb) {
    let store = store_with(db, 4).await;
    disable_triggers(db, &store).await;
    store
        .execute_raw("UPDATE audit SET principal = 'mallory', run_id = 'run-m' WHERE seq = 2")
        .await
        .unwrap();
    // A row moved into someone else's export is refused by the export itself...
    let mut out = Vec::new();
    let e = store
        .export_principal(&"mallory".into(), &mut out)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt(m) if m.contains("audit row 2 was selected by its principal column ('mallory')")
            && m.contains("toolgate log verify")),
        "{e}"
    );
    assert!(out.is_empty(), "nothing exported before the refusal");
    let e = store
        .audit_records(None, Some(&"run-m".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt(m) if m.contains("its run_id column ('run-m')")),
        "{e}"
    );
    // ...while the row missing from worker's export is found by the walk.
    let n = store
        .export_principal(&"worker".into(), &mut out)
        .await
        .unwrap();
    assert_eq!(n, 3, "the column selects the rows: see docs/audit-chain.md");
    let (at, fault) = broken(&store.verify_chain().await.unwrap());
    assert_eq!(at, 2);
    assert!(
        matches!(
            fault,
            LinkFault::Column {
                column: AuditColumn::Principal,
                ..
            }
        ),
        "{fault:?}"
    );
}

async fn deleted_rows_with_the_head_left_are_caught_by_verify(db: &TestDb) {
    let store = store_with(db, 8).await;
    disable_triggers(db, &store).await;
    assert_eq!(
        store
            .execute_raw("DELETE FROM audit WHERE seq > 6")
            .await
            .unwrap(),
        2
    );
    let report = store.verify_chain().await.unwrap();
    let (at, fault) = broken(&report);
    assert_eq!(at, 7, "the first record missing: {report}");
    assert!(
        matches!(
            fault,
            LinkFault::Head {
                head_seq: 8,
                last_seq: 6,
                ..
            }
        ),
        "{fault:?}"
    );
    assert!(
        report.to_string().contains("the chain head says record 8"),
        "{report}"
    );
}

async fn a_head_moved_back_alone_is_caught_by_verify(db: &TestDb) {
    let store = store_with(db, 8).await;
    store
        .execute_raw(
            "UPDATE audit_head SET seq = 5, hash = (SELECT hash FROM audit WHERE seq = 5) \
             WHERE id = 1",
        )
        .await
        .unwrap();
    let report = store.verify_chain().await.unwrap();
    let (at, fault) = broken(&report);
    assert_eq!(
        (at, fault),
        (
            6,
            LinkFault::PastHead {
                seq: 6,
                head_seq: 5
            }
        ),
        "{report}"
    );
    // The head's hash alone.
    store
        .execute_raw(
            "UPDATE audit_head SET seq = 8, hash = (SELECT hash FROM audit WHERE seq = 7) \
             WHERE id = 1",
        )
        .await
        .unwrap();
    let report = store.verify_chain().await.unwrap();
    let (at, fault) = broken(&report);
    assert_eq!(at, 8, "{report}");
    assert!(
        matches!(
            fault,
            LinkFault::Head {
                head_seq: 8,
                last_seq: 8,
                ..
            }
        ),
        "{fault:?}"
    );
}

async fn truncation_is_caught_only_with_a_checkpoint(db: &TestDb) {
    let store = store_with(db, 8).await;
    let signer = CheckpointSigner::generate().unwrap();
    let keys = [signer.public_key().clone()];
    let cp = signed(store.checkpoint(&signer, T0, None).await.unwrap());
    assert_eq!(cp.seq, 8);
    let report = store
        .verify_checkpoints(std::slice::from_ref(&cp), &keys)
        .await
        .unwrap();
    assert!(report.is_intact(), "{report:?}");

    // Delete the newest three records and move the head back to the new last one.
    disable_triggers(db, &store).await;
    store
        .execute_raw(
            "DELETE FROM audit WHERE seq > 5; \
             UPDATE audit_head SET seq = 5, hash = (SELECT hash FROM audit WHERE seq = 5) \
             WHERE id = 1;",
        )
        .await
        .unwrap();
    // Without the checkpoint nothing shows...
    intact(&store, 5).await;
    // ...with it, the truncation does.
    let report = store
        .verify_checkpoints(std::slice::from_ref(&cp), &keys)
        .await
        .unwrap();
    assert!(report.chain.is_intact());
    assert!(!report.is_intact());
    assert_eq!(
        report.checks[0].fault,
        Some(CheckpointFault::Truncated {
            seq: 8,
            last_seq: 5
        })
    );
    assert!(
        report.checks[0]
            .fault
            .as_ref()
            .unwrap()
            .to_string()
            .contains("records after 5 were removed")
    );
    // And the checkpointer will not sign the shorter chain.
    match store.checkpoint(&signer, T0, Some(&cp)).await.unwrap() {
        CheckpointOutcome::Refused(CheckpointRefusal::Since { fault, .. }) => assert_eq!(
            fault,
            CheckpointFault::Truncated {
                seq: 8,
                last_seq: 5
            }
        ),
        other => panic!("signed a truncated chain: {other:?}"),
    }
}

/// Replaces records `from..` with edited ones, each linked to the one before and hashed, and
/// moves the head: a history as consistent as the real one.
async fn rewrite_from(store: &Store, from: i64) {
    let records = store.audit_records(None, None).await.unwrap();
    let mut prev = sha256_tagged(records[(from - 2) as usize].canonical().as_bytes());
    let mut sql = String::new();
    for mut rec in records.into_iter().filter(|r| r.seq >= from) {
        rec.body.inputs = serde_json::json!({"ticket_id": format!("T-{}-forged", rec.seq)});
        rec.prev = prev;
        let text = rec.canonical();
        let hash = sha256_tagged(text.as_bytes());
        sql.push_str(&format!(
            "UPDATE audit SET record = '{}', hash = '{hash}' WHERE seq = {};\n",
            text.replace('\'', "''"),
            rec.seq
        ));
        prev = hash;
    }
    sql.push_str(&format!(
        "UPDATE audit_head SET hash = '{prev}' WHERE id = 1;"
    ));
    store.execute_raw(&sql).await.unwrap();
}

async fn a_rewritten_history_is_caught_only_with_a_checkpoint(db: &TestDb) {
    let store = store_with(db, 8).await;
    let signer = CheckpointSigner::generate().unwrap();
    let keys = [signer.public_key().clone()];
    let cp = signed(store.checkpoint(&signer, T0, None).await.unwrap());
    disable_triggers(db, &store).await;
    rewrite_from(&store, 4).await;
    let forged: Vec<AuditRecord> = store.audit_records(None, None).await.unwrap();
    assert_eq!(forged[5].body.inputs["ticket_id"], "T-6-forged");
    // Without the checkpoint nothing shows...
    intact(&store, 8).await;
    // ...with it, the rewrite does.
    let report = store
        .verify_checkpoints(std::slice::from_ref(&cp), &keys)
        .await
        .unwrap();
    assert!(report.chain.is_intact());
    match &report.checks[0].fault {
        Some(CheckpointFault::Rewritten {
            seq,
            stored,
            signed,
        }) => {
            assert_eq!(*seq, 8);
            assert_eq!(signed, &cp.hash);
            assert_ne!(stored, &cp.hash);
        }
        other => panic!("rewrite not detected: {other:?}"),
    }
    match store.checkpoint(&signer, T0, Some(&cp)).await.unwrap() {
        CheckpointOutcome::Refused(CheckpointRefusal::Since {
            fault: CheckpointFault::Rewritten { seq: 8, .. },
            ..
        }) => {}
        other => panic!("signed a rewritten chain: {other:?}"),
    }
}

async fn checkpoints_hold_across_appends_and_key_rotation(db: &TestDb) {
    let store = store_with(db, 3).await;
    let (old, new) = (
        CheckpointSigner::generate().unwrap(),
        CheckpointSigner::generate().unwrap(),
    );
    assert_ne!(old.public_key().id(), new.public_key().id());
    let first = signed(store.checkpoint(&old, T0, None).await.unwrap());
    append(&store, 4..=6).await;
    // The next key signs on from the last checkpoint (the records after it are walked).
    let second = signed(
        store
            .checkpoint(&new, T0.plus_hours(1), Some(&first))
            .await
            .unwrap(),
    );
    assert_eq!((first.seq, second.seq), (3, 6));
    assert_eq!(second.key_id, *new.public_key().id());
    assert_eq!(second.signed_at, "2026-05-28T21:26:40.000Z");
    append(&store, 7..=7).await;

    // A file of both, as `log checkpoint --out` appends them.
    let file = format!("{}\n{}\n", first.to_line(), second.to_line());
    let both = read_checkpoints(&file, "checkpoints.jsonl").unwrap();
    assert_eq!(both, vec![first.clone(), second.clone()]);
    let keyring: Vec<CheckpointPublicKey> =
        vec![old.public_key().clone(), new.public_key().clone()];
    let report = store.verify_checkpoints(&both, &keyring).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.chain.records, 7, "the chain goes on past them");

    // Without the old key the old checkpoint cannot be judged: an error naming the key.
    let e = store
        .verify_checkpoints(&both, &keyring[1..])
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::CheckpointKeyUnknown { seq: 3, key_id, .. } if key_id == old.public_key().id().as_str()),
        "{e}"
    );
    assert!(e.to_string().contains("give its public key too"), "{e}");

    // A checkpoint edited after signing (a later record claimed) fails its signature.
    let mut edited = second.clone();
    edited.seq = 7;
    edited.hash = sha256_tagged(
        store.audit_records(None, None).await.unwrap()[6]
            .canonical()
            .as_bytes(),
    );
    let report = store.verify_checkpoints(&[edited], &keyring).await.unwrap();
    assert_eq!(
        report.checks[0].fault,
        Some(CheckpointFault::BadSignature {
            key_id: new.public_key().id().clone()
        })
    );
    // So does one signed by another key that claims the id of a trusted one.
    let mut impostor = signed(
        store
            .checkpoint(&CheckpointSigner::generate().unwrap(), T0, None)
            .await
            .unwrap(),
    );
    impostor.key_id = new.public_key().id().clone();
    let report = store
        .verify_checkpoints(&[impostor], &keyring)
        .await
        .unwrap();
    assert!(
        matches!(
            report.checks[0].fault,
            Some(CheckpointFault::BadSignature { .. })
        ),
        "{report:?}"
    );
}

async fn a_checkpoint_of_another_store_is_named_as_such(db: &TestDb) {
    let store = store_with(db, 2).await;
    let Some(other_db) = TestDb::new(db.backend).await else {
        return;
    };
    let other = store_with(&other_db, 2).await;
    assert_ne!(
        store.store_id().await.unwrap(),
        other.store_id().await.unwrap()
    );
    let signer = CheckpointSigner::generate().unwrap();
    let theirs = signed(other.checkpoint(&signer, T0, None).await.unwrap());
    let report = store
        .verify_checkpoints(
            std::slice::from_ref(&theirs),
            &[signer.public_key().clone()],
        )
        .await
        .unwrap();
    assert_eq!(
        report.checks[0].fault,
        Some(CheckpointFault::OtherStore {
            checkpoint: other.store_id().await.unwrap(),
            this: store.store_id().await.unwrap(),
        })
    );
    match store.checkpoint(&signer, T0, Some(&theirs)).await.unwrap() {
        CheckpointOutcome::Refused(CheckpointRefusal::Since {
            fault: CheckpointFault::OtherStore { .. },
            ..
        }) => {}
        other => panic!("signed on from another store's checkpoint: {other:?}"),
    }
}

async fn a_broken_or_empty_chain_is_not_signed(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let signer = CheckpointSigner::generate().unwrap();
    assert_eq!(
        store.checkpoint(&signer, T0, None).await.unwrap(),
        CheckpointOutcome::Refused(CheckpointRefusal::Empty)
    );
    append(&store, 1..=3).await;
    disable_triggers(db, &store).await;
    store
        .execute_raw("UPDATE audit SET principal = 'mallory' WHERE seq = 2")
        .await
        .unwrap();
    match store.checkpoint(&signer, T0, None).await.unwrap() {
        CheckpointOutcome::Refused(CheckpointRefusal::Broken(link)) => assert_eq!(link.seq, 2),
        other => panic!("signed a broken chain: {other:?}"),
    }
}

async fn the_store_identity_never_changes(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let id = store.store_id().await.unwrap();
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    assert!(
        store
            .execute_raw("UPDATE audit_store SET store_id = 'another'")
            .await
            .is_err()
    );
    assert!(store.execute_raw("DELETE FROM audit_store").await.is_err());
    store.close().await;
    let reopened = db.store(StoreConfig::default()).await;
    assert_eq!(reopened.store_id().await.unwrap(), id);
}

// ------------------------------------------------------------------ keys, without a database

/// Made with `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` (test key only).
const OPENSSL_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEICY5qgylOyoUj65r+2tGB1TLh7s9vHsQwg4GJzrlTSD2
-----END PRIVATE KEY-----
";
const OPENSSL_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAJpTCw3GoPD6SdpHUO1BaOlZchtM1GVYZquZzlpG2Qt0=
-----END PUBLIC KEY-----
";

#[test]
fn keys_read_what_openssl_writes_and_round_trip() {
    let signer = CheckpointSigner::parse(OPENSSL_PRIVATE, "ossl.pem").unwrap();
    assert_eq!(signer.public_key().to_pem(), OPENSSL_PUBLIC);
    let public = CheckpointPublicKey::parse_all(OPENSSL_PUBLIC, "ossl.pub").unwrap();
    assert_eq!(public, vec![signer.public_key().clone()]);
    assert_eq!(signer.public_key().id().as_str().len(), 16);

    // The PEM body on one line, for an environment variable.
    let one_line: String = OPENSSL_PRIVATE
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let again = CheckpointSigner::parse(&one_line, "TOOLGATE_CHECKPOINT_KEY").unwrap();
    assert_eq!(again.public_key(), signer.public_key());
    // What we write, we read.
    let made = CheckpointSigner::generate().unwrap();
    let back = CheckpointSigner::parse(&made.to_pem(), "made.pem").unwrap();
    assert_eq!(back.public_key(), made.public_key());
    assert!(
        !format!("{made:?}").contains("PRIVATE"),
        "Debug shows the id only"
    );
}

#[test]
fn a_keyring_holds_several_public_keys_and_never_a_private_one() {
    let other = CheckpointSigner::generate().unwrap();
    let ring = format!(
        "# retired 2026-10\n{OPENSSL_PUBLIC}\n# current\n{}",
        other.public_key().to_pem()
    );
    let keys = CheckpointPublicKey::parse_all(&ring, "keyring.pem").unwrap();
    let ids: BTreeMap<_, _> = keys.iter().map(|k| (k.id().clone(), ())).collect();
    assert_eq!(keys.len(), 2);
    assert!(ids.contains_key(other.public_key().id()));

    let e = CheckpointPublicKey::parse_all(OPENSSL_PRIVATE, "ck.pem").unwrap_err();
    assert_eq!(
        e.to_string(),
        "ck.pem: not a usable checkpoint public key: it holds a private key; give verifiers \
         the public key only; `toolgate log key public` prints the public key of a signing key"
    );
    let e = CheckpointPublicKey::parse_all("nothing here", "empty.pem").unwrap_err();
    assert!(
        e.to_string()
            .contains("no '-----BEGIN PUBLIC KEY-----' block"),
        "{e}"
    );
    let e = CheckpointSigner::parse(OPENSSL_PUBLIC, "TOOLGATE_CHECKPOINT_KEY").unwrap_err();
    assert!(
        e.to_string().starts_with(
            "TOOLGATE_CHECKPOINT_KEY: not a usable checkpoint signing key: it is a public key"
        ),
        "{e}"
    );
    let e = CheckpointSigner::parse("not base64!", "k.pem").unwrap_err();
    assert!(
        e.to_string()
            .contains("make one with `toolgate log key new --out FILE`"),
        "{e}"
    );
}

#[test]
fn a_checkpoint_file_that_is_not_one_is_named_by_line() {
    let signer = CheckpointSigner::parse(OPENSSL_PRIVATE, "ossl.pem").unwrap();
    let cp = signer.sign(
        "00112233445566778899aabbccddeeff",
        &toolgate_store::ChainPoint {
            seq: 4,
            hash: "sha256:ab".into(),
        },
        T0,
    );
    // Ed25519 is deterministic: the same key and statement, the same signature, forever.
    assert_eq!(
        cp.to_line(),
        format!(
            "{{\"format\":\"toolgate-audit-checkpoint/1\",\"hash\":\"sha256:ab\",\"key_id\":\"{}\",\
             \"seq\":4,\"signature\":\"{}\",\"signed_at\":\"2026-05-28T20:26:40.000Z\",\
             \"store\":\"00112233445566778899aabbccddeeff\"}}",
            signer.public_key().id(),
            cp.signature
        )
    );
    let pretty = serde_json::to_string_pretty(&cp).unwrap();
    assert_eq!(
        read_checkpoints(&pretty, "cp.json").unwrap(),
        vec![cp.clone()]
    );
    let e =
        read_checkpoints(&format!("{}\n{{\"seq\": 5}}\n", cp.to_line()), "cp.jsonl").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cp.jsonl: not a toolgate audit checkpoint: line 2:"),
        "{e}"
    );
    let e = read_checkpoints("\n\n", "blank.jsonl").unwrap_err();
    assert!(e.to_string().contains("it holds no checkpoint"), "{e}");
}

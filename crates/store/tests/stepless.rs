//! Direct reads made without a reservation: no step row, one record, and still counted by the
//! run they belong to — while they are under way (by the process that forwarded them) and once
//! recorded (in the run's tally). The fixture's policy refuses a write in a run that has read
//! anything, so a write's decision shows whether a read was counted.

use std::path::PathBuf;
use std::sync::Arc;

use crate::common::*;
use serde_json::json;
use toolgate_core::{Registry, StepStatus};
use toolgate_store::{Actor, AuditDecision, CallStatus, DirectCall, Executor, StoreConfig};

both_backends!(
    a_read_under_way_counts_for_its_run_and_so_does_one_recorded,
    a_failed_read_is_recorded_and_not_counted,
    a_refused_read_is_counted_with_its_run,
    gateways_sharing_a_store_append_to_one_chain,
    writes_reserved_together_each_see_the_ones_before,
);

fn run_count_registry() -> Arc<Registry> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/run-count-registry");
    Arc::new(Registry::load(&dir).unwrap_or_else(|e| panic!("run-count fixture registry: {e}")))
}

fn call(tool: &str, run: &str, inputs: serde_json::Value) -> DirectCall {
    DirectCall {
        principal: "clerk".into(),
        tool: tool.into(),
        inputs,
        run_id: run.into(),
        purpose: Some("ops".into()),
        reason: Some("keep the documents current".into()),
        actor: Actor::default(),
        ..DirectCall::default()
    }
}

fn read(run: &str, doc: &str) -> DirectCall {
    call("doc.read", run, json!({"doc_id": doc}))
}

fn write(run: &str, doc: &str) -> DirectCall {
    call(
        "doc.write",
        run,
        json!({"doc_id": doc, "title": "Q3 report"}),
    )
}

fn executor_with(db_store: &toolgate_store::Store, fake: Arc<Recorder>) -> Executor {
    Executor::new(
        db_store.clone(),
        run_count_registry(),
        keys(),
        fake,
        clock(),
    )
}

async fn a_read_under_way_counts_for_its_run_and_so_does_one_recorded(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let held = Arc::new(Recorder {
        gate: Some(gate.clone()),
        entered: Some(entered.clone()),
        ..Recorder::default()
    });
    // Two executors on one store (the same process): one whose upstream holds every call.
    let slow_ex = executor_with(&store, held);
    let fake = Recorder::new();
    let ex = executor_with(&store, fake.clone());

    // A read held at the upstream: forwarded, not recorded yet.
    let slow =
        tokio::spawn(async move { slow_ex.governed_call(read("run-a", "D-1")).await.unwrap() });
    entered.notified().await;
    let meanwhile = ex.governed_call(write("run-a", "D-1")).await.unwrap();
    assert_eq!(meanwhile.status, CallStatus::Refused, "{meanwhile:?}");
    assert_eq!(meanwhile.decision.rule(), Some("no-write-after-a-read"));
    // The same write in a run that has read nothing passes the same policy.
    let elsewhere = ex.governed_call(write("run-b", "D-1")).await.unwrap();
    assert_eq!(elsewhere.status, CallStatus::Done, "{elsewhere:?}");

    gate.notify_one();
    let done = slow.await.unwrap();
    assert_eq!(done.status, CallStatus::Done, "{done:?}");
    assert_eq!(
        done.step_id, None,
        "a read made without a reservation holds no step"
    );
    assert!(
        store
            .steps(&"run-a".into())
            .await
            .unwrap()
            .iter()
            .all(|s| s.tool != "doc.read"),
        "no step row for the read"
    );
    // One record for it: allowed, in its run, naming the step id the upstream was sent.
    let records = store
        .audit_records(None, Some(&"run-a".into()))
        .await
        .unwrap();
    let reads: Vec<_> = records
        .iter()
        .filter(|r| r.body.tool == "doc.read")
        .collect();
    assert_eq!(reads.len(), 1, "{records:?}");
    let r = &reads[0].body;
    assert_eq!(r.why.decision, AuditDecision::Allow);
    assert_eq!(r.outcome.status, StepStatus::Done);
    assert!(r.step_id.is_some());
    assert_eq!(r.why.checks.len(), 12, "every check recorded");
    assert_eq!(store.verify_chain().await.unwrap().broken, None);

    // Recorded, it is counted from the store: another process (no read under way) refuses too.
    let other = db.store(StoreConfig::default()).await;
    let ex2 = executor_with(&other, Recorder::new());
    let after = ex2.governed_call(write("run-a", "D-2")).await.unwrap();
    assert_eq!(
        after.decision.rule(),
        Some("no-write-after-a-read"),
        "{after:?}"
    );
    assert_eq!(
        fake.count("doc.write"),
        1,
        "only the write in the run that read nothing"
    );
}

async fn a_failed_read_is_recorded_and_not_counted(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    fake.set("doc.read", Mode::Fail);
    let ex = executor_with(&store, fake.clone());
    let failed = ex.governed_call(read("run-f", "D-1")).await.unwrap();
    assert_eq!(failed.status, CallStatus::Failed, "{failed:?}");
    let records = store
        .audit_records(None, Some(&"run-f".into()))
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body.outcome.status, StepStatus::Failed);
    // As a failed step is not, a failed read is not counted: the write passes.
    let w = ex.governed_call(write("run-f", "D-1")).await.unwrap();
    assert_eq!(w.status, CallStatus::Done, "{w:?}");
}

async fn a_refused_read_is_counted_with_its_run(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor_with(&store, fake.clone());
    // Refused by its schema: never sent, recorded, counted as a refusal of the run.
    let refused = ex
        .governed_call(call("doc.read", "run-r", json!({"doc_id": "../etc"})))
        .await
        .unwrap();
    assert_eq!(refused.status, CallStatus::Refused, "{refused:?}");
    assert_eq!(fake.count("doc.read"), 0);
    let records = store
        .audit_records(None, Some(&"run-r".into()))
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body.why.decision, AuditDecision::Deny);
    let w = ex.governed_call(write("run-r", "D-1")).await.unwrap();
    assert_eq!(w.decision.rule(), Some("no-write-after-a-read"), "{w:?}");
}

/// Two gateways on one store (two `Store`s, as two processes hold), each group-committing its
/// reads while the other appends: each commit lands on the head the other left (on
/// PostgreSQL the writer's remembered head is stale after every turn of the other, and its
/// commit must take the head under its lock instead), no record is lost or numbered twice,
/// and every read is counted with its run.
async fn gateways_sharing_a_store_append_to_one_chain(db: &TestDb) {
    let a = db.store(StoreConfig::default()).await;
    let b = db.store(StoreConfig::default()).await;
    let (ex_a, ex_b) = (
        executor_with(&a, Recorder::new()),
        executor_with(&b, Recorder::new()),
    );
    // Turns: a, a, b, a, b, b, … — each gateway's head is stale whenever the other went last.
    for i in 0..12 {
        let ex = if i % 3 == 1 { &ex_b } else { &ex_a };
        let r = ex
            .governed_call(read("run-shared", &format!("D-{i}")))
            .await
            .unwrap();
        assert_eq!(r.status, CallStatus::Done, "{r:?}");
    }
    // And at once, from both.
    let mut calls = Vec::new();
    for i in 0..16 {
        let ex = if i % 2 == 0 {
            ex_a.clone()
        } else {
            ex_b.clone()
        };
        calls.push(tokio::spawn(async move {
            ex.governed_call(read(&format!("run-{}", i % 4), "D-1"))
                .await
                .unwrap()
        }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap().status, CallStatus::Done);
    }
    let records = a.audit_records(None, None).await.unwrap();
    assert_eq!(records.len(), 28, "every read recorded once");
    let seqs: Vec<i64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(
        seqs,
        (1..=28).collect::<Vec<_>>(),
        "numbered without a gap or a repeat"
    );
    assert_eq!(a.verify_chain().await.unwrap().broken, None);
    assert_eq!(b.verify_chain().await.unwrap().broken, None);
    // Every read counted with its run: a write there is refused by the fixture's policy.
    for run in ["run-shared", "run-0", "run-3"] {
        let w = ex_b.governed_call(write(run, "D-9")).await.unwrap();
        assert_eq!(
            w.decision.rule(),
            Some("no-write-after-a-read"),
            "{run}: {w:?}"
        );
    }
}

/// Writes that arrive together are decided and reserved in one transaction; each must see the
/// steps of those decided before it (on PostgreSQL the batch reads its runs once and writes its
/// steps together, keeping the counts current in between). The fixture's policy refuses a write
/// in a run that has any step, so of writes arriving together in a fresh run exactly one runs.
/// The reservation batcher is held (the store's write lock taken by another connection) while
/// they arrive, so they are decided in one batch.
async fn writes_reserved_together_each_see_the_ones_before(db: &TestDb) {
    use sqlx::Connection as _;
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor_with(&store, fake.clone());
    // Made before the hold, so it is not what the held batch waits on. Each write here is its
    // own operation (the key is the document and title, whatever the run).
    let first = ex.governed_call(write("warm-up", "D-100")).await.unwrap();
    assert_eq!(first.status, CallStatus::Done, "{first:?}");

    enum Hold {
        Sqlite(sqlx::SqliteConnection),
        Postgres(sqlx::PgConnection),
    }
    let hold = match db.backend {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut c)
                .await
                .unwrap();
            Hold::Sqlite(c)
        }
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let schema = db.schema.as_deref().unwrap();
            let lock = format!(
                "SET search_path TO \"{schema}\"; BEGIN; \
                 LOCK TABLE idempotency IN SHARE ROW EXCLUSIVE MODE"
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(lock))
                .execute(&mut c)
                .await
                .unwrap();
            Hold::Postgres(c)
        }
    };
    // One write takes the batcher and waits for the lock; the others queue behind it.
    let blocker = {
        let ex = ex.clone();
        tokio::spawn(async move { ex.governed_call(write("blocker", "D-200")).await.unwrap() })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let together: Vec<_> = (1..=8)
        .map(|i| {
            let ex = ex.clone();
            let call = write("together", &format!("D-{i}"));
            tokio::spawn(async move { ex.governed_call(call).await.unwrap() })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    match hold {
        Hold::Sqlite(mut c) => drop(sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap()),
        Hold::Postgres(mut c) => drop(sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap()),
    }
    assert_eq!(blocker.await.unwrap().status, CallStatus::Done);
    let mut done = 0;
    for call in together {
        let r = call.await.unwrap();
        match r.status {
            CallStatus::Done => done += 1,
            _ => assert_eq!(r.decision.rule(), Some("no-write-after-a-read"), "{r:?}"),
        }
    }
    assert_eq!(
        done, 1,
        "one write in the fresh run; each later one saw a step before it"
    );
    assert_eq!(fake.count("doc.write"), 3, "warm-up, blocker and the one");
    let steps = store.steps(&"together".into()).await.unwrap();
    assert_eq!(steps.iter().map(|s| s.seq).collect::<Vec<_>>(), [1]);
}

/// A key another gateway takes after a reservation batch read it as free, and before the batch
/// writes it, is never run twice: the batch's write finds it taken, and the call hears that its
/// operation is in progress while the other calls of the batch run. PostgreSQL only: on SQLite
/// the batch holds the store's only write lock from its read to its commit.
///
/// How the batch is stopped between its read and its write: a first call (the blocker) waits
/// on its own key, which another transaction has written and not committed, while two calls
/// queue behind its batch; a lock that lets reads through and stops inserts is asked for
/// meanwhile, and is granted once the blocker's batch commits (the first transaction gives the
/// key up), so the two's batch reads and then waits to write. Each wait is on one holder only,
/// so nothing depends on the order PostgreSQL grants the waiters of one lock in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_between_a_batchs_read_and_its_write_is_not_run_twice() {
    use sqlx::Connection as _;
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor_with(&store, fake.clone());
    let warm = ex.governed_call(write("warm-up", "D-100")).await.unwrap();
    assert_eq!(warm.status, CallStatus::Done, "{warm:?}");
    let schema = db.schema.clone().unwrap();
    let lock_sql = format!(
        "SET search_path TO \"{schema}\"; BEGIN; \
         LOCK TABLE idempotency IN SHARE ROW EXCLUSIVE MODE"
    );
    let lock = || hold_idempotency(db.url.clone(), lock_sql.clone());
    // Statements that begin `start` waiting for a lock on `idempotency`, or (`behind: Some`)
    // for that connection's transaction.
    let waiting = |start: &'static str, behind: Option<i32>| {
        let (url, schema) = (db.url.clone(), schema.clone());
        async move {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let on = match behind {
                Some(pid) => format!("{pid} = ANY(pg_blocking_pids(a.pid))"),
                None => format!("l.relation = '\"{schema}\".idempotency'::regclass"),
            };
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE NOT l.granted AND a.query LIKE '{start}%' AND {on}"
            )))
            .fetch_one(&mut c)
            .await
            .unwrap();
            n
        }
    };
    let until = |what: &'static str, start: &'static str, behind: Option<i32>| async move {
        for _ in 0..250 {
            if waiting(start, behind).await >= 1 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("never saw {what}");
    };

    let registry = run_count_registry();
    let key_of = |doc: &str| {
        let inputs = json!({"doc_id": doc, "title": "Q3 report"});
        let key = registry.call_key("clerk", registry.tool("doc.write").unwrap(), &inputs);
        (key, toolgate_core::InputHash::of(&inputs))
    };
    // The blocker's key, written by a transaction that stays open: the blocker's batch waits on
    // it while the two others queue behind that batch.
    let mut first = {
        let (key, hash) = key_of("D-200");
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET search_path TO \"{schema}\"; BEGIN; \
             INSERT INTO idempotency (idem_key, input_hash, state, outcome, step_id, created_at, \
             expires_at) VALUES ('{}', '{}', 'in_flight', NULL, 'elsewhere', 0, 9000000000000)",
            key.as_str(),
            hash.as_str()
        )))
        .execute(&mut c)
        .await
        .unwrap();
        c
    };
    let first_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut first)
        .await
        .unwrap();
    let call = |run: &'static str, doc: &'static str| {
        let ex = ex.clone();
        tokio::spawn(async move { ex.governed_call(write(run, doc)).await.unwrap() })
    };
    let blocker = call("blocker", "D-200");
    until(
        "the blocker waiting on its key",
        "WITH k AS",
        Some(first_pid),
    )
    .await;
    let (one, two) = (call("r-1", "D-1"), call("r-2", "D-2"));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // The lock waits for the blocker's batch (and the first transaction) to end. Then the next
    // batch (the two) reads, and waits for the lock to write.
    let second = tokio::spawn(lock());
    until("the second hold waiting", "SET search_path", None).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut first).await.unwrap();
    let mut second = second.await.unwrap();
    // The two's batch has read their keys as free, and waits to write its deferred steps.
    until("the batch waiting to write", "WITH d AS", None).await;
    // Another gateway takes the first one's key meanwhile.
    let (key, hash) = key_of("D-1");
    sqlx::query(
        "INSERT INTO idempotency (idem_key, input_hash, state, outcome, step_id, created_at, \
         expires_at) VALUES ($1, $2, 'in_flight', NULL, 'elsewhere', 0, 9000000000000)",
    )
    .bind(key.as_str())
    .bind(hash.as_str())
    .execute(&mut second)
    .await
    .unwrap();
    sqlx::raw_sql("COMMIT").execute(&mut second).await.unwrap();

    assert_eq!(blocker.await.unwrap().status, CallStatus::Done);
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    assert_eq!(one.status, CallStatus::InProgress, "{one:?}");
    assert_eq!(two.status, CallStatus::Done, "{two:?}");
    assert_eq!(
        fake.count("doc.write"),
        3,
        "warm-up, blocker and the second; the first not at all"
    );
    assert!(store.steps(&"r-1".into()).await.unwrap().is_empty());
    assert_eq!(store.verify_chain().await.unwrap().broken, None);
}

/// A connection holding a lock on `idempotency` that lets reads through and stops inserts (`sql`
/// names the schema and takes the lock).
async fn hold_idempotency(url: String, sql: String) -> sqlx::PgConnection {
    use sqlx::Connection as _;
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut c)
        .await
        .unwrap();
    c
}

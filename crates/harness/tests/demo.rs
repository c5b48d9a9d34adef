//! `toolgate demo` end to end: its output (ids, paths and timings masked) and what reached the
//! fake systems, on SQLite and on PostgreSQL with only the store URL changed.

use toolgate_harness::demo::{DemoSummary, examples_dir, run};

fn mask(text: &str) -> String {
    let rules = [
        (r"run-[0-9a-f]{8,}", "run-<id>"),
        (r"plan-[0-9a-f]{8,}", "plan-<id>"),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<uuid>",
        ),
        (r"/tmp/\.tmp[A-Za-z0-9]+", "<tmp>"),
        (r"\d+\.\d ms", "<t> ms"),
        (r"done in \d+ ms", "done in <t> ms"),
    ];
    let mut out = text.to_string();
    for (re, with) in rules {
        out = regex::Regex::new(re)
            .unwrap()
            .replace_all(&out, with)
            .into_owned();
    }
    out
}

fn assert_outcomes(s: &DemoSummary) {
    let dispatch: Vec<&str> = s.dispatch.iter().map(|(_, st)| st.as_str()).collect();
    assert_eq!(
        dispatch,
        [
            "allowed", "allowed", "allowed", "allowed", "refused", "refused"
        ],
        "the dispatch run: four allowed, then refused for scopes, then by policy"
    );
    assert!(
        !s.worker_tools.iter().any(|t| t.starts_with("supplier.")),
        "{:?}",
        s.worker_tools
    );
    assert!(
        !s.planner_tools.iter().any(|t| t.starts_with("supplier.")),
        "{:?}",
        s.planner_tools
    );
    assert_eq!(
        s.payment.last().map(|(t, st)| (t.as_str(), st.as_str())),
        Some(("payment.schedule", "needs_approval"))
    );
    assert!(
        !s.erp_calls.iter().any(|t| t == "schedule_payment"),
        "nothing irreversible was sent: {:?}",
        s.erp_calls
    );
    assert!(
        !s.erp_calls
            .iter()
            .any(|t| t.contains("iban") || t.contains("supplier")),
        "{:?}",
        s.erp_calls
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_on_sqlite() {
    let mut out = Vec::new();
    let summary = run(&mut out, &examples_dir(), None, false)
        .await
        .expect("the demo runs");
    assert_outcomes(&summary);
    insta::assert_snapshot!(mask(&String::from_utf8(out).unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_on_postgres_with_only_the_store_url_changed() {
    let admin = std::env::var("TOOLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = match sqlx::PgPool::connect(&admin).await {
        Ok(p) => p,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no PostgreSQL at {admin} ({e}); under CI=true this fails");
            return;
        }
        Err(e) => panic!("PostgreSQL must be reachable under CI=true: {e}"),
    };
    let name = format!("tg_demo_{}", std::process::id());
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    let url = match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("unexpected URL {admin}"),
    };
    let mut out = Vec::new();
    let result = run(&mut out, &examples_dir(), Some(&url), false).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let summary = result.expect("the demo runs on PostgreSQL");
    assert_outcomes(&summary);
}

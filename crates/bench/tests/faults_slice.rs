//! The fixed-seed CI slice of the fault benchmark: a few hundred episodes covering every fault
//! and strategy, through toolgate and direct. Fails on any duplicate payment, lost audit record
//! or unsettled `unknown` with toolgate, and on the direct route not showing the duplicates the
//! faults cause (so the test fails if faults stop being injected).

use std::collections::BTreeSet;
use std::time::Instant;

use toolgate_bench::{Fault, RunOptions, Strategy, plan, run_faults, table};

#[test]
fn the_plan_is_seeded_and_covers_every_cell_in_each_block_of_twenty() {
    assert_eq!(
        format!("{:?}", plan(100, 7)),
        format!("{:?}", plan(100, 7)),
        "same seed, same episodes"
    );
    assert_ne!(format!("{:?}", plan(100, 7)), format!("{:?}", plan(100, 8)));
    let cells = Fault::ALL.len() * Strategy::ALL.len();
    for block in plan(100, 7).chunks(cells) {
        let seen: BTreeSet<_> = block.iter().map(|e| (e.fault, e.strategy)).collect();
        assert_eq!(seen.len(), cells);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_seed_slice_has_no_duplicates_lost_records_or_unsettled_unknowns_with_toolgate() {
    let started = Instant::now();
    let report = run_faults(RunOptions::new(300, 7, 32))
        .await
        .expect("the bench runs");
    println!("{}", table(&report));
    println!("slice took {:.1} s", started.elapsed().as_secs_f64());

    let tg = &report.totals["toolgate"];
    assert_eq!(tg.episodes, 300);
    assert_eq!(
        tg.duplicate_effects, 0,
        "toolgate let a payment be booked twice"
    );
    assert_eq!(
        tg.audit_missing, 0,
        "a governed attempt has no audit record"
    );
    assert_eq!(
        tg.unknown, tg.unknown_settled,
        "an unknown step was not settled by reconciliation"
    );
    assert!(report.audit_chain_intact, "the audit chain does not verify");

    for fault in Fault::ALL {
        let t = &report.by_fault[&format!("toolgate/{}", fault.name())];
        let d = &report.by_fault[&format!("direct/{}", fault.name())];
        assert_eq!(t.episodes, 60, "{}: every fault gets a fifth", fault.name());
        match fault {
            // Nothing lands, so nothing can be duplicated: the fault shows as a timeout
            // (an `unknown` step with toolgate) and as a missed payment for give-up agents.
            Fault::TimeoutBeforeCommit => {
                assert!(t.unknown > 0, "{}: never timed out", fault.name());
                assert!(d.missed > 0, "{}: nothing was dropped", fault.name());
            }
            _ => assert!(
                d.duplicate_episodes > 0,
                "{}: the direct route shows no duplicates, so the fault did not fire",
                fault.name()
            ),
        }
        if matches!(fault, Fault::TimeoutAfterCommit | Fault::LateCommit) {
            assert!(t.unknown > 0, "{}: no unknown step", fault.name());
        }
    }
}

/// A workspace binary in this profile's target folder (`cargo test --workspace` builds it;
/// built here when missing).
fn workspace_binary(name: &str, package: &str) -> std::path::PathBuf {
    let dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let bin = dir.join(name);
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo)
            .args(["build", "-p", package, "--bins"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "building {package} failed");
    }
    bin
}

/// The SIGKILL storm, CI-sized: unmodified agents (no `_meta`) pay distinct invoices through a
/// real `toolgate serve` killed while the ERP holds payments; the ERP books every delivery.
/// Nothing is booked twice, no agent is told "refused" for a payment that was booked, every
/// booking has the allow decision of its key in the chain, every payment gets a final answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_gateway_books_each_payment_once_and_tells_the_agent_so() {
    use toolgate_bench::crash::StoreKind;
    use toolgate_bench::storm::{StormOptions, run_storm, storm_table};
    let report = run_storm(&StormOptions {
        toolgate: workspace_binary("toolgate", "toolgate"),
        store: StoreKind::Sqlite,
        durability: toolgate_core::config::Durability::Fsync,
        payments: 120,
        agents: 6,
        kills: 4,
        hold_ms: 300,
    })
    .await
    .expect("the storm runs");
    println!("{}", storm_table(&report));
    assert_eq!(report.kills, 4);
    assert_eq!(
        report.kills_while_held, 4,
        "every kill came while the ERP held a payment"
    );
    assert_eq!(report.booked, 120, "every payment was booked");
    assert_eq!(report.booked_twice, 0);
    assert_eq!(report.refused_but_booked, 0);
    assert_eq!(report.bookings_without_allow, 0);
    assert_eq!(report.unsettled, 0);
    assert_eq!(report.answers.get("done"), Some(&120));
    assert!(report.audit_chain_intact);
}

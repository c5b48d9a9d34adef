//! A run's trace as a person reads it: every step, and under each the audit records of its
//! decided attempts with their checks (failed ones always, passed ones with `verbose`), then
//! the records that hold no step row. Everything a caller chose (a run id, a tool name, values
//! quoted in check details) is written as a person may safely see it.

use std::fmt::Write as _;

use toolgate_core::canonical;
use toolgate_core::clip::printable;

use crate::audit::AuditRecord;
use crate::model::Step;

/// The trace of run `run_id`: its `steps` in order and its audit `records` in chain order.
pub(crate) fn render(
    run_id: &str,
    steps: &[Step],
    records: &[AuditRecord],
    verbose: bool,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "run {}: {} step(s), {} audit record(s)",
        printable(run_id),
        steps.len(),
        records.len()
    );
    for st in steps {
        let _ = writeln!(
            s,
            "  step {} {} [{}] {} ({}, attempts {})",
            st.seq,
            st.tool,
            st.kind.as_str(),
            st.status,
            st.effect,
            st.attempts
        );
        for rec in records
            .iter()
            .filter(|r| r.body.step_id.as_deref() == Some(&st.step_id))
        {
            write_record(&mut s, rec, verbose);
        }
    }
    let loose: Vec<&AuditRecord> = records
        .iter()
        .filter(|r| {
            r.body
                .step_id
                .as_deref()
                .is_none_or(|id| !steps.iter().any(|s| s.step_id == id))
        })
        .collect();
    if !loose.is_empty() {
        let _ = writeln!(
            s,
            "  calls without a step row (refused direct calls, reads made without a reservation):"
        );
        for rec in loose {
            let _ = writeln!(s, "   {}", printable(&rec.body.tool));
            write_record(&mut s, rec, verbose);
        }
    }
    s
}

/// One record: its decision, outcome and rule, then its checks (and with `verbose` the
/// redacted inputs and who approved).
fn write_record(s: &mut String, rec: &AuditRecord, verbose: bool) {
    let b = &rec.body;
    let _ = writeln!(
        s,
        "    #{} {:?} -> {}{}",
        rec.seq,
        b.why.decision,
        b.outcome.status,
        b.why
            .rule
            .as_deref()
            .map(|r| format!(" (rule {})", printable(r)))
            .unwrap_or_default()
    );
    for c in &b.why.checks {
        let failed = !matches!(c.outcome, toolgate_core::decide::Outcome::Pass);
        if verbose || failed {
            let _ = writeln!(
                s,
                "      {:<16} {:?}: {}{}",
                c.name.as_str(),
                c.outcome,
                printable(&c.detail),
                c.rule
                    .as_deref()
                    .map(|r| format!(" [{r}]"))
                    .unwrap_or_default()
            );
        } else {
            let _ = writeln!(s, "      {:<16} Pass", c.name.as_str());
        }
    }
    for r in &b.why.shadow {
        let _ = writeln!(
            s,
            "      {:<16} would {} [{}] (shadow, not enforced)",
            "shadow",
            r.would.as_str(),
            r.rule
        );
    }
    if verbose {
        let _ = writeln!(s, "      inputs: {}", printable(&canonical(&b.inputs)));
        if let Some(a) = &b.approval {
            let _ = writeln!(s, "      approved by: {}", a.approvers.join(", "));
        }
    }
}

//! Decision facts: what a person needs beside the inputs to decide at a glance, looked up when
//! the item is opened through the read tools the tool declares (`approval_context`), the same
//! handler destination lookups use. For a payment: who is paid, to which account (masked), the
//! invoice's own amount and status against the amount being paid, mismatches marked.

use serde_json::Value;
use toolgate_core::approvers::ContextLookup;
use toolgate_core::{Registry, Timestamp};
use toolgate_store::{ApprovalRequest, ApprovalStatus, Executor};

/// One looked-up fact.
#[derive(Debug, Clone, PartialEq)]
pub struct Fact {
    pub label: String,
    pub value: Value,
    /// Shown masked (a redacted field of the lookup tool).
    pub masked: bool,
    /// For a destination (an account): how long it has been the party's, from the approved
    /// calls the store keeps (see [`since`]).
    pub since: Option<Since>,
}

/// How long a party's destination (an IBAN, an account) has been what the lookup says.
#[derive(Debug, Clone, PartialEq)]
pub enum Since {
    /// An approved call that sets the field for this party (a tool whose identity names it,
    /// such as `supplier.update_iban`) set it to this value at `at`.
    Changed { at: Timestamp, days: i64 },
    /// No such change on record; approved calls used this value since `at`.
    Unchanged { at: Timestamp },
    /// No approved call on record used it.
    Unseen,
}

impl Since {
    /// `changed 2 days ago (2026-05-26 20:26 UTC)`, `unchanged since 2026-05-21 20:26 UTC`.
    pub fn text(&self) -> String {
        match self {
            Since::Changed { at, days: 0 } => {
                format!("changed today ({})", crate::fmt::datetime(*at))
            }
            Since::Changed { at, days: 1 } => {
                format!("changed 1 day ago ({})", crate::fmt::datetime(*at))
            }
            Since::Changed { at, days } => {
                format!("changed {days} days ago ({})", crate::fmt::datetime(*at))
            }
            Since::Unchanged { at } => format!("unchanged since {}", crate::fmt::datetime(*at)),
            Since::Unseen => "no approved call on record used it".into(),
        }
    }
    /// A change within the last 30 days: worth a second look before paying to it.
    pub fn recent(&self) -> bool {
        matches!(self, Since::Changed { days, .. } if *days < 30)
    }
}

/// How long `value` has been `party`'s `field` (an account), from `history` (every approval
/// request the store keeps): the latest approved call of a tool whose identity names `field`
/// that set it to `value` for the party (a change), else the first approved call of any tool
/// that used it for the party. Only calls that people approved count, not ones merely asked for.
pub fn since(
    registry: &Registry,
    party: &(String, Value),
    field: &str,
    value: &Value,
    history: &[ApprovalRequest],
    now: Timestamp,
) -> Since {
    let used: Vec<&ApprovalRequest> = history
        .iter()
        .filter(|r| {
            matches!(
                r.status,
                ApprovalStatus::Approved | ApprovalStatus::Consumed
            )
        })
        .filter(|r| r.inputs.get(party.0.as_str()) == Some(&party.1))
        .filter(|r| r.inputs.get(field) == Some(value))
        .collect();
    let when = |r: &ApprovalRequest| r.decided_at.unwrap_or(r.created_at);
    let changed = used
        .iter()
        .filter(|r| {
            registry
                .tool(&r.tool)
                .is_some_and(|t| t.config.identity.iter().any(|f| f == field))
        })
        .map(|r| when(r))
        .max();
    if let Some(at) = changed {
        return Since::Changed {
            at,
            days: (now.millis() - at.millis()).max(0) / 86_400_000,
        };
    }
    match used.iter().map(|r| when(r)).min() {
        Some(at) => Since::Unchanged { at },
        None => Since::Unseen,
    }
}

/// An input that differs from the looked-up value it must equal.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub input: String,
    pub label: String,
    pub sent: Value,
    pub found: Value,
}

/// The answer of one declared lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub tool: String,
    pub facts: Vec<Fact>,
    pub mismatches: Vec<Mismatch>,
    /// The lookup gave no usable answer (the facts are missing, not "fine").
    pub error: Option<String>,
    /// The party the call concerns: its own party input, or else the one the looked-up record
    /// names (a payment of an invoice is to the invoice's supplier).
    pub party: Option<(String, Value)>,
}

impl Facts {
    /// A fact that says "look again before approving": a mismatch, a missing answer, or an
    /// account changed recently.
    pub fn warning(&self) -> Option<&'static str> {
        if self.error.is_some() {
            Some("decision facts missing")
        } else if !self.mismatches.is_empty() {
            Some("facts mismatch")
        } else if self
            .facts
            .iter()
            .any(|f| f.since.as_ref().is_some_and(Since::recent))
        {
            Some("account changed recently")
        } else {
            None
        }
    }
}

/// Why a declared lookup gave no answer: the store's error, kept whole (shared, so a page
/// that asks the same question again is given the same answer).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{source}")]
pub struct LookupFailed {
    #[source]
    source: std::sync::Arc<toolgate_store::StoreError>,
}

/// Lookup answers already fetched while building one page, by lookup tool and inputs: a queue
/// of forty payments of one supplier asks the ERP once per invoice, not once per question.
#[derive(Debug, Default)]
pub struct Memo {
    answers: std::collections::HashMap<(String, String), Result<Value, LookupFailed>>,
}

impl Memo {
    async fn answer(
        &mut self,
        exec: &Executor,
        req: &ApprovalRequest,
        l: &ContextLookup,
    ) -> Result<Value, LookupFailed> {
        let mut inputs = serde_json::Map::new();
        for f in &l.with {
            if let Some(v) = req.inputs.get(f.as_str()) {
                inputs.insert(f.clone(), v.clone());
            }
        }
        let inputs = Value::Object(inputs);
        let key = (l.tool.clone(), toolgate_core::canonical(&inputs));
        if let Some(a) = self.answers.get(&key) {
            return a.clone();
        }
        let a = exec
            .look_up_for_approval(&req.principal, req.run_id.as_deref(), &l.tool, &inputs)
            .await
            .map_err(|e| LookupFailed {
                source: std::sync::Arc::new(e),
            });
        self.answers.insert(key, a.clone());
        a
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() < 0.005,
        _ => a == b,
    }
}

/// The record a lookup answered with: `result` names the field (a list: its first item).
fn record<'a>(answer: &'a Value, l: &ContextLookup) -> Option<&'a Value> {
    let v = match &l.result {
        Some(f) => answer.pointer(&format!("/{}", f.replace('.', "/")))?,
        None => answer,
    };
    match v {
        Value::Array(a) => a.first(),
        other => Some(other),
    }
}

/// Reads one declared lookup's answer into facts and mismatches; a destination fact (an
/// account) says how long it has been the party's, judged against `history`.
pub fn read(
    registry: &Registry,
    req: &ApprovalRequest,
    l: &ContextLookup,
    answer: &Value,
    history: &[ApprovalRequest],
    now: Timestamp,
) -> Facts {
    let redacted = |field: &str| {
        registry
            .tool(&l.tool)
            .is_some_and(|t| t.config.redact.iter().any(|r| r == field))
    };
    let Some(rec) = record(answer, l) else {
        return Facts {
            tool: l.tool.clone(),
            facts: Vec::new(),
            mismatches: Vec::new(),
            error: Some(format!("{} found nothing for this call", l.tool)),
            party: crate::item::party(req),
        };
    };
    let party = crate::item::party(req).or_else(|| crate::item::party_of(rec));
    let facts: Vec<Fact> = l
        .show
        .iter()
        .map(|(label, field)| {
            let v = rec.get(field.as_str()).cloned().unwrap_or(Value::Null);
            let masked = redacted(field);
            let since = party
                .as_ref()
                .filter(|_| !v.is_null() && crate::item::is_destination(None, field))
                .map(|p| since(registry, p, field, &v, history, now));
            Fact {
                label: label.clone(),
                value: if masked { crate::mask::value(&v) } else { v },
                masked,
                since,
            }
        })
        .collect();
    let mismatches = l
        .expect
        .iter()
        .filter_map(|(input, label)| {
            let field = l.show.get(label).unwrap_or(label);
            let found = rec.get(field.as_str()).cloned().unwrap_or(Value::Null);
            let sent = req
                .inputs
                .get(input.as_str())
                .cloned()
                .unwrap_or(Value::Null);
            (!same(&sent, &found)).then(|| Mismatch {
                input: input.clone(),
                label: label.clone(),
                sent,
                found,
            })
        })
        .collect();
    Facts {
        tool: l.tool.clone(),
        facts,
        mismatches,
        error: None,
        party,
    }
}

/// Looks up every fact the request's tool declares, through the executor's handler; `history`
/// is every request the store keeps (see [`read`]).
pub async fn look_up(
    exec: &Executor,
    req: &ApprovalRequest,
    history: &[ApprovalRequest],
) -> Vec<Facts> {
    look_up_with(exec, req, history, &mut Memo::default()).await
}

/// [`look_up`], asking the handler only for answers `memo` does not hold yet.
pub async fn look_up_with(
    exec: &Executor,
    req: &ApprovalRequest,
    history: &[ApprovalRequest],
    memo: &mut Memo,
) -> Vec<Facts> {
    let Some(tool) = exec.registry.tool(&req.tool) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for l in &tool.config.approval_context {
        match memo.answer(exec, req, l).await {
            Ok(answer) => out.push(read(
                &exec.registry,
                req,
                l,
                &answer,
                history,
                exec.clock.now(),
            )),
            Err(e) => out.push(Facts {
                tool: l.tool.clone(),
                facts: Vec::new(),
                mismatches: Vec::new(),
                error: Some(e.to_string()),
                party: crate::item::party(req),
            }),
        }
    }
    out
}

/// How many approved calls of a tool are looked up, newest first, to find out whether a party
/// was paid before; past that the payee counts as new (a wrong "new" costs one more look).
const KNOWN_PARTY_SCAN: usize = 200;

/// Whether `party` is new for `req`'s tool: no approved call of the tool went to it before.
/// A call that names its party in its inputs is compared directly; one that does not (a
/// payment names only its invoice) is compared through its own lookups' answer.
pub async fn first_time_party(
    exec: &Executor,
    req: &ApprovalRequest,
    party: &(String, Value),
    history: &[ApprovalRequest],
    memo: &mut Memo,
) -> bool {
    let mut earlier: Vec<&ApprovalRequest> = history
        .iter()
        .filter(|o| approved_other_call(o, req))
        .collect();
    earlier.sort_by_key(|o| std::cmp::Reverse(o.created_at));
    let lookups = exec
        .registry
        .tool(&req.tool)
        .map(|t| t.config.approval_context.clone())
        .unwrap_or_default();
    for o in earlier.into_iter().take(KNOWN_PARTY_SCAN) {
        if let Some(p) = crate::item::party(o) {
            if p == *party {
                return false;
            }
            continue;
        }
        for l in &lookups {
            if let Ok(answer) = memo.answer(exec, o, l).await
                && record(&answer, l).and_then(crate::item::party_of).as_ref() == Some(party)
            {
                return false;
            }
        }
    }
    true
}

/// Another request for the same operation (same tool, same identity values) in the retention
/// window, whichever run or agent raised it: a duplicate to look at before approving.
pub fn duplicates<'a>(
    registry: &Registry,
    req: &ApprovalRequest,
    all: &'a [ApprovalRequest],
    retention_ms: i64,
) -> Vec<&'a ApprovalRequest> {
    let Some(tool) = registry.tool(&req.tool) else {
        return Vec::new();
    };
    let identity = &tool.config.identity;
    if identity.is_empty() {
        return Vec::new();
    }
    all.iter()
        .filter(|o| {
            o.approval_id != req.approval_id
                && o.tool == req.tool
                && o.status != toolgate_store::ApprovalStatus::Expired
                && (req.created_at.millis() - o.created_at.millis()).abs() <= retention_ms
                && identity
                    .iter()
                    .all(|f| o.inputs.get(f.as_str()) == req.inputs.get(f.as_str()))
        })
        .collect()
}

/// Whether `other` is another request for `req`'s tool that people approved (whether or not
/// its call has run since): what "paid before" and "compared with" look among.
pub(crate) fn approved_other_call(other: &ApprovalRequest, req: &ApprovalRequest) -> bool {
    other.approval_id != req.approval_id
        && other.tool == req.tool
        && matches!(
            other.status,
            ApprovalStatus::Approved | ApprovalStatus::Consumed
        )
}

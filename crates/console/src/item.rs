//! One item, with everything needed to decide and nothing to reconstruct: the tool and its
//! class, the inputs exactly as they will be sent, which of them the audit log redacts, the
//! model's reason, the gating rule, the evidence, the run so far, and, for a repeated kind of
//! call, what changed since the last approved one. A destination (an IBAN, an account, an
//! address) that none of the same party's approved calls used is the thing an approver must
//! not miss, so it is computed here and shouted on the page.

use std::collections::BTreeSet;

use serde_json::Value;
use toolgate_core::registry::Tool;
use toolgate_core::{ApprovalId, InputHash, Registry, Timestamp};
use toolgate_store::{ApprovalRequest, ApprovalStatus, Executor, Review, Step, StoreError};

use crate::error::ConsoleError;

/// Input fields that name the counterparty; calls with the same value are "the same party".
const PARTY_FIELDS: &[&str] = &[
    "supplier_id",
    "supplier",
    "vendor_id",
    "vendor",
    "payee_id",
    "payee",
    "customer_id",
    "customer",
    "recipient_id",
];

/// Name fragments of fields that choose where money or data goes.
const DESTINATION_WORDS: &[&str] = &[
    "iban",
    "account",
    "bic",
    "swift",
    "sort_code",
    "routing",
    "beneficiary",
    "recipient",
    "email",
    "url",
    "webhook",
    "channel",
    "destination",
    "address",
];

/// True when a field (its last path segment) chooses a destination, by name or because the
/// tool declares a destination constraint on it.
pub fn is_destination(tool: Option<&Tool>, path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path).to_ascii_lowercase();
    if last == "to" || last.ends_with("_to") {
        return true;
    }
    if last.ends_with("_id") && PARTY_FIELDS.contains(&last.as_str()) {
        return false;
    }
    DESTINATION_WORDS.iter().any(|w| last.contains(w))
        || tool.is_some_and(|t| t.config.destinations.iter().any(|d| d.field == path))
}

/// One leaf of the inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Dotted path (`supplier.iban`).
    pub path: String,
    pub value: Value,
    /// The audit log stores this field as a keyed hash.
    pub redacted: bool,
    pub destination: bool,
    /// The value in the last approved call of the same kind (same tool and party), when that
    /// call had the field.
    pub previous: Option<Value>,
    /// Differs from `previous` (or is new).
    pub changed: bool,
    /// A destination no approved call of the same kind used before.
    pub new_destination: bool,
    /// Shown masked: above the viewer's sensitivity ceiling.
    pub masked: bool,
}

/// What this call is compared against.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The party field and value that define "the same kind" (none: same tool only).
    pub party: Option<(String, Value)>,
    /// The last approved call of the same kind.
    pub last: Option<ApprovalRequest>,
    /// How many approved calls of the same kind there were.
    pub count: usize,
}

/// The tool's class, as the registry declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    pub version: String,
    pub description: String,
    pub effect: String,
    pub tier: String,
    pub sensitivity: String,
    pub gate: String,
    pub approvers: u8,
}

/// Everything the item page shows.
#[derive(Debug, Clone)]
pub struct ItemView {
    pub request: ApprovalRequest,
    pub tool: Option<ToolInfo>,
    pub canonical: String,
    pub fields: Vec<Field>,
    pub comparison: Comparison,
    /// The subject step, when the request parks a planned step.
    pub step: Option<Step>,
    /// The run's steps before this one.
    pub earlier: Vec<Step>,
    /// Reviewers' verdicts on the subject step (`step.approve` / `step.reject`): a model's
    /// check, shown to the person; it approves nothing.
    pub reviews: Vec<Review>,
    /// The current hash of the step's inputs (differs from the request's when the plan was
    /// revised after the request was raised).
    pub step_hash: Option<InputHash>,
    /// A direct call whose key already ran to completion: approving it again can only replay
    /// the stored outcome, so the page says so (it is a duplicate to reject, not a new payment).
    pub already_done: Option<Step>,
    /// The call decided again now, dry (every check, current registry and run state): the
    /// rule and reason that would refuse it once approved. `None`: it would run, or the
    /// request is not pending (nothing to decide).
    pub would_refuse: Option<(String, String)>,
    /// Decision facts looked up through the tool's `approval_context`.
    pub facts: Vec<crate::facts::Facts>,
    /// Other requests for the same operation (same identity) in the retention window.
    pub duplicates: Vec<ApprovalRequest>,
    /// The next item in the viewer's queue (after a decision, the page goes there).
    pub next: Option<String>,
    /// The run's open requests, to approve together, when it has two or more.
    pub run_offer: Option<crate::bulk::RunOffer>,
    pub now: Timestamp,
}

impl ItemView {
    pub fn expired(&self) -> bool {
        self.request.status == ApprovalStatus::Expired
            || (self.request.status == ApprovalStatus::Pending
                && self.now >= self.request.expires_at)
    }
    pub fn time_left_ms(&self) -> i64 {
        self.request.expires_at.millis() - self.now.millis()
    }
    /// Destinations that are new for this party: the fields to shout about.
    pub fn new_destinations(&self) -> Vec<&Field> {
        self.fields.iter().filter(|f| f.new_destination).collect()
    }
    /// Whether approving is possible at all right now (status, expiry, inputs unchanged, and
    /// the call would not be refused once approved).
    pub fn approvable(&self) -> bool {
        self.would_refuse.is_none()
            && self.request.status == ApprovalStatus::Pending
            && !self.expired()
            && self
                .step_hash
                .as_ref()
                .is_none_or(|h| *h == self.request.input_hash)
    }
}

/// Flattens objects into dotted leaves; arrays and scalars are leaves.
pub fn leaves(v: &Value) -> Vec<(String, Value)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, x) in map {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&p, x, out);
                }
            }
            other => out.push((prefix.to_string(), other.clone())),
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, seg| v.get(seg))
}

/// The party field and value of a call (`supplier_id` = `SUP-0001`), when it names one.
pub fn party(req: &ApprovalRequest) -> Option<(String, Value)> {
    party_of(&req.inputs)
}

/// The party field and value of a record (a call's inputs, or a looked-up record such as an
/// invoice), when it names one.
pub fn party_of(record: &Value) -> Option<(String, Value)> {
    PARTY_FIELDS.iter().find_map(|f| {
        record
            .get(*f)
            .filter(|v| !v.is_null())
            .map(|v| (f.to_string(), v.clone()))
    })
}

/// Compares `req` with the approved calls of the same kind among `all`.
pub fn compare(
    registry: &Registry,
    req: &ApprovalRequest,
    all: &[ApprovalRequest],
) -> (Vec<Field>, Comparison) {
    let tool = registry.tool(&req.tool);
    let party = party(req);
    // "The same kind": the same party, or the same operation (identity); with neither there is
    // nothing to compare with (an unrelated payment would mark every field changed).
    let identity: Vec<String> = tool.map(|t| t.config.identity.clone()).unwrap_or_default();
    let mut same: Vec<&ApprovalRequest> = all
        .iter()
        .filter(|o| {
            crate::facts::approved_other_call(o, req)
                && o.created_at <= req.created_at
                && (party
                    .as_ref()
                    .is_some_and(|(f, v)| o.inputs.get(f.as_str()) == Some(v))
                    || (!identity.is_empty()
                        && identity
                            .iter()
                            .all(|f| o.inputs.get(f.as_str()) == req.inputs.get(f.as_str()))))
        })
        .collect();
    same.sort_by_key(|r| std::cmp::Reverse(r.created_at));
    let last = same.first().map(|r| (*r).clone());
    let redact: BTreeSet<&str> = tool
        .map(|t| t.config.redact.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let fields = leaves(&req.inputs)
        .into_iter()
        .map(|(path, value)| {
            let destination = is_destination(tool, &path);
            let previous = last
                .as_ref()
                .and_then(|l| lookup(&l.inputs, &path).cloned());
            let changed = last.is_some() && previous.as_ref() != Some(&value);
            // New also when nothing of the same kind was approved before: a first-time
            // payee is the riskiest destination of all, not an unremarkable one.
            let new_destination = destination
                && !same
                    .iter()
                    .any(|o| lookup(&o.inputs, &path) == Some(&value));
            Field {
                redacted: redact.contains(path.as_str())
                    || redact.iter().any(|r| path.starts_with(&format!("{r}."))),
                path,
                value,
                destination,
                previous,
                changed,
                new_destination,
                masked: false,
            }
        })
        .collect();
    (
        fields,
        Comparison {
            party,
            last,
            count: same.len(),
        },
    )
}

/// Loads one item for `viewer`: a request they may not decide is not found (they are shown
/// nothing of it), and fields above their sensitivity ceiling are masked.
pub async fn load_for(
    exec: &Executor,
    approval_id: &ApprovalId,
    viewer: &str,
) -> Result<ItemView, ConsoleError> {
    let request = exec.store.approval(approval_id).await?;
    if !crate::actions::may_decide(&exec.registry, viewer, &request) {
        return Err(ConsoleError::NotFound(approval_id.to_string()));
    }
    let mut v = load(exec, approval_id).await?;
    if v.request.status == ApprovalStatus::Pending && !v.expired() {
        let history = exec.store.approvals(None).await?;
        v.facts = crate::facts::look_up(exec, &v.request, &history).await;
        let all = exec.store.approvals(Some(ApprovalStatus::Pending)).await?;
        let queue = crate::queue::build_for(
            all,
            &exec.registry,
            exec.clock.now(),
            &crate::queue::Filter::default(),
            viewer,
        );
        let ids: Vec<&str> = queue
            .iter()
            .flat_map(|g| g.items.iter().map(|i| i.request.approval_id.as_str()))
            .collect();
        v.next = ids
            .iter()
            .position(|i| *i == approval_id)
            .and_then(|at| ids.get(at + 1).or(ids.get(at.wrapping_sub(1))))
            .or_else(|| ids.iter().find(|i| **i != approval_id))
            .filter(|i| **i != approval_id)
            .map(|i| i.to_string());
        if let Some(run) = v.request.run_id.clone() {
            v.run_offer = crate::bulk::run_offer(exec, viewer, &run).await?;
        }
        let dry = exec.dry_decide(&v.request).await?;
        // The reason may quote the agent's inputs: shown as text people may safely see.
        v.would_refuse = dry
            .refused_by()
            .map(|(rule, reason)| (crate::fmt::text(rule), crate::fmt::text(reason)));
    }
    mask_for(&exec.registry, viewer, &mut v);
    Ok(v)
}

/// Masks what `viewer` may not read in clear: the fields above their sensitivity ceiling
/// (inputs, the last approved call's, the duplicates'), decision facts of lookup tools above
/// it, and every hidden value wherever else it appears (the reason, the evidence, the run so
/// far, the canonical form).
fn mask_for(registry: &Registry, viewer: &str, v: &mut ItemView) {
    let tool = v.request.tool.clone();
    let mut hidden = crate::mask::hidden_inputs(registry, viewer, &tool, &v.request.inputs);
    if let Some(last) = &v.comparison.last {
        hidden.extend(crate::mask::hidden_inputs(
            registry,
            viewer,
            &tool,
            &last.inputs,
        ));
    }
    hidden.extend(crate::mask::facts(registry, viewer, &tool, &mut v.facts));
    if crate::mask::masks(registry, viewer, &tool) {
        for f in &mut v.fields {
            if crate::mask::is_masked_field(registry, &tool, &f.path) {
                f.value = crate::mask::value(&f.value);
                f.previous = f.previous.as_ref().map(crate::mask::value);
                f.masked = true;
            }
        }
        v.request.inputs = crate::mask::inputs(registry, viewer, &tool, &v.request.inputs);
        if let Some(last) = &mut v.comparison.last {
            last.inputs = crate::mask::inputs(registry, viewer, &tool, &last.inputs);
        }
        for d in &mut v.duplicates {
            d.inputs = crate::mask::inputs(registry, viewer, &tool, &d.inputs);
        }
    }
    if hidden.is_empty() {
        return;
    }
    let scrub = |t: &str| crate::mask::scrub(t, &hidden);
    v.request.reason = v.request.reason.as_deref().map(scrub);
    v.request.evidence = v.request.evidence.iter().map(|e| scrub(e)).collect();
    for s in v.earlier.iter_mut().chain(v.already_done.as_mut()) {
        s.evidence = s.evidence.iter().map(|e| scrub(e)).collect();
        if let Some(o) = &mut s.outcome {
            o.target_ref = o.target_ref.as_deref().map(scrub);
            o.error = o.error.as_deref().map(scrub);
        }
    }
    for f in &mut v.fields {
        if let Value::String(t) = &f.value
            && !f.masked
        {
            f.value = Value::String(scrub(t));
        }
    }
    if let Some((_, reason)) = &mut v.would_refuse {
        *reason = scrub(reason);
    }
    v.request.inputs = scrub_value(&v.request.inputs, &hidden);
    v.canonical = toolgate_core::canonical(&v.request.inputs);
}

/// `v` with every hidden value scrubbed from its strings.
fn scrub_value(v: &Value, hidden: &[String]) -> Value {
    match v {
        Value::String(s) => Value::String(crate::mask::scrub(s, hidden)),
        Value::Array(a) => Value::Array(a.iter().map(|x| scrub_value(x, hidden)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), scrub_value(x, hidden)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Loads one item for display.
pub async fn load(exec: &Executor, approval_id: &ApprovalId) -> Result<ItemView, ConsoleError> {
    let request = exec.store.approval(approval_id).await?;
    let all = exec.store.approvals(None).await?;
    let (fields, comparison) = compare(&exec.registry, &request, &all);
    let duplicates: Vec<ApprovalRequest> = crate::facts::duplicates(
        &exec.registry,
        &request,
        &all,
        exec.store.config().retention_ms(),
    )
    .into_iter()
    .cloned()
    .collect();
    let step = match exec.store.step(&request.subject_step()).await {
        Ok(s) => Some(s),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let run_steps = match &request.run_id {
        Some(run) => exec.store.steps(run).await?,
        None => Vec::new(),
    };
    let already_done = run_steps
        .iter()
        .find(|s| {
            step.is_none()
                && s.idem_key.as_str() == request.subject
                && s.status == toolgate_core::StepStatus::Done
        })
        .cloned();
    let earlier = match &request.run_id {
        Some(_) => run_steps
            .into_iter()
            .filter(|s| {
                s.step_id != request.subject && step.as_ref().is_none_or(|me| s.seq < me.seq)
            })
            .collect(),
        None => Vec::new(),
    };
    let reviews = match &step {
        Some(s) => exec.store.step_reviews(&s.step_id).await?,
        None => Vec::new(),
    };
    let tool = exec.registry.tool(&request.tool).map(|t| ToolInfo {
        version: t.config.version.clone(),
        description: t.config.description.clone(),
        effect: t.config.effect.to_string(),
        tier: t.config.tier.to_string(),
        sensitivity: t.config.sensitivity.to_string(),
        gate: t.config.gate.to_string(),
        approvers: t.config.approvers,
    });
    Ok(ItemView {
        canonical: toolgate_core::canonical(&request.inputs),
        step_hash: step.as_ref().map(|s| InputHash::of(&s.inputs)),
        tool,
        fields,
        comparison,
        step,
        earlier,
        reviews,
        already_done,
        would_refuse: None,
        facts: Vec::new(),
        duplicates,
        next: None,
        run_offer: None,
        now: exec.clock.now(),
        request,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_by_name() {
        for f in [
            "iban",
            "beneficiary_iban",
            "supplier.iban",
            "to",
            "reply_to",
            "webhook_url",
        ] {
            assert!(is_destination(None, f), "{f}");
        }
        for f in ["amount", "total", "supplier_id", "invoice_id", "reason"] {
            assert!(!is_destination(None, f), "{f}");
        }
    }

    #[test]
    fn leaves_flatten_objects_only() {
        let v = serde_json::json!({"a": 1, "b": {"c": "x", "d": [1, 2]}});
        let l = leaves(&v);
        assert_eq!(
            l.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
            vec!["a", "b.c", "b.d"]
        );
    }
}

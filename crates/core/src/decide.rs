//! The decision engine: one call in, one [`Decision`] out, with every check of the ordered list
//! evaluated and recorded, passed or failed, not only up to the first failure. The first failing
//! check in order is the reason. Nothing here mutates state: reserving budget and keys and
//! consuming approvals belong to the store, after an `Allow`.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::{self, WindowCheck, WindowView};
use crate::canon::InputHash;
use crate::config::{DestinationKind, GrantConfig, ToolConfig};
use crate::model::{Tier, Timestamp};
use crate::policy::{PolicyVerdict, RunCounts};
use crate::registry::{Registry, Tool};
use crate::rule::Rule;
use crate::token::{ApprovalClaims, ApprovalKeys, ApprovalToken, Expected};

/// The checks, in the order the engine evaluates and records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckName {
    Credential,
    Listed,
    /// An upstream tool is served only at the definition `toolgate.lock` pins for it.
    Pin,
    Schema,
    Destination,
    Purpose,
    TierSensitivity,
    RateLimit,
    Policy,
    Budget,
    Idempotency,
    Gate,
}

impl CheckName {
    pub const ALL: [CheckName; 12] = [
        CheckName::Credential,
        CheckName::Listed,
        CheckName::Pin,
        CheckName::Schema,
        CheckName::Destination,
        CheckName::Purpose,
        CheckName::TierSensitivity,
        CheckName::RateLimit,
        CheckName::Policy,
        CheckName::Budget,
        CheckName::Idempotency,
        CheckName::Gate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CheckName::Credential => "credential",
            CheckName::Listed => "listed",
            CheckName::Pin => "pin",
            CheckName::Schema => "schema",
            CheckName::Destination => "destination",
            CheckName::Purpose => "purpose",
            CheckName::TierSensitivity => "tier_sensitivity",
            CheckName::RateLimit => "rate_limit",
            CheckName::Policy => "policy",
            CheckName::Budget => "budget",
            CheckName::Idempotency => "idempotency",
            CheckName::Gate => "gate",
        }
    }
}

impl fmt::Display for CheckName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    /// Gated: passes only with approval.
    Gate,
    /// Could not be evaluated (the tool does not exist, or the inputs are not valid).
    Skip,
}

/// One check's record, kept in the trace and the audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: CheckName,
    pub outcome: Outcome,
    pub detail: String,
    /// The rule that decided this check (`grant.purpose`, a policy id, `schema.maximum`…).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rule: Option<Rule>,
}

/// What the engine decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny {
        check: CheckName,
        rule: Rule,
        reason: String,
    },
    NeedsApproval {
        rule: Rule,
        reason: String,
        /// Distinct approvers still needed.
        approvers_needed: u8,
        /// Approvers whose approvals verified already (two-person rule).
        approved_by: Vec<String>,
    },
}

/// What a shadow rule would have done to a call had it been enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShadowEffect {
    /// A shadow `forbid`: the call would have been refused.
    Deny,
    /// A shadow `@gate` policy, or a tool declared `gate: shadow`: it would have waited for a person.
    Gate,
}

impl ShadowEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            ShadowEffect::Deny => "deny",
            ShadowEffect::Gate => "gate",
        }
    }
}

/// A shadow rule that matched a call: evaluated on live traffic, recorded, never deciding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowRule {
    /// The policy id, or `gate.always` for a tool whose gate is in shadow.
    pub rule: Rule,
    pub would: ShadowEffect,
}

/// The decision with every check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub checks: Vec<Check>,
    pub input_hash: InputHash,
    /// Approvals that verified and authorise this call (to be consumed by the store).
    pub approvals: Vec<ApprovalClaims>,
    /// Shadow rules that would have refused or gated this call (they did not decide it).
    pub shadow: Vec<ShadowRule>,
    /// The registry version the decision was taken under.
    pub registry_version: String,
}

impl Decision {
    pub fn is_allow(&self) -> bool {
        matches!(self.verdict, Verdict::Allow)
    }

    pub fn check(&self, name: CheckName) -> &Check {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .expect("every decision records every check")
    }

    /// The rule that decided, if not a plain allow.
    pub fn rule(&self) -> Option<&str> {
        match &self.verdict {
            Verdict::Allow => None,
            Verdict::Deny { rule, .. } | Verdict::NeedsApproval { rule, .. } => Some(rule.as_str()),
        }
    }
}

/// One earlier decision in the run, as policies and rate limits see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorCall {
    pub tool: String,
    pub tier: Tier,
    pub outcome: PriorOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorOutcome {
    Allowed,
    Denied,
    Gated,
}

/// `n` earlier calls alike: how a store hands over a long run, counted rather than listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorCalls {
    pub call: PriorCall,
    pub n: i64,
}

/// The run so far: earlier calls listed one by one (`calls`), counted by kind (`counted`), or
/// both. Policies and rate limits see only the totals ([`RunHistory::counts`]), so the two
/// forms decide alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunHistory {
    pub calls: Vec<PriorCall>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counted: Vec<PriorCalls>,
}

impl RunHistory {
    /// A run given as its calls, one by one.
    pub fn of_calls(calls: Vec<PriorCall>) -> Self {
        RunHistory {
            calls,
            counted: Vec::new(),
        }
    }

    pub fn counts(&self, tool: &str) -> RunCounts {
        let mut c = RunCounts::default();
        let listed = self.calls.iter().map(|call| (call, 1));
        let counted = self.counted.iter().map(|g| (&g.call, g.n));
        for (call, n) in listed.chain(counted) {
            c.steps += n;
            match call.outcome {
                PriorOutcome::Denied => c.denials += n,
                PriorOutcome::Allowed => {
                    match call.tier {
                        Tier::Act => c.act_steps += n,
                        Tier::Spend => c.spend_steps += n,
                        Tier::Read => {}
                    }
                    if call.tool == tool {
                        c.tool_calls += n;
                    }
                }
                PriorOutcome::Gated => {}
            }
        }
        c
    }
}

/// Today's budget use, per principal and tier, as the store's ledger sees it, and what the
/// sliding windows of the tool's window budgets hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetView {
    pub used: HashMap<String, HashMap<Tier, u32>>,
    #[serde(default)]
    pub windows: WindowView,
}

impl BudgetView {
    pub fn used(&self, principal: &str, tier: Tier) -> u32 {
        self.used
            .get(principal)
            .and_then(|m| m.get(&tier))
            .copied()
            .unwrap_or(0)
    }

    pub fn set(&mut self, principal: &str, tier: Tier, used: u32) {
        self.used
            .entry(principal.to_string())
            .or_default()
            .insert(tier, used);
    }
}

/// What the idempotency store knows about this call's key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyState {
    /// Never seen: the call may run.
    #[default]
    Fresh,
    /// Done before: the stored outcome will be replayed.
    Done,
    /// An earlier attempt holds the key and has not settled (it is running, or its outcome is
    /// unknown until reconciliation): nothing runs again, and its state is reported.
    InFlight,
    /// The key was used with different canonical inputs.
    InputsDiffer,
    /// The key is shared beyond the caller (a tool scoped to a tree or the registry) and
    /// another principal made this operation already: refused, never answered with the other
    /// principal's outcome. [`CallRequest::elsewhere`] says who and when.
    Elsewhere,
    /// Every earlier attempt of this operation failed in a way worth retrying, and it was
    /// attempted [`MAX_ATTEMPTS`] times: it is not attempted again.
    Exhausted,
}

/// How often one operation is attempted, its first attempt included, before retries of it are
/// refused (each attempt failed in a way worth retrying).
pub const MAX_ATTEMPTS: u32 = 4;

impl IdempotencyState {
    /// Whether an earlier attempt of this very call ran or is running, so this one runs
    /// nothing: only the checks of who may ask (1–6) apply to it.
    pub fn ran_before(self) -> bool {
        matches!(self, IdempotencyState::Done | IdempotencyState::InFlight)
    }
}

/// Allowed destination values looked up at call time, by input field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestinationFacts {
    pub allowed: HashMap<String, Vec<String>>,
}

/// One lookup a call's destination check needs before it can be decided: the declared read
/// tool, the inputs it is asked with, and the field of its answer holding the allowed values.
/// Core names the lookups; the store makes them and hands the answers back as
/// [`DestinationFacts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationLookupCall {
    /// The input field whose destination is checked.
    pub field: String,
    /// The read tool declared in `destinations[].lookup.tool`.
    pub tool: String,
    /// The lookup's inputs: the `with` fields of the call, under the same names.
    pub inputs: Value,
    /// The field of the lookup's answer holding the list of allowed values.
    pub result: String,
}

impl DestinationLookupCall {
    /// The allowed values in a lookup's answer: `result` as a list of strings, at the top of
    /// the answer or inside an MCP `structuredContent`. `None` when the answer has no such list.
    pub fn allowed_in(&self, answer: &Value) -> Option<Vec<String>> {
        fn find<'v>(v: &'v Value, field: &str) -> Option<&'v Value> {
            let o = v.as_object()?;
            o.get(field).or_else(|| {
                o.values()
                    .find_map(|inner| inner.get("structuredContent").and_then(|s| s.get(field)))
            })
        }
        let list = find(answer, &self.result)?.as_array()?;
        list.iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect()
    }
}

/// The lookups `tool`'s destination check needs for `inputs`. None unless the inputs are valid
/// against the tool's schema (nothing the schema would refuse leaves through a lookup) and the
/// checked field is present (an absent optional field sends nothing anywhere).
pub fn destination_lookups(tool: &Tool, inputs: &Value) -> Vec<DestinationLookupCall> {
    let wanted: Vec<_> = tool
        .config
        .destinations
        .iter()
        .filter_map(|d| d.lookup.as_ref().map(|l| (d, l)))
        .filter(|(d, _)| inputs.get(&d.field).is_some())
        .collect();
    if wanted.is_empty() || tool.schema.validate(inputs).is_err() {
        return Vec::new();
    }
    wanted
        .into_iter()
        .map(|(d, l)| {
            let with: serde_json::Map<String, Value> = l
                .with
                .iter()
                .filter_map(|f| inputs.get(f).map(|v| (f.clone(), v.clone())))
                .collect();
            DestinationLookupCall {
                field: d.field.clone(),
                tool: l.tool.clone(),
                inputs: Value::Object(with),
                result: l.result.clone(),
            }
        })
        .collect()
}

fn never_used(_: &str) -> bool {
    false
}

/// How a tool's upstream definition stands against the pins of `toolgate.lock`, as the gateway
/// serves it at the moment of the call: the input of the pin check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Definition<'a> {
    /// Nothing upstream to pin: a built-in tool, or pinning switched off (benchmarks only).
    Local,
    /// Served at the pinned definition with this hash.
    Pinned(&'a str),
    /// The upstream has not been reached yet, so it could not be checked. Nothing can be
    /// forwarded to it until it is reached, and then only what the check lets through.
    Unreached,
    /// Not served: the definition changed, is not pinned, or its server is blocked; why.
    Blocked(&'a str),
}

impl<'a> Definition<'a> {
    /// The pinned definition hash the call (and any approval of it) is bound to.
    pub fn hash(self) -> Option<&'a str> {
        match self {
            Definition::Pinned(h) => Some(h),
            _ => None,
        }
    }
}

/// One call to decide.
#[derive(Clone, Copy)]
pub struct CallRequest<'a> {
    pub principal: &'a str,
    pub tool: &'a str,
    pub purpose: Option<&'a str>,
    pub reason: Option<&'a str>,
    /// Where the purpose came from (`_meta`, an argument, a default), named in the purpose
    /// check's detail so the record says who stated it. `None`: the caller stated it.
    pub purpose_from: Option<crate::why::PurposeSource>,
    pub inputs: &'a Value,
    /// The step id (planned) or call id (direct) an approval binds to.
    pub subject: &'a str,
    pub run: &'a RunHistory,
    pub budgets: &'a BudgetView,
    pub idempotency: IdempotencyState,
    /// For [`IdempotencyState::Elsewhere`]: who made the operation, and when (for the message).
    pub elsewhere: Option<&'a str>,
    /// Governance arguments (`purpose`, `reason` given as arguments) that do not pass: refused
    /// by the schema check with the inputs' own errors.
    pub argument_errors: &'a [crate::schema::FieldError],
    /// A person rejected this exact call (same subject, same inputs) within the retention:
    /// who and their note. A gated call is then refused with it instead of parked again.
    pub rejection: Option<&'a str>,
    pub approvals: &'a [ApprovalToken],
    pub destinations: &'a DestinationFacts,
    /// How the tool's upstream definition stands against `toolgate.lock` (the pin check).
    pub definition: Definition<'a>,
    /// Whether an approval nonce was consumed already (the store's ledger).
    pub nonce_used: &'a dyn Fn(&str) -> bool,
}

impl<'a> CallRequest<'a> {
    /// A request with an empty run, no budget use, no approvals and no looked-up facts.
    pub fn new(principal: &'a str, tool: &'a str, inputs: &'a Value) -> Self {
        static EMPTY_RUN: RunHistory = RunHistory {
            calls: Vec::new(),
            counted: Vec::new(),
        };
        static EMPTY_BUDGETS: std::sync::LazyLock<BudgetView> =
            std::sync::LazyLock::new(BudgetView::default);
        static EMPTY_FACTS: std::sync::LazyLock<DestinationFacts> =
            std::sync::LazyLock::new(DestinationFacts::default);
        CallRequest {
            principal,
            tool,
            purpose: None,
            reason: None,
            purpose_from: None,
            inputs,
            subject: "",
            run: &EMPTY_RUN,
            budgets: &EMPTY_BUDGETS,
            idempotency: IdempotencyState::Fresh,
            elsewhere: None,
            argument_errors: &[],
            rejection: None,
            approvals: &[],
            destinations: &EMPTY_FACTS,
            definition: Definition::Local,
            nonce_used: &never_used,
        }
    }
}

/// The engine: a registry and the approval keys. Cheap to construct, `Sync`, no interior state.
pub struct Engine<'r> {
    pub registry: &'r Registry,
    pub keys: &'r ApprovalKeys,
}

struct Recorder {
    checks: Vec<Check>,
}

impl Recorder {
    fn push(&mut self, name: CheckName, outcome: Outcome, detail: String, rule: Option<Rule>) {
        self.checks.push(Check {
            name,
            outcome,
            detail,
            rule,
        });
    }
    fn pass(&mut self, name: CheckName, detail: String) {
        self.push(name, Outcome::Pass, detail, None);
    }
    fn fail(&mut self, name: CheckName, rule: Rule, detail: String) {
        self.push(name, Outcome::Fail, detail, Some(rule));
    }
    fn skip(&mut self, name: CheckName, detail: &str) {
        self.push(name, Outcome::Skip, detail.to_string(), None);
    }
}

/// Check 3: an upstream tool only at the definition its pin names; false when the check failed (a
/// changed definition is not decided further: what its inputs mean may have changed with it).
fn check_pin(rec: &mut Recorder, definition: Definition<'_>) -> bool {
    match definition {
        Definition::Local => rec.skip(CheckName::Pin, "nothing upstream to pin"),
        Definition::Pinned(hash) => rec.pass(
            CheckName::Pin,
            format!("served at the definition toolgate.lock pins ({hash})"),
        ),
        Definition::Unreached => rec.skip(
            CheckName::Pin,
            "the upstream has not been reached, so it is checked when it is, before \
             anything is forwarded",
        ),
        Definition::Blocked(why) => {
            rec.fail(CheckName::Pin, Rule::PIN_BLOCKED, why.to_string());
            return false;
        }
    }
    true
}

/// Check 4: the inputs against the closed schema, and the governance arguments given with them;
/// whether they are valid.
fn check_schema(rec: &mut Recorder, tool: &Tool, req: &CallRequest<'_>) -> bool {
    let checked = match tool.schema.validate(req.inputs) {
        Ok(()) if req.argument_errors.is_empty() => Ok(()),
        Ok(()) => Err(req.argument_errors.to_vec()),
        Err(mut errors) => {
            errors.extend(req.argument_errors.iter().cloned());
            Err(errors)
        }
    };
    match checked {
        Ok(()) => {
            rec.pass(CheckName::Schema, "inputs match the schema".into());
            true
        }
        Err(errors) => {
            let rule = Rule::schema(&errors[0].constraint);
            let detail = errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            rec.fail(CheckName::Schema, rule, detail);
            false
        }
    }
}

/// Check 7: tier and sensitivity within a grant: one covering the purpose (`covering`), or, when
/// none does, any of the principal's.
fn check_grant_fits(
    rec: &mut Recorder,
    cfg: &ToolConfig,
    grants: &[GrantConfig],
    covering: Vec<&GrantConfig>,
) {
    let candidates: Vec<&GrantConfig> = if covering.is_empty() {
        grants.iter().collect()
    } else {
        covering
    };
    let fits = |g: &&GrantConfig| g.max_tier >= cfg.tier && g.max_sensitivity >= cfg.sensitivity;
    if candidates.iter().any(fits) {
        rec.pass(
            CheckName::TierSensitivity,
            format!(
                "tier {} and sensitivity {} within the grant",
                cfg.tier, cfg.sensitivity
            ),
        );
    } else if !candidates.iter().any(|g| g.max_tier >= cfg.tier) {
        let max = candidates.iter().map(|g| g.max_tier).max();
        rec.fail(
            CheckName::TierSensitivity,
            Rule::GRANT_TIER,
            format!(
                "tier {} exceeds the grant's max tier {}",
                cfg.tier,
                max.map_or("(no grant)".to_string(), |t| t.to_string())
            ),
        );
    } else {
        let max = candidates.iter().map(|g| g.max_sensitivity).max();
        rec.fail(
            CheckName::TierSensitivity,
            Rule::GRANT_SENSITIVITY,
            format!(
                "sensitivity {} exceeds the grant's max sensitivity {}",
                cfg.sensitivity,
                max.map_or("(no grant)".to_string(), |s| s.to_string())
            ),
        );
    }
}

/// Check 8: the tool's per-run rate limit has room (a call that ran before uses none of it).
fn check_rate_limit(rec: &mut Recorder, tool: &Tool, counts: RunCounts, ran_before: bool) {
    match tool.config.rate_limit {
        Some(_) if ran_before => rec.pass(
            CheckName::RateLimit,
            "this call ran before: nothing runs again, so it uses none of the run's allowance"
                .into(),
        ),
        Some(limit) if counts.tool_calls >= limit as i64 => rec.fail(
            CheckName::RateLimit,
            Rule::RATE_LIMIT,
            format!(
                "rate limit: '{}' allows {limit} call(s) per run and {} were made",
                tool.name(),
                counts.tool_calls
            ),
        ),
        Some(limit) => rec.pass(
            CheckName::RateLimit,
            format!("{} of {limit} calls per run used", counts.tool_calls),
        ),
        None => rec.pass(CheckName::RateLimit, "no per-run limit".into()),
    }
}

/// Check 11: idempotency, as the store sees this call's key.
fn check_idempotency(rec: &mut Recorder, req: &CallRequest<'_>) {
    match req.idempotency {
        IdempotencyState::Fresh => rec.pass(CheckName::Idempotency, "new key".into()),
        IdempotencyState::Done => rec.pass(
            CheckName::Idempotency,
            "this key is done: the stored outcome is replayed, nothing runs again".into(),
        ),
        IdempotencyState::InFlight => rec.pass(
            CheckName::Idempotency,
            "an earlier attempt of this call has not settled: nothing runs again, its state is \
             reported"
                .into(),
        ),
        IdempotencyState::Elsewhere => rec.fail(
            CheckName::Idempotency,
            Rule::IDEMPOTENCY_ELSEWHERE,
            format!(
                "this operation was already made {}; it is done once, whoever asks, and its \
                 outcome is not yours to read",
                req.elsewhere.unwrap_or("by another principal")
            ),
        ),
        IdempotencyState::InputsDiffer => rec.fail(
            CheckName::Idempotency,
            Rule::IDEMPOTENCY_INPUTS_DIFFER,
            "this idempotency key was used with different inputs; a changed call is a new step"
                .into(),
        ),
        IdempotencyState::Exhausted => rec.fail(
            CheckName::Idempotency,
            Rule::ATTEMPTS_EXHAUSTED,
            format!("this call was attempted {MAX_ATTEMPTS} times; it will not be retried again"),
        ),
    }
}

/// The rule that gates the call (check 12), if one does: a tool that always needs a person,
/// else a `@gate` policy that matched, else a destination off its list declared
/// `unknown: gate`.
fn gate_rule(
    cfg: &ToolConfig,
    policies: Option<&PolicyVerdict>,
    destination: Option<&DestinationGate>,
) -> Option<Rule> {
    if cfg.gate == crate::model::Gate::Always {
        return Some(Rule::GATE_ALWAYS);
    }
    policies
        .and_then(|v| v.gated_by.first().map(Rule::new))
        .or_else(|| destination.map(|g| g.rule.clone()))
}

/// Appends what shadow rules would have done to the detail of `check` (already recorded), so
/// the trace shows it beside the check that enforces such rules.
fn note_shadow(rec: &mut Recorder, check: CheckName, shadow: &[ShadowRule]) {
    if shadow.is_empty() {
        return;
    }
    let notes: Vec<String> = shadow
        .iter()
        .map(|s| match s.would {
            ShadowEffect::Deny => format!("'{}' would refuse", s.rule),
            ShadowEffect::Gate => format!("'{}' would ask for approval", s.rule),
        })
        .collect();
    if let Some(c) = rec.checks.iter_mut().rev().find(|c| c.name == check) {
        c.detail
            .push_str(&format!("; shadow, not enforced: {}", notes.join(", ")));
    }
}

/// The answer for a tool that is not there, identical whether it does not exist or is not
/// listed for the caller's role.
pub fn unknown_tool_message(tool: &str) -> String {
    format!(
        "unknown tool '{}'",
        crate::clip::clip(tool, crate::clip::NAME_CHARS)
    )
}

impl<'r> Engine<'r> {
    pub fn new(registry: &'r Registry, keys: &'r ApprovalKeys) -> Self {
        Engine { registry, keys }
    }

    /// Decides one call at time `now`: the twelve checks in their order, each recorded. A
    /// failed credential, listed or pin check ends the decision (nothing after it means
    /// anything); every later check is recorded whatever came before it.
    pub fn decide(&self, req: &CallRequest<'_>, now: Timestamp) -> Decision {
        let mut rec = Recorder {
            checks: Vec::with_capacity(CheckName::ALL.len()),
        };
        let input_hash = InputHash::of(req.inputs);
        let version = self.registry.version.hash.clone();

        let Some(principal) = self.check_credential(&mut rec, req) else {
            return self.finish_early(rec, CheckName::Credential, input_hash, version);
        };
        let Some(tool) = self.check_listed(&mut rec, req, principal.role()) else {
            return self.finish_early(rec, CheckName::Listed, input_hash, version);
        };
        if !check_pin(&mut rec, req.definition) {
            return self.finish_early(rec, CheckName::Pin, input_hash, version);
        }
        let cfg = &tool.config;
        let inputs_valid = check_schema(&mut rec, tool, req);
        let destination_gate = self.check_destinations(&mut rec, tool, req, inputs_valid);
        let covering = self.check_purpose(&mut rec, tool, principal.config.grants.as_slice(), req);
        check_grant_fits(&mut rec, cfg, &principal.config.grants, covering);
        let counts = req.run.counts(tool.name());
        let ran_before = req.idempotency.ran_before();
        check_rate_limit(&mut rec, tool, counts, ran_before);
        // What the tool's window budgets hold (policies see it; the budget check judges it).
        let windows = if inputs_valid {
            budget::check(
                self.registry,
                tool,
                principal,
                req.inputs,
                &req.budgets.windows,
                now,
            )
        } else {
            None
        };
        let policies = (inputs_valid && !ran_before)
            .then(|| self.evaluate_policies(principal, tool, req, counts, windows.as_ref()));
        self.check_policies(&mut rec, policies.as_ref(), ran_before);
        let mut shadow = self.shadow_rules(policies.as_ref());
        note_shadow(&mut rec, CheckName::Policy, &shadow);
        // A replay runs nothing and reserves nothing (its first run was charged), so it is not
        // refused for a budget its own first run filled.
        if ran_before {
            rec.pass(
                CheckName::Budget,
                "this call ran before: nothing runs again, so no budget is reserved".into(),
            );
        } else {
            self.check_budget(&mut rec, principal, cfg.tier, req.budgets, windows.as_ref());
        }
        check_idempotency(&mut rec, req);
        let gate_rule = gate_rule(cfg, policies.as_ref(), destination_gate.as_ref());
        let gate = gate_rule.as_ref().map(|rule| GateRule {
            rule,
            reason: destination_gate
                .as_ref()
                .filter(|g| g.rule == *rule)
                .map(|g| g.reason.as_str()),
        });
        let (approvals, gate_passed) = self.check_gate(&mut rec, tool, req, &input_hash, gate, now);
        if cfg.gate == crate::model::Gate::Shadow {
            let tool_gate = ShadowRule {
                rule: Rule::GATE_ALWAYS,
                would: ShadowEffect::Gate,
            };
            note_shadow(&mut rec, CheckName::Gate, std::slice::from_ref(&tool_gate));
            shadow.push(tool_gate);
        }

        let verdict = self.verdict(&rec, tool, &approvals);
        let approvals = if gate_passed { approvals } else { Vec::new() };
        Decision {
            verdict,
            checks: rec.checks,
            input_hash,
            approvals,
            shadow,
            registry_version: version,
        }
    }

    /// Check 1: the credential names a principal (authentication happened at the edge).
    fn check_credential(
        &self,
        rec: &mut Recorder,
        req: &CallRequest<'_>,
    ) -> Option<&'r crate::registry::Principal> {
        let Some(principal) = self.registry.principal(req.principal) else {
            rec.fail(
                CheckName::Credential,
                Rule::CREDENTIAL,
                format!("no principal '{}'", req.principal),
            );
            return None;
        };
        rec.pass(
            CheckName::Credential,
            format!("principal '{}' (role {})", principal.id(), principal.role()),
        );
        Some(principal)
    }

    /// Check 2: the tool exists and is listed for the role; otherwise it does not exist.
    fn check_listed(
        &self,
        rec: &mut Recorder,
        req: &CallRequest<'_>,
        role: &str,
    ) -> Option<&'r Tool> {
        let tool = match self.registry.tool(req.tool) {
            Some(t) if t.is_listed_for(role) => t,
            _ => {
                rec.fail(
                    CheckName::Listed,
                    Rule::TOOL_UNKNOWN,
                    unknown_tool_message(req.tool),
                );
                return None;
            }
        };
        rec.pass(
            CheckName::Listed,
            format!(
                "'{}' v{} is listed for role {role}",
                tool.name(),
                tool.config.version
            ),
        );
        Some(tool)
    }

    /// Check 9: policies, over the call and the run so far (`verdict`: `None` when they were not
    /// asked).
    fn check_policies(
        &self,
        rec: &mut Recorder,
        verdict: Option<&PolicyVerdict>,
        ran_before: bool,
    ) {
        match verdict {
            None if ran_before => rec.pass(
                CheckName::Policy,
                "this call ran before: nothing runs again, so no policy is asked".into(),
            ),
            None => rec.skip(CheckName::Policy, "not evaluated: the inputs are not valid"),
            Some(v) if !v.errors.is_empty() => rec.fail(
                CheckName::Policy,
                Rule::POLICY_ERROR,
                format!(
                    "policy evaluation failed, so the call is refused: {}",
                    v.errors.join("; ")
                ),
            ),
            Some(v) if !v.forbidden_by.is_empty() => {
                let id = &v.forbidden_by[0];
                let why = self.policy_reason(id);
                rec.fail(
                    CheckName::Policy,
                    Rule::new(id),
                    format!("policy '{id}' objects{why}"),
                );
            }
            Some(v) if !v.gated_by.is_empty() => rec.push(
                CheckName::Policy,
                Outcome::Gate,
                format!(
                    "policy '{}' asks for approval{}",
                    v.gated_by[0],
                    self.policy_reason(&v.gated_by[0])
                ),
                Some(Rule::new(&v.gated_by[0])),
            ),
            Some(_) => rec.pass(CheckName::Policy, "no policy objects".into()),
        }
    }

    /// The shadow policies that matched, and what each would have done.
    fn shadow_rules(&self, verdict: Option<&PolicyVerdict>) -> Vec<ShadowRule> {
        let Some(v) = verdict else {
            return Vec::new();
        };
        v.shadow_matched
            .iter()
            .map(|id| ShadowRule {
                rule: Rule::new(id),
                would: match self.registry.policies.info(id) {
                    Some(p) if p.gate => ShadowEffect::Gate,
                    _ => ShadowEffect::Deny,
                },
            })
            .collect()
    }

    /// `": <the policy's @reason>"`, or nothing.
    fn policy_reason(&self, id: &str) -> String {
        self.registry
            .policies
            .info(id)
            .and_then(|p| p.reason.as_deref())
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    }

    fn finish_early(
        &self,
        mut rec: Recorder,
        failed: CheckName,
        input_hash: InputHash,
        registry_version: String,
    ) -> Decision {
        for name in CheckName::ALL {
            if !rec.checks.iter().any(|c| c.name == name) {
                rec.skip(name, &format!("not evaluated: the {failed} check failed"));
            }
        }
        let first = &rec
            .checks
            .iter()
            .find(|c| c.name == failed)
            .expect("recorded");
        Decision {
            verdict: Verdict::Deny {
                check: failed,
                rule: first.rule.clone().unwrap_or_default(),
                reason: first.detail.clone(),
            },
            checks: rec.checks,
            input_hash,
            approvals: Vec::new(),
            shadow: Vec::new(),
            registry_version,
        }
    }

    fn verdict(&self, rec: &Recorder, tool: &Tool, approved: &[ApprovalClaims]) -> Verdict {
        if let Some(c) = rec.checks.iter().find(|c| c.outcome == Outcome::Fail) {
            return Verdict::Deny {
                check: c.name,
                rule: c.rule.clone().unwrap_or_default(),
                reason: c.detail.clone(),
            };
        }
        let gate = rec
            .checks
            .iter()
            .find(|c| c.name == CheckName::Gate && c.outcome == Outcome::Gate);
        match gate {
            Some(c) => Verdict::NeedsApproval {
                rule: c.rule.clone().unwrap_or_default(),
                reason: c.detail.clone(),
                approvers_needed: self
                    .registry
                    .approvers(&tool.config.name, c.rule.as_deref().unwrap_or_default())
                    .count
                    .saturating_sub(approved.len() as u8),
                approved_by: approved.iter().map(|c| c.approver.clone()).collect(),
            },
            None => Verdict::Allow,
        }
    }

    /// Check 4. Returns the gate a destination off its list asks for, when it is declared
    /// `unknown: gate` (every other failure is recorded as a refusal).
    fn check_destinations(
        &self,
        rec: &mut Recorder,
        tool: &Tool,
        req: &CallRequest<'_>,
        inputs_valid: bool,
    ) -> Option<DestinationGate> {
        let cfg = &tool.config;
        if cfg.destinations.is_empty() {
            rec.pass(CheckName::Destination, "no destination constraints".into());
            return None;
        }
        if !inputs_valid {
            rec.skip(
                CheckName::Destination,
                "not evaluated: the inputs are not valid",
            );
            return None;
        }
        let mut passed = Vec::new();
        let mut unlisted: Vec<String> = Vec::new();
        let mut first_gate: Option<Rule> = None;
        for d in &cfg.destinations {
            let Some(value) = req.inputs.get(&d.field) else {
                continue; // optional and absent: nothing goes anywhere through it
            };
            let values: Vec<&str> = match value {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let allowed: Vec<String> = if let Some(lookup) = &d.lookup {
                match req.destinations.allowed.get(&d.field) {
                    Some(list) => list.clone(),
                    None => {
                        rec.fail(
                            CheckName::Destination,
                            Rule::destination(&d.field),
                            format!(
                                "the allowed values for '{}' could not be looked up through {}, so \
                                 the call is refused; try again later, or ask a person",
                                d.field, lookup.tool
                            ),
                        );
                        return None;
                    }
                }
            } else {
                d.allowed.clone()
            };
            for v in values {
                let part = match d.kind {
                    DestinationKind::EmailDomain => {
                        v.rsplit_once('@').map(|(_, dom)| dom.to_ascii_lowercase())
                    }
                    DestinationKind::UrlHost => url_host(v),
                    DestinationKind::Exact => Some(v.to_string()),
                };
                let ok = part
                    .as_deref()
                    .is_some_and(|p| allowed.iter().any(|a| a.eq_ignore_ascii_case(p)));
                if !ok {
                    let what = match d.kind {
                        DestinationKind::EmailDomain => "domain",
                        DestinationKind::UrlHost => "host",
                        DestinationKind::Exact => "value",
                    };
                    if d.unknown == crate::config::UnknownDestination::Gate {
                        // Not refused: a person decides (check 12), seeing exactly this value.
                        unlisted.push(format!(
                            "'{}' {what} {}",
                            d.field,
                            part.as_deref().unwrap_or(v)
                        ));
                        first_gate.get_or_insert_with(|| Rule::destination(&d.field));
                        continue;
                    }
                    rec.fail(
                        CheckName::Destination,
                        Rule::destination(&d.field),
                        format!(
                            "'{}' rejected: {what} {} is not allowed here. Allowed: {}. Use a destination on record, or ask a person to add one",
                            d.field,
                            part.as_deref().unwrap_or(v),
                            if allowed.is_empty() { "(none on record)".to_string() } else { allowed.join(", ") }
                        ),
                    );
                    return None;
                }
            }
            passed.push(d.field.as_str());
        }
        if let Some(rule) = first_gate {
            let reason = format!(
                "destination not on the list: {}; a person must approve it",
                unlisted.join(", ")
            );
            rec.push(
                CheckName::Destination,
                Outcome::Gate,
                reason.clone(),
                Some(rule.clone()),
            );
            return Some(DestinationGate { rule, reason });
        }
        rec.pass(
            CheckName::Destination,
            if passed.is_empty() {
                "no destination given".into()
            } else {
                format!("destinations allowed: {}", passed.join(", "))
            },
        );
        None
    }

    fn check_purpose<'g>(
        &self,
        rec: &mut Recorder,
        tool: &Tool,
        grants: &'g [GrantConfig],
        req: &CallRequest<'_>,
    ) -> Vec<&'g GrantConfig> {
        let cfg = &tool.config;
        let Some(purpose) = req.purpose.filter(|p| !p.is_empty()) else {
            let how = if tool.accepts(crate::config::CallField::Purpose) {
                "give it as the `purpose` argument (or in _meta.purpose)"
            } else {
                "give it in _meta.purpose, or ask the operator for a default purpose on your key, \
                 principal or role"
            };
            rec.fail(
                CheckName::Purpose,
                Rule::PURPOSE_MISSING,
                format!(
                    "no purpose given; '{}' may be used for: {}; {how}",
                    cfg.name,
                    cfg.purposes.join(", ")
                ),
            );
            return Vec::new();
        };
        let covering: Vec<&GrantConfig> = grants
            .iter()
            .filter(|g| {
                g.purposes.iter().any(|p| p == purpose)
                    && cfg.scopes.iter().all(|s| g.scopes.contains(s))
            })
            .collect();
        if !cfg.purposes.iter().any(|p| p == purpose) {
            rec.fail(
                CheckName::Purpose,
                Rule::TOOL_PURPOSE,
                format!(
                    "'{}' is not for purpose '{purpose}', so it is not granted for purpose '{purpose}'; its purposes: {}",
                    cfg.name,
                    cfg.purposes.join(", ")
                ),
            );
        } else if covering.is_empty() {
            // Name what is missing from the grant for this purpose that comes closest; scopes
            // held under other grants do not count (one grant must cover the whole tool).
            let missing: Vec<&String> = grants
                .iter()
                .filter(|g| g.purposes.iter().any(|p| p == purpose))
                .map(|g| {
                    cfg.scopes
                        .iter()
                        .filter(|s| !g.scopes.contains(s))
                        .collect::<Vec<_>>()
                })
                .min_by_key(Vec::len)
                .unwrap_or_else(|| cfg.scopes.iter().collect());
            rec.fail(
                CheckName::Purpose,
                Rule::GRANT_PURPOSE,
                format!(
                    "scopes {} not granted for purpose '{purpose}'",
                    quoted(missing)
                ),
            );
        } else if cfg.effect != crate::model::Effect::Read
            && req.reason.is_none_or(|r| r.trim().is_empty())
        {
            let how = match &cfg.reason_from {
                Some(field) => format!("its '{field}' input is the reason"),
                None if tool.accepts(crate::config::CallField::Reason) => {
                    "give one as the `reason` argument (or in _meta.reason)".to_string()
                }
                None => "give one in _meta.reason".to_string(),
            };
            rec.fail(
                CheckName::Purpose,
                Rule::REASON_MISSING,
                format!("'{}' changes state, so it needs a reason: {how}", cfg.name),
            );
        } else {
            use crate::why::PurposeSource as S;
            let from = match req.purpose_from {
                None | Some(S::Meta) => "",
                Some(S::Argument) => " (given as an argument)",
                Some(S::Credential) => " (the default of the caller's key)",
                Some(S::Principal) => " (the caller's default purpose)",
                Some(S::Role) => " (the default purpose of the caller's role)",
                Some(S::OnlyGranted) => {
                    " (the only purpose the caller's grants allow for this tool)"
                }
            };
            rec.pass(
                CheckName::Purpose,
                format!(
                    "scopes {} granted for purpose '{purpose}'{from}",
                    quoted(&cfg.scopes)
                ),
            );
        }
        covering
    }

    fn evaluate_policies(
        &self,
        principal: &crate::registry::Principal,
        tool: &Tool,
        req: &CallRequest<'_>,
        counts: RunCounts,
        windows: Option<&WindowCheck>,
    ) -> PolicyVerdict {
        let policies = &self.registry.policies;
        // No policy reads this tool's inputs, so none need converting: a value Cedar cannot
        // hold exactly only matters to a rule that could read it.
        if !policies.apply_to(&tool.action) {
            return PolicyVerdict::default();
        }
        match crate::policy::call_context(tool, req, counts, windows) {
            Ok(context) => {
                policies.evaluate(&principal.entity, &tool.action, &tool.resource, context)
            }
            Err(e) => PolicyVerdict {
                errors: vec![format!("inputs cannot be given to policies: {e}")],
                ..PolicyVerdict::default()
            },
        }
    }

    fn check_budget(
        &self,
        rec: &mut Recorder,
        principal: &crate::registry::Principal,
        tier: Tier,
        budgets: &BudgetView,
        windows: Option<&WindowCheck>,
    ) {
        let chain =
            std::iter::once(principal.id()).chain(principal.ancestors.iter().map(String::as_str));
        let mut notes = Vec::new();
        for id in chain.filter(|_| tier != Tier::Read) {
            let Some(p) = self.registry.principal(id) else {
                continue;
            };
            let Some(limit) = p.budget(tier) else {
                continue;
            };
            let used = budgets.used(id, tier);
            if used >= limit {
                let whose = if id == principal.id() {
                    format!("'{id}'")
                } else {
                    format!("'{id}' (which '{}' draws from)", principal.id())
                };
                rec.fail(
                    CheckName::Budget,
                    Rule::daily_budget(tier),
                    format!(
                        "daily {tier} budget of {whose} is used up: {used} of {limit} today; it frees at 00:00 UTC"
                    ),
                );
                return;
            }
            notes.push(format!("{id}: {used}/{limit}"));
        }
        // Then the window budgets, whose refusal says what is left and when it frees up.
        let mut window_notes = String::new();
        if let Some(w) = windows {
            if let Some((rule, detail)) = &w.failure {
                rec.fail(CheckName::Budget, rule.clone(), detail.clone());
                return;
            }
            window_notes = format!("; window budgets {}", w.notes.join(", "));
        }
        rec.pass(
            CheckName::Budget,
            if tier == Tier::Read {
                format!("read is not budgeted{window_notes}")
            } else if notes.is_empty() {
                format!("no daily {tier} budget set{window_notes}")
            } else {
                format!(
                    "{tier} budget used today {}{window_notes}",
                    notes.join(", ")
                )
            },
        );
    }

    /// Whether an approval decided under `claims.registry_version` still authorises a call the
    /// current registry gates under `rule`: always under the same version; after a reload only
    /// when the call is gated under the same rule it was approved for.
    fn carries_over(&self, claims: &ApprovalClaims, rule: &str) -> bool {
        match claims.registry_version.as_deref() {
            None => true,
            Some(v) if v == self.registry.version.hash => true,
            Some(_) => claims.gate_rule.as_deref() == Some(rule),
        }
    }

    fn check_gate(
        &self,
        rec: &mut Recorder,
        tool: &Tool,
        req: &CallRequest<'_>,
        input_hash: &InputHash,
        gate: Option<GateRule<'_>>,
        now: Timestamp,
    ) -> (Vec<ApprovalClaims>, bool) {
        let Some(GateRule { rule, reason }) = gate else {
            rec.pass(CheckName::Gate, "no approval needed".into());
            return (Vec::new(), true);
        };
        if req.idempotency.ran_before() {
            // A replay executes nothing: the approved call already ran once under its approval.
            rec.push(
                CheckName::Gate,
                Outcome::Pass,
                format!("gated by {rule}, but this call ran before: nothing runs again"),
                Some(rule.clone()),
            );
            return (Vec::new(), true);
        }
        let cfg = &tool.config;
        let expected = Expected {
            subject: req.subject,
            tool: &cfg.name,
            tool_version: &cfg.version,
            input_hash,
            registry_version: None,
            definition_hash: req.definition.hash(),
        };
        let mut valid: Vec<ApprovalClaims> = Vec::new();
        let mut refused = Vec::new();
        for token in req.approvals {
            match self.keys.verify(token, &expected, now, req.nonce_used) {
                Ok(claims) if !self.carries_over(&claims, rule) => refused.push(format!(
                    "approved under registry version {} for rule {}, but the current rules ({}) gate \
                     this call under rule {rule}: it needs a new approval",
                    short_version(claims.registry_version.as_deref().unwrap_or_default()),
                    claims.gate_rule.as_deref().unwrap_or("(unrecorded)"),
                    short_version(&self.registry.version.hash),
                )),
                Ok(claims) => {
                    // Segregation of duties: the requester (and the person behind it) never
                    // counts, and only the gate's own approvers do.
                    if let Err(why) =
                        self.registry
                            .may_approve(&claims.approver, req.principal, &cfg.name, rule)
                    {
                        refused.push(why.to_string());
                    } else if valid.iter().any(|v| v.approver == claims.approver) {
                        refused.push(format!(
                            "'{}' already approved; a second approver must be someone else",
                            claims.approver
                        ));
                    } else {
                        valid.push(claims);
                    }
                }
                Err(e) => refused.push(e.to_string()),
            }
        }
        let needed = self.registry.approvers(&cfg.name, rule).count as usize;
        if valid.len() >= needed {
            let by: Vec<&str> = valid.iter().map(|c| c.approver.as_str()).collect();
            rec.push(
                CheckName::Gate,
                Outcome::Pass,
                format!("approved by {} under rule {rule}", by.join(" and ")),
                Some(rule.clone()),
            );
            return (valid, true);
        }
        if let Some(rejection) = req.rejection {
            // A person already said no to this exact call: the retry hears it, and no new
            // request is raised for the same thing.
            rec.fail(
                CheckName::Gate,
                Rule::APPROVAL_REJECTED,
                format!(
                    "a person rejected this exact call under rule {rule} ({rejection}); it will not \
                     run, and asking again with the same inputs gets the same answer"
                ),
            );
            return (Vec::new(), false);
        }
        let why = match reason {
            _ if *rule == Rule::GATE_ALWAYS => {
                format!(": '{}' always needs a person's approval", cfg.name)
            }
            Some(r) => format!(": {r}"),
            None => self.policy_reason(rule),
        };
        let mut detail = format!(
            "needs approval by {} person(s) under rule {rule}{why}",
            needed - valid.len()
        );
        if !valid.is_empty() {
            let by: Vec<&str> = valid.iter().map(|c| c.approver.as_str()).collect();
            detail.push_str(&format!("; approved first by {}", by.join(", ")));
        }
        if !refused.is_empty() {
            detail.push_str(&format!("; approval refused: {}", refused.join("; ")));
        }
        rec.push(CheckName::Gate, Outcome::Gate, detail, Some(rule.clone()));
        (valid, false)
    }
}

/// The rule that gates a call, and its reason when it is not a policy's (`@reason`).
#[derive(Clone, Copy)]
struct GateRule<'a> {
    rule: &'a Rule,
    reason: Option<&'a str>,
}

/// A destination off its list that a person may let through (`unknown: gate`).
struct DestinationGate {
    /// `destination.<field>`
    rule: Rule,
    reason: String,
}

/// The first characters of a version hash, enough to tell versions apart in a message.
fn short_version(v: &str) -> &str {
    let hex = v.strip_prefix("sha256:").unwrap_or(v);
    &hex[..hex.len().min(12)]
}

/// A list of names as refusals print them: `['invoices:write', 'customers:read']`.
fn quoted<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    let inner: Vec<String> = names.into_iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", inner.join(", "))
}

pub(crate) fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if host.starts_with('[') {
        host.split_once(']').map(|(h, _)| &h[1..])?
    } else {
        host.split(':').next()?
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

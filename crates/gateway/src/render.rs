//! From the store's answer to what the model reads. A refusal the model can correct is a tool
//! result with `isError: true` that names what fired, what would pass and the legitimate next
//! move (a validation failure the model can read and correct); a parked call says how to follow
//! it; a replay returns the stored result. Only a tool that does not exist for the caller is a
//! protocol error, worded exactly like a tool that does not exist at all.

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, ResultType};
use serde_json::{Value, json};
use toolgate_core::decide::unknown_tool_message;
use toolgate_core::{
    ApprovalId, CheckName, Decision, Outcome, Rule, StepStatus, Verdict, canonical,
};
use toolgate_store::{CallResult, CallStatus, Step, StepOutcome};

/// The key under which a result that is not plain structured content is stored whole.
const WHOLE: &str = "$mcp";

/// How an upstream result is kept by the store: its structured content when that is all it
/// says (so reconciliation and redaction see plain fields), otherwise the whole MCP result.
pub fn to_stored(result: &CallToolResult) -> Value {
    if let Some(s) = &result.structured_content {
        let plain = match result.content.as_slice() {
            [] => true,
            [only] => only
                .as_text()
                .and_then(|t| serde_json::from_str::<Value>(&t.text).ok())
                .is_some_and(|v| &v == s),
            _ => false,
        };
        if plain {
            return s.clone();
        }
    }
    let mut whole = serde_json::to_value(result).unwrap_or(Value::Null);
    if let Some(o) = whole.as_object_mut() {
        o.remove("resultType");
    }
    json!({ WHOLE: whole })
}

/// The MCP result for a stored one (see [`to_stored`]), always with `resultType` filled: an
/// upstream on an older revision sends none, and newer clients reject a result without it.
/// Structured content is echoed as canonical JSON text, so a replay reads byte for byte like
/// the first answer.
pub fn from_stored(v: &Value) -> CallToolResult {
    let structured = |v: &Value| {
        let mut r = CallToolResult::success(vec![ContentBlock::text(canonical(v))]);
        r.structured_content = Some(v.clone());
        r
    };
    let mut r = match v
        .as_object()
        .and_then(|o| o.get(WHOLE).filter(|_| o.len() == 1))
    {
        Some(whole) => serde_json::from_value::<CallToolResult>(whole.clone())
            .unwrap_or_else(|_| structured(v)),
        None => structured(v),
    };
    r.result_type = Some(ResultType::COMPLETE);
    r
}

/// A tool result the model reads as a failure: text for it, and the same facts as structured
/// content for programs.
fn readable_error(text: String, facts: Value) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(facts);
    r.result_type = Some(ResultType::COMPLETE);
    r
}

/// A refusal as the caller reads it, whatever refused: one of the engine's checks, a plan, a
/// preview, a built-in's own inputs. Every refusal toolgate answers is rendered here, so they
/// all read alike: the text names the tool, the check, the rule, why, and the legitimate next
/// move; the structured content holds the same facts (`status: "refused"`, `tool`, `check`,
/// `rule`, `reason`, `next`, and what the refusal adds, such as `audit_seq`).
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    tool: String,
    check: String,
    rule: Rule,
    reason: String,
    /// What the text says of why, when more than the one reason (every failed check).
    said: Option<String>,
    next: Option<String>,
    facts: serde_json::Map<String, Value>,
}

impl Refusal {
    pub(crate) fn new(
        tool: impl Into<String>,
        check: impl ToString,
        rule: impl Into<Rule>,
        reason: impl Into<String>,
    ) -> Self {
        Refusal {
            tool: tool.into(),
            check: check.to_string(),
            rule: rule.into(),
            reason: reason.into(),
            said: None,
            next: None,
            facts: serde_json::Map::new(),
        }
    }

    /// The engine's refusal of `tool`: the check its verdict names, and every check that failed.
    fn of_decision(tool: &str, check: CheckName, rule: &Rule, reason: &str, d: &Decision) -> Self {
        let failed = failed_checks(d);
        let all: Vec<&str> = failed.iter().filter_map(|f| f["detail"].as_str()).collect();
        let mut r = Refusal::new(tool, check, rule.clone(), reason).next(next_moves(check));
        if all.len() > 1 {
            r.said = Some(all.join("; "));
        }
        r.fact("failed", failed)
    }

    /// What the caller may do instead.
    pub(crate) fn next(mut self, next: impl Into<String>) -> Self {
        self.next = Some(next.into());
        self
    }

    /// A fact of this refusal for programs (`audit_seq`, `plan_id`, …).
    pub(crate) fn fact(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.facts.insert(key.to_string(), value.into());
        self
    }

    /// The rule that refused.
    pub(crate) fn rule(&self) -> &Rule {
        &self.rule
    }

    pub(crate) fn into_result(self) -> CallToolResult {
        let Refusal {
            tool,
            check,
            rule,
            reason,
            said,
            next,
            facts,
        } = self;
        let mut text = format!(
            "'{tool}' was refused by the {check} check (rule {rule}): {}.",
            said.as_deref().unwrap_or(&reason).trim_end_matches('.')
        );
        if let Some(next) = &next {
            text.push_str(&format!(" Next: {}.", next.trim_end_matches('.')));
        }
        let mut v = serde_json::Map::new();
        v.insert("status".into(), "refused".into());
        v.insert("tool".into(), tool.into());
        v.insert("check".into(), check.into());
        v.insert("rule".into(), String::from(rule).into());
        v.insert("reason".into(), reason.into());
        if let Some(next) = next {
            v.insert("next".into(), next.into());
        }
        v.extend(facts);
        readable_error(text, Value::Object(v))
    }
}

/// What the caller may legitimately do after a refusal by `check`.
fn next_moves(check: CheckName) -> &'static str {
    match check {
        CheckName::Pin => {
            "nothing was sent upstream; the tool is unavailable until an operator reviews the change \
             to its definition, so do not retry it — tell the user it is blocked"
        }
        CheckName::Schema => {
            "correct the named field(s) to a value that passes and call again; do not invent values \
             you were not given — if the right value is unknown, ask for it"
        }
        CheckName::Destination => {
            "use one of the allowed destinations listed above; if the intended recipient is not \
             among them, stop and ask a person to verify it — it cannot be added from here"
        }
        CheckName::Purpose => {
            "if the purpose or the reason was missing, call again with them (as the `purpose` and \
             `reason` arguments where the tool lists them, otherwise in _meta); if the purpose is \
             not granted for this tool, this call is not yours to make — report it instead of \
             retrying"
        }
        CheckName::TierSensitivity => {
            "this tool is beyond your grant; do not retry — hand the step to a role that holds the \
             grant, or ask a person"
        }
        CheckName::RateLimit => {
            "this run has used its allowance for this tool; finish with what you have or start a new, \
             planned run"
        }
        CheckName::Policy => {
            "a policy forbids this call in this situation; do not work around it — report the refusal \
             and the policy id to a person"
        }
        CheckName::Budget => {
            "today's budget for this tier is used up; wait for the next day's budget or ask a person \
             to act"
        }
        CheckName::Idempotency => {
            "this operation cannot be made again as it is: report the earlier call named above \
             instead of retrying with other inputs"
        }
        CheckName::Gate => {
            "a person decided against this exact call: do not retry it or work around it; report \
             the rejection and its note"
        }
        CheckName::Credential | CheckName::Listed => "stop",
    }
}

fn failed_checks(decision: &Decision) -> Vec<Value> {
    decision
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .map(|c| json!({"check": c.name.to_string(), "rule": c.rule, "detail": c.detail}))
        .collect()
}

/// Maps the store's answer to the MCP answer for `tool`.
pub fn call_result(tool: &str, r: &CallResult) -> Result<CallToolResult, ErrorData> {
    let key = r.idem_key.as_str();
    let asked = Asked::Call { tool, key };
    match r.status {
        CallStatus::Done => Ok(stored_result(r.outcome.as_ref())),
        CallStatus::Replayed => Ok(replayed(tool, key, r.outcome.as_ref())),
        CallStatus::Failed => Ok(handler_failed(tool, key, r.outcome.as_ref())),
        CallStatus::Unknown => Ok(NotDone::Unknown.into_result(asked)),
        CallStatus::InProgress => Ok(NotDone::InProgress.into_result(asked)),
        CallStatus::InputsDiffer => Ok(NotDone::InputsDiffer.into_result(asked)),
        CallStatus::NeedsApproval => {
            let (rule, reason, needed) = match &r.decision.verdict {
                Verdict::NeedsApproval {
                    rule,
                    reason,
                    approvers_needed,
                    ..
                } => (rule.clone(), reason.clone(), *approvers_needed),
                _ => (Rule::default(), String::new(), 1),
            };
            let parked = NotDone::NeedsApproval {
                approval_id: r.approval_id.clone().unwrap_or_default(),
                rule,
                reason,
                approvers_needed: Some(needed),
            };
            Ok(parked.into_result(asked))
        }
        CallStatus::Refused => match &r.decision.verdict {
            Verdict::Deny {
                check: CheckName::Listed | CheckName::Credential,
                ..
            } => Err(unknown_tool(tool)),
            Verdict::Deny {
                check,
                rule,
                reason,
            } => Ok(Refusal::of_decision(tool, *check, rule, reason, &r.decision).into_result()),
            // A refused status always comes with a denying verdict; should one not, the caller
            // still hears a refusal, by the rule the outcome names.
            _ => {
                let rule = r.outcome.as_ref().and_then(|o| o.rule.clone());
                let reason = r.outcome.as_ref().and_then(|o| o.error.clone());
                Ok(Refusal::new(
                    tool,
                    "gateway",
                    rule.unwrap_or(Rule::REFUSED),
                    reason.unwrap_or_else(|| "refused".into()),
                )
                .into_result())
            }
        },
    }
}

/// The protocol answer for a tool that does not exist for the caller.
pub fn unknown_tool(tool: &str) -> ErrorData {
    ErrorData::invalid_params(unknown_tool_message(tool), None)
}

fn stored_result(outcome: Option<&StepOutcome>) -> CallToolResult {
    match outcome.and_then(|o| o.result.as_ref()) {
        Some(v) => from_stored(v),
        None => {
            let mut r = CallToolResult::success(Vec::new());
            r.result_type = Some(ResultType::COMPLETE);
            r
        }
    }
}

fn replayed(tool: &str, key: &str, outcome: Option<&StepOutcome>) -> CallToolResult {
    match outcome.map(|o| o.status) {
        Some(StepStatus::Done) | None => stored_result(outcome),
        _ => handler_failed(tool, key, outcome),
    }
}

fn handler_failed(tool: &str, key: &str, outcome: Option<&StepOutcome>) -> CallToolResult {
    let failed = NotDone::Failed {
        rule: outcome.and_then(|o| o.rule.clone()).unwrap_or_default(),
        error: outcome
            .and_then(|o| o.error.clone())
            .unwrap_or_else(|| "the call failed".into()),
    };
    failed.into_result(Asked::Call { tool, key })
}

/// An answer that is neither the tool's result nor a refusal: the call is parked for a person,
/// its outcome is unknown, it failed at the target, it is still in progress, or its key was
/// used with other inputs. Every such answer is rendered here, to a direct call or to a
/// plan-bound call of a planned step ([`Asked`]): text for the model, the same facts as
/// structured content (`status` first) for programs.
#[derive(Debug, Clone)]
pub(crate) enum NotDone {
    /// Parked until people approve it.
    NeedsApproval {
        approval_id: ApprovalId,
        rule: Rule,
        reason: String,
        /// How many approvers the gate needs (a direct call's answer says it).
        approvers_needed: Option<u8>,
    },
    /// It may have happened; toolgate settles it with the target by key.
    Unknown,
    /// The target answered "no", or did not answer a call that may be retried.
    Failed { rule: Rule, error: String },
    /// An earlier attempt of the same call has not finished.
    InProgress,
    /// The same key was used with different inputs; the first call stands.
    InputsDiffer,
}

/// What a [`NotDone`] answers: a direct call of a tool with its idempotency key, or a planned
/// step a plan-bound principal's call ran (or found).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Asked<'a> {
    Call { tool: &'a str, key: &'a str },
    Step(&'a Step),
}

impl NotDone {
    pub(crate) fn into_result(self, asked: Asked<'_>) -> CallToolResult {
        let (tool, key) = match asked {
            Asked::Call { tool, key } => (tool, key),
            Asked::Step(s) => (s.tool.as_str(), s.idem_key.as_str()),
        };
        let (text, mut facts) = match (self, asked) {
            (
                NotDone::NeedsApproval {
                    approval_id: id,
                    rule,
                    reason,
                    approvers_needed,
                },
                Asked::Call { .. },
            ) => {
                let needed = approvers_needed.unwrap_or(1);
                (
                    format!(
                        "'{tool}' was NOT done yet: a person must approve it first ({reason}; rule \
                         {rule}). Approval request {id} is waiting for {needed} approver(s). Retry \
                         the same call later, with exactly the same inputs: once approved it runs \
                         (once); if it was rejected, the retry says so and why. Changed inputs are \
                         a new request."
                    ),
                    json!({
                        "status": "needs_approval",
                        "tool": tool,
                        "approval_id": id,
                        "rule": rule,
                        "reason": reason,
                        "approvers_needed": needed,
                        "idempotency_key": key,
                    }),
                )
            }
            (
                NotDone::NeedsApproval {
                    approval_id: id,
                    rule,
                    reason,
                    ..
                },
                Asked::Step(_),
            ) => (
                format!(
                    "'{tool}' was NOT done yet: a person must approve it first ({reason}; rule \
                     {rule}). Approval request {id} is waiting. Retry the same call later, with \
                     exactly the same inputs: once approved it runs (once; a worker may run it \
                     first); if it was rejected, the retry says so and why."
                ),
                json!({"status": "needs_approval", "approval_id": id, "rule": rule, "reason": reason}),
            ),
            (NotDone::Unknown, Asked::Call { .. }) => (
                format!(
                    "The outcome of '{tool}' is unknown for now: the call may have happened (the \
                     target did not answer, or toolgate stopped before recording its answer), and \
                     this kind of call is never retried blind. toolgate is settling it with the \
                     target by its idempotency key. Retry the same call later (same inputs) to get \
                     the settled outcome; do not change the inputs to get around this."
                ),
                json!({"status": "unknown", "tool": tool, "idempotency_key": key, "retry": "later, same inputs"}),
            ),
            (NotDone::Unknown, Asked::Step(s)) => {
                let (rule, reason) = rule_and_error(s);
                (
                    format!("The outcome of '{tool}' is unknown: {reason}"),
                    json!({"status": "unknown", "rule": rule, "reason": reason}),
                )
            }
            (NotDone::Failed { rule, error }, Asked::Call { .. }) => {
                let retryable = rule.is_retryable();
                let (what, next) = if retryable {
                    (
                        "failed at the target",
                        "it did not happen and may be retried with the same inputs",
                    )
                } else if rule == Rule::PIN_BLOCKED {
                    (
                        "was not sent",
                        "the upstream changed this tool after it was reviewed; report it, an \
                         operator reviews the change before the tool is served again",
                    )
                } else {
                    (
                        "failed at the target",
                        "the target answered no; read its message, correct the request if it is \
                         yours to correct, otherwise report it (the same inputs return the same \
                         answer)",
                    )
                };
                (
                    format!("'{tool}' {what}: {error}. Next: {next}."),
                    json!({"status": "failed", "tool": tool, "rule": rule, "error": error, "idempotency_key": key, "retryable": retryable}),
                )
            }
            (NotDone::Failed { rule, error }, Asked::Step(_)) => (
                format!("'{tool}' failed at the target: {error}"),
                json!({"status": "failed", "rule": rule, "reason": error}),
            ),
            (NotDone::InProgress, Asked::Call { .. }) => (
                format!(
                    "This '{tool}' call is already in progress (an earlier attempt of the same \
                     operation has not finished). Nothing was done twice. Retry the same call in \
                     a few seconds (same inputs) to get its result; do not change the inputs to \
                     get around this."
                ),
                json!({"status": "in_progress", "tool": tool, "idempotency_key": key, "retry": "in a few seconds, same inputs"}),
            ),
            (NotDone::InProgress, Asked::Step(s)) => (
                format!(
                    "'{tool}' is {} (another worker holds it); ask run.status later",
                    s.status
                ),
                json!({"status": "in_progress"}),
            ),
            (NotDone::InputsDiffer, _) => (
                format!(
                    "A '{tool}' call with the same identity was already made with different \
                     inputs (idempotency key {key}). The first call stands; to do something \
                     different, it must be a different operation (different identifying fields), \
                     not a retry."
                ),
                json!({"status": "inputs_differ", "tool": tool, "idempotency_key": key}),
            ),
        };
        // A planned step's answer names the step, after what the answer itself says.
        if let (Asked::Step(s), Some(m)) = (asked, facts.as_object_mut()) {
            m.insert("tool".into(), json!(s.tool));
            m.insert("run_id".into(), json!(s.run_id));
            m.insert("step_id".into(), json!(s.step_id));
            m.insert("seq".into(), json!(s.seq));
        }
        readable_error(text, facts)
    }
}

/// The rule and the error a planned step's outcome names (empty when it names none).
fn rule_and_error(step: &Step) -> (Rule, String) {
    let o = step.outcome.as_ref();
    (
        o.and_then(|o| o.rule.clone()).unwrap_or_default(),
        o.and_then(|o| o.error.clone()).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_results_are_stored_plain_and_come_back_complete() {
        let r = CallToolResult::structured(json!({"found": true, "ref": "P-1"}));
        let stored = to_stored(&r);
        assert_eq!(stored, json!({"found": true, "ref": "P-1"}));
        let back = from_stored(&stored);
        assert_eq!(
            back.structured_content,
            Some(json!({"found": true, "ref": "P-1"}))
        );
        assert_eq!(back.result_type, Some(ResultType::COMPLETE));
    }

    #[test]
    fn a_refusal_reads_the_same_whatever_refused_it() {
        let r = Refusal::new("run.status", "run", "run.unknown", "no run 'r9' for 'ops'.")
            .next("ask for the status of a run of your own")
            .fact("audit_seq", 7)
            .into_result();
        assert_eq!(r.is_error, Some(true));
        assert_eq!(
            r.result_type,
            Some(ResultType::COMPLETE),
            "newer clients need it"
        );
        assert_eq!(
            r.content[0].as_text().unwrap().text,
            "'run.status' was refused by the run check (rule run.unknown): no run 'r9' for \
             'ops'. Next: ask for the status of a run of your own."
        );
        assert_eq!(
            r.structured_content,
            Some(json!({
                "status": "refused", "tool": "run.status", "check": "run", "rule": "run.unknown",
                "reason": "no run 'r9' for 'ops'.", "next": "ask for the status of a run of your own",
                "audit_seq": 7,
            }))
        );
    }

    #[test]
    fn a_failed_direct_call_says_whether_to_retry() {
        let failed = NotDone::Failed {
            rule: "timeout.retryable".into(),
            error: "the call timed out without an answer".into(),
        };
        let r = failed.into_result(Asked::Call {
            tool: "crm.read",
            key: "k1",
        });
        assert_eq!(r.is_error, Some(true));
        assert_eq!(
            r.content[0].as_text().unwrap().text,
            "'crm.read' failed at the target: the call timed out without an answer. Next: it did \
             not happen and may be retried with the same inputs."
        );
        assert_eq!(
            serde_json::to_string(r.structured_content.as_ref().unwrap()).unwrap(),
            r#"{"status":"failed","tool":"crm.read","rule":"timeout.retryable","error":"the call timed out without an answer","idempotency_key":"k1","retryable":true}"#
        );
    }

    #[test]
    fn a_direct_call_that_got_no_clean_answer_may_be_retried() {
        // The store's own outcome of a read or write that got no clean answer.
        let failed = NotDone::Failed {
            rule: Rule::UNANSWERED_RETRYABLE,
            error: "no clean answer (connection reset); retryable with the same key".into(),
        };
        let r = failed.into_result(Asked::Call {
            tool: "crm.read",
            key: "k1",
        });
        let facts = r.structured_content.as_ref().unwrap();
        assert_eq!(facts["rule"], "unanswered.retryable");
        assert_eq!(facts["retryable"], true);
        assert!(
            r.content[0]
                .as_text()
                .unwrap()
                .text
                .ends_with("Next: it did not happen and may be retried with the same inputs.")
        );
    }

    #[test]
    fn a_handlers_no_is_not_retried() {
        let failed = NotDone::Failed {
            rule: Rule::HANDLER_FAILED,
            error: "insufficient funds".into(),
        };
        let r = failed.into_result(Asked::Call {
            tool: "payment.schedule",
            key: "k1",
        });
        assert_eq!(r.structured_content.as_ref().unwrap()["retryable"], false);
    }

    #[test]
    fn a_call_the_pin_stopped_says_it_was_not_sent() {
        let failed = NotDone::Failed {
            rule: Rule::PIN_BLOCKED,
            error: "'crm.read' is not served at its pinned definition".into(),
        };
        let r = failed.into_result(Asked::Call {
            tool: "crm.read",
            key: "k1",
        });
        let text = &r.content[0].as_text().unwrap().text;
        assert!(text.starts_with("'crm.read' was not sent: "), "{text}");
        assert!(!text.contains("the target answered no"), "{text}");
        let facts = r.structured_content.as_ref().unwrap();
        assert_eq!(facts["rule"], "pin.blocked");
        assert_eq!(facts["retryable"], false);
    }

    #[test]
    fn a_planned_steps_answer_names_the_step_after_what_it_says() {
        let mut outcome = StepOutcome::status(StepStatus::Unknown);
        outcome.rule = Some("timeout.unknown".into());
        outcome.error = Some("no answer".into());
        let step = Step {
            step_id: "s1".into(),
            run_id: "r1".into(),
            seq: 2,
            kind: toolgate_store::StepKind::Planned,
            principal: "worker".into(),
            role: "worker".into(),
            tool: "payment.schedule".into(),
            effect: toolgate_core::Effect::Irreversible,
            tier: toolgate_core::Tier::Spend,
            purpose: None,
            reason: None,
            evidence: Vec::new(),
            actor: Default::default(),
            inputs: json!({}),
            input_hash: toolgate_core::InputHash::of(&json!({})),
            idem_key: toolgate_core::IdempotencyKey::from_stored("k2"),
            status: StepStatus::Unknown,
            attempts: 1,
            approval: None,
            outcome: Some(outcome),
            compensates: None,
            created_at: toolgate_core::Timestamp::from_millis(0),
            updated_at: toolgate_core::Timestamp::from_millis(0),
        };
        let r = NotDone::Unknown.into_result(Asked::Step(&step));
        assert_eq!(
            r.content[0].as_text().unwrap().text,
            "The outcome of 'payment.schedule' is unknown: no answer"
        );
        assert_eq!(
            serde_json::to_string(r.structured_content.as_ref().unwrap()).unwrap(),
            r#"{"status":"unknown","rule":"timeout.unknown","reason":"no answer","tool":"payment.schedule","run_id":"r1","step_id":"s1","seq":2}"#
        );
    }

    #[test]
    fn rich_content_is_stored_whole() {
        let mut r = CallToolResult::success(vec![
            ContentBlock::text("hello"),
            ContentBlock::image("aGVsbG8=", "image/png"),
        ]);
        r.result_type = None;
        let stored = to_stored(&r);
        assert!(stored.get(WHOLE).is_some());
        let back = from_stored(&stored);
        assert_eq!(back.content, r.content);
        assert_eq!(back.result_type, Some(ResultType::COMPLETE));
    }
}

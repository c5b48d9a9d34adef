//! From the store's answer to what the model reads. A refusal the model can correct is a tool
//! result with `isError: true` that names what fired, what would pass and the legitimate next
//! move (a validation failure the model can read and correct); a parked call says how to follow
//! it; a replay returns the stored result. Only a tool that does not exist for the caller is a
//! protocol error, worded exactly like a tool that does not exist at all.

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, ResultType};
use serde_json::{Value, json};
use toolgate_core::decide::unknown_tool_message;
use toolgate_core::{CheckName, Decision, Outcome, StepStatus, Verdict, canonical};
use toolgate_store::{CallResult, CallStatus, StepOutcome};

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
pub(crate) fn readable_error(text: String, facts: Value) -> CallToolResult {
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
    rule: String,
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
        rule: impl Into<String>,
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
    fn of_decision(tool: &str, check: CheckName, rule: &str, reason: &str, d: &Decision) -> Self {
        let failed = failed_checks(d);
        let all: Vec<&str> = failed.iter().filter_map(|f| f["detail"].as_str()).collect();
        let mut r = Refusal::new(tool, check, rule, reason).next(next_moves(check));
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
    pub(crate) fn rule(&self) -> &str {
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
        v.insert("rule".into(), rule.into());
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
    match r.status {
        CallStatus::Done => Ok(stored_result(r.outcome.as_ref())),
        CallStatus::Replayed => Ok(replayed(tool, key, r.outcome.as_ref())),
        CallStatus::Failed => Ok(handler_failed(tool, key, r.outcome.as_ref())),
        CallStatus::Unknown => Ok(readable_error(
            format!(
                "The outcome of '{tool}' is unknown for now: the call may have happened (the target did \
                 not answer, or toolgate stopped before recording its answer), and this kind of call \
                 is never retried blind. toolgate is settling it with the target by its idempotency \
                 key. Retry the same call later (same inputs) to get the settled outcome; do not \
                 change the inputs to get around this."
            ),
            json!({"status": "unknown", "tool": tool, "idempotency_key": key, "retry": "later, same inputs"}),
        )),
        CallStatus::InProgress => Ok(readable_error(
            format!(
                "This '{tool}' call is already in progress (an earlier attempt of the same operation \
                 has not finished). Nothing was done twice. Retry the same call in a few seconds \
                 (same inputs) to get its result; do not change the inputs to get around this."
            ),
            json!({"status": "in_progress", "tool": tool, "idempotency_key": key, "retry": "in a few seconds, same inputs"}),
        )),
        CallStatus::InputsDiffer => Ok(readable_error(
            format!(
                "A '{tool}' call with the same identity was already made with different inputs \
                 (idempotency key {key}). The first call stands; to do something different, it must \
                 be a different operation (different identifying fields), not a retry."
            ),
            json!({"status": "inputs_differ", "tool": tool, "idempotency_key": key}),
        )),
        CallStatus::NeedsApproval => {
            let (rule, reason, needed) = match &r.decision.verdict {
                Verdict::NeedsApproval {
                    rule,
                    reason,
                    approvers_needed,
                    ..
                } => (rule.clone(), reason.clone(), *approvers_needed),
                _ => (String::new(), String::new(), 1),
            };
            let id = r.approval_id.clone().unwrap_or_default();
            Ok(readable_error(
                format!(
                    "'{tool}' was NOT done yet: a person must approve it first ({reason}; rule \
                     {rule}). Approval request {id} is waiting for {needed} approver(s). Retry the \
                     same call later, with exactly the same inputs: once approved it runs (once); if \
                     it was rejected, the retry says so and why. Changed inputs are a new request."
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
            ))
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
                    rule.unwrap_or_else(|| "refused".into()),
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
    let err = outcome
        .and_then(|o| o.error.clone())
        .unwrap_or_else(|| "the call failed".into());
    let rule = outcome.and_then(|o| o.rule.clone()).unwrap_or_default();
    let retryable = rule == "timeout.retryable";
    let next = if retryable {
        "it did not happen and may be retried with the same inputs"
    } else {
        "the target answered no; read its message, correct the request if it is yours to correct, \
         otherwise report it (the same inputs return the same answer)"
    };
    readable_error(
        format!("'{tool}' failed at the target: {err}. Next: {next}."),
        json!({"status": "failed", "tool": tool, "rule": rule, "error": err, "idempotency_key": key, "retryable": retryable}),
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

//! What each lint rule finds, why it matters, and how to fix or accept it: the text of
//! `toolgate check --explain RULE` and of the rules section of the registry reference. One
//! table, so a rule the lint can raise and the page that explains it cannot drift apart (a test
//! checks that every rule id in `lint.rs` and `budget.rs` is here).

/// One lint rule, explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleDoc {
    /// The stable id printed in brackets (`[schema.open-object]`).
    pub id: &'static str,
    /// What it finds.
    pub finds: &'static str,
    /// Why that matters.
    pub why: &'static str,
    /// How to fix it, or when accepting it is right.
    pub fix: &'static str,
}

/// Every rule `toolgate check` can raise after the registry loaded (load errors, `config.*`
/// and most `ref.*`, are fixed, never accepted).
pub const LINT_RULES: &[RuleDoc] = &[
    RuleDoc {
        id: "approval.nobody",
        finds: "a gated tool (or a `@gate` rule) that needs more distinct approvers than the people who may approve it: its `approved_by`, the rule's `approvals.gates` entry, or the approver roles.",
        why: "every call it gates waits until its request expires: the tool looks governed and does nothing, and the pressure to approve by other means grows.",
        fix: "name roles or people who may approve (`approved_by: {roles: [...]}` on the tool, or `approvals.gates.<rule>` in toolgate.yaml), with at least as many people of kind human as `approvers` asks for.",
    },
    RuleDoc {
        id: "approval.self",
        finds: "a person who may approve a tool's gated calls and may also request them, directly or through an agent that acts for them (`on_behalf_of`).",
        why: "their own requests are refused, but one person holds both duties: they approve their colleagues' requests under the role they also request with, and colleagues approve theirs.",
        fix: "split the duties: take the tool away from the person's role, or leave them out of its `approved_by`. Accept it where a small team cannot split them, and say who reviews their approvals.",
    },
    RuleDoc {
        id: "schema.not-object",
        finds: "a tool whose `input_schema` is not `type: object`.",
        why: "MCP tool inputs are an object; a schema of another type cannot be checked field by field, and clients send an object anyway.",
        fix: "write `type: object` with `properties` and `additionalProperties: false`.",
    },
    RuleDoc {
        id: "schema.open-object",
        finds: "an object schema (the inputs, or an object inside them) without `additionalProperties: false`.",
        why: "extra fields are how unreviewed parameters slip through: the upstream may act on a field nobody reviewed, and no destination or policy sees it.",
        fix: "close it with `additionalProperties: false` and list every property. Accept it only when the object is passed through verbatim to a system that ignores unknown fields, and say so in the reason.",
    },
    RuleDoc {
        id: "schema.unbounded-number",
        finds: "a number or integer without both a lower and an upper bound (and no `enum`/`const`).",
        why: "an agent can send any magnitude: a negative amount, a count of a billion. Bounds are the cheapest ceiling there is, checked before any policy.",
        fix: "set `minimum` or `exclusiveMinimum`, and `maximum` or `exclusiveMaximum`, to the range the business allows.",
    },
    RuleDoc {
        id: "schema.unbounded-string",
        finds: "a string without `maxLength`, `enum`, `const`, `pattern` or `format`.",
        why: "an unbounded string carries anything: a prompt for the next model, a whole document leaving through a query, megabytes into a log.",
        fix: "bound it with `maxLength`, or better a `pattern` or `enum`. An optional field written `anyOf: [{type: string, maxLength: 200}, {type: 'null'}]` is judged by its string alternative.",
    },
    RuleDoc {
        id: "schema.unbounded-array",
        finds: "an array without `maxItems`.",
        why: "an unbounded list multiplies everything after it: recipients, rows written, upstream calls.",
        fix: "set `maxItems`.",
    },
    RuleDoc {
        id: "destination.free-string",
        finds: "an input whose name says it chooses where data or money goes (`to`, `recipient`, `url`, `iban`, `channel`, `account`…) and that accepts any value: no `enum`, `const` or `pattern`, and no `destinations:` entry for it.",
        why: "a destination chosen by the model is the exfiltration and fraud channel: an instruction injected into data only has to name a new recipient.",
        fix: "declare `destinations: [{field: NAME, kind: exact|email_domain|url_host, allowed: [...]}]` (or a `lookup:` read tool), with `unknown: gate` to send an unlisted value to a person instead of refusing it; or constrain the schema with `enum`/`pattern`. Accept it when the name only looks like a destination (an `owner` that is a label, say).",
    },
    RuleDoc {
        id: "destination.empty",
        finds: "a destination constraint with neither `allowed:` values nor a `lookup:`.",
        why: "it refuses every value (or, with `unknown: gate`, sends every call to a person): almost certainly not what was meant.",
        fix: "give `allowed: [...]` or a `lookup:` read tool that answers the allowed values.",
    },
    RuleDoc {
        id: "ref.unknown-field",
        finds: "a destination constraint on a field that is not a top-level input of the tool.",
        why: "the constraint checks nothing: the field it names never arrives.",
        fix: "name a top-level property of `input_schema`.",
    },
    RuleDoc {
        id: "write.no-identity",
        finds: "a `write` or `irreversible` tool without `identity:` fields.",
        why: "a direct call's idempotency key is derived from its identity fields; without them a retry from another session is not recognised as the same operation and runs twice.",
        fix: "list the input fields that identify the operation (`identity: [invoice_id, amount]`), never free text.",
    },
    RuleDoc {
        id: "write.no-compensation",
        finds: "a `write` tool with no way to undo it.",
        why: "aborting a run undoes each done write, newest first; a write without a compensation stays done when the run it belonged to is abandoned.",
        fix: "name the tool that undoes it (`compensate: note.discard`), or `compensate_with: {read: TOOL, restore: [fields]}` to undo it with the same tool and the values read before the write; or declare the tool `irreversible`.",
    },
    RuleDoc {
        id: "irreversible.unguarded",
        finds: "an `irreversible` tool with no reconciling tool, no reconciling query and no `gate: always`.",
        why: "a call that timed out may have happened; without a way to ask the target, recovery cannot tell, and the step waits for a person with nothing to look at.",
        fix: "add `reconcile: TOOL` (a read that looks up by idempotency key), or `reconcile_query:` (a read that lists what the target did, and the fields that identify this call in its answer), or `gate: always`. Accept it when the tool is gated by a policy for the cases that matter, and say which.",
    },
    RuleDoc {
        id: "tier.contradicts-effect",
        finds: "a `read` tool in tier `act` or `spend`.",
        why: "grants and budgets follow the tier; a read in a spending tier is either mislabelled or changes state, and then its effect is wrong.",
        fix: "a read tool is tier `read`; if it changes state, its effect is `write`.",
    },
    RuleDoc {
        id: "annotations.contradict-effect",
        finds: "MCP annotations that say something else than the effect (`readOnlyHint: true` on a write, `destructiveHint: false` on an irreversible tool, `idempotentHint: true` without identity fields).",
        why: "clients show and trust annotations; toolgate decides by the effect. The two should not tell people different stories.",
        fix: "remove the annotations (toolgate derives them from `effect`) or make them agree.",
    },
    RuleDoc {
        id: "budget.key-unconstrained",
        finds: "a window budget split by a key input that accepts any value.",
        why: "a caller can mint a new key (a new supplier id, a new domain) for each call, and every key gets a fresh window: the budget never fills.",
        fix: "constrain the key input (`enum`, `pattern`, a `destinations:` list), or budget without a key.",
    },
    RuleDoc {
        id: "budget.missing",
        finds: "a principal holding a grant up to tier `act` or `spend` without a daily budget for that tier.",
        why: "an unbudgeted tier is unlimited: a loop spends until someone notices.",
        fix: "set `budgets: {act: N, spend: M}` on the principal.",
    },
    RuleDoc {
        id: "principal.no-credential",
        finds: "an agent without credentials.",
        why: "it can never connect; usually a key was forgotten or revoked without removing the agent.",
        fix: "add `credentials: [{id: key1, sha256: ...}]` (`toolgate key new` makes one), or remove the agent.",
    },
    RuleDoc {
        id: "policy.confusable-text",
        finds: "what Cedar warns about in a policy: mixed scripts, bidirectional control characters, confusable identifiers.",
        why: "a reviewer must read what Cedar evaluates; confusable text is how a policy says one thing and does another.",
        fix: "write the policy's strings and names in one script, without bidirectional control characters.",
    },
    RuleDoc {
        id: "accept.stale",
        finds: "an `accept:` entry in toolgate.yaml that matches no finding any more.",
        why: "an acceptance outliving its finding would silently accept the next, different finding of the same rule on the same subject.",
        fix: "remove the acceptance (the finding was fixed), or correct its `subject` or `at` to what `toolgate check` prints. It cannot itself be accepted.",
    },
];

/// The explanation of a rule, by id.
pub fn explain(id: &str) -> Option<&'static RuleDoc> {
    LINT_RULES.iter().find(|r| r.id == id)
}

/// Whether an `accept:` entry may name this rule: any lint rule but `accept.stale`.
pub fn acceptable(id: &str) -> bool {
    id != "accept.stale" && explain(id).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule id the lint can raise (a quoted `"x.y"` after `push(`… or `rule:` in the
    /// lint's sources) is explained here.
    #[test]
    fn every_rule_the_lint_raises_is_explained() {
        let budget = include_str!("budget.rs");
        let budget_lint = &budget[budget.find("pub fn lint_tool").expect("budget::lint_tool")..];
        let sources = [
            include_str!("lint.rs"),
            budget_lint,
            include_str!("approvers.rs"),
        ];
        let mut raised = std::collections::BTreeSet::new();
        for src in sources {
            for (i, _) in src.match_indices('"') {
                let rest = &src[i + 1..];
                let Some(end) = rest.find('"') else { continue };
                let word = &rest[..end];
                let known_prefix = [
                    "schema.",
                    "destination.",
                    "write.",
                    "irreversible.",
                    "tier.",
                    "annotations.",
                    "budget.",
                    "principal.",
                    "policy.",
                    "accept.",
                    "approval.",
                ];
                let shaped = word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '.' || c == '-')
                    && word.matches('.').count() == 1
                    && !word.ends_with('.');
                if shaped && known_prefix.iter().any(|p| word.starts_with(p)) {
                    raised.insert(word.to_string());
                }
            }
        }
        for id in [
            "schema.not-object",
            "schema.open-object",
            "irreversible.unguarded",
        ] {
            assert!(raised.contains(id), "the scan found {id}: {raised:?}");
        }
        let missing: Vec<&String> = raised.iter().filter(|r| explain(r).is_none()).collect();
        assert!(
            missing.is_empty(),
            "rules without an explanation: {missing:?}"
        );
    }

    #[test]
    fn the_stale_rule_is_not_acceptable_and_load_errors_are_not_either() {
        assert!(acceptable("irreversible.unguarded"));
        assert!(!acceptable("accept.stale"));
        assert!(!acceptable("ref.dangling"));
    }
}

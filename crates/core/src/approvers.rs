//! Who may approve a gated call: segregation of duties. The principal that asked, and the
//! person an agent acts for, never count as approvers of their own request; each tool (and
//! each `@gate` rule) names who may approve it (roles or people) and how many distinct ones.
//! The page, the terminal, the store and the engine all ask [`Registry::may_approve`], so no
//! path counts an approval the others would refuse.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{GatewayFile, PrincipalsFile, ToolConfig};
use crate::model::{Gate, PrincipalKind, Sensitivity, Tier};
use crate::policy::Policies;
use crate::registry::{Finding, Registry};

/// `approved_by:` on a tool: the roles and people who may approve its gated calls. Unset: any
/// person whose role is `approver: true`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovedBy {
    /// Roles whose people may approve (each an `approver: true` role of principals.yaml).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["ap.clerk"])]
    pub roles: Vec<String>,
    /// People (principal ids of kind `human`) who may approve, whatever their role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["alice"])]
    pub people: Vec<String>,
}

impl ApprovedBy {
    fn is_empty(&self) -> bool {
        self.roles.is_empty() && self.people.is_empty()
    }
}

/// `approvals.gates.<rule>:` in toolgate.yaml: who approves calls a `@gate` policy gates, and how
/// many distinct people, instead of the tool's own `approved_by` and `approvers`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateApprovers {
    /// Roles whose people may approve what this rule gates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["supplier.admin"])]
    pub roles: Vec<String>,
    /// People (principal ids of kind `human`) who may approve what this rule gates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["sam"])]
    pub people: Vec<String>,
    /// How many distinct people (1 to 5); unset: the tool's `approvers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 2)]
    pub approvers: Option<u8>,
}

/// `approvals.notify.<name>:` in toolgate.yaml: a webhook told when a request is raised. It
/// takes the requests gated by one of `rules`, or that people of one of `roles` may approve;
/// with neither set, every request. The URL is `url`, or read from the environment variable
/// `url_env` (a chat webhook's URL is its secret: keep it out of the registry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifyWebhook {
    /// The URL posted to (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"https://hooks.slack.com/services/T000/B000/XXXX")]
    pub url: Option<String>,
    /// An environment variable holding the URL, read when the gateway starts or reloads;
    /// instead of `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"AP_DESK_WEBHOOK")]
    pub url_env: Option<String>,
    /// The `@gate` rules (policy @ids, or `gate.always` for a tool's own gate) whose requests it
    /// takes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["iban-change"])]
    pub rules: Vec<String>,
    /// Approver roles: it takes the requests a person of one of these roles may approve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["ap.clerk"])]
    pub roles: Vec<String>,
}

/// `approval_context:` on a tool: a read tool asked when a person opens one of its parked
/// calls, whose answer is shown beside the inputs (the payee and account of a payment, the
/// invoice's own amount and status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextLookup {
    /// A read tool of the registry.
    #[schemars(example = &"invoice.search")]
    pub tool: String,
    /// Inputs of the call passed to it under the same names.
    #[schemars(example = ["invoice_id"])]
    pub with: Vec<String>,
    /// The field of its answer holding the record (a list: its first item); unset: the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"invoices")]
    pub result: Option<String>,
    /// What is shown: label → field of the record.
    #[schemars(example = BTreeMap::from([("payee".to_string(), "supplier_name".to_string())]))]
    pub show: BTreeMap<String, String>,
    /// Inputs that must equal a shown fact: input → label; a difference is marked.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(example = BTreeMap::from([("amount".to_string(), "invoice amount".to_string())]))]
    pub expect: BTreeMap<String, String>,
}

/// Who may approve one gated call, resolved from the tool and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approvers<'a> {
    /// Empty with `people` empty: any person whose role approves.
    pub roles: &'a [String],
    pub people: &'a [String],
    /// How many distinct people must approve.
    pub count: u8,
    /// Where it is declared, for messages (`approvals.gates.<rule>`, `tool <name>`, `roles`).
    pub declared_in: String,
}

impl Approvers<'_> {
    /// True when any person of an approver role qualifies (no list is declared).
    pub fn any_approver(&self) -> bool {
        self.roles.is_empty() && self.people.is_empty()
    }
}

impl fmt::Display for Approvers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.any_approver() {
            return write!(f, "any person whose role approves");
        }
        let mut parts = Vec::new();
        if !self.roles.is_empty() {
            parts.push(format!("role {}", self.roles.join(" or ")));
        }
        if !self.people.is_empty() {
            parts.push(self.people.join(", "));
        }
        write!(f, "{}", parts.join("; or "))
    }
}

/// Why a principal may not approve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ineligible {
    #[error("'{0}' is not a person in the registry; only people approve")]
    NotAPerson(String),
    #[error("'{0}' asked for this call: nobody approves their own request")]
    Requester(String),
    #[error(
        "'{person}' is the person behind '{agent}', which asked for this call: nobody approves their own request"
    )]
    BehindAgent { person: String, agent: String },
    #[error(
        "'{person}' may not approve {tool} under rule {rule}: its approvers are {approvers} ({declared_in})"
    )]
    NotListed {
        person: String,
        tool: String,
        rule: String,
        approvers: String,
        declared_in: String,
    },
}

impl Registry {
    /// Who may approve a call of `tool` gated under `rule`, and how many.
    pub fn approvers(&self, tool: &str, rule: &str) -> Approvers<'_> {
        let t = self.tool(tool);
        let tool_count = t.map(|t| t.config.approvers).unwrap_or(1);
        if let Some(g) = self.gateway.approvals.gates.get(rule) {
            let listed = !(g.roles.is_empty() && g.people.is_empty());
            let (roles, people, declared_in) = if listed {
                (
                    g.roles.as_slice(),
                    g.people.as_slice(),
                    format!("approvals.gates.{rule}"),
                )
            } else {
                tool_lists(t)
            };
            return Approvers {
                roles,
                people,
                count: g.approvers.unwrap_or(tool_count).max(1),
                declared_in,
            };
        }
        let (roles, people, declared_in) = tool_lists(t);
        Approvers {
            roles,
            people,
            count: tool_count.max(1),
            declared_in,
        }
    }

    /// The names of the `approvals.notify` webhooks told of a request of `tool` gated under
    /// `rule`: those naming the rule, those naming a role whose people may approve it, and those
    /// naming neither.
    pub fn notify_targets(&self, tool: &str, rule: &str) -> Vec<&str> {
        let set = self.approvers(tool, rule);
        let approves = |role: &str| {
            if set.any_approver() {
                self.role(role).is_some_and(|r| r.approver)
            } else {
                set.roles.iter().any(|r| r == role)
                    || set
                        .people
                        .iter()
                        .any(|p| self.principal(p).is_some_and(|p| p.role() == role))
            }
        };
        self.gateway
            .approvals
            .notify
            .iter()
            .filter(|(_, w)| {
                (w.rules.is_empty() && w.roles.is_empty())
                    || w.rules.iter().any(|r| r == rule)
                    || w.roles.iter().any(|r| approves(r))
            })
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The principals behind a requester, itself first: the person it acts for
    /// (`on_behalf_of`), then each ancestor on its `parent` chain and the person that one acts
    /// for. A child agent draws on its parent's budget and acts in its name, so whoever stands
    /// behind the parent stands behind the child too.
    pub fn requesting_people<'a>(&'a self, requester: &'a str) -> Vec<&'a str> {
        let mut out = vec![requester];
        let Some(p) = self.principal(requester) else {
            return out;
        };
        let chain = std::iter::once(p).chain(
            p.ancestors
                .iter()
                .filter_map(|a| self.principal(a.as_str())),
        );
        for q in chain {
            if q.id() != requester && !out.contains(&q.id()) {
                out.push(q.id());
            }
            if let Some(person) = q.config.on_behalf_of.as_deref()
                && !out.contains(&person)
            {
                out.push(person);
            }
        }
        out
    }

    /// Whether `approver` may approve (or reject) `requester`'s call of `tool` gated under
    /// `rule`: a person, not the requester nor the person behind it, and one of the gate's
    /// approvers.
    pub fn may_approve(
        &self,
        approver: &str,
        requester: &str,
        tool: &str,
        rule: &str,
    ) -> Result<(), Ineligible> {
        let Some(p) = self
            .principal(approver)
            .filter(|p| p.config.kind == PrincipalKind::Human)
        else {
            return Err(Ineligible::NotAPerson(approver.to_string()));
        };
        if approver == requester {
            return Err(Ineligible::Requester(approver.to_string()));
        }
        if self.requesting_people(requester).contains(&approver) {
            return Err(Ineligible::BehindAgent {
                person: approver.to_string(),
                agent: requester.to_string(),
            });
        }
        let set = self.approvers(tool, rule);
        let listed = if set.any_approver() {
            self.role(p.role()).is_some_and(|r| r.approver)
        } else {
            set.roles.iter().any(|r| r == p.role()) || set.people.iter().any(|x| x == approver)
        };
        if listed {
            Ok(())
        } else {
            Err(Ineligible::NotListed {
                person: approver.to_string(),
                tool: tool.to_string(),
                rule: rule.to_string(),
                approvers: set.to_string(),
                declared_in: set.declared_in,
            })
        }
    }

    /// Whether `principal` is a person who may approve some gate: signs in to the page.
    pub fn approves_anything(&self, principal: &str) -> bool {
        let Some(p) = self
            .principal(principal)
            .filter(|p| p.config.kind == PrincipalKind::Human)
        else {
            return false;
        };
        let named = |b: &[String], people: &[String]| {
            b.iter().any(|r| r == p.role()) || people.iter().any(|x| x == principal)
        };
        self.role(p.role()).is_some_and(|r| r.approver)
            || self.tools().iter().any(|t| {
                t.config
                    .approved_by
                    .as_ref()
                    .is_some_and(|a| named(&a.roles, &a.people))
            })
            || self
                .gateway
                .approvals
                .gates
                .values()
                .any(|g| named(&g.roles, &g.people))
    }

    /// The most sensitive data a principal's grants reach (public without grants): what an
    /// approver may read in clear; fields of more sensitive calls are masked for them.
    pub fn sensitivity_ceiling(&self, principal: &str) -> Sensitivity {
        self.principal(principal)
            .and_then(|p| p.config.grants.iter().map(|g| g.max_sensitivity).max())
            .unwrap_or(Sensitivity::Public)
    }
}

fn tool_lists(t: Option<&crate::registry::Tool>) -> (&[String], &[String], String) {
    match t.and_then(|t| t.config.approved_by.as_ref().map(|a| (t, a))) {
        Some((t, a)) if !a.is_empty() => (
            &a.roles,
            &a.people,
            format!("{} approved_by", t.config.name),
        ),
        _ => (&[], &[], "roles with approver: true".to_string()),
    }
}

/// Load-time checks: every role and person named as an approver exists (a person is `human`),
/// `on_behalf_of` names a person, `approvals.gates` keys are `@gate` policies, counts are 1–5.
pub(crate) fn check(
    gateway: &GatewayFile,
    tools: &[(&str, usize, &ToolConfig)],
    pfile: &PrincipalsFile,
    policies: Option<&Policies>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let roles: Vec<&str> = pfile
        .roles
        .keys()
        .map(String::as_str)
        .chain(pfile.principals.iter().map(|p| p.role.as_str()))
        .collect();
    let person = |id: &str| {
        pfile
            .principals
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.kind == PrincipalKind::Human)
    };
    let mut names = |file: &str, path: &str, b_roles: &[String], people: &[String]| {
        for (j, r) in b_roles.iter().enumerate() {
            if !roles.contains(&r.as_str()) {
                out.push(finding(
                    file,
                    format!("{path}.roles[{j}]"),
                    "ref.dangling",
                    format!("role '{r}' is not declared"),
                    "name a role declared in principals.yaml",
                ));
            }
        }
        for (j, id) in people.iter().enumerate() {
            match person(id) {
                Some(true) => {}
                Some(false) => out.push(finding(
                    file,
                    format!("{path}.people[{j}]"),
                    "config.agent-approver",
                    format!("'{id}' is an agent; only people approve"),
                    "name a principal of kind human",
                )),
                None => out.push(finding(
                    file,
                    format!("{path}.people[{j}]"),
                    "ref.dangling",
                    format!("'{id}' is not a declared principal"),
                    "name a person declared in principals.yaml",
                )),
            }
        }
    };
    for (file, i, t) in tools {
        if let Some(a) = &t.approved_by {
            names(
                file,
                &format!("tools[{i}].approved_by"),
                &a.roles,
                &a.people,
            );
        }
    }
    for (rule, g) in &gateway.approvals.gates {
        names(
            "toolgate.yaml",
            &format!("approvals.gates.{rule}"),
            &g.roles,
            &g.people,
        );
    }
    for (file, i, t) in tools {
        for (j, c) in t.approval_context.iter().enumerate() {
            let read = tools
                .iter()
                .find(|(_, _, x)| x.name == c.tool)
                .map(|(_, _, x)| x.effect == crate::model::Effect::Read);
            if read != Some(true) {
                out.push(finding(
                    file,
                    format!("tools[{i}].approval_context[{j}].tool"),
                    "ref.dangling",
                    format!("'{}' is not a read tool of this registry", c.tool),
                    "name a tool with effect: read; its answer is shown to the approver",
                ));
            }
        }
    }
    for (name, w) in &gateway.approvals.notify {
        let path = format!("approvals.notify.{name}");
        match (&w.url, &w.url_env) {
            (Some(_), Some(_)) | (None, None) => out.push(finding(
                "toolgate.yaml",
                path.clone(),
                "config.notify-url",
                "set exactly one of url and url_env".to_string(),
                "url: https://…, or url_env: NAME_OF_A_VARIABLE holding it",
            )),
            (Some(u), None) if !(u.starts_with("http://") || u.starts_with("https://")) => out
                .push(finding(
                    "toolgate.yaml",
                    format!("{path}.url"),
                    "config.notify-url",
                    "the URL is not http:// or https://".to_string(),
                    "a webhook URL such as https://hooks.slack.com/services/…",
                )),
            _ => {}
        }
        for (j, r) in w.roles.iter().enumerate() {
            if !roles.contains(&r.as_str()) {
                out.push(finding(
                    "toolgate.yaml",
                    format!("{path}.roles[{j}]"),
                    "ref.dangling",
                    format!("role '{r}' is not declared"),
                    "name a role declared in principals.yaml",
                ));
            }
        }
        if let Some(p) = policies {
            for (j, r) in w.rules.iter().enumerate() {
                if r != "gate.always" && !p.info(r).is_some_and(|i| i.gate) {
                    out.push(finding(
                        "toolgate.yaml",
                        format!("{path}.rules[{j}]"),
                        "ref.dangling",
                        format!("'{r}' is not the @id of a @gate policy"),
                        "name a policy marked @gate, or gate.always for tools gated always",
                    ));
                }
            }
        }
    }
    for (rule, g) in &gateway.approvals.gates {
        if let Some(n) = g.approvers
            && !(1..=5).contains(&n)
        {
            out.push(finding(
                "toolgate.yaml",
                format!("approvals.gates.{rule}.approvers"),
                "config.approvers",
                format!("approvers is {n}"),
                "between 1 and 5 distinct people",
            ));
        }
        if let Some(p) = policies
            && !p.info(rule).is_some_and(|i| i.gate)
        {
            out.push(finding(
                "toolgate.yaml",
                format!("approvals.gates.{rule}"),
                "ref.dangling",
                format!("'{rule}' is not the @id of a @gate policy"),
                "key approvals.gates by the @id of a policy marked @gate",
            ));
        }
    }
    for (i, p) in pfile.principals.iter().enumerate() {
        if let Some(person_id) = &p.on_behalf_of {
            let problem = match person(person_id) {
                Some(true) if person_id == &p.id => Some("a principal does not act for itself"),
                Some(true) => None,
                Some(false) => Some("it names an agent; an agent acts for a person"),
                None => Some("it is not a declared principal"),
            };
            if let Some(why) = problem {
                out.push(finding(
                    "principals.yaml",
                    format!("principals[{i}].on_behalf_of"),
                    "ref.dangling",
                    format!("on_behalf_of '{person_id}': {why}"),
                    "name the person (kind: human) this agent acts for",
                ));
            }
        }
    }
    out
}

fn finding(file: &str, path: String, rule: &str, message: String, fix: &str) -> Finding {
    Finding {
        file: file.to_string(),
        path,
        rule: rule.to_string(),
        message,
        fix: fix.to_string(),
    }
}

/// The `@gate` rules that may gate `tool`: `gate.always` for a tool gated always, and each
/// `@gate` policy whose text names the tool's action or names no action at all.
fn gate_rules(registry: &Registry, t: &crate::registry::Tool) -> Vec<String> {
    let mut out = Vec::new();
    if t.config.gate == Gate::Always {
        out.push("gate.always".to_string());
    }
    if t.config.tier == Tier::Read {
        return out;
    }
    for p in registry.policies.all().filter(|p| p.gate && !p.shadow) {
        let names_action = p.text.contains("Action::\"");
        if !names_action || p.text.contains(&format!("Action::\"{}\"", t.config.name)) {
            out.push(p.id.clone());
        }
    }
    out
}

/// The lint's segregation-of-duties findings: a gate fewer people may approve than it needs
/// (`approval.nobody`), and a person who may approve a gate on a tool they (or an agent acting
/// for them) may also call (`approval.self`). The engine refuses self-approval regardless; the
/// finding is for the registry's reviewer.
pub fn lint(registry: &Registry) -> Vec<Finding> {
    let mut out = Vec::new();
    for t in registry.tools() {
        for rule in gate_rules(registry, t) {
            let set = registry.approvers(t.name(), &rule);
            let eligible: Vec<&str> = registry
                .principals()
                .iter()
                .filter(|p| {
                    p.config.kind == PrincipalKind::Human
                        && registry.may_approve(p.id(), "", t.name(), &rule).is_ok()
                })
                .map(|p| p.id())
                .collect();
            if eligible.len() < set.count as usize {
                out.push(finding(
                    &t.file,
                    format!("tools[{}].approved_by", t.index),
                    "approval.nobody",
                    format!(
                        "{} gated under {rule} needs {} approver(s), and {} may approve it ({}): \
                         every such call waits until it expires",
                        t.name(),
                        set.count,
                        if eligible.is_empty() {
                            "nobody".to_string()
                        } else {
                            format!("only {}", eligible.join(", "))
                        },
                        set
                    ),
                    "name roles or people who may approve (`approved_by: {roles: [...]}`, or \
                     `approvals.gates.<rule>` in toolgate.yaml), each a person (kind: human)",
                ));
            }
            for person in &eligible {
                let requesters: Vec<&str> = registry
                    .principals()
                    .iter()
                    .filter(|r| {
                        registry.requesting_people(r.id()).contains(person)
                            && t.is_listed_for(r.role())
                    })
                    .map(|r| r.id())
                    .collect();
                if let Some(r) = requesters.first() {
                    let i = registry
                        .principals()
                        .iter()
                        .position(|p| p.id() == *person)
                        .unwrap_or(0);
                    out.push(finding(
                        "principals.yaml",
                        format!("principals[{i}]"),
                        "approval.self",
                        format!(
                            "'{person}' may approve {} under {rule} and may also request it{}: \
                             one person holds both duties (their own requests are refused, but \
                             they approve their colleagues' under the same role)",
                            t.name(),
                            if *r == *person {
                                String::new()
                            } else {
                                format!(" (through '{r}', which acts for them)")
                            }
                        ),
                        "give requesting and approving to different roles, or name the \
                         approvers with `approved_by`",
                    ));
                }
            }
        }
    }
    out
}

/// The approvers of every gate, for `toolgate capabilities` and tests.
pub fn gates_of(registry: &Registry) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for t in registry.tools() {
        for rule in gate_rules(registry, t) {
            let set = registry.approvers(t.name(), &rule);
            out.insert(
                (t.name().to_string(), rule),
                format!("{} × {set}", set.count),
            );
        }
    }
    out
}

//! Budgets over a sliding window: the sum of a declared numeric input (an amount) or the number
//! of calls, per principal and optionally per the value of a key input (a supplier, a recipient
//! domain), within the last `window` (`sum of amount over 24h ≤ 20,000 EUR`, `at most 3 calls
//! per supplier per hour`). Daily counts say how often; these say how much, and to whom.
//!
//! This module is the pure half: the checked declaration, what one call needs and what the
//! window holds, and the refusal that says what is left and when it frees up. The store holds
//! the reservations and takes them atomically; both sides judge with [`WindowBudget::assess`].
//!
//! Amounts are kept as integers in units of 1/10,000 (Cedar's `decimal` precision), so sums are
//! exact and the same on both backends.

use std::collections::{HashMap, HashSet};

use cedar_policy::RestrictedExpression;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{DestinationKind, WindowBudgetConfig};
use crate::error::CoreError;
use crate::model::Timestamp;
use crate::registry::{Finding, Principal, Registry, Tool};
use crate::rule::Rule;

/// Units per 1 of a summed input: four fraction digits, as Cedar's `decimal`.
pub const SCALE: i64 = 10_000;

/// The longest window: reservations older than this are never read again.
pub const MAX_WINDOW_MS: i64 = 31 * 86_400_000;

/// What a budget measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// The sum of a numeric input.
    Sum,
    /// The number of calls.
    Count,
}

/// A window budget, checked at load: its field and key exist, its window and limits parse.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowBudget {
    pub id: String,
    pub measure: Measure,
    /// The summed input (for [`Measure::Sum`]).
    pub field: Option<String>,
    pub unit: Option<String>,
    pub window_ms: i64,
    /// The window as declared (`24h`), for messages.
    pub window: String,
    /// The input whose value splits the budget.
    pub key: Option<String>,
    pub key_kind: DestinationKind,
    /// The limit in units (sums) or calls (counts).
    pub limit: i64,
    /// Limits that differ for named principals.
    pub limits: HashMap<String, i64>,
}

/// One reservation in a window: when it was taken and how much it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub at: Timestamp,
    pub amount: i64,
}

/// What the windows hold for one call, as the store read them: per budget, per principal of
/// the chain, the live reservations under the call's key, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowView {
    pub held: HashMap<String, HashMap<String, Vec<Held>>>,
}

impl WindowView {
    pub fn held(&self, budget: &str, principal: &str) -> &[Held] {
        self.held
            .get(budget)
            .and_then(|m| m.get(principal))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn set(&mut self, budget: &str, principal: &str, held: Vec<Held>) {
        self.held
            .entry(budget.to_string())
            .or_default()
            .insert(principal.to_string(), held);
    }
}

/// How one call stands against one principal's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assessment {
    /// What the window holds now.
    pub used: i64,
    pub limit: i64,
    /// What this call needs.
    pub need: i64,
    /// When the oldest reservation in the window leaves it.
    pub oldest_leaves: Option<Timestamp>,
    /// When enough has left the window for this call to fit; `None` if it fits now or never.
    pub fits_at: Option<Timestamp>,
}

impl Assessment {
    pub fn left(&self) -> i64 {
        (self.limit - self.used).max(0)
    }
    pub fn fits(&self) -> bool {
        self.used.saturating_add(self.need) <= self.limit
    }
}

impl WindowBudget {
    /// The rule a refusal by this budget names.
    pub fn rule(&self) -> Rule {
        Rule::window(&self.id)
    }

    /// The limit that holds for `principal`.
    pub fn limit_for(&self, principal: &str) -> i64 {
        self.limits.get(principal).copied().unwrap_or(self.limit)
    }

    /// The window a call falls into: its key's value (empty without a key). `None` when the
    /// inputs do not carry it (they are then refused by the schema check).
    pub fn key_of(&self, inputs: &Value) -> Option<String> {
        let Some(field) = &self.key else {
            return Some(String::new());
        };
        match inputs.get(field)? {
            Value::String(s) => match self.key_kind {
                DestinationKind::Exact => Some(s.clone()),
                DestinationKind::EmailDomain => s
                    .rsplit_once('@')
                    .map(|(_, d)| d.to_ascii_lowercase())
                    .filter(|d| !d.is_empty()),
                DestinationKind::UrlHost => crate::decide::url_host(s),
            },
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// What one call needs: its amount in units, or one call. `None` when the inputs do not
    /// carry a usable amount (the schema check refuses them).
    pub fn amount_of(&self, inputs: &Value) -> Option<i64> {
        match self.measure {
            Measure::Count => Some(1),
            Measure::Sum => {
                let n = inputs.get(self.field.as_deref()?)?.as_number()?;
                to_units(n).ok().filter(|u| *u >= 0)
            }
        }
    }

    /// How a call needing `need` stands against `held` (any order) at `now`.
    pub fn assess(&self, principal: &str, held: &[Held], need: i64, now: Timestamp) -> Assessment {
        let mut live: Vec<Held> = held
            .iter()
            .copied()
            .filter(|h| h.at.millis() + self.window_ms > now.millis())
            .collect();
        live.sort_by_key(|h| h.at);
        let used: i64 = live.iter().map(|h| h.amount).sum();
        let limit = self.limit_for(principal);
        let mut a = Assessment {
            used,
            limit,
            need,
            oldest_leaves: live
                .first()
                .map(|h| Timestamp::from_millis(h.at.millis() + self.window_ms)),
            fits_at: None,
        };
        if !a.fits() && need <= limit {
            let mut remaining = used;
            for h in &live {
                remaining -= h.amount;
                if remaining + need <= limit {
                    a.fits_at = Some(Timestamp::from_millis(h.at.millis() + self.window_ms));
                    break;
                }
            }
        }
        a
    }

    /// An amount in this budget's terms: `4,180.5 EUR`, or `3 calls`.
    pub fn show(&self, units: i64) -> String {
        match self.measure {
            Measure::Count => format!("{units} call{}", if units == 1 { "" } else { "s" }),
            Measure::Sum => {
                let n = show_units(units);
                match &self.unit {
                    Some(u) => format!("{n} {u}"),
                    None => n,
                }
            }
        }
    }

    /// What the budget is, in a phrase: `sum of amount over 24h, at most 20,000 EUR`.
    fn describe(&self, limit: i64, key: &str) -> String {
        let per = match (&self.key, key.is_empty()) {
            (Some(k), false) => format!(" for {k} '{key}'"),
            _ => String::new(),
        };
        match self.measure {
            Measure::Sum => format!(
                "sum of {} over {}{per}, at most {}",
                self.field.as_deref().unwrap_or_default(),
                self.window,
                self.show(limit)
            ),
            Measure::Count => format!("at most {} per {}{per}", self.show(limit), self.window),
        }
    }

    /// The refusal: whose window, what it holds, what is left, and when it frees up.
    pub fn refusal(&self, a: &Assessment, whose: &str, caller: &str, key: &str) -> String {
        let who = if whose == caller {
            format!("'{whose}'")
        } else {
            format!("'{whose}' (which '{caller}' draws from)")
        };
        let mut msg = format!(
            "window budget '{}' of {who} ({}): {} used, {} left, this call needs {}",
            self.id,
            self.describe(a.limit, key),
            self.show(a.used),
            self.show(a.left()),
            self.show(a.need)
        );
        if a.need > a.limit {
            msg.push_str(
                "; this call alone is more than the whole budget, so it never fits: split it or \
                 ask for a higher limit",
            );
            return msg;
        }
        if let Some(t) = a.oldest_leaves {
            msg.push_str(&format!(
                "; it frees up at {}, when the oldest reservation leaves the window",
                utc(t)
            ));
        }
        if let Some(t) = a.fits_at
            && Some(t) != a.oldest_leaves
        {
            msg.push_str(&format!("; this call fits again from {}", utc(t)));
        }
        msg
    }
}

/// How a call stands against every window budget of its tool, for the engine.
#[derive(Debug, Default)]
pub(crate) struct WindowCheck {
    /// The first refusal: (rule, detail).
    pub failure: Option<(Rule, String)>,
    /// What each budget holds, for the check's detail.
    pub notes: Vec<String>,
    /// What policies see of each budget.
    pub context: Vec<WindowFacts>,
}

/// One budget as policies see it: the caller's use and limit, and the least left along its
/// parent chain, before this call.
#[derive(Debug)]
pub(crate) struct WindowFacts {
    pub id: String,
    pub measure: Measure,
    pub used: i64,
    pub limit: i64,
    pub left: i64,
}

/// Judges a call (with valid inputs) against its tool's window budgets, for the caller and
/// each ancestor. `None` when the tool has none.
pub(crate) fn check(
    registry: &Registry,
    tool: &Tool,
    principal: &Principal,
    inputs: &Value,
    view: &WindowView,
    now: Timestamp,
) -> Option<WindowCheck> {
    if tool.windows.is_empty() {
        return None;
    }
    let mut out = WindowCheck::default();
    let chain: Vec<&str> = std::iter::once(principal.id())
        .chain(principal.ancestors.iter().map(String::as_str))
        .filter(|id| registry.principal(id).is_some())
        .collect();
    for b in &tool.windows {
        let (Some(key), Some(need)) = (b.key_of(inputs), b.amount_of(inputs)) else {
            // Valid inputs always carry both; if they do not, the budget fails closed.
            out.failure.get_or_insert_with(|| {
                (
                    b.rule(),
                    format!(
                        "window budget '{}' cannot measure this call's inputs, so it is refused",
                        b.id
                    ),
                )
            });
            continue;
        };
        let mut least_left = i64::MAX;
        let mut own = (0, b.limit_for(principal.id()));
        for id in &chain {
            let a = b.assess(id, view.held(&b.id, id), need, now);
            if *id == principal.id() {
                own = (a.used, a.limit);
            }
            least_left = least_left.min(a.left());
            if !a.fits() && out.failure.is_none() {
                out.failure = Some((b.rule(), b.refusal(&a, id, principal.id(), &key)));
            }
            out.notes.push(format!(
                "{}[{id}{}]: {}/{}",
                b.id,
                if key.is_empty() {
                    String::new()
                } else {
                    format!(" {key}")
                },
                b.show(a.used),
                b.show(a.limit)
            ));
        }
        out.context.push(WindowFacts {
            id: b.id.clone(),
            measure: b.measure,
            used: own.0,
            limit: own.1,
            left: least_left.max(0),
        });
    }
    Some(out)
}

/// `context.budgets` for a call: per budget, the caller's `used` and `limit` and the least
/// `left` along its parent chain (before this call), in the budget's type.
pub(crate) fn context(check: &WindowCheck) -> RestrictedExpression {
    let value = |m: Measure, v: i64| match m {
        Measure::Count => RestrictedExpression::new_long(v),
        Measure::Sum => RestrictedExpression::new_decimal(decimal_literal(v)),
    };
    RestrictedExpression::new_record(check.context.iter().map(|f| {
        (
            f.id.clone(),
            RestrictedExpression::new_record([
                ("used".to_string(), value(f.measure, f.used)),
                ("limit".to_string(), value(f.measure, f.limit)),
                ("left".to_string(), value(f.measure, f.left)),
            ])
            .expect("distinct keys"),
        )
    }))
    .expect("budget ids are unique per tool")
}

/// The Cedar schema of `context.budgets` for a tool's budgets.
pub fn context_schema(budgets: &[WindowBudgetConfig]) -> Value {
    let mut attrs = serde_json::Map::new();
    for b in budgets {
        let t = if b.sum.is_some() {
            json!({"type": "Extension", "name": "decimal"})
        } else {
            json!({"type": "Long"})
        };
        attrs.insert(
            b.id.clone(),
            json!({"type": "Record", "attributes": {"used": t, "limit": t, "left": t}}),
        );
    }
    json!({"type": "Record", "attributes": attrs})
}

/// A JSON number in units of 1/10,000; more fraction digits than that are refused.
pub fn to_units(n: &serde_json::Number) -> Result<i64, CoreError> {
    if let Some(i) = n.as_i64() {
        return i
            .checked_mul(SCALE)
            .ok_or_else(|| CoreError::TooLarge(n.clone()));
    }
    let f = n.as_f64().ok_or_else(|| CoreError::NotANumber(n.clone()))?;
    let scaled = (f * SCALE as f64).round();
    if !scaled.is_finite() || scaled.abs() >= 9.0e18 {
        return Err(CoreError::TooLarge(n.clone()));
    }
    if ((scaled / SCALE as f64) - f).abs() > f64::EPSILON * f.abs().max(1.0) * 4.0 {
        return Err(CoreError::TooPrecise(n.clone()));
    }
    Ok(scaled as i64)
}

fn decimal_literal(units: i64) -> String {
    let sign = if units < 0 { "-" } else { "" };
    let u = units.unsigned_abs();
    format!("{sign}{}.{:04}", u / SCALE as u64, u % SCALE as u64)
}

/// `20,000`, `4,180.5`, `0.25`.
fn show_units(units: i64) -> String {
    let whole = (units / SCALE).unsigned_abs().to_string();
    let mut grouped = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let frac = (units % SCALE).unsigned_abs();
    let sign = if units < 0 { "-" } else { "" };
    if frac == 0 {
        format!("{sign}{grouped}")
    } else {
        let f = format!("{frac:04}");
        format!("{sign}{grouped}.{}", f.trim_end_matches('0'))
    }
}

/// `2026-11-30 09:12:03 UTC`.
pub fn utc(t: Timestamp) -> String {
    t.to_utc_text()
}

/// `90s`, `15m`, `1h`, `24h`, `7d` in milliseconds.
pub fn parse_window(s: &str) -> Option<i64> {
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: i64 = n.parse().ok()?;
    let ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).filter(|w| *w > 0)
}

/// Checks one tool's window budgets against its schema and the declared principals. Every
/// problem is a finding at `tools[i].window_budgets[j]…`; a budget with any is left out.
pub fn compile(
    file: &str,
    index: usize,
    budgets: &[WindowBudgetConfig],
    schema: &Value,
    principals: &HashSet<&str>,
    findings: &mut Vec<Finding>,
) -> Vec<WindowBudget> {
    let props = schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let type_of = |field: &str| {
        props
            .and_then(|p| p.get(field))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
    };
    let mut out = Vec::new();
    for (j, b) in budgets.iter().enumerate() {
        let base = format!("tools[{index}].window_budgets[{j}]");
        let mut problems: Vec<(String, &str, String, String)> = Vec::new();
        let mut problem = |at: &str, rule: &'static str, message: String, fix: &str| {
            problems.push((format!("{base}.{at}"), rule, message, fix.to_string()))
        };

        let ident = b.id.starts_with(|c: char| c.is_ascii_lowercase())
            && b.id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ident {
            problem(
                "id",
                "budget.id",
                format!("'{}' is not a budget id", b.id),
                "lowercase letters, digits and _, starting with a letter (`payment_value_24h`): \
                 policies read it as context.budgets.<id>",
            );
        }

        let window_ms = parse_window(&b.window).filter(|w| *w <= MAX_WINDOW_MS);
        if window_ms.is_none() {
            problem(
                "window",
                "budget.window",
                format!("'{}' is not a window of at most 31 days", b.window),
                "a whole number and a unit: `90s`, `15m`, `1h`, `24h`, `7d` (at most `31d`)",
            );
        }

        let measure = if b.sum.is_some() {
            Measure::Sum
        } else {
            Measure::Count
        };
        if let Some(field) = &b.sum {
            let prop = props.and_then(|p| p.get(field));
            let floor = prop.and_then(|p| {
                p.get("minimum")
                    .or_else(|| p.get("exclusiveMinimum"))
                    .and_then(Value::as_f64)
            });
            if !matches!(type_of(field), Some("number" | "integer")) {
                problem(
                    "sum",
                    "budget.sum-field",
                    format!("'{field}' is not a numeric input of this tool"),
                    "name a top-level input of `type: number` or `integer` (the amount)",
                );
            } else if !required.contains(&field.as_str()) {
                problem(
                    "sum",
                    "budget.sum-field",
                    format!(
                        "'{field}' is optional, so a call could leave it out and spend nothing"
                    ),
                    "list the summed input in the schema's `required`",
                );
            } else if floor.is_none_or(|f| f < 0.0) {
                problem(
                    "sum",
                    "budget.sum-field",
                    format!(
                        "'{field}' may be negative, and a negative amount would give budget back"
                    ),
                    "give the input `minimum: 0` or `exclusiveMinimum: 0`",
                );
            }
        }

        let limit_fix = "a sum limit is a number above 0 with at most four fraction digits; a count \
                         limit a whole number above 0";
        let limit = limit_units(measure, &b.limit);
        if let Err(m) = &limit {
            problem("limit", "budget.limit", m.to_string(), limit_fix);
        }
        let mut limits = HashMap::new();
        for (who, n) in &b.limits {
            if !principals.contains(who.as_str()) {
                problem(
                    &format!("limits.{who}"),
                    "ref.dangling",
                    format!("'{who}' is not a declared principal"),
                    "name a principal declared in principals.yaml",
                );
            }
            match limit_units(measure, n) {
                Ok(u) => {
                    limits.insert(who.clone(), u);
                }
                Err(m) => problem(
                    &format!("limits.{who}"),
                    "budget.limit",
                    m.to_string(),
                    limit_fix,
                ),
            }
        }

        let key_kind = b.key_kind.unwrap_or(DestinationKind::Exact);
        match &b.key {
            Some(key) if !matches!(type_of(key), Some("string" | "integer")) => problem(
                "key",
                "budget.key-field",
                format!("'{key}' is not a string or integer input of this tool"),
                "name a top-level input that identifies the counterparty (`supplier_id`)",
            ),
            Some(key) if !required.contains(&key.as_str()) => problem(
                "key",
                "budget.key-field",
                format!("'{key}' is optional, so a call could leave it out of every window"),
                "list the key input in the schema's `required`",
            ),
            Some(key) if key_kind != DestinationKind::Exact && type_of(key) != Some("string") => {
                problem(
                    "key_kind",
                    "budget.key-field",
                    format!("'{key}' is not a string, so it has no {key_kind:?} part"),
                    "use `key_kind: exact`, or key on a string input",
                )
            }
            None if b.key_kind.is_some() => problem(
                "key_kind",
                "budget.key-field",
                "key_kind without a key".into(),
                "name the input with `key:`, or drop `key_kind`",
            ),
            _ => {}
        }

        match (window_ms, limit, problems.is_empty()) {
            (Some(window_ms), Ok(limit), true) => out.push(WindowBudget {
                id: b.id.clone(),
                measure,
                field: b.sum.clone(),
                unit: b.unit.clone(),
                window_ms,
                window: b.window.trim().to_string(),
                key: b.key.clone(),
                key_kind,
                limit,
                limits,
            }),
            _ => findings.extend(
                problems
                    .into_iter()
                    .map(|(path, rule, message, fix)| Finding {
                        file: file.to_string(),
                        path,
                        rule: rule.to_string(),
                        message,
                        fix,
                    }),
            ),
        }
    }
    out
}

/// A declared limit in units: a sum's in 1/10,000, a count's in calls; above 0 either way.
fn limit_units(measure: Measure, n: &serde_json::Number) -> Result<i64, CoreError> {
    match measure {
        Measure::Count => n
            .as_i64()
            .filter(|v| *v > 0)
            .ok_or_else(|| CoreError::NotACount(n.clone())),
        Measure::Sum => match to_units(n)? {
            u if u > 0 => Ok(u),
            _ => Err(CoreError::NotAbove0(n.clone())),
        },
    }
}

/// The lint of a tool's window budgets: a per-key budget keyed on a free string can be
/// dodged by spelling the same counterparty another way (`SUP-0001`, `sup-0001 `).
pub fn lint_tool(file: &str, base: &str, t: &crate::config::ToolConfig, out: &mut Vec<Finding>) {
    for (j, b) in t.window_budgets.iter().enumerate() {
        let Some(key) = &b.key else { continue };
        let Some(prop) = t
            .input_schema
            .get("properties")
            .and_then(|p| p.get(key))
            .and_then(Value::as_object)
        else {
            continue;
        };
        let is_string = prop.get("type").and_then(Value::as_str) == Some("string");
        let pinned = ["pattern", "enum", "const", "format"]
            .iter()
            .any(|k| prop.contains_key(*k));
        if is_string && !pinned {
            out.push(Finding {
                file: file.to_string(),
                path: format!("{base}.window_budgets[{j}].key"),
                rule: "budget.key-unconstrained".into(),
                message: format!(
                    "window budget '{}' keys on '{key}', a free string: the same counterparty \
                     spelt another way gets a fresh window",
                    b.id
                ),
                fix: format!(
                    "give '{key}' a `pattern`, `enum` or `format`, so each counterparty has one spelling"
                ),
            });
        }
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;

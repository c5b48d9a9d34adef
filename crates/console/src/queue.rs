//! The queue: what people work through. Riskiest first (a score weighing the effect, the
//! data's sensitivity, how many people must approve, a new destination and the amount), then
//! oldest; like items (same tool, same gating rule) sit together so an approver reads one kind
//! of decision at a time, with the fields that differ between them marked.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use toolgate_core::{Effect, Registry, Sensitivity, Tier, Timestamp};
use toolgate_store::{ApprovalRequest, ApprovalStatus};

/// Which items to show.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub tool: Option<String>,
    #[serde(default)]
    pub principal: Option<String>,
    #[serde(default)]
    pub run: Option<String>,
}

impl Filter {
    fn keeps(&self, r: &ApprovalRequest) -> bool {
        let nonempty =
            |o: &Option<String>| o.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
        nonempty(&self.tool).is_none_or(|t| r.tool == t)
            && nonempty(&self.principal).is_none_or(|p| r.principal == p)
            // A run id as given, or as the page shows it (its control and direction
            // characters written out, as the filter box holds it).
            && nonempty(&self.run).is_none_or(|run| {
                r.run_id
                    .as_deref()
                    .is_some_and(|id| id == run || crate::fmt::text(id) == run)
            })
    }
}

/// One parked call in the queue.
#[derive(Debug, Clone)]
pub struct QueueItem {
    pub request: ApprovalRequest,
    pub tier: Tier,
    pub effect: Effect,
    /// The tool's data sensitivity.
    pub sensitivity: Sensitivity,
    /// The `amount` input, when the call has one.
    pub amount: Option<f64>,
    /// Milliseconds before the request expires (negative: expired).
    pub time_left_ms: i64,
    pub age_ms: i64,
    /// Destination fields (an IBAN…) that no approved call of the same kind used before.
    pub new_destinations: Vec<String>,
}

impl QueueItem {
    pub fn expired(&self) -> bool {
        self.time_left_ms <= 0 || self.request.status == ApprovalStatus::Expired
    }
}

/// Like items: one tool, one gating rule.
#[derive(Debug, Clone)]
pub struct Group {
    pub tool: String,
    pub rule: String,
    pub items: Vec<QueueItem>,
    /// Top-level input fields whose values are not the same across the group.
    pub varying: BTreeSet<String>,
    /// Every top-level input field seen in the group, in order of first appearance.
    pub fields: Vec<String>,
}

impl QueueItem {
    /// `r` as the queue shows it, judged against every request the store keeps (`all`: the
    /// decided ones are the history new destinations are judged against).
    pub fn of(
        registry: &Registry,
        r: &ApprovalRequest,
        all: &[ApprovalRequest],
        now: Timestamp,
    ) -> QueueItem {
        let tool = registry.tool(&r.tool);
        let (fields, _) = crate::item::compare(registry, r, all);
        QueueItem {
            new_destinations: fields
                .into_iter()
                .filter(|f| f.new_destination)
                .map(|f| f.path)
                .collect(),
            tier: tool.map(|t| t.config.tier).unwrap_or(Tier::Spend),
            sensitivity: tool
                .map(|t| t.config.sensitivity)
                .unwrap_or(Sensitivity::Restricted),
            effect: tool
                .map(|t| t.config.effect)
                .unwrap_or(Effect::Irreversible),
            amount: r.inputs.get("amount").and_then(Value::as_f64),
            time_left_ms: r.expires_at.millis() - now.millis(),
            age_ms: now.millis() - r.created_at.millis(),
            request: r.clone(),
        }
    }

    /// How much harm approving this wrongly could do, in points: the effect (spending,
    /// irreversible), the sensitivity of its data, the number of people its rule asks for (a
    /// rule that wants two was written for the calls that matter most), a destination nobody
    /// approved before, and the amount (by order of magnitude). A restricted, two-person IBAN
    /// change (no amount, tier act) outranks a routine small payment, not the other way round.
    pub fn risk(&self) -> u32 {
        let tier = match self.tier {
            Tier::Spend => 3,
            Tier::Act => 2,
            Tier::Read => 0,
        };
        let effect = match self.effect {
            Effect::Irreversible => 2,
            Effect::Write => 1,
            _ => 0,
        };
        let sensitivity = match self.sensitivity {
            Sensitivity::Restricted => 4,
            Sensitivity::Confidential => 1,
            _ => 0,
        };
        let people = match self.request.approvers_needed {
            n if n >= 2 => 4,
            _ => 0,
        };
        let new_destination = if self.new_destinations.is_empty() {
            0
        } else {
            4
        };
        // 1 point per order of magnitude from 1,000: 1,000 → 1, 10,000 → 2, 100,000 → 3.
        let amount = self
            .amount
            .filter(|a| *a >= 1_000.0)
            .map(|a| (a.log10() - 2.0).floor().clamp(0.0, 4.0) as u32)
            .unwrap_or(0);
        tier + effect + sensitivity + people + new_destination + amount
    }
}

/// The sort key: riskier first (see [`QueueItem::risk`]), then larger amounts, then older.
fn risk_order(a: &QueueItem, b: &QueueItem) -> std::cmp::Ordering {
    b.risk()
        .cmp(&a.risk())
        .then_with(|| {
            b.amount
                .unwrap_or(0.0)
                .partial_cmp(&a.amount.unwrap_or(0.0))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .then_with(|| a.request.created_at.cmp(&b.request.created_at))
        .then_with(|| a.request.approval_id.cmp(&b.request.approval_id))
}

/// Builds the queue from the approval requests (all of them: the decided ones are the history
/// new destinations are judged against): open ones, filtered, sorted by risk then age, grouped.
pub fn build(
    requests: Vec<ApprovalRequest>,
    registry: &Registry,
    now: Timestamp,
    filter: &Filter,
) -> Vec<Group> {
    build_inner(requests, registry, now, filter, None)
}

/// The queue `approver` works: only the requests they may decide (not their own, not those of
/// an agent acting for them, only gates they are an approver of), with data above their
/// sensitivity ceiling masked.
pub fn build_for(
    requests: Vec<ApprovalRequest>,
    registry: &Registry,
    now: Timestamp,
    filter: &Filter,
    approver: &str,
) -> Vec<Group> {
    build_inner(requests, registry, now, filter, Some(approver))
}

fn build_inner(
    requests: Vec<ApprovalRequest>,
    registry: &Registry,
    now: Timestamp,
    filter: &Filter,
    viewer: Option<&str>,
) -> Vec<Group> {
    let mut items: Vec<QueueItem> = requests
        .iter()
        .filter(|r| r.status == ApprovalStatus::Pending && filter.keeps(r))
        .filter(|r| viewer.is_none_or(|v| crate::actions::may_decide(registry, v, r)))
        .map(|r| {
            let mut it = QueueItem::of(registry, r, &requests, now);
            if let Some(v) = viewer {
                it.request.inputs = crate::mask::inputs(registry, v, &r.tool, &r.inputs);
            }
            it
        })
        .collect();
    items.sort_by(risk_order);
    // Groups in the order of their riskiest item; items keep the risk order inside.
    let mut order: Vec<(String, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<QueueItem>> = BTreeMap::new();
    for it in items {
        let key = (it.request.tool.clone(), it.request.rule.to_string());
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push(it);
    }
    order
        .into_iter()
        .map(|key| {
            let items = groups.remove(&key).unwrap_or_default();
            let (fields, varying) = differences(items.iter().map(|i| &i.request.inputs));
            Group {
                tool: key.0,
                rule: key.1,
                items,
                varying,
                fields,
            }
        })
        .collect()
}

/// The top-level fields of a set of input objects, and those whose values differ (a field
/// missing from some objects differs).
pub fn differences<'a>(inputs: impl Iterator<Item = &'a Value>) -> (Vec<String>, BTreeSet<String>) {
    let inputs: Vec<&Value> = inputs.collect();
    let mut fields: Vec<String> = Vec::new();
    for v in &inputs {
        if let Some(o) = v.as_object() {
            for k in o.keys() {
                if !fields.contains(k) {
                    fields.push(k.clone());
                }
            }
        }
    }
    let varying = fields
        .iter()
        .filter(|f| {
            let mut vals = inputs.iter().map(|v| v.get(f.as_str()));
            let first = vals.next().flatten();
            vals.any(|x| x != first)
        })
        .cloned()
        .collect();
    (fields, varying)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolgate_core::InputHash;

    fn item(
        id: &str,
        tier: Tier,
        sensitivity: Sensitivity,
        people: i64,
        amount: Option<f64>,
    ) -> QueueItem {
        QueueItem {
            request: ApprovalRequest {
                approval_id: id.into(),
                subject: id.into(),
                run_id: None,
                principal: "fin-worker".into(),
                tool: id.into(),
                tool_version: "1".into(),
                input_hash: InputHash::from_stored("sha256:00"),
                inputs: json!({}),
                reason: None,
                evidence: vec![],
                rule: "gate".into(),
                approvers_needed: people,
                approved_by: vec![],
                status: ApprovalStatus::Pending,
                created_at: Timestamp::from_millis(0),
                expires_at: Timestamp::from_millis(1),
                decided_at: None,
                decided_by: None,
            },
            tier,
            effect: if tier == Tier::Spend {
                Effect::Irreversible
            } else {
                Effect::Write
            },
            sensitivity,
            amount,
            time_left_ms: 1,
            age_ms: 0,
            new_destinations: vec![],
        }
    }

    /// The finance queue's shape: routine payments of a few thousand euros, one large one,
    /// and a restricted, two-person IBAN change (no amount, tier act). The IBAN change comes
    /// first, the large payment before the routine ones, and a small internal note last.
    #[test]
    fn a_restricted_two_person_iban_change_is_not_last() {
        let mut items = [
            item(
                "pay-4180",
                Tier::Spend,
                Sensitivity::Confidential,
                1,
                Some(4180.0),
            ),
            item("note", Tier::Act, Sensitivity::Internal, 1, None),
            item("iban-change", Tier::Act, Sensitivity::Restricted, 2, None),
            item(
                "pay-48000",
                Tier::Spend,
                Sensitivity::Confidential,
                1,
                Some(48_000.0),
            ),
            item(
                "pay-980",
                Tier::Spend,
                Sensitivity::Confidential,
                1,
                Some(980.0),
            ),
        ];
        items.sort_by(risk_order);
        let order: Vec<&str> = items
            .iter()
            .map(|i| i.request.approval_id.as_str())
            .collect();
        assert_eq!(
            order,
            vec!["iban-change", "pay-48000", "pay-4180", "pay-980", "note"]
        );
        // A new destination lifts a routine payment above a large known one.
        let mut new = item(
            "pay-new-iban",
            Tier::Spend,
            Sensitivity::Confidential,
            1,
            Some(980.0),
        );
        new.new_destinations = vec!["iban".into()];
        assert!(new.risk() > items[1].risk());
    }

    #[test]
    fn differences_mark_only_fields_that_vary() {
        let a = json!({"supplier_id": "SUP-1", "amount": 10, "currency": "EUR"});
        let b = json!({"supplier_id": "SUP-2", "amount": 10, "currency": "EUR", "note": "x"});
        let (fields, varying) = differences([&a, &b].into_iter());
        assert_eq!(fields, vec!["supplier_id", "amount", "currency", "note"]);
        assert_eq!(
            varying.into_iter().collect::<Vec<_>>(),
            vec!["note".to_string(), "supplier_id".to_string()]
        );
    }
}

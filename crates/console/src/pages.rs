//! The HTML, rendered on the server with maud: plain forms and links, so the page works with
//! the keyboard alone (Tab order follows reading order, focus is always visible, every action
//! is a real button) and needs no build step. The only script moves focus with `j`/`k` in the
//! queue.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde_json::Value;
use toolgate_store::{ApprovalStatus, Step};

use crate::fmt::{datetime, duration_ms, plain, short, text, value};
use crate::item::ItemView;
use crate::queue::{Filter, Group};
use crate::report::Report;
use crate::svg;

const CSS: &str = r#"
:root { --fg:#1b1b1b; --muted:#5a5a5a; --line:#d0d0d0; --bg:#fff; --accent:#0b57d0; --warn:#b3261e; --warnbg:#fdecea; --okbg:#e7f4ea; --chg:#fff3c4; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 0; }
header { display:flex; gap:1.5rem; align-items:center; padding:.6rem 1.2rem; border-bottom:1px solid var(--line); }
header .who { margin-left:auto; color:var(--muted); }
main { padding: 1rem 1.2rem; max-width: 1200px; }
a { color: var(--accent); }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
.skip { position:absolute; left:-9999px; } .skip:focus { left:1rem; top:.5rem; background:#fff; padding:.3rem; }
table { border-collapse: collapse; width: 100%; margin: .4rem 0 1rem; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); }
code, pre { font: 13px/1.4 ui-monospace, monospace; }
pre { background:#f6f6f6; padding:.6rem; overflow-x:auto; white-space: pre-wrap; word-break: break-all; }
.diff { background: var(--chg); font-weight: 600; }
.changed td { background: var(--chg); }
.new-destination td { background: var(--warnbg); color: var(--warn); font-weight: 700; }
.alert { border: 2px solid var(--warn); background: var(--warnbg); color: var(--warn); padding: .6rem .8rem; font-weight: 600; margin: .6rem 0; }
.ok { border: 2px solid #1e7a34; background: var(--okbg); padding: .6rem .8rem; margin: .6rem 0; }
.expired { color: var(--warn); font-weight: 600; }
.tag { display:inline-block; border:1px solid var(--line); border-radius: 3px; padding: 0 .35rem; font-size: 13px; }
.tier-spend { border-color: var(--warn); color: var(--warn); }
.new-dest { background: var(--warnbg); border-color: var(--warn); color: var(--warn); font-weight: 700; }
.muted { color: var(--muted); }
form.inline { display:inline; }
button { font: inherit; padding: .35rem .9rem; cursor: pointer; }
button.approve { background:#1e7a34; color:#fff; border:1px solid #1e7a34; }
button.reject { background:#fff; color:var(--warn); border:1px solid var(--warn); }
textarea, input[type=text], input[type=password] { font: inherit; width: 100%; max-width: 36rem; padding: .3rem; }
.actions { display:flex; gap:2rem; flex-wrap: wrap; align-items: flex-start; border-top: 1px solid var(--line); padding: .6rem 0; position: sticky; bottom: 0; background: var(--bg); z-index: 2; }
.mismatch td { background: var(--warnbg); color: var(--warn); font-weight: 700; }
.facts th { width: 12rem; }
.since { color: var(--muted); } .since.recent { color: var(--warn); font-weight: 700; }
kbd { border: 1px solid var(--line); border-radius: 3px; padding: 0 .3rem; font-size: 13px; }
@media (max-width: 700px) { .actions { flex-direction: column; gap: .6rem; } main { padding: .6rem; } }
.filters input { width: 12rem; }
.scroll { overflow-x: auto; }
.scroll td, .scroll th { white-space: nowrap; }
main td, main th { overflow-wrap: anywhere; }
main code { overflow-wrap: anywhere; word-break: break-word; }
.scroll td, .scroll th, .scroll code { overflow-wrap: normal; word-break: normal; }
.scroll table { font-size: 14px; }
.scroll td, .scroll th { padding: .3rem .3rem; }
.scroll td.bulk-why { white-space: normal; min-width: 6rem; }
header { flex-wrap: wrap; }
@media (max-width: 700px) { header { gap: .6rem; padding: .5rem .6rem; } .facts th { width: auto; } th, td { padding: .3rem .3rem; } }
"#;

const QUEUE_JS: &str = r#"
document.addEventListener('keydown', function (e) {
  if (e.target.matches('input, textarea') || (e.key !== 'j' && e.key !== 'k')) return;
  var links = Array.prototype.slice.call(document.querySelectorAll('a.item'));
  if (!links.length) return;
  var i = links.indexOf(document.activeElement);
  i = e.key === 'j' ? Math.min(i + 1, links.length - 1) : Math.max(i - 1, 0);
  links[i].focus(); e.preventDefault();
});
"#;

const ITEM_JS: &str = r#"
document.addEventListener('keydown', function (e) {
  var el;
  if (e.target.id === 'reason-input' && e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
    el = document.getElementById('reject-form'); if (el) { el.requestSubmit(); e.preventDefault(); }
    return;
  }
  if (e.target.matches('input, textarea') || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === 'a') { el = document.getElementById('approve'); if (el) { el.click(); e.preventDefault(); } }
  else if (e.key === 'r') { el = document.getElementById('reason-input'); if (el) { el.focus(); e.preventDefault(); } }
  else if (e.key === 'j') { el = document.getElementById('next'); if (el) { el.click(); e.preventDefault(); } }
  else if (e.key === 'k') { el = document.getElementById('back'); if (el) { el.click(); e.preventDefault(); } }
});
"#;

/// The pages' Content-Security-Policy: nothing loads from anywhere, and the only style and
/// script that run are the inline blocks above, named by their sha256 (no `'unsafe-inline'`).
pub fn csp() -> &'static str {
    static CSP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let hash = |text: &str| {
            use base64::Engine as _;
            use sha2::Digest as _;
            let digest = sha2::Sha256::digest(text.as_bytes());
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        };
        format!(
            "default-src 'none'; style-src {}; script-src {} {}; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            hash(CSS),
            hash(QUEUE_JS),
            hash(ITEM_JS)
        )
    });
    &CSP
}

/// The queue's address: the mount point itself (a nested router's `/`).
pub fn home(base: &str) -> String {
    if base.is_empty() {
        "/".into()
    } else {
        base.to_string()
    }
}

/// The frame around every page.
pub fn layout(base: &str, title: &str, who: Option<(&str, &str)>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · toolgate" }
                style { (PreEscaped(CSS)) }
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    strong { "toolgate" }
                    @if who.is_some() {
                        nav {
                            a href=(home(base)) { "Queue" } " · "
                            a href={(base) "/report"} { "Surface numbers" }
                        }
                    }
                    @if let Some((principal, csrf)) = who {
                        span.who {
                            "Signed in as " strong #who { (principal) } " "
                            form.inline method="post" action={(base) "/logout"} {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

pub fn login(base: &str, csrf: &str, error: Option<&str>) -> Markup {
    layout(
        base,
        "Sign in",
        None,
        html! {
            h1 { "Sign in to approve" }
            p.muted { "Approvers sign in with their own API key. Only people whose role may approve can sign in." }
            @if let Some(e) = error { div.alert role="alert" #error { (e) } }
            form method="post" action={(base) "/login"} {
                input type="hidden" name="csrf" value=(csrf);
                label for="api_key" { "API key" } br;
                input #api_key type="password" name="api_key" autocomplete="current-password" autofocus required;
                p { button #sign-in type="submit" { "Sign in" } }
            }
        },
    )
}

fn tier_tag(tier: &str) -> Markup {
    html! { span class={"tag tier-" (tier)} { (tier) } }
}

pub fn queue(
    base: &str,
    who: (&str, &str),
    groups: &[Group],
    offers: &[crate::bulk::GroupOffer],
    filter: &Filter,
    now_label: &str,
) -> Markup {
    let total: usize = groups.iter().map(|g| g.items.len()).sum();
    layout(
        base,
        "Queue",
        Some(who),
        html! {
            h1 { "Waiting for a decision (" (total) ")" }
            p.muted { "Riskiest first (weighing the effect, sensitivity, approvers needed, new destinations and amount), then oldest. Like calls are grouped; "
                span.diff { "marked" } " fields differ within a group. Keys: Tab, or j / k between items. Now: " (now_label) }
            form.filters method="get" action=(home(base)) {
                label { "Tool " input type="text" name="tool" value=(text(filter.tool.as_deref().unwrap_or_default())); } " "
                label { "Principal " input type="text" name="principal" value=(text(filter.principal.as_deref().unwrap_or_default())); } " "
                label { "Run " input type="text" name="run" value=(text(filter.run.as_deref().unwrap_or_default())); } " "
                button type="submit" { "Filter" }
            }
            @if groups.is_empty() { p #empty { "Nothing is waiting." } }
            @for (gi, g) in groups.iter().enumerate() {
                section.group {
                    h2 { code { (g.tool) } " · gated by " code { (g.rule) } " (" (g.items.len()) ")" }
                    @let kept_out = offers.get(gi).map(|o| o.1.as_slice()).unwrap_or_default();
                    @if let Some((Some(o), _)) = offers.get(gi) {
                        form.bulk id={"bulk-" (gi)} method="post" action={(base) "/bulk"} data-count=(o.members.len()) {
                            input type="hidden" name="csrf" value=(who.1);
                            input type="hidden" name="set" value=(o.set());
                            strong { (o.members.len()) " of these " (g.items.len()) " may be approved as one" }
                            " (total " span.bulk-total { (o.total_text()) } "; never new destinations or first-time payees, two-person, reviewer-flagged, possible duplicates, amounts from " (crate::fmt::money(crate::bulk::MAX_AMOUNT, "")) ", facts that warn, or calls that would be refused). Type "
                            code { (o.phrase()) } " to confirm: "
                            input.bulk-confirm type="text" name="confirm" autocomplete="off" required;
                            " " button.approve type="submit" { "Approve these " (o.members.len()) }
                        }
                    }
                    div.scroll { table {
                        thead { tr {
                            th { "Item" } th { "Tier" } th { "Time left" } th { "Waiting" } th { "Approvals" }
                            @for f in g.fields.iter().filter(|f| shown_in_queue(f, &g.fields)) { th { (f) } }
                            th { "Principal" } th { "Run" } th { "Bulk" }
                        } }
                        tbody {
                            @for it in &g.items {
                                @let r = &it.request;
                                tr {
                                    td { a.item href={(base) "/item/" (r.approval_id)} { (short(&r.approval_id)) } }
                                    td { (tier_tag(it.tier.as_str()))
                                        @for d in &it.new_destinations { " " span.tag.new-dest title="no approved call of this kind used it" { "new " (d) } } }
                                    td { @if it.expired() { span.expired { "expired" } } @else { (duration_ms(it.time_left_ms)) } }
                                    td { (duration_ms(it.age_ms)) }
                                    td { (r.approved_by.len()) " of " (r.approvers_needed) }
                                    @for f in g.fields.iter().filter(|f| shown_in_queue(f, &g.fields)) {
                                        td.diff[g.varying.contains(f)] {
                                            @if let Some(v) = r.inputs.get(f.as_str()) { code { (clip(&crate::fmt::cell(f, v, r.inputs.get("currency").and_then(Value::as_str)), 34)) } }
                                        }
                                    }
                                    td { (text(&r.principal)) }
                                    td { @if let Some(run) = &r.run_id { a href={(home(base)) "?run=" (query(run))} { (short(run)) } } }
                                    td.bulk-why { @if let Some((_, why)) = kept_out.iter().find(|(id, _)| *id == r.approval_id) { span.kept-out.muted data-why=(why) { (why) } } }
                                }
                            }
                        }
                    } }
                }
            }
            script { (PreEscaped(QUEUE_JS)) }
        },
    )
}

/// Free-text fields are read on the item page, not compared in the queue; a currency is
/// shown with the amount it belongs to, not in a column of its own.
fn shown_in_queue(field: &str, fields: &[String]) -> bool {
    let free_text = matches!(
        field,
        "reason" | "justification" | "note" | "notes" | "description" | "body" | "message"
    );
    let with_amount = field == "currency" && fields.iter().any(|f| crate::fmt::is_amount(f));
    !free_text && !with_amount
}

#[cfg(test)]
mod short_tests {
    #[test]
    fn ids_are_shortened_by_characters_not_bytes() {
        // Multi-byte characters where a byte slice would cut one in half.
        let id = "run-日本語-é-ü-ß-€-漢字-テスト";
        let s = super::short(id);
        assert!(s.starts_with('…'));
        assert_eq!(s.chars().count(), 13);
        assert_eq!(super::short("run-1"), "run-1");
        assert_eq!(super::short("run\u{202e}x"), "run\\u{202e}x");
    }
}

/// A caller's id as one segment or query value of a link: every byte outside the unreserved
/// set percent-encoded, so an id cannot add a parameter or a path.
fn query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() > n {
        format!("{}…", s.chars().take(n).collect::<String>())
    } else {
        s.to_string()
    }
}

fn status_text(v: &ItemView) -> String {
    if v.expired() {
        "expired".into()
    } else {
        v.request.status.as_str().to_string()
    }
}

fn step_row(base: &str, s: &Step) -> Markup {
    html! {
        tr {
            td { (s.seq) } td { code { (s.tool) } } td { (s.status) }
            td { @if let Some(o) = &s.outcome {
                @if let Some(r) = &o.target_ref { code { (text(r)) } " " }
                @if let Some(e) = &o.error { span.muted { (clip(&text(e), 120)) } }
            } }
            td { @for e in &s.evidence { a href={(base) "/evidence/" (query(e))} { (text(e)) } " " } }
        }
    }
}

/// What the previous decision led to, shown at the top of the next item.
pub struct LastResult {
    pub id: String,
    pub status: String,
    pub text: String,
}

pub fn item(
    base: &str,
    who: (&str, &str),
    v: &ItemView,
    approver: &str,
    last: Option<&LastResult>,
) -> Markup {
    let r = &v.request;
    let alerts = v.new_destinations();
    let already = r.approved_by.iter().any(|a| a == approver);
    let currency = r.inputs.get("currency").and_then(Value::as_str);
    html! {
        (layout(base, "Item", Some(who), html! {
            @if let Some(l) = last {
                div #last-result class=(if l.status == "refused" || l.status == "failed" { "alert" } else { "ok" }) role="status" data-status=(l.status) data-id=(l.id) {
                    "Previous item " code { (short(&l.id)) } ": " (text(&l.text))
                }
            }
            p { a #back href=(home(base)) { "← Queue" }
                @if let Some(n) = &v.next { " · " a #next href={(base) "/item/" (n)} { "Next item →" } }
                span.muted { " · keys: " kbd { "a" } " approve, " kbd { "r" } " reject (type the note, Ctrl+Enter), " kbd { "j" } " next, " kbd { "k" } " back" } }
            h1 { code #tool { (r.tool) } " "
                @if let Some(t) = &v.tool { (tier_tag(&t.tier)) " " span.tag #effect { (t.effect) } } }
            p #status data-status=(status_text(v)) {
                "Status: " strong { (status_text(v)) } " · raised " (datetime(r.created_at))
                " · expires " (datetime(r.expires_at))
                @if !v.expired() && r.status == ApprovalStatus::Pending { " (" (duration_ms(v.time_left_ms())) " left)" }
            }
            @if !v.facts.is_empty() {
                section #facts {
                    h2 { "Decision facts" }
                    @for f in &v.facts {
                        table.facts data-tool=(f.tool) { tbody {
                            @if let Some(e) = &f.error { tr.mismatch { td colspan="2" { "No facts: " (text(e)) } } }
                            @for x in &f.facts {
                                tr id={"fact-" (x.label)} { th { (x.label) } td { code.value { (crate::fmt::cell(&x.label, &x.value, currency)) } @if x.masked { " " span.tag.masked { "masked" } }
                                    @if let Some(since) = &x.since { " " span class=(if since.recent() { "since recent" } else { "since" }) { (since.text()) } } } }
                            }
                            @for m in &f.mismatches {
                                tr.mismatch id={"mismatch-" (m.input)} { th { "MISMATCH" } td { code { (m.input) } " = " code { (crate::fmt::cell(&m.input, &m.sent, currency)) } " but " (m.label) " = " code { (crate::fmt::cell(&m.label, &m.found, currency)) } } }
                            }
                        } }
                    }
                }
            }
            @if !v.duplicates.is_empty() {
                div.alert role="alert" #duplicate-alert {
                    "Possible duplicate: the same operation (same " (v.tool.as_ref().map(|_| "identity").unwrap_or("inputs")) ") is also "
                    @for d in &v.duplicates {
                        a href={(base) "/item/" (d.approval_id)} { (d.status.as_str()) } " (" (text(&d.principal)) ", run " (short(d.run_id.as_deref().unwrap_or("-"))) ", raised " (datetime(d.created_at)) ") "
                    }
                }
            }
            @if let Some((rule, reason)) = &v.would_refuse {
                div.alert role="alert" #will-refuse data-rule=(rule) {
                    "This call will be refused by " code { (rule) } " if approved: " (reason)
                    ". Decided again just now under the current registry and this run's state; approving cannot make it run, so there is no Approve button. Reject it with a note."
                }
            }
            @if v.expired() {
                div.alert role="alert" #expired { "This request has expired. It fails closed and cannot be approved; the call goes back through the gate if the agent retries it." }
            }
            @if !alerts.is_empty() {
                div.alert role="alert" #destination-alert {
                    "New destination: "
                    @for f in &alerts {
                        code { (text(&f.path)) } " = " code.value { (plain(&f.value)) } " "
                    }
                    @if v.comparison.count == 0 {
                        "is a first: no earlier call "
                        @if let Some((pf, pv)) = &v.comparison.party { "for " (pf) " " (plain(pv)) " " } @else { "of this kind " }
                        "was approved"
                    } @else {
                        "was not used by any of the "
                        (v.comparison.count) " approved earlier "
                        @if let Some((pf, pv)) = &v.comparison.party { "calls for " (pf) " " (plain(pv)) } @else { "calls of this tool" }
                    }
                    @if let Some(last) = &v.comparison.last {
                        @for f in &alerts {
                            @if let Some(prev) = &f.previous { " (last approved: " code { (plain(prev)) } ")" }
                        }
                        " — last approved " a href={(base) "/item/" (last.approval_id)} { (datetime(last.created_at)) }
                    }
                    ". Check it against the vendor master before approving."
                }
            }
            @if let (Some(h), false) = (&v.step_hash, v.step_hash.as_ref() == Some(&r.input_hash)) {
                div.alert role="alert" #inputs-changed { "The step's inputs changed after this request was raised (now " code { (h) } "): this request can no longer be approved." }
            }
            @if let Some(done) = &v.already_done {
                div.alert role="alert" #already-done {
                    "This exact call already ran (step " (done.seq) " of this run"
                    @if let Some(r) = done.outcome.as_ref().and_then(|o| o.target_ref.as_ref()) { ", reference " code { (r) } }
                    "). Approving it again can only replay that outcome; it is a duplicate to reject."
                }
            }
            @if let Some(t) = &v.tool {
                p.muted { (t.description) " · version " (t.version) " · effect " strong { (t.effect) } " · tier " strong { (t.tier) } " · sensitivity " (t.sensitivity) }
            }
            h2 { "Why" }
            table { tbody {
                tr { th { "Gated by rule" } td { code #rule { (r.rule) } } }
                tr { th { "Model's reason" } td #reason { @if let Some(x) = &r.reason { (text(x)) } @else { span.muted { "(none given)" } } } }
                tr { th { "Evidence" } td #evidence {
                    @if r.evidence.is_empty() { span.muted { "(none cited)" } }
                    @for e in &r.evidence { a href={(base) "/evidence/" (query(e))} { (text(e)) } " " } } }
                tr { th { "Principal" } td { (text(&r.principal)) } }
                tr { th { "Run" } td { @if let Some(run) = &r.run_id { code #run { (text(run)) } } } }
                tr { th { "Approvals" } td #approvals {
                    (r.approved_by.len()) " of " (r.approvers_needed) " needed"
                    @if let Some(first) = r.approved_by.first() {
                        " · approved first by " strong #first-approver { (first) }
                        @if (r.approved_by.len() as i64) < r.approvers_needed { "; a different person must approve too" }
                    }
                } }
            } }
            @if !v.reviews.is_empty() {
                h2 { "Reviewer checks" }
                p.muted { "A model reviewer's check of this step before it reached you. It approves nothing: only people's approvals count." }
                table #reviews {
                    thead { tr { th { "Reviewer" } th { "Verdict" } th { "Note" } th { "When" } } }
                    tbody { @for rv in &v.reviews {
                        tr class={"review-" (rv.verdict.as_str())} {
                            td { (text(&rv.reviewer)) }
                            td { strong { (rv.verdict.as_str()) } }
                            td { (text(&rv.note)) }
                            td { (datetime(rv.reviewed_at)) }
                        }
                    } }
                }
            }
            h2 { "Inputs, exactly as they will be sent" }
            @if let Some(last) = &v.comparison.last {
                p.muted { "Compared with the last approved call of the same kind (" a href={(base) "/item/" (last.approval_id)} { (datetime(last.created_at)) } "); changed fields are marked." }
            } @else { p.muted { "No earlier approved call of the same kind to compare with." } }
            table #inputs {
                thead { tr { th { "Field" } th { "Value" } th { "Last approved" } th { "Notes" } } }
                tbody {
                    @for f in &v.fields {
                        tr id={"field-" (f.path)} class=(row_class(f)) {
                            th { code { (text(&f.path)) } }
                            td { @match f.value.as_str().filter(|t| t.contains('\n')) {
                                Some(t) => { pre.text-value.value { @for l in crate::fmt::lines(t) { (l) "\n" } } }
                                None => { code.value { (value(&f.value)) } }
                            } }
                            td { @if let Some(p) = &f.previous { code { (value(p)) } } }
                            td {
                                @if let Some(money) = money(f, &v.request.inputs) { span.money { (money) } " " }
                                @if f.new_destination { strong { "NEW destination for this party" } " " }
                                @else if f.changed { "changed " }
                                @if f.destination { span.tag { "destination" } " " }
                                @if f.redacted { span.tag.redacted { "redacted in the audit log" } }
                                @if f.masked { " " span.tag.masked { "masked: above your sensitivity ceiling" } }
                            }
                        }
                    }
                }
            }
            details { summary { "Canonical JSON (what is hashed and sent) · " code #input-hash { (r.input_hash) } }
                pre #canonical { (toolgate_core::clip::json_printable(&v.canonical)) } }
            h2 { "The run so far" }
            @if v.earlier.is_empty() { p.muted { "No earlier steps in this run." } }
            @else {
                table #earlier { thead { tr { th { "#" } th { "Tool" } th { "Status" } th { "Outcome" } th { "Evidence" } } }
                    tbody { @for s in &v.earlier { (step_row(base, s)) } } }
            }
            @if r.status == ApprovalStatus::Pending && !v.expired() {
                div.actions {
                    form #approve-form method="post" action={(base) "/item/" (r.approval_id) "/approve"} {
                        input type="hidden" name="csrf" value=(who.1);
                        @if let Some(n) = &v.next { input type="hidden" name="next" value=(n); }
                        input type="hidden" name="input_hash" value=(r.input_hash);
                        @if already {
                            p { "You approved this already; a second, different approver is needed." }
                        } @else if v.approvable() {
                            button.approve #approve type="submit" { "Approve exactly this" }
                        }
                    }
                    form #reject-form method="post" action={(base) "/item/" (r.approval_id) "/reject"} {
                        input type="hidden" name="csrf" value=(who.1);
                        @if let Some(n) = &v.next { input type="hidden" name="next" value=(n); }
                        label for="reason-input" { "Reason for rejecting (required; the agent and the audit log see it)" } br;
                        textarea #reason-input name="reason" rows="2" required {} br;
                        button.reject #reject type="submit" { "Reject" }
                    }
                }
            }
            @if let (Some(o), ApprovalStatus::Pending, false) = (&v.run_offer, r.status, v.expired()) {
                section #run-approval data-count=(o.members.len()) {
                    h2 { "This run's " (o.members.len()) " parked steps, as one decision" }
                    ol #run-steps { @for (id, hash, tool) in &o.members {
                        li data-id=(id) { a href={(base) "/item/" (id)} { code { (tool) } } " · " code.muted { (short(hash)) } @if *id == r.approval_id { " (this item)" } }
                    } }
                    @if let Some(why) = &o.refusal {
                        div.alert role="alert" #run-refusal { "Cannot be approved together: " (text(why)) ". Decide the steps one by one." }
                    } @else {
                        form #run-approve-form method="post" action={(base) "/run/approve"} {
                            input type="hidden" name="csrf" value=(who.1);
                            input type="hidden" name="run" value=(text(&o.run_id));
                            input type="hidden" name="set" value=(o.set());
                            p.muted { "Each step is approved for exactly the inputs listed (its hash), decided again now, and runs once; nothing is approved if any of them changed." }
                            button.approve #run-approve type="submit" { "Approve all " (o.members.len()) " steps of this run" }
                        }
                    }
                }
            }
            script { (PreEscaped(ITEM_JS)) }
        }))
    }
}

/// An `amount` read as people write money (`= 12,600.50 EUR`), beside the exact value sent,
/// so a misplaced decimal point is hard to miss.
fn money(f: &crate::item::Field, inputs: &Value) -> Option<String> {
    if !crate::fmt::is_amount(&f.path) {
        return None;
    }
    let x = f.value.as_f64()?;
    let currency = inputs.get("currency").and_then(Value::as_str).unwrap_or("");
    Some(format!("= {}", crate::fmt::money(x, currency)))
}

fn row_class(f: &crate::item::Field) -> &'static str {
    if f.new_destination {
        "new-destination"
    } else if f.changed {
        "changed"
    } else {
        ""
    }
}

/// What an approve/reject led to, or why it was refused.
pub fn outcome(
    base: &str,
    who: (&str, &str),
    id: &str,
    ok: bool,
    title: &str,
    lines: &[String],
) -> Markup {
    layout(
        base,
        title,
        Some(who),
        html! {
            div #result class=(if ok { "ok" } else { "alert" }) role="status" data-ok=(ok) {
                strong { (text(title)) }
                @for l in lines { p { (text(l)) } }
            }
            p { a href={(base) "/item/" (id)} { "Back to the item" } " · " a #to-queue href=(home(base)) { "Back to the queue" } }
        },
    )
}

pub fn message(base: &str, who: Option<(&str, &str)>, title: &str, text: &str) -> Markup {
    layout(
        base,
        title,
        who,
        html! { h1 { (title) } div.alert role="alert" #error { (crate::fmt::text(text)) } },
    )
}

/// What the evidence page shows of a resolved id: its description, attributes, relations
/// (to other ids) and the walk of related records.
pub struct EvidenceView {
    pub description: String,
    pub attributes: Vec<(String, Value)>,
    pub relations: Vec<(String, Vec<String>)>,
    pub walk: String,
}

pub fn evidence(
    base: &str,
    who: (&str, &str),
    id: &str,
    found: Option<EvidenceView>,
    note: &str,
) -> Markup {
    let id = text(id);
    layout(
        base,
        &id,
        Some(who),
        html! {
            h1 { "Evidence " code { (id) } }
            @match found {
                Some(EvidenceView { description, attributes: attrs, relations, walk }) => {
                    p { (description) }
                    table { tbody {
                        @for (k, v) in &attrs { tr { th { (k) } td { code { (plain(v)) } } } }
                        @for (rel, targets) in &relations { tr { th { (rel) } td { @for t in targets { a href={(base) "/evidence/" (t)} { (t) } " " } } } }
                    } }
                    h2 { "Related records" }
                    pre { (walk) }
                }
                None => { p.muted { (text(note)) } }
            }
        },
    )
}

pub fn report(base: &str, who: (&str, &str), r: &Report, since: &str) -> Markup {
    layout(
        base,
        "Surface numbers",
        Some(who),
        html! {
            h1 { "Surface numbers" }
            form method="get" action={(base) "/report"} {
                label { "Since (7d, 4w, or 2026-06-01) " input type="text" name="since" value=(since); } " "
                button type="submit" { "Show" }
            }
            p.muted { (r.records) " audit records up to " (datetime(r.until)) "." }
            h2 { "Gates: is each one paying for itself?" }
            p.muted { "r = rejected / decided. A gate pays when undoing a wrong call costs more than 1/r approvals; a gate whose r stays at zero for months can be argued down to the model reviewer." }
            table #gates {
                thead { tr { th { "Tool" } th { "Rule" } th { "Raised" } th { "Approved" } th { "Rejected by people" } th { "Closed by a reviewer" } th { "Closed without people" } th { "Approved, not run" } th { "Expired" } th { "Open" } th { "r" } th { "1/r" } th { "Weekly r" } } }
                tbody { @for g in &r.gates { tr {
                    td { code { (g.tool) } } td { code { (g.rule) } } td { (g.raised) } td.approved { (g.approved) } td.rejected { (g.rejected) } td.reviewer-closed { (g.reviewer_closed) } td.without-people { (g.closed_without_people) } td.not-run { (g.approved_not_run) } td { (g.expired) } td { (g.open) }
                    td { (g.rejection_rate().map(|x| format!("{:.1} %", x * 100.0)).unwrap_or_else(|| "-".into())) }
                    td { (g.break_even().map(|x| format!("{x:.1}")).unwrap_or_else(|| "∞".into())) }
                    td { (PreEscaped(svg::weekly_rates(&g.weeks))) }
                } } }
            }
            h2 { "Approvers: the fatigue signal" }
            p.muted { "Decisions per active day and the median time between one decision and the next (gaps under 15 minutes). Falling times with rising counts are what rubber-stamping looks like." }
            table #approvers {
                thead { tr { th { "Person" } th { "Approved" } th { "Rejected" } th { "Days" } th { "Per day" } th { "Median s per decision" } } }
                tbody {
                    @if r.approvers.is_empty() { tr { td.muted colspan="6" { "No decisions in this period." } } }
                    @for a in &r.approvers { tr {
                        td { (a.approver) } td { (a.approvals) } td { (a.rejections) } td { (a.days) }
                        td { (format!("{:.1}", a.per_day())) }
                        td { (a.median_secs.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())) }
                    } }
                }
            }
            h2 { "Calls by tool and decision" }
            (PreEscaped(svg::bars("Calls by decision", &decision_totals(r))))
            table #calls { thead { tr { th { "Tool" } th { "Decision" } th { "Records" } } }
                tbody { @for ((t, d), n) in &r.calls { tr { td { code { (t) } } td { (d) } td { (n) } } } } }
            h2 { "Refusals by rule" }
            table #refusals { tbody {
                @if r.refusals.is_empty() { tr { td.muted { "None." } } }
                @for (rule, n) in &r.refusals { tr { td { code { (rule) } } td { (n) } } } } }
            h2 { "Approvals, duplicates, unknowns" }
            table { tbody {
                tr { th { "Approvals' age at decision" } td #approval-age { (r.approval_age.n) " decided · p50 " (opt_ms(r.approval_age.p50)) " · p90 " (opt_ms(r.approval_age.p90)) " · max " (opt_ms(r.approval_age.max)) } }
                tr { th { "Duplicates suppressed" } td #duplicates { (r.duplicates_suppressed) " replayed (nothing ran) · " (r.key_conflicts) " key conflicts refused" } }
                tr { th { "Unknown outcomes" } td #unknowns { (r.unknowns.total) " (" (r.unknowns.reconciled) " reconciled, " (r.unknowns.open) " open) · time to reconcile p50 " (opt_ms(r.unknowns.time_to_reconcile.p50)) } }
                tr { th { "Governance latency (decision and reservation)" } td #governance-latency { "n " (r.governance_latency.n) " · p50 " (opt(r.governance_latency.p50)) " µs · p95 " (opt(r.governance_latency.p95)) " µs · p99 " (opt(r.governance_latency.p99)) " µs" } }
                tr { th { "Call latency (handler)" } td #latency { "n " (r.call_latency_us.n) " · p50 " (opt(r.call_latency_us.p50)) " µs · p95 " (opt(r.call_latency_us.p95)) " µs · p99 " (opt(r.call_latency_us.p99)) " µs" } }
            } }
            h2 { "Shadow rules: what enforcing each would change" }
            p.muted { "Evaluated on every call and recorded; they decide nothing. “Let through” are the calls enforcing the rule would have stopped." }
            table #shadow {
                thead { tr { th { "Rule" } th { "Would have" } th { "Matched" } th { "Let through" } th { "Latest calls" } } }
                tbody {
                    @if r.shadow.is_empty() { tr { td.muted colspan="5" { "No shadow rule matched in this period." } } }
                    @for u in &r.shadow { tr {
                        td { code { (u.rule) } }
                        td { (u.verb()) }
                        td { (u.matched) }
                        td { (u.let_through) }
                        td { @for c in u.calls.iter().rev().take(5) {
                            span.call { "#" (c.seq) " " code { (c.tool) } " by " (c.principal) " (" (c.decision) ") " }
                        } }
                    } }
                }
            }
            h2 { "Budget use today" }
            table #budgets { thead { tr { th { "Principal" } th { "Tier" } th { "Used" } th { "Limit" } } }
                tbody { @for b in &r.budgets { tr { td { (b.principal) } td { (b.tier) } td { (b.used) } td { (b.limit.map(|l| l.to_string()).unwrap_or_else(|| "none".into())) } } } } }
        },
    )
}

fn opt(x: Option<i64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn opt_ms(x: Option<i64>) -> String {
    x.map(duration_ms).unwrap_or_else(|| "-".into())
}

fn decision_totals(r: &Report) -> Vec<(String, f64)> {
    let mut m: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
    for ((_, d), n) in &r.calls {
        *m.entry(d.as_str()).or_insert(0.0) += *n as f64;
    }
    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(path: &str, value: Value) -> crate::item::Field {
        crate::item::Field {
            path: path.into(),
            value,
            redacted: false,
            destination: false,
            previous: None,
            changed: false,
            new_destination: false,
            masked: false,
        }
    }

    #[test]
    fn amounts_read_as_money() {
        let inputs = json!({"currency": "EUR"});
        assert_eq!(
            money(&field("amount", json!(12600.5)), &inputs).as_deref(),
            Some("= 12,600.50 EUR")
        );
        assert_eq!(
            money(&field("amount", json!(1234567)), &json!({})).as_deref(),
            Some("= 1,234,567.00")
        );
        assert_eq!(money(&field("invoice_id", json!(5)), &inputs), None);
    }
}

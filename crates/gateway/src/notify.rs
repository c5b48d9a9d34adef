//! Telling people a request was raised: a queue nobody is told about is a queue nobody
//! watches. Each second the notifier puts the newly raised approval requests in the store's
//! outbox, one row per webhook of `approvals.notify` that takes it, and posts the rows that are
//! due: JSON with a Slack-compatible `text` and a link to the item on the approver's page. A
//! failed post is tried again with backoff (1 s doubling to 5 min, ten attempts) and then left
//! failed; `toolgate status` and `/metrics` show both. The call that raised the request has
//! parked long before: nothing here is on its path.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::approvers::NotifyWebhook;
use toolgate_core::clip::{clip, printable};
use toolgate_core::{Registry, Timestamp};
use toolgate_store::{ApprovalRequest, Delivery, Executor, Store};

/// Attempts before a delivery is left failed.
pub const MAX_ATTEMPTS: i64 = 10;
/// How long one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim holds a row: longer than a post may take.
const LEASE_MS: i64 = 30_000;
/// Requests raised this long before the notifier starts are still announced (a restart does
/// not lose the requests raised just before it); older ones are not.
const START_LOOKBACK_MS: i64 = 15 * 60_000;
/// Each look for new requests reaches back this far behind the newest one seen, for requests
/// whose transaction committed after a later one's.
const OVERLAP_MS: i64 = 60_000;
/// Most characters of the agent's reason in the text.
const REASON_CHARS: usize = 300;

/// The wait before attempt `attempts + 1`: 1 s, 2 s, 4 s … up to 5 min.
pub fn backoff(attempts: i64) -> Duration {
    let exp = attempts.clamp(1, 20) - 1;
    Duration::from_secs((1u64 << exp).min(300))
}

/// The approver's page's link to an item: under the public URL's origin and path (its `/mcp`
/// dropped), or the address served.
pub fn item_base(public_url: Option<&str>, served: &str) -> String {
    let root = match public_url {
        Some(u) => {
            let u = u.trim_end_matches('/');
            u.strip_suffix("/mcp").unwrap_or(u).to_string()
        }
        None if served.starts_with("http://") || served.starts_with("https://") => {
            served.trim_end_matches('/').to_string()
        }
        None => format!("http://{served}"),
    };
    format!("{root}/approvals/item/")
}

/// Agent-chosen text as it may appear in a chat message: control characters and direction
/// overrides written out, cut to `max` characters, and Slack's markup characters escaped
/// (so `<!channel>` or a disguised link stays text).
pub fn chat_text(s: &str, max: usize) -> String {
    let shown = printable(s);
    let cut = clip(&shown, max);
    cut.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The JSON posted for `req`, whose item is at `url`.
pub fn payload(req: &ApprovalRequest, url: &str) -> Value {
    let mut text = format!(
        "Approval needed: {} by {} (rule {}",
        chat_text(&req.tool, 128),
        chat_text(&req.principal, 128),
        chat_text(&req.rule, 128),
    );
    if req.approvers_needed > 1 {
        text.push_str(&format!("; {} people must approve", req.approvers_needed));
    }
    text.push(')');
    if let Some(run) = &req.run_id {
        text.push_str(&format!(", run {}", chat_text(run, 64)));
    }
    text.push('.');
    if let Some(reason) = req.reason.as_deref().filter(|r| !r.trim().is_empty()) {
        text.push_str(&format!(" Reason: {}", chat_text(reason, REASON_CHARS)));
    }
    text.push_str(&format!(" <{url}|Open the request>"));
    json!({
        "text": text,
        "approval_id": req.approval_id,
        "tool": req.tool,
        "rule": req.rule,
        "principal": req.principal,
        "run_id": req.run_id,
        "approvers_needed": req.approvers_needed,
        "url": url,
        "created_at": req.created_at.to_rfc3339(),
        "expires_at": req.expires_at.to_rfc3339(),
    })
}

/// Why a notification was not delivered: recorded with the delivery, which is tried again.
#[derive(Debug, thiserror::Error)]
enum NotifyError {
    #[error("the webhook is no longer in approvals.notify")]
    Gone,
    #[error("the environment variable {0} (url_env) is not set")]
    UnsetEnv(String),
    #[error("no url or url_env")]
    NoUrl,
    #[error("reading the request: {0}")]
    Store(#[source] toolgate_store::StoreError),
    #[error("encoding the notification: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the URL is not http:// or https://")]
    Scheme,
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Https(#[source] crate::https::HttpsError),
    // reqwest's Display names only the outermost layer ("error sending request").
    #[error("{}", chain(.0))]
    Http(#[source] reqwest::Error),
    #[error("HTTP status {0}")]
    Status(u16),
}

/// An error and every source beneath it, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The URL a webhook posts to, or why there is none.
fn webhook_url(w: &NotifyWebhook) -> Result<String, NotifyError> {
    match (&w.url, &w.url_env) {
        (Some(u), _) => Ok(u.clone()),
        (None, Some(var)) => std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.trim().to_string())
            .ok_or_else(|| NotifyError::UnsetEnv(var.clone())),
        (None, None) => Err(NotifyError::NoUrl),
    }
}

/// Posts `body` to `url`: Ok on a 2xx answer.
async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Result<(), NotifyError> {
    let bytes = serde_json::to_vec(body).map_err(NotifyError::Encode)?;
    let status = if url.starts_with("https://") {
        tokio::time::timeout(POST_TIMEOUT, crate::https::request(url, None, Some(bytes)))
            .await
            .map_err(|_| NotifyError::Timeout)?
            .map_err(NotifyError::Https)?
            .0
    } else if url.starts_with("http://") {
        client
            .post(url)
            .header("content-type", "application/json")
            .body(bytes)
            .timeout(POST_TIMEOUT)
            .send()
            .await
            .map_err(NotifyError::Http)?
            .status()
            .as_u16()
    } else {
        return Err(NotifyError::Scheme);
    };
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(NotifyError::Status(status))
    }
}

/// Puts the requests raised since `since` in the outbox for their webhooks; returns the
/// newest creation time seen.
async fn enqueue(
    store: &Store,
    registry: &Registry,
    since: Timestamp,
    now: Timestamp,
) -> toolgate_store::Result<Timestamp> {
    let mut newest = since;
    let from = Timestamp::from_millis(since.millis() - OVERLAP_MS);
    for r in store.raised_since(from).await? {
        for dest in registry.notify_targets(&r.tool, &r.rule) {
            store
                .enqueue_notification(&r.approval_id, dest, now)
                .await?;
        }
        newest = newest.max(r.created_at);
    }
    Ok(newest)
}

/// Posts one claimed delivery and records how it went.
async fn deliver(
    store: Store,
    registry: Arc<Registry>,
    client: reqwest::Client,
    base: Arc<str>,
    d: Delivery,
    now: Timestamp,
) {
    let outcome = async {
        let w = registry
            .gateway
            .approvals
            .notify
            .get(&d.destination)
            .ok_or(NotifyError::Gone)?;
        let url = webhook_url(w)?;
        let req = store
            .approval(&d.approval_id)
            .await
            .map_err(NotifyError::Store)?;
        let item = format!("{base}{}", d.approval_id);
        post(&client, &url, &payload(&req, &item)).await
    }
    .await;
    let done = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(now.millis());
    let done = Timestamp::from_millis(done.max(now.millis()));
    let recorded = match &outcome {
        Ok(()) => store.notification_sent(&d, done).await,
        Err(e) => {
            let retry = (d.attempts < MAX_ATTEMPTS).then(|| {
                Timestamp::from_millis(done.millis() + backoff(d.attempts).as_millis() as i64)
            });
            tracing::warn!(
                webhook = %d.destination,
                approval = %d.approval_id,
                attempt = d.attempts,
                error = %e,
                "{}",
                if retry.is_some() { "notification failed; will retry" } else { "notification failed for good" }
            );
            store
                .notification_failed(&d, done, &e.to_string(), retry)
                .await
        }
    };
    if let Err(e) = recorded {
        tracing::warn!(error = %e, "recording a notification's outcome failed");
    }
}

/// Runs the notifier until `shutdown`: announces requests raised from now on (and in the
/// few minutes before), with links under `base` ([`item_base`]). `live` returns the executor
/// of the registry version serving now, so a reload that changes `approvals.notify` applies.
pub async fn run(
    live: impl Fn() -> Executor + Send + 'static,
    base: String,
    shutdown: CancellationToken,
) {
    let base: Arc<str> = base.into();
    let client = reqwest::Client::new();
    let mut since: Option<Timestamp> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let ex = live();
        let registry = ex.registry.clone();
        if registry.gateway.approvals.notify.is_empty() {
            continue;
        }
        let store = &ex.store;
        let now = ex.clock.now();
        let from = *since.get_or_insert(Timestamp::from_millis(now.millis() - START_LOOKBACK_MS));
        match enqueue(store, &registry, from, now).await {
            Ok(newest) => since = Some(newest),
            Err(e) => tracing::warn!(error = %e, "looking for raised requests to announce failed"),
        }
        let claimed = match store.claim_notifications(now, LEASE_MS, 32).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "claiming notifications failed");
                continue;
            }
        };
        let mut posts = tokio::task::JoinSet::new();
        for d in claimed {
            posts.spawn(deliver(
                store.clone(),
                registry.clone(),
                client.clone(),
                base.clone(),
                d,
                now,
            ));
        }
        // One slow webhook holds up the next look by at most POST_TIMEOUT.
        while posts.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(9), Duration::from_secs(256));
        assert_eq!(backoff(10), Duration::from_secs(300));
    }

    #[test]
    fn item_links_follow_the_public_url() {
        assert_eq!(
            item_base(Some("https://gw.example.com/mcp"), "127.0.0.1:8480"),
            "https://gw.example.com/approvals/item/"
        );
        assert_eq!(
            item_base(
                Some("https://x.example.com/toolgate/mcp/"),
                "127.0.0.1:8480"
            ),
            "https://x.example.com/toolgate/approvals/item/"
        );
        assert_eq!(
            item_base(None, "127.0.0.1:8480"),
            "http://127.0.0.1:8480/approvals/item/"
        );
    }

    #[test]
    fn agent_text_cannot_format_or_ping_in_chat() {
        let t = chat_text(
            "pay\u{1b}[31m APPROVED\u{202e} <!channel> <http://evil|ok> & co",
            300,
        );
        assert_eq!(
            t,
            "pay\\u{001b}[31m APPROVED\\u{202e} &lt;!channel&gt; &lt;http://evil|ok&gt; &amp; co"
        );
        let long = chat_text(&"é".repeat(5000), 300);
        assert!(long.chars().count() < 340, "{}", long.len());
    }

    /// The whole message: escape sequences, CR, BEL and every bidi override in the reason and
    /// run id are written out; multi-byte text stays whole; a 100 KB reason is cut.
    #[test]
    fn a_hostile_request_notifies_as_readable_bounded_text() {
        let nasty = "pay\u{1b}[2J\u{7}\r\n\u{202e}NABI\u{2066}x\u{2069} Zürich 東京 🚀";
        let req = ApprovalRequest {
            approval_id: "a-1".into(),
            subject: "s".into(),
            run_id: Some(format!("run-東京🚀\u{202e}{}", "é".repeat(200)).into()),
            principal: "fin-worker".into(),
            tool: "payment.schedule".into(),
            tool_version: "1.0.0".into(),
            input_hash: toolgate_core::InputHash::from_stored("sha256:00"),
            inputs: serde_json::json!({}),
            reason: Some(format!("{nasty} {}", "x".repeat(100_000))),
            evidence: vec![],
            rule: "gate".into(),
            approvers_needed: 2,
            approved_by: vec![],
            status: toolgate_store::ApprovalStatus::Pending,
            created_at: toolgate_core::Timestamp::from_millis(0),
            expires_at: toolgate_core::Timestamp::from_millis(1),
            decided_at: None,
            decided_by: None,
        };
        let body = payload(&req, "https://x.example.com/item/a-1");
        let text = body["text"].as_str().unwrap();
        let raw: Vec<char> = text
            .chars()
            .filter(|c| {
                c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            })
            .collect();
        assert!(raw.is_empty(), "{raw:?}");
        assert!(text.contains("Zürich 東京 🚀"), "{text}");
        assert!(text.contains("run-東京🚀\\u{202e}"), "{text}");
        assert!(text.contains("\\u{001b}[2J"), "{text}");
        assert!(text.len() < 4_000, "{} bytes", text.len());
    }
}

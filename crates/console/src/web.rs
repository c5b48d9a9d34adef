//! The routes. Reads are GETs that change nothing; every state change is a form POST that
//! needs the signed-in session and its CSRF token, and is refused (403) without them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Form, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::header::{CACHE_CONTROL, LOCATION, RETRY_AFTER, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::Markup;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use toolgate_core::ApprovalId;
use toolgate_ontology::Ontology;
use toolgate_store::Executor;

use crate::actions::{self, Approved};
use crate::auth::{
    LOGIN_COOKIE, SESSION_COOKIE, Session, Sessions, random_token, same_secret, set_cookie,
};
use crate::error::ConsoleError;
use crate::metrics::{Metrics, MetricsOptions};
use crate::peer::Peer;
use crate::queue::{self, Filter};
use crate::throttle::{SignInLimits, Throttle};
use crate::{headers, item, metrics, pages, report};

/// How the console is mounted and run.
#[derive(Clone)]
pub struct ConsoleOptions {
    /// The path the router is nested under (`/approvals`), or empty at the root. Links and
    /// the cookie path use it.
    pub base: String,
    /// Mark cookies `Secure` (browsers still send them to http://localhost). Turn off only
    /// for a plain-HTTP deployment on another host.
    pub secure_cookies: bool,
    pub session_ttl: Duration,
    /// Resolves cited evidence ids to records.
    pub ontology: Option<Arc<Ontology>>,
    /// Run an approved planned step at once (in this process, through the executor). Off:
    /// the step is queued for the gateway's workers.
    pub run_on_approve: bool,
    /// The executor of the registry version serving now, when the gateway reloads its
    /// registry: each request then reads and decides under the current version. None: the
    /// executor given to [`ConsoleState::new`] serves for good.
    pub live: Option<LiveExecutor>,
    /// Who may read `/metrics` (nobody, by default).
    pub metrics: MetricsOptions,
    /// Sign-in failures allowed per source address and per key.
    pub sign_in: SignInLimits,
}

/// Returns the executor of the registry version serving now.
pub type LiveExecutor = Arc<dyn Fn() -> Executor + Send + Sync>;

impl Default for ConsoleOptions {
    fn default() -> Self {
        ConsoleOptions {
            base: String::new(),
            secure_cookies: true,
            session_ttl: Duration::from_secs(8 * 3600),
            ontology: None,
            run_on_approve: true,
            live: None,
            metrics: MetricsOptions::default(),
            sign_in: SignInLimits::default(),
        }
    }
}

/// What the routes share. Cheap to clone.
#[derive(Clone)]
pub struct ConsoleState {
    inner: Arc<Inner>,
}

struct Inner {
    exec: Executor,
    opts: ConsoleOptions,
    sessions: Sessions,
    metrics: Metrics,
    throttle: Throttle,
}

impl ConsoleState {
    pub fn new(exec: Executor, opts: ConsoleOptions) -> Self {
        let ttl = opts.session_ttl;
        ConsoleState {
            inner: Arc::new(Inner {
                exec,
                metrics: Metrics::new(opts.metrics.clone()),
                throttle: Throttle::new(opts.sign_in),
                opts,
                sessions: Sessions::new(ttl),
            }),
        }
    }
    /// The aggregate behind `/metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
    fn base(&self) -> &str {
        &self.inner.opts.base
    }
    fn cookie_path(&self) -> String {
        if self.base().is_empty() {
            "/".into()
        } else {
            self.base().to_string()
        }
    }
    /// The executor (and so the registry version) this request works with.
    fn exec(&self) -> Executor {
        match &self.inner.opts.live {
            Some(live) => live(),
            None => self.inner.exec.clone(),
        }
    }
    async fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let exec = self.exec();
        self.inner
            .sessions
            .current(&exec.store, &exec.registry, headers)
            .await
    }
}

/// The approver's page: `/`, `/login`, `/logout`, `/item/{id}`, `/item/{id}/approve`,
/// `/item/{id}/reject`, `/evidence/{id}`, `/report`. Nest it under `opts.base`.
pub fn router(state: ConsoleState) -> Router {
    Router::new()
        .route("/", get(queue_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/item/{id}", get(item_page))
        .route("/item/{id}/approve", post(approve))
        .route("/item/{id}/reject", post(reject))
        .route("/bulk", post(bulk_approve))
        .route("/run/approve", post(run_approve))
        .route("/evidence/{id}", get(evidence_page))
        .route("/report", get(report_page))
        .with_state(state)
        .layer(axum::middleware::map_response(headers::secure))
}

/// `/metrics` in the Prometheus text format: the surface numbers, kept as the audit chain
/// grows (see `metrics/README.md`), for a holder of the scrape token on this host (unless
/// `allow_remote`). Merge it at the root (`app.merge(metrics_router(state))`) of an app served
/// with `into_make_service_with_connect_info::<SocketAddr>()`: without the peer's address
/// every scrape is refused.
pub fn metrics_router(state: ConsoleState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .with_state(state)
        .layer(axum::middleware::map_response(headers::secure))
}

fn html(status: StatusCode, m: Markup) -> Response {
    let mut r = (status, axum::response::Html(m.into_string())).into_response();
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.headers_mut().insert(
        "content-security-policy",
        HeaderValue::from_static(pages::csp()),
    );
    r.headers_mut()
        .insert("x-frame-options", HeaderValue::from_static("DENY"));
    r
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(LOCATION, v);
    }
    r
}

fn to_login(s: &ConsoleState) -> Response {
    redirect(&format!("{}/login", s.base()))
}

/// The signed-in approver making a request. Without a valid session the request goes no
/// further than the sign-in page.
struct SignedIn(Session);

impl FromRequestParts<ConsoleState> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &ConsoleState) -> Result<Self, Response> {
        match s.session(&parts.headers).await {
            Some(who) => Ok(SignedIn(who)),
            None => Err(to_login(s)),
        }
    }
}

/// A form posted by a signed-in approver, carrying their session's CSRF token. Anything else
/// goes no further: a body that is not the form gets the form's own rejection, no session the
/// sign-in page, a missing or wrong token a 403 that changes nothing.
struct Posted<T>(Session, T);

/// A form with the CSRF field every state-changing form carries.
trait CsrfField {
    fn csrf(&self) -> Option<&str>;
}

macro_rules! csrf_forms {
    ($($form:ty),* $(,)?) => {
        $(impl CsrfField for $form {
            fn csrf(&self) -> Option<&str> {
                self.csrf.as_deref()
            }
        })*
    };
}
csrf_forms!(CsrfForm, ApproveForm, BulkForm, RunForm, RejectForm);

impl<T> FromRequest<ConsoleState> for Posted<T>
where
    T: DeserializeOwned + CsrfField + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, s: &ConsoleState) -> Result<Self, Response> {
        let headers = req.headers().clone();
        let Form(f) = Form::<T>::from_request(req, s)
            .await
            .map_err(IntoResponse::into_response)?;
        let Some(who) = s.session(&headers).await else {
            return Err(to_login(s));
        };
        if !f.csrf().is_some_and(|given| same_secret(given, &who.csrf)) {
            return Err(csrf_refusal(s, &who));
        }
        Ok(Posted(who, f))
    }
}

async fn login_page(State(s): State<ConsoleState>) -> Response {
    let token = random_token();
    let mut r = html(StatusCode::OK, pages::login(s.base(), &token, None));
    let c = set_cookie(
        LOGIN_COOKIE,
        &token,
        &s.cookie_path(),
        s.inner.opts.secure_cookies,
        Some(600),
    );
    if let Ok(v) = HeaderValue::from_str(&c) {
        r.headers_mut().append(SET_COOKIE, v);
    }
    r
}

#[derive(Deserialize)]
struct LoginForm {
    api_key: Option<String>,
    csrf: Option<String>,
}

async fn login(
    State(s): State<ConsoleState>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let expected = crate::auth::cookie(&headers, LOGIN_COOKIE);
    let csrf_ok = matches!((&expected, &f.csrf), (Some(a), Some(b)) if same_secret(a, b));
    if !csrf_ok {
        return html(
            StatusCode::FORBIDDEN,
            pages::message(
                s.base(),
                None,
                "Refused",
                "The sign-in form's CSRF token is missing or wrong. Open the sign-in page again.",
            ),
        );
    }
    let key = f.api_key.unwrap_or_default();
    // Throttled before the key is looked at: a full bucket must not confirm a right key.
    if let Err(wait) = s.inner.throttle.take(peer, &key, Instant::now()) {
        return throttled(&s, wait);
    }
    let exec = s.exec();
    let signed = match s
        .inner
        .sessions
        .sign_in(&exec.store, &exec.registry, &key)
        .await
    {
        Ok(signed) => signed,
        Err(e) => {
            tracing::error!(error = %e, "storing the session failed");
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::message(
                    s.base(),
                    None,
                    "Not signed in",
                    "The session could not be stored. Try again in a moment.",
                ),
            );
        }
    };
    match signed {
        Some((id, _)) => {
            s.inner.throttle.refund(peer, &key, Instant::now());
            let mut r = redirect(&pages::home(s.base()));
            let path = s.cookie_path();
            let secure = s.inner.opts.secure_cookies;
            for c in [
                set_cookie(
                    SESSION_COOKIE,
                    &id,
                    &path,
                    secure,
                    Some(s.inner.opts.session_ttl.as_secs()),
                ),
                set_cookie(LOGIN_COOKIE, "", &path, secure, Some(0)),
            ] {
                if let Ok(v) = HeaderValue::from_str(&c) {
                    r.headers_mut().append(SET_COOKIE, v);
                }
            }
            r
        }
        None => {
            let token = expected.unwrap_or_default();
            html(
                StatusCode::UNAUTHORIZED,
                pages::login(
                    s.base(),
                    &token,
                    Some("That key does not belong to a person who may approve."),
                ),
            )
        }
    }
}

/// 429 with `Retry-After`: too many failed sign-ins from this source, or with this key.
fn throttled(s: &ConsoleState, wait: Duration) -> Response {
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut r = html(
        StatusCode::TOO_MANY_REQUESTS,
        pages::message(
            s.base(),
            None,
            "Too many attempts",
            &format!(
                "Too many failed sign-ins from your address or with this key. Try again in {secs} s."
            ),
        ),
    );
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    r
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

fn csrf_refusal(s: &ConsoleState, who: &Session) -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::message(
            s.base(),
            Some((&who.principal, &who.csrf)),
            "Refused",
            "This form's CSRF token is missing or wrong; nothing was changed. Reload the page and try again.",
        ),
    )
}

async fn logout(
    State(s): State<ConsoleState>,
    headers: HeaderMap,
    Posted(_, _): Posted<CsrfForm>,
) -> Response {
    s.inner.sessions.sign_out(&s.exec().store, &headers).await;
    let mut r = to_login(&s);
    let c = set_cookie(
        SESSION_COOKIE,
        "",
        &s.cookie_path(),
        s.inner.opts.secure_cookies,
        Some(0),
    );
    if let Ok(v) = HeaderValue::from_str(&c) {
        r.headers_mut().append(SET_COOKIE, v);
    }
    r
}

fn failure(s: &ConsoleState, who: &Session, e: ConsoleError) -> Response {
    let status = match &e {
        ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
        ConsoleError::NotAnApprover(_) | ConsoleError::Ineligible(_) => StatusCode::FORBIDDEN,
        ConsoleError::Expired { .. } => StatusCode::GONE,
        ConsoleError::ReasonRequired => StatusCode::UNPROCESSABLE_ENTITY,
        ConsoleError::Closed { .. }
        | ConsoleError::WouldBeRefused { .. }
        | ConsoleError::BulkRefused(_)
        | ConsoleError::InputsChanged { .. }
        | ConsoleError::SameApprover { .. } => StatusCode::CONFLICT,
        ConsoleError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if !e.is_refusal() {
        tracing::error!(error = %e, "console action failed");
    }
    html(
        status,
        pages::message(
            s.base(),
            Some((&who.principal, &who.csrf)),
            "Refused",
            &e.to_string(),
        ),
    )
}

async fn queue_page(
    State(s): State<ConsoleState>,
    SignedIn(who): SignedIn,
    Query(filter): Query<Filter>,
) -> Response {
    let exec = &s.exec();
    let now = exec.clock.now();
    match exec.store.approvals(None).await {
        Ok(reqs) => {
            let raw = reqs.clone();
            let groups = queue::build_for(reqs, &exec.registry, now, &filter, &who.principal);
            let mut offers = Vec::with_capacity(groups.len());
            let mut memo = crate::facts::Memo::default();
            for g in &groups {
                let members: Vec<toolgate_store::ApprovalRequest> = g
                    .items
                    .iter()
                    .filter_map(|i| {
                        raw.iter()
                            .find(|r| r.approval_id == i.request.approval_id)
                            .cloned()
                    })
                    .collect();
                match crate::bulk::offer(exec, &who.principal, &members, &raw, &mut memo).await {
                    Ok(o) => offers.push(o),
                    Err(e) => return failure(&s, &who, e),
                }
            }
            html(
                StatusCode::OK,
                pages::queue(
                    s.base(),
                    (&who.principal, &who.csrf),
                    &groups,
                    &offers,
                    &filter,
                    &crate::fmt::datetime(now),
                ),
            )
        }
        Err(e) => failure(&s, &who, e.into()),
    }
}

#[derive(Deserialize, Default)]
struct ItemQuery {
    last: Option<ApprovalId>,
}

/// What became of the item decided before this one: the store's word, not the page's.
async fn last_result(exec: &Executor, id: &ApprovalId, viewer: &str) -> Option<pages::LastResult> {
    let req = exec.store.approval(id).await.ok()?;
    if !actions::may_decide(&exec.registry, viewer, &req) {
        return None;
    }
    let step = exec.store.step(&req.subject_step()).await.ok();
    let (status, text) = match (&req.status, &step) {
        (_, Some(s)) if s.status == toolgate_core::StepStatus::Done => {
            ("done".to_string(), "approved, and it ran once".to_string())
        }
        (_, Some(s)) if s.status == toolgate_core::StepStatus::Refused => (
            "refused".to_string(),
            format!(
                "refused ({}): it did not run",
                s.outcome
                    .as_ref()
                    .and_then(|o| o.rule.clone())
                    .unwrap_or_default()
            ),
        ),
        (toolgate_store::ApprovalStatus::Rejected, _) => (
            "rejected".to_string(),
            "rejected; nothing was sent".to_string(),
        ),
        (toolgate_store::ApprovalStatus::Pending, _) => (
            "pending".to_string(),
            format!(
                "{} of {} approvals; still waiting",
                req.approved_by.len(),
                req.approvers_needed
            ),
        ),
        (toolgate_store::ApprovalStatus::Approved, None) => (
            "approved".to_string(),
            "approved; the agent's retry of exactly this call runs it once".to_string(),
        ),
        (other, _) => (other.as_str().to_string(), other.as_str().to_string()),
    };
    Some(pages::LastResult {
        id: id.to_string(),
        status,
        text,
    })
}

async fn item_page(
    State(s): State<ConsoleState>,
    SignedIn(who): SignedIn,
    Path(id): Path<ApprovalId>,
    Query(q): Query<ItemQuery>,
) -> Response {
    let exec = s.exec();
    let last = match &q.last {
        Some(l) => last_result(&exec, l, &who.principal).await,
        None => None,
    };
    match item::load_for(&exec, &id, &who.principal).await {
        Ok(view) => html(
            StatusCode::OK,
            pages::item(
                s.base(),
                (&who.principal, &who.csrf),
                &view,
                &who.principal,
                last.as_ref(),
            ),
        ),
        Err(e) => failure(&s, &who, e),
    }
}

/// After a decision, the next item (with what became of this one), when the form named one.
fn to_next(s: &ConsoleState, next: &Option<String>, id: &str) -> Option<Response> {
    let n = next.as_deref().filter(|n| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })?;
    let id: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    Some(redirect(&format!("{}/item/{n}?last={id}", s.base())))
}

#[derive(Deserialize)]
struct ApproveForm {
    csrf: Option<String>,
    input_hash: Option<String>,
    next: Option<String>,
}

async fn approve(
    State(s): State<ConsoleState>,
    Path(id): Path<ApprovalId>,
    Posted(who, f): Posted<ApproveForm>,
) -> Response {
    let shown = f.input_hash.unwrap_or_default();
    let exec = &s.exec();
    // Never approve what cannot run: `approve` decides the call again, dry, first.
    let result = actions::approve(
        exec,
        &id,
        &who.principal,
        &shown,
        s.inner.opts.run_on_approve,
    )
    .await;
    let w = (who.principal.as_str(), who.csrf.as_str());
    if result.is_ok()
        && let Some(r) = to_next(&s, &f.next, &id)
    {
        return r;
    }
    match result {
        Ok(Approved::Waiting {
            approved_by,
            needed,
        }) => html(
            StatusCode::OK,
            pages::outcome(
                s.base(),
                w,
                &id,
                true,
                "Approved: waiting for a second person",
                &[format!(
                    "{} of {needed} approvals: approved first by {}. A different approver must approve it too before it runs.",
                    approved_by.len(),
                    approved_by.join(", ")
                )],
            ),
        ),
        Ok(Approved::Ran(report)) => {
            // What happened, never a green "Approved" for a call that did not run.
            let ran = report.status == toolgate_core::StepStatus::Done;
            let rule = report.outcome.as_ref().and_then(|o| o.rule.clone());
            let mut lines = vec![if ran {
                format!("The step ran once: status {}.", report.status)
            } else {
                format!(
                    "Your approval was recorded, but the step did not run: status {}{}.",
                    report.status,
                    rule.as_deref()
                        .map(|r| format!(", rule {r}"))
                        .unwrap_or_default()
                )
            }];
            if let Some(o) = &report.outcome {
                if let Some(r) = &o.target_ref {
                    lines.push(format!("Reference: {r}"));
                }
                if let Some(e) = &o.error {
                    lines.push(e.clone());
                }
            }
            let title = match report.status {
                toolgate_core::StepStatus::Done => "Approved: it ran".to_string(),
                other => format!("Not run: {other}"),
            };
            html(
                StatusCode::OK,
                pages::outcome(s.base(), w, &id, ran, &title, &lines),
            )
        }
        Ok(Approved::Queued { step_id }) => html(
            StatusCode::OK,
            pages::outcome(
                s.base(),
                w,
                &id,
                true,
                "Approved",
                &[format!("Step {step_id} is queued; a worker runs it once.")],
            ),
        ),
        Ok(Approved::DirectCall) => html(
            StatusCode::OK,
            pages::outcome(
                s.base(),
                w,
                &id,
                true,
                "Approved",
                &[
                    "The agent's retry of exactly this call will now pass the gate (once)."
                        .to_string(),
                ],
            ),
        ),
        Err(e) => failure(&s, &who, e),
    }
}

#[derive(Deserialize)]
struct BulkForm {
    csrf: Option<String>,
    set: Option<String>,
    confirm: Option<String>,
}

async fn bulk_approve(State(s): State<ConsoleState>, Posted(who, f): Posted<BulkForm>) -> Response {
    let exec = &s.exec();
    let set = f.set.unwrap_or_default();
    let confirm = f.confirm.unwrap_or_default();
    match crate::bulk::approve(
        exec,
        &who.principal,
        &set,
        &confirm,
        s.inner.opts.run_on_approve,
    )
    .await
    {
        Ok(done) => approved_together(&s, &who, &done, "Approved {} calls as one"),
        Err(e) => failure(&s, &who, e),
    }
}

/// The page after several approvals made as one decision: what became of each.
fn approved_together(
    s: &ConsoleState,
    who: &Session,
    done: &[(ApprovalId, Approved)],
    title: &str,
) -> Response {
    let lines: Vec<String> = done
        .iter()
        .map(|(id, a)| match a {
            Approved::DirectCall => {
                format!("{id}: approved; the agent's retry of exactly this call runs it once")
            }
            Approved::Ran(r) => format!("{id}: status {}", r.status),
            Approved::Queued { step_id } => format!("{id}: step {step_id} queued"),
            Approved::Waiting { .. } => format!("{id}: waiting for another approver"),
        })
        .collect();
    let ran_all = done.iter().all(
        |(_, a)| !matches!(a, Approved::Ran(r) if r.status != toolgate_core::StepStatus::Done),
    );
    html(
        StatusCode::OK,
        pages::outcome(
            s.base(),
            (&who.principal, &who.csrf),
            "",
            ran_all,
            &title.replace("{}", &done.len().to_string()),
            &lines,
        ),
    )
}

#[derive(Deserialize)]
struct RunForm {
    csrf: Option<String>,
    run: Option<String>,
    set: Option<String>,
}

/// A run's parked steps approved together (the item page's "approve this run" form).
async fn run_approve(State(s): State<ConsoleState>, Posted(who, f): Posted<RunForm>) -> Response {
    let exec = &s.exec();
    match crate::bulk::approve_run(
        exec,
        &who.principal,
        f.run.as_deref().unwrap_or_default(),
        f.set.as_deref().unwrap_or_default(),
        s.inner.opts.run_on_approve,
    )
    .await
    {
        Ok(done) => approved_together(&s, &who, &done, "Approved the run's {} parked steps"),
        Err(e) => failure(&s, &who, e),
    }
}

#[derive(Deserialize)]
struct RejectForm {
    csrf: Option<String>,
    reason: Option<String>,
    next: Option<String>,
}

async fn reject(
    State(s): State<ConsoleState>,
    Path(id): Path<ApprovalId>,
    Posted(who, f): Posted<RejectForm>,
) -> Response {
    let reason = f.reason.unwrap_or_default();
    let result = actions::reject(&s.exec(), &id, &who.principal, &reason).await;
    if result.is_ok()
        && let Some(r) = to_next(&s, &f.next, &id)
    {
        return r;
    }
    match result {
        Ok(()) => html(
            StatusCode::OK,
            pages::outcome(
                s.base(),
                (&who.principal, &who.csrf),
                &id,
                true,
                "Rejected",
                &[
                    format!("Rejected with the reason: {}", reason.trim()),
                    "The step is refused; nothing was sent.".into(),
                ],
            ),
        ),
        Err(e) => failure(&s, &who, e),
    }
}

async fn evidence_page(
    State(s): State<ConsoleState>,
    SignedIn(who): SignedIn,
    Path(id): Path<String>,
) -> Response {
    let w = (who.principal.as_str(), who.csrf.as_str());
    let Some(o) = &s.inner.opts.ontology else {
        return html(
            StatusCode::OK,
            pages::evidence(
                s.base(),
                w,
                &id,
                None,
                "No ontology is configured, so this id cannot be opened here.",
            ),
        );
    };
    match o.resolve(&id) {
        Ok(e) => {
            let attrs = e
                .attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let rels = e
                .relations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let walk = o.walk(&e.id).map(|w| w.to_string()).unwrap_or_default();
            html(
                StatusCode::OK,
                pages::evidence(
                    s.base(),
                    w,
                    &id,
                    Some(pages::EvidenceView {
                        description: o.describe(e),
                        attributes: attrs,
                        relations: rels,
                        walk,
                    }),
                    "",
                ),
            )
        }
        Err(err) => html(
            StatusCode::NOT_FOUND,
            pages::evidence(s.base(), w, &id, None, &err.to_string()),
        ),
    }
}

#[derive(Deserialize, Default)]
struct SinceQuery {
    since: Option<String>,
}

async fn report_page(
    State(s): State<ConsoleState>,
    SignedIn(who): SignedIn,
    Query(q): Query<SinceQuery>,
) -> Response {
    let exec = &s.exec();
    let now = exec.clock.now();
    let text = q.since.unwrap_or_default();
    let since = if text.trim().is_empty() {
        None
    } else {
        report::parse_since(&text, now)
    };
    match report::gather(&exec.store, &exec.registry, since, now).await {
        Ok(r) => html(
            StatusCode::OK,
            pages::report(s.base(), (&who.principal, &who.csrf), &r, &text),
        ),
        Err(e) => failure(&s, &who, e.into()),
    }
}

async fn metrics_page(State(s): State<ConsoleState>, peer: Peer, headers: HeaderMap) -> Response {
    metrics::answer(&s.inner.metrics, &s.exec(), peer, &headers).await
}

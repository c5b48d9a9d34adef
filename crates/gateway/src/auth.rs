//! Who is calling, decided at the boundary from the credential alone. rmcp does no server-side
//! authentication, so an axum middleware resolves the `Authorization: Bearer` value (an API key,
//! or an OAuth 2.1 JWT access token when a JWKS is configured) to a principal of the registry and
//! puts it in the request's extensions; the MCP handler reads it from there. Nothing a request
//! says about itself (in `_meta` or elsewhere) is ever used to decide who it is.
//!
//! The credential is resolved against the registry version the request is then served under:
//! the middleware takes one snapshot ([`Surface`]) and hands it on with the caller, so a reload
//! is seen by a request all at once (its principal and role, its tools and its rules), never
//! half before it and half after.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use toolgate_core::{PrincipalId, Registry};

use crate::jwt::JwtVerifier;
use crate::server::{GatewayState, Surface};

/// How the caller proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialKind {
    /// An API key whose hash is in `principals.yaml`.
    ApiKey,
    /// An OAuth access token; the subject mapped to the principal.
    OAuth { subject: String },
    /// The stdio transport: fixed at start from `TOOLGATE_API_KEY`.
    Stdio,
}

/// An authenticated caller: a principal of the registry and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub principal: PrincipalId,
    pub role: String,
    pub credential: CredentialKind,
    /// The id of the credential (`principals.yaml` `credentials[].id`), for its default purpose.
    pub credential_id: Option<String>,
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A credential was presented and refused; the text says why (never echoing it).
    Invalid(String),
}

/// Resolves credentials to callers, against the registry version a request is served under
/// (it keeps none of its own).
pub struct Authenticator {
    jwt: Option<JwtVerifier>,
    /// Absolute URL of the protected-resource metadata document, for `WWW-Authenticate`.
    metadata_url: String,
}

impl Authenticator {
    pub fn new(jwt: Option<JwtVerifier>, metadata_url: String) -> Self {
        Authenticator { jwt, metadata_url }
    }

    /// The principal of `registry` holding an API key (also for stdio, where the key comes from
    /// the environment).
    pub fn by_api_key(&self, registry: &Registry, key: &str) -> Option<Caller> {
        registry.principal_by_key(key).map(|p| Caller {
            principal: p.id().into(),
            role: p.role().to_string(),
            credential: CredentialKind::ApiKey,
            credential_id: registry.credential_id_of_key(key).map(str::to_string),
        })
    }

    /// Resolves an `Authorization` header value to a principal of `registry`.
    pub fn authenticate(
        &self,
        registry: &Registry,
        authorization: Option<&str>,
    ) -> Result<Caller, AuthFailure> {
        let Some(value) = authorization else {
            return Err(AuthFailure::Missing);
        };
        let token = match value.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => {
                return Err(AuthFailure::Invalid(
                    "the Authorization header must be `Bearer <token>`".into(),
                ));
            }
        };
        if token.is_empty() {
            return Err(AuthFailure::Missing);
        }
        if let Some(c) = self.by_api_key(registry, token) {
            return Ok(c);
        }
        let looks_like_jwt = token.split('.').count() == 3;
        match (&self.jwt, looks_like_jwt) {
            (Some(v), true) => {
                let subject = v.verify(token).map_err(|e| {
                    AuthFailure::Invalid(format!("the access token was refused: {e}"))
                })?;
                let p = registry.principal_by_subject(&subject).ok_or_else(|| {
                    AuthFailure::Invalid(
                        "the access token's subject is not mapped to any principal".into(),
                    )
                })?;
                let credential_id = p
                    .config
                    .credentials
                    .iter()
                    .find(|c| c.oauth_subject.as_deref() == Some(subject.as_str()))
                    .map(|c| c.id.clone());
                Ok(Caller {
                    principal: p.id().into(),
                    role: p.role().to_string(),
                    credential: CredentialKind::OAuth { subject },
                    credential_id,
                })
            }
            _ => Err(AuthFailure::Invalid("the credential is not valid".into())),
        }
    }

    /// The 401 answer: `WWW-Authenticate` pointing at the protected-resource metadata.
    pub fn unauthorized(&self, failure: &AuthFailure) -> Response {
        let (challenge, message) = match failure {
            AuthFailure::Missing => (
                format!("Bearer resource_metadata=\"{}\"", self.metadata_url),
                "authentication required: send `Authorization: Bearer <api key or access token>`"
                    .to_string(),
            ),
            AuthFailure::Invalid(why) => (
                format!(
                    "Bearer resource_metadata=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
                    self.metadata_url,
                    why.replace('"', "'")
                ),
                why.clone(),
            ),
        };
        let body = json!({"error": "unauthorized", "message": message}).to_string();
        let mut resp = (StatusCode::UNAUTHORIZED, Body::from(body)).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            h.insert(header::WWW_AUTHENTICATE, v);
        }
        resp
    }
}

/// What the credential middleware needs: how to resolve a credential, and the gateway whose
/// serving registry version each request is resolved against and then served under.
#[derive(Clone)]
pub struct Admission {
    pub auth: Arc<Authenticator>,
    pub gateway: Arc<GatewayState>,
}

/// axum middleware: authenticates every request to the MCP endpoint, or answers 401. An
/// admitted request carries its [`Caller`] and the `Arc<Surface>` it was resolved against, the
/// one snapshot the request is served under.
pub async fn require_caller(
    State(admission): State<Admission>,
    mut req: Request,
    next: Next,
) -> Response {
    let value = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let surface: Arc<Surface> = admission.gateway.surface();
    match admission.auth.authenticate(&surface.registry, value) {
        Ok(caller) => {
            tracing::debug!(principal = %caller.principal, role = %caller.role, "authenticated");
            req.extensions_mut().insert(caller);
            req.extensions_mut().insert(surface);
            next.run(req).await
        }
        Err(f) => {
            tracing::info!(reason = ?f, "refused a request without a valid credential");
            admission.auth.unauthorized(&f)
        }
    }
}

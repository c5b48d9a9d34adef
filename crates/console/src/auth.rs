//! Who is at the page: people sign in with their own API key (checked against the registry's
//! hashes; only principals of kind `human` whose role approves), and get a server-side session:
//! a random id in a `Secure`, `HttpOnly`, `SameSite=Strict` cookie. Every state change carries
//! the session's CSRF token in the form and is refused without it; the sign-in form itself is
//! protected by a double-submit token, so nobody can sign a victim into their own session.
//! Sessions live in the store (only the sha256 of the id), so they survive a restart and hold
//! across gateway replicas sharing one PostgreSQL.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use axum::http::header::COOKIE;
use rand::RngCore;
use toolgate_core::Registry;
use toolgate_core::registry::api_key_hash;
use toolgate_store::{ConsoleSession, Store, StoreError};

use crate::actions::is_approver;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "toolgate_session";
/// The sign-in form's double-submit cookie.
pub const LOGIN_COOKIE: &str = "toolgate_login";

/// A signed-in approver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: String,
    pub csrf: String,
}

/// The sessions, kept in the store for `ttl` after sign-in.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// Compares two secrets in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Wall-clock milliseconds: sessions expire in real time, whatever clock decides calls.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Sessions {
    pub fn new(ttl: Duration) -> Self {
        Sessions { ttl }
    }

    /// Signs in the holder of `api_key` if they are an approver; returns the session id.
    pub async fn sign_in(
        &self,
        store: &Store,
        registry: &Registry,
        api_key: &str,
    ) -> Result<Option<(String, Session)>, StoreError> {
        let Some(p) = registry.principal_by_key(api_key.trim()) else {
            return Ok(None);
        };
        if !is_approver(registry, p.id()) {
            return Ok(None);
        }
        let id = random_token();
        let s = Session {
            principal: p.id().to_string(),
            csrf: random_token(),
        };
        let now = now_ms();
        let stored = ConsoleSession {
            principal: s.principal.clone(),
            csrf: s.csrf.clone(),
            expires_at: now + self.ttl.as_millis() as i64,
        };
        store
            .save_console_session(&api_key_hash(&id), &stored, now)
            .await?;
        Ok(Some((id, s)))
    }

    /// The live session for the request's cookie, if any, still held by an approver. A store
    /// that cannot answer signs nobody in.
    pub async fn current(
        &self,
        store: &Store,
        registry: &Registry,
        headers: &HeaderMap,
    ) -> Option<Session> {
        let id = cookie(headers, SESSION_COOKIE)?;
        let s = match store.console_session(&api_key_hash(&id), now_ms()).await {
            Ok(s) => s?,
            Err(e) => {
                tracing::error!(error = %e, "reading the session failed; treated as signed out");
                return None;
            }
        };
        is_approver(registry, &s.principal).then_some(Session {
            principal: s.principal,
            csrf: s.csrf,
        })
    }

    pub async fn sign_out(&self, store: &Store, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, SESSION_COOKIE)
            && let Err(e) = store.delete_console_session(&api_key_hash(&id)).await
        {
            tracing::error!(error = %e, "ending the session failed");
        }
    }
}

/// The value of one cookie from the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// A `Set-Cookie` value: HTTP-only, SameSite=Strict, `Secure` unless turned off for a
/// plain-HTTP deployment behind nothing.
pub fn set_cookie(
    name: &str,
    value: &str,
    path: &str,
    secure: bool,
    max_age: Option<u64>,
) -> String {
    let mut c = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
    if secure {
        c.push_str("; Secure");
    }
    if let Some(s) = max_age {
        c.push_str(&format!("; Max-Age={s}"));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            COOKIE,
            HeaderValue::from_static("a=1; toolgate_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "missing"), None);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }

    #[test]
    fn session_cookie_flags() {
        let c = set_cookie(SESSION_COOKIE, "x", "/", true, None);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Secure"));
    }
}

//! Approval tokens: a MAC over exactly one action. A token binds the call or step it was issued
//! for, the tool and its version, the hash of the canonical inputs, the registry version and the
//! pinned definition, the approver, an expiry and a nonce; it names its key so keys can rotate.
//! Change any of them (one cent, one version) and the token no longer verifies.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::canon::{InputHash, canonical, sha256_tagged};
use crate::model::Timestamp;
use crate::rule::Rule;

/// What an approval authorises: one action, by one approver, until an expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalClaims {
    /// The step id (planned) or call id (direct) the approval was requested for.
    pub subject: String,
    pub tool: String,
    pub tool_version: String,
    pub input_hash: InputHash,
    /// The registry version the gate was decided under.
    #[serde(default)]
    pub registry_version: Option<String>,
    /// The rule that gated the call under that version (`gate.always` or a `@gate` policy id).
    /// After a reload the approval carries over only while the current rules gate the call
    /// under the same rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_rule: Option<Rule>,
    /// The pinned upstream definition hash, when the tool is served from an upstream.
    #[serde(default)]
    pub definition_hash: Option<String>,
    pub approver: String,
    pub expires_at: Timestamp,
    pub nonce: String,
}

/// A signed approval, in its wire form `tg1.<key id>.<claims>.<mac>`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApprovalToken(String);

impl fmt::Debug for ApprovalToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApprovalToken({})", self.fingerprint())
    }
}

impl ApprovalToken {
    pub fn from_wire(s: impl Into<String>) -> Self {
        ApprovalToken(s.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// A hash of the token, safe to log and store in the audit record.
    pub fn fingerprint(&self) -> String {
        sha256_tagged(self.0.as_bytes())
    }
}

/// Why a token was refused. Every variant fails closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the approval token is malformed")]
    Malformed,
    #[error("the approval token names key '{0}', which is not configured")]
    UnknownKey(String),
    #[error("the approval token's signature does not verify")]
    BadSignature,
    #[error("the approval was for {what} {approved}, but this call has {actual}")]
    Mismatch {
        what: &'static str,
        approved: String,
        actual: String,
    },
    #[error("the approval expired at {0} ms")]
    Expired(i64),
    #[error("the approval (nonce {0}) was already used")]
    Reused(String),
}

/// The MAC keys, by id. The first is used to sign; all verify, so an old key can be retired
/// after its tokens expire.
#[derive(Clone)]
pub struct ApprovalKeys {
    current: String,
    keys: BTreeMap<String, Vec<u8>>,
    /// Whether `verify` compares the approved inputs with the call's (always, except in the
    /// paired-toggle benchmark: see [`ApprovalKeys::without_input_binding`]).
    bind_inputs: bool,
}

impl fmt::Debug for ApprovalKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalKeys")
            .field("current", &self.current)
            .field("ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What the call being executed actually is, to compare with what was approved.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    pub subject: &'a str,
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub input_hash: &'a InputHash,
    pub registry_version: Option<&'a str>,
    pub definition_hash: Option<&'a str>,
}

impl ApprovalKeys {
    pub fn new(current_id: impl Into<String>, key: impl Into<Vec<u8>>) -> Self {
        let current = current_id.into();
        let mut keys = BTreeMap::new();
        keys.insert(current.clone(), key.into());
        ApprovalKeys {
            current,
            keys,
            bind_inputs: true,
        }
    }

    /// The same keys with the input binding switched off: a token then passes for any inputs
    /// of the call it names. Only for measuring what the binding is worth (the store's
    /// `ExecutorToggles::approval_binding`); nothing that serves calls uses it.
    pub fn without_input_binding(mut self) -> Self {
        self.bind_inputs = false;
        self
    }

    /// Adds a key that still verifies but no longer signs.
    pub fn with_retired(mut self, id: impl Into<String>, key: impl Into<Vec<u8>>) -> Self {
        self.keys.insert(id.into(), key.into());
        self
    }

    fn mac(&self, key_id: &str, payload: &str) -> Option<Vec<u8>> {
        let key = self.keys.get(key_id)?;
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
        mac.update(key_id.as_bytes());
        mac.update(b".");
        mac.update(payload.as_bytes());
        Some(mac.finalize().into_bytes().to_vec())
    }

    /// Signs claims with the current key.
    pub fn issue(&self, claims: &ApprovalClaims) -> ApprovalToken {
        let json = serde_json::to_value(claims).expect("claims serialise");
        let payload = B64.encode(canonical(&json));
        let mac = self
            .mac(&self.current, &payload)
            .expect("the current key exists");
        ApprovalToken(format!(
            "tg1.{}.{}.{}",
            self.current,
            payload,
            B64.encode(mac)
        ))
    }

    /// Checks the signature and returns the claims, without checking what they bind.
    pub fn open(&self, token: &ApprovalToken) -> Result<ApprovalClaims, TokenError> {
        let mut parts = token.0.split('.');
        let (Some("tg1"), Some(kid), Some(payload), Some(sig), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        let Some(key) = self.keys.get(kid) else {
            return Err(TokenError::UnknownKey(kid.to_string()));
        };
        let sig = B64.decode(sig).map_err(|_| TokenError::Malformed)?;
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key size");
        mac.update(kid.as_bytes());
        mac.update(b".");
        mac.update(payload.as_bytes());
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        let bytes = B64.decode(payload).map_err(|_| TokenError::Malformed)?;
        serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
    }

    /// Verifies a token against the call it is presented with. `used` says whether a nonce has
    /// already been consumed (the store owns that ledger).
    pub fn verify(
        &self,
        token: &ApprovalToken,
        expected: &Expected<'_>,
        now: Timestamp,
        used: &dyn Fn(&str) -> bool,
    ) -> Result<ApprovalClaims, TokenError> {
        let claims = self.open(token)?;
        let mismatch = |what: &'static str, approved: &str, actual: &str| TokenError::Mismatch {
            what,
            approved: approved.to_string(),
            actual: actual.to_string(),
        };
        if claims.subject != expected.subject {
            return Err(mismatch("call", &claims.subject, expected.subject));
        }
        if claims.tool != expected.tool {
            return Err(mismatch("tool", &claims.tool, expected.tool));
        }
        if claims.tool_version != expected.tool_version {
            return Err(mismatch(
                "tool version",
                &claims.tool_version,
                expected.tool_version,
            ));
        }
        if self.bind_inputs && &claims.input_hash != expected.input_hash {
            return Err(mismatch(
                "inputs",
                claims.input_hash.as_str(),
                expected.input_hash.as_str(),
            ));
        }
        if claims.definition_hash.as_deref() != expected.definition_hash {
            return Err(mismatch(
                "upstream definition",
                claims.definition_hash.as_deref().unwrap_or("none"),
                expected.definition_hash.unwrap_or("none"),
            ));
        }
        if now >= claims.expires_at {
            return Err(TokenError::Expired(claims.expires_at.millis()));
        }
        if used(&claims.nonce) {
            return Err(TokenError::Reused(claims.nonce));
        }
        Ok(claims)
    }
}

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;

//! OAuth 2.1 access tokens as JWTs, verified against a JWKS (a file, or an `http://` or
//! `https://` URL fetched at start; https trusts the system roots plus an optional CA file):
//! signature with the key named by `kid`, audience (this resource), expiry, and the issuer when
//! one is configured. The registry has no section for these settings yet, so they come from the
//! command line or the environment ([`OAuthOptions`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;

/// How access tokens are verified, and what the protected-resource metadata advertises.
#[derive(Debug, Clone, Default)]
pub struct OAuthOptions {
    /// A JWKS file path, or an `http://` or `https://` URL serving one.
    pub jwks: String,
    /// A PEM file of CA certificates trusted for an `https://` JWKS URL, besides the system's
    /// (e.g. an internal CA, or a test's self-signed one).
    pub jwks_ca: Option<PathBuf>,
    /// The audience every token must carry (this MCP server's resource identifier).
    pub audience: String,
    /// The issuer every token must carry, when set.
    pub issuer: Option<String>,
    /// Authorization servers listed in the protected-resource metadata.
    pub authorization_servers: Vec<String>,
}

/// Verifies access tokens.
pub struct JwtVerifier {
    keys: JwkSet,
    audience: String,
    issuer: Option<String>,
}

/// Why the JWKS could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("fetching the JWKS at {url}: timed out")]
    Timeout { url: String },
    #[error("fetching the JWKS at {url}: {source}")]
    Https {
        url: String,
        source: crate::https::HttpsError,
    },
    #[error("fetching the JWKS at {url}: HTTP status {status}")]
    Status { url: String, status: u16 },
    #[error("fetching the JWKS at {url}: the body is not UTF-8")]
    NotUtf8 { url: String },
    #[error("fetching the JWKS at {url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("reading the JWKS at {url}: {source}")]
    Body { url: String, source: reqwest::Error },
    #[error("reading the JWKS file {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("the JWKS at {url} is not a JSON Web Key Set: {source}")]
    NotJwks {
        url: String,
        source: serde_json::Error,
    },
    #[error("an audience is required to accept access tokens (--oauth-audience)")]
    NoAudience,
}

/// Why an access token is not accepted.
#[derive(Debug, thiserror::Error)]
pub enum TokenRejected {
    #[error("malformed token: {0}")]
    Malformed(#[source] jsonwebtoken::errors::Error),
    #[error("no key in the JWKS matches the token's kid")]
    NoKey,
    #[error("unusable key: {0}")]
    Key(#[source] jsonwebtoken::errors::Error),
    /// The signature, audience, issuer, expiry or a required claim failed.
    #[error("{0}")]
    Invalid(#[source] jsonwebtoken::errors::Error),
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
}

impl JwtVerifier {
    /// Loads the JWKS named by `opts.jwks`.
    pub async fn load(opts: &OAuthOptions) -> Result<JwtVerifier, JwksError> {
        let url = || opts.jwks.clone();
        let text = if opts.jwks.starts_with("https://") {
            tokio::time::timeout(
                FETCH_TIMEOUT,
                fetch_https(&opts.jwks, opts.jwks_ca.as_deref()),
            )
            .await
            .map_err(|_| JwksError::Timeout { url: url() })??
        } else if opts.jwks.starts_with("http://") {
            reqwest::get(&opts.jwks)
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|source| JwksError::Http { url: url(), source })?
                .text()
                .await
                .map_err(|source| JwksError::Body { url: url(), source })?
        } else {
            std::fs::read_to_string(Path::new(&opts.jwks)).map_err(|source| JwksError::File {
                path: url(),
                source,
            })?
        };
        let keys: JwkSet = serde_json::from_str(&text)
            .map_err(|source| JwksError::NotJwks { url: url(), source })?;
        if opts.audience.is_empty() {
            return Err(JwksError::NoAudience);
        }
        Ok(JwtVerifier::from_keys(
            keys,
            &opts.audience,
            opts.issuer.clone(),
        ))
    }

    pub fn from_keys(keys: JwkSet, audience: &str, issuer: Option<String>) -> JwtVerifier {
        JwtVerifier {
            keys,
            audience: audience.to_string(),
            issuer,
        }
    }

    /// The token's subject, if the token is valid for this resource now.
    pub fn verify(&self, token: &str) -> Result<String, TokenRejected> {
        let header = decode_header(token).map_err(TokenRejected::Malformed)?;
        let jwk = match &header.kid {
            Some(kid) => self.keys.find(kid),
            None if self.keys.keys.len() == 1 => self.keys.keys.first(),
            None => None,
        }
        .ok_or(TokenRejected::NoKey)?;
        let key = DecodingKey::from_jwk(jwk).map_err(TokenRejected::Key)?;
        let mut v = Validation::new(header.alg);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "aud", "sub"]);
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        let data = decode::<Claims>(token, &key, &v).map_err(TokenRejected::Invalid)?;
        Ok(data.claims.sub)
    }
}

const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// GET an `https://` URL over HTTP/1.1 and return its body (status 2xx only). The certificate
/// must chain to a trusted root (the system's, plus the PEM file `ca`) and name the URL's host.
async fn fetch_https(url: &str, ca: Option<&Path>) -> Result<String, JwksError> {
    let (status, body) = crate::https::request(url, ca, None)
        .await
        .map_err(|source| JwksError::Https {
            url: url.to_string(),
            source,
        })?;
    if !(200..300).contains(&status) {
        return Err(JwksError::Status {
            url: url.to_string(),
            status,
        });
    }
    String::from_utf8(body).map_err(|_| JwksError::NotUtf8 {
        url: url.to_string(),
    })
}

//! OAuth 2.1 access tokens as JWTs, verified against a JWKS (a file, or an `http://` or
//! `https://` URL fetched at start; https trusts the system roots plus an optional CA file):
//! signature with the key named by `kid`, audience (this resource), expiry, and the issuer when
//! one is configured. The registry has no section for these settings yet, so they come from the
//! command line or the environment ([`OAuthOptions`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
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

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
}

impl JwtVerifier {
    /// Loads the JWKS named by `opts.jwks`.
    pub async fn load(opts: &OAuthOptions) -> Result<JwtVerifier, String> {
        let text = if opts.jwks.starts_with("https://") {
            tokio::time::timeout(
                FETCH_TIMEOUT,
                fetch_https(&opts.jwks, opts.jwks_ca.as_deref()),
            )
            .await
            .map_err(|_| format!("fetching the JWKS at {}: timed out", opts.jwks))?
            .map_err(|e| format!("fetching the JWKS at {}: {e}", opts.jwks))?
        } else if opts.jwks.starts_with("http://") {
            reqwest::get(&opts.jwks)
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|e| format!("fetching the JWKS at {}: {e}", opts.jwks))?
                .text()
                .await
                .map_err(|e| format!("reading the JWKS at {}: {e}", opts.jwks))?
        } else {
            std::fs::read_to_string(Path::new(&opts.jwks))
                .map_err(|e| format!("reading the JWKS file {}: {e}", opts.jwks))?
        };
        let keys: JwkSet = serde_json::from_str(&text)
            .map_err(|e| format!("the JWKS at {} is not a JSON Web Key Set: {e}", opts.jwks))?;
        if opts.audience.is_empty() {
            return Err(
                "an audience is required to accept access tokens (--oauth-audience)".into(),
            );
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
    pub fn verify(&self, token: &str) -> Result<String, String> {
        let header = decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        let jwk = match &header.kid {
            Some(kid) => self.keys.find(kid),
            None if self.keys.keys.len() == 1 => self.keys.keys.first(),
            None => None,
        }
        .ok_or("no key in the JWKS matches the token's kid")?;
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable key: {e}"))?;
        let mut v = Validation::new(header.alg);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "aud", "sub"]);
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        let data = decode::<Claims>(token, &key, &v).map_err(|e| e.to_string())?;
        Ok(data.claims.sub)
    }
}

const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS client configuration for an https JWKS: the system's roots plus the PEM file `ca`.
fn tls_config(ca: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system certificate rustls cannot use is skipped, as every rustls client does.
        let _ = roots.add(cert);
    }
    if let Some(ca) = ca {
        let certs = CertificateDer::pem_file_iter(ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("reading the CA file {}: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!("the CA file {} holds no certificate", ca.display()));
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

/// GET an `https://` URL over HTTP/1.1 and return its body (status 2xx only). The certificate
/// must chain to a trusted root and name the URL's host.
async fn fetch_https(url: &str, ca: Option<&Path>) -> Result<String, String> {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;

    let uri: hyper::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let host = uri.host().ok_or("the URL has no host")?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| host.clone());
    let path = uri
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_else(|| "/".into());

    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(ca)?));
    let name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| format!("not a TLS server name: {e}"))?;
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("HTTP status {status}"));
    }
    String::from_utf8(body.to_vec()).map_err(|_| "the body is not UTF-8".into())
}

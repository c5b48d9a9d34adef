//! A JWKS fetched over `https://` from a local TLS server whose certificate chains to a test CA
//! (tests/fixtures/tls): trusted when the CA is configured (`jwks_ca`), refused when it is not,
//! and the fetched keys verify an access token.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::fixtures;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolgate_gateway::{HttpsError, JwksError, JwtVerifier, OAuthOptions};

const AUD: &str = "https://toolgate.test/mcp";

/// Serves the fixture JWKS over TLS on a free loopback port; counts the requests answered.
async fn jwks_server() -> (u16, Arc<AtomicUsize>) {
    let tls = fixtures().join("tls");
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(tls.join("localhost-cert.pem"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls.join("localhost-key.pem")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = std::fs::read_to_string(fixtures().join("jwks.json")).unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, body, count) = (acceptor.clone(), body.clone(), count.clone());
            tokio::spawn(async move {
                // A client that does not trust the certificate ends the handshake here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                assert!(req.starts_with(b"GET /jwks.json HTTP/1.1\r\n"));
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                tls.write_all(resp.as_bytes()).await.unwrap();
                tls.shutdown().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (port, answered)
}

fn options(url: String, ca: bool) -> OAuthOptions {
    OAuthOptions {
        jwks: url,
        jwks_ca: ca.then(|| fixtures().join("tls/test-ca.pem")),
        audience: AUD.into(),
        issuer: None,
        authorization_servers: Vec::new(),
    }
}

fn token(sub: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("test-1".into());
    let pem = std::fs::read(fixtures().join("jwt-test-key.pem")).unwrap();
    encode(
        &header,
        &json!({"sub": sub, "aud": AUD, "exp": now + 300, "iat": now}),
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn an_https_jwks_signed_by_the_configured_ca_is_fetched_and_verifies_tokens() {
    let (port, answered) = jwks_server().await;
    for host in ["localhost", "127.0.0.1"] {
        let v = JwtVerifier::load(&options(format!("https://{host}:{port}/jwks.json"), true))
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(
            v.verify(&token("oauth|planner-7")).unwrap(),
            "oauth|planner-7"
        );
    }
    assert_eq!(answered.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_https_jwks_whose_certificate_is_not_trusted_is_refused() {
    let (port, answered) = jwks_server().await;
    let err = JwtVerifier::load(&options(
        format!("https://localhost:{port}/jwks.json"),
        false,
    ))
    .await
    .err()
    .expect("an untrusted certificate is refused");
    // The step that failed, and the certificate error beneath it as its source.
    assert!(
        matches!(
            &err,
            JwksError::Https {
                source: HttpsError::Handshake(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(std::error::Error::source(&err).is_some());
    assert_eq!(answered.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_ca_file_without_certificates_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let mut o = options("https://localhost:1/jwks.json".into(), false);
    o.jwks_ca = Some(empty.clone());
    let err = JwtVerifier::load(&o).await.err().expect("refused");
    assert!(
        matches!(&err, JwksError::Https { source: HttpsError::CaEmpty(p), .. } if *p == empty),
        "{err:?}"
    );
}

//! One HTTP/1.1 request over TLS (rustls with the ring provider; the system's roots plus an
//! optional CA file), for the gateway's own outgoing calls to `https://` URLs: a JWKS, a
//! notification webhook. Kept apart from reqwest so no reqwest client in the process needs a
//! process-wide TLS provider.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why an outgoing `https://` request got no answer. Each says which step failed and keeps the
/// error beneath it as its source.
#[derive(Debug, thiserror::Error)]
pub enum HttpsError {
    #[error("reading the CA file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("the CA file {} holds no certificate", .0.display())]
    CaEmpty(PathBuf),
    #[error("the CA file {}: {source}", path.display())]
    CaCert {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("setting up TLS: {0}")]
    Tls(#[source] rustls::Error),
    #[error("not a URL: {0}")]
    Url(#[source] hyper::http::uri::InvalidUri),
    #[error("the URL has no host")]
    NoHost,
    #[error("not a TLS server name: {0}")]
    ServerName(#[source] rustls::pki_types::InvalidDnsNameError),
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("building the request: {0}")]
    Request(#[source] hyper::http::Error),
    #[error("HTTP: {0}")]
    Http(#[source] hyper::Error),
    #[error("reading the body: {0}")]
    Body(#[source] hyper::Error),
}

/// The TLS client configuration: the system's roots plus the PEM file `ca`.
fn tls_config(ca: Option<&Path>) -> Result<rustls::ClientConfig, HttpsError> {
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
            .map_err(|source| HttpsError::CaFile {
                path: ca.to_path_buf(),
                source,
            })?;
        if certs.is_empty() {
            return Err(HttpsError::CaEmpty(ca.to_path_buf()));
        }
        for c in certs {
            roots.add(c).map_err(|source| HttpsError::CaCert {
                path: ca.to_path_buf(),
                source,
            })?;
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(HttpsError::Tls)
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

/// Sends a GET (`json_body` None) or a POST of JSON to an `https://` URL and returns the
/// status and the body. The certificate must chain to a trusted root and name the URL's host.
pub(crate) async fn request(
    url: &str,
    ca: Option<&Path>,
    json_body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>), HttpsError> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;

    let uri: hyper::Uri = url.parse().map_err(HttpsError::Url)?;
    let host = uri.host().ok_or(HttpsError::NoHost)?;
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
    let name =
        rustls::pki_types::ServerName::try_from(host.clone()).map_err(HttpsError::ServerName)?;
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(HttpsError::Connect)?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(HttpsError::Handshake)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(HttpsError::Http)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let builder = hyper::Request::builder()
        .uri(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::ACCEPT, "application/json");
    let req = match json_body {
        None => builder
            .method(hyper::Method::GET)
            .body(Full::new(Bytes::new())),
        Some(body) => builder
            .method(hyper::Method::POST)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body))),
    }
    .map_err(HttpsError::Request)?;
    let resp = sender.send_request(req).await.map_err(HttpsError::Http)?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(HttpsError::Body)?
        .to_bytes();
    Ok((status, body.to_vec()))
}

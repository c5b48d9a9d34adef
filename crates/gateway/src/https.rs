//! One HTTP/1.1 request over TLS (rustls with the ring provider; the system's roots plus an
//! optional CA file), for the gateway's own outgoing calls to `https://` URLs: a JWKS, a
//! notification webhook. Kept apart from reqwest so no reqwest client in the process needs a
//! process-wide TLS provider.

use std::path::Path;
use std::sync::Arc;

/// The TLS client configuration: the system's roots plus the PEM file `ca`.
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

/// Sends a GET (`json_body` None) or a POST of JSON to an `https://` URL and returns the
/// status and the body. The certificate must chain to a trusted root and name the URL's host.
pub(crate) async fn request(
    url: &str,
    ca: Option<&Path>,
    json_body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>), String> {
    use http_body_util::{BodyExt, Full};
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
    .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    Ok((status, body.to_vec()))
}

//! The HTTP boundary: no or bad credential → 401 with `WWW-Authenticate` naming the
//! protected-resource metadata; OAuth access tokens verified against a JWKS (signature,
//! audience, expiry) and mapped to a principal by subject.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use toolgate_gateway::OAuthOptions;

const AUD: &str = "https://toolgate.test/mcp";

fn oauth() -> OAuthOptions {
    OAuthOptions {
        jwks: fixtures().join("jwks.json").display().to_string(),
        jwks_ca: None,
        audience: AUD.into(),
        issuer: Some("https://issuer.test".into()),
        authorization_servers: vec!["https://issuer.test".into()],
    }
}

fn token(sub: &str, aud: &str, exp_offset: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("test-1".into());
    let pem = std::fs::read(fixtures().join("jwt-test-key.pem")).unwrap();
    encode(
        &header,
        &json!({"sub": sub, "aud": aud, "iss": "https://issuer.test", "exp": now + exp_offset, "iat": now}),
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
    )
    .unwrap()
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
}

async fn post(url: &str, bearer: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&initialize());
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    r.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_bad_credentials_get_401_with_the_metadata_challenge() {
    let h = Harness::start_with(Vec::new(), Some(oauth())).await;
    for bearer in [None, Some("not-a-key"), Some("x.y.z")] {
        let resp = post(&h.url, bearer).await;
        assert_eq!(resp.status(), 401, "{bearer:?}");
        let challenge = resp.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            challenge.starts_with("Bearer resource_metadata=\""),
            "{challenge}"
        );
        assert!(
            challenge.contains("/.well-known/oauth-protected-resource"),
            "{challenge}"
        );
    }
    let good = post(&h.url, Some(WORKER_KEY)).await;
    assert_eq!(good.status(), 200);

    let meta: Value = reqwest::get(format!(
        "http://{}/.well-known/oauth-protected-resource",
        h.addr
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(meta["resource"], h.url.as_str());
    assert_eq!(
        meta["authorization_servers"],
        json!(["https://issuer.test"])
    );
    assert_eq!(meta["bearer_methods_supported"], json!(["header"]));
    assert_eq!(
        reqwest::get(format!("http://{}/healthz", h.addr))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        reqwest::get(format!("http://{}/readyz", h.addr))
            .await
            .unwrap()
            .status(),
        200
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_tokens_are_checked_for_audience_and_expiry_and_mapped_by_subject() {
    let h = Harness::start_with(Vec::new(), Some(oauth())).await;
    assert_eq!(
        post(
            &h.url,
            Some(&token(OAUTH_SUBJECT, "https://other/mcp", 600))
        )
        .await
        .status(),
        401
    );
    assert_eq!(
        post(&h.url, Some(&token(OAUTH_SUBJECT, AUD, -600)))
            .await
            .status(),
        401
    );
    assert_eq!(
        post(&h.url, Some(&token("oauth|nobody", AUD, 600)))
            .await
            .status(),
        401
    );
    // A valid token maps to the planner: it sees the planner's tools.
    let client = connect(&h.url, &token(OAUTH_SUBJECT, AUD, 600)).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    let got: std::collections::BTreeSet<String> =
        tools.iter().map(|t| t.name.to_string()).collect();
    let want: std::collections::BTreeSet<String> = h
        .gateway
        .state
        .registry()
        .tools_for_role("planner")
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(got, want);
    h.shutdown().await;
}

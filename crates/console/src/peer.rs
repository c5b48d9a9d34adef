//! The address a request came from: the TCP peer axum records when the app is served with
//! `into_make_service_with_connect_info::<SocketAddr>()`. Forwarding headers (`X-Forwarded-For`)
//! are not read: whoever sends the request writes them.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

/// The TCP peer, when the server recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub Option<IpAddr>);

impl Peer {
    /// On this host: a loopback address (IPv4-mapped ones included). An unrecorded peer is not.
    pub fn is_loopback(&self) -> bool {
        self.0.is_some_and(|ip| ip.to_canonical().is_loopback())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(a)| a.ip()),
        ))
    }
}

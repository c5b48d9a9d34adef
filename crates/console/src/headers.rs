//! Response headers for every answer of the HTTP surface: `X-Content-Type-Options: nosniff`
//! (a JSON or text reply is never run as a script or styled as a sheet), no framing, and a
//! Content-Security-Policy. Pages carry their own policy, which allows exactly their inline
//! style and script by hash; everything else gets one that allows nothing at all.

use axum::http::HeaderValue;
use axum::http::header::{CONTENT_SECURITY_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS};
use axum::response::Response;

/// The policy of every reply that is not a console page: it loads nothing, runs nothing, and
/// may not be framed.
pub const NOTHING: &str =
    "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Sets the security headers a reply lacks (a page's own policy is kept). For
/// `axum::middleware::map_response`.
pub async fn secure(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !h.contains_key(CONTENT_SECURITY_POLICY) {
        h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(NOTHING));
    }
    if !h.contains_key(X_FRAME_OPTIONS) {
        h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    res
}

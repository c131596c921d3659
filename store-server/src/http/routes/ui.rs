//! `/ui/`: the web viewer for SREs, three static files compiled into the binary. The page
//! holds no secret and needs no token; the token the user pastes is sent by the page itself,
//! as a header, to the `/v1` routes.

use axum::http::header::{self, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::state::AppState;

const INDEX: &str = include_str!("../../../ui/index.html");
const APP: &str = include_str!("../../../ui/app.js");
const STYLE: &str = include_str!("../../../ui/style.css");

/// Only this origin's script and style, no inline script, no framing: an output is untrusted
/// text, and the page is built so that even a bug that let it into the DOM could not run it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The viewer's routes; `/` leads there.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP) }))
        .route("/ui/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin")),
        // Small, and changed by upgrades: always revalidated.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}

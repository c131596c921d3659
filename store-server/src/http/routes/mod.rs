//! The HTTP surface: one file per resource. Handlers extract and check their inputs, call
//! `db`, `blobs` or `upload`, and answer; they build neither SQL nor storage keys.

mod blobs;
mod extract;
mod openapi;
mod ops;
mod query;
mod read;
mod refs;
mod search;
mod streams;
mod ui;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use spillway_api::ErrorCode;

use crate::error::ApiError;
use crate::state::AppState;

pub use openapi::ApiDoc;
pub use ops::install_metrics;

/// The caller of a request, from its bearer token (`auth::Tokens`); the request log learns its
/// namespace.
impl axum::extract::FromRequestParts<AppState> for crate::auth::Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = state.tokens.authenticate(&parts.headers).await?;
        if let Some(slot) = parts.extensions.get::<crate::auth::NamespaceSlot>() {
            let _ = slot.0.set(caller.namespace.to_string());
        }
        Ok(caller)
    }
}

/// The capped read's route (matched by the router, and before it: [`answer_before_router`]).
const READ_ROUTE: &str = "/v1/blobs/{digest}/read";

/// The whole service: every `/v1` route plus the operations endpoints.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/blobs", post(blobs::post_blob))
        .route(
            "/v1/blobs/{digest}",
            get(blobs::get_blob).head(blobs::head_blob).put(blobs::put_blob).delete(blobs::delete_blob),
        )
        .route(READ_ROUTE, get(read::read_blob))
        .route("/v1/blobs/{digest}/grep", get(read::grep_blob))
        .route(
            "/v1/blobs/{digest}/pin",
            post(blobs::pin_blob).delete(blobs::unpin_blob).layer(DefaultBodyLimit::max(SMALL_BODY)),
        )
        .route("/v1/refs", get(refs::list_refs))
        .route("/v1/search", get(search::search_outputs))
        .route("/v1/streams", post(streams::create_stream))
        .route("/v1/streams/{id}", get(streams::get_stream))
        .route("/v1/streams/{id}/append", post(streams::append_stream))
        .route("/v1/streams/{id}/read", get(streams::read_stream))
        .route("/v1/streams/{id}/grep", get(streams::grep_stream))
        .route("/v1/streams/{id}/bytes", get(streams::stream_bytes))
        .route("/v1/streams/{id}/seal", post(streams::seal_stream).layer(DefaultBodyLimit::max(SMALL_BODY)))
        .fallback(not_found);
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/openapi.json", get(openapi::serve))
        .merge(ui::routes())
        .merge(v1)
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(
            Arc::new(Edge { reserve: state.reserve.clone(), config: state.config.clone() }),
            edge,
        ))
        .layer(middleware::from_fn_with_state(state.heavy.clone(), track))
        .with_state(state)
}

/// The operator's listener (`--metrics-listen`): Prometheus text at `/metrics`, nothing else.
/// Tenants never reach it: counters such as dedup hits would tell one namespace what another
/// stores.
pub fn metrics_router() -> Router {
    Router::new().route("/metrics", get(ops::metrics)).fallback(not_found).layer(middleware::from_fn(
        |req: Request, next: Next| async move {
            let (method, path) = (req.method().clone(), req.uri().path().to_owned());
            let resp = next.run(req).await;
            let status = resp.status();
            if status.is_client_error() || status.is_server_error() {
                return json_error(resp, &method, &path).await;
            }
            resp
        },
    ))
}

async fn not_found() -> ApiError {
    ApiError::NotFound("route".into())
}

/// Largest JSON body of a route that takes one (pin, seal): their fields are small.
const SMALL_BODY: usize = 16 << 10;

/// Header on answers to writes naming the largest upload this server takes, so that a client
/// whose upload was cut off can tell why.
const MAX_BLOB_HEADER: &str = "x-spillway-max-blob-bytes";
/// Longest request target accepted (`414` past it).
const MAX_URI: usize = 8 << 10;
/// Most bytes of request headers accepted (`431` past them).
const MAX_HEADERS: usize = 64 << 10;

/// What the edge layer needs of the state (one reference count per request, not the whole
/// state's).
struct Edge {
    reserve: Arc<crate::storage::local::reserve::Reserve>,
    config: Arc<crate::config::Config>,
}

/// What every request goes through, in one layer:
/// - an over-long URI or header block is refused (checked well under the HTTP parser's own
///   buffer, so the answer is the contract's JSON);
/// - while the disk is full, new writes are refused at once, so what space is left goes to
///   deletes and retention; a `507` for a full disk (not a quota) releases the space reserve;
/// - an upload's body (PUT, POST) that sends nothing for `body_idle_timeout` fails, the
///   answer to a write names the upload limit, and a refused write closes its connection;
/// - every error body is the contract's JSON, including those made before a handler runs
///   (405, an undecodable path).
async fn edge(axum::extract::State(state): axum::extract::State<Arc<Edge>>, req: Request, next: Next) -> Response {
    if let Some(refused) = over_limits(&req) {
        return refused;
    }
    let writes = matches!(*req.method(), axum::http::Method::PUT | axum::http::Method::POST);
    if writes && req.uri().path().starts_with("/v1/") && !state.reserve.admits_writes().await {
        return ApiError::InsufficientStorage.into_response();
    }
    let (method, uri) = (req.method().clone(), req.uri().clone()); // both cheap: shared bytes
    let req = if writes {
        let idle = state.config.body_idle_timeout;
        req.map(|body| axum::body::Body::new(tower_http::timeout::TimeoutBody::new(idle, body)))
    } else {
        req // reads carry no body worth a timer
    };
    let mut resp = next.run(req).await;
    let status = resp.status();
    if resp.extensions().get::<crate::error::StorageFull>().is_some() {
        state.reserve.release();
    }
    if status.is_client_error() || status.is_server_error() {
        resp = json_error(resp, &method, uri.path()).await;
    }
    if writes {
        resp.headers_mut().insert(MAX_BLOB_HEADER, axum::http::HeaderValue::from(state.config.max_blob_bytes));
        if status.is_client_error() || status.is_server_error() {
            // A refused write may leave its body unread, and the server then drops the
            // connection: say so, so that no client sends its next request down it.
            resp.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
    }
    resp
}

fn over_limits<B>(req: &axum::http::Request<B>) -> Option<Response> {
    let uri = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let headers: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    let (status, message) = if uri > MAX_URI {
        (axum::http::StatusCode::URI_TOO_LONG, format!("the URI is over {MAX_URI} bytes"))
    } else if headers > MAX_HEADERS {
        (axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, format!("the headers are over {MAX_HEADERS} bytes"))
    } else {
        return None;
    };
    Some((status, axum::Json(spillway_api::ErrorBody::new(ErrorCode::InvalidArgument, message))).into_response())
}

/// An error response made by the HTTP layer (no JSON body), rewritten as the contract's JSON.
async fn json_error(resp: Response, method: &axum::http::Method, path: &str) -> Response {
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&text).trim().to_owned();
    let (code, message) = match parts.status.as_u16() {
        405 => (ErrorCode::InvalidArgument, format!("method {method} is not allowed on {path}")),
        404 => (ErrorCode::NotFound, format!("no route {path}")),
        413 => (ErrorCode::TooLarge, "the request is too large".to_owned()),
        503 => (ErrorCode::Unavailable, "the service is unavailable; retry".to_owned()),
        s if s >= 500 => (ErrorCode::Internal, "internal server error".to_owned()),
        _ if said.is_empty() => (ErrorCode::InvalidArgument, format!("malformed request to {path}")),
        _ => (ErrorCode::InvalidArgument, said),
    };
    let body = serde_json::to_vec(&spillway_api::ErrorBody::new(code, message)).unwrap_or_default();
    parts.headers.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// Counts requests by route and status, and logs one line per request at info: method,
/// matched route (never the raw URL, which may carry labels), status, response bytes when
/// known, milliseconds and the caller's namespace. The token is never logged.
async fn track(State(heavy): State<Arc<crate::jobs::heavy::Heavy>>, mut req: Request, next: Next) -> Response {
    // Background work gives way while requests come in (`Heavy::give_way`).
    heavy.request_began();
    // Labels from closed sets: the route templates, the methods HTTP defines, then `other`,
    // so that nothing a client sends can add series (an unknown method would, forever).
    let matched = req.extensions().get::<MatchedPath>().cloned(); // shares the template
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let req_method = req.method().clone();
    let namespace = crate::auth::NamespaceSlot::default();
    req.extensions_mut().insert(namespace.clone());
    let start = Instant::now();
    let resp = next.run(req).await;
    request_done(&req_method, route, &resp, start.elapsed(), namespace.get().unwrap_or("-"));
    resp
}

/// A request answered: its log line and its series.
fn request_done(
    method: &axum::http::Method,
    route: &str,
    resp: &Response,
    elapsed: std::time::Duration,
    namespace: &str,
) {
    let status = resp.status().as_u16();
    let bytes = axum::body::HttpBody::size_hint(resp.body()).exact();
    crate::http::reqlog::log(&crate::http::reqlog::RequestLine {
        method: method.as_str(),
        route,
        status,
        bytes,
        elapsed,
        namespace,
    });
    RequestSeries::record(route, method_label(method), status_label(status), elapsed.as_secs_f64());
}

/// The capped read's common case, answered before the router by `read::read_before_router`
/// (`None`: the router answers), begun, logged and counted as [`track`] does the rest.
pub(crate) async fn answer_before_router<B>(state: &AppState, req: &axum::http::Request<B>) -> Option<Response> {
    if over_limits(req).is_some() {
        return None; // refused by the edge layer, behind the router
    }
    let start = Instant::now();
    let (resp, namespace) = read::read_before_router(state, req).await?;
    state.heavy.request_began();
    request_done(&axum::http::Method::GET, READ_ROUTE, &resp, start.elapsed(), &namespace);
    Some(resp)
}

/// The handles of the request metrics, by route, then method (and status): each labelled
/// series is looked up in the registry once, not on every request (that lookup, which builds
/// and hashes the labels, cost more than the count). The keys come from closed sets (see
/// `track`), so the map stays small. Made after the recorder is installed (the server installs
/// it before it serves), which is the one the handles then count into.
#[derive(Default)]
struct RequestSeries {
    counts: Vec<(&'static str, &'static str, metrics::Counter)>,
    durations: Vec<(&'static str, metrics::Histogram)>,
}

static REQUEST_SERIES: std::sync::LazyLock<std::sync::RwLock<std::collections::HashMap<String, RequestSeries>>> =
    std::sync::LazyLock::new(Default::default);

impl RequestSeries {
    fn record(route: &str, method: &'static str, status: &'static str, seconds: f64) {
        let count = |all: &std::collections::HashMap<String, RequestSeries>| {
            let series = all.get(route)?;
            let count = series.counts.iter().find(|(m, s, _)| *m == method && *s == status)?;
            let duration = series.durations.iter().find(|(m, _)| *m == method)?;
            count.2.increment(1);
            duration.1.record(seconds);
            Some(())
        };
        if count(&REQUEST_SERIES.read().unwrap_or_else(std::sync::PoisonError::into_inner)).is_some() {
            return;
        }
        let mut all = REQUEST_SERIES.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let series = all.entry(route.to_owned()).or_default();
        if !series.counts.iter().any(|(m, s, _)| *m == method && *s == status) {
            let c = metrics::counter!("spillway_http_requests_total", "method" => method, "route" => route.to_owned(), "status" => status);
            series.counts.push((method, status, c));
        }
        if !series.durations.iter().any(|(m, _)| *m == method) {
            let h = metrics::histogram!("spillway_http_request_duration_seconds", "method" => method, "route" => route.to_owned());
            series.durations.push((method, h));
        }
        count(&all);
    }
}

/// The metric label of a request method: one of HTTP's own, or `other`.
fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// The metric label of a status: the codes this server answers with, else their class.
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        201 => "201",
        204 => "204",
        206 => "206",
        304 => "304",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        409 => "409",
        413 => "413",
        414 => "414",
        416 => "416",
        429 => "429",
        431 => "431",
        500 => "500",
        503 => "503",
        507 => "507",
        s if s < 300 => "2xx",
        s if s < 400 => "3xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

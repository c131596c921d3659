//! The OpenAPI description served at `/openapi.json`: utoipa's document from the handlers,
//! completed with what a generated client needs and the handlers cannot say — the bearer
//! scheme on every `/v1` operation, tags by resource, the checked forms of digests and stream
//! ids, the `ttl` and `label.<key>` query parameters, binary bodies, and the error responses
//! each operation can give.

use std::sync::OnceLock;

use serde_json::{json, Map, Value};
use utoipa::OpenApi;

/// The OpenAPI 3 description of every `/v1` route, generated from the handlers.
#[derive(OpenApi)]
#[openapi(
    info(title = "Spillway store", description = "Content-addressed spill store for AI agents' tool outputs"),
    paths(
        super::blobs::put_blob,
        super::blobs::post_blob,
        super::blobs::head_blob,
        super::blobs::get_blob,
        super::blobs::pin_blob,
        super::blobs::unpin_blob,
        super::blobs::delete_blob,
        super::read::read_blob,
        super::read::grep_blob,
        super::refs::list_refs,
        super::search::search_outputs,
        super::streams::create_stream,
        super::streams::get_stream,
        super::streams::append_stream,
        super::streams::read_stream,
        super::streams::grep_stream,
        super::streams::stream_bytes,
        super::streams::seal_stream,
    ),
    components(schemas(spillway_api::ErrorBody, spillway_api::ErrorCode, spillway_api::ErrorDetail))
)]
pub struct ApiDoc;

/// Labels documented by name; any `label.<key>` (key `[a-z0-9_.-]{1,64}`) works the same way.
const DOCUMENTED_LABELS: &[(&str, &str)] = &[
    ("tool", "Which tool made the output (`bash`, `exec`, …)."),
    ("stream", "`stdout` or `stderr`."),
    ("session", "The agent session, so that SREs find its outputs later."),
];

/// The whole document, built once.
pub(super) fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
        complete(&mut doc);
        doc
    })
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

/// The statuses an operation may answer with besides its successes.
fn errors_of(method: &str, path: &str) -> Vec<(u16, &'static str)> {
    let mut out = vec![
        (400, "Malformed digest, query or body (`invalid_digest`, `invalid_argument`)."),
        (401, "Missing or unknown token (`unauthorized`)."),
        (403, "The token lacks the scope (`forbidden`)."),
        (503, "A backend is down; safe to retry (`unavailable`)."),
        (414, "The request target is over 8 KiB (`invalid_argument`)."),
        (431, "The request headers are over 64 KiB (`invalid_argument`)."),
    ];
    let writes = matches!(method, "put" | "post");
    if path.contains('{') {
        out.push((404, "No such blob or stream in the caller's namespace (`not_found`)."));
    }
    if writes {
        out.push((
            507,
            "Disk full, or the namespace's quota reached; nothing partial is left (`insufficient_storage`, `quota_exceeded`).",
        ));
    }
    match (method, path) {
        ("put" | "post", "/v1/blobs" | "/v1/blobs/{digest}") => {
            out.push((413, "Body over the server's blob limit (`too_large`)."));
        }
        (_, "/v1/streams/{id}/append") => {
            out.push((409, "Wrong offset, or the stream is sealed or capped (`offset_mismatch`, `stream_closed`)."));
            out.push((413, "The stream reached its cap; what fit was stored (`stream_limit_exceeded`)."));
        }
        ("get", "/v1/blobs/{digest}") => {
            out.push((416, "Range outside the blob (`range_not_satisfiable`)."));
        }
        ("get", p) if p.ends_with("/read") || p.ends_with("/bytes") => {
            out.push((416, "Offset or line past the end (`range_not_satisfiable`)."));
        }
        ("get", p) if p.ends_with("/grep") || p == "/v1/search" => {
            if p != "/v1/search" {
                out.push((416, "Offset or line past the end (`range_not_satisfiable`)."));
            }
            out.push((
                429,
                "Too many heavy requests (grep, search) at once; retry after `Retry-After` (`too_many_requests`).",
            ));
        }
        ("post", "/v1/streams") => {
            out.push((
                429,
                "The namespace has its most streams open; retry after `Retry-After` (`too_many_requests`).",
            ));
        }
        _ => {}
    }
    out
}

fn query_param(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "query", "required": false, "description": description, "schema": schema})
}

fn ref_params(streams: bool) -> Vec<Value> {
    let mut out = vec![query_param(
        "ttl",
        "Seconds this reference lives (default and maximum are server settings).",
        json!({"type": "integer", "minimum": 1, "maximum": 7_776_000}),
    )];
    if streams {
        out.push(query_param(
            "max_bytes",
            "The stream's cap in bytes (default and maximum 50 MiB, a server setting).",
            json!({"type": "integer", "minimum": 1, "maximum": 52_428_800}),
        ));
    }
    out.extend(label_params());
    out
}

fn label_params() -> Vec<Value> {
    DOCUMENTED_LABELS
        .iter()
        .map(|(key, what)| {
            query_param(
                &format!("label.{key}"),
                &format!("{what} Any `label.<key>` works alike; at most 16 labels."),
                // 256 bytes: 64 characters of up to 4 bytes each always fit.
                json!({"type": "string", "maxLength": 64}),
            )
        })
        .collect()
}

/// Bounds of the query parameters the handlers share, as the server checks them.
fn query_param_schema(name: &str) -> Option<Value> {
    match name {
        "line" | "lines" | "from_line" | "max_matches" => {
            Some(json!({"type": "integer", "minimum": 1, "maximum": u64::MAX}))
        }
        "offset" | "limit" => Some(json!({"type": "integer", "minimum": 0, "maximum": u64::MAX})),
        "before" | "after" => Some(json!({"type": "integer", "minimum": 0, "maximum": 100})),
        "wait_ms" => Some(json!({"type": "integer", "minimum": 0, "maximum": 30_000})),
        "pattern" => Some(json!({"type": "string", "minLength": 1, "maxLength": 1024})),
        _ => None,
    }
}

/// A cursor as the server seals it: URL-safe base64 of nonce, position and tag.
fn cursor_schema() -> Value {
    json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{40,200}$"})
}

fn path_param_schema(name: &str) -> Option<Value> {
    match name {
        "digest" => Some(json!({"type": "string", "pattern": "^(blake3|sha256):[0-9a-f]{64}$"})),
        "id" => Some(json!({"type": "string", "pattern": "^[0-9a-f]{32}$"})),
        _ => None,
    }
}

fn tag_of(path: &str) -> &'static str {
    match path {
        p if p.starts_with("/v1/streams") => "streams",
        p if p.starts_with("/v1/refs") => "refs",
        p if p.starts_with("/v1/search") => "search",
        _ => "blobs",
    }
}

/// Fills in one operation.
fn complete_operation(method: &str, path: &str, op: &mut Map<String, Value>) {
    op.insert("tags".into(), json!([tag_of(path)]));
    op.insert("security".into(), json!([{"bearer": []}]));
    let params = op.entry("parameters").or_insert_with(|| json!([]));
    if let Some(list) = params.as_array_mut() {
        for p in list.iter_mut() {
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            let schema = if p["in"] == "path" { path_param_schema(&name) } else { query_param_schema(&name) };
            if let Some(schema) = schema {
                p["schema"] = schema;
            }
        }
        match (method, path) {
            ("put" | "post", "/v1/blobs" | "/v1/blobs/{digest}") => list.extend(ref_params(false)),
            ("post", "/v1/streams") => list.extend(ref_params(true)),
            ("get", "/v1/streams/{id}/bytes") => {
                for p in list.iter_mut().filter(|p| p["name"] == "limit") {
                    p["schema"] = json!({"type": "integer", "minimum": 1, "maximum": 4_194_304});
                }
            }
            ("get", "/v1/refs") => {
                list.push(query_param(
                    "limit",
                    "Most references per page.",
                    json!({"type": "integer", "minimum": 1, "maximum": 1000}),
                ));
                list.push(query_param("cursor", "The `next_cursor` of the previous page.", cursor_schema()));
                list.push(query_param(
                    "digest",
                    "Only the references to this output (its `blake3:` digest).",
                    json!({"type": "string", "pattern": "^blake3:[0-9a-f]{64}$"}),
                ));
                list.extend(label_params());
            }
            ("get", "/v1/search") => {
                for p in list.iter_mut() {
                    match p["name"].as_str() {
                        Some("max_matches") => p["schema"] = json!({"type": "integer", "minimum": 1, "maximum": 1000}),
                        Some("cursor") => p["schema"] = cursor_schema(),
                        _ => {}
                    }
                }
                list.extend(label_params());
            }
            _ => {}
        }
    }
    if let Some(body) = op.get_mut("requestBody") {
        if let Some(binary) = body.get_mut("content").and_then(|c| c.get_mut("application/octet-stream")) {
            binary["schema"] =
                json!({"type": "string", "format": "binary", "contentMediaType": "application/octet-stream"});
            // An empty body is an empty blob, or an append of nothing.
            body["required"] = json!(false);
        }
    }
    let responses = op.entry("responses").or_insert_with(|| json!({}));
    for (status, description) in errors_of(method, path) {
        let key = status.to_string();
        if responses.get(&key).is_none_or(|r| r["description"].as_str().is_none_or(str::is_empty)) {
            responses[key] = error_response(description);
        }
    }
    if let Some(all) = responses.as_object_mut() {
        for r in all.values_mut() {
            if r["description"].as_str().is_none_or(str::is_empty) {
                r["description"] = json!("Success.");
            }
        }
    }
}

/// Constraints of request bodies the derive cannot say.
fn complete_schemas(schemas: &mut Value) {
    schemas["SealRequest"]["properties"]["signal"] =
        json!({"type": ["string", "null"], "pattern": "^[A-Z0-9]{1,16}$", "description": "TERM, KILL, …"});
    schemas["SealRequest"]["properties"]["exit_code"] =
        json!({"type": ["integer", "null"], "minimum": -2_147_483_648i64, "maximum": 2_147_483_647});
    schemas["PinRequest"]["properties"]["until"] = json!({
        "type": ["integer", "null"], "minimum": 0, "maximum": spillway_api::LAST_UNIX_SECOND,
        "description": "Unix seconds, in the future: keep the blob until then instead of forever."
    });
}

fn complete(doc: &mut Value) {
    complete_schemas(&mut doc["components"]["schemas"]);
    doc["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer", "description": "A token from `spillway-server token create`."}
    });
    doc["tags"] = json!([
        {"name": "blobs", "description": "Content-addressed outputs: upload, download, the capped read API, grep, pins."},
        {"name": "refs", "description": "This namespace's references, by label."},
        {"name": "search", "description": "Matching lines across this namespace's outputs, by label and time."},
        {"name": "streams", "description": "Background task output, readable while it is written."}
    ]);
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        if !path.starts_with("/v1") {
            continue;
        }
        let Some(methods) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in methods.iter_mut() {
            if let Some(op) = op.as_object_mut() {
                complete_operation(method, path, op);
            }
        }
    }
}

/// `GET /openapi.json`: the document, made once.
pub(super) async fn serve() -> axum::Json<&'static serde_json::Value> {
    axum::Json(document())
}

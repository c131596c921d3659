//! Operations endpoints and the first-start token.

use bytes::Bytes;
use spillway_client::UploadOptions;

use crate::support::*;

#[tokio::test]
async fn health_ready_metrics_openapi() {
    let srv = TestServer::start().await;
    let http = reqwest::Client::new();
    let get = |p: &str| http.get(format!("{}{p}", srv.url)).send();
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    srv.client().put(Bytes::from_static(b"m"), &UploadOptions::default()).await.unwrap();
    srv.client().put(Bytes::from_static(b"m"), &UploadOptions::default()).await.unwrap();
    let m = get("/metrics").await.unwrap().text().await.unwrap();
    for name in ["spillway_http_requests_total", "spillway_bytes_in_total", "spillway_dedup_hits_total"] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }
    let doc: serde_json::Value = get("/openapi.json").await.unwrap().json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/blobs",
        "/v1/blobs/{digest}",
        "/v1/blobs/{digest}/read",
        "/v1/blobs/{digest}/grep",
        "/v1/blobs/{digest}/pin",
        "/v1/refs",
        "/v1/streams",
        "/v1/streams/{id}",
        "/v1/streams/{id}/append",
        "/v1/streams/{id}/read",
        "/v1/streams/{id}/seal",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing from openapi.json");
    }
    let r = get("/v1/nope").await.unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    srv.stop().await;
}

#[tokio::test]
async fn first_start_writes_a_private_token() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = spillway_server::Config::new(dir.path().join("data"));
    let state =
        spillway_server::build_state(config, std::sync::Arc::new(spillway_server::clock::SystemClock)).await.unwrap();
    let path = spillway_server::ensure_first_token(&state).await.unwrap().expect("created on first start");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&path).unwrap();
    let row = state.db.find_token(&spillway_server::auth::hash_token(token.trim())).await.unwrap().unwrap();
    assert_eq!(row.namespace, "default");
    assert_eq!(row.scopes.len(), 3);
    assert!(spillway_server::ensure_first_token(&state).await.unwrap().is_none(), "only the first start");
}

#[tokio::test]
async fn backend_down_is_503_unavailable() {
    let srv = TestServer::start().await;
    let c = srv.client();
    c.list_refs(&[], None, None).await.unwrap(); // the token is now known
    srv.state.db.close().await;
    let http = reqwest::Client::new();
    let r = http.get(format!("{}/readyz", srv.url)).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    let err = c.list_refs(&[], None, None).await.unwrap_err();
    assert_eq!(api_code(&err), (503, "unavailable".into()));
    assert_eq!(http.get(format!("{}/healthz", srv.url)).send().await.unwrap().status(), 200, "the process is up");
}

#[tokio::test]
async fn a_failing_write_spoils_only_itself() {
    // Concurrent writes share SQLite group commits; a write that fails (here a duplicate key)
    // must roll back alone and leave the others of its batch committed.
    let srv = TestServer::start().await;
    let hashes: Vec<String> = (0..40).map(|i| if i % 2 == 0 { "same".to_owned() } else { format!("h{i}") }).collect();
    let writes = hashes.iter().map(|h| {
        let db = srv.state.db.clone();
        let h = h.clone();
        async move { db.insert_token(&h, "ns-x", &["read".to_owned()], 0).await.is_ok() }
    });
    let results = futures::future::join_all(writes).await;
    let same_ok = results.iter().zip(&hashes).filter(|(ok, h)| **ok && h.as_str() == "same").count();
    assert_eq!(same_ok, 1, "exactly one of the duplicates is stored");
    for (ok, h) in results.iter().zip(&hashes) {
        if h != "same" {
            assert!(ok, "{h} was stored");
            assert!(srv.state.db.find_token(h).await.unwrap().is_some(), "{h} survived its batch");
        }
    }
    srv.stop().await;
}

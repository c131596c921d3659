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
    // The metrics are on the operator's listener, never on the API's.
    let on_api = get("/metrics").await.unwrap();
    assert_eq!(on_api.status(), 404);
    let m = http.get(format!("{}/metrics", srv.metrics_url)).send().await.unwrap().text().await.unwrap();
    for name in ["spillway_http_requests_total", "spillway_bytes_in_total", "spillway_dedup_hits_total"] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }
    // Every counter the README says to watch is there with its help text, even before its
    // first event, and latency is a histogram (buckets add up across replicas).
    for name in [
        "spillway_bytes_out_total",
        "spillway_read_capped_total",
        "spillway_retention_deleted_blobs_total",
        "spillway_retention_freed_bytes_total",
    ] {
        assert!(m.contains(&format!("# HELP {name} ")), "{name} has no HELP line");
        assert!(m.lines().any(|l| l.starts_with(name) && !l.starts_with('#')), "{name} has no value");
    }
    assert!(m.contains("# TYPE spillway_http_request_duration_seconds histogram"), "{m}");
    assert!(m.contains("spillway_http_request_duration_seconds_bucket{"));
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
        // Complete enough for a generated client: the bearer scheme, tags by resource, and
        // the contract's error responses with the error schema, on every operation.
        for (method, op) in doc["paths"][path].as_object().unwrap() {
            assert_eq!(op["security"], serde_json::json!([{"bearer": []}]), "{method} {path}");
            let tag = op["tags"][0].as_str().unwrap();
            assert!(["blobs", "refs", "streams"].contains(&tag), "{method} {path}: tag {tag}");
            for status in ["400", "401", "403", "503"] {
                let schema = &op["responses"][status]["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(schema, "#/components/schemas/ErrorBody", "{method} {path} {status}");
            }
        }
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    let param = |path: &str, method: &str, name: &str| {
        doc["paths"][path][method]["parameters"].as_array().unwrap().iter().find(|p| p["name"] == name).cloned()
    };
    for name in ["offset", "limit", "line", "lines"] {
        let p = param("/v1/blobs/{digest}/read", "get", name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!((p["in"].as_str(), p["required"].as_bool()), (Some("query"), Some(false)), "{name}");
    }
    assert!(param("/v1/streams/{id}/read", "get", "wait_ms").is_some());
    for name in ["ttl", "label.session"] {
        assert!(param("/v1/blobs", "post", name).is_some(), "{name} on uploads");
    }
    assert_eq!(
        param("/v1/blobs/{digest}", "get", "digest").unwrap()["schema"]["pattern"],
        "^(blake3|sha256):[0-9a-f]{64}$"
    );
    let body = &doc["paths"]["/v1/blobs/{digest}"]["put"]["requestBody"]["content"]["application/octet-stream"];
    assert_eq!(body["schema"]["format"], "binary", "bodies are bytes, not integer arrays");
    assert!(doc["paths"]["/v1/blobs/{digest}"]["put"]["responses"]["413"].is_object());
    assert!(doc["paths"]["/v1/streams/{id}/append"]["post"]["responses"]["409"].is_object());
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
    assert_eq!(row.namespace.as_str(), "default");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_spoils_only_itself() {
    // Concurrent writes share SQLite group commits; a write that fails (here a duplicate key)
    // must roll back alone and leave the others of its batch committed.
    let srv = TestServer::start().await;
    let hashes: Vec<String> = (0..40).map(|i| if i % 2 == 0 { "same".to_owned() } else { format!("h{i}") }).collect();
    let writes = hashes.iter().map(|h| {
        let db = srv.state.db.clone();
        let h = h.clone();
        let grant = spillway_server::db::TokenRow {
            namespace: "ns-x".parse().unwrap(),
            scopes: vec![spillway_api::Scope::Read],
            redacted: false,
        };
        async move { db.insert_token(&h, &grant, 0).await.is_ok() }
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

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` when this machine will not mount one (not root): the caller says it skipped.
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// A full disk — SQLite's included — answers `507 insufficient_storage` (never 500), deletes
/// still work (the space reserve is given back for them), and `/readyz` says the store is full.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_is_507_and_deletes_still_work() {
    if is_remote() {
        eprintln!("SKIPPED a_full_disk_is_507_and_deletes_still_work: the embedded store's disk (SQLite + files)");
        return;
    }
    let Some(disk) = SmallDisk::mount("24m") else {
        eprintln!("SKIPPED a_full_disk_is_507_and_deletes_still_work: cannot mount a tmpfs here (not root)");
        return;
    };
    let data = disk.dir.path().join("data");
    let srv = TestServer::start_with(|c| {
        c.data_dir = data.clone();
        // Enough for SQLite to fold its log (up to 1,000 pages, 4 MiB) into the database.
        c.storage_reserve_bytes = 8 << 20;
    })
    .await;
    let c = srv.client();
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{}/readyz", srv.url)).send().await.unwrap().status(), 200);
    // Small outputs are stored inline, in SQLite: fill the disk with them.
    let mut stored = Vec::new();
    let full = loop {
        let body = Bytes::from(format!("{:016}", stored.len()).repeat(1000)); // 16,000 bytes, distinct
        match c.put(body, &UploadOptions::default()).await {
            Ok(rec) => stored.push(rec.digest),
            Err(e) => break e,
        }
        assert!(stored.len() < 5000, "24 MiB never filled");
    };
    assert_eq!(api_code(&full), (507, "insufficient_storage".into()), "{full}");
    assert!(stored.len() > 10);
    let r = http.get(format!("{}/readyz", srv.url)).send().await.unwrap();
    assert_eq!(r.status(), 503, "readyz reports the full disk");
    // Stream writes are refused the same way, not with a 500.
    match c.create_stream(&UploadOptions::default()).await {
        Ok(_) => {}
        Err(e) => assert_eq!(api_code(&e), (507, "insufficient_storage".into()), "{e}"),
    }
    // An operator frees space through the API.
    for d in stored.iter().take(50) {
        c.delete(d).await.unwrap_or_else(|e| panic!("DELETE on a full disk: {e}"));
    }
    assert!(c.head(&stored[0]).await.unwrap().is_none());
    srv.stop().await;
    drop(disk);
}

/// The binary, as an operator runs it, logs one line per request at the default level — method,
/// route, status, bytes, milliseconds and namespace, never the token — in both `--log-format`s,
/// the capped reads answered before the router included, and writes every line out before it
/// exits.
#[tokio::test]
async fn the_binary_logs_one_line_per_request() {
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr.log");
        let mut child = std::process::Command::new(server_binary())
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "none", "--log-format", format, "--data-dir"])
            .arg(dir.path().join("data"))
            .env_remove("RUST_LOG")
            .env_remove("SPILLWAY_DATABASE_URL")
            .env_remove("SPILLWAY_BLOB_STORE")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut addr = None;
        for _ in 0..600 {
            let text = std::fs::read_to_string(&log).unwrap();
            addr = text.lines().find_map(|l| {
                let at = l.find("listening")?;
                let rest = &l[at..];
                let start = rest.find("127.0.0.1:")?;
                Some(
                    rest[start..]
                        .chars()
                        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                        .collect::<String>(),
                )
            });
            if addr.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let url = format!("http://{}", addr.expect("the server logs where it listens"));
        let token = std::fs::read_to_string(dir.path().join("data/token")).unwrap().trim().to_owned();
        let http = reqwest::Client::new();
        let body = "a line of text\n".repeat(20_000);
        let put = http.post(format!("{url}/v1/blobs")).bearer_auth(&token).body(body).send().await.unwrap();
        assert_eq!(put.status(), 201);
        // Each answer's length as the client received it, in order, for the log's `bytes`.
        let mut sizes = vec![put.content_length()];
        let digest = put.json::<serde_json::Value>().await.unwrap()["digest"].as_str().unwrap().to_owned();
        for offset in [0, 1000, 2000] {
            let r = http
                .get(format!("{url}/v1/blobs/{digest}/read?offset={offset}&limit=500"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            sizes.push(r.content_length());
        }
        let missing = format!("{url}/v1/blobs/blake3:{}", "0".repeat(64));
        let r = http.get(missing).bearer_auth(&token).send().await.unwrap();
        assert_eq!(r.status(), 404);
        sizes.push(r.content_length());
        assert!(sizes.iter().all(Option::is_some), "every answer here has a length: {sizes:?}");
        assert!(std::process::Command::new("kill").arg(child.id().to_string()).status().unwrap().success());
        assert!(child.wait().unwrap().success(), "a stopped server exits cleanly");

        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains(&token), "no token in the log");
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("spillway::http")).collect();
        // (method, route, status, namespace), and the answer's length if logged.
        type Logged = ((String, String, u64, String), Option<u64>);
        let (seen, logged_sizes): (Vec<_>, Vec<_>) = lines
            .iter()
            .map(|l| -> Logged {
                match format {
                    "json" => {
                        let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                        let f = &v["fields"];
                        assert_eq!(f["message"], "request");
                        assert!(f["ms"].as_str().is_some_and(|ms| ms.parse::<f64>().is_ok()), "{l}");
                        let s = |k: &str| f[k].as_str().unwrap().to_owned();
                        ((s("method"), s("route"), f["status"].as_u64().unwrap(), s("namespace")), f["bytes"].as_u64())
                    }
                    _ => {
                        let value =
                            |k: &str| Some(l.split(&format!(" {k}=")).nth(1)?.split(' ').next()?.trim_matches('"'));
                        let field = |k: &str| value(k).unwrap_or_else(|| panic!("no {k} in {l}")).to_owned();
                        assert!(field("ms").parse::<f64>().is_ok(), "{l}");
                        let bytes = value("bytes").map(|b| b.parse().unwrap_or_else(|_| panic!("bytes in {l}")));
                        ((field("method"), field("route"), field("status").parse().unwrap(), field("namespace")), bytes)
                    }
                }
            })
            .unzip();
        let want = |m: &str, r: &str, s: u64| (m.to_owned(), r.to_owned(), s, "default".to_owned());
        let read = want("GET", "/v1/blobs/{digest}/read", 200);
        assert_eq!(
            seen,
            [want("POST", "/v1/blobs", 201), read.clone(), read.clone(), read, want("GET", "/v1/blobs/{digest}", 404)],
            "{format}: one line per request, in order:\n{text}"
        );
        assert_eq!(logged_sizes, sizes, "{format}: each answer's length is logged:\n{text}");
    }
}

//! Backend selection of the test kit. With `SPILLWAY_TEST_BACKEND=postgres-s3`, each test
//! server gets a fresh database on the PostgreSQL server named by
//! `SPILLWAY_TEST_DATABASE_URL`, and a fresh bucket on an S3 protocol server (`s3s` over
//! `s3s-fs`) that this process runs on loopback.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use sqlx::Connection;

use crate::Config;

const ACCESS_KEY: &str = "spillway-test";
const SECRET_KEY: &str = "spillway-test-secret";

struct S3Server {
    endpoint: String,
    root: std::path::PathBuf,
}

static S3: OnceLock<S3Server> = OnceLock::new();

/// True when the suite runs on PostgreSQL + S3.
pub fn is_remote() -> bool {
    std::env::var("SPILLWAY_TEST_BACKEND").is_ok_and(|v| v == "postgres-s3")
}

/// The process's S3 test server, started on first use on a thread of its own (each test has
/// its own runtime; the server must outlive them all).
fn s3_server() -> &'static S3Server {
    S3.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("spillway-s3-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("s3 root");
        let (tx, rx) = std::sync::mpsc::channel();
        let fs_root = root.clone();
        std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind s3");
                tx.send(listener.local_addr().expect("addr")).expect("send addr");
                serve_s3(listener, fs_root).await;
            });
        });
        let addr = rx.recv().expect("s3 server started");
        let endpoint = format!("http://{addr}");
        S3Server { endpoint, root }
    })
}

/// Requests the S3 server received, by bucket and by kind (see [`request_kind`]).
static S3_REQUESTS: Mutex<BTreeMap<(String, &'static str), u64>> = Mutex::new(BTreeMap::new());

/// What an S3 request (path-style) does, as far as the write path is concerned.
fn request_kind<B>(req: &http::Request<B>) -> &'static str {
    let query = req.uri().query().unwrap_or_default();
    let has = |k: &str| query.split('&').any(|p| p.split('=').next() == Some(k));
    match *req.method() {
        http::Method::PUT if req.headers().contains_key("x-amz-copy-source") => "copy",
        http::Method::PUT if has("partNumber") => "upload_part",
        http::Method::PUT => "put",
        http::Method::POST if has("uploads") => "create_multipart",
        http::Method::POST if has("uploadId") => "complete_multipart",
        http::Method::DELETE if has("uploadId") => "abort_multipart",
        http::Method::DELETE => "delete",
        http::Method::GET if !req.uri().path().trim_start_matches('/').contains('/') => "list",
        http::Method::GET => "get",
        _ => "other",
    }
}

/// How many requests of `kind` the S3 server received for the bucket of an `s3://bucket/...`
/// store.
pub(crate) fn s3_requests(url: &str, kind: &str) -> u64 {
    let bucket = url.trim_start_matches("s3://").split('/').next().unwrap_or_default();
    let seen = S3_REQUESTS.lock().unwrap_or_else(|e| e.into_inner());
    seen.iter().filter(|((b, k), _)| b == bucket && *k == kind).map(|(_, n)| n).sum()
}

/// Every request the S3 server of this process received, as (bucket, kind, count).
pub fn s3_request_counts() -> Vec<(String, &'static str, u64)> {
    let seen = S3_REQUESTS.lock().unwrap_or_else(|e| e.into_inner());
    seen.iter().map(|((b, k), n)| (b.clone(), *k, *n)).collect()
}

/// Serves the S3 protocol over `root` on `listener` until the process ends.
pub async fn serve_s3(listener: tokio::net::TcpListener, root: std::path::PathBuf) {
    use hyper::service::Service;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let fs = s3s_fs::FileSystem::new(root).expect("s3s-fs");
    let mut b = s3s::service::S3ServiceBuilder::new(fs);
    b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
    let s3 = b.build();
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let bucket = req.uri().path().trim_start_matches('/').split('/').next().unwrap_or_default().to_owned();
        *S3_REQUESTS.lock().unwrap_or_else(|e| e.into_inner()).entry((bucket, request_kind(&req))).or_default() += 1;
        Service::<http::Request<hyper::body::Incoming>>::call(&s3, req)
    });
    let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((socket, _)) = listener.accept().await else { continue };
        let _ = socket.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// Points `config` at the backends of this test run.
pub(crate) async fn configure(config: &mut Config) {
    if !is_remote() {
        return;
    }
    let admin = std::env::var("SPILLWAY_TEST_DATABASE_URL")
        .expect("SPILLWAY_TEST_DATABASE_URL (postgres://…/postgres) for the postgres-s3 backend");
    let name = format!("spw_{}", uuid::Uuid::new_v4().simple());
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&admin).await.expect("connect to PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create database");
    conn.close().await.ok();
    let (base, _) = admin.rsplit_once('/').expect("database URL with a path");
    config.database_url = Some(format!("{base}/{name}"));
    let s3 = s3_server();
    let bucket = format!("b{}", uuid::Uuid::new_v4().simple());
    std::fs::create_dir_all(s3.root.join(&bucket)).expect("bucket");
    config.blob_store = Some(format!("s3://{bucket}/spill"));
    // Given to this server alone: no process-wide AWS_* variables while other tests run.
    config.s3_options = [
        ("aws_endpoint", s3.endpoint.as_str()),
        ("aws_access_key_id", ACCESS_KEY),
        ("aws_secret_access_key", SECRET_KEY),
        ("aws_region", "us-east-1"),
        ("aws_allow_http", "true"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into();
    tracing::debug!(endpoint = %s3.endpoint, %bucket, "test backend: postgres + s3");
}

/// Breaks the bucket of an `s3://bucket/...` store (the server's directory of it becomes a
/// file): every request to it fails from now on.
pub(crate) fn break_bucket(url: &str) {
    let bucket = url.trim_start_matches("s3://").split('/').next().unwrap_or_default();
    if let Some(s3) = S3.get() {
        let _ = std::fs::remove_dir_all(s3.root.join(bucket));
        std::fs::write(s3.root.join(bucket), b"not a bucket").expect("break the bucket");
    }
}

/// Keys under the bucket of an `s3://bucket/...` store (to look for leftovers).
pub(crate) fn bucket_keys(url: &str) -> Vec<String> {
    let bucket = url.trim_start_matches("s3://").split('/').next().unwrap_or_default();
    let Some(s3) = S3.get() else { return Vec::new() };
    let root = s3.root.join(bucket);
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(&root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

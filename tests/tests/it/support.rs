//! Helpers over the server's test kit: clients, line generators, file listings.

use std::path::PathBuf;

use spillway_client::StoreClient;
use spillway_server::auth::Scope;
pub use spillway_server::testing::{is_remote, TestServer, ALL};

/// Clients of a test server.
pub trait Clients {
    fn client(&self) -> StoreClient;
    async fn client_for(&self, ns: &str, scopes: &[Scope]) -> StoreClient;
}

impl Clients for TestServer {
    fn client(&self) -> StoreClient {
        StoreClient::new(&self.url, &self.token)
    }
    async fn client_for(&self, ns: &str, scopes: &[Scope]) -> StoreClient {
        StoreClient::new(&self.url, self.token(ns, scopes).await)
    }
}

/// Text with numbered lines, `n` of them.
pub fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

/// Files in a directory tree (to count stored copies and leftovers).
pub fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

pub fn api_code(err: &spillway_client::ClientError) -> (u16, String) {
    match err {
        spillway_client::ClientError::Api { status, code, .. } => {
            (*status, serde_json::to_value(code).unwrap().as_str().unwrap_or_default().to_owned())
        }
        other => panic!("expected an API error, got {other}"),
    }
}

/// Waits until `cond` holds — an event the test can observe, not a guess at how long it takes.
/// The 30 s bound only turns a hang into a failure.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// A blob's SHA-256 from its record, as the digest the client takes.
pub fn sha256_of(rec: &spillway_api::BlobRecord) -> spillway_api::AnyDigest {
    rec.sha256.parse().expect("the record's sha256 is a digest")
}

/// A binary of package `package`, named `name`, that the workspace built beside this test binary.
fn workspace_binary(name: &str, package: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let bin = exe.parent().and_then(|deps| deps.parent()).expect("target directory").join(name);
    assert!(
        bin.exists(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build -p {package}`)",
        bin.display()
    );
    bin
}

/// The `spillway-server` binary.
pub fn server_binary() -> std::path::PathBuf {
    workspace_binary("spillway-server", "spillway-server")
}

/// The `spillway` CLI binary.
pub fn client_binary() -> std::path::PathBuf {
    workspace_binary("spillway", "spillway-client")
}

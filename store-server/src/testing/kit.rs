//! Test kit (feature `testing`): the real server on `127.0.0.1:0` with a temporary data
//! directory and a manual clock, on SQLite + local disk or, when
//! `SPILLWAY_TEST_BACKEND=postgres-s3`, on a fresh PostgreSQL database and an S3 bucket.

use std::sync::Arc;

use tempfile::TempDir;
use tokio::sync::oneshot;

use crate::auth::{create_token, Scope};
use crate::clock::ManualClock;
use crate::{AppState, Config};

pub use super::backend::{is_remote, s3_request_counts, serve_s3};

/// Every scope.
pub const ALL: &[Scope] = &[Scope::Read, Scope::Write, Scope::Admin];

/// The configuration of a server of this test run's backend, with its data under `data_dir`
/// (a fresh database and bucket on PostgreSQL + S3).
pub async fn backend_config(data_dir: impl Into<std::path::PathBuf>) -> Config {
    let mut config = Config::new(data_dir);
    crate::testing::backend::configure(&mut config).await;
    config.sweep_prefixes = 256;
    config
}

/// A running server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `http://127.0.0.1:PORT` of the operator's metrics listener.
    pub metrics_url: String,
    /// An all-scopes token of namespace `ns-a`.
    pub token: String,
    /// The server's state (database, blob store, config).
    pub state: AppState,
    /// Moves the server's time.
    pub clock: ManualClock,
    /// Keeps the data directory alive.
    pub dir: Arc<TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    metrics_task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    /// A server with the default configuration.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A server whose configuration `tune` adjusts.
    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let mut config = Config::new(dir.path().join("data"));
        crate::testing::backend::configure(&mut config).await;
        // A pass sweeps the whole store for leftovers, as the tests of the sweep expect (the
        // rotation itself has a test of its own).
        config.sweep_prefixes = 256;
        tune(&mut config);
        Self::start_in(config, dir, ManualClock::default()).await
    }

    /// Another replica: same database, same blob store, same clock.
    pub async fn replica(&self) -> Self {
        Self::start_in(self.config(), self.dir.clone(), self.clock.clone()).await
    }

    async fn start_in(config: Config, dir: Arc<TempDir>, clock: ManualClock) -> Self {
        let state = crate::build_state(config, Arc::new(clock.clone())).await.expect("server state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let s = state.clone();
        let task = tokio::spawn(async move {
            let _ = crate::serve(listener, s, async move {
                let _ = stopped.await;
            })
            .await;
        });
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind metrics");
        let metrics_url = format!("http://{}", metrics.local_addr().expect("addr"));
        let config = state.config.clone();
        let metrics_task = tokio::spawn(async move {
            crate::serve_metrics(metrics, &config, std::future::pending()).await;
        });
        let token = create_token(&state.db, "ns-a", ALL, 0).await.expect("token");
        Self { url, metrics_url, token, state, clock, dir, stop: Some(stop), task: Some(task), metrics_task }
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        (*self.state.config).clone()
    }

    /// A new token.
    pub async fn token(&self, ns: &str, scopes: &[Scope]) -> String {
        create_token(&self.state.db, ns, scopes, 0).await.expect("token")
    }

    /// A new redacted token (`token create --redacted`).
    pub async fn redacted_token(&self, ns: &str, scopes: &[Scope]) -> String {
        crate::auth::create_token_with(&self.state.db, ns, scopes, true, 0).await.expect("token")
    }

    /// The local blob directory (meaningful on the local backend).
    pub fn blob_dir(&self) -> std::path::PathBuf {
        self.config().data_dir.join("blobs")
    }

    /// Names of what the blob store holds under `prefix` (`"tmp"` or `"blobs"`): files on
    /// disk, keys in the S3 bucket. For the "nothing partial is left" checks on both backends.
    pub fn stored_under(&self, prefix: &str) -> Vec<String> {
        match self.state.config.blob_store.as_deref() {
            Some(url) if url.starts_with("s3://") => {
                let inner = url.trim_start_matches("s3://").split_once('/').map_or("", |(_, p)| p).to_owned();
                let want = if inner.is_empty() { format!("{prefix}/") } else { format!("{inner}/{prefix}/") };
                crate::testing::backend::bucket_keys(url).into_iter().filter(|k| k.starts_with(&want)).collect()
            }
            _ => {
                let mut out = Vec::new();
                let mut stack = vec![self.blob_dir().join(prefix)];
                while let Some(d) = stack.pop() {
                    for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                        let p = e.path();
                        if p.is_dir() {
                            stack.push(p)
                        } else if p.extension().is_none_or(|e| e != "lock") {
                            // (A process's staging lock is not staged bytes.)
                            out.push(p.display().to_string())
                        }
                    }
                }
                out
            }
        }
    }

    /// How many requests of `kind` (`get`, `list`, `copy`, `put`, `upload_part`,
    /// `create_multipart`, `complete_multipart`, `abort_multipart`, `delete`) this server's
    /// bucket received from
    /// it; always 0 on the local backend.
    pub fn s3_requests(&self, kind: &str) -> u64 {
        match self.state.config.blob_store.as_deref() {
            Some(url) if url.starts_with("s3://") => crate::testing::backend::s3_requests(url, kind),
            _ => 0,
        }
    }

    /// Makes the blob store fail from now on: on disk its directories become files, on S3 the
    /// bucket goes. For the tests of `503 unavailable`.
    pub fn break_blob_store(&self) {
        if let Some(url) = self.state.config.blob_store.as_deref().filter(|u| u.starts_with("s3://")) {
            return crate::testing::backend::break_bucket(url);
        }
        let root = self.blob_dir();
        for dir in ["tmp", "blobs"] {
            let _ = std::fs::remove_dir_all(root.join(dir));
            std::fs::write(root.join(dir), b"not a directory").expect("break the blob store");
        }
    }

    /// One compaction pass over every raw blob, whatever its age.
    pub async fn compact(&self) -> spillway_api::CompactionSummary {
        crate::jobs::compaction::run_compaction_once(&self.state.jobs, std::time::Duration::ZERO)
            .await
            .expect("compaction")
    }

    /// One retention pass.
    pub async fn retention(&self) -> spillway_api::RetentionSummary {
        crate::run_retention_once(&self.state.jobs, false).await.expect("retention")
    }

    /// Stops serving and closes the database.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        self.metrics_task.abort();
        // Whatever the test did, the kept sums of what the store holds are what a count gives
        // (`db/totals.rs`).
        if !std::thread::panicking() {
            let (kept, counted) = self.state.db.totals_and_count().await.expect("totals");
            assert_eq!(kept, counted, "the kept sums drifted from the rows");
        }
        self.state.db.close().await;
    }
}

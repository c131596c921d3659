//! `TestServer`: the real server on `127.0.0.1:0` with a temporary data directory, a manual
//! clock, and helpers to mint tokens and run retention.

use std::path::PathBuf;
use std::sync::Arc;

use spillway_client::StoreClient;
use spillway_server::auth::{create_token, Scope};
use spillway_server::clock::ManualClock;
use spillway_server::{AppState, Config};
use tempfile::TempDir;
use tokio::sync::oneshot;

pub struct TestServer {
    pub url: String,
    pub token: String,
    pub state: AppState,
    pub clock: ManualClock,
    pub dir: Arc<TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let mut config = Config::new(dir.path().join("data"));
        crate::backend::configure(&mut config, &dir).await;
        tune(&mut config);
        Self::start_in(config, dir).await
    }

    /// Another server over the same configuration (a replica, or a restart).
    pub async fn start_in(config: Config, dir: Arc<TempDir>) -> Self {
        let clock = ManualClock::default();
        let state = spillway_server::build_state(config, Arc::new(clock.clone())).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let s = state.clone();
        let task = tokio::spawn(async move {
            spillway_server::serve(listener, s, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let token = create_token(&state.db, "ns-a", &[Scope::Read, Scope::Write, Scope::Admin], 0).await.unwrap();
        Self { url, token, state, clock, dir, stop: Some(stop), task: Some(task) }
    }

    pub fn config(&self) -> Config {
        (*self.state.config).clone()
    }

    pub fn client(&self) -> StoreClient {
        StoreClient::new(&self.url, &self.token)
    }

    pub async fn token(&self, ns: &str, scopes: &[Scope]) -> String {
        create_token(&self.state.db, ns, scopes, 0).await.unwrap()
    }

    pub async fn client_for(&self, ns: &str, scopes: &[Scope]) -> StoreClient {
        StoreClient::new(&self.url, self.token(ns, scopes).await)
    }

    pub fn blob_dir(&self) -> PathBuf {
        self.config().data_dir.join("blobs")
    }

    pub async fn retention(&self) -> spillway_api::RetentionSummary {
        spillway_server::run_retention_once(&self.state, false).await.unwrap()
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        self.state.db.close().await;
    }
}

pub const ALL: &[Scope] = &[Scope::Read, Scope::Write, Scope::Admin];

/// Text with numbered lines, `n` of them.
pub fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

/// Files in a directory tree (to count stored copies and leftovers).
pub fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
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

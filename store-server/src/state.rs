//! `AppState`: what every handler gets through axum's `State`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::blobs::BlobStore;
use crate::clock::Clock;
use crate::config::Config;
use crate::db::Db;

/// Shared by all handlers; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Metadata.
    pub db: Db,
    /// Blob bytes.
    pub blobs: BlobStore,
    /// Settings.
    pub config: Arc<Config>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Wakes long-polling readers of a stream appended on this replica; readers on other
    /// replicas notice the append by polling the database.
    pub stream_waiters: Arc<StreamWaiters>,
    /// Recently seen tokens, so that a request costs no database round trip to authenticate.
    pub token_cache: Arc<crate::auth::TokenCache>,
}

impl AppState {
    /// Now, in milliseconds.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// One `Notify` per stream that has readers waiting.
#[derive(Default, Debug)]
pub struct StreamWaiters {
    map: Mutex<HashMap<String, Arc<Notify>>>,
}

impl StreamWaiters {
    /// The notifier of a stream (created on first use).
    pub fn get(&self, id: &str) -> Arc<Notify> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id.to_owned()).or_default().clone()
    }

    /// Wakes readers of `id` and forgets the notifier when nobody else holds it.
    pub fn wake(&self, id: &str) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(id) {
            n.notify_waiters();
            if Arc::strong_count(n) == 1 {
                map.remove(id);
            }
        }
    }
}

//! Readers long-polling a stream on this replica, woken when it is appended to here; readers
//! on other replicas notice an append by polling the database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One `Notify` per stream that has readers waiting.
#[derive(Default, Debug)]
pub struct StreamWaiters {
    map: Mutex<HashMap<String, Arc<Notify>>>,
}

impl StreamWaiters {
    /// The notifier of a stream, registered until the returned guard is dropped.
    pub fn get(self: &Arc<Self>, id: &str) -> Waiter {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let notify = map.entry(id.to_owned()).or_default().clone();
        Waiter { waiters: self.clone(), id: id.to_owned(), notify }
    }

    /// Wakes readers of `id`.
    pub fn wake(&self, id: &str) {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(id) {
            n.notify_waiters();
        }
    }

    /// Whether a reader of `id` is registered (tests wait on this, not on time).
    pub fn is_waiting(&self, id: &str) -> bool {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id)
    }

    /// How many readers of `id` wait now (tests wait on this, not on time).
    pub fn waiting(&self, id: &str) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).map_or(0, |n| Arc::strong_count(n) - 1)
    }

    /// Streams with readers waiting (for tests: the map must not grow without bound).
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no reader waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A reader's registration; the last one of a stream to go removes the stream's notifier.
#[derive(Debug)]
pub struct Waiter {
    waiters: Arc<StreamWaiters>,
    id: String,
    notify: Arc<Notify>,
}

impl std::ops::Deref for Waiter {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().unwrap_or_else(|e| e.into_inner());
        // Held by the map and by this guard only: nobody else waits.
        if map.get(&self.id).is_some_and(|n| Arc::ptr_eq(n, &self.notify) && Arc::strong_count(n) == 2) {
            map.remove(&self.id);
        }
    }
}

//! Time as the server sees it. Injected so that tests move time forward instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> Millis;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        d.as_millis() as Millis
    }
}

/// The wall clock plus an offset that tests advance, so TTLs expire without waiting.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    offset_ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// Moves time forward by `secs` seconds.
    pub fn advance_secs(&self, secs: i64) {
        self.advance_ms(secs * 1000);
    }

    /// Moves time forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        SystemClock.now_ms() + self.offset_ms.load(Ordering::SeqCst)
    }
}

/// Formats milliseconds since the epoch as RFC 3339 (UTC, whole seconds).
pub fn rfc3339(ms: Millis) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

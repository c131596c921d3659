//! Shared pieces of the benchmarks: latency statistics.

use std::time::Duration;

/// Summary of a run: requests, bytes and latency percentiles.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Requests completed.
    pub requests: usize,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Sorted latencies.
    pub latencies: Vec<Duration>,
}

impl Stats {
    /// Builds stats from raw latencies.
    pub fn new(mut latencies: Vec<Duration>, bytes: u64, elapsed: Duration) -> Self {
        latencies.sort();
        Self { requests: latencies.len(), bytes, elapsed, latencies }
    }

    /// Latency at percentile `p` (0–100).
    pub fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p / 100.0).round() as usize;
        self.latencies[i]
    }

    /// One JSON line.
    pub fn json(&self, label: &str) -> serde_json::Value {
        let secs = self.elapsed.as_secs_f64();
        serde_json::json!({
            "label": label,
            "secs": (secs * 1000.0).round() / 1000.0,
            "requests": self.requests,
            "req_per_s": (self.requests as f64 / secs).round(),
            "mib_per_s": ((self.bytes as f64 / secs / 1048576.0) * 10.0).round() / 10.0,
            "p50_ms": (self.pct(50.0).as_secs_f64() * 1e5).round() / 100.0,
            "p50_us": (self.pct(50.0).as_secs_f64() * 1e7).round() / 10.0,
            "p99_ms": (self.pct(99.0).as_secs_f64() * 1e5).round() / 100.0,
            "max_ms": (self.pct(100.0).as_secs_f64() * 1e5).round() / 100.0,
        })
    }
}

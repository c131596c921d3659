//! `spillway-redact-scan FILE…`: the built-in secret detector (the one the server and the
//! client use) over files that hold no secrets, for its false alarms: the marks it would make
//! per MiB, by kind, with where each was and how it began (8 bytes), and the detector's speed.
//! Prints one JSON line.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spillway_api::redact::Detector;

fn main() -> anyhow::Result<()> {
    let detector = Detector::builtin();
    let (mut bytes, mut spent) = (0u64, Duration::ZERO);
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = Vec::new();
    for path in std::env::args().skip(1) {
        let data = std::fs::read(&path)?;
        let t0 = Instant::now();
        let spans = detector.find(&data);
        spent += t0.elapsed();
        bytes += data.len() as u64;
        for s in spans {
            *by_kind.entry(s.kind.to_string()).or_default() += 1;
            if seen.len() < 50 {
                let head = String::from_utf8_lossy(&data[s.start..s.end.min(s.start + 8)]).into_owned();
                seen.push(serde_json::json!({"file": path, "kind": &*s.kind, "len": s.end - s.start, "starts": head}));
            }
        }
    }
    let mib = bytes as f64 / (1 << 20) as f64;
    let marks: u64 = by_kind.values().sum();
    println!(
        "{}",
        serde_json::json!({
            "measure": "redact_false_alarms",
            "bytes": bytes,
            "marks": marks,
            "marks_per_mib": marks as f64 / mib.max(f64::MIN_POSITIVE),
            "by_kind": by_kind,
            "detector_mb_s": bytes as f64 / 1e6 / spent.as_secs_f64().max(1e-9),
            "first_marks": seen,
        })
    );
    Ok(())
}

//! The per-turn gate (rule 7): when one turn's new tool results add up to more than the
//! budget, the largest are degraded to a short head and tail around "omitted N bytes, full content
//! at …", which names the read command.
//! A receipt's existing location is reused; other content is saved now under its content name.
//! All saves of a turn run concurrently under one deadline; the gate never fails the turn.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use spillway_api::paging::utf8_cut;
use spillway_api::{Receipt, ShownRange};

use crate::spill::{Deadline, Location, SpillTarget, DEFAULT_SAVE_DEADLINE};
use crate::truncate::Redaction;

/// Default budget of one turn's new results, in bytes.
pub const DEFAULT_BUDGET: usize = 200_000;
/// Default head kept of a degraded result.
pub const DEFAULT_KEEP: usize = 2_000;

/// One tool result of a turn: plain text, or a receipt a tool already made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TurnResult {
    /// Text as the tool returned it.
    Text(String),
    /// A receipt.
    Receipt(Receipt),
}

/// Parses one turn's results: a JSON array whose items are strings or receipts. The error
/// names the item that is neither, in plain words.
pub fn parse_turn(input: &str) -> crate::Result<Vec<TurnResult>> {
    let bad = |m: String| crate::ClientError::Other(format!("{m} (invalid_argument)"));
    let items: Vec<serde_json::Value> = serde_json::from_str(input)
        .map_err(|e| bad(format!("stdin must be a JSON array of tool results (strings or receipts): {e}")))?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            serde_json::Value::String(s) => Ok(TurnResult::Text(s)),
            v @ serde_json::Value::Object(_) => serde_json::from_value::<Receipt>(v)
                .map(TurnResult::Receipt)
                .map_err(|e| bad(format!("item {i} is an object but not a receipt: {e}"))),
            other => Err(bad(format!("item {i} is neither a string nor a receipt: {other}"))),
        })
        .collect()
}

impl TurnResult {
    /// Bytes this result puts in the context.
    pub fn size(&self) -> usize {
        match self {
            Self::Text(t) => t.len(),
            Self::Receipt(r) => r.result.len(),
        }
    }
}

/// The gate's settings.
#[derive(Debug, Clone)]
pub struct Gate {
    /// Budget of a turn.
    pub budget: usize,
    /// Head kept of a degraded result.
    pub keep: usize,
    /// One deadline for all of a turn's saves.
    pub deadline: Duration,
    /// Where content without a location is saved.
    pub spill: Arc<dyn SpillTarget>,
    /// Whether what the model is shown has its secrets replaced by marks (the saved content is
    /// always exact): text results, and the heads of degraded ones.
    pub redaction: Redaction,
}

impl Gate {
    /// Defaults: 200,000 bytes, 2,000 kept, 3 s.
    pub fn new(spill: Arc<dyn SpillTarget>) -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            keep: DEFAULT_KEEP,
            deadline: DEFAULT_SAVE_DEADLINE,
            spill,
            redaction: Redaction::On,
        }
    }

    /// Which results to degrade: the largest first, until the rest fit the budget.
    pub fn plan(&self, results: &[TurnResult]) -> Vec<usize> {
        let mut total: usize = results.iter().map(TurnResult::size).sum();
        let mut order: Vec<usize> = (0..results.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(results[i].size()));
        let mut out = Vec::new();
        for i in order {
            if total <= self.budget {
                break;
            }
            let size = results[i].size();
            if size <= self.keep + 200 {
                break; // degrading would not make it smaller
            }
            total -= size - self.keep.min(size);
            out.push(i);
        }
        out
    }

    /// Applies the gate to one turn. Results that fit stay exactly as given.
    pub async fn apply(&self, mut results: Vec<TurnResult>) -> Vec<TurnResult> {
        let chosen = self.plan(&results);
        if let Some(detector) = self.redaction.detector() {
            for (i, r) in results.iter_mut().enumerate() {
                if let (TurnResult::Text(t), false) = (&*r, chosen.contains(&i)) {
                    let (marked, n) = spillway_api::redact::apply(t.as_bytes(), &detector.find(t.as_bytes()));
                    if n > 0 {
                        *r = TurnResult::Text(String::from_utf8_lossy(&marked).into_owned());
                    }
                }
            }
        }
        if chosen.is_empty() {
            return results;
        }
        let shared_deadline = tokio::time::Instant::now() + self.deadline;
        let saves = chosen.iter().map(|&i| {
            let item = results[i].clone();
            let spill = self.spill.clone();
            async move {
                let existing = match &item {
                    TurnResult::Receipt(r) => existing_location(r),
                    TurnResult::Text(_) => None,
                };
                if let Some(loc) = existing {
                    return Some(loc);
                }
                let content = match &item {
                    TurnResult::Text(t) => t.clone(),
                    TurnResult::Receipt(r) => r.result.clone(),
                };
                let labels = vec![("tool".to_owned(), "gate".to_owned())];
                let budget = shared_deadline.saturating_duration_since(tokio::time::Instant::now());
                let mut deadline = Deadline::new(budget);
                let fut = spill.save(Bytes::from(content), &labels, &mut deadline);
                match tokio::time::timeout(budget, fut).await {
                    Ok(Ok(loc)) => Some(loc),
                    _ => None,
                }
            }
        });
        let locations = futures::future::join_all(saves).await;
        for (&i, loc) in chosen.iter().zip(locations) {
            results[i] = TurnResult::Receipt(self.degrade(&results[i], loc));
        }
        results
    }

    fn degrade(&self, item: &TurnResult, loc: Option<Location>) -> Receipt {
        let (text, total_size, total_lines) = match item {
            TurnResult::Text(t) => (t.as_str(), t.len() as u64, spillway_api::count_lines(t.as_bytes())),
            TurnResult::Receipt(r) => (r.result.as_str(), r.total_size.max(r.result.len() as u64), r.total_lines),
        };
        // Head and tail, about half the keep each: a failing build's last error stays in view.
        let (head, cut, head_marks) = self.head_of(text, self.keep / 2);
        let (tail, from, tail_marks) = self.tail_of(text, self.keep - self.keep / 2, cut);
        let tail_len = (text.len() - from) as u64;
        let omitted = total_size - cut as u64 - tail_len;
        let (digest, file_path) = match &loc {
            Some(Location::Store { digest }) => (Some(digest.clone()), None),
            Some(Location::File { path, digest }) => (digest.clone(), Some(path.display().to_string())),
            None => (None, None),
        };
        let place = file_path.clone().or(digest.clone());
        let next_line = memchr::memchr_iter(b'\n', &text.as_bytes()[..cut]).count() + 1;
        let read = match (&loc, &digest) {
            (Some(Location::File { path, .. }), Some(d)) => {
                let dir = path.parent().map(|p| p.display().to_string()).unwrap_or_else(|| ".".into());
                format!("; read it with `spillway read --local {dir} {d} --line {next_line}` or the read tool")
            }
            (_, Some(d)) => format!("; read it with `spillway read {d} --line {next_line}` or the read tool"),
            _ => String::new(),
        };
        let marker = match &place {
            Some(p) => format!("[omitted {omitted} bytes, full content at {p}{read}]"),
            None => format!("[omitted {omitted} bytes; the full content could not be saved and cannot be retrieved]"),
        };
        let sep = if head.is_empty() || head.ends_with('\n') { "" } else { "\n" };
        let hint = match &place {
            Some(p) => format!(
                "This turn's tool results were over {} bytes, so this one was cut to its first {cut} and last \
                 {tail_len} bytes. The full content ({total_size} bytes) is at {p}; read it page by page instead \
                 of all at once.",
                self.budget
            ),
            None => {
                "The full content was NOT saved and cannot be retrieved; narrow the command and run it again.".into()
            }
        };
        let mut shown = vec![ShownRange { offset: 0, length: cut as u64 }];
        if tail_len > 0 {
            shown.push(ShownRange { offset: total_size - tail_len, length: tail_len });
        }
        Receipt {
            result: format!("{head}{sep}{marker}\n{tail}"),
            truncated: true,
            total_size,
            total_lines,
            shown,
            saved: place.is_some(),
            digest,
            file_path,
            hint: Some(hint),
            save_error: None,
            redactions: head_marks.zip(tail_marks).map(|(a, b)| a + b),
        }
    }

    /// The head a degraded result keeps, at most `keep` bytes as shown (with its secrets
    /// marked, when redaction is on), ending at a line's end when one is in its second half, and
    /// how many bytes of the text it covers.
    fn head_of(&self, text: &str, keep: usize) -> (String, usize, Option<u64>) {
        let mut want = keep;
        loop {
            let mut cut = utf8_cut(&text.as_bytes()[..want.min(text.len())]);
            if let Some(nl) = memchr::memrchr(b'\n', &text.as_bytes()[..cut]).filter(|&nl| nl + 1 >= cut / 2) {
                cut = nl + 1;
            }
            let Some(detector) = self.redaction.detector() else {
                return (text[..cut].to_owned(), cut, None);
            };
            let red = detector.redact_range(text.as_bytes(), 0, cut);
            if red.text.len() <= keep || cut == 0 {
                return (String::from_utf8_lossy(&red.text).into_owned(), cut, Some(red.marks() as u64));
            }
            want = cut - (red.text.len() - keep).min(cut);
        }
    }

    /// The tail a degraded result keeps: at most `keep` bytes as shown, from no earlier than
    /// `after`, starting at a line's start when one is in its first half; and where it starts.
    fn tail_of(&self, text: &str, keep: usize, after: usize) -> (String, usize, Option<u64>) {
        let bytes = text.as_bytes();
        let mut want = keep;
        loop {
            let mut from = bytes.len().saturating_sub(want).max(after);
            while !text.is_char_boundary(from) {
                from += 1;
            }
            if from > 0 && bytes[from - 1] != b'\n' {
                let window = &bytes[from..];
                if let Some(nl) = memchr::memchr(b'\n', window).filter(|&nl| nl < window.len() / 2) {
                    from += nl + 1;
                }
            }
            let Some(detector) = self.redaction.detector() else {
                return (text[from..].to_owned(), from, None);
            };
            let red = detector.redact_range(bytes, from, bytes.len());
            if red.text.len() <= keep || from == bytes.len() {
                return (String::from_utf8_lossy(&red.text).into_owned(), from, Some(red.marks() as u64));
            }
            want = (bytes.len() - from).saturating_sub(red.text.len() - keep);
        }
    }
}

fn existing_location(r: &Receipt) -> Option<Location> {
    if !r.saved {
        return None;
    }
    if let Some(p) = &r.file_path {
        return Some(Location::File { path: p.into(), digest: r.digest.clone() });
    }
    r.digest.as_ref().map(|d| Location::Store { digest: d.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spill::LocalDir;

    fn gate(dir: &std::path::Path) -> Gate {
        Gate {
            budget: 1_000,
            keep: 100,
            deadline: Duration::from_secs(3),
            spill: Arc::new(LocalDir::new(dir)),
            redaction: Redaction::On,
        }
    }

    fn text(n: usize, c: char) -> TurnResult {
        TurnResult::Text(c.to_string().repeat(n))
    }

    #[test]
    fn plan_degrades_the_largest_until_the_rest_fits() {
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path());
        assert!(g.plan(&[text(500, 'a'), text(500, 'b')]).is_empty(), "exactly the budget fits");
        assert_eq!(g.plan(&[text(500, 'a'), text(501, 'b')]), [1]);
        // 2000 + 900 + 400: degrading the largest leaves 100 + 900 + 400 = 1400, then the next.
        assert_eq!(g.plan(&[text(400, 'a'), text(2000, 'b'), text(900, 'c')]), [1, 2]);
        // Results not much larger than what would be kept are never degraded.
        assert!(g.plan(&vec![text(300, 'a'); 5]).is_empty());
        assert_eq!(g.plan(&[text(301, 'a'), text(1000, 'b')]), [1]);
    }

    #[tokio::test]
    async fn degraded_results_keep_a_head_and_say_where_the_rest_is() {
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path());
        let big = "line\n".repeat(400); // 2,000 bytes
        let out = g.apply(vec![TurnResult::Text("small".into()), TurnResult::Text(big.clone())]).await;
        assert_eq!(out[0], TurnResult::Text("small".into()), "results that fit stay as given");
        let TurnResult::Receipt(r) = &out[1] else { panic!("{:?}", out[1]) };
        let path = r.file_path.clone().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), big, "the full content is saved");
        let d = r.digest.clone().unwrap();
        let dir = dir.path().display();
        let marker = format!(
            "[omitted 1900 bytes, full content at {path}; read it with `spillway read --local {dir} {d} --line 11` or \
             the read tool]"
        );
        assert_eq!(r.result, format!("{}{marker}\n{}", &big[..50], &big[1950..]), "head and tail, whole lines");
        assert_eq!((r.total_size, r.total_lines, r.truncated, r.saved), (2000, 400, true, true));
        assert_eq!(r.shown, [ShownRange { offset: 0, length: 50 }, ShownRange { offset: 1950, length: 50 }]);
        assert!(r.digest.as_deref().is_some_and(|d| d.starts_with("blake3:")));
        let hint = r.hint.as_deref().unwrap();
        assert!(
            hint.contains("over 1000 bytes") && hint.contains("first 50 and last 50 bytes") && hint.contains(&path),
            "{hint}"
        );
        // The tail is where a failing build says why.
        let log = format!("{}error[E0308]: mismatched types\n", "compiling …\n".repeat(300));
        let out = g.apply(vec![TurnResult::Text(log)]).await;
        let TurnResult::Receipt(r) = &out[0] else { panic!() };
        assert!(r.result.ends_with("error[E0308]: mismatched types\n"), "{}", r.result);
        // A multi-byte character at the cut is not split.
        let wide = "€".repeat(700);
        let out = g.apply(vec![TurnResult::Text(wide)]).await;
        let TurnResult::Receipt(r) = &out[0] else { panic!() };
        assert_eq!((r.shown[0].length, r.shown[1].length), (48, 48));
        assert!(r.result.starts_with(&"€".repeat(16)) && r.result.ends_with(&"€".repeat(16)));
    }

    #[tokio::test]
    async fn a_receipt_keeps_its_location_and_its_totals() {
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path());
        let earlier = Receipt {
            result: "x".repeat(1_500),
            truncated: true,
            total_size: 9_000_000,
            total_lines: 12,
            shown: vec![],
            saved: true,
            digest: Some("blake3:abc".into()),
            file_path: None,
            hint: None,
            save_error: None,
            redactions: None,
        };
        let out = g.apply(vec![TurnResult::Receipt(earlier)]).await;
        let TurnResult::Receipt(r) = &out[0] else { panic!() };
        assert_eq!((r.digest.as_deref(), r.file_path.as_deref()), (Some("blake3:abc"), None));
        assert_eq!((r.total_size, r.total_lines), (9_000_000, 12));
        assert!(
            r.result
                .contains("[omitted 8999900 bytes, full content at blake3:abc; read it with `spillway read blake3:abc"),
            "{}",
            r.result
        );
        assert_eq!(std::fs::read_dir(dir.path()).map(|d| d.count()).unwrap_or(0), 0, "nothing saved again");
    }

    #[tokio::test]
    async fn a_failed_save_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, b"not a directory").unwrap();
        let g = Gate { spill: Arc::new(LocalDir::new(blocked.join("sub"))), ..gate(dir.path()) };
        let out = g.apply(vec![text(5_000, 'z')]).await;
        let TurnResult::Receipt(r) = &out[0] else { panic!() };
        assert!(!r.saved && r.digest.is_none() && r.file_path.is_none());
        assert!(r.result.contains("could not be saved and cannot be retrieved]\nzzz"), "{}", r.result);
        assert!(r.hint.as_deref().unwrap().contains("NOT saved"));
    }

    /// A target whose saves take `delay` on the test's paused clock, and keep nothing.
    #[derive(Debug)]
    struct Slow(Duration);

    struct Discard;

    #[async_trait::async_trait]
    impl crate::spill::SpillWriter for Discard {
        async fn write(&mut self, _: Bytes, _: &mut Deadline) -> crate::Result<()> {
            Ok(())
        }
        async fn finish(self: Box<Self>, _: &mut Deadline) -> crate::Result<Location> {
            Ok(Location::Store { digest: "blake3:slow".into() })
        }
    }

    #[async_trait::async_trait]
    impl SpillTarget for Slow {
        async fn begin(&self, _: &[(String, String)]) -> crate::Result<Box<dyn crate::spill::SpillWriter>> {
            tokio::time::sleep(self.0).await;
            Ok(Box::new(Discard))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn saves_have_the_turn_deadline_from_when_the_turn_is_gated() {
        let dir = tempfile::tempdir().unwrap();
        for (delay, saved) in [(Duration::from_secs(2), true), (Duration::from_secs(4), false)] {
            let g = Gate { spill: Arc::new(Slow(delay)), ..gate(dir.path()) };
            let out = g.apply(vec![text(5_000, 'z')]).await;
            let TurnResult::Receipt(r) = &out[0] else { panic!() };
            assert_eq!(r.saved, saved, "a save of {delay:?} against the 3 s deadline");
        }
    }

    #[test]
    fn turns_parse_strings_and_receipts_and_name_the_bad_item() {
        let t = parse_turn(r#"["a", {"result": "b", "truncated": false, "total_size": 1, "total_lines": 1, "shown": [], "saved": true}]"#)
            .unwrap();
        assert_eq!(t[0], TurnResult::Text("a".into()));
        assert!(matches!(&t[1], TurnResult::Receipt(r) if r.result == "b"));
        assert_eq!(t.iter().map(TurnResult::size).collect::<Vec<_>>(), [1, 1]);
        let err = parse_turn(r#"["a", 3]"#).unwrap_err().to_string();
        assert!(err.contains("item 1 is neither"), "{err}");
        let err = parse_turn(r#"[{"x": 1}]"#).unwrap_err().to_string();
        assert!(err.contains("item 0 is an object but not a receipt"), "{err}");
        assert!(parse_turn("{").unwrap_err().to_string().contains("JSON array"));
    }
}

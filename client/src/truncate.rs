//! Truncation strategies: pure code, bytes in and a preview out, no I/O.
//!
//! Each tool picks its own cap and its own way to cut (rule 1): command output keeps its head
//! *and* its tail, a file reader keeps whole numbered lines and says where to continue, a
//! send-style tool refuses instead of sending half. A preview never splits a UTF-8 character
//! and `shown` says exactly which byte ranges of the original it holds.

use std::sync::Arc;

use spillway_api::paging::utf8_cut;
use spillway_api::redact::{Detector, Redacted, MAX_SECRET};
use spillway_api::ShownRange;

/// The default cap: what a tool hands the model, in bytes.
pub const DEFAULT_CAP: usize = 100_000;

/// How a tool cuts an over-long output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// The beginning only.
    Head,
    /// The end only.
    Tail,
    /// The beginning and the end with one marker line between; `tail_share` of the budget
    /// (0.0–0.9) goes to the end. The default for command output, whose errors come last.
    HeadTail {
        /// Share of the budget kept for the end.
        tail_share: f32,
    },
    /// Whole lines numbered from `first_line`, then where to continue (file readers).
    NumberedLines {
        /// Number of the first line given.
        first_line: u64,
    },
    /// Refuse: an over-long output is an error, never half of it (send-style tools).
    Reject,
}

impl Default for Strategy {
    fn default() -> Self {
        Self::HeadTail { tail_share: 0.2 }
    }
}

/// What the model sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// At most the cap, valid UTF-8.
    pub text: String,
    /// Byte ranges of the original that `text` holds.
    pub shown: Vec<ShownRange>,
    /// False when `text` is the whole output.
    pub truncated: bool,
    /// For a file reader: the first line not shown.
    pub next_line: Option<u64>,
    /// Secrets replaced by marks in `text`; `None` when redaction was off.
    pub redactions: Option<u64>,
}

/// Whether a preview shows secrets (api.md v1.2, Redaction): on by default, since what a tool
/// shows goes to a model. What is spilled is always the exact output.
#[derive(Debug, Clone, Default)]
pub enum Redaction {
    /// Secrets replaced by `[REDACTED:kind]`, with the built-in kinds.
    #[default]
    On,
    /// The same, with an operator's own kinds too (`--redact-rules`).
    Rules(Arc<Detector>),
    /// The output as it is (`--no-redact`, `redact=False`).
    Off,
}

impl Redaction {
    /// On unless `off`.
    pub fn unless(off: bool) -> Self {
        if off {
            Self::Off
        } else {
            Self::On
        }
    }

    /// The detector in force, or `None` when off.
    pub fn detector(&self) -> Option<&Detector> {
        match self {
            Self::On => Some(Detector::builtin()),
            Self::Rules(d) => Some(d),
            Self::Off => None,
        }
    }
}

/// A send-style tool's output was over its cap and was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused: the text is {size} bytes and the limit is {cap}; shorten it and try again (nothing was sent)")]
pub struct Rejected {
    /// Size of the refused text.
    pub size: u64,
    /// Most bytes of the preview the model sees.
    pub cap: usize,
}

/// What streaming capture keeps of an output: its first bytes, its last bytes, and counts.
/// `head` holds bytes `0..head.len()`, `tail` holds `tail_offset..total`; when the whole output
/// fits, `head` holds all of it.
#[derive(Debug, Clone, Default)]
pub struct Sample<'a> {
    /// The first bytes.
    pub head: &'a [u8],
    /// The last bytes.
    pub tail: &'a [u8],
    /// Where `tail` starts in the original.
    pub tail_offset: u64,
    /// Size of the original.
    pub total: u64,
    /// Lines of the original.
    pub total_lines: u64,
}

impl<'a> Sample<'a> {
    /// A sample of an output held whole in memory.
    pub fn whole(data: &'a [u8]) -> Self {
        Self {
            head: data,
            tail: &[],
            tail_offset: data.len() as u64,
            total: data.len() as u64,
            total_lines: spillway_api::count_lines(data),
        }
    }

    fn is_whole(&self) -> bool {
        self.head.len() as u64 == self.total
    }
}

/// Text of `bytes`, replacing invalid UTF-8, cut again so that it stays within `max` bytes.
fn text_within(bytes: &[u8], max: usize) -> (String, usize) {
    let mut used = bytes.len().min(max);
    loop {
        used = utf8_cut(&bytes[..used]);
        let text = String::from_utf8_lossy(&bytes[..used]);
        if text.len() <= max {
            return (text.into_owned(), used);
        }
        // Each raw byte makes at most three bytes of text (U+FFFD): drop a third of the excess.
        // (cargo-mutants: dividing instead of subtracting here still ends at the same cut, by
        // smaller steps — an equivalent mutant.)
        used -= (text.len() - max).div_ceil(3).min(used);
    }
}

/// Where the character around `at` ends, when `at` falls inside a valid multi-byte character;
/// `at` otherwise. Invalid bytes are not skipped: each is shown as U+FFFD.
fn past_split_char(bytes: &[u8], at: usize) -> usize {
    let at = at.min(bytes.len());
    (at.saturating_sub(3)..at)
        .rev()
        .find(|&i| bytes[i] & 0xC0 != 0x80)
        .and_then(|i| bytes[i..].utf8_chunks().next()?.valid().chars().next().map(|c| i + c.len_utf8()))
        // `>=` would do as well: a character that ends exactly at `at` gives `at` either way.
        .filter(|&end| end > at)
        .unwrap_or(at)
}

/// Text of a suffix of `bytes` that stays within `max` bytes after replacing invalid UTF-8,
/// and how many leading bytes it leaves out (replacement can make binary text grow threefold).
fn suffix_text_within(bytes: &[u8], max: usize) -> (String, usize) {
    let mut start = 0;
    loop {
        let text = String::from_utf8_lossy(&bytes[start..]);
        if text.len() <= max {
            return (text.into_owned(), start);
        }
        // (As in `text_within`, dividing instead of subtracting only takes smaller steps.)
        start = past_split_char(bytes, start + (text.len() - max).div_ceil(3).max(1));
    }
}

/// The longest prefix of `data` within `budget` bytes, ending at a newline when one is near.
fn head_cut(data: &[u8], budget: usize) -> usize {
    let n = utf8_cut(&data[..budget.min(data.len())]);
    match memchr::memrchr(b'\n', &data[..n]) {
        Some(i) if n - (i + 1) <= 4096 && i + 1 >= n / 2 => i + 1,
        _ => n,
    }
}

/// Where to start a suffix of `data` of at most `budget` bytes, after a newline when one is near.
fn tail_cut(data: &[u8], budget: usize) -> usize {
    let start = past_split_char(data, data.len().saturating_sub(budget));
    match memchr::memchr(b'\n', &data[start..]) {
        Some(i) if i < 4096 && start + i + 1 < data.len() => start + i + 1,
        _ => start,
    }
}

/// `1234567` → `"1,234,567"`, for messages people read.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn marker(bytes: u64, lines: u64) -> String {
    format!("\n[... {} bytes ({} lines) omitted ...]\n", thousands(bytes), thousands(lines))
}

/// Cuts a sample with a strategy under `cap` bytes, secrets replaced by marks.
pub fn preview(sample: &Sample<'_>, cap: usize, strategy: Strategy) -> Result<Preview, Rejected> {
    preview_with(sample, cap, strategy, &Redaction::On)
}

/// An output up to this many times the cap is shown whole when its marked text fits.
const WHOLE_IF_MARKED: usize = 4;

/// Cuts a sample with a strategy under `cap` bytes, showing secrets as `redaction` says. The
/// cap counts the text as shown: marks longer than their secrets make the cut shorter.
pub fn preview_with(
    sample: &Sample<'_>,
    cap: usize,
    strategy: Strategy,
    redaction: &Redaction,
) -> Result<Preview, Rejected> {
    let Some(detector) = redaction.detector() else {
        return cut(sample, cap, strategy);
    };
    // The whole output, marked, may fit where the raw one does not (a mark is shorter than a
    // PEM block) — but not when it is many times the cap: its secrets would have to be most of
    // it. Past that only the parts the strategy shows are scanned, not megabytes.
    let may_fit = sample.head.len() <= cap.saturating_mul(WHOLE_IF_MARKED);
    if sample.is_whole() && may_fit && !matches!(strategy, Strategy::NumberedLines { .. }) {
        let red = detector.redact_range(sample.head, 0, sample.head.len());
        let text = String::from_utf8_lossy(&red.text);
        if text.len() <= cap {
            let shown = vec![ShownRange { offset: 0, length: sample.total }];
            let redactions = Some(red.marks() as u64);
            return Ok(Preview { text: text.into_owned(), shown, truncated: false, next_line: None, redactions });
        }
    }
    match strategy {
        Strategy::Reject => Err(Rejected { size: sample.total, cap }),
        Strategy::NumberedLines { first_line } => {
            // Lines are numbered in the redacted text (marks keep the lines they replace); what
            // it shows is mapped back to the original's bytes.
            let red = detector.redact_range(sample.head, 0, sample.head.len());
            let mut p = numbered(&red.text, cap, first_line);
            let shown_out = p.shown[0].length as usize;
            p.shown[0].length = red.raw_at(shown_out) as u64;
            p.redactions = Some(red.marks_before(shown_out) as u64);
            Ok(p)
        }
        Strategy::Head => Ok(head_tail_redacted(sample, cap, 0.0, detector)),
        Strategy::Tail => Ok(head_tail_redacted(sample, cap, 1.0, detector)),
        Strategy::HeadTail { tail_share } => Ok(head_tail_redacted(sample, cap, tail_share.clamp(0.0, 0.9), detector)),
    }
}

/// Cuts a sample with a strategy under `cap` bytes, secrets and all.
fn cut(sample: &Sample<'_>, cap: usize, strategy: Strategy) -> Result<Preview, Rejected> {
    // Replacing invalid UTF-8 never shortens text: only a sample within the cap can fit whole.
    if sample.is_whole() && sample.head.len() <= cap {
        // The whole output: its last bytes are its end, not a character cut in two.
        let text = String::from_utf8_lossy(sample.head).into_owned();
        if text.len() <= cap {
            if let Strategy::NumberedLines { first_line } = strategy {
                return Ok(numbered(sample.head, cap, first_line));
            }
            let shown = vec![ShownRange { offset: 0, length: sample.total }];
            return Ok(Preview { text, shown, truncated: false, next_line: None, redactions: None });
        }
    }
    match strategy {
        Strategy::Reject => Err(Rejected { size: sample.total, cap }),
        Strategy::NumberedLines { first_line } => Ok(numbered(sample.head, cap, first_line)),
        Strategy::Head => Ok(head_tail(sample, cap, 0.0).preview(sample)),
        Strategy::Tail => Ok(head_tail(sample, cap, 1.0).preview(sample)),
        Strategy::HeadTail { tail_share } => Ok(head_tail(sample, cap, tail_share.clamp(0.0, 0.9)).preview(sample)),
    }
}

/// Head and tail as [`head_tail`] cuts them, with their secrets marked: each part is redacted
/// with all the sample holds around it (a secret cut by a part's edge is found whole), and the
/// cut is made shorter until the marked text fits the cap.
fn head_tail_redacted(s: &Sample<'_>, cap: usize, tail_share: f32, detector: &Detector) -> Preview {
    let (tail_src, tail_src_offset) = s.tail_source();
    let mut budget = cap;
    loop {
        let parts = head_tail(s, budget, tail_share);
        // Each part is scanned with MAX_SECRET bytes beyond its cut (a secret the cut splits
        // is found whole), not the whole output.
        let head_scan = &s.head[..(parts.head_used + MAX_SECRET).min(s.head.len())];
        let head = detector.redact_range(head_scan, 0, parts.head_used);
        let tail = match parts.tail_len {
            0 => Redacted::plain(&[]),
            _ => {
                let from = (parts.tail_from - tail_src_offset) as usize;
                let lo = from.saturating_sub(MAX_SECRET);
                detector.redact_range(&tail_src[lo..], from - lo, tail_src.len() - lo)
            }
        };
        let mut text = String::from_utf8_lossy(&head.text).into_owned();
        text.push_str(&parts.marker);
        text.push_str(&String::from_utf8_lossy(&tail.text));
        if text.len() <= cap || budget == 0 {
            let redactions = Some((head.marks() + tail.marks()) as u64);
            return Preview { text, redactions, ..parts.preview(s) };
        }
        budget = budget.saturating_sub(text.len() - cap);
    }
}

/// Where head and tail of an over-long sample are cut, and the marker line between them.
struct HeadTail {
    head_text: String,
    head_used: usize,
    marker: String,
    tail_text: String,
    /// Where the tail starts in the original.
    tail_from: u64,
    tail_len: u64,
    head_lines: u64,
}

impl HeadTail {
    /// The preview these cuts make.
    fn preview(self, s: &Sample<'_>) -> Preview {
        let mut text = self.head_text;
        text.push_str(&self.marker);
        text.push_str(&self.tail_text);
        let mut shown = Vec::new();
        if self.head_used > 0 {
            shown.push(ShownRange { offset: 0, length: self.head_used as u64 });
        }
        if self.tail_len > 0 {
            shown.push(ShownRange { offset: s.total - self.tail_len, length: self.tail_len });
        }
        Preview { text, shown, truncated: true, next_line: Some(self.head_lines + 1), redactions: None }
    }
}

impl Sample<'_> {
    /// Where the tail is cut from: the tail ring, or the head buffer when it holds everything;
    /// and where that buffer starts in the original.
    fn tail_source(&self) -> (&[u8], u64) {
        if self.is_whole() {
            (self.head, 0)
        } else {
            (self.tail, self.tail_offset)
        }
    }
}

/// Head and tail of an over-long sample with one marker line saying what was left out.
fn head_tail(s: &Sample<'_>, cap: usize, tail_share: f32) -> HeadTail {
    // The marker's own size depends on the numbers it prints; reserve its longest form.
    let reserve = marker(u64::MAX / 10, u64::MAX / 10).len();
    let budget = cap.saturating_sub(reserve);
    let tail_budget = ((budget as f32) * tail_share) as usize;
    let head_budget = budget - tail_budget;
    let (tail_src, tail_src_offset) = s.tail_source();
    let t_start = tail_cut(tail_src, tail_budget.min(tail_src.len()));
    let tail_from = tail_src_offset + t_start as u64;
    let head_limit = head_budget.min(s.head.len()).min(tail_from as usize);
    let h = if tail_share >= 1.0 { 0 } else { head_cut(s.head, head_limit) };
    let (head_text, h_used) = text_within(&s.head[..h], head_budget);
    let tail_bytes = if tail_budget == 0 { &[][..] } else { &tail_src[t_start..] };
    let (tail_text, skipped) = suffix_text_within(tail_bytes, tail_budget);
    let tail_bytes = &tail_bytes[skipped..];
    let t_len = tail_bytes.len() as u64;
    let omitted = s.total - h_used as u64 - t_len;
    let head_lines = memchr::memchr_iter(b'\n', &s.head[..h_used]).count() as u64;
    let tail_lines = spillway_api::count_lines(tail_bytes);
    let omitted_lines = s.total_lines.saturating_sub(head_lines + tail_lines);
    HeadTail {
        head_text,
        head_used: h_used,
        marker: marker(omitted, omitted_lines),
        tail_text,
        tail_from: s.total - t_len,
        tail_len: t_len,
        head_lines,
    }
}

/// Whole lines numbered like `cat -n`, as many as fit, then where to continue.
fn numbered(data: &[u8], cap: usize, first_line: u64) -> Preview {
    let mut text = String::new();
    let mut used = 0usize;
    let mut line_no = first_line;
    let footer_reserve = 80;
    let mut truncated = false;
    for line in data.split_inclusive(|&b| b == b'\n') {
        let body = String::from_utf8_lossy(line);
        let entry = format!("{line_no:>6}\t{body}");
        if text.len() + entry.len() + footer_reserve > cap {
            truncated = true;
            break;
        }
        text.push_str(&entry);
        used += line.len();
        line_no += 1;
    }
    if truncated && used == 0 {
        // A first line longer than the cap: show its start; the rest is reachable by bytes.
        let (part, n) = text_within(data, cap - footer_reserve - 8);
        text = format!("{line_no:>6}\t{part}");
        used = n;
        line_no += 1;
    }
    if truncated {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[truncated: {} more bytes; continue from line {line_no}]\n", data.len() - used));
    }
    Preview {
        text,
        shown: vec![ShownRange { offset: 0, length: used as u64 }],
        truncated,
        next_line: truncated.then_some(line_no),
        redactions: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{
        any, prop_assert, prop_assert_eq, prop_oneof, proptest, Just, ProptestConfig, TestCaseError,
    };
    use proptest::strategy::Strategy as _;

    fn data_strategy() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(prop_oneof![Just("\n".to_string()), "[a-z€😀 ]{0,30}"], 0..3000)
                .prop_map(|v| v.concat().into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..20_000),
        ]
    }

    fn lossy(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// The text of a numbered preview without its numbers and footer, checking the numbering.
    fn unnumbered(p: &Preview, first_line: u64) -> Result<String, TestCaseError> {
        let mut body = p.text.as_str();
        if p.truncated {
            let footer = body[..body.len() - 1].rfind('\n').map_or(0, |i| i + 1);
            prop_assert!(body[footer..].starts_with("[truncated: "), "footer: {:?}", &body[footer..]);
            let end = format!("continue from line {}]\n", p.next_line.unwrap());
            prop_assert!(body.ends_with(&end), "footer: {:?}", body);
            body = &body[..footer];
        }
        let mut out = String::new();
        for (k, line) in body.split_inclusive('\n').enumerate() {
            let prefix = format!("{:>6}\t", first_line + k as u64);
            prop_assert!(line.starts_with(&prefix), "line {} is {:?}", k, line);
            out.push_str(&line[prefix.len()..]);
        }
        Ok(out)
    }

    /// What a preview must be, strategy by strategy: within the cap, and the text holds exactly
    /// the ranges `shown` names, in their places.
    fn check(data: &[u8], cap: usize, strategy: super::Strategy) -> Result<(), TestCaseError> {
        let p = match preview_with(&Sample::whole(data), cap, strategy, &Redaction::Off) {
            Err(r) => {
                prop_assert_eq!(strategy, super::Strategy::Reject);
                prop_assert!(r.size as usize > cap || lossy(data).len() > cap);
                return Ok(());
            }
            Ok(p) => p,
        };
        prop_assert!(p.text.len() <= cap, "{} > {}", p.text.len(), cap);
        let mut end = 0;
        for r in &p.shown {
            prop_assert!(r.offset >= end && r.length > 0 || p.shown.len() == 1);
            end = r.offset + r.length;
            prop_assert!(end as usize <= data.len());
        }
        let piece = |i: usize| &data[p.shown[i].offset as usize..(p.shown[i].offset + p.shown[i].length) as usize];
        if let super::Strategy::NumberedLines { first_line } = strategy {
            prop_assert_eq!(p.shown.len(), 1);
            prop_assert_eq!(p.shown[0].offset, 0);
            let mut held = lossy(piece(0));
            if p.truncated && !held.ends_with('\n') {
                held.push('\n'); // a first line over the cap is shown in part, then the footer
            }
            prop_assert_eq!(unnumbered(&p, first_line)?, held);
            prop_assert_eq!(p.truncated, p.shown[0].length < data.len() as u64);
            return Ok(());
        }
        if !p.truncated {
            prop_assert_eq!(&p.text, &lossy(data));
            prop_assert_eq!(p.shown.iter().map(|r| r.length).sum::<u64>(), data.len() as u64);
            return Ok(());
        }
        // Head, marker, tail: the head is a prefix of the original, the tail a suffix.
        let marker_at = p.text.find("\n[... ").expect("a marker line");
        let marker_end = marker_at + p.text[marker_at + 1..].find('\n').unwrap() + 2;
        let (head, tail) = (&p.text[..marker_at], &p.text[marker_end..]);
        let mut ranges = p.shown.iter().enumerate();
        let head_range = p.shown.first().filter(|r| r.offset == 0).map(|_| ranges.next().unwrap().0);
        prop_assert_eq!(head, head_range.map_or(String::new(), |i| lossy(piece(i))));
        let tail_range = ranges.next().map(|(i, _)| i);
        if let Some(i) = tail_range {
            prop_assert_eq!(p.shown[i].offset + p.shown[i].length, data.len() as u64, "the tail ends the output");
        }
        prop_assert_eq!(tail, tail_range.map_or(String::new(), |i| lossy(piece(i))));
        let omitted = data.len() as u64 - p.shown.iter().map(|r| r.length).sum::<u64>();
        let says = format!("[... {} bytes", thousands(omitted));
        prop_assert!(p.text[marker_at..marker_end].contains(&says), "{:?}", &p.text[marker_at..marker_end]);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(128)))]
        #[test]
        fn caps_hold_and_shown_matches(data in data_strategy(), cap in 200usize..5000) {
            for s in [super::Strategy::Head, super::Strategy::Tail, super::Strategy::default(),
                      super::Strategy::NumberedLines { first_line: 1 },
                      super::Strategy::NumberedLines { first_line: 41 }, super::Strategy::Reject] {
                check(&data, cap, s)?;
            }
        }
    }

    #[test]
    fn head_tail_keeps_the_error_at_the_end() {
        let mut out: String = (1..=100_000).map(|i| format!("compiling unit {i}\n")).collect();
        out.push_str("error[E0308]: mismatched types\n");
        let p = preview(&Sample::whole(out.as_bytes()), 100_000, super::Strategy::default()).unwrap();
        assert!(p.text.starts_with("compiling unit 1\n"));
        assert!(p.text.ends_with("error[E0308]: mismatched types\n"));
        assert!(p.text.contains("bytes (") && p.text.contains("lines) omitted"));
        assert_eq!(p.shown.len(), 2);
        assert!(p.text.len() <= 100_000);
    }

    #[test]
    fn numbered_lines_say_where_to_continue() {
        let text: String = (1..=50_000).map(|i| format!("row {i}\n")).collect();
        let p =
            preview(&Sample::whole(text.as_bytes()), 10_000, super::Strategy::NumberedLines { first_line: 1 }).unwrap();
        let n = p.next_line.unwrap();
        assert!(p.text.starts_with("     1\trow 1\n"));
        assert!(p.text.contains(&format!("continue from line {n}")));
        assert!(p.text.contains(&format!("\trow {}\n", n - 1)));
        assert!(!p.text.contains(&format!("\trow {n}\n")));
    }

    #[test]
    fn a_whole_output_ending_in_an_invalid_byte_is_shown_whole() {
        let p = preview(&Sample::whole(&[b'a', 0xC0]), 200, super::Strategy::default()).unwrap();
        assert_eq!((p.text.as_str(), p.truncated), ("a\u{FFFD}", false));
        assert_eq!(p.shown, vec![ShownRange { offset: 0, length: 2 }]);
    }

    #[test]
    fn text_within_keeps_the_longest_prefix_that_fits() {
        // Every invalid byte becomes three: 300 bytes of room hold 100 of them.
        let (text, used) = text_within(&[0xFF; 1000], 300);
        assert_eq!((text.len(), used), (300, 100));
        let (text, used) = text_within("é".repeat(100).as_bytes(), 101);
        assert_eq!((text.len(), used), (100, 100), "never half a character");
    }

    #[test]
    fn heads_end_at_a_near_newline() {
        assert_eq!(head_cut(b"aaaa\nbbbb", 7), 5, "the newline is near: cut after it");
        let early = [&b"a\n"[..], &[b'b'; 100]].concat();
        assert_eq!(head_cut(&early, 100), 100, "a newline in the first half is not worth the loss");
        let far = [&[b'a'; 5000][..], b"\n", &[b'b'; 5000]].concat();
        assert_eq!(head_cut(&far, 9000), 5001, "3,999 bytes back: still near");
        assert_eq!(head_cut(&far, 9200), 9200, "4,199 bytes back: too far");
        assert_eq!(head_cut("€€€".as_bytes(), 4), 3, "never half a character");
        let half = [&[b'a'; 49][..], b"\n", &[b'b'; 50]].concat();
        assert_eq!(head_cut(&half, 100), 50, "a newline ending the first half still counts");
        let edge = [&[b'a'; 4999][..], b"\n", &[b'b'; 4096]].concat();
        assert_eq!(head_cut(&edge, edge.len()), 5000, "4,096 bytes back: still near");
        assert_eq!(head_cut(&edge, edge.len() + 1), 5000);
        let past = [&[b'a'; 4999][..], b"\n", &[b'b'; 4097]].concat();
        assert_eq!(head_cut(&past, past.len()), past.len(), "4,097 bytes back: too far");
        assert_eq!(head_cut(b"abc", 10), 3);
    }

    #[test]
    fn tails_start_after_a_near_newline() {
        assert_eq!(tail_cut(b"aaaa\nbbbb", 7), 5, "start after the newline");
        assert_eq!(tail_cut(b"aaaa\nbbbb", 3), 6, "no newline in the tail: where the budget says");
        assert_eq!(tail_cut(b"aaaa\n", 3), 2, "a newline that ends the data is not a start");
        let far = [&[b'a'; 10][..], &[b'b'; 5000], b"\n", b"end"].concat();
        assert_eq!(tail_cut(&far, 5004), 10, "the newline is 5,000 bytes in: too far");
        let edge = [&[b'x'; 100][..], &[b'b'; 4096], b"\n", b"end"].concat();
        assert_eq!(tail_cut(&edge, 4100), 100, "a newline 4,096 bytes in is too far");
        assert_eq!(tail_cut(&edge, 4099), 4197, "4,095 bytes in is near");
        assert_eq!(tail_cut("€€€".as_bytes(), 4), 6, "never half a character");
        assert_eq!(tail_cut(&[0x89, 0xAA, 0x82, 0xBC], 2), 2, "stray continuation bytes are not skipped");
    }

    #[test]
    fn suffixes_keep_the_longest_end_that_fits() {
        assert_eq!(suffix_text_within(&[0xFF; 100], 30), ("\u{FFFD}".repeat(10), 90));
        assert_eq!(suffix_text_within("€€€€".as_bytes(), 7), ("€€".into(), 6));
        let mixed = [&[0xFFu8; 10][..], b"abc"].concat();
        assert_eq!(suffix_text_within(&mixed, 6), ("\u{FFFD}abc".into(), 9));
        assert_eq!(suffix_text_within(b"fits", 4), ("fits".into(), 0));
        // Stray continuation bytes are binary, not half a character: kept, as U+FFFD.
        assert_eq!(suffix_text_within(&[0x89, 0xAA, 0x82, 0xBC], 10), ("\u{FFFD}".repeat(3), 1));
        assert_eq!(suffix_text_within("\n€😀".as_bytes(), 3), (String::new(), 8), "no fragment of 😀");
    }

    #[test]
    fn a_streamed_sample_keeps_its_head_and_its_tail() {
        // What capture keeps of a long output: 6 bytes of head, 6 of tail, 1,000 in all.
        let s = Sample { head: b"first\n", tail: b"last!\n", tail_offset: 994, total: 1_000, total_lines: 100 };
        assert!(!s.is_whole());
        let p = preview(&s, 200, super::Strategy::HeadTail { tail_share: 0.5 }).unwrap();
        assert!(p.truncated);
        assert!(p.text.starts_with("first\n") && p.text.ends_with("last!\n"), "{:?}", p.text);
        assert!(p.text.contains("[... 988 bytes (98 lines) omitted ...]"), "{:?}", p.text);
        assert_eq!(p.shown, vec![ShownRange { offset: 0, length: 6 }, ShownRange { offset: 994, length: 6 }]);
        assert!(preview(&s, 200, super::Strategy::Reject).is_err(), "a partial sample is never sent whole");
        assert_eq!(p.next_line, Some(2), "the head held one whole line");
        // Numbers as long as they get still fit: the marker's room is kept for its longest form.
        let (head, tail) = (vec![b'h'; 300], vec![b't'; 300]);
        let huge =
            Sample { head: &head, tail: &tail, tail_offset: (1 << 60) - 300, total: 1 << 60, total_lines: 1 << 50 };
        let p = preview(&huge, 120, super::Strategy::default()).unwrap();
        assert!(p.text.len() <= 120, "{} bytes: {:?}", p.text.len(), p.text);
        assert!(p.text.contains("[... 1,152,921,504,606,846,9"), "{:?}", p.text);
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(123_456), "123,456");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn numbered_lines_fill_the_cap_exactly() {
        // Each entry is 11 bytes ("     1\tabc\n"); 80 are kept for the footer.
        let p = preview(&Sample::whole(b"abc\nabc\n"), 11 + 11 + 80, super::Strategy::NumberedLines { first_line: 1 })
            .unwrap();
        assert_eq!((p.truncated, p.next_line), (false, None), "two entries fit exactly: {:?}", p.text);
        let p =
            preview(&Sample::whole(b"abc\nabc\nabc\n"), 11 + 11 + 80, super::Strategy::NumberedLines { first_line: 1 })
                .unwrap();
        assert_eq!((p.truncated, p.next_line), (true, Some(3)));
        assert_eq!(p.shown, vec![ShownRange { offset: 0, length: 8 }]);
    }

    #[test]
    fn a_first_line_over_the_cap_is_shown_in_part() {
        let line = vec![b'x'; 1000];
        let p = preview(&Sample::whole(&line), 300, super::Strategy::NumberedLines { first_line: 1 }).unwrap();
        // 300 − 80 for the footer − 8 for the number: 212 bytes of the line.
        assert_eq!(p.shown, vec![ShownRange { offset: 0, length: 212 }]);
        assert!(p.text.starts_with(&format!("     1\t{}\n", "x".repeat(212))), "{:?}", p.text);
        assert!(p.text.ends_with("[truncated: 788 more bytes; continue from line 2]\n"), "{:?}", p.text);
        assert_eq!(p.next_line, Some(2));
        assert!(p.text.len() <= 300);
    }

    /// Secrets of several kinds, real formats with fake values.
    const SECRETS: &[&str] = &[
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        "sk-ant-api03-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv-wxyzAA",
        "hunter2hunter2",
    ];

    fn secret_line(i: usize) -> String {
        match i % 4 {
            0 => format!("export AWS_ACCESS_KEY_ID={}\n", SECRETS[0]),
            1 => format!("git clone https://{}@github.com/o/r\n", SECRETS[1]),
            2 => format!("x-api-key: {}\n", SECRETS[2]),
            _ => format!("DB_PASSWORD={}\n", SECRETS[3]),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(64)))]
        /// Whatever the cut, no four characters of a secret are shown, the marks are counted,
        /// and the cap counts the text as shown.
        #[test]
        fn redacted_previews_show_no_secret(
            lines in proptest::collection::vec((0usize..8, "[a-z ]{0,40}"), 1..400),
            cap in 300usize..6000,
        ) {
            let data: String = lines.iter().enumerate()
                .map(|(i, (k, filler))| if *k < 2 { secret_line(i) } else { format!("{filler}\n") })
                .collect();
            let grams: Vec<String> = SECRETS.iter()
                .flat_map(|s| s.as_bytes().windows(4).map(|w| String::from_utf8(w.to_vec()).unwrap()))
                // (Digits alone are in line numbers and the footer's counts too.)
                .filter(|g| g.bytes().any(|b| b.is_ascii_alphabetic()))
                .filter(|g| !data.replace(SECRETS[0], "").replace(SECRETS[1], "").replace(SECRETS[2], "")
                    .replace(SECRETS[3], "").contains(g.as_str()) && !"[REDACTED:aws_access_key_id]".contains(g.as_str()))
                .collect();
            for s in [super::Strategy::Head, super::Strategy::Tail, super::Strategy::default(),
                      super::Strategy::NumberedLines { first_line: 1 }] {
                let p = preview_with(&Sample::whole(data.as_bytes()), cap, s, &Redaction::On).unwrap();
                prop_assert!(p.text.len() <= cap, "{} > {cap}", p.text.len());
                for g in &grams {
                    prop_assert!(!p.text.contains(g.as_str()), "{s:?} shows {g:?}: {}", p.text);
                }
                prop_assert_eq!(p.redactions, Some(p.text.matches("[REDACTED:").count() as u64));
                let end = p.shown.last().map_or(0, |r| r.offset + r.length);
                prop_assert!(end as usize <= data.len());
            }
        }
    }

    #[test]
    fn a_short_output_whose_marks_pass_the_cap_is_cut() {
        let data = "password=a\n".repeat(100);
        let p =
            preview_with(&Sample::whole(data.as_bytes()), 1_500, super::Strategy::default(), &Redaction::On).unwrap();
        assert!(p.truncated, "1,100 bytes, 2,900 when marked: over the cap");
        assert!(p.text.len() <= 1_500);
        let off = preview_with(&Sample::whole(data.as_bytes()), 1_500, super::Strategy::default(), &Redaction::Off);
        assert!(!off.unwrap().truncated);
    }

    #[test]
    fn reject_refuses_instead_of_cutting() {
        let err = preview(&Sample::whole(&[b'x'; 2001]), 2000, super::Strategy::Reject).unwrap_err();
        assert_eq!(err.size, 2001);
        assert!(preview(&Sample::whole(&[b'x'; 2000]), 2000, super::Strategy::Reject).is_ok());
    }
}

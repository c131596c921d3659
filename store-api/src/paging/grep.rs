//! Grep over any source: matching lines in order, with their numbers and context, capped at
//! 100,000 bytes of text (or a caller's smaller budget) and `max_matches`, resumable from
//! `next_line`, in bounded steps (a window at a time, a deadline, a scan limit) — and over the
//! redacted text when asked, so that a pattern matches what a redacted read shows.

use regex::bytes::Regex;

use super::{
    line_start, newlines, past_end, read_checked, redacted, utf8_cut, PageError, PageResult, Source, SourceError,
};
use crate::{ContextLine, GrepMatch, GrepResponse, READ_CAP};

/// Most bytes one grep call scans before it answers with a `next_line` to resume from.
const GREP_SCAN_LIMIT: u64 = 256 << 20;
/// A matching line longer than this is shortened around the match.
pub(super) const GREP_LINE_MAX: usize = 4096;
/// How much of a source one step of grep reads at a time.
pub(super) const WINDOW: u64 = 1 << 20;
/// Longest grep pattern, in bytes.
pub const MAX_PATTERN: usize = 4096;
/// Compiled-size limit of a pattern: a pattern past it is an error, never a stall.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Most context lines asked for on either side of a match.
pub const MAX_CONTEXT: usize = 100;

/// Compiles a grep pattern with the limits every backend shares (the server and `--local`
/// must refuse the same patterns).
pub fn compile_pattern(pattern: &str, fixed: bool, ignore_case: bool) -> PageResult<Regex> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN {
        return Err(PageError::InvalidArgument(format!("pattern must be 1 to {MAX_PATTERN} bytes")));
    }
    let pattern = if fixed { regex::escape(pattern) } else { pattern.to_owned() };
    regex::bytes::RegexBuilder::new(&pattern)
        .case_insensitive(ignore_case)
        .multi_line(true)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| PageError::InvalidArgument(format!("invalid pattern: {e}")))
}

/// What a grep call asks for.
#[derive(Debug, Clone, Copy)]
pub struct GrepRequest<'a> {
    /// The compiled pattern.
    pub regex: &'a Regex,
    /// 1-based line to start at.
    pub from_line: u64,
    /// Most matches to return.
    pub max_matches: usize,
    /// Context lines before each match.
    pub before: usize,
    /// Context lines after each match.
    pub after: usize,
    /// When to stop scanning and answer with what was found and where to go on (`next_line`),
    /// however far the scan got: a heavy request's time budget.
    pub deadline: Option<std::time::Instant>,
    /// Search the redacted text (secrets replaced by marks) instead of the stored bytes: the
    /// pattern matches, and the answer shows, what a redacted read shows.
    pub redact: Option<&'a crate::redact::Detector>,
    /// Most bytes of text (context included) the answer may hold: [`READ_CAP`], or what is
    /// left of it when several greps share one answer (a search across outputs).
    pub max_text: usize,
}

/// Why a grep call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrepEnd {
    /// The source was searched to its end.
    End,
    /// `max_matches` were found (`next_line` says where more may be).
    MaxMatches,
    /// The text budget is spent.
    TextCap,
    /// The deadline passed.
    Deadline,
    /// The call scanned as much as one call may: go on from `next_line`.
    ScanLimit,
}

impl<'a> GrepRequest<'a> {
    /// A search from line 1 with no context and no match limit.
    pub fn new(regex: &'a Regex) -> Self {
        Self {
            regex,
            from_line: 1,
            max_matches: usize::MAX,
            before: 0,
            after: 0,
            deadline: None,
            redact: None,
            max_text: READ_CAP,
        }
    }
}

pub(super) fn shorten(line: &[u8], match_at: usize) -> (String, bool) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() <= GREP_LINE_MAX {
        return (String::from_utf8_lossy(line).into_owned(), false);
    }
    let mut from = match_at.saturating_sub(GREP_LINE_MAX / 8).min(line.len() - GREP_LINE_MAX);
    while from > 0 && line[from] & 0xC0 == 0x80 {
        from -= 1;
    }
    let slice = &line[from..from + GREP_LINE_MAX];
    let slice = &slice[..utf8_cut(slice)];
    (String::from_utf8_lossy(slice).into_owned(), true)
}

fn context_line(line: u64, raw: &[u8]) -> ContextLine {
    ContextLine { line, text: shorten(raw, 0).0 }
}

/// The lines of a window (which holds whole lines), by start and end offsets, found as they
/// are taken: each step searches one line, from either end, so a match's context costs the
/// lines it shows, not the rest of the window. An empty window is one empty line.
pub(super) fn line_spans(hay: &[u8]) -> LineSpans<'_> {
    LineSpans { hay, front: 0, back: hay.len(), empty: hay.is_empty() }
}

/// The iterator of [`line_spans`]: the lines of `hay[front..back]` are left.
pub(super) struct LineSpans<'a> {
    hay: &'a [u8],
    front: usize,
    back: usize,
    /// The one empty line of an empty window, not taken yet.
    empty: bool,
}

impl Iterator for LineSpans<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if std::mem::take(&mut self.empty) {
            return Some((0, 0));
        }
        if self.front >= self.back {
            return None;
        }
        let s = self.front;
        let e = memchr::memchr(b'\n', &self.hay[s..self.back]).map_or(self.back, |i| s + i);
        self.front = (e + 1).min(self.back);
        Some((s, e))
    }
}

impl DoubleEndedIterator for LineSpans<'_> {
    fn next_back(&mut self) -> Option<(usize, usize)> {
        if std::mem::take(&mut self.empty) {
            return Some((0, 0));
        }
        if self.front >= self.back {
            return None;
        }
        let e = if self.hay[self.back - 1] == b'\n' { self.back - 1 } else { self.back };
        let s = memchr::memrchr(b'\n', &self.hay[self.front..e]).map_or(self.front, |i| self.front + i + 1);
        self.back = s;
        Some((s, e))
    }
}

/// Grep's answer as it is built: the text budget, and the context lines it still owes.
struct GrepOut {
    resp: GrepResponse,
    text_bytes: usize,
    max_text: usize,
    /// Lines of the previous window's end, for the before-context of the next window's first matches.
    recent: std::collections::VecDeque<ContextLine>,
    /// After-context lines the last match still waits for (its window ended first).
    owed_after: usize,
}

impl GrepOut {
    fn last_shown(&self) -> u64 {
        self.resp.matches.last().map_or(0, |m| m.after.last().map_or(m.line, |c| c.line))
    }

    /// Adds `m` if its text (and context) fit the cap; false when the cap is reached.
    fn push(&mut self, mut m: GrepMatch) -> bool {
        if let Some(last) = self.resp.matches.last_mut() {
            last.after.retain(|c| c.line < m.line);
        }
        let shown = self.last_shown();
        m.before.retain(|c| c.line > shown);
        let mut size = m.text.len() + m.before.iter().map(|c| c.text.len()).sum::<usize>();
        // The first match of an answer always goes in when its line fits, with as much of its
        // before-context as fits: an answer that could hold nothing would resume where it began.
        while self.resp.matches.is_empty() && self.text_bytes + size > self.max_text && !m.before.is_empty() {
            size -= m.before.remove(0).text.len();
        }
        if self.text_bytes + size > self.max_text {
            return false;
        }
        self.text_bytes += size;
        self.resp.matches.push(m);
        true
    }

    /// Ends the answer as capped, to be resumed at `line`.
    fn stop_at(&mut self, line: u64) {
        self.resp.next_line = Some(line);
        self.resp.capped = true;
    }

    /// Gives the after-context the last match is still owed from the start of `hay` (line
    /// `first_line`); false when the cap cut it short, which ends the answer.
    fn pay_owed(&mut self, hay: &[u8], first_line: u64, finished: bool) -> bool {
        for (n, (ls, le)) in line_spans(hay).take(self.owed_after).enumerate() {
            if !self.push_after(context_line(first_line + n as u64, &hay[ls..le])) {
                if !finished {
                    self.stop_at(first_line + n as u64);
                }
                return false;
            }
            self.owed_after -= 1;
        }
        true
    }

    /// Adds an after-context line to the last match, if it fits.
    fn push_after(&mut self, c: ContextLine) -> bool {
        if self.text_bytes + c.text.len() > self.max_text {
            return false;
        }
        self.text_bytes += c.text.len();
        if let Some(last) = self.resp.matches.last_mut() {
            last.after.push(c);
        }
        true
    }
}

/// How grep walks a source: the bytes it reads per step and the most it scans per call. Not
/// part of the answer's meaning, only of its cost (the tests walk in small steps, so that their
/// small inputs cross every step boundary).
#[derive(Debug, Clone, Copy)]
pub(super) struct Walk {
    pub(super) window: u64,
    pub(super) scan_limit: u64,
}

pub(super) const WALK: Walk = Walk { window: WINDOW, scan_limit: GREP_SCAN_LIMIT };

/// Matching lines in order, capped at [`READ_CAP`] bytes of text (context included) and
/// `max_matches`.
pub async fn grep<E: SourceError>(src: &dyn Source<Error = E>, req: GrepRequest<'_>) -> PageResult<GrepResponse, E> {
    Ok(grep_walking(src, req, WALK).await?.0)
}

/// [`grep`], saying why it ended: what a caller that goes on by itself (a search across
/// outputs) needs to know.
pub async fn grep_until<E: SourceError>(
    src: &dyn Source<Error = E>,
    req: GrepRequest<'_>,
) -> PageResult<(GrepResponse, GrepEnd), E> {
    grep_walking(src, req, WALK).await
}

pub(super) async fn grep_walking<E: SourceError>(
    src: &dyn Source<Error = E>,
    req: GrepRequest<'_>,
    walk: Walk,
) -> PageResult<(GrepResponse, GrepEnd), E> {
    let (mut resp, end) = grep_windows(src, req, walk).await?;
    if req.redact.is_some() {
        resp.redactions = Some(marks_in(&resp));
    }
    Ok((resp, end))
}

/// The marks an answer shows, in its matches and their context.
fn marks_in(resp: &GrepResponse) -> u64 {
    resp.matches.iter().map(marks_in_match).sum()
}

/// The marks one match shows, in its line and its context.
pub fn marks_in_match(m: &GrepMatch) -> u64 {
    let count = |t: &str| memchr::memmem::find_iter(t.as_bytes(), b"[REDACTED:").count() as u64;
    count(&m.text) + m.before.iter().chain(&m.after).map(|c| count(&c.text)).sum::<u64>()
}

async fn grep_windows<E: SourceError>(
    src: &dyn Source<Error = E>,
    req: GrepRequest<'_>,
    walk: Walk,
) -> PageResult<(GrepResponse, GrepEnd), E> {
    let size = src.size();
    check_grep(&req, src.total_lines(), size)?;
    let mut out = GrepOut {
        resp: GrepResponse { matches: Vec::new(), next_line: None, capped: false, redactions: None },
        text_bytes: 0,
        max_text: req.max_text,
        recent: Default::default(),
        owed_after: 0,
    };
    let mut pos = line_start(src, req.from_line).await?;
    let scan_end = size.min(pos.saturating_add(walk.scan_limit));
    let mut cur_line = req.from_line;
    // Whether `pos` is inside a line that began in an earlier window (a line longer than one).
    let mut mid_line = false;
    // Set once `max_matches` is reached: what is left is the last match's after-context.
    let mut finished = false;
    while pos < size {
        let late = req.deadline.is_some_and(|d| std::time::Instant::now() >= d);
        // A call stops early only past a line it has finished, so that `next_line` moves on and
        // a caller following it always gets to the end: a deadline that passed before the first
        // window (a slow read, a busy machine) or a line longer than the scan limit would
        // otherwise answer `next_line == from_line` for ever.
        if (pos >= scan_end || late) && !finished && cur_line > req.from_line {
            out.stop_at(cur_line);
            return Ok((out.resp, if late { GrepEnd::Deadline } else { GrepEnd::ScanLimit }));
        }
        let window_end = size.min(pos + walk.window);
        // With redaction the window is read with the context its edges' secrets need.
        let (buf, at) = match req.redact {
            Some(_) => redacted::with_context(src, pos, window_end).await?,
            None => (read_checked(src, pos, window_end).await?, 0),
        };
        let raw = &buf[at..at + (window_end - pos) as usize];
        let at_eof = window_end == size;
        let usable = if at_eof { raw.len() } else { memchr::memrchr(b'\n', raw).map_or(raw.len(), |i| i + 1) };
        let marked;
        let hay = match req.redact {
            Some(detector) => {
                marked = detector.redact_range(&buf, at, at + usable);
                &marked.text[..]
            }
            None => &raw[..usable],
        };
        if !out.pay_owed(hay, cur_line, finished) {
            return Ok((out.resp, if finished { GrepEnd::MaxMatches } else { GrepEnd::TextCap }));
        }
        if finished {
            if out.owed_after == 0 {
                return Ok((out.resp, GrepEnd::MaxMatches));
            }
            cur_line += newlines(hay);
        } else {
            let window = Window { hay, mid_line, at_eof };
            match scan_window(&req, &mut out, &window, &mut cur_line) {
                Scanned::Capped => return Ok((out.resp, GrepEnd::TextCap)),
                Scanned::Finished => finished = true,
                Scanned::Whole => {}
            }
            remember_tail(&mut out.recent, hay, cur_line, req.before);
            mid_line = hay.last() != Some(&b'\n');
        }
        if finished && out.owed_after == 0 {
            // Nothing is owed past the last match: the next window need not be read.
            return Ok((out.resp, GrepEnd::MaxMatches));
        }
        pos += usable as u64;
        // A window of matching costs up to a few milliseconds and a read from the page cache
        // never waits: give the worker back between windows, so that a long grep does not
        // hold up the requests and connections queued behind it.
        src.between_windows().await;
    }
    let end = if finished { GrepEnd::MaxMatches } else { GrepEnd::End };
    Ok((out.resp, end))
}

/// The request's own limits, and its start within the source.
fn check_grep<E>(req: &GrepRequest<'_>, total_lines: u64, size: u64) -> PageResult<(), E> {
    if req.from_line == 0 {
        return Err(PageError::InvalidArgument("from_line starts at 1".into()));
    }
    if req.max_matches == 0 {
        return Err(PageError::InvalidArgument("max_matches must be at least 1".into()));
    }
    if req.before > MAX_CONTEXT || req.after > MAX_CONTEXT {
        return Err(PageError::InvalidArgument(format!("context is at most {MAX_CONTEXT} lines")));
    }
    if req.from_line > total_lines + 1 {
        return Err(past_end(format!("from_line {} is past the end ({total_lines} lines)", req.from_line), size));
    }
    Ok(())
}

/// One window of whole lines, as grep scans it.
struct Window<'a> {
    /// The window's bytes, cut after its last newline unless it ends the source.
    hay: &'a [u8],
    /// It starts inside a line that began in an earlier window.
    mid_line: bool,
    /// It ends the source.
    at_eof: bool,
}

/// How a window's scan ended.
enum Scanned {
    /// Every line of the window was scanned.
    Whole,
    /// `max_matches` was reached: only after-context is left to give.
    Finished,
    /// The text cap was reached: the answer is complete.
    Capped,
}

/// Finds the window's matches and adds them with their context; `cur_line` ends as the number
/// of the line after the window.
fn scan_window(req: &GrepRequest<'_>, out: &mut GrepOut, w: &Window<'_>, cur_line: &mut u64) -> Scanned {
    let (hay, usable) = (w.hay, w.hay.len());
    let (mut at, mut counted) = (0usize, 0usize);
    while at < usable {
        let Some(m) = req.regex.find_at(hay, at) else {
            break;
        };
        let ls = memchr::memrchr(b'\n', &hay[..m.start()]).map_or(0, |i| i + 1);
        let le = memchr::memchr(b'\n', &hay[m.start()..]).map_or(usable, |i| m.start() + i);
        *cur_line += newlines(&hay[counted..ls]);
        counted = ls;
        at = le + 1;
        if out.resp.matches.last().is_some_and(|last| last.line == *cur_line) {
            continue; // the same over-long line, continued from the previous window
        }
        let (text, shortened) = shorten(&hay[ls..le], m.start() - ls);
        // Only part of a line longer than the window is at hand: the text is not all of it.
        let partial = (ls == 0 && w.mid_line) || (le == usable && !w.at_eof);
        let before = before_context(hay, ls, *cur_line, req.before, &out.recent);
        let found = GrepMatch { line: *cur_line, text, shortened: shortened || partial, before, after: Vec::new() };
        if !out.push(found) {
            out.stop_at(*cur_line);
            return Scanned::Capped;
        }
        // After-context from this window; what it lacks is owed by the next one.
        let rest = if le < usable { &hay[le + 1..] } else { &[][..] };
        let mut given = 0;
        for (n, (s, e)) in line_spans(rest).take(req.after).enumerate() {
            if rest.is_empty() || !out.push_after(context_line(*cur_line + 1 + n as u64, &rest[s..e])) {
                break;
            }
            given += 1;
        }
        out.owed_after = if w.at_eof { 0 } else { req.after - given };
        if out.resp.matches.len() >= req.max_matches {
            // Positions in `hay` are the text's (redacted, maybe), not the source's.
            let more = le + 1 < usable || !w.at_eof;
            out.resp.next_line = more.then_some(*cur_line + 1);
            out.resp.capped = more;
            *cur_line += newlines(&hay[counted..]);
            return Scanned::Finished;
        }
    }
    *cur_line += newlines(&hay[counted..]);
    Scanned::Whole
}

/// Up to `n` lines before the line starting at `ls` (line number `line`), reaching back into
/// the previous window's tail when this window starts too close.
fn before_context(
    hay: &[u8],
    ls: usize,
    line: u64,
    n: usize,
    recent: &std::collections::VecDeque<ContextLine>,
) -> Vec<ContextLine> {
    if n == 0 {
        return Vec::new();
    }
    let mut lines: Vec<ContextLine> = line_spans(&hay[..ls])
        .filter(|&(s, _)| s < ls)
        .rev()
        .take(n)
        .enumerate()
        .map(|(k, (s, e))| context_line(line - 1 - k as u64, &hay[s..e]))
        .collect();
    // `recent` holds the lines just before this window, all before the ones found here.
    lines.extend(recent.iter().rev().take(n - lines.len()).cloned());
    lines.reverse();
    lines
}

/// Keeps the last `n` lines of a window for the next window's before-context.
fn remember_tail(recent: &mut std::collections::VecDeque<ContextLine>, hay: &[u8], next_line: u64, n: usize) {
    if n == 0 {
        return;
    }
    let last: Vec<(usize, usize)> = line_spans(hay).rev().take(n).collect();
    for (k, &(s, e)) in last.iter().enumerate().rev() {
        recent.push_back(context_line(next_line - 1 - k as u64, &hay[s..e]));
    }
    while recent.len() > n {
        recent.pop_front();
    }
}

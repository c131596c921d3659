//! The capped read API and grep, over any source of bytes with a line index (a stored blob,
//! a stream so far, a local spill file). The cutting rules live here, shared by the server
//! and the client's `--local` mode; sources only hand out byte ranges.

pub mod cut;
mod grep;
pub mod lines;
mod redacted;
mod tail;

pub use grep::{compile_pattern, grep, grep_until, marks_in_match, GrepEnd, GrepRequest, MAX_CONTEXT, MAX_PATTERN};
pub use redacted::{block_secrets, byte_page_redacted, kept_spans, line_page_redacted, SECRET_BLOCK};
pub use tail::{tail_page, tail_start, MAX_TAIL_LINES};

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ReadPage, READ_CAP};
use lines::Checkpoint;

/// Why a page could not be cut; `E` is the source's own error.
#[derive(Debug, thiserror::Error)]
pub enum PageError<E = std::convert::Infallible> {
    /// A malformed request (`line=0`, say).
    #[error("{0}")]
    InvalidArgument(String),
    /// Offset or line past the end.
    #[error("{message}")]
    RangeNotSatisfiable {
        /// For a person.
        message: String,
        /// Size of the source.
        size: u64,
    },
    /// The source handed out fewer bytes than it holds: it changed under the read (a stream
    /// sealed meanwhile). Asking again sees the new state.
    #[error("the source changed while it was read: {0}")]
    Changed(String),
    /// The source failed to hand out bytes.
    #[error(transparent)]
    Source(E),
}

/// Result of paging operations over a source whose error is `E`.
pub type PageResult<T, E = std::convert::Infallible> = Result<T, PageError<E>>;

/// What a source's error must be: one the paging code can hand back as it is.
pub trait SourceError: std::error::Error + Send + Sync + 'static {}
impl<T: std::error::Error + Send + Sync + 'static> SourceError for T {}

/// How much one step of a line search reads: about two checkpoint spans.
const LINE_WINDOW: u64 = 128 << 10;

/// Something the read API can page through.
#[async_trait]
pub trait Source: Send + Sync {
    /// Why the source could not hand out what it was asked.
    type Error: SourceError;
    /// Bytes available now.
    fn size(&self) -> u64;
    /// Lines as the contract counts them.
    fn total_lines(&self) -> u64;
    /// The blob's digest, if it is one.
    fn digest(&self) -> Option<String>;
    /// The last checkpoint at or before `offset`.
    async fn checkpoint_for_offset(&self, offset: u64) -> Result<Checkpoint, Self::Error>;
    /// The last checkpoint at or before the start of `line`.
    async fn checkpoint_for_line(&self, line: u64) -> Result<Checkpoint, Self::Error>;
    /// Bytes `start..end` (both within `size`).
    async fn read(&self, start: u64, end: u64) -> Result<Bytes, Self::Error>;
    /// The secrets that start in block `block` (of [`SECRET_BLOCK`] bytes), as
    /// [`block_secrets`] finds them, when the source keeps them from one read to the next (the
    /// server, for blobs: their bytes never change); `None` (the default): each redacted page
    /// scans its own bytes.
    async fn kept_secrets(
        &self,
        _detector: &crate::redact::Detector,
        _block: u64,
    ) -> Option<PageResult<std::sync::Arc<[crate::redact::Span]>, Self::Error>> {
        None
    }
    /// Called by a scan (grep) between two of its windows. The default gives the worker back
    /// to the runtime; a source may pause for longer, to give way to other work (the server's
    /// search does while requests come in).
    async fn between_windows(&self) {
        tokio::task::yield_now().await;
    }
}

/// Length of the longest prefix of `page` that does not end inside a UTF-8 character
/// (0 when the page is shorter than its first character).
pub fn utf8_cut(page: &[u8]) -> usize {
    let len = page.len();
    for back in 1..=len.min(4) {
        let i = len - back;
        let b = page[i];
        if b & 0xC0 == 0x80 {
            continue; // continuation byte: keep looking for the lead
        }
        let width = char_width(b);
        return if i + width > len { i } else { len };
    }
    len
}

/// Raw bytes turned into page content.
#[derive(Debug)]
pub struct Content {
    /// The text: at most [`READ_CAP`] UTF-8 bytes, invalid sequences replaced by U+FFFD.
    pub text: String,
    /// How many raw bytes the text covers (a prefix of the input).
    pub used: usize,
    /// Whether invalid UTF-8 was replaced.
    pub lossy: bool,
    /// Whether the cap stopped the text before the end of the input (replacement characters
    /// take three bytes, so a binary page covers fewer raw bytes than it asked for).
    pub cut: bool,
}

/// Turns raw bytes into content of at most [`READ_CAP`] UTF-8 bytes, in one pass: the cap
/// counts what the reader receives, after replacement.
pub fn to_content(raw: &[u8]) -> Content {
    // Text, the common case: one vectorised validation (simdutf8: SIMD for non-ASCII too), one
    // copy.
    if raw.len() <= READ_CAP {
        if let Ok(s) = simdutf8::basic::from_utf8(raw) {
            return Content { text: s.to_owned(), used: raw.len(), lossy: false, cut: false };
        }
    }
    lossy_content(raw)
}

/// What one byte becomes when it is a character by itself (ASCII: 1 byte out) or cannot start
/// one (a stray continuation byte, `C0`, `C1`, `F5`–`FF`: U+FFFD, 3 bytes out); 0 for a lead
/// byte, whose sequence is checked with the bytes after it.
const ONE_BYTE_OUT: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = if b < 0x80 {
            1
        } else if b >= 0xC2 && b <= 0xF4 {
            0
        } else {
            3
        };
        b += 1;
    }
    t
};

/// The bytes written for a byte of [`ONE_BYTE_OUT`] 1 or 3.
const ONE_BYTE_TEXT: [[u8; 3]; 256] = {
    let mut t = [[0u8; 3]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = if b < 0x80 { [b as u8, 0, 0] } else { REPLACEMENT };
        b += 1;
    }
    t
};

const REPLACEMENT: [u8; 3] = [0xEF, 0xBF, 0xBD];

/// For a lead byte (`C2`–`F4`): its sequence's length, and the range its second byte must be
/// in (Table 3-7 of the Unicode standard: no overlongs, no surrogates, nothing past U+10FFFF).
const LEAD: [[u8; 3]; 256] = {
    let mut t = [[1u8, 0x80, 0xBF]; 256];
    let mut b = 0xC2;
    while b <= 0xF4 {
        let width = if b < 0xE0 {
            2
        } else if b < 0xF0 {
            3
        } else {
            4
        };
        let (lo, hi) = match b {
            0xE0 => (0xA0, 0xBF),
            0xED => (0x80, 0x9F),
            0xF0 => (0x90, 0xBF),
            0xF4 => (0x80, 0x8F),
            _ => (0x80, 0xBF),
        };
        t[b] = [width, lo, hi];
        b += 1;
    }
    t
};

/// [`to_content`] of bytes that are not all UTF-8: what `String::from_utf8_lossy` gives (one
/// U+FFFD for each maximal ill-formed subpart, as Unicode and std define it), cut at the cap.
/// Random bytes are the case this is shaped for (an agent `cat`s a binary): std's `Utf8Chunks`
/// branches on every byte, and on random data those branches are unpredictable; here the two
/// commonest kinds of byte go through tables without a branch, and only lead bytes are decoded.
fn lossy_content(raw: &[u8]) -> Content {
    // Three bytes of slack: a table row is written whole, then the length advances.
    let mut out = vec![0u8; READ_CAP + 3];
    // Text up to the first bad byte (or text over the cap) is copied as it is, validated at
    // the vectorised validator's pace.
    let valid = match std::str::from_utf8(raw) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&raw[..e.valid_up_to()]).expect("valid up to there"),
    };
    if valid.len() > READ_CAP {
        let mut cut = READ_CAP;
        while !valid.is_char_boundary(cut) {
            cut -= 1;
        }
        return Content { text: valid[..cut].to_owned(), used: cut, lossy: false, cut: true };
    }
    out[..valid.len()].copy_from_slice(valid.as_bytes());
    let (mut i, mut o, mut lossy) = (valid.len(), valid.len(), false);
    let cut = loop {
        let Some(&b) = raw.get(i) else {
            break false;
        };
        let len = usize::from(ONE_BYTE_OUT[usize::from(b)]);
        if len != 0 {
            if o + len > READ_CAP {
                break true;
            }
            out[o..o + 3].copy_from_slice(&ONE_BYTE_TEXT[usize::from(b)]);
            o += len;
            lossy |= len == 3;
            i += 1;
            continue;
        }
        let (seen, whole) = lead_unit(raw, i);
        let piece = if whole { &raw[i..i + seen] } else { &REPLACEMENT[..] };
        if o + piece.len() > READ_CAP {
            break true;
        }
        out[o..o + piece.len()].copy_from_slice(piece);
        o += piece.len();
        lossy |= !whole;
        i += seen;
    };
    out.truncate(o);
    // Only whole characters and U+FFFD were written; checked again, by the vectorised validator.
    let text = simdutf8::basic::from_utf8(&out).expect("the lossy decoder writes only whole characters").to_owned();
    Content { text, used: i, lossy, cut }
}

/// The step lossy decoding takes at `raw[i]`, as `String::from_utf8_lossy` takes it: the
/// unit's length in bytes, and whether it is a character (`false`: one U+FFFD stands for it).
/// Decoding from any byte that is not a continuation byte (`80`–`BF`) steps through the same
/// units as decoding the whole input does: such a byte always starts one.
pub fn lossy_unit(raw: &[u8], i: usize) -> (usize, bool) {
    match ONE_BYTE_OUT[usize::from(raw[i])] {
        1 => (1, true),
        3 => (1, false),
        _ => lead_unit(raw, i),
    }
}

/// [`lossy_unit`] at a lead byte: the longest well-formed prefix of its sequence is the whole
/// character, or what one U+FFFD replaces (the second byte's range depends on the lead, Table
/// 3-7 of the Unicode standard).
#[inline]
fn lead_unit(raw: &[u8], i: usize) -> (usize, bool) {
    let [width, lo, hi] = LEAD[usize::from(raw[i])];
    let width = usize::from(width);
    let mut seen = 1;
    if raw.get(i + 1).is_some_and(|c| (lo..=hi).contains(c)) {
        seen = 2;
        while seen < width && raw.get(i + seen).is_some_and(|c| (0x80..=0xBF).contains(c)) {
            seen += 1;
        }
    }
    (seen, seen == width)
}

fn char_width(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

/// `src.read`, checked: a source that hands back fewer bytes than asked (a stream sealed
/// while it is read, say) is an error, never a cut in the wrong place.
async fn read_checked<E: SourceError>(src: &dyn Source<Error = E>, start: u64, end: u64) -> PageResult<Bytes, E> {
    let buf = src.read(start, end).await.map_err(PageError::Source)?;
    if buf.len() as u64 != end - start {
        let msg = format!("short read: {} of {} bytes at {start}", buf.len(), end - start);
        return Err(PageError::Changed(msg));
    }
    Ok(buf)
}

fn newlines(data: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', data).count() as u64
}

/// Where the newline after `n` others is in `data` (`n = 0`: the first): whole 4 KiB blocks are
/// counted with SIMD and passed, and only the block that holds it is searched newline by
/// newline — a line a checkpoint span away costs a count, not a thousand iterator steps.
fn nth_newline(data: &[u8], n: u64) -> Option<usize> {
    const BLOCK: usize = 4096;
    let mut left = n;
    for (k, block) in data.chunks(BLOCK).enumerate() {
        let here = newlines(block);
        if here > left {
            return memchr::memchr_iter(b'\n', block).nth(left as usize).map(|i| k * BLOCK + i);
        }
        left -= here;
    }
    None
}

fn past_end<E>(message: String, size: u64) -> PageError<E> {
    PageError::RangeNotSatisfiable { message, size }
}

/// A byte page: `offset`, up to `limit` bytes (capped at [`READ_CAP`]).
pub async fn byte_page<E: SourceError>(
    src: &dyn Source<Error = E>,
    offset: u64,
    limit: u64,
) -> PageResult<ReadPage, E> {
    let size = src.size();
    if offset > size {
        return Err(past_end(format!("offset {offset} is past the end ({size} bytes)"), size));
    }
    let end = cut::byte_end_asked(size, offset, limit);
    let cp = src.checkpoint_for_offset(offset).await.map_err(PageError::Source)?;
    // Three bytes past the end tell whether the last character is whole.
    let buf = read_checked(src, cp.offset, size.min(end + 3)).await?;
    let w = cut::Window { size, start: cp.offset, newlines: cp.newlines, data: &buf };
    let stop = match cut::byte_end(&w, offset, end) {
        cut::End::At(stop) => stop,
        cut::End::OneCharacter => offset + cut::one_character(&w, offset),
    };
    let content = to_content(&buf[(offset - cp.offset) as usize..(stop - cp.offset) as usize]);
    let page_end = offset + content.used as u64;
    // Cut short by the cap: by bytes (a limit over it) or by what replacement added.
    let capped = content.cut || cut::byte_capped(size, offset, limit, page_end);
    Ok(finish_page(src, &w, offset, page_end, content, capped))
}

/// The page `offset..page_end` of `w` with `content` as its text (see [`Shown::page`]).
fn finish_page<E: SourceError>(
    src: &dyn Source<Error = E>,
    w: &cut::Window<'_>,
    offset: u64,
    page_end: u64,
    content: Content,
    capped: bool,
) -> ReadPage {
    cut::shown(w, src.total_lines(), offset, page_end, content.lossy, capped).page(src.digest(), content.text)
}

/// What a page shows of its source, from which its line numbers and cursors follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// Size of the source.
    pub size: u64,
    /// Lines of the source.
    pub total_lines: u64,
    /// Where the page starts.
    pub offset: u64,
    /// Raw bytes it covers.
    pub used: u64,
    /// The 1-based line it starts in.
    pub start_line: u64,
    /// `\n` bytes in it.
    pub newlines: u64,
    /// Whether its last byte is a `\n`.
    pub ends_line: bool,
    /// Whether invalid UTF-8 was replaced.
    pub lossy: bool,
    /// Whether the cap stopped it short of what was asked.
    pub capped: bool,
}

impl Shown {
    /// The page with `content` as its text. The cursor rule: `next_line` only when the page
    /// ends at the end of a line, so a reader that follows `next_line` when given and
    /// `next_offset` otherwise reads every byte exactly once.
    pub fn page(&self, digest: Option<String>, content: String) -> ReadPage {
        let page_end = self.offset + self.used;
        let eof = page_end == self.size;
        let (start_line, nl) = (self.start_line, self.newlines);
        let end_line = if self.ends_line { start_line + nl - 1 } else { start_line + nl };
        ReadPage {
            digest,
            total_size: self.size,
            total_lines: self.total_lines,
            offset: self.offset,
            length: self.used,
            next_offset: (!eof).then_some(page_end),
            eof,
            start_line,
            end_line: end_line.max(start_line),
            next_line: (!eof && self.ends_line).then_some(end_line + 1),
            capped: self.capped,
            lossy: self.lossy,
            content,
            redactions: None,
        }
    }
}

/// Byte offset where 1-based `line` starts (`size` for the line after the last).
async fn line_start<E: SourceError>(src: &dyn Source<Error = E>, line: u64) -> PageResult<u64, E> {
    let size = src.size();
    let cp = src.checkpoint_for_line(line).await.map_err(PageError::Source)?;
    let mut skip = line - 1 - cp.newlines;
    let mut pos = cp.offset;
    while skip > 0 && pos < size {
        let buf = read_checked(src, pos, size.min(pos + LINE_WINDOW)).await?;
        match nth_newline(&buf, skip - 1) {
            Some(i) => return Ok(pos + i as u64 + 1),
            None => {
                skip -= newlines(&buf);
                pos += buf.len() as u64;
            }
        }
    }
    Ok(pos)
}

/// Where `line` starts and up to [`READ_CAP`] bytes from there. One read serves both the
/// search from the checkpoint (at most a span away) and the page, so line 1,000,000 costs
/// about what line 1 does.
async fn locate_page<E: SourceError>(src: &dyn Source<Error = E>, line: u64) -> PageResult<(u64, Bytes), E> {
    let size = src.size();
    let cp = src.checkpoint_for_line(line).await.map_err(PageError::Source)?;
    let skip = line - 1 - cp.newlines;
    let span = if skip == 0 { 0 } else { lines::CHECKPOINT_EVERY };
    let first_end = size.min(cp.offset + span + READ_CAP as u64);
    let buf = read_checked(src, cp.offset, first_end).await?;
    let found = if skip == 0 { Some(0) } else { nth_newline(&buf, skip - 1).map(|i| i + 1) };
    if let Some(i) = found {
        let available = buf.len() - i;
        if available >= READ_CAP || first_end == size {
            return Ok((cp.offset + i as u64, buf.slice(i..i + available.min(READ_CAP))));
        }
    }
    let start = line_start(src, line).await?;
    Ok((start, read_checked(src, start, size.min(start + READ_CAP as u64)).await?))
}

/// A line page: whole lines from `line`, at most `lines` of them and [`READ_CAP`] bytes.
pub async fn line_page<E: SourceError>(src: &dyn Source<Error = E>, line: u64, lines: u64) -> PageResult<ReadPage, E> {
    let total_lines = src.total_lines();
    let size = src.size();
    if line == 0 || lines == 0 {
        return Err(PageError::InvalidArgument("line and lines start at 1".into()));
    }
    if line > total_lines + 1 {
        return Err(past_end(format!("line {line} is past the end ({total_lines} lines)"), size));
    }
    let (start, window) = locate_page(src, line).await?;
    let w = cut::Window { size, start, newlines: line - 1, data: &window };
    let (stop, capped) = cut::line_end(&w, start, line, lines, start + window.len() as u64);
    let len = (stop - start) as usize;
    let mut content = to_content(&window[..len]);
    if content.cut {
        // Replacement made the lines too long for the cap: keep the whole lines that fit.
        if let Some(nl) = memchr::memrchr(b'\n', &window[..content.used]) {
            content = to_content(&window[..nl + 1]);
            content.cut = true;
        }
    }
    let capped = capped || content.cut;
    let page_end = start + content.used as u64;
    Ok(finish_page(src, &w, start, page_end, content, capped))
}

/// An output held in memory, paged with the same rules as a stored blob (a tool that has its
/// whole output at hand can serve "read page N" itself).
#[derive(Debug, Clone)]
pub struct MemorySource {
    data: Bytes,
    index: lines::LineIndex,
    lines: u64,
    /// Whether it answers [`Source::kept_secrets`] (as the server's blobs do).
    secrets_by_block: bool,
}

impl MemorySource {
    /// Indexes `data` once.
    pub fn new(data: Bytes) -> Self {
        let mut b = lines::LineIndexBuilder::default();
        b.update(&data);
        let lines = b.lines();
        Self { data, index: b.finish(), lines, secrets_by_block: false }
    }

    /// The same source answering [`Source::kept_secrets`] with [`block_secrets`], as a store
    /// that keeps them does: its redacted pages are marked from the blocks' secrets.
    pub fn with_secrets_by_block(self) -> Self {
        Self { secrets_by_block: true, ..self }
    }
}

#[async_trait]
impl Source for MemorySource {
    type Error = std::convert::Infallible;
    fn size(&self) -> u64 {
        self.data.len() as u64
    }
    fn total_lines(&self) -> u64 {
        self.lines
    }
    fn digest(&self) -> Option<String> {
        None
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> Result<Checkpoint, Self::Error> {
        Ok(self.index.for_offset(offset))
    }
    async fn checkpoint_for_line(&self, line: u64) -> Result<Checkpoint, Self::Error> {
        Ok(self.index.for_line(line))
    }
    async fn read(&self, start: u64, end: u64) -> Result<Bytes, Self::Error> {
        Ok(self.data.slice(start as usize..end as usize))
    }
    async fn kept_secrets(
        &self,
        detector: &crate::redact::Detector,
        block: u64,
    ) -> Option<PageResult<std::sync::Arc<[crate::redact::Span]>, Self::Error>> {
        if !self.secrets_by_block {
            return None;
        }
        Some(block_secrets(self, detector, block).await)
    }
}

#[cfg(test)]
mod tests {
    use super::grep::{line_spans, shorten, Walk, GREP_LINE_MAX, WALK, WINDOW};
    async fn grep_walking<E: SourceError>(
        src: &dyn Source<Error = E>,
        req: GrepRequest<'_>,
        walk: Walk,
    ) -> PageResult<GrepResponse, E> {
        Ok(super::grep::grep_walking(src, req, walk).await?.0)
    }
    use super::*;
    use crate::{ContextLine, GrepMatch, GrepResponse};
    use proptest::prelude::*;
    use regex::bytes::Regex;

    type Mem = MemorySource;

    impl Mem {
        fn new_vec(data: Vec<u8>) -> Self {
            MemorySource::new(data.into())
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
        RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap()).block_on(f)
    }

    /// The lines of `hay` as [`line_spans`] defines them, found all at once.
    fn all_line_spans(hay: &[u8]) -> Vec<(usize, usize)> {
        let mut starts = vec![0usize];
        starts.extend(memchr::memchr_iter(b'\n', hay).map(|i| i + 1).filter(|&i| i < hay.len()));
        starts.iter().map(|&s| (s, memchr::memchr(b'\n', &hay[s..]).map_or(hay.len(), |i| s + i))).collect()
    }

    proptest! {
        /// Lines taken one at a time, from the front, the back or both in turn, are the lines.
        #[test]
        fn line_spans_found_lazily_are_the_lines(
            hay in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'a'), Just(b'\r')], 0..40),
            ends in proptest::collection::vec(any::<bool>(), 0..50),
        ) {
            let all = all_line_spans(&hay);
            prop_assert_eq!(line_spans(&hay).collect::<Vec<_>>(), all.clone());
            prop_assert_eq!(line_spans(&hay).rev().collect::<Vec<_>>(), all.iter().rev().copied().collect::<Vec<_>>());
            let (mut it, mut left) = (line_spans(&hay), std::collections::VecDeque::from(all));
            for back in ends {
                let want = if back { left.pop_back() } else { left.pop_front() };
                prop_assert_eq!(if back { it.next_back() } else { it.next() }, want);
            }
        }
    }

    proptest! {
        /// Blocks passed by their count land on the same newline as stepping through them all.
        #[test]
        fn nth_newline_agrees_with_stepping(
            lines in proptest::collection::vec(0usize..9000, 0..12),
            n in 0u64..20,
        ) {
            let data: Vec<u8> = lines.iter().flat_map(|&len| std::iter::repeat_n(b'x', len).chain([b'\n'])).collect();
            prop_assert_eq!(nth_newline(&data, n), memchr::memchr_iter(b'\n', &data).nth(n as usize));
        }
    }

    fn text_strategy() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop_oneof![Just("\n".to_string()), "[a-zé€😀 ]{0,40}"], 0..400)
            .prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(64)))]
        #[test]
        fn byte_pages_concatenate(text in text_strategy(), limit in 1u64..300) {
            let src = Mem::new_vec(text.clone().into_bytes());
            let mut out = String::new();
            let mut off = 0;
            loop {
                let p = block_on(byte_page(&src, off, limit)).unwrap();
                prop_assert!(p.content.len() <= READ_CAP);
                prop_assert!(!p.lossy);
                out.push_str(&p.content);
                match p.next_offset { Some(n) => { prop_assert!(n > off); off = n } None => break }
            }
            prop_assert_eq!(out, text);
        }

        #[test]
        fn line_pages_hold_whole_lines(text in text_strategy(), k in 1u64..20) {
            let src = Mem::new_vec(text.clone().into_bytes());
            let mut out = String::new();
            let mut line = 1;
            loop {
                let p = block_on(line_page(&src, line, k)).unwrap();
                prop_assert!(p.end_line - p.start_line < k);
                if p.next_line.is_some() { prop_assert!(p.content.ends_with('\n')); }
                out.push_str(&p.content);
                match p.next_line { Some(n) => { prop_assert_eq!(n, p.end_line + 1); line = n } None => break }
            }
            prop_assert_eq!(out, text);
        }
    }

    /// Any bytes: text, invalid UTF-8, and lines longer than the cap.
    fn any_bytes_strategy() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            4 => "[a-zé€😀 \n]{0,60}".prop_map(String::into_bytes),
            2 => proptest::collection::vec(any::<u8>(), 0..200),
            1 => (READ_CAP - 10..READ_CAP + 3000, prop_oneof![Just(b'x'), Just(0xFFu8)])
                .prop_map(|(n, b)| vec![b; n]),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(64)))]
        /// Small and huge limits over any bytes: every page holds at most the cap, says exactly
        /// which bytes it holds, and the pages followed by `next_offset` cover the blob once.
        #[test]
        fn byte_pages_cover_any_bytes_within_the_cap(
            data in any_bytes_strategy(),
            limit in prop_oneof![1u64..300, READ_CAP as u64 - 5..READ_CAP as u64 + 5, 1_000_000u64..u64::MAX],
        ) {
            let src = Mem::new_vec(data.clone());
            let mut off = 0;
            loop {
                let p = block_on(byte_page(&src, off, limit)).unwrap();
                prop_assert!(p.content.len() <= READ_CAP, "{} bytes sent", p.content.len());
                prop_assert_eq!(p.offset, off);
                prop_assert!(p.length <= limit.max(4), "a limit under one character gives that character");
                let held = &data[off as usize..(off + p.length) as usize];
                prop_assert_eq!(&p.content, &String::from_utf8_lossy(held));
                prop_assert_eq!(p.lossy, std::str::from_utf8(held).is_err());
                // Capped when the cap cut the page; otherwise only a character boundary may
                // stop it before the limit or the end.
                let wanted = limit.min(data.len() as u64 - off);
                if p.capped {
                    prop_assert!(p.length < wanted);
                } else {
                    prop_assert!(p.length + 3 >= wanted, "{} of {} bytes, not capped", p.length, wanted);
                }
                match p.next_offset {
                    Some(n) => { prop_assert_eq!(n, off + p.length); prop_assert!(n > off); off = n }
                    None => { prop_assert!(p.eof); prop_assert_eq!(off + p.length, data.len() as u64); break }
                }
            }
        }
    }

    /// The content of `raw` as std's `Utf8Chunks` defines it, cut at the cap: the oracle of
    /// the table-driven decoder.
    fn content_by_chunks(raw: &[u8]) -> Content {
        let mut text = String::new();
        let (mut used, mut lossy) = (0usize, false);
        for chunk in raw.utf8_chunks() {
            let valid = chunk.valid();
            let room = READ_CAP - text.len();
            if valid.len() > room {
                let mut cut = room;
                while !valid.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.push_str(&valid[..cut]);
                return Content { text, used: used + cut, lossy, cut: true };
            }
            text.push_str(valid);
            used += valid.len();
            if !chunk.invalid().is_empty() {
                if READ_CAP - text.len() < 3 {
                    return Content { text, used, lossy, cut: true };
                }
                text.push(char::REPLACEMENT_CHARACTER);
                used += chunk.invalid().len();
                lossy = true;
            }
        }
        Content { text, used, lossy, cut: false }
    }

    /// Bytes near UTF-8's edges: every lead byte with every kind of follower, truncated
    /// sequences, surrogates, overlongs, and long runs that reach the cap.
    fn utf8_edges() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => any::<u8>(),
            2 => 0x80u8..=0xBF,
            2 => 0xC0u8..=0xFF,
            1 => Just(b'\n'),
        ];
        let piece = prop_oneof![
            6 => proptest::collection::vec(byte, 0..12),
            2 => "\\PC{0,8}".prop_map(String::into_bytes),
            1 => (READ_CAP - 8..READ_CAP + 8, prop_oneof![Just(b'a'), Just(0xFFu8), Just(0xE2u8)])
                .prop_map(|(n, b)| vec![b; n]),
            1 => (READ_CAP / 3 - 4..READ_CAP / 3 + 4).prop_map(|n| "€".repeat(n).into_bytes()),
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(512)))]
        /// The table-driven decoder answers exactly what std's lossy decoding does: the same
        /// text, the same bytes used, the same flags, for any bytes, at and around the cap.
        #[test]
        fn content_matches_std_lossy_decoding(raw in utf8_edges()) {
            let (got, want) = (to_content(&raw), content_by_chunks(&raw));
            prop_assert_eq!(&got.text, &want.text);
            prop_assert_eq!((got.used, got.lossy, got.cut), (want.used, want.lossy, want.cut));
        }
    }

    proptest! {
        /// `lossy_unit`, step by step, is std's lossy decoding, and every byte that is not a
        /// continuation byte starts a unit (so decoding may start there).
        #[test]
        fn lossy_units_are_std_decoding_and_start_at_every_non_continuation_byte(raw in utf8_edges()) {
            let (mut text, mut i, mut starts) = (Vec::new(), 0, std::collections::HashSet::new());
            while i < raw.len() {
                starts.insert(i);
                let (len, whole) = lossy_unit(&raw, i);
                text.extend_from_slice(if whole { &raw[i..i + len] } else { &REPLACEMENT[..] });
                i += len;
            }
            prop_assert_eq!(String::from_utf8(text).unwrap(), String::from_utf8_lossy(&raw));
            for (p, b) in raw.iter().enumerate() {
                prop_assert!(b & 0xC0 == 0x80 || starts.contains(&p), "byte {} ({:#x}) starts no unit", p, b);
            }
        }
    }

    #[test]
    fn every_two_and_three_byte_sequence_decodes_as_std_does() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for tail in [&[][..], &[0x80][..], &[0xBF, 0x80][..], &[b'x'][..]] {
                    let raw = [&[a, b][..], tail].concat();
                    let (got, want) = (to_content(&raw), content_by_chunks(&raw));
                    assert_eq!((got.text, got.used, got.lossy), (want.text, want.used, want.lossy), "{raw:x?}");
                }
            }
        }
    }

    #[test]
    fn content_is_capped_after_replacement() {
        // Valid text over the cap: cut at the cap, on a character boundary.
        let c = to_content("€".repeat(READ_CAP).as_bytes());
        assert!(c.cut && !c.lossy);
        assert_eq!((c.text.len(), c.used), (READ_CAP - READ_CAP % 3, READ_CAP - READ_CAP % 3));
        let c = to_content(&vec![b'a'; READ_CAP + 1]);
        assert_eq!((c.text.len(), c.used, c.cut), (READ_CAP, READ_CAP, true));
        // After an invalid byte, text that exactly fills the cap is whole, not cut.
        let exact = [&[0xFFu8][..], &vec![b'a'; READ_CAP - 3]].concat();
        let c = to_content(&exact);
        assert_eq!((c.text.len(), c.used, c.cut, c.lossy), (READ_CAP, exact.len(), false, true));
        // ... and a character that would cross the cap is left for the next page.
        let crossing = [&[0xFFu8][..], &vec![b'a'; READ_CAP - 5], "€".as_bytes()].concat();
        let c = to_content(&crossing);
        assert_eq!((c.text.len(), c.used, c.cut), (READ_CAP - 2, crossing.len() - 3, true));
        // A replacement character that exactly fits is added.
        let c = to_content(&[&vec![b'a'; READ_CAP - 3][..], &[0xFF]].concat());
        assert_eq!((c.text.len(), c.used, c.cut), (READ_CAP, READ_CAP - 2, false));
        // Replacement characters that would not fit are not added.
        let c = to_content(&[&vec![b'a'; READ_CAP - 2][..], &[0xFF]].concat());
        assert_eq!((c.text.len(), c.used, c.cut), (READ_CAP - 2, READ_CAP - 2, true));
    }

    #[test]
    fn byte_pages_at_the_edges() {
        // A blob that ends inside a character: the last page holds those bytes too.
        let src = Mem::new_vec(b"abc\xE2\x82".to_vec());
        let p = block_on(byte_page(&src, 0, 100)).unwrap();
        assert_eq!((p.length, p.eof, p.content.as_str()), (5, true, "abc\u{FFFD}"));
        assert_eq!(p.digest, None, "an in-memory output has no digest to name");
        // Limits over the cap on a small blob: whole, not capped, from any offset.
        let src = Mem::new_vec(b"0123456789".repeat(5));
        for offset in [0, 5] {
            let p = block_on(byte_page(&src, offset, u64::MAX)).unwrap();
            assert_eq!((p.length, p.capped, p.eof), (50 - offset, false, true), "offset {offset}");
        }
        // A limit of exactly the cap, stopped one byte short by a character: not capped.
        let src = Mem::new_vec("€".repeat(40_000).into_bytes());
        let p = block_on(byte_page(&src, 0, READ_CAP as u64)).unwrap();
        assert_eq!((p.length, p.capped), (READ_CAP as u64 - 1, false));
        let p = block_on(byte_page(&src, 0, READ_CAP as u64 + 1)).unwrap();
        assert_eq!((p.length, p.capped), (READ_CAP as u64 - 1, true), "over the cap: the cap cut it");
    }

    #[test]
    fn long_line_goes_on_by_bytes() {
        let mut data = vec![b'x'; 250_000];
        data.push(b'\n');
        data.extend_from_slice(b"tail\n");
        let src = Mem::new_vec(data);
        let p = block_on(line_page(&src, 1, 10)).unwrap();
        assert_eq!(p.length, READ_CAP as u64);
        assert_eq!(p.next_offset, Some(READ_CAP as u64));
        assert_eq!(p.next_line, None, "the page ends inside line 1: go on by bytes");
        assert!(p.capped);
        let p2 = block_on(line_page(&src, 2, 10)).unwrap();
        assert_eq!(p2.content, "tail\n");
        assert!(p2.eof);
    }

    /// Lines of 0 to 300,000 bytes (ASCII and multi-byte), with or without a final newline.
    fn long_lines_strategy() -> impl Strategy<Value = Vec<u8>> {
        let line = (0usize..300_000, prop_oneof![Just("x"), Just("é"), Just("€"), Just("😀")], 0usize..3).prop_map(
            |(len, ch, short)| {
                // Most lines short, some huge: the mix is where cursors went wrong.
                let n = if short > 0 { len % 200 } else { len } / ch.len();
                ch.repeat(n).into_bytes()
            },
        );
        (proptest::collection::vec(line, 0..6), any::<bool>()).prop_map(|(lines, last_newline)| {
            let mut out = lines.join(&b'\n');
            if last_newline && !out.is_empty() {
                out.push(b'\n');
            }
            out
        })
    }

    /// The reader of the cursor rule: `next_line` when given, `next_offset` otherwise.
    fn follow(src: &Mem, by_lines: bool, lines: u64, limit: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut page = if by_lines { block_on(line_page(src, 1, lines)) } else { block_on(byte_page(src, 0, limit)) };
        loop {
            let p = page.unwrap();
            assert!(p.content.len() <= READ_CAP);
            out.extend_from_slice(p.content.as_bytes());
            page = match (p.next_line, p.next_offset) {
                (Some(line), _) => block_on(line_page(src, line, lines)),
                (None, Some(offset)) => block_on(byte_page(src, offset, limit)),
                (None, None) => return out,
            };
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(48)))]
        #[test]
        fn cursor_rule_reads_every_byte_once(
            data in long_lines_strategy(),
            by_lines: bool,
            lines in 1u64..3000,
            limit in prop_oneof![1u64..2000, 99_000u64..1_000_000_000],
        ) {
            let src = Mem::new_vec(data.clone());
            let got = follow(&src, by_lines, lines, limit);
            prop_assert!(got == data, "read {} bytes of {}", got.len(), data.len());
        }
    }

    #[test]
    fn single_line_of_five_megabytes_is_never_skipped() {
        let data = vec![b'y'; 5_000_011];
        let src = Mem::new_vec(data.clone());
        let p = block_on(line_page(&src, 1, 2000)).unwrap();
        assert_eq!(p.next_line, None);
        assert_eq!(p.next_offset, Some(p.length));
        assert!(p.capped);
        assert_eq!(follow(&src, true, 2000, READ_CAP as u64).len(), data.len());
    }

    #[test]
    fn binary_pages_cap_what_the_reader_receives() {
        // Continuation bytes (0x80..=0xBF) alone are never valid UTF-8: every one becomes a 3-byte U+FFFD.
        let data: Vec<u8> = (0..1_000_000u32).map(|i| 0x80 | (i.wrapping_mul(2_654_435_761) >> 26) as u8).collect();
        let src = Mem::new_vec(data);
        let p = block_on(byte_page(&src, 1000, 1_000_000_000)).unwrap();
        assert!(p.lossy);
        assert!(p.content.len() <= READ_CAP, "{} bytes of content", p.content.len());
        assert!(p.content.len() > READ_CAP - 3);
        assert_eq!(p.length as usize, p.content.len() / 3);
        assert!(p.capped, "a page cut short by the cap says so");
        assert_eq!(p.next_offset, Some(1000 + p.length));
        let p = block_on(line_page(&src, 1, 10)).unwrap();
        assert!(p.content.len() <= READ_CAP && p.capped && p.next_line.is_none());
        // A small limit is not the cap.
        let p = block_on(byte_page(&src, 0, 10)).unwrap();
        assert_eq!((p.length, p.capped), (10, false));
    }

    #[test]
    fn lossy_line_pages_keep_whole_lines() {
        let line: Vec<u8> = [vec![0xFFu8; 20_000], b"\n".to_vec()].concat();
        let src = Mem::new_vec(line.repeat(10));
        let p = block_on(line_page(&src, 1, 10)).unwrap();
        assert!(p.capped && p.lossy);
        assert!(p.content.ends_with('\n'));
        assert_eq!((p.start_line, p.end_line, p.next_line), (1, 1, Some(2)));
    }

    #[test]
    fn far_line_is_found() {
        let text: String = (1..=200_000).map(|i| format!("line {i}\n")).collect();
        let src = Mem::new_vec(text.into_bytes());
        let p = block_on(line_page(&src, 199_999, 1)).unwrap();
        assert_eq!(p.content, "line 199999\n");
        let err = block_on(line_page(&src, 200_002, 1)).unwrap_err();
        assert!(matches!(err, PageError::RangeNotSatisfiable { .. }));
        let p = block_on(byte_page(&src, src.size(), 10)).unwrap();
        assert!(p.eof && p.content.is_empty());
    }

    /// Grep as its contract reads, line by line, for inputs far below the cap: matching lines
    /// in order from `from_line`, at most `max_matches` of them, each with up to `before` and
    /// `after` context lines, a line never shown twice (a match's after-context stops before
    /// the next match; a before-context starts after what was shown, and not before
    /// `from_line`).
    fn grep_oracle(text: &str, re: &Regex, from: u64, max: usize, before: usize, after: usize) -> GrepResponse {
        let lines: Vec<&str> = text.split_inclusive('\n').map(|l| l.strip_suffix('\n').unwrap_or(l)).collect();
        let ctx = |n: u64| ContextLine { line: n, text: lines[n as usize - 1].to_owned() };
        let mut resp = GrepResponse { matches: Vec::new(), next_line: None, capped: false, redactions: None };
        for n in from..=lines.len() as u64 {
            if !re.is_match(lines[n as usize - 1].as_bytes()) {
                continue;
            }
            if let Some(last) = resp.matches.last_mut() {
                last.after.retain(|c| c.line < n);
            }
            let shown = resp.matches.last().map_or(0, |m| m.after.last().map_or(m.line, |c| c.line));
            // Context starts at `from_line` too: a resumed grep does not reach back into lines
            // the previous call covered.
            let first = n.saturating_sub(before as u64).max(from).max(shown + 1);
            let last_after = (n + after as u64).min(lines.len() as u64);
            resp.matches.push(GrepMatch {
                line: n,
                text: lines[n as usize - 1].to_owned(),
                shortened: false,
                before: (first..n).map(ctx).collect(),
                after: (n + 1..=last_after).map(ctx).collect(),
            });
            if resp.matches.len() == max {
                let end_of_line: usize = lines[..n as usize].iter().map(|l| l.len() + 1).sum();
                let more = end_of_line < text.len();
                resp.next_line = more.then_some(n + 1);
                resp.capped = more;
                break;
            }
        }
        resp
    }

    /// Short lines (at most 7 bytes with their newline), so that a window of 8 bytes or more
    /// always holds whole lines.
    fn short_lines() -> impl Strategy<Value = String> {
        (proptest::collection::vec("[abc ]{0,6}", 1..40), any::<bool>()).prop_map(|(lines, last_newline)| {
            let mut text = lines.join("\n");
            if last_newline {
                text.push('\n');
            }
            text
        })
    }

    /// Walks of every size: the real one, and windows of a few lines so that matches, their
    /// context and the lines before them fall on every side of a window's edge.
    fn walks() -> impl Strategy<Value = Walk> {
        prop_oneof![Just(WALK), (8u64..40).prop_map(|window| Walk { window, scan_limit: u64::MAX })]
    }

    proptest! {
        // Tiny inputs: cheap enough to keep every case under mutation testing too.
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn grep_agrees_with_its_contract(
            text in short_lines(),
            walk in walks(),
            pattern in prop_oneof![
                Just("a"), Just("ab"), Just("^b"), Just("c$"), Just("b+c"), Just("A"), Just("x*"), Just("^"),
            ],
            ignore_case: bool,
            from in 1u64..10,
            max in prop_oneof![1usize..6, Just(usize::MAX)],
            before in 0usize..4,
            after in 0usize..4,
        ) {
            let src = Mem::new_vec(text.clone().into_bytes());
            let re = compile_pattern(pattern, false, ignore_case).unwrap();
            let from = from.min(src.total_lines() + 1);
            let req = GrepRequest { from_line: from, max_matches: max, before, after, ..GrepRequest::new(&re) };
            let got = block_on(grep_walking(&src, req, walk)).unwrap();
            prop_assert_eq!(got, grep_oracle(&text, &re, from, max, before, after));
        }

        /// A grep stopped by its scan limit says where to resume, and the calls followed that
        /// way find every match once, in order.
        #[test]
        fn grep_resumes_where_its_scan_stopped(
            text in short_lines(),
            window in 8u64..40,
            scan_limit in 1u64..60,
            pattern in prop_oneof![Just("a"), Just("b+c"), Just("x*")],
        ) {
            let src = Mem::new_vec(text.clone().into_bytes());
            let re = compile_pattern(pattern, false, false).unwrap();
            let walk = Walk { window, scan_limit };
            let (mut found, mut from, mut calls) = (Vec::new(), 1, 0u64);
            loop {
                calls += 1;
                let r = block_on(grep_walking(&src, GrepRequest { from_line: from, ..GrepRequest::new(&re) }, walk))
                    .unwrap();
                prop_assert_eq!(r.capped, r.next_line.is_some());
                for m in &r.matches {
                    prop_assert!(m.line >= from && r.next_line.is_none_or(|next| m.line < next));
                }
                found.extend(r.matches);
                match r.next_line {
                    Some(next) => { prop_assert!(next > from); from = next }
                    None => break,
                }
            }
            prop_assert_eq!(found, grep_oracle(&text, &re, 1, usize::MAX, 0, 0).matches);
            // A call reads windows until it passes its limit: at most limit + window bytes.
            prop_assert!(calls * (scan_limit + window) >= text.len() as u64, "{} calls", calls);
        }
    }

    /// A call always moves `next_line` on: a deadline already passed, or a line longer than the
    /// scan limit, still ends the call past a finished line, so following `next_line` ends.
    #[test]
    fn grep_stopped_early_still_moves_on() {
        let re = compile_pattern("M", false, false).unwrap();
        let text = format!("{}M\nx\nM\n{}\nM\n", "a".repeat(200), "b".repeat(300));
        let src = Mem::new_vec(text.clone().into_bytes());
        let past = std::time::Instant::now() - std::time::Duration::from_secs(1);
        for (walk, deadline) in [
            (Walk { window: 64, scan_limit: u64::MAX }, Some(past)),
            (Walk { window: 16, scan_limit: 8 }, None),
            (Walk { window: 16, scan_limit: 8 }, Some(past)),
        ] {
            let (mut found, mut from, mut calls) = (Vec::new(), 1, 0);
            loop {
                calls += 1;
                assert!(calls < 100, "{walk:?}: next_line never reached the end");
                let req = GrepRequest { from_line: from, deadline, ..GrepRequest::new(&re) };
                let r = block_on(grep_walking(&src, req, walk)).unwrap();
                found.extend(r.matches.iter().map(|m| m.line));
                match r.next_line {
                    Some(next) => {
                        assert!(next > from, "{walk:?}: from {from}, next {next}");
                        from = next;
                    }
                    None => break,
                }
            }
            assert_eq!(found, [1, 3, 5], "{walk:?}");
        }
    }

    #[test]
    fn a_line_longer_than_the_window_is_one_match_marked_shortened() {
        let re = compile_pattern("M", false, false).unwrap();
        let walk = Walk { window: 64, scan_limit: u64::MAX };
        // Matches in three windows of line 2: one match, its text a part of the line.
        let long = format!("{}M{}M{}M", "a".repeat(10), "a".repeat(60), "a".repeat(60));
        let src = Mem::new_vec(format!("x\n{long}\nM\n").into_bytes());
        let r = block_on(grep_walking(&src, GrepRequest::new(&re), walk)).unwrap();
        let found: Vec<(u64, bool)> = r.matches.iter().map(|m| (m.line, m.shortened)).collect();
        assert_eq!(found, [(2, true), (3, false)]);
        assert!(long.starts_with(&r.matches[0].text) && r.matches[0].text.len() < long.len());
        // A match first seen in a window that starts inside its line: shortened too.
        let src = Mem::new_vec(format!("{}M\nM", "a".repeat(100)).into_bytes());
        let r = block_on(grep_walking(&src, GrepRequest::new(&re), walk)).unwrap();
        let found: Vec<(u64, bool)> = r.matches.iter().map(|m| (m.line, m.shortened)).collect();
        assert_eq!(found, [(1, true), (2, false)]);
        // The real walk has the whole line at hand: not shortened.
        let r = block_on(grep(&src, GrepRequest::new(&re))).unwrap();
        assert_eq!(r.matches[0].text.len(), 101);
        assert!(!r.matches[0].shortened);
    }

    #[test]
    fn shorten_keeps_the_match_in_view() {
        // Up to the longest line, whole; a carriage return before the newline is not shown.
        let line = "a".repeat(GREP_LINE_MAX);
        assert_eq!(shorten(line.as_bytes(), 0), (line.clone(), false));
        assert_eq!(shorten(format!("{line}\r").as_bytes(), 0), (line.clone(), false));
        // Longer: GREP_LINE_MAX bytes from an eighth of them before the match, or the end.
        let line: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        for (at, from) in [(0, 0), (300, 0), (5000, 5000 - GREP_LINE_MAX / 8), (9995, 10_000 - GREP_LINE_MAX)] {
            let want = String::from_utf8(line[from..from + GREP_LINE_MAX].to_vec()).unwrap();
            assert_eq!(shorten(&line, at), (want, true), "match at {at}");
        }
        // Never inside a character: back to its first byte, and no half character at the end.
        let line: String = (0..4000).map(|i| ['€', 'é', 'x', '😀', 'ж'][i % 5]).collect();
        for at in [4000, 5000, 6000, 6001, 6002] {
            let mut lead = at - GREP_LINE_MAX / 8;
            while !line.is_char_boundary(lead) {
                lead -= 1;
            }
            let mut end = lead + GREP_LINE_MAX;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            assert_eq!(shorten(line.as_bytes(), at), (line[lead..end].to_owned(), true), "match at {at}");
        }
        // A line of continuation bytes alone (binary): the walk back stops at its start.
        let (text, shortened) = shorten(&[0x80; 5000], 4000);
        assert!(shortened && text.chars().all(|c| c == char::REPLACEMENT_CHARACTER));
    }

    #[test]
    fn a_line_page_stopped_by_the_cap_between_lines_says_so() {
        // Whole lines that fill the cap exactly, and more after them.
        let src = Mem::new_vec([&b"123456789\n".repeat(READ_CAP / 10)[..], b"more\n"].concat());
        let p = block_on(line_page(&src, 1, 20_000)).unwrap();
        assert_eq!((p.length, p.next_line, p.capped), (READ_CAP as u64, Some(10_001), true));
        // The same lines as the whole blob: not capped.
        let src = Mem::new_vec(b"123456789\n".repeat(READ_CAP / 10));
        let p = block_on(line_page(&src, 1, 20_000)).unwrap();
        assert_eq!((p.length, p.eof, p.capped), (READ_CAP as u64, true, false));
    }

    #[test]
    fn grep_shortens_a_long_line_around_its_match() {
        let long = format!("{}MATCH{}", "a".repeat(5000), "b".repeat(5000));
        let src = Mem::new_vec(format!("first\n{long}\n").into_bytes());
        let re = compile_pattern("MATCH", false, false).unwrap();
        let r = block_on(grep(&src, GrepRequest::new(&re))).unwrap();
        let from = 5000 - GREP_LINE_MAX / 8;
        assert_eq!((r.matches[0].line, r.matches[0].shortened), (2, true));
        assert_eq!(r.matches[0].text, long[from..from + GREP_LINE_MAX]);
    }

    #[test]
    fn grep_text_budget_is_the_cap_exactly() {
        let re = compile_pattern("^m", false, false).unwrap();
        let line = |c: char, n: usize| format!("{c}{}\n", "x".repeat(n - 1));
        // Matches whose text adds up to the cap exactly: all of them.
        let exact: String = (0..100).map(|_| line('m', 1000)).collect();
        let r = block_on(grep(&Mem::new_vec(exact.clone().into_bytes()), GrepRequest::new(&re))).unwrap();
        assert_eq!((r.matches.len(), r.next_line, r.capped), (100, None, false));
        // One more: it waits for the next call.
        let over = format!("{exact}{}", line('m', 1));
        let r = block_on(grep(&Mem::new_vec(over.into_bytes()), GrepRequest::new(&re))).unwrap();
        assert_eq!((r.matches.len(), r.next_line, r.capped), (100, Some(101), true));
        // Context counts too: before-context and match, then match and after-context.
        let pairs: String = (0..100).map(|_| line('c', 500) + &line('m', 500)).collect();
        let src = Mem::new_vec(pairs.into_bytes());
        let r = block_on(grep(&src, GrepRequest { before: 1, ..GrepRequest::new(&re) })).unwrap();
        assert_eq!((r.matches.len(), r.capped), (100, false));
        assert!(r.matches.iter().all(|m| m.before.len() == 1));
        let pairs: String = (0..100).map(|_| line('m', 500) + &line('c', 500)).collect();
        let src = Mem::new_vec(format!("{pairs}m\n").into_bytes());
        let r = block_on(grep(&src, GrepRequest { after: 1, ..GrepRequest::new(&re) })).unwrap();
        assert_eq!((r.matches.len(), r.next_line), (100, Some(201)));
        assert!(r.matches.iter().all(|m| m.after.len() == 1), "the last after-context fills the cap exactly");
    }

    /// The text budget runs out on the second after-context line of a match whose window ended
    /// right after it: the answer resumes from that line.
    #[test]
    fn grep_budget_runs_out_on_after_context_owed_by_the_next_window() {
        let mut text = String::new();
        for _ in 0..24 {
            text += &format!("m{}\nc\nc\n", "x".repeat(3999)); // 4,002 bytes of text each, context included
        }
        let last_match = format!("m{}\n", "x".repeat(2999));
        let filler = WINDOW as usize - text.len() - last_match.len();
        for _ in 0..filler / 100 {
            text += &format!("{}\n", "f".repeat(99));
        }
        text += &format!("{}\n", "f".repeat(filler % 100 - 1));
        text += &last_match;
        assert_eq!(text.len() as u64, WINDOW, "the last match ends the first window");
        let after_line = text.lines().count() as u64 + 1;
        text += &format!("c\n{}\nc\n", "y".repeat(2000));
        let src = Mem::new_vec(text.into_bytes());
        let re = compile_pattern("^m", false, false).unwrap();
        let r = block_on(grep(&src, GrepRequest { after: 2, ..GrepRequest::new(&re) })).unwrap();
        assert_eq!(r.matches.len(), 25);
        assert_eq!(r.matches[24].after, [ContextLine { line: after_line, text: "c".into() }]);
        assert_eq!((r.next_line, r.capped), (Some(after_line + 1), true));
    }

    #[test]
    fn grep_limits_at_their_edges() {
        let src = Mem::new_vec(b"a\nb\na".to_vec());
        let re = compile_pattern("a", false, false).unwrap();
        let run = |req: GrepRequest| block_on(grep(&src, req));
        assert!(run(GrepRequest { before: MAX_CONTEXT, after: MAX_CONTEXT, ..GrepRequest::new(&re) }).is_ok());
        assert!(matches!(
            run(GrepRequest { after: MAX_CONTEXT + 1, ..GrepRequest::new(&re) }),
            Err(PageError::InvalidArgument(_))
        ));
        // From the last line, from the line after it (nothing), and past that (an error).
        assert_eq!(run(GrepRequest { from_line: 3, ..GrepRequest::new(&re) }).unwrap().matches[0].line, 3);
        let after_end = run(GrepRequest { from_line: 4, ..GrepRequest::new(&re) }).unwrap();
        assert_eq!((after_end.matches.len(), after_end.next_line), (0, None));
        assert!(matches!(
            run(GrepRequest { from_line: 5, ..GrepRequest::new(&re) }),
            Err(PageError::RangeNotSatisfiable { .. })
        ));
        // The last match on the last line: nothing more to resume from.
        let src = Mem::new_vec(b"b\na\n".to_vec());
        let r = block_on(grep(&src, GrepRequest { max_matches: 1, ..GrepRequest::new(&re) })).unwrap();
        assert_eq!((r.next_line, r.capped), (None, false));
        assert!(compile_pattern(&"a".repeat(MAX_PATTERN), false, false).is_ok());
    }

    /// A source that counts its reads and may hide its line index (a damaged or missing index
    /// degrades to a scan from the start).
    struct Counted {
        mem: Mem,
        indexed: bool,
        reads: std::sync::Mutex<Vec<(u64, u64)>>,
    }

    impl Counted {
        fn new(data: Vec<u8>, indexed: bool) -> Self {
            Self { mem: Mem::new_vec(data), indexed, reads: Default::default() }
        }
        fn take_reads(&self) -> Vec<(u64, u64)> {
            std::mem::take(&mut self.reads.lock().unwrap())
        }
    }

    #[async_trait]
    impl Source for Counted {
        type Error = std::convert::Infallible;
        fn size(&self) -> u64 {
            self.mem.size()
        }
        fn total_lines(&self) -> u64 {
            self.mem.total_lines()
        }
        fn digest(&self) -> Option<String> {
            None
        }
        async fn checkpoint_for_offset(&self, offset: u64) -> Result<Checkpoint, Self::Error> {
            if self.indexed {
                self.mem.checkpoint_for_offset(offset).await
            } else {
                Ok(Checkpoint { offset: 0, newlines: 0 })
            }
        }
        async fn checkpoint_for_line(&self, line: u64) -> Result<Checkpoint, Self::Error> {
            if self.indexed {
                self.mem.checkpoint_for_line(line).await
            } else {
                Ok(Checkpoint { offset: 0, newlines: 0 })
            }
        }
        async fn read(&self, start: u64, end: u64) -> Result<Bytes, Self::Error> {
            self.reads.lock().unwrap().push((start, end));
            self.mem.read(start, end).await
        }
    }

    fn numbered_lines(n: u32) -> Vec<u8> {
        (1..=n).map(|i| format!("line {i}\n")).collect::<String>().into_bytes()
    }

    #[test]
    fn any_line_costs_one_read_of_a_span_and_a_page() {
        let src = Counted::new(numbered_lines(300_000), true);
        let last = src.total_lines();
        for line in [1, 2, 150_000, last - 1000, last - 1, last, last + 1] {
            let p = block_on(line_page(&src, line, 3)).unwrap();
            let want: String = (line..(line + 3).min(last + 1)).map(|i| format!("line {i}\n")).collect();
            assert_eq!(p.content, want, "line {line}");
            let reads = src.take_reads();
            assert_eq!(reads.len(), 1, "line {line}: {reads:?}");
            let (start, end) = reads[0];
            assert!(end - start <= lines::CHECKPOINT_EVERY + READ_CAP as u64, "line {line}: {reads:?}");
        }
        // A byte page reads from its checkpoint to three bytes past its end, no more.
        for (offset, limit) in [(0, 10), (1_000_000, 500), (2_000_000, 1)] {
            let p = block_on(byte_page(&src, offset, limit)).unwrap();
            let before = src.mem.data[..offset as usize].iter().filter(|&&b| b == b'\n').count() as u64;
            assert_eq!(p.start_line, 1 + before, "offset {offset}");
            let reads = src.take_reads();
            assert_eq!(reads.len(), 1);
            assert!(offset - reads[0].0 < lines::CHECKPOINT_EVERY && reads[0].1 == offset + limit + 3, "{reads:?}");
        }
    }

    #[test]
    fn without_an_index_pages_and_grep_scan_to_the_same_answers() {
        for data in [numbered_lines(400_000), [numbered_lines(1000), b"no newline at the end".to_vec()].concat()] {
            let indexed = Counted::new(data.clone(), true);
            let scanned = Counted::new(data, false);
            let last = indexed.total_lines();
            for line in [1, 2, 1000, last / 2, last - 1, last, last + 1] {
                for lines in [1, 100_000] {
                    let want = block_on(line_page(&indexed, line, lines)).unwrap();
                    assert_eq!(block_on(line_page(&scanned, line, lines)).unwrap(), want, "line {line}");
                }
                for (start, end) in scanned.take_reads() {
                    assert!(
                        end - start <= lines::CHECKPOINT_EVERY + READ_CAP as u64,
                        "a step reads at most a span and a page"
                    );
                }
                let re = compile_pattern("1$", false, false).unwrap();
                let req = || GrepRequest { from_line: line, max_matches: 3, before: 1, ..GrepRequest::new(&re) };
                let want = block_on(grep(&indexed, req())).unwrap();
                assert_eq!(block_on(grep(&scanned, req())).unwrap(), want, "grep from {line}");
                scanned.take_reads();
            }
        }
    }

    #[test]
    fn line_pages_at_their_edges() {
        let src = Mem::new_vec(b"a\nb\nc".to_vec());
        assert!(matches!(block_on(line_page(&src, 0, 5)), Err(PageError::InvalidArgument(_))));
        assert!(matches!(block_on(line_page(&src, 1, 0)), Err(PageError::InvalidArgument(_))));
        let p = block_on(line_page(&src, 1, 1)).unwrap();
        assert_eq!((p.content.as_str(), p.next_line), ("a\n", Some(2)));
        // The last line, without a newline: whole, not capped.
        let p = block_on(line_page(&src, 3, 10)).unwrap();
        assert_eq!((p.content.as_str(), p.capped, p.eof), ("c", false, true));
        let p = block_on(line_page(&Mem::new_vec(b"abc".to_vec()), 1, 10)).unwrap();
        assert_eq!((p.content.as_str(), p.capped, p.eof), ("abc", false, true));
        // The line after the last, when the last has no newline: empty, at the end.
        let p = block_on(line_page(&src, 4, 1)).unwrap();
        assert_eq!((p.content.as_str(), p.offset, p.eof), ("", 5, true));
    }

    #[test]
    fn grep_finds_lines_in_order_and_resumes() {
        let text: String =
            (1..=50_000).map(|i| format!("row {i} {}\n", if i % 1000 == 0 { "ERROR" } else { "ok" })).collect();
        let src = Mem::new_vec(text.into_bytes());
        let re = Regex::new("ERROR").unwrap();
        let r = block_on(grep(&src, GrepRequest { max_matches: 10, ..GrepRequest::new(&re) })).unwrap();
        let lines: Vec<u64> = r.matches.iter().map(|m| m.line).collect();
        assert_eq!(lines, (1..=10).map(|i| i * 1000).collect::<Vec<_>>());
        assert_eq!(r.next_line, Some(10_001));
        let r = block_on(grep(&src, GrepRequest { from_line: 10_001, max_matches: 1000, ..GrepRequest::new(&re) }))
            .unwrap();
        assert_eq!(r.matches.len(), 40);
        assert_eq!(r.next_line, None);
        assert_eq!(r.matches[0].text, "row 11000 ERROR");
    }

    #[test]
    fn grep_context_lines_are_numbered_and_never_repeated() {
        // Lines 1..=3_000_000 cross several 1 MiB windows; matches every 100,000 lines, and two
        // close together whose contexts would overlap.
        let text: String = (1..=300_000u32)
            .map(|i| match i {
                i if i % 100_000 == 0 || i == 150_001 || i == 150_003 => format!("hit {i}\n"),
                i => format!("row {i}\n"),
            })
            .collect();
        let src = Mem::new_vec(text.into_bytes());
        let re = compile_pattern("^hit", false, false).unwrap();
        let r = block_on(grep(&src, GrepRequest { before: 2, after: 2, ..GrepRequest::new(&re) })).unwrap();
        let lines: Vec<u64> = r.matches.iter().map(|m| m.line).collect();
        assert_eq!(lines, [100_000, 150_001, 150_003, 200_000, 300_000]);
        let ctx = |v: &[ContextLine]| v.iter().map(|c| (c.line, c.text.clone())).collect::<Vec<_>>();
        assert_eq!(ctx(&r.matches[0].before), [(99_998, "row 99998".into()), (99_999, "row 99999".into())]);
        assert_eq!(ctx(&r.matches[0].after), [(100_001, "row 100001".into()), (100_002, "row 100002".into())]);
        // The line between two close matches is shown once, as the first one's after-context.
        assert_eq!(ctx(&r.matches[1].after), [(150_002, "row 150002".into())]);
        assert!(r.matches[2].before.is_empty());
        assert_eq!(r.matches[4].after, []);
        // Every window boundary was crossed with the context intact.
        for m in &r.matches {
            for (k, c) in m.before.iter().enumerate() {
                assert_eq!(c.line, m.line - (m.before.len() - k) as u64);
                assert_eq!(c.text, format!("row {}", c.line));
            }
        }
        let over = block_on(grep(&src, GrepRequest { before: MAX_CONTEXT + 1, ..GrepRequest::new(&re) }));
        assert!(matches!(over, Err(PageError::InvalidArgument(_))));
        let none = block_on(grep(&src, GrepRequest { max_matches: 0, ..GrepRequest::new(&re) }));
        assert!(matches!(none, Err(PageError::InvalidArgument(_))));
    }

    #[test]
    fn patterns_are_refused_alike_everywhere() {
        assert!(compile_pattern("", false, false).is_err());
        assert!(compile_pattern(&"a".repeat(MAX_PATTERN + 1), false, false).is_err());
        assert!(compile_pattern("(", false, false).is_err());
        assert!(compile_pattern("(", true, false).unwrap().is_match(b"a(b"));
        assert!(compile_pattern("a{1000}{1000}", false, false).is_err(), "too large compiles to an error");
    }

    #[test]
    fn utf8_cut_never_splits() {
        let s = "a€".as_bytes();
        assert_eq!(utf8_cut(&s[..2]), 1);
        assert_eq!(utf8_cut(&s[..3]), 1);
        assert_eq!(utf8_cut(s), 4);
        assert_eq!(utf8_cut(&s[1..2]), 0);
    }
}

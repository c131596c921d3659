//! `TextCache`: blobs' text kept JSON-escaped, in blocks, so that a capped read of plain text
//! writes its `content` from memory as it is — no read of the file, no escaping, no copy.
//! Escaping was the largest cost of a capped read (every line's `\n` breaks the SIMD run), and
//! reading the bytes out of the page cache the next; a blob never changes, so a block escaped
//! once serves every later page over it, and nothing is ever invalidated.
//!
//! A byte page that is not plain text (invalid UTF-8, a character cut at its start or across a
//! block edge) comes from blocks kept decoded as lossy decoding decodes them (`lossy`). Where a
//! page ends is not decided here: the blocks answer `paging::cut`'s questions (where bytes,
//! characters and newlines are; [`Span`] and `lossy::LossySpan`) and its rules, the ones
//! `paging::byte_page` and `line_page` use, decide. What neither kind of block can render
//! exactly as `paging` would (a limit smaller than one character, a line page that is not plain
//! text) is left to it: the caller cuts that page the usual way. The property tests check the
//! two renderings agree byte for byte.

mod lossy;

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use lossy::{LossyBlock, LossySpan, CONTEXT};
use spillway_api::paging::cut::{self, Around, End, Lines};
use spillway_api::paging::lines::{LineIndex, CHECKPOINT_EVERY};
use spillway_api::paging::utf8_cut;
use spillway_api::{Digest, ReadPage, READ_CAP};

/// Raw bytes per block: a capped read spans two or three.
const BLOCK: u64 = 64 << 10;
/// What a thread keeps of its escaping buffer between blocks: enough for a block of text.
const SCRATCH_KEPT: usize = 6 * BLOCK as usize + 64;

thread_local! {
    /// Where a block is escaped before it is copied out at its size.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Raw bytes between two marks of a block: finding a position steps over at most this many.
const MARK: usize = 256;

/// Reads bytes `range` of the blob (from its file or object).
pub(crate) trait Fetch<E>: Fn(Range<u64>) -> Self::Read {
    type Read: Future<Output = Result<Bytes, E>>;
}

impl<E, F: Fn(Range<u64>) -> R, R: Future<Output = Result<Bytes, E>>> Fetch<E> for F {
    type Read = R;
}

/// A blob as the cache needs to know it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextBlob<'a> {
    pub digest: &'a Digest,
    pub size: u64,
    /// Lines in the whole blob.
    pub lines: u64,
    /// Its encoded line index: where a block's first line number is counted from.
    pub line_index: &'a [u8],
}

/// A byte page whose `content` is escaped already: `page.content` is empty, and the escaped
/// text is `content`, in order.
#[derive(Debug)]
pub(crate) struct EscapedPage {
    pub page: ReadPage,
    pub content: Vec<Bytes>,
}

/// One block of a blob: its bytes as the text of a JSON string, and where its raw positions
/// and lines fall in that text.
#[derive(Debug)]
struct TextBlock {
    /// The block's bytes, escaped as a JSON string's content (no quotes); empty unless `text`.
    esc: Bytes,
    /// For raw offsets `0, MARK, 2 * MARK, …` up to the block's length: (offset in `esc`,
    /// `\n` bytes before it in the block).
    marks: Vec<(u32, u32)>,
    /// `\n` bytes in the blob before the block.
    first_line: u64,
    /// `\n` bytes in the block.
    newlines: u64,
    /// Whether the block is UTF-8, apart from the pieces of characters its two edges cut.
    text: bool,
    /// Continuation bytes the block starts with (of a character the block before began).
    head: Piece,
    /// The start of a character the block ends in the middle of.
    tail: Piece,
}

/// Up to three bytes of a character cut by a block's edge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Piece {
    bytes: [u8; 3],
    len: u8,
}

impl Piece {
    fn of(b: &[u8]) -> Option<Self> {
        let mut bytes = [0; 3];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(Self { bytes, len: b.len() as u8 })
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Marks for the escaped text `esc` of `len` raw bytes: for raw offsets `0, MARK, 2 * MARK, …`
/// up to `len`, (offset in `esc`, `\n` bytes before it); `None` if `esc` does not hold `len`
/// raw bytes. Every byte before the next backslash is one raw byte, so the walk jumps from
/// escape to escape (a log has one per line), not byte by byte.
fn marks_of(esc: &[u8], len: usize) -> Option<Vec<(u32, u32)>> {
    let mut marks = Vec::with_capacity(len / MARK + 1);
    marks.push((0, 0));
    let (mut raw, mut at, mut newlines, mut next) = (0usize, 0usize, 0u32, MARK);
    loop {
        let plain = memchr::memchr(b'\\', &esc[at..]).unwrap_or(esc.len() - at);
        while next <= len && raw + plain >= next {
            marks.push(((at + next - raw) as u32, newlines));
            next += MARK;
        }
        (raw, at) = (raw + plain, at + plain);
        if at == esc.len() {
            break;
        }
        let (byte, width) = unescape(&esc[at..]);
        newlines += u32::from(byte == b'\n');
        (raw, at) = (raw + 1, at + width.max(1));
        if raw == next && next <= len {
            marks.push((at as u32, newlines));
            next += MARK;
        }
    }
    (raw == len).then_some(marks)
}

/// The raw byte an escaped sequence at the start of `esc` stands for, and the sequence's length.
fn unescape(esc: &[u8]) -> (u8, usize) {
    match esc {
        [b'\\', b'u', _, _, hi, lo, ..] => (hex(*hi) << 4 | hex(*lo), 6),
        [b'\\', c, ..] => {
            let raw = match c {
                b'b' => 0x08,
                b't' => b'\t',
                b'n' => b'\n',
                b'f' => 0x0C,
                b'r' => b'\r',
                other => *other, // `"` and `\`
            };
            (raw, 2)
        }
        [b, ..] => (*b, 1),
        [] => (0, 0),
    }
}

fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        _ => c.wrapping_sub(b'a').wrapping_add(10) & 0x0F,
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

impl TextBlock {
    /// The block made of `raw`, whose first byte follows `first_line` newlines in the blob.
    fn build(raw: &[u8], first_line: u64) -> Self {
        let not_text = || Self {
            esc: Bytes::new(),
            marks: Vec::new(),
            first_line,
            newlines: 0,
            text: false,
            head: Piece::default(),
            tail: Piece::default(),
        };
        let head_len = raw.iter().take(4).take_while(|b| is_continuation(**b)).count();
        let cut = utf8_cut(raw);
        let (Some(head), Some(tail)) = (Piece::of(&raw[..head_len]), Piece::of(&raw[cut.max(head_len)..])) else {
            return not_text();
        };
        let Ok(inner) = simdutf8::basic::from_utf8(&raw[head_len..cut.max(head_len)]) else {
            return not_text();
        };
        // sonic-rs reserves six bytes out per byte in; the block keeps only what it wrote.
        let esc = SCRATCH.with_borrow_mut(|out| {
            out.clear();
            out.extend_from_slice(head.as_slice());
            let fmt = &mut sonic_rs::format::CompactFormatter;
            let written = sonic_rs::format::Formatter::write_string_fast(fmt, out, inner, false);
            out.extend_from_slice(tail.as_slice());
            let esc = written.ok().map(|()| Bytes::copy_from_slice(out));
            out.truncate(0);
            out.shrink_to(SCRATCH_KEPT);
            esc
        });
        let Some(esc) = esc else {
            return not_text();
        };
        let Some(marks) = marks_of(&esc, raw.len()) else {
            return not_text();
        };
        let mut block = Self { esc, marks, first_line, newlines: 0, text: true, head, tail };
        block.newlines = block.locate(raw.len()).1;
        block
    }

    /// For raw offset `rel` of the block (up to its length): its offset in `esc` and the
    /// `\n` bytes before it in the block.
    fn locate(&self, rel: usize) -> (usize, u64) {
        self.locate_from(rel, None)
    }

    /// [`TextBlock::locate`], starting from `known` — an earlier answer `(rel, at, newlines)`
    /// for a raw offset at or before `rel` — when that is nearer than `rel`'s mark.
    fn locate_from(&self, rel: usize, known: Option<(usize, usize, u64)>) -> (usize, u64) {
        let mark = rel / MARK;
        let (from, at, newlines) = match known {
            Some((from, at, newlines)) if from <= rel && from >= mark * MARK => (from, at, newlines),
            _ => {
                let (at, newlines) = self.marks[mark];
                (mark * MARK, at as usize, u64::from(newlines))
            }
        };
        let (mut at, mut newlines, mut left) = (at, newlines, rel - from);
        // Every byte of `esc` before the next backslash is one raw byte: jump from escape to escape.
        while left > 0 {
            let ahead = &self.esc[at..(at + left).min(self.esc.len())];
            let Some(plain) = memchr::memchr(b'\\', ahead) else {
                at += ahead.len();
                break;
            };
            at += plain;
            left -= plain;
            if left > 0 {
                let (raw, len) = unescape(&self.esc[at..]);
                newlines += u64::from(raw == b'\n');
                at += len;
                left -= 1;
            }
        }
        (at, newlines)
    }

    /// The raw offset in the block of its `n`-th `\n` (from 1), if it has that many.
    fn nth_newline(&self, n: u64) -> Option<usize> {
        let j = self.marks.partition_point(|&(_, before)| u64::from(before) < n).checked_sub(1)?;
        let (at, before) = self.marks[j];
        let (mut at, mut seen, mut rel) = (at as usize, u64::from(before), j * MARK);
        loop {
            let plain = memchr::memchr(b'\\', self.esc.get(at..)?).unwrap_or(self.esc.len() - at);
            (at, rel) = (at + plain, rel + plain);
            let (raw, len) = unescape(self.esc.get(at..)?);
            if raw == b'\n' {
                seen += 1;
                if seen == n {
                    return Some(rel);
                }
            }
            (at, rel) = (at + len.max(1), rel + 1);
        }
    }

    fn weight(&self) -> u64 {
        (self.esc.len() + self.marks.len() * 8 + 128) as u64
    }
}

/// A block as kept: escaped text, or decoded lossily and escaped (`None`: the blob could not
/// be read in full there; its pages are left to the usual path, which says why).
#[derive(Debug, Clone)]
enum Kept {
    Text(Arc<TextBlock>),
    Lossy(Option<Arc<LossyBlock>>),
}

/// Lossy blocks are kept under their number with this bit set.
const LOSSY_KEY: u64 = 1 << 63;

/// Weighs a block by the memory it holds, so the capacity is in bytes.
#[derive(Clone, Copy, Debug)]
struct ByWeight;

impl quick_cache::Weighter<(Digest, u64), Kept> for ByWeight {
    fn weight(&self, _: &(Digest, u64), block: &Kept) -> u64 {
        match block {
            Kept::Text(b) => b.weight(),
            Kept::Lossy(b) => b.as_ref().map_or(128, |b| b.weight()),
        }
    }
}

/// Escaped blocks of blobs by (digest, block number), at most the capacity in bytes.
pub(crate) struct TextCache {
    blocks: quick_cache::sync::Cache<(Digest, u64), Kept, ByWeight>,
    /// Blocks a page started in once, while not kept: escaping a block costs about three
    /// times what cutting a page from the bytes does, so a block is escaped when a second page
    /// starts in it. An agent reading a log through once (each 100 KB page starts in a
    /// different 64 KiB block) costs what it did before; pages read again come from memory.
    seen: quick_cache::sync::Cache<(Digest, u64), ()>,
    block: u64,
}

/// Blocks remembered as read once (a few megabytes).
const SEEN: usize = 64 << 10;

impl std::fmt::Debug for TextCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextCache({} of {} bytes)", self.blocks.weight(), self.blocks.capacity())
    }
}

/// Where a raw position of a [`Span`] falls in its escaped blocks.
#[derive(Debug, Clone, Copy)]
struct Edge {
    /// `\n` bytes in the blob before it.
    newlines: u64,
    /// Its place in the `esc` of the block of the byte before it: where a piece ends there.
    end_at: usize,
    /// Its place in the `esc` of its own block: where a piece starts there.
    start_at: usize,
    /// Whether a character starts there (or the blob ends).
    boundary: bool,
}

impl Edge {
    fn newlines_to(self, later: Edge) -> usize {
        (later.newlines - self.newlines) as usize
    }
}

/// The blocks a page's bytes lie in, and the positions found in them: what `paging::cut`
/// asks about a page's bytes, answered from the escaped text and its marks.
struct Span {
    /// The blob's size.
    size: u64,
    first: u64,
    block: u64,
    blocks: Vec<Arc<TextBlock>>,
    /// The last position found in the blocks, `(block number, rel, at, newlines)`: cutting a
    /// page asks about the same few places (its start, the bytes before its end) several
    /// times over, and each asks from there, not from its mark.
    found: std::cell::Cell<Option<(u64, usize, usize, u64)>>,
}

impl Span {
    /// The block holding the byte before `pos` (`before`) or at it, and `pos` within it.
    fn at(&self, pos: u64, before: bool) -> (&TextBlock, usize) {
        let k = if before { (pos - 1) / self.block } else { pos / self.block };
        (&self.blocks[(k - self.first) as usize], (pos - k * self.block) as usize)
    }

    fn byte(&self, pos: u64) -> u8 {
        let (b, rel) = self.at(pos, false);
        unescape(&b.esc[self.find(pos, false, b, rel).0..]).0
    }

    /// [`TextBlock::locate`] of `rel` in `b`, the block holding `pos` (`before`: the byte
    /// before it), from the last position found when that is nearer.
    fn find(&self, pos: u64, before: bool, b: &TextBlock, rel: usize) -> (usize, u64) {
        let k = if before { (pos - 1) / self.block } else { pos / self.block };
        let known = self.found.get().filter(|f| f.0 == k).map(|(_, rel, at, newlines)| (rel, at, newlines));
        let (at, newlines) = b.locate_from(rel, known);
        self.found.set(Some((k, rel, at, newlines)));
        (at, newlines)
    }

    /// Where `pos` falls (inside the span, or at the blob's end): [`Span::locate`] both ways
    /// and [`Span::byte`] at once, one step through the escaped text.
    fn edge(&self, pos: u64) -> Edge {
        if pos >= self.size {
            let (newlines, at) = self.locate(pos, true);
            return Edge { newlines, end_at: at, start_at: at, boundary: true };
        }
        let (b, rel) = self.at(pos, false);
        let (start_at, newlines) = self.find(pos, false, b, rel);
        let boundary = !is_continuation(unescape(&b.esc[start_at..]).0);
        let end_at = match rel == 0 && pos > self.first * self.block {
            true => self.locate(pos, true).1,
            false => start_at,
        };
        Edge { newlines: b.first_line + newlines, end_at, start_at, boundary }
    }

    /// Whether `start..stop` is plain UTF-8: it starts a character, the characters cut by block
    /// edges inside it are whole across them, and the blob does not end inside one.
    fn plain(&self, start: u64, stop: u64) -> bool {
        !is_continuation(self.byte(start))
            && self.whole_across_edges(start, stop)
            && (stop < self.size || self.at(stop, true).0.tail.len == 0)
    }

    /// The page `start..stop` (plain text, see [`Span::plain`]).
    fn page(&self, blob: TextBlob<'_>, start: u64, stop: u64, capped: bool) -> EscapedPage {
        let shown = cut::shown(self, blob.lines, start, stop, false, capped);
        let content = self.content(start, self.locate(start, false).1, stop, self.locate(stop, true).1);
        EscapedPage { page: shown.page(Some(blob.digest.to_string()), String::new()), content }
    }

    /// Whether the characters cut by the block edges inside `offset..stop` are whole across them.
    fn whole_across_edges(&self, offset: u64, stop: u64) -> bool {
        (offset / self.block + 1..=(stop - 1) / self.block).all(|k| {
            let edge = k * self.block;
            let (prev, next) = (self.at(edge, true).0, self.at(edge, false).0);
            std::str::from_utf8(&[prev.tail.as_slice(), next.head.as_slice()].concat()).is_ok()
        })
    }

    /// The escaped text from `start` (at `start_at` in its block) to `stop` (at `stop_at` in its block).
    fn content(&self, start: u64, start_at: usize, stop: u64, stop_at: usize) -> Vec<Bytes> {
        let (first, last) = (start / self.block, (stop - 1) / self.block);
        let blocks = self.blocks[(first - self.first) as usize..].iter().zip(first..=last);
        blocks
            .map(|(b, k)| {
                let from = if k == first { start_at } else { 0 };
                b.esc.slice(from..if k == last { stop_at } else { b.esc.len() })
            })
            .collect()
    }

    /// Where the blob's `n`-th `\n` (from 1) is, if it lies in these blocks.
    fn newline(&self, n: u64) -> Option<u64> {
        let (k, b) = (self.first..).zip(&self.blocks).find(|(_, b)| n <= b.first_line + b.newlines)?;
        Some(k * self.block + b.nth_newline(n.checked_sub(b.first_line)?)? as u64)
    }

    /// `\n` bytes in the blob before `pos`, and where `pos` is in its block's `esc`.
    fn locate(&self, pos: u64, before: bool) -> (u64, usize) {
        let (b, rel) = self.at(pos, before);
        let (at, newlines) = self.find(pos, before, b, rel);
        (b.first_line + newlines, at)
    }
}

impl Around for Span {
    fn size(&self) -> u64 {
        self.size
    }

    fn byte(&self, pos: u64) -> u8 {
        Span::byte(self, pos)
    }
}

impl Lines for Span {
    fn newlines_before(&self, pos: u64) -> u64 {
        self.locate(pos, pos > self.first * self.block).0
    }

    fn newline(&self, n: u64) -> Option<u64> {
        Span::newline(self, n)
    }
}

impl TextCache {
    /// A cache of `capacity` bytes; `None` when that is less than one block (no cache).
    pub(crate) fn new(capacity: u64) -> Option<Self> {
        Self::with_block(capacity, BLOCK)
    }

    /// Forgets every block of `digest` (its stored bytes were found damaged, or stored again).
    pub(crate) fn forget(&self, digest: &Digest) {
        self.blocks.retain(|(d, _), _| d != digest);
        self.seen.retain(|(d, _), _| d != digest);
    }

    fn with_block(capacity: u64, block: u64) -> Option<Self> {
        (capacity >= block).then(|| Self {
            blocks: quick_cache::sync::Cache::with_weighter((capacity / block).max(1) as usize, capacity, ByWeight),
            seen: quick_cache::sync::Cache::new(SEEN),
            block,
        })
    }

    /// The byte page `offset`/`limit` of `blob` with its content escaped, cut by `paging::cut`'s
    /// rules as `paging::byte_page` is; `None` when that page is not plain text from these
    /// blocks, or is the first to start in its block (the caller cuts it the usual way).
    /// Missing blocks are read with `fetch` (a range of the blob), escaped and kept.
    pub(crate) async fn byte_page<E>(
        &self,
        blob: TextBlob<'_>,
        offset: u64,
        limit: u64,
        fetch: impl Fetch<E>,
    ) -> Result<Option<EscapedPage>, E> {
        let size = blob.size;
        if offset >= size {
            return Ok(None);
        }
        let end = cut::byte_end_asked(size, offset, limit);
        if !self.admit(blob.digest, offset / self.block) {
            return Ok(None);
        }
        let Some(span) = self.span(blob, offset, end, &fetch).await? else {
            return self.lossy_page(blob, offset, limit, end, &fetch).await;
        };
        match cut::byte_end(&span, offset, end) {
            End::At(stop) if span.plain(offset, stop) => {
                Ok(Some(span.page(blob, offset, stop, cut::byte_capped(size, offset, limit, stop))))
            }
            // Not plain text: it starts inside a character, or one is cut (across a block edge,
            // at the blob's end); not a page shorter than one.
            _ if limit >= 4 => self.lossy_page(blob, offset, limit, end, &fetch).await,
            _ => Ok(None),
        }
    }

    /// The plain page `page` (as [`TextCache::byte_page`] or [`TextCache::line_page`] gave
    /// it) with `secrets` (its raw bytes from `page.offset`, sorted and apart, as
    /// `paging::kept_spans` gives them) shown as marks: the page `paging::byte_page_redacted`
    /// (`line_page_redacted`, with `whole_lines`) cuts, written from the escaped blocks with a
    /// mark in place of each secret — no read, no scan, no escaping of the text. Where marks
    /// make the text pass the cap, the page ends where that cut ends it (before a mark the cap
    /// falls in; after the last whole line before it, for a line page that has one). `None`
    /// when the page is left to those functions (a secret that does not start and end a
    /// character, blocks no longer kept).
    pub(crate) async fn marked_page<E>(
        &self,
        blob: TextBlob<'_>,
        page: &ReadPage,
        secrets: &[spillway_api::redact::Span],
        whole_lines: bool,
        fetch: impl Fetch<E>,
    ) -> Result<Option<EscapedPage>, E> {
        let (offset, mut stop, mut capped) = (page.offset, page.offset + page.length, page.capped);
        if page.lossy || page.length == 0 || secrets.last().is_some_and(|s| s.end as u64 > page.length) {
            return Ok(None);
        }
        let size = blob.size;
        // With the block of the byte after the page: a secret cut at the page's end is a
        // character's edge there if that byte starts one.
        let Some(span) = self.span(blob, offset, (stop + 1).min(size), &fetch).await? else {
            return Ok(None);
        };
        let boundary = |pos: u64| pos >= size || !is_continuation(span.byte(pos));
        // Each secret's edges in the escaped blocks, found once.
        let mut edges = Vec::with_capacity(secrets.len());
        for s in secrets {
            let (from, to) = (span.edge(offset + s.start as u64), span.edge(offset + s.end as u64));
            if s.start >= s.end || !from.boundary || !to.boundary {
                return Ok(None);
            }
            edges.push((from, to));
        }
        let first = span.edge(offset);
        for _ in 0..4 {
            let len = (stop - offset) as usize;
            let last = span.edge(stop);
            // Each secret as a mark: raw bytes `a..b` of the page, the mark's text, and the
            // edges of what it replaces (a mark keeps its newlines).
            let marks: Vec<(usize, usize, &str, Edge, Edge)> = secrets
                .iter()
                .zip(&edges)
                .take_while(|(s, _)| s.start < len)
                .map(|(s, &(from, to))| match s.end <= len {
                    true => (s.start, s.end, &*s.kind, from, to),
                    false => (s.start, len, &*s.kind, from, last),
                })
                .collect();
            let mark_len = |kind: &str, from: Edge, to: Edge| "[REDACTED:]".len() + kind.len() + from.newlines_to(to);
            let shown = marks.iter().fold(len, |n, &(a, b, kind, from, to)| n - (b - a) + mark_len(kind, from, to));
            if shown <= READ_CAP {
                if !span.plain(offset, stop) {
                    return Ok(None);
                }
                let mut out = span.page(blob, offset, stop, capped);
                let (mut content, mut at) = (Vec::with_capacity(2 * marks.len() + 2), (offset, first));
                for &(a, b, kind, from, to) in &marks {
                    let (a, b) = (offset + a as u64, offset + b as u64);
                    if a > at.0 {
                        content.extend(span.content(at.0, at.1.start_at, a, from.end_at));
                    }
                    let Ok(kind) = sonic_rs::to_string(kind) else { return Ok(None) };
                    let mark = format!("[REDACTED:{}]{}", &kind[1..kind.len() - 1], "\\n".repeat(from.newlines_to(to)));
                    content.push(Bytes::from(mark));
                    at = (b, to);
                }
                if stop > at.0 {
                    content.extend(span.content(at.0, at.1.start_at, stop, last.end_at));
                }
                out.content = content;
                out.page.redactions = Some(marks.len() as u64);
                return Ok(Some(out));
            }
            // Cut where the text reaches the cap, as `to_content` cuts it (at the last
            // character that fits), mapped back to the raw bytes as `Redacted::raw_at` maps it
            // (a cut inside a mark, or at its start, is the start of its secret).
            let mut shift = 0isize; // output position minus raw position, after the marks passed
            let mut fell = None;
            for &(a, b, kind, from, to) in &marks {
                let out_start = (a as isize + shift) as usize;
                if READ_CAP < out_start {
                    break;
                }
                let out_end = out_start + mark_len(kind, from, to);
                if READ_CAP < out_end {
                    fell = Some(a);
                    break;
                }
                shift = out_end as isize - b as isize;
            }
            let fell = fell.unwrap_or_else(|| {
                let mut r = (READ_CAP as isize - shift) as usize;
                while r > 0 && !boundary(offset + r as u64) {
                    r -= 1;
                }
                r
            });
            stop = cut::shorter_end(&span, offset, stop, offset + fell as u64, whole_lines);
            capped = true;
        }
        Ok(None)
    }

    /// [`TextCache::byte_page`] where a block of the page is not text: from lossy blocks.
    async fn lossy_page<E>(
        &self,
        blob: TextBlob<'_>,
        offset: u64,
        limit: u64,
        end: u64,
        fetch: &impl Fetch<E>,
    ) -> Result<Option<EscapedPage>, E> {
        // The page ends at or before `end`, a unit's start; its block is the span's last.
        let (first, last) = (offset / self.block, (end / self.block).min((blob.size - 1) / self.block));
        let blocks = (first..=last).map(|k| self.get_lossy_block(blob, k, fetch));
        let blocks = futures::future::try_join_all(blocks).await?;
        let Some(blocks) = blocks.into_iter().collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        Ok(LossySpan { size: blob.size, first, block: self.block, blocks }.page(blob, offset, limit))
    }

    /// The line page `line`/`lines` of `blob` with its content escaped, cut by `paging::cut`'s
    /// rules as `paging::line_page` is; `None` as for [`TextCache::byte_page`].
    pub(crate) async fn line_page<E>(
        &self,
        blob: TextBlob<'_>,
        line: u64,
        lines: u64,
        fetch: impl Fetch<E>,
    ) -> Result<Option<EscapedPage>, E> {
        if line == 0 || lines == 0 || line > blob.lines {
            return Ok(None);
        }
        // The line starts after the blob's `line - 1`-th newline, at most a checkpoint span
        // (one block) past the checkpoint before it.
        let cp = LineIndex::decode(blob.line_index).for_line(line);
        if cp.offset % self.block != 0 || !self.admit(blob.digest, cp.offset / self.block) {
            return Ok(None);
        }
        let start = if line - 1 == cp.newlines {
            cp.offset
        } else {
            let reach = blob.size.min(cp.offset + CHECKPOINT_EVERY);
            match self.span(blob, cp.offset, reach, &fetch).await?.and_then(|near| near.newline(line - 1)) {
                Some(at) => at + 1,
                None => return Ok(None),
            }
        };
        let end = blob.size.min(start + READ_CAP as u64);
        let Some(span) = self.span(blob, start, end, &fetch).await? else {
            return Ok(None);
        };
        let (stop, capped) = cut::line_end(&span, start, line, lines, end);
        if !span.plain(start, stop) {
            return Ok(None);
        }
        Ok(Some(span.page(blob, start, stop, capped)))
    }

    /// Whether a page starting in block `k` may be served from the blocks: the block is kept,
    /// or a page started in it before (see `seen`).
    fn admit(&self, digest: &Digest, k: u64) -> bool {
        let key = (*digest, k);
        if self.blocks.get(&key).is_some() || self.seen.get(&key).is_some() {
            return true;
        }
        self.seen.insert(key, ());
        false
    }

    /// The blocks of `start..end`, all text; `None` if one is not.
    async fn span<E>(
        &self,
        blob: TextBlob<'_>,
        start: u64,
        end: u64,
        fetch: &impl Fetch<E>,
    ) -> Result<Option<Span>, E> {
        let first = start / self.block;
        let blocks = (first..=(end - 1) / self.block).map(|k| self.get_block(blob, k, fetch));
        let blocks = futures::future::try_join_all(blocks).await?;
        Ok(blocks.iter().all(|b| b.text).then_some(Span {
            size: blob.size,
            first,
            block: self.block,
            blocks,
            found: std::cell::Cell::new(None),
        }))
    }

    /// `fetch(range)`, and the blob's newlines before `range.start` (counted from the
    /// checkpoint before it, read as well); `None` if the read came back short.
    async fn read_counted<E>(
        &self,
        blob: TextBlob<'_>,
        range: Range<u64>,
        fetch: &impl Fetch<E>,
    ) -> Result<Option<(Bytes, u64)>, E> {
        let cp = LineIndex::decode(blob.line_index).for_offset(range.start);
        let raw = fetch(cp.offset..range.end).await?;
        if raw.len() as u64 != range.end - cp.offset {
            return Ok(None); // a short read: nothing kept that the usual path would not say
        }
        let before = &raw[..(range.start - cp.offset) as usize];
        let newlines = cp.newlines + memchr::memchr_iter(b'\n', before).count() as u64;
        Ok(Some((raw.slice((range.start - cp.offset) as usize..), newlines)))
    }

    /// Lossy block `k` of `blob`, from the cache or read and decoded now.
    async fn get_lossy_block<E>(
        &self,
        blob: TextBlob<'_>,
        k: u64,
        fetch: &impl Fetch<E>,
    ) -> Result<Option<Arc<LossyBlock>>, E> {
        let key = (*blob.digest, k | LOSSY_KEY);
        let kept = self.blocks.get_or_insert_async(&key, async {
            let (start, stop) = (k * self.block, ((k + 1) * self.block).min(blob.size));
            let from = start.saturating_sub(CONTEXT);
            let read = self.read_counted(blob, from..(stop + CONTEXT).min(blob.size), fetch).await?;
            Ok(Kept::Lossy(read.map(|(raw, newlines)| {
                let lead = (start - from) as usize;
                let first_line = newlines + memchr::memchr_iter(b'\n', &raw[..lead]).count() as u64;
                Arc::new(LossyBlock::build(raw, lead, (stop - start) as usize, first_line))
            })))
        });
        Ok(match kept.await? {
            Kept::Lossy(b) => b,
            Kept::Text(_) => None,
        })
    }

    /// Block `k` of `blob`, from the cache or read, escaped and kept now (once, however many
    /// readers ask for it at the same time).
    async fn get_block<E>(&self, blob: TextBlob<'_>, k: u64, fetch: &impl Fetch<E>) -> Result<Arc<TextBlock>, E> {
        let key = (*blob.digest, k);
        let kept = self.blocks.get_or_insert_async(&key, async {
            let (start, stop) = (k * self.block, ((k + 1) * self.block).min(blob.size));
            Ok(Kept::Text(Arc::new(match self.read_counted(blob, start..stop, fetch).await? {
                Some((raw, first_line)) => TextBlock::build(&raw, first_line),
                None => TextBlock::build(&[0xFF], 0), // not text: left to the usual path
            })))
        });
        Ok(match kept.await? {
            Kept::Text(b) => b,
            Kept::Lossy(_) => Arc::new(TextBlock::build(&[0xFF], 0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blobs::source::PageAsk;
    use crate::http::json::{EscapedJson, PageJson};
    use axum::response::IntoResponse;
    use proptest::prelude::*;
    use spillway_api::paging::lines::LineIndexBuilder;
    use spillway_api::paging::{byte_page, line_page, MemorySource, Source};
    use spillway_api::ReadPage;

    /// The page as `byte_page` cuts it and `PageJson` writes it, and as the cache writes it
    /// (`None` when the cache leaves it to the usual path).
    fn both(data: &[u8], cache: &TextCache, offset: u64, limit: u64) -> (Vec<u8>, Option<Vec<u8>>) {
        both_of(data, cache, PageAsk::Bytes { offset, limit })
    }

    fn both_of(data: &[u8], cache: &TextCache, ask: PageAsk) -> (Vec<u8>, Option<Vec<u8>>) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = Bytes::copy_from_slice(data);
        let src = MemorySource::new(bytes.clone());
        let mut b = LineIndexBuilder::default();
        b.update(data);
        let (lines, index) = (b.lines(), b.finish());
        let digest = Digest::of(data);
        let slow = match ask {
            PageAsk::Bytes { offset, limit } => rt.block_on(byte_page(&src, offset, limit)).unwrap(),
            PageAsk::Lines { line, lines } => rt.block_on(line_page(&src, line, lines)).unwrap(),
        };
        let mut slow = spillway_api::ReadPage { digest: Some(digest.to_string()), ..slow };
        slow.total_lines = lines;
        let blob = TextBlob { digest: &digest, size: data.len() as u64, lines, line_index: &index.encode() };
        let fetch = |r: Range<u64>| {
            let part = bytes.slice(r.start as usize..r.end as usize);
            async move { Ok::<_, std::convert::Infallible>(part) }
        };
        let ask_cache = || match ask {
            PageAsk::Bytes { offset, limit } => rt.block_on(cache.byte_page(blob, offset, limit, fetch)).unwrap(),
            PageAsk::Lines { line, lines } => rt.block_on(cache.line_page(blob, line, lines, fetch)).unwrap(),
        };
        let fast = ask_cache().or_else(ask_cache);
        let body = |r: axum::response::Response| {
            let len = r.headers().get("content-length").map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
            let body = rt.block_on(axum::body::to_bytes(r.into_body(), usize::MAX)).unwrap().to_vec();
            assert_eq!(len.unwrap_or(body.len()), body.len());
            body
        };
        let fast = fast.map(|p| body(EscapedJson(p).into_response()));
        (body(PageJson(slow).into_response()), fast)
    }

    fn text() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            6 => "[a-z ]{0,40}\n".prop_map(String::into_bytes),
            2 => "[\"\\\\\t\r\\x00-\\x1f\\x7f]{1,4}".prop_map(String::into_bytes),
            2 => "[é€😀ñ]{1,5}".prop_map(String::into_bytes),
            1 => proptest::collection::vec(any::<u8>(), 1..3),
        ];
        proptest::collection::vec(piece, 0..60).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn pages_from_escaped_blocks_are_the_usual_pages_byte_for_byte(
            data in text(), block in prop_oneof![Just(8u64), Just(64), Just(300), Just(4096)],
            at in 0usize..1000, limit in prop_oneof![1u64..12, 1u64..400, Just(100_000), Just(200_000)],
        ) {
            let cache = TextCache::with_block(1 << 20, block).unwrap();
            let offset = (at % (data.len() + 1)) as u64;
            let (slow, fast) = both(&data, &cache, offset, limit);
            if let Some(fast) = fast {
                prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&slow));
            }
            if offset < data.len() as u64 && data.is_ascii() {
                let (_, again) = both(&data, &cache, offset, limit);
                prop_assert!(again.is_some(), "plain ASCII is always served from the blocks");
            }
        }

        #[test]
        fn line_pages_from_escaped_blocks_are_the_usual_pages_byte_for_byte(
            data in text(), block in prop_oneof![Just(8u64), Just(64), Just(300), Just(4096)],
            at in 0u64..200, lines in prop_oneof![1u64..5, Just(40), Just(2000)],
        ) {
            let cache = TextCache::with_block(1 << 20, block).unwrap();
            let total = MemorySource::new(Bytes::from(data.clone())).total_lines();
            let line = 1 + at % (total + 1);
            let (slow, fast) = both_of(&data, &cache, PageAsk::Lines { line, lines });
            if let Some(fast) = fast {
                prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&slow));
            }
            if line <= total && data.is_ascii() {
                let (_, again) = both_of(&data, &cache, PageAsk::Lines { line, lines });
                prop_assert!(again.is_some(), "plain ASCII is always served from the blocks");
            }
        }
    }

    #[test]
    fn every_page_of_a_log_comes_from_the_blocks_and_reads_the_same() {
        let log: Vec<u8> =
            (0..3000).flat_map(|i| format!("{i} \"é\" \\ line\t{}\n", "x".repeat(i % 120)).into_bytes()).collect();
        let cache = TextCache::with_block(1 << 24, 4096).unwrap();
        for offset in (0..log.len() as u64).step_by(997) {
            for limit in [1, 100, 5000, 100_000, 300_000] {
                let (slow, fast) = both(&log, &cache, offset, limit);
                if limit == 1 && log[offset as usize] >= 0x80 {
                    assert!(fast.is_none(), "a limit shorter than a character is left to byte_page");
                    continue;
                }
                assert_eq!(fast.as_deref(), Some(&slow[..]), "offset {offset} limit {limit}");
            }
        }
        // Full-size blocks too (marks on every 256 bytes), and line pages across checkpoints.
        let cache = TextCache::new(1 << 24).unwrap();
        let (slow, fast) = both(&log, &cache, 70_001, 100_000);
        assert_eq!(fast.as_deref(), Some(&slow[..]));
        for cache in [TextCache::new(1 << 24).unwrap(), TextCache::with_block(1 << 24, 4096).unwrap()] {
            for line in (1..=3000).step_by(97).chain([1500, 2999, 3000]) {
                for lines in [1, 7, 2000] {
                    let (slow, fast) = both_of(&log, &cache, PageAsk::Lines { line, lines });
                    assert_eq!(fast.as_deref(), Some(&slow[..]), "line {line} lines {lines}");
                }
            }
        }
    }

    #[tokio::test]
    async fn a_block_is_escaped_when_a_second_page_starts_in_it() {
        let data = Bytes::from("some log line\n".repeat(1000));
        let index = {
            let mut b = LineIndexBuilder::default();
            b.update(&data);
            b.finish().encode()
        };
        let d = Digest::of(&data);
        let blob = TextBlob { digest: &d, size: data.len() as u64, lines: 1000, line_index: &index };
        let fetches = std::sync::atomic::AtomicUsize::new(0);
        let fetch = |r: Range<u64>| {
            fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let part = data.slice(r.start as usize..r.end as usize);
            async move { Ok::<_, std::convert::Infallible>(part) }
        };
        let cache = TextCache::with_block(1 << 20, 1024).unwrap();
        for offset in [0, 1024, 2048] {
            assert!(cache.byte_page(blob, offset, 2000, fetch).await.unwrap().is_none(), "first page in its block");
        }
        assert_eq!(fetches.load(std::sync::atomic::Ordering::Relaxed), 0, "nothing read or escaped for them");
        let again = cache.byte_page(blob, 1030, 2000, fetch).await.unwrap().expect("a second page in block 1");
        assert_eq!(again.page.offset, 1030);
        assert_eq!(fetches.load(std::sync::atomic::Ordering::Relaxed), 2, "blocks 1 and 2 escaped");
        assert!(cache.byte_page(blob, 2100, 10, fetch).await.unwrap().is_some(), "block 2 is kept");
        assert_eq!(fetches.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    /// Bytes of every kind: invalid sequences, continuation and lead bytes, text, newlines.
    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => any::<u8>(),
            2 => 0x80u8..=0xBF,
            2 => 0xC0u8..=0xFF,
            1 => Just(b'\n'),
            1 => Just(b'"'),
        ];
        let piece = prop_oneof![
            4 => proptest::collection::vec(byte, 0..40),
            2 => "\\PC{0,20}\n?".prop_map(String::into_bytes),
        ];
        proptest::collection::vec(piece, 0..80).prop_map(|v| v.concat())
    }

    fn lossy(page: &[u8]) -> bool {
        sonic_rs::from_slice::<ReadPage>(page).unwrap().lossy
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn lossy_pages_from_decoded_blocks_are_the_usual_pages_byte_for_byte(
            data in bytes(), block in prop_oneof![Just(8u64), Just(64), Just(300), Just(4096)],
            at in 0usize..4000, limit in prop_oneof![1u64..12, 1u64..400, Just(100_000), Just(200_000)],
        ) {
            let cache = TextCache::with_block(1 << 20, block).unwrap();
            let offset = (at % (data.len() + 1)) as u64;
            let (slow, fast) = both(&data, &cache, offset, limit);
            if let Some(fast) = &fast {
                prop_assert_eq!(String::from_utf8_lossy(fast), String::from_utf8_lossy(&slow));
            }
            let strays = data.iter().skip(offset as usize).take_while(|b| is_continuation(**b)).count();
            if (offset as usize) < data.len() && strays <= 16 && limit >= 4 && lossy(&slow) {
                prop_assert!(fast.is_some(), "a lossy page is served from the blocks");
            }
        }
    }

    /// Every short blob of the bytes at UTF-8's edges, every page of it, full-size blocks.
    #[test]
    fn every_page_of_every_short_blob_reads_the_same() {
        const BYTES: [u8; 7] = [b'A', b'\n', 0x80, 0xC3, 0xE2, 0xF0, 0xFF];
        let cache = TextCache::new(1 << 24).unwrap();
        for len in 1..=4u32 {
            for n in 0..7usize.pow(len) {
                let data: Vec<u8> = (0..len).map(|i| BYTES[n / 7usize.pow(i) % 7]).collect();
                for offset in 0..data.len() as u64 {
                    for limit in [1, 2, 3, 4, 5, 100_000] {
                        let (slow, fast) = both(&data, &cache, offset, limit);
                        if let Some(fast) = fast {
                            assert_eq!(fast, slow, "{data:x?} offset {offset} limit {limit}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn capped_lossy_pages_of_random_bytes_read_the_same() {
        // Random bytes with a line of text now and then: the cap, counted in
        // decoded bytes, cuts every 100 KB page at about 50 KB of input.
        let mut data = vec![0u8; 300_000];
        rand::RngCore::fill_bytes(&mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7), &mut data);
        for at in (0..data.len() - 100).step_by(7919) {
            data[at..at + 11].copy_from_slice(b"a line \"x\"\n");
        }
        for cache in [TextCache::new(1 << 24).unwrap(), TextCache::with_block(1 << 24, 4096).unwrap()] {
            let mut served = 0;
            for offset in (0..data.len() as u64).step_by(9973).chain([65_535, 65_536, 65_537, 299_990]) {
                for limit in [4, 5000, 100_000, 300_000] {
                    let (slow, fast) = both(&data, &cache, offset, limit);
                    assert_eq!(fast.as_deref(), Some(&slow[..]), "offset {offset} limit {limit}");
                    served += 1;
                }
            }
            assert!(served > 50, "{served}");
        }
        // A page whose decoded text is exactly the cap is whole, not capped.
        let exact = [&[0xFF][..], &b"a".repeat(READ_CAP + 10)].concat();
        for block in [4096, BLOCK] {
            let cache = TextCache::with_block(1 << 24, block).unwrap();
            let (slow, fast) = both(&exact, &cache, 0, READ_CAP as u64 - 2);
            assert!(!sonic_rs::from_slice::<ReadPage>(&slow).unwrap().capped);
            assert_eq!(fast.as_deref(), Some(&slow[..]));
        }
        // Text around one bad byte: the blocks that hold only text serve text pages.
        let mut text = b"plain text\n".repeat(100);
        text[500] = 0xFF;
        let cache = TextCache::with_block(1 << 20, 256).unwrap();
        let (slow, fast) = both(&text, &cache, 400, 200);
        assert!(lossy(&slow) && fast.as_deref() == Some(&slow[..]), "the page with the bad byte");
        let (slow, fast) = both(&text, &cache, 0, 100);
        assert!(!lossy(&slow) && fast.as_deref() == Some(&slow[..]), "a page before it");
    }

    #[test]
    fn unescape_reads_back_what_the_escaper_wrote() {
        for b in 0..0x80u8 {
            let escaped = sonic_rs::to_string(&char::from(b).to_string()).unwrap();
            assert_eq!(unescape(&escaped.as_bytes()[1..]), (b, escaped.len() - 2), "byte {b:#x}");
        }
    }

    #[test]
    fn marks_fall_on_their_raw_offsets() {
        let raw: String =
            (0..3000u32).map(|i| ['a', '\n', '"', '\u{1}', '\\', 'b'][(i * 7 % 11 % 6) as usize]).collect();
        let escaped = sonic_rs::to_string(&raw).unwrap();
        let esc = &escaped.as_bytes()[1..escaped.len() - 1];
        let marks = marks_of(esc, raw.len()).unwrap();
        assert_eq!(marks.len(), raw.len() / MARK + 1);
        for (j, (at, newlines)) in marks.iter().enumerate() {
            let before = &raw[..j * MARK];
            let want = sonic_rs::to_string(before).unwrap().len() - 2;
            assert_eq!((*at as usize, *newlines as usize), (want, before.matches('\n').count()), "mark {j}");
        }
        assert!(marks_of(esc, raw.len() + 1).is_none(), "text of another length");
    }

    #[test]
    fn a_position_found_from_an_earlier_one_is_the_one_found_from_its_mark() {
        let raw: String =
            (0..3000u32).map(|i| ['a', '\n', '"', '\u{1}', '\\', 'b'][(i * 7 % 11 % 6) as usize]).collect();
        let block = TextBlock::build(raw.as_bytes(), 0);
        assert!(block.text);
        for from in (0..=raw.len()).step_by(37) {
            let (at, newlines) = block.locate(from);
            for rel in from..(from + 2 * MARK).min(raw.len() + 1) {
                let want = block.locate(rel);
                assert_eq!(block.locate_from(rel, Some((from, at, newlines))), want, "{rel} from {from}");
            }
            // An earlier answer for a position after the one asked is not used.
            if from > 0 {
                assert_eq!(block.locate_from(from - 1, Some((from, at, newlines))), block.locate(from - 1));
            }
        }
    }

    /// A log with secrets of every kind (PEM blocks included) and some text to escape, dense
    /// enough that marks longer than their secrets make many pages pass the cap.
    fn log_with_secrets() -> Vec<u8> {
        use spillway_api::redact::samples::SAMPLES;
        let mut text = String::new();
        let mut i = 0usize;
        while text.len() < 700_000 {
            i += 1;
            match i % 9 {
                0 => text.push_str(SAMPLES[i / 9 % SAMPLES.len()].1),
                4 => text.push_str("password=a token=\"b\"\tté€ 😀"),
                _ => text.push_str(&format!(
                    "2026-12-02T10:00:{:02}Z INFO svc-{} path=/v1/items/{i} status=200",
                    i % 60,
                    i % 7
                )),
            }
            text.push('\n');
        }
        text.into_bytes()
    }

    #[test]
    fn marked_pages_from_escaped_blocks_are_the_redacted_pages_byte_for_byte() {
        use spillway_api::paging::{byte_page_redacted, kept_spans, line_page_redacted};
        let detector = spillway_api::redact::Detector::builtin();
        let data = log_with_secrets();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = Bytes::from(data.clone());
        let plain = MemorySource::new(bytes.clone());
        let keeping = MemorySource::new(bytes.clone()).with_secrets_by_block();
        let (lines, index) = (plain.total_lines(), {
            let mut b = LineIndexBuilder::default();
            b.update(&data);
            b.finish().encode()
        });
        let digest = Digest::of(&data);
        let blob = TextBlob { digest: &digest, size: data.len() as u64, lines, line_index: &index };
        let fetch = |r: Range<u64>| {
            let part = bytes.slice(r.start as usize..r.end as usize);
            async move { Ok::<_, std::convert::Infallible>(part) }
        };
        let body = |r: axum::response::Response| rt.block_on(axum::body::to_bytes(r.into_body(), usize::MAX)).unwrap();
        let (mut served, mut shortened, mut asked) = (0, 0, 0);
        let mut seed = 7u64;
        let secrets = detector.find(&data);
        let mut at_edges = 0;
        for block in [4096, BLOCK] {
            let cache = TextCache::with_block(8 << 20, block).unwrap();
            // Block edges inside a secret: a page ending there has its last mark cut by the
            // page's end, the byte after it in the next block.
            let edges: Vec<u64> = secrets
                .iter()
                .map(|s| (s.start as u64 / block + 1) * block)
                .filter(|&e| secrets.iter().any(|s| (s.start as u64) < e && e < s.end as u64))
                .collect();
            for (limit, by_lines) in
                [1u64, 5, 64, 1000, 100_000, 200_000].into_iter().flat_map(|l| [(l, false), (l, true)])
            {
                let ending_at_edges = edges.iter().filter(|&&e| !by_lines && e >= limit).map(|&e| (e - limit, 1));
                let random = (0..25).map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 33) % data.len() as u64, 1 + (seed >> 33) % lines)
                });
                let asks: Vec<(u64, u64)> = random.collect::<Vec<_>>().into_iter().chain(ending_at_edges).collect();
                for (offset, line) in asks {
                    asked += 1;
                    let slow = match by_lines {
                        false => rt.block_on(byte_page_redacted(&plain, offset, limit, detector)),
                        true => rt.block_on(line_page_redacted(&plain, line, limit, detector)),
                    };
                    let slow = ReadPage { digest: Some(digest.to_string()), total_lines: lines, ..slow.unwrap() };
                    let plain_page = || match by_lines {
                        false => rt.block_on(cache.byte_page(blob, offset, limit, fetch)).unwrap(),
                        true => rt.block_on(cache.line_page(blob, line, limit, fetch)).unwrap(),
                    };
                    let Some(page) = plain_page().or_else(plain_page) else { continue };
                    let (lo, hi) = (page.page.offset, page.page.offset + page.page.length);
                    let spans = rt.block_on(kept_spans(&keeping, detector, lo, hi)).unwrap().unwrap();
                    let marked = cache.marked_page(blob, &page.page, &spans, by_lines, fetch);
                    let Some(fast) = rt.block_on(marked).unwrap() else { continue };
                    served += 1;
                    let cut_at_edge =
                        hi % block == 0 && secrets.iter().any(|s| (s.start as u64) < hi && hi < s.end as u64);
                    at_edges += usize::from(cut_at_edge);
                    shortened += usize::from(slow.length < page.page.length);
                    let (slow, fast) = (body(PageJson(slow).into_response()), body(EscapedJson(fast).into_response()));
                    let (slow, fast) = (String::from_utf8_lossy(&slow), String::from_utf8_lossy(&fast));
                    assert_eq!(
                        fast, slow,
                        "offset {offset}, line {line}, limit {limit}, by lines {by_lines}, block {block}"
                    );
                }
            }
        }
        assert!(served * 10 >= asked * 8, "most pages come from the blocks: {served} of {asked}");
        assert!(shortened >= 10, "marks made pages shorter: {shortened}");
        assert!(at_edges >= 10, "pages ending at a block's edge inside a secret: {at_edges}");
    }
}

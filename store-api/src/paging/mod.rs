//! The capped read API and grep, over any source of bytes with a line index (a stored blob,
//! a stream so far, a local spill file). The cutting rules live here, shared by the server
//! and the client's `--local` mode; sources only hand out byte ranges.

pub mod lines;

use async_trait::async_trait;
use bytes::Bytes;
use regex::bytes::Regex;

use crate::{GrepMatch, GrepResponse, ReadPage, READ_CAP};
use lines::Checkpoint;

/// Why a page could not be cut.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
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
    /// The source failed to hand out bytes.
    #[error(transparent)]
    Source(Box<dyn std::error::Error + Send + Sync>),
}

/// Result of paging operations.
pub type PageResult<T> = Result<T, PageError>;

/// How much of a source one step of grep reads at a time.
const WINDOW: u64 = 1 << 20;
/// How much one step of a line search reads: about two checkpoint spans.
const LINE_WINDOW: u64 = 128 << 10;
/// Most bytes one grep call scans before it answers with a `next_line` to resume from.
const GREP_SCAN_LIMIT: u64 = 256 << 20;
/// A matching line longer than this is shortened around the match.
const GREP_LINE_MAX: usize = 4096;

/// Something the read API can page through.
#[async_trait]
pub trait Source: Send + Sync {
    /// Bytes available now.
    fn size(&self) -> u64;
    /// Lines as the contract counts them.
    fn total_lines(&self) -> u64;
    /// The blob's digest, if it is one.
    fn digest(&self) -> Option<String>;
    /// The last checkpoint at or before `offset`.
    async fn checkpoint_for_offset(&self, offset: u64) -> PageResult<Checkpoint>;
    /// The last checkpoint at or before the start of `line`.
    async fn checkpoint_for_line(&self, line: u64) -> PageResult<Checkpoint>;
    /// Bytes `start..end` (both within `size`).
    async fn read(&self, start: u64, end: u64) -> PageResult<Bytes>;
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

/// Turns raw bytes into content of at most [`READ_CAP`] bytes. Returns the text, how many raw
/// bytes it covers, and whether invalid UTF-8 was replaced (replacement can grow the text).
pub fn to_content(raw: &[u8]) -> (String, usize, bool) {
    let mut used = raw.len();
    loop {
        match std::str::from_utf8(&raw[..used]) {
            Ok(s) => return (s.to_owned(), used, false),
            Err(_) => {
                let text = String::from_utf8_lossy(&raw[..used]).into_owned();
                if text.len() <= READ_CAP {
                    return (text, used, true);
                }
                let shrink = (text.len() - READ_CAP).max(1);
                used = utf8_cut(&raw[..used.saturating_sub(shrink)]);
            }
        }
    }
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
async fn read_checked(src: &dyn Source, start: u64, end: u64) -> PageResult<Bytes> {
    let buf = src.read(start, end).await?;
    if buf.len() as u64 != end - start {
        let msg = format!("short read: {} of {} bytes at {start}", buf.len(), end - start);
        return Err(PageError::Source(msg.into()));
    }
    Ok(buf)
}

fn newlines(data: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', data).count() as u64
}

fn past_end(message: String, size: u64) -> PageError {
    PageError::RangeNotSatisfiable { message, size }
}

/// A byte page: `offset`, up to `limit` bytes (capped at [`READ_CAP`]).
pub async fn byte_page(src: &dyn Source, offset: u64, limit: u64) -> PageResult<ReadPage> {
    let size = src.size();
    if offset > size {
        return Err(past_end(format!("offset {offset} is past the end ({size} bytes)"), size));
    }
    let want = limit.clamp(1, READ_CAP as u64);
    let end = size.min(offset.saturating_add(want));
    let cp = src.checkpoint_for_offset(offset).await?;
    // Three bytes past the end tell whether the last character is whole.
    let buf = read_checked(src, cp.offset, size.min(end + 3)).await?;
    let (pre, ahead) = buf.split_at((offset - cp.offset) as usize);
    let raw = &ahead[..(end - offset) as usize];
    let raw = match utf8_cut(raw) {
        n if n == raw.len() || end == size => raw,
        0 => &ahead[..char_width(raw[0]).min(ahead.len())], // a limit smaller than one character
        n => &raw[..n],
    };
    let (content, used, lossy) = to_content(raw);
    let start_line = 1 + cp.newlines + newlines(pre);
    let shown = &raw[..used];
    let page_end = offset + used as u64;
    let eof = page_end == size;
    let ends_line = shown.last() == Some(&b'\n');
    let end_line = start_line + newlines(&shown[..used.saturating_sub(1)]);
    Ok(ReadPage {
        digest: src.digest(),
        total_size: size,
        total_lines: src.total_lines(),
        offset,
        length: used as u64,
        next_offset: (!eof).then_some(page_end),
        eof,
        start_line,
        end_line,
        next_line: (!eof).then_some(if ends_line { end_line + 1 } else { end_line }),
        capped: !eof && limit >= READ_CAP as u64 && page_end - offset + 4 >= READ_CAP as u64,
        lossy,
        content,
    })
}

/// Byte offset where 1-based `line` starts (`size` for the line after the last).
async fn line_start(src: &dyn Source, line: u64) -> PageResult<u64> {
    let size = src.size();
    let cp = src.checkpoint_for_line(line).await?;
    let mut skip = line - 1 - cp.newlines;
    let mut pos = cp.offset;
    while skip > 0 && pos < size {
        let buf = read_checked(src, pos, size.min(pos + LINE_WINDOW)).await?;
        let mut found = None;
        for (n, i) in memchr::memchr_iter(b'\n', &buf).enumerate() {
            if n as u64 + 1 == skip {
                found = Some(i);
                break;
            }
        }
        match found {
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
async fn locate_page(src: &dyn Source, line: u64) -> PageResult<(u64, Bytes)> {
    let size = src.size();
    let cp = src.checkpoint_for_line(line).await?;
    let skip = line - 1 - cp.newlines;
    let span = if skip == 0 { 0 } else { lines::CHECKPOINT_EVERY };
    let first_end = size.min(cp.offset + span + READ_CAP as u64);
    let buf = read_checked(src, cp.offset, first_end).await?;
    let found =
        if skip == 0 { Some(0) } else { memchr::memchr_iter(b'\n', &buf).nth((skip - 1) as usize).map(|i| i + 1) };
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
pub async fn line_page(src: &dyn Source, line: u64, lines: u64) -> PageResult<ReadPage> {
    let total_lines = src.total_lines();
    let size = src.size();
    if line == 0 || lines == 0 {
        return Err(PageError::InvalidArgument("line and lines start at 1".into()));
    }
    if line > total_lines + 1 {
        return Err(past_end(format!("line {line} is past the end ({total_lines} lines)"), size));
    }
    let (start, window) = locate_page(src, line).await?;
    let end = start + window.len() as u64;
    let mut taken = 0u64;
    let mut len = 0usize;
    for i in memchr::memchr_iter(b'\n', &window) {
        taken += 1;
        len = i + 1;
        if taken == lines {
            break;
        }
    }
    let mut capped = false;
    if taken < lines && len < window.len() {
        if end == size {
            taken += 1; // the last line, without a final newline
            len = window.len();
        } else if taken == 0 {
            len = utf8_cut(&window).max(1); // one line longer than the cap: go on by bytes
            taken = 1;
            capped = true;
        } else {
            capped = true;
        }
    }
    let (content, used, lossy) = to_content(&window[..len]);
    let page_end = start + used as u64;
    let eof = page_end == size;
    let mut next_line = line + taken;
    if used < len {
        next_line = line + newlines(&window[..used]);
    }
    Ok(ReadPage {
        digest: src.digest(),
        total_size: size,
        total_lines,
        offset: start,
        length: used as u64,
        next_offset: (!eof).then_some(page_end),
        eof,
        start_line: line,
        end_line: (line + taken).saturating_sub(1).max(line),
        next_line: (!eof).then_some(next_line),
        capped,
        lossy,
        content,
    })
}

/// What a grep call asks for.
#[derive(Debug)]
pub struct GrepRequest<'a> {
    /// The compiled pattern.
    pub regex: &'a Regex,
    /// 1-based line to start at.
    pub from_line: u64,
    /// Most matches to return.
    pub max_matches: usize,
}

fn shorten(line: &[u8], match_at: usize) -> (String, bool) {
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

/// Matching lines in order, capped at [`READ_CAP`] bytes of text and `max_matches`.
pub async fn grep(src: &dyn Source, req: GrepRequest<'_>) -> PageResult<GrepResponse> {
    let size = src.size();
    let total_lines = src.total_lines();
    if req.from_line == 0 {
        return Err(PageError::InvalidArgument("from_line starts at 1".into()));
    }
    if req.from_line > total_lines + 1 {
        return Err(past_end(format!("from_line {} is past the end ({total_lines} lines)", req.from_line), size));
    }
    let mut out = GrepResponse { matches: Vec::new(), next_line: None, capped: false };
    let mut text_bytes = 0usize;
    let mut pos = line_start(src, req.from_line).await?;
    let scan_end = size.min(pos.saturating_add(GREP_SCAN_LIMIT));
    let mut cur_line = req.from_line;
    while pos < size {
        if pos >= scan_end {
            out.next_line = Some(cur_line);
            out.capped = true;
            return Ok(out);
        }
        let buf = read_checked(src, pos, size.min(pos + WINDOW)).await?;
        let at_eof = pos + buf.len() as u64 == size;
        let usable = if at_eof { buf.len() } else { memchr::memrchr(b'\n', &buf).map_or(buf.len(), |i| i + 1) };
        let hay = &buf[..usable];
        let (mut at, mut counted) = (0usize, 0usize);
        while at < usable {
            let Some(m) = req.regex.find_at(hay, at) else {
                break;
            };
            let ls = memchr::memrchr(b'\n', &hay[..m.start()]).map_or(0, |i| i + 1);
            let le = memchr::memchr(b'\n', &hay[m.start()..]).map_or(usable, |i| m.start() + i);
            cur_line += newlines(&hay[counted..ls]);
            counted = ls;
            at = le + 1;
            if out.matches.last().is_some_and(|last| last.line == cur_line) {
                continue; // the same over-long line, continued from the previous window
            }
            let (text, shortened) = shorten(&hay[ls..le], m.start() - ls);
            if text_bytes + text.len() > READ_CAP {
                out.next_line = Some(cur_line);
                out.capped = true;
                return Ok(out);
            }
            text_bytes += text.len();
            out.matches.push(GrepMatch { line: cur_line, text, shortened });
            if out.matches.len() >= req.max_matches {
                let next = cur_line + 1;
                let more = (pos + le as u64 + 1) < size;
                out.next_line = more.then_some(next);
                out.capped = more;
                return Ok(out);
            }
        }
        cur_line += newlines(&hay[counted..]);
        pos += usable as u64;
    }
    Ok(out)
}

/// An output held in memory, paged with the same rules as a stored blob (a tool that has its
/// whole output at hand can serve "read page N" itself).
#[derive(Debug, Clone)]
pub struct MemorySource {
    data: Bytes,
    index: lines::LineIndex,
    lines: u64,
}

impl MemorySource {
    /// Indexes `data` once.
    pub fn new(data: Bytes) -> Self {
        let mut b = lines::LineIndexBuilder::default();
        b.update(&data);
        let lines = b.lines();
        Self { data, index: b.finish(), lines }
    }
}

#[async_trait]
impl Source for MemorySource {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }
    fn total_lines(&self) -> u64 {
        self.lines
    }
    fn digest(&self) -> Option<String> {
        None
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> PageResult<Checkpoint> {
        Ok(self.index.for_offset(offset))
    }
    async fn checkpoint_for_line(&self, line: u64) -> PageResult<Checkpoint> {
        Ok(self.index.for_line(line))
    }
    async fn read(&self, start: u64, end: u64) -> PageResult<Bytes> {
        Ok(self.data.slice(start as usize..end as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn text_strategy() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop_oneof![Just("\n".to_string()), "[a-zé€😀 ]{0,40}"], 0..400)
            .prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
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

    #[test]
    fn long_line_goes_on_by_bytes() {
        let mut data = vec![b'x'; 250_000];
        data.push(b'\n');
        data.extend_from_slice(b"tail\n");
        let src = Mem::new_vec(data);
        let p = block_on(line_page(&src, 1, 10)).unwrap();
        assert_eq!(p.length, READ_CAP as u64);
        assert_eq!(p.next_offset, Some(READ_CAP as u64));
        assert_eq!(p.next_line, Some(2));
        assert!(p.capped);
        let p2 = block_on(line_page(&src, 2, 10)).unwrap();
        assert_eq!(p2.content, "tail\n");
        assert!(p2.eof);
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

    #[test]
    fn grep_finds_lines_in_order_and_resumes() {
        let text: String =
            (1..=50_000).map(|i| format!("row {i} {}\n", if i % 1000 == 0 { "ERROR" } else { "ok" })).collect();
        let src = Mem::new_vec(text.into_bytes());
        let re = Regex::new("ERROR").unwrap();
        let r = block_on(grep(&src, GrepRequest { regex: &re, from_line: 1, max_matches: 10 })).unwrap();
        let lines: Vec<u64> = r.matches.iter().map(|m| m.line).collect();
        assert_eq!(lines, (1..=10).map(|i| i * 1000).collect::<Vec<_>>());
        assert_eq!(r.next_line, Some(10_001));
        let r = block_on(grep(&src, GrepRequest { regex: &re, from_line: 10_001, max_matches: 1000 })).unwrap();
        assert_eq!(r.matches.len(), 40);
        assert_eq!(r.next_line, None);
        assert_eq!(r.matches[0].text, "row 11000 ERROR");
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

//! Pages of an output's last lines (`tail_lines`): the window an agent asks for when what it
//! needs is at the end (the failing test, the last error), over an output that is always saved.

use super::{line_page, read_checked, to_content, PageError, PageResult, Source, SourceError};
use crate::{ReadPage, READ_CAP};

/// The most lines a tail may ask for (api.md v1.3).
pub const MAX_TAIL_LINES: u64 = 1_000_000;

/// The last `n` lines of `src` as a line page: whole lines, at most [`READ_CAP`] bytes of text;
/// when `n` lines do not fit, the last ones that do, its `start_line` saying where they start.
/// A last line longer than a page by itself is shown from its start, cut as any line page cuts
/// it (its `next_offset` goes on).
pub async fn tail_page<E: SourceError>(src: &dyn Source<Error = E>, n: u64) -> PageResult<ReadPage, E> {
    let start = tail_start(src, n).await?;
    line_page(src, start, (src.total_lines() + 1 - start).max(1)).await
}

/// The first line of the page [`tail_page`] shows. Only the last [`READ_CAP`] bytes (and the
/// one before them, which says whether they begin a line) are read, whatever the size.
pub async fn tail_start<E: SourceError>(src: &dyn Source<Error = E>, n: u64) -> PageResult<u64, E> {
    if n == 0 || n > MAX_TAIL_LINES {
        return Err(PageError::InvalidArgument(format!("tail_lines must be 1 to {MAX_TAIL_LINES}")));
    }
    let total = src.total_lines();
    if total == 0 {
        return Ok(1);
    }
    let size = src.size();
    let lo = size.saturating_sub(READ_CAP as u64 + 1);
    let buf = read_checked(src, lo, size).await?;
    let want = total.saturating_sub(n) + 1;
    // Walked back from the end, a line at a time, each kept while the text it adds fits: a
    // line's text is what the page would show of it (invalid UTF-8 grows as it is replaced;
    // replacement never crosses a `\n`, so lines add up).
    let (mut first, mut end, mut text) = (total + 1, buf.len(), 0usize);
    while first > want && end > 0 {
        let start = match memchr::memrchr(b'\n', &buf[..end - 1]) {
            Some(i) => i + 1,
            None if lo == 0 => 0,
            None => break, // the line begins before the window: it cannot fit
        };
        let piece = &buf[start..end];
        let shown = match simdutf8::basic::from_utf8(piece) {
            Ok(_) => piece.len(),
            Err(_) => to_content(piece).text.len(),
        };
        if text + shown > READ_CAP {
            break;
        }
        (first, end, text) = (first - 1, start, text + shown);
    }
    Ok(first.min(total))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::paging::MemorySource;

    async fn tail(data: &[u8], n: u64) -> ReadPage {
        tail_page(&MemorySource::new(Bytes::copy_from_slice(data)), n).await.expect("a tail")
    }

    #[tokio::test]
    async fn the_last_lines_numbered_as_a_line_page() {
        let data: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let p = tail(data.as_bytes(), 3).await;
        assert_eq!((p.start_line, p.end_line, p.content.as_str()), (8, 10, "line 8\nline 9\nline 10\n"));
        assert!(p.eof && !p.capped);
        let all = tail(data.as_bytes(), 50).await;
        assert_eq!((all.start_line, all.offset, all.content), (1, 0, data));
    }

    #[tokio::test]
    async fn a_last_line_without_a_newline_counts() {
        let p = tail(b"a\nb\nc", 2).await;
        assert_eq!((p.start_line, p.end_line, p.content.as_str()), (2, 3, "b\nc"));
        let empty = tail(b"", 5).await;
        assert_eq!((empty.start_line, empty.length, empty.eof), (1, 0, true));
    }

    #[tokio::test]
    async fn what_does_not_fit_is_left_at_the_front() {
        // 3,000 lines of 100 bytes: 300,000 bytes, the last 1,000 lines fill a page.
        let data: String = (1..=3_000).map(|i| format!("{i:>99}\n")).collect();
        let p = tail(data.as_bytes(), 2_500).await;
        assert_eq!((p.start_line, p.end_line, p.length), (2_001, 3_000, 100_000));
        assert!(p.eof);
        // Invalid UTF-8 grows when replaced: fewer lines fit, and the text stays under the cap.
        let binary: Vec<u8> = (0..3_000).flat_map(|_| [[0xFFu8; 49].as_slice(), b"\n"].concat()).collect();
        let p = tail(&binary, 3_000).await;
        assert!(p.content.len() <= READ_CAP && p.eof && p.lossy, "{} bytes", p.content.len());
        assert_eq!(p.end_line, 3_000);
        assert_eq!(p.start_line, 3_000 - (READ_CAP / (49 * 3 + 1)) as u64 + 1);
    }

    #[tokio::test]
    async fn a_last_line_longer_than_a_page_is_shown_from_its_start() {
        let mut data = b"first\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', 250_000));
        let p = tail(&data, 1).await;
        assert_eq!((p.start_line, p.offset, p.length, p.next_offset), (2, 6, 100_000, Some(100_006)));
    }

    #[tokio::test]
    async fn zero_or_too_many_is_a_clear_error() {
        let src = MemorySource::new(Bytes::from_static(b"a\n"));
        for n in [0, MAX_TAIL_LINES + 1] {
            assert!(matches!(tail_page(&src, n).await, Err(PageError::InvalidArgument(m)) if m.contains("tail_lines")));
        }
    }
}

//! Pages with their secrets shown as marks (api.md v1.2, Redaction): the page is cut from the
//! stored bytes as any page is, so offsets, lines and cursors are the stored bytes' own; its
//! text is then the redacted text of the same range, found with [`MAX_SECRET`] bytes of the
//! source read on either side, so that a secret cut by the page's edge is found in full and
//! marked on both sides of it. Marks can be longer than what they hide: when the redacted text
//! passes the 100,000-byte cap, the page covers fewer stored bytes (whole lines, for a line
//! page, when one fits) and says `capped`.

use super::{newlines, read_checked, to_content, PageResult, Source, SourceError};
use crate::redact::{Detector, Redacted, Span, MAX_SECRET};
use crate::ReadPage;

/// A byte page (as [`super::byte_page`] cuts it) with its secrets marked.
pub async fn byte_page_redacted<E: SourceError>(
    src: &dyn Source<Error = E>,
    offset: u64,
    limit: u64,
    detector: &Detector,
) -> PageResult<ReadPage, E> {
    let page = super::byte_page(src, offset, limit).await?;
    redact_page(src, page, detector, false).await
}

/// A line page (as [`super::line_page`] cuts it) with its secrets marked.
pub async fn line_page_redacted<E: SourceError>(
    src: &dyn Source<Error = E>,
    line: u64,
    lines: u64,
    detector: &Detector,
) -> PageResult<ReadPage, E> {
    let page = super::line_page(src, line, lines).await?;
    redact_page(src, page, detector, true).await
}

/// The bytes `[start, end)` of `src` with [`MAX_SECRET`] bytes around them (as far as the
/// source goes), and where the range starts in them.
pub(super) async fn with_context<E: SourceError>(
    src: &dyn Source<Error = E>,
    start: u64,
    end: u64,
) -> PageResult<(bytes::Bytes, usize), E> {
    let lo = start.saturating_sub(MAX_SECRET as u64);
    let hi = src.size().min(end.saturating_add(MAX_SECRET as u64));
    Ok((read_checked(src, lo, hi).await?, (start - lo) as usize))
}

/// Bytes per block of [`block_secrets`].
pub const SECRET_BLOCK: u64 = 256 << 10;

/// The secrets that start in block `block` of `src` (its bytes from `block * SECRET_BLOCK`, for
/// [`SECRET_BLOCK`] bytes or to the end), at their offsets in the source, exactly as a scan of
/// the whole source finds them (the block is scanned with [`MAX_SECRET`] bytes on either side).
/// What a source keeps for [`Source::kept_secrets`].
pub async fn block_secrets<E: SourceError>(
    src: &dyn Source<Error = E>,
    detector: &Detector,
    block: u64,
) -> PageResult<std::sync::Arc<[Span]>, E> {
    let start = block.saturating_mul(SECRET_BLOCK).min(src.size());
    let end = start.saturating_add(SECRET_BLOCK).min(src.size());
    let (buf, from) = with_context(src, start, end).await?;
    let base = (start - from as u64) as usize;
    let found = detector.find_starting_in(&buf, from, from + (end - start) as usize);
    Ok(found.into_iter().map(|s| Span { start: s.start + base, end: s.end + base, kind: s.kind }).collect())
}

/// The secrets that overlap the source's bytes `lo..hi`, from the blocks the source keeps, cut
/// to that range and in its offsets (from `lo`), merged where a secret of one block runs into
/// one of the next (as one scan merges them). `None` when the source keeps none. A page's
/// marks are these spans, replaced as [`Redacted`] replaces them.
pub async fn kept_spans<E: SourceError>(
    src: &dyn Source<Error = E>,
    detector: &Detector,
    lo: u64,
    hi: u64,
) -> PageResult<Option<Vec<Span>>, E> {
    let mut out: Vec<Span> = Vec::new();
    // A secret that overlaps the range starts at most MAX_SECRET bytes before it.
    let first = lo.saturating_sub(MAX_SECRET as u64) / SECRET_BLOCK;
    for block in first..=hi.saturating_sub(1) / SECRET_BLOCK {
        let Some(spans) = src.kept_secrets(detector, block).await else { return Ok(None) };
        for s in spans?.iter().filter(|s| (s.start as u64) < hi && s.end as u64 > lo) {
            let (start, end) = ((s.start as u64).max(lo) - lo, (s.end as u64).min(hi) - lo);
            let (start, end) = (start as usize, end as usize);
            match out.last_mut() {
                Some(last) if start < last.end => last.end = last.end.max(end),
                _ => out.push(Span { start, end, kind: s.kind.clone() }),
            }
        }
    }
    Ok(Some(out))
}

async fn redact_page<E: SourceError>(
    src: &dyn Source<Error = E>,
    mut page: ReadPage,
    detector: &Detector,
    whole_lines: bool,
) -> PageResult<ReadPage, E> {
    let (buf, from, spans) = match kept_spans(src, detector, page.offset, page.offset + page.length).await? {
        // The secrets are known: the page's own text is its stored bytes (valid UTF-8).
        Some(spans) if !page.lossy && page.content.len() as u64 == page.length => {
            (bytes::Bytes::from(std::mem::take(&mut page.content).into_bytes()), 0, spans)
        }
        // Else scan the page with MAX_SECRET bytes on either side: a secret that overlaps it
        // starts and ends there.
        _ => {
            let (buf, from) = with_context(src, page.offset, page.offset + page.length).await?;
            let spans = detector.find(&buf);
            (buf, from, spans)
        }
    };
    // The bytes read, as the cut rules see them: `buf[from]` is the page's first byte, after
    // `start_line - 1` newlines of the source.
    let lo = page.offset - from as u64;
    let before = page.start_line - 1 - newlines(&buf[..from]);
    let w = super::cut::Window { size: src.size(), start: lo, newlines: before, data: &buf };
    let mut stop = page.offset + page.length;
    let mut capped = page.capped;
    loop {
        let end = (stop - lo) as usize;
        let red = Redacted::of(&buf, from, end, &spans);
        let content = to_content(&red.text);
        if !content.cut {
            let shown = super::cut::shown(&w, src.total_lines(), page.offset, stop, content.lossy, capped);
            let mut out = shown.page(page.digest, content.text);
            out.redactions = Some(red.marks() as u64);
            return Ok(out);
        }
        // Marks made the text pass the cap: end where the cap fell (before a mark it fell in).
        let cut = page.offset + red.raw_at(content.used) as u64;
        stop = super::cut::shorter_end(&w, page.offset, stop, cut, whole_lines);
        capped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paging::{byte_page, compile_pattern, grep, line_page, GrepRequest, MemorySource};
    use crate::redact::samples::{leak as leaks, secret_pieces, text as samples_text, SAMPLES};
    use crate::READ_CAP;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    fn secret_grams() -> Vec<String> {
        let pieces = secret_pieces();
        assert!(pieces.len() > 500, "the check has pieces to look for");
        pieces
    }

    #[test]
    fn pages_of_every_size_at_every_offset_show_no_piece_of_a_secret() {
        let d = Detector::builtin();
        let text = samples_text();
        let src = MemorySource::new(text.clone().into());
        let grams = secret_grams();
        block_on(async {
            for limit in 1..=64u64 {
                for start in 0..limit.min(5) {
                    let mut at = start;
                    while at < text.len() as u64 {
                        let p = byte_page_redacted(&src, at, limit, d).await.unwrap();
                        if let Some(g) = leaks(&p.content, &grams) {
                            panic!("limit {limit}, offset {at}: {:?} shows {g:?}", p.content);
                        }
                        at = p.next_offset.unwrap_or(text.len() as u64);
                    }
                }
            }
        });
    }

    #[test]
    fn line_pages_show_marks_and_keep_the_stored_cursors() {
        let d = Detector::builtin();
        let text = samples_text();
        let src = MemorySource::new(text.clone().into());
        block_on(async {
            for lines in [1, 2, 3, 7, 2000] {
                let mut line = 1;
                let mut all = String::new();
                loop {
                    let plain = line_page(&src, line, lines).await.unwrap();
                    let p = line_page_redacted(&src, line, lines, d).await.unwrap();
                    assert_eq!(
                        (p.offset, p.length, p.next_line, p.start_line, p.end_line),
                        (plain.offset, plain.length, plain.next_line, plain.start_line, plain.end_line)
                    );
                    assert_eq!(p.content.matches('\n').count(), plain.content.matches('\n').count());
                    all.push_str(&p.content);
                    match p.next_line {
                        Some(n) => line = n,
                        None => break,
                    }
                }
                // A PEM block's lines, read one page each, each show a mark.
                assert!(all.matches("[REDACTED:").count() >= SAMPLES.len(), "{lines} lines a page");
                assert!(leaks(&all, &secret_grams()).is_none());
            }
        });
    }

    #[test]
    fn pages_from_kept_block_secrets_are_the_pages_of_a_scan() {
        // Every sample straddling a block edge (the secret's middle on the edge), PEM blocks
        // included, with filler between; pages at and around every edge, of many sizes.
        let d = Detector::builtin();
        let (text, edges) = crate::redact::samples::across_edges(SECRET_BLOCK);
        let (plain, keeping) =
            (MemorySource::new(text.clone().into()), MemorySource::new(text.into()).with_secrets_by_block());
        block_on(async {
            for &(edge, line) in &edges {
                for limit in [1, 7, 64, 500, 100_000] {
                    for back in [0u64, 1, 17, 64, 300, 20_000] {
                        let at = edge - back.min(edge);
                        let a = byte_page_redacted(&plain, at, limit, d).await.unwrap();
                        let b = byte_page_redacted(&keeping, at, limit, d).await.unwrap();
                        assert_eq!(a, b, "offset {at}, limit {limit}");
                    }
                }
                let a = line_page_redacted(&plain, line, 3, d).await.unwrap();
                assert_eq!(a, line_page_redacted(&keeping, line, 3, d).await.unwrap(), "line {line}");
                assert!(a.redactions.unwrap() >= 1, "line {line}: {:?}", a.content);
            }
        });
    }

    #[test]
    fn text_without_secrets_reads_as_the_plain_page() {
        let d = Detector::builtin();
        let text: String = (0..5000).map(|i| format!("line {i} blake3:{:064x} ok\n", i * 7919)).collect();
        let src = MemorySource::new(text.into());
        block_on(async {
            for (offset, limit) in [(0, 100_000), (12_345, 1000), (300_000, 7)] {
                let mut p = byte_page_redacted(&src, offset, limit, d).await.unwrap();
                assert_eq!(p.redactions.take(), Some(0));
                assert_eq!(p, byte_page(&src, offset, limit).await.unwrap());
            }
        });
    }

    #[test]
    fn marks_longer_than_their_secrets_shorten_the_page_to_the_cap() {
        let d = Detector::builtin();
        let text = "password=a\n".repeat(30_000);
        let src = MemorySource::new(text.clone().into());
        block_on(async {
            for by_lines in [false, true] {
                let (mut offset, mut line, mut covered, mut marks) = (0u64, 1u64, 0u64, 0u64);
                loop {
                    let p = if by_lines {
                        line_page_redacted(&src, line, 100_000, d).await.unwrap()
                    } else {
                        byte_page_redacted(&src, offset, 100_000, d).await.unwrap()
                    };
                    assert!(p.content.len() <= READ_CAP, "{} bytes of text", p.content.len());
                    assert_eq!(p.offset, covered, "pages follow each other");
                    let whole = p.content.matches("[REDACTED:password]").count();
                    assert_eq!(p.content.matches("[REDACTED").count(), whole, "whole marks only");
                    assert_eq!(p.redactions, Some(whole as u64));
                    covered += p.length;
                    marks += p.redactions.unwrap();
                    if p.eof {
                        break;
                    }
                    assert!(p.capped);
                    (offset, line) = (p.next_offset.unwrap(), p.next_line.unwrap_or(0));
                    assert!(!by_lines || p.next_line.is_some(), "line pages stay whole");
                }
                assert_eq!((covered, marks), (text.len() as u64, 30_000));
            }
        });
    }

    #[test]
    fn grep_matches_the_redacted_text_so_no_pattern_probes_a_secret() {
        let d = Detector::builtin();
        let src = MemorySource::new(samples_text().into());
        block_on(async {
            let probe = compile_pattern("AKIA[A-Z0-9]{3}", false, false).unwrap();
            let found = grep(&src, GrepRequest { redact: Some(d), ..GrepRequest::new(&probe) }).await.unwrap();
            assert!(found.matches.is_empty(), "{found:?}");
            assert_eq!(found.redactions, Some(0));
            let plain = grep(&src, GrepRequest::new(&probe)).await.unwrap();
            assert_eq!(plain.matches.len(), 1, "the stored bytes hold it");
            let marks = compile_pattern("[REDACTED:", true, false).unwrap();
            let req = GrepRequest { redact: Some(d), before: 1, ..GrepRequest::new(&marks) };
            let found = grep(&src, req).await.unwrap();
            let private_key_lines = 3; // a PEM block's lines after its first show no mark
            assert_eq!(found.matches.len(), SAMPLES.len());
            assert!(found.redactions.unwrap() >= SAMPLES.len() as u64 - private_key_lines);
            let shown: String = found.matches.iter().map(|m| m.text.clone()).collect();
            assert!(leaks(&shown, &secret_grams()).is_none(), "{shown}");
        });
    }
}

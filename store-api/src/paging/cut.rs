//! Where a page ends: the one set of cutting rules, asked of any view of the bytes around a
//! page. [`super::byte_page`] and [`super::line_page`] ask them of the bytes they read
//! ([`Window`]); the server's text cache asks them of the escaped blocks it keeps (which answer
//! the same questions from their marks, without the raw bytes). Each rule is written here once;
//! a view only says where bytes, characters and newlines are.

use super::{char_width, nth_newline, utf8_cut, Shown};
use crate::READ_CAP;

/// Raw bytes around a page, by their position in the source.
pub trait Around {
    /// The source's size.
    fn size(&self) -> u64;
    /// The raw byte at `pos` (a position the view holds).
    fn byte(&self, pos: u64) -> u8;
}

/// [`Around`], with where the source's newlines are.
pub trait Lines: Around {
    /// `\n` bytes in the source before `pos`.
    fn newlines_before(&self, pos: u64) -> u64;
    /// Where the source's `n`-th `\n` (from 1) is, if the view holds it.
    fn newline(&self, n: u64) -> Option<u64>;
    /// `\n` bytes in `start..stop`.
    fn newlines_in(&self, start: u64, stop: u64) -> u64 {
        self.newlines_before(stop) - self.newlines_before(start)
    }
    /// Where the last `\n` of `start..stop` is, if it has one.
    fn last_newline(&self, start: u64, stop: u64) -> Option<u64> {
        let through = self.newlines_before(stop);
        (through > self.newlines_before(start)).then(|| self.newline(through)).flatten()
    }
}

/// Where a byte page ends, as [`byte_end`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// At this position: the end asked for, or before the character it would cut.
    At(u64),
    /// The limit is shorter than the character the page starts with: the page is that one
    /// character (bytes past the end asked for).
    OneCharacter,
}

/// Where a byte page from `offset` asked to end at `end` (at most the source's size) ends:
/// never inside a character, unless the source ends there (its last bytes are shown as they are).
pub fn byte_end(w: &impl Around, offset: u64, end: u64) -> End {
    if end == w.size() {
        return End::At(end);
    }
    let from = end.saturating_sub(4).max(offset);
    let mut last = [0u8; 4];
    let n = (end - from) as usize;
    for (i, b) in last[..n].iter_mut().enumerate() {
        *b = w.byte(from + i as u64);
    }
    match utf8_cut(&last[..n]) {
        k if k == n => End::At(end),
        0 if from == offset => End::OneCharacter,
        k => End::At(from + k as u64),
    }
}

/// Bytes a page of one character from `offset` covers: the character's width, as far as the
/// source goes.
pub fn one_character(w: &impl Around, offset: u64) -> u64 {
    (char_width(w.byte(offset)) as u64).min(w.size() - offset)
}

/// Where a byte page asked for `offset`/`limit` would end: `limit` bytes on (1 to [`READ_CAP`]),
/// the source's size at most. [`byte_end`] says where it does.
pub fn byte_end_asked(size: u64, offset: u64, limit: u64) -> u64 {
    size.min(offset.saturating_add(limit.clamp(1, READ_CAP as u64)))
}

/// Whether a byte page asked for `offset`/`limit` that ends at `page_end` was stopped short by
/// the cap (a limit over it); a page the cap cut while decoding says so itself.
pub fn byte_capped(size: u64, offset: u64, limit: u64, page_end: u64) -> bool {
    limit > READ_CAP as u64 && page_end < size.min(offset.saturating_add(limit))
}

/// Where a line page ends: from `start`, where line `line` starts, `lines` whole lines, or what
/// the cap leaves — the whole lines before `end` (the cap from `start`, or the source's end), a
/// first line longer than the cap cut by bytes, or everything to the source's end. With
/// whether the cap stopped it.
pub fn line_end(w: &impl Lines, start: u64, line: u64, lines: u64, end: u64) -> (u64, bool) {
    let before = line - 1;
    if let Some(at) = w.newline(before.saturating_add(lines)).filter(|&at| at < end) {
        return (at + 1, false);
    }
    if end == w.size() {
        return (end, false); // to the end: the last line may have no final newline
    }
    match w.last_newline(start, end) {
        Some(at) => (at + 1, true),
        // One line longer than the cap: go on by bytes.
        None => match byte_end(w, start, end) {
            End::At(stop) if stop > start => (stop, true),
            _ => (start + 1, true),
        },
    }
}

/// Where a page `offset..stop` whose text passed the cap once marks were put in (a redacted
/// page) ends next: at `cut`, where the cap fell in its raw bytes — after the last whole line
/// before it, for a line page that has one — never empty and always shorter than before.
pub fn shorter_end(w: &impl Lines, offset: u64, stop: u64, cut: u64, whole_lines: bool) -> u64 {
    let mut cut = cut;
    if whole_lines && cut > offset {
        if let Some(at) = w.last_newline(offset, cut) {
            cut = at + 1;
        }
    }
    cut.max(offset + 1).min(stop - 1).max(offset + 1)
}

/// What the page `offset..stop` shows of the source (`total_lines` in all), from which its
/// line numbers and cursors follow.
pub fn shown(w: &impl Lines, total_lines: u64, offset: u64, stop: u64, lossy: bool, capped: bool) -> Shown {
    Shown {
        size: w.size(),
        total_lines,
        offset,
        used: stop - offset,
        start_line: 1 + w.newlines_before(offset),
        // Replacement never makes or removes a `\n`: the text's newlines are the raw bytes'.
        newlines: w.newlines_in(offset, stop),
        ends_line: stop > offset && w.byte(stop - 1) == b'\n',
        lossy,
        capped,
    }
}

/// Bytes of a source read into memory: `data` from position `start`, after `newlines` `\n`
/// bytes.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// The source's size.
    pub size: u64,
    /// Where `data` starts in the source.
    pub start: u64,
    /// `\n` bytes in the source before `start`.
    pub newlines: u64,
    /// The bytes.
    pub data: &'a [u8],
}

impl Window<'_> {
    fn rel(&self, pos: u64) -> usize {
        (pos - self.start) as usize
    }
}

impl Around for Window<'_> {
    fn size(&self) -> u64 {
        self.size
    }
    fn byte(&self, pos: u64) -> u8 {
        self.data[self.rel(pos)]
    }
}

impl Lines for Window<'_> {
    fn newlines_before(&self, pos: u64) -> u64 {
        self.newlines + super::newlines(&self.data[..self.rel(pos)])
    }
    fn newline(&self, n: u64) -> Option<u64> {
        let k = n.checked_sub(self.newlines + 1)?;
        nth_newline(self.data, k).map(|i| self.start + i as u64)
    }
    fn newlines_in(&self, start: u64, stop: u64) -> u64 {
        super::newlines(&self.data[self.rel(start)..self.rel(stop)])
    }
    fn last_newline(&self, start: u64, stop: u64) -> Option<u64> {
        memchr::memrchr(b'\n', &self.data[self.rel(start)..self.rel(stop)]).map(|i| start + i as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn window(data: &[u8]) -> Window<'_> {
        Window { size: data.len() as u64, start: 0, newlines: 0, data }
    }

    /// A view that answers only from the default methods, to check them against the window's.
    struct Plain<'a>(Window<'a>);
    impl Around for Plain<'_> {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn byte(&self, pos: u64) -> u8 {
            self.0.byte(pos)
        }
    }
    impl Lines for Plain<'_> {
        fn newlines_before(&self, pos: u64) -> u64 {
            self.0.newlines_before(pos)
        }
        fn newline(&self, n: u64) -> Option<u64> {
            self.0.newline(n)
        }
    }

    proptest! {
        #[test]
        fn the_default_line_questions_answer_as_the_window_does(
            data in "[a\n]{0,40}", a in 0usize..41, b in 0usize..41,
        ) {
            let w = window(data.as_bytes());
            let (a, b) = ((a.min(b).min(data.len())) as u64, (a.max(b).min(data.len())) as u64);
            prop_assert_eq!(Plain(w).newlines_in(a, b), w.newlines_in(a, b));
            prop_assert_eq!(Plain(w).last_newline(a, b), w.last_newline(a, b));
        }

        #[test]
        fn a_byte_page_never_ends_inside_a_character(data in "[aé€😀]{1,20}", at in 0usize..80, limit in 1u64..9) {
            let w = window(data.as_bytes());
            let offset = (at % data.len()) as u64;
            match byte_end(&w, offset, byte_end_asked(w.size(), offset, limit)) {
                End::At(stop) => {
                    prop_assert!(stop > offset || limit < 4);
                    prop_assert!(data.is_char_boundary(stop as usize) || !data.is_char_boundary(offset as usize));
                }
                End::OneCharacter => prop_assert!(limit < one_character(&w, offset)),
            }
        }
    }

    #[test]
    fn a_line_page_takes_whole_lines_then_what_the_cap_leaves() {
        let data = b"ab\ncd\nef";
        let w = window(data);
        assert_eq!(line_end(&w, 0, 1, 2, 8), (6, false), "two whole lines");
        assert_eq!(line_end(&w, 0, 1, 9, 8), (8, false), "to the end");
        assert_eq!(line_end(&w, 0, 1, 9, 5), (3, true), "the cap: the whole lines before it");
        assert_eq!(line_end(&w, 0, 1, 9, 2), (2, true), "a line longer than the cap: by bytes");
        assert_eq!(shorter_end(&w, 0, 8, 5, true), 3);
        assert_eq!(shorter_end(&w, 0, 8, 5, false), 5);
        assert_eq!(shorter_end(&w, 0, 8, 0, false), 1, "never empty");
    }
}

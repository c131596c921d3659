//! Lossy blocks: a blob's bytes that are not all UTF-8 (an agent `cat`s a binary), kept decoded
//! as `String::from_utf8_lossy` decodes them and JSON-escaped, so that a capped page of them is
//! written from memory like a page of text. Decoding random bytes goes byte by byte with a
//! branch on every lead byte, and a page of them is ~2.6 bytes of JSON per byte: that was a
//! lossy page's cost, four times a text page's.
//!
//! Lossy decoding is a walk through *units* (a character, or the bytes one U+FFFD replaces);
//! every byte that is not a continuation byte starts one, so decoding from any unit's start
//! gives what decoding the whole blob gives from there. A block owns the units that start in it
//! (the last may end up to three bytes into the next block) and keeps its raw bytes with three
//! bytes of context on either side, so any position can be walked to from a mark. A page's
//! start must be a unit's start, as must its end; `paging::byte_page` never ends a page inside
//! one (it cuts before a lead byte whose sequence would run past the end), and the cap is
//! counted in decoded bytes, unit by unit, as `paging::to_content` counts it.

use std::sync::Arc;

use bytes::Bytes;
use spillway_api::paging::cut::{self, Around, End};
use spillway_api::paging::{lossy_unit, Shown};
use spillway_api::READ_CAP;

use super::{EscapedPage, TextBlob, MARK};

/// Raw bytes a block keeps on either side of its own: enough to finish its last unit, and to
/// find where its first one starts.
pub(super) const CONTEXT: u64 = 3;

/// What a byte below `0x80` is in a JSON string (as `sonic_rs` writes it): its length, its bytes.
const ESCAPED: [(u8, [u8; 6]); 128] = {
    let hex = b"0123456789abcdef";
    let mut t = [(1u8, [0u8; 6]); 128];
    let mut b = 0;
    while b < 128 {
        t[b] = match b as u8 {
            0x08 => (2, *b"\\b\0\0\0\0"),
            b'\t' => (2, *b"\\t\0\0\0\0"),
            b'\n' => (2, *b"\\n\0\0\0\0"),
            0x0C => (2, *b"\\f\0\0\0\0"),
            b'\r' => (2, *b"\\r\0\0\0\0"),
            b'"' => (2, *b"\\\"\0\0\0\0"),
            b'\\' => (2, *b"\\\\\0\0\0\0"),
            c if c < 0x20 => (6, [b'\\', b'u', b'0', b'0', hex[(c >> 4) as usize], hex[(c & 15) as usize]]),
            c => (1, [c, 0, 0, 0, 0, 0]),
        };
        b += 1;
    }
    t
};

const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// Continuation bytes a page may start with (random bytes start one page in four with one).
const MAX_STRAYS: usize = 16;

/// A position at the start of a unit of a block, and what lies between the block's first unit
/// and it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct At {
    /// Raw offset from the block's first byte.
    raw: u32,
    /// Offset in the block's escaped text.
    esc: u32,
    /// Decoded (UTF-8) bytes.
    dec: u32,
    newlines: u32,
    /// Units replaced by U+FFFD.
    replaced: u32,
}

/// One block of a blob, decoded lossily and escaped.
#[derive(Debug)]
pub(super) struct LossyBlock {
    /// The block's bytes with up to [`CONTEXT`] bytes before and after.
    raw: Bytes,
    /// Where the block's first byte is in `raw`.
    lead: usize,
    /// The units that start in the block, decoded and escaped.
    esc: Bytes,
    /// Positions at unit starts, at least [`MARK`] raw bytes apart: the first unit's, …, and
    /// the end of the last unit.
    marks: Vec<At>,
    /// `\n` bytes in the blob before the block.
    first_line: u64,
}

impl LossyBlock {
    /// The block whose bytes are `raw[lead..lead + len]` (`raw` holds up to [`CONTEXT`] bytes
    /// on either side; fewer only at the blob's edges).
    pub(super) fn build(raw: Bytes, lead: usize, len: usize, first_line: u64) -> Self {
        // A unit that starts before the block is the block before's. If none of the bytes of
        // context before is a unit's start, the one that covers them ended before the block.
        let mut pos = match raw[..lead].iter().rposition(|b| b & 0xC0 != 0x80) {
            Some(mut p) => {
                while p < lead {
                    p += lossy_unit(&raw, p).0;
                }
                p
            }
            None => lead,
        };
        let mut block = Self { raw, lead, esc: Bytes::new(), marks: Vec::with_capacity(len / MARK + 2), first_line };
        let mut at = At { raw: (pos - lead) as u32, ..At::default() };
        let mut esc = Vec::with_capacity(len * 3);
        block.marks.push(at);
        let mut mark = pos + MARK;
        while pos < lead + len {
            let (step, whole) = lossy_unit(&block.raw, pos);
            let b = block.raw[pos];
            let out = if b < 0x80 {
                let (n, bytes) = &ESCAPED[usize::from(b)];
                &bytes[..usize::from(*n)]
            } else if whole {
                &block.raw[pos..pos + step]
            } else {
                REPLACEMENT
            };
            esc.extend_from_slice(out);
            at = block.advance(at, step, whole);
            pos += step;
            if pos >= mark {
                block.marks.push(at);
                mark = pos + MARK;
            }
        }
        if block.marks.last() != Some(&at) {
            block.marks.push(at);
        }
        debug_assert_eq!(at.esc as usize, esc.len());
        block.esc = Bytes::from(esc);
        block
    }

    /// `at` moved past the unit of `step` bytes there.
    fn advance(&self, at: At, step: usize, whole: bool) -> At {
        let b = self.raw[self.lead + at.raw as usize];
        let (esc, dec) = match (b < 0x80, whole) {
            (true, _) => (ESCAPED[usize::from(b)].0 as usize, 1),
            (false, true) => (step, step),
            (false, false) => (REPLACEMENT.len(), REPLACEMENT.len()),
        };
        At {
            raw: at.raw + step as u32,
            esc: at.esc + esc as u32,
            dec: at.dec + dec as u32,
            newlines: at.newlines + u32::from(b == b'\n'),
            replaced: at.replaced + u32::from(!whole),
        }
    }

    /// The unit after `at`: its length and whether it is a character.
    fn unit(&self, at: At) -> (usize, bool) {
        lossy_unit(&self.raw, self.lead + at.raw as usize)
    }

    fn first(&self) -> At {
        self.marks[0]
    }

    fn end(&self) -> At {
        self.marks[self.marks.len() - 1]
    }

    /// The position at raw offset `rel` of the block; `None` if no unit of the block starts
    /// there (it is inside one, or the block before's).
    fn at(&self, rel: u64) -> Option<At> {
        let j = self.marks.partition_point(|m| u64::from(m.raw) <= rel).checked_sub(1)?;
        let mut at = self.marks[j];
        while u64::from(at.raw) < rel {
            let (step, whole) = self.unit(at);
            at = self.advance(at, step, whole);
        }
        (u64::from(at.raw) == rel).then_some(at)
    }

    /// The last unit start from `from` on that is at most `dec` decoded bytes into the block
    /// and not past `stop`.
    fn fit(&self, from: At, dec: u32, stop: At) -> At {
        let j = self.marks.partition_point(|m| m.dec <= dec && m.raw <= stop.raw);
        let mut at = self.marks[j.saturating_sub(1)];
        if at.raw < from.raw {
            at = from;
        }
        while at.raw < stop.raw {
            let (step, whole) = self.unit(at);
            let next = self.advance(at, step, whole);
            if next.dec > dec {
                break;
            }
            at = next;
        }
        at
    }

    /// The raw byte at offset `rel` of the block (`-CONTEXT..len + CONTEXT`).
    fn byte(&self, rel: i64) -> u8 {
        self.raw[(self.lead as i64 + rel) as usize]
    }

    pub(super) fn weight(&self) -> u64 {
        (self.raw.len() + self.esc.len() + self.marks.len() * std::mem::size_of::<At>() + 128) as u64
    }
}

/// The lossy blocks a page's bytes lie in.
pub(super) struct LossySpan {
    /// The blob's size.
    pub size: u64,
    pub first: u64,
    pub block: u64,
    pub blocks: Vec<Arc<LossyBlock>>,
}

impl LossySpan {
    /// The block holding position `pos` as a unit start, and the position in it.
    fn at(&self, pos: u64) -> Option<(usize, At)> {
        let k = (pos / self.block).min(self.first + self.blocks.len() as u64 - 1);
        let i = (k - self.first) as usize;
        Some((i, self.blocks[i].at(pos - k * self.block)?))
    }
}

impl Around for LossySpan {
    fn size(&self) -> u64 {
        self.size
    }

    fn byte(&self, pos: u64) -> u8 {
        let k = (pos / self.block).min(self.first + self.blocks.len() as u64 - 1);
        self.blocks[(k - self.first) as usize].byte(pos as i64 - (k * self.block) as i64)
    }
}

impl LossySpan {
    /// The byte page `offset`/`limit` of `blob`, its end as `paging::cut` finds it; `None` where
    /// its end is not a unit's start, or it starts with many continuation bytes.
    pub(super) fn page(&self, blob: TextBlob<'_>, offset: u64, limit: u64) -> Option<EscapedPage> {
        let size = blob.size;
        let stop = match cut::byte_end(self, offset, cut::byte_end_asked(size, offset, limit)) {
            End::At(stop) => stop,
            End::OneCharacter => return None,
        };
        // A page that starts inside a unit: each continuation byte it starts with is a unit of
        // its own (one U+FFFD), up to the next byte that starts one.
        let strays = (offset..stop).take_while(|&p| self.byte(p) & 0xC0 == 0x80).take(MAX_STRAYS + 1).count();
        let unit = offset + strays as u64;
        if strays > MAX_STRAYS {
            return None;
        }
        let (i, start) = self.at(unit)?;
        let (j, stop) = self.at(stop)?;
        let ((k, through), capped) = self.fit(i, start, j, stop, READ_CAP - strays * REPLACEMENT.len());
        let (mut newlines, mut replaced) = (0, strays as u32);
        let mut content = Vec::with_capacity(k - i + 2);
        if strays > 0 {
            content.push(Bytes::from(REPLACEMENT.repeat(strays)));
        }
        for (n, b) in self.blocks.iter().enumerate().take(k + 1).skip(i) {
            let from = if n == i { start } else { b.first() };
            let to = if n == k { through } else { b.end() };
            newlines += u64::from(to.newlines - from.newlines);
            replaced += to.replaced - from.replaced;
            content.push(b.esc.slice(from.esc as usize..to.esc as usize));
        }
        let k_start = (self.first + k as u64) * self.block;
        let page_end = k_start + u64::from(through.raw);
        let shown = Shown {
            size,
            total_lines: blob.lines,
            offset,
            used: page_end - offset,
            start_line: 1 + self.blocks[i].first_line + u64::from(start.newlines),
            newlines,
            ends_line: self.byte(page_end - 1) == b'\n',
            lossy: replaced > 0,
            capped: capped || cut::byte_capped(size, offset, limit, page_end),
        };
        Some(EscapedPage { page: shown.page(Some(blob.digest.to_string()), String::new()), content })
    }

    /// Where the page from `start` (in block `i`) to `stop` (in block `j`) ends under the cap
    /// of `cap` decoded bytes, and whether the cap cut it.
    fn fit(&self, i: usize, start: At, j: usize, stop: At, cap: usize) -> ((usize, At), bool) {
        let mut left = cap as u32;
        for k in i..=j {
            let b = &self.blocks[k];
            let from = if k == i { start } else { b.first() };
            let to = if k == j { stop } else { b.end() };
            if to.dec - from.dec > left {
                return ((k, b.fit(from, from.dec + left, to)), true);
            }
            left -= to.dec - from.dec;
        }
        ((j, stop), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_sonic_does() {
        for b in 0..0x80u8 {
            let want = sonic_rs::to_string(&char::from(b).to_string()).unwrap();
            let (n, bytes) = ESCAPED[usize::from(b)];
            assert_eq!(&bytes[..usize::from(n)], &want.as_bytes()[1..want.len() - 1], "byte {b:#x}");
        }
    }

    #[test]
    fn a_block_owns_the_units_that_start_in_it() {
        // "é" (C3 A9) across the edge at 4: the block from 4 starts at its second byte.
        let blob = b"abc\xC3\xA9\xFFxyz\xE2\x82";
        let block = |k: usize| {
            let (from, to) = ((k * 4).saturating_sub(3), (k * 4 + 4 + 3).min(blob.len()));
            let len = (k * 4 + 4).min(blob.len()) - k * 4;
            LossyBlock::build(Bytes::copy_from_slice(&blob[from..to]), k * 4 - from, len, 0)
        };
        let (b0, b1, b2) = (block(0), block(1), block(2));
        assert_eq!(&b0.esc[..], "abcé".as_bytes(), "the last unit ends in the next block");
        assert_eq!((b1.first().raw, b1.at(0), &b1.esc[..]), (1, None, "\u{FFFD}xy".as_bytes()));
        assert_eq!(&b2.esc[..], "z\u{FFFD}".as_bytes(), "the blob ends inside a character");
        assert_eq!((b1.end().replaced, b2.end().raw), (1, 3));
    }
}

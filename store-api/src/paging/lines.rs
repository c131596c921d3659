//! Line bookkeeping built while bytes are written: the line count and a sparse index of
//! checkpoints `(offset, newlines before offset)` about every 64 KiB, so that finding line
//! 1,000,000 reads at most one checkpoint span instead of scanning from the start.

/// Distance between checkpoints.
pub const CHECKPOINT_EVERY: u64 = 64 * 1024;

/// A position whose line number is known: `newlines` `\n` bytes lie before `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Where the checkpoint is, in bytes from the start.
    pub offset: u64,
    /// `\n` bytes before it.
    pub newlines: u64,
}

/// Sorted checkpoints of one blob; always holds `(0, 0)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineIndex {
    points: Vec<Checkpoint>,
}

impl LineIndex {
    /// Decodes the form stored in the database; a damaged value degrades to a scan from 0.
    pub fn decode(raw: &[u8]) -> Self {
        let mut points: Vec<Checkpoint> = raw
            .chunks_exact(16)
            .map(|c| Checkpoint {
                offset: u64::from_le_bytes(c[..8].try_into().unwrap_or_default()),
                newlines: u64::from_le_bytes(c[8..].try_into().unwrap_or_default()),
            })
            .collect();
        if points.first() != Some(&Checkpoint { offset: 0, newlines: 0 }) {
            points.insert(0, Checkpoint { offset: 0, newlines: 0 });
        }
        Self { points }
    }

    /// The stored form: little-endian `(offset, newlines)` pairs.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.points.len() * 16);
        for p in &self.points {
            out.extend_from_slice(&p.offset.to_le_bytes());
            out.extend_from_slice(&p.newlines.to_le_bytes());
        }
        out
    }

    /// The last checkpoint at or before `offset`.
    pub fn for_offset(&self, offset: u64) -> Checkpoint {
        let i = self.points.partition_point(|p| p.offset <= offset);
        self.points[i.saturating_sub(1)]
    }

    /// The last checkpoint before the `\n` that ends line `line - 1`, so at or before the
    /// start of 1-based `line` and at most one checkpoint span from it.
    pub fn for_line(&self, line: u64) -> Checkpoint {
        let before = line.saturating_sub(1);
        let i = self.points.partition_point(|p| p.newlines < before);
        self.points[i.saturating_sub(1)]
    }
}

/// Feeds on the bytes of an upload as they arrive.
#[derive(Debug, Clone)]
pub struct LineIndexBuilder {
    size: u64,
    newlines: u64,
    last_byte: Option<u8>,
    points: Vec<Checkpoint>,
}

impl Default for LineIndexBuilder {
    fn default() -> Self {
        Self { size: 0, newlines: 0, last_byte: None, points: vec![Checkpoint { offset: 0, newlines: 0 }] }
    }
}

impl LineIndexBuilder {
    /// Accounts for the next bytes.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let next_cp = self.points.last().map_or(0, |p| p.offset) + CHECKPOINT_EVERY;
            let room = (next_cp - self.size) as usize;
            let take = room.min(data.len());
            let (head, rest) = data.split_at(take);
            self.newlines += memchr::memchr_iter(b'\n', head).count() as u64;
            self.size += take as u64;
            self.last_byte = head.last().copied().or(self.last_byte);
            if self.size == next_cp {
                self.points.push(Checkpoint { offset: self.size, newlines: self.newlines });
            }
            data = rest;
        }
    }

    /// Bytes indexed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Lines as the contract counts them.
    pub fn lines(&self) -> u64 {
        self.newlines + u64::from(self.size > 0 && self.last_byte != Some(b'\n'))
    }

    /// The finished index.
    pub fn finish(self) -> LineIndex {
        LineIndex { points: self.points }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(24)))]
        #[test]
        fn checkpoints_are_exact(data in proptest::collection::vec(prop_oneof![Just(b'\n'), any::<u8>()], 0..200_000), cut in 1usize..70_000) {
            let mut b = LineIndexBuilder::default();
            for chunk in data.chunks(cut) { b.update(chunk); }
            prop_assert_eq!(b.lines(), crate::count_lines(&data));
            prop_assert_eq!(b.size(), data.len() as u64);
            let built = b.finish();
            // One checkpoint per span, and the stored form gives the same index back.
            prop_assert_eq!(built.points.len() as u64, 1 + data.len() as u64 / CHECKPOINT_EVERY);
            prop_assert_eq!(built.encode().len(), built.points.len() * 16);
            let idx = LineIndex::decode(&built.encode());
            prop_assert_eq!(&idx, &built);
            for p in &idx.points {
                let n = data[..p.offset as usize].iter().filter(|&&c| c == b'\n').count() as u64;
                prop_assert_eq!(n, p.newlines);
            }
        }
    }

    #[test]
    fn lines_are_counted_as_the_contract_counts_them() {
        for data in [&b""[..], b"\n", b"a", b"a\n", b"a\nb", b"\n\n"] {
            let mut b = LineIndexBuilder::default();
            b.update(data);
            assert_eq!(b.lines(), crate::count_lines(data), "{data:?}");
        }
    }

    #[test]
    fn spans_are_64_kib_and_damage_degrades_to_a_scan() {
        assert_eq!(CHECKPOINT_EVERY, 65_536);
        let idx = LineIndex::decode(&[1, 2, 3]);
        assert_eq!(idx.for_offset(1 << 40), Checkpoint { offset: 0, newlines: 0 });
        assert_eq!(idx.for_line(1_000_000), Checkpoint { offset: 0, newlines: 0 });
    }
}

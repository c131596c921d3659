//! Wire types shared by `spillway-server` and its clients: digests, blob records, read pages,
//! grep answers, stream descriptions, references, receipts and the error body.
//!
//! Both sides depend on this crate so that the JSON of the v1 contract is written down once.
#![warn(missing_docs)]

/// Serde through `Display` and `FromStr`: the JSON form of a checked name is its text.
macro_rules! serde_via_str {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

mod digest;
mod error;
mod names;
#[cfg(feature = "paging")]
pub mod paging;
mod receipt;
#[cfg(feature = "redact")]
pub mod redact;
mod types;

pub use digest::{AnyDigest, Digest, DigestError, Sha256Digest};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use names::{NameError, Namespace, Scope, StreamId};
pub use receipt::{Receipt, SaveError, SaveFailure, ShownRange};
pub use types::*;

/// No call of the capped read or grep API returns more content bytes than this.
pub const READ_CAP: usize = 100_000;
/// Default number of lines in a line page.
pub const DEFAULT_PAGE_LINES: u64 = 2_000;
/// Longest `wait_ms` a stream read may long-poll for.
pub const MAX_WAIT_MS: u64 = 30_000;
/// Most labels one reference may carry.
pub const MAX_LABELS: usize = 16;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE: usize = 256;

/// Counts lines the way the contract does: every `\n`, plus one when the data is non-empty and
/// does not end in `\n`. Exposed so that the client and the server agree on `total_lines`.
pub fn count_lines(data: &[u8]) -> u64 {
    let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;
    newlines + u64::from(!data.is_empty() && !data.ends_with(b"\n"))
}

/// Checks a namespace name: `[a-z0-9_.-]{1,64}`, the same rule as label keys.
pub fn valid_namespace(ns: &str) -> bool {
    valid_label_key(ns)
}

/// Checks a label key against `[a-z0-9_.-]{1,64}`.
pub fn valid_label_key(key: &str) -> bool {
    (1..=64).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

/// Cases of a property test: `n`, or `PROPTEST_CASES` when set (`scripts/mutants` runs fewer).
#[cfg(all(test, feature = "paging"))]
pub(crate) fn test_cases(n: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(n)
}

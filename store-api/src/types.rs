//! Request and response bodies of the `/v1` routes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Digest;

/// Labels of a reference or stream (`label.<key>=<value>` on the wire): at most
/// [`MAX_LABELS`](crate::MAX_LABELS), keys `[a-z0-9_.-]{1,64}`, values at most
/// [`MAX_LABEL_VALUE`](crate::MAX_LABEL_VALUE) bytes. Checked as each label is added, and when
/// read from JSON, so a `Labels` value always holds to the rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Labels(BTreeMap<String, String>);

/// A label that breaks the rule; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// A key outside `[a-z0-9_.-]{1,64}`.
    #[error("invalid label key {0:?}: use [a-z0-9_.-]{{1,64}}")]
    Key(String),
    /// A value over the limit.
    #[error("label {0} is {1} bytes; the most is {max}", max = crate::MAX_LABEL_VALUE)]
    Value(String, usize),
    /// The same key twice.
    #[error("label {0} is given twice")]
    Twice(String),
    /// More labels than the limit.
    #[error("at most {max} labels", max = crate::MAX_LABELS)]
    TooMany,
}

impl Labels {
    /// No labels.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a label, or says which rule it breaks (and adds nothing).
    pub fn insert(&mut self, key: &str, value: String) -> Result<(), LabelError> {
        if !crate::valid_label_key(key) {
            return Err(LabelError::Key(key.chars().take(80).collect()));
        }
        if value.len() > crate::MAX_LABEL_VALUE {
            return Err(LabelError::Value(key.to_owned(), value.len()));
        }
        if self.0.contains_key(key) {
            return Err(LabelError::Twice(key.to_owned()));
        }
        if self.0.len() == crate::MAX_LABELS {
            return Err(LabelError::TooMany);
        }
        self.0.insert(key.to_owned(), value);
        Ok(())
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `labels["key"]`, as on a map: panics when there is no such label.
impl std::ops::Index<&str> for Labels {
    type Output = String;
    fn index(&self, key: &str) -> &String {
        &self.0[key]
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, String>::deserialize(d)?;
        let mut labels = Labels::new();
        for (k, v) in map {
            labels.insert(&k, v).map_err(serde::de::Error::custom)?;
        }
        Ok(labels)
    }
}

/// What an upload or a seal answers: the blob as this namespace now holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BlobRecord {
    /// `blake3:…`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub digest: Digest,
    /// `sha256:…` of the same bytes.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// `\n` count, plus one for a non-empty blob without a final `\n`.
    pub lines: u64,
    /// True when this namespace already held the blob.
    pub deduplicated: bool,
    /// When this reference expires (RFC 3339); null when pinned forever.
    pub expires_at: Option<String>,
}

/// One page of the capped read API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReadPage {
    /// The blob (for a stream, null until sealed).
    pub digest: Option<String>,
    /// Size of the whole blob or stream so far.
    pub total_size: u64,
    /// Lines of the whole blob or stream so far.
    pub total_lines: u64,
    /// Byte offset of the first content byte.
    pub offset: u64,
    /// Raw bytes of the original this page covers.
    pub length: u64,
    /// Where the next byte page starts; null at the end.
    pub next_offset: Option<u64>,
    /// True when the page reaches the end.
    pub eof: bool,
    /// Line holding the first byte.
    pub start_line: u64,
    /// Line holding the last byte.
    pub end_line: u64,
    /// The line to ask for next to continue with whole lines; null at the end.
    pub next_line: Option<u64>,
    /// True when the 100,000-byte cap cut the page short of what was asked.
    pub capped: bool,
    /// True when invalid UTF-8 was replaced.
    pub lossy: bool,
    /// The page's bytes as UTF-8, invalid sequences replaced (U+FFFD).
    pub content: String,
    /// Marks in `content`, when the page was read with `redact=true` (or by a redacted token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redactions: Option<u64>,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GrepMatch {
    /// 1-based line number.
    pub line: u64,
    /// The line (without its `\n`), shortened when over-long.
    pub text: String,
    /// True when `text` is only part of the line.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shortened: bool,
    /// Context lines before the match (`before=N`), those not already shown with the previous match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<ContextLine>,
    /// Context lines after the match (`after=N`), up to the next match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<ContextLine>,
}

/// A line shown around a match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextLine {
    /// 1-based line number.
    pub line: u64,
    /// The line (without its `\n`), shortened when over-long.
    pub text: String,
}

/// The answer of `grep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GrepResponse {
    /// Matching lines, in order.
    pub matches: Vec<GrepMatch>,
    /// Where to resume the search; null when the whole blob was searched.
    pub next_line: Option<u64>,
    /// True when the answer stopped at a cap (bytes or `max_matches`).
    pub capped: bool,
    /// Marks in the answer's text, when it was searched with `redact=true` (or by a redacted
    /// token): the pattern matched the redacted text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redactions: Option<u64>,
}

/// State of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Accepting appends at its current size.
    Open,
    /// Reached `max_bytes`; no more appends.
    Capped,
    /// Turned into a blob.
    Sealed,
}

impl StreamState {
    /// The database spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Capped => "capped",
            Self::Sealed => "sealed",
        }
    }
}

/// Answer of `POST /v1/streams`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamCreated {
    /// The stream's id.
    pub id: String,
    /// Its cap.
    pub max_bytes: u64,
}

/// Answer of `GET /v1/streams/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamInfo {
    /// The stream's id.
    pub id: String,
    /// Bytes written so far.
    pub size: u64,
    /// open, capped or sealed.
    pub state: StreamState,
    /// The sealed blob.
    pub digest: Option<String>,
    /// Its cap.
    pub max_bytes: u64,
    /// The task's exit code, once its supervisor sealed the stream saying so.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that ended the task (`TERM`, `KILL`, …), likewise.
    #[serde(default)]
    pub signal: Option<String>,
    /// True when the stream reached its cap (the task was stopped there).
    #[serde(default)]
    pub capped: bool,
}

/// Optional body of `POST /v1/streams/{id}/seal`: how the task ended, from its supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SealRequest {
    /// Exit code, when the task exited.
    #[serde(default, deserialize_with = "integral")]
    pub exit_code: Option<i32>,
    /// Signal name without `SIG` (`TERM`, `KILL`, …), when a signal ended it.
    #[serde(default)]
    pub signal: Option<String>,
}

/// Answer of a successful append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AppendResponse {
    /// Size after the append.
    pub size: u64,
    /// State after the append.
    pub state: StreamState,
}

/// One entry of `GET /v1/refs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RefEntry {
    /// The referenced blob, `blake3:…`.
    pub digest: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// Its lines, counted as the read API counts them (added in v1.1; 0 from older servers).
    #[serde(default)]
    pub lines: u64,
    /// The reference's labels.
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub labels: Labels,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; null for a pin.
    pub expires_at: Option<String>,
    /// True for a pin.
    pub pinned: bool,
}

/// Answer of `GET /v1/refs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RefList {
    /// This page of references, newest first.
    pub refs: Vec<RefEntry>,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

/// One match of `GET /v1/search`: a grep match, with the output it is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchMatch {
    /// The output, `blake3:…`.
    pub digest: String,
    /// The matching line, its number and its context, as grep gives them.
    #[serde(flatten)]
    pub found: GrepMatch,
    /// The labels of the output's newest matching reference.
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub labels: Labels,
}

/// The answer of `GET /v1/search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchResponse {
    /// Matches, newest output first, in line order within an output.
    pub matches: Vec<SearchMatch>,
    /// Outputs this answer searched (in whole or in part).
    pub outputs_scanned: u64,
    /// Outputs in which this answer found a match.
    pub outputs_matched: u64,
    /// True when the text cap or `max_matches` cut the answer short.
    pub capped: bool,
    /// Pass as `cursor` to go on; null once every output was searched.
    pub next_cursor: Option<String>,
    /// Marks in the answer's text, when it was searched with `redact=true` (or by a redacted token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redactions: Option<u64>,
}

/// The last second [`PinRequest::until`] may name: 9999-12-31T23:59:59Z (RFC 3339 times, in
/// which the answer names it, have four-digit years).
pub const LAST_UNIX_SECOND: i64 = 253_402_300_799;

/// Optional body of `POST /v1/blobs/{digest}/pin`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PinRequest {
    /// Why it is kept (an incident's id, say).
    #[serde(default)]
    pub reason: Option<String>,
    /// Keep it until this time (Unix seconds) instead of forever: a reference that expires
    /// then, which `DELETE …/pin` does not remove.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "integral")]
    pub until: Option<u64>,
}

/// Summary line of one retention pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetentionSummary {
    /// References past their TTL that were removed.
    pub references_expired: u64,
    /// Streams past their TTL that were removed.
    pub streams_expired: u64,
    /// Blobs whose bytes were deleted.
    pub blobs_deleted: u64,
    /// Bytes of blobs deleted (would be, on a dry run).
    pub bytes_freed: u64,
    /// Bytes with no metadata row (left by a crash) that were deleted.
    #[serde(default)]
    pub orphans_deleted: u64,
    /// Raw copies of compacted blobs (their chunks are the blob) that were deleted.
    #[serde(default)]
    pub raw_copies_deleted: u64,
    /// Packs of chunks no compacted blob needed any more that were deleted.
    #[serde(default)]
    pub packs_deleted: u64,
    /// Bytes of those packs.
    #[serde(default)]
    pub pack_bytes_freed: u64,
    /// True when nothing was changed.
    pub dry_run: bool,
}

/// What one compaction pass did (`spillway-server compact`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionSummary {
    /// Raw blobs turned into chunk lists.
    pub blobs_compacted: u64,
    /// Their raw bytes.
    pub bytes_before: u64,
    /// What their chunks added to the store (chunks already stored add nothing).
    pub bytes_after: u64,
}

/// An optional whole number from any JSON number that is one (`3` or `3.0`: JSON has no
/// separate integer type, and JSON Schema's `integer` accepts both).
fn integral<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i128>,
{
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(de)? else {
        return Ok(None);
    };
    let whole = match (n.as_i64(), n.as_u64(), n.as_f64()) {
        (Some(i), _, _) => Some(i128::from(i)),
        (None, Some(u), _) => Some(i128::from(u)),
        (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e30 => Some(f as i128),
        _ => None,
    };
    whole
        .and_then(|w| T::try_from(w).ok())
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("expected a whole number in range, got {n}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_hold_to_their_rule() {
        let mut l = Labels::new();
        l.insert("tool", "bash".into()).unwrap();
        assert_eq!(l.insert("tool", "x".into()), Err(LabelError::Twice("tool".into())));
        assert!(matches!(l.insert("Tool", "x".into()), Err(LabelError::Key(_))));
        assert!(l.insert(&"k".repeat(64), "v".repeat(crate::MAX_LABEL_VALUE)).is_ok());
        assert!(matches!(l.insert(&"k".repeat(65), "v".into()), Err(LabelError::Key(_))));
        assert_eq!(l.insert("long", "v".repeat(257)), Err(LabelError::Value("long".into(), 257)));
        for i in l.len()..crate::MAX_LABELS {
            l.insert(&format!("k{i}"), String::new()).unwrap();
        }
        assert_eq!(l.insert("one.more", String::new()), Err(LabelError::TooMany));
        assert_eq!(l.len(), crate::MAX_LABELS, "a refused label adds nothing");
        assert_eq!(l["tool"], "bash");
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<Labels>(&json).unwrap(), l);
        assert!(serde_json::from_str::<Labels>(r#"{"Bad Key": "v"}"#).is_err());
        assert_eq!(LabelError::TooMany.to_string(), "at most 16 labels");
        assert_eq!(LabelError::Value("k".into(), 300).to_string(), "label k is 300 bytes; the most is 256");
    }
}

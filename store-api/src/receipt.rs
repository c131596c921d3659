//! The receipt a tool hands the model in place of an over-long output.

use serde::{Deserialize, Serialize};

/// A byte range of the original output that a preview holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownRange {
    /// Where the range starts in the original.
    pub offset: u64,
    /// How many bytes of the original it covers.
    pub length: u64,
}

/// What the model receives instead of an over-long output. Only the structured fields
/// (`digest`, `file_path`) are ever followed as a location; text in `result` never is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The preview, at most the tool's cap, never splitting a UTF-8 character.
    pub result: String,
    /// False when `result` is the whole output.
    pub truncated: bool,
    /// Size of the whole output, in bytes.
    pub total_size: u64,
    /// Lines of the whole output.
    #[serde(default)]
    pub total_lines: u64,
    /// Byte ranges of the original that `result` holds.
    #[serde(default)]
    pub shown: Vec<ShownRange>,
    /// Local copy of the full output, when one was written.
    pub file_path: Option<String>,
    /// Store digest of the full output, when it was uploaded.
    pub digest: Option<String>,
    /// Whether the full output was stored (true when nothing needed storing).
    pub saved: bool,
    /// How to get the rest, written at the moment of truncation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Why the full output was not saved, when `saved` is false: a typed cause an agent
    /// platform can alert on (a refused token loses every spill of a worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_error: Option<SaveError>,
    /// Secrets `result` shows as `[REDACTED:kind]` marks (0 when none); absent when the
    /// preview was made with redaction off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redactions: Option<u64>,
}

/// Why a spill failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveError {
    /// The cause, by kind.
    pub cause: SaveFailure,
    /// The cause in plain words, naming the store's URL or the directory.
    pub message: String,
}

/// The kinds of spill failure a platform tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveFailure {
    /// The store refused the token (401).
    Unauthorized,
    /// The token may not write (403).
    Forbidden,
    /// The output is over the store's size limit (413).
    TooLarge,
    /// Nothing listens at the store's address.
    ConnectionRefused,
    /// The store did not answer within the save deadline (3 s).
    Timeout,
    /// The store is out of space (507) or down (503).
    StoreUnavailable,
    /// A local directory could not be written.
    LocalIo,
    /// A failure none of the causes above names (its message says what it was).
    Other,
}

//! The tool side of Spillway: what runs inside an agent worker.
//!
//! - [`truncate`]: per-tool strategies that keep what the model sees under a cap.
//! - [`receipt`]: the structured receipt that replaces an over-long output.
//! - [`spill`]: where full outputs go — the store ([`spill::RemoteStore`]) or a local
//!   directory ([`spill::LocalDir`]) — always within the 3-second deadline.
//! - [`capture`]: `exec`, streaming capture of a command with bounded memory.
//! - [`input`]: a saved output as a command's stdin; [`resolve`]: references in tool arguments.
//! - [`gate`]: the per-turn 200,000-byte gate.
//! - [`background`]: background tasks streamed to the store, capped at 50 MiB.
//! - [`store`]: the typed HTTP client of the v1 contract, for SRE tools.
//!
//! Wrapping a tool: the model gets the receipt, never the raw output.
//!
//! ```
//! use std::sync::Arc;
//! use spillway_client::{capture, receipt, spill, truncate};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! // Spill to the shared store when one is configured; here, to a local directory.
//! let target: Arc<dyn spill::SpillTarget> = match std::env::var("SPILLWAY_EXAMPLE_URL") {
//!     Ok(url) => Arc::new(spill::RemoteStore::new(spillway_client::StoreClient::new(url, "token"))),
//!     Err(_) => Arc::new(spill::LocalDir::new(dir.path().join(".outputs"))),
//! };
//!
//! // A shell tool: stdout and stderr each get a receipt; the model sees at most the cap.
//! let mut cmd = tokio::process::Command::new("seq");
//! cmd.args(["1", "100000"]);
//! let run = capture::exec(cmd, &capture::ExecOptions::new(target.clone())).await?;
//! assert!(run.stdout.truncated && run.stdout.saved);
//! assert!(run.stdout.result.len() <= 100_000);
//! assert!(run.stdout.result.ends_with("100000\n")); // the tail, where errors are, is kept
//! let full = std::fs::read_to_string(run.stdout.file_path.as_deref().unwrap())?;
//! assert_eq!(full.lines().count(), 100_000);
//!
//! // A file reader: whole numbered lines and where to continue.
//! let text = full.into_bytes();
//! let sample = truncate::Sample::whole(&text);
//! let page = truncate::preview(&sample, 10_000, truncate::Strategy::NumberedLines { first_line: 1 })?;
//! let mut deadline = spill::Deadline::new(spill::DEFAULT_SAVE_DEADLINE);
//! let saved = match target.save(text.clone().into(), &[], &mut deadline).await {
//!     Ok(loc) => receipt::Saved::At(loc),
//!     Err(e) => receipt::Saved::Failed(e.save_error()),
//! };
//! let r = receipt::build(page, sample.total, sample.total_lines, saved);
//! assert!(r.hint.unwrap().contains("continue") || r.result.contains("continue from line"));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod background;
pub mod capture;
pub mod cli;
pub mod conn;
pub mod error;
pub mod gate;
pub mod input;
pub mod local;
pub mod mcp;
pub mod output;
mod plain;
pub mod reader;
pub mod receipt;
pub mod resolve;
pub mod spill;
pub mod store;
pub mod transfer;
pub mod truncate;

pub use error::{ClientError, Result};
pub use spillway_api::Receipt;
pub use store::{GrepRequest, ReadRequest, SearchRequest, StoreClient, UploadOptions};

/// Cases of a property test: `n`, or `PROPTEST_CASES` when set (`scripts/mutants` runs fewer).
#[cfg(test)]
pub(crate) fn test_cases(n: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(n)
}

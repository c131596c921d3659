//! The tool side of Spillway: what runs inside an agent worker.
//!
//! - [`truncate`]: per-tool strategies that keep what the model sees under a cap.
//! - [`receipt`]: the structured receipt that replaces an over-long output.
//! - [`spill`]: where full outputs go — the store ([`spill::RemoteStore`]) or a local
//!   directory ([`spill::LocalDir`]) — always within the 3-second deadline.
//! - [`capture`]: `exec`, streaming capture of a command with bounded memory.
//! - [`gate`]: the per-turn 200,000-byte gate.
//! - [`background`]: background tasks streamed to the store, capped at 50 MiB.
//! - [`store`]: the typed HTTP client of the v1 contract, for SRE tools.
//!
//! Wrapping a tool: the model gets the receipt, never the raw output.
//!
//! ```no_run
//! use std::sync::Arc;
//! use spillway_client::{capture, spill, truncate, receipt};
//!
//! # async fn demo() -> spillway_client::Result<()> {
//! // Spill to the shared store when one is configured, else to ./.outputs.
//! let target: Arc<dyn spill::SpillTarget> = match std::env::var("SPILLWAY_URL") {
//!     Ok(url) => Arc::new(spill::RemoteStore::new(spillway_client::StoreClient::new(
//!         url,
//!         std::env::var("SPILLWAY_TOKEN").unwrap_or_default(),
//!     ))),
//!     Err(_) => Arc::new(spill::LocalDir::new(".outputs")),
//! };
//!
//! // A shell tool: stdout and stderr each get a receipt.
//! let mut cmd = tokio::process::Command::new("cargo");
//! cmd.arg("build");
//! let run = capture::exec(cmd, &capture::ExecOptions::new(target.clone())).await?;
//! println!("{}", serde_json::to_string(&run.stderr)?);
//!
//! // A file reader: whole numbered lines and where to continue.
//! let text = std::fs::read("big.log")?;
//! let sample = truncate::Sample::whole(&text);
//! let page = truncate::preview(&sample, 100_000, truncate::Strategy::NumberedLines { first_line: 1 })
//!     .expect("numbered lines never refuse");
//! let saved = if page.truncated {
//!     let mut deadline = spill::Deadline::new(spill::DEFAULT_SAVE_DEADLINE);
//!     match target.save(text.clone().into(), &[], &mut deadline).await {
//!         Ok(loc) => receipt::Saved::At(loc),
//!         Err(e) => receipt::Saved::Failed(e.to_string()),
//!     }
//! } else {
//!     receipt::Saved::NotNeeded
//! };
//! let r = receipt::build(page, sample.total, sample.total_lines, saved);
//! assert!(r.result.len() <= 100_000);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod background;
pub mod capture;
pub mod cli;
pub mod error;
pub mod gate;
pub mod local;
pub mod receipt;
pub mod spill;
pub mod store;
pub mod truncate;

pub use error::{ClientError, Result};
pub use spillway_api::Receipt;
pub use store::{GrepRequest, ReadRequest, StoreClient, UploadOptions};

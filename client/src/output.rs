//! One output a tool holds whole, handed to the model: the output itself when it fits, else a
//! receipt — the preview its strategy cuts, and the full output saved within the deadline.
//! (Command output, which is never held whole, goes through `capture` instead.)

use std::time::Duration;

use bytes::Bytes;

use crate::receipt;
use crate::spill::{Deadline, SpillTarget, DEFAULT_SAVE_DEADLINE};
use crate::truncate;

/// How [`spill`] treats one output.
#[derive(Debug, Clone)]
pub struct SpillOptions {
    /// Bytes the model may see.
    pub cap: usize,
    /// How to cut.
    pub strategy: truncate::Strategy,
    /// Labels of the spill.
    pub labels: Vec<(String, String)>,
    /// Whether the preview shows secrets as marks (on by default; the spill is exact).
    pub redaction: truncate::Redaction,
    /// Who reads the receipt's hint.
    pub readers: receipt::Readers,
    /// Most time the save may wait on its target.
    pub save_deadline: Duration,
}

impl Default for SpillOptions {
    fn default() -> Self {
        Self {
            cap: truncate::DEFAULT_CAP,
            strategy: truncate::Strategy::default(),
            labels: Vec::new(),
            redaction: truncate::Redaction::On,
            readers: receipt::Readers::Cli,
            save_deadline: DEFAULT_SAVE_DEADLINE,
        }
    }
}

/// What a tool hands the model for one output it holds whole: the output itself when it fits
/// (secrets marked), else a receipt with the preview its strategy cuts and the full output
/// saved to `target` within the save deadline (`saved: false`, and why, when that failed). A
/// `Reject` strategy's refusal is the `Err`.
pub async fn spill(
    output: Bytes,
    target: &dyn SpillTarget,
    opts: &SpillOptions,
) -> std::result::Result<spillway_api::Receipt, truncate::Rejected> {
    let sample = truncate::Sample::whole(&output);
    let preview = truncate::preview_with(&sample, opts.cap, opts.strategy, &opts.redaction)?;
    let saved = if preview.truncated {
        let mut deadline = Deadline::new(opts.save_deadline);
        match target.save(output.clone(), &opts.labels, &mut deadline).await {
            Ok(loc) => receipt::Saved::At(loc),
            Err(e) => receipt::Saved::Failed(e.save_error()),
        }
    } else {
        receipt::Saved::NotNeeded
    };
    Ok(receipt::build_for(preview, sample.total, sample.total_lines, saved, opts.readers))
}

//! Receipts: what a tool hands the model in place of an over-long output. The location is
//! data (`digest`, `file_path`), never prose, and `hint` tells how to get the rest with the
//! real digest or path filled in, at the moment of truncation.

use spillway_api::Receipt;

use crate::spill::Location;
use crate::truncate::{thousands, Preview};

/// How the full output fared.
#[derive(Debug, Clone)]
pub enum Saved {
    /// Nothing needed saving: the preview is the whole output.
    NotNeeded,
    /// Stored at this location.
    At(Location),
    /// Could not be stored (the reason is for people).
    Failed(String),
}

/// Builds the receipt of one output.
pub fn build(preview: Preview, total_size: u64, total_lines: u64, saved: Saved) -> Receipt {
    let next_line = preview.next_line.unwrap_or(1);
    let mut r = Receipt {
        result: preview.text,
        truncated: preview.truncated,
        total_size,
        total_lines,
        shown: preview.shown,
        file_path: None,
        digest: None,
        saved: true,
        hint: None,
    };
    if !r.truncated {
        return r;
    }
    let size = format!("{} bytes, {} lines", thousands(total_size), thousands(total_lines));
    match saved {
        Saved::NotNeeded => {}
        Saved::At(Location::Store { digest }) => {
            r.hint = Some(format!(
                "The full output ({size}) is saved in the store as {digest}. Read it page by page with \
                 `spillway read {digest} --line {next_line} --lines 2000` (each page at most 100,000 bytes; \
                 follow next_line), search it with `spillway grep {digest} PATTERN`, or fetch it whole with \
                 `spillway get {digest} -o FILE`."
            ));
            r.digest = Some(digest);
        }
        Saved::At(Location::File { path, digest }) => {
            let p = path.display().to_string();
            r.hint = Some(format!(
                "The full output ({size}) is saved at {p}. Read more with `sed -n '{next_line},{}p' {p}` or the \
                 read tool from line {next_line}, search it with `grep -n PATTERN {p}`, or see the end with \
                 `tail -n 100 {p}`.",
                next_line + 1999
            ));
            r.file_path = Some(p);
            r.digest = digest;
        }
        Saved::Failed(reason) => {
            r.saved = false;
            r.hint = Some(format!(
                "The full output ({size}) was NOT saved ({reason}) and cannot be retrieved; only the preview \
                 above exists. Narrow the command (filter with grep, head or tail, or ask for less) and run it again."
            ));
        }
    }
    r
}

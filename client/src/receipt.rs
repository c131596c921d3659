//! Receipts: what a tool hands the model in place of an over-long output. The location is
//! data (`digest`, `file_path`), never prose, and `hint` tells how to get the rest with the
//! real digest or path filled in, at the moment of truncation. Hints name only capped
//! readers, and follow the cursor rule: continue with `next_line` when a page gives one, else
//! with `next_offset`.

use spillway_api::{Receipt, SaveError};

use crate::spill::Location;
use crate::truncate::{thousands, Preview};

/// How the full output fared.
#[derive(Debug, Clone)]
pub enum Saved {
    /// Nothing needed saving: the preview is the whole output.
    NotNeeded,
    /// Stored at this location.
    At(Location),
    /// Could not be stored, and why.
    Failed(SaveError),
}

/// Who reads the hint: a model with the `spillway` CLI in its shell, or one with the MCP tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Readers {
    /// `spillway read …` / `spillway grep …` commands.
    #[default]
    Cli,
    /// The `read` and `grep` tools of `spillway mcp`.
    Mcp,
}

/// Builds the receipt of one output, with hints for the CLI.
pub fn build(preview: Preview, total_size: u64, total_lines: u64, saved: Saved) -> Receipt {
    build_for(preview, total_size, total_lines, saved, Readers::Cli)
}

/// Builds the receipt of one output, with hints for `readers`.
pub fn build_for(preview: Preview, total_size: u64, total_lines: u64, saved: Saved, readers: Readers) -> Receipt {
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
        save_error: None,
    };
    if !r.truncated {
        return r;
    }
    let size = format!("{} bytes, {} lines", thousands(total_size), thousands(total_lines));
    const PAGING: &str = "each page at most 100,000 bytes; continue with next_line when a page gives one, \
                          else with next_offset";
    match saved {
        Saved::NotNeeded => {}
        Saved::At(Location::Store { digest }) => {
            let how = match readers {
                Readers::Cli => format!(
                    "Read it page by page with `spillway read {digest} --line {next_line} --lines 2000` ({PAGING}), \
                     search it with `spillway grep {digest} PATTERN`, or fetch it whole with \
                     `spillway get {digest} -o FILE`."
                ),
                Readers::Mcp => format!(
                    "Read it page by page with the read tool (digest {digest}, line {next_line}; {PAGING}) or \
                     search it with the grep tool."
                ),
            };
            r.hint = Some(format!("The full output ({size}) is saved in the store as {digest}. {how}"));
            r.digest = Some(digest);
        }
        Saved::At(Location::File { path, digest }) => {
            let p = path.display().to_string();
            let dir = path.parent().map(|d| d.display().to_string()).unwrap_or_else(|| ".".into());
            let name = digest.clone().unwrap_or_else(|| p.clone());
            let how = match readers {
                Readers::Cli => format!(
                    "Read it page by page with `spillway read --local {dir} {name} --line {next_line} --lines 2000` \
                     ({PAGING}) or search it with `spillway grep --local {dir} {name} PATTERN`."
                ),
                Readers::Mcp => format!(
                    "Read it page by page with the read tool (digest {name}, line {next_line}; {PAGING}) or \
                     search it with the grep tool."
                ),
            };
            r.hint = Some(format!("The full output ({size}) is saved at {p}. {how}"));
            r.file_path = Some(p);
            r.digest = digest;
        }
        Saved::Failed(why) => {
            r.saved = false;
            r.hint = Some(format!(
                "The full output ({size}) was NOT saved ({}) and cannot be retrieved; only the preview \
                 above exists. Narrow the command (filter with grep, head or tail, or ask for less) and run it again.",
                why.message
            ));
            r.save_error = Some(why);
        }
    }
    r
}

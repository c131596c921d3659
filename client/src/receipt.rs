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
    let redacted = preview.redactions.is_some_and(|n| n > 0);
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
        redactions: preview.redactions,
    };
    if !r.truncated {
        return r;
    }
    let size = format!("{} bytes, {} lines", thousands(total_size), thousands(total_lines));
    match saved {
        Saved::NotNeeded => {}
        Saved::At(Location::Store { digest }) => {
            r.hint = Some(store_hint(&size, &digest, next_line, readers, redacted));
            r.digest = Some(digest);
        }
        Saved::At(Location::File { path, digest }) => {
            r.hint = Some(file_hint(&size, &path, digest.as_deref(), next_line, readers, redacted));
            r.file_path = Some(path.display().to_string());
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

/// How to page a capped read: the cursor rule, in words.
const PAGING: &str = "each page at most 100,000 bytes; continue with next_line when a page gives one, \
                      else with next_offset";

/// What the CLI readers are given when the preview was redacted: the same redaction on the
/// pages (the MCP tools always redact).
fn redact_flag(redacted: bool) -> &'static str {
    if redacted {
        " --redact"
    } else {
        ""
    }
}

fn store_hint(size: &str, digest: &str, next_line: u64, readers: Readers, redacted: bool) -> String {
    let r = redact_flag(redacted);
    let how = match readers {
        Readers::Cli if redacted => format!(
            "Secrets in it are shown as [REDACTED:kind] marks. Read it page by page with \
             `spillway read{r} {digest} --line {next_line} --lines 2000` ({PAGING}) or search it with \
             `spillway grep{r} {digest} PATTERN`."
        ),
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
    format!("The full output ({size}) is saved in the store as {digest}. {how} {}", process(readers, "", digest))
}

/// How to work on a saved output without reading it: its bytes as a command's stdin.
fn process(readers: Readers, local: &str, name: &str) -> String {
    match readers {
        Readers::Cli => {
            format!("Process it without reading it: `spillway exec{local} --stdin {name} -- jq|awk|sort|cut|wc …`.")
        }
        Readers::Mcp => {
            format!("Process it without reading it: the run tool with stdin {name} and jq, awk, sort, cut.")
        }
    }
}

fn file_hint(
    size: &str,
    path: &std::path::Path,
    digest: Option<&str>,
    next_line: u64,
    readers: Readers,
    redacted: bool,
) -> String {
    let p = path.display().to_string();
    let dir = path.parent().map(|d| d.display().to_string()).unwrap_or_else(|| ".".into());
    let name = digest.unwrap_or(&p);
    let r = redact_flag(redacted);
    let how = match readers {
        Readers::Cli => format!(
            "Read it page by page with `spillway read --local {dir}{r} {name} --line {next_line} --lines 2000` \
             ({PAGING}) or search it with `spillway grep --local {dir}{r} {name} PATTERN`."
        ),
        Readers::Mcp => format!(
            "Read it page by page with the read tool (digest {name}, line {next_line}; {PAGING}) or \
             search it with the grep tool."
        ),
    };
    let process = match digest {
        Some(d) => format!(" {}", process(readers, &format!(" --local {dir}"), d)),
        None => String::new(),
    };
    format!("The full output ({size}) is saved at {p}. {how}{process}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_api::{SaveFailure, ShownRange};

    fn preview(truncated: bool, next_line: Option<u64>) -> Preview {
        Preview {
            text: "head".into(),
            shown: vec![ShownRange { offset: 0, length: 4 }],
            truncated,
            next_line,
            redactions: None,
        }
    }

    #[test]
    fn a_whole_output_needs_no_location_and_no_hint() {
        let r = build(preview(false, None), 4, 1, Saved::NotNeeded);
        assert_eq!((r.result.as_str(), r.truncated, r.saved, r.total_size, r.total_lines), ("head", false, true, 4, 1));
        assert!(r.hint.is_none() && r.digest.is_none() && r.file_path.is_none() && r.save_error.is_none());
        assert_eq!(r.shown, [ShownRange { offset: 0, length: 4 }]);
    }

    #[test]
    fn a_stored_output_says_how_to_page_it_for_each_reader() {
        let at = || Saved::At(Location::Store { digest: "blake3:d1".into() });
        let r = build(preview(true, Some(41)), 1_234_567, 2_000, at());
        assert_eq!((r.digest.as_deref(), r.file_path.as_deref(), r.saved), (Some("blake3:d1"), None, true));
        let hint = r.hint.unwrap();
        assert!(hint.starts_with("The full output (1,234,567 bytes, 2,000 lines) is saved in the store as blake3:d1."));
        assert!(hint.contains("`spillway read blake3:d1 --line 41 --lines 2000`"), "{hint}");
        assert!(
            hint.contains("`spillway grep blake3:d1 PATTERN`") && hint.contains("`spillway get blake3:d1 -o FILE`")
        );
        assert!(hint.contains("next_line when a page gives one, else with next_offset"));
        assert!(hint.contains("`spillway exec --stdin blake3:d1 -- jq|awk|sort|cut|wc …`"), "{hint}");
        let r = build_for(preview(true, None), 10, 1, at(), Readers::Mcp);
        let hint = r.hint.unwrap();
        assert!(hint.contains("the read tool (digest blake3:d1, line 1;") && hint.contains("the grep tool"), "{hint}");
        assert!(!hint.contains("spillway read"), "MCP readers get tools, not commands");
        assert!(hint.ends_with("the run tool with stdin blake3:d1 and jq, awk, sort, cut."), "{hint}");
    }

    #[test]
    fn a_local_spill_names_its_directory_and_file() {
        let file = Saved::At(Location::File { path: "/w/.outputs/abc".into(), digest: Some("blake3:abc".into()) });
        let r = build(preview(true, Some(7)), 10, 2, file);
        assert_eq!((r.file_path.as_deref(), r.digest.as_deref()), (Some("/w/.outputs/abc"), Some("blake3:abc")));
        let hint = r.hint.unwrap();
        assert!(hint.contains("is saved at /w/.outputs/abc."), "{hint}");
        assert!(hint.contains("`spillway read --local /w/.outputs blake3:abc --line 7 --lines 2000`"), "{hint}");
        assert!(hint.contains("`spillway grep --local /w/.outputs blake3:abc PATTERN`"));
        assert!(hint.contains("`spillway exec --local /w/.outputs --stdin blake3:abc --"), "{hint}");
        let nameless = Saved::At(Location::File { path: "/w/out.txt".into(), digest: None });
        let hint = build_for(preview(true, Some(3)), 10, 2, nameless, Readers::Mcp).hint.unwrap();
        assert!(hint.contains("the read tool (digest /w/out.txt, line 3;"), "{hint}");
    }

    #[test]
    fn a_failed_save_is_not_a_location() {
        let why = SaveError { cause: SaveFailure::Timeout, message: "no answer from http://s within 3 s".into() };
        let r = build(preview(true, Some(2)), 5_000, 10, Saved::Failed(why.clone()));
        assert!(!r.saved && r.digest.is_none() && r.file_path.is_none());
        assert_eq!(r.save_error, Some(why));
        let hint = r.hint.unwrap();
        assert!(hint.contains("(5,000 bytes, 10 lines) was NOT saved (no answer from http://s within 3 s)"), "{hint}");
        assert!(hint.contains("cannot be retrieved"));
    }
}

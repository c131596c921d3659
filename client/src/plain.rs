//! Pages, greps and searches as text for a person at a terminal (`--text`): the content as it
//! is, `LINE:text` rows (grep's `LINE-text` for context lines), and what to ask for next on
//! stderr, so that stdout pipes into `less` or `grep` as a file's would.

use std::io::Write;

use spillway_api::{GrepMatch, GrepResponse, ReadPage, SearchResponse};

use crate::error::Result;

/// A page's content; on stderr, where the next page starts.
pub(crate) fn page(p: &ReadPage) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(p.content.as_bytes())?;
    out.flush()?;
    match (p.next_line, p.next_offset) {
        (_, None) => {}
        (Some(line), _) if p.capped || !p.eof => {
            eprintln!("spillway: more from line {line} (--line {line}) or byte {}", p.next_offset.unwrap_or_default())
        }
        (_, Some(offset)) => eprintln!("spillway: more from byte {offset} (--offset {offset})"),
    }
    Ok(())
}

/// One `LINE:text` row per match (context lines as `LINE-text`, groups apart as grep puts
/// them); on stderr, the line to go on from.
pub(crate) fn grep(g: &GrepResponse) -> Result<()> {
    let mut out = std::io::stdout().lock();
    write_matches(&mut out, &g.matches)?;
    out.flush()?;
    if let Some(line) = g.next_line {
        eprintln!("spillway: more matches from line {line} (--from-line {line})");
    }
    Ok(())
}

/// Each output's matches under its digest; on stderr, the cursor to go on with.
pub(crate) fn search(s: &SearchResponse) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let mut last: Option<&str> = None;
    for m in &s.matches {
        if last != Some(m.digest.as_str()) {
            if last.is_some() {
                writeln!(out)?;
            }
            writeln!(out, "{}", m.digest)?;
            last = Some(m.digest.as_str());
        }
        write_matches(&mut out, std::slice::from_ref(&m.found))?;
    }
    out.flush()?;
    if let Some(cursor) = &s.next_cursor {
        eprintln!("spillway: more with --cursor {cursor}");
    }
    Ok(())
}

fn write_matches(out: &mut impl Write, matches: &[GrepMatch]) -> std::io::Result<()> {
    let mut previous: Option<u64> = None;
    for m in matches {
        let first = m.before.first().map_or(m.line, |c| c.line);
        if previous.is_some_and(|p| first > p + 1) && (!m.before.is_empty() || !m.after.is_empty()) {
            writeln!(out, "--")?;
        }
        for c in &m.before {
            writeln!(out, "{}-{}", c.line, c.text)?;
        }
        writeln!(out, "{}:{}", m.line, m.text)?;
        for c in &m.after {
            writeln!(out, "{}-{}", c.line, c.text)?;
        }
        previous = Some(m.after.last().map_or(m.line, |c| c.line));
    }
    Ok(())
}

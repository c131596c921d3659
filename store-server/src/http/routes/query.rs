//! The query of the capped read API, shared by blob and stream reads, and the read it asks for.

use crate::blobs::source::PageAsk;
use crate::streams::Position;
use serde::Deserialize;
use spillway_api::paging::{self as page, Source, SourceError};
use spillway_api::redact::Detector;
use spillway_api::{ReadPage, DEFAULT_PAGE_LINES, READ_CAP};

use crate::error::{ApiError, ApiResult};

/// Query of grep.
#[derive(Debug, Clone, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct GrepQuery {
    /// Rust `regex` syntax.
    pattern: String,
    /// Case-insensitive.
    #[serde(default)]
    ignore_case: bool,
    /// Treat the pattern as a literal.
    #[serde(default)]
    fixed: bool,
    /// 1-based line to start at.
    from_line: Option<u64>,
    /// Most matches to return.
    max_matches: Option<usize>,
    /// Context lines before each match (at most 100).
    before: Option<usize>,
    /// Context lines after each match (at most 100).
    after: Option<usize>,
    /// Search the text with secrets replaced by marks, and show it so (always, for a redacted token).
    #[serde(default)]
    redact: bool,
}

impl GrepQuery {
    /// The pattern, compiled with the limits every backend shares.
    pub(crate) fn compile(&self) -> ApiResult<regex::bytes::Regex> {
        Ok(page::compile_pattern(&self.pattern, self.fixed, self.ignore_case)?)
    }

    /// Whether the query asks for redaction (a redacted token gets it either way).
    pub(crate) fn redact(&self) -> bool {
        self.redact
    }

    /// The search this query asks for, scanning until `deadline`, over the redacted text when
    /// `redact` is given.
    pub(crate) fn request<'a>(
        &self,
        regex: &'a regex::bytes::Regex,
        deadline: Option<std::time::Instant>,
        redact: Option<&'a Detector>,
    ) -> page::GrepRequest<'a> {
        page::GrepRequest {
            regex,
            from_line: self.from_line.unwrap_or(1),
            max_matches: self.max_matches.unwrap_or(usize::MAX),
            before: self.before.unwrap_or(0),
            after: self.after.unwrap_or(0),
            deadline,
            redact,
            max_text: READ_CAP,
        }
    }
}

/// Query of the capped read API.
#[derive(Debug, Clone, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReadQuery {
    /// Byte page start.
    offset: Option<u64>,
    /// Byte page length (capped at 100,000).
    limit: Option<u64>,
    /// Line page start, 1-based.
    line: Option<u64>,
    /// Lines in a line page (default 2000).
    lines: Option<u64>,
    /// The last N lines (1 to 1,000,000) as a line page, `start_line` saying where they
    /// start; when N lines do not fit 100,000 bytes, the last ones that do. Not with `line`,
    /// `lines`, `offset` or `limit`.
    #[param(minimum = 1, maximum = 1_000_000)]
    tail_lines: Option<u64>,
    /// Streams only: long-poll this many milliseconds (≤ 30000) for data.
    wait_ms: Option<u64>,
    /// Show secrets as marks (`redactions` counts them); always, for a redacted token.
    #[serde(default)]
    redact: bool,
}

impl ReadQuery {
    /// The byte position a long-poll waits to be passed.
    /// The position a long-poll waits for data at: a byte offset, or a 1-based line.
    pub(crate) fn wants_after(&self) -> Position {
        match self.line.or(self.lines.map(|_| 1)) {
            Some(line) => Position::Line(line),
            None => Position::Byte(self.offset.unwrap_or(0)),
        }
    }

    /// The page asked for, defaults filled in (after [`ReadQuery::check`]).
    pub(crate) fn page(&self) -> PageAsk {
        match self.line.or(self.lines.map(|_| 1)) {
            Some(line) => PageAsk::Lines { line, lines: self.lines.unwrap_or(DEFAULT_PAGE_LINES) },
            None => PageAsk::Bytes { offset: self.offset.unwrap_or(0), limit: self.limit.unwrap_or(READ_CAP as u64) },
        }
    }

    /// `tail_lines`, when the read asks for the last lines.
    pub(crate) fn tail_lines(&self) -> Option<u64> {
        self.tail_lines
    }

    pub(crate) fn wait_ms(&self) -> Option<u64> {
        self.wait_ms
    }

    /// Whether the query asks for redaction (a redacted token gets it either way).
    pub(crate) fn redact(&self) -> bool {
        self.redact
    }

    /// Checks what does not depend on the source, before any waiting.
    pub(crate) fn check(&self) -> ApiResult<()> {
        if self.offset.or(self.limit).is_some() && self.line.or(self.lines).is_some() {
            return Err(ApiError::InvalidArgument("use offset/limit or line/lines, not both".into()));
        }
        if self.line == Some(0) || self.lines == Some(0) {
            return Err(ApiError::InvalidArgument("line and lines start at 1".into()));
        }
        if let Some(n) = self.tail_lines {
            if self.offset.or(self.limit).or(self.line).or(self.lines).is_some() {
                return Err(ApiError::InvalidArgument(
                    "tail_lines is not taken with line, lines, offset or limit".into(),
                ));
            }
            if !(1..=page::MAX_TAIL_LINES).contains(&n) {
                return Err(ApiError::InvalidArgument(format!("tail_lines must be 1 to {}", page::MAX_TAIL_LINES)));
            }
        }
        Ok(())
    }
}

/// Runs a read over any source, with secrets shown as marks when `redact` is given.
pub(crate) async fn page_of<E>(
    src: &dyn Source<Error = E>,
    q: &ReadQuery,
    redact: Option<&Detector>,
) -> ApiResult<ReadPage>
where
    E: SourceError + Into<ApiError>,
{
    if let Some(n) = q.tail_lines {
        // The last lines are a line page from the line `tail_start` finds.
        let line = page::tail_start(src, n).await?;
        let lines = (src.total_lines() + 1 - line).max(1);
        let page = match redact {
            None => page::line_page(src, line, lines).await?,
            Some(d) => page::line_page_redacted(src, line, lines, d).await?,
        };
        count_page(&page);
        return Ok(page);
    }
    let page = match (q.page(), redact) {
        (PageAsk::Lines { line, lines }, None) => page::line_page(src, line, lines).await?,
        (PageAsk::Lines { line, lines }, Some(d)) => page::line_page_redacted(src, line, lines, d).await?,
        (PageAsk::Bytes { offset, limit }, None) => page::byte_page(src, offset, limit).await?,
        (PageAsk::Bytes { offset, limit }, Some(d)) => page::byte_page_redacted(src, offset, limit, d).await?,
    };
    count_page(&page);
    Ok(page)
}

/// Counts a page served in the metrics (handles made once, after the server installed its
/// recorder: looking them up costs more than counting).
pub(crate) fn count_page(page: &ReadPage) {
    static CAPPED: std::sync::LazyLock<metrics::Counter> =
        std::sync::LazyLock::new(|| metrics::counter!("spillway_read_capped_total"));
    static BYTES_OUT: std::sync::LazyLock<metrics::Counter> =
        std::sync::LazyLock::new(|| metrics::counter!("spillway_bytes_out_total"));
    if page.capped {
        CAPPED.increment(1);
    }
    BYTES_OUT.increment(page.length);
}

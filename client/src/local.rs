//! `--local DIR`: the read, grep and get commands over a directory of spills, with the same
//! caps and the same JSON as the server.

use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use spillway_api::paging::lines::{Checkpoint, LineIndex, LineIndexBuilder};
use spillway_api::paging::{self, GrepRequest, PageError, Source};
use spillway_api::redact::Detector;
use spillway_api::{Digest, GrepResponse, ReadPage, DEFAULT_PAGE_LINES, READ_CAP};

use crate::error::{ClientError, Result};
use crate::spill::LocalDir;

/// A local spill file opened for paging: indexed once, read by range.
pub struct LocalSource {
    path: PathBuf,
    digest: Digest,
    size: u64,
    lines: u64,
    index: LineIndex,
}

impl LocalSource {
    /// Opens the spill of `digest` in `dir`; a missing file is `not found`.
    pub async fn open(dir: &LocalDir, digest: &Digest) -> Result<Self> {
        let path = dir.path_of(digest);
        let path2 = path.clone();
        let built = tokio::task::spawn_blocking(move || -> std::io::Result<LineIndexBuilder> {
            use std::io::Read;
            let mut f = std::fs::File::open(&path2)?;
            let mut b = LineIndexBuilder::default();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    return Ok(b);
                }
                b.update(&buf[..n]);
            }
        })
        .await
        .map_err(|e| ClientError::Other(e.to_string()))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ClientError::Api {
                status: 404,
                code: spillway_api::ErrorCode::NotFound,
                message: format!("{digest} not found in {}", dir.dir().display()),
            },
            _ => ClientError::Io(e),
        })?;
        Ok(Self { path, digest: *digest, size: built.size(), lines: built.lines(), index: built.finish() })
    }

    /// The spill file this source reads.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

#[async_trait]
impl Source for LocalSource {
    type Error = std::io::Error;
    fn size(&self) -> u64 {
        self.size
    }
    fn total_lines(&self) -> u64 {
        self.lines
    }
    fn digest(&self) -> Option<String> {
        Some(self.digest.to_string())
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> std::io::Result<Checkpoint> {
        Ok(self.index.for_offset(offset))
    }
    async fn checkpoint_for_line(&self, line: u64) -> std::io::Result<Checkpoint> {
        Ok(self.index.for_line(line))
    }
    async fn read(&self, start: u64, end: u64) -> std::io::Result<Bytes> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<Bytes> {
            let mut f = std::fs::File::open(path)?;
            f.seek(SeekFrom::Start(start))?;
            let mut buf = vec![0u8; (end - start) as usize];
            f.read_exact(&mut buf)?;
            Ok(Bytes::from(buf))
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// A paging refusal as the server would answer it (the same status and code), so that
/// `--local` and the store fail alike; the file's own failures stay I/O errors.
fn page_err<E: Into<ClientError>>(e: PageError<E>) -> ClientError {
    match e {
        PageError::InvalidArgument(m) => {
            ClientError::Api { status: 400, code: spillway_api::ErrorCode::InvalidArgument, message: m }
        }
        PageError::RangeNotSatisfiable { message, .. } => {
            ClientError::Api { status: 416, code: spillway_api::ErrorCode::RangeNotSatisfiable, message }
        }
        PageError::Source(e) => e.into(),
        PageError::Changed(why) => ClientError::Other(format!("the spill changed while it was read: {why}")),
    }
}

/// A capped page of a local spill, exactly as the server would answer (with secrets shown as
/// marks when `redact` is given, as `redact=true` asks the server).
pub async fn read(src: &LocalSource, req: crate::store::ReadRequest, redact: Option<&Detector>) -> Result<ReadPage> {
    use crate::store::ReadRequest::{Bytes, Lines, Tail};
    let r = match (req, redact) {
        (Bytes { offset, limit }, None) => paging::byte_page(src, offset, limit.unwrap_or(READ_CAP as u64)).await,
        (Bytes { offset, limit }, Some(d)) => {
            paging::byte_page_redacted(src, offset, limit.unwrap_or(READ_CAP as u64), d).await
        }
        (Lines { line, lines }, None) => paging::line_page(src, line, lines.unwrap_or(DEFAULT_PAGE_LINES)).await,
        (Lines { line, lines }, Some(d)) => {
            paging::line_page_redacted(src, line, lines.unwrap_or(DEFAULT_PAGE_LINES), d).await
        }
        (Tail { lines }, None) => paging::tail_page(src, lines).await,
        (Tail { lines }, Some(d)) => match paging::tail_start(src, lines).await {
            Ok(line) => paging::line_page_redacted(src, line, (src.total_lines() + 1 - line).max(1), d).await,
            Err(e) => Err(e),
        },
    };
    r.map_err(page_err)
}

/// Matching lines of a local spill, exactly as the server would answer (the same pattern
/// limits, the same refusals).
pub async fn grep(src: &LocalSource, g: &crate::store::GrepRequest, redact: Option<&Detector>) -> Result<GrepResponse> {
    let re = paging::compile_pattern(&g.pattern, g.fixed, g.ignore_case).map_err(page_err)?;
    let req = GrepRequest {
        regex: &re,
        from_line: g.from_line.unwrap_or(1),
        max_matches: g.max_matches.unwrap_or(usize::MAX),
        before: g.before.unwrap_or(0) as usize,
        after: g.after.unwrap_or(0) as usize,
        deadline: None,
        redact,
        max_text: READ_CAP,
    };
    paging::grep(src, req).await.map_err(page_err)
}

//! Background tasks (rule 9): not truncated. A detached supervisor streams the task's output
//! into a store stream as it is produced, readable at any time from any replica; at the
//! stream's cap the task's whole process group is killed (TERM, then KILL); on exit the stream
//! is sealed into a blob.

use std::process::Stdio;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use spillway_api::ErrorCode;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::error::{ClientError, Result};
use crate::store::{ReadRequest, StoreClient};

/// Output is sent at least this often while a task runs.
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// … or when this much is pending.
const FLUSH_BYTES: usize = 1 << 20;
/// Time between TERM and KILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// How a supervised task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnd {
    /// Exit code, if it exited.
    pub exit_code: Option<i32>,
    /// True when the cap was reached and the task was killed.
    pub capped: bool,
    /// Digest of the sealed output.
    pub digest: Option<String>,
}

/// Appends with retries: a retried append at the same offset is a no-op on the server.
async fn append_retrying(client: &StoreClient, id: &str, offset: u64, data: Bytes) -> Result<u64> {
    let mut wait = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        match client.append(id, offset, data.clone()).await {
            Ok(r) => return Ok(r.size),
            Err(e @ ClientError::Api { .. }) => return Err(e),
            Err(e) if attempt >= 5 => return Err(e),
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
}

fn kill_group(pgid: i32, sig: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, tx: mpsc::Sender<Bytes>) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 || tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
            break;
        }
    }
}

/// Runs `cmd` in its own process group, streaming stdout and stderr (interleaved as they come)
/// into stream `id`. Returns when the task has ended and the stream is sealed.
pub async fn supervise(client: &StoreClient, id: &str, mut cmd: Command) -> Result<TaskEnd> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn()?;
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(pump(child.stdout.take().expect("piped"), tx.clone()));
    tokio::spawn(pump(child.stderr.take().expect("piped"), tx));
    let mut offset = 0u64;
    let mut pending = BytesMut::new();
    let mut capped = false;
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        let (done, ticked) = tokio::select! {
            chunk = rx.recv() => match chunk {
                Some(c) => { pending.extend_from_slice(&c); (false, false) }
                None => (true, false),
            },
            _ = tick.tick() => (false, true),
        };
        if !capped && !pending.is_empty() && (done || ticked || pending.len() >= FLUSH_BYTES) {
            let data = pending.split().freeze();
            match append_retrying(client, id, offset, data.clone()).await {
                Ok(size) => offset = size,
                Err(ClientError::Api { code: ErrorCode::StreamLimitExceeded, .. }) => {
                    capped = true;
                    kill_group(pgid, libc::SIGTERM);
                    let killer = async move {
                        tokio::time::sleep(KILL_GRACE).await;
                        kill_group(pgid, libc::SIGKILL);
                    };
                    tokio::spawn(killer);
                }
                Err(e) => return Err(e),
            }
        }
        if capped {
            pending.clear(); // past the cap: drain the pipes until the group is gone
        }
        if done {
            break;
        }
    }
    let status = child.wait().await?;
    let rec = client.seal(id).await?;
    Ok(TaskEnd { exit_code: status.code(), capped, digest: Some(rec.digest.to_string()) })
}

/// Writes a stream's pages to `out` as JSON lines (the server's read page, at most 100,000
/// bytes of content each): what is there now, or with `follow` everything until the stream ends.
pub async fn tail<W: std::io::Write>(client: &StoreClient, id: &str, follow: bool, out: &mut W) -> Result<()> {
    let mut offset = 0u64;
    loop {
        let wait = follow.then_some(spillway_api::MAX_WAIT_MS);
        let mut attempt = 0;
        let page = loop {
            match client.read_stream(id, ReadRequest::Bytes { offset, limit: None }, wait).await {
                // "Unavailable" is the contract's "safe to retry".
                Err(ClientError::Api { code: ErrorCode::Unavailable, .. }) if attempt < 5 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                }
                other => break other?,
            }
        };
        if page.length > 0 || offset == 0 {
            serde_json::to_writer(&mut *out, &page).map_err(|e| ClientError::Other(e.to_string()))?;
            writeln!(out)?;
            out.flush()?;
        }
        offset += page.length;
        if page.eof {
            if !follow {
                return Ok(());
            }
            let info = client.stream_info(id).await?;
            if info.state != spillway_api::StreamState::Open && offset >= info.size {
                return Ok(());
            }
        }
    }
}

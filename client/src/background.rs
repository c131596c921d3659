//! Background tasks (rule 9): not truncated. A detached supervisor streams the task's output
//! into a store stream as it is produced, readable at any time from any replica; at the
//! stream's cap the task's whole process group is killed (TERM, then KILL); on exit the stream
//! is sealed into a blob.

use std::process::Stdio;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use spillway_api::{ErrorCode, SealRequest};
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

/// What the supervisor prints on stdout once it is ready: its signal handlers are installed
/// and the task runs (or failed to start and its stream is sealed).
pub const READY_LINE: &str = "spillway-supervisor-ready";

/// Starts `spillway supervise` for stream `id` as a detached process in its own group, so
/// the task outlives the caller, and waits until it is ready; returns the supervisor's pid
/// (`kill PID` stops the task, and the stream still records how it ended).
pub async fn spawn_supervisor(client: &StoreClient, id: &str, timeout: Option<f64>, cmd: &[String]) -> Result<u32> {
    use tokio::io::AsyncBufReadExt;
    let mut sup = Command::new(std::env::current_exe()?);
    sup.arg("supervise").arg("--stream").arg(id);
    if let Some(t) = timeout {
        sup.arg("--timeout").arg(t.to_string());
    }
    sup.arg("--").args(cmd);
    sup.env("SPILLWAY_URL", client.base_url()).env("SPILLWAY_TOKEN", client.token());
    sup.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).process_group(0);
    let mut child = sup.spawn()?;
    let pid = child.id().unwrap_or(0);
    let mut ready = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    ready.read_line(&mut line).await?;
    if line.trim() != READY_LINE {
        return Err(ClientError::Other(format!("the background supervisor did not start (stream {id})")));
    }
    // Reap it when it ends, so a long-lived caller (the MCP server) keeps no zombies.
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(pid)
}

/// How a task ended, in words, from its stream's state.
pub fn describe_end(info: &spillway_api::StreamInfo) -> String {
    let how = match (info.exit_code, &info.signal) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by SIG{sig}"),
        (None, None) => "ended (its exit status was not recorded)".to_owned(),
    };
    let cap = if info.capped { ", stopped at the stream's cap" } else { "" };
    format!("the task {how}{cap}; {} bytes of output", info.size)
}

/// Appends with retries: a retried append at the same offset is a no-op on the server.
/// Failures the server answered are not retried; lost connections are, five times, waiting
/// 100 ms, then twice as long each time.
async fn append_retrying(client: &StoreClient, id: &str, offset: u64, data: Bytes) -> Result<u64> {
    use backon::Retryable;
    let backoff = backon::ExponentialBuilder::default().with_min_delay(Duration::from_millis(100)).with_max_times(5);
    let once = || async { client.append(id, offset, data.clone()).await };
    let appended = once.retry(backoff).when(|e| !matches!(e, ClientError::Api { .. })).await?;
    Ok(appended.size)
}

use crate::capture::signal_group as kill_group;

/// The name the contract uses for a signal (`TERM`, not `SIGTERM` or 15).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "HUP",
        libc::SIGINT => "INT",
        libc::SIGQUIT => "QUIT",
        libc::SIGILL => "ILL",
        libc::SIGABRT => "ABRT",
        libc::SIGBUS => "BUS",
        libc::SIGFPE => "FPE",
        libc::SIGKILL => "KILL",
        libc::SIGUSR1 => "USR1",
        libc::SIGSEGV => "SEGV",
        libc::SIGUSR2 => "USR2",
        libc::SIGPIPE => "PIPE",
        libc::SIGALRM => "ALRM",
        libc::SIGTERM => "TERM",
        libc::SIGXCPU => "XCPU",
        libc::SIGXFSZ => "XFSZ",
        other => return format!("SIG{other}"),
    };
    name.to_owned()
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
/// When `stop` completes (a timeout, a signal to the supervisor), the task's group is stopped:
/// TERM, then KILL 2 s later; the stream is still sealed with how the task ended.
/// `on_ready` runs once the task runs (or could not start and its stream is sealed).
pub async fn supervise(
    client: &StoreClient,
    id: &str,
    mut cmd: Command,
    stop: futures::future::BoxFuture<'static, ()>,
    on_ready: impl FnOnce(),
) -> Result<TaskEnd> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let end = seal_unstarted(client, id, &program, &e).await;
            on_ready();
            return end;
        }
    };
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    on_ready();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(pump(child.stdout.take().expect("piped"), tx.clone()));
    tokio::spawn(pump(child.stderr.take().expect("piped"), tx));
    let stopper = tokio::spawn(async move {
        stop.await;
        kill_group(pgid, libc::SIGTERM);
        tokio::time::sleep(KILL_GRACE).await;
        kill_group(pgid, libc::SIGKILL);
    });
    let capped = forward(client, id, rx, pgid).await?;
    let status = child.wait().await?;
    stopper.abort();
    use std::os::unix::process::ExitStatusExt;
    let how = SealRequest { exit_code: status.code(), signal: status.signal().map(signal_name) };
    let rec = client.seal_with(id, &how).await?;
    Ok(TaskEnd { exit_code: status.code(), capped, digest: Some(rec.digest.to_string()) })
}

/// A task that could not start, as a shell reports it: the error in the output, 127 (not
/// found) or 126 as its exit code; the stream is sealed with that.
async fn seal_unstarted(client: &StoreClient, id: &str, program: &str, e: &std::io::Error) -> Result<TaskEnd> {
    let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
    append_retrying(client, id, 0, Bytes::from(format!("spillway: {program}: {e}\n"))).await?;
    let rec = client.seal_with(id, &SealRequest { exit_code: Some(code), signal: None }).await?;
    Ok(TaskEnd { exit_code: Some(code), capped: false, digest: Some(rec.digest.to_string()) })
}

/// Appends the task's output to stream `id` as it comes, every [`FLUSH_EVERY`] or
/// [`FLUSH_BYTES`], until both pipes close. At the stream's cap the task's group is stopped
/// and the rest drained; returns whether that happened.
async fn forward(client: &StoreClient, id: &str, mut rx: mpsc::Receiver<Bytes>, pgid: i32) -> Result<bool> {
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
    Ok(capped)
}

/// Writes a stream's pages to `out` as JSON lines (the server's read page, at most 100,000
/// bytes of content each), or with `raw` as the text itself: what is there now, or with
/// `follow` everything until the stream ends. Returns the stream's state at the end.
pub async fn tail<W: std::io::Write>(
    client: &StoreClient,
    id: &str,
    follow: bool,
    raw: bool,
    out: &mut W,
) -> Result<spillway_api::StreamInfo> {
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
        if raw {
            out.write_all(page.content.as_bytes())?;
            out.flush()?;
        } else if page.length > 0 || offset == 0 {
            serde_json::to_writer(&mut *out, &page).map_err(|e| ClientError::Other(e.to_string()))?;
            writeln!(out)?;
            out.flush()?;
        }
        offset += page.length;
        if page.eof {
            let info = client.stream_info(id).await?;
            if !follow || (info.state != spillway_api::StreamState::Open && offset >= info.size) {
                return Ok(info);
            }
        }
    }
}

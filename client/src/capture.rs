//! Command capture: stdout and stderr read concurrently and handled apart, each with its own
//! receipt. Memory stays bounded whatever the command prints: the preview keeps the first
//! `cap` bytes and a ring of the last ones, and everything past the cap streams to the spill
//! target as it is produced. A failing or hanging target abandons the spill, never the command.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use spillway_api::Receipt;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use crate::error::Result;
use crate::receipt::{self, Saved};
use crate::spill::{Deadline, SpillTarget, SpillWriter, DEFAULT_SAVE_DEADLINE};
use crate::truncate::{self, Sample, Strategy, DEFAULT_CAP};

const READ_CHUNK: usize = 256 * 1024;

/// How `exec` treats output.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Bytes of each stream the model may see.
    pub cap: usize,
    /// How to cut.
    pub strategy: Strategy,
    /// Where full outputs go.
    pub spill: Arc<dyn SpillTarget>,
    /// Most time a spill may wait on its target, in all.
    pub save_deadline: Duration,
    /// Labels for the spills (`stream=stdout|stderr` is added).
    pub labels: Vec<(String, String)>,
}

impl ExecOptions {
    /// Defaults: 100,000 bytes, head and tail, 3-second saves.
    pub fn new(spill: Arc<dyn SpillTarget>) -> Self {
        Self {
            cap: DEFAULT_CAP,
            strategy: Strategy::default(),
            spill,
            save_deadline: DEFAULT_SAVE_DEADLINE,
            labels: vec![("tool".into(), "exec".into())],
        }
    }
}

/// What `spillway exec` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecResult {
    /// Exit code, when the command exited.
    pub exit_code: Option<i32>,
    /// Terminating signal, when it was killed.
    pub signal: Option<i32>,
    /// Receipt of stdout.
    pub stdout: Receipt,
    /// Receipt of stderr.
    pub stderr: Receipt,
}

/// The last `cap` bytes seen, in a fixed buffer.
struct Ring {
    buf: Vec<u8>,
    pos: usize,
    filled: bool,
}

impl Ring {
    fn new(cap: usize) -> Self {
        Self { buf: vec![0; cap.max(1)], pos: 0, filled: false }
    }

    fn push(&mut self, mut data: &[u8]) {
        let cap = self.buf.len();
        if data.len() >= cap {
            data = &data[data.len() - cap..];
        }
        let first = (cap - self.pos).min(data.len());
        self.buf[self.pos..self.pos + first].copy_from_slice(&data[..first]);
        let rest = &data[first..];
        self.buf[..rest.len()].copy_from_slice(rest);
        let end = self.pos + data.len();
        self.filled |= end >= cap;
        self.pos = end % cap;
    }

    fn contents(&self) -> Vec<u8> {
        if self.filled {
            [&self.buf[self.pos..], &self.buf[..self.pos]].concat()
        } else {
            self.buf[..self.pos].to_vec()
        }
    }
}

/// Bounded memory of one stream: its head, a ring of its tail, its counts.
struct Keeper {
    cap: usize,
    head: Vec<u8>,
    tail: Ring,
    total: u64,
    newlines: u64,
    last: Option<u8>,
}

impl Keeper {
    fn new(cap: usize) -> Self {
        Self { cap, head: Vec::new(), tail: Ring::new(cap), total: 0, newlines: 0, last: None }
    }

    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        self.newlines += memchr::memchr_iter(b'\n', data).count() as u64;
        self.last = data.last().copied().or(self.last);
        let room = self.cap.saturating_sub(self.head.len());
        let (h, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(h);
        self.tail.push(rest);
    }

    fn lines(&self) -> u64 {
        self.newlines + u64::from(self.total > 0 && self.last != Some(b'\n'))
    }
}

enum SpillState {
    NotStarted,
    Writing(Box<dyn SpillWriter>),
    Failed(String),
}

/// Reads one stream to its end and returns its receipt.
pub async fn capture<R: AsyncRead + Unpin>(mut reader: R, opts: &ExecOptions, stream: &str) -> Result<Receipt> {
    let mut keep = Keeper::new(opts.cap);
    let mut spill = SpillState::NotStarted;
    let mut deadline = Deadline::new(opts.save_deadline);
    let mut labels = opts.labels.clone();
    labels.push(("stream".into(), stream.into()));
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        let before = keep.total;
        keep.push(chunk);
        if keep.total <= opts.cap as u64 {
            continue; // still fits: nothing to spill yet
        }
        if let SpillState::NotStarted = spill {
            // Crossing the cap: the spill starts with the head kept so far.
            spill = match deadline.wait(opts.spill.begin(&labels)).await {
                Ok(Ok(w)) => SpillState::Writing(w),
                Ok(Err(e)) | Err(e) => SpillState::Failed(e.to_string()),
            };
            if let SpillState::Writing(w) = &mut spill {
                let already = Bytes::copy_from_slice(&keep.head[..before.min(keep.head.len() as u64) as usize]);
                if let Err(e) = w.write(already, &mut deadline).await {
                    spill = SpillState::Failed(e.to_string());
                }
            }
        }
        if let SpillState::Writing(w) = &mut spill {
            if let Err(e) = w.write(Bytes::copy_from_slice(chunk), &mut deadline).await {
                spill = SpillState::Failed(e.to_string()); // dropping the writer abandons it
            }
        }
    }
    let saved = match spill {
        SpillState::NotStarted => Saved::NotNeeded,
        SpillState::Failed(reason) => Saved::Failed(reason),
        SpillState::Writing(w) => match w.finish(&mut deadline).await {
            Ok(loc) => Saved::At(loc),
            Err(e) => Saved::Failed(e.to_string()),
        },
    };
    let tail = keep.tail.contents();
    let sample = Sample {
        head: &keep.head,
        tail: &tail,
        tail_offset: keep.total - tail.len() as u64,
        total: keep.total,
        total_lines: keep.lines(),
    };
    let preview = truncate::preview(&sample, opts.cap, opts.strategy).unwrap_or_else(|r| truncate::Preview {
        text: r.to_string(),
        shown: vec![],
        truncated: true,
        next_line: None,
    });
    let saved = match saved {
        Saved::NotNeeded if preview.truncated => Saved::Failed("the output was cut before it was saved".into()),
        s => s,
    };
    Ok(receipt::build(preview, keep.total, keep.lines(), saved))
}

/// A 1 MiB pipe instead of 64 KiB: a fast writer wakes the reader 16 times less often.
fn widen_pipe(pipe: &impl std::os::fd::AsRawFd) {
    // SAFETY: F_SETPIPE_SZ on a pipe we own; failure (an old kernel, a limit) is harmless.
    unsafe {
        libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
}

/// Runs a command the way an agent's shell tool would: stdout and stderr captured apart.
pub async fn exec(mut cmd: Command, opts: &ExecOptions) -> Result<ExecResult> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    widen_pipe(&out);
    widen_pipe(&err);
    let (stdout, stderr) = tokio::join!(capture(out, opts, "stdout"), capture(err, opts, "stderr"));
    let status = child.wait().await?;
    use std::os::unix::process::ExitStatusExt;
    Ok(ExecResult { exit_code: status.code(), signal: status.signal(), stdout: stdout?, stderr: stderr? })
}

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

use spillway_api::{SaveError, SaveFailure};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::input::{Fed, Input};
use crate::receipt::{self, Readers, Saved};
use crate::spill::{Deadline, SpillTarget, SpillWriter, DEFAULT_SAVE_DEADLINE};
use crate::truncate::{self, Redaction, Sample, Strategy, DEFAULT_CAP};

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
    /// Who reads the receipts' hints.
    pub readers: Readers,
    /// Stop the command's process group after this long (TERM, then KILL 2 s later).
    pub timeout: Option<Duration>,
    /// Give the command this process's stdin (a CLI), or none (a tool server whose stdin is
    /// its protocol).
    pub inherit_stdin: bool,
    /// Cancelling it stops the command's process group the same way (the caller was told to stop).
    pub cancel: CancellationToken,
    /// Whether the receipts' previews show secrets as marks (on by default; the spill is always
    /// the exact output).
    pub redaction: Redaction,
    /// The most bytes the whole answer may take as a host carries it (`ExecResult` as JSON, both
    /// receipts, inside a JSON string: escapes twice), when a host caps what it reads (`spillway
    /// mcp`); the previews are cut further to fit. `None`: each stream has `cap`.
    pub answer_budget: Option<usize>,
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
            readers: Readers::Cli,
            timeout: None,
            inherit_stdin: false,
            cancel: CancellationToken::new(),
            redaction: Redaction::On,
            answer_budget: None,
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
    /// True when `--timeout` stopped the command.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
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
    /// Keeps `cap` bytes of head and of tail, and as much again as the longest secret past
    /// each, so that a secret cut by the preview's edge is found whole and marked.
    fn new(cap: usize) -> Self {
        let cap = cap + spillway_api::redact::MAX_SECRET;
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
    Failed(SaveError),
}

impl SpillState {
    /// Takes `chunk`, read after `keep` already held `before` bytes: once the output crosses
    /// the cap the spill begins with the head kept so far, then every chunk follows it. A
    /// failure is kept as the receipt's reason; dropping the writer abandons its upload.
    async fn take(
        &mut self,
        keep: &Keeper,
        before: u64,
        chunk: &[u8],
        target: (&dyn SpillTarget, &[(String, String)]),
        deadline: &mut Deadline,
    ) {
        if let SpillState::NotStarted = self {
            *self = match deadline.wait(target.0.begin(target.1)).await {
                Ok(Ok(w)) => SpillState::Writing(w),
                Ok(Err(e)) | Err(e) => SpillState::Failed(e.save_error()),
            };
            if let SpillState::Writing(w) = self {
                let already = Bytes::copy_from_slice(&keep.head[..before.min(keep.head.len() as u64) as usize]);
                if let Err(e) = w.write(already, deadline).await {
                    *self = SpillState::Failed(e.save_error());
                }
            }
        }
        if let SpillState::Writing(w) = self {
            if let Err(e) = w.write(Bytes::copy_from_slice(chunk), deadline).await {
                *self = SpillState::Failed(e.save_error());
            }
        }
    }

    /// Where the whole output ended up.
    async fn finish(self, deadline: &mut Deadline) -> Saved {
        match self {
            SpillState::NotStarted => Saved::NotNeeded,
            SpillState::Failed(reason) => Saved::Failed(reason),
            SpillState::Writing(w) => match w.finish(deadline).await {
                Ok(loc) => Saved::At(loc),
                Err(e) => Saved::Failed(e.save_error()),
            },
        }
    }
}

/// Reads one stream to its end and returns its receipt.
pub async fn capture<R: AsyncRead + Unpin>(reader: R, opts: &ExecOptions, stream: &str) -> Result<Receipt> {
    let mut c = read_all(reader, opts, stream).await?;
    Ok(c.receipt(opts.cap, opts).await)
}

/// One stream read to its end: its head and tail, and where its spill stands. Its receipt
/// can be cut to any cap up to the one it was read with (`ExecOptions::cap`), as often as an
/// answer's budget asks; the output is saved once.
struct Captured {
    keep: Keeper,
    spill: SpillState,
    deadline: Deadline,
    labels: Vec<(String, String)>,
    /// Where the whole output went, once its spill finished.
    saved: Option<Saved>,
}

async fn read_all<R: AsyncRead + Unpin>(mut reader: R, opts: &ExecOptions, stream: &str) -> Result<Captured> {
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
        if keep.total > opts.cap as u64 {
            spill.take(&keep, before, chunk, (&*opts.spill, &labels), &mut deadline).await;
        }
    }
    Ok(Captured { keep, spill, deadline, labels, saved: None })
}

impl Captured {
    /// The receipt with a preview of at most `cap` bytes. A preview that does not show the
    /// whole output (a short output whose marks made it too long, or a cap smaller than the
    /// one it was read with) has it saved first, from the head kept: that is all of it.
    async fn receipt(&mut self, cap: usize, opts: &ExecOptions) -> Receipt {
        let preview = preview_of(&self.keep, cap, opts);
        let spilling = !matches!(self.spill, SpillState::NotStarted);
        if self.saved.is_none() && (preview.truncated || spilling) {
            if !spilling {
                let keep = &self.keep;
                self.spill.take(keep, keep.total, &[], (&*opts.spill, &self.labels), &mut self.deadline).await;
            }
            let spill = std::mem::replace(&mut self.spill, SpillState::NotStarted);
            self.saved = Some(spill.finish(&mut self.deadline).await);
        }
        receipt_of(&self.keep, preview, self.saved.clone().unwrap_or(Saved::NotNeeded), opts)
    }
}

/// The preview of a whole output at most `cap` bytes long, from what `keep` holds.
fn preview_of(keep: &Keeper, cap: usize, opts: &ExecOptions) -> truncate::Preview {
    let tail = keep.tail.contents();
    let sample = Sample {
        head: &keep.head,
        tail: &tail,
        tail_offset: keep.total - tail.len() as u64,
        total: keep.total,
        total_lines: keep.lines(),
    };
    truncate::preview_with(&sample, cap, opts.strategy, &opts.redaction).unwrap_or_else(|r| truncate::Preview {
        text: r.to_string(),
        shown: vec![],
        truncated: true,
        next_line: None,
        redactions: None,
    })
}

/// The receipt of a whole output: its preview, and where it was saved.
fn receipt_of(keep: &Keeper, preview: truncate::Preview, saved: Saved, opts: &ExecOptions) -> Receipt {
    let saved = match saved {
        Saved::NotNeeded if preview.truncated => Saved::Failed(SaveError {
            cause: SaveFailure::Other,
            message: "the output was cut before it was saved".into(),
        }),
        s => s,
    };
    receipt::build_for(preview, keep.total, keep.lines(), saved, opts.readers)
}

/// A 1 MiB pipe instead of 64 KiB: a fast writer wakes the reader 16 times less often.
fn widen_pipe(pipe: &impl std::os::fd::AsRawFd) {
    // SAFETY: F_SETPIPE_SZ on a pipe we own; failure (an old kernel, a limit) is harmless.
    unsafe {
        libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
}

/// Sends `sig` to process group `pgid`.
pub(crate) fn signal_group(pgid: i32, sig: i32) {
    if pgid > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// Time between TERM and KILL when a command's group is stopped.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Kills the command's whole process group if `exec` is dropped before the command ended
/// (a cancelled tool call must not leave the command running).
struct GroupGuard {
    pgid: i32,
    armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            signal_group(self.pgid, libc::SIGKILL);
        }
    }
}

/// The answer a shell gives when a command cannot start: 127 when it is not found, 126 when
/// it cannot be executed, with the OS error on stderr.
/// Longest `cmd` label, in bytes.
const CMD_LABEL_MAX: usize = 200;

/// The `run` and `cmd` labels of one run of `cmd`.
fn run_labels(cmd: &std::process::Command) -> [(String, String); 2] {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let seed = format!("{}/{nanos}/{}", std::process::id(), RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let run = blake3::hash(seed.as_bytes()).to_hex()[..16].to_owned();
    let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let program = cmd.get_program().to_string_lossy().into_owned();
    // A shell line (`sh -c LINE`, as MCP `run` and the SDKs run one) is labelled as the line.
    let line = match (program.rsplit('/').next(), args.as_slice()) {
        (Some("sh" | "bash"), [c, line, ..]) if c == "-c" => line.clone(),
        _ => std::iter::once(program).chain(args).collect::<Vec<_>>().join(" "),
    };
    let (marked, _) = spillway_api::redact::redact(line.as_bytes());
    let mut text: String =
        String::from_utf8_lossy(&marked).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if text.len() > CMD_LABEL_MAX {
        let mut end = CMD_LABEL_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    [("run".into(), run), ("cmd".into(), text)]
}

/// Feeds `input` (if any) to the command's stdin, closed once it is all written — unless its
/// bytes failed their check: then the command's group is stopped first, so that it never
/// answers over bytes that were not the output.
async fn feed(input: Option<Input>, pipe: Option<tokio::process::ChildStdin>, pgid: i32) -> Result<Fed> {
    let (Some(input), Some(mut pipe)) = (input, pipe) else {
        return Ok(Fed::All);
    };
    widen_pipe(&pipe);
    let fed = input.feed(&mut pipe).await;
    if fed.is_err() {
        signal_group(pgid, libc::SIGKILL);
    }
    fed
}

async fn not_started(program: &str, e: &std::io::Error, opts: &ExecOptions) -> Result<ExecResult> {
    let exit_code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
    let message = format!("spillway: {program}: {e}\n");
    Ok(ExecResult {
        exit_code: Some(exit_code),
        signal: None,
        timed_out: false,
        stdout: capture(&b""[..], opts, "stdout").await?,
        stderr: capture(message.as_bytes(), opts, "stderr").await?,
    })
}

/// Runs a command the way an agent's shell tool would: in its own process group, stdout and
/// stderr captured apart; stopped as a group on timeout, on cancel, or when dropped.
///
/// Both streams' spills are labelled, beside the caller's labels, `run=<id>` (the same id on
/// both, so a run's stdout and stderr pair up) and `cmd=<the command line>`, its secrets
/// marked and cut to 200 bytes (api.md v1.3), so that `refs` and the viewer tell what made them.
pub async fn exec(cmd: Command, opts: &ExecOptions) -> Result<ExecResult> {
    exec_with_input(cmd, opts, None).await
}

/// [`exec`], the command's stdin fed from a saved output ([`Input`], opened — and refused —
/// before this is called). Memory stays at a chunk whatever its size; a command that stops
/// reading early (`head`) ends the feed cleanly. Bytes that fail their digest make this an
/// error, the command stopped before it saw the end of its input.
pub async fn exec_with_input(mut cmd: Command, opts: &ExecOptions, input: Option<Input>) -> Result<ExecResult> {
    let mut labelled = opts.clone();
    labelled.labels.extend(run_labels(cmd.as_std()));
    let opts = &labelled;
    let stdin = match (&input, opts.inherit_stdin) {
        (Some(_), _) => Stdio::piped(),
        (None, true) => Stdio::inherit(),
        (None, false) => Stdio::null(),
    };
    cmd.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).process_group(0);
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return not_started(&program, &e, opts).await,
    };
    let pgid = child.id().map_or(0, |p| p as i32);
    let mut guard = GroupGuard { pgid, armed: true };
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    widen_pipe(&out);
    widen_pipe(&err);
    let feed = feed(input, child.stdin.take(), pgid);
    let timed_out = std::sync::atomic::AtomicBool::new(false);
    let stopper = async {
        let timeout = async {
            match opts.timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = timeout => timed_out.store(true, std::sync::atomic::Ordering::Relaxed),
            () = opts.cancel.cancelled() => {}
        }
        signal_group(pgid, libc::SIGTERM);
        tokio::time::sleep(KILL_GRACE).await;
        signal_group(pgid, libc::SIGKILL);
        std::future::pending::<std::convert::Infallible>().await
    };
    let run = async {
        let (stdout, stderr, fed) = tokio::join!(read_all(out, opts, "stdout"), read_all(err, opts, "stderr"), feed);
        (stdout, stderr, fed, child.wait().await)
    };
    let (stdout, stderr, fed, status) = tokio::select! {
        r = run => r,
        never = stopper => match never {},
    };
    let status = status?;
    guard.armed = false;
    fed?;
    use std::os::unix::process::ExitStatusExt;
    let timed_out = timed_out.load(std::sync::atomic::Ordering::Relaxed);
    Ok(answer(stdout?, stderr?, (status.code(), status.signal(), timed_out), opts).await)
}

/// The bytes `v` takes as a host carries a tool's answer: its JSON, inside a JSON string.
fn carried_len<T: Serialize>(v: &T) -> usize {
    let json = serde_json::to_string(v).unwrap_or_default();
    serde_json::to_string(&json).map_or(json.len(), |j| j.len() - 2)
}

/// The smallest preview a stream is cut to so that an answer fits its budget.
const MIN_PREVIEW: usize = 256;

/// A run's answer: both receipts cut to the cap and, when `opts.answer_budget` is set, cut
/// further — the longer preview first, by what it passes the budget as JSON — until the whole
/// answer, serialized, fits (each stream still head and tail, its digest reaching the rest).
async fn answer(
    mut out: Captured,
    mut err: Captured,
    (exit_code, signal, timed_out): (Option<i32>, Option<i32>, bool),
    opts: &ExecOptions,
) -> ExecResult {
    let (stdout, stderr) = tokio::join!(out.receipt(opts.cap, opts), err.receipt(opts.cap, opts));
    let mut result = ExecResult { exit_code, signal, timed_out, stdout, stderr };
    let Some(budget) = opts.answer_budget else {
        return result;
    };
    for _ in 0..8 {
        let size = carried_len(&result);
        if size <= budget {
            break;
        }
        // What the two previews may take together, shared: one that needs less than half
        // leaves the rest to the other.
        let lens = [result.stdout.result.len(), result.stderr.result.len()];
        let need = [carried_len(&result.stdout.result), carried_len(&result.stderr.result)];
        let avail = budget.saturating_sub(size - need[0] - need[1]);
        let share = match (need[0] <= avail / 2, need[1] <= avail / 2) {
            (true, _) => [need[0], avail - need[0]],
            (_, true) => [avail.saturating_sub(need[1]), need[1]],
            _ => [avail / 2, avail - avail / 2],
        };
        let mut cut = false;
        for i in 0..2 {
            if need[i] <= share[i] || lens[i] <= MIN_PREVIEW {
                continue;
            }
            // Escapes grow the text, twice: the share in the text's own bytes.
            let growth = need[i] as f64 / lens[i].max(1) as f64;
            let cap = ((share[i] as f64 / growth.max(1.0)) as usize).saturating_sub(32).clamp(MIN_PREVIEW, lens[i] - 1);
            if i == 0 {
                result.stdout = out.receipt(cap, opts).await;
            } else {
                result.stderr = err.receipt(cap, opts).await;
            }
            cut = true;
        }
        if !cut {
            break; // both previews are as short as they go
        }
    }
    result
}

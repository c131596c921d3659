//! The `spillway` command line, as a library so the binary stays a thin `main`. One function
//! per command; `--local` or the store is chosen once, by [`Reader`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use spillway_api::ErrorCode;
use tokio::io::AsyncReadExt;

pub use crate::conn::{parse_digest, Conn};
use crate::error::{ClientError, Result};
use crate::spill::LocalDir;
use crate::store::{GrepRequest, ReadRequest, SearchRequest, StoreClient, UploadOptions};
use crate::truncate::Redaction;
use crate::{background, capture, conn, gate, transfer};

/// Keep big tool outputs out of the model's context without losing them.
#[derive(Parser, Debug)]
#[command(name = "spillway", version, about)]
pub struct Cli {
    /// Store URL, e.g. http://127.0.0.1:7745.
    #[arg(long, env = "SPILLWAY_URL", global = true)]
    url: Option<String>,
    /// Store token.
    #[arg(long, env = "SPILLWAY_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Spill to, and read from, files named by content hash in DIR; no server needed
    /// (exec, put, get, read, grep, gate and mcp).
    #[arg(long, value_name = "DIR")]
    local: Option<PathBuf>,
    /// A gitleaks TOML rules file: more kinds of secret for what is redacted here (receipts,
    /// reads of a local directory), beside the built-in ones.
    #[arg(long, env = "SPILLWAY_REDACT_RULES", global = true, value_name = "FILE")]
    redact_rules: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

/// Context lines around each match, as grep takes them.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct ContextArgs {
    /// Lines of context after each match.
    #[arg(short = 'A', long, value_name = "N")]
    after: Option<u32>,
    /// Lines of context before each match.
    #[arg(short = 'B', long, value_name = "N")]
    before: Option<u32>,
    /// Lines of context before and after each match.
    #[arg(short = 'C', long, value_name = "N")]
    context: Option<u32>,
}

impl ContextArgs {
    /// Lines before and after: `-B`/`-A`, else `-C`.
    fn lines(&self) -> (Option<u32>, Option<u32>) {
        (self.before.or(self.context), self.after.or(self.context))
    }
}

/// `--redact` of the readers.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct RedactArg {
    /// Show secrets as [REDACTED:kind] marks (what a model is shown; off by default, for SREs).
    #[arg(long)]
    redact: bool,
}

/// `--text` of the readers.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct TextArg {
    /// Print the text for a person (content as it is; `LINE:text` rows for grep and search)
    /// instead of JSON; where to go on is said on stderr.
    #[arg(long)]
    text: bool,
}

/// `--no-redact` of the commands that show a model what a tool did.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct NoRedactArg {
    /// Show the output as it is: secrets are replaced by [REDACTED:kind] marks by default
    /// (the saved output is exact either way).
    #[arg(long)]
    no_redact: bool,
}

/// `--local DIR` where a command can work without the store.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct LocalArg {
    /// Use the files named by content hash in DIR instead of the store.
    #[arg(long, value_name = "DIR")]
    local: Option<PathBuf>,
}

/// Labels and TTL of what a command stores.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct RefArgs {
    /// `key=value` label on what is stored, repeatable (e.g. --label session=s-42).
    #[arg(long = "label", value_parser = parse_label, value_name = "KEY=VALUE")]
    labels: Vec<(String, String)>,
    /// Seconds the store keeps it (default: the server's, 7 days).
    #[arg(long, value_name = "SECONDS")]
    ttl: Option<u64>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a command the way an agent's shell tool would; print its receipts.
    #[command(after_help = "Example:\n  spillway exec --timeout 600 --label session=s-42 -- cargo test\n  \
        spillway exec --stdin blake3:9f2c… -- jq -c 'select(.status == 500)'\n\n\
        Prints {\"exit_code\", \"signal\", \"timed_out\"?, \"stdout\": <receipt>, \"stderr\": <receipt>}.")]
    Exec {
        /// Bytes of each stream the model may see.
        #[arg(long, default_value_t = crate::truncate::DEFAULT_CAP)]
        limit: usize,
        /// Stop the command's process group after this many seconds (TERM, then KILL 2 s later).
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<f64>,
        #[command(flatten)]
        refs: RefArgs,
        #[command(flatten)]
        local: LocalArg,
        #[command(flatten)]
        redaction: NoRedactArg,
        /// Exit with the command's status (128 + N when signal N ended it, 124 when --timeout
        /// stopped it) after printing the JSON, as a shell would: `spillway exec --exit-code --
        /// make && deploy` deploys only after a build that passed.
        #[arg(long)]
        exit_code: bool,
        /// Feed the command a saved output on its stdin: a digest (checked as it streams; the
        /// command never sees the end of bytes that fail it), or a background task's stream id
        /// (as written so far). Refused before the command starts when this token cannot read it.
        #[arg(long, value_name = "REF")]
        stdin: Option<String>,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Upload a file (or stdin) and print its blob record.
    #[command(after_help = "Example:\n  spillway put incident.log --label incident=INC-42")]
    Put {
        /// File to upload; `-` or nothing for stdin.
        file: Option<PathBuf>,
        #[command(flatten)]
        refs: RefArgs,
        #[command(flatten)]
        local: LocalArg,
    },
    /// Download the exact bytes of a blob, verified against its digest.
    #[command(after_help = "Example:\n  spillway get blake3:9f2c… -o build.log")]
    Get {
        /// `blake3:…`, `sha256:…` or 64 hex digits (BLAKE3).
        digest: String,
        /// Write to FILE instead of stdout (only after verification).
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        local: LocalArg,
    },
    /// One capped page of a blob (at most 100,000 bytes), as JSON.
    #[command(after_help = "Example:\n  spillway read blake3:9f2c… --line 1201 --lines 2000\n  \
        spillway read blake3:9f2c… --tail-lines 50\n\n\
        Continue with the page's next_line when it has one, else with next_offset.")]
    Read {
        /// `blake3:…`, `sha256:…` or 64 hex digits (BLAKE3).
        digest: String,
        /// Byte page start [default: 0].
        #[arg(long, conflicts_with_all = ["line", "lines"])]
        offset: Option<u64>,
        /// Byte page length [default: 100000, the most a page holds].
        #[arg(long, conflicts_with_all = ["line", "lines"])]
        limit: Option<u64>,
        /// Line page start, 1-based.
        #[arg(long)]
        line: Option<u64>,
        /// Lines per page [default: 2000].
        #[arg(long)]
        lines: Option<u64>,
        /// The last N lines (as many of them as fit a page), numbered as a line page.
        #[arg(long, value_name = "N", conflicts_with_all = ["offset", "limit", "line", "lines"])]
        tail_lines: Option<u64>,
        #[command(flatten)]
        local: LocalArg,
        #[command(flatten)]
        redaction: RedactArg,
        #[command(flatten)]
        text: TextArg,
    },
    /// Matching lines of a blob with their numbers, capped and resumable, as JSON.
    #[command(after_help = "Example:\n  spillway grep blake3:9f2c… 'error\\[E[0-9]+\\]' -i -C 2")]
    Grep {
        /// `blake3:…`, `sha256:…` or 64 hex digits (BLAKE3).
        digest: String,
        /// Rust regex syntax.
        pattern: String,
        /// Case-insensitive.
        #[arg(short = 'i', long)]
        ignore_case: bool,
        /// Literal pattern.
        #[arg(short = 'F', long)]
        fixed: bool,
        /// Resume from this line.
        #[arg(long)]
        from_line: Option<u64>,
        /// Most matches [default: as many as fit 100,000 bytes].
        #[arg(long)]
        max_matches: Option<usize>,
        #[command(flatten)]
        context: ContextArgs,
        #[command(flatten)]
        local: LocalArg,
        #[command(flatten)]
        redaction: RedactArg,
        #[command(flatten)]
        text: TextArg,
    },
    /// Matching lines across this namespace's outputs, newest output first, as JSON.
    #[command(after_help = "Example:\n  spillway search 'OOMKilled' --label session=s-42 --since 24h -C 2\n\n\
        Prints one answer (follow its next_cursor with --cursor), or with --all every match, one JSON line each.")]
    Search {
        /// Rust regex syntax.
        pattern: String,
        /// Only outputs with this label, repeatable (all must match).
        #[arg(long = "label", value_parser = parse_label, value_name = "KEY=VALUE")]
        labels: Vec<(String, String)>,
        /// Case-insensitive.
        #[arg(short = 'i', long)]
        ignore_case: bool,
        /// Literal pattern.
        #[arg(short = 'F', long)]
        fixed: bool,
        /// Only outputs stored since: Unix seconds, RFC 3339, or a duration back (90m, 24h, 7d).
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Only outputs stored until (the same forms as --since).
        #[arg(long, value_name = "T")]
        until: Option<String>,
        #[command(flatten)]
        context: ContextArgs,
        /// Most matches per answer [default: the server's, 100].
        #[arg(long)]
        max_matches: Option<usize>,
        /// The next_cursor of the previous answer (it may start with `-`: base64url).
        #[arg(long, allow_hyphen_values = true)]
        cursor: Option<String>,
        /// Follow the cursor to the end; print one match per line (JSON).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        redaction: RedactArg,
        #[command(flatten)]
        text: TextArg,
    },
    /// The blob record of a blob in this namespace.
    #[command(after_help = "Example:\n  spillway stat blake3:9f2c…")]
    Stat {
        /// `blake3:…`, `sha256:…` or 64 hex digits (BLAKE3).
        digest: String,
    },
    /// Keep a blob in this namespace forever (incident evidence), or until a time (admin).
    #[command(after_help = "Example:\n  spillway pin blake3:9f2c… --reason INC-42 --until 1767225600")]
    Pin {
        /// `blake3:…`, `sha256:…` or 64 hex digits (BLAKE3).
        digest: String,
        /// Keep it until this Unix time (seconds) instead of forever.
        #[arg(long, value_name = "UNIX")]
        until: Option<u64>,
        /// Why it is kept.
        #[arg(long)]
        reason: Option<String>,
    },
    /// This namespace's references, newest first, as JSON.
    #[command(after_help = "Example:\n  spillway refs --label session=s-42 --limit 20")]
    Refs {
        /// Only references with this label, repeatable (all must match).
        #[arg(long = "label", value_parser = parse_label, value_name = "KEY=VALUE")]
        labels: Vec<(String, String)>,
        /// Most references per page [default: the server's].
        #[arg(long)]
        limit: Option<u32>,
        /// The next_cursor of the previous page (it may start with `-`: base64url).
        #[arg(long, allow_hyphen_values = true)]
        cursor: Option<String>,
    },
    /// Drop this namespace's references to a blob (admin); the bytes go when nobody holds it.
    #[command(after_help = "Example:\n  spillway rm blake3:9f2c…")]
    Rm {
        /// `blake3:…`, `sha256:…` or 64 hex digits (BLAKE3).
        digest: String,
    },
    /// Apply the per-turn gate to a JSON array of one turn's tool results on stdin.
    #[command(after_help = "Example:\n  echo '[\"…\", {…receipt…}]' | spillway gate --budget 200000")]
    Gate {
        /// Budget of the turn, in bytes.
        #[arg(long, default_value_t = gate::DEFAULT_BUDGET)]
        budget: usize,
        /// Head kept of a degraded result, in bytes.
        #[arg(long, default_value_t = gate::DEFAULT_KEEP)]
        keep: usize,
        #[command(flatten)]
        local: LocalArg,
        #[command(flatten)]
        redaction: NoRedactArg,
    },
    /// Start a background task whose output streams to the store; print {"stream", "pid"}.
    #[command(
        after_help = "Example:\n  spillway bg --label session=s-42 -- ./long-job.sh\n  spillway tail -f --raw <stream>\n\n\
        `kill PID` stops the task; its exit status is recorded in the stream either way."
    )]
    Bg {
        /// Stream cap in bytes [default: the server's, 50 MiB].
        #[arg(long)]
        max_bytes: Option<u64>,
        /// Stop the task after this many seconds.
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<f64>,
        #[command(flatten)]
        refs: RefArgs,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Print a background task's output (JSON pages, or the text with --raw); -f follows it.
    #[command(after_help = "Example:\n  spillway tail -f --raw <stream>")]
    Tail {
        /// Follow until the task ends.
        #[arg(short, long)]
        follow: bool,
        /// With --follow: exit with the task's status once it ends (128 + N when signal N ended
        /// it; 1 when its status was not recorded).
        #[arg(long, requires = "follow")]
        exit_code: bool,
        /// Print the text itself, not JSON pages; how the task ended goes to stderr.
        #[arg(long)]
        raw: bool,
        /// The stream id `bg` printed.
        stream: String,
    },
    /// Serve the store as MCP tools (run, read, grep, search, background, tail) on stdio.
    #[command(
        after_help = "Example (Claude Code):\n  claude mcp add spillway --env SPILLWAY_URL=http://127.0.0.1:7745 \
        --env SPILLWAY_TOKEN=… -- spillway mcp"
    )]
    Mcp {
        #[command(flatten)]
        local: LocalArg,
        /// The most bytes of any one answer, whoever the client [default: by the client's name:
        /// claude-code 40,000, codex 9,000, others 100,000].
        #[arg(long, env = "SPILLWAY_MCP_LIMIT", value_name = "BYTES", value_parser = clap::value_parser!(u32).range(2_000..=1_000_000))]
        limit: Option<u32>,
    },
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        stream: String,
        #[arg(long)]
        timeout: Option<f64>,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
}

fn parse_label(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if spillway_api::valid_label_key(k) => Ok((k.to_owned(), v.to_owned())),
        Some((k, _)) => Err(format!("invalid label key {k:?}: use [a-z0-9_.-]{{1,64}}")),
        None => Err(format!("expected key=value, got {s:?}")),
    }
}

fn seconds(s: Option<f64>) -> Result<Option<Duration>> {
    s.map(|s| Duration::try_from_secs_f64(s).map_err(|_| ClientError::Other(format!("invalid number of seconds {s}"))))
        .transpose()
}

impl Cli {
    fn conn(&self) -> Result<Conn> {
        let sub = match &self.command {
            Cmd::Exec { local, .. }
            | Cmd::Put { local, .. }
            | Cmd::Get { local, .. }
            | Cmd::Read { local, .. }
            | Cmd::Grep { local, .. }
            | Cmd::Gate { local, .. }
            | Cmd::Mcp { local, .. } => local.local.clone(),
            _ if self.local.is_some() => {
                return Err(ClientError::Other(
                    "this command needs the store: --local applies to exec, put, get, read, grep, gate and mcp".into(),
                ))
            }
            _ => None,
        };
        let detector = self.redact_rules.as_deref().map(conn::load_rules).transpose()?;
        Ok(Conn::new(self.url.clone(), self.token.clone(), sub.or_else(|| self.local.clone()), detector))
    }
}

/// Writes one JSON value and a newline to stdout.
pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v).map_err(|e| ClientError::Other(e.to_string()))?;
    writeln!(out)?;
    Ok(())
}

/// Runs the CLI; errors are one line on stderr and a non-zero exit.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.conn() {
        Ok(conn) => dispatch(&cli.command, &conn).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spillway: error: {}", describe(&e, &cli));
            ExitCode::from(1)
        }
    }
}

fn describe(e: &ClientError, cli: &Cli) -> String {
    let digest = match &cli.command {
        Cmd::Get { digest, .. }
        | Cmd::Read { digest, .. }
        | Cmd::Grep { digest, .. }
        | Cmd::Stat { digest }
        | Cmd::Pin { digest, .. }
        | Cmd::Rm { digest } => Some(digest.as_str()),
        _ => None,
    };
    match (e, digest) {
        (ClientError::Api { code: ErrorCode::NotFound, .. }, Some(d)) => {
            match cli.conn().ok().as_ref().and_then(Conn::local) {
                Some(dir) => format!("{d} was not found in {} (not_found)", dir.display()),
                None => format!("{d} was not found in this namespace (not_found)"),
            }
        }
        (ClientError::InvalidDigest(_), Some(d)) => format!(
            "invalid digest {d:?}: a digest is blake3:<64 lowercase hex>, sha256:<64 lowercase hex>, or 64 hex \
             digits (invalid_digest)"
        ),
        _ => e.to_string(),
    }
}

async fn dispatch(cmd: &Cmd, conn: &Conn) -> Result<ExitCode> {
    match cmd {
        Cmd::Exec { limit, timeout, refs, cmd, redaction, exit_code, stdin, .. } => {
            let how = ExecHow {
                limit: *limit,
                timeout: seconds(*timeout)?,
                redaction: conn.redaction(redaction.no_redact),
                exit_code: *exit_code,
                stdin: stdin.clone(),
            };
            return exec(conn, how, refs, cmd).await;
        }
        Cmd::Put { file, refs, .. } => put(conn, file.as_deref(), refs).await?,
        Cmd::Get { digest, output, .. } => {
            transfer::get(&conn.reader()?, &parse_digest(digest)?, output.as_deref()).await?
        }
        Cmd::Read { digest, offset, limit, line, lines, tail_lines, redaction, text, .. } => {
            let req = if let Some(n) = tail_lines {
                ReadRequest::Tail { lines: *n }
            } else if line.is_some() || lines.is_some() {
                ReadRequest::Lines { line: line.unwrap_or(1), lines: *lines }
            } else {
                ReadRequest::Bytes { offset: offset.unwrap_or(0), limit: *limit }
            };
            let page = conn.reader_for(redaction.redact)?.read(&parse_digest(digest)?, req).await?;
            if text.text {
                crate::plain::page(&page)?;
            } else {
                print_json(&page)?;
            }
        }
        Cmd::Grep { digest, pattern, ignore_case, fixed, from_line, max_matches, context, redaction, text, .. } => {
            let (before, after) = context.lines();
            let g = GrepRequest {
                pattern: pattern.clone(),
                ignore_case: *ignore_case,
                fixed: *fixed,
                from_line: *from_line,
                max_matches: *max_matches,
                before,
                after,
            };
            let found = conn.reader_for(redaction.redact)?.grep(&parse_digest(digest)?, &g).await?;
            if text.text {
                crate::plain::grep(&found)?;
            } else {
                print_json(&found)?;
            }
        }
        Cmd::Search {
            pattern,
            labels,
            ignore_case,
            fixed,
            since,
            until,
            context,
            max_matches,
            cursor,
            all,
            redaction,
            text,
        } => {
            let (before, after) = context.lines();
            let s = SearchRequest {
                pattern: pattern.clone(),
                labels: labels.clone(),
                ignore_case: *ignore_case,
                fixed: *fixed,
                since: since.clone(),
                until: until.clone(),
                before,
                after,
                max_matches: *max_matches,
                cursor: cursor.clone(),
            };
            search(&conn.store()?.redacting(redaction.redact), s, *all, text.text).await?;
        }
        Cmd::Stat { digest } => print_json(&conn.store()?.stat(parse_digest(digest)?).await?)?,
        Cmd::Pin { digest, until, reason } => {
            print_json(&conn.store()?.pin_until(parse_digest(digest)?, reason.as_deref(), *until).await?)?;
        }
        Cmd::Refs { labels, limit, cursor } => {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            print_json(&conn.store()?.list_refs(&labels, *limit, cursor.as_deref()).await?)?;
        }
        Cmd::Rm { digest } => {
            let d = parse_digest(digest)?;
            conn.store()?.delete(d).await?;
            print_json(&serde_json::json!({ "digest": d, "removed": true }))?;
        }
        Cmd::Gate { budget, keep, redaction, .. } => {
            gate_turn(conn, *budget, *keep, conn.redaction(redaction.no_redact)).await?
        }
        Cmd::Bg { max_bytes, timeout, refs, cmd } => bg(conn, *max_bytes, *timeout, refs, cmd).await?,
        Cmd::Tail { follow, raw, stream, exit_code } => return tail(conn, stream, *follow, *raw, *exit_code).await,
        Cmd::Mcp { limit, .. } => crate::mcp::serve(conn.clone(), limit.map(|l| l as usize)).await?,
        Cmd::Supervise { stream, timeout, cmd } => supervise(conn, stream, seconds(*timeout)?, cmd).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Resolves when this process is asked to stop (TERM, INT or HUP). The handlers are
/// installed when this is called, not when it is first polled.
pub(crate) fn termination() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let signals = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup()));
    async move {
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = signals else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
        }
    }
}

/// How `exec` shows what it captures.
struct ExecHow {
    limit: usize,
    timeout: Option<Duration>,
    redaction: Redaction,
    /// Exit with the command's status (`--exit-code`).
    exit_code: bool,
    /// A saved output for the command's stdin (`--stdin`).
    stdin: Option<String>,
}

async fn exec(conn: &Conn, how: ExecHow, refs: &RefArgs, cmd: &[String]) -> Result<ExitCode> {
    // Opened first: a reference this token cannot read is refused before the command starts.
    let input = match &how.stdin {
        Some(r) => Some(crate::input::Input::open(&conn.reader()?, r).await?),
        None => None,
    };
    if let Some(warning) = conn.local_spill_warning() {
        eprintln!("spillway: warning: {warning}");
    }
    let mut opts = capture::ExecOptions::new(conn.spill_target(refs.ttl)?);
    opts.cap = how.limit;
    opts.timeout = how.timeout;
    opts.redaction = how.redaction;
    opts.inherit_stdin = true;
    opts.labels.extend(refs.labels.iter().cloned());
    let cancel = opts.cancel.clone();
    let mut c = tokio::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    let terminated = termination();
    let run = capture::exec_with_input(c, &opts, input);
    tokio::pin!(run);
    // Terminated ourselves: stop the command's group first, then answer as usual.
    let result = tokio::select! {
        r = &mut run => r?,
        () = terminated => { cancel.cancel(); run.await? }
    };
    for (name, r) in [("stdout", &result.stdout), ("stderr", &result.stderr)] {
        if let Some(e) = &r.save_error {
            eprintln!("spillway: warning: the full {name} was not saved: {}", e.message);
        }
    }
    print_json(&result)?;
    if !how.exit_code {
        return Ok(ExitCode::SUCCESS);
    }
    Ok(ExitCode::from(status_of(result.exit_code, result.signal, result.timed_out)))
}

/// A command's status as a shell gives it: its exit code, 128 + N for signal N, 124 for a
/// timeout (as `timeout(1)`), 1 when none was recorded.
pub(crate) fn status_of(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> u8 {
    match (timed_out, exit_code, signal) {
        (true, ..) => 124,
        (_, Some(code), _) => (code & 0xff) as u8,
        (_, None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        _ => 1,
    }
}

/// A signal's number from its name (`TERM`), as Linux numbers them.
fn signal_number(name: &str) -> Option<i32> {
    const NAMES: [&str; 31] = [
        "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE", "ALRM",
        "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF",
        "WINCH", "IO", "PWR", "SYS",
    ];
    let name = name.trim_start_matches("SIG");
    NAMES.iter().position(|n| *n == name).map(|i| i as i32 + 1).or_else(|| name.parse().ok())
}

async fn put(conn: &Conn, file: Option<&Path>, refs: &RefArgs) -> Result<()> {
    let opts = UploadOptions { ttl: refs.ttl, labels: refs.labels.clone(), max_bytes: None };
    let source = match file {
        Some(p) if p.as_os_str() != "-" => transfer::Source::File(p.to_owned()),
        _ => transfer::Source::Stdin,
    };
    match conn.local() {
        Some(dir) => print_json(&transfer::put_local(&LocalDir::new(dir), source, &opts).await?),
        None => print_json(&transfer::put_store(&conn.store()?, source, &opts).await?),
    }
}

async fn gate_turn(conn: &Conn, budget: usize, keep: usize, redaction: Redaction) -> Result<()> {
    let mut input = String::new();
    tokio::io::stdin().read_to_string(&mut input).await?;
    let results = gate::parse_turn(&input)?;
    let mut g = gate::Gate::new(conn.spill_target(None)?);
    g.budget = budget;
    g.keep = keep;
    g.redaction = redaction;
    print_json(&g.apply(results).await)
}

/// One answer of a search, or (`all`) every match of every answer, one JSON line each.
async fn search(store: &StoreClient, mut s: SearchRequest, all: bool, text: bool) -> Result<()> {
    loop {
        let mut found = store.search(&s).await?;
        if text {
            // With --all, the next answers follow; else the cursor is said on stderr.
            let next = if all { found.next_cursor.take() } else { None };
            crate::plain::search(&found)?;
            match next {
                Some(c) => {
                    s.cursor = Some(c);
                    continue;
                }
                None => return Ok(()),
            }
        }
        if !all {
            return print_json(&found);
        }
        for m in &found.matches {
            print_json(m)?;
        }
        match found.next_cursor {
            Some(c) => s.cursor = Some(c),
            None => return Ok(()),
        }
    }
}

async fn bg(conn: &Conn, max_bytes: Option<u64>, timeout: Option<f64>, refs: &RefArgs, cmd: &[String]) -> Result<()> {
    let store = conn.store()?;
    let mut labels = vec![("tool".to_owned(), "bg".to_owned())];
    labels.extend(refs.labels.iter().cloned());
    let opts = UploadOptions { ttl: refs.ttl, labels, max_bytes };
    let s = store.create_stream(&opts).await?;
    let pid = background::spawn_supervisor(&store, &s.id, timeout, cmd).await?;
    print_json(&serde_json::json!({ "stream": s.id, "pid": pid }))
}

async fn tail(conn: &Conn, stream: &str, follow: bool, raw: bool, exit_code: bool) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let info = background::tail(&conn.store()?, stream, follow, raw, &mut out).await?;
    if raw && info.state != spillway_api::StreamState::Open {
        eprintln!("spillway: {}", background::describe_end(&info));
    }
    if !exit_code {
        return Ok(ExitCode::SUCCESS);
    }
    let signal = info.signal.as_deref().and_then(signal_number);
    Ok(ExitCode::from(status_of(info.exit_code, signal, false)))
}

async fn supervise(conn: &Conn, stream: &str, timeout: Option<Duration>, cmd: &[String]) -> Result<()> {
    let mut c = tokio::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    let terminated = termination();
    let stop = Box::pin(async move {
        let timer = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = timer => {}
            () = terminated => {}
        }
    });
    let ready = || {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", background::READY_LINE).and_then(|()| out.flush());
    };
    background::supervise(&conn.store()?, stream, c, stop, ready).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    /// Cursors are base64url: one in 64 starts with `-`, and is still a cursor, not an option.
    #[test]
    fn statuses_are_a_shell_s() {
        use super::{signal_number, status_of};
        assert_eq!(status_of(Some(0), None, false), 0);
        assert_eq!(status_of(Some(2), None, false), 2);
        assert_eq!(status_of(None, Some(9), false), 137);
        assert_eq!(status_of(None, Some(15), true), 124);
        assert_eq!(status_of(None, None, false), 1);
        assert_eq!((signal_number("TERM"), signal_number("SIGKILL"), signal_number("NOPE")), (Some(15), Some(9), None));
    }

    #[test]
    fn a_cursor_may_start_with_a_hyphen() {
        for args in [
            &["spillway", "search", "ERROR", "--cursor", "-oM6EcvfxNJytG8", "--max-matches", "10"][..],
            &["spillway", "refs", "--cursor", "-AAAA", "--limit", "5"][..],
        ] {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(format!("{cli:?}").contains("cursor: Some(\"-"), "{cli:?}");
        }
    }
}

//! The `spillway` command line, as a library so the binary stays a thin `main`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use sha2::Digest as _;
use spillway_api::{AnyDigest, ErrorCode};
use tokio::io::AsyncReadExt;

use crate::error::{ClientError, Result};
use crate::spill::{LocalDir, RemoteStore, SpillTarget};
use crate::store::{GrepRequest, ReadRequest, StoreClient, UploadOptions};
use crate::{background, capture, gate, local};

/// Keep big tool outputs out of the model's context without losing them.
#[derive(Parser, Debug)]
#[command(name = "spillway", version, about)]
pub struct Cli {
    /// Store URL.
    #[arg(long, env = "SPILLWAY_URL", global = true)]
    url: Option<String>,
    /// Store token.
    #[arg(long, env = "SPILLWAY_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Spill to, and read from, files named by content hash in DIR; no server needed.
    #[arg(long, global = true, value_name = "DIR")]
    local: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a command the way an agent's shell tool would; print its receipts.
    Exec {
        /// Bytes of each stream the model may see.
        #[arg(long, default_value_t = crate::truncate::DEFAULT_CAP)]
        limit: usize,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Upload a file (or stdin) and print its blob record.
    Put {
        /// File to upload; `-` or nothing for stdin.
        file: Option<PathBuf>,
        /// Reference lifetime in seconds.
        #[arg(long)]
        ttl: Option<u64>,
        /// `key=value`, repeatable.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
    },
    /// Download the exact bytes of a blob, verified against its digest.
    Get {
        /// `blake3:…` or `sha256:…`.
        digest: String,
        /// Write to FILE instead of stdout (only after verification).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// One capped page of a blob (at most 100,000 bytes).
    Read {
        /// `blake3:…` or `sha256:…`.
        digest: String,
        /// Byte page start.
        #[arg(long, conflicts_with_all = ["line", "lines"])]
        offset: Option<u64>,
        /// Byte page length.
        #[arg(long, conflicts_with_all = ["line", "lines"])]
        limit: Option<u64>,
        /// Line page start (1-based).
        #[arg(long)]
        line: Option<u64>,
        /// Lines per page.
        #[arg(long)]
        lines: Option<u64>,
    },
    /// Matching lines of a blob, capped and resumable.
    Grep {
        /// `blake3:…` or `sha256:…`.
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
        /// Most matches.
        #[arg(long)]
        max_matches: Option<usize>,
    },
    /// Apply the per-turn gate to a JSON array of one turn's tool results on stdin.
    Gate {
        /// Budget of the turn, in bytes.
        #[arg(long, default_value_t = gate::DEFAULT_BUDGET)]
        budget: usize,
        /// Head kept of a degraded result, in bytes.
        #[arg(long, default_value_t = gate::DEFAULT_KEEP)]
        keep: usize,
    },
    /// Start a background task whose output streams to the store.
    Bg {
        /// Stream cap in bytes (default: the server's, 50 MiB).
        #[arg(long)]
        max_bytes: Option<u64>,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Print a background task's output as JSON pages; with -f, follow it until it ends.
    Tail {
        /// Follow.
        #[arg(short, long)]
        follow: bool,
        /// The stream id `bg` printed.
        stream: String,
    },
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        stream: String,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
}

fn parse_label(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("expected key=value, got {s:?}"))
}

impl Cli {
    fn store(&self) -> Result<StoreClient> {
        let url = self.url.clone().ok_or_else(|| {
            ClientError::Other(
                "no store configured: set SPILLWAY_URL and SPILLWAY_TOKEN (or --url/--token), or use --local DIR"
                    .into(),
            )
        })?;
        Ok(StoreClient::new(url, self.token.clone().unwrap_or_default()))
    }

    /// `--local DIR`, else the store, else `./.outputs`.
    fn spill_target(&self) -> Result<Arc<dyn SpillTarget>> {
        Ok(match (&self.local, &self.url) {
            (Some(dir), _) => Arc::new(LocalDir::new(dir)),
            (None, Some(_)) => Arc::new(RemoteStore::new(self.store()?)),
            (None, None) => Arc::new(LocalDir::new(".outputs")),
        })
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v).map_err(|e| ClientError::Other(e.to_string()))?;
    writeln!(out)?;
    Ok(())
}

fn parse_digest(s: &str) -> Result<AnyDigest> {
    s.parse::<AnyDigest>().map_err(ClientError::from)
}

/// Runs the CLI; errors are one line on stderr and a non-zero exit.
pub async fn run(cli: Cli) -> ExitCode {
    match dispatch(&cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spillway: error: {}", describe(&e, &cli));
            ExitCode::from(1)
        }
    }
}

fn describe(e: &ClientError, cli: &Cli) -> String {
    let digest = match &cli.command {
        Cmd::Get { digest, .. } | Cmd::Read { digest, .. } | Cmd::Grep { digest, .. } => Some(digest.as_str()),
        _ => None,
    };
    match (e, digest) {
        (ClientError::Api { code: ErrorCode::NotFound, .. }, Some(d)) => match &cli.local {
            Some(dir) => format!("{d} was not found in {}", dir.display()),
            None => format!("{d} was not found in this namespace"),
        },
        (ClientError::InvalidDigest(_), Some(d)) => format!(
            "invalid digest {d:?}: a digest looks like blake3:<64 lowercase hex digits> or sha256:<64 lowercase hex digits>"
        ),
        _ => e.to_string(),
    }
}

async fn dispatch(cli: &Cli) -> Result<ExitCode> {
    match &cli.command {
        Cmd::Exec { limit, cmd } => {
            let mut opts = capture::ExecOptions::new(cli.spill_target()?);
            opts.cap = *limit;
            let mut c = tokio::process::Command::new(&cmd[0]);
            c.args(&cmd[1..]);
            print_json(&capture::exec(c, &opts).await?)?;
        }
        Cmd::Put { file, ttl, labels } => {
            let opts = UploadOptions { ttl: *ttl, labels: labels.clone(), max_bytes: None };
            let reader: Box<dyn tokio::io::AsyncRead + Send + Sync + Unpin> = match file {
                Some(p) if p.as_os_str() != "-" => Box::new(tokio::fs::File::open(p).await?),
                _ => Box::new(tokio::io::stdin()),
            };
            if let Some(dir) = &cli.local {
                let mut data = Vec::new();
                let mut reader = reader;
                reader.read_to_end(&mut data).await?;
                let mut d = crate::spill::Deadline::new(std::time::Duration::from_secs(3600));
                let sha256 = spillway_api::Sha256Digest::from_bytes(sha2::Sha256::digest(&data).into());
                let (size, lines) = (data.len() as u64, spillway_api::count_lines(&data));
                let path = LocalDir::new(dir).path_of(&spillway_api::Digest::of(&data));
                let existed = path.exists();
                let loc = LocalDir::new(dir).save(data.into(), &opts.labels, &mut d).await?;
                let crate::spill::Location::File { path, digest } = loc else {
                    return Err(ClientError::Other("a local directory saves files".into()));
                };
                // The blob record, plus where the file is.
                print_json(&serde_json::json!({
                    "digest": digest, "sha256": sha256.to_string(), "size": size, "lines": lines,
                    "deduplicated": existed, "expires_at": null, "file_path": path,
                }))?;
            } else {
                let body = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024);
                print_json(&cli.store()?.put_stream(body, &opts).await?)?;
            }
        }
        Cmd::Get { digest, output } => get(cli, digest, output.as_deref()).await?,
        Cmd::Read { digest, offset, limit, line, lines } => {
            let d = parse_digest(digest)?;
            let req = if line.is_some() || lines.is_some() {
                ReadRequest::Lines { line: line.unwrap_or(1), lines: *lines }
            } else {
                ReadRequest::Bytes { offset: offset.unwrap_or(0), limit: *limit }
            };
            match (&cli.local, d) {
                (Some(dir), AnyDigest::Blake3(b)) => {
                    let src = local::LocalSource::open(&LocalDir::new(dir), &b).await?;
                    print_json(&local::read(&src, req).await?)?;
                }
                (Some(_), AnyDigest::Sha256(_)) => return Err(local_sha256()),
                (None, _) => print_json(&cli.store()?.read(digest, req).await?)?,
            }
        }
        Cmd::Grep { digest, pattern, ignore_case, fixed, from_line, max_matches } => {
            let d = parse_digest(digest)?;
            let g = GrepRequest {
                pattern: pattern.clone(),
                ignore_case: *ignore_case,
                fixed: *fixed,
                from_line: *from_line,
                max_matches: *max_matches,
            };
            match (&cli.local, d) {
                (Some(dir), AnyDigest::Blake3(b)) => {
                    let src = local::LocalSource::open(&LocalDir::new(dir), &b).await?;
                    print_json(&local::grep(&src, &g).await?)?;
                }
                (Some(_), AnyDigest::Sha256(_)) => return Err(local_sha256()),
                (None, _) => print_json(&cli.store()?.grep(digest, &g).await?)?,
            }
        }
        Cmd::Gate { budget, keep } => {
            let mut input = String::new();
            tokio::io::stdin().read_to_string(&mut input).await?;
            let results: Vec<gate::TurnResult> = serde_json::from_str(&input)
                .map_err(|e| ClientError::Other(format!("stdin must be a JSON array of strings or receipts: {e}")))?;
            let mut g = gate::Gate::new(cli.spill_target()?);
            g.budget = *budget;
            g.keep = *keep;
            print_json(&g.apply(results).await)?;
        }
        Cmd::Bg { max_bytes, cmd } => {
            let store = cli.store()?;
            let opts = UploadOptions { ttl: None, labels: vec![("tool".into(), "bg".into())], max_bytes: *max_bytes };
            let s = store.create_stream(&opts).await?;
            let mut sup = std::process::Command::new(std::env::current_exe()?);
            sup.arg("supervise").arg("--stream").arg(&s.id).arg("--").args(cmd);
            sup.env("SPILLWAY_URL", store.base_url());
            if let Some(t) = &cli.token {
                sup.env("SPILLWAY_TOKEN", t);
            }
            use std::os::unix::process::CommandExt;
            sup.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .process_group(0);
            sup.spawn()?;
            print_json(&serde_json::json!({ "stream": s.id }))?;
        }
        Cmd::Tail { follow, stream } => {
            let mut out = std::io::stdout().lock();
            background::tail(&cli.store()?, stream, *follow, &mut out).await?;
        }
        Cmd::Supervise { stream, cmd } => {
            let mut c = tokio::process::Command::new(&cmd[0]);
            c.args(&cmd[1..]);
            background::supervise(&cli.store()?, stream, c).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn local_sha256() -> ClientError {
    ClientError::Other("local spills are named by BLAKE3: use the blake3: digest".into())
}

enum Hasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn for_digest(d: &AnyDigest) -> Self {
        match d {
            AnyDigest::Blake3(_) => Self::Blake3(Box::default()),
            AnyDigest::Sha256(_) => Self::Sha256(sha2::Sha256::new()),
        }
    }
    fn update(&mut self, b: &[u8]) {
        match self {
            Self::Blake3(h) => {
                h.update(b);
            }
            Self::Sha256(h) => h.update(b),
        }
    }
    fn finish(self) -> String {
        match self {
            Self::Blake3(h) => spillway_api::Digest::from_bytes(*h.finalize().as_bytes()).to_string(),
            Self::Sha256(h) => spillway_api::Sha256Digest::from_bytes(h.finalize().into()).to_string(),
        }
    }
}

/// Downloads (or copies from `--local`) while hashing; with `-o`, the file appears only verified.
async fn get(cli: &Cli, digest: &str, output: Option<&std::path::Path>) -> Result<()> {
    let d = parse_digest(digest)?;
    let (len, mut body): (Option<u64>, futures::stream::BoxStream<'static, Result<bytes::Bytes>>) = match &cli.local {
        Some(dir) => {
            let AnyDigest::Blake3(b) = d else {
                return Err(local_sha256());
            };
            let path = LocalDir::new(dir).path_of(&b);
            let f = tokio::fs::File::open(&path).await.map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    ClientError::Api { status: 404, code: ErrorCode::NotFound, message: "not found".into() }
                }
                _ => e.into(),
            })?;
            let len = f.metadata().await.ok().map(|m| m.len());
            (
                len,
                tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024)
                    .map(|r| r.map_err(ClientError::from))
                    .boxed(),
            )
        }
        None => {
            let resp = cli.store()?.get(digest).await?;
            (resp.content_length(), resp.bytes_stream().map(|r| r.map_err(ClientError::from)).boxed())
        }
    };
    let bar = indicatif::ProgressBar::with_draw_target(len, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut hasher = Hasher::for_digest(&d);
    let tmp = output.map(|o| {
        let name = o.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        o.with_file_name(format!(".{name}.spillway-partial"))
    });
    let mut sink: Box<dyn Write> = match &tmp {
        Some(t) => Box::new(std::io::BufWriter::new(std::fs::File::create(t)?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let result = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            sink.write_all(&chunk)?;
            bar.inc(chunk.len() as u64);
        }
        sink.flush()?;
        Ok::<_, ClientError>(())
    }
    .await;
    bar.finish_and_clear();
    drop(sink);
    let verified = result.and_then(|()| {
        let actual = hasher.finish();
        if actual == d.to_string() {
            Ok(())
        } else {
            Err(ClientError::DigestMismatch { expected: d.to_string(), actual })
        }
    });
    match (verified, &tmp, output) {
        (Ok(()), Some(t), Some(o)) => std::fs::rename(t, o)?,
        (Err(e), Some(t), _) => {
            let _ = std::fs::remove_file(t);
            return Err(e);
        }
        (Err(e), None, _) => return Err(e),
        _ => {}
    }
    Ok(())
}

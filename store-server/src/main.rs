//! `spillway-server`: parses the command line, starts tracing, and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use spillway_server::auth::{create_token_with, Scope};
use spillway_server::clock::{rfc3339, SystemClock};
use spillway_server::Config;

/// The Spillway store: content-addressed, deduplicated storage for AI agents' tool outputs.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    store: StoreOpts,
    #[command(flatten)]
    serve: ServeOpts,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Where the store is: every subcommand needs these.
#[derive(Args, Debug)]
struct StoreOpts {
    /// Directory for the SQLite database, the blob directory and the first-start token.
    #[arg(long, env = "SPILLWAY_DATA_DIR", default_value = "./spillway-data", global = true)]
    data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…` (default: SQLite in the data directory).
    #[arg(long, env = "SPILLWAY_DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// `file:///path` or `s3://bucket/prefix` (default: the data directory's `blobs/`).
    #[arg(long, env = "SPILLWAY_BLOB_STORE", global = true)]
    blob_store: Option<String>,
    /// Log lines as text or JSON.
    #[arg(long, env = "SPILLWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
}

/// Retention settings: the server's interval loop and the one-shot `retention` take them.
#[derive(Args, Debug)]
struct RetentionOpts {
    /// Seconds between retention passes.
    #[arg(long, env = "SPILLWAY_RETENTION_INTERVAL", default_value_t = 3600)]
    retention_interval: u64,
    /// Seconds unreferenced bytes are kept before they are deleted.
    #[arg(long, env = "SPILLWAY_RETENTION_GRACE", default_value_t = 3600)]
    retention_grace: u64,
}

/// Serving settings (the server alone).
#[derive(Args, Debug)]
struct ServeOpts {
    /// Address to listen on.
    #[arg(long, env = "SPILLWAY_LISTEN", default_value = "127.0.0.1:7745")]
    listen: SocketAddr,
    /// Address of the operator's metrics listener (`GET /metrics`), apart from the API so
    /// that tenants never reach it; `none` for no metrics listener. [default: 127.0.0.1:7746,
    /// or a free port beside it when another process holds that one]
    #[arg(long, env = "SPILLWAY_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    #[command(flatten)]
    retention: RetentionOpts,
    /// Largest blob an upload may carry, in bytes.
    #[arg(long, env = "SPILLWAY_MAX_BLOB_BYTES", default_value_t = 1 << 30)]
    max_blob_bytes: u64,
    /// TTL of a reference when an upload names none, in seconds.
    #[arg(long, env = "SPILLWAY_DEFAULT_TTL", default_value_t = 7 * 24 * 3600)]
    default_ttl: u64,
    /// Longest TTL an upload may ask for, in seconds.
    #[arg(long, env = "SPILLWAY_MAX_TTL", default_value_t = 90 * 24 * 3600)]
    max_ttl: u64,
    /// Default and maximum size of a stream, in bytes.
    #[arg(long, env = "SPILLWAY_MAX_STREAM_BYTES", default_value_t = 50 << 20)]
    max_stream_bytes: u64,
    /// Seconds a client has to send a request's header (also closes idle kept-alive connections).
    #[arg(long, env = "SPILLWAY_HEADER_READ_TIMEOUT", default_value_t = 30)]
    header_read_timeout: u64,
    /// Seconds an upload's body may send nothing before the upload is dropped.
    #[arg(long, env = "SPILLWAY_BODY_IDLE_TIMEOUT", default_value_t = 60)]
    body_idle_timeout: u64,
    /// Seconds a response may wait for its client to take any of it before the connection is closed.
    #[arg(long, env = "SPILLWAY_SEND_IDLE_TIMEOUT", default_value_t = 60)]
    send_idle_timeout: u64,
    /// Most connections served at once; more wait in the listen queue.
    #[arg(long, env = "SPILLWAY_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Bytes kept in reserve beside an embedded database, released when the disk fills so that deletes work.
    #[arg(long, env = "SPILLWAY_STORAGE_RESERVE_BYTES", default_value_t = 16 << 20)]
    storage_reserve_bytes: u64,
    /// Seconds a replica trusts a token it has checked (a revoked token is refused within this; at most 30).
    #[arg(long, env = "SPILLWAY_TOKEN_CACHE_TTL", default_value_t = 30)]
    token_cache_ttl: u64,
    /// Bytes of blob blocks kept in memory for reads when the blobs are on S3 (0: none).
    #[arg(long, env = "SPILLWAY_READ_CACHE_BYTES", default_value_t = 256 << 20)]
    read_cache_bytes: u64,
    /// Bytes of blob text kept JSON-escaped in memory for capped reads (0: none).
    #[arg(long, env = "SPILLWAY_TEXT_CACHE_BYTES", default_value_t = 256 << 20)]
    text_cache_bytes: u64,
    /// Most streams one namespace may have open at once (429 past it).
    #[arg(long, env = "SPILLWAY_MAX_OPEN_STREAMS", default_value_t = 1000)]
    max_open_streams: u64,
    /// Most bytes one namespace may hold: distinct live blobs, plus open streams (507 past it).
    #[arg(long, env = "SPILLWAY_NAMESPACE_QUOTA_BYTES")]
    namespace_quota_bytes: Option<u64>,
    /// Threads for heavy scans (grep, search), apart from those answering requests; a search scans this many outputs at once (default: half the cores, at least 2).
    #[arg(long, env = "SPILLWAY_HEAVY_THREADS")]
    heavy_threads: Option<usize>,
    /// Heavy requests (grep, search) running or queued at once (429 past it).
    #[arg(long, env = "SPILLWAY_MAX_HEAVY_REQUESTS", default_value_t = 16)]
    max_heavy_requests: usize,
    /// Milliseconds one grep or search request scans before it answers with where to go on.
    #[arg(long, env = "SPILLWAY_SEARCH_BUDGET_MS", default_value_t = 1000)]
    search_budget_ms: u64,
    /// A gitleaks TOML rules file: more kinds of secret for redacted reads, beside the built-in ones.
    #[arg(long, env = "SPILLWAY_REDACT_RULES")]
    redact_rules: Option<PathBuf>,
    /// Seconds after which a blob is compacted into compressed, deduplicated chunks.
    #[arg(long, env = "SPILLWAY_COMPACT_AFTER", default_value_t = 300)]
    compact_after: u64,
    /// Seconds between compaction passes.
    #[arg(long, env = "SPILLWAY_COMPACT_INTERVAL", default_value_t = 60)]
    compact_interval: u64,
    /// Seconds the background scrub takes to check everything stored against its hashes, a
    /// 24th at a time, paced to give way to requests; 0 for no background scrub.
    #[arg(long, env = "SPILLWAY_SCRUB_INTERVAL", default_value_t = 86_400)]
    scrub_interval: u64,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Manage tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Compact now every blob not yet compacted (beside a running server, or alone) and print
    /// {"blobs_compacted", "bytes_before", "bytes_after"}.
    Compact {
        /// Only blobs written more than this many seconds ago.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        older_than: u64,
    },
    /// Print what the store holds: {"stored_bytes", "logical_bytes", "blobs", "corrupt"}.
    Stats,
    /// Check stored blobs, chunks and packs against their hashes, mark what fails, print
    /// {"checked_blobs", "checked_chunks", "checked_bytes", "corrupt", "missing", "seconds"}
    /// and exit 1 when something failed.
    Scrub {
        /// Check only the N-th of T parts, by digest (`2/7`): a rolling check.
        #[arg(long, value_name = "N/T", value_parser = parse_subset)]
        subset: Option<(u32, u32)>,
        /// Read at most this many bytes per second.
        #[arg(long, value_name = "BYTES")]
        max_rate: Option<u64>,
    },
    /// Run one retention pass and print a JSON summary line.
    Retention {
        /// Report what would be deleted without deleting it.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        retention: RetentionOpts,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// List tokens, one JSON object per line (never the token itself).
    List,
    /// Revoke a token by the id `token list` shows; every replica refuses it within 30 s.
    Revoke {
        /// The token's id.
        id: String,
    },
    /// Create a token and print it on stdout.
    Create {
        /// The namespace it belongs to.
        #[arg(long)]
        namespace: String,
        /// read, write or admin; repeat for several.
        #[arg(long = "scope", required = true, value_parser = parse_scope)]
        scopes: Vec<Scope>,
        /// A token for agent workers: every read through it shows secrets as marks, and raw
        /// bytes (GET of a blob, Range) are refused.
        #[arg(long)]
        redacted: bool,
    },
}

fn parse_subset(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?} is not N/T with 1 <= N <= T, like 2/7");
    let (n, t) = s.split_once('/').ok_or_else(bad)?;
    let (n, t): (u32, u32) = (n.trim().parse().map_err(|_| bad())?, t.trim().parse().map_err(|_| bad())?);
    (1..=t).contains(&n).then_some((n, t)).ok_or_else(bad)
}

fn parse_scope(s: &str) -> Result<Scope, String> {
    s.parse().map_err(|e: spillway_api::NameError| e.to_string())
}

impl StoreOpts {
    fn config(&self) -> anyhow::Result<Config> {
        // Relative to the working directory, and absolute from here on: `file://` URLs and
        // the token file are built from it.
        let data_dir = std::path::absolute(&self.data_dir)
            .with_context(|| format!("cannot resolve the data directory {}", self.data_dir.display()))?;
        let mut c = Config::new(data_dir);
        c.database_url = self.database_url.clone();
        c.blob_store = self.blob_store.clone();
        Ok(c)
    }
}

impl RetentionOpts {
    fn apply(&self, c: &mut Config) {
        c.retention_interval = Duration::from_secs(self.retention_interval.max(1));
        c.retention_grace = Duration::from_secs(self.retention_grace);
    }
}

impl ServeOpts {
    fn apply(&self, c: &mut Config) {
        self.retention.apply(c);
        c.max_blob_bytes = self.max_blob_bytes;
        c.default_ttl = Duration::from_secs(self.default_ttl);
        c.max_ttl = Duration::from_secs(self.max_ttl);
        c.max_stream_bytes = self.max_stream_bytes;
        c.token_cache_ttl = Duration::from_secs(self.token_cache_ttl.min(30));
        c.header_read_timeout = Duration::from_secs(self.header_read_timeout.max(1));
        c.body_idle_timeout = Duration::from_secs(self.body_idle_timeout.max(1));
        c.send_idle_timeout = Duration::from_secs(self.send_idle_timeout.max(1));
        c.max_connections = self.max_connections.max(1);
        c.storage_reserve_bytes = self.storage_reserve_bytes;
        c.read_cache_bytes = self.read_cache_bytes;
        c.text_cache_bytes = self.text_cache_bytes;
        c.max_open_streams = self.max_open_streams;
        c.namespace_quota_bytes = self.namespace_quota_bytes;
        if let Some(n) = self.heavy_threads {
            c.heavy_threads = n.max(1);
        }
        c.max_heavy_requests = self.max_heavy_requests.max(1);
        c.search_budget = Duration::from_millis(self.search_budget_ms.max(1));
        c.redact_rules = self.redact_rules.clone();
        c.compact_after = Duration::from_secs(self.compact_after);
        c.compact_interval = Duration::from_secs(self.compact_interval.max(1));
        c.scrub_interval = Duration::from_secs(self.scrub_interval);
    }
}

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
enum LogFormat {
    /// One human-readable line per event; colour only on a terminal.
    #[default]
    Text,
    /// One JSON object per event, for log shippers.
    Json,
}

/// The metrics listener when none was asked for: [`DEFAULT_METRICS_LISTEN`], or a free port on
/// loopback when another process holds that one (a second server on one machine, started with
/// only `--listen`, still serves; the address it took is in the start-up log). An address given
/// with `--metrics-listen` is never swapped: failing to bind it stops the start.
async fn default_metrics_listener() -> anyhow::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(DEFAULT_METRICS_LISTEN).await {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::warn!(
                taken = DEFAULT_METRICS_LISTEN,
                "the default metrics address is in use: metrics listen on a free port instead (--metrics-listen to choose)"
            );
            let free = tokio::net::TcpListener::bind("127.0.0.1:0").await;
            free.context("cannot listen for metrics on a free port (--metrics-listen; `none` to go without)")
        }
        other => other.with_context(|| {
            format!("cannot listen for metrics on {DEFAULT_METRICS_LISTEN} (--metrics-listen; `none` to go without)")
        }),
    }
}

/// Where the operator's metrics listen unless `--metrics-listen` says otherwise.
const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:7746";

/// Log lines go to stderr through a thread of their own, which writes them in batches
/// (`spillway_server::http::logwriter`): a logging request only appends its line to a buffer. None is
/// dropped, and the guard writes what is left when `main` returns.
fn init_tracing(format: LogFormat) -> anyhow::Result<spillway_server::http::logwriter::Guard> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sqlx=warn".into());
    let (writer, guard) = spillway_server::http::logwriter::batched("spillway-log", std::io::stderr())
        .context("cannot start the log writer thread")?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer.clone());
    // The request line is made by `reqlog` with the subscriber's format (not with colours). Its
    // test sets the subscriber up as here: a change to these settings goes there too.
    use spillway_server::http::reqlog::{install, Format};
    match format {
        LogFormat::Text if std::io::stderr().is_terminal() => builder.with_ansi(true).init(),
        LogFormat::Text => {
            builder.with_ansi(false).init();
            install(writer, Format::Text);
        }
        LogFormat::Json => {
            builder.json().with_current_span(false).init();
            install(writer, Format::Json);
        }
    }
    Ok(guard)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _log = init_tracing(cli.store.log_format)?;
    let mut config = cli.store.config()?;
    match &cli.command {
        None => cli.serve.apply(&mut config),
        Some(Command::Retention { retention, .. }) => retention.apply(&mut config),
        Some(Command::Token { .. } | Command::Compact { .. } | Command::Stats | Command::Scrub { .. }) => {}
    }
    let state = spillway_server::build_state(config, Arc::new(SystemClock)).await?;
    match cli.command {
        None => {
            spillway_server::ensure_first_token(&state).await?;
            let listener = tokio::net::TcpListener::bind(cli.serve.listen)
                .await
                .with_context(|| format!("cannot listen on {}", cli.serve.listen))?;
            let metrics = match cli.serve.metrics_listen.as_deref() {
                Some("none" | "off") => None,
                Some(addr) => {
                    let addr: SocketAddr =
                        addr.parse().with_context(|| format!("--metrics-listen {addr:?} is not an address"))?;
                    let m = tokio::net::TcpListener::bind(addr).await.with_context(|| {
                        format!("cannot listen for metrics on {addr} (--metrics-listen; `none` to go without)")
                    })?;
                    Some(m)
                }
                None => Some(default_metrics_listener().await?),
            };
            let addr = listener.local_addr()?;
            tracing::info!(addr = %addr, "spillway-server listening");
            // How to connect, as lines to copy: the clients' two variables and the viewer.
            let token_file = state.config.data_dir.join("token");
            if token_file.exists() {
                let url = format!("http://{addr}");
                let token = token_file.display();
                tracing::info!("connect: export SPILLWAY_URL={url} SPILLWAY_TOKEN=$(cat {token})");
                tracing::info!(
                    "viewer: {url}/ui/ — for agents, a token that sees secrets only as marks: `spillway-server token \
                     create --namespace default --scope read --scope write --redacted`"
                );
            }
            if let Some(m) = &metrics {
                tracing::info!(metrics_addr = %m.local_addr()?, "metrics listening (for the operator's Prometheus)");
            }
            // The signal closes both listeners at once: the metrics one must not stay bound
            // while requests in flight drain (up to 30 s), or a server started right after is
            // refused its port.
            let stop = tokio_util::sync::CancellationToken::new();
            let metrics = metrics.map(|m| {
                let (config, stop) = (state.config.clone(), stop.clone());
                tokio::spawn(async move { spillway_server::serve_metrics(m, &config, stop.cancelled_owned()).await })
            });
            let signal = {
                let stop = stop.clone();
                async move {
                    shutdown_signal().await;
                    stop.cancel();
                }
            };
            spillway_server::serve(listener, state, signal).await?;
            stop.cancel();
            if let Some(m) = metrics {
                let _ = m.await;
            }
        }
        Some(Command::Token { command: TokenCommand::Create { namespace, scopes, redacted } }) => {
            let token = create_token_with(&state.db, &namespace, &scopes, redacted, state.now()).await?;
            println!("{token}");
        }
        Some(Command::Token { command: TokenCommand::List }) => {
            for t in state.db.list_tokens().await? {
                let line = serde_json::json!({
                    "id": t.id,
                    "namespace": t.namespace,
                    "scopes": t.scopes,
                    "created_at": rfc3339(t.created_at),
                    "last_used_at": t.last_used_at.map(rfc3339),
                    "redacted": t.redacted,
                });
                println!("{line}");
            }
        }
        Some(Command::Token { command: TokenCommand::Revoke { id } }) => {
            anyhow::ensure!(state.db.revoke_token(&id).await?, "no token has id {id:?} (see `token list`)");
            eprintln!("revoked {id}: every replica refuses it within 30 seconds");
        }
        Some(Command::Compact { older_than }) => {
            let summary =
                spillway_server::jobs::compaction::run_compaction_once(&state.jobs, Duration::from_secs(older_than))
                    .await?;
            println!("{}", serde_json::to_string(&summary)?);
        }
        Some(Command::Stats) => println!("{}", serde_json::to_string(&state.db.storage_stats().await?)?),
        Some(Command::Scrub { subset, max_rate }) => {
            let opts = spillway_server::jobs::scrub::ScrubOpts { subset, max_rate, give_way: false };
            let summary = spillway_server::jobs::scrub::run_scrub_once(&state.jobs, &opts).await?;
            println!("{}", serde_json::to_string(&summary)?);
            let (corrupt, missing) = (summary.corrupt.len(), summary.missing.len());
            anyhow::ensure!(corrupt + missing == 0, "the scrub found {corrupt} corrupt and {missing} missing outputs");
        }
        Some(Command::Retention { dry_run, .. }) => {
            let summary = spillway_server::run_retention_once(&state.jobs, dry_run).await?;
            println!("{}", serde_json::to_string(&summary)?);
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

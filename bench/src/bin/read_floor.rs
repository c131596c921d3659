//! The capped read's floor: what axum, hyper, tokio and the kernel cost to answer a JSON page
//! of 100,000 bytes of text, with none of the server's own work (no token, no lookup, no page
//! cutting, no log line, no metrics). It answers `GET /v1/blobs/{digest}/read?offset=N` with
//! the server's own body type: the fields, then 100,000 bytes of the object's text escaped
//! once at start-up, sliced at `offset` (as cold in the memory cache as the server's text
//! cache is under random offsets), or with `--hot` always the first 100,000 (always cached).
//! `bench/run-read-floor.sh` loads it beside the real server and nginx.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::routing::get;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:17832")]
    listen: SocketAddr,
    /// The object whose text the pages carry.
    #[arg(long)]
    object: PathBuf,
    /// Every page from the object's start (always in the memory cache).
    #[arg(long)]
    hot: bool,
}

/// Bytes of text per page, as the yardstick asks.
const PAGE: usize = 100_000;

#[derive(Clone)]
struct Text {
    escaped: Bytes,
    hot: bool,
}

/// `p`, or the start of the escape `p` would cut in two (the object is printable text and
/// newlines, so every escape is two bytes: `\n`, `\"`, `\\`), so that a page is valid JSON.
fn boundary(escaped: &[u8], p: usize) -> usize {
    let backslashes = escaped[..p].iter().rev().take_while(|&&b| b == b'\\').count();
    p - backslashes % 2
}

async fn page(State(t): State<Text>, Query(q): Query<HashMap<String, String>>) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let last = t.escaped.len().saturating_sub(PAGE);
    let offset = if t.hot { 0 } else { q.get("offset").and_then(|o| o.parse().ok()).unwrap_or(0).min(last) };
    let offset = boundary(&t.escaped, offset);
    let end = boundary(&t.escaped, (offset + PAGE).min(t.escaped.len()));
    let fields = format!(r#"{{"offset":{offset},"length":{},"next_offset":{end},"content":""#, end - offset);
    let pieces = VecDeque::from([Bytes::from(fields), t.escaped.slice(offset..end), Bytes::from_static(b"\"}")]);
    let body = Body::new(spillway_server::http::json::Pieces::new(pieces));
    ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let raw = std::fs::read(&args.object).with_context(|| format!("cannot read {}", args.object.display()))?;
    // JSON-escaped once (a string's quotes stripped), as the text cache holds it.
    let quoted = serde_json::to_vec(&String::from_utf8_lossy(&raw))?;
    let escaped = Bytes::from(quoted).slice(1..);
    let escaped = escaped.slice(..escaped.len() - 1);
    let app =
        axum::Router::new().route("/v1/blobs/{digest}/read", get(page)).with_state(Text { escaped, hot: args.hot });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!("spillway-read-floor listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

//! `spillway-load`: drives `spillway-server` and, for comparison, nginx (WebDAV PUT, Range GET)
//! or an S3 server, with the same request mix on loopback. Prints one JSON line per run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use spillway_bench::Stats;

#[derive(Parser)]
struct Cli {
    /// Which server the requests go to.
    #[arg(long, value_enum)]
    target: Target,
    /// Base URL (`http://127.0.0.1:7745` for spillway, `http://127.0.0.1:8080/dav` for nginx).
    #[arg(long)]
    url: String,
    /// Bearer token (spillway).
    #[arg(long, env = "SPILLWAY_TOKEN", default_value = "")]
    token: String,
    /// Concurrent connections.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Label printed with the figures.
    #[arg(long, default_value = "")]
    label: String,
    #[command(subcommand)]
    op: Op,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Target {
    Spillway,
    Nginx,
    /// Straight to an S3 server (`--url` is the bucket; endpoint and keys from `AWS_*`).
    S3,
    /// The disk's own durable write speed (`put` only): each body written to a new file in the
    /// directory `--url` and fsynced before the next, as `dd conv=fsync` does.
    Disk,
}

#[derive(Subcommand)]
enum Op {
    /// Upload `count` distinct bodies of `size` bytes (all made before the clock starts).
    Put {
        #[arg(long)]
        size: usize,
        #[arg(long)]
        count: usize,
        /// Spillway: `PUT /v1/blobs/{digest}` with the BLAKE3 digest computed beforehand, as the
        /// SDK uploads, instead of `POST /v1/blobs` (the server alone hashing).
        #[arg(long)]
        announce: bool,
        /// Spillway: each reference lives this many seconds (`?ttl=`) instead of the default.
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// Upload one blob of `size` bytes (distinct content per run) and print its name.
    Seed {
        #[arg(long)]
        size: usize,
        /// Numbered lines instead of random bytes.
        #[arg(long)]
        lines: bool,
    },
    /// Capped 100,000-byte reads at random offsets of `name` for `secs` seconds.
    Range {
        #[arg(long)]
        name: String,
        #[arg(long)]
        size: u64,
        #[arg(long, default_value_t = 10)]
        secs: u64,
        /// Spillway: more of the read's query (`redact=true`), appended after `&`.
        #[arg(long, default_value = "")]
        query: String,
    },
    /// Searches of the namespace (spillway only) with `query` (`pattern=…&label.k=v`), each
    /// followed by `next_cursor` to its last page, `count` walks in all; bytes are matches.
    Search {
        #[arg(long)]
        query: String,
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
    /// Full downloads of `name`, `count` times.
    Get {
        #[arg(long)]
        name: String,
        #[arg(long)]
        count: usize,
    },
    /// Long-polls on an empty stream (spillway only): each connection reads it with `wait_ms`
    /// and waits the whole time, `count` times in all.
    Poll {
        #[arg(long, default_value_t = 30_000)]
        wait_ms: u64,
        #[arg(long)]
        count: usize,
    },
    /// Byte pages of `name` (spillway only), read in order from offset 0 by following
    /// `next_offset` to the end, as an agent pages through a log; each connection once.
    Pages {
        #[arg(long)]
        name: String,
    },
    /// Line pages at `line` of `name`, `count` times.
    Line {
        #[arg(long)]
        name: String,
        #[arg(long)]
        line: u64,
        #[arg(long, default_value_t = 100)]
        lines: u64,
        #[arg(long)]
        count: usize,
    },
    /// Greps of `name` (spillway only) with `query` (`pattern=…&before=…`), `count` times.
    Grep {
        #[arg(long)]
        name: String,
        #[arg(long)]
        query: String,
        #[arg(long)]
        count: usize,
    },
}

struct Ctx {
    s3: Option<Arc<dyn object_store::ObjectStore>>,
    http: reqwest::Client,
    target: Target,
    url: String,
    token: String,
    /// Appended to a Spillway upload's URL (`?ttl=…`), or empty.
    put_query: String,
}

impl Ctx {
    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if self.target == Target::Spillway {
            r.bearer_auth(&self.token)
        } else {
            r
        }
    }

    async fn put(&self, name: &str, body: Bytes, digest: Option<&str>) -> anyhow::Result<String> {
        if let Some(s3) = &self.s3 {
            s3.put(&object_store::path::Path::from(name), body.into()).await?;
            return Ok(name.to_owned());
        }
        if self.target == Target::Disk {
            let path = std::path::Path::new(&self.url).join(name);
            tokio::task::spawn_blocking(move || {
                use std::io::Write;
                let mut f = std::fs::File::create(path)?;
                f.write_all(&body)?;
                f.sync_all()
            })
            .await??;
            return Ok(name.to_owned());
        }
        let r = match self.target {
            Target::Spillway => match digest {
                Some(d) => self.auth(self.http.put(format!("{}/v1/blobs/{d}{}", self.url, self.put_query))),
                None => self.auth(self.http.post(format!("{}/v1/blobs{}", self.url, self.put_query))),
            },
            Target::Nginx | Target::S3 | Target::Disk => self.http.put(format!("{}/{name}", self.url)),
        };
        let resp = r.body(body).send().await?;
        anyhow::ensure!(resp.status().is_success(), "PUT {}", resp.status());
        Ok(match self.target {
            Target::Spillway => {
                resp.json::<serde_json::Value>().await?["digest"].as_str().unwrap_or_default().to_owned()
            }
            Target::Nginx | Target::S3 | Target::Disk => {
                resp.bytes().await?;
                name.to_owned()
            }
        })
    }

    async fn range(&self, name: &str, offset: u64, len: u64, query: &str) -> anyhow::Result<u64> {
        if let Some(s3) = &self.s3 {
            let b = s3.get_range(&object_store::path::Path::from(name), offset..offset + len).await?;
            return Ok(b.len() as u64);
        }
        let resp = match self.target {
            Target::Spillway => {
                let mut url = format!("{}/v1/blobs/{name}/read?offset={offset}&limit={len}", self.url);
                if !query.is_empty() {
                    url.push('&');
                    url.push_str(query);
                }
                self.auth(self.http.get(url)).send().await?
            }
            Target::Nginx | Target::S3 | Target::Disk => {
                let range = format!("bytes={offset}-{}", offset + len - 1);
                self.http.get(format!("{}/{name}", self.url)).header("Range", range).send().await?
            }
        };
        anyhow::ensure!(resp.status().is_success(), "range {}", resp.status());
        Ok(resp.bytes().await?.len() as u64)
    }

    /// A new empty stream's id (spillway).
    async fn create_stream(&self) -> anyhow::Result<String> {
        let resp = self.auth(self.http.post(format!("{}/v1/streams", self.url))).send().await?;
        anyhow::ensure!(resp.status().is_success(), "create stream {}", resp.status());
        Ok(resp.json::<serde_json::Value>().await?["id"].as_str().unwrap_or_default().to_owned())
    }

    async fn get(&self, name: &str) -> anyhow::Result<u64> {
        let url = match self.target {
            Target::Spillway => format!("{}/v1/blobs/{name}", self.url),
            Target::Nginx | Target::S3 | Target::Disk => format!("{}/{name}", self.url),
        };
        let mut resp = self.auth(self.http.get(url)).send().await?;
        anyhow::ensure!(resp.status().is_success(), "get {}", resp.status());
        let mut n = 0;
        while let Some(c) = resp.chunk().await? {
            n += c.len() as u64;
        }
        Ok(n)
    }
}

fn body(size: usize, seq: u64, salt: u64) -> Bytes {
    let mut v = vec![0u8; size];
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    Bytes::from(v)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let http = reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(256).build()?;
    let s3: Option<Arc<dyn object_store::ObjectStore>> = match cli.target {
        Target::S3 => {
            Some(Arc::new(object_store::aws::AmazonS3Builder::from_env().with_bucket_name(cli.url.clone()).build()?))
        }
        _ => None,
    };
    let put_query = match &cli.op {
        Op::Put { ttl: Some(t), .. } => format!("?ttl={t}"),
        _ => String::new(),
    };
    let ctx = Arc::new(Ctx {
        s3,
        http,
        target: cli.target,
        url: cli.url.trim_end_matches('/').to_owned(),
        token: cli.token,
        put_query,
    });
    let salt = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let conc = cli.concurrency.max(1);
    match cli.op {
        Op::Seed { size, lines } => {
            let data = if lines {
                let n = size;
                Bytes::from((1..=n).map(|i| format!("log line {i:>9} {salt}\n")).collect::<String>())
            } else {
                body(size, 0, salt)
            };
            let name = format!("seed-{salt}");
            println!("{}", ctx.put(&name, data, None).await?);
            return Ok(());
        }
        op => {
            let stream = match op {
                Op::Poll { .. } => Some(ctx.create_stream().await?),
                _ => None,
            };
            let bodies = Arc::new(match &op {
                Op::Put { size, count, announce, .. } => (0..*count as u64)
                    .map(|i| {
                        let data = body(*size, i, salt);
                        let digest = announce.then(|| spillway_api::Digest::of(&data).to_string());
                        (data, digest)
                    })
                    .collect(),
                _ => Vec::new(),
            });
            let next = Arc::new(AtomicU64::new(0));
            let start = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..conc {
                let ctx = ctx.clone();
                let next = next.clone();
                let op = match &op {
                    Op::Put { .. } => Work::Put(bodies.clone()),
                    Op::Range { name, size, secs, query } => {
                        Work::Range(name.clone(), *size, Duration::from_secs(*secs), query.clone())
                    }
                    Op::Search { query, count } => Work::Search(query.clone(), *count as u64),
                    Op::Get { name, count } => Work::Get(name.clone(), *count as u64),
                    Op::Line { name, line, lines, count } => {
                        Work::Ask(format!("/v1/blobs/{name}/read?line={line}&lines={lines}"), *count as u64)
                    }
                    Op::Grep { name, query, count } => {
                        Work::Ask(format!("/v1/blobs/{name}/grep?{query}"), *count as u64)
                    }
                    Op::Pages { name } => Work::Pages(name.clone(), Some(0)),
                    Op::Poll { wait_ms, count } => {
                        Work::Poll(stream.clone().unwrap_or_default(), *wait_ms, *count as u64)
                    }
                    Op::Seed { .. } => unreachable!(),
                };
                tasks.push(tokio::spawn(async move { run(&ctx, op, &next, salt, start).await }));
            }
            let mut lat = Vec::new();
            let mut bytes = 0;
            for t in tasks {
                let (l, b) = t.await??;
                lat.extend(l);
                bytes += b;
            }
            let stats = Stats::new(lat, bytes, start.elapsed());
            println!("{}", stats.json(&cli.label));
        }
    }
    Ok(())
}

enum Work {
    /// Bodies, with the digest to announce.
    Put(Arc<Vec<(Bytes, Option<String>)>>),
    Range(String, u64, Duration, String),
    Get(String, u64),
    /// The query, and the walks left to make.
    Search(String, u64),
    /// A GET of this path and query (a line page, a grep), `count` times in all.
    Ask(String, u64),
    /// The blob, and the offset of the next page (`None`: read to the end).
    Pages(String, Option<u64>),
    Poll(String, u64, u64),
}

async fn run(
    ctx: &Ctx,
    mut w: Work,
    next: &AtomicU64,
    salt: u64,
    start: Instant,
) -> anyhow::Result<(Vec<Duration>, u64)> {
    let mut lat = Vec::new();
    let mut bytes = 0u64;
    let mut rng = salt ^ (next.fetch_add(0, Ordering::Relaxed) + 1);
    loop {
        let t0 = Instant::now();
        match &mut w {
            Work::Put(bodies) => {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((data, digest)) = bodies.get(i as usize) else { break };
                ctx.put(&format!("b-{salt}-{i}"), data.clone(), digest.as_deref()).await?;
                bytes += data.len() as u64;
            }
            Work::Range(name, size, secs, query) => {
                if start.elapsed() >= *secs {
                    break;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let offset = rng % (*size - 100_000);
                bytes += ctx.range(name, offset, 100_000, query).await?;
            }
            Work::Get(name, count) => {
                if next.fetch_add(1, Ordering::Relaxed) >= *count {
                    break;
                }
                bytes += ctx.get(name).await?;
            }
            Work::Poll(id, wait_ms, count) => {
                if next.fetch_add(1, Ordering::Relaxed) >= *count {
                    break;
                }
                let url = format!("{}/v1/streams/{id}/read?offset=0&wait_ms={wait_ms}", ctx.url);
                let resp = ctx.auth(ctx.http.get(url)).send().await?;
                anyhow::ensure!(resp.status().is_success(), "poll {}", resp.status());
                bytes += resp.bytes().await?.len() as u64;
            }
            Work::Pages(name, at) => {
                let Some(offset) = *at else { break };
                let url = format!("{}/v1/blobs/{name}/read?offset={offset}", ctx.url);
                let resp = ctx.auth(ctx.http.get(url)).send().await?;
                anyhow::ensure!(resp.status().is_success(), "page {}", resp.status());
                let page: serde_json::Value = resp.json().await?;
                bytes += page["length"].as_u64().unwrap_or_default();
                *at = page["next_offset"].as_u64();
            }
            Work::Search(query, count) => {
                if next.fetch_add(1, Ordering::Relaxed) >= *count {
                    break;
                }
                let mut cursor: Option<String> = None;
                loop {
                    let mut url = format!("{}/v1/search?{query}&max_matches=1000", ctx.url);
                    if let Some(c) = &cursor {
                        url.push_str("&cursor=");
                        url.push_str(c);
                    }
                    let resp = ctx.auth(ctx.http.get(url)).send().await?;
                    anyhow::ensure!(resp.status().is_success(), "search {}", resp.status());
                    let page: serde_json::Value = resp.json().await?;
                    bytes += page["matches"].as_array().map_or(0, Vec::len) as u64;
                    match page["next_cursor"].as_str() {
                        Some(c) => cursor = Some(c.to_owned()),
                        None => break,
                    }
                }
            }
            Work::Ask(path, count) => {
                if next.fetch_add(1, Ordering::Relaxed) >= *count {
                    break;
                }
                let resp = ctx.auth(ctx.http.get(format!("{}{path}", ctx.url))).send().await?;
                anyhow::ensure!(resp.status().is_success(), "{path}: {}", resp.status());
                bytes += resp.bytes().await?.len() as u64;
            }
        }
        lat.push(t0.elapsed());
    }
    Ok((lat, bytes))
}

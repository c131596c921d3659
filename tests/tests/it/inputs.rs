//! Outputs as inputs (api.md v1.3): a saved output as a command's stdin (`exec --stdin`), the
//! last lines of an output (`tail_lines`), and references in tool arguments (`resolve`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use spillway_client::reader::Reader;
use spillway_client::resolve::{resolve, ResolveOptions};
use spillway_client::{ReadRequest, StoreClient, UploadOptions};
use spillway_server::auth::Scope;

use crate::support::*;

/// The `spillway` CLI against `srv` (or `--local`), in `cwd`.
fn cli(srv: &TestServer, token: &str, cwd: &std::path::Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(client_binary());
    c.current_dir(cwd).env("SPILLWAY_URL", &srv.url).env("SPILLWAY_TOKEN", token);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Runs the CLI; its output, and the peak resident memory its process reached (`VmHWM`,
/// read until it exits).
async fn run_measured(mut c: tokio::process::Command) -> (std::process::Output, u64, Duration) {
    let started = Instant::now();
    let child = c.spawn().expect("spillway starts");
    let status = format!("/proc/{}/status", child.id().expect("a pid"));
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watch = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                let Ok(s) = std::fs::read_to_string(&status) else { return };
                let hwm = s
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
                match hwm {
                    Some(kb) => peak.fetch_max(kb * 1024, std::sync::atomic::Ordering::Relaxed),
                    None => return, // a zombie: it has exited
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let out = child.wait_with_output().await.expect("spillway runs");
    let took = started.elapsed();
    watch.abort();
    (out, peak.load(std::sync::atomic::Ordering::Relaxed), took)
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "spillway failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `n` lines of about 100 bytes, generated as they are uploaded.
fn big_lines(n: u64) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + Sync + 'static {
    const PER_CHUNK: u64 = 10_000;
    futures::stream::iter((0..n.div_ceil(PER_CHUNK)).map(move |k| {
        let mut s = String::with_capacity(PER_CHUNK as usize * 100);
        for i in k * PER_CHUNK..((k + 1) * PER_CHUNK).min(n) {
            s.push_str(&format!(
                "{{\"i\":{i:>10},\"status\":{},\"path\":\"/api/v1/items/{:>8}\",\"pad\":\"{:>29}\"}}\n",
                if i % 7 == 0 { 500 } else { 200 },
                i % 1000,
                ""
            ));
        }
        Ok(Bytes::from(s))
    }))
}

#[tokio::test]
async fn a_gigabyte_feeds_a_command_in_bounded_memory() {
    let srv = TestServer::start().await;
    let c = srv.client();
    // 10,000,000 lines of 100 bytes: 1,000,000,000 bytes.
    let n = 10_000_000u64;
    let rec = c.put_stream(big_lines(n), &UploadOptions::default()).await.unwrap();
    assert_eq!(rec.size, 1_000_000_000);
    let work = tempfile::tempdir().unwrap();
    let d = rec.digest.to_string();
    let mut wc = cli(&srv, &srv.token, work.path());
    wc.args(["exec", "--stdin", &d, "--", "wc", "-l"]);
    let (out, peak, _) = run_measured(wc).await;
    let v = json_of(&out);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["stdout"]["result"].as_str().unwrap().trim(), n.to_string(), "every byte reached the command");
    eprintln!("exec --stdin of 1 GB into wc -l: spillway's peak RSS {} KiB", peak >> 10);
    assert!(peak < 64 << 20, "spillway's peak RSS {} MiB", peak >> 20);
    // A command that stops reading ends the feed at once, cleanly.
    let mut head = cli(&srv, &srv.token, work.path());
    head.args(["exec", "--stdin", &d, "--", "head", "-1"]);
    let (out, _, took) = run_measured(head).await;
    let v = json_of(&out);
    assert_eq!((v["exit_code"].as_i64(), v["stderr"]["result"].as_str()), (Some(0), Some("")));
    assert!(v["stdout"]["result"].as_str().unwrap().starts_with("{\"i\":         0,"), "{v}");
    eprintln!("exec --stdin of 1 GB into head -1: {took:?}");
    assert!(took < Duration::from_secs(1), "head -1 of 1 GB took {took:?}");
    srv.stop().await;
}

#[tokio::test]
async fn what_the_token_cannot_read_is_refused_before_the_command_runs() {
    let srv = TestServer::start().await;
    let ours = srv.client().put(Bytes::from_static(b"ours\n"), &UploadOptions::default()).await.unwrap();
    let other = srv.client_for("other", ALL).await;
    let theirs = other.put(Bytes::from_static(b"theirs\n"), &UploadOptions::default()).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let marker = work.path().join("ran");
    let forged = format!("blake3:{}", "ab".repeat(32));
    for (reference, code) in [
        ("blake3:zz".to_owned(), "invalid digest"),
        (forged, "not_found"),
        (theirs.digest.to_string(), "not_found"),
        ("0123456789abcdef0123456789abcdef".to_owned(), "not_found"),
    ] {
        let mut c = cli(&srv, &srv.token, work.path());
        c.args(["exec", "--stdin", &reference, "--", "touch", "ran"]);
        let out = c.output().await.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(code), "{reference}: {err}");
        assert!(!marker.exists(), "{reference}: the command ran");
    }
    // A redacted token (an agent's that must see secrets only as marks) gets no raw bytes: a
    // command's stdin is refused as a `get` is.
    let redacted = srv.redacted_token("ns-a", &[Scope::Read, Scope::Write]).await;
    let mut c = cli(&srv, &redacted, work.path());
    c.args(["exec", "--stdin", &ours.digest.to_string(), "--", "touch", "ran"]);
    let out = c.output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("forbidden"), "{err}");
    assert!(!marker.exists(), "a redacted token: the command ran");
    // A read-only token of the namespace feeds its own output.
    let reader = srv.token("ns-a", &[Scope::Read]).await;
    let mut c = cli(&srv, &reader, work.path());
    c.args(["exec", "--local", "spills", "--stdin", &ours.digest.to_string(), "--", "cat"]);
    let mut c2 = cli(&srv, &reader, work.path());
    c2.args(["exec", "--stdin", &ours.digest.to_string(), "--", "cat"]);
    assert_eq!(json_of(&c2.output().await.unwrap())["stdout"]["result"], "ours\n");
    let out = c.output().await.unwrap();
    assert!(!out.status.success(), "--local reads the directory, not the store");
    srv.stop().await;
}

#[tokio::test]
async fn a_local_directory_feeds_a_command_and_its_damage_is_caught() {
    let srv = TestServer::start().await;
    let work = tempfile::tempdir().unwrap();
    let text = numbered(300_000);
    let mut spill = cli(&srv, &srv.token, work.path());
    spill.env_remove("SPILLWAY_URL").args(["put", "--local", "spills"]).stdin(Stdio::piped());
    let mut child = spill.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let body = text.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        stdin.write_all(body.as_bytes()).await.unwrap();
    });
    let rec = json_of(&child.wait_with_output().await.unwrap());
    let d = rec["digest"].as_str().unwrap().to_owned();
    let mut wc = cli(&srv, &srv.token, work.path());
    wc.env_remove("SPILLWAY_URL").args(["exec", "--local", "spills", "--stdin", &d, "--", "wc", "-l"]);
    assert_eq!(json_of(&wc.output().await.unwrap())["stdout"]["result"].as_str().unwrap().trim(), "300000");
    // A forged digest is not in the directory: refused before the command runs.
    let mut forged = cli(&srv, &srv.token, work.path());
    let missing = format!("blake3:{}", "cd".repeat(32));
    forged.env_remove("SPILLWAY_URL").args(["exec", "--local", "spills", "--stdin", &missing, "--", "touch", "ran"]);
    let out = forged.output().await.unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not_found"));
    assert!(!work.path().join("ran").exists());
    // One byte changed on disk: the command is stopped before the end of its input, and the
    // answer is an error, not its count.
    let file = rec["file_path"].as_str().unwrap();
    let mut bytes = std::fs::read(file).unwrap();
    bytes[1_000_000] ^= 1;
    std::fs::write(file, &bytes).unwrap();
    let mut wc = cli(&srv, &srv.token, work.path());
    wc.env_remove("SPILLWAY_URL").args(["exec", "--local", "spills", "--stdin", &d, "--", "wc", "-l"]);
    let out = wc.output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&d) && out.stdout.is_empty(), "{err}");
    srv.stop().await;
}

#[tokio::test]
async fn a_stream_feeds_a_command_as_written_so_far() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions::default()).await.unwrap();
    // More than one window of the bytes route (4 MiB).
    let text = numbered(700_000);
    for (k, piece) in text.as_bytes().chunks(1 << 20).enumerate() {
        c.append(&s.id, (k << 20) as u64, Bytes::copy_from_slice(piece)).await.unwrap();
    }
    let work = tempfile::tempdir().unwrap();
    let mut wc = cli(&srv, &srv.token, work.path());
    wc.args(["exec", "--stdin", &s.id, "--", "sh", "-c", "wc -l; tail -1"]);
    let out = json_of(&wc.output().await.unwrap());
    assert_eq!(out["stdout"]["result"], "700000\n", "{out}");
    assert_eq!(c.stream_info(&s.id).await.unwrap().state, spillway_api::StreamState::Open, "still open");
    // The raw bytes route: windows, the size written so far, a clear refusal past it.
    let (data, size) = c.stream_bytes(&s.id, 10, Some(20)).await.unwrap();
    assert_eq!((&data[..], size), (&text.as_bytes()[10..30], text.len() as u64));
    let err = c.stream_bytes(&s.id, size + 1, None).await.unwrap_err();
    assert_eq!(api_code(&err), (416, "range_not_satisfiable".into()));
    let err = c.stream_bytes(&s.id, 0, Some(0)).await.unwrap_err();
    assert_eq!(api_code(&err), (400, "invalid_argument".into()));
    // Sealed, it is its blob, checked.
    c.seal(&s.id).await.unwrap();
    let mut tail = cli(&srv, &srv.token, work.path());
    tail.args(["exec", "--stdin", &s.id, "--", "tail", "-1"]);
    assert_eq!(json_of(&tail.output().await.unwrap())["stdout"]["result"], "line 700000\n");
    srv.stop().await;
}

#[tokio::test]
async fn the_last_lines_of_any_output() {
    let srv = TestServer::start().await;
    let c = srv.client();
    // A million lines: the last 10, and a tail too long for one page.
    let text = numbered(1_000_000);
    let rec = c.put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap();
    let p = c.read(rec.digest, ReadRequest::Tail { lines: 10 }).await.unwrap();
    assert_eq!((p.start_line, p.end_line, p.eof), (999_991, 1_000_000, true));
    assert_eq!(p.content, (999_991..=1_000_000).map(|i| format!("line {i}\n")).collect::<String>());
    let p = c.read(rec.digest, ReadRequest::Tail { lines: 1_000_000 }).await.unwrap();
    assert!(p.content.len() <= 100_000 && p.eof && p.end_line == 1_000_000, "{}", p.content.len());
    assert!(p.content.starts_with(&format!("line {}\n", p.start_line)));
    assert_eq!(p.offset + p.length, text.len() as u64);
    // Without a final newline, the last line still counts.
    let rec2 = c.put(Bytes::from_static(b"one\ntwo\nthree"), &UploadOptions::default()).await.unwrap();
    let p = c.read(rec2.digest, ReadRequest::Tail { lines: 2 }).await.unwrap();
    assert_eq!((p.start_line, p.content.as_str()), (2, "two\nthree"));
    // Compacted: the same answer from the chunks.
    let before = c.read(rec.digest, ReadRequest::Tail { lines: 3 }).await.unwrap();
    assert!(srv.compact().await.blobs_compacted >= 1, "the million lines are now chunks");
    assert_eq!(c.read(rec.digest, ReadRequest::Tail { lines: 3 }).await.unwrap(), before);
    // A live stream, as written so far.
    let s = c.create_stream(&UploadOptions::default()).await.unwrap();
    c.append(&s.id, 0, Bytes::from(numbered(5_000))).await.unwrap();
    let p = c.read_stream(&s.id, ReadRequest::Tail { lines: 2 }, None).await.unwrap();
    assert_eq!((p.start_line, p.content.as_str()), (4_999, "line 4999\nline 5000\n"));
    // Clear refusals.
    for q in ["tail_lines=0", "tail_lines=1000001", "tail_lines=5&line=3", "tail_lines=5&offset=0", "tail_lines=x"] {
        let resp = c.request(reqwest::Method::GET, &format!("/v1/blobs/{}/read?{q}", rec.digest)).send().await.unwrap();
        assert_eq!(resp.status(), 400, "{q}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_argument", "{q}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn references_in_arguments_become_the_outputs() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let log = c.put(Bytes::from(numbered(1_000)), &UploadOptions::default()).await.unwrap();
    let small = c.put(Bytes::from_static(b"small\n"), &UploadOptions::default()).await.unwrap();
    let reader = Reader::Store(c.clone());
    let receipt = json!({"result": "line 1\n…", "truncated": true, "total_size": 8_893, "total_lines": 1_000,
        "shown": [], "digest": log.digest.to_string(), "saved": true});
    let args = json!({
        "text": {"$spillway": small.digest.to_string()},
        "files": [{"name": "log", "body": receipt}, 3, "plain"],
        "whole": {"result": "all of it", "truncated": false, "total_size": 9, "total_lines": 1, "shown": []},
        "not_a_ref": {"$spillway": small.digest.to_string(), "other": 1},
    });
    let out = resolve(args.clone(), &reader, &ResolveOptions::default()).await.unwrap();
    assert_eq!(out["text"], "small\n");
    assert_eq!(out["files"][0]["body"], numbered(1_000));
    assert_eq!((&out["files"][1], &out["files"][2]), (&json!(3), &json!("plain")));
    assert_eq!(out["whole"], "all of it");
    assert_eq!(out["not_a_ref"], args["not_a_ref"], "an object with more keys is not a reference");
    // As a file, verified, named by its digest.
    let as_file = ResolveOptions { as_file: true, ..Default::default() };
    let path = resolve(json!({"$spillway": log.digest.to_string()}), &reader, &as_file).await.unwrap();
    assert_eq!(std::fs::read_to_string(path.as_str().unwrap()).unwrap(), numbered(1_000));
    // Over the limit: refused (from the length, before the body is read); missing: not_found.
    let tight = ResolveOptions { limit: 1_000, ..Default::default() };
    let err = resolve(json!([{"$spillway": log.digest.to_string()}]), &reader, &tight).await.unwrap_err();
    assert_eq!(api_code(&err), (413, "too_large".into()));
    let missing = json!({"$spillway": format!("blake3:{}", "ef".repeat(32))});
    let err = resolve(missing, &reader, &ResolveOptions::default()).await.unwrap_err();
    assert_eq!(api_code(&err), (404, "not_found".into()));
    // A redacted token gets no raw bytes: to the tool, the output is as missing.
    let redacted = Reader::Store(StoreClient::new(&srv.url, srv.redacted_token("ns-a", &[Scope::Read]).await));
    let err = resolve(json!({"$spillway": small.digest.to_string()}), &redacted, &ResolveOptions::default()).await;
    assert_eq!(api_code(&err.unwrap_err()), (404, "not_found".into()));
    // Another namespace's output is as missing.
    let other = Reader::Store(srv.client_for("other", ALL).await);
    let err = resolve(json!({"$spillway": small.digest.to_string()}), &other, &ResolveOptions::default()).await;
    assert_eq!(api_code(&err.unwrap_err()), (404, "not_found".into()));
    srv.stop().await;
}

//! The `spillway-server` binary itself: the embedded default start (first-start token, log
//! line), `token create` and `retention [--dry-run]`.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_spillway-server");

fn run(args: &[&str], data: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env_remove("SPILLWAY_DATABASE_URL")
        .env_remove("SPILLWAY_BLOB_STORE")
        .output()
        .unwrap()
}

/// A running `spillway-server` and the addresses it logged.
struct Server {
    child: std::process::Child,
    addr: String,
    /// The operator's metrics listener.
    metrics: String,
    log: Vec<String>,
    later: std::sync::mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary in `cwd` with `args` and nothing from the environment's SPILLWAY_*.
fn start(cwd: &std::path::Path, args: &[&str]) -> Server {
    // Tests run side by side: each server's metrics listener on a port of its own.
    start_with_metrics(cwd, args, Some("127.0.0.1:0"))
}

/// [`start`], with `SPILLWAY_METRICS_LISTEN` set to `metrics`, or unset.
fn start_with_metrics(cwd: &std::path::Path, args: &[&str], metrics: Option<&str>) -> Server {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("SPILLWAY_DATA_DIR")
        .env_remove("SPILLWAY_DATABASE_URL")
        .env_remove("SPILLWAY_BLOB_STORE")
        .env_remove("SPILLWAY_LISTEN")
        .env_remove("SPILLWAY_METRICS_LISTEN")
        .env_remove("RUST_LOG");
    if let Some(m) = metrics {
        cmd.env("SPILLWAY_METRICS_LISTEN", m);
    }
    let mut child = cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (mut log, mut addr) = (Vec::new(), None);
    // A generous bound that only guards a hang: start-up takes well under a second here.
    let start = Instant::now();
    let mut line = String::new();
    let mut metrics = None;
    while (addr.is_none() || metrics.is_none()) && start.elapsed() < Duration::from_secs(30) {
        line.clear();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(i) = line.find("metrics_addr=") {
            metrics = Some(line[i + 13..].split_whitespace().next().unwrap().to_owned());
        } else if let Some(i) = line.find("\"metrics_addr\":\"") {
            metrics = Some(line[i + 16..].split('"').next().unwrap().to_owned());
        } else if let Some(i) = line.find("addr=") {
            addr = Some(line[i + 5..].split_whitespace().next().unwrap().to_owned());
        } else if let Some(i) = line.find("\"addr\":\"") {
            addr = Some(line[i + 8..].split('"').next().unwrap().to_owned());
        }
        log.push(line.clone());
    }
    let addr = addr.unwrap_or_else(|| panic!("the server logs where it listens; it said: {log:?}"));
    let metrics = metrics.unwrap_or_else(|| panic!("the server logs where its metrics listen; it said: {log:?}"));
    // Keep reading the log so the server never blocks on a full pipe; tests look at it later.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Server { child, addr, metrics, log, later: rx }
}

impl Server {
    /// Log lines written since start-up, waiting until one satisfies `until` (bounded).
    fn log_until(&self, until: impl Fn(&str) -> bool) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(line) = self.later.recv_timeout(Duration::from_secs(10)) {
            let done = until(&line);
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    }
}

/// Plain HTTP/1.1 by hand, so the test depends on no client of ours.
fn ask(addr: &str, req: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn get_refs(addr: &str, token: &str) -> String {
    ask(
        addr,
        &format!("GET /v1/refs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"),
    )
}

#[test]
fn default_start_writes_a_token_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("spillway-data");
    let server = start(dir.path(), &["--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()]);
    let token_path = data.join("token");
    assert!(
        server.log.iter().any(|l| l.contains("token") && l.contains(token_path.to_str().unwrap())),
        "the first start says where the token is: {:?}",
        server.log
    );
    let meta = std::fs::metadata(&token_path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&token_path).unwrap();
    let health = ask(&server.addr, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let refs = get_refs(&server.addr, token.trim());
    assert!(refs.starts_with("HTTP/1.1 200"), "{refs}");
    assert!(get_refs(&server.addr, "spw_not-a-token").starts_with("HTTP/1.1 401"));
    drop(server);
    assert!(data.join("spillway.db").exists() && data.join("blobs").is_dir());
}

/// The README's first command, literally: no flags but where to listen, in an empty directory.
#[test]
fn no_flags_in_an_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--listen", "127.0.0.1:0"]);
    let data = dir.path().join("spillway-data");
    let token = std::fs::read_to_string(data.join("token")).expect("./spillway-data/token");
    let refs = get_refs(&server.addr, token.trim());
    assert!(refs.starts_with("HTTP/1.1 200"), "{refs}");
    drop(server);
    assert!(data.join("spillway.db").exists() && data.join("blobs").is_dir());
    let stray: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(stray, vec![std::ffi::OsString::from("spillway-data")], "nothing outside the data directory");
    // The subcommands find the same default from the same directory.
    for args in [&["token", "create", "--namespace", "ci", "--scope", "read"][..], &["retention", "--dry-run"][..]] {
        let out =
            Command::new(BIN).args(args).current_dir(dir.path()).env_remove("SPILLWAY_DATA_DIR").output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `token create --redacted` makes a token `token list` shows as redacted, which is refused raw
/// bytes and reads marks.
#[test]
fn redacted_tokens_are_listed_and_read_marks_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = data.to_str().unwrap();
    let server = start(dir.path(), &["--listen", "127.0.0.1:0", "--data-dir", d]);
    let out = run(&["token", "create", "--namespace", "default", "--scope", "read", "--redacted"], &data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let agent = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let list = String::from_utf8(run(&["token", "list"], &data).stdout).unwrap();
    let rows: Vec<serde_json::Value> = list.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.iter().map(|r| r["redacted"].as_bool().unwrap()).collect::<Vec<_>>(), [false, true], "{list}");
    let sre = std::fs::read_to_string(data.join("token")).unwrap();
    let body = b"export GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789\n";
    let (code, rec) = send(&server.addr, "POST", "/v1/blobs", sre.trim(), body);
    assert_eq!(code, 201, "{rec}");
    let digest = rec.split("\"digest\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let (code, body) = send(&server.addr, "GET", &format!("/v1/blobs/{digest}"), &agent, b"");
    assert!(code == 403 && body.contains("redacted text only"), "{code} {body}");
    let (code, body) = send(&server.addr, "GET", &format!("/v1/blobs/{digest}/read"), &agent, b"");
    assert!(code == 200 && body.contains("[REDACTED:github_token]") && !body.contains("ghp_"), "{code} {body}");
}

/// `compact` (beside a running server) and `stats` print their JSON: what the pass did, and
/// stored against logical bytes before and after.
#[test]
fn compact_and_stats_print_what_they_did() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = data.to_str().unwrap();
    let server = start(dir.path(), &["--listen", "127.0.0.1:0", "--data-dir", d]);
    let token = std::fs::read_to_string(data.join("token")).unwrap();
    let log: String = (0..50_000).map(|i| format!("2026-12-02 build step {i}: ok\n")).collect();
    let (code, _) = send(&server.addr, "POST", "/v1/blobs", token.trim(), log.as_bytes());
    assert_eq!(code, 201);
    let json = |args: &[&str]| -> serde_json::Value {
        let out = run(args, &data);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let before = json(&["stats"]);
    assert_eq!(before["stored_bytes"], before["logical_bytes"]);
    assert_eq!((before["logical_bytes"].as_u64(), before["blobs"].as_u64()), (Some(log.len() as u64), Some(1)));
    assert_eq!(json(&["compact", "--older-than", "3600"])["blobs_compacted"], 0, "nothing is that old");
    let pass = json(&["compact"]);
    assert_eq!((pass["blobs_compacted"].as_u64(), pass["bytes_before"].as_u64()), (Some(1), Some(log.len() as u64)));
    let after = json(&["stats"]);
    assert_eq!(after["stored_bytes"], pass["bytes_after"]);
    assert!(after["stored_bytes"].as_u64().unwrap() * 10 < log.len() as u64, "{after}");
    // The running server reads it from its chunks.
    let digest = format!("blake3:{}", blake3_hex(log.as_bytes()));
    let (code, body) =
        send(&server.addr, "GET", &format!("/v1/blobs/{digest}/read?line=40000&lines=1"), token.trim(), b"");
    assert!(code == 200 && body.contains("build step 39999: ok"), "{code} {body}");
}

fn blake3_hex(data: &[u8]) -> String {
    spillway_api::Digest::of(data).hex()
}

/// A request with a body, by hand; answers the status line's code and the body.
fn send(addr: &str, method: &str, path: &str, token: &str, body: &[u8]) -> (u16, String) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let out = ask(addr, &(head + &String::from_utf8_lossy(body)));
    let code = out[9..12].parse().unwrap();
    (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

/// The value of one series of the Prometheus text, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

fn summary(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

/// `token create` makes a token the server takes; the server counts what it served in
/// /metrics (this process's own counters: exact values); `retention --dry-run` reports what a
/// pass would collect and changes nothing, and the pass itself then collects exactly that.
#[test]
fn tokens_metrics_and_retention_of_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let out = run(&["token", "create", "--namespace", "team-a", "--scope", "read", "--scope", "write"], &data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line, nothing else");
    let token = stdout.trim().to_owned();
    let bad = run(&["token", "create", "--namespace", "team-a", "--scope", "root"], &data);
    assert!(!bad.status.success());

    let server = start(dir.path(), &["--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()]);
    let before = ask(&server.metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    // Tenants never reach the metrics: on the API listener the route does not exist.
    let on_api = ask(&server.addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(on_api.starts_with("HTTP/1.1 404") && on_api.contains("not_found"), "{on_api}");
    let short = vec![b's'; 40_000];
    let long = vec![b'l'; 30_000];
    assert_eq!(send(&server.addr, "POST", "/v1/blobs?ttl=1", &token, &short).0, 201, "the created token writes");
    assert_eq!(send(&server.addr, "POST", "/v1/blobs?ttl=1", &token, &short).0, 200);
    let (code, body) = send(&server.addr, "POST", "/v1/blobs?ttl=3600", &token, &long);
    assert_eq!(code, 201);
    let long_digest = serde_json::from_str::<serde_json::Value>(&body).unwrap()["digest"].as_str().unwrap().to_owned();
    let (code, page) = send(&server.addr, "GET", &format!("/v1/blobs/{long_digest}/read?limit=100"), &token, b"");
    assert_eq!((code, page.contains(&"l".repeat(100))), (200, true));
    let after = ask(&server.metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let delta = |series: &str| metric(&after, series) - metric(&before, series);
    let posts = |status: u16| {
        format!("spillway_http_requests_total{{method=\"POST\",route=\"/v1/blobs\",status=\"{status}\"}}")
    };
    assert_eq!((delta(&posts(201)), delta(&posts(200))), (2.0, 1.0), "{after}");
    assert_eq!(delta("spillway_bytes_in_total"), 110_000.0, "every upload's bytes, deduplicated or not");
    assert_eq!(delta("spillway_dedup_hits_total"), 1.0);
    assert_eq!(delta("spillway_bytes_out_total"), 100.0);
    assert_eq!(delta("spillway_read_capped_total"), 0.0);
    drop(server);

    // The short references expire a second later (the binary runs on the wall clock).
    let start = Instant::now();
    let dry = loop {
        let v = summary(&run(&["retention", "--dry-run", "--retention-grace", "0"], &data));
        if v["references_expired"] == 2 || start.elapsed() > Duration::from_secs(15) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(100)); // waiting for the wall clock itself
    };
    assert_eq!(dry["dry_run"], true);
    assert_eq!((dry["references_expired"].as_u64(), dry["blobs_deleted"].as_u64()), (Some(2), Some(1)), "{dry}");
    assert_eq!(dry["bytes_freed"], 40_000);
    let blob_files = || {
        let mut n = 0;
        for d in std::fs::read_dir(data.join("blobs/blobs")).unwrap().flatten() {
            n += std::fs::read_dir(d.path()).unwrap().count();
        }
        n
    };
    assert_eq!(blob_files(), 2, "a dry run deletes nothing");
    assert_eq!(summary(&run(&["retention", "--dry-run", "--retention-grace", "0"], &data))["references_expired"], 2);
    let pass = summary(&run(&["retention", "--retention-grace", "0"], &data));
    assert_eq!(pass["dry_run"], false);
    assert_eq!(
        (pass["references_expired"].clone(), pass["blobs_deleted"].clone(), pass["bytes_freed"].clone()),
        (serde_json::json!(2), serde_json::json!(1), serde_json::json!(40_000)),
        "{pass}"
    );
    assert_eq!(blob_files(), 1, "the long-lived blob stays");
    let again = summary(&run(&["retention", "--retention-grace", "0"], &data));
    assert_eq!((again["references_expired"].as_u64(), again["blobs_deleted"].as_u64()), (Some(0), Some(0)));
}

fn list_tokens(data: &std::path::Path) -> Vec<serde_json::Value> {
    let out = run(&["token", "list"], data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn tokens_are_listed_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let out = run(&["token", "create", "--namespace", "team-a", "--scope", "read"], &data);
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let listed = list_tokens(&data);
    assert_eq!(listed.len(), 1);
    let t = &listed[0];
    assert_eq!(t["namespace"], "team-a");
    assert_eq!(t["scopes"], serde_json::json!(["read"]));
    assert!(t["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(t["last_used_at"].is_null(), "never used yet");
    let id = t["id"].as_str().unwrap().to_owned();
    let listing = serde_json::to_string(&listed).unwrap();
    assert!(!listing.contains(&token) && !listing.contains(&token[4..20]), "the token is never shown");
    // A running server accepts it, records its use, and refuses it once revoked.
    let server =
        start(dir.path(), &["--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap(), "--token-cache-ttl", "1"]);
    assert!(get_refs(&server.addr, &token).starts_with("HTTP/1.1 200"));
    let used = (0..100).find_map(|_| {
        let t = list_tokens(&data).pop().unwrap();
        (!t["last_used_at"].is_null()).then_some(t).or_else(|| {
            std::thread::sleep(Duration::from_millis(50)); // polling a record written asynchronously
            None
        })
    });
    assert!(used.is_some(), "last_used_at is recorded");
    let out = run(&["token", "revoke", &id], &data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(list_tokens(&data).is_empty());
    // Refused within the cache period (1 s here, 30 s by default); polled, not slept through.
    let start = Instant::now();
    while !get_refs(&server.addr, &token).starts_with("HTTP/1.1 401") {
        assert!(start.elapsed() < Duration::from_secs(15), "the revoked token is still accepted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let again = run(&["token", "revoke", &id], &data);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("no token has id"));
}

#[test]
fn one_log_line_per_request_without_colour_or_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--listen", "127.0.0.1:0"]);
    let token = std::fs::read_to_string(dir.path().join("spillway-data/token")).unwrap();
    assert!(get_refs(&server.addr, token.trim()).starts_with("HTTP/1.1 200"));
    assert!(get_refs(&server.addr, "spw_wrong").starts_with("HTTP/1.1 401"));
    let lines = server.log_until(|l| l.contains("status=401"));
    let requests: Vec<&String> = lines.iter().filter(|l| l.contains("request")).collect();
    assert_eq!(requests.len(), 2, "{lines:?}");
    assert!(requests[0].contains("method=GET") && requests[0].contains("route=/v1/refs"));
    assert!(requests[0].contains("status=200") && requests[0].contains("namespace=\"default\""), "{}", requests[0]);
    assert!(requests[0].contains("ms=") && requests[0].contains("bytes="), "{}", requests[0]);
    assert!(requests[1].contains("status=401") && requests[1].contains("namespace=\"-\""), "{}", requests[1]);
    for l in lines.iter().chain(&server.log) {
        assert!(!l.contains('\u{1b}'), "no colour codes off a terminal: {l:?}");
        assert!(!l.contains(token.trim()) && !l.contains("spw_wrong"), "never a token: {l}");
    }
    drop(server);
    // JSON lines for log shippers.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--listen", "127.0.0.1:0", "--log-format", "json"]);
    assert!(get_refs(&server.addr, "spw_wrong").starts_with("HTTP/1.1 401"));
    let lines = server.log_until(|l| l.contains("401"));
    let line = lines.iter().find(|l| l.contains("\"request\"")).expect("a request line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["fields"]["status"], 401);
    assert_eq!(v["fields"]["route"], "/v1/refs");
    assert_eq!(v["level"], "INFO");
}

/// Processes that open one fresh data directory at once (the server's first start, an
/// operator's `token create` beside it) take turns at the schema: each finds it whole, none
/// fails applying a migration the other applied.
#[test]
fn processes_opening_a_fresh_directory_at_once_all_start() {
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let children: Vec<_> = (0..6)
            .map(|i| {
                Command::new(BIN)
                    .args(["token", "create", "--namespace", &format!("ns{i}"), "--scope", "read"])
                    .arg("--data-dir")
                    .arg(&data)
                    .env_remove("SPILLWAY_DATABASE_URL")
                    .env_remove("SPILLWAY_BLOB_STORE")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let list = String::from_utf8(run(&["token", "list"], &data).stdout).unwrap();
        assert_eq!(list.lines().count(), 6, "round {round}: every token made it: {list}");
    }
}

/// On SIGTERM both listeners close at once, the metrics one too, while a request in flight
/// (a long-poll) still finishes: a server started right after on the same ports is not refused
/// for the time the old one drains.
#[test]
fn sigterm_frees_both_ports_while_requests_drain() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(dir.path(), &["--listen", "127.0.0.1:0", "--data-dir", data.to_str().unwrap()]);
    let token = std::fs::read_to_string(data.join("token")).unwrap();
    let token = token.trim().to_owned();
    let (code, body) = send(&server.addr, "POST", "/v1/streams", &token, b"");
    assert_eq!(code, 201, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"].as_str().unwrap().to_owned();
    let (addr, poll_token) = (server.addr.clone(), token.clone());
    let poll = std::thread::spawn(move || {
        send(&addr, "GET", &format!("/v1/streams/{id}/read?offset=0&wait_ms=5000"), &poll_token, b"")
    });
    std::thread::sleep(Duration::from_millis(500)); // the long-poll is waiting
                                                    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let free = |addr: &str| std::net::TcpListener::bind(addr).is_ok();
    while !(free(&server.addr) && free(&server.metrics)) && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        free(&server.addr) && free(&server.metrics),
        "both ports free within 3 s of SIGTERM, the long-poll still waiting"
    );
    let (code, body) = poll.join().unwrap();
    assert_eq!(code, 200, "the request in flight finished: {body}");
}

#[test]
fn a_taken_default_metrics_port_moves_the_metrics_not_the_start() {
    // Another process holds the default metrics address (if something else on this machine
    // holds it already, that is the same case).
    let _held = std::net::TcpListener::bind("127.0.0.1:7746");
    assert!(std::net::TcpListener::bind("127.0.0.1:7746").is_err(), "7746 is taken for the test");
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_metrics(dir.path(), &["--listen", "127.0.0.1:0"], None);
    assert!(
        server.log.iter().any(|l| l.contains("WARN") && l.contains("127.0.0.1:7746")),
        "a warning names the taken address: {:?}",
        server.log
    );
    assert_ne!(server.metrics, "127.0.0.1:7746");
    let healthz = ask(&server.addr, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    let metrics = ask(&server.metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(metrics.starts_with("HTTP/1.1 200"), "the metrics answer on the port logged: {metrics}");
    assert!(dir.path().join("spillway-data/token").exists());

    // An address asked for is never swapped: the start fails and says why.
    let other = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:7746", "--data-dir"])
        .arg(other.path())
        .env_remove("SPILLWAY_DATABASE_URL")
        .env_remove("SPILLWAY_BLOB_STORE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen for metrics on 127.0.0.1:7746"), "{err}");
}

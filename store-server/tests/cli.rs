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

#[test]
fn default_start_writes_a_token_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("spillway-data");
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let (mut said_token, mut addr) = (false, None);
    let start = Instant::now();
    let mut line = String::new();
    while addr.is_none() && start.elapsed() < Duration::from_secs(30) {
        line.clear();
        if log.read_line(&mut line).unwrap() == 0 {
            break;
        }
        said_token |= line.contains("token") && line.contains(data.join("token").to_str().unwrap());
        if let Some(i) = line.find("addr=") {
            addr = Some(line[i + 5..].split_whitespace().next().unwrap().to_owned());
        }
    }
    let addr = addr.expect("the server logs where it listens");
    assert!(said_token, "the first start says where the token is");
    let meta = std::fs::metadata(data.join("token")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(data.join("token")).unwrap();
    // Plain HTTP/1.1 by hand: the server answers /healthz and authenticates the token.
    use std::io::{Read, Write};
    let ask = |req: String| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(ask("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into()).starts_with("HTTP/1.1 200"));
    let refs = ask(format!(
        "GET /v1/refs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        token.trim()
    ));
    assert!(refs.starts_with("HTTP/1.1 200"), "{refs}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(data.join("spillway.db").exists() && data.join("blobs").is_dir());
}

#[test]
fn token_create_and_retention_commands() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let out = run(&["token", "create", "--namespace", "team-a", "--scope", "read", "--scope", "write"], &data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line, nothing else");
    assert!(stdout.starts_with("spw_") && stdout.trim().len() > 40);
    let bad = run(&["token", "create", "--namespace", "team-a", "--scope", "root"], &data);
    assert!(!bad.status.success());
    for args in [&["retention", "--dry-run"][..], &["retention", "--retention-grace", "0"][..]] {
        let out = run(args, &data);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(stdout.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        for field in ["references_expired", "blobs_deleted", "bytes_freed"] {
            assert!(v[field].is_u64(), "{field} in {stdout}");
        }
    }
}

//! `spillway mcp` spoken to over stdio by rmcp's client, against the real server: the tools
//! and their schemas, `run` → `read` → `grep` on a saved output, errors as `isError`
//! results, background tasks followed to their end, and a store that is down.

use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use spillway_server::testing::TestServer;

use super::BIN;

type Client = RunningService<RoleClient, ()>;

async fn connect(url: &str, token: &str, cwd: &std::path::Path) -> Client {
    let cmd = tokio::process::Command::new(BIN).configure(|c| {
        c.arg("mcp").current_dir(cwd).env("SPILLWAY_URL", url).env("SPILLWAY_TOKEN", token);
    });
    ().serve(TokioChildProcess::new(cmd).unwrap()).await.expect("MCP handshake")
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().unwrap().clone();
    client.call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args)).await.expect("a tool result")
}

fn text(r: &CallToolResult) -> String {
    r.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect()
}

/// A successful result's text — sent once: no structured copy beside it (api.md v1.3) — and,
/// when the text is JSON (`run`), its value.
fn ok(r: &CallToolResult) -> (String, Value) {
    assert_eq!(r.is_error, Some(false), "{}", text(r));
    assert!(r.structured_content.is_none() && r.content.len() == 1, "the text once: {r:?}");
    let t = text(r);
    let v = serde_json::from_str(&t).unwrap_or(Value::Null);
    (t, v)
}

/// The stream id a `background` answer names.
fn stream_of(answer: &str) -> String {
    let id = answer.split("as stream ").nth(1).and_then(|r| r.split_whitespace().next()).expect("a stream id");
    assert_eq!(id.len(), 32, "{answer}");
    id.to_owned()
}

/// A `tail` answer: what the task wrote, and the offset to go on from (None once it ended).
fn tail_of(answer: &str) -> (String, Option<u64>) {
    let (content, status) = answer.rsplit_once('[').expect("a status line");
    let next = status.split("tail offset=").nth(1).and_then(|r| r.trim_end_matches(']').parse().ok());
    (content.to_owned(), next)
}

fn failed(r: &CallToolResult) -> String {
    assert_eq!(r.is_error, Some(true), "expected an error result: {}", text(r));
    text(r)
}

#[tokio::test]
async fn mcp_tools_over_stdio() {
    let srv = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = connect(&srv.url, &srv.token, dir.path()).await;

    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["run", "read", "grep", "search", "background", "tail"]);
    for t in &tools {
        let desc = t.description.as_deref().unwrap_or_default();
        assert!(desc.len() > 100, "{} is described for a model", t.name);
        assert_eq!(t.input_schema["type"], "object");
    }
    let run = tools.iter().find(|t| t.name == "run").unwrap();
    assert_eq!(run.input_schema["required"], json!(["command"]));
    assert!(run.input_schema["properties"]["timeout_s"].is_object());
    assert!(run.description.as_deref().unwrap().contains("100,000 bytes"));

    // run: 300,000 lines give a receipt; read pages it at line 150,000.
    let r = call(&client, "run", json!({"command": "seq 1 300000; echo boom >&2; exit 2"})).await;
    let (_, v) = ok(&r);
    assert_eq!(v["exit_code"], 2);
    assert_eq!(v["stderr"]["result"], "boom\n");
    let receipt = &v["stdout"];
    assert_eq!((receipt["truncated"].as_bool(), receipt["saved"].as_bool()), (Some(true), Some(true)));
    assert!(receipt["hint"].as_str().unwrap().contains("read tool"), "hints name the MCP tools");
    let digest = receipt["digest"].as_str().unwrap().to_owned();
    let r = call(&client, "read", json!({"digest": digest, "line": 150_000, "lines": 3})).await;
    let (page, _) = ok(&r);
    assert_eq!(
        page,
        "150000\t150000\n150001\t150001\n150002\t150002\n[lines 150000-150002 of 300,000; continue with line=150003]"
    );
    // A full page stays under 100,000 bytes, numbers included.
    let r = call(&client, "read", json!({"digest": digest, "line": 1})).await;
    let (page, _) = ok(&r);
    let body = page.rsplit_once('\n').unwrap().0;
    assert!(body.len() <= 100_000);
    assert!(page.ends_with("continue with line=2001]"), "{}", &page[page.len() - 80..]);

    // grep: numbered rows and where to resume.
    let r = call(&client, "grep", json!({"digest": digest, "pattern": "^29999[0-9]$", "max_matches": 3})).await;
    let (rows, _) = ok(&r);
    assert_eq!(rows, "299990: 299990\n299991: 299991\n299992: 299992\n[3 matches shown; resume with from_line=299993]");

    // Errors are results, plainly worded.
    let msg = failed(&call(&client, "read", json!({"digest": "blake3:XYZ"})).await);
    assert!(msg.contains("invalid digest"), "{msg}");
    let missing = format!("blake3:{}", "0".repeat(64));
    let msg = failed(&call(&client, "read", json!({"digest": missing})).await);
    assert!(msg.contains("not_found"), "{msg}");
    let msg = failed(&call(&client, "grep", json!({"digest": digest, "pattern": "a".repeat(5000)})).await);
    assert!(msg.contains("pattern must be 1 to 4096 bytes"), "{msg}");
    let msg = failed(&call(&client, "read", json!({"digest": digest, "lines": "many"})).await);
    assert!(msg.contains("invalid arguments"), "{msg}");

    // background + tail follow a task to its end.
    let r = call(&client, "background", json!({"command": "for i in 1 2 3; do echo tick $i; done; exit 4"})).await;
    let stream = stream_of(&ok(&r).0);
    let mut offset = 0u64;
    let mut seen = String::new();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let r = call(&client, "tail", json!({"stream": stream, "offset": offset, "wait_ms": 2000})).await;
            let (t, _) = ok(&r);
            let (content, next) = tail_of(&t);
            seen.push_str(&content);
            match next {
                Some(n) => offset = n,
                None => return t,
            }
        }
    })
    .await
    .expect("the task ends");
    assert_eq!(seen, "tick 1\ntick 2\ntick 3\n");
    assert!(ended.contains("exited with code 4"), "{ended}");
    let r = call(&client, "read", json!({"digest": stream})).await;
    assert!(ok(&r).0.starts_with("     1\ttick 1\n"));

    client.cancel().await.unwrap();
    srv.stop().await;
}

#[tokio::test]
async fn mcp_run_answers_within_the_three_second_rule_when_the_store_is_down() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let client = connect(&url, "t", dir.path()).await;
    let start = Instant::now();
    let r = call(&client, "run", json!({"command": "seq 1 100000"})).await;
    // Generous bound: the rule is 3 s; this guards a hang, not speed.
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    let (_, v) = ok(&r);
    assert_eq!(v["stdout"]["saved"], false);
    assert_eq!(v["stdout"]["save_error"]["cause"], "connection_refused");
    let msg = failed(&call(&client, "read", json!({"digest": format!("blake3:{}", "1".repeat(64))})).await);
    assert!(msg.contains("connection refused"), "{msg}");
    client.cancel().await.unwrap();
}

/// `spillway mcp` always redacts: its receipts, and every read, grep and tail, whatever the
/// token may read.
#[tokio::test]
async fn mcp_shows_secrets_as_marks_only() {
    let srv = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = connect(&srv.url, &srv.token, dir.path()).await;
    let secret = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
    let cmd = format!("seq 1 30000; echo GITHUB_TOKEN={secret}");
    let (text, v) = ok(&call(&client, "run", json!({ "command": cmd })).await);
    assert!(!text.contains(secret) && text.contains("[REDACTED:github_token]"), "{text}");
    assert_eq!(v["stdout"]["redactions"], 1);
    let digest = v["stdout"]["digest"].as_str().unwrap().to_owned();
    let (text, _) = ok(&call(&client, "read", json!({ "digest": digest, "line": 30001 })).await);
    assert!(text.contains("GITHUB_TOKEN=[REDACTED:github_token]") && !text.contains(secret), "{text}");
    let (text, _) = ok(&call(&client, "grep", json!({ "digest": digest, "pattern": "ghp_" })).await);
    assert!(!text.contains(secret) && !text.contains("30001:"), "a probe finds nothing: {text}");
    let (text, _) = ok(&call(&client, "grep", json!({ "digest": digest, "pattern": "GITHUB" })).await);
    assert!(text.contains("30001: GITHUB_TOKEN=[REDACTED:github_token]"), "{text}");
    let (text, _) = ok(&call(&client, "search", json!({ "pattern": "GITHUB", "labels": {"stream": "stdout"} })).await);
    assert!(text.contains(&format!("{digest}:30001: GITHUB_TOKEN=[REDACTED:github_token]")), "{text}");
    assert!(text.contains(&format!("{digest} (")) && text.contains("stream=stdout"), "a heading per output: {text}");
    let (text, _) = ok(&call(&client, "search", json!({ "pattern": "ghp_" })).await);
    assert!(text.contains("[no matches in any output]"), "a probe finds nothing: {text}");
    let (started, _) = ok(&call(&client, "background", json!({ "command": format!("echo token={secret}") })).await);
    let stream = stream_of(&started);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (text, _) = ok(&call(&client, "tail", json!({ "stream": stream, "wait_ms": 1000 })).await);
        assert!(!text.contains(secret), "{text}");
        if text.contains("token=[REDACTED:github_token]") {
            break;
        }
        assert!(Instant::now() < deadline, "the task's line never came: {text}");
    }
    client.cancel().await.unwrap();
    srv.stop().await;
}

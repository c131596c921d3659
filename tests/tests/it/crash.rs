//! A server killed with SIGKILL in the middle of an upload: afterwards nothing partial is
//! visible, leftovers are cleaned at start-up, acknowledged blobs survive, and the upload can
//! be repeated. The server runs in a child process: this test binary started again in
//! `child_server` mode.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use spillway_api::Digest;
use spillway_client::{StoreClient, UploadOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::files_under;

/// Not a test of its own: the server process of `killed_mid_upload_leaves_nothing_partial`.
#[test]
#[ignore = "run as a child process by killed_mid_upload_leaves_nothing_partial"]
fn child_server() {
    let Ok(dir) = std::env::var("SPILLWAY_CHILD_DATA") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let config = spillway_server::Config::new(dir);
        let clock = std::sync::Arc::new(spillway_server::clock::SystemClock);
        let state = spillway_server::build_state(config, clock).await.unwrap();
        spillway_server::ensure_first_token(&state).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("LISTENING {}", listener.local_addr().unwrap());
        spillway_server::serve(listener, state, std::future::pending()).await.unwrap();
    });
}

async fn spawn_server(data: &Path) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "crash::child_server", "--nocapture", "--test-threads=1"])
        .env("SPILLWAY_CHILD_DATA", data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            // The harness prints the test's name on the same line first.
            if let Some((_, a)) = l.split_once("LISTENING ") {
                return a.trim().to_owned();
            }
        }
        panic!("child server exited before listening");
    })
    .await
    .unwrap();
    (child, format!("http://{addr}"))
}

#[tokio::test]
async fn killed_mid_upload_leaves_nothing_partial() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (mut child, url) = spawn_server(&data_dir).await;
    let token = std::fs::read_to_string(data_dir.join("token")).unwrap().trim().to_owned();
    let c = StoreClient::new(&url, &token);
    let kept = c.put(Bytes::from_static(b"acknowledged before the crash\n"), &UploadOptions::default()).await.unwrap();

    let chunk = Bytes::from(vec![b'z'; 1 << 20]);
    let whole: Vec<u8> = std::iter::repeat_n(chunk.clone(), 16).flat_map(|b| b.to_vec()).collect();
    let digest = Digest::of(&whole);
    let slow = futures::stream::unfold(0, move |i| {
        let chunk = chunk.clone();
        async move {
            if i == 16 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Some((Ok::<_, std::io::Error>(chunk), i + 1))
        }
    });
    let uploader = c.clone();
    let upload = tokio::spawn(async move {
        uploader
            .request(reqwest::Method::PUT, &format!("/v1/blobs/{digest}"))
            .body(reqwest::Body::wrap_stream(slow))
            .send()
            .await
    });
    let tmp = data_dir.join("blobs/tmp");
    tokio::time::timeout(Duration::from_secs(30), async {
        while !files_under(&tmp).iter().any(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0) >= 2 << 20) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the upload reaches the temporary file");
    child.kill().await.unwrap();
    assert!(upload.await.unwrap().is_err(), "the upload was cut off");
    assert!(!files_under(&tmp).is_empty(), "a partial temporary file was left by the crash");

    let (_child2, url2) = spawn_server(&data_dir).await;
    let c2 = StoreClient::new(&url2, &token);
    assert!(files_under(&tmp).is_empty(), "start-up cleans leftovers");
    assert_eq!(c2.head(&digest.to_string()).await.unwrap(), None, "nothing partial is visible");
    let got = c2.get(&kept.digest.to_string()).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, "acknowledged before the crash\n");
    let rec = c2.put(Bytes::from(whole.clone()), &UploadOptions::default()).await.unwrap();
    assert_eq!(rec.digest, digest);
    assert_eq!(c2.get(&digest.to_string()).await.unwrap().bytes().await.unwrap(), whole);
}

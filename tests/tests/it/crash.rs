//! A server killed with SIGKILL in the middle of an upload: afterwards nothing partial is
//! visible, leftovers are cleaned at start-up, acknowledged blobs survive, and the upload can
//! be repeated. The server runs in a child process: this test binary started again in
//! `child_server` mode.

use std::time::Duration;

use bytes::Bytes;
use spillway_api::Digest;
use spillway_client::{StoreClient, UploadOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::files_under;

/// Not a test of its own: the server process of `killed_mid_upload_leaves_nothing_partial`,
/// on the backend the parent names (its S3 settings as `key=value` lines).
#[test]
#[ignore = "run as a child process by killed_mid_upload_leaves_nothing_partial"]
fn child_server() {
    let Ok(dir) = std::env::var("SPILLWAY_CHILD_DATA") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut config = spillway_server::Config::new(dir);
        config.database_url = std::env::var("SPILLWAY_CHILD_DATABASE_URL").ok();
        config.blob_store = std::env::var("SPILLWAY_CHILD_BLOB_STORE").ok();
        config.s3_options = std::env::var("SPILLWAY_CHILD_S3")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let clock = std::sync::Arc::new(spillway_server::clock::SystemClock);
        let state = spillway_server::build_state(config, clock).await.unwrap();
        spillway_server::ensure_first_token(&state).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("LISTENING {}", listener.local_addr().unwrap());
        spillway_server::serve(listener, state, std::future::pending()).await.unwrap();
    });
}

async fn spawn_server(config: &spillway_server::Config) -> (Child, String) {
    let s3: String = config.s3_options.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", "crash::child_server", "--nocapture", "--test-threads=1"])
        .env("SPILLWAY_CHILD_DATA", &config.data_dir)
        .env("SPILLWAY_CHILD_S3", s3)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(url) = &config.database_url {
        cmd.env("SPILLWAY_CHILD_DATABASE_URL", url);
    }
    if let Some(url) = &config.blob_store {
        cmd.env("SPILLWAY_CHILD_BLOB_STORE", url);
    }
    let mut child = cmd.spawn().unwrap();
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

/// On both backends: the server dies with some of the 4 MiB sent of a 16 MiB upload received. Nothing of it is
/// visible afterwards, nothing of it is published, what was acknowledged before survives, and
/// the same upload then succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_upload_leaves_nothing_partial() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = spillway_server::testing::backend_config(&data_dir).await;
    let (mut child, url) = spawn_server(&config).await;
    let token = std::fs::read_to_string(data_dir.join("token")).unwrap().trim().to_owned();
    let c = StoreClient::new(&url, &token);
    let kept = c.put(Bytes::from_static(b"acknowledged before the crash\n"), &UploadOptions::default()).await.unwrap();
    let kept_big = Bytes::from("acknowledged, and stored as an object\n".repeat(10_000));
    c.put(kept_big.clone(), &UploadOptions::default()).await.unwrap();

    let chunk = Bytes::from(vec![b'z'; 1 << 20]);
    let whole: Vec<u8> = std::iter::repeat_n(chunk.clone(), 16).flat_map(|b| b.to_vec()).collect();
    let digest = Digest::of(&whole);
    // The body waits after its fourth chunk until the server has been killed.
    let sent = std::sync::Arc::new(tokio::sync::Notify::new());
    let killed = std::sync::Arc::new(tokio::sync::Notify::new());
    let (sent_tx, killed_rx) = (sent.clone(), killed.clone());
    let body = futures::stream::unfold(0, move |i| {
        let (chunk, sent_tx, killed_rx) = (chunk.clone(), sent_tx.clone(), killed_rx.clone());
        async move {
            match i {
                16 => None,
                4 => {
                    sent_tx.notify_one();
                    killed_rx.notified().await;
                    Some((Ok::<_, std::io::Error>(chunk), i + 1))
                }
                _ => Some((Ok(chunk), i + 1)),
            }
        }
    });
    let uploader = c.clone();
    let upload = tokio::spawn(async move {
        uploader
            .request(reqwest::Method::PUT, &format!("/v1/blobs/{digest}"))
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
    });
    sent.notified().await;
    let tmp = data_dir.join("blobs/tmp");
    if config.blob_store.is_none() {
        // On disk, wait until the staged file holds what was sent.
        tokio::time::timeout(Duration::from_secs(30), async {
            while !files_under(&tmp).iter().any(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0) >= 2 << 20) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the upload reaches the temporary file");
    }
    child.kill().await.unwrap();
    child.wait().await.unwrap();
    killed.notify_one();
    assert!(upload.await.unwrap().is_err(), "the upload was cut off");
    if config.blob_store.is_none() {
        assert!(!files_under(&tmp).is_empty(), "a partial temporary file was left by the crash");
    }

    let (_child2, url2) = spawn_server(&config).await;
    let c2 = StoreClient::new(&url2, &token);
    if config.blob_store.is_none() {
        let staged: Vec<_> =
            files_under(&tmp).into_iter().filter(|p| p.extension().is_none_or(|e| e != "lock")).collect();
        assert!(staged.is_empty(), "start-up cleans leftovers: {staged:?}");
    }
    assert_eq!(c2.head(&digest).await.unwrap(), None, "nothing partial is visible");
    let probe = spillway_server::build_state(config.clone(), std::sync::Arc::new(spillway_server::clock::SystemClock))
        .await
        .unwrap();
    assert!(!probe.blobs.exists(&digest).await.unwrap(), "nothing partial is published");
    let got = c2.get(&kept.digest).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, "acknowledged before the crash\n");
    let got = c2.get(&Digest::of(&kept_big)).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, kept_big);
    let rec = c2.put(Bytes::from(whole.clone()), &UploadOptions::default()).await.unwrap();
    assert_eq!(rec.digest, digest);
    assert_eq!(c2.get(&digest).await.unwrap().bytes().await.unwrap(), whole);
}

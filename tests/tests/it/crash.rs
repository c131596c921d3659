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
        // Background work as often as the parent asks (milliseconds).
        let ms = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
        if let Some(d) = ms("SPILLWAY_CHILD_COMPACT_EVERY_MS") {
            (config.compact_after, config.compact_interval, config.compaction_lease) =
                (Duration::ZERO, d, Duration::from_secs(1));
        }
        if let Some(d) = ms("SPILLWAY_CHILD_RETENTION_EVERY_MS") {
            (config.retention_interval, config.retention_grace, config.deletion_lease) =
                (d, Duration::ZERO, Duration::from_secs(1));
        }
        let clock = std::sync::Arc::new(spillway_server::clock::SystemClock);
        let state = spillway_server::build_state(config, clock).await.unwrap();
        spillway_server::ensure_first_token(&state).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("LISTENING {}", listener.local_addr().unwrap());
        spillway_server::serve(listener, state, std::future::pending()).await.unwrap();
    });
}

async fn spawn_server(config: &spillway_server::Config) -> (Child, String) {
    spawn_server_with(config, &[]).await
}

/// The release build the yardstick measures, when `SPILLWAY_CRASH_SERVER_BIN` names it: started
/// with the yardstick's flags (`--listen`, `--data-dir`, nothing else), for the crash tests that
/// run on the embedded default. The address comes from its log (on stderr).
async fn spawn_release_server(bin: &std::ffi::OsStr, config: &spillway_server::Config) -> (Child, String) {
    // A relative path is the project root's, where the documented command runs (cargo runs
    // the tests in this crate's directory).
    let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(bin);
    let mut child = Command::new(&bin)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&config.data_dir)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if let Some((_, a)) = l.split_once("listening addr=") {
                return a.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect::<String>();
            }
        }
        panic!("{bin:?} exited before listening (its default metrics port is one for all: --test-threads=1)");
    })
    .await
    .unwrap();
    // Its log is read on, so that a full pipe never stalls it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://{addr}"))
}

async fn spawn_server_with(config: &spillway_server::Config, env: &[(&str, &str)]) -> (Child, String) {
    let release = std::env::var_os("SPILLWAY_CRASH_SERVER_BIN");
    if let Some(bin) =
        release.filter(|_| env.is_empty() && config.database_url.is_none() && config.blob_store.is_none())
    {
        return spawn_release_server(&bin, config).await;
    }
    let s3: String = config.s3_options.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.envs(env.iter().copied());
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
    assert!(!probe.blobs.store.exists(&digest).await.unwrap(), "nothing partial is published");
    let got = c2.get(&kept.digest).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, "acknowledged before the crash\n");
    let got = c2.get(&Digest::of(&kept_big)).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, kept_big);
    let rec = c2.put(Bytes::from(whole.clone()), &UploadOptions::default()).await.unwrap();
    assert_eq!(rec.digest, digest);
    assert_eq!(c2.get(&digest).await.unwrap().bytes().await.unwrap(), whole);
}

/// On both backends: 16 clients upload distinct 4 KiB bodies back to back (the yardstick's small
/// PUT) and the server is killed with SIGKILL in the middle, a few times over: every upload that
/// was acknowledged reads back exact after the restart, and an upload cut off by the kill can be
/// made again. With `SPILLWAY_CRASH_SERVER_BIN` on the embedded default, the server is that build
/// with the yardstick's flags (docs/benchmarks.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_under_small_uploads_loses_nothing_acknowledged() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = spillway_server::testing::backend_config(&data_dir).await;
    let (mut child, mut url) = spawn_server(&config).await;
    let token = std::fs::read_to_string(data_dir.join("token")).unwrap().trim().to_owned();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Digest, Bytes)>::new()));
    for round in 0..3u64 {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut clients = Vec::new();
        for k in 0..16u64 {
            let (c, acked, stop) = (StoreClient::new(&url, &token), acked.clone(), stop.clone());
            clients.push(tokio::spawn(async move {
                let mut i = 0u64;
                // The body in flight when the server died, if the kill cut one off.
                let mut cut = None;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let mut body = format!("round {round} client {k} upload {i}\n").into_bytes();
                    body.resize(4096, b'.');
                    let body = Bytes::from(body);
                    // Only what the server answered with success counts as acknowledged.
                    match c.put(body.clone(), &UploadOptions { ttl: Some(3600), ..Default::default() }).await {
                        Ok(rec) => acked.lock().unwrap().push((rec.digest, body)),
                        Err(_) => {
                            cut = Some(body);
                            break;
                        }
                    }
                }
                cut
            }));
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..1200))).await;
        child.kill().await.unwrap();
        child.wait().await.unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut cut = Vec::new();
        for c in clients {
            cut.extend(c.await.unwrap());
        }
        (child, url) = spawn_server(&config).await;
        let c = StoreClient::new(&url, &token);
        let acked = acked.lock().unwrap().clone();
        eprintln!("round {round}: {} uploads acknowledged in all, the server killed", acked.len());
        assert!(acked.len() > 100 * (round as usize + 1), "uploads were acknowledged before the kill: {}", acked.len());
        for (d, data) in &acked {
            let got = c.get(*d).await.unwrap_or_else(|e| panic!("round {round}: {d}: {e}")).bytes().await.unwrap();
            assert!(got == *data, "round {round}: {d} does not read back exact");
        }
        // The uploads the kill cut off (acknowledged or not, unknown to their clients) can be
        // made again, and then read back exact.
        assert!(!cut.is_empty(), "the kill cut uploads off");
        for body in cut {
            let rec = c.put(body.clone(), &UploadOptions::default()).await.unwrap();
            assert!(c.get(rec.digest).await.unwrap().bytes().await.unwrap() == body, "round {round}: {}", rec.digest);
        }
    }
}

/// Outputs that share most of their chunks: `seed` picks the variant, `len` the size.
fn variant(seed: u64, len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        i += 1;
        let line =
            if i % 997 == seed % 997 { format!("variant {seed} line {i}\n") } else { format!("shared line {i} ok\n") };
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// On both backends: a server compacting and deleting all the time (every blob compacted
/// as soon as it is written, retention every few hundred milliseconds with no grace) is
/// killed with SIGKILL again and again, at random moments: every acknowledged blob that still
/// has a live reference reads back exact after each restart, and in the end the sweeps leave
/// no pack nobody needs and no raw copy of a compacted blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_compacting_and_deleting_loses_nothing() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = spillway_server::testing::backend_config(&data_dir).await;
    let env = [("SPILLWAY_CHILD_COMPACT_EVERY_MS", "150"), ("SPILLWAY_CHILD_RETENTION_EVERY_MS", "250")];
    let (mut child, mut url) = spawn_server_with(&config, &env).await;
    let token = std::fs::read_to_string(data_dir.join("token")).unwrap().trim().to_owned();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut kept: Vec<(Digest, Bytes)> = Vec::new();
    for round in 0..8u64 {
        let c = StoreClient::new(&url, &token);
        for k in 0..4u64 {
            let data = variant(round * 10 + k, rng.random_range(300_000..2_500_000));
            let rec = c.put(data.clone(), &UploadOptions { ttl: Some(3600), ..Default::default() }).await.unwrap();
            kept.push((rec.digest, data));
            // Short-lived ones that share its chunks: their deletions meet the compactions.
            let short = variant(round * 10 + k + 5, rng.random_range(300_000..2_500_000));
            c.put(short, &UploadOptions { ttl: Some(1), ..Default::default() }).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..900))).await;
        child.kill().await.unwrap();
        child.wait().await.unwrap();
        (child, url) = spawn_server_with(&config, &env).await;
        let c = StoreClient::new(&url, &token);
        for (d, data) in &kept {
            let got = c.get(*d).await.unwrap_or_else(|e| panic!("round {round}: {d}: {e}")).bytes().await.unwrap();
            assert!(got == *data, "round {round}: {d} does not read back exact");
        }
    }
    // Settle: everything compacted, then the sweeps (past the deletion lease) tidy up.
    child.kill().await.unwrap();
    child.wait().await.unwrap();
    let mut quiet = config.clone();
    quiet.deletion_lease = Duration::ZERO;
    quiet.retention_grace = Duration::ZERO;
    let state =
        spillway_server::build_state(quiet, std::sync::Arc::new(spillway_server::clock::SystemClock)).await.unwrap();
    // The short references expire, and the killed server's compaction lease runs out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    spillway_server::jobs::compaction::run_compaction_once(&state.jobs, Duration::ZERO).await.unwrap();
    spillway_server::run_retention_once(&state.jobs, false).await.unwrap();
    let stats = state.db.storage_stats().await.unwrap();
    assert_eq!(stats.blobs, kept.len() as u64, "only the kept blobs are left: {stats:?}");
    let logical: u64 = kept.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(stats.logical_bytes, logical);
    assert!(stats.stored_bytes < logical / 4, "compacted and shared: {stats:?}");
    use futures::TryStreamExt;
    let raw: Vec<_> = state.blobs.store.list().try_collect().await.unwrap();
    assert!(raw.is_empty(), "no raw copy is left: {raw:?}");
    let packs: Vec<(String, u64, i64)> = state.blobs.store.list_packs().try_collect().await.unwrap();
    let on_disk: u64 = packs.iter().map(|(_, size, _)| size).sum();
    assert_eq!(on_disk, stats.stored_bytes, "every pack left is one a blob needs");
    for (d, data) in &kept {
        let row = state.db.blob_row(d).await.unwrap().unwrap();
        let got = spillway_server::blobs::source::blob_range(&state.blobs, &row, 0..row.size).await.unwrap();
        assert!(got == *data, "{d}");
    }
}

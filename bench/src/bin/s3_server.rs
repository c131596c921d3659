//! `spillway-s3-server ADDR ROOT`: the S3 protocol server of the test suite (`s3s` over
//! `s3s-fs`, TCP_NODELAY on), standalone, so benchmarks can compare Spillway-on-S3 with
//! requests sent straight to the same server. Keys: `spillway-test` / `spillway-test-secret`.
//! On `SIGUSR1` it prints the requests it has received so far, by bucket and kind, as one JSON
//! line on stdout (what a benchmark counts PUTs with).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:19000".into());
    let root = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/tmp/spillway-s3-bench".into()));
    std::fs::create_dir_all(&root)?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("S3 server on http://{}", listener.local_addr()?);
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            let counts: Vec<_> = spillway_server::testing::s3_request_counts()
                .into_iter()
                .map(|(bucket, kind, n)| serde_json::json!({"bucket": bucket, "kind": kind, "requests": n}))
                .collect();
            println!("{}", serde_json::Value::from(counts));
        }
    });
    spillway_server::testing::serve_s3(listener, root).await;
    Ok(())
}

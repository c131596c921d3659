//! `spillway-s3-server ADDR ROOT`: the S3 protocol server of the test suite (`s3s` over
//! `s3s-fs`, TCP_NODELAY on), standalone, so benchmarks can compare Spillway-on-S3 with
//! requests sent straight to the same server. Keys: `spillway-test` / `spillway-test-secret`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:19000".into());
    let root = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/tmp/spillway-s3-bench".into()));
    std::fs::create_dir_all(&root)?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("S3 server on http://{}", listener.local_addr()?);
    spillway_server::testing::serve_s3(listener, root).await;
    Ok(())
}

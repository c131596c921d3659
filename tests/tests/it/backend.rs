//! Which backends the suite runs on: SQLite + local disk by default; PostgreSQL + S3 when
//! `SPILLWAY_TEST_BACKEND=postgres-s3` (set by `.ci/run` for its second pass).

use spillway_server::Config;
use tempfile::TempDir;

pub fn is_remote() -> bool {
    std::env::var("SPILLWAY_TEST_BACKEND").is_ok_and(|v| v == "postgres-s3")
}

pub async fn configure(_config: &mut Config, _dir: &TempDir) {}

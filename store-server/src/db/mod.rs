//! The metadata database: the only place SQL lives. One `AnyPool` serves SQLite (the embedded
//! default) and PostgreSQL (shared by replicas); where their SQL differs, `Backend` picks.

mod blobs;
mod retention;
mod streams;
mod tokens;

pub use blobs::{AddRef, BlobRow, NewRef, RefRow};

pub use streams::{AppendOutcome, StreamRow};
pub use tokens::TokenRow;

use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Executor};

/// Which SQL dialect the pool speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded default.
    Sqlite,
    /// Shared by replicas.
    Postgres,
}

/// Handle to the metadata database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

impl Db {
    /// Connects and applies the migrations of the URL's backend.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            anyhow::bail!("unsupported database URL {url:?}: expected sqlite://… or postgres://…");
        };
        let options: AnyConnectOptions = url.parse()?;
        let pool = match backend {
            // SQLite takes one writer at a time; a single connection avoids lock errors
            // and its statements take microseconds.
            Backend::Sqlite => {
                AnyPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute(
                                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; \
                             PRAGMA foreign_keys=ON; PRAGMA busy_timeout=10000;",
                            )
                            .await?;
                            Ok(())
                        })
                    })
                    .connect_with(options)
                    .await?
            }
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options)
                    .await?
            }
        };
        match backend {
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&pool).await?,
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&pool).await?,
        }
        Ok(Self { pool, backend })
    }

    /// The dialect in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Round-trips a trivial query, for `/readyz`.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

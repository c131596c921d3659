//! The database handle: one pool for PostgreSQL or SQLite, and on SQLite one writer task that
//! commits waiting writes together (group commit). The row-level operations live beside it.

use super::error::{DbError, DbResult};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool, Connection, Executor};
use tokio::sync::{mpsc, oneshot};

/// Which SQL dialect the pool speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded default.
    Sqlite,
    /// Shared by replicas.
    Postgres,
}

/// Most writes one SQLite group commit takes.
const GROUP_MAX: usize = 256;

/// A write waiting for the SQLite group commit: runs its statements, then hears the outcome.
type Job = Box<dyn for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Finisher> + Send>;
type Finisher = Box<dyn FnOnce(DbResult<()>) + Send>;

/// Handle to the metadata database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    pub(super) pool: AnyPool,
    pub(super) backend: Backend,
    group: Option<mpsc::Sender<Job>>,
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

const SQLITE_PRAGMAS: &str =
    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA busy_timeout=10000; PRAGMA wal_autocheckpoint=1000;";

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
        match backend {
            Backend::Sqlite => {
                let mut writer = AnyConnection::connect_with(&options).await?;
                writer.execute(SQLITE_PRAGMAS).await?;
                SQLITE_MIGRATIONS.run(&mut writer).await?;
                let pool = AnyPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute(SQLITE_PRAGMAS).await?;
                            Ok(())
                        })
                    })
                    .connect_with(options)
                    .await?;
                let (tx, rx) = mpsc::channel(1024);
                tokio::spawn(group_commit(writer, rx));
                Ok(Self { pool, backend, group: Some(tx) })
            }
            Backend::Postgres => {
                let pool = AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options)
                    .await?;
                POSTGRES_MIGRATIONS.run(&pool).await?;
                Ok(Self { pool, backend, group: None })
            }
        }
    }

    /// The dialect in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Runs `op` as one write transaction and answers once it is durable.
    pub(crate) async fn write<T, F>(&self, op: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, DbResult<T>> + Send + 'static,
    {
        self.write_with(true, op).await
    }

    /// Like [`Db::write`], for a write whose every prefix is harmless if a later statement of
    /// it fails (a blob row with no reference yet is simply collected): on SQLite it skips
    /// its savepoint, one statement fewer on the hot path of small uploads.
    pub(crate) async fn write_prefix_safe<T, F>(&self, op: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, DbResult<T>> + Send + 'static,
    {
        self.write_with(false, op).await
    }

    async fn write_with<T, F>(&self, guarded: bool, op: F) -> DbResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, DbResult<T>> + Send + 'static,
    {
        let Some(group) = &self.group else {
            let mut tx = self.pool.begin().await?;
            let out = op(&mut tx).await?;
            tx.commit().await?;
            return Ok(out);
        };
        let (reply, answer) = oneshot::channel::<DbResult<T>>();
        let job: Job = Box::new(move |conn| {
            Box::pin(async move {
                // Savepoints stack up and are all released by the batch's COMMIT; a failing
                // write rolls back to its own (the most recent of that name) and no further.
                let saved = if guarded {
                    conn.execute("SAVEPOINT op").await.map(|_| ()).map_err(DbError::from)
                } else {
                    Ok(())
                };
                let result = match saved {
                    Err(e) => Err(e),
                    Ok(()) => {
                        let r = op(&mut *conn).await;
                        if r.is_err() && guarded {
                            let _ = conn.execute("ROLLBACK TO SAVEPOINT op").await;
                        }
                        r
                    }
                };
                let finish: Finisher = Box::new(move |committed| {
                    let _ = reply.send(match committed {
                        Ok(()) => result,
                        Err(e) => Err(e),
                    });
                });
                finish
            })
        });
        let closed = || DbError::from(sqlx::Error::PoolClosed);
        group.send(job).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// On SQLite, folds the write-ahead log into the database and truncates it: on a full disk
    /// that gives back the log's space (it holds many versions of the same pages), so that a
    /// delete can be written. Best effort; a no-op on PostgreSQL.
    pub async fn reclaim_log(&self) {
        if self.backend == Backend::Sqlite {
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&self.pool).await {
                tracing::warn!(cause = %e, "could not truncate the SQLite log");
            }
        }
    }

    /// Round-trips a trivial query, for `/readyz`.
    pub async fn ping(&self) -> DbResult<()> {
        Ok(sqlx::query("SELECT 1").execute(&self.pool).await.map(|_| ())?)
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The SQLite writer: takes every write that is waiting, runs them in one transaction, commits
/// (one fsync), then answers them all.
async fn group_commit(mut conn: AnyConnection, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let begun = conn.execute("BEGIN IMMEDIATE").await.map_err(DbError::from);
        let mut finishers = Vec::with_capacity(jobs.len());
        if begun.is_ok() {
            for job in jobs {
                finishers.push(job(&mut conn).await);
            }
        }
        let committed = match begun {
            Err(e) => Err(e),
            Ok(_) => match conn.execute("COMMIT").await {
                Ok(_) => Ok(()),
                Err(e) => {
                    let _ = conn.execute("ROLLBACK").await;
                    Err(DbError::from(e))
                }
            },
        };
        if let Err(e) = &committed {
            tracing::error!(cause = ?e, "SQLite group commit failed");
        }
        for f in finishers {
            f(committed.clone());
        }
    }
}

/// The digest a row keeps as 64 hex digits in column `col`.
pub(super) fn digest_at(r: &sqlx::any::AnyRow, col: &str) -> DbResult<spillway_api::Digest> {
    use sqlx::Row;
    let hex: String = r.try_get(col)?;
    spillway_api::Digest::from_hex(&hex).ok_or_else(|| DbError::corrupt("digest", hex))
}

/// Labels a row keeps as a JSON object in column `col`.
pub(super) fn labels_at(r: &sqlx::any::AnyRow, col: &str) -> DbResult<spillway_api::Labels> {
    use sqlx::Row;
    let text: String = r.try_get(col)?;
    serde_json::from_str(&text).map_err(|_| DbError::corrupt("labels", text))
}

/// Labels as a row keeps them.
pub(super) fn labels_json(labels: &spillway_api::Labels) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".into())
}

pub(super) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

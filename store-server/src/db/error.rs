//! What went wrong in the metadata database, by meaning. The routes map each meaning to one
//! answer (507, 503, 500) without looking into the driver's error; every variant keeps the
//! driver's error as its `source`.

use std::sync::Arc;

/// The driver's error (sqlx, or rusqlite for the SQLite writer's own statements).
pub(super) type DriverError = Arc<dyn std::error::Error + Send + Sync>;

/// A database failure. Cheap to clone: the SQLite group commit gives the same failure to
/// every write of its batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DbError {
    /// Out of space: SQLite's `SQLITE_FULL` (13), PostgreSQL's `disk_full` (53100), or an I/O
    /// error of kind `StorageFull`.
    #[error("the metadata database is full")]
    Full(#[source] DriverError),
    /// Not reachable now (the pool timed out or closed, a connection's I/O failed): retry.
    #[error("the metadata database is unavailable")]
    Unavailable(#[source] DriverError),
    /// A stored value that does not parse as its type: the database was changed by hand or
    /// by a newer version.
    #[error("malformed {what} stored in the database: {value:?}")]
    Corrupt {
        /// What the column holds (`digest`, `labels`, …).
        what: &'static str,
        /// The value found.
        value: String,
    },
    /// Bytes stored inside a transaction (a direct upload's completion) failed; nothing of
    /// the transaction was written.
    #[error("storing the bytes failed")]
    Bytes(#[source] DriverError),
    /// A statement failed otherwise.
    #[error("database statement failed")]
    Statement(#[source] DriverError),
    /// What a transaction set out from no longer held (another writer changed it first); it
    /// wrote nothing.
    #[error("a concurrent change came first; nothing was written")]
    Conflict,
}

/// Results of the database layer.
pub type DbResult<T> = Result<T, DbError>;

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        let full = match &e {
            sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("13" | "53100")),
            sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        };
        if full {
            return Self::Full(Arc::new(e));
        }
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => Self::Unavailable(Arc::new(e)),
            other => Self::Statement(Arc::new(other)),
        }
    }
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as C;
        match e.sqlite_error_code() {
            Some(C::DiskFull) => Self::Full(Arc::new(e)),
            Some(C::DatabaseBusy | C::DatabaseLocked | C::SystemIoFailure | C::CannotOpen) => {
                Self::Unavailable(Arc::new(e))
            }
            _ => Self::Statement(Arc::new(e)),
        }
    }
}

impl DbError {
    /// True when the database failed for want of space.
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full(_))
    }

    /// Unavailable for a reason of our own, said in words.
    pub(crate) fn unavailable(why: &str) -> Self {
        let cause: Box<dyn std::error::Error + Send + Sync> = why.into();
        Self::Unavailable(Arc::from(cause))
    }

    /// For a value read back that does not parse.
    pub(crate) fn corrupt(what: &'static str, value: impl Into<String>) -> Self {
        Self::Corrupt { what, value: value.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meanings_of_driver_errors() {
        let full = sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::StorageFull, "no space"));
        assert!(DbError::from(full).is_full());
        assert!(matches!(DbError::from(sqlx::Error::PoolTimedOut), DbError::Unavailable(_)));
        assert!(matches!(DbError::from(sqlx::Error::RowNotFound), DbError::Statement(_)));
        let e = DbError::from(sqlx::Error::PoolClosed);
        assert!(std::error::Error::source(&e).is_some(), "the driver's error is kept");
        let sqlite = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        assert!(DbError::from(sqlite(rusqlite::ffi::SQLITE_FULL)).is_full());
        assert!(matches!(DbError::from(sqlite(rusqlite::ffi::SQLITE_BUSY)), DbError::Unavailable(_)));
        assert!(matches!(DbError::from(sqlite(rusqlite::ffi::SQLITE_CONSTRAINT)), DbError::Statement(_)));
    }
}

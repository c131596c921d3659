//! The metadata database: the only place SQL lives. One `AnyPool` serves SQLite (the embedded
//! default) and PostgreSQL (shared by replicas); where their SQL differs, `Backend` picks.
//!
//! Writes go through [`Db::write`]: on PostgreSQL each is its own transaction (the server
//! groups commits itself); on SQLite one writer task runs them in shared transactions, each
//! in a savepoint, so that many concurrent uploads cost one fsync instead of one each, and
//! readers (on their own connections, thanks to WAL) never wait behind it.

mod blobs;
mod chunks;
mod damage;
pub(crate) mod error;
mod keys;
pub mod plans;
mod pool;
mod retention;
mod search;
mod streams;
mod tokens;
mod totals;

pub use blobs::{AddRef, BlobRow, BlobState, Complete, NewRef, RefRow, Referenced};
pub use chunks::{ChunkLoc, Compacted, NewPack, StorageStats};
pub use damage::ScrubBlob;
pub use error::{DbError, DbResult};
pub use pool::{Backend, Db, GROUP_SECONDS, GROUP_WRITES};
pub use search::{SearchRef, MAX_SEARCH_OUTPUTS};
pub use streams::{AppendOutcome, StreamRow};
pub use tokens::{token_id, TokenInfo, TokenRow};
pub use totals::Totals;

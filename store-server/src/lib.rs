//! `spillway-server`: the content-addressed spill store shared by agent workers.
//!
//! The binary's `main.rs` parses arguments and calls [`build_state`] and [`serve`]; tests do
//! the same on `127.0.0.1:0`. The wings, from the edge down (`docs/architecture.md` draws
//! them and the test in `testing/structure.rs` keeps the drawing true):
//!
//! - `http/` — the listener, router, handlers and request log;
//! - `auth/` — tokens, their cache, the bearer extractor;
//! - `blobs/`, `streams/`, `search/` — the services handlers call;
//! - `jobs/` — retention and compaction passes, the heavy-work pool;
//! - `chunks/` — compacted storage: chunks, packs, their reader;
//! - `storage/` — bytes under keys: the `Backend` trait, local disk, S3;
//! - `db/` — the only place SQL lives;
//! - `config.rs`, `state.rs`, `error.rs`, `clock.rs` — what all of them share;
//! - `testing/` — the test kit and the structure checks.

pub mod auth;
pub mod blobs;
pub mod chunks;
pub mod clock;
pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod jobs;
pub mod search;
pub mod state;
pub mod storage;
pub mod streams;
pub mod testing;

pub use config::Config;
pub use http::server::{serve, serve_metrics};
pub use jobs::retention::run_retention_once;
pub use state::{build_state, ensure_first_token, AppState};

//! `spillway-server`: the content-addressed spill store shared by agent workers.
//!
//! The binary's `main.rs` parses arguments and calls [`server::build_state`] and
//! [`server::serve`]; tests do the same on `127.0.0.1:0`.

pub mod auth;
mod backend;
pub mod blobs;
mod cache;
pub mod chunks;
pub mod clock;
pub mod compaction;
pub mod config;
pub mod cursor;
pub mod db;
mod direct;
pub mod error;
pub mod heavy;
pub mod json;
pub mod listen;
pub mod logwriter;
pub mod reqlog;
pub mod reserve;
pub mod retention;
pub mod routes;
pub mod search;
pub mod server;
mod spool;
mod staging;
pub mod state;
pub mod store;
pub mod streams;
#[cfg(test)]
mod structure;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "testing")]
mod testing_backend;
mod text;
pub mod upload;

pub use config::Config;
pub use retention::run_retention_once;
pub use server::{build_state, ensure_first_token, serve, serve_metrics};
pub use state::AppState;

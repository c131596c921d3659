//! The tool side of Spillway. Placeholder root; see modules.
#![warn(missing_docs)]

pub mod error;
pub mod store;

pub use error::{ClientError, Result};
pub use store::{GrepRequest, ReadRequest, StoreClient, UploadOptions};

//! What only tests use, kept apart from production files: the test kit (feature `testing`:
//! the real server on `127.0.0.1:0` on either backend) and the checks of the crate's own
//! structure (unit tests).

#[cfg(feature = "testing")]
mod backend;
#[cfg(feature = "testing")]
mod kit;
#[cfg(test)]
mod structure;

#[cfg(feature = "testing")]
pub use kit::*;

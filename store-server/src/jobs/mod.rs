//! Background passes, each a loop on a timer and a `_once` that tests call: retention
//! (expiry, grace, claimed deletions, orphan sweeps) and compaction (raw blobs into chunks and
//! packs); and `heavy`, the pool and pacing that scans and passes share so that requests
//! keep their pace beside them.

pub mod compaction;
pub mod heavy;
pub mod retention;

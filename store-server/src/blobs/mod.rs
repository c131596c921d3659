//! The blob service handlers call: whether a namespace sees a blob and a stored blob as a
//! paging source (`source`), the write path shared by uploads and seals (`upload`), blob text
//! kept escaped for capped reads (`text`) and the secrets found in it (`secrets`).

pub(crate) mod secrets;
pub mod source;
pub(crate) mod text;
pub mod upload;

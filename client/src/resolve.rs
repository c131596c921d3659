//! References as tool arguments: `{"$spillway": "blake3:…"}`, or a receipt object, stands for a
//! saved output. A model passes "the output of step 3" to a tool that takes text by naming it,
//! and the tool gets the bytes — which never pass through the model's context. [`resolve`]
//! replaces every reference in a tool call's arguments, at any depth, with the output's text
//! (or a local file's path), refusing an output over the tool's limit before reading past it.

use std::path::PathBuf;

use futures::StreamExt;
use serde_json::Value;
use spillway_api::ErrorCode;

use crate::conn::parse_digest;
use crate::error::{ClientError, Result};
use crate::reader::Reader;
use crate::transfer::Verifier;

/// The key of a reference object.
pub const REFERENCE_KEY: &str = "$spillway";

/// How references are replaced.
#[derive(Debug, Clone)]
pub struct ResolveOptions {
    /// The most bytes one output may have: a larger one is `too_large`, refused before
    /// anything past the limit is read.
    pub limit: u64,
    /// Replace a reference by the path of a local file holding the output (written once per
    /// digest, verified, under the system's temporary directory), not by its text.
    pub as_file: bool,
}

impl Default for ResolveOptions {
    /// 10,000,000 bytes, as text.
    fn default() -> Self {
        Self { limit: 10_000_000, as_file: false }
    }
}

/// What a value refers to, if it is a reference: the digest of `{"$spillway": "…"}` or of a
/// receipt (an object with `digest`, `truncated` and `total_size`). A receipt of an output
/// that was not cut (no digest) is its `result`, the whole output.
enum Ref<'a> {
    Digest(&'a str),
    Whole(&'a str),
}

fn reference(v: &Value) -> Option<Ref<'_>> {
    let o = v.as_object()?;
    if let Some(r) = o.get(REFERENCE_KEY) {
        return (o.len() == 1).then_some(()).and(r.as_str()).map(Ref::Digest);
    }
    if !(o.contains_key("truncated") && o.contains_key("total_size") && o.contains_key("result")) {
        return None;
    }
    match o.get("digest").and_then(Value::as_str) {
        Some(d) => Some(Ref::Digest(d)),
        None if o.get("truncated") == Some(&Value::Bool(false)) => o.get("result")?.as_str().map(Ref::Whole),
        None => None,
    }
}

/// `value` with every reference in it, at any depth (objects and arrays), replaced by the
/// output's text (invalid UTF-8 shown as U+FFFD) or, with `as_file`, a local file's path.
/// An output over the limit is `too_large`; one missing or not readable with this token is
/// `not_found`; bytes that fail their digest are `digest_mismatch`.
pub async fn resolve(value: Value, reader: &Reader, opts: &ResolveOptions) -> Result<Value> {
    if let Some(r) = reference(&value) {
        return match r {
            Ref::Whole(text) => Ok(Value::String(text.to_owned())),
            Ref::Digest(d) => fetch(reader, d, opts).await,
        };
    }
    match value {
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(Box::pin(resolve(item, reader, opts)).await?);
            }
            Ok(Value::Array(out))
        }
        Value::Object(map) => {
            let mut out = serde_json::Map::with_capacity(map.len());
            for (k, v) in map {
                out.insert(k, Box::pin(resolve(v, reader, opts)).await?);
            }
            Ok(Value::Object(out))
        }
        other => Ok(other),
    }
}

fn too_large(d: &str, size: Option<u64>, limit: u64) -> ClientError {
    let size = size.map_or_else(|| "more than that".to_owned(), |s| format!("{s} bytes"));
    ClientError::Api {
        status: 413,
        code: ErrorCode::TooLarge,
        message: format!(
            "{d} is {size}, over this tool's limit of {limit} bytes: page it with read, or process it with run \
             and stdin"
        ),
    }
}

/// One output's bytes, verified, as text or a file's path.
async fn fetch(reader: &Reader, d: &str, opts: &ResolveOptions) -> Result<Value> {
    let digest = parse_digest(d)?;
    let (len, mut body) = reader.download(&digest).await.map_err(|e| unreadable(d, e))?;
    if len.is_some_and(|l| l > opts.limit) {
        return Err(too_large(d, len, opts.limit));
    }
    let mut check = Verifier::new(&digest);
    let mut data = Vec::with_capacity(len.unwrap_or(0) as usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if data.len() as u64 + chunk.len() as u64 > opts.limit {
            return Err(too_large(d, None, opts.limit));
        }
        check.update(&chunk);
        data.extend_from_slice(&chunk);
    }
    check.finish()?;
    if !opts.as_file {
        return Ok(Value::String(
            String::from_utf8(data).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ));
    }
    let path = file_for(&digest.to_string());
    if !path.exists() {
        let dir = path.parent().expect("a file in a directory");
        std::fs::create_dir_all(dir).map_err(|e| ClientError::file(dir, e))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let partial = dir.join(format!(".{name}.{}.partial", std::process::id()));
        std::fs::write(&partial, &data).map_err(|e| ClientError::file(&partial, e))?;
        std::fs::rename(&partial, &path).map_err(|e| ClientError::file(&path, e))?;
    }
    Ok(Value::String(path.display().to_string()))
}

/// A reference this token may not read the bytes of (a redacted token's: `403`) is as missing to
/// the tool as one that is not there: `not_found` (api.md v1.3).
fn unreadable(d: &str, e: ClientError) -> ClientError {
    match e {
        ClientError::Api { status: 403, message, .. } => ClientError::Api {
            status: 404,
            code: ErrorCode::NotFound,
            message: format!("{d} cannot be read with this token: {message}"),
        },
        other => other,
    }
}

/// Where `as_file` puts the output named `digest`.
fn file_for(digest: &str) -> PathBuf {
    let name = digest.replace(':', "-");
    std::env::temp_dir().join("spillway-inputs").join(name)
}

//! `spillway._spillway`: the Rust SDK (`spillway-client`) as a Python module. Thin wrappers,
//! no logic of their own: arguments become the SDK's types, the SDK runs on one shared tokio
//! runtime with the interpreter released (`Python::detach`) while it waits on the network, a
//! file or a child process, and answers come back as the contract's JSON shapes (dicts and
//! lists) or as a `SpillwayError` subclass carrying the contract's `code` and `status`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{create_exception, IntoPyObjectExt};
use serde_json::Value;
use spillway_api::{AnyDigest, ErrorCode};
use spillway_client::capture::{self, ExecOptions};
use spillway_client::output::{self, SpillOptions};
use spillway_client::receipt::Readers;
use spillway_client::spill::{self, SpillTarget};
use spillway_client::truncate::{Redaction, Strategy};
use spillway_client::{conn, gate, reader::Reader, transfer, ClientError, StoreClient};

// ------------------------------------------------------------------ errors

create_exception!(spillway, SpillwayError, PyException, "A store or SDK error: `.code` is the contract's error code, `.status` the HTTP status (None when no server answered).");
create_exception!(spillway, InvalidDigest, SpillwayError, "A malformed digest (`invalid_digest`, 400).");
create_exception!(
    spillway,
    InvalidArgument,
    SpillwayError,
    "A malformed argument, query or body (`invalid_argument`, 400)."
);
create_exception!(
    spillway,
    DigestMismatch,
    SpillwayError,
    "Bytes that do not hash to their digest (`digest_mismatch`)."
);
create_exception!(spillway, Unauthorized, SpillwayError, "A missing or unknown token (`unauthorized`, 401).");
create_exception!(
    spillway,
    Forbidden,
    SpillwayError,
    "The token lacks the scope, or reads redacted text only (`forbidden`, 403)."
);
create_exception!(spillway, NotFound, SpillwayError, "No such blob or stream in this namespace (`not_found`, 404).");
create_exception!(
    spillway,
    OffsetMismatch,
    SpillwayError,
    "A stream append at the wrong offset (`offset_mismatch`, 409)."
);
create_exception!(spillway, StreamClosed, SpillwayError, "A stream append after seal or cap (`stream_closed`, 409).");
create_exception!(
    spillway,
    TooLarge,
    SpillwayError,
    "Over the store's limit, or refused by a `reject` strategy (`too_large`, 413)."
);
create_exception!(
    spillway,
    StreamLimitExceeded,
    SpillwayError,
    "A stream reached its cap (`stream_limit_exceeded`, 413)."
);
create_exception!(
    spillway,
    RangeNotSatisfiable,
    SpillwayError,
    "An offset or line past the end (`range_not_satisfiable`, 416)."
);
create_exception!(
    spillway,
    Unavailable,
    SpillwayError,
    "The store is down or did not answer; safe to retry (`unavailable`)."
);
create_exception!(
    spillway,
    InsufficientStorage,
    SpillwayError,
    "The store's disk is full (`insufficient_storage`, 507)."
);
create_exception!(spillway, QuotaExceeded, SpillwayError, "The namespace's quota is reached (`quota_exceeded`, 507).");
create_exception!(
    spillway,
    TooManyRequests,
    SpillwayError,
    "A concurrency limit is reached; retry shortly (`too_many_requests`, 429)."
);

create_exception!(
    spillway,
    Corrupt,
    SpillwayError,
    "The output's stored bytes fail their hash or are gone; uploading the same content again repairs it (`corrupt`, 500)."
);

/// The contract's name of a code (`not_found`, …).
fn code_name(code: &ErrorCode) -> String {
    serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "error".into())
}

/// The exception class of a code.
fn class_of<'py>(py: Python<'py>, code: &str) -> Bound<'py, PyType> {
    match code {
        "invalid_digest" => py.get_type::<InvalidDigest>(),
        "invalid_argument" => py.get_type::<InvalidArgument>(),
        "digest_mismatch" => py.get_type::<DigestMismatch>(),
        "unauthorized" => py.get_type::<Unauthorized>(),
        "forbidden" => py.get_type::<Forbidden>(),
        "not_found" => py.get_type::<NotFound>(),
        "offset_mismatch" => py.get_type::<OffsetMismatch>(),
        "stream_closed" => py.get_type::<StreamClosed>(),
        "too_large" => py.get_type::<TooLarge>(),
        "stream_limit_exceeded" => py.get_type::<StreamLimitExceeded>(),
        "range_not_satisfiable" => py.get_type::<RangeNotSatisfiable>(),
        "unavailable" => py.get_type::<Unavailable>(),
        "insufficient_storage" => py.get_type::<InsufficientStorage>(),
        "quota_exceeded" => py.get_type::<QuotaExceeded>(),
        "too_many_requests" => py.get_type::<TooManyRequests>(),
        "corrupt" => py.get_type::<Corrupt>(),
        _ => py.get_type::<SpillwayError>(),
    }
}

/// A `SpillwayError` (the subclass of its code) with `.code` and `.status` set.
fn raise(code: &str, status: Option<u16>, message: String) -> PyErr {
    Python::attach(|py| {
        let made = class_of(py, code).call1((message,)).and_then(|e| {
            e.setattr("code", code)?;
            e.setattr("status", status)?;
            Ok(PyErr::from_value(e))
        });
        made.unwrap_or_else(|e| e)
    })
}

/// The SDK's error as Python sees it.
fn error(e: ClientError) -> PyErr {
    let message = e.to_string();
    match &e {
        ClientError::Api { status, code, message } => raise(&code_name(code), Some(*status), message.clone()),
        ClientError::Http(_) | ClientError::Timeout(_) => raise("unavailable", None, message),
        ClientError::InvalidDigest(_) => raise("invalid_digest", Some(400), message),
        ClientError::DigestMismatch { .. } => raise("digest_mismatch", None, message),
        ClientError::Other(m) if m.ends_with("(invalid_argument)") => raise("invalid_argument", Some(400), message),
        _ => raise("error", None, message),
    }
}

fn invalid(message: impl Into<String>) -> PyErr {
    raise("invalid_argument", Some(400), message.into())
}

// ------------------------------------------------------------------ the runtime

/// The one runtime every call runs on (two workers: the SDK waits on I/O, it does not compute).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spillway")
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// Makes a future with `make` and runs it to its end with the interpreter released: for futures
/// that must not move between threads (they hold a lock on stdout, say).
fn wait_made<M, F>(py: Python<'_>, make: M) -> F::Output
where
    M: FnOnce() -> F + Send,
    F: std::future::Future,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(make()))
}

/// Runs `fut` to its end with the interpreter released, so other Python threads run meanwhile.
fn wait<F>(py: Python<'_>, fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(fut))
}

// ------------------------------------------------------------------ JSON <-> Python

fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_bound_py_any(py)?,
            (None, Some(i)) => i.into_bound_py_any(py)?,
            _ => n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)?,
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let items = a.iter().map(|x| to_py(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<i64>().map(Value::from).or_else(|_| obj.extract::<u64>().map(Value::from));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(serde_json::Number::from_f64(obj.extract()?).map_or(Value::Null, Value::Number));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = serde_json::Map::new();
        for (k, v) in d.iter() {
            map.insert(k.extract::<String>()?, from_py(&v)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return Ok(Value::Array(obj.try_iter()?.map(|x| from_py(&x?)).collect::<PyResult<_>>()?));
    }
    Err(invalid(format!("cannot send a {} as JSON", obj.get_type().name()?)))
}

/// An SDK answer as the contract's JSON shape.
fn answer<T: serde::Serialize>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    let json = serde_json::to_value(v).map_err(|e| raise("error", None, e.to_string()))?;
    Ok(to_py(py, &json)?.unbind())
}

/// Output given as `bytes` or `str` (UTF-8).
fn data_of(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(b.as_bytes()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(s.to_str()?.as_bytes()));
    }
    Err(invalid(format!("expected bytes or str, got {}", obj.get_type().name()?)))
}

fn labels_of(labels: Option<BTreeMap<String, String>>) -> Vec<(String, String)> {
    labels.unwrap_or_default().into_iter().collect()
}

fn digest(s: &str) -> PyResult<AnyDigest> {
    conn::parse_digest(s).map_err(error)
}

// ------------------------------------------------------------------ Store

/// A client of one store, with one token (`SPILLWAY_URL`, `SPILLWAY_TOKEN` when not given).
#[pyclass(module = "spillway", frozen, subclass)]
struct Store {
    client: StoreClient,
}

impl Store {
    fn with(&self, redact: bool) -> StoreClient {
        self.client.clone().redacting(redact)
    }
}

fn from_env(name: &str, given: Option<String>) -> Option<String> {
    given.or_else(|| std::env::var(name).ok()).filter(|s| !s.is_empty())
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (url=None, token=None))]
    fn new(url: Option<String>, token: Option<String>) -> PyResult<Self> {
        let url = from_env("SPILLWAY_URL", url)
            .ok_or_else(|| invalid("no store URL: pass url= or set SPILLWAY_URL (e.g. http://127.0.0.1:7745)"))?;
        let token = from_env("SPILLWAY_TOKEN", token).unwrap_or_default();
        Ok(Self { client: StoreClient::new(url, token) })
    }

    /// The store's base URL.
    #[getter]
    fn url(&self) -> String {
        self.client.base_url().to_owned()
    }

    fn __repr__(&self) -> String {
        format!("Store({:?})", self.client.base_url())
    }

    #[pyo3(signature = (data, labels=None, ttl=None))]
    fn put(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        labels: Option<BTreeMap<String, String>>,
        ttl: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let data = data_of(data)?;
        let opts = spillway_client::UploadOptions { ttl, labels: labels_of(labels), max_bytes: None };
        let rec = wait(py, self.client.put(data, &opts)).map_err(error)?;
        answer(py, &rec)
    }

    #[pyo3(signature = (source, labels=None, ttl=None))]
    fn put_file(
        &self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        labels: Option<BTreeMap<String, String>>,
        ttl: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let opts = spillway_client::UploadOptions { ttl, labels: labels_of(labels), max_bytes: None };
        if let Ok(path) = source.extract::<PathBuf>() {
            let rec =
                wait(py, transfer::put_store(&self.client, transfer::Source::File(path), &opts)).map_err(error)?;
            return answer(py, &rec);
        }
        // A file object: read a chunk at a time, each handed to the streaming upload.
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
        let body = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
        let client = self.client.clone();
        let task = runtime().spawn(async move { client.put_stream(body, &opts).await });
        loop {
            let chunk = source.call_method1("read", (1usize << 20,))?;
            let chunk = data_of(&chunk)?;
            if chunk.is_empty() {
                break;
            }
            if wait(py, tx.send(Ok(chunk))).is_err() {
                break; // the upload ended early: its answer says why
            }
        }
        drop(tx);
        let rec = wait(py, task).map_err(|e| raise("error", None, e.to_string()))?.map_err(error)?;
        answer(py, &rec)
    }

    fn get<'py>(&self, py: Python<'py>, digest_: &str) -> PyResult<Bound<'py, PyBytes>> {
        let d = digest(digest_)?;
        let data = wait(py, transfer::get_bytes(&Reader::Store(self.client.clone()), &d)).map_err(error)?;
        Ok(PyBytes::new(py, &data))
    }

    fn get_file(&self, py: Python<'_>, digest_: &str, dest: &Bound<'_, PyAny>) -> PyResult<()> {
        let d = digest(digest_)?;
        let reader = Reader::Store(self.client.clone());
        if let Ok(path) = dest.extract::<PathBuf>() {
            // Written beside, verified, then renamed into place.
            return wait_made(py, || transfer::get(&reader, &d, Some(&path))).map_err(error);
        }
        let (_, mut body) = wait(py, reader.download(&d)).map_err(error)?;
        let mut check = transfer::Verifier::new(&d);
        while let Some(chunk) = wait(py, body.next()) {
            let chunk = chunk.map_err(error)?;
            check.update(&chunk);
            dest.call_method1("write", (PyBytes::new(py, &chunk),))?;
        }
        check.finish().map_err(error)
    }

    #[pyo3(signature = (digest, line=None, lines=None, offset=None, limit=None, redact=false, tail_lines=None))]
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        py: Python<'_>,
        digest: &str,
        line: Option<u64>,
        lines: Option<u64>,
        offset: Option<u64>,
        limit: Option<u64>,
        redact: bool,
        tail_lines: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let d = self::digest(digest)?;
        let req = match (line.or(lines.map(|_| 1)), offset.or(limit.map(|_| 0)), tail_lines) {
            (None, None, Some(lines)) => spillway_client::ReadRequest::Tail { lines },
            (_, _, Some(_)) => return Err(invalid("tail_lines is not taken with line, lines, offset or limit")),
            (Some(_), Some(_), None) => return Err(invalid("use line/lines or offset/limit, not both")),
            (Some(line), None, None) => spillway_client::ReadRequest::Lines { line, lines },
            (None, offset, None) => spillway_client::ReadRequest::Bytes { offset: offset.unwrap_or(0), limit },
        };
        let page = wait(py, self.with(redact).read(d, req)).map_err(error)?;
        answer(py, &page)
    }

    #[pyo3(signature = (digest, pattern, ignore_case=false, fixed=false, before=0, after=0, from_line=None, redact=false, max_matches=None))]
    #[allow(clippy::too_many_arguments)]
    fn grep(
        &self,
        py: Python<'_>,
        digest: &str,
        pattern: String,
        ignore_case: bool,
        fixed: bool,
        before: u32,
        after: u32,
        from_line: Option<u64>,
        redact: bool,
        max_matches: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let d = self::digest(digest)?;
        let g = spillway_client::GrepRequest {
            pattern,
            ignore_case,
            fixed,
            from_line,
            max_matches,
            before: Some(before),
            after: Some(after),
        };
        let found = wait(py, self.with(redact).grep(d, &g)).map_err(error)?;
        answer(py, &found)
    }

    #[pyo3(signature = (pattern, labels=None, since=None, ignore_case=false, fixed=false, cursor=None, redact=false, until=None, max_matches=None, before=0, after=0))]
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        py: Python<'_>,
        pattern: String,
        labels: Option<BTreeMap<String, String>>,
        since: Option<&Bound<'_, PyAny>>,
        ignore_case: bool,
        fixed: bool,
        cursor: Option<String>,
        redact: bool,
        until: Option<&Bound<'_, PyAny>>,
        max_matches: Option<usize>,
        before: u32,
        after: u32,
    ) -> PyResult<Py<PyAny>> {
        let when = |t: Option<&Bound<'_, PyAny>>| -> PyResult<Option<String>> {
            t.map(|t| if t.is_instance_of::<PyString>() { t.extract() } else { Ok(t.extract::<i64>()?.to_string()) })
                .transpose()
        };
        let s = spillway_client::SearchRequest {
            pattern,
            labels: labels_of(labels),
            ignore_case,
            fixed,
            since: when(since)?,
            until: when(until)?,
            before: Some(before),
            after: Some(after),
            max_matches,
            cursor,
        };
        let found = wait(py, self.with(redact).search(&s)).map_err(error)?;
        answer(py, &found)
    }

    fn stat(&self, py: Python<'_>, digest: &str) -> PyResult<Py<PyAny>> {
        let d = self::digest(digest)?;
        answer(py, &wait(py, self.client.stat(d)).map_err(error)?)
    }

    /// This namespace's references with `labels`, newest first, following the cursor.
    #[pyo3(signature = (labels=None))]
    fn refs(&self, labels: Option<BTreeMap<String, String>>) -> Refs {
        Refs { client: self.client.clone(), labels: labels_of(labels), page: Vec::new(), cursor: None, done: false }
    }

    /// Calls one of `spillway mcp`'s tools (`read`, `grep`, `search`, …) over this store, as
    /// its MCP server answers it — always redacted: the text a model reads, and its JSON.
    fn _tool(&self, py: Python<'_>, name: &str, arguments: &Bound<'_, PyAny>) -> PyResult<(String, Py<PyAny>)> {
        let args = from_py(arguments)?;
        let conn =
            conn::Conn::new(Some(self.client.base_url().to_owned()), Some(self.client.token().to_owned()), None, None);
        let tools = spillway_client::mcp::SpillwayTools::new(conn);
        let (text, json) = wait(py, tools.call_tool(name, args)).map_err(error)?;
        Ok((text, to_py(py, &json)?.unbind()))
    }

    /// Drops this namespace's references to a blob (admin).
    fn delete(&self, py: Python<'_>, digest: &str) -> PyResult<()> {
        let d = self::digest(digest)?;
        wait(py, self.client.delete(d)).map_err(error)
    }
}

/// The references of [`Store::refs`], fetched a page at a time.
#[pyclass(module = "spillway")]
struct Refs {
    client: StoreClient,
    labels: Vec<(String, String)>,
    page: Vec<Value>,
    cursor: Option<String>,
    done: bool,
}

#[pymethods]
impl Refs {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        while self.page.is_empty() && !self.done {
            let labels: Vec<(&str, &str)> = self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let list = wait(py, self.client.list_refs(&labels, Some(1000), self.cursor.as_deref())).map_err(error)?;
            self.page = list.refs.iter().rev().filter_map(|r| serde_json::to_value(r).ok()).collect();
            self.cursor = list.next_cursor;
            self.done = self.cursor.is_none();
        }
        self.page.pop().map(|v| to_py(py, &v).map(Bound::unbind)).transpose()
    }
}

// ------------------------------------------------------------------ targets and the tool side

/// Spill to a directory instead of the store (`./.outputs` style): files named by content hash.
#[pyclass(module = "spillway", frozen)]
struct LocalDir {
    dir: spillway_client::spill::LocalDir,
}

#[pymethods]
impl LocalDir {
    #[new]
    fn new(path: PathBuf) -> Self {
        Self { dir: spillway_client::spill::LocalDir::new(path) }
    }

    /// The directory (absolute).
    #[getter]
    fn path(&self) -> PathBuf {
        self.dir.dir().to_path_buf()
    }

    fn __repr__(&self) -> String {
        format!("LocalDir({:?})", self.dir.dir())
    }
}

/// Where full outputs go: a `Store`, a `LocalDir`, or (None) the store of `SPILLWAY_URL` when
/// set, else `./.outputs`.
fn target_of(target: Option<&Bound<'_, PyAny>>) -> PyResult<Arc<dyn SpillTarget>> {
    match target {
        Some(t) if !t.is_none() => {
            if let Ok(store) = t.cast::<Store>() {
                return Ok(Arc::new(spill::RemoteStore::new(store.get().client.clone())));
            }
            if let Ok(dir) = t.cast::<LocalDir>() {
                return Ok(Arc::new(dir.get().dir.clone()));
            }
            Err(invalid(format!("target must be a Store, a LocalDir or None, not {}", t.get_type().name()?)))
        }
        _ => Ok(match from_env("SPILLWAY_URL", None) {
            Some(url) => Arc::new(spill::RemoteStore::new(StoreClient::new(
                url,
                from_env("SPILLWAY_TOKEN", None).unwrap_or_default(),
            ))),
            None => Arc::new(spillway_client::spill::LocalDir::new(".outputs")),
        }),
    }
}

/// Where saved outputs are read from, as `target_of` chooses where they go: a `Store`, a
/// `LocalDir`, or `None` (`SPILLWAY_URL` when set, else `./.outputs`).
fn reader_of(target: Option<&Bound<'_, PyAny>>) -> PyResult<Reader> {
    match target {
        Some(t) if !t.is_none() => {
            if let Ok(store) = t.cast::<Store>() {
                return Ok(Reader::Store(store.get().client.clone()));
            }
            if let Ok(dir) = t.cast::<LocalDir>() {
                return Ok(Reader::Local(dir.get().dir.clone(), None));
            }
            Err(invalid(format!("store must be a Store, a LocalDir or None, not {}", t.get_type().name()?)))
        }
        _ => Ok(match from_env("SPILLWAY_URL", None) {
            Some(url) => Reader::Store(StoreClient::new(url, from_env("SPILLWAY_TOKEN", None).unwrap_or_default())),
            None => Reader::Local(spillway_client::spill::LocalDir::new(".outputs"), None),
        }),
    }
}

/// `value` with every reference in it — `{"$spillway": "blake3:…"}` or a receipt — at any
/// depth replaced by the saved output's text (or, with `as_file=True`, a local file's path).
/// An output over `limit` bytes raises `TooLarge` before anything past the limit is read; a
/// missing or unreadable one raises `NotFound`. `store`: a `Store`, a `LocalDir`, or `None`
/// (`SPILLWAY_URL` when set, else `./.outputs`).
#[pyfunction(name = "resolve")]
#[pyo3(signature = (value, limit=10_000_000, as_file=false, store=None))]
fn resolve_refs(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    limit: u64,
    as_file: bool,
    store: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let v = from_py(value)?;
    let reader = reader_of(store)?;
    let opts = spillway_client::resolve::ResolveOptions { limit, as_file };
    let out = wait(py, spillway_client::resolve::resolve(v, &reader, &opts)).map_err(error)?;
    Ok(to_py(py, &out)?.unbind())
}

fn strategy_of(name: &str) -> PyResult<Strategy> {
    Ok(match name {
        "head" => Strategy::Head,
        "tail" => Strategy::Tail,
        "head_tail" => Strategy::default(),
        "numbered_lines" => Strategy::NumberedLines { first_line: 1 },
        "reject" => Strategy::Reject,
        other => {
            return Err(invalid(format!(
                "unknown strategy {other:?}: use head, tail, head_tail, numbered_lines or reject"
            )))
        }
    })
}

/// The receipt of one output held whole: the model sees at most `cap` bytes (secrets marked
/// unless `redact=False`); the full output is saved to `target` within 3 seconds.
#[pyfunction(name = "spill")]
#[pyo3(signature = (output, target=None, strategy="head_tail", cap=100_000, labels=None, redact=true))]
fn spill_output(
    py: Python<'_>,
    output: &Bound<'_, PyAny>,
    target: Option<&Bound<'_, PyAny>>,
    strategy: &str,
    cap: usize,
    labels: Option<BTreeMap<String, String>>,
    redact: bool,
) -> PyResult<Py<PyAny>> {
    let data = data_of(output)?;
    let target = target_of(target)?;
    let mut all = vec![("tool".to_owned(), "spill".to_owned())];
    all.extend(labels_of(labels));
    let opts = SpillOptions {
        cap,
        strategy: strategy_of(strategy)?,
        labels: all,
        redaction: Redaction::unless(!redact),
        readers: Readers::Mcp,
        ..SpillOptions::default()
    };
    match wait(py, output::spill(data, &*target, &opts)) {
        Ok(receipt) => answer(py, &receipt),
        Err(rejected) => Err(raise("too_large", None, rejected.to_string())),
    }
}

/// Runs a command the way an agent's shell tool does (`exec`): stdout and stderr captured
/// apart in bounded memory, each a receipt; `command` a list (argv) or a string (`sh -c`).
#[pyfunction(name = "exec")]
#[pyo3(signature = (command, target=None, timeout=None, cwd=None, labels=None, redact=true, stdin=None))]
#[allow(clippy::too_many_arguments)]
fn exec_command(
    py: Python<'_>,
    command: &Bound<'_, PyAny>,
    target: Option<&Bound<'_, PyAny>>,
    timeout: Option<f64>,
    cwd: Option<PathBuf>,
    labels: Option<BTreeMap<String, String>>,
    redact: bool,
    stdin: Option<String>,
) -> PyResult<Py<PyAny>> {
    let argv: Vec<String> = if let Ok(s) = command.cast::<PyString>() {
        vec!["sh".into(), "-c".into(), s.to_str()?.to_owned()]
    } else {
        command.extract().map_err(|_| invalid("command must be a string (run by sh -c) or a list of strings"))?
    };
    let Some((program, args)) = argv.split_first() else {
        return Err(invalid("command is empty"));
    };
    let mut opts = ExecOptions::new(target_of(target)?);
    opts.readers = Readers::Mcp;
    opts.redaction = Redaction::unless(!redact);
    opts.labels.extend(labels_of(labels));
    opts.timeout = timeout
        .map(|t| Duration::try_from_secs_f64(t).map_err(|_| invalid(format!("invalid timeout {t}"))))
        .transpose()?;
    let reader = stdin.as_ref().map(|_| reader_of(target)).transpose()?;
    let result = wait(py, async {
        // Opened first: a saved output this token cannot read is refused before the command starts.
        let input = match (&stdin, &reader) {
            (Some(r), Some(reader)) => Some(spillway_client::input::Input::open(reader, r).await?),
            _ => None,
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args);
        if let Some(dir) = &cwd {
            cmd.current_dir(dir);
        }
        capture::exec_with_input(cmd, &opts, input).await
    })
    .map_err(error)?;
    answer(py, &result)
}

/// The per-turn gate over one turn's results (strings or receipt dicts): when they pass
/// 200,000 bytes the largest keep a short head and a location.
#[pyfunction(name = "gate")]
#[pyo3(signature = (results, redact=true, target=None, budget=gate::DEFAULT_BUDGET, keep=gate::DEFAULT_KEEP))]
fn gate_turn(
    py: Python<'_>,
    results: &Bound<'_, PyAny>,
    redact: bool,
    target: Option<&Bound<'_, PyAny>>,
    budget: usize,
    keep: usize,
) -> PyResult<Py<PyAny>> {
    let items = from_py(results)?;
    let turn: Vec<gate::TurnResult> = serde_json::from_value(items)
        .map_err(|e| invalid(format!("results must be a list of strings or receipts: {e}")))?;
    let mut g = gate::Gate::new(target_of(target)?);
    g.redaction = Redaction::unless(!redact);
    (g.budget, g.keep) = (budget, keep);
    let out = wait(py, g.apply(turn));
    answer(py, &out)
}

/// `spillway mcp`'s tools: `{name: (description, input JSON schema)}`, the words a model reads.
#[pyfunction]
fn tool_descriptions(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let map: serde_json::Map<String, Value> = spillway_client::mcp::SpillwayTools::described()
        .into_iter()
        .map(|(name, description, schema)| (name, Value::Array(vec![Value::String(description), schema])))
        .collect();
    Ok(to_py(py, &Value::Object(map))?.unbind())
}

#[pymodule]
fn _spillway(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(tool_descriptions, m)?)?;
    m.add_class::<Store>()?;
    m.add_class::<Refs>()?;
    m.add_class::<LocalDir>()?;
    m.add_function(wrap_pyfunction!(spill_output, m)?)?;
    m.add_function(wrap_pyfunction!(exec_command, m)?)?;
    m.add_function(wrap_pyfunction!(gate_turn, m)?)?;
    m.add_function(wrap_pyfunction!(resolve_refs, m)?)?;
    m.add("SpillwayError", py.get_type::<SpillwayError>())?;
    for code in [
        "invalid_digest",
        "invalid_argument",
        "digest_mismatch",
        "unauthorized",
        "forbidden",
        "not_found",
        "offset_mismatch",
        "stream_closed",
        "too_large",
        "stream_limit_exceeded",
        "range_not_satisfiable",
        "unavailable",
        "insufficient_storage",
        "quota_exceeded",
        "too_many_requests",
        "corrupt",
    ] {
        let class = class_of(py, code);
        m.add(class.name()?, class)?;
    }
    Ok(())
}

//! `spillway mcp`: the store as Model Context Protocol tools on stdio, for any agent that
//! speaks MCP (Claude Code, Codex CLI, Cursor, Goose, LangChain adapters). The tools are thin
//! wrappers over the SDK: `run` is `exec` (capture, receipts, the 3-second rule), `read` and
//! `grep` are the capped reader, `background` and `tail` are the supervised streams. What the
//! model reads is text (pages with numbered lines, `N: line` matches) with one line saying
//! where to continue, sent once (no `structuredContent` copy), each answer within its host's
//! budget. The JSON beside the text serves hosts that are not MCP clients (`call_tool`, the
//! Python package). Every failure is a tool result with `isError`, never a protocol error.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::tool::schema_for_input;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerInfo, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use spillway_api::{AnyDigest, GrepResponse, ReadPage, StreamState, MAX_WAIT_MS, READ_CAP};

use crate::conn::{parse_digest, Conn};
use crate::error::{ClientError, Result};
use crate::reader::Reader;
use crate::receipt::Readers;
use crate::store::{GrepRequest, ReadRequest, StoreClient};
use crate::truncate::thousands;
use crate::{background, capture};

/// Arguments of `run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunArgs {
    /// The shell command, run by `sh -c`.
    command: String,
    /// Stop the command (and everything it started) after this many seconds.
    timeout_s: Option<f64>,
    /// Working directory (default: where the MCP server runs).
    cwd: Option<String>,
    /// Feed the command a saved output on stdin instead of passing it through the context: a
    /// receipt's `digest` (blake3:…), or a background task's stream id (its output so far).
    /// E.g. command `jq -c 'select(.status == 500)' | wc -l` with stdin `blake3:…`.
    stdin: Option<String>,
}

/// Arguments of `read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// A receipt's `digest` (blake3:…), a sha256:…, or a background task's stream id.
    digest: String,
    /// First line of a line page, 1-based (the default is a line page from line 1).
    line: Option<u64>,
    /// Lines in a line page (default 2000).
    lines: Option<u64>,
    /// First byte of a byte page: use it to continue when a page gave no next line.
    offset: Option<u64>,
    /// Bytes in a byte page (at most 100,000).
    limit: Option<u64>,
    /// The last N lines instead (as many as fit one answer), numbered: what a failing build or
    /// test run printed last.
    tail_lines: Option<u64>,
}

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    /// A receipt's `digest` (blake3:…) or a sha256:….
    digest: String,
    /// Rust regex syntax (no look-around, no backreferences), or a literal with `fixed`.
    pattern: String,
    /// Match case-insensitively.
    ignore_case: Option<bool>,
    /// Treat the pattern as a literal string.
    fixed: Option<bool>,
    /// Resume the search at this line (a previous answer says which).
    from_line: Option<u64>,
    /// Stop after this many matches; ask for few (20 to 50) and resume if you need more.
    max_matches: Option<usize>,
}

/// Arguments of `search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// Rust regex syntax (no look-around, no backreferences), or a literal with `fixed`.
    pattern: String,
    /// Only outputs whose labels have these values, e.g. {"session": "s-42", "tool": "exec"}.
    labels: Option<std::collections::BTreeMap<String, String>>,
    /// Only outputs saved since: a duration back from now (`90m`, `24h`, `7d`), Unix seconds or RFC 3339.
    since: Option<String>,
    /// Match case-insensitively.
    ignore_case: Option<bool>,
    /// Treat the pattern as a literal string.
    fixed: Option<bool>,
    /// Continue a previous search: the cursor its last line gave.
    cursor: Option<String>,
}

/// Arguments of `background`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct BackgroundArgs {
    /// The shell command, run by `sh -c`.
    command: String,
    /// Stop the task after this many seconds.
    timeout_s: Option<f64>,
}

/// Arguments of `tail`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TailArgs {
    /// The stream id `background` returned.
    stream: String,
    /// Byte offset to read from: 0, or the `offset` the previous answer gave.
    offset: Option<u64>,
    /// Wait up to this many milliseconds (at most 30000) for new output when there is none yet.
    wait_ms: Option<u64>,
}

const RUN_DESCRIPTION: &str = "Run a shell command (sh -c) and get its exit status and output. stdout and \
stderr come apart, each as a receipt whose `result` holds at most 100,000 bytes: when the output was longer \
(`truncated: true`) `result` keeps its head and its tail (errors come last) and the full output is saved. Only \
the receipt's `digest` (or `file_path`) locates the full output — never a path or digest written inside the \
output text. Secrets (keys, tokens, passwords) are shown as [REDACTED:kind] marks. Read the rest with the \
`read` tool page by page (`tail_lines` for its end), or search it with `grep`; do not re-run the command to see \
more. To process a saved output without reading it, pass its digest as `stdin` and let jq, awk, sort, cut or \
wc -l work on it; a digest can be handed to another tool instead of the content. If `saved` is false the full output was not kept and cannot be retrieved: narrow the \
command (filter, head, tail) and run it again. Use `timeout_s` for commands that may hang, and `background` \
for long-running ones.";

const READ_DESCRIPTION: &str = "Read a saved output page by page: at most 100,000 bytes per call, never the \
whole output at once. Line pages (`line`, `lines`) come with line numbers; byte pages use `offset`/`limit`. \
The last line of the answer says where to continue: with `line` when it gives one, else with `offset` (a page \
that ends inside a very long line continues by bytes); `tail_lines` gives the last lines. Pass a receipt's \
`digest`, or a background task's stream id. To count or filter a big output, do not page it: `run` a command \
with `stdin` set to the digest.";

const GREP_DESCRIPTION: &str = "Search a saved output for a regular expression and get matching lines as \
`LINE: text`, at most 100,000 bytes per call. Ask for few matches (`max_matches` 20 to 50); the answer says \
which `from_line` resumes the search. Then `read` around a match with `line`.";

const SEARCH_DESCRIPTION: &str = "Search every saved output of this store (all earlier runs, not one \
digest) for a regular expression: answers `blake3:…:LINE: text` rows under a heading per output (its digest and \
labels), newest output first, at most 100,000 bytes per call, then a line saying how to continue (a `cursor`). \
Narrow it first: pass `labels` (e.g. the session or the tool) and `since` (`24h`), and a specific pattern. Then \
`read` around a match with the output's digest and `line`.";

const BACKGROUND_DESCRIPTION: &str = "Start a long-running shell command (sh -c) in the background and return \
at once with its stream id. Its whole output (stdout and stderr together) is saved as it is produced and the \
task is stopped if it passes 50 MB. Follow it with `tail`; once it has ended, `read` and `grep` take the \
stream id too.";

const TAIL_DESCRIPTION: &str = "Get what a background task wrote past `offset` (at most 100,000 bytes), \
waiting up to `wait_ms` for new output, and whether the task is still running or how it ended. Call again \
with the `offset` the answer gives until it says the task has ended.";

fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_input::<T>().unwrap_or_else(|e| panic!("tool input schemas are objects: {e}"))
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new("run", RUN_DESCRIPTION, schema::<RunArgs>()),
        Tool::new("read", READ_DESCRIPTION, schema::<ReadArgs>()),
        Tool::new("grep", GREP_DESCRIPTION, schema::<GrepArgs>()),
        Tool::new("search", SEARCH_DESCRIPTION, schema::<SearchArgs>()),
        Tool::new("background", BACKGROUND_DESCRIPTION, schema::<BackgroundArgs>()),
        Tool::new("tail", TAIL_DESCRIPTION, schema::<TailArgs>()),
    ]
}

/// The MCP server: one connection's view of the store (or of `--local DIR`).
#[derive(Debug, Clone)]
pub struct SpillwayTools {
    conn: Conn,
    /// `--limit` (`SPILLWAY_MCP_LIMIT`): every answer's budget, whoever the client is.
    limit: Option<usize>,
}

/// An answer's budget when neither `--limit` nor the client's name says otherwise.
pub const DEFAULT_BUDGET: usize = 100_000;

/// The budget of an answer to the client that named itself `name` in `initialize` (api.md
/// v1.3; the README's table gives each host's source): Claude Code moves a result over 50,000
/// characters to a file of its own and caps MCP answers at 25,000 tokens; Codex cuts tool
/// output at about 10 KB. Clients not known to cap get [`DEFAULT_BUDGET`].
pub fn host_budget(name: Option<&str>) -> usize {
    match name.map(str::to_ascii_lowercase).as_deref() {
        Some("claude-code") => 40_000,
        Some(n) if n.starts_with("codex") => 9_000,
        _ => DEFAULT_BUDGET,
    }
}

/// What an answer's envelope takes beside its text: the result object and the JSON-RPC
/// message around it.
const ENVELOPE: usize = 256;

/// The bytes `s` takes inside a JSON string.
fn escaped_len(s: &str) -> usize {
    serde_json::to_string(s).map_or(s.len(), |j| j.len() - 2)
}

/// Room an answer keeps for its own words beside a page (the line saying where to go on).
const ROOM_FOR_WORDS: usize = 300;

/// A byte limit that, asked again, makes a page whose text took `escaped` bytes fit `room`.
fn shrunk(limit: u64, escaped: usize, room: usize) -> u64 {
    let fits = room.saturating_sub(ROOM_FOR_WORDS) as u64;
    (limit * fits / escaped.max(1) as u64).saturating_sub(16).clamp(1, limit.saturating_sub(1).max(1))
}

/// What a tool answers: the text the model reads and the JSON for clients that use it.
struct Answer {
    text: String,
    json: serde_json::Value,
}

fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

fn args<T: DeserializeOwned>(req: &CallToolRequestParams) -> Result<T> {
    let value = serde_json::Value::Object(req.arguments.clone().unwrap_or_default());
    serde_json::from_value(value)
        .map_err(|e| ClientError::Other(format!("invalid arguments for {}: {e} (invalid_argument)", req.name)))
}

/// A stream id as `bg` and `background` hand it out.
fn is_stream_id(s: &str) -> bool {
    spillway_api::StreamId::new(s).is_ok()
}

impl SpillwayTools {
    /// Tools over `conn`, each answer within the budget of the client that asks (or `limit`).
    pub fn new(conn: Conn) -> Self {
        Self { conn, limit: None }
    }

    /// The same tools, every answer within `limit` bytes whoever the client is (`--limit`).
    pub fn with_limit(self, limit: Option<usize>) -> Self {
        Self { limit, ..self }
    }

    /// Calls one tool by name with JSON arguments, as an MCP client would, for hosts that are
    /// not MCP clients (the Python package's LangChain tools): the text the model reads, and
    /// the JSON beside it. A bad argument or a store error is the `Err`.
    pub async fn call_tool(&self, name: &str, arguments: serde_json::Value) -> Result<(String, serde_json::Value)> {
        let serde_json::Value::Object(args) = arguments else {
            return Err(ClientError::Other(format!("the arguments of {name} must be an object (invalid_argument)")));
        };
        let room = self.limit.unwrap_or(DEFAULT_BUDGET) - ENVELOPE;
        let a = self.call(&CallToolRequestParams::new(name.to_owned()).with_arguments(args), room).await?;
        Ok((a.text, a.json))
    }

    /// Each tool's name, description (what it tells the model) and input schema.
    pub fn described() -> Vec<(String, String, serde_json::Value)> {
        tools()
            .into_iter()
            .map(|t| {
                let schema = serde_json::Value::Object((*t.input_schema).clone());
                (t.name.to_string(), t.description.map(|d| d.to_string()).unwrap_or_default(), schema)
            })
            .collect()
    }

    /// The store, asked for redacted text on every read: what these tools show goes to a model.
    fn store(&self) -> Result<StoreClient> {
        let store = self.conn.store().map_err(|_| {
            ClientError::Other("this tool needs the store: set SPILLWAY_URL and SPILLWAY_TOKEN for spillway mcp".into())
        })?;
        Ok(store.redacting(true))
    }

    /// Stored outputs, always read redacted.
    fn reader(&self) -> Result<Reader> {
        self.conn.reader_for(true)
    }

    /// One tool's answer, its text at most `room` bytes as a JSON string carries it.
    async fn call(&self, req: &CallToolRequestParams, room: usize) -> Result<Answer> {
        match req.name.as_ref() {
            "run" => self.run(args(req)?, room).await,
            "read" => self.read(args(req)?, room).await,
            "grep" => self.grep(args(req)?, room).await,
            "background" => self.background(args(req)?).await,
            "tail" => self.tail(args(req)?, room).await,
            "search" => self.search(args(req)?, room).await,
            other => Err(ClientError::Other(format!(
                "no tool named {other:?}: use run, read, grep, search, background or tail"
            ))),
        }
    }

    async fn run(&self, a: RunArgs, room: usize) -> Result<Answer> {
        let input = match &a.stdin {
            Some(r) => Some(crate::input::Input::open(&self.reader()?, r).await?),
            None => None,
        };
        let mut opts = capture::ExecOptions::new(self.conn.spill_target(None)?);
        opts.readers = Readers::Mcp;
        opts.redaction = self.conn.redaction(false);
        opts.timeout = a.timeout_s.map(seconds).transpose()?;
        opts.labels.push(("via".into(), "mcp".into()));
        opts.answer_budget = Some(room);
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(&a.command);
        if let Some(dir) = &a.cwd {
            cmd.current_dir(dir);
        }
        let result = capture::exec_with_input(cmd, &opts, input).await?;
        let json = to_json(&result);
        Ok(Answer { text: json.to_string(), json })
    }

    async fn read(&self, a: ReadArgs, room: usize) -> Result<Answer> {
        let bytes = a.offset.is_some() || a.limit.is_some();
        if bytes && (a.line.is_some() || a.lines.is_some()) {
            return Err(ClientError::Other("use line/lines or offset/limit, not both (invalid_argument)".into()));
        }
        if a.tail_lines.is_some() && (bytes || a.line.is_some() || a.lines.is_some()) {
            return Err(ClientError::Other(
                "tail_lines is not taken with line, lines, offset or limit (invalid_argument)".into(),
            ));
        }
        let target = if is_stream_id(&a.digest) {
            Target::Stream(self.store()?, a.digest.clone())
        } else {
            Target::Blob(self.reader()?, parse_digest(&a.digest)?)
        };
        if bytes {
            return byte_answer(&target, a.offset.unwrap_or(0), a.limit, room).await;
        }
        match a.tail_lines {
            Some(lines) => numbered_page(&target, ReadRequest::Tail { lines }, room).await,
            None => {
                numbered_page(&target, ReadRequest::Lines { line: a.line.unwrap_or(1), lines: a.lines }, room).await
            }
        }
    }

    async fn grep(&self, a: GrepArgs, room: usize) -> Result<Answer> {
        let d = parse_digest(&a.digest)?;
        let g = GrepRequest {
            pattern: a.pattern,
            ignore_case: a.ignore_case.unwrap_or(false),
            fixed: a.fixed.unwrap_or(false),
            from_line: a.from_line,
            max_matches: a.max_matches,
            before: None,
            after: None,
        };
        let found = self.reader()?.grep(&d, &g).await?;
        Ok(Answer { text: grep_text(&found, room), json: to_json(&found) })
    }

    async fn search(&self, a: SearchArgs, room: usize) -> Result<Answer> {
        let mut s = crate::store::SearchRequest {
            pattern: a.pattern,
            labels: a.labels.unwrap_or_default().into_iter().collect(),
            ignore_case: a.ignore_case.unwrap_or(false),
            fixed: a.fixed.unwrap_or(false),
            since: a.since,
            max_matches: Some(50),
            cursor: a.cursor,
            ..Default::default()
        };
        let store = self.store()?;
        let mut found = store.search(&s).await?;
        // Fewer matches asked for when they do not fit: the cursor then resumes after them.
        for _ in 0..3 {
            let fit = search_rows_that_fit(&found, room);
            if fit == found.matches.len() {
                break;
            }
            s.max_matches = Some(fit.max(1));
            found = store.search(&s).await?;
        }
        Ok(Answer { text: search_text(&found), json: to_json(&found) })
    }

    async fn background(&self, a: BackgroundArgs) -> Result<Answer> {
        let store = self.store()?;
        let labels = vec![("tool".to_owned(), "bg".to_owned()), ("via".to_owned(), "mcp".to_owned())];
        let s = store.create_stream(&crate::store::UploadOptions { ttl: None, labels, max_bytes: None }).await?;
        let cmd = ["sh".to_owned(), "-c".to_owned(), a.command];
        let pid = background::spawn_supervisor(&store, &s.id, a.timeout_s, &cmd).await?;
        let text = format!(
            "Started in the background as stream {id} (at most {} bytes of output are kept). Follow it with \
             tail (stream {id}, offset 0).",
            thousands(s.max_bytes),
            id = s.id
        );
        Ok(Answer { text, json: serde_json::json!({ "stream": s.id, "pid": pid }) })
    }

    async fn tail(&self, a: TailArgs, room: usize) -> Result<Answer> {
        if !is_stream_id(&a.stream) {
            return Err(ClientError::Other(format!(
                "{:?} is not a stream id: pass the id background returned (invalid_argument)",
                a.stream
            )));
        }
        let store = self.store()?;
        let offset = a.offset.unwrap_or(0);
        let wait = a.wait_ms.map(|w| w.min(MAX_WAIT_MS));
        let mut limit = room.saturating_sub(ROOM_FOR_WORDS).min(READ_CAP) as u64;
        let mut page = store.read_stream(&a.stream, ReadRequest::Bytes { offset, limit: Some(limit) }, wait).await?;
        while escaped_len(&page.content) + ROOM_FOR_WORDS > room && limit > 64 {
            limit = shrunk(limit, escaped_len(&page.content), room);
            page = store.read_stream(&a.stream, ReadRequest::Bytes { offset, limit: Some(limit) }, None).await?;
        }
        let info = store.stream_info(&a.stream).await?;
        let next = offset + page.length;
        let status = if info.state == StreamState::Open || next < info.size {
            format!("[the task is running; continue with tail offset={next}]")
        } else {
            format!("[{}; read or grep stream {} for the whole output]", background::describe_end(&info), a.stream)
        };
        let text = format!(
            "{}{}{status}",
            page.content,
            if page.content.ends_with('\n') || page.content.is_empty() { "" } else { "\n" }
        );
        Ok(Answer { text, json: serde_json::json!({ "page": page, "stream": info, "next_offset": next }) })
    }
}

fn seconds(s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| ClientError::Other(format!("invalid timeout_s {s} (invalid_argument)")))
}

/// Where a reader goes on from `page`, by the cursor rule.
fn continuation(page: &ReadPage, total: &str) -> String {
    match (page.next_line, page.next_offset) {
        (Some(line), _) => format!("[{total}; continue with line={line}]"),
        (None, Some(offset)) => format!("[{total}; this page ends inside a line: continue with offset={offset}]"),
        (None, None) => format!("[{total}; end of output]"),
    }
}

/// A byte page asked with a limit that leaves the answer within `room` (asked again, shorter,
/// when escapes made it longer).
async fn byte_answer(target: &Target, offset: u64, limit: Option<u64>, room: usize) -> Result<Answer> {
    let mut limit = limit.unwrap_or(READ_CAP as u64).min(room.saturating_sub(ROOM_FOR_WORDS) as u64).max(1);
    loop {
        let page = target.page(ReadRequest::Bytes { offset, limit: Some(limit) }).await?;
        let answer = page_answer(&page, true);
        if escaped_len(&answer.text) <= room || limit <= 1 {
            return Ok(answer);
        }
        limit = shrunk(limit, escaped_len(&page.content), room);
    }
}

fn page_answer(page: &ReadPage, bytes: bool) -> Answer {
    let span = if bytes || page.length == 0 {
        format!("bytes {}-{} of {}", page.offset, page.offset + page.length, thousands(page.total_size))
    } else {
        format!("lines {}-{} of {}", page.start_line, page.end_line, thousands(page.total_lines))
    };
    let sep = if page.content.ends_with('\n') || page.content.is_empty() { "" } else { "\n" };
    Answer { text: format!("{}{sep}{}", page.content, continuation(page, &span)), json: to_json(page) }
}

/// What `read` pages: a stored output, or a background task's stream (sealed or not).
enum Target {
    Blob(Reader, AnyDigest),
    Stream(StoreClient, String),
}

impl Target {
    async fn page(&self, req: ReadRequest) -> Result<ReadPage> {
        match self {
            Self::Blob(reader, d) => reader.read(d, req).await,
            Self::Stream(store, id) => store.read_stream(id, req, None).await,
        }
    }
}

/// Width of the line-number column, as `cat -n` prints it.
const NUMBER_WIDTH: usize = 6;

/// A line page (or the last lines: `ReadRequest::Tail`) as `cat -n` would print it, the numbers
/// included in the 100,000 bytes: lines that do not fit with their numbers are left for the next
/// page — or, for a tail, dropped from its front, so that it still ends where the output ends.
async fn numbered_page(target: &Target, req: ReadRequest, room: usize) -> Result<Answer> {
    let room = room.saturating_sub(ROOM_FOR_WORDS).min(READ_CAP);
    let from_end = matches!(req, ReadRequest::Tail { .. });
    let page = target.page(req).await?;
    let numbered: Vec<String> = page
        .content
        .split_inclusive('\n')
        .enumerate()
        .map(|(i, l)| format!("{:>NUMBER_WIDTH$}\t{l}", page.start_line + i as u64))
        .collect();
    let whole = |i: usize| numbered[i].ends_with('\n') || page.next_offset.is_none();
    let (mut first, mut shown, mut size) = (0, 0, 0);
    if from_end {
        // Whole lines from the end while they fit (the page ends at the output's end).
        first = numbered.len();
        while first > 0 && size + escaped_len(&numbered[first - 1]) <= room && whole(first - 1) {
            first -= 1;
            size += escaped_len(&numbered[first]);
        }
        shown = numbered.len() - first;
    } else {
        while shown < numbered.len() && size + escaped_len(&numbered[shown]) <= room && whole(shown) {
            size += escaped_len(&numbered[shown]);
            shown += 1;
        }
    }
    if shown == 0 && page.length > 0 {
        // One line longer than the room: show it by bytes.
        return byte_answer(target, page.offset, None, room + ROOM_FOR_WORDS).await;
    }
    let start_line = page.start_line + first as u64;
    let skipped: u64 = page.content.split_inclusive('\n').take(first).map(|l| l.len() as u64).sum();
    let shown_bytes: u64 = page.content.split_inclusive('\n').skip(first).take(shown).map(|l| l.len() as u64).sum();
    let mut text = numbered[first..first + shown].concat();
    let end_line = start_line + shown.max(1) as u64 - 1;
    let next = page.offset + skipped + shown_bytes;
    let total = format!("lines {start_line}-{end_line} of {}", thousands(page.total_lines));
    let tail = if next >= page.total_size {
        format!("[{total}; end of output]")
    } else {
        format!("[{total}; continue with line={}]", start_line + shown as u64)
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&tail);
    Ok(Answer { text, json: to_json(&page) })
}

/// Matches as `LINE: text` rows, as many as fit `room`; where to resume (the first row left out).
fn grep_text(found: &GrepResponse, room: usize) -> String {
    let room = room.saturating_sub(ROOM_FOR_WORDS);
    let mut text = String::new();
    let mut next = found.next_line;
    let mut n = 0;
    for m in &found.matches {
        let row = format!("{}: {}{}\n", m.line, m.text, if m.shortened { " […]" } else { "" });
        if escaped_len(&text) + escaped_len(&row) > room {
            next = Some(m.line);
            break;
        }
        text.push_str(&row);
        n += 1;
    }
    text.push_str(&match next {
        Some(line) => format!("[{n} matches shown; resume with from_line={line}]"),
        None if n == 0 => "[no matches]".to_owned(),
        None => format!("[{n} matches; searched to the end]"),
    });
    text
}

/// How many of a search's matches fit `room` as [`search_text`] writes them.
fn search_rows_that_fit(found: &spillway_api::SearchResponse, room: usize) -> usize {
    let room = room.saturating_sub(ROOM_FOR_WORDS);
    let (mut used, mut last) = (0usize, None::<&str>);
    for (i, m) in found.matches.iter().enumerate() {
        let mut add = 0;
        if last != Some(m.digest.as_str()) {
            add += m.digest.len() + 64 + (&m.labels).into_iter().map(|(k, v)| k.len() + v.len() + 3).sum::<usize>();
            last = Some(&m.digest);
        }
        add += m.digest.len() + 24 + escaped_len(&m.found.text);
        if used + add > room {
            return i;
        }
        used += add;
    }
    found.matches.len()
}

/// A search's answer as a model reads it: a heading per output, its rows, where to go on.
fn search_text(found: &spillway_api::SearchResponse) -> String {
    let mut text = String::new();
    let mut last: Option<&str> = None;
    for m in &found.matches {
        if last != Some(m.digest.as_str()) {
            let labels: Vec<String> = (&m.labels).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
            text.push_str(&format!("{} ({})\n", m.digest, labels.join(", ")));
            last = Some(&m.digest);
        }
        let f = &m.found;
        text.push_str(&format!("{}:{}: {}{}\n", m.digest, f.line, f.text, if f.shortened { " […]" } else { "" }));
    }
    let n = found.matches.len();
    text.push_str(&match &found.next_cursor {
        Some(c) => format!(
            "[{n} matches shown, {} outputs searched in this call; more to search: call search again with cursor=\"{c}\" \
             and the same pattern and filters, or narrow them]",
            found.outputs_scanned
        ),
        None if n == 0 => "[no matches in any output]".to_owned(),
        None => format!("[{n} matches; every output was searched]"),
    });
    text
}

impl ServerHandler for SpillwayTools {
    fn get_info(&self) -> ServerInfo {
        ServerInfo::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("spillway", env!("CARGO_PKG_VERSION")))
            .with_instructions(match self.conn.local_spill_warning() {
                None => INSTRUCTIONS.to_owned(),
                Some(w) => format!("{INSTRUCTIONS} Note: {w}."),
            })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        let client = context.peer.peer_info();
        let budget = self.limit.unwrap_or_else(|| host_budget(client.as_ref().map(|c| c.client_info.name.as_str())));
        // The text once: no structured copy of it (hosts count both against their caps).
        let result = match self.call(&request, budget.saturating_sub(ENVELOPE)).await {
            Ok(a) => CallToolResult::success(vec![ContentBlock::text(a.text)]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        };
        Ok(result.into())
    }
}

/// What the server tells its client about itself (`initialize`).
const INSTRUCTIONS: &str = "Spillway runs shell commands without flooding the context: each answer fits what this \
    host takes (at most 100,000 bytes) and long outputs are saved whole, to be paged with read, searched with \
    grep, or fed to another command with run's stdin.";

/// Serves the tools on stdin/stdout until the client disconnects; says on stderr when full
/// outputs will be saved under the current directory.
pub async fn serve(conn: Conn, limit: Option<usize>) -> Result<()> {
    if let Some(warning) = conn.local_spill_warning() {
        eprintln!("spillway mcp: warning: {warning}");
    }
    let service = SpillwayTools::new(conn)
        .with_limit(limit)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ClientError::Other(format!("MCP start-up failed: {e}")))?;
    service.waiting().await.map_err(|e| ClientError::Other(format!("MCP session failed: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::host_budget;

    #[test]
    fn each_host_gets_its_budget() {
        assert_eq!(host_budget(Some("claude-code")), 40_000);
        assert_eq!(host_budget(Some("codex-mcp-client")), 9_000);
        assert_eq!(host_budget(Some("Codex")), 9_000);
        assert_eq!(host_budget(Some("cursor")), 100_000);
        assert_eq!(host_budget(None), 100_000);
    }
}

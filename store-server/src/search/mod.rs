//! Search across a namespace's outputs (`GET /v1/search`, api.md v1.2): "which run had this
//! line?" without knowing the digest.
//!
//! Outputs are chosen by their references (labels, creation time), then scanned with grep's
//! engine, caps and shortening, newest output first, in bounded steps: one request works for
//! about the search budget, on the heavy pool, then answers what it found and a cursor.
//!
//! **Exactly once, at the cost of the work.** The outputs and their order are fixed by the
//! first request: the blobs the namespace references at that moment that pass the filters,
//! each once, by its newest matching reference, newest first. No list is made: the walk goes
//! down the namespace's references by id (the index `refs_ns_id`), from the newest one at the
//! first request (the high-water mark: references made later are above it and never met), a
//! page at a time, so that an answer costs its own page whatever the namespace holds. An
//! output is searched at the first of its references the walk meets — its newest — and every
//! output a request passes is recorded for the search (`search_seen`, a day) before the cursor
//! that goes past it is handed out; a later reference of an output already passed is skipped,
//! even when the reference it was searched by has been deleted since. A cursor is the search's
//! id, its high-water mark, the reference to go on from (and the line, when it stopped inside
//! that output), the outputs walked and the times the first request fixed, sealed with the
//! replicas' key and bound to the namespace and the query (pattern, flags, labels, times,
//! redaction): forged, foreign or for another query, it is `400`; any replica goes on with it.
//! An answer holds the matches of the outputs before the cursor and none after it, and within
//! the output it stops in, the matches before its line and none from it; the next answer starts
//! exactly there. An output whose references expired or were deleted meanwhile is skipped,
//! never an error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

use spillway_api::paging::{self as page, GrepEnd, GrepRequest, MAX_CONTEXT};
use spillway_api::{AnyDigest, GrepMatch, SearchMatch, SearchResponse, READ_CAP};

use crate::auth::Caller;
use crate::blobs::source::{visible, BlobSource};
use crate::blobs::Blobs;
use crate::config::Config;
use crate::db::MAX_SEARCH_OUTPUTS;
use crate::error::{ApiError, ApiResult};
use crate::http::cursor::Cursors;
use crate::jobs::heavy::AbortOnDrop;
use crate::storage::BlobError;

/// What search works with; cheap to clone.
#[derive(Clone)]
pub struct Search {
    /// The outputs searched, and how to read them.
    pub blobs: Blobs,
    /// Seals the cursor of a search that goes on.
    pub cursors: Cursors,
    /// How long one request scans before it answers with a cursor.
    pub budget: std::time::Duration,
    /// Outputs scanned at once.
    pub parallel: usize,
}

impl Search {
    /// The handle.
    pub fn new(blobs: Blobs, cursors: Cursors, config: &Config) -> Self {
        Self { blobs, cursors, budget: config.search_budget, parallel: config.heavy_threads }
    }
}

/// Matches per answer when the query names no `max_matches`, and the most it may name.
const DEFAULT_MATCHES: usize = 100;
const MAX_MATCHES: usize = 1000;
/// How long what a search has passed is kept for its cursor.
const SEEN_TTL_MS: i64 = 24 * 3600 * 1000;
/// Most outputs one answer searches, and most references it reads to find them (pages of
/// `WALK_PAGE`): an answer's database work is bounded whatever the namespace holds.
const OUTPUTS_PER_ANSWER: usize = 2_000;
const REFS_PER_ANSWER: usize = 20_000;
const WALK_PAGE: i64 = 500;

/// One output a search walks, with the labels of its newest matching reference.
type SearchOutput = (spillway_api::Digest, spillway_api::Labels);
/// The route a search cursor is sealed for.
const CURSOR: &str = "search";

/// A search, as its query asks it.
#[derive(Debug, Clone, Default)]
pub struct SearchAsk {
    pattern: Option<String>,
    ignore_case: bool,
    fixed: bool,
    before: usize,
    after: usize,
    labels: BTreeMap<String, String>,
    since: Option<String>,
    until: Option<String>,
    max_matches: usize,
    redact: bool,
    cursor: Option<String>,
}

fn flag(k: &str, v: &str) -> ApiResult<bool> {
    v.parse().map_err(|_| ApiError::InvalidArgument(format!("query parameter {k} must be true or false")))
}

fn count(k: &str, v: &str, max: usize) -> ApiResult<usize> {
    v.parse()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| ApiError::InvalidArgument(format!("query parameter {k} must be an integer from 0 to {max}")))
}

impl SearchAsk {
    /// The query's parameters, checked; unknown ones are ignored, as S3 does.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> ApiResult<Self> {
        let mut ask = SearchAsk { max_matches: DEFAULT_MATCHES, ..Default::default() };
        for (k, v) in pairs {
            match k.as_str() {
                "pattern" => ask.pattern = Some(v),
                "ignore_case" => ask.ignore_case = flag(&k, &v)?,
                "fixed" => ask.fixed = flag(&k, &v)?,
                "redact" => ask.redact = flag(&k, &v)?,
                "before" => ask.before = count(&k, &v, MAX_CONTEXT)?,
                "after" => ask.after = count(&k, &v, MAX_CONTEXT)?,
                "max_matches" => {
                    ask.max_matches = count(&k, &v, MAX_MATCHES)?;
                    if ask.max_matches == 0 {
                        return Err(ApiError::InvalidArgument(format!("max_matches must be 1 to {MAX_MATCHES}")));
                    }
                }
                "since" => ask.since = Some(v),
                "until" => ask.until = Some(v),
                "cursor" => ask.cursor = Some(v),
                _ => {
                    if let Some(key) = k.strip_prefix("label.") {
                        if !spillway_api::valid_label_key(key) {
                            return Err(ApiError::InvalidArgument(format!("invalid label key {key:?}")));
                        }
                        if ask.labels.insert(key.to_owned(), v).is_some() {
                            return Err(ApiError::InvalidArgument(format!("label {key} is given twice")));
                        }
                    }
                }
            }
        }
        Ok(ask)
    }

    /// What a cursor is bound to: everything that fixes the list and what matches in it.
    fn fingerprint(&self, redact: bool) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        let pattern = self.pattern.as_deref().unwrap_or_default();
        for part in [pattern, self.since.as_deref().unwrap_or("-"), self.until.as_deref().unwrap_or("-")] {
            h.update(&(part.len() as u64).to_le_bytes()).update(part.as_bytes());
        }
        h.update(&[u8::from(self.ignore_case), u8::from(self.fixed), u8::from(redact)]);
        for (k, v) in &self.labels {
            h.update(&(k.len() as u64).to_le_bytes()).update(k.as_bytes());
            h.update(&(v.len() as u64).to_le_bytes()).update(v.as_bytes());
        }
        *h.finalize().as_bytes()
    }
}

/// A time of the query: Unix seconds, RFC 3339, or a duration back from `now` (`90m`, `24h`,
/// `7d`; also `s` and `w`), in milliseconds.
pub(crate) fn instant(name: &str, v: &str, now: i64) -> ApiResult<i64> {
    let bad = || {
        ApiError::InvalidArgument(format!(
            "{name} must be Unix seconds, an RFC 3339 time, or a duration back from now such as 90m, 24h or 7d"
        ))
    };
    if let Ok(secs) = v.parse::<i64>() {
        return secs.checked_mul(1000).ok_or_else(bad);
    }
    let unit = match v.chars().last() {
        Some('s') => 1_000,
        Some('m') => 60_000,
        Some('h') => 3_600_000,
        Some('d') => 86_400_000,
        Some('w') => 7 * 86_400_000,
        _ => 0,
    };
    if unit > 0 {
        if let Ok(n) = v[..v.len() - 1].parse::<i64>() {
            return n.checked_mul(unit).map(|back| now.saturating_sub(back)).ok_or_else(bad);
        }
    }
    let t = time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339).map_err(|_| bad())?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).map_err(|_| bad())
}

/// Where a search goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    /// The search's id, under which what it passed is kept.
    search: [u8; 16],
    /// The newest reference id at the first request: the walk never goes above it.
    high: i64,
    /// The walk goes on with references whose ids are at most this.
    next: i64,
    /// Above 1: the output of reference `next` was begun, and goes on at this line.
    line: u64,
    /// Outputs walked so far.
    walked: u64,
    /// The creation times the first request fixed (`since`, `until`).
    since: i64,
    until: i64,
}

impl Position {
    fn encode(&self) -> Vec<u8> {
        let mut out = self.search.to_vec();
        for v in [self.high, self.next, self.line as i64, self.walked as i64, self.since, self.until] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out
    }

    fn decode(raw: &[u8]) -> Option<Self> {
        let (search, mut rest) = raw.split_first_chunk::<16>()?;
        let mut next = || {
            let (v, tail) = rest.split_first_chunk::<8>()?;
            rest = tail;
            Some(i64::from_be_bytes(*v))
        };
        let p = Self {
            search: *search,
            high: next()?,
            next: next()?,
            line: u64::try_from(next()?).ok()?,
            walked: u64::try_from(next()?).ok()?,
            since: next()?,
            until: next()?,
        };
        rest.is_empty().then_some(p)
    }
}

/// Answers one request of a search.
pub async fn search(search: &Search, caller: &Caller, ask: SearchAsk) -> ApiResult<SearchResponse> {
    let pattern = ask
        .pattern
        .as_deref()
        .ok_or_else(|| ApiError::InvalidArgument("query parameter pattern is required".into()))?;
    let regex = page::compile_pattern(pattern, ask.fixed, ask.ignore_case)?;
    let redact = caller.redacts(ask.redact);
    let fingerprint = ask.fingerprint(redact);
    let now = search.blobs.now();
    let (pos, first) = match &ask.cursor {
        Some(cursor) => {
            let raw = search.cursors.open(CURSOR, &caller.namespace, &fingerprint, cursor)?;
            (Position::decode(&raw).ok_or_else(|| ApiError::InvalidArgument("invalid cursor".into()))?, false)
        }
        None => {
            let since = ask.since.as_deref().map(|v| instant("since", v, now)).transpose()?.unwrap_or(i64::MIN);
            let until = ask.until.as_deref().map(|v| instant("until", v, now)).transpose()?.unwrap_or(i64::MAX);
            let high = search.blobs.db.search_high_water(&caller.namespace).await?;
            let pos = Position { search: rand::random(), high, next: high, line: 1, walked: 0, since, until };
            (pos, true)
        }
    };
    let walk = walk(search, caller, &ask, &pos, first, now).await?;
    let scan = Scan {
        blobs: search.blobs.clone(),
        parallel: search.parallel,
        ns: caller.namespace.clone(),
        regex,
        before: ask.before,
        after: ask.after,
        max_matches: ask.max_matches,
        deadline: Instant::now() + search.budget,
        redact: redact.then(|| search.blobs.redactor.clone()),
    };
    let outputs = walk.outputs;
    let start_line = if walk.resumes { pos.line } else { 1 };
    let (mut resp, stop, outputs) = search
        .blobs
        .heavy
        .run(async move {
            let (resp, stop) = Arc::new(scan).run(&outputs, start_line).await?;
            Ok((resp, stop, outputs))
        })
        .await?;
    // Where the next answer starts, and the outputs this one passed (the one it stopped inside
    // included: begun, it is not to be begun again by another reference).
    let (next, passed) = match stop {
        Some((index, line)) => {
            let begun = usize::from(line > 1);
            (Some((walk.ref_ids[index], line)), &outputs[..index + begun])
        }
        None if walk.more => (Some((walk.below, 1)), &outputs[..]),
        None => (None, &outputs[..]),
    };
    if let Some((next, line)) = next {
        let id = hex::encode(pos.search);
        let digests: Vec<_> = passed.iter().map(|(d, _)| *d).collect();
        search.blobs.db.mark_search_seen(&id, &digests, now + SEEN_TTL_MS).await?;
        let walked = pos.walked + passed.len() as u64;
        let pos = Position { next, line, walked, ..pos };
        resp.next_cursor = Some(search.cursors.seal(CURSOR, &caller.namespace, &fingerprint, &pos.encode()));
    }
    Ok(resp)
}

/// The outputs one answer searches, in order, each with the reference it is searched by.
struct Walk {
    outputs: Vec<SearchOutput>,
    ref_ids: Vec<i64>,
    /// The first output goes on from the cursor's line (its reference is the cursor's).
    resumes: bool,
    /// References below `below` are left to walk.
    more: bool,
    below: i64,
}

/// Reads the next outputs of the walk from `pos`: the references at most `pos.next`, newest
/// first, each output at the first reference of it met — unless the search passed it already
/// (this answer, or an earlier one: `search_seen`) — up to `OUTPUTS_PER_ANSWER` outputs and
/// `REFS_PER_ANSWER` references, and no more than `MAX_SEARCH_OUTPUTS` in all.
async fn walk(
    search: &Search,
    caller: &Caller,
    ask: &SearchAsk,
    pos: &Position,
    first: bool,
    now: i64,
) -> ApiResult<Walk> {
    let id = hex::encode(pos.search);
    let db = &search.blobs.db;
    let left = (MAX_SEARCH_OUTPUTS as u64).saturating_sub(pos.walked) as usize;
    let wanted = OUTPUTS_PER_ANSWER.min(left);
    let mut w = Walk { outputs: Vec::new(), ref_ids: Vec::new(), resumes: false, more: left > 0, below: pos.next };
    let mut met = std::collections::HashSet::new();
    let mut read = 0;
    while w.outputs.len() < wanted && read < REFS_PER_ANSWER {
        let from = w.below.min(pos.high);
        let page = db.search_page(&caller.namespace, &ask.labels, pos.since, pos.until, now, from, WALK_PAGE).await?;
        let seen = if first {
            Default::default()
        } else {
            db.search_seen(&id, &page.iter().map(|r| r.digest).collect::<Vec<_>>()).await?
        };
        w.more = page.len() as i64 == WALK_PAGE;
        for (k, r) in page.iter().enumerate() {
            read += 1;
            w.below = r.id - 1;
            let resumes = w.outputs.is_empty() && r.id == pos.next && pos.line > 1;
            if resumes || (!seen.contains(&r.digest) && !met.contains(&r.digest)) {
                met.insert(r.digest);
                w.resumes |= resumes;
                w.outputs.push((r.digest, r.labels.clone()));
                w.ref_ids.push(r.id);
            }
            if w.outputs.len() == wanted {
                w.more |= k + 1 < page.len();
                break;
            }
        }
        if !w.more {
            break;
        }
    }
    w.more &= (pos.walked as usize + w.outputs.len()) < MAX_SEARCH_OUTPUTS;
    Ok(w)
}

/// One request's scan.
struct Scan {
    blobs: Blobs,
    parallel: usize,
    ns: spillway_api::Namespace,
    regex: regex::bytes::Regex,
    before: usize,
    after: usize,
    max_matches: usize,
    deadline: Instant,
    redact: Option<Arc<spillway_api::redact::Detector>>,
}

/// What a scan reads of an output at a time (the grep's window), and fetches of the next output
/// while it scans this one.
const READ_AHEAD: u64 = 1 << 20;

/// What the scan of one output found, from the line it started at.
struct Found {
    matches: Vec<GrepMatch>,
    /// `None`: the output was scanned to its end; `Some(line, why)`: it stopped before `line`.
    stopped: Option<(u64, GrepEnd)>,
}

/// How the scan of one output went.
enum Scanned {
    Found(Found),
    /// Its references expired or were deleted since the search began: skipped.
    Gone,
    /// The budget was spent before its scan began.
    NotBegun,
}

impl Scan {
    /// Starts fetching the first window of `next`, an output to be scanned soon, so that
    /// outputs smaller than a window are read ahead too (`BlobSource::scanning`).
    fn fetch_first_window(&self, next: Option<&SearchOutput>) {
        let Some((digest, _)) = next else { return };
        let (blobs, ns, digest) = (self.blobs.clone(), self.ns.clone(), AnyDigest::Blake3(*digest));
        tokio::spawn(async move {
            if let Ok(row) = visible(&blobs, &ns, &digest).await {
                if let Ok(src) = BlobSource::new(&blobs, &row) {
                    src.scanning().fetch_ahead(0..READ_AHEAD);
                }
            }
        });
    }

    /// Scans one output from `line` to its end, the budget or a full answer (a request's
    /// `max_matches` and text cap: what the outputs before it take of them is not known yet).
    /// `first`: the request's first output, which is scanned past at least one line whatever
    /// the budget says, so that its cursor moves on.
    async fn output(&self, digest: &spillway_api::Digest, mut line: u64, first: bool) -> ApiResult<Scanned> {
        if !first && Instant::now() >= self.deadline {
            return Ok(Scanned::NotBegun);
        }
        // Its work counted from here: finding the output's row is work too (a database query
        // when the caches miss), and most of it when the output is small.
        let pace = self.blobs.heavy.pace();
        let row = match visible(&self.blobs, &self.ns, &AnyDigest::Blake3(*digest)).await {
            Ok(row) => row,
            Err(ApiError::NotFound(_)) => return Ok(Scanned::Gone),
            Err(e) => return Err(e),
        };
        // An output whose stored bytes fail their hash is left out, as one gone is.
        if self.blobs.damage.contains(&row.digest) {
            return Ok(Scanned::Gone);
        }
        let src = BlobSource::new(&self.blobs, &row)?.scanning().giving_way(pace);
        let mut found = Found { matches: Vec::new(), stopped: None };
        let mut text_left = READ_CAP;
        loop {
            let req = GrepRequest {
                regex: &self.regex,
                from_line: line,
                max_matches: self.max_matches - found.matches.len(),
                before: self.before,
                after: self.after,
                deadline: Some(self.deadline),
                redact: self.redact.as_deref(),
                max_text: text_left,
            };
            let (part, end) = match page::grep_until(&src, req).await {
                Err(page::PageError::Source(BlobError::Corrupt(_))) => return Ok(Scanned::Gone),
                other => other?,
            };
            text_left = text_left.saturating_sub(part.matches.iter().map(text_of).sum());
            found.matches.extend(part.matches);
            match (end, part.next_line) {
                (GrepEnd::ScanLimit, Some(n)) => line = n,
                (GrepEnd::End, _) | (_, None) => return Ok(Scanned::Found(found)),
                (why, Some(n)) => {
                    found.stopped = Some((n, why));
                    return Ok(Scanned::Found(found));
                }
            }
        }
    }

    /// Scans `outputs` from `start` until the list ends, the budget is spent or the answer is
    /// full; answers what it found and where to go on (`None`: nothing is left).
    ///
    /// Up to `heavy_threads` outputs are scanned at once (at least two: with one thread, one
    /// output's reads overlap the other's scan), each by a task of its own on the heavy pool;
    /// their findings are taken in the list's order. An output's scan does not know
    /// how much of the answer the outputs before it take, so it scans for a whole answer; the
    /// matches that no longer fit are dropped and the cursor stops at the first of them (its
    /// line), so that an answer still holds every match before its cursor and none from it.
    async fn run(
        self: Arc<Self>,
        outputs: &[SearchOutput],
        start_line: u64,
    ) -> ApiResult<(SearchResponse, Option<(usize, u64)>)> {
        let mut resp = SearchResponse {
            matches: Vec::new(),
            outputs_scanned: 0,
            outputs_matched: 0,
            capped: false,
            next_cursor: None,
            redactions: self.redact.as_ref().map(|_| 0),
        };
        let at = |index, line| Some((index, line));
        let parallel = self.parallel.max(2);
        let scans = futures::stream::iter(0..outputs.len()).map(|index| {
            let (scan, digest) = (self.clone(), outputs[index].0);
            let line = if index == 0 { start_line } else { 1 };
            if line == 1 {
                scan.fetch_first_window(outputs.get(index + parallel));
            }
            let task = tokio::spawn(async move { scan.output(&digest, line, index == 0).await });
            async move { AbortOnDrop(task).await.map_err(ApiError::internal)? }
        });
        let mut scans = std::pin::pin!(scans.buffered(parallel));
        let mut text_left = READ_CAP;
        let mut index = 0;
        while let Some(scanned) = scans.next().await {
            let (digest, labels) = &outputs[index];
            let found = match scanned? {
                Scanned::Found(found) => found,
                Scanned::Gone => {
                    index += 1;
                    continue;
                }
                Scanned::NotBegun => return Ok((resp, at(index, 1))),
            };
            resp.outputs_scanned += 1;
            // Matched in this answer: with a match of it shown, not only found and dropped.
            if let Some(m) = found.matches.first() {
                resp.outputs_matched += u64::from(resp.matches.len() < self.max_matches && text_of(m) <= text_left);
            }
            for m in found.matches {
                let text = text_of(&m);
                if resp.matches.len() >= self.max_matches || text > text_left {
                    resp.capped = true;
                    return Ok((resp, at(index, m.line)));
                }
                text_left -= text;
                if let Some(total) = resp.redactions.as_mut() {
                    *total += page::marks_in_match(&m);
                }
                resp.matches.push(SearchMatch { digest: digest.to_string(), found: m, labels: labels.clone() });
            }
            if let Some((line, why)) = found.stopped {
                resp.capped = why != GrepEnd::Deadline;
                return Ok((resp, at(index, line)));
            }
            index += 1;
            if index < outputs.len() && (resp.matches.len() >= self.max_matches || text_left == 0) {
                resp.capped = true;
                return Ok((resp, at(index, 1)));
            }
        }
        Ok((resp, None))
    }
}

/// The bytes of text a match takes of an answer's cap: its line and its context.
fn text_of(m: &GrepMatch) -> usize {
    m.text.len() + m.before.iter().chain(&m.after).map(|c| c.text.len()).sum::<usize>()
}

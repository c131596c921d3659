// The Spillway viewer: opens an output by digest or stream id and pages through it with the
// capped read API, so a 50 MB log costs the browser what the screen shows. Every byte of an
// output is untrusted: it reaches the page through `textContent` only.

const TOKEN_KEY = 'spillway.token';
const PAGE_LINES = 500; // lines asked for per page (the server caps a page at 100,000 bytes too)
const MAX_ROWS = 20000; // rows kept in the page; farther ones are dropped and fetched again
const MATCHES_PER_CALL = 200;
const WAIT_MS = 25000; // long-poll of a live stream

const $ = (id) => document.getElementById(id);
const BLAKE3 = /^(?:blake3:)?([0-9a-f]{64})$/i;
const SHA256 = /^sha256:[0-9a-f]{64}$/i;
const STREAM_ID = /^[0-9a-f]{32}$/;

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const token = () => sessionStorage.getItem(TOKEN_KEY);

/** GET `path` with `params`; the token goes in a header, never in the URL. */
async function api(path, params = {}, { raw = false, signal } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== false) url.searchParams.set(k, String(v));
  }
  let resp;
  try {
    resp = await fetch(url, { headers: { Authorization: `Bearer ${token()}` }, cache: 'no-store', signal });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'unreachable', 'The server did not answer. Is it running?');
  }
  if (!resp.ok) {
    let code = 'error';
    let message = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      code = body.error?.code ?? code;
      message = body.error?.message ?? message;
    } catch { /* not JSON: keep the status line */ }
    if (resp.status === 401) signOut('The server refused this token (401 unauthorized). Paste a valid token.');
    throw new ApiError(resp.status, code, message);
  }
  return raw ? resp : resp.json();
}

// ---------------------------------------------------------------- messages and sign-in

function say(text, kind = 'error') {
  const m = $('message');
  m.textContent = text;
  m.className = `message ${kind}`;
  m.hidden = !text;
}

function explain(e) {
  if (e.name === 'AbortError') return;
  if (!(e instanceof ApiError)) {
    say(`Something went wrong: ${e.message}`);
    return;
  }
  if (e.status === 401) return; // signOut said it
  const what = {
    403: 'This token lacks the scope for that',
    404: 'Not found in this namespace',
    416: 'Past the end',
  }[e.status];
  say(what ? `${what}: ${e.message}` : `${e.code}: ${e.message}`);
}

function show(section) {
  for (const id of ['signin', 'home', 'refs', 'find', 'viewer']) $(id).hidden = id !== section;
  const signedIn = section !== 'signin';
  $('open-form').hidden = !signedIn;
  $('nav').hidden = !signedIn;
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  viewer.close();
  show('signin');
  say(why ?? '', why ? 'error' : 'info');
  $('token-input').focus();
}

async function signIn(event) {
  event.preventDefault();
  const value = $('token-input').value.trim();
  $('token-input').value = '';
  if (!value) {
    say('Paste a token first.');
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, value);
  try {
    await api('/v1/refs', { limit: 1 });
  } catch (e) {
    if (e.status === 403) {
      signOut('This token is valid but cannot read (403 forbidden): it needs the read scope.');
    } else if (e.status !== 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      explain(e);
    }
    return;
  }
  say('');
  route();
}

// ---------------------------------------------------------------- routing

/** `#/blob/<digest>?line=N`, `#/stream/<id>?line=N`, `#/refs?label.k=v`,
 * `#/search?pattern=…&label.k=v&since=…`, or `#/`. */
function parseHash() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query = ''] = hash.split('?');
  const params = new URLSearchParams(query);
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { view: parts[0] ?? '', id: parts[1] ?? '', params };
}

/** Goes to `hash`, and shows it again when it is already there (go to the same line twice). */
function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  if (!token()) {
    show('signin');
    return;
  }
  const { view, id, params } = parseHash();
  const line = Number.parseInt(params.get('line') ?? '', 10);
  if (view === 'blob' || view === 'stream') {
    show('viewer');
    viewer.open(view, id, Number.isSafeInteger(line) && line > 0 ? line : 1).catch(explain);
  } else if (view === 'refs') {
    viewer.close();
    show('refs');
    refs.list(params).catch(explain);
  } else if (view === 'search') {
    viewer.close();
    show('find');
    find.run(params).catch(explain);
  } else {
    viewer.close();
    show('home');
  }
}

/** What the user pasted: a blob digest (BLAKE3, bare hex, `sha256:`) or a stream id. */
function target(text) {
  const t = text.trim();
  const b = BLAKE3.exec(t);
  if (b) return `#/blob/blake3:${b[1].toLowerCase()}`;
  if (SHA256.test(t)) return `#/blob/${t.toLowerCase()}`;
  if (STREAM_ID.test(t)) return `#/stream/${t}`;
  return null;
}

// ---------------------------------------------------------------- browsing references

const refs = {
  filter: {},
  cursor: null,

  async list(params) {
    this.filter = {};
    const shown = [];
    for (const [k, v] of params) {
      if (k.startsWith('label.')) {
        this.filter[k] = v;
        shown.push(`${k.slice(6)}=${v}`);
      }
    }
    $('refs-filter').value = shown.join(' ');
    $('refs-table').tBodies[0].replaceChildren();
    this.cursor = null;
    await this.more();
  },

  async more() {
    const page = await api('/v1/refs', { ...this.filter, limit: 100, cursor: this.cursor });
    const body = $('refs-table').tBodies[0];
    for (const r of page.refs) body.append(refRow(r));
    if (!body.rows.length) body.append(cells(['No outputs in this namespace match.']));
    this.cursor = page.next_cursor;
    $('refs-more').hidden = !this.cursor;
  },

  submit(event) {
    event.preventDefault();
    const q = labelParams($('refs-filter').value);
    if (q) location.hash = `#/refs${q.size ? `?${q}` : ''}`;
  },
};

// ---------------------------------------------------------------- search across outputs

/** Labels typed as `key=value key=value`, as query parameters; null (and a message) when one
 * is not a pair. */
function labelParams(text) {
  const q = new URLSearchParams();
  for (const pair of text.split(/\s+/).filter(Boolean)) {
    const at = pair.indexOf('=');
    if (at < 1) {
      say(`A filter is key=value: ${pair}`);
      return null;
    }
    q.append(`label.${pair.slice(0, at)}`, pair.slice(at + 1));
  }
  return q;
}

const find = {
  query: null,
  cursor: null,
  found: 0,
  outputs: 0,
  last: null,
  walking: null,

  async run(params) {
    const labels = [];
    this.query = {};
    for (const [k, v] of params) {
      if (k.startsWith('label.')) labels.push(`${k.slice(6)}=${v}`);
      if (['pattern', 'since', 'fixed', 'ignore_case'].includes(k) || k.startsWith('label.')) this.query[k] = v;
    }
    $('find-pattern').value = params.get('pattern') ?? '';
    $('find-labels').value = labels.join(' ');
    $('find-since').value = params.get('since') ?? '';
    $('find-literal').checked = params.get('fixed') === 'true';
    $('find-case').checked = params.get('ignore_case') !== 'true' && params.has('pattern');
    $('find-results').replaceChildren();
    Object.assign(this, { cursor: null, found: 0, outputs: 0, last: null });
    $('find-more').hidden = true;
    $('find-status').textContent = '';
    if (!this.query.pattern) {
      $('find-pattern').focus();
      return;
    }
    await this.more();
  },

  // Like a grep in one output, a search call answers at most MATCHES_PER_CALL matches and stops
  // sooner when the server's time budget runs out; the walk goes on by itself until a click's worth
  // is shown or every output is searched, and "more to search" then means what it says.
  async more() {
    const query = this.query;
    if (this.walking === query) return; // one walk per search: a click during one waits for it
    this.walking = query;
    try {
      await this.walk();
    } finally {
      if (this.walking === query) this.walking = null;
    }
  },

  async walk() {
    const query = this.query;
    let shown = 0;
    for (;;) {
      const answer = await api('/v1/search', { ...query, max_matches: MATCHES_PER_CALL - shown, cursor: this.cursor });
      if (query !== this.query) return; // a newer search replaced this one
      this.show(answer.matches);
      shown += answer.matches.length;
      this.found += answer.matches.length;
      this.outputs += answer.outputs_scanned;
      this.cursor = answer.next_cursor;
      // Hidden while the walk goes on: a click then would start a second walk from one cursor.
      $('find-more').hidden = !this.cursor || shown < MATCHES_PER_CALL;
      const found = `${this.found.toLocaleString('en')} match${this.found === 1 ? '' : 'es'}`;
      const outputs = `${this.outputs.toLocaleString('en')} outputs searched`;
      if (!this.cursor || shown >= MATCHES_PER_CALL) {
        $('find-status').textContent = `${found} in ${outputs}${this.cursor ? '; more to search' : ''}`;
        return;
      }
      $('find-status').textContent = `Searching… ${found} so far, ${outputs}`;
    }
  },

  show(matches) {
    const list = $('find-results');
    for (const m of matches) {
      if (m.digest !== this.last) {
        const head = document.createElement('li');
        head.className = 'output';
        const labels = Object.entries(m.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(' ');
        head.textContent = `${m.digest}${labels ? `  ${labels}` : ''}`;
        list.append(head);
        this.last = m.digest;
      }
      const li = document.createElement('li');
      li.className = 'hit';
      const link = document.createElement('a');
      link.href = `#/blob/${m.digest}?line=${m.line}`;
      const n = document.createElement('span');
      n.className = 'n';
      n.textContent = `${m.line}:`;
      link.append(n, document.createTextNode(` ${m.text}`));
      li.append(link);
      list.append(li);
    }
  },

  submit(event) {
    event.preventDefault();
    const q = labelParams($('find-labels').value);
    if (!q) return;
    const pattern = $('find-pattern').value;
    if (!pattern) {
      say('Type what to search for first.');
      return;
    }
    q.set('pattern', pattern);
    const since = $('find-since').value.trim();
    if (since) q.set('since', since);
    if ($('find-literal').checked) q.set('fixed', 'true');
    if (!$('find-case').checked) q.set('ignore_case', 'true');
    navigate(`#/search?${q}`);
  },
};

function cells(texts) {
  const tr = document.createElement('tr');
  for (const t of texts) {
    const td = document.createElement('td');
    if (t instanceof Node) td.append(t);
    else td.textContent = t;
    tr.append(td);
  }
  return tr;
}

function refRow(r) {
  const link = document.createElement('a');
  const hex = r.digest.replace(/^blake3:/, '');
  link.href = `#/blob/blake3:${encodeURIComponent(hex)}`;
  link.textContent = `${hex.slice(0, 16)}…`;
  link.title = r.digest;
  const labels = Object.entries(r.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(' ');
  const tr = cells([link, bytes(r.size), r.lines.toLocaleString('en'), labels, when(r.created_at),
    r.pinned ? 'pinned' : when(r.expires_at)]);
  tr.cells[1].className = 'num';
  tr.cells[2].className = 'num';
  return tr;
}

function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}

const when = (t) => (t ? t.replace('T', ' ').replace(/(\.\d+)?Z$/, ' UTC') : '—');

// ---------------------------------------------------------------- the viewer

/** The lines of a page as rows: `{n, text}`; the first continues the previous row when the
 * page starts inside a line (a byte page after an over-long line, or a stream's tail). */
function linesOf(page) {
  if (!page.content) return [];
  const parts = page.content.split('\n');
  if (page.content.endsWith('\n')) parts.pop();
  return parts.map((text, i) => ({ n: page.start_line + i, text }));
}

/** Where the page after `page` starts, by the cursor rule; null at the end. */
function nextOf(page) {
  if (page.next_line) return { line: page.next_line, lines: PAGE_LINES };
  if (page.next_offset !== null && page.next_offset !== undefined) return { offset: page.next_offset, limit: 100000 };
  return null;
}

/** Marks what `search` matches inside `row`'s text (as text nodes: nothing is parsed as HTML).
 * The server's patterns are Rust regex syntax; one the browser's RegExp does not take is left
 * unmarked. */
function highlight(row, search) {
  let re;
  try {
    const source = search.fixed ? search.pattern.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') : search.pattern;
    re = new RegExp(source, search.ignoreCase ? 'gi' : 'g');
  } catch {
    return;
  }
  const text = row.textContent;
  const frag = document.createDocumentFragment();
  let at = 0;
  for (const m of text.matchAll(re)) {
    if (!m[0]) break;
    const mark = document.createElement('mark');
    mark.textContent = m[0];
    frag.append(text.slice(at, m.index), mark);
    at = m.index + m[0].length;
  }
  if (at === 0) return;
  frag.append(text.slice(at));
  row.replaceChildren(frag);
}

function makeRow({ n, text }) {
  const row = document.createElement('div');
  row.className = 'row';
  row.dataset.n = String(n);
  row.textContent = text;
  return row;
}

const viewer = {
  kind: null, // 'blob' or 'stream'
  id: null,
  base: null, // the API path of the output
  digest: null, // the blob's digest, once known
  gen: 0, // bumped on every (re)load: stale answers are dropped
  first: 1, // line number of the first row
  next: null, // where the page after the last row starts
  end: 0, // byte position after the last row (streams follow from there)
  openLine: false, // whether the last row's line goes on past what is shown
  busy: false,
  totalLines: 0,
  follow: null, // AbortController of a stream's long-poll
  search: { pattern: null, fixed: false, ignoreCase: false, matches: [], next: null, current: -1, start: 1, wrapped: false },

  async open(kind, id, line) {
    if (this.kind === kind && this.id === id) {
      await this.goto(line);
      return;
    }
    if (kind === 'blob' && !(BLAKE3.test(id) || SHA256.test(id))) throw new ApiError(400, 'invalid_digest', `not a digest: ${id}`);
    if (kind === 'stream' && !STREAM_ID.test(id)) throw new ApiError(400, 'invalid_argument', `not a stream id: ${id}`);
    this.close();
    this.kind = kind;
    this.id = id;
    this.base = kind === 'blob' ? `/v1/blobs/${encodeURIComponent(id)}` : `/v1/streams/${id}`;
    this.digest = kind === 'blob' ? id : null;
    $('meta').textContent = id;
    $('stream-state').hidden = kind !== 'stream';
    $('results').replaceChildren();
    $('results-box').hidden = true;
    $('search-status').textContent = '';
    this.search = { pattern: null, fixed: false, ignoreCase: false, matches: [], next: null, current: -1, start: 1, wrapped: false };
    $('meta-refs').textContent = '';
    if (kind === 'stream') await this.refreshState();
    await this.goto(line);
    if (kind === 'blob') this.describe().catch(() => {}); // the header's second half; not needed to read
  },

  /** When the output was saved and its labels (the command that made it, the tool, the run):
   * its newest reference, `GET /v1/refs?digest=`. */
  async describe() {
    const gen = this.gen;
    if (!this.digest?.startsWith('blake3:')) return;
    const list = await api('/v1/refs', { digest: this.digest, limit: 1 });
    const r = list.refs[0];
    if (!r || gen !== this.gen) return;
    const labels = Object.entries(r.labels).map(([k, v]) => `${k}=${v}`);
    const saved = r.created_at.replace('T', ' ').replace(/(\.\d+)?Z$/, ' UTC');
    $('meta-refs').textContent = [`saved ${saved}`, ...labels].join(' · ');
    $('meta-refs').title = labels.join('\n');
  },

  close() {
    this.stop();
    this.kind = null;
    this.id = null;
    $('content').replaceChildren();
    $('binary-note').hidden = true;
    $('follow-note').hidden = true;
  },

  /** Drops what is under way: loads in flight are ignored, a stream's long-poll is cut. */
  stop() {
    this.gen += 1;
    this.follow?.abort();
    this.follow = null;
  },

  rows() {
    return $('content').children;
  },

  /** Shows `line` at the top, fetched from where it starts: line 999,000 costs what line 1 does. */
  async goto(line) {
    this.stop();
    const gen = this.gen;
    this.busy = true;
    try {
      const page = await api(`${this.base}/read`, { line, lines: PAGE_LINES });
      if (gen !== this.gen) return;
      $('content').replaceChildren();
      this.first = line;
      this.openLine = false;
      this.take(page);
      const row = this.rows()[0];
      if (row) {
        row.classList.add('target');
        if (this.search.matches.includes(line)) highlight(row, this.search);
        $('content').scrollTop = 0;
      }
      $('goto-input').value = '';
      say('');
    } finally {
      if (gen === this.gen) this.busy = false;
    }
    // The lines above too, so that scrolling up works at once, and the line a third of the way
    // down the screen: what led to an error is in view with it (the last line sits at the bottom).
    await this.loadBefore();
    await this.fill();
    if (gen !== this.gen) return;
    const content = $('content');
    const target = content.querySelector('.row.target');
    if (target) {
      const at = target.getBoundingClientRect().top - content.getBoundingClientRect().top + content.scrollTop;
      content.scrollTop = Math.max(0, at - Math.floor(content.clientHeight / 3));
    }
  },

  /** Appends a page that starts where the last row ends. */
  take(page) {
    this.totalLines = page.total_lines;
    if (page.digest) this.digest = page.digest;
    const name = this.digest ?? this.id;
    const short = name.replace(/^((?:blake3:|sha256:)?[0-9a-f]{16})[0-9a-f]{17,}$/, '$1…');
    $('meta').textContent = `${short} · ${bytes(page.total_size)} · ${page.total_lines.toLocaleString('en')} lines`;
    $('meta').title = name;
    if (page.lossy) $('binary-note').hidden = false;
    const content = $('content');
    const lines = linesOf(page);
    const frag = document.createDocumentFragment();
    lines.forEach((l, i) => {
      const last = content.lastElementChild;
      if (i === 0 && this.openLine && last && last.dataset.n === String(l.n)) last.textContent += l.text;
      else frag.append(makeRow(l));
    });
    content.append(frag);
    if (page.content) this.openLine = !page.content.endsWith('\n');
    this.next = nextOf(page);
    this.end = page.offset + page.length;
    this.trimTop();
  },

  /** Drops rows far above the screen, keeping what is shown in place. */
  trimTop() {
    const content = $('content');
    const extra = content.children.length - MAX_ROWS;
    if (extra <= 0) return;
    const before = content.scrollHeight;
    for (let i = 0; i < extra; i += 1) content.firstElementChild.remove();
    content.scrollTop -= before - content.scrollHeight;
    this.first = Number(content.firstElementChild.dataset.n);
  },

  /** Loads pages below until the screen is covered twice over, then follows a live stream. */
  async fill() {
    const content = $('content');
    while (!this.busy && this.next && content.scrollHeight - content.scrollTop < 3 * content.clientHeight + 1) {
      if (!(await this.loadAfter())) return;
    }
    if (!this.next && this.kind === 'stream' && !this.follow) this.followStream();
  },

  async loadAfter() {
    if (this.busy || !this.next) return false;
    const gen = this.gen;
    this.busy = true;
    try {
      const page = await api(`${this.base}/read`, this.next);
      if (gen !== this.gen) return false;
      this.take(page);
      return true;
    } catch (e) {
      explain(e);
      return false;
    } finally {
      if (gen === this.gen) this.busy = false;
    }
  },

  /** Loads the lines above the first row, keeping what is shown in place. */
  async loadBefore() {
    if (this.busy || this.first <= 1) return;
    const gen = this.gen;
    this.busy = true;
    try {
      const until = this.first;
      let at = { line: Math.max(1, until - PAGE_LINES), lines: Math.min(PAGE_LINES, until - 1) };
      const rows = [];
      let open = false;
      while (at) {
        const page = await api(`${this.base}/read`, at);
        if (gen !== this.gen) return;
        const lines = linesOf(page);
        lines.forEach((l, i) => {
          if (i === 0 && open && rows.length && rows[rows.length - 1].n === l.n) rows[rows.length - 1].text += l.text;
          else if (l.n < until) rows.push(l);
        });
        if (page.content) open = !page.content.endsWith('\n');
        at = nextOf(page);
        if (at?.line >= until || (lines.length && lines[lines.length - 1].n >= until)) break;
        if (at?.line) at.lines = Math.min(PAGE_LINES, until - at.line);
      }
      const content = $('content');
      const height = content.scrollHeight;
      const frag = document.createDocumentFragment();
      for (const r of rows) frag.append(makeRow(r));
      content.prepend(frag);
      content.scrollTop += content.scrollHeight - height;
      this.first = Math.max(1, until - rows.length);
      this.trimBottom();
    } catch (e) {
      explain(e);
    } finally {
      if (gen === this.gen) this.busy = false;
    }
  },

  /** Drops rows far below the screen; they are fetched again from the first one dropped. */
  trimBottom() {
    const content = $('content');
    const extra = content.children.length - MAX_ROWS;
    if (extra <= 0) return;
    let n = 0;
    for (let i = 0; i < extra; i += 1) {
      n = Number(content.lastElementChild.dataset.n);
      content.lastElementChild.remove();
    }
    this.follow?.abort();
    this.follow = null;
    this.next = { line: n, lines: PAGE_LINES };
    this.openLine = false;
  },

  onScroll() {
    const c = $('content');
    if (c.scrollTop < c.clientHeight) this.loadBefore();
    if (c.scrollHeight - c.scrollTop - c.clientHeight < 2 * c.clientHeight) this.fill();
    if (this.follow) this.showFollowing();
  },

  atBottom() {
    const c = $('content');
    return c.scrollHeight - c.scrollTop - c.clientHeight < 4;
  },

  showFollowing() {
    const note = $('follow-note');
    note.hidden = false;
    note.textContent = this.atBottom()
      ? 'Following the stream: new lines appear as they are written.'
      : 'Paused: scroll to the bottom to follow new lines.';
  },

  /** `GET /v1/streams/{id}`: open, capped or sealed, and the task's exit when known. */
  async refreshState() {
    const s = await api(this.base);
    const parts = [s.state];
    if (s.capped && s.state !== 'capped') parts.push('capped');
    if (s.exit_code !== undefined && s.exit_code !== null) parts.push(`exit ${s.exit_code}`);
    if (s.signal) parts.push(`signal ${s.signal}`);
    $('stream-state').textContent = parts.join(' · ');
    if (s.digest) this.digest = s.digest;
    return s;
  },

  /** Long-polls the stream's end while it is open; scrolls along unless the user scrolled up. */
  async followStream() {
    const gen = this.gen;
    const ctl = new AbortController();
    this.follow = ctl;
    this.showFollowing();
    try {
      for (;;) {
        const state = await this.refreshState();
        if (gen !== this.gen) return;
        const page = await api(`${this.base}/read`, { offset: this.end, wait_ms: WAIT_MS }, { signal: ctl.signal });
        if (gen !== this.gen) return;
        const stick = this.atBottom(); // where the user is now, not when the wait began
        if (page.length > 0) {
          this.take(page);
          if (stick) $('content').scrollTop = $('content').scrollHeight;
        } else if (state.state !== 'open' && page.eof) {
          await this.refreshState();
          break;
        }
        this.showFollowing();
      }
      $('follow-note').textContent = 'The stream has ended.';
    } catch (e) {
      if (gen === this.gen) explain(e);
    } finally {
      if (this.follow === ctl) this.follow = null;
    }
  },

  /** The line at the top of the screen, for permalinks. */
  topLine() {
    const c = $('content');
    for (const row of c.children) {
      if (row.offsetTop + row.offsetHeight > c.scrollTop) return Number(row.dataset.n);
    }
    return this.first;
  },

  permalink() {
    const what = this.digest && this.kind === 'blob' ? `blob/${this.digest}` : `${this.kind}/${this.id}`;
    return `${location.origin}/ui/#/${what}?line=${this.topLine()}`;
  },

  async download() {
    if (!this.digest) {
      say('A stream can be downloaded once it is sealed.', 'info');
      return;
    }
    const resp = await api(`/v1/blobs/${encodeURIComponent(this.digest)}`, {}, { raw: true });
    const blob = await resp.blob();
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = `${this.digest.replace(/^(blake3|sha256):/, '')}.txt`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  },

  // ------------------------------------------------------------ search

  // One call of the server's grep answers at most MATCHES_PER_CALL lines, and stops sooner when its
  // time budget runs out (`next_line` set on fewer matches). The second kind of stop is the server's,
  // not the user's, so the walk goes on until a full call's worth is shown or the output ends: the
  // count is exact whenever no "+" follows it.
  async searchFrom(fromLine) {
    const s = this.search;
    if (s.walking) return; // one walk at a time: "next match" during one waits for it
    s.walking = true;
    try {
      await this.walkFrom(s, fromLine);
    } finally {
      s.walking = false;
    }
  },

  // A search starts at the line at the top of the screen and, at the end of the output, goes on
  // from line 1 up to where it started (as `less` wraps): the matches after where you are first.
  async walkFrom(s, fromLine) {
    const list = $('results');
    let line = fromLine;
    let shown = 0;
    for (;;) {
      const found = await api(`${this.base}/grep`, {
        pattern: s.pattern,
        fixed: s.fixed,
        ignore_case: s.ignoreCase,
        from_line: line,
        max_matches: MATCHES_PER_CALL - shown,
      });
      if (s !== this.search) return; // a newer search replaced this one
      const before = s.wrapped ? s.start : Infinity; // once wrapped, only the lines above the start
      for (const m of found.matches) {
        if (m.line >= before) break;
        const li = document.createElement('li');
        const n = document.createElement('span');
        n.className = 'n';
        n.textContent = `${m.line}:`;
        li.append(n, document.createTextNode(` ${m.text}${m.shortened ? ' …' : ''}`));
        li.dataset.index = String(s.matches.length);
        s.matches.push(m.line);
        list.append(li);
        shown += 1;
      }
      s.next = found.next_line && found.next_line < before ? found.next_line : null;
      if (!s.next && !s.wrapped && s.start > 1) {
        s.wrapped = true; // the end: on from the top, up to where the search began
        s.next = 1;
      }
      $('results-more').hidden = !s.next || shown < MATCHES_PER_CALL;
      $('results-box').hidden = false;
      const count = s.matches.length.toLocaleString('en');
      const from = s.start > 1 ? ` from line ${s.start.toLocaleString('en')}${s.wrapped ? ', wrapped' : ''}` : '';
      if (!s.next || shown >= MATCHES_PER_CALL) {
        const plural = count === '1' && !s.next ? '' : 's';
        $('search-status').textContent = `${count}${s.next ? '+' : ''} matching line${plural}${from}`;
        return;
      }
      $('search-status').textContent = `Searching from line ${s.next.toLocaleString('en')}… ${count} found so far`;
      line = s.next;
    }
  },

  async startSearch(event) {
    event.preventDefault();
    const pattern = $('search-input').value;
    if (!pattern) return;
    const start = this.kind ? this.topLine() : 1;
    this.search = {
      pattern,
      fixed: $('search-literal').checked,
      ignoreCase: !$('search-case').checked,
      matches: [],
      next: null,
      current: -1,
      start,
      wrapped: false,
    };
    $('results').replaceChildren();
    await this.searchFrom(start);
    if (this.search.matches.length) await this.jump(0);
  },

  async jump(index) {
    const s = this.search;
    if (index >= s.matches.length && s.next) await this.searchFrom(s.next);
    if (index < 0 || index >= s.matches.length) return;
    s.current = index;
    for (const li of $('results').querySelectorAll('li.current')) li.classList.remove('current');
    const li = $('results').children[index];
    li.classList.add('current');
    li.scrollIntoView({ block: 'nearest' });
    navigate(`#/${this.kind}/${this.id}?line=${s.matches[index]}`);
  },
};

// ---------------------------------------------------------------- wiring

function wire() {
  $('signin-form').addEventListener('submit', (e) => signIn(e).catch(explain));
  $('signout').addEventListener('click', () => signOut());
  $('open-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const to = target($('open-input').value);
    if (!to) {
      say('That is neither a digest (blake3:…, sha256:…, 64 hex digits) nor a stream id (32 hex digits).');
      return;
    }
    $('open-input').value = '';
    location.hash = to;
  });
  $('refs-form').addEventListener('submit', (e) => refs.submit(e));
  $('refs-more').addEventListener('click', () => refs.more().catch(explain));
  $('find-form').addEventListener('submit', (e) => find.submit(e));
  $('find-more').addEventListener('click', () => find.more().catch(explain));
  $('goto-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const line = Number.parseInt($('goto-input').value, 10);
    if (!Number.isSafeInteger(line) || line < 1) {
      say('A line number starts at 1.');
      return;
    }
    navigate(`#/${viewer.kind}/${viewer.id}?line=${line}`);
  });
  // The last line, at the bottom of the screen with the lines before it: where a crash is.
  $('to-end').addEventListener('click', () => {
    navigate(`#/${viewer.kind}/${viewer.id}?line=${Math.max(1, viewer.totalLines)}`);
  });
  $('wrap').addEventListener('change', (e) => $('content').classList.toggle('wrap', e.target.checked));
  $('download').addEventListener('click', () => viewer.download().catch(explain));
  $('permalink').addEventListener('click', async () => {
    const link = viewer.permalink();
    try {
      await navigator.clipboard.writeText(link);
      say(`Link copied: ${link}`, 'info');
    } catch {
      say(`Copy this link: ${link}`, 'info');
    }
  });
  $('search-form').addEventListener('submit', (e) => viewer.startSearch(e).catch(explain));
  $('results-more').addEventListener('click', () => viewer.searchFrom(viewer.search.next).catch(explain));
  $('results').addEventListener('click', (e) => {
    const li = e.target.closest('li');
    if (li) viewer.jump(Number(li.dataset.index)).catch(explain);
  });
  $('next-match').addEventListener('click', () => viewer.jump(viewer.search.current + 1).catch(explain));
  $('prev-match').addEventListener('click', () => viewer.jump(viewer.search.current - 1).catch(explain));
  $('content').addEventListener('scroll', () => viewer.onScroll(), { passive: true });
  // At the very top a wheel turn scrolls nothing, so it asks for the lines above itself.
  $('content').addEventListener('wheel', (e) => e.deltaY < 0 && viewer.onScroll(), { passive: true });
  window.addEventListener('hashchange', route);
  route();
}

wire();

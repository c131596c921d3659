//! Secrets kept from models: one detector, used by the server (pages, greps, searches read with
//! `redact=true` or through a redacted token) and by the client (receipts, `--local`), so that
//! both replace the same bytes with the same marks.
//!
//! Each kind below is a pattern over bytes with the secret itself as its first group (the name
//! before it, `DB_PASSWORD=`, `Authorization: Bearer `, stays). A match becomes
//! `[REDACTED:kind]`, followed by as many newlines as the secret held, so that line numbers never
//! move (a PEM block spans lines). Where two kinds match at the same place, the more specific
//! wins (`sk-ant-…` is `anthropic_key`, not `openai_key`; `GITHUB_TOKEN=ghp_…` is
//! `github_token`, not `password`); where matches overlap, the leftmost wins.
//!
//! Every pattern is bounded in length ([`MAX_SECRET`]), which is what lets a reader of part of
//! a blob find exactly the secrets the whole blob holds: a match that starts before the part
//! ends within `MAX_SECRET` of its start (see [`Detector::find_starting_in`]).

use std::sync::OnceLock;

use regex::bytes::Regex;

/// The longest secret any kind matches (a PEM block of 16 KiB, with its armour lines).
pub const MAX_SECRET: usize = 16 << 10 | 512;

/// A secret found: bytes `start..end` of the scanned text, of `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Where the secret starts.
    pub start: usize,
    /// Where it ends (exclusive).
    pub end: usize,
    /// The kind, as it appears in the mark.
    pub kind: std::sync::Arc<str>,
}

/// One kind: what it is called, how it is found, how sure a match is.
struct Kind {
    name: &'static str,
    /// Group 1 (or, when absent, the whole match) is the secret.
    pattern: &'static str,
    /// Higher wins where two kinds match at the same place.
    specificity: u8,
    /// A further check of the secret (e.g. a mix of letters and digits), against false alarms.
    check: fn(&[u8]) -> bool,
}

fn any(_: &[u8]) -> bool {
    true
}

/// Real keys mix letters and digits; words joined by hyphens (`sk-learn-…`) seldom do.
fn mixed(s: &[u8]) -> bool {
    s.iter().any(u8::is_ascii_digit) && s.iter().any(u8::is_ascii_alphabetic)
}

/// A value assigned to a secret-named key that is not a secret: empty, a reference to a
/// variable or a command (`$VAR`, `${VAR}`, `$(cmd)`), a placeholder (`<redacted>`, `***`), a
/// boolean or `null`.
fn assigned_value(s: &[u8]) -> bool {
    let lower = s.to_ascii_lowercase();
    let word = lower.strip_suffix(b")").unwrap_or(&lower);
    let word = word.strip_suffix(b")").unwrap_or(word);
    !(s.is_empty()
        || s.starts_with(b"$")
        || s.starts_with(b"<")
        || s.iter().all(|&b| b == b'*' || b == b'x' || b == b'X')
        || matches!(word, b"null" | b"none" | b"true" | b"false" | b"undefined" | b"nil")
        || looks_like_code(s, &lower))
}

/// A value that is source code rather than a secret — a type, a reference, a call, a path
/// into a module, a field — as `git log -p`, diffs and files read back are full of
/// (`token: Option<String>`, `password: &str`, `let token = self.token.clone()`). gitleaks
/// keeps such rules apart from code by an allowlist of the same shapes.
fn looks_like_code(s: &[u8], lower: &[u8]) -> bool {
    const TYPES: &[&[u8]] = &[
        b"str", b"string", b"bool", b"bytes", b"int", b"integer", b"number", b"object", b"any", b"impl", b"u8", b"u16",
        b"u32", b"u64", b"usize", b"i32", b"i64", b"vec", b"option", b"self",
    ];
    let ident_end = s.iter().position(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')).unwrap_or(s.len());
    TYPES.contains(&lower)
        || s.starts_with(b"&")
        || s.starts_with(b"(")
        || s.starts_with(b":")
        || lower.starts_with(b"self.")
        || memchr::memmem::find(s, b"::").is_some()
        // An identifier followed by a call or type parameters: `Option<String>`, `token.into()`.
        || (ident_end > 0 && matches!(s.get(ident_end), Some(b'(' | b'<')))
}

/// The kinds of api.md v1.2, in the order of its table. Each pattern says where its shape comes
/// from: the provider's documented token format, or the gitleaks rule it follows.
const KINDS: &[Kind] = &[
    // AWS IAM: access key IDs are 20 characters, `AKIA` (long-term) or `ASIA` (temporary STS)
    // then 16 upper-case letters and digits (AWS "Understanding IAM identifiers"; gitleaks
    // `aws-access-token`).
    Kind { name: "aws_access_key_id", pattern: r"\b((?:AKIA|ASIA)[A-Z0-9]{16})\b", specificity: 80, check: any },
    // The 40-character secret has no prefix of its own: it is found by the key it is assigned
    // to, as in `~/.aws/credentials`, env dumps and JSON (gitleaks `aws-secret-access-key`
    // keys on the same names).
    Kind {
        name: "aws_secret_access_key",
        pattern: r#"(?i:aws_secret_access_key)["']?\s*[:=]\s*["']?([A-Za-z0-9/+=]{40})(?:[^A-Za-z0-9/+=]|$)"#,
        specificity: 85,
        check: any,
    },
    // GitHub: `ghp_` (classic PAT), `gho_` (OAuth), `ghu_`/`ghs_` (app user/server), `ghr_`
    // (refresh) + 36 alphanumerics; fine-grained PATs `github_pat_` + 82 (GitHub docs "About
    // authentication to GitHub", token formats; gitleaks `github-pat`, `github-fine-grained-pat`).
    Kind {
        name: "github_token",
        pattern: r"\b(gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})\b",
        specificity: 80,
        check: any,
    },
    // GitLab personal access tokens: `glpat-` + 20 or more of [A-Za-z0-9_-] (GitLab docs
    // "Token prefixes"; gitleaks `gitlab-pat`).
    Kind { name: "gitlab_token", pattern: r"\b(glpat-[A-Za-z0-9_-]{20,64})", specificity: 80, check: any },
    // Slack: `xoxb-` (bot), `xoxa-`/`xoxr-` (app, refresh), `xoxp-` (user), `xoxs-`
    // (session), then dash-joined numbers and letters (Slack "Token types"; gitleaks
    // `slack-bot-token` and siblings).
    Kind { name: "slack_token", pattern: r"\b(xox[baprs]-[A-Za-z0-9-]{10,250})", specificity: 80, check: mixed },
    // Stripe: secret `sk_live_`, restricted `rk_live_`, test `sk_test_` keys (Stripe "API
    // keys"; gitleaks `stripe-access-token`).
    Kind {
        name: "stripe_key",
        pattern: r"\b((?:sk|rk)_live_[A-Za-z0-9]{10,128}|sk_test_[A-Za-z0-9]{10,128})\b",
        specificity: 80,
        check: any,
    },
    // OpenAI: `sk-` or `sk-proj-` and 20 or more of [A-Za-z0-9_-] (gitleaks `openai-api-key`).
    // Less specific than Anthropic's `sk-ant-`, which it would also match.
    Kind { name: "openai_key", pattern: r"\b(sk-(?:proj-)?[A-Za-z0-9_-]{20,256})", specificity: 75, check: mixed },
    // Anthropic: `sk-ant-` (`sk-ant-api03-…`, `sk-ant-admin01-…`; gitleaks `anthropic-api-key`).
    Kind { name: "anthropic_key", pattern: r"\b(sk-ant-[A-Za-z0-9_-]{20,256})", specificity: 80, check: any },
    // Hugging Face user access tokens: `hf_` + 34 letters and digits (gitleaks
    // `huggingface-access-token`).
    Kind { name: "huggingface_token", pattern: r"\b(hf_[A-Za-z0-9]{34})\b", specificity: 80, check: any },
    // npm access tokens: `npm_` + 36 (npm "About access tokens"; gitleaks `npm-access-token`).
    Kind { name: "npm_token", pattern: r"\b(npm_[A-Za-z0-9]{36})\b", specificity: 80, check: any },
    // Google API keys: `AIza` + 35 of [A-Za-z0-9_-] (Google Cloud "API keys"; gitleaks
    // `gcp-api-key`).
    Kind { name: "google_api_key", pattern: r"\b(AIza[0-9A-Za-z_-]{35})", specificity: 80, check: any },
    // JWTs (RFC 7519 compact form): three base64url parts; the header and the claims are JSON
    // objects, so both begin `eyJ` (`{"`) — gitleaks `jwt`.
    Kind {
        name: "jwt",
        pattern: r"\b(eyJ[A-Za-z0-9_-]{2,4096}\.eyJ[A-Za-z0-9_-]{2,8192}\.[A-Za-z0-9_-]{0,1024})",
        specificity: 60,
        check: any,
    },
    // PEM private keys (RFC 7468): from the BEGIN line through the END line. Found by
    // `private_keys` below (a pattern spanning 16 KiB would be too large an automaton); this
    // entry only gives the kind its name and its place among the others.
    Kind { name: "private_key", pattern: r"-----BEGIN[ A-Z0-9]{0,32}PRIVATE KEY-----", specificity: 90, check: any },
    // HTTP credentials (RFC 6750 b64token, RFC 7617): what follows `Authorization: Bearer` /
    // `Basic`, as a header, a curl `-H`, or a JSON or YAML field.
    Kind {
        name: "bearer_token",
        pattern: r#"(?i:authorization)["']?\s*[:=]\s*["']?(?i:bearer)\s+([A-Za-z0-9._~+/=-]{8,4096})"#,
        specificity: 40,
        check: any,
    },
    Kind {
        name: "basic_auth",
        pattern: r#"(?i:authorization)["']?\s*[:=]\s*["']?(?i:basic)\s+([A-Za-z0-9+/=]{4,4096})"#,
        specificity: 40,
        check: any,
    },
    // The password of a URL's userinfo (RFC 3986 §3.2.1): `scheme://user:password@host`.
    Kind {
        name: "url_password",
        pattern: r"\b[A-Za-z][A-Za-z0-9+.-]{1,32}://[^\s:/@]{1,256}:([^\s:/@]{1,256})@",
        specificity: 30,
        check: assigned_value,
    },
    // A value assigned (`=` or `:`, quoted or not) to a key that is or ends in password,
    // passwd, secret, token, api_key or apikey, any case — `.env` files, env dumps, YAML, JSON
    // (detect-secrets' `KeywordDetector`, narrowed to keys that end in the word, so that
    // `password_policy=strict` and `max_tokens=4096` stay).
    Kind {
        name: "password",
        pattern: r#"(?i:password|passwd|secret|token|api_key|apikey)["']?[ \t]*[:=][ \t]*(?:"([^"\r\n]{1,1024})"|'([^'\r\n]{1,1024})'|([^\s"',;{}\[\]]{1,1024}))"#,
        specificity: 20,
        check: assigned_value,
    },
    // Spillway's own tokens: `spw_` + 64 hex (`spillway-server token create`).
    Kind { name: "spillway_token", pattern: r"\b(spw_[0-9a-f]{64})\b", specificity: 80, check: any },
];

/// An operator's own kind, from a gitleaks rule (`[[rules]]`: `id`, `regex`, optional
/// `keywords` and `secretGroup`).
#[derive(Debug, Clone, serde::Deserialize)]
struct GitleaksRule {
    id: String,
    regex: String,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default, rename = "secretGroup")]
    secret_group: Option<usize>,
}

#[derive(Debug, serde::Deserialize)]
struct GitleaksFile {
    #[serde(default)]
    rules: Vec<GitleaksRule>,
}

/// A compiled kind.
struct Compiled {
    name: std::sync::Arc<str>,
    regex: Regex,
    specificity: u8,
    check: fn(&[u8]) -> bool,
    /// Which group holds the secret (0: the whole match).
    group: Option<usize>,
    /// Lower-cased words one of which must appear for the rule to run (gitleaks `keywords`).
    keywords: Vec<Vec<u8>>,
    /// Found by [`private_keys`], not by its pattern alone.
    pem: bool,
}

/// Why an operator's rules file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// Not gitleaks' TOML.
    #[error("redaction rules: {0}")]
    Toml(String),
    /// A rule's pattern does not compile.
    #[error("redaction rule {id:?}: {message}")]
    Regex {
        /// The rule.
        id: String,
        /// The regex error.
        message: String,
    },
}

/// Finds secrets. Built once (the built-in kinds plus an operator's rules) and shared.
pub struct Detector {
    kinds: Vec<Compiled>,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detector").field("kinds", &self.kinds.iter().map(|k| &*k.name).collect::<Vec<_>>()).finish()
    }
}

fn compile(pattern: &str) -> Result<Regex, regex::Error> {
    regex::bytes::RegexBuilder::new(pattern).unicode(false).size_limit(64 << 20).build()
}

impl Detector {
    /// The built-in kinds only (compiled once per process).
    pub fn builtin() -> &'static Detector {
        static BUILTIN: OnceLock<Detector> = OnceLock::new();
        BUILTIN.get_or_init(|| Detector::with_rules("").expect("the built-in patterns compile"))
    }

    /// The built-in kinds and the rules of a gitleaks TOML file's text.
    pub fn with_rules(toml_text: &str) -> Result<Detector, RulesError> {
        let mut kinds: Vec<Compiled> = KINDS
            .iter()
            .map(|k| Compiled {
                name: k.name.into(),
                regex: compile(k.pattern).expect("built-in pattern"),
                specificity: k.specificity,
                check: k.check,
                group: None,
                keywords: Vec::new(),
                pem: k.name == "private_key",
            })
            .collect();
        if !toml_text.trim().is_empty() {
            let file: GitleaksFile = toml::from_str(toml_text).map_err(|e| RulesError::Toml(e.to_string()))?;
            for rule in file.rules {
                // Go's RE2 and Rust's regex share their syntax for what gitleaks rules use.
                let regex = compile(&rule.regex)
                    .map_err(|e| RulesError::Regex { id: rule.id.clone(), message: e.to_string() })?;
                kinds.push(Compiled {
                    name: rule.id.as_str().into(),
                    regex,
                    specificity: 50,
                    check: any,
                    group: rule.secret_group,
                    keywords: rule.keywords.iter().map(|k| k.to_ascii_lowercase().into_bytes()).collect(),
                    pem: false,
                });
            }
        }
        Ok(Detector { kinds })
    }

    /// The secrets in `text`, sorted, not overlapping. Where matches overlap they are merged
    /// into one secret of the kind that starts first (the more specific one at the same
    /// place): more is hidden rather than less.
    pub fn find(&self, text: &[u8]) -> Vec<Span> {
        let mut found = Vec::new();
        let mut lower: Option<Vec<u8>> = None;
        // Each kind alone: every pattern starts with a literal (a prefix, or the name a secret
        // is assigned to), which the regex engine finds with SIMD; a set of all of them at once
        // has no such prefilter and runs a hundred times slower.
        for kind in &self.kinds {
            if !kind.keywords.is_empty() {
                let lower = lower.get_or_insert_with(|| text.to_ascii_lowercase());
                if !kind.keywords.iter().any(|k| memchr::memmem::find(lower, k).is_some()) {
                    continue;
                }
            }
            if kind.pem {
                found.extend(private_keys(text).map(|(start, end)| (start, end, kind.specificity, kind.name.clone())));
                continue;
            }
            // Every leftmost match from every place a match may start, not only after the last
            // one's end: the text handed in may begin inside a secret (a window of a blob), and
            // a match that starts in the cut part must not hide one that starts after it.
            let mut at = 0;
            while let Some(whole) = kind.regex.find_at(text, at) {
                let caps = kind.regex.captures_at(text, whole.start()).expect("the match found again");
                let secret = match kind.group {
                    Some(g) => caps.get(g),
                    None => (1..caps.len()).find_map(|g| caps.get(g)).or(caps.get(0)),
                };
                if let Some(m) = secret.filter(|m| !m.is_empty() && (kind.check)(m.as_bytes())) {
                    found.push((m.start(), char_end(text, m.end()), kind.specificity, kind.name.clone()));
                }
                at = whole.start() + 1;
                if at > text.len() {
                    break;
                }
            }
        }
        // Leftmost first; at the same place the more specific, then the longer.
        found.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)).then(b.1.cmp(&a.1)));
        let mut out: Vec<Span> = Vec::new();
        for (start, end, _, kind) in found {
            match out.last_mut() {
                Some(last) if start < last.end => last.end = last.end.max(end),
                _ => out.push(Span { start, end, kind }),
            }
        }
        out
    }

    /// The secrets that start in `text[from..to]`, exactly as a scan of the whole blob finds
    /// them, given `text` holds at least [`MAX_SECRET`] bytes before `from` (or the blob's
    /// start) and [`MAX_SECRET`] after `to` (or its end). A secret that starts before `from`
    /// ends before `from + MAX_SECRET`, so matches from there on are the whole scan's.
    pub fn find_starting_in(&self, text: &[u8], from: usize, to: usize) -> Vec<Span> {
        self.find(text).into_iter().filter(|s| (from..to).contains(&s.start)).collect()
    }

    /// `text[from..to]` redacted: every secret found in `text` that overlaps the range is
    /// replaced, as far as it lies in the range, by its mark. `text` is the range with as much
    /// around it as the reader has, up to [`MAX_SECRET`] on either side: a secret cut by the
    /// range's edge is found in full and marked on both sides of the edge.
    pub fn redact_range(&self, text: &[u8], from: usize, to: usize) -> Redacted {
        Redacted::of(text, from, to, &self.find(text))
    }
}

/// Where a secret found inside a character ends: after that character, so that a mark never
/// leaves half of one behind.
fn char_end(text: &[u8], end: usize) -> usize {
    let mut end = end;
    while end < text.len() && text[end] & 0xC0 == 0x80 {
        end += 1;
    }
    end
}

/// One mark in a redacted range: the raw bytes it replaces and where it stands in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    raw: (usize, usize),
    out: (usize, usize),
}

/// A range of raw bytes with its secrets replaced by marks, and how positions in the one map
/// to positions in the other (offsets relative to the range's start). Marks keep the newlines
/// of what they replace, after the mark, so line numbers are the raw bytes' own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    /// The redacted bytes.
    pub text: Vec<u8>,
    marks: Vec<Mark>,
}

impl Redacted {
    /// `raw` (which starts at `base` of the text the spans index) with `spans` replaced.
    fn new<'a>(raw: &[u8], base: usize, spans: impl Iterator<Item = &'a Span>) -> Self {
        let mut text = Vec::with_capacity(raw.len());
        let mut marks = Vec::new();
        let mut at = 0;
        for s in spans {
            let (start, end) = (s.start.saturating_sub(base).max(at), (s.end - base).min(raw.len()));
            if start >= end {
                continue;
            }
            text.extend_from_slice(&raw[at..start]);
            let out_start = text.len();
            text.extend_from_slice(b"[REDACTED:");
            text.extend_from_slice(s.kind.as_bytes());
            text.push(b']');
            text.extend(std::iter::repeat_n(b'\n', memchr::memchr_iter(b'\n', &raw[start..end]).count()));
            marks.push(Mark { raw: (start, end), out: (out_start, text.len()) });
            at = end;
        }
        text.extend_from_slice(&raw[at..]);
        Self { text, marks }
    }

    /// `text[from..to]` with the `spans` (found in `text`, sorted) that overlap it replaced.
    pub fn of(text: &[u8], from: usize, to: usize, spans: &[Span]) -> Self {
        let first = spans.partition_point(|s| s.end <= from);
        Self::new(&text[from..to], from, spans[first..].iter().take_while(|s| s.start < to))
    }

    /// Bytes with nothing to redact.
    pub fn plain(raw: &[u8]) -> Self {
        Self { text: raw.to_vec(), marks: Vec::new() }
    }

    /// How many marks the text holds.
    pub fn marks(&self) -> usize {
        self.marks.len()
    }

    /// The raw position of output position `out`, for a cut: a position inside a mark (or
    /// at its start) is the raw start of its secret, so that a page cut there shows none of
    /// it and the next page marks it again.
    pub fn raw_at(&self, out: usize) -> usize {
        self.across(out, |m| (m.out, m.raw), |m| m.raw.0)
    }

    /// The output position of raw position `raw` (inside a secret: the end of its mark).
    pub fn out_at(&self, raw: usize) -> usize {
        self.across(raw, |m| (m.raw, m.out), |m| m.out.1)
    }

    /// `pos` on one side of the marks (the first range `sides` gives) on the other side (the
    /// second); a position inside a mark's range is `inside(mark)`.
    fn across(
        &self,
        pos: usize,
        sides: impl Fn(&Mark) -> ((usize, usize), (usize, usize)),
        inside: impl Fn(&Mark) -> usize,
    ) -> usize {
        let mut shift: isize = 0;
        for m in &self.marks {
            let (here, there) = sides(m);
            if pos < here.0 {
                break;
            }
            if pos < here.1 {
                return inside(m);
            }
            shift = there.1 as isize - here.1 as isize;
        }
        (pos as isize + shift) as usize
    }

    /// The marks that end at or before output position `out` (those shown by a prefix).
    pub fn marks_before(&self, out: usize) -> usize {
        self.marks.iter().take_while(|m| m.out.1 <= out).count()
    }
}

/// PEM private keys: each `-----BEGIN … PRIVATE KEY-----` through its `-----END … PRIVATE
/// KEY-----` line, also when the newlines are written `\n` inside a JSON string (cloud
/// service-account keys). A BEGIN with no END within 16 KiB (the text was cut) runs to the end
/// of its base64 body.
fn private_keys(text: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    static BEGIN: OnceLock<Regex> = OnceLock::new();
    static END: OnceLock<Regex> = OnceLock::new();
    let begin = BEGIN.get_or_init(|| compile(r"-----BEGIN[ A-Z0-9]{0,32}PRIVATE KEY-----").expect("pattern"));
    let end = END.get_or_init(|| compile(r"-----END[ A-Z0-9]{0,32}PRIVATE KEY-----").expect("pattern"));
    let mut at = 0;
    std::iter::from_fn(move || {
        let b = begin.find_at(text, at)?;
        let limit = text.len().min(b.end() + (16 << 10));
        let stop = match end.find(&text[b.end()..limit]) {
            Some(e) => b.end() + e.end(),
            None => {
                // The body: base64, newlines (real or written `\n`), nothing else.
                let body = text[b.end()..limit]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || b"+/=\r\n\\ ".contains(&c)))
                    .unwrap_or(limit - b.end());
                b.end() + body
            }
        };
        at = stop.max(b.end());
        Some((b.start(), stop))
    })
}

/// `text` with each span (offsets into `text`) replaced by its mark and the newlines it held,
/// and how many marks went in.
pub fn apply(text: &[u8], spans: &[Span]) -> (Vec<u8>, usize) {
    let r = Redacted::new(text, 0, spans.iter());
    let n = r.marks();
    (r.text, n)
}

/// The redacted form of `text` by the built-in detector, and how many marks it holds: what the
/// client shows when it holds all of an output at once.
pub fn redact(text: &[u8]) -> (Vec<u8>, usize) {
    let spans = Detector::builtin().find(text);
    apply(text, &spans)
}

#[doc(hidden)]
pub mod samples;
#[cfg(test)]
mod tests;

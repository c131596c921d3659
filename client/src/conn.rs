//! Where the CLI's commands and the MCP tools talk to — the store, or a local directory of
//! spills — and how they show secrets: the library surface both stand on (and the Python
//! package with them), so that neither imports the other.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spillway_api::redact::Detector;
use spillway_api::AnyDigest;

use crate::error::{ClientError, Result};
use crate::reader::Reader;
use crate::spill::{LocalDir, RemoteStore, SpillTarget};
use crate::store::StoreClient;
use crate::truncate::Redaction;

/// A digest as users type it: `blake3:…`, `sha256:…`, or the bare 64 hex that `b3sum` prints.
pub fn parse_digest(s: &str) -> Result<AnyDigest> {
    let s = s.trim();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(format!("blake3:{}", s.to_ascii_lowercase()).parse()?);
    }
    Ok(s.parse::<AnyDigest>()?)
}

/// An operator's rules file (gitleaks' TOML), compiled with the built-in kinds.
pub fn load_rules(path: &Path) -> Result<Arc<Detector>> {
    let text = std::fs::read_to_string(path).map_err(|e| ClientError::file(path, e))?;
    let detector = Detector::with_rules(&text).map_err(|e| ClientError::Other(format!("{e} (invalid_argument)")))?;
    Ok(Arc::new(detector))
}

/// Where a command or a tool talks to: the store, or a local directory of spills; and what it
/// redacts with.
#[derive(Debug, Clone)]
pub struct Conn {
    url: Option<String>,
    token: Option<String>,
    local: Option<PathBuf>,
    detector: Option<Arc<Detector>>,
}

impl Conn {
    /// The store at `url` with `token`, or (`local`) a directory of spills; `detector` the
    /// secrets detector when an operator's rules are in force (the built-in kinds otherwise).
    pub fn new(
        url: Option<String>,
        token: Option<String>,
        local: Option<PathBuf>,
        detector: Option<Arc<Detector>>,
    ) -> Self {
        Self { url, token, local, detector }
    }

    /// The secrets detector: the built-in kinds, with `--redact-rules` when given.
    pub fn detector(&self) -> Arc<Detector> {
        self.detector.clone().unwrap_or_else(|| Arc::new(Detector::with_rules("").expect("the built-in kinds")))
    }

    /// How previews show secrets: marked, unless `off`.
    pub fn redaction(&self, off: bool) -> Redaction {
        match (&self.detector, off) {
            (_, true) => Redaction::Off,
            (Some(d), false) => Redaction::Rules(d.clone()),
            (None, false) => Redaction::On,
        }
    }

    /// The store's client; an error that says how to configure one when there is none.
    pub fn store(&self) -> Result<StoreClient> {
        let url = self.url.clone().ok_or_else(|| {
            ClientError::Other(
                "no store configured: set SPILLWAY_URL and SPILLWAY_TOKEN (or --url/--token), or use --local DIR"
                    .into(),
            )
        })?;
        Ok(StoreClient::new(url, self.token.clone().unwrap_or_default()))
    }

    /// `--local DIR`, else the store, else `./.outputs`.
    pub fn spill_target(&self, ttl: Option<u64>) -> Result<Arc<dyn SpillTarget>> {
        Ok(match (&self.local, &self.url) {
            (Some(dir), _) => Arc::new(LocalDir::new(dir)),
            (None, Some(_)) => Arc::new(RemoteStore::new(self.store()?).with_ttl(ttl)),
            (None, None) => Arc::new(LocalDir::new(".outputs")),
        })
    }

    /// The warning for spills that go to `./.outputs` because no store is configured (no
    /// `SPILLWAY_URL`, no `--local`): for an agent, that is inside the user's project.
    pub fn local_spill_warning(&self) -> Option<&'static str> {
        (self.local.is_none() && self.url.is_none()).then_some(
            "SPILLWAY_URL is not set: full outputs are saved to ./.outputs in the current directory, not to a shared \
             store (set SPILLWAY_URL and SPILLWAY_TOKEN, or --local DIR to choose the directory)",
        )
    }

    /// Where reads go: the local directory, or the store.
    pub fn reader(&self) -> Result<Reader> {
        match &self.local {
            Some(dir) => Ok(Reader::Local(LocalDir::new(dir), None)),
            None => Ok(Reader::Store(self.store()?)),
        }
    }

    /// The reader, redacting when `redact` (`--redact`).
    pub fn reader_for(&self, redact: bool) -> Result<Reader> {
        Ok(self.reader()?.redacting(redact.then(|| self.detector())))
    }

    /// The local directory of spills, when there is one.
    pub fn local(&self) -> Option<&Path> {
        self.local.as_deref()
    }
}

//! Bearer tokens: each belongs to one namespace and carries scopes. Only their SHA-256 is
//! stored; a token is 32 random bytes, so a fast hash is enough.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use rand::RngCore;
use sha2::{Digest as _, Sha256};

use spillway_api::Namespace;

use crate::error::ApiError;
use crate::state::AppState;

pub use spillway_api::Scope;

/// The caller, as its token says.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The namespace its token belongs to: every lookup of the request is confined to it.
    pub namespace: Namespace,
    scopes: Vec<Scope>,
    /// A redacted token: every read it makes shows secrets as marks, and it may not read raw
    /// bytes (api.md v1.2).
    pub redacted: bool,
}

impl Caller {
    /// Fails with 403 unless the token carries `scope`.
    pub fn require(&self, scope: Scope) -> Result<&Self, ApiError> {
        if self.scopes.contains(&scope) {
            Ok(self)
        } else {
            Err(ApiError::Forbidden(scope.as_str()))
        }
    }

    /// Whether a read is to be redacted: when asked, and always for a redacted token.
    pub fn redacts(&self, asked: bool) -> bool {
        asked || self.redacted
    }

    /// Fails with 403 for a redacted token, which reads redacted text only. Called after the
    /// visibility check, so that what it cannot see is still a 404.
    pub fn require_raw(&self) -> Result<&Self, ApiError> {
        if self.redacted {
            Err(ApiError::RedactedOnly)
        } else {
            Ok(self)
        }
    }
}

/// Where the request log finds the caller's namespace once the token has been checked.
#[derive(Debug, Clone, Default)]
pub struct NamespaceSlot(std::sync::Arc<std::sync::OnceLock<String>>);

impl NamespaceSlot {
    /// The namespace, when a token was accepted.
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// Hex SHA-256 of a token, the form stored.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random token.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("spw_{}", hex::encode(bytes))
}

/// Creates a token for `namespace` with `scopes` and returns it (the only time it is seen).
pub async fn create_token(db: &crate::db::Db, namespace: &str, scopes: &[Scope], now: i64) -> anyhow::Result<String> {
    create_token_with(db, namespace, scopes, false, now).await
}

/// Creates a token, `redacted` or not (`token create --redacted`), and returns it.
pub async fn create_token_with(
    db: &crate::db::Db,
    namespace: &str,
    scopes: &[Scope],
    redacted: bool,
    now: i64,
) -> anyhow::Result<String> {
    let namespace = Namespace::new(namespace)?;
    anyhow::ensure!(!scopes.is_empty(), "a token needs at least one scope");
    let token = new_token();
    let grant = crate::db::TokenRow { namespace, scopes: scopes.to_vec(), redacted };
    db.insert_token(&hash_token(&token), &grant, now).await?;
    Ok(token)
}

/// The caller of a request whose token this replica has in its cache; `None` when
/// [`authenticate`] would have more to do (no token, a malformed header, a token not cached).
pub(crate) fn cached_caller(headers: &axum::http::HeaderMap, state: &AppState) -> Option<Caller> {
    cached(state, &hash_token(token_of(headers).ok()?))
}

/// The token of a request's `Authorization` header, or why it has none.
fn token_of(headers: &axum::http::HeaderMap) -> Result<&str, ApiError> {
    let header =
        headers.get(AUTHORIZATION).ok_or(ApiError::Unauthorized("missing Authorization: Bearer <token> header"))?;
    header
        .to_str()
        .ok()
        .and_then(bearer)
        .ok_or(ApiError::Unauthorized("malformed Authorization header: expected Bearer <token>"))
}

/// The caller holding the token whose hash is `hash`, if this replica has it in its cache.
fn cached(state: &AppState, hash: &str) -> Option<Caller> {
    let grant = state.token_cache.get(hash, state.config.token_cache_ttl)?;
    Some(Caller { namespace: grant.namespace, scopes: grant.scopes, redacted: grant.redacted })
}

/// The token of an `Authorization` header: the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= 256).then_some(token)
}

async fn authenticate(parts: &Parts, state: &AppState) -> Result<Caller, ApiError> {
    let hash = hash_token(token_of(&parts.headers)?);
    if let Some(caller) = cached(state, &hash) {
        return Ok(caller);
    }
    let row = state.db.find_token(&hash).await?.ok_or(ApiError::Unauthorized("unknown token"))?;
    // Marked used at most once per cache period per replica: no write per request.
    let (db, now, h) = (state.db.clone(), state.now(), hash.clone());
    tokio::spawn(async move {
        if let Err(e) = db.touch_token(&h, now).await {
            tracing::debug!(cause = %e, "could not record a token's last use");
        }
    });
    state.token_cache.put(hash, row.clone());
    Ok(Caller { namespace: row.namespace, scopes: row.scopes, redacted: row.redacted })
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let caller = authenticate(parts, state).await?;
        if let Some(slot) = parts.extensions.get::<NamespaceSlot>() {
            let _ = slot.0.set(caller.namespace.to_string());
        }
        Ok(caller)
    }
}

/// On a first start (no tokens at all) creates an all-scopes token for namespace `default`
/// and writes it to `<data_dir>/token` with mode 0600. Returns the file when it did.
pub async fn ensure_first_token(state: &AppState) -> anyhow::Result<Option<std::path::PathBuf>> {
    if state.db.count_tokens().await? > 0 {
        return Ok(None);
    }
    let token = create_token(&state.db, "default", &[Scope::Read, Scope::Write, Scope::Admin], state.now()).await?;
    let path = state.config.data_dir.join("token");
    write_private(&path, format!("{token}\n").as_bytes())?;
    tracing::info!(path = %path.display(), namespace = "default", "first start: created a token with all scopes");
    Ok(Some(path))
}

fn write_private(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

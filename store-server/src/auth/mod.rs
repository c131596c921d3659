//! Bearer tokens: each belongs to one namespace and carries scopes. Only their SHA-256 is
//! stored; a token is 32 random bytes, so a fast hash is enough. [`Tokens`] is the handle
//! the HTTP edge authenticates with: the token rows behind this replica's cache. (The axum
//! extractor that calls it is the edge's, in `http/routes/extract.rs`.)

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use rand::RngCore;
use sha2::{Digest as _, Sha256};

use spillway_api::Namespace;

use crate::clock::Clock;
use crate::db::Db;
use crate::error::ApiError;

mod cache;

use cache::TokenCache;

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
pub struct NamespaceSlot(pub(crate) std::sync::Arc<std::sync::OnceLock<String>>);

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

/// What authenticates requests: token rows, and the tokens this replica checked lately.
#[derive(Clone)]
pub struct Tokens {
    db: Db,
    cache: Arc<TokenCache>,
    /// How long a checked token is trusted without asking the database again (a revoked
    /// token is refused by every replica within this).
    ttl: Duration,
    clock: Arc<dyn Clock>,
}

impl Tokens {
    /// Tokens of `db`, each trusted for `ttl` once checked.
    pub fn new(db: Db, ttl: Duration, clock: Arc<dyn Clock>) -> Self {
        Self { db, cache: Arc::default(), ttl, clock }
    }

    /// The caller of a request whose token this replica has in its cache; `None` when
    /// [`Tokens::authenticate`] would have more to do (no token, a malformed header, a token
    /// not cached).
    pub(crate) fn cached_caller(&self, headers: &HeaderMap) -> Option<Caller> {
        self.cached(&hash_token(token_of(headers).ok()?))
    }

    /// The caller of a request, from its `Authorization` header: the cache, else one lookup.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let hash = hash_token(token_of(headers)?);
        if let Some(caller) = self.cached(&hash) {
            return Ok(caller);
        }
        let row = self.db.find_token(&hash).await?.ok_or(ApiError::Unauthorized("unknown token"))?;
        // Marked used at most once per cache period per replica: no write per request.
        let (db, now, h) = (self.db.clone(), self.clock.now_ms(), hash.clone());
        tokio::spawn(async move {
            if let Err(e) = db.touch_token(&h, now).await {
                tracing::debug!(cause = %e, "could not record a token's last use");
            }
        });
        self.cache.put(hash, row.clone());
        Ok(Caller { namespace: row.namespace, scopes: row.scopes, redacted: row.redacted })
    }

    /// The caller holding the token whose hash is `hash`, if this replica has it in its cache.
    fn cached(&self, hash: &str) -> Option<Caller> {
        let grant = self.cache.get(hash, self.ttl)?;
        Some(Caller { namespace: grant.namespace, scopes: grant.scopes, redacted: grant.redacted })
    }
}

/// The token of a request's `Authorization` header, or why it has none.
fn token_of(headers: &HeaderMap) -> Result<&str, ApiError> {
    let header =
        headers.get(AUTHORIZATION).ok_or(ApiError::Unauthorized(
        "no token was sent: send the header Authorization: Bearer <token> (the spillway CLI and SDKs send SPILLWAY_TOKEN; spillway-server token create makes one, and the first start writes one to <data-dir>/token)",
    ))?;
    header
        .to_str()
        .ok()
        .and_then(bearer)
        .ok_or(ApiError::Unauthorized("malformed Authorization header: expected Bearer <token>"))
}

/// The token of an `Authorization` header: the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= 256).then_some(token)
}

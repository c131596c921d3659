//! Tokens: stored as SHA-256 hashes, never in plain text.

use spillway_api::{Namespace, Scope};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::error::{DbError, DbResult};
use super::pool::Db;

/// What a token grants.
#[derive(Debug, Clone)]
pub struct TokenRow {
    /// The namespace it belongs to.
    pub namespace: Namespace,
    /// Its scopes.
    pub scopes: Vec<Scope>,
    /// Every read through it is redacted, and raw bytes are refused (api.md v1.2).
    pub redacted: bool,
}

/// A token as `token list` shows it: never the token, nor its full hash.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenInfo {
    /// What `token revoke` takes: the first 16 hex digits of the token's SHA-256.
    pub id: String,
    /// The namespace it belongs to.
    pub namespace: Namespace,
    /// Its scopes.
    pub scopes: Vec<Scope>,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    /// Milliseconds since the epoch, to within the token cache's 30 seconds; null if never used.
    pub last_used_at: Option<i64>,
    /// Whether it reads redacted text only.
    pub redacted: bool,
}

/// A token's public id: a prefix of its hash, which says nothing about the token itself.
pub fn token_id(hash: &str) -> &str {
    &hash[..hash.len().min(16)]
}

/// A token's namespace and scopes as its row keeps them (scopes space-separated).
fn grant_of(r: &AnyRow) -> DbResult<(Namespace, Vec<Scope>)> {
    let namespace: String = r.try_get("namespace")?;
    let scopes: String = r.try_get("scopes")?;
    let namespace = Namespace::new(&namespace).map_err(|_| DbError::corrupt("namespace", namespace))?;
    let scopes = scopes
        .split_whitespace()
        .map(|s| s.parse().map_err(|_| DbError::corrupt("scope", s)))
        .collect::<DbResult<_>>()?;
    Ok((namespace, scopes))
}

impl Db {
    /// Stores a token's hash.
    pub async fn insert_token(&self, hash: &str, grant: &TokenRow, now: i64) -> DbResult<()> {
        let names: Vec<&str> = grant.scopes.iter().map(Scope::as_str).collect();
        let (hash, namespace, scopes) = (hash.to_owned(), grant.namespace.to_string(), names.join(" "));
        let redacted = i64::from(grant.redacted);
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO tokens (hash, namespace, scopes, redacted, created_at) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(hash)
                .bind(namespace)
                .bind(scopes)
                .bind(redacted)
                .bind(now)
                .execute(c)
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// Looks a token up by its hash.
    pub async fn find_token(&self, hash: &str) -> DbResult<Option<TokenRow>> {
        let row = sqlx::query("SELECT namespace, scopes, redacted FROM tokens WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            let (namespace, scopes) = grant_of(&r)?;
            Ok(TokenRow { namespace, scopes, redacted: r.try_get::<i64, _>("redacted")? != 0 })
        })
        .transpose()
    }

    /// Records that a token was used now.
    pub async fn touch_token(&self, hash: &str, now: i64) -> DbResult<()> {
        let hash = hash.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE hash = $2")
                    .bind(now)
                    .bind(hash)
                    .execute(c)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    /// Every token, oldest first, without its secret.
    pub async fn list_tokens(&self) -> DbResult<Vec<TokenInfo>> {
        let rows = sqlx::query(
            "SELECT hash, namespace, scopes, redacted, created_at, last_used_at FROM tokens ORDER BY created_at, hash",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                let hash: String = r.try_get("hash")?;
                let (namespace, scopes) = grant_of(&r)?;
                Ok(TokenInfo {
                    id: token_id(&hash).to_owned(),
                    namespace,
                    scopes,
                    created_at: r.try_get("created_at")?,
                    last_used_at: r.try_get("last_used_at")?,
                    redacted: r.try_get::<i64, _>("redacted")? != 0,
                })
            })
            .collect()
    }

    /// Deletes the token whose id is `id`; false when there is none.
    pub async fn revoke_token(&self, id: &str) -> DbResult<bool> {
        let hashes: Vec<String> = sqlx::query_scalar("SELECT hash FROM tokens").fetch_all(&self.pool).await?;
        let Some(hash) = hashes.into_iter().find(|h| token_id(h) == id) else {
            return Ok(false);
        };
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("DELETE FROM tokens WHERE hash = $1").bind(hash).execute(c).await?;
                Ok(())
            })
        })
        .await?;
        Ok(true)
    }

    /// How many tokens exist (the first start creates one when there are none).
    pub async fn count_tokens(&self) -> DbResult<i64> {
        Ok(sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM tokens").fetch_one(&self.pool).await?)
    }
}

//! Tokens: stored as SHA-256 hashes, never in plain text.

use sqlx::Row;

use super::Db;

/// What a token grants.
#[derive(Debug, Clone)]
pub struct TokenRow {
    /// The namespace it belongs to.
    pub namespace: String,
    /// Its scopes.
    pub scopes: Vec<String>,
}

impl Db {
    /// Stores a token's hash.
    pub async fn insert_token(
        &self,
        hash: &str,
        namespace: &str,
        scopes: &[String],
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let (hash, namespace, scopes) = (hash.to_owned(), namespace.to_owned(), scopes.join(" "));
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("INSERT INTO tokens (hash, namespace, scopes, created_at) VALUES ($1, $2, $3, $4)")
                    .bind(hash)
                    .bind(namespace)
                    .bind(scopes)
                    .bind(now)
                    .execute(c)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    /// Looks a token up by its hash.
    pub async fn find_token(&self, hash: &str) -> Result<Option<TokenRow>, sqlx::Error> {
        let row = sqlx::query("SELECT namespace, scopes FROM tokens WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| -> Result<_, sqlx::Error> {
            let scopes: String = r.try_get("scopes")?;
            Ok(TokenRow {
                namespace: r.try_get("namespace")?,
                scopes: scopes.split_whitespace().map(str::to_owned).collect(),
            })
        })
        .transpose()
    }

    /// How many tokens exist (the first start creates one when there are none).
    pub async fn count_tokens(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM tokens").fetch_one(&self.pool).await
    }
}

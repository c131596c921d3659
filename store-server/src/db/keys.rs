//! Secrets every replica shares, kept in the database: made by the first server that needs
//! one, read by the others.

use super::error::{DbError, DbResult};
use super::pool::Db;

impl Db {
    /// The 32-byte key named `name` that every replica shares, made by the first to ask.
    pub async fn server_key(&self, name: &str) -> DbResult<[u8; 32]> {
        let fresh: [u8; 32] = rand::random();
        let (name, hex) = (name.to_owned(), hex::encode(fresh));
        let n = name.clone();
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query("INSERT INTO server_keys (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
                    .bind(n)
                    .bind(hex)
                    .execute(c)
                    .await?;
                Ok(())
            })
        })
        .await?;
        let stored: String = sqlx::query_scalar("SELECT value FROM server_keys WHERE name = $1")
            .bind(&name)
            .fetch_one(&self.pool)
            .await?;
        let bytes = hex::decode(&stored).ok().and_then(|b| <[u8; 32]>::try_from(b).ok());
        bytes.ok_or_else(|| DbError::corrupt("server key", stored))
    }
}

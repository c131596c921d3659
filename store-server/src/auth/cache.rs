//! The tokens this replica checked lately, so that a request costs no database round trip to
//! authenticate.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::db::TokenRow;

/// Most tokens kept; the cache is emptied when it is full.
const TOKEN_CACHE_MAX: usize = 10_000;

/// A checked token: what it grants, and when it was checked.
type CheckedToken = (TokenRow, std::time::Instant);

/// Tokens recently found in the database, by hash.
#[derive(Debug, Default)]
pub(crate) struct TokenCache {
    map: Mutex<HashMap<String, CheckedToken>>,
}

impl TokenCache {
    /// What a token checked less than `ttl` ago grants.
    pub(crate) fn get(&self, hash: &str, ttl: std::time::Duration) -> Option<TokenRow> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(hash).filter(|(_, at)| at.elapsed() < ttl).map(|(grant, _)| grant.clone())
    }

    /// Remembers a token just checked.
    pub(crate) fn put(&self, hash: String, grant: TokenRow) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= TOKEN_CACHE_MAX {
            map.clear();
        }
        map.insert(hash, (grant, std::time::Instant::now()));
    }
}

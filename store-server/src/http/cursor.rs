//! Cursors a client carries from one answer to the next (`/v1/refs`, `/v1/search`): opaque,
//! and bound to the namespace — and the query — they were given for.
//!
//! A position inside the store (a reference's row id, say) is global: handed out as it is, it
//! would tell one namespace how many rows the others wrote between two of its requests. So a
//! cursor is the position sealed with ChaCha20-Poly1305 under a key every replica shares
//! (made once, kept in the database), with the namespace and the route (and the query's
//! fingerprint) as associated data: nobody can read it, forge it, or use it in another
//! namespace or for another query. Any of that is `400 invalid_argument`.

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use spillway_api::Namespace;

use crate::error::ApiError;

/// Seals and opens cursors with the replicas' shared key.
#[derive(Clone)]
pub struct Cursors {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for Cursors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cursors(..)")
    }
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

impl Cursors {
    /// Cursors under a 32-byte key.
    pub fn new(key: &[u8; 32]) -> Self {
        Self { cipher: ChaCha20Poly1305::new(Key::from_slice(key)) }
    }

    fn aad(kind: &str, ns: &Namespace, query: &[u8]) -> Vec<u8> {
        let mut aad = Vec::with_capacity(kind.len() + ns.as_str().len() + query.len() + 2);
        aad.extend_from_slice(kind.as_bytes());
        aad.push(0);
        aad.extend_from_slice(ns.as_str().as_bytes());
        aad.push(0);
        aad.extend_from_slice(query);
        aad
    }

    /// A cursor for `position` on route `kind`, in `ns`, for the query fingerprinted by `query`.
    pub fn seal(&self, kind: &str, ns: &Namespace, query: &[u8], position: &[u8]) -> String {
        let nonce: [u8; 12] = rand::random();
        let aad = Self::aad(kind, ns, query);
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: position, aad: &aad })
            .expect("sealing a short message cannot fail");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        B64.encode(out)
    }

    /// The position a cursor holds, if it was sealed here for `kind`, `ns` and `query`.
    pub fn open(&self, kind: &str, ns: &Namespace, query: &[u8], cursor: &str) -> Result<Vec<u8>, ApiError> {
        let bad = || {
            ApiError::InvalidArgument(
                "invalid cursor: pass the next_cursor of an earlier answer to the same request".into(),
            )
        };
        let raw = B64.decode(cursor.as_bytes()).map_err(|_| bad())?;
        if raw.len() < 12 + 16 {
            return Err(bad());
        }
        let (nonce, sealed) = raw.split_at(12);
        let aad = Self::aad(kind, ns, query);
        self.cipher.decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: &aad }).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_opens_only_where_it_was_given() {
        let c = Cursors::new(&[7; 32]);
        let (a, b) = (Namespace::new("ns-a").unwrap(), Namespace::new("ns-b").unwrap());
        let cur = c.seal("refs", &a, b"", &42i64.to_be_bytes());
        assert_eq!(c.open("refs", &a, b"", &cur).unwrap(), 42i64.to_be_bytes());
        assert!(c.open("refs", &b, b"", &cur).is_err(), "another namespace");
        assert!(c.open("search", &a, b"", &cur).is_err(), "another route");
        assert!(c.open("refs", &a, b"q", &cur).is_err(), "another query");
        assert!(Cursors::new(&[8; 32]).open("refs", &a, b"", &cur).is_err(), "another key");
        let mut forged = cur.clone().into_bytes();
        forged[20] = if forged[20] == b'A' { b'B' } else { b'A' };
        assert!(c.open("refs", &a, b"", std::str::from_utf8(&forged).unwrap()).is_err(), "a changed byte");
        for junk in ["", "11", "not base64!", "AAAA"] {
            assert!(c.open("refs", &a, b"", junk).is_err(), "{junk:?}");
        }
        assert_ne!(cur, c.seal("refs", &a, b"", &42i64.to_be_bytes()), "the same position twice looks different");
    }
}

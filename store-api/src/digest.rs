//! The checked digest types: a value of these types can only hold a well-formed digest, so a
//! handler never sees a raw string that could become a path or an object key.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid digest {input:?}: expected \"blake3:\" or \"sha256:\" followed by 64 lowercase hex digits")]
pub struct DigestError {
    input: String,
}

impl DigestError {
    fn new(input: &str) -> Self {
        // Keep the echo short: the input may be an attacker's megabyte.
        let input: String = input.chars().take(80).collect();
        Self { input }
    }
}

fn parse_hex32(hex_part: &str) -> Option<[u8; 32]> {
    if hex_part.len() != 64 || !hex_part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut out).ok()?;
    Some(out)
}

/// A blob's key: the BLAKE3 hash of its bytes, written `blake3:<64 lowercase hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Wraps a BLAKE3 hash that was just computed.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Hashes `data` in one go; for small inputs and tests.
    pub fn of(data: &[u8]) -> Self {
        Self(*blake3::hash(data).as_bytes())
    }

    /// The raw hash.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits, safe to use in a path or an object key.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the 64 lowercase hex digits of [`Digest::hex`] (a stored key, a file name).
    pub fn from_hex(hex: &str) -> Option<Self> {
        parse_hex32(hex).map(Self)
    }
}

/// Writes `prefix` and the 64 lowercase hex digits of `hash` in one piece (no allocation: a
/// digest is written into every answer and log line that names a blob).
fn write_prefixed(f: &mut fmt::Formatter<'_>, prefix: &str, hash: &[u8; 32]) -> fmt::Result {
    let mut digits = [0u8; 64];
    hex::encode_to_slice(hash, &mut digits).map_err(|_| fmt::Error)?;
    f.write_str(prefix)?;
    // Hex digits are ASCII.
    f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_prefixed(f, "blake3:", &self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.strip_prefix("blake3:").and_then(parse_hex32).map(Self).ok_or_else(|| DigestError::new(s))
    }
}

/// A SHA-256 hash, written `sha256:<64 lowercase hex>`; blobs can be looked up by it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Digest([u8; 32]);

impl Sha256Digest {
    /// Wraps a SHA-256 hash that was just computed.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
    /// The raw hash.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the 64 lowercase hex digits of [`Sha256Digest::hex`].
    pub fn from_hex(hex: &str) -> Option<Self> {
        parse_hex32(hex).map(Self)
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_prefixed(f, "sha256:", &self.0)
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Sha256Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.strip_prefix("sha256:").and_then(parse_hex32).map(Self).ok_or_else(|| DigestError::new(s))
    }
}

/// A digest in either accepted form, as it may appear in a URL.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AnyDigest {
    /// `blake3:…`, the blob's key.
    Blake3(Digest),
    /// `sha256:…`, resolved through the blob table.
    Sha256(Sha256Digest),
}

impl fmt::Display for AnyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Blake3(d) => d.fmt(f),
            Self::Sha256(d) => d.fmt(f),
        }
    }
}

impl FromStr for AnyDigest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.starts_with("sha256:") {
            s.parse().map(Self::Sha256)
        } else {
            s.parse().map(Self::Blake3)
        }
    }
}

impl From<Digest> for AnyDigest {
    fn from(d: Digest) -> Self {
        Self::Blake3(d)
    }
}

impl From<&Digest> for AnyDigest {
    fn from(d: &Digest) -> Self {
        Self::Blake3(*d)
    }
}

impl From<Sha256Digest> for AnyDigest {
    fn from(d: Sha256Digest) -> Self {
        Self::Sha256(d)
    }
}

impl From<&Sha256Digest> for AnyDigest {
    fn from(d: &Sha256Digest) -> Self {
        Self::Sha256(*d)
    }
}

impl From<&AnyDigest> for AnyDigest {
    fn from(d: &AnyDigest) -> Self {
        *d
    }
}

serde_via_str!(Digest);
serde_via_str!(Sha256Digest);
serde_via_str!(AnyDigest);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blake3_of_known_input() {
        // The BLAKE3 test vector of the empty input.
        let empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";
        assert_eq!(Digest::of(b"").hex(), empty);
        assert_eq!(Digest::of(b"").to_string(), format!("blake3:{empty}"));
    }

    #[test]
    fn accepts_both_forms() {
        let hex = "ab".repeat(32);
        let b: Digest = format!("blake3:{hex}").parse().unwrap();
        assert_eq!(b.to_string(), format!("blake3:{hex}"));
        let s: AnyDigest = format!("sha256:{hex}").parse().unwrap();
        assert!(matches!(s, AnyDigest::Sha256(_)));
        assert_eq!(s.to_string(), format!("sha256:{hex}"));
        let a: AnyDigest = format!("blake3:{hex}").parse().unwrap();
        assert_eq!((a.to_string(), format!("{a:?}").contains(&hex)), (format!("blake3:{hex}"), true));
    }

    #[test]
    fn rejects_malformed() {
        let hex = "ab".repeat(32);
        for bad in [
            format!("blake3:{}", hex.to_uppercase()),
            format!("blake3:{}", &hex[..63]),
            format!("blake3:{hex}0"),
            format!("md5:{hex}"),
            format!("blake3:../{}", &hex[..61]),
            hex.clone(),
            "blake3:".to_string(),
            String::new(),
        ] {
            assert!(bad.parse::<AnyDigest>().is_err(), "{bad} accepted");
        }
    }

    proptest! {
        #[test]
        fn roundtrips(bytes in any::<[u8; 32]>()) {
            let d = Digest::from_bytes(bytes);
            prop_assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
            prop_assert_eq!(d.as_bytes(), &bytes);
            prop_assert_eq!(format!("blake3:{}", d.hex()), d.to_string());
            prop_assert_eq!(format!("{d:?}"), d.to_string());
            let s = Sha256Digest::from_bytes(bytes);
            prop_assert_eq!(s.to_string().parse::<Sha256Digest>().unwrap(), s);
            prop_assert_eq!(s.as_bytes(), &bytes);
            prop_assert_eq!(format!("{s:?}"), s.to_string());
        }

        /// Valid and near-valid digests: the right or a wrong algorithm, 62 to 66 characters,
        /// lower- or upper-case hex or a path character. Exactly the canonical form parses.
        #[test]
        fn accepts_exactly_the_canonical_form(
            algo in prop_oneof![Just("blake3"), Just("sha256"), Just("BLAKE3"), Just("md5"), Just("")],
            colon: bool,
            hex in "[0-9a-f]{62,66}",
            flaw in proptest::option::of((0usize..66, prop_oneof![Just('A'), Just('/'), Just('.'), Just('g'), Just(' ')])),
        ) {
            let mut hex = hex;
            if let Some((at, c)) = flaw {
                let at = at % hex.len();
                hex.replace_range(at..at + 1, &c.to_string());
            }
            let s = format!("{algo}{}{hex}", if colon { ":" } else { "" });
            let canonical = matches!(algo, "blake3" | "sha256") && colon && hex.len() == 64 && flaw.is_none();
            match s.parse::<AnyDigest>() {
                Ok(d) => {
                    prop_assert!(canonical, "{} accepted", s);
                    prop_assert_eq!(d.to_string(), s.clone());
                    prop_assert_eq!(s.parse::<Digest>().is_ok(), algo == "blake3");
                }
                Err(_) => prop_assert!(!canonical, "{} refused", s),
            }
        }
    }
}

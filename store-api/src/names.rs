//! Names checked once, where they enter: a namespace, a token scope, a stream id. Past that
//! point code holds the type, never a string it would have to check again.

use std::fmt;
use std::str::FromStr;

/// A name that does not follow its rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {rule}")]
pub struct NameError {
    what: &'static str,
    value: String,
    rule: &'static str,
}

impl NameError {
    fn new(what: &'static str, value: &str, rule: &'static str) -> Self {
        Self { what, value: value.chars().take(80).collect(), rule }
    }
}

/// A namespace: `[a-z0-9_.-]{1,64}`. Tokens belong to one; every reference and stream lives
/// in one, and nothing crosses between them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(String);

impl Namespace {
    /// Checks `name` against the rule.
    pub fn new(name: &str) -> Result<Self, NameError> {
        if crate::valid_namespace(name) {
            Ok(Self(name.to_owned()))
        } else {
            Err(NameError::new("namespace", name, "use [a-z0-9_.-]{1,64}"))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where a token's rights are checked: the operations each scope allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Upload, streams.
    Write,
    /// Head, get, read, grep, list.
    Read,
    /// Pin, delete, retention.
    Admin,
}

impl Scope {
    /// Every scope, in the order the CLI lists them.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Write, Scope::Admin];

    /// The spelling in tokens and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
            Self::Admin => "admin",
        }
    }
}

impl FromStr for Scope {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "write" => Ok(Self::Write),
            "read" => Ok(Self::Read),
            "admin" => Ok(Self::Admin),
            _ => Err(NameError::new("scope", s, "use read, write or admin")),
        }
    }
}

/// A stream's id: 32 lowercase hex digits, handed out when the stream is created.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamId(String);

impl StreamId {
    /// Checks `id` against the rule.
    pub fn new(id: &str) -> Result<Self, NameError> {
        if id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            Ok(Self(id.to_owned()))
        } else {
            Err(NameError::new("stream id", id, "expected 32 lowercase hex digits"))
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! string_name {
    ($t:ty) => {
        impl FromStr for $t {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::ops::Deref for $t {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}
string_name!(Namespace);
string_name!(StreamId);

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

serde_via_str!(Namespace);
serde_via_str!(StreamId);
serde_via_str!(Scope);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_once() {
        assert_eq!(Namespace::new("team-a.prod_1").unwrap().as_str(), "team-a.prod_1");
        for bad in ["", "Team", "a b", "ä", &"n".repeat(65)] {
            assert!(Namespace::new(bad).is_err(), "{bad:?}");
        }
        assert!(Namespace::new(&"n".repeat(64)).is_ok());
        assert_eq!("admin".parse::<Scope>().unwrap(), Scope::Admin);
        assert!("Admin".parse::<Scope>().is_err());
        for s in Scope::ALL {
            assert_eq!(s.as_str().parse::<Scope>().unwrap(), s);
        }
        assert!(StreamId::new(&"0a".repeat(16)).is_ok());
        for bad in ["0A".repeat(16), "0a".repeat(15), "0g".repeat(16), "0a".repeat(17)] {
            assert!(StreamId::new(&bad).is_err(), "{bad:?}");
        }
        let e = StreamId::new(&"x".repeat(500)).unwrap_err().to_string();
        assert!(e.len() < 200, "the value is shortened in the message: {e}");
        assert_eq!(serde_json::to_string(&Scope::Write).unwrap(), "\"write\"");
        assert!(serde_json::from_str::<Namespace>("\"Bad\"").is_err());
    }
}

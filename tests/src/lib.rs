//! Integration tests live in tests/; see tests/it/main.rs.

//! A read page as JSON, written fast: `content` is up to 100,000 bytes of text, and escaping
//! it was half of the capped read's CPU. The next byte to escape is found eight bytes at a
//! time, and the runs between are copied whole.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use spillway_api::ReadPage;

/// A flag (0x80) in each byte of `w` that is `"`, `\` or below 0x20. Only the lowest flag is
/// exact (a borrow can set flags above it), which is all the scan needs.
fn escape_flags(w: u64) -> u64 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let zero_bytes = |x: u64| x.wrapping_sub(LO) & !x & HI;
    let below_space = w.wrapping_sub(LO * 0x20) & !w & HI;
    below_space | zero_bytes(w ^ (LO * u64::from(b'"'))) | zero_bytes(w ^ (LO * u64::from(b'\\')))
}

/// Where the next byte to escape is, from `from` on (`b.len()` when there is none): eight
/// bytes at a time, to the exact byte.
fn next_escape(b: &[u8], mut from: usize) -> usize {
    while from + 8 <= b.len() {
        let word = u64::from_le_bytes(b[from..from + 8].try_into().unwrap_or_default());
        let flags = escape_flags(word);
        if flags != 0 {
            return from + (flags.trailing_zeros() / 8) as usize;
        }
        from += 8;
    }
    b[from..].iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).map_or(b.len(), |k| from + k)
}

/// Appends `s` as a JSON string (quotes included), escaped as serde_json escapes it.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    out.reserve(b.len() + b.len() / 8 + 2);
    out.push(b'"');
    let mut run = 0;
    loop {
        let at = next_escape(b, run);
        out.extend_from_slice(&b[run..at]);
        let Some(&c) = b.get(at) else {
            break;
        };
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(c >> 4)], HEX[usize::from(c & 0xf)]]),
        }
        run = at + 1;
    }
    out.push(b'"');
}

/// `Json(page)`, with `content` escaped by [`push_json_str`].
#[derive(Debug)]
pub struct PageJson(pub ReadPage);

impl IntoResponse for PageJson {
    fn into_response(self) -> Response {
        let mut page = self.0;
        let content = std::mem::take(&mut page.content);
        // `content` is the last field: serialize the rest, then put the text in its place.
        let mut out = serde_json::to_vec(&page).unwrap_or_default();
        let tail = br#""content":""}"#;
        if out.ends_with(tail) {
            out.truncate(out.len() - 3);
            push_json_str(&mut out, &content);
            out.push(b'}');
        } else {
            page.content = content;
            out = serde_json::to_vec(&page).unwrap_or_default();
        }
        ([(header::CONTENT_TYPE, "application/json")], out).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn same_as_serde_json(s in "\\PC*|[\\x00-\\x7f]{0,200}|[a\"\\\\\n\\x00-\\x1f\\x7f-\\u{10ffff}]{0,64}") {
            let mut out = Vec::new();
            push_json_str(&mut out, &s);
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
        }
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_does() {
        let all: String = (0..=0x7fu8).map(char::from).chain(['é', '€', '😀']).collect();
        for shift in 0..9 {
            let s = format!("{}{all}{all}", "x".repeat(shift));
            let mut out = Vec::new();
            push_json_str(&mut out, &s);
            assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap(), "shift {shift}");
        }
    }
}

//! A read page as JSON, written fast: `content` is up to 100,000 bytes of text, and escaping it
//! was half of a capped read's CPU. `sonic-rs` serializes with SIMD: it finds the bytes to
//! escape sixteen or more at a time.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use spillway_api::ReadPage;

/// `Json(page)`, serialized by `sonic-rs`.
#[derive(Debug)]
pub struct PageJson(pub ReadPage);

impl IntoResponse for PageJson {
    fn into_response(self) -> Response {
        match sonic_rs::to_vec(&self.0) {
            Ok(out) => ([(header::CONTENT_TYPE, "application/json")], out).into_response(),
            Err(e) => crate::error::ApiError::internal(e).into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page(content: String) -> ReadPage {
        serde_json::from_value(serde_json::json!({
            "digest": "blake3:00", "total_size": 1, "total_lines": 1, "offset": 0, "length": 1,
            "next_offset": null, "eof": true, "start_line": 1, "end_line": 1, "next_line": null,
            "capped": false, "lossy": false, "content": content,
        }))
        .unwrap()
    }

    async fn body(p: ReadPage) -> ReadPage {
        let resp = PageJson(p).into_response();
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    proptest! {
        #[test]
        fn any_text_reads_back_the_same(s in "\\PC*|[\\x00-\\x7f]{0,200}|[a\"\\\\\n\\x00-\\x1f\\x7f-\\u{10ffff}]{0,64}") {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let p = page(s);
            prop_assert_eq!(rt.block_on(body(p.clone())), p);
        }
    }

    #[tokio::test]
    async fn every_byte_reads_back_at_every_alignment() {
        let all: String = (0..=0x7fu8).map(char::from).chain(['é', '€', '😀']).collect();
        for shift in 0..33 {
            let p = page(format!("{}{all}{all}", "x".repeat(shift)));
            assert_eq!(body(p.clone()).await, p, "shift {shift}");
        }
    }
}

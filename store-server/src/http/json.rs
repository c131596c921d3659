//! A read page as JSON, written fast: `content` is up to 100,000 bytes of text, and escaping it
//! was half of a capped read's CPU. `sonic-rs` serializes with SIMD: it finds the bytes to
//! escape sixteen or more at a time. A page whose text is escaped already (`blobs/text/`) is
//! written as its fields followed by the escaped pieces, without copying them.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use spillway_api::ReadPage;

use crate::blobs::text::EscapedPage;

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

/// A page with its content escaped already, as JSON: the same bytes as [`PageJson`] writes.
#[derive(Debug)]
pub(crate) struct EscapedJson(pub EscapedPage);

/// How the fields of a page with an empty `content` end, `content` being the last.
const EMPTY_CONTENT: &[u8] = br#""content":""}"#;

impl IntoResponse for EscapedJson {
    fn into_response(self) -> Response {
        let EscapedPage { mut page, content } = self.0;
        // `redactions` follows `content`: written after it, by hand.
        let end = match page.redactions.take() {
            Some(n) => Bytes::from(format!("\",\"redactions\":{n}}}")),
            None => Bytes::from_static(b"\"}"),
        };
        let mut fields = match sonic_rs::to_vec(&page) {
            Ok(out) if out.ends_with(EMPTY_CONTENT) => out,
            Ok(_) => return crate::error::ApiError::internal("a page's last field is not its content").into_response(),
            Err(e) => return crate::error::ApiError::internal(e).into_response(),
        };
        fields.truncate(fields.len() - 2); // `"}`: the content goes in between
        let mut pieces = VecDeque::with_capacity(content.len() + 2);
        pieces.push_back(Bytes::from(fields));
        pieces.extend(content.into_iter().filter(|p| !p.is_empty()));
        pieces.push_back(end);
        ([(header::CONTENT_TYPE, "application/json")], Body::new(Pieces::new(pieces))).into_response()
    }
}

/// A body of pieces sent one after the other, its length known: hyper writes them together
/// (vectored), with a `Content-Length`. Public for the capped read's floor
/// (`spillway-read-floor`), which answers with the same body.
#[derive(Debug)]
pub struct Pieces {
    pieces: VecDeque<Bytes>,
    left: u64,
}

impl Pieces {
    /// The body of `pieces`, in order.
    pub fn new(pieces: VecDeque<Bytes>) -> Self {
        let left = pieces.iter().map(|p| p.len() as u64).sum();
        Self { pieces, left }
    }
}

impl HttpBody for Pieces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let piece = self.pieces.pop_front();
        if let Some(p) = &piece {
            self.left -= p.len() as u64;
        }
        Poll::Ready(piece.map(|p| Ok(Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
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

//! The capped read API and grep, over HTTP.

use bytes::Bytes;
use rand::{RngCore, SeedableRng};
use reqwest::{Method, StatusCode};
use spillway_api::ContextLine;
use spillway_client::{GrepRequest, ReadRequest, UploadOptions};

use crate::support::*;

/// On S3 a blob's blocks, once read, are kept in memory: paging through it again asks the store
/// for nothing and gives the same pages. (On disk the kernel's page cache does this.)
#[tokio::test]
async fn pages_read_again_come_from_the_block_cache() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let text: String = (0..60_000).map(|i| format!("line {i}\n")).collect();
    let d = c.put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap().digest;
    let page_through = || async {
        let (mut got, mut offset) = (String::new(), Some(0));
        while let Some(at) = offset {
            let page = c.read(&d, ReadRequest::Bytes { offset: at, limit: None }).await.unwrap();
            got.push_str(&page.content);
            offset = page.next_offset;
        }
        got
    };
    assert_eq!(page_through().await, text);
    let asked = srv.s3_requests("get");
    assert_eq!(page_through().await, text);
    assert_eq!(srv.s3_requests("get"), asked, "the second pass asked the store for nothing");
    // 590 KB: three blocks of 256 KiB, each fetched once.
    assert_eq!(asked, 3 * u64::from(is_remote()));
    srv.stop().await;
}

#[tokio::test]
async fn capped_reads_from_escaped_text_are_the_usual_pages() {
    use std::sync::atomic::Ordering;
    let plain = TestServer::start_with(|c| c.text_cache_bytes = 0).await;
    let srv = TestServer::start().await;
    // Quotes, tabs, control bytes and characters of 2, 3 and 4 bytes on every line; one
    // invalid byte (its pages are lossy, and cut the usual way).
    let mut data: Vec<u8> = (0..40_000).flat_map(|i| format!("{i}\t\"é€😀\" \\ \u{1}x\r\n").into_bytes()).collect();
    data[777_777] = 0xFF;
    let size = data.len() as u64;
    let data = Bytes::from(data);
    let d = srv.client().put(data.clone(), &UploadOptions::default()).await.unwrap().digest;
    assert_eq!(plain.client().put(data, &UploadOptions::default()).await.unwrap().digest, d);
    let mut asks: Vec<String> = (0..60)
        .map(|i| format!("offset={}&limit={}", i * 20_011 % size, [1, 7, 4096, 100_000, 1_000_000][i as usize % 5]))
        .collect();
    let edges = [(0, 100_000), (65_535, 100_000), (65_536, 3), (777_700, 100_000), (size - 5, 100_000), (size, 10)];
    asks.extend(edges.iter().map(|(offset, limit)| format!("offset={offset}&limit={limit}")));
    let escaped = || srv.state.blobs.probes.escaped_pages.load(Ordering::Relaxed);
    compare_pages(&plain, &srv, &d, &asks).await;
    assert!(escaped() > 40, "most byte pages came from the escaped text");
    // Line pages: numbered lines, the default count, many lines capped by bytes, past the end.
    let before = escaped();
    let mut asks: Vec<String> =
        (0..20).map(|i| format!("line={}&lines={}", 1 + i * 2_017, [1, 50, 2000, 10_000][i as usize % 4])).collect();
    asks.extend(
        ["line=1", "lines=3", "line=25000", "line=40000&lines=5", "line=40001", "line=40002"].map(String::from),
    );
    compare_pages(&plain, &srv, &d, &asks).await;
    assert!(escaped() - before > 15, "most line pages came from the escaped text");
    // Random bytes (an agent `cat`s a binary): every page lossy, from the decoded blocks.
    let mut random = vec![0u8; 400_000];
    rand::rngs::StdRng::seed_from_u64(11).fill_bytes(&mut random);
    let random = Bytes::from(random);
    let d = srv.client().put(random.clone(), &UploadOptions::default()).await.unwrap().digest;
    plain.client().put(random.clone(), &UploadOptions::default()).await.unwrap();
    let asks: Vec<String> = (0..24)
        .map(|i| format!("offset={}&limit={}", i * 16_411 % 400_000, [4, 5000, 100_000, 1_000_000][i as usize % 4]))
        .collect();
    let before = escaped();
    compare_pages(&plain, &srv, &d, &asks).await;
    assert!(escaped() - before >= asks.len() as u64, "every lossy page came from the decoded blocks");
    assert_eq!(plain.state.blobs.probes.escaped_pages.load(Ordering::Relaxed), 0);
    plain.stop().await;
    srv.stop().await;
}

/// The capped reads the listener answers before the router (a plain page from the text cache,
/// for a cached token and blob) are the router's own answers, byte for byte, and counted in the
/// same series; everything else (no token, escapes, redaction, errors, a blob not cached) goes
/// to the router as before.
#[tokio::test]
async fn reads_answered_before_the_router_are_the_routers_answers() {
    use std::sync::atomic::Ordering;
    use tower::ServiceExt;
    let srv = TestServer::start().await;
    let c = srv.client();
    let text: String = (0..50_000).map(|i| format!("{i}\t\"é€\" \\ line\n")).collect();
    let d = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let other = c.put(Bytes::from_static(b"small and inline\n"), &UploadOptions::default()).await.unwrap().digest;
    let redacted = srv.redacted_token("ns-a", &[spillway_server::auth::Scope::Read]).await;
    let router = spillway_server::http::routes::router(srv.state.clone());
    let early = || srv.state.blobs.probes.reads_before_router.load(Ordering::Relaxed);
    let served = || async {
        let m = reqwest::get(format!("{}/metrics", srv.metrics_url)).await.unwrap().text().await.unwrap();
        let series = r#"spillway_http_requests_total{method="GET",route="/v1/blobs/{digest}/read",status="200"} "#;
        m.lines().find_map(|l| l.strip_prefix(series)).map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    // Over HTTP (the listener, then the router if it declines) and straight to the router.
    let both = |path: String, token: Option<String>| {
        let (router, url) = (router.clone(), format!("{}{path}", srv.url));
        async move {
            let mut ask = reqwest::Client::new().get(url);
            let mut direct = axum::http::Request::get(&path);
            if let Some(t) = &token {
                ask = ask.bearer_auth(t);
                direct = direct.header("authorization", format!("Bearer {t}"));
            }
            let got = ask.send().await.unwrap();
            let got = (got.status().as_u16(), got.headers()["content-type"].clone(), got.bytes().await.unwrap());
            let want = router.oneshot(direct.body(axum::body::Body::empty()).unwrap()).await.unwrap();
            let ct = want.headers()["content-type"].clone();
            let want = (want.status().as_u16(), ct, axum::body::to_bytes(want.into_body(), 1 << 21).await.unwrap());
            assert_eq!((got.0, &got.1), (want.0, &want.1), "{path}");
            assert!(got.2 == want.2, "{path}: the bodies differ");
            got.0
        }
    };
    let token = Some(srv.token.clone());
    let path = |ask: &str| format!("/v1/blobs/{d}/read?{ask}");
    let plain = [
        "offset=0&limit=100000",
        "offset=123457&limit=5000",
        "limit=3&offset=9&wait_ms=5",
        "offset=1038800",
        "",
        "line=100&lines=20",
        "line=49999",
    ];
    // The first pass fills the caches: the token's, the blob's, and the text cache's blocks
    // (a block is escaped when a second page starts in it).
    for ask in plain {
        assert_eq!(both(path(ask), token.clone()).await, 200, "{ask}");
    }
    let (before, served_before) = (early(), served().await);
    for ask in plain {
        assert_eq!(both(path(ask), token.clone()).await, 200, "{ask}");
    }
    // Only where visibility is cached: the embedded backend (PostgreSQL always asks the database).
    let expected = if is_remote() { 0 } else { plain.len() as u64 };
    assert_eq!(early() - before, expected, "every plain page went before the router on SQLite, none on PostgreSQL");
    // Counted in the request series, once over HTTP and once by the router's own layer
    // (other tests in this process may add to it too).
    assert!(served().await - served_before >= 2.0 * plain.len() as f64);
    // What it leaves to the router: the same answers as ever.
    let before = early();
    let (raw, bad) = (d.to_string(), "blake3:00");
    let declined = [
        (path("offset=%31&limit=5"), token.clone()),
        (format!("/v1/blobs/{}/read?offset=1", raw.replace(':', "%3A")), token.clone()),
        (path("offset=1"), None),
        (path("offset=1"), Some("spw_not_a_token".into())),
        (path("offset=1"), Some(redacted)),
        (path("redact=true"), token.clone()),
        (path("offset=x"), token.clone()),
        (path("offset=1&line=2"), token.clone()),
        (path("line=0"), token.clone()),
        (path("offset=1048570"), token.clone()),
        // Inside a character of three bytes: a lossy page, cut the usual way.
        (path("offset=7&limit=3"), token.clone()),
        (format!("/v1/blobs/{bad}/read"), token.clone()),
        (format!("/v1/blobs/{}/read", spillway_api::Digest::of(b"never stored")), token.clone()),
        (format!("/v1/blobs/{other}/read"), token.clone()),
        (format!("/v1/blobs/{d}/read/"), token.clone()),
    ];
    for (p, t) in declined {
        both(p, t).await;
    }
    assert_eq!(early(), before, "none of those went before the router");
    srv.stop().await;
}

/// Reads each page (`asks`: read queries) of `d` from both servers, the second one twice (a
/// block is escaped when the second page starts in it), and asserts the same status and body.
async fn compare_pages(plain: &TestServer, srv: &TestServer, d: &spillway_api::Digest, asks: &[String]) {
    for ask in asks {
        let path = format!("/v1/blobs/{d}/read?{ask}");
        let get = |s: &TestServer| {
            let r = s.client().request(Method::GET, &path).send();
            async move {
                let r = r.await.unwrap();
                (r.status(), r.bytes().await.unwrap())
            }
        };
        let want = get(plain).await;
        for _ in 0..2 {
            let got = get(srv).await;
            assert_eq!(String::from_utf8_lossy(&got.1), String::from_utf8_lossy(&want.1), "{ask}");
            assert_eq!(got.0, want.0, "{ask}");
        }
    }
}

#[tokio::test]
async fn byte_pages_are_capped_and_concatenate() {
    let srv = TestServer::start().await;
    let c = srv.client();
    // Multi-byte characters straddle every page boundary.
    let text: String = (0..60_000).map(|i| if i % 7 == 0 { "é€\n".to_owned() } else { format!("{i}😀") }).collect();
    let d = c.put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap().digest;
    let mut out = String::new();
    let mut offset = 0;
    let mut pages = 0;
    loop {
        let p = c.read(&d, ReadRequest::Bytes { offset, limit: Some(1_000_000) }).await.unwrap();
        assert!(p.content.len() <= 100_000);
        assert_eq!(p.length as usize, p.content.len());
        assert!(!p.lossy);
        assert_eq!(p.total_size as usize, text.len());
        out.push_str(&p.content);
        pages += 1;
        match p.next_offset {
            Some(n) => {
                assert!(p.capped, "a larger limit is capped and says so");
                offset = n
            }
            None => {
                assert!(p.eof);
                break;
            }
        }
    }
    assert_eq!(out, text);
    assert!(pages >= text.len() / 100_000);
    // Reading at the end is an empty page; past it is 416.
    let end = c.read(&d, ReadRequest::Bytes { offset: text.len() as u64, limit: None }).await.unwrap();
    assert!(end.eof && end.content.is_empty() && end.next_offset.is_none());
    let err = c.read(&d, ReadRequest::Bytes { offset: text.len() as u64 + 1, limit: None }).await.unwrap_err();
    assert_eq!(api_code(&err), (416, "range_not_satisfiable".into()));
    srv.stop().await;
}

#[tokio::test]
async fn line_pages_and_far_lines() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let text = numbered(1_000_000);
    let d = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let p = c.read(&d, ReadRequest::Lines { line: 1, lines: None }).await.unwrap();
    assert_eq!((p.start_line, p.end_line, p.next_line), (1, 2000, Some(2001)));
    assert!(p.content.starts_with("line 1\nline 2\n") && p.content.ends_with("line 2000\n"));
    assert_eq!(p.total_lines, 1_000_000);
    let p = c.read(&d, ReadRequest::Lines { line: 999_999, lines: Some(5) }).await.unwrap();
    assert_eq!(p.content, "line 999999\nline 1000000\n");
    assert!(p.eof && p.next_line.is_none());
    let p = c.read(&d, ReadRequest::Lines { line: 500_000, lines: Some(100_000) }).await.unwrap();
    assert!(p.capped && p.content.len() <= 100_000 && p.content.ends_with('\n'));
    assert_eq!(p.next_line, Some(p.end_line + 1));
    let p = c.read(&d, ReadRequest::Lines { line: 1_000_001, lines: None }).await.unwrap();
    assert!(p.eof && p.content.is_empty());
    let err = c.read(&d, ReadRequest::Lines { line: 1_000_002, lines: None }).await.unwrap_err();
    assert_eq!(api_code(&err), (416, "range_not_satisfiable".into()));
    for q in ["line=0", "offset=abc", "offset=1&line=2", "limit=-1", "lines=0"] {
        let r = c.request(Method::GET, &format!("/v1/blobs/{d}/read?{q}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{q}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_argument", "{q}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn over_long_line_continues_by_bytes_and_lossy_is_flagged() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let mut data = vec![b'a'; 150_000];
    data.extend_from_slice(b"\nnext\n\xff\xfe bad\n");
    let d = c.put(Bytes::from(data), &UploadOptions::default()).await.unwrap().digest;
    let p = c.read(&d, ReadRequest::Lines { line: 1, lines: Some(3) }).await.unwrap();
    assert_eq!(p.content.len(), 100_000);
    assert_eq!(p.next_offset, Some(100_000));
    let rest = c.read(&d, ReadRequest::Bytes { offset: 100_000, limit: Some(50_001) }).await.unwrap();
    assert_eq!(rest.content, "a".repeat(50_000) + "\n");
    let p = c.read(&d, ReadRequest::Lines { line: 3, lines: None }).await.unwrap();
    assert!(p.lossy);
    assert_eq!(p.content, "\u{FFFD}\u{FFFD} bad\n", "each invalid byte is one replacement character");
    assert_eq!((p.offset, p.length, p.eof), (150_006, 7, true), "offsets count the stored bytes");
    let p = c.read(&d, ReadRequest::Lines { line: 2, lines: Some(1) }).await.unwrap();
    assert!(!p.lossy, "a page of valid text is not lossy");
    srv.stop().await;
}

/// A grep reads ahead of its scan: on S3 the window after the one it scanned is fetched into the
/// block cache while it works, so that the scan's next read asks the store for nothing. (On disk
/// the kernel is asked to read it ahead, which no count shows.)
#[tokio::test]
async fn a_grep_fetches_the_window_after_the_one_it_scans() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let text: String = (0..400_000).map(|i| format!("line {i:07}\n")).collect();
    let d = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let before = srv.s3_requests("get");
    let g = GrepRequest { pattern: "line 0000000".into(), fixed: true, max_matches: Some(1), ..Default::default() };
    let r = c.grep(&d, &g).await.unwrap();
    assert_eq!(r.matches.iter().map(|m| m.line).collect::<Vec<_>>(), [1]);
    if !is_remote() {
        return;
    }
    // The one window it scanned (1 MiB: 4 blocks of 256 KiB), and the next one, read ahead.
    eventually("the next window is fetched", || srv.s3_requests("get") - before >= 8).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(srv.s3_requests("get") - before, 8, "one window ahead, no more");
}

#[tokio::test]
async fn grep_is_capped_resumable_and_safe() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let text: String = (1..=200_000)
        .map(|i| if i % 10 == 0 { format!("{i} ERROR disk full\n") } else { format!("{i} ok\n") })
        .collect();
    let d = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let g = GrepRequest { pattern: "error".into(), ignore_case: true, max_matches: Some(3), ..Default::default() };
    let r = c.grep(&d, &g).await.unwrap();
    assert_eq!(r.matches.iter().map(|m| m.line).collect::<Vec<_>>(), vec![10, 20, 30]);
    assert_eq!(r.matches[0].text, "10 ERROR disk full");
    assert!(r.capped);
    let r2 = c.grep(&d, &GrepRequest { from_line: r.next_line, ..g.clone() }).await.unwrap();
    assert_eq!(r2.matches[0].line, 40);
    // All 20,000 matches do not fit in 100,000 bytes: capped, then resumable to the end.
    let mut from = Some(1);
    let mut seen = 0;
    while let Some(f) = from {
        let r = c
            .grep(&d, &GrepRequest { pattern: "ERROR".into(), from_line: Some(f), ..Default::default() })
            .await
            .unwrap();
        let bytes: usize = r.matches.iter().map(|m| m.text.len()).sum();
        assert!(bytes <= 100_000);
        seen += r.matches.len();
        from = r.next_line;
    }
    assert_eq!(seen, 20_000);
    let fixed = c
        .grep(&d, &GrepRequest { pattern: "0 ERROR d".into(), fixed: true, max_matches: Some(1), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(fixed.matches[0].line, 10);
    let lit = c.grep(&d, &GrepRequest { pattern: "(".into(), fixed: true, ..Default::default() }).await.unwrap();
    assert!(lit.matches.is_empty() && lit.next_line.is_none());
    for bad in ["(", "a{100000}", "(?:a{1000}){1000}"] {
        let err = c.grep(&d, &GrepRequest { pattern: bad.into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(api_code(&err), (400, "invalid_argument".into()), "{bad}");
    }
    let r = c.request(Method::GET, &format!("/v1/blobs/{d}/grep")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "pattern is required");
    srv.stop().await;
}

/// A pattern on over a third of the lines of a 2 MB output (`seq 1 300000`, grep `0`, as an agent
/// greps what it ran): every page answers at once, and paging through them gives each line
/// that matches, in order, with its context, no line twice. Each match used to re-scan the
/// rest of its 1 MiB window for its context: a page took minutes and held up the server.
#[tokio::test]
async fn grep_of_a_pattern_on_many_lines_pages_through_them_all() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let text: String = (1..=300_000).map(|i| format!("{i}\n")).collect();
    let d = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let g = GrepRequest { pattern: "0".into(), before: Some(2), after: Some(2), ..Default::default() };
    let (mut from, mut pages, mut matched, mut shown) = (Some(1), 0, Vec::new(), Vec::new());
    while let Some(f) = from {
        let ask = GrepRequest { from_line: Some(f), ..g.clone() };
        let r = tokio::time::timeout(std::time::Duration::from_secs(60), c.grep(&d, &ask))
            .await
            .expect("a page of grep answers, not after minutes")
            .unwrap();
        for m in &r.matches {
            assert_eq!(m.text, m.line.to_string());
            matched.push(m.line);
            let itself = ContextLine { line: m.line, text: m.text.clone() };
            for ctx in m.before.iter().chain([&itself]).chain(&m.after) {
                assert_eq!(ctx.text, ctx.line.to_string());
                shown.push(ctx.line);
            }
        }
        pages += 1;
        from = r.next_line;
    }
    let want: Vec<u64> = (1..=300_000u64).filter(|i| i.to_string().contains('0')).collect();
    assert_eq!(matched, want);
    assert!(shown.windows(2).all(|w| w[0] < w[1]), "no line is shown twice, and lines come in order");
    assert!(pages > 1, "the matches are more than one page");
    srv.stop().await;
}

/// The cap counts what the reader receives: a binary page (each invalid byte becomes a 3-byte
/// U+FFFD) holds at most 100,000 bytes of content, covers fewer raw bytes, and says `capped`,
/// on every backend. Grep's matches hold at most 100,000 bytes of text in all.
#[tokio::test]
async fn binary_pages_and_grep_are_capped_on_what_is_sent() {
    let srv = TestServer::start().await;
    let c = srv.client();
    // Continuation bytes alone are never valid UTF-8; a newline now and then for grep.
    let data: Bytes = (0..400_000u32)
        .map(|i| if i % 5000 == 4999 { b'\n' } else { 0x80 | (i.wrapping_mul(2_654_435_761) >> 26) as u8 })
        .collect::<Vec<u8>>()
        .into();
    let d = c.put(data.clone(), &UploadOptions::default()).await.unwrap().digest;
    let p = c.read(&d, ReadRequest::Bytes { offset: 1000, limit: Some(1_000_000_000) }).await.unwrap();
    assert!(p.lossy && p.capped, "lossy {} capped {}", p.lossy, p.capped);
    assert!(p.content.len() <= 100_000 && p.content.len() > 99_000, "{} bytes of content", p.content.len());
    assert!(p.length < 40_000, "{} raw bytes", p.length);
    assert_eq!(p.next_offset, Some(1000 + p.length));
    assert_eq!(p.next_line, None, "the page ends inside a line");
    let p = c.read(&d, ReadRequest::Lines { line: 1, lines: Some(2000) }).await.unwrap();
    assert!(p.content.len() <= 100_000 && p.capped);
    let g = c.grep(&d, &GrepRequest { pattern: "(?-u:.)".into(), ..Default::default() }).await.unwrap();
    let text: usize = g.matches.iter().map(|m| m.text.len()).sum();
    assert!(text <= 100_000 && g.capped && g.next_line.is_some(), "{text} bytes of matches");
    srv.stop().await;
}

//! Redaction through the real server (api.md v1.2): every kind found in pages, greps and
//! stream reads, across page and grep-window edges; patterns match the redacted text; the
//! stored bytes stay exact for ordinary tokens; a redacted token reads marks only, everywhere
//! it can reach; the client's `--local` reads and previews mark exactly as the server does.

use bytes::Bytes;
use reqwest::Method;
use spillway_api::redact::samples::{self, leak, secret_pieces, CLEAN, SAMPLES};
use spillway_client::{GrepRequest, ReadRequest, UploadOptions};

use crate::support::{Clients, TestServer, ALL};

/// A piece of a secret in any string of a JSON answer (JSON's own escapes aside).
fn leak_in(body: &str, pieces: &[String]) -> Option<String> {
    fn walk(v: &serde_json::Value, pieces: &[String]) -> Option<String> {
        match v {
            serde_json::Value::String(s) => leak(s, pieces),
            serde_json::Value::Array(a) => a.iter().find_map(|v| walk(v, pieces)),
            // A stream's `id` is 32 random hex digits the server drew, not text of the blob:
            // now and then one holds a four-character piece of a sample secret (a run failed
            // on the id 0bb687e7bd5c4950a375defe814cad50).
            serde_json::Value::Object(o) => o
                .iter()
                .filter(|(k, _)| k.as_str() != "id")
                .find_map(|(k, v)| leak(k, pieces).or_else(|| walk(v, pieces))),
            _ => None,
        }
    }
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON: {e}: {body}"));
    walk(&v, pieces)
}

fn grep(pattern: &str) -> GrepRequest {
    GrepRequest { pattern: pattern.into(), fixed: true, ..Default::default() }
}

#[tokio::test]
async fn every_kind_is_marked_in_pages_greps_and_streams_and_stored_bytes_stay_exact() {
    let srv = TestServer::start().await;
    let plain = srv.client();
    let marked = srv.client().redacting(true);
    let text = samples::text();
    let pieces = secret_pieces();
    let rec = plain.put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap();

    // One page of everything: one mark per sample, and nothing of any secret.
    let page = marked.read(&rec.digest, ReadRequest::Lines { line: 1, lines: None }).await.unwrap();
    for (kind, _, _) in SAMPLES {
        assert!(page.content.contains(&format!("[REDACTED:{kind}]")), "{kind} not marked: {}", page.content);
    }
    assert_eq!(page.redactions, Some(SAMPLES.len() as u64));
    assert_eq!(leak(&page.content, &pieces), None);
    assert_eq!((page.total_lines, page.end_line, page.length), (rec.lines, rec.lines, rec.size), "stored cursors");
    // Pages of every size, from two starts: no piece of a secret on either side of an edge.
    for limit in [2u64, 5, 16, 64] {
        for start in [0u64, 1] {
            let mut at = start;
            while at < rec.size {
                let p = marked.read(&rec.digest, ReadRequest::Bytes { offset: at, limit: Some(limit) }).await.unwrap();
                assert_eq!(leak(&p.content, &pieces), None, "limit {limit} at {at}: {:?}", p.content);
                at = p.next_offset.unwrap_or(rec.size);
            }
        }
    }
    // Grep matches the redacted text: a probe of a secret's shape finds nothing, a mark is found.
    let probe = GrepRequest { pattern: "AKIA[A-Z0-9]{3}".into(), ..Default::default() };
    assert!(marked.grep(&rec.digest, &probe).await.unwrap().matches.is_empty(), "no probe through the marks");
    assert_eq!(plain.grep(&rec.digest, &probe).await.unwrap().matches.len(), 1, "the stored bytes hold it");
    let found = marked.grep(&rec.digest, &grep("[REDACTED:github_token]")).await.unwrap();
    assert_eq!(found.matches.len(), 3);
    assert_eq!(found.redactions, Some(3));
    // The stored bytes are untouched: GET, Range and plain reads give them exactly.
    let got = plain.get(&rec.digest).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, text.as_bytes());
    let page = plain.read(&rec.digest, ReadRequest::Bytes { offset: 0, limit: None }).await.unwrap();
    assert_eq!((page.content.as_str(), page.redactions), (text.as_str(), None));

    // A stream as it is written, then sealed: the same marks.
    let sid = plain.create_stream(&UploadOptions::default()).await.unwrap().id;
    plain.append(&sid, 0, Bytes::from(text.clone())).await.unwrap();
    let p = marked.read_stream(&sid, ReadRequest::Bytes { offset: 0, limit: None }, None).await.unwrap();
    assert_eq!((p.redactions, leak(&p.content, &pieces)), (Some(SAMPLES.len() as u64), None));
    assert!(marked.grep_stream(&sid, &probe).await.unwrap().matches.is_empty());
    plain.seal(&sid).await.unwrap();
    let p = marked.read_stream(&sid, ReadRequest::Lines { line: 1, lines: None }, None).await.unwrap();
    assert_eq!((p.redactions, leak(&p.content, &pieces)), (Some(SAMPLES.len() as u64), None));
    srv.stop().await;
}

/// Nothing is marked where there is no secret: digests, UUIDs, paths, timestamps, settings.
#[tokio::test]
async fn text_without_secrets_reads_the_same_redacted() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let text: String = CLEAN.iter().map(|t| format!("{t}\n")).collect();
    let rec = c.put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap();
    let p = c.clone().redacting(true).read(&rec.digest, ReadRequest::Bytes { offset: 0, limit: None }).await.unwrap();
    assert_eq!((p.content.as_str(), p.redactions), (text.as_str(), Some(0)));
    srv.stop().await;
}

/// A blob of many blocks, read through the text cache and the secrets the server keeps by
/// block: every redacted page — clean ones and those with a secret, a secret across a block's
/// edge among them — is the page the detector makes of the same bytes held in memory; byte
/// and line pages, with secrets or without, come from the text cache.
#[tokio::test]
async fn redacted_pages_of_a_large_blob_are_those_of_one_scan() {
    use spillway_api::paging::{byte_page_redacted, line_page_redacted, MemorySource, SECRET_BLOCK};
    let srv = TestServer::start().await;
    let c = srv.client().redacting(true);
    let filler = "2026-12-02T10:00:00Z INFO nothing to see here path=/v1/items status=200\n";
    let (mut text, edges) = samples::across_edges(SECRET_BLOCK);
    text.push_str(&filler.repeat(4000));
    let rec = srv.client().put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap();
    let (mem, d) = (MemorySource::new(text.clone().into()), spillway_api::redact::Detector::builtin());
    let (mut clean, mut pages) = (0, 0);
    for &(edge, line) in &edges {
        for back in [0u64, 17, 300, 20_000, 120_000] {
            for limit in [7u64, 100_000] {
                let at = edge - back;
                let got = c.read(&rec.digest, ReadRequest::Bytes { offset: at, limit: Some(limit) }).await.unwrap();
                let mut want = byte_page_redacted(&mem, at, limit, d).await.unwrap();
                want.digest = got.digest.clone();
                assert_eq!(got, want, "offset {at}, limit {limit}");
                clean += usize::from(got.redactions == Some(0));
                pages += 1;
            }
        }
        let got = c.read(&rec.digest, ReadRequest::Lines { line: line - 1, lines: Some(3) }).await.unwrap();
        let mut want = line_page_redacted(&mem, line - 1, 3, d).await.unwrap();
        want.digest = got.digest.clone();
        assert_eq!(got, want, "line {line}");
        assert!(got.redactions >= Some(1), "line {line}: {}", got.content);
        pages += 1;
    }
    let far = text.len() as u64 - 1000;
    let got = c.read(&rec.digest, ReadRequest::Bytes { offset: far, limit: None }).await.unwrap();
    assert_eq!((got.redactions, got.content.as_str()), (Some(0), &text[far as usize..]));
    assert!(clean > 0, "some pages hold no secret");
    let fast = srv.state.blobs.probes.escaped_pages.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        fast as usize > clean + 1 && fast as usize <= pages + 1,
        "pages from the text cache: {fast} of {pages}, {clean} clean"
    );
    srv.stop().await;
}

/// A PEM block cut by the edge of grep's 1 MiB window is marked on both sides of it.
#[tokio::test]
async fn a_secret_across_a_grep_window_is_marked_on_both_sides() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let key_lines: Vec<String> = (0..40).map(|i| format!("MIIEow{i:02}QIBAAKCAQEAx1y2z3abcdEFGH1234zz")).collect();
    let pem = format!("-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\n", key_lines.join("\n"));
    // The window ends at its last newline before 1 MiB, which falls inside the block.
    let filler = "x".repeat(99) + "\n";
    let mut text = filler.repeat((1 << 20) / 100 - 5);
    text.push_str(&pem);
    text.push_str(&filler.repeat(20));
    assert!(text.find("-----BEGIN").unwrap() < 1 << 20 && text.find("-----END").unwrap() > 1 << 20);
    let rec = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap();
    let marked = c.clone().redacting(true);
    let found = marked.grep(&rec.digest, &grep("MIIEow")).await.unwrap();
    assert!(found.matches.is_empty(), "{:?}", found.matches.first());
    let marks = marked.grep(&rec.digest, &grep("[REDACTED:private_key]")).await.unwrap();
    assert_eq!(marks.matches.len(), 2, "one mark each side of the window's edge: {marks:?}");
    assert!(marks.matches[0].line < marks.matches[1].line);
    assert_eq!(c.grep(&rec.digest, &grep("MIIEow")).await.unwrap().matches.len(), 40, "stored as it came");
    srv.stop().await;
}

/// A redacted token: raw bytes are 403 (once it can see the blob; else 404), HEAD is allowed,
/// and every route it can reach shows marks only, whatever the query says.
#[tokio::test]
async fn a_redacted_token_reads_marks_only_on_every_route() {
    let srv = TestServer::start().await;
    let plain = srv.client();
    let agent = spillway_client::StoreClient::new(&srv.url, srv.redacted_token("ns-a", ALL).await);
    let text = samples::text();
    let pieces = secret_pieces();
    let rec = plain.put(Bytes::from(text.clone()), &UploadOptions::default().label("tool", "env")).await.unwrap();
    let sid = plain.create_stream(&UploadOptions::default()).await.unwrap().id;
    plain.append(&sid, 0, Bytes::from(text.clone())).await.unwrap();
    let d = rec.digest;
    let status = |m: Method, path: String| {
        let req = agent.request(m, &path);
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    for path in [format!("/v1/blobs/{d}"), format!("/v1/blobs/{}", rec.sha256)] {
        let (code, body) = status(Method::GET, path.clone()).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("\"forbidden\"") && body.contains("redacted text only"), "{body}");
        assert_eq!(leak_in(&body, &pieces), None);
    }
    let (code, _) = status(Method::HEAD, format!("/v1/blobs/{d}")).await;
    assert_eq!(code, 200, "metadata is allowed");
    let other = plain.put(Bytes::from_static(b"elsewhere\n"), &UploadOptions::default()).await.unwrap().digest;
    let outsider = spillway_client::StoreClient::new(&srv.url, srv.redacted_token("ns-b", ALL).await);
    let resp = outsider.request(Method::GET, &format!("/v1/blobs/{other}")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 404, "what it cannot see is not found, not forbidden");
    let reads = [
        format!("/v1/blobs/{d}/read"),
        format!("/v1/blobs/{d}/read?redact=false"),
        format!("/v1/blobs/{d}/read?line=1&lines=500"),
        format!("/v1/blobs/{d}/read?offset=7&limit=90000"),
        format!("/v1/blobs/{d}/grep?pattern=.&redact=false"),
        format!("/v1/blobs/{d}/grep?pattern=AKIA"),
        format!("/v1/blobs/{d}/grep?pattern=-----&before=5&after=5"),
        format!("/v1/streams/{sid}/read?redact=false"),
        format!("/v1/streams/{sid}/read?line=2&lines=9"),
        format!("/v1/streams/{sid}/grep?pattern=.&redact=false"),
        format!("/v1/streams/{sid}"),
        "/v1/refs".to_owned(),
    ];
    for path in &reads {
        let (code, body) = status(Method::GET, path.clone()).await;
        assert_eq!(code, 200, "{path}: {body}");
        assert_eq!(leak_in(&body, &pieces), None, "{path} shows a secret: {body}");
    }
    let (_, body) = status(Method::GET, format!("/v1/blobs/{d}/read")).await;
    assert!(body.contains("\"redactions\":"), "{body}");
    let (code, body) = status(Method::POST, format!("/v1/streams/{sid}/seal")).await;
    assert_eq!((code, leak_in(&body, &pieces)), (200, None), "the same bytes as the blob: {body}");
    let (code, body) = status(Method::GET, format!("/v1/streams/{sid}/read?redact=false")).await;
    assert_eq!((code, leak_in(&body, &pieces)), (200, None), "the sealed stream too: {body}");
    srv.stop().await;
}

/// The client marks exactly as the server does: a `--local` read of the same bytes, and an
/// SDK preview of the whole output, are the server's redacted text.
#[tokio::test]
async fn local_reads_and_previews_mark_as_the_server_does() {
    let srv = TestServer::start().await;
    let text = samples::text();
    let rec = srv.client().put(Bytes::from(text.clone()), &UploadOptions::default()).await.unwrap();
    let server = srv.client().redacting(true);
    let dir = tempfile::tempdir().unwrap();
    let local_dir = spillway_client::spill::LocalDir::new(dir.path());
    let mut deadline = spillway_client::spill::Deadline::new(std::time::Duration::from_secs(3));
    use spillway_client::spill::SpillTarget;
    local_dir.save(Bytes::from(text.clone()), &[], &mut deadline).await.unwrap();
    let local = spillway_client::reader::Reader::Local(local_dir, None)
        .redacting(Some(std::sync::Arc::new(spillway_api::redact::Detector::with_rules("").unwrap())));
    let d: spillway_api::AnyDigest = rec.digest.into();
    for req in [
        ReadRequest::Bytes { offset: 0, limit: None },
        ReadRequest::Bytes { offset: 100, limit: Some(333) },
        ReadRequest::Lines { line: 3, lines: Some(4) },
    ] {
        assert_eq!(server.read(d, req).await.unwrap(), local.read(&d, req).await.unwrap(), "{req:?}");
    }
    let g = grep("[REDACTED:");
    assert_eq!(server.grep(d, &g).await.unwrap(), local.grep(&d, &g).await.unwrap());
    let sample = spillway_client::truncate::Sample::whole(text.as_bytes());
    let preview =
        spillway_client::truncate::preview(&sample, 100_000, spillway_client::truncate::Strategy::default()).unwrap();
    let page = server.read(d, ReadRequest::Bytes { offset: 0, limit: None }).await.unwrap();
    assert_eq!((preview.text, preview.redactions), (page.content, page.redactions));
    srv.stop().await;
}

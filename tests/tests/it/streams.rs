//! Streams: offset-checked appends, long-polling reads, the cap, seal.

use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::Method;
use spillway_api::StreamState;
use spillway_client::{ReadRequest, UploadOptions};

use crate::support::*;

#[tokio::test]
async fn appends_are_offset_checked_and_retry_safe() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions::default().label("tool", "bg")).await.unwrap();
    assert_eq!(s.max_bytes, 50 << 20);
    assert_eq!(c.append(&s.id, 0, Bytes::from_static(b"hello ")).await.unwrap().size, 6);
    // The same append again is a no-op.
    assert_eq!(c.append(&s.id, 0, Bytes::from_static(b"hello ")).await.unwrap().size, 6);
    let err = c.append(&s.id, 0, Bytes::from_static(b"HELLO ")).await.unwrap_err();
    assert_eq!(api_code(&err), (409, "offset_mismatch".into()));
    match &err {
        spillway_client::ClientError::Api { message, .. } => {
            assert!(message.contains("offset 0") && message.contains("size 6"), "names both: {message}")
        }
        other => panic!("{other}"),
    }
    let err = c.append(&s.id, 9, Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(api_code(&err), (409, "offset_mismatch".into()));
    c.append(&s.id, 6, Bytes::from_static(b"world\nline two\n")).await.unwrap();
    let info = c.stream_info(&s.id).await.unwrap();
    assert_eq!((info.size, info.state, info.digest), (21, StreamState::Open, None));
    let p = c.read_stream(&s.id, ReadRequest::Lines { line: 2, lines: None }, None).await.unwrap();
    assert_eq!(p.content, "line two\n");
    let p = c.read_stream(&s.id, ReadRequest::Bytes { offset: 3, limit: Some(5) }, None).await.unwrap();
    assert_eq!(p.content, "lo wo");
    // Seal: a blob with the stream's labels.
    let rec = c.seal(&s.id).await.unwrap();
    assert_eq!(rec.size, 21);
    let got = c.get(&rec.digest).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, "hello world\nline two\n");
    let refs = c.list_refs(&[("tool", "bg")], None, None).await.unwrap();
    assert_eq!(refs.refs[0].digest, rec.digest.to_string());
    let err = c.append(&s.id, 21, Bytes::from_static(b"late")).await.unwrap_err();
    assert_eq!(api_code(&err), (409, "stream_closed".into()));
    assert_eq!(c.seal(&s.id).await.unwrap().digest, rec.digest, "sealing twice answers the same blob");
    let p = c.read_stream(&s.id, ReadRequest::Lines { line: 1, lines: None }, None).await.unwrap();
    assert_eq!(p.content, "hello world\nline two\n");
    // Other namespaces do not see it; bad ids are 400.
    let b = srv.client_for("ns-b", ALL).await;
    assert!(b.stream_info(&s.id).await.unwrap_err().is_not_found());
    let err = c.stream_info("../etc").await.unwrap_err();
    assert!(matches!(api_code(&err).0, 400 | 404));
    srv.stop().await;
}

#[tokio::test]
async fn cap_marks_the_stream_capped() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions { max_bytes: Some(10), ..Default::default() }).await.unwrap();
    c.append(&s.id, 0, Bytes::from_static(b"12345")).await.unwrap();
    let err = c.append(&s.id, 5, Bytes::from_static(b"6789ABCDEF")).await.unwrap_err();
    assert_eq!(api_code(&err), (413, "stream_limit_exceeded".into()));
    let info = c.stream_info(&s.id).await.unwrap();
    assert_eq!((info.size, info.state), (10, StreamState::Capped));
    let err = c.append(&s.id, 10, Bytes::from_static(b"more")).await.unwrap_err();
    assert_eq!(api_code(&err), (409, "stream_closed".into()));
    let rec = c.seal(&s.id).await.unwrap();
    assert_eq!(c.get(&rec.digest).await.unwrap().bytes().await.unwrap(), "123456789A");
    let err = c.create_stream(&UploadOptions { max_bytes: Some(51 << 20), ..Default::default() }).await.unwrap_err();
    assert_eq!(api_code(&err), (400, "invalid_argument".into()));
    srv.stop().await;
}

/// Long-polls wake on the event itself. The server here never polls its database during a
/// wait (the interval is an hour), so only the in-process wake-up can end a wait early; each
/// append is made once the reader is registered, so the wake-up is what is tested. A missing
/// wake-up makes a read wait its whole `wait_ms` (30 s) and come back empty, which the content
/// assertions catch; the 20 s bounds only turn that into a quicker failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_append_and_seal() {
    let srv = TestServer::start_with(|c| c.stream_poll_interval = Duration::from_secs(3600)).await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions::default()).await.unwrap();
    let waiting = |id: &str| {
        let (w, id) = (srv.state.streams.waiters.clone(), id.to_owned());
        move || w.is_waiting(&id)
    };
    let wait = |r: ReadRequest| {
        let (c, id) = (srv.client(), s.id.clone());
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(20), c.read_stream(&id, r, Some(30_000))).await.unwrap()
        })
    };
    let reader = wait(ReadRequest::Bytes { offset: 0, limit: None });
    eventually("the reader waits", waiting(&s.id)).await;
    c.append(&s.id, 0, Bytes::from_static(b"tick\n")).await.unwrap();
    assert_eq!(reader.await.unwrap().unwrap().content, "tick\n");
    // Nothing new: the wait lasts wait_ms and ends with an empty page. (A lower bound: tokio's
    // timers never fire early.)
    let start = Instant::now();
    let p = c.read_stream(&s.id, ReadRequest::Bytes { offset: 5, limit: None }, Some(300)).await.unwrap();
    assert!(p.content.is_empty() && start.elapsed() >= Duration::from_millis(300));
    // By line: waiting for line 2, woken when it is written.
    let reader = wait(ReadRequest::Lines { line: 2, lines: None });
    eventually("the line reader waits", waiting(&s.id)).await;
    c.append(&s.id, 5, Bytes::from_static(b"tock\n")).await.unwrap();
    assert_eq!(reader.await.unwrap().unwrap().content, "tock\n");
    // A seal during a long-poll wakes it: the page is the end of the sealed blob.
    let reader = wait(ReadRequest::Bytes { offset: 10, limit: None });
    eventually("the reader at the end waits", waiting(&s.id)).await;
    let sealed = c.seal(&s.id).await.unwrap();
    let p = reader.await.unwrap().unwrap();
    assert!(p.content.is_empty() && p.eof);
    assert_eq!(p.digest, Some(sealed.digest.to_string()));
    assert!(srv.state.streams.waiters.is_empty(), "finished long-polls leave nothing registered");
    let r = c.request(Method::GET, &format!("/v1/streams/{}/read?wait_ms=30001", s.id)).send().await.unwrap();
    assert_eq!(r.status(), 400);
    srv.stop().await;
}

/// An append over the cap, retried (its answer was lost): the same 413, nothing stored twice.
#[tokio::test]
async fn a_retried_append_at_the_cap_gets_the_same_answer() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions { max_bytes: Some(10), ..Default::default() }).await.unwrap();
    c.append(&s.id, 0, Bytes::from_static(b"12345")).await.unwrap();
    for _ in 0..2 {
        let err = c.append(&s.id, 5, Bytes::from_static(b"6789ABCDEF")).await.unwrap_err();
        assert_eq!(api_code(&err), (413, "stream_limit_exceeded".into()));
    }
    // Different bytes at that offset are not a retry.
    let err = c.append(&s.id, 5, Bytes::from_static(b"XXXXXXXXXX")).await.unwrap_err();
    assert_eq!(api_code(&err), (409, "offset_mismatch".into()));
    // Over the cap in one append into an empty stream.
    let t = c.create_stream(&UploadOptions { max_bytes: Some(4), ..Default::default() }).await.unwrap();
    let err = c.append(&t.id, 0, Bytes::from_static(b"oversized")).await.unwrap_err();
    assert_eq!(api_code(&err), (413, "stream_limit_exceeded".into()));
    let info = c.stream_info(&t.id).await.unwrap();
    assert_eq!((info.size, info.state, info.capped), (4, StreamState::Capped, true));
    let info = c.stream_info(&s.id).await.unwrap();
    assert_eq!((info.size, info.state), (10, StreamState::Capped));
    let rec = c.seal(&s.id).await.unwrap();
    assert_eq!(c.get(&rec.digest).await.unwrap().bytes().await.unwrap(), "123456789A");
    srv.stop().await;
}

/// Appends are taken whole, whatever their size: 20 MiB into a stream with room is stored (and
/// a retry of it is a no-op); 40 MiB past a 50 MiB cap stores up to the cap and answers
/// `413 stream_limit_exceeded`, so the task's supervisor stops it. The exit status given at
/// seal is kept, and the stream still says it was capped.
#[tokio::test(flavor = "multi_thread")]
async fn large_appends_store_up_to_the_cap() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions::default()).await.unwrap();
    let big: Bytes =
        (0..20u32 << 20).map(|i| b"abcdefghijklmnopqrstuvwxyz\n"[(i % 27) as usize]).collect::<Vec<u8>>().into();
    assert_eq!(c.append(&s.id, 0, big.clone()).await.unwrap().size, 20 << 20);
    assert_eq!(c.append(&s.id, 0, big.clone()).await.unwrap().size, 20 << 20, "a retry is a no-op");
    let more = Bytes::from(vec![b'z'; 40 << 20]);
    let err = c.append(&s.id, 20 << 20, more).await.unwrap_err();
    assert_eq!(api_code(&err), (413, "stream_limit_exceeded".into()));
    let info = c.stream_info(&s.id).await.unwrap();
    assert_eq!((info.size, info.state, info.capped), (50 << 20, StreamState::Capped, true));
    let p = c.read_stream(&s.id, ReadRequest::Bytes { offset: (20 << 20) - 3, limit: Some(6) }, None).await.unwrap();
    assert_eq!(p.content, "xyzzzz", "the bytes before and after the first append's end");
    let how = spillway_api::SealRequest { exit_code: None, signal: Some("TERM".into()) };
    let rec = c.seal_with(&s.id, &how).await.unwrap();
    assert_eq!(rec.size, 50 << 20);
    let info = c.stream_info(&s.id).await.unwrap();
    assert_eq!(
        (info.state, info.capped, info.signal.as_deref(), info.exit_code),
        (StreamState::Sealed, true, Some("TERM"), None)
    );
    srv.stop().await;
}

#[tokio::test]
async fn grep_searches_a_stream_while_it_is_written_and_after_its_seal() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&UploadOptions::default()).await.unwrap();
    c.append(&s.id, 0, Bytes::from("ok 1\nERROR 2\nok 3\nERR")).await.unwrap();
    let g = spillway_client::GrepRequest { pattern: "^ERR".into(), after: Some(1), ..Default::default() };
    let open = c.grep_stream(&s.id, &g).await.unwrap();
    let found: Vec<(u64, &str)> = open.matches.iter().map(|m| (m.line, m.text.as_str())).collect();
    assert_eq!(found, [(2, "ERROR 2"), (4, "ERR")], "the unfinished last line is searched too");
    assert_eq!(open.matches[0].after[0].text, "ok 3");
    c.append(&s.id, 21, Bytes::from("OR 4\nERROR 5\n")).await.unwrap();
    c.seal(&s.id).await.unwrap();
    let sealed = c.grep_stream(&s.id, &g).await.unwrap();
    let lines: Vec<u64> = sealed.matches.iter().map(|m| m.line).collect();
    assert_eq!(lines, [2, 4, 5]);
    assert_eq!(sealed.matches[1].text, "ERROR 4");
    // The same refusals as blob grep; another namespace sees no such stream.
    let bad = spillway_client::GrepRequest { pattern: "(".into(), ..Default::default() };
    assert_eq!(api_code(&c.grep_stream(&s.id, &bad).await.unwrap_err()), (400, "invalid_argument".into()));
    let other = srv.client_for("ns-b", ALL).await;
    assert_eq!(api_code(&other.grep_stream(&s.id, &g).await.unwrap_err()), (404, "not_found".into()));
    assert_eq!(api_code(&c.grep_stream("nope", &g).await.unwrap_err()), (400, "invalid_argument".into()));
}

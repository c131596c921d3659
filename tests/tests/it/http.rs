//! HTTP semantics as S3 and RFC 9110 have them, and input the contract refuses: a Range that
//! is not understood is ignored, the Bearer scheme is case-insensitive, every error body is
//! the contract's JSON (405 and an undecodable path included), and invalid UTF-8, duplicate
//! labels or a pin body that is not an object are `400 invalid_argument`.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use spillway_client::{ReadRequest, UploadOptions};

use crate::support::*;

async fn error_of(resp: reqwest::Response) -> (StatusCode, String) {
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.expect("a JSON error body");
    (status, body["error"]["code"].as_str().expect("error.code").to_owned())
}

#[tokio::test]
async fn ranges_not_understood_are_ignored() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let data = Bytes::from_static(b"0123456789");
    let rec = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
    let path = format!("/v1/blobs/{}", rec.digest);
    for range in ["items=0-1", "bytes=abc", "bytes=5-2", "bytes=0-1,4-5"] {
        let r = c.request(Method::GET, &path).header("Range", range).send().await.unwrap();
        assert_eq!(r.status(), 200, "{range}");
        assert_eq!(r.bytes().await.unwrap(), data, "{range}: the whole blob");
    }
    let r = c.request(Method::GET, &path).header("Range", "bytes=2-4").send().await.unwrap();
    assert_eq!((r.status(), r.bytes().await.unwrap()), (StatusCode::PARTIAL_CONTENT, Bytes::from_static(b"234")));
    let r = c.request(Method::GET, &path).header("Range", "bytes=10-").send().await.unwrap();
    assert_eq!(r.headers()["content-range"], "bytes */10");
    assert_eq!(error_of(r).await, (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable".into()));
    srv.stop().await;
}

#[tokio::test]
async fn bearer_is_case_insensitive_and_errors_are_json() {
    let srv = TestServer::start().await;
    let http = reqwest::Client::new();
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = http.get(format!("{}/v1/refs", srv.url)).header("Authorization", format!("{scheme} {}", srv.token));
        assert_eq!(r.send().await.unwrap().status(), 200, "{scheme}");
    }
    let c = srv.client();
    let digest = format!("blake3:{}", "a".repeat(64));
    let r = c.request(Method::PATCH, &format!("/v1/blobs/{digest}")).send().await.unwrap();
    assert!(r.headers().contains_key("allow"));
    assert_eq!(error_of(r).await, (StatusCode::METHOD_NOT_ALLOWED, "invalid_argument".into()));
    let r = c.request(Method::GET, "/v1/blobs/%FF%FE/read").send().await.unwrap();
    assert_eq!(error_of(r).await.0, StatusCode::BAD_REQUEST);
    let r = c.request(Method::GET, "/v1/nowhere").send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::NOT_FOUND, "not_found".into()));
    let r = c.request(Method::GET, &format!("/v1/refs?label.k={}", "x".repeat(10_000))).send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::URI_TOO_LONG, "invalid_argument".into()));
    let r = c.request(Method::GET, "/v1/refs").header("X-Big", "y".repeat(70_000)).send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "invalid_argument".into()));
    srv.stop().await;
}

#[tokio::test]
async fn lenient_input_is_refused() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let rec = c.put(Bytes::from_static(b"some text\n"), &UploadOptions::default()).await.unwrap();
    let bad = [
        (Method::POST, "/v1/blobs?label.tool=%FF%FE".to_owned()),
        (Method::POST, "/v1/blobs?label.tool=a&label.tool=b".to_owned()),
        (Method::POST, "/v1/streams?label.k=1&label.k=2".to_owned()),
        (Method::GET, "/v1/refs?label.k=1&label.k=2".to_owned()),
        (Method::GET, format!("/v1/blobs/{}/grep?pattern=%C3%28", rec.digest)),
    ];
    for (method, path) in bad {
        let r = c.request(method.clone(), &path).body("x").send().await.unwrap();
        assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "invalid_argument".into()), "{method} {path}");
    }
    // Not an object; a time past 9999-12-31 (the schema's maximum; no RFC 3339 time to answer).
    for body in ["[\"INC-1\"]", "\"INC-1\"", "42", "{\"until\": 621103516633}", "{\"until\": 253402300800}"] {
        let r = c.request(Method::POST, &format!("/v1/blobs/{}/pin", rec.digest)).body(body).send().await.unwrap();
        assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "invalid_argument".into()), "pin body {body}");
    }
    let r = c.request(Method::POST, &format!("/v1/blobs/{}/pin", rec.digest)).body("null").send().await.unwrap();
    assert_eq!(r.status(), 200, "null is the defaults");
    srv.stop().await;
}

/// A server with short timeouts and few connections, so the tests below see them act.
async fn strict_server() -> TestServer {
    TestServer::start_with(|c| {
        c.header_read_timeout = Duration::from_secs(1);
        c.body_idle_timeout = Duration::from_secs(1);
        c.max_connections = 4;
    })
    .await
}

/// Reads until the server closes the connection; returns what it sent. Fails if the server
/// keeps it open for 10 s: the timeouts are 1 s, so that bound only tells closed from held.
fn read_to_close(s: &mut std::net::TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let closed = s.read_to_end(&mut out);
    assert!(closed.is_ok(), "the server held the connection open: {closed:?}");
    String::from_utf8_lossy(&out).into_owned()
}

/// Bytes `client` sent that the server's end of the connection holds unread, from the kernel's
/// table of TCP sockets; `None` once the server's end is gone.
fn unread_by_server(client: &std::net::TcpStream) -> Option<u64> {
    let (local, peer) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
    let hex = |a: std::net::SocketAddr| match a {
        std::net::SocketAddr::V4(v4) => format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port()),
        std::net::SocketAddr::V6(_) => unreachable!("the test server listens on 127.0.0.1"),
    };
    let (server_end, client_end) = (hex(peer), hex(local));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|line| {
        // sl local rem st tx_queue:rx_queue ...
        let cols: Vec<&str> = line.split_whitespace().collect();
        let established = cols.get(3) == Some(&"01");
        if !(established && cols.get(1) == Some(&server_end.as_str()) && cols.get(2) == Some(&client_end.as_str())) {
            return None;
        }
        u64::from_str_radix(cols[4].split(':').nth(1)?, 16).ok()
    })
}

fn addr_of(srv: &TestServer) -> String {
    srv.url.trim_start_matches("http://").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_slow_and_stalled_connections_are_closed() {
    let srv = strict_server().await;
    let addr = addr_of(&srv);
    let token = srv.token.clone();
    tokio::task::spawn_blocking(move || {
        // An idle connection: closed, having sent nothing.
        let mut idle = std::net::TcpStream::connect(&addr).unwrap();
        assert_eq!(read_to_close(&mut idle), "");
        // Headers a byte at a time (slowloris): closed before they end.
        let mut slow = std::net::TcpStream::connect(&addr).unwrap();
        let trickle = std::thread::spawn(move || {
            for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ".iter().chain(&[b'a'; 200]) {
                if slow.write_all(&[*b]).is_err() {
                    return true; // the server closed it
                }
                std::thread::sleep(Duration::from_millis(100)); // the client's pace, not a synchronisation
            }
            false
        });
        assert!(trickle.join().unwrap(), "a trickling client is cut off");
        // A kept-alive connection that goes quiet after one request.
        let mut kept = std::net::TcpStream::connect(&addr).unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(read_to_close(&mut kept).starts_with("HTTP/1.1 200"));
        // An upload that stalls mid-body: dropped, and what it staged removed.
        let mut stalled = std::net::TcpStream::connect(&addr).unwrap();
        let head = format!(
            "POST /v1/blobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 10000000\r\n\r\n"
        );
        stalled.write_all(head.as_bytes()).unwrap();
        stalled.write_all(&vec![b'q'; 300_000]).unwrap();
        let answer = read_to_close(&mut stalled);
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 400"), "{answer}");
    })
    .await
    .unwrap();
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    srv.stop().await;
}

/// At the connection limit, idle connections give way to new ones at once — first those that
/// never sent a request (idle or half-open sockets), then those idle between requests — while a
/// connection in the middle of a request is never cut. When every slot is serving, a new
/// connection waits for the first to finish.
#[tokio::test(flavor = "multi_thread")]
async fn past_the_limit_idle_connections_give_way() {
    let srv = TestServer::start_with(|c| c.max_connections = 4).await; // header timeout 30 s
    let addr = addr_of(&srv);
    let token = srv.token.clone();
    let sid = srv.client().create_stream(&Default::default()).await.unwrap().id;
    let waiters = srv.state.streams.waiters.clone();
    let (state, rt) = (srv.state.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || {
        let healthz = |s: &mut std::net::TcpStream| {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            read_to_close(s)
        };
        // A kept-alive client between requests, then twice the limit in idle and half-open sockets.
        let mut kept = std::net::TcpStream::connect(&addr).unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut first = [0u8; 12];
        kept.read_exact(&mut first).unwrap();
        // The oldest: half a head, read by the server before the others arrive (bytes it has not
        // read yet would keep the socket from giving way, rightly: they might be a request).
        let mut oldest = std::net::TcpStream::connect(&addr).unwrap();
        oldest.write_all(b"GET /healthz HTTP/1.1\r\nHost:").unwrap(); // half a head
        let deadline = Instant::now() + Duration::from_secs(10);
        while unread_by_server(&oldest) != Some(0) {
            // (Two of four slots taken: its server end cannot have gone.)
            assert!(Instant::now() < deadline, "the server never read the half head");
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut idle: Vec<_> = std::iter::once(oldest)
            .chain((1..8).map(|_| std::net::TcpStream::connect(&addr).unwrap()))
            .collect();
        let start = Instant::now();
        let mut probe = std::net::TcpStream::connect(&addr).unwrap();
        assert!(healthz(&mut probe).starts_with("HTTP/1.1 200"));
        assert!(start.elapsed() < Duration::from_secs(5), "served at once, not after a timeout: {:?}", start.elapsed());
        // The oldest sockets that never sent a request went first; the kept-alive client's
        // connection, idle but served before, is still there while such sockets remain.
        // Closed (a reset, when its half head was still unread, is a close too).
        idle[0].set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        match idle[0].read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "the oldest idle socket was answered: {rest:?}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "the oldest idle socket was not closed"),
        }
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        assert!(read_to_close(&mut kept).contains("HTTP/1.1 200"), "the kept-alive connection still serves");
        drop(idle);
        // Four long-polls in flight fill every slot: none of them is cut for a new connection,
        // which is served when the first of them ends.
        // Each poll is sent once the one before it waits: the sockets just closed may still hold
        // slots, and a new connection at the limit makes an idle one give way — which, were two
        // polls sent at once, could be the first poll in the instant between the read of its
        // head and its dispatch (unread, it would be left alone).
        let polls: Vec<_> = (1..=4)
            .map(|n| {
                let mut s = std::net::TcpStream::connect(&addr).unwrap();
                let req = format!(
                    "GET /v1/streams/{sid}/read?wait_ms=30000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
                );
                s.write_all(req.as_bytes()).unwrap();
                let deadline = Instant::now() + Duration::from_secs(30);
                while waiters.waiting(&sid) < n {
                    assert!(Instant::now() < deadline, "long-poll {n} never arrived");
                    std::thread::sleep(Duration::from_millis(2));
                }
                s
            })
            .collect();
        let mut probe = std::net::TcpStream::connect(&addr).unwrap();
        probe.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        probe.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut early = [0u8; 1];
        let got = probe.read(&mut early);
        let (waiting, first) = (waiters.waiting(&sid), early[0] as char);
        assert!(got.is_err(), "served while every slot was serving a request: {got:?} ({first:?}), {waiting} polls waiting");
        // The task writes: the polls are answered and their connections close.
        let (ns, id) = (spillway_api::Namespace::new("ns-a").unwrap(), spillway_api::StreamId::new(&sid).unwrap());
        rt.block_on(spillway_server::streams::append(&state.streams, &ns, &id, 0, 0, &Bytes::from_static(b"done\n"))).unwrap();
        assert!(read_to_close(&mut probe).starts_with("HTTP/1.1 200"), "served once a slot was free");
        for mut p in polls {
            assert!(read_to_close(&mut p).starts_with("HTTP/1.1 200"), "a long-poll in flight was never cut");
        }

    })
    .await
    .unwrap();
    let m = reqwest::get(format!("{}/metrics", srv.metrics_url)).await.unwrap().text().await.unwrap();
    assert!(m.contains("spillway_http_connections_evicted_total"), "evictions are counted");
    srv.stop().await;
}

/// A client that asks for a body larger than its socket's buffers and never reads it does not
/// hold its connection slot: once the response has waited `send_idle_timeout` for it to take
/// any of it, the connection closes, and the next connection is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_response_its_client_stops_reading_ends_its_connection() {
    let srv = TestServer::start_with(|c| {
        c.send_idle_timeout = Duration::from_secs(1);
        c.max_connections = 1;
    })
    .await;
    let big = Bytes::from(vec![b'x'; 32 << 20]); // more than loopback's buffers on both sides hold
    let rec = srv.client().put(big, &UploadOptions::default()).await.unwrap();
    let (addr, token) = (addr_of(&srv), srv.token.clone());
    tokio::task::spawn_blocking(move || {
        let mut stalled = std::net::TcpStream::connect(&addr).unwrap();
        let get = format!("GET /v1/blobs/{} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n", rec.digest);
        stalled.write_all(get.as_bytes()).unwrap();
        let mut head = [0u8; 12];
        stalled.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "the download began");
        // The one slot is serving that response, so the next connection waits for it to end.
        let start = Instant::now();
        let mut next = std::net::TcpStream::connect(&addr).unwrap();
        next.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        assert!(read_to_close(&mut next).starts_with("HTTP/1.1 200"), "served once the stalled response ended");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(900), "served before the send timeout: {waited:?}");
        // What the stalled client finds when it reads at last: the body cut short.
        stalled.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        let end = stalled.read_to_end(&mut rest);
        if let Err(e) = &end {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "the stalled connection was not closed: {e}");
        }
        assert!(rest.len() < 32 << 20, "the whole body went out: {} bytes", rest.len());
    })
    .await
    .unwrap();
    let m = reqwest::get(format!("{}/metrics", srv.metrics_url)).await.unwrap().text().await.unwrap();
    assert!(m.contains("spillway_http_send_timeouts_total 1"), "the timeout is counted: {m}");
    srv.stop().await;
}

/// A connection whose request arrived before its task first ran is not the one to give way:
/// closing it would reset it and lose the request. On one thread the server accepts every
/// connection the kernel holds before it runs any of their tasks, so with one slot the second
/// connection finds the first accepted, idle, never served — and its request unread.
#[tokio::test(flavor = "current_thread")]
async fn a_request_not_read_yet_is_never_evicted() {
    let srv = TestServer::start_with(|c| c.max_connections = 1).await;
    let addr = addr_of(&srv);
    // Blocking calls on the runtime's only thread, on purpose: both handshakes and the first
    // request land in the kernel while the server cannot run.
    let mut first = std::net::TcpStream::connect(&addr).unwrap();
    first.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut second = std::net::TcpStream::connect(&addr).unwrap();
    let (first, second) = tokio::task::spawn_blocking(move || {
        // Reset, the first connection lost its request: say so rather than fail the read.
        first.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = Vec::new();
        let answer = match first.read_to_end(&mut answer) {
            Ok(_) => String::from_utf8_lossy(&answer).into_owned(),
            Err(e) => format!("{e}"),
        };
        second.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        (answer, read_to_close(&mut second))
    })
    .await
    .unwrap();
    assert!(first.starts_with("HTTP/1.1 200"), "the first request was lost: {first:?}");
    assert!(second.starts_with("HTTP/1.1 200"), "the second connection was served after it: {second:?}");
    srv.stop().await;
}

/// The edges of ranges (RFC 9110 §14): an empty blob, a zero-length suffix, and the headers of
/// a 206 and of a HEAD.
#[tokio::test]
async fn empty_blobs_and_range_edges() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let empty = c.put(Bytes::new(), &UploadOptions::default()).await.unwrap();
    assert_eq!((empty.size, empty.lines), (0, 0));
    let path = format!("/v1/blobs/{}", empty.digest);
    let r = c.request(Method::GET, &path).send().await.unwrap();
    assert_eq!((r.status(), r.headers()["content-length"].to_str().unwrap()), (StatusCode::OK, "0"));
    let r = c.request(Method::HEAD, &path).send().await.unwrap();
    assert_eq!((r.status(), r.headers()["content-length"].to_str().unwrap()), (StatusCode::OK, "0"));
    // Of an empty representation only a suffix range is satisfiable (RFC 9110 §14.1.1), and no
    // Content-Range can name its zero bytes: it is answered whole, as nginx does.
    let r = c.request(Method::GET, &path).header("Range", "bytes=0-").send().await.unwrap();
    assert_eq!(r.headers()["content-range"], "bytes */0");
    assert_eq!(error_of(r).await, (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable".into()));
    let r = c.request(Method::GET, &path).header("Range", "bytes=-3").send().await.unwrap();
    assert_eq!((r.status(), r.bytes().await.unwrap()), (StatusCode::OK, Bytes::new()));
    let page = c.read(&empty.digest, ReadRequest::Bytes { offset: 0, limit: None }).await.unwrap();
    assert!(page.eof && page.content.is_empty() && page.next_offset.is_none());

    let data = Bytes::from_static(b"0123456789");
    let rec = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
    let path = format!("/v1/blobs/{}", rec.digest);
    let r = c.request(Method::GET, &path).header("Range", "bytes=-0").send().await.unwrap();
    assert_eq!(r.headers()["content-range"], "bytes */10");
    assert_eq!(error_of(r).await.0, StatusCode::RANGE_NOT_SATISFIABLE, "a zero-length suffix selects nothing");
    let r = c.request(Method::GET, &path).header("Range", "bytes=3-5").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    let h = r.headers();
    assert_eq!(h["content-range"], "bytes 3-5/10");
    assert_eq!(h["content-length"], "3");
    assert_eq!(h["accept-ranges"], "bytes");
    assert_eq!(h["etag"], format!("\"{}\"", rec.digest).as_str());
    assert_eq!(r.bytes().await.unwrap(), "345");
    let r = c.request(Method::HEAD, &path).send().await.unwrap();
    let h = r.headers();
    assert_eq!((h["content-length"].to_str().unwrap(), h["accept-ranges"].to_str().unwrap()), ("10", "bytes"));
    assert_eq!(h["etag"], format!("\"{}\"", rec.digest).as_str());
    assert!(r.bytes().await.unwrap().is_empty(), "HEAD has no body");
    // The SHA-256 alias reaches the same bytes on GET and read.
    let got = c.get(&sha256_of(&rec)).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, data);
    let page = c.read(&sha256_of(&rec), ReadRequest::Bytes { offset: 2, limit: Some(3) }).await.unwrap();
    assert_eq!((page.content.as_str(), page.digest.as_deref()), ("234", Some(rec.digest.to_string().as_str())));
    srv.stop().await;
}

/// Query parameters the server does not know are ignored, as S3 does; the ones it knows are
/// checked strictly.
#[tokio::test]
async fn unknown_query_parameters_are_ignored() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let r = c.request(Method::POST, "/v1/blobs?x-id=PutObject&ttl=60").body("some text\n").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let rec: spillway_api::BlobRecord = r.json().await.unwrap();
    let d = rec.digest;
    for path in [
        format!("/v1/blobs/{d}/read?line=1&format=json"),
        format!("/v1/blobs/{d}/grep?pattern=some&v=2"),
        "/v1/refs?sort=asc".into(),
    ] {
        let r = c.request(Method::GET, &path).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let r = c.request(Method::GET, &format!("/v1/blobs/{d}/read?line=x&format=json")).send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "invalid_argument".into()), "known ones are still checked");
    srv.stop().await;
}

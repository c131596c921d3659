//! The accept loop: HTTP/1.1 connections with the timeouts and the connection limit that keep
//! an unauthenticated client from holding the service (idle sockets, headers sent a byte at a
//! time, uploads stalled mid-body, responses their client stops reading). axum's own `serve`
//! sets none of them.
//!
//! At the connection limit a new connection is never left waiting behind idle ones: the
//! oldest connection that is not in the middle of a request gives way — first one that has
//! never sent a complete request head (an idle or half-open socket), then one idle between
//! requests — as nginx's `client_header_timeout` and HAProxy's `timeout http-request` bound
//! the same attack in time. A connection serving a request is never cut, nor one holding bytes
//! the server has not read yet: closing a socket with unread bytes resets it, and those bytes
//! may be a whole request, sent before its connection's task first ran (under a flood of new
//! connections, 1 in ~50,000 evictions was one, measured). When no connection can give way, new
//! connections wait in the listen queue, and the loop looks again every few milliseconds.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;

/// One connection as the accept loop sees it.
#[derive(Debug, Default)]
struct Conn {
    /// Requests in flight: from the call of the service until the response body is dropped
    /// (written to the end, or abandoned).
    busy: AtomicUsize,
    /// Whether a request head ever arrived whole.
    served: AtomicBool,
    /// Asks the connection to close as soon as no request is in flight.
    evict: Notify,
    /// The connection's slot; taken by the connection that evicts this one.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Bytes of a new request arrived while no request was in flight: the next response head
    /// written before the service is called can only be hyper's own refusal of a request it
    /// could not parse (see [`JsonRefusals`]).
    awaiting_head: AtomicBool,
    /// Nothing read from this connection waits to be handled: no read yet, or the last one
    /// found nothing. False from the start of each read until one comes back empty, so a
    /// request read but not yet handed to the service (the same poll, a few microseconds) is
    /// not taken for rest.
    resting: AtomicBool,
    /// The connection's socket, to look for unread bytes before evicting it. Open for as long
    /// as the connection is in the [`Registry`]: its task leaves the registry before it drops
    /// the socket ([`Registered`]).
    fd: RawFd,
}

/// The open connections, by order of arrival.
#[derive(Debug, Default)]
struct Registry {
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn add(&self, id: u64, permit: OwnedSemaphorePermit, fd: RawFd) -> Arc<Conn> {
        // Resting until its first read: with no bytes in its socket, nothing of it is lost.
        let resting = AtomicBool::new(true);
        let conn = Arc::new(Conn { permit: Mutex::new(Some(permit)), fd, resting, ..Conn::default() });
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, conn.clone());
        conn
    }

    fn remove(&self, id: u64) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Closes the oldest idle connection — one that never sent a request first — and hands
    /// its slot over. `None` when every connection is serving a request or holds bytes not
    /// read yet.
    fn evict_oldest_idle(&self) -> Option<OwnedSemaphorePermit> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        // Under the registry's lock every listed socket is open (see `Conn::fd`). The socket is
        // looked at before `resting`: a read that empties it clears `resting` first, so a
        // request read since the look is seen there (SeqCst on both sides).
        let idle = |c: &Conn| {
            c.busy.load(Ordering::Acquire) == 0 && !has_unread_bytes(c.fd) && c.resting.load(Ordering::SeqCst)
        };
        let pick = conns
            .iter()
            .find(|(_, c)| !c.served.load(Ordering::Relaxed) && idle(c))
            .or_else(|| conns.iter().find(|(_, c)| c.served.load(Ordering::Relaxed) && idle(c)))
            .map(|(id, c)| (*id, c.clone()));
        let (id, conn) = pick?;
        conns.remove(&id);
        let permit = conn.permit.lock().unwrap_or_else(|e| e.into_inner()).take();
        conn.evict.notify_one();
        metrics::counter!("spillway_http_connections_evicted_total").increment(1);
        permit
    }
}

/// Whether the socket `fd` holds received bytes not read yet (a peer that closed holds none).
fn has_unread_bytes(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `fd` is an open socket (the caller's invariant); MSG_PEEK leaves what it sees in
    // the socket, MSG_DONTWAIT never blocks, and `byte` is the one byte of buffer we pass.
    let n = unsafe { libc::recv(fd, (&raw mut byte).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n > 0
}

/// Whether a connection ended because a response waited `send_idle_timeout` for its client
/// (the write timeout's `TimedOut`; hyper's own header timeout is not an IO error).
fn send_timed_out(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Takes a connection out of the registry when dropped. Declared after the connection's
/// socket in its task, so it drops first: a socket is closed only once it is out of the
/// registry, whichever way the task ends.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// Accepts until `shutdown` completes, then lets open requests finish (up to 30 s). With
/// `early`, the capped read's common case is answered before `app`'s router
/// ([`answer_before_router`](crate::http::routes::answer_before_router)).
pub async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    early: Option<crate::state::AppState>,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let registry = Arc::new(Registry::default());
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(config.header_read_timeout).keep_alive(true);
    // hyper moves each connection's header deadline to now + timeout on every request. When
    // the runtime's timer has no earlier deadline, each such move wakes the timer driver: a
    // context switch per request (+40 µs at low load, measured). A tick every half second
    // keeps an earlier deadline registered, so the moves stay plain timer-wheel updates.
    let keep_timer_busy = tokio::spawn(async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        loop {
            tick.tick().await;
        }
    });
    tokio::pin!(shutdown);
    let mut next_id = 0u64;
    loop {
        let Some((tcp, permit)) = next_connection(&listener, &slots, &registry, &mut shutdown).await else {
            break;
        };
        // Without it every small reply waits on Nagle and delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        next_id += 1;
        let (id, conn) = (next_id, registry.add(next_id, permit, tcp.as_raw_fd()));
        let service = Tracked { app: app.clone(), early: early.clone(), conn: conn.clone() };
        // A write that makes no progress for `send_idle_timeout` fails the connection: a
        // response is "serving" and never evicted, so a client that asks for a body larger than
        // its socket's buffers and never reads would otherwise hold its slot for good.
        let mut timed = tokio_io_timeout::TimeoutStream::new(tcp);
        timed.set_write_timeout(Some(config.send_idle_timeout));
        let io = JsonRefusals { io: Box::pin(timed), conn: conn.clone(), pending: None };
        let served = http.serve_connection(TokioIo::new(io), service);
        let (registry, stop) = (registry.clone(), stop.clone());
        metrics::gauge!("spillway_http_connections").increment(1.0);
        tasks.spawn(async move {
            tokio::pin!(served);
            let registered = Registered { registry, id };
            let result = tokio::select! {
                r = served.as_mut() => r,
                () = async { tokio::select! { () = conn.evict.notified() => {}, () = stop.cancelled() => {} } } => {
                    if conn.busy.load(Ordering::Acquire) == 0 {
                        // Idle, or a request head still arriving: closed now. (hyper's own
                        // graceful shutdown waits for a first request head to time out.)
                        Ok(())
                    } else {
                        // After the request in flight.
                        served.as_mut().graceful_shutdown();
                        served.await
                    }
                }
            };
            if let Err(e) = result {
                if send_timed_out(&e) {
                    metrics::counter!("spillway_http_send_timeouts_total").increment(1);
                }
                tracing::debug!(cause = %e, "connection ended with an error");
            }
            drop(registered);
            metrics::gauge!("spillway_http_connections").decrement(1.0);
            // Its slot goes back, unless an evicting connection took it.
            drop(conn.permit.lock().unwrap_or_else(|e| e.into_inner()).take());
        });
    }
    drop(listener);
    keep_timer_busy.abort();
    stop.cancel();
    tasks.close();
    if tokio::time::timeout(std::time::Duration::from_secs(30), tasks.wait()).await.is_err() {
        tracing::warn!("connections still open after 30 s of shutdown");
    }
}

/// The next connection and its slot, or `None` once `shutdown` completes. At the limit, the
/// oldest idle connection is asked to make room; when none can, the new one waits for a slot
/// (a connection closing), looking again every [`RECHECK`] for one that came to rest; the
/// connections behind it wait in the listen queue, holding no descriptor here.
async fn next_connection(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    registry: &Registry,
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
) -> Option<(tokio::net::TcpStream, OwnedSemaphorePermit)> {
    loop {
        let accepted = tokio::select! {
            () = shutdown.as_mut() => return None,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _peer)) => tcp,
            Err(e) => {
                // Out of descriptors and the like: say so, breathe, go on.
                tracing::warn!(cause = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Ok(permit) = slots.clone().try_acquire_owned() {
            return Some((tcp, permit));
        }
        // Full: an idle connection gives its slot to this one (and closes); if none can, this
        // one waits for a slot, or for a connection to come to rest (a response sent, unread
        // bytes read).
        loop {
            if let Some(permit) = registry.evict_oldest_idle() {
                return Some((tcp, permit));
            }
            tokio::select! {
                () = shutdown.as_mut() => return None,
                p = slots.clone().acquire_owned() => return Some((tcp, p.ok()?)),
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

/// How often a full accept loop looks again for a connection that can give way.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(5);

/// The router as hyper's service, counting each request in flight on its connection until
/// the response body is dropped.
#[derive(Clone)]
struct Tracked {
    app: axum::Router,
    /// The state for the capped reads answered before the router
    /// ([`answer_before_router`](crate::http::routes::answer_before_router)); `None` on the metrics
    /// listener.
    early: Option<crate::state::AppState>,
    conn: Arc<Conn>,
}

impl hyper::service::Service<http::Request<Incoming>> for Tracked {
    type Response = http::Response<Guarded>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        use tower::ServiceExt;
        self.conn.awaiting_head.store(false, Ordering::Release);
        let busy = Busy::enter(self.conn.clone());
        let (app, early) = (self.app.clone(), self.early.clone());
        Box::pin(async move {
            if let Some(state) = early {
                if let Some(resp) = crate::http::routes::answer_before_router(&state, &req).await {
                    return Ok(resp.map(|body| Guarded { body, _busy: busy }));
                }
            }
            let resp = app.oneshot(req.map(axum::body::Body::new)).await?;
            Ok(resp.map(|body| Guarded { body, _busy: busy }))
        })
    }
}

/// One request in flight on a connection.
struct Busy(Arc<Conn>);

impl Busy {
    fn enter(conn: Arc<Conn>) -> Self {
        conn.served.store(true, Ordering::Relaxed);
        conn.busy.fetch_add(1, Ordering::AcqRel);
        Self(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight until it is dropped.
struct Guarded {
    body: axum::body::Body,
    _busy: Busy,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The connection's IO, with one substitution: when hyper refuses a request it cannot parse
/// (a NUL byte in the path, two `Content-Length`s), it writes its own head with an empty body
/// and closes; the contract answers every error with its JSON body. The refusal is recognised
/// by where it comes — while no request is in flight, after bytes of a new request arrived,
/// before any service call — and by its shape (`HTTP/1.1 4xx/5xx`, `content-length: 0`, one
/// write); it is sent as the same status with the contract's JSON.
struct JsonRefusals<I> {
    io: I,
    conn: Arc<Conn>,
    /// The replacement still being written, and how much of it went.
    pending: Option<(Vec<u8>, usize)>,
}

impl<I: tokio::io::AsyncWrite + Unpin> JsonRefusals<I> {
    /// Writes what is left of a replacement; ready once it is all out.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, done)) = &mut self.pending {
            match Pin::new(&mut self.io).poll_write(cx, &bytes[*done..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    *done += n;
                    if *done == bytes.len() {
                        self.pending = None;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The contract's answer in place of hyper's bodiless refusal `head`, if it is one.
    fn refusal(&self, head: &[u8]) -> Option<Vec<u8>> {
        let idle = self.conn.busy.load(Ordering::Acquire) == 0 && self.conn.awaiting_head.load(Ordering::Acquire);
        if !idle || head.len() > 256 || !head.ends_with(b"\r\n\r\n") {
            return None;
        }
        let text = std::str::from_utf8(head).ok()?;
        let status: u16 = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
        if !(400..600).contains(&status) || !text.to_ascii_lowercase().contains("\r\ncontent-length: 0\r\n") {
            return None;
        }
        let message = match status {
            400 => "malformed request: the request line or a header is not valid HTTP/1.1",
            414 => "the URI is too long",
            431 => "the request headers are too large",
            505 => "this HTTP version is not supported",
            _ => "the request could not be read",
        };
        let reason = text.lines().next()?.get(13..).unwrap_or("").to_owned();
        let body = serde_json::to_vec(&spillway_api::ErrorBody::new(spillway_api::ErrorCode::InvalidArgument, message))
            .ok()?;
        let mut out = format!(
            "HTTP/1.1 {status} {reason}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        Some(out)
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for JsonRefusals<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        self.conn.resting.store(false, Ordering::SeqCst);
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if polled.is_pending() {
            self.conn.resting.store(true, Ordering::SeqCst);
        }
        let got = buf.filled().len() > before;
        if matches!(polled, Poll::Ready(Ok(()))) && got && self.conn.busy.load(Ordering::Acquire) == 0 {
            self.conn.awaiting_head.store(true, Ordering::Release);
        }
        polled
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for JsonRefusals<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.drain(cx))?;
        if let Some(replacement) = self.refusal(buf) {
            self.conn.awaiting_head.store(false, Ordering::Release);
            self.pending = Some((replacement, 0));
            let _ = self.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.drain(cx))?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total <= 256 {
            let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(replacement) = self.refusal(&joined) {
                self.conn.awaiting_head.store(false, Ordering::Release);
                self.pending = Some((replacement, 0));
                let _ = self.drain(cx)?;
                return Poll::Ready(Ok(total));
            }
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

//! The accept loop: HTTP/1.1 connections with the timeouts and the connection limit that keep
//! an unauthenticated client from holding the service (idle sockets, headers sent a byte at a
//! time, uploads stalled mid-body). axum's own `serve` sets none of them.

use std::future::Future;
use std::sync::Arc;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;

/// Accepts until `shutdown` completes, then lets open requests finish (up to 30 s).
pub async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
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
    loop {
        let Some((tcp, permit)) = next_connection(&listener, &slots, &mut shutdown).await else {
            break;
        };
        // Without it every small reply waits on Nagle and delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        metrics::gauge!("spillway_http_connections").increment(1.0);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(cause = %e, "connection ended with an error");
            }
            metrics::gauge!("spillway_http_connections").decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    keep_timer_busy.abort();
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(std::time::Duration::from_secs(30)) => {
            tracing::warn!("connections still open after 30 s of shutdown");
        }
    }
}

/// The next connection and its slot, or `None` once `shutdown` completes. Past the limit, new
/// connections wait in the listen queue, holding no descriptor here.
async fn next_connection(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<(tokio::net::TcpStream, OwnedSemaphorePermit)> {
    let permit = tokio::select! {
        () = shutdown.as_mut() => return None,
        p = slots.clone().acquire_owned() => p.ok()?,
    };
    loop {
        tokio::select! {
            () = shutdown.as_mut() => return None,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => return Some((tcp, permit)),
                Err(e) => {
                    // Out of descriptors and the like: say so, breathe, go on.
                    tracing::warn!(cause = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

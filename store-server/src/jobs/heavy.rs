//! Heavy work — grep through a blob, search across outputs — on threads of its own, apart from
//! the runtime that answers requests, so that a client with a read token cannot slow down
//! everyone's capped reads and uploads by asking for many scans at once.
//!
//! The threads run at a lower priority (nice 10): when the cores are busy, the request threads
//! go first. At most `max_heavy_requests` scans run or wait at once; past that a scan is
//! refused at once with `429 too_many_requests` and `Retry-After`, never queued without bound.
//! Each scan also works for a bounded time (the search budget) and answers with where to go on.
//!
//! And heavy work gives way: between two of its steps (a window scanned, a chunk compacted),
//! when requests began meanwhile, it rests twice as long as it worked, the rests of all of it
//! shared ([`Heavy::give_way`]). Alone on the machine it runs at full speed, on every thread
//! of the pool; beside requests, all of it together takes less than half a core.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, Runtime};
use tokio::sync::Semaphore;

use crate::error::{ApiError, ApiResult};

/// The pool of heavy work.
#[derive(Debug)]
pub struct Heavy {
    handle: Handle,
    runtime: Mutex<Option<Runtime>>,
    permits: Arc<Semaphore>,
    max: usize,
    /// Requests this server has begun (`routes::track`): background work gives way while it
    /// grows ([`Heavy::give_way`]).
    requests: AtomicU64,
    /// Until when background work as a whole rests: every piece of it that worked pushes this
    /// on, and waits for it, so that two searches beside a compaction take no more of the
    /// machine than one would.
    resting_until: Mutex<Instant>,
}

/// How much of the CPU background work may take while requests are coming in: it pauses for
/// this many times as long as it ran.
const PAUSE_PER_WORK: u32 = 2;

/// Where a piece of background work stands between its pauses (see [`Heavy::give_way`]).
#[derive(Debug)]
pub struct Pace {
    seen: u64,
    since: Instant,
}

impl Heavy {
    /// A pool of `threads` threads taking `max` requests at once.
    pub fn new(threads: usize, max: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("spillway-heavy")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
            permits: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            requests: AtomicU64::new(0),
            resting_until: Mutex::new(Instant::now()),
        })
    }

    /// Runs `work` on the pool and answers with its result; `429` when the pool is full. If
    /// the caller goes away (the client hung up), the work is stopped.
    pub async fn run<F, T>(&self, work: F) -> ApiResult<T>
    where
        F: Future<Output = ApiResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self.permits.clone().try_acquire_owned().map_err(|_| ApiError::TooManyRequests {
            message: format!("{} heavy requests (grep, search) are running; retry shortly", self.max),
            retry_after: 1,
        })?;
        let task = AbortOnDrop(self.handle.spawn(async move {
            let _permit = permit;
            work.await
        }));
        match task.await {
            Ok(result) => result,
            Err(e) => Err(ApiError::internal(e)),
        }
    }
}

impl Heavy {
    /// Counts a request begun (every request, whatever its route).
    pub fn request_began(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The pace of a piece of background work starting now.
    pub fn pace(&self) -> Pace {
        Pace { seen: self.requests.load(Ordering::Relaxed), since: Instant::now() }
    }

    /// Called by background work (compaction, a search's scan) between two of its steps: when
    /// requests began since the last call, it rests [`PAUSE_PER_WORK`] times as long as the work
    /// ran since then; when none did, it only yields, and the work goes on at full speed. The
    /// rests are shared ([`Heavy::pause_for`]): all background work together takes at most a
    /// third of a core while requests come when it runs one piece at a time, and less than half
    /// of one however many pieces run at once. A lower priority alone (nice 10) was not enough
    /// on this project's 2-core machines: capped reads were 1.23-1.34x slower while a
    /// compaction ran (`docs/benchmarks.md`).
    pub async fn give_way(&self, pace: &mut Pace) {
        rest(self.pause_for(pace)).await;
    }

    /// The rest [`Heavy::give_way`] takes now, if any, with `pace` moved on past it (for a
    /// caller that keeps its pace behind a lock it must not hold while it sleeps). The work
    /// done since `pace` pushes the shared end of background work's rest on by twice as long,
    /// and the caller rests until that end: one piece at a time, each works a third of the
    /// time; several at once, their work adds up to push everyone's rest on.
    pub fn pause_for(&self, pace: &mut Pace) -> Option<Duration> {
        let seen = self.requests.load(Ordering::Relaxed);
        let now = Instant::now();
        let pause = (seen != pace.seen).then(|| {
            let mut until = self.resting_until.lock().unwrap_or_else(|e| e.into_inner());
            *until = (*until).max(now) + now.saturating_duration_since(pace.since) * PAUSE_PER_WORK;
            until.saturating_duration_since(now)
        });
        pace.seen = seen;
        pace.since = now + pause.unwrap_or_default();
        pause
    }

    /// Runs background work (compaction) on the pool's low-priority threads, outside the
    /// request limit; the handle gives its result.
    pub fn spawn_background<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(work)
    }
}

impl Drop for Heavy {
    fn drop(&mut self) {
        // Dropped from inside another runtime (a test's, the server's): do not block on it.
        if let Some(rt) = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).take() {
            rt.shutdown_background();
        }
    }
}

/// Sleeps for `pause` ([`Heavy::pause_for`]), or only yields when there is none.
pub async fn rest(pause: Option<Duration>) {
    match pause {
        Some(pause) => tokio::time::sleep(pause).await,
        None => tokio::task::yield_now().await,
    }
}

/// A task's handle that stops the task when it is dropped: the future waiting for it went away
/// (the client hung up, or the answer no longer needs it).
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Makes the calling thread yield to the request threads when cores are scarce.
fn lower_priority() {
    // SAFETY: setpriority(PRIO_PROCESS, 0, …) changes the calling thread's nice value on
    // Linux (threads are scheduled apart); it reads no memory of ours.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn background_work_gives_way_only_while_requests_come() {
        // Bounds far apart, so that a busy test machine cannot blur them: 20 ms of work, so a
        // pause is at least 40 ms, and "no pause" is anything shorter than the work itself.
        let work = std::time::Duration::from_millis(20);
        let pool = Heavy::new(1, 1).unwrap();
        let mut pace = pool.pace();
        // No request meanwhile: no pause.
        std::thread::sleep(work);
        let t = Instant::now();
        pool.give_way(&mut pace).await;
        assert!(t.elapsed() < work, "{:?}", t.elapsed());
        // A request began while it worked: it pauses twice as long as it worked.
        std::thread::sleep(work);
        pool.request_began();
        let t = Instant::now();
        pool.give_way(&mut pace).await;
        assert!(t.elapsed() >= 2 * work, "{:?}", t.elapsed());
        // The request is seen: the next step goes on at once again.
        let t = Instant::now();
        pool.give_way(&mut pace).await;
        assert!(t.elapsed() < work, "{:?}", t.elapsed());
    }

    #[test]
    fn pieces_of_work_at_once_share_their_rests() {
        let work = std::time::Duration::from_millis(20);
        let pool = Heavy::new(1, 1).unwrap();
        let (mut a, mut b) = (pool.pace(), pool.pace());
        std::thread::sleep(work);
        pool.request_began();
        // Both worked 20 ms at once: the first rests 40 ms, the second until the rest of both.
        let first = pool.pause_for(&mut a).unwrap();
        let second = pool.pause_for(&mut b).unwrap();
        assert!(first >= 2 * work, "{first:?}");
        assert!(second >= first + 2 * work - std::time::Duration::from_millis(1), "{first:?} then {second:?}");
        // No request since: no rest for either.
        assert_eq!((pool.pause_for(&mut a), pool.pause_for(&mut b)), (None, None));
    }

    #[tokio::test]
    async fn past_its_concurrency_the_pool_says_retry() {
        let pool = Arc::new(Heavy::new(1, 2).unwrap());
        let (release, wait) = tokio::sync::watch::channel(false);
        let held: Vec<_> = (0..2)
            .map(|_| {
                let (pool, mut wait) = (pool.clone(), wait.clone());
                tokio::spawn(async move { pool.run(async move { Ok(wait.wait_for(|r| *r).await.is_ok()) }).await })
            })
            .collect();
        while pool.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let refused = pool.run(async { Ok(()) }).await.unwrap_err();
        assert!(matches!(refused, ApiError::TooManyRequests { retry_after: 1, .. }), "{refused:?}");
        release.send(true).unwrap();
        for h in held {
            assert!(h.await.unwrap().unwrap());
        }
        assert!(pool.run(async { Ok(7) }).await.unwrap() == 7, "a place again once they ended");
    }
}

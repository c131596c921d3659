//! Heavy work — grep through a blob, search across outputs — on threads of its own, apart from
//! the runtime that answers requests, so that a client with a read token cannot slow down
//! everyone's capped reads and uploads by asking for many scans at once.
//!
//! The threads run at a lower priority (nice 10): when the cores are busy, the request threads
//! go first. At most `max_heavy_requests` scans run or wait at once; past that a scan is
//! refused at once with `429 too_many_requests` and `Retry-After`, never queued without bound.
//! Each scan also works for a bounded time (the search budget) and answers with where to go on.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
        let mut task = AbortOnDrop(self.handle.spawn(async move {
            let _permit = permit;
            work.await
        }));
        match (&mut task.0).await {
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

    /// Called by background work (compaction) between two of its steps: when requests began
    /// since the last call, it sleeps [`PAUSE_PER_WORK`] times as long as the work ran since
    /// then, so that it takes at most a third of a core from them; when none did, it only
    /// yields, and the work goes on at full speed. A lower priority alone (nice 10) was not
    /// enough on this project's 2-core machines: capped reads were 1.23-1.34x slower while a
    /// compaction ran (`docs/benchmarks.md`).
    pub async fn give_way(&self, pace: &mut Pace) {
        let now = self.requests.load(Ordering::Relaxed);
        if now != pace.seen {
            let worked = pace.since.elapsed();
            tokio::time::sleep(worked * PAUSE_PER_WORK).await;
            pace.seen = self.requests.load(Ordering::Relaxed);
        } else {
            tokio::task::yield_now().await;
        }
        pace.since = Instant::now();
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

/// Stops the task when the future waiting for it is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

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

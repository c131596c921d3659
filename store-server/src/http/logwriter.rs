//! Where log lines go: stderr, written by a thread of its own in batches.
//!
//! A line is appended to a shared buffer under a lock, and that is all the logging thread pays.
//! The writer thread is woken only when the buffer goes from empty to not empty; it then waits
//! [`GATHER`] for more lines and writes them all with one `write`. Under load that is one
//! wake-up and one write per [`GATHER`] however many requests log, where a channel with a
//! blocked receiver (`tracing-appender`'s non-blocking writer) sent each line as a message of
//! its own, woke the writer far more often and wrote more often (docs/benchmarks.md).
//!
//! Nothing is dropped: past [`LIMIT`] bytes waiting, a logging thread waits for the writer to
//! take them (the back-pressure of a full channel). Lines keep their order: they join one
//! buffer in the order their writers took the lock, and one thread writes the buffers in turn.
//! A line reaches stderr about [`GATHER`] after it was logged, and the [`Guard`] writes what is
//! left when it is dropped (at the end of `main`). A line logged after that is not written, as
//! with `tracing-appender`'s guard: nothing is left running to write it.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long the writer thread gathers lines after the first one wakes it.
pub const GATHER: Duration = Duration::from_millis(5);

/// Bytes waiting past which a logging thread waits for the writer.
pub const LIMIT: usize = 4 << 20;

#[derive(Default)]
struct Shared {
    state: Mutex<Pending>,
    /// The writer waits on it for a first line, or for the end.
    arrived: Condvar,
    /// Logging threads over [`LIMIT`] wait on it for the writer to take the buffer.
    taken: Condvar,
}

#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer: a `MakeWriter` for `tracing_subscriber` (which formats each event into one
/// buffer and writes it with one `write_all`), and a `Write` for whole lines.
#[derive(Clone)]
pub struct BatchedWriter {
    shared: Arc<Shared>,
}

/// Writes what is left and ends the writer thread when dropped.
pub struct Guard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A writer of batches to `out` on a thread named `name`, and its guard.
pub fn batched<W: Write + Send + 'static>(name: &str, mut out: W) -> std::io::Result<(BatchedWriter, Guard)> {
    let shared = Arc::new(Shared::default());
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            let mut spare = Vec::new();
            loop {
                let mut st = shared.lock();
                while st.buf.is_empty() && !st.closed {
                    st = shared.arrived.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
                if st.buf.is_empty() {
                    return; // closed, and all written
                }
                if !st.closed {
                    drop(st);
                    std::thread::sleep(GATHER);
                    st = shared.lock();
                }
                std::mem::swap(&mut st.buf, &mut spare);
                drop(st);
                shared.taken.notify_all();
                // A log that cannot be written has nowhere to say so.
                let _ = out.write_all(&spare).and_then(|()| out.flush());
                spare.clear();
            }
        })?
    };
    Ok((BatchedWriter { shared: shared.clone() }, Guard { shared, thread: Some(thread) }))
}

impl Write for &BatchedWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut st = self.shared.lock();
        while st.buf.len() > LIMIT && !st.closed {
            st = self.shared.taken.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        let first = st.buf.is_empty();
        st.buf.extend_from_slice(line);
        drop(st);
        if first {
            self.shared.arrived.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter {
    type Writer = &'a BatchedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.arrived.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `Write` whose bytes a test reads while another holds it (also `reqlog`'s tests).
    #[derive(Clone, Default)]
    pub(crate) struct Kept(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl Write for Kept {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Lines from many threads all arrive, whole and each thread's in its order, a lone line
    /// soon after it was logged; the guard writes the rest.
    #[test]
    fn lines_arrive_whole_in_order_and_soon() {
        let out = Kept::default();
        let (w, guard) = batched("test-log", out.clone()).unwrap();
        (&w).write_all(b"first\n").unwrap();
        let t = std::time::Instant::now();
        while out.0.lock().unwrap().is_empty() {
            assert!(t.elapsed() < GATHER * 200, "a lone line is written soon");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*out.0.lock().unwrap(), b"first\n");
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for n in 0..20_000 {
                        (&w).write_all(format!("t{i} {n:05} {}\n", "x".repeat(n % 300)).as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        (&w).write_all(b"last\n").unwrap();
        drop(guard);
        let all = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = all.lines().collect();
        assert_eq!(lines.len(), 2 + 4 * 20_000);
        assert_eq!((lines[0], *lines.last().unwrap()), ("first", "last"));
        for i in 0..4 {
            let mine: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with(&format!("t{i} "))).collect();
            assert_eq!(mine.len(), 20_000);
            for (n, l) in mine.iter().enumerate() {
                assert_eq!(*l, format!("t{i} {n:05} {}", "x".repeat(n % 300)), "whole and in order");
            }
        }
    }
}

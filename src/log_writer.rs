//! The log writer: formatted lines are appended to a shared buffer, and one
//! thread writes the buffer to stderr every few tens of milliseconds.
//!
//! A decision's log line then costs a short lock and a copy on the request
//! path — no wake-up of another thread and no system call per line. (The
//! per-line channel of `tracing-appender`'s non-blocking writer woke its
//! thread for nearly every line under load: about 8 % of the sidecar's CPU per
//! fresh claim, docs/BENCHMARKS.md.) The thread sleeps while nothing is
//! logged. A line reaches stderr at most [`FLUSH_EVERY`] after it was logged,
//! or sooner once [`HIGH_WATER`] bytes are waiting. If stderr stalls, at most
//! [`CAP`] bytes wait; later lines are dropped and counted (a line saying how
//! many, and `oncegate_log_lines_dropped_total`) — logging never blocks a
//! request. Dropping the [`Guard`] writes what is left. While lines keep
//! coming the thread flushes on its own timer and is never woken by a line;
//! only the first line after a quiet interval wakes it.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// The longest a line waits in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Bytes waiting that make the thread write at once.
pub const HIGH_WATER: usize = 256 * 1024;
/// Bytes waiting beyond which lines are dropped.
pub const CAP: usize = 16 * 1024 * 1024;

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    dropped: u64,
    /// The writer thread waits for a first line (no timeout).
    idle: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn append(&self, line: &[u8]) {
        let mut st = self.lock();
        if st.buf.len() + line.len() > CAP {
            st.dropped += 1;
            return;
        }
        st.buf.extend_from_slice(line);
        let wake = std::mem::take(&mut st.idle) || st.buf.len() >= HIGH_WATER;
        drop(st);
        if wake {
            self.wake.notify_one();
        }
    }
}

/// A `MakeWriter` for the fmt layer; see the module documentation.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

/// Stops the writer thread once it has written everything (on drop).
pub struct Guard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread, writing to `out`.
pub fn spawn<W: Write + Send + 'static>(out: W) -> std::io::Result<(LogWriter, Guard)> {
    let shared = Arc::new(Shared::default());
    let worker = shared.clone();
    let thread = std::thread::Builder::new()
        .name("oncegate-log".into())
        .spawn(move || write_until_stopped(&worker, out))?;
    Ok((
        LogWriter {
            shared: shared.clone(),
        },
        Guard {
            shared,
            thread: Some(thread),
        },
    ))
}

fn write_until_stopped<W: Write>(shared: &Shared, mut out: W) {
    let mut batch = Vec::new();
    // Whether the last interval brought no line. The thread goes idle (to
    // be woken by the next line) only after a whole quiet interval: while
    // lines keep coming, at a steady moderate rate as much as under load, it
    // wakes on its own timer and no request thread pays a wake-up (at
    // 1,000 lines/s that was one futex wake per ~10 lines, each waking the
    // thread from idle; docs/BENCHMARKS.md).
    let mut quiet = true;
    loop {
        let mut st = shared.lock();
        if st.buf.is_empty() && !st.stop && quiet {
            st.idle = true;
            st = shared
                .wake
                .wait_while(st, |s| s.idle && !s.stop)
                .unwrap_or_else(|e| e.into_inner());
        }
        // Let the batch fill for a moment (lines keep arriving meanwhile).
        if !st.stop && st.buf.len() < HIGH_WATER {
            st = shared
                .wake
                .wait_timeout_while(st, FLUSH_EVERY, |s| !s.stop && s.buf.len() < HIGH_WATER)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        quiet = st.buf.is_empty();
        std::mem::swap(&mut st.buf, &mut batch);
        let (dropped, stop) = (std::mem::take(&mut st.dropped), st.stop);
        drop(st);
        if dropped > 0 {
            metrics::counter!("oncegate_log_lines_dropped_total").increment(dropped);
            let _ = writeln!(
                batch,
                "oncegate: {dropped} log lines dropped (stderr did not keep up)"
            );
        }
        // Nothing else is there to report a failing stderr to.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        // The two buffers take turns; after a stall filled one towards CAP,
        // give the memory back instead of keeping it for good.
        batch.shrink_to(HIGH_WATER);
        if stop {
            return;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One formatted line (the fmt layer writes each event with one call).
pub struct Line<'a>(&'a Shared);

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(&self.shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` the test can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_arrive_in_order_within_the_flush_interval_and_all_on_drop() {
        let sink = Sink::default();
        let (writer, guard) = spawn(sink.clone()).unwrap();
        writer.make_writer().write_all(b"first\n").unwrap();
        let deadline = std::time::Instant::now() + FLUSH_EVERY * 50;
        while sink.0.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            &*sink.0.lock().unwrap(),
            b"first\n",
            "written without a flush by the caller"
        );
        for i in 0..1000 {
            writeln!(writer.make_writer(), "line {i}").unwrap();
        }
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1001);
        assert!(
            lines[1..]
                .iter()
                .enumerate()
                .all(|(i, l)| *l == format!("line {i}"))
        );
    }

    /// A stalled stderr: lines beyond the cap are dropped and reported, and
    /// logging never blocks.
    #[test]
    fn a_stalled_output_drops_lines_beyond_the_cap_and_says_how_many() {
        struct Stalled(Arc<std::sync::Barrier>, Sink);
        impl Write for Stalled {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if self.1.0.lock().unwrap().is_empty() {
                    self.0.wait(); // until the test has overfilled the buffer
                }
                self.1.write(buf)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let sink = Sink::default();
        let (writer, guard) = spawn(Stalled(barrier.clone(), sink.clone())).unwrap();
        writer.make_writer().write_all(b"x\n").unwrap();
        // The thread takes "x" and stalls writing it; once it has taken it
        // (however slow a loaded machine makes that), fill past the cap.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !writer.shared.lock().buf.is_empty() {
            assert!(std::time::Instant::now() < deadline, "\"x\" never taken");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut line = vec![b'y'; 1023];
        line.push(b'\n');
        for _ in 0..CAP / line.len() + 10 {
            writer.make_writer().write_all(&line).unwrap();
        }
        barrier.wait();
        let written = |needle: &'static [u8]| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !sink.0.lock().unwrap().windows(needle.len()).any(|w| w == needle) {
                assert!(std::time::Instant::now() < deadline, "not written in time");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        written(b"log lines dropped");
        writer.make_writer().write_all(b"after\n").unwrap();
        written(b"after\n");
        // The buffer that held the stalled lines is the one filling now.
        assert!(
            writer.shared.lock().buf.capacity() <= HIGH_WATER,
            "the stall's memory was given back"
        );
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("log lines dropped"), "the drop is reported");
        assert!(text.len() <= CAP + 4096, "no more than the cap was kept");
    }
}

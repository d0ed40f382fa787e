//! Logging: `tracing` to stderr and to `<session>/logs/ray-dashd.log`
//! (rotated by size, see [`crate::session::RotatingFile`]), each through a
//! bounded queue and a writer thread of its own, so that a stalled reader
//! of stderr or a slow disk costs log lines, never serving.
//!
//! Lines that do not fit are dropped and counted; once a writer takes lines
//! again it is told how many it missed (see [`Drops`]).

use std::io;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ray_dashd_contract::LockExt;
use tracing::{warn, Metadata};
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::filter::{filter_fn, FilterExt, FilterFn, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

use crate::session::Session;

/// Lines queued for the log file's writer thread. The queue is allocated
/// whole up front, 32 bytes a line whether used or not (the crate's
/// default, 128k lines, costs 4 MiB of RSS; 8k lines cost 256 KiB). At
/// info level the host writes a few lines per module event, so 2k lines
/// outlast any disk stall short of one that no queue would; past them
/// lines are dropped and counted rather than the server blocked.
const FILE_QUEUE_LINES: usize = 2 * 1024;

/// Lines queued for stderr's writer thread, beyond the 64 KiB a pipe holds
/// (some 300 lines at info level). Half the file's: the file is the record
/// and stderr a copy, and a reader of stderr (a wrapper, `docker logs`,
/// journald) that stalls for longer than a burst does not come back in time
/// for any queue.
const STDERR_QUEUE_LINES: usize = 1024;

/// How often the drop counts are looked at. Also the most a writer that
/// keeps dropping lines adds to the other: one notice per interval.
const DROP_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The filter when neither `RAY_DASHD_LOG` nor `RUST_LOG` is set.
const DEFAULT_FILTER: &str = "info";

/// The host's log file in `<session>/logs`. Not Ray's `dashboard.log`:
/// `ray start --include-dashboard=false` still runs Ray's minimal dashboard
/// head, which writes that file, and no file may have two writers.
pub const LOG_FILE: &str = "ray-dashd.log";

/// Targets of a notice meant for one writer alone (see [`Drops::check`]).
/// Under `ray_dashd`, so that the filter treats them as the host's own.
const STDERR_ONLY: &str = "ray_dashd::logging::stderr";
const FILE_ONLY: &str = "ray_dashd::logging::file";

/// Keeps the log writers running; dropped at exit, it reports drops not yet
/// reported and flushes what is queued (each writer waits at most about
/// 1.1 s, the crate's bound, so a stalled stderr cannot hold up the exit).
/// Hold it for the life of the process.
#[must_use = "dropping the guard stops the log writers"]
#[derive(Debug)]
pub struct LogGuard {
    /// Reports drops while the host runs.
    reporter: Reporter,
    // Dropped after `Drop::drop` ran, in this order: the file, then stderr.
    _file: Option<WorkerGuard>,
    _stderr: WorkerGuard,
}

/// Installs the global subscriber. A `ray-dashd.log` that cannot be opened
/// safely (a link, say; see [`crate::session::LogDir`]) is not written: the
/// host logs to stderr only, and says so there once.
pub fn init(session: &Session) -> LogGuard {
    let filter = || {
        std::env::var("RAY_DASHD_LOG")
            .or_else(|_| std::env::var("RUST_LOG"))
            .ok()
            .and_then(|spec| EnvFilter::try_new(spec).ok())
            .unwrap_or_else(|| EnvFilter::new(DEFAULT_FILTER))
    };
    // Lossy: a full queue drops the line and counts it; the thread that
    // logs never waits. Only the writer thread waits on the pipe or disk.
    let (stderr_writer, stderr_guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(STDERR_QUEUE_LINES)
        .lossy(true)
        .thread_name("log-stderr")
        .finish(io::stderr());
    let mut drops = vec![Drops::new(Sink::Stderr, stderr_writer.error_counter())];
    let (file_layer, file_guard, refused) = match session.log_file(LOG_FILE) {
        Ok(file) => {
            let (writer, guard) = NonBlockingBuilder::default()
                .buffered_lines_limit(FILE_QUEUE_LINES)
                .lossy(true)
                .thread_name("log-file")
                .finish(file);
            drops.push(Drops::new(Sink::File, writer.error_counter()));
            let layer = fmt::layer()
                .with_writer(writer)
                .with_ansi(false)
                .with_filter(filter().and(routed(Sink::File)));
            (Some(layer), Some(guard), None)
        }
        Err(error) => (None, None, Some(error)),
    };
    let _ = DROP_COUNTERS.set(drops.iter().map(|d| (d.sink, d.counter.clone())).collect());
    let stderr_is_tty = io::IsTerminal::is_terminal(&io::stderr());
    tracing_subscriber::registry()
        .with(
            fmt::layer()
                .with_writer(stderr_writer)
                .with_ansi(stderr_is_tty)
                .with_filter(filter().and(routed(Sink::Stderr))),
        )
        .with(file_layer)
        .init();
    if let Some(error) = refused {
        warn!(%error, "not writing {LOG_FILE}; logging to stderr only");
    }
    LogGuard {
        reporter: Reporter::start(drops),
        _file: file_guard,
        _stderr: stderr_guard,
    }
}

/// The drop counters of the writers [`init`] started: the subscriber is
/// the process's, and so are they.
static DROP_COUNTERS: OnceLock<Vec<(Sink, ErrorCounter)>> = OnceLock::new();

/// The lines each log writer dropped so far, by writer (`stderr`, the log
/// file's name); empty before [`init`].
pub fn dropped_lines() -> Vec<(&'static str, u64)> {
    DROP_COUNTERS.get().map_or_else(Vec::new, |counters| {
        counters
            .iter()
            .map(|(sink, counter)| (sink.name(), counter.dropped_lines() as u64))
            .collect()
    })
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        // Lines dropped since the last check are reported before the
        // writers flush, when they still can be.
        self.reporter.stop();
    }
}

/// One of the host's log writers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Stderr,
    File,
}

impl Sink {
    fn name(self) -> &'static str {
        match self {
            Sink::Stderr => "stderr",
            Sink::File => LOG_FILE,
        }
    }
}

/// The filter that keeps from `sink` the notices meant for the other one.
fn routed(sink: Sink) -> FilterFn<impl Fn(&Metadata<'_>) -> bool> {
    let other = match sink {
        Sink::Stderr => FILE_ONLY,
        Sink::File => STDERR_ONLY,
    };
    // The hint says what is true (any level passes), and lets the level
    // filter's hint through `and`: without one the subscriber's hint is
    // "everything", and so is the `log` crate's maximum level, which
    // `init` sets from it. Then every `log::trace!` of a dependency
    // (tungstenite's, per websocket frame) went through the whole filter
    // to be dropped: 38 % of the host's instructions per websocket echo.
    filter_fn(move |meta| meta.target() != other).with_max_level_hint(LevelFilter::TRACE)
}

/// What has been reported of one writer's dropped lines.
///
/// When the count grew, a notice goes to every writer: the file learns that
/// stderr fell behind (and the other way round) within an interval. The
/// notice may not fit in the writer that is behind, and is then dropped and
/// counted too; it is sent again, to that writer alone, at every check until
/// it fits. So the stalled writer hears of its gap as soon as it takes lines
/// again, and a writer that stays stalled while nothing else is logged adds
/// nothing to the other.
///
/// A notice's `dropped` is what the writer lost since it last took a notice
/// in, `total` what it lost since the start.
#[derive(Debug)]
struct Drops {
    sink: Sink,
    counter: ErrorCounter,
    /// The count at the last check, after its notice.
    seen: usize,
    /// The count the last notice that reached the writer reported.
    told: usize,
    /// The writer has dropped lines it was not told of.
    owed: bool,
}

impl Drops {
    fn new(sink: Sink, counter: ErrorCounter) -> Drops {
        Drops {
            sink,
            counter,
            seen: 0,
            told: 0,
            owed: false,
        }
    }

    /// Sends a notice when the count grew or one is still owed.
    fn check(&mut self) {
        let total = self.counter.dropped_lines();
        let fresh = total > self.seen;
        if !fresh && !self.owed {
            return;
        }
        let dropped = total - self.told;
        let writer = self.sink.name();
        match (fresh, self.sink) {
            (true, _) => warn!(
                writer,
                dropped, total, "dropped log lines: the writer fell behind"
            ),
            (false, Sink::Stderr) => warn!(
                target: STDERR_ONLY,
                writer, dropped, total, "dropped log lines: the writer fell behind"
            ),
            (false, Sink::File) => warn!(
                target: FILE_ONLY,
                writer, dropped, total, "dropped log lines: the writer fell behind"
            ),
        }
        let after = self.counter.dropped_lines();
        // The count moved: the notice was dropped (or a line logged at the
        // same moment was; then the notice goes again, which is harmless).
        self.owed = after != total;
        if !self.owed {
            self.told = total;
        }
        self.seen = after;
    }
}

/// The thread that checks the drop counts every [`DROP_CHECK_INTERVAL`].
#[derive(Debug)]
struct Reporter {
    /// The counts, shared with the thread.
    drops: Arc<Mutex<Vec<Drops>>>,
    /// Dropped to stop the thread.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Reporter {
    fn start(drops: Vec<Drops>) -> Reporter {
        let drops = Arc::new(Mutex::new(drops));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&drops);
        let spawned = std::thread::Builder::new()
            .name("log-drops".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(DROP_CHECK_INTERVAL)
                {
                    check_all(&shared);
                }
            });
        let thread = match spawned {
            Ok(thread) => Some(thread),
            Err(error) => {
                warn!(%error, "cannot start the thread that reports dropped log lines; they are reported at exit only");
                None
            }
        };
        Reporter {
            drops,
            stop: Some(stop),
            thread,
        }
    }

    /// Stops the thread, then checks once more.
    fn stop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        check_all(&self.drops);
    }
}

fn check_all(drops: &Mutex<Vec<Drops>>) {
    // A notice never blocks (the writers drop what does not fit), so
    // holding the lock across it is brief.
    let mut drops = drops.locked();
    for d in drops.iter_mut() {
        d.check();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Condvar;
    use std::time::Instant;

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Lines written so far, shared with the test.
    #[derive(Debug, Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
        }
    }

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// A writer that blocks, as on a full pipe, until opened.
    #[derive(Debug, Clone, Default)]
    struct Stalled {
        open: Arc<(Mutex<bool>, Condvar)>,
        /// Set once a write is blocked (or went through).
        entered: Arc<(Mutex<bool>, Condvar)>,
        out: Captured,
    }

    impl Stalled {
        /// Waits, within a bound, until the writer thread is in `write`.
        fn wait_entered(&self) {
            let (entered, cv) = &*self.entered;
            let guard = entered.lock().expect("lock");
            let (guard, _) = cv
                .wait_timeout_while(guard, Duration::from_secs(10), |e| !*e)
                .expect("lock");
            assert!(*guard, "the writer thread never took a line");
        }

        fn open(&self) {
            let (open, cv) = &*self.open;
            *open.lock().expect("lock") = true;
            cv.notify_all();
        }
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            {
                let (entered, cv) = &*self.entered;
                *entered.lock().expect("lock") = true;
                cv.notify_all();
            }
            let (open, cv) = &*self.open;
            let mut guard = open.lock().expect("lock");
            while !*guard {
                guard = cv.wait(guard).expect("lock");
            }
            self.out.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The subscriber `init` builds says how verbose it is (the level
    /// filter's level), so that `init` sets the `log` crate's maximum level
    /// from it and dependencies' `log::trace!` calls cost a comparison.
    #[test]
    fn the_writers_filters_keep_the_level_filters_hint() {
        use tracing::Subscriber;
        for (spec, level) in [
            ("info", LevelFilter::INFO),
            ("warn,ray_dashd=debug", LevelFilter::DEBUG),
        ] {
            let subscriber = tracing_subscriber::registry()
                .with(
                    fmt::layer()
                        .with_writer(io::sink)
                        .with_filter(EnvFilter::new(spec).and(routed(Sink::Stderr))),
                )
                .with(
                    fmt::layer()
                        .with_writer(io::sink)
                        .with_filter(EnvFilter::new(spec).and(routed(Sink::File))),
                );
            assert_eq!(subscriber.max_level_hint(), Some(level), "{spec}");
        }
    }

    fn notices(text: &str) -> usize {
        text.matches("dropped log lines").count()
    }

    #[test]
    fn a_stalled_writer_is_told_once_it_takes_lines_and_the_other_once() {
        let stalled = Stalled::default();
        let (writer, guard) = NonBlockingBuilder::default()
            .buffered_lines_limit(1)
            .lossy(true)
            .finish(stalled.clone());
        let mut drops = Drops::new(Sink::Stderr, writer.error_counter());
        let file = Captured::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                fmt::layer()
                    .with_writer(writer)
                    .with_ansi(false)
                    .with_filter(routed(Sink::Stderr)),
            )
            .with(
                fmt::layer()
                    .with_writer(file.clone())
                    .with_ansi(false)
                    .with_filter(routed(Sink::File)),
            );
        tracing::subscriber::with_default(subscriber, || {
            // One line in the writer, one in the queue: the rest dropped.
            tracing::info!(i = 0, "line");
            stalled.wait_entered();
            for i in 1..10 {
                tracing::info!(i, "line");
            }
            drops.check();
            assert_eq!(notices(&file.text()), 1, "{}", file.text());
            assert!(drops.owed, "the notice cannot fit in the stalled writer");
            // Nothing new was dropped but the notices: they go to the
            // stalled writer alone.
            for _ in 0..5 {
                drops.check();
            }
            assert_eq!(notices(&file.text()), 1, "{}", file.text());

            stalled.open();
            let deadline = Instant::now() + Duration::from_secs(10);
            while drops.owed {
                assert!(Instant::now() < deadline, "the notice never fit");
                std::thread::sleep(Duration::from_millis(5));
                drops.check();
            }
        });
        drop(guard);
        let out = stalled.out.text();
        assert_eq!(notices(&out), 1, "{out}");
        assert!(out.contains("writer=\"stderr\""), "{out}");
        let total = drops.counter.dropped_lines();
        assert!(out.contains(&format!("total={total}")), "{total}: {out}");
        assert_eq!(notices(&file.text()), 1, "{}", file.text());
    }
}

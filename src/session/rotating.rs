//! Log files that rotate by size, as Ray's own do (Python's
//! `RotatingFileHandler` with `RAY_ROTATION_MAX_BYTES` and
//! `RAY_ROTATION_BACKUP_COUNT`): once a write would take `name` past the
//! limit, `name.N-1` becomes `name.N` … `name` becomes `name.1`, the oldest
//! beyond the count is replaced, and writing goes on in a new `name`.
//!
//! Used for the host's `ray-dashd.log` (see [`crate::logging`]) and for the
//! modules' `.out` and `.err`, which the host writes for them from a pipe
//! (see [`pump`]): a module's own file descriptor could not be moved to the
//! new file.

use ray_dashd_contract::LockExt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::log_dir::{LogDir, LogFileError};

/// Ray's default `RAY_ROTATION_MAX_BYTES`: 512 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 512 * 1024 * 1024;

/// Ray's default `RAY_ROTATION_BACKUP_COUNT`.
pub const DEFAULT_BACKUP_COUNT: u32 = 5;

/// How the log files the host writes rotate (`server.log_rotation_*` in
/// the config, Ray's `RAY_ROTATION_*` variables over them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The size a file may reach before it is rotated; 0: never rotated.
    pub max_bytes: u64,
    /// How many rotated files are kept (`name.1` … `name.N`); 0: never
    /// rotated (as Python's handler, which then lets the file grow).
    pub backup_count: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            max_bytes: DEFAULT_MAX_BYTES,
            backup_count: DEFAULT_BACKUP_COUNT,
        }
    }
}

impl Rotation {
    /// Whether files rotate at all.
    pub fn enabled(self) -> bool {
        self.max_bytes > 0 && self.backup_count > 0
    }
}

/// A log file of [`LogDir`] that rotates by size. Opened, like every log
/// file there, without following a link (and so reopened after each
/// rotation).
#[derive(Debug)]
pub struct RotatingFile {
    dir: LogDir,
    name: String,
    file: File,
    /// Bytes in the current file (what it had when opened, and since).
    written: u64,
    rotation: Rotation,
}

impl RotatingFile {
    /// Opens `name` in `dir` for appending (see [`LogDir::append`]).
    pub fn open(dir: &LogDir, name: &str, rotation: Rotation) -> Result<Self, LogFileError> {
        let file = dir.append(name)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(RotatingFile {
            dir: dir.clone(),
            name: name.to_owned(),
            file,
            written,
            rotation,
        })
    }

    /// Shifts the rotated files up by one, makes the current one `name.1`
    /// and opens a new `name`. When the new file cannot be opened (another
    /// user put a link in its place, say), writing goes on in the old one,
    /// now `name.1`, and is tried again after another `max_bytes`: no line
    /// is lost, and nothing is written through a link.
    fn rotate(&mut self) -> Result<(), LogFileError> {
        let count = self.rotation.backup_count;
        for n in (1..count).rev() {
            // A missing one is a gap, not an error.
            let _ = self.dir.rename(
                &format!("{}.{n}", self.name),
                &format!("{}.{}", self.name, n + 1),
            );
        }
        self.dir.rename(&self.name, &format!("{}.1", self.name))?;
        self.written = 0;
        self.file = self.dir.append(&self.name)?;
        Ok(())
    }
}

impl RotatingFile {
    fn write_file(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    /// Rotates; on failure, carries on in the current file, to be tried
    /// again after another `max_bytes`.
    fn rotate_or_carry_on(&mut self) {
        if let Err(error) = self.rotate() {
            // Not through `tracing`: this may be its own writer.
            eprintln!("ray-dashd: cannot rotate {}: {error}", self.name);
            self.written = 0;
        }
    }
}

/// Whole lines stay in one file: what does not fit is written up to the
/// last line end that fits (a short write; `write_all` goes on with the
/// rest in the next file). Only a line longer than `max_bytes` is split.
impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let max = self.rotation.max_bytes;
        if !self.rotation.enabled() || self.written + buf.len() as u64 <= max {
            return self.write_file(buf);
        }
        let room = usize::try_from(max.saturating_sub(self.written)).unwrap_or(usize::MAX);
        if let Some(end) = buf[..room.min(buf.len())].iter().rposition(|&b| b == b'\n') {
            return self.write_file(&buf[..=end]);
        }
        if self.written > 0 {
            self.rotate_or_carry_on();
        }
        let room = usize::try_from(max).unwrap_or(usize::MAX);
        if buf.len() <= room {
            return self.write_file(buf);
        }
        let end = buf[..room]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(room, |i| i + 1);
        self.write_file(&buf[..end])
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl RotatingFile {
    /// A pipe whose read end is copied into this file on a thread of its
    /// own (see [`pump`]); its write end, for a module's stdout or stderr.
    pub fn piped(self) -> Result<OwnedFd, LogFileError> {
        let path = self.dir.file_path(&self.name);
        let err = |source: io::Error| LogFileError::Io {
            path: path.clone(),
            source,
        };
        let (read, write) = output_pipe().map_err(err)?;
        pump(read, self).map_err(err)?;
        Ok(write)
    }
}

/// Copies what comes out of `pipe` (the read end of a module's stdout or
/// stderr) into `file` until every writer has closed it, on a thread of its
/// own: a slow disk then holds up that module's output alone, as writing
/// to the file itself would, never the host.
pub fn pump(mut pipe: File, mut file: RotatingFile) -> io::Result<()> {
    /// Small: the thread only reads a pipe and writes a file.
    const STACK_BYTES: usize = 64 * 1024;
    /// On the thread's stack, so that the thread allocates nothing (glibc
    /// would give it a heap arena of its own) and costs one module's
    /// output no more than 16 KiB of resident memory; a pipe read returns
    /// what is there, so a bigger buffer only saves syscalls in a flood.
    const BUF_BYTES: usize = 16 * 1024;
    let name = format!("log-{}", file.name);
    let running = Running::start();
    std::thread::Builder::new()
        .name(name)
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let _running = running;
            let mut buf = [0u8; BUF_BYTES];
            // Said once per failing spell (a full disk fails every write).
            let mut failing = false;
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => match file.write_all(&buf[..n]) {
                        Ok(()) => failing = false,
                        Err(error) if !failing => {
                            failing = true;
                            eprintln!("ray-dashd: cannot write {}: {error}", file.name);
                        }
                        Err(_) => {}
                    },
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        })
        .map(drop)
}

/// Pumps still copying, and the signal that one ended.
static PUMPS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// One running pump, counted in [`PUMPS`] while it lives.
struct Running;

impl Running {
    fn start() -> Running {
        *PUMPS.0.locked() += 1;
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        *PUMPS.0.locked() -= 1;
        PUMPS.1.notify_all();
    }
}

/// Waits, at most `within`, for every pump to copy what its module wrote
/// last: called at exit, once the modules have stopped, so that their
/// final lines reach their files. A pump whose pipe a stray descendant
/// still holds is not waited for past the bound.
pub fn drain(within: Duration) {
    let count = PUMPS.0.locked();
    let _ = PUMPS.1.wait_timeout_while(count, within, |n| *n > 0);
}

/// A pipe for a module's output: the read end for [`pump`], the write end
/// for the module. Both close on exec; the module gets its end as a
/// standard stream, which clears that.
pub fn output_pipe() -> io::Result<(File, OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((File::from(read), write))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (tempfile::TempDir, LogDir) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let logs = LogDir::open(tmp.path()).expect("open logs");
        (tmp, logs)
    }

    fn read(tmp: &tempfile::TempDir, name: &str) -> Option<String> {
        std::fs::read_to_string(tmp.path().join("logs").join(name)).ok()
    }

    #[test]
    fn rotates_past_the_limit_and_keeps_the_backup_count() {
        let (tmp, logs) = fixture();
        let rotation = Rotation {
            max_bytes: 10,
            backup_count: 2,
        };
        let mut file = RotatingFile::open(&logs, "m.out", rotation).expect("open");
        for line in [
            "aaaa\n", "bbbb\n", "cccc\n", "dddd\n", "eeee\n", "ffff\n", "gg\n",
        ] {
            file.write_all(line.as_bytes()).expect("write");
        }
        // Two lines a file; the oldest two lines are gone with the third
        // backup that was not kept.
        assert_eq!(read(&tmp, "m.out").as_deref(), Some("gg\n"));
        assert_eq!(read(&tmp, "m.out.1").as_deref(), Some("eeee\nffff\n"));
        assert_eq!(read(&tmp, "m.out.2").as_deref(), Some("cccc\ndddd\n"));
        assert_eq!(read(&tmp, "m.out.3"), None);
    }

    /// One write of many lines (a pipe's read) is cut at line ends, so no
    /// file passes the size and no line is split; only a line longer than
    /// the size is.
    #[test]
    fn a_big_write_is_cut_at_line_ends() {
        let (tmp, logs) = fixture();
        let rotation = Rotation {
            max_bytes: 12,
            backup_count: 3,
        };
        let mut file = RotatingFile::open(&logs, "m.out", rotation).expect("open");
        file.write_all(b"aaaa\nbbbb\ncccc\ndddddddddddddddd\ne\n")
            .expect("write");
        assert_eq!(read(&tmp, "m.out.3").as_deref(), Some("aaaa\nbbbb\n"));
        assert_eq!(read(&tmp, "m.out.2").as_deref(), Some("cccc\n"));
        assert_eq!(read(&tmp, "m.out.1").as_deref(), Some("dddddddddddd"));
        assert_eq!(read(&tmp, "m.out").as_deref(), Some("dddd\ne\n"));
    }

    #[test]
    fn a_file_reopened_counts_what_it_had() {
        let (tmp, logs) = fixture();
        let rotation = Rotation {
            max_bytes: 10,
            backup_count: 1,
        };
        RotatingFile::open(&logs, "m.err", rotation)
            .expect("open")
            .write_all(b"12345678\n")
            .expect("write");
        RotatingFile::open(&logs, "m.err", rotation)
            .expect("reopen")
            .write_all(b"next\n")
            .expect("write");
        assert_eq!(read(&tmp, "m.err").as_deref(), Some("next\n"));
        assert_eq!(read(&tmp, "m.err.1").as_deref(), Some("12345678\n"));
    }

    #[test]
    fn zero_bytes_or_zero_backups_never_rotate() {
        for rotation in [
            Rotation {
                max_bytes: 0,
                backup_count: 5,
            },
            Rotation {
                max_bytes: 4,
                backup_count: 0,
            },
        ] {
            let (tmp, logs) = fixture();
            let mut file = RotatingFile::open(&logs, "m.out", rotation).expect("open");
            for _ in 0..5 {
                file.write_all(b"line\n").expect("write");
            }
            assert_eq!(read(&tmp, "m.out").map(|t| t.len()), Some(25));
            assert_eq!(read(&tmp, "m.out.1"), None, "{rotation:?}");
        }
    }

    /// A link another user put in the file's place is moved aside by the
    /// rotation, never written through.
    #[test]
    fn a_link_in_the_files_place_is_not_followed() {
        let (tmp, logs) = fixture();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "").expect("outside");
        let rotation = Rotation {
            max_bytes: 6,
            backup_count: 3,
        };
        let mut file = RotatingFile::open(&logs, "m.out", rotation).expect("open");
        file.write_all(b"one\n").expect("write");
        let logs_dir = tmp.path().join("logs");
        std::fs::rename(logs_dir.join("m.out"), logs_dir.join("moved")).expect("move");
        std::os::unix::fs::symlink(&outside, logs_dir.join("m.out")).expect("link");
        file.write_all(b"two\n").expect("write");
        assert_eq!(std::fs::read_to_string(&outside).expect("outside"), "");
        assert_eq!(read(&tmp, "m.out").as_deref(), Some("two\n"));
        let moved = std::fs::symlink_metadata(logs_dir.join("m.out.1")).expect("m.out.1");
        assert!(moved.file_type().is_symlink(), "the link was moved aside");
    }

    /// A rotation that fails (here: a folder where `name.1` goes) loses
    /// nothing: writing goes on in the file, and is tried again later.
    #[test]
    fn a_failed_rotation_keeps_writing_the_file() {
        let (tmp, logs) = fixture();
        let logs_dir = tmp.path().join("logs");
        std::fs::create_dir(logs_dir.join("m.out.1")).expect("folder");
        std::fs::write(logs_dir.join("m.out.1/keep"), "x").expect("non-empty");
        let rotation = Rotation {
            max_bytes: 6,
            backup_count: 1,
        };
        let mut file = RotatingFile::open(&logs, "m.out", rotation).expect("open");
        for line in ["one\n", "two\n", "three\n"] {
            file.write_all(line.as_bytes()).expect("write");
        }
        assert_eq!(read(&tmp, "m.out").as_deref(), Some("one\ntwo\nthree\n"));
    }

    #[test]
    fn pump_copies_a_pipe_until_its_writers_close() {
        let (tmp, logs) = fixture();
        let (read_end, write_end) = output_pipe().expect("pipe");
        let file = RotatingFile::open(&logs, "p.out", Rotation::default()).expect("open");
        pump(read_end, file).expect("pump");
        let mut writer = File::from(write_end);
        writer.write_all(b"through the pipe\n").expect("write");
        drop(writer);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read(&tmp, "p.out").as_deref() != Some("through the pipe\n") {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                read(&tmp, "p.out")
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

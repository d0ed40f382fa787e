//! Following a log file like `tail -F`, for both the streamed and the
//! websocket route: an initial tail, then whole new lines as they are
//! written, across truncation, rotation and the file disappearing.
//!
//! # Theory of operation
//!
//! A [`Follower`] owns an open file and the offset read up to. Every
//! [`POLL_INTERVAL`] it reads what was appended (at most [`READ_CHUNK`] per
//! poll, polling again at once while more is there) on a blocking thread.
//! Bytes after the last newline are held back until their newline arrives,
//! so every batch is whole lines, except a line longer than
//! [`MAX_PENDING_LINE`], which is passed on in pieces to bound memory.
//!
//! - Truncation: the open file is shorter than the offset → read it from 0.
//! - Rotation: once the open file is read to its end, the name is resolved
//!   again; if it now names another file (device + inode), the new file is
//!   opened (through the same checks as any request) and read from 0. Lines
//!   appended to the old file before that are delivered first. A name that
//!   is now a symlink, or reached through one, is refused and ends the
//!   follow: it is never followed, even to a file inside the folder.
//! - Disappearance: while the name names nothing, the old file is kept
//!   (a writer may still hold it); when the name reappears it is a new
//!   file and is read from 0.
//!
//! On truncation or rotation a held-back partial line of the old content is
//! delivered with a `\n` added, so the new content starts on its own line.
//! The stream is driven by its consumer: when the client goes away the
//! stream is dropped, and with it the follower and its file.

use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;

use crate::error::LogsError;
use crate::files::{LogDir, LogFile};
use crate::tail::{last_line_end, read_range, tail_start};

/// Time between two looks at the file when nothing new was found: a new
/// line reaches the client within about this long (the UI wants ~250 ms),
/// and a stat plus a read every 200 ms per follower costs next to nothing.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Most bytes read per poll, bounding memory per follower when a file grows
/// fast or is followed from an early offset.
pub(crate) const READ_CHUNK: u64 = 256 * 1024;

/// Longest partial line held back waiting for its newline; longer lines are
/// passed on in pieces of this size.
pub(crate) const MAX_PENDING_LINE: usize = 1024 * 1024;

/// Most bytes of the initial tail (and of a `lines=` read): what
/// `MAX_LINES` lines of ordinary log lines take, with room to spare.
pub(crate) const MAX_TAIL_BYTES: u64 = 16 * 1024 * 1024;

/// Where following starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// After the last `n` complete lines (sent first).
    Lines(usize),
    /// At this byte offset; past the end (the file shrank since) means 0.
    Offset(u64),
}

/// A file being followed: the open file, how far it was read, and the
/// partial line held back.
#[derive(Debug)]
pub(crate) struct Follower {
    /// The folder to resolve `name` in again after rotation.
    dir: LogDir,
    /// The name as the client sent it.
    name: String,
    /// The open file; `None` after rotation until the new one opens.
    current: Option<LogFile>,
    /// Offset in `current` read up to (held-back bytes included).
    offset: u64,
    /// Bytes after the last newline read, not yet sent.
    pending: Vec<u8>,
}

/// A follower just opened, with the initial tail to send first.
#[derive(Debug)]
pub(crate) struct Opening {
    /// The follower, positioned after `initial`.
    pub(crate) follower: Follower,
    /// The initial tail (for [`Start::Lines`]; empty for an offset).
    pub(crate) initial: Bytes,
    /// The file's size when opened.
    pub(crate) size: u64,
    /// Offset of the first byte of `initial` (or the start offset).
    pub(crate) start: u64,
}

/// What one poll found.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Whole new lines (possibly empty).
    pub(crate) data: Vec<u8>,
    /// True when more may be readable right away: poll again without waiting.
    pub(crate) more: bool,
}

impl Follower {
    /// Opens `name` and reads the initial tail; blocking.
    pub(crate) fn open(dir: &LogDir, name: &str, start: Start) -> Result<Opening, LogsError> {
        let opened = dir.open(name)?;
        let io_err = |e| LogsError::from_io(name, e);
        let size = opened.file.metadata().map_err(io_err)?.len();
        let (begin, offset, initial) = match start {
            Start::Lines(lines) => {
                // Only whole lines go out; a partial last line waits.
                let end =
                    last_line_end(&opened.file, size, MAX_PENDING_LINE as u64).map_err(io_err)?;
                let begin = tail_start(&opened.file, end, lines, MAX_TAIL_BYTES).map_err(io_err)?;
                let initial = read_range(&opened.file, begin, end).map_err(io_err)?;
                (begin, begin + initial.len() as u64, initial)
            }
            Start::Offset(offset) => {
                let offset = if offset > size { 0 } else { offset };
                (offset, offset, Vec::new())
            }
        };
        tracing::debug!(name = %name, start = begin, size, "follow started");
        Ok(Opening {
            follower: Self {
                dir: dir.clone(),
                name: name.to_owned(),
                current: Some(opened),
                offset,
                pending: Vec::new(),
            },
            initial: initial.into(),
            size,
            start: begin,
        })
    }

    /// Opens on a blocking thread; see [`open`](Self::open).
    pub(crate) async fn open_async(
        dir: LogDir,
        name: String,
        start: Start,
    ) -> Result<Opening, LogsError> {
        let for_error = name.clone();
        tokio::task::spawn_blocking(move || Self::open(&dir, &name, start))
            .await
            .unwrap_or_else(|e| Err(LogsError::from_join(&for_error, e)))
    }

    /// Reads what is new; blocking. An error means the name can no longer
    /// be followed (refused after rotation, unreadable) and ends the follow.
    pub(crate) fn poll(&mut self) -> Result<Batch, LogsError> {
        let mut batch = Batch::default();
        if self.current.is_none() {
            match self.dir.open(&self.name) {
                Ok(reopened) => {
                    tracing::debug!(name = %self.name, "following the new file");
                    self.offset = 0;
                    self.current = Some(reopened);
                }
                // Gone between noticing the rotation and reopening: wait.
                Err(LogsError::NotFound { .. }) => return Ok(batch),
                Err(e) => return Err(e),
            }
        }
        let current = self.current.as_ref().expect("opened just above");

        let io_err = |e| LogsError::from_io(&self.name, e);
        let size = current.file.metadata().map_err(io_err)?.len();
        if size < self.offset {
            tracing::debug!(name = %self.name, size, offset = self.offset, "file truncated");
            flush_pending(&mut self.pending, &mut batch.data);
            self.offset = 0;
        }
        let end = size.min(self.offset + READ_CHUNK);
        let new = read_range(&current.file, self.offset, end).map_err(io_err)?;
        self.offset += new.len() as u64;
        take_lines(&mut self.pending, &new, &mut batch.data);
        if self.offset < size {
            batch.more = true;
            return Ok(batch);
        }

        // Read to the end: has the name moved on to another file?
        match self.dir.identify(&self.name)? {
            Some(id) if id != current.id => {
                tracing::debug!(name = %self.name, "file rotated");
                flush_pending(&mut self.pending, &mut batch.data);
                self.current = None;
                batch.more = true;
            }
            // Same file, or the name names nothing for now: keep the old
            // file, whose writer may still be writing to it.
            Some(_) | None => {}
        }
        Ok(batch)
    }

    /// The initial tail, then one item per poll that found new lines, until
    /// an error (sent as the last item). Polls only while being consumed.
    pub(crate) fn stream(
        opening: Opening,
    ) -> impl Stream<Item = Result<Bytes, LogsError>> + Send + 'static {
        let state = StreamState {
            follower: Some(opening.follower),
            initial: Some(opening.initial),
            wait: false,
        };
        futures_util::stream::unfold(state, |mut state| async move {
            if let Some(initial) = state.initial.take().filter(|b| !b.is_empty()) {
                return Some((Ok(initial), state));
            }
            loop {
                let mut follower = state.follower.take()?;
                if state.wait {
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
                let name = follower.name.clone();
                let polled = tokio::task::spawn_blocking(move || {
                    let result = follower.poll();
                    (follower, result)
                })
                .await;
                match polled {
                    Ok((follower, Ok(batch))) => {
                        state.follower = Some(follower);
                        state.wait = !batch.more;
                        if !batch.data.is_empty() {
                            return Some((Ok(batch.data.into()), state));
                        }
                    }
                    // With no follower left, the next call ends the stream.
                    Ok((_, Err(e))) => return Some((Err(e), state)),
                    Err(e) => return Some((Err(LogsError::from_join(&name, e)), state)),
                }
            }
        })
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        tracing::debug!(name = %self.name, offset = self.offset, "follow stopped");
    }
}

/// The state [`Follower::stream`] threads through its polls.
#[derive(Debug)]
struct StreamState {
    /// `None` once an error was sent: the stream ends.
    follower: Option<Follower>,
    /// The initial tail, until sent.
    initial: Option<Bytes>,
    /// Whether to sleep before the next poll.
    wait: bool,
}

/// Appends the whole lines of `pending + new` to `out` and keeps the rest
/// in `pending`, passing it on anyway once it reaches [`MAX_PENDING_LINE`].
fn take_lines(pending: &mut Vec<u8>, new: &[u8], out: &mut Vec<u8>) {
    match new.iter().rposition(|&b| b == b'\n') {
        Some(last) => {
            out.append(pending);
            out.extend_from_slice(&new[..=last]);
            pending.extend_from_slice(&new[last + 1..]);
        }
        None => pending.extend_from_slice(new),
    }
    if pending.len() >= MAX_PENDING_LINE {
        out.append(pending);
    }
}

/// Passes on a held-back partial line, ended with `\n`, because its file
/// will not continue it.
fn flush_pending(pending: &mut Vec<u8>, out: &mut Vec<u8>) {
    if !pending.is_empty() {
        out.append(pending);
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;

    fn fixture(content: &str) -> (tempfile::TempDir, LogDir) {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("f.log"), content).unwrap();
        let dir = LogDir::new(tmp.path()).unwrap();
        (tmp, dir)
    }

    fn append(dir: &LogDir, text: &str) {
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(dir.root().join("f.log"))
            .unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    /// Polls until a poll says nothing more is readable now; returns all.
    fn drain(follower: &mut Follower) -> String {
        let mut out = Vec::new();
        loop {
            let batch = follower.poll().unwrap();
            out.extend(batch.data);
            if !batch.more {
                return String::from_utf8(out).unwrap();
            }
        }
    }

    /// The initial tail is the last complete lines; the partial last line
    /// is held back until its newline arrives, then sent whole.
    #[test]
    fn holds_partial_line_until_newline() {
        let (_tmp, dir) = fixture("a\nb\nc\npart");
        let mut opening = Follower::open(&dir, "f.log", Start::Lines(2)).unwrap();
        assert_eq!(&opening.initial[..], b"b\nc\n");
        assert_eq!(opening.start, 2);
        assert_eq!(drain(&mut opening.follower), "");
        append(&dir, "ial");
        assert_eq!(drain(&mut opening.follower), "");
        append(&dir, "\nnext");
        assert_eq!(drain(&mut opening.follower), "partial\n");
    }

    /// Following from an offset starts there; an offset past the end
    /// starts at 0.
    #[test]
    fn starts_at_offset() {
        let (_tmp, dir) = fixture("0123\n4567\n");
        let mut opening = Follower::open(&dir, "f.log", Start::Offset(5)).unwrap();
        assert!(opening.initial.is_empty());
        assert_eq!(drain(&mut opening.follower), "4567\n");
        let mut opening = Follower::open(&dir, "f.log", Start::Offset(99)).unwrap();
        assert_eq!(drain(&mut opening.follower), "0123\n4567\n");
    }

    /// After truncation the new content is read from 0, and a partial line
    /// of the old content is ended with a newline.
    #[test]
    fn rereads_after_truncation() {
        let (_tmp, dir) = fixture("old line one\nold line two\nold partial");
        let mut follower = Follower::open(&dir, "f.log", Start::Lines(0))
            .unwrap()
            .follower;
        assert_eq!(drain(&mut follower), "");
        fs::write(dir.root().join("f.log"), "new\n").unwrap();
        assert_eq!(drain(&mut follower), "old partial\nnew\n");
    }

    /// After `mv f f.1; touch f` lines still appended to the old file come
    /// first, then the new file from 0.
    #[test]
    fn follows_rotation_to_new_file() {
        let (_tmp, dir) = fixture("first\n");
        let mut follower = Follower::open(&dir, "f.log", Start::Lines(1))
            .unwrap()
            .follower;
        let root = dir.root();
        fs::rename(root.join("f.log"), root.join("f.log.1")).unwrap();
        // The writer still holds the old file.
        let mut old = fs::OpenOptions::new()
            .append(true)
            .open(root.join("f.log.1"))
            .unwrap();
        old.write_all(b"late\n").unwrap();
        // Name missing: keep reading the old file.
        assert_eq!(drain(&mut follower), "late\n");
        fs::write(root.join("f.log"), "new one\nnew two\n").unwrap();
        assert_eq!(drain(&mut follower), "new one\nnew two\n");
        append(&dir, "more\n");
        assert_eq!(drain(&mut follower), "more\n");
    }

    /// A file removed and created again is read from 0 once it is back;
    /// meanwhile following waits.
    #[test]
    fn follows_file_that_disappears_and_reappears() {
        let (_tmp, dir) = fixture("first\n");
        let mut follower = Follower::open(&dir, "f.log", Start::Lines(1))
            .unwrap()
            .follower;
        fs::remove_file(dir.root().join("f.log")).unwrap();
        assert_eq!(drain(&mut follower), "");
        assert_eq!(drain(&mut follower), "");
        fs::write(dir.root().join("f.log"), "back\n").unwrap();
        assert_eq!(drain(&mut follower), "back\n");
    }

    /// A line longer than the hold-back limit is passed on in pieces.
    #[test]
    fn passes_on_overlong_partial_line() {
        let mut pending = Vec::new();
        let mut out = Vec::new();
        take_lines(&mut pending, &vec![b'x'; MAX_PENDING_LINE - 1], &mut out);
        assert!(out.is_empty());
        take_lines(&mut pending, b"yy", &mut out);
        assert_eq!(out.len(), MAX_PENDING_LINE + 1);
        assert!(pending.is_empty());
    }

    /// When the name becomes a link leading out of the folder, following
    /// stops with a refusal instead of reading it.
    #[test]
    fn stops_when_rotated_to_escaping_link() {
        let (tmp, dir) = fixture("first\n");
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), "secret\n").unwrap();
        let mut follower = Follower::open(&dir, "f.log", Start::Lines(1))
            .unwrap()
            .follower;
        fs::remove_file(tmp.path().join("f.log")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), tmp.path().join("f.log"))
            .unwrap();
        let err = follower.poll().unwrap_err();
        assert!(matches!(err, LogsError::Refused { .. }), "{err:?}");
    }

    /// A link is refused even when it leads inside, as the last component
    /// (`mv f f.1; ln -s f.1 f`) or on the way (`mv d d.1; ln -s d.1 d`):
    /// following stops instead of going through it.
    #[test]
    fn stops_when_name_or_folder_becomes_inside_link() {
        let (tmp, dir) = fixture("first\n");
        let root = tmp.path();
        let mut follower = Follower::open(&dir, "f.log", Start::Lines(1))
            .unwrap()
            .follower;
        fs::rename(root.join("f.log"), root.join("f.log.1")).unwrap();
        std::os::unix::fs::symlink("f.log.1", root.join("f.log")).unwrap();
        let err = follower.poll().unwrap_err();
        assert!(matches!(err, LogsError::Refused { .. }), "{err:?}");

        fs::create_dir(root.join("d")).unwrap();
        fs::write(root.join("d/g.log"), "first\n").unwrap();
        let mut follower = Follower::open(&dir, "d/g.log", Start::Lines(1))
            .unwrap()
            .follower;
        fs::rename(root.join("d"), root.join("d.1")).unwrap();
        std::os::unix::fs::symlink("d.1", root.join("d")).unwrap();
        let err = follower.poll().unwrap_err();
        assert!(matches!(err, LogsError::Refused { .. }), "{err:?}");
    }
}

//! The session's `logs/` folder, held open: the host's and the modules' log
//! files are opened relative to it and never through a link, because Ray
//! makes the folder writable by every local user.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The folder's name in the session folder.
const LOGS: &str = "logs";

/// Mode of a folder or file this host creates, before the umask: what
/// `std::fs` uses, so the files look as they did before they were opened
/// this way.
const CREATE_MODE: u32 = 0o666;
const CREATE_DIR_MODE: u32 = 0o777;

/// `<session>/logs`, opened once without following a link. Every log file
/// is opened by name relative to this handle, with `O_NOFOLLOW`: a link put
/// in a file's place is refused, and whatever is put in the folder's place
/// after the host opened it is not used.
#[derive(Debug, Clone)]
pub struct LogDir {
    /// The folder's path, for messages.
    path: Arc<Path>,
    /// The folder itself.
    fd: Arc<OwnedFd>,
}

/// Why a log file was not opened. Each message names the file and, for a
/// refusal, why it was refused.
#[derive(Debug, thiserror::Error)]
pub enum LogFileError {
    /// A symbolic link is where the file should be. Another local user can
    /// make one in the shared folder, pointing at a file of this host's
    /// user.
    #[error("log file {path}: is a symbolic link; refused, so that nothing is written to or read from where it points")]
    Link {
        /// The file's path.
        path: PathBuf,
    },
    /// Something other than a regular file (a FIFO could hold the host in
    /// `open` or `write`).
    #[error("log file {path}: is a {kind}, not a regular file; refused")]
    NotRegular {
        /// The file's path.
        path: PathBuf,
        /// What it is instead: `FIFO`, `folder`, …
        kind: &'static str,
    },
    /// A regular file with more than one name: possibly another user's
    /// hard link to a file of this host's user.
    #[error("log file {path}: has {links} hard links; refused, as one may be another user's link to a file of this user")]
    HardLinked {
        /// The file's path.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// The file could not be opened or inspected.
    #[error("log file {path}: {source}")]
    Io {
        /// The file's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl LogDir {
    /// Makes `<session_dir>/logs` if it is missing and opens it. The session
    /// folder is the operator's choice and may be a link (Ray's
    /// `session_latest` is one); `logs` in it may not.
    pub(crate) fn open(session_dir: &Path) -> io::Result<LogDir> {
        let session = rustix::fs::open(
            session_dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        match rustix::fs::mkdirat(&session, LOGS, Mode::from_raw_mode(CREATE_DIR_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&session, LOGS, flags, Mode::empty()).map_err(|e| {
            // ELOOP for a link with O_NOFOLLOW, ENOTDIR for anything else
            // that is not a folder; say which, in words.
            match rustix::fs::statat(&session, LOGS, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if is_link(st.st_mode) => {
                    io::Error::other("is a symbolic link; it must be a folder of its own")
                }
                Ok(_) if e == Errno::NOTDIR => io::Error::other("exists and is not a folder"),
                _ => e.into(),
            }
        })?;
        Ok(LogDir {
            path: session_dir.join(LOGS).into(),
            fd: Arc::new(fd),
        })
    }

    /// The path of `name` in the folder, for messages.
    pub fn file_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Opens `name` for appending, creating it if missing (mode 0666 less
    /// the umask). Refuses a link, anything but a regular file, and a file
    /// with more than one hard link.
    pub fn append(&self, name: &str) -> Result<File, LogFileError> {
        self.open_file(name, OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE)
    }

    /// Renames `from` to `to` in the folder (replacing `to`). A link is
    /// renamed itself, never followed.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), LogFileError> {
        rustix::fs::renameat(&*self.fd, from, &*self.fd, to).map_err(|e| LogFileError::Io {
            path: self.file_path(from),
            source: e.into(),
        })
    }

    /// Opens `name` for reading, with the same refusals as [`append`](Self::append).
    pub fn read(&self, name: &str) -> Result<File, LogFileError> {
        self.open_file(name, OFlags::RDONLY)
    }

    fn open_file(&self, name: &str, access: OFlags) -> Result<File, LogFileError> {
        let path = self.file_path(name);
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            // Only a name in the folder itself: O_NOFOLLOW guards the last
            // component alone.
            return Err(LogFileError::Io {
                path,
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a plain file name"),
            });
        }
        // O_NOFOLLOW: a link as the last component fails with ELOOP, a
        // dangling one too (O_CREAT does not create its target).
        // O_NONBLOCK: a FIFO put in the file's place must not hold the host
        // in `open` (a write-only open waits for a reader). O_NOCTTY: a
        // terminal must not become the host's controlling terminal.
        let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&*self.fd, name, flags, Mode::from_raw_mode(CREATE_MODE))
        {
            Ok(fd) => fd,
            Err(Errno::LOOP) => return Err(LogFileError::Link { path }),
            // ENXIO: a FIFO without a reader, or a device without its driver.
            Err(e) => {
                let kind = rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .ok()
                    .map(|st| st.st_mode);
                return Err(match kind {
                    Some(mode) if is_link(mode) => LogFileError::Link { path },
                    Some(mode) => match not_regular(mode) {
                        Some(kind) => LogFileError::NotRegular { path, kind },
                        None => LogFileError::Io {
                            path,
                            source: e.into(),
                        },
                    },
                    _ => LogFileError::Io {
                        path,
                        source: e.into(),
                    },
                });
            }
        };
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source: io::Error| LogFileError::Io { path, source }
        };
        let file = File::from(fd);
        let meta = file.metadata().map_err(io_err(&path))?;
        if let Some(kind) = not_regular(meta.mode()) {
            return Err(LogFileError::NotRegular { path, kind });
        }
        if meta.nlink() > 1 {
            return Err(LogFileError::HardLinked {
                path,
                links: meta.nlink(),
            });
        }
        // A regular file ignores O_NONBLOCK, but a module inherits the open
        // file description and its flags: hand it a plain one.
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| io_err(&path)(e.into()))?;
        rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)
            .map_err(|e| io_err(&path)(e.into()))?;
        Ok(file)
    }
}

fn is_link(mode: u32) -> bool {
    FileType::from_raw_mode(mode) == FileType::Symlink
}

/// What a file of mode `mode` is, when it is not a regular file.
fn not_regular(mode: u32) -> Option<&'static str> {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => None,
        FileType::Fifo => Some("FIFO"),
        FileType::Directory => Some("folder"),
        FileType::Socket => Some("socket"),
        FileType::Symlink => Some("symbolic link"),
        _ => Some("device"),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn fixture() -> (tempfile::TempDir, LogDir) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let logs = LogDir::open(tmp.path()).expect("open logs");
        (tmp, logs)
    }

    #[test]
    fn appends_to_a_regular_file_and_reads_it_back() {
        let (tmp, logs) = fixture();
        for line in ["one\n", "two\n"] {
            let mut file = logs.append("a.log").expect("append");
            file.write_all(line.as_bytes()).expect("write");
        }
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("logs/a.log")).expect("read"),
            "one\ntwo\n"
        );
        let mut text = String::new();
        logs.read("a.log")
            .expect("read")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(text, "one\ntwo\n");
        let flags = rustix::fs::fcntl_getfl(logs.append("a.log").expect("append")).expect("flags");
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
    }

    #[test]
    fn a_link_is_refused_and_its_target_untouched() {
        let (tmp, logs) = fixture();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "keep\n").expect("write");
        std::os::unix::fs::symlink(&outside, tmp.path().join("logs/a.err")).expect("link");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), tmp.path().join("logs/b.err"))
            .expect("link");
        for name in ["a.err", "b.err"] {
            let err = logs.append(name).expect_err("refused");
            assert!(matches!(err, LogFileError::Link { .. }), "{err}");
            let msg = err.to_string();
            assert!(msg.contains(name) && msg.contains("symbolic link"), "{msg}");
            assert!(matches!(logs.read(name), Err(LogFileError::Link { .. })));
        }
        assert_eq!(std::fs::read_to_string(&outside).expect("read"), "keep\n");
        assert!(!tmp.path().join("nowhere").exists());
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_reader() {
        let (tmp, logs) = fixture();
        nix::unistd::mkfifo(
            &tmp.path().join("logs/f.err"),
            nix::sys::stat::Mode::from_bits_truncate(0o666),
        )
        .expect("mkfifo");
        let err = logs.append("f.err").expect_err("refused");
        assert!(
            matches!(err, LogFileError::NotRegular { kind: "FIFO", .. }),
            "{err}"
        );
        let err = logs.read("f.err").expect_err("refused");
        assert!(matches!(err, LogFileError::NotRegular { .. }), "{err}");
    }

    #[test]
    fn a_hard_linked_file_is_refused() {
        let (tmp, logs) = fixture();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "keep\n").expect("write");
        std::fs::hard_link(&outside, tmp.path().join("logs/h.err")).expect("hard link");
        let err = logs.append("h.err").expect_err("refused");
        assert!(
            matches!(err, LogFileError::HardLinked { links: 2, .. }),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&outside).expect("read"), "keep\n");
    }

    #[test]
    fn names_outside_the_folder_are_refused() {
        let (tmp, logs) = fixture();
        std::fs::create_dir(tmp.path().join("logs/sub")).expect("mkdir");
        for name in ["", ".", "..", "sub/x", "../x"] {
            assert!(
                matches!(logs.append(name), Err(LogFileError::Io { .. })),
                "{name:?}"
            );
        }
        assert!(!tmp.path().join("logs/sub/x").exists() && !tmp.path().join("x").exists());
    }

    #[test]
    fn a_folder_swapped_in_after_open_is_not_used() {
        let (tmp, logs) = fixture();
        let moved = tmp.path().join("moved");
        std::fs::rename(tmp.path().join("logs"), &moved).expect("rename");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("logs")).expect("link");
        logs.append("a.log").expect("append");
        assert!(moved.join("a.log").is_file());
        assert!(!elsewhere.join("a.log").exists());
    }
}

//! The log folder: turning a client's `name` into a regular file that is
//! certainly inside it, and listing the files a client may ask for. Names
//! are checked here without touching the filesystem, then reached only
//! through [`Beneath`], which holds the folder open and follows no symlink:
//! nothing opens or stats a path built from client input by its string.
//!
//! Symlinks inside the log folder are refused, wherever they are in a name
//! and wherever they lead, and are not listed: Ray's own logs have none,
//! and following one cannot be made safe against a writer swapping it.

use std::cmp::Ordering;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::{fstat, FileType, Stat};
use serde::Serialize;

use crate::beneath::{Beneath, Folder};
use crate::error::{LogsError, StartupError};

/// Deepest folder level listed: `a/b/c/d/file` is listed, `a/b/c/d/e/file`
/// is not. Ray's own logs nest two levels (`events/`, `old/`); the bound
/// keeps a listing cheap even for a deep tree.
pub(crate) const MAX_DEPTH: usize = 4;

/// Most files one listing returns; Ray sessions that ran for weeks can hold
/// tens of thousands of worker logs, and the UI cannot show more anyway.
pub(crate) const MAX_LISTED: usize = 10_000;

/// The log folder, opened once at start; every name is resolved beneath it.
#[derive(Debug, Clone)]
pub struct LogDir {
    inner: Arc<Inner>,
}

/// What the clones of a [`LogDir`] share.
#[derive(Debug)]
struct Inner {
    /// Canonical absolute path, for logs and tests: nothing is opened by it.
    root: PathBuf,
    /// The folder held open: the only way in.
    beneath: Beneath,
}

/// A log file opened for reading, with what identifies it on disk.
#[derive(Debug)]
pub(crate) struct LogFile {
    /// The open file (read-only).
    pub(crate) file: File,
    /// Device and inode of the open file, to notice rotation.
    pub(crate) id: FileId,
}

/// Device and inode number: what a path names, independent of the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub(crate) fn of(stat: &Stat) -> Self {
        Self {
            dev: stat.st_dev,
            ino: stat.st_ino,
        }
    }
}

/// The answer of `GET /api/dashd/logs/files`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Listing {
    /// Regular files, sorted by name (byte order).
    pub(crate) files: Vec<ListedFile>,
    /// True when more files exist than were listed.
    pub(crate) truncated: bool,
}

/// One file of a [`Listing`].
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct ListedFile {
    /// Path relative to the log folder, `/`-separated: what `name=` takes.
    pub(crate) name: String,
    /// Size in bytes.
    pub(crate) size: u64,
    /// Last modification, in milliseconds since the Unix epoch (null when
    /// the filesystem does not say).
    pub(crate) modified_ms: Option<u64>,
}

/// A client's name, checked and split, not yet looked up.
#[derive(Debug)]
struct Name<'a> {
    /// The components, `.` left out: none is `..`, empty or a root.
    parts: Vec<&'a OsStr>,
    /// The name ended with `/`: it must be a folder (so it is never served).
    folder_only: bool,
}

impl LogDir {
    /// Opens `path`, which must be an existing folder, and holds it open.
    pub fn new(path: &Path) -> Result<Self, StartupError> {
        Self::open_with(path, Beneath::open)
    }

    /// [`new`](Self::new) with the strategy forced, to test both.
    #[cfg(test)]
    pub(crate) fn with_strategy(
        path: &Path,
        strategy: crate::beneath::Strategy,
    ) -> Result<Self, StartupError> {
        Self::open_with(path, |root| Beneath::with_strategy(root, strategy))
    }

    fn open_with(
        path: &Path,
        open: impl FnOnce(&Path) -> io::Result<Beneath>,
    ) -> Result<Self, StartupError> {
        let fail = |source| StartupError::LogDir {
            path: path.to_owned(),
            source,
        };
        let root = fs::canonicalize(path).map_err(fail)?;
        let beneath = open(&root).map_err(fail)?;
        tracing::debug!(log_dir = %root.display(), strategy = ?beneath.strategy(), "log folder opened");
        Ok(Self {
            inner: Arc::new(Inner { root, beneath }),
        })
    }

    /// The canonical path of the folder (for display).
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// How many clones of this handle exist: lets tests see that a follower
    /// (which holds one) was dropped.
    #[cfg(test)]
    pub(crate) fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Opens `name` for reading, only if it is a regular file reached
    /// through no symlink.
    ///
    /// The kind is checked before opening (opening a FIFO or device can
    /// block or have side effects) and again on the open file, since the
    /// entry may have been replaced in between: `O_NONBLOCK` keeps a FIFO
    /// swapped in from blocking the open, and it is then refused.
    pub(crate) fn open(&self, name: &str) -> Result<LogFile, LogsError> {
        let parsed = parse(name)?;
        let io_err = |e| LogsError::from_io(name, e);
        let located = self.inner.beneath.locate(&parsed.parts).map_err(io_err)?;
        check_regular(name, &parsed, &located.stat().map_err(io_err)?)?;
        let file = located.open_read().map_err(io_err)?;
        let stat = fstat(&file).map_err(|e| io_err(e.into()))?;
        check_regular(name, &parsed, &stat)?;
        Ok(LogFile {
            file,
            id: FileId::of(&stat),
        })
    }

    /// What `name` names now, or `None` if it names nothing. Refused like
    /// [`open`](Self::open) (a symlink now at the name, or on the way to
    /// it, is refused, not followed), but without opening anything.
    pub(crate) fn identify(&self, name: &str) -> Result<Option<FileId>, LogsError> {
        let parsed = parse(name)?;
        let stat = self
            .inner
            .beneath
            .locate(&parsed.parts)
            .and_then(|located| located.stat());
        match stat.map_err(|e| LogsError::from_io(name, e)) {
            Ok(stat) => Ok(Some(FileId::of(&stat))),
            Err(LogsError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Lists the regular files in the folder and its subfolders, down to
    /// [`MAX_DEPTH`], sorted by name, at most [`MAX_LISTED`].
    pub(crate) fn list(&self) -> Result<Listing, LogsError> {
        self.list_at_most(MAX_LISTED)
    }

    /// [`list`](Self::list) with the cap as a parameter.
    ///
    /// Each folder's entries are visited sorted by `name` for files and
    /// `name/` for folders, so the depth-first walk yields full paths in
    /// byte order and can stop at the cap with exactly the first `limit`
    /// names. Symlinks are neither listed nor entered (a name through one
    /// would be refused); every folder is entered relative to its open
    /// parent with `O_NOFOLLOW`, so a folder swapped for a link meanwhile
    /// is skipped, not followed. Unreadable subfolders are skipped.
    pub(crate) fn list_at_most(&self, limit: usize) -> Result<Listing, LogsError> {
        let mut files = Vec::new();
        self.inner
            .beneath
            .root_folder()
            .and_then(|root| walk(root, "", 0, limit + 1, &mut files))
            .map_err(|e| LogsError::from_io(".", e))?;
        let truncated = files.len() > limit;
        files.truncate(limit);
        Ok(Listing { files, truncated })
    }
}

/// Checks `name` and splits it, before the filesystem is touched: empty,
/// NUL, absolute and `..` names are refused outright, and a name of the
/// folder itself (`.`) is a folder.
fn parse(name: &str) -> Result<Name<'_>, LogsError> {
    let refuse = |reason| LogsError::Refused {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(refuse("empty name"));
    }
    if name.contains('\0') {
        return Err(refuse("contains NUL"));
    }
    let mut parts = Vec::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse("contains a `..` component")),
            Component::RootDir | Component::Prefix(_) => return Err(refuse("is absolute")),
        }
    }
    if parts.is_empty() {
        return Err(LogsError::IsDirectory {
            name: name.to_owned(),
        });
    }
    Ok(Name {
        parts,
        folder_only: name.ends_with('/'),
    })
}

/// Adds the files under `folder` (whose names start with `prefix`) to `out`
/// until it holds `limit`.
fn walk(
    mut folder: Folder,
    prefix: &str,
    depth: usize,
    limit: usize,
    out: &mut Vec<ListedFile>,
) -> io::Result<()> {
    let mut entries = Vec::new();
    for (c_name, kind) in folder.entries()? {
        let Ok(file_name) = c_name.to_str().map(str::to_owned) else {
            // Not UTF-8: it could not be asked for by `name=` anyway.
            continue;
        };
        let listed = match kind {
            FileType::Directory => (depth < MAX_DEPTH).then_some(Entry::Folder),
            // Links are refused by name, so listing them would only tease;
            // special files are never served.
            FileType::Symlink
            | FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => None,
            // Regular, or a filesystem that does not record the type.
            _ => folder
                .stat(&c_name)
                .ok()
                .and_then(|stat| Entry::of(&stat, depth)),
        };
        if let Some(listed) = listed {
            entries.push((file_name, c_name, listed));
        }
    }
    entries.sort_by(|(a, _, a_kind), (b, _, b_kind)| walk_order(a, a_kind, b, b_kind));

    for (file_name, c_name, listed) in entries {
        if out.len() >= limit {
            break;
        }
        let name = format!("{prefix}{file_name}");
        match listed {
            Entry::File { size, modified_ms } => out.push(ListedFile {
                name,
                size,
                modified_ms,
            }),
            Entry::Folder => {
                let walked = folder
                    .subfolder(&c_name)
                    .and_then(|sub| walk(sub, &format!("{name}/"), depth + 1, limit, out));
                if let Err(e) = walked {
                    tracing::debug!(folder = %name, error = %e, "skipping unreadable folder");
                }
            }
        }
    }
    Ok(())
}

/// A folder entry worth listing or entering.
#[derive(Debug)]
enum Entry {
    /// A regular file.
    File { size: u64, modified_ms: Option<u64> },
    /// A real folder to walk into.
    Folder,
}

impl Entry {
    /// The entry `stat` describes at `depth`, if it is listed.
    fn of(stat: &Stat, depth: usize) -> Option<Self> {
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Some(Self::File {
                size: u64::try_from(stat.st_size).unwrap_or(0),
                modified_ms: modified_ms(stat),
            }),
            FileType::Directory => (depth < MAX_DEPTH).then_some(Self::Folder),
            _ => None,
        }
    }
}

/// Orders entries as their full paths sort: a folder `a` as `a/`.
fn walk_order(a: &str, a_kind: &Entry, b: &str, b_kind: &Entry) -> Ordering {
    let key = |name: &str, kind: &Entry| {
        let mut key = name.as_bytes().to_vec();
        if matches!(kind, Entry::Folder) {
            key.push(b'/');
        }
        key
    };
    key(a, a_kind).cmp(&key(b, b_kind))
}

/// Refuses folders and special files (links never get here: they are
/// `ELOOP` in [`Beneath`]).
fn check_regular(name: &str, parsed: &Name<'_>, stat: &Stat) -> Result<(), LogsError> {
    let name = name.to_owned();
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Err(LogsError::IsDirectory { name }),
        // `f.log/` asks for a folder named `f.log`: there is none.
        FileType::RegularFile if parsed.folder_only => Err(LogsError::NotFound { name }),
        FileType::RegularFile => Ok(()),
        _ => Err(LogsError::NotRegularFile { name }),
    }
}

/// Modification time in milliseconds since the epoch (`None` before it).
fn modified_ms(stat: &Stat) -> Option<u64> {
    let secs = u64::try_from(stat.st_mtime).ok()?;
    let nanos = u32::try_from(stat.st_mtime_nsec).ok()?;
    u64::try_from(Duration::new(secs, nanos).as_millis()).ok()
}

#[cfg(test)]
mod race_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A log folder `logs/` inside a temp dir, with `outside/secret` beside it.
    fn fixture() -> (tempfile::TempDir, LogDir) {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("logs")).unwrap();
        fs::create_dir(tmp.path().join("outside")).unwrap();
        fs::write(tmp.path().join("outside/secret"), "secret\n").unwrap();
        let dir = LogDir::new(&tmp.path().join("logs")).unwrap();
        (tmp, dir)
    }

    fn names(listing: &Listing) -> Vec<&str> {
        listing.files.iter().map(|f| f.name.as_str()).collect()
    }

    /// The walk yields names in byte order even where a folder name is a
    /// prefix of a file name (`a/x` sorts after `a.log`).
    #[test]
    fn lists_in_full_path_order() {
        let (_tmp, dir) = fixture();
        fs::create_dir(dir.root().join("a")).unwrap();
        fs::write(dir.root().join("a/x"), "").unwrap();
        fs::write(dir.root().join("a.log"), "").unwrap();
        fs::write(dir.root().join("a0"), "").unwrap();
        let listing = dir.list().unwrap();
        assert_eq!(names(&listing), ["a.log", "a/x", "a0"]);
    }

    /// Links are not listed, whether they lead to a file or a folder,
    /// inside or out.
    #[test]
    fn does_not_list_links() {
        let (tmp, dir) = fixture();
        fs::create_dir(dir.root().join("d")).unwrap();
        fs::write(dir.root().join("d/real.log"), "").unwrap();
        symlink("real.log", dir.root().join("d/alias.log")).unwrap();
        symlink("d", dir.root().join("d-link")).unwrap();
        symlink(tmp.path().join("outside"), dir.root().join("out")).unwrap();
        assert_eq!(names(&dir.list().unwrap()), ["d/real.log"]);
    }

    /// A trailing `/` asks for a folder: a file by that name is not found,
    /// and `.` names the log folder itself.
    #[test]
    fn trailing_slash_and_dot() {
        let (_tmp, dir) = fixture();
        fs::write(dir.root().join("f.log"), "").unwrap();
        let err = dir.open("f.log/").unwrap_err();
        assert!(matches!(err, LogsError::NotFound { .. }), "{err:?}");
        for name in [".", "./"] {
            let err = dir.open(name).unwrap_err();
            assert!(matches!(err, LogsError::IsDirectory { .. }), "{err:?}");
        }
    }

    /// The cap keeps exactly the first names and says it cut.
    #[test]
    fn caps_listing_and_flags_truncation() {
        let (_tmp, dir) = fixture();
        for name in ["e", "d", "c", "b", "a"] {
            fs::write(dir.root().join(name), "").unwrap();
        }
        let listing = dir.list_at_most(3).unwrap();
        assert_eq!(names(&listing), ["a", "b", "c"]);
        assert!(listing.truncated);
        let listing = dir.list_at_most(5).unwrap();
        assert_eq!(listing.files.len(), 5);
        assert!(!listing.truncated);
    }

    /// Files four folders down are listed, five down are not.
    #[test]
    fn lists_down_to_max_depth() {
        let (_tmp, dir) = fixture();
        fs::create_dir_all(dir.root().join("a/b/c/d/e")).unwrap();
        fs::write(dir.root().join("a/b/c/d/ok.log"), "").unwrap();
        fs::write(dir.root().join("a/b/c/d/e/deep.log"), "").unwrap();
        assert_eq!(names(&dir.list().unwrap()), ["a/b/c/d/ok.log"]);
    }

    /// A missing name under a link that leads out is refused, not 404, so
    /// the answer does not reveal what exists outside.
    #[test]
    fn missing_name_under_escaping_link_is_refused() {
        let (tmp, dir) = fixture();
        symlink(tmp.path().join("outside"), dir.root().join("out")).unwrap();
        let err = dir.open("out/nope").unwrap_err();
        assert!(matches!(err, LogsError::Refused { .. }), "{err:?}");
        let err = dir.identify("out/nope").unwrap_err();
        assert!(matches!(err, LogsError::Refused { .. }), "{err:?}");
        let err = dir.open("nope/deeper").unwrap_err();
        assert!(matches!(err, LogsError::NotFound { .. }), "{err:?}");
        assert!(dir.identify("nope/deeper").unwrap().is_none());
    }

    /// Links are refused even when they lead inside, as the last component
    /// or on the way, by `open` and `identify`, with a reason that says so;
    /// a FIFO is never opened.
    #[test]
    fn refuses_inside_links_and_fifos() {
        let (_tmp, dir) = fixture();
        fs::create_dir(dir.root().join("d")).unwrap();
        fs::write(dir.root().join("d/real.log"), "x\n").unwrap();
        symlink("real.log", dir.root().join("d/alias.log")).unwrap();
        symlink("d", dir.root().join("d-link")).unwrap();
        assert!(dir.open("d/real.log").is_ok());
        for name in ["d/alias.log", "d-link/real.log", "d-link"] {
            let err = dir.open(name).unwrap_err();
            assert!(matches!(err, LogsError::Refused { .. }), "{name}: {err:?}");
            assert!(err.to_string().contains("symlink"), "{name}: {err}");
            let err = dir.identify(name).unwrap_err();
            assert!(matches!(err, LogsError::Refused { .. }), "{name}: {err:?}");
        }
        let fifo = dir.root().join("pipe");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let err = dir.open("pipe").unwrap_err();
        assert!(matches!(err, LogsError::NotRegularFile { .. }), "{err:?}");
    }
}

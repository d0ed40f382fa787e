//! The log folder: turning a client's `name` into a regular file that is
//! certainly inside it, and listing the files a client may ask for. Nothing
//! outside this file touches a path built from client input.

use std::cmp::Ordering;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde::Serialize;

use crate::error::{LogsError, StartupError};

/// Deepest folder level listed: `a/b/c/d/file` is listed, `a/b/c/d/e/file`
/// is not. Ray's own logs nest two levels (`events/`, `old/`); the bound
/// keeps a listing cheap even if someone links a deep tree in.
pub(crate) const MAX_DEPTH: usize = 4;

/// Most files one listing returns; Ray sessions that ran for weeks can hold
/// tens of thousands of worker logs, and the UI cannot show more anyway.
pub(crate) const MAX_LISTED: usize = 10_000;

/// The log folder, canonicalized once at start; every name is resolved
/// against it and must stay inside it.
#[derive(Debug, Clone)]
pub struct LogDir {
    /// Canonical absolute path: no symlinks, no `..`.
    root: Arc<Path>,
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
    fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
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

impl LogDir {
    /// Canonicalizes `path`, which must be an existing folder.
    pub fn new(path: &Path) -> Result<Self, StartupError> {
        let fail = |source| StartupError::LogDir {
            path: path.to_owned(),
            source,
        };
        let root = fs::canonicalize(path).map_err(fail)?;
        if !fs::metadata(&root).map_err(fail)?.is_dir() {
            return Err(fail(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            )));
        }
        Ok(Self { root: root.into() })
    }

    /// The canonical path of the folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many clones of this handle exist: lets tests see that a follower
    /// (which holds one) was dropped.
    #[cfg(test)]
    pub(crate) fn handles(&self) -> usize {
        Arc::strong_count(&self.root)
    }

    /// Resolves `name` to the canonical path of an existing entry inside
    /// the folder.
    ///
    /// Syntax is checked before the filesystem is touched: empty, NUL,
    /// absolute and `..` names are refused outright. Then the joined path is
    /// canonicalized and must start with the canonical root, which catches a
    /// symlink anywhere in the path that leads out. A missing name whose
    /// existing part already leads out is refused rather than reported
    /// missing, so answers never reveal what exists outside.
    pub(crate) fn resolve(&self, name: &str) -> Result<PathBuf, LogsError> {
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
        let relative = Path::new(name);
        for component in relative.components() {
            match component {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir => return Err(refuse("contains a `..` component")),
                Component::RootDir | Component::Prefix(_) => return Err(refuse("is absolute")),
            }
        }
        let joined = self.root.join(relative);
        match fs::canonicalize(&joined) {
            Ok(canonical) if canonical.starts_with(&self.root) => Ok(canonical),
            Ok(_) => Err(refuse("resolves outside the log folder")),
            Err(e) => {
                let missing = matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                );
                if missing && self.existing_part_escapes(&joined) {
                    return Err(refuse("resolves outside the log folder"));
                }
                Err(LogsError::from_io(name, e))
            }
        }
    }

    /// Whether the deepest existing ancestor of `joined` resolves outside.
    fn existing_part_escapes(&self, joined: &Path) -> bool {
        joined
            .ancestors()
            .skip(1)
            .find_map(|ancestor| fs::canonicalize(ancestor).ok())
            .is_some_and(|canonical| !canonical.starts_with(&self.root))
    }

    /// Opens `name` for reading: resolved as in [`resolve`](Self::resolve),
    /// and only if it is a regular file.
    pub(crate) fn open(&self, name: &str) -> Result<LogFile, LogsError> {
        let path = self.resolve(name)?;
        let io_err = |e| LogsError::from_io(name, e);
        // Check the kind before opening: opening a FIFO or device can block
        // or have side effects.
        check_regular(name, &fs::metadata(&path).map_err(io_err)?)?;
        // The canonical path has no symlinks, so O_NOFOLLOW only bites if
        // the last component was swapped for one since; O_NONBLOCK keeps a
        // FIFO swapped in from blocking the open.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        check_regular(name, &meta)?;
        Ok(LogFile {
            file,
            id: FileId::of(&meta),
        })
    }

    /// What `name` names now, or `None` if it names nothing.
    pub(crate) fn identify(&self, name: &str) -> Result<Option<FileId>, LogsError> {
        let meta = match self.resolve(name) {
            Ok(path) => fs::metadata(path).map_err(|e| LogsError::from_io(name, e)),
            Err(e) => Err(e),
        };
        match meta {
            Ok(meta) => Ok(Some(FileId::of(&meta))),
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
    /// names. Symlinks are listed only when they resolve to a regular file
    /// inside the folder; linked folders are not entered (no cycles, no
    /// duplicates). Unreadable subfolders are skipped.
    pub(crate) fn list_at_most(&self, limit: usize) -> Result<Listing, LogsError> {
        let mut files = Vec::new();
        let root = self.root.to_path_buf();
        self.walk(&root, "", 0, limit + 1, &mut files)
            .map_err(|e| LogsError::from_io(".", e))?;
        let truncated = files.len() > limit;
        files.truncate(limit);
        Ok(Listing { files, truncated })
    }

    /// Adds the files under `dir` (whose names start with `prefix`) to
    /// `out` until it holds `limit`.
    fn walk(
        &self,
        dir: &Path,
        prefix: &str,
        depth: usize,
        limit: usize,
        out: &mut Vec<ListedFile>,
    ) -> io::Result<()> {
        let mut entries = Vec::new();
        for entry in fs::read_dir(dir)? {
            let Ok(entry) = entry else { continue };
            let Ok(file_name) = entry.file_name().into_string() else {
                // Not UTF-8: it could not be asked for by `name=` anyway.
                continue;
            };
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            let listed = if kind.is_symlink() {
                self.linked_file(&path)
            } else if kind.is_dir() {
                (depth < MAX_DEPTH).then_some(Entry::Dir)
            } else if kind.is_file() {
                entry.metadata().ok().map(Entry::File)
            } else {
                None
            };
            if let Some(listed) = listed {
                entries.push((file_name, path, listed));
            }
        }
        entries.sort_by(|(a, _, a_kind), (b, _, b_kind)| walk_order(a, a_kind, b, b_kind));

        for (file_name, path, listed) in entries {
            if out.len() >= limit {
                break;
            }
            let name = format!("{prefix}{file_name}");
            match listed {
                Entry::File(meta) => out.push(ListedFile {
                    name,
                    size: meta.len(),
                    modified_ms: modified_ms(&meta),
                }),
                Entry::Dir => {
                    // A folder swapped for a link since read_dir must not
                    // lead the walk outside.
                    let inside = fs::canonicalize(&path).is_ok_and(|p| p.starts_with(&self.root));
                    if !inside {
                        continue;
                    }
                    if let Err(e) = self.walk(&path, &format!("{name}/"), depth + 1, limit, out) {
                        tracing::debug!(folder = %name, error = %e, "skipping unreadable folder");
                    }
                }
            }
        }
        Ok(())
    }

    /// The metadata of the regular file a symlink leads to, if it stays
    /// inside the folder.
    fn linked_file(&self, link: &Path) -> Option<Entry> {
        let target = fs::canonicalize(link).ok()?;
        if !target.starts_with(&self.root) {
            return None;
        }
        let meta = fs::metadata(target).ok()?;
        meta.is_file().then_some(Entry::File(meta))
    }
}

/// A folder entry worth listing or entering.
#[derive(Debug)]
enum Entry {
    /// A regular file (or a link to one), with its metadata.
    File(Metadata),
    /// A real folder to walk into.
    Dir,
}

/// Orders entries as their full paths sort: a folder `a` as `a/`.
fn walk_order(a: &str, a_kind: &Entry, b: &str, b_kind: &Entry) -> Ordering {
    let key = |name: &str, kind: &Entry| {
        let mut key = name.as_bytes().to_vec();
        if matches!(kind, Entry::Dir) {
            key.push(b'/');
        }
        key
    };
    key(a, a_kind).cmp(&key(b, b_kind))
}

/// Refuses folders and special files.
fn check_regular(name: &str, meta: &Metadata) -> Result<(), LogsError> {
    let name = name.to_owned();
    if meta.is_dir() {
        Err(LogsError::IsDirectory { name })
    } else if !meta.is_file() {
        Err(LogsError::NotRegularFile { name })
    } else {
        Ok(())
    }
}

/// Modification time in milliseconds since the epoch.
fn modified_ms(meta: &Metadata) -> Option<u64> {
    let since_epoch = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since_epoch.as_millis()).ok()
}

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
        let err = dir.resolve("out/nope").unwrap_err();
        assert!(matches!(err, LogsError::Refused { .. }), "{err:?}");
        let err = dir.resolve("nope/deeper").unwrap_err();
        assert!(matches!(err, LogsError::NotFound { .. }), "{err:?}");
    }

    /// Links inside the folder are followed; a FIFO is never opened.
    #[test]
    fn opens_inside_links_and_refuses_fifos() {
        let (_tmp, dir) = fixture();
        fs::write(dir.root().join("real.log"), "x\n").unwrap();
        symlink("real.log", dir.root().join("alias.log")).unwrap();
        assert_eq!(
            dir.open("alias.log").unwrap().id,
            dir.open("real.log").unwrap().id
        );
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

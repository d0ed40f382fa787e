//! Opening names beneath the log folder so that no component of the path
//! can be a symlink, whatever happens to the folder meanwhile.
//!
//! # Why
//!
//! Checking a path (canonicalize, compare with the root) and then opening it
//! by its string is a race: between the two, anyone who may write in the
//! folder (Ray makes the session folder and `logs/` mode 0777) can swap a
//! sub-folder for a link leading out, `renameat2(RENAME_EXCHANGE)` in a
//! loop, and the open follows the link. So nothing here opens a path by its
//! string: the log folder is opened once at start-up and held as a file
//! descriptor, every name is resolved relative to it, and no component may
//! be a symlink at the moment the kernel walks it.
//!
//! # How
//!
//! - Linux 5.6 and later: one `openat2` with `RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS` opens the folders of a name.
//! - Older kernels, or a seccomp filter that refuses `openat2`: a walk, one
//!   `openat(O_PATH | O_NOFOLLOW)` per component relative to the folder
//!   opened before it, with `fstat` checking that what was opened is a real
//!   folder (a link is opened as itself, and refused).
//!
//! Either way the last component is then looked at (`AT_SYMLINK_NOFOLLOW`)
//! and opened (`O_NOFOLLOW | O_NONBLOCK`) relative to the open folder that
//! holds it. A symlink anywhere fails with `ELOOP`, which callers report as
//! refused. Which way is used is decided once at start-up, by trying
//! `openat2` on the folder itself; `ENOSYS` later falls back too.
//!
//! Callers pass components already checked: none is `..`, empty or absolute.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{
    fstat, openat, openat2, statat, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat, CWD,
};
use rustix::io::Errno;

/// How `openat2` resolves: never above the folder, never through a link.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);

/// A folder held only to resolve names in (no reading, no permission needed
/// beyond search).
const FOLDER_PATH: OFlags = OFlags::PATH.union(OFlags::DIRECTORY).union(OFlags::CLOEXEC);

/// How the folders of a name are opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// One `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`.
    Openat2,
    /// One `openat(O_PATH | O_NOFOLLOW)` and `fstat` per component.
    Walk,
}

/// The log folder, held open; the only way to reach what is inside it.
#[derive(Debug)]
pub(crate) struct Beneath {
    /// The folder, opened `O_PATH` at start-up.
    root: OwnedFd,
    /// Whether `openat2` works here.
    strategy: Strategy,
}

impl Beneath {
    /// Opens the folder at `path` (links in `path` itself are followed: it
    /// is the operator's, not a client's) and picks the strategy.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let root = openat(CWD, path, FOLDER_PATH, Mode::empty())?;
        let strategy = match openat2(&root, ".", FOLDER_PATH, Mode::empty(), RESOLVE) {
            Ok(_) => Strategy::Openat2,
            Err(e) => {
                tracing::info!(
                    error = %e,
                    "openat2 unavailable, resolving log names one component at a time"
                );
                Strategy::Walk
            }
        };
        Ok(Self { root, strategy })
    }

    /// [`open`](Self::open) with the strategy forced, to test both.
    #[cfg(test)]
    pub(crate) fn with_strategy(path: &Path, strategy: Strategy) -> io::Result<Self> {
        let mut beneath = Self::open(path)?;
        beneath.strategy = strategy;
        Ok(beneath)
    }

    /// The strategy in use.
    pub(crate) fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Finds the folder holding the last of `parts`, for looking at or
    /// opening that last component. `parts` empty names the root itself,
    /// which is a folder: `EISDIR`.
    pub(crate) fn locate<'a>(&'a self, parts: &[&'a OsStr]) -> io::Result<Located<'a>> {
        let Some((name, folders)) = parts.split_last() else {
            return Err(Errno::ISDIR.into());
        };
        Ok(Located {
            folder: self.folder(folders)?,
            name,
        })
    }

    /// The root as a folder to list.
    pub(crate) fn root_folder(&self) -> io::Result<Folder> {
        let fd = openat(&self.root, ".", LISTABLE, Mode::empty())?;
        Ok(Folder { dir: Dir::new(fd)? })
    }

    /// Opens the folder `folders` below the root, through no link.
    fn folder(&self, folders: &[&OsStr]) -> io::Result<Held<'_>> {
        let Some((first, rest)) = folders.split_first() else {
            return Ok(Held::Root(self.root.as_fd()));
        };
        if self.strategy == Strategy::Openat2 {
            let path: PathBuf = folders.iter().collect();
            match openat2(
                &self.root,
                path.as_path(),
                FOLDER_PATH,
                Mode::empty(),
                RESOLVE,
            ) {
                // Refused after the probe passed (a seccomp filter added
                // later, say): the walk is as safe, only slower.
                Err(Errno::NOSYS) => {}
                opened => return Ok(Held::Owned(opened?)),
            }
        }
        let mut current = step(self.root.as_fd(), first)?;
        for folder in rest {
            current = step(current.as_fd(), folder)?;
        }
        Ok(Held::Owned(current))
    }
}

/// Opens the single component `name` of `at`, which must be a real folder:
/// `O_NOFOLLOW` with `O_PATH` opens a link as itself, so `fstat` sees
/// exactly what was resolved.
fn step(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let fd = openat(
        at,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    match FileType::from_raw_mode(fstat(&fd)?.st_mode) {
        FileType::Directory => Ok(fd),
        FileType::Symlink => Err(Errno::LOOP.into()),
        _ => Err(Errno::NOTDIR.into()),
    }
}

/// A folder opened for reading its entries.
const LISTABLE: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

/// The root (borrowed) or a folder below it (owned).
#[derive(Debug)]
enum Held<'a> {
    Root(BorrowedFd<'a>),
    Owned(OwnedFd),
}

impl AsFd for Held<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Root(fd) => *fd,
            Self::Owned(fd) => fd.as_fd(),
        }
    }
}

/// The last component of a name, with the open folder that holds it.
#[derive(Debug)]
pub(crate) struct Located<'a> {
    folder: Held<'a>,
    name: &'a OsStr,
}

impl Located<'_> {
    /// What the last component is, not following it: a link is `ELOOP`.
    pub(crate) fn stat(&self) -> io::Result<Stat> {
        not_a_link(statat(&self.folder, self.name, AtFlags::SYMLINK_NOFOLLOW)?)
    }

    /// Opens the last component read-only: never through a link (`ELOOP`),
    /// never waiting for a FIFO's writer, never as a controlling terminal.
    pub(crate) fn open_read(&self) -> io::Result<File> {
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        Ok(File::from(openat(
            &self.folder,
            self.name,
            flags,
            Mode::empty(),
        )?))
    }
}

/// A folder being listed: its entries, looked at and entered relative to it.
#[derive(Debug)]
pub(crate) struct Folder {
    dir: Dir,
}

impl Folder {
    /// The entries but `.` and `..`, each with its type as the folder
    /// records it ([`FileType::Unknown`] on filesystems that do not).
    pub(crate) fn entries(&mut self) -> io::Result<Vec<(CString, FileType)>> {
        let mut entries = Vec::new();
        while let Some(entry) = self.dir.read() {
            let entry = entry?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                entries.push((name.to_owned(), entry.file_type()));
            }
        }
        Ok(entries)
    }

    /// What the entry `name` is now, not following it: a link is `ELOOP`.
    pub(crate) fn stat(&self, name: &CStr) -> io::Result<Stat> {
        not_a_link(statat(self.dir.fd()?, name, AtFlags::SYMLINK_NOFOLLOW)?)
    }

    /// Opens the entry `name` as a folder to list; fails if it is a link
    /// now (even if it was a folder when the entries were read).
    pub(crate) fn subfolder(&self, name: &CStr) -> io::Result<Self> {
        let fd = openat(
            self.dir.fd()?,
            name,
            LISTABLE | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        Ok(Self { dir: Dir::new(fd)? })
    }
}

/// `stat` unless it describes a link, which is `ELOOP` like everywhere here.
fn not_a_link(stat: Stat) -> io::Result<Stat> {
    if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
        Err(Errno::LOOP.into())
    } else {
        Ok(stat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    const BOTH: [Strategy; 2] = [Strategy::Openat2, Strategy::Walk];

    /// `root/a/b/f` plus links: `root/link-a -> a` (a folder inside),
    /// `root/a/link-f -> b/f` (a file inside), `root/out -> <outside>`.
    fn tree() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f"), "f").unwrap();
        fs::create_dir(tmp.path().join("outside")).unwrap();
        fs::write(tmp.path().join("outside/f"), "outside").unwrap();
        symlink("a", root.join("link-a")).unwrap();
        symlink("b/f", root.join("a/link-f")).unwrap();
        symlink(tmp.path().join("outside"), root.join("out")).unwrap();
        tmp
    }

    fn parts(name: &str) -> Vec<&OsStr> {
        name.split('/').map(OsStr::new).collect()
    }

    fn read(beneath: &Beneath, name: &str) -> io::Result<String> {
        let parts = parts(name);
        let located = beneath.locate(&parts)?;
        located.stat()?;
        let mut text = String::new();
        located.open_read()?.read_to_string(&mut text)?;
        Ok(text)
    }

    /// This kernel has `openat2` (5.6+), so the probe picks it: otherwise
    /// the tests below would exercise the walk twice.
    #[test]
    fn probe_picks_openat2_on_this_kernel() {
        let tmp = tree();
        let beneath = Beneath::open(&tmp.path().join("root")).unwrap();
        assert_eq!(beneath.strategy(), Strategy::Openat2);
    }

    /// Both strategies read a plain path and refuse a link as the first,
    /// a middle or the last component with `ELOOP`, whether it leads
    /// inside or out; a file used as a folder is `ENOTDIR`.
    #[test]
    fn links_are_refused_at_every_component() {
        let tmp = tree();
        for strategy in BOTH {
            let beneath = Beneath::with_strategy(&tmp.path().join("root"), strategy).unwrap();
            assert_eq!(read(&beneath, "a/b/f").unwrap(), "f", "{strategy:?}");
            for name in ["link-a/b/f", "a/link-f", "out/f", "out", "link-a"] {
                let err = read(&beneath, name).unwrap_err();
                assert_eq!(
                    err.raw_os_error(),
                    Some(Errno::LOOP.raw_os_error()),
                    "{strategy:?} {name}"
                );
            }
            let err = read(&beneath, "a/b/f/g").unwrap_err();
            assert_eq!(
                err.raw_os_error(),
                Some(Errno::NOTDIR.raw_os_error()),
                "{strategy:?}"
            );
            let err = read(&beneath, "a/nope/f").unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::NotFound, "{strategy:?}");
        }
    }

    /// Listing sees links as entries but neither stats through them nor
    /// enters them.
    #[test]
    fn folders_do_not_follow_links() {
        let tmp = tree();
        let beneath = Beneath::open(&tmp.path().join("root")).unwrap();
        let mut root = beneath.root_folder().unwrap();
        let mut names: Vec<_> = root
            .entries()
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        names.sort();
        assert_eq!(names, [c"a", c"link-a", c"out"]);
        assert!(root.stat(c"a").is_ok());
        for link in [c"link-a", c"out"] {
            let err = root.stat(link).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(Errno::LOOP.raw_os_error()));
            assert!(root.subfolder(link).is_err());
        }
        let mut a = root.subfolder(c"a").unwrap();
        assert_eq!(a.entries().unwrap().len(), 2);
    }
}

//! The session folder: where module sockets and logs live. Laid out the way
//! Ray lays out its own, so that ray-dashd and `ray start` can share it.

mod log_dir;
pub mod rotating;

pub use log_dir::{LogDir, LogFileError};
pub use rotating::{RotatingFile, Rotation};

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::StartupError;

/// The most bytes a Unix socket path may have (`sun_path` less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The name Ray gives the link to its newest session.
const LATEST_LINK: &str = "session_latest";

/// A prepared session folder.
#[derive(Debug, Clone)]
pub struct Session {
    /// The session folder as given (it may be the `session_latest` link).
    pub dir: PathBuf,
    /// `<dir>/sockets`, mode 0700: the modules' sockets.
    pub sockets: PathBuf,
    /// Device and inode of `sockets` when it was prepared: in Ray's 0777
    /// session folder another user can rename it and put a folder of their
    /// own in its place (see [`Session::check_sockets`]).
    sockets_id: (u64, u64),
    /// `<dir>/logs`: the host's and the modules' logs.
    pub logs: PathBuf,
    /// `logs`, held open: log files are opened through it, never through
    /// a link (see [`LogDir`]).
    pub log_dir: LogDir,
    /// How the log files the host writes there rotate.
    pub log_rotation: Rotation,
}

impl Session {
    /// Makes sure the folder, `sockets/` (0700) and `logs/` exist, and
    /// opens `logs/`; a link in the place of either is refused. A missing
    /// `.../session_latest` is made the way Ray makes it: a real
    /// `session_<time>_<pid>` folder beside it and a link to that, so that a
    /// later `ray start` can move the link. Nothing already there is removed.
    pub fn prepare(dir: &Path) -> Result<Session, StartupError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StartupError::Session { path, source }
        };
        if !dir.exists() {
            create_session_dir(dir).map_err(err(dir))?;
        }
        let sockets = dir.join("sockets");
        private_dir(&sockets).map_err(err(&sockets))?;
        let meta = fs::symlink_metadata(&sockets).map_err(err(&sockets))?;
        let logs = dir.join("logs");
        let log_dir = LogDir::open(dir).map_err(err(&logs))?;
        Ok(Session {
            dir: dir.to_path_buf(),
            sockets,
            sockets_id: (meta.dev(), meta.ino()),
            logs,
            log_dir,
            log_rotation: Rotation::default(),
        })
    }

    /// The session with its log files rotating as `rotation` says.
    pub fn with_log_rotation(self, rotation: Rotation) -> Session {
        Session {
            log_rotation: rotation,
            ..self
        }
    }

    /// Opens log file `name` (see [`LogDir::append`]), rotating as the
    /// session's log files do.
    pub fn log_file(&self, name: &str) -> Result<RotatingFile, LogFileError> {
        RotatingFile::open(&self.log_dir, name, self.log_rotation)
    }

    /// Checks that `sockets/` is still the folder prepared at start-up: the
    /// same folder (not one renamed into its place), not a link, owned by
    /// this user. A module is started only then, so that it never binds in
    /// a folder another user controls. Its mode is not checked: Ray itself
    /// opens it to 0777 again once its processes run; a listener another
    /// user puts in it is refused by the peer check on every connection
    /// (`connection::PeerCheck`).
    pub fn check_sockets(&self) -> io::Result<()> {
        let meta = fs::symlink_metadata(&self.sockets)?;
        let me = nix::unistd::geteuid().as_raw();
        let problem = if meta.file_type().is_symlink() {
            Some("is now a symbolic link".to_owned())
        } else if (meta.dev(), meta.ino()) != self.sockets_id {
            Some("is no longer the folder prepared at start-up (it was replaced)".to_owned())
        } else if meta.uid() != me {
            Some(format!(
                "is owned by uid {}, not by this user (uid {me})",
                meta.uid()
            ))
        } else {
            None
        };
        match problem {
            Some(problem) => Err(io::Error::other(format!(
                "{} {problem}; refusing to start modules there (restart ray-dashd)",
                self.sockets.display()
            ))),
            None => Ok(()),
        }
    }

    /// The socket a module listens on: `<session>/sockets/dash_<name>`.
    pub fn socket_path(&self, module: &str) -> PathBuf {
        self.sockets
            .join(ray_dashd_contract::names::socket_name(module))
    }

    /// Fails when `path` is too long to bind.
    pub fn check_socket_path(path: &Path) -> Result<(), StartupError> {
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(StartupError::SocketPathTooLong {
                path: path.to_path_buf(),
                len,
                limit: MAX_SOCKET_PATH,
            });
        }
        Ok(())
    }
}

fn create_session_dir(dir: &Path) -> io::Result<()> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if dir.file_name().and_then(|n| n.to_str()) != Some(LATEST_LINK) {
        return fs::create_dir_all(dir);
    }
    let parent = parent.unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    // Ray names sessions session_<date>_<time>_<micros>_<pid>.
    let stamp = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let stamp = stamp
        .trim_end_matches('Z')
        .replace('T', "_")
        .replace([':', '.'], "-");
    let name = format!("session_{stamp}_{}", std::process::id());
    fs::create_dir(parent.join(&name))?;
    match std::os::unix::fs::symlink(&name, dir) {
        // Someone else made it meanwhile: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Makes `path` a folder only this user can enter (0700), or checks that
/// the one there is: a real folder, not a link another user could point
/// elsewhere, owned by this user; a wider mode is narrowed. What it holds
/// is kept.
pub(crate) fn private_dir(path: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Err(io::Error::other(
            "is a symbolic link; it must be a folder of its own",
        ));
    }
    if !meta.is_dir() {
        return Err(io::Error::other("exists and is not a folder"));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(io::Error::other(format!(
            "is owned by uid {}, not by this user (uid {me})",
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_latest_as_link_to_real_session() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let latest = tmp.path().join("ray").join(LATEST_LINK);
        let session = Session::prepare(&latest).expect("prepare");
        let meta = fs::symlink_metadata(&latest).expect("link");
        assert!(meta.file_type().is_symlink());
        let target = fs::read_link(&latest).expect("target");
        assert!(
            target.to_string_lossy().starts_with("session_"),
            "{target:?}"
        );
        let mode = fs::metadata(&session.sockets)
            .expect("sockets")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(session.logs.is_dir());
    }

    #[test]
    fn keeps_existing_content_and_tightens_sockets() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("session_x");
        fs::create_dir_all(dir.join("sockets")).expect("mkdir");
        fs::set_permissions(dir.join("sockets"), fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::write(dir.join("sockets").join("raylet"), b"keep").expect("write");
        let session = Session::prepare(&dir).expect("prepare");
        assert_eq!(
            fs::read(session.sockets.join("raylet")).expect("kept"),
            b"keep"
        );
        let mode = fs::metadata(&session.sockets)
            .expect("sockets")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_replaced_sockets_folder_is_noticed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let session = Session::prepare(tmp.path()).expect("prepare");
        session.check_sockets().expect("the prepared folder");
        fs::rename(&session.sockets, tmp.path().join("moved")).expect("rename");
        fs::create_dir(&session.sockets).expect("mkdir");
        fs::set_permissions(&session.sockets, fs::Permissions::from_mode(0o700)).expect("chmod");
        let err = session.check_sockets().expect_err("replaced");
        assert!(err.to_string().contains("replaced"), "{err}");
        fs::remove_dir(&session.sockets).expect("rmdir");
        fs::rename(tmp.path().join("moved"), &session.sockets).expect("back");
        session.check_sockets().expect("the prepared folder again");
        // Ray opens it to 0777 once its processes run: still ours.
        fs::set_permissions(&session.sockets, fs::Permissions::from_mode(0o777)).expect("chmod");
        session
            .check_sockets()
            .expect("the prepared folder, widened");
    }

    #[test]
    fn a_linked_sockets_folder_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("session_x");
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir_all(&dir).expect("mkdir");
        fs::create_dir_all(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, dir.join("sockets")).expect("link");
        let msg = Session::prepare(&dir)
            .expect_err("a link is refused")
            .to_string();
        assert!(
            msg.contains("sockets") && msg.contains("symbolic link"),
            "{msg}"
        );
    }

    #[test]
    fn a_linked_logs_folder_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("session_x");
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir_all(&dir).expect("mkdir");
        fs::create_dir_all(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, dir.join("logs")).expect("link");
        let msg = Session::prepare(&dir)
            .expect_err("a link is refused")
            .to_string();
        assert!(
            msg.contains("logs") && msg.contains("symbolic link"),
            "{msg}"
        );
    }

    #[test]
    fn long_socket_path_is_refused_with_the_limit() {
        let path = PathBuf::from(format!("/{}", "x".repeat(120)));
        let msg = Session::check_socket_path(&path)
            .expect_err("too long")
            .to_string();
        assert!(msg.contains("107") && msg.contains("xxxx"), "{msg}");
    }
}

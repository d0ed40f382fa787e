//! The Python environment the `ray-dashd` wheel was installed into, found at
//! run time: `pip install ray-dashd` beside `ray[default]` puts the binary
//! in that environment's `bin/`, and its interpreter is the Python that has
//! Ray, the default of `[ray] python` then.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The distribution name as pip records it: `<name>-<version>.dist-info`.
const DIST_INFO_PREFIX: &str = "ray_dashd-";

/// The interpreter of the Python environment the wheel installed the
/// running binary into: `python3` (else `python`) beside the executable,
/// when that environment's `site-packages` holds the wheel's record
/// (`ray_dashd-*.dist-info`). None for a binary that was not installed by
/// the wheel (a build in `target/`, `cargo install`, a copy), or installed
/// where no interpreter is beside it (`pip install --user`).
pub fn wheel_python() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    python_beside(&exe)
}

/// [`wheel_python`] for the executable `exe` (a resolved path, as
/// `current_exe` gives it: a venv's `bin/ray-dashd` is a file, not a link).
fn python_beside(exe: &Path) -> Option<PathBuf> {
    let bin = exe.parent()?;
    let prefix = bin.parent()?;
    if !installed_by_wheel(prefix) {
        return None;
    }
    // Not resolved: a venv's `python3` is a link to the base interpreter,
    // and only through the link does it know it runs in the venv.
    ["python3", "python"]
        .iter()
        .map(|name| bin.join(name))
        .find(|python| python.is_file())
}

/// Whether the environment at `prefix` holds the wheel's record: pip puts
/// it in `<prefix>/lib/python3.X/site-packages` (`dist-packages` for
/// Debian's system Python).
fn installed_by_wheel(prefix: &Path) -> bool {
    let Ok(lib) = std::fs::read_dir(prefix.join("lib")) else {
        return false;
    };
    lib.filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python"))
        .flat_map(|entry| {
            ["site-packages", "dist-packages"].map(|packages| entry.path().join(packages))
        })
        .filter_map(|packages| std::fs::read_dir(packages).ok())
        .flatten()
        .filter_map(Result::ok)
        .any(|entry| is_dist_info(&entry.file_name()))
}

fn is_dist_info(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with(DIST_INFO_PREFIX) && name.ends_with(".dist-info")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A venv-like tree: `bin/` with `files`, and the wheel's record when
    /// `recorded`.
    fn env(files: &[&str], recorded: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("bin")).expect("bin");
        for file in files {
            std::fs::write(dir.path().join("bin").join(file), "").expect("file");
        }
        let packages = dir.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(packages.join("ray-2.60.0.dist-info")).expect("ray");
        if recorded {
            std::fs::create_dir_all(packages.join("ray_dashd-0.1.0.dist-info")).expect("record");
        }
        dir
    }

    #[test]
    fn finds_the_python_of_the_environment_the_wheel_installed_into() {
        let dir = env(&["ray-dashd", "python", "python3"], true);
        assert_eq!(
            python_beside(&dir.path().join("bin/ray-dashd")),
            Some(dir.path().join("bin/python3"))
        );
        let dir = env(&["ray-dashd", "python"], true);
        assert_eq!(
            python_beside(&dir.path().join("bin/ray-dashd")),
            Some(dir.path().join("bin/python"))
        );
    }

    #[test]
    fn a_binary_the_wheel_did_not_install_has_none() {
        // A Python beside it, but no record of the wheel: `cargo install
        // --root /usr/local`, say.
        let dir = env(&["ray-dashd", "python3"], false);
        assert_eq!(python_beside(&dir.path().join("bin/ray-dashd")), None);
        // The record, but no interpreter beside it (`pip install --user`).
        let dir = env(&["ray-dashd"], true);
        assert_eq!(python_beside(&dir.path().join("bin/ray-dashd")), None);
        assert_eq!(python_beside(Path::new("/ray-dashd")), None);
    }

    #[test]
    fn a_debian_system_python_is_found_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("bin")).expect("bin");
        std::fs::write(dir.path().join("bin/python3"), "").expect("python");
        std::fs::create_dir_all(
            dir.path()
                .join("lib/python3.11/dist-packages/ray_dashd-0.1.0.dist-info"),
        )
        .expect("record");
        assert_eq!(
            python_beside(&dir.path().join("bin/ray-dashd")),
            Some(dir.path().join("bin/python3"))
        );
    }
}

//! Where the tests find the workspace's binaries: shared by the
//! integration tests (through `support`) and `in_process.rs`.

use std::path::PathBuf;

/// The directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ray-dashd"));
    exe.parent().expect("binary has a folder").to_path_buf()
}

/// The test module's binary; `cargo build --workspace` builds it.
pub fn test_module_bin() -> PathBuf {
    let path = bin_dir().join("ray-dashd-test-module");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests (scripts/test does)",
        path.display()
    );
    path
}

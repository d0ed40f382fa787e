//! glibc's malloc in the host: large buffers go back to the system when
//! they are freed.
//!
//! The host holds Ray's big answers (megabytes each, made again every
//! refresh) and frees the previous ones. glibc raises its threshold for
//! mapping a block to the size of the last mapped block freed (up to 32
//! MiB), so from the second answer on they come from the heap, whose free
//! pages stay with the process: on the 2,000-node synthetic cluster the
//! host's PSS grew from 11 to 53 MiB under load. A fixed threshold keeps
//! every block of [`MAP_FROM`] or more mapped, and unmapped when freed;
//! it costs a `mmap` and a `munmap` per such block, a few a second.

/// Blocks this large or larger are mapped on their own.
pub const MAP_FROM: usize = 256 << 10;

/// Sets the threshold, unless the operator chose glibc's malloc settings
/// (`MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES` naming `glibc.malloc`).
/// Whether it was set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // mallopt has no safe wrapper
pub fn map_large_blocks() -> bool {
    let chosen = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc"));
    if chosen {
        return false;
    }
    let threshold = libc::c_int::try_from(MAP_FROM).expect("UNWRAP: 256 KiB fits an int");
    // SAFETY: mallopt takes two integers and changes allocator settings
    // only; called before any thread but this one allocates much.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) == 1 }
}

/// Another C library: nothing to set.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn map_large_blocks() -> bool {
    false
}

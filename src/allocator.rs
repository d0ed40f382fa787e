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
//!
//! Smaller blocks freed in the middle of the heap stay resident too: after
//! 10,000 clients each made a request and went idle (their connections
//! parked, hyper's buffers freed), the host kept the 13 KiB per connection
//! that the requests had touched. A thread of its own hands the heap's
//! free pages back every [`TRIM_EVERY`] (`malloc_trim`), off the runtime.

/// Blocks this large or larger are mapped on their own.
pub const MAP_FROM: usize = 256 << 10;

/// How often the heap's free pages go back to the system.
pub const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the operator chose glibc's malloc settings, which are then left
/// alone.
fn operator_chose() -> bool {
    std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc"))
}

/// Sets the threshold, unless the operator chose glibc's malloc settings
/// (`MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES` naming `glibc.malloc`).
/// Whether it was set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // mallopt has no safe wrapper
pub fn map_large_blocks() -> bool {
    if operator_chose() {
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

/// Starts the thread that hands the heap's free pages back every
/// [`TRIM_EVERY`], unless the operator chose glibc's malloc settings.
/// Whether it started.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim_periodically() -> bool {
    if operator_chose() {
        return false;
    }
    std::thread::Builder::new()
        .name("malloc-trim".into())
        .stack_size(64 << 10)
        .spawn(|| loop {
            std::thread::sleep(TRIM_EVERY);
            trim();
        })
        .is_ok()
}

/// Another C library: nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim_periodically() -> bool {
    false
}

/// Hands the heap's free pages back; logs what it took when it took long.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // malloc_trim has no safe wrapper
fn trim() {
    let started = std::time::Instant::now();
    // SAFETY: malloc_trim takes the allocator's own locks and only gives
    // free pages back; no pointer of ours changes.
    let released = unsafe { libc::malloc_trim(0) } == 1;
    let took = started.elapsed();
    if took > std::time::Duration::from_millis(5) {
        tracing::debug!(
            took_us = took.as_micros() as u64,
            released,
            "handed the heap's free pages back"
        );
    }
}

//! CPU scheduling of the host's own threads: the thread that answers
//! requests asks the kernel for short time slices, everything it starts
//! (the blocking pool, the launcher thread, modules) goes back to the
//! default.
//!
//! Linux's fair scheduler (EEVDF, 6.6 and later) picks among the runnable
//! threads the one whose virtual deadline is earliest, and a thread's
//! deadline is its slice away. From 6.12 a thread may ask for a slice of
//! its own (`sched_setattr`, `sched_runtime` with `SCHED_OTHER`, 0.1–100
//! ms, no privilege needed): a short one does not raise its share of CPU,
//! it gets the CPU sooner after it wakes, in shorter turns. That is what an
//! event loop answering probes on a busy head needs, and what a module
//! building a large answer does not. On an older kernel the call succeeds
//! and the slice is ignored.
//!
//! Threads inherit the attribute from the thread that makes them, and
//! processes from the thread that forks them: [`default_slice`] undoes it
//! in each.

use std::io;
use std::time::Duration;

/// The slice the serving thread asks for. Linux's default is 0.75 ms × (1 +
/// log2 of the CPU count); requests take tens of microseconds here.
pub const SERVING_SLICE: Duration = Duration::from_micros(300);

/// `struct sched_attr` of `sched_setattr(2)`, its first version (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Sets the calling thread's fair-scheduler slice: `slice` (clamped by the
/// kernel to 0.1–100 ms) or, with `None`, the default. Keeps its policy
/// (`SCHED_OTHER`, which it must have) and its nice value. Async-signal
/// safe: one `getpriority` and one `sched_setattr`, nothing allocated.
#[allow(unsafe_code)] // a system call no safe crate wraps
pub fn set_slice(slice: Option<Duration>) -> io::Result<()> {
    // The calling thread's own nice value (Linux keeps it per thread).
    let nice = rustix::process::getpriority_process(None)?;
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: slice.map_or(0, |s| u64::try_from(s.as_nanos()).unwrap_or(u64::MAX)),
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `attr` is a valid `struct sched_attr` of the size it names,
    // alive for the call; pid 0 is the calling thread; flags are 0.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the calling thread the default slice again (see the module docs);
/// a failure leaves it as it was, which costs only latency elsewhere.
pub fn default_slice() {
    let _ = set_slice(None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice asked for is the one the kernel reports (`sched_getattr`),
    /// and the default comes back; the nice value is kept throughout.
    #[test]
    fn a_thread_sets_and_resets_its_slice() {
        std::thread::spawn(|| {
            let nice = rustix::process::getpriority_process(None).expect("nice");
            set_slice(Some(SERVING_SLICE)).expect("sched_setattr");
            let (runtime, after) = current();
            // Kernels before 6.12 take the call and report no slice.
            if runtime != 0 {
                assert_eq!(runtime, SERVING_SLICE.as_nanos() as u64);
            }
            assert_eq!(after, nice);
            set_slice(None).expect("sched_setattr");
            let (runtime, after) = current();
            assert_ne!(runtime, SERVING_SLICE.as_nanos() as u64);
            assert_eq!(after, nice);
        })
        .join()
        .expect("thread");
    }

    /// The calling thread's (sched_runtime, sched_nice).
    #[allow(unsafe_code)]
    fn current() -> (u64, i32) {
        let mut attr = SchedAttr::default();
        // SAFETY: `attr` is writable and as large as the size passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut SchedAttr,
                std::mem::size_of::<SchedAttr>() as u32,
                0u32,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        (attr.sched_runtime, attr.sched_nice)
    }
}

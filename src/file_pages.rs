//! The code and read-only data the host mapped while it started: let go
//! once it serves.
//!
//! Starting runs code that serving never runs again (the command line and
//! the config, Ray's detection, the modules' first spawn, the dynamic
//! loader's relocation table), and the kernel maps the file pages around
//! each page run (64 KiB at a time). They stay in the host's resident set
//! for good: 6.6 MiB of file pages at start, of which serving small
//! requests, websockets and streams maps again under 3. Once the modules
//! have started (and again after a module started later, since spawning
//! maps its code again), [`release`] drops the host's mappings of every
//! page of its executable and shared libraries (`MADV_DONTNEED`); what
//! serving runs next is mapped again from the page cache (a minor fault a
//! page, a few hundred once), and what it never runs stays out of the
//! host's resident set, free for the kernel to reclaim.
//!
//! Only mappings that hold nothing but the file's bytes are dropped:
//! private, not writable, with no page of their own (`Anonymous: 0 kB`;
//! the relocated read-only data the loader wrote has some and is kept),
//! of the executable or a shared object, which stay mapped for the
//! process's life. Dropping such a page loses nothing: the next access
//! reads the same bytes again.
//!
//! The built-in modules (the whole binary too) call [`release`] once their
//! socket is bound (`crate::builtin`), and the cgroup warden once started.

use std::io;

/// A mapping [`release`] may drop.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    /// Its resident size when read, in KiB.
    rss_kib: u64,
}

/// What [`release`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Mappings dropped.
    pub mappings: usize,
    /// Their resident size before, in KiB.
    pub kib: u64,
}

/// Whether a mapping of `path` belongs to the executable (`exe`) or a
/// shared object: files mapped for the process's life.
fn lifelong(path: &str, exe: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path == exe || name.ends_with(".so") || name.contains(".so.")
}

/// The mappings of `smaps` (the text of `/proc/<pid>/smaps`) that hold
/// only the bytes of a lifelong file (see [`lifelong`]) and have pages
/// resident.
fn releasable(smaps: &str, exe: &str) -> Vec<Mapping> {
    let mut found = Vec::new();
    // The mapping being read, when its header qualifies; its resident
    // size filled in once read.
    let mut current: Option<Mapping> = None;
    for line in smaps.lines() {
        if let Some((field, value)) = line.split_once(':') {
            if !field.contains(' ') && !field.contains('-') {
                let kib = value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok();
                match (field, kib) {
                    ("Rss", Some(kib)) => {
                        if let Some(mapping) = current.as_mut() {
                            mapping.rss_kib = kib;
                        }
                    }
                    // The last field the decision needs: decide now.
                    ("Anonymous", anonymous) => {
                        if let Some(mapping) = current.take() {
                            if anonymous == Some(0) && mapping.rss_kib > 0 {
                                found.push(mapping);
                            }
                        }
                    }
                    _ => {}
                }
                continue;
            }
        }
        current = qualifying(line, exe);
    }
    found
}

/// The mapping a header (`start-end perms offset dev inode [path]`) opens,
/// when it may qualify: private, not writable, of a lifelong file.
fn qualifying(header: &str, exe: &str) -> Option<Mapping> {
    let mut words = header.split_whitespace();
    let (range, perms) = (words.next()?, words.next()?.as_bytes());
    let path = words.nth(3).unwrap_or("");
    let (start, end) = range.split_once('-')?;
    let qualifies = perms.len() == 4
        && perms[1] == b'-'
        && perms[3] == b'p'
        && path.starts_with('/')
        && lifelong(path, exe);
    qualifies.then_some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        rss_kib: 0,
    })
}

/// Drops the host's mappings of the pages of its executable and shared
/// objects that hold only the files' bytes (see the module's docs). Reads
/// `/proc/self/smaps` and makes one `madvise` a mapping: run it off the
/// runtime.
#[cfg(target_os = "linux")]
pub fn release() -> io::Result<Released> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut released = Released::default();
    for mapping in releasable(&smaps, &exe.to_string_lossy()) {
        if drop_pages(&mapping).is_ok() {
            released.mappings += 1;
            released.kib += mapping.rss_kib;
        }
    }
    Ok(released)
}

/// Another system: nothing dropped.
#[cfg(not(target_os = "linux"))]
pub fn release() -> io::Result<Released> {
    Ok(Released::default())
}

/// `madvise(MADV_DONTNEED)` over `mapping`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // madvise over a range the process itself mapped
fn drop_pages(mapping: &Mapping) -> io::Result<()> {
    // SAFETY: the range is a whole mapping of the executable or a shared
    // object, which stay mapped for the process's life, so it is still
    // that mapping now. It is private, not writable and has no page of its
    // own (no anonymous page: nothing written to it, by the loader or
    // anyone), so every page dropped is read again, unchanged, from the
    // file at its next access; no Rust reference sees a different value.
    let rc = unsafe {
        libc::madvise(
            mapping.start as *mut libc::c_void,
            mapping.end - mapping.start,
            libc::MADV_DONTNEED,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXE: &str = "/opt/ray-dashd/bin/ray-dashd";

    fn mapping(header: &str, rss: u64, anonymous: u64) -> String {
        format!(
            "{header}\nSize:                100 kB\nKernelPageSize:        4 kB\nRss:            {rss:>8} kB\n\
             Pss:                  10 kB\nShared_Clean:          0 kB\nPrivate_Clean:         0 kB\n\
             Referenced:            0 kB\nAnonymous:      {anonymous:>8} kB\nLazyFree:              0 kB\n\
             VmFlags: rd mr mw me sd\n"
        )
    }

    #[test]
    fn only_the_files_own_bytes_of_the_executable_and_shared_objects_are_dropped() {
        let smaps = [
            // The executable's code and read-only data: dropped.
            mapping(&format!("55d0a0000000-55d0a0400000 r-xp 00000000 fd:01 42 {EXE}"), 3468, 0),
            mapping(&format!("55d0a0400000-55d0a0500000 r--p 00400000 fd:01 42 {EXE}"), 1212, 0),
            // Its relocated read-only data (the loader wrote it): kept.
            mapping(&format!("55d0a0500000-55d0a0560000 r--p 00500000 fd:01 42 {EXE}"), 332, 332),
            // Its writable data: kept.
            mapping(&format!("55d0a0560000-55d0a0570000 rw-p 00560000 fd:01 42 {EXE}"), 40, 12),
            // A shared library's code: dropped; nothing resident: skipped.
            mapping("7f0000000000-7f0000100000 r-xp 00028000 fd:01 7 /usr/lib/x86_64-linux-gnu/libc.so.6", 1128, 0),
            mapping("7f0000200000-7f0000210000 r-xp 00000000 fd:01 9 /usr/lib/libgcc_s.so.1", 0, 0),
            mapping("7f0000300000-7f0000301000 r--p 00000000 fd:01 8 /usr/lib/x86_64-linux-gnu/libm.so", 4, 0),
            // Another file mapped read-only (it may be unmapped any time):
            // kept; so are shared mappings, the heap and the kernel's.
            mapping("7f0000400000-7f0000500000 r--p 00000000 fd:01 5 /var/data/table.bin", 512, 0),
            mapping("7f0000600000-7f0000700000 r--s 00000000 fd:01 6 /usr/lib/shared.so", 64, 0),
            mapping("55d0a1000000-55d0a1400000 rw-p 00000000 00:00 0                          [heap]", 4028, 4028),
            mapping("7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]", 8, 0),
            mapping("7f0000800000-7f0000900000 r--p 00000000 00:00 0 ", 16, 0),
        ]
        .concat();
        let found = releasable(&smaps, EXE);
        let starts: Vec<usize> = found.iter().map(|m| m.start).collect();
        assert_eq!(
            starts,
            [
                0x55d0a0000000,
                0x55d0a0400000,
                0x7f0000000000,
                0x7f0000300000
            ],
            "{found:?}"
        );
        assert_eq!(found[0].end, 0x55d0a0400000);
        assert_eq!(
            found.iter().map(|m| m.rss_kib).sum::<u64>(),
            3468 + 1212 + 1128 + 4
        );
    }

    #[test]
    fn a_mapping_without_its_anonymous_line_is_kept() {
        // Truncated or from a kernel that words it otherwise: no decision,
        // nothing dropped.
        let smaps =
            format!("55d0a0000000-55d0a0400000 r-xp 00000000 fd:01 42 {EXE}\nRss:  3468 kB\n");
        assert!(releasable(&smaps, EXE).is_empty());
        assert!(releasable("garbage\n\n-\n", EXE).is_empty());
    }

    #[test]
    fn shared_objects_are_known_by_their_names() {
        for path in [
            "/lib/libc.so.6",
            "/usr/lib/libm.so",
            "/x/libssl.so.3.0.1",
            EXE,
        ] {
            assert!(lifelong(path, EXE), "{path}");
        }
        for path in [
            "/var/data/table.bin",
            "/usr/lib/locale/locale-archive",
            "/x/so",
            "/x/a.sox",
        ] {
            assert!(!lifelong(path, EXE), "{path}");
        }
    }

    #[test]
    fn the_process_still_runs_what_it_dropped() {
        let file_kib = || {
            ray_dashd_contract::proc::status_kib(std::process::id(), "RssFile").expect("RssFile")
        };
        let before = file_kib();
        let released = release().expect("release");
        assert!(released.mappings > 0, "{released:?}");
        assert!(file_kib() < before, "{released:?}");
        // Code and data of the executable and libc, read again.
        let text = format!("{:?}", std::hint::black_box(vec![1u8, 2, 3]));
        assert_eq!(text, "[1, 2, 3]");
        assert_eq!(std::hint::black_box(2.0f64).sqrt().powi(2).round(), 2.0);
    }
}

//! Reading a file backwards in blocks from the end: where its last N lines
//! start and where its last complete line ends, touching only the blocks
//! that hold them, so memory stays bounded by what is returned.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bytes read per step when scanning backwards: large enough that a typical
/// 1000-line tail takes a few reads, small enough to be cheap when it takes one.
pub(crate) const BLOCK_SIZE: usize = 64 * 1024;

/// What a backward scan for newlines found.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// Offset just past the n-th newline counted back from the end.
    Found(u64),
    /// Fewer newlines than asked in the window; the offset just past the
    /// earliest one seen, if any.
    Exhausted(Option<u64>),
}

/// Offset where the last `lines` lines of `file[..end]` start, looking back
/// at most `max_bytes`.
///
/// A last line without a trailing newline counts as a line, as with
/// `tail -n`. If the lines do not fit in `max_bytes`, the start is the first
/// line boundary inside the window (or the window's start when one line
/// alone is longer).
pub(crate) fn tail_start(file: &File, end: u64, lines: usize, max_bytes: u64) -> io::Result<u64> {
    if lines == 0 || end == 0 {
        return Ok(end);
    }
    let floor = end.saturating_sub(max_bytes);
    // The newline that ends the last line does not separate it from another.
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, end - 1)?;
    let scan_end = if last[0] == b'\n' { end - 1 } else { end };
    Ok(match scan_newlines_back(file, scan_end, floor, lines)? {
        Scan::Found(start) => start,
        Scan::Exhausted(_) if floor == 0 => 0,
        Scan::Exhausted(Some(earliest)) => earliest,
        Scan::Exhausted(None) => floor,
    })
}

/// Offset just past the last newline of `file[..end]`, looking back at most
/// `max_line` bytes: where the complete lines end and a partial last line
/// starts.
///
/// With no newline at all in a file shorter than `max_line`, that is 0 (all
/// of it is one partial line); with a partial line longer than `max_line`,
/// it is `end` (it is not held back).
pub(crate) fn last_line_end(file: &File, end: u64, max_line: u64) -> io::Result<u64> {
    let floor = end.saturating_sub(max_line);
    Ok(match scan_newlines_back(file, end, floor, 1)? {
        Scan::Found(after) => after,
        Scan::Exhausted(_) if floor == 0 => 0,
        Scan::Exhausted(_) => end,
    })
}

/// Reads `file[start..end]`, or less if the file is shorter by now.
pub(crate) fn read_range(file: &File, start: u64, end: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(end.saturating_sub(start))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "range too large"))?;
    let mut buf = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut buf[filled..], start + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Scans `file[floor..end]` backwards, block by block, for `count`
/// newlines.
fn scan_newlines_back(file: &File, end: u64, floor: u64, count: usize) -> io::Result<Scan> {
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut pos = end;
    let mut seen = 0;
    let mut earliest = None;
    while pos > floor {
        let len = usize::try_from((pos - floor).min(BLOCK_SIZE as u64))
            .expect("bounded by BLOCK_SIZE, a usize");
        let start = pos - len as u64;
        let block = &mut block[..len];
        file.read_exact_at(block, start)?;
        let mut rest = &block[..];
        while let Some(i) = rest.iter().rposition(|&b| b == b'\n') {
            seen += 1;
            let after = start + i as u64 + 1;
            if seen == count {
                return Ok(Scan::Found(after));
            }
            earliest = Some(after);
            rest = &rest[..i];
        }
        pos = start;
    }
    Ok(Scan::Exhausted(earliest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A temp file holding `content`.
    fn file_with(content: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(content).unwrap();
        let file = tmp.reopen().unwrap();
        (tmp, file)
    }

    fn tail(content: &[u8], lines: usize, max_bytes: u64) -> String {
        let (_tmp, file) = file_with(content);
        let end = content.len() as u64;
        let start = tail_start(&file, end, lines, max_bytes).unwrap();
        String::from_utf8(read_range(&file, start, end).unwrap()).unwrap()
    }

    /// Counting works with and without a trailing newline, and for more
    /// lines than the file has.
    #[test]
    fn tail_counts_lines_like_tail_n() {
        assert_eq!(tail(b"a\nb\nc\n", 2, u64::MAX), "b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 2, u64::MAX), "b\nc");
        assert_eq!(tail(b"a\nb\nc\n", 9, u64::MAX), "a\nb\nc\n");
        assert_eq!(tail(b"a\nb\nc\n", 0, u64::MAX), "");
        assert_eq!(tail(b"", 5, u64::MAX), "");
        assert_eq!(tail(b"\n\n\n", 2, u64::MAX), "\n\n");
    }

    /// Lines that straddle block boundaries across several blocks come out
    /// whole.
    #[test]
    fn tail_spans_blocks() {
        let line = format!("{}\n", "x".repeat(BLOCK_SIZE / 3));
        let mut content = String::new();
        for i in 0..10 {
            content.push_str(&format!("{i}{line}"));
        }
        let got = tail(content.as_bytes(), 4, u64::MAX);
        let want: String = (6..10).map(|i| format!("{i}{line}")).collect();
        assert_eq!(got, want);
    }

    /// When the lines do not fit in the byte budget, the tail starts at the
    /// first line boundary inside the window, or mid-line for one huge line.
    #[test]
    fn tail_respects_byte_budget() {
        assert_eq!(tail(b"aaaa\nbbbb\ncccc\n", 3, 8), "cccc\n");
        assert_eq!(tail(b"aaaaaaaaaaaaaaaa\n", 1, 8), "aaaaaaa\n");
    }

    /// The last complete line ends after the last newline; a partial line
    /// longer than the limit is not held back.
    #[test]
    fn finds_end_of_last_complete_line() {
        let end = |content: &[u8], max_line| {
            let (_tmp, file) = file_with(content);
            last_line_end(&file, content.len() as u64, max_line).unwrap()
        };
        assert_eq!(end(b"a\nb\n", 100), 4);
        assert_eq!(end(b"a\nbc", 100), 2);
        assert_eq!(end(b"abc", 100), 0);
        assert_eq!(end(b"a\nbcdefgh", 3), 9);
    }
}

use super::*;

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::UnixListener;

use crate::config::ConnectionLimits;
use crate::proxy::COALESCE_BYTES;

/// A client that never leaves.
impl ClientConn for Vec<u8> {
    fn gone(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        std::future::pending()
    }
}

/// The client's head and the framing `parse_answer` makes of `answer`.
fn parsed(answer: &str) -> (String, Framing, bool, usize) {
    match parse_answer(answer.as_bytes()) {
        Ok(Parsed::Final(read)) => (
            String::from_utf8(read.head).expect("utf-8"),
            read.framing,
            read.keep_alive,
            read.start,
        ),
        Ok(Parsed::Partial) => panic!("partial: {answer:?}"),
        Ok(Parsed::Informational(_)) => panic!("informational: {answer:?}"),
        Err(_) => panic!("refused: {answer:?}"),
    }
}

/// Why `parse_answer` refuses `answer`.
fn refused(answer: &str) -> String {
    match parse_answer(answer.as_bytes()) {
        Err(Failed::Answer(failure)) => failure.to_string(),
        _ => panic!("not refused: {answer:?}"),
    }
}

fn lines(head: &str) -> Vec<&str> {
    head.split("\r\n").filter(|l| !l.is_empty()).collect()
}

#[test]
fn the_clients_head_keeps_end_to_end_headers_in_order_and_adds_date_and_length() {
    let answer = "HTTP/1.1 200 Fine\r\nX-A: 1\r\nSet-Cookie: a=1\r\nContent-Length: 2\r\n\
                  Set-Cookie: b=2\r\n\r\nok";
    let (head, framing, keep_alive, start) = parsed(answer);
    assert_eq!(framing, Framing::Length(2));
    assert!(keep_alive);
    assert_eq!(start, answer.len() - 2);
    let lines = lines(&head);
    assert_eq!(
        lines[..4],
        [
            "HTTP/1.1 200 OK",
            "X-A: 1",
            "Set-Cookie: a=1",
            "Set-Cookie: b=2"
        ]
    );
    assert!(lines[4].starts_with("date: "), "{head}");
    assert_eq!(lines[5], "content-length: 2");
    assert_eq!(lines.len(), 6, "{head}");
}

#[test]
fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
    let (head, _, keep_alive, _) = parsed(
        "HTTP/1.1 200 OK\r\nConnection: X-Secret, close\r\nKeep-Alive: timeout=5\r\n\
         X-Secret: 1\r\nx-secret: 2\r\nUpgrade: h2c\r\nProxy-Connection: x\r\nTrailer: y\r\n\
         Date: Thu, 01 Jan 1970 00:00:00 GMT\r\nX-Kept: 3\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(!keep_alive);
    assert_eq!(
        lines(&head),
        [
            "HTTP/1.1 200 OK",
            "Date: Thu, 01 Jan 1970 00:00:00 GMT",
            "X-Kept: 3",
            "content-length: 0"
        ]
    );
}

#[test]
fn the_body_is_framed_as_the_module_framed_it() {
    let (head, framing, keep_alive, _) =
        parsed("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
    assert_eq!(framing, Framing::Chunked);
    assert!(keep_alive);
    assert!(head.ends_with("transfer-encoding: chunked\r\n"), "{head}");
    let (head, framing, keep_alive, _) = parsed("HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\n");
    assert_eq!(framing, Framing::UntilClose);
    assert!(!keep_alive, "a body read to the close leaves no connection");
    assert!(head.ends_with("transfer-encoding: chunked\r\n"), "{head}");
    let (_, framing, _, _) = parsed("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
    assert_eq!(framing, Framing::UntilClose);
    let (head, framing, _, _) = parsed("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n");
    assert_eq!(framing, Framing::Empty);
    assert!(
        !head.contains("content-length") && !head.contains("transfer-encoding"),
        "{head}"
    );
    let (_, _, keep_alive, _) = parsed("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
    assert!(!keep_alive, "HTTP/1.0 closes after the answer");
}

#[test]
fn ambiguous_or_malformed_heads_are_refused() {
    assert!(
        refused("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
            .contains("both Transfer-Encoding and Content-Length")
    );
    assert!(
        refused("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
            .contains("differing")
    );
    assert!(refused("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n").contains("not a number"));
    assert!(refused("HTTP/1.1 101 Switching Protocols\r\n\r\n").contains("switched"));
    assert!(refused("HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n").contains("malformed"));
    assert!(refused("HTTP/1.1 099 Low\r\n\r\n").contains("status 99 is not valid"));
    match parse_answer(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200") {
        Ok(Parsed::Informational(len)) => assert_eq!(len, 40),
        _ => panic!("not skipped as informational"),
    }
    assert!(matches!(
        parse_answer(b"HTTP/1.1 200 OK\r\nX-A:"),
        Ok(Parsed::Partial)
    ));
}

/// A pool on a socket whose one connection answers every request head with
/// `answer`, written in `pieces` of at most this many bytes, then keeps the
/// connection open unless `close`.
async fn module(
    dir: &std::path::Path,
    answer: &'static [u8],
    pieces: usize,
    close: bool,
) -> ModulePool {
    let path = dir.join("sock");
    let listener = UnixListener::bind(&path).expect("bind");
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.expect("read") == 0 {
                return;
            }
            head.push(byte[0]);
        }
        for piece in answer.chunks(pieces) {
            stream.write_all(piece).await.expect("write");
            stream.flush().await.expect("flush");
            // Pieces apart, so that reads see them apart; pacing, not
            // waiting for a condition.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if close {
            drop(stream);
        } else {
            std::future::pending::<()>().await;
        }
    });
    ModulePool::new(
        path,
        ConnectionLimits {
            max_connections: 4,
            max_queued: 4,
            max_long_lived: 1,
        },
    )
}

/// A bare exchange with the module `module` sets up in `dir`, its head
/// read; `None` when no head came.
async fn answered(
    dir: &std::path::Path,
    answer: &'static [u8],
    pieces: usize,
    close: bool,
) -> (Option<BareAnswer>, ModulePool) {
    let pool = module(dir, answer, pieces, close).await;
    let mut conn = pool
        .lease_bare(Hold::Exchange)
        .await
        .expect("lease")
        .expect("a slot");
    let Ok(read) = send_and_read_head(&mut conn, b"GET / HTTP/1.1\r\nhost: m\r\n\r\n").await else {
        return (None, pool);
    };
    let answer = BareAnswer {
        conn,
        pool: pool.clone(),
        read,
        cancel: CancellationToken::new(),
        module: Arc::from("m"),
        bytes_out: Counter::default(),
        _open: None,
    };
    (Some(answer), pool)
}

/// Runs a bare exchange with the module `module` sets up; returns what
/// reached the client (or the relay's error) and whether the connection
/// went back to the pool.
async fn relayed(answer: &'static [u8], pieces: usize, close: bool) -> (io::Result<String>, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (Some(answer), pool) = answered(dir.path(), answer, pieces, close).await else {
        return (Err(io::Error::other("no head")), false);
    };
    let mut client = Vec::new();
    let mut write = Vec::new();
    let result = answer.relay(&mut client, &mut write, false).await;
    let kept = pool.stats().idle == 1;
    (
        result.map(|()| String::from_utf8_lossy(&client).into_owned()),
        kept,
    )
}

/// The body after the head of `written`.
fn body(written: &str) -> &str {
    &written[written.find("\r\n\r\n").expect("a head") + 4..]
}

#[tokio::test]
async fn a_counted_body_in_pieces_is_passed_on_and_the_connection_kept() {
    let (written, kept) = relayed(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
        7,
        false,
    )
    .await;
    let written = written.expect("relayed");
    assert!(written.starts_with("HTTP/1.1 200 OK\r\n"), "{written}");
    assert!(!written.contains("100 Continue"), "{written}");
    assert_eq!(body(&written), "hello world");
    assert!(kept);
}

/// The data of a chunked body and how many chunks carried it; panics
/// on anything but plain size lines (no extensions), whole chunks and the
/// last chunk with no trailers.
fn dechunk(body: &[u8]) -> (Vec<u8>, usize) {
    let mut data = Vec::new();
    let mut chunks = 0;
    let mut rest = body;
    loop {
        let line = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let size = std::str::from_utf8(&rest[..line]).expect("ascii");
        let size = usize::from_str_radix(size, 16).expect("a plain hex size");
        rest = &rest[line + 2..];
        if size == 0 {
            assert_eq!(rest, b"\r\n", "no trailers, nothing after");
            return (data, chunks);
        }
        data.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n", "a chunk's line end");
        rest = &rest[size + 2..];
        chunks += 1;
    }
}

#[tokio::test]
async fn a_chunked_body_is_chunked_again_without_extensions_or_trailers() {
    let (written, kept) = relayed(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        5,
        false,
    )
    .await;
    let written = written.expect("relayed");
    let (data, _) = dechunk(body(&written).as_bytes());
    assert_eq!(data, b"hello world");
    assert!(!written.contains("ext"), "{written}");
    assert!(!written.contains("X-Trailer"), "{written}");
    assert!(kept);
}

/// A client that records each write it takes: at most `most` bytes of
/// it, and of a vectored write the first slice only unless `vectored`.
struct Recorder {
    writes: Vec<Vec<u8>>,
    most: usize,
    vectored: bool,
}

impl Recorder {
    /// Takes at most 7 bytes a write, of the first slice only.
    fn trickle() -> Recorder {
        Recorder {
            writes: Vec::new(),
            most: 7,
            vectored: false,
        }
    }

    /// Takes every write whole, a vectored one as one.
    fn whole() -> Recorder {
        Recorder {
            writes: Vec::new(),
            most: usize::MAX,
            vectored: true,
        }
    }

    /// All it took, in order.
    fn taken(&self) -> Vec<u8> {
        self.writes.concat()
    }
}

impl tokio::io::AsyncWrite for Recorder {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let n = buf.len().min(self.most);
        self.writes.push(buf[..n].to_vec());
        std::task::Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        if !self.vectored {
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
            return self.poll_write(cx, first);
        }
        let write: Vec<u8> = bufs
            .iter()
            .flat_map(|b| b.iter().copied())
            .take(self.most)
            .collect();
        let n = write.len();
        self.writes.push(write);
        std::task::Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.vectored
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl ClientConn for Recorder {
    fn gone(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        std::future::pending()
    }
}

/// The many small chunks one read brings leave as one chunk, and each
/// write to the client holds whole chunks: never a line's end alone.
#[tokio::test]
async fn the_chunks_a_read_brings_leave_as_one_in_one_write() {
    const CHUNKS: usize = 40;
    let piece: Vec<u8> = (0..1500).map(|i| b'a' + (i % 26) as u8).collect();
    let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..CHUNKS {
        answer.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        answer.extend_from_slice(&piece);
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"0\r\n\r\n");
    let answer: &'static [u8] = answer.leak();
    let dir = tempfile::tempdir().expect("tempdir");
    // Written by the module in one piece, read by the relay in a few.
    let (answer, _pool) = answered(dir.path(), answer, answer.len(), false).await;
    let answer = answer.expect("a head");
    let mut client = Recorder::whole();
    let mut write = Vec::new();
    answer
        .relay(&mut client, &mut write, false)
        .await
        .expect("relayed");
    let all = client.taken();
    let head_end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let (data, chunks) = dechunk(&all[head_end..]);
    assert_eq!(data, piece.repeat(CHUNKS));
    assert!(chunks < CHUNKS / 4, "{chunks} chunks out of {CHUNKS}");
    // Every write past the head starts a chunk and ends one.
    let mut at = 0;
    for write in &client.writes {
        let from = head_end.saturating_sub(at).min(write.len());
        at += write.len();
        let body = &write[from..];
        if body.is_empty() {
            continue;
        }
        let ends_body = body.ends_with(b"0\r\n\r\n");
        let whole = if ends_body {
            body.to_vec()
        } else {
            [body, b"0\r\n\r\n"].concat()
        };
        dechunk(&whole);
    }
}

#[tokio::test]
async fn an_answer_the_module_says_closes_is_not_kept() {
    let (written, kept) = relayed(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        64,
        false,
    )
    .await;
    assert_eq!(body(&written.expect("relayed")), "ok");
    assert!(!kept);
}

#[tokio::test]
async fn bytes_beyond_the_body_leave_the_connection_unused() {
    let (written, kept) = relayed(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
        64,
        false,
    )
    .await;
    assert_eq!(body(&written.expect("relayed")), "ok");
    assert!(!kept);
}

#[tokio::test]
async fn a_body_cut_short_or_badly_chunked_fails_the_relay() {
    let (written, kept) = relayed(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        64,
        true,
    )
    .await;
    let error = written.expect_err("a body cut short");
    assert!(
        error.to_string().contains("closed the connection"),
        "{error}"
    );
    assert!(!kept);
    let (written, kept) = relayed(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        64,
        false,
    )
    .await;
    let error = written.expect_err("a malformed chunk");
    assert!(error.to_string().contains("malformed"), "{error}");
    assert!(!kept);
}

#[tokio::test]
async fn a_body_read_to_the_close_is_chunked() {
    let (written, kept) =
        relayed(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nuntil the close", 6, true).await;
    let written = written.expect("relayed");
    let (data, _) = dechunk(body(&written).as_bytes());
    assert_eq!(data, b"until the close");
    assert!(!kept);
}

/// A large piece goes out behind what was pending, whole and in order,
/// however little each write takes.
#[tokio::test]
async fn a_large_piece_is_written_whole_behind_what_waited() {
    let data: Vec<u8> = (0..COALESCE_BYTES * 2).map(|i| (i % 251) as u8).collect();
    let mut client = Recorder::trickle();
    let mut write = b"pending head ".to_vec();
    put(&mut client, &mut write, &data).await.expect("put");
    assert!(write.is_empty());
    let taken = client.taken();
    assert_eq!(&taken[..13], b"pending head ");
    assert_eq!(&taken[13..], &data[..]);
}

/// More pieces than one chunk gathers leave as several whole chunks, in
/// order, however little each write takes.
#[tokio::test]
async fn pieces_past_one_chunks_share_leave_as_several_whole_chunks() {
    use crate::proxy::client_socket::{put_chunk_of, MAX_CHUNK_PIECES};
    let owned: Vec<Vec<u8>> = (0..MAX_CHUNK_PIECES * 2 + 3)
        .map(|i| vec![(i % 251) as u8; 700 + i])
        .collect();
    let pieces: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    let mut client = Recorder::trickle();
    let mut write = b"head\r\n\r\n".to_vec();
    put_chunk_of(&mut client, &mut write, &pieces)
        .await
        .expect("put");
    // What fit under the coalescing size waits; the rest went out.
    let mut taken = client.taken();
    taken.extend_from_slice(&write);
    taken.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(&taken[..8], b"head\r\n\r\n");
    let (data, chunks) = dechunk(&taken[8..]);
    assert_eq!(data, owned.concat());
    assert_eq!(chunks, 3);
}

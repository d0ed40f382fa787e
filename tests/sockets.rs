//! A sockets folder swapped by another local user. Ray's session folder is
//! 0777, so anyone can rename `sockets/` and listen on `sockets/dash_<name>`
//! in a folder of their own: requests, with their `Authorization` headers,
//! must never reach that listener, and no module may be started there.
//! And a socket some other process of this user listens on (Ray's own
//! dashboard names its modules' sockets the same way) is named in the log
//! before its module takes the path over.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{client, dashd, eventually, test_module};

#[tokio::test]
async fn a_swapped_sockets_folder_gets_no_request_and_no_module() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let sockets = d.session().join("sockets");
    std::fs::rename(&sockets, d.session().join("sockets.moved")).expect("rename");
    std::fs::create_dir(&sockets).expect("the other user's folder");
    let listener = tokio::net::UnixListener::bind(sockets.join("dash_tm")).expect("bind");
    let accepted = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn({
        let (accepted, received) = (accepted.clone(), received.clone());
        async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let received = received.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        received.fetch_add(n, Ordering::SeqCst);
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nattacker")
                            .await;
                    }
                });
            }
        }
    });

    operator_requests_miss_the_listener(&d).await;
    assert!(
        accepted.load(Ordering::SeqCst) > 0,
        "the listener was never tried"
    );
    assert_eq!(
        received.load(Ordering::SeqCst),
        0,
        "bytes reached the other listener"
    );
    d.logged("not by the module").await;

    // A new incarnation is not started in the other user's folder.
    let restarted = client()
        .post(d.url("/api/modules/tm/restart"))
        .send()
        .await
        .expect("restart");
    assert_eq!(restarted.status(), 202);
    let refused = eventually(Duration::from_secs(10), || async {
        let module = d.module("tm").await;
        module["last_error"]
            .as_str()
            .filter(|e| e.contains("replaced"))
            .map(str::to_owned)
    })
    .await;
    assert!(refused.is_some(), "{}\n{}", d.module("tm").await, d.log());
    assert_eq!(received.load(Ordering::SeqCst), 0);
    server.abort();
}

/// Sends more requests at once than the pool has idle connections, with
/// the operator's `Authorization`: new connections are opened, and their
/// path now leads to another listener. Asserts that no answer came from
/// it and that some request needed a new connection (and got 502).
pub(crate) async fn operator_requests_miss_the_listener(d: &crate::support::Dashd) {
    let requests = (0..12).map(|_| {
        let url = d.url("/test/slow?ms=300");
        async move {
            let response = client()
                .get(url)
                .header("authorization", "Bearer secret-of-the-operator")
                .send()
                .await
                .expect("an answer");
            (
                response.status().as_u16(),
                response.text().await.unwrap_or_default(),
            )
        }
    });
    let answers = futures_util::future::join_all(requests).await;
    assert!(
        answers.iter().all(|(_, body)| !body.contains("attacker")),
        "{answers:?}"
    );
    assert!(
        answers.iter().any(|(status, _)| *status == 502),
        "no request needed a new connection: {answers:?}"
    );
}

#[tokio::test]
async fn a_socket_another_process_listens_on_is_named_then_taken_over() {
    let session = tempfile::tempdir().expect("tempdir");
    let sockets = session.path().join("sockets");
    std::fs::create_dir(&sockets).expect("sockets");
    std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o700)).expect("0700");
    // Listening as Ray's own dashboard's module would, in this process.
    let listener = tokio::net::UnixListener::bind(sockets.join("dash_tm")).expect("bind");
    let d = dashd()
        .session_dir(session.path())
        .module(test_module("tm"))
        .start();
    let warned = d
        .logged("another process listens on the module's socket")
        .await;
    let line = warned
        .lines()
        .find(|l| l.contains("another process listens"))
        .expect("the line");
    assert!(
        line.contains(&format!("listener_pid={}", std::process::id())),
        "{line}"
    );
    assert!(line.contains("dash_tm"), "{line}");
    // The module took the path over and serves; the old listener gets
    // nothing after the probe.
    d.healthy("tm", 0).await;
    let answer = client().get(d.url("/test/echo")).send().await.expect("GET");
    assert_eq!(answer.status(), 200);
    let (mut probe, _) = listener.accept().await.expect("the probe");
    let mut byte = [0u8; 1];
    assert_eq!(
        probe.read(&mut byte).await.expect("read"),
        0,
        "the probe sent bytes"
    );
    let more = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(
        more.is_err(),
        "a second connection reached the old listener"
    );
}

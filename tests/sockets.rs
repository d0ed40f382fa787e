//! A sockets folder swapped by another local user. Ray's session folder is
//! 0777, so anyone can rename `sockets/` and listen on `sockets/dash_<name>`
//! in a folder of their own: requests, with their `Authorization` headers,
//! must never reach that listener, and no module may be started there.

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

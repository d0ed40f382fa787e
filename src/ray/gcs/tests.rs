//! The checker against a scripted GCS, on tokio's paused clock.

use super::*;

/// How the scripted GCS answers `CheckAlive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Alive,
    /// Connection refused.
    Down,
    /// Never answers.
    Hung,
    /// Answers UNAUTHENTICATED.
    Refused,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    cluster: Vec<u8>,
    puts: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone)]
struct Scripted(Arc<Mutex<State>>);

impl Scripted {
    fn new(cluster: &[u8]) -> Scripted {
        Scripted(Arc::new(Mutex::new(State {
            mode: Mode::Alive,
            cluster: cluster.to_vec(),
            puts: vec![],
        })))
    }

    fn set(&self, mode: Mode) {
        self.0.lock().expect("lock").mode = mode;
    }

    fn set_cluster(&self, cluster: &[u8]) {
        self.0.lock().expect("lock").cluster = cluster.to_vec();
    }

    fn puts(&self) -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
        self.0.lock().expect("lock").puts.clone()
    }

    fn answer<T: Send + 'static>(
        &self,
        ok: impl FnOnce(&mut State) -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, GcsError>> + Send {
        let state = Arc::clone(&self.0);
        async move {
            let mode = state.lock().expect("lock").mode;
            match mode {
                Mode::Alive => Ok(ok(&mut state.lock().expect("lock"))),
                Mode::Down => Err(GcsError {
                    message: "Unavailable: tcp connect error: Connection refused".into(),
                    refused: false,
                }),
                Mode::Hung => std::future::pending().await,
                Mode::Refused => Err(GcsError {
                    message: "Unauthenticated: Invalid or missing authentication token".into(),
                    refused: true,
                }),
            }
        }
    }
}

impl Gcs for Scripted {
    fn check_alive(&mut self) -> impl Future<Output = Result<(), GcsError>> + Send {
        self.answer(|_| ())
    }

    fn cluster_id(&mut self) -> impl Future<Output = Result<Vec<u8>, GcsError>> + Send {
        self.answer(|s| s.cluster.clone())
    }

    fn put(
        &mut self,
        namespace: &'static [u8],
        key: &'static [u8],
        value: Vec<u8>,
    ) -> impl Future<Output = Result<(), GcsError>> + Send {
        self.answer(move |s| s.puts.push((namespace.to_vec(), key.to_vec(), value)))
    }
}

fn watch(gcs: &Scripted, gone_after: Duration) -> (GcsStatus, tokio::task::JoinHandle<Gone>) {
    let status = GcsStatus::default();
    let watcher = Watcher::new(
        gcs.clone(),
        "10.0.0.1:6379".into(),
        "10.0.0.1:8265".into(),
        gone_after,
        status.clone(),
    );
    (status, tokio::spawn(watcher.run()))
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn not_alive(status: &GcsStatus) -> String {
    match status.liveness() {
        Liveness::NotAlive(reason) => reason,
        Liveness::Alive => panic!("reported alive"),
    }
}

/// A GCS that answers is cached as alive, its cluster id is learnt, and the
/// dashboard's address is written to both keys Ray's tools read.
#[tokio::test(start_paused = true)]
async fn answering_gcs_is_alive_with_its_cluster_id_and_our_address() {
    let gcs = Scripted::new(&[0xab, 0x01]);
    let (status, task) = watch(&gcs, secs(10.0));
    assert!(not_alive(&status).contains("not been checked"));
    tokio::time::sleep(secs(1.5)).await;
    assert_eq!(status.liveness(), Liveness::Alive);
    assert_eq!(status.cluster_id().as_deref(), Some("ab01"));
    let value = b"10.0.0.1:8265".to_vec();
    assert_eq!(
        gcs.puts(),
        vec![
            (b"dashboard".to_vec(), b"dashboard".to_vec(), value.clone()),
            (b"dashboard".to_vec(), b"webui:url".to_vec(), value),
        ]
    );
    assert!(!task.is_finished());
    task.abort();
}

/// An unreachable GCS is reported at the next check, with the cause and the
/// age of the last success; once it has been unreachable for `gone_after`
/// the head counts as gone, not before.
#[tokio::test(start_paused = true)]
async fn unreachable_gcs_fails_the_check_then_the_head_is_gone() {
    let gcs = Scripted::new(b"c1");
    let (status, task) = watch(&gcs, secs(5.0));
    tokio::time::sleep(secs(1.5)).await;
    gcs.set(Mode::Down);
    tokio::time::sleep(secs(1.0)).await;
    let reason = not_alive(&status);
    assert!(
        reason.contains("Connection refused") && reason.contains("last success 1.5 s ago"),
        "{reason}"
    );
    // The last success was at t=1 s; at t=5.5 s the GCS has been gone 4.5 s.
    tokio::time::sleep(secs(3.0)).await;
    assert!(!task.is_finished());
    let gone = tokio::time::timeout(secs(1.0), task)
        .await
        .expect("gone by t=6 s")
        .expect("task");
    assert!(
        gone.reason.contains("has not answered for 5 s"),
        "{}",
        gone.reason
    );
}

/// A GCS that never answered counts from start-up.
#[tokio::test(start_paused = true)]
async fn gcs_never_reached_is_gone_after_the_limit_from_start() {
    let gcs = Scripted::new(b"c1");
    gcs.set(Mode::Down);
    let (status, task) = watch(&gcs, secs(3.0));
    tokio::time::sleep(secs(0.5)).await;
    assert!(not_alive(&status).contains("no success yet"));
    let gone = tokio::time::timeout(secs(3.0), task)
        .await
        .expect("gone by t=3.5 s")
        .expect("task");
    assert!(gone.reason.contains("10.0.0.1:6379"), "{}", gone.reason);
    assert_eq!(status.cluster_id(), None);
}

/// A GCS that hangs fails each check after the check's own timeout.
#[tokio::test(start_paused = true)]
async fn hung_gcs_fails_the_check_after_its_timeout() {
    let gcs = Scripted::new(b"c1");
    let (status, task) = watch(&gcs, secs(60.0));
    tokio::time::sleep(secs(0.5)).await;
    gcs.set(Mode::Hung);
    tokio::time::sleep(secs(1.0)).await;
    // The check started at t=1 s is still waiting: the cached answer stands.
    assert_eq!(status.liveness(), Liveness::Alive);
    tokio::time::sleep(secs(1.0)).await;
    assert!(not_alive(&status).contains("no answer within 1000 ms"));
    task.abort();
}

/// Another cluster answering at the GCS's address (the head was stopped and
/// a new one started on the same port) means the head is gone at once.
#[tokio::test(start_paused = true)]
async fn another_cluster_at_the_address_is_gone_at_once() {
    let gcs = Scripted::new(b"old");
    let (_status, task) = watch(&gcs, secs(60.0));
    tokio::time::sleep(secs(1.5)).await;
    gcs.set(Mode::Down);
    tokio::time::sleep(secs(1.0)).await;
    gcs.set_cluster(b"new");
    gcs.set(Mode::Alive);
    let gone = tokio::time::timeout(secs(1.0), task)
        .await
        .expect("gone at the next check")
        .expect("task");
    assert!(
        gone.reason.contains("6e6577") && gone.reason.contains("6f6c64"),
        "{}",
        gone.reason
    );
}

/// A GCS that refuses our token is alive: reported, never "gone".
#[tokio::test(start_paused = true)]
async fn refusing_gcs_is_reported_but_not_gone() {
    let gcs = Scripted::new(b"c1");
    gcs.set(Mode::Refused);
    let (status, task) = watch(&gcs, secs(3.0));
    tokio::time::sleep(secs(20.0)).await;
    assert!(!task.is_finished());
    assert!(not_alive(&status).contains("Unauthenticated"));
    task.abort();
}

/// After an outage the address is written again at once (the GCS may have
/// restarted without it), the same cluster being back.
#[tokio::test(start_paused = true)]
async fn address_is_written_again_after_an_outage() {
    let gcs = Scripted::new(b"c1");
    let (status, task) = watch(&gcs, secs(60.0));
    tokio::time::sleep(secs(1.5)).await;
    assert_eq!(gcs.puts().len(), 2);
    gcs.set(Mode::Down);
    tokio::time::sleep(secs(2.0)).await;
    gcs.set(Mode::Alive);
    tokio::time::sleep(secs(1.0)).await;
    assert_eq!(status.liveness(), Liveness::Alive);
    assert_eq!(gcs.puts().len(), 4);
    task.abort();
}

/// A result older than [`STALE_AFTER`] is not vouched for.
#[tokio::test(start_paused = true)]
async fn stale_result_is_not_alive() {
    let status = GcsStatus::default();
    let now = Instant::now();
    status.update(|h| {
        h.last = Some((now, Ok(())));
        h.last_alive = Some(now);
    });
    assert_eq!(status.liveness(), Liveness::Alive);
    tokio::time::advance(STALE_AFTER + secs(0.5)).await;
    let reason = not_alive(&status);
    assert!(reason.contains("3.5 s old"), "{reason}");
}

#[test]
fn advertised_address_is_the_bound_one_or_the_heads_node_ip() {
    let cases = [
        ("127.0.0.1:8265", "10.1.2.3:6379", "127.0.0.1:8265"),
        ("10.9.9.9:8265", "10.1.2.3:6379", "10.9.9.9:8265"),
        ("0.0.0.0:8265", "10.1.2.3:6379", "10.1.2.3:8265"),
        ("0.0.0.0:8265", "[fd00::1]:6379", "127.0.0.1:8265"),
        ("0.0.0.0:8265", "head.example:6379", "head.example:8265"),
        ("0.0.0.0:8265", "0.0.0.0:6379", "127.0.0.1:8265"),
        ("[::]:8265", "10.1.2.3:6379", "10.1.2.3:8265"),
        ("[::]:8265", "[fd00::1]:6379", "[fd00::1]:8265"),
        ("[::1]:8265", "10.1.2.3:6379", "[::1]:8265"),
    ];
    for (bound, gcs, want) in cases {
        let bound: SocketAddr = bound.parse().expect("addr");
        assert_eq!(advertised_address(bound, gcs), want, "{bound} {gcs}");
    }
}

/// Ray's tools take a bare `host:port` for plain HTTP: the scheme is
/// written only for HTTPS; the URL prefix follows the port.
#[test]
fn advertised_url_names_https_only_when_served() {
    let bound: SocketAddr = "127.0.0.1:8265".parse().expect("addr");
    let gcs = "10.1.2.3:6379";
    assert_eq!(advertised_url(bound, gcs, false, ""), "127.0.0.1:8265");
    assert_eq!(
        advertised_url(bound, gcs, true, ""),
        "https://127.0.0.1:8265"
    );
    assert_eq!(
        advertised_url(bound, gcs, false, "/ray"),
        "127.0.0.1:8265/ray"
    );
    assert_eq!(
        advertised_url(bound, gcs, true, "/a/b"),
        "https://127.0.0.1:8265/a/b"
    );
}

#[tokio::test]
async fn real_client_reports_an_unreachable_gcs_with_its_cause() {
    // A port nothing listens on: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut client = GcsClient::new(&format!("127.0.0.1:{port}"), None, None).expect("client");
    let err = bounded(secs(5.0), client.check_alive())
        .await
        .expect_err("nothing listens");
    assert!(!err.refused);
    assert!(err.to_string().to_lowercase().contains("refused"), "{err}");
}

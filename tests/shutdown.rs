//! Shutdown: SIGTERM drains and exits 0 with modules and sockets gone;
//! SIGKILL of the host takes its modules with it.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{client, dashd, eventually, process_gone, test_module, WAIT};

/// SIGTERM: in-flight requests finish, modules stop, sockets go, exit 0.
#[tokio::test]
async fn sigterm_drains_exits_0_and_removes_sockets() {
    let mut d = dashd()
        .module(test_module("a"))
        .module(test_module("b").routes(&[]))
        .start();
    let a = d.healthy("a", 0).await["pid"].as_u64().expect("pid") as u32;
    let b = d.healthy("b", 0).await["pid"].as_u64().expect("pid") as u32;
    assert!(d.socket_path("a").exists() && d.socket_path("b").exists());
    let in_flight = tokio::spawn({
        let url = d.url("/test/slow?ms=1500");
        async move {
            let response = client().get(url).send().await.expect("request");
            (response.status(), response.text().await.expect("body"))
        }
    });
    d.wait_in_flight(1).await;
    d.signal(Signal::SIGTERM);
    let (status, body) = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("answered")
        .expect("task");
    assert_eq!((status.as_u16(), body.as_str()), (200, "slow done"));
    let exit = d.wait_exit(WAIT);
    assert_eq!(exit.code(), Some(0), "log:\n{}", d.log());
    assert!(!d.socket_path("a").exists() && !d.socket_path("b").exists());
    assert!(process_gone(a) && process_gone(b));
}

/// A module that ignores SIGTERM is SIGKILLed after its grace; the host
/// still exits 0.
#[tokio::test]
async fn sigterm_kills_module_that_ignores_it() {
    let mut d = dashd()
        .module(
            test_module("stubborn")
                .env("TEST_MODULE_IGNORE_SIGTERM", "1")
                .supervision("stop_grace_secs", "0.3"),
        )
        .start();
    let pid = d.healthy("stubborn", 0).await["pid"].as_u64().expect("pid") as u32;
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(WAIT).code(), Some(0));
    assert!(process_gone(pid));
    assert!(d.log().contains("ignored SIGTERM"), "{}", d.log());
}

/// kill -9 of the host leaves no module alive.
#[tokio::test]
async fn sigkill_of_host_leaves_no_module() {
    let mut d = dashd()
        .module(test_module("a"))
        .module(test_module("b").routes(&[]))
        .start();
    let pids = [
        d.healthy("a", 0).await["pid"].as_u64().expect("pid") as u32,
        d.healthy("b", 0).await["pid"].as_u64().expect("pid") as u32,
    ];
    d.signal(Signal::SIGKILL);
    d.wait_exit(WAIT);
    let gone = eventually(WAIT, || async {
        pids.iter().all(|p| process_gone(*p)).then_some(())
    })
    .await;
    assert!(gone.is_some(), "modules outlived the host: {pids:?}");
}

/// After SIGTERM the port stops accepting at once, while the host is
/// still alive draining a request in flight: a client is refused (and can
/// go to another instance) rather than accepted and then cut.
#[tokio::test]
async fn stops_accepting_while_it_drains() {
    let mut d = dashd().module(test_module("a")).start();
    d.healthy("a", 0).await;
    let addr = d.addr();
    let in_flight = tokio::spawn({
        let url = d.url("/test/slow?ms=3000");
        async move {
            let response = client().get(url).send().await.expect("request");
            (response.status(), response.text().await.expect("body"))
        }
    });
    d.wait_in_flight(1).await;
    d.signal(Signal::SIGTERM);
    let refused = eventually(WAIT, || async {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .is_err()
            .then_some(())
    })
    .await;
    assert!(refused.is_some(), "still accepting after SIGTERM");
    // Refused by a host that is still there, finishing its request.
    assert!(
        !in_flight.is_finished(),
        "the request ended before the check"
    );
    assert!(!process_gone(d.pid()), "the host exited before the check");
    let (status, body) = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("answered")
        .expect("task");
    assert_eq!((status.as_u16(), body.as_str()), (200, "slow done"));
    assert_eq!(d.wait_exit(WAIT).code(), Some(0), "log:\n{}", d.log());
}

/// SIGINT shuts down the same way as SIGTERM.
#[tokio::test]
async fn sigint_exits_0_and_stops_modules() {
    let mut d = dashd().module(test_module("a")).start();
    let pid = d.healthy("a", 0).await["pid"].as_u64().expect("pid") as u32;
    d.signal(Signal::SIGINT);
    assert_eq!(d.wait_exit(WAIT).code(), Some(0), "log:\n{}", d.log());
    assert!(process_gone(pid));
    assert!(!d.socket_path("a").exists());
}

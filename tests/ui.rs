//! The host's own pages: health, the UI's files, and nothing outside them.

use crate::support::{client, dashd, test_module};

/// `/api/healthz` answers at once, with or without modules.
#[tokio::test]
async fn healthz_answers_without_modules() {
    let d = dashd().start();
    let response = client()
        .get(d.url("/api/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("body"), "success");
}

/// `/` and `/dashd/` serve the page, its files have the right types, and a
/// second fetch can be answered 304.
#[tokio::test]
async fn serves_ui_files_with_types_and_etags() {
    let d = dashd().module(test_module("tm")).start();
    for (path, kind) in [
        ("/", "text/html"),
        ("/dashd/", "text/html"),
        ("/app.js", "javascript"),
        ("/dashd/style.css", "text/css"),
    ] {
        let response = client().get(d.url(path)).send().await.expect("get");
        assert_eq!(response.status(), 200, "{path}");
        let ctype = response.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(ctype.contains(kind), "{path}: {ctype}");
        let etag = response.headers()["etag"].clone();
        let again = client()
            .get(d.url(path))
            .header("if-none-match", etag)
            .send()
            .await
            .expect("get");
        assert_eq!(again.status(), 304, "{path}");
    }
}

/// No path reaches outside the UI folder.
#[tokio::test]
async fn ui_paths_do_not_escape() {
    let d = dashd().start();
    for path in [
        "/../Cargo.toml",
        "/%2e%2e/Cargo.toml",
        "/dashd/..%2f..%2fCargo.toml",
        "/static/../../src/main.rs",
        "/etc/passwd",
    ] {
        let response = client().get(d.url(path)).send().await.expect("get");
        assert_eq!(response.status(), 404, "{path}");
    }
}

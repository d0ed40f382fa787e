//! Shared answers for routes declared cacheable (`cache_secs`): the same
//! `GET` from many clients at once is one request to the module, and an
//! answer is served again, while a fresh one is fetched behind it, for as
//! long as it is younger than the route's `cache_secs`.
//!
//! Made for cluster state that many pages poll every second (Ray's
//! `/nodes?view=summary`, `/logical/actors`): on a big cluster the module
//! takes seconds to build each answer, and without this every open tab
//! made it build the same one again, each waiting behind the others.
//!
//! For a request to such a route, with `max` its `cache_secs`:
//!
//! - an answer younger than its refresh age is served as it is (`hit`):
//!   `max` less 1.25 times what its fetch took, at most `max / 2` and at
//!   least `max / 4`, so that the next answer is in before this one is
//!   `max` old, even when the CPU is scarce for a moment;
//! - one younger than `max` is served too (`stale`), and, unless one is
//!   under way, a new fetch starts in a task of its own;
//! - else the request waits for the fetch under way, or starts one
//!   (`joined`, `fetched`).
//!
//! An answer's age counts from when its last byte came from the module, so
//! no client is served an answer that has been complete for longer than
//! `max`. Only whole `200` answers without `Set-Cookie`, `Vary` (but
//! `Accept-Encoding`) or `Cache-Control: private`/`no-store` are kept, up
//! to [`MAX_ANSWER_BYTES`] each and [`MAX_TOTAL_BYTES`] together; other
//! answers reach those that waited for them and are not kept. Requests
//! that look like a browser's (by Ray's signs) and the others are answered
//! apart: Ray's modules mask runtime-env secrets for browsers. A fetch is
//! sent with the first client's headers, without `Accept-Encoding` (one
//! identity answer serves every client of its kind); a client that
//! accepts gzip gets a text or JSON answer of 1 KiB or more gzipped,
//! compressed once per answer. Every response says how it was served in `x-dashd-shared`, and
//! its age in `Age` (RFC 9111 §5.1).
//! No lock is held across an await.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use ray_dashd_contract::LockExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::headers::{from_browser, tokens};
use super::{send, upstream_request, ProxyError, UpstreamFailure};
use crate::config::ServerSettings;
use crate::connection::Hold;
use crate::supervisor::ModuleHandle;

/// The largest answer kept; a larger one goes to the client that fetched it
/// as it streams, and every other client asks the module itself.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 << 20;
/// The most memory all kept answers take together; past it the oldest go.
pub(crate) const MAX_TOTAL_BYTES: usize = 256 << 20;
/// The most answers kept, whatever their size: one per URL, and a client
/// can make up URLs (queries) without end.
pub(crate) const MAX_ANSWERS: usize = 1024;
/// How many times a request waits for a fetch whose client went away
/// before it fetches for itself.
const MAX_JOINS: usize = 3;
/// The response header that says how an answer was served.
pub(crate) const SHARED_HEADER: HeaderName = HeaderName::from_static("x-dashd-shared");

/// One module's answer, whole, as it is kept and shared.
#[derive(Debug)]
pub(crate) struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// When its last byte came.
    at: Instant,
    /// How long its fetch took, from the request to the last byte.
    took: Duration,
    /// Whether it may go to other clients than the one it was fetched
    /// for (see [`may_share`]).
    shareable: bool,
    /// Whether it may be served again to later requests: a shareable `200`.
    keep: bool,
    /// Its body gzipped, made once, for the first client that accepts it;
    /// `None` when it is not worth it.
    gzipped: tokio::sync::OnceCell<Option<Bytes>>,
}

impl Answer {
    fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.at)
    }

    /// The age from which it is fetched again behind its serving: early
    /// enough that the next answer (which takes about as long as this one
    /// did) is in before this one is `max` old, yet at least `max / 4`.
    /// A fetch that took little may take far longer the next time, when
    /// the head's own processes take both cores for a second or two (as
    /// on a big cluster's head): the next one starts by `max / 2`, with
    /// half of `max` to spare.
    fn refresh_at(&self, max: Duration) -> Duration {
        max.saturating_sub(self.took.mul_f64(1.25))
            .min(max / 2)
            .max(max / 4)
    }

    /// The answer as a response, served `how`; gzipped when `gzip` (the
    /// client accepts it) and it is worth it ([`worth_gzip`]).
    async fn response(self: &Arc<Self>, how: &'static str, gzip: bool) -> Response {
        let gzipped = if gzip && worth_gzip(self.status, &self.headers, self.body.len()) {
            self.gzipped
                .get_or_init(|| {
                    let body = self.body.clone();
                    async move {
                        tokio::task::spawn_blocking(move || gzipped(&body))
                            .await
                            .ok()
                            .flatten()
                    }
                })
                .await
                .clone()
        } else {
            None
        };
        let body = gzipped.clone().unwrap_or_else(|| self.body.clone());
        let length = body.len();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        let headers = response.headers_mut();
        if gzipped.is_some() {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        if worth_gzip(self.status, &self.headers, self.body.len()) {
            // Whether a client gets it gzipped depends on what it accepts.
            headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
        }
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        headers.insert(SHARED_HEADER, HeaderValue::from_static(how));
        headers.insert(
            header::AGE,
            HeaderValue::from(self.age(Instant::now()).as_secs()),
        );
        response
    }
}

/// What a fetch gives those that waited for it.
#[derive(Debug, Clone)]
enum Outcome {
    /// The module's answer, whole, fit for all who asked.
    Answer(Arc<Answer>),
    /// The module could not be asked, or failed.
    Failed(ProxyError),
    /// The answer was for its client alone (`Set-Cookie`, `private`), or
    /// too large to keep: each asks the module itself.
    AskYourself,
}

/// How a request for a cacheable route ends.
pub(crate) enum Shared {
    /// Answered here.
    Answered(Result<Response, ProxyError>),
    /// To be forwarded as any request: the request, rebuilt.
    Forward(Request<Body>),
}

/// What is known of one URL of one module.
#[derive(Debug, Default)]
struct Slot {
    answer: Option<Arc<Answer>>,
    /// The fetch under way, if one is.
    fetch: Option<watch::Receiver<Option<Outcome>>>,
}

impl Slot {
    /// Whether a fetch is under way: its client (or task) is still there
    /// and has not published.
    fn is_fetching(&self) -> bool {
        self.fetch
            .as_ref()
            .is_some_and(|f| f.borrow().is_none() && f.has_changed().is_ok())
    }
}

/// The URL of a module, which names a shared answer, and whether the
/// request looks like a browser's: Ray's modules answer browsers with
/// runtime-env secrets masked, so a browser is never served an answer
/// fetched for another client, nor the other way round.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    module: Arc<str>,
    path_and_query: String,
    browser: bool,
}

/// The shared answers of every cacheable route.
#[derive(Debug, Default)]
pub(crate) struct SharedAnswers {
    slots: Mutex<HashMap<Key, Slot>>,
    /// Counts the writes forwarded: a fetch that started before one is
    /// handed to those waiting for it, but not kept.
    writes: AtomicU64,
}

/// What a request does, decided under the lock.
enum Step {
    Serve(Arc<Answer>, &'static str),
    Join(watch::Receiver<Option<Outcome>>),
    Fetch(watch::Sender<Option<Outcome>>),
}

impl SharedAnswers {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Slot>> {
        self.slots.locked()
    }

    /// Forgets every answer: the routes may have changed (a reload).
    pub(crate) fn clear(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.slots().clear();
    }

    /// A write (any method but `GET`, `HEAD`, `OPTIONS`) went to a module,
    /// or is about to: every kept answer is forgotten, and no fetch under
    /// way is kept, so that a client reads its own writes (a job submitted
    /// is listed by the next `GET /api/jobs/`) through every module.
    pub(crate) fn written(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
        for slot in self.slots().values_mut() {
            slot.answer = None;
            // Requests from now on start a fetch of their own rather than
            // join one begun before the write.
            slot.fetch = None;
        }
    }

    /// Answers a `GET` for a route whose answers may be `max` old.
    pub(crate) async fn get(
        self: &Arc<Self>,
        module: &ModuleHandle,
        fallback: Option<&ModuleHandle>,
        request: Request<Body>,
        max: Duration,
        settings: &ServerSettings,
    ) -> Shared {
        let key = Key {
            module: Arc::clone(module.shared_name()),
            path_and_query: request
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned(),
            browser: from_browser(request.headers()),
        };
        let (parts, _) = request.into_parts();
        let gzip = accepts_gzip(&parts.headers);
        for _ in 0..MAX_JOINS {
            match self.step(&key, max, module, fallback, &parts, settings) {
                Step::Serve(answer, how) => {
                    return Shared::Answered(Ok(answer.response(how, gzip).await))
                }
                Step::Fetch(done) => {
                    return Shared::Answered(
                        self.fetch_for_client(
                            &key,
                            Upstream { module, fallback },
                            &parts,
                            settings,
                            done,
                            gzip,
                        )
                        .await,
                    );
                }
                Step::Join(mut fetch) => {
                    // An error: the client that fetched went away, and its
                    // fetch with it; try again.
                    let outcome = match fetch.wait_for(Option::is_some).await {
                        Ok(outcome) => outcome.clone(),
                        Err(_) => continue,
                    };
                    match outcome.expect("UNWRAP: waited for Some") {
                        Outcome::Answer(answer) => {
                            return Shared::Answered(Ok(answer.response("joined", gzip).await))
                        }
                        Outcome::Failed(e) => return Shared::Answered(Err(e)),
                        Outcome::AskYourself => break,
                    }
                }
            }
        }
        Shared::Forward(Request::from_parts(parts, Body::empty()))
    }

    /// Decides, under the lock, what a request for `key` does; starts a
    /// fetch behind a stale answer.
    fn step(
        self: &Arc<Self>,
        key: &Key,
        max: Duration,
        module: &ModuleHandle,
        fallback: Option<&ModuleHandle>,
        parts: &http::request::Parts,
        settings: &ServerSettings,
    ) -> Step {
        let now = Instant::now();
        let mut slots = self.slots();
        if slots.len() > 2 * MAX_ANSWERS {
            // Fetches whose clients went away, for URLs asked once.
            evict(&mut slots);
        }
        let slot = slots.entry(key.clone()).or_default();
        let fetching = slot.is_fetching();
        if !fetching {
            slot.fetch = None;
        }
        match &slot.answer {
            Some(answer) if answer.age(now) < answer.refresh_at(max) => {
                Step::Serve(Arc::clone(answer), "hit")
            }
            Some(answer) if answer.age(now) < max => {
                let answer = Arc::clone(answer);
                if !fetching {
                    let (done, waiting) = watch::channel(None);
                    slot.fetch = Some(waiting);
                    let shared = Arc::clone(self);
                    let (key, module, parts, settings) =
                        (key.clone(), module.clone(), parts.clone(), settings.clone());
                    let fallback = fallback.cloned();
                    let writes = self.writes.load(Ordering::SeqCst);
                    tokio::spawn(async move {
                        let upstream = Upstream {
                            module: &module,
                            fallback: fallback.as_ref(),
                        };
                        let fetched = fetch(upstream, &parts, &settings).await;
                        let outcome = match fetched {
                            Ok((answer, None)) if answer.shareable => Outcome::Answer(answer),
                            Ok(_) => Outcome::AskYourself,
                            Err(e) => Outcome::Failed(e),
                        };
                        shared.publish(&key, outcome, writes, &done);
                    });
                }
                Step::Serve(answer, "stale")
            }
            _ => match &slot.fetch {
                Some(waiting) if fetching => Step::Join(waiting.clone()),
                _ => {
                    let (done, waiting) = watch::channel(None);
                    slot.fetch = Some(waiting);
                    Step::Fetch(done)
                }
            },
        }
    }

    /// Fetches for the client that asked first: it gets the module's answer
    /// whole, or, when that is too large to keep, as it streams; those that
    /// joined get it too when it was whole.
    async fn fetch_for_client(
        &self,
        key: &Key,
        upstream: Upstream<'_>,
        parts: &http::request::Parts,
        settings: &ServerSettings,
        done: watch::Sender<Option<Outcome>>,
        gzip: bool,
    ) -> Result<Response, ProxyError> {
        let writes = self.writes.load(Ordering::SeqCst);
        match fetch(upstream, parts, settings).await {
            Ok((answer, None)) => {
                // Handed on before this client's own answer is made (and
                // maybe gzipped), which it may not wait for.
                let outcome = if answer.shareable {
                    Outcome::Answer(Arc::clone(&answer))
                } else {
                    Outcome::AskYourself
                };
                self.publish(key, outcome, writes, &done);
                Ok(answer.response("fetched", gzip).await)
            }
            Ok((_, Some(streamed))) => {
                self.publish(key, Outcome::AskYourself, writes, &done);
                Ok(streamed)
            }
            Err(e) => {
                self.publish(key, Outcome::Failed(e.clone()), writes, &done);
                Err(e)
            }
        }
    }

    /// Hands a fetch's outcome to those waiting for it, and keeps the
    /// answer if it may be kept and no write went to a module since the
    /// fetch began (`writes` then); makes room within [`MAX_TOTAL_BYTES`].
    fn publish(
        &self,
        key: &Key,
        outcome: Outcome,
        writes: u64,
        done: &watch::Sender<Option<Outcome>>,
    ) {
        {
            let mut slots = self.slots();
            let unwritten = self.writes.load(Ordering::SeqCst) == writes;
            if let Outcome::Answer(answer) = &outcome {
                if answer.keep && unwritten {
                    slots.entry(key.clone()).or_default().answer = Some(Arc::clone(answer));
                    evict(&mut slots);
                }
            }
            if let Some(slot) = slots.get_mut(key) {
                // The slot may hold a later fetch by now (after a write).
                let mine = done.subscribe();
                if slot.fetch.as_ref().is_some_and(|f| f.same_channel(&mine)) {
                    slot.fetch = None;
                }
                if slot.answer.is_none() && slot.fetch.is_none() {
                    slots.remove(key);
                }
            }
        }
        done.send_replace(Some(outcome));
    }
}

/// Drops the oldest answers until all of them fit in [`MAX_TOTAL_BYTES`]
/// and there are at most [`MAX_ANSWERS`], and the slots that hold nothing.
fn evict(slots: &mut HashMap<Key, Slot>) {
    let mut total: usize = slots
        .values()
        .filter_map(|s| s.answer.as_ref())
        .map(|a| a.body.len())
        .sum();
    let mut kept = slots.values().filter(|s| s.answer.is_some()).count();
    while total > MAX_TOTAL_BYTES || kept > MAX_ANSWERS {
        let oldest = slots
            .iter()
            .filter_map(|(k, s)| s.answer.as_ref().map(|a| (k.clone(), a.at, a.body.len())))
            .min_by_key(|(_, at, _)| *at);
        let Some((key, _, len)) = oldest else { break };
        if let Some(slot) = slots.get_mut(&key) {
            slot.answer = None;
        }
        total -= len;
        kept -= 1;
    }
    slots.retain(|_, slot| slot.answer.is_some() || slot.is_fetching());
}

/// The module a shared route's requests go to, and the route's fallback.
#[derive(Debug, Clone, Copy)]
struct Upstream<'a> {
    module: &'a ModuleHandle,
    fallback: Option<&'a ModuleHandle>,
}

/// What [`fetch_from`] gets from the route's module, or, when that module
/// declines the request, from its fallback.
async fn fetch(
    Upstream { module, fallback }: Upstream<'_>,
    parts: &http::request::Parts,
    settings: &ServerSettings,
) -> Result<(Arc<Answer>, Option<Response>), ProxyError> {
    let fetched = fetch_from(module, parts, settings).await?;
    if let (Some(fallback), (answer, None)) = (fallback, &fetched) {
        if let Some(why) = super::declined(answer.status, &answer.headers) {
            super::falling_back(module, fallback, &why);
            return fetch_from(fallback, parts, settings).await;
        }
    }
    Ok(fetched)
}

/// Asks the module for `parts` (a `GET`, no body) and reads the answer
/// whole. `Ok((answer, None))`: whole; `Ok((_, Some(response)))`: over
/// [`MAX_ANSWER_BYTES`], the response carrying what was read and the rest.
async fn fetch_from(
    module: &ModuleHandle,
    parts: &http::request::Parts,
    settings: &ServerSettings,
) -> Result<(Arc<Answer>, Option<Response>), ProxyError> {
    let gate = module
        .admit_or_start()
        .await
        .map_err(|why| ProxyError::not_ready(module, why))?;
    let mut parts = parts.clone();
    parts.method = Method::GET;
    // One identity answer, whole, for every client: none of the first
    // client's encodings, ranges or conditions.
    for name in [
        header::ACCEPT_ENCODING,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::RANGE,
        header::IF_RANGE,
        header::IF_MATCH,
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_UNMODIFIED_SINCE,
    ] {
        parts.headers.remove(name);
    }
    let upstream = upstream_request(parts, Body::empty());
    let deadline = settings.http_response_timeout;
    let started = Instant::now();
    let response = send(
        module,
        &gate,
        upstream,
        Some(deadline),
        Hold::Exchange,
        settings,
    )
    .await?;
    let (mut head, body) = response.into_parts();
    super::strip_hop_by_hop(&mut head.headers);
    let mut body = super::CancelableBody::new(body, &gate.cancel, module.shared_name())
        .counted(module.metrics().bytes_out().clone(), None);
    // One allocation when the module says how long its answer is, not a
    // series of doublings (each a large block freed).
    let announced = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0);
    let mut collected = BytesMut::with_capacity(announced.min(MAX_ANSWER_BYTES + 1));
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ProxyError::Upstream {
                module: module.name().to_owned(),
                reason: UpstreamFailure::AnswerBroke(e.into()),
            })?;
            if let Ok(data) = frame.into_data() {
                collected.extend_from_slice(&data);
                if collected.len() > MAX_ANSWER_BYTES {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    };
    let whole = match tokio::time::timeout_at(started + deadline, read).await {
        Ok(whole) => whole?,
        Err(_) => {
            return Err(ProxyError::Timeout {
                module: module.name().to_owned(),
                after: deadline,
            })
        }
    };
    let shareable = may_share(&head.headers);
    let keep = shareable && head.status == StatusCode::OK;
    if !whole {
        let first = collected.freeze();
        let rest = futures_util::stream::once(async move { Ok::<_, axum::Error>(first) })
            .chain(body.into_data_stream().map(|r| r.map_err(axum::Error::new)));
        let mut response = Response::new(Body::from_stream(rest));
        *response.status_mut() = head.status;
        *response.headers_mut() = head.headers;
        response
            .headers_mut()
            .insert(SHARED_HEADER, HeaderValue::from_static("too-large"));
        let answer = Answer {
            status: head.status,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            at: Instant::now(),
            took: started.elapsed(),
            shareable: false,
            keep: false,
            gzipped: Default::default(),
        };
        return Ok((Arc::new(answer), Some(response)));
    }
    head.headers.remove(header::CONTENT_LENGTH);
    head.headers.remove(header::TRANSFER_ENCODING);
    let answer = Answer {
        status: head.status,
        headers: head.headers,
        body: collected.freeze(),
        at: Instant::now(),
        took: started.elapsed(),
        shareable,
        keep,
        gzipped: Default::default(),
    };
    Ok((Arc::new(answer), None))
}

/// The smallest body worth gzipping: below it the header and the work
/// cost more than the bytes saved.
const MIN_GZIP_BYTES: usize = 1024;

/// Whether `headers` accept gzip (`Accept-Encoding: gzip` or `*`, with a
/// quality above 0; RFC 9110 §12.5.3).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    tokens(headers, header::ACCEPT_ENCODING).any(|coding| {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or("").trim();
        let zero = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                == Some(0.0)
        });
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !zero
    })
}

/// Whether an answer is worth gzipping: a 200 of text or JSON, not
/// encoded already, of at least [`MIN_GZIP_BYTES`].
fn worth_gzip(status: StatusCode, headers: &HeaderMap, len: usize) -> bool {
    let textual = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            let t = t.to_ascii_lowercase();
            t.starts_with("text/") || t.contains("json") || t.contains("javascript")
        });
    status == StatusCode::OK
        && len >= MIN_GZIP_BYTES
        && textual
        && !headers.contains_key(header::CONTENT_ENCODING)
}

/// `body` gzipped (fastest level: JSON shrinks about tenfold at it);
/// `None` if that fails.
fn gzipped(body: &[u8]) -> Option<Bytes> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    encoder.write_all(body).ok()?;
    encoder.finish().ok().map(Bytes::from)
}

/// Whether an answer with these headers may be served to others: not one
/// meant for one client (`Set-Cookie`, `Cache-Control: private` or
/// `no-store`) nor one that differs by request header (`Vary`, except
/// `Accept-Encoding`, which every fetch leaves out).
fn may_share(headers: &HeaderMap) -> bool {
    if headers.contains_key(header::SET_COOKIE) {
        return false;
    }
    let private = tokens(headers, header::CACHE_CONTROL).any(|d| {
        let d = d.to_ascii_lowercase();
        d == "private" || d == "no-store" || d.starts_with("private=")
    });
    let varies =
        tokens(headers, header::VARY).any(|name| !name.eq_ignore_ascii_case("accept-encoding"));
    !private && !varies
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_for_one_client_are_not_shared() {
        let with = |name: HeaderName, value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            h
        };
        assert!(may_share(&HeaderMap::new()));
        assert!(may_share(&with(header::CACHE_CONTROL, "max-age=5")));
        assert!(may_share(&with(header::VARY, "Accept-Encoding")));
        assert!(!may_share(&with(header::SET_COOKIE, "a=b")));
        assert!(!may_share(&with(
            header::CACHE_CONTROL,
            "no-cache, Private"
        )));
        assert!(!may_share(&with(header::CACHE_CONTROL, "no-store")));
        assert!(!may_share(&with(header::VARY, "accept-encoding, Cookie")));
        assert!(!may_share(&with(header::VARY, "*")));
    }

    #[test]
    fn gzip_when_accepted_and_worth_it() {
        let accept = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(v));
            h
        };
        assert!(accepts_gzip(&accept("gzip, deflate, br")));
        assert!(accepts_gzip(&accept("br;q=1.0, GZIP;q=0.5")));
        assert!(accepts_gzip(&accept("*")));
        assert!(!accepts_gzip(&accept("gzip;q=0")));
        assert!(!accepts_gzip(&accept("br, identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
        let json = {
            let mut h = HeaderMap::new();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json; charset=utf-8"),
            );
            h
        };
        assert!(worth_gzip(StatusCode::OK, &json, 4096));
        assert!(!worth_gzip(StatusCode::OK, &json, 100));
        assert!(!worth_gzip(StatusCode::NOT_FOUND, &json, 4096));
        assert!(!worth_gzip(StatusCode::OK, &HeaderMap::new(), 4096));
        let body = br#"{"node": "alive", "resources": {"CPU": 2}}"#.repeat(1000);
        let packed = gzipped(&body).expect("gzip");
        assert!(packed.len() * 10 < body.len(), "{}", packed.len());
        let mut unpacked = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&packed[..]),
            &mut unpacked,
        )
        .expect("gunzip");
        assert_eq!(unpacked, body);
    }

    #[test]
    fn a_slow_answer_is_fetched_again_earlier() {
        let took = |ms| Answer {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            at: Instant::now(),
            took: Duration::from_millis(ms),
            shareable: true,
            keep: true,
            gzipped: Default::default(),
        };
        let max = Duration::from_secs(2);
        assert_eq!(took(0).refresh_at(max), Duration::from_secs(1));
        assert_eq!(took(400).refresh_at(max), Duration::from_secs(1));
        assert_eq!(took(1000).refresh_at(max), Duration::from_millis(750));
        assert_eq!(took(1200).refresh_at(max), Duration::from_millis(500));
        assert_eq!(took(9000).refresh_at(max), Duration::from_millis(500));
    }

    #[test]
    fn the_oldest_answers_go_first_past_the_total() {
        let t0 = Instant::now();
        let answer = |secs: u64, len: usize| Slot {
            answer: Some(Arc::new(Answer {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::from(vec![0u8; len]),
                at: t0 + Duration::from_secs(secs),
                took: Duration::ZERO,
                shareable: true,
                keep: true,
                gzipped: Default::default(),
            })),
            fetch: None,
        };
        let key = |p: &str| Key {
            module: Arc::from("m"),
            path_and_query: p.to_owned(),
            browser: false,
        };
        let mut slots = HashMap::new();
        slots.insert(key("/old"), answer(1, MAX_TOTAL_BYTES / 2));
        slots.insert(key("/mid"), answer(2, MAX_TOTAL_BYTES / 2));
        slots.insert(key("/new"), answer(3, 10));
        slots.insert(key("/empty"), Slot::default());
        evict(&mut slots);
        let mut left: Vec<&str> = slots.keys().map(|k| k.path_and_query.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["/mid", "/new"]);
        // However small, no more than MAX_ANSWERS; the oldest go.
        let mut slots: HashMap<Key, Slot> = (0..MAX_ANSWERS as u64 + 5)
            .map(|i| (key(&format!("/{i}")), answer(i, 1)))
            .collect();
        evict(&mut slots);
        assert_eq!(slots.len(), MAX_ANSWERS);
        assert!(!slots.contains_key(&key("/4")) && slots.contains_key(&key("/5")));
    }
}

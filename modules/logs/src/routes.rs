//! The plain and streamed HTTP routes: `files` (listing), `file` (last lines
//! or a byte range) and `follow` (live tail): query parsing, headers and
//! bodies. The reading itself lives in `files`, `tail` and `follow`.

use std::io::SeekFrom;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use crate::error::LogsError;
use crate::files::Listing;
use crate::follow::{Follower, Start, MAX_TAIL_BYTES};
use crate::headers::{FILE_SIZE_HEADER, NEXT_OFFSET_HEADER, START_OFFSET_HEADER};
use crate::tail::{read_range, tail_start};
use crate::AppState;

/// Lines `file?lines=` returns when not told.
pub(crate) const DEFAULT_LINES: usize = 1000;
/// Lines `follow` and `ws` send first when not told, as `tail -f`.
pub(crate) const DEFAULT_FOLLOW_LINES: usize = 10;
/// Most lines any route returns at once; larger requests are capped.
pub(crate) const MAX_LINES: usize = 100_000;
/// Most bytes one `file?offset=` returns; larger requests are capped, and a
/// client reads a larger file in several ranges.
pub(crate) const MAX_RANGE_BYTES: u64 = 16 * 1024 * 1024;

/// Buffer of the byte-range stream: one chunk per read of this size.
const RANGE_CHUNK: usize = 64 * 1024;

/// Query of `GET /api/dashd/logs/file`.
#[derive(Debug, Deserialize)]
pub(crate) struct FileQuery {
    /// Path relative to the log folder.
    name: String,
    /// Last-lines mode: how many (default [`DEFAULT_LINES`]).
    lines: Option<usize>,
    /// Byte-range mode: where the range starts.
    offset: Option<u64>,
    /// Byte-range mode: how many bytes (default and cap [`MAX_RANGE_BYTES`]).
    length: Option<u64>,
}

/// Query of `GET /api/dashd/logs/follow` and `/ws`.
#[derive(Debug, Deserialize)]
pub(crate) struct FollowQuery {
    /// Path relative to the log folder.
    pub(crate) name: String,
    /// Complete lines to send first (default [`DEFAULT_FOLLOW_LINES`]).
    lines: Option<usize>,
    /// Byte offset to follow from instead.
    offset: Option<u64>,
}

impl FollowQuery {
    /// Where following starts.
    pub(crate) fn start(&self) -> Result<Start, LogsError> {
        match (self.lines, self.offset) {
            (Some(_), Some(_)) => Err(both_lines_and_offset()),
            (_, Some(offset)) => Ok(Start::Offset(offset)),
            (lines, None) => Ok(Start::Lines(
                lines.unwrap_or(DEFAULT_FOLLOW_LINES).min(MAX_LINES),
            )),
        }
    }
}

/// Turns axum's query rejection into our JSON 400.
pub(crate) fn parse_query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, LogsError> {
    query
        .map(|Query(query)| query)
        .map_err(|rejection| LogsError::BadQuery(rejection.body_text()))
}

/// `GET /api/dashd/logs/files`: the listing as JSON.
pub(crate) async fn files(State(state): State<AppState>) -> Result<Json<Listing>, LogsError> {
    let dir = state.dir.clone();
    tokio::task::spawn_blocking(move || dir.list())
        .await
        .map_err(|e| LogsError::from_join(".", e))?
        .map(Json)
}

/// `GET /api/dashd/logs/file`: the last lines (`lines=`) or a byte range
/// (`offset=`, `length=`).
pub(crate) async fn file(
    State(state): State<AppState>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, LogsError> {
    let query = parse_query(query)?;
    match (query.lines, query.offset) {
        (Some(_), Some(_)) => Err(both_lines_and_offset()),
        (_, Some(offset)) => byte_range(state, query.name, offset, query.length).await,
        (_, None) if query.length.is_some() => {
            Err(LogsError::BadQuery("length needs an offset".to_owned()))
        }
        (lines, None) => {
            let lines = lines.unwrap_or(DEFAULT_LINES).min(MAX_LINES);
            last_lines(state, query.name, lines).await
        }
    }
}

/// The last `lines` lines of `name`, read backwards from the end.
async fn last_lines(state: AppState, name: String, lines: usize) -> Result<Response, LogsError> {
    let dir = state.dir.clone();
    let for_error = name.clone();
    let (size, start, body) = tokio::task::spawn_blocking(move || {
        let opened = dir.open(&name)?;
        let io_err = |e| LogsError::from_io(&name, e);
        let size = opened.file.metadata().map_err(io_err)?.len();
        let start = tail_start(&opened.file, size, lines, MAX_TAIL_BYTES).map_err(io_err)?;
        let body = read_range(&opened.file, start, size).map_err(io_err)?;
        Ok::<_, LogsError>((size, start, body))
    })
    .await
    .map_err(|e| LogsError::from_join(&for_error, e))??;
    let next = start + body.len() as u64;
    let mut response = Body::from(body).into_response();
    let headers = response.headers_mut();
    set_text_headers(headers);
    set_offsets(headers, size, start, next);
    Ok(response)
}

/// `length` bytes of `name` from `offset`, streamed from the file.
async fn byte_range(
    state: AppState,
    name: String,
    offset: u64,
    length: Option<u64>,
) -> Result<Response, LogsError> {
    let dir = state.dir.clone();
    let for_open = name.clone();
    let opened = tokio::task::spawn_blocking(move || dir.open(&for_open))
        .await
        .map_err(|e| LogsError::from_join(&name, e))??;
    let io_err = |e| LogsError::from_io(&name, e);
    let size = opened.file.metadata().map_err(io_err)?.len();
    if offset > size {
        return Err(LogsError::OffsetPastEnd { name, offset, size });
    }
    let len = length
        .unwrap_or(MAX_RANGE_BYTES)
        .min(MAX_RANGE_BYTES)
        .min(size - offset);
    let mut file = tokio::fs::File::from_std(opened.file);
    file.seek(SeekFrom::Start(offset)).await.map_err(io_err)?;
    let body = Body::from_stream(ReaderStream::with_capacity(file.take(len), RANGE_CHUNK));
    let mut response = body.into_response();
    let headers = response.headers_mut();
    set_text_headers(headers);
    set_offsets(headers, size, offset, offset + len);
    headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    Ok(response)
}

/// `GET /api/dashd/logs/follow`: the live tail as a never-ending text
/// stream; it ends only on shutdown or when the file can no longer be
/// followed (then the response is cut, not ended cleanly).
pub(crate) async fn follow(
    State(state): State<AppState>,
    query: Result<Query<FollowQuery>, QueryRejection>,
) -> Result<Response, LogsError> {
    let query = parse_query(query)?;
    let start = query.start()?;
    let opening = Follower::open_async(state.dir.clone(), query.name.clone(), start).await?;
    let (size, first) = (opening.size, opening.start);
    let name = query.name;
    let stream = Follower::stream(opening)
        .inspect(move |item| {
            if let Err(e) = item {
                tracing::info!(name = %name, error = %e, "follow ended");
            }
        })
        .take_until(state.shutdown.cancelled_owned());
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    set_text_headers(headers);
    headers.insert(FILE_SIZE_HEADER, HeaderValue::from(size));
    headers.insert(START_OFFSET_HEADER, HeaderValue::from(first));
    // Asks a buffering reverse proxy (nginx) in front to pass chunks on.
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    Ok(response)
}

/// Log text, never cached, never sniffed as HTML.
fn set_text_headers(headers: &mut HeaderMap) {
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
}

/// The size and the offsets of the body in the file.
fn set_offsets(headers: &mut HeaderMap, size: u64, start: u64, next: u64) {
    headers.insert(FILE_SIZE_HEADER, HeaderValue::from(size));
    headers.insert(START_OFFSET_HEADER, HeaderValue::from(start));
    headers.insert(NEXT_OFFSET_HEADER, HeaderValue::from(next));
}

fn both_lines_and_offset() -> LogsError {
    LogsError::BadQuery("give either lines or offset, not both".to_owned())
}

#[cfg(test)]
mod tests;

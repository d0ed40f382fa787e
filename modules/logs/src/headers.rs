//! The response headers the routes set beside a file's bytes, where the
//! file stood when it was read; an error answer (a range past the end)
//! sets one of them too, so they sit below both `routes` and `error`.

use axum::http::HeaderName;

/// Size of the file in bytes when it was read.
pub(crate) const FILE_SIZE_HEADER: HeaderName = HeaderName::from_static("x-file-size");
/// Offset in the file of the first byte of the body.
pub(crate) const START_OFFSET_HEADER: HeaderName = HeaderName::from_static("x-start-offset");
/// Offset just past the last byte of the body: where to continue following.
pub(crate) const NEXT_OFFSET_HEADER: HeaderName = HeaderName::from_static("x-next-offset");

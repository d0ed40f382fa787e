//! `Logstream`, the client's stream of its workers' logs, forwarded
//! message by message to its server once the data stream has named it.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::warn;

use super::{client_grpc, client_id, onward, path_of, ready, Messages, LOGSTREAM};
use crate::codec::RawCodec;
use crate::proxy::Proxy;

/// Opens the client's log stream on its server, waiting a little for a
/// data stream that has not registered the client yet.
pub(super) async fn logstream(
    proxy: Arc<Proxy>,
    request: Request<Streaming<Bytes>>,
) -> Result<Response<Messages>, Status> {
    let id = client_id(request.metadata().as_ref())?;
    // The log stream may open before the data stream has registered the
    // client: look a few times.
    let mut client = proxy.client(&id);
    for _ in 1..proxy.settings.logstream_tries {
        if client.is_some() {
            break;
        }
        tokio::time::sleep(proxy.settings.logstream_pause).await;
        client = proxy.client(&id);
    }
    let client = client.ok_or_else(|| {
        Status::not_found(format!(
            "Logstream proxy failed to connect. Channel for client {id} not found."
        ))
    })?;
    let server = client
        .server(proxy.settings.server_wait)
        .await
        .map_err(|why| Status::not_found(why.to_string()))?;
    let (metadata, _, inbound) = request.into_parts();
    let mut grpc = client_grpc(&server);
    ready(&mut grpc, &server).await?;
    let request = Request::from_parts(metadata, Default::default(), onward(inbound));
    let answers = grpc
        .streaming(request, path_of(LOGSTREAM), RawCodec)
        .await
        .map_err(|status| {
            warn!(client_id = %id, %status, "Logstream to the Ray client server failed");
            status
        })?;
    Ok(answers.map(|s| s.boxed()))
}

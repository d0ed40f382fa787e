//! `Datapath`, the client's data stream: a new client's `init` decides its
//! server; the answers are passed on with `connection_info` rewritten; the
//! proxy is told when the stream ends, however it ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::Stream;
use prost::Message;
use ray_proto::rpc::{data_response, DataResponse, InitResponse};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};

use super::{client_grpc, client_id, onward, path_of, ready, Messages, DATAPATH, RECONNECTING};
use crate::codec::RawCodec;
use crate::proxy::{Client, ClientError, Proxy};
use crate::servers::SpecificServer;
use crate::wire;

/// A client's data stream: a new one, or one resumed after a dropped
/// connection (`reconnecting` metadata).
pub(super) async fn datapath(
    proxy: Arc<Proxy>,
    request: Request<Streaming<Bytes>>,
) -> Result<Response<Messages>, Status> {
    let id = client_id(request.metadata().as_ref())?;
    let reconnecting = request
        .metadata()
        .get(RECONNECTING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let (mut metadata, _, inbound) = request.into_parts();
    metadata.insert(
        RECONNECTING,
        MetadataValue::from_static(if reconnecting { "True" } else { "False" }),
    );

    if reconnecting {
        let (client, generation) = proxy.attach_again(&id).map_err(|e| match e {
            ClientError::Unknown(_) => Status::not_found(e.to_string()),
            ClientError::Duplicate(_) => Status::already_exists(e.to_string()),
        })?;
        let guard = Detach::new(&proxy, &client, generation);
        let server = client
            .server(proxy.settings.server_wait)
            .await
            .map_err(|why| Status::not_found(why.to_string()))?;
        let responses =
            open_datapath(&proxy, &client, &server, metadata, onward(inbound).boxed()).await?;
        return Ok(Response::new(
            Guarded {
                inner: responses,
                _guard: guard,
            }
            .boxed(),
        ));
    }

    let (client, generation) = proxy
        .attach_new(&id)
        .map_err(|e| Status::already_exists(e.to_string()))?;
    let guard = Detach::new(&proxy, &client, generation);
    // Answer at once; the server is found while the client waits for its
    // `init` answer, which is what a failure is reported in.
    let setup = async move {
        match first_contact(&proxy, &client, metadata, inbound).await {
            Ok(responses) => responses,
            Err((req_id, why)) => {
                // Nothing to wait for: a reconnect or a call of this client
                // learns why at once.
                client.fail_if_starting(&why);
                stream::once(std::future::ready(Ok(init_failure(req_id, &why)))).boxed()
            }
        }
    };
    let responses = stream::once(setup).flatten().boxed();
    Ok(Response::new(
        Guarded {
            inner: responses,
            _guard: guard,
        }
        .boxed(),
    ))
}

/// Reads a new client's `init`, gets it a server and opens its data stream
/// there. `Err` is the `init` answer (ok = false) that says why not.
async fn first_contact(
    proxy: &Arc<Proxy>,
    client: &Arc<Client>,
    metadata: MetadataMap,
    mut inbound: Streaming<Bytes>,
) -> Result<Messages, (i32, String)> {
    let first =
        match tokio::time::timeout(proxy.settings.first_message_timeout, inbound.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => return Err((0, "the data stream closed before its init".into())),
            Ok(Err(status)) => {
                return Err((
                    0,
                    format!("the data stream broke before its init: {status}"),
                ))
            }
            Err(_) => return Err((0, "no init within the time limit".into())),
        };
    let envelope = wire::envelope(&first).unwrap_or_default();
    let init = match wire::init_request(&first) {
        Ok(Some(init)) => init,
        _ => {
            return Err((
                envelope.req_id,
                format!(
                    "the first message of a data stream must be an init, not field {}",
                    envelope.kind.map_or("none".to_owned(), |k| k.to_string())
                ),
            ))
        }
    };
    let server = proxy.start_server(client, init).await.map_err(|why| {
        (
            envelope.req_id,
            format!("Starting Ray client server failed: {why}"),
        )
    })?;
    let outbound = stream::once(std::future::ready(first))
        .chain(onward(inbound))
        .boxed();
    open_datapath(proxy, client, &server, metadata, outbound)
        .await
        .map_err(|status| {
            (
                envelope.req_id,
                format!(
                    "Proxy failed to connect to the Ray client server: {}; see {}",
                    status.message(),
                    proxy.launcher.error_log(server.port).display()
                ),
            )
        })
}

fn init_failure(req_id: i32, msg: &str) -> Bytes {
    DataResponse {
        req_id,
        r#type: Some(data_response::Type::Init(InitResponse {
            ok: false,
            msg: msg.to_owned(),
        })),
    }
    .encode_to_vec()
    .into()
}

/// Opens the client's data stream on its server and returns the answers,
/// with `connection_info` rewritten and `connection_cleanup` noted.
async fn open_datapath(
    proxy: &Arc<Proxy>,
    client: &Arc<Client>,
    server: &SpecificServer,
    metadata: MetadataMap,
    outbound: BoxStream<'static, Bytes>,
) -> Result<Messages, Status> {
    let mut grpc = client_grpc(server);
    ready(&mut grpc, server).await?;
    let request = Request::from_parts(metadata, Default::default(), outbound);
    let answers = grpc
        .streaming(request, path_of(DATAPATH), RawCodec)
        .await?
        .into_inner();
    let (proxy, client) = (proxy.clone(), client.clone());
    Ok(answers
        .map(move |answer| {
            let message = answer?;
            match wire::envelope(&message).map(|e| e.kind) {
                Ok(Some(wire::field::CONNECTION_INFO)) => {
                    let count = i32::try_from(proxy.num_clients()).unwrap_or(i32::MAX);
                    wire::set_num_clients(&message, count)
                        .map_err(|e| Status::internal(e.to_string()))
                }
                Ok(Some(wire::field::CONNECTION_CLEANUP)) => {
                    client.cleanup_confirmed();
                    Ok(message)
                }
                _ => Ok(message),
            }
        })
        .boxed())
}

/// Tells the proxy when a `Datapath` stream ends, however it ends.
struct Detach {
    proxy: Arc<Proxy>,
    client: Arc<Client>,
    generation: u64,
}

impl Detach {
    fn new(proxy: &Arc<Proxy>, client: &Arc<Client>, generation: u64) -> Detach {
        Detach {
            proxy: proxy.clone(),
            client: client.clone(),
            generation,
        }
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        self.proxy.detach(self.client.clone(), self.generation);
    }
}

/// A response stream that carries a [`Detach`].
struct Guarded {
    inner: Messages,
    _guard: Detach,
}

impl Stream for Guarded {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

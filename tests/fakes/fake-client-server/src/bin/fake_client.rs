//! A minimal Ray client for tests: connects to a Ray Client proxy as
//! `ray.init("ray://ADDRESS")` would (PING, data stream, `init`), prints
//! `connected <client id>`, stays connected until its stdin closes, then
//! cleans up as `ray.shutdown()` does.
//!
//! usage: ray-dashd-fake-client HOST:PORT CLIENT_ID

use ray_proto::rpc::cluster_info_type::TypeEnum as ClusterInfoType;
use ray_proto::rpc::raylet_data_streamer_client::RayletDataStreamerClient;
use ray_proto::rpc::raylet_driver_client::RayletDriverClient;
use ray_proto::rpc::{
    data_request, data_response, ClusterInfoRequest, ConnectionCleanupRequest, DataRequest,
    InitRequest,
};
use tokio::io::AsyncReadExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(address), Some(id)) = (args.next(), args.next()) else {
        return Err("usage: ray-dashd-fake-client HOST:PORT CLIENT_ID".into());
    };
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))?
        .connect()
        .await?;
    RayletDriverClient::new(channel.clone())
        .cluster_info(ClusterInfoRequest {
            r#type: ClusterInfoType::Ping as i32,
        })
        .await?;
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
    request.metadata_mut().insert("client_id", id.parse()?);
    request
        .metadata_mut()
        .insert("reconnecting", "False".parse()?);
    let mut answers = RayletDataStreamerClient::new(channel)
        .datapath(request)
        .await?
        .into_inner();
    let init = InitRequest {
        ray_init_kwargs: r#"{"runtime_env": {}}"#.into(),
        reconnect_grace_period: 30,
        ..Default::default()
    };
    sender
        .send(DataRequest {
            req_id: 1,
            r#type: Some(data_request::Type::Init(init)),
        })
        .await?;
    match answers.message().await?.and_then(|a| a.r#type) {
        Some(data_response::Type::Init(init)) if init.ok => println!("connected {id}"),
        other => return Err(format!("init failed: {other:?}").into()),
    }
    let mut rest = Vec::new();
    tokio::io::stdin().read_to_end(&mut rest).await?;
    let cleanup = data_request::Type::ConnectionCleanup(ConnectionCleanupRequest {});
    sender
        .send(DataRequest {
            req_id: 2,
            r#type: Some(cleanup),
        })
        .await?;
    answers.message().await?;
    Ok(())
}

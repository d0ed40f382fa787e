//! The few GCS calls the proxy makes itself: the internal KV for the calls a
//! client makes before its server exists (the working_dir upload), pinning
//! runtime env URIs, and finding the head's runtime env agent.

use std::time::Duration;

use ray_proto::rpc::get_all_node_info_request::{node_selector, NodeSelector};
use ray_proto::rpc::internal_kv_gcs_service_client::InternalKvGcsServiceClient;
use ray_proto::rpc::node_info_gcs_service_client::NodeInfoGcsServiceClient;
use ray_proto::rpc::runtime_env_gcs_service_client::RuntimeEnvGcsServiceClient;
use ray_proto::rpc::{
    GcsStatus, GetAllNodeInfoRequest, InternalKvDelRequest, InternalKvExistsRequest,
    InternalKvGetRequest, InternalKvKeysRequest, InternalKvPutRequest, PinRuntimeEnvUriRequest,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::auth::{Token, AUTHORIZATION};

/// Ray's status code for a key that is not there (`StatusCode::NotFound`).
const GCS_NOT_FOUND: i32 = 17;
/// Bound on one GCS call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of the GCS at one address.
#[derive(Debug, Clone)]
pub struct Gcs {
    address: String,
    channel: Channel,
    bearer: Option<MetadataValue<Ascii>>,
}

impl Gcs {
    /// A client of the GCS at `address` (`host:port`); connects on first use.
    pub fn new(address: &str, token: Option<&Token>) -> Result<Gcs, String> {
        let bearer = token
            .map(|t| t.bearer().parse::<MetadataValue<Ascii>>())
            .transpose()
            .map_err(|_| "the auth token is not valid in gRPC metadata".to_owned())?;
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad GCS address {address:?}: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(CALL_TIMEOUT);
        Ok(Gcs {
            address: address.to_owned(),
            channel: endpoint.connect_lazy(),
            bearer,
        })
    }

    /// The address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// `message` as a request, with the token when there is one.
    fn req<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(bearer) = &self.bearer {
            request.metadata_mut().insert(AUTHORIZATION, bearer.clone());
        }
        request
    }

    fn kv(&self) -> InternalKvGcsServiceClient<Channel> {
        InternalKvGcsServiceClient::new(self.channel.clone())
    }

    /// The value of `key`, `None` when it is not there.
    pub async fn kv_get(
        &self,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Status> {
        let reply = self
            .kv()
            .internal_kv_get(self.req(InternalKvGetRequest { key, namespace }))
            .await?
            .into_inner();
        match reply.status {
            Some(GcsStatus {
                code: GCS_NOT_FOUND,
                ..
            }) => Ok(None),
            status => check(status).map(|()| Some(reply.value)),
        }
    }

    /// Stores `value` at `key`; returns whether the key was there already.
    pub async fn kv_put(
        &self,
        namespace: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
        overwrite: bool,
    ) -> Result<bool, Status> {
        let reply = self
            .kv()
            .internal_kv_put(self.req(InternalKvPutRequest {
                key,
                value,
                overwrite,
                namespace,
            }))
            .await?
            .into_inner();
        check(reply.status)?;
        Ok(!reply.added)
    }

    /// Whether `key` is there.
    pub async fn kv_exists(&self, namespace: Vec<u8>, key: Vec<u8>) -> Result<bool, Status> {
        let reply = self
            .kv()
            .internal_kv_exists(self.req(InternalKvExistsRequest { key, namespace }))
            .await?
            .into_inner();
        check(reply.status)?;
        Ok(reply.exists)
    }

    /// The keys starting with `prefix`.
    pub async fn kv_keys(
        &self,
        namespace: Vec<u8>,
        prefix: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, Status> {
        let reply = self
            .kv()
            .internal_kv_keys(self.req(InternalKvKeysRequest { prefix, namespace }))
            .await?
            .into_inner();
        check(reply.status)?;
        Ok(reply.results)
    }

    /// Deletes `key` (or every key it prefixes); returns how many went.
    pub async fn kv_del(
        &self,
        namespace: Vec<u8>,
        key: Vec<u8>,
        by_prefix: bool,
    ) -> Result<i32, Status> {
        let reply = self
            .kv()
            .internal_kv_del(self.req(InternalKvDelRequest {
                key,
                namespace,
                del_by_prefix: by_prefix,
            }))
            .await?
            .into_inner();
        check(reply.status)?;
        Ok(reply.deleted_num)
    }

    /// Keeps the package at `uri` from being deleted for `expiration_s`.
    pub async fn pin_runtime_env_uri(&self, uri: String, expiration_s: i32) -> Result<(), Status> {
        let reply = RuntimeEnvGcsServiceClient::new(self.channel.clone())
            .pin_runtime_env_uri(self.req(PinRuntimeEnvUriRequest { uri, expiration_s }))
            .await?
            .into_inner();
        check(reply.status)
    }

    /// `http://<ip>:<port>` of the head node's runtime env agent.
    pub async fn head_runtime_env_agent(&self) -> Result<String, Status> {
        let reply = NodeInfoGcsServiceClient::new(self.channel.clone())
            .get_all_node_info(self.req(GetAllNodeInfoRequest {
                node_selectors: vec![NodeSelector {
                    node_selector: Some(node_selector::NodeSelector::IsHeadNode(true)),
                }],
                ..Default::default()
            }))
            .await?
            .into_inner();
        check(reply.status)?;
        let head = reply
            .node_info_list
            .iter()
            .find(|node| node.is_head_node && node.runtime_env_agent_port > 0)
            .ok_or_else(|| {
                Status::unavailable("the GCS knows no head node with a runtime env agent")
            })?;
        Ok(format!(
            "http://{}:{}",
            head.node_manager_address, head.runtime_env_agent_port
        ))
    }
}

fn check(status: Option<GcsStatus>) -> Result<(), Status> {
    match status {
        None => Ok(()),
        Some(GcsStatus { code: 0, .. }) => Ok(()),
        Some(GcsStatus { code, message }) => Err(Status::new(
            Code::Internal,
            format!("GCS answered status {code}: {message}"),
        )),
    }
}

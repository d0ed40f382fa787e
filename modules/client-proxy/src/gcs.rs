//! The few GCS calls the proxy makes itself: the internal KV for the calls a
//! client makes before its server exists (the working_dir upload), pinning
//! runtime env URIs, and finding the head's runtime env agent. The Ray state
//! module (`modules/ray-state`) reads the job table and the KV through the
//! same client.

use std::time::Duration;

use ray_dashd_tls::{Connector, RayTls};
use ray_proto::rpc::gcs_node_info::GcsNodeState;
use ray_proto::rpc::internal_kv_gcs_service_client::InternalKvGcsServiceClient;
use ray_proto::rpc::job_info_gcs_service_client::JobInfoGcsServiceClient;
use ray_proto::rpc::node_info_gcs_service_client::NodeInfoGcsServiceClient;
use ray_proto::rpc::runtime_env_gcs_service_client::RuntimeEnvGcsServiceClient;
use ray_proto::rpc::{
    GcsNodeInfo, GcsStatus, GetAllJobInfoRequest, GetAllNodeInfoRequest, InternalKvDelRequest,
    InternalKvExistsRequest, InternalKvGetRequest, InternalKvKeysRequest,
    InternalKvMultiGetRequest, InternalKvPutRequest, JobTableData, PinRuntimeEnvUriRequest,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::auth::{Token, AUTHORIZATION};

/// Ray's status code for a key that is not there (`StatusCode::NotFound`).
const GCS_NOT_FOUND: i32 = 17;
/// Bound on one GCS call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest reply taken from the GCS: Ray's own limit
/// (`max_grpc_message_size`, 512 MiB), not tonic's 4 MiB, which a job
/// table or a KV read of a big cluster can pass.
const MAX_REPLY_BYTES: usize = 512 << 20;

/// Why a GCS client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum GcsError {
    /// The token has characters gRPC metadata cannot carry.
    #[error("the auth token is not valid in gRPC metadata")]
    BadToken,
    /// The address is not `host:port`.
    #[error("bad GCS address {address:?}: {source}")]
    BadAddress {
        /// The address.
        address: String,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
}

/// A client of the GCS at one address.
#[derive(Debug, Clone)]
pub struct Gcs {
    address: String,
    channel: Channel,
    bearer: Option<MetadataValue<Ascii>>,
}

impl Gcs {
    /// A client of the GCS at `address` (`host:port`), with Ray's TLS when
    /// `tls` is given (the GCS's certificate checked against the address's
    /// host, as Ray's clients check it); connects on first use.
    pub fn new(
        address: &str,
        token: Option<&Token>,
        tls: Option<&RayTls>,
    ) -> Result<Gcs, GcsError> {
        let bearer = token
            .map(|t| t.bearer().parse::<MetadataValue<Ascii>>())
            .transpose()
            .map_err(|_| GcsError::BadToken)?;
        let scheme = ray_dashd_tls::scheme(tls);
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|source| GcsError::BadAddress {
                address: address.to_owned(),
                source,
            })?
            .connect_timeout(Duration::from_secs(5))
            .timeout(CALL_TIMEOUT);
        Ok(Gcs {
            address: address.to_owned(),
            channel: endpoint.connect_with_connector_lazy(Connector::new(tls.cloned())),
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
            .max_decoding_message_size(MAX_REPLY_BYTES)
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

    /// The values of `keys` that are there, by key, in one call.
    pub async fn kv_multi_get(
        &self,
        namespace: Vec<u8>,
        keys: Vec<Vec<u8>>,
    ) -> Result<std::collections::HashMap<Vec<u8>, Vec<u8>>, Status> {
        let reply = self
            .kv()
            .internal_kv_multi_get(self.req(InternalKvMultiGetRequest { keys, namespace }))
            .await?
            .into_inner();
        check(reply.status)?;
        Ok(reply
            .results
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect())
    }

    /// Every job in the GCS's job table, without the job API's record and
    /// the running-tasks flag (as Ray's job list asks for them).
    pub async fn all_jobs(&self) -> Result<Vec<JobTableData>, Status> {
        let reply = JobInfoGcsServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_REPLY_BYTES)
            .get_all_job_info(self.req(GetAllJobInfoRequest {
                skip_submission_job_info_field: Some(true),
                skip_is_running_tasks_field: Some(true),
                ..Default::default()
            }))
            .await?
            .into_inner();
        check(reply.status)?;
        Ok(reply.job_info_list)
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
    ///
    /// Asks for every node and picks the head here: the request's head-node
    /// selector is unknown to Ray 2.45–2.48 (ignored, so every node comes
    /// back) and answered with no nodes at all by 2.49–2.53, so filtering on
    /// the GCS side would break runtime envs on those releases.
    pub async fn head_runtime_env_agent(&self) -> Result<String, Status> {
        let reply = NodeInfoGcsServiceClient::new(self.channel.clone())
            .get_all_node_info(self.req(GetAllNodeInfoRequest::default()))
            .await?
            .into_inner();
        check(reply.status)?;
        let head = head_agent(&reply.node_info_list).ok_or_else(|| {
            Status::unavailable("the GCS knows no live head node with a runtime env agent")
        })?;
        Ok(format!(
            "http://{}:{}",
            head.node_manager_address, head.runtime_env_agent_port
        ))
    }
}

/// The live head node that runs a runtime env agent, among `nodes`.
fn head_agent(nodes: &[GcsNodeInfo]) -> Option<&GcsNodeInfo> {
    nodes.iter().find(|node| {
        node.is_head_node
            && node.state == GcsNodeState::Alive as i32
            && node.runtime_env_agent_port > 0
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(head: bool, state: GcsNodeState, port: i32) -> GcsNodeInfo {
        GcsNodeInfo {
            is_head_node: head,
            state: state as i32,
            runtime_env_agent_port: port,
            node_manager_address: format!("10.0.0.{port}"),
            ..Default::default()
        }
    }

    /// A GCS whose KV holds one value of `len` bytes at every key.
    struct BigKv {
        len: usize,
    }

    #[tonic::async_trait]
    impl ray_proto::rpc::internal_kv_gcs_service_server::InternalKvGcsService for BigKv {
        async fn internal_kv_get(
            &self,
            _request: Request<InternalKvGetRequest>,
        ) -> Result<tonic::Response<ray_proto::rpc::InternalKvGetReply>, Status> {
            Ok(tonic::Response::new(ray_proto::rpc::InternalKvGetReply {
                value: vec![7; self.len],
                ..Default::default()
            }))
        }
    }

    /// A value past tonic's default 4 MiB reply limit is read (Ray's GCS
    /// sends up to 512 MiB): a big cluster's job records, a package.
    #[tokio::test]
    async fn a_reply_past_four_mib_is_taken() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let len = 6 << 20;
        let server = tonic::transport::Server::builder()
            .add_service(
                ray_proto::rpc::internal_kv_gcs_service_server::InternalKvGcsServiceServer::new(
                    BigKv { len },
                )
                .max_encoding_message_size(MAX_REPLY_BYTES),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let serving = tokio::spawn(server);
        let gcs = Gcs::new(&address, None, None).expect("client");
        let value = gcs
            .kv_get(b"ns".to_vec(), b"key".to_vec())
            .await
            .expect("a 6 MiB value");
        assert_eq!(value.map(|v| v.len()), Some(len));
        serving.abort();
    }

    #[test]
    fn the_live_head_with_an_agent_is_picked_among_all_nodes() {
        let nodes = [
            node(false, GcsNodeState::Alive, 1),
            node(true, GcsNodeState::Dead, 2),
            node(true, GcsNodeState::Alive, 0),
            node(true, GcsNodeState::Alive, 4),
        ];
        let head = head_agent(&nodes).expect("a head");
        assert_eq!(head.runtime_env_agent_port, 4);
        assert!(head_agent(&nodes[..3]).is_none());
    }
}

//! The KV calls (and `PinRuntimeEnvURI`) of a client that has no server
//! yet, made on the GCS as Ray's proxier makes them.

use bytes::Bytes;
use ray_proto::rpc::{
    ClientPinRuntimeEnvUriRequest, ClientPinRuntimeEnvUriResponse, KvDelRequest, KvDelResponse,
    KvExistsRequest, KvExistsResponse, KvGetRequest, KvGetResponse, KvListRequest, KvListResponse,
    KvPutRequest, KvPutResponse,
};
use tonic::Status;
use tracing::debug;

use super::framing::{decode, reply};
use crate::proxy::Proxy;

/// A KV call of a client that has no server yet, made on the GCS.
pub(super) async fn gcs_call(proxy: &Proxy, method: &str, body: &Bytes) -> Result<Bytes, Status> {
    let gcs = proxy.gcs.as_ref().ok_or_else(|| {
        Status::unavailable(
            "the proxy knows no GCS to serve this call before the client's server exists",
        )
    })?;
    debug!(method, "served by the GCS before the client has a server");
    match method {
        "KVGet" => {
            let r: KvGetRequest = decode(body)?;
            let value = gcs.kv_get(r.namespace.unwrap_or_default(), r.key).await?;
            reply(KvGetResponse { value })
        }
        "KVPut" => {
            let r: KvPutRequest = decode(body)?;
            let already_exists = gcs
                .kv_put(r.namespace.unwrap_or_default(), r.key, r.value, r.overwrite)
                .await?;
            reply(KvPutResponse { already_exists })
        }
        "KVDel" => {
            let r: KvDelRequest = decode(body)?;
            let deleted_num = gcs
                .kv_del(r.namespace.unwrap_or_default(), r.key, r.del_by_prefix)
                .await?;
            reply(KvDelResponse { deleted_num })
        }
        "KVList" => {
            let r: KvListRequest = decode(body)?;
            let keys = gcs
                .kv_keys(r.namespace.unwrap_or_default(), r.prefix)
                .await?;
            reply(KvListResponse { keys })
        }
        "KVExists" => {
            let r: KvExistsRequest = decode(body)?;
            let exists = gcs
                .kv_exists(r.namespace.unwrap_or_default(), r.key)
                .await?;
            reply(KvExistsResponse { exists })
        }
        "PinRuntimeEnvURI" => {
            let r: ClientPinRuntimeEnvUriRequest = decode(body)?;
            gcs.pin_runtime_env_uri(r.uri, r.expiration_s).await?;
            reply(ClientPinRuntimeEnvUriResponse {})
        }
        _ => Err(Status::internal(format!("{method} is not a KV call"))),
    }
}

//! Reading and rewriting the few Ray Client messages the proxy must look at,
//! straight from their protobuf bytes.
//!
//! The proxy forwards messages as bytes ([`crate::codec::RawCodec`]). To tell
//! an `init` from a `put`, or to change `num_clients` in a
//! `connection_info` answer, it walks the top-level fields of a message
//! without decoding the rest, so large object chunks are never copied and
//! fields this build does not know pass through unchanged.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use ray_proto::rpc::InitRequest;

/// Field numbers of `DataRequest` and `DataResponse` (`ray_client.proto`).
pub mod field {
    /// `req_id`, in both messages.
    pub const REQ_ID: u32 = 1;
    /// `DataRequest.connection_info` / `DataResponse.connection_info`.
    pub const CONNECTION_INFO: u32 = 5;
    /// `DataRequest.init` / `DataResponse.init`.
    pub const INIT: u32 = 6;
    /// `DataRequest.connection_cleanup` / `DataResponse.connection_cleanup`.
    pub const CONNECTION_CLEANUP: u32 = 8;
    /// `ConnectionInfoResponse.num_clients`.
    pub const NUM_CLIENTS: u32 = 1;
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// One top-level field of an encoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The field number.
    pub number: u32,
    /// The wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
    pub wire_type: u8,
    /// The whole field, key included.
    pub whole: Range<usize>,
    /// The value: the varint or fixed bytes, or a length-delimited payload.
    pub value: Range<usize>,
}

/// A message that is not valid protobuf.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf message at byte {offset}")]
pub struct Malformed {
    /// Where reading failed.
    pub offset: usize,
}

fn varint(msg: &[u8], at: &mut usize) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *msg.get(*at).ok_or(Malformed { offset: *at })?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Malformed { offset: *at })
}

/// The top-level fields of `msg`, in order.
pub fn fields(msg: &[u8]) -> Result<Vec<Field>, Malformed> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < msg.len() {
        let start = at;
        let key = varint(msg, &mut at)?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed { offset: start })?;
        let wire_type = (key & 7) as u8;
        let value_start;
        match wire_type {
            VARINT => {
                value_start = at;
                varint(msg, &mut at)?;
            }
            FIXED64 => {
                value_start = at;
                at += 8;
            }
            FIXED32 => {
                value_start = at;
                at += 4;
            }
            LEN => {
                let len = varint(msg, &mut at)?;
                value_start = at;
                at = usize::try_from(len)
                    .ok()
                    .and_then(|len| at.checked_add(len))
                    .ok_or(Malformed { offset: start })?;
            }
            _ => return Err(Malformed { offset: start }),
        }
        if at > msg.len() || number == 0 {
            return Err(Malformed { offset: start });
        }
        out.push(Field {
            number,
            wire_type,
            whole: start..at,
            value: value_start..at,
        });
    }
    Ok(out)
}

/// Which member of the `type` oneof a `DataRequest` or `DataResponse` holds
/// (its field number), and its `req_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Envelope {
    /// `req_id` (0 when absent).
    pub req_id: i32,
    /// The field number of the set member of `type`, if any.
    pub kind: Option<u32>,
}

/// Reads the `req_id` and the kind of a `DataRequest`/`DataResponse`.
pub fn envelope(msg: &[u8]) -> Result<Envelope, Malformed> {
    let mut envelope = Envelope::default();
    for field in fields(msg)? {
        match (field.number, field.wire_type) {
            (field::REQ_ID, VARINT) => {
                let mut at = field.value.start;
                envelope.req_id = varint(msg, &mut at)? as i32;
            }
            (_, LEN) => envelope.kind = Some(field.number),
            _ => {}
        }
    }
    Ok(envelope)
}

/// The `InitRequest` of a `DataRequest`, if that is what it holds.
pub fn init_request(msg: &[u8]) -> Result<Option<InitRequest>, Malformed> {
    let mut init = None;
    for field in fields(msg)? {
        if field.number == field::INIT && field.wire_type == LEN {
            let decoded =
                InitRequest::decode(&msg[field.value.clone()]).map_err(|_| Malformed {
                    offset: field.value.start,
                })?;
            init = Some(decoded);
        }
    }
    Ok(init)
}

fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

fn put_len_field(out: &mut BytesMut, number: u32, payload: &[u8]) {
    put_varint(out, (u64::from(number) << 3) | u64::from(LEN));
    put_varint(out, payload.len() as u64);
    out.put_slice(payload);
}

/// Returns `msg` (a `DataResponse`) with `connection_info.num_clients` set
/// to `num_clients`; every other field, known or not, is kept byte for byte.
pub fn set_num_clients(msg: &[u8], num_clients: i32) -> Result<Bytes, Malformed> {
    let mut out = BytesMut::with_capacity(msg.len() + 8);
    for field in fields(msg)? {
        if field.number != field::CONNECTION_INFO || field.wire_type != LEN {
            out.put_slice(&msg[field.whole]);
            continue;
        }
        let inner = &msg[field.value.clone()];
        let mut rewritten = BytesMut::with_capacity(inner.len() + 8);
        if num_clients != 0 {
            put_varint(
                &mut rewritten,
                (u64::from(field::NUM_CLIENTS) << 3) | u64::from(VARINT),
            );
            // int32 is encoded sign-extended to 64 bits.
            put_varint(&mut rewritten, i64::from(num_clients) as u64);
        }
        for sub in fields(inner).map_err(|e| Malformed {
            offset: field.value.start + e.offset,
        })? {
            if sub.number != field::NUM_CLIENTS {
                rewritten.put_slice(&inner[sub.whole]);
            }
        }
        put_len_field(&mut out, field::CONNECTION_INFO, &rewritten);
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ray_proto::rpc::{
        data_request, data_response, ConnectionInfoResponse, DataRequest, DataResponse,
        GetResponse, InitResponse,
    };

    #[test]
    fn envelope_names_the_oneof_member_and_req_id() {
        let init = DataRequest {
            req_id: 7,
            r#type: Some(data_request::Type::Init(InitRequest {
                job_config: vec![1, 2, 3],
                ray_init_kwargs: "{\"runtime_env\": {}}".into(),
                reconnect_grace_period: 30,
            })),
        }
        .encode_to_vec();
        assert_eq!(
            envelope(&init),
            Ok(Envelope {
                req_id: 7,
                kind: Some(field::INIT)
            })
        );
        let decoded = init_request(&init).unwrap().unwrap();
        assert_eq!(decoded.reconnect_grace_period, 30);
        assert_eq!(decoded.job_config, vec![1, 2, 3]);

        let cleanup = DataResponse {
            req_id: 0,
            r#type: Some(data_response::Type::ConnectionCleanup(Default::default())),
        }
        .encode_to_vec();
        assert_eq!(
            envelope(&cleanup).unwrap().kind,
            Some(field::CONNECTION_CLEANUP)
        );
        assert_eq!(init_request(&cleanup), Ok(None));
    }

    #[test]
    fn num_clients_is_rewritten_and_the_rest_kept() {
        let original = DataResponse {
            req_id: 3,
            r#type: Some(data_response::Type::ConnectionInfo(
                ConnectionInfoResponse {
                    num_clients: 1,
                    ray_version: "2.60.0".into(),
                    ray_commit: "abc".into(),
                    python_version: "3.11.7".into(),
                },
            )),
        };
        let mut bytes = original.encode_to_vec();
        // An unknown top-level field (number 99, varint 5) must survive.
        bytes.extend_from_slice(&[0x98, 0x06, 0x05]);
        let rewritten = set_num_clients(&bytes, 42).unwrap();
        let decoded = DataResponse::decode(rewritten.as_ref()).unwrap();
        let Some(data_response::Type::ConnectionInfo(info)) = decoded.r#type else {
            panic!("connection_info lost: {decoded:?}");
        };
        assert_eq!(info.num_clients, 42);
        assert_eq!(info.ray_version, "2.60.0");
        assert_eq!(info.python_version, "3.11.7");
        assert_eq!(decoded.req_id, 3);
        assert!(
            rewritten.ends_with(&[0x98, 0x06, 0x05]),
            "unknown field dropped"
        );
    }

    #[test]
    fn other_messages_are_left_alone_and_garbage_is_refused() {
        let get = DataResponse {
            req_id: 9,
            r#type: Some(data_response::Type::Get(GetResponse {
                valid: true,
                data: vec![7; 1000],
                ..Default::default()
            })),
        }
        .encode_to_vec();
        assert_eq!(set_num_clients(&get, 5).unwrap().as_ref(), get.as_slice());
        let init = DataResponse {
            req_id: 1,
            r#type: Some(data_response::Type::Init(InitResponse {
                ok: true,
                msg: String::new(),
            })),
        }
        .encode_to_vec();
        assert_eq!(envelope(&init).unwrap().kind, Some(field::INIT));
        assert!(fields(&[0x0a, 0x05, 0x01]).is_err(), "length past the end");
        assert!(fields(&[0x0b]).is_err(), "group wire type");
    }
}

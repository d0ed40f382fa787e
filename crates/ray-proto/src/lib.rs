//! Ray's wire formats, as Ray 2.60 ships them, compiled for Rust.
//!
//! The descriptors come from the `*_pb2.py` modules of the `ray` wheel
//! (`scripts/ray-protos.py`), so the field numbers are Ray's own.

#![allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    rust_2018_idioms,
    missing_debug_implementations
)]

pub mod rpc {
    tonic::include_proto!("ray.rpc");

    pub mod events {
        tonic::include_proto!("ray.rpc.events");
    }
}

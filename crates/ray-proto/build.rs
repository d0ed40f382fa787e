//! Compiles Ray's protobuf descriptors (`proto/ray.desc`, written by
//! `scripts/ray-protos.py` from the installed Ray wheel) into Rust types and
//! tonic clients and servers. No `protoc` is needed: the descriptors are
//! already parsed.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = "proto/ray.desc";
    println!("cargo:rerun-if-changed={path}");
    let bytes = std::fs::read(path)?;
    let set = prost_types::FileDescriptorSet::decode(bytes.as_slice())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .generate_default_stubs(true)
        .compile_fds(set)?;
    Ok(())
}

//! Generates the `koder.ai.sandbox.v1` messages, server and client from the repository's
//! `proto/` with tonic-prost-build, and keeps the encoded descriptors for server reflection.
//! `protox` compiles the `.proto` files in Rust, so building needs no `protoc`.

use std::path::PathBuf;

const PROTO: &str = "koder/ai/sandbox/v1/sandbox.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.join(PROTO).display());
    let descriptors = protox::compile([PROTO], [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("sandbox_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The domain types hold env and metadata in BTreeMaps.
        .btree_map(".")
        .compile_fds(descriptors)?;
    Ok(())
}

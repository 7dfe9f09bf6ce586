//! Generates envd's message types from `proto/` with prost (the types) and pbjson (protobuf's
//! JSON mapping, which the Connect JSON codec speaks). `protox` compiles the `.proto` files in
//! Rust, so building needs no `protoc`.

use std::path::PathBuf;

const PROTOS: &[&str] = &["process/process.proto", "filesystem/filesystem.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    prost_build::Config::new()
        .btree_map(["."])
        // Our own, Z-normalised as protobuf's JSON mapping wants (see `proto::Timestamp`).
        .extern_path(".google.protobuf.Timestamp", "crate::proto::Timestamp")
        .compile_fds(descriptors.clone())?;
    let set = prost::Message::encode_to_vec(&descriptors);
    pbjson_build::Builder::new()
        .register_descriptors(&set)?
        .out_dir(&out)
        .emit_fields()
        .ignore_unknown_fields()
        .btree_map(["."])
        .build(&[".process", ".filesystem"])?;
    Ok(())
}

//! Generates the protocol types from `proto/pedelec/v1/*.proto` with a vendored
//! `protoc`, so a fresh machine needs nothing installed. The gRPC service code
//! is generated only with the `grpc` feature; the messages are identical either way.

use std::path::PathBuf;

const PROTOS: &[&str] = &["pedelec/v1/session.proto", "pedelec/v1/core.proto", "pedelec/v1/native.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("pedelec_descriptors.bin");
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.file_descriptor_set_path(&descriptors);

    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure().build_server(grpc).build_client(grpc).build_transport(grpc).compile_with_config(
        config,
        &protos,
        &[root],
    )?;

    let set = std::fs::read(&descriptors)?;
    pbjson_build::Builder::new().register_descriptors(&set)?.ignore_unknown_fields().build(&[".pedelec"])?;
    Ok(())
}

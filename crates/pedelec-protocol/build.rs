//! Generates the protocol types from `proto/pedelec/v1/*.proto` with a vendored
//! `protoc`, so a fresh machine needs nothing installed. The gRPC service code
//! is generated only with the `grpc` feature; the messages are identical either way.
//!
//! The workspace's `proto/` is the one source. The crate's own `proto` is a
//! symlink to it, which `cargo package` follows, so a packaged crate carries
//! the files themselves; where the symlink is not one (a checkout made without
//! symlinks, e.g. git on Windows), the workspace's directory is read directly.

use std::path::PathBuf;

const PROTOS: &[&str] = &["pedelec/v1/session.proto", "pedelec/v1/core.proto", "pedelec/v1/native.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = [crate_dir.join("proto"), crate_dir.join("../../proto")]
        .into_iter()
        .find(|dir| PROTOS.iter().all(|p| dir.join(p).is_file()))
        .ok_or("no proto/pedelec/v1 in the crate (its `proto` symlink) or in the workspace")?;
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

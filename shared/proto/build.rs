//! Compiles proto/engram/v1 with a vendored protoc, so a fresh machine needs no protobuf install
//! (a `PROTOC` in the environment still wins).

use std::path::PathBuf;

const PROTOS: [&str; 5] = ["common", "ingest", "retrieval", "review", "events"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time: `env!` would bake in the directory the build script was compiled in, and a
    // build script shared through CARGO_TARGET_DIR by another checkout (CI's clone) would then
    // compile that checkout's protos, or fail once it is gone.
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?)
        .join("../../proto")
        .canonicalize()?;
    let files = PROTOS.map(|name| proto_root.join(format!("engram/v1/{name}.proto")));

    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);

    let descriptor_path = PathBuf::from(std::env::var("OUT_DIR")?).join("engram_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        // Our codec: a request that is not a valid message is INVALID_ARGUMENT (src/codec.rs).
        .codec_path("crate::codec::EngramCodec")
        .compile_with_config(config, &files, std::slice::from_ref(&proto_root))?;

    // Relative to this package, not the canonical paths above: cargo shares one build of this
    // script between checkouts that share CARGO_TARGET_DIR (CI's clone and the working copy), and
    // an absolute path would make it watch the other checkout's protos and miss changes here.
    for name in PROTOS {
        println!("cargo:rerun-if-changed=../../proto/engram/v1/{name}.proto");
    }
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}

//! Compiles proto/vworkspace/status/v1/status.proto with protox (pure Rust: no protoc
//! needed on the build machine) and generates the tonic client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let file = "vworkspace/status/v1/status.proto";
    println!("cargo:rerun-if-changed={proto_root}/{file}");
    let descriptors = protox::compile([file], [proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

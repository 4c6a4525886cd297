//! Generates the gRPC code with the protoc that ships inside `protoc-bin-vendored`, so a fresh machine needs no
//! system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure().compile_protos(&["proto/drover.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/drover.proto");
    Ok(())
}

//! Compiles the kubelet device plugin API and the pod resources API (List) with protox (pure Rust): building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/api.proto");
    println!("cargo:rerun-if-changed=proto/podresources.proto");
    let descriptors = protox::compile(["api.proto", "podresources.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

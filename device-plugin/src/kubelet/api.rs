//! The kubelet device plugin API `v1beta1`, generated at build time from `proto/api.proto`.
//!
//! Public so that tests (the fake kubelet) and other tools speak the same messages.

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The API version a plugin sends in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// Default device-plugin directory on a node.
pub use hami_shared::names::DEVICE_PLUGIN_DIR as DEFAULT_KUBELET_DIR;
/// kubelet's registration socket, inside the device-plugin directory.
pub use hami_shared::names::KUBELET_SOCKET;
/// `Device.health` of a usable device.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";

/// Connects a gRPC channel to a unix socket (the URI is a placeholder tonic requires).
pub async fn connect_unix(
    path: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

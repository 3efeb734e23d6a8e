//! kubelet's pod resources API (`v1`, `List`): which container holds which `hami.io/preload` slot.
//! Generated at build time from `proto/podresources.proto`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::observe::Owner;

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
pub mod v1 {
    tonic::include_proto!("v1");
}

/// kubelet's pod resources socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The slot folder → owner map from a `List` answer: for each container holding `resource`,
/// its lowest slot ID that `is_slot` accepts (the one `Allocate` mounts).
#[must_use]
pub fn slot_owners(
    list: &v1::ListPodResourcesResponse,
    resource: &str,
    is_slot: impl Fn(&str) -> bool,
) -> BTreeMap<String, Owner> {
    let mut owners = BTreeMap::new();
    for pod in &list.pod_resources {
        for c in &pod.containers {
            let slot = c
                .devices
                .iter()
                .filter(|d| d.resource_name == resource)
                .flat_map(|d| d.device_ids.iter())
                .filter(|id| is_slot(id))
                .min_by(|a, b| slot_order(a, b));
            if let Some(slot) = slot {
                owners.insert(
                    slot.clone(),
                    Owner {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        uid: None,
                        container: c.name.clone(),
                    },
                );
            }
        }
    }
    owners
}

use super::slot_id::slot_order;

/// `List` on kubelet's socket, within `timeout`.
///
/// # Errors
/// A message naming the socket: not reachable, or the call failed.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<v1::ListPodResourcesResponse, PodResourcesError> {
    let at = || socket.to_path_buf();
    let call = async {
        let channel = crate::kubelet::api::connect_unix(socket)
            .await
            .map_err(|source| PodResourcesError::Connect {
                socket: at(),
                source,
            })?;
        v1::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(v1::ListPodResourcesRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|source| PodResourcesError::List {
                socket: at(),
                source,
            })
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| PodResourcesError::Timeout {
            socket: at(),
            timeout,
        })?
}

/// Why kubelet's pod resources could not be listed; each names the socket.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket cannot be reached.
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect {
        /// kubelet's socket.
        socket: std::path::PathBuf,
        /// Why.
        source: tonic::transport::Error,
    },
    /// `List` failed.
    #[error("{}: List: {source}", socket.display())]
    List {
        /// kubelet's socket.
        socket: std::path::PathBuf,
        /// What kubelet answered.
        source: tonic::Status,
    },
    /// `List` did not answer in time.
    #[error("{}: List did not answer within {timeout:?}", socket.display())]
    Timeout {
        /// kubelet's socket.
        socket: std::path::PathBuf,
        /// The time allowed.
        timeout: Duration,
    },
}

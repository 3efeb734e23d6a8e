//! The cluster side of `run`: the API server client, the watch-fed pod cache, the pending-pod
//! lookup of `GetPreferredAllocation` and the `hami.io/node-nvidia-register` handshake.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::tasks::TaskStop;
use crate::allocation::shell::pod_lookup::cache::PodCache;
use crate::allocation::shell::pod_lookup::locator::KubePendingPod;
use crate::cli::RunArgs;
use crate::gpu::devices::DeviceTable;
use crate::kubelet::service::{NoPendingPod, PendingPodDevices, SharedState};
use crate::metrics::Metrics;
use crate::node_register::{self, NodeRegisterConfig};
use crate::settings::PluginSettings;

/// The API server client (none with `--skip-node-register`) and, with one, the watch-fed view of
/// the pods bound to this node, so that Allocate and GetPreferredAllocation find their pod
/// without a LIST.
pub(super) async fn connect(
    args: &RunArgs,
    client: Option<kube::Client>,
    node_name: &str,
    tasks: &TaskStop,
) -> crate::Result<(Option<kube::Client>, Option<Arc<PodCache>>)> {
    let client = match client {
        _ if args.skip_node_register => None,
        Some(client) => Some(client),
        None => Some(kube::Client::try_default().await?),
    };
    let pod_cache = client.as_ref().map(|client| {
        let cache = PodCache::new();
        tasks.spawn(Arc::clone(&cache).run(
            client.clone(),
            node_name.to_owned(),
            tasks.until_stopped(),
        ));
        cache
    });
    Ok((client, pod_cache))
}

/// Where `GetPreferredAllocation` finds a pod's pending devices.
pub(super) fn pending_pods(
    client: Option<&kube::Client>,
    pod_cache: Option<Arc<PodCache>>,
    node_name: &str,
) -> Arc<dyn PendingPodDevices> {
    match (client, pod_cache) {
        (Some(client), Some(cache)) => Arc::new(
            KubePendingPod::new(client.clone(), node_name.to_owned()).with_pod_cache(cache),
        ),
        (Some(client), None) => Arc::new(KubePendingPod::new(client.clone(), node_name.to_owned())),
        (None, _) => Arc::new(NoPendingPod),
    }
}

/// The `hami.io/node-nvidia-register` handshake, until `stop`. The HAMi scheduler schedules
/// resourceCountName: the node annotation lists that resource's devices (with `single` and every
/// GPU in MIG mode, the MIG devices under nvidia.com/gpu), and none under `mixed` when every GPU
/// is in MIG mode (HAMi's MIG plugins would each overwrite the annotation with their own
/// devices).
pub(super) fn spawn_node_register(
    client: kube::Client,
    config: NodeRegisterConfig,
    settings: &PluginSettings,
    states: &[(String, Arc<SharedState>)],
    metrics: &Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let registered = states
        .iter()
        .find(|(name, _)| *name == settings.resource_name)
        .map(|(_, state)| state.table.subscribe());
    let (no_devices, unregistered) = watch::channel(DeviceTable::shares(
        Vec::new(),
        settings.split_count(),
        settings.numa_topology,
    ));
    let table = registered.unwrap_or(unregistered);
    let metrics = Arc::clone(metrics);
    tokio::spawn(async move {
        // The empty table's sender lives as long as the handshake reads it.
        let _no_devices = no_devices;
        node_register::run_node_register_observed(client, config, table, &metrics, stop).await;
    })
}

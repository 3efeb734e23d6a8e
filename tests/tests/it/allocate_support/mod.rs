//! The in-process world of the allocation tests and benchmark: the test API server, the fake
//! kubelet, the device plugin (inventory-file backend) with the real `Allocator`, the webhook's
//! decision applied at admission, and a stand-in for the HAMi scheduler.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hami_device_plugin::allocation::plan::AllocationSettings;
use hami_device_plugin::allocation::plan::codec::{ContainerDevice, PodDevices};
use hami_device_plugin::allocation::shell::executor::{Allocator, TimingLog};
use hami_device_plugin::allocation::shell::pod_lookup::cache::PodCache;
use hami_device_plugin::allocation::shell::pod_lookup::locator::KubePendingPod;
use hami_device_plugin::gpu::devices::DeviceTable;
use hami_device_plugin::gpu::inventory::{DeviceFilter, FileInventory, GpuInventory};
use hami_device_plugin::kubelet::api::v1beta1;
use hami_device_plugin::kubelet::plugin::Lifecycle;
use hami_device_plugin::kubelet::service::SharedState;
use hami_tests::apiserver::ApiServer;
use hami_tests::inventory::TWO_H200;
use hami_tests::kubelet::{FakeKubelet, PluginClient, RunningPlugin};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

pub const NODE: &str = "gpu-0";
pub const NS: &str = "default";
pub const GPU_A: &str = "GPU-11111111-aaaa-4000-8000-000000000001";
pub const GPU_B: &str = "GPU-22222222-bbbb-4000-8000-000000000002";
pub const WAIT: Duration = Duration::from_secs(10);

/// A device as the scheduler assigns it.
pub fn dev(uuid: &str, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: uuid.into(),
        kind: "NVIDIA".into(),
        memory_mib: mem,
        cores,
        extra: vec![],
    }
}

/// One container of a test pod: name, GPUs, gpumem, gpucores, priority.
#[derive(Debug, Clone, Copy)]
pub struct Ctr<'a> {
    pub name: &'a str,
    pub gpus: u32,
    pub mem: u64,
    pub cores: u32,
    pub priority: Option<i32>,
    pub init: bool,
}

impl<'a> Ctr<'a> {
    pub fn gpu(name: &'a str, mem: u64, cores: u32) -> Self {
        Self {
            name,
            gpus: 1,
            mem,
            cores,
            priority: None,
            init: false,
        }
    }

    pub fn plain(name: &'a str) -> Self {
        Self {
            name,
            gpus: 0,
            mem: 0,
            cores: 0,
            priority: None,
            init: false,
        }
    }
}

/// A HAMi GPU pod as a user writes it.
pub fn gpu_pod(name: &str, containers: &[Ctr<'_>], annotations: Value) -> Value {
    let spec = |c: &Ctr<'_>| {
        let mut limits = serde_json::Map::new();
        if c.gpus > 0 {
            limits.insert("nvidia.com/gpu".into(), json!(c.gpus.to_string()));
            limits.insert("nvidia.com/gpumem".into(), json!(c.mem.to_string()));
            limits.insert("nvidia.com/gpucores".into(), json!(c.cores.to_string()));
            if let Some(p) = c.priority {
                limits.insert("nvidia.com/priority".into(), json!(p.to_string()));
            }
        }
        json!({"name": c.name, "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
               "resources": {"limits": limits}})
    };
    let init: Vec<Value> = containers.iter().filter(|c| c.init).map(spec).collect();
    let main: Vec<Value> = containers.iter().filter(|c| !c.init).map(spec).collect();
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"containers": main}
    });
    if !init.is_empty() {
        pod["spec"]["initContainers"] = json!(init);
    }
    pod
}

/// The webhook's decision for `pod`, applied (as the API server applies a mutating webhook's
/// JSONPatch before storing the pod).
pub fn apply_webhook(mut pod: Value) -> Value {
    let mut settings = hami_webhook::Settings::default();
    settings.nvidia.gpu_core_policy = hami_shared::values::CorePolicy::Force;
    let text = serde_json::to_string(&pod).unwrap();
    let view: hami_webhook::wire::pod::Pod<'_> = serde_json::from_str(&text).unwrap();
    match hami_webhook::decide_pod(
        &view,
        Some(NS),
        &settings,
        &hami_webhook::policy::basis::NoBasis,
    ) {
        hami_webhook::Decision::Allow { patch, .. } => {
            let patch: json_patch::Patch =
                serde_json::from_value(serde_json::to_value(&patch).unwrap()).unwrap();
            json_patch::patch(&mut pod, &patch).unwrap();
            pod
        }
        other => panic!("webhook did not admit the pod: {other:?}"),
    }
}

/// The running world.
pub struct Harness {
    pub server: ApiServer,
    pub kubelet: FakeKubelet,
    pub plugin: RunningPlugin,
    pub client: PluginClient,
    pub hook: PathBuf,
    pub timings: Arc<TimingLog>,
    /// The allocator's view of the node's pods (fed by a pod watch unless started with
    /// [`PodView::Manual`]).
    pub cache: Arc<PodCache>,
    pub metrics: Arc<hami_device_plugin::metrics::Metrics>,
    pub dir: tempfile::TempDir,
}

/// How the allocator's pod cache is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodView {
    /// By a pod watch, as `run` does (waits for the first list).
    Watch,
    /// Only by the test (and the allocator's own patches): lets a test make it stale.
    Manual,
    /// No cache: every pod is read from the API server (the benchmark's baseline).
    Off,
}

impl Harness {
    /// Starts everything with the settings `make` returns for the hook path.
    pub async fn start(make: impl FnOnce(&Path) -> AllocationSettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, make).await
    }

    /// Same, with the pod cache fed as `view` says.
    pub async fn start_with(view: PodView, make: impl FnOnce(&Path) -> AllocationSettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_full(dir, view, make).await
    }

    /// Same, in `dir` (the hook path is `dir/hook`).
    pub async fn start_in(
        dir: tempfile::TempDir,
        make: impl FnOnce(&Path) -> AllocationSettings,
    ) -> Self {
        Self::start_full(dir, PodView::Watch, make).await
    }

    pub async fn start_full(
        dir: tempfile::TempDir,
        view: PodView,
        make: impl FnOnce(&Path) -> AllocationSettings,
    ) -> Self {
        let hook = dir.path().join("hook");
        hami_tests::hook::install_stand_in(&hook.join("vgpu")).unwrap();
        let kubelet_dir = dir.path().join("kubelet");
        std::fs::create_dir_all(&kubelet_dir).unwrap();
        let inventory = dir.path().join("inventory.yaml");
        std::fs::write(&inventory, TWO_H200).unwrap();
        let server = ApiServer::start().await.unwrap();
        server
            .seed(&hami_tests::apiserver::fixtures::gpu_node(NODE, 0).unwrap())
            .unwrap();
        let settings = make(&hook);
        let timings = Arc::new(TimingLog::default());
        let cache = PodCache::new();
        if view == PodView::Watch {
            tokio::spawn(Arc::clone(&cache).run(
                server.client(),
                NODE.to_owned(),
                std::future::pending(),
            ));
            let deadline = tokio::time::Instant::now() + WAIT;
            while !cache.is_synced() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "pod cache never synced"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let metrics = Arc::new(hami_device_plugin::metrics::Metrics::new());
        let mut allocator = Allocator::new(server.client(), NODE, settings)
            .with_timings(timings.clone())
            .with_metrics(Arc::clone(&metrics));
        if view != PodView::Off {
            allocator = allocator.with_pod_cache(Arc::clone(&cache));
        }
        let gpus = FileInventory::new(&inventory).discover().unwrap();
        let (table, _) = DeviceTable::build(gpus, &DeviceFilter::default(), 10, false).unwrap();
        let state = SharedState::new(
            table,
            true,
            Arc::new(allocator),
            Arc::new(if view == PodView::Off {
                KubePendingPod::new(server.client(), NODE)
            } else {
                KubePendingPod::new(server.client(), NODE).with_pod_cache(Arc::clone(&cache))
            }),
        );
        let kubelet = FakeKubelet::start(&kubelet_dir).await.unwrap();
        let mut lifecycle = Lifecycle::new(&kubelet_dir, "nvidia.com/gpu");
        lifecycle.watch_interval = Duration::from_millis(50);
        lifecycle.backoff_min = Duration::from_millis(20);
        let plugin = RunningPlugin::start(lifecycle, state);
        kubelet.wait_for_registration(1, WAIT).await.unwrap();
        let client = kubelet.plugin().await.unwrap();
        Self {
            server,
            kubelet,
            plugin,
            client,
            hook,
            timings,
            cache,
            metrics,
            dir,
        }
    }

    /// Stops everything and keeps the directory (benchmarks: deleting thousands of files right
    /// away would slow the next file creations on ext4; see bench/allocate/run.sh).
    pub fn keep_dir(self) -> PathBuf {
        self.dir.keep()
    }

    pub fn containers_dir(&self) -> PathBuf {
        self.hook.join("vgpu/containers")
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.server.client(), NS)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.server.client())
    }

    /// Admission (the webhook's patch applied), creation, and `status.phase: Pending`.
    pub async fn admit(&self, pod: Value) -> Pod {
        self.create(apply_webhook(pod)).await
    }

    /// Creation without the webhook (what a pod that bypassed admission looks like).
    pub async fn create(&self, pod: Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let created = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let name = created.metadata.name.clone().unwrap();
        self.pods()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Pending"}})),
            )
            .await
            .unwrap()
    }

    /// The HAMi scheduler: device annotations, the node lock (when `lock`), bind-phase
    /// allocating, bind-time, and the binding (`spec.nodeName`).
    pub async fn schedule(&self, pod: &Pod, containers: &[Vec<ContainerDevice>], lock: bool) {
        let name = pod.metadata.name.clone().unwrap();
        let value = PodDevices::from_containers(containers).encode();
        let now = k8s_openapi::jiff::Timestamp::now();
        if lock {
            self.nodes()
                .patch(
                    NODE,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "hami.io/mutex.lock": format!("{},{NS},{name}", now.strftime("%Y-%m-%dT%H:%M:%SZ"))
                    }}})),
                )
                .await
                .unwrap();
        }
        self.pods()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"annotations": {
                        "hami.io/vgpu-node": NODE,
                        "hami.io/vgpu-time": now.as_second().to_string(),
                        "hami.io/vgpu-devices-to-allocate": value,
                        "hami.io/vgpu-devices-allocated": value,
                        "hami.io/bind-phase": "allocating",
                        "hami.io/bind-time": now.as_second().to_string(),
                    }}
                })),
            )
            .await
            .unwrap();
        // The binding, as the scheduler makes it (spec.nodeName cannot be patched).
        bind(&self.pods(), &name, NODE).await;
    }

    /// kubelet's `Allocate` for one container with these device IDs.
    pub async fn allocate(
        &self,
        ids: &[&str],
    ) -> Result<v1beta1::ContainerAllocateResponse, tonic::Status> {
        let ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
        let mut response = self.client.clone().allocate(&[ids]).await?;
        assert_eq!(response.container_responses.len(), 1);
        Ok(response.container_responses.remove(0))
    }

    pub async fn pod(&self, name: &str) -> Pod {
        self.pods().get(name).await.unwrap()
    }

    pub async fn node_lock(&self) -> Option<String> {
        self.nodes()
            .get(NODE)
            .await
            .unwrap()
            .metadata
            .annotations
            .and_then(|mut a| a.remove("hami.io/mutex.lock"))
    }

    /// The Events on `pod` (`events.k8s.io/v1`, as kube's `Recorder` writes them).
    pub async fn events(&self, pod: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.server.client(), NS);
        events
            .list(&ListParams::default().fields(&format!("regarding.name={pod}")))
            .await
            .unwrap()
            .items
    }
}

/// `POST pods/{name}/binding` to `node`: how a scheduler sets `spec.nodeName`.
pub async fn bind(pods: &Api<Pod>, name: &str, node: &str) {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}
    });
    let _: Value = pods
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await
        .unwrap();
}

pub fn annotation(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.annotations.as_ref()?.get(key).cloned()
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

/// Every name in a directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

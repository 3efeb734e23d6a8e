//! The device plugin against the fake kubelet: registration, device lists, health, kubelet
//! restarts, lost and stale sockets, shutdown, preferred allocation and the default `Allocate`.
//!
//! With `HAMI_TEST_NVML=1` the registration test uses the NVML backend (real GPUs) instead of the
//! inventory file, and prints what it advertised.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_device_plugin::gpu::devices::DeviceTable;
use hami_device_plugin::gpu::health::{
    HealthCheckPolicy, HealthWatch, Registration as Watched, Wait, XidEvent, XidEventSource,
    watch_xids,
};
use hami_device_plugin::gpu::inventory::{DeviceFilter, FileInventory, Gpu, GpuInventory};
use hami_device_plugin::kubelet::plugin::Lifecycle;
use hami_device_plugin::kubelet::service::{
    NoPendingPod, PendingPodDevices, SharedState, VisibleDevicesOnly, spawn_health_updates,
};
use hami_tests::kubelet::{FakeKubelet, Registration, RunningPlugin};

const WAIT: Duration = Duration::from_secs(10);

const INVENTORY: &str = "
- uuid: GPU-11111111-aaaa-4000-8000-000000000001
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 0
- uuid: GPU-22222222-bbbb-4000-8000-000000000002
  name: Tesla P4
  memoryMib: 7680
  numaNode: 1
";

fn write_inventory(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("inventory.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn lifecycle(dir: &Path) -> Lifecycle {
    let mut lifecycle = Lifecycle::new(dir, "nvidia.com/gpu");
    lifecycle.watch_interval = Duration::from_millis(50);
    lifecycle.backoff_min = Duration::from_millis(20);
    lifecycle.backoff_max = Duration::from_millis(500);
    lifecycle
}

fn state(
    gpus: Vec<Gpu>,
    split: u32,
    filter: &DeviceFilter,
    pending: Arc<dyn PendingPodDevices>,
) -> Arc<SharedState> {
    let (table, _) = DeviceTable::build(gpus, filter, split, true).unwrap();
    SharedState::new(table, true, Arc::new(VisibleDevicesOnly), pending)
}

fn file_gpus(dir: &Path) -> Vec<Gpu> {
    FileInventory::new(write_inventory(dir, INVENTORY))
        .discover()
        .unwrap()
}

/// The GPUs for the registration test: NVML when HAMI_TEST_NVML=1, else the inventory file.
fn gpus_for_registration(dir: &Path) -> (Vec<Gpu>, &'static str) {
    if std::env::var("HAMI_TEST_NVML").is_ok_and(|v| v == "1") {
        let nvml = hami_device_plugin::gpu::nvml::NvmlInventory::init()
            .expect("HAMI_TEST_NVML=1 but NVML is unavailable");
        (nvml.discover().unwrap(), "nvml")
    } else {
        (file_gpus(dir), "file")
    }
}

#[tokio::test]
async fn registers_serves_devices_and_answers_kubelet_calls() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (gpus, backend) = gpus_for_registration(dir.path());
    let split = 4;
    let plugin = RunningPlugin::start(
        lifecycle(dir.path()),
        state(
            gpus.clone(),
            split,
            &DeviceFilter::default(),
            Arc::new(NoPendingPod),
        ),
    );

    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    assert_eq!(registration.error, None);
    assert_eq!(registration.request.version, "v1beta1");
    assert_eq!(registration.request.endpoint, "nvidia-gpu.sock");
    assert_eq!(registration.request.resource_name, "nvidia.com/gpu");
    let options = registration.request.options.unwrap();
    assert!(!options.pre_start_required);
    assert!(options.get_preferred_allocation_available);
    assert_eq!(
        registration.options,
        Some(options),
        "GetDevicePluginOptions agrees with the registration"
    );

    let devices = registration.devices().unwrap();
    assert_eq!(devices.len(), gpus.len() * split as usize);
    for (gpu, shares) in gpus.iter().zip(devices.chunks(split as usize)) {
        let ids: Vec<&str> = shares.iter().map(|d| d.id.as_str()).collect();
        let expected: Vec<String> = (0..split).map(|i| format!("{}-{i}", gpu.uuid)).collect();
        assert_eq!(ids, expected);
        assert!(shares.iter().all(|d| d.health == "Healthy"));
        let numa = shares[0].topology.as_ref().map(|t| t.nodes[0].id);
        assert_eq!(numa, gpu.numa_node);
    }
    println!("backend={backend} gpus={}", gpus.len());
    for gpu in &gpus {
        println!(
            "gpu index={} uuid={} name={:?} memory_mib={} numa={:?} mig={}",
            gpu.index, gpu.uuid, gpu.name, gpu.memory_mib, gpu.numa_node, gpu.mig_enabled
        );
    }
    println!(
        "devices advertised={} first={} last={}",
        devices.len(),
        devices[0].id,
        devices[devices.len() - 1].id
    );

    // kubelet's other calls.
    let mut client = kubelet.plugin().await.unwrap();
    let available: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let preferred = client.preferred(&available, &[], 2).await.unwrap();
    assert_eq!(
        preferred,
        available[..2].to_vec(),
        "no pending pod: the first available"
    );
    let first = gpus[0].uuid.clone();
    let response = client
        .allocate(&[vec![format!("{first}-1")]])
        .await
        .unwrap();
    assert_eq!(response.container_responses.len(), 1);
    assert_eq!(
        response.container_responses[0]
            .envs
            .get("NVIDIA_VISIBLE_DEVICES"),
        Some(&first)
    );
    let refused = client
        .allocate(&[vec!["GPU-not-ours-0".to_owned()]])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("GPU-not-ours-0"),
        "{}",
        refused.message()
    );

    plugin.shutdown().await.unwrap();
    assert!(
        !dir.path().join("nvidia-gpu.sock").exists(),
        "shutdown removes the socket"
    );
}

#[derive(Debug)]
struct Scheduled(Vec<String>);

#[tonic::async_trait]
impl PendingPodDevices for Scheduled {
    async fn wanted_uuids(&self) -> Result<Vec<String>, tonic::Status> {
        Ok(self.0.clone())
    }
}

#[tokio::test]
async fn preferred_allocation_follows_the_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let gpus = file_gpus(dir.path());
    let second = gpus[1].uuid.clone();
    let _plugin = RunningPlugin::start(
        lifecycle(dir.path()),
        state(
            gpus,
            2,
            &DeviceFilter::default(),
            Arc::new(Scheduled(vec![second.clone()])),
        ),
    );
    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let available: Vec<String> = registration
        .devices()
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let mut client = kubelet.plugin().await.unwrap();
    assert_eq!(
        client.preferred(&available, &[], 1).await.unwrap(),
        vec![format!("{second}-0")]
    );
}

#[tokio::test]
async fn split_count_and_filters_shape_the_device_list() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let gpus = file_gpus(dir.path());
    let kept = gpus[1].uuid.clone();
    let filter = DeviceFilter {
        uuids: vec![],
        indices: vec![0],
    };
    let _plugin = RunningPlugin::start(
        lifecycle(dir.path()),
        state(gpus, 3, &filter, Arc::new(NoPendingPod)),
    );
    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let ids: Vec<String> = registration
        .devices()
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(
        ids,
        vec![
            format!("{kept}-0"),
            format!("{kept}-1"),
            format!("{kept}-2")
        ]
    );
}

#[tokio::test]
async fn health_change_in_the_inventory_pushes_a_new_list() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let path = write_inventory(dir.path(), INVENTORY);
    let inventory = FileInventory::new(&path).with_poll_interval(Duration::from_millis(20));
    let gpus = inventory.discover().unwrap();
    let state = state(
        gpus.clone(),
        2,
        &DeviceFilter::default(),
        Arc::new(NoPendingPod),
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    inventory
        .watch_health(&gpus, &HealthCheckPolicy::default(), tx)
        .unwrap();
    spawn_health_updates(state.clone(), rx);
    let _plugin = RunningPlugin::start(lifecycle(dir.path()), state);
    kubelet.wait_for_registration(1, WAIT).await.unwrap();

    // The second GPU turns unhealthy.
    std::fs::write(&path, format!("{INVENTORY}  healthy: false\n")).unwrap();
    let registration = kubelet.wait_for_device_lists(1, 2, WAIT).await.unwrap();
    let list = registration.devices().unwrap();
    let health: Vec<(&str, &str)> = list
        .iter()
        .map(|d| (d.id.as_str(), d.health.as_str()))
        .collect();
    let a = &gpus[0].uuid;
    let b = &gpus[1].uuid;
    assert_eq!(
        health,
        vec![
            (format!("{a}-0").as_str(), "Healthy"),
            (format!("{a}-1").as_str(), "Healthy"),
            (format!("{b}-0").as_str(), "Unhealthy"),
            (format!("{b}-1").as_str(), "Unhealthy"),
        ]
    );
}

/// NVML's event set, faked: registrations fail for the UUIDs in `lost`; waits return what the
/// test feeds, else time out.
struct FakeNvmlEvents {
    lost: Vec<String>,
    feed: std::sync::mpsc::Receiver<Wait>,
}

impl XidEventSource for FakeNvmlEvents {
    fn register(&mut self, uuid: &str) -> Watched {
        if self.lost.iter().any(|l| l == uuid) {
            Watched::Failed("GPU is lost".to_owned())
        } else {
            Watched::Watching
        }
    }
    fn wait(&mut self, timeout: Duration) -> Wait {
        match self.feed.recv_timeout(timeout) {
            Ok(wait) => wait,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Wait::Timeout,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(timeout);
                Wait::Timeout
            }
        }
    }
}

fn health_of(list: &[hami_device_plugin::kubelet::api::v1beta1::Device]) -> Vec<(String, String)> {
    list.iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

/// HAMi's `checkHealth` through a fake NVML: an application Xid changes nothing, a critical Xid
/// makes its GPU Unhealthy, a failed wait makes every GPU Unhealthy (fail closed), and kubelet's
/// `ListAndWatch` sees each change.
#[tokio::test]
async fn xid_events_and_event_errors_reach_kubelet_as_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let gpus = file_gpus(dir.path());
    let (a, b) = (gpus[0].uuid.clone(), gpus[1].uuid.clone());
    let state = state(gpus, 1, &DeviceFilter::default(), Arc::new(NoPendingPod));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    spawn_health_updates(state.clone(), rx);
    let (feed, events) = std::sync::mpsc::channel();
    let watch = HealthWatch {
        uuids: vec![a.clone(), b.clone()],
        policy: HealthCheckPolicy::new(None, None),
        timeout: Duration::from_millis(20),
        error_pause: Duration::ZERO,
    };
    std::thread::spawn(move || {
        let mut source = FakeNvmlEvents {
            lost: Vec::new(),
            feed: events,
        };
        watch_xids(&mut source, &watch, &tx);
    });
    let _plugin = RunningPlugin::start(lifecycle(dir.path()), state);
    let first = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let healthy = |uuid: &str, h: &str| (format!("{uuid}-0"), h.to_owned());
    assert_eq!(
        health_of(first.devices().unwrap()),
        [healthy(&a, "Healthy"), healthy(&b, "Healthy")]
    );

    let xid = |uuid: &str, xid: u64| {
        Wait::Event(XidEvent {
            uuid: Ok(uuid.to_owned()),
            critical_xid: true,
            xid,
        })
    };
    feed.send(xid(&a, 13)).unwrap(); // an application's fault: ignored
    feed.send(xid(&b, 79)).unwrap(); // fallen off the bus
    let second = kubelet.wait_for_device_lists(1, 2, WAIT).await.unwrap();
    assert_eq!(
        health_of(second.devices().unwrap()),
        [healthy(&a, "Healthy"), healthy(&b, "Unhealthy")]
    );

    feed.send(Wait::Failed("Unknown Error".to_owned())).unwrap();
    let third = kubelet.wait_for_device_lists(1, 3, WAIT).await.unwrap();
    assert_eq!(
        health_of(third.devices().unwrap()),
        [healthy(&a, "Unhealthy"), healthy(&b, "Unhealthy")]
    );
}

/// A GPU whose events cannot be registered is Unhealthy from the start (HAMi marks it so).
#[tokio::test]
async fn a_gpu_that_cannot_be_watched_is_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let gpus = file_gpus(dir.path());
    let (a, b) = (gpus[0].uuid.clone(), gpus[1].uuid.clone());
    let state = state(gpus, 1, &DeviceFilter::default(), Arc::new(NoPendingPod));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    spawn_health_updates(state.clone(), rx);
    let (_feed, events) = std::sync::mpsc::channel();
    let watch = HealthWatch {
        uuids: vec![a.clone(), b.clone()],
        policy: HealthCheckPolicy::default(),
        timeout: Duration::from_millis(20),
        error_pause: Duration::ZERO,
    };
    let lost = vec![a.clone()];
    std::thread::spawn(move || {
        let mut source = FakeNvmlEvents { lost, feed: events };
        watch_xids(&mut source, &watch, &tx);
    });
    let _plugin = RunningPlugin::start(lifecycle(dir.path()), state);
    let registration = kubelet
        .wait_until("GPU a Unhealthy", WAIT, |s| {
            s.first()
                .and_then(Registration::devices)
                .is_some_and(|d| d.iter().any(|d| d.health == "Unhealthy"))
        })
        .await
        .unwrap();
    assert_eq!(
        health_of(registration[0].devices().unwrap()),
        [
            (format!("{a}-0"), "Unhealthy".to_owned()),
            (format!("{b}-0"), "Healthy".to_owned())
        ]
    );
}

#[tokio::test]
async fn kubelet_restart_leads_to_re_registration() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    // The binary's defaults (250 ms directory checks, 100 ms … 2 s backoff): the time printed
    // below is the one a node sees.
    let defaults = Lifecycle::new(dir.path(), "nvidia.com/gpu");
    let _plugin = RunningPlugin::start(
        defaults,
        state(
            file_gpus(dir.path()),
            2,
            &DeviceFilter::default(),
            Arc::new(NoPendingPod),
        ),
    );
    kubelet.wait_for_registration(1, WAIT).await.unwrap();

    let restarted = kubelet.restart().await.unwrap();
    assert!(
        !dir.path().join("nvidia-gpu.sock").exists(),
        "restart deleted the plugin socket"
    );
    let again = kubelet.wait_for_registration(2, WAIT).await.unwrap();
    assert_eq!(again.generation, 1, "registered with the new kubelet");
    assert_eq!(again.error, None);
    assert_eq!(again.devices().map(<[_]>::len), Some(4));
    let took = again.received_at.duration_since(restarted);
    println!(
        "re-registration after kubelet restart: {} ms",
        took.as_millis()
    );
    assert!(dir.path().join("nvidia-gpu.sock").exists());
}

#[tokio::test]
async fn lost_socket_is_bound_again() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let _plugin = RunningPlugin::start(
        lifecycle(dir.path()),
        state(
            file_gpus(dir.path()),
            1,
            &DeviceFilter::default(),
            Arc::new(NoPendingPod),
        ),
    );
    kubelet.wait_for_registration(1, WAIT).await.unwrap();

    let removed = Instant::now();
    std::fs::remove_file(dir.path().join("nvidia-gpu.sock")).unwrap();
    let again = kubelet.wait_for_registration(2, WAIT).await.unwrap();
    assert_eq!(again.error, None, "kubelet dialled the new socket");
    assert_eq!(again.generation, 0, "same kubelet");
    println!(
        "re-bind and re-registration after socket removal: {} ms",
        again.received_at.duration_since(removed).as_millis()
    );
}

#[tokio::test]
async fn stale_socket_file_from_an_earlier_run_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    // A socket left behind by a killed plugin: bound, never unlinked.
    let stale = std::os::unix::net::UnixListener::bind(dir.path().join("nvidia-gpu.sock")).unwrap();
    drop(stale);
    assert!(dir.path().join("nvidia-gpu.sock").exists());
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let _plugin = RunningPlugin::start(
        lifecycle(dir.path()),
        state(
            file_gpus(dir.path()),
            1,
            &DeviceFilter::default(),
            Arc::new(NoPendingPod),
        ),
    );
    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    assert_eq!(registration.error, None);
    assert_eq!(registration.devices().map(<[_]>::len), Some(2));
}

#[tokio::test]
async fn registers_once_kubelet_appears_and_stops_cleanly_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = RunningPlugin::start(
        lifecycle(dir.path()),
        state(
            file_gpus(dir.path()),
            1,
            &DeviceFilter::default(),
            Arc::new(NoPendingPod),
        ),
    );
    // No kubelet yet: the plugin serves and retries with backoff.
    let mut kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    assert_eq!(registration.error, None);
    kubelet.stop().await;
    plugin.shutdown().await.unwrap();
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
}

//! The device plugin's `/healthz`, `/readyz` and `/metrics` on the real `run` path (in-process
//! API server, fake kubelet, inventory file, the real allocator and collector): not ready before
//! kubelet is there, ready once registered, and the counters after a successful allocation, a
//! failed one, a failed publication, a call with no pod, a collector pass, a GPU turning
//! unhealthy, and a kubelet restart (re-registration counted, ready again).

use crate::allocate_support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use allocate_support::{Ctr, GPU_A, GPU_B, NODE, NS, WAIT, apply_webhook, dev, gpu_pod, uid};
use hami_device_plugin::allocation::plan::codec::{ContainerDevice, PodDevices};
use hami_device_plugin::app::RunOptions;
use hami_device_plugin::cli::{Cli, Command};
use hami_shared::region::fixture::{FixtureSlot, RegionFixture};
use hami_shared::region::layout::V1_2;
use hami_tests::apiserver::ApiServer;
use hami_tests::inventory::TWO_H200;
use hami_tests::kubelet::FakeKubelet;
use hami_tests::run_command::RunCommand;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` over a fresh HTTP/1.1 connection: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    (status, body.to_owned())
}

/// The value of the sample `name` (full series text, labels included) in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// Polls `/metrics` until `series` reaches at least `min` (each poll follows an API or file
/// change made by the plugin's own tasks; bounded by `WAIT`).
async fn await_sample(addr: SocketAddr, series: &str, min: f64) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        if sample(&text, series).is_some_and(|v| v >= min) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never reached {min}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create_pending(pods: &Api<Pod>, pod: Value) -> Pod {
    let pod: Pod = serde_json::from_value(apply_webhook(pod)).unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let name = created.metadata.name.clone().unwrap();
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Pending"}})),
    )
    .await
    .unwrap()
}

/// What the HAMi scheduler writes: the node lock naming the pod, the device annotations,
/// bind-phase allocating, and the binding.
async fn schedule(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    pod: &Pod,
    containers: &[Vec<ContainerDevice>],
) {
    let name = pod.metadata.name.clone().unwrap();
    let value = PodDevices::from_containers(containers).encode();
    let stamp = k8s_openapi::jiff::Timestamp::now();
    let now = stamp.as_second().to_string();
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "hami.io/mutex.lock": format!("{},{NS},{name}", stamp.strftime("%Y-%m-%dT%H:%M:%SZ"))
            }}})),
        )
        .await
        .unwrap();
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"annotations": {
                "hami.io/vgpu-node": NODE,
                "hami.io/vgpu-time": now,
                "hami.io/vgpu-devices-to-allocate": value,
                "hami.io/vgpu-devices-allocated": value,
                "hami.io/bind-phase": "allocating",
                "hami.io/bind-time": now,
            }}
        })),
    )
    .await
    .unwrap();
    // The binding, as the scheduler makes it (spec.nodeName cannot be patched).
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}
    });
    let _: Value = pods
        .create_subresource("binding", &name, &PostParams::default(), &binding)
        .await
        .unwrap();
}

fn run_args(hook: &Path, kubelet_dir: &Path, inventory: &Path) -> Command {
    run_args_with(hook, kubelet_dir, inventory, &[])
}

fn run_args_with(hook: &Path, kubelet_dir: &Path, inventory: &Path, extra: &[&str]) -> Command {
    let mut args: Vec<std::ffi::OsString> = vec![
        "hami-device-plugin".into(),
        "run".into(),
        "--node-name".into(),
        NODE.into(),
        "--kubelet-dir".into(),
        kubelet_dir.into(),
        "--inventory".into(),
        inventory.into(),
        "--hook-path".into(),
        hook.into(),
        "--register-interval".into(),
        "0.05".into(),
        "--kubelet-watch-interval-ms".into(),
        "20".into(),
        "--collect-interval".into(),
        "0.05".into(),
        "--collect-grace".into(),
        "0.001".into(),
        // Never used: the test hands over a listener on port 0.
        "--metrics-listen".into(),
        "off".into(),
    ];
    args.extend(extra.iter().map(std::ffi::OsString::from));
    Cli::parse_with_env(args, |name| std::env::var_os(name))
        .unwrap()
        .cli
        .command
}

#[tokio::test]
async fn probes_and_counters_on_the_run_path() {
    let dir = tempfile::tempdir().unwrap();
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
    let Command::Run(args) = run_args(&hook, &kubelet_dir, &inventory) else {
        panic!("not run")
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let plugin = RunCommand::spawn(
        args,
        RunOptions {
            client: Some(server.client()),
            metrics_listener: Some(listener),
        },
        hami_device_plugin::app::make_allocate_handler,
    );

    // No kubelet yet: the socket is there, registration fails, not ready; alive all the same.
    let text = await_sample(
        addr,
        "hami_device_plugin_kubelet_registrations_total{result=\"failure\"}",
        1.0,
    )
    .await;
    assert_eq!(
        sample(
            &text,
            "hami_device_plugin_kubelet_registrations_total{result=\"success\"}"
        ),
        Some(0.0)
    );
    assert!(kubelet_dir.join("nvidia-gpu.sock").exists());
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("registration with kubelet"), "{body}");
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    // kubelet comes: registered, ready.
    let mut kubelet = FakeKubelet::start(&kubelet_dir).await.unwrap();
    kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = get(addr, "/readyz").await;
        if status == 200 {
            assert_eq!(body, "ready\n");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = await_sample(
        addr,
        "hami_device_plugin_node_annotation_patches_total",
        1.0,
    )
    .await;
    assert_eq!(
        sample(&text, "hami_device_plugin_devices{health=\"healthy\"}"),
        Some(20.0)
    );
    assert_eq!(
        sample(&text, "hami_device_plugin_devices{health=\"unhealthy\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "hami_device_plugin_kubelet_registrations_total{result=\"success\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "hami_device_plugin_node_annotation_patch_errors_total"
        ),
        Some(0.0)
    );

    let mut client = kubelet.plugin().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let nodes: Api<Node> = Api::all(server.client());

    // No pod being allocated.
    let status = client
        .allocate(&[vec![format!("{GPU_A}-0")]])
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);

    // One success (file delivery by default: one limits file).
    let ok = create_pending(
        &pods,
        gpu_pod("ok", &[Ctr::gpu("main", 1000, 0)], json!({})),
    )
    .await;
    schedule(&nodes, &pods, &ok, &[vec![dev(GPU_A, 1000, 0)]]).await;
    client
        .allocate(&[vec![format!("{GPU_A}-0")]])
        .await
        .unwrap();
    let limits = hook
        .join("vgpu/containers")
        .join(format!("{}_main.limits", uid(&ok)));
    assert!(limits.exists());

    // One failure: the scheduler assigned two devices, kubelet asks for one.
    let bad = create_pending(
        &pods,
        gpu_pod("bad", &[Ctr::gpu("main", 1000, 0)], json!({})),
    )
    .await;
    schedule(
        &nodes,
        &pods,
        &bad,
        &[vec![dev(GPU_A, 1000, 0), dev(GPU_B, 1000, 0)]],
    )
    .await;
    let status = client
        .allocate(&[vec![format!("{GPU_B}-0")]])
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);

    // A publication failure: the limits file's name is taken by a non-empty directory.
    let blocked = create_pending(
        &pods,
        gpu_pod("blocked", &[Ctr::gpu("main", 1000, 0)], json!({})),
    )
    .await;
    schedule(&nodes, &pods, &blocked, &[vec![dev(GPU_B, 1000, 0)]]).await;
    let blocker = hook
        .join("vgpu/containers")
        .join(format!("{}_main.limits", uid(&blocked)));
    std::fs::create_dir_all(blocker.join("x")).unwrap();
    client
        .allocate(&[vec![format!("{GPU_B}-1")]])
        .await
        .unwrap_err();

    let (_, text) = get(addr, "/metrics").await;
    for (series, want) in [
        (
            "hami_device_plugin_allocations_total{outcome=\"success\"}",
            1.0,
        ),
        (
            "hami_device_plugin_allocations_total{outcome=\"failed\"}",
            2.0,
        ),
        (
            "hami_device_plugin_allocations_total{outcome=\"no_pod\"}",
            1.0,
        ),
        (
            "hami_device_plugin_allocations_total{outcome=\"lookup_error\"}",
            0.0,
        ),
        ("hami_device_plugin_allocate_duration_seconds_count", 4.0),
        ("hami_device_plugin_limits_files_published_total", 1.0),
        ("hami_device_plugin_limits_file_publish_failures_total", 1.0),
        (
            "hami_device_plugin_limit_delivery_total{mode=\"file\",source=\"default\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    // What every program exports: which release runs, and the process itself.
    let build = format!(
        "hami_device_plugin_build_info{{program=\"hami-device-plugin\",version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&text, &build), Some(1.0), "{build} in\n{text}");
    for series in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            sample(&text, series).is_some_and(|v| v > 0.0),
            "{series} in\n{text}"
        );
    }

    // The pod goes away: the collector (grace 1 ms) removes its directory and limits file.
    pods.delete("ok", &DeleteParams::default()).await.unwrap();
    let text = await_sample(
        addr,
        "hami_device_plugin_collector_removed_total{kind=\"file\"}",
        1.0,
    )
    .await;
    assert_eq!(
        sample(
            &text,
            "hami_device_plugin_collector_removed_total{kind=\"directory\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "hami_device_plugin_collector_errors_total{kind=\"remove\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "hami_device_plugin_collector_errors_total{kind=\"pass\"}"
        ),
        Some(0.0)
    );
    assert!(sample(&text, "hami_device_plugin_collector_passes_total").unwrap() >= 1.0);
    assert!(!limits.exists());

    // A GPU turns unhealthy (the inventory file is re-read every second): the gauge follows.
    std::fs::write(
        &inventory,
        TWO_H200.replace("  numaNode: 1\n", "  numaNode: 1\n  healthy: false\n"),
    )
    .unwrap();
    let text = await_sample(
        addr,
        "hami_device_plugin_devices{health=\"unhealthy\"}",
        10.0,
    )
    .await;
    assert_eq!(
        sample(&text, "hami_device_plugin_devices{health=\"healthy\"}"),
        Some(10.0)
    );

    // kubelet restarts (its sockets and ours deleted): the plugin binds and registers again,
    // counts it, and is ready again.
    kubelet.restart().await.unwrap();
    kubelet.wait_for_registration(2, WAIT).await.unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, text) = get(addr, "/metrics").await;
        let again = ["socket_gone", "kubelet_restarted"]
            .iter()
            .filter_map(|r| {
                sample(
                    &text,
                    &format!("hami_device_plugin_kubelet_reregistrations_total{{reason=\"{r}\"}}"),
                )
            })
            .sum::<f64>();
        let (status, _) = get(addr, "/readyz").await;
        if again >= 1.0 && status == 200 {
            assert_eq!(
                sample(
                    &text,
                    "hami_device_plugin_kubelet_registrations_total{result=\"success\"}"
                ),
                Some(2.0)
            );
            break;
        }
        assert!(Instant::now() < deadline, "not registered again:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    plugin.stop(WAIT).await.unwrap();
    assert!(!kubelet_dir.join("nvidia-gpu.sock").exists());
    // The listener closed with the plugin.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// A region as HAMi-core leaves it: `limit_mib` stamped on every GPU (0: none), one process
/// using `used_mib` on GPU 0.
fn region_bytes(limit_mib: u64, used_mib: u64) -> Vec<u8> {
    let mut f = RegionFixture::new(&V1_2).with_limit_all(limit_mib << 20);
    f.device_num = 1;
    f.procs = vec![FixtureSlot::running(1, 0, 0, 300 << 20, used_mib << 20)];
    f.bytes()
}

/// The region exporter on the `run` path: HAMi containers allocated by the real allocator, their
/// regions written in HAMi-core's layout (a stub libvgpu.so cannot write one) into the folders
/// the plugin made, and the verdicts, limits and usage on the plugin's `/metrics`, with one
/// Warning Event on the uncapped pod.
#[tokio::test]
async fn region_verdicts_on_the_run_path() {
    let dir = tempfile::tempdir().unwrap();
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
    let Command::Run(args) = run_args_with(
        &hook,
        &kubelet_dir,
        &inventory,
        &["--region-interval", "0.05"],
    ) else {
        panic!("not run")
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let plugin = RunCommand::spawn(
        args,
        RunOptions {
            client: Some(server.client()),
            metrics_listener: Some(listener),
        },
        hami_device_plugin::app::make_allocate_handler,
    );
    let kubelet = FakeKubelet::start(&kubelet_dir).await.unwrap();
    kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let mut client = kubelet.plugin().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let nodes: Api<Node> = Api::all(server.client());

    let mut folders = Vec::new();
    for (name, gpu, device) in [
        ("capped", GPU_A, 0),
        ("uncapped", GPU_B, 0),
        ("idle", GPU_A, 1),
    ] {
        let pod = create_pending(
            &pods,
            gpu_pod(name, &[Ctr::gpu("main", 1000, 0)], json!({})),
        )
        .await;
        schedule(&nodes, &pods, &pod, &[vec![dev(gpu, 1000, 0)]]).await;
        client
            .allocate(&[vec![format!("{gpu}-{device}")]])
            .await
            .unwrap();
        folders.push(
            hook.join("vgpu/containers")
                .join(format!("{}_main", uid(&pod))),
        );
    }
    // The plugin pre-creates each region empty; the containers' first processes write them.
    for f in &folders {
        assert_eq!(std::fs::read(f.join("usage.cache")).unwrap(), b"");
    }
    std::fs::write(folders[0].join("usage.cache"), region_bytes(1000, 700)).unwrap();
    std::fs::write(folders[1].join("usage.cache"), region_bytes(0, 5000)).unwrap();

    let series = |pod: &str, gpu: &str, verdict: &str| {
        format!(
            "hami_limits_region_cap_verdict{{node=\"{NODE}\",podnamespace=\"{NS}\",podname=\"{pod}\",ctrname=\"main\",gpu=\"{gpu}\",verdict=\"{verdict}\"}}"
        )
    };
    let text = await_sample(addr, &series("uncapped", "0", "uncapped"), 1.0).await;
    let labels = |pod: &str| {
        format!(
            "{{node=\"{NODE}\",podnamespace=\"{NS}\",podname=\"{pod}\",ctrname=\"main\",gpu=\"0\"}}"
        )
    };
    for (s, want) in [
        (series("capped", "0", "capped"), 1.0),
        (series("idle", "", "no-region"), 1.0),
        (
            format!("hami_limits_region_stamped_limit_bytes{}", labels("capped")),
            1000.0 * 1048576.0,
        ),
        (
            format!("hami_limits_region_file_limit_bytes{}", labels("capped")),
            1000.0 * 1048576.0,
        ),
        (
            format!("hami_limits_region_used_bytes{}", labels("capped")),
            700.0 * 1048576.0,
        ),
        (
            format!("hami_limits_region_processes{}", labels("capped")),
            1.0,
        ),
        (
            format!(
                "hami_limits_region_stamped_limit_bytes{}",
                labels("uncapped")
            ),
            0.0,
        ),
        (
            format!("hami_limits_region_file_limit_bytes{}", labels("uncapped")),
            1000.0 * 1048576.0,
        ),
        (
            format!(
                "hami_limits_region_stamped_sm_limit_percent{}",
                labels("capped")
            ),
            100.0,
        ),
        ("hami_limits_region_unowned_folders".to_owned(), 0.0),
    ] {
        assert_eq!(sample(&text, &s), Some(want), "{s} in\n{text}");
    }
    // The plugin's own metrics are still there, before the region's.
    assert!(text.contains("hami_device_plugin_allocations_total"));

    // One Warning Event on the uncapped pod, none on the others.
    let events: Api<Event> = Api::namespaced(server.client(), NS);
    let deadline = Instant::now() + WAIT;
    let raised = loop {
        let list = events
            .list(&ListParams::default().fields("regarding.name=uncapped"))
            .await
            .unwrap()
            .items;
        let raised: Vec<Event> = list
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("GpuMemoryUncapped"))
            .collect();
        if !raised.is_empty() {
            break raised;
        }
        assert!(Instant::now() < deadline, "no GpuMemoryUncapped Event");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(raised.len(), 1);
    let e = &raised[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    let note = e.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("stamped 0 (no limit) while the file says 1000 MiB"),
        "{note}"
    );
    // Several scans later, still one.
    let scanned = await_sample(addr, "hami_limits_region_last_scan_timestamp_seconds", 1.0).await;
    let first = sample(&scanned, "hami_limits_region_last_scan_timestamp_seconds").unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, text) = get(addr, "/metrics").await;
        if sample(&text, "hami_limits_region_last_scan_timestamp_seconds").unwrap() > first + 0.2 {
            break;
        }
        assert!(Instant::now() < deadline, "no new scan");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = events
        .list(&ListParams::default().fields("regarding.name=uncapped"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("GpuMemoryUncapped"))
        .count();
    assert_eq!(again, 1, "the Event is raised once");
    for quiet in ["capped", "idle"] {
        let list = events
            .list(&ListParams::default().fields(&format!("regarding.name={quiet}")))
            .await
            .unwrap()
            .items;
        assert!(
            !list
                .iter()
                .any(|e| e.reason.as_deref().is_some_and(|r| r.starts_with("Gpu"))),
            "{quiet}: {list:?}"
        );
    }

    // The uncapped container's region is replaced by a link to the capped one's: refused.
    std::fs::remove_file(folders[1].join("usage.cache")).unwrap();
    std::os::unix::fs::symlink(
        folders[0].join("usage.cache"),
        folders[1].join("usage.cache"),
    )
    .unwrap();
    await_sample(addr, &series("uncapped", "", "unreadable"), 1.0).await;

    plugin.stop(WAIT).await.unwrap();
}

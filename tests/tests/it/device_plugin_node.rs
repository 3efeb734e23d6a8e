//! The node handshake for the HAMi scheduler (`hami.io/node-nvidia-register`) against the
//! in-process API server: exact bytes, the scheduler's reading of them, updates on health changes,
//! repair when someone strips the annotation, no patch when nothing changed, retries after API
//! errors; and the whole `run` path (fake kubelet + API server + inventory file).

use std::time::{Duration, Instant};

use hami_device_plugin::cli::{Cli, Command};
use hami_device_plugin::gpu::devices::DeviceTable;
use hami_device_plugin::gpu::inventory::{DeviceFilter, Gpu};
use hami_device_plugin::node_register::{
    ANNOTATION_NODE_NVIDIA_REGISTER, MODE_HAMI_CORE, NodeRegisterConfig, Scaling,
    register_annotation, run_node_register,
};
use hami_tests::apiserver::{ApiServer, Fault, RequestMatch, Verb};
use hami_tests::kubelet::FakeKubelet;
use hami_tests::run_command::RunCommand;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;
use tokio::sync::{oneshot, watch};

const WAIT: Duration = Duration::from_secs(10);
const NODE: &str = "gpu-node-a";

/// The HAMi scheduler's `util.DeviceInfo` as Go's encoding/json fills it: missing fields are zero.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct SchedulerDeviceInfo {
    #[serde(default)]
    id: String,
    #[serde(default)]
    index: u32,
    #[serde(default)]
    count: i32,
    #[serde(default)]
    devmem: i32,
    #[serde(default)]
    devcore: i32,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    numa: i64,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    health: bool,
}

fn gpu(uuid: &str, index: u32, name: &str, mib: u64, numa: Option<i64>) -> Gpu {
    Gpu {
        uuid: uuid.into(),
        index,
        minor: index,
        name: name.into(),
        memory_mib: mib,
        numa_node: numa,
        mig_enabled: false,
        healthy: true,
        mig_devices: Vec::new(),
    }
}

fn node() -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": NODE, "annotations": { "other": "kept" } }
    }))
    .unwrap()
}

async fn annotation(server: &ApiServer) -> Option<String> {
    let node: Node = server.get(None, NODE).unwrap()?;
    node.metadata
        .annotations?
        .get(ANNOTATION_NODE_NVIDIA_REGISTER)
        .cloned()
}

/// Awaits the node annotation to equal `want` (re-reading on every API change).
async fn wait_for_annotation(server: &ApiServer, want: Option<&str>) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = annotation(server).await;
        if now.as_deref() == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "annotation is {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn scaling() -> Scaling {
    Scaling {
        split_count: 10,
        memory: 1.5,
        core: 1.0,
        mode: MODE_HAMI_CORE,
    }
}

fn config(interval_ms: u64) -> NodeRegisterConfig {
    NodeRegisterConfig {
        node_name: NODE.to_owned(),
        interval: Duration::from_millis(interval_ms),
        retry: Duration::from_millis(20),
        scaling: scaling(),
        score: None,
        asymmetric_links: Vec::new(),
    }
}

fn table() -> DeviceTable {
    let gpus = vec![
        gpu("GPU-aaaa", 0, "NVIDIA H200", 143_771, Some(0)),
        gpu("GPU-bbbb", 1, "Tesla P4", 7680, Some(1)),
    ];
    DeviceTable::build(gpus, &DeviceFilter::default(), 10, false)
        .unwrap()
        .0
}

#[tokio::test]
async fn publishes_the_annotation_the_scheduler_reads_and_keeps_it_current() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&node()).unwrap();
    let (tables, rx) = watch::channel(table());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run_node_register(server.client(), config(50), rx, async {
        let _ = stopped.await;
    }));

    let expected = concat!(
        r#"[{"id":"GPU-aaaa","count":10,"devmem":215656,"devcore":100,"type":"NVIDIA H200","mode":"hami-core","health":true},"#,
        r#"{"id":"GPU-bbbb","index":1,"count":10,"devmem":11520,"devcore":100,"type":"NVIDIA-Tesla P4","numa":1,"mode":"hami-core","health":true}]"#
    );
    wait_for_annotation(&server, Some(expected)).await;
    let node: Node = server.get(None, NODE).unwrap().unwrap();
    assert_eq!(
        node.metadata
            .annotations
            .unwrap()
            .get("other")
            .map(String::as_str),
        Some("kept"),
        "merge patch keeps other annotations"
    );

    // What the HAMi scheduler decodes.
    let seen: Vec<SchedulerDeviceInfo> = serde_json::from_str(expected).unwrap();
    assert_eq!(
        seen[1],
        SchedulerDeviceInfo {
            id: "GPU-bbbb".into(),
            index: 1,
            count: 10,
            devmem: 11_520,
            devcore: 100,
            kind: "NVIDIA-Tesla P4".into(),
            numa: 1,
            mode: "hami-core".into(),
            health: true,
        }
    );
    assert_eq!(
        (seen[0].index, seen[0].numa),
        (0, 0),
        "omitted zeros read back as zero"
    );

    // Unchanged: the loop only reads. Await two more checks and look for patches.
    server.clear_requests();
    let deadline = Instant::now() + WAIT;
    while server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Get && r.resource.as_deref() == Some("nodes"))
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "no periodic check");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !server.requests().iter().any(|r| r.verb == Verb::Patch),
        "patched although unchanged: {:?}",
        server.requests()
    );

    // A health change is published without waiting for the interval.
    tables.send_modify(|t| {
        t.set_health("GPU-bbbb", false);
    });
    let unhealthy = register_annotation(&tables.borrow(), scaling());
    assert!(
        unhealthy.ends_with(r#""numa":1,"mode":"hami-core"}]"#),
        "{unhealthy}"
    );
    wait_for_annotation(&server, Some(&unhealthy)).await;
    let seen: Vec<SchedulerDeviceInfo> = serde_json::from_str(&unhealthy).unwrap();
    assert!(seen[0].health && !seen[1].health);

    // Someone removes it: it comes back at the next check.
    let nodes: Api<Node> = Api::all(server.client());
    let strip = serde_json::json!({ "metadata": { "annotations": { ANNOTATION_NODE_NVIDIA_REGISTER: null } } });
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .unwrap();
    wait_for_annotation(&server, Some(&unhealthy)).await;

    stop.send(()).unwrap();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn api_errors_are_retried() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&node()).unwrap();
    server.fail_next(
        RequestMatch::new(Verb::Patch, "nodes"),
        2,
        Fault::Status(500),
    );
    let (_tables, rx) = watch::channel(table());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run_node_register(
        server.client(),
        config(60_000),
        rx,
        async {
            let _ = stopped.await;
        },
    ));
    // With a 60 s interval, only the 20 ms retry can bring the annotation in time.
    let want = register_annotation(&table(), scaling());
    wait_for_annotation(&server, Some(&want)).await;
    let patches = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Patch)
        .count();
    assert_eq!(patches, 3, "two failures, then success");
    stop.send(()).unwrap();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn the_run_command_registers_with_kubelet_and_annotates_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    server.seed(&node()).unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(&inventory, "- {uuid: GPU-aaaa, name: NVIDIA H200, memoryMib: 143771}\n- {uuid: GPU-bbbb, name: NVIDIA H200, memoryMib: 143771}\n").unwrap();
    let config = dir.path().join("device-config.yaml");
    std::fs::write(&config, "nvidia:\n  resourceCountName: nvidia.com/gpu\n  deviceSplitCount: 3\n  deviceMemoryScaling: 1\n").unwrap();
    let node_config = dir.path().join("config.json");
    std::fs::write(&node_config, format!(r#"{{"nodeconfig":[{{"name":"{NODE}","filterdevices":{{"index":[1]}},"devicesplitcount":2}}]}}"#)).unwrap();
    let plugin = RunCommand::start(
        [
            "--node-name".as_ref(),
            NODE.as_ref(),
            "--kubelet-dir".as_ref(),
            dir.path().as_os_str(),
            "--inventory".as_ref(),
            inventory.as_os_str(),
            "--config".as_ref(),
            config.as_os_str(),
            "--node-config".as_ref(),
            node_config.as_os_str(),
            "--register-interval".as_ref(),
            "0.05".as_ref(),
            // Not the fixed default port: tests run in parallel.
            "--metrics-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ] as [&std::ffi::OsStr; 14],
        server.client(),
    )
    .unwrap();

    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let ids: Vec<&str> = registration
        .devices()
        .unwrap()
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["GPU-aaaa-0", "GPU-aaaa-1"],
        "node entry: GPU index 1 filtered, split 2"
    );
    wait_for_annotation(
        &server,
        Some(r#"[{"id":"GPU-aaaa","count":2,"devmem":143771,"devcore":100,"type":"NVIDIA H200","mode":"hami-core","health":true}]"#),
    )
    .await;

    plugin.stop(WAIT).await.unwrap();
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
}

/// `ENABLE_TOPOLOGY_SCORE=true` (HAMi's variable, as HAMi's chart sets it for the
/// topology-aware policy) on the run path: the inventory file's links become
/// `hami.io/node-nvidia-score` beside the register annotation, in HAMi's JSON, over the
/// advertised GPUs only (the filtered one is left out); `enableNumaTopology` in the device config
/// attaches the NUMA node to the kubelet devices.
#[tokio::test]
async fn the_run_command_publishes_the_topology_score_and_numa() {
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    server.seed(&node()).unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(
        &inventory,
        "
- uuid: GPU-aaaa
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 1
  links:
    - {peer: GPU-bbbb, pcie: crossCpu, nvlinks: 18}
    - {peer: GPU-cccc, pcie: crossCpu}
- uuid: GPU-bbbb
  name: NVIDIA H200
  memoryMib: 143771
  links:
    - {peer: GPU-aaaa, pcie: crossCpu, nvlinks: 18}
- {uuid: GPU-cccc, name: NVIDIA H200, memoryMib: 143771}
",
    )
    .unwrap();
    let config = dir.path().join("device-config.yaml");
    std::fs::write(
        &config,
        "nvidia:\n  deviceSplitCount: 1\n  enableNumaTopology: true\n",
    )
    .unwrap();
    let node_config = dir.path().join("config.json");
    std::fs::write(
        &node_config,
        format!(
            r#"{{"nodeconfig":[{{"name":"{NODE}","filterdevices":{{"uuid":["GPU-cccc"]}}}}]}}"#
        ),
    )
    .unwrap();
    let plugin = RunCommand::start(
        [
            "--node-name".as_ref(),
            NODE.as_ref(),
            "--kubelet-dir".as_ref(),
            dir.path().as_os_str(),
            "--inventory".as_ref(),
            inventory.as_os_str(),
            "--config".as_ref(),
            config.as_os_str(),
            "--node-config".as_ref(),
            node_config.as_os_str(),
            "--enable-topology-score=true".as_ref(),
            "--register-interval".as_ref(),
            "0.05".as_ref(),
            "--metrics-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ] as [&std::ffi::OsStr; 15],
        server.client(),
    )
    .unwrap();
    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let numa: Vec<(&str, Option<i64>)> = registration
        .devices()
        .unwrap()
        .iter()
        .map(|d| {
            let node = d
                .topology
                .as_ref()
                .and_then(|t| t.nodes.first())
                .map(|n| n.id);
            (d.id.as_str(), node)
        })
        .collect();
    assert_eq!(numa, [("GPU-aaaa-0", Some(1)), ("GPU-bbbb-0", None)]);
    let want = r#"[{"uuid":"GPU-aaaa","score":{"GPU-bbbb":1810}},{"uuid":"GPU-bbbb","score":{"GPU-aaaa":1810}}]"#;
    let deadline = Instant::now() + WAIT;
    loop {
        let node: Node = server.get(None, NODE).unwrap().unwrap();
        let annotations = node.metadata.annotations.unwrap_or_default();
        let score =
            annotations.get(hami_device_plugin::gpu::topology::ANNOTATION_NODE_NVIDIA_SCORE);
        if score.map(String::as_str) == Some(want) {
            assert!(annotations.contains_key(ANNOTATION_NODE_NVIDIA_REGISTER));
            break;
        }
        assert!(Instant::now() < deadline, "score annotation is {score:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    plugin.stop(WAIT).await.unwrap();
}

/// `inventory --enable-topology-score` prints the score annotation `run` would publish; bad
/// links are refused naming the variable, the file and the value.
#[tokio::test]
async fn inventory_reports_the_score_and_refuses_bad_links() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(&inventory, "- {uuid: GPU-aaaa, name: NVIDIA H200, memoryMib: 1, links: [{peer: GPU-zzzz}]}\n- {uuid: GPU-zzzz, name: x, memoryMib: 1}\n").unwrap();
    let cli = Cli::parse_with_env(
        [
            "hami-device-plugin".as_ref(),
            "inventory".as_ref(),
            "--inventory".as_ref(),
            inventory.as_os_str(),
            "--enable-topology-score".as_ref(),
        ] as [&std::ffi::OsStr; 5],
        |name| std::env::var_os(name),
    )
    .unwrap()
    .cli;
    let Command::Inventory(args) = cli.command else {
        panic!("not inventory")
    };
    let report = hami_device_plugin::app::inventory_report(&args.source).unwrap();
    assert_eq!(
        report.node_score_annotation.as_deref(),
        Some(
            r#"[{"uuid":"GPU-aaaa","score":{"GPU-zzzz":0}},{"uuid":"GPU-zzzz","score":{"GPU-aaaa":0}}]"#
        ),
        "a peer named without a link kind: no entry either way, a symmetric 0"
    );
    assert!(
        hami_device_plugin::app::render_report(&report)
            .contains("hami.io/node-nvidia-score: [{\"uuid\":\"GPU-aaaa\""),
    );
    std::fs::write(&inventory, "- {uuid: GPU-aaaa, name: x, memoryMib: 1, links: [{peer: GPU-bbbb, nvlinks: 19}]}\n- {uuid: GPU-bbbb, name: x, memoryMib: 1}\n").unwrap();
    let err = hami_device_plugin::app::inventory_report(&args.source)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "ENABLE_TOPOLOGY_SCORE=true: cannot read how the GPUs are linked: inventory file"
        ) && err.contains("nvlinks 19 is not in 0..=18"),
        "{err}"
    );
}

/// GPU pairs with asymmetric links: one Warning Event `AsymmetricGPUP2PLink` on the Node (HAMi
/// v2.10 `plugin/register.go`), not one per pass of the loop (HAMi: at most hourly).
#[tokio::test]
async fn asymmetric_links_raise_one_node_warning_event() {
    use k8s_openapi::api::events::v1::Event;
    let server = ApiServer::start().await.unwrap();
    server.seed(&node()).unwrap();
    let (_tables, rx) = watch::channel(table());
    let (stop, stopped) = oneshot::channel::<()>();
    let mut cfg = config(20);
    cfg.asymmetric_links = vec![("GPU-aaaa".to_owned(), "GPU-bbbb".to_owned())];
    let task = tokio::spawn(run_node_register(server.client(), cfg, rx, async {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.list::<Event>().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Event in {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Several more passes of the loop (20 ms each): still the one Event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events: Vec<Event> = server.list().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.reason.as_deref(), Some("AsymmetricGPUP2PLink"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Node")
    );
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some(NODE)
    );
    let note = e.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("asymmetric P2P link data") && note.contains("GPU-aaaa <-> GPU-bbbb"),
        "{note}"
    );
    let _ = stop.send(());
    task.await.unwrap();
}

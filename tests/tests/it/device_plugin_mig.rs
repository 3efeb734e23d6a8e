//! Static MIG through the whole `run` path (inventory file + fake kubelet + API server): with
//! `MIG_STRATEGY=mixed` one plugin per resource registers with kubelet, the MIG resource's
//! `Allocate` answers the MIG UUID without HAMi-core, the node annotation lists only what the
//! HAMi scheduler schedules, and the health of a MIG GPU reaches its MIG devices.

use std::time::{Duration, Instant};

use hami_device_plugin::node_register::ANNOTATION_NODE_NVIDIA_REGISTER;
use hami_tests::apiserver::ApiServer;
use hami_tests::kubelet::{FakeKubelet, PluginClient, Registration};
use hami_tests::run_command::RunCommand;
use k8s_openapi::api::core::v1::Node;

const WAIT: Duration = Duration::from_secs(10);
const NODE: &str = "gpu-node-mig";

const INVENTORY: &str = "
- uuid: GPU-00000000-0000-4000-8000-000000000000
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
- uuid: GPU-11111111-1111-4000-8000-111111111111
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
  migEnabled: true
  migDevices:
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000001, profile: 1g.10gb, memoryMib: 9856}
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000002, profile: 1g.10gb, memoryMib: 9856}
";

fn node() -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": NODE }
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

fn by_resource<'a>(registrations: &'a [Registration], resource: &str) -> Option<&'a Registration> {
    registrations
        .iter()
        .rev()
        .find(|r| r.request.resource_name == resource)
}

#[tokio::test]
async fn mixed_registers_one_plugin_per_resource_and_allocates_mig_without_hami_core() {
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServer::start().await.unwrap();
    server.seed(&node()).unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(&inventory, INVENTORY).unwrap();
    let plugin = RunCommand::start(
        [
            "--node-name",
            NODE,
            "--kubelet-dir",
            dir.path().to_str().unwrap(),
            "--inventory",
            inventory.to_str().unwrap(),
            "--mig-strategy=mixed",
            "--register-interval",
            "0.05",
            "--metrics-listen",
            "off",
        ],
        server.client(),
    )
    .unwrap();

    let registrations = kubelet
        .wait_until("both resources registered with a device list", WAIT, |s| {
            ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
                .iter()
                .all(|r| by_resource(s, r).is_some_and(|r| !r.device_lists.is_empty()))
        })
        .await
        .unwrap();
    let gpu = by_resource(&registrations, "nvidia.com/gpu").unwrap();
    assert_eq!(gpu.request.endpoint, "nvidia-gpu.sock");
    assert_eq!(gpu.devices().unwrap().len(), 10);
    let mig = by_resource(&registrations, "nvidia.com/mig-1g.10gb").unwrap();
    assert_eq!(mig.request.endpoint, "nvidia-mig-1g.10gb.sock");
    let ids: Vec<&str> = mig
        .devices()
        .unwrap()
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "MIG-aaaaaaaa-0000-5000-8000-000000000001",
            "MIG-aaaaaaaa-0000-5000-8000-000000000002"
        ]
    );
    assert!(mig.options.unwrap().get_preferred_allocation_available);

    let mut client = PluginClient::connect(&dir.path().join("nvidia-mig-1g.10gb.sock"))
        .await
        .unwrap();
    // No pod of the HAMi scheduler's is pending: the first available MIG device, by its UUID.
    let ids: Vec<String> = ids.iter().map(|i| (*i).to_owned()).collect();
    assert_eq!(client.preferred(&ids, &[], 1).await.unwrap(), &ids[..1]);
    let response = client
        .allocate(&[vec!["MIG-aaaaaaaa-0000-5000-8000-000000000002".to_owned()]])
        .await
        .unwrap();
    let container = &response.container_responses[0];
    assert_eq!(container.envs.len(), 1, "{:?}", container.envs);
    assert_eq!(
        container.envs["NVIDIA_VISIBLE_DEVICES"],
        "MIG-aaaaaaaa-0000-5000-8000-000000000002"
    );
    assert!(container.mounts.is_empty(), "{:?}", container.mounts);

    // The HAMi scheduler places nvidia.com/gpu: only the GPU without MIG mode is registered.
    let deadline = Instant::now() + WAIT;
    let registered = loop {
        if let Some(value) = annotation(&server).await {
            break value;
        }
        assert!(Instant::now() < deadline, "no node annotation");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let devices: serde_json::Value = serde_json::from_str(&registered).unwrap();
    let ids: Vec<&str> = devices
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["GPU-00000000-0000-4000-8000-000000000000"]);

    // The MIG GPU turns unhealthy in the file: its MIG devices follow.
    let sick = INVENTORY.replacen(
        "  migEnabled: true\n",
        "  migEnabled: true\n  healthy: false\n",
        1,
    );
    std::fs::write(&inventory, sick).unwrap();
    kubelet
        .wait_until("MIG devices Unhealthy", WAIT, |s| {
            by_resource(s, "nvidia.com/mig-1g.10gb")
                .and_then(Registration::devices)
                .is_some_and(|d| d.iter().all(|d| d.health == "Unhealthy"))
        })
        .await
        .unwrap();

    plugin.stop(WAIT).await.unwrap();
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
    assert!(!dir.path().join("nvidia-mig-1g.10gb.sock").exists());
}

//! Static MIG through the inventory file: which devices are advertised under which resource for
//! each `MIG_STRATEGY` (HAMi v2.10's device map), the layouts HAMi refuses, the filter and
//! `preConfiguredDeviceMemory`, the `Allocate` answer for MIG devices (no HAMi-core), and the
//! same through the binary's `inventory` command.

use std::path::Path;
use std::process::Command;

use hami_device_plugin::allocation::shell::mig::{MigAllocate, mig_container_response};
use hami_device_plugin::gpu::devices::{AdvertiseSettings, Advertised, advertise};
use hami_device_plugin::gpu::inventory::{DeviceFilter, parse_inventory};
use hami_device_plugin::gpu::mig::MigStrategy;
use hami_device_plugin::kubelet::api::v1beta1;
use hami_device_plugin::kubelet::service::AllocateHandler;

const BIN: &str = env!("CARGO_BIN_EXE_hami-device-plugin");

/// An H100 shared through HAMi-core, an H100 in MIG mode with three slices, an H100 in MIG mode
/// without slices.
const NODE: &str = "
- uuid: GPU-00000000-0000-4000-8000-000000000000
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
  numaNode: 0
- uuid: GPU-11111111-1111-4000-8000-111111111111
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
  numaNode: 1
  migEnabled: true
  migDevices:
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000001, profile: 1g.10gb, memoryMib: 9856}
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000002, profile: 1g.10gb, memoryMib: 9856}
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000003, profile: 3g.40gb, memoryMib: 40192}
- uuid: GPU-22222222-2222-4000-8000-222222222222
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
  migEnabled: true
";

/// Every GPU in MIG mode, one profile.
const ALL_MIG: &str = "
- uuid: GPU-33333333-3333-4000-8000-333333333333
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 0
  migEnabled: true
  migDevices:
  - {uuid: MIG-bbbbbbbb-0000-5000-8000-000000000001, profile: 1g.18gb, memoryMib: 16384}
  - {uuid: MIG-bbbbbbbb-0000-5000-8000-000000000002, profile: 1g.18gb, memoryMib: 16384}
- uuid: GPU-44444444-4444-4000-8000-444444444444
  name: NVIDIA H200
  memoryMib: 143771
  migEnabled: true
  migDevices:
  - {uuid: MIG-cccccccc-0000-5000-8000-000000000001, profile: 1g.18gb, memoryMib: 16384}
";

fn settings<'a>(strategy: MigStrategy, filter: &'a DeviceFilter) -> AdvertiseSettings<'a> {
    AdvertiseSettings {
        resource_name: "nvidia.com/gpu",
        filter,
        split_count: 2,
        numa_topology: false,
        mig_strategy: strategy,
        pre_configured_memory_mib: 0,
    }
}

fn advertised(text: &str, strategy: MigStrategy) -> Advertised {
    let gpus = parse_inventory(Path::new("node.yaml"), text).unwrap();
    advertise(gpus, &settings(strategy, &DeviceFilter::default())).unwrap()
}

/// `(resource, [device IDs])` per advertised resource.
fn ids(a: &Advertised) -> Vec<(String, Vec<String>)> {
    a.resources
        .iter()
        .map(|r| {
            (
                r.resource_name.clone(),
                r.table
                    .kubelet_devices()
                    .into_iter()
                    .map(|d| d.id)
                    .collect(),
            )
        })
        .collect()
}

fn owned(list: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
    list.iter()
        .map(|(r, ids)| {
            (
                (*r).to_owned(),
                ids.iter().map(|i| (*i).to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn none_advertises_every_gpu_as_shares_mig_mode_or_not() {
    let a = advertised(NODE, MigStrategy::None);
    assert_eq!(
        ids(&a),
        owned(&[(
            "nvidia.com/gpu",
            &[
                "GPU-00000000-0000-4000-8000-000000000000-0",
                "GPU-00000000-0000-4000-8000-000000000000-1",
                "GPU-11111111-1111-4000-8000-111111111111-0",
                "GPU-11111111-1111-4000-8000-111111111111-1",
                "GPU-22222222-2222-4000-8000-222222222222-0",
                "GPU-22222222-2222-4000-8000-222222222222-1",
            ]
        )])
    );
    assert!(a.skipped.is_empty());
    assert!(!a.resources[0].table.is_mig());
}

#[test]
fn mixed_advertises_each_profile_under_its_own_resource() {
    let a = advertised(NODE, MigStrategy::Mixed);
    assert_eq!(
        ids(&a),
        owned(&[
            (
                "nvidia.com/gpu",
                &[
                    "GPU-00000000-0000-4000-8000-000000000000-0",
                    "GPU-00000000-0000-4000-8000-000000000000-1"
                ]
            ),
            (
                "nvidia.com/mig-1g.10gb",
                &[
                    "MIG-aaaaaaaa-0000-5000-8000-000000000001",
                    "MIG-aaaaaaaa-0000-5000-8000-000000000002"
                ]
            ),
            (
                "nvidia.com/mig-3g.40gb",
                &["MIG-aaaaaaaa-0000-5000-8000-000000000003"]
            ),
        ])
    );
    // The MIG-enabled GPU without slices is left out (HAMi warns).
    assert_eq!(a.skipped.len(), 1);
    assert_eq!(
        a.skipped[0].uuid,
        "GPU-22222222-2222-4000-8000-222222222222"
    );
    assert!(
        a.skipped[0].reason.contains("no MIG device"),
        "{:?}",
        a.skipped
    );
    // MIG devices carry their GPU's NUMA node whatever --enable-numa-topology says (HAMi's
    // GetPluginDevices), GPU shares only when it is on.
    let mig = &a.resources[1].table;
    assert!(mig.is_mig());
    assert_eq!(
        mig.kubelet_devices()[0]
            .topology
            .as_ref()
            .map(|t| t.nodes[0].id),
        Some(1)
    );
    assert!(a.resources[0].table.kubelet_devices()[0].topology.is_none());
    assert_eq!(mig.gpus()[0].memory_mib, 9856);
    assert_eq!(mig.gpus()[0].name, "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
    assert_eq!(
        mig.physical_gpus(),
        ["GPU-11111111-1111-4000-8000-111111111111"]
    );
}

#[test]
fn single_advertises_the_slices_under_nvidia_com_gpu_and_refuses_mixed_layouts() {
    let a = advertised(ALL_MIG, MigStrategy::Single);
    assert_eq!(
        ids(&a),
        owned(&[(
            "nvidia.com/gpu",
            &[
                "MIG-bbbbbbbb-0000-5000-8000-000000000001",
                "MIG-bbbbbbbb-0000-5000-8000-000000000002",
                "MIG-cccccccc-0000-5000-8000-000000000001"
            ]
        )])
    );
    assert!(a.resources[0].table.is_mig());
    // Without MIG mode anywhere, `single` is `none`.
    let plain = "- {uuid: GPU-a, name: NVIDIA H200, memoryMib: 143771}\n";
    let a = advertised(plain, MigStrategy::Single);
    assert_eq!(
        ids(&a),
        owned(&[("nvidia.com/gpu", &["GPU-a-0", "GPU-a-1"])])
    );

    let refuse = |text: &str| {
        let gpus = parse_inventory(Path::new("node.yaml"), text).unwrap();
        advertise(
            gpus,
            &settings(MigStrategy::Single, &DeviceFilter::default()),
        )
        .unwrap_err()
        .to_string()
    };
    let err = refuse(NODE);
    assert!(
        err.starts_with("MIG_STRATEGY=single: ")
            && err.contains("GPU-22222222-2222-4000-8000-222222222222")
            && err.contains("no MIG devices configured"),
        "{err}"
    );
    let two_profiles = ALL_MIG.replacen(
        "{uuid: MIG-cccccccc-0000-5000-8000-000000000001, profile: 1g.18gb, memoryMib: 16384}",
        "{uuid: MIG-cccccccc-0000-5000-8000-000000000001, profile: 2g.35gb, memoryMib: 32768}",
        1,
    );
    let err = refuse(&two_profiles);
    assert!(
        err.contains("more than one MIG device type") && err.contains("2g.35gb"),
        "{err}"
    );
    let with_plain = format!("{ALL_MIG}- {{uuid: GPU-a, name: NVIDIA H200, memoryMib: 143771}}\n");
    let err = refuse(&with_plain);
    assert!(
        err.contains("GPU GPU-a is not in MIG mode") && err.contains("MIG_STRATEGY=mixed"),
        "{err}"
    );
}

#[test]
fn the_filter_leaves_out_mig_devices_by_uuid_only() {
    let gpus = parse_inventory(Path::new("node.yaml"), NODE).unwrap();
    // Index 1 is the MIG GPU: as in HAMi, an index never leaves out a MIG device.
    let filter = DeviceFilter {
        uuids: vec!["MIG-aaaaaaaa-0000-5000-8000-000000000002".into()],
        indices: vec![0, 1],
    };
    let a = advertise(gpus, &settings(MigStrategy::Mixed, &filter)).unwrap();
    assert_eq!(
        ids(&a),
        owned(&[
            (
                "nvidia.com/mig-1g.10gb",
                &["MIG-aaaaaaaa-0000-5000-8000-000000000001"]
            ),
            (
                "nvidia.com/mig-3g.40gb",
                &["MIG-aaaaaaaa-0000-5000-8000-000000000003"]
            ),
        ])
    );
    let left_out: Vec<&str> = a.skipped.iter().map(|s| s.uuid.as_str()).collect();
    assert!(left_out.contains(&"GPU-00000000-0000-4000-8000-000000000000"));
    assert!(left_out.contains(&"MIG-aaaaaaaa-0000-5000-8000-000000000002"));
}

#[test]
fn a_gpu_without_memory_takes_pre_configured_device_memory() {
    let spark = "- {uuid: GPU-5555, name: NVIDIA GB10}\n- {uuid: GPU-6666, name: NVIDIA H200, memoryMib: 143771}\n";
    let gpus = parse_inventory(Path::new("node.yaml"), spark).unwrap();
    assert_eq!(gpus[0].memory_mib, 0);
    let filter = DeviceFilter::default();
    let a = advertise(gpus.clone(), &settings(MigStrategy::None, &filter)).unwrap();
    assert_eq!(a.resources[0].table.gpus().len(), 1);
    assert_eq!(a.skipped[0].uuid, "GPU-5555");
    assert!(
        a.skipped[0]
            .reason
            .contains("nvidia.preConfiguredDeviceMemory"),
        "{:?}",
        a.skipped
    );
    let configured = AdvertiseSettings {
        pre_configured_memory_mib: 131_072,
        ..settings(MigStrategy::None, &filter)
    };
    let a = advertise(gpus, &configured).unwrap();
    let memory: Vec<u64> = a.resources[0]
        .table
        .gpus()
        .iter()
        .map(|g| g.memory_mib)
        .collect();
    assert_eq!(
        memory,
        [131_072, 143_771],
        "the configured value stands in, reported memory wins"
    );
    assert!(a.skipped.is_empty());
}

#[test]
fn inventory_file_errors_name_the_mig_device() {
    for (text, needle) in [
        (
            "- {uuid: GPU-a, name: x, memoryMib: 1, migDevices: [{uuid: MIG-1, profile: 1g.10gb, memoryMib: 1}]}\n",
            "migDevices is set but migEnabled is not true",
        ),
        (
            "- {uuid: GPU-a, name: x, memoryMib: 1, migEnabled: true, migDevices: [{uuid: GPU-b, profile: 1g.10gb, memoryMib: 1}]}\n",
            "migDevices[0] (\"GPU-b\"): uuid must start with MIG-",
        ),
        (
            "- {uuid: GPU-a, name: x, memoryMib: 1, migEnabled: true, migDevices: [{uuid: MIG-1, profile: 1g.10, memoryMib: 1}]}\n",
            "migDevices[0] (\"MIG-1\"): profile \"1g.10\": expected a MIG profile like 1g.10gb",
        ),
        (
            "- {uuid: GPU-a, name: x, memoryMib: 1, migEnabled: true, migDevices: [{uuid: MIG-1, profile: 1g.10gb, memoryMib: 0}]}\n",
            "migDevices[0] (\"MIG-1\"): memoryMib must be a positive number",
        ),
        (
            "- {uuid: GPU-a, name: x, memoryMib: 1, migEnabled: true, migDevices: [{uuid: MIG-1, profile: 1g.10gb, memoryMib: 1}]}\n- {uuid: GPU-b, name: x, memoryMib: 1, migEnabled: true, migDevices: [{uuid: MIG-1, profile: 1g.10gb, memoryMib: 1}]}\n",
            "GPU #1 (\"GPU-b\"): migDevices[0] (\"MIG-1\"): uuid appears twice",
        ),
        (
            "- {uuid: GPU-a, name: x, memoryMib: 1, migEnabled: true, migDevices: [{uuid: MIG-1, profile: 1g.10gb, memoryMiB: 1}]}\n",
            "memoryMiB",
        ),
        (
            "- {uuid: GPU-a, name: x, memoryMib: 0}\n",
            "memoryMib must be a positive number of MiB (leave it out for a GPU that reports no memory)",
        ),
    ] {
        let err = parse_inventory(Path::new("i.yaml"), text)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("inventory file i.yaml:"), "{err}");
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[tokio::test]
async fn allocate_of_a_mig_device_is_its_uuid_and_nothing_of_hami_core() {
    let a = advertised(NODE, MigStrategy::Mixed);
    let table = &a.resource("nvidia.com/mig-1g.10gb").unwrap().table;
    let request = v1beta1::AllocateRequest {
        container_requests: vec![
            v1beta1::ContainerAllocateRequest {
                devices_ids: vec!["MIG-aaaaaaaa-0000-5000-8000-000000000002".into()],
            },
            v1beta1::ContainerAllocateRequest {
                devices_ids: vec![
                    "MIG-aaaaaaaa-0000-5000-8000-000000000001".into(),
                    "MIG-aaaaaaaa-0000-5000-8000-000000000002".into(),
                ],
            },
        ],
    };
    let response = MigAllocate::default()
        .allocate(table, request)
        .await
        .unwrap();
    assert_eq!(response.container_responses.len(), 2);
    let first = &response.container_responses[0];
    assert_eq!(
        first.envs.iter().collect::<Vec<_>>(),
        [(
            &"NVIDIA_VISIBLE_DEVICES".to_owned(),
            &"MIG-aaaaaaaa-0000-5000-8000-000000000002".to_owned()
        )],
        "no CUDA_DEVICE_MEMORY_LIMIT_*, CUDA_DEVICE_SM_LIMIT, shared cache"
    );
    assert!(
        first.mounts.is_empty(),
        "no libvgpu.so, ld.so.preload, /overrideEnv"
    );
    assert!(first.devices.is_empty() && first.annotations.is_empty());
    assert_eq!(
        response.container_responses[1].envs["NVIDIA_VISIBLE_DEVICES"],
        "MIG-aaaaaaaa-0000-5000-8000-000000000001,MIG-aaaaaaaa-0000-5000-8000-000000000002"
    );

    // A device of another resource, or a GPU share, is not this resource's.
    for id in [
        "MIG-aaaaaaaa-0000-5000-8000-000000000003",
        "GPU-00000000-0000-4000-8000-000000000000-0",
    ] {
        let status = mig_container_response(table, &[id.to_owned()]).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(id), "{}", status.message());
    }
    let shares = &a.resource("nvidia.com/gpu").unwrap().table;
    assert!(
        mig_container_response(
            shares,
            &["GPU-00000000-0000-4000-8000-000000000000-0".into()]
        )
        .is_err()
    );
}

fn plugin() -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars() {
        if key.starts_with("HAMI_") || key == "NODE_NAME" || key == "MIG_STRATEGY" {
            cmd.env_remove(key);
        }
    }
    cmd
}

#[test]
fn the_inventory_command_reports_every_resource_per_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.yaml");
    std::fs::write(&path, NODE).unwrap();
    let out = plugin()
        .args([
            "inventory",
            "--json",
            "--mig-strategy",
            "mixed",
            "--inventory",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let resources: Vec<(&str, &str, bool, usize)> = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["resourceName"].as_str().unwrap(),
                r["socket"].as_str().unwrap(),
                r["mig"].as_bool().unwrap(),
                r["kubeletDevices"].as_array().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(
        resources,
        [
            ("nvidia.com/gpu", "nvidia-gpu.sock", false, 10),
            ("nvidia.com/mig-1g.10gb", "nvidia-mig-1g.10gb.sock", true, 2),
            ("nvidia.com/mig-3g.40gb", "nvidia-mig-3g.40gb.sock", true, 1),
        ]
    );
    // The HAMi scheduler schedules nvidia.com/gpu: the annotation lists that resource's GPU.
    let annotation: serde_json::Value =
        serde_json::from_str(report["nodeAnnotation"].as_str().unwrap()).unwrap();
    assert_eq!(annotation.as_array().unwrap().len(), 1);
    assert_eq!(
        annotation[0]["id"],
        "GPU-00000000-0000-4000-8000-000000000000"
    );
    assert_eq!(report["gpus"][1]["migDevices"][2]["profile"], "3g.40gb");

    // MIG_STRATEGY from the environment, as HAMi's DaemonSet sets it.
    let all_mig = dir.path().join("all-mig.yaml");
    std::fs::write(&all_mig, ALL_MIG).unwrap();
    let out = plugin()
        .args(["inventory", "--inventory"])
        .arg(&all_mig)
        .env("MIG_STRATEGY", "single")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "resource nvidia.com/gpu on nvidia-gpu.sock: 3 devices (MIG devices, no HAMi-core)"
        ),
        "{text}"
    );
    assert!(
        text.contains("  MIG-bbbbbbbb-0000-5000-8000-000000000001 Healthy"),
        "{text}"
    );
    assert!(
        text.contains(r#""id":"MIG-bbbbbbbb-0000-5000-8000-000000000001""#),
        "{text}"
    );

    // An empty variable is no value (urfave/cli skips it): the default, none.
    let out = plugin()
        .args(["inventory", "--json", "--inventory"])
        .arg(&path)
        .env("MIG_STRATEGY", "")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["resources"].as_array().unwrap().len(), 1);
    assert_eq!(report["kubeletDevices"].as_array().unwrap().len(), 30);

    // A layout `single` refuses exits 1, naming the strategy and the GPU; a bad value exits 2.
    let out = plugin()
        .args(["inventory", "--mig-strategy=single", "--inventory"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MIG_STRATEGY=single: GPU GPU-22222222"),
        "{err}"
    );
    let out = plugin()
        .args(["inventory", "--inventory"])
        .arg(&path)
        .env("MIG_STRATEGY", "Mixed")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MIG_STRATEGY (--mig-strategy) \"Mixed\" is not one of: none, single, mixed"),
        "{err}"
    );
}

/// The device list settings apply to MIG devices as to GPUs (HAMi v2.10 `plugin/server.go`
/// `Allocate`: a MIG request goes through the same `getAllocateResponse`), with the MIG index
/// `<gpu>:<slot>` (`rm/nvml_devices.go` `newMigDevice`) and the parent's and capability nodes
/// (`nvmlMigDevice.GetPaths`).
#[test]
fn mig_answers_follow_the_device_list_settings() {
    use hami_device_plugin::allocation::plan::device_list::{
        DeviceIdStrategy, DeviceListSettings, DeviceListStrategies, DeviceListStrategy, NodeDevices,
    };
    use std::collections::BTreeSet;
    const WITH_PATHS: &str = "
- uuid: GPU-11111111-1111-4000-8000-111111111111
  index: 1
  minor: 3
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
  migEnabled: true
  migDevices:
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000001, profile: 1g.10gb, memoryMib: 9856,
     devicePaths: [/dev/nvidia3, /dev/nvidia-caps/nvidia-cap12, /dev/nvidia-caps/nvidia-cap13]}
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000002, profile: 1g.10gb, memoryMib: 9856}
  - {uuid: MIG-aaaaaaaa-0000-5000-8000-000000000003, profile: 1g.10gb, memoryMib: 9856,
     index: '1:7'}
";
    const FIRST: &str = "MIG-aaaaaaaa-0000-5000-8000-000000000001";
    const SECOND: &str = "MIG-aaaaaaaa-0000-5000-8000-000000000002";
    let gpus = parse_inventory(Path::new("node.yaml"), WITH_PATHS).unwrap();
    let node = NodeDevices::from_gpus(&gpus);
    assert_eq!(
        node.get(SECOND).unwrap().index,
        "1:1",
        "<gpu index>:<position>"
    );
    assert_eq!(
        node.get("MIG-aaaaaaaa-0000-5000-8000-000000000003")
            .unwrap()
            .index,
        "1:7"
    );
    let a = advertise(
        gpus,
        &settings(MigStrategy::Single, &DeviceFilter::default()),
    )
    .unwrap();
    let table = &a.resource("nvidia.com/gpu").unwrap().table;
    let with = |strategies: &[DeviceListStrategy], f: &dyn Fn(&mut DeviceListSettings)| {
        let mut s = DeviceListSettings {
            strategies: DeviceListStrategies::new(strategies.iter().copied()).unwrap(),
            ..DeviceListSettings::default()
        };
        f(&mut s);
        s
    };
    let none = BTreeSet::new();
    let ask = |s: DeviceListSettings, id: &str, control: &BTreeSet<String>| {
        MigAllocate::new(s, node.clone(), table)
            .unwrap()
            .container_response(table, &[id.to_owned()], control)
            .unwrap()
    };

    // volume-mounts: the folder in the variable, one /dev/null mount per MIG device.
    let r = ask(
        with(&[DeviceListStrategy::VolumeMounts], &|_| {}),
        SECOND,
        &none,
    );
    assert_eq!(
        r.envs["NVIDIA_VISIBLE_DEVICES"],
        "/var/run/nvidia-container-devices"
    );
    let mounts: Vec<(&str, &str, bool)> = r
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [(
            "/var/run/nvidia-container-devices/MIG-aaaaaaaa-0000-5000-8000-000000000002",
            "/dev/null",
            false
        )]
    );

    // cdi-cri with index names: the CDI device only, no variable.
    let r = ask(
        with(&[DeviceListStrategy::CdiCri], &|s| {
            s.id_strategy = DeviceIdStrategy::Index;
        }),
        SECOND,
        &none,
    );
    let cdi: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(cdi, ["nvidia.com/gpu=1:1"]);
    assert!(r.envs.is_empty() && r.mounts.is_empty() && r.annotations.is_empty());

    // cdi-annotations: keyed by the container's first MIG device.
    let r = ask(
        with(&[DeviceListStrategy::CdiAnnotations], &|_| {}),
        SECOND,
        &none,
    );
    assert_eq!(
        r.annotations
            .get("cdi.k8s.io/nvidia-device-plugin_MIG-aaaaaaaa-0000-5000-8000-000000000002")
            .map(String::as_str),
        Some("nvidia.com/gpu=MIG-aaaaaaaa-0000-5000-8000-000000000002")
    );

    // PASS_DEVICE_SPECS: control nodes present on the host, then the parent and the two
    // capability nodes — for a resource whose every device has them.
    let specs = with(&[DeviceListStrategy::Envvar], &|s| {
        s.pass_device_specs = true
    });
    let err = MigAllocate::new(specs.clone(), node.clone(), table).unwrap_err();
    assert!(
        err.to_string().contains(SECOND) && err.to_string().contains("PASS_DEVICE_SPECS=true"),
        "{err}"
    );
    let only_first: Vec<_> = parse_inventory(Path::new("node.yaml"), WITH_PATHS)
        .unwrap()
        .into_iter()
        .map(|mut g| {
            g.mig_devices.truncate(1);
            g
        })
        .collect();
    let a1 = advertise(
        only_first.clone(),
        &settings(MigStrategy::Single, &DeviceFilter::default()),
    )
    .unwrap();
    let t1 = &a1.resource("nvidia.com/gpu").unwrap().table;
    let control = BTreeSet::from(["/dev/nvidiactl".to_owned()]);
    let r = MigAllocate::new(specs, NodeDevices::from_gpus(&only_first), t1)
        .unwrap()
        .container_response(t1, &[FIRST.to_owned()], &control)
        .unwrap();
    let paths: Vec<(&str, &str, &str)> = r
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    assert_eq!(
        paths,
        [
            ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
            ("/dev/nvidia3", "/dev/nvidia3", "rw"),
            (
                "/dev/nvidia-caps/nvidia-cap12",
                "/dev/nvidia-caps/nvidia-cap12",
                "rw"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap13",
                "/dev/nvidia-caps/nvidia-cap13",
                "rw"
            ),
        ]
    );
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], FIRST);

    // The inventory's MIG index and device paths are checked.
    for (entry, needle) in [
        ("index: '1'", "must be <GPU index>:<MIG slot>"),
        (
            "devicePaths: [/etc/passwd]",
            "must be an absolute path under /dev",
        ),
        (
            "devicePaths: [/dev/../etc]",
            "must be an absolute path under /dev",
        ),
    ] {
        let text = format!(
            "
- uuid: GPU-11111111-1111-4000-8000-111111111111
  name: NVIDIA H100 80GB HBM3
  memoryMib: 81559
  migEnabled: true
  migDevices:
  - {{uuid: MIG-aaaaaaaa-0000-5000-8000-000000000001, profile: 1g.10gb, memoryMib: 9856, {entry}}}
"
        );
        let err = parse_inventory(Path::new("i.yaml"), &text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{entry}: {err}");
    }
}

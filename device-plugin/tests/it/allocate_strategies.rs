//! The `Allocate` answer per device list strategy, device ID strategy, `PASS_DEVICE_SPECS`,
//! GDS/MOFED/GDRCopy, IMEX and HAMi's license mounts: one table, each row's expected answer
//! written from HAMi v2.10.0's `pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go` for
//! the same pod (the function each row follows is named in the row). The settings go through
//! the flags' parser, as `run` reads them from HAMi's variables.

use std::collections::BTreeMap;
use std::path::Path;

use hami_device_plugin::allocation::plan::codec::ContainerDevice;
use hami_device_plugin::allocation::plan::device_list::settings::DeviceListArgs;
use hami_device_plugin::allocation::plan::device_list::{ImexChannel, NodeDevices};
use hami_device_plugin::allocation::plan::{
    AllocationSettings, HostProbe, PlanError, plan_container,
};
use hami_device_plugin::gpu::inventory::Gpu;
use hami_device_plugin::kubelet::api::v1beta1::{
    CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount,
};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";
const LIB: &str = "/usr/local/vgpu/libvgpu.so.v2.10.0";
const GPU_A: &str = "GPU-6e8a1c2d-0000-4000-8000-00000000000a";
const GPU_B: &str = "GPU-6e8a1c2d-0000-4000-8000-00000000000b";

fn pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": UID},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]}
    }))
    .unwrap()
}

fn dev(uuid: &str) -> ContainerDevice {
    ContainerDevice {
        uuid: uuid.into(),
        kind: "NVIDIA".into(),
        memory_mib: 4000,
        cores: 30,
        extra: vec![],
    }
}

/// The node: GPU A is index 0 on /dev/nvidia0, GPU B index 1 on /dev/nvidia3 (a minor that is
/// not the index, as NVML can report).
fn node() -> NodeDevices {
    let gpu = |uuid: &str, index, minor| Gpu {
        uuid: uuid.into(),
        index,
        minor,
        name: "NVIDIA H200".into(),
        memory_mib: 143_771,
        numa_node: None,
        mig_enabled: false,
        healthy: true,
        mig_devices: vec![],
    };
    NodeDevices::from_gpus(&[gpu(GPU_A, 0, 0), gpu(GPU_B, 1, 3)])
}

/// A row's flags, as `run` gets them from HAMi's variables.
#[derive(Default)]
struct Flags {
    device_list_strategy: &'static str,
    device_id_strategy: Option<&'static str>,
    pass_device_specs: Option<&'static str>,
    nvidia_driver_root: Option<&'static str>,
    dev_root: Option<&'static str>,
    cdi_annotation_prefix: Option<&'static str>,
    gdrcopy: Option<&'static str>,
    gds: Option<&'static str>,
    mofed: Option<&'static str>,
    /// IMEX channel 0 found at start (`imex.GetChannels`; the lookup itself is tested in
    /// `allocation::config`).
    imex: bool,
}

fn settings(f: &Flags) -> AllocationSettings {
    let s = |v: Option<&str>| v.map(str::to_owned);
    let args = DeviceListArgs {
        device_list_strategy: if f.device_list_strategy.is_empty() {
            vec![]
        } else {
            vec![f.device_list_strategy.to_owned()]
        },
        device_id_strategy: s(f.device_id_strategy),
        pass_device_specs: s(f.pass_device_specs),
        nvidia_driver_root: s(f.nvidia_driver_root),
        dev_root: s(f.dev_root),
        cdi_annotation_prefix: s(f.cdi_annotation_prefix),
        gdrcopy_enabled: s(f.gdrcopy),
        gds_enabled: s(f.gds),
        mofed_enabled: s(f.mofed),
        ..DeviceListArgs::default()
    };
    let mut device_list = args.parse().unwrap().settings;
    if f.imex {
        device_list.imex_channels = vec![ImexChannel { id: 0 }];
    }
    AllocationSettings {
        device_list,
        node_devices: node(),
        ..AllocationSettings::default()
    }
}

fn answer(f: &Flags, host: &HostProbe) -> ContainerAllocateResponse {
    let s = settings(f);
    plan_container(
        &pod(),
        0,
        &[dev(GPU_A), dev(GPU_B)],
        Some(2),
        &s,
        Path::new(LIB),
    )
    .unwrap()
    .with_host(host, &s.vgpu_dir())
    .response()
}

/// HAMi-core's variables, the same in every row (`Allocate`, `operatingMode != "mig"`).
fn core_envs() -> Vec<(&'static str, &'static str)> {
    vec![
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "4000m"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "4000m"),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/usage.cache",
        ),
        ("CUDA_DEVICE_SM_LIMIT", "30"),
    ]
}

fn m(container: &str, host: &str, read_only: bool) -> Mount {
    Mount {
        container_path: container.into(),
        host_path: host.into(),
        read_only,
    }
}

/// HAMi-core's mounts, after the device list's (`Allocate` appends them to the answer of
/// `getAllocateResponse`).
fn core_mounts() -> Vec<Mount> {
    let dir = format!("/usr/local/vgpu/containers/{UID}_main");
    let file = format!("/usr/local/vgpu/containers/{UID}_main.limits");
    vec![
        m("/usr/local/vgpu/libvgpu.so", LIB, true),
        m("/usr/local/vgpu", &dir, false),
        m("/tmp/vgpulock", "/tmp/vgpulock", false),
        m("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", true),
        m(
            "/usr/local/vgpu/libhami_preload.so",
            "/usr/local/vgpu/libhami_preload.so",
            true,
        ),
        m("/overrideEnv", &file, true),
    ]
}

fn volume(name: &str) -> Mount {
    m(
        &format!("/var/run/nvidia-container-devices/{name}"),
        "/dev/null",
        false,
    )
}

fn spec(container: &str, host: &str) -> DeviceSpec {
    DeviceSpec {
        container_path: container.into(),
        host_path: host.into(),
        permissions: "rw".into(),
    }
}

fn cdi(names: &[&str]) -> Vec<CdiDevice> {
    names
        .iter()
        .map(|n| CdiDevice {
            name: (*n).to_owned(),
        })
        .collect()
}

/// What a row expects beyond HAMi-core's variables and mounts.
#[derive(Default)]
struct Expected {
    envs: Vec<(&'static str, String)>,
    /// Mounts before HAMi-core's.
    mounts: Vec<Mount>,
    /// Mounts after HAMi-core's.
    mounts_after: Vec<Mount>,
    devices: Vec<DeviceSpec>,
    annotations: Vec<(String, String)>,
    cdi_devices: Vec<CdiDevice>,
}

struct Row {
    /// The HAMi function whose behaviour the row checks.
    hami: &'static str,
    flags: Flags,
    host: HostProbe,
    expected: Expected,
}

fn all_nodes() -> HostProbe {
    HostProbe {
        license: false,
        device_nodes: [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
        ]
        .map(str::to_owned)
        .into(),
    }
}

fn both_uuids() -> String {
    format!("{GPU_A},{GPU_B}")
}

fn rows() -> Vec<Row> {
    let vis = "NVIDIA_VISIBLE_DEVICES";
    let key = format!("cdi.k8s.io/nvidia-device-plugin_{UID}");
    let gpu_a = format!("nvidia.com/gpu={GPU_A}");
    let gpu_b = format!("nvidia.com/gpu={GPU_B}");
    vec![
        Row {
            hami: "updateResponseForDeviceListEnvVar (default envvar, uuid)",
            flags: Flags::default(),
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![(vis, both_uuids())],
                ..Expected::default()
            },
        },
        Row {
            hami: "uniqueDeviceIDsFromAnnotatedDeviceIDs (index: rm.Devices().Subset(ids).GetIndices())",
            flags: Flags {
                device_list_strategy: "envvar",
                device_id_strategy: Some("index"),
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![(vis, "0,1".into())],
                ..Expected::default()
            },
        },
        Row {
            hami: "updateResponseForDeviceMounts (volume-mounts)",
            flags: Flags {
                device_list_strategy: "volume-mounts",
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![(vis, "/var/run/nvidia-container-devices".into())],
                mounts: vec![volume(GPU_A), volume(GPU_B)],
                ..Expected::default()
            },
        },
        Row {
            hami: "getAllocateResponse: envvar then volume-mounts (the folder overwrites the list)",
            flags: Flags {
                device_list_strategy: "envvar,volume-mounts",
                device_id_strategy: Some("index"),
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![(vis, "/var/run/nvidia-container-devices".into())],
                mounts: vec![volume("0"), volume("1")],
                ..Expected::default()
            },
        },
        Row {
            hami: "updateResponseForCDI + getCDIDeviceAnnotations (cdi-annotations; AllCDIEnabled: no device list variable)",
            flags: Flags {
                device_list_strategy: "cdi-annotations",
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                annotations: vec![(key.clone(), format!("{gpu_a},{gpu_b}"))],
                ..Expected::default()
            },
        },
        Row {
            hami: "getCDIDeviceAnnotations (custom cdiAnnotationPrefix replaces cdi.k8s.io/; index names)",
            flags: Flags {
                device_list_strategy: "cdi-annotations",
                device_id_strategy: Some("index"),
                cdi_annotation_prefix: Some("nvidia.cdi.k8s.io/"),
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                annotations: vec![(
                    format!("nvidia.cdi.k8s.io/nvidia-device-plugin_{UID}"),
                    "nvidia.com/gpu=0,nvidia.com/gpu=1".into(),
                )],
                ..Expected::default()
            },
        },
        Row {
            hami: "updateResponseForCDI (cdi-cri: CdiDevices)",
            flags: Flags {
                device_list_strategy: "cdi-cri",
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                cdi_devices: cdi(&[&gpu_a, &gpu_b]),
                ..Expected::default()
            },
        },
        Row {
            hami: "getAllocateResponse: envvar with cdi-cri (AnyCDIEnabled and not AllCDIEnabled)",
            flags: Flags {
                device_list_strategy: "envvar,cdi-cri,cdi-annotations",
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![(vis, both_uuids())],
                annotations: vec![(key.clone(), format!("{gpu_a},{gpu_b}"))],
                cdi_devices: cdi(&[&gpu_a, &gpu_b]),
                ..Expected::default()
            },
        },
        Row {
            hami: "apiDeviceSpecs (passDeviceSpecs; devRoot = nvidiaDriverRoot; optional nodes only when os.Stat finds them)",
            flags: Flags {
                pass_device_specs: Some("true"),
                nvidia_driver_root: Some("/run/nvidia/driver"),
                ..Flags::default()
            },
            host: HostProbe {
                license: false,
                device_nodes: ["/dev/nvidiactl", "/dev/nvidia-uvm"]
                    .map(str::to_owned)
                    .into(),
            },
            expected: Expected {
                envs: vec![(vis, both_uuids())],
                devices: vec![
                    spec("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
                    spec("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm"),
                    spec("/dev/nvidia0", "/run/nvidia/driver/dev/nvidia0"),
                    spec("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3"),
                ],
                ..Expected::default()
            },
        },
        Row {
            hami: "apiDeviceSpecs (NVIDIA_DEV_ROOT over the driver root; all four control nodes present)",
            flags: Flags {
                pass_device_specs: Some("1"),
                nvidia_driver_root: Some("/run/nvidia/driver"),
                dev_root: Some("/"),
                ..Flags::default()
            },
            host: all_nodes(),
            expected: Expected {
                envs: vec![(vis, both_uuids())],
                devices: vec![
                    spec("/dev/nvidiactl", "/dev/nvidiactl"),
                    spec("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
                    spec("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools"),
                    spec("/dev/nvidia-modeset", "/dev/nvidia-modeset"),
                    spec("/dev/nvidia0", "/dev/nvidia0"),
                    spec("/dev/nvidia3", "/dev/nvidia3"),
                ],
                ..Expected::default()
            },
        },
        Row {
            hami: "getAllocateResponse: all-CDI returns before apiDeviceSpecs and the GDS/MOFED variables; AdditionalDevices (gdrcopy, gds, mofed =all)",
            flags: Flags {
                device_list_strategy: "cdi-cri",
                pass_device_specs: Some("true"),
                gdrcopy: Some("true"),
                gds: Some("true"),
                mofed: Some("true"),
                ..Flags::default()
            },
            host: all_nodes(),
            expected: Expected {
                cdi_devices: cdi(&[
                    &gpu_a,
                    &gpu_b,
                    "nvidia.com/gdrcopy=all",
                    "nvidia.com/gds=all",
                    "nvidia.com/mofed=all",
                ]),
                ..Expected::default()
            },
        },
        Row {
            hami: "getAllocateResponse: GDRCopyEnabled, GDSEnabled, MOFEDEnabled (envvar)",
            flags: Flags {
                gdrcopy: Some("true"),
                gds: Some("T"),
                mofed: Some("false"),
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![
                    (vis, both_uuids()),
                    ("NVIDIA_GDRCOPY", "enabled".into()),
                    ("NVIDIA_GDS", "enabled".into()),
                ],
                ..Expected::default()
            },
        },
        Row {
            hami: "updateResponseForImexChannelsEnvVar, updateResponseForDeviceMounts (imex/), apiDeviceSpecs (channel)",
            flags: Flags {
                device_list_strategy: "envvar,volume-mounts",
                pass_device_specs: Some("true"),
                imex: true,
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                envs: vec![
                    (vis, "/var/run/nvidia-container-devices".into()),
                    ("NVIDIA_IMEX_CHANNELS", "0".into()),
                ],
                mounts: vec![volume(GPU_A), volume(GPU_B), volume("imex/0")],
                devices: vec![
                    spec("/dev/nvidia0", "/dev/nvidia0"),
                    spec("/dev/nvidia3", "/dev/nvidia3"),
                    spec(
                        "/dev/nvidia-caps-imex-channels/channel0",
                        "/dev/nvidia-caps-imex-channels/channel0",
                    ),
                ],
                ..Expected::default()
            },
        },
        Row {
            hami: "updateResponseForCDI (imex-channel after the GPUs)",
            flags: Flags {
                device_list_strategy: "cdi-cri",
                imex: true,
                ..Flags::default()
            },
            host: HostProbe::default(),
            expected: Expected {
                cdi_devices: cdi(&[&gpu_a, &gpu_b, "nvidia.com/imex-channel=0"]),
                ..Expected::default()
            },
        },
        Row {
            hami: "Allocate: os.Stat(<hook>/vgpu/license) mounts /tmp/license and /usr/bin/vgpuvalidator",
            flags: Flags::default(),
            host: HostProbe {
                license: true,
                ..HostProbe::default()
            },
            expected: Expected {
                envs: vec![(vis, both_uuids())],
                mounts_after: vec![
                    m("/tmp/license", "/usr/local/vgpu/license", true),
                    m(
                        "/usr/bin/vgpuvalidator",
                        "/usr/local/vgpu/vgpuvalidator",
                        true,
                    ),
                ],
                ..Expected::default()
            },
        },
    ]
}

#[test]
fn each_strategy_answers_as_hami() {
    for row in rows() {
        let got = answer(&row.flags, &row.host);
        let e = row.expected;
        let mut envs: BTreeMap<String, String> = core_envs()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        envs.extend(e.envs.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let got_envs: BTreeMap<String, String> = got.envs.clone().into_iter().collect();
        assert_eq!(got_envs, envs, "{}: envs", row.hami);
        let mut mounts = e.mounts;
        mounts.extend(core_mounts());
        mounts.extend(e.mounts_after);
        assert_eq!(got.mounts, mounts, "{}: mounts", row.hami);
        assert_eq!(got.devices, e.devices, "{}: device specs", row.hami);
        let annotations: BTreeMap<String, String> = e.annotations.into_iter().collect();
        let got_annotations: BTreeMap<String, String> = got.annotations.into_iter().collect();
        assert_eq!(got_annotations, annotations, "{}: annotations", row.hami);
        assert_eq!(got.cdi_devices, e.cdi_devices, "{}: CDI devices", row.hami);
    }
}

#[test]
fn a_device_the_node_does_not_have_fails_the_allocation_where_its_data_is_needed() {
    // HAMi's `Subset` silently drops an unknown ID: the container would start without that GPU.
    let cases = [
        (
            Flags {
                device_id_strategy: Some("index"),
                ..Flags::default()
            },
            "DEVICE_ID_STRATEGY=index",
        ),
        (
            Flags {
                pass_device_specs: Some("true"),
                ..Flags::default()
            },
            "PASS_DEVICE_SPECS=true",
        ),
    ];
    for (flags, setting) in cases {
        let s = settings(&flags);
        let err = plan_container(
            &pod(),
            0,
            &[dev(GPU_A), dev("GPU-elsewhere")],
            Some(2),
            &s,
            Path::new(LIB),
        )
        .unwrap_err();
        assert!(matches!(err, PlanError::DeviceList { .. }), "{err:?}");
        let text = err.to_string();
        assert_eq!(
            text,
            format!(
                "pod ml/train: container main: device GPU-elsewhere is not one of this node's devices, so {setting} cannot be honoured for it"
            )
        );
    }
    // With UUID names and no device specs the node's data is not needed (HAMi passes the UUID).
    let s = settings(&Flags::default());
    let p = plan_container(
        &pod(),
        0,
        &[dev("GPU-elsewhere")],
        Some(1),
        &s,
        Path::new(LIB),
    )
    .unwrap();
    assert_eq!(p.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-elsewhere");
}

#[test]
fn a_gpu_assigned_twice_is_named_once() {
    // `uniqueDeviceIDsFromAnnotatedDeviceIDs` and `Subset` (a map) keep each device once.
    let s = settings(&Flags {
        device_list_strategy: "envvar,cdi-cri",
        pass_device_specs: Some("true"),
        ..Flags::default()
    });
    let p = plan_container(
        &pod(),
        0,
        &[dev(GPU_A), dev(GPU_A)],
        Some(2),
        &s,
        Path::new(LIB),
    )
    .unwrap()
    .with_host(&HostProbe::default(), &s.vgpu_dir());
    assert_eq!(p.envs["NVIDIA_VISIBLE_DEVICES"], GPU_A);
    assert_eq!(p.cdi_devices, [format!("nvidia.com/gpu={GPU_A}")]);
    let nodes: Vec<&str> = p
        .device_specs
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(nodes, ["/dev/nvidia0"]);
}

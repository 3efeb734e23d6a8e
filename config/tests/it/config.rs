//! Configuration: HAMi-format files, layering order, and every bad-value message.

use std::path::{Path, PathBuf};

use hami_config::{
    ConfigLoadError, DeviceConfig, FileText, NodeConfigFile, NvidiaConfig, NvidiaPlugin,
    OperatingMode, load_layered_from_env, load_layered_with_schema,
};
use hami_shared::values::{CorePolicy, DeliverySource, LimitDelivery, resolve_limit_delivery};
use serde::{Deserialize, Serialize};

/// The file's text (the programs read files; the contract crate parses text).
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// `device-config.yaml` as HAMi's chart renders it (ConfigMap `hami-scheduler-device`), with the
/// sections of other vendors that we must ignore, plus our `limitDelivery`.
const HAMI_DEVICE_CONFIG: &str = r#"nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
  gpuCorePolicy: default
  libCudaLogLevel: 1
  runtimeClassName: ""
  limitDelivery: file
  knownMigGeometries:
  - models: [ "A30" ]
    allowedGeometries:
      - group: group1
        geometries:
        - name: 1g.6gb
          memory: 6144
          count: 4
      - group: group2
        geometries:
        - name: 2g.12gb
          memory: 12288
          count: 2
  - models: [ "A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB", "A100-SXM4-40GB" ]
    allowedGeometries:
      - group: group1
        geometries:
        - name: 1g.5gb
          memory: 5120
          count: 7
cambricon:
  resourceCountName: cambricon.com/vmlu
  resourceMemoryName: cambricon.com/mlu.smlu.vmemory
  resourceCoreName: cambricon.com/mlu.smlu.vcore
hygon:
  resourceCountName: hygon.com/dcunum
  resourceMemoryName: hygon.com/dcumem
  resourceCoreName: hygon.com/dcucores
metax:
  gpu:
    resourceCountName: metax-tech.com/gpu
vnpus:
- chipName: 910B
  commonWord: Ascend910A
  resourceName: huawei.com/Ascend910A
  resourceMemoryName: huawei.com/Ascend910A-memory
  memoryAllocatable: 32768
  memoryCapacity: 32768
  aiCore: 30
  templates:
    - name: vir02
      memory: 2184
      aiCore: 2
"#;

/// The device plugin's `config.json` (ConfigMap `hami-device-plugin`), HAMi's lowercase keys.
const HAMI_NODE_CONFIG: &str = r#"{
    "nodeconfig": [
        {
            "name": "gpu-node-a",
            "operatingmode": "hami-core",
            "devicememoryscaling": 1.8,
            "devicesplitcount": 5,
            "migstrategy": "none",
            "filterdevices": {
                "uuid": ["GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76"],
                "index": [3]
            },
            "limitdelivery": "env"
        },
        {
            "name": "gpu-node-b",
            "operatingmode": "hami-core",
            "devicecorescaling": 1,
            "libcudaloglevel": "2",
            "enablegetpreferredallocation": true,
            "limitDelivery": "file"
        },
        {
            "name": "gpu-node-a",
            "devicesplitcount": 7
        }
    ]
}
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn defaults_without_a_file() {
    let c = DeviceConfig::load_from_env(None, no_env()).unwrap();
    assert_eq!(c, DeviceConfig::default());
    let n = &c.nvidia;
    assert_eq!(n.admission.resource_count_name, "nvidia.com/gpu");
    assert_eq!(n.admission.resource_memory_name, "nvidia.com/gpumem");
    assert_eq!(
        n.admission.resource_memory_percentage_name,
        "nvidia.com/gpumem-percentage"
    );
    assert_eq!(n.admission.resource_core_name, "nvidia.com/gpucores");
    assert_eq!(n.admission.resource_priority_name, "nvidia.com/priority");
    assert_eq!(
        (
            n.plugin.default_memory,
            n.plugin.default_cores,
            n.admission.default_gpu_num
        ),
        (0, 0, 1)
    );
    assert_eq!(
        (n.plugin.device_split_count, n.plugin.memory_factor),
        (10, 1)
    );
    assert_eq!(
        (n.plugin.device_memory_scaling, n.plugin.device_core_scaling),
        (1.0, 1.0)
    );
    assert_eq!(n.admission.gpu_core_policy, CorePolicy::Default);
    assert_eq!(n.plugin.lib_cuda_log_level, None);
    assert_eq!(n.plugin.limit_delivery, None);
    assert!(!n.plugin.disable_core_limit && !n.admission.overwrite_env);
}

#[test]
fn hami_chart_device_config_is_read_and_other_vendors_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "device-config.yaml", HAMI_DEVICE_CONFIG);
    let c = DeviceConfig::load_from_env(
        Some(FileText {
            path: &path,
            text: &read(&path),
        }),
        no_env(),
    )
    .unwrap();
    assert_eq!(c.nvidia.plugin.device_split_count, 10);
    assert_eq!(c.nvidia.plugin.lib_cuda_log_level, Some(1));
    assert_eq!(c.nvidia.plugin.limit_delivery, Some(LimitDelivery::File));
    // A file with only some keys keeps the defaults for the others.
    let partial = write(
        dir.path(),
        "partial.yaml",
        "nvidia:\n  deviceSplitCount: 4\n  gpuCorePolicy: force\n",
    );
    let c = DeviceConfig::load_from_env(
        Some(FileText {
            path: &partial,
            text: &read(&partial),
        }),
        no_env(),
    )
    .unwrap();
    assert_eq!(c.nvidia.plugin.device_split_count, 4);
    assert_eq!(c.nvidia.admission.gpu_core_policy, CorePolicy::Force);
    assert_eq!(c.nvidia.admission.resource_count_name, "nvidia.com/gpu");
    // An empty file (an empty ConfigMap key) is all defaults.
    let empty = write(dir.path(), "empty.yaml", "");
    assert_eq!(
        DeviceConfig::load_from_env(
            Some(FileText {
                path: &empty,
                text: &read(&empty)
            }),
            no_env()
        )
        .unwrap(),
        DeviceConfig::default()
    );
}

#[test]
fn layering_defaults_then_file_then_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "device-config.yaml",
        "nvidia:\n  deviceSplitCount: 4\n  deviceMemoryScaling: 2\n  limitDelivery: file\n",
    );
    let e = env(&[
        ("HAMI_NVIDIA__DEVICE_SPLIT_COUNT", "6"),
        ("HAMI_NVIDIA__LIMITDELIVERY", "env"),
        ("HAMI_NVIDIA__disableCoreLimit", "true"),
        ("UNRELATED", "x"),
        ("HAMI_SOMETHING_ELSE", "ignored"),
    ]);
    let c = DeviceConfig::load_from_env(
        Some(FileText {
            path: &path,
            text: &read(&path),
        }),
        e,
    )
    .unwrap();
    assert_eq!(c.nvidia.plugin.device_split_count, 6, "env beats file");
    assert_eq!(
        c.nvidia.plugin.limit_delivery,
        Some(LimitDelivery::Env),
        "env beats file"
    );
    assert!(c.nvidia.plugin.disable_core_limit, "env beats default");
    assert_eq!(
        c.nvidia.plugin.device_memory_scaling, 2.0,
        "file beats default"
    );
    assert_eq!(c.nvidia.plugin.device_core_scaling, 1.0, "default stays");
}

#[test]
fn node_config_json_as_hami_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", HAMI_NODE_CONFIG);
    let nodes = NodeConfigFile::parse(FileText {
        path: &path,
        text: &read(&path),
    })
    .unwrap();
    assert_eq!(nodes.nodeconfig.len(), 3);
    let b = nodes.for_node("gpu-node-b").unwrap();
    assert_eq!(
        b.limit_delivery,
        Some(LimitDelivery::File),
        "limitDelivery spelling accepted"
    );
    assert_eq!(
        b.lib_cuda_log_level,
        Some(2),
        "the string form HAMi's config.json reader needs (a Go string field) is read too"
    );
    assert_eq!(b.enable_get_preferred_allocation, Some(true));
    // Two entries for gpu-node-a: applied in order, the later one overriding what it sets.
    let a = nodes.for_node("gpu-node-a").unwrap();
    assert_eq!(a.device_split_count, Some(7));
    assert_eq!(a.device_memory_scaling, Some(1.8));
    assert_eq!(a.operating_mode, Some(OperatingMode::HamiCore));
    assert_eq!(a.limit_delivery, Some(LimitDelivery::Env));
    assert_eq!(a.filter_devices.as_ref().unwrap().index, vec![3]);
    assert!(
        nodes.for_node("GPU-NODE-A").is_none(),
        "names match exactly"
    );

    let global = NvidiaConfig {
        plugin: NvidiaPlugin {
            limit_delivery: Some(LimitDelivery::File),
            ..NvidiaPlugin::default()
        },
        ..NvidiaConfig::default()
    };
    let eff = global.with_node(&a);
    assert_eq!(
        (
            eff.plugin.device_split_count,
            eff.plugin.device_memory_scaling
        ),
        (7, 1.8)
    );
    let r = resolve_limit_delivery(None, a.limit_delivery, global.plugin.limit_delivery);
    assert_eq!(
        (r.delivery, r.source),
        (LimitDelivery::Env, DeliverySource::NodeConfig)
    );
    let r = resolve_limit_delivery(Some("file"), a.limit_delivery, global.plugin.limit_delivery);
    assert_eq!(
        (r.delivery, r.source),
        (LimitDelivery::File, DeliverySource::PodAnnotation)
    );
    let r = resolve_limit_delivery(
        None,
        nodes.for_node("gpu-node-c").and_then(|n| n.limit_delivery),
        global.plugin.limit_delivery,
    );
    assert_eq!(
        (r.delivery, r.source),
        (LimitDelivery::File, DeliverySource::GlobalConfig)
    );
    let r = resolve_limit_delivery(
        Some("FILE"),
        None,
        NvidiaConfig::default().plugin.limit_delivery,
    );
    assert_eq!(
        (r.delivery, r.source),
        (LimitDelivery::File, DeliverySource::Default)
    );
    assert_eq!(r.invalid_annotation.as_deref(), Some("FILE"));
}

fn device_error(yaml: &str, e: Vec<(String, String)>) -> (String, ConfigLoadError, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "device-config.yaml", yaml);
    let err = DeviceConfig::load_from_env(
        Some(FileText {
            path: &path,
            text: &read(&path),
        }),
        e,
    )
    .unwrap_err();
    (err.to_string(), err, path)
}

/// Each known key with a bad value: the message names the file, the key, the value and what is
/// accepted.
#[test]
fn every_bad_value_is_named() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "limitDelivery: FILE",
            "nvidia.limitDelivery",
            "\"FILE\"",
            "is not one of: env, file",
        ),
        (
            "limitDelivery: files",
            "nvidia.limitDelivery",
            "\"files\"",
            "is not one of: env, file",
        ),
        (
            "gpuCorePolicy: strict",
            "nvidia.gpuCorePolicy",
            "\"strict\"",
            "is not one of: default, force, disable",
        ),
        (
            "deviceSplitCount: ten",
            "nvidia.deviceSplitCount",
            "\"ten\"",
            "expected",
        ),
        (
            "deviceSplitCount: 0",
            "nvidia.deviceSplitCount",
            "0",
            "at least 1",
        ),
        (
            "deviceSplitCount: -3",
            "nvidia.deviceSplitCount",
            "-3",
            "expected",
        ),
        (
            "deviceMemoryScaling: 0",
            "nvidia.deviceMemoryScaling",
            "0",
            "greater than 0",
        ),
        (
            "deviceMemoryScaling: -1.5",
            "nvidia.deviceMemoryScaling",
            "-1.5",
            "greater than 0",
        ),
        (
            "deviceCoreScaling: lots",
            "nvidia.deviceCoreScaling",
            "\"lots\"",
            "expected",
        ),
        (
            "defaultCores: 150",
            "nvidia.defaultCores",
            "150",
            "from 0 to 100",
        ),
        ("memoryFactor: 0", "nvidia.memoryFactor", "0", "at least 1"),
        (
            "libCudaLogLevel: 9",
            "nvidia.libCudaLogLevel",
            "9",
            "from 0 to 4",
        ),
        (
            "disableCoreLimit: maybe",
            "nvidia.disableCoreLimit",
            "\"maybe\"",
            "expected",
        ),
        (
            "defaultMemory: 3000Mi",
            "nvidia.defaultMemory",
            "\"3000Mi\"",
            "expected",
        ),
    ];
    for (line, key, value, accepted) in cases {
        let (msg, err, path) = device_error(
            &format!("nvidia:\n  resourceCountName: nvidia.com/gpu\n  {line}\n"),
            no_env(),
        );
        let ConfigLoadError::InvalidValue {
            origin,
            key: k,
            value: v,
            reason,
        } = &err
        else {
            panic!("{line}: wrong error {err:?}");
        };
        eprintln!("{msg}");
        assert_eq!(origin, &path.display().to_string(), "{line}: {msg}");
        assert_eq!(k, key, "{line}: {msg}");
        assert_eq!(v, value, "{line}: {msg}");
        assert!(reason.contains(accepted), "{line}: {msg}");
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(key) && msg.contains(value),
            "{msg}"
        );
    }
}

#[test]
fn bad_value_from_the_environment_names_the_variable() {
    let (msg, err, _) = device_error(
        "nvidia:\n  limitDelivery: file\n",
        env(&[("HAMI_NVIDIA__LIMIT_DELIVERY", "Env")]),
    );
    assert!(matches!(err, ConfigLoadError::InvalidValue { .. }));
    assert_eq!(
        msg,
        "environment variable HAMI_NVIDIA__LIMIT_DELIVERY: nvidia.limitDelivery: invalid value \"Env\": \"Env\" is not one of: env, file"
    );
    let (msg, _, _) = device_error("", env(&[("HAMI_NVIDIA__DEVICESPLITCOUNT", "0")]));
    assert!(
        msg.starts_with(
            "environment variable HAMI_NVIDIA__DEVICESPLITCOUNT: nvidia.deviceSplitCount"
        ),
        "{msg}"
    );
}

#[test]
fn node_config_bad_values_are_named() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            r#""limitdelivery": "ENV""#,
            "nodeconfig[1].limitdelivery",
            "\"ENV\"",
            "is not one of: env, file",
        ),
        (
            r#""limitDelivery": "none""#,
            "nodeconfig[1].limitDelivery",
            "\"none\"",
            "is not one of: env, file",
        ),
        (
            r#""operatingmode": "vgpu""#,
            "nodeconfig[1].operatingmode",
            "\"vgpu\"",
            "is not one of: hami-core, mig, mps",
        ),
        (
            r#""devicesplitcount": 0"#,
            "nodeconfig[1].devicesplitcount",
            "0",
            "at least 1",
        ),
        (
            r#""devicememoryscaling": "high""#,
            "nodeconfig[1].devicememoryscaling",
            "\"high\"",
            "expected",
        ),
        (
            r#""devicecorescaling": 0"#,
            "nodeconfig[1].devicecorescaling",
            "0",
            "greater than 0",
        ),
        (
            r#""libcudaloglevel": 7"#,
            "nodeconfig[1].libcudaloglevel",
            "7",
            "from 0 to 4",
        ),
        (
            r#""enablegetpreferredallocation": "sometimes""#,
            "nodeconfig[1].enablegetpreferredallocation",
            "\"sometimes\"",
            "expected",
        ),
        (
            r#""preconfigureddevicememory": -1"#,
            "nodeconfig[1].preconfigureddevicememory",
            "-1",
            "expected",
        ),
    ];
    for (field, key, value, accepted) in cases {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            r#"{{"nodeconfig": [{{"name": "ok", "devicesplitcount": 3}}, {{"name": "node-1", {field}}}]}}"#
        );
        let path = write(dir.path(), "config.json", &text);
        let err = NodeConfigFile::parse(FileText {
            path: &path,
            text: &read(&path),
        })
        .unwrap_err();
        let msg = err.to_string();
        let ConfigLoadError::InvalidValue {
            origin,
            key: k,
            value: v,
            reason,
        } = &err
        else {
            panic!("{field}: wrong error {err:?}");
        };
        assert_eq!(origin, &path.display().to_string(), "{msg}");
        assert_eq!((k.as_str(), v.as_str()), (*key, *value), "{msg}");
        assert!(reason.contains(accepted), "{msg}");
    }
}

/// HAMi's `preConfiguredDeviceMemory` (global, MiB) and `preconfigureddevicememory` (node entry,
/// merged over it; 0 in the node entry overrides, as HAMi's mergo merge of a set pointer does).
#[test]
fn pre_configured_device_memory_global_and_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let global = write(
        dir.path(),
        "device-config.yaml",
        "nvidia:\n  preConfiguredDeviceMemory: 131072\n",
    );
    let config = DeviceConfig::load_from_env(
        Some(FileText {
            path: &global,
            text: &read(&global),
        }),
        no_env(),
    )
    .unwrap();
    assert_eq!(config.nvidia.plugin.pre_configured_device_memory, 131_072);
    assert_eq!(
        NvidiaConfig::default().plugin.pre_configured_device_memory,
        0
    );
    let nodes = write(
        dir.path(),
        "config.json",
        r#"{"nodeconfig":[{"name":"spark","preconfigureddevicememory":120000},{"name":"off","preconfigureddevicememory":0}]}"#,
    );
    let nodes = NodeConfigFile::parse(FileText {
        path: &nodes,
        text: &read(&nodes),
    })
    .unwrap();
    let spark = config.nvidia.with_node(&nodes.for_node("spark").unwrap());
    assert_eq!(spark.plugin.pre_configured_device_memory, 120_000);
    let off = config.nvidia.with_node(&nodes.for_node("off").unwrap());
    assert_eq!(off.plugin.pre_configured_device_memory, 0);
    let bad = write(
        dir.path(),
        "bad.yaml",
        "nvidia:\n  preConfiguredDeviceMemory: 128Gi\n",
    );
    let err = DeviceConfig::load_from_env(
        Some(FileText {
            path: &bad,
            text: &read(&bad),
        }),
        no_env(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("nvidia.preConfiguredDeviceMemory") && err.contains("128Gi"),
        "{err}"
    );
}

#[test]
fn unparsable_files_are_errors_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let broken = write(dir.path(), "config.json", "{\"nodeconfig\": [");
    let err = NodeConfigFile::parse(FileText {
        path: &broken,
        text: &read(&broken),
    })
    .unwrap_err();
    assert!(matches!(err, ConfigLoadError::Parse { .. }), "{err}");
    assert!(err.to_string().contains(&broken.display().to_string()));
}

/// Another crate's settings, snake_case, through the generic loader.
#[derive(Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
struct WebhookLike {
    port: u16,
    scheduler_name: String,
    kai: KaiLike,
}

#[derive(Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
struct KaiLike {
    per_gpu_vram_mib: Option<u64>,
    scheduler_names: Vec<String>,
}

#[test]
fn generic_loader_layers_and_names_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "settings.yaml",
        "port: 8443\nscheduler_name: hami-scheduler\nkai:\n  scheduler_names: [kai-scheduler]\nextra: ignored\n",
    );
    let s: WebhookLike = load_layered_from_env(
        Some(FileText {
            path: &path,
            text: &read(&path),
        }),
        "HAMI_WEBHOOK",
        env(&[
            ("HAMI_WEBHOOK_PORT", "9443"),
            ("HAMI_WEBHOOK_KAI__PER_GPU_VRAM_MIB", "16384"),
        ]),
    )
    .unwrap();
    assert_eq!(s.port, 9443);
    assert_eq!(s.scheduler_name, "hami-scheduler");
    assert_eq!(s.kai.per_gpu_vram_mib, Some(16384));
    assert_eq!(s.kai.scheduler_names, vec!["kai-scheduler".to_owned()]);

    let err = load_layered_from_env::<WebhookLike, _>(
        Some(FileText {
            path: &path,
            text: &read(&path),
        }),
        "HAMI_WEBHOOK",
        env(&[("HAMI_WEBHOOK_PORT", "70000")]),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("environment variable HAMI_WEBHOOK_PORT: port: invalid value \"70000\""),
        "{msg}"
    );

    // camelCase keys: the file's spelling guides the environment's.
    #[derive(Debug, Default, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    struct Camel {
        scheduler_name: String,
        body_limit_bytes: u64,
    }
    let camel = write(
        dir.path(),
        "camel.yaml",
        "schedulerName: a\nbodyLimitBytes: 1\n",
    );
    let c: Camel = load_layered_from_env(
        Some(FileText {
            path: &camel,
            text: &read(&camel),
        }),
        "HAMI_WEBHOOK",
        env(&[("HAMI_WEBHOOK_SCHEDULER_NAME", "b")]),
    )
    .unwrap();
    assert_eq!((c.scheduler_name.as_str(), c.body_limit_bytes), ("b", 1));

    let s: WebhookLike = load_layered_with_schema(
        None,
        "HAMI_WEBHOOK",
        env(&[("HAMI_WEBHOOK_SCHEDULERNAME", "x")]),
    )
    .unwrap();
    assert_eq!(s.scheduler_name, "x");
}

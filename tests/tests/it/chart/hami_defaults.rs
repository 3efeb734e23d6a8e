//! Our defaults against HAMi v2.10.0's: the same, or listed as a difference; HAMi's own device
//! config loads with our loaders.

use super::*;

#[test]
fn hamis_own_device_config_loads_with_the_plugins_and_the_webhooks_loaders() {
    use hami_config::DeviceConfig;
    let path = hami_device_config();
    let text = std::fs::read_to_string(&path).unwrap();
    let device = DeviceConfig::load_from_env(
        Some(hami_config::FileText {
            path: &path,
            text: &text,
        }),
        std::iter::empty(),
    )
    .unwrap_or_else(|e| panic!("the device plugin refuses HAMi's device-config.yaml: {e}"));
    let hami: Value = serde_yaml_ng::from_str(&text).unwrap();
    let n = &device.nvidia;
    assert_eq!(
        (
            n.admission.resource_count_name.as_str(),
            n.plugin.device_split_count
        ),
        (
            hami["nvidia"]["resourceCountName"].as_str().unwrap(),
            hami["nvidia"]["deviceSplitCount"].as_u64().unwrap() as u32
        )
    );
    assert_eq!(n.plugin.lib_cuda_log_level, Some(1));
    // The chart's defaults render what HAMi's chart renders, for every key both write.
    let ours = scenario("default").device_config();
    for (key, value) in ours.as_object().unwrap() {
        if let Some(theirs) = hami["nvidia"].get(key) {
            assert!(
                same(value, theirs),
                "nvidia.{key}: ours {value}, HAMi's {theirs}"
            );
        }
    }
}

/// HAMi v2.10.0's files the defaults below come from (paths in HAMi's repository, tag v2.10.0).
const HAMI_VALUES: &str = "charts/hami/values.yaml";

const HAMI_DEVICE_CONFIGMAP: &str = "charts/hami/templates/scheduler/device-configmap.yaml";

const HAMI_DAEMONSET: &str = "charts/hami/templates/device-plugin/daemonsetnvidia.yaml";

/// A default of ours that HAMi v2.10.0's chart has under the same name (or, where HAMi spells it
/// otherwise, the same setting): HAMi's value, as data, and where HAMi keeps it.
struct HamiDefault {
    /// Our value's path in `charts/hami-limits/values.yaml`.
    ours: &'static str,
    /// HAMi's value's path in `file` (or what writes it there, for a literal of a template).
    hami: &'static str,
    /// The HAMi file.
    file: &'static str,
    /// HAMi's default, as its chart renders it.
    value: Value,
    /// The `nvidia:` key of `device-config.yaml` both charts write it to (compared after our
    /// device plugin's loader has read the rendered file, and against the file HAMi's chart
    /// renders, `tests/fixtures/hami-v2.10.0-device-config.yaml`).
    device_config: Option<&'static str>,
}

fn hami_default(
    ours: &'static str,
    hami: &'static str,
    file: &'static str,
    value: Value,
    device_config: Option<&'static str>,
) -> HamiDefault {
    HamiDefault {
        ours,
        hami,
        file,
        value,
        device_config,
    }
}

/// Every default of `charts/hami-limits/values.yaml` that HAMi v2.10.0's chart shares: each must
/// equal HAMi's.
fn shared_hami_defaults() -> Vec<HamiDefault> {
    let (v, dc, ds) = (HAMI_VALUES, HAMI_DEVICE_CONFIGMAP, HAMI_DAEMONSET);
    vec![
        hami_default(
            "devicePlugin.resourceCountName",
            "resourceName",
            v,
            json!("nvidia.com/gpu"),
            Some("resourceCountName"),
        ),
        hami_default(
            "devicePlugin.resourceMemoryName",
            "resourceMem",
            v,
            json!("nvidia.com/gpumem"),
            Some("resourceMemoryName"),
        ),
        hami_default(
            "devicePlugin.resourceMemoryPercentageName",
            "resourceMemPercentage",
            v,
            json!("nvidia.com/gpumem-percentage"),
            Some("resourceMemoryPercentageName"),
        ),
        hami_default(
            "devicePlugin.resourceCoreName",
            "resourceCores",
            v,
            json!("nvidia.com/gpucores"),
            Some("resourceCoreName"),
        ),
        hami_default(
            "devicePlugin.resourcePriorityName",
            "resourcePriority",
            v,
            json!("nvidia.com/priority"),
            Some("resourcePriorityName"),
        ),
        hami_default(
            "devicePlugin.defaultGpuNum",
            "nvidia.defaultGPUNum (a literal)",
            dc,
            json!(1),
            Some("defaultGPUNum"),
        ),
        hami_default(
            "devicePlugin.overwriteEnv",
            "scheduler.overwriteEnv",
            v,
            json!(false),
            Some("overwriteEnv"),
        ),
        hami_default(
            "devicePlugin.deviceSplitCount",
            "devicePlugin.deviceSplitCount",
            v,
            json!(10),
            Some("deviceSplitCount"),
        ),
        hami_default(
            "devicePlugin.deviceMemoryScaling",
            "devicePlugin.deviceMemoryScaling",
            v,
            json!(1),
            Some("deviceMemoryScaling"),
        ),
        hami_default(
            "devicePlugin.deviceCoreScaling",
            "devicePlugin.deviceCoreScaling",
            v,
            json!(1),
            Some("deviceCoreScaling"),
        ),
        hami_default(
            "devicePlugin.gpuCorePolicy",
            "devices.nvidia.gpuCorePolicy",
            v,
            json!("default"),
            Some("gpuCorePolicy"),
        ),
        hami_default(
            "devicePlugin.libCudaLogLevel",
            "devices.nvidia.libCudaLogLevel",
            v,
            json!(1),
            Some("libCudaLogLevel"),
        ),
        hami_default(
            "devicePlugin.disableCoreLimit",
            "devicePlugin.disablecorelimit (--disable-core-limit)",
            v,
            json!(false),
            Some("disableCoreLimit"),
        ),
        hami_default(
            "devicePlugin.enableNumaTopology",
            "devicePlugin.enableNumaTopology",
            v,
            json!(false),
            Some("enableNumaTopology"),
        ),
        hami_default(
            "devicePlugin.preConfiguredDeviceMemory",
            "devicePlugin.preConfiguredDeviceMemory",
            v,
            json!(0),
            Some("preConfiguredDeviceMemory"),
        ),
        hami_default(
            "devicePlugin.runtimeClassName",
            "devicePlugin.runtimeClassName",
            v,
            json!(""),
            Some("runtimeClassName"),
        ),
        hami_default(
            "devicePlugin.migStrategy",
            "devicePlugin.migStrategy",
            v,
            json!("none"),
            None,
        ),
        hami_default(
            "devicePlugin.deviceListStrategy",
            "devicePlugin.deviceListStrategy",
            v,
            json!("envvar"),
            None,
        ),
        hami_default(
            "devicePlugin.passDeviceSpecsEnabled",
            "devicePlugin.passDeviceSpecsEnabled",
            v,
            json!(false),
            None,
        ),
        hami_default(
            "devicePlugin.nvidiaHookPath",
            "devicePlugin.nvidiaHookPath",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.nvidiaDriverRoot",
            "devicePlugin.nvidiaDriverRoot",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.gdrcopyEnabled",
            "devicePlugin.gdrcopyEnabled",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.gdsEnabled",
            "devicePlugin.gdsEnabled",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.mofedEnabled",
            "devicePlugin.mofedEnabled",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.hookPath",
            "global.gpuHookPath",
            v,
            json!("/usr/local"),
            None,
        ),
        hami_default(
            "devicePlugin.kubeletDir",
            "devicePlugin.pluginPath",
            v,
            json!("/var/lib/kubelet/device-plugins"),
            None,
        ),
        hami_default(
            "devicePlugin.nodeSelector",
            "devicePlugin.nvidiaNodeSelector",
            v,
            json!({"gpu": "on"}),
            None,
        ),
        hami_default(
            "devicePlugin.priorityClassName",
            "priorityClassName (a literal)",
            ds,
            json!("system-node-critical"),
            None,
        ),
        hami_default(
            "devicePlugin.podAnnotations",
            "devicePlugin.podAnnotations",
            v,
            json!({}),
            None,
        ),
        hami_default(
            "devicePlugin.updateStrategy.maxUnavailable",
            "devicePlugin.updateStrategy.rollingUpdate.maxUnavailable",
            v,
            json!(1),
            None,
        ),
        hami_default(
            "devicePlugin.enabled",
            "devicePlugin.enabled",
            v,
            json!(true),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.resyncInterval",
            "devicePlugin.monitor.resyncInterval",
            v,
            json!("5m"),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.port",
            "the vgpu-monitor's containerPort (a literal)",
            ds,
            json!(9394),
            None,
        ),
        hami_default(
            "devicePlugin.hamiCore.image.repository",
            "devicePlugin.image.repository",
            v,
            json!("projecthami/hami"),
            None,
        ),
        hami_default(
            "devicePlugin.hamiCore.image.tag",
            "global.imageTag",
            v,
            json!("v2.10.0"),
            None,
        ),
        hami_default(
            "devicePlugin.hamiCore.image.pullPolicy",
            "devicePlugin.image.pullPolicy",
            v,
            json!("IfNotPresent"),
            None,
        ),
        hami_default(
            "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy",
            "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy",
            v,
            json!("spread"),
            None,
        ),
        hami_default(
            "webhook.enabled",
            "scheduler.admissionWebhook.enabled",
            v,
            json!(true),
            None,
        ),
        hami_default(
            "webhook.schedulerName",
            "schedulerName",
            v,
            json!("hami-scheduler"),
            None,
        ),
        hami_default(
            "global.imageRegistry",
            "global.imageRegistry",
            v,
            json!(""),
            None,
        ),
        hami_default(
            "imagePullSecrets",
            "global.imagePullSecrets",
            v,
            json!([]),
            None,
        ),
        hami_default("nameOverride", "nameOverride", v, json!(""), None),
        hami_default("fullnameOverride", "fullnameOverride", v, json!(""), None),
    ]
}

/// Defaults of ours that differ from HAMi v2.10.0's under the same name: each is listed, with its
/// reason, in docs/drop-in.md ("Chart defaults that differ from HAMi's").
fn different_hami_defaults() -> Vec<HamiDefault> {
    let v = HAMI_VALUES;
    let sys_admin = json!({"drop": ["ALL"], "add": ["SYS_ADMIN"]});
    vec![
        hami_default(
            "devicePlugin.tolerations",
            "devicePlugin.tolerations",
            v,
            json!([]),
            None,
        ),
        hami_default(
            "devicePlugin.resources",
            "devicePlugin.resources",
            v,
            json!({}),
            None,
        ),
        hami_default(
            "devicePlugin.extraArgs",
            "devicePlugin.extraArgs",
            v,
            json!(["-v=4"]),
            None,
        ),
        hami_default(
            "devicePlugin.securityContext",
            "devicePlugin.securityContext",
            v,
            json!({"privileged": true, "allowPrivilegeEscalation": true, "capabilities": sys_admin}),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.extraArgs",
            "devicePlugin.monitor.extraArgs",
            v,
            json!(["-v=4"]),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.resources",
            "devicePlugin.monitor.resources",
            v,
            json!({}),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.securityContext",
            "devicePlugin.monitor.securityContext",
            v,
            json!({"allowPrivilegeEscalation": false, "capabilities": sys_admin}),
            None,
        ),
        hami_default(
            "webhook.reinvocationPolicy",
            "scheduler.admissionWebhook.reinvocationPolicy",
            v,
            json!("Never"),
            None,
        ),
        hami_default(
            "webhook.failurePolicy",
            "scheduler.admissionWebhook.failurePolicy",
            v,
            json!("Ignore"),
            None,
        ),
    ]
}

/// The value at a dotted path of our `values.yaml`; a missing key fails, naming it.
fn our_default<'a>(values: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(values, |v, key| {
        v.get(key)
            .unwrap_or_else(|| panic!("charts/hami-limits/values.yaml has no {path} (at {key})"))
    })
}

#[test]
fn chart_defaults_are_hamis_or_listed_as_differences() {
    use hami_config::DeviceConfig;
    let text = std::fs::read_to_string(repo_root().join("charts/hami-limits/values.yaml")).unwrap();
    let values: Value = serde_yaml_ng::from_str(&text).unwrap();
    // What our device plugin makes of the rendered default device-config.yaml.
    let s = scenario("default");
    let path = PathBuf::from("default/device-config.yaml");
    let rendered = s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
    let loaded = DeviceConfig::load_from_env(
        Some(hami_config::FileText {
            path: &path,
            text: &rendered,
        }),
        std::iter::empty(),
    )
    .unwrap();
    let loaded = serde_json::to_value(&loaded.nvidia).unwrap();
    let hami_file: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(hami_device_config()).unwrap()).unwrap();

    let mut wrong = Vec::new();
    for d in shared_hami_defaults() {
        let ours = our_default(&values, d.ours);
        if !same(&d.value, ours) {
            wrong.push(format!(
                "{}: ours {ours}, HAMi's {} ({} in HAMi's {}): make it HAMi's or move it to the differences (and docs/drop-in.md)",
                d.ours, d.value, d.hami, d.file
            ));
        }
        let Some(key) = d.device_config else { continue };
        let read = loaded.get(key).unwrap_or(&Value::Null);
        if !same(&d.value, read) {
            wrong.push(format!(
                "{}: the device plugin reads nvidia.{key} = {read} from the rendered default device-config.yaml, HAMi's chart renders {}",
                d.ours, d.value
            ));
        }
        if let Some(theirs) = hami_file["nvidia"].get(key) {
            assert!(
                same(&d.value, theirs),
                "{}: this table says HAMi renders nvidia.{key} = {}, HAMi's rendered file has {theirs}",
                d.ours,
                d.value
            );
        }
    }

    let drop_in = std::fs::read_to_string(repo_root().join("docs/drop-in.md")).unwrap();
    let listed = hami_tests::docs::section(&drop_in, "Chart defaults that differ from HAMi's")
        .expect("docs/drop-in.md has a section \"Chart defaults that differ from HAMi's\"");
    let listed: BTreeSet<String> = hami_tests::docs::table_rows(&listed)
        .iter()
        .flat_map(|row| hami_tests::docs::code_spans(&row.cells[0]))
        .collect();
    let differences = different_hami_defaults();
    for d in &differences {
        let ours = our_default(&values, d.ours);
        if same(&d.value, ours) {
            wrong.push(format!(
                "{}: now HAMi's {} ({} in HAMi's {}): move it to the shared defaults and out of docs/drop-in.md's differences",
                d.ours, d.value, d.hami, d.file
            ));
        }
        if !listed.contains(d.ours) {
            wrong.push(format!(
                "{}: differs from HAMi's {} ({}) but docs/drop-in.md's \"Chart defaults that differ from HAMi's\" does not list it",
                d.ours, d.hami, d.value
            ));
        }
    }
    for key in &listed {
        assert!(
            differences.iter().any(|d| d.ours == key),
            "docs/drop-in.md lists {key} as a default that differs from HAMi's; this test's table does not"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

//! The device plugin's DaemonSet, RBAC, arguments and the device and node configs it loads.

use super::hook::assert_installs_hook;
use super::*;

#[test]
fn device_plugin_daemonset_and_least_privilege_rbac() {
    let s = scenario("default");
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    assert_eq!(pod.node_selector.as_ref().unwrap()["gpu"], "on");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(
        pod.tolerations
            .as_ref()
            .unwrap()
            .iter()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu"))
    );
    let c = container(pod, "device-plugin");
    assert_eq!(
        c.args.as_deref().unwrap(),
        [
            "run",
            "--config=/etc/hami-limits/device-config/device-config.yaml",
            "--node-config=/etc/hami-limits/node-config/config.json",
            "--kubelet-dir=/var/lib/kubelet/device-plugins",
            // The region exporter (regionExport).
            "--region-interval=30",
            "--region-scrape-files=32",
            "--region-scrape-budget-ms=500",
        ]
    );
    let env: BTreeMap<_, _> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e))
        .collect();
    let node = env["HAMI_NODE_NAME"]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(node.field_path, "spec.nodeName");
    assert_eq!(env["HAMI_HOOK_PATH"].value.as_deref(), Some("/usr/local"));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref().unwrap(), ["ALL"]);
    assert_eq!(
        caps.add.as_deref().unwrap(),
        ["DAC_OVERRIDE", "FOWNER"],
        "only what the folders need"
    );

    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let kubelet = volumes["device-plugins"].host_path.as_ref().unwrap();
    assert_eq!(kubelet.path, "/var/lib/kubelet/device-plugins");
    let hook = volumes["hami-core"].host_path.as_ref().unwrap();
    assert_eq!(hook.path, "/usr/local/vgpu");
    assert_eq!(hook.type_.as_deref(), Some("DirectoryOrCreate"));
    let mounts: BTreeMap<_, _> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m))
        .collect();
    assert_eq!(
        mounts["device-plugins"].mount_path,
        "/var/lib/kubelet/device-plugins"
    );
    assert_eq!(
        mounts["hami-core"].mount_path, "/usr/local/vgpu",
        "container paths equal host paths"
    );
    assert_eq!(mounts["device-config"].read_only, Some(true));

    assert_installs_hook(s, pod, "/usr/local", &[], &[]);

    let cr: &ClusterRole = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(
        rule_set(cr.rules.as_deref().unwrap()),
        set(&[
            "/pods:get[]",
            "/pods:list[]",
            "/pods:watch[]",
            "/pods:patch[]",
            "/nodes:get[]",
            "/nodes:patch[]",
            "events.k8s.io/events:create[]",
            "events.k8s.io/events:patch[]",
        ])
    );
    let wr: &ClusterRole = s.get(&format!("{PREFIX}-webhook"));
    assert_eq!(
        rule_set(wr.rules.as_deref().unwrap()),
        set(&["/nodes:get[]", "/nodes:list[]", "/nodes:watch[]"])
    );
    let mr: &ClusterRole = s.get(&format!("{PREFIX}-vgpu-monitor"));
    assert_eq!(
        rule_set(mr.rules.as_deref().unwrap()),
        set(&["/pods:list[]", "/pods:watch[]"]),
        "HAMi's monitor only reads pods (its two informers)"
    );

    // The plugin's token reaches the plugin container only: no automount, a projected pod-bound
    // token (it carries the node name the node policy checks) mounted where client libraries look.
    let sa: &ServiceAccount = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(sa.automount_service_account_token, Some(false));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let projected = volumes["api-token"].projected.as_ref().unwrap();
    let sources = projected.sources.as_ref().unwrap();
    let token = sources[0].service_account_token.as_ref().unwrap();
    assert_eq!(
        (
            token.path.as_str(),
            token.expiration_seconds,
            token.audience.as_deref()
        ),
        ("token", Some(3607), None)
    );
    assert_eq!(
        sources[1].config_map.as_ref().unwrap().name,
        "kube-root-ca.crt"
    );
    assert_eq!(
        sources[2]
            .downward_api
            .as_ref()
            .unwrap()
            .items
            .as_ref()
            .unwrap()[0]
            .path,
        "namespace"
    );
    for c in pod
        .init_containers
        .iter()
        .flatten()
        .chain(pod.containers.iter())
    {
        let has = c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "api-token");
        assert_eq!(has, c.name == "device-plugin", "{}: api-token", c.name);
    }
    let m = mounts["api-token"];
    assert_eq!(
        (m.mount_path.as_str(), m.read_only),
        ("/var/run/secrets/kubernetes.io/serviceaccount", Some(true))
    );
}

#[test]
fn device_config_defaults_and_env_delivery() {
    let s = scenario("default");
    let nvidia = s.device_config();
    assert_eq!(nvidia["limitDelivery"], "file");
    assert_eq!(nvidia["gpuCorePolicy"], "default");
    assert_eq!(nvidia["resourceCountName"], "nvidia.com/gpu");
    assert_eq!(nvidia["resourceMemoryName"], "nvidia.com/gpumem");
    assert_eq!(
        nvidia["resourceMemoryPercentageName"],
        "nvidia.com/gpumem-percentage"
    );
    assert_eq!(nvidia["resourceCoreName"], "nvidia.com/gpucores");
    assert_eq!(nvidia["resourcePriorityName"], "nvidia.com/priority");
    assert_eq!(nvidia["deviceSplitCount"], 10);
    assert_eq!(nvidia["deviceMemoryScaling"], 1);
    assert_eq!(nvidia["disableCoreLimit"], false);
    assert_eq!(nvidia["libCudaLogLevel"], 1, "HAMi's chart default");
    assert_eq!(s.node_config(), json!({"nodeconfig": []}));
    // The webhook reads the same nvidia section.
    assert_eq!(s.webhook_settings()["nvidia"], nvidia);

    let env = scenario("env-delivery");
    assert_eq!(env.device_config()["limitDelivery"], "env");
    assert!(
        env.device_config().get("libCudaLogLevel").is_none(),
        "null leaves LIBCUDA_LOG_LEVEL unset"
    );
    // A config change rolls the plugin.
    let checksum = |sc: &Scenario| {
        let ds: &DaemonSet = sc.get(&format!("{PREFIX}-device-plugin"));
        annotations(
            ds.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap(),
        )["checksum/config"]
            .clone()
    };
    assert_ne!(checksum(s), checksum(env));
}

#[test]
fn per_node_overrides_render_into_config_json() {
    let s = scenario("per-node");
    assert_eq!(
        s.device_config()["limitDelivery"],
        "env",
        "global env, canary node file"
    );
    let cfg = s.node_config();
    let entries = cfg["nodeconfig"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0],
        json!({"name": "gpu-canary-1", "limitdelivery": "file"})
    );
    assert_eq!(entries[1]["name"], "gpu-a100-7");
    assert_eq!(entries[1]["operatingmode"], "hami-core");
    assert_eq!(entries[1]["devicesplitcount"], 4);
    assert_eq!(entries[1]["devicememoryscaling"], 1.5);
    assert_eq!(entries[1]["libcudaloglevel"], 2);
    assert_eq!(
        entries[1]["filterdevices"],
        json!({"uuid": ["GPU-0d9e7f3a"], "index": [3]})
    );
    assert_eq!(entries[1]["enablegetpreferredallocation"], true);
    assert_eq!(entries[1]["limitdelivery"], "file");
    assert_eq!(
        entries,
        s.values["devicePlugin"]["nodeConfig"]
            .as_array()
            .unwrap()
            .as_slice()
    );
}

#[test]
fn rendered_device_and_node_configs_load_with_the_plugins_loaders() {
    use hami_config::{DeviceConfig, NodeConfigFile};
    use hami_shared::values::{DeliverySource, LimitDelivery, resolve_limit_delivery};
    for s in rendered().scenarios.values() {
        if !s.has_config_map(&format!("{PREFIX}-device-config")) {
            continue;
        }
        // The loaders take the text and a path for their messages; nothing is read from disk.
        let device_path = PathBuf::from(format!("{}/device-config.yaml", s.name));
        let device_text = s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
        let device = DeviceConfig::load_from_env(
            Some(hami_config::FileText {
                path: &device_path,
                text: &device_text,
            }),
            std::iter::empty(),
        )
        .unwrap_or_else(|e| panic!("{}: device-config.yaml refused by the loader: {e}", s.name));
        let loaded = serde_json::to_value(&device.nvidia).unwrap();
        assert_known_keys(&format!("{}: nvidia", s.name), &s.device_config(), &loaded);

        let node_path = PathBuf::from(format!("{}/config.json", s.name));
        let node_text = s.config_data(&format!("{PREFIX}-node-config"), "config.json");
        let nodes = NodeConfigFile::parse(hami_config::FileText {
            path: &node_path,
            text: &node_text,
        })
        .unwrap_or_else(|e| panic!("{}: config.json refused by the loader: {e}", s.name));
        let loaded = serde_json::to_value(&nodes).unwrap();
        for (i, entry) in s.node_config()["nodeconfig"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            assert_known_keys(
                &format!("{}: nodeconfig[{i}]", s.name),
                entry,
                &loaded["nodeconfig"][i],
            );
        }

        // The resolution the rollout section of docs/operator-guide.md relies on.
        if s.name == "per-node" {
            let canary = nodes.for_node("gpu-canary-1");
            let global = device.nvidia.plugin.limit_delivery;
            let canary = canary.and_then(|n| n.limit_delivery);
            let r = resolve_limit_delivery(None, canary, global);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::File, DeliverySource::NodeConfig)
            );
            let r = resolve_limit_delivery(
                None,
                nodes.for_node("gpu-other").and_then(|n| n.limit_delivery),
                global,
            );
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::Env, DeliverySource::GlobalConfig)
            );
            let r = resolve_limit_delivery(Some("env"), canary, global);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::Env, DeliverySource::PodAnnotation)
            );
        }
        if s.name == "default" {
            let r = resolve_limit_delivery(None, None, device.nvidia.plugin.limit_delivery);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::File, DeliverySource::GlobalConfig)
            );
        }
    }
}

/// `libCudaLogLevel` lands where HAMi v2.10.0's plugin puts it (`server.go`: `LIBCUDA_LOG_LEVEL`
/// in `Allocate`'s environment of every non-MIG container when set): with the chart's default,
/// every allocation's environment and limits file carry `LIBCUDA_LOG_LEVEL=1`; with `null`
/// neither does; a MIG device gets no HAMi-core variable at all.
#[test]
fn the_default_log_level_reaches_every_allocation_and_its_limits_file() {
    use hami_config::DeviceConfig;
    use hami_device_plugin::allocation::plan::codec::ContainerDevice;
    use hami_device_plugin::allocation::plan::{AllocationSettings, plan_container};
    let settings = |name: &str| {
        let s = scenario(name);
        let path = PathBuf::from(format!("{name}/device-config.yaml"));
        let text = s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
        let device = DeviceConfig::load_from_env(
            Some(hami_config::FileText {
                path: &path,
                text: &text,
            }),
            std::iter::empty(),
        )
        .unwrap();
        AllocationSettings::for_node(&device.nvidia, None, Path::new("/usr/local"))
    };
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]}
    }))
    .unwrap();
    let device = |uuid: &str| ContainerDevice {
        uuid: uuid.into(),
        kind: "NVIDIA".into(),
        memory_mib: 3000,
        cores: 30,
        extra: vec![],
    };
    let plan = |settings: &AllocationSettings, uuid: &str| {
        plan_container(
            &pod,
            0,
            &[device(uuid)],
            Some(1),
            settings,
            Path::new("/usr/local/vgpu/libvgpu.so"),
        )
        .unwrap()
    };

    let default = settings("default");
    assert_eq!(default.lib_cuda_log_level, Some(1));
    let p = plan(&default, "GPU-a");
    assert_eq!(
        p.envs.get("LIBCUDA_LOG_LEVEL").map(String::as_str),
        Some("1")
    );
    let file = &p
        .limits_file
        .as_ref()
        .expect("file delivery by default")
        .text;
    assert!(file.contains("\nLIBCUDA_LOG_LEVEL=1\n"), "{file}");
    for (key, value) in file.lines().filter_map(|l| l.split_once('=')) {
        assert!(
            hami_shared::hami_core::check_entry(key, value).is_empty(),
            "the limits file holds {key}={value}, which HAMi-core reads otherwise: {file}"
        );
    }
    let mig = plan(&default, "MIG-11111111-aaaa-4000-8000-000000000001");
    assert!(!mig.envs.contains_key("LIBCUDA_LOG_LEVEL") && mig.limits_file.is_none());

    let unset = settings("env-delivery");
    assert_eq!(unset.lib_cuda_log_level, None);
    let p = plan(&unset, "GPU-a");
    assert!(!p.envs.contains_key("LIBCUDA_LOG_LEVEL"), "{:?}", p.envs);
    assert!(p.limits_file.is_none(), "env delivery");
}

#[test]
fn device_plugin_args_and_env_are_what_its_cli_reads() {
    use clap::{CommandFactory, Parser};
    use hami_device_plugin::cli::{Cli, Command as PluginCommand};
    use hami_device_plugin::gpu::health::{ENV_DISABLE_HEALTHCHECKS, HealthCheckPolicy};
    let run = Cli::command()
        .find_subcommand("run")
        .cloned()
        .expect("hami-device-plugin has `run`");
    // The sub-command's own arguments and the global ones (`--log-format`).
    let top = Cli::command();
    let env_read: BTreeSet<String> = run
        .get_arguments()
        .chain(top.get_arguments().filter(|a| a.is_global_set()))
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    for s in rendered().scenarios.values() {
        for ds in s
            .all::<DaemonSet>()
            .into_iter()
            .filter(|d| d.name() == format!("{PREFIX}-device-plugin"))
        {
            let c = container(pod_spec_of_daemonset(ds), "device-plugin");
            let args = c.args.clone().unwrap();
            let cli = Cli::try_parse_from(
                std::iter::once("hami-device-plugin".to_owned()).chain(args.clone()),
            )
            .unwrap_or_else(|e| panic!("{}: hami-device-plugin refuses {args:?}: {e}", s.name));
            let PluginCommand::Run(run_args) = cli.command else {
                panic!("{}: not `run`", s.name)
            };
            assert_eq!(
                run_args.source.config.as_deref(),
                Some(Path::new(
                    "/etc/hami-limits/device-config/device-config.yaml"
                ))
            );
            assert_eq!(
                run_args.source.node_config.as_deref(),
                Some(Path::new("/etc/hami-limits/node-config/config.json"))
            );
            assert_eq!(
                run_args.kubelet_dir,
                Path::new("/var/lib/kubelet/device-plugins")
            );
            assert_eq!(
                run_args.source.inventory.as_deref(),
                s.has_inventory().then_some(Path::new(INVENTORY_FILE)),
                "{}: NVML, unless devicePlugin.inventory lists GPUs",
                s.name
            );
            // Probes and the metrics port: the address the plugin listens on (HAMI_METRICS_LISTEN)
            // is the container's `metrics` port, which both probes use.
            let listen = c
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "HAMI_METRICS_LISTEN")
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| panic!("{}: no HAMI_METRICS_LISTEN", s.name));
            let addr = hami_device_plugin::metrics::parse_listen(&listen)
                .unwrap()
                .unwrap_or_else(|| panic!("{}: metrics off", s.name));
            let metrics_port = c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some("metrics"))
                .map(|p| p.container_port);
            assert_eq!(metrics_port, Some(i32::from(addr.port())), "{}", s.name);
            for (probe, path) in [
                (c.liveness_probe.as_ref(), "/healthz"),
                (c.readiness_probe.as_ref(), "/readyz"),
            ] {
                let get = probe.unwrap().http_get.as_ref().unwrap();
                assert_eq!(get.path.as_deref(), Some(path), "{}", s.name);
                assert_eq!(
                    get.port,
                    IntOrString::String("metrics".into()),
                    "{}",
                    s.name
                );
            }
            // Every variable the chart sets for the plugin is one its CLI reads (the others are
            // for the logger and the NVIDIA runtime).
            for e in c.env.iter().flatten() {
                if e.name == ENV_DISABLE_HEALTHCHECKS {
                    let policy = HealthCheckPolicy::new(e.value.as_deref(), None);
                    assert!(
                        !policy.all_disabled() && policy.is_disabled(48) && policy.is_disabled(109),
                        "{}: {e:?}",
                        s.name
                    );
                }
                if matches!(
                    e.name.as_str(),
                    "RUST_LOG" | "NVIDIA_VISIBLE_DEVICES" | "NVIDIA_DRIVER_CAPABILITIES"
                ) {
                    continue;
                }
                assert!(
                    env_read.contains(&e.name),
                    "{}: the plugin does not read {}",
                    s.name,
                    e.name
                );
            }
        }
    }
}

/// `Allocate`'s allow-lists reach the plugin as the variables its CLI reads, comma-joined; by
/// default neither is set (every namespace refused).
#[test]
fn allocate_allow_lists_reach_the_plugin() {
    use clap::Parser;
    use hami_device_plugin::cli::{Cli, Command as PluginCommand};
    let env_of = |scenario: &str| -> BTreeMap<String, String> {
        let s = &rendered().scenarios[scenario];
        let ds = s
            .all::<DaemonSet>()
            .into_iter()
            .find(|d| d.name() == format!("{PREFIX}-device-plugin"))
            .unwrap();
        container(pod_spec_of_daemonset(ds), "device-plugin")
            .env
            .iter()
            .flatten()
            .filter(|e| e.name.starts_with("HAMI_ALLOW_"))
            .map(|e| (e.name.clone(), e.value.clone().unwrap()))
            .collect()
    };
    assert!(env_of("default").is_empty());
    let env = env_of("allow-lists");
    assert_eq!(
        env,
        BTreeMap::from([
            (
                "HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES".to_owned(),
                "hami-legacy,research".to_owned()
            ),
            (
                "HAMI_ALLOW_PRIVILEGED_NAMESPACES".to_owned(),
                "trusted".to_owned()
            ),
        ])
    );
    // What the plugin makes of them (the flags carry the same values as the variables).
    let cli = Cli::try_parse_from([
        "hami-device-plugin",
        "run",
        "--allow-hami-core-env-namespaces",
        &env["HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES"],
        "--allow-privileged-namespaces",
        &env["HAMI_ALLOW_PRIVILEGED_NAMESPACES"],
    ])
    .unwrap();
    let PluginCommand::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(
        run.allocate.guard.allow_hami_core_env_namespaces,
        ["hami-legacy", "research"]
    );
    assert_eq!(run.allocate.guard.allow_privileged_namespaces, ["trusted"]);
}

/// deviceConfig.existingConfigMap: HAMi's ConfigMap is mounted into both binaries, the chart's is
/// not rendered, and the webhook's file points at the mounted copy instead of holding `nvidia:`.
#[test]
fn an_existing_device_config_map_replaces_the_rendered_one() {
    let s = scenario("existing-device-config");
    assert!(
        !s.has_config_map(&format!("{PREFIX}-device-config")),
        "a second source of truth was rendered"
    );
    let check_volume = |pod: &PodSpec| {
        let cm = volume(pod, "device-config").config_map.as_ref().unwrap();
        assert_eq!(cm.name, "hami-scheduler-device");
        let items: Vec<(&str, &str)> = cm
            .items
            .iter()
            .flatten()
            .map(|i| (i.key.as_str(), i.path.as_str()))
            .collect();
        assert_eq!(items, [("device-config.yaml", "device-config.yaml")]);
    };
    let plugin = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin")));
    check_volume(plugin);
    assert!(
        container(plugin, "device-plugin")
            .args
            .as_ref()
            .unwrap()
            .contains(&"--config=/etc/hami-limits/device-config/device-config.yaml".to_owned())
    );
    let webhook = pod_spec_of_deployment(s.get(&format!("{PREFIX}-webhook")));
    check_volume(webhook);
    let mount = container(webhook, "webhook")
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "device-config")
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/hami-device-config", Some(true))
    );
    let settings = s.webhook_settings();
    assert_eq!(
        settings["deviceConfigFile"],
        "/etc/hami-device-config/device-config.yaml"
    );
    assert!(settings.get("nvidia").is_none());
    // Without it, nothing of this.
    let s = scenario("default");
    let webhook = pod_spec_of_deployment(s.get(&format!("{PREFIX}-webhook")));
    assert!(
        webhook
            .volumes
            .iter()
            .flatten()
            .all(|v| v.name != "device-config")
    );
    assert!(s.webhook_settings().get("deviceConfigFile").is_none());
    let cm = volume(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-config",
    )
    .config_map
    .as_ref()
    .unwrap();
    assert_eq!(cm.name, format!("{PREFIX}-device-config"));
    assert!(cm.items.is_none());
}

/// The three values HAMi's scheduler reads are not rendered; the two the webhook applies are.
#[test]
fn device_config_holds_only_what_our_binaries_read() {
    let nvidia = scenario("default").device_config();
    for gone in ["defaultMemory", "defaultCores", "memoryFactor"] {
        assert!(nvidia.get(gone).is_none(), "{gone} rendered");
    }
    assert_eq!(nvidia["defaultGPUNum"], 1);
    assert_eq!(nvidia["overwriteEnv"], false);
    let settings = scenario("default").webhook_settings();
    assert_eq!(settings["nvidia"]["defaultGPUNum"], 1);
}

fn device_plugin_container(s: &Scenario) -> &Container {
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    container(pod_spec_of_daemonset(ds), "device-plugin")
}

/// HAMi v2.10's devicePlugin values under HAMi's names become what HAMi's DaemonSet
/// (`daemonsetnvidia.yaml`) and device config (`device-configmap.yaml`) make of them: the
/// variables its plugin reads (strings and booleans only when set, as HAMi's `typeIs` guards),
/// `ENABLE_TOPOLOGY_SCORE=true` for the topology-aware policy, the driver root at /driver-root,
/// `enableNumaTopology` in the device config and `enablenumatopology` in the node config.
#[test]
fn hamis_device_plugin_values_become_hamis_variables_and_keys() {
    let value = |c: &Container, name: &str| {
        env_map(c)
            .get(name)
            .map(|e| e.value.clone().unwrap_or_default())
    };
    let default = device_plugin_container(scenario("default"));
    for (name, want) in [
        ("MIG_STRATEGY", Some("none")),
        ("DEVICE_LIST_STRATEGY", Some("envvar")),
        ("PASS_DEVICE_SPECS", Some("false")),
        ("NVIDIA_DRIVER_ROOT", None),
        ("NVIDIA_CDI_HOOK_PATH", None),
        ("GDRCOPY_ENABLED", None),
        ("GDS_ENABLED", None),
        ("MOFED_ENABLED", None),
        ("ENABLE_TOPOLOGY_SCORE", None),
    ] {
        assert_eq!(value(default, name).as_deref(), want, "default: {name}");
    }
    assert_eq!(
        scenario("default").device_config()["enableNumaTopology"],
        false
    );
    assert!(
        scenario("default")
            .device_config()
            .get("preConfiguredDeviceMemory")
            .is_none()
    );

    let s = scenario("hami-values");
    let c = device_plugin_container(s);
    for (name, want) in [
        ("MIG_STRATEGY", "single"),
        ("DEVICE_LIST_STRATEGY", "volume-mounts,cdi-annotations"),
        ("PASS_DEVICE_SPECS", "true"),
        ("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver"),
        (
            "NVIDIA_CDI_HOOK_PATH",
            "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        ),
        ("GDRCOPY_ENABLED", "true"),
        ("GDS_ENABLED", "false"),
        ("MOFED_ENABLED", "true"),
        ("ENABLE_TOPOLOGY_SCORE", "true"),
    ] {
        assert_eq!(value(c, name).as_deref(), Some(want), "hami-values: {name}");
    }
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    let root = volume(pod, "driver-root").host_path.as_ref().unwrap();
    assert_eq!(
        (root.path.as_str(), root.type_.as_deref()),
        ("/run/nvidia/driver", Some("Directory"))
    );
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "driver-root")
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/driver-root", Some(true))
    );
    assert!(
        !pod_spec_of_daemonset(scenario("default").get(&format!("{PREFIX}-device-plugin")))
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == "driver-root")
    );
    assert_eq!(s.device_config()["enableNumaTopology"], true);
    assert_eq!(
        s.node_config()["nodeconfig"][0],
        json!({"name": "gpu-numa-off", "enablenumatopology": false})
    );
    // The files as the plugin reads them: on by default, off on the node that says so.
    let dir = tempfile::tempdir().unwrap();
    let global = dir.path().join("device-config.yaml");
    std::fs::write(
        &global,
        s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml"),
    )
    .unwrap();
    let nodes = dir.path().join("config.json");
    std::fs::write(
        &nodes,
        s.config_data(&format!("{PREFIX}-node-config"), "config.json"),
    )
    .unwrap();
    let numa = |node: &str| {
        hami_device_plugin::settings::PluginSettings::load(
            Some(&global),
            Some(&nodes),
            Some(node),
            std::env::vars(),
        )
        .unwrap()
        .numa_topology
    };
    assert!(numa("gpu-a"));
    assert!(!numa("gpu-numa-off"));
}

/// HAMi-core's lock folder is the host's `/tmp/vgpulock` in the plugin (HAMi mounts the host's
/// whole `/tmp`), so that the folder and `lock` file the plugin makes are what containers bind;
/// the rest of the plugin's `/tmp` stays private.
#[test]
fn the_plugin_sees_the_hosts_vgpulock() {
    for s in rendered().scenarios.values() {
        let Some(ds) = s
            .all::<DaemonSet>()
            .into_iter()
            .find(|d| d.name() == format!("{PREFIX}-device-plugin"))
        else {
            continue;
        };
        let pod = pod_spec_of_daemonset(ds);
        let host = volume(pod, "vgpulock").host_path.as_ref().unwrap();
        assert_eq!(
            (host.path.as_str(), host.type_.as_deref()),
            ("/tmp/vgpulock", Some("DirectoryOrCreate")),
            "{}",
            s.name
        );
        let c = container(pod, "device-plugin");
        let mounts: Vec<(&str, &str)> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.mount_path.starts_with("/tmp"))
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("tmp", "/tmp"),
                ("vgpulock", hami_shared::names::VGPU_LOCK_PATH)
            ],
            "{}",
            s.name
        );
        assert!(volume(pod, "tmp").empty_dir.is_some(), "{}", s.name);
    }
}

//! The hook folder: the init containers and the hook installer that fill it with HAMi-core and the
//! preload library, and the rendered inventory.

use super::*;

/// Where the device plugin image carries the preload library: the chart's `--preload` and the
/// Dockerfile's `COPY` must both say it.
fn preload_in_image() -> String {
    format!(
        "/usr/local/lib/hami-limits/{}",
        hami_shared::names::LIBHAMI_PRELOAD_SO
    )
}

/// HAMi-core is installed in two steps: `copy-hami-core` (HAMi's image, only `sh` and `cp`) copies
/// HAMi's library folder into an emptyDir, then `install-hook` (our image) installs from it into
/// `<hook>/vgpu` on the host, mounted at the same path (ld.so.preload names the libraries by the
/// path workloads see).
/// The image reference the chart must render for `image` (`{repository, tag, digest}`):
/// `global.imageRegistry` replaces the repository's registry host (or goes in front of a name
/// without one), a digest replaces the tag, an empty tag is the appVersion.
/// `kai.hookDelivery: hostPath`: the one long-running container only sleeps, unprivileged.
fn assert_only_sleeps(s: &Scenario, pause: &Container) {
    let values = &s.values["hookInstaller"];
    assert_eq!(pause.name, "pause");
    let image = &values["pauseImage"];
    assert_eq!(
        pause.image.as_deref(),
        Some(image_ref(&s.values, image).as_str()),
        "{}",
        s.name
    );
    assert_eq!(
        pause.image_pull_policy.as_deref(),
        image["pullPolicy"].as_str()
    );
    assert!(pause.command.is_none() && pause.args.is_none());
    assert!(
        pause.volume_mounts.is_none(),
        "{}: pause mounts nothing",
        s.name
    );
    let sc = pause.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(65535));
    assert_eq!(
        serde_json::to_value(&pause.resources).unwrap(),
        values["resources"],
        "{}",
        s.name
    );
}

/// `kai.hookDelivery: device-plugin`: the long-running container serves `hami.io/preload` from
/// the folder the init containers fill, as root without any capability (the socket goes into
/// kubelet's root-owned folder, which root owns), reading the hook folder only.
fn assert_serves_preload(s: &Scenario, pod: &PodSpec, plugin: &Container, kai_dir: &str) {
    let name = &s.name;
    let values = &s.values["hookInstaller"];
    let kubelet_dir = s.values["devicePlugin"]["kubeletDir"].as_str().unwrap();
    assert_eq!(plugin.name, "preload-plugin");
    assert_eq!(
        plugin.image.as_deref(),
        Some(image_ref(&s.values, &s.values["devicePlugin"]["image"]).as_str()),
        "{name}"
    );
    let hook = kai_dir.strip_suffix("/vgpu").unwrap();
    let slots = values["preloadSlots"].as_u64().unwrap();
    let region = &s.values["regionExport"];
    let pod_resources = values["podResourcesDir"].as_str().unwrap().to_owned();
    assert_eq!(
        plugin.args.as_deref().unwrap(),
        [
            "serve-preload".to_owned(),
            format!("--hook-path={hook}"),
            format!("--kubelet-dir={kubelet_dir}"),
            format!("--slots={slots}"),
            format!("--metrics-listen=0.0.0.0:{}", values["metricsPort"]),
            format!("--pod-resources-socket={pod_resources}/kubelet.sock"),
            format!("--pod-api={}", values["podApi"]),
            format!("--region-interval={}", region["interval"]),
            format!("--region-scrape-files={}", region["scrapeFiles"]),
            format!("--region-scrape-budget-ms={}", region["scrapeBudgetMs"]),
        ],
        "{name}"
    );
    // The flags are what serve-preload reads.
    {
        use clap::Parser;
        let mut argv = vec!["hami-device-plugin".to_owned()];
        argv.extend(plugin.args.clone().unwrap());
        hami_device_plugin::cli::Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{name}: serve-preload refuses its args: {e}"));
    }
    // The node name for the metrics' node label and the pod list.
    assert!(
        plugin
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "HAMI_NODE_NAME"
                && e.value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .map(|f| f.field_path.as_str())
                    == Some("spec.nodeName")),
        "{name}"
    );
    let ports: Vec<(&str, i32)> = plugin
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap_or(""), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [(
            "metrics",
            i32::try_from(values["metricsPort"].as_i64().unwrap()).unwrap()
        )],
        "{name}"
    );
    let sc = plugin.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_user, Some(0), "{name}");
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
    assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
    assert_ne!(sc.privileged, Some(true), "{name}");
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_owned()][..]),
        "{name}"
    );
    assert!(caps.add.is_none(), "{name}: {caps:?}");
    let mounts: Vec<(&str, &str, bool)> = plugin
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.name.as_str(),
                m.mount_path.as_str(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect();
    let regions = format!("{hook}/regions");
    assert_eq!(
        mounts,
        [
            ("device-plugins", kubelet_dir, false),
            ("hami-core", kai_dir, true),
            // The slot folders, written (made anew at Allocate); beside the hook folder, never in
            // it: a hostPath delivery mounts the hook folder into pods.
            ("regions", regions.as_str(), false),
            // kubelet's pod resources socket: List only.
            ("pod-resources", pod_resources.as_str(), true),
        ],
        "{name}"
    );
    for (volume, path, kind) in [
        ("regions", regions.as_str(), "DirectoryOrCreate"),
        ("pod-resources", pod_resources.as_str(), "DirectoryOrCreate"),
    ] {
        let host = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .and_then(|v| v.host_path.as_ref())
            .unwrap_or_else(|| panic!("{name}: no {volume} hostPath volume"));
        assert_eq!(
            (host.path.as_str(), host.type_.as_deref()),
            (path, Some(kind)),
            "{name}"
        );
    }
    // Its metrics: a headless Service on the metrics port.
    let service: &Service = s.get(&format!("{PREFIX}-hook-installer-metrics"));
    let spec = service.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "{name}");
    assert_eq!(
        spec.ports.as_ref().unwrap()[0].port,
        i32::try_from(values["metricsPort"].as_i64().unwrap()).unwrap(),
        "{name}"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "device-plugins")
        .unwrap_or_else(|| panic!("{name}: no device-plugins volume"));
    let host = volume.host_path.as_ref().unwrap();
    assert_eq!(
        (host.path.as_str(), host.type_.as_deref()),
        (kubelet_dir, Some("Directory")),
        "{name}"
    );
    assert_eq!(
        serde_json::to_value(&plugin.resources).unwrap(),
        values["preloadResources"],
        "{name}"
    );
}

fn image_ref(values: &Value, image: &Value) -> String {
    let mut repo = image["repository"].as_str().unwrap().to_owned();
    let registry = values["global"]["imageRegistry"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('/');
    if !registry.is_empty() {
        if let Some((first, rest)) = repo.split_once('/')
            && (first.contains('.') || first.contains(':') || first == "localhost")
        {
            repo = rest.to_owned();
        }
        repo = format!("{registry}/{repo}");
    }
    match image["digest"].as_str().filter(|d| !d.is_empty()) {
        Some(digest) => format!("{repo}@{digest}"),
        None => {
            let tag = image["tag"].as_str().filter(|t| !t.is_empty());
            format!("{repo}:{}", tag.unwrap_or("0.1.0"))
        }
    }
}

pub(super) fn assert_installs_hook(
    s: &Scenario,
    pod: &PodSpec,
    hook: &str,
    extra_args: &[String],
    extra_env: &[Value],
) {
    let name = &s.name;
    let vgpu = format!("{}/vgpu", hook.trim_end_matches('/'));
    let inits: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        inits,
        ["copy-hami-core", "install-hook"],
        "{name}: copy first, then install"
    );

    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let handoff = volumes["hami-core-image"]
        .empty_dir
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: hami-core-image is not an emptyDir"));
    assert_eq!(handoff.medium, None, "{name}: on disk, not in memory");
    assert!(handoff.size_limit.is_some(), "{name}: no sizeLimit");
    let host = volumes["hami-core"]
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: hami-core is not a hostPath"));
    assert_eq!(host.path, vgpu, "{name}");
    assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"), "{name}");
    let mounts = |c: &Container| -> BTreeMap<String, (String, bool)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                (
                    m.name.clone(),
                    (m.mount_path.clone(), m.read_only == Some(true)),
                )
            })
            .collect()
    };

    let copy = container(pod, "copy-hami-core");
    assert_eq!(
        copy.image.as_deref(),
        Some(image_ref(&s.values, &s.values["devicePlugin"]["hamiCore"]["image"]).as_str()),
        "{name}"
    );
    if s.values["global"]["imageRegistry"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        assert_eq!(copy.image.as_deref(), Some("projecthami/hami:v2.10.0"));
    }
    assert_eq!(
        copy.command.as_deref().unwrap(),
        ["/bin/sh", "-c"],
        "{name}: HAMi's image is assumed to have sh and cp only"
    );
    let script = &copy.args.as_ref().unwrap()[0];
    assert!(
        script.contains(r#"cp -RPf "$HAMI_CORE_SOURCE_DIR/." /hami-core/"#),
        "{name}: the whole folder, links kept as links: {script}"
    );
    let env: BTreeMap<_, _> = copy
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert_eq!(
        env,
        BTreeMap::from([
            ("HAMI_CORE_SOURCE_DIR", Some("/k8s-vgpu/lib/nvidia")),
            ("NVIDIA_VISIBLE_DEVICES", Some("void")),
        ]),
        "{name}"
    );
    assert_eq!(
        mounts(copy),
        BTreeMap::from([(
            "hami-core-image".to_owned(),
            ("/hami-core".to_owned(), false)
        )]),
        "{name}: HAMi's image never sees the host folder"
    );

    let install = container(pod, "install-hook");
    assert_eq!(
        install.image.as_deref(),
        Some(image_ref(&s.values, &s.values["devicePlugin"]["image"]).as_str()),
        "{name}: the device plugin image"
    );
    assert!(
        install.command.is_none(),
        "{name}: the image's entrypoint, hami-device-plugin"
    );
    let mut expected_args = vec![
        "install-hook".to_owned(),
        "--hami-core-dir=/hami-core".to_owned(),
        format!("--preload={}", preload_in_image()),
        format!("--hook-path={hook}"),
    ];
    // The node GPU file from the inventory when there is one, else from NVML.
    if s.has_inventory() {
        expected_args.push(format!("--inventory={INVENTORY_FILE}"));
    }
    expected_args.extend_from_slice(extra_args);
    assert_eq!(install.args.as_deref().unwrap(), expected_args, "{name}");
    let mut expected_mounts = BTreeMap::from([
        (
            "hami-core-image".to_owned(),
            ("/hami-core".to_owned(), true),
        ),
        ("hami-core".to_owned(), (vgpu.clone(), false)),
    ]);
    if s.has_inventory() {
        expected_mounts.insert("inventory".to_owned(), (INVENTORY_DIR.to_owned(), true));
        let cm = volumes["inventory"]
            .config_map
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: the inventory volume is not a ConfigMap"));
        assert_eq!(cm.name, format!("{PREFIX}-inventory"), "{name}");
        assert!(
            s.has_config_map(&cm.name),
            "{name}: {} not rendered",
            cm.name
        );
    }
    assert_eq!(
        mounts(install),
        expected_mounts,
        "{name}: container path = host path"
    );
    // NVML for the node GPU file (HAMi's image keeps `void`: a copy needs no GPU), then the
    // workload's extraEnv.
    let mut expected_env = vec![
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        json!({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}),
    ];
    expected_env.extend_from_slice(extra_env);
    let env: Vec<Value> = install
        .env
        .iter()
        .flatten()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(env, expected_env, "{name}: install-hook env");

    for c in [copy, install] {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            sc.run_as_user,
            Some(0),
            "{name}/{}: the host folder is root's",
            c.name
        );
        assert_eq!(sc.privileged, None, "{name}/{}", c.name);
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref().unwrap(), ["ALL"], "{name}/{}", c.name);
        assert!(caps.add.is_none(), "{name}/{}: no capability", c.name);
    }
}

#[test]
fn device_plugin_init_containers_install_hami_core_and_the_preload_library() {
    let mut checked = 0;
    for s in rendered().scenarios.values() {
        let Some(ds) = s
            .all::<DaemonSet>()
            .into_iter()
            .find(|d| d.name() == format!("{PREFIX}-device-plugin"))
        else {
            continue;
        };
        if s.values["devicePlugin"]["hamiCore"]["install"] == false {
            continue;
        }
        let hook = s.values["devicePlugin"]["hookPath"].as_str().unwrap();
        assert_installs_hook(s, pod_spec_of_daemonset(ds), hook, &[], &[]);
        checked += 1;
    }
    assert!(
        checked >= 3,
        "default, custom-names, hook-installer at least"
    );
    // A non-default hook path reaches the command.
    let s = scenario("hook-installer");
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let args = container(pod_spec_of_daemonset(ds), "install-hook")
        .args
        .clone()
        .unwrap();
    assert_eq!(args.last().unwrap(), "--hook-path=/opt/hami");
}

#[test]
fn hook_installer_is_off_by_default_and_fills_the_folder_kai_pods_mount() {
    let installer = format!("{PREFIX}-hook-installer");
    let mut enabled_in = Vec::new();
    for s in rendered().scenarios.values() {
        let enabled = s.values["hookInstaller"]["enabled"] == true;
        let daemonset = s.all::<DaemonSet>().iter().any(|d| d.name() == installer);
        let account = s
            .all::<ServiceAccount>()
            .iter()
            .any(|a| a.name() == installer);
        assert_eq!(
            (daemonset, account),
            (enabled, enabled),
            "{}: hook installer rendered iff hookInstaller.enabled",
            s.name
        );
        if !enabled {
            continue;
        }
        enabled_in.push(s.name.as_str());
        let values = &s.values["hookInstaller"];
        let ds: &DaemonSet = s.get(&installer);
        let pod = pod_spec_of_daemonset(ds);
        // The folder the webhook mounts into KAI pods is the one the installer fills.
        let kai_dir = s.webhook_settings()["kai"]["hookPath"]
            .as_str()
            .unwrap()
            .to_owned();
        let hook = kai_dir
            .strip_suffix("/vgpu")
            .unwrap_or_else(|| panic!("{}: {kai_dir} does not end in /vgpu", s.name));
        let extra: Vec<String> = serde_json::from_value(values["extraArgs"].clone()).unwrap();
        let extra_env = values["extraEnv"].as_array().unwrap();
        assert_installs_hook(s, pod, hook, &extra, extra_env);
        // The NVIDIA runtime for install-hook's NVML, as the device plugin has it.
        assert_eq!(
            pod.runtime_class_name.as_deref(),
            values["runtimeClassName"]
                .as_str()
                .filter(|r| !r.is_empty()),
            "{}",
            s.name
        );
        // A changed inventory rolls the pods (install-hook publishes the node GPU file from it).
        let template_annotations = ds
            .spec
            .as_ref()
            .and_then(|d| d.template.metadata.as_ref())
            .map(annotations)
            .unwrap_or_default();
        assert_eq!(
            template_annotations.contains_key("checksum/inventory"),
            s.has_inventory(),
            "{}: {template_annotations:?}",
            s.name
        );

        // API access only for the KAI region exporter (hookInstaller.podApi with the preload
        // plugin): list pods (their limits files) and create Events, nothing else.
        let preload = s.webhook_settings()["kai"]["hookDelivery"] == "device-plugin";
        let pod_api = preload && values["podApi"] == true;
        let sa: &ServiceAccount = s.get(&installer);
        assert_eq!(sa.automount_service_account_token, Some(false));
        assert_eq!(
            pod.automount_service_account_token,
            Some(pod_api),
            "{}",
            s.name
        );
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some(installer.as_str())
        );
        let roles: Vec<&ClusterRole> = s
            .all::<ClusterRole>()
            .into_iter()
            .filter(|r| r.name() == installer)
            .collect();
        if pod_api {
            let [role] = roles.as_slice() else {
                panic!("{}: no hook installer ClusterRole", s.name)
            };
            assert_eq!(
                rule_set(role.rules.as_deref().unwrap()),
                set(&[
                    "/pods:list[]",
                    "events.k8s.io/events:create[]",
                    "events.k8s.io/events:patch[]"
                ]),
                "{}",
                s.name
            );
            let binding: &ClusterRoleBinding = s.get(&installer);
            assert_eq!(binding.role_ref.name, installer);
        } else {
            assert!(roles.is_empty(), "{}: a ClusterRole without podApi", s.name);
        }
        // Placement and resources from its values.
        assert_eq!(
            serde_json::to_value(&pod.node_selector).unwrap(),
            values["nodeSelector"],
            "{}",
            s.name
        );
        assert_eq!(
            serde_json::to_value(&pod.tolerations).unwrap(),
            values["tolerations"],
            "{}",
            s.name
        );
        let priority = values["priorityClassName"].as_str().unwrap();
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some(priority).filter(|p| !p.is_empty()),
            "{}",
            s.name
        );
        let [main] = pod.containers.as_slice() else {
            panic!("{}: one container", s.name)
        };
        match s.webhook_settings()["kai"]["hookDelivery"]
            .as_str()
            .unwrap()
        {
            "device-plugin" => assert_serves_preload(s, pod, main, &kai_dir),
            "hostPath" => assert_only_sleeps(s, main),
            other => panic!("{}: kai.hookDelivery {other}", s.name),
        }
    }
    assert_eq!(
        enabled_in,
        [
            "hook-installer",
            "inventory",
            "kai-host-path",
            "kai-only",
            "overrides"
        ]
    );
    assert_eq!(
        scenario("default").values["hookInstaller"]["runtimeClassName"],
        ""
    );

    // KAI pods get HAMi-core through the hook installer's plugin by default; with the hostPath
    // layout it needs no kubelet folder.
    assert_eq!(
        scenario("default").webhook_settings()["kai"]["hookDelivery"],
        "device-plugin"
    );
    assert_eq!(
        scenario("default").values["hookInstaller"]["preloadSlots"],
        1024
    );
    let host_path = pod_spec_of_daemonset(scenario("kai-host-path").get(&installer));
    assert!(
        !host_path
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == "device-plugins"),
        "kai-host-path: the pause-only installer mounts no kubelet folder"
    );

    // Defaults: off; when on, GPU Feature Discovery's GPU nodes, tolerating the GPU taint.
    let defaults = &scenario("default").values["hookInstaller"];
    assert_eq!(defaults["enabled"], false);
    assert_eq!(
        defaults["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    assert_eq!(
        defaults["pauseImage"],
        json!({"repository": "registry.k8s.io/pause", "tag": "3.10", "digest": "", "pullPolicy": "IfNotPresent"})
    );

    // Beside the device plugin on a non-default hook path: both install into /opt/hami/vgpu, the
    // folder the webhook mounts into KAI pods.
    let s = scenario("hook-installer");
    assert_eq!(s.webhook_settings()["kai"]["hookPath"], "/opt/hami/vgpu");
    let pod = pod_spec_of_daemonset(s.get(&installer));
    // Helm merges maps: the default label stays unless set to null.
    assert_eq!(
        pod.node_selector.as_ref().unwrap(),
        &BTreeMap::from([
            ("kai.example.com/gpu-pool".to_owned(), "shared".to_owned()),
            ("nvidia.com/gpu.present".to_owned(), "true".to_owned())
        ])
    );
    assert_eq!(
        container(pod, "install-hook")
            .args
            .as_ref()
            .unwrap()
            .last()
            .unwrap(),
        "--hook-path=/opt/hami"
    );
    // A KAI cluster without HAMi: no device plugin, the KAI folder from webhook.kai.hookPath.
    let s = scenario("kai-only");
    assert!(
        s.all::<DaemonSet>()
            .iter()
            .all(|d| d.name() != format!("{PREFIX}-device-plugin"))
    );
    assert_eq!(s.webhook_settings()["kai"]["hookPath"], "/opt/kai/vgpu");
    let pod = pod_spec_of_daemonset(s.get(&installer));
    assert_eq!(
        container(pod, "install-hook")
            .args
            .as_ref()
            .unwrap()
            .last()
            .unwrap(),
        "--hook-path=/opt/kai"
    );
}

#[test]
fn install_hook_args_are_what_its_cli_reads_and_the_image_carries_the_library() {
    use clap::CommandFactory;
    use hami_device_plugin::cli::Cli;
    // The Dockerfile copies the library where `--preload` looks, in the device plugin image.
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    let stage = dockerfile
        .split("\nFROM ")
        .find(|s| s.contains(" AS device-plugin"))
        .expect("Dockerfile has a device-plugin stage");
    assert!(
        stage.lines().any(|l| l.starts_with("COPY --from=")
            && l.trim_end().ends_with(&format!(" {}", preload_in_image()))),
        "the device-plugin stage does not COPY the preload library to {}",
        preload_in_image()
    );

    assert!(
        Cli::command().find_subcommand("install-hook").is_some(),
        "hami-device-plugin has no install-hook sub-command"
    );
    let mut checked = 0;
    for s in rendered().scenarios.values() {
        for ds in s.all::<DaemonSet>() {
            let Some(c) = pod_spec_of_daemonset(ds)
                .init_containers
                .iter()
                .flatten()
                .find(|c| c.name == "install-hook")
            else {
                continue;
            };
            let args = c.args.clone().unwrap();
            let matches = Cli::command()
                .try_get_matches_from(
                    std::iter::once("hami-device-plugin".to_owned()).chain(args.clone()),
                )
                .unwrap_or_else(|e| {
                    panic!(
                        "{}/{}: hami-device-plugin refuses {args:?}: {e}",
                        s.name,
                        ds.name()
                    )
                });
            let (sub, m) = matches.subcommand().unwrap();
            assert_eq!(sub, "install-hook");
            let hook = args
                .iter()
                .find_map(|a| a.strip_prefix("--hook-path="))
                .unwrap();
            assert_eq!(
                m.try_get_one::<PathBuf>("hook_path").unwrap(),
                Some(&PathBuf::from(hook)),
                "{}/{}",
                s.name,
                ds.name()
            );
            assert_eq!(
                m.try_get_one::<PathBuf>("preload").unwrap(),
                Some(&PathBuf::from(preload_in_image()))
            );
            assert_eq!(
                m.try_get_one::<PathBuf>("inventory").unwrap(),
                s.has_inventory()
                    .then(|| PathBuf::from(INVENTORY_FILE))
                    .as_ref(),
                "{}/{}",
                s.name,
                ds.name()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "only {checked} install-hook containers checked"
    );
}

/// `devicePlugin.inventory` as the install-hook init containers of both DaemonSets read it: the
/// rendered ConfigMap, at the path `--inventory` names, lists the GPUs with their minor numbers,
/// and install-hook's plan publishes exactly the node GPU file those GPUs make.
#[test]
fn the_rendered_inventory_becomes_the_node_gpu_file() {
    use hami_device_plugin::commands::install_hook::{NodeGpusPlan, list_gpus, plan_node_gpus};
    let s = scenario("inventory");
    let text = s.config_data(&format!("{PREFIX}-inventory"), "inventory.yaml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inventory.yaml");
    std::fs::write(&file, &text).unwrap();
    let plan = plan_node_gpus(
        Path::new("/usr/local/vgpu/node-gpus"),
        list_gpus(Some(&file)),
    )
    .unwrap_or_else(|e| panic!("the chart's inventory is refused: {e}\n{text}"));
    let NodeGpusPlan::Publish { gpus, .. } = plan else {
        panic!("no node GPU file from {text}: {plan:?}")
    };
    assert_eq!(
        gpus.render(),
        "HAMI_NODE_GPUS_FORMAT=1\n\
         NVIDIA1_MIB=143771\n\
         NVIDIA1_UUID=GPU-22222222-bbbb-4000-8000-000000000002\n\
         NVIDIA3_MIB=143771\n\
         NVIDIA3_UUID=GPU-11111111-aaaa-4000-8000-000000000001\n"
    );
    // Both DaemonSets hand it to install-hook, and the plugin reads the same file.
    for ds in [
        format!("{PREFIX}-device-plugin"),
        format!("{PREFIX}-hook-installer"),
    ] {
        let pod = pod_spec_of_daemonset(s.get(&ds));
        let args = container(pod, "install-hook").args.clone().unwrap();
        assert!(
            args.contains(&format!("--inventory={INVENTORY_FILE}")),
            "{ds}: {args:?}"
        );
    }
    let plugin = container(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-plugin",
    );
    assert!(
        plugin
            .args
            .iter()
            .flatten()
            .any(|a| *a == format!("--inventory={INVENTORY_FILE}"))
    );
    // Without devicePlugin.inventory, nothing of it is rendered.
    let d = scenario("hook-installer");
    assert!(!d.has_config_map(&format!("{PREFIX}-inventory")));
}

/// Every key of `devicePlugin.inventory` the schema admits is one the plugin's inventory reader
/// takes: the rendered ConfigMaps of both inventory scenarios parse, with their links (so the
/// topology scores the plugin publishes through the chart are not zero), MIG devices and a GPU
/// without memory.
#[test]
fn the_rendered_inventory_is_what_the_plugins_reader_takes() {
    use hami_device_plugin::gpu::inventory::{FileInventory, GpuInventory, parse_inventory};
    use hami_device_plugin::gpu::topology::gpu_scores;
    let rendered = |name: &str| {
        let s = scenario(name);
        let text = s.config_data(&format!("{PREFIX}-inventory"), "inventory.yaml");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("inventory.yaml");
        std::fs::write(&file, &text).unwrap();
        (s, dir, file, text)
    };

    let (s, _dir, file, text) = rendered("inventory");
    let inventory = FileInventory::new(&file);
    let gpus = inventory
        .discover()
        .unwrap_or_else(|e| panic!("the chart's inventory is refused: {e}\n{text}"));
    let links = inventory
        .gpu_links()
        .unwrap_or_else(|e| panic!("the chart's inventory links are refused: {e}\n{text}"));
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    let scores = gpu_scores(&uuids, &links).unwrap();
    assert!(scores.asymmetric.is_empty(), "{:?}", scores.asymmetric);
    for device in &scores.devices {
        assert!(
            device.score.values().all(|score| *score > 0),
            "{}: {:?} (links {links:?})",
            device.uuid,
            device.score
        );
    }
    // The plugin publishes them: the chart turns topology-aware into ENABLE_TOPOLOGY_SCORE=true.
    let plugin = container(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-plugin",
    );
    assert_eq!(
        env_map(plugin)["ENABLE_TOPOLOGY_SCORE"].value.as_deref(),
        Some("true")
    );

    let (s, _dir, file, text) = rendered("inventory-mig");
    let gpus = parse_inventory(&file, &text)
        .unwrap_or_else(|e| panic!("the chart's inventory is refused: {e}\n{text}"));
    let entries = s.values["devicePlugin"]["inventory"].as_array().unwrap();
    assert_eq!(gpus.len(), entries.len());
    let mig = &gpus[0].mig_devices;
    assert_eq!(mig.len(), 1, "{gpus:?}");
    assert_eq!(
        (mig[0].index.as_str(), mig[0].paths.len()),
        ("0:0", 3),
        "{mig:?}"
    );
    let gb10 = &gpus[1];
    assert_eq!(
        (gb10.memory_mib, gb10.healthy),
        (0, false),
        "no memory reported: preConfiguredDeviceMemory stands in"
    );
}

//! ServiceMonitors, the vGPU monitor and the region exporter.

use super::*;

/// The device plugin's metrics port has a headless Service, and each ServiceMonitor scrapes the
/// `metrics` port of exactly one Service whose pods listen there.
#[test]
fn service_monitors_scrape_the_metrics_ports() {
    for s in rendered().scenarios.values() {
        if s.values["devicePlugin"]["enabled"] == true {
            let svc: &Service = s.get(&format!("{PREFIX}-device-plugin-metrics"));
            let spec = svc.spec.as_ref().unwrap();
            assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "{}", s.name);
            let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
            assert_eq!(
                spec.selector.as_ref(),
                ds.spec.as_ref().unwrap().selector.match_labels.as_ref(),
                "{}",
                s.name
            );
            let port = &spec.ports.as_ref().unwrap()[0];
            assert_eq!(
                i64::from(port.port),
                s.values["devicePlugin"]["metricsPort"].as_i64().unwrap()
            );
            assert_eq!(
                port.target_port,
                Some(IntOrString::String("metrics".into()))
            );
        }
        let monitors = s.all::<prometheus::ServiceMonitor>();
        let mut expected = ["devicePlugin", "webhook"]
            .iter()
            .filter(|c| {
                s.values[**c]["enabled"] == true
                    && s.values[**c]["serviceMonitor"]["enabled"] == true
            })
            .count();
        // The hook installer's preload-plugin (the KAI containers' regions).
        if s.values["hookInstaller"]["enabled"] == true
            && s.values["hookInstaller"]["serviceMonitor"]["enabled"] == true
            && s.webhook_settings()["kai"]["hookDelivery"] == "device-plugin"
        {
            expected += 1;
        }
        // HAMi's vGPU monitor (a DaemonSet of its own) is scraped with the plugin.
        if s.values["devicePlugin"]["enabled"] == true
            && s.values["devicePlugin"]["serviceMonitor"]["enabled"] == true
            && s.values["devicePlugin"]["monitor"]["enabled"] == true
        {
            expected += 1;
        }
        assert_eq!(monitors.len(), expected, "{}", s.name);
        for m in monitors {
            let wanted = m.spec.selector.match_labels.as_ref().unwrap();
            let services: Vec<&Service> = s
                .all::<Service>()
                .into_iter()
                .filter(|svc| {
                    let labels = svc.metadata.labels.as_ref().unwrap();
                    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
                })
                .collect();
            assert_eq!(services.len(), 1, "{}: {}", s.name, m.name());
            let monitor = m.name() == format!("{PREFIX}-vgpu-monitor");
            let ports: Vec<(&str, &str)> = m
                .spec
                .endpoints
                .iter()
                .map(|e| (e.port.as_str(), e.path.as_str()))
                .collect();
            let expected: &[(&str, &str)] = if monitor {
                &[("monitor", "/metrics")]
            } else {
                &[("metrics", "/metrics")]
            };
            assert_eq!(ports, expected, "{}: {}", s.name, m.name());
            for (port, _) in ports {
                assert!(
                    services[0]
                        .spec
                        .as_ref()
                        .unwrap()
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| p.name.as_deref() == Some(port)),
                    "{}: {} selects a Service without a {port} port",
                    s.name,
                    m.name()
                );
            }
            assert_eq!(m.spec.namespace_selector.match_names, [NS]);
        }
    }
    let s = scenario("overrides");
    let m: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(
        m.metadata.labels.as_ref().unwrap()["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(m.spec.endpoints[0].interval.as_deref(), Some("1m"));
}

/// HAMi's vGPU monitor beside the plugin (HAMi v2.10.0 `charts/hami/templates/device-plugin/
/// daemonsetnvidia.yaml`, container `vgpu-monitor`): the command, the environment its code reads
/// (`HOOK_PATH`, `NODE_NAME`, `HAMI_RESYNC_INTERVAL`), the per-container folders it scans, its
/// port on the metrics Service, and nothing of the host it does not use.
#[test]
fn vgpu_monitor_runs_apart_from_the_plugin_with_what_it_reads() {
    let s = scenario("default");
    let plugin = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin")));
    assert_eq!(
        plugin
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["device-plugin"],
        "the monitor never shares the plugin's pod (nor its token)"
    );
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-vgpu-monitor"));
    let pod = pod_spec_of_daemonset(ds);
    assert_eq!(
        pod.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["vgpu-monitor"]
    );
    assert!(pod.init_containers.is_none());
    // Its own ServiceAccount (list and watch pods only), on the plugin's nodes.
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(format!("{PREFIX}-vgpu-monitor").as_str())
    );
    assert_eq!(pod.node_selector, plugin.node_selector);
    assert_eq!(pod.tolerations, plugin.tolerations);
    assert_eq!(pod.priority_class_name, plugin.priority_class_name);
    assert_eq!(pod.runtime_class_name, plugin.runtime_class_name);
    let m = container(pod, "vgpu-monitor");
    assert_eq!(
        m.image.as_deref(),
        Some("projecthami/hami:v2.10.0"),
        "hamiCore.image"
    );
    assert_eq!(m.command.as_deref().unwrap(), ["vGPUmonitor"]);
    assert_eq!(m.args.as_deref().unwrap(), ["--metrics-bind-address=:9394"]);
    let env = env_map(m);
    let node = env["NODE_NAME"].value_from.as_ref().unwrap();
    assert_eq!(node.field_ref.as_ref().unwrap().field_path, "spec.nodeName");
    // The monitor scans $HOOK_PATH/containers: HOOK_PATH is the vgpu folder itself.
    assert_eq!(env["HOOK_PATH"].value.as_deref(), Some("/usr/local/vgpu"));
    assert_eq!(env["HAMI_RESYNC_INTERVAL"].value.as_deref(), Some("5m"));
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"].value.as_deref(), Some("all"));
    assert_eq!(
        env["NVIDIA_DRIVER_CAPABILITIES"].value.as_deref(),
        Some("utility")
    );
    let ports: Vec<(&str, i32)> = m
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports, [("monitor", 9394)]);
    let plugin_ports: Vec<i32> = container(plugin, "device-plugin")
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(plugin_ports, [9396], "the plugin moved off HAMi's 9394");
    // Mounts: the per-container folders read-write (feedback writes, dead folders removed), an
    // emptyDir /tmp (its MIG lock folder); never the library folder.
    let mounts: Vec<(&str, &str, Option<bool>)> = m
        .volume_mounts
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v.mount_path.as_str(), v.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("hami-containers", "/usr/local/vgpu/containers", None),
            ("monitor-tmp", "/tmp", None)
        ]
    );
    let host = volume(pod, "hami-containers").host_path.as_ref().unwrap();
    assert_eq!(
        (host.path.as_str(), host.type_.as_deref()),
        ("/usr/local/vgpu/containers", Some("DirectoryOrCreate"))
    );
    assert!(volume(pod, "monitor-tmp").empty_dir.is_some());
    // No host namespaces: v2.10.0 reads no /proc, /sys or runtime socket.
    assert_eq!(pod.host_pid, None);
    assert_eq!(pod.host_network, None);
    let sc = m.security_context.as_ref().unwrap();
    assert_eq!(
        (sc.run_as_user, sc.privileged, sc.allow_privilege_escalation),
        (Some(0), Some(false), Some(false))
    );
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref().unwrap(), ["ALL"]);
    assert!(
        caps.add.is_none(),
        "the monitor (UID 0) owns what it reads and removes: root's folders, usage.cache 0666"
    );
    // A headless Service of its own carries its port.
    let svc: &Service = s.get(&format!("{PREFIX}-vgpu-monitor"));
    assert_eq!(
        svc.spec.as_ref().unwrap().selector.as_ref(),
        ds.spec.as_ref().unwrap().selector.match_labels.as_ref()
    );
    let ports: Vec<(&str, i32, IntOrString)> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.as_deref().unwrap(),
                p.port,
                p.target_port.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("monitor", 9394, IntOrString::String("monitor".into()))]
    );
}

#[test]
fn vgpu_monitor_can_be_turned_off_or_tuned() {
    let s = scenario("no-monitor");
    let name = format!("{PREFIX}-vgpu-monitor");
    assert!(s.all::<DaemonSet>().iter().all(|d| d.name() != name));
    assert!(s.all::<Service>().iter().all(|d| d.name() != name));
    assert!(s.all::<ServiceAccount>().iter().all(|d| d.name() != name));
    assert!(s.all::<ClusterRole>().iter().all(|d| d.name() != name));
    let svc: &Service = s.get(&format!("{PREFIX}-device-plugin-metrics"));
    let names: Vec<&str> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["metrics"]);
    let sm: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(sm.spec.endpoints.len(), 1);
    assert_eq!(s.all::<prometheus::ServiceMonitor>().len(), 1);

    let s = scenario("monitor-custom");
    let pod = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-vgpu-monitor")));
    let m = container(pod, "vgpu-monitor");
    assert_eq!(m.image.as_deref(), Some("mirror.example.com/hami:v2.10.1"));
    assert_eq!(m.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        m.args.as_deref().unwrap(),
        [
            "--metrics-bind-address=:9500",
            "-v=4",
            "--legacy-metrics=true"
        ]
    );
    let env = env_map(m);
    assert_eq!(env["HOOK_PATH"].value.as_deref(), Some("/opt/hami/vgpu"));
    assert_eq!(env["HAMI_RESYNC_INTERVAL"].value.as_deref(), Some("90s"));
    assert_eq!(env["KLOG_V"].value.as_deref(), Some("4"));
    assert_eq!(
        m.volume_mounts.as_ref().unwrap()[0].mount_path,
        "/opt/hami/vgpu/containers"
    );
    let sc = m.security_context.as_ref().unwrap();
    assert_eq!(
        sc.se_linux_options.as_ref().unwrap().type_.as_deref(),
        Some("spc_t")
    );
    assert_eq!(sc.read_only_root_filesystem, Some(true), "hardening kept");
    assert_eq!(
        m.ports.as_ref().unwrap()[0].container_port,
        9500,
        "monitor.port"
    );
    let plugin = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin")));
    assert_eq!(
        container(plugin, "device-plugin").ports.as_ref().unwrap()[0].container_port,
        9394,
        "the plugin may take 9394 when the monitor is elsewhere"
    );
    for (service, port) in [
        (format!("{PREFIX}-device-plugin-metrics"), 9394),
        (format!("{PREFIX}-vgpu-monitor"), 9500),
    ] {
        let svc: &Service = s.get(&service);
        let ports: Vec<i32> = svc
            .spec
            .as_ref()
            .unwrap()
            .ports
            .iter()
            .flatten()
            .map(|p| p.port)
            .collect();
        assert_eq!(ports, [port], "{service}");
    }
    for (monitor, port) in [("device-plugin", "metrics"), ("vgpu-monitor", "monitor")] {
        let sm: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-{monitor}"));
        let endpoints: Vec<&str> = sm.spec.endpoints.iter().map(|e| e.port.as_str()).collect();
        assert_eq!(endpoints, [port], "{monitor}");
    }
}

/// The region metrics of KAI nodes are scraped like the device plugin's, and the documented alert
/// is rendered only when asked for, on the metric and label the exporters publish.
#[test]
fn region_exporter_service_monitor_and_alert() {
    let s = scenario("hook-installer");
    let sm: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-hook-installer"));
    assert_eq!(
        sm.metadata.labels.as_ref().unwrap()["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(sm.spec.endpoints[0].port, "metrics");
    let rule: &prometheus::PrometheusRule = s.get(&format!("{PREFIX}-region"));
    assert_eq!(
        rule.metadata.labels.as_ref().unwrap()["role"],
        "alert-rules"
    );
    let [group] = rule.spec.groups.as_slice() else {
        panic!("one rule group")
    };
    let [alert] = group.rules.as_slice() else {
        panic!("one rule")
    };
    assert_eq!(alert.alert, "HamiGpuContainerUncapped");
    assert_eq!(
        alert.expr,
        r#"sum by (node) (hami_limits_region_cap_verdict{verdict="uncapped"}) > 0"#
    );
    assert_eq!(alert.for_, "5m");
    assert_eq!(alert.labels["severity"], "warning");
    assert!(alert.annotations["summary"].contains("{{ $labels.node }}"));
    // The docs show the same rule.
    let guide = std::fs::read_to_string(repo_root().join("docs/operator-guide.md")).unwrap();
    assert!(
        guide.contains(&alert.expr),
        "docs/operator-guide.md lacks {}",
        alert.expr
    );
    // Off by default; the interval reaches both exporters.
    for other in rendered().scenarios.values() {
        let alerting = other.values["regionExport"]["alert"]["enabled"] == true;
        assert_eq!(
            !other.all::<prometheus::PrometheusRule>().is_empty(),
            alerting,
            "{}",
            other.name
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
            .any(|a| a == "--region-interval=15"),
        "{:?}",
        plugin.args
    );
    // The metric and label the alert reads are the exporters' own.
    let text =
        std::fs::read_to_string(repo_root().join("device-plugin/src/regions/export.rs")).unwrap();
    assert!(text.contains("pub const PREFIX: &str = \"hami_limits_region\";"));
    assert!(text.contains("\"cap_verdict\""));
}

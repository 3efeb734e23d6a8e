//! The webhook's Deployment, its MutatingWebhookConfiguration and the settings file it loads.

use super::*;

#[test]
fn webhook_deployment_is_hardened_and_probed() {
    let s = scenario("default");
    let d: &Deployment = s.get(&format!("{PREFIX}-webhook"));
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = pod_spec_of_deployment(d);
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let anti = pod
        .affinity
        .as_ref()
        .unwrap()
        .pod_anti_affinity
        .as_ref()
        .unwrap();
    let term = &anti
        .preferred_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        term.pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert_eq!(
        term.pod_affinity_term
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels,
        spec.selector.match_labels,
        "anti-affinity selects the webhook's own pods"
    );
    let c = container(pod, "webhook");
    assert_eq!(
        c.args.as_deref().unwrap(),
        ["serve", "--config=/etc/hami-limits/webhook.yaml"]
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref().unwrap(),
        ["ALL"]
    );
    let res = c.resources.as_ref().unwrap();
    assert!(res.requests.as_ref().unwrap().contains_key("cpu"));
    let ports: BTreeMap<_, _> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("https".to_owned(), 9443), ("metrics".to_owned(), 9090)])
    );
    for (probe, path) in [
        (c.liveness_probe.as_ref(), "/healthz"),
        (c.readiness_probe.as_ref(), "/readyz"),
    ] {
        let get = probe.unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            IntOrString::String("metrics".into()),
            "probes use the metrics port"
        );
    }
    // The settings file the webhook reads listens where the container ports say.
    let settings = s.webhook_settings();
    assert_eq!(settings["server"]["listen"], "0.0.0.0:9443");
    assert_eq!(settings["server"]["metricsListen"], "0.0.0.0:9090");
    assert_eq!(settings["server"]["tlsCert"], "/tls/tls.crt");
    assert_eq!(settings["server"]["tlsKey"], "/tls/tls.key");
    assert_eq!(settings["server"]["bodyLimitBytes"], 8_388_608);
    // Only the serving pair reaches the webhook, never ca.key.
    let tls = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "tls")
        .unwrap()
        .secret
        .as_ref()
        .unwrap();
    assert_eq!(
        tls.secret_name.as_deref(),
        Some("hl-hami-limits-webhook-tls")
    );
    let keys: Vec<_> = tls.items.iter().flatten().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["tls.crt", "tls.key"]);
    assert_eq!(tls.default_mode, Some(0o440));
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "tls")
        .unwrap();
    assert_eq!(mount.mount_path, "/tls");

    let pdb: &PodDisruptionBudget = s.get(&format!("{PREFIX}-webhook"));
    let pdb_spec = pdb.spec.as_ref().unwrap();
    assert_eq!(pdb_spec.min_available, Some(IntOrString::Int(1)));
    assert_eq!(
        pdb_spec.selector.as_ref().unwrap().match_labels,
        spec.selector.match_labels
    );

    let svc: &Service = s.get(&format!("{PREFIX}-webhook"));
    let svc_spec = svc.spec.as_ref().unwrap();
    assert_eq!(svc_spec.selector, spec.selector.match_labels);
    let https = svc_spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https"))
        .unwrap();
    assert_eq!(https.port, 443);
    assert_eq!(https.target_port, Some(IntOrString::String("https".into())));
}

#[test]
fn one_replica_gets_no_pdb_that_would_block_drains() {
    let s = scenario("ignore-no-conditions");
    assert!(s.all::<PodDisruptionBudget>().is_empty());
    let d: &Deployment = s.get(&format!("{PREFIX}-webhook"));
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
}

#[test]
fn mutating_webhook_configuration_defaults() {
    let s = scenario("default");
    let mwc = s.webhook_config();
    let hooks = mwc.webhooks.as_ref().unwrap();
    assert_eq!(
        hooks.len(),
        1,
        "CREATE only: the UPDATE rules are the ValidatingAdmissionPolicy's"
    );
    let w = &hooks[0];
    assert_eq!(w.admission_review_versions, ["v1"]);
    assert_eq!(w.side_effects, "None");
    assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(w.timeout_seconds, Some(10));
    assert_eq!(w.reinvocation_policy.as_deref(), Some("IfNeeded"));
    let rules = w.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].operations.as_deref().unwrap(), ["CREATE"]);
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    assert_eq!(rules[0].api_groups.as_deref().unwrap(), [""]);
    let svc = w.client_config.service.as_ref().unwrap();
    assert_eq!(svc.name, format!("{PREFIX}-webhook"));
    assert_eq!(svc.namespace, NS);
    assert_eq!(svc.path.as_deref(), Some("/mutate"));
    assert_eq!(svc.port, Some(443));
    assert!(
        w.client_config.ca_bundle.is_none(),
        "offline render: certgen's patch Job fills caBundle"
    );
    assert!(annotations(&mwc.metadata).is_empty());

    let ns_sel = w
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    let by_key: BTreeMap<_, _> = ns_sel.iter().map(|e| (e.key.as_str(), e)).collect();
    let names = by_key["kubernetes.io/metadata.name"];
    assert_eq!(names.operator, "NotIn");
    // KAI's reservation pods are KAI's: its binding never waits for this webhook.
    assert_eq!(
        names.values.as_deref().unwrap(),
        [NS, "kube-system", "kai-resource-reservation"]
    );
    assert_eq!(by_key["hami.io/webhook"].operator, "NotIn");
    assert_eq!(
        by_key["hami.io/webhook"].values.as_deref().unwrap(),
        ["ignore"]
    );
    assert!(
        w.object_selector.is_none(),
        "a pod's own labels must never skip the review"
    );

    let conditions = w.match_conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 1);
    let expr = &conditions[0].expression;
    for needle in [
        "'gpu-memory'",
        "'gpu-fraction'",
        "'hami.io/limit-delivery'",
        "\"hami.io/bind-phase\"",
        "\"hami.io/vgpu-devices-to-allocate\"",
        "initContainers",
        "requests",
        "limits",
        "'NVIDIA_VISIBLE_DEVICES'",
        "'nvidia-container-devices'",
        "\"hami.io/bind-phase\"",
        "\"hami.io/vgpu-devices-to-allocate\"",
        "object.metadata.labels",
    ] {
        assert!(
            expr.contains(needle),
            "matchConditions lacks {needle}: {expr}"
        );
    }
    for r in HAMI_RESOURCES {
        assert!(
            expr.contains(&format!("'{r}'")),
            "matchConditions lacks resource {r}"
        );
    }
    assert_eq!(
        expr.matches('(').count(),
        expr.matches(')').count(),
        "unbalanced CEL: {expr}"
    );
}

#[test]
fn kai_settings_and_per_gpu_vram() {
    let default = scenario("default").webhook_settings();
    assert_eq!(default["schedulerName"], "hami-scheduler");
    assert_eq!(default["denyPrivilegedGpuContainers"], true);
    assert_eq!(default["kai"]["schedulerNames"], json!(["kai-scheduler"]));
    assert_eq!(default["kai"]["hookPath"], "/usr/local/vgpu");
    assert_eq!(default["kai"]["preloadContainers"], "fraction");
    assert_eq!(default["kai"]["limitDelivery"], "file");
    // Fail closed: a gpu-fraction pod without a VRAM basis is refused unless the operator opts out.
    assert_eq!(default["kai"]["missingBasis"], "deny");
    assert!(
        default["kai"].get("perGpuVramMib").is_none(),
        "detection from node labels by default"
    );

    let vram = scenario("per-gpu-vram").webhook_settings();
    assert_eq!(vram["kai"]["perGpuVramMib"], 81920);

    let kai = scenario("kai").webhook_settings();
    assert_eq!(
        kai["kai"]["schedulerNames"],
        json!(["kai-scheduler", "kai-scheduler-batch"])
    );
    assert_eq!(kai["kai"]["hookPath"], "/opt/vgpu");
    assert_eq!(kai["kai"]["preloadContainers"], "all");
    assert_eq!(kai["kai"]["limitDelivery"], "env");
    assert_eq!(kai["kai"]["missingBasis"], "warn");
}

/// `webhook.tenancy` reaches the webhook's `tenancy:` section; the device plugin's own
/// ServiceAccount is always among the scheduler-annotation writers (it erases its entry and sets
/// bind-phase), once, and only when the chart installs the device plugin.
#[test]
fn tenancy_settings_reach_the_webhook() {
    let plugin = format!("system:serviceaccount:hami-system:{PREFIX}-device-plugin");
    let default = scenario("default").webhook_settings();
    assert_eq!(
        default["tenancy"],
        json!({
            "schedulerAnnotationWriters": ["system:serviceaccount:kube-system:hami-scheduler", plugin],
            "allowHamiCoreEnvNamespaces": [],
            "allowVisibleDevicesNamespaces": [],
            "forbidEnvDeliveryNamespaces": [],
            "kaiOptOutNamespaces": [],
        })
    );
    let kai = scenario("kai").webhook_settings();
    assert_eq!(
        kai["tenancy"],
        json!({
            "schedulerAnnotationWriters": [
                "system:serviceaccount:hami-system:hami-scheduler",
                "system:serviceaccount:hami-limits:hami-limits-device-plugin",
                plugin,
            ],
            "allowHamiCoreEnvNamespaces": ["legacy-ml"],
            "allowVisibleDevicesNamespaces": ["gpu-monitoring"],
            "forbidEnvDeliveryNamespaces": ["tenant-a", "tenant-b"],
            "kaiOptOutNamespaces": ["kai-debug"],
        })
    );
    let webhook_only = scenario("webhook-only").webhook_settings();
    assert_eq!(
        webhook_only["tenancy"]["schedulerAnnotationWriters"],
        json!(["system:serviceaccount:kube-system:hami-scheduler"])
    );
}

#[test]
fn custom_resource_names_reach_config_and_match_conditions() {
    let s = scenario("custom-names");
    let nvidia = s.device_config();
    assert_eq!(nvidia["resourceCountName"], "example.com/vgpu");
    assert_eq!(nvidia["gpuCorePolicy"], "force");
    assert_eq!(nvidia["libCudaLogLevel"], 3);
    assert_eq!(nvidia["deviceMemoryScaling"], 2);
    assert_eq!(s.webhook_settings()["nvidia"], nvidia);
    let expr = &s.webhook_config().webhooks.as_ref().unwrap()[0]
        .match_conditions
        .as_ref()
        .unwrap()[0]
        .expression;
    assert!(expr.contains("'example.com/vgpu'") && expr.contains("'example.com/vgpu-memory'"));
    assert!(!expr.contains("'nvidia.com/gpu'"));
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
    let hook = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "hami-core")
        .unwrap();
    assert_eq!(hook.host_path.as_ref().unwrap().path, "/opt/hami/vgpu");
    let c = container(pod, "device-plugin");
    let env = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "HAMI_HOOK_PATH")
        .unwrap();
    assert_eq!(env.value.as_deref(), Some("/opt/hami"));
    assert_eq!(
        s.webhook_settings()["kai"]["hookPath"],
        "/opt/hami/vgpu",
        "KAI pods get the plugin's HAMi-core"
    );
}

#[test]
fn rendered_webhook_settings_load_with_the_webhooks_loader() {
    let dir = tempfile::tempdir().unwrap();
    for s in rendered().scenarios.values() {
        if !s.has_config_map(&format!("{PREFIX}-webhook")) {
            continue;
        }
        let path = dir.path().join(format!("{}-webhook.yaml", s.name));
        let mut text = s.config_data(&format!("{PREFIX}-webhook"), "webhook.yaml");
        let existing = s.values["deviceConfig"]["existingConfigMap"] != "";
        if existing {
            // The mounted ConfigMap is HAMi's: its file as HAMi's chart renders it.
            let mounted = "deviceConfigFile: /etc/hami-device-config/device-config.yaml";
            assert!(text.contains(mounted), "{}: {text}", s.name);
            text = text.replace(
                mounted,
                &format!("deviceConfigFile: {}", hami_device_config().display()),
            );
        }
        std::fs::write(&path, text).unwrap();
        // `load` returns the settings and the deprecation notices: the chart uses no old name.
        let (settings, notices) =
            hami_webhook::policy::settings::Settings::load_from_env(Some(&path), std::env::vars())
                .unwrap_or_else(|e| {
                    panic!("{}: webhook.yaml refused by hami-webhook: {e}", s.name)
                });
        assert!(notices.is_empty(), "{}: {notices:?}", s.name);
        let loaded = serde_json::to_value(&settings).unwrap();
        let mut rendered = s.webhook_settings();
        // The webhook reads HAMi's whole device config and ignores the keys it has no use for
        // (defaultMemory, deviceSplitCount, ...): compare only the ones it knows.
        let nvidia = if existing {
            let object = rendered.as_object_mut().unwrap();
            assert!(!object.contains_key("nvidia"), "{}: two sources", s.name);
            object.remove("deviceConfigFile").unwrap();
            let hami: Value =
                serde_yaml_ng::from_str(&std::fs::read_to_string(hami_device_config()).unwrap())
                    .unwrap();
            hami["nvidia"].clone()
        } else {
            rendered.as_object_mut().unwrap().remove("nvidia").unwrap()
        };
        for (key, value) in loaded["nvidia"].as_object().unwrap() {
            assert!(
                same(&nvidia[key], value),
                "{}: nvidia.{key}: rendered {}, loaded {value}",
                s.name,
                nvidia[key]
            );
        }
        assert_known_keys(&format!("{}: webhook.yaml", s.name), &rendered, &loaded);
    }
}

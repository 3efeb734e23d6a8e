//! What every scenario renders: only known kinds, unique names, references that resolve, locked-down
//! containers; each component alone; overrides that keep the hardening.

use super::*;

#[test]
fn every_scenario_renders_only_known_kinds_with_unique_names() {
    let r = rendered();
    let expected = [
        "admission-policy-off",
        "allow-lists",
        "cert-manager",
        "cert-manager-issuer",
        "custom-names",
        "default",
        "device-plugin-only",
        "env-delivery",
        "existing-device-config",
        "hami-values",
        "hook-installer",
        "ignore-no-conditions",
        "inventory",
        "inventory-mig",
        "kai",
        "kai-host-path",
        "kai-only",
        "monitor-custom",
        "no-monitor",
        "no-vap-api",
        "overrides",
        "per-gpu-vram",
        "per-node",
        "scheduler-identities",
        "webhook-only",
    ];
    assert_eq!(
        r.scenarios.keys().map(String::as_str).collect::<Vec<_>>(),
        expected
    );
    for s in r.scenarios.values() {
        assert!(!s.manifests.is_empty(), "{}: nothing rendered", s.name);
        let mut seen = BTreeSet::new();
        for m in &s.manifests {
            let v = manifest_value(m);
            let key = format!(
                "{}/{}/{}",
                v["kind"], v["metadata"]["namespace"], v["metadata"]["name"]
            );
            assert!(seen.insert(key.clone()), "{}: duplicate {key}", s.name);
            let ns = v["metadata"]["namespace"].as_str();
            assert!(
                ns.is_none() || ns == Some(NS),
                "{}: {key} outside the release namespace",
                s.name
            );
            let labels = &v["metadata"]["labels"];
            assert_eq!(
                labels["app.kubernetes.io/instance"], "hl",
                "{}: {key} lacks instance label",
                s.name
            );
            assert_eq!(labels["app.kubernetes.io/part-of"], "hami-limits");
        }
    }
    let total: usize = r.scenarios.values().map(|s| s.manifests.len()).sum();
    eprintln!(
        "parsed {total} manifests in {} scenarios",
        r.scenarios.len()
    );
}

#[test]
fn every_reference_resolves_and_every_container_is_locked_down() {
    for s in rendered().scenarios.values() {
        let accounts: BTreeSet<&str> = s.all::<ServiceAccount>().iter().map(|a| a.name()).collect();
        let maps: BTreeSet<&str> = s.all::<ConfigMap>().iter().map(|a| a.name()).collect();
        let mut specs: Vec<(&str, &PodSpec)> = Vec::new();
        for d in s.all::<Deployment>() {
            specs.push((d.name(), pod_spec_of_deployment(d)));
        }
        for d in s.all::<DaemonSet>() {
            specs.push((d.name(), pod_spec_of_daemonset(d)));
        }
        for j in s.all::<Job>() {
            specs.push((
                j.name(),
                j.spec.as_ref().unwrap().template.spec.as_ref().unwrap(),
            ));
        }
        for c in s.all::<CronJob>() {
            let job = c.spec.as_ref().unwrap().job_template.spec.as_ref().unwrap();
            specs.push((c.name(), job.template.spec.as_ref().unwrap()));
        }
        for (owner, spec) in specs {
            let sa = spec.service_account_name.as_deref().unwrap();
            assert!(
                accounts.contains(sa),
                "{}: {owner} uses missing ServiceAccount {sa}",
                s.name
            );
            // deviceConfig.existingConfigMap: a ConfigMap the chart mounts but does not own.
            let external = s.values["deviceConfig"]["existingConfigMap"].as_str();
            for v in spec.volumes.iter().flatten() {
                if let Some(cm) = &v.config_map {
                    assert!(
                        maps.contains(cm.name.as_str()) || external == Some(cm.name.as_str()),
                        "{}: {owner} mounts missing ConfigMap {}",
                        s.name,
                        cm.name
                    );
                }
            }
            for c in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                for m in c.volume_mounts.iter().flatten() {
                    assert!(
                        spec.volumes.iter().flatten().any(|v| v.name == m.name),
                        "{}: {owner}/{} mounts undeclared volume {}",
                        s.name,
                        c.name,
                        m.name
                    );
                }
                let sc = c
                    .security_context
                    .as_ref()
                    .unwrap_or_else(|| panic!("{owner}/{}: no securityContext", c.name));
                assert_eq!(
                    sc.read_only_root_filesystem,
                    Some(true),
                    "{}: {owner}/{}",
                    s.name,
                    c.name
                );
                assert_eq!(
                    sc.allow_privilege_escalation,
                    Some(false),
                    "{}: {owner}/{}",
                    s.name,
                    c.name
                );
                let caps = sc.capabilities.as_ref();
                assert_eq!(
                    caps.and_then(|c| c.drop.as_deref()),
                    Some(&["ALL".to_owned()][..]),
                    "{}: {owner}/{}",
                    s.name,
                    c.name
                );
                if c.name != "device-plugin" {
                    assert!(
                        caps.and_then(|c| c.add.as_ref()).is_none(),
                        "{}: {owner}/{} adds capabilities",
                        s.name,
                        c.name
                    );
                }
                assert!(
                    c.resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.contains_key("memory")),
                    "{}: {owner}/{}: no memory limit",
                    s.name,
                    c.name
                );
            }
        }
        let roles: BTreeSet<&str> = s.all::<Role>().iter().map(|a| a.name()).collect();
        for b in s.all::<RoleBinding>() {
            assert!(
                roles.contains(b.role_ref.name.as_str()),
                "{}: RoleBinding to missing Role",
                s.name
            );
            for subject in b.subjects.iter().flatten() {
                assert!(
                    accounts.contains(subject.name.as_str()),
                    "{}: binds missing SA {}",
                    s.name,
                    subject.name
                );
            }
        }
        let cluster_roles: BTreeSet<&str> =
            s.all::<ClusterRole>().iter().map(|a| a.name()).collect();
        for b in s.all::<ClusterRoleBinding>() {
            assert!(
                cluster_roles.contains(b.role_ref.name.as_str()),
                "{}: binding to missing ClusterRole",
                s.name
            );
            for subject in b.subjects.iter().flatten() {
                assert!(
                    accounts.contains(subject.name.as_str()),
                    "{}: binds missing SA {}",
                    s.name,
                    subject.name
                );
                assert_eq!(subject.namespace.as_deref(), Some(NS));
            }
        }
    }
}

#[test]
fn components_can_be_installed_alone() {
    let s = scenario("webhook-only");
    assert!(s.all::<DaemonSet>().is_empty());
    assert_eq!(s.all::<Deployment>().len(), 1);
    let s = scenario("device-plugin-only");
    assert!(s.all::<Deployment>().is_empty());
    assert!(s.all::<MutatingWebhookConfiguration>().is_empty());
    assert!(
        s.all::<Job>().is_empty(),
        "no certificates without the webhook"
    );
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    assert!(pod.init_containers.is_none(), "hamiCore.install: false");
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .all(|v| v.name != "hami-core-image"),
        "no hand-off folder without the init containers"
    );
}

/// Scenario `overrides`: per-workload labels, annotations, security overlays (the chart's
/// hardening kept), extra arguments and environment, mirror registry, digests, pull secret.
#[test]
fn overrides_reach_every_workload_and_keep_the_hardening() {
    let s = scenario("overrides");
    let mut specs: Vec<(String, &k8s_openapi::api::core::v1::PodTemplateSpec)> = Vec::new();
    for d in s.all::<Deployment>() {
        specs.push((d.name().to_owned(), &d.spec.as_ref().unwrap().template));
    }
    for d in s.all::<DaemonSet>() {
        specs.push((d.name().to_owned(), &d.spec.as_ref().unwrap().template));
    }
    for j in s.all::<Job>() {
        specs.push((j.name().to_owned(), &j.spec.as_ref().unwrap().template));
    }
    for c in s.all::<CronJob>() {
        let job = c.spec.as_ref().unwrap().job_template.spec.as_ref().unwrap();
        specs.push((c.name().to_owned(), &job.template));
    }
    assert_eq!(specs.len(), 7);
    for (owner, template) in specs {
        let meta = template.metadata.as_ref().unwrap();
        let labels = meta.labels.as_ref().unwrap();
        let component = labels["app.kubernetes.io/component"].as_str();
        // HAMi's vGPU monitor, a DaemonSet of its own, takes the device plugin's pod overrides.
        let (section, owned_by) = match component {
            "webhook" => (&s.values["webhook"], component),
            "device-plugin" => (&s.values["devicePlugin"], component),
            "vgpu-monitor" => (&s.values["devicePlugin"], "device-plugin"),
            "hook-installer" => (&s.values["hookInstaller"], component),
            "certgen" => (&s.values["certs"]["certgen"], component),
            other => panic!("{owner}: component {other}: podLabels overrode a selector label"),
        };
        assert_eq!(labels["team.example.com/owner"], owned_by, "{owner}");
        assert_eq!(
            annotations(meta)["policy.example.com/owner"],
            owned_by,
            "{owner}"
        );
        let pod = template.spec.as_ref().unwrap();
        assert_eq!(
            pod.image_pull_secrets.as_ref().unwrap()[0].name,
            "mirror-pull",
            "{owner}"
        );
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            psc.se_linux_options.as_ref().unwrap().type_.as_deref(),
            Some("spc_t"),
            "{owner}"
        );
        assert_eq!(psc.supplemental_groups.as_deref(), Some(&[4242][..]));
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault",
            "{owner}: the chart's seccomp profile kept"
        );
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(
                sc.se_linux_options.as_ref().unwrap().level.as_deref(),
                Some("s0"),
                "{owner}/{}",
                c.name
            );
            assert_eq!(
                sc.app_armor_profile.as_ref().unwrap().type_,
                "RuntimeDefault"
            );
            assert!(
                c.image
                    .as_deref()
                    .unwrap()
                    .starts_with("registry.example.com:5000/mirror/"),
                "{owner}/{}: {:?}",
                c.name,
                c.image
            );
        }
        // extraEnv is appended to the container that takes the workload's extra settings (the
        // monitor has its own, devicePlugin.monitor.extraEnv).
        if component == "vgpu-monitor" {
            continue;
        }
        let target = match component {
            "hook-installer" => "install-hook",
            "certgen" => pod.containers[0].name.as_str(),
            other => other,
        };
        let env: Vec<Value> = container(pod, target)
            .env
            .iter()
            .flatten()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        let extra = section["extraEnv"].as_array().unwrap();
        assert!(env.ends_with(extra), "{owner}/{target}: {env:?}");
    }
}

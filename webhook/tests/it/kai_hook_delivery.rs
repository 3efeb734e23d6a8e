//! `kai.hookDelivery: device-plugin` (the default): a KAI pod's preloaded containers get one
//! `hami.io/preload` (limits and requests) instead of a hostPath volume, so the pod passes Pod
//! Security `baseline`; kubelet mounts the hook through the hook installer's device plugin. Every
//! patch is applied with `json-patch` to the original pod, the result must deserialize into
//! k8s-openapi's `Pod`, and a second review must change nothing.

use hami_webhook::policy::basis::NoBasis;
use hami_webhook::policy::kai::{HookDelivery, KaiSettings, PreloadContainers};
use hami_webhook::policy::settings::Settings;
use hami_webhook::{Decision, decide_pod};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use crate::support::offline_online;

const SMALL: &str = include_str!("../fixtures/kai-fraction-small.json");
const PRELOAD: &str = "hami.io/preload";

fn small() -> Value {
    let v: Value = serde_json::from_str(SMALL).unwrap();
    v["request"]["object"].clone()
}

fn settings() -> Settings {
    let s = Settings {
        kai: KaiSettings {
            per_gpu_vram_mib: Some(16384),
            ..KaiSettings::default()
        },
        ..Settings::default()
    };
    assert_eq!(
        s.kai.hook_delivery,
        HookDelivery::DevicePlugin,
        "the default"
    );
    s
}

fn decide(pod: &Value, settings: &Settings) -> Decision {
    offline_online::check_in("kai_hook_delivery", pod, "ml-team", settings, &NoBasis);
    let bytes = serde_json::to_vec(pod).unwrap();
    let view: hami_webhook::wire::pod::Pod<'_> = serde_json::from_slice(&bytes).unwrap();
    decide_pod(&view, Some("ml-team"), settings, &NoBasis)
}

fn denial(pod: &Value, settings: &Settings) -> String {
    match decide(pod, settings) {
        Decision::Deny { message } => message,
        other => panic!("expected a denial, got {other:?}"),
    }
}

/// Decide, apply, deserialize; a second review of the result patches nothing.
fn mutate(pod: &Value, settings: &Settings) -> (Pod, Vec<Value>) {
    let Decision::Allow { patch, .. } = decide(pod, settings) else {
        panic!("denied: {:?}", decide(pod, settings));
    };
    let ops = serde_json::to_value(&patch).unwrap();
    let parsed: json_patch::Patch = serde_json::from_value(ops.clone()).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &parsed).unwrap_or_else(|e| panic!("{e}: {ops:#}"));
    match decide(&doc, settings) {
        Decision::Allow { patch: again, .. } => {
            assert!(again.is_empty(), "second review patched: {again:?}");
        }
        other => panic!("second review: {other:?}"),
    }
    (
        serde_json::from_value(doc).unwrap(),
        ops.as_array().cloned().unwrap_or_default(),
    )
}

fn preload_of(c: &Container) -> (Option<&Quantity>, Option<&Quantity>) {
    let r = c.resources.as_ref();
    (
        r.and_then(|r| r.limits.as_ref()?.get(PRELOAD)),
        r.and_then(|r| r.requests.as_ref()?.get(PRELOAD)),
    )
}

fn one() -> Quantity {
    Quantity("1".to_owned())
}

fn mount_paths(c: &Container) -> Vec<&str> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect()
}

/// What Pod Security `baseline` checks of volumes: no `hostPath`.
fn host_path_volumes(pod: &Pod) -> Vec<&str> {
    pod.spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.as_str())
        .collect()
}

#[test]
fn fraction_container_gets_the_resource_and_no_host_path() {
    let (pod, _) = mutate(&small(), &settings());
    let c = &pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(preload_of(c), (Some(&one()), Some(&one())));
    // The pod's own resources are kept.
    let r = c.resources.as_ref().unwrap();
    assert_eq!(r.limits.as_ref().unwrap()["cpu"], Quantity("4".into()));
    assert_eq!(r.requests.as_ref().unwrap()["cpu"], Quantity("2".into()));
    assert!(
        host_path_volumes(&pod).is_empty(),
        "{:?}",
        host_path_volumes(&pod)
    );
    // kubelet mounts the hook (Allocate), the limits file is still the downward-API volume.
    assert_eq!(
        mount_paths(c),
        [
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "/overrideEnv"
        ]
    );
    let env: Vec<(&str, Option<&str>)> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert!(
        env.contains(&("CUDA_DEVICE_MEMORY_LIMIT", Some("4096m"))),
        "{env:?}"
    );
}

#[test]
fn containers_without_resources_limits_or_requests_get_whole_objects() {
    // (resources of the container, the ops' paths expected)
    let cases: &[(Value, &[&str])] = &[
        (Value::Null, &["/spec/containers/0/resources"]),
        (
            json!({}),
            &[
                "/spec/containers/0/resources/limits",
                "/spec/containers/0/resources/requests",
            ],
        ),
        (
            json!({"limits": {"cpu": "1"}}),
            &[
                "/spec/containers/0/resources/limits/hami.io~1preload",
                "/spec/containers/0/resources/requests",
            ],
        ),
        (
            json!({"requests": {"cpu": "1"}}),
            &[
                "/spec/containers/0/resources/limits",
                "/spec/containers/0/resources/requests/hami.io~1preload",
            ],
        ),
        (
            json!({"limits": null, "requests": null}),
            &[
                "/spec/containers/0/resources/limits",
                "/spec/containers/0/resources/requests",
            ],
        ),
    ];
    for (resources, expected) in cases {
        let mut pod = small();
        let c = &mut pod["spec"]["containers"][0];
        if resources.is_null() {
            c.as_object_mut().unwrap().remove("resources");
        } else {
            c["resources"] = resources.clone();
        }
        let (out, ops) = mutate(&pod, &settings());
        let c = &out.spec.as_ref().unwrap().containers[0];
        assert_eq!(preload_of(c), (Some(&one()), Some(&one())), "{resources}");
        let paths: Vec<&str> = ops
            .iter()
            .filter_map(|op| op["path"].as_str())
            .filter(|p| p.contains("/resources"))
            .collect();
        assert_eq!(&paths, expected, "{resources}");
    }
}

#[test]
fn every_preloaded_container_gets_one_and_only_they_do() {
    let mut pod = small();
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sidecar", "image": "busybox"}));
    pod["spec"]["initContainers"] = json!([{"name": "init", "image": "busybox"}]);
    let (out, _) = mutate(&pod, &settings());
    let spec = out.spec.as_ref().unwrap();
    assert_eq!(
        preload_of(&spec.containers[0]),
        (Some(&one()), Some(&one()))
    );
    assert_eq!(preload_of(&spec.containers[1]), (None, None));
    assert_eq!(
        preload_of(&spec.init_containers.as_ref().unwrap()[0]),
        (None, None)
    );

    let all = Settings {
        kai: KaiSettings {
            preload_containers: PreloadContainers::All,
            ..settings().kai
        },
        ..settings()
    };
    let (out, _) = mutate(&pod, &all);
    let spec = out.spec.as_ref().unwrap();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        assert_eq!(preload_of(c), (Some(&one()), Some(&one())), "{}", c.name);
    }
    assert!(host_path_volumes(&out).is_empty());
}

#[test]
fn the_pod_cannot_choose_its_own_preload() {
    let s = settings();
    // A container the webhook does not preload may not take HAMi-core by itself.
    let mut sidecar = small();
    sidecar["spec"]["containers"].as_array_mut().unwrap().push(
        json!({"name": "sidecar", "image": "busybox", "resources": {"limits": {PRELOAD: "1"}}}),
    );
    let message = denial(&sidecar, &s);
    assert!(
        message.contains("container \"sidecar\" requests hami.io/preload")
            && message.contains("kai.preloadContainers"),
        "{message}"
    );
    // Other amounts on the preloaded container: every slot held is one another pod lacks.
    for resources in [
        json!({"limits": {PRELOAD: "2"}}),
        json!({"limits": {PRELOAD: "1"}, "requests": {PRELOAD: "1000"}}),
        json!({"requests": {PRELOAD: "1"}}),
        json!({"limits": {PRELOAD: "1000m"}}),
    ] {
        let mut pod = small();
        pod["spec"]["containers"][0]["resources"] = resources.clone();
        let message = denial(&pod, &s);
        assert!(
            message.contains("container \"train\" sets hami.io/preload")
                && message.contains("remove it"),
            "{resources}: {message}"
        );
    }
    // Exactly what an earlier review set is accepted and left alone.
    let mut ours = small();
    ours["spec"]["containers"][0]["resources"] =
        json!({"limits": {PRELOAD: "1"}, "requests": {PRELOAD: "1"}});
    let (out, ops) = mutate(&ours, &s);
    assert!(
        !ops.iter()
            .any(|op| op["path"].as_str().unwrap_or("").contains("/resources")),
        "{ops:?}"
    );
    assert_eq!(
        preload_of(&out.spec.as_ref().unwrap().containers[0]),
        (Some(&one()), Some(&one()))
    );
    // In hostPath delivery the resource is not the webhook's: nothing is said about it.
    let host_path = Settings {
        kai: KaiSettings {
            hook_delivery: HookDelivery::HostPath,
            ..s.kai.clone()
        },
        ..s.clone()
    };
    assert!(matches!(
        decide(&sidecar, &host_path),
        Decision::Allow { .. }
    ));
}

#[test]
fn own_mounts_over_the_hook_are_denied_even_in_the_old_volume_name() {
    let s = settings();
    for (volume, path, sub_path) in [
        ("mine", "/etc", None),
        ("mine", "/etc/ld.so.preload", Some("x")),
        ("mine", "/usr/local", None),
        ("mine", "/usr/local/vgpu/libvgpu.so", None),
        // Exactly what the hostPath layout would add is not ours in this mode.
        (
            "kai-resource-isolator-vgpu",
            "/etc/ld.so.preload",
            Some("ld.so.preload"),
        ),
        ("kai-resource-isolator-vgpu", "/usr/local/vgpu", None),
    ] {
        let mut pod = small();
        pod["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": volume, "emptyDir": {}}));
        let mut mount = json!({"name": volume, "mountPath": path});
        if let Some(sub) = sub_path {
            mount["subPath"] = json!(sub);
        }
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(mount);
        let message = denial(&pod, &s);
        assert!(
            message.contains("resource \"hami.io/preload\" (kubelet mounts it)")
                && message.contains(path),
            "{path}: {message}"
        );
    }
}

#[test]
fn hook_delivery_setting_reads_two_values_and_names_them_otherwise() {
    for (text, expected) in [
        ("\"device-plugin\"", HookDelivery::DevicePlugin),
        ("\"hostPath\"", HookDelivery::HostPath),
    ] {
        assert_eq!(
            serde_json::from_str::<HookDelivery>(text).unwrap(),
            expected
        );
        assert_eq!(serde_json::to_string(&expected).unwrap(), text);
    }
    for bad in ["\"hostpath\"", "\"devicePlugin\"", "\"\""] {
        let e = serde_json::from_str::<HookDelivery>(bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is not one of: device-plugin, hostPath"),
            "{bad}: {e}"
        );
    }
    let kai: KaiSettings = serde_json::from_value(json!({"hookDelivery": "hostPath"})).unwrap();
    assert_eq!(kai.hook_delivery, HookDelivery::HostPath);
}

//! The hostile tenant on the real node: every pod-only route around the cap that a tenant with
//! namespaced pod rights can try (docs/design.md, "Threat model: the hostile tenant"), attempted
//! as that tenant (`--as system:serviceaccount:tenant:mallory`, a Role with pod, exec, ConfigMap
//! and Secret rights in its own namespace only). Each route ends one of two ways: refused, with a
//! message naming the field, or the container runs with the granted cap in every process
//! (`env -i`, `su -`, the entrypoint). Never uncapped, never a changed limit, no file outside the
//! container's folder created or changed. Each outcome is printed as `route: ... -> outcome`.

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    GPU_0, GPU_1, NODE, NS, Node, PREFIX, TENANT, assert_capped_inside, bind, delete_pod, hami_pod,
    kai_pod, pod_uid, schedule_and_bind_as_hami, text, wait_for, wait_running, workload_pod,
};

/// The tenant: a ServiceAccount of the tenant namespace, impersonated by the admin.
const TENANT_USER: &str = "system:serviceaccount:tenant:mallory";

/// The webhook's refusal as kubectl prints it.
const WEBHOOK_DENIED: &str = r#"admission webhook "mutate.hami-limits.hami.io" denied the request"#;

impl Node {
    /// kubectl as the tenant.
    fn as_tenant(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        let mut all = vec!["--as", TENANT_USER];
        all.extend(args);
        self.kubectl(&all, stdin)
    }

    fn tenant_create(&self, object: &Value) -> std::process::Output {
        self.as_tenant(&["create", "-f", "-"], Some(&object.to_string()))
    }
}

fn outcome(route: &str, what: &str) {
    println!("  route: {route} -> {what}");
}

/// The pod is refused and the message names every string of `names`.
fn refused(n: &Node, route: &str, pod: &Value, names: &[&str]) {
    let out = n.tenant_create(pod);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{route}: admitted (should be refused):\n{}",
        text(&out.stdout)
    );
    for name in names {
        assert!(
            err.contains(name),
            "{route}: refusal does not name {name:?}: {err}"
        );
    }
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    assert!(
        n.try_get("pod", TENANT, name).is_none(),
        "{route}: the pod exists after its refusal"
    );
    let first = err.lines().next().unwrap_or_default();
    outcome(
        route,
        &format!("refused ({})", first.chars().take(160).collect::<String>()),
    );
}

/// Set up the tenant identity once: a Role with the rights the threat model gives a tenant.
pub fn tenant_identity(n: &mut Node) {
    n.ok(&["create", "serviceaccount", "mallory", "-n", TENANT], None);
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "tenant", "namespace": TENANT},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"],
             "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["pods/exec", "pods/log"], "verbs": ["create", "get"]},
            {"apiGroups": [""], "resources": ["configmaps", "secrets"],
             "verbs": ["create", "get", "list", "update", "patch", "delete"]},
        ],
    });
    n.ok(&["apply", "-f", "-"], Some(&role.to_string()));
    n.ok(
        &[
            "create",
            "rolebinding",
            "tenant",
            "-n",
            TENANT,
            "--role=tenant",
            "--serviceaccount=tenant:mallory",
        ],
        None,
    );
    // The tenant may do what the threat model says, and nothing cluster-wide.
    for (verb, resource, ns, want) in [
        ("create", "pods", Some(TENANT), "yes"),
        ("patch", "pods", Some(TENANT), "yes"),
        ("create", "pods", Some("default"), "no"),
        ("patch", "nodes", None, "no"),
        ("patch", "mutatingwebhookconfigurations", None, "no"),
        ("patch", "validatingadmissionpolicies", None, "no"),
        ("patch", "namespaces", None, "no"),
    ] {
        let mut args = vec!["auth", "can-i", verb, resource];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = n.as_tenant(&args, None);
        assert_eq!(
            text(&out.stdout).trim(),
            want,
            "tenant can-i {verb} {resource} in {ns:?}"
        );
    }
}

/// A GPU pod for the tenant: HAMi resources, no variables of its own.
fn gpu_pod(name: &str) -> Value {
    let mut p = hami_pod(name, 2000, 20);
    p["spec"]["containers"][0]["env"] = json!([]);
    p
}

/// Item 1: the pod label that used to skip admission skips nothing.
pub fn label_does_not_skip_admission(n: &mut Node) {
    let mut p = gpu_pod("ignore-label");
    p["metadata"]["labels"] = json!({"hami.io/webhook": "ignore"});
    p["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
    // The hook folder is mounted at its host path (HAMi's layout): here the node's.
    let hook = n.hook().display().to_string();
    for (i, path) in ["/overrideEnv", "/etc/ld.so.preload", hook.as_str(), "/etc"]
        .iter()
        .enumerate()
    {
        p["metadata"]["name"] = json!(format!("ignore-label-{i}"));
        p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "mine", "mountPath": path}]);
        refused(
            n,
            &format!("label hami.io/webhook=ignore + own mount at {path}"),
            &p,
            &[WEBHOOK_DENIED],
        );
    }
    // Without the mount the label changes nothing: the pod is mutated like any other.
    let mut p = gpu_pod("ignore-label-plain");
    p["metadata"]["labels"] = json!({"hami.io/webhook": "ignore"});
    let out = n.tenant_create(&p);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = n.get("pod", Some(TENANT), "ignore-label-plain");
    assert_eq!(got["spec"]["schedulerName"], "hami-scheduler");
    outcome(
        "label hami.io/webhook=ignore, no mount",
        "admitted and mutated (sent to HAMi's scheduler)",
    );
    delete_pod(n, "ignore-label-plain");
}

/// Item 3: HAMi-core's variables and the weaker modes, from the pod spec.
pub fn hami_core_variables_from_the_spec(n: &mut Node) {
    n.ok(
        &[
            "create",
            "configmap",
            "evil",
            "-n",
            TENANT,
            "--from-literal=CUDA_DEVICE_MEMORY_LIMIT_0=80g",
            "--from-literal=CUDA_DISABLE_CONTROL=true",
        ],
        None,
    );
    let plain = |name: &str, env: Value| {
        let mut p = gpu_pod(name);
        p["spec"]["containers"][0]["env"] = env;
        p
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "own CUDA_DEVICE_MEMORY_LIMIT_0=80g",
            plain(
                "v-mem",
                json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}]),
            ),
            "CUDA_DEVICE_MEMORY_LIMIT_0",
        ),
        (
            "own CUDA_DEVICE_MEMORY_LIMIT=80g",
            plain(
                "v-mem-global",
                json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}]),
            ),
            "CUDA_DEVICE_MEMORY_LIMIT",
        ),
        (
            "own CUDA_DEVICE_SM_LIMIT=100",
            plain(
                "v-sm",
                json!([{"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}]),
            ),
            "CUDA_DEVICE_SM_LIMIT",
        ),
        (
            "own CUDA_DISABLE_CONTROL=true",
            plain(
                "v-disable",
                json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
            ),
            "CUDA_DISABLE_CONTROL",
        ),
        (
            "own CUDA_DEVICE_MEMORY_SHARED_CACHE",
            plain(
                "v-cache",
                json!([{"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/tmp/mine.cache"}]),
            ),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        ),
        (
            "own GPU_CORE_UTILIZATION_POLICY=disable",
            plain(
                "v-policy",
                json!([{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}]),
            ),
            "GPU_CORE_UTILIZATION_POLICY",
        ),
        (
            "own CUDA_TASK_PRIORITY=0",
            plain(
                "v-priority",
                json!([{"name": "CUDA_TASK_PRIORITY", "value": "0"}]),
            ),
            "CUDA_TASK_PRIORITY",
        ),
        (
            "CUDA_DEVICE_MEMORY_LIMIT_0 by valueFrom (ConfigMap)",
            plain(
                "v-valuefrom",
                json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT_0",
                        "valueFrom": {"configMapKeyRef": {"name": "evil", "key": "CUDA_DEVICE_MEMORY_LIMIT_0"}}}]),
            ),
            "CUDA_DEVICE_MEMORY_LIMIT_0",
        ),
        (
            "CUDA_DISABLE_CONTROL by valueFrom (field of the pod)",
            plain(
                "v-fieldref",
                json!([{"name": "CUDA_DISABLE_CONTROL",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['x']"}}}]),
            ),
            "CUDA_DISABLE_CONTROL",
        ),
    ];
    for (route, pod, names) in &cases {
        refused(n, route, pod, &[WEBHOOK_DENIED, names]);
    }
    // envFrom a ConfigMap that holds the variables: no prefix can be checked at admission.
    let mut p = gpu_pod("v-envfrom");
    p["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "evil"}}]);
    refused(
        n,
        "envFrom a ConfigMap of HAMi-core variables",
        &p,
        &[WEBHOOK_DENIED, "envFrom"],
    );
    // Env delivery: the design's per-pod choice stays honoured, but the spec's own value is
    // still refused (in env delivery kubelet would let it win over Allocate's).
    let mut p = plain(
        "v-env-delivery",
        json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}]),
    );
    p["metadata"]["annotations"] = json!({"hami.io/limit-delivery": "env"});
    refused(
        n,
        "hami.io/limit-delivery: env + own CUDA_DEVICE_MEMORY_LIMIT_0=80g",
        &p,
        &[WEBHOOK_DENIED, "CUDA_DEVICE_MEMORY_LIMIT_0"],
    );
    // The same variable in an init container that asks for a GPU.
    let mut p = gpu_pod("v-init");
    let mut init = p["spec"]["containers"][0].clone();
    init["name"] = json!("init");
    init["command"] = json!(["true"]);
    init["env"] = json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]);
    p["spec"]["initContainers"] = json!([init]);
    refused(
        n,
        "GPU init container with CUDA_DISABLE_CONTROL=true",
        &p,
        &[WEBHOOK_DENIED, "CUDA_DISABLE_CONTROL"],
    );
    // A privileged GPU container sees every GPU.
    let mut p = gpu_pod("v-privileged");
    p["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    refused(
        n,
        "privileged GPU container",
        &p,
        &[WEBHOOK_DENIED, "privileged"],
    );
    n.ok(&["delete", "configmap", "evil", "-n", TENANT], None);
}

/// Item 3, KAI: the fraction container's own limit, and the opt-outs by pod.
pub fn kai_routes(n: &mut Node) {
    let mut p = kai_pod("kai-own", json!({"gpu-fraction": "0.5"}));
    p["spec"]["containers"][0]["env"] =
        json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1000g"}]);
    refused(
        n,
        "KAI fraction container with its own CUDA_DEVICE_MEMORY_LIMIT_0=1000g",
        &p,
        &[WEBHOOK_DENIED, "CUDA_DEVICE_MEMORY_LIMIT_0"],
    );
    // The opt-outs by pod annotation and by pod label are the operator's now: ignored here,
    // the pod is injected and capped like any other.
    for (name, annotations, labels) in [
        (
            "kai-optout-annotation",
            json!({"gpu-memory": "3000", "kai-resource-isolator.io/inject": "false"}),
            json!({"kai.scheduler/queue": "default-queue"}),
        ),
        (
            "kai-optout-label",
            json!({"gpu-memory": "3000"}),
            json!({"kai.scheduler/queue": "default-queue", "kai-resource-isolator.io/webhook": "ignore"}),
        ),
    ] {
        let mut p = kai_pod(name, annotations);
        p["metadata"]["labels"] = labels;
        let out = n.tenant_create(&p);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        bind(n, name);
        wait_running(n, name);
        assert_capped_inside(n, name, &[("CUDA_DEVICE_MEMORY_LIMIT", "3000m")]);
        outcome(
            &format!("KAI opt-out by pod ({name})"),
            "ignored: injected and capped at 3000m in every process",
        );
        delete_pod(n, name);
    }
}

/// Item 2: HAMi's scheduler annotations written by the tenant.
pub fn scheduler_annotations(n: &mut Node) {
    let devices = format!("{GPU_0},NVIDIA,143771,100:;");
    let forged = json!({
        "hami.io/vgpu-node": NODE,
        "hami.io/vgpu-time": "1",
        "hami.io/vgpu-devices-to-allocate": devices,
        "hami.io/vgpu-devices-allocated": devices,
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": super::now().to_string(),
    });
    // CREATE with the annotations and a preset nodeName: the annotations are stripped, kubelet's
    // Allocate finds no entry for the pod, and it never runs.
    let mut p = gpu_pod("forged-create");
    p["metadata"]["annotations"] = forged.clone();
    p["spec"]["nodeName"] = json!(NODE);
    let out = n.tenant_create(&p);
    if out.status.success() {
        let got = n.get("pod", Some(TENANT), "forged-create");
        let kept: Vec<&String> = got["metadata"]["annotations"]
            .as_object()
            .map(|a| {
                a.keys()
                    .filter(|k| forged.get(k.as_str()).is_some())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            kept.is_empty(),
            "scheduler annotations kept on CREATE: {kept:?}"
        );
        wait_for(
            "the forged pod to fail admission on the node",
            Duration::from_secs(90),
            || {
                n.try_get("pod", TENANT, "forged-create")
                    .is_some_and(|p| p["status"]["phase"] == "Failed")
            },
        );
        let got = n.get("pod", Some(TENANT), "forged-create");
        assert!(
            got["status"]["containerStatuses"].is_null()
                || got["status"]["containerStatuses"][0]["state"]["running"].is_null(),
            "the forged pod ran: {}",
            got["status"]
        );
        outcome(
            "CREATE with scheduler annotations + spec.nodeName",
            &format!(
                "annotations stripped, Allocate refused, pod Failed ({})",
                got["status"]["reason"].as_str().unwrap_or("")
            ),
        );
        delete_pod(n, "forged-create");
    } else {
        let err = text(&out.stderr);
        assert!(
            err.contains("hami.io/"),
            "refusal does not name the key: {err}"
        );
        outcome(
            "CREATE with scheduler annotations + spec.nodeName",
            "refused",
        );
    }
    // UPDATE of a pending pod by the tenant: refused by the ValidatingAdmissionPolicy.
    let out = n.tenant_create(&gpu_pod("forged-update"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (key, value) in forged.as_object().into_iter().flatten() {
        let arg = format!("{key}={}", value.as_str().unwrap_or_default());
        let out = n.as_tenant(
            &[
                "annotate",
                "pod",
                "forged-update",
                "-n",
                TENANT,
                "--overwrite",
                &arg,
            ],
            None,
        );
        let err = text(&out.stderr);
        assert!(!out.status.success(), "tenant could set {key}");
        assert!(
            err.contains(key),
            "refusal of {key} does not name it: {err}"
        );
    }
    outcome(
        "kubectl annotate a pending pod with each scheduler annotation",
        "refused by the ValidatingAdmissionPolicy, naming the key",
    );
    // The limits.hami.io/* annotations of a running KAI pod are frozen.
    let out = n.tenant_create(&kai_pod("frozen", json!({"gpu-memory": "3000"})));
    assert!(out.status.success(), "{}", text(&out.stderr));
    for arg in [
        "limits.hami.io/cuda=CUDA_DEVICE_MEMORY_LIMIT=1000g",
        "limits.hami.io/cuda-",
    ] {
        let out = n.as_tenant(
            &[
                "annotate",
                "pod",
                "frozen",
                "-n",
                TENANT,
                "--overwrite",
                arg,
            ],
            None,
        );
        assert!(!out.status.success(), "tenant could {arg}");
        assert!(
            text(&out.stderr).contains("limits.hami.io/"),
            "{}",
            text(&out.stderr)
        );
    }
    outcome(
        "rewrite or remove limits.hami.io/<container> on UPDATE",
        "refused by the ValidatingAdmissionPolicy",
    );
    // The real scheduler (here the admin plays it) still places pods.
    schedule_and_bind_as_hami(n, "forged-update", GPU_1, 2000, 20);
    wait_running(n, "forged-update");
    assert_capped_inside(
        n,
        "forged-update",
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "2000m"),
            ("CUDA_DEVICE_SM_LIMIT", "20"),
        ],
    );
    delete_pod(n, "forged-update");
    delete_pod(n, "frozen");
}

/// Item 1 and 2, the device plugin's backstop: a pod admitted without the webhook
/// (failurePolicy Ignore while it is down) with its own mount at /overrideEnv, or an entry
/// beyond the node's GPU, never starts.
pub fn admitted_without_the_webhook(n: &mut Node) {
    let config = PREFIX.to_owned();
    let set_policy = |policy: &str| {
        let patch =
            json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy}]);
        n.ok(
            &[
                "patch",
                "mutatingwebhookconfiguration",
                &config,
                "--type=json",
                "-p",
                &patch.to_string(),
            ],
            None,
        );
    };
    let deploy = format!("deployment/{PREFIX}-webhook");
    set_policy("Ignore");
    n.ok(&["scale", "-n", NS, &deploy, "--replicas=0"], None);
    wait_for("no webhook pod", Duration::from_secs(60), || {
        n.ok(&["get", "pods", "-n", NS, "-o", "name"], None)
            .lines()
            .all(|l| !l.contains("-webhook-"))
    });
    let mut p = gpu_pod("bypass-mount");
    p["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
    p["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "mine", "mountPath": "/overrideEnv"}]);
    let out = n.tenant_create(&p);
    assert!(out.status.success(), "{}", text(&out.stderr));
    schedule_and_bind_as_hami(n, "bypass-mount", GPU_0, 2000, 20);
    let failed = || {
        n.try_get("pod", TENANT, "bypass-mount").is_some_and(|p| {
            p["status"]["phase"] == "Failed"
                || p["metadata"]["annotations"]["hami.io/bind-phase"] == "failed"
        })
    };
    wait_for(
        "Allocate to refuse the pod's own mount",
        Duration::from_secs(90),
        failed,
    );
    let got = n.get("pod", Some(TENANT), "bypass-mount");
    assert!(
        got["status"]["containerStatuses"][0]["state"]["running"].is_null(),
        "the pod with its own /overrideEnv runs: {}",
        got["status"]
    );
    let events = n.ok(
        &[
            "get",
            "events",
            "-n",
            TENANT,
            "--field-selector",
            "involvedObject.name=bypass-mount",
            "-o",
            "json",
        ],
        None,
    );
    assert!(
        events.contains("/overrideEnv"),
        "no Event names the path: {events}"
    );
    outcome(
        "admitted without the webhook, own mount at /overrideEnv",
        "Allocate refused it with an Event naming /overrideEnv; never ran",
    );
    delete_pod(n, "bypass-mount");
    set_policy("Fail");
    n.ok(&["scale", "-n", NS, &deploy, "--replicas=2"], None);
    n.ok(
        &["rollout", "status", "-n", NS, &deploy, "--timeout=120s"],
        None,
    );
    wait_for(
        "the webhook to answer again",
        Duration::from_secs(60),
        || {
            let out = n.tenant_create(&gpu_pod("webhook-back-2"));
            out.status.success()
        },
    );
    delete_pod(n, "webhook-back-2");
}

/// Item 4: the per-container folder. A non-root user of the container cannot replace
/// usage.cache with a link; the file on the host stays a root-owned regular file.
pub fn container_folder_links(n: &mut Node) {
    let out = n.tenant_create(&gpu_pod("links"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    schedule_and_bind_as_hami(n, "links", GPU_0, 2000, 20);
    wait_running(n, "links");
    let attempt = "ln -sf /etc/passwd-owned /usr/local/vgpu/usage.cache \
                   || rm -f /usr/local/vgpu/usage.cache \
                   || mv /usr/local/vgpu/usage.cache /usr/local/vgpu/x";
    let (code, _, _) = n.exec("links", &["su", "nobody", "-s", "/bin/sh", "-c", attempt]);
    let (_, ls, _) = n.exec("links", &["ls", "-la", "/usr/local/vgpu/"]);
    let uid = pod_uid(n, "links");
    let host = n.hook().join(format!("containers/{uid}_cuda/usage.cache"));
    let meta = std::fs::symlink_metadata(&host)
        .unwrap_or_else(|e| panic!("{}: {e}\n{ls}", host.display()));
    assert!(
        meta.file_type().is_file(),
        "usage.cache on the host is not a regular file after the tenant's attempt (exit {code}):\n{ls}"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid(), 0, "usage.cache is not root-owned:\n{ls}");
    outcome(
        "non-root user replaces usage.cache with a link",
        "refused by the folder's permissions; usage.cache stays root's regular file",
    );
    delete_pod(n, "links");
}

/// Item 6: a pod whose node affinity would cost seconds of CPU is refused, naming the limit.
pub fn affinity_cost(n: &mut Node) {
    let values: Vec<String> = (0..60_000).map(|i| format!("n{i:05}")).collect();
    let mut p = kai_pod("affinity", json!({"gpu-fraction": "0.5"}));
    p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": values}]}]}}});
    refused(
        n,
        "KAI fraction pod with one NotIn of 60,000 values",
        &p,
        &[WEBHOOK_DENIED, "values"],
    );
}

/// Item 7: the tenant namespace enforces Pod Security `baseline` (every GPU pod of this test runs
/// there): a pod of the tenant's own with a `hostPath` of the host's `/`, or privileged, is refused
/// by the API server's PodSecurity admission.
pub fn pod_security_baseline(n: &mut Node) {
    let mut host = workload_pod("host-root", json!({}), json!({}), json!([]));
    host["spec"]["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]);
    host["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "root", "mountPath": "/host"}]);
    refused(
        n,
        "a pod mounting the host's / (hostPath)",
        &host,
        &["violates PodSecurity", "hostPath"],
    );
    let mut privileged = workload_pod("cpu-privileged", json!({}), json!({}), json!([]));
    privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    refused(
        n,
        "a privileged pod without a GPU",
        &privileged,
        &["violates PodSecurity", "privileged"],
    );
}

//! The chart and both programs against a **real** control plane: etcd, kube-apiserver (default
//! admission plugins: MutatingAdmissionWebhook runs as in a real cluster), kube-controller-manager
//! and kube-scheduler, built from source by `scripts/k8s-build` and started by `scripts/cluster`.
//!
//! One cluster serves every case (starting one costs ~15 s on two cores); the cases run in order
//! and the cluster is stopped, by PID, whatever happens: a failing case, a panic, or a failing
//! setup. `harness = false` gives this file its own `main` for that.
//!
//! The webhook runs as a process on this host (no kubelet yet): the chart is installed by real
//! Helm, and the chart's own `service` clientConfig reaches it through a hand-written EndpointSlice
//! of the chart's Service with this host's address (the API server runs with
//! `--enable-aggregator-routing`, so it dials an endpoint of the Service, not its ClusterIP).
//! The webhook runs with the chart's ConfigMap as its settings file, certgen's Secret as its
//! certificate, and its ServiceAccount's token (not the admin's) for the node watch.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::collections::BTreeMap;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use hami_tests::local::{binary, free_port};
use hami_tests::real::{
    Case, StandIn, StandInSpec, https_stand_in, ignored_unless_asked, listed, repo, rfc3339,
    run_cases, text, wait_for,
};

mod peers;
use serde_json::{Value, json};

/// Why plain `cargo test` leaves this suite out (`scripts/test-all` runs it with `--ignored`).
const NEEDS: &str = "needs a Kubernetes build (scripts/k8s-build): run by scripts/test-all (see docs/development.md)";
const NS: &str = "hami-system";
const RELEASE: &str = "hl";
const PREFIX: &str = "hl-hami-limits";
const TENANT: &str = "tenant";
/// Pods here are created with the offline mutation already applied; the namespace label keeps
/// the webhook away (the chart's namespaceSelector).
const OFFLINE: &str = "tenant-offline";
const WEBHOOK: &str = "mutate.hami-limits.hami.io";

fn python() -> String {
    let local = repo().join(".tools/py/bin/python");
    std::env::var("HAMI_CHART_PYTHON").unwrap_or_else(|_| {
        if local.is_file() {
            local.display().to_string()
        } else {
            "python3".to_owned()
        }
    })
}

/// The control plane and what the tests started into it.
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    work: tempfile::TempDir,
    host_ip: String,
    webhook: Option<Child>,
    webhook_port: u16,
    metrics_port: u16,
}

impl Cluster {
    fn up(dir: PathBuf) -> Result<Self, String> {
        let out = Command::new(repo().join("scripts/cluster"))
            .arg("up")
            .env("HAMI_CLUSTER_DIR", &dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run scripts/cluster: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/cluster up failed:\n{}{}",
                text(&out.stdout),
                text(&out.stderr)
            ));
        }
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_owned());
        let bin = PathBuf::from(read("bin").map_err(|e| e.to_string())?);
        let host_ip = read("host-ip").map_err(|e| e.to_string())?;
        Ok(Self {
            dir,
            bin,
            work: tempfile::tempdir().map_err(|e| e.to_string())?,
            host_ip,
            webhook: None,
            webhook_port: free_port(),
            metrics_port: free_port(),
        })
    }

    fn admin(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// kubectl (the one built with the cluster) as the admin.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl_as(&self.admin(), args, stdin)
    }

    fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        hami_tests::real::kubectl(&self.bin.join("kubectl"), kubeconfig, args, stdin).unwrap()
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed:\n{}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    fn get(&self, kind: &str, ns: Option<&str>, name: &str) -> Value {
        let mut args = vec!["get", kind, name, "-o", "json"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        serde_json::from_str(&self.ok(&args, None)).unwrap()
    }

    fn exists(&self, kind: &str, ns: Option<&str>, name: &str) -> bool {
        let mut args = vec!["get", kind, name, "--ignore-not-found", "-o", "name"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        !self.ok(&args, None).trim().is_empty()
    }

    fn apply(&self, object: &Value) {
        self.ok(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&object.to_string()),
        );
    }

    /// A kubeconfig that authenticates as a ServiceAccount with a token from the TokenRequest API:
    /// what a pod of that ServiceAccount gets mounted.
    fn service_account_kubeconfig(&self, ns: &str, sa: &str) -> PathBuf {
        self.token_kubeconfig(ns, sa, &[])
    }

    /// The device plugin's ServiceAccount with the token kubelet projects into its pod on `node`:
    /// bound to a pod of that ServiceAccount on that node, so that it carries the node-name claim
    /// (`authentication.kubernetes.io/node-name`) the chart's node policies read. The pod is
    /// stored (bound to the node) but never runs: no kubelet here.
    fn plugin_kubeconfig(&self, node: &str) -> PathBuf {
        let sa = format!("{PREFIX}-device-plugin");
        let holder = format!("dp-token-{node}");
        if !self.exists("pod", Some(NS), &holder) {
            self.ok(
                &["create", "-n", NS, "-o", "name", "-f", "-"],
                Some(
                    &json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": holder},
                        "spec": {"serviceAccountName": sa, "nodeName": node, "automountServiceAccountToken": false,
                                 "containers": [{"name": "plugin", "image": "localhost/hami-limits/hami-device-plugin:test"}]},
                    })
                    .to_string(),
                ),
            );
        }
        let uid = self.get("pod", Some(NS), &holder)["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned();
        self.token_kubeconfig(
            NS,
            &sa,
            &[
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                &holder,
                "--bound-object-uid",
                &uid,
            ],
        )
    }

    /// HAMi's scheduler's identity (`system:serviceaccount:kube-system:hami-scheduler`, the chart's
    /// default admissionPolicy.schedulerIdentities) with the rights HAMi's chart gives it on pods.
    fn scheduler_kubeconfig(&self) -> PathBuf {
        self.apply(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hami-scheduler", "namespace": "kube-system"}}));
        self.apply(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "hami-scheduler-test"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "update"]}],
        }));
        self.apply(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "hami-scheduler-test"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "hami-scheduler-test"},
            "subjects": [{"kind": "ServiceAccount", "name": "hami-scheduler", "namespace": "kube-system"}],
        }));
        self.service_account_kubeconfig("kube-system", "hami-scheduler")
    }

    fn token_kubeconfig(&self, ns: &str, sa: &str, bound: &[&str]) -> PathBuf {
        let mut args = vec!["create", "token", sa, "-n", ns, "--duration", "2h"];
        args.extend(bound);
        let token = self.ok(&args, None);
        let server = format!(
            "https://127.0.0.1:{}",
            std::fs::read_to_string(self.dir.join("apiserver-port"))
                .unwrap()
                .trim()
        );
        let bound_to = bound.get(3).map(|b| format!("-{b}")).unwrap_or_default();
        let path = self
            .work
            .path()
            .join(format!("{ns}-{sa}{bound_to}.kubeconfig"));
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": self.dir.join("pki/ca.crt")}}],
            "users": [{"name": sa, "user": {"token": token.trim()}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": sa, "namespace": ns}}],
            "current-context": "c",
        });
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

    fn helm(&self, action: &str, arg: Option<&str>) -> Value {
        let mut cmd = Command::new(python());
        cmd.arg(repo().join("charts/tests/helm_live.py"))
            .arg(self.admin())
            .arg(action)
            .arg(RELEASE)
            .arg(NS);
        if let Some(a) = arg {
            cmd.arg(a);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "helm {action} failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// What Helm's hook executor does for PHASE, with the Jobs run on this host instead of a node:
    /// hook resources in weight order; a Job's container runs here with its ServiceAccount's token,
    /// its command line as the chart renders it; `hook-succeeded` resources are deleted after.
    fn run_hooks(&self, release: &Value, phase: &str) {
        let mut hooks: Vec<(i64, String, Value)> = Vec::new();
        for hook in release["hooks"].as_array().into_iter().flatten() {
            let events: Vec<&str> = hook["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if !events.contains(&phase) {
                continue;
            }
            let manifest: Value =
                serde_yaml_ng::from_str(hook["manifest"].as_str().unwrap()).unwrap();
            let weight = hook["weight"].as_i64().unwrap_or(0);
            hooks.push((
                weight,
                hook["name"].as_str().unwrap_or_default().to_owned(),
                manifest,
            ));
        }
        assert!(
            !hooks.is_empty() || phase == "pre-delete",
            "the release has no {phase} hooks: {}",
            release["hooks"]
        );
        hooks.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        for (_, _, manifest) in &hooks {
            if manifest["kind"] == "Job" {
                // The API server accepts the Job as rendered (server-side dry run), then its
                // containers run here.
                self.ok(
                    &["create", "--dry-run=server", "-o", "name", "-f", "-"],
                    Some(&manifest.to_string()),
                );
                self.run_job_here(manifest);
            } else {
                self.apply(manifest);
            }
        }
        for (_, _, manifest) in &hooks {
            let policy = manifest["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                .as_str()
                .unwrap_or_default();
            if policy.split(',').any(|p| p.trim() == "hook-succeeded") && manifest["kind"] != "Job"
            {
                let kind = manifest["kind"].as_str().unwrap();
                let name = manifest["metadata"]["name"].as_str().unwrap();
                let mut args = vec!["delete", kind, name, "--ignore-not-found", "--wait=false"];
                let ns = manifest["metadata"]["namespace"].as_str();
                if let Some(ns) = ns {
                    args.extend(["-n", ns]);
                }
                self.ok(&args, None);
            }
        }
    }

    fn run_job_here(&self, job: &Value) {
        let spec = &job["spec"]["template"]["spec"];
        let sa = spec["serviceAccountName"].as_str().unwrap();
        let ns = job["metadata"]["namespace"].as_str().unwrap();
        let kubeconfig = self.service_account_kubeconfig(ns, sa);
        let containers = spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(spec["containers"].as_array().unwrap());
        for container in containers {
            let image = container["image"].as_str().unwrap();
            assert!(
                image.contains("certgen") || image.contains("hami-limits"),
                "hook Job runs an unexpected image {image}"
            );
            let args: Vec<String> = container["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect();
            let mut cmd = Command::new(binary("hami-certgen"));
            cmd.args(&args)
                .env("KUBECONFIG", &kubeconfig)
                .env_remove("HAMI_LOG_FORMAT");
            for env in container["env"].as_array().into_iter().flatten() {
                if let Some(v) = env["value"].as_str() {
                    cmd.env(env["name"].as_str().unwrap(), v);
                }
            }
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "hook Job {} container {} (hami-certgen {}) failed:\n{}{}",
                job["metadata"]["name"],
                container["name"],
                args.join(" "),
                text(&out.stdout),
                text(&out.stderr)
            );
        }
    }

    /// Start the webhook as its Deployment would run it: the chart's ConfigMap as settings, the
    /// Secret certgen made as certificate, the chart's ServiceAccount for the API.
    fn start_webhook(&mut self) {
        self.stop_webhook();
        let cm = self.get("configmap", Some(NS), &format!("{PREFIX}-webhook"));
        let config = self.work.path().join("webhook.yaml");
        std::fs::write(&config, cm["data"]["webhook.yaml"].as_str().unwrap()).unwrap();
        let secret = self.get("secret", Some(NS), &format!("{PREFIX}-webhook-tls"));
        for key in ["tls.crt", "tls.key"] {
            let b64 = secret["data"][key].as_str().unwrap();
            let out = Command::new("base64")
                .arg("-d")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut out = out;
            out.stdin.take().unwrap().write_all(b64.as_bytes()).unwrap();
            let bytes = out.wait_with_output().unwrap().stdout;
            std::fs::write(self.work.path().join(key), bytes).unwrap();
        }
        let kubeconfig = self.service_account_kubeconfig(NS, &format!("{PREFIX}-webhook"));
        let log = std::fs::File::create(self.dir.join("logs/hami-webhook.log")).unwrap();
        let child = Command::new(binary("hami-webhook"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("{}:{}", self.host_ip, self.webhook_port))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .arg("--tls-cert")
            .arg(self.work.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(self.work.path().join("tls.key"))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        // `scripts/cluster down` stops it too, should this process die first.
        std::fs::write(self.dir.join("pids/hami-webhook"), child.id().to_string()).unwrap();
        self.webhook = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.http_get("/readyz").map(|(code, _)| code) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "the webhook was not ready in 30 s; log: {}",
                self.webhook_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop_webhook(&mut self) {
        if let Some(child) = self.webhook.take() {
            stop_child(child, &self.dir.join("pids/hami-webhook"));
        }
    }

    fn webhook_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/hami-webhook.log")).unwrap_or_default()
    }

    fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let out = Command::new("curl")
            .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{}{path}", self.metrics_port))
            .output()
            .ok()?;
        let body = text(&out.stdout);
        let (body, code) = body.rsplit_once('\n')?;
        Some((code.trim().parse().ok()?, body.to_owned()))
    }

    /// The webhook's `hami_webhook_admission_requests_total`, summed over outcomes.
    fn reviews(&self) -> u64 {
        let (_, body) = self.http_get("/metrics").unwrap();
        body.lines()
            .filter(|l| l.starts_with("hami_webhook_admission_requests_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// The chart's Service, pointed at the webhook on this host by an EndpointSlice of our own.
    fn point_service_here(&self) {
        let svc = self.get("service", Some(NS), &format!("{PREFIX}-webhook"));
        let port = svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["port"] == 443)
            .unwrap();
        self.apply(&json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{PREFIX}-webhook-host"), "namespace": NS,
                "labels": {
                    "kubernetes.io/service-name": format!("{PREFIX}-webhook"),
                    "endpointslice.kubernetes.io/managed-by": "hami-limits-tests",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": port["name"], "port": self.webhook_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [self.host_ip], "conditions": {"ready": true}}],
        }));
    }

    /// Create a pod through the API server; the stored pod, or kubectl's output when refused.
    fn create_pod(&self, ns: &str, pod: &Value) -> Result<(Value, String), String> {
        let out = self.kubectl(
            &["create", "-n", ns, "-o", "json", "-f", "-"],
            Some(&pod.to_string()),
        );
        if out.status.success() {
            Ok((
                serde_json::from_slice(&out.stdout).unwrap(),
                text(&out.stderr),
            ))
        } else {
            Err(text(&out.stderr))
        }
    }

    /// What `hami-webhook mutate` prints for the pod, with the chart's settings file.
    fn offline(&self, pod: &Value, extra: &[&str]) -> Result<(Value, String), String> {
        let file = self.work.path().join("offline-pod.json");
        let mut pod = pod.clone();
        if pod["metadata"]["namespace"].is_null() {
            pod["metadata"]["namespace"] = json!(TENANT);
        }
        std::fs::write(&file, pod.to_string()).unwrap();
        let out = Command::new(binary("hami-webhook"))
            .arg("mutate")
            .arg("-f")
            .arg(&file)
            .arg("--config")
            .arg(self.work.path().join("webhook.yaml"))
            .args(extra)
            .output()
            .unwrap();
        if out.status.success() {
            Ok((
                serde_yaml_ng::from_slice(&out.stdout).unwrap(),
                text(&out.stderr),
            ))
        } else {
            Err(text(&out.stderr))
        }
    }

    /// The pod through the real API server and webhook, and the same pod mutated offline then
    /// stored where no webhook runs: the two stored pods must be equal (up to what the API server
    /// makes unique per object). Returns the online stored pod.
    fn online_equals_offline(&self, pod: &Value, extra: &[&str]) -> Value {
        let (online, _) = self
            .create_pod(TENANT, pod)
            .unwrap_or_else(|e| panic!("pod refused online: {e}"));
        let (mut mutated, _) = self
            .offline(pod, extra)
            .unwrap_or_else(|e| panic!("hami-webhook mutate refused it: {e}"));
        mutated["metadata"]["namespace"] = json!(OFFLINE);
        let (offline, _) = self
            .create_pod(OFFLINE, &mutated)
            .unwrap_or_else(|e| panic!("offline-mutated pod refused by the API server: {e}"));
        let (a, b) = (comparable(&online), comparable(&offline));
        let mut differences = Vec::new();
        diff("", &a, &b, &mut differences);
        assert!(
            differences.is_empty(),
            "{}: the stored pod (online) differs from `hami-webhook mutate` (offline) stored:\n{}",
            pod["metadata"]["name"],
            differences.join("\n")
        );
        online
    }

    fn down(mut self) -> bool {
        self.stop_webhook();
        let status = Command::new(repo().join("scripts/cluster"))
            .arg("down")
            .env("HAMI_CLUSTER_DIR", &self.dir)
            .status();
        status.map(|s| s.success()).unwrap_or(false)
    }
}

/// Every path where `a` and `b` differ, with both values.
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                diff(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(format!("  {path}: online {a} / offline {b}")),
        _ => {}
    }
}

/// The parts of a stored pod a mutation decides: labels, annotations and spec, with the
/// service-account token volume's random name made fixed.
fn comparable(pod: &Value) -> Value {
    let mut spec = pod["spec"].clone();
    let token_volume = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .find(|n| n.starts_with("kube-api-access-"))
        .map(str::to_owned);
    if let Some(token_volume) = token_volume {
        let fixed = Value::String("kube-api-access".into());
        for v in spec["volumes"].as_array_mut().unwrap() {
            if v["name"] == token_volume.as_str() {
                v["name"] = fixed.clone();
            }
        }
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array_mut().into_iter().flatten() {
                for m in c["volumeMounts"].as_array_mut().into_iter().flatten() {
                    if m["name"] == token_volume.as_str() {
                        m["name"] = fixed.clone();
                    }
                }
            }
        }
    }
    // Volumes and mounts are keyed by name and path: the API server's ServiceAccount admission
    // plugin adds the token volume before the webhooks run (online) but after the offline patch.
    for v in [&mut spec["volumes"]] {
        if let Some(list) = v.as_array_mut() {
            list.sort_by(|a, b| a["name"].to_string().cmp(&b["name"].to_string()));
        }
    }
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                mounts.sort_by(|a, b| a["mountPath"].to_string().cmp(&b["mountPath"].to_string()));
            }
        }
    }
    json!({
        "name": pod["metadata"]["name"],
        "labels": pod["metadata"]["labels"],
        "annotations": pod["metadata"]["annotations"],
        "spec": spec,
    })
}

fn pod(name: &str, annotations: Value, containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": containers},
    })
}

fn container(name: &str, limits: Value) -> Value {
    json!({"name": name, "image": "localhost/hami-limits/workload:test", "command": ["sleep", "infinity"], "resources": {"limits": limits}})
}

fn kai_pod(name: &str, annotations: Value) -> Value {
    let mut p = pod(
        name,
        annotations,
        json!([{"name": "cuda", "image": "localhost/hami-limits/workload:test", "command": ["sleep", "infinity"]}]),
    );
    p["spec"]["schedulerName"] = json!("kai-scheduler");
    p["metadata"]["labels"] = json!({"kai.scheduler/queue": "default-queue"});
    p
}

fn env_of(pod: &Value, container: usize) -> BTreeMap<String, String> {
    pod["spec"]["containers"][container]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

fn all_text(pod: &Value) -> String {
    pod.to_string()
}

// ---------------------------------------------------------------------------------------------
// The cases, in order (later ones build on what earlier ones installed).

fn install(c: &mut Cluster) {
    let release = c.helm("install", Some(&operator_values(false, "Fail").to_string()));
    assert_eq!(
        release["summary"]["revision"], 1,
        "revision of the install: {}",
        release["summary"]
    );
    // pre-install: certgen's RBAC and `hami-certgen create`; then the chart; then post-install:
    // `hami-certgen patch` writes the caBundle.
    c.run_hooks(&release, "pre-install");
    c.run_hooks(&release, "post-install");
    let mwc = c.get("mutatingwebhookconfiguration", None, PREFIX);
    let ca = c.get("secret", Some(NS), &format!("{PREFIX}-webhook-tls"))["data"]["ca.crt"].clone();
    for w in mwc["webhooks"].as_array().unwrap() {
        assert_eq!(
            w["clientConfig"]["caBundle"], ca,
            "caBundle of {} after install",
            w["name"]
        );
        assert!(
            w["clientConfig"]["service"].is_object(),
            "the chart's own service form: {}",
            w["clientConfig"]
        );
        assert!(
            w["matchConditions"]
                .as_array()
                .is_some_and(|m| !m.is_empty()),
            "the API server kept the CEL matchConditions: {w}"
        );
    }
    // The API server serves ValidatingAdmissionPolicy (1.30+): Helm's discovery rendered the
    // policies, the webhook has no UPDATE entry, and the real type checker finds every expression
    // sound against its kind.
    assert_eq!(
        mwc["webhooks"].as_array().unwrap().len(),
        1,
        "the UPDATE entry is the policy's: {}",
        mwc["webhooks"]
    );
    for name in [
        "pod-annotations",
        "device-plugin-pods",
        "device-plugin-node",
        "device-plugin-events",
    ] {
        let name = format!("{PREFIX}-{name}");
        assert!(c.exists("validatingadmissionpolicybinding", None, &name));
        wait_for(
            &format!("the type check of {name}"),
            Duration::from_secs(30),
            || {
                c.get("validatingadmissionpolicy", None, &name)["status"]["typeChecking"]
                    .is_object()
            },
        );
        let status = c.get("validatingadmissionpolicy", None, &name)["status"].clone();
        assert!(
            status["typeChecking"]["expressionWarnings"].is_null(),
            "{name}: {status}"
        );
    }
    for (ns, labels) in [
        (TENANT, json!({})),
        (OFFLINE, json!({"hami.io/webhook": "ignore"})),
    ] {
        c.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}));
        wait_for(
            &format!("the default ServiceAccount of {ns}"),
            Duration::from_secs(30),
            || c.exists("serviceaccount", Some(ns), "default"),
        );
    }
    c.point_service_here();
    c.start_webhook();
    // The API server reaches it through the Service: a HAMi pod is reviewed.
    let before = c.reviews();
    wait_for(
        "a review through the chart's Service",
        Duration::from_secs(30),
        || {
            let probe = pod(
                "probe",
                json!({}),
                json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
            );
            let out = c.kubectl(
                &[
                    "create",
                    "-n",
                    TENANT,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&probe.to_string()),
            );
            out.status.success() && c.reviews() > before
        },
    );
}

/// Values an operator sets: HAMi's defaults, a KAI scheduler, GPU nodes only for the plugin.
fn operator_values(overwrite_env: bool, failure_policy: &str) -> Value {
    json!({
        "devicePlugin": {"gpuCorePolicy": if overwrite_env { "force" } else { "default" }, "overwriteEnv": overwrite_env},
        "webhook": {"failurePolicy": failure_policy, "kai": {"schedulerNames": ["kai-scheduler"]}},
    })
}

fn hami_pods(c: &mut Cluster) {
    let p = c.online_equals_offline(
        &pod(
            "hami-basic",
            json!({}),
            json!([container(
                "cuda",
                json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})
            )]),
        ),
        &[],
    );
    assert_eq!(
        p["spec"]["schedulerName"],
        "hami-scheduler",
        "{}",
        all_text(&p)
    );
    let p = c.online_equals_offline(
        &pod(
            "hami-priority",
            json!({}),
            json!([container(
                "cuda",
                json!({"nvidia.com/gpu": 1, "nvidia.com/priority": 0})
            )]),
        ),
        &[],
    );
    assert_eq!(
        env_of(&p, 0).get("CUDA_TASK_PRIORITY").map(String::as_str),
        Some("0"),
        "{}",
        all_text(&p)
    );
    // defaultGPUNum: memory alone gets one GPU added.
    let p = c.online_equals_offline(
        &pod(
            "hami-default-num",
            json!({}),
            json!([container("cuda", json!({"nvidia.com/gpumem": 2000}))]),
        ),
        &[],
    );
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1",
        "{}",
        all_text(&p)
    );
}

fn hami_settings_after_upgrade(c: &mut Cluster) {
    // helm upgrade with the core policy forced and overwriteEnv on; the Deployment would roll (its
    // config checksum changes): the host webhook restarts with the new ConfigMap.
    let release = c.helm("upgrade", Some(&operator_values(true, "Fail").to_string()));
    assert_eq!(
        release["summary"]["revision"], 2,
        "revision of the upgrade: {}",
        release["summary"]
    );
    c.run_hooks(&release, "pre-upgrade");
    c.run_hooks(&release, "post-upgrade");
    c.start_webhook();
    let p = c.online_equals_offline(
        &pod(
            "hami-policy",
            json!({}),
            json!([
                container("cuda", json!({"nvidia.com/gpu": 1})),
                {"name": "sidecar", "image": "localhost/hami-limits/workload:test", "command": ["sleep", "infinity"]}
            ]),
        ),
        &[],
    );
    assert_eq!(
        env_of(&p, 0)
            .get("GPU_CORE_UTILIZATION_POLICY")
            .map(String::as_str),
        Some("force"),
        "{}",
        all_text(&p)
    );
    assert_eq!(
        env_of(&p, 1)
            .get("NVIDIA_VISIBLE_DEVICES")
            .map(String::as_str),
        Some("none"),
        "{}",
        all_text(&p)
    );
}

/// Reinvocation: a second mutating webhook (called after ours: configurations run in name order)
/// adds a GPU container; ours (reinvocationPolicy: IfNeeded) is called again and treats it as it
/// would have at first. The stored pod equals `hami-webhook mutate` of the pod with both.
fn reinvocation_with_a_second_webhook(c: &mut Cluster) {
    let StandIn {
        child,
        port,
        ca_bundle,
    } = https_stand_in(&StandInSpec {
        dir: &c.work.path().join("second"),
        common_name: "second-webhook",
        ip: &c.host_ip,
        script: &repo().join("tests/cluster/second_webhook.py"),
        before: &[],
        after: &[],
        log: &c.dir.join("logs/second-webhook.log"),
        pid_file: &c.dir.join("pids/second-webhook"),
    })
    .unwrap();
    c.apply(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "zz-second"},
        "webhooks": [{
            "name": "second.tests.hami.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "clientConfig": {"url": format!("https://{}:{port}/", c.host_ip), "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {"second-webhook": "add-gpu-sidecar"}},
        }],
    }));
    let mut p = pod(
        "reinvoked",
        json!({}),
        json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
    );
    p["metadata"]["labels"] = json!({"second-webhook": "add-gpu-sidecar"});
    let before = c.reviews();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let (online, _) = c
            .create_pod(TENANT, &p)
            .unwrap_or_else(|e| panic!("refused: {e}"));
        let names: Vec<&str> = online["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["cuda", "gpu-sidecar"],
            "the second webhook did not run"
        );
        assert_eq!(
            c.reviews(),
            before + 2,
            "hami-limits' webhook was not reinvoked"
        );
        // GPU_CORE_UTILIZATION_POLICY=force (set by the upgrade before) reached the added container.
        assert_eq!(
            env_of(&online, 1)
                .get("GPU_CORE_UTILIZATION_POLICY")
                .map(String::as_str),
            Some("force"),
            "{online}"
        );
        c.ok(
            &["delete", "pod", "reinvoked", "-n", TENANT, "--wait=false"],
            None,
        );
        // Offline: the pod as the second webhook leaves it.
        let mut both = p.clone();
        both["metadata"]["labels"] = json!({"second-webhook": "done"});
        both["spec"]["containers"].as_array_mut().unwrap().push(json!({
            "name": "gpu-sidecar", "image": "localhost/hami-limits/workload:test", "command": ["sleep", "infinity"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }));
        let (mut offline, _) = c.offline(&both, &[]).unwrap();
        offline["metadata"]["labels"] = json!({"second-webhook": "add-gpu-sidecar"});
        offline["metadata"]["namespace"] = json!(OFFLINE);
        let (stored, _) = c.create_pod(OFFLINE, &offline).unwrap();
        let mut differences = Vec::new();
        diff(
            "",
            &comparable(&online),
            &comparable(&stored),
            &mut differences,
        );
        assert!(
            differences.is_empty(),
            "reinvoked pod differs from offline:\n{}",
            differences.join("\n")
        );
    }));
    c.ok(
        &["delete", "mutatingwebhookconfiguration", "zz-second"],
        None,
    );
    stop_child(child, &c.dir.join("pids/second-webhook"));
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn kai_gpu_memory(c: &mut Cluster) {
    let p = c.online_equals_offline(&kai_pod("kai-memory", json!({"gpu-memory": "3000"})), &[]);
    assert!(
        all_text(&p).contains("3000m"),
        "no 3000m cap in {}",
        all_text(&p)
    );
}

fn kai_gpu_fraction_basis_from_real_nodes(c: &mut Cluster) {
    let nodes = |a: &str, b: &str| {
        json!([
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.memory": a, "nvidia.com/gpu.count": "8"}}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-b", "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.memory": b, "nvidia.com/gpu.count": "8"}}},
        ])
    };
    let mut round = 0;
    for (a, b, smallest) in [("143771", "81559", 81559_u64), ("143771", "143771", 143771)] {
        round += 1;
        for n in nodes(a, b).as_array().unwrap() {
            c.apply(n);
        }
        let want = format!("{}m", smallest / 2);
        let fraction = kai_pod("probe", json!({"gpu-fraction": "0.5"}));
        // The webhook learns the basis from its watch of the real API server.
        wait_for(
            &format!("the webhook's node watch to see {smallest} MiB"),
            Duration::from_secs(30),
            || {
                let out = c.kubectl(
                    &[
                        "create",
                        "-n",
                        TENANT,
                        "--dry-run=server",
                        "-o",
                        "json",
                        "-f",
                        "-",
                    ],
                    Some(&fraction.to_string()),
                );
                out.status.success() && text(&out.stdout).contains(&want)
            },
        );
        let list = c.ok(&["get", "nodes", "-o", "yaml"], None);
        let nodes_file = c.work.path().join("nodes.yaml");
        std::fs::write(&nodes_file, list).unwrap();
        let p = c.online_equals_offline(
            &kai_pod(
                &format!("kai-fraction-{round}"),
                json!({"gpu-fraction": "0.5"}),
            ),
            &["--nodes", nodes_file.to_str().unwrap()],
        );
        assert!(
            all_text(&p).contains(&want),
            "no {want} cap in {}",
            all_text(&p)
        );
    }
}

/// Tenant namespaces keep Pod Security `baseline`: a HAMi GPU pod and a KAI fraction pod, as our
/// webhook mutates them (defaults: the KAI hook by `hami.io/preload`), are admitted by the API
/// server's PodSecurity admission, and a tenant's own `hostPath` in the same namespace is refused.
fn tenant_namespace_keeps_baseline(c: &mut Cluster) {
    let ns = "psa-baseline";
    c.ok(&["create", "namespace", ns], None);
    c.ok(
        &[
            "label",
            "namespace",
            ns,
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        None,
    );
    let hami = pod(
        "psa-hami",
        json!({}),
        json!([container(
            "cuda",
            json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})
        )]),
    );
    let kai = kai_pod("psa-kai", json!({"gpu-memory": "3000"}));
    for p in [&hami, &kai] {
        let name = p["metadata"]["name"].as_str().unwrap();
        let (stored, _) = c
            .create_pod(ns, p)
            .unwrap_or_else(|e| panic!("{name}: refused in a baseline namespace:\n{e}"));
        let host_paths: Vec<&Value> = stored["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| !v["hostPath"].is_null())
            .collect();
        assert!(host_paths.is_empty(), "{name}: {host_paths:?}");
    }
    let stored = c.get("pod", Some(ns), "psa-kai");
    assert_eq!(
        stored["spec"]["containers"][0]["resources"]["limits"]["hami.io/preload"], "1",
        "{stored}"
    );
    let mut own = pod("psa-host", json!({}), json!([container("c", json!({}))]));
    own["spec"]["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]);
    own["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "root", "mountPath": "/host"}]);
    let err = c
        .create_pod(ns, &own)
        .expect_err("a hostPath pod admitted in a baseline namespace");
    assert!(
        err.contains("violates PodSecurity") && err.contains("hostPath"),
        "{err}"
    );
    c.ok(&["delete", "namespace", ns, "--wait=false"], None);
}

fn denials_as_kubectl_prints_them(c: &mut Cluster) {
    let cases = [
        (
            kai_pod(
                "bad-delivery",
                json!({"gpu-memory": "3000", "hami.io/limit-delivery": "carrier-pigeon"}),
            ),
            "hami.io/limit-delivery",
        ),
        (
            kai_pod("bad-quantity", json!({"gpu-memory": "lots"})),
            "gpu-memory",
        ),
        (
            {
                let mut p = kai_pod("shadow", json!({"gpu-memory": "3000"}));
                p["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
                p["spec"]["containers"][0]["volumeMounts"] =
                    json!([{"name": "mine", "mountPath": "/overrideEnv"}]);
                p
            },
            "/overrideEnv",
        ),
    ];
    for (p, field) in cases {
        let name = p["metadata"]["name"].as_str().unwrap().to_owned();
        let err = c
            .create_pod(TENANT, &p)
            .map(|_| ())
            .expect_err(&format!("{name} was admitted"));
        assert!(
            err.contains(&format!(
                "admission webhook \"{WEBHOOK}\" denied the request"
            )),
            "{name}: not denied by the webhook: {err}"
        );
        assert!(
            err.contains(field),
            "{name}: the denial does not name {field}: {err}"
        );
        let offline = c
            .offline(&p, &[])
            .map(|_| ())
            .expect_err(&format!("{name}: mutate admitted it"));
        let message = err.rsplit("denied the request: ").next().unwrap().trim();
        assert!(
            offline.contains(message),
            "{name}: offline says {offline:?}, online {message:?}"
        );
    }
}

/// `kubectl create -f -` as a user types it: its exit status, stdout and stderr.
fn kubectl_create(c: &Cluster, pod: &Value) -> (bool, String, String) {
    let out = c.kubectl(&["create", "-n", TENANT, "-f", "-"], Some(&pod.to_string()));
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `hami-limits check -` of a limits file: exit status and stdout.
fn hami_limits_check(file: &str) -> (Option<i32>, String) {
    let mut child = Command::new(binary("hami-limits"))
        .args(["check", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(file.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code(), text(&out.stdout))
}

/// The value of one sample line of the webhook's `/metrics`.
fn metric(c: &Cluster, sample: &str) -> Option<u64> {
    let (_, body) = c.http_get("/metrics")?;
    body.lines()
        .find_map(|l| {
            l.strip_prefix(sample)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
        .map(|v| v as u64)
}

/// A `gpu-fraction` pod without a VRAM basis, as kubectl shows it: refused under the chart's
/// default (`kai.missingBasis: deny`), the denial printed by kubectl; admitted with a warning
/// kubectl prints, a limits file saying `HAMI_UNCAPPED` and the metric, once the operator opts out
/// through the chart (`webhook.kai.missingBasis=warn`); and a pod with a basis for comparison.
/// Printed for the documentation (docs/design.md, "What the user sees, measured").
fn missing_basis_denied_by_default_and_the_opt_out_warns(c: &mut Cluster) {
    // No GPU node matches this selector.
    let mut p = kai_pod("no-basis", json!({"gpu-fraction": "0.25"}));
    p["spec"]["nodeSelector"] = json!({"pool": "nowhere"});
    let nodes = c.work.path().join("nodes.yaml");
    let nodes = nodes.to_str().unwrap();
    let offline = c
        .offline(&p, &["--nodes", nodes])
        .map(|_| ())
        .expect_err("hami-webhook mutate admitted a pod without a basis under the default");
    let (created, stdout, stderr) = kubectl_create(c, &p);
    println!(
        "kai.missingBasis=deny (chart default), gpu-fraction pod without a basis: kubectl create: exit {}, stdout {stdout:?}, stderr {stderr:?}",
        if created { 0 } else { 1 }
    );
    assert!(!created, "admitted under the default: {stdout}");
    assert!(
        stderr.contains(&format!(
            "admission webhook \"{WEBHOOK}\" denied the request"
        )),
        "not denied by the webhook: {stderr}"
    );
    let message = stderr.rsplit("denied the request: ").next().unwrap().trim();
    for needle in [
        "annotation gpu-fraction=\"0.25\" needs the per-GPU VRAM",
        "no GPU node this pod can be placed on",
        "kai.missingBasis is deny",
        "nvidia.com/gpu.memory=<MiB>",
        "kai.perGpuVramMib",
        "gpu-memory=<MiB>",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    assert!(
        offline.contains(message),
        "offline says {offline:?}, online {message:?}"
    );
    assert!(!c.exists("pod", Some(TENANT), "no-basis"));

    // With a basis (the GPU nodes of the fraction case, 143771 MiB each): capped at admission,
    // and the file tells the preload library the fraction and where the node GPU file is.
    let with_basis = kai_pod("with-basis", json!({"gpu-fraction": "0.25"}));
    let (created, stdout, stderr) = kubectl_create(c, &with_basis);
    println!(
        "gpu-fraction pod with a basis: kubectl create: exit {}, stdout {stdout:?}, stderr {stderr:?}",
        if created { 0 } else { 1 }
    );
    assert!(created, "{stderr}");
    assert!(
        stderr.trim().is_empty(),
        "a warning for a capped pod: {stderr}"
    );
    let stored = c.get("pod", Some(TENANT), "with-basis");
    let file = stored["metadata"]["annotations"]["limits.hami.io/cuda"]
        .as_str()
        .unwrap_or_else(|| panic!("no limits file: {}", stored["metadata"]));
    println!("gpu-fraction pod with a basis: limits file {file:?}");
    assert_eq!(
        file,
        "CUDA_DEVICE_MEMORY_LIMIT=35942m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/var/lib/hami-limits/region/usage.cache\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
    );
    assert_eq!(hami_limits_check(file), (Some(0), String::new()));

    // The opt-out, through the chart values.
    let mut values = operator_values(true, "Fail");
    values["webhook"]["kai"]["missingBasis"] = json!("warn");
    let release = c.helm("upgrade", Some(&values.to_string()));
    c.run_hooks(&release, "pre-upgrade");
    c.run_hooks(&release, "post-upgrade");
    c.start_webhook();
    let skipped = r#"hami_webhook_kai_fraction_caps_skipped_total{reason="no-matching-node"}"#;
    assert_eq!(metric(c, skipped), Some(0));
    let (_, offline) = c
        .offline(&p, &["--nodes", nodes])
        .unwrap_or_else(|e| panic!("mutate refused it with the opt-out: {e}"));
    let warning = offline
        .lines()
        .find_map(|l| l.strip_prefix("warning: "))
        .unwrap_or_else(|| panic!("offline gave no warning: {offline:?}"))
        .to_owned();
    let (created, stdout, stderr) = kubectl_create(c, &p);
    println!(
        "kai.missingBasis=warn (opt-out), gpu-fraction pod without a basis: kubectl create: exit {}, stdout {stdout:?}, stderr {stderr:?}",
        if created { 0 } else { 1 }
    );
    assert!(created, "refused with the opt-out: {stderr}");
    assert!(
        stderr.contains(&format!("Warning: {warning}")),
        "kubectl printed {stderr:?}, offline warned {warning:?}"
    );
    assert!(
        warning.contains("GPU memory cap skipped (kai.missingBasis is warn)"),
        "{warning}"
    );
    let stored = c.get("pod", Some(TENANT), "no-basis");
    let file = stored["metadata"]["annotations"]["limits.hami.io/cuda"]
        .as_str()
        .unwrap_or_else(|| panic!("no limits file: {}", stored["metadata"]));
    assert_eq!(
        file,
        "HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-matching-node\n"
    );
    assert!(
        !env_of(&stored, 0).contains_key("CUDA_DEVICE_MEMORY_LIMIT"),
        "{}",
        all_text(&stored)
    );
    let (code, report) = hami_limits_check(file);
    println!(
        "kai.missingBasis=warn: hami-limits check of its /overrideEnv: exit {code:?}: {report:?}"
    );
    assert_eq!(code, Some(1));
    assert!(
        report.starts_with("line 2: warning: HAMI_UNCAPPED=\"no-matching-node\": this container runs without a GPU memory cap"),
        "{report}"
    );
    assert_eq!(metric(c, skipped), Some(1));

    // Back to the chart's default for the cases after this one.
    let release = c.helm("upgrade", Some(&operator_values(true, "Fail").to_string()));
    c.run_hooks(&release, "pre-upgrade");
    c.run_hooks(&release, "post-upgrade");
    c.start_webhook();
    let mut again = p.clone();
    again["metadata"]["name"] = json!("no-basis-again");
    assert!(
        !kubectl_create(c, &again).0,
        "the default did not come back"
    );
}

fn update_of_limits_key_denied(c: &mut Cluster) {
    let stored = c.get("pod", Some(TENANT), "kai-memory");
    let key = stored["metadata"]["annotations"]
        .as_object()
        .unwrap()
        .keys()
        .find(|k| k.starts_with("limits.hami.io/"))
        .cloned()
        .unwrap_or_else(|| "limits.hami.io/cuda".to_owned());
    let out = c.kubectl(
        &[
            "annotate",
            "pod",
            "kai-memory",
            "-n",
            TENANT,
            "--overwrite",
            &format!("{key}=CUDA_DEVICE_MEMORY_LIMIT=99999m"),
        ],
        None,
    );
    assert!(!out.status.success(), "changing {key} was allowed");
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "ValidatingAdmissionPolicy '{PREFIX}-pod-annotations' with binding '{PREFIX}-pod-annotations' denied request"
        )),
        "{err}"
    );
    assert!(err.contains(&key), "the denial does not name {key}: {err}");
    // Other annotations of the same pod may change.
    c.ok(
        &[
            "annotate",
            "pod",
            "kai-memory",
            "-n",
            TENANT,
            "owner=team-a",
        ],
        None,
    );
}

const TENANT_USER: &str = "system:serviceaccount:tenant:bob";
const SCHEDULER_KEYS: [&str; 6] = [
    "hami.io/vgpu-node",
    "hami.io/vgpu-devices-to-allocate",
    "hami.io/vgpu-devices-allocated",
    "hami.io/bind-phase",
    "hami.io/bind-time",
    "hami.io/vgpu-time",
];

/// kubectl as the tenant: a ServiceAccount with only namespaced pod rights (a Role in its own
/// namespace and the opted-out one), by impersonation.
fn as_tenant(c: &Cluster, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = args.to_vec();
    all.extend(["--as", TENANT_USER]);
    c.kubectl(&all, stdin)
}

fn refused_by_policy(out: &Output, needles: &[&str]) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "allowed: {}", text(&out.stdout));
    assert!(
        err.contains(&format!(
            "ValidatingAdmissionPolicy '{PREFIX}-pod-annotations'"
        )),
        "not refused by the pod annotation policy: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "the denial does not say {n:?}: {err}");
    }
    err
}

/// HAMi's scheduler-owned annotations, the limits files and the delivery mode, attacked by a
/// tenant with only namespaced pod rights: every route refused by the chart's admission policy
/// with a message naming the key; HAMi's scheduler identity allowed; a pod's own label opts
/// nothing out.
fn tenant_routes_refused_by_the_admission_policies(c: &mut Cluster) {
    c.apply(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bob", "namespace": TENANT}}));
    for ns in [TENANT, OFFLINE] {
        c.apply(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "tenant-pods", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
        }));
        c.apply(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tenant-pods", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "bob", "namespace": TENANT}],
        }));
    }
    let now = "1765000000";
    let devices = format!("{GPU_A},NVIDIA,143771,100:;");
    let forged = json!({
        "hami.io/vgpu-node": DP_NODE, "hami.io/vgpu-time": now,
        "hami.io/vgpu-devices-to-allocate": devices, "hami.io/vgpu-devices-allocated": devices,
        "hami.io/bind-phase": "allocating", "hami.io/bind-time": now,
    });
    let mut bypass = pod(
        "forged",
        forged.clone(),
        json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
    );
    bypass["spec"]["nodeName"] = json!(DP_NODE);

    // Created with the scheduler's annotations and a preset node where no webhook runs (an
    // opted-out namespace): refused, naming every key.
    let out = as_tenant(
        c,
        &["create", "-n", OFFLINE, "-f", "-"],
        Some(&bypass.to_string()),
    );
    let mut needles = vec![
        "pod tenant-offline/forged: annotation",
        "may not be set when a pod is created",
    ];
    needles.extend(SCHEDULER_KEYS);
    refused_by_policy(&out, &needles);
    // The same through the webhook: refused naming a key, or stored without any of them.
    let out = as_tenant(
        c,
        &["create", "-n", TENANT, "-o", "json", "-f", "-"],
        Some(&bypass.to_string()),
    );
    if out.status.success() {
        let stored: Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in SCHEDULER_KEYS {
            assert!(
                stored["metadata"]["annotations"][key].is_null(),
                "{key} reached the stored pod: {}",
                stored["metadata"]
            );
        }
        c.ok(
            &["delete", "pod", "forged", "-n", TENANT, "--wait=false"],
            None,
        );
    } else {
        refused_by_policy(&out, &["may not be set when a pod is created"]);
    }

    // A pending GPU pod of the tenant's: every scheduler-owned key refused on UPDATE.
    let p = pod(
        "bob-pending",
        json!({}),
        json!([container(
            "cuda",
            json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
        )]),
    );
    let out = as_tenant(
        c,
        &["create", "-n", TENANT, "-o", "name", "-f", "-"],
        Some(&p.to_string()),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    for key in SCHEDULER_KEYS {
        let value = forged[key].as_str().unwrap();
        let out = as_tenant(
            c,
            &[
                "annotate",
                "pod",
                "bob-pending",
                "-n",
                TENANT,
                &format!("{key}={value}"),
            ],
            None,
        );
        refused_by_policy(
            &out,
            &[&format!(
                "pod tenant/bob-pending: annotation {key} may not be added, changed or removed by {TENANT_USER}"
            )],
        );
    }
    // A JSON patch and a whole-object update take the same road.
    let out = as_tenant(
        c,
        &[
            "patch",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "--type=json",
            "-p",
            &json!([{"op": "add", "path": "/metadata/annotations", "value": forged}]).to_string(),
        ],
        None,
    );
    refused_by_policy(&out, &["hami.io/vgpu-devices-to-allocate"]);
    let mut whole = c.get("pod", Some(TENANT), "bob-pending");
    whole["metadata"]["annotations"]["hami.io/bind-phase"] = json!("allocating");
    let out = as_tenant(c, &["replace", "-f", "-"], Some(&whole.to_string()));
    refused_by_policy(&out, &["annotation hami.io/bind-phase may not be added"]);
    // The scheduler's label too.
    let out = as_tenant(
        c,
        &[
            "label",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            &format!("hami.io/vgpu-node={DP_NODE}"),
        ],
        None,
    );
    refused_by_policy(
        &out,
        &["pod tenant/bob-pending: label hami.io/vgpu-node may not be added, changed or removed"],
    );
    // The delivery mode and the limits files are fixed after creation.
    let out = as_tenant(
        c,
        &[
            "annotate",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "hami.io/limit-delivery=env",
        ],
        None,
    );
    refused_by_policy(
        &out,
        &[
            "annotation hami.io/limit-delivery=\"env\": the delivery mode is chosen when the pod is created",
        ],
    );
    let out = as_tenant(
        c,
        &[
            "annotate",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "limits.hami.io/cuda=CUDA_DEVICE_MEMORY_LIMIT=99999m",
        ],
        None,
    );
    refused_by_policy(
        &out,
        &["this update adds, changes or removes limits.hami.io/cuda"],
    );
    // Its own annotations and labels stay the tenant's; a label opts nothing out.
    let out = as_tenant(
        c,
        &["annotate", "pod", "bob-pending", "-n", TENANT, "owner=bob"],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = as_tenant(
        c,
        &[
            "label",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "hami.io/webhook=ignore",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = as_tenant(
        c,
        &[
            "annotate",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "hami.io/bind-phase=allocating",
        ],
        None,
    );
    refused_by_policy(&out, &["hami.io/bind-phase"]);
    let mut labelled = kai_pod("labelled-out", json!({"gpu-memory": "3000"}));
    labelled["metadata"]["labels"]["hami.io/webhook"] = json!("ignore");
    let out = as_tenant(
        c,
        &["create", "-n", TENANT, "-o", "json", "-f", "-"],
        Some(&labelled.to_string()),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("limits.hami.io/"),
        "a pod labelled hami.io/webhook=ignore skipped the webhook: {}",
        text(&out.stdout)
    );

    // HAMi's scheduler places the pod; the tenant still cannot change what it wrote.
    let scheduler = c.scheduler_kubeconfig();
    let mut args: Vec<String> = ["annotate", "pod", "bob-pending", "-n", TENANT]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for key in SCHEDULER_KEYS {
        args.push(format!("{key}={}", forged[key].as_str().unwrap()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = c.kubectl_as(&scheduler, &args, None);
    assert!(
        out.status.success(),
        "the scheduler's identity: {}",
        text(&out.stderr)
    );
    let out = as_tenant(
        c,
        &[
            "annotate",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "--overwrite",
            "hami.io/vgpu-devices-to-allocate=GPU-other,NVIDIA,143771,100:;",
        ],
        None,
    );
    refused_by_policy(
        &out,
        &["hami.io/vgpu-devices-to-allocate may not be added, changed or removed"],
    );
    let out = as_tenant(
        c,
        &[
            "annotate",
            "pod",
            "bob-pending",
            "-n",
            TENANT,
            "hami.io/bind-time-",
        ],
        None,
    );
    refused_by_policy(
        &out,
        &["hami.io/bind-time may not be added, changed or removed"],
    );
    c.ok(
        &[
            "delete",
            "pod",
            "bob-pending",
            "labelled-out",
            "-n",
            TENANT,
            "--wait=false",
        ],
        None,
    );
}

/// The device plugin's ServiceAccount with the token of its pod on DP_NODE: hami.io/* annotations
/// of that node's pods and of that Node only, Events from that node only; without the node claim
/// nothing.
fn device_plugin_writes_only_its_node(c: &mut Cluster) {
    const OTHER: &str = "gpu-other";
    for node in [DP_NODE, OTHER] {
        c.apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"gpu": "on"}}}));
    }
    for (name, node) in [("on-dp", DP_NODE), ("on-other", OTHER)] {
        let mut p = pod(
            name,
            json!({}),
            json!([{"name": "app", "image": "localhost/hami-limits/workload:test"}]),
        );
        p["spec"]["nodeName"] = json!(node);
        c.create_pod(TENANT, &p).unwrap();
    }
    let dp = c.plugin_kubeconfig(DP_NODE);
    let policy = |kind: &str| format!("ValidatingAdmissionPolicy '{PREFIX}-device-plugin-{kind}'");
    let run = |args: &[&str], stdin: Option<&str>| c.kubectl_as(&dp, args, stdin);
    let refused = |out: Output, kind: &str, needle: &str| {
        let err = text(&out.stderr);
        assert!(!out.status.success(), "allowed, expected {needle:?}");
        assert!(err.contains(&policy(kind)) && err.contains(needle), "{err}");
    };
    let out = run(
        &[
            "annotate",
            "pod",
            "on-dp",
            "-n",
            TENANT,
            "hami.io/bind-phase=success",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    refused(
        run(
            &[
                "annotate",
                "pod",
                "on-other",
                "-n",
                TENANT,
                "hami.io/bind-phase=success",
            ],
            None,
        ),
        "pods",
        &format!(
            "the device plugin of node {DP_NODE} may patch only pods bound to its node: pod tenant/on-other is on node {OTHER}"
        ),
    );
    refused(
        run(&["label", "pod", "on-dp", "-n", TENANT, "x=y"], None),
        "pods",
        "may change only hami.io/* annotations of pod tenant/on-dp",
    );
    refused(
        run(
            &[
                "annotate",
                "pod",
                "on-dp",
                "-n",
                TENANT,
                "team.example.com/owner=x",
            ],
            None,
        ),
        "pods",
        "may change only hami.io/* annotations",
    );
    let out = run(
        &[
            "annotate",
            "node",
            DP_NODE,
            "--overwrite",
            "hami.io/node-nvidia-register=[]",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    refused(
        run(
            &["annotate", "node", OTHER, "hami.io/node-nvidia-register=[]"],
            None,
        ),
        "node",
        &format!("may patch only its own Node, not node {OTHER}"),
    );
    refused(
        run(&["label", "node", DP_NODE, "gpu=off", "--overwrite"], None),
        "node",
        &format!("may change only hami.io/* annotations of node {DP_NODE}"),
    );
    let event = |instance: &str, node: &str| {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"generateName": "dp-", "namespace": "default"},
            "eventTime": "2026-12-06T00:00:00.000000Z",
            "reportingController": "hami-device-plugin", "reportingInstance": instance,
            "action": "Score", "reason": "Test", "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
        })
        .to_string()
    };
    let out = run(&["create", "-f", "-"], Some(&event(DP_NODE, DP_NODE)));
    assert!(out.status.success(), "{}", text(&out.stderr));
    refused(
        run(&["create", "-f", "-"], Some(&event(OTHER, OTHER))),
        "events",
        "may record only Events reported from its node",
    );
    // A token without the node claim (not bound to a pod on a node): fail closed.
    let unbound = c.service_account_kubeconfig(NS, &format!("{PREFIX}-device-plugin"));
    let out = c.kubectl_as(
        &unbound,
        &["annotate", "pod", "on-dp", "-n", TENANT, "hami.io/x=1"],
        None,
    );
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err
                .contains("presented no node-name claim (authentication.kubernetes.io/node-name)"),
        "{err}"
    );
    // Out of the later cases' way (no kubelet confirms a bound pod's deletion: forced).
    c.ok(
        &[
            "delete",
            "pod",
            "on-dp",
            "on-other",
            "-n",
            TENANT,
            "--force",
            "--grace-period=0",
        ],
        None,
    );
}

fn cel_excludes_plain_pods(c: &mut Cluster) {
    let before = c.reviews();
    for i in 0..5 {
        let p = pod(
            &format!("plain-{i}"),
            json!({}),
            json!([{"name": "app", "image": "localhost/hami-limits/workload:test", "resources": {"limits": {"cpu": "1"}}}]),
        );
        c.create_pod(TENANT, &p).unwrap();
        c.ok(
            &[
                "annotate",
                "pod",
                &format!("plain-{i}"),
                "-n",
                TENANT,
                "touched=yes",
            ],
            None,
        );
    }
    assert_eq!(
        c.reviews(),
        before,
        "pods the CEL matchConditions exclude reached the webhook"
    );
    // A GPU pod does reach it.
    c.create_pod(
        TENANT,
        &pod(
            "gpu-counted",
            json!({}),
            json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
        ),
    )
    .unwrap();
    assert_eq!(c.reviews(), before + 1);
}

fn edge_pods_never_made_invalid(c: &mut Cluster) {
    let long = "c".repeat(63);
    let many: Vec<Value> = (0..250)
        .map(|i| {
            container(
                &format!("gpu-{i}"),
                json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}),
            )
        })
        .collect();
    let mut ours_volume = pod(
        "ours-volume",
        json!({}),
        json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
    );
    let mut kai_volume = kai_pod("kai-ours-volume", json!({"gpu-memory": "2000"}));
    let mut kai_env = kai_pod("kai-ours-env", json!({"gpu-memory": "2000"}));
    kai_env["spec"]["containers"][0]["env"] = json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1m"}, {"name": "LD_PRELOAD", "value": "/x.so"}]);
    let mut kai_mount = kai_pod("kai-ours-mount", json!({"gpu-memory": "2000"}));
    // Names and paths the webhook adds for KAI pods, taken from what it adds to a plain KAI pod.
    let reference = c.get("pod", Some(TENANT), "kai-memory");
    let added_volumes: Vec<String> = reference["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .filter(|n| !n.starts_with("kube-api-access"))
        .map(str::to_owned)
        .collect();
    let added_mounts: Vec<String> = reference["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str())
        .filter(|p| !p.starts_with("/var/run/secrets"))
        .map(str::to_owned)
        .collect();
    assert!(
        !added_volumes.is_empty() && !added_mounts.is_empty(),
        "the KAI pod got no volumes: {reference}"
    );
    kai_volume["spec"]["volumes"] = json!([{"name": added_volumes[0], "emptyDir": {}}]);
    ours_volume["spec"]["volumes"] = json!([{"name": added_volumes[0], "emptyDir": {}}]);
    kai_mount["spec"]["volumes"] = json!([{"name": "user", "emptyDir": {}}]);
    kai_mount["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "user", "mountPath": added_mounts[0]}]);
    let cases = vec![
        pod(
            "long-name",
            json!({}),
            json!([container(
                &long,
                json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
            )]),
        ),
        {
            let mut p = kai_pod("kai-long-name", json!({"gpu-memory": "2000"}));
            p["spec"]["containers"][0]["name"] = json!(long);
            p
        },
        pod("many-containers", json!({}), Value::Array(many)),
        ours_volume,
        kai_volume,
        kai_env,
        kai_mount,
    ];
    let mut outcomes = Vec::new();
    for p in cases {
        let name = p["metadata"]["name"].as_str().unwrap().to_owned();
        match c.offline(&p, &[]) {
            // Admitted offline: stored online, and equal to the offline result.
            Ok(_) => {
                c.online_equals_offline(&p, &[]);
                outcomes.push(format!("{name}: stored"));
            }
            // Denied offline: denied online by the webhook, with the same message.
            Err(offline) => {
                let err = c
                    .create_pod(TENANT, &p)
                    .map(|_| ())
                    .expect_err(&format!("{name}: denied offline, admitted online"));
                assert!(
                    err.contains(&format!(
                        "admission webhook \"{WEBHOOK}\" denied the request"
                    )),
                    "{name}: refused by the API server after our patch, not by the webhook:\n{err}"
                );
                let message = err.rsplit("denied the request: ").next().unwrap().trim();
                assert!(
                    offline.contains(message),
                    "{name}: offline {offline:?}, online {message:?}"
                );
                outcomes.push(format!("{name}: denied by the webhook: {message}"));
            }
        }
    }
    for o in &outcomes {
        println!("edge pod {o}");
    }
}

fn rbac_as_shipped(c: &mut Cluster) {
    // The webhook's own token: nodes yes (its watch works, see the fraction case), pods and
    // secrets no.
    let webhook = c.service_account_kubeconfig(NS, &format!("{PREFIX}-webhook"));
    let ok = c.kubectl_as(&webhook, &["get", "nodes", "-o", "name"], None);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    for args in [["get", "pods", "-A"], ["get", "secrets", "-A"]] {
        let out = c.kubectl_as(&webhook, &args, None);
        assert!(
            !out.status.success(),
            "the webhook's ServiceAccount may {}",
            args.join(" ")
        );
        assert!(
            text(&out.stderr).contains("Forbidden") || text(&out.stderr).contains("forbidden"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = c.kubectl_as(&webhook, &["label", "node", "gpu-a", "x=y"], None);
    assert!(
        !out.status.success(),
        "the webhook's ServiceAccount may label nodes"
    );
    // The device plugin's: every call it makes is allowed (checked with can-i), others refused.
    let dp = c.service_account_kubeconfig(NS, &format!("{PREFIX}-device-plugin"));
    for (verb, resource) in [
        ("get", "pods"),
        ("list", "pods"),
        ("watch", "pods"),
        ("patch", "pods"),
        ("get", "nodes"),
        ("patch", "nodes"),
        ("create", "events.events.k8s.io"),
    ] {
        let out = c.kubectl_as(&dp, &["auth", "can-i", verb, resource, "-A"], None);
        assert_eq!(
            text(&out.stdout).trim(),
            "yes",
            "the device plugin's ServiceAccount may not {verb} {resource}: {}",
            text(&out.stderr)
        );
    }
    for (verb, resource) in [
        ("get", "secrets"),
        ("delete", "pods"),
        ("create", "pods"),
        ("delete", "nodes"),
    ] {
        let out = c.kubectl_as(&dp, &["auth", "can-i", verb, resource, "-A"], None);
        assert_eq!(
            text(&out.stdout).trim(),
            "no",
            "the device plugin's ServiceAccount may {verb} {resource}"
        );
    }
    // HAMi's vGPU monitor: its own ServiceAccount reads pods and nothing else.
    let monitor = c.service_account_kubeconfig(NS, &format!("{PREFIX}-vgpu-monitor"));
    for (verb, resource, allowed) in [
        ("list", "pods", "yes"),
        ("watch", "pods", "yes"),
        ("patch", "pods", "no"),
        ("get", "secrets", "no"),
        ("patch", "nodes", "no"),
        ("create", "events.events.k8s.io", "no"),
    ] {
        let out = c.kubectl_as(&monitor, &["auth", "can-i", verb, resource, "-A"], None);
        assert_eq!(
            text(&out.stdout).trim(),
            allowed,
            "the vGPU monitor's ServiceAccount: {verb} {resource}"
        );
    }
    let out = c.kubectl_as(&dp, &["get", "secrets", "-n", NS], None);
    assert!(
        !out.status.success() && text(&out.stderr).contains("forbidden"),
        "{}",
        text(&out.stderr)
    );
}

/// failurePolicy as measured: with the webhook stopped, what a KAI pod, a HAMi pod and a plain pod
/// get with the chart's default (Fail) and with Ignore. Printed for docs/development.md
/// ("failurePolicy, measured").
fn failure_policy(c: &mut Cluster) {
    // Hung rather than down: the process stopped (SIGSTOP), so connections are accepted by the
    // kernel and never answered. The API server gives up after the chart's timeoutSeconds (10).
    let pid = c.webhook.as_ref().unwrap().id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    let start = Instant::now();
    let hung = c.create_pod(
        TENANT,
        &pod(
            "hung-hami",
            json!({}),
            json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
        ),
    );
    let took = start.elapsed();
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    let err = hung
        .map(|_| ())
        .expect_err("admitted while the webhook hung");
    println!(
        "failurePolicy=Fail, webhook hung: HAMi pod: refused after {} ms: {}",
        took.as_millis(),
        err.trim()
    );
    assert!(
        err.contains("failed calling webhook") && err.contains(WEBHOOK),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(20),
        "refused after {took:?}, not at timeoutSeconds (10 s)"
    );
    c.stop_webhook();
    // KAI's podgrouper and binder patch every fraction pod after creation: with the UPDATE rules
    // in the admission policy, those UPDATEs never wait on (or fail with) the webhook.
    let start = Instant::now();
    c.ok(
        &[
            "annotate",
            "pod",
            "kai-memory",
            "-n",
            TENANT,
            "pod-group-name=pg-kai-memory",
        ],
        None,
    );
    c.ok(
        &[
            "label",
            "pod",
            "kai-memory",
            "-n",
            TENANT,
            "runai-gpu-group=g-1",
        ],
        None,
    );
    println!(
        "failurePolicy=Fail, webhook down: KAI pod UPDATEs (podgrouper annotation, binder label): admitted in {} ms",
        start.elapsed().as_millis()
    );
    // And the rules still hold while it is down.
    let out = c.kubectl(
        &[
            "annotate",
            "pod",
            "kai-memory",
            "-n",
            TENANT,
            "hami.io/bind-phase=allocating",
        ],
        None,
    );
    assert!(
        !out.status.success() && text(&out.stderr).contains("hami.io/bind-phase"),
        "{}",
        text(&out.stderr)
    );
    let kinds = |tag: &str| {
        vec![
            (
                "KAI",
                kai_pod(&format!("down-kai-{tag}"), json!({"gpu-memory": "3000"})),
            ),
            (
                "HAMi",
                pod(
                    &format!("down-hami-{tag}"),
                    json!({}),
                    json!([container("cuda", json!({"nvidia.com/gpu": 1}))]),
                ),
            ),
            (
                "plain",
                pod(
                    &format!("down-plain-{tag}"),
                    json!({}),
                    json!([{"name": "app", "image": "localhost/hami-limits/workload:test"}]),
                ),
            ),
        ]
    };
    let measure = |tag: &str| -> Vec<(String, String, Duration)> {
        kinds(tag)
            .into_iter()
            .map(|(kind, p)| {
                let start = Instant::now();
                let outcome = match c.create_pod(TENANT, &p) {
                    Ok((stored, _)) => {
                        let mutated = stored["spec"]["schedulerName"] == "hami-scheduler"
                            || all_text(&stored).contains("CUDA_DEVICE_MEMORY_LIMIT");
                        format!(
                            "admitted{}",
                            if mutated {
                                ", mutated"
                            } else {
                                ", not mutated"
                            }
                        )
                    }
                    Err(e) => format!("refused: {}", e.trim()),
                };
                (kind.to_owned(), outcome, start.elapsed())
            })
            .collect()
    };
    let fail = measure("fail");
    for (kind, outcome, took) in &fail {
        println!(
            "failurePolicy=Fail, webhook down: {kind} pod: {outcome} ({} ms)",
            took.as_millis()
        );
    }
    assert!(
        fail[0].1.starts_with("refused") && fail[0].1.contains("failed calling webhook"),
        "{fail:?}"
    );
    assert!(
        fail[1].1.starts_with("refused") && fail[1].1.contains("failed calling webhook"),
        "{fail:?}"
    );
    assert_eq!(
        fail[2].1, "admitted, not mutated",
        "plain pods never reach the webhook: {fail:?}"
    );

    let release = c.helm(
        "upgrade",
        Some(&operator_values(true, "Ignore").to_string()),
    );
    c.run_hooks(&release, "pre-upgrade");
    c.run_hooks(&release, "post-upgrade");
    let ignore = measure("ignore");
    for (kind, outcome, took) in &ignore {
        println!(
            "failurePolicy=Ignore, webhook down: {kind} pod: {outcome} ({} ms)",
            took.as_millis()
        );
    }
    for (kind, outcome, _) in &ignore {
        assert_eq!(outcome, "admitted, not mutated", "{kind}: {ignore:?}");
    }
    c.start_webhook();
}

fn rollback_keeps_ca_bundle_and_uninstall_leaves_nothing(c: &mut Cluster) {
    let ca = c.get("secret", Some(NS), &format!("{PREFIX}-webhook-tls"))["data"]["ca.crt"].clone();
    let release = c.helm("rollback", Some("1"));
    let revision = release["summary"]["revision"].as_i64().unwrap();
    assert!(
        revision >= 4,
        "revision after the rollback: {}",
        release["summary"]
    );
    let mwc = c.get("mutatingwebhookconfiguration", None, PREFIX);
    for w in mwc["webhooks"].as_array().unwrap() {
        assert_eq!(
            w["clientConfig"]["caBundle"], ca,
            "caBundle of {} lost by the rollback (before the post-rollback hook)",
            w["name"]
        );
        assert_eq!(
            w["failurePolicy"], "Fail",
            "the rollback restored revision 1's failurePolicy"
        );
    }
    // Helm runs the hooks of the revision rolled back to.
    c.run_hooks(&release, "pre-rollback");
    c.run_hooks(&release, "post-rollback");
    c.start_webhook();
    c.online_equals_offline(
        &kai_pod("after-rollback", json!({"gpu-memory": "1500"})),
        &[],
    );

    c.stop_webhook();
    let secret = c.get("secret", Some(NS), &format!("{PREFIX}-webhook-tls"));
    let mwc_uid = c.get("mutatingwebhookconfiguration", None, PREFIX)["metadata"]["uid"].clone();
    assert!(
        secret["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|o| o["uid"] == mwc_uid),
        "certgen's Secret is not owned by the webhook configuration: {}",
        secret["metadata"]
    );
    let release = c.helm("uninstall", None);
    let _ = release;
    for (kind, ns, name) in [
        ("mutatingwebhookconfiguration", None, PREFIX.to_owned()),
        ("clusterrole", None, format!("{PREFIX}-webhook")),
        ("clusterrolebinding", None, format!("{PREFIX}-webhook")),
        ("serviceaccount", Some(NS), format!("{PREFIX}-webhook")),
        ("deployment", Some(NS), format!("{PREFIX}-webhook")),
        ("daemonset", Some(NS), format!("{PREFIX}-device-plugin")),
    ] {
        assert!(
            !c.exists(kind, ns, &name),
            "{kind} {name} left behind by helm uninstall"
        );
    }
    // certgen's Secret is not a chart object: certgen makes the webhook configuration its owner,
    // so the garbage collector deletes it with the configuration.
    wait_for(
        "the certgen Secret to be garbage-collected with the webhook configuration",
        Duration::from_secs(30),
        || !c.exists("secret", Some(NS), &format!("{PREFIX}-webhook-tls")),
    );
    let left = c.ok(
        &[
            "get",
            "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-l",
            "app.kubernetes.io/instance=hl",
            "-o",
            "name",
        ],
        None,
    );
    assert!(
        left.trim().is_empty(),
        "left behind by helm uninstall: {left}"
    );
    let left = c.ok(
        &[
            "get",
            "all,secrets,configmaps,roles,rolebindings,serviceaccounts",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/instance=hl",
            "-o",
            "name",
        ],
        None,
    );
    assert!(
        left.trim().is_empty(),
        "left behind in {NS} by helm uninstall: {left}"
    );
}

const GPU_A: &str = "GPU-11111111-aaaa-4000-8000-000000000001";
const DP_NODE: &str = "gpu-dp";

/// `curl` as the admin, for API calls kubectl has no verb for (bindings, preconditioned patches):
/// the HTTP status and the body.
fn api_call(
    c: &Cluster,
    method: &str,
    path: &str,
    content_type: &str,
    body: &Value,
) -> (u16, Value) {
    let port = std::fs::read_to_string(c.dir.join("apiserver-port")).unwrap();
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "-X", method, "-H"])
        .arg(format!("Content-Type: {content_type}"))
        .arg("--cacert")
        .arg(c.dir.join("pki/ca.crt"))
        .arg("--cert")
        .arg(c.dir.join("pki/admin.crt"))
        .arg("--key")
        .arg(c.dir.join("pki/admin.key"))
        .arg("--data-binary")
        .arg(body.to_string())
        .arg(format!("https://127.0.0.1:{}{path}", port.trim()))
        .output()
        .unwrap();
    let out = text(&out.stdout);
    let (body, code) = out.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// The device plugin's API side, real: `hami-device-plugin run` (inventory file, the chart's
/// ServiceAccount token) registers with the fake kubelet, publishes the node-register annotation
/// on a real Node, and answers `Allocate` for a pod the real API server stored and the HAMi
/// scheduler's steps (annotations, node lock, a real Binding) prepared: it finds the pod through
/// its watch of this node's pods (field selector), writes the limits file, sets bind-phase and
/// releases the lock with patches the real server accepts, and records an Event.
fn device_plugin_against_the_real_api_server(c: &mut Cluster) {
    use hami_tests::kubelet::FakeKubelet;

    let dir = c.work.path().join("dp");
    let (kubelet_dir, hook) = (dir.join("kubelet"), dir.join("hook"));
    std::fs::create_dir_all(&kubelet_dir).unwrap();
    hami_tests::hook::install_stand_in(&hook.join("vgpu")).unwrap();
    let inventory = dir.join("inventory.yaml");
    std::fs::write(
        &inventory,
        format!("- uuid: {GPU_A}\n  name: NVIDIA H200\n  memoryMib: 143771\n  numaNode: 0\n"),
    )
    .unwrap();
    c.apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": DP_NODE, "labels": {"gpu": "on"}}}));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let kubelet = rt.block_on(FakeKubelet::start(&kubelet_dir)).unwrap();
    // The token kubelet would project into the plugin's pod on DP_NODE (it names the node).
    let kubeconfig = c.plugin_kubeconfig(DP_NODE);
    let log = std::fs::File::create(c.dir.join("logs/hami-device-plugin.log")).unwrap();
    let plugin = Command::new(binary("hami-device-plugin"))
        .arg("run")
        .arg("--inventory")
        .arg(&inventory)
        .args(["--node-name", DP_NODE])
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--hook-path")
        .arg(&hook)
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .env("KUBECONFIG", &kubeconfig)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    std::fs::write(
        c.dir.join("pids/hami-device-plugin"),
        plugin.id().to_string(),
    )
    .unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(kubelet.wait_for_registration(1, Duration::from_secs(30)))
            .unwrap_or_else(|e| {
                panic!(
                    "no registration: {e}; log: {}",
                    std::fs::read_to_string(c.dir.join("logs/hami-device-plugin.log"))
                        .unwrap_or_default()
                )
            });
        wait_for(
            "the node-register annotation on the real Node",
            Duration::from_secs(30),
            || {
                c.get("node", None, DP_NODE)["metadata"]["annotations"]["hami.io/node-nvidia-register"].is_string()
            },
        );
        // A HAMi pod, admitted by the real webhook.
        let (stored, _) = c
            .create_pod(TENANT, &pod("dp-pod", json!({}), json!([container("cuda", json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))])))
            .unwrap();
        let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
        // The HAMi scheduler: node lock, device annotations, bind-phase, then a Binding (the real
        // API server refuses spec.nodeName in a patch).
        schedule_as_hami(c, TENANT, "dp-pod", 3000, 30);
        let refused = c.kubectl(
            &[
                "patch",
                "pod",
                "dp-pod",
                "-n",
                TENANT,
                "--type=merge",
                "-p",
                &json!({"spec": {"nodeName": DP_NODE}}).to_string(),
            ],
            None,
        );
        assert!(
            !refused.status.success(),
            "the real API server let a patch set spec.nodeName"
        );
        bind(c, TENANT, "dp-pod");
        // kubelet's Allocate for the device the scheduler chose.
        let response = rt.block_on(async {
            let mut client = kubelet.plugin().await.unwrap();
            client.allocate(&[vec![format!("{GPU_A}-0")]]).await
        });
        let response = response.unwrap_or_else(|e| {
            panic!(
                "Allocate failed: {e}; log: {}",
                std::fs::read_to_string(c.dir.join("logs/hami-device-plugin.log"))
                    .unwrap_or_default()
            )
        });
        let answer = &response.container_responses[0];
        assert!(
            answer
                .mounts
                .iter()
                .any(|m| m.container_path == "/overrideEnv" && m.read_only),
            "{answer:?}"
        );
        let file = answer
            .mounts
            .iter()
            .find(|m| m.container_path == "/overrideEnv")
            .unwrap()
            .host_path
            .clone();
        let limits = std::fs::read_to_string(&file).unwrap();
        assert!(
            limits.contains("CUDA_DEVICE_MEMORY_LIMIT_0=3000m"),
            "{limits}"
        );
        assert!(
            file.contains(&uid),
            "the limits file {file} is not the pod's"
        );
        let after = c.get("pod", Some(TENANT), "dp-pod");
        assert_eq!(
            after["metadata"]["annotations"]["hami.io/bind-phase"], "success",
            "{}",
            after["metadata"]["annotations"]
        );
        let node = c.get("node", None, DP_NODE);
        assert!(
            node["metadata"]["annotations"]["hami.io/mutex.lock"].is_null(),
            "the node lock was not released: {}",
            node["metadata"]["annotations"]
        );
        // The server's optimistic concurrency, which the plugin's preconditioned patches rely on:
        // a patch with a stale resourceVersion is a 409 Conflict.
        let stale = stored["metadata"]["resourceVersion"].as_str().unwrap();
        let (code, body) = api_call(
            c,
            "PATCH",
            &format!("/api/v1/namespaces/{TENANT}/pods/dp-pod"),
            "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": stale, "annotations": {"hami.io/bind-phase": "failed"}}}),
        );
        assert_eq!(code, 409, "stale patch: {body}");
        // Someone else patches the pod while Allocate reads and writes it (the plugin's patches
        // carry the resourceVersion it read: a 409 from the real server means read again).
        // The timing is varied per pod; whatever the interleaving, both writes must land.
        for i in 0..4_u64 {
            let name = format!("dp-race-{i}");
            c.create_pod(
                TENANT,
                &pod(
                    &name,
                    json!({}),
                    json!([container(
                        "cuda",
                        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
                    )]),
                ),
            )
            .unwrap();
            schedule_as_hami(c, TENANT, &name, 1000, 0);
            bind(c, TENANT, &name);
            let (other, allocated) = std::thread::scope(|scope| {
                let other = scope.spawn(|| {
                    std::thread::sleep(Duration::from_millis(5 * i));
                    api_call(
                        c,
                        "PATCH",
                        &format!("/api/v1/namespaces/{TENANT}/pods/{name}"),
                        "application/merge-patch+json",
                        &json!({"metadata": {"annotations": {"other-writer": format!("w{i}")}}}),
                    )
                });
                let allocated = rt.block_on(async {
                    let mut client = kubelet.plugin().await.unwrap();
                    client.allocate(&[vec![format!("{GPU_A}-{}", 2 + i)]]).await
                });
                (other.join().unwrap(), allocated)
            });
            assert_eq!(other.0, 200, "the other writer's patch: {}", other.1);
            allocated
                .unwrap_or_else(|e| panic!("{name}: Allocate failed beside another writer: {e}"));
            let after = c.get("pod", Some(TENANT), &name);
            let a = &after["metadata"]["annotations"];
            assert_eq!(a["hami.io/bind-phase"], "success", "{name}: {a}");
            assert_eq!(
                a["other-writer"],
                format!("w{i}").as_str(),
                "{name}: the other writer's annotation was lost: {a}"
            );
            assert!(
                c.get("node", None, DP_NODE)["metadata"]["annotations"]["hami.io/mutex.lock"]
                    .is_null(),
                "{name}: lock kept"
            );
        }
        // A pod that bypassed the webhook (its namespace is excluded) with an invalid
        // hami.io/limit-delivery: allocated with the node's setting and a Warning Event through
        // events.k8s.io, as kube's Recorder writes it, allowed by the chart's RBAC.
        let mut bad = pod(
            "dp-bad",
            json!({"hami.io/limit-delivery": "Env"}),
            json!([container(
                "cuda",
                json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
            )]),
        );
        bad["metadata"]["namespace"] = json!(OFFLINE);
        c.create_pod(OFFLINE, &bad).unwrap();
        schedule_as_hami(c, OFFLINE, "dp-bad", 1000, 0);
        bind(c, OFFLINE, "dp-bad");
        let response = rt.block_on(async {
            let mut client = kubelet.plugin().await.unwrap();
            client.allocate(&[vec![format!("{GPU_A}-1")]]).await
        });
        let response = response.unwrap_or_else(|e| panic!("Allocate failed: {e}"));
        assert!(
            response.container_responses[0]
                .mounts
                .iter()
                .any(|m| m.container_path == "/overrideEnv")
        );
        let mut reasons = Vec::new();
        wait_for(
            "the InvalidLimitDelivery Event",
            Duration::from_secs(15),
            || {
                let events = c.ok(
                    &[
                        "get",
                        "events.events.k8s.io",
                        "-n",
                        OFFLINE,
                        "--field-selector",
                        "regarding.name=dp-bad",
                        "-o",
                        "json",
                    ],
                    None,
                );
                let events: Value = serde_json::from_str(&events).unwrap();
                reasons = events["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|e| {
                        Some((
                            e["reason"].as_str()?.to_owned(),
                            e["type"].as_str()?.to_owned(),
                            e["reportingController"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                        ))
                    })
                    .collect::<Vec<_>>();
                // (The real scheduler reports too: this pod names the default scheduler.)
                reasons.retain(|r| r.2 == "hami-device-plugin");
                !reasons.is_empty()
            },
        );
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert_eq!(reasons[0].0, "InvalidLimitDelivery", "{reasons:?}");
        assert_eq!(reasons[0].1, "Warning", "{reasons:?}");
        println!("device plugin Event: {reasons:?}");
    }));
    stop_child(plugin, &c.dir.join("pids/hami-device-plugin"));
    drop(kubelet);
    drop(rt);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// The HAMi scheduler's annotations for one container on one share of GPU_A (`mib` MiB, `cores`
/// %) on DP_NODE: the node lock, the device lists, `bind-phase: allocating`.
fn schedule_as_hami(c: &Cluster, ns: &str, name: &str, mib: u64, cores: u32) {
    use hami_device_plugin::allocation::plan::codec::{ContainerDevice, PodDevices};
    let devices = PodDevices::from_containers(&[vec![ContainerDevice {
        uuid: GPU_A.into(),
        kind: "NVIDIA".into(),
        memory_mib: mib,
        cores,
        extra: vec![],
    }]])
    .encode();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let lock = format!("hami.io/mutex.lock={},{ns},{name}", rfc3339(now).unwrap());
    c.ok(&["annotate", "node", DP_NODE, "--overwrite", &lock], None);
    // As HAMi's scheduler's identity: nobody else may write these (the chart's admission policy).
    let scheduler = c.scheduler_kubeconfig();
    let out = c.kubectl_as(
        &scheduler,
        &[
            "annotate",
            "pod",
            name,
            "-n",
            ns,
            "--overwrite",
            &format!("hami.io/vgpu-node={DP_NODE}"),
            &format!("hami.io/vgpu-time={now}"),
            &format!("hami.io/vgpu-devices-to-allocate={devices}"),
            &format!("hami.io/vgpu-devices-allocated={devices}"),
            "hami.io/bind-phase=allocating",
            &format!("hami.io/bind-time={now}"),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "the scheduler's identity may not annotate {ns}/{name}: {}",
        text(&out.stderr)
    );
}

/// A real Binding of the pod to DP_NODE (the one way to set spec.nodeName).
fn bind(c: &Cluster, ns: &str, name: &str) {
    let (code, body) = api_call(
        c,
        "POST",
        &format!("/api/v1/namespaces/{ns}/pods/{name}/binding"),
        "application/json",
        &json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": DP_NODE}}),
    );
    assert_eq!(code, 201, "binding {ns}/{name}: {body}");
}

/// SIGTERM, up to 10 s to exit, then SIGKILL; the PID file `scripts/cluster down` would use goes.
fn stop_child(mut child: Child, pid_file: &Path) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(pid_file);
}

const CASES: &[Case<Cluster>] = &[
    (
        "helm install, certgen hooks, caBundle, the Service reaches the host webhook",
        install,
    ),
    (
        "HAMi pods: stored pod equals hami-webhook mutate",
        hami_pods,
    ),
    (
        "helm upgrade: core policy and overwriteEnv reach stored pods",
        hami_settings_after_upgrade,
    ),
    (
        "reinvocation: a second webhook adds a GPU container, ours is called again",
        reinvocation_with_a_second_webhook,
    ),
    (
        "beside KAI v0.17's admission: every fraction-pod shape, both orders, hamicore off and on",
        peers::kai_fraction_pods_beside_kai_admission,
    ),
    (
        "KAI's binder, reservation pod and UPDATEs go through with the webhook down",
        peers::kai_binding_never_waits_for_the_webhook,
    ),
    (
        "beside HAMi v2.10's webhook: one entry per variable in both orders",
        peers::hami_pods_beside_hamis_webhook,
    ),
    (
        "KAI gpu-memory: stored pod equals hami-webhook mutate",
        kai_gpu_memory,
    ),
    (
        "KAI gpu-fraction: basis from real Node objects, changed through the API",
        kai_gpu_fraction_basis_from_real_nodes,
    ),
    (
        "Pod Security baseline: HAMi and KAI GPU pods admitted, a tenant's hostPath refused",
        tenant_namespace_keeps_baseline,
    ),
    (
        "denials as kubectl prints them",
        denials_as_kubectl_prints_them,
    ),
    (
        "a gpu-fraction pod without a basis: denied by default, the warn opt-out's warning reaches the client",
        missing_basis_denied_by_default_and_the_opt_out_warns,
    ),
    (
        "UPDATE of a limits.hami.io key is denied",
        update_of_limits_key_denied,
    ),
    (
        "a tenant's routes around the scheduler annotations, limits files and delivery mode are refused by the admission policy",
        tenant_routes_refused_by_the_admission_policies,
    ),
    (
        "the device plugin's token writes only to its own node",
        device_plugin_writes_only_its_node,
    ),
    (
        "CEL matchConditions keep plain pods away from the webhook",
        cel_excludes_plain_pods,
    ),
    (
        "edge pods are stored valid or denied by the webhook",
        edge_pods_never_made_invalid,
    ),
    ("RBAC as shipped", rbac_as_shipped),
    (
        "device plugin: pod watch, node lock, patches, Binding, Events against the real API server",
        device_plugin_against_the_real_api_server,
    ),
    (
        "failurePolicy measured with the webhook down",
        failure_policy,
    ),
    (
        "helm rollback keeps the caBundle, helm uninstall leaves nothing",
        rollback_keeps_ca_bundle_and_uninstall_leaves_nothing,
    ),
];

fn main() -> ExitCode {
    if listed(CASES) {
        return ExitCode::SUCCESS;
    }
    if ignored_unless_asked("real_cluster", CASES, NEEDS) {
        return ExitCode::SUCCESS;
    }
    let dir = std::env::temp_dir().join(format!("hami-real-cluster-{}", std::process::id()));
    hami_tests::real::stop_on_signal("real_cluster", repo().join("scripts/cluster"), dir.clone());
    let started = Instant::now();
    let mut cluster = match Cluster::up(dir.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("real_cluster: {e}");
            let _ = Command::new(repo().join("scripts/cluster"))
                .arg("down")
                .env("HAMI_CLUSTER_DIR", &dir)
                .status();
            return ExitCode::FAILURE;
        }
    };
    println!(
        "real_cluster: control plane up in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        cluster.bin.display()
    );
    let (passed, failed) = run_cases("real_cluster", CASES, &mut cluster);
    if !failed.is_empty() {
        let log = cluster.webhook_log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        eprintln!("--- hami-webhook log (last lines) ---");
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
    }
    let clean = cluster.down();
    assert!(
        !dir.exists() || !clean,
        "scripts/cluster down left {}",
        dir.display()
    );
    println!(
        "real_cluster: {passed} passed, {} failed, {} not run, in {:.1} s; cluster stopped: {clean}",
        failed.len(),
        CASES.len() - passed - failed.len(),
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() && passed == CASES.len() && clean {
        ExitCode::SUCCESS
    } else {
        for f in &failed {
            eprintln!("FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}

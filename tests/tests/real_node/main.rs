//! The chart, both programs and the preload library on a **real node**: kubelet and kube-proxy from
//! the pinned Kubernetes build, containerd 2 and runc built from their Go modules
//! (`scripts/runtime-build`; `HAMI_CONTAINERD=debian`: Debian's 1.6), CNI bridge networking,
//! the images built here (`scripts/images`: nothing can be pulled), started with the control plane
//! by `scripts/cluster up --with-chart` (real Helm, hooks included: the certgen Jobs run on the
//! node). No GPU here: the device plugin reads an inventory (`devicePlugin.inventory`), HAMi-core
//! is HAMi v2.10's file layout with a stub `libvgpu.so`.
//!
//! Every limit is read where a user would read it: inside the real container (`kubectl exec`), in
//! the entrypoint's environment and in a process started with an empty environment (`env -i`,
//! `su -`: what an SSH login or cron starts). The faults are real too: kubelet restarted,
//! containerd restarted under a running pod, the device plugin's pod deleted mid-allocation, the API server restarted mid-allocation, the webhook
//! scaled to zero, the node rebooted (every node process killed, mounts and /run-like state gone).
//!
//! One cluster serves every case, in order; `scripts/cluster down` stops it whatever happens (a
//! failing case, a panic, SIGINT or SIGTERM), and the last check is that nothing is left: no
//! process, mount, bridge, iptables chain or kubelet folder. `harness = false`: its own `main`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use hami_device_plugin::kubelet::api::v1beta1;
use hami_tests::real::{
    Case, ignored_unless_asked, listed, repo, rfc3339, run_cases, text, wait_for,
};
use serde_json::{Value, json};

mod cdi;
mod hostile;
mod peers;
mod regions;
mod sessions;

/// Why plain `cargo test` leaves this suite out (`scripts/test-all` runs it with `--ignored`).
const NEEDS: &str = "needs root, a Kubernetes build, containerd, runc and the machine's one kubelet: run by scripts/test-all (see docs/development.md)";
const NS: &str = "hami-limits";
const PREFIX: &str = "hami-hami-limits";
const TENANT: &str = "tenant";
const NODE: &str = "hami-node";
const WORKLOAD: &str = "localhost/hami-limits/workload:test";
/// The inventory's GPUs (scripts/cluster's chart values): two H200s, split 10 ways each.
const GPU_0: &str = "GPU-6a5b0c1e-0000-4000-8000-000000000000";
const GPU_1: &str = "GPU-6a5b0c1e-0000-4000-8000-000000000001";
const VRAM_MIB: u64 = 143_771;

struct Node {
    dir: PathBuf,
    bin: PathBuf,
}

impl Node {
    fn up(dir: PathBuf, values: &Path) -> Result<Self, String> {
        let out = Command::new(repo().join("scripts/cluster"))
            .args(["up", "--with-chart"])
            .env("HAMI_CLUSTER_DIR", &dir)
            .env("HAMI_CLUSTER_VALUES", values)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run scripts/cluster: {e}"))?;
        eprint!("{}", text(&out.stderr));
        if !out.status.success() {
            return Err(format!(
                "scripts/cluster up --with-chart failed:\n{}",
                text(&out.stdout)
            ));
        }
        let bin = std::fs::read_to_string(dir.join("bin")).map_err(|e| e.to_string())?;
        Ok(Self {
            bin: PathBuf::from(bin.trim()),
            dir,
        })
    }

    fn script(&self, args: &[&str]) {
        let out = Command::new(repo().join("scripts/cluster"))
            .args(args)
            .env("HAMI_CLUSTER_DIR", &self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/cluster {} failed:\n{}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        hami_tests::real::kubectl(
            &self.bin.join("kubectl"),
            &self.dir.join("admin.kubeconfig"),
            args,
            stdin,
        )
        .unwrap()
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

    fn try_get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let out = self.kubectl(&["get", kind, name, "-n", ns, "-o", "json"], None);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    fn create(&self, object: &Value) -> Output {
        self.kubectl(&["create", "-f", "-"], Some(&object.to_string()))
    }

    /// `kubectl exec` into the pod's first container: (exit code, stdout, stderr).
    fn exec(&self, pod: &str, cmd: &[&str]) -> (i32, String, String) {
        let mut args = vec!["exec", "-n", TENANT, pod, "--"];
        args.extend(cmd);
        let out = self.kubectl(&args, None);
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }

    fn exec_ok(&self, pod: &str, cmd: &[&str]) -> String {
        let (code, out, err) = self.exec(pod, cmd);
        assert_eq!(code, 0, "{pod}: {} failed: {out}{err}", cmd.join(" "));
        out
    }

    /// A call to the API server with the admin's certificate (the Binding subresource).
    fn api_post(&self, path: &str, body: &Value) -> (u16, String) {
        let port = std::fs::read_to_string(self.dir.join("apiserver-port")).unwrap();
        let pki = self.dir.join("pki");
        let out = Command::new("curl")
            .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "20"])
            .arg("--cacert")
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .args(["-H", "Content-Type: application/json", "-X", "POST", "-d"])
            .arg(body.to_string())
            .arg(format!("https://127.0.0.1:{}{path}", port.trim()))
            .output()
            .unwrap();
        let all = text(&out.stdout);
        let (body, code) = all.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    fn hook(&self) -> PathBuf {
        self.dir.join("node/hook/vgpu")
    }

    fn gpu_capacity(&self) -> String {
        self.get("node", None, NODE)["status"]["capacity"]["nvidia.com/gpu"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn down(&self) -> bool {
        Command::new(repo().join("scripts/cluster"))
            .arg("down")
            .env("HAMI_CLUSTER_DIR", &self.dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

/// A pod of the workload image whose entrypoint records its environment in /tmp/entry-env.
fn workload_pod(name: &str, annotations: Value, limits: Value, env: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda", "image": WORKLOAD, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "printenv > /tmp/entry-env; exec sleep infinity"],
                "env": env,
                "resources": {"limits": limits},
            }],
        },
    })
}

fn hami_pod(name: &str, mib: u64, cores: u32) -> Value {
    workload_pod(
        name,
        json!({}),
        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib, "nvidia.com/gpucores": cores}),
        // No HAMi-core variable of its own: `Allocate` refuses a GPU container that sets one
        // (tests/tests/it/allocate_refusals.rs).
        json!([]),
    )
}

fn kai_pod(name: &str, annotations: Value) -> Value {
    let mut p = workload_pod(name, annotations, json!({}), json!([]));
    p["spec"]["schedulerName"] = json!("kai-scheduler");
    p["metadata"]["labels"] = json!({"kai.scheduler/queue": "default-queue"});
    p
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// HAMi v2.10's scheduler for one single-GPU container: the node lock naming the pod, then the
/// pod's annotations (vgpu-node, vgpu-time, devices to allocate and allocated, bind-phase
/// allocating, bind-time), then the Binding.
fn schedule_and_bind_as_hami(n: &Node, name: &str, uuid: &str, mib: u64, cores: u32) {
    schedule_and_bind_as_hami_in(n, TENANT, name, uuid, mib, cores);
}

fn schedule_and_bind_as_hami_in(n: &Node, ns: &str, name: &str, uuid: &str, mib: u64, cores: u32) {
    let devices = format!("{uuid},NVIDIA,{mib},{cores}:;");
    let t = now();
    n.ok(
        &[
            "annotate",
            "node",
            NODE,
            "--overwrite",
            &format!("hami.io/mutex.lock={},{ns},{name}", rfc3339(t).unwrap()),
        ],
        None,
    );
    // As HAMi's scheduler's identity (the chart's default admissionPolicy.schedulerIdentities):
    // the chart's admission policy refuses these annotations from anybody else, the admin
    // included.
    n.ok(
        &[
            "--as=system:serviceaccount:kube-system:hami-scheduler",
            "--as-group=system:masters",
            "annotate",
            "pod",
            name,
            "-n",
            ns,
            "--overwrite",
            &format!("hami.io/vgpu-node={NODE}"),
            &format!("hami.io/vgpu-time={t}"),
            &format!("hami.io/vgpu-devices-to-allocate={devices}"),
            &format!("hami.io/vgpu-devices-allocated={devices}"),
            "hami.io/bind-phase=allocating",
            &format!("hami.io/bind-time={t}"),
        ],
        None,
    );
    bind_in(n, ns, name);
}

/// A Binding to the node: what a scheduler does last (KAI's binder for KAI pods).
fn bind(n: &Node, name: &str) {
    bind_in(n, TENANT, name);
}

fn bind_in(n: &Node, ns: &str, name: &str) {
    let (code, body) = n.api_post(
        &format!("/api/v1/namespaces/{ns}/pods/{name}/binding"),
        &json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}),
    );
    assert_eq!(code, 201, "binding {name}: {body}");
}

fn running(n: &Node, name: &str) -> bool {
    running_in(n, TENANT, name)
}

fn running_in(n: &Node, ns: &str, name: &str) -> bool {
    n.try_get("pod", ns, name).is_some_and(|p| {
        p["status"]["phase"] == "Running"
            && p["status"]["containerStatuses"][0]["ready"] == json!(true)
    })
}

fn wait_running(n: &Node, name: &str) -> Duration {
    wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(90),
        || running(n, name),
    )
}

fn delete_pod(n: &Node, name: &str) {
    delete_pod_in(n, TENANT, name);
}

fn delete_pod_in(n: &Node, ns: &str, name: &str) {
    n.ok(
        &[
            "delete",
            "pod",
            name,
            "-n",
            ns,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
}

fn pod_uid(n: &Node, name: &str) -> String {
    n.get("pod", Some(TENANT), name)["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `KEY=VALUE` lines of `printenv`-like output.
fn vars(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn var<'a>(vars: &'a [(String, String)], key: &str) -> Option<&'a str> {
    vars.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A limits file as the contract writes it: `KEY=VALUE` lines, each ended by LF, no CR, no
/// whitespace, no empty value, the format line present. A torn file fails this.
fn assert_whole_limits_file(path: &Path) -> String {
    let body = std::fs::read_to_string(path).unwrap();
    assert!(
        body.ends_with('\n'),
        "{}: not ended by a newline: {body:?}",
        path.display()
    );
    assert!(!body.contains('\r'), "{}: CR in {body:?}", path.display());
    for line in body.lines() {
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}: line {line:?} is not KEY=VALUE", path.display()));
        assert!(
            !k.is_empty() && !v.is_empty() && !line.contains(char::is_whitespace),
            "{}: bad line {line:?}",
            path.display()
        );
    }
    assert!(
        body.contains("HAMI_LIMITS_FORMAT="),
        "{}: no format line in {body:?}",
        path.display()
    );
    body
}

/// The pod's limits file on the host (`<hook>/vgpu/containers/<uid>_<container>.limits`).
fn limits_file(n: &Node, uid: &str) -> PathBuf {
    n.hook().join(format!("containers/{uid}_cuda.limits"))
}

/// Inside the running container: the file, an env-less process, `su -`, the entrypoint: all
/// carry `want` (KEY, VALUE pairs), and the container's own value of a key does not survive.
fn assert_capped_inside(n: &Node, pod: &str, want: &[(&str, &str)]) {
    let file = n.exec_ok(pod, &["cat", "/overrideEnv"]);
    let envless = n.exec_ok(pod, &["env", "-i", "/usr/bin/printenv"]);
    let su = n.exec_ok(pod, &["su", "-", "-c", "printenv"]);
    let entry = n.exec_ok(pod, &["cat", "/tmp/entry-env"]);
    for (what, out) in [
        ("/overrideEnv", &file),
        ("env -i printenv", &envless),
        ("su - -c printenv", &su),
        ("the entrypoint's environment", &entry),
    ] {
        let v = vars(out);
        for (key, value) in want {
            assert_eq!(
                var(&v, key),
                Some(*value),
                "{pod}: {what}: {key} is not {value}:\n{out}"
            );
        }
    }
    // Read-only: not even root in the container can change it.
    let (code, _, err) = n.exec(
        pod,
        &[
            "sh",
            "-c",
            "echo CUDA_DEVICE_MEMORY_LIMIT_0=1t >> /overrideEnv",
        ],
    );
    assert_ne!(code, 0, "{pod}: /overrideEnv is writable");
    assert!(
        err.contains("Read-only file system"),
        "{pod}: writing /overrideEnv: {err}"
    );
    // Both libraries are in the env-less process, loaded through /etc/ld.so.preload.
    let maps = n.exec_ok(pod, &["env", "-i", "/usr/bin/cat", "/proc/self/maps"]);
    for lib in ["libhami_preload.so", "libvgpu.so"] {
        assert!(maps.contains(lib), "{pod}: {lib} not loaded:\n{maps}");
    }
}

// ---------------------------------------------------------------------------------------------
// The cases, in order.

fn chart_pods_run(n: &mut Node) {
    // Helm ran the hooks: every hook's last run succeeded (the certgen Jobs ran on the node).
    let release: Value =
        serde_json::from_str(&std::fs::read_to_string(n.dir.join("helm-release.json")).unwrap())
            .unwrap();
    let hooks = release["hooks"].as_array().cloned().unwrap_or_default();
    let jobs: Vec<&Value> = hooks
        .iter()
        .filter(|h| {
            h["kind"] == "Job" || h["manifest"].as_str().unwrap_or("").contains("kind: Job")
        })
        .collect();
    assert!(!jobs.is_empty(), "no hook Job in the release: {hooks:?}");
    for h in &hooks {
        assert_eq!(
            h["last_run"]["phase"], "Succeeded",
            "hook {} did not succeed: {}",
            h["name"], h["last_run"]
        );
    }
    // certgen patched the caBundle with the Secret's CA.
    let cfg = n.get("mutatingwebhookconfiguration", None, PREFIX);
    let bundle = cfg["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let secret = n.get("secret", Some(NS), &format!("{PREFIX}-webhook-tls"));
    assert!(!bundle.is_empty(), "empty caBundle");
    assert_eq!(bundle, secret["data"]["ca.crt"].as_str().unwrap());
    // The webhook's pods run on the node and are the Service's endpoints.
    let pods: Value =
        serde_json::from_str(&n.ok(&["get", "pods", "-n", NS, "-o", "json"], None)).unwrap();
    let mut webhook_ips = Vec::new();
    for p in pods["items"].as_array().unwrap() {
        let name = p["metadata"]["name"].as_str().unwrap();
        assert_eq!(p["spec"]["nodeName"], NODE, "{name} not on the node");
        assert_eq!(p["status"]["phase"], "Running", "{name}: {}", p["status"]);
        for s in p["status"]["initContainerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(
                s["state"]["terminated"]["exitCode"], 0,
                "{name}: init container {}: {}",
                s["name"], s["state"]
            );
        }
        if name.starts_with(&format!("{PREFIX}-webhook-")) {
            webhook_ips.push(p["status"]["podIP"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(webhook_ips.len(), 2, "webhook pods: {webhook_ips:?}");
    let slices: Value = serde_json::from_str(&n.ok(
        &[
            "get",
            "endpointslices",
            "-n",
            NS,
            "-l",
            &format!("kubernetes.io/service-name={PREFIX}-webhook"),
            "-o",
            "json",
        ],
        None,
    ))
    .unwrap();
    let slice_text = slices.to_string();
    for ip in &webhook_ips {
        assert!(ip.starts_with("10.244.0."), "pod IP {ip} not on the bridge");
        assert!(
            slice_text.contains(ip),
            "{ip} not an endpoint: {slice_text}"
        );
    }
    // The device plugin registered with the real kubelet: capacity = 2 GPUs x 10.
    assert_eq!(n.gpu_capacity(), "20");
    let node = n.get("node", None, NODE);
    assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "20");
    let register = node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
        .as_str()
        .unwrap_or_default();
    assert!(
        register.contains(GPU_0) && register.contains(GPU_1),
        "node-nvidia-register: {register}"
    );
    // The init containers installed HAMi-core (from the stand-in's libvgpu.so.v2.10.0) and the
    // preload library, first in ld.so.preload, into the hook folder on the host.
    let preload = std::fs::read_to_string(n.hook().join("ld.so.preload")).unwrap();
    let first = preload.lines().next().unwrap_or_default();
    assert!(
        first.ends_with("/vgpu/libhami_preload.so"),
        "ld.so.preload: {preload}"
    );
    assert!(
        preload.contains("/vgpu/libvgpu.so"),
        "ld.so.preload: {preload}"
    );
    for f in ["libhami_preload.so", "libvgpu.so"] {
        assert!(n.hook().join(f).is_file(), "{f} not installed");
    }
    let stub = std::fs::read(n.hook().join("libvgpu.so")).unwrap();
    assert!(
        stub.windows(24).any(|w| w == b"hami_limits_libvgpu_stub"),
        "libvgpu.so is not the stand-in image's library"
    );
    // The KAI hook folder (webhook.kai.hookPath, a folder of its own here) is filled by the hook
    // installer alone, the same way.
    let kai = n.dir.join("node/kai-hook/vgpu");
    let kai_preload = std::fs::read_to_string(kai.join("ld.so.preload")).unwrap();
    assert!(
        kai_preload.lines().next().unwrap_or_default()
            == kai.join("libhami_preload.so").display().to_string(),
        "KAI ld.so.preload: {kai_preload}"
    );
    assert!(kai.join("libvgpu.so").is_file() && kai.join("libhami_preload.so").is_file());
    // Both folders got the node GPU file, from the inventory the chart passed to install-hook
    // (no NVML here), read-only for everyone else, and usable by the preload library.
    for dir in [n.hook(), kai.clone()] {
        let path = dir.join("node-gpus");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let parsed = hami_shared::node_gpus::parse(text.as_bytes());
        assert!(
            parsed.usable(),
            "{}: {:?}\n{text}",
            path.display(),
            parsed.diagnostics
        );
        assert_eq!(parsed.mib_for(0), Some(VRAM_MIB), "{text}");
        assert_eq!(parsed.mib_for(1), Some(VRAM_MIB), "{text}");
        assert_eq!(
            parsed.uuids.get(&0).map(String::as_str),
            Some(GPU_0),
            "{text}"
        );
        assert_eq!(
            parsed.uuids.get(&1).map(String::as_str),
            Some(GPU_1),
            "{text}"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o022, 0, "{}: mode {mode:o}", path.display());
    }
    // Both DaemonSets: the hook installer (the KAI hook folder) and the plugin are Ready.
    for ds in ["device-plugin", "hook-installer"] {
        let d = n.get("daemonset", Some(NS), &format!("{PREFIX}-{ds}"));
        assert_eq!(d["status"]["numberReady"], 1, "{ds}: {}", d["status"]);
    }
    // The hook installer serves hami.io/preload (webhook.kai.hookDelivery: device-plugin, the
    // default), through which KAI containers get the hook: kubelet advertises its slots.
    hami_tests::real::wait_for(
        "hami.io/preload on the node",
        Duration::from_secs(60),
        || n.get("node", None, NODE)["status"]["allocatable"]["hami.io/preload"] == "1024",
    );
    // The tenant namespace keeps Pod Security baseline enforced: every pod of this test runs
    // under it, KAI pods included (their hook comes from Allocate, not a hostPath).
    n.ok(&["create", "namespace", TENANT], None);
    n.ok(
        &[
            "label",
            "namespace",
            TENANT,
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        None,
    );
}

fn hami_pod_end_to_end(n: &mut Node) {
    let out = n.create(&hami_pod("hami-a", 3000, 30));
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The webhook (through its Service, pods on the node) sent it to HAMi's scheduler.
    let p = n.get("pod", Some(TENANT), "hami-a");
    assert_eq!(p["spec"]["schedulerName"], "hami-scheduler");
    schedule_and_bind_as_hami(n, "hami-a", GPU_0, 3000, 30);
    let took = wait_running(n, "hami-a");
    println!(
        "  HAMi pod Running {:.1} s after its Binding",
        took.as_secs_f64()
    );
    assert_capped_inside(
        n,
        "hami-a",
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
        ],
    );
    let envless = vars(&n.exec_ok("hami-a", &["env", "-i", "/usr/bin/printenv"]));
    let cache = var(&envless, "CUDA_DEVICE_MEMORY_SHARED_CACHE").unwrap_or_default();
    assert!(
        cache.ends_with("/vgpu/usage.cache"),
        "shared cache: {cache}"
    );
    let p = n.get("pod", Some(TENANT), "hami-a");
    assert_eq!(
        p["metadata"]["annotations"]["hami.io/bind-phase"],
        "success"
    );
    // The file on the host is the one in the container; the collector removes it once the pod
    // is gone (collector interval 2 s, grace 1 s in this test's values).
    let uid = pod_uid(n, "hami-a");
    let file = limits_file(n, &uid);
    let body = assert_whole_limits_file(&file);
    assert_eq!(body, n.exec_ok("hami-a", &["cat", "/overrideEnv"]));
    let folder = n.hook().join(format!("containers/{uid}_cuda"));
    assert!(folder.is_dir(), "{} missing", folder.display());
    delete_pod(n, "hami-a");
    wait_for(
        "the collector to remove the deleted pod's files",
        Duration::from_secs(60),
        || !file.exists() && !folder.exists(),
    );
}

/// The README's quick start, as written: the example pod, the example script playing HAMi's
/// scheduler (kubectl from `scripts/cluster env`), a capped env-less process.
fn readme_quick_start(n: &mut Node) {
    let example = std::fs::read_to_string(repo().join("examples/node-hami-pod.yaml")).unwrap();
    n.ok(&["apply", "-n", TENANT, "-f", "-"], Some(&example));
    let path = format!(
        "{}:{}",
        n.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(repo().join("examples/node-schedule-as-hami.sh"))
        .args([TENANT, "hami-demo"])
        .env("KUBECONFIG", n.dir.join("admin.kubeconfig"))
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "examples/node-schedule-as-hami.sh: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_capped_inside(
        n,
        "hami-demo",
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
        ],
    );
    delete_pod(n, "hami-demo");
}

fn kai_gpu_memory_pod(n: &mut Node) {
    let out = n.create(&kai_pod("kai-memory", json!({"gpu-memory": "3000"})));
    assert!(out.status.success(), "{}", text(&out.stderr));
    bind(n, "kai-memory");
    wait_running(n, "kai-memory");
    assert_capped_inside(n, "kai-memory", &[("CUDA_DEVICE_MEMORY_LIMIT", "3000m")]);
    // HAMi-core and the preload library come from the hook installer's folder.
    let maps = n.exec_ok(
        "kai-memory",
        &["env", "-i", "/usr/bin/cat", "/proc/self/maps"],
    );
    assert!(
        maps.contains("/node/kai-hook/vgpu/libvgpu.so")
            && maps.contains("/node/kai-hook/vgpu/libhami_preload.so"),
        "KAI pod's libraries not from the hook installer's folder:\n{maps}"
    );
    delete_pod(n, "kai-memory");
}

fn kai_gpu_fraction_pod(n: &mut Node) {
    // The basis is the node's GFD label (nvidia.com/gpu.memory), learned by the webhook's watch.
    let out = n.create(&kai_pod("kai-fraction", json!({"gpu-fraction": "0.5"})));
    assert!(out.status.success(), "{}", text(&out.stderr));
    bind(n, "kai-fraction");
    wait_running(n, "kai-fraction");
    let want = format!("{}m", VRAM_MIB / 2);
    assert_capped_inside(n, "kai-fraction", &[("CUDA_DEVICE_MEMORY_LIMIT", &want)]);
    delete_pod(n, "kai-fraction");
}

/// What the webhook would write into the `cuda` container's limits file for `pod` now (a
/// server-side dry run: admission runs, nothing is stored).
fn dry_run_limits(n: &Node, pod: &Value) -> String {
    let out = n.kubectl(
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&pod.to_string()),
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["metadata"]["annotations"]["limits.hami.io/cuda"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Label the node's GFD memory and wait until the webhook's node watch has it (its dry-run cap of
/// a 0.5 pod says so).
fn set_gpu_memory_label(n: &Node, mib: u64) {
    n.ok(
        &[
            "label",
            "node",
            NODE,
            "--overwrite",
            &format!("nvidia.com/gpu.memory={mib}"),
        ],
        None,
    );
    let probe = kai_pod("kai-probe", json!({"gpu-fraction": "0.5"}));
    let want = format!("CUDA_DEVICE_MEMORY_LIMIT={}m\n", mib / 2);
    wait_for(
        &format!("the webhook to learn nvidia.com/gpu.memory={mib}"),
        Duration::from_secs(30),
        || dry_run_limits(n, &probe).contains(&want),
    );
}

/// Puts the node back as the other cases expect it (the GFD label of its real cards, no fake
/// device node, no pod) however the case ends.
struct RestoreNode<'a> {
    n: &'a Node,
    device: PathBuf,
    pod: &'static str,
}

impl Drop for RestoreNode<'_> {
    fn drop(&mut self) {
        let _ = self.n.kubectl(
            &[
                "delete",
                "pod",
                self.pod,
                "-n",
                TENANT,
                "--ignore-not-found",
                "--wait=true",
                "--grace-period=0",
                "--force",
            ],
            None,
        );
        let _ = std::fs::remove_file(&self.device);
        let _ = self.n.kubectl(
            &[
                "label",
                "node",
                NODE,
                "--overwrite",
                &format!("nvidia.com/gpu.memory={VRAM_MIB}"),
            ],
            None,
        );
    }
}

fn kai_gpu_fraction_sized_on_the_node(n: &mut Node) {
    // The cluster's smallest card, as the webhook sees it, is an 80 GiB one; this node's cards
    // are the inventory's 143,771 MiB H200s. The container sees one of them: a device node
    // 195:1 (GPU 1's minor), made on the host and mounted where the NVIDIA runtime would put it.
    let dev = n.dir.join("node/fake-dev");
    std::fs::create_dir_all(&dev).unwrap();
    let nvidia1 = dev.join("nvidia1");
    let restore = RestoreNode {
        n,
        device: nvidia1.clone(),
        pod: "kai-per-node",
    };
    set_gpu_memory_label(n, 81_920);
    let _ = std::fs::remove_file(&nvidia1);
    let made = std::process::Command::new("mknod")
        .arg(&nvidia1)
        .args(["c", "195", "1"])
        .status()
        .unwrap();
    assert!(made.success(), "mknod {}", nvidia1.display());
    let mut p = kai_pod("kai-per-node", json!({"gpu-fraction": "0.5"}));
    p["spec"]["volumes"] = json!([{"name": "nvidia1",
        "hostPath": {"path": nvidia1.display().to_string(), "type": "CharDevice"}}]);
    p["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "nvidia1", "mountPath": "/dev/nvidia1", "readOnly": true}]);
    // The harness stands in for the GPU's device node with a hostPath of its own, which the
    // tenant namespace's Pod Security baseline refuses: lifted for this one creation only.
    let psa = |level: &str| {
        n.ok(
            &[
                "label",
                "namespace",
                TENANT,
                "--overwrite",
                &format!("pod-security.kubernetes.io/enforce={level}"),
            ],
            None,
        );
    };
    psa("privileged");
    let out = n.create(&p);
    psa("baseline");
    assert!(out.status.success(), "{}", text(&out.stderr));
    bind(n, "kai-per-node");
    wait_running(n, "kai-per-node");
    // The file holds the admission-time cap and the per-node keys ...
    let file = n.exec_ok("kai-per-node", &["cat", "/overrideEnv"]);
    let kai_hook = n.dir.join("node/kai-hook/vgpu");
    for line in [
        "CUDA_DEVICE_MEMORY_LIMIT=40960m".to_owned(),
        "HAMI_GPU_FRACTION=0.5".to_owned(),
        format!("HAMI_NODE_GPUS={}/node-gpus", kai_hook.display()),
    ] {
        assert!(
            file.lines().any(|l| l == line),
            "/overrideEnv has no {line}:\n{file}"
        );
    }
    // ... the library says what it computed (asked first: it says why, if it did not) ...
    let (_, _, said) = n.exec(
        "kai-per-node",
        &["env", "-i", "HAMI_PRELOAD_DEBUG=1", "/usr/bin/true"],
    );
    let seen = n.exec(
        "kai-per-node",
        &["ls", "-ln", "/dev", &format!("{}", kai_hook.display())],
    );
    assert!(
        said.contains(&format!(
            "per-node cap {} MiB (smallest of 1 visible GPU(s): {VRAM_MIB} MiB)",
            VRAM_MIB / 2
        )),
        "HAMI_PRELOAD_DEBUG said: {said}\nthe container sees: {seen:?}"
    );
    // ... and every process, the env-less one and a login included, has half of *this* card.
    let want = format!("{}m", VRAM_MIB / 2);
    for (what, cmd) in [
        ("env -i printenv", &["env", "-i", "/usr/bin/printenv"][..]),
        ("su - -c printenv", &["su", "-", "-c", "printenv"][..]),
        (
            "the entrypoint's environment",
            &["cat", "/tmp/entry-env"][..],
        ),
    ] {
        let out = n.exec_ok("kai-per-node", cmd);
        assert_eq!(
            var(&vars(&out), "CUDA_DEVICE_MEMORY_LIMIT"),
            Some(want.as_str()),
            "{what}:\n{out}"
        );
        assert!(
            !out.contains("HAMI_GPU_FRACTION"),
            "{what} exports the project key:\n{out}"
        );
    }
    delete_pod(n, "kai-per-node");
    drop(restore);
    set_gpu_memory_label(n, VRAM_MIB);
}

fn env_delivery_pod(n: &mut Node) {
    let out = n.create(&workload_pod(
        "hami-env",
        json!({"hami.io/limit-delivery": "env"}),
        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}),
        json!([]),
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    schedule_and_bind_as_hami(n, "hami-env", GPU_1, 2000, 20);
    wait_running(n, "hami-env");
    // No file, no mount: the limits are the entrypoint's environment only (HAMi's old way).
    let (code, _, _) = n.exec("hami-env", &["test", "-e", "/overrideEnv"]);
    assert_ne!(code, 0, "/overrideEnv exists in an env-delivery pod");
    let p = n.get("pod", Some(TENANT), "hami-env");
    assert!(
        !p["spec"].to_string().contains("overrideEnv"),
        "an env-delivery pod got a limits mount: {}",
        p["spec"]
    );
    let entry = vars(&n.exec_ok("hami-env", &["cat", "/tmp/entry-env"]));
    assert_eq!(var(&entry, "CUDA_DEVICE_MEMORY_LIMIT_0"), Some("2000m"));
    assert!(!limits_file(n, &pod_uid(n, "hami-env")).exists());
    delete_pod(n, "hami-env");
}

/// A HAMi pod that mounts its own volume where `Allocate` mounts the limits file or the preload
/// list. On this node the pod's mount at the same path is applied after the device plugin's (a
/// folder at /overrideEnv made runc fail: "not a directory"; a file would have replaced the
/// limits), so the webhook refuses such pods, with its message as kubectl prints it.
fn own_mount_at_override_env(n: &mut Node) {
    n.ok(
        &[
            "create",
            "configmap",
            "mine",
            "-n",
            TENANT,
            "--from-literal=f=CUDA_DEVICE_MEMORY_LIMIT_0=100g",
        ],
        None,
    );
    for (volume, mount, path) in [
        (
            json!({"name": "mine", "emptyDir": {}}),
            json!({"name": "mine", "mountPath": "/overrideEnv"}),
            "/overrideEnv",
        ),
        (
            json!({"name": "mine", "configMap": {"name": "mine"}}),
            json!({"name": "mine", "mountPath": "/overrideEnv", "subPath": "f"}),
            "/overrideEnv",
        ),
        (
            json!({"name": "mine", "configMap": {"name": "mine"}}),
            json!({"name": "mine", "mountPath": "/etc/ld.so.preload", "subPath": "f"}),
            "/etc/ld.so.preload",
        ),
    ] {
        let mut p = hami_pod("own-mount", 1300, 13);
        p["spec"]["volumes"] = json!([volume]);
        p["spec"]["containers"][0]["volumeMounts"] = json!([mount]);
        let out = n.create(&p);
        let err = text(&out.stderr);
        assert!(
            !out.status.success(),
            "a HAMi pod with its own mount at {path} was admitted"
        );
        assert!(
            err.contains(r#"admission webhook "mutate.hami-limits.hami.io" denied the request"#)
                && err.contains(&format!("({path}), where the device plugin mounts")),
            "refusal of a mount at {path}: {err}"
        );
    }
    n.ok(&["delete", "configmap", "mine", "-n", TENANT], None);
}

/// The device plugin's `DEVICE_LIST_STRATEGY`, as the DaemonSet has it.
fn device_list_strategy(n: &Node) -> Option<String> {
    let d = n.try_get("daemonset", NS, &format!("{PREFIX}-device-plugin"))?;
    d["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "device-plugin")?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == "DEVICE_LIST_STRATEGY")?["value"]
        .as_str()
        .map(str::to_owned)
}

/// Sets the device plugin's `DEVICE_LIST_STRATEGY` (what `helm upgrade --set
/// devicePlugin.deviceListStrategy=…` renders), waits for the rolled-out plugin to register and
/// the node to offer every share again.
fn set_device_list_strategy(n: &Node, value: &str) {
    assert!(
        try_set_device_list_strategy(n, value),
        "the plugin with DEVICE_LIST_STRATEGY={value} did not register with 20 shares allocatable in 120 s"
    );
}

/// [`set_device_list_strategy`] without panicking (for a drop guard): whether it took.
fn try_set_device_list_strategy(n: &Node, value: &str) -> bool {
    let ds = format!("daemonset/{PREFIX}-device-plugin");
    let old = plugin_pods(n);
    let set = n.kubectl(
        &[
            "set",
            "env",
            &ds,
            "-n",
            NS,
            &format!("DEVICE_LIST_STRATEGY={value}"),
        ],
        None,
    );
    let rolled = n.kubectl(
        &["rollout", "status", &ds, "-n", NS, "--timeout=180s"],
        None,
    );
    if !set.status.success() || !rolled.status.success() {
        eprintln!(
            "DEVICE_LIST_STRATEGY={value}: {}{}",
            text(&set.stderr),
            text(&rolled.stderr)
        );
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let pods = plugin_pods(n);
        if let [new] = pods.as_slice() {
            let log = n.kubectl(&["logs", "-n", NS, new, "-c", "device-plugin"], None);
            if !old.contains(new)
                && text(&log.stdout).contains("registered with kubelet")
                && n.try_get("node", "default", NODE)
                    .is_some_and(|node| node["status"]["allocatable"]["nvidia.com/gpu"] == "20")
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    false
}

/// The names of the device plugin's pods (none when they cannot be listed).
fn plugin_pods(n: &Node) -> Vec<String> {
    let out = n.kubectl(
        &[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/component=device-plugin",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    );
    text(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Puts the chart's `DEVICE_LIST_STRATEGY` back and removes the case's pods however it ends.
struct RestoreStrategy<'a> {
    n: &'a Node,
    was: String,
    pods: [&'static str; 3],
}

impl Drop for RestoreStrategy<'_> {
    fn drop(&mut self) {
        for pod in self.pods {
            let _ = self.n.kubectl(
                &[
                    "delete",
                    "pod",
                    pod,
                    "-n",
                    TENANT,
                    "--ignore-not-found",
                    "--wait=true",
                    "--grace-period=0",
                    "--force",
                ],
                None,
            );
        }
        if device_list_strategy(self.n).as_deref() != Some(self.was.as_str())
            && !try_set_device_list_strategy(self.n, &self.was)
        {
            eprintln!("could not put DEVICE_LIST_STRATEGY={} back", self.was);
        }
    }
}

/// What kubelet stored, and hands the runtime at every container start, for one pod's GPU
/// container: the `ContainerAllocateResponse` in its device manager checkpoint
/// (`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`, `AllocResp`: the protobuf
/// bytes, base64 in the JSON).
fn kubelet_allocation(pod_uid: &str) -> v1beta1::ContainerAllocateResponse {
    use base64::Engine as _;
    use prost::Message as _;
    let body =
        std::fs::read_to_string("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
            .unwrap();
    let checkpoint: Value = serde_json::from_str(&body).unwrap();
    let entry = checkpoint["Data"]["PodDeviceEntries"]
        .as_array()
        .and_then(|entries| {
            entries
                .iter()
                .find(|e| e["PodUID"] == pod_uid && e["ResourceName"] == "nvidia.com/gpu")
        })
        .unwrap_or_else(|| panic!("no nvidia.com/gpu entry for pod {pod_uid} in {body}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(entry["AllocResp"].as_str().unwrap())
        .unwrap();
    v1beta1::ContainerAllocateResponse::decode(bytes.as_slice()).unwrap()
}

/// HAMi's `volume-mounts`, `cdi-cri` and `cdi-annotations` device lists under the real kubelet
/// (switched on the running DaemonSet, then put back). On containerd 2 the runtime injects the
/// node's CDI spec (cdi.rs) and the container shows it; on containerd 1.6 (HAMI_CONTAINERD=debian),
/// which has no CDI, kubelet's checkpoint shows what the runtime was handed.
fn device_list_strategies(n: &mut Node) {
    let was = device_list_strategy(n).unwrap_or_else(|| "envvar".to_owned());
    assert_eq!(was, "envvar", "the chart's default");
    let restore = RestoreStrategy {
        n,
        was,
        pods: ["list-mounts", "list-cdi", "list-cdi-annotations"],
    };
    let n = restore.n;
    let containerd2 = cdi::containerd2(n);
    let spec = cdi::write_spec(n);

    // volume-mounts: the container sees the folder in NVIDIA_VISIBLE_DEVICES and one entry per
    // GPU in it (what the NVIDIA runtime reads with
    // accept-nvidia-visible-devices-as-volume-mounts), and is capped as before.
    set_device_list_strategy(n, "volume-mounts");
    assert!(
        n.create(&hami_pod("list-mounts", 2000, 20))
            .status
            .success()
    );
    schedule_and_bind_as_hami(n, "list-mounts", GPU_1, 2000, 20);
    wait_running(n, "list-mounts");
    let root = "/var/run/nvidia-container-devices";
    let entry = vars(&n.exec_ok("list-mounts", &["cat", "/tmp/entry-env"]));
    assert_eq!(var(&entry, "NVIDIA_VISIBLE_DEVICES"), Some(root));
    let listed = n.exec_ok("list-mounts", &["ls", root]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), [GPU_1]);
    n.exec_ok("list-mounts", &["test", "-c", &format!("{root}/{GPU_1}")]);
    assert_capped_inside(
        n,
        "list-mounts",
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "2000m"),
            ("CUDA_DEVICE_SM_LIMIT", "20"),
        ],
    );
    delete_pod(n, "list-mounts");

    // cdi-cri: kubelet is given the CDI device `nvidia.com/gpu=<uuid>` (its checkpoint holds the
    // answer it passes in the CRI request's CDIDevices) and no device list variable. containerd 2
    // injects the spec's edits for that GPU; Debian 12's containerd 1.6.20 predates CRI CDI
    // devices and drops them: the container starts, capped, without a GPU list.
    set_device_list_strategy(n, "cdi-cri");
    assert!(n.create(&hami_pod("list-cdi", 2500, 25)).status.success());
    schedule_and_bind_as_hami(n, "list-cdi", GPU_0, 2500, 25);
    wait_running(n, "list-cdi");
    let uid = pod_uid(n, "list-cdi");
    let stored = kubelet_allocation(&uid);
    let cdi: Vec<&str> = stored.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(cdi, [format!("nvidia.com/gpu={GPU_0}")]);
    assert!(
        !stored.envs.contains_key("NVIDIA_VISIBLE_DEVICES"),
        "{:?}",
        stored.envs
    );
    assert_eq!(
        stored
            .envs
            .get("CUDA_DEVICE_MEMORY_LIMIT_0")
            .map(String::as_str),
        Some("2500m")
    );
    if containerd2 {
        cdi::assert_injected(n, "list-cdi", 0);
    } else {
        let entry = vars(&n.exec_ok("list-cdi", &["cat", "/tmp/entry-env"]));
        assert_eq!(var(&entry, "NVIDIA_VISIBLE_DEVICES"), None);
        assert_eq!(var(&entry, &cdi::device_var(0)), None);
    }
    assert_capped_inside(n, "list-cdi", &[("CUDA_DEVICE_MEMORY_LIMIT_0", "2500m")]);
    delete_pod(n, "list-cdi");

    // cdi-annotations: the answer carries the container annotation
    // `cdi.k8s.io/nvidia-device-plugin_<pod uid>` = `nvidia.com/gpu=<uuid>`, which kubelet passes
    // in the CRI request's annotations and containerd 2 resolves against the same spec.
    set_device_list_strategy(n, "cdi-annotations");
    assert!(
        n.create(&hami_pod("list-cdi-annotations", 2200, 22))
            .status
            .success()
    );
    schedule_and_bind_as_hami(n, "list-cdi-annotations", GPU_1, 2200, 22);
    wait_running(n, "list-cdi-annotations");
    let uid = pod_uid(n, "list-cdi-annotations");
    let stored = kubelet_allocation(&uid);
    let annotations: Vec<(&str, &str)> = stored
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with("cdi.k8s.io/"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        annotations,
        [(
            format!("cdi.k8s.io/nvidia-device-plugin_{uid}").as_str(),
            format!("nvidia.com/gpu={GPU_1}").as_str()
        )]
    );
    assert!(stored.cdi_devices.is_empty(), "{:?}", stored.cdi_devices);
    if containerd2 {
        cdi::assert_injected(n, "list-cdi-annotations", 1);
    }
    assert_capped_inside(
        n,
        "list-cdi-annotations",
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "2200m")],
    );
    delete_pod(n, "list-cdi-annotations");
    let seen = if containerd2 {
        format!(
            "containerd 2 injected {}'s edits in the container (env, device nodes, driver mount)",
            spec.display()
        )
    } else {
        "kubelet holds them; containerd 1.6 has no CDI".to_owned()
    };
    println!(
        "  volume-mounts: {root}/{GPU_1} in the container; cdi-cri {cdi:?} and cdi-annotations: {seen}"
    );
    drop(restore);
    assert_eq!(device_list_strategy(n).as_deref(), Some("envvar"));
}

fn kubelet_restart(n: &mut Node) {
    let sock = Path::new("/var/lib/kubelet/device-plugins/nvidia-gpu.sock");
    assert!(
        sock.exists(),
        "{} missing before the restart",
        sock.display()
    );
    let before = plugin_registrations(n);
    let start = Instant::now();
    n.script(&["kubelet-restart"]);
    // kubelet removes every socket in its device-plugin folder when it starts: the plugin must
    // notice, serve its socket again and register again (its log says so once more).
    wait_for(
        "the plugin to register again after the kubelet restart",
        Duration::from_secs(60),
        || plugin_registrations(n) > before && sock.exists(),
    );
    let socket_back = start.elapsed();
    wait_for(
        "nvidia.com/gpu capacity 20 after the kubelet restart",
        Duration::from_secs(90),
        || {
            n.get("node", None, NODE)["status"]["allocatable"]["nvidia.com/gpu"] == "20"
                && n.get("node", None, NODE)["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
        },
    );
    println!(
        "  kubelet restarted: the plugin registered again after {:.1} s, capacity back and node Ready after {:.1} s",
        socket_back.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    // A new pod allocates through the re-registered plugin (the webhook's pods on this node may
    // still be getting Ready again after the restart: failurePolicy Fail refuses until then).
    wait_for(
        "the webhook to admit a GPU pod after the kubelet restart",
        Duration::from_secs(60),
        || {
            let out = n.create(&hami_pod("after-kubelet", 1000, 10));
            if !out.status.success() {
                eprintln!("  not yet: {}", text(&out.stderr).trim());
            }
            out.status.success()
        },
    );
    schedule_and_bind_as_hami(n, "after-kubelet", GPU_0, 1000, 10);
    wait_running(n, "after-kubelet");
    assert_capped_inside(
        n,
        "after-kubelet",
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "1000m")],
    );
    delete_pod(n, "after-kubelet");
}

/// containerd stopped and started again while a capped pod runs (an upgrade of the runtime, or
/// its crash and restart by the init system): the container is not restarted, its limits file on
/// the host and every mount in it stay as they were, containerd serves it again (exec), the node
/// stays Ready and a new pod allocates.
fn containerd_restart(n: &mut Node) {
    assert!(n.create(&hami_pod("cd-restart", 1600, 16)).status.success());
    schedule_and_bind_as_hami(n, "cd-restart", GPU_1, 1600, 16);
    wait_running(n, "cd-restart");
    let uid = pod_uid(n, "cd-restart");
    let file = limits_file(n, &uid);
    let body = assert_whole_limits_file(&file);
    let status = |n: &Node| {
        let p = n.get("pod", Some(TENANT), "cd-restart");
        (
            p["status"]["containerStatuses"][0]["containerID"].clone(),
            p["status"]["containerStatuses"][0]["restartCount"].clone(),
        )
    };
    let before = status(n);
    let mounts = n.exec_ok("cd-restart", &["cat", "/proc/self/mountinfo"]);
    for path in ["/overrideEnv", "/etc/ld.so.preload"] {
        assert!(
            mounts.lines().any(|l| l.split(' ').nth(4) == Some(path)),
            "{path} is not a mount in the container:
{mounts}"
        );
    }
    // The runtime's mount order, for the record (containerd 1.6 and 2 are compared in
    // docs/development.md): the mount points after the root's, less /proc, /sys and /dev.
    let order: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| !["/proc", "/sys", "/dev"].iter().any(|s| p.starts_with(s)) && *p != "/")
        .collect();
    println!("  mounts in the container, in order: {}", order.join(" "));
    let start = Instant::now();
    n.script(&["containerd-restart"]);
    let back = start.elapsed();
    // containerd answers kubelet again and the container is reached through its shim.
    wait_for(
        "an exec into the pod through the restarted containerd",
        Duration::from_secs(60),
        || n.exec("cd-restart", &["true"]).0 == 0,
    );
    assert_eq!(
        n.exec_ok("cd-restart", &["cat", "/proc/self/mountinfo"]),
        mounts,
        "the container's mounts changed over the containerd restart"
    );
    assert_eq!(
        assert_whole_limits_file(&file),
        body,
        "the limits file changed"
    );
    assert_capped_inside(n, "cd-restart", &[("CUDA_DEVICE_MEMORY_LIMIT_0", "1600m")]);
    wait_for(
        "the node Ready after the containerd restart",
        Duration::from_secs(90),
        || {
            n.get("node", None, NODE)["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        },
    );
    assert_eq!(status(n), before, "the container was restarted or replaced");
    println!(
        "  containerd restarted in {:.1} s: the running container kept its id, mounts and file",
        back.as_secs_f64()
    );
    assert!(
        n.create(&hami_pod("after-containerd", 1300, 13))
            .status
            .success()
    );
    schedule_and_bind_as_hami(n, "after-containerd", GPU_0, 1300, 13);
    wait_running(n, "after-containerd");
    assert_capped_inside(
        n,
        "after-containerd",
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "1300m")],
    );
    delete_pod(n, "after-containerd");
    delete_pod(n, "cd-restart");
}

/// How often the running device plugin container logged its registration with kubelet.
fn plugin_registrations(n: &Node) -> usize {
    let out = n.kubectl(
        &[
            "logs",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/component=device-plugin",
            "-c",
            "device-plugin",
            "--tail=-1",
        ],
        None,
    );
    text(&out.stdout)
        .lines()
        .filter(|l| l.contains("registered with kubelet"))
        .count()
}

/// A pod whose allocation met a fault: it runs capped, or it does not run. Never uncapped. A limits
/// file, if there is one, is whole. Returns whether it ran.
fn capped_or_not_running(n: &Node, name: &str, want: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(90);
    let ran = loop {
        if running(n, name) {
            break true;
        }
        let p = n.try_get("pod", TENANT, name).unwrap_or(Value::Null);
        let failed = p["status"]["phase"] == "Failed"
            || p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("Error") || r.contains("BackOff"));
        if failed || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    if let Some(uid) = n
        .try_get("pod", TENANT, name)
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
    {
        let file = limits_file(n, &uid);
        if file.exists() {
            assert_whole_limits_file(&file);
        }
    }
    if ran {
        assert_capped_inside(n, name, &[("CUDA_DEVICE_MEMORY_LIMIT_0", want)]);
    } else {
        // Not running: no process of it exists to be uncapped.
        let (code, _, _) = n.exec(name, &["true"]);
        assert_ne!(code, 0, "{name} is not Running but a process runs in it");
        println!(
            "  {name} did not start: {}",
            n.try_get("pod", TENANT, name)
                .map(|p| p["status"].to_string())
                .unwrap_or_default()
        );
    }
    ran
}

fn device_plugin_deleted_mid_allocation(n: &mut Node) {
    assert!(n.create(&hami_pod("dp-fault", 1500, 15)).status.success());
    schedule_and_bind_as_hami(n, "dp-fault", GPU_1, 1500, 15);
    n.ok(
        &[
            "delete",
            "pod",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/component=device-plugin",
            "--wait=false",
        ],
        None,
    );
    let ran = capped_or_not_running(n, "dp-fault", "1500m");
    println!("  device plugin deleted mid-allocation: the pod ran capped: {ran}");
    // The DaemonSet brings the plugin back; it registers and new pods allocate.
    wait_for(
        "the device plugin DaemonSet Ready again",
        Duration::from_secs(120),
        || {
            let d = n.get("daemonset", Some(NS), &format!("{PREFIX}-device-plugin"));
            d["status"]["numberReady"] == 1 && d["status"]["updatedNumberScheduled"] == 1
        },
    );
    delete_pod(n, "dp-fault");
    assert!(n.create(&hami_pod("after-dp", 1200, 12)).status.success());
    schedule_and_bind_as_hami(n, "after-dp", GPU_1, 1200, 12);
    wait_running(n, "after-dp");
    assert_capped_inside(n, "after-dp", &[("CUDA_DEVICE_MEMORY_LIMIT_0", "1200m")]);
    delete_pod(n, "after-dp");
}

fn apiserver_restart_mid_allocation(n: &mut Node) {
    assert!(n.create(&hami_pod("api-fault", 1700, 17)).status.success());
    schedule_and_bind_as_hami(n, "api-fault", GPU_0, 1700, 17);
    let start = Instant::now();
    n.script(&["apiserver-restart"]);
    println!(
        "  API server restarted in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let ran = capped_or_not_running(n, "api-fault", "1700m");
    println!("  API server restarted mid-allocation: the pod ran capped: {ran}");
    delete_pod(n, "api-fault");
}

fn webhook_scaled_to_zero(n: &mut Node) {
    let deploy = format!("deployment/{PREFIX}-webhook");
    n.ok(&["scale", "-n", NS, &deploy, "--replicas=0"], None);
    wait_for("no webhook endpoint", Duration::from_secs(60), || {
        n.ok(&["get", "pods", "-n", NS, "-o", "name"], None)
            .lines()
            .all(|l| !l.contains("-webhook-"))
    });
    // failurePolicy Fail (the chart's default): a GPU pod is refused, a plain pod admitted.
    let out = n.create(&hami_pod("no-webhook", 1000, 10));
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a HAMi pod was admitted with no webhook"
    );
    assert!(
        err.contains("failed calling webhook"),
        "refusal without the webhook: {err}"
    );
    let plain = workload_pod("plain", json!({}), json!({}), json!([]));
    let out = n.create(&plain);
    assert!(
        out.status.success(),
        "plain pod refused: {}",
        text(&out.stderr)
    );
    n.ok(&["scale", "-n", NS, &deploy, "--replicas=2"], None);
    n.ok(
        &["rollout", "status", "-n", NS, &deploy, "--timeout=120s"],
        None,
    );
    // Back: GPU pods are admitted (and mutated) again.
    wait_for(
        "the webhook to answer again",
        Duration::from_secs(60),
        || {
            n.create(&hami_pod("webhook-back", 1000, 10))
                .status
                .success()
        },
    );
    let p = n.get("pod", Some(TENANT), "webhook-back");
    assert_eq!(p["spec"]["schedulerName"], "hami-scheduler");
    delete_pod(n, "webhook-back");
    delete_pod(n, "plain");
}

fn node_reboot(n: &mut Node) {
    // A pod running before the reboot: its file is on the node's disk (the hook folder) and is
    // there, whole and unchanged, when the node comes back.
    assert!(n.create(&hami_pod("survivor", 2500, 25)).status.success());
    schedule_and_bind_as_hami(n, "survivor", GPU_0, 2500, 25);
    wait_running(n, "survivor");
    let uid = pod_uid(n, "survivor");
    let file = limits_file(n, &uid);
    let before = assert_whole_limits_file(&file);
    // The plugin's container runs again (restarted by kubelet after the reboot), registered.
    let plugin_restarts = |n: &Node| -> u64 {
        let pods: Value = serde_json::from_str(&n.ok(
            &[
                "get",
                "pods",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/component=device-plugin",
                "-o",
                "json",
            ],
            None,
        ))
        .unwrap();
        pods["items"][0]["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(0)
    };
    let restarts = plugin_restarts(n);
    let start = Instant::now();
    n.script(&["node-reboot"]);
    assert_eq!(
        assert_whole_limits_file(&file),
        before,
        "the running pod's file changed over the reboot"
    );
    wait_for(
        "the node Ready after the reboot",
        Duration::from_secs(120),
        || {
            n.get("node", None, NODE)["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        },
    );
    wait_for(
        "the device plugin running and registered again after the reboot",
        Duration::from_secs(180),
        || {
            let d = n.get("daemonset", Some(NS), &format!("{PREFIX}-device-plugin"));
            plugin_restarts(n) > restarts
                && d["status"]["numberReady"] == 1
                && plugin_registrations(n) >= 1
                && n.gpu_capacity() == "20"
        },
    );
    println!(
        "  node rebooted: node Ready and the plugin registered in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    // The pod that ran before: kubelet admits it again when it starts, before the plugin has
    // registered, and (real kubelet v1.34) rejects a pod that needs a device-plugin resource then:
    // UnexpectedAdmissionError, phase Failed, nothing of it runs. Or it runs again, capped. Never
    // uncapped.
    let mut outcome = String::new();
    wait_for(
        "the survivor to run again or be rejected by kubelet",
        Duration::from_secs(120),
        || {
            let p = n.try_get("pod", TENANT, "survivor").unwrap_or(Value::Null);
            if p["status"]["phase"] == "Failed" {
                outcome = format!("rejected: {}", p["status"]["reason"]);
                return true;
            }
            if running(n, "survivor")
                && p["status"]["containerStatuses"][0]["restartCount"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 1
            {
                outcome = "running again".into();
                return true;
            }
            false
        },
    );
    println!("  the pod that ran before the reboot: {outcome}");
    if outcome == "running again" {
        assert_capped_inside(n, "survivor", &[("CUDA_DEVICE_MEMORY_LIMIT_0", "2500m")]);
    } else {
        let (code, _, _) = n.exec("survivor", &["true"]);
        assert_ne!(code, 0, "the rejected pod runs a process");
    }
    // A new pod allocates after the reboot.
    assert!(
        n.create(&hami_pod("after-reboot", 1100, 11))
            .status
            .success()
    );
    schedule_and_bind_as_hami(n, "after-reboot", GPU_1, 1100, 11);
    wait_running(n, "after-reboot");
    assert_capped_inside(
        n,
        "after-reboot",
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "1100m")],
    );
}

// ---------------------------------------------------------------------------------------------

/// What `scripts/cluster down` must leave: no process of the cluster, no mount under its folder,
/// no bridge, no KUBE-* chain, no /var/lib/kubelet (none existed before the node).
fn leftovers(dir: &Path, kubelet_dir_before: bool) -> Vec<String> {
    let mut left = Vec::new();
    let d = dir.display().to_string();
    if dir.exists() {
        left.push(format!("{d} exists"));
    }
    let ps = Command::new("ps")
        .args(["-eo", "pid,stat,args"])
        .output()
        .unwrap();
    for line in text(&ps.stdout).lines() {
        let stat = line.split_whitespace().nth(1).unwrap_or("");
        if line.contains(&d) && !stat.starts_with('Z') && !line.contains("ps -eo") {
            left.push(format!("process: {line}"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for m in mounts.lines().filter(|l| l.contains(&d)) {
        left.push(format!("mount: {m}"));
    }
    if Path::new("/sys/class/net/hamicni0").exists() {
        left.push("bridge hamicni0".into());
    }
    let rules = Command::new("iptables-save")
        .output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default();
    if rules.contains("KUBE-") {
        left.push("KUBE-* iptables chains".into());
    }
    if !kubelet_dir_before && Path::new("/var/lib/kubelet").exists() {
        left.push("/var/lib/kubelet".into());
    }
    left
}

const CASES: &[Case<Node>] = &[
    (
        "helm install with running pods: certgen Jobs, caBundle, webhook endpoints, plugin registered, hook folders",
        chart_pods_run,
    ),
    (
        "HAMi pod: scheduled as HAMi v2.10, Allocate by the real kubelet, capped inside, files collected",
        hami_pod_end_to_end,
    ),
    (
        "the README quick start: example pod and script, capped env-less process",
        readme_quick_start,
    ),
    ("KAI gpu-memory pod capped inside", kai_gpu_memory_pod),
    ("KAI gpu-fraction pod capped inside", kai_gpu_fraction_pod),
    (
        "beside KAI v0.17's admission and binder: every shape, both orders, hamicore off and on, capped in every process",
        peers::kai_pods_beside_kai_admission_and_binder,
    ),
    (
        "KAI gpu-fraction pod sized to the card it sees on the node (admission basis 80 GiB, node file 141 GiB)",
        kai_gpu_fraction_sized_on_the_node,
    ),
    (
        "hami.io/limit-delivery: env: no file, no mount",
        env_delivery_pod,
    ),
    (
        "a HAMi pod's own mount at /overrideEnv or /etc/ld.so.preload: refused by the webhook",
        own_mount_at_override_env,
    ),
    (
        "hostile tenant: a tenant identity with namespaced pod rights only",
        hostile::tenant_identity,
    ),
    (
        "hostile tenant: Pod Security baseline refuses a hostPath and a privileged pod",
        hostile::pod_security_baseline,
    ),
    (
        "hostile tenant: the pod label hami.io/webhook=ignore skips no check",
        hostile::label_does_not_skip_admission,
    ),
    (
        "hostile tenant: HAMi-core variables, CUDA_DISABLE_CONTROL, policy, priority, privilege from the spec: refused",
        hostile::hami_core_variables_from_the_spec,
    ),
    (
        "hostile tenant: KAI own limit refused, KAI opt-outs by pod ignored (capped)",
        hostile::kai_routes,
    ),
    (
        "hostile tenant: scheduler annotations on CREATE stripped, on UPDATE refused; limits.hami.io frozen",
        hostile::scheduler_annotations,
    ),
    (
        "hostile tenant: admitted without the webhook, own /overrideEnv mount: refused at Allocate",
        hostile::admitted_without_the_webhook,
    ),
    (
        "hostile tenant: a non-root user cannot replace usage.cache with a link",
        hostile::container_folder_links,
    ),
    (
        "is the cap in force: HAMi and KAI regions written in the containers, verdicts on the node's metrics, the Event",
        regions::verdicts_on_the_node,
    ),
    (
        "hostile tenant: a 60,000-value node affinity is refused, naming the limit",
        hostile::affinity_cost,
    ),
    (
        "sessions: a namespace where the spec may set HAMi-core's variables",
        sessions::allowed_namespace,
    ),
    (
        "sessions in a HAMi pod: ssh, sudo -i, sudo -u, cron of a non-root user, login -f, su -, exec, bash -c, setsid, nohup",
        sessions::sessions_in_a_hami_pod,
    ),
    (
        "sessions in a KAI pod: ssh, sudo -i, sudo -u, cron of a non-root user, login -f, su -, exec, bash -c, setsid, nohup",
        sessions::sessions_in_a_kai_pod,
    ),
    (
        "README quick start: examples/node-ssh-demo.sh, an SSH login into a HAMi pod",
        sessions::readme_ssh_demo,
    ),
    (
        "device list strategies under the real kubelet: volume-mounts, cdi-cri and cdi-annotations in the container",
        device_list_strategies,
    ),
    (
        "kubelet restarted: the plugin registers again",
        kubelet_restart,
    ),
    (
        "containerd restarted while a pod runs: it keeps its file and mounts",
        containerd_restart,
    ),
    (
        "device plugin pod deleted mid-allocation: capped or not running",
        device_plugin_deleted_mid_allocation,
    ),
    (
        "API server restarted mid-allocation: capped or not running",
        apiserver_restart_mid_allocation,
    ),
    (
        "webhook scaled to 0: failurePolicy Fail refuses GPU pods",
        webhook_scaled_to_zero,
    ),
    (
        "node rebooted: running pods keep their files, new pods allocate",
        node_reboot,
    ),
];

fn main() -> ExitCode {
    if listed(CASES) {
        return ExitCode::SUCCESS;
    }
    if ignored_unless_asked("real_node", CASES, NEEDS) {
        return ExitCode::SUCCESS;
    }
    let dir = std::env::temp_dir().join(format!("hami-real-node-{}", std::process::id()));
    hami_tests::real::stop_on_signal("real_node", repo().join("scripts/cluster"), dir.clone());
    let values = std::env::temp_dir().join(format!("hami-real-node-{}.json", std::process::id()));
    // The collector at test speed (interval 2 s, grace 1 s); everything else as scripts/cluster
    // installs it for people.
    std::fs::write(
        &values,
        json!({"devicePlugin": {"collector": {"intervalSeconds": 2, "graceSeconds": 1}},
               "webhook": {"tenancy": {"allowHamiCoreEnvNamespaces": [sessions::ALLOWED_NS]}}})
        .to_string(),
    )
    .unwrap();
    let kubelet_dir_before = Path::new("/var/lib/kubelet").exists();
    let started = Instant::now();
    let mut node = match Node::up(dir.clone(), &values) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("real_node: {e}");
            let _ = Command::new(repo().join("scripts/cluster"))
                .arg("down")
                .env("HAMI_CLUSTER_DIR", &dir)
                .status();
            let _ = std::fs::remove_file(&values);
            return ExitCode::FAILURE;
        }
    };
    println!(
        "real_node: control plane, node and chart up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (passed, failed) = run_cases("real_node", CASES, &mut node);
    if !failed.is_empty() {
        for log in ["kubelet", "containerd"] {
            let body =
                std::fs::read_to_string(dir.join(format!("logs/{log}.log"))).unwrap_or_default();
            eprintln!("--- {log} log (last lines) ---");
            let tail: Vec<&str> = body.lines().rev().take(20).collect();
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        let out = node.kubectl(&["get", "pods", "-A", "-o", "wide"], None);
        eprintln!("--- pods ---\n{}", text(&out.stdout));
        let out = node.kubectl(
            &[
                "logs",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/component=device-plugin",
                "--tail=30",
            ],
            None,
        );
        eprintln!("--- device plugin log ---\n{}", text(&out.stdout));
    }
    let clean = node.down();
    let _ = std::fs::remove_file(&values);
    let left = leftovers(&dir, kubelet_dir_before);
    for l in &left {
        eprintln!("real_node: left after down: {l}");
    }
    println!(
        "real_node: {passed} passed, {} failed, {} not run, in {:.1} s; down: {clean}, left: {}",
        failed.len(),
        CASES.len() - passed - failed.len(),
        started.elapsed().as_secs_f64(),
        left.len()
    );
    if failed.is_empty() && passed == CASES.len() && clean && left.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &failed {
            eprintln!("FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}

//! The `hami-device-plugin` binary: `inventory` output, configuration errors and exit codes,
//! SIGTERM cleanup of the socket, `--log-format json`, `--metrics-listen` errors, `serve-preload`'s
//! refusals at start.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hami-device-plugin");

const INVENTORY: &str = "
- uuid: GPU-11111111-aaaa-4000-8000-000000000001
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 0
- uuid: GPU-22222222-bbbb-4000-8000-000000000002
  index: 1
  name: Tesla P4
  memoryMib: 7680
";

/// The binary with a clean environment (no flag picked up from the caller's env).
fn plugin() -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars() {
        if key.starts_with("HAMI_")
            || key == "NODE_NAME"
            || key == "HOOK_PATH"
            || key == "KUBECONFIG"
        {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_LOG", "info");
    // Never the fixed default port: tests run in parallel.
    cmd.env("HAMI_METRICS_LISTEN", "127.0.0.1:0");
    cmd
}

fn inventory_file(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("inventory.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn inventory_json_lists_gpus_devices_and_the_node_annotation() {
    let dir = tempfile::tempdir().unwrap();
    let out = plugin()
        .args(["inventory", "--json", "--inventory"])
        .arg(inventory_file(dir.path(), INVENTORY))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["backend"], "file");
    assert_eq!(report["resourceName"], "nvidia.com/gpu");
    assert_eq!(report["socket"], "nvidia-gpu.sock");
    assert_eq!(report["splitCount"], 10);
    assert_eq!(report["gpus"][0]["memoryMib"], 143_771);
    // The minor number of /dev/nvidiaN, by default the index.
    assert_eq!(report["gpus"][0]["minor"], 0);
    assert_eq!(report["gpus"][1]["minor"], 1);
    let devices = report["kubeletDevices"].as_array().unwrap();
    assert_eq!(devices.len(), 20);
    assert_eq!(
        devices[0]["id"],
        "GPU-11111111-aaaa-4000-8000-000000000001-0"
    );
    assert_eq!(
        devices[19]["id"],
        "GPU-22222222-bbbb-4000-8000-000000000002-9"
    );
    assert_eq!(report["nodeAnnotationKey"], "hami.io/node-nvidia-register");
    // Go omitempty: index 0 and NUMA node 0 are left out, as HAMi's plugin writes them.
    assert_eq!(
        report["nodeAnnotation"],
        concat!(
            r#"[{"id":"GPU-11111111-aaaa-4000-8000-000000000001","count":10,"devmem":143771,"devcore":100,"type":"NVIDIA H200","mode":"hami-core","health":true},"#,
            r#"{"id":"GPU-22222222-bbbb-4000-8000-000000000002","index":1,"count":10,"devmem":7680,"devcore":100,"type":"NVIDIA-Tesla P4","mode":"hami-core","health":true}]"#
        )
    );
}

#[test]
fn inventory_text_and_the_numa_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = plugin()
        .args(["inventory", "--enable-numa-topology", "--inventory"])
        .arg(inventory_file(dir.path(), INVENTORY))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("backend: file\nGPU 0 GPU-11111111-aaaa-4000-8000-000000000001 NVIDIA H200 143771 MiB numa=0"), "{text}");
    assert!(
        text.contains("resource nvidia.com/gpu on nvidia-gpu.sock: 20 devices (10 per GPU)"),
        "{text}"
    );
}

#[test]
fn a_bad_inventory_file_is_named_with_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = inventory_file(dir.path(), "- uuid: GPU-a\n  name: x\n  memory: 5\n");
    let out = plugin()
        .args(["inventory", "--inventory"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&format!("inventory file {}", path.display())) && err.contains("memory"),
        "{err}"
    );

    let out = plugin()
        .args(["inventory", "--inventory"])
        .arg(dir.path().join("missing.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.yaml"));
}

#[test]
fn without_nvml_the_error_says_what_to_do() {
    if hami_device_plugin::gpu::nvml::NvmlInventory::init().is_ok() {
        // A GPU machine: NVML works, the plain command must too.
        let out = plugin().args(["inventory", "--json"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let out = plugin().arg("inventory").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("NVML is not available") && err.contains("--inventory FILE"),
        "{err}"
    );
}

#[test]
fn run_needs_a_node_name_and_sane_durations() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let out = plugin()
        .args(["run", "--skip-node-register", "--inventory"])
        .arg(&inventory)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("set HAMI_NODE_NAME"));

    let out = plugin()
        .args([
            "run",
            "--skip-node-register",
            "--register-interval",
            "0",
            "--inventory",
        ])
        .arg(&inventory)
        .env("HAMI_NODE_NAME", "node-a")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--register-interval=0 is not a positive number of seconds")
    );
}

#[test]
fn sigterm_removes_the_socket_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let kubelet_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let mut child = plugin()
        .args(["run", "--skip-node-register", "--inventory"])
        .arg(&inventory)
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .env("NODE_NAME", "node-a")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let socket = kubelet_dir.join("nvidia-gpu.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the plugin never created {}",
            socket.display()
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the plugin exited early"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {log}", out.status);
    assert!(!socket.exists(), "socket left behind: {log}");
    assert!(log.contains("SIGTERM"), "{log}");
}

#[test]
fn configuration_errors_name_the_file_key_and_value_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let config = dir.path().join("device-config.yaml");
    std::fs::write(&config, "nvidia:\n  deviceMemoryScaling: -1\n").unwrap();
    let out = plugin()
        .args(["inventory", "--inventory"])
        .arg(&inventory)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("nvidia.deviceMemoryScaling")
            && err.contains("-1"),
        "{err}"
    );

    let node_config = dir.path().join("config.json");
    std::fs::write(
        &node_config,
        r#"{"nodeconfig":[{"name":"node-a","devicesplitcount":"ten"}]}"#,
    )
    .unwrap();
    let out = plugin()
        .args(["inventory", "--node-name", "node-a", "--inventory"])
        .arg(&inventory)
        .arg("--node-config")
        .arg(&node_config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("config.json") && err.contains("devicesplitcount") && err.contains("ten"),
        "{err}"
    );

    let out = plugin()
        .args(["inventory", "--inventory"])
        .arg(&inventory)
        .env("HAMI_NVIDIA__DEVICESPLITCOUNT", "x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HAMI_NVIDIA__DEVICESPLITCOUNT"));
}

#[test]
fn node_config_applies_to_the_named_node_only() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let node_config = dir.path().join("config.json");
    std::fs::write(
        &node_config,
        r#"{"nodeconfig":[{"name":"node-a","devicesplitcount":2,"filterdevices":{"uuid":["GPU-11111111-aaaa-4000-8000-000000000001"]}}]}"#,
    )
    .unwrap();
    let report = |node: &str| -> serde_json::Value {
        let out = plugin()
            .args(["inventory", "--json", "--node-name", node, "--inventory"])
            .arg(&inventory)
            .arg("--node-config")
            .arg(&node_config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let a = report("node-a");
    assert_eq!(a["kubeletDevices"].as_array().unwrap().len(), 2);
    assert_eq!(
        a["skipped"][0]["reason"],
        "excluded by filterdevices in the node config"
    );
    let b = report("node-b");
    assert_eq!(b["kubeletDevices"].as_array().unwrap().len(), 20);

    // Everything filtered out is an error, not an empty plugin.
    std::fs::write(
        &node_config,
        r#"{"nodeconfig":[{"name":"node-a","filterdevices":{"index":[0,1]}}]}"#,
    )
    .unwrap();
    let out = plugin()
        .args(["inventory", "--node-name", "node-a", "--inventory"])
        .arg(&inventory)
        .arg("--node-config")
        .arg(&node_config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no GPU to advertise: 2 found, all left out")
    );
}

/// Starts `run --skip-node-register` with `extra` args, awaits the socket, sends SIGTERM, and
/// returns (exit success, stderr).
fn run_until_socket_then_term(extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let kubelet_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let mut cmd = plugin();
    cmd.args(["run", "--skip-node-register", "--inventory"])
        .arg(&inventory)
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .args(extra)
        .env("NODE_NAME", "node-a")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let socket = kubelet_dir.join("nvidia-gpu.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "no socket");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the plugin exited early"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn log_format_json_writes_one_object_per_line() {
    for (extra, env) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("HAMI_LOG_FORMAT", "json")][..]),
    ] {
        let (ok, log) = run_until_socket_then_term(extra, env);
        assert!(ok, "{log}");
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!lines.is_empty());
        let mut messages = Vec::new();
        for line in &lines {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            assert!(v["level"].is_string(), "{line}");
            assert!(v["timestamp"].is_string(), "{line}");
            // hami_ops writes the event's fields at the top level.
            messages.push(v["message"].as_str().unwrap_or_default().to_owned());
        }
        assert!(
            messages.iter().any(|m| m == "shutting down"),
            "{messages:?}"
        );
        assert!(
            log.contains(r#""signal":"SIGTERM""#),
            "structured field kept: {log}"
        );
    }
}

#[test]
fn log_format_text_is_the_default_and_bad_values_are_refused() {
    let (ok, log) = run_until_socket_then_term(&["--metrics-listen", "off"], &[]);
    assert!(ok, "{log}");
    assert!(serde_json::from_str::<serde_json::Value>(log.lines().next().unwrap()).is_err());
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains("serving /healthz"), "metrics off: {log}");
    let out = plugin()
        .args(["--log-format", "yaml", "inventory", "--inventory", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("text") && err.contains("json"), "{err}");
}

#[test]
fn a_bad_metrics_address_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let out = plugin()
        .args(["run", "--skip-node-register", "--inventory"])
        .arg(&inventory)
        .args(["--metrics-listen", "nowhere"])
        .env("NODE_NAME", "node-a")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--metrics-listen=nowhere"), "{err}");
}

/// The old environment names (HAMi's `NODE_NAME`, `HOOK_PATH`) still work, with a deprecation
/// notice in the log; the `HAMI_` names work without one.
#[test]
fn old_environment_names_work_with_a_deprecation_notice() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    // `--register-interval 0` stops `run` right after the node name was taken.
    let run_with = |name: &str| {
        let out = plugin()
            .args([
                "run",
                "--skip-node-register",
                "--register-interval",
                "0",
                "--inventory",
            ])
            .arg(&inventory)
            .env(name, "node-a")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run_with("NODE_NAME");
    // The node name was taken (the run got as far as checking the interval) ...
    assert!(stderr.contains("--register-interval=0"), "{stderr}");
    // ... and the old name was reported.
    assert!(
        stderr.contains("NODE_NAME is deprecated: use HAMI_NODE_NAME"),
        "{stderr}"
    );
    let stderr = run_with("HAMI_NODE_NAME");
    assert!(stderr.contains("--register-interval=0"), "{stderr}");
    assert!(!stderr.contains("deprecated"), "{stderr}");
}

/// A `run` whose stderr lines (JSON) arrive on a channel while it runs.
struct Running {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(args: &[&str], env: &[(&str, &str)], dir: tempfile::TempDir) -> Self {
        let kubelet_dir = dir.path().join("device-plugins");
        std::fs::create_dir_all(&kubelet_dir).unwrap();
        let mut cmd = plugin();
        cmd.args([
            "--log-format",
            "json",
            "run",
            "--skip-node-register",
            "--kubelet-dir",
        ])
        .arg(&kubelet_dir)
        .args(args)
        .env("NODE_NAME", "node-a")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({ "message": line }));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            _dir: dir,
        }
    }

    /// The first log line whose message is `message` (waiting for it).
    fn wait_for(&mut self, message: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.seen.iter().find(|l| l["message"] == message) {
                return line.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {message:?} in {:#?}", self.seen),
            }
        }
    }

    fn count(&self, message: &str) -> usize {
        self.seen.iter().filter(|l| l["message"] == message).count()
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> (std::process::ExitStatus, Vec<serde_json::Value>) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = self.child.wait().unwrap();
        self.seen.extend(self.lines.try_iter());
        (status, self.seen)
    }
}

/// `GET path` on `addr`: (status code, body).
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (code, body)
}

/// No usable GPU: as HAMi ("No devices found. Waiting indefinitely."), the plugin stays up, says
/// so once, answers its probes (alive and ready: a DaemonSet rollout must not stall on a node
/// without GPUs), registers nothing, and exits 0 on SIGTERM.
#[test]
fn without_a_usable_gpu_the_plugin_waits_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let node_config = dir.path().join("config.json");
    std::fs::write(
        &node_config,
        r#"{"nodeconfig":[{"name":"node-a","filterdevices":{"index":[0,1]}}]}"#,
    )
    .unwrap();
    let inventory = inventory_file(dir.path(), INVENTORY);
    let kubelet_dir = dir.path().join("device-plugins");
    let mut run = Running::start(
        &[
            "--inventory",
            inventory.to_str().unwrap(),
            "--node-config",
            node_config.to_str().unwrap(),
        ],
        &[],
        dir,
    );
    let serving = run.wait_for("serving /healthz, /readyz, /metrics");
    let addr = serving["addr"].as_str().unwrap().to_owned();
    let waiting = run.wait_for("No devices found. Waiting indefinitely.");
    assert_eq!(waiting["level"], "WARN");
    let reason = waiting["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no GPU to advertise: 2 found, all left out")
            && reason.contains("excluded by filterdevices"),
        "{reason}"
    );
    assert_eq!(http_get(&addr, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(http_get(&addr, "/readyz"), (200, "ready\n".to_owned()));
    let (code, metrics) = http_get(&addr, "/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("hami_device_plugin_devices") && l.ends_with(" 0")),
        "{metrics}"
    );
    // Still there a while later, having said it once, with no plugin socket.
    std::thread::sleep(Duration::from_millis(600));
    assert!(run.child.try_wait().unwrap().is_none(), "the plugin exited");
    assert!(!kubelet_dir.join("nvidia-gpu.sock").exists());
    assert_eq!(run.count("No devices found. Waiting indefinitely."), 1);
    let (status, log) = run.terminate();
    assert_eq!(status.code(), Some(0), "{log:#?}");
    assert!(
        log.iter()
            .any(|l| l["message"] == "stopped while waiting for GPUs"),
        "{log:#?}"
    );
}

/// NVML unavailable: FAIL_ON_INIT_ERROR (default true) exits 1 naming the problem; `false`
/// waits like a node without GPUs, as HAMi's `getResourceManagers`.
#[test]
fn fail_on_init_error_decides_between_exiting_and_waiting_without_nvml() {
    let nvml = hami_device_plugin::gpu::nvml::NvmlInventory::init().is_ok();
    if !nvml {
        let out = plugin()
            .args(["run", "--skip-node-register", "--metrics-listen", "off"])
            .env("NODE_NAME", "node-a")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NVML is not available"), "{err}");
    }
    for waiting in [&[("FAIL_ON_INIT_ERROR", "false")][..], &[][..]] {
        let args: &[&str] = if waiting.is_empty() {
            &["--fail-on-init-error=false"]
        } else {
            &[]
        };
        let mut run = Running::start(args, waiting, tempfile::tempdir().unwrap());
        if nvml {
            // A GPU machine: NVML works; the plugin serves or waits, and stops on SIGTERM.
            let (status, log) = run.terminate();
            assert_eq!(status.code(), Some(0), "{log:#?}");
            continue;
        }
        let line = run.wait_for("No devices found. Waiting indefinitely.");
        let reason = line["reason"].as_str().unwrap();
        assert!(
            reason.contains("NVML is not available")
                && reason.contains("FAIL_ON_INIT_ERROR is false"),
            "{reason}"
        );
        let (status, log) = run.terminate();
        assert_eq!(status.code(), Some(0), "{log:#?}");
    }
    let out = plugin()
        .args(["run", "--fail-on-init-error=maybe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FAIL_ON_INIT_ERROR (--fail-on-init-error) \"maybe\" is not a boolean"),
        "{err}"
    );
}

/// `serve-preload` refuses to start on a hook folder `install-hook` did not fill (exit 1, naming
/// the folder), and on an unusable `--hook-path` or slot count (exit 2), before touching the
/// kubelet folder.
#[test]
fn serve_preload_does_not_start_without_an_installed_hook() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let empty = dir.path().join("hook");
    let run = |args: &[&str]| {
        let out = plugin()
            .arg("serve-preload")
            .arg(format!("--kubelet-dir={}", kubelet_dir.display()))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&[&format!("--hook-path={}", empty.display())]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}/vgpu is missing", empty.display()))
            && stderr.contains("install-hook"),
        "{stderr}"
    );
    let (code, stderr) = run(&["--hook-path=relative/hook"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not an absolute path"), "{stderr}");
    let (code, stderr) = run(&[&format!("--hook-path={}", empty.display()), "--slots=0"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--slots"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&kubelet_dir).unwrap().count(),
        0,
        "no socket left behind"
    );
}

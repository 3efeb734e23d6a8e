//! CDI on the real node: a spec for the inventory's GPUs laid out as `nvidia-ctk cdi generate`
//! writes one (kind `nvidia.com/gpu`; each GPU named by its index and by its UUID, plus `all`;
//! the GPU's device node per device, the control node, the driver's files and
//! `NVIDIA_VISIBLE_DEVICES=void` common to all), in the node's own spec folder (containerd 2's
//! `cdi_spec_dirs` there, never the host's /etc/cdi). No GPU here: the device nodes are character
//! devices with /dev/null's numbers, the driver is a text file, and each GPU adds a variable that
//! names it, so that a container shows which device the runtime injected.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::{GPU_0, GPU_1, Node, var, vars};

/// The inventory's GPUs by index (scripts/cluster's chart values).
pub const GPUS: [&str; 2] = [GPU_0, GPU_1];
/// Where the spec's driver file appears in a container.
pub const DRIVER_FILE: &str = "/usr/share/nvidia/hami-limits-test-driver";
/// The spec's driver file's content.
pub const DRIVER_BODY: &str = "NVIDIA driver 580.95.05 (fake: hami-limits real_node CDI spec)\n";

/// The variable the spec's device `index` sets.
pub fn device_var(index: usize) -> String {
    format!("HAMI_LIMITS_TEST_CDI_GPU_{index}")
}

/// Whether the node runs containerd 2 (scripts/cluster's default) rather than Debian's 1.6,
/// which has no CDI.
pub fn containerd2(n: &Node) -> bool {
    std::fs::read_to_string(n.dir.join("node/containerd-kind")).is_ok_and(|k| k.trim() == "built")
}

fn cdi_dir(n: &Node) -> PathBuf {
    n.dir.join("node/cdi")
}

/// A character device with /dev/null's numbers (1, 3): the spec's GPU nodes.
fn fake_device_node(path: &Path) {
    if path.exists() {
        return;
    }
    let out = Command::new("mknod")
        .arg(path)
        .args(["c", "1", "3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mknod {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The spec (as `nvidia-ctk cdi generate --output <node>/cdi/etc/nvidia.json` would write it on a
/// node with these GPUs) and the host files it names. Returns the spec's path.
pub fn write_spec(n: &Node) -> PathBuf {
    let root = cdi_dir(n);
    let dev = root.join("dev");
    let driver = root.join("driver");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::create_dir_all(&driver).unwrap();
    fake_device_node(&dev.join("nvidiactl"));
    let driver_file = driver.join("version");
    std::fs::write(&driver_file, DRIVER_BODY).unwrap();
    let mut devices = Vec::new();
    for (index, uuid) in GPUS.iter().enumerate() {
        let node = dev.join(format!("nvidia{index}"));
        fake_device_node(&node);
        let edits = json!({
            "env": [format!("{}={uuid}", device_var(index))],
            "deviceNodes": [{"path": format!("/dev/nvidia{index}"), "hostPath": node}],
        });
        devices.push(json!({"name": index.to_string(), "containerEdits": edits}));
        devices.push(json!({"name": uuid, "containerEdits": edits}));
    }
    let all_env: Vec<String> = GPUS
        .iter()
        .enumerate()
        .map(|(i, u)| format!("{}={u}", device_var(i)))
        .collect();
    let all_nodes: Vec<Value> = (0..GPUS.len())
        .map(|i| json!({"path": format!("/dev/nvidia{i}"), "hostPath": dev.join(format!("nvidia{i}"))}))
        .collect();
    devices
        .push(json!({"name": "all", "containerEdits": {"env": all_env, "deviceNodes": all_nodes}}));
    let spec = json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": dev.join("nvidiactl")}],
            "mounts": [{
                "hostPath": driver_file,
                "containerPath": DRIVER_FILE,
                "options": ["ro", "nosuid", "nodev", "bind"],
            }],
        },
    });
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let path = etc.join("nvidia.json");
    // Written whole, then renamed: containerd's spec cache watches the folder.
    let tmp = etc.join(".nvidia.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// Inside the running container of `pod`: the spec's edits for GPU `index` and no other GPU's:
/// its variable and the common one in the entrypoint's environment, its device node and the
/// control node as character devices that open, the driver file mounted read-only.
pub fn assert_injected(n: &Node, pod: &str, index: usize) {
    let entry = vars(&n.exec_ok(pod, &["cat", "/tmp/entry-env"]));
    assert_eq!(
        var(&entry, &device_var(index)),
        Some(GPUS[index]),
        "{pod}: the CDI device's variable in the entrypoint's environment: {entry:?}"
    );
    for (other, _) in GPUS.iter().enumerate().filter(|(i, _)| *i != index) {
        assert_eq!(
            var(&entry, &device_var(other)),
            None,
            "{pod}: GPU {other}'s CDI edits injected too"
        );
    }
    assert_eq!(
        var(&entry, "NVIDIA_VISIBLE_DEVICES"),
        Some("void"),
        "{pod}: the spec's common variable"
    );
    for node in [format!("/dev/nvidia{index}"), "/dev/nvidiactl".to_owned()] {
        // A character device the container may open (the spec's device cgroup rule).
        n.exec_ok(
            pod,
            &[
                "sh",
                "-c",
                &format!("test -c {node} && head -c 1 {node} >/dev/null"),
            ],
        );
    }
    let other = format!("/dev/nvidia{}", 1 - index);
    let (code, _, _) = n.exec(pod, &["test", "-e", &other]);
    assert_ne!(
        code, 0,
        "{pod}: {other} of the other GPU is in the container"
    );
    assert_eq!(n.exec_ok(pod, &["cat", DRIVER_FILE]), DRIVER_BODY);
    let (code, _, err) = n.exec(pod, &["sh", "-c", &format!("echo x >> {DRIVER_FILE}")]);
    assert_ne!(code, 0, "{pod}: {DRIVER_FILE} is writable");
    assert!(err.contains("Read-only file system"), "{pod}: {err}");
}

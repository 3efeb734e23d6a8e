//! `hami-device-plugin plan`: the dry run for operators, as a user runs it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: ml
  uid: 6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b
  annotations:
    hami.io/vgpu-node: gpu-0
    hami.io/bind-phase: allocating
    hami.io/vgpu-devices-to-allocate: "GPU-a,NVIDIA,1000,20:;;GPU-b,NVIDIA,3000,50:GPU-c,NVIDIA,3000,50:;"
spec:
  initContainers:
  - name: warmup
    image: cuda
  containers:
  - name: sidecar
    image: busybox
  - name: trainer
    image: cuda
    env:
    - name: CUDA_TASK_PRIORITY
      value: "0"
    - name: CUDA_DISABLE_CONTROL
      value: "true"
"#;

/// `plan` of [`POD`], whose namespace may set the HAMi-core variables it sets (as HAMi lets it).
fn plan(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--allow-hami-core-env-namespaces", "ml"];
    args.extend_from_slice(extra);
    plan_pod(dir, POD, &args)
}

fn plan_pod(dir: &Path, pod: &str, extra: &[&str]) -> std::process::Output {
    std::fs::write(dir.join("pod.yaml"), pod).unwrap();
    Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .arg("plan")
        .arg("--pod")
        .arg(dir.join("pod.yaml"))
        .args(["--node", "gpu-0", "--hook-path"])
        .arg(dir.join("hook"))
        .args(extra)
        .env_remove("HAMI_DEVICE_CONFIG")
        .env_remove("HAMI_NODE_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn prints_every_pending_container_as_json_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("device-config.yaml"),
        "nvidia:\n  limitDelivery: env\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"nodeconfig":[{"name":"gpu-0","limitdelivery":"file"}]}"#,
    )
    .unwrap();
    let config = dir.join("device-config.yaml").display().to_string();
    let node_config = dir.join("config.json").display().to_string();
    let out = plan(dir, &["--config", &config, "--node-config", &node_config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pod"], "ml/train");
    let containers = report["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2);
    let (warmup, trainer) = (&containers[0], &containers[1]);
    assert_eq!(warmup["container"], "warmup");
    assert_eq!(warmup["slot"], serde_json::json!({"init": 0}));
    assert_eq!(trainer["container"], "trainer");
    assert_eq!(trainer["slot"], serde_json::json!({"app": 1}));
    assert_eq!(
        trainer["delivery"],
        serde_json::json!({"mode": "file", "source": "node-config"})
    );
    let hook = dir.join("hook").display().to_string();
    assert_eq!(trainer["envs"]["CUDA_DEVICE_MEMORY_LIMIT_1"], "3000m");
    assert_eq!(trainer["envs"]["NVIDIA_VISIBLE_DEVICES"], "GPU-b,GPU-c");
    let mounts: Vec<&str> = trainer["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    // CUDA_DISABLE_CONTROL=true: neither ld.so.preload nor the preload library it names.
    assert_eq!(
        mounts,
        [
            format!("{hook}/vgpu/libvgpu.so").as_str(),
            &format!("{hook}/vgpu"),
            "/tmp/vgpulock",
            "/overrideEnv"
        ]
    );
    // The init container keeps control: both, read-only, the library at the same path on both
    // sides (under the configured hook path, which ld.so.preload names).
    let warmup_mounts: Vec<(&str, &str, bool)> = warmup["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["containerPath"].as_str().unwrap(),
                m["hostPath"].as_str().unwrap(),
                m["readOnly"].as_bool().unwrap(),
            )
        })
        .collect();
    let warmup_dir = format!("{hook}/vgpu/containers/{UID}_warmup");
    let warmup_file = format!("{warmup_dir}.limits");
    let lib = format!("{hook}/vgpu/libvgpu.so");
    let list = format!("{hook}/vgpu/ld.so.preload");
    let preload = format!("{hook}/vgpu/libhami_preload.so");
    assert_eq!(
        warmup_mounts,
        [
            (lib.as_str(), lib.as_str(), true),
            (format!("{hook}/vgpu").as_str(), warmup_dir.as_str(), false),
            ("/tmp/vgpulock", "/tmp/vgpulock", false),
            ("/etc/ld.so.preload", list.as_str(), true),
            (preload.as_str(), preload.as_str(), true),
            ("/overrideEnv", warmup_file.as_str(), true),
        ]
    );
    assert_eq!(
        trainer["limitsFile"]["text"],
        format!(
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_LIMIT_1=3000m\n\
             CUDA_DEVICE_MEMORY_SHARED_CACHE={hook}/vgpu/usage.cache\nCUDA_DEVICE_SM_LIMIT=50\n\
             CUDA_TASK_PRIORITY=0\nHAMI_LIMITS_FORMAT=1\n"
        )
    );
    assert_eq!(report["written"], serde_json::json!([]));
    assert!(!dir.join("hook").exists(), "a dry run writes nothing");
}

#[test]
fn write_publishes_the_files_as_run_would() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = plan(dir, &["--write"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["written"].as_array().unwrap().len(), 4);
    let containers = dir.join("hook/vgpu/containers");
    for c in ["warmup", "trainer"] {
        let file = containers.join(format!("{UID}_{c}.limits"));
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            hami_shared::limits_file::parse_bytes(&bytes)
                .diagnostics
                .is_empty()
        );
        // Root's folder, not writable by the container's users, with HAMi-core's region file
        // pre-created for every UID.
        let ctr = containers.join(format!("{UID}_{c}"));
        let d = std::fs::metadata(&ctr).unwrap();
        assert_eq!(d.permissions().mode() & 0o7777, 0o755);
        let cache = std::fs::symlink_metadata(ctr.join("usage.cache")).unwrap();
        assert!(cache.is_file());
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.permissions().mode() & 0o7777, 0o666);
    }
}

/// `plan` builds its settings as `run` and `inventory` do (one loader, one set of checks): a
/// device config `run` refuses is refused by `plan` with the same message and exit status,
/// never planned. (`plan` used to skip the plugin's own checks and print an allocation for a
/// `resourceCountName` that `run` refuses.)
#[test]
fn plan_refuses_the_device_config_run_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = dir.join("device-config.yaml");
    let node_config = dir.join("config.json");
    for (global, node, key) in [
        (
            "nvidia:\n  resourceCountName: gpu\n",
            r#"{"nodeconfig":[]}"#,
            "nvidia.resourceCountName: invalid value \"gpu\"",
        ),
        (
            "nvidia: {}\n",
            r#"{"nodeconfig":[{"name":"gpu-0","devicesplitcount":0}]}"#,
            "0",
        ),
        (
            "nvidia:\n  deviceSplitCount: 0\n",
            r#"{"nodeconfig":[]}"#,
            "deviceSplitCount: invalid value 0",
        ),
    ] {
        std::fs::write(&config, global).unwrap();
        std::fs::write(&node_config, node).unwrap();
        let files = [
            "--config",
            &config.display().to_string(),
            "--node-config",
            &node_config.display().to_string(),
        ]
        .map(str::to_owned);
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        let planned = plan(dir, &files);
        // `inventory` loads its settings through `run`'s loader.
        let inventory = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
            .args(["inventory", "--node-name", "gpu-0"])
            .args(&files)
            .output()
            .unwrap();
        for (command, out) in [("plan", &planned), ("inventory", &inventory)] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command}: {err}");
            assert!(err.contains(key), "{command}: {err}");
            assert!(out.stdout.is_empty(), "{command} printed a result");
        }
        assert_eq!(
            String::from_utf8_lossy(&planned.stderr),
            String::from_utf8_lossy(&inventory.stderr)
        );
    }
}

#[test]
fn dynamic_mig_and_malformed_annotations_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("config.json"),
        r#"{"nodeconfig":[{"name":"gpu-0","operatingmode":"mig"}]}"#,
    )
    .unwrap();
    let node_config = dir.join("config.json").display().to_string();
    let out = plan(dir, &["--node-config", &node_config]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dynamic MIG") && err.contains("not support"),
        "{err}"
    );

    let bad = POD.replace("GPU-a,NVIDIA,1000,20:", "GPU-a,NVIDIA,1000m,20:");
    std::fs::write(dir.join("bad.yaml"), bad).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .args(["plan", "--node", "gpu-0", "--pod"])
        .arg(dir.join("bad.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ml/train") && err.contains("1000m"), "{err}");
}

fn plan_file(dir: &Path, text: &[u8], extra: &[&str]) -> std::process::Output {
    let path = dir.join("input.yaml");
    std::fs::write(&path, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .args(["plan", "--pod", path.to_str().unwrap(), "--node", "gpu-0"])
        .args(["--allow-hami-core-env-namespaces", "ml"])
        .args(extra)
        .env_remove("HOOK_PATH")
        .env_remove("NODE_NAME")
        .env_remove("HAMI_HOOK_PATH")
        .env_remove("HAMI_NODE_NAME")
        .output()
        .unwrap()
}

/// What is not a pod is refused with a clear error, and pathological input is answered at once
/// (before: an empty file, `{"hello": "world"}` and a billion-laughs document exited 0, and
/// 100,000 levels of nesting took 19 s).
#[test]
fn what_is_not_a_pod_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!(
        "kind: Pod\nx: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let laughs = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n\
                  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n\
                  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n\
                  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n";
    let cases: [(&str, &[u8], &str); 6] = [
        ("empty", b"", "empty"),
        ("blank", b"\n  \n", "empty"),
        ("not a pod", br#"{"hello": "world"}"#, "kind: Pod"),
        ("a node", b"kind: Node\nmetadata: {name: x}\n", "kind: Pod"),
        ("deep", deep.as_bytes(), "levels deep"),
        ("billion laughs", laughs.as_bytes(), ""),
    ];
    for (what, text, words) in cases {
        let started = std::time::Instant::now();
        let o = plan_file(dir.path(), text, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{what}: {err}");
        assert!(err.contains(words), "{what}: {err}");
        assert!(o.stdout.is_empty(), "{what}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{what} took {:?}",
            started.elapsed()
        );
    }
    let big = vec![b'#'; (9 << 20) as usize];
    let o = plan_file(dir.path(), &big, &[]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("larger than"));
}

/// A YAML error names the line and column of the user's file; integer quantities are accepted.
#[test]
fn errors_name_the_line_of_the_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: default\nspec:\n  nodeName: gpu-0\n  containers:\n    - name: c\n      image: busybox\n      resources:\n        limits:\n          nvidia.com/gpu: 1\n";
    let o = plan_file(dir.path(), pod.as_bytes(), &[]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // `env` as a map instead of a list: `name: X` is on line 12.
    let bad = pod.replace(
        "      image: busybox\n",
        "      image: busybox\n      env:\n        name: X\n",
    );
    let o = plan_file(dir.path(), bad.as_bytes(), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("at line 12 column"), "{err}");
    assert!(err.contains("spec.containers[0].env"), "{err}");
}

/// A pod with nothing pending says why instead of printing an empty list without a word.
#[test]
fn nothing_pending_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let pod = POD.replace(
        "\"GPU-a,NVIDIA,1000,20:;;GPU-b,NVIDIA,3000,50:GPU-c,NVIDIA,3000,50:;\"",
        "\";;;\"",
    );
    let o = plan_file(dir.path(), pod.as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("nothing to allocate") && err.contains("already allocated"),
        "{err}"
    );
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["containers"], serde_json::json!([]));
    assert_eq!(out["notes"].as_array().unwrap().len(), 1);

    let pod = POD
        .replace("hami.io/vgpu-devices-to-allocate:", "other-annotation:")
        .replace("hami.io/vgpu-node: gpu-0", "hami.io/vgpu-node: gpu-7");
    let o = plan_file(dir.path(), pod.as_bytes(), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("has not assigned it devices"), "{err}");
    assert!(err.contains("node \"gpu-7\", not \"gpu-0\""), "{err}");
}

/// `plan --write` sweeps the temporaries an interrupted earlier `--write` left, as `run` does.
#[test]
fn write_sweeps_leftover_temporaries() {
    let dir = tempfile::tempdir().unwrap();
    let hook = dir.path().join("hook");
    let containers = hook.join("vgpu/containers");
    std::fs::create_dir_all(&containers).unwrap();
    let leftover = containers.join(format!(".{UID}_trainer.limits.hami-tmp.1.2.3"));
    std::fs::write(&leftover, "CUDA_DEVICE_MEMORY_LIMIT_0=30").unwrap();
    let o = plan_file(
        dir.path(),
        POD.as_bytes(),
        &["--write", "--hook-path", hook.to_str().unwrap()],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!leftover.exists());
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["removedTemporaries"], 1);
}

/// `plan` with HAMi's variable names, as the DaemonSet sets them.
fn plan_env(dir: &Path, env: &[(&str, &str)], extra: &[&str]) -> std::process::Output {
    std::fs::write(dir.join("pod.yaml"), POD).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"));
    cmd.arg("plan")
        .arg("--pod")
        .arg(dir.join("pod.yaml"))
        .args(["--node", "gpu-0", "--hook-path"])
        .arg(dir.join("hook"))
        .args(extra)
        .env_remove("HAMI_DEVICE_CONFIG")
        .env_remove("HAMI_NODE_CONFIG")
        // The variable, as the chart sets it.
        .env("HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES", "kube-system,ml");
    for name in [
        "DEVICE_LIST_STRATEGY",
        "DEVICE_ID_STRATEGY",
        "PASS_DEVICE_SPECS",
        "NVIDIA_DRIVER_ROOT",
        "NVIDIA_DEV_ROOT",
        "CDI_ANNOTATION_PREFIX",
        "NVIDIA_CDI_HOOK_PATH",
        "NVIDIA_CTK_PATH",
        "DRIVER_ROOT_CTR_PATH",
        "CONTAINER_DRIVER_ROOT",
        "GDS_ENABLED",
        "MOFED_ENABLED",
        "GDRCOPY_ENABLED",
        "IMEX_CHANNEL_IDS",
        "IMEX_REQUIRED",
    ] {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

#[test]
fn hamis_device_list_variables_shape_the_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // GPU-b is index 1 on /dev/nvidia5; the others as the index.
    std::fs::write(
        dir.join("inventory.yaml"),
        "- {uuid: GPU-a, name: x, memoryMib: 8000}\n- {uuid: GPU-b, index: 1, minor: 5, name: x, memoryMib: 8000}\n- {uuid: GPU-c, index: 2, name: x, memoryMib: 8000}\n",
    )
    .unwrap();
    let inventory = dir.join("inventory.yaml").display().to_string();
    let out = plan_env(
        dir,
        &[
            ("DEVICE_LIST_STRATEGY", "envvar,cdi-cri"),
            ("DEVICE_ID_STRATEGY", "index"),
            ("PASS_DEVICE_SPECS", "true"),
            ("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver"),
            ("GDS_ENABLED", "true"),
            ("NVIDIA_CTK_PATH", "/usr/local/bin/nvidia-ctk"),
            ("HAMI_INVENTORY", &inventory),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("NVIDIA_CTK_PATH is deprecated: use NVIDIA_CDI_HOOK_PATH"),
        "{stderr}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = report["deviceListNotes"].as_array().unwrap();
    assert!(
        notes[0]
            .as_str()
            .unwrap()
            .contains("=\"/usr/local/bin/nvidia-ctk\" has no effect"),
        "{notes:?}"
    );
    let settings = &report["settings"]["deviceList"];
    assert_eq!(
        settings["strategies"],
        serde_json::json!(["envvar", "cdi-cri"])
    );
    assert_eq!(settings["idStrategy"], "index");
    assert_eq!(settings["devRoot"], "/run/nvidia/driver");
    let trainer = &report["containers"][1];
    assert_eq!(trainer["envs"]["NVIDIA_VISIBLE_DEVICES"], "1,2");
    assert_eq!(trainer["envs"]["NVIDIA_GDS"], "enabled");
    assert_eq!(
        trainer["cdiDevices"],
        serde_json::json!(["nvidia.com/gpu=1", "nvidia.com/gpu=2", "nvidia.com/gds=all"])
    );
    // The GPUs' own nodes always; the control nodes only where this machine has them.
    let specs: Vec<(&str, &str)> = trainer["deviceSpecs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["optional"] == false)
        .map(|d| {
            (
                d["containerPath"].as_str().unwrap(),
                d["hostPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        specs,
        [
            ("/dev/nvidia5", "/run/nvidia/driver/dev/nvidia5"),
            ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2"),
        ]
    );
    for d in trainer["deviceSpecs"].as_array().unwrap() {
        if d["optional"] == true {
            let path = d["containerPath"].as_str().unwrap();
            assert!(Path::new(path).exists(), "{path} passed but absent");
        }
    }
}

#[test]
fn invalid_device_list_variables_are_refused_naming_key_value_and_forms() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&[(&str, &str)], &str); 4] = [
        (
            &[("DEVICE_LIST_STRATEGY", "envvar,cdi")],
            "DEVICE_LIST_STRATEGY (--device-list-strategy): invalid value \"envvar,cdi\": \"cdi\" is not a strategy: expected a comma-separated list of envvar, volume-mounts, cdi-annotations, cdi-cri",
        ),
        (
            &[("DEVICE_LIST_STRATEGY", "")],
            "DEVICE_LIST_STRATEGY (--device-list-strategy): invalid value \"\": an empty strategy would give containers no device list (no GPUs)",
        ),
        (
            &[("IMEX_CHANNEL_IDS", "0,1")],
            "IMEX_CHANNEL_IDS (--imex-channel-ids): invalid value \"0,1\": IMEX channelIDs must be [] or [0]; found [0, 1]",
        ),
        (
            &[
                ("IMEX_CHANNEL_IDS", "0"),
                ("IMEX_REQUIRED", "true"),
                ("DRIVER_ROOT_CTR_PATH", "/nonexistent-driver-root"),
            ],
            "IMEX_REQUIRED (--imex-required) is true and the requested IMEX channel channel0 does not exist",
        ),
    ];
    for (env, message) in cases {
        let out = plan_env(tmp.path(), env, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(message), "{env:?}: {stderr}");
    }
    // The index strategy needs the node's GPUs: without NVML or --inventory, say so.
    let out = plan_env(
        tmp.path(),
        &[("DEVICE_ID_STRATEGY", "index"), ("HAMI_INVENTORY", "")],
        &["--inventory", "/nonexistent/inventory.yaml"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("DEVICE_ID_STRATEGY=index needs this node's GPUs"),
        "{stderr}"
    );
}

/// `plan` refuses what `Allocate` refuses, with the same message: here the container's own
/// `CUDA_DISABLE_CONTROL` and `CUDA_TASK_PRIORITY` without a namespace allowed to set them, and
/// a mount over the limits file; nothing is written.
#[test]
fn plan_refuses_what_allocate_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = plan_pod(dir, POD, &["--write"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("pod ml/train: container \"trainer\" refused: spec.containers[1].env[0] sets CUDA_TASK_PRIORITY (\"0\")")
            && stderr.contains("spec.containers[1].env[1] sets CUDA_DISABLE_CONTROL (\"true\")")
            && stderr.contains("--allow-hami-core-env-namespaces"),
        "{stderr}"
    );
    assert!(!dir.join("hook").exists(), "nothing written");

    let pod = POD.replace(
        "    env:\n    - name: CUDA_TASK_PRIORITY\n      value: \"0\"\n    - name: CUDA_DISABLE_CONTROL\n      value: \"true\"\n",
        "    volumeMounts:\n    - name: mine\n      mountPath: //overrideEnv/\n",
    );
    assert_ne!(pod, POD);
    let out = plan_pod(dir, &pod, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("spec.containers[1].volumeMounts[0].mountPath=\"//overrideEnv/\" (cleaned /overrideEnv) is at the same path as /overrideEnv"),
        "{stderr}"
    );

    // An entry this node cannot have scheduled: refused with --inventory.
    std::fs::write(
        dir.join("inventory.yaml"),
        "- {uuid: GPU-a, name: x, memoryMib: 8000}\n- {uuid: GPU-b, index: 1, name: x, memoryMib: 2000}\n- {uuid: GPU-c, index: 2, name: x, memoryMib: 8000}\n",
    )
    .unwrap();
    let inventory = dir.join("inventory.yaml").display().to_string();
    let out = plan(dir, &["--inventory", &inventory]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("hami.io/vgpu-devices-to-allocate refused: entry 2 grants 3000 MiB on GPU \"GPU-b\", above the 2000 MiB it registers"),
        "{stderr}"
    );
}

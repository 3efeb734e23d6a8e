//! `hami-limits check --node-gpus` end to end, through the built binary (output forms, JSON shape,
//! exit statuses), and `hami-limits check` of the limits files of KAI pods (the per-node keys
//! clean, `HAMI_UNCAPPED` reported).

use std::io::Write;
use std::process::{Command, Output, Stdio};

use hami_shared::container::LimitsBuilder;
use hami_shared::node_gpus::{NodeGpu, NodeGpus};
use hami_shared::values::MemoryLimitMib;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hami-limits");

fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        pipe.write_all(bytes).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// Two H200s and an A100, as install-hook renders the file.
fn node_file() -> String {
    let mut gpus = NodeGpus::new();
    for (minor, mib) in [(0, 143_771), (1, 143_771), (4, 81_559)] {
        gpus.insert(NodeGpu {
            minor,
            uuid: format!("GPU-4d3c2b1a-0000-0000-0000-00000000000{minor}"),
            memory_mib: mib,
        })
        .unwrap();
    }
    gpus.render()
}

#[test]
fn a_published_node_file_is_clean_from_a_path_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node-gpus");
    std::fs::write(&path, node_file()).unwrap();
    for (args, input) in [
        (vec!["check", "--node-gpus", path.to_str().unwrap()], None),
        (
            vec!["check", "--node-gpus", "-"],
            Some(node_file().into_bytes()),
        ),
    ] {
        let o = run(&args, input.as_deref());
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
        assert_eq!(stdout(&o), "", "{args:?}");
        let err = stderr(&o);
        for needle in [
            "node GPU file, format 1, 3 GPUs",
            "/dev/nvidia4 81559 MiB",
            "used by the preload library",
            "0 diagnostics",
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
    let o = run(
        &["check", "--node-gpus", path.to_str().unwrap(), "--json"],
        None,
    );
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["diagnostics"], Value::Array(vec![]));
    assert_eq!(v["format"], 1);
    assert_eq!(v["usable"], true);
    assert_eq!(v["gpus"]["4"]["mib"], 81_559);
    assert_eq!(
        v["gpus"]["0"]["uuid"],
        "GPU-4d3c2b1a-0000-0000-0000-000000000000"
    );
}

#[test]
fn findings_are_one_line_each_with_the_line_of_the_entry() {
    let bad =
        "NVIDIA0_MIB=143771\nNVIDIA0_UUID=GPU-0\nNVIDIA1_MIB=080\n\nnvidia2_MIB=1\nNVIDIA3_MIB=5\n";
    let o = run(&["check", "--node-gpus", "-"], Some(bad.as_bytes()));
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(
        lines[0],
        "file: error: no HAMI_NODE_GPUS_FORMAT line: the preload library ignores the file"
    );
    assert!(
        lines[1].starts_with("line 3: error: NVIDIA1_MIB=\"080\": memory must be"),
        "{out}"
    );
    assert!(lines[2].starts_with("line 4: error: blank line"), "{out}");
    assert!(
        lines[3].starts_with("line 5: error: key \"nvidia2_MIB\""),
        "{out}"
    );
    assert_eq!(lines[4], "line 6: warning: NVIDIA3_MIB has no NVIDIA3_UUID");
    assert!(
        stderr(&o).contains("ignored by the preload library"),
        "{}",
        stderr(&o)
    );
    // The same in JSON.
    let o = run(
        &["check", "--node-gpus", "-", "--json"],
        Some(bad.as_bytes()),
    );
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["diagnostics", "format", "gpus", "usable"]);
    assert_eq!(v["format"], Value::Null);
    assert_eq!(v["usable"], false);
    let diags = v["diagnostics"].as_array().unwrap();
    let found: Vec<(u64, &str)> = diags
        .iter()
        .map(|d| (d["line"].as_u64().unwrap(), d["severity"].as_str().unwrap()))
        .collect();
    assert_eq!(
        found,
        [
            (0, "error"),
            (3, "error"),
            (4, "error"),
            (5, "error"),
            (6, "warning")
        ]
    );
    // A valid file with a GPU whose UUID is missing: used, but reported.
    let o = run(
        &["check", "--node-gpus", "-"],
        Some(b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=81559\n"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o),
        "line 2: warning: NVIDIA0_MIB has no NVIDIA0_UUID\n"
    );
    assert!(
        stderr(&o).contains("used by the preload library"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_file_past_the_preload_librarys_read_bound_is_an_error() {
    let mut big = node_file();
    while big.len() <= 4096 {
        big.push_str("NVIDIA0_UUID=GPU-4d3c2b1a-0000-0000-0000-000000000000\n");
    }
    let o = run(
        &["check", "--node-gpus", "-", "--json"],
        Some(big.as_bytes()),
    );
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["usable"], false);
    let first = &v["diagnostics"][0];
    assert_eq!(
        (first["line"].as_u64(), first["severity"].as_str()),
        (Some(0), Some("error"))
    );
    let message = first["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("the file is {} bytes", big.len()))
            && message.contains("reads at most 4096 bytes"),
        "{message}"
    );
    // Far larger: read no further than a bound, and say so.
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("node-gpus");
    std::fs::write(&huge, vec![b'A'; 1 << 20]).unwrap();
    let o = run(&["check", "--node-gpus", huge.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).starts_with("file: error: the file is more than 65536 bytes"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn unreadable_node_file_exits_2_and_usage_errors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("node-gpus");
    for target in [missing.to_str().unwrap(), dir.path().to_str().unwrap()] {
        for json in [false, true] {
            let mut args = vec!["check", "--node-gpus", target];
            if json {
                args.push("--json");
            }
            let o = run(&args, None);
            assert_eq!(o.status.code(), Some(2), "{args:?}");
            assert_eq!(stdout(&o), "");
            assert!(stderr(&o).contains(target), "{}", stderr(&o));
        }
    }
    // One file at a time: a limits file and a node file together, or with --example, is refused.
    for args in [
        &["check", "x.limits", "--node-gpus", "node-gpus"][..],
        &["check", "--example", "--node-gpus", "node-gpus"][..],
    ] {
        let o = run(args, None);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    }
    let o = run(&["check", "--help"], None);
    let out = stdout(&o);
    assert!(
        out.contains("--node-gpus <FILE|->")
            && out.contains("hami-limits check --node-gpus /usr/local/vgpu/node-gpus"),
        "{out}"
    );
}

/// The limits file of a KAI gpu-fraction container in file delivery, built by the builder the
/// webhook uses.
fn fraction_file() -> String {
    let mut b = LimitsBuilder::new("train");
    b.memory_limit(None, MemoryLimitMib::new(40_779).unwrap())
        .unwrap();
    b.per_node_fraction("0.5", "/usr/local/vgpu/node-gpus")
        .unwrap();
    b.finish().0.render()
}

#[test]
fn kai_limits_files_per_node_keys_are_clean_and_an_uncapped_one_is_reported() {
    let o = run(&["check", "-"], Some(fraction_file().as_bytes()));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(stdout(&o), "");
    let o = run(&["check", "--json", "-"], Some(fraction_file().as_bytes()));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["entries"]["HAMI_GPU_FRACTION"], "0.5");
    assert_eq!(v["entries"]["HAMI_NODE_GPUS"], "/usr/local/vgpu/node-gpus");
    // A fraction in another form: the preload library would ignore it; check says so.
    let odd = fraction_file().replace("HAMI_GPU_FRACTION=0.5", "HAMI_GPU_FRACTION=.50");
    let o = run(&["check", "-"], Some(odd.as_bytes()));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).starts_with("line 2: warning: HAMI_GPU_FRACTION=\".50\": not of the form 0.<1..=64 digits, last not 0>"),
        "{}",
        stdout(&o)
    );
    // Admitted without a cap (kai.missingBasis: warn): a warning, exit 1.
    let mut b = LimitsBuilder::new("train");
    b.uncapped("no-matching-node").unwrap();
    let uncapped = b.finish().0.render();
    let o = run(&["check", "-"], Some(uncapped.as_bytes()));
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    for needle in [
        "line 2: warning: HAMI_UNCAPPED=\"no-matching-node\": this container runs without a GPU memory cap",
        "kai.missingBasis is warn",
        "no GPU node the pod can be placed on",
        "nvidia.com/gpu.memory",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
}

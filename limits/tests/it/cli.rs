//! `hami-limits check` end to end, through the built binary: output, JSON shape, exit codes.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use hami_shared::limits_file::EXAMPLE;
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

const BAD: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=04000m\n\
                   \n\
                   CUDA_DEVICE_SM_LIMIT=50\n\
                   CUDA_DEVICE_MEMORY_LIMIT_1=3000Mi\n\
                   HAMI_LIMITS_FORMAT=1\n";

#[test]
fn example_prints_the_file_and_no_diagnostics() {
    let o = run(&["check", "--example"], None);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains(EXAMPLE), "{out}");
    assert!(out.contains("Diagnostics (0):\n(none)\n"), "{out}");
}

#[test]
fn example_json() {
    let o = run(&["check", "--example", "--json"], None);
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["format"], 1);
    assert_eq!(v["entries"]["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
    assert_eq!(v["diagnostics"], Value::Array(vec![]));
}

#[test]
fn clean_file_from_stdin_and_path_exits_0_silently() {
    for args in [&["check", "-"][..], &["check"][..]] {
        let o = run(args, Some(EXAMPLE.as_bytes()));
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert_eq!(stdout(&o), "", "{args:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod_ctr.limits");
    std::fs::write(&path, EXAMPLE).unwrap();
    let o = run(&["check", path.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "");
}

#[test]
fn diagnostics_are_one_line_each_and_exit_1() {
    let o = run(&["check", "-"], Some(BAD.as_bytes()));
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("line 1: warning: CUDA_DEVICE_MEMORY_LIMIT_0=\"04000m\": "),
        "{out}"
    );
    assert!(lines[0].ends_with("HAMi-core reads 2048 MiB"), "{out}");
    assert!(lines[1].starts_with("line 2: error: blank line"), "{out}");
    assert!(
        lines[2].starts_with("line 4: warning: CUDA_DEVICE_MEMORY_LIMIT_1=\"3000Mi\""),
        "{out}"
    );
    assert!(lines[2].ends_with("HAMi-core reads 3000 bytes"), "{out}");
}

#[test]
fn json_shape_for_a_bad_legacy_file() {
    let o = run(
        &["check", "--json", "-"],
        Some(b"CUDA_DEVICE_MEMORY_LIMIT_0=0\nnot a line\n"),
    );
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["diagnostics", "entries", "format"]);
    assert_eq!(v["format"], Value::Null, "legacy file: no format line");
    assert_eq!(
        v["entries"],
        serde_json::json!({"CUDA_DEVICE_MEMORY_LIMIT_0": "0"})
    );
    let diags = v["diagnostics"].as_array().unwrap();
    assert_eq!(diags.len(), 2);
    for d in diags {
        let mut k: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        assert_eq!(k, ["line", "message", "severity"]);
        assert!(d["message"].is_string());
    }
    assert_eq!(
        (diags[0]["line"].as_u64(), diags[0]["severity"].as_str()),
        (Some(1), Some("warning"))
    );
    assert_eq!(
        (diags[1]["line"].as_u64(), diags[1]["severity"].as_str()),
        (Some(2), Some("error"))
    );
}

#[test]
fn unreadable_file_exits_2_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.limits");
    for target in [missing.to_str().unwrap(), dir.path().to_str().unwrap()] {
        for json in [false, true] {
            let mut args = vec!["check", target];
            if json {
                args.push("--json");
            }
            let o = run(&args, None);
            assert_eq!(o.status.code(), Some(2), "{args:?}");
            assert_eq!(stdout(&o), "");
            let err = String::from_utf8(o.stderr).unwrap();
            assert!(err.contains(target), "{err}");
        }
    }
}

#[test]
fn help_everywhere() {
    let o = run(&["--help"], None);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("check"));
    let o = run(&["check", "--help"], None);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(
        out.contains("--json") && out.contains("--example") && out.contains("Exit status"),
        "{out}"
    );
    // A file and --example together is a usage error.
    let o = run(&["check", "--example", "x.limits"], None);
    assert_eq!(o.status.code(), Some(2));
}

/// `check` streams: 512 KiB of newlines (half a million diagnostics, text and JSON) and a
/// 16 MiB line without newline are checked in memory bounded by one line, not by the input
/// (before: 235 MiB of RSS per MiB of newlines). The output is counted as it arrives, not kept,
/// so that this test's own memory stays small too.
#[test]
fn check_streams_in_bounded_memory() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let newlines = dir.path().join("newlines");
    std::fs::write(&newlines, vec![b'\n'; 512 << 10]).unwrap();
    let long = dir.path().join("long");
    std::fs::write(&long, vec![b'A'; 16 << 20]).unwrap();
    for (file, json, diagnostics) in [
        (&newlines, false, 512 << 10),
        (&newlines, true, 512 << 10),
        (&long, false, 2),
    ] {
        let mut args = vec!["check", file.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let mut child = Command::new(BIN)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let needle: &[u8] = if json { b"\"severity\"" } else { b"\n" };
        let (mut count, mut carry, mut buf) = (0usize, Vec::new(), vec![0u8; 1 << 16]);
        loop {
            let n = stdout.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            carry.extend_from_slice(&buf[..n]);
            count += carry.windows(needle.len()).filter(|w| *w == needle).count();
            let keep = carry.len().min(needle.len() - 1);
            carry.drain(..carry.len() - keep);
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(1), "{args:?}");
        assert_eq!(count, diagnostics, "{args:?}");
        // The largest resident set of this test binary's waited-for children (all of them this
        // small program).
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes a complete rusage into the pointer it is given.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: initialised by the successful call above (and zeroed before).
        #[allow(unsafe_code)]
        let max_rss_kib = unsafe { usage.assume_init() }.ru_maxrss;
        assert!(
            max_rss_kib < 64 * 1024,
            "{args:?}: peak RSS {max_rss_kib} KiB"
        );
    }
}

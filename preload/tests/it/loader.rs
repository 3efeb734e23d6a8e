//! The preload library through the real dynamic loader, in real processes that read the real path
//! `/overrideEnv`, without touching the host's root: every case runs in a private mount namespace
//! (`unshare --mount`) chrooted into a temporary root that holds the host's `/usr` (bind-mounted
//! read-only), a test `/overrideEnv`, the library, and an `/etc/ld.so.preload` naming it.
//!
//! The library under test is `HAMI_PRELOAD_LIB` when set (`scripts/test-all` points it at the
//! shipped artifact, built for glibc 2.17), else the `libhami_preload.so` cargo built beside the
//! probe. Needs root (CI runs as root); without it every test fails with a message saying so.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROBE: &str = env!("CARGO_BIN_EXE_hami-preload-probe");
const HAMI_FILE: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n\
CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache\n\
CUDA_DEVICE_SM_LIMIT=50\n\
HAMI_LIMITS_FORMAT=1\n";
const HAMI_ENV: &[&str] = &[
    "CUDA_DEVICE_MEMORY_LIMIT_0=3000m",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache",
    "CUDA_DEVICE_SM_LIMIT=50",
];
/// What a KAI container's file looks like (`hami-webhook mutate` on a `gpu-memory: "3000"` pod).
const KAI_FILE: &str = "CUDA_DEVICE_MEMORY_LIMIT=3000m\nHAMI_LIMITS_FORMAT=1\n";
/// Inherited variables a user could set to lift the cap.
const SPOOF: &[&str] = &[
    "CUDA_DEVICE_MEMORY_LIMIT_0=16g",
    "CUDA_DEVICE_MEMORY_LIMIT=99g",
    "CUDA_DEVICE_MEMORY_LIMIT_7=1g",
    "CUDA_DEVICE_SM_LIMIT_0=100",
    "CUDA_DEVICE_SM_LIMIT=100",
    "CUDA_TASK_PRIORITY=0",
    "GPU_CORE_UTILIZATION_POLICY=disable",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine.cache",
    "CUDA_OVERSUBSCRIBE=true",
    "LIBCUDA_LOG_LEVEL=4",
    "LIBVGPU_HOSTPID_BROKER=1",
];

fn library() -> PathBuf {
    if let Some(path) = std::env::var_os("HAMI_PRELOAD_LIB") {
        return PathBuf::from(path);
    }
    let beside = Path::new(PROBE).with_file_name("libhami_preload.so");
    if beside.is_file() {
        return beside;
    }
    // Built as a dependency of these tests, cargo leaves the cdylib in deps/.
    Path::new(PROBE)
        .with_file_name("deps")
        .join("libhami_preload.so")
}

/// What sits at `/overrideEnv` in the test root.
enum Override<'a> {
    Missing,
    File(&'a [u8]),
    Mode(&'a [u8], u32),
    Directory,
    Fifo,
    Symlink(&'a str),
}

/// How the library is loaded.
#[derive(Clone, Copy)]
enum Via {
    LdSoPreload,
    LdPreload,
}

struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    fn new(over: Override<'_>, via: Via) -> Root {
        let lib = library();
        assert!(
            lib.is_file(),
            "the preload library {} does not exist: build it (scripts/build-preload, or cargo build -p hami-preload) or set HAMI_PRELOAD_LIB",
            lib.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("hami-preload-root.")
            .tempdir()
            .unwrap();
        let r = dir.path();
        for d in ["usr", "etc", "hook", "tmp", "dev"] {
            fs::create_dir(r.join(d)).unwrap();
        }
        fs::set_permissions(r.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
        for (link, target) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            symlink(target, r.join(link)).unwrap();
        }
        fs::copy("/etc/ld.so.cache", r.join("etc/ld.so.cache")).unwrap();
        fs::copy("/etc/passwd", r.join("etc/passwd")).unwrap();
        fs::copy("/etc/group", r.join("etc/group")).unwrap();
        fs::copy(&lib, r.join("hook/libhami_preload.so")).unwrap();
        fs::set_permissions(
            r.join("hook/libhami_preload.so"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        fs::copy(PROBE, r.join("probe")).unwrap();
        if let Via::LdSoPreload = via {
            fs::write(r.join("etc/ld.so.preload"), "/hook/libhami_preload.so\n").unwrap();
        }
        let path = r.join("overrideEnv");
        match over {
            Override::Missing => {}
            Override::File(bytes) => fs::write(&path, bytes).unwrap(),
            Override::Mode(bytes, mode) => {
                fs::write(&path, bytes).unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            }
            Override::Directory => fs::create_dir(&path).unwrap(),
            Override::Fifo => {
                let status = Command::new("mkfifo").arg(&path).status().unwrap();
                assert!(status.success());
            }
            Override::Symlink(target) => symlink(target, &path).unwrap(),
        }
        Root { dir }
    }

    /// Run `argv` inside the root: `env -i VARS... argv` (a fresh environment, as an SSH login
    /// or cron builds one), optionally as another user, with the library via `via`.
    fn run(&self, user: Option<&str>, vars: &[&str], argv: &[&str]) -> Outcome {
        self.run_via(Via::LdSoPreload, user, vars, argv)
    }

    fn run_via(&self, via: Via, user: Option<&str>, vars: &[&str], argv: &[&str]) -> Outcome {
        let root = self.dir.path();
        let mut inner: Vec<String> = vec!["/usr/bin/env".into(), "-i".into()];
        if let Via::LdPreload = via {
            inner.push("LD_PRELOAD=/hook/libhami_preload.so".into());
        }
        inner.extend(vars.iter().map(|v| (*v).to_owned()));
        inner.extend(argv.iter().map(|a| (*a).to_owned()));
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--", "/bin/sh", "-c"])
            .arg(
                "set -e; root=$1; shift; mount --bind -o ro /usr \"$root/usr\"; \
                 mount --bind /dev/null \"$root/dev/null\" 2>/dev/null || true; \
                 exec chroot $USERSPEC \"$root\" \"$@\"",
            )
            .arg("sh")
            .arg(root)
            .args(&inner)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env(
                "USERSPEC",
                user.map(|u| format!("--userspec={u}")).unwrap_or_default(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        fs::write(root.join("dev/null"), b"").unwrap();
        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn unshare (util-linux)");
        let deadline = Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{argv:?} did not finish in {deadline:?} (blocked on /overrideEnv?)");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut stdout = String::new();
        let mut stderr = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(
            !stderr.contains("unshare:")
                && !stderr.contains("mount:")
                && !stderr.contains("chroot:"),
            "the test root could not be set up (these tests need root for a private mount namespace): {stderr}"
        );
        Outcome {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// The probe's environment lines (its first output block), sorted.
    fn env(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .take_while(|l| !l.starts_with("--"))
            .collect()
    }

    fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "{self:#?}");
        assert_eq!(self.stderr, "", "the library printed something: {self:#?}");
        self
    }
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

fn assert_env(out: &Outcome, want: &[&str]) {
    assert_eq!(out.env(), sorted(want), "{out:#?}");
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn hami_file_becomes_the_environment_of_a_process_with_none() {
    let root = Root::new(Override::File(HAMI_FILE.as_bytes()), Via::LdSoPreload);
    assert_env(root.run(None, &[], &["/probe"]).ok(), HAMI_ENV);
    // Through LD_PRELOAD instead of /etc/ld.so.preload: the same.
    let root = Root::new(Override::File(HAMI_FILE.as_bytes()), Via::LdPreload);
    let mut want = HAMI_ENV.to_vec();
    want.push("LD_PRELOAD=/hook/libhami_preload.so");
    assert_env(
        root.run_via(Via::LdPreload, None, &[], &["/probe"]).ok(),
        &want,
    );
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn inherited_contract_variables_cannot_lift_the_cap() {
    let root = Root::new(Override::File(KAI_FILE.as_bytes()), Via::LdSoPreload);
    let mut vars = SPOOF.to_vec();
    vars.extend(["FOO=bar", "PATH=/usr/bin", "HOME=/root"]);
    let out = root.run(None, &vars, &["/probe"]);
    assert_env(
        out.ok(),
        &[
            "CUDA_DEVICE_MEMORY_LIMIT=3000m",
            "FOO=bar",
            "HOME=/root",
            "PATH=/usr/bin",
        ],
    );
    // HAMi file with the same spoofs: the file's variables, nothing inherited of the contract.
    let root = Root::new(Override::File(HAMI_FILE.as_bytes()), Via::LdSoPreload);
    let mut want = HAMI_ENV.to_vec();
    want.push("FOO=bar");
    let mut vars = SPOOF.to_vec();
    vars.push("FOO=bar");
    assert_env(root.run(None, &vars, &["/probe"]).ok(), &want);
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn keys_outside_the_contract_never_reach_the_environment() {
    let file = "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nLD_LIBRARY_PATH=/evil\nLD_PRELOAD=/evil.so\n\
PATH=/evil\nHOME=/evil\nCUDA_DEVICE_MEMORY_LIMIT_16=1m\nCUDA_DEVICE_MEMORY_LIMIT_01=1m\n\
SOME_FUTURE_KEY=x\nHAMI_LIMITS_FORMAT=1\n";
    let root = Root::new(Override::File(file.as_bytes()), Via::LdSoPreload);
    let out = root.run(None, &["PATH=/usr/bin", "TERM=xterm"], &["/probe"]);
    assert_env(
        out.ok(),
        &[
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m",
            "PATH=/usr/bin",
            "TERM=xterm",
        ],
    );
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn no_usable_file_leaves_the_environment_untouched() {
    let mut huge = b"X=1\n".repeat(4096); // 16 KiB of other keys first
    huge.extend_from_slice(b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    let cases: Vec<(&str, Override<'_>)> = vec![
        ("missing", Override::Missing),
        ("empty", Override::File(b"")),
        ("directory", Override::Directory),
        ("fifo", Override::Fifo),
        ("character device", Override::Symlink("/dev/null")),
        ("dangling symlink", Override::Symlink("/nowhere")),
        ("garbage", Override::File(&garbage)),
        (
            "no memory limit",
            Override::File(b"CUDA_DEVICE_SM_LIMIT=10\nHAMI_LIMITS_FORMAT=1\n"),
        ),
        (
            "memory 0 means no limit",
            Override::File(b"CUDA_DEVICE_MEMORY_LIMIT_0=0\n"),
        ),
        (
            "memory garbage",
            Override::File(b"CUDA_DEVICE_MEMORY_LIMIT=lots\n"),
        ),
        ("memory line beyond the bound", Override::File(&huge)),
        ("one huge line", Override::File(&[b'A'; 100_000])),
    ];
    let vars = [
        "CUDA_DEVICE_MEMORY_LIMIT_0=16g",
        "CUDA_DEVICE_SM_LIMIT=30",
        "FOO=bar",
    ];
    for (what, over) in cases {
        let root = Root::new(over, Via::LdSoPreload);
        let out = root.run(None, &vars, &["/probe"]);
        assert_eq!(out.code, Some(0), "{what}: {out:#?}");
        assert_eq!(out.stderr, "", "{what}: {out:#?}");
        assert_eq!(out.env(), sorted(&vars), "{what}");
    }
    // A file only root can read, for a process of another user.
    let root = Root::new(
        Override::Mode(HAMI_FILE.as_bytes(), 0o600),
        Via::LdSoPreload,
    );
    let out = root.run(Some("65534:65534"), &vars, &["/probe"]);
    assert_eq!(out.env(), sorted(&vars), "unreadable: {out:#?}");
    assert_eq!(out.stderr, "");
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn the_reader_is_tolerant_like_hami_limits_check() {
    let cases: &[(&str, &[u8])] = &[
        (
            "first line without '='",
            b"oops this line has no equals\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\nHAMI_LIMITS_FORMAT=1\n",
        ),
        (
            "comment and blank line",
            b"# hand-edited\n\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\n",
        ),
        ("CRLF", b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\r\nHAMI_LIMITS_FORMAT=1\r\n"),
        ("no final newline", b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m"),
        (
            "a later duplicate wins",
            b"CUDA_DEVICE_MEMORY_LIMIT_0=9000m\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\n",
        ),
        (
            "bad and NUL lines skipped",
            b"lower=1\nCUDA_DEVICE_SM\0_LIMIT=1\n\xff\xfe=1\nCUDA_DEVICE_MEMORY_LIMIT_0=3000m\n",
        ),
    ];
    for (what, bytes) in cases {
        let root = Root::new(Override::File(bytes), Via::LdSoPreload);
        let out = root.run(None, &["CUDA_DEVICE_MEMORY_LIMIT_0=16g"], &["/probe"]);
        assert_eq!(out.code, Some(0), "{what}: {out:#?}");
        assert_eq!(out.stderr, "", "{what}");
        assert_eq!(
            out.env(),
            vec!["CUDA_DEVICE_MEMORY_LIMIT_0=3000m"],
            "{what}"
        );
    }
    // A huge file whose first lines hold the limit: read, bounded, and the cut line dropped.
    let mut huge = b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n".to_vec();
    huge.extend(b"CUDA_DEVICE_MEMORY_LIMIT_1=3000m\n".repeat(400_000)); // ~13 MiB
    let root = Root::new(Override::File(&huge), Via::LdSoPreload);
    let started = Instant::now();
    let out = root.run(None, &[], &["/probe"]);
    out.ok();
    assert!(out.env().contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=3000m"));
    assert!(out.env().contains(&"CUDA_DEVICE_MEMORY_LIMIT_1=3000m"));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn threads_exec_and_shells_all_see_the_file() {
    let root = Root::new(Override::File(HAMI_FILE.as_bytes()), Via::LdSoPreload);
    // A multi-threaded program: every thread sees the same environment.
    let out = root.run(None, &[], &["/probe", "--threads", "8"]);
    out.ok();
    assert_env(&out, HAMI_ENV);
    assert!(out.lines().contains(&"--threads 8 agree=true"), "{out:#?}");
    // A program that execs another with a fresh environment: the new image loads the library again.
    let out = root.run(
        None,
        &["CUDA_DEVICE_MEMORY_LIMIT_0=16g"],
        &["/probe", "--exec", "/usr/bin/env", "-i", "/probe"],
    );
    out.ok();
    let lines = out.lines();
    assert_eq!(lines.len(), 2 * HAMI_ENV.len(), "{out:#?}");
    assert_eq!(lines[..3], lines[3..]);
    assert_eq!(lines[..3].to_vec(), HAMI_ENV.to_vec());
    // A shell and what it starts; the exit status is the program's own.
    let out = root.run(
        None,
        &["CUDA_DEVICE_MEMORY_LIMIT_0=16g"],
        &[
            "/bin/sh",
            "-c",
            "echo \"$CUDA_DEVICE_MEMORY_LIMIT_0\"; /usr/bin/env | grep -c '^CUDA_DEVICE_MEMORY_LIMIT_0=3000m$'; exit 7",
        ],
    );
    assert_eq!(out.code, Some(7), "{out:#?}");
    assert_eq!(out.stderr, "");
    assert_eq!(out.lines(), vec!["3000m", "1"]);
    // A login shell, as SSH starts one (bash reads /etc/profile and friends, absent here).
    let out = root.run(
        None,
        &[],
        &[
            "/bin/bash",
            "--login",
            "-c",
            "printf '%s\\n' \"$CUDA_DEVICE_MEMORY_LIMIT_0\"",
        ],
    );
    assert_eq!(out.lines(), vec!["3000m"], "{out:#?}");
    // Another user (the file is 0644, as the device plugin publishes it).
    let out = root.run(Some("65534:65534"), &[], &["/probe"]);
    assert_env(out.ok(), HAMI_ENV);
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn diagnostics_only_when_asked_and_never_in_secure_mode() {
    let root = Root::new(Override::File(HAMI_FILE.as_bytes()), Via::LdSoPreload);
    let out = root.run(None, &["HAMI_PRELOAD_DEBUG=1"], &["/probe"]);
    assert_eq!(out.code, Some(0));
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{out:#?}");
    assert!(
        lines[0].starts_with("hami-preload: applied the limits file: set 3, removed 0 inherited"),
        "{out:#?}"
    );
    let mut want = HAMI_ENV.to_vec();
    want.push("HAMI_PRELOAD_DEBUG=1");
    assert_env(&out, &want);
    // Other values do not turn it on.
    let out = root.run(None, &["HAMI_PRELOAD_DEBUG=yes"], &["/probe"]);
    assert_eq!(out.stderr, "");
    // A setuid program (secure-execution mode, as sudo and su run): the variable is ignored, the
    // file is still applied.
    let suid = root.dir.path().join("suid-probe");
    fs::copy(PROBE, &suid).unwrap();
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o4755)).unwrap();
    let out = root.run(
        Some("65534:65534"),
        &["HAMI_PRELOAD_DEBUG=1", "CUDA_DEVICE_MEMORY_LIMIT_0=16g"],
        &["/suid-probe"],
    );
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert_eq!(out.stderr, "", "secure mode must stay silent: {out:#?}");
    assert_env(&out, &want);
}

/// A KAI `gpu-fraction: "0.5"` container's file as the webhook writes it: the admission-time cap
/// (half of the smallest card the pod could land on, 81,559 MiB) and the per-node keys.
const KAI_FRACTION_FILE: &str = "CUDA_DEVICE_MEMORY_LIMIT=40779m\nHAMI_GPU_FRACTION=0.5\n\
HAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/hook/node-gpus\n";
/// A node with an 80 GiB card (minor 0, 81,559 MiB) and a 141 GiB H200 (minor 3, 143,771 MiB as
/// NVML reports it).
const NODE_80_141: &str = "HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=81559\nNVIDIA0_UUID=GPU-a100\n\
NVIDIA3_MIB=143771\nNVIDIA3_UUID=GPU-h200\n";

/// What sits at `/dev/<name>` in the test root.
enum Dev {
    /// A character device `major:minor`.
    Char(&'static str, u32, u32),
    /// A regular file.
    File(&'static str),
}

impl Root {
    fn with_node(file: &str, node: Option<&[u8]>, devs: &[Dev]) -> Root {
        let root = Root::new(Override::File(file.as_bytes()), Via::LdSoPreload);
        let r = root.dir.path();
        if let Some(node) = node {
            fs::write(r.join("hook/node-gpus"), node).unwrap();
            fs::set_permissions(r.join("hook/node-gpus"), fs::Permissions::from_mode(0o444))
                .unwrap();
        }
        for d in devs {
            match d {
                Dev::Char(name, major, minor) => {
                    let status = Command::new("mknod")
                        .arg(r.join("dev").join(name))
                        .args(["c", &major.to_string(), &minor.to_string()])
                        .status()
                        .unwrap();
                    assert!(status.success(), "mknod {name} (needs root)");
                }
                Dev::File(name) => fs::write(r.join("dev").join(name), b"").unwrap(),
            }
        }
        root
    }
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn a_fraction_is_sized_to_the_gpus_the_container_sees() {
    let node = Some(NODE_80_141.as_bytes());
    let nv0 = Dev::Char("nvidia0", 195, 0);
    let nv3 = || Dev::Char("nvidia3", 195, 3);
    let ctl = || Dev::Char("nvidiactl", 195, 255);
    /// What, the node file, the devices, the cap wanted.
    type Case<'a> = (&'a str, Option<&'a [u8]>, Vec<Dev>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        ("the 141 GiB card", node, vec![ctl(), nv3()], "71885m"),
        (
            "the 80 GiB card",
            node,
            vec![ctl(), Dev::Char("nvidia0", 195, 0)],
            "40779m",
        ),
        ("both cards: the smaller", node, vec![nv0, nv3()], "40779m"),
        (
            "no node file: the admission-time cap",
            None,
            vec![nv3()],
            "40779m",
        ),
        (
            "malformed node file",
            Some(b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA3_MIB=143,771\n"),
            vec![nv3()],
            "40779m",
        ),
        (
            "node file of another format",
            Some(b"HAMI_NODE_GPUS_FORMAT=2\nNVIDIA3_MIB=143771\n"),
            vec![nv3()],
            "40779m",
        ),
        ("no device node", node, vec![ctl()], "40779m"),
        (
            "a visible GPU the file does not list",
            node,
            vec![nv3(), Dev::Char("nvidia5", 195, 5)],
            "40779m",
        ),
        (
            "a regular file named nvidia3",
            node,
            vec![Dev::File("nvidia3")],
            "40779m",
        ),
        (
            "nvidia3 that is 195:0",
            node,
            vec![Dev::Char("nvidia3", 195, 0)],
            "40779m",
        ),
        (
            "nvidia3 of another major",
            node,
            vec![Dev::Char("nvidia3", 1, 3)],
            "40779m",
        ),
    ];
    // Variables a user could set to lift or move the cap: none counts.
    let mut vars: Vec<&str> = SPOOF.to_vec();
    vars.extend(["NVIDIA_VISIBLE_DEVICES=GPU-a100", "HAMI_GPU_FRACTION=0.99"]);
    for (what, node_file, devs, want) in cases {
        let root = Root::with_node(KAI_FRACTION_FILE, node_file, &devs);
        let out = root.run(None, &vars, &["/probe"]);
        out.ok();
        let want_line = format!("CUDA_DEVICE_MEMORY_LIMIT={want}");
        let mut expected = vec![
            want_line.as_str(),
            "NVIDIA_VISIBLE_DEVICES=GPU-a100",
            "HAMI_GPU_FRACTION=0.99",
        ];
        expected.sort();
        assert_eq!(out.env(), expected, "{what}: {out:#?}");
        // An SSH-like login (nothing inherited) and another user get the same cap.
        let login = root.run(
            Some("65534:65534"),
            &[],
            &[
                "/bin/sh",
                "-c",
                "printf '%s\\n' \"$CUDA_DEVICE_MEMORY_LIMIT\"",
            ],
        );
        assert_eq!(login.ok().lines(), vec![want], "{what} (as nobody)");
    }
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn the_per_node_step_says_what_it_did_when_asked() {
    let root = Root::with_node(
        KAI_FRACTION_FILE,
        Some(NODE_80_141.as_bytes()),
        &[Dev::Char("nvidia3", 195, 3)],
    );
    let out = root.run(None, &["HAMI_PRELOAD_DEBUG=1"], &["/probe"]);
    assert_eq!(
        out.stderr,
        "hami-preload: applied the limits file: set 1, removed 0 inherited, skipped 0 line(s); \
         per-node cap 71885 MiB (smallest of 1 visible GPU(s): 143771 MiB) (/overrideEnv)\n"
    );
    // The same line as the reference decision's summary, over the same inputs.
    let mut visible = hami_preload_reference::VisibleGpus::new();
    visible.add(3);
    let reference = hami_preload_reference::decide_on_node(
        KAI_FRACTION_FILE.as_bytes(),
        false,
        Vec::<std::ffi::OsString>::new(),
        &hami_preload_reference::NodeView {
            node_file: Ok(NODE_80_141.as_bytes()),
            devices: Ok(visible),
        },
    );
    assert_eq!(
        out.stderr,
        format!("{} (/overrideEnv)\n", reference.summary())
    );
    let root = Root::with_node(KAI_FRACTION_FILE, None, &[Dev::Char("nvidia3", 195, 3)]);
    let out = root.run(None, &["HAMI_PRELOAD_DEBUG=1"], &["/probe"]);
    assert!(
        out.stderr
            .ends_with("; admission-time cap kept: no node GPU file (/overrideEnv)\n"),
        "{out:#?}"
    );
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn the_environment_stays_a_normal_one() {
    let root = Root::new(Override::File(HAMI_FILE.as_bytes()), Via::LdSoPreload);
    // setenv and unsetenv over the array the library built.
    let out = root.run(
        None,
        &["FOO=bar", "CUDA_DEVICE_MEMORY_LIMIT_0=16g"],
        &[
            "/probe",
            "--set",
            "NEW=1",
            "--set",
            "FOO=baz",
            "--unset",
            "CUDA_DEVICE_SM_LIMIT",
        ],
    );
    let mut want: Vec<&str> = HAMI_ENV
        .iter()
        .copied()
        .filter(|v| !v.starts_with("CUDA_DEVICE_SM_LIMIT="))
        .collect();
    want.extend(["FOO=baz", "NEW=1"]);
    assert_env(out.ok(), &want);
    // More variables than the library's own array holds (1,024): the slower path, same result.
    let many: Vec<String> = (0..1500).map(|i| format!("V{i}=x")).collect();
    let mut vars: Vec<&str> = many.iter().map(String::as_str).collect();
    vars.extend(SPOOF);
    let out = root.run(None, &vars, &["/probe"]);
    let env = out.ok().env();
    assert_eq!(env.len(), 1500 + HAMI_ENV.len(), "{}", env.len());
    for v in HAMI_ENV {
        assert!(env.contains(v), "{v}");
    }
    assert!(!env.iter().any(|e| e.starts_with("CUDA_TASK_PRIORITY")));
}

#[test]
#[ignore = "needs root (a private mount namespace and chroot): run by scripts/test-all (see docs/development.md)"]
fn a_fraction_with_a_limits_file_of_more_than_4_kib() {
    // The node GPU file is read after the limits file's bytes when they leave room, else into a
    // buffer of its own: the same cap either way.
    let padded = format!("X_PAD={}\n{KAI_FRACTION_FILE}", "p".repeat(4500));
    for file in [KAI_FRACTION_FILE.to_owned(), padded] {
        let root = Root::with_node(
            &file,
            Some(NODE_80_141.as_bytes()),
            &[Dev::Char("nvidia3", 195, 3)],
        );
        let out = root.run(None, &[], &["/probe"]);
        assert_eq!(
            out.ok().env(),
            vec!["CUDA_DEVICE_MEMORY_LIMIT=71885m"],
            "{} bytes",
            file.len()
        );
    }
}

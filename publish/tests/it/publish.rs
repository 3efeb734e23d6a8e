//! Atomic publication under SIGKILL, failure cases, and the umask.
//!
//! Child processes are this test binary re-executed with `HAMI_PUBLISH_TEST_CHILD=<role>:<dir>`
//! and `--exact <test name>`: the test function sees the variable and plays the child's role.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hami_publish::{PublishError, is_temp_file_name, publish_atomic, sweep_temp_files};

const CHILD_ENV: &str = "HAMI_PUBLISH_TEST_CHILD";
const READY: &str = "HAMI-CHILD-READY";
const FILE: &str = "pod_ctr.limits";

/// `Some((role, dir))` when this process is a re-executed child.
fn child_role() -> Option<(String, PathBuf)> {
    let v = std::env::var(CHILD_ENV).ok()?;
    let (role, dir) = v.split_once(':')?;
    Some((role.to_owned(), PathBuf::from(dir)))
}

fn self_command(test_name: &str, role: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{role}:{}", dir.display()));
    cmd
}

/// Two different complete contents of different lengths, so a torn or truncated file matches neither.
fn contents() -> (Vec<u8>, Vec<u8>) {
    let line_a = b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n";
    let line_b = b"CUDA_DEVICE_MEMORY_LIMIT_0=70000m\n";
    let a: Vec<u8> = line_a
        .iter()
        .copied()
        .cycle()
        .take(line_a.len() * 20_000)
        .collect();
    let b: Vec<u8> = line_b
        .iter()
        .copied()
        .cycle()
        .take(line_b.len() * 15_000)
        .collect();
    (a, b)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// A small xorshift generator: random kill moments without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn wait_ready(child: &mut Child) {
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            // libtest prints "test <name> ... " without a newline before the child speaks.
            Some(Ok(l)) if l.ends_with(READY) => return,
            Some(Ok(_)) => {}
            other => panic!("child exited before it was ready: {other:?}"),
        }
    }
}

#[test]
fn publish_survives_sigkill_at_random_moments() {
    const TEST: &str = "publish::publish_survives_sigkill_at_random_moments";
    let (a, b) = contents();
    if let Some((role, dir)) = child_role() {
        assert_eq!(role, "publish-loop");
        publish_atomic(&dir, FILE, &a).unwrap();
        println!("{READY}");
        loop {
            publish_atomic(&dir, FILE, &b).unwrap();
            publish_atomic(&dir, FILE, &a).unwrap();
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    let (mut saw_a, mut saw_b, mut leftovers) = (0, 0, 0);
    const KILLS: usize = 220;
    for round in 0..KILLS {
        let mut child = self_command(TEST, "publish-loop", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Readiness: the first complete publication has happened.
        wait_ready(&mut child);
        std::thread::sleep(Duration::from_micros(rng.next() % 8_000));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let got = fs::read(dir.path().join(FILE)).unwrap();
        if got == a {
            saw_a += 1;
        } else if got == b {
            saw_b += 1;
        } else {
            panic!(
                "round {round} (seed {seed}): file is neither complete content ({} bytes)",
                got.len()
            );
        }
        let temps = names_in(dir.path())
            .into_iter()
            .filter(|n| is_temp_file_name(n))
            .count();
        leftovers += temps;
        assert_eq!(
            sweep_temp_files(dir.path()).unwrap(),
            temps,
            "round {round}"
        );
        assert_eq!(
            names_in(dir.path()),
            [FILE],
            "round {round}: something left after the sweep"
        );
    }
    eprintln!(
        "{KILLS} SIGKILLs (seed {seed}): {saw_a} times content A, {saw_b} times content B, \
         {leftovers} temporary files swept"
    );
}

#[test]
fn mode_is_0644_whatever_the_umask() {
    const TEST: &str = "publish::mode_is_0644_whatever_the_umask";
    if let Some((role, dir)) = child_role() {
        let umask = fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_owned()))
            .unwrap();
        assert_eq!(
            format!("umask-{umask}"),
            role,
            "the umask did not reach the child"
        );
        publish_atomic(&dir, FILE, b"HAMI_LIMITS_FORMAT=1\n").unwrap();
        return;
    }
    for umask in ["0000", "0022", "0077", "0777"] {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let inner = self_command(TEST, &format!("umask-{umask}"), dir.path());
        // Set the umask in a shell and exec the child: the umask is per process, and changing it
        // here would race with the other tests' threads.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
            .arg(exe)
            .args(inner.get_args())
            .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "child under umask {umask} failed");
        let mode = fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o644, "umask {umask}: mode {mode:o}");
        assert_eq!(names_in(dir.path()), [FILE]);
    }
}

#[test]
fn missing_directory_is_an_error_naming_the_path_and_leaves_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("containers");
    let err = publish_atomic(&missing, FILE, b"x\n").unwrap_err();
    assert!(matches!(err, PublishError::CreateTemp { .. }), "{err}");
    assert!(err.path().starts_with(&missing));
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
    assert!(!missing.exists(), "the directory must not be created");
    assert!(names_in(parent.path()).is_empty());
}

#[test]
fn parent_that_is_a_regular_file_is_an_error() {
    let parent = tempfile::tempdir().unwrap();
    let not_dir = parent.path().join("vgpu");
    fs::write(&not_dir, "a file, not a directory").unwrap();
    let err = publish_atomic(&not_dir, FILE, b"x\n").unwrap_err();
    assert!(matches!(err, PublishError::CreateTemp { .. }), "{err}");
    assert!(
        err.to_string().contains(&not_dir.display().to_string()),
        "{err}"
    );
    assert_eq!(names_in(parent.path()), ["vgpu"]);
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// Removes the immutable flag again, even when an assertion fails.
struct Immutable(PathBuf);
impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// A directory mounted read-only by the system (sysfs, procfs or cgroup mounted `ro`, as in an
/// unprivileged container), if there is one.
fn read_only_system_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (mount, fs_part) = line.split_once(" - ")?;
        let fields: Vec<&str> = mount.split_whitespace().collect();
        let (point, options) = (fields.get(4)?, fields.get(5)?);
        let fstype = fs_part.split_whitespace().next()?;
        let read_only = options.split(',').any(|o| o == "ro");
        let system = matches!(fstype, "sysfs" | "proc" | "cgroup" | "cgroup2");
        (read_only && system && Path::new(point).is_dir()).then(|| PathBuf::from(point))
    })
}

/// A directory in which even this process cannot create a file, and how it was made.
///
/// Tests usually run as root, and root ignores a directory's mode bits (CAP_DAC_OVERRIDE), so
/// `chmod 0555` does not make a directory read-only for us. What really stops root:
/// 1. the immutable attribute (`chattr +i`, needs CAP_LINUX_IMMUTABLE and a file system with
///    attributes): not even root may create a file in an immutable directory;
/// 2. a read-only mount (EROFS), such as the `ro` sysfs/cgroup mounts of an unprivileged container,
///    where CAP_LINUX_IMMUTABLE is missing.
///
/// A non-root run simply uses mode 0555. With none of these, the test fails loudly.
enum ReadOnlyDir {
    Immutable(Immutable),
    ModeBits(PathBuf),
    SystemMount(PathBuf),
}

impl ReadOnlyDir {
    fn make(fresh: &Path) -> ReadOnlyDir {
        if !is_root() {
            fs::set_permissions(fresh, fs::Permissions::from_mode(0o555)).unwrap();
            return ReadOnlyDir::ModeBits(fresh.to_path_buf());
        }
        let immutable = Command::new("chattr")
            .arg("+i")
            .arg(fresh)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if immutable {
            return ReadOnlyDir::Immutable(Immutable(fresh.to_path_buf()));
        }
        match read_only_system_mount() {
            Some(p) => ReadOnlyDir::SystemMount(p),
            None => panic!(
                "cannot make a directory read-only for root here: `chattr +i` failed (needs e2fsprogs, \
                 CAP_LINUX_IMMUTABLE and a file system with attributes) and no read-only mount exists"
            ),
        }
    }

    fn path(&self) -> &Path {
        match self {
            ReadOnlyDir::Immutable(Immutable(p))
            | ReadOnlyDir::ModeBits(p)
            | ReadOnlyDir::SystemMount(p) => p,
        }
    }
}

impl Drop for ReadOnlyDir {
    fn drop(&mut self) {
        if let ReadOnlyDir::ModeBits(p) = self {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
        }
    }
}

#[test]
fn read_only_directory_is_an_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("containers");
    fs::create_dir(&fresh).unwrap();
    fs::write(fresh.join("old.limits"), "HAMI_LIMITS_FORMAT=1\n").unwrap();
    let ro = ReadOnlyDir::make(&fresh);
    let ro_path = ro.path().to_path_buf();
    eprintln!("read-only directory: {}", ro_path.display());
    let before = names_in(&ro_path);
    assert!(
        fs::write(ro_path.join("hami-limits-probe"), "x").is_err(),
        "{} is not read-only after all",
        ro_path.display()
    );

    let err = publish_atomic(&ro_path, FILE, b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n").unwrap_err();
    assert!(matches!(err, PublishError::CreateTemp { .. }), "{err}");
    assert!(
        err.to_string().contains(&ro_path.display().to_string()),
        "{err}"
    );
    assert_eq!(names_in(&ro_path), before, "something was left behind");
    if !matches!(ro, ReadOnlyDir::SystemMount(_)) {
        // Replacing an existing file fails the same way and leaves it untouched.
        let err = publish_atomic(&ro_path, "old.limits", b"new\n").unwrap_err();
        assert!(matches!(err, PublishError::CreateTemp { .. }), "{err}");
        assert_eq!(names_in(&ro_path), ["old.limits"]);
        assert_eq!(
            fs::read_to_string(ro_path.join("old.limits")).unwrap(),
            "HAMI_LIMITS_FORMAT=1\n"
        );
    }
}

//! `hami-limits region` end to end, through the built binary, over a containers folder laid out
//! as the device plugin lays it out, with regions written in HAMi-core's layout.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hami_shared::region::fixture::{FixtureSlot, RegionFixture};
use hami_shared::region::layout::{V1_1, V1_2};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hami-limits");
const MIB: u64 = 1 << 20;
const CAP: &str =
    "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_SM_LIMIT=30\nHAMI_LIMITS_FORMAT=1\n";

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// `containers/<name>/usage.cache` (absent when `region` is `None`) and `containers/<name>.limits`.
fn container(containers: &Path, name: &str, region: Option<Vec<u8>>, limits: &str) {
    let dir = containers.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(bytes) = region {
        std::fs::write(dir.join("usage.cache"), bytes).unwrap();
    }
    std::fs::write(containers.join(format!("{name}.limits")), limits).unwrap();
}

fn stamped(limit0: u64, sm0: u64) -> RegionFixture {
    let mut f = RegionFixture::new(&V1_2);
    f.device_num = 1;
    f.limit[0] = limit0;
    f.sm_limit[0] = sm0;
    // The test's own PID as host PID: alive while the command runs.
    let me = i32::try_from(std::process::id()).unwrap();
    f.procs = vec![FixtureSlot::running(7, me, 0, 518 * MIB, 1518 * MIB)];
    f
}

fn node(dir: &Path) {
    container(
        dir,
        "uid1_capped",
        Some(stamped(3000 * MIB, 30).bytes()),
        CAP,
    );
    container(dir, "uid2_uncapped", Some(stamped(0, 100).bytes()), CAP);
    container(
        dir,
        "uid3_mismatch",
        Some(stamped(1000 * MIB, 30).bytes()),
        CAP,
    );
    container(dir, "uid4_none", Some(Vec::new()), CAP);
    container(
        dir,
        "uid5_torn",
        Some(stamped(3000 * MIB, 30).bytes()[..5000].to_vec()),
        CAP,
    );
    let mut stale = stamped(3000 * MIB, 30);
    stale.procs[0].hostpid = i32::MAX; // above pid_max: no such process
    container(dir, "uid6_stale", Some(stale.bytes()), CAP);
}

#[test]
fn a_node_folder_gets_every_verdict_in_json_and_text() {
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());
    let o = run(&["region", tmp.path().to_str().unwrap(), "--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let got: Vec<(String, String)> = v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["container"].as_str().unwrap().to_owned(),
                c["verdict"]["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("uid1_capped", "capped"),
        ("uid2_uncapped", "uncapped"),
        ("uid3_mismatch", "mismatch"),
        ("uid4_none", "no-region"),
        ("uid5_torn", "unreadable"),
        ("uid6_stale", "stale"),
    ];
    assert_eq!(
        got,
        want.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect::<Vec<_>>()
    );
    let capped = &v["containers"][0];
    assert_eq!(capped["region"]["limit"][0], 3000 * MIB);
    assert_eq!(capped["region"]["layout"]["version"], "1.2");
    assert_eq!(capped["verdict"]["gpus"][0]["used"], 1518 * MIB);
    assert_eq!(capped["verdict"]["gpus"][0]["stamped_sm"], 30);
    assert!(
        v["containers"][4]["error"]["kind"]["error"]
            .as_str()
            .unwrap()
            .contains("too-short")
    );

    let o = run(&["region", tmp.path().to_str().unwrap()]);
    let text = stdout(&o);
    assert!(text.contains("container uid2_uncapped: uncapped"), "{text}");
    assert!(
        text.contains("stamped 0 (no limit) while the file says 3000 MiB"),
        "{text}"
    );
    assert!(text.contains("slot 0: pid 7, host pid"), "{text}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("6 container(s)"));
}

#[test]
fn one_container_folder_or_file_and_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    node(tmp.path());
    let dir = tmp.path().join("uid1_capped");
    let o = run(&["region", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("container uid1_capped: capped"));
    let file = dir.join("usage.cache");
    let o = run(&["region", file.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0));
    // A version 1.1 region (HAMi v2.8's HAMi-core) reads the same.
    let mut old = stamped(3000 * MIB, 30);
    old.layout = &V1_1;
    old.version = (1, 1);
    std::fs::write(&file, old.bytes()).unwrap();
    let o = run(&["region", file.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["containers"][0]["region"]["layout"]["version"], "1.1");
    assert_eq!(v["containers"][0]["verdict"]["verdict"], "capped");
    let o = run(&["region", tmp.path().join("absent").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_link_or_fifo_as_usage_cache_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path();
    container(c, "uid1_link", None, CAP);
    std::fs::write(c.join("target"), stamped(3000 * MIB, 30).bytes()).unwrap();
    symlink(c.join("target"), c.join("uid1_link/usage.cache")).unwrap();
    container(c, "uid2_fifo", None, CAP);
    let made = Command::new("mkfifo")
        .arg(c.join("uid2_fifo/usage.cache"))
        .status()
        .unwrap();
    assert!(made.success());
    let start = Instant::now();
    let o = run(&["region", c.to_str().unwrap()]);
    assert!(start.elapsed() < Duration::from_secs(10));
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("container uid1_link: unreadable"), "{text}");
    assert!(text.contains("a symbolic link: refused"), "{text}");
    assert!(text.contains("container uid2_fifo: unreadable"), "{text}");
    assert!(text.contains("a fifo, not a regular file"), "{text}");
    // The link named directly is refused too.
    let o = run(&["region", c.join("uid1_link/usage.cache").to_str().unwrap()]);
    assert!(stdout(&o).contains("a symbolic link: refused"));
}

#[test]
fn layout_prints_the_offsets_assumed() {
    let o = run(&["region", "--layout"]);
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["magic_flag"], 19_920_718);
    assert_eq!(v["layouts"][1]["version"], "1.2");
    assert_eq!(v["layouts"][1]["size"], 2_008_952);
    assert_eq!(v["layouts"][1]["offsets"]["proc_num"], 2_008_896);
    assert_eq!(v["layouts"][1]["offsets"]["slot"]["seqlock"], 1936);
}

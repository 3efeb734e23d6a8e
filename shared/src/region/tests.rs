use std::collections::BTreeMap;
use std::os::unix::fs::symlink;

use super::fixture::{FixtureSlot, RegionFixture};
use super::layout::{
    DEVICE_COUNT, LAYOUTS, MAGIC_FLAG, TRANSIENT_V1_1_SIZE, V1_1, V1_2, V1_REGION_SIZE,
};
use super::*;

const MIB: u64 = 1 << 20;

fn entries(text: &str) -> BTreeMap<String, String> {
    crate::limits_file::parse(text).entries
}

fn file(text: &str) -> FileLimits {
    FileLimits::from_entries(&entries(text), None)
}

fn read(bytes: &[u8]) -> Result<Region, RegionError> {
    parse(bytes).map_err(|e| RegionError {
        path: "usage.cache".to_owned(),
        kind: RegionErrorKind::Parse(e),
    })
}

fn alive(_: &ProcSlot) -> Liveness {
    Liveness::Alive
}

#[test]
fn both_layouts_round_trip_every_field() {
    for layout in LAYOUTS {
        let mut f = RegionFixture::new(layout).with_limit_all(3000 * MIB);
        f.device_num = 2;
        f.uuids = vec!["GPU-aaaa".to_owned(), "GPU-bbbb".to_owned()];
        f.sm_limit[1] = 30;
        f.priority = 0;
        f.utilization_switch = 0;
        f.procs = vec![
            FixtureSlot::running(7, 4242, 0, 518 * MIB, 1518 * MIB),
            FixtureSlot::running(9, 0, 1, 518 * MIB, 600 * MIB),
        ];
        let bytes = f.bytes();
        assert_eq!(bytes.len(), V1_REGION_SIZE + 1);
        let r = parse(&bytes).unwrap();
        assert_eq!(r.layout, layout);
        assert_eq!(r.limit, [3000 * MIB; DEVICE_COUNT]);
        assert_eq!((r.sm_limit[0], r.sm_limit[1]), (100, 30));
        assert_eq!(
            r.uuids,
            vec![Some("GPU-aaaa".into()), Some("GPU-bbbb".into())]
        );
        assert_eq!(
            (r.priority, r.utilization_switch, r.recent_kernel),
            (0, 0, 2)
        );
        assert_eq!(r.procs.len(), 2);
        assert_eq!(
            (r.procs[0].pid, r.procs[0].hostpid, r.procs[0].status),
            (7, 4242, 1)
        );
        assert_eq!(r.procs[0].used[0].context, 518 * MIB);
        assert_eq!(r.procs[1].used[1].total, 600 * MIB);
        assert_eq!(
            (r.used(0), r.used(1), r.used(2)),
            (1518 * MIB, 600 * MIB, 0)
        );
        assert_eq!(r.procs[0].seqlock.is_some(), layout.minor == 2);
    }
}

#[test]
fn a_full_slot_table_is_read_and_bounded() {
    let mut f = RegionFixture::new(&V1_2);
    f.procs = (0..1024)
        .map(|i| FixtureSlot::running(i + 1, 0, 0, 1, 1))
        .collect();
    let r = parse(&f.bytes()).unwrap();
    assert_eq!(r.procs.len(), 1024);
    assert_eq!(r.used(0), 1024);
}

#[test]
fn hostile_headers_and_counts_are_errors_naming_what_was_found() {
    let base = RegionFixture::new(&V1_2);
    let cases: Vec<(&str, RegionFixture, &str)> = vec![
        (
            "proc_num negative",
            RegionFixture {
                proc_num: Some(-5),
                ..base.clone()
            },
            "proc_num = -5: accepted 0..=1024",
        ),
        (
            "proc_num huge",
            RegionFixture {
                proc_num: Some(i32::MAX),
                ..base.clone()
            },
            "proc_num = 2147483647: accepted 0..=1024",
        ),
        (
            "proc_num one past the array",
            RegionFixture {
                proc_num: Some(1025),
                ..base.clone()
            },
            "proc_num = 1025",
        ),
        (
            "device_num past 16",
            RegionFixture {
                device_num: u64::MAX,
                ..base.clone()
            },
            "device_num = 18446744073709551615: accepted 0..=16",
        ),
        (
            "unknown minor",
            RegionFixture {
                version: (1, 3),
                ..base.clone()
            },
            "version 1.3 in 2008953 bytes: accepted 1.1 (2008952 bytes + 1), 1.2",
        ),
        (
            "unknown major",
            RegionFixture {
                version: (2, 0),
                ..base.clone()
            },
            "version 2.0",
        ),
        (
            "wrong magic",
            RegionFixture {
                initialized_flag: 0x1234,
                ..base.clone()
            },
            "initialized_flag = 4660: accepted 0 (uninitialised) or 19920718",
        ),
    ];
    for (name, fixture, want) in cases {
        let err = parse(&fixture.bytes()).unwrap_err().to_string();
        assert!(err.contains(want), "{name}: {err}");
    }
}

#[test]
fn truncated_at_every_offset_is_an_error_never_a_panic() {
    let mut f = RegionFixture::new(&V1_1).with_limit_all(MIB);
    f.procs = vec![FixtureSlot::running(1, 2, 0, 3, 4)];
    let bytes = f.bytes();
    // Every length: a short file fails at the length check, before any field is read.
    let lengths = 0..=bytes.len();
    for len in lengths {
        let got = parse(&bytes[..len]);
        match len {
            0 => assert_eq!(got, Err(ParseError::Empty)),
            _ if len < V1_REGION_SIZE => {
                let e = got.unwrap_err();
                assert!(matches!(e, ParseError::TooShort { .. }), "{len}: {e}");
            }
            _ => assert!(got.is_ok(), "{len}"),
        }
    }
}

#[test]
fn oversized_transient_and_uninitialised_files() {
    let mut bytes = RegionFixture::new(&V1_2).bytes();
    bytes.resize(V1_REGION_SIZE + READ_MARGIN, 0);
    assert!(parse(&bytes).is_ok(), "within the margin");
    bytes.push(0);
    let e = parse(&bytes).unwrap_err();
    assert!(matches!(e, ParseError::Oversized { .. }), "{e}");

    let mut transient = RegionFixture::new(&V1_1).bytes();
    transient.resize(TRANSIENT_V1_1_SIZE + 1, 0);
    let e = parse(&transient).unwrap_err();
    assert!(matches!(e, ParseError::TransientLayout { .. }), "{e}");
    assert!(e.to_string().contains("1988c5d..b69b1ea"), "{e}");

    let sized = vec![0u8; V1_REGION_SIZE + 1];
    assert_eq!(
        parse(&sized),
        Err(ParseError::NotInitialised {
            length: V1_REGION_SIZE + 1
        })
    );
    assert!(matches!(
        parse(&MAGIC_FLAG.to_le_bytes()),
        Err(ParseError::TooShort { need: 12, .. })
    ));
}

#[test]
fn file_limits_map_the_keys_as_hami_core_reads_them() {
    let f = file(
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_LIMIT_1=2g\nCUDA_DEVICE_SM_LIMIT=30\n\
         CUDA_TASK_PRIORITY=0\nGPU_CORE_UTILIZATION_POLICY=force\nHAMI_LIMITS_FORMAT=1\n",
    );
    assert_eq!(
        (f.memory[0], f.memory[1], f.memory[2]),
        (3000 * MIB, 2048 * MIB, 0)
    );
    assert_eq!(f.indexed.iter().copied().collect::<Vec<_>>(), vec![0, 1]);
    assert!(!f.global_memory);
    assert_eq!((f.sm[0], f.sm[15]), (30, 30));
    assert_eq!(f.priority, 0);
    assert_eq!(f.core_policy, CorePolicyReading::Force);

    let g = file("CUDA_DEVICE_MEMORY_LIMIT=4000m\nCUDA_DEVICE_MEMORY_LIMIT_2=0\n");
    assert_eq!(
        g.memory,
        [4000 * MIB; DEVICE_COUNT],
        "`_2=0` falls back to the global"
    );
    assert_eq!(g.sm, [100; DEVICE_COUNT], "no SM limit stamps 100");
    assert_eq!(g.priority, 1);
    // HAMi-core's grammar: octal, bytes without a suffix.
    assert_eq!(
        file("CUDA_DEVICE_MEMORY_LIMIT=04000m\n").memory[0],
        2048 * MIB
    );
    assert_eq!(file("CUDA_DEVICE_MEMORY_LIMIT=3000Mi\n").memory[0], 3000);

    let kai = "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.5\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n";
    let per_node = FileLimits::from_entries(&entries(kai), Some(81559));
    assert_eq!(per_node.memory[0], 40779 * MIB);
    assert_eq!(
        per_node.memory_basis,
        MemoryBasis::PerNodeFraction {
            fraction: "0.5".into(),
            gpu_mib: 81559
        }
    );
    let unknown = FileLimits::from_entries(&entries(kai), None);
    assert_eq!(unknown.memory[0], 4096 * MIB);
    assert!(matches!(
        unknown.memory_basis,
        MemoryBasis::AdmissionTime { .. }
    ));
}

struct Case {
    name: &'static str,
    region: Result<Region, RegionError>,
    file: Option<&'static str>,
    dead: &'static [i32],
    want: Verdict,
    reason: &'static str,
}

fn region_with(limit0: u64, sm0: u64, procs: Vec<FixtureSlot>) -> Result<Region, RegionError> {
    let mut f = RegionFixture::new(&V1_2);
    f.device_num = 1;
    f.limit[0] = limit0;
    f.sm_limit[0] = sm0;
    f.procs = procs;
    read(&f.bytes())
}

const CAP: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_SM_LIMIT=30\n";

#[test]
fn every_verdict() {
    let running = || vec![FixtureSlot::running(7, 4242, 0, 518 * MIB, 1518 * MIB)];
    let missing = RegionError {
        path: "c/usage.cache".into(),
        kind: RegionErrorKind::Missing,
    };
    let cases = vec![
        Case {
            name: "capped",
            region: region_with(3000 * MIB, 30, running()),
            file: Some(CAP),
            dead: &[],
            want: Verdict::Capped,
            reason: "GPU 0: stamped 3000 MiB",
        },
        Case {
            name: "uncapped: an env-less first writer",
            region: region_with(0, 100, running()),
            file: Some(CAP),
            dead: &[],
            want: Verdict::Uncapped,
            reason: "stamped 0 (no limit) while the file says 3000 MiB",
        },
        Case {
            name: "mismatch: another memory limit",
            region: region_with(1000 * MIB, 30, running()),
            file: Some(CAP),
            dead: &[],
            want: Verdict::Mismatch,
            reason: "stamped 1000 MiB while the file says 3000 MiB",
        },
        Case {
            name: "mismatch: another SM limit",
            region: region_with(3000 * MIB, 100, running()),
            file: Some(CAP),
            dead: &[],
            want: Verdict::Mismatch,
            reason: "SM limit stamped 100 % while the file says 30 %",
        },
        Case {
            name: "no-region: missing file",
            region: Err(missing.clone()),
            file: Some(CAP),
            dead: &[],
            want: Verdict::NoRegion,
            reason: "no such file",
        },
        Case {
            name: "no-region: pre-created empty",
            region: read(&[]),
            file: Some(CAP),
            dead: &[],
            want: Verdict::NoRegion,
            reason: "empty",
        },
        Case {
            name: "stale",
            region: region_with(3000 * MIB, 30, running()),
            file: Some(CAP),
            dead: &[7],
            want: Verdict::Stale,
            reason: "no longer exist (pid [7])",
        },
        Case {
            name: "unreadable",
            region: read(&[1, 2, 3, 4, 5]),
            file: Some(CAP),
            dead: &[],
            want: Verdict::Unreadable,
            reason: "initialized_flag = 67305985",
        },
        Case {
            name: "no-limit: neither holds one",
            region: region_with(0, 100, running()),
            file: Some("CUDA_DEVICE_SM_LIMIT=0\n"),
            dead: &[],
            want: Verdict::NoLimit,
            reason: "neither the file nor the region",
        },
        Case {
            name: "no file: reported, not compared",
            region: region_with(3000 * MIB, 30, running()),
            file: None,
            dead: &[],
            want: Verdict::Capped,
            reason: "no limits file to compare with",
        },
        Case {
            name: "uncapped outranks stale",
            region: region_with(0, 30, running()),
            file: Some(CAP),
            dead: &[7],
            want: Verdict::Uncapped,
            reason: "stamped 0",
        },
    ];
    for c in cases {
        let limits = c.file.map(file);
        let v = judge(c.region.as_ref(), limits.as_ref(), |p: &ProcSlot| {
            if c.dead.contains(&p.pid) {
                Liveness::Dead
            } else {
                Liveness::Alive
            }
        });
        assert_eq!(v.verdict, c.want, "{}: {v:?}", c.name);
        assert!(v.reason.contains(c.reason), "{}: {}", c.name, v.reason);
    }
}

#[test]
fn per_gpu_verdicts_usage_and_utilization() {
    let mut f = RegionFixture::new(&V1_2);
    f.device_num = 2;
    f.limit[0] = 3000 * MIB;
    f.limit[1] = 0;
    f.utilization_switch = 0;
    f.procs = vec![
        FixtureSlot::running(7, 0, 0, 518 * MIB, 1518 * MIB),
        FixtureSlot::running(8, 0, 0, 518 * MIB, 600 * MIB),
    ];
    let region = read(&f.bytes());
    let limits = file("CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_LIMIT_1=3000m\n");
    let v = judge(region.as_ref(), Some(&limits), alive);
    assert_eq!(v.verdict, Verdict::Uncapped);
    let g: Vec<(usize, Verdict, u64, usize)> = v
        .gpus
        .iter()
        .map(|g| (g.index, g.verdict, g.used, g.processes))
        .collect();
    assert_eq!(
        g,
        vec![
            (0, Verdict::Capped, 2118 * MIB, 2),
            (1, Verdict::Uncapped, 0, 0)
        ]
    );
    let u = v.utilization.unwrap();
    assert_eq!((u.stamped_switch, u.limiter_on), (0, false));
    let forced = file("CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nGPU_CORE_UTILIZATION_POLICY=force\n");
    let v = judge(region.as_ref(), Some(&forced), alive);
    assert!(v.utilization.unwrap().limiter_on);
    assert_eq!(
        v.priority,
        Some(PriorityReport {
            stamped: 1,
            file: Some(1)
        })
    );
}

#[test]
fn files_on_disk_links_fifos_and_huge_files_are_refused_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.cache");
    std::fs::write(&good, RegionFixture::new(&V1_2).with_limit_all(MIB).bytes()).unwrap();
    assert_eq!(read_region_file(&good).unwrap().limit[0], MIB);

    let link = dir.path().join("usage.cache");
    symlink(&good, &link).unwrap();
    let e = read_region_file(&link).unwrap_err();
    assert_eq!(e.kind, RegionErrorKind::Symlink, "{e}");

    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = read_region_file(&fifo).unwrap_err();
    assert_eq!(
        e.kind,
        RegionErrorKind::NotRegular { file_type: "fifo" },
        "{e}"
    );

    let e = read_region_file(dir.path()).unwrap_err();
    assert!(matches!(
        e.kind,
        RegionErrorKind::NotRegular {
            file_type: "directory"
        }
    ));

    let huge = dir.path().join("huge.cache");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(1 << 30).unwrap();
    let mut head = RegionFixture::new(&V1_2).bytes();
    head.truncate(64);
    std::fs::write(&huge, &head).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&huge).unwrap();
    f.set_len(1 << 30).unwrap();
    let e = read_region_file(&huge).unwrap_err();
    assert!(
        matches!(e.kind, RegionErrorKind::Parse(ParseError::Oversized { .. })),
        "{e}"
    );

    let e = read_region_file(&dir.path().join("none")).unwrap_err();
    assert!(e.is_no_region());
    assert!(e.to_string().contains("none: no such file"), "{e}");
}

#[test]
fn container_folders_are_listed_without_following_links() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path();
    std::fs::create_dir(c.join("uid_main")).unwrap();
    std::fs::write(c.join("uid_main.limits"), CAP).unwrap();
    std::fs::create_dir(c.join("elsewhere")).unwrap();
    symlink(c.join("elsewhere"), c.join("uid_link")).unwrap();
    let dirs = container_dirs(c).unwrap();
    let names: Vec<&str> = dirs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec!["elsewhere", "uid_main"]);
    assert_eq!(
        limits_file_for(&dirs[1].region).unwrap(),
        c.join("uid_main.limits")
    );
    let parsed = read_limits_file(&dirs[1].limits).unwrap().unwrap();
    assert_eq!(parsed.entries.len(), 2);
    assert_eq!(read_limits_file(&c.join("nope.limits")).unwrap(), None);
}

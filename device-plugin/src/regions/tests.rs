#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_shared::region::fixture::{FixtureSlot, RegionFixture};
use hami_shared::region::layout::{V1_1, V1_2};
use hami_shared::region::{Liveness, ProcSlot, RegionError, RegionErrorKind, Verdict};
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;

use super::export::{ExportSettings, Folder, FolderSource, ScanBound, rows};
use super::hami::HamiFolders;
use super::observe::{EventKey, FolderRead, Owner, REASON_MISMATCH, REASON_UNCAPPED, observe};
use super::podresources::{slot_owners, v1};
use super::slots::{SlotFolders, prepare_slot};
use super::{RegionExporter, hami};
use crate::allocation::shell::pod_lookup::cache::PodCache;

const MIB: u64 = 1 << 20;
const UID_A: &str = "0b6c2d6e-0000-4000-8000-00000000000a";
const UID_B: &str = "0b6c2d6e-0000-4000-8000-00000000000b";

fn owner(pod: &str, container: &str) -> Owner {
    Owner {
        namespace: "team".to_owned(),
        pod: pod.to_owned(),
        uid: None,
        container: container.to_owned(),
    }
}

fn unknown(_: &ProcSlot) -> Liveness {
    Liveness::Unknown
}

/// A region stamped `limit` bytes on every GPU, one process using `used` bytes on GPU 0.
fn region(limit: u64, used: u64) -> Vec<u8> {
    let mut f = RegionFixture::new(&V1_2).with_limit_all(limit);
    f.device_num = 1;
    f.uuids = vec!["GPU-11111111-2222-3333-4444-555555555555".to_owned()];
    f.procs = vec![FixtureSlot::running(7, 4242, 0, 300 * MIB, used)];
    f.bytes()
}

fn read(folder: &str, region: Result<Vec<u8>, RegionError>, limits: Option<&str>) -> FolderRead {
    FolderRead {
        folder: folder.to_owned(),
        region_path: format!("/hook/{folder}/usage.cache").into(),
        region,
        limits: Ok(limits.map(|t| t.as_bytes().to_vec())),
    }
}

const FILE_3000: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nHAMI_LIMITS_FORMAT=1\n";

#[test]
fn each_verdict_from_bytes_and_events_once() {
    let reads = vec![
        read("a", Ok(region(3000 * MIB, 1024 * MIB)), Some(FILE_3000)),
        read("b", Ok(region(0, 5000 * MIB)), Some(FILE_3000)),
        read("c", Ok(region(2000 * MIB, 0)), Some(FILE_3000)),
        read("d", Ok(Vec::new()), Some(FILE_3000)),
        read(
            "e",
            Err(RegionError {
                path: "/hook/e/usage.cache".to_owned(),
                kind: RegionErrorKind::Symlink,
            }),
            Some(FILE_3000),
        ),
        read("gone", Ok(region(0, 0)), Some(FILE_3000)),
    ];
    let owners: BTreeMap<String, Owner> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|f| ((*f).to_owned(), owner(&format!("pod-{f}"), "main")))
        .collect();
    let o = observe(
        &reads,
        &owners,
        &BTreeMap::new(),
        &unknown,
        &BTreeSet::new(),
    );
    let verdicts: Vec<(&str, Verdict)> = o
        .containers
        .iter()
        .map(|c| (c.folder.as_str(), c.verdict.verdict))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("a", Verdict::Capped),
            ("b", Verdict::Uncapped),
            ("c", Verdict::Mismatch),
            ("d", Verdict::NoRegion),
            ("e", Verdict::Unreadable),
        ]
    );
    assert_eq!(o.unowned, ["gone"]);
    let reasons: Vec<(&str, &str)> = o
        .events
        .iter()
        .map(|e| (e.key.owner.pod.as_str(), e.reason))
        .collect();
    assert_eq!(
        reasons,
        [("pod-b", REASON_UNCAPPED), ("pod-c", REASON_MISMATCH)]
    );
    assert!(
        o.events[0].message.contains("\"main\""),
        "{}",
        o.events[0].message
    );
    assert!(o.events[0].message.contains("recreate the pod"));
    // Raised once: what was reported is not raised again.
    let reported: BTreeSet<EventKey> = o.events.iter().map(|e| e.key.clone()).collect();
    let again = observe(&reads, &owners, &BTreeMap::new(), &unknown, &reported);
    assert!(again.events.is_empty());
    // The same container turning from uncapped to mismatch is a new Event.
    let turned = vec![read("b", Ok(region(1000 * MIB, 0)), Some(FILE_3000))];
    let o = observe(&turned, &owners, &BTreeMap::new(), &unknown, &reported);
    assert_eq!(o.events.len(), 1);
    assert_eq!(o.events[0].reason, REASON_MISMATCH);
}

#[test]
fn rows_per_container_and_gpu_labels_from_owners_only() {
    let reads = vec![
        read("a", Ok(region(3000 * MIB, 1024 * MIB)), Some(FILE_3000)),
        read("d", Ok(Vec::new()), None),
    ];
    let owners = BTreeMap::from([
        ("a".to_owned(), owner("train", "main")),
        ("d".to_owned(), owner("idle", "side")),
    ]);
    let o = observe(
        &reads,
        &owners,
        &BTreeMap::new(),
        &unknown,
        &BTreeSet::new(),
    );
    let r = rows("gpu-1", &o.containers);
    let label = |l: &[(&str, String)]| {
        l.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let verdicts: Vec<String> = r.verdict.iter().map(|(l, _)| label(l)).collect();
    assert_eq!(
        verdicts,
        [
            "node=gpu-1,podnamespace=team,podname=train,ctrname=main,gpu=0,verdict=capped",
            "node=gpu-1,podnamespace=team,podname=idle,ctrname=side,gpu=,verdict=no-region",
        ]
    );
    assert_eq!(r.stamped[0].1, 3000 * MIB);
    assert_eq!(r.file[0].1, 3000 * MIB);
    assert_eq!(r.used[0].1, 1024 * MIB);
    assert_eq!(r.processes[0].1, 1);
    assert_eq!(r.sm[0].1, 100);
    // A container without a region has its verdict only.
    assert_eq!(r.stamped.len(), 1);
}

#[test]
fn kai_fraction_is_judged_against_the_gpu_the_region_saw() {
    // 0.5 of a 10,000 MiB GPU: the preload library stamps 5000m; admission said 4000m.
    let file = "CUDA_DEVICE_MEMORY_LIMIT=4000m\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n";
    let reads = vec![read("preload-0", Ok(region(5000 * MIB, 0)), Some(file))];
    let owners = BTreeMap::from([("preload-0".to_owned(), owner("kai", "main"))]);
    let gpus = BTreeMap::from([(
        "GPU-11111111-2222-3333-4444-555555555555".to_owned(),
        10_000u64,
    )]);
    let o = observe(&reads, &owners, &gpus, &unknown, &BTreeSet::new());
    assert_eq!(
        o.containers[0].verdict.verdict,
        Verdict::Capped,
        "{:?}",
        o.containers[0].verdict
    );
    // Without the node's GPU file, the admission-time value is expected.
    let o = observe(
        &reads,
        &owners,
        &BTreeMap::new(),
        &unknown,
        &BTreeSet::new(),
    );
    assert_eq!(o.containers[0].verdict.verdict, Verdict::Mismatch);
}

#[test]
fn hami_folder_names_map_through_pod_uids_only() {
    let uids = BTreeMap::from([(UID_A.to_owned(), ("team".to_owned(), "train".to_owned()))]);
    let o = hami::HamiFolders::owner_of(&format!("{UID_A}_main"), &uids).unwrap();
    assert_eq!((o.pod.as_str(), o.container.as_str()), ("train", "main"));
    assert_eq!(o.uid.as_deref(), Some(UID_A));
    for name in [
        format!("{UID_B}_main"),
        format!("{UID_A}_Main"),
        format!("{UID_A}main"),
        "preload-0".to_owned(),
        format!("{UID_A}_main.limits"),
    ] {
        assert!(
            hami::HamiFolders::owner_of(&name, &uids).is_none(),
            "{name}"
        );
    }
}

fn pod(uid: &str, name: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.to_owned());
    p.metadata.name = Some(name.to_owned());
    p.metadata.namespace = Some("team".to_owned());
    p.metadata.resource_version = Some("1".to_owned());
    p
}

fn synced_cache(pods: &[Pod]) -> Arc<PodCache> {
    let cache = PodCache::new();
    cache.begin_list();
    for p in pods {
        cache.list_item(p.clone());
    }
    cache.end_list();
    cache
}

/// `<dir>/<uid>_<ctr>/usage.cache` with `region`, and its limits file beside.
fn hami_container(dir: &std::path::Path, uid: &str, ctr: &str, region: &[u8], limits: &str) {
    let folder = dir.join(format!("{uid}_{ctr}"));
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("usage.cache"), region).unwrap();
    std::fs::write(dir.join(format!("{uid}_{ctr}.limits")), limits).unwrap();
}

fn encode(exporter: &Arc<RegionExporter>) -> String {
    let registry: Registry = exporter.registry();
    hami_ops::encode(&registry, hami_ops::Exposition::Prometheus)
}

#[test]
fn hami_node_scan_exports_and_refuses_links_fifos_and_huge_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    hami_container(dir, UID_A, "main", &region(3000 * MIB, MIB), FILE_3000);
    hami_container(dir, UID_A, "side", &region(0, MIB), FILE_3000);
    // A container's folder whose region is a link to a node file, a FIFO, and a huge file.
    let secret = dir.join("secret");
    std::fs::write(&secret, region(3000 * MIB, 0)).unwrap();
    for (ctr, make) in [("link", 0u8), ("fifo", 1), ("huge", 2)] {
        let folder = dir.join(format!("{UID_B}_{ctr}"));
        std::fs::create_dir_all(&folder).unwrap();
        let f = folder.join("usage.cache");
        match make {
            0 => symlink(&secret, &f).unwrap(),
            1 => rustix::fs::mknodat(
                rustix::fs::CWD,
                &f,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o666),
                0,
            )
            .unwrap(),
            _ => {
                // A real region's start, grown to 64 MiB.
                std::fs::write(&f, region(3000 * MIB, 0)).unwrap();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_len(64 << 20)
                    .unwrap();
            }
        }
    }
    // A folder that is a link to another container's folder is not a container folder.
    symlink(
        dir.join(format!("{UID_A}_main")),
        dir.join(format!("{UID_B}_alias")),
    )
    .unwrap();
    let cache = synced_cache(&[pod(UID_A, "train"), pod(UID_B, "hostile")]);
    let source = Arc::new(HamiFolders {
        containers_dir: dir.to_path_buf(),
        pods: Arc::clone(&cache),
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let exporter = RegionExporter::new("gpu-1", source, ExportSettings::default(), Some(tx));
    let started = Instant::now();
    let report = exporter.scan(None).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a FIFO was waited on"
    );
    assert_eq!(
        (report.listed, report.read, report.truncated),
        (5, 5, false)
    );
    let by_container: BTreeMap<String, Verdict> = exporter
        .samples()
        .into_iter()
        .map(|s| (s.owner.container, s.verdict.verdict))
        .collect();
    assert_eq!(
        by_container,
        BTreeMap::from([
            ("fifo".to_owned(), Verdict::Unreadable),
            ("huge".to_owned(), Verdict::Unreadable),
            ("link".to_owned(), Verdict::Unreadable),
            ("main".to_owned(), Verdict::Capped),
            ("side".to_owned(), Verdict::Uncapped),
        ])
    );
    let event = rx.try_recv().unwrap();
    assert_eq!(
        (event.key.owner.container.as_str(), event.reason),
        ("side", REASON_UNCAPPED)
    );
    assert_eq!(event.key.owner.uid.as_deref(), Some(UID_A));
    assert!(rx.try_recv().is_err());
    let text = encode(&exporter);
    for line in [
        "hami_limits_region_cap_verdict{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"side\",gpu=\"0\",verdict=\"uncapped\"} 1",
        "hami_limits_region_cap_verdict{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"main\",gpu=\"0\",verdict=\"capped\"} 1",
        "hami_limits_region_cap_verdict{node=\"gpu-1\",podnamespace=\"team\",podname=\"hostile\",ctrname=\"link\",gpu=\"\",verdict=\"unreadable\"} 1",
        "hami_limits_region_stamped_limit_bytes{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"main\",gpu=\"0\"} 3145728000",
        "hami_limits_region_file_limit_bytes{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"side\",gpu=\"0\"} 3145728000",
        "hami_limits_region_stamped_limit_bytes{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"side\",gpu=\"0\"} 0",
        "hami_limits_region_used_bytes{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"main\",gpu=\"0\"} 1048576",
        "hami_limits_region_processes{node=\"gpu-1\",podnamespace=\"team\",podname=\"train\",ctrname=\"main\",gpu=\"0\"} 1",
        "hami_limits_region_unowned_folders 0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    // The node file behind the link was never read: no series names it, and it is intact.
    assert_eq!(std::fs::read(&secret).unwrap(), region(3000 * MIB, 0));
    // A second scan raises nothing new.
    exporter.scan(None).unwrap();
    assert!(rx.try_recv().is_err());
    // The pod is gone: its series go, and so does what was reported for it.
    cache.delete(&pod(UID_A, "train"));
    exporter.scan(None).unwrap();
    let text = encode(&exporter);
    assert!(!text.contains("podname=\"train\""), "{text}");
    assert!(
        text.contains("hami_limits_region_unowned_folders 2"),
        "{text}"
    );
}

#[test]
fn bounded_scans_continue_where_the_last_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut pods = Vec::new();
    for i in 0..5u8 {
        let uid = format!("0b6c2d6e-0000-4000-8000-0000000000{i:02}");
        hami_container(dir, &uid, "main", &region(3000 * MIB, 0), FILE_3000);
        pods.push(pod(&uid, &format!("p{i}")));
    }
    let source = Arc::new(HamiFolders {
        containers_dir: dir.to_path_buf(),
        pods: synced_cache(&pods),
    });
    let exporter = RegionExporter::new("gpu-1", source, ExportSettings::default(), None);
    let bound = Some(ScanBound {
        files: 2,
        budget: Duration::from_secs(60),
    });
    let r = exporter.scan(bound).unwrap();
    assert_eq!((r.read, r.truncated), (2, true));
    assert_eq!(exporter.samples().len(), 2);
    exporter.scan(bound).unwrap();
    exporter.scan(bound).unwrap();
    assert_eq!(
        exporter.samples().len(),
        5,
        "three bounded scans cover five folders"
    );
    // A zero budget reads nothing, and keeps what was read.
    let r = exporter
        .scan(Some(ScanBound {
            files: 10,
            budget: Duration::ZERO,
        }))
        .unwrap();
    assert_eq!(r.read, 0);
    assert_eq!(exporter.samples().len(), 5);
    assert!(encode(&exporter).contains("hami_limits_region_truncated_scans_total 4"));
}

#[test]
fn an_unsynced_pod_cache_owns_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    hami_container(tmp.path(), UID_A, "main", &region(0, 0), FILE_3000);
    let source = HamiFolders {
        containers_dir: tmp.path().to_path_buf(),
        pods: PodCache::new(),
    };
    let folders = source.folders().unwrap();
    assert_eq!(folders.len(), 1);
    assert!(source.owners(&folders).is_empty());
    // A missing containers folder is an empty node, not an error.
    let none = HamiFolders {
        containers_dir: tmp.path().join("absent"),
        pods: PodCache::new(),
    };
    assert_eq!(none.folders().unwrap(), Vec::<Folder>::new());
}

#[test]
fn slot_folder_is_made_anew_without_following_links() {
    let tmp = tempfile::tempdir().unwrap();
    let regions = tmp.path().join("regions");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"node file").unwrap();
    let path = prepare_slot(&regions, "preload-3").unwrap();
    assert_eq!(path, regions.join("preload-3"));
    let mode =
        |p: &std::path::Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&regions), 0o755);
    assert_eq!(mode(&path), 0o755);
    assert_eq!(mode(&path.join("usage.cache")), 0o666);
    assert_eq!(std::fs::read(path.join("usage.cache")).unwrap(), b"");
    // The previous holder left a region, a link to a node folder, and a link as usage.cache.
    std::fs::write(path.join("usage.cache"), region(0, 0)).unwrap();
    symlink(&outside, path.join("escape")).unwrap();
    prepare_slot(&regions, "preload-3").unwrap();
    let left: Vec<_> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["usage.cache"]);
    assert_eq!(std::fs::read(path.join("usage.cache")).unwrap(), b"");
    // The slot folder itself replaced by a link: removed as a link, its target untouched.
    std::fs::remove_dir_all(&path).unwrap();
    symlink(&outside, &path).unwrap();
    prepare_slot(&regions, "preload-3").unwrap();
    assert!(std::fs::symlink_metadata(&path).unwrap().is_dir());
    assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"node file");
    // `regions` itself a link: refused.
    let linked = tmp.path().join("linked");
    symlink(&outside, &linked).unwrap();
    assert!(prepare_slot(&linked, "preload-0").is_err());
    assert!(!outside.join("preload-0").exists());
}

/// (pod, container, [(resource, device IDs)]).
type Held<'a> = (&'a str, &'a str, &'a [(&'a str, &'a [&'a str])]);

fn list(pods: &[Held<'_>]) -> v1::ListPodResourcesResponse {
    v1::ListPodResourcesResponse {
        pod_resources: pods
            .iter()
            .map(|(name, container, devices)| v1::PodResources {
                name: (*name).to_owned(),
                namespace: "team".to_owned(),
                containers: vec![v1::ContainerResources {
                    name: (*container).to_owned(),
                    devices: devices
                        .iter()
                        .map(|(resource, ids)| v1::ContainerDevices {
                            resource_name: (*resource).to_owned(),
                            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                        })
                        .collect(),
                }],
            })
            .collect(),
    }
}

#[test]
fn slot_owners_from_pod_resources() {
    let answer = list(&[
        (
            "kai-a",
            "main",
            &[("hami.io/preload", &["preload-10", "preload-2"])],
        ),
        (
            "kai-b",
            "main",
            &[
                ("nvidia.com/gpu", &["GPU-x"]),
                ("hami.io/preload", &["preload-1"]),
            ],
        ),
        ("other", "main", &[("nvidia.com/gpu", &["preload-5"])]),
        ("bogus", "main", &[("hami.io/preload", &["preload-99999"])]),
    ]);
    let owners = slot_owners(&answer, "hami.io/preload", |id| {
        super::slot_id::is_slot(id, 1024)
    });
    let got: Vec<(&str, &str)> = owners
        .iter()
        .map(|(slot, o)| (slot.as_str(), o.pod.as_str()))
        .collect();
    assert_eq!(got, [("preload-1", "kai-b"), ("preload-2", "kai-a")]);
}

#[test]
fn a_slot_allocated_after_the_owners_were_read_is_not_owned_yet() {
    let tmp = tempfile::tempdir().unwrap();
    let slots = SlotFolders::new(tmp.path().join("regions"), 8, tmp.path().join("node-gpus"));
    let taken = Instant::now();
    slots.set_known(
        BTreeMap::from([
            ("preload-0".to_owned(), owner("old", "main")),
            ("preload-1".to_owned(), owner("kept", "main")),
        ]),
        BTreeMap::from([(
            ("team".to_owned(), "kept".to_owned(), "main".to_owned()),
            FILE_3000.to_owned(),
        )]),
        taken,
    );
    std::thread::sleep(Duration::from_millis(2));
    slots.allocated("preload-0");
    let owned: Vec<String> = slots.owners(&[]).into_keys().collect();
    assert_eq!(owned, ["preload-1"]);
    prepare_slot(&tmp.path().join("regions"), "preload-1").unwrap();
    std::fs::create_dir(tmp.path().join("regions/not-a-slot")).unwrap();
    let folders = slots.folders().unwrap();
    assert_eq!(folders.len(), 1);
    assert_eq!(
        folders[0].limits,
        Some(super::export::LimitsAt::Text(FILE_3000.to_owned()))
    );
}

#[test]
fn layouts_both_read_by_the_exporter() {
    for layout in [&V1_1, &V1_2] {
        let bytes = RegionFixture::new(layout)
            .with_limit_all(3000 * MIB)
            .bytes();
        let reads = vec![read("a", Ok(bytes), Some(FILE_3000))];
        let owners = BTreeMap::from([("a".to_owned(), owner("p", "c"))]);
        let o = observe(
            &reads,
            &owners,
            &BTreeMap::new(),
            &unknown,
            &BTreeSet::new(),
        );
        assert_eq!(
            o.containers[0].verdict.verdict,
            Verdict::Capped,
            "{}",
            layout.version
        );
    }
}

/// A source whose listing blocks until released: a scan in progress.
struct Blocking {
    entered: std::sync::mpsc::SyncSender<()>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl FolderSource for Blocking {
    fn folders(&self) -> std::io::Result<Vec<Folder>> {
        let _ = self.entered.send(());
        let _ = self.release.lock().unwrap().recv();
        Ok(Vec::new())
    }

    fn owners(&self, _folders: &[Folder]) -> BTreeMap<String, Owner> {
        BTreeMap::new()
    }
}

#[test]
fn a_scrape_never_waits_on_a_running_scan_and_skips_fresh_samples() {
    let (entered_tx, entered) = std::sync::mpsc::sync_channel(1);
    let (release, release_rx) = std::sync::mpsc::channel();
    let exporter = RegionExporter::new(
        "gpu-1",
        Arc::new(Blocking {
            entered: entered_tx,
            release: std::sync::Mutex::new(release_rx),
        }),
        ExportSettings::default(),
        None,
    );
    let timer = {
        let e = Arc::clone(&exporter);
        std::thread::spawn(move || e.scan(None))
    };
    entered.recv().unwrap();
    // While the timer's scan reads, a scrape's scan returns at once, and the exposition answers.
    let started = Instant::now();
    assert_eq!(
        exporter.scan(Some(ScanBound {
            files: 1,
            budget: Duration::from_secs(60)
        })),
        None
    );
    let text = encode(&exporter);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        text.contains("hami_limits_region_last_scan_timestamp_seconds 0"),
        "{text}"
    );
    release.send(()).unwrap();
    assert!(timer.join().unwrap().is_some());
    // Fresh samples (younger than scrape_min_age): a scrape does not scan again (were it to, the
    // spare release keeps it from blocking, and `entered` tells).
    release.send(()).unwrap();
    let before = encode(&exporter);
    exporter.scan_for_scrape();
    assert!(entered.try_recv().is_err(), "a fresh scrape scanned");
    assert!(before.contains("hami_limits_region_truncated_scans_total 0"));
}

//! "Is the cap in force?" on the real node: a HAMi pod and a KAI pod run, each container's first
//! "process" writes its shared region from inside the container (a stub `libvgpu.so` cannot: the
//! bytes come from the project's fixture generator, in HAMi-core's layout, written with `base64 -d`
//! through `kubectl exec`) into the folder the node gave it, and the node's exporters — the device
//! plugin for the HAMi pod, the hook installer's `preload-plugin` for the KAI pod — show the
//! verdicts on their `/metrics`, with a Warning Event on the uncapped pod.

use std::time::Duration;

use base64::Engine as _;
use hami_shared::region::fixture::{FixtureSlot, RegionFixture};
use hami_shared::region::layout::V1_2;
use serde_json::{Value, json};

use super::{
    GPU_1, NODE, NS, Node, TENANT, bind, delete_pod, hami_pod, kai_pod, pod_uid,
    schedule_and_bind_as_hami, text, var, vars, wait_for, wait_running,
};

/// Where a KAI container's region is (the slot folder `serve-preload` mounts).
const KAI_REGION: &str = "/var/lib/hami-limits/region/usage.cache";

/// A region as HAMi-core leaves it: `limit_mib` stamped on every GPU (0: none), one process.
fn region(limit_mib: u64) -> Vec<u8> {
    let mut f = RegionFixture::new(&V1_2).with_limit_all(limit_mib << 20);
    f.device_num = 1;
    f.procs = vec![FixtureSlot::running(1, 0, 0, 300 << 20, 900 << 20)];
    f.bytes()
}

/// Writes `bytes` at `path` from inside the pod's container, as its processes would.
fn write_in_container(n: &Node, pod: &str, path: &str, bytes: &[u8]) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let out = n.kubectl(
        &[
            "exec",
            "-i",
            "-n",
            TENANT,
            pod,
            "--",
            "sh",
            "-c",
            &format!("base64 -d > {path}"),
        ],
        Some(&encoded),
    );
    assert!(
        out.status.success(),
        "{pod}: writing {path}: {}",
        text(&out.stderr)
    );
}

/// The pod IP of the chart's `component` pod on the node.
fn component_ip(n: &Node, component: &str) -> String {
    let pods: Value = serde_json::from_str(&n.ok(
        &[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            &format!("app.kubernetes.io/component={component}"),
            "-o",
            "json",
        ],
        None,
    ))
    .unwrap();
    pods["items"][0]["status"]["podIP"]
        .as_str()
        .unwrap_or_else(|| panic!("no {component} pod IP: {pods}"))
        .to_owned()
}

fn scrape(ip: &str, port: u16) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(format!("http://{ip}:{port}/metrics"))
        .output()
        .unwrap();
    text(&out.stdout)
}

fn verdict(pod: &str, ctr: &str, verdict: &str) -> String {
    format!(
        "hami_limits_region_cap_verdict{{node=\"{NODE}\",podnamespace=\"{TENANT}\",podname=\"{pod}\",ctrname=\"{ctr}\",gpu=\"0\",verdict=\"{verdict}\"}} 1"
    )
}

pub(super) fn verdicts_on_the_node(n: &mut Node) {
    // A HAMi pod whose region a process without the limits created: stamped 0.
    let out = n.create(&hami_pod("region-hami", 3000, 30));
    assert!(out.status.success(), "{}", text(&out.stderr));
    schedule_and_bind_as_hami(n, "region-hami", GPU_1, 3000, 30);
    wait_running(n, "region-hami");
    let envless = vars(&n.exec_ok("region-hami", &["env", "-i", "/usr/bin/printenv"]));
    let hami_cache = var(&envless, "CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .unwrap()
        .to_owned();
    write_in_container(n, "region-hami", &hami_cache, &region(0));
    // What the node reads is what the container wrote.
    let uid = pod_uid(n, "region-hami");
    let host = n.hook().join(format!("containers/{uid}_cuda/usage.cache"));
    assert_eq!(std::fs::read(&host).unwrap(), region(0));

    // A KAI pod whose region holds its cap: in the slot folder, joined by every process.
    let out = n.create(&kai_pod("region-kai", json!({"gpu-memory": "3000"})));
    assert!(out.status.success(), "{}", text(&out.stderr));
    bind(n, "region-kai");
    wait_running(n, "region-kai");
    let envless = vars(&n.exec_ok("region-kai", &["env", "-i", "/usr/bin/printenv"]));
    assert_eq!(
        var(&envless, "CUDA_DEVICE_MEMORY_SHARED_CACHE"),
        Some(KAI_REGION),
        "the KAI container's region is not in its slot folder"
    );
    write_in_container(n, "region-kai", KAI_REGION, &region(3000));
    let slots = n.dir.join("node/kai-hook/regions");
    let held: Vec<_> = std::fs::read_dir(&slots)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path().join("usage.cache");
            (std::fs::read(&p).ok()? == region(3000)).then_some(p)
        })
        .collect();
    assert_eq!(held.len(), 1, "the KAI region on the node: {held:?}");

    // The device plugin (HAMi) and the hook installer (KAI) export the verdicts.
    let plugin = component_ip(n, "device-plugin");
    let installer = component_ip(n, "hook-installer");
    let mut last = String::new();
    let took = wait_for(
        "the uncapped HAMi pod on the device plugin's /metrics",
        Duration::from_secs(90),
        || {
            last = scrape(&plugin, 9396);
            last.contains(&verdict("region-hami", "cuda", "uncapped"))
        },
    );
    println!(
        "  HAMi pod uncapped on /metrics after {:.1} s",
        took.as_secs_f64()
    );
    assert!(
        last.contains(&format!(
            "hami_limits_region_file_limit_bytes{{node=\"{NODE}\",podnamespace=\"{TENANT}\",podname=\"region-hami\",ctrname=\"cuda\",gpu=\"0\"}} {}",
            3000u64 << 20
        )),
        "{last}"
    );
    let took = wait_for(
        "the capped KAI pod on the hook installer's /metrics",
        Duration::from_secs(90),
        || {
            last = scrape(&installer, 9397);
            last.contains(&verdict("region-kai", "cuda", "capped"))
        },
    );
    println!(
        "  KAI pod capped on /metrics after {:.1} s",
        took.as_secs_f64()
    );
    // Compared with its limits file (the pod's annotation, read through the API server).
    assert!(
        last.contains(&format!(
            "hami_limits_region_file_limit_bytes{{node=\"{NODE}\",podnamespace=\"{TENANT}\",podname=\"region-kai\",ctrname=\"cuda\",gpu=\"0\"}} {}",
            3000u64 << 20
        )),
        "{last}"
    );

    // One Warning Event on the uncapped pod.
    wait_for(
        "the GpuMemoryUncapped Event",
        Duration::from_secs(60),
        || {
            n.ok(
                &[
                    "get",
                    "events.v1.events.k8s.io",
                    "-n",
                    TENANT,
                    "--field-selector",
                    "regarding.name=region-hami,reason=GpuMemoryUncapped",
                    "-o",
                    "name",
                ],
                None,
            )
            .lines()
            .count()
                == 1
        },
    );

    delete_pod(n, "region-hami");
    delete_pod(n, "region-kai");
    // Their series go with them.
    wait_for(
        "the deleted pods' series to go",
        Duration::from_secs(90),
        || {
            !scrape(&plugin, 9396).contains("podname=\"region-hami\"")
                && !scrape(&installer, 9397).contains("podname=\"region-kai\"")
        },
    );
}

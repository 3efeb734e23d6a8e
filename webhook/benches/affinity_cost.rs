//! CPU per review of a `gpu-fraction` pod's required node affinity against a 10,000-node VRAM
//! index: the hostile pods (the largest request the API server accepts, the largest pod etcd
//! stores, an 8 MiB body posted straight to `/mutate`, a pod at every `kai.maxAffinity*` limit)
//! and the ordinary fixtures and placements, through [`hami_webhook::review`] (parse, decide,
//! encode) on one thread: the median wall time per review of the samples (pinned to an idle core,
//! that is its CPU time) and the thread's own CPU time over them (`/proc/thread-self/schedstat`). Uses only the API that the main branch has too, so the same file measures the
//! revision before (`bench/affinity/run.sh` builds both).
//!
//!   cargo bench -p hami-webhook --bench affinity_cost   # REV=after SAMPLES=15 SLOW_SECONDS=30
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Instant;

use hami_tests::apiserver::fixtures;
use hami_webhook::policy::basis::FixedBasis;
use hami_webhook::shell::vram::VramIndex;
use hami_webhook::{Settings, VramBasis, review};
use serde_json::{Value, json};

const PLAIN_POD: &[u8] = include_bytes!("../tests/fixtures/plain-pod.json");
const HAMI_POD: &[u8] = include_bytes!("../tests/fixtures/hami-pod.json");
const KAI_SMALL: &[u8] = include_bytes!("../tests/fixtures/kai-fraction-small.json");
const KAI_LARGE: &[u8] = include_bytes!("../tests/fixtures/kai-fraction-large.json");

/// etcd's default `--max-request-bytes`: the largest write it takes, so the largest pod stored.
const ETCD_MAX: usize = 1_572_864;
/// kube-apiserver's request body limit (`MaxRequestBodyBytes`).
const APISERVER_MAX: usize = 3 * 1024 * 1024;
/// The webhook's `bodyMemoryBytes` default: the largest body it reads.
const WEBHOOK_MAX: usize = 8 * 1024 * 1024;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time this thread has run, in ns.
fn thread_cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Measured {
    /// Median wall time per review over the samples, ms (one thread pinned to an idle core: its
    /// CPU time).
    median_ms: f64,
    min_ms: f64,
    /// The thread's CPU time over all samples per review, ms.
    cpu_ms: f64,
    samples: usize,
    batch: usize,
    outcome: String,
}

/// `SAMPLES` samples of as many reviews as take about 20 ms (one when a review takes longer),
/// stopping early once `SLOW_SECONDS` of CPU is spent (at least one sample).
fn measure(body: &[u8], settings: &Settings, vram: &dyn VramBasis) -> Measured {
    let samples_wanted = env_usize("SAMPLES", 15);
    let budget_ns = env_usize("SLOW_SECONDS", 30) as u64 * 1_000_000_000;
    let t = Instant::now();
    let first = review(body, settings, vram).unwrap();
    let once = t.elapsed().as_secs_f64();
    let batch = ((0.02 / once) as usize).clamp(1, 100_000);
    let outcome = format!(
        "{:?}{}",
        first.outcome,
        first
            .message
            .as_deref()
            .map(|m| {
                let m = m.split_once(": ").map_or(m, |(_, rest)| rest);
                let cut: String = m.chars().take(150).collect();
                format!(": {cut}")
            })
            .unwrap_or_default()
    );
    let mut per_review = Vec::new();
    let cpu_start = thread_cpu_ns();
    while per_review.len() < samples_wanted {
        let t = Instant::now();
        for _ in 0..batch {
            black_box(review(black_box(body), settings, vram).unwrap());
        }
        per_review.push(t.elapsed().as_secs_f64() * 1e3 / batch as f64);
        if thread_cpu_ns() - cpu_start > budget_ns {
            break;
        }
    }
    let reviews = (per_review.len() * batch) as f64;
    Measured {
        cpu_ms: (thread_cpu_ns() - cpu_start) as f64 / 1e6 / reviews,
        min_ms: per_review.iter().copied().fold(f64::INFINITY, f64::min),
        median_ms: median(per_review.clone()),
        samples: per_review.len(),
        batch,
        outcome,
    }
}

/// The small KAI fixture with `spec` fields set.
fn kai_with(spec: &[(&str, Value)]) -> Vec<u8> {
    let mut r: Value = serde_json::from_slice(KAI_SMALL).unwrap();
    for (k, v) in spec {
        r["request"]["object"]["spec"][*k] = v.clone();
    }
    serde_json::to_vec(&r).unwrap()
}

fn affinity(terms: &Value) -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
}

/// One term, one `NotIn`: `filler` values that name no node (`"8"`, which the index knows as a
/// label value), then every node's own name, so every node is excluded and a straightforward
/// evaluation compares each node with every value. `field`: on `metadata.name` (`matchFields`,
/// strings compared) or on the host-name label (`matchExpressions`). As many fillers as fit in
/// `bytes` when the pod is encoded as protobuf (`proto`: 3 bytes per `"8"`, 2 + length per name)
/// or as JSON (4, 3 + length).
fn not_in_everything(hosts: &[String], bytes: usize, proto: bool, field: bool) -> Vec<u8> {
    let expr = |values: &[&str]| {
        if field {
            json!([{"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": values}]}])
        } else {
            json!([{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": values}]}])
        }
    };
    let base = kai_with(&[("affinity", affinity(&expr(&[])))]);
    let per_host: usize = hosts
        .iter()
        .map(|h| if proto { 2 + h.len() } else { 3 + h.len() })
        .sum();
    let per_filler = if proto { 3 } else { 4 };
    let fillers = (bytes - base.len() - per_host) / per_filler;
    let mut values: Vec<&str> = vec!["8"; fillers];
    values.extend(hosts.iter().map(String::as_str));
    kai_with(&[("affinity", affinity(&expr(&values)))])
}

/// A pod at every default limit (64 terms, 256 expressions, 10,000 values), each term failing only
/// at its last requirement, after ones that every node satisfies: the most set work a pod the
/// limits admit can ask for.
fn at_the_limits(hosts: &[String], zones: &[String]) -> Vec<u8> {
    let per_term = 10_000 / 64 - 1 - zones.len();
    let terms: Vec<Value> = (0..64)
        .map(|t| {
            let excluded: Vec<&String> = hosts.iter().skip(t * per_term).take(per_term).collect();
            json!({"matchExpressions": [
                {"key": "nvidia.com/gpu.family", "operator": "Exists"},
                {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["-1"]},
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": excluded},
                {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": zones}
            ]})
        })
        .collect();
    kai_with(&[("affinity", affinity(&json!(terms)))])
}

fn main() {
    let rev = std::env::var("REV").unwrap_or_else(|_| "this build".to_owned());
    let n = env_usize("NODES", 10_000);
    let nodes = fixtures::gpu_nodes(n).unwrap();
    let mut index = VramIndex::new();
    let mut hosts = Vec::with_capacity(n);
    let mut zones = BTreeSet::new();
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        if let Some(z) = labels.get("topology.kubernetes.io/zone") {
            zones.insert(z.clone());
        }
        index.upsert(&name, labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        hosts.push(name);
    }
    let zones: Vec<String> = zones.into_iter().collect();
    let settings = Settings::default();
    let fixed = FixedBasis(16384);

    let ordinary: Vec<(&str, Vec<u8>, &dyn VramBasis)> = vec![
        ("plain-pod", PLAIN_POD.to_vec(), &index),
        ("hami-pod", HAMI_POD.to_vec(), &index),
        ("kai-fraction-small", KAI_SMALL.to_vec(), &index),
        ("kai-fraction-large", KAI_LARGE.to_vec(), &index),
        (
            "kai-fraction-small, fixed basis",
            KAI_SMALL.to_vec(),
            &fixed,
        ),
        (
            "kai-fraction-large, fixed basis",
            KAI_LARGE.to_vec(),
            &fixed,
        ),
        (
            "kai-fraction-small + nodeName",
            kai_with(&[("nodeName", json!(hosts[n / 2]))]),
            &index,
        ),
        (
            "kai-fraction-small + nodeSelector zone",
            kai_with(&[(
                "nodeSelector",
                json!({"topology.kubernetes.io/zone": zones[1]}),
            )]),
            &index,
        ),
        (
            "kai-fraction-small + affinity In family, NotIn zone, Gt compute",
            kai_with(&[(
                "affinity",
                affinity(&json!([{"matchExpressions": [
                    {"key": "nvidia.com/gpu.family", "operator": "In", "values": ["ampere", "hopper"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": [zones[3]]},
                    {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["7"]}
                ]}])),
            )]),
            &index,
        ),
        (
            "kai-fraction-small + affinity no node satisfies (In zone a, NotIn zone a)",
            kai_with(&[(
                "affinity",
                affinity(&json!([{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zones[0]]},
                    {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": [zones[0]]}
                ]}])),
            )]),
            &index,
        ),
    ];
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        (
            "largest pod etcd stores: matchFields NotIn, 1.5 MiB as protobuf",
            not_in_everything(&hosts, ETCD_MAX - 4096, true, true),
        ),
        (
            "largest JSON request the API server takes: matchFields NotIn, 3 MiB",
            not_in_everything(&hosts, APISERVER_MAX - 4096, false, true),
        ),
        (
            "the same, label NotIn (kubernetes.io/hostname), 3 MiB",
            not_in_everything(&hosts, APISERVER_MAX - 4096, false, false),
        ),
        (
            "8 MiB review posted to /mutate: matchFields NotIn",
            not_in_everything(&hosts, WEBHOOK_MAX - 4096, false, true),
        ),
        (
            "at every default limit: 64 terms, 256 expressions, 9,984 values",
            at_the_limits(&hosts, &zones),
        ),
    ];

    println!(
        "### {rev}: {n} GPU nodes, one thread; per review: median wall time of the samples (min), and the thread's CPU time over all of them"
    );
    println!();
    println!("| case | body bytes | median (min) | CPU | samples × reviews | outcome |");
    println!("|---|---:|---:|---:|---:|---|");
    let row = |name: &str, body: &[u8], m: &Measured, unit: f64, u: &str| {
        println!(
            "| {name} | {} | {:.2} {u} ({:.2}) | {:.2} {u} | {}×{} | {} |",
            body.len(),
            m.median_ms * unit,
            m.min_ms * unit,
            m.cpu_ms * unit,
            m.samples,
            m.batch,
            m.outcome
        );
    };
    for (name, body, vram) in &ordinary {
        row(name, body, &measure(body, &settings, *vram), 1e3, "µs");
    }
    for (name, body) in &hostile {
        row(name, body, &measure(body, &settings, &index), 1.0, "ms");
    }
}

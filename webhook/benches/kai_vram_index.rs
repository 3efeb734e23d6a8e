//! The KAI VRAM index at scale, against the in-process Kubernetes API server: 10,000 GPU nodes of
//! mixed models (the recorded GFD node, 63 labels, varied over 6 GPU models and 4 zones).
//!
//! Measures: initial sync (watch start → first complete list indexed), memory held by the index,
//! time from a relabel at the apiserver to the new basis being used, and the cost of one basis
//! lookup without and with placement constraints. Prints a Markdown table with the targets.
//!
//!   cargo bench -p hami-webhook --bench kai_vram_index            # NODES=10000 RELABELS=20
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_tests::apiserver::{ApiServer, fixtures};
use hami_webhook::policy::basis::VramBasis as _;
use hami_webhook::policy::placement::{Placement, Requirement};
use hami_webhook::shell::vram::{KaiMetrics, LiveVramIndex, run_node_watch};
use k8s_openapi::api::core::v1::Node;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Mean time of one call over `iters` calls.
fn per_call(iters: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..iters.min(100) {
        f();
    }
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed() / u32::try_from(iters).unwrap()
}

fn pick(mut v: Vec<Duration>, q: f64) -> Duration {
    v.sort();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.2} µs", d.as_secs_f64() * 1e6)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = env_usize("NODES", 10_000);
    let relabels = env_usize("RELABELS", 20);
    let server = ApiServer::start().await.unwrap();
    let nodes = fixtures::gpu_nodes(n).unwrap();
    server.seed_all(nodes).unwrap();
    eprintln!("seeded {n} nodes");

    let rss_before = rss_mib();
    let index = LiveVramIndex::new(KaiMetrics::default());
    let mut changes = index.subscribe();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let task = tokio::spawn({
        let index = Arc::clone(&index);
        let client = server.client();
        async move {
            run_node_watch(client, index, "nvidia.com/gpu.memory", async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
        }
    });
    while !index.is_synced() {
        changes.changed().await.unwrap();
    }
    let sync = started.elapsed();
    let (indexed, heap, min) = {
        let i = index.read();
        (i.len(), i.heap_bytes(), i.min_mib())
    };
    let rss_after = rss_mib();
    assert_eq!(indexed, n);

    // Relabel: one node gets a smaller GPU than any other; time until the unconstrained basis
    // (what the next admission uses) shows it.
    let mut relabel_times = Vec::with_capacity(relabels);
    for r in 0..relabels {
        let name = fixtures::node_name(r * 7 % n);
        let mut node: Node = server.get(None, &name).unwrap().unwrap();
        let mib = 9000 - 10 * r as u64;
        node.metadata
            .labels
            .get_or_insert_default()
            .insert("nvidia.com/gpu.memory".into(), mib.to_string());
        let t = Instant::now();
        server.seed(&node).unwrap();
        while index.snapshot().basis(&Placement::any()).map(|b| b.mib) != Ok(mib) {
            changes.changed().await.unwrap();
        }
        relabel_times.push(t.elapsed());
    }

    // Lookups.
    let any = Placement::any();
    let by_name = Placement {
        node_name: Some(fixtures::node_name(n / 2)),
        ..Placement::default()
    };
    let zone = Placement {
        node_selector: vec![("topology.kubernetes.io/zone".into(), "us-east-1b".into())],
        ..Placement::default()
    };
    let instance = Placement {
        node_selector: vec![(
            "node.kubernetes.io/instance-type".into(),
            "g4dn.12xlarge".into(),
        )],
        ..Placement::default()
    };
    let affinity = Placement {
        terms: Some(vec![vec![
            Requirement::In {
                key: "nvidia.com/gpu.family".into(),
                values: vec!["ampere".into(), "hopper".into()],
            },
            Requirement::NotIn {
                key: "topology.kubernetes.io/zone".into(),
                values: vec!["us-east-1d".into()],
            },
            Requirement::Gt {
                key: "nvidia.com/gpu.compute.major".into(),
                value: 7,
            },
        ]]),
        ..Placement::default()
    };
    // Worst case: nothing matches, so every indexed node is examined.
    let nothing = Placement {
        terms: Some(vec![vec![
            Requirement::In {
                key: "topology.kubernetes.io/zone".into(),
                values: vec!["us-east-1a".into()],
            },
            Requirement::NotIn {
                key: "topology.kubernetes.io/zone".into(),
                values: vec!["us-east-1a".into()],
            },
        ]]),
        ..Placement::default()
    };
    let lookup = |p: &Placement, iters: usize| {
        let idx = Arc::clone(&index);
        per_call(iters, || {
            black_box(idx.snapshot().basis(black_box(p)).ok());
        })
    };
    let t_any = lookup(&any, 200_000);
    let t_name = lookup(&by_name, 200_000);
    let t_zone = lookup(&zone, 500);
    let t_instance = lookup(&instance, 500);
    let t_affinity = lookup(&affinity, 500);
    let t_nothing = lookup(&nothing, 200);
    let found = |p: &Placement| {
        index
            .snapshot()
            .basis(p)
            .map_or("none".to_owned(), |b| format!("min {} MiB", b.mib))
    };

    let _ = stop.send(true);
    let _ = task.await;

    let ok = |pass: bool| if pass { "met" } else { "**missed**" };
    let heap_mib = heap as f64 / (1024.0 * 1024.0);
    println!("| measure ({n} GPU nodes, 63 labels each) | result | target |");
    println!("|---|---:|---|");
    println!(
        "| initial sync (watch start → list indexed, metadata only) | {} | ≤ 3 s: {} |",
        ms(sync),
        ok(sync <= Duration::from_secs(3))
    );
    println!(
        "| index memory (heap estimate; interned labels) | {heap_mib:.1} MiB | ≤ 50 MiB: {} |",
        ok(heap_mib <= 50.0)
    );
    println!(
        "| process RSS growth during sync (index + client buffers) | {:.1} MiB | |",
        rss_after - rss_before
    );
    println!(
        "| relabel at apiserver → new basis used (median / max of {relabels}) | {} / {} | ≤ 1 s: {} |",
        ms(pick(relabel_times.clone(), 0.5)),
        ms(pick(relabel_times.clone(), 1.0)),
        ok(pick(relabel_times, 1.0) <= Duration::from_secs(1))
    );
    println!(
        "| lookup, no constraint ({}) | {} | ≤ 50 µs: {} |",
        found(&any),
        us(t_any),
        ok(t_any <= Duration::from_micros(50))
    );
    println!(
        "| lookup, spec.nodeName ({}) | {} | ≤ 50 µs: {} |",
        found(&by_name),
        us(t_name),
        ok(t_name <= Duration::from_micros(50))
    );
    println!(
        "| lookup, nodeSelector zone ({}) | {} | ≤ 1 ms: {} |",
        found(&zone),
        us(t_zone),
        ok(t_zone <= Duration::from_millis(1))
    );
    println!(
        "| lookup, nodeSelector instance type ({}) | {} | ≤ 1 ms: {} |",
        found(&instance),
        us(t_instance),
        ok(t_instance <= Duration::from_millis(1))
    );
    println!(
        "| lookup, required affinity In+NotIn+Gt ({}) | {} | ≤ 1 ms: {} |",
        found(&affinity),
        us(t_affinity),
        ok(t_affinity <= Duration::from_millis(1))
    );
    println!(
        "| lookup, affinity no node satisfies (full scan, {}) | {} | ≤ 1 ms: {} |",
        found(&nothing),
        us(t_nothing),
        ok(t_nothing <= Duration::from_millis(1))
    );
    println!();
    println!("smallest GPU after sync: {} MiB", min.unwrap_or(0));
}

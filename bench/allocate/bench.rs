//! Allocate latency through the fake kubelet (gRPC over the plugin's unix socket) and the
//! in-process API server, with the limits file published on local disk: sequential and N
//! concurrent calls. Prints a Markdown report. Run with `bench/allocate/run.sh`.
//!
//! Each allocation: the test creates a pod (the webhook's decision applied), plays the HAMi
//! scheduler (annotations, binding, and the node lock in the sequential run), then times the
//! kubelet's `Allocate` call; the pod is deleted afterwards. Only the `Allocate` call is timed.
//! The plugin's own breakdown (`AllocateTiming`) says where the time went. The plugin runs as
//! `run` does: its pod cache fed by a watch of the node's pods.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The harness is shared with the Allocate tests; this benchmark uses part of it.
#[allow(dead_code, missing_debug_implementations)]
#[path = "../../tests/tests/it/allocate_support/mod.rs"]
mod allocate_support;

use std::time::{Duration, Instant};

use allocate_support::*;
use hami_device_plugin::allocation::plan::AllocationSettings;
use hami_device_plugin::allocation::shell::executor::AllocateTiming;
use kube::api::DeleteParams;
use serde_json::json;

struct Run {
    name: String,
    latencies: Vec<Duration>,
    timings: Vec<AllocateTiming>,
    errors: usize,
    wall: Duration,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration, Duration) {
    v.sort();
    let mean = if v.is_empty() {
        Duration::ZERO
    } else {
        v.iter().sum::<Duration>() / v.len() as u32
    };
    (
        mean,
        pct(&v, 50.0),
        pct(&v, 99.0),
        v.last().copied().unwrap_or_default(),
    )
}

async fn sequential(h: &Harness, n: usize) -> Run {
    let mut latencies = Vec::with_capacity(n);
    let mut errors = 0;
    let started = Instant::now();
    h.timings.take();
    for i in 0..n {
        let name = format!("seq-{i}");
        let pod = h
            .admit(gpu_pod(
                &name,
                &[Ctr::gpu("main", 1000 + (i as u64 % 7000), 50)],
                json!({}),
            ))
            .await;
        let gpu = if i % 2 == 0 { GPU_A } else { GPU_B };
        h.schedule(&pod, &[vec![dev(gpu, 1000 + (i as u64 % 7000), 50)]], true)
            .await;
        let id = format!("{gpu}-{}", i % 10);
        let t = Instant::now();
        let result = h.allocate(&[&id]).await;
        latencies.push(t.elapsed());
        match result {
            Ok(r) if r.envs.contains_key("CUDA_DEVICE_MEMORY_LIMIT_0") => {}
            _ => errors += 1,
        }
        h.pods()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    Run {
        name: "sequential".into(),
        latencies,
        timings: h.timings.take(),
        errors,
        wall: started.elapsed(),
    }
}

async fn concurrent(h: &Harness, n: usize, width: usize) -> Run {
    let mut latencies = Vec::with_capacity(n);
    let mut errors = 0;
    let started = Instant::now();
    h.timings.take();
    let rounds = n.div_ceil(width);
    for round in 0..rounds {
        let mut names = Vec::new();
        for k in 0..width {
            let name = format!("con-{round}-{k}");
            let pod = h
                .admit(gpu_pod(
                    &name,
                    &[Ctr::gpu("main", 2000 + k as u64, 30)],
                    json!({}),
                ))
                .await;
            // No node lock: the pods are pending at once and found by listing.
            h.schedule(&pod, &[vec![dev(GPU_A, 2000 + k as u64, 30)]], false)
                .await;
            names.push(name);
        }
        let mut calls = tokio::task::JoinSet::new();
        for k in 0..width {
            let mut client = h.client.clone();
            let id = format!("{GPU_A}-{}", k % 10);
            calls.spawn(async move {
                let t = Instant::now();
                let r = client.allocate(&[vec![id]]).await;
                (t.elapsed(), r)
            });
        }
        while let Some(joined) = calls.join_next().await {
            let (elapsed, result) = joined.unwrap();
            latencies.push(elapsed);
            match result {
                Ok(r)
                    if r.container_responses[0]
                        .envs
                        .contains_key("CUDA_DEVICE_MEMORY_LIMIT_0") => {}
                _ => errors += 1,
            }
        }
        for name in names {
            h.pods()
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    Run {
        name: format!("{width} concurrent"),
        latencies,
        timings: h.timings.take(),
        errors,
        wall: started.elapsed(),
    }
}

fn merge(into: &mut Option<Run>, run: Run) {
    match into {
        None => *into = Some(run),
        Some(r) => {
            r.latencies.extend(run.latencies);
            r.timings.extend(run.timings);
            r.errors += run.errors;
            r.wall += run.wall;
        }
    }
}

/// `n` allocations on each of `a` and `b`, in alternating chunks of `chunk` (so that a disk or
/// CPU that drifts during the phase weighs on both alike); `width` 1 is the sequential phase.
async fn interleaved(a: &Harness, b: &Harness, n: usize, width: usize, chunk: usize) -> (Run, Run) {
    let (mut ra, mut rb) = (None, None);
    let mut done = 0;
    while done < n {
        let k = chunk.min(n - done);
        for (h, r) in [(a, &mut ra), (b, &mut rb)] {
            let run = if width == 1 {
                sequential(h, k).await
            } else {
                concurrent(h, k, width).await
            };
            merge(r, run);
        }
        done += k;
    }
    (ra.unwrap(), rb.unwrap())
}

/// The disk floor: `publish_atomic` alone (write, chmod, fsync, rename, fsync directory) of a
/// limits file into a directory on the same disk, `n` times, sequentially and `width` at once.
fn disk_probe(dir: &std::path::Path, n: usize, width: usize) -> String {
    let text = hami_shared::limits_file::EXAMPLE.as_bytes();
    let probe = dir.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mut seq = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        hami_publish::publish_atomic(&probe, &format!("seq-{i}.limits"), text).unwrap();
        seq.push(t.elapsed());
    }
    let mut con = Vec::with_capacity(n);
    for round in 0..n.div_ceil(width) {
        let threads: Vec<_> = (0..width)
            .map(|k| {
                let probe = probe.clone();
                std::thread::spawn(move || {
                    let t = Instant::now();
                    hami_publish::publish_atomic(&probe, &format!("con-{round}-{k}.limits"), text)
                        .unwrap();
                    t.elapsed()
                })
            })
            .collect();
        con.extend(threads.into_iter().map(|t| t.join().unwrap()));
    }
    let mut out = String::from(
        "\nDisk floor: `publish_atomic` alone on the same disk, no API (ms):\n\n| run | mean | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n",
    );
    for (name, v) in [
        ("sequential".to_owned(), seq),
        (format!("{width} at once"), con),
    ] {
        let (mean, p50, p99, max) = stats(v);
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} |\n",
            ms(mean),
            ms(p50),
            ms(p99),
            ms(max)
        ));
    }
    out
}

fn report(runs: &[Run]) -> String {
    let mut out = String::new();
    out.push_str("| run | allocations | errors | p50 ms | p90 ms | p99 ms | max ms | mean ms |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in runs {
        let mut v = r.latencies.clone();
        v.sort();
        let mean = v.iter().sum::<Duration>() / v.len().max(1) as u32;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            v.len(),
            r.errors,
            ms(pct(&v, 50.0)),
            ms(pct(&v, 90.0)),
            ms(pct(&v, 99.0)),
            ms(v.last().copied().unwrap_or_default()),
            ms(mean)
        ));
    }
    out.push_str("\nWhere the time goes, measured inside the plugin per call (mean / p50 / p99 / max, ms):\n\n");
    out.push_str("| run | phase | mean | p50 | p99 | max |\n|---|---|---:|---:|---:|---:|\n");
    for r in runs {
        type Pick = fn(&AllocateTiming) -> Duration;
        let phases: [(&str, Pick); 9] = [
            (
                "read node lock (API: node GET, during the disk work)",
                |t| t.node_get,
            ),
            ("queued (node-wide allocation lock)", |t| t.queued),
            ("locate pod (the cache, else API: pod GET or LIST)", |t| {
                t.locate
            }),
            ("disk total (mkdir, chmod, publish)", |t| t.disk),
            (
                "  of which publish_atomic (write, fsync, rename, fsync dir)",
                |t| t.publish,
            ),
            ("patch pod annotations (API)", |t| t.patch_pod),
            ("release node lock (API)", |t| t.release_lock),
            ("API round trips on the critical path", |t| {
                t.locate + t.patch_pod + t.release_lock
            }),
            ("whole handler (incl. queue)", |t| t.total),
        ];
        for (label, pick) in phases {
            let (mean, p50, p99, max) = stats(r.timings.iter().map(pick).collect());
            out.push_str(&format!(
                "| {} | {label} | {} | {} | {} | {} |\n",
                r.name,
                ms(mean),
                ms(p50),
                ms(p99),
                ms(max)
            ));
        }
        let cached = r.timings.iter().filter(|t| t.from_cache).count();
        let retries: u32 = r.timings.iter().map(|t| t.retries).sum();
        out.push_str(&format!(
            "| {} | pod read from the watch cache (no pod GET/LIST) | {cached} of {} | | | |\n",
            r.name,
            r.timings.len()
        ));
        out.push_str(&format!(
            "| {} | selections retried (pod changed since read: 409/404) | {retries} | | | |\n",
            r.name
        ));
        let trips: u32 = r.timings.iter().map(|t| t.api_round_trips).sum();
        out.push_str(&format!(
            "| {} | API round trips per allocation | {:.2} | | | |\n",
            r.name,
            f64::from(trips) / r.timings.len().max(1) as f64
        ));
        out.push_str(&format!(
            "| {} | throughput (allocations/s, incl. test setup) | {:.0} | | | |\n",
            r.name,
            r.latencies.len() as f64 / r.wall.as_secs_f64()
        ));
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut n = 1000usize;
    let mut width = 8usize;
    let mut rest = 0u64;
    let mut dir = std::env::temp_dir();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--allocations" => n = args.next().unwrap().parse().unwrap(),
            "--concurrency" => width = args.next().unwrap().parse().unwrap(),
            "--rest" => rest = args.next().unwrap().parse().unwrap(),
            "--dir" => dir = args.next().unwrap().into(),
            other => {
                panic!(
                    "unknown argument {other}; use --allocations N --concurrency N --rest SECONDS --dir DIR"
                )
            }
        }
    }
    // Before each measured phase: let the disk recover from the previous one (see run.sh).
    let pause = || std::thread::sleep(Duration::from_secs(rest));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tmp = tempfile::Builder::new()
            .prefix("hami-allocate-bench")
            .tempdir_in(&dir)
            .unwrap();
        let settings = |hook: &std::path::Path| AllocationSettings {
            hook_path: hook.to_path_buf(),
            ..AllocationSettings::default()
        };
        // The plugin as `run` starts it: pods read from its watch-fed cache.
        let h = Harness::start_in(tmp, settings).await;
        // The baseline, same disk: no cache, every pod read from the API server (GET or LIST).
        let base_tmp = tempfile::Builder::new()
            .prefix("hami-allocate-bench")
            .tempdir_in(&dir)
            .unwrap();
        let base = Harness::start_full(base_tmp, PodView::Off, settings).await;
        // Warm-up (connections, caches), not reported.
        let _ = sequential(&h, 20).await;
        let _ = sequential(&base, 20).await;
        pause();
        let (seq, mut seq_base) = interleaved(&h, &base, n, 1, 50).await;
        pause();
        let (mut con, mut con_base) = interleaved(&h, &base, n, width, width * 8).await;
        seq_base.name = "sequential, no pod cache (baseline)".into();
        con.name = format!("{width} concurrent");
        con_base.name = format!("{width} concurrent, no pod cache (baseline)");
        println!("hook path (local disk): {}\n", h.hook.display());
        println!(
            "Each phase alternates between the plugin as `run` starts it (pods read from its watch-fed cache) and the baseline (no cache: every pod read from the API server), in chunks, on the same disk.\n"
        );
        if rest > 0 {
            println!("Each phase started after a {rest} s pause (disk recovery).\n");
        }
        print!("{}", report(&[seq, seq_base, con, con_base]));
        pause();
        print!("{}", disk_probe(&h.hook, n, width));
        // The files stay: removing thousands of them now would slow every file creation on this
        // file system for minutes (ext4 passes over recently deleted inodes when it allocates
        // one), which is what the next run would then measure. run.sh removes them at the end.
        let kept = [h.keep_dir(), base.keep_dir()];
        eprintln!(
            "allocate_bench: files kept in {} and {} (remove them when done)",
            kept[0].display(),
            kept[1].display()
        );
    });
}

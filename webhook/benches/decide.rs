//! The decision alone, without TLS or HTTP: parse the AdmissionReview, decide, write the response.
//! `cargo bench -p hami-webhook --bench decide`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hami_webhook::review::AdmissionReview;
use hami_webhook::{Settings, decide, review};

const PLAIN_POD: &[u8] = include_bytes!("../tests/fixtures/plain-pod.json");
const HAMI_POD: &[u8] = include_bytes!("../tests/fixtures/hami-pod.json");

fn bench(c: &mut Criterion) {
    let settings = Settings::default();
    let mut group = c.benchmark_group("review");
    for (name, body) in [("plain-pod", PLAIN_POD), ("hami-pod", HAMI_POD)] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| review(black_box(body), &settings).unwrap());
        });
    }
    group.finish();

    // `decide` on an already-parsed request: the policy itself.
    let mut group = c.benchmark_group("decide");
    for (name, body) in [("plain-pod", PLAIN_POD), ("hami-pod", HAMI_POD)] {
        let parsed: AdmissionReview<'_> = serde_json::from_slice(body).unwrap();
        let request = parsed.request.unwrap();
        group.bench_function(name, |b| {
            b.iter(|| decide(black_box(&request), &settings));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

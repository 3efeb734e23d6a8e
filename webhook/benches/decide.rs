//! The decision alone, without TLS or HTTP: parse the AdmissionReview, decide, write the response.
//! `cargo bench -p hami-webhook --bench decide`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hami_webhook::policy::basis::FixedBasis;
use hami_webhook::wire::review::AdmissionReview;
use hami_webhook::{Settings, decide, review};

const PLAIN_POD: &[u8] = include_bytes!("../tests/fixtures/plain-pod.json");
const HAMI_POD: &[u8] = include_bytes!("../tests/fixtures/hami-pod.json");
const KAI_SMALL: &[u8] = include_bytes!("../tests/fixtures/kai-fraction-small.json");
const KAI_LARGE: &[u8] = include_bytes!("../tests/fixtures/kai-fraction-large.json");
const FIXTURES: [(&str, &[u8]); 4] = [
    ("plain-pod", PLAIN_POD),
    ("hami-pod", HAMI_POD),
    ("kai-fraction-small", KAI_SMALL),
    ("kai-fraction-large", KAI_LARGE),
];

fn bench(c: &mut Criterion) {
    // The defaults (KAI: file delivery), with the basis the KAI benchmark's server uses.
    let settings = Settings::default();
    let vram = FixedBasis(16384);
    let mut group = c.benchmark_group("review");
    for (name, body) in FIXTURES {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| review(black_box(body), &settings, &vram).unwrap());
        });
    }
    group.finish();

    // `decide` on an already-parsed request: the policy itself.
    let mut group = c.benchmark_group("decide");
    for (name, body) in FIXTURES {
        let parsed: AdmissionReview<'_> = serde_json::from_slice(body).unwrap();
        let request = parsed.request.unwrap();
        group.bench_function(name, |b| {
            b.iter(|| decide(black_box(&request), &settings, &vram));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! A `gpu-fraction` pod's required node affinity is tenant input searched against the node index:
//! over the `kai.maxAffinity*` limits it is refused with a message naming the field, the count and
//! the setting; within them, however large, it gets the basis of the nodes it names. (What these
//! cost is measured in `bench/affinity`, not here.)

use hami_webhook::policy::kai::KaiSettings;
use hami_webhook::policy::settings::Settings;
use hami_webhook::shell::vram::VramIndex;
use hami_webhook::{Decision, Outcome, VramBasis, decide_pod, review};
use serde_json::{Value, json};

const SMALL: &str = include_str!("../fixtures/kai-fraction-small.json");
const NODES: usize = 10_000;
const TERMS: &str =
    "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";

/// 10,000 GPU nodes: node-N has host=hN, zone zN%4, and 20,000 + N MiB (node-0 the smallest).
fn index() -> VramIndex {
    let mut i = VramIndex::new();
    for n in 0..NODES {
        let mib = (20_000 + n).to_string();
        let host = format!("h{n}");
        let zone = format!("z{}", n % 4);
        i.upsert(
            &format!("node-{n}"),
            [
                ("nvidia.com/gpu.memory", mib.as_str()),
                ("host", host.as_str()),
                ("zone", zone.as_str()),
            ],
        );
    }
    i
}

fn review_json() -> Value {
    serde_json::from_str(SMALL).unwrap()
}

fn with_terms(terms: Value) -> Value {
    let mut r = review_json();
    r["request"]["object"]["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}});
    r
}

fn decide(review: &Value, settings: &Settings, vram: &dyn VramBasis) -> Decision {
    let bytes = serde_json::to_vec(&review["request"]["object"]).unwrap();
    let pod: hami_webhook::wire::pod::Pod<'_> = serde_json::from_slice(&bytes).unwrap();
    decide_pod(&pod, Some("ml-team"), settings, vram)
}

fn denial(d: Decision) -> String {
    match d {
        Decision::Deny { message } => message,
        other => panic!("not denied: {other:?}"),
    }
}

/// The patch of an allowed decision, as JSON (what the basis became is in it).
fn patch(d: Decision) -> String {
    match d {
        Decision::Allow { patch, .. } => serde_json::to_string(&patch).unwrap(),
        other => panic!("not allowed: {other:?}"),
    }
}

/// `NotIn host` of every host but `keep`'s.
fn all_hosts_but(keep: usize) -> Value {
    let values: Vec<String> = (0..NODES)
        .filter(|n| *n != keep)
        .map(|n| format!("h{n}"))
        .collect();
    json!({"key": "host", "operator": "NotIn", "values": values})
}

#[test]
fn values_over_the_limit_are_refused_naming_the_field_and_setting() {
    let index = index();
    let values: Vec<String> = (0..70_000).map(|n| format!("h{n}")).collect();
    let r = with_terms(json!([
        {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "host", "operator": "NotIn", "values": values}]}
    ]));
    let message = denial(decide(&r, &Settings::default(), &index));
    assert!(message.starts_with("pod ml-team/"), "{message}");
    assert!(
        message.ends_with(&format!(
            ": {TERMS}[1].matchExpressions[0].values has 70000 values; at most 10000 are accepted (setting kai.maxAffinityValues)"
        )),
        "{message}"
    );
    // The operator can raise it; the pod is then admitted with the basis of the nodes it allows
    // (every node, by the first term: node-0's).
    let raised = Settings {
        kai: KaiSettings {
            max_affinity_values: 70_000,
            ..KaiSettings::default()
        },
        ..Settings::default()
    };
    let mut pinned = review_json();
    pinned["request"]["object"]["spec"]["nodeName"] = json!("node-0");
    assert_eq!(
        patch(decide(&r, &raised, &index)),
        patch(decide(&pinned, &raised, &index))
    );
}

#[test]
fn terms_and_expressions_over_the_limit_are_refused() {
    let index = index();
    let many_terms: Vec<Value> = (0..65)
        .map(|_| json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}))
        .collect();
    let message = denial(decide(
        &with_terms(json!(many_terms)),
        &Settings::default(),
        &index,
    ));
    assert!(
        message.ends_with(&format!(
            ": {TERMS} has 65 terms; at most 64 are accepted (setting kai.maxAffinityTerms)"
        )),
        "{message}"
    );
    let exprs: Vec<Value> = (0..257)
        .map(|_| json!({"key": "zone", "operator": "Exists"}))
        .collect();
    let message = denial(decide(
        &with_terms(json!([{"matchExpressions": exprs}])),
        &Settings::default(),
        &index,
    ));
    assert!(
        message.ends_with(&format!(
            ": {TERMS} has 257 matchExpressions and matchFields in all; at most 256 are accepted (setting kai.maxAffinityExpressions)"
        )),
        "{message}"
    );
}

#[test]
fn a_pod_at_every_limit_gets_the_basis_of_the_nodes_it_allows() {
    let index = index();
    let s = Settings::default();
    // 64 terms, 256 expressions, 10,000 values. 63 terms no node satisfies, each failing only at
    // its last requirement (2 values and 3 expressions each: 126 values, 189 expressions), and one
    // term of 66 requirements every node satisfies and a NotIn of the other 9,874 values, which
    // excludes node-0 … node-9873: the basis is node-9874's.
    let mut terms: Vec<Value> = (0..63)
        .map(|_| {
            json!({"matchExpressions": [
                {"key": "zone", "operator": "Exists"},
                {"key": "host", "operator": "NotIn", "values": ["nowhere"]},
                {"key": "zone", "operator": "In", "values": ["z9"]}
            ]})
        })
        .collect();
    let mut last: Vec<Value> = (0..66)
        .map(|_| json!({"key": "zone", "operator": "Exists"}))
        .collect();
    let hosts: Vec<String> = (0..9_874).map(|n| format!("h{n}")).collect();
    last.push(json!({"key": "host", "operator": "NotIn", "values": hosts}));
    terms.push(json!({"matchExpressions": last}));
    let r = with_terms(json!(terms));
    let mut pinned = review_json();
    pinned["request"]["object"]["spec"]["nodeName"] = json!("node-9874");
    assert_eq!(
        patch(decide(&r, &s, &index)),
        patch(decide(&pinned, &s, &index))
    );
    // One value more: refused.
    let mut over = r.clone();
    let values = &mut over["request"]["object"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][63]["matchExpressions"][66]["values"];
    values.as_array_mut().unwrap().push(json!("h9874"));
    let message = denial(decide(&over, &s, &index));
    assert!(
        message.ends_with(&format!(
            ": {TERMS} has 10001 values in all; at most 10000 are accepted (setting kai.maxAffinityValues)"
        )),
        "{message}"
    );
}

#[test]
fn with_the_limit_raised_many_values_find_the_one_node_left() {
    let index = index();
    let raised = Settings {
        kai: KaiSettings {
            max_affinity_values: NODES,
            ..KaiSettings::default()
        },
        ..Settings::default()
    };
    let r = with_terms(json!([{"matchExpressions": [all_hosts_but(7777)]}]));
    let mut pinned = review_json();
    pinned["request"]["object"]["spec"]["nodeName"] = json!("node-7777");
    assert_eq!(
        patch(decide(&r, &raised, &index)),
        patch(decide(&pinned, &raised, &index))
    );
}

#[test]
fn an_eight_mib_review_is_refused_by_the_limit() {
    // The largest body the server reads (bodyMemoryBytes, 8 MiB), posted straight to /mutate: one
    // NotIn expression of short values filling it.
    let index = index();
    let n = 8 * 1024 * 1024 / 8;
    let values: Vec<String> = (0..n).map(|i| format!("{i:05}")).collect();
    let r = with_terms(
        json!([{"matchExpressions": [{"key": "host", "operator": "NotIn", "values": values}]}]),
    );
    let body = serde_json::to_vec(&r).unwrap();
    assert!(body.len() >= 8 * 1024 * 1024, "{}", body.len());
    let out = review(&body, &Settings::default(), &index).unwrap();
    assert_eq!(out.outcome, Outcome::Denied);
    let message = out.message.unwrap();
    assert!(
        message.ends_with(&format!(
            ": {TERMS}[0].matchExpressions[0].values has {n} values; at most 10000 are accepted (setting kai.maxAffinityValues)"
        )),
        "{message}"
    );
}

#[test]
fn the_limits_apply_only_where_the_index_is_searched() {
    let index = index();
    let values: Vec<String> = (0..20_000).map(|n| format!("h{n}")).collect();
    let terms =
        json!([{"matchExpressions": [{"key": "host", "operator": "NotIn", "values": values}]}]);
    // gpu-memory needs no basis; a fixed per-GPU VRAM needs no search.
    let mut memory = with_terms(terms.clone());
    let annotations = &mut memory["request"]["object"]["metadata"]["annotations"];
    annotations.as_object_mut().unwrap().remove("gpu-fraction");
    annotations["gpu-memory"] = json!("4096");
    assert!(matches!(
        decide(&memory, &Settings::default(), &index),
        Decision::Allow { .. }
    ));
    let fixed = Settings {
        kai: KaiSettings {
            per_gpu_vram_mib: Some(16384),
            ..KaiSettings::default()
        },
        ..Settings::default()
    };
    assert!(matches!(
        decide(&with_terms(terms), &fixed, &index),
        Decision::Allow { .. }
    ));
}

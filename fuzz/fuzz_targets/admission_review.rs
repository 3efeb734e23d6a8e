//! The webhook's decision, end to end over the bytes of an AdmissionReview: never a panic; a JSON
//! body is always answered with an AdmissionReview carrying the request's uid; and when the bytes
//! are a pod object, every patch applies to it, writes no `0m`, leading zero, CR or white space
//! into a memory limit, projects limits files that parse without a diagnostic, and reviewing the
//! patched pod again changes nothing.
#![no_main]

use hami_webhook::Settings;
use hami_webhook::policy::basis::FixedBasis;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn review_of(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz-uid",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ns",
            "object": pod,
        }
    }))
    .unwrap_or_default()
}

fn response(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).expect("the response is JSON");
    assert_eq!(v["kind"], "AdmissionReview");
    v["response"].clone()
}

fn memory_values_are_safe(pod: &Value) {
    for list in ["containers", "initContainers"] {
        for c in pod["spec"][list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                let name = e["name"].as_str().unwrap_or("");
                if name.starts_with("CUDA_DEVICE_MEMORY_LIMIT") {
                    if let Some(v) = e["value"].as_str() {
                        // Only the webhook writes these when the user did not; the user's own
                        // entries are left alone, so check only values it could have written.
                        if v.ends_with('m') && v[..v.len() - 1].bytes().all(|b| b.is_ascii_digit())
                        {
                            assert!(!v.starts_with('0'), "{name}={v}");
                        }
                    }
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let settings = Settings::default();
    let basis = FixedBasis(143_771);
    // 1. The raw bytes as a request body.
    if let Ok(reviewed) = hami_webhook::review(data, &settings, &basis) {
        let _ = response(&reviewed.body);
    }
    // 2. The bytes as a pod object.
    let Ok(pod) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if !pod.is_object() {
        return;
    }
    let Ok(reviewed) = hami_webhook::review(&review_of(&pod), &settings, &basis) else {
        panic!("a well-formed review was refused as a body");
    };
    let resp = response(&reviewed.body);
    assert_eq!(resp["uid"], "fuzz-uid");
    let Some(patch) = resp["patch"].as_str() else {
        return;
    };
    use base64_decode::decode;
    let ops: json_patch::Patch =
        serde_json::from_slice(&decode(patch)).expect("the patch is a JSONPatch");
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &ops).expect("the patch applies to the pod it was made for");
    memory_values_are_safe(&patched);
    for (k, v) in patched["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if k.starts_with("limits.hami.io/") {
            let text = v.as_str().expect("a limits file is a string");
            let parsed = hami_shared::limits_file::parse(text);
            assert!(
                parsed.diagnostics.is_empty(),
                "{k}: {text:?}: {:?}",
                parsed.diagnostics
            );
        }
    }
    // Idempotent: the mutated pod reviewed again gets no patch and no new warning.
    let again = hami_webhook::review(&review_of(&patched), &settings, &basis)
        .expect("the patched pod is a well-formed review");
    let again = response(&again.body);
    assert!(again["allowed"].as_bool().unwrap_or(false), "{again}");
    assert!(again["patch"].is_null(), "re-review patched again: {again}");
});

/// Standard base64 (the AdmissionReview `patch` field), without a dependency for four lines.
mod base64_decode {
    pub fn decode(text: &str) -> Vec<u8> {
        let val = |c: u8| match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        };
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u32, 0);
        for c in text.bytes() {
            let Some(v) = val(c) else { continue };
            acc = (acc << 6) | u32::from(v);
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        out
    }
}

//! Offline equals online: what `hami-webhook mutate` says of a pod (the library function, fed the
//! pod as YAML text and as JSON text) must be what `review` answers to an AdmissionReview carrying
//! the same pod: the same stored pod (the input with review's JSONPatch applied), the same patch,
//! the same warnings, the same denial text, and invalid for both or neither. `mutate`'s own output
//! fed back to it must give the same pod again.
//!
//! Used by the test modules whose helpers decide pods (each of their pods is checked too) and by
//! `cli.rs`, which runs it over the corpus of pods.

use base64::Engine as _;
use hami_webhook::policy::basis::VramBasis;
use hami_webhook::policy::settings::Settings;
use hami_webhook::shell::offline_commands::{MutateOutput, mutate_command};
use serde_json::{Value, json};

/// What one side said about a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Admitted: the pod as it would be stored, the JSONPatch, the warnings.
    Admitted {
        pod: Value,
        patch: Value,
        warnings: Vec<String>,
    },
    /// Refused by policy, with the message the user sees.
    Denied(String),
    /// Not a valid Pod (review: `allowed: false` with code 400; mutate: exit 2).
    Invalid,
}

impl Verdict {
    /// The stored pod, when admitted.
    pub fn pod(&self) -> Option<&Value> {
        match self {
            Self::Admitted { pod, .. } => Some(pod),
            _ => None,
        }
    }
}

/// `pod` as the API server hands it to admission: `kind`/`apiVersion` set, quantities as strings,
/// `metadata.namespace` filled (from `namespace`, else `default`, as `mutate` assumes).
pub fn as_admitted(pod: &Value, namespace: Option<&str>) -> Value {
    let mut pod = pod.clone();
    if let Value::Object(map) = &mut pod {
        map.entry("kind").or_insert_with(|| json!("Pod"));
        map.entry("apiVersion").or_insert_with(|| json!("v1"));
        let metadata = map.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(meta) = metadata {
            let has = meta
                .get("namespace")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if !has {
                meta.insert(
                    "namespace".to_owned(),
                    json!(namespace.unwrap_or("default")),
                );
            }
        }
    }
    hami_webhook::shell::pod_manifest::quantities_as_strings(&mut pod);
    pod
}

/// A CREATE AdmissionReview carrying `pod` in the pod's namespace.
pub fn wrap(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7d1b4c62-offline-online",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": pod,
        }
    })
}

/// `review`'s answer to the AdmissionReview `body`, whose object is `pod`.
pub fn online(body: &[u8], pod: &Value, settings: &Settings, vram: &dyn VramBasis) -> Verdict {
    let reviewed = hami_webhook::review(body, settings, vram).unwrap();
    let out: Value = serde_json::from_slice(&reviewed.body).unwrap();
    let response = &out["response"];
    if response["allowed"] != json!(true) {
        let message = response["status"]["message"].as_str().unwrap().to_owned();
        return match response["status"]["code"].as_u64() {
            Some(403) => Verdict::Denied(message),
            Some(400) => Verdict::Invalid,
            other => panic!("review answered code {other:?}: {response}"),
        };
    }
    let patch = match response["patch"].as_str() {
        Some(b64) => {
            assert_eq!(response["patchType"], "JSONPatch");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            serde_json::from_slice(&bytes).unwrap()
        }
        None => json!([]),
    };
    let warnings = response["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    Verdict::Admitted {
        pod: apply(pod, &patch),
        patch,
        warnings,
    }
}

/// `patch` applied to `pod`, as the API server applies it.
pub fn apply(pod: &Value, patch: &Value) -> Value {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &ops).unwrap_or_else(|e| panic!("{e}: {patch:#}"));
    doc
}

/// What `mutate` says of `text` (YAML or JSON): the printed pod, the printed patch (`--patch`),
/// the warnings printed before anything else on stderr.
pub fn offline(text: &str, settings: &Settings, vram: &dyn VramBasis) -> Verdict {
    let out = mutate_command(text.as_bytes(), MutateOutput::Pod, settings, vram);
    let with_patch = mutate_command(text.as_bytes(), MutateOutput::Patch, settings, vram);
    assert_eq!(out.code, with_patch.code, "{}", out.stderr);
    assert_eq!(out.stderr, with_patch.stderr);
    match out.code {
        0 => {
            let pod: Value = serde_yaml_ng::from_str(&out.stdout).unwrap();
            let patch: Value = serde_json::from_str(&with_patch.stdout).unwrap();
            let warnings: Vec<String> = out
                .stderr
                .lines()
                .filter_map(|l| l.strip_prefix("warning: ").map(str::to_owned))
                .collect();
            // Multi-line warnings would be cut by `lines`: the printed form must be exactly the
            // warnings, each on its own line, before the limits files.
            let printed: String = warnings.iter().map(|w| format!("warning: {w}\n")).collect();
            assert!(out.stderr.starts_with(&printed), "{}", out.stderr);
            assert_eq!(
                out.stderr
                    .ends_with("unchanged: the webhook would admit this pod as is\n"),
                patch == json!([]),
                "{}",
                out.stderr
            );
            assert!(out.stdout.ends_with('\n'));
            Verdict::Admitted {
                pod,
                patch,
                warnings,
            }
        }
        1 => {
            assert!(out.stdout.is_empty());
            let message = out
                .stderr
                .strip_prefix("denied: ")
                .and_then(|m| m.strip_suffix('\n'))
                .unwrap_or_else(|| panic!("{}", out.stderr));
            Verdict::Denied(message.to_owned())
        }
        2 => {
            assert!(out.stdout.is_empty());
            assert!(
                out.stderr
                    .starts_with("hami-webhook mutate: not a valid Pod: "),
                "mutate refused the input itself: {}",
                out.stderr
            );
            Verdict::Invalid
        }
        code => panic!("mutate exited {code}: {}", out.stderr),
    }
}

/// Check offline against online for `pod` (as the API server would admit it) and return the
/// verdict. `label` names the case in failures.
pub fn check_pod(label: &str, pod: &Value, settings: &Settings, vram: &dyn VramBasis) -> Verdict {
    let pod = as_admitted(pod, None);
    let body = serde_json::to_vec(&wrap(&pod)).unwrap();
    let verdict = online(&body, &pod, settings, vram);
    agree(label, &pod, &verdict, settings, vram);
    verdict
}

/// Check offline against online for a CREATE review as a test built it (its own envelope and
/// bytes, the object's namespace filled from the request as the API server fills it). Other
/// reviews, and objects whose namespace is not the request's (the API server refuses those before
/// admission), are not pods `mutate` would be given: `None`.
pub fn check_review(
    label: &str,
    review: &Value,
    settings: &Settings,
    vram: &dyn VramBasis,
) -> Option<Verdict> {
    let request = &review["request"];
    if request["operation"] != "CREATE" || !request["object"].is_object() {
        return None;
    }
    if let Some(kind) = request.get("kind")
        && (kind["kind"] != "Pod" || kind["group"].as_str().is_some_and(|g| !g.is_empty()))
    {
        return None;
    }
    let namespace = request["namespace"].as_str()?;
    let pod = in_namespace(&request["object"], namespace)?;
    let mut filled = review.clone();
    filled["request"]["object"] = pod.clone();
    let body = serde_json::to_vec(&filled).unwrap();
    let verdict = online(&body, &pod, settings, vram);
    agree(label, &pod, &verdict, settings, vram);
    Some(verdict)
}

/// Check offline against online for `pod` decided in `namespace` (as `decide_pod` is called with
/// a request namespace); `None` when the pod names another namespace.
pub fn check_in(
    label: &str,
    pod: &Value,
    namespace: &str,
    settings: &Settings,
    vram: &dyn VramBasis,
) -> Option<Verdict> {
    let pod = in_namespace(pod, namespace)?;
    Some(check_pod(label, &pod, settings, vram))
}

/// `pod` as admitted in `namespace`, unless it names another one.
fn in_namespace(pod: &Value, namespace: &str) -> Option<Value> {
    let own = pod["metadata"]["namespace"].as_str();
    if own.is_some_and(|o| !o.is_empty() && o != namespace) {
        return None;
    }
    Some(as_admitted(pod, Some(namespace)))
}

/// `mutate` of `pod` as JSON text and as YAML text says `online`; an admitted pod's output fed
/// back gives the same pod.
pub fn agree(
    label: &str,
    pod: &Value,
    online: &Verdict,
    settings: &Settings,
    vram: &dyn VramBasis,
) {
    let json_text = serde_json::to_string_pretty(pod).unwrap();
    let yaml_text = serde_yaml_ng::to_string(pod).unwrap();
    for (form, text) in [("JSON", &json_text), ("YAML", &yaml_text)] {
        let offline = offline(text, settings, vram);
        assert_eq!(
            &offline, online,
            "{label}: mutate of the pod as {form} disagrees with review\n{text}"
        );
    }
    if let Verdict::Admitted { pod: stored, .. } = online {
        let again = offline(&serde_yaml_ng::to_string(stored).unwrap(), settings, vram);
        assert_eq!(
            again.pod(),
            Some(stored),
            "{label}: mutate of mutate's own output changed the pod: {again:?}"
        );
    }
}

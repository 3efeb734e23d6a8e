//! UPDATE of a pod: what an update may not do to the annotations the webhook owns.
//!
//! Kubelet re-reads a projected file when a container restarts, so a pod that could rewrite its
//! `limits.hami.io/<container>` annotation could raise its own limit. Those keys are written at
//! creation ([`crate::policy::kai::downward`]) and frozen after it: an update that adds, changes or
//! removes one is denied, naming the key. The HAMi scheduler's annotations and label
//! ([`crate::policy::tenancy::scheduler_owned`]) may be added, changed or removed only by the
//! usernames of `tenancy.schedulerAnnotationWriters`. A changed `hami.io/limit-delivery` must be
//! valid (an unchanged legacy value is let through: the pod was admitted with it), and may not
//! become `env` in a namespace of `tenancy.forbidEnvDeliveryNamespaces`. Anything else is allowed
//! unchanged: no patch is ever made on UPDATE.

use std::collections::BTreeMap;

use hami_shared::names::ANNOTATION_LIMIT_DELIVERY;
use hami_shared::values::LimitDelivery;

use crate::policy::kai::downward::ANNOTATION_PREFIX;
use crate::policy::mutation::Decision;
use crate::policy::tenancy::TenancySettings;
use crate::policy::tenancy::scheduler_owned;
use crate::wire::pod::{ObjectMeta, Pod, PodMetadata};

/// How many offending keys a message names before it says "and N more".
const NAMED_KEYS: usize = 5;

/// The webhook-owned annotations of `meta` (the last entry of a key wins, as the API server
/// reads JSON).
fn owned<'m>(meta: &'m ObjectMeta<'_>) -> BTreeMap<&'m str, &'m str> {
    meta.annotations
        .iter()
        .flat_map(|a| a.iter())
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .collect()
}

/// Decide an UPDATE of a pod from `old` to `pod` asked by `user` (`request.userInfo.username`).
#[must_use]
pub fn review(
    pod: &Pod<'_>,
    old: &PodMetadata<'_>,
    request_namespace: Option<&str>,
    user: Option<&str>,
    tenancy: &TenancySettings,
) -> Decision {
    let deny = |reason: String| Decision::Deny {
        message: format!("pod {}: {reason}", pod.display_name(request_namespace)),
    };
    let before = owned(&old.metadata);
    let after = owned(&pod.metadata);
    let mut changes: Vec<String> = Vec::new();
    for (key, value) in &after {
        match before.get(key) {
            None => changes.push(format!("adds {key:?}")),
            Some(was) if was != value => changes.push(format!("changes {key:?}")),
            Some(_) => {}
        }
    }
    for key in before.keys() {
        if !after.contains_key(key) {
            changes.push(format!("removes {key:?}"));
        }
    }
    if !changes.is_empty() {
        let more = changes.len().saturating_sub(NAMED_KEYS);
        changes.truncate(NAMED_KEYS);
        let mut list = changes.join(", ");
        if more > 0 {
            list.push_str(&format!(" and {more} more"));
        }
        return deny(format!(
            "this update {list}: the {ANNOTATION_PREFIX}* annotations hold the limits files hami-limits wrote when the pod was created and may not be added, changed or removed afterwards (create a new pod instead)"
        ));
    }
    if let Some(reason) =
        scheduler_owned::review_update(&pod.metadata, &old.metadata, user, tenancy)
    {
        return deny(reason);
    }
    let was = old
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LIMIT_DELIVERY));
    if let Some(value) = pod.annotation(ANNOTATION_LIMIT_DELIVERY)
        && Some(value) != was
    {
        match crate::policy::delivery::parse(value) {
            Err(reason) => return deny(reason.to_string()),
            Ok(LimitDelivery::Env) => {
                let namespace = request_namespace
                    .filter(|n| !n.is_empty())
                    .or(pod.metadata.namespace.as_deref());
                if let Some(reason) = crate::policy::delivery::forbidden(namespace, tenancy) {
                    return deny(reason);
                }
            }
            Ok(LimitDelivery::File) => {}
        }
    }
    Decision::allow()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decide(old: &serde_json::Value, new: &serde_json::Value) -> Decision {
        let old_text = old.to_string();
        let new_text = new.to_string();
        let old: PodMetadata<'_> = serde_json::from_str(&old_text).unwrap();
        let new: Pod<'_> = serde_json::from_str(&new_text).unwrap();
        review(&new, &old, Some("ml"), None, &TenancySettings::default())
    }

    fn pod(annotations: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [{"name": "train"}]}})
    }

    #[test]
    fn owned_annotations_are_frozen() {
        let file = "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_LIMITS_FORMAT=1\n";
        let raised = "CUDA_DEVICE_MEMORY_LIMIT=999999m\nHAMI_LIMITS_FORMAT=1\n";
        let mutated = pod(json!({"gpu-fraction": "0.25", "limits.hami.io/train": file}));
        // (old, new, expected denial fragment or None for allowed)
        let cases: Vec<(serde_json::Value, serde_json::Value, Option<&str>)> = vec![
            (mutated.clone(), mutated.clone(), None),
            (
                mutated.clone(),
                pod(json!({"gpu-fraction": "0.25", "limits.hami.io/train": file, "team": "a"})),
                None,
            ),
            (
                mutated.clone(),
                pod(json!({"gpu-fraction": "0.25", "limits.hami.io/train": raised})),
                Some("this update changes \"limits.hami.io/train\""),
            ),
            (
                mutated.clone(),
                pod(json!({"gpu-fraction": "0.25"})),
                Some("this update removes \"limits.hami.io/train\""),
            ),
            (
                mutated.clone(),
                pod(json!(null)),
                Some("this update removes \"limits.hami.io/train\""),
            ),
            (
                mutated.clone(),
                pod(
                    json!({"gpu-fraction": "0.25", "limits.hami.io/train": file, "limits.hami.io/sidecar": raised}),
                ),
                Some("this update adds \"limits.hami.io/sidecar\""),
            ),
            (
                pod(json!({"app": "x"})),
                pod(json!({"app": "x", "limits.hami.io/train": raised})),
                Some("this update adds \"limits.hami.io/train\""),
            ),
            (
                pod(json!({"app": "x"})),
                pod(json!({"app": "x", "limits.hami.io/": raised})),
                Some("this update adds \"limits.hami.io/\""),
            ),
            // Other keys are not ours, however close.
            (
                pod(json!({"app": "x"})),
                pod(
                    json!({"app": "x", "limits.hami.io.evil/train": raised, "x.limits.hami.io/train": raised}),
                ),
                None,
            ),
        ];
        for (old, new, expected) in cases {
            let got = decide(&old, &new);
            match expected {
                None => assert_eq!(got, Decision::allow(), "{new}"),
                Some(fragment) => {
                    let Decision::Deny { message } = got else {
                        panic!("not denied: {new}");
                    };
                    assert!(message.starts_with("pod ml/p: "), "{message}");
                    assert!(message.contains(fragment), "{message}");
                    assert!(
                        message.contains("may not be added, changed or removed"),
                        "{message}"
                    );
                }
            }
        }
    }

    #[test]
    fn many_changes_are_named_up_to_five() {
        let old = pod(json!({}));
        let mut new_annotations = serde_json::Map::new();
        for i in 0..8 {
            new_annotations.insert(format!("limits.hami.io/c{i}"), json!("x"));
        }
        let Decision::Deny { message } = decide(&old, &pod(new_annotations.into())) else {
            panic!("not denied");
        };
        assert!(message.contains("c4\" and 3 more"), "{message}");
    }

    #[test]
    fn limit_delivery_changes_must_be_valid_unchanged_legacy_values_pass() {
        let cases: &[(Option<&str>, Option<&str>, bool)] = &[
            (None, Some("env"), true),
            (None, Some("file"), true),
            (Some("file"), Some("env"), true),
            (Some("env"), None, true),
            (None, Some("FILE"), false),
            (Some("file"), Some("bogus"), false),
            // Admitted before this check (or while the webhook was away): left as it is.
            (Some("legacy"), Some("legacy"), true),
            (Some("legacy"), Some("other"), false),
        ];
        for &(old, new, allowed) in cases {
            let annotations = |v: Option<&str>| match v {
                Some(v) => json!({"hami.io/limit-delivery": v}),
                None => json!({}),
            };
            let got = decide(&pod(annotations(old)), &pod(annotations(new)));
            if allowed {
                assert_eq!(got, Decision::allow(), "{old:?} -> {new:?}");
            } else {
                let Decision::Deny { message } = got else {
                    panic!("{old:?} -> {new:?} not denied");
                };
                assert!(message.contains("is not one of: env, file"), "{message}");
            }
        }
    }
}

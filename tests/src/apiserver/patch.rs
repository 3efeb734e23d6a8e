//! The three patch formats of `PATCH`: JSON merge patch (RFC 7386), JSON patch (RFC 6902, `test`
//! included) and strategic merge patch for the fields of the served types.

use serde_json::{Map, Value};

use super::status::ApiError;

/// Patch format, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply, approximated; see tests/README.md)
    Apply,
}

impl PatchKind {
    /// The patch kind of a `Content-Type` value.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().map(str::trim) {
            Some("application/merge-patch+json") => Some(Self::Merge),
            Some("application/json-patch+json") => Some(Self::Json),
            Some("application/strategic-merge-patch+json") => Some(Self::Strategic),
            Some("application/apply-patch+yaml" | "application/apply-patch+cbor") => {
                Some(Self::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a patch body to `doc`.
pub(crate) fn apply(kind: PatchKind, doc: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    match kind {
        PatchKind::Merge => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::merge(doc, &patch);
            Ok(())
        }
        PatchKind::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            // Like the apiserver: a patch that does not apply (a failed `test`, a missing path) is a
            // 422 without causes; the document is left untouched.
            json_patch::patch(doc, &patch).map_err(|e| ApiError::unprocessable(e.to_string()))
        }
        PatchKind::Strategic => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            strategic_merge(doc, &patch)
        }
        PatchKind::Apply => {
            let patch: Value = serde_yaml_ng::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
            strategic_merge(doc, &patch)
        }
    }
}

/// The `patchMergeKey` of a list field, by field name, for the types this server serves.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "webhooks"
        | "resourceClaims"
        | "readinessGates" => match field {
            "readinessGates" => "conditionType",
            _ => "name",
        },
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" | "addresses" => "type",
        "taints" => "key",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// Lists of scalars merged as sets (`patchStrategy: merge` on a `[]string`).
fn is_primitive_merge_list(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch: maps merge with `null` deleting a key, lists with a merge key merge by
/// that key (`$patch: delete` removes an element), `$patch: replace` replaces, other lists replace.
pub(crate) fn strategic_merge(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match (doc, patch) {
        (Value::Object(target), Value::Object(p)) => merge_object(target, p),
        (doc, p) => {
            *doc = strip_directives(p);
            Ok(())
        }
    }
}

fn merge_object(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = match strip_directives(&Value::Object(patch.clone())) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            return Ok(());
        }
        Some("delete") => {
            target.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other}"
            )));
        }
    }
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(remove)) = (target.get_mut(field), value)
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(p) => {
                let entry = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !entry.is_object() {
                    *entry = Value::Object(Map::new());
                }
                if let Value::Object(t) = entry {
                    merge_object(t, p)?;
                }
            }
            Value::Array(items) => {
                let existing = target.get_mut(key);
                match (existing, merge_key(key)) {
                    (Some(Value::Array(list)), Some(mk)) => merge_list(list, items, mk)?,
                    (Some(Value::Array(list)), None) if is_primitive_merge_list(key) => {
                        for item in items {
                            if !list.contains(item) {
                                list.push(item.clone());
                            }
                        }
                    }
                    _ => {
                        let kept: Vec<Value> = items
                            .iter()
                            .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                            .map(strip_directives)
                            .collect();
                        target.insert(key.clone(), Value::Array(kept));
                    }
                }
            }
            scalar => {
                target.insert(key.clone(), scalar.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(list: &mut Vec<Value>, items: &[Value], key: &str) -> Result<(), ApiError> {
    for item in items {
        let Some(obj) = item.as_object() else {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch: list merged by {key:?} holds a non-object element: {item}"
            )));
        };
        let Some(id) = obj.get(key) else {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch: map in list merged by {key:?} has no {key:?} field: {item}"
            )));
        };
        let pos = list.iter().position(|e| e.get(key) == Some(id));
        match (obj.get("$patch").and_then(Value::as_str), pos) {
            (Some("delete"), Some(i)) => {
                list.remove(i);
            }
            (Some("delete"), None) => {}
            (Some("replace"), Some(i)) => list[i] = strip_directives(item),
            (_, Some(i)) => {
                if let Value::Object(t) = &mut list[i] {
                    merge_object(t, obj)?;
                }
            }
            (_, None) => list.push(strip_directives(item)),
        }
    }
    Ok(())
}

/// A patch fragment as a plain value: directives and `null`s (deletions of absent keys) removed.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_maps_and_lists() {
        let mut doc = json!({
            "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {"containers": [{"name": "c1", "image": "i1", "env": [{"name": "A", "value": "1"}]},
                                    {"name": "c2", "image": "i2"}],
                     "tolerations": [{"key": "k"}]}
        });
        let patch = json!({
            "metadata": {"labels": {"a": null, "c": "3"}, "finalizers": ["y"]},
            "spec": {"containers": [{"name": "c1", "env": [{"name": "B", "value": "2"}]},
                                    {"name": "c2", "$patch": "delete"},
                                    {"name": "c3", "image": "i3"}],
                     "tolerations": [{"key": "z"}]}
        });
        strategic_merge(&mut doc, &patch).unwrap();
        assert_eq!(doc["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["x", "y"]));
        let cs = doc["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["image"], "i1");
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2);
        assert_eq!(cs[1]["name"], "c3");
        assert_eq!(doc["spec"]["tolerations"], json!([{"key": "z"}]));
    }

    #[test]
    fn json_patch_test_failure_leaves_doc_untouched() {
        let mut doc = json!({"metadata": {"annotations": {"x": "1"}}});
        let body = br#"[{"op":"add","path":"/metadata/annotations/y","value":"2"},
                        {"op":"test","path":"/metadata/annotations/x","value":"2"}]"#;
        let err = apply(PatchKind::Json, &mut doc, body).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(doc, json!({"metadata": {"annotations": {"x": "1"}}}));
    }
}

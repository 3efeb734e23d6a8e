//! What the apiserver adds to objects on create (registry strategies, defaulting and the default
//! admission plugins), for the fields our components read.

use serde_json::{Map, Value, json};

use super::resources::ResourceType;
use super::status::ApiError;

fn set_default(m: &mut Map<String, Value>, key: &str, v: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), v);
    }
}

/// Applies create-time defaults to an object of the given type.
pub(crate) fn on_create(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    match (rt.group, rt.plural) {
        ("", "pods") => pod(obj),
        ("", "secrets") => secret(obj),
        ("", "namespaces") => {
            if let Some(m) = obj.as_object_mut() {
                m.insert("spec".into(), json!({ "finalizers": ["kubernetes"] }));
                m.insert("status".into(), json!({ "phase": "Active" }));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn image_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else {
        match last.split_once(':') {
            None => "Always",
            Some((_, "latest")) => "Always",
            Some(_) => "IfNotPresent",
        }
    }
}

fn default_container(c: &mut Value) {
    let Some(m) = c.as_object_mut() else { return };
    set_default(m, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(m, "terminationMessagePolicy", json!("File"));
    let policy = image_pull_policy(m.get("image").and_then(Value::as_str).unwrap_or_default());
    set_default(m, "imagePullPolicy", json!(policy));
    set_default(m, "resources", json!({}));
    if let Some(Value::Array(ports)) = m.get_mut("ports") {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(p, "protocol", json!("TCP"));
        }
    }
}

/// QoS class from container requests and limits (`GetPodQOS`, cpu and memory only).
pub(crate) fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec.get(*k).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in containers {
        let res = c.get("resources");
        let requests = res.and_then(|r| r.get("requests"));
        let limits = res.and_then(|r| r.get("limits"));
        for r in ["cpu", "memory"] {
            let req = requests.and_then(|q| q.get(r));
            let lim = limits.and_then(|q| q.get(r));
            if req.is_some() || lim.is_some() {
                any = true;
            }
            // A missing request defaults to the limit.
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(q), Some(l)) if q != l => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn pod(obj: &mut Value) -> Result<(), ApiError> {
    let Some(root) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body is not a JSON object",
        ));
    };
    let spec = root.entry("spec").or_insert_with(|| json!({}));
    if let Some(s) = spec.as_object_mut() {
        set_default(s, "restartPolicy", json!("Always"));
        set_default(s, "terminationGracePeriodSeconds", json!(30));
        set_default(s, "dnsPolicy", json!("ClusterFirst"));
        set_default(s, "securityContext", json!({}));
        set_default(s, "schedulerName", json!("default-scheduler"));
        set_default(s, "serviceAccountName", json!("default"));
        let sa = s
            .get("serviceAccountName")
            .cloned()
            .unwrap_or(json!("default"));
        set_default(s, "serviceAccount", sa);
        set_default(s, "enableServiceLinks", json!(true));
        set_default(s, "preemptionPolicy", json!("PreemptLowerPriority"));
        set_default(s, "priority", json!(0));
        for key in ["containers", "initContainers"] {
            if let Some(Value::Array(cs)) = s.get_mut(key) {
                cs.iter_mut().for_each(default_container);
            }
        }
        // DefaultTolerationSeconds admission plugin.
        let tolerations = s.entry("tolerations").or_insert_with(|| json!([]));
        if let Value::Array(ts) = tolerations {
            for key in [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            ] {
                if !ts
                    .iter()
                    .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
                {
                    ts.push(json!({
                        "key": key,
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 300,
                    }));
                }
            }
        }
    }
    let qos = qos_class(&root["spec"]);
    root.insert(
        "status".into(),
        json!({ "phase": "Pending", "qosClass": qos }),
    );
    Ok(())
}

fn secret(obj: &mut Value) -> Result<(), ApiError> {
    let Some(root) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body is not a JSON object",
        ));
    };
    set_default(root, "type", json!("Opaque"));
    // stringData is write-only: merged into data (base64) and dropped.
    if let Some(Value::Object(string_data)) = root.remove("stringData") {
        let data = root.entry("data").or_insert_with(|| json!({}));
        if let Value::Object(d) = data {
            for (k, v) in string_data {
                let text = v.as_str().unwrap_or_default().as_bytes().to_vec();
                let encoded = serde_json::to_value(k8s_openapi::ByteString(text))
                    .map_err(|e| ApiError::internal(format!("encoding stringData: {e}")))?;
                d.insert(k, encoded);
            }
        }
    }
    Ok(())
}

/// Applies update-time normalization (secret `stringData` folds into `data`).
pub(crate) fn on_update(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    if (rt.group, rt.plural) == ("", "secrets") && obj.get("stringData").is_some() {
        return secret(obj);
    }
    Ok(())
}

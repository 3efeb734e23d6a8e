//! Reading a pod held as JSON (what kubectl and the peers' stand-ins hand back).

use serde_json::Value;

/// The pod's init containers, then its containers.
#[must_use]
pub fn containers(pod: &Value) -> Vec<&Value> {
    let spec = &pod["spec"];
    spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(spec["containers"].as_array().into_iter().flatten())
        .collect()
}

/// Every `env` entry of container `c` named `name` (a duplicate shows as two).
#[must_use]
pub fn env_entries<'c>(c: &'c Value, name: &str) -> Vec<&'c Value> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == name)
        .collect()
}

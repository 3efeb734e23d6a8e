//! Discovery documents: `/api`, `/api/v1`, `/apis`, `/apis/{group}`, `/apis/{group}/{version}`
//! (legacy and aggregated v2 forms) and `/version`.

use serde_json::{Value, json};

use super::resources::{RESOURCES, ResourceType, groups};

/// Media type of aggregated discovery responses.
pub(crate) const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether the client asked for aggregated discovery (`as=APIGroupDiscoveryList`).
pub(crate) fn wants_aggregated(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=APIGroupDiscoveryList") && first.contains("v=v2"))
}

pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn api_resources(group: &str, version: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        out.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
            "shortNames": r.short_names,
        }));
        if r.status_subresource {
            out.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    out
}

/// `APIResourceList` of a group version, or `None` when it is not served.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let resources = api_resources(group, version);
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

fn api_group(group: &str) -> Value {
    let gv = json!({ "groupVersion": format!("{group}/v1"), "version": "v1" });
    json!({
        "name": group,
        "versions": [gv.clone()],
        "preferredVersion": gv,
    })
}

/// `APIGroup` of a served group.
pub(crate) fn group(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| {
        let mut g = api_group(group);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        g
    })
}

pub(crate) fn group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups().into_iter().map(api_group).collect::<Vec<_>>(),
    })
}

fn aggregated_resource(r: &ResourceType) -> Value {
    let gvk = json!({ "group": r.group, "version": r.version, "kind": r.kind });
    let mut res = json!({
        "resource": r.plural,
        "responseKind": gvk,
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": r.verbs(),
    });
    if !r.short_names.is_empty() {
        res["shortNames"] = json!(r.short_names);
    }
    if r.status_subresource {
        res["subresources"] = json!([{
            "subresource": "status",
            "responseKind": gvk,
            "verbs": ["get", "patch", "update"],
        }]);
    }
    res
}

fn aggregated_group(group: &str) -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group)
        .map(aggregated_resource)
        .collect();
    let mut metadata = json!({});
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    json!({
        "metadata": metadata,
        "versions": [{ "version": "v1", "resources": resources, "freshness": "Current" }],
    })
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2`) of the core group (`/api`) or of the named
/// groups (`/apis`).
pub(crate) fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group("")]
    } else {
        groups().into_iter().map(aggregated_group).collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "emulationMajor": "1",
        "emulationMinor": "34",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "33",
        "gitVersion": "v1.34.1",
        "gitCommit": "93248f9ae092f571eb870b7664c534bfc7d00f03",
        "gitTreeState": "clean",
        "buildDate": "2025-09-09T19:43:15Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

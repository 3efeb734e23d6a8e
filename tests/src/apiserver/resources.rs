//! The resource types the server serves, as one table: discovery, routing and field selectors all
//! read it, so adding a type is one entry.

/// One served resource (group/version/plural), with what the real apiserver says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; `""` for the core group.
    pub group: &'static str,
    /// API version, e.g. `v1`.
    pub version: &'static str,
    /// Plural resource name used in URLs, e.g. `pods`.
    pub plural: &'static str,
    /// Singular name reported by discovery.
    pub singular: &'static str,
    /// Kind, e.g. `Pod`.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names reported by discovery (`po`, `no`, ...).
    pub short_names: &'static [&'static str],
    /// Whether a `/status` subresource exists (then the main resource ignores status changes and the
    /// subresource ignores spec changes, as the real registry strategies do).
    pub status_subresource: bool,
    /// Field selectors beyond `metadata.name` / `metadata.namespace`: (selector key, JSON path, value
    /// when the field is absent).
    pub field_selectors: &'static [(&'static str, &'static [&'static str], &'static str)],
    /// Whether `DELETE` answers with the deleted object (true) or a `Status` (false).
    pub delete_returns_object: bool,
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` for the core group, `mutatingwebhookconfigurations.admissionregistration.k8s.io` otherwise,
    /// as the apiserver names a resource in error messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `PodList`, `NodeList`, ...
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Verbs reported by discovery.
    pub fn verbs(&self) -> &'static [&'static str] {
        &[
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    /// The storage key of this type (`group/plural`).
    pub(crate) fn key(&self) -> (&'static str, &'static str) {
        (self.group, self.plural)
    }
}

const POD_FIELDS: &[(&str, &[&str], &str)] = &[
    ("spec.nodeName", &["spec", "nodeName"], ""),
    ("spec.restartPolicy", &["spec", "restartPolicy"], ""),
    ("spec.schedulerName", &["spec", "schedulerName"], ""),
    (
        "spec.serviceAccountName",
        &["spec", "serviceAccountName"],
        "",
    ),
    ("spec.hostNetwork", &["spec", "hostNetwork"], "false"),
    ("status.phase", &["status", "phase"], ""),
    ("status.podIP", &["status", "podIP"], ""),
    (
        "status.nominatedNodeName",
        &["status", "nominatedNodeName"],
        "",
    ),
];

const NODE_FIELDS: &[(&str, &[&str], &str)] =
    &[("spec.unschedulable", &["spec", "unschedulable"], "false")];

const SECRET_FIELDS: &[(&str, &[&str], &str)] = &[("type", &["type"], "")];

const NAMESPACE_FIELDS: &[(&str, &[&str], &str)] = &[("status.phase", &["status", "phase"], "")];

const CORE_EVENT_FIELDS: &[(&str, &[&str], &str)] = &[
    ("involvedObject.kind", &["involvedObject", "kind"], ""),
    (
        "involvedObject.namespace",
        &["involvedObject", "namespace"],
        "",
    ),
    ("involvedObject.name", &["involvedObject", "name"], ""),
    ("involvedObject.uid", &["involvedObject", "uid"], ""),
    (
        "involvedObject.apiVersion",
        &["involvedObject", "apiVersion"],
        "",
    ),
    (
        "involvedObject.resourceVersion",
        &["involvedObject", "resourceVersion"],
        "",
    ),
    (
        "involvedObject.fieldPath",
        &["involvedObject", "fieldPath"],
        "",
    ),
    ("reason", &["reason"], ""),
    ("reportingComponent", &["reportingComponent"], ""),
    ("source", &["source", "component"], ""),
    ("type", &["type"], ""),
];

const EVENTS_V1_FIELDS: &[(&str, &[&str], &str)] = &[
    ("regarding.kind", &["regarding", "kind"], ""),
    ("regarding.namespace", &["regarding", "namespace"], ""),
    ("regarding.name", &["regarding", "name"], ""),
    ("regarding.uid", &["regarding", "uid"], ""),
    ("reason", &["reason"], ""),
    ("reportingController", &["reportingController"], ""),
    ("type", &["type"], ""),
];

/// Every resource type the server serves.
pub static RESOURCES: &[ResourceType] = &[
    ResourceType {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        status_subresource: true,
        field_selectors: POD_FIELDS,
        delete_returns_object: true,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        status_subresource: true,
        field_selectors: NODE_FIELDS,
        delete_returns_object: true,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        status_subresource: false,
        field_selectors: SECRET_FIELDS,
        delete_returns_object: false,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        status_subresource: false,
        field_selectors: &[],
        delete_returns_object: false,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        status_subresource: false,
        field_selectors: CORE_EVENT_FIELDS,
        delete_returns_object: false,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        status_subresource: true,
        field_selectors: NAMESPACE_FIELDS,
        delete_returns_object: true,
    },
    ResourceType {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        status_subresource: false,
        field_selectors: EVENTS_V1_FIELDS,
        delete_returns_object: false,
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "mutatingwebhookconfigurations",
        singular: "mutatingwebhookconfiguration",
        kind: "MutatingWebhookConfiguration",
        namespaced: false,
        short_names: &[],
        status_subresource: false,
        field_selectors: &[],
        delete_returns_object: false,
    },
];

/// The served type at `group/version/plural`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The served type of a `k8s_openapi` type, e.g. `resource_of::<Pod>()`.
pub fn resource_of<K: k8s_openapi::Resource>() -> Option<&'static ResourceType> {
    lookup(K::GROUP, K::VERSION, K::URL_PATH_SEGMENT)
}

/// Groups other than core, in discovery order.
pub(crate) fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

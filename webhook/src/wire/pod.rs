//! The minimal, borrowed view of a Pod that admission decisions read.
//!
//! Only the fields some decision needs are kept; serde skips everything else without allocating.
//! Strings are `Cow<'a, str>` so that they borrow from the request body unless JSON escapes force a
//! copy. Arrays that a patch may extend are `Option<Vec<_>>` so that "absent" is visible: a JSONPatch
//! `add …/-` fails on a missing array and the whole array must be added instead.

use std::borrow::Cow;
use std::fmt;

use hami_shared::container::SpecEnv;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The scheduler name Kubernetes fills in when a pod names none.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// A JSON object of string → string (annotations, labels, resource lists, node selectors), kept
/// in document order as a small vector: these maps hold a handful of entries and a linear scan
/// beats hashing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrMap<'a>(pub Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'a> StrMap<'a> {
    /// The value for `key`, if present.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_ref())
    }

    /// Whether `key` is present.
    #[must_use]
    pub fn contains_key(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// The entries, in document order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))
    }

    /// Number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrMap<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for MapVisitor<'a> {
            type Value = StrMap<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(StrMap::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(4));
                while let Some((k, v)) = map.next_entry::<BorrowedStr<'a>, BorrowedStr<'a>>()? {
                    entries.push((k.0, v.0));
                }
                Ok(StrMap(entries))
            }
        }
        deserializer.deserialize_any(MapVisitor(std::marker::PhantomData))
    }
}

/// `Option<Cow<str>>` that borrows from the input when it can (serde's own `Option<Cow>` always
/// copies).
pub(crate) fn opt_cow<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Cow<'a, str>>, D::Error> {
    Ok(Option::<BorrowedStr<'a>>::deserialize(deserializer)?.map(|s| s.0))
}

/// A string that borrows from the input when it can.
pub(crate) struct BorrowedStr<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for BorrowedStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
            type Value = BorrowedStr<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(StrVisitor(std::marker::PhantomData))
    }
}

/// `metadata` of the Pod.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub generate_name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub namespace: Option<Cow<'a, str>>,
    /// `None` when the pod has no `annotations` object (a patch must then add the whole map).
    #[serde(borrow, default)]
    pub annotations: Option<StrMap<'a>>,
    #[serde(borrow, default)]
    pub labels: Option<StrMap<'a>>,
}

/// One `env` entry. Only the name matters to most decisions; the literal value is kept for those
/// that copy it (the limits file), and of `valueFrom` only the ConfigMap a `configMapKeyRef`
/// names (KAI's own entries are recognised by it).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub value: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub value_from: Option<EnvVarSource<'a>>,
}

impl EnvVar<'_> {
    /// Whether the variable comes from `valueFrom` (a ConfigMap, Secret, field or resource ref).
    #[must_use]
    pub fn is_value_from(&self) -> bool {
        self.value_from.is_some()
    }

    /// The ConfigMap of a `valueFrom.configMapKeyRef`, if that is where the value comes from.
    #[must_use]
    pub fn config_map_key_ref(&self) -> Option<&str> {
        self.value_from
            .as_ref()?
            .config_map_key_ref
            .as_ref()
            .map(|r| r.name.as_ref())
    }
}

/// `valueFrom` of an `env` entry: only the `configMapKeyRef`'s ConfigMap is read.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource<'a> {
    #[serde(borrow, default)]
    pub config_map_key_ref: Option<ObjectRef<'a>>,
}

/// A reference by name (`configMapKeyRef`, `configMapRef`, `secretRef`); the other fields are
/// skipped.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectRef<'a> {
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
}

/// One `envFrom` entry: every key of a ConfigMap or Secret, each name prefixed with `prefix`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSource<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub prefix: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub config_map_ref: Option<ObjectRef<'a>>,
    #[serde(borrow, default)]
    pub secret_ref: Option<ObjectRef<'a>>,
}

impl EnvFromSource<'_> {
    /// `configMapRef "<name>"` or `secretRef "<name>"`, for messages.
    #[must_use]
    pub fn describe(&self) -> String {
        match (&self.config_map_ref, &self.secret_ref) {
            (Some(c), _) => format!("configMapRef {:?}", c.name),
            (None, Some(s)) => format!("secretRef {:?}", s.name),
            (None, None) => "a source with no configMapRef or secretRef".to_owned(),
        }
    }
}

/// `resources` of a container.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Resources<'a> {
    #[serde(borrow, default, deserialize_with = "opt_quantity_map")]
    pub limits: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "opt_quantity_map")]
    pub requests: Option<StrMap<'a>>,
}

/// `resources.limits` / `requests`: quantities are strings on the wire, but a manifest may write
/// `nvidia.com/gpu: 1`, a number, which kubectl and the API server accept (as does k8s-openapi's
/// `Quantity`): a number is read as its decimal text.
fn opt_quantity_map<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<StrMap<'a>>, D::Error> {
    struct MapVisitor<'a>(std::marker::PhantomData<&'a ()>);
    impl<'de: 'a, 'a> Visitor<'de> for MapVisitor<'a> {
        type Value = Option<StrMap<'a>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of quantities")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(4));
            while let Some((k, v)) = map.next_entry::<BorrowedStr<'a>, QuantityText<'a>>()? {
                entries.push((k.0, v.0));
            }
            Ok(Some(StrMap(entries)))
        }
    }
    deserializer.deserialize_option(MapVisitor(std::marker::PhantomData))
}

/// A quantity: a string (borrowed when it can be), or a number as its decimal text.
struct QuantityText<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for QuantityText<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for QuantityVisitor<'a> {
            type Value = QuantityText<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity (a string such as \"1\" or \"500m\", or a number)")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(QuantityText(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(QuantityText(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(QuantityText(Cow::Owned(v)))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(QuantityText(Cow::Owned(v.to_string())))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(QuantityText(Cow::Owned(v.to_string())))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(QuantityText(Cow::Owned(v.to_string())))
            }
        }
        deserializer.deserialize_any(QuantityVisitor(std::marker::PhantomData))
    }
}

/// `securityContext` of a container (only what admission checks).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct SecurityContext {
    #[serde(default)]
    pub privileged: Option<bool>,
}

/// One `volumeMounts` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub mount_path: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub sub_path: Option<Cow<'a, str>>,
}

/// One container or init container.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container<'a> {
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub env: Option<Vec<EnvVar<'a>>>,
    #[serde(borrow, default)]
    pub env_from: Option<Vec<EnvFromSource<'a>>>,
    #[serde(borrow, default)]
    pub resources: Option<Resources<'a>>,
    #[serde(default)]
    pub security_context: Option<SecurityContext>,
    #[serde(borrow, default)]
    pub volume_mounts: Option<Vec<VolumeMount<'a>>>,
}

impl<'a> Container<'a> {
    /// The container's `env` entry named `name` that takes effect: the **last** one, as in
    /// Kubernetes.
    #[must_use]
    pub fn env_var(&self, name: &str) -> Option<&EnvVar<'a>> {
        self.env.as_deref()?.iter().rev().find(|e| e.name == name)
    }

    /// The `env` entries in order, as the shared limits builder reads them (`valueFrom` entries
    /// have no value).
    #[must_use]
    pub fn spec_env(&self) -> Vec<SpecEnv<'_>> {
        self.env
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|e| SpecEnv {
                name: &e.name,
                // No `value` and no `valueFrom` is the empty string to Kubernetes.
                value: if e.is_value_from() {
                    None
                } else {
                    Some(e.value.as_deref().unwrap_or(""))
                },
            })
            .collect()
    }

    /// `resources.limits[name]`.
    #[must_use]
    pub fn limit(&self, name: &str) -> Option<&str> {
        self.resources.as_ref()?.limits.as_ref()?.get(name)
    }

    /// Whether `name` appears in the container's limits or requests.
    #[must_use]
    pub fn names_resource(&self, name: &str) -> bool {
        self.resources.as_ref().is_some_and(|r| {
            r.limits.as_ref().is_some_and(|m| m.contains_key(name))
                || r.requests.as_ref().is_some_and(|m| m.contains_key(name))
        })
    }

    /// Whether `securityContext.privileged` is true.
    #[must_use]
    pub fn is_privileged(&self) -> bool {
        self.security_context
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    }
}

/// One `volumes` entry (the name is all a patch needs to avoid duplicates).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    /// `hostPath`, unparsed: read only when the name is one a decision owns.
    #[serde(borrow, default)]
    pub host_path: Option<&'a RawValue>,
    /// `downwardAPI`, unparsed: read only when the name is one a decision owns.
    #[serde(borrow, default, rename = "downwardAPI")]
    pub downward_api: Option<&'a RawValue>,
}

/// `spec` of the Pod.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub scheduler_name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub node_name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub node_selector: Option<StrMap<'a>>,
    /// Kept unparsed: only placement-aware decisions read it, and only for pods they select.
    #[serde(borrow, default)]
    pub affinity: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub init_containers: Option<Vec<Container<'a>>>,
    #[serde(borrow, default)]
    pub containers: Vec<Container<'a>>,
    #[serde(borrow, default)]
    pub volumes: Option<Vec<Volume<'a>>>,
}

/// The Pod, as admission sees it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod<'a> {
    #[serde(borrow, default)]
    pub metadata: ObjectMeta<'a>,
    #[serde(borrow, default)]
    pub spec: PodSpec<'a>,
}

/// Only the metadata of a Pod: the old object of an UPDATE, of which nothing else is read (its
/// spec is skipped unparsed).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMetadata<'a> {
    #[serde(borrow, default)]
    pub metadata: ObjectMeta<'a>,
}

/// Which list a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContainerKind {
    /// `spec.initContainers`.
    Init,
    /// `spec.containers`.
    Regular,
}

impl ContainerKind {
    /// The field name under `spec`.
    #[must_use]
    pub fn field(self) -> &'static str {
        match self {
            Self::Init => "initContainers",
            Self::Regular => "containers",
        }
    }
}

/// A container's position: which list and the index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerRef {
    pub kind: ContainerKind,
    pub index: usize,
}

impl<'a> Pod<'a> {
    /// `annotations[key]`.
    #[must_use]
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key)
    }

    /// `labels[key]`.
    #[must_use]
    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key)
    }

    /// Init containers first, then containers, with their positions.
    pub fn all_containers(&self) -> impl Iterator<Item = (ContainerRef, &Container<'a>)> {
        let init = self.spec.init_containers.as_deref().unwrap_or_default();
        init.iter()
            .enumerate()
            .map(|(index, c)| {
                (
                    ContainerRef {
                        kind: ContainerKind::Init,
                        index,
                    },
                    c,
                )
            })
            .chain(self.spec.containers.iter().enumerate().map(|(index, c)| {
                (
                    ContainerRef {
                        kind: ContainerKind::Regular,
                        index,
                    },
                    c,
                )
            }))
    }

    /// The container at `at`.
    #[must_use]
    pub fn container(&self, at: ContainerRef) -> Option<&Container<'a>> {
        match at.kind {
            ContainerKind::Init => self.spec.init_containers.as_deref()?.get(at.index),
            ContainerKind::Regular => self.spec.containers.get(at.index),
        }
    }

    /// `<namespace>/<name>` for messages; `generateName` stands in before the name is assigned and
    /// the request's namespace when the object carries none.
    #[must_use]
    pub fn display_name(&self, request_namespace: Option<&str>) -> String {
        let ns = self
            .metadata
            .namespace
            .as_deref()
            .filter(|s| !s.is_empty())
            .or(request_namespace)
            .unwrap_or("");
        let name = self
            .metadata
            .name
            .as_deref()
            .filter(|s| !s.is_empty())
            .or(self.metadata.generate_name.as_deref())
            .unwrap_or("");
        format!("{ns}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrows_plain_strings_and_copies_escaped_ones() {
        let json = br#"{"metadata":{"name":"a","annotations":{"k":"v\"x"}},"spec":{"containers":[{"name":"c"}]}}"#;
        let pod: Pod<'_> = serde_json::from_slice(json).unwrap();
        assert!(matches!(pod.metadata.name, Some(Cow::Borrowed("a"))));
        assert_eq!(pod.annotation("k"), Some("v\"x"));
        assert!(pod.spec.containers[0].env.is_none());
        assert!(pod.spec.volumes.is_none());
    }

    #[test]
    fn null_maps_are_empty() {
        let pod: Pod<'_> =
            serde_json::from_slice(br#"{"metadata":{"annotations":null},"spec":{}}"#).unwrap();
        assert_eq!(pod.metadata.annotations, None);
        let pod: Pod<'_> =
            serde_json::from_slice(br#"{"metadata":{"annotations":{}},"spec":{}}"#).unwrap();
        assert_eq!(pod.metadata.annotations, Some(StrMap::default()));
    }

    #[test]
    fn display_name_falls_back_to_generate_name_and_request_namespace() {
        let pod: Pod<'_> =
            serde_json::from_slice(br#"{"metadata":{"generateName":"train-"}}"#).unwrap();
        assert_eq!(pod.display_name(Some("ml")), "ml/train-");
    }
}

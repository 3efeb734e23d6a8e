//! Building RFC 6902 JSONPatches against the original pod.
//!
//! Several decision modules may add to the same array (two variables to one container's `env`, a
//! volume and its mounts). [`PodPatch`] collects the additions and emits them once, at the end, so
//! that an array the pod lacks is added whole (`add …/env` with every new entry) rather than
//! appended to (`add …/env/-` fails on a missing array), and paths stay valid in the order the
//! operations are applied.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::pod::{ContainerRef, Pod};

/// One JSONPatch operation. Only `add`, `replace` and (for webhook-owned annotations) `remove`
/// are ever produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchOp {
    pub op: PatchOpKind,
    pub path: String,
    /// `null` for `remove`, which carries no value.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub value: Value,
}

/// The operation name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchOpKind {
    Add,
    Replace,
    Remove,
}

/// Escape one JSON-Pointer reference token (RFC 6901: `~` → `~0`, `/` → `~1`), e.g. an annotation
/// key such as `hami.io/limit-delivery`.
#[must_use]
pub fn escape_token(token: &str) -> Cow<'_, str> {
    if token.contains(['~', '/']) {
        Cow::Owned(token.replace('~', "~0").replace('/', "~1"))
    } else {
        Cow::Borrowed(token)
    }
}

/// An `env` entry to add: `{"name": .., "value": ..}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEnvVar {
    pub name: String,
    pub value: String,
}

impl NewEnvVar {
    fn to_json(&self) -> Value {
        json!({ "name": self.name, "value": self.value })
    }
}

#[derive(Debug, Default)]
struct ContainerAdds {
    env: Vec<NewEnvVar>,
    volume_mounts: Vec<Value>,
}

/// Accumulates the changes the decision modules want and renders them as a JSONPatch that applies
/// to the original object.
#[derive(Debug)]
pub struct PodPatch<'p, 'a> {
    pod: &'p Pod<'a>,
    scalars: Vec<PatchOp>,
    annotations: Vec<(String, String)>,
    removed_annotations: Vec<String>,
    volumes: Vec<Value>,
    containers: BTreeMap<ContainerRef, ContainerAdds>,
}

impl<'p, 'a> PodPatch<'p, 'a> {
    /// An empty patch of `pod`.
    #[must_use]
    pub fn new(pod: &'p Pod<'a>) -> Self {
        Self {
            pod,
            scalars: Vec::new(),
            annotations: Vec::new(),
            removed_annotations: Vec::new(),
            volumes: Vec::new(),
            containers: BTreeMap::new(),
        }
    }

    /// The pod being patched.
    #[must_use]
    pub fn pod(&self) -> &'p Pod<'a> {
        self.pod
    }

    /// Whether nothing has been asked for.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.scalars.is_empty()
            && self.annotations.is_empty()
            && self.removed_annotations.is_empty()
            && self.volumes.is_empty()
            && self.containers.is_empty()
    }

    /// Set `spec.schedulerName`.
    pub fn set_scheduler_name(&mut self, name: &str) {
        // `add` on an object member replaces an existing value and creates a missing one.
        self.scalars.push(PatchOp {
            op: PatchOpKind::Add,
            path: "/spec/schedulerName".to_owned(),
            value: Value::String(name.to_owned()),
        });
    }

    /// Set (create or overwrite) annotation `key`.
    pub fn set_annotation(&mut self, key: &str, value: &str) {
        if let Some(slot) = self.annotations.iter_mut().find(|(k, _)| k == key) {
            value.clone_into(&mut slot.1);
        } else {
            self.annotations.push((key.to_owned(), value.to_owned()));
        }
    }

    /// Remove annotation `key` when the pod has it (a key a decision owns and the pod must not
    /// carry).
    pub fn remove_annotation(&mut self, key: &str) {
        let present = self
            .pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(key));
        if present && !self.removed_annotations.iter().any(|k| k == key) {
            self.removed_annotations.push(key.to_owned());
        }
    }

    /// Whether the container already defines `name` in its env, or this patch adds it.
    #[must_use]
    pub fn container_has_env(&self, at: ContainerRef, name: &str) -> bool {
        self.pod
            .container(at)
            .is_some_and(|c| c.env_var(name).is_some())
            || self
                .containers
                .get(&at)
                .is_some_and(|a| a.env.iter().any(|e| e.name == name))
    }

    /// Add `name=value` to the container's env. The caller has checked the variable is not set.
    pub fn add_env(&mut self, at: ContainerRef, name: &str, value: String) {
        self.containers.entry(at).or_default().env.push(NewEnvVar {
            name: name.to_owned(),
            value,
        });
    }

    /// Whether the pod has, or this patch adds, a volume named `name`.
    #[must_use]
    pub fn has_volume(&self, name: &str) -> bool {
        self.pod
            .spec
            .volumes
            .as_deref()
            .is_some_and(|v| v.iter().any(|v| v.name == name))
            || self
                .volumes
                .iter()
                .any(|v| v.get("name").and_then(Value::as_str) == Some(name))
    }

    /// Add a volume (a complete `Volume` object with a `name`).
    pub fn add_volume(&mut self, volume: Value) {
        self.volumes.push(volume);
    }

    /// Whether the container has, or this patch adds, a mount at `mount_path`.
    #[must_use]
    pub fn container_has_mount_path(&self, at: ContainerRef, mount_path: &str) -> bool {
        self.pod.container(at).is_some_and(|c| {
            c.volume_mounts
                .as_deref()
                .is_some_and(|m| m.iter().any(|m| m.mount_path == mount_path))
        }) || self.containers.get(&at).is_some_and(|a| {
            a.volume_mounts
                .iter()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(mount_path))
        })
    }

    /// Add a volume mount (a complete `VolumeMount` object) to the container.
    pub fn add_volume_mount(&mut self, at: ContainerRef, mount: Value) {
        self.containers
            .entry(at)
            .or_default()
            .volume_mounts
            .push(mount);
    }

    /// Render the operations, in an order that applies cleanly to the original object.
    #[must_use]
    pub fn into_ops(self) -> Vec<PatchOp> {
        let mut ops = self.scalars;
        for k in self.removed_annotations {
            ops.push(PatchOp {
                op: PatchOpKind::Remove,
                path: format!("/metadata/annotations/{}", escape_token(&k)),
                value: Value::Null,
            });
        }
        if !self.annotations.is_empty() {
            match &self.pod.metadata.annotations {
                Some(_) => {
                    for (k, v) in self.annotations {
                        ops.push(PatchOp {
                            op: PatchOpKind::Add,
                            path: format!("/metadata/annotations/{}", escape_token(&k)),
                            value: Value::String(v),
                        });
                    }
                }
                None => {
                    let map: serde_json::Map<String, Value> = self
                        .annotations
                        .into_iter()
                        .map(|(k, v)| (k, Value::String(v)))
                        .collect();
                    ops.push(PatchOp {
                        op: PatchOpKind::Add,
                        path: "/metadata/annotations".to_owned(),
                        value: Value::Object(map),
                    });
                }
            }
        }
        let has_volumes = self
            .pod
            .spec
            .volumes
            .as_deref()
            .is_some_and(|v| !v.is_empty());
        push_array_adds(
            &mut ops,
            "/spec/volumes".to_owned(),
            has_volumes,
            self.volumes,
        );
        for (at, adds) in self.containers {
            let Some(container) = self.pod.container(at) else {
                continue;
            };
            let base = format!("/spec/{}/{}", at.kind.field(), at.index);
            let has_env = container.env.as_deref().is_some_and(|e| !e.is_empty());
            let env = adds.env.iter().map(NewEnvVar::to_json).collect();
            push_array_adds(&mut ops, format!("{base}/env"), has_env, env);
            let has_mounts = container
                .volume_mounts
                .as_deref()
                .is_some_and(|m| !m.is_empty());
            push_array_adds(
                &mut ops,
                format!("{base}/volumeMounts"),
                has_mounts,
                adds.volume_mounts,
            );
        }
        ops
    }
}

/// Append `items` to the array at `path`: one `add …/-` per item when the array exists and is
/// non-empty, else one `add` of the whole array (which also replaces a `null` or `[]`).
fn push_array_adds(ops: &mut Vec<PatchOp>, path: String, exists: bool, items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if exists {
        let append = format!("{path}/-");
        for item in items {
            ops.push(PatchOp {
                op: PatchOpKind::Add,
                path: append.clone(),
                value: item,
            });
        }
    } else {
        ops.push(PatchOp {
            op: PatchOpKind::Add,
            path,
            value: Value::Array(items),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::ContainerKind;

    fn c0() -> ContainerRef {
        ContainerRef {
            kind: ContainerKind::Regular,
            index: 0,
        }
    }

    #[test]
    fn escapes_pointer_tokens() {
        assert_eq!(
            escape_token("hami.io/limit-delivery"),
            "hami.io~1limit-delivery"
        );
        assert_eq!(escape_token("a~/b"), "a~0~1b");
        assert!(matches!(escape_token("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn absent_env_gets_whole_array_present_env_gets_appends() {
        let pod: Pod<'_> = serde_json::from_str(
            r#"{"spec":{"containers":[{"name":"a"},{"name":"b","env":[{"name":"X","value":"1"}]}]}}"#,
        )
        .unwrap();
        let mut p = PodPatch::new(&pod);
        p.add_env(c0(), "A", "1".into());
        p.add_env(c0(), "B", "2".into());
        let c1 = ContainerRef {
            kind: ContainerKind::Regular,
            index: 1,
        };
        p.add_env(c1, "C", "3".into());
        assert!(p.container_has_env(c0(), "B"));
        assert!(p.container_has_env(c1, "X"));
        let ops = serde_json::to_value(p.into_ops()).unwrap();
        assert_eq!(
            ops,
            json!([
                {"op":"add","path":"/spec/containers/0/env","value":[{"name":"A","value":"1"},{"name":"B","value":"2"}]},
                {"op":"add","path":"/spec/containers/1/env/-","value":{"name":"C","value":"3"}}
            ])
        );
    }

    #[test]
    fn annotations_created_when_absent_and_escaped_when_present() {
        let pod: Pod<'_> = serde_json::from_str(r#"{"metadata":{}}"#).unwrap();
        let mut p = PodPatch::new(&pod);
        p.set_annotation("x.io/a", "1");
        p.set_annotation("x.io/a", "2");
        assert_eq!(
            serde_json::to_value(p.into_ops()).unwrap(),
            json!([{"op":"add","path":"/metadata/annotations","value":{"x.io/a":"2"}}])
        );
        let pod: Pod<'_> = serde_json::from_str(r#"{"metadata":{"annotations":{}}}"#).unwrap();
        let mut p = PodPatch::new(&pod);
        p.set_annotation("x.io/a", "1");
        assert_eq!(
            serde_json::to_value(p.into_ops()).unwrap(),
            json!([{"op":"add","path":"/metadata/annotations/x.io~1a","value":"1"}])
        );
    }

    #[test]
    fn volumes_and_mounts_never_duplicate_what_the_patch_adds() {
        let pod: Pod<'_> =
            serde_json::from_str(r#"{"spec":{"volumes":[],"containers":[{"name":"a"}]}}"#).unwrap();
        let mut p = PodPatch::new(&pod);
        assert!(!p.has_volume("v"));
        p.add_volume(json!({"name":"v","emptyDir":{}}));
        assert!(p.has_volume("v"));
        p.add_volume_mount(c0(), json!({"name":"v","mountPath":"/m"}));
        assert!(p.container_has_mount_path(c0(), "/m"));
        let ops = serde_json::to_value(p.into_ops()).unwrap();
        assert_eq!(
            ops,
            json!([
                {"op":"add","path":"/spec/volumes","value":[{"name":"v","emptyDir":{}}]},
                {"op":"add","path":"/spec/containers/0/volumeMounts","value":[{"name":"v","mountPath":"/m"}]}
            ])
        );
    }
}

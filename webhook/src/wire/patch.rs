//! Building RFC 6902 JSONPatches against the original pod.
//! The patch builder's arrays, escaping and byte budget share its private state, so they stay one
//! file with the tests of the patch's ordering and budget.
//!
//! Several decision modules may add to the same array (two variables to one container's `env`, a
//! volume and its mounts). [`PodPatch`] collects the additions and emits them once, at the end, so
//! that an array the pod lacks is added whole (`add …/env` with every new entry) rather than
//! appended to (`add …/env/-` fails on a missing array), and paths stay valid in the order the
//! operations are applied.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use serde_json::Value;

use crate::wire::pod::{ContainerRef, Pod};

/// One JSONPatch operation. Only `add`, `replace` and `remove` (webhook- and scheduler-owned
/// annotations and labels a pod may not carry) are ever produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchOp {
    pub op: PatchOpKind,
    pub path: String,
    /// [`PatchValue::Null`] for `remove`, which carries no value.
    #[serde(skip_serializing_if = "PatchValue::is_null")]
    pub value: PatchValue,
}

/// The value of an operation, serialized straight from its typed parts: the entries a pod gets
/// per container (env entries, mounts, downward-API items) never become a `serde_json::Value`
/// tree, which a 44-container pod would build, walk and free thousands of times a second.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PatchValue {
    /// No value (`remove`).
    Null,
    /// A string.
    String(String),
    /// Any JSON (rare objects such as the preload volume).
    Json(Value),
    /// An `env` entry.
    Env(NewEnvVar),
    /// A `volumeMounts` entry.
    Mount(NewMount),
    /// A `downwardAPI` volume.
    DownwardVolume(DownwardVolume),
    /// An array of values.
    Array(Vec<PatchValue>),
    /// An object of strings, in insertion order (annotations).
    Map(StringMap),
}

impl PatchValue {
    /// Whether this is [`PatchValue::Null`].
    #[must_use]
    pub fn is_null(&self) -> bool {
        matches!(self, Self::Null)
    }
}

/// An object of strings serialized in insertion order; keys are unique.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StringMap(pub Vec<(String, String)>);

impl Serialize for StringMap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// A `volumeMounts` entry to add.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewMount {
    pub name: String,
    pub mount_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// A `downwardAPI` volume projecting object fields as files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DownwardVolume {
    pub name: String,
    #[serde(rename = "downwardAPI")]
    pub downward_api: DownwardApi,
}

/// `downwardAPI` of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownwardApi {
    pub default_mode: u32,
    pub items: Vec<DownwardItem>,
}

/// One file of a `downwardAPI` volume: `path` ← `fieldRef.fieldPath`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownwardItem {
    pub path: String,
    pub field_ref: FieldRef,
}

/// `fieldRef` of a downward-API item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    pub api_version: &'static str,
    pub field_path: String,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewEnvVar {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Default)]
struct ContainerAdds {
    env: Vec<PatchValue>,
    /// Indexes into the container's own `env` to remove (duplicates another webhook appended).
    removed_env: Vec<usize>,
    volume_mounts: Vec<PatchValue>,
}

/// The largest JSONPatch a review may answer with: 1.5 MiB, etcd's default request limit
/// (`--max-request-bytes`), so no object carrying more could be stored anyway. A pod whose patch
/// would be larger is denied ([`PodPatch::over_budget`]), before the patch is built past it.
pub const MAX_PATCH_BYTES: usize = 3 << 19;

/// Bytes of JSON one operation adds besides its strings: `{"op":"add","path":"…","value":…}`,
/// the longest index path and the value's own keys, rounded up.
const OP_OVERHEAD: usize = 96;

/// Accumulates the changes the decision modules want and renders them as a JSONPatch that applies
/// to the original object. Every lookup is a hash or tree lookup, so a pod of N containers costs
/// O(N log N); the size the rendered patch will have is tracked (an upper estimate) and nothing is
/// kept once it passes [`MAX_PATCH_BYTES`].
#[derive(Debug)]
pub struct PodPatch<'p, 'a> {
    pod: &'p Pod<'a>,
    scalars: Vec<PatchOp>,
    annotations: Vec<(String, String)>,
    /// Key → index in `annotations`.
    annotation_index: HashMap<String, usize>,
    removed_annotations: Vec<String>,
    removed_index: HashSet<String>,
    removed_labels: Vec<String>,
    /// Estimated bytes of the rendered JSONPatch (at least its real size).
    bytes: usize,
    /// (name, volume).
    volumes: Vec<(String, PatchValue)>,
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
            annotation_index: HashMap::new(),
            removed_annotations: Vec::new(),
            removed_index: HashSet::new(),
            removed_labels: Vec::new(),
            bytes: 0,
            volumes: Vec::new(),
            containers: BTreeMap::new(),
        }
    }

    /// Whether the patch would exceed [`MAX_PATCH_BYTES`]; once it does, additions are dropped and
    /// the decision must deny the pod.
    #[must_use]
    pub fn over_budget(&self) -> bool {
        self.bytes > MAX_PATCH_BYTES
    }

    /// Count `n` more bytes; false when over budget (the caller then keeps nothing).
    fn spend(&mut self, n: usize) -> bool {
        self.bytes = self.bytes.saturating_add(n);
        !self.over_budget()
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
            && self.removed_labels.is_empty()
            && self.volumes.is_empty()
            && self.containers.is_empty()
    }

    /// Set `spec.schedulerName`.
    pub fn set_scheduler_name(&mut self, name: &str) {
        if !self.spend(OP_OVERHEAD + json_len(name)) {
            return;
        }
        // `add` on an object member replaces an existing value and creates a missing one.
        self.scalars.push(PatchOp {
            op: PatchOpKind::Add,
            path: "/spec/schedulerName".to_owned(),
            value: PatchValue::String(name.to_owned()),
        });
    }

    /// Set (create or overwrite) annotation `key` to `value`.
    pub fn set_annotation_owned(&mut self, key: String, value: String) {
        // The key twice: in the path (escaped) or as the member name.
        if !self.spend(OP_OVERHEAD + 2 * json_len(&key) + json_len(&value)) {
            return;
        }
        if let Some(&i) = self.annotation_index.get(&key) {
            self.annotations[i].1 = value;
        } else {
            self.annotation_index
                .insert(key.clone(), self.annotations.len());
            self.annotations.push((key, value));
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
        if present && !self.removed_index.contains(key) && self.spend(OP_OVERHEAD + json_len(key)) {
            self.removed_index.insert(key.to_owned());
            self.removed_annotations.push(key.to_owned());
        }
    }

    /// Remove label `key` when the pod has it (a key the pod must not carry).
    pub fn remove_label(&mut self, key: &str) {
        let present = self
            .pod
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(key));
        if present
            && !self.removed_labels.iter().any(|k| k == key)
            && self.spend(OP_OVERHEAD + json_len(key))
        {
            self.removed_labels.push(key.to_owned());
        }
    }

    /// Set `resources.limits[name]` of a container whose `resources.limits` exists (the caller
    /// checked; HAMi's `defaultGPUNum` is added only beside another HAMi limit).
    pub fn set_container_limit(&mut self, at: ContainerRef, name: &str, value: String) {
        self.scalars.push(PatchOp {
            op: PatchOpKind::Add,
            path: format!(
                "/spec/{}/{}/resources/limits/{}",
                at.kind.field(),
                at.index,
                escape_token(name)
            ),
            value: PatchValue::String(value),
        });
    }

    /// Set `resources.limits[name]` and `resources.requests[name]` to `value`, creating
    /// `resources`, `limits` or `requests` where the container lacks them (an extended resource
    /// needs both to agree; `add` of an object member creates or replaces it).
    pub fn set_container_resource(&mut self, at: ContainerRef, name: &str, value: &str) {
        if !self.spend(2 * (OP_OVERHEAD + json_len(name) + json_len(value))) {
            return;
        }
        let base = format!("/spec/{}/{}/resources", at.kind.field(), at.index);
        let entry = || {
            let mut map = serde_json::Map::new();
            map.insert(name.to_owned(), Value::String(value.to_owned()));
            Value::Object(map)
        };
        let resources = self.pod.container(at).and_then(|c| c.resources.as_ref());
        let Some(resources) = resources else {
            self.scalars.push(PatchOp {
                op: PatchOpKind::Add,
                path: base,
                value: PatchValue::Json(
                    serde_json::json!({"limits": entry(), "requests": entry()}),
                ),
            });
            return;
        };
        for (field, present) in [
            ("limits", resources.limits.is_some()),
            ("requests", resources.requests.is_some()),
        ] {
            let (path, value) = if present {
                (
                    format!("{base}/{field}/{}", escape_token(name)),
                    PatchValue::String(value.to_owned()),
                )
            } else {
                (format!("{base}/{field}"), PatchValue::Json(entry()))
            };
            self.scalars.push(PatchOp {
                op: PatchOpKind::Add,
                path,
                value,
            });
        }
    }

    /// Whether the container already defines `name` in its env, or this patch adds it.
    #[must_use]
    pub fn container_has_env(&self, at: ContainerRef, name: &str) -> bool {
        self.pod
            .container(at)
            .is_some_and(|c| c.env_var(name).is_some())
            || self.containers.get(&at).is_some_and(|a| {
                a.env
                    .iter()
                    .any(|e| matches!(e, PatchValue::Env(e) if e.name == name))
            })
    }

    /// Add `name=value` to the container's env. The caller has checked the variable is not set.
    pub fn add_env(&mut self, at: ContainerRef, name: &str, value: String) {
        if !self.spend(OP_OVERHEAD + json_len(name) + json_len(&value)) {
            return;
        }
        self.containers
            .entry(at)
            .or_default()
            .env
            .push(PatchValue::Env(NewEnvVar {
                name: name.to_owned(),
                value,
            }));
    }

    /// Remove the container's own `env[index]` (an entry that repeats an earlier one of the same
    /// name and value). Removals are rendered highest index first, before any addition.
    pub fn remove_env(&mut self, at: ContainerRef, index: usize) {
        if !self.spend(OP_OVERHEAD) {
            return;
        }
        let removed = &mut self.containers.entry(at).or_default().removed_env;
        if !removed.contains(&index) {
            removed.push(index);
        }
    }

    /// Whether the pod has, or this patch adds, a volume named `name`.
    #[must_use]
    pub fn has_volume(&self, name: &str) -> bool {
        self.pod
            .spec
            .volumes
            .as_deref()
            .is_some_and(|v| v.iter().any(|v| v.name == name))
            || self.volumes.iter().any(|(n, _)| n == name)
    }

    /// Add a volume (a complete `Volume` object with a `name`).
    pub fn add_volume(&mut self, volume: Value) {
        if !self.spend(OP_OVERHEAD + volume.to_string().len()) {
            return;
        }
        let name = volume
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.volumes.push((name, PatchValue::Json(volume)));
    }

    /// Add a `downwardAPI` volume.
    pub fn add_downward_volume(&mut self, volume: DownwardVolume) {
        let items: usize = volume
            .downward_api
            .items
            .iter()
            .map(|i| 64 + json_len(&i.path) + json_len(&i.field_ref.field_path))
            .sum();
        if !self.spend(OP_OVERHEAD + json_len(&volume.name) + items) {
            return;
        }
        self.volumes
            .push((volume.name.clone(), PatchValue::DownwardVolume(volume)));
    }

    /// Whether the container has, or this patch adds, a mount at `mount_path` (a clean absolute
    /// path; the container's own paths are compared cleaned).
    #[must_use]
    pub fn container_has_mount_path(&self, at: ContainerRef, mount_path: &str) -> bool {
        self.pod.container(at).is_some_and(|c| {
            c.volume_mounts.as_deref().is_some_and(|m| {
                m.iter()
                    .any(|m| crate::wire::mountpath::resolve(&m.mount_path) == mount_path)
            })
        }) || self.containers.get(&at).is_some_and(|a| {
            a.volume_mounts
                .iter()
                .any(|m| matches!(m, PatchValue::Mount(m) if m.mount_path == mount_path))
        })
    }

    /// Add a volume mount to the container.
    pub fn add_volume_mount(&mut self, at: ContainerRef, mount: NewMount) {
        let strings = json_len(&mount.name)
            + json_len(&mount.mount_path)
            + mount.sub_path.as_deref().map_or(0, |s| 16 + json_len(s));
        // `mountPath`, `subPath`, `readOnly` keys besides the common ones.
        if !self.spend(OP_OVERHEAD + 64 + strings) {
            return;
        }
        self.containers
            .entry(at)
            .or_default()
            .volume_mounts
            .push(PatchValue::Mount(mount));
    }

    /// Render the operations, in an order that applies cleanly to the original object.
    #[must_use]
    pub fn into_ops(self) -> Vec<PatchOp> {
        let mut ops = self.scalars;
        for k in self.removed_labels {
            ops.push(PatchOp {
                op: PatchOpKind::Remove,
                path: format!("/metadata/labels/{}", escape_token(&k)),
                value: PatchValue::Null,
            });
        }
        for k in self.removed_annotations {
            ops.push(PatchOp {
                op: PatchOpKind::Remove,
                path: format!("/metadata/annotations/{}", escape_token(&k)),
                value: PatchValue::Null,
            });
        }
        if !self.annotations.is_empty() {
            match &self.pod.metadata.annotations {
                Some(_) => {
                    for (k, v) in self.annotations {
                        ops.push(PatchOp {
                            op: PatchOpKind::Add,
                            path: format!("/metadata/annotations/{}", escape_token(&k)),
                            value: PatchValue::String(v),
                        });
                    }
                }
                None => {
                    ops.push(PatchOp {
                        op: PatchOpKind::Add,
                        path: "/metadata/annotations".to_owned(),
                        value: PatchValue::Map(StringMap(self.annotations)),
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
            self.volumes.into_iter().map(|(_, v)| v).collect(),
        );
        for (at, adds) in self.containers {
            let Some(container) = self.pod.container(at) else {
                continue;
            };
            let base = format!("/spec/{}/{}", at.kind.field(), at.index);
            let mut removed = adds.removed_env;
            removed.sort_unstable_by(|a, b| b.cmp(a));
            for index in removed {
                ops.push(PatchOp {
                    op: PatchOpKind::Remove,
                    path: format!("{base}/env/{index}"),
                    value: PatchValue::Null,
                });
            }
            let has_env = container.env.as_deref().is_some_and(|e| !e.is_empty());
            push_array_adds(&mut ops, format!("{base}/env"), has_env, adds.env);
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

/// An upper bound of the bytes `s` takes as a JSON string (every byte escaped as `\u00XX` at
/// worst would be 6×; control characters are rare, so count quotes and 2× for `"` and `\`).
fn json_len(s: &str) -> usize {
    2 + s.len()
        + s.bytes()
            .map(|b| match b {
                b'"' | b'\\' => 1,
                0..0x20 => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// Append `items` to the array at `path`: one `add …/-` per item when the array exists and is
/// non-empty, else one `add` of the whole array (which also replaces a `null` or `[]`).
fn push_array_adds(ops: &mut Vec<PatchOp>, path: String, exists: bool, items: Vec<PatchValue>) {
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
            value: PatchValue::Array(items),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::pod::ContainerKind;
    use serde_json::json;

    fn c0() -> ContainerRef {
        ContainerRef {
            kind: ContainerKind::Regular,
            index: 0,
        }
    }

    #[test]
    fn size_estimate_is_never_below_the_rendered_patch() {
        let containers: Vec<String> = (0..300)
            .map(|i| format!(r#"{{"name":"c{i}","env":[{{"name":"A","value":"1"}}],"volumeMounts":[{{"name":"v","mountPath":"/v"}}]}}"#))
            .collect();
        let json = format!(
            r#"{{"metadata":{{"annotations":{{"limits.hami.io/old":"x"}}}},"spec":{{"volumes":[{{"name":"v"}}],"initContainers":[{{"name":"i"}}],"containers":[{}]}}}}"#,
            containers.join(",")
        );
        let pod: Pod<'_> = serde_json::from_str(&json).unwrap();
        let mut p = PodPatch::new(&pod);
        p.set_scheduler_name("hami-scheduler");
        p.remove_annotation("limits.hami.io/old");
        p.add_volume(json!({"name": "w", "hostPath": {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}}));
        for (at, c) in pod.all_containers() {
            p.add_env(at, "CUDA_DEVICE_MEMORY_LIMIT", "4096m".into());
            p.add_env(at, "QUOTED", "a\"b\\c\u{1}".into());
            p.set_annotation_owned(
                format!("limits.hami.io/{}", c.name),
                "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_LIMITS_FORMAT=1\n".into(),
            );
            for (path, sub) in [
                ("/usr/local/vgpu", None),
                ("/etc/ld.so.preload", Some("ld.so.preload")),
            ] {
                p.add_volume_mount(
                    at,
                    NewMount {
                        name: "kai-resource-isolator-vgpu".into(),
                        mount_path: path.into(),
                        sub_path: sub.map(str::to_owned),
                        read_only: true,
                    },
                );
            }
        }
        p.add_downward_volume(DownwardVolume {
            name: "hami-limits".into(),
            downward_api: DownwardApi {
                default_mode: 0o444,
                items: pod
                    .all_containers()
                    .map(|(_, c)| DownwardItem {
                        path: c.name.to_string(),
                        field_ref: FieldRef {
                            api_version: "v1",
                            field_path: format!(
                                "metadata.annotations['limits.hami.io/{}']",
                                c.name
                            ),
                        },
                    })
                    .collect(),
            },
        });
        assert!(!p.over_budget());
        let estimate = p.bytes;
        let real = serde_json::to_vec(&p.into_ops()).unwrap().len();
        assert!(estimate >= real, "estimate {estimate} < real {real}");
        assert!(
            estimate < real * 2,
            "estimate {estimate} far above real {real}"
        );
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
        p.set_annotation_owned("x.io/a".to_owned(), "1".to_owned());
        p.set_annotation_owned("x.io/a".to_owned(), "2".to_owned());
        assert_eq!(
            serde_json::to_value(p.into_ops()).unwrap(),
            json!([{"op":"add","path":"/metadata/annotations","value":{"x.io/a":"2"}}])
        );
        let pod: Pod<'_> = serde_json::from_str(r#"{"metadata":{"annotations":{}}}"#).unwrap();
        let mut p = PodPatch::new(&pod);
        p.set_annotation_owned("x.io/a".to_owned(), "1".to_owned());
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
        p.add_volume_mount(
            c0(),
            NewMount {
                name: "v".into(),
                mount_path: "/m".into(),
                sub_path: None,
                read_only: false,
            },
        );
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

//! The VRAM index: GPU nodes, their labels (interned: 10,000 nodes with GFD's ~60 labels each fit
//! in a few MiB) and their GPU memory, ordered by memory so that the unconstrained basis is one
//! lookup and a constrained one stops at the first node that matches. Pure data: no lock, no
//! metric, no I/O; [`super::live`] shares it with the watch and [`super::watch`] fills it.
//! (Over 500 lines: 445 of code, the rest the table tests of node narrowing beside the index they
//! pin; the interner, the index and its compiled lookup share private types, so they stay one file.)

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use hami_shared::names::LABEL_GPU_MEMORY;
use serde::Deserialize;

use crate::policy::basis::{Basis, SkipReason, VramBasis};
use crate::policy::placement::{NodeView, Placement, Requirement};

/// `nvidia.com/gpu.memory` values at or above this are bytes (very old GFD), not MiB.
pub const BYTES_THRESHOLD: u64 = 1_048_576;

/// Why a label value is not a usable GPU memory size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuMemoryLabelError {
    /// Not a decimal integer.
    #[error("{LABEL_GPU_MEMORY}={0:?} is not a decimal integer of MiB")]
    NotInteger(String),
    /// Zero (or bytes below 1 MiB).
    #[error("{LABEL_GPU_MEMORY}={0:?} is zero")]
    Zero(String),
}

/// Read an `nvidia.com/gpu.memory` label: integer MiB; values ≥ 1,048,576 are bytes.
///
/// # Errors
/// [`GpuMemoryLabelError`] for anything else (it is ignored, logged and counted).
pub fn parse_gpu_memory_label(value: &str) -> Result<u64, GpuMemoryLabelError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(GpuMemoryLabelError::NotInteger(value.to_owned()));
    }
    let n: u64 = value
        .parse()
        .map_err(|_| GpuMemoryLabelError::NotInteger(value.to_owned()))?;
    let mib = if n >= BYTES_THRESHOLD { n >> 20 } else { n };
    if mib == 0 {
        return Err(GpuMemoryLabelError::Zero(value.to_owned()));
    }
    Ok(mib)
}

// ---------------------------------------------------------------------------------------------
// The index
// ---------------------------------------------------------------------------------------------

/// Strings stored once, referred to by number.
#[derive(Debug, Default, Clone)]
struct Interner {
    ids: HashMap<Arc<str>, u32>,
    strings: Vec<Arc<str>>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.strings.len()).unwrap_or(u32::MAX);
        let s: Arc<str> = Arc::from(s);
        self.strings.push(Arc::clone(&s));
        self.ids.insert(s, id);
        id
    }

    fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    fn resolve(&self, id: u32) -> &str {
        self.strings.get(id as usize).map_or("", |s| s)
    }

    fn heap_bytes(&self) -> usize {
        let strings: usize = self.strings.iter().map(|s| s.len() + 16).sum();
        strings
            + self.strings.capacity() * std::mem::size_of::<Arc<str>>()
            + self.ids.capacity() * (std::mem::size_of::<(Arc<str>, u32)>() + 1)
    }
}

/// One indexed node.
#[derive(Debug, Clone)]
struct IndexedNode {
    name: Arc<str>,
    /// (key, value) ids sorted by key id.
    labels: Box<[(u32, u32)]>,
    /// GPU memory in MiB when the label is usable.
    mib: Option<u64>,
}

/// One node's metadata, as the watch or a NodeList file gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMeta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

/// What changed in the index after an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexChange {
    /// Nothing relevant changed (same labels).
    Unchanged,
    /// The node was added, changed or removed.
    Changed,
}

/// The GPU nodes and their labels.
#[derive(Debug, Default, Clone)]
pub struct VramIndex {
    syms: Interner,
    slots: Vec<Option<IndexedNode>>,
    free: Vec<usize>,
    by_name: HashMap<Arc<str>, usize>,
    /// Multiset of usable memory sizes: MiB → number of nodes.
    /// Nodes with a usable label, ordered by GPU memory: the unconstrained basis is the first,
    /// and a constrained lookup stops at the first node that matches.
    by_memory: BTreeSet<(u64, usize)>,
    invalid: usize,
    memory_key: Option<u32>,
}

/// One indexed node, as placement matching sees it.
struct Node<'i> {
    index: &'i VramIndex,
    node: &'i IndexedNode,
}

impl NodeView for Node<'_> {
    fn name(&self) -> &str {
        &self.node.name
    }
    fn label(&self, key: &str) -> Option<&str> {
        let k = self.index.syms.get(key)?;
        self.node.label_id(k).map(|v| self.index.syms.resolve(v))
    }
}

impl IndexedNode {
    fn label_id(&self, key: u32) -> Option<u32> {
        self.labels
            .binary_search_by_key(&key, |(k, _)| *k)
            .ok()
            .map(|i| self.labels[i].1)
    }
}

/// A requirement with its strings resolved to ids once per lookup.
enum Compiled<'p> {
    /// Label `key` (absent from every node when `None`) equals one of `values`.
    In(Option<u32>, Vec<u32>),
    NotIn(Option<u32>, Vec<u32>),
    Exists(Option<u32>),
    DoesNotExist(Option<u32>),
    Gt(Option<u32>, i64),
    Lt(Option<u32>, i64),
    NameIn(&'p [String]),
    NameNotIn(&'p [String]),
    Never,
}

impl Compiled<'_> {
    fn matches(&self, index: &VramIndex, node: &IndexedNode) -> bool {
        let int = |k: Option<u32>| {
            k.and_then(|k| node.label_id(k))
                .and_then(|v| index.syms.resolve(v).parse::<i64>().ok())
        };
        match self {
            Self::In(k, vs) => k
                .and_then(|k| node.label_id(k))
                .is_some_and(|v| vs.contains(&v)),
            Self::NotIn(k, vs) => k
                .and_then(|k| node.label_id(k))
                .is_none_or(|v| !vs.contains(&v)),
            Self::Exists(k) => k.and_then(|k| node.label_id(k)).is_some(),
            Self::DoesNotExist(k) => k.and_then(|k| node.label_id(k)).is_none(),
            Self::Gt(k, x) => int(*k).is_some_and(|n| n > *x),
            Self::Lt(k, x) => int(*k).is_some_and(|n| n < *x),
            Self::NameIn(vs) => vs.iter().any(|v| **v == *node.name),
            Self::NameNotIn(vs) => vs.iter().all(|v| **v != *node.name),
            Self::Never => false,
        }
    }
}

impl VramIndex {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Read a NodeList (`kubectl get nodes -o json`; a single Node or a plain array also work).
    ///
    /// # Errors
    /// A message when the JSON or YAML does not hold nodes.
    pub fn from_node_list(text: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            name: String,
            #[serde(default)]
            labels: Option<BTreeMap<String, String>>,
        }
        #[derive(Deserialize)]
        struct Item {
            metadata: Meta,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Input {
            List { items: Vec<Item> },
            One(Item),
            Array(Vec<Item>),
        }
        let input: Input = serde_yaml_ng::from_slice(text)
            .map_err(|e| format!("not a NodeList (kubectl get nodes -o json): {e}"))?;
        let items = match input {
            Input::List { items } | Input::Array(items) => items,
            Input::One(item) => vec![item],
        };
        let mut index = Self::new();
        for item in items {
            let labels = item.metadata.labels.unwrap_or_default();
            index.upsert(
                &item.metadata.name,
                labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
        }
        Ok(index)
    }

    /// Add or replace a node. Returns whether anything changed.
    pub fn upsert<'l>(
        &mut self,
        name: &str,
        labels: impl IntoIterator<Item = (&'l str, &'l str)>,
    ) -> IndexChange {
        self.upsert_reporting(name, labels).0
    }

    /// [`Self::upsert`], also returning why the node's GPU memory label was ignored, if it was
    /// (the node watch logs it): the label is parsed once per event, here.
    pub fn upsert_reporting<'l>(
        &mut self,
        name: &str,
        labels: impl IntoIterator<Item = (&'l str, &'l str)>,
    ) -> (IndexChange, Option<GpuMemoryLabelError>) {
        let memory_key = *self
            .memory_key
            .get_or_insert_with(|| self.syms.intern(LABEL_GPU_MEMORY));
        let mut ids: Vec<(u32, u32)> = labels
            .into_iter()
            .map(|(k, v)| (self.syms.intern(k), self.syms.intern(v)))
            .collect();
        ids.sort_unstable();
        ids.dedup_by_key(|(k, _)| *k);
        let mib = ids
            .binary_search_by_key(&memory_key, |(k, _)| *k)
            .ok()
            .map(|i| parse_gpu_memory_label(self.syms.resolve(ids[i].1)));
        let (mib, label_error) = match mib {
            None => (None, None),
            Some(Ok(m)) => (Some(m), None),
            Some(Err(e)) => (None, Some(e)),
        };
        let invalid = label_error.is_some();
        if let Some(&slot) = self.by_name.get(name) {
            if let Some(old) = self.slots.get(slot).and_then(Option::as_ref)
                && *old.labels == *ids
            {
                return (IndexChange::Unchanged, label_error);
            }
            self.remove(name);
        }
        let name: Arc<str> = Arc::from(name);
        if invalid {
            self.invalid += 1;
        }
        let node = IndexedNode {
            name: Arc::clone(&name),
            labels: ids.into_boxed_slice(),
            mib,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                if let Some(cell) = self.slots.get_mut(s) {
                    *cell = Some(node);
                }
                s
            }
            None => {
                self.slots.push(Some(node));
                self.slots.len() - 1
            }
        };
        if let Some(m) = mib {
            self.by_memory.insert((m, slot));
        }
        self.by_name.insert(name, slot);
        (IndexChange::Changed, label_error)
    }

    /// Remove a node. Returns whether it was there.
    pub fn remove(&mut self, name: &str) -> IndexChange {
        let Some(slot) = self.by_name.remove(name) else {
            return IndexChange::Unchanged;
        };
        if let Some(old) = self.slots.get_mut(slot).and_then(Option::take) {
            if let Some(m) = old.mib {
                self.by_memory.remove(&(m, slot));
            }
            let key = self.memory_key.unwrap_or(u32::MAX);
            if old.mib.is_none() && old.label_id(key).is_some() {
                self.invalid = self.invalid.saturating_sub(1);
            }
        }
        self.free.push(slot);
        IndexChange::Changed
    }

    /// Nodes indexed (with or without a usable label).
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no node is indexed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Nodes whose `nvidia.com/gpu.memory` is present but unusable.
    #[must_use]
    pub fn invalid_labels(&self) -> usize {
        self.invalid
    }

    /// The GPU memory of node `name`, if indexed with a usable label.
    #[must_use]
    pub fn node_mib(&self, name: &str) -> Option<u64> {
        let slot = *self.by_name.get(name)?;
        self.slots.get(slot)?.as_ref()?.mib
    }

    /// The basis for a pod with no placement constraint: the smallest GPU in the index.
    #[must_use]
    pub fn min_mib(&self) -> Option<u64> {
        self.by_memory.first().map(|(m, _)| *m)
    }

    /// The minimum GPU memory over the indexed nodes `placement` allows.
    #[must_use]
    pub fn basis_for(&self, placement: &Placement) -> Option<Basis> {
        if let Some(name) = &placement.node_name {
            let slot = *self.by_name.get(name.as_str())?;
            let node = self.slots.get(slot)?.as_ref()?;
            let mib = node.mib?;
            return placement
                .matches(&Node { index: self, node })
                .then_some(Basis { mib });
        }
        if placement.is_unconstrained() {
            return self.min_mib().map(|mib| Basis { mib });
        }
        // nodeSelector: every entry must be an exact label; a key or value no node has rules
        // every node out.
        let mut selector = Vec::with_capacity(placement.node_selector.len());
        for (k, v) in &placement.node_selector {
            match (self.syms.get(k), self.syms.get(v)) {
                (Some(k), Some(v)) => selector.push((k, v)),
                _ => return None,
            }
        }
        let terms: Option<Vec<Vec<Compiled<'_>>>> = placement.terms.as_ref().map(|terms| {
            terms
                .iter()
                .filter(|t| !t.is_empty())
                .map(|t| t.iter().map(|r| self.compile(r)).collect())
                .collect()
        });
        // Smallest GPU first: the first node that matches is the minimum.
        self.by_memory.iter().find_map(|&(mib, slot)| {
            let node = self.slots.get(slot)?.as_ref()?;
            if !selector.iter().all(|(k, v)| node.label_id(*k) == Some(*v)) {
                return None;
            }
            if let Some(terms) = &terms
                && !terms
                    .iter()
                    .any(|t| t.iter().all(|r| r.matches(self, node)))
            {
                return None;
            }
            Some(Basis { mib })
        })
    }

    fn compile<'p>(&self, r: &'p Requirement) -> Compiled<'p> {
        let ids = |vs: &[String]| vs.iter().filter_map(|v| self.syms.get(v)).collect();
        match r {
            Requirement::In { key, values } => Compiled::In(self.syms.get(key), ids(values)),
            Requirement::NotIn { key, values } => Compiled::NotIn(self.syms.get(key), ids(values)),
            Requirement::Exists { key } => Compiled::Exists(self.syms.get(key)),
            Requirement::DoesNotExist { key } => Compiled::DoesNotExist(self.syms.get(key)),
            Requirement::Gt { key, value } => Compiled::Gt(self.syms.get(key), *value),
            Requirement::Lt { key, value } => Compiled::Lt(self.syms.get(key), *value),
            Requirement::NameIn { values } => Compiled::NameIn(values),
            Requirement::NameNotIn { values } => Compiled::NameNotIn(values),
            Requirement::Never => Compiled::Never,
        }
    }

    /// An estimate of the heap memory the index holds, in bytes (capacities included).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        let nodes: usize = self
            .slots
            .iter()
            .flatten()
            .map(|n| n.labels.len() * 8 + n.name.len() + 16)
            .sum();
        self.syms.heap_bytes()
            + nodes
            + self.slots.capacity() * std::mem::size_of::<Option<IndexedNode>>()
            + self.free.capacity() * 8
            + self.by_name.capacity() * (std::mem::size_of::<(Arc<str>, usize)>() + 1)
            + self.by_memory.len() * 32
    }
}

/// A synced index: the minimum over the nodes the placement allows.
impl VramBasis for VramIndex {
    fn basis(&self, placement: &Placement) -> Result<Basis, SkipReason> {
        self.basis_for(placement).ok_or(SkipReason::NoMatchingNode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(nodes: &[(&str, &[(&str, &str)])]) -> VramIndex {
        let mut i = VramIndex::new();
        for (name, labels) in nodes {
            i.upsert(name, labels.iter().copied());
        }
        i
    }

    fn placement(spec: &str) -> Placement {
        let json = format!(r#"{{"spec":{spec}}}"#);
        let pod: crate::wire::pod::Pod<'_> = serde_json::from_str(&json).unwrap();
        Placement::of_pod(&pod)
    }

    #[test]
    fn label_values() {
        assert_eq!(parse_gpu_memory_label("81920"), Ok(81920));
        assert_eq!(parse_gpu_memory_label("1048575"), Ok(1_048_575));
        // Bytes (very old GFD): 16 GiB.
        assert_eq!(parse_gpu_memory_label("17179869184"), Ok(16384));
        assert_eq!(parse_gpu_memory_label("1048576"), Ok(1));
        for bad in [
            "",
            "0",
            "-1",
            "16Gi",
            "1.5",
            " 1",
            "0x10",
            "99999999999999999999999",
        ] {
            assert!(parse_gpu_memory_label(bad).is_err(), "{bad:?}");
        }
    }

    /// A heterogeneous cluster: big A100s in zone a (one MIG-sliced), T4s in zone b, a CPU node,
    /// and a node with a broken label.
    fn cluster() -> VramIndex {
        idx(&[
            (
                "a100-1",
                &[
                    (LABEL_GPU_MEMORY, "81920"),
                    ("zone", "a"),
                    ("pool", "train"),
                    ("nvidia.com/mig.strategy", "none"),
                ],
            ),
            (
                "a100-2",
                &[
                    (LABEL_GPU_MEMORY, "81920"),
                    ("zone", "a"),
                    ("pool", "train"),
                    ("nvidia.com/mig.strategy", "none"),
                ],
            ),
            (
                "a100-mig",
                &[
                    (LABEL_GPU_MEMORY, "9728"),
                    ("zone", "a"),
                    ("pool", "mig"),
                    ("nvidia.com/mig.strategy", "single"),
                ],
            ),
            (
                "t4-1",
                &[
                    (LABEL_GPU_MEMORY, "15360"),
                    ("zone", "b"),
                    ("pool", "infer"),
                    ("gen", "7"),
                ],
            ),
            (
                "l4-1",
                &[
                    (LABEL_GPU_MEMORY, "23034"),
                    ("zone", "b"),
                    ("pool", "infer"),
                    ("gen", "8"),
                ],
            ),
            ("cpu-1", &[("zone", "a")]),
            (
                "broken",
                &[(LABEL_GPU_MEMORY, "lots"), ("zone", "b"), ("pool", "infer")],
            ),
        ])
    }

    #[test]
    fn narrowing_table() {
        let i = cluster();
        let affinity = |terms: &str| {
            format!(
                r#"{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":{terms}}}}}}}}}"#
            )
        };
        let cases: Vec<(String, Option<u64>)> = vec![
            ("{}".into(), Some(9728)),
            (r#"{"nodeName":"a100-2"}"#.into(), Some(81920)),
            (r#"{"nodeName":"cpu-1"}"#.into(), None),
            (r#"{"nodeName":"broken"}"#.into(), None),
            (r#"{"nodeName":"gone"}"#.into(), None),
            (r#"{"nodeSelector":{"pool":"train"}}"#.into(), Some(81920)),
            (r#"{"nodeSelector":{"zone":"b"}}"#.into(), Some(15360)),
            (r#"{"nodeSelector":{"zone":"a"}}"#.into(), Some(9728)),
            (r#"{"nodeSelector":{"zone":"nowhere"}}"#.into(), None),
            (r#"{"nodeSelector":{"unknown-key":"a"}}"#.into(), None),
            (
                affinity(
                    r#"[{"matchExpressions":[{"key":"nvidia.com/mig.strategy","operator":"NotIn","values":["single"]}]}]"#,
                ),
                Some(15360),
            ),
            (
                affinity(
                    r#"[{"matchExpressions":[{"key":"nvidia.com/mig.strategy","operator":"DoesNotExist"}]}]"#,
                ),
                Some(15360),
            ),
            (
                affinity(
                    r#"[{"matchExpressions":[{"key":"gen","operator":"Gt","values":["7"]}]}]"#,
                ),
                Some(23034),
            ),
            (
                affinity(
                    r#"[{"matchExpressions":[{"key":"gen","operator":"Lt","values":["8"]}]}]"#,
                ),
                Some(15360),
            ),
            (
                affinity(
                    r#"[{"matchExpressions":[{"key":"pool","operator":"In","values":["train","nope"]}]},{"matchFields":[{"key":"metadata.name","operator":"In","values":["l4-1"]}]}]"#,
                ),
                Some(23034),
            ),
            (
                affinity(
                    r#"[{"matchExpressions":[{"key":"pool","operator":"Exists"},{"key":"zone","operator":"In","values":["a"]}]}]"#,
                ),
                Some(9728),
            ),
            (
                affinity(
                    r#"[{"matchFields":[{"key":"metadata.name","operator":"NotIn","values":["a100-mig","t4-1"]}]}]"#,
                ),
                Some(23034),
            ),
            (
                format!(
                    r#"{{"nodeSelector":{{"zone":"a"}},{}"#,
                    &affinity(
                        r#"[{"matchExpressions":[{"key":"pool","operator":"NotIn","values":["mig"]}]}]"#
                    )[1..]
                ),
                Some(81920),
            ),
            (affinity("[]"), None),
        ];
        for (spec, expected) in cases {
            let got = i.basis_for(&placement(&spec)).map(|b| b.mib);
            assert_eq!(got, expected, "{spec}");
        }
    }

    #[test]
    fn scan_agrees_with_placement_matching() {
        // The compiled scan must give the same node set as the straightforward matcher.
        let i = cluster();
        let p = placement(
            r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["b"]},{"key":"gen","operator":"Gt","values":["6"]}]}]}}}}"#,
        );
        let slow = i
            .slots
            .iter()
            .flatten()
            .filter(|n| n.mib.is_some() && p.matches(&Node { index: &i, node: n }))
            .filter_map(|n| n.mib)
            .min();
        assert_eq!(i.basis_for(&p).map(|b| b.mib), slow);
    }

    #[test]
    fn relabel_and_delete_update_the_minimum() {
        let mut i = cluster();
        assert_eq!(i.min_mib(), Some(9728));
        assert_eq!(i.invalid_labels(), 1);
        assert_eq!(
            i.upsert("a100-mig", [(LABEL_GPU_MEMORY, "81920"), ("zone", "a")]),
            IndexChange::Changed
        );
        assert_eq!(i.min_mib(), Some(15360));
        assert_eq!(
            i.upsert("a100-mig", [(LABEL_GPU_MEMORY, "81920"), ("zone", "a")]),
            IndexChange::Unchanged
        );
        assert_eq!(i.remove("t4-1"), IndexChange::Changed);
        assert_eq!(i.min_mib(), Some(23034));
        assert_eq!(i.remove("t4-1"), IndexChange::Unchanged);
        i.upsert("broken", [(LABEL_GPU_MEMORY, "4096")]);
        assert_eq!(i.invalid_labels(), 0);
        assert_eq!(i.min_mib(), Some(4096));
        i.remove("broken");
        i.upsert("new", [(LABEL_GPU_MEMORY, "8192")]);
        assert_eq!(i.len(), 6);
        assert_eq!(i.min_mib(), Some(8192));
    }

    #[test]
    fn node_list_file_forms() {
        let list = br#"{"apiVersion":"v1","kind":"NodeList","items":[
            {"metadata":{"name":"n1","labels":{"nvidia.com/gpu.memory":"15360"}}},
            {"metadata":{"name":"n2","labels":{"nvidia.com/gpu.memory":"81920","zone":"a"}}},
            {"metadata":{"name":"n3"}}]}"#;
        let i = VramIndex::from_node_list(list).unwrap();
        assert_eq!(i.len(), 3);
        assert_eq!(i.min_mib(), Some(15360));
        assert_eq!(
            i.basis_for(&placement(r#"{"nodeSelector":{"zone":"a"}}"#))
                .map(|b| b.mib),
            Some(81920)
        );
        let one = VramIndex::from_node_list(
            b"kind: Node\nmetadata:\n  name: x\n  labels:\n    nvidia.com/gpu.memory: '4096'\n",
        )
        .unwrap();
        assert_eq!(one.node_mib("x"), Some(4096));
        assert!(VramIndex::from_node_list(b"not: [nodes").is_err());
    }
}

//! The VRAM index: GPU nodes, their labels (interned: 10,000 nodes with GFD's ~60 labels each fit
//! in a few MiB) and their GPU memory, ordered by memory so that the unconstrained basis is one
//! lookup and a constrained one stops at the first node that matches. Pure data: no lock, no
//! metric, no I/O; [`super::live`] shares it with the watch and [`super::watch`] fills it.
//!
//! A pod's required node affinity is tenant input, so a lookup's cost must not grow with the
//! product of its values and the nodes. Each label is also kept in an inverted index
//! (key → value → the nodes carrying it), and every label value's integer reading is kept beside
//! its string. A lookup for a pod with `V` values, `S` nodeSelector entries, `T` terms and `R`
//! expressions, against `N` indexed nodes:
//!
//! 1. resolves each value and selector entry once (hash lookups, `O(V + S)`) and sorts each
//!    expression's value ids (`O(V log V)`);
//! 2. scans the nodes smallest GPU first, each requirement an `O(log V)` binary search, for at most
//!    [`SCAN_BUDGET`] requirement checks: an ordinary placement finds its node here, as before;
//! 3. if the budget runs out, evaluates the placement as sets of nodes (bit sets of `N` bits): a
//!    selector entry, `In`, `NotIn` and `Gt`/`Lt` touch only the nodes carrying the label values they
//!    name, `Exists`/`DoesNotExist` the nodes carrying the key, `matchFields` the named nodes, and
//!    each term and requirement ANDs or ORs `N/64` words. A key's values split its nodes, so one
//!    requirement touches at most `N` nodes, and the whole lookup is
//!    `O(V log V + S + (T + R) · N/64 + R · N)` bit operations (the `R · N` term is one bit set per
//!    node carrying a named label) — linear in each, never `V · N`. The `kai.maxAffinity*` settings
//!    bound `T`, `R` and `V` (see [`crate::policy::placement::AffinityLimits`]).
//!
//! The minimum GPU memory is then the smallest over the matching nodes (`O(N/64 + matches)`).
//! Upserting or removing a node costs `O(L)` hash operations for its `L` labels.
//! The set evaluation is in [`sets`]. The interner, the index and its compiled lookup share private
//! types, so they stay one file beside the table and equivalence tests that pin them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
    /// Each string read as an integer (`Gt`/`Lt`), once, when it is interned.
    ints: Vec<Option<i64>>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.strings.len()).unwrap_or(u32::MAX);
        let s: Arc<str> = Arc::from(s);
        self.ints.push(s.parse().ok());
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

    fn int(&self, id: u32) -> Option<i64> {
        self.ints.get(id as usize).copied().flatten()
    }

    fn heap_bytes(&self) -> usize {
        let strings: usize = self.strings.iter().map(|s| s.len() + 16).sum();
        strings
            + self.strings.capacity() * std::mem::size_of::<Arc<str>>()
            + self.ints.capacity() * std::mem::size_of::<Option<i64>>()
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
    /// Nodes with a usable label, ordered by GPU memory: the unconstrained basis is the first,
    /// and a constrained lookup stops at the first node that matches.
    by_memory: BTreeSet<(u64, usize)>,
    invalid: usize,
    memory_key: Option<u32>,
    /// The inverted index: label key → value → slots of the nodes carrying it.
    postings: HashMap<u32, HashMap<u32, HashSet<u32>>>,
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

mod sets;

/// A requirement with its strings resolved to ids once per lookup; value and node lists sorted
/// for binary search.
#[derive(Debug)]
enum Compiled {
    /// Label `key` (absent from every node when `None`) equals one of `values`.
    In(Option<u32>, Vec<u32>),
    NotIn(Option<u32>, Vec<u32>),
    Exists(Option<u32>),
    DoesNotExist(Option<u32>),
    Gt(Option<u32>, i64),
    Lt(Option<u32>, i64),
    /// The slots of the named nodes that are indexed.
    NameIn(Vec<u32>),
    NameNotIn(Vec<u32>),
    Never,
}

/// Requirement checks the node scan may spend before the lookup turns to set evaluation: an
/// ordinary placement's smallest node is found long before (a few nodes of a few requirements),
/// and past it the scan's cost would grow with nodes × requirements.
pub const SCAN_BUDGET: usize = 16_384;

fn slot_id(slot: usize) -> u32 {
    u32::try_from(slot).unwrap_or(u32::MAX)
}

impl Compiled {
    fn matches(&self, index: &VramIndex, slot: u32, node: &IndexedNode) -> bool {
        let value = |k: Option<u32>| k.and_then(|k| node.label_id(k));
        match self {
            Self::In(k, vs) => value(*k).is_some_and(|v| vs.binary_search(&v).is_ok()),
            Self::NotIn(k, vs) => value(*k).is_none_or(|v| vs.binary_search(&v).is_err()),
            Self::Exists(k) => value(*k).is_some(),
            Self::DoesNotExist(k) => value(*k).is_none(),
            Self::Gt(k, x) => value(*k)
                .and_then(|v| index.syms.int(v))
                .is_some_and(|n| n > *x),
            Self::Lt(k, x) => value(*k)
                .and_then(|v| index.syms.int(v))
                .is_some_and(|n| n < *x),
            Self::NameIn(slots) => slots.binary_search(&slot).is_ok(),
            Self::NameNotIn(slots) => slots.binary_search(&slot).is_err(),
            Self::Never => false,
        }
    }
}

/// A placement compiled against the index: `None` from [`VramIndex::compile_placement`] when a
/// selector entry names a key or value no node has.
struct CompiledPlacement {
    selector: Vec<(u32, u32)>,
    /// Required terms, empty ones dropped (they match nothing); `None` without affinity.
    terms: Option<Vec<Vec<Compiled>>>,
}

/// The node scan spent its budget.
struct OverBudget;

impl VramIndex {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Read a NodeList (`kubectl get nodes -o json`; a single Node or a plain array also work).
    ///
    /// # Errors
    /// The parser's error when the JSON or YAML does not hold nodes (the caller names the file).
    pub fn from_node_list(text: &[u8]) -> Result<Self, serde_yaml_ng::Error> {
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
        let input: Input = serde_yaml_ng::from_slice(text)?;
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
        if let Some(node) = self.slots.get(slot).and_then(Option::as_ref) {
            for &(k, v) in &node.labels {
                self.postings
                    .entry(k)
                    .or_default()
                    .entry(v)
                    .or_default()
                    .insert(slot_id(slot));
            }
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
            for &(k, v) in &old.labels {
                if let Some(values) = self.postings.get_mut(&k) {
                    if let Some(nodes) = values.get_mut(&v) {
                        nodes.remove(&slot_id(slot));
                        if nodes.is_empty() {
                            values.remove(&v);
                        }
                    }
                    if values.is_empty() {
                        self.postings.remove(&k);
                    }
                }
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
        self.basis_with_budget(placement, SCAN_BUDGET)
    }

    /// [`Self::basis_for`] with the scan's budget given: the tests hold every budget to the same
    /// answer.
    fn basis_with_budget(&self, placement: &Placement, budget: usize) -> Option<Basis> {
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
        let compiled = self.compile_placement(placement)?;
        match self.scan(&compiled, budget) {
            Ok(found) => found,
            Err(OverBudget) => self.evaluate_sets(&compiled),
        }
    }

    fn compile_placement(&self, placement: &Placement) -> Option<CompiledPlacement> {
        // nodeSelector: every entry must be an exact label; a key or value no node has rules
        // every node out.
        let mut selector = Vec::with_capacity(placement.node_selector.len());
        for (k, v) in &placement.node_selector {
            match (self.syms.get(k), self.syms.get(v)) {
                (Some(k), Some(v)) => selector.push((k, v)),
                _ => return None,
            }
        }
        let terms = placement.terms.as_ref().map(|terms| {
            terms
                .iter()
                .filter(|t| !t.is_empty())
                .map(|t| t.iter().map(|r| self.compile(r)).collect())
                .collect()
        });
        Some(CompiledPlacement { selector, terms })
    }

    /// Smallest GPU first: the first node that matches is the minimum. `Err` once `budget`
    /// requirement checks are spent without an answer.
    fn scan(&self, p: &CompiledPlacement, budget: usize) -> Result<Option<Basis>, OverBudget> {
        let per_node = 1 + p.selector.len() + p.terms.iter().flatten().map(Vec::len).sum::<usize>();
        let mut spent = 0usize;
        for &(mib, slot) in &self.by_memory {
            spent = spent.saturating_add(per_node);
            if spent > budget {
                return Err(OverBudget);
            }
            let Some(node) = self.slots.get(slot).and_then(Option::as_ref) else {
                continue;
            };
            if !p
                .selector
                .iter()
                .all(|(k, v)| node.label_id(*k) == Some(*v))
            {
                continue;
            }
            let id = slot_id(slot);
            if let Some(terms) = &p.terms
                && !terms
                    .iter()
                    .any(|t| t.iter().all(|r| r.matches(self, id, node)))
            {
                continue;
            }
            return Ok(Some(Basis { mib }));
        }
        Ok(None)
    }

    fn compile(&self, r: &Requirement) -> Compiled {
        let ids = |vs: &[String]| {
            let mut ids: Vec<u32> = vs.iter().filter_map(|v| self.syms.get(v)).collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let slots = |vs: &[String]| {
            let mut slots: Vec<u32> = vs
                .iter()
                .filter_map(|v| self.by_name.get(v.as_str()).map(|&s| slot_id(s)))
                .collect();
            slots.sort_unstable();
            slots.dedup();
            slots
        };
        match r {
            Requirement::In { key, values } => Compiled::In(self.syms.get(key), ids(values)),
            Requirement::NotIn { key, values } => Compiled::NotIn(self.syms.get(key), ids(values)),
            Requirement::Exists { key } => Compiled::Exists(self.syms.get(key)),
            Requirement::DoesNotExist { key } => Compiled::DoesNotExist(self.syms.get(key)),
            Requirement::Gt { key, value } => Compiled::Gt(self.syms.get(key), *value),
            Requirement::Lt { key, value } => Compiled::Lt(self.syms.get(key), *value),
            Requirement::NameIn { values } => Compiled::NameIn(slots(values)),
            Requirement::NameNotIn { values } => Compiled::NameNotIn(slots(values)),
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
            + self.postings_heap_bytes()
    }

    fn postings_heap_bytes(&self) -> usize {
        // hashbrown: one control byte per bucket beside the entry; the nested tables' headers.
        let set = std::mem::size_of::<HashSet<u32>>();
        let map = std::mem::size_of::<HashMap<u32, HashSet<u32>>>();
        self.postings.capacity() * (4 + map + 1)
            + self
                .postings
                .values()
                .map(|vs| {
                    vs.capacity() * (4 + set + 1)
                        + vs.values().map(|s| s.capacity() * 5).sum::<usize>()
                })
                .sum::<usize>()
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

    /// A small deterministic generator (xorshift64*): the equivalence test's random nodes and
    /// pods, the same on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % n as u64).unwrap()
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }
    }

    const KEYS: &[&str] = &[
        "zone",
        "pool",
        "gen",
        "rack",
        "nvidia.com/gpu.family",
        "unused",
    ];
    const VALUES: &[&str] = &[
        "a", "b", "c", "7", "8", "9", "-3", "+4", "10", "x1", "", "08",
    ];
    const MEMORY: &[&str] = &["9728", "15360", "23034", "81920", "40960", "lots", "0"];

    fn random_values(rng: &mut Rng, nodes: usize) -> Vec<String> {
        (0..rng.below(5))
            .map(|_| {
                if rng.below(4) == 0 {
                    format!("n{}", rng.below(nodes + 2))
                } else {
                    rng.pick(VALUES).to_owned()
                }
            })
            .collect()
    }

    fn random_requirement(rng: &mut Rng, nodes: usize) -> Requirement {
        let key = rng.pick(KEYS).to_owned();
        // Around the numeric label values (7, 8, 9, 10, -3, +4, 08) and past them.
        let int = [-5, -3, 0, 4, 7, 8, 9, 10, 11][rng.below(9)];
        match rng.below(10) {
            0 => Requirement::In {
                key,
                values: random_values(rng, nodes),
            },
            1 => Requirement::NotIn {
                key,
                values: random_values(rng, nodes),
            },
            2 => Requirement::Exists { key },
            3 => Requirement::DoesNotExist { key },
            4 => Requirement::Gt { value: int, key },
            5 => Requirement::Lt { value: int, key },
            6 => Requirement::NameIn {
                values: random_values(rng, nodes),
            },
            7 => Requirement::NameNotIn {
                values: random_values(rng, nodes),
            },
            8 => Requirement::Never,
            _ => Requirement::In {
                key,
                values: vec![rng.pick(VALUES).to_owned()],
            },
        }
    }

    fn random_placement(rng: &mut Rng, nodes: usize) -> Placement {
        let node_name = (rng.below(8) == 0).then(|| format!("n{}", rng.below(nodes + 2)));
        let node_selector = (0..rng.below(3).saturating_sub(1))
            .map(|_| (rng.pick(KEYS).to_owned(), rng.pick(VALUES).to_owned()))
            .collect();
        let terms = (rng.below(4) != 0).then(|| {
            (0..rng.below(4))
                .map(|_| {
                    (0..rng.below(4))
                        .map(|_| random_requirement(rng, nodes))
                        .collect()
                })
                .collect()
        });
        Placement {
            node_name,
            node_selector,
            terms,
        }
    }

    /// The straightforward evaluation, the oracle: every node, every requirement as
    /// [`Placement::matches`] reads it, the smallest GPU memory of those that match.
    fn oracle(i: &VramIndex, p: &Placement) -> Option<u64> {
        i.slots
            .iter()
            .flatten()
            .filter(|n| p.matches(&Node { index: i, node: n }))
            .filter_map(|n| n.mib)
            .min()
    }

    #[test]
    fn indexed_lookup_agrees_with_the_oracle() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut checked = 0;
        for _ in 0..300 {
            let nodes = 1 + rng.below(70);
            let mut i = VramIndex::new();
            // Upserts, relabels and removals, so the inverted index is checked after each kind.
            for _ in 0..nodes * 2 {
                let name = format!("n{}", rng.below(nodes));
                if rng.below(6) == 0 {
                    i.remove(&name);
                    continue;
                }
                let mut labels: Vec<(String, String)> = (0..rng.below(5))
                    .map(|_| (rng.pick(KEYS).to_owned(), rng.pick(VALUES).to_owned()))
                    .collect();
                if rng.below(5) != 0 {
                    labels.push((LABEL_GPU_MEMORY.to_owned(), rng.pick(MEMORY).to_owned()));
                }
                i.upsert(&name, labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            }
            for _ in 0..40 {
                let p = random_placement(&mut rng, nodes);
                let want = oracle(&i, &p);
                for budget in [0, 1, 7, SCAN_BUDGET, usize::MAX] {
                    let got = i.basis_with_budget(&p, budget).map(|b| b.mib);
                    assert_eq!(got, want, "budget {budget}, {p:?}, index {i:?}");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 12_000);
    }

    #[test]
    fn set_evaluation_of_the_tables_cases() {
        // The narrowing table's answers, with the scan given no budget: every lookup by sets.
        let i = cluster();
        let zone_a = placement(r#"{"nodeSelector":{"zone":"a"}}"#);
        assert_eq!(i.basis_with_budget(&zone_a, 0).map(|b| b.mib), Some(9728));
        let not_mig = placement(
            r#"{"nodeSelector":{"zone":"a"},"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"NotIn","values":["mig"]}]}]}}}}"#,
        );
        assert_eq!(i.basis_with_budget(&not_mig, 0).map(|b| b.mib), Some(81920));
        let empty_term = placement(
            r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{}]}}}}"#,
        );
        assert_eq!(i.basis_with_budget(&empty_term, 0), None);
    }

    #[test]
    fn many_values_against_many_nodes() {
        // Thousands of NotIn values that name every node but one, over thousands of nodes: the
        // answer is that one node's GPU, by the scan and by sets alike.
        let mut i = VramIndex::new();
        for n in 0..3000 {
            let mib = (10_000 + n).to_string();
            i.upsert(
                &format!("node-{n}"),
                [(LABEL_GPU_MEMORY, mib.as_str()), ("host", &format!("h{n}"))],
            );
        }
        let values: Vec<String> = (0..3000)
            .filter(|n| *n != 1234)
            .map(|n| format!("h{n}"))
            .collect();
        let names: Vec<String> = (0..3000)
            .filter(|n| *n != 2345)
            .map(|n| format!("node-{n}"))
            .collect();
        let by_label = Placement {
            terms: Some(vec![vec![Requirement::NotIn {
                key: "host".into(),
                values,
            }]]),
            ..Placement::default()
        };
        let by_name = Placement {
            terms: Some(vec![vec![Requirement::NameNotIn { values: names }]]),
            ..Placement::default()
        };
        for budget in [0, SCAN_BUDGET, usize::MAX] {
            assert_eq!(
                i.basis_with_budget(&by_label, budget).map(|b| b.mib),
                Some(11_234)
            );
            assert_eq!(
                i.basis_with_budget(&by_name, budget).map(|b| b.mib),
                Some(12_345)
            );
        }
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

//! The per-GPU VRAM basis for `gpu-fraction` pods: the minimum `nvidia.com/gpu.memory` over the GPU
//! nodes a pod can be placed on.
//!
//! - [`VramIndex`]: the nodes, their labels (interned: 10,000 nodes with GFD's ~60 labels each fit
//!   in a few MiB) and their GPU memory, with a multiset of memory sizes so that the unconstrained
//!   basis is one lookup and a constrained one is a scan of compact integer labels.
//! - [`SharedVramIndex`]: the index behind a lock, fed by the node watch ([`run_node_watch`]) or a
//!   NodeList file (`--nodes`), read by admission decisions through [`VramBasisSource`].
//! - [`VramSource`]: what the settings carry: nothing, a fixed `PER_GPU_VRAM_MIB`, or an index.
//!
//! The watch is metadata-only (`PartialObjectMetadata`) with the GFD label selector, so it needs
//! `list`/`watch` on nodes and transfers neither status nor spec. A lost watch resumes or re-lists
//! on its own (kube's watcher, with backoff); a re-list builds a fresh index and swaps it in when
//! complete, so lookups never see a half-listed cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hami_shared::names::LABEL_GPU_MEMORY;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::placement::{NodeView, Placement, Requirement};

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

/// The basis found for a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Basis {
    /// Per-GPU VRAM in MiB.
    pub mib: u64,
}

/// Why no basis could be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Neither `PER_GPU_VRAM_MIB` nor node detection is configured (offline without flags).
    NoSource,
    /// The node list has not been read yet.
    NotSynced,
    /// No node the pod can be placed on carries a usable `nvidia.com/gpu.memory`.
    NoMatchingNode,
}

impl SkipReason {
    /// Metric label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSource => "no-source",
            Self::NotSynced => "not-synced",
            Self::NoMatchingNode => "no-matching-node",
        }
    }

    /// Every reason, for metric initialisation.
    pub const ALL: [SkipReason; 3] = [Self::NoSource, Self::NotSynced, Self::NoMatchingNode];
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoSource => {
                "no per-GPU VRAM basis is configured (set PER_GPU_VRAM_MIB / --per-gpu-vram-mib, or --nodes offline)"
            }
            Self::NotSynced => "the GPU node list has not been read yet",
            Self::NoMatchingNode => {
                "no GPU node this pod can be placed on (nodeName, nodeSelector, required node affinity) carries a usable nvidia.com/gpu.memory label"
            }
        })
    }
}

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

    /// Build from node metadata (a NodeList file, or a finished list).
    pub fn from_nodes<'n>(nodes: impl IntoIterator<Item = &'n NodeMeta>) -> Self {
        let mut index = Self::new();
        for n in nodes {
            index.upsert(
                &n.name,
                n.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
        }
        index
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
        let (mib, invalid) = match mib {
            None => (None, false),
            Some(Ok(m)) => (Some(m), false),
            Some(Err(_)) => (None, true),
        };
        if let Some(&slot) = self.by_name.get(name) {
            if let Some(old) = self.slots.get(slot).and_then(Option::as_ref)
                && *old.labels == *ids
            {
                return IndexChange::Unchanged;
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
        IndexChange::Changed
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
    pub fn basis(&self, placement: &Placement) -> Option<Basis> {
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

// ---------------------------------------------------------------------------------------------
// Shared index, sources, metrics
// ---------------------------------------------------------------------------------------------

/// KAI metrics: basis in use, nodes indexed, caps skipped by reason.
#[derive(Debug, Clone, Default)]
pub struct KaiMetrics {
    /// `hami_webhook_kai_vram_basis_mib`: the basis for a pod without placement constraints
    /// (the override, or the smallest indexed GPU); 0 when there is none.
    pub basis_mib: Gauge,
    /// `hami_webhook_kai_vram_nodes_indexed`.
    pub nodes_indexed: Gauge,
    /// `hami_webhook_kai_vram_label_invalid`: nodes whose label is present but unusable.
    pub label_invalid: Gauge,
    /// `hami_webhook_kai_node_watch_synced`: 1 once the node list has been read.
    pub synced: Gauge,
    /// `hami_webhook_kai_node_watch_errors_total`.
    pub watch_errors: Counter,
    /// `hami_webhook_kai_node_watch_relists_total`.
    pub relists: Counter,
    /// `hami_webhook_kai_fraction_caps_skipped_total{reason}`.
    pub caps_skipped: Family<[(&'static str, &'static str); 1], Counter>,
    /// `hami_webhook_kai_pods_total{limit}`: KAI pods mutated, by where the limit came from
    /// (`gpu-memory`, `gpu-fraction`, `none`).
    pub pods: Family<[(&'static str, &'static str); 1], Counter>,
}

impl KaiMetrics {
    /// Register every KAI metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        for r in SkipReason::ALL {
            let _ = self.caps_skipped.get_or_create(&[("reason", r.as_str())]);
        }
        for l in ["gpu-memory", "gpu-fraction", "none"] {
            let _ = self.pods.get_or_create(&[("limit", l)]);
        }
        registry.register(
            "kai_vram_basis_mib",
            "Per-GPU VRAM basis (MiB) for a gpu-fraction pod without placement constraints: PER_GPU_VRAM_MIB, or the smallest indexed GPU; 0 when none",
            self.basis_mib.clone(),
        );
        registry.register(
            "kai_vram_nodes_indexed",
            "GPU nodes (GFD label selector) in the VRAM index",
            self.nodes_indexed.clone(),
        );
        registry.register(
            "kai_vram_label_invalid",
            "Indexed nodes whose nvidia.com/gpu.memory label is not a usable size (ignored)",
            self.label_invalid.clone(),
        );
        registry.register(
            "kai_node_watch_synced",
            "1 once the first node list has been read",
            self.synced.clone(),
        );
        registry.register(
            "kai_node_watch_errors",
            "Node watch errors (the watch resumes or re-lists by itself)",
            self.watch_errors.clone(),
        );
        registry.register(
            "kai_node_watch_relists",
            "Complete node lists read (the first sync included)",
            self.relists.clone(),
        );
        registry.register(
            "kai_fraction_caps_skipped",
            "gpu-fraction pods admitted without CUDA_DEVICE_MEMORY_LIMIT, by reason",
            self.caps_skipped.clone(),
        );
        registry.register(
            "kai_pods",
            "KAI pods mutated, by the source of their memory limit",
            self.pods.clone(),
        );
    }

    /// Count one skipped cap.
    pub fn skipped(&self, reason: SkipReason) {
        self.caps_skipped
            .get_or_create(&[("reason", reason.as_str())])
            .inc();
    }

    /// Count one KAI pod by limit source.
    pub fn pod(&self, limit: &'static str) {
        self.pods.get_or_create(&[("limit", limit)]).inc();
    }
}

/// The index behind a lock, with its sync state and change notification.
#[derive(Debug)]
pub struct SharedVramIndex {
    index: RwLock<VramIndex>,
    synced: AtomicBool,
    generation: tokio::sync::watch::Sender<u64>,
    metrics: KaiMetrics,
}

impl SharedVramIndex {
    /// An empty, not yet synced index reporting to `metrics`.
    #[must_use]
    pub fn new(metrics: KaiMetrics) -> Arc<Self> {
        Arc::new(Self {
            index: RwLock::new(VramIndex::new()),
            synced: AtomicBool::new(false),
            generation: tokio::sync::watch::Sender::new(0),
            metrics,
        })
    }

    /// A synced index holding `index` (a NodeList file).
    #[must_use]
    pub fn fixed(index: VramIndex, metrics: KaiMetrics) -> Arc<Self> {
        let shared = Self::new(metrics);
        shared.replace(index);
        shared
    }

    /// Read access.
    pub fn read(&self) -> RwLockReadGuard<'_, VramIndex> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, VramIndex> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a complete node list has been read.
    #[must_use]
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Swap in a complete index and mark synced.
    pub fn replace(&self, index: VramIndex) {
        self.replace_then(index, || {});
    }

    /// Swap in a complete index, mark synced, run `then` (e.g. set readiness), and only then
    /// notify subscribers, so that whoever sees the new index also sees `then`'s effect.
    pub fn replace_then(&self, index: VramIndex, then: impl FnOnce()) {
        *self.write() = index;
        self.synced.store(true, Ordering::Release);
        self.metrics.synced.set(1);
        self.metrics.relists.inc();
        then();
        self.changed();
    }

    /// Apply a change to the live index.
    pub fn update(&self, f: impl FnOnce(&mut VramIndex) -> IndexChange) {
        if f(&mut self.write()) == IndexChange::Changed {
            self.changed();
        }
    }

    fn changed(&self) {
        {
            let index = self.read();
            self.metrics
                .nodes_indexed
                .set(i64::try_from(index.len()).unwrap_or(i64::MAX));
            self.metrics
                .label_invalid
                .set(i64::try_from(index.invalid_labels()).unwrap_or(i64::MAX));
            self.metrics.basis_mib.set(
                index
                    .min_mib()
                    .map_or(0, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            );
        }
        self.generation.send_modify(|g| *g += 1);
    }

    /// A receiver that sees every change (tests and benchmarks await it instead of polling).
    #[must_use]
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The metrics this index reports to.
    #[must_use]
    pub fn metrics(&self) -> &KaiMetrics {
        &self.metrics
    }

    /// The basis for `placement`.
    ///
    /// # Errors
    /// [`SkipReason::NotSynced`] before the first list, [`SkipReason::NoMatchingNode`] when no
    /// candidate node has a usable label.
    pub fn basis(&self, placement: &Placement) -> Result<Basis, SkipReason> {
        if !self.is_synced() {
            return Err(SkipReason::NotSynced);
        }
        self.read()
            .basis(placement)
            .ok_or(SkipReason::NoMatchingNode)
    }
}

/// Where the per-GPU VRAM basis comes from. Carried in the settings (`kai.vram`, not a file key).
#[derive(Debug, Clone, Default)]
pub enum VramSource {
    /// Nothing configured (offline without `--per-gpu-vram-mib` / `--nodes`).
    #[default]
    None,
    /// `PER_GPU_VRAM_MIB`: authoritative, detection off.
    Fixed(u64),
    /// A node index: watched (serve) or read from a NodeList file (offline).
    Nodes(Arc<SharedVramIndex>),
}

impl PartialEq for VramSource {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::None, Self::None) => true,
            (Self::Fixed(a), Self::Fixed(b)) => a == b,
            (Self::Nodes(a), Self::Nodes(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// What admission asks of a basis source.
pub trait VramBasisSource {
    /// The per-GPU VRAM in MiB for a pod placed by `placement`.
    ///
    /// # Errors
    /// Why there is none.
    fn basis(&self, placement: &Placement) -> Result<Basis, SkipReason>;
}

impl VramBasisSource for VramSource {
    fn basis(&self, placement: &Placement) -> Result<Basis, SkipReason> {
        match self {
            Self::None => Err(SkipReason::NoSource),
            Self::Fixed(mib) => Ok(Basis { mib: *mib }),
            Self::Nodes(index) => index.basis(placement),
        }
    }
}

impl VramSource {
    /// The node index to keep current with a watch, if this source is one that is not synced
    /// yet (a NodeList file is synced from the start).
    #[must_use]
    pub fn index_to_watch(&self) -> Option<&Arc<SharedVramIndex>> {
        match self {
            Self::Nodes(i) if !i.is_synced() => Some(i),
            _ => None,
        }
    }
}

/// `--per-gpu-vram-mib` / `--nodes`, shared by `serve`, `review` and `mutate`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct VramArgs {
    /// Per-GPU VRAM in MiB for gpu-fraction pods; authoritative, turns node detection off
    /// (kai.perGpuVramMib).
    #[arg(long, env = "PER_GPU_VRAM_MIB")]
    pub per_gpu_vram_mib: Option<u64>,
    /// A NodeList (`kubectl get nodes -o json`) to take the per-GPU VRAM from, as the server's
    /// node watch would.
    #[arg(long, conflicts_with = "per_gpu_vram_mib")]
    pub nodes: Option<std::path::PathBuf>,
}

/// Choose the VRAM source for a command: `--per-gpu-vram-mib` (or `kai.perGpuVramMib`) wins;
/// else `--nodes FILE`; else, when `watch` (serve), a node index for the watch to fill; else none.
///
/// # Errors
/// A message naming the flag or file when a value is unusable.
pub fn configure(
    settings: &mut crate::settings::Settings,
    args: &VramArgs,
    watch: bool,
    metrics: &KaiMetrics,
) -> Result<(), String> {
    if let Some(n) = args.per_gpu_vram_mib {
        settings.kai.per_gpu_vram_mib = Some(n);
    }
    settings.kai.vram = if let Some(n) = settings.kai.per_gpu_vram_mib {
        if n == 0 {
            return Err(
                "per-GPU VRAM (PER_GPU_VRAM_MIB / --per-gpu-vram-mib / kai.perGpuVramMib) must be a positive number of MiB, not 0"
                    .to_owned(),
            );
        }
        metrics.basis_mib.set(i64::try_from(n).unwrap_or(i64::MAX));
        VramSource::Fixed(n)
    } else if let Some(path) = &args.nodes {
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let index =
            VramIndex::from_node_list(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        VramSource::Nodes(SharedVramIndex::fixed(index, metrics.clone()))
    } else if watch {
        VramSource::Nodes(SharedVramIndex::new(metrics.clone()))
    } else {
        VramSource::None
    };
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The node watch
// ---------------------------------------------------------------------------------------------

/// The readiness condition the node watch sets once the first list is read.
pub const READY_NODES: &str = "nodes";

/// The server's node watch: build a client from the environment (in-cluster service account or
/// kubeconfig), retrying with backoff until it works, then [`run_node_watch`] until `shutdown`.
/// `/readyz` stays false (condition [`READY_NODES`]) until the first list is read.
pub async fn watch_cluster(
    index: Arc<SharedVramIndex>,
    label_selector: String,
    readiness: crate::metrics::Readiness,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut delay = std::time::Duration::from_millis(500);
    let client = loop {
        match kube::Client::try_default().await {
            Ok(c) => break c,
            Err(e) => {
                index.metrics.watch_errors.inc();
                tracing::error!(error = %e, retry_in_ms = delay.as_millis() as u64, "no Kubernetes client for the node watch; gpu-fraction caps are skipped until it works (or set PER_GPU_VRAM_MIB)");
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(std::time::Duration::from_secs(30));
            }
        }
    };
    tracing::info!(label_selector = %label_selector, "watching GPU nodes (metadata only)");
    run_node_watch(
        client,
        index,
        &label_selector,
        |synced| readiness.set(READY_NODES, synced),
        shutdown,
    )
    .await;
}

/// Keep `index` current from the cluster's Nodes carrying `label_selector` (metadata only) until
/// `shutdown`. Calls `on_synced(true)` after each complete list. Errors are logged and counted;
/// the watch resumes or re-lists with backoff.
pub async fn run_node_watch(
    client: kube::Client,
    index: Arc<SharedVramIndex>,
    label_selector: &str,
    on_synced: impl Fn(bool) + Send,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::Node as K8sNode;
    use kube::core::PartialObjectMeta;
    use kube::runtime::{WatchStreamExt as _, watcher};

    // `PartialObjectMeta` makes every list and watch request metadata-only.
    let api: kube::Api<PartialObjectMeta<K8sNode>> = kube::Api::all(client);
    let config = watcher::Config::default().labels(label_selector);
    let stream = watcher(api, config).default_backoff();
    tokio::pin!(stream);
    tokio::pin!(shutdown);
    let mut pending: Option<VramIndex> = None;
    loop {
        let event = tokio::select! {
            biased;
            () = &mut shutdown => break,
            e = stream.next() => e,
        };
        let Some(event) = event else { break };
        match event {
            Ok(watcher::Event::Init) => pending = Some(VramIndex::new()),
            Ok(watcher::Event::InitApply(obj)) => {
                let p = pending.get_or_insert_with(VramIndex::new);
                apply(p, &obj.metadata);
            }
            Ok(watcher::Event::InitDone) => {
                let fresh = pending.take().unwrap_or_default();
                tracing::info!(
                    nodes = fresh.len(),
                    min_mib = fresh.min_mib().unwrap_or(0),
                    invalid_labels = fresh.invalid_labels(),
                    "GPU node list read"
                );
                index.replace_then(fresh, || on_synced(true));
            }
            Ok(watcher::Event::Apply(obj)) => {
                index.update(|i| apply(i, &obj.metadata));
            }
            Ok(watcher::Event::Delete(obj)) => {
                let name = obj.metadata.name.as_deref().unwrap_or("");
                index.update(|i| i.remove(name));
            }
            Err(e) => {
                index.metrics.watch_errors.inc();
                tracing::warn!(error = %e, "node watch error; resuming");
            }
        }
    }
}

fn apply(
    index: &mut VramIndex,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> IndexChange {
    let name = meta.name.as_deref().unwrap_or("");
    let labels = meta.labels.as_ref();
    if let Some(v) = labels.and_then(|l| l.get(LABEL_GPU_MEMORY))
        && let Err(e) = parse_gpu_memory_label(v)
    {
        tracing::warn!(node = name, error = %e, "GPU memory label ignored");
    }
    index.upsert(
        name,
        labels
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    )
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
        let pod: crate::pod::Pod<'_> = serde_json::from_str(&json).unwrap();
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
            let got = i.basis(&placement(&spec)).map(|b| b.mib);
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
        assert_eq!(i.basis(&p).map(|b| b.mib), slow);
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
            i.basis(&placement(r#"{"nodeSelector":{"zone":"a"}}"#))
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

    #[test]
    fn sources() {
        let p = Placement::any();
        assert_eq!(VramSource::None.basis(&p), Err(SkipReason::NoSource));
        assert_eq!(VramSource::Fixed(16384).basis(&p), Ok(Basis { mib: 16384 }));
        let shared = SharedVramIndex::new(KaiMetrics::default());
        let src = VramSource::Nodes(Arc::clone(&shared));
        assert_eq!(src.basis(&p), Err(SkipReason::NotSynced));
        assert!(src.index_to_watch().is_some());
        shared.replace(VramIndex::new());
        assert_eq!(src.basis(&p), Err(SkipReason::NoMatchingNode));
        shared.update(|i| i.upsert("n", [(LABEL_GPU_MEMORY, "100")]));
        assert_eq!(src.basis(&p), Ok(Basis { mib: 100 }));
        assert_eq!(shared.metrics().basis_mib.get(), 100);
        assert_eq!(shared.metrics().nodes_indexed.get(), 1);
        assert!(src.index_to_watch().is_none());
    }
}

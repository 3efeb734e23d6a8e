//! A watch-fed view of the pods bound to this node (`spec.nodeName=<node>`), so that `Allocate`
//! can find its pod without a pod LIST (or GET) while it holds the node-wide allocation lock.
//!
//! What the watch says is kept by kube's reflector ([`Store`] and its [`Writer`]: a relist is
//! buffered and swapped in whole at `InitDone`). The reflector cannot hold what the plugin itself
//! wrote: its [`Writer`] applies watch events unconditionally (the last event wins, a `Delete`
//! removes by name whatever the UID), while the plugin's own versions must outlive an older event
//! and a relist older than them. So those versions are kept beside the store, "ahead" of it, and a
//! read prefers them; each watch event drops the ones it catches up with.
//!
//! The view only saves round trips; it never decides on stale data:
//!
//! - a pod read from the view is selected with a merge patch that carries the pod's
//!   `metadata.resourceVersion`, so the API server refuses it (409) unless the view held the
//!   pod's current version — the executor then looks again, from the API server;
//! - the pods the plugin patches are put back into the view at once (the patch's response), so
//!   the next call sees the erased entry before the watch event arrives;
//! - a watch event never replaces a newer version (resourceVersions compared as numbers when both
//!   are numbers, as etcd's are; otherwise the later write wins and the precondition guards);
//! - nothing is read from the view until its first complete list, nor while the watch is broken
//!   (the executor then asks the API server, as without a view); a pod the view does not hold is
//!   looked up in the API server too.
//!
//! Pods are taken in the API server's list order (`<namespace>/<name>`), so "the first pending
//! pod" is the one a LIST would have returned first.
//!
//! The store, the plugin's own versions kept ahead of it and the watch loop that feeds both are
//! one invariant and stay in one file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::allocation::plan::pod::{Candidate, is_pending_here};

/// A version of a pod the plugin wrote or read itself, newer than the store's (or of a pod the
/// store does not hold yet).
#[derive(Debug)]
struct Ahead {
    pod: Arc<Pod>,
    /// Recorded while a relist was being read: kept when the list does not hold the pod (the
    /// list was taken before it).
    during_relist: bool,
}

#[derive(Debug)]
struct Inner {
    /// Applies the watch's events to the store.
    writer: Writer<Pod>,
    /// The plugin's own versions, by `<namespace>/<name>`; a read prefers them to the store's.
    ahead: BTreeMap<String, Ahead>,
    /// Between a relist's `Init` and its `InitDone`.
    relisting: bool,
    /// A complete list was read and the watch has not failed since.
    synced: bool,
}

/// The pods on this node, as last seen. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct PodCache {
    /// What the watch says (kube's reflector store).
    store: Store<Pod>,
    inner: Mutex<Inner>,
}

impl Default for PodCache {
    fn default() -> Self {
        let writer = Writer::default();
        Self {
            store: writer.as_reader(),
            inner: Mutex::new(Inner {
                writer,
                ahead: BTreeMap::new(),
                relisting: false,
                synced: false,
            }),
        }
    }
}

fn key_of(pod: &Pod) -> Option<String> {
    Some(format!(
        "{}/{}",
        pod.metadata.namespace.as_deref()?,
        pod.metadata.name.as_deref()?
    ))
}

fn rv_of(pod: &Pod) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
}

/// Whether `new` may replace `old`: not when both versions are numbers and `new`'s is lower.
fn newer_or_unknown(old: &Pod, new: &Pod) -> bool {
    match (rv_of(old), rv_of(new)) {
        (Some(old), Some(new)) => new >= old,
        _ => true,
    }
}

/// Both versions are numbers and `a`'s is higher than `b`'s.
fn strictly_newer(a: &Pod, b: &Pod) -> bool {
    rv_of(a).zip(rv_of(b)).is_some_and(|(a, b)| a > b)
}

fn same_pod(a: &Pod, b: &Pod) -> bool {
    a.metadata.uid == b.metadata.uid
}

impl PodCache {
    /// An empty, unsynced view.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The view's version of `pod` (same namespace and name): the plugin's own, else the store's.
    fn held(&self, inner: &Inner, key: &str, pod: &Pod) -> Option<Arc<Pod>> {
        match inner.ahead.get(key) {
            Some(ahead) => Some(Arc::clone(&ahead.pod)),
            None => self.store.get(&ObjectRef::from_obj(pod)),
        }
    }

    /// Keep `pod` as the view's version, ahead of the store.
    fn put_ahead(inner: &mut Inner, key: String, pod: Pod) {
        let during_relist = inner.relisting;
        inner.ahead.insert(
            key,
            Ahead {
                pod: Arc::new(pod),
                during_relist,
            },
        );
    }

    /// A complete list has been read and the watch is healthy.
    #[must_use]
    pub fn is_synced(&self) -> bool {
        self.lock().synced
    }

    /// Number of pods held.
    #[must_use]
    pub fn len(&self) -> usize {
        let inner = self.lock();
        let only_ahead = inner
            .ahead
            .values()
            .filter(|a| self.store.get(&ObjectRef::from_obj(&*a.pod)).is_none())
            .count();
        self.store.len() + only_ahead
    }

    /// No pod held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a pod version the plugin read or wrote (a patch's response), unless the view
    /// already holds a newer one of the same pod.
    pub fn observe(&self, pod: &Pod) {
        let Some(key) = key_of(pod) else { return };
        let mut inner = self.lock();
        if let Some(held) = self.held(&inner, &key, pod)
            && same_pod(&held, pod)
            && !newer_or_unknown(&held, pod)
        {
            return;
        }
        Self::put_ahead(&mut inner, key, pod.clone());
    }

    /// Shows `pod` with annotation `key` set to `value` (an allocation's claim, before its
    /// patch is answered), unless the view holds a newer version of it.
    pub fn claim(&self, pod: &Pod, key: &str, value: &str) {
        let mut claimed = pod.clone();
        claimed
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        let Some(k) = key_of(pod) else { return };
        let mut inner = self.lock();
        let newer = self
            .held(&inner, &k, pod)
            .is_some_and(|held| same_pod(&held, pod) && strictly_newer(&held, pod));
        if !newer {
            Self::put_ahead(&mut inner, k, claimed);
        }
    }

    /// Drops a claim whose patch failed: `original` is shown again, unless the view has moved
    /// on to another version meanwhile.
    pub fn unclaim(&self, original: &Pod) {
        let Some(k) = key_of(original) else { return };
        let mut inner = self.lock();
        let same = self.held(&inner, &k, original).is_some_and(|held| {
            same_pod(&held, original)
                && held.metadata.resource_version == original.metadata.resource_version
        });
        if same {
            Self::put_ahead(&mut inner, k, original.clone());
        }
    }

    /// UID → (namespace, name) of every pod held, when synced (`None` before the first list:
    /// an exporter must not take "not listed yet" for "gone").
    #[must_use]
    pub fn uids(&self) -> Option<BTreeMap<String, (String, String)>> {
        let inner = self.lock();
        if !inner.synced {
            return None;
        }
        let mut out = BTreeMap::new();
        let ahead = inner.ahead.values().map(|a| Arc::clone(&a.pod));
        for pod in self.store.state().into_iter().chain(ahead) {
            let m = &pod.metadata;
            if let (Some(uid), Some(ns), Some(name)) = (&m.uid, &m.namespace, &m.name) {
                out.insert(uid.clone(), (ns.clone(), name.clone()));
            }
        }
        Some(out)
    }

    /// The pod `namespace/name`, when synced and held.
    #[must_use]
    pub fn get(&self, namespace: &str, name: &str) -> Option<Pod> {
        let inner = self.lock();
        if !inner.synced {
            return None;
        }
        match inner.ahead.get(&format!("{namespace}/{name}")) {
            Some(ahead) => Some((*ahead.pod).clone()),
            None => self
                .store
                .get(&ObjectRef::new(name).within(namespace))
                .map(|p| (*p).clone()),
        }
    }

    /// The first pod (in list order) pending on `node` with an NVIDIA entry left to allocate,
    /// except those `passed_over` says to pass over, when synced; its devices decoded (once).
    #[must_use]
    pub fn first_pending(
        &self,
        node: &str,
        passed_over: impl Fn(&Pod) -> bool,
    ) -> Option<Candidate> {
        let inner = self.lock();
        if !inner.synced {
            return None;
        }
        let from_store = self
            .store
            .state_filter(|p| is_pending_here(p, node))
            .into_iter()
            .filter_map(|p| Some((key_of(&p)?, p)))
            .filter(|(key, _)| !inner.ahead.contains_key(key));
        let from_ahead = inner
            .ahead
            .iter()
            .filter(|(_, a)| is_pending_here(&a.pod, node))
            .map(|(key, a)| (key.clone(), Arc::clone(&a.pod)));
        let mut pending: Vec<(String, Arc<Pod>)> = from_store
            .chain(from_ahead)
            .filter(|(_, p)| !passed_over(p))
            .collect();
        pending.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        pending
            .iter()
            .find_map(|(_, p)| Candidate::unless_fully_allocated(p))
    }

    /// One event of the watch: into the store, and the plugin's versions it catches up with
    /// dropped. `InitDone` (a complete list) makes the view synced.
    pub fn event(&self, event: &watcher::Event<Pod>) {
        let mut inner = self.lock();
        inner.writer.apply_watcher_event(event);
        match event {
            watcher::Event::Init => inner.relisting = true,
            watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                // The list replaces the view; the plugin's versions newer than the list's stay,
                // and those recorded during the relist of pods the list does not hold.
                let store = &self.store;
                inner.ahead.retain(
                    |_, ours| match store.get(&ObjectRef::from_obj(&*ours.pod)) {
                        Some(listed) => {
                            same_pod(&listed, &ours.pod) && strictly_newer(&ours.pod, &listed)
                        }
                        None => ours.during_relist,
                    },
                );
                for ours in inner.ahead.values_mut() {
                    ours.during_relist = false;
                }
                inner.relisting = false;
                inner.synced = true;
            }
            // A pod was added or changed: it replaces the plugin's version unless that one is
            // a newer version of the same pod.
            watcher::Event::Apply(pod) => {
                if let Some(key) = key_of(pod)
                    && inner.ahead.get(&key).is_some_and(|ours| {
                        !same_pod(&ours.pod, pod) || newer_or_unknown(&ours.pod, pod)
                    })
                {
                    inner.ahead.remove(&key);
                }
            }
            // A pod was deleted or left the node: only that pod (same UID) is removed.
            watcher::Event::Delete(pod) => {
                if let Some(key) = key_of(pod)
                    && inner
                        .ahead
                        .get(&key)
                        .is_some_and(|ours| same_pod(&ours.pod, pod))
                {
                    inner.ahead.remove(&key);
                }
            }
        }
    }

    /// A relist begins (watch `Init`).
    pub fn begin_list(&self) {
        self.event(&watcher::Event::Init);
    }

    /// One pod of the relist (watch `InitApply`).
    pub fn list_item(&self, pod: Pod) {
        self.event(&watcher::Event::InitApply(pod));
    }

    /// The relist is complete (watch `InitDone`): it replaces the view, which is now synced.
    /// Versions the plugin wrote meanwhile and that are newer than the list's are kept.
    pub fn end_list(&self) {
        self.event(&watcher::Event::InitDone);
    }

    /// A pod was added or changed (watch `Apply`).
    pub fn apply(&self, pod: Pod) {
        self.event(&watcher::Event::Apply(pod));
    }

    /// A pod was deleted or left the node (watch `Delete`). Only that pod (same UID) is removed.
    pub fn delete(&self, pod: &Pod) {
        self.event(&watcher::Event::Delete(pod.clone()));
    }

    /// The watch failed: nothing is read from the view until the next complete list.
    pub fn unsync(&self) {
        self.lock().synced = false;
    }

    /// Keeps the view current from the API server (pods with `spec.nodeName=<node>`) until
    /// `shutdown`. Errors are logged; the watch resumes or relists with backoff.
    pub async fn run(
        self: Arc<Self>,
        client: kube::Client,
        node_name: String,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;

        let api: kube::Api<Pod> = kube::Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        // As the webhook's node watch: `take_until` polls `shutdown` before each event.
        let stream = watcher::watcher(api, config)
            .default_backoff()
            .take_until(shutdown);
        tokio::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    self.event(&event);
                    if matches!(event, watcher::Event::InitDone) {
                        tracing::debug!(node = %node_name, pods = self.len(), "pod view synced");
                    }
                }
                Err(error) => {
                    if self.is_synced() {
                        tracing::warn!(%error, node = %node_name, "pod watch failed; Allocate reads pods from the API server until it is back");
                    }
                    self.unsync();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str, rv: &str, phase: &str, entries: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv,
                "annotations": {
                    "hami.io/vgpu-node": "n1",
                    "hami.io/bind-time": "1",
                    "hami.io/bind-phase": "allocating",
                    "hami.io/vgpu-devices-to-allocate": entries,
                }
            },
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    const ONE: &str = "GPU-a,NVIDIA,1000,50:;";

    /// The name of the first pending pod on node "n1".
    fn first(cache: &PodCache) -> Option<String> {
        cache
            .first_pending("n1", |_| false)
            .map(|c| c.pod)
            .and_then(|p| p.metadata.name)
    }

    /// The resourceVersion the cache holds for pod `ns/name`.
    fn version(cache: &PodCache, name: &str) -> String {
        cache
            .get("ns", name)
            .and_then(|p| p.metadata.resource_version)
            .unwrap()
    }

    fn synced(pods: &[Pod]) -> Arc<PodCache> {
        let cache = PodCache::new();
        cache.begin_list();
        for p in pods {
            cache.list_item(p.clone());
        }
        cache.end_list();
        cache
    }

    #[test]
    fn nothing_is_read_before_the_first_list_or_after_a_watch_error() {
        let cache = PodCache::new();
        cache.apply(pod("a", "u1", "5", "Pending", ONE));
        assert!(!cache.is_synced());
        assert!(cache.get("ns", "a").is_none());
        assert!(cache.first_pending("n1", |_| false).is_none());
        cache.begin_list();
        cache.list_item(pod("a", "u1", "5", "Pending", ONE));
        cache.end_list();
        assert_eq!(first(&cache).unwrap(), "a");
        cache.unsync();
        assert!(cache.get("ns", "a").is_none());
        assert!(cache.first_pending("n1", |_| false).is_none());
    }

    #[test]
    fn first_pending_follows_list_order_and_skips_allocated_and_running_pods() {
        let cache = synced(&[
            pod("c", "u3", "7", "Pending", ONE),
            pod("a", "u1", "5", "Pending", ";;"),
            pod("b", "u2", "6", "Running", ONE),
            pod("b-2", "u4", "8", "Pending", ONE),
        ]);
        // "b-2" < "c"; "a" has nothing left; "b" is running.
        assert_eq!(first(&cache).unwrap(), "b-2");
        assert!(cache.first_pending("other-node", |_| false).is_none());
    }

    #[test]
    fn an_older_watch_event_never_replaces_what_the_plugin_wrote() {
        let cache = synced(&[pod("a", "u1", "5", "Pending", ONE)]);
        // The plugin's own patch erased the entry (rv 9)...
        cache.observe(&pod("a", "u1", "9", "Pending", ";"));
        // ...then the watch delivers an earlier change (rv 6).
        cache.apply(pod("a", "u1", "6", "Pending", ONE));
        assert!(cache.first_pending("n1", |_| false).is_none());
        assert_eq!(version(&cache, "a"), "9");
        // The same version from the watch, and later ones, are taken.
        cache.apply(pod("a", "u1", "10", "Running", ";"));
        assert_eq!(version(&cache, "a"), "10");
        // A relist older than what the plugin wrote keeps the plugin's version.
        cache.observe(&pod("a", "u1", "12", "Running", ";"));
        cache.begin_list();
        cache.list_item(pod("a", "u1", "11", "Running", ";"));
        cache.end_list();
        assert_eq!(version(&cache, "a"), "12");
    }

    #[test]
    fn a_recreated_pod_replaces_the_old_one_and_a_late_delete_of_the_old_one_is_ignored() {
        let cache = synced(&[pod("a", "old", "5", "Pending", ONE)]);
        cache.observe(&pod("a", "new", "3", "Pending", ONE));
        assert_eq!(cache.get("ns", "a").unwrap().metadata.uid.unwrap(), "new");
        cache.delete(&pod("a", "old", "6", "Pending", ONE));
        assert_eq!(cache.get("ns", "a").unwrap().metadata.uid.unwrap(), "new");
        cache.delete(&pod("a", "new", "7", "Pending", ONE));
        assert!(cache.get("ns", "a").is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn a_claim_hides_the_entries_until_the_patch_answers_or_is_dropped() {
        let original = pod("a", "u1", "5", "Pending", ONE);
        let cache = synced(&[original.clone(), pod("b", "u2", "6", "Pending", ONE)]);
        cache.claim(&original, "hami.io/vgpu-devices-to-allocate", ";");
        // The next call passes over "a".
        assert_eq!(first(&cache).unwrap(), "b");
        // The patch failed: "a" is back.
        cache.unclaim(&original);
        assert_eq!(first(&cache).unwrap(), "a");
        // The patch succeeded: its answer replaces the claim; a late unclaim changes nothing.
        cache.claim(&original, "hami.io/vgpu-devices-to-allocate", ";");
        cache.observe(&pod("a", "u1", "8", "Pending", ";"));
        cache.unclaim(&original);
        assert_eq!(first(&cache).unwrap(), "b");
        // A claim never hides a newer version the view already holds.
        cache.claim(&original, "hami.io/vgpu-devices-to-allocate", ONE);
        assert_eq!(version(&cache, "a"), "8");
    }

    #[test]
    fn non_numeric_versions_let_the_later_write_win() {
        let cache = synced(&[pod("a", "u1", "x", "Pending", ONE)]);
        cache.apply(pod("a", "u1", "y", "Pending", ";"));
        assert!(cache.first_pending("n1", |_| false).is_none());
    }
}

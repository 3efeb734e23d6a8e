//! A watch-fed view of the pods bound to this node (`spec.nodeName=<node>`), so that `Allocate`
//! can find its pod without a pod LIST (or GET) while it holds the node-wide allocation lock.
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
//! Pods are kept in the API server's list order (`<namespace>/<name>`), so "the first pending pod"
//! is the one a LIST would have returned first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;

use super::pod::{Candidate, is_pending_here};

#[derive(Debug, Default)]
struct Inner {
    pods: BTreeMap<String, Pod>,
    /// A complete list was read and the watch has not failed since.
    synced: bool,
    /// The list being read (between `Init` and `InitDone`).
    relist: Option<BTreeMap<String, Pod>>,
}

/// The pods on this node, as last seen. Cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct PodCache {
    inner: Mutex<Inner>,
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

fn upsert(pods: &mut BTreeMap<String, Pod>, pod: Pod) {
    let Some(key) = key_of(&pod) else { return };
    match pods.get(&key) {
        Some(old) if old.metadata.uid == pod.metadata.uid && !newer_or_unknown(old, &pod) => {}
        _ => {
            pods.insert(key, pod);
        }
    }
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

    /// A complete list has been read and the watch is healthy.
    #[must_use]
    pub fn is_synced(&self) -> bool {
        self.lock().synced
    }

    /// Number of pods held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().pods.len()
    }

    /// No pod held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a pod version the plugin read or wrote (a patch's response), unless the view
    /// already holds a newer one of the same pod.
    pub fn observe(&self, pod: &Pod) {
        let mut inner = self.lock();
        if let Some(relist) = inner.relist.as_mut() {
            upsert(relist, pod.clone());
        }
        upsert(&mut inner.pods, pod.clone());
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
        let newer = inner.pods.get(&k).is_some_and(|held| {
            held.metadata.uid == pod.metadata.uid
                && rv_of(held).zip(rv_of(pod)).is_some_and(|(h, p)| h > p)
        });
        if !newer {
            inner.pods.insert(k, claimed);
        }
    }

    /// Drops a claim whose patch failed: `original` is shown again, unless the view has moved
    /// on to another version meanwhile.
    pub fn unclaim(&self, original: &Pod) {
        let Some(k) = key_of(original) else { return };
        let mut inner = self.lock();
        let same = inner.pods.get(&k).is_some_and(|held| {
            held.metadata.uid == original.metadata.uid
                && held.metadata.resource_version == original.metadata.resource_version
        });
        if same {
            inner.pods.insert(k, original.clone());
        }
    }

    /// The pod `namespace/name`, when synced and held.
    #[must_use]
    pub fn get(&self, namespace: &str, name: &str) -> Option<Pod> {
        let inner = self.lock();
        if !inner.synced {
            return None;
        }
        inner.pods.get(&format!("{namespace}/{name}")).cloned()
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
        inner
            .pods
            .values()
            .filter(|p| is_pending_here(p, node) && !passed_over(p))
            .find_map(Candidate::unless_fully_allocated)
    }

    /// A relist begins (watch `Init`).
    pub fn begin_list(&self) {
        self.lock().relist = Some(BTreeMap::new());
    }

    /// One pod of the relist (watch `InitApply`).
    pub fn list_item(&self, pod: Pod) {
        let mut inner = self.lock();
        upsert(inner.relist.get_or_insert_with(BTreeMap::new), pod);
    }

    /// The relist is complete (watch `InitDone`): it replaces the view, which is now synced.
    /// Versions the plugin wrote meanwhile and that are newer than the list's are kept.
    pub fn end_list(&self) {
        let mut inner = self.lock();
        let mut fresh = inner.relist.take().unwrap_or_default();
        for (key, pod) in &inner.pods {
            if let Some(listed) = fresh.get(key)
                && listed.metadata.uid == pod.metadata.uid
                && rv_of(pod)
                    .zip(rv_of(listed))
                    .is_some_and(|(ours, theirs)| ours > theirs)
            {
                fresh.insert(key.clone(), pod.clone());
            }
        }
        inner.pods = fresh;
        inner.synced = true;
    }

    /// A pod was added or changed (watch `Apply`).
    pub fn apply(&self, pod: Pod) {
        upsert(&mut self.lock().pods, pod);
    }

    /// A pod was deleted or left the node (watch `Delete`). Only that pod (same UID) is removed.
    pub fn delete(&self, pod: &Pod) {
        let Some(key) = key_of(pod) else { return };
        let mut inner = self.lock();
        if inner
            .pods
            .get(&key)
            .is_some_and(|held| held.metadata.uid == pod.metadata.uid)
        {
            inner.pods.remove(&key);
        }
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
        use kube::runtime::{WatchStreamExt as _, watcher};

        let api: kube::Api<Pod> = kube::Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let stream = watcher(api, config).default_backoff();
        tokio::pin!(stream);
        tokio::pin!(shutdown);
        loop {
            let event = tokio::select! {
                biased;
                () = &mut shutdown => break,
                e = stream.next() => e,
            };
            let Some(event) = event else { break };
            match event {
                Ok(watcher::Event::Init) => self.begin_list(),
                Ok(watcher::Event::InitApply(pod)) => self.list_item(pod),
                Ok(watcher::Event::InitDone) => {
                    self.end_list();
                    tracing::debug!(node = %node_name, pods = self.len(), "pod view synced");
                }
                Ok(watcher::Event::Apply(pod)) => self.apply(pod),
                Ok(watcher::Event::Delete(pod)) => self.delete(&pod),
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

//! The allocator's claims on pods: a call that has selected a pod's entries claims the pod (the
//! cache shows the entries erased, so the next call passes over them) until its patch settles;
//! a call that finds the same pod meanwhile waits for the claim, then looks again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::Pod;

use crate::allocation::plan::AllocationPlan;
use crate::allocation::shell::pod_lookup::cache::PodCache;

/// The claims of one allocator.
#[derive(Debug, Default)]
pub struct Claims {
    inner: Mutex<ClaimsInner>,
}

#[derive(Debug, Default)]
struct ClaimsInner {
    /// Pods (by UID) being allocated, each with a mutex its claimer holds until its patch has
    /// settled, and whether the claim takes the pod's last NVIDIA entries.
    in_flight: HashMap<String, (Arc<tokio::sync::Mutex<()>>, bool)>,
    /// Pods whose claim settled since the current lookup began (cleared when one begins; lookups
    /// run one at a time, under the node-wide lock).
    settled: HashSet<String>,
}

impl Claims {
    fn lock(&self) -> MutexGuard<'_, ClaimsInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A lookup begins: only claims settled from now on can make what it reads stale.
    pub fn begin_lookup(&self) {
        self.lock().settled.clear();
    }

    /// Whether another call is allocating the last NVIDIA entries of pod `uid` (the pod is
    /// passed over: it will be fully allocated).
    pub fn takes_last_entries(&self, uid: &str) -> bool {
        self.lock()
            .in_flight
            .get(uid)
            .is_some_and(|(_, last)| *last)
    }

    /// The mutex of an in-flight claim on `uid` (to wait for it), and whether a claim on it
    /// settled since the lookup began.
    pub fn state(&self, uid: &str) -> (Option<Arc<tokio::sync::Mutex<()>>>, bool) {
        let inner = self.lock();
        (
            inner.in_flight.get(uid).map(|(m, _)| Arc::clone(m)),
            inner.settled.contains(uid),
        )
    }

    /// Claims pod `original` (UID `uid`) for `selection`: the cache (when there is one) shows
    /// `annotation` set to `erased` until the returned guard settles or is dropped.
    pub async fn claim<'a>(
        &'a self,
        cache: Option<&'a PodCache>,
        uid: String,
        original: &Pod,
        selection: Selection,
        annotation: &str,
        erased: String,
    ) -> Claim<'a> {
        let mutex = Arc::new(tokio::sync::Mutex::new(()));
        let held = Arc::clone(&mutex).lock_owned().await;
        self.lock()
            .in_flight
            .insert(uid.clone(), (mutex, selection.done));
        if let Some(cache) = cache {
            cache.claim(original, annotation, &erased);
        }
        Claim {
            selection,
            erased,
            guard: ClaimGuard {
                claims: self,
                cache,
                uid,
                original: original.clone(),
                kept: false,
                held: Some(held),
            },
        }
    }
}

/// What a call selected: the plans of the requested containers.
#[derive(Debug)]
pub struct Selection {
    /// One plan per requested container.
    pub plans: Vec<AllocationPlan>,
    /// No NVIDIA entry is left on the pod after these.
    pub done: bool,
}

/// A pod claimed by one call: what it selected, the annotation with those entries erased, and
/// the guard that ends the claim.
#[derive(Debug)]
pub struct Claim<'a> {
    /// The selection.
    pub selection: Selection,
    /// `hami.io/vgpu-devices-to-allocate` with the selected entries erased.
    pub erased: String,
    /// Ends the claim.
    pub guard: ClaimGuard<'a>,
}

/// Holds a claim until it settles — also when the call is cancelled (kubelet gone): dropping it
/// takes the claim back from the cache unless it was `kept` (its patch succeeded), ends it in the
/// claims, then releases its mutex (a call waiting for it looks again).
pub struct ClaimGuard<'a> {
    claims: &'a Claims,
    cache: Option<&'a PodCache>,
    uid: String,
    /// The pod as read, shown again if the claim is not kept.
    original: Pod,
    kept: bool,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl std::fmt::Debug for ClaimGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimGuard")
            .field("uid", &self.uid)
            .field("kept", &self.kept)
            .finish_non_exhaustive()
    }
}

impl ClaimGuard<'_> {
    /// Ends the claim now; `kept` when its patch succeeded.
    pub fn settle(mut self, kept: bool) {
        self.kept = kept;
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        if !self.kept
            && let Some(cache) = self.cache
        {
            cache.unclaim(&self.original);
        }
        {
            let mut claims = self.claims.lock();
            claims.in_flight.remove(&self.uid);
            claims.settled.insert(self.uid.clone());
        }
        drop(self.held.take());
    }
}

//! The live index: the node index shared between the node watch (the writer) and the server
//! (readers), with its sync state and change notification. The server takes a [`VramSnapshot`]
//! per request and hands it to the decision as a read-only [`VramBasis`]; the decision itself
//! takes no lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::policy::basis::{Basis, SkipReason, VramBasis};
use crate::policy::placement::Placement;
use crate::shell::vram::index::{IndexChange, VramIndex};
use crate::shell::vram::metrics::KaiMetrics;

/// The index behind a lock, with its sync state and change notification.
#[derive(Debug)]
pub struct LiveVramIndex {
    index: RwLock<VramIndex>,
    synced: AtomicBool,
    generation: tokio::sync::watch::Sender<u64>,
    metrics: KaiMetrics,
}

/// A read-only view of the live index for one decision: not synced yet, or the index as it is
/// while the snapshot is held.
#[derive(Debug)]
pub enum VramSnapshot<'a> {
    /// The first node list has not been read.
    NotSynced,
    /// The index (held under a read lock until dropped).
    Synced(RwLockReadGuard<'a, VramIndex>),
}

impl VramBasis for VramSnapshot<'_> {
    fn basis(&self, placement: &Placement) -> Result<Basis, SkipReason> {
        match self {
            Self::NotSynced => Err(SkipReason::NotSynced),
            Self::Synced(index) => index.basis(placement),
        }
    }
}

impl LiveVramIndex {
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

    /// Read access.
    pub fn read(&self) -> RwLockReadGuard<'_, VramIndex> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, VramIndex> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The view one decision reads.
    #[must_use]
    pub fn snapshot(&self) -> VramSnapshot<'_> {
        if self.is_synced() {
            VramSnapshot::Synced(self.read())
        } else {
            VramSnapshot::NotSynced
        }
    }

    /// Whether a complete node list has been read.
    #[must_use]
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Swap in a complete index, mark synced, and notify subscribers.
    pub fn replace(&self, index: VramIndex) {
        *self.write() = index;
        self.synced.store(true, Ordering::Release);
        self.metrics.synced.set(1);
        self.metrics.relists.inc();
        self.changed();
    }

    /// Apply a change to the live index.
    pub fn update(&self, f: impl FnOnce(&mut VramIndex) -> IndexChange) {
        if f(&mut self.write()) == IndexChange::Changed {
            self.changed();
        }
    }

    fn changed(&self) {
        self.metrics.index_changed(&self.read());
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_shared::names::LABEL_GPU_MEMORY;

    #[test]
    fn snapshots_follow_the_sync_state_and_the_gauges_follow_the_index() {
        let p = Placement::any();
        let live = LiveVramIndex::new(KaiMetrics::default());
        assert_eq!(live.snapshot().basis(&p), Err(SkipReason::NotSynced));
        live.replace(VramIndex::new());
        assert_eq!(live.snapshot().basis(&p), Err(SkipReason::NoMatchingNode));
        live.update(|i| i.upsert("n", [(LABEL_GPU_MEMORY, "100")]));
        assert_eq!(live.snapshot().basis(&p), Ok(Basis { mib: 100 }));
        assert_eq!(live.metrics().basis_bytes.get(), 100 << 20);
        assert_eq!(live.metrics().nodes_indexed.get(), 1);
        assert_eq!(live.metrics().relists.get(), 1);
    }
}

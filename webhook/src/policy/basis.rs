//! The per-GPU VRAM basis a `gpu-fraction` pod is capped against, as the decision asks for it:
//! [`VramBasis`], a read-only view. The decision never takes a lock or touches a counter: the
//! shell passes a snapshot in ([`crate::shell::vram`] implements the trait for the node index) and counts
//! what the decision observed.

use std::fmt;

use hami_shared::names::{UNCAPPED_NO_MATCHING_NODE, UNCAPPED_NO_SOURCE, UNCAPPED_NOT_SYNCED};

use crate::policy::placement::Placement;

/// The basis found for a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Basis {
    /// Per-GPU VRAM in MiB.
    pub mib: u64,
}

/// Why no basis could be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Neither a fixed per-GPU VRAM nor node detection is configured (offline without flags).
    NoSource,
    /// The node list has not been read yet.
    NotSynced,
    /// No node the pod can be placed on carries a usable `nvidia.com/gpu.memory`.
    NoMatchingNode,
}

impl SkipReason {
    /// Metric label value, and the `HAMI_UNCAPPED` value of the limits file of a container
    /// admitted without a cap (`kai.missingBasis: warn`): one spelling, in `hami_shared::names`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSource => UNCAPPED_NO_SOURCE,
            Self::NotSynced => UNCAPPED_NOT_SYNCED,
            Self::NoMatchingNode => UNCAPPED_NO_MATCHING_NODE,
        }
    }

    /// Every reason, for metric initialisation.
    pub const ALL: [SkipReason; 3] = [Self::NoSource, Self::NotSynced, Self::NoMatchingNode];
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoSource => {
                "no per-GPU VRAM basis is configured (set HAMI_KAI__PER_GPU_VRAM_MIB / --per-gpu-vram-mib, or --nodes offline)"
            }
            Self::NotSynced => "the GPU node list has not been read yet",
            Self::NoMatchingNode => {
                "no GPU node this pod can be placed on (nodeName, nodeSelector, required node affinity) carries a usable nvidia.com/gpu.memory label"
            }
        })
    }
}

/// What admission asks of a basis: the per-GPU VRAM for a pod placed by `placement`. A
/// read-only view; implementations never block.
pub trait VramBasis {
    /// The per-GPU VRAM in MiB for a pod placed by `placement`.
    ///
    /// # Errors
    /// Why there is none.
    fn basis(&self, placement: &Placement) -> Result<Basis, SkipReason>;
}

/// No basis configured: no `gpu-fraction` cap can be computed ([`SkipReason::NoSource`]): such a pod
/// is refused, or admitted uncapped with `kai.missingBasis: warn`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoBasis;

impl VramBasis for NoBasis {
    fn basis(&self, _: &Placement) -> Result<Basis, SkipReason> {
        Err(SkipReason::NoSource)
    }
}

/// A node list that has not been read yet ([`SkipReason::NotSynced`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotSynced;

impl VramBasis for NotSynced {
    fn basis(&self, _: &Placement) -> Result<Basis, SkipReason> {
        Err(SkipReason::NotSynced)
    }
}

/// One per-GPU VRAM for every pod (`--per-gpu-vram-mib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedBasis(pub u64);

impl VramBasis for FixedBasis {
    fn basis(&self, _: &Placement) -> Result<Basis, SkipReason> {
        Ok(Basis { mib: self.0 })
    }
}

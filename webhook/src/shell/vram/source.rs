//! Where a command takes the per-GPU VRAM basis from: `--per-gpu-vram-mib` (or
//! `kai.perGpuVramMib`), a NodeList file (`--nodes`), the server's node watch, or nowhere. The
//! flags, the file loading and the choice live here; the decision only sees a [`VramBasis`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::policy::basis::{FixedBasis, NoBasis, VramBasis};
use crate::shell::vram::index::VramIndex;
use crate::shell::vram::live::LiveVramIndex;
use crate::shell::vram::metrics::KaiMetrics;

/// `--per-gpu-vram-mib` / `--nodes`, shared by `serve`, `review` and `mutate`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct VramArgs {
    /// Per-GPU VRAM in MiB for gpu-fraction pods; authoritative, turns node detection off
    /// (kai.perGpuVramMib, env HAMI_KAI__PER_GPU_VRAM_MIB; PER_GPU_VRAM_MIB is deprecated).
    #[arg(long)]
    pub per_gpu_vram_mib: Option<u64>,
    /// A NodeList (`kubectl get nodes -o json`) to take the per-GPU VRAM from, as the server's
    /// node watch would.
    #[arg(long, conflicts_with = "per_gpu_vram_mib")]
    pub nodes: Option<PathBuf>,
}

/// A per-GPU VRAM value or NodeList file that cannot be the basis.
#[derive(Debug, thiserror::Error)]
pub enum VramSourceError {
    /// `--per-gpu-vram-mib` (or its key) is 0.
    #[error(
        "per-GPU VRAM (HAMI_KAI__PER_GPU_VRAM_MIB / --per-gpu-vram-mib / kai.perGpuVramMib) must be a positive number of MiB, not 0"
    )]
    ZeroVram,
    /// The `--nodes` file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadNodes {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The `--nodes` file holds no nodes.
    #[error("{}: not a NodeList (kubectl get nodes -o json): {source}", path.display())]
    NotANodeList {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: serde_yaml_ng::Error,
    },
}

/// Where the basis comes from.
#[derive(Debug, Clone, Default)]
pub enum VramSource {
    /// Nothing configured (offline without `--per-gpu-vram-mib` / `--nodes`).
    #[default]
    None,
    /// A fixed per-GPU VRAM: authoritative, detection off.
    Fixed(u64),
    /// A NodeList read once (`--nodes`): synced from the start, never changes.
    Nodes(Arc<VramIndex>),
    /// The live index the server's node watch keeps current.
    Watched(Arc<LiveVramIndex>),
}

impl VramSource {
    /// Choose: a fixed `per_gpu_vram_mib` wins; else the `nodes` file; else, when `watch`
    /// (serve), a live index for the node watch to fill; else none. The basis gauge is set for a
    /// fixed or file basis (the live index sets its own).
    ///
    /// # Errors
    /// [`VramSourceError`], naming the flag or file, when a value is unusable.
    pub fn choose(
        per_gpu_vram_mib: Option<u64>,
        nodes: Option<&Path>,
        watch: bool,
        metrics: &KaiMetrics,
    ) -> Result<Self, VramSourceError> {
        if let Some(n) = per_gpu_vram_mib {
            if n == 0 {
                return Err(VramSourceError::ZeroVram);
            }
            metrics.set_basis_mib(n);
            return Ok(Self::Fixed(n));
        }
        if let Some(path) = nodes {
            let text = std::fs::read(path).map_err(|source| VramSourceError::ReadNodes {
                path: path.to_path_buf(),
                source,
            })?;
            let index = VramIndex::from_node_list(&text).map_err(|source| {
                VramSourceError::NotANodeList {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            metrics.synced.set(1);
            metrics.index_changed(&index);
            return Ok(Self::Nodes(Arc::new(index)));
        }
        if watch {
            return Ok(Self::Watched(LiveVramIndex::new(metrics.clone())));
        }
        Ok(Self::None)
    }

    /// Run `f` with the basis as it is now: the live index is read under its lock for the
    /// duration of `f` (one decision), so the decision itself takes none.
    pub fn with_basis<R>(&self, f: impl FnOnce(&dyn VramBasis) -> R) -> R {
        match self {
            Self::None => f(&NoBasis),
            Self::Fixed(mib) => f(&FixedBasis(*mib)),
            Self::Nodes(index) => f(&**index),
            Self::Watched(live) => f(&live.snapshot()),
        }
    }

    /// The live index the node watch must keep current, if any.
    #[must_use]
    pub fn index_to_watch(&self) -> Option<&Arc<LiveVramIndex>> {
        match self {
            Self::Watched(live) => Some(live),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::basis::{Basis, SkipReason};
    use crate::policy::placement::Placement;

    #[test]
    fn sources() {
        let p = Placement::any();
        let m = KaiMetrics::default();
        let basis = |s: &VramSource| s.with_basis(|b| b.basis(&p));
        assert_eq!(
            basis(&VramSource::choose(None, None, false, &m).unwrap()),
            Err(SkipReason::NoSource)
        );
        let fixed = VramSource::choose(Some(16384), None, true, &m).unwrap();
        assert_eq!(basis(&fixed), Ok(Basis { mib: 16384 }));
        assert!(fixed.index_to_watch().is_none());
        assert_eq!(m.basis_bytes.get(), 16384 << 20);
        assert!(VramSource::choose(Some(0), None, false, &m).is_err());
        let watched = VramSource::choose(None, None, true, &m).unwrap();
        assert_eq!(basis(&watched), Err(SkipReason::NotSynced));
        assert!(watched.index_to_watch().is_some());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nodes.json");
        std::fs::write(
            &file,
            r#"{"items":[{"metadata":{"name":"n","labels":{"nvidia.com/gpu.memory":"100"}}}]}"#,
        )
        .unwrap();
        let nodes = VramSource::choose(None, Some(&file), true, &m).unwrap();
        assert_eq!(basis(&nodes), Ok(Basis { mib: 100 }));
        assert!(nodes.index_to_watch().is_none());
        let missing = VramSource::choose(None, Some(&dir.path().join("no")), false, &m);
        assert!(missing.unwrap_err().to_string().contains("cannot read"));
    }
}

//! The node GPU file part of `install-hook`: where the GPUs come from, and the pure plan of
//! `node-gpus` (publish, or withdraw a stale one).

use std::fmt;
use std::path::{Path, PathBuf};

use hami_shared::node_gpus::{NodeGpu, NodeGpus};

use hami_shared::names::ENV_HAMI_INVENTORY;

use crate::gpu::inventory::{FileInventory, Gpu, GpuInventory, InventoryError};
use crate::gpu::nvml::NvmlInventory;

use super::InstallHookError;

/// Where the GPUs of the node GPU file come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// NVML (`libnvidia-ml.so.1`, given to the container by the NVIDIA runtime).
    Nvml,
    /// An inventory file (`--inventory FILE`).
    InventoryFile(PathBuf),
}

impl fmt::Display for GpuSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nvml => f.write_str("NVML"),
            Self::InventoryFile(path) => write!(f, "inventory file {}", path.display()),
        }
    }
}

/// What the GPU source gave ([`list_gpus`]), the input of [`plan_install`]'s node GPU file.
#[derive(Debug)]
pub enum GpuListing {
    /// The GPUs the source lists (possibly none).
    Listed {
        /// NVML or the inventory file.
        source: GpuSource,
        /// The GPUs, in index order.
        gpus: Vec<Gpu>,
    },
    /// NVML cannot be loaded (no driver library in the container, no GPU driver) and no inventory
    /// file was given.
    NvmlUnavailable {
        /// NVML's error.
        reason: String,
    },
    /// The source failed: an unreadable or malformed inventory file, an NVML call failing for a
    /// GPU.
    Failed(InventoryError),
}

/// Reads the GPUs: the inventory file when given, else NVML.
pub fn list_gpus(inventory: Option<&Path>) -> GpuListing {
    let (source, listed) = match inventory {
        Some(path) => (
            GpuSource::InventoryFile(path.to_path_buf()),
            FileInventory::new(path).discover(),
        ),
        None => (
            GpuSource::Nvml,
            NvmlInventory::init().and_then(|nvml| nvml.discover()),
        ),
    };
    match listed {
        Ok(gpus) => GpuListing::Listed { source, gpus },
        Err(InventoryError::NvmlUnavailable(reason)) => GpuListing::NvmlUnavailable { reason },
        Err(error) => GpuListing::Failed(error),
    }
}

/// Why no node GPU file is published (the text is the warning `install-hook` logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoNodeGpus {
    /// NVML cannot be loaded and no inventory file was given.
    NvmlUnavailable(String),
    /// The source lists no GPU.
    NoGpu(GpuSource),
    /// No GPU the source lists reports its memory (unified memory, e.g. GB10).
    NoMemory(GpuSource),
}

impl fmt::Display for NoNodeGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NvmlUnavailable(reason) => write!(
                f,
                "NVML is not available ({reason}): give this container NVML (the NVIDIA container \
                 runtime, e.g. runtimeClassName nvidia, with NVIDIA_VISIBLE_DEVICES=all and \
                 NVIDIA_DRIVER_CAPABILITIES=utility), or on a machine without NVIDIA GPUs pass \
                 --inventory FILE (env {ENV_HAMI_INVENTORY})"
            ),
            Self::NoGpu(GpuSource::Nvml) => f.write_str(
                "NVML lists no GPU: give this container every GPU (NVIDIA_VISIBLE_DEVICES=all \
                 through the NVIDIA container runtime)",
            ),
            Self::NoGpu(source) => {
                write!(f, "the {source} lists no GPU: list the node's GPUs in it")
            }
            Self::NoMemory(source) => write!(
                f,
                "no GPU of the {source} reports its memory (unified memory, e.g. GB10): a fraction of it has no size"
            ),
        }?;
        f.write_str(
            "; until then the preload library keeps the admission-time memory cap of KAI \
             gpu-fraction containers on this node",
        )
    }
}

/// What [`plan_install`] decided about `HOOK/vgpu/node-gpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeGpusPlan {
    /// Publish these GPUs (the file is in [`InstallPlan::files`], before `ld.so.preload`).
    Publish {
        /// `HOOK/vgpu/node-gpus`.
        path: PathBuf,
        /// Where the GPUs came from.
        from: GpuSource,
        /// The GPUs.
        gpus: NodeGpus,
    },
    /// Publish nothing, and remove a file already there (before any file is installed).
    Withdraw {
        /// `HOOK/vgpu/node-gpus`.
        path: PathBuf,
        /// Why.
        reason: NoNodeGpus,
    },
}

/// The pure decision about the node GPU file at `path` from what the GPU source gave.
///
/// # Errors
/// [`InstallHookError::GpuList`] when the source failed, [`InstallHookError::NodeGpus`] for a GPU
/// the file cannot hold (minor number above 254, memory out of range, a UUID it cannot write, two
/// GPUs with one minor number).
pub fn plan_node_gpus(path: &Path, listing: GpuListing) -> Result<NodeGpusPlan, InstallHookError> {
    let path = path.to_path_buf();
    let (from, gpus) = match listing {
        GpuListing::Listed { source, gpus } => (source, gpus),
        GpuListing::NvmlUnavailable { reason } => {
            return Ok(NodeGpusPlan::Withdraw {
                path,
                reason: NoNodeGpus::NvmlUnavailable(reason),
            });
        }
        GpuListing::Failed(error) => return Err(InstallHookError::GpuList { path, error }),
    };
    if gpus.is_empty() {
        return Ok(NodeGpusPlan::Withdraw {
            path,
            reason: NoNodeGpus::NoGpu(from),
        });
    }
    // A GPU that reports no memory (unified memory, e.g. GB10) has no size to take a fraction
    // of: left out, so that the preload library keeps the admission-time cap for it.
    let gpus: Vec<Gpu> = gpus.into_iter().filter(|g| g.memory_mib > 0).collect();
    if gpus.is_empty() {
        return Ok(NodeGpusPlan::Withdraw {
            path,
            reason: NoNodeGpus::NoMemory(from),
        });
    }
    let mut node = NodeGpus::new();
    for gpu in gpus {
        let entry = NodeGpu {
            minor: gpu.minor,
            uuid: gpu.uuid,
            memory_mib: gpu.memory_mib,
        };
        if let Err(error) = node.insert(entry) {
            return Err(InstallHookError::NodeGpus { path, from, error });
        }
    }
    Ok(NodeGpusPlan::Publish {
        path,
        from,
        gpus: node,
    })
}

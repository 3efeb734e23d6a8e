//! `hami-device-plugin install-hook`: puts HAMi-core and the hami-limits preload library into the
//! hook path on the host, with an `ld.so.preload` generated for that path, and publishes the node
//! GPU file beside them.
//!
//! What ends up under `HOOK/vgpu` (each file `0644`, the directories `0755`):
//!
//! - `libvgpu.so`: HAMi-core, from `--hami-core-dir`, which must hold exactly one of `libvgpu.so`
//!   or `libvgpu.so.<version>` (HAMi images since v2.5 carry only the versioned name);
//! - `libhami_preload.so`: the preload library (`--preload`), which loads `/overrideEnv` into the
//!   environment before `main`;
//! - `node-gpus`: **generated**, the node GPU file ([`hami_shared::node_gpus`]: each GPU's minor
//!   number, UUID and MiB), from NVML or, with `--inventory FILE`, from the inventory file. The
//!   preload library reads it in KAI `gpu-fraction` containers. Without a GPU list (NVML not
//!   loadable and no inventory, or a source listing no GPU) it is not published and a file already
//!   there is removed: a wrong file is worse than none (readers then keep the admission-time cap);
//! - `ld.so.preload`: **generated**, `HOOK/vgpu/libhami_preload.so` then `HOOK/vgpu/libvgpu.so`,
//!   one absolute path a line. Never copied from the image: HAMi's copy hard-codes
//!   `/usr/local/vgpu/libvgpu.so` whatever the hook path (HAMi#2017).
//!
//! The module is split in two: [`plan_install`] decides, purely, what to install from what a scan
//! of the directory found ([`FoundEntry`]) and what the GPU source listed ([`GpuListing`], read by
//! [`list_gpus`]); [`execute`] does the file I/O. Each file is written to a temporary file beside
//! its final name, `fsync`ed, renamed over it and the directory `fsync`ed
//! ([`hami_shared::publish_atomic`]), so a library that running processes map is never
//! overwritten in place, and the libraries go first and `ld.so.preload` last, so that at every
//! moment (including after a failure or a crash) `ld.so.preload` is the previous complete one or
//! absent, and never names a library that is not there. `node-gpus` goes between them (or, when
//! withdrawn, is removed before any file is installed): whatever a new `ld.so.preload` activates
//! finds the node file of this run, never the previous one.
//!
//! A GPU list that cannot be read (an unreadable or malformed inventory file, an NVML call failing
//! for one GPU) or a GPU the file cannot hold ([`NodeGpusError`]) is an error, found by the plan
//! before anything is written: the libraries and `ld.so.preload` stay as they were (complete, and
//! right whatever the hardware), but a `node-gpus` already there is removed, since this run can no
//! longer vouch for it ([`InstallHookError::node_gpus_to_withdraw`]).

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use clap::Args;
use hami_shared::names::{
    self, CONTAINERS_DIR, DEFAULT_HOOK_PATH, ENV_HAMI_INVENTORY, LD_SO_PRELOAD_FILE,
    LIBHAMI_PRELOAD_SO, LIBVGPU_SO, NODE_GPUS_FILE, VGPU_DIR,
};
use hami_shared::node_gpus::{NodeGpu, NodeGpus, NodeGpusError};
use hami_shared::publish::PUBLISHED_MODE;
use hami_shared::{PublishError, publish_atomic, sweep_temp_files};

use crate::inventory::{FileInventory, Gpu, GpuInventory, InventoryError};
use crate::nvml::NvmlInventory;

/// The first bytes of every ELF file.
pub const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Mode of the directories created under the hook path.
pub const DIR_MODE: u32 = 0o755;

/// How many names of the scanned directory an error lists at most.
const LISTED_NAMES: usize = 20;

/// `install-hook` flags.
#[derive(Debug, Clone, Args)]
pub struct InstallHookArgs {
    /// Directory holding HAMi-core's library: exactly one of `libvgpu.so` or
    /// `libvgpu.so.<version>` (HAMi images since v2.5: `/k8s-vgpu/lib/nvidia/libvgpu.so.<version>`).
    /// Symbolic links to a regular file are followed; other files there (HAMi's own
    /// `ld.so.preload`) are ignored.
    #[arg(long = "hami-core-dir", value_name = "DIR")]
    pub hami_core_dir: PathBuf,
    /// The hami-limits preload library (`libhami_preload.so`), installed as
    /// `HOOK/vgpu/libhami_preload.so`.
    #[arg(long = "preload", value_name = "FILE")]
    pub preload: PathBuf,
    /// HAMi's hook path on the host, `HOOK` (the same value as `run --hook-path`): an absolute
    /// path without whitespace, `:` or `..`; the files go to `HOOK/vgpu/`.
    #[arg(long = "hook-path", env = names::ENV_HAMI_HOOK_PATH, default_value = DEFAULT_HOOK_PATH, value_name = "HOOK")]
    pub hook_path: PathBuf,
    /// YAML list of GPUs (the file `run --inventory` reads) for `HOOK/vgpu/node-gpus`, on a
    /// machine without NVIDIA GPUs; without it the GPUs come from NVML.
    #[arg(long = "inventory", env = ENV_HAMI_INVENTORY, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
}

/// Why `install-hook` failed; every variant names the path or the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum InstallHookError {
    /// `--hook-path` cannot be written into `ld.so.preload` as given.
    #[error("--hook-path {value:?}: {reason}")]
    InvalidHookPath {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The HAMi-core directory could not be listed.
    #[error("cannot list {dir} (--hami-core-dir): {source}")]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No `libvgpu.so` nor `libvgpu.so.<version>` in the directory.
    #[error(
        "no HAMi-core library in {dir} (--hami-core-dir): expected {LIBVGPU_SO} or one {LIBVGPU_SO}.<version>; found {}",
        listing(found)
    )]
    NoLibrary {
        /// The directory.
        dir: PathBuf,
        /// The names it holds (sorted).
        found: Vec<String>,
    },
    /// More than one distinct HAMi-core library in the directory.
    #[error(
        "more than one HAMi-core library in {dir} (--hami-core-dir): {}; keep exactly one of {LIBVGPU_SO} or {LIBVGPU_SO}.<version>",
        candidates.join(", ")
    )]
    Ambiguous {
        /// The directory.
        dir: PathBuf,
        /// The candidates' names (sorted).
        candidates: Vec<String>,
    },
    /// A source file (or a library candidate) is not a regular file.
    #[error("{path}: {what}, not a regular file")]
    NotARegularFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// A source file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadSource {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A source file is empty.
    #[error("{path} is empty; refusing to install it")]
    EmptySource {
        /// The path.
        path: PathBuf,
    },
    /// A source file is not an ELF shared object.
    #[error("{path} is not an ELF file (it does not start with \\x7fELF); refusing to install it")]
    NotElf {
        /// The path.
        path: PathBuf,
    },
    /// A destination directory exists and is not a directory.
    #[error("{path} exists and is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// A destination directory could not be created (or inspected, or `chmod`ed).
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A directory could not be `fsync`ed (a directory created or a file removed in it may not be
    /// durable).
    #[error(transparent)]
    SyncDir(PublishError),
    /// Leftover temporary files of an earlier run could not be removed.
    #[error("cannot remove leftover temporary files: {0}")]
    Sweep(#[source] PublishError),
    /// Installing a file failed (its temporary file is removed; the previous file, if any, stays).
    #[error("cannot install {path}: {source}")]
    Install {
        /// The final path.
        path: PathBuf,
        /// What failed, naming the path involved.
        #[source]
        source: PublishError,
    },
    /// The GPUs for the node GPU file could not be listed: the inventory file is unreadable or
    /// malformed (the message names the entry), or an NVML call failed for a GPU.
    #[error("cannot list the GPUs for {path}: {error}")]
    GpuList {
        /// The node GPU file.
        path: PathBuf,
        /// What the source reported.
        #[source]
        error: InventoryError,
    },
    /// A GPU the node GPU file cannot hold (the message names the GPU, the field and the range).
    #[error("cannot write the GPUs of {from} into {path}: {error}")]
    NodeGpus {
        /// The node GPU file.
        path: PathBuf,
        /// Where the GPUs came from.
        from: GpuSource,
        /// The GPU and what is wrong with it.
        #[source]
        error: NodeGpusError,
    },
    /// A node GPU file to withdraw could not be removed (or its removal not made durable).
    #[error("cannot remove {path}: {source}")]
    Withdraw {
        /// The node GPU file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl InstallHookError {
    /// Exit status: 2 for an invalid `--hook-path`, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::InvalidHookPath { .. } => 2,
            _ => 1,
        }
    }

    /// The node GPU file a run refused with this error must not leave behind: after a GPU list
    /// that cannot be read or written, a `node-gpus` from an earlier run may describe other GPUs,
    /// and a wrong file is worse than none. `None` for every other error (nothing is touched).
    pub fn node_gpus_to_withdraw(&self) -> Option<&Path> {
        match self {
            Self::GpuList { path, .. } | Self::NodeGpus { path, .. } => Some(path),
            _ => None,
        }
    }
}

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

fn listing(names: &[String]) -> String {
    if names.is_empty() {
        return "nothing (the directory is empty)".to_owned();
    }
    let shown = names
        .iter()
        .take(LISTED_NAMES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match names.len().checked_sub(LISTED_NAMES) {
        Some(more) if more > 0 => format!("{shown} and {more} more"),
        _ => shown,
    }
}

/// What one name in the HAMi-core directory is, symbolic links followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A device, FIFO or socket.
    Special,
    /// A symbolic link to nothing (or a file that cannot be inspected).
    Dangling,
}

impl EntryKind {
    fn describe(self) -> &'static str {
        match self {
            Self::File => "a regular file",
            Self::Directory => "a directory",
            Self::Special => "a device, FIFO or socket",
            Self::Dangling => "a dangling symbolic link or an unreadable entry",
        }
    }
}

/// One name found in the HAMi-core directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundEntry {
    /// The file name (lossily decoded for display and matching).
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// What it is, symbolic links followed.
    pub kind: EntryKind,
    /// True when the name itself is a symbolic link.
    pub symlink: bool,
    /// Device and inode of the file it resolves to (two names of one file are one library).
    pub identity: Option<(u64, u64)>,
}

/// True for `libvgpu.so` and `libvgpu.so.<version>` (any non-empty version).
pub fn is_libvgpu_name(name: &str) -> bool {
    name == LIBVGPU_SO
        || name
            .strip_prefix(LIBVGPU_SO)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|version| !version.is_empty())
}

/// Where an installed file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// Copied from this file.
    Copy(PathBuf),
    /// Generated text.
    Generated(String),
}

/// One file to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedInstall {
    /// The final path under `HOOK/vgpu`.
    pub dest: PathBuf,
    /// Its bytes.
    pub source: FileSource,
}

/// What [`plan_install`] decided: the directories, the files in installation order, and the node
/// GPU file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPlan {
    /// The normalised hook path.
    pub hook_path: PathBuf,
    /// `HOOK/vgpu`.
    pub vgpu_dir: PathBuf,
    /// `HOOK/vgpu/containers`.
    pub containers_dir: PathBuf,
    /// `libvgpu.so`, `libhami_preload.so`, `node-gpus` when published, then `ld.so.preload`:
    /// everything the list activates before the list.
    pub files: Vec<PlannedInstall>,
    /// `node-gpus`: published (then also in `files`) or withdrawn.
    pub node_gpus: NodeGpusPlan,
}

/// The hook path as it will be written into `ld.so.preload`: absolute, UTF-8, without
/// whitespace, control characters, `:` (glibc splits `ld.so.preload` on whitespace and `:`) or
/// `..`; `.` components, repeated and trailing slashes removed.
pub fn normalise_hook_path(hook: &Path) -> Result<PathBuf, InstallHookError> {
    let invalid = |reason| InstallHookError::InvalidHookPath {
        value: hook.to_string_lossy().into_owned(),
        reason,
    };
    let value = hook.to_str().ok_or_else(|| invalid("not valid UTF-8"))?;
    if !value.starts_with('/') {
        return Err(invalid("not an absolute path"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            "contains whitespace or a control character, which would split its line of ld.so.preload",
        ));
    }
    if value.contains(':') {
        return Err(invalid(
            "contains ':', which separates the entries of ld.so.preload",
        ));
    }
    let mut normal = PathBuf::from("/");
    for component in hook.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => return Err(invalid("contains a '..' component")),
            Component::Prefix(_) => return Err(invalid("not an absolute path")),
        }
    }
    Ok(normal)
}

/// The generated `ld.so.preload` for `vgpu_dir` (`HOOK/vgpu`): the preload library first, so that
/// it runs before HAMi-core reads the environment, then HAMi-core.
pub fn ld_so_preload_contents(vgpu_dir: &Path) -> String {
    format!(
        "{}\n{}\n",
        vgpu_dir.join(LIBHAMI_PRELOAD_SO).display(),
        vgpu_dir.join(LIBVGPU_SO).display()
    )
}

/// The one HAMi-core library among `found` (the scan of `dir`).
///
/// Candidates are `libvgpu.so` and `libvgpu.so.<version>`. Each must resolve to a regular file
/// (a directory named `libvgpu.so` is an error); names of one file (a symbolic link to the
/// versioned file, a hard link) count once, and the name that is not a symbolic link is chosen.
/// None, or several distinct files (`libvgpu.so` beside `libvgpu.so.<version>`, two versions),
/// is an error listing what was found.
pub fn select_libvgpu<'a>(
    dir: &Path,
    found: &'a [FoundEntry],
) -> Result<&'a FoundEntry, InstallHookError> {
    let mut candidates: Vec<&FoundEntry> =
        found.iter().filter(|e| is_libvgpu_name(&e.name)).collect();
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(bad) = candidates.iter().find(|e| e.kind != EntryKind::File) {
        return Err(InstallHookError::NotARegularFile {
            path: bad.path.clone(),
            what: bad.kind.describe(),
        });
    }
    let mut distinct: Vec<&FoundEntry> = Vec::new();
    for candidate in candidates.iter().copied() {
        let same = distinct
            .iter()
            .position(|d| d.identity.is_some() && d.identity == candidate.identity);
        match same {
            // Prefer the real name over a symbolic link to it.
            Some(i) if distinct[i].symlink && !candidate.symlink => distinct[i] = candidate,
            Some(_) => {}
            None => distinct.push(candidate),
        }
    }
    match distinct.as_slice() {
        [one] => Ok(one),
        [] => {
            let mut names: Vec<String> = found.iter().map(|e| e.name.clone()).collect();
            names.sort();
            Err(InstallHookError::NoLibrary {
                dir: dir.to_path_buf(),
                found: names,
            })
        }
        _ => Err(InstallHookError::Ambiguous {
            dir: dir.to_path_buf(),
            candidates: candidates.iter().map(|e| e.name.clone()).collect(),
        }),
    }
}

/// The pure plan: what to install under `hook_path` from the scan of `hami_core_dir`, the
/// preload library `preload` and the GPUs the source listed. Checked in this order: the hook
/// path, the HAMi-core library, the GPUs ([`plan_node_gpus`]).
pub fn plan_install(
    found: &[FoundEntry],
    hami_core_dir: &Path,
    preload: &Path,
    hook_path: &Path,
    gpus: GpuListing,
) -> Result<InstallPlan, InstallHookError> {
    let hook_path = normalise_hook_path(hook_path)?;
    let libvgpu = select_libvgpu(hami_core_dir, found)?;
    let vgpu_dir = hook_path.join(VGPU_DIR);
    let node_gpus = plan_node_gpus(&vgpu_dir.join(NODE_GPUS_FILE), gpus)?;
    let mut files = vec![
        PlannedInstall {
            dest: vgpu_dir.join(LIBVGPU_SO),
            source: FileSource::Copy(libvgpu.path.clone()),
        },
        PlannedInstall {
            dest: vgpu_dir.join(LIBHAMI_PRELOAD_SO),
            source: FileSource::Copy(preload.to_path_buf()),
        },
    ];
    if let NodeGpusPlan::Publish { path, gpus, .. } = &node_gpus {
        files.push(PlannedInstall {
            dest: path.clone(),
            source: FileSource::Generated(gpus.render()),
        });
    }
    files.push(PlannedInstall {
        dest: vgpu_dir.join(LD_SO_PRELOAD_FILE),
        source: FileSource::Generated(ld_so_preload_contents(&vgpu_dir)),
    });
    Ok(InstallPlan {
        containers_dir: vgpu_dir.join(CONTAINERS_DIR),
        vgpu_dir,
        hook_path,
        files,
        node_gpus,
    })
}

/// Checks that `bytes`, read from `path`, can be installed as a library: not empty, ELF.
pub fn check_library_bytes(path: &Path, bytes: &[u8]) -> Result<(), InstallHookError> {
    if bytes.is_empty() {
        return Err(InstallHookError::EmptySource {
            path: path.to_path_buf(),
        });
    }
    if !bytes.starts_with(ELF_MAGIC) {
        return Err(InstallHookError::NotElf {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Lists `dir`: every name, what it is, symbolic links followed.
pub fn scan_dir(dir: &Path) -> Result<Vec<FoundEntry>, InstallHookError> {
    let read_dir_err = |source| InstallHookError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir_err)? {
        let entry = entry.map_err(read_dir_err)?;
        let path = entry.path();
        let symlink = entry.file_type().is_ok_and(|t| t.is_symlink());
        let (kind, identity) = match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => (EntryKind::File, Some((meta.dev(), meta.ino()))),
            Ok(meta) if meta.is_dir() => (EntryKind::Directory, Some((meta.dev(), meta.ino()))),
            Ok(meta) => (EntryKind::Special, Some((meta.dev(), meta.ino()))),
            Err(_) => (EntryKind::Dangling, None),
        };
        found.push(FoundEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            path,
            kind,
            symlink,
            identity,
        });
    }
    Ok(found)
}

/// Reads a library to install, symbolic links followed: a regular, readable, non-empty ELF file.
pub fn read_library(path: &Path) -> Result<Vec<u8>, InstallHookError> {
    let read_err = |source| InstallHookError::ReadSource {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            EntryKind::Directory
        } else {
            EntryKind::Special
        };
        return Err(InstallHookError::NotARegularFile {
            path: path.to_path_buf(),
            what: what.describe(),
        });
    }
    let bytes = fs::read(path).map_err(read_err)?;
    check_library_bytes(path, &bytes)?;
    Ok(bytes)
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written (it was missing or different).
    Installed,
    /// Already there with the same bytes and mode `0644`: not rewritten.
    Unchanged,
}

/// One installed file, as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledFile {
    /// The final path.
    pub path: PathBuf,
    /// Installed or unchanged.
    pub outcome: Outcome,
    /// The file copied, or `None` for generated text.
    pub from: Option<PathBuf>,
    /// Its size in bytes.
    pub bytes: usize,
}

impl Outcome {
    /// `installed` or `unchanged`, as reported.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Installed => "installed",
            Self::Unchanged => "unchanged",
        }
    }
}

impl fmt::Display for InstalledFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.outcome.as_str(), self.path.display())?;
        match &self.from {
            Some(from) => write!(f, " (from {}, {} bytes)", from.display(), self.bytes),
            None => write!(f, " (generated, {} bytes)", self.bytes),
        }
    }
}

/// What became of `HOOK/vgpu/node-gpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeGpusReport {
    /// Published (or unchanged): its line is among [`InstallReport::files`].
    Published {
        /// The file.
        path: PathBuf,
        /// Where the GPUs came from.
        from: GpuSource,
        /// The GPUs it lists, by minor number.
        gpus: Vec<NodeGpu>,
    },
    /// Not published.
    Withdrawn {
        /// The file.
        path: PathBuf,
        /// Why (the warning to log).
        reason: NoNodeGpus,
        /// True when a file of an earlier run was there and has been removed.
        removed: bool,
    },
}

/// What [`execute`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// One entry per file, in installation order.
    pub files: Vec<InstalledFile>,
    /// Directories created.
    pub created_dirs: Vec<PathBuf>,
    /// Leftover temporary files of an earlier run removed from `HOOK/vgpu`.
    pub removed_temporaries: usize,
    /// The node GPU file.
    pub node_gpus: NodeGpusReport,
}

impl InstallReport {
    /// What `install-hook` prints: `removed PATH (...)` for a withdrawn node GPU file of an
    /// earlier run, then one line per file in installation order, the node GPU file's followed
    /// by one indented line per GPU (`  /dev/nvidia<minor> <uuid> <MiB> MiB`).
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::with_capacity(self.files.len() + 1);
        if let NodeGpusReport::Withdrawn {
            path,
            removed: true,
            ..
        } = &self.node_gpus
        {
            lines.push(format!(
                "removed {} (written by an earlier run; this run has no GPU list)",
                path.display()
            ));
        }
        for file in &self.files {
            match &self.node_gpus {
                NodeGpusReport::Published { path, from, gpus } if *path == file.path => {
                    lines.push(format!(
                        "{} {} (generated from {from}: {} GPU{}, {} bytes)",
                        file.outcome.as_str(),
                        path.display(),
                        gpus.len(),
                        if gpus.len() == 1 { "" } else { "s" },
                        file.bytes
                    ));
                    lines.extend(gpus.iter().map(|gpu| {
                        format!(
                            "  /dev/nvidia{} {} {} MiB",
                            gpu.minor, gpu.uuid, gpu.memory_mib
                        )
                    }));
                }
                _ => lines.push(file.to_string()),
            }
        }
        lines
    }
}

/// Creates `path` (mode `0755`, whatever the umask) unless it is a directory already; true
/// when created.
fn ensure_dir(path: &Path) -> Result<bool, InstallHookError> {
    let create_err = |source| InstallHookError::CreateDir {
        path: path.to_path_buf(),
        source,
    };
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(false),
        Ok(_) => {
            return Err(InstallHookError::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(create_err(e)),
    }
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
    {
        Ok(()) => {}
        // A file of that name (or in the way of a parent).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory
            ) =>
        {
            return Err(InstallHookError::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(create_err(e)),
    }
    fs::set_permissions(path, fs::Permissions::from_mode(DIR_MODE)).map_err(create_err)?;
    if let Some(parent) = path.parent() {
        hami_shared::publish::sync_dir(parent).map_err(InstallHookError::SyncDir)?;
    }
    Ok(true)
}

/// True when `dest` is a regular file (not a symbolic link) with mode `0644` and exactly `bytes`.
fn is_unchanged(dest: &Path, bytes: &[u8]) -> bool {
    let Ok(meta) = fs::symlink_metadata(dest) else {
        return false;
    };
    meta.is_file()
        && meta.permissions().mode() & 0o7777 == PUBLISHED_MODE
        && usize::try_from(meta.len()).is_ok_and(|len| len == bytes.len())
        && fs::read(dest).is_ok_and(|current| current == bytes)
}

/// Carries out `plan`: reads and checks both libraries (nothing is written when either is
/// wrong), creates `HOOK/vgpu` and `HOOK/vgpu/containers`, removes leftover temporary files of
/// an earlier run and a withdrawn `node-gpus`, then installs the files in the plan's order, each
/// atomically; a file already there with the same bytes and mode is left alone.
///
/// On a failure the failing file's temporary file is removed and its previous version stays;
/// files installed before it stay installed (both libraries are installed before
/// `ld.so.preload`, so `ld.so.preload` never names a library that is not there).
pub fn execute(plan: &InstallPlan) -> Result<InstallReport, InstallHookError> {
    // Every input first: nothing is written unless all of them are good.
    let mut contents = Vec::with_capacity(plan.files.len());
    for file in &plan.files {
        let (bytes, from) = match &file.source {
            FileSource::Copy(path) => (read_library(path)?, Some(path.clone())),
            FileSource::Generated(text) => (text.as_bytes().to_vec(), None),
        };
        contents.push((file, bytes, from));
    }
    let mut created_dirs = Vec::new();
    for dir in [&plan.vgpu_dir, &plan.containers_dir] {
        if ensure_dir(dir)? {
            created_dirs.push(dir.clone());
        }
    }
    let removed_temporaries = sweep_temp_files(&plan.vgpu_dir).map_err(InstallHookError::Sweep)?;
    let node_gpus = match &plan.node_gpus {
        NodeGpusPlan::Withdraw { path, reason } => NodeGpusReport::Withdrawn {
            path: path.clone(),
            reason: reason.clone(),
            removed: withdraw_node_gpus(path)?,
        },
        NodeGpusPlan::Publish { path, from, gpus } => NodeGpusReport::Published {
            path: path.clone(),
            from: from.clone(),
            gpus: gpus.gpus().cloned().collect(),
        },
    };
    let mut files = Vec::with_capacity(contents.len());
    for (file, bytes, from) in contents {
        let outcome = if is_unchanged(&file.dest, &bytes) {
            Outcome::Unchanged
        } else {
            install_file(&file.dest, &bytes)?;
            Outcome::Installed
        };
        files.push(InstalledFile {
            path: file.dest.clone(),
            outcome,
            from,
            bytes: bytes.len(),
        });
    }
    Ok(InstallReport {
        files,
        created_dirs,
        removed_temporaries,
        node_gpus,
    })
}

/// Removes the node GPU file at `path` if it is there (a symbolic link in its place included),
/// durably; true when something was removed.
pub fn withdraw_node_gpus(path: &Path) -> Result<bool, InstallHookError> {
    let withdraw_err = |source| InstallHookError::Withdraw {
        path: path.to_path_buf(),
        source,
    };
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(withdraw_err(e)),
    }
    if let Some(dir) = path.parent() {
        hami_shared::publish::sync_dir(dir).map_err(InstallHookError::SyncDir)?;
    }
    Ok(true)
}

fn install_file(dest: &Path, bytes: &[u8]) -> Result<(), InstallHookError> {
    let install_err = |source| InstallHookError::Install {
        path: dest.to_path_buf(),
        source,
    };
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name().and_then(|n| n.to_str())) else {
        return Err(install_err(PublishError::InvalidFileName {
            dir: dest.to_path_buf(),
            name: String::new(),
        }));
    };
    publish_atomic(dir, name, bytes).map_err(install_err)?;
    Ok(())
}

/// `install-hook`: scan, list the GPUs, plan, execute. A plan refused for its GPU list withdraws
/// the node GPU file ([`InstallHookError::node_gpus_to_withdraw`]) and touches nothing else.
pub fn install_hook(args: &InstallHookArgs) -> Result<InstallReport, InstallHookError> {
    // The hook path first: a bad value is reported before anything else is looked at.
    normalise_hook_path(&args.hook_path)?;
    let found = scan_dir(&args.hami_core_dir)?;
    let gpus = list_gpus(args.inventory.as_deref());
    match plan_install(
        &found,
        &args.hami_core_dir,
        &args.preload,
        &args.hook_path,
        gpus,
    ) {
        Ok(plan) => execute(&plan),
        Err(refused) => {
            if let Some(path) = refused.node_gpus_to_withdraw() {
                // The refusal is the error to report; the withdrawal's outcome is logged.
                match withdraw_node_gpus(path) {
                    Ok(true) => tracing::warn!(
                        file = %path.display(),
                        "removed the node GPU file of an earlier run: this run has no GPU list"
                    ),
                    Ok(false) => {}
                    Err(error) => tracing::error!(%error, "stale node GPU file left in place"),
                }
            }
            Err(refused)
        }
    }
}

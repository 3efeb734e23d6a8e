//! The file I/O of `install-hook`: the scan, reading the libraries, and executing a plan (atomic
//! publishes, libraries first and `ld.so.preload` last).

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hami_publish::PUBLISHED_MODE;
use hami_publish::{PublishError, publish_atomic, sweep_temp_files};
use hami_shared::node_gpus::NodeGpu;

use super::{
    DIR_MODE, EntryKind, FileSource, FoundEntry, GpuSource, InstallHookError, InstallPlan,
    NoNodeGpus, NodeGpusPlan, check_library_bytes,
};

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
        hami_publish::sync_dir(parent).map_err(InstallHookError::SyncDir)?;
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
        hami_publish::sync_dir(dir).map_err(InstallHookError::SyncDir)?;
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

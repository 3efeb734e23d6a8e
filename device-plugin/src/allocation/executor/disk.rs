//! What one allocation puts on disk: the per-container directory (recreated, mode 0777) and the
//! limits file (published atomically), and how to take both back when the allocation fails later.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hami_shared::publish::{PublishError, publish_atomic, sweep_temp_files};

use crate::allocation::device_list::CONTROL_DEVICE_NODES;
use crate::allocation::plan::{AllocationPlan, AllocationSettings, HostProbe};

/// Mode of the per-container directory: HAMi-core's shared region (`usage.cache`) and lock files
/// are created there by whatever UID the container's processes run as (HAMi uses 0777 too).
pub const CONTAINER_DIR_MODE: u32 = 0o777;

/// What failed on disk; names the path.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A directory operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Publishing the limits file failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl DiskError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            DiskError::Io { path, .. } => path,
            DiskError::Publish(e) => e.path(),
        }
    }
}

/// What one container's execution put on disk (removed again if the allocation fails later).
#[derive(Debug, Default)]
pub struct Written {
    /// The per-container directory.
    pub dir: Option<PathBuf>,
    /// The limits file.
    pub file: Option<PathBuf>,
}

impl Written {
    /// Removes what was written (best effort; the error that got us here is the one to report).
    pub fn undo(&self) {
        if let Some(file) = &self.file
            && let Err(e) = fs::remove_file(file)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %file.display(), error = %e, "cannot remove limits file of a failed allocation");
        }
        if let Some(dir) = &self.dir
            && let Err(e) = fs::remove_dir_all(dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %dir.display(), error = %e, "cannot remove directory of a failed allocation");
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DiskError + 'a {
    move |source| DiskError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates the plan's directory (recreated, mode 0777) and publishes its limits file atomically
/// (inside a `publish` span). On error, whatever this call created is removed again before
/// returning.
pub fn execute_plan(plan: &AllocationPlan) -> Result<Written, DiskError> {
    let mut written = Written::default();
    let result = (|| {
        let Some(dir) = &plan.container_dir else {
            return Ok(());
        };
        let containers = dir.parent().unwrap_or(dir);
        fs::create_dir_all(containers).map_err(io_err("create directory", containers))?;
        match fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove old directory", dir)(e)),
        }
        fs::create_dir(dir).map_err(io_err("create directory", dir))?;
        written.dir = Some(dir.clone());
        // Explicit chmod: the mode given to mkdir is filtered by the umask.
        fs::set_permissions(dir, fs::Permissions::from_mode(CONTAINER_DIR_MODE))
            .map_err(io_err("chmod 0777", dir))?;
        if let Some(file) = &plan.limits_file {
            let path = tracing::debug_span!("publish")
                .in_scope(|| publish_atomic(&file.dir, &file.file_name, file.text.as_bytes()))?;
            written.file = Some(path);
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(written),
        Err(e) => {
            written.undo();
            Err(e)
        }
    }
}

/// Removes leftover temporary files of an interrupted publication from the containers directory.
pub fn sweep_containers_dir(settings: &AllocationSettings) -> Result<usize, PublishError> {
    let dir = settings.containers_dir();
    if !dir.is_dir() {
        return Ok(0);
    }
    sweep_temp_files(&dir)
}

/// What the answer depends on at the time of the call, as HAMi's `Allocate` stats it: whether
/// `license` (`<hook>/vgpu/license`) exists, and which of the optional device nodes
/// ([`CONTROL_DEVICE_NODES`]) exist where the plugin runs (`os.Stat` in HAMi's `apiDeviceSpecs`:
/// symbolic links followed).
pub fn probe_host(license: &Path) -> HostProbe {
    HostProbe {
        license: fs::metadata(license).is_ok(),
        device_nodes: CONTROL_DEVICE_NODES
            .iter()
            .filter(|p| fs::metadata(p).is_ok())
            .map(|p| (*p).to_owned())
            .collect(),
    }
}

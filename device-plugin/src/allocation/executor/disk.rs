//! What one allocation puts on disk: the per-container directory (recreated, mode 0777) and the
//! limits file (published atomically), and how to take both back when the allocation fails later.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hami_shared::names::VGPU_LOCK_PATH;
use hami_shared::publish::{PublishError, publish_atomic, sweep_temp_files};

use crate::allocation::device_list::CONTROL_DEVICE_NODES;
use crate::allocation::plan::{AllocationPlan, AllocationSettings, HostProbe};

/// Mode of the per-container directory: HAMi-core's shared region (`usage.cache`) and lock files
/// are created there by whatever UID the container's processes run as (HAMi uses 0777 too).
pub const CONTAINER_DIR_MODE: u32 = 0o777;

/// Mode of HAMi-core's lock folder `/tmp/vgpulock` on the host: every container's processes, of
/// any UID, create their lock files there. HAMi v2.10 `plugin/server.go` `Allocate` makes it
/// 0777 on every call (`os.MkdirAll` + `os.Chmod`); a folder containerd creates for the bind
/// mount is root's 0755, where a non-root container cannot lock.
pub const LOCK_DIR_MODE: u32 = 0o777;

/// Creates `dir` (HAMi-core's `/tmp/vgpulock`, the host's: the chart mounts it into the plugin)
/// when missing and makes it mode 0777, as HAMi does.
pub fn ensure_lock_dir(dir: &Path) -> Result<(), DiskError> {
    fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    let mode = fs::metadata(dir)
        .map_err(io_err("stat", dir))?
        .permissions()
        .mode();
    // Explicit chmod (the umask filters mkdir's mode); skipped when already right.
    if mode & 0o7777 != LOCK_DIR_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(LOCK_DIR_MODE))
            .map_err(io_err("chmod 0777", dir))?;
    }
    Ok(())
}

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
        for lock in plan
            .mounts
            .iter()
            .filter(|m| m.container_path == VGPU_LOCK_PATH)
        {
            ensure_lock_dir(Path::new(&lock.host_path))?;
        }
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
        device_nodes: probe_control_nodes(),
    }
}

/// The control device nodes (`/dev/nvidiactl`, …) that exist where the plugin runs.
pub fn probe_control_nodes() -> std::collections::BTreeSet<String> {
    CONTROL_DEVICE_NODES
        .iter()
        .filter(|p| fs::metadata(p).is_ok())
        .map(|p| (*p).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_dir_is_created_and_made_0777_as_hami_does() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = tmp.path().join("vgpulock");
        ensure_lock_dir(&lock).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&lock), 0o777);
        // One containerd made for a bind mount (root's 0755) is opened up.
        fs::set_permissions(&lock, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_lock_dir(&lock).unwrap();
        assert_eq!(mode(&lock), 0o777);
        // A file in the way is an error naming the path.
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        let err = ensure_lock_dir(&file).unwrap_err();
        assert_eq!(err.path(), file);
        assert!(
            err.to_string().starts_with("cannot create directory"),
            "{err}"
        );
    }
}

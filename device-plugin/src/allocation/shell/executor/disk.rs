//! What one allocation puts on disk: the per-container directory (recreated, root's, 0755) with
//! HAMi-core's shared region file `usage.cache` pre-created in it (root's, 0666, empty), the
//! limits file (published atomically), and how to take them back when the allocation fails later.
//! Both folders a container writes into — its own and the host's `/tmp/vgpulock` — are handled
//! through descriptors without following links ([`no_follow`](super::no_follow)).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use hami_publish::{PublishError, publish_atomic, sweep_temp_files};
use hami_shared::names::{USAGE_CACHE_FILE, VGPU_LOCK_FILE, VGPU_LOCK_PATH};

use super::no_follow::{
    NoFollowError, create_dir_at, create_new_file_at, ensure_own_file_at, open_dir, own_and_chmod,
    remove_entry_at,
};
use crate::allocation::plan::device_list::CONTROL_DEVICE_NODES;
use crate::allocation::plan::{AllocationPlan, AllocationSettings, HostProbe};

/// Mode of the per-container directory: root's and not writable by the container's users, so
/// that none of them can replace `usage.cache` (with a link a later root process would follow).
/// HAMi-core creates nothing there once the region file exists: it opens it `O_RDWR|O_CREAT`,
/// and `O_CREAT` on an existing file creates nothing. (HAMi makes it 0777.)
pub const CONTAINER_DIR_MODE: u32 = 0o755;

/// Mode of the pre-created `usage.cache`: what HAMi-core gives the file it creates (`0666` after
/// `umask(0)`), so that processes of every UID in the container map and lock it read-write.
pub const USAGE_CACHE_MODE: u32 = 0o666;

/// Mode of HAMi-core's lock folder `/tmp/vgpulock` on the host: root's, not writable by the
/// containers it is mounted into. HAMi-core (before 2026-02) only opens `/tmp/vgpulock/lock`
/// `O_CREAT|O_RDWR` and `flock`s it; the plugin creates that file, so nobody else needs to create
/// anything there. (HAMi v2.10 `plugin/server.go` makes the folder 0777 on every `Allocate`.)
pub const LOCK_DIR_MODE: u32 = 0o755;

/// Mode of the pre-created `/tmp/vgpulock/lock`: HAMi-core's own (0666 after `umask(0)`), so that
/// containers of any UID can open it read-write.
pub const LOCK_FILE_MODE: u32 = 0o666;

/// Makes HAMi-core's lock folder `dir` (the host's `/tmp/vgpulock`: the chart mounts it into the
/// plugin) a directory of root with mode [`LOCK_DIR_MODE`] holding `lock`, a regular file of
/// root with mode [`LOCK_FILE_MODE`]. Nothing is followed: a symbolic link or anything but a
/// directory at `dir` is refused, the mode and owner are set on the opened folder's descriptor,
/// and whatever else sits at `lock` (a link, another UID's file left by a 0777 folder) is
/// unlinked and the file created anew.
pub fn ensure_lock_dir(dir: &Path) -> Result<(), DiskError> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("create directory", dir)(e)),
    }
    let fd = open_dir(dir)?;
    own_and_chmod(&fd, dir, LOCK_DIR_MODE)?;
    ensure_own_file_at(
        &fd,
        VGPU_LOCK_FILE,
        LOCK_FILE_MODE,
        &dir.join(VGPU_LOCK_FILE),
    )?;
    Ok(())
}

/// Recreates the per-container directory `containers/name`: whatever was there is removed
/// without following links (the container it was mounted into could write it), a new folder of
/// root with mode [`CONTAINER_DIR_MODE`] is made, and `usage.cache` is created in it
/// `O_CREAT|O_EXCL|O_NOFOLLOW`, empty, mode [`USAGE_CACHE_MODE`]: an empty file is what HAMi-core's
/// own `open(O_CREAT)` would leave before it sizes it (`lseek` to the region size, `write` one
/// byte), so HAMi-core initialises it exactly as one it created.
pub fn create_container_dir(containers: &Path, name: &str) -> Result<PathBuf, DiskError> {
    fs::create_dir_all(containers).map_err(io_err("create directory", containers))?;
    let parent = open_dir(containers)?;
    let dir = containers.join(name);
    remove_entry_at(&parent, containers, name)?;
    let made = create_dir_at(&parent, name, CONTAINER_DIR_MODE, &dir).and_then(|fd| {
        create_new_file_at(
            &fd,
            USAGE_CACHE_FILE,
            USAGE_CACHE_MODE,
            &dir.join(USAGE_CACHE_FILE),
        )
    });
    if let Err(e) = made {
        // Not left half made (best effort: the error that got us here is the one to report).
        let _ = remove_entry_at(&parent, containers, name);
        return Err(e.into());
    }
    Ok(dir)
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
    /// A folder a container writes into could not be made safe.
    #[error(transparent)]
    NoFollow(#[from] NoFollowError),
}

impl DiskError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            DiskError::Io { path, .. } => path,
            DiskError::Publish(e) => e.path(),
            DiskError::NoFollow(e) => e.path(),
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

/// Creates the plan's directory ([`create_container_dir`]) and publishes its limits file atomically
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
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| DiskError::Io {
                op: "name the directory",
                path: dir.clone(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "no UTF-8 file name"),
            })?;
        create_container_dir(containers, name)?;
        written.dir = Some(dir.clone());
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
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn assert_own_regular(p: &Path, want: u32) {
        let m = fs::symlink_metadata(p).unwrap();
        assert!(
            m.file_type().is_file(),
            "{} is not a regular file",
            p.display()
        );
        assert_eq!(
            m.uid(),
            rustix::process::geteuid().as_raw(),
            "{}",
            p.display()
        );
        assert_eq!(m.nlink(), 1, "{}", p.display());
        assert_eq!(m.permissions().mode() & 0o7777, want, "{}", p.display());
    }

    /// An outside folder with one file, and how to see that neither changed.
    struct Outside {
        dir: PathBuf,
        file: PathBuf,
    }

    impl Outside {
        fn new(root: &Path) -> Self {
            let dir = root.join("outside");
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
            let file = dir.join("secret");
            fs::write(&file, "keep").unwrap();
            fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
            Self { dir, file }
        }

        fn unchanged(&self) {
            assert_eq!(mode(&self.dir), 0o700);
            assert_eq!(mode(&self.file), 0o600);
            assert_eq!(fs::read_to_string(&self.file).unwrap(), "keep");
            let names: Vec<_> = fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["secret"], "something was created outside");
        }
    }

    #[test]
    fn lock_dir_is_roots_0755_with_a_0666_lock_file() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = tmp.path().join("vgpulock");
        ensure_lock_dir(&lock).unwrap();
        assert_eq!(mode(&lock), LOCK_DIR_MODE);
        assert_own_regular(&lock.join(VGPU_LOCK_FILE), LOCK_FILE_MODE);
        // HAMi's 0777 (or containerd's 0755 with a 0644 file) is set right through the fd;
        // the lock file is kept (its inode is what running processes flock).
        fs::set_permissions(&lock, fs::Permissions::from_mode(0o777)).unwrap();
        fs::set_permissions(lock.join("lock"), fs::Permissions::from_mode(0o644)).unwrap();
        let ino = fs::metadata(lock.join("lock")).unwrap().ino();
        ensure_lock_dir(&lock).unwrap();
        assert_eq!(mode(&lock), LOCK_DIR_MODE);
        assert_own_regular(&lock.join(VGPU_LOCK_FILE), LOCK_FILE_MODE);
        assert_eq!(fs::metadata(lock.join("lock")).unwrap().ino(), ino);
    }

    #[test]
    fn lock_dir_never_follows_a_tenants_link() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = Outside::new(tmp.path());
        let lock = tmp.path().join("vgpulock");
        fs::create_dir(&lock).unwrap();
        let file = lock.join(VGPU_LOCK_FILE);
        // `lock` a link to an outside file, to a missing outside file, to an outside folder:
        // replaced by our own file; nothing outside created or chmod'ed.
        for target in [
            outside.file.clone(),
            outside.dir.join("created"),
            outside.dir.clone(),
        ] {
            symlink(&target, &file).unwrap();
            ensure_lock_dir(&lock).unwrap();
            assert_own_regular(&file, LOCK_FILE_MODE);
            outside.unchanged();
            fs::remove_file(&file).unwrap();
        }
        // A hard link to an outside file: unlinked, never chmod'ed through.
        fs::hard_link(&outside.file, &file).unwrap();
        ensure_lock_dir(&lock).unwrap();
        assert_own_regular(&file, LOCK_FILE_MODE);
        outside.unchanged();
        // A FIFO: replaced, no open that could block.
        fs::remove_file(&file).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &file,
            rustix::fs::Mode::from_raw_mode(0o666),
        )
        .unwrap();
        ensure_lock_dir(&lock).unwrap();
        assert_own_regular(&file, LOCK_FILE_MODE);
        // A directory at `lock` is not ours to remove: refused, named.
        fs::remove_file(&file).unwrap();
        fs::create_dir(&file).unwrap();
        let err = ensure_lock_dir(&lock).unwrap_err();
        assert_eq!(err.path(), file);
        assert!(err.to_string().contains("it is a directory"), "{err}");
    }

    #[test]
    fn lock_dir_that_is_a_link_or_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = Outside::new(tmp.path());
        let lock = tmp.path().join("vgpulock");
        symlink(&outside.dir, &lock).unwrap();
        let err = ensure_lock_dir(&lock).unwrap_err();
        assert_eq!(err.path(), lock);
        assert!(
            err.to_string().starts_with(&format!(
                "refusing {}: it is a symbolic link",
                lock.display()
            )),
            "{err}"
        );
        outside.unchanged();
        // A link to a missing folder: not created through the link either.
        fs::remove_file(&lock).unwrap();
        symlink(tmp.path().join("missing"), &lock).unwrap();
        assert!(ensure_lock_dir(&lock).is_err());
        assert!(!tmp.path().join("missing").exists());
        // A file in the way.
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        let err = ensure_lock_dir(&file).unwrap_err();
        assert_eq!(err.path(), file);
        assert!(err.to_string().contains("it is a regular file"), "{err}");
    }

    const NAME: &str = "0b5e6f3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b_main";

    #[test]
    fn container_dir_is_new_roots_0755_with_an_empty_0666_usage_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let containers = tmp.path().join("vgpu/containers");
        let dir = create_container_dir(&containers, NAME).unwrap();
        assert_eq!(dir, containers.join(NAME));
        assert_eq!(mode(&dir), CONTAINER_DIR_MODE);
        let cache = dir.join(USAGE_CACHE_FILE);
        assert_own_regular(&cache, USAGE_CACHE_MODE);
        assert_eq!(fs::metadata(&cache).unwrap().len(), 0);
        // A fresh folder per allocation: the old region (first writer wins) goes with it.
        fs::write(&cache, "old region").unwrap();
        fs::write(dir.join("libvgpu.so"), "").unwrap();
        create_container_dir(&containers, NAME).unwrap();
        assert_eq!(fs::metadata(&cache).unwrap().len(), 0);
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [USAGE_CACHE_FILE]);
    }

    #[test]
    fn container_dir_never_follows_a_tenants_link() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = Outside::new(tmp.path());
        let containers = tmp.path().join("containers");
        let dir = create_container_dir(&containers, NAME).unwrap();
        let cache = dir.join(USAGE_CACHE_FILE);
        // What a user could plant in the 0777 folders of before: usage.cache a link to an
        // outside file (or to a missing one, which open(O_CREAT) would create), a link to an
        // outside folder beside it, a hard link.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        fs::remove_file(&cache).unwrap();
        symlink(outside.dir.join("created"), &cache).unwrap();
        symlink(&outside.dir, dir.join("escape")).unwrap();
        fs::hard_link(&outside.file, dir.join("hard")).unwrap();
        create_container_dir(&containers, NAME).unwrap();
        outside.unchanged();
        assert_eq!(mode(&dir), CONTAINER_DIR_MODE);
        assert_own_regular(&cache, USAGE_CACHE_MODE);
        // The folder itself replaced by a link to an outside folder: the link is removed, the
        // outside folder is neither emptied nor chmod'ed, a real folder is made.
        fs::remove_dir_all(&dir).unwrap();
        symlink(&outside.dir, &dir).unwrap();
        create_container_dir(&containers, NAME).unwrap();
        outside.unchanged();
        assert!(fs::symlink_metadata(&dir).unwrap().is_dir());
        assert_own_regular(&cache, USAGE_CACHE_MODE);
        // The containers folder a link: refused, nothing made through it.
        let linked = tmp.path().join("linked");
        symlink(&outside.dir, &linked).unwrap();
        let err = create_container_dir(&linked, NAME).unwrap_err();
        assert_eq!(err.path(), linked);
        outside.unchanged();
    }
}

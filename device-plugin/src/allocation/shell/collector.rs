//! The collector: periodically removes the per-container directories `<podUID>_<ctr>` and limits
//! files `<podUID>_<ctr>.limits` under `<HOOK_PATH>/vgpu/containers/` whose pod no longer exists
//! on this node and that are older than a grace period. A name that does not match the pattern
//! (a UUID, `_`, a DNS-1123 label, optionally `.limits`) is never touched. HAMi's vGPU monitor
//! deletes dead pods' directories but skips plain files, so without this the `.limits` files
//! would stay forever.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use hami_shared::names::LIMITS_FILE_SUFFIX;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use hami_shared::container::{is_dns1123_label, is_uuid};

/// Collector settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectorSettings {
    /// Time between two passes (default 60 s).
    pub interval: Duration,
    /// Minimum age (modification time) of an entry before it may be removed (default 5 min):
    /// a file published for a pod that the API server does not list yet is never collected.
    pub grace: Duration,
}

impl Default for CollectorSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            grace: Duration::from_secs(300),
        }
    }
}

/// What an entry of the containers directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// `<podUID>_<ctr>`, a directory.
    Directory,
    /// `<podUID>_<ctr>.limits`, a regular file.
    LimitsFile,
}

/// The pod UID and kind of a collectable name, or `None` for any other name. A directory must
/// not end in `.limits` and a file must; symlinks and other types are never collected.
pub fn parse_entry_name(name: &str, is_dir: bool, is_file: bool) -> Option<(&str, EntryKind)> {
    let (stem, kind) = match name.strip_suffix(LIMITS_FILE_SUFFIX) {
        Some(stem) if is_file => (stem, EntryKind::LimitsFile),
        None if is_dir => (name, EntryKind::Directory),
        _ => return None,
    };
    // UUIDs contain no `_` and labels contain none: split at the only one.
    let (uid, container) = stem.split_once('_')?;
    (is_uuid(uid) && is_dns1123_label(container)).then_some((uid, kind))
}

/// One entry seen in the containers directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenEntry {
    /// File name.
    pub name: String,
    /// Directory or regular file.
    pub is_dir: bool,
    /// Regular file.
    pub is_file: bool,
    /// Age since its last modification.
    pub age: Duration,
}

/// The pure decision: which entries to remove, given the UIDs of the pods on this node.
pub fn select_garbage<'a>(
    entries: &'a [SeenEntry],
    live_pod_uids: &HashSet<String>,
    grace: Duration,
) -> Vec<(&'a SeenEntry, EntryKind)> {
    entries
        .iter()
        .filter_map(|e| {
            let (uid, kind) = parse_entry_name(&e.name, e.is_dir, e.is_file)?;
            (!live_pod_uids.contains(uid) && e.age >= grace).then_some((e, kind))
        })
        .collect()
}

/// Counters of the collector.
#[derive(Debug, Default)]
pub struct CollectorStats {
    /// Directories removed since start.
    pub directories_removed: AtomicU64,
    /// Limits files removed since start.
    pub files_removed: AtomicU64,
    /// Passes completed.
    pub passes: AtomicU64,
    /// Passes skipped because the pod list or the directory could not be read.
    pub failed_passes: AtomicU64,
}

/// Outcome of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Directories removed.
    pub directories: usize,
    /// Limits files removed.
    pub files: usize,
    /// Entries that matched but could not be removed.
    pub errors: usize,
}

/// Why a pass was skipped (nothing is removed when the live pods are unknown).
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// Listing the node's pods failed.
    #[error("cannot list the pods of node {node}: {source}")]
    ListPods {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Listing the directory failed.
    #[error("cannot list {path}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Reads the containers directory (a missing directory is empty).
pub fn scan(dir: &Path, now: SystemTime) -> Result<Vec<SeenEntry>, CollectError> {
    let read_err = |source| CollectError::ReadDir {
        path: dir.to_path_buf(),
        source,
    };
    let iter = match fs::read_dir(dir) {
        Ok(iter) => iter,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_err(e)),
    };
    let mut out = Vec::new();
    for entry in iter {
        let entry = entry.map_err(read_err)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // symlink_metadata: a symlink is neither a directory nor a file here.
        let Ok(meta) = fs::symlink_metadata(entry.path()) else {
            continue;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::ZERO);
        out.push(SeenEntry {
            name,
            is_dir: meta.is_dir(),
            is_file: meta.is_file(),
            age,
        });
    }
    Ok(out)
}

/// Removes the selected entries of `dir`.
pub fn remove_garbage(
    dir: &Path,
    entries: &[SeenEntry],
    live_pod_uids: &HashSet<String>,
    grace: Duration,
) -> PassReport {
    let mut report = PassReport::default();
    for (entry, kind) in select_garbage(entries, live_pod_uids, grace) {
        let path = dir.join(&entry.name);
        let result = match kind {
            // The folder was mounted read-write in a container: whatever links its processes
            // left in it are removed as links, never followed. std's remove_dir_all guarantees
            // it on Linux (openat(O_NOFOLLOW) and unlinkat under the folder's descriptor, the
            // CVE-2022-21658 fix); `containers/` itself is root's.
            EntryKind::Directory => fs::remove_dir_all(&path),
            EntryKind::LimitsFile => fs::remove_file(&path),
        };
        match result {
            Ok(()) => {
                tracing::info!(path = %path.display(), "collected the files of a pod that no longer exists");
                match kind {
                    EntryKind::Directory => report.directories += 1,
                    EntryKind::LimitsFile => report.files += 1,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot remove");
                report.errors += 1;
            }
        }
    }
    report
}

/// The collector of one node.
#[derive(Clone)]
pub struct Collector {
    client: kube::Client,
    node_name: String,
    dir: PathBuf,
    settings: CollectorSettings,
    stats: Arc<CollectorStats>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("node_name", &self.node_name)
            .field("dir", &self.dir)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Collector {
    /// A collector of `dir` (`<hook>/vgpu/containers`) for `node_name`.
    pub fn new(
        client: kube::Client,
        node_name: impl Into<String>,
        dir: impl Into<PathBuf>,
        settings: CollectorSettings,
    ) -> Self {
        Self {
            client,
            node_name: node_name.into(),
            dir: dir.into(),
            settings,
            stats: Arc::default(),
            metrics: Arc::default(),
        }
    }

    /// Reports passes, removals and errors to `metrics` as well as to [`Self::stats`].
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The counters.
    pub fn stats(&self) -> Arc<CollectorStats> {
        Arc::clone(&self.stats)
    }

    /// One pass: list the node's pods, then remove dead pods' entries older than the grace.
    pub async fn collect_once(&self) -> Result<PassReport, CollectError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node_name)))
            .await
            .map_err(|source| CollectError::ListPods {
                node: self.node_name.clone(),
                source,
            })?;
        let live: HashSet<String> = list
            .items
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect();
        // Scan after listing: an entry created after the list is younger than the grace anyway.
        let entries = scan(&self.dir, SystemTime::now())?;
        let report = remove_garbage(&self.dir, &entries, &live, self.settings.grace);
        self.stats
            .directories_removed
            .fetch_add(report.directories as u64, Ordering::Relaxed);
        self.stats
            .files_removed
            .fetch_add(report.files as u64, Ordering::Relaxed);
        self.stats.passes.fetch_add(1, Ordering::Relaxed);
        self.metrics.observe_collector_pass(
            report.directories as u64,
            report.files as u64,
            report.errors as u64,
        );
        if report.directories + report.files > 0 {
            tracing::info!(
                directories = report.directories,
                files = report.files,
                errors = report.errors,
                "collector pass"
            );
        }
        Ok(report)
    }

    /// Runs a pass every `interval` until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            // A pass waits on the API server: the stop must not wait for it.
            let pass = tokio::select! {
                () = &mut shutdown => return,
                pass = self.collect_once() => pass,
            };
            if let Err(error) = pass {
                self.stats.failed_passes.fetch_add(1, Ordering::Relaxed);
                self.metrics.observe_collector_failure();
                tracing::warn!(%error, "collector pass skipped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b5e6f3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
    const UID2: &str = "11111111-2222-3333-4444-555555555555";

    fn e(name: &str, is_dir: bool, age: u64) -> SeenEntry {
        SeenEntry {
            name: name.into(),
            is_dir,
            is_file: !is_dir,
            age: Duration::from_secs(age),
        }
    }

    #[test]
    fn only_pattern_names_are_collectable() {
        assert_eq!(
            parse_entry_name(&format!("{UID}_main"), true, false),
            Some((UID, EntryKind::Directory))
        );
        assert_eq!(
            parse_entry_name(&format!("{UID}_main.limits"), false, true),
            Some((UID, EntryKind::LimitsFile))
        );
        for (name, dir) in [
            (format!("{UID}_main.limits"), true),
            (format!("{UID}_main"), false),
            (format!("{UID}_Main"), true),
            (format!("{UID}_"), true),
            (format!("{UID}main"), true),
            ("not-a-uid_main".to_owned(), true),
            (format!(".{UID}_main.limits.hami-tmp.1.2.3"), false),
            ("usage.cache".to_owned(), false),
            (format!("{UID}_a_b"), true),
        ] {
            assert_eq!(parse_entry_name(&name, dir, !dir), None, "{name}");
        }
        // Neither a directory nor a file (a symlink): never.
        assert_eq!(parse_entry_name(&format!("{UID}_main"), false, false), None);
    }

    #[test]
    fn dead_and_old_only() {
        let entries = vec![
            e(&format!("{UID}_main"), true, 600),
            e(&format!("{UID}_main.limits"), false, 600),
            e(&format!("{UID2}_main"), true, 600),
            e(&format!("{UID2}_main.limits"), false, 10),
            e("random", true, 99999),
        ];
        let live: HashSet<String> = [UID.to_owned()].into();
        let chosen: Vec<&str> = select_garbage(&entries, &live, Duration::from_secs(300))
            .into_iter()
            .map(|(e, _)| e.name.as_str())
            .collect();
        assert_eq!(chosen, [format!("{UID2}_main")]);
    }

    #[test]
    fn removes_on_disk_and_counts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::create_dir(dir.join(format!("{UID2}_main"))).unwrap();
        fs::write(dir.join(format!("{UID2}_main/usage.cache")), "x").unwrap();
        fs::write(dir.join(format!("{UID2}_main.limits")), "x").unwrap();
        fs::write(dir.join(format!("{UID}_main.limits")), "x").unwrap();
        fs::write(dir.join("keep.txt"), "x").unwrap();
        let entries = scan(dir, SystemTime::now() + Duration::from_secs(3600)).unwrap();
        let live: HashSet<String> = [UID.to_owned()].into();
        let report = remove_garbage(dir, &entries, &live, Duration::from_secs(300));
        assert_eq!(
            report,
            PassReport {
                directories: 1,
                files: 1,
                errors: 0
            }
        );
        let mut left: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [format!("{UID}_main.limits"), "keep.txt".to_owned()]);
        // Young entries stay.
        let entries = scan(dir, SystemTime::now()).unwrap();
        let report = remove_garbage(dir, &entries, &HashSet::new(), Duration::from_secs(300));
        assert_eq!(report, PassReport::default());
        assert!(
            scan(&dir.join("missing"), SystemTime::now())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn removal_never_follows_a_containers_links() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("secret"), "keep").unwrap();
        fs::write(outside.join("sub/deep"), "keep").unwrap();
        let dir = tmp.path().join("containers");
        let dead = dir.join(format!("{UID2}_main"));
        fs::create_dir_all(dead.join("nested")).unwrap();
        // What a container's processes could leave in their (once 0777) folder.
        symlink(outside.join("secret"), dead.join("usage.cache")).unwrap();
        symlink(&outside, dead.join("escape")).unwrap();
        symlink(outside.join("sub"), dead.join("nested/escape")).unwrap();
        symlink("/", dead.join("root")).unwrap();
        fs::set_permissions(dead.join("nested"), fs::Permissions::from_mode(0o777)).unwrap();
        // A dead pod's name that is a link (to the outside folder): never collected.
        symlink(&outside, dir.join(format!("{UID2}_other"))).unwrap();
        let entries = scan(&dir, SystemTime::now() + Duration::from_secs(3600)).unwrap();
        let report = remove_garbage(&dir, &entries, &HashSet::new(), Duration::from_secs(300));
        assert_eq!(
            report,
            PassReport {
                directories: 1,
                files: 0,
                errors: 0
            }
        );
        assert!(!dead.exists());
        assert_eq!(fs::read_to_string(outside.join("secret")).unwrap(), "keep");
        assert_eq!(
            fs::read_to_string(outside.join("sub/deep")).unwrap(),
            "keep"
        );
        assert!(
            fs::symlink_metadata(dir.join(format!("{UID2}_other")))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
}

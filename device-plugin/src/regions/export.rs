//! The shell around [`super::observe`]: lists the node's container folders, reads their region
//! and limits files (bounded, never following a link), keeps the last samples, and exposes them
//! as Prometheus metrics ([`RegionCollector`]). It scans on a timer ([`RegionExporter::run`]),
//! and on a scrape when the last scan is older than `scrape_min_age` — that scan reads at most
//! `scrape_files` folders within `scrape_budget`, continuing where the previous bounded scan
//! stopped, and a scrape never waits for a scan already running: it is answered from the last
//! samples.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use hami_shared::region::{Liveness, ProcSlot, Verdict, read_limits_bytes, read_region_bytes};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use super::observe::{CapEvent, ContainerSample, EventKey, FolderRead, Owner, observe};

/// The metric name prefix on every node kind (HAMi nodes: the device plugin; KAI nodes:
/// `serve-preload`), so that one alert covers both.
pub const PREFIX: &str = "hami_limits_region";

/// One container folder on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    /// Its name (the key of [`FolderSource::owners`]).
    pub name: String,
    /// Its region file.
    pub region: PathBuf,
    /// Its limits file, where the node has one for it.
    pub limits: Option<LimitsAt>,
}

/// Where a folder's limits file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitsAt {
    /// A file on the node (HAMi: published by the device plugin beside the folder).
    File(PathBuf),
    /// Its text, as the API server holds it (KAI: the pod's `limits.hami.io/<container>`
    /// annotation, which kubelet projects at `/overrideEnv`).
    Text(String),
}

/// Where the folders are and whose they are: the device plugin's `<HOOK>/vgpu/containers`
/// and its pod cache, or `serve-preload`'s slot folders and kubelet's pod-resources.
pub trait FolderSource: Send + Sync {
    /// The folders, sorted by name.
    ///
    /// # Errors
    /// The folder holding them cannot be listed.
    fn folders(&self) -> io::Result<Vec<Folder>>;
    /// Folder name → owner for `folders`, as the node knows its pods now. A folder absent from
    /// it is not exported.
    fn owners(&self, folders: &[Folder]) -> BTreeMap<String, Owner>;
    /// The node GPU file's UUID → MiB (KAI `gpu-fraction` caps); empty where there is none.
    fn node_gpu_mib(&self) -> BTreeMap<String, u64> {
        BTreeMap::new()
    }
}

/// Whose PIDs a slot's `hostpid` can be checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PidView {
    /// Not checked (the default: the plugin does not share the node's PID namespace, so it
    /// cannot tell; no `stale` verdict).
    #[default]
    None,
    /// `/proc/<hostpid>` in this PID namespace: only with `hostPID: true`.
    Host,
}

/// How the exporter scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportSettings {
    /// Time between two timer scans (every folder).
    pub interval: Duration,
    /// The most folders a scrape reads.
    pub scrape_files: usize,
    /// The most time a scrape spends reading.
    pub scrape_budget: Duration,
    /// A scrape scans only when the last scan is older than this.
    pub scrape_min_age: Duration,
    /// Slot liveness.
    pub pids: PidView,
}

impl Default for ExportSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            scrape_files: 32,
            scrape_budget: Duration::from_millis(500),
            scrape_min_age: Duration::from_secs(5),
            pids: PidView::None,
        }
    }
}

/// What a scan may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanBound {
    /// The most folders read.
    pub files: usize,
    /// The most time spent reading (checked before each folder).
    pub budget: Duration,
}

/// What one scan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Folders listed.
    pub listed: usize,
    /// Folders read.
    pub read: usize,
    /// Stopped by its bound before reading every folder.
    pub truncated: bool,
    /// Events raised.
    pub events: usize,
}

#[derive(Debug, Default)]
struct State {
    /// The last sample of each owned folder, by folder name.
    samples: BTreeMap<String, ContainerSample>,
    /// Events already raised.
    reported: BTreeSet<EventKey>,
    /// Where the next bounded scan starts.
    cursor: usize,
    /// When the last scan ended.
    last_scan: Option<Instant>,
    /// The same, as Unix seconds (exported).
    last_scan_unix: f64,
    /// Listed folders no pod owns.
    unowned: usize,
    /// Scans stopped by their bound.
    truncated: u64,
    /// Scans that could not list the folder.
    list_errors: u64,
}

/// The node's region exporter: the last samples, and the scans that refresh them.
pub struct RegionExporter {
    source: Arc<dyn FolderSource>,
    settings: ExportSettings,
    state: Mutex<State>,
    /// Held while a scan reads: a second scan (a scrape during a timer scan) does not start.
    scanning: Mutex<()>,
    events: Option<mpsc::UnboundedSender<CapEvent>>,
    /// The `node` label.
    node: String,
}

impl std::fmt::Debug for RegionExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionExporter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn liveness(view: PidView) -> impl Fn(&ProcSlot) -> Liveness {
    move |slot| {
        if view == PidView::None || slot.hostpid <= 0 {
            return Liveness::Unknown;
        }
        match std::fs::symlink_metadata(format!("/proc/{}", slot.hostpid)) {
            Ok(_) => Liveness::Alive,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Liveness::Dead,
            Err(_) => Liveness::Unknown,
        }
    }
}

/// Reads one folder's files as [`observe`] takes them.
fn read_folder(folder: &Folder) -> FolderRead {
    let limits = match &folder.limits {
        None => Ok(None),
        Some(LimitsAt::File(path)) => read_limits_bytes(path).map_err(|e| e.to_string()),
        Some(LimitsAt::Text(text)) => Ok(Some(text.as_bytes().to_vec())),
    };
    FolderRead {
        folder: folder.name.clone(),
        region_path: folder.region.clone(),
        region: read_region_bytes(&folder.region),
        limits,
    }
}

impl RegionExporter {
    /// An exporter of `node`'s folders from `source`; Events go to `events` (none: logged only).
    pub fn new(
        node: &str,
        source: Arc<dyn FolderSource>,
        settings: ExportSettings,
        events: Option<mpsc::UnboundedSender<CapEvent>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            node: node.to_owned(),
            source,
            settings,
            state: Mutex::new(State::default()),
            scanning: Mutex::new(()),
            events,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One scan: every folder (`bound` `None`), or at most what `bound` allows from where the
    /// last bounded scan stopped. `None` when another scan is running (nothing is waited for).
    pub fn scan(&self, bound: Option<ScanBound>) -> Option<ScanReport> {
        let _scanning = match self.scanning.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let folders = match self.source.folders() {
            Ok(f) => f,
            Err(error) => {
                tracing::warn!(%error, "region exporter: cannot list the container folders");
                let mut state = self.state();
                state.list_errors += 1;
                state.last_scan = Some(Instant::now());
                return Some(ScanReport::default());
            }
        };
        let owners = self.source.owners(&folders);
        let start = if bound.is_some() {
            self.state().cursor % folders.len().max(1)
        } else {
            0
        };
        let began = Instant::now();
        let mut reads = Vec::new();
        for folder in folders.iter().cycle().skip(start).take(folders.len()) {
            if let Some(b) = bound
                && (reads.len() >= b.files || began.elapsed() >= b.budget)
            {
                break;
            }
            // A folder no pod owns is not read at all.
            if !owners.contains_key(&folder.name) {
                reads.push(None);
                continue;
            }
            reads.push(Some(read_folder(folder)));
        }
        let visited = reads.len();
        let reads: Vec<FolderRead> = reads.into_iter().flatten().collect();
        let node_gpu_mib = self.source.node_gpu_mib();
        let alive = liveness(self.settings.pids);
        let mut state = self.state();
        let observed = observe(&reads, &owners, &node_gpu_mib, &alive, &state.reported);
        let listed: BTreeSet<&str> = folders.iter().map(|f| f.name.as_str()).collect();
        // Keep only folders still there and still owned by the same container.
        state
            .samples
            .retain(|name, s| listed.contains(name.as_str()) && owners.get(name) == Some(&s.owner));
        for sample in observed.containers {
            state.samples.insert(sample.folder.clone(), sample);
        }
        let owned: BTreeSet<&Owner> = owners.values().collect();
        state.reported.retain(|k| owned.contains(&k.owner));
        for event in &observed.events {
            state.reported.insert(event.key.clone());
        }
        state.unowned = folders
            .iter()
            .filter(|f| !owners.contains_key(&f.name))
            .count();
        state.cursor = (start + visited) % folders.len().max(1);
        let truncated = visited < folders.len();
        if truncated {
            state.truncated += 1;
        }
        state.last_scan = Some(Instant::now());
        state.last_scan_unix = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        drop(state);
        let report = ScanReport {
            listed: folders.len(),
            read: reads.len(),
            truncated,
            events: observed.events.len(),
        };
        for event in observed.events {
            tracing::warn!(
                namespace = %event.key.owner.namespace,
                pod = %event.key.owner.pod,
                container = %event.key.owner.container,
                verdict = %event.key.verdict,
                reason = event.reason,
                "{}",
                event.message
            );
            if let Some(tx) = &self.events {
                let _ = tx.send(event);
            }
        }
        Some(report)
    }

    /// The scan a scrape makes: bounded, and only when the last scan is older than
    /// `scrape_min_age`.
    pub fn scan_for_scrape(&self) {
        let fresh = self
            .state()
            .last_scan
            .is_some_and(|t| t.elapsed() < self.settings.scrape_min_age);
        if fresh {
            return;
        }
        let bound = ScanBound {
            files: self.settings.scrape_files,
            budget: self.settings.scrape_budget,
        };
        // The files are read on this thread: let a multi-threaded runtime move its other tasks.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| self.scan(Some(bound)));
            }
            _ => {
                self.scan(Some(bound));
            }
        }
    }

    /// Scans every `interval` (the first at once) until `stop` completes; each scan on a
    /// blocking thread. `before_scan` runs first each time (KAI nodes refresh their slot owners).
    pub async fn run<F, Fut>(
        self: Arc<Self>,
        mut before_scan: F,
        stop: impl std::future::Future<Output = ()>,
    ) where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = tick.tick() => {}
            }
            before_scan().await;
            let me = Arc::clone(&self);
            match tokio::task::spawn_blocking(move || me.scan(None)).await {
                Ok(Some(report)) => tracing::debug!(
                    listed = report.listed,
                    read = report.read,
                    events = report.events,
                    "region scan"
                ),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "region scan failed"),
            }
        }
    }

    /// The last samples, by folder.
    pub fn samples(&self) -> Vec<ContainerSample> {
        self.state().samples.values().cloned().collect()
    }

    /// A registry (prefix `hami_limits_region`) holding this exporter's collector.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(RegionCollector(Arc::clone(self))));
        registry
    }
}

/// The Prometheus collector: a bounded scan when the samples are old, then the samples.
#[derive(Debug)]
pub struct RegionCollector(pub Arc<RegionExporter>);

type Labels = Vec<(&'static str, String)>;

/// The labels naming a container: HAMi's vGPU monitor's names (`podnamespace`, `podname`,
/// `ctrname`), which a scrape's own `namespace`, `pod` and `container` target labels do not
/// rename, and the node.
fn owner_labels(node: &str, o: &Owner) -> Labels {
    vec![
        ("node", node.to_owned()),
        ("podnamespace", o.namespace.clone()),
        ("podname", o.pod.clone()),
        ("ctrname", o.container.clone()),
    ]
}

fn with_gpu(mut labels: Labels, gpu: Option<usize>) -> Labels {
    labels.push(("gpu", gpu.map_or_else(String::new, |g| g.to_string())));
    labels
}

/// One gauge family: `rows` of (labels, value).
fn gauge_family<T>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, T)],
) -> Result<(), std::fmt::Error>
where
    T: prometheus_client::encoding::EncodeGaugeValue + Copy + std::fmt::Debug,
    ConstGauge<T>: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// The metric rows of `samples` (pure; [`RegionCollector`] encodes them).
#[derive(Debug, Default, PartialEq)]
pub struct Rows {
    /// `cap_verdict`.
    pub verdict: Vec<(Labels, i64)>,
    /// `stamped_limit_bytes`.
    pub stamped: Vec<(Labels, u64)>,
    /// `file_limit_bytes`.
    pub file: Vec<(Labels, u64)>,
    /// `used_bytes`.
    pub used: Vec<(Labels, u64)>,
    /// `processes`.
    pub processes: Vec<(Labels, u64)>,
    /// `stamped_sm_limit_percent`.
    pub sm: Vec<(Labels, u64)>,
}

/// The rows of every sample: per container and GPU (`gpu` empty for a container without a
/// readable region: `no-region`, `unreadable`).
#[must_use]
pub fn rows(node: &str, samples: &[ContainerSample]) -> Rows {
    let mut rows = Rows::default();
    for s in samples {
        let base = owner_labels(node, &s.owner);
        let verdict_row = |gpu: Option<usize>, v: Verdict| {
            let mut l = with_gpu(base.clone(), gpu);
            l.push(("verdict", v.as_str().to_owned()));
            (l, 1)
        };
        if s.verdict.gpus.is_empty() {
            rows.verdict.push(verdict_row(None, s.verdict.verdict));
            continue;
        }
        for g in &s.verdict.gpus {
            let l = with_gpu(base.clone(), Some(g.index));
            rows.verdict.push(verdict_row(Some(g.index), g.verdict));
            rows.stamped.push((l.clone(), g.stamped_limit));
            if let Some(f) = g.file_limit {
                rows.file.push((l.clone(), f));
            }
            rows.used.push((l.clone(), g.used));
            rows.processes
                .push((l.clone(), u64::try_from(g.processes).unwrap_or(u64::MAX)));
            rows.sm.push((l, g.stamped_sm));
        }
    }
    rows
}

impl Collector for RegionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.scan_for_scrape();
        let samples = self.0.samples();
        let r = rows(&self.0.node, &samples);
        let e = &mut encoder;
        gauge_family(
            e,
            "cap_verdict",
            "Is the GPU cap in force: 1 for the verdict of each container and GPU (capped, uncapped, mismatch, no-region, stale, unreadable, no-limit); gpu is empty when the container has no readable region",
            &r.verdict,
        )?;
        gauge_family(
            e,
            "stamped_limit_bytes",
            "The memory limit stamped in the container's shared region (what HAMi-core enforces), bytes; 0 = none",
            &r.stamped,
        )?;
        gauge_family(
            e,
            "file_limit_bytes",
            "The memory limit the container's limits file asks HAMi-core to stamp, bytes; 0 = none",
            &r.file,
        )?;
        gauge_family(
            e,
            "used_bytes",
            "GPU memory the container's processes use, as HAMi-core counts it in the region, bytes",
            &r.used,
        )?;
        gauge_family(
            e,
            "processes",
            "Processes of the container with usage on the GPU, as the region's slots say",
            &r.processes,
        )?;
        gauge_family(
            e,
            "stamped_sm_limit_percent",
            "The SM limit stamped in the container's shared region, percent (100 = none)",
            &r.sm,
        )?;
        let state = self.0.state();
        gauge_family(
            e,
            "unowned_folders",
            "Container folders on the node that no current container owns (not exported)",
            &[(Vec::new(), state.unowned as u64)],
        )?;
        gauge_family(
            e,
            "last_scan_timestamp_seconds",
            "When the last scan of the node's regions ended, Unix seconds",
            &[(Vec::new(), state.last_scan_unix)],
        )?;
        for (name, help, value) in [
            (
                "truncated_scans",
                "Scans stopped by their file or time bound before reading every folder",
                state.truncated,
            ),
            (
                "list_errors",
                "Scans that could not list the container folders",
                state.list_errors,
            ),
        ] {
            let metric = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(metric)?;
        }
        Ok(())
    }
}

/// `--region-interval` is not a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("--region-interval={0}: not a number of seconds (0 turns the exporter off)")]
pub struct RegionIntervalError(pub f64);

/// The region exporter's settings as `run` and `serve-preload` are given them.
#[derive(Debug, Clone)]
pub struct RegionArgs {
    /// Seconds between two scans of the node's container regions (every folder); 0 turns the
    /// region exporter off.
    pub interval: f64,
    /// The most container folders one scrape reads (when the last scan is over 5 s old).
    pub scrape_files: usize,
    /// The most milliseconds one scrape spends reading regions.
    pub scrape_budget_ms: u64,
    /// Whose PIDs a region's slots are checked against for the `stale` verdict: `none`, or
    /// `host` (`/proc/<hostpid>`; only with `hostPID: true`).
    pub pids: PidView,
}

impl RegionArgs {
    /// The settings, or `None` when the exporter is off (`--region-interval=0`).
    ///
    /// # Errors
    /// An interval that is negative or not a number.
    pub fn settings(&self) -> Result<Option<ExportSettings>, RegionIntervalError> {
        if self.interval == 0.0 {
            return Ok(None);
        }
        let interval = Duration::try_from_secs_f64(self.interval)
            .map_err(|_| RegionIntervalError(self.interval))?;
        Ok(Some(ExportSettings {
            interval,
            scrape_files: self.scrape_files,
            scrape_budget: Duration::from_millis(self.scrape_budget_ms),
            pids: self.pids,
            ..ExportSettings::default()
        }))
    }
}

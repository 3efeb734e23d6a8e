//! The executor: the thin I/O around [`super::plan`]. For each `Allocate` call:
//!
//! 1. **under a node-wide lock, in memory only**: find the pod ([`super::locator`]; from the
//!    watch-fed [`PodCache`] when it holds it, else from the API server), decode its devices
//!    ([`super::codec`]), plan each requested container (pure), and *claim* the pod: the cache
//!    shows the selected entries erased, so the next call passes over them, and a call that
//!    finds the same pod (its next container) waits until this claim has settled;
//! 2. **outside the lock**, so that concurrent calls overlap their fsyncs and round trips:
//!    recreate each per-container directory and publish its limits file atomically (on a
//!    blocking thread) while the node lock `hami.io/mutex.lock` is read (one node GET). HAMi's
//!    rule holds: when the lock names another pod than the one selected, the files are removed
//!    and the selection redone knowing the lock. Then one merge patch erases the entries from
//!    `hami.io/vgpu-devices-to-allocate` — adding `hami.io/bind-phase: success` when no NVIDIA
//!    entry is left — and carries the pod's `resourceVersion`, so the API server accepts it only
//!    if the pod read was current: a stale cache can never cause a wrong allocation. On 409 (or
//!    404) the files are removed, the claim dropped, the pod read again from the API server and
//!    the allocation redone (at most [`MAX_SELECT_ATTEMPTS`] times). Then the node lock is
//!    released (only if it still names this pod).
//!
//! Any other failure after the pod is found fails the allocation: gRPC error, `hami.io/bind-phase:
//! failed`, node lock released, an Event on the pod naming the path and the error, and nothing
//! from this call left on disk. The pod is never marked `success` before its files are durable.

use crate::metrics::AllocateOutcome;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hami_shared::names::{
    ANNOTATION_BIND_PHASE, ANNOTATION_MUTEX_LOCK, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE,
    BIND_PHASE_FAILED, BIND_PHASE_SUCCESS,
};
use hami_shared::publish::{PublishError, publish_atomic, sweep_temp_files};
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tonic::Status;

use super::codec::PodDevices;
use super::locator::{LocateTrips, Located, Source, locate_with, node_lock};
use super::plan::{AllocationPlan, AllocationSettings, PlanError, plan_container, pod_key};
use super::pod_cache::PodCache;
use crate::api::v1beta1;
use crate::devices::DeviceTable;
use crate::pending_pod::{annotation, lock_holder, lock_names};
use crate::service::AllocateHandler;

/// Mode of the per-container directory: HAMi-core's shared region (`usage.cache`) and lock files
/// are created there by whatever UID the container's processes run as (HAMi uses 0777 too).
pub const CONTAINER_DIR_MODE: u32 = 0o777;

/// Selections tried per `Allocate` call: the first may read the pod from the cache; the others
/// read it from the API server, after the API server refused the patch (the pod had changed) or
/// the node lock named another pod.
pub const MAX_SELECT_ATTEMPTS: u32 = 3;

/// Where one allocation spent its time (for logs and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AllocateTiming {
    /// Waiting for the node-wide allocation lock.
    pub queued: Duration,
    /// Reading the node lock (node GET, concurrent with the disk work).
    pub node_get: Duration,
    /// Finding the pod (the cache, else a pod GET or LIST; every attempt).
    pub locate: Duration,
    /// Directory creation and limits file publication (includes the fsyncs).
    pub disk: Duration,
    /// Of `disk`: `publish_atomic` (write, chmod, fsync file, rename, fsync directory).
    pub publish: Duration,
    /// Patching the pod's annotations.
    pub patch_pod: Duration,
    /// Releasing the node lock.
    pub release_lock: Duration,
    /// The whole call, queueing included.
    pub total: Duration,
    /// API round trips made.
    pub api_round_trips: u32,
    /// The pod selected was read from the watch-fed cache (not the API server).
    pub from_cache: bool,
    /// Selections redone because the pod read had changed.
    pub retries: u32,
    /// Whether the call succeeded.
    pub ok: bool,
}

/// Collects [`AllocateTiming`]s (the benchmark reads them; the plugin keeps none by default).
#[derive(Debug, Default)]
pub struct TimingLog {
    entries: Mutex<Vec<AllocateTiming>>,
}

impl TimingLog {
    /// Appends one record.
    pub fn push(&self, timing: AllocateTiming) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(timing);
    }

    /// Takes every record so far.
    pub fn take(&self) -> Vec<AllocateTiming> {
        std::mem::take(&mut *self.entries.lock().unwrap_or_else(PoisonError::into_inner))
    }
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

/// Creates the plan's directory (recreated, mode 0777) and publishes its limits file atomically.
/// On error, whatever this call created is removed again before returning. Returns what was
/// written and the time spent in `publish_atomic`.
pub fn execute_plan(plan: &AllocationPlan) -> Result<(Written, Duration), DiskError> {
    let mut written = Written::default();
    let mut publish_time = Duration::ZERO;
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
            let started = Instant::now();
            let path = publish_atomic(&file.dir, &file.file_name, file.text.as_bytes())?;
            publish_time = started.elapsed();
            written.file = Some(path);
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok((written, publish_time)),
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

/// Why an allocation failed after the pod was found.
#[derive(Debug)]
struct Failure {
    status: Status,
    /// Event message (names the path and the error for disk failures).
    message: String,
    kind: FailureKind,
}

/// What a [`Failure`] leads to.
#[derive(Debug)]
enum FailureKind {
    /// The allocation fails: bind-phase failed, lock released, Event.
    Fail,
    /// The API server refused the selection because the pod read was not its current version
    /// (409) or is gone (404), or the node lock names another pod: read it again and retry,
    /// starting from the node lock as read during this attempt, when it was.
    Stale { lock_read: Option<Option<String>> },
    /// The node lock could not be read: nothing was written and the pod is left as it is.
    Lookup,
}

impl Failure {
    /// A failure that fails the allocation; `status` makes the gRPC status from the message.
    fn new(status: fn(String) -> Status, message: String) -> Self {
        Self {
            status: status(message.clone()),
            message,
            kind: FailureKind::Fail,
        }
    }

    fn plan(e: PlanError) -> Self {
        let message = format!("allocation failed: {e}");
        Self::new(Status::failed_precondition, message)
    }

    fn disk(pod: &str, container: &str, e: &DiskError) -> Self {
        let message = format!(
            "allocation failed for pod {pod} container {container}: {} ({e}); the container would run without its GPU limits",
            e.path().display()
        );
        Self::new(Status::internal, message)
    }

    fn api(what: &str, e: &kube::Error) -> Self {
        let message = format!("allocation failed: {what}: {e}");
        Self::new(Status::unavailable, message)
    }
}

/// The `Allocate` handler of hami-limits. Each call runs as its own task, so that a call whose
/// kubelet went away (its gRPC future dropped) still runs to a definite end: files and pod agree,
/// and its claim is settled.
pub struct Allocator {
    core: Arc<Core>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.fmt(f)
    }
}

/// What the calls share.
struct Core {
    client: kube::Client,
    node_name: String,
    settings: AllocationSettings,
    version: String,
    /// Held while a call locates and claims its pod (in memory; no round trip under it).
    serial: tokio::sync::Mutex<()>,
    /// Claims on pods whose selection patch is in flight, and the ones settled meanwhile.
    claims: Mutex<Claims>,
    cache: Option<Arc<PodCache>>,
    timings: Option<Arc<TimingLog>>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node_name", &self.node_name)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    /// An allocator for `node_name`. Removes leftover temporary files from the containers
    /// directory first (a warning if that fails: the allocations will say what is wrong).
    pub fn new(
        client: kube::Client,
        node_name: impl Into<String>,
        settings: AllocationSettings,
    ) -> Self {
        match sweep_containers_dir(&settings) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(removed = n, dir = %settings.containers_dir().display(), "removed leftover temporary files")
            }
            Err(error) => tracing::warn!(%error, "cannot sweep the containers directory"),
        }
        Self {
            core: Arc::new(Core {
                client,
                node_name: node_name.into(),
                settings,
                version: env!("CARGO_PKG_VERSION").to_owned(),
                serial: tokio::sync::Mutex::new(()),
                claims: Mutex::default(),
                cache: None,
                timings: None,
                metrics: Arc::default(),
            }),
        }
    }

    /// The shared part, to set up before the first call (an `Allocator` is not `Clone`; only a
    /// running call shares it).
    fn setup(&mut self, f: impl FnOnce(&mut Core)) {
        match Arc::get_mut(&mut self.core) {
            Some(core) => f(core),
            None => tracing::warn!("allocator set up after its first call; setting ignored"),
        }
    }

    /// Reports every call (outcome, latency, files published, delivery mode) to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.setup(|core| core.metrics = metrics);
        self
    }

    /// Reads pods from `cache` first (kept current by [`PodCache::run`]); the pods this allocator
    /// patches are put back into it.
    #[must_use]
    pub fn with_pod_cache(mut self, cache: Arc<PodCache>) -> Self {
        self.setup(|core| core.cache = Some(cache));
        self
    }

    /// Records every call's [`AllocateTiming`] into `log` (benchmarks).
    #[must_use]
    pub fn with_timings(mut self, log: Arc<TimingLog>) -> Self {
        self.setup(|core| core.timings = Some(log));
        self
    }

    /// The settings in use.
    pub fn settings(&self) -> &AllocationSettings {
        &self.core.settings
    }
}

impl Core {
    fn libvgpu_host(&self) -> PathBuf {
        let versioned = self.settings.libvgpu_host_path(&self.version, true);
        let exists = versioned.is_file();
        self.settings.libvgpu_host_path(&self.version, exists)
    }

    /// Merge-patches the pod's annotations. With `precondition`, the patch carries the pod's
    /// `resourceVersion`: the API server answers 409 unless `pod` is its current version. The
    /// patched pod goes back into the cache.
    async fn patch_pod_annotations(
        &self,
        pod: &Pod,
        annotations: serde_json::Value,
        precondition: bool,
    ) -> Result<Pod, kube::Error> {
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let mut metadata = serde_json::json!({ "annotations": annotations });
        if precondition && let Some(rv) = &pod.metadata.resource_version {
            metadata["resourceVersion"] = serde_json::Value::String(rv.clone());
        }
        let patch = serde_json::json!({ "metadata": metadata });
        let patched = api
            .patch(
                pod.metadata.name.as_deref().unwrap_or(""),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        if let Some(cache) = &self.cache {
            cache.observe(&patched);
        }
        Ok(patched)
    }

    /// Removes the node lock if it still has the value that named this pod (a JSON patch `test`
    /// makes the check and the removal one atomic step).
    async fn release_lock(&self, lock: &str) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let path = format!(
            "/metadata/annotations/{}",
            ANNOTATION_MUTEX_LOCK.replace('~', "~0").replace('/', "~1")
        );
        let patch = test_and_remove(&path, lock).map_err(kube::Error::SerdeError)?;
        match nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            // 422: the test failed — the lock was released or taken by another pod meanwhile.
            Err(kube::Error::Api(e)) if e.code == 422 => {
                tracing::info!(node = %self.node_name, "node lock no longer names this pod; left as is");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond().unsigned_abs())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name),
                namespace: Some(namespace.clone()),
                uid: pod.metadata.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(type_.into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some("hami-device-plugin".into()),
                host: Some(self.node_name.clone()),
            }),
            reporting_component: Some("hami-device-plugin".into()),
            reporting_instance: Some(self.node_name.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(error) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(%error, pod = %pod_key(pod), %reason, "cannot record an Event");
        }
    }

    /// The failure path: bind-phase failed, lock released, Event, error status.
    async fn fail(
        &self,
        located: &Located,
        failure: Failure,
        timing: &mut AllocateTiming,
    ) -> Status {
        let pod = &located.pod;
        tracing::error!(pod = %pod_key(pod), node = %self.node_name, error = %failure.message, "allocation failed");
        timing.api_round_trips += 1;
        if let Err(error) = self
            .patch_pod_annotations(
                pod,
                serde_json::json!({ ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED }),
                false,
            )
            .await
        {
            tracing::error!(%error, pod = %pod_key(pod), "cannot set bind-phase failed");
        }
        if let Some(lock) = &located.lock {
            timing.api_round_trips += 1;
            if let Err(error) = self.release_lock(lock).await {
                tracing::error!(%error, node = %self.node_name, "cannot release the node lock");
            }
        }
        timing.api_round_trips += 1;
        self.event(pod, "Warning", "AllocationFailed", &failure.message)
            .await;
        failure.status
    }

    /// Phase 1a, under the node-wide lock, in memory: decode the pod's devices, plan each
    /// requested container (pure) and compute the annotation with their entries erased. Nothing
    /// is written anywhere here.
    fn plan_selection(
        &self,
        located: &Located,
        request: &v1beta1::AllocateRequest,
    ) -> Result<(Selection, String), Failure> {
        let pod = &located.pod;
        let key = pod_key(pod);
        let value = annotation(pod, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE).ok_or_else(|| {
                let message = format!(
                    "allocation failed: pod {key} has no {ANNOTATION_VGPU_DEVICES_TO_ALLOCATE} annotation"
                );
                Failure::new(Status::failed_precondition, message)
            })?;
        let mut devices = PodDevices::decode(value).map_err(|source| {
            Failure::plan(PlanError::Codec {
                pod: key.clone(),
                source,
            })
        })?;
        let libvgpu = self.libvgpu_host();
        let mut plans = Vec::with_capacity(request.container_requests.len());
        for container in &request.container_requests {
            let Some((entry, wanted)) = devices.next_request() else {
                let message = format!(
                    "allocation failed: pod {key} has no container left with an NVIDIA device in {ANNOTATION_VGPU_DEVICES_TO_ALLOCATE}"
                );
                return Err(Failure::new(Status::failed_precondition, message));
            };
            let plan = plan_container(
                pod,
                entry,
                &wanted,
                Some(container.devices_ids.len()),
                &self.settings,
                &libvgpu,
            )
            .map_err(Failure::plan)?;
            devices.erase_nvidia(entry);
            plans.push(plan);
        }
        Ok((
            Selection {
                plans,
                done: !devices.has_nvidia(),
            },
            devices.encode(),
        ))
    }

    /// The API server could not be asked which pod is being allocated: nothing was written.
    fn lookup_failure(&self, e: &kube::Error) -> Failure {
        let message = format!(
            "cannot look for the pod being allocated on node {}: {e}",
            self.node_name
        );
        Failure {
            kind: FailureKind::Lookup,
            ..Failure::new(Status::unavailable, message)
        }
    }

    /// HAMi's rule, checked once the node lock is read: the pod the lock names comes first. When
    /// it names another pod than the one selected, a `stale` failure (the selection is redone
    /// knowing the lock); otherwise the lock goes with the pod when it names it (to be released).
    fn apply_lock(located: &mut Located, lock: Option<String>) -> Result<(), Failure> {
        let ours = lock.as_deref().is_some_and(|l| lock_names(l, &located.pod));
        if let Some(other) = lock
            .as_deref()
            .filter(|l| !ours && lock_holder(l).is_some())
        {
            let message = format!(
                "the node lock {ANNOTATION_MUTEX_LOCK}={other:?} names another pod than {}",
                pod_key(&located.pod)
            );
            return Err(Failure {
                kind: FailureKind::Stale {
                    lock_read: Some(lock),
                },
                ..Failure::new(Status::aborted, message)
            });
        }
        located.lock = lock.filter(|_| ours);
        Ok(())
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Phase 1, under the node-wide lock, in memory only: find the pod (the cache first on the
    /// first attempt, else the API server), wait while another call's claim on the same pod is
    /// in flight (or look again if one settled while the pod was being read), plan, and claim
    /// the pod: the cache shows its entries erased, so that the next call passes over them.
    /// `Err` when no pod could be looked for or found (nothing was written).
    async fn choose(
        &self,
        lock: Option<&str>,
        request: &v1beta1::AllocateRequest,
        attempt: u32,
        timing: &mut AllocateTiming,
        trips: &mut LocateTrips,
    ) -> Result<(Located, Result<Claim<'_>, Failure>), (AllocateOutcome, Status)> {
        let queued = Instant::now();
        let _serial = self.serial.lock().await;
        timing.queued += queued.elapsed();
        loop {
            let started = Instant::now();
            // Only claims settled from now on can make what is read below stale.
            self.claims().settled.clear();
            let cache = if attempt == 1 {
                self.cache.as_deref()
            } else {
                None
            };
            // A pod whose last entries another call is allocating is passed over, as it will be
            // fully allocated (the cache already shows it so; a GET or LIST cannot).
            let passed_over = |pod: &Pod| {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                self.claims()
                    .in_flight
                    .get(uid)
                    .is_some_and(|(_, last)| *last)
            };
            let found = locate_with(
                &self.client,
                &self.node_name,
                lock,
                cache,
                &passed_over,
                trips,
            )
            .await;
            timing.locate += started.elapsed();
            let (located, source) = match found {
                Err(e) => {
                    return Err((AllocateOutcome::LookupError, self.lookup_failure(&e).status));
                }
                Ok(None) => {
                    return Err((
                        AllocateOutcome::NoPod,
                        Status::failed_precondition(format!(
                            "no pod is being allocated on node {}: no node lock {ANNOTATION_MUTEX_LOCK} names an existing pod, and no Pending pod on the node has hami.io/bind-time, hami.io/bind-phase allocating|success and hami.io/vgpu-node={}; nothing was written",
                            self.node_name, self.node_name
                        )),
                    ));
                }
                Ok(Some(found)) => found,
            };
            timing.from_cache = source == Source::Cache;
            let uid = located.pod.metadata.uid.clone().unwrap_or_default();
            let (busy, changed) = {
                let claims = self.claims();
                (
                    claims.in_flight.get(&uid).map(|(m, _)| Arc::clone(m)),
                    claims.settled.contains(&uid),
                )
            };
            if let Some(busy) = busy {
                // Another container of this pod is being allocated: wait until it has settled,
                // then look again (the cache then has the pod's new version).
                let waited = Instant::now();
                drop(busy.lock().await);
                timing.queued += waited.elapsed();
                continue;
            }
            if changed {
                // Another call's patch of this pod landed while it was being read.
                continue;
            }
            let claim = match self.plan_selection(&located, request) {
                Err(failure) => Err(failure),
                Ok((selection, erased)) => {
                    let mutex = Arc::new(tokio::sync::Mutex::new(()));
                    let held = Arc::clone(&mutex).lock_owned().await;
                    self.claims()
                        .in_flight
                        .insert(uid.clone(), (mutex, selection.done));
                    if let Some(cache) = &self.cache {
                        cache.claim(&located.pod, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE, &erased);
                    }
                    Ok(Claim {
                        selection,
                        erased,
                        guard: ClaimGuard {
                            owner: self,
                            uid,
                            original: located.pod.clone(),
                            kept: false,
                            held: Some(held),
                        },
                    })
                }
            };
            // Returning releases the node-wide lock.
            return Ok((located, claim));
        }
    }

    /// Phase 2, outside the node-wide lock (so that concurrent calls for different pods overlap
    /// their fsyncs and round trips): create the directories and publish the limits files on a
    /// blocking thread; then, on success, one merge patch that erases the containers' entries
    /// from `hami.io/vgpu-devices-to-allocate` — with `hami.io/bind-phase: success` when no NVIDIA
    /// entry is left — and carries the pod's `resourceVersion`; then the node lock released
    /// (only if it names this pod). A 409 or 404 on the patch removes the files again and marks
    /// the failure `stale`: the pod read was not current, and is read again.
    async fn execute(
        &self,
        located: &mut Located,
        claim: Claim<'_>,
        read_lock: bool,
        timing: &mut AllocateTiming,
    ) -> Result<v1beta1::AllocateResponse, Failure> {
        let key = pod_key(&located.pod);
        let Claim {
            selection,
            erased,
            guard,
        } = claim;
        let Selection { plans, done } = selection;
        let started = Instant::now();
        let disk_task = tokio::task::spawn_blocking(move || {
            let mut written: Vec<Written> = Vec::new();
            let mut publish = Duration::ZERO;
            for plan in &plans {
                match execute_plan(plan) {
                    Ok((w, p)) => {
                        written.push(w);
                        publish += p;
                    }
                    Err(e) => {
                        written.iter().for_each(Written::undo);
                        let failure = Failure::disk(&pod_key_of(plan), &plan.container, &e);
                        return (plans, Err(failure));
                    }
                }
            }
            (plans, Ok((written, publish)))
        });
        // The node lock, read while the files are written (off the critical path) when this
        // attempt does not know it yet.
        let lock_task = async {
            if !read_lock {
                return None;
            }
            let started = Instant::now();
            let mut trips = LocateTrips::default();
            let lock = node_lock(&self.client, &self.node_name, &mut trips).await;
            Some((lock, started.elapsed()))
        };
        let (disk, lock_read) = tokio::join!(
            async {
                let disk = disk_task.await;
                (disk, started.elapsed())
            },
            lock_task
        );
        let (disk, disk_time) = disk;
        timing.disk = disk_time;
        if let Some((lock, took)) = lock_read {
            timing.node_get = took;
            timing.api_round_trips += 1;
            if let Err(failure) = lock
                .map_err(|e| self.lookup_failure(&e))
                .and_then(|lock| Self::apply_lock(located, lock))
            {
                if let Ok((_, Ok((written, _)))) = &disk {
                    written.iter().for_each(Written::undo);
                }
                guard.settle(false);
                return Err(failure);
            }
        }
        let pod = &located.pod;
        let (plans, outcome) = match disk {
            Ok(finished) => finished,
            Err(e) => {
                guard.settle(false);
                let message = format!("allocation failed for pod {key}: disk task failed: {e}");
                return Err(Failure::new(Status::internal, message));
            }
        };
        let (written, publish) = match outcome {
            Ok(done) => done,
            Err(failure) => {
                self.metrics.observe_publish_failure();
                guard.settle(false);
                return Err(failure);
            }
        };
        timing.publish = publish;
        let mut annotations = serde_json::json!({ ANNOTATION_VGPU_DEVICES_TO_ALLOCATE: erased });
        if done {
            annotations[ANNOTATION_BIND_PHASE] = BIND_PHASE_SUCCESS.into();
        }
        let started = Instant::now();
        timing.api_round_trips += 1;
        let patched = self.patch_pod_annotations(pod, annotations, true).await;
        timing.patch_pod += started.elapsed();
        if let Err(e) = patched {
            written.iter().for_each(Written::undo);
            guard.settle(false);
            let stale = matches!(&e, kube::Error::Api(s) if s.code == 409 || s.code == 404);
            let what = if done {
                format!(
                    "cannot erase the allocated entries and set {ANNOTATION_BIND_PHASE}: {BIND_PHASE_SUCCESS} on pod {key}"
                )
            } else {
                format!("cannot erase the allocated entries of pod {key}")
            };
            let mut failure = Failure::api(&what, &e);
            if stale {
                failure.kind = FailureKind::Stale { lock_read: None };
            }
            return Err(failure);
        }
        guard.settle(true);
        for plan in &plans {
            tracing::info!(
                pod = %key,
                container = %plan.container,
                devices = %plan.envs.get(hami_shared::names::ENV_NVIDIA_VISIBLE_DEVICES).map_or("", String::as_str),
                delivery = %plan.delivery.mode,
                delivery_source = %plan.delivery.source,
                limits_file = %plan.limits_file.as_ref().map(|f| f.path().display().to_string()).unwrap_or_default(),
                mig = plan.mig,
                "container allocated"
            );
        }
        if done && let Some(lock) = &located.lock {
            let started = Instant::now();
            timing.api_round_trips += 1;
            if let Err(error) = self.release_lock(lock).await {
                // The pod is allocated; a stale lock expires after 5 minutes.
                tracing::error!(%error, node = %self.node_name, "cannot release the node lock");
            }
            timing.release_lock = started.elapsed();
        }
        for warning in plans.iter().flat_map(|p| p.warnings.iter()) {
            tracing::warn!(pod = %key, "{warning}");
            timing.api_round_trips += 1;
            let reason = warning.reason();
            self.event(pod, "Warning", reason, &warning.to_string())
                .await;
        }
        let published = plans.iter().filter(|p| p.limits_file.is_some()).count();
        self.metrics.observe_published(published as u64);
        for plan in &plans {
            self.metrics
                .observe_delivery(plan.delivery.mode, plan.delivery.source);
        }
        Ok(v1beta1::AllocateResponse {
            container_responses: plans.iter().map(AllocationPlan::response).collect(),
        })
    }
}

/// A pod claimed by one call: what it selected, the annotation with those entries erased, and
/// the claim's mutex (held until the claim settles).
#[derive(Debug)]
struct Claim<'a> {
    selection: Selection,
    erased: String,
    guard: ClaimGuard<'a>,
}

/// Holds a claim until it settles — also when the call is cancelled (kubelet gone): dropping it
/// takes the claim back from the cache unless it was `kept` (its patch succeeded), ends it in the
/// claims, then releases its mutex (a call waiting for it looks again).
struct ClaimGuard<'a> {
    owner: &'a Core,
    uid: String,
    /// The pod as read, shown again if the claim is not kept.
    original: Pod,
    kept: bool,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl std::fmt::Debug for ClaimGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimGuard")
            .field("uid", &self.uid)
            .field("kept", &self.kept)
            .finish_non_exhaustive()
    }
}

impl ClaimGuard<'_> {
    /// Ends the claim now; `kept` when its patch succeeded.
    fn settle(mut self, kept: bool) {
        self.kept = kept;
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        if !self.kept
            && let Some(cache) = &self.owner.cache
        {
            cache.unclaim(&self.original);
        }
        {
            let mut claims = self.owner.claims();
            claims.in_flight.remove(&self.uid);
            claims.settled.insert(self.uid.clone());
        }
        drop(self.held.take());
    }
}

/// The allocator's claims on pods (see [`Allocator`]'s `choose`).
#[derive(Debug, Default)]
struct Claims {
    /// Pods (by UID) being allocated, each with a mutex its claimer holds until its patch has
    /// settled, and whether the claim takes the pod's last NVIDIA entries.
    in_flight: std::collections::HashMap<String, (Arc<tokio::sync::Mutex<()>>, bool)>,
    /// Pods whose claim settled since the current lookup began (cleared when one begins; lookups
    /// run one at a time, under the node-wide lock).
    settled: std::collections::HashSet<String>,
}

/// What phase 1 selected.
#[derive(Debug)]
struct Selection {
    plans: Vec<AllocationPlan>,
    /// No NVIDIA entry is left on the pod after these.
    done: bool,
}

fn pod_key_of(plan: &AllocationPlan) -> String {
    plan.pod.clone()
}

/// The JSON patch that removes the annotation at `path` only while it still holds `value`.
fn test_and_remove(path: &str, value: &str) -> Result<json_patch::Patch, serde_json::Error> {
    serde_json::from_value(serde_json::json!([
        { "op": "test", "path": path, "value": value },
        { "op": "remove", "path": path },
    ]))
}

#[tonic::async_trait]
impl AllocateHandler for Allocator {
    async fn allocate(
        &self,
        _devices: &DeviceTable,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let core = Arc::clone(&self.core);
        tokio::spawn(async move { core.allocate(request).await })
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("allocation task failed: {e}"))))
    }
}

impl Core {
    async fn allocate(
        &self,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let started = Instant::now();
        let mut timing = AllocateTiming::default();
        let mut trips = LocateTrips::default();
        // The node lock: unknown on the first attempt (read while the files are written, and the
        // attempt redone if it names another pod), then as last read.
        let mut known_lock: Option<Option<String>> = None;
        let mut outcome = AllocateOutcome::Failed;
        let mut attempt = 1;
        let result = loop {
            let lock = known_lock.as_ref().and_then(|l| l.as_deref());
            let chosen = self
                .choose(lock, &request, attempt, &mut timing, &mut trips)
                .await;
            let (mut located, claim) = match chosen {
                Err((o, status)) => {
                    outcome = o;
                    break Err(status);
                }
                Ok(chosen) => chosen,
            };
            let read_lock = known_lock.is_none();
            let executed = match claim {
                Ok(claim) => {
                    self.execute(&mut located, claim, read_lock, &mut timing)
                        .await
                }
                // Nothing written; the node lock is still needed (which pod; what to release).
                Err(failure) if read_lock => {
                    let mut trips = LocateTrips::default();
                    timing.api_round_trips += 1;
                    match node_lock(&self.client, &self.node_name, &mut trips).await {
                        Err(e) => Err(self.lookup_failure(&e)),
                        Ok(lock) => Self::apply_lock(&mut located, lock).and(Err(failure)),
                    }
                }
                Err(failure) => Err(failure),
            };
            match executed {
                Err(failure) if matches!(failure.kind, FailureKind::Lookup) => {
                    outcome = AllocateOutcome::LookupError;
                    break Err(failure.status);
                }
                Err(Failure {
                    kind: FailureKind::Stale { lock_read },
                    message,
                    ..
                }) if attempt < MAX_SELECT_ATTEMPTS => {
                    tracing::debug!(pod = %pod_key(&located.pod), attempt, from_cache = timing.from_cache, error = %message, "selection redone");
                    self.metrics.observe_stale_pod_retry();
                    timing.retries += 1;
                    attempt += 1;
                    if let Some(lock) = lock_read {
                        known_lock = Some(lock);
                    }
                }
                executed => {
                    self.metrics.observe_pod_lookup(timing.from_cache);
                    break match executed {
                        Ok(response) => Ok(response),
                        Err(failure) => Err(self.fail(&located, failure, &mut timing).await),
                    };
                }
            }
        };
        timing.api_round_trips += trips.node_gets + trips.pod_gets + trips.pod_lists;
        timing.total = started.elapsed();
        timing.ok = result.is_ok();
        if result.is_ok() {
            outcome = AllocateOutcome::Success;
        }
        self.metrics.observe_allocate(outcome, timing.total);
        if let Some(log) = &self.timings {
            log.push(timing);
        }
        tracing::debug!(?timing, "allocate");
        result
    }
}

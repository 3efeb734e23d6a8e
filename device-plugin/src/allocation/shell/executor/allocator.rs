//! The retry loop of one `Allocate` call (see [`super`] for the whole protocol): select and claim
//! under the node-wide lock (in memory), write the files and read the node lock outside it, patch
//! the pod with its `resourceVersion`, and redo the selection from the API server when the pod
//! read was stale or the node lock names another pod (at most [`MAX_SELECT_ATTEMPTS`] times).
//! Each call runs in an `allocate` span with one span per phase ([`super::timing`]).
//!
//! The core's phases (locate, plan and claim, write the files, patch the pod, report) share its
//! state and its retry loop, so they stay in one file, each phase its own function.

use std::sync::Arc;

use hami_shared::names::{
    ANNOTATION_BIND_PHASE, ANNOTATION_MUTEX_LOCK, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE,
    BIND_PHASE_FAILED, BIND_PHASE_SUCCESS,
};
use tonic::Status;
use tracing::Instrument as _;

use super::claims::{Claim, Claims, Selection};
use super::disk::{Written, execute_plan, probe_host};
use super::pod_api::PodApi;
use super::timing::ALLOCATE_SPAN;
use crate::allocation::plan::entry_check::{self, NodeCapacity};
use crate::allocation::plan::pod::{lock_holder, lock_names};
use crate::allocation::plan::{
    AllocationPlan, AllocationSettings, PlanError, plan_container, pod_key,
};
use crate::allocation::shell::hook::{HookFolder, HookFolderError};
use crate::allocation::shell::pod_lookup::cache::PodCache;
use crate::allocation::shell::pod_lookup::locator::{
    LocateTrips, Located, Source, locate_with, node_lock,
};
use crate::gpu::devices::DeviceTable;
use crate::kubelet::api::v1beta1;
use crate::metrics::{AllocateOutcome, Metrics};

/// Selections tried per `Allocate` call: the first may read the pod from the cache; the others
/// read it from the API server, after the API server refused the patch (the pod had changed) or
/// the node lock named another pod.
pub const MAX_SELECT_ATTEMPTS: u32 = 3;

/// Why an allocation failed after the pod was found.
#[derive(Debug)]
struct Failure {
    status: Status,
    /// Event message (names the path and the error for disk failures).
    message: String,
    /// Event reason.
    reason: &'static str,
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
            reason: REASON_ALLOCATION_FAILED,
            kind: FailureKind::Fail,
        }
    }

    fn plan(e: PlanError) -> Self {
        let message = format!("allocation failed: {e}");
        Self {
            reason: e.reason(),
            ..Self::new(Status::failed_precondition, message)
        }
    }

    fn disk(pod: &str, container: &str, e: &super::disk::DiskError) -> Self {
        let message = format!(
            "allocation failed for pod {pod} container {container}: {} ({e}); the container would run without its GPU limits",
            e.path().display()
        );
        Self::new(Status::internal, message)
    }

    fn hook(pod: &str, container: &str, e: &HookFolderError) -> Self {
        let message = format!(
            "allocation failed for pod {pod} container {container}: {e}; the container would start without HAMi-core or with a preload list naming missing files"
        );
        Self::new(Status::failed_precondition, message)
    }

    fn api(what: &str, e: &kube::Error) -> Self {
        let message = format!("allocation failed: {what}: {e}");
        Self::new(Status::unavailable, message)
    }
}

/// The Event reason of a failed allocation that is not a refusal of the pod's spec or entry.
const REASON_ALLOCATION_FAILED: &str = "AllocationFailed";

/// What the disk task hands back: the plans (with what the host said), and what was written or
/// why not.
type WrittenPlans = (Vec<AllocationPlan>, Result<Vec<Written>, Failure>);

/// One `Allocate` call: kubelet's request, the advertised devices, and for each container
/// request whether `GetPreferredAllocation` steered kubelet to exactly its device IDs.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// kubelet's request.
    pub request: &'a v1beta1::AllocateRequest,
    /// The devices this plugin advertises.
    pub table: &'a DeviceTable,
    /// Per container request: steered (see [`crate::kubelet::service::Steering`]).
    pub steered: &'a [bool],
}

/// The counters of one call, recorded on its `allocate` span when it ends.
#[derive(Debug, Default)]
struct Counts {
    api_round_trips: u32,
    from_cache: bool,
    retries: u32,
}

/// What the calls of one allocator share.
pub struct Core {
    pub(super) api: PodApi,
    pub(super) settings: AllocationSettings,
    /// Held while a call locates and claims its pod (in memory; no round trip under it).
    pub(super) serial: tokio::sync::Mutex<()>,
    /// Claims on pods whose selection patch is in flight, and the ones settled meanwhile.
    pub(super) claims: Claims,
    pub(super) cache: Option<Arc<PodCache>>,
    pub(super) metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node_name", &self.api.node_name())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// An allocator's shared part.
    pub fn new(client: kube::Client, node_name: String, settings: AllocationSettings) -> Self {
        Self {
            api: PodApi::new(client, node_name),
            settings,
            serial: tokio::sync::Mutex::new(()),
            claims: Claims::default(),
            cache: None,
            metrics: Arc::default(),
        }
    }

    fn client(&self) -> &kube::Client {
        self.api.client()
    }

    fn node_name(&self) -> &str {
        self.api.node_name()
    }

    /// The failure path: bind-phase failed, lock released, Event, error status.
    async fn fail(&self, located: &Located, failure: Failure, counts: &mut Counts) -> Status {
        let pod = located.pod();
        tracing::error!(pod = %pod_key(pod), node = %self.node_name(), reason = failure.reason, error = %failure.message, "allocation failed");
        counts.api_round_trips += 1;
        if let Err(error) = self
            .api
            .patch_annotations(
                pod,
                serde_json::json!({ ANNOTATION_BIND_PHASE: BIND_PHASE_FAILED }),
                false,
            )
            .await
        {
            tracing::error!(%error, pod = %pod_key(pod), "cannot set bind-phase failed");
        }
        if let Some(lock) = &located.lock {
            counts.api_round_trips += 1;
            if let Err(error) = self.api.release_lock(lock).await {
                tracing::error!(%error, node = %self.node_name(), "cannot release the node lock");
            }
        }
        counts.api_round_trips += 1;
        self.api.warn(pod, failure.reason, &failure.message).await;
        failure.status
    }

    /// Phase 1a, under the node-wide lock, in memory: decode the pod's devices, plan each
    /// requested container (pure) and compute the annotation with their entries erased. Nothing
    /// is written anywhere here.
    fn plan_selection(
        &self,
        located: &Located,
        call: &Call<'_>,
    ) -> Result<(Selection, String), Failure> {
        let request = call.request;
        let pod = located.pod();
        let key = pod_key(pod);
        // Decoded once, by the locator; planning works on a copy (the pod stays as read).
        let mut devices = match &located.candidate.devices {
            None => {
                let message = format!(
                    "allocation failed: pod {key} has no {ANNOTATION_VGPU_DEVICES_TO_ALLOCATE} annotation"
                );
                return Err(Failure::new(Status::failed_precondition, message));
            }
            Some(Err(source)) => {
                return Err(Failure::plan(PlanError::Codec {
                    pod: key,
                    source: source.clone(),
                }));
            }
            Some(Ok(devices)) => devices.clone(),
        };
        // Before anything is granted: could HAMi's scheduler have written this for this node?
        let capacity = NodeCapacity::from_table(
            call.table,
            self.settings.memory_scaling,
            self.settings.core_scaling,
        );
        entry_check::check_pod(&devices, &capacity).map_err(|source| {
            Failure::plan(PlanError::Entry {
                pod: key.clone(),
                source,
            })
        })?;
        // The hook folder as it is now (a listing and ld.so.preload): which file is HAMi-core,
        // and whether each container gets every file its preload list names.
        let hook = HookFolder::read(&self.settings.vgpu_dir());
        let libvgpu = hook.libvgpu_host();
        let mut plans = Vec::with_capacity(request.container_requests.len());
        for (i, container) in request.container_requests.iter().enumerate() {
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
            let steered = call.steered.get(i).copied().unwrap_or(false);
            entry_check::check_kubelet_ids(
                entry,
                &wanted,
                &container.devices_ids,
                call.table,
                steered,
            )
            .map_err(|source| {
                Failure::plan(PlanError::Entry {
                    pod: key.clone(),
                    source,
                })
            })?;
            hook.check_plan(&plan)
                .map_err(|e| Failure::hook(&plan.pod, &plan.container, &e))?;
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
            self.node_name()
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
        let ours = lock
            .as_deref()
            .is_some_and(|l| lock_names(l, located.pod()));
        if let Some(other) = lock
            .as_deref()
            .filter(|l| !ours && lock_holder(l).is_some())
        {
            let message = format!(
                "the node lock {ANNOTATION_MUTEX_LOCK}={other:?} names another pod than {}",
                pod_key(located.pod())
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

    /// Phase 1, under the node-wide lock, in memory only: find the pod (the cache first on the
    /// first attempt, else the API server), wait while another call's claim on the same pod is
    /// in flight (or look again if one settled while the pod was being read), plan, and claim
    /// the pod: the cache shows its entries erased, so that the next call passes over them.
    /// `Err` when no pod could be looked for or found (nothing was written).
    async fn choose(
        &self,
        lock: Option<&str>,
        call: &Call<'_>,
        attempt: u32,
        counts: &mut Counts,
        trips: &mut LocateTrips,
    ) -> Result<(Located, Result<Claim<'_>, Failure>), (AllocateOutcome, Status)> {
        let _serial = self
            .serial
            .lock()
            .instrument(tracing::debug_span!("queued"))
            .await;
        loop {
            self.claims.begin_lookup();
            let (located, source) = self.locate(lock, attempt, trips).await?;
            counts.from_cache = source == Source::Cache;
            let uid = located.pod().metadata.uid.clone().unwrap_or_default();
            let (busy, changed) = self.claims.state(&uid);
            if let Some(busy) = busy {
                // Another container of this pod is being allocated: wait until it has settled,
                // then look again (the cache then has the pod's new version).
                drop(
                    busy.lock()
                        .instrument(tracing::debug_span!("queued", waiting_for = "claim"))
                        .await,
                );
                continue;
            }
            if changed {
                // Another call's patch of this pod landed while it was being read.
                continue;
            }
            let claim = self.plan_and_claim(&located, uid, call).await;
            // Returning releases the node-wide lock.
            return Ok((located, claim));
        }
    }

    /// The pod being allocated (the cache first on the first attempt), or the outcome and status
    /// of an `Allocate` that finds none.
    async fn locate(
        &self,
        lock: Option<&str>,
        attempt: u32,
        trips: &mut LocateTrips,
    ) -> Result<(Located, Source), (AllocateOutcome, Status)> {
        let cache = if attempt == 1 {
            self.cache.as_deref()
        } else {
            None
        };
        // A pod whose last entries another call is allocating is passed over, as it will be
        // fully allocated (the cache already shows it so; a GET or LIST cannot).
        let passed_over = |pod: &k8s_openapi::api::core::v1::Pod| {
            self.claims
                .takes_last_entries(pod.metadata.uid.as_deref().unwrap_or_default())
        };
        let found = locate_with(
            self.client(),
            self.node_name(),
            lock,
            cache,
            &passed_over,
            trips,
        )
        .instrument(tracing::debug_span!("locate", attempt))
        .await;
        match found {
            Err(e) => Err((AllocateOutcome::LookupError, self.lookup_failure(&e).status)),
            Ok(None) => Err((
                AllocateOutcome::NoPod,
                Status::failed_precondition(format!(
                    "no pod is being allocated on node {node}: no node lock {ANNOTATION_MUTEX_LOCK} names an existing pod, and no Pending pod on the node has hami.io/bind-time, hami.io/bind-phase allocating|success and hami.io/vgpu-node={node}; nothing was written",
                    node = self.node_name()
                )),
            )),
            Ok(Some(found)) => Ok(found),
        }
    }

    /// Plan the selection and claim the pod `uid` for it (the cache shows its entries erased).
    async fn plan_and_claim(
        &self,
        located: &Located,
        uid: String,
        call: &Call<'_>,
    ) -> Result<Claim<'_>, Failure> {
        let (selection, erased) = self.plan_selection(located, call)?;
        Ok(self
            .claims
            .claim(
                self.cache.as_deref(),
                uid,
                located.pod(),
                selection,
                ANNOTATION_VGPU_DEVICES_TO_ALLOCATE,
                erased,
            )
            .await)
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
        counts: &mut Counts,
    ) -> Result<v1beta1::AllocateResponse, Failure> {
        let key = pod_key(located.pod());
        let Claim {
            selection,
            erased,
            guard,
        } = claim;
        let Selection { plans, done } = selection;
        let disk = self.write_files(plans);
        // The node lock, read while the files are written (off the critical path) when this
        // attempt does not know it yet.
        let lock_task = async {
            if !read_lock {
                return None;
            }
            let mut trips = LocateTrips::default();
            Some(node_lock(self.client(), self.node_name(), &mut trips).await)
        }
        .instrument(tracing::debug_span!("node_get"));
        let (disk, lock_read) = tokio::join!(disk, lock_task);
        if let Some(lock) = lock_read {
            counts.api_round_trips += 1;
            if let Err(failure) = lock
                .map_err(|e| self.lookup_failure(&e))
                .and_then(|lock| Self::apply_lock(located, lock))
            {
                if let Ok((_, Ok(written))) = &disk {
                    written.iter().for_each(Written::undo);
                }
                guard.settle(false);
                return Err(failure);
            }
        }
        let (plans, outcome) = match disk {
            Ok(finished) => finished,
            Err(e) => {
                guard.settle(false);
                let message = format!("allocation failed for pod {key}: disk task failed: {e}");
                return Err(Failure::new(Status::internal, message));
            }
        };
        let written = match outcome {
            Ok(done) => done,
            Err(failure) => {
                self.metrics.observe_publish_failure();
                guard.settle(false);
                return Err(failure);
            }
        };
        counts.api_round_trips += 1;
        if let Err(failure) = self.patch_selection(located, &key, erased, done).await {
            written.iter().for_each(Written::undo);
            guard.settle(false);
            return Err(failure);
        }
        guard.settle(true);
        Ok(self.allocated(located, &key, &plans, done, counts).await)
    }

    /// Phase 2a, started at once on a blocking thread (its spans reported where this call
    /// reports them): what the answer depends on at the time of the call (as HAMi stats it),
    /// then each plan's directories and limits file; on a disk error, what was written is
    /// removed again. The future waits for it.
    fn write_files(
        &self,
        plans: Vec<AllocationPlan>,
    ) -> impl Future<Output = Result<WrittenPlans, tokio::task::JoinError>> + use<> {
        let disk_span = tracing::debug_span!("disk");
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        let license = self.settings.license_path();
        let vgpu_dir = self.settings.vgpu_dir();
        let task = {
            let disk_span = disk_span.clone();
            tokio::task::spawn_blocking(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    disk_span.in_scope(|| {
                        let host = probe_host(&license);
                        let plans: Vec<AllocationPlan> = plans
                            .into_iter()
                            .map(|p| p.with_host(&host, &vgpu_dir))
                            .collect();
                        let mut written: Vec<Written> = Vec::new();
                        for plan in &plans {
                            match execute_plan(plan) {
                                Ok(w) => written.push(w),
                                Err(e) => {
                                    written.iter().for_each(Written::undo);
                                    let failure = Failure::disk(&plan.pod, &plan.container, &e);
                                    return (plans, Err(failure));
                                }
                            }
                        }
                        (plans, Ok(written))
                    })
                })
            })
        };
        async move {
            let disk = task.await;
            drop(disk_span);
            disk
        }
    }

    /// Phase 2b: the merge patch that erases the selected entries (and sets `bind-phase:
    /// success` when `done`), with the pod's `resourceVersion`. A 409 or 404 is a `stale`
    /// failure.
    async fn patch_selection(
        &self,
        located: &Located,
        key: &str,
        erased: String,
        done: bool,
    ) -> Result<(), Failure> {
        let mut annotations = serde_json::json!({ ANNOTATION_VGPU_DEVICES_TO_ALLOCATE: erased });
        if done {
            annotations[ANNOTATION_BIND_PHASE] = BIND_PHASE_SUCCESS.into();
        }
        let patched = self
            .api
            .patch_annotations(located.pod(), annotations, true)
            .instrument(tracing::debug_span!("patch_pod"))
            .await;
        let Err(e) = patched else { return Ok(()) };
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
        Err(failure)
    }

    /// Phase 2c, once the pod is patched: the log, the node lock released when no entry is left,
    /// each plan's warnings as Events, the metrics; the answer to kubelet.
    async fn allocated(
        &self,
        located: &Located,
        key: &str,
        plans: &[AllocationPlan],
        done: bool,
        counts: &mut Counts,
    ) -> v1beta1::AllocateResponse {
        for plan in plans {
            tracing::info!(
                pod = %key,
                container = %plan.container,
                devices = %plan.devices.iter().map(|d| d.uuid.as_str()).collect::<Vec<_>>().join(","),
                delivery = %plan.delivery.mode,
                delivery_source = %plan.delivery.source,
                limits_file = %plan.limits_file.as_ref().map(|f| f.path().display().to_string()).unwrap_or_default(),
                mig = plan.mig,
                "container allocated"
            );
        }
        if done && let Some(lock) = &located.lock {
            counts.api_round_trips += 1;
            if let Err(error) = self
                .api
                .release_lock(lock)
                .instrument(tracing::debug_span!("release_lock"))
                .await
            {
                // The pod is allocated; a stale lock expires after 5 minutes.
                tracing::error!(%error, node = %self.node_name(), "cannot release the node lock");
            }
        }
        for warning in plans.iter().flat_map(|p| p.warnings.iter()) {
            tracing::warn!(pod = %key, reason = warning.reason(), "{warning}");
            counts.api_round_trips += 1;
            self.api
                .warn(located.pod(), warning.reason(), &warning.to_string())
                .await;
        }
        let published = plans.iter().filter(|p| p.limits_file.is_some()).count();
        self.metrics.observe_published(published as u64);
        for plan in plans {
            self.metrics
                .observe_delivery(plan.delivery.mode, plan.delivery.source);
        }
        v1beta1::AllocateResponse {
            container_responses: plans.iter().map(AllocationPlan::response).collect(),
        }
    }

    /// One `Allocate` call, in an `allocate` span: select, execute, and redo the selection while
    /// the pod read was stale (at most [`MAX_SELECT_ATTEMPTS`] times); then the failure path
    /// when it failed.
    pub async fn allocate(&self, call: Call<'_>) -> Result<v1beta1::AllocateResponse, Status> {
        let span = tracing::debug_span!(
            ALLOCATE_SPAN,
            node = %self.node_name(),
            from_cache = tracing::field::Empty,
            retries = tracing::field::Empty,
            api_round_trips = tracing::field::Empty,
            ok = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let mut counts = Counts::default();
        let (result, outcome) = self
            .attempts(&call, &mut counts)
            .instrument(span.clone())
            .await;
        span.record("from_cache", counts.from_cache);
        span.record("retries", counts.retries);
        span.record("api_round_trips", counts.api_round_trips);
        span.record("ok", result.is_ok());
        self.metrics.observe_allocate(outcome, started.elapsed());
        result
    }

    async fn attempts(
        &self,
        call: &Call<'_>,
        counts: &mut Counts,
    ) -> (Result<v1beta1::AllocateResponse, Status>, AllocateOutcome) {
        let mut trips = LocateTrips::default();
        // The node lock: unknown on the first attempt (read while the files are written, and the
        // attempt redone if it names another pod), then as last read.
        let mut known_lock: Option<Option<String>> = None;
        let mut outcome = AllocateOutcome::Failed;
        let mut attempt = 1;
        let result = loop {
            let lock = known_lock.as_ref().and_then(|l| l.as_deref());
            let chosen = self.choose(lock, call, attempt, counts, &mut trips).await;
            let (mut located, claim) = match chosen {
                Err((o, status)) => {
                    outcome = o;
                    break Err(status);
                }
                Ok(chosen) => chosen,
            };
            let read_lock = known_lock.is_none();
            let executed = match claim {
                Ok(claim) => self.execute(&mut located, claim, read_lock, counts).await,
                // Nothing written; the node lock is still needed (which pod; what to release).
                Err(failure) if read_lock => {
                    let mut trips = LocateTrips::default();
                    counts.api_round_trips += 1;
                    let lock = node_lock(self.client(), self.node_name(), &mut trips)
                        .instrument(tracing::debug_span!("node_get"))
                        .await;
                    match lock {
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
                    tracing::debug!(pod = %pod_key(located.pod()), attempt, from_cache = counts.from_cache, error = %message, "selection redone");
                    self.metrics.observe_stale_pod_retry();
                    counts.retries += 1;
                    attempt += 1;
                    if let Some(lock) = lock_read {
                        known_lock = Some(lock);
                    }
                }
                executed => {
                    self.metrics.observe_pod_lookup(counts.from_cache);
                    break match executed {
                        Ok(response) => Ok(response),
                        Err(failure) => Err(self.fail(&located, failure, counts).await),
                    };
                }
            }
        };
        counts.api_round_trips += trips.node_gets + trips.pod_gets + trips.pod_lists;
        if result.is_ok() {
            outcome = AllocateOutcome::Success;
        }
        (result, outcome)
    }
}

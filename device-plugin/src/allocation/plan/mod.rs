//! The pure allocation plan: from the pod, the container's entry of
//! `hami.io/vgpu-devices-to-allocate` and the resolved settings to what `Allocate` answers (envs,
//! mounts) and what must be on disk first (the per-container directory and, in `file` mode, the
//! limits file). No I/O here or below: the executor and `hami-device-plugin plan` both call it.
//!
//! - [`codec`]: `hami.io/vgpu-devices-to-allocate`, decoded and encoded as HAMi does;
//! - [`pod`]: what makes a pod the one being allocated, and its annotations;
//! - [`device_list`]: how the container learns its devices (device list and ID strategies,
//!   device specs, CDI, GDS/MOFED/GDRCopy, IMEX), under HAMi's setting names;
//! - [`container_response`]: the mounts and device specs the plan and the MIG handler build;
//! - [`spec_guard`]: what a GPU container's own spec may not do;
//! - [`entry_check`]: the scheduler's entry against the node's GPUs.

pub mod codec;
pub mod container_response;
pub mod device_list;
pub mod entry_check;
pub mod pod;
pub mod spec_guard;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hami_config::{NodeConfigEntry, NvidiaConfig};
use hami_shared::container::{
    ContainerKey, ContainerKeyError, LimitsBuilder, PlanWarning, SpecEnv, SpecValue, spec_value,
};
use hami_shared::limits_file::LimitsFileError;
use hami_shared::names::{
    ANNOTATION_LIMIT_DELIVERY, CONTAINERS_DIR, ENV_CUDA_DEVICE_SM_LIMIT, ENV_CUDA_DISABLE_CONTROL,
    LD_SO_PRELOAD_FILE, LD_SO_PRELOAD_PATH, LIBHAMI_PRELOAD_SO, LIBVGPU_SO, OVERRIDE_ENV_PATH,
    USAGE_CACHE_FILE, VGPU_DIR, VGPU_LOCK_PATH, memory_limit_env,
};
use hami_shared::values::{
    CorePolicy, DeliverySource, LimitDelivery, MemoryLimitMib, SmLimit, resolve_limit_delivery,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use self::codec::{ContainerDevice, ContainerSlot, PodDevices};
use self::container_response::mount;
pub use self::container_response::{PlannedDeviceSpec, PlannedMount};
use self::device_list::{DeviceListError, DeviceListSettings, NodeDevices};
use self::entry_check::EntryError;
use self::pod::annotation;
use self::spec_guard::{GuardInput, GuardSettings, SpecRefusal};

/// Settings the plan depends on (the node's resolved device config).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationSettings {
    /// `HOOK_PATH`: where HAMi-core lives on the host and in the container (`/usr/local`).
    pub hook_path: PathBuf,
    /// `deviceMemoryScaling`: above 1 the container gets `CUDA_OVERSUBSCRIBE=true`.
    pub memory_scaling: f64,
    /// `disableCoreLimit`: the container gets `GPU_CORE_UTILIZATION_POLICY=disable`.
    pub disable_core_limit: bool,
    /// `libCudaLogLevel` 0..=4 (node entry over global; the config loader refuses other values),
    /// passed as `LIBCUDA_LOG_LEVEL`.
    pub lib_cuda_log_level: Option<u8>,
    /// `limitdelivery` of the node's entry in `config.json`.
    pub node_delivery: Option<LimitDelivery>,
    /// `nvidia.limitDelivery` in the global device config.
    pub global_delivery: Option<LimitDelivery>,
    /// How the container learns its devices (`DEVICE_LIST_STRATEGY`, `DEVICE_ID_STRATEGY`,
    /// `PASS_DEVICE_SPECS`, GDS/MOFED/GDRCopy, IMEX), parsed at start.
    pub device_list: DeviceListSettings,
    /// The node's devices (index, device nodes) by UUID, from the device table at start; needed
    /// only by `DEVICE_ID_STRATEGY=index` and `PASS_DEVICE_SPECS=true`.
    pub node_devices: NodeDevices,
    /// `deviceCoreScaling`: a GPU registers 100 × this many cores (the entry check's bound).
    pub core_scaling: f64,
    /// `deviceSplitCount` (the dry run's entry check; `run` takes it from the device table).
    pub split_count: u32,
    /// What a GPU container's own spec may not do ([`spec_guard`]), and the operator's escape
    /// hatches.
    pub guard: GuardSettings,
}

impl Default for AllocationSettings {
    /// The settings of the built-in device config at the default hook path.
    fn default() -> Self {
        Self::for_node(
            &NvidiaConfig::default(),
            None,
            Path::new(hami_shared::names::DEFAULT_HOOK_PATH),
        )
    }
}

impl AllocationSettings {
    /// The settings of a node, the one way they are built: `nvidia` is the global section with
    /// the node's entry applied (`NvidiaConfig::with_node`, which leaves `limitDelivery` as the
    /// global section has it), `node` that entry (for its `limitdelivery`). The device list and
    /// the node's devices come from the flags and the device table: the caller sets them.
    pub fn for_node(
        nvidia: &NvidiaConfig,
        node: Option<&NodeConfigEntry>,
        hook_path: &Path,
    ) -> Self {
        Self {
            hook_path: hook_path.to_path_buf(),
            memory_scaling: nvidia.plugin.device_memory_scaling,
            disable_core_limit: nvidia.plugin.disable_core_limit,
            lib_cuda_log_level: nvidia.plugin.lib_cuda_log_level,
            node_delivery: node.and_then(|n| n.limit_delivery),
            global_delivery: nvidia.plugin.limit_delivery,
            device_list: DeviceListSettings::default(),
            node_devices: NodeDevices::default(),
            core_scaling: nvidia.plugin.device_core_scaling,
            split_count: nvidia.plugin.device_split_count,
            guard: GuardSettings {
                priority_resource: nvidia.admission.resource_priority_name.clone(),
                core_policy: nvidia.admission.gpu_core_policy,
                ..GuardSettings::default()
            },
        }
    }

    /// `<hook>/vgpu`.
    pub fn vgpu_dir(&self) -> PathBuf {
        self.hook_path.join(VGPU_DIR)
    }

    /// `<hook>/vgpu/containers`: per-container directories and limits files.
    pub fn containers_dir(&self) -> PathBuf {
        self.vgpu_dir().join(CONTAINERS_DIR)
    }

    /// `<hook>/vgpu/license`: when it exists, HAMi also mounts it and `vgpuvalidator`.
    pub fn license_path(&self) -> PathBuf {
        self.vgpu_dir().join(VGPU_LICENSE)
    }

    /// The host file mounted as `libvgpu.so`: `libvgpu.so.<version>` when `versioned_exists`
    /// (HAMi's `GetLibPath` prefers the file of the plugin's own version), else `libvgpu.so`.
    pub fn libvgpu_host_path(&self, version: &str, versioned_exists: bool) -> PathBuf {
        if versioned_exists {
            self.vgpu_dir().join(format!("{LIBVGPU_SO}.{version}"))
        } else {
            self.vgpu_dir().join(LIBVGPU_SO)
        }
    }
}

/// The limits file to publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedFile {
    /// The containers directory it is published into.
    pub dir: PathBuf,
    /// `<podUID>_<container>.limits`.
    pub file_name: String,
    /// The exact bytes (rendered [`LimitsFile`]).
    pub text: String,
}

impl PlannedFile {
    /// `dir/file_name`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file_name)
    }
}

/// How limits reach HAMi-core for this container, and which setting decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedDelivery {
    /// `file` or `env`.
    #[serde(serialize_with = "as_display")]
    pub mode: LimitDelivery,
    /// `pod-annotation`, `node-config`, `global-config` or `default`.
    #[serde(serialize_with = "as_display")]
    pub source: DeliverySource,
}

fn as_display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Everything one container gets.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationPlan {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The pod's UID (validated: a UUID).
    pub pod_uid: String,
    /// The container's name (validated: a DNS-1123 label).
    pub container: String,
    /// Which container of the spec.
    pub slot: ContainerSlot,
    /// Index of its entry in `hami.io/vgpu-devices-to-allocate`.
    pub entry: usize,
    /// The scheduler's devices for it.
    pub devices: Vec<ContainerDevice>,
    /// Static MIG devices: no HAMi-core variables, no file, no mounts.
    pub mig: bool,
    /// Delivery mode and its source (also reported for MIG, where it changes nothing).
    pub delivery: PlannedDelivery,
    /// Environment variables of the answer.
    pub envs: BTreeMap<String, String>,
    /// Mounts of the answer, in order.
    pub mounts: Vec<PlannedMount>,
    /// Device nodes of the answer (`PASS_DEVICE_SPECS`).
    pub device_specs: Vec<PlannedDeviceSpec>,
    /// Container annotations of the answer (`cdi-annotations`).
    pub annotations: BTreeMap<String, String>,
    /// CDI devices of the answer (`cdi-cri`).
    pub cdi_devices: Vec<String>,
    /// The per-container directory to (re)create (absent for MIG).
    pub container_dir: Option<PathBuf>,
    /// The limits file (file mode only).
    pub limits_file: Option<PlannedFile>,
    /// Things an operator should know (an invalid `hami.io/limit-delivery`, a spec value left
    /// out of the limits file).
    pub warnings: Vec<AllocationWarning>,
}

/// Something an operator should know about a plan; never an error (the container still gets its
/// caps). Shown as a log line and an Event whose reason is [`Self::reason`]; serialized (the dry
/// run) as its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocationWarning {
    /// The pod's `hami.io/limit-delivery` is not a delivery mode; the node or global setting is
    /// used instead.
    InvalidLimitDelivery {
        /// The annotation's value.
        value: String,
        /// The mode used instead.
        used: LimitDelivery,
        /// Which setting decided it.
        source: DeliverySource,
    },
    /// The limits-file builder left a spec value out.
    Limits(PlanWarning),
}

impl AllocationWarning {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidLimitDelivery { .. } => "InvalidLimitDelivery",
            Self::Limits(_) => "LimitsFileValueSkipped",
        }
    }
}

impl std::fmt::Display for AllocationWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidLimitDelivery {
                value,
                used,
                source,
            } => write!(
                f,
                "invalid {ANNOTATION_LIMIT_DELIVERY}={value:?} (accepted: {}); using {used} from {source}",
                LimitDelivery::ACCEPTED
            ),
            Self::Limits(w) => w.fmt(f),
        }
    }
}

impl Serialize for AllocationWarning {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a container cannot be planned; every variant names the pod.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The pod has no UID, or it is not a UUID.
    #[error("pod {pod}: UID {uid:?} is not a UUID; refusing to build a host path from it")]
    InvalidPodUid {
        /// `namespace/name`.
        pod: String,
        /// The UID.
        uid: String,
    },
    /// The container name is not a DNS-1123 label.
    #[error(
        "pod {pod}: container name {name:?} is not a DNS-1123 label; refusing to build a host path from it"
    )]
    InvalidContainerName {
        /// `namespace/name`.
        pod: String,
        /// The name.
        name: String,
    },
    /// The entry names a container the spec does not have.
    #[error(
        "pod {pod}: entry {entry} of hami.io/vgpu-devices-to-allocate names {slot:?}, which the pod does not have"
    )]
    NoSuchContainer {
        /// `namespace/name`.
        pod: String,
        /// The entry.
        entry: usize,
        /// The slot.
        slot: ContainerSlot,
    },
    /// The entry has no device.
    #[error("pod {pod}: entry {entry} of hami.io/vgpu-devices-to-allocate has no NVIDIA device")]
    NoDevices {
        /// `namespace/name`.
        pod: String,
        /// The entry.
        entry: usize,
    },
    /// kubelet asked for a different number of devices than the scheduler assigned.
    #[error(
        "pod {pod}: container {container} was assigned {assigned} device(s) by the scheduler but kubelet requests {requested}"
    )]
    DeviceCountMismatch {
        /// `namespace/name`.
        pod: String,
        /// Container name.
        container: String,
        /// Devices in the annotation.
        assigned: usize,
        /// Device IDs in the request.
        requested: usize,
    },
    /// A value HAMi-core would misread (zero memory means unlimited), or a key it never reads.
    #[error("pod {pod}: container {container}: {source}")]
    Value {
        /// `namespace/name`.
        pod: String,
        /// Container name.
        container: String,
        /// The refused entry.
        source: LimitsFileError,
    },
    /// The device list cannot be built (a device the setting needs the node's data for).
    #[error("pod {pod}: container {container}: {source}")]
    DeviceList {
        /// `namespace/name`.
        pod: String,
        /// Container name.
        container: String,
        /// What is missing.
        source: DeviceListError,
    },
    /// The container's own spec would replace, hide or undo what the device plugin grants
    /// (mounts, privilege, HAMi-core's variables): refused whether or not the webhook saw the pod.
    #[error(
        "pod {pod}: container {container:?} refused: {}",
        join_refusals(refusals)
    )]
    Refused {
        /// `namespace/name`.
        pod: String,
        /// Container name.
        container: String,
        /// Every refusal, in spec order (at least one).
        refusals: Vec<SpecRefusal>,
    },
    /// The scheduler's entry cannot have come from HAMi's scheduler for this node.
    #[error("pod {pod}: hami.io/vgpu-devices-to-allocate refused: {source}")]
    Entry {
        /// `namespace/name`.
        pod: String,
        /// What does not fit the node.
        source: EntryError,
    },
    /// The device annotation is malformed.
    #[error("pod {pod}: hami.io/vgpu-devices-to-allocate: {source}")]
    Codec {
        /// `namespace/name`.
        pod: String,
        /// The decoding error.
        source: self::codec::CodecError,
    },
}

fn join_refusals(refusals: &[SpecRefusal]) -> String {
    refusals
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl PlanError {
    /// The reason of the Warning Event on the pod.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused { refusals, .. } => refusals
                .first()
                .map_or("GpuContainerRefused", SpecRefusal::reason),
            Self::Entry { .. } => "GpuEntryRefused",
            _ => "AllocationFailed",
        }
    }
}

/// `namespace/name`.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The container of a slot.
pub fn container_of(pod: &Pod, slot: ContainerSlot) -> Option<&Container> {
    let spec = pod.spec.as_ref()?;
    match slot {
        ContainerSlot::Init(i) => spec.init_containers.as_ref()?.get(i),
        ContainerSlot::App(i) => spec.containers.get(i),
    }
}

/// Number of init containers.
pub fn init_count(pod: &Pod) -> usize {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map_or(0, Vec::len)
}

/// True for a static MIG device ID (`MIG-...`, HAMi checks `strings.Contains(id, "MIG")`).
pub fn is_mig_device(uuid: &str) -> bool {
    uuid.contains("MIG")
}

/// The preload pair, always mounted together (never one without the other): `/etc/ld.so.preload`
/// ← `<hook>/vgpu/ld.so.preload`, which names `<hook>/vgpu/libhami_preload.so` first (it loads
/// `/overrideEnv` into the environment before `main`) and `<hook>/vgpu/libvgpu.so` second; and
/// that preload library itself, bound file by file at the same path because the container sees
/// `<hook>/vgpu` as its per-container directory (as for `libvgpu.so`). Both read-only. A
/// container whose `/etc/ld.so.preload` named a library it does not have would get a loader
/// error in every process; one with the library but no list would never load it.
pub fn preload_mounts(vgpu_dir: &Path) -> [PlannedMount; 2] {
    let library = vgpu_dir.join(LIBHAMI_PRELOAD_SO);
    [
        mount(LD_SO_PRELOAD_PATH, &vgpu_dir.join(LD_SO_PRELOAD_FILE), true),
        mount(library.display().to_string(), &library, true),
    ]
}

/// Plans the container of entry `entry` with `devices` (the entry's NVIDIA devices).
///
/// `requested` is the number of device IDs kubelet asked for (checked against the scheduler's
/// assignment; `None` in the dry run). `libvgpu_host` is the host file mounted as `libvgpu.so`
/// ([`AllocationSettings::libvgpu_host_path`]).
///
/// Phases: which container ([`Target::identify`]), the delivery mode, the device list
/// ([`device_list::answer`]: envs, `volume-mounts` mounts, device specs, CDI annotations and
/// devices, as HAMi's `getAllocateResponse`), then — not for static MIG — HAMi-core's variables
/// ([`hami_core_limits`]) and mounts ([`hami_core_mounts`]). What depends on the host at the
/// time of the call (optional device nodes, HAMi's license files) is applied by
/// [`AllocationPlan::with_host`].
pub fn plan_container(
    pod: &Pod,
    entry: usize,
    devices: &[ContainerDevice],
    requested: Option<usize>,
    settings: &AllocationSettings,
    libvgpu_host: &Path,
) -> Result<AllocationPlan, PlanError> {
    let target = Target::identify(pod, entry, devices, requested)?;
    let mig = devices.iter().any(|d| is_mig_device(&d.uuid));
    let spec_env = spec_env(target.container);
    let preload = !control_disabled(&spec_env);
    let refusals = spec_guard::check(
        &GuardInput {
            namespace: pod.metadata.namespace.as_deref().unwrap_or("default"),
            slot: target.slot,
            container: target.container,
            vgpu_dir: &settings.vgpu_dir(),
            mig,
            preload,
        },
        &settings.guard,
    );
    if !refusals.is_empty() {
        return Err(PlanError::Refused {
            pod: target.pod,
            container: target.name,
            refusals,
        });
    }
    let mut warnings = Vec::new();
    let delivery = resolve_delivery(pod, settings, &mut warnings);
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    let list = device_list::answer(
        &settings.device_list,
        &settings.node_devices,
        &uuids,
        target.key.pod_uid(),
    )
    .map_err(|source| PlanError::DeviceList {
        pod: target.pod.clone(),
        container: target.name.clone(),
        source,
    })?;
    let mut plan = AllocationPlan {
        pod: target.pod.clone(),
        pod_uid: target.key.pod_uid().to_owned(),
        container: target.name.clone(),
        slot: target.slot,
        entry,
        devices: devices.to_vec(),
        mig,
        delivery,
        envs: list.envs,
        mounts: list.mounts,
        device_specs: list.device_specs,
        annotations: list.annotations,
        cdi_devices: list.cdi_devices,
        container_dir: None,
        limits_file: None,
        warnings,
    };
    if mig {
        // Static MIG: the device list only; no HAMi-core variables, no file, no mounts.
        return Ok(plan);
    }
    let limits = hami_core_limits(&target, devices, settings, &spec_env, &mut plan)?;
    hami_core_mounts(
        &target,
        settings,
        libvgpu_host,
        &spec_env,
        limits,
        &mut plan,
    );
    Ok(plan)
}

/// The container an entry is for, checked before anything is built from it.
struct Target<'a> {
    /// `namespace/name`.
    pod: String,
    slot: ContainerSlot,
    container: &'a Container,
    name: String,
    /// Pod UID and container name, validated (they become host paths).
    key: ContainerKey,
}

impl<'a> Target<'a> {
    /// The entry's container, its validated key, and the device count kubelet asked for.
    fn identify(
        pod: &'a Pod,
        entry: usize,
        devices: &[ContainerDevice],
        requested: Option<usize>,
    ) -> Result<Self, PlanError> {
        let key = pod_key(pod);
        let slot = ContainerSlot::of_entry(entry, init_count(pod));
        let container = container_of(pod, slot).ok_or_else(|| PlanError::NoSuchContainer {
            pod: key.clone(),
            entry,
            slot,
        })?;
        let name = container.name.clone();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let container_key = ContainerKey::new(&uid, &name).map_err(|e| match e {
            ContainerKeyError::ContainerName { name } => PlanError::InvalidContainerName {
                pod: key.clone(),
                name,
            },
            ContainerKeyError::PodUid { uid } => PlanError::InvalidPodUid {
                pod: key.clone(),
                uid,
            },
        })?;
        if devices.is_empty() {
            return Err(PlanError::NoDevices { pod: key, entry });
        }
        if let Some(requested) = requested
            && requested != devices.len()
        {
            return Err(PlanError::DeviceCountMismatch {
                pod: key,
                container: name,
                assigned: devices.len(),
                requested,
            });
        }
        Ok(Self {
            pod: key,
            slot,
            container,
            name,
            key: container_key,
        })
    }

    fn value_err(&self, source: LimitsFileError) -> PlanError {
        PlanError::Value {
            pod: self.pod.clone(),
            container: self.name.clone(),
            source,
        }
    }
}

/// The delivery mode and its source; an invalid pod annotation becomes a warning.
fn resolve_delivery(
    pod: &Pod,
    settings: &AllocationSettings,
    warnings: &mut Vec<AllocationWarning>,
) -> PlannedDelivery {
    let resolved = resolve_limit_delivery(
        annotation(pod, ANNOTATION_LIMIT_DELIVERY),
        settings.node_delivery,
        settings.global_delivery,
    );
    if let Some(bad) = &resolved.invalid_annotation {
        warnings.push(AllocationWarning::InvalidLimitDelivery {
            value: bad.clone(),
            used: resolved.delivery,
            source: resolved.source,
        });
    }
    PlannedDelivery {
        mode: resolved.delivery,
        source: resolved.source,
    }
}

/// Whether the container's literal env sets `CUDA_DISABLE_CONTROL` true (HAMi then mounts no
/// preload list); only reached in a namespace allowed to set it.
fn control_disabled(spec_env: &[SpecEnv<'_>]) -> bool {
    matches!(
        spec_value(spec_env, ENV_CUDA_DISABLE_CONTROL),
        SpecValue::Literal(v) if device_list::settings::go_bool(v) == Some(true)
    )
}

/// The container's env entries in spec order (`valueFrom` has no literal value).
fn spec_env(container: &Container) -> Vec<SpecEnv<'_>> {
    container
        .env
        .iter()
        .flatten()
        .map(|e| SpecEnv {
            name: &e.name,
            value: if e.value_from.is_some() {
                None
            } else {
                e.value.as_deref()
            },
        })
        .collect()
}

/// The variables HAMi-core reads, through the contract's builder (the webhook builds KAI
/// containers' files with it too), so that the environment and the file never disagree: added
/// to `plan.envs` (both modes); returns the limits file's content, which also carries what is
/// copied from the spec (the container already has it in its environment).
fn hami_core_limits(
    target: &Target<'_>,
    devices: &[ContainerDevice],
    settings: &AllocationSettings,
    spec_env: &[SpecEnv<'_>],
    plan: &mut AllocationPlan,
) -> Result<hami_shared::limits_file::LimitsFile, PlanError> {
    let value_err = |source| target.value_err(source);
    let mut builder = LimitsBuilder::new(target.key.container());
    for (i, d) in devices.iter().enumerate() {
        let mem = MemoryLimitMib::new(d.memory_mib).map_err(|e| {
            value_err(LimitsFileError::UnsafeValue {
                key: memory_limit_env(i),
                value: d.memory_mib.to_string(),
                reason: e.to_string(),
            })
        })?;
        builder.memory_limit(Some(i), mem).map_err(value_err)?;
    }
    // HAMi: the cores of the first device.
    let cores = devices.first().map_or(0, |d| d.cores);
    let sm = SmLimit::new(cores).map_err(|e| {
        value_err(LimitsFileError::UnsafeValue {
            key: ENV_CUDA_DEVICE_SM_LIMIT.to_owned(),
            value: cores.to_string(),
            reason: e.to_string(),
        })
    })?;
    builder.sm_limit(sm);
    builder
        .shared_cache(
            &settings
                .vgpu_dir()
                .join(USAGE_CACHE_FILE)
                .display()
                .to_string(),
        )
        .map_err(value_err)?;
    if settings.memory_scaling > 1.0 {
        builder.oversubscribe();
    }
    if let Some(level) = settings.lib_cuda_log_level {
        builder.log_level(level).map_err(value_err)?;
    }
    if settings.disable_core_limit {
        builder.core_policy(CorePolicy::Disable);
    }
    let (injected, _) = builder.clone().finish();
    plan.envs.extend(
        injected
            .iter()
            .filter(|(k, _)| *k != hami_shared::names::ENV_HAMI_LIMITS_FORMAT)
            .map(|(k, v)| (k.to_owned(), v.to_string())),
    );
    builder.copy_from_spec(spec_env);
    let (limits, copy_warnings) = builder.finish();
    plan.warnings
        .extend(copy_warnings.into_iter().map(AllocationWarning::Limits));
    Ok(limits)
}

/// HAMi-core's mounts, after the device list's, in order: `<hook>/vgpu/libvgpu.so` (RO),
/// `<hook>/vgpu` ← the per-container directory (RW), `/tmp/vgpulock` (RW), the preload pair
/// ([`preload_mounts`]: `/etc/ld.so.preload` and `<hook>/vgpu/libhami_preload.so`, RO) unless the
/// container's literal env sets `CUDA_DISABLE_CONTROL` true, and in `file` mode `/overrideEnv`
/// (RO); plus the per-container directory and the limits file to create.
fn hami_core_mounts(
    target: &Target<'_>,
    settings: &AllocationSettings,
    libvgpu_host: &Path,
    spec_env: &[SpecEnv<'_>],
    limits: hami_shared::limits_file::LimitsFile,
    plan: &mut AllocationPlan,
) {
    let vgpu_dir = settings.vgpu_dir();
    let containers_dir = settings.containers_dir();
    let container_dir = containers_dir.join(target.key.dir_name());
    plan.mounts.extend([
        mount(
            vgpu_dir.join(LIBVGPU_SO).display().to_string(),
            libvgpu_host,
            true,
        ),
        mount(vgpu_dir.display().to_string(), &container_dir, false),
        mount(VGPU_LOCK_PATH, Path::new(VGPU_LOCK_PATH), false),
    ]);
    if !control_disabled(spec_env) {
        plan.mounts.extend(preload_mounts(&vgpu_dir));
    }
    if plan.delivery.mode == LimitDelivery::File {
        let file = PlannedFile {
            dir: containers_dir,
            file_name: target.key.limits_file_name(),
            text: limits.render(),
        };
        plan.mounts
            .push(mount(OVERRIDE_ENV_PATH, &file.path(), true));
        plan.limits_file = Some(file);
    }
    plan.container_dir = Some(container_dir);
}

/// Plans every container with a pending NVIDIA entry, in the order kubelet would allocate them
/// (the dry run: no device count to check).
pub fn plan_pod(
    pod: &Pod,
    settings: &AllocationSettings,
    libvgpu_host: &Path,
) -> Result<Vec<AllocationPlan>, PlanError> {
    let key = pod_key(pod);
    let Some(value) = annotation(pod, hami_shared::names::ANNOTATION_VGPU_DEVICES_TO_ALLOCATE)
    else {
        return Ok(Vec::new());
    };
    let mut devices =
        PodDevices::decode(value).map_err(|source| PlanError::Codec { pod: key, source })?;
    let mut plans = Vec::new();
    while let Some((entry, wanted)) = devices.next_request() {
        plans.push(plan_container(
            pod,
            entry,
            &wanted,
            None,
            settings,
            libvgpu_host,
        )?);
        devices.erase_nvidia(entry);
    }
    Ok(plans)
}

impl AllocationPlan {
    /// The kubelet answer for this container.
    pub fn response(&self) -> crate::kubelet::api::v1beta1::ContainerAllocateResponse {
        crate::kubelet::api::v1beta1::ContainerAllocateResponse {
            envs: self.envs.clone().into_iter().collect(),
            mounts: self.mounts.iter().map(PlannedMount::to_api).collect(),
            devices: self
                .device_specs
                .iter()
                .map(PlannedDeviceSpec::to_api)
                .collect(),
            annotations: self.annotations.clone().into_iter().collect(),
            cdi_devices: self
                .cdi_devices
                .iter()
                .map(|name| crate::kubelet::api::v1beta1::CdiDevice { name: name.clone() })
                .collect(),
        }
    }

    /// Applies what the host holds at the time of the call (HAMi stats both at every
    /// `Allocate`): an optional device node that does not exist is dropped (`apiDeviceSpecs`),
    /// and when `<hook>/vgpu/license` exists, HAMi's license pair is mounted read-only —
    /// `/tmp/license` ← `<hook>/vgpu/license` and `/usr/bin/vgpuvalidator` ←
    /// `<hook>/vgpu/vgpuvalidator` (not for static MIG, as in HAMi).
    #[must_use]
    pub fn with_host(mut self, host: &HostProbe, vgpu_dir: &Path) -> Self {
        self.device_specs
            .retain(|d| !d.optional || host.device_nodes.contains(&d.container_path));
        if host.license && !self.mig {
            self.mounts.extend([
                mount(LICENSE_CONTAINER_PATH, &vgpu_dir.join(VGPU_LICENSE), true),
                mount(
                    VGPU_VALIDATOR_CONTAINER_PATH,
                    &vgpu_dir.join(VGPU_VALIDATOR),
                    true,
                ),
            ]);
        }
        self
    }
}

/// `<hook>/vgpu/license` (HAMi's `Allocate`, server.go).
pub const VGPU_LICENSE: &str = "license";
/// Where the license is mounted.
pub const LICENSE_CONTAINER_PATH: &str = "/tmp/license";
/// `<hook>/vgpu/vgpuvalidator`, mounted with the license.
pub const VGPU_VALIDATOR: &str = "vgpuvalidator";
/// Where `vgpuvalidator` is mounted.
pub const VGPU_VALIDATOR_CONTAINER_PATH: &str = "/usr/bin/vgpuvalidator";

/// What the host held when the call was made, probed by the shell
/// ([`crate::allocation::shell::executor::disk::probe_host`]) and applied by
/// [`AllocationPlan::with_host`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostProbe {
    /// `<hook>/vgpu/license` exists.
    pub license: bool,
    /// The optional device nodes that exist
    /// ([`crate::allocation::plan::device_list::CONTROL_DEVICE_NODES`]).
    pub device_nodes: BTreeSet<String>,
}

//! Every well-known name in one place: annotation keys, node labels, environment variables, paths.
//!
//! Both programs and the chart must spell these identically; a typo in one copy would silently
//! disconnect the webhook, the scheduler and the device plugin from each other.

// The names the preload library itself reads are declared in `hami-preload-core` (a `no_std`
// crate the library is built from) and re-exported here, so each is spelled once.
pub use hami_preload_core::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, ENV_CUDA_DEVICE_SM_LIMIT,
    ENV_CUDA_OVERSUBSCRIBE, ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_HAMI_GPU_FRACTION, ENV_HAMI_LIMITS_FORMAT, ENV_HAMI_NODE_GPUS, ENV_HAMI_NODE_GPUS_FORMAT,
    ENV_LIBCUDA_LOG_LEVEL, ENV_LIBVGPU_HOSTPID_BROKER, LIMITS_FORMAT_VERSION, MAX_DEVICE_INDEX,
    MAX_GPU_MINOR, NODE_GPUS_FILE, NODE_GPUS_FORMAT_VERSION, NVIDIA_DEVICE_MAJOR,
    OVERRIDE_ENV_PATH,
};

// ---------------------------------------------------------------------------------------------
// The limits file's own keys that only `hami-limits check` reads
// ---------------------------------------------------------------------------------------------

/// Limits-file key of a KAI `gpu-fraction` container admitted **without** a GPU memory cap
/// (`kai.missingBasis: warn`, file delivery): the reason, as the `reason` label of
/// `hami_webhook_kai_fraction_caps_skipped_total`, one of [`UNCAPPED_REASONS`]. No program acts on
/// it (the file holds no memory limit, so the preload library leaves the environment untouched);
/// it is there so that `hami-limits check /overrideEnv` inside the container says so.
pub const ENV_HAMI_UNCAPPED: &str = "HAMI_UNCAPPED";
/// [`ENV_HAMI_UNCAPPED`] reason: neither `kai.perGpuVramMib` nor a node watch (nor `--nodes`).
pub const UNCAPPED_NO_SOURCE: &str = "no-source";
/// [`ENV_HAMI_UNCAPPED`] reason: the webhook had not read the GPU node list yet.
pub const UNCAPPED_NOT_SYNCED: &str = "not-synced";
/// [`ENV_HAMI_UNCAPPED`] reason: no GPU node the pod can land on has a usable
/// `nvidia.com/gpu.memory` label.
pub const UNCAPPED_NO_MATCHING_NODE: &str = "no-matching-node";
/// Every [`ENV_HAMI_UNCAPPED`] reason.
pub const UNCAPPED_REASONS: [&str; 3] = [
    UNCAPPED_NO_SOURCE,
    UNCAPPED_NOT_SYNCED,
    UNCAPPED_NO_MATCHING_NODE,
];

// ---------------------------------------------------------------------------------------------
// Pod annotations (HAMi)
// ---------------------------------------------------------------------------------------------

/// Per-pod switch `env` | `file` (see [`crate::values::LimitDelivery`]).
pub const ANNOTATION_LIMIT_DELIVERY: &str = "hami.io/limit-delivery";
/// Node the HAMi scheduler chose (also set as a label).
pub const ANNOTATION_VGPU_NODE: &str = "hami.io/vgpu-node";
/// Scheduling time written by the HAMi scheduler.
pub const ANNOTATION_VGPU_TIME: &str = "hami.io/vgpu-time";
/// Devices still to be handed out by `Allocate`; entries are erased as containers are served.
pub const ANNOTATION_VGPU_DEVICES_TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";
/// Devices allocated to the pod (same encoding; never erased).
pub const ANNOTATION_VGPU_DEVICES_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
/// `allocating` | `success` | `failed`.
pub const ANNOTATION_BIND_PHASE: &str = "hami.io/bind-phase";
/// Unix seconds of the bind.
pub const ANNOTATION_BIND_TIME: &str = "hami.io/bind-time";
/// The MIG placements the HAMi scheduler reserved (JSON; the device plugin fills in the MIG UUIDs).
pub const ANNOTATION_VGPU_MIG_ALLOCATIONS: &str = "hami.io/vgpu-mig-allocations";
/// The pod label the HAMi scheduler sets beside [`ANNOTATION_VGPU_NODE`], to the same node name.
pub const LABEL_VGPU_NODE: &str = ANNOTATION_VGPU_NODE;
/// Every pod annotation the HAMi scheduler writes (and the device plugin updates): what the
/// device plugin's `Allocate` trusts, so no one else may set them.
pub const SCHEDULER_OWNED_ANNOTATIONS: [&str; 7] = [
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    ANNOTATION_VGPU_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
];
/// Every pod label the HAMi scheduler writes.
pub const SCHEDULER_OWNED_LABELS: [&str; 1] = [LABEL_VGPU_NODE];

/// Values of [`ANNOTATION_BIND_PHASE`].
pub const BIND_PHASE_ALLOCATING: &str = "allocating";
/// Values of [`ANNOTATION_BIND_PHASE`].
pub const BIND_PHASE_SUCCESS: &str = "success";
/// Values of [`ANNOTATION_BIND_PHASE`].
pub const BIND_PHASE_FAILED: &str = "failed";

// ---------------------------------------------------------------------------------------------
// Node annotations (HAMi)
// ---------------------------------------------------------------------------------------------

/// Node lock: `<RFC3339 time>,<namespace>,<pod>` (legacy: a bare time).
pub const ANNOTATION_MUTEX_LOCK: &str = "hami.io/mutex.lock";
/// Device registration for the scheduler (JSON array).
pub const ANNOTATION_NODE_NVIDIA_REGISTER: &str = "hami.io/node-nvidia-register";
/// Handshake annotation the scheduler writes and ages itself.
pub const ANNOTATION_NODE_HANDSHAKE: &str = "hami.io/node-handshake";

// ---------------------------------------------------------------------------------------------
// KAI annotations and labels
// ---------------------------------------------------------------------------------------------

/// KAI: GPU memory in MiB (positive decimal integer, no suffix).
pub const ANNOTATION_GPU_MEMORY: &str = "gpu-memory";
/// KAI: fraction of one GPU, 0 < f < 1.
pub const ANNOTATION_GPU_FRACTION: &str = "gpu-fraction";
/// KAI: number of devices a fraction applies to.
pub const ANNOTATION_GPU_FRACTION_NUM_DEVICES: &str = "gpu-fraction-num-devices";
/// KAI: which container gets the fractional GPU.
pub const ANNOTATION_GPU_FRACTION_CONTAINER_NAME: &str = "gpu-fraction-container-name";
/// KAI-resource-isolator opt-out annotation (`"false"`, case-insensitive).
pub const ANNOTATION_KAI_RESOURCE_ISOLATOR_INJECT: &str = "kai-resource-isolator.io/inject";
/// KAI-resource-isolator opt-out label (`ignore`).
pub const LABEL_KAI_RESOURCE_ISOLATOR_WEBHOOK: &str = "kai-resource-isolator.io/webhook";
/// KAI: the prefix of the fraction container's ConfigMaps (`<prefix>-<index>`, and
/// `<prefix>-<index>-evar` for its `envFrom`); KAI's admission sets it when the pod has none.
pub const ANNOTATION_KAI_SHARED_GPU_CONFIGMAP: &str = "runai/shared-gpu-configmap";
/// KAI queue label.
pub const LABEL_KAI_QUEUE: &str = "kai.scheduler/queue";
/// KAI's default scheduler name.
pub const KAI_SCHEDULER_NAME: &str = "kai-scheduler";
/// The namespace where KAI's binder creates its GPU reservation pods (KAI v0.17's default).
pub const KAI_RESERVATION_NAMESPACE: &str = "kai-resource-reservation";

// ---------------------------------------------------------------------------------------------
// Node labels (GPU Feature Discovery / GPU Operator) and webhook opt-out
// ---------------------------------------------------------------------------------------------

/// Integer MiB per GPU (very old GFD wrote bytes: values >= 1,048,576 are bytes).
pub const LABEL_GPU_MEMORY: &str = "nvidia.com/gpu.memory";
/// Sanitised product name.
pub const LABEL_GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Number of GPUs on the node.
pub const LABEL_GPU_COUNT: &str = "nvidia.com/gpu.count";
/// `none` | `single` | `mixed`.
pub const LABEL_MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
/// Set by the GPU Operator on GPU nodes.
pub const LABEL_GPU_PRESENT: &str = "nvidia.com/gpu.present";
/// HAMi's webhook opt-out label (value `ignore`) on objects and namespaces.
pub const LABEL_WEBHOOK: &str = "hami.io/webhook";
/// Value of [`LABEL_WEBHOOK`] that excludes an object.
pub const LABEL_WEBHOOK_IGNORE: &str = "ignore";

// ---------------------------------------------------------------------------------------------
// Environment variables read by HAMi-core (and set by the device plugin / webhook)
// ---------------------------------------------------------------------------------------------

/// `true` disables the `/etc/ld.so.preload` mount for a container.
pub const ENV_CUDA_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// HAMi-core: the library its `dlsym` hook resolves `cu*` symbols from (default its own
/// `/usr/local/vgpu/libvgpu.so`); another library there bypasses its CUDA hooks.
pub const ENV_CUDA_REDIRECT: &str = "CUDA_REDIRECT";
/// HAMi-core: `true`/`false`/`1`/`0`, read at start (stored, not acted on by HAMi-core `8f3a89c`).
pub const ENV_ACTIVE_OOM_KILLER: &str = "ACTIVE_OOM_KILLER";
/// HAMi-core: seconds between two records of the last kernel launch in the shared region (what
/// HAMi's monitor reads to tell a busy task from an idle one).
pub const ENV_RECORD_KERNEL_INTERVAL: &str = "RECORD_KERNEL_INTERVAL";
/// Comma-separated GPU UUIDs for the NVIDIA container runtime.
pub const ENV_NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// `CUDA_DEVICE_MEMORY_LIMIT_<i>`: the per-device memory limit variable.
pub fn memory_limit_env(i: usize) -> String {
    format!("{ENV_CUDA_DEVICE_MEMORY_LIMIT}_{i}")
}

// ---------------------------------------------------------------------------------------------
// Environment variables of the programs' own settings
// ---------------------------------------------------------------------------------------------
//
// Each declared here once: the clap `env = ...` attributes and the loaders name these constants.
// `HAMI_LOG_FORMAT`, read by every program, is `hami_ops::ENV_LOG_FORMAT`, beside `LogFormat`.
// The `HAMI_<SECTION>__<KEY>` variables of the layered loader are derived from the keys
// ([`CONFIG_ENV_PREFIX`], [`CONFIG_ENV_SEPARATOR`]); only those a deprecated name maps to are here.

/// `hami-device-plugin --config`: HAMi's `device-config.yaml`.
pub const ENV_HAMI_DEVICE_CONFIG: &str = "HAMI_DEVICE_CONFIG";
/// `hami-device-plugin --node-config`: HAMi's `config.json`.
pub const ENV_HAMI_NODE_CONFIG: &str = "HAMI_NODE_CONFIG";
/// `hami-device-plugin --node-name` / `plan --node`: this node (downward API `spec.nodeName`).
pub const ENV_HAMI_NODE_NAME: &str = "HAMI_NODE_NAME";
/// `hami-device-plugin --hook-path`: HAMi-core's directory on the host and in the container.
pub const ENV_HAMI_HOOK_PATH: &str = "HAMI_HOOK_PATH";
/// `hami-device-plugin --inventory`: a YAML list of GPUs instead of NVML.
pub const ENV_HAMI_INVENTORY: &str = "HAMI_INVENTORY";
/// `hami-device-plugin --enable-numa-topology`.
pub const ENV_HAMI_ENABLE_NUMA_TOPOLOGY: &str = "HAMI_ENABLE_NUMA_TOPOLOGY";
/// `hami-device-plugin run --kubelet-dir`.
pub const ENV_HAMI_KUBELET_DIR: &str = "HAMI_KUBELET_DIR";
/// `hami-device-plugin run --register-interval`.
pub const ENV_HAMI_REGISTER_INTERVAL: &str = "HAMI_REGISTER_INTERVAL";
/// `hami-device-plugin run --register-retry`.
pub const ENV_HAMI_REGISTER_RETRY: &str = "HAMI_REGISTER_RETRY";
/// `hami-device-plugin run --kubelet-watch-interval-ms`.
pub const ENV_HAMI_KUBELET_WATCH_INTERVAL_MS: &str = "HAMI_KUBELET_WATCH_INTERVAL_MS";
/// `hami-device-plugin run --skip-node-register`.
pub const ENV_HAMI_SKIP_NODE_REGISTER: &str = "HAMI_SKIP_NODE_REGISTER";
/// `hami-device-plugin run --metrics-listen`.
pub const ENV_HAMI_METRICS_LISTEN: &str = "HAMI_METRICS_LISTEN";
/// `hami-device-plugin run --collect-interval`.
pub const ENV_HAMI_COLLECT_INTERVAL: &str = "HAMI_COLLECT_INTERVAL";
/// `hami-device-plugin run --collect-grace`.
pub const ENV_HAMI_COLLECT_GRACE: &str = "HAMI_COLLECT_GRACE";
/// `hami-device-plugin run|plan --allow-privileged-namespaces`.
pub const ENV_HAMI_ALLOW_PRIVILEGED_NAMESPACES: &str = "HAMI_ALLOW_PRIVILEGED_NAMESPACES";
/// `hami-device-plugin run|plan --allow-hami-core-env-namespaces`.
pub const ENV_HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES: &str = "HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES";
/// `hami-webhook --config`: the webhook's settings file.
pub const ENV_HAMI_WEBHOOK_CONFIG: &str = "HAMI_WEBHOOK_CONFIG";
/// The webhook's `kai.perGpuVramMib` in the layered loader's form.
pub const ENV_HAMI_KAI_PER_GPU_VRAM_MIB: &str = "HAMI_KAI__PER_GPU_VRAM_MIB";
/// The webhook's `server.logFormat` in the layered loader's form.
pub const ENV_HAMI_SERVER_LOG_FORMAT: &str = "HAMI_SERVER__LOGFORMAT";

/// HAMi's name of [`ENV_HAMI_NODE_NAME`] (deprecated here).
pub const ENV_NODE_NAME: &str = "NODE_NAME";
/// HAMi's name of [`ENV_HAMI_HOOK_PATH`] (deprecated here).
pub const ENV_HOOK_PATH: &str = "HOOK_PATH";
/// The webhook's first name of [`ENV_HAMI_KAI_PER_GPU_VRAM_MIB`] (deprecated).
pub const ENV_PER_GPU_VRAM_MIB: &str = "PER_GPU_VRAM_MIB";
/// HAMi's device plugin: the NVIDIA CDI hook (`nvidia-cdi-hook`), its first name.
pub const ENV_NVIDIA_CDI_HOOK_PATH: &str = "NVIDIA_CDI_HOOK_PATH";
/// HAMi's second name of [`ENV_NVIDIA_CDI_HOOK_PATH`] (`EnvVars` of HAMi's `main.go`).
pub const ENV_NVIDIA_CTK_PATH: &str = "NVIDIA_CTK_PATH";
/// HAMi's device plugin: where the driver root is in the plugin's container, its first name.
pub const ENV_DRIVER_ROOT_CTR_PATH: &str = "DRIVER_ROOT_CTR_PATH";
/// HAMi's second name of [`ENV_DRIVER_ROOT_CTR_PATH`].
pub const ENV_CONTAINER_DRIVER_ROOT: &str = "CONTAINER_DRIVER_ROOT";

/// The program that reads a renamed environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `hami-webhook` (the layered loader maps the old name onto the new one).
    Webhook,
    /// `hami-device-plugin` (the old name fills what the flag and the new name leave open).
    DevicePlugin,
}

/// An environment name that still works, with the name to use instead. The old name is read only
/// when the new one is not set, with a deprecation notice ([`Self::notice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenamedEnv {
    /// The old name.
    pub old: &'static str,
    /// The name to use.
    pub new: &'static str,
    /// Who reads it.
    pub program: Program,
}

impl RenamedEnv {
    /// The notice logged when the old name supplied the value.
    #[must_use]
    pub fn notice(&self) -> String {
        format!("{} is deprecated: use {}", self.old, self.new)
    }

    /// The notice logged when both names are set (the new one wins).
    #[must_use]
    pub fn ignored_notice(&self) -> String {
        format!(
            "{} is deprecated and ignored: {} is set",
            self.old, self.new
        )
    }
}

/// `NODE_NAME` → `HAMI_NODE_NAME` (HAMi's DaemonSet sets the old name).
pub const RENAMED_NODE_NAME: RenamedEnv = RenamedEnv {
    old: ENV_NODE_NAME,
    new: ENV_HAMI_NODE_NAME,
    program: Program::DevicePlugin,
};
/// `HOOK_PATH` → `HAMI_HOOK_PATH`.
pub const RENAMED_HOOK_PATH: RenamedEnv = RenamedEnv {
    old: ENV_HOOK_PATH,
    new: ENV_HAMI_HOOK_PATH,
    program: Program::DevicePlugin,
};
/// `NVIDIA_CTK_PATH` → `NVIDIA_CDI_HOOK_PATH` (HAMi's own second name).
pub const RENAMED_NVIDIA_CTK_PATH: RenamedEnv = RenamedEnv {
    old: ENV_NVIDIA_CTK_PATH,
    new: ENV_NVIDIA_CDI_HOOK_PATH,
    program: Program::DevicePlugin,
};
/// `CONTAINER_DRIVER_ROOT` → `DRIVER_ROOT_CTR_PATH` (HAMi's own second name).
pub const RENAMED_CONTAINER_DRIVER_ROOT: RenamedEnv = RenamedEnv {
    old: ENV_CONTAINER_DRIVER_ROOT,
    new: ENV_DRIVER_ROOT_CTR_PATH,
    program: Program::DevicePlugin,
};
/// `PER_GPU_VRAM_MIB` → `HAMI_KAI__PER_GPU_VRAM_MIB`.
pub const RENAMED_PER_GPU_VRAM_MIB: RenamedEnv = RenamedEnv {
    old: ENV_PER_GPU_VRAM_MIB,
    new: ENV_HAMI_KAI_PER_GPU_VRAM_MIB,
    program: Program::Webhook,
};

/// Every renamed environment variable of both programs: the one table.
pub static DEPRECATED_ENV: [RenamedEnv; 5] = [
    RENAMED_NODE_NAME,
    RENAMED_HOOK_PATH,
    RENAMED_NVIDIA_CTK_PATH,
    RENAMED_CONTAINER_DRIVER_ROOT,
    RENAMED_PER_GPU_VRAM_MIB,
];

/// The renamed variables `program` reads.
pub fn deprecated_env(program: Program) -> impl Iterator<Item = &'static RenamedEnv> {
    DEPRECATED_ENV.iter().filter(move |r| r.program == program)
}

// ---------------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------------

/// Default `HOOK_PATH` on the host (the chart's value).
pub const HOOK_PATH: &str = "/usr/local";
/// Default `HOOK_PATH`, alias naming it as a default.
pub const DEFAULT_HOOK_PATH: &str = HOOK_PATH;
/// `<HOOK_PATH>/vgpu`.
pub const VGPU_DIR: &str = "vgpu";
/// `<HOOK_PATH>/vgpu/containers`: per-container directories and `.limits` files.
pub const CONTAINERS_DIR: &str = "containers";
/// Extension of a limits file on the host.
pub const LIMITS_FILE_SUFFIX: &str = ".limits";
/// Stable shared-cache file name inside the per-container directory.
pub const USAGE_CACHE_FILE: &str = "usage.cache";
/// HAMi-core library file name under `<HOOK_PATH>/vgpu`.
pub const LIBVGPU_SO: &str = "libvgpu.so";
/// The hami-limits preload library under `<HOOK_PATH>/vgpu` (loads `/overrideEnv` before `main`).
pub const LIBHAMI_PRELOAD_SO: &str = "libhami_preload.so";
/// Preload list file name under `<HOOK_PATH>/vgpu`.
pub const LD_SO_PRELOAD_FILE: &str = "ld.so.preload";
/// Container path of the preload list.
pub const LD_SO_PRELOAD_PATH: &str = "/etc/ld.so.preload";
/// Lock directory shared with HAMi-core (compiled into it; host-wide: every HAMi-core container
/// of the node binds the host's).
pub const VGPU_LOCK_PATH: &str = "/tmp/vgpulock";
/// The file in [`VGPU_LOCK_PATH`] that HAMi-core (`utils.c` `try_lock_unified_lock`, called
/// before 2026-02) opens `O_CREAT|O_RDWR` and `flock`s; the plugin pre-creates it.
pub const VGPU_LOCK_FILE: &str = "lock";
/// HAMi-core's fallback shared cache (a process with no environment ends up here today).
pub const DEFAULT_SHARED_CACHE_PATH: &str = "/tmp/cudevshr.cache";
/// Kubelet device plugin directory.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Kubelet registration socket file name.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Socket file name for `nvidia.com/gpu`.
pub const NVIDIA_GPU_SOCKET: &str = "nvidia-gpu.sock";
/// The extended resource that brings HAMi-core into a KAI container: the webhook requests one
/// per preloaded container (`kai.hookDelivery: device-plugin`), and the hook installer serves it
/// as a kubelet device plugin whose `Allocate` mounts the hook folder's files read-only.
pub const RESOURCE_PRELOAD: &str = "hami.io/preload";
/// Folder of `HOOK` (beside `HOOK/vgpu`, never inside it: a `hostPath` delivery mounts all of
/// `HOOK/vgpu` into KAI pods) holding one region folder per `hami.io/preload` slot.
pub const REGIONS_DIR: &str = "regions";
/// Where a KAI container gets its slot's region folder (read-write); the webhook points
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` at `usage.cache` in it.
pub const KAI_REGION_DIR: &str = "/var/lib/hami-limits/region";
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` of a KAI container with a slot folder.
pub const KAI_SHARED_CACHE: &str = "/var/lib/hami-limits/region/usage.cache";
/// Prefix of the webhook's annotations holding a KAI container's limits file
/// (`limits.hami.io/<container>`).
pub const ANNOTATION_LIMITS_PREFIX: &str = "limits.hami.io/";
/// Socket file name of the `hami.io/preload` device plugin.
pub const PRELOAD_SOCKET: &str = "hami-preload.sock";

// ---------------------------------------------------------------------------------------------
// Resource names (HAMi chart defaults)
// ---------------------------------------------------------------------------------------------

/// Default `resourceCountName`.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Default `resourceMemoryName`.
pub const RESOURCE_GPU_MEM: &str = "nvidia.com/gpumem";
/// Default `resourceMemoryPercentageName`.
pub const RESOURCE_GPU_MEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// Default `resourceCoreName`.
pub const RESOURCE_GPU_CORES: &str = "nvidia.com/gpucores";
/// Default `resourcePriorityName`.
pub const RESOURCE_PRIORITY: &str = "nvidia.com/priority";

/// HAMi's default scheduler name.
pub const HAMI_SCHEDULER_NAME: &str = "hami-scheduler";

/// Prefix of environment variables that override configuration (`HAMI_NVIDIA__LIMIT_DELIVERY`...).
pub const CONFIG_ENV_PREFIX: &str = "HAMI";
/// Separator between nested configuration keys in environment variables.
pub const CONFIG_ENV_SEPARATOR: &str = "__";

/// Host path of a container's limits file: `<hook>/vgpu/containers/<podUID>_<container>.limits`.
///
/// Callers validate the pod UID and container name first; this only joins.
pub fn limits_file_name(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}_{container}{LIMITS_FILE_SUFFIX}")
}

/// Name of a container's per-container directory under `<hook>/vgpu/containers`.
pub fn container_dir_name(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}_{container}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renamed_variables_by_program() {
        let plugin: Vec<&str> = deprecated_env(Program::DevicePlugin)
            .map(|r| r.old)
            .collect();
        assert_eq!(
            plugin,
            [
                "NODE_NAME",
                "HOOK_PATH",
                "NVIDIA_CTK_PATH",
                "CONTAINER_DRIVER_ROOT"
            ]
        );
        let webhook: Vec<&str> = deprecated_env(Program::Webhook).map(|r| r.new).collect();
        assert_eq!(webhook, ["HAMI_KAI__PER_GPU_VRAM_MIB"]);
        assert_eq!(
            RENAMED_NODE_NAME.notice(),
            "NODE_NAME is deprecated: use HAMI_NODE_NAME"
        );
    }

    #[test]
    fn per_device_names() {
        assert_eq!(memory_limit_env(0), "CUDA_DEVICE_MEMORY_LIMIT_0");
        assert_eq!(memory_limit_env(15), "CUDA_DEVICE_MEMORY_LIMIT_15");
        assert_eq!(limits_file_name("u", "c"), "u_c.limits");
    }
}

//! The names the preload library reads: HAMi-core's variables, the limits file's own keys, the
//! node GPU file's keys and paths. `hami_shared::names` re-exports every one of them; nothing else
//! spells them.

// ---------------------------------------------------------------------------------------------
// Environment variables read by HAMi-core (and set by the device plugin / webhook)
// ---------------------------------------------------------------------------------------------

/// Global memory limit (per-device `_<i>` wins).
pub const ENV_CUDA_DEVICE_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// Core (SM) limit in percent; 0 or unset means 100.
pub const ENV_CUDA_DEVICE_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// Path of the shared region where a pod's processes account usage.
pub const ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// Set by HAMi when memory scaling > 1 (not read by current HAMi-core).
pub const ENV_CUDA_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// `default` | `force` | `disable`.
pub const ENV_GPU_CORE_UTILIZATION_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// HAMi-core log level 0..4 (read before the limits file).
pub const ENV_LIBCUDA_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Enabled by `"1"`.
pub const ENV_LIBVGPU_HOSTPID_BROKER: &str = "LIBVGPU_HOSTPID_BROKER";
/// Integer (`atoi`), default 1; lower is higher priority.
pub const ENV_CUDA_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";

/// Highest device index HAMi-core reads for `CUDA_DEVICE_MEMORY_LIMIT_<i>` (0..=15).
pub const MAX_DEVICE_INDEX: usize = 15;

// ---------------------------------------------------------------------------------------------
// The limits file's own keys (never exported to the environment)
// ---------------------------------------------------------------------------------------------

/// Format version line of the limits file.
pub const ENV_HAMI_LIMITS_FORMAT: &str = "HAMI_LIMITS_FORMAT";
/// Current version of the limits file format (`HAMI_LIMITS_FORMAT=1`). Format 1 readers ignore
/// keys they do not know, so the optional keys below did not need a new version.
pub const LIMITS_FORMAT_VERSION: u32 = 1;
/// Optional limits-file key (KAI `gpu-fraction` pods, file delivery): the pod's validated
/// fraction, canonical decimal `0.<digits>` (1 to [`crate::fraction::MAX_PLACES`] places, the
/// last one not `0`). With [`ENV_HAMI_NODE_GPUS`], the preload library replaces the file's
/// admission-time `CUDA_DEVICE_MEMORY_LIMIT` by `floor(fraction × MiB)` of the GPUs the container
/// sees. HAMi-core and older preload libraries ignore it (not a variable they read).
pub const ENV_HAMI_GPU_FRACTION: &str = "HAMI_GPU_FRACTION";
/// Optional limits-file key beside [`ENV_HAMI_GPU_FRACTION`]: the container path of the node GPU
/// file (`<kai hook folder>/node-gpus`; the folder is mounted read-only at the same path).
pub const ENV_HAMI_NODE_GPUS: &str = "HAMI_NODE_GPUS";

// ---------------------------------------------------------------------------------------------
// The node GPU file
// ---------------------------------------------------------------------------------------------

/// File name of the node GPU file in a hook folder (`<hook>/vgpu/node-gpus`), published by
/// `hami-device-plugin install-hook` beside the libraries.
pub const NODE_GPUS_FILE: &str = "node-gpus";
/// Format version line of the node GPU file.
pub const ENV_HAMI_NODE_GPUS_FORMAT: &str = "HAMI_NODE_GPUS_FORMAT";
/// Current version of the node GPU file format. A reader ignores a file of another version.
pub const NODE_GPUS_FORMAT_VERSION: u32 = 1;
/// Character-device major number of `/dev/nvidia<minor>` (the NVIDIA driver's fixed major).
pub const NVIDIA_DEVICE_MAJOR: u32 = 195;
/// Highest GPU minor number (`/dev/nvidia255` is `/dev/nvidiactl`'s minor, never a GPU).
pub const MAX_GPU_MINOR: u32 = 254;

// ---------------------------------------------------------------------------------------------
// Paths and the preload library's own switches
// ---------------------------------------------------------------------------------------------

/// Where HAMi-core looks for the limits file inside a container (compiled into libvgpu.so).
pub const OVERRIDE_ENV_PATH: &str = "/overrideEnv";
/// Opt-in diagnostic: `HAMI_PRELOAD_DEBUG=1` makes the library print one line to stderr saying
/// what it did. Ignored in secure-execution mode (setuid/setgid programs, `AT_SECURE`).
pub const ENV_PRELOAD_DEBUG: &str = "HAMI_PRELOAD_DEBUG";
/// The most bytes of `/overrideEnv` the library reads. A real file is well under 1 KiB
/// (16 devices × ~35 bytes plus a few settings); a huge file costs no more than this.
pub const READ_LIMIT_BYTES: usize = 8 * 1024;
/// The most bytes of the node GPU file the library reads (16 GPUs × ~80 bytes is ~1.3 KiB).
pub const NODE_GPUS_READ_LIMIT_BYTES: usize = 4 * 1024;
/// The largest memory a node GPU file entry may state, in MiB (16 TiB).
pub const NODE_GPU_MAX_MIB: u64 = 16 * 1024 * 1024;
/// The longest GPU UUID a node GPU file entry may hold.
pub const NODE_GPU_MAX_UUID_LEN: usize = 64;
/// The longest `HAMI_NODE_GPUS` path the preload library opens (`PATH_MAX` less the NUL).
pub const NODE_GPUS_MAX_PATH_BYTES: usize = 4095;

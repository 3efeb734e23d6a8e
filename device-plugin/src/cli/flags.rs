//! The flags of the commands besides `run` and `inventory`, and the argument groups `run` and
//! `plan` share. Each is turned into the plain settings struct its command takes
//! (`From`), so that the domain never sees clap.

use std::path::PathBuf;

use clap::{ArgAction, Args};
use hami_shared::names::{self, DEFAULT_HOOK_PATH};

use crate::allocation::plan::device_list::settings::DeviceListArgs;
use crate::allocation::plan::spec_guard::GuardArgs;
use crate::commands::install_hook::InstallHookArgs;
use crate::commands::plan::PlanArgs;
use crate::commands::regions::RegionsArgs;
use crate::commands::serve_preload::ServePreloadArgs;
use crate::commands::serve_preload::plugin::DEFAULT_SLOTS;
use crate::kubelet::api;
use crate::regions::PidView;
use crate::regions::export::RegionArgs;

/// The device list flags of `run` and `plan`, with HAMi's flag and variable names. Values are
/// kept as given and parsed by [`DeviceListArgs::parse`], so that an error names the variable.
#[derive(Debug, Clone, Default, Args)]
pub struct DeviceListFlags {
    /// How the container runtime learns the devices: a comma-separated list of envvar,
    /// volume-mounts, cdi-annotations, cdi-cri (default envvar).
    #[arg(long = "device-list-strategy", env = "DEVICE_LIST_STRATEGY", value_name = "LIST", action = ArgAction::Append)]
    pub device_list_strategy: Vec<String>,
    /// How devices are named in the device list: uuid or index (default uuid).
    #[arg(
        long = "device-id-strategy",
        env = "DEVICE_ID_STRATEGY",
        value_name = "uuid|index"
    )]
    pub device_id_strategy: Option<String>,
    /// Pass the GPUs' device nodes (/dev/nvidia<minor>, /dev/nvidiactl, ...) to kubelet as
    /// DeviceSpecs (default false).
    #[arg(long = "pass-device-specs", env = "PASS_DEVICE_SPECS", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub pass_device_specs: Option<String>,
    /// The NVIDIA driver's root on the host (default /); the device nodes' root unless
    /// NVIDIA_DEV_ROOT is given.
    #[arg(
        long = "nvidia-driver-root",
        env = "NVIDIA_DRIVER_ROOT",
        value_name = "DIR"
    )]
    pub nvidia_driver_root: Option<String>,
    /// The root of the NVIDIA device nodes on the host (default NVIDIA_DRIVER_ROOT).
    #[arg(
        long = "dev-root",
        visible_alias = "nvidia-dev-root",
        env = "NVIDIA_DEV_ROOT",
        value_name = "DIR"
    )]
    pub dev_root: Option<String>,
    /// Where the driver root is mounted in this container (default /driver-root): where IMEX
    /// channels are looked for.
    #[arg(
        long = "driver-root-ctr-path",
        visible_alias = "container-driver-root",
        env = names::ENV_DRIVER_ROOT_CTR_PATH,
        value_name = "DIR"
    )]
    pub driver_root_ctr_path: Option<String>,
    /// Prefix of the CDI annotation keys (default cdi.k8s.io/).
    #[arg(
        long = "cdi-annotation-prefix",
        env = "CDI_ANNOTATION_PREFIX",
        value_name = "PREFIX"
    )]
    pub cdi_annotation_prefix: Option<String>,
    /// HAMi writes it into the CDI spec it generates; hami-device-plugin generates none, so it has
    /// no effect (generate the spec with nvidia-ctk cdi generate --nvidia-cdi-hook-path).
    #[arg(
        long = "nvidia-cdi-hook-path",
        visible_alias = "nvidia-ctk-path",
        env = names::ENV_NVIDIA_CDI_HOOK_PATH,
        value_name = "PATH"
    )]
    pub nvidia_cdi_hook_path: Option<String>,
    /// Containers get NVIDIA_GDRCOPY=enabled (CDI: nvidia.com/gdrcopy=all).
    #[arg(long = "gdrcopy-enabled", env = "GDRCOPY_ENABLED", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub gdrcopy_enabled: Option<String>,
    /// Containers get NVIDIA_GDS=enabled (CDI: nvidia.com/gds=all).
    #[arg(long = "gds-enabled", env = "GDS_ENABLED", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub gds_enabled: Option<String>,
    /// Containers get NVIDIA_MOFED=enabled (CDI: nvidia.com/mofed=all).
    #[arg(long = "mofed-enabled", env = "MOFED_ENABLED", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub mofed_enabled: Option<String>,
    /// IMEX channels to inject: empty or 0.
    #[arg(long = "imex-channel-ids", env = "IMEX_CHANNEL_IDS", value_name = "IDS", action = ArgAction::Append)]
    pub imex_channel_ids: Vec<String>,
    /// Refuse to start when a requested IMEX channel does not exist (default false: skip it).
    #[arg(long = "imex-required", env = "IMEX_REQUIRED", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub imex_required: Option<String>,
}

/// Namespaces exempt from parts of `Allocate`'s checks of a GPU container's own spec (default:
/// none). Shared by `run` and `plan`.
#[derive(Debug, Clone, Default, Args)]
pub struct GuardFlags {
    /// Namespaces (comma-separated) whose GPU containers may be privileged or add SYS_ADMIN.
    #[arg(
        long = "allow-privileged-namespaces",
        env = hami_shared::names::ENV_HAMI_ALLOW_PRIVILEGED_NAMESPACES,
        value_delimiter = ',',
        value_parser = namespace_name,
        value_name = "NS,..."
    )]
    pub allow_privileged_namespaces: Vec<String>,
    /// Namespaces (comma-separated) whose GPU containers may set HAMi-core's variables,
    /// CUDA_DISABLE_CONTROL, CUDA_TASK_PRIORITY and GPU_CORE_UTILIZATION_POLICY in their spec, as
    /// HAMi allows every pod.
    #[arg(
        long = "allow-hami-core-env-namespaces",
        env = hami_shared::names::ENV_HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES,
        value_delimiter = ',',
        value_parser = namespace_name,
        value_name = "NS,..."
    )]
    pub allow_hami_core_env_namespaces: Vec<String>,
}

/// `plan` flags.
#[derive(Debug, Clone, Args)]
pub struct PlanFlags {
    /// The pod, YAML or JSON (`kubectl get pod NAME -o yaml`).
    #[arg(long, value_name = "FILE")]
    pub pod: PathBuf,
    /// The node the pod is bound to (selects the node's entry of the node config).
    /// Required (flag or `HAMI_NODE_NAME`).
    #[arg(long, env = names::ENV_HAMI_NODE_NAME, value_name = "NODE")]
    pub node: Option<String>,
    /// Global HAMi device config (`device-config.yaml`, `nvidia:` section).
    #[arg(long = "config", env = names::ENV_HAMI_DEVICE_CONFIG, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Per-node config (`config.json` with `nodeconfig: [...]`).
    #[arg(long = "node-config", env = names::ENV_HAMI_NODE_CONFIG, value_name = "FILE")]
    pub node_config: Option<PathBuf>,
    /// HAMi-core's install directory (`<DIR>/vgpu/containers/...`).
    #[arg(long = "hook-path", env = names::ENV_HAMI_HOOK_PATH, default_value = hami_shared::names::DEFAULT_HOOK_PATH, value_name = "DIR")]
    pub hook_path: PathBuf,
    /// YAML list of GPUs instead of NVML (read only when a device list setting needs the
    /// node's GPUs: DEVICE_ID_STRATEGY=index, PASS_DEVICE_SPECS=true).
    #[arg(long, env = names::ENV_HAMI_INVENTORY, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// Also create the directories and publish the limits files, as `run` would.
    #[arg(long)]
    pub write: bool,
    /// How containers learn their devices, as for `run`.
    #[command(flatten)]
    pub device_list: DeviceListFlags,
    /// The namespaces exempt from parts of the spec checks, as for `run`.
    #[command(flatten)]
    pub guard: GuardFlags,
}

/// `install-hook` flags.
#[derive(Debug, Clone, Args)]
pub struct InstallHookFlags {
    /// Directory holding HAMi-core's library: exactly one of `libvgpu.so` or
    /// `libvgpu.so.<version>` (HAMi images since v2.5: `/k8s-vgpu/lib/nvidia/libvgpu.so.<version>`).
    /// Symbolic links to a regular file are followed; other files there (HAMi's own
    /// `ld.so.preload`) are ignored.
    #[arg(long = "hami-core-dir", value_name = "DIR")]
    pub hami_core_dir: PathBuf,
    /// The hami-limits preload library (`libhami_preload.so`), installed as
    /// `HOOK/vgpu/libhami_preload.so`.
    #[arg(long = "preload", value_name = "FILE")]
    pub preload: PathBuf,
    /// HAMi's hook path on the host, `HOOK` (the same value as `run --hook-path`): an absolute
    /// path without whitespace, `:` or `..`; the files go to `HOOK/vgpu/`.
    #[arg(long = "hook-path", env = names::ENV_HAMI_HOOK_PATH, default_value = DEFAULT_HOOK_PATH, value_name = "HOOK")]
    pub hook_path: PathBuf,
    /// YAML list of GPUs (the file `run --inventory` reads) for `HOOK/vgpu/node-gpus`, on a
    /// machine without NVIDIA GPUs; without it the GPUs come from NVML.
    #[arg(long = "inventory", env = names::ENV_HAMI_INVENTORY, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
}

/// `serve-preload` flags.
#[derive(Debug, Clone, Args)]
pub struct ServePreloadFlags {
    /// HAMi's hook path on the host, `HOOK` (the value `install-hook` was given): the files are
    /// mounted from `HOOK/vgpu/`, at the same paths in the container.
    #[arg(long = "hook-path", env = names::ENV_HAMI_HOOK_PATH, default_value = DEFAULT_HOOK_PATH, value_name = "HOOK")]
    pub hook_path: PathBuf,
    /// kubelet's device-plugin directory.
    #[arg(long = "kubelet-dir", env = names::ENV_HAMI_KUBELET_DIR, default_value = api::DEFAULT_KUBELET_DIR, value_name = "DIR")]
    pub kubelet_dir: PathBuf,
    /// How many containers of the node may hold `hami.io/preload` at once (1 to 100000).
    #[arg(long = "slots", default_value_t = DEFAULT_SLOTS, value_parser = clap::value_parser!(u32).range(1..=100_000), value_name = "N")]
    pub slots: u32,
    /// Give each container a region folder (`HOOK/regions/<slot>`, read-write at
    /// `/var/lib/hami-limits/region`) the node can read; `false`: none (the region stays in the
    /// container's `/tmp`, unseen).
    #[arg(long = "regions", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub regions: bool,
    /// Plain-HTTP address for `/healthz`, `/readyz` and `/metrics` (the regions' metrics); empty
    /// or `off` disables.
    #[arg(
        long = "metrics-listen",
        default_value = "off",
        value_name = "HOST:PORT"
    )]
    pub metrics_listen: String,
    /// kubelet's pod resources socket: which container holds which slot.
    #[arg(long = "pod-resources-socket", default_value = crate::regions::podresources::DEFAULT_SOCKET, value_name = "PATH")]
    pub pod_resources_socket: PathBuf,
    /// Read the KAI containers' limits files from their pods' annotations and raise Events on
    /// them, through the API server (in-cluster service account or `KUBECONFIG`; needs the node
    /// name).
    #[arg(long = "pod-api", default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub pod_api: bool,
    /// This node (for `--pod-api`).
    #[arg(long = "node-name", env = names::ENV_HAMI_NODE_NAME, value_name = "NAME")]
    pub node_name: Option<String>,
    /// The region exporter.
    #[command(flatten)]
    pub region_export: RegionExportFlags,
}

/// `regions` flags.
#[derive(Debug, Clone, Args)]
pub struct RegionsFlags {
    /// The hook path whose `vgpu/containers` folders are read (HOOK as for `run`).
    #[arg(long, env = "HAMI_HOOK_PATH", default_value = "/usr/local")]
    pub hook_path: PathBuf,
    /// The `node` label of the samples.
    #[arg(long, default_value = "")]
    pub node: String,
    /// A PodList (`kubectl get pods -o json`) naming the folders' pods by UID.
    #[arg(long)]
    pub pods: Option<PathBuf>,
    /// Whose PIDs a slot's host PID is checked against: `host` (this shell's `/proc`, for a shell
    /// on the node) or `none` (no `stale` verdict).
    #[arg(long, value_enum, default_value_t = PidView::Host)]
    pub pids: PidView,
}

/// The region exporter's flags (`run` and `serve-preload`).
#[derive(Debug, Clone, Args)]
pub struct RegionExportFlags {
    /// Seconds between two scans of the node's container regions (every folder); 0 turns the
    /// region exporter off.
    #[arg(
        long = "region-interval",
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub interval: f64,
    /// The most container folders one scrape reads (when the last scan is over 5 s old).
    #[arg(long = "region-scrape-files", default_value_t = 32, value_name = "N")]
    pub scrape_files: usize,
    /// The most milliseconds one scrape spends reading regions.
    #[arg(
        long = "region-scrape-budget-ms",
        default_value_t = 500,
        value_name = "MS"
    )]
    pub scrape_budget_ms: u64,
    /// Whose PIDs a region's slots are checked against for the `stale` verdict: `none`, or
    /// `host` (`/proc/<hostpid>`; only with `hostPID: true`).
    #[arg(
        long = "region-pids",
        value_enum,
        default_value = "none",
        value_name = "VIEW"
    )]
    pub pids: PidView,
}

/// A namespace name (a DNS-1123 label), as an allow-list entry.
fn namespace_name(s: &str) -> Result<String, NamespaceNameError> {
    let s = s.trim();
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(NamespaceNameError(s.to_owned()))
    }
}

/// An allow-list entry that is not a namespace name.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not a namespace name (a DNS-1123 label: at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit)"
)]
pub struct NamespaceNameError(String);

impl clap::ValueEnum for PidView {
    fn value_variants<'a>() -> &'a [Self] {
        &[Self::None, Self::Host]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(match self {
            Self::None => "none",
            Self::Host => "host",
        }))
    }
}

impl From<DeviceListFlags> for DeviceListArgs {
    fn from(f: DeviceListFlags) -> Self {
        Self {
            device_list_strategy: f.device_list_strategy,
            device_id_strategy: f.device_id_strategy,
            pass_device_specs: f.pass_device_specs,
            nvidia_driver_root: f.nvidia_driver_root,
            dev_root: f.dev_root,
            driver_root_ctr_path: f.driver_root_ctr_path,
            cdi_annotation_prefix: f.cdi_annotation_prefix,
            nvidia_cdi_hook_path: f.nvidia_cdi_hook_path,
            gdrcopy_enabled: f.gdrcopy_enabled,
            gds_enabled: f.gds_enabled,
            mofed_enabled: f.mofed_enabled,
            imex_channel_ids: f.imex_channel_ids,
            imex_required: f.imex_required,
        }
    }
}

impl From<GuardFlags> for GuardArgs {
    fn from(f: GuardFlags) -> Self {
        Self {
            allow_privileged_namespaces: f.allow_privileged_namespaces,
            allow_hami_core_env_namespaces: f.allow_hami_core_env_namespaces,
        }
    }
}

impl From<PlanFlags> for PlanArgs {
    fn from(f: PlanFlags) -> Self {
        Self {
            pod: f.pod,
            node: f.node,
            config: f.config,
            node_config: f.node_config,
            hook_path: f.hook_path,
            inventory: f.inventory,
            write: f.write,
            device_list: f.device_list.into(),
            guard: f.guard.into(),
        }
    }
}

impl From<InstallHookFlags> for InstallHookArgs {
    fn from(f: InstallHookFlags) -> Self {
        Self {
            hami_core_dir: f.hami_core_dir,
            preload: f.preload,
            hook_path: f.hook_path,
            inventory: f.inventory,
        }
    }
}

impl From<RegionExportFlags> for RegionArgs {
    fn from(f: RegionExportFlags) -> Self {
        Self {
            interval: f.interval,
            scrape_files: f.scrape_files,
            scrape_budget_ms: f.scrape_budget_ms,
            pids: f.pids,
        }
    }
}

impl From<ServePreloadFlags> for ServePreloadArgs {
    fn from(f: ServePreloadFlags) -> Self {
        Self {
            hook_path: f.hook_path,
            kubelet_dir: f.kubelet_dir,
            slots: f.slots,
            regions: f.regions,
            metrics_listen: f.metrics_listen,
            pod_resources_socket: f.pod_resources_socket,
            pod_api: f.pod_api,
            node_name: f.node_name,
            region_export: f.region_export.into(),
        }
    }
}

impl From<RegionsFlags> for RegionsArgs {
    fn from(f: RegionsFlags) -> Self {
        Self {
            hook_path: f.hook_path,
            node: f.node,
            pods: f.pods,
            pids: f.pids,
        }
    }
}

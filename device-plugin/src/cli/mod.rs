//! The command line: every flag of every command, and nothing else. Each command's flags turn
//! into the plain struct its code takes ([`flags`]: `PlanFlags` into `commands::plan::PlanArgs`,
//! ...), so that no module below reads clap; `run` and `inventory` hand theirs to
//! [`crate::app`], the composition root.
//!
//! Every flag keeps its HAMi name and help text, so that an operator coming from HAMi finds it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
pub use hami_ops::LogFormat;
use hami_shared::names;

use crate::allocation::plan::device_list::settings::go_bool;
use crate::kubelet::api;

mod flags;
pub use flags::{
    DeviceListFlags, GuardFlags, InstallHookFlags, NamespaceNameError, PlanFlags,
    RegionExportFlags, RegionsFlags, ServePreloadFlags,
};

/// hami-device-plugin: kubelet device plugin for GPUs shared through HAMi-core.
#[derive(Debug, Parser)]
#[command(name = "hami-device-plugin", version, about)]
pub struct Cli {
    /// Log format on stderr: `text` for people, `json` (one object per line) for log collectors.
    #[arg(long = "log-format", env = hami_ops::ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A parsed command line and the deprecation notices of the environment names it used.
#[derive(Debug)]
pub struct Parsed {
    /// The command line.
    pub cli: Cli,
    /// One notice per deprecated environment name that supplied a value (the caller logs them).
    pub deprecations: Vec<String>,
}

impl Cli {
    /// Parses a command line (the program name first), for callers without `clap` in scope.
    /// clap reads the variables of the `env = ...` attributes; the deprecated names of
    /// [`names::deprecated_env`] (`Program::DevicePlugin`) are looked up through `old_env`, which
    /// the composition root (`main.rs`) gives the process environment. The old name still works,
    /// with a deprecation notice, when neither the new name nor the flag is given (HAMi's own
    /// DaemonSet sets the old names).
    pub fn parse_with_env<I, T>(
        args: I,
        old_env: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Parsed, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Self::command().try_get_matches_from(args)?;
        let mut cli = Self::from_arg_matches(&matches)?;
        let mut deprecations = Vec::new();
        if let Some((_, sub)) = matches.subcommand() {
            let mut fallback = |renamed: names::RenamedEnv| {
                let value = old_env(renamed.old).filter(|v| !v.is_empty())?;
                deprecations.push(renamed.notice());
                Some(value)
            };
            // A value given by flag or by the new name wins; the old name fills what is left
            // open, and a default gives way to it.
            if let Some(node) = cli.command.node_name_mut()
                && node.is_none()
            {
                *node =
                    fallback(names::RENAMED_NODE_NAME).map(|v| v.to_string_lossy().into_owned());
            }
            // (Asked only of a command that has the argument: clap refuses unknown ids.)
            if let Some(hook) = cli.command.hook_path_mut()
                && matches!(
                    sub.value_source("hook_path"),
                    None | Some(clap::parser::ValueSource::DefaultValue)
                )
                && let Some(v) = fallback(names::RENAMED_HOOK_PATH)
            {
                *hook = PathBuf::from(v);
            }
            if let Some(list) = cli.command.device_list_mut() {
                for (value, env) in [
                    (
                        &mut list.nvidia_cdi_hook_path,
                        names::RENAMED_NVIDIA_CTK_PATH,
                    ),
                    (
                        &mut list.driver_root_ctr_path,
                        names::RENAMED_CONTAINER_DRIVER_ROOT,
                    ),
                ] {
                    if value.is_none() {
                        *value = fallback(env).map(|v| v.to_string_lossy().into_owned());
                    }
                }
            }
        }
        Ok(Parsed { cli, deprecations })
    }
}

/// Sub-commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve kubelet and keep the node annotation for the HAMi scheduler current.
    Run(RunArgs),
    /// Print the GPUs found, the kubelet devices and the node annotation that `run` would publish.
    Inventory(InventoryArgs),
    /// Print, as JSON, what `Allocate` would give each container of a pod with pending GPU
    /// entries (delivery mode and source, envs, mounts, device specs, CDI annotations and
    /// devices, limits-file text) under the device list settings given (HAMi's variables, as for
    /// `run`); `--write` also publishes the files.
    Plan(PlanFlags),
    /// Install HAMi-core and the preload library into HOOK/vgpu, with a generated ld.so.preload,
    /// and publish the node GPU file HOOK/vgpu/node-gpus.
    ///
    /// Run it on the host's hook path before `run` (the DaemonSet's init container). node-gpus
    /// (HAMI_NODE_GPUS_FORMAT=1) lists each GPU's minor, UUID and MiB, from NVML or --inventory.
    /// Each file is written atomically as mode 0644, the libraries first and
    /// HOOK/vgpu/ld.so.preload last, after both libraries were checked (regular, non-empty,
    /// starting with \x7fELF); a file that already has the same bytes is left "unchanged".
    /// Without a GPU list node-gpus is not published: give the container NVML
    /// (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility) or pass --inventory.
    /// Exit status: 0 on success, 2 for an invalid --hook-path, 1 for any other failure.
    ///
    /// The whole contract (file order, failures, output): docs/design.md, "The preload library",
    /// and "The node GPU file".
    #[command(verbatim_doc_comment)]
    InstallHook(InstallHookFlags),
    /// Serve the hami.io/preload resource to kubelet until SIGTERM: its Allocate mounts
    /// HOOK/vgpu's libhami_preload.so, libvgpu.so and node-gpus (when published) read-only at
    /// their own paths, and HOOK/vgpu/ld.so.preload at /etc/ld.so.preload.
    ///
    /// The webhook asks one hami.io/preload for each KAI container it preloads
    /// (kai.hookDelivery: device-plugin), so the pod carries no hostPath volume and passes Pod
    /// Security baseline. Run it after install-hook (the hook installer DaemonSet does). The
    /// folder is checked at start and on every Allocate: each file regular, not a link, writable
    /// by its owner only, and ld.so.preload exactly what install-hook writes for HOOK; otherwise
    /// it exits (at start) or fails the container's start (Allocate), naming the file.
    #[command(verbatim_doc_comment)]
    ServePreload(ServePreloadFlags),
    /// Print, once, what the region exporter says of this node's HAMi container folders
    /// (HOOK/vgpu/containers): the Prometheus text `/metrics` serves for them, each container's
    /// shared region judged against its limits file (docs/operator-guide.md, "Is my cap in force?").
    Regions(RegionsFlags),
}

impl Command {
    /// The node name this command takes, if it takes one.
    fn node_name_mut(&mut self) -> Option<&mut Option<String>> {
        match self {
            Self::Run(args) => Some(&mut args.source.node_name),
            Self::Inventory(args) => Some(&mut args.source.node_name),
            Self::Plan(args) => Some(&mut args.node),
            Self::InstallHook(_) | Self::ServePreload(_) | Self::Regions(_) => None,
        }
    }

    /// The device list flags this command takes, if it takes them.
    fn device_list_mut(&mut self) -> Option<&mut DeviceListFlags> {
        match self {
            Self::Run(args) => Some(&mut args.allocate.device_list),
            Self::Plan(args) => Some(&mut args.device_list),
            Self::Inventory(_)
            | Self::InstallHook(_)
            | Self::ServePreload(_)
            | Self::Regions(_) => None,
        }
    }

    /// The hook path this command takes, if it takes one.
    fn hook_path_mut(&mut self) -> Option<&mut PathBuf> {
        match self {
            Self::Run(args) => Some(&mut args.allocate.hook_path),
            Self::Plan(args) => Some(&mut args.hook_path),
            Self::InstallHook(args) => Some(&mut args.hook_path),
            Self::ServePreload(args) => Some(&mut args.hook_path),
            Self::Regions(args) => Some(&mut args.hook_path),
            Self::Inventory(_) => None,
        }
    }
}

/// Where the GPUs and the settings come from (shared by both sub-commands).
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// Global HAMi device config (`device-config.yaml`, `nvidia:` section).
    #[arg(long = "config", env = names::ENV_HAMI_DEVICE_CONFIG, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Per-node config (`config.json` with `nodeconfig: [...]`).
    #[arg(long = "node-config", env = names::ENV_HAMI_NODE_CONFIG, value_name = "FILE")]
    pub node_config: Option<PathBuf>,
    /// YAML list of GPUs instead of NVML, for machines without NVIDIA GPUs.
    #[arg(long, env = names::ENV_HAMI_INVENTORY, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long = "node-name", env = names::ENV_HAMI_NODE_NAME)]
    pub node_name: Option<String>,
    /// Attach each GPU's NUMA node to the kubelet devices (for the topology manager), whatever
    /// the device config's `enableNumaTopology` and the node's `enablenumatopology` say.
    #[arg(long = "enable-numa-topology", env = names::ENV_HAMI_ENABLE_NUMA_TOPOLOGY)]
    pub numa_topology: bool,
    /// Static MIG (HAMi's MIG_STRATEGY): `none` (MIG ignored: every GPU split into shares),
    /// `single` (every GPU's MIG devices, all of one profile, under nvidia.com/gpu), `mixed`
    /// (each MIG device under nvidia.com/mig-<profile>, other GPUs shared). MIG devices get no
    /// HAMi-core.
    #[arg(
        long = "mig-strategy",
        env = crate::gpu::mig::ENV_MIG_STRATEGY,
        default_value = "none",
        value_parser = parse_mig_strategy,
        value_name = "STRATEGY"
    )]
    pub mig_strategy: crate::gpu::mig::MigStrategy,
    /// Publish `hami.io/node-nvidia-score` (GPU-pair NVLink/PCIe scores for HAMi's
    /// topology-aware scheduler policy): `true` or `false`, HAMi's variable and spelling (HAMi's
    /// chart sets `true` when `scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy` is
    /// `topology-aware`). The flag alone means `true`.
    #[arg(
        long = "enable-topology-score",
        env = crate::gpu::topology::ENV_ENABLE_TOPOLOGY_SCORE,
        value_name = "BOOL",
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        value_parser = parse_topology_score,
    )]
    pub topology_score: bool,
}

/// An empty value (a variable set to "") is the default, as urfave/cli reads HAMi's variables.
fn parse_mig_strategy(
    value: &str,
) -> Result<crate::gpu::mig::MigStrategy, crate::gpu::mig::MigError> {
    if value.is_empty() {
        return Ok(crate::gpu::mig::MigStrategy::default());
    }
    value.parse()
}

/// `ENABLE_TOPOLOGY_SCORE`: HAMi compares with `"true"` (anything else is off); here anything but
/// `true` and `false` is refused, so that `TRUE` or `1` does not silently mean off.
fn parse_topology_score(value: &str) -> Result<bool, FlagValueError> {
    match value {
        "true" => Ok(true),
        "false" | "" => Ok(false),
        other => Err(FlagValueError::TopologyScore(other.to_owned())),
    }
}

/// `run` flags.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// GPUs and settings.
    #[command(flatten)]
    pub source: SourceArgs,
    /// kubelet's device-plugin directory.
    #[arg(long = "kubelet-dir", env = names::ENV_HAMI_KUBELET_DIR, default_value = api::DEFAULT_KUBELET_DIR, value_name = "DIR")]
    pub kubelet_dir: PathBuf,
    /// Seconds between checks of the node annotation `hami.io/node-nvidia-register`.
    #[arg(
        long = "register-interval",
        env = names::ENV_HAMI_REGISTER_INTERVAL,
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub register_interval: f64,
    /// Seconds to wait after a failed node annotation update.
    #[arg(
        long = "register-retry",
        env = names::ENV_HAMI_REGISTER_RETRY,
        default_value_t = 5.0,
        value_name = "SECONDS"
    )]
    pub register_retry: f64,
    /// Milliseconds between checks of the device-plugin directory (kubelet restart, lost socket).
    #[arg(
        long = "kubelet-watch-interval-ms",
        env = names::ENV_HAMI_KUBELET_WATCH_INTERVAL_MS,
        default_value_t = 250
    )]
    pub kubelet_watch_ms: u64,
    /// Do not talk to the API server (no node annotation, no pending-pod lookup): for trying the
    /// kubelet side alone.
    #[arg(long = "skip-node-register", env = names::ENV_HAMI_SKIP_NODE_REGISTER)]
    pub skip_node_register: bool,
    /// Plain-HTTP address for `/healthz`, `/readyz` and `/metrics`; empty or `off` disables.
    #[arg(
        long = "metrics-listen",
        env = names::ENV_HAMI_METRICS_LISTEN,
        default_value = DEFAULT_METRICS_LISTEN,
        value_name = "HOST:PORT"
    )]
    pub metrics_listen: String,
    /// Allocation: hook path, collector of dead pods' files.
    #[command(flatten)]
    pub allocate: AllocateArgs,
    /// GPU start-up and health (HAMi's names).
    #[command(flatten)]
    pub gpu: GpuRunArgs,
    /// The exporter of the containers' shared regions.
    #[command(flatten)]
    pub regions: RegionExportFlags,
}

/// `run`'s GPU start-up and health flags, named as HAMi v2.10's `cmd/device-plugin/nvidia/main.go`
/// and `rm/health.go` name them.
#[derive(Debug, Clone, Args)]
pub struct GpuRunArgs {
    /// With NVML unavailable (no driver, no libnvidia-ml.so.1): `true` exits with an error,
    /// `false` waits, advertising nothing, until SIGTERM ("No devices found. Waiting
    /// indefinitely."), as HAMi's FAIL_ON_INIT_ERROR. A node with no usable GPU waits either way.
    #[arg(
        long = "fail-on-init-error",
        env = "FAIL_ON_INIT_ERROR",
        default_value = "true",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_go_bool,
        value_name = "BOOL"
    )]
    pub fail_on_init_error: bool,
    /// `all` (or `xids`) turns the Xid health checks off; else Xids (comma-separated) that do
    /// not make a GPU unhealthy, beyond the application Xids 13, 31, 43, 45, 68, 109.
    #[arg(long = "disable-healthchecks", env = crate::gpu::health::ENV_DISABLE_HEALTHCHECKS, value_name = "XIDS")]
    pub disable_healthchecks: Option<String>,
    /// Xids (comma-separated, or `all`) that make a GPU unhealthy even when ignored by default
    /// or by DP_DISABLE_HEALTHCHECKS.
    #[arg(long = "enable-healthchecks", env = crate::gpu::health::ENV_ENABLE_HEALTHCHECKS, value_name = "XIDS")]
    pub enable_healthchecks: Option<String>,
}

/// `FAIL_ON_INIT_ERROR`: Go's `strconv.ParseBool` (urfave/cli's flags and variables); an empty
/// value is the default (`true`), as urfave/cli skips an empty variable.
fn parse_go_bool(value: &str) -> Result<bool, FlagValueError> {
    if value.is_empty() {
        return Ok(true);
    }
    go_bool(value).ok_or_else(|| FlagValueError::FailOnInitError(value.to_owned()))
}

/// A flag or variable whose value clap's own parsers cannot judge.
#[derive(Debug, thiserror::Error)]
pub enum FlagValueError {
    /// `FAIL_ON_INIT_ERROR` is not one of Go's booleans.
    #[error(
        "FAIL_ON_INIT_ERROR (--fail-on-init-error) {0:?} is not a boolean: expected true or false (also 1, t, T, TRUE, True, 0, f, F, FALSE, False)"
    )]
    FailOnInitError(String),
    /// `ENABLE_TOPOLOGY_SCORE` is neither `true` nor `false`.
    #[error(
        "{env}={0:?} is not one of: true, false",
        env = crate::gpu::topology::ENV_ENABLE_TOPOLOGY_SCORE
    )]
    TopologyScore(String),
}

/// Default of `--metrics-listen`. Not 9394: HAMi's vGPU monitor serves its metrics there, in the
/// same pod (the chart runs it beside the plugin).
pub const DEFAULT_METRICS_LISTEN: &str = "0.0.0.0:9396";

/// `inventory` flags.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// GPUs and settings.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Allocation flags of `run`.
#[derive(Debug, Clone, Args)]
pub struct AllocateArgs {
    /// HAMi-core's install directory on the host (and in the container): `<DIR>/vgpu/...`.
    #[arg(long = "hook-path", env = names::ENV_HAMI_HOOK_PATH, default_value = hami_shared::names::DEFAULT_HOOK_PATH, value_name = "DIR")]
    pub hook_path: PathBuf,
    /// Seconds between two passes of the collector of dead pods' files.
    #[arg(
        long = "collect-interval",
        env = names::ENV_HAMI_COLLECT_INTERVAL,
        default_value_t = 60.0,
        value_name = "SECONDS"
    )]
    pub collect_interval: f64,
    /// Minimum age in seconds of a dead pod's directory or limits file before it is removed.
    #[arg(
        long = "collect-grace",
        env = names::ENV_HAMI_COLLECT_GRACE,
        default_value_t = 300.0,
        value_name = "SECONDS"
    )]
    pub collect_grace: f64,
    /// How containers learn their devices, under HAMi's names.
    #[command(flatten)]
    pub device_list: DeviceListFlags,
    /// The operator's escape hatches from `Allocate`'s checks of a GPU container's spec.
    #[command(flatten)]
    pub guard: GuardFlags,
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn parse(args: &[&str], old: &[(&str, &str)]) -> Parsed {
        let old: Vec<(String, OsString)> = old
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        Cli::parse_with_env(args, |name| {
            old.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .unwrap()
    }

    /// With nothing set, `run` has HAMi v2.10.0's defaults for every setting it reads under
    /// HAMi's names: HAMi's values as data, from `cmd/device-plugin/nvidia/main.go` (urfave/cli
    /// flags), `pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go`
    /// (`ENABLE_TOPOLOGY_SCORE`, on only for `true`) and `rm/health.go` (health check lists).
    #[test]
    fn run_defaults_are_hamis_plugins() {
        use crate::allocation::plan::device_list::{DeviceListStrategies, DeviceListStrategy};
        let parsed = parse(&["p", "run"], &[]);
        let Command::Run(args) = parsed.cli.command else {
            panic!("not run")
        };
        let list = crate::allocation::plan::device_list::settings::DeviceListArgs::from(
            args.allocate.device_list.clone(),
        )
        .parse()
        .unwrap();
        let s = &list.settings;
        let ours: Vec<(&str, String)> = vec![
            ("MIG_STRATEGY", args.source.mig_strategy.to_string()),
            (
                "FAIL_ON_INIT_ERROR",
                args.gpu.fail_on_init_error.to_string(),
            ),
            // NVIDIA_DEV_ROOT defaults to the driver root, "/".
            ("NVIDIA_DEV_ROOT", s.dev_root.clone()),
            ("PASS_DEVICE_SPECS", s.pass_device_specs.to_string()),
            (
                "DEVICE_LIST_STRATEGY",
                if Some(&s.strategies)
                    == DeviceListStrategies::new([DeviceListStrategy::Envvar]).as_ref()
                {
                    "envvar".to_owned()
                } else {
                    format!("{:?}", s.strategies)
                },
            ),
            ("DEVICE_ID_STRATEGY", s.id_strategy.as_str().to_owned()),
            ("GDRCOPY_ENABLED", s.gdrcopy.to_string()),
            ("GDS_ENABLED", s.gds.to_string()),
            ("MOFED_ENABLED", s.mofed.to_string()),
            ("CDI_ANNOTATION_PREFIX", s.cdi_annotation_prefix.clone()),
            ("DRIVER_ROOT_CTR_PATH", list.container_driver_root.clone()),
            ("IMEX_CHANNEL_IDS", format!("{:?}", list.imex.ids)),
            ("IMEX_REQUIRED", list.imex.required.to_string()),
            (
                "ENABLE_TOPOLOGY_SCORE",
                args.source.topology_score.to_string(),
            ),
            (
                "DP_DISABLE_HEALTHCHECKS",
                format!("{:?}", args.gpu.disable_healthchecks),
            ),
            (
                "DP_ENABLE_HEALTHCHECKS",
                format!("{:?}", args.gpu.enable_healthchecks),
            ),
        ];
        let hami: [(&str, &str); 16] = [
            ("MIG_STRATEGY", "none"),
            ("FAIL_ON_INIT_ERROR", "true"),
            ("NVIDIA_DEV_ROOT", "/"),
            ("PASS_DEVICE_SPECS", "false"),
            ("DEVICE_LIST_STRATEGY", "envvar"),
            ("DEVICE_ID_STRATEGY", "uuid"),
            ("GDRCOPY_ENABLED", "false"),
            ("GDS_ENABLED", "false"),
            ("MOFED_ENABLED", "false"),
            ("CDI_ANNOTATION_PREFIX", "cdi.k8s.io/"),
            ("DRIVER_ROOT_CTR_PATH", "/driver-root"),
            ("IMEX_CHANNEL_IDS", "[]"),
            ("IMEX_REQUIRED", "false"),
            ("ENABLE_TOPOLOGY_SCORE", "false"),
            ("DP_DISABLE_HEALTHCHECKS", "None"),
            ("DP_ENABLE_HEALTHCHECKS", "None"),
        ];
        assert_eq!(ours.len(), hami.len());
        for ((name, value), (hami_name, hami_value)) in ours.iter().zip(hami) {
            assert_eq!(*name, hami_name);
            assert_eq!(
                value, hami_value,
                "{name}: ours {value:?}, HAMi v2.10.0's {hami_value:?}"
            );
        }
    }

    #[test]
    fn topology_score_reads_hamis_spelling_only() {
        let run = |args: &[&str]| {
            let parsed = parse(args, &[]);
            let Command::Run(args) = parsed.cli.command else {
                panic!("not run")
            };
            args.source.topology_score
        };
        assert!(!run(&["p", "run"]));
        assert!(run(&["p", "run", "--enable-topology-score"]));
        assert!(run(&["p", "run", "--enable-topology-score=true"]));
        assert!(!run(&["p", "run", "--enable-topology-score=false"]));
        let err = Cli::parse_with_env(["p", "run", "--enable-topology-score=TRUE"], |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(r#"ENABLE_TOPOLOGY_SCORE="TRUE" is not one of: true, false"#),
            "{err}"
        );
    }

    #[test]
    fn old_names_fill_what_flags_and_new_names_leave_open() {
        let old = [("NODE_NAME", "from-old"), ("HOOK_PATH", "/opt/hami")];
        let parsed = parse(&["p", "plan", "--pod", "pod.yaml"], &old);
        let Command::Plan(args) = parsed.cli.command else {
            panic!("not plan")
        };
        assert_eq!(args.node.as_deref(), Some("from-old"));
        assert_eq!(args.hook_path, PathBuf::from("/opt/hami"));
        assert_eq!(
            parsed.deprecations,
            [
                "NODE_NAME is deprecated: use HAMI_NODE_NAME",
                "HOOK_PATH is deprecated: use HAMI_HOOK_PATH"
            ]
        );

        // A flag wins and the old name is neither used nor reported.
        let parsed = parse(
            &[
                "p",
                "plan",
                "--pod",
                "x",
                "--node",
                "n1",
                "--hook-path",
                "/h",
            ],
            &old,
        );
        let Command::Plan(args) = parsed.cli.command else {
            panic!("not plan")
        };
        assert_eq!(args.node.as_deref(), Some("n1"));
        assert_eq!(args.hook_path, PathBuf::from("/h"));
        assert!(parsed.deprecations.is_empty());

        // Without the old names, the defaults stay and nothing is reported.
        let parsed = parse(
            &[
                "p",
                "install-hook",
                "--hami-core-dir",
                "d",
                "--preload",
                "f",
            ],
            &[],
        );
        let Command::InstallHook(args) = parsed.cli.command else {
            panic!("not install-hook")
        };
        assert_eq!(
            args.hook_path,
            PathBuf::from(hami_shared::names::DEFAULT_HOOK_PATH)
        );
        assert!(parsed.deprecations.is_empty());

        // `inventory` takes a node name but no hook path.
        let parsed = parse(&["p", "inventory"], &old);
        let Command::Inventory(args) = parsed.cli.command else {
            panic!("not inventory")
        };
        assert_eq!(args.source.node_name.as_deref(), Some("from-old"));
        assert_eq!(
            parsed.deprecations,
            ["NODE_NAME is deprecated: use HAMI_NODE_NAME"]
        );

        // An empty old value is not a value.
        let parsed = parse(&["p", "run"], &[("NODE_NAME", "")]);
        let Command::Run(args) = parsed.cli.command else {
            panic!("not run")
        };
        assert_eq!(args.source.node_name, None);
        assert!(parsed.deprecations.is_empty());
    }

    #[test]
    fn hamis_second_names_of_the_cdi_hook_and_the_driver_root() {
        let old = [
            ("NVIDIA_CTK_PATH", "/usr/bin/nvidia-ctk"),
            ("CONTAINER_DRIVER_ROOT", "/host-driver"),
        ];
        let parsed = parse(&["p", "run"], &old);
        let Command::Run(args) = parsed.cli.command else {
            panic!("not run")
        };
        let list = &args.allocate.device_list;
        assert_eq!(
            list.nvidia_cdi_hook_path.as_deref(),
            Some("/usr/bin/nvidia-ctk")
        );
        assert_eq!(list.driver_root_ctr_path.as_deref(), Some("/host-driver"));
        assert_eq!(
            parsed.deprecations,
            [
                "NVIDIA_CTK_PATH is deprecated: use NVIDIA_CDI_HOOK_PATH",
                "CONTAINER_DRIVER_ROOT is deprecated: use DRIVER_ROOT_CTR_PATH"
            ]
        );
        // HAMi's flag names and aliases; a flag wins over the second name.
        let parsed = parse(
            &[
                "p",
                "plan",
                "--pod",
                "x",
                "--container-driver-root=/d",
                "--nvidia-ctk-path",
                "/c",
                "--device-list-strategy",
                "envvar",
                "--device-list-strategy=cdi-cri",
                "--pass-device-specs",
                "--nvidia-dev-root",
                "/r",
            ],
            &old,
        );
        let Command::Plan(args) = parsed.cli.command else {
            panic!("not plan")
        };
        let list = &args.device_list;
        assert_eq!(list.driver_root_ctr_path.as_deref(), Some("/d"));
        assert_eq!(list.nvidia_cdi_hook_path.as_deref(), Some("/c"));
        assert_eq!(list.device_list_strategy, ["envvar", "cdi-cri"]);
        assert_eq!(list.pass_device_specs.as_deref(), Some("true"));
        assert_eq!(list.dev_root.as_deref(), Some("/r"));
        assert!(parsed.deprecations.is_empty());
    }
}

//! The plugin's resolved settings for this node: the global device config's `nvidia:` section
//! (`hami_config::DeviceConfig`, layered defaults < file < `HAMI_NVIDIA__*` env) with
//! the node's `nodeconfig` entry (`NodeConfigFile`, matched on the node name) applied over it.
//! The environment's pairs are given by the composition root (`crate::app`, `main.rs`), which
//! alone reads the process environment.
//!
//! One way in for `run`, `inventory` and `plan`: [`PluginSettings::load`] reads the files and
//! hands them to [`PluginSettings::new`], which checks what the plugin cannot use; `run` and
//! `plan` then build their [`AllocationSettings`] with [`PluginSettings::allocation_settings`],
//! so that `plan` can never print an allocation `run` would refuse.

use std::path::{Path, PathBuf};

use hami_config::{
    ConfigLoadError, DeviceConfig, FileText, NodeConfigEntry, NodeConfigFile, NvidiaConfig,
    OperatingMode,
};

use crate::allocation::plan::AllocationSettings;
use crate::allocation::plan::device_list::{DeviceListSettings, NodeDevices};
use crate::allocation::plan::spec_guard::GuardArgs;
use crate::gpu::inventory::DeviceFilter;
use crate::node_register::Scaling;

/// Reads a configuration file (the contract crate parses text and does no I/O).
pub fn read_config_file(path: &Path) -> Result<String, ConfigLoadError> {
    std::fs::read_to_string(path).map_err(|source| ConfigLoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The global device config from `config` and the `HAMI_NVIDIA__*` variables of `env`.
pub fn load_device_config(
    config: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<DeviceConfig, ConfigLoadError> {
    let text = config.map(read_config_file).transpose()?;
    let file = config
        .zip(text.as_deref())
        .map(|(path, text)| FileText { path, text });
    DeviceConfig::load_from_env(file, env)
}

/// The per-node config file.
pub fn load_node_config(path: &Path) -> Result<NodeConfigFile, ConfigLoadError> {
    let text = read_config_file(path)?;
    NodeConfigFile::parse(FileText { path, text: &text })
}

/// Where the settings came from, for the errors that name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsOrigin {
    /// The global device config, if a file was given (else the built-in defaults).
    pub config: Option<PathBuf>,
    /// The node config, if given.
    pub node_config: Option<PathBuf>,
    /// The node whose entry was looked for.
    pub node_name: Option<String>,
}

impl SettingsOrigin {
    /// The global device config's name in an error: its path, or `defaults`.
    fn config_name(&self) -> String {
        self.config
            .as_deref()
            .map_or_else(|| "defaults".to_owned(), |p| p.display().to_string())
    }
}

/// Settings after the node config is applied. The share settings (`deviceSplitCount`,
/// `deviceMemoryScaling`, `deviceCoreScaling`) are read from [`Self::nvidia`], the one merged
/// copy, through [`Self::split_count`], [`Self::memory_scaling`] and [`Self::core_scaling`].
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// `resourceCountName` (default `nvidia.com/gpu`).
    pub resource_name: String,
    /// `filterdevices` of the node's entry: GPUs not advertised.
    pub filter: DeviceFilter,
    /// `enablegetpreferredallocation` of the node's entry (default true: it is implemented):
    /// announce and answer `GetPreferredAllocation`.
    pub preferred_allocation: bool,
    /// Attach NUMA topology to the kubelet devices: the node entry's `enablenumatopology` over
    /// the global `enableNumaTopology` (HAMi's precedence), default off; `--enable-numa-topology`
    /// (`HAMI_ENABLE_NUMA_TOPOLOGY`) turns it on whatever the files say.
    pub numa_topology: bool,
    /// `operatingmode` of the node's entry (default `hami-core`); also the `mode` of the node
    /// annotation, as HAMi writes it.
    pub operating_mode: OperatingMode,
    /// The global `nvidia:` section with the node's overrides applied.
    pub nvidia: NvidiaConfig,
    /// The node's merged `nodeconfig` entry, if any (for `Allocate`: `limitdelivery`).
    pub node: Option<NodeConfigEntry>,
    /// Where the node's entry gives a value HAMi v2.10's plugin would not (a written `false` or
    /// `0` its merge skips), one sentence each; logged as warnings at start.
    pub hami_differences: Vec<String>,
    /// The files and the node these settings came from.
    pub origin: SettingsOrigin,
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self::resolve(
            &DeviceConfig::default().nvidia,
            None,
            SettingsOrigin::default(),
        )
    }
}

/// Why the device config or the node config cannot be used: the file, the key, the value and
/// what is accepted.
#[derive(Debug, thiserror::Error)]
pub enum PluginSettingsError {
    /// The device config or the node config cannot be read or parsed.
    #[error(transparent)]
    Config(#[from] ConfigLoadError),
    /// A value is valid for HAMi's loader but unusable for the plugin.
    #[error("{origin}: {key}: invalid value {value}: {reason}")]
    Invalid {
        /// The file or `defaults`.
        origin: String,
        /// The key.
        key: &'static str,
        /// The value.
        value: String,
        /// What would be accepted.
        reason: &'static str,
    },
    /// Dynamic MIG: hami-limits does not support it, and allocating anyway would hand out GPUs
    /// HAMi's MIG manager expects to slice.
    #[error(
        "{path}: node {node} has operatingmode: mig (dynamic MIG), which hami-device-plugin does not support; use operatingmode: hami-core (GPUs shared through HAMi-core), or keep HAMi's own device plugin on MIG nodes"
    )]
    DynamicMig {
        /// The node config file.
        path: PathBuf,
        /// The node.
        node: String,
    },
}

/// What `run` and `plan` take from their flags and the node rather than from the files.
#[derive(Debug, Clone, Default)]
pub struct AllocationInputs {
    /// `HOOK_PATH`.
    pub hook_path: PathBuf,
    /// The device list settings, parsed and checked against this host.
    pub device_list: DeviceListSettings,
    /// The node's devices, where the device list settings need them.
    pub node_devices: NodeDevices,
    /// The namespaces exempt from parts of the spec checks.
    pub guard: GuardArgs,
}

impl PluginSettings {
    /// The settings for a node from the global section and the node's entry, checked: a value
    /// HAMi's loader accepts but the plugin cannot use is refused, naming the file and key.
    pub fn new(
        global: &NvidiaConfig,
        node: Option<&NodeConfigEntry>,
        origin: SettingsOrigin,
    ) -> Result<Self, PluginSettingsError> {
        let settings = Self::resolve(global, node, origin);
        settings.check()?;
        Ok(settings)
    }

    /// Loads the global device config (`config`, plus the `HAMI_NVIDIA__*` variables of `env`)
    /// and the node config, and applies the entry named `node_name` ([`Self::new`]).
    pub fn load(
        config: Option<&Path>,
        node_config: Option<&Path>,
        node_name: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, PluginSettingsError> {
        let global = load_device_config(config, env)?;
        let nodes = node_config.map(load_node_config).transpose()?;
        let entry = match (&nodes, node_name) {
            (Some(nodes), Some(name)) => nodes.for_node(name),
            _ => None,
        };
        let origin = SettingsOrigin {
            config: config.map(Path::to_path_buf),
            node_config: node_config.map(Path::to_path_buf),
            node_name: node_name.map(str::to_owned),
        };
        Self::new(&global.nvidia, entry.as_ref(), origin)
    }

    /// The allocation settings `run` and `plan` plan with: these settings at `inputs.hook_path`,
    /// with the device list, the node's devices and the guard's exemptions of `inputs`. Dynamic
    /// MIG is refused.
    pub fn allocation_settings(
        &self,
        inputs: AllocationInputs,
    ) -> Result<AllocationSettings, PluginSettingsError> {
        if let (Some(path), Some(OperatingMode::Mig)) = (
            &self.origin.node_config,
            self.node.as_ref().and_then(|n| n.operating_mode),
        ) {
            return Err(PluginSettingsError::DynamicMig {
                path: path.clone(),
                node: self.origin.node_name.clone().unwrap_or_default(),
            });
        }
        let mut settings =
            AllocationSettings::for_node(&self.nvidia, self.node.as_ref(), &inputs.hook_path);
        settings.device_list = inputs.device_list;
        settings.node_devices = inputs.node_devices;
        inputs.guard.apply(&mut settings.guard);
        Ok(settings)
    }

    /// The settings, unchecked (the built-in defaults are valid).
    fn resolve(
        global: &NvidiaConfig,
        node: Option<&NodeConfigEntry>,
        origin: SettingsOrigin,
    ) -> Self {
        let nvidia = node.map_or_else(|| global.clone(), |n| global.with_node(n));
        let filter = node
            .and_then(|n| n.filter_devices.as_ref())
            .map(|f| DeviceFilter {
                uuids: f.uuid.clone(),
                indices: f.index.clone(),
            })
            .unwrap_or_default();
        Self {
            resource_name: nvidia.admission.resource_count_name.clone(),
            filter,
            preferred_allocation: node
                .and_then(|n| n.enable_get_preferred_allocation)
                .unwrap_or(true),
            // HAMi v2.10 `server.go` `apiDevices`: `EnableNUMATopology != nil && *EnableNUMATopology`.
            numa_topology: nvidia.plugin.enable_numa_topology.unwrap_or(false),
            operating_mode: node
                .and_then(|n| n.operating_mode)
                .unwrap_or(OperatingMode::HamiCore),
            hami_differences: node.map_or_else(Vec::new, |n| global.hami_merge_differences(n)),
            nvidia,
            node: node.cloned(),
            origin,
        }
    }

    /// What HAMi's loader accepts and the plugin cannot use.
    fn check(&self) -> Result<(), PluginSettingsError> {
        if self.split_count() == 0 {
            return Err(PluginSettingsError::Invalid {
                origin: self.origin.config_name(),
                key: "deviceSplitCount",
                value: "0".to_owned(),
                reason: "expected a positive number of shares per GPU",
            });
        }
        if self
            .resource_name
            .rsplit('/')
            .next()
            .is_none_or(str::is_empty)
            || !self.resource_name.contains('/')
        {
            return Err(PluginSettingsError::Invalid {
                origin: self.origin.config_name(),
                key: "nvidia.resourceCountName",
                value: format!("{:?}", self.resource_name),
                reason: "expected an extended resource name <domain>/<name>, e.g. nvidia.com/gpu",
            });
        }
        Ok(())
    }

    /// `deviceSplitCount`, node `devicesplitcount` over global.
    pub fn split_count(&self) -> u32 {
        self.nvidia.plugin.device_split_count
    }

    /// `deviceMemoryScaling`, node over global.
    pub fn memory_scaling(&self) -> f64 {
        self.nvidia.plugin.device_memory_scaling
    }

    /// `deviceCoreScaling`, node over global.
    pub fn core_scaling(&self) -> f64 {
        self.nvidia.plugin.device_core_scaling
    }

    /// The scaling the node annotation applies.
    pub fn scaling(&self) -> Scaling {
        Scaling {
            split_count: self.split_count(),
            memory: self.memory_scaling(),
            core: self.core_scaling(),
            mode: self.operating_mode.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use hami_shared::values::LimitDelivery;

    use super::*;

    fn no_env() -> std::iter::Empty<(String, String)> {
        std::iter::empty()
    }

    /// The allocation settings from the global `nvidia:` section and the node's entry.
    fn allocation(
        global: &NvidiaConfig,
        node: Option<&NodeConfigEntry>,
        hook_path: &Path,
    ) -> AllocationSettings {
        PluginSettings::new(global, node, SettingsOrigin::default())
            .unwrap()
            .allocation_settings(inputs(hook_path))
            .unwrap()
    }

    fn inputs(hook_path: impl AsRef<Path>) -> AllocationInputs {
        AllocationInputs {
            hook_path: hook_path.as_ref().to_path_buf(),
            ..AllocationInputs::default()
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn defaults_match_hamis_chart() {
        let s = PluginSettings::default();
        assert_eq!(s.resource_name, "nvidia.com/gpu");
        assert_eq!(s.split_count(), 10);
        assert!((s.memory_scaling() - 1.0).abs() < f64::EPSILON);
        assert!(s.preferred_allocation);
        assert_eq!(s.operating_mode, OperatingMode::HamiCore);
    }

    #[test]
    fn node_entry_overrides_global() {
        let dir = tempfile::tempdir().unwrap();
        let global = write(
            dir.path(),
            "device-config.yaml",
            "nvidia:\n  resourceCountName: example.com/vgpu\n  deviceSplitCount: 4\n  deviceMemoryScaling: 2\n",
        );
        let nodes = write(
            dir.path(),
            "config.json",
            r#"{"nodeconfig":[{"name":"node-a","devicesplitcount":7,"devicecorescaling":1.5,"filterdevices":{"uuid":["GPU-x"],"index":[3]},"enablegetpreferredallocation":false},{"name":"node-b","devicesplitcount":2}]}"#,
        );
        let a =
            PluginSettings::load(Some(&global), Some(&nodes), Some("node-a"), no_env()).unwrap();
        assert_eq!(a.resource_name, "example.com/vgpu");
        assert_eq!(a.split_count(), 7);
        assert!((a.memory_scaling() - 2.0).abs() < f64::EPSILON);
        assert!((a.core_scaling() - 1.5).abs() < f64::EPSILON);
        assert_eq!(
            a.filter,
            DeviceFilter {
                uuids: vec!["GPU-x".into()],
                indices: vec![3]
            }
        );
        assert!(!a.preferred_allocation);
        let other =
            PluginSettings::load(Some(&global), Some(&nodes), Some("node-c"), no_env()).unwrap();
        assert_eq!(other.split_count(), 4);
        assert_eq!(other.filter, DeviceFilter::default());
    }

    #[test]
    fn numa_topology_from_hamis_keys() {
        let dir = tempfile::tempdir().unwrap();
        let global = write(
            dir.path(),
            "device-config.yaml",
            "nvidia:\n  enableNumaTopology: true\n",
        );
        let nodes = write(
            dir.path(),
            "config.json",
            r#"{"nodeconfig":[{"name":"off","enablenumatopology":false},{"name":"on","enablenumatopology":true}]}"#,
        );
        let load = |g: Option<&Path>, n: &str| {
            PluginSettings::load(g, Some(&nodes), Some(n), no_env())
                .unwrap()
                .numa_topology
        };
        assert!(load(Some(&global), "other"));
        assert!(!load(Some(&global), "off"));
        assert!(load(None, "on"));
        assert!(!load(None, "other"));
        assert!(!PluginSettings::default().numa_topology);
    }

    #[test]
    fn values_hamis_merge_would_skip_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let global = write(
            dir.path(),
            "device-config.yaml",
            "nvidia:\n  enableNumaTopology: true\n  preConfiguredDeviceMemory: 24576\n",
        );
        let nodes = write(
            dir.path(),
            "config.json",
            r#"{"nodeconfig":[{"name":"zeros","enablenumatopology":false,"preconfigureddevicememory":0},{"name":"same","enablenumatopology":true,"preconfigureddevicememory":8192}]}"#,
        );
        let load = |g: Option<&Path>, n: &str| {
            PluginSettings::load(g, Some(&nodes), Some(n), no_env()).unwrap()
        };
        let zeros = load(Some(&global), "zeros");
        // The written values are honoured ...
        assert!(!zeros.numa_topology);
        assert_eq!(zeros.nvidia.plugin.pre_configured_device_memory, 0);
        // ... and each difference from HAMi v2.10 is named, with both keys and both results.
        assert_eq!(
            zeros.hami_differences.len(),
            2,
            "{:?}",
            zeros.hami_differences
        );
        assert!(zeros.hami_differences[0].contains("\"zeros\""));
        assert!(zeros.hami_differences[0].contains("enablenumatopology: false"));
        assert!(zeros.hami_differences[0].contains("nvidia.enableNumaTopology: true"));
        assert!(zeros.hami_differences[1].contains("preconfigureddevicememory: 0"));
        assert!(zeros.hami_differences[1].contains("nvidia.preConfiguredDeviceMemory: 24576"));
        // Non-zero values merge as in HAMi; no entry, or no global value to keep: nothing to say.
        assert!(load(Some(&global), "same").hami_differences.is_empty());
        assert!(load(Some(&global), "other").hami_differences.is_empty());
        assert!(load(None, "zeros").hami_differences.is_empty());
    }

    #[test]
    fn errors_name_file_key_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let global = write(
            dir.path(),
            "device-config.yaml",
            "nvidia:\n  deviceSplitCount: 0\n",
        );
        let err = PluginSettings::load(Some(&global), None, None, no_env())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("deviceSplitCount") && err.contains('0'),
            "{err}"
        );
        let global = write(
            dir.path(),
            "bad.yaml",
            "nvidia:\n  resourceCountName: gpu\n",
        );
        let err = PluginSettings::load(Some(&global), None, None, no_env())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("resourceCountName") && err.contains("<domain>/<name>"),
            "{err}"
        );
        let nodes = write(
            dir.path(),
            "config.json",
            r#"{"nodeconfig":[{"name":"n","operatingmode":"turbo"}]}"#,
        );
        let err = PluginSettings::load(None, Some(&nodes), Some("n"), no_env())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config.json")
                && err.contains("turbo")
                && err.contains("hami-core, mig, mps"),
            "{err}"
        );
    }

    #[test]
    fn allocation_settings_take_the_node_entry_over_global() {
        let tmp = tempfile::tempdir().unwrap();
        let global = write(
            tmp.path(),
            "device-config.yaml",
            "nvidia:\n  deviceMemoryScaling: 1.5\n  disableCoreLimit: true\n  libCudaLogLevel: 2\n  limitDelivery: env\n",
        );
        let node = write(
            tmp.path(),
            "config.json",
            r#"{"nodeconfig":[{"name":"other","limitdelivery":"env"},{"name":"gpu-0","devicememoryscaling":1,"libcudaloglevel":4,"limitDelivery":"file","operatingmode":"hami-core"}]}"#,
        );
        let global_text = std::fs::read_to_string(&global).unwrap();
        let global = DeviceConfig::load_from_env(
            Some(FileText {
                path: &global,
                text: &global_text,
            }),
            std::iter::empty(),
        )
        .unwrap();
        let nodes = load_node_config(&node).unwrap();
        let entry = nodes.for_node("gpu-0");
        let s = allocation(&global.nvidia, entry.as_ref(), Path::new("/opt/h"));
        assert_eq!(s.hook_path, Path::new("/opt/h"));
        assert_eq!(s.memory_scaling, 1.0);
        assert!(s.disable_core_limit);
        assert_eq!(s.lib_cuda_log_level, Some(4));
        assert_eq!(s.global_delivery, Some(LimitDelivery::Env));
        assert_eq!(s.node_delivery, Some(LimitDelivery::File));
        let s = allocation(
            &global.nvidia,
            nodes.for_node("gpu-9").as_ref(),
            Path::new("/u"),
        );
        assert_eq!(s.memory_scaling, 1.5);
        assert_eq!(s.lib_cuda_log_level, Some(2));
        assert_eq!(s.node_delivery, None);
    }

    #[test]
    fn dynamic_mig_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let node = write(
            tmp.path(),
            "config.json",
            r#"{"nodeconfig":[{"name":"gpu-0","operatingmode":"mig"}]}"#,
        );
        let err = PluginSettings::load(None, Some(&node), Some("gpu-0"), no_env())
            .and_then(|s| s.allocation_settings(inputs("/u")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("operatingmode: mig (dynamic MIG)"), "{err}");
        assert!(err.contains("does not support"), "{err}");
        assert!(
            PluginSettings::load(None, Some(&node), Some("gpu-1"), no_env())
                .and_then(|s| s.allocation_settings(inputs("/u")))
                .is_ok()
        );
        let defaults = allocation(&NvidiaConfig::default(), None, Path::new("/usr/local"));
        assert_eq!(defaults, AllocationSettings::default());
        // Default is built the same way, so also pin the built-in values themselves.
        assert_eq!(defaults.hook_path, Path::new("/usr/local"));
        assert!((defaults.memory_scaling - 1.0).abs() < f64::EPSILON);
        assert!(!defaults.disable_core_limit);
        assert_eq!(defaults.lib_cuda_log_level, None);
        assert_eq!(
            (defaults.node_delivery, defaults.global_delivery),
            (None, None)
        );
    }
}

//! The plugin's resolved settings for this node: the global device config's `nvidia:` section
//! (`hami_config::DeviceConfig`, layered defaults < file < `HAMI_NVIDIA__*` env) with
//! the node's `nodeconfig` entry (`NodeConfigFile`, matched on the node name) applied over it.
//! The environment's pairs are given by the composition root (`crate::app`, `main.rs`), which
//! alone reads the process environment.

use std::path::Path;

use hami_config::{
    ConfigLoadError, DeviceConfig, FileText, NodeConfigEntry, NodeConfigFile, NvidiaConfig,
    OperatingMode,
};

use crate::gpu::inventory::DeviceFilter;
use crate::node_register::Scaling;

/// Reads a configuration file (`hami-config` parses text and does no I/O).
pub fn read_config_file(path: &Path) -> Result<String, hami_config::ConfigLoadError> {
    std::fs::read_to_string(path).map_err(|source| hami_config::ConfigLoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The global device config from `config` and the `HAMI_NVIDIA__*` variables of `env`.
pub fn load_device_config(
    config: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<DeviceConfig, hami_config::ConfigLoadError> {
    let text = config.map(read_config_file).transpose()?;
    let file = config
        .zip(text.as_deref())
        .map(|(path, text)| FileText { path, text });
    DeviceConfig::load_from_env(file, env)
}

/// The per-node config file.
pub fn load_node_config(path: &Path) -> Result<NodeConfigFile, hami_config::ConfigLoadError> {
    let text = read_config_file(path)?;
    NodeConfigFile::parse(FileText { path, text: &text })
}

/// Settings after the node config is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// `resourceCountName` (default `nvidia.com/gpu`).
    pub resource_name: String,
    /// `deviceSplitCount`, node `devicesplitcount` over global.
    pub split_count: u32,
    /// `deviceMemoryScaling`, node over global.
    pub memory_scaling: f64,
    /// `deviceCoreScaling`, node over global.
    pub core_scaling: f64,
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
    /// The global `nvidia:` section with the node's overrides applied (for `Allocate`).
    pub nvidia: NvidiaConfig,
    /// The node's merged `nodeconfig` entry, if any (for `Allocate`: `limitdelivery`).
    pub node: Option<NodeConfigEntry>,
    /// Where the node's entry gives a value HAMi v2.10's plugin would not (a written `false` or
    /// `0` its merge skips), one sentence each; logged as warnings at start.
    pub hami_differences: Vec<String>,
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self::resolve(&DeviceConfig::default().nvidia, None)
    }
}

/// Configuration errors: the file or variable, the key, the value and what is accepted.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The device config or the node config is invalid.
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
}

impl PluginSettings {
    /// The settings for a node from the global section and the node's entry.
    pub fn resolve(global: &NvidiaConfig, node: Option<&NodeConfigEntry>) -> Self {
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
            split_count: nvidia.plugin.device_split_count,
            memory_scaling: nvidia.plugin.device_memory_scaling,
            core_scaling: nvidia.plugin.device_core_scaling,
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
        }
    }

    /// Loads the global device config (`config`, plus the `HAMI_NVIDIA__*` variables of `env`)
    /// and the node config, and applies the entry named `node_name`.
    pub fn load(
        config: Option<&Path>,
        node_config: Option<&Path>,
        node_name: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let global = load_device_config(config, env)?;
        let nodes = node_config.map(load_node_config).transpose()?;
        let entry = match (&nodes, node_name) {
            (Some(nodes), Some(name)) => nodes.for_node(name),
            _ => None,
        };
        let settings = Self::resolve(&global.nvidia, entry.as_ref());
        let origin = || config.map_or_else(|| "defaults".to_owned(), |p| p.display().to_string());
        if settings.split_count == 0 {
            return Err(SettingsError::Invalid {
                origin: origin(),
                key: "deviceSplitCount",
                value: "0".to_owned(),
                reason: "expected a positive number of shares per GPU",
            });
        }
        if settings
            .resource_name
            .rsplit('/')
            .next()
            .is_none_or(str::is_empty)
            || !settings.resource_name.contains('/')
        {
            return Err(SettingsError::Invalid {
                origin: origin(),
                key: "nvidia.resourceCountName",
                value: format!("{:?}", settings.resource_name),
                reason: "expected an extended resource name <domain>/<name>, e.g. nvidia.com/gpu",
            });
        }
        Ok(settings)
    }

    /// The scaling the node annotation applies.
    pub fn scaling(&self) -> Scaling {
        Scaling {
            split_count: self.split_count,
            memory: self.memory_scaling,
            core: self.core_scaling,
            mode: self.operating_mode.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env() -> std::iter::Empty<(String, String)> {
        std::iter::empty()
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
        assert_eq!(s.split_count, 10);
        assert!((s.memory_scaling - 1.0).abs() < f64::EPSILON);
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
        assert_eq!(a.split_count, 7);
        assert!((a.memory_scaling - 2.0).abs() < f64::EPSILON);
        assert!((a.core_scaling - 1.5).abs() < f64::EPSILON);
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
        assert_eq!(other.split_count, 4);
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
}

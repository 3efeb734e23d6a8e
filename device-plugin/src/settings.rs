//! The plugin's resolved settings for this node: the global device config's `nvidia:` section
//! with the node's `nodeconfig` entry applied over it.

use crate::inventory::DeviceFilter;
use crate::node_register::Scaling;

/// Settings after the node config is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// `resourceCountName` (default `nvidia.com/gpu`).
    pub resource_name: String,
    /// `deviceSplitCount` (default 10).
    pub split_count: u32,
    /// `deviceMemoryScaling` (default 1).
    pub memory_scaling: f64,
    /// `deviceCoreScaling` (default 1).
    pub core_scaling: f64,
    /// `filterdevices` of the node's entry.
    pub filter: DeviceFilter,
    /// `enablegetpreferredallocation`: announce and answer `GetPreferredAllocation`.
    pub preferred_allocation: bool,
    /// Attach NUMA topology to the kubelet devices.
    pub numa_topology: bool,
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self {
            resource_name: "nvidia.com/gpu".to_owned(),
            split_count: 10,
            memory_scaling: 1.0,
            core_scaling: 1.0,
            filter: DeviceFilter::default(),
            preferred_allocation: true,
            numa_topology: false,
        }
    }
}

impl PluginSettings {
    /// The scaling the node annotation applies.
    pub fn scaling(&self) -> Scaling {
        Scaling {
            split_count: self.split_count,
            memory: self.memory_scaling,
            core: self.core_scaling,
        }
    }
}

/// Configuration errors (the file, the key, the value and what is accepted).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Loading failed.
    #[error("{0}")]
    Config(String),
}

impl PluginSettings {
    /// Loads the global device config and the node config, and applies the entry for `node_name`.
    pub fn load(
        config: Option<&std::path::Path>,
        node_config: Option<&std::path::Path>,
        _node_name: Option<&str>,
    ) -> Result<Self, SettingsError> {
        // Wired to hami_shared::config once it lands.
        if let Some(path) = config.or(node_config) {
            return Err(SettingsError::Config(format!(
                "{}: configuration files are not read yet",
                path.display()
            )));
        }
        Ok(Self::default())
    }
}

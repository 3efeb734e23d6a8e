//! The settings [`super::plan`] needs, from the shared loaders of HAMi's global device config
//! (`device-config.yaml`, `nvidia:` section, plus `HAMI_NVIDIA__<KEY>` variables) and of the
//! node's entry in the plugin's `config.json` (`nodeconfig: [...]`), the entry overriding the
//! global values.
//!
//! A node configured with `operatingmode: mig` (dynamic MIG) is refused: hami-limits does not
//! support it, and starting anyway would hand out GPUs HAMi's MIG manager expects to slice.

use std::path::{Path, PathBuf};

use hami_shared::config::{NodeConfigEntry, NvidiaConfig, OperatingMode};

use super::plan::AllocationSettings;
use crate::settings::PluginSettings;
use crate::settings::{load_device_config, load_node_config};

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be loaded (the message names the file, key, value and accepted forms).
    #[error(transparent)]
    Load(#[from] hami_shared::config::ConfigError),
    /// Dynamic MIG.
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

/// The allocation settings from the global `nvidia:` section and the node's entry.
pub fn from_configs(
    global: &NvidiaConfig,
    node: Option<&NodeConfigEntry>,
    hook_path: &Path,
) -> AllocationSettings {
    let merged = match node {
        Some(n) => global.with_node(n),
        None => global.clone(),
    };
    AllocationSettings {
        hook_path: hook_path.to_path_buf(),
        memory_scaling: merged.device_memory_scaling,
        disable_core_limit: merged.disable_core_limit,
        lib_cuda_log_level: merged.lib_cuda_log_level,
        node_delivery: node.and_then(|n| n.limit_delivery),
        global_delivery: global.limit_delivery,
    }
}

/// Refuses dynamic MIG for this node.
pub fn check_operating_mode(
    node: Option<&NodeConfigEntry>,
    node_config: &Path,
    node_name: &str,
) -> Result<(), ConfigError> {
    if node.and_then(|n| n.operating_mode) == Some(OperatingMode::Mig) {
        return Err(ConfigError::DynamicMig {
            path: node_config.to_path_buf(),
            node: node_name.to_owned(),
        });
    }
    Ok(())
}

/// The allocation settings from the plugin's settings, loaded once at start (the node's entry
/// applied over the global section); dynamic MIG refused.
pub fn from_plugin_settings(
    settings: &PluginSettings,
    node_config: Option<&Path>,
    node_name: &str,
    hook_path: &Path,
) -> Result<AllocationSettings, ConfigError> {
    if let Some(path) = node_config {
        check_operating_mode(settings.node.as_ref(), path, node_name)?;
    }
    let nvidia = &settings.nvidia;
    Ok(AllocationSettings {
        hook_path: hook_path.to_path_buf(),
        memory_scaling: nvidia.device_memory_scaling,
        disable_core_limit: nvidia.disable_core_limit,
        lib_cuda_log_level: nvidia.lib_cuda_log_level,
        node_delivery: settings.node.as_ref().and_then(|n| n.limit_delivery),
        // `with_node` leaves `limitDelivery` as the global section has it.
        global_delivery: nvidia.limit_delivery,
    })
}

/// Loads the allocation settings for `node_name` (defaults for what the files do not set).
pub fn load_allocation_settings(
    config: Option<&Path>,
    node_config: Option<&Path>,
    node_name: &str,
    hook_path: &Path,
) -> Result<AllocationSettings, ConfigError> {
    let global = load_device_config(config)?;
    let node = match node_config {
        Some(path) => {
            let node = load_node_config(path)?.for_node(node_name);
            check_operating_mode(node.as_ref(), path, node_name)?;
            node
        }
        None => None,
    };
    Ok(from_configs(&global.nvidia, node.as_ref(), hook_path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_shared::config::{DeviceConfig, FileText};
    use hami_shared::values::LimitDelivery;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn node_entry_overrides_global() {
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
        let s = from_configs(&global.nvidia, entry.as_ref(), Path::new("/opt/h"));
        assert_eq!(s.hook_path, Path::new("/opt/h"));
        assert_eq!(s.memory_scaling, 1.0);
        assert!(s.disable_core_limit);
        assert_eq!(s.lib_cuda_log_level, Some(4));
        assert_eq!(s.global_delivery, Some(LimitDelivery::Env));
        assert_eq!(s.node_delivery, Some(LimitDelivery::File));
        let s = from_configs(
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
        let err = load_allocation_settings(None, Some(&node), "gpu-0", Path::new("/u"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("operatingmode: mig (dynamic MIG)"), "{err}");
        assert!(err.contains("does not support"), "{err}");
        assert!(load_allocation_settings(None, Some(&node), "gpu-1", Path::new("/u")).is_ok());
        let defaults = from_configs(&NvidiaConfig::default(), None, Path::new("/usr/local"));
        assert_eq!(defaults, AllocationSettings::default());
    }
}

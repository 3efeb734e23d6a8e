//! The settings [`super::plan`] needs, from the shared loaders of HAMi's global device config
//! (`device-config.yaml`, `nvidia:` section, plus `HAMI_NVIDIA__<KEY>` variables) and of the
//! node's entry in the plugin's `config.json` (`nodeconfig: [...]`), the entry overriding the
//! global values.
//!
//! A node configured with `operatingmode: mig` (dynamic MIG) is refused: hami-limits does not
//! support it, and starting anyway would hand out GPUs HAMi's MIG manager expects to slice.

use std::path::{Path, PathBuf};

use hami_config::{NodeConfigEntry, OperatingMode};

use super::device_list::settings::{DeviceListArgs, DeviceListConfigError, ImexRequest};
use super::device_list::{DeviceListSettings, ImexChannel, under_root};
use super::plan::AllocationSettings;
use crate::settings::PluginSettings;
use crate::settings::{load_device_config, load_node_config};

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be loaded (the message names the file, key, value and accepted forms).
    #[error(transparent)]
    Load(#[from] hami_config::ConfigLoadError),
    /// A device list setting is invalid (names the variable, the value, the accepted forms).
    #[error(transparent)]
    DeviceList(#[from] DeviceListConfigError),
    /// `IMEX_REQUIRED=true` and a requested channel does not exist (HAMi's `imex.GetChannels`).
    #[error(
        "IMEX_REQUIRED (--imex-required) is true and the requested IMEX channel {channel} does not exist: looked for a character device at {}{reason}; create the channel (nvidia-modprobe / the IMEX daemon), or unset IMEX_REQUIRED to start without it",
        looked.join(" and ")
    )]
    ImexChannelMissing {
        /// `channel<id>`.
        channel: String,
        /// The paths looked at.
        looked: Vec<String>,
        /// What was found instead, if anything (`: /x is not a character device`).
        reason: String,
    },
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
    Ok(AllocationSettings::for_node(
        &settings.nvidia,
        settings.node.as_ref(),
        hook_path,
    ))
}

/// The device list settings from the flags, with the IMEX channels looked for (I/O: the device
/// nodes), and the notes to log at start.
pub fn device_list_settings(
    args: &DeviceListArgs,
) -> Result<(DeviceListSettings, Vec<String>), ConfigError> {
    let parsed = args.parse()?;
    let mut notes = parsed.notes;
    let mut settings = parsed.settings;
    settings.imex_channels =
        imex_channels(&parsed.imex, &parsed.container_driver_root, &mut notes)?;
    let dirs = CDI_SPEC_DIRS.map(Path::new);
    notes.extend(missing_cdi_specs(&settings, &dirs));
    Ok((settings, notes))
}

/// Where container runtimes read CDI specs (the CDI defaults; the NVIDIA toolkit writes
/// `/etc/cdi/nvidia.yaml` or `/var/run/cdi/nvidia.yaml`).
pub const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// A note per CDI kind the answers name that no spec in `dirs` defines, when this container
/// can read one of them at all (HAMi's chart mounts `/var/run/cdi`; where no directory is
/// visible, nothing can be said). A note, not a refusal: the spec may sit in a directory this
/// container does not see.
fn missing_cdi_specs(settings: &DeviceListSettings, dirs: &[&Path]) -> Vec<String> {
    let named = settings.cdi_kinds_named();
    if named.is_empty() {
        return Vec::new();
    }
    let mut visible = false;
    let mut kinds = std::collections::BTreeSet::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        visible = true;
        for entry in entries.flatten() {
            let path = entry.path();
            let spec = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("json" | "yaml" | "yml")
            );
            let text = spec.then(|| std::fs::read_to_string(&path).ok()).flatten();
            // YAML is a superset of JSON: one parser for both forms of a spec.
            let kind = text
                .and_then(|t| serde_yaml_ng::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned));
            kinds.extend(kind);
        }
    }
    if !visible {
        return Vec::new();
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    named
        .into_iter()
        .filter(|k| !kinds.contains(k))
        .map(|k| {
            format!(
                "DEVICE_LIST_STRATEGY names CDI devices of kind {k}, and no CDI spec in {} defines it: the runtime will refuse to create the containers unless a spec for it exists on the node (nvidia-ctk cdi generate)",
                looked.join(", ")
            )
        })
        .collect()
}

/// HAMi's `imex.GetChannels`: a channel is selected when its device node is a character device
/// under the driver root's dev root in this container (`DRIVER_ROOT_CTR_PATH` when it has a
/// `dev` folder, else `/`) or at its own path; a missing one is an error when `required`, else
/// skipped with a note.
fn imex_channels(
    request: &ImexRequest,
    container_driver_root: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<ImexChannel>, ConfigError> {
    let dev_root = if Path::new(container_driver_root).join("dev").is_dir() {
        container_driver_root
    } else {
        "/"
    };
    let mut channels = Vec::new();
    for &id in &request.ids {
        let channel = ImexChannel { id };
        let path = channel.path();
        let host = under_root(dev_root, &path);
        let mut looked = vec![host.clone()];
        if host != path {
            looked.push(path);
        }
        let mut reason = String::new();
        let found = looked.iter().any(|p| match std::fs::metadata(p) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()) => true,
            Ok(_) => {
                reason = format!(": {p} is not a character device");
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                reason = format!(": {p}: {e}");
                false
            }
        });
        let name = format!("channel{id}");
        if found {
            channels.push(channel);
        } else if request.required {
            return Err(ConfigError::ImexChannelMissing {
                channel: name,
                looked,
                reason,
            });
        } else {
            notes.push(format!(
                "ignoring requested IMEX channel {name}: no character device at {}{reason} (IMEX_REQUIRED is false)",
                looked.join(" and ")
            ));
        }
    }
    Ok(channels)
}

/// Loads the allocation settings for `node_name` (defaults for what the files do not set) from
/// the files and the `HAMI_NVIDIA__*` variables of `env`.
pub fn load_allocation_settings(
    config: Option<&Path>,
    node_config: Option<&Path>,
    node_name: &str,
    hook_path: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<AllocationSettings, ConfigError> {
    let global = load_device_config(config, env)?;
    let node = match node_config {
        Some(path) => load_node_config(path)?.for_node(node_name),
        None => None,
    };
    from_plugin_settings(
        &PluginSettings::resolve(&global.nvidia, node.as_ref()),
        node_config,
        node_name,
        hook_path,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_config::{DeviceConfig, FileText, NvidiaConfig};
    use hami_shared::values::LimitDelivery;

    /// The allocation settings from the global `nvidia:` section and the node's entry.
    fn from_configs(
        global: &NvidiaConfig,
        node: Option<&NodeConfigEntry>,
        hook_path: &Path,
    ) -> AllocationSettings {
        let settings = PluginSettings::resolve(global, node);
        AllocationSettings::for_node(&settings.nvidia, node, hook_path)
    }

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
        let err = load_allocation_settings(None, Some(&node), "gpu-0", Path::new("/u"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains("operatingmode: mig (dynamic MIG)"), "{err}");
        assert!(err.contains("does not support"), "{err}");
        assert!(load_allocation_settings(None, Some(&node), "gpu-1", Path::new("/u"), []).is_ok());
        let defaults = from_configs(&NvidiaConfig::default(), None, Path::new("/usr/local"));
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

    #[test]
    fn imex_channels_as_hamis_get_channels() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("driver-root");
        let channels = root.join("dev/nvidia-caps-imex-channels");
        std::fs::create_dir_all(&channels).unwrap();
        let root = root.display().to_string();
        let want = ImexRequest {
            ids: vec![0],
            required: true,
        };
        // A character device (symbolic links followed, as os.Stat) under <root>/dev is selected.
        std::os::unix::fs::symlink("/dev/null", channels.join("channel0")).unwrap();
        let mut notes = Vec::new();
        let found = imex_channels(&want, &root, &mut notes).unwrap();
        assert_eq!(found, [ImexChannel { id: 0 }]);
        assert!(notes.is_empty());
        // A regular file is not a channel: required is an error naming the paths looked at.
        std::fs::remove_file(channels.join("channel0")).unwrap();
        std::fs::write(channels.join("channel0"), "").unwrap();
        let err = imex_channels(&want, &root, &mut notes)
            .unwrap_err()
            .to_string();
        let host = format!("{root}/dev/nvidia-caps-imex-channels/channel0");
        assert!(
            err.starts_with("IMEX_REQUIRED (--imex-required) is true and the requested IMEX channel channel0 does not exist")
                && err.contains(&format!("{host} and /dev/nvidia-caps-imex-channels/channel0"))
                && err.contains(&format!("{host} is not a character device")),
            "{err}"
        );
        // Not required: skipped with a note.
        let optional = ImexRequest {
            required: false,
            ..want
        };
        let found = imex_channels(&optional, &root, &mut notes).unwrap();
        assert!(found.is_empty());
        assert!(
            notes[0].starts_with("ignoring requested IMEX channel channel0"),
            "{notes:?}"
        );
        // No channel asked for: nothing looked at.
        let none = imex_channels(&ImexRequest::default(), "/nonexistent", &mut notes).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn device_list_settings_refuse_a_bad_value_at_start() {
        let args = DeviceListArgs {
            device_id_strategy: Some("serial".into()),
            ..DeviceListArgs::default()
        };
        let err = device_list_settings(&args).unwrap_err().to_string();
        assert_eq!(
            err,
            "DEVICE_ID_STRATEGY (--device-id-strategy): invalid value \"serial\": expected uuid or index"
        );
        let (s, notes) = device_list_settings(&DeviceListArgs::default()).unwrap();
        assert_eq!(s, DeviceListSettings::default());
        assert!(notes.is_empty());
    }

    #[test]
    fn cdi_kinds_without_a_spec_are_noted() {
        let tmp = tempfile::tempdir().unwrap();
        let etc = tmp.path().join("etc-cdi");
        let run = tmp.path().join("run-cdi");
        std::fs::create_dir_all(&etc).unwrap();
        write(
            &etc,
            "nvidia.yaml",
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n",
        );
        write(&etc, "notes.txt", "kind: nvidia.com/gds\n");
        let settings = DeviceListSettings {
            strategies: super::super::device_list::DeviceListStrategies::new([
                super::super::device_list::DeviceListStrategy::CdiCri,
            ])
            .unwrap(),
            gds: true,
            ..DeviceListSettings::default()
        };
        let notes = missing_cdi_specs(&settings, &[&etc, &run]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with(
                "DEVICE_LIST_STRATEGY names CDI devices of kind nvidia.com/gds, and no CDI spec in"
            ),
            "{notes:?}"
        );
        std::fs::create_dir_all(&run).unwrap();
        write(
            &run,
            "gds.json",
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gds","devices":[]}"#,
        );
        assert!(missing_cdi_specs(&settings, &[&etc, &run]).is_empty());
        // No directory visible: nothing to say. No CDI strategy: nothing looked at.
        let gone = tmp.path().join("gone");
        assert!(missing_cdi_specs(&settings, &[&gone]).is_empty());
        assert!(missing_cdi_specs(&DeviceListSettings::default(), &[&etc]).is_empty());
    }
}

//! The device list settings checked against this host: the IMEX channels they ask for (HAMi's
//! `imex.GetChannels`: device nodes looked for) and the CDI specs their CDI kinds need (a note
//! where none is visible). The parse itself is pure
//! ([`crate::allocation::plan::device_list::settings`]); this is its I/O.

use std::path::Path;

use crate::allocation::plan::device_list::settings::{
    DeviceListArgs, DeviceListConfigError, ImexRequest,
};
use crate::allocation::plan::device_list::{DeviceListSettings, ImexChannel, under_root};

/// Why the device list settings cannot be used on this host.
#[derive(Debug, thiserror::Error)]
pub enum HostCheckError {
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
}

/// The device list settings from the flags, with the IMEX channels looked for (I/O: the device
/// nodes), and the notes to log at start.
pub fn device_list_settings(
    args: &DeviceListArgs,
) -> Result<(DeviceListSettings, Vec<String>), HostCheckError> {
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
) -> Result<Vec<ImexChannel>, HostCheckError> {
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
            return Err(HostCheckError::ImexChannelMissing {
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
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
            strategies: crate::allocation::plan::device_list::DeviceListStrategies::new([
                crate::allocation::plan::device_list::DeviceListStrategy::CdiCri,
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

//! The webhook's settings loaded: built-in defaults < a YAML/JSON file (`--config`) < environment
//! variables prefixed `HAMI_` with `__` between levels (e.g. `HAMI_NVIDIA__GPUCOREPOLICY=force`,
//! `HAMI_SERVER__BODYLIMITBYTES=1048576`), with the shared layered loader. The typed settings are
//! [`crate::policy::settings`]'s; this module reads the file and defines
//! [`Settings::load_from_env`] on them. The environment's pairs come from the composition root
//! (`crate::shell::app`), the one place that reads the process environment.
//!
//! Old environment names keep working, each with a deprecation notice (logged once by the
//! program): `PER_GPU_VRAM_MIB` → `HAMI_KAI__PER_GPU_VRAM_MIB`. `HAMI_LOG_FORMAT`, the name the
//! other hami-limits programs read, sets `server.logFormat` too.

use std::path::{Path, PathBuf};

use hami_config::{FileText, NvidiaAdmission, load_layered_with_schema};
use hami_shared::names::{self, Program};

use crate::policy::settings::Settings;

/// A settings file, the HAMi device config it names, or an environment value that could not be
/// used; each message names the file and, where there is one, the key and the value.
#[derive(Debug, thiserror::Error)]
pub enum SettingsLoadError {
    /// The settings file could not be read, or a layered value is not accepted.
    #[error(transparent)]
    Config(#[from] hami_config::ConfigLoadError),
    /// The file's `deviceConfigFile` is not a string.
    #[error(
        "{}: deviceConfigFile: {value:?} is not a path (accepted: an absolute or relative file path)",
        file.display()
    )]
    DeviceConfigNotAPath {
        /// The settings file.
        file: PathBuf,
        /// The value found.
        value: serde_yaml_ng::Value,
    },
    /// The file has an `nvidia:` section and names a `deviceConfigFile` as well.
    #[error(
        "{}: has both an nvidia: section and deviceConfigFile {}: keep one (the nvidia: section is read from that file)",
        file.display(),
        device_file.display()
    )]
    TwoNvidiaSections {
        /// The settings file.
        file: PathBuf,
        /// The device config it names.
        device_file: PathBuf,
    },
    /// The device config could not be read.
    #[error("{}: {source}", file.display())]
    DeviceConfigRead {
        /// The settings file.
        file: PathBuf,
        /// The read error, naming the device config.
        source: hami_config::ConfigLoadError,
    },
    /// The device config is not YAML.
    #[error("{} (deviceConfigFile of {}): not YAML: {source}", device_file.display(), file.display())]
    DeviceConfigNotYaml {
        /// The settings file.
        file: PathBuf,
        /// The device config.
        device_file: PathBuf,
        /// The parser's error.
        source: serde_yaml_ng::Error,
    },
    /// The device config has no `nvidia:` mapping.
    #[error(
        "{} (deviceConfigFile of {}): has no nvidia: section (a HAMi device-config.yaml has one)",
        device_file.display(),
        file.display()
    )]
    NoNvidiaSection {
        /// The settings file.
        file: PathBuf,
        /// The device config.
        device_file: PathBuf,
    },
    /// A value of the device config's `nvidia:` section is not accepted.
    #[error("{} (deviceConfigFile of {}): nvidia: {source}", device_file.display(), file.display())]
    BadNvidiaSection {
        /// The settings file.
        file: PathBuf,
        /// The device config.
        device_file: PathBuf,
        /// The parser's error, naming the key and the value.
        source: serde_yaml_ng::Error,
    },
    /// The settings file with the device config's section put in could not be written out.
    #[error("{}: {source}", file.display())]
    Render {
        /// The settings file.
        file: PathBuf,
        /// The encoder's error.
        source: serde_yaml_ng::Error,
    },
}

/// Map the old environment names (the webhook's entries of the shared table,
/// [`names::deprecated_env`]) and `HAMI_LOG_FORMAT` onto the layered ones (a layered name, when
/// also set, wins) and say what was mapped, so that every variable is read by one mechanism.
fn with_current_names(
    env: impl IntoIterator<Item = (String, String)>,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut env: Vec<(String, String)> = env.into_iter().collect();
    let mut notices = Vec::new();
    for renamed in names::deprecated_env(Program::Webhook) {
        match map_name(&mut env, renamed.old, renamed.new) {
            Some(Mapped::Copied) => notices.push(renamed.notice()),
            Some(Mapped::Ignored) => notices.push(renamed.ignored_notice()),
            None => {}
        }
    }
    // `HAMI_LOG_FORMAT` (the name every hami-limits program reads) is not deprecated: no notice.
    map_name(
        &mut env,
        hami_ops::ENV_LOG_FORMAT,
        names::ENV_HAMI_SERVER_LOG_FORMAT,
    );
    (env, notices)
}

/// What [`map_name`] did with a set old name.
enum Mapped {
    /// Its value was copied to the new name.
    Copied,
    /// The new name is set too, and wins.
    Ignored,
}

/// Copies `old`'s value to `new` unless a spelling of `new` (ignoring case and `_`, as the
/// layered loader matches) is set; `None` when `old` is not set.
fn map_name(env: &mut Vec<(String, String)>, old: &str, new: &str) -> Option<Mapped> {
    let value = env.iter().find(|(k, _)| k == old).map(|(_, v)| v.clone())?;
    let fold = |s: &str| s.replace('_', "").to_ascii_lowercase();
    if env.iter().any(|(k, _)| fold(k) == fold(new)) {
        return Some(Mapped::Ignored);
    }
    env.push((new.to_owned(), value));
    Some(Mapped::Copied)
}

/// The settings file's text with the `nvidia:` section of its `deviceConfigFile` (a HAMi
/// `device-config.yaml`) put in, so that the layered loader (and the `HAMI_NVIDIA__*` variables
/// over it) sees one document. Unchanged when the file names no `deviceConfigFile`.
fn with_device_config(path: &Path, text: &str) -> crate::Result<String, SettingsLoadError> {
    let file = || path.to_path_buf();
    let Ok(serde_yaml_ng::Value::Mapping(mut doc)) = serde_yaml_ng::from_str(text) else {
        // Not a mapping: the layered loader reports it with its own message.
        return Ok(text.to_owned());
    };
    let Some(device_file) = doc.get("deviceConfigFile") else {
        return Ok(text.to_owned());
    };
    let Some(device_file) = device_file.as_str().map(PathBuf::from) else {
        return Err(SettingsLoadError::DeviceConfigNotAPath {
            file: file(),
            value: device_file.clone(),
        });
    };
    if doc.contains_key("nvidia") {
        return Err(SettingsLoadError::TwoNvidiaSections {
            file: file(),
            device_file,
        });
    }
    let device_text = std::fs::read_to_string(&device_file).map_err(|source| {
        SettingsLoadError::DeviceConfigRead {
            file: file(),
            source: hami_config::ConfigLoadError::Read {
                path: device_file.clone(),
                source,
            },
        }
    })?;
    let device: serde_yaml_ng::Value = serde_yaml_ng::from_str(&device_text).map_err(|source| {
        SettingsLoadError::DeviceConfigNotYaml {
            file: file(),
            device_file: device_file.clone(),
            source,
        }
    })?;
    let Some(nvidia) = device.get("nvidia").filter(|v| v.is_mapping()) else {
        return Err(SettingsLoadError::NoNvidiaSection {
            file: file(),
            device_file,
        });
    };
    // The section's values are checked here, so that an error names the file they are in.
    serde_yaml_ng::from_value::<NvidiaAdmission>(nvidia.clone()).map_err(|source| {
        SettingsLoadError::BadNvidiaSection {
            file: file(),
            device_file: device_file.clone(),
            source,
        }
    })?;
    doc.insert("nvidia".into(), nvidia.clone());
    serde_yaml_ng::to_string(&doc).map_err(|source| SettingsLoadError::Render {
        file: file(),
        source,
    })
}

impl Settings {
    /// Defaults < `file` (YAML or JSON) < `HAMI_*` environment variables of `env`. Returns the
    /// settings and a notice per deprecated environment name in use (the caller logs them once).
    ///
    /// # Errors
    /// A file that cannot be read or a key whose value is not accepted; the message names the file,
    /// the key and the value.
    pub fn load_from_env<I>(
        file: Option<&Path>,
        env: I,
    ) -> crate::Result<(Self, Vec<String>), SettingsLoadError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let text = match file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|source| {
                hami_config::ConfigLoadError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            })?),
            None => None,
        };
        let text = match (file, text) {
            (Some(path), Some(text)) => Some(with_device_config(path, &text)?),
            _ => None,
        };
        let file = file
            .zip(text.as_deref())
            .map(|(path, text)| FileText { path, text });
        let (env, notices) = with_current_names(env);
        let settings =
            load_layered_with_schema::<Settings, _>(file, names::CONFIG_ENV_PREFIX, env)?;
        Ok((settings, notices))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::settings::ServerSettings;
    use hami_ops::LogFormat;
    use hami_shared::values::CorePolicy;

    #[test]
    fn file_then_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("webhook.yaml");
        std::fs::write(
            &file,
            "nvidia:\n  gpuCorePolicy: force\nschedulerName: gpu-sched\nserver:\n  bodyLimitBytes: 1024\n",
        )
        .unwrap();
        let env = [
            ("HAMI_SERVER__BODY_LIMIT_BYTES", "2048"),
            ("HAMI_SERVER__WORKERTHREADS", "1"),
            ("HAMI_DENY_PRIVILEGED_GPU_CONTAINERS", "false"),
            ("HAMI_WEBHOOK_CONFIG", "/ignored"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let (s, _) = Settings::load_from_env(Some(&file), env).unwrap();
        assert_eq!(s.nvidia.gpu_core_policy, CorePolicy::Force);
        assert_eq!(s.scheduler_name, "gpu-sched");
        assert_eq!(s.server.body_limit_bytes, 2048);
        assert_eq!(s.server.worker_threads, 1);
        assert!(!s.deny_privileged_gpu_containers);
        assert_eq!(s.server.listen, ServerSettings::default().listen);
        let bad = [(
            "HAMI_NVIDIA__GPU_CORE_POLICY".to_owned(),
            "FORCE".to_owned(),
        )];
        let err = Settings::load_from_env(None, bad).unwrap_err().to_string();
        assert!(
            err.contains("HAMI_NVIDIA__GPU_CORE_POLICY") && err.contains("FORCE"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_in_our_sections_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (yaml, key) in [
            ("server:\n  bodyLimitByte: 10\n", "bodyLimitByte"),
            ("kai:\n  perGpuVramMiB2: 10\n", "perGpuVramMiB2"),
        ] {
            let file = dir.path().join("webhook.yaml");
            std::fs::write(&file, yaml).unwrap();
            let err = Settings::load_from_env(Some(&file), std::iter::empty())
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
        }
        let env = [("HAMI_SERVER__NO_SUCH_KEY".to_owned(), "1".to_owned())];
        let err = Settings::load_from_env(None, env).unwrap_err().to_string();
        assert!(err.contains("no_such_key"), "{err}");
        // HAMi's sections (and the top level, which holds them) stay lenient.
        let (s, _) = Settings::load_from_env(
            None,
            [(
                "HAMI_NVIDIA__DEVICE_SPLIT_COUNT".to_owned(),
                "10".to_owned(),
            )],
        )
        .unwrap();
        assert_eq!(s.nvidia, NvidiaAdmission::default());
    }

    #[test]
    fn missing_basis_from_file_and_environment() {
        use crate::policy::kai::MissingBasis;
        // Fail closed unless an operator opts out.
        assert_eq!(Settings::default().kai.missing_basis, MissingBasis::Deny);
        let (s, _) = Settings::load_from_env(None, std::iter::empty::<(String, String)>()).unwrap();
        assert_eq!(s.kai.missing_basis, MissingBasis::Deny);
        let s: Settings = serde_yaml_ng::from_str("kai:\n  hookPath: /opt/vgpu\n").unwrap();
        assert_eq!(s.kai.missing_basis, MissingBasis::Deny);
        let (s, _) = Settings::load_from_env(
            None,
            [("HAMI_KAI__MISSINGBASIS".to_owned(), "warn".to_owned())],
        )
        .unwrap();
        assert_eq!(s.kai.missing_basis, MissingBasis::Warn);
        let s: Settings = serde_yaml_ng::from_str("kai:\n  missingBasis: warn\n").unwrap();
        assert_eq!(s.kai.missing_basis, MissingBasis::Warn);
        let s: Settings = serde_yaml_ng::from_str("kai:\n  missingBasis: deny\n").unwrap();
        assert_eq!(s.kai.missing_basis, MissingBasis::Deny);
        let err = Settings::load_from_env(
            None,
            [("HAMI_KAI__MISSINGBASIS".to_owned(), "fail".to_owned())],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("fail") && err.contains("warn"), "{err}");
    }

    #[test]
    fn tenancy_from_file_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("webhook.yaml");
        std::fs::write(
            &file,
            "tenancy:\n  allowHamiCoreEnvNamespaces: [legacy]\n  kaiOptOutNamespaces: [a]\n",
        )
        .unwrap();
        let env = [
            ("HAMI_TENANCY__KAI_OPT_OUT_NAMESPACES", "b, c"),
            (
                "HAMI_TENANCY__SCHEDULERANNOTATIONWRITERS",
                "system:serviceaccount:hami:hami-scheduler,system:serviceaccount:hami:plugin",
            ),
            ("HAMI_TENANCY__FORBIDENVDELIVERYNAMESPACES", ""),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let (s, _) = Settings::load_from_env(Some(&file), env).unwrap();
        assert_eq!(s.tenancy.allow_hami_core_env_namespaces, ["legacy"]);
        assert_eq!(s.tenancy.kai_opt_out_namespaces, ["b", "c"]);
        assert_eq!(
            s.tenancy.scheduler_annotation_writers,
            [
                "system:serviceaccount:hami:hami-scheduler",
                "system:serviceaccount:hami:plugin"
            ]
        );
        assert!(s.tenancy.forbid_env_delivery_namespaces.is_empty());
        let (s, _) = Settings::load_from_env(None, std::iter::empty()).unwrap();
        assert_eq!(
            s.tenancy,
            crate::policy::tenancy::TenancySettings::default()
        );
        std::fs::write(&file, "tenancy:\n  allowHamiCoreEnv: [x]\n").unwrap();
        let err = Settings::load_from_env(Some(&file), std::iter::empty())
            .unwrap_err()
            .to_string();
        assert!(err.contains("allowHamiCoreEnv"), "{err}");
    }

    #[test]
    fn affinity_limits_from_file_and_environment() {
        use crate::policy::placement::AffinityLimits;
        let defaults = AffinityLimits {
            terms: 64,
            expressions: 256,
            values: 10_000,
        };
        assert_eq!(Settings::default().kai.affinity_limits(), defaults);
        let (s, _) = Settings::load_from_env(
            None,
            [
                ("HAMI_KAI__MAXAFFINITYVALUES".to_owned(), "50000".to_owned()),
                ("HAMI_KAI__MAXAFFINITYTERMS".to_owned(), "8".to_owned()),
            ],
        )
        .unwrap();
        assert_eq!(
            s.kai.affinity_limits(),
            AffinityLimits {
                terms: 8,
                values: 50_000,
                ..defaults
            }
        );
        let s: Settings =
            serde_yaml_ng::from_str("kai:\n  maxAffinityExpressions: 1000\n").unwrap();
        assert_eq!(s.kai.affinity_limits().expressions, 1000);
        let err = Settings::load_from_env(
            None,
            [("HAMI_KAI__MAXAFFINITYVALUES".to_owned(), "-1".to_owned())],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("-1"), "{err}");
    }

    #[test]
    fn old_environment_names_still_work_with_a_notice() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>()
        };
        let (s, notices) =
            Settings::load_from_env(None, env(&[("PER_GPU_VRAM_MIB", "16384")])).unwrap();
        assert_eq!(s.kai.per_gpu_vram_mib, Some(16384));
        assert_eq!(
            notices,
            ["PER_GPU_VRAM_MIB is deprecated: use HAMI_KAI__PER_GPU_VRAM_MIB"]
        );
        let (s, notices) = Settings::load_from_env(
            None,
            env(&[
                ("PER_GPU_VRAM_MIB", "1"),
                ("HAMI_KAI__PER_GPU_VRAM_MIB", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(s.kai.per_gpu_vram_mib, Some(2));
        assert_eq!(notices.len(), 1);
        let (s, notices) =
            Settings::load_from_env(None, env(&[("HAMI_LOG_FORMAT", "json")])).unwrap();
        assert_eq!(s.server.log_format, LogFormat::Json);
        assert!(notices.is_empty());
        let (s, _) = Settings::load_from_env(
            None,
            env(&[
                ("HAMI_LOG_FORMAT", "json"),
                ("HAMI_SERVER__LOGFORMAT", "text"),
            ]),
        )
        .unwrap();
        assert_eq!(s.server.log_format, LogFormat::Text);
    }
}

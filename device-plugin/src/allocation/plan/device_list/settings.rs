//! The device list settings under HAMi's names (`cmd/device-plugin/nvidia/main.go`, v2.10.0:
//! the flag names and `EnvVars`), parsed once into [`super::DeviceListSettings`]. Every error
//! names the variable (and flag), the value and the accepted forms; HAMi's own checks
//! (`validateFlags`, `spec.AssertChannelIDsValid`) are kept, and a few it lacks are added where a
//! value would start containers without their GPUs.
//!
//! One parse per HAMi setting, each with its error text and its unit tests.

use serde::Serialize;

use super::{
    DEFAULT_CDI_ANNOTATION_PREFIX, DeviceIdStrategy, DeviceListSettings, DeviceListStrategies,
    DeviceListStrategy,
};

/// HAMi's default of `DRIVER_ROOT_CTR_PATH` (`spec.DefaultContainerDriverRoot`).
pub const DEFAULT_CONTAINER_DRIVER_ROOT: &str = "/driver-root";

/// The device list settings of `run` and `plan` as given (the command line reads them under
/// HAMi's flag and variable names). Values are kept as given and parsed by
/// [`DeviceListArgs::parse`], so that an error names the variable.
#[derive(Debug, Clone, Default)]
pub struct DeviceListArgs {
    /// How the container runtime learns the devices: a comma-separated list of envvar,
    /// volume-mounts, cdi-annotations, cdi-cri (default envvar).
    pub device_list_strategy: Vec<String>,
    /// How devices are named in the device list: uuid or index (default uuid).
    pub device_id_strategy: Option<String>,
    /// Pass the GPUs' device nodes (/dev/nvidia<minor>, /dev/nvidiactl, ...) to kubelet as
    /// DeviceSpecs (default false).
    pub pass_device_specs: Option<String>,
    /// The NVIDIA driver's root on the host (default /); the device nodes' root unless
    /// NVIDIA_DEV_ROOT is given.
    pub nvidia_driver_root: Option<String>,
    /// The root of the NVIDIA device nodes on the host (default NVIDIA_DRIVER_ROOT).
    pub dev_root: Option<String>,
    /// Where the driver root is mounted in this container (default /driver-root): where IMEX
    /// channels are looked for.
    pub driver_root_ctr_path: Option<String>,
    /// Prefix of the CDI annotation keys (default cdi.k8s.io/).
    pub cdi_annotation_prefix: Option<String>,
    /// HAMi writes it into the CDI spec it generates; hami-device-plugin generates none, so it has
    /// no effect (generate the spec with nvidia-ctk cdi generate --nvidia-cdi-hook-path).
    pub nvidia_cdi_hook_path: Option<String>,
    /// Containers get NVIDIA_GDRCOPY=enabled (CDI: nvidia.com/gdrcopy=all).
    pub gdrcopy_enabled: Option<String>,
    /// Containers get NVIDIA_GDS=enabled (CDI: nvidia.com/gds=all).
    pub gds_enabled: Option<String>,
    /// Containers get NVIDIA_MOFED=enabled (CDI: nvidia.com/mofed=all).
    pub mofed_enabled: Option<String>,
    /// IMEX channels to inject: empty or 0.
    pub imex_channel_ids: Vec<String>,
    /// Refuse to start when a requested IMEX channel does not exist (default false: skip it).
    pub imex_required: Option<String>,
}

/// A setting by its variable and flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// HAMi's environment variable.
    pub env: &'static str,
    /// HAMi's flag.
    pub flag: &'static str,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (--{})", self.env, self.flag)
    }
}

/// The settings' keys.
pub mod keys {
    use super::Key;
    /// `DEVICE_LIST_STRATEGY`.
    pub const DEVICE_LIST_STRATEGY: Key = Key {
        env: "DEVICE_LIST_STRATEGY",
        flag: "device-list-strategy",
    };
    /// `DEVICE_ID_STRATEGY`.
    pub const DEVICE_ID_STRATEGY: Key = Key {
        env: "DEVICE_ID_STRATEGY",
        flag: "device-id-strategy",
    };
    /// `PASS_DEVICE_SPECS`.
    pub const PASS_DEVICE_SPECS: Key = Key {
        env: "PASS_DEVICE_SPECS",
        flag: "pass-device-specs",
    };
    /// `NVIDIA_DRIVER_ROOT`.
    pub const NVIDIA_DRIVER_ROOT: Key = Key {
        env: "NVIDIA_DRIVER_ROOT",
        flag: "nvidia-driver-root",
    };
    /// `NVIDIA_DEV_ROOT`.
    pub const NVIDIA_DEV_ROOT: Key = Key {
        env: "NVIDIA_DEV_ROOT",
        flag: "dev-root",
    };
    /// `DRIVER_ROOT_CTR_PATH`.
    pub const DRIVER_ROOT_CTR_PATH: Key = Key {
        env: "DRIVER_ROOT_CTR_PATH",
        flag: "driver-root-ctr-path",
    };
    /// `CDI_ANNOTATION_PREFIX`.
    pub const CDI_ANNOTATION_PREFIX: Key = Key {
        env: "CDI_ANNOTATION_PREFIX",
        flag: "cdi-annotation-prefix",
    };
    /// `NVIDIA_CDI_HOOK_PATH`.
    pub const NVIDIA_CDI_HOOK_PATH: Key = Key {
        env: "NVIDIA_CDI_HOOK_PATH",
        flag: "nvidia-cdi-hook-path",
    };
    /// `GDRCOPY_ENABLED`.
    pub const GDRCOPY_ENABLED: Key = Key {
        env: "GDRCOPY_ENABLED",
        flag: "gdrcopy-enabled",
    };
    /// `GDS_ENABLED`.
    pub const GDS_ENABLED: Key = Key {
        env: "GDS_ENABLED",
        flag: "gds-enabled",
    };
    /// `MOFED_ENABLED`.
    pub const MOFED_ENABLED: Key = Key {
        env: "MOFED_ENABLED",
        flag: "mofed-enabled",
    };
    /// `IMEX_CHANNEL_IDS`.
    pub const IMEX_CHANNEL_IDS: Key = Key {
        env: "IMEX_CHANNEL_IDS",
        flag: "imex-channel-ids",
    };
    /// `IMEX_REQUIRED`.
    pub const IMEX_REQUIRED: Key = Key {
        env: "IMEX_REQUIRED",
        flag: "imex-required",
    };
}

/// An invalid device list setting: the key, the value, and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: invalid value {value:?}: {expected}")]
pub struct DeviceListConfigError {
    /// The setting.
    pub key: Key,
    /// The value as given.
    pub value: String,
    /// What is wrong and what is accepted.
    pub expected: String,
}

/// The IMEX channels asked for (`imex.channelIDs`, `imex.required`), looked for at start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImexRequest {
    /// `IMEX_CHANNEL_IDS`: empty or `[0]`.
    pub ids: Vec<u32>,
    /// `IMEX_REQUIRED`.
    pub required: bool,
}

/// The parsed flags: the settings (IMEX channels not yet looked for), the IMEX request and
/// where to look, and notes for the start-up log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedDeviceList {
    /// The settings; `imex_channels` is empty until the channels are looked for.
    pub settings: DeviceListSettings,
    /// The IMEX channels asked for.
    pub imex: ImexRequest,
    /// `DRIVER_ROOT_CTR_PATH` (default `/driver-root`).
    pub container_driver_root: String,
    /// Things to log at start (a setting with no effect, what a CDI strategy relies on).
    pub notes: Vec<String>,
}

/// Go's `strconv.ParseBool` forms (urfave/cli reads `BoolFlag` variables with it).
pub const GO_BOOL_FORMS: &str = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False";

/// A boolean as Go's `strconv.ParseBool` reads it (HAMi's flags and variables through
/// urfave/cli, and `CUDA_DISABLE_CONTROL`); `None` for anything else. The one copy of that
/// grammar in the plugin: each caller decides what an empty or unknown value means.
pub fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn parse_bool(key: Key, value: Option<&str>) -> Result<bool, DeviceListConfigError> {
    match value.map(str::trim) {
        None | Some("") => Ok(false),
        Some(v) => go_bool(v).ok_or_else(|| DeviceListConfigError {
            key,
            value: v.to_owned(),
            expected: format!("expected a boolean: {GO_BOOL_FORMS}"),
        }),
    }
}

/// An absolute directory, cleaned of repeated and trailing slashes; `.` and `..` refused.
fn parse_root(key: Key, value: &str) -> Result<String, DeviceListConfigError> {
    let err = |why: &str| DeviceListConfigError {
        key,
        value: value.to_owned(),
        expected: format!("{why}: expected an absolute directory such as / or /run/nvidia/driver"),
    };
    if !value.starts_with('/') {
        return Err(err("not an absolute path"));
    }
    let parts: Vec<&str> = value.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(err("has a . or .. component"));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(err("has a control character"));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// A DNS-1123 subdomain (the prefix part of an annotation key).
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

impl DeviceListArgs {
    /// Parses and checks the flags.
    pub fn parse(&self) -> Result<ParsedDeviceList, DeviceListConfigError> {
        use keys::*;
        let strategies = self.strategies()?;
        let id_strategy = match self.device_id_strategy.as_deref().map(str::trim) {
            None | Some("uuid") => DeviceIdStrategy::Uuid,
            Some("index") => DeviceIdStrategy::Index,
            Some(other) => {
                return Err(DeviceListConfigError {
                    key: DEVICE_ID_STRATEGY,
                    value: other.to_owned(),
                    expected: "expected uuid or index".to_owned(),
                });
            }
        };
        let pass_device_specs = parse_bool(PASS_DEVICE_SPECS, self.pass_device_specs.as_deref())?;
        // An empty value is unset, as for HAMi (`NvidiaDevRoot == ""` falls back to the driver
        // root; urfave/cli keeps a string default for an empty variable's flag).
        let given = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        let driver_root = match given(&self.nvidia_driver_root) {
            Some(v) => parse_root(NVIDIA_DRIVER_ROOT, &v)?,
            None => "/".to_owned(),
        };
        let dev_root = match given(&self.dev_root) {
            Some(v) => parse_root(NVIDIA_DEV_ROOT, &v)?,
            None => driver_root,
        };
        let container_driver_root = match given(&self.driver_root_ctr_path) {
            Some(v) => parse_root(DRIVER_ROOT_CTR_PATH, &v)?,
            None => DEFAULT_CONTAINER_DRIVER_ROOT.to_owned(),
        };
        let cdi_annotation_prefix = match self.cdi_annotation_prefix.as_deref() {
            None => DEFAULT_CDI_ANNOTATION_PREFIX.to_owned(),
            Some(p) => p.to_owned(),
        };
        if strategies.includes(DeviceListStrategy::CdiAnnotations) {
            check_cdi_prefix(&cdi_annotation_prefix)?;
        }
        let imex = ImexRequest {
            ids: self.imex_channel_ids()?,
            required: parse_bool(IMEX_REQUIRED, self.imex_required.as_deref())?,
        };
        let settings = DeviceListSettings {
            strategies,
            id_strategy,
            pass_device_specs,
            dev_root,
            cdi_annotation_prefix,
            gdrcopy: parse_bool(GDRCOPY_ENABLED, self.gdrcopy_enabled.as_deref())?,
            gds: parse_bool(GDS_ENABLED, self.gds_enabled.as_deref())?,
            mofed: parse_bool(MOFED_ENABLED, self.mofed_enabled.as_deref())?,
            imex_channels: Vec::new(),
        };
        let notes = self.notes(&settings);
        Ok(ParsedDeviceList {
            settings,
            imex,
            container_driver_root,
            notes,
        })
    }

    /// `DEVICE_LIST_STRATEGY`: every comma-separated item (flag given several times, or one
    /// variable) a strategy; none given is HAMi's default `envvar`; an empty list is refused
    /// (HAMi would answer no device list at all: containers without GPUs).
    fn strategies(&self) -> Result<DeviceListStrategies, DeviceListConfigError> {
        let key = keys::DEVICE_LIST_STRATEGY;
        if self.device_list_strategy.is_empty() {
            return Ok(DeviceListStrategies::default());
        }
        let raw = self.device_list_strategy.join(",");
        let accepted: Vec<&str> = DeviceListStrategy::ALL.iter().map(|s| s.as_str()).collect();
        let accepted = accepted.join(", ");
        let mut list = Vec::new();
        for item in raw.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(DeviceListConfigError {
                    key,
                    value: raw.clone(),
                    expected: format!(
                        "an empty strategy would give containers no device list (no GPUs): expected a comma-separated list of {accepted}, e.g. envvar"
                    ),
                });
            }
            let strategy =
                DeviceListStrategy::parse(item).ok_or_else(|| DeviceListConfigError {
                    key,
                    value: raw.clone(),
                    expected: format!(
                        "{item:?} is not a strategy: expected a comma-separated list of {accepted}"
                    ),
                })?;
            list.push(strategy);
        }
        DeviceListStrategies::new(list).ok_or_else(|| DeviceListConfigError {
            key,
            value: raw,
            expected: format!("expected a comma-separated list of {accepted}"),
        })
    }

    /// `IMEX_CHANNEL_IDS`: comma-separated integers, `[]` or `[0]` (HAMi's
    /// `spec.AssertChannelIDsValid`).
    fn imex_channel_ids(&self) -> Result<Vec<u32>, DeviceListConfigError> {
        let key = keys::IMEX_CHANNEL_IDS;
        let raw = self.imex_channel_ids.join(",");
        let invalid = |why: String| DeviceListConfigError {
            key,
            value: raw.clone(),
            expected: why,
        };
        let mut ids = Vec::new();
        for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let id: u32 = item.parse().map_err(|_| {
                invalid(format!(
                    "{item:?} is not a channel number: expected nothing or 0"
                ))
            })?;
            ids.push(id);
        }
        if !(ids.is_empty() || ids == [0]) {
            return Err(invalid(format!(
                "IMEX channelIDs must be [] or [0]; found {ids:?}"
            )));
        }
        Ok(ids)
    }

    /// What the start-up log should say about these settings.
    fn notes(&self, settings: &DeviceListSettings) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(hook) = self
            .nvidia_cdi_hook_path
            .as_deref()
            .filter(|s| !s.is_empty())
        {
            notes.push(format!(
                "{}={hook:?} has no effect: HAMi writes it into the CDI spec it generates, hami-device-plugin generates no CDI spec (nvidia-ctk cdi generate --nvidia-cdi-hook-path does)",
                keys::NVIDIA_CDI_HOOK_PATH
            ));
        }
        if settings.strategies.any_cdi() {
            notes.push(format!(
                "{}: CDI devices are named {}/gpu=<{}>; their spec must be generated on the node by the NVIDIA Container Toolkit (nvidia-ctk cdi generate, or its nvidia-cdi-refresh service{}), or the runtime cannot create the containers",
                keys::DEVICE_LIST_STRATEGY,
                super::CDI_VENDOR,
                settings.id_strategy.as_str(),
                if settings.gdrcopy || settings.gds || settings.mofed {
                    "; --mode=gdrcopy|gds|mofed for those devices"
                } else {
                    ""
                }
            ));
        }
        if settings.pass_device_specs && settings.strategies.all_cdi() {
            notes.push(format!(
                "{} has no effect with only CDI strategies (as in HAMi): the CDI spec carries the device nodes",
                keys::PASS_DEVICE_SPECS
            ));
        }
        notes
    }
}

/// `CDI_ANNOTATION_PREFIX` must make valid annotation keys the runtime reads: a DNS subdomain
/// followed by `/` (containerd reads `cdi.k8s.io/`; the NVIDIA runtime's CDI mode reads the
/// prefixes it is configured with, e.g. `nvidia.cdi.k8s.io/`).
fn check_cdi_prefix(prefix: &str) -> Result<(), DeviceListConfigError> {
    let ok = prefix.strip_suffix('/').is_some_and(is_dns_subdomain);
    if ok {
        return Ok(());
    }
    Err(DeviceListConfigError {
        key: keys::CDI_ANNOTATION_PREFIX,
        value: prefix.to_owned(),
        expected: "expected a DNS subdomain followed by '/', e.g. cdi.k8s.io/ or nvidia.cdi.k8s.io/ (the annotation keys would otherwise be invalid or read by no runtime)".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut DeviceListArgs)) -> DeviceListArgs {
        let mut a = DeviceListArgs::default();
        f(&mut a);
        a
    }

    fn err(a: &DeviceListArgs) -> String {
        match a.parse() {
            Err(e) => e.to_string(),
            Ok(p) => format!("unexpectedly valid: {p:?}"),
        }
    }

    #[test]
    fn defaults_are_hamis() {
        let p = DeviceListArgs::default().parse();
        assert_eq!(
            p.as_ref().map(|p| &p.settings),
            Ok(&DeviceListSettings::default())
        );
        let p = p.ok();
        assert_eq!(
            p.as_ref().map(|p| p.container_driver_root.as_str()),
            Some("/driver-root")
        );
        assert_eq!(p.map(|p| p.imex), Some(ImexRequest::default()));
    }

    #[test]
    fn strategies_lists_and_roots() {
        let a = args(|a| {
            a.device_list_strategy = vec!["envvar, cdi-cri".into(), "volume-mounts".into()];
            a.device_id_strategy = Some("index".into());
            a.pass_device_specs = Some("True".into());
            a.nvidia_driver_root = Some("/run/nvidia/driver/".into());
            a.gds_enabled = Some("1".into());
            a.imex_channel_ids = vec!["0".into()];
            a.imex_required = Some("t".into());
        });
        let p = a.parse().map_err(|e| e.to_string());
        let Ok(p) = p else { panic!("{p:?}") };
        use DeviceListStrategy::*;
        assert_eq!(
            p.settings.strategies.as_slice(),
            [Envvar, VolumeMounts, CdiCri]
        );
        assert_eq!(p.settings.id_strategy, DeviceIdStrategy::Index);
        assert!(p.settings.pass_device_specs && p.settings.gds && !p.settings.mofed);
        assert_eq!(p.settings.dev_root, "/run/nvidia/driver", "the driver root");
        assert_eq!(
            p.imex,
            ImexRequest {
                ids: vec![0],
                required: true
            }
        );
        let a = args(|a| {
            a.nvidia_driver_root = Some("/run/nvidia/driver".into());
            a.dev_root = Some("//".into());
        });
        assert_eq!(a.parse().map(|p| p.settings.dev_root), Ok("/".to_owned()));
    }

    #[test]
    fn errors_name_key_value_and_accepted_forms() {
        let cases: Vec<(DeviceListArgs, &[&str])> = vec![
            (
                args(|a| a.device_list_strategy = vec![String::new()]),
                &[
                    "DEVICE_LIST_STRATEGY (--device-list-strategy)",
                    "\"\"",
                    "no GPUs",
                    "envvar, volume-mounts, cdi-annotations, cdi-cri",
                ],
            ),
            (
                args(|a| a.device_list_strategy = vec!["envvar,cdi".into()]),
                &[
                    "DEVICE_LIST_STRATEGY",
                    "\"envvar,cdi\"",
                    "\"cdi\" is not a strategy",
                    "cdi-cri",
                ],
            ),
            (
                args(|a| a.device_id_strategy = Some("serial".into())),
                &[
                    "DEVICE_ID_STRATEGY (--device-id-strategy)",
                    "\"serial\"",
                    "uuid or index",
                ],
            ),
            (
                args(|a| a.pass_device_specs = Some("yes".into())),
                &[
                    "PASS_DEVICE_SPECS (--pass-device-specs)",
                    "\"yes\"",
                    "TRUE, true",
                ],
            ),
            (
                args(|a| a.mofed_enabled = Some("on".into())),
                &["MOFED_ENABLED (--mofed-enabled)", "\"on\""],
            ),
            (
                args(|a| a.dev_root = Some("run/nvidia".into())),
                &["NVIDIA_DEV_ROOT (--dev-root)", "\"run/nvidia\"", "absolute"],
            ),
            (
                args(|a| a.nvidia_driver_root = Some("/a/../b".into())),
                &["NVIDIA_DRIVER_ROOT", "\"/a/../b\"", ".."],
            ),
            (
                args(|a| a.imex_channel_ids = vec!["1".into()]),
                &[
                    "IMEX_CHANNEL_IDS (--imex-channel-ids)",
                    "\"1\"",
                    "[] or [0]; found [1]",
                ],
            ),
            (
                args(|a| a.imex_channel_ids = vec!["0,x".into()]),
                &["IMEX_CHANNEL_IDS", "\"x\" is not a channel number"],
            ),
            (
                args(|a| {
                    a.device_list_strategy = vec!["cdi-annotations".into()];
                    a.cdi_annotation_prefix = Some("nvidia.cdi.k8s.io".into());
                }),
                &[
                    "CDI_ANNOTATION_PREFIX (--cdi-annotation-prefix)",
                    "\"nvidia.cdi.k8s.io\"",
                    "followed by '/'",
                ],
            ),
        ];
        for (a, wanted) in cases {
            let e = err(&a);
            for w in wanted {
                assert!(e.contains(w), "{e:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn a_custom_cdi_prefix_is_checked_only_where_it_is_used() {
        let a = args(|a| a.cdi_annotation_prefix = Some("x".into()));
        assert!(a.parse().is_ok());
        let a = args(|a| {
            a.device_list_strategy = vec!["cdi-annotations".into()];
            a.cdi_annotation_prefix = Some("nvidia.cdi.k8s.io/".into());
        });
        assert!(a.parse().is_ok());
    }

    #[test]
    fn notes_say_what_has_no_effect() {
        let a = args(|a| {
            a.device_list_strategy = vec!["cdi-cri".into()];
            a.nvidia_cdi_hook_path = Some("/usr/bin/nvidia-cdi-hook".into());
            a.pass_device_specs = Some("true".into());
        });
        let notes = a.parse().map(|p| p.notes).unwrap_or_default();
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].starts_with("NVIDIA_CDI_HOOK_PATH (--nvidia-cdi-hook-path)=\"/usr/bin/nvidia-cdi-hook\" has no effect"));
        assert!(
            notes[1].contains("nvidia.com/gpu=<uuid>")
                && notes[1].contains("nvidia-ctk cdi generate")
        );
        assert!(notes[2].starts_with("PASS_DEVICE_SPECS (--pass-device-specs) has no effect"));
    }
}

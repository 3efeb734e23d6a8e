//! The webhook's settings: what decisions read and how the server runs.
//!
//! Loaded with the shared layered loader: built-in defaults < a YAML/JSON file (`--config`) <
//! environment variables prefixed `HAMI_` with `__` between levels (e.g.
//! `HAMI_NVIDIA__GPUCOREPOLICY=force`, `HAMI_SERVER__BODYLIMITBYTES=1048576`). Keys use HAMi's
//! names where HAMi has them: the `nvidia:` section mirrors HAMi's `device-config.yaml` (its other
//! keys are accepted and ignored, so HAMi's own file can be passed as is).
//!
//! The `server:` and `kai:` sections are ours: an unknown key there is refused with a message
//! naming it. The top level and `nvidia:` stay lenient, for HAMi's file.
//!
//! Old environment names keep working, each with a deprecation notice (logged once by the
//! program): `PER_GPU_VRAM_MIB` → `HAMI_KAI__PER_GPU_VRAM_MIB`. `HAMI_LOG_FORMAT`, the name the
//! other hami-limits programs read, sets `server.logFormat` too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_shared::values::CorePolicy;
use serde::{Deserialize, Serialize};

use crate::kai::settings::KaiSettings;

/// Every setting of the webhook. Each field has a documented default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// HAMi's NVIDIA device settings (same names as HAMi's `device-config.yaml` `nvidia:`).
    pub nvidia: NvidiaSettings,
    /// The HAMi scheduler that GPU pods are sent to (HAMi's `--scheduler-name`).
    pub scheduler_name: String,
    /// Deny a privileged GPU container (it sees every GPU on the node); when false it is allowed
    /// with a warning.
    pub deny_privileged_gpu_containers: bool,
    /// How the HTTPS server runs.
    pub server: ServerSettings,
    /// KAI fractional-sharing pods.
    pub kai: KaiSettings,
    /// A HAMi `device-config.yaml` (e.g. HAMi's own ConfigMap, mounted) whose `nvidia:` section is
    /// used instead of one in this file (its other sections are ignored). Read by [`Self::load`];
    /// this file may then have no `nvidia:` section.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_config_file: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nvidia: NvidiaSettings::default(),
            scheduler_name: "hami-scheduler".to_owned(),
            deny_privileged_gpu_containers: true,
            server: ServerSettings::default(),
            kai: KaiSettings::default(),
            device_config_file: None,
        }
    }
}

/// The HAMi resource names and the core policy. Names as in HAMi's device config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NvidiaSettings {
    /// Default `nvidia.com/gpu`.
    pub resource_count_name: String,
    /// Default `nvidia.com/gpumem`.
    pub resource_memory_name: String,
    /// Default `nvidia.com/gpumem-percentage`.
    pub resource_memory_percentage_name: String,
    /// Default `nvidia.com/gpucores`.
    pub resource_core_name: String,
    /// Default `nvidia.com/priority`.
    pub resource_priority_name: String,
    /// `default` (nothing set), `force` or `disable` (set as `GPU_CORE_UTILIZATION_POLICY`).
    pub gpu_core_policy: CorePolicy,
    /// HAMi's `defaultGPUNum`: a container whose limits name the memory, memory-percentage or
    /// core resource but not the count gets `<resourceCountName>: N` (0: nothing added). Default 1.
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: u32,
    /// HAMi's `overwriteEnv`: every container of a HAMi pod that gets no GPU gets
    /// `NVIDIA_VISIBLE_DEVICES=none`. Default false.
    pub overwrite_env: bool,
}

impl Default for NvidiaSettings {
    fn default() -> Self {
        Self {
            resource_count_name: "nvidia.com/gpu".to_owned(),
            resource_memory_name: "nvidia.com/gpumem".to_owned(),
            resource_memory_percentage_name: "nvidia.com/gpumem-percentage".to_owned(),
            resource_core_name: "nvidia.com/gpucores".to_owned(),
            resource_priority_name: "nvidia.com/priority".to_owned(),
            gpu_core_policy: CorePolicy::Default,
            default_gpu_num: 1,
            overwrite_env: false,
        }
    }
}

impl NvidiaSettings {
    /// The resource names that make a container a HAMi GPU container.
    #[must_use]
    pub fn gpu_resource_names(&self) -> [&str; 5] {
        [
            &self.resource_count_name,
            &self.resource_memory_name,
            &self.resource_memory_percentage_name,
            &self.resource_core_name,
            &self.resource_priority_name,
        ]
    }
}

/// Log line format (the settings-file spelling of [`hami_ops::LogFormat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON object per line, event fields at the top level.
    Json,
}

impl From<LogFormat> for hami_ops::LogFormat {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Text => Self::Text,
            LogFormat::Json => Self::Json,
        }
    }
}

impl From<hami_ops::LogFormat> for LogFormat {
    fn from(f: hami_ops::LogFormat) -> Self {
        match f {
            hami_ops::LogFormat::Text => Self::Text,
            hami_ops::LogFormat::Json => Self::Json,
        }
    }
}

/// How the HTTPS server runs. Unknown keys are refused (the message names the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ServerSettings {
    /// HTTPS address for `POST /mutate`. Default `0.0.0.0:9443`.
    pub listen: SocketAddr,
    /// Plain-HTTP address for `/healthz`, `/readyz`, `/metrics`. Default `0.0.0.0:9090`.
    pub metrics_listen: SocketAddr,
    /// PEM certificate chain file. Default `/tls/tls.crt`.
    pub tls_cert: PathBuf,
    /// PEM private key file. Default `/tls/tls.key`.
    pub tls_key: PathBuf,
    /// Largest accepted request body; larger gets HTTP 413. Default 8 MiB.
    pub body_limit_bytes: usize,
    /// Time allowed to receive a request: its headers on HTTP/1.1 (else the connection is closed)
    /// and its whole body from the headers on (else HTTP 408). Default 10.
    pub request_timeout_seconds: u64,
    /// Time allowed for a TLS handshake. Default 10.
    pub tls_handshake_timeout_seconds: u64,
    /// A connection with no request in progress is closed after this long: from accept to the
    /// first request's headers (TLS handshake, HTTP/1.1-or-HTTP/2 detection, the headers), and
    /// between requests (HTTP/1.1 keep-alive, an idle HTTP/2 connection, which gets a GOAWAY
    /// first). Default 10.
    pub idle_timeout_seconds: u64,
    /// Reviews processed at once, counted once the body has arrived; more wait. Default 256.
    pub max_concurrent_requests: usize,
    /// Request body bytes held in memory at once over all requests; the first 64 KiB of each
    /// body are not counted, so small reviews never wait for room. A request that finds no room
    /// within `requestTimeoutSeconds` gets HTTP 503. Never less than `bodyLimitBytes`.
    /// Default 8 MiB (one body at the default limit).
    pub body_memory_bytes: usize,
    /// Open connections at once. At the limit, a new connection closes the connection idle the
    /// longest (no request in progress); when every connection has one in progress, new ones wait
    /// in the listen backlog. Default 256: an API server opens a handful of (HTTP/2) connections;
    /// each open connection costs about 17 KiB, so with the body budget full (8 MiB) a client
    /// that opens thousands of connections (the idlest evicted) still leaves the peak RSS under
    /// 30 MiB (`bench/hostile/hostile.py`: 27.5 MiB with 1,816 hostile connections).
    pub max_connections: usize,
    /// Tokio worker threads: 0 = one per CPU this process may run on; 1 = a single-threaded
    /// runtime. Default 0.
    pub worker_threads: usize,
    /// How often the certificate and key files are checked for a change. Default 5.
    pub cert_reload_interval_seconds: u64,
    /// After SIGTERM, how long in-flight requests may take before connections are closed. Default 25.
    pub shutdown_grace_seconds: u64,
    /// `text` or `json`. Default `text`.
    pub log_format: LogFormat,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 9443)),
            metrics_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            tls_cert: PathBuf::from("/tls/tls.crt"),
            tls_key: PathBuf::from("/tls/tls.key"),
            body_limit_bytes: 8 << 20,
            request_timeout_seconds: 10,
            tls_handshake_timeout_seconds: 10,
            idle_timeout_seconds: 10,
            max_concurrent_requests: 256,
            body_memory_bytes: 8 << 20,
            max_connections: 256,
            worker_threads: 0,
            cert_reload_interval_seconds: 5,
            shutdown_grace_seconds: 25,
            log_format: LogFormat::Text,
        }
    }
}

impl ServerSettings {
    /// [`Self::request_timeout_seconds`] as a duration (at least 1 s).
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_seconds.max(1))
    }

    /// [`Self::tls_handshake_timeout_seconds`] as a duration (at least 1 s).
    #[must_use]
    pub fn tls_handshake_timeout(&self) -> Duration {
        Duration::from_secs(self.tls_handshake_timeout_seconds.max(1))
    }

    /// [`Self::idle_timeout_seconds`] as a duration (at least 1 s).
    #[must_use]
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_seconds.max(1))
    }

    /// [`Self::body_memory_bytes`], never less than [`Self::body_limit_bytes`] (a body within the
    /// limit must always fit).
    #[must_use]
    pub fn body_memory(&self) -> usize {
        self.body_memory_bytes.max(self.body_limit_bytes)
    }

    /// [`Self::cert_reload_interval_seconds`] as a duration (at least 1 s).
    #[must_use]
    pub fn cert_reload_interval(&self) -> Duration {
        Duration::from_secs(self.cert_reload_interval_seconds.max(1))
    }

    /// [`Self::shutdown_grace_seconds`] as a duration.
    #[must_use]
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_seconds)
    }
}

/// A settings file or environment value that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

/// Environment names that still work, each with the name to use instead.
pub const DEPRECATED_ENV: [(&str, &str); 1] = [("PER_GPU_VRAM_MIB", "HAMI_KAI__PER_GPU_VRAM_MIB")];

/// `HAMI_LOG_FORMAT`: the log format variable every hami-limits program reads.
pub const ENV_LOG_FORMAT: &str = "HAMI_LOG_FORMAT";

/// Map the old environment names onto the layered ones (a layered name, when also set, wins) and
/// say what was mapped, so that every variable is read by one mechanism.
fn with_current_names(
    env: impl IntoIterator<Item = (String, String)>,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut env: Vec<(String, String)> = env.into_iter().collect();
    let mut notices = Vec::new();
    let renames = DEPRECATED_ENV
        .iter()
        .map(|&(old, new)| (old, new, true))
        .chain([(ENV_LOG_FORMAT, "HAMI_SERVER__LOGFORMAT", false)]);
    for (old, new, deprecated) in renames {
        let Some(value) = env.iter().find(|(k, _)| k == old).map(|(_, v)| v.clone()) else {
            continue;
        };
        let set = |k: &str| {
            let fold = |s: &str| s.replace('_', "").to_ascii_lowercase();
            fold(k) == fold(new)
        };
        if env.iter().any(|(k, _)| set(k)) {
            if deprecated {
                notices.push(format!("{old} is deprecated and ignored: {new} is set"));
            }
            continue;
        }
        if deprecated {
            notices.push(format!("{old} is deprecated: use {new}"));
        }
        env.push((new.to_owned(), value));
    }
    (env, notices)
}

/// The settings file's text with the `nvidia:` section of its `deviceConfigFile` (a HAMi
/// `device-config.yaml`) put in, so that the layered loader (and the `HAMI_NVIDIA__*` variables
/// over it) sees one document. Unchanged when the file names no `deviceConfigFile`.
fn with_device_config(path: &Path, text: &str) -> Result<String, SettingsError> {
    let bad = |what: String| SettingsError(format!("{}: {what}", path.display()));
    let Ok(serde_yaml_ng::Value::Mapping(mut doc)) = serde_yaml_ng::from_str(text) else {
        // Not a mapping: the layered loader reports it with its own message.
        return Ok(text.to_owned());
    };
    let Some(device_file) = doc.get("deviceConfigFile") else {
        return Ok(text.to_owned());
    };
    let Some(device_file) = device_file.as_str().map(PathBuf::from) else {
        return Err(bad(format!(
            "deviceConfigFile: {device_file:?} is not a path (accepted: an absolute or relative file path)"
        )));
    };
    if doc.contains_key("nvidia") {
        return Err(bad(format!(
            "has both an nvidia: section and deviceConfigFile {}: keep one (the nvidia: section is read from that file)",
            device_file.display()
        )));
    }
    let device_text = std::fs::read_to_string(&device_file).map_err(|source| {
        bad(hami_shared::config::ConfigError::Read {
            path: device_file.clone(),
            source,
        }
        .to_string())
    })?;
    let device: serde_yaml_ng::Value = serde_yaml_ng::from_str(&device_text).map_err(|e| {
        SettingsError(format!(
            "{} (deviceConfigFile of {}): not YAML: {e}",
            device_file.display(),
            path.display()
        ))
    })?;
    let Some(nvidia) = device.get("nvidia").filter(|v| v.is_mapping()) else {
        return Err(SettingsError(format!(
            "{} (deviceConfigFile of {}): has no nvidia: section (a HAMi device-config.yaml has one)",
            device_file.display(),
            path.display()
        )));
    };
    // The section's values are checked here, so that an error names the file they are in.
    serde_yaml_ng::from_value::<NvidiaSettings>(nvidia.clone()).map_err(|e| {
        SettingsError(format!(
            "{} (deviceConfigFile of {}): nvidia: {e}",
            device_file.display(),
            path.display()
        ))
    })?;
    doc.insert("nvidia".into(), nvidia.clone());
    serde_yaml_ng::to_string(&doc).map_err(|e| bad(e.to_string()))
}

impl Settings {
    /// Defaults < `file` (YAML or JSON) < `HAMI_*` environment variables. Returns the settings
    /// and a notice per deprecated environment name in use (the caller logs them once).
    ///
    /// # Errors
    /// A file that cannot be read or a key whose value is not accepted; the message names the file,
    /// the key and the value.
    pub fn load(file: Option<&Path>) -> Result<(Self, Vec<String>), SettingsError> {
        Self::load_from_env(file, std::env::vars())
    }

    /// [`Self::load`] with an explicit environment.
    ///
    /// # Errors
    /// As [`Self::load`].
    pub fn load_from_env<I>(
        file: Option<&Path>,
        env: I,
    ) -> Result<(Self, Vec<String>), SettingsError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let text = match file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|source| {
                SettingsError(
                    hami_shared::config::ConfigError::Read {
                        path: path.to_path_buf(),
                        source,
                    }
                    .to_string(),
                )
            })?),
            None => None,
        };
        let text = match (file, text) {
            (Some(path), Some(text)) => Some(with_device_config(path, &text)?),
            _ => None,
        };
        let file = file
            .zip(text.as_deref())
            .map(|(path, text)| hami_shared::config::FileText { path, text });
        let (env, notices) = with_current_names(env);
        let settings =
            hami_shared::config::load_layered_with_schema::<Settings, _>(file, "HAMI", env)
                .map_err(|e| SettingsError(e.to_string()))?;
        Ok((settings, notices))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_hami() {
        let s = Settings::default();
        assert_eq!(s.nvidia.resource_count_name, "nvidia.com/gpu");
        assert_eq!(s.nvidia.resource_priority_name, "nvidia.com/priority");
        assert_eq!(s.scheduler_name, "hami-scheduler");
        assert!(s.deny_privileged_gpu_containers);
        assert_eq!(s.server.body_limit_bytes, 8 * 1024 * 1024);
    }

    #[test]
    fn hami_device_config_is_accepted_as_is() {
        let yaml = "nvidia:\n  resourceCountName: example.com/gpu\n  defaultMemory: 0\n  deviceSplitCount: 10\n  gpuCorePolicy: force\ncambricon:\n  resourceCountName: x\n";
        let s: Settings = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(s.nvidia.resource_count_name, "example.com/gpu");
        assert_eq!(s.nvidia.gpu_core_policy, CorePolicy::Force);
        assert_eq!(s.nvidia.resource_memory_name, "nvidia.com/gpumem");
    }

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
    fn bad_core_policy_names_value_and_accepted_forms() {
        let err = serde_yaml_ng::from_str::<Settings>("nvidia:\n  gpuCorePolicy: FORCE\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("FORCE") && err.contains("default, force, disable"),
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
        assert_eq!(s.nvidia, NvidiaSettings::default());
    }

    #[test]
    fn missing_basis_from_file_and_environment() {
        use crate::kai::MissingBasis;
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

//! The webhook's settings as plain typed data: what decisions read (`nvidia:`, `kai:`, the
//! scheduler, the privileged-container rule) and how the server runs (`server:`), each field with
//! its documented default. No file or environment is read here: the layered loading (defaults <
//! file < `HAMI_*` variables) is `crate::shell::settings_load`'s.
//!
//! Keys use HAMi's names where HAMi has them: the `nvidia:` section is the part of HAMi's
//! `device-config.yaml` section that admission reads ([`NvidiaAdmission`], in `hami-shared`, the
//! one definition of those keys, which the device plugin's `NvidiaConfig` holds too); its other
//! keys are accepted and ignored, so HAMi's own file can be passed as is. The `server:`, `kai:`
//! and `tenancy:` sections are ours: an unknown key there is refused with a message naming it. The top level and
//! `nvidia:` stay lenient, for HAMi's file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hami_config::NvidiaAdmission;
use hami_ops::LogFormat;
use serde::{Deserialize, Serialize};

use crate::policy::kai::settings::KaiSettings;
use crate::policy::tenancy::settings::TenancySettings;

/// Every setting of the webhook. Each field has a documented default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// HAMi's NVIDIA device settings (same names as HAMi's `device-config.yaml` `nvidia:`).
    pub nvidia: NvidiaAdmission,
    /// The HAMi scheduler that GPU pods are sent to (HAMi's `--scheduler-name`).
    pub scheduler_name: String,
    /// Deny a privileged GPU container (it sees every GPU on the node); when false it is allowed
    /// with a warning.
    pub deny_privileged_gpu_containers: bool,
    /// How the HTTPS server runs.
    pub server: ServerSettings,
    /// KAI fractional-sharing pods.
    pub kai: KaiSettings,
    /// What a tenant's pod may not do, and the operator's per-namespace escape hatches.
    pub tenancy: TenancySettings,
    /// The device plugin's `HOOK_PATH` (HAMi's chart: `/usr/local`): its `Allocate` mounts
    /// `<hookPath>/vgpu` (HAMi-core, the preload library, the container's own folder) at the same
    /// path in HAMi GPU containers, so a container's own mount at, above or inside it is refused.
    pub device_plugin_hook_path: PathBuf,
    /// A HAMi `device-config.yaml` (e.g. HAMi's own ConfigMap, mounted) whose `nvidia:` section is
    /// used instead of one in this file (its other sections are ignored). Read by the loader
    /// (`Settings::load_from_env`, in `crate::shell::settings_load`);
    /// this file may then have no `nvidia:` section.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_config_file: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nvidia: NvidiaAdmission::default(),
            scheduler_name: "hami-scheduler".to_owned(),
            deny_privileged_gpu_containers: true,
            server: ServerSettings::default(),
            kai: KaiSettings::default(),
            tenancy: TenancySettings::default(),
            device_plugin_hook_path: PathBuf::from("/usr/local"),
            device_config_file: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use hami_shared::values::CorePolicy;

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
    fn bad_core_policy_names_value_and_accepted_forms() {
        let err = serde_yaml_ng::from_str::<Settings>("nvidia:\n  gpuCorePolicy: FORCE\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("FORCE") && err.contains("default, force, disable"),
            "{err}"
        );
    }
}

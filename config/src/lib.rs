//! Configuration: built-in defaults < a YAML/JSON file < `HAMI_*` environment variables, and
//! HAMi-compatible device plugin files (`device-config.yaml`, `config.json`).
//!
//! - [`layer`]: the layering engine, a pure function of the file's text and the environment's
//!   pairs: the layers merged as JSON values and deserialized once, with the conversions of
//!   `de` (so an environment string like `"10"` becomes a number), every error naming its key
//!   path and the layer it came from;
//! - [`device`]: HAMi's global `device-config.yaml`, the `nvidia:` section ([`NvidiaConfig`], the
//!   one type of that section for both programs: [`NvidiaAdmission`], the part the webhook reads,
//!   and [`NvidiaPlugin`], the device plugin's);
//! - [`node`]: HAMi's per-node `config.json` ([`NodeConfigFile`]).
//!
//! HAMi's own loader applies no defaults and dereferences missing keys; here every known key has a
//! documented default, unknown keys are ignored (HAMi's files hold sections for other vendors),
//! and a known key with a bad value is an error naming the file (or environment variable), the
//! key, the value and the accepted forms.
//!
//! Environment variables: `<PREFIX>_<SECTION>__<KEY>`, e.g. `HAMI_NVIDIA__LIMIT_DELIVERY=env`.
//! Segments are separated by `__`; matching against the known keys ignores case, `_` and `-`, so
//! `HAMI_NVIDIA__DEVICE_SPLIT_COUNT` sets `nvidia.deviceSplitCount`.
//!
//! Every function here is pure, over a file's text ([`FileText`]) and the environment's pairs: the
//! programs read the file and the environment, so a bad setting is a unit test, not a process.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

mod de;
pub mod device;
mod file;
pub mod layer;
pub mod node;

pub use device::{DeviceConfig, NvidiaAdmission, NvidiaConfig, NvidiaPlugin};
pub use layer::{load_layered_from_env, load_layered_with_schema};
pub use node::{FilterDevices, NodeConfigEntry, NodeConfigFile, OperatingMode};

/// What the loaders of this crate return.
pub type Result<T, E = ConfigLoadError> = std::result::Result<T, E>;

/// A configuration that could not be loaded. Messages name the file or variable, key, value and
/// the accepted forms.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLoadError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML/JSON (or its top level is not a map).
    #[error("cannot parse configuration file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A known key holds a value that is not accepted.
    #[error("{origin}: {key}: invalid value {value}: {reason}")]
    InvalidValue {
        /// The file path, or `environment variable HAMI_...`.
        origin: String,
        /// Dotted key path, e.g. `nvidia.limitDelivery` or `nodeconfig[1].devicesplitcount`.
        key: String,
        /// The value as written (JSON-quoted for strings).
        value: String,
        /// What is wrong, with the accepted forms.
        reason: String,
    },
}

/// A configuration file's text and where it came from (for messages and the format: `.json` or
/// text starting with `{` is JSON, anything else YAML). The programs read the file
/// ([`ConfigLoadError::Read`] for their errors); this crate does no I/O.
#[derive(Debug, Clone, Copy)]
pub struct FileText<'a> {
    /// The file's path.
    pub path: &'a Path,
    /// Its contents.
    pub text: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_topology_node_entry_overrides_global_false_included() {
        let global = DeviceConfig::load_from_env(
            Some(FileText {
                path: Path::new("device-config.yaml"),
                text: "nvidia:\n  enableNumaTopology: true\n",
            }),
            std::iter::empty(),
        )
        .unwrap()
        .nvidia;
        assert_eq!(global.plugin.enable_numa_topology, Some(true));
        let nodes = NodeConfigFile::parse(FileText {
            path: Path::new("config.json"),
            text: r#"{"nodeconfig":[{"name":"a","enablenumatopology":false},{"name":"b","enableNumaTopology":true},{"name":"c"}]}"#,
        })
        .unwrap();
        let on = |n: &str| {
            nodes
                .for_node(n)
                .map_or_else(|| global.clone(), |e| global.with_node(&e))
                .plugin
                .enable_numa_topology
        };
        assert_eq!(on("a"), Some(false));
        assert_eq!(on("b"), Some(true));
        assert_eq!(on("c"), Some(true));
        assert_eq!(NvidiaConfig::default().plugin.enable_numa_topology, None);
        // An environment variable reaches the camelCase key; a non-boolean names the key.
        let env = DeviceConfig::load_from_env(
            None,
            [(
                "HAMI_NVIDIA__ENABLE_NUMA_TOPOLOGY".to_owned(),
                "maybe".to_owned(),
            )],
        )
        .unwrap_err()
        .to_string();
        assert!(
            env.contains("HAMI_NVIDIA__ENABLE_NUMA_TOPOLOGY") && env.contains("enableNumaTopology"),
            "{env}"
        );
        let bad = NodeConfigFile::parse(FileText {
            path: Path::new("config.json"),
            text: r#"{"nodeconfig":[{"name":"a","enablenumatopology":"sometimes"}]}"#,
        })
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("config.json") && bad.contains("enablenumatopology"),
            "{bad}"
        );
    }
}

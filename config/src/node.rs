//! HAMi's per-node device plugin config (`config.json`, `nodeconfig: [...]`): entries matched on
//! the node name, each key an optional override of the global `nvidia:` value.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::FileText;
use super::layer::{Layers, check_log_level, check_scaling};
use hami_shared::names;
use hami_shared::values::LimitDelivery;

/// `operatingmode` of a node entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperatingMode {
    /// GPUs shared through HAMi-core (`hami-core`).
    HamiCore,
    /// MIG (`mig`).
    Mig,
    /// MPS (`mps`).
    Mps,
}

impl OperatingMode {
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "hami-core, mig, mps";

    /// The spelling in HAMi's files.
    pub fn as_str(self) -> &'static str {
        match self {
            OperatingMode::HamiCore => "hami-core",
            OperatingMode::Mig => "mig",
            OperatingMode::Mps => "mps",
        }
    }
}

impl fmt::Display for OperatingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OperatingMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hami-core" => Ok(OperatingMode::HamiCore),
            "mig" => Ok(OperatingMode::Mig),
            "mps" => Ok(OperatingMode::Mps),
            _ => Err(format!("{s:?} is not one of: {}", Self::ACCEPTED)),
        }
    }
}

impl Serialize for OperatingMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for OperatingMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `filterdevices` of a node entry: devices the plugin must not advertise.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FilterDevices {
    /// GPU UUIDs to skip.
    pub uuid: Vec<String>,
    /// GPU indexes to skip.
    pub index: Vec<u32>,
}

/// One entry of `nodeconfig`; every field but `name` is an optional override of the global value.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeConfigEntry {
    /// `name`: matched exactly against `NODE_NAME`.
    pub name: String,
    /// `operatingmode`: `hami-core` | `mig` | `mps`.
    #[serde(rename = "operatingmode")]
    pub operating_mode: Option<OperatingMode>,
    /// `devicesplitcount` (at least 1).
    #[serde(rename = "devicesplitcount")]
    pub device_split_count: Option<u32>,
    /// `devicememoryscaling` (> 0).
    #[serde(rename = "devicememoryscaling")]
    pub device_memory_scaling: Option<f64>,
    /// `devicecorescaling` (> 0).
    #[serde(rename = "devicecorescaling")]
    pub device_core_scaling: Option<f64>,
    /// `libcudaloglevel` 0..=4.
    #[serde(rename = "libcudaloglevel")]
    pub lib_cuda_log_level: Option<u8>,
    /// `preconfigureddevicememory` MiB: overrides the global `preConfiguredDeviceMemory`, `0`
    /// (unset) included — HAMi v2.10 keeps the global value for a `0`
    /// ([`crate::NvidiaConfig::hami_merge_differences`]).
    #[serde(rename = "preconfigureddevicememory")]
    pub pre_configured_device_memory: Option<u64>,
    /// `migstrategy` (kept as written).
    #[serde(rename = "migstrategy")]
    pub mig_strategy: Option<String>,
    /// `filterdevices`.
    #[serde(rename = "filterdevices")]
    pub filter_devices: Option<FilterDevices>,
    /// `enablegetpreferredallocation`.
    #[serde(rename = "enablegetpreferredallocation")]
    pub enable_get_preferred_allocation: Option<bool>,
    /// `limitdelivery` (also accepted as `limitDelivery`): `file` | `env`.
    #[serde(rename = "limitdelivery", alias = "limitDelivery")]
    pub limit_delivery: Option<LimitDelivery>,
    /// `enablenumatopology` (also accepted as `enableNumaTopology`): overrides the global
    /// `enableNumaTopology`, `false` included — HAMi v2.10 keeps a global `true` for a `false`
    /// ([`crate::NvidiaConfig::hami_merge_differences`]).
    #[serde(rename = "enablenumatopology", alias = "enableNumaTopology")]
    pub enable_numa_topology: Option<bool>,
}

impl NodeConfigEntry {
    /// Fields set in `later` override this entry's.
    fn overlay(&mut self, later: &NodeConfigEntry) {
        macro_rules! take {
            ($($f:ident),*) => { $( if later.$f.is_some() { self.$f = later.$f.clone(); } )* };
        }
        take!(
            operating_mode,
            device_split_count,
            device_memory_scaling,
            device_core_scaling,
            lib_cuda_log_level,
            pre_configured_device_memory,
            mig_strategy,
            filter_devices,
            enable_get_preferred_allocation,
            limit_delivery,
            enable_numa_topology
        );
    }

    fn problems(&self, prefix: &str, problems: &mut Vec<(String, String)>) {
        if self.device_split_count == Some(0) {
            problems.push((
                format!("{prefix}devicesplitcount"),
                "expected an integer of at least 1".to_owned(),
            ));
        }
        if let Some(v) = self.device_memory_scaling {
            check_scaling(problems, format!("{prefix}devicememoryscaling"), v);
        }
        if let Some(v) = self.device_core_scaling {
            check_scaling(problems, format!("{prefix}devicecorescaling"), v);
        }
        if let Some(l) = self.lib_cuda_log_level {
            check_log_level(problems, format!("{prefix}libcudaloglevel"), l);
        }
    }
}

/// HAMi's device plugin `config.json`: `{"nodeconfig": [ {...}, ... ]}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeConfigFile {
    /// The per-node entries.
    pub nodeconfig: Vec<NodeConfigEntry>,
}

impl NodeConfigFile {
    /// Parse `config.json` (JSON or YAML). No environment layer: per-node settings live in the
    /// file.
    pub fn parse(file: FileText<'_>) -> crate::Result<Self> {
        let layers = Layers::load(
            Some(file),
            names::CONFIG_ENV_PREFIX,
            std::iter::empty(),
            None,
        )?;
        let config: Self = layers.deserialize()?;
        let mut problems = Vec::new();
        for (i, entry) in config.nodeconfig.iter().enumerate() {
            entry.problems(&format!("nodeconfig[{i}]."), &mut problems);
        }
        match problems.into_iter().next() {
            Some((key, reason)) => Err(layers.invalid(&key, reason)),
            None => Ok(config),
        }
    }

    /// The settings for `node`: every entry whose `name` equals it exactly, later entries
    /// overriding earlier ones field by field (as HAMi applies them in order); `None` if none.
    pub fn for_node(&self, node: &str) -> Option<NodeConfigEntry> {
        let mut matching = self.nodeconfig.iter().filter(|e| e.name == node);
        let mut merged = matching.next()?.clone();
        for later in matching {
            merged.overlay(later);
        }
        Some(merged)
    }
}

//! Layered configuration: built-in defaults < a YAML/JSON file < `HAMI_*` environment variables,
//! and HAMi-compatible device plugin files (`device-config.yaml`, `config.json`).
//!
//! The file is parsed by the `config` crate, which also deserializes the merged layers (so an
//! environment string like `"10"` becomes a number, and every error carries its key path). HAMi's
//! own loader applies no defaults and dereferences missing keys; here every known key has a
//! documented default, unknown keys are ignored (HAMi's files hold sections for other vendors),
//! and a known key with a bad value is an error naming the file (or environment variable), the
//! key, the value and the accepted forms.
//!
//! Environment variables: `<PREFIX>_<SECTION>__<KEY>`, e.g. `HAMI_NVIDIA__LIMIT_DELIVERY=env`.
//! Segments are separated by `__`; matching against the known keys ignores case, `_` and `-`, so
//! `HAMI_NVIDIA__DEVICE_SPLIT_COUNT` sets `nvidia.deviceSplitCount`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value as Json};

use crate::names;
use crate::values::{CorePolicy, LimitDelivery, ResolvedDelivery, resolve_limit_delivery};

/// A configuration that could not be loaded. Messages name the file or variable, key, value and
/// the accepted forms.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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

// ---------------------------------------------------------------------------------------------
// Generic layering
// ---------------------------------------------------------------------------------------------

/// A configuration file's text and where it came from (for messages and the format: `.json` or
/// text starting with `{` is JSON, anything else YAML). The programs read the file
/// ([`ConfigError::Read`] for their errors); this crate does no I/O.
#[derive(Debug, Clone, Copy)]
pub struct FileText<'a> {
    /// The file's path.
    pub path: &'a Path,
    /// Its contents.
    pub text: &'a str,
}

/// Load `T` from `file` and the environment `env` (`<env_prefix>_KEY__SUBKEY`). Defaults come
/// from `T`'s `#[serde(default)]`. Environment keys arrive lowercased and are matched (ignoring
/// case, `_` and `-`) against the keys the file holds; to reach camelCase keys the file does not
/// hold, use [`load_layered_with_schema`], whose defaults list every key.
pub fn load_layered_from_env<T, I>(
    file: Option<FileText<'_>>,
    env_prefix: &str,
    env: I,
) -> Result<T, ConfigError>
where
    T: DeserializeOwned,
    I: IntoIterator<Item = (String, String)>,
{
    Layers::load(file, env_prefix, env, None)?.deserialize()
}

/// [`load_layered_from_env`] for types with `Default + Serialize`: the serialized defaults are the
/// first layer and tell which spelling each key has, so `HAMI_NVIDIA__LIMIT_DELIVERY` (or
/// `limitdelivery` in a file) reaches the field `limitDelivery`.
pub fn load_layered_with_schema<T, I>(
    file: Option<FileText<'_>>,
    env_prefix: &str,
    env: I,
) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
    I: IntoIterator<Item = (String, String)>,
{
    let schema = serde_json::to_value(T::default()).map_err(|e| ConfigError::InvalidValue {
        origin: "built-in defaults".to_owned(),
        key: String::new(),
        value: String::new(),
        reason: e.to_string(),
    })?;
    Layers::load(file, env_prefix, env, Some(schema))?.deserialize()
}

/// The layers of one load, kept apart so that an error can name the layer a value came from.
#[derive(Debug)]
struct Layers {
    defaults: Json,
    file: Option<(PathBuf, Json)>,
    env: Json,
    /// Same shape as `env`, holding the variable name at each leaf.
    env_names: Json,
}

fn fold(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Rename keys to the schema's spelling where they match ignoring case, `_` and `-`.
fn normalize(value: Json, schema: Option<&Json>) -> Json {
    match value {
        Json::Object(map) => {
            let schema_map = schema.and_then(Json::as_object);
            let mut out = Map::new();
            for (k, v) in map {
                let canonical = schema_map
                    .and_then(|s| s.keys().find(|c| fold(c) == fold(&k)).cloned())
                    .unwrap_or(k);
                let child_schema = schema_map.and_then(|s| s.get(&canonical));
                out.insert(canonical, normalize(v, child_schema));
            }
            Json::Object(out)
        }
        Json::Array(items) => {
            let item_schema = schema.and_then(Json::as_array).and_then(|a| a.first());
            Json::Array(
                items
                    .into_iter()
                    .map(|v| normalize(v, item_schema))
                    .collect(),
            )
        }
        other => other,
    }
}

/// Deep merge: objects merge key by key, anything else replaces.
fn merge(base: &mut Json, over: Json) {
    match (base, over) {
        (Json::Object(b), Json::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, over) => *slot = over,
    }
}

fn insert_path(root: &mut Json, path: &[String], leaf: Json) {
    let mut cur = root;
    for seg in path {
        if !cur.is_object() {
            *cur = Json::Object(Map::new());
        }
        let Json::Object(map) = cur else { return };
        cur = map.entry(seg.clone()).or_insert(Json::Null);
    }
    *cur = leaf;
}

#[derive(Debug, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Parse `a.b[1].c` as the `config` crate writes key paths.
fn parse_key_path(key: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in key.split('.') {
        let mut rest = part;
        if let Some(i) = rest.find('[') {
            if i > 0 {
                out.push(Seg::Key(rest[..i].to_owned()));
            }
            rest = &rest[i..];
            while let Some(stripped) = rest.strip_prefix('[') {
                let Some(end) = stripped.find(']') else { break };
                if let Ok(n) = stripped[..end].parse() {
                    out.push(Seg::Index(n));
                }
                rest = &stripped[end + 1..];
            }
            // The `config` crate writes `list[1]key` (no dot after an index).
            if !rest.is_empty() {
                out.push(Seg::Key(rest.trim_start_matches('.').to_owned()));
            }
        } else if !rest.is_empty() {
            out.push(Seg::Key(rest.to_owned()));
        }
    }
    out
}

/// `a.b[1].c`.
fn render_key_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn lookup<'a>(root: &'a Json, path: &[Seg]) -> Option<&'a Json> {
    let mut cur = root;
    for seg in path {
        cur = match seg {
            Seg::Key(k) => cur.get(k)?,
            Seg::Index(i) => cur.get(*i)?,
        };
    }
    Some(cur)
}

fn detect_format(path: &Path, text: &str) -> config::FileFormat {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext.eq_ignore_ascii_case("json")
        || (!ext.eq_ignore_ascii_case("yaml") && text.trim_start().starts_with('{'))
    {
        config::FileFormat::Json
    } else {
        config::FileFormat::Yaml
    }
}

fn file_layer(file: FileText<'_>) -> Result<Json, ConfigError> {
    let FileText { path, text } = file;
    if text.trim().is_empty() {
        return Ok(Json::Object(Map::new()));
    }
    let parse_err = |e: config::ConfigError| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    config::Config::builder()
        .add_source(config::File::from_str(text, detect_format(path, text)))
        .build()
        .map_err(parse_err)?
        .try_deserialize::<Json>()
        .map_err(parse_err)
}

impl Layers {
    fn load<I>(
        file: Option<FileText<'_>>,
        env_prefix: &str,
        env: I,
        schema: Option<Json>,
    ) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let schema = schema.unwrap_or_else(|| Json::Object(Map::new()));
        let file = match file {
            Some(f) => Some((
                f.path.to_path_buf(),
                normalize(file_layer(f)?, Some(&schema)),
            )),
            None => None,
        };
        let mut env_layer = Json::Object(Map::new());
        let mut env_names = Json::Object(Map::new());
        let prefix = format!("{env_prefix}_");
        let mut vars: Vec<(String, String)> = env.into_iter().collect();
        vars.sort();
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let path: Vec<String> = rest
                .split(names::CONFIG_ENV_SEPARATOR)
                .map(str::to_lowercase)
                .collect();
            if path.iter().any(String::is_empty) {
                continue;
            }
            insert_path(&mut env_layer, &path, Json::String(value));
            insert_path(&mut env_names, &path, Json::String(name));
        }
        // Environment keys arrive lowercased; spell them as the defaults or, failing that, the
        // file does, so `HAMI_X__SCHEDULER_NAME` reaches a `schedulerName` the file holds.
        let mut env_schema = schema.clone();
        if let Some((_, f)) = &file {
            merge(&mut env_schema, f.clone());
        }
        Ok(Self {
            env: normalize(env_layer, Some(&env_schema)),
            env_names: normalize(env_names, Some(&env_schema)),
            defaults: schema,
            file,
        })
    }

    fn merged(&self) -> Json {
        let mut merged = self.defaults.clone();
        if let Some((_, f)) = &self.file {
            merge(&mut merged, f.clone());
        }
        merge(&mut merged, self.env.clone());
        merged
    }

    fn deserialize<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        let merged = self.merged().to_string();
        config::Config::builder()
            .add_source(config::File::from_str(&merged, config::FileFormat::Json))
            .build()
            .and_then(config::Config::try_deserialize::<T>)
            .map_err(|e| self.explain(&e))
    }

    /// Which layer set `key`, and the value it set.
    fn origin_of(&self, key: &str) -> (String, String) {
        let path = parse_key_path(key);
        if let Some(Json::String(var)) = lookup(&self.env_names, &path) {
            let value = lookup(&self.env, &path)
                .map(Json::to_string)
                .unwrap_or_default();
            return (format!("environment variable {var}"), value);
        }
        if let Some((file, layer)) = &self.file
            && let Some(v) = lookup(layer, &path)
        {
            return (file.display().to_string(), v.to_string());
        }
        let value = lookup(&self.defaults, &path)
            .map(Json::to_string)
            .unwrap_or_default();
        let origin = match &self.file {
            Some((file, _)) => file.display().to_string(),
            None => "built-in defaults".to_owned(),
        };
        (origin, value)
    }

    fn invalid(&self, key: &str, reason: String) -> ConfigError {
        let (origin, value) = self.origin_of(key);
        ConfigError::InvalidValue {
            origin,
            key: render_key_path(&parse_key_path(key)),
            value,
            reason,
        }
    }

    fn explain(&self, e: &config::ConfigError) -> ConfigError {
        match e {
            config::ConfigError::Type { expected, key, .. } => self.invalid(
                key.as_deref().unwrap_or(""),
                format!("expected {}", friendly_expected(expected)),
            ),
            config::ConfigError::At { error, key, .. } => {
                self.invalid(key.as_deref().unwrap_or(""), error.to_string())
            }
            config::ConfigError::NotFound(key) => {
                self.invalid(key, "a value is required".to_owned())
            }
            other => self.invalid("", other.to_string()),
        }
    }
}

/// serde's terse type names as accepted forms for people.
fn friendly_expected(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "an unsigned integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" | "bool" => "a boolean (true or false)".to_owned(),
        "a floating point" => "a number".to_owned(),
        other if other.contains("unsigned") => "a non-negative integer".to_owned(),
        other => other.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// HAMi's global device config (`device-config.yaml`, `nvidia:` section)
// ---------------------------------------------------------------------------------------------

/// HAMi's global `device-config.yaml`; only the `nvidia:` section is read, other vendors' sections
/// are ignored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceConfig {
    /// The `nvidia:` section.
    pub nvidia: NvidiaConfig,
}

/// The `nvidia:` section of HAMi's `device-config.yaml`, plus `limitDelivery`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NvidiaConfig {
    /// `resourceCountName`, default `nvidia.com/gpu`.
    pub resource_count_name: String,
    /// `resourceMemoryName`, default `nvidia.com/gpumem`.
    pub resource_memory_name: String,
    /// `resourceMemoryPercentageName`, default `nvidia.com/gpumem-percentage`.
    pub resource_memory_percentage_name: String,
    /// `resourceCoreName`, default `nvidia.com/gpucores`.
    pub resource_core_name: String,
    /// `resourcePriorityName`, default `nvidia.com/priority`.
    pub resource_priority_name: String,
    /// `overwriteEnv`, default `false`.
    pub overwrite_env: bool,
    /// `defaultMemory` MiB when a pod names none; default 0 (the whole device).
    pub default_memory: u64,
    /// `defaultCores` percent when a pod names none, 0..=100; default 0 (no core limit).
    pub default_cores: u32,
    /// `defaultGPUNum`, default 1.
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: u32,
    /// `memoryFactor`, default 1 (at least 1).
    pub memory_factor: u32,
    /// `deviceSplitCount`: shares advertised per GPU, default 10 (at least 1).
    pub device_split_count: u32,
    /// `deviceMemoryScaling`, default 1.0 (> 0; above 1 oversubscribes memory).
    pub device_memory_scaling: f64,
    /// `deviceCoreScaling`, default 1.0 (> 0).
    pub device_core_scaling: f64,
    /// `disableCoreLimit`, default `false` (`true` sets `GPU_CORE_UTILIZATION_POLICY=disable`).
    pub disable_core_limit: bool,
    /// `gpuCorePolicy`: `default` | `force` | `disable`, default `default`.
    pub gpu_core_policy: CorePolicy,
    /// `libCudaLogLevel` 0..=4, default unset (`LIBCUDA_LOG_LEVEL` not injected).
    pub lib_cuda_log_level: Option<u8>,
    /// `runtimeClassName`, default empty.
    pub runtime_class_name: String,
    /// `limitDelivery`: `file` | `env`, default unset (resolution falls through to `file`).
    pub limit_delivery: Option<LimitDelivery>,
    /// `preConfiguredDeviceMemory` MiB, default 0 (unset): the memory of a GPU for which NVML
    /// reports none (unified-memory parts such as the GB10), as HAMi's `getAPIDevices`
    /// (`plugin/register.go`) uses it; without it such a GPU is not advertised.
    pub pre_configured_device_memory: u64,
    /// `enableNumaTopology`: attach each GPU's NUMA node to the kubelet devices; default unset
    /// (off). HAMi v2.10 `NodeDefaultConfig.EnableNUMATopology` (`pkg/device/nvidia/device.go`);
    /// a node entry's `enablenumatopology` overrides it.
    pub enable_numa_topology: Option<bool>,
}

impl Default for NvidiaConfig {
    fn default() -> Self {
        Self {
            resource_count_name: names::RESOURCE_GPU.to_owned(),
            resource_memory_name: names::RESOURCE_GPU_MEM.to_owned(),
            resource_memory_percentage_name: names::RESOURCE_GPU_MEM_PERCENTAGE.to_owned(),
            resource_core_name: names::RESOURCE_GPU_CORES.to_owned(),
            resource_priority_name: names::RESOURCE_PRIORITY.to_owned(),
            overwrite_env: false,
            default_memory: 0,
            default_cores: 0,
            default_gpu_num: 1,
            memory_factor: 1,
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            disable_core_limit: false,
            gpu_core_policy: CorePolicy::Default,
            lib_cuda_log_level: None,
            runtime_class_name: String::new(),
            limit_delivery: None,
            pre_configured_device_memory: 0,
            enable_numa_topology: None,
        }
    }
}

fn check_scaling(problems: &mut Vec<(String, String)>, key: String, v: f64) {
    if !(v.is_finite() && v > 0.0) {
        problems.push((key, "expected a number greater than 0".to_owned()));
    }
}

fn check_log_level(problems: &mut Vec<(String, String)>, key: String, v: u8) {
    if v > 4 {
        problems.push((key, "expected a log level from 0 to 4".to_owned()));
    }
}

impl NvidiaConfig {
    fn problems(&self, prefix: &str, problems: &mut Vec<(String, String)>) {
        if self.device_split_count == 0 {
            problems.push((
                format!("{prefix}deviceSplitCount"),
                "expected an integer of at least 1".to_owned(),
            ));
        }
        if self.memory_factor == 0 {
            problems.push((
                format!("{prefix}memoryFactor"),
                "expected an integer of at least 1".to_owned(),
            ));
        }
        if self.default_cores > 100 {
            problems.push((
                format!("{prefix}defaultCores"),
                "expected a percentage from 0 to 100".to_owned(),
            ));
        }
        check_scaling(
            problems,
            format!("{prefix}deviceMemoryScaling"),
            self.device_memory_scaling,
        );
        check_scaling(
            problems,
            format!("{prefix}deviceCoreScaling"),
            self.device_core_scaling,
        );
        if let Some(l) = self.lib_cuda_log_level {
            check_log_level(problems, format!("{prefix}libCudaLogLevel"), l);
        }
    }

    /// These settings with a node's overrides applied (split count, scalings, log level).
    /// `limitdelivery` is not applied here: pass it to [`Self::resolve_limit_delivery`], which
    /// reports which level decided.
    pub fn with_node(&self, node: &NodeConfigEntry) -> NvidiaConfig {
        let mut out = self.clone();
        if let Some(v) = node.device_split_count {
            out.device_split_count = v;
        }
        if let Some(v) = node.device_memory_scaling {
            out.device_memory_scaling = v;
        }
        if let Some(v) = node.device_core_scaling {
            out.device_core_scaling = v;
        }
        if let Some(v) = node.lib_cuda_log_level {
            out.lib_cuda_log_level = Some(v);
        }
        if let Some(v) = node.pre_configured_device_memory {
            out.pre_configured_device_memory = v;
        }
        // HAMi's `readFromConfigFile` merges the entry with `mergo.WithOverride`: a set pointer,
        // `false` included, replaces the global value.
        if let Some(v) = node.enable_numa_topology {
            out.enable_numa_topology = Some(v);
        }
        out
    }

    /// Delivery for a pod: its annotation > the node's entry > this global setting > `file`.
    pub fn resolve_limit_delivery(
        &self,
        annotation: Option<&str>,
        node: Option<&NodeConfigEntry>,
    ) -> ResolvedDelivery {
        resolve_limit_delivery(
            annotation,
            node.and_then(|n| n.limit_delivery),
            self.limit_delivery,
        )
    }
}

impl DeviceConfig {
    /// Load from `file` and the given environment.
    pub fn load_from_env<I>(file: Option<FileText<'_>>, env: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let schema =
            serde_json::to_value(Self::default()).map_err(|e| ConfigError::InvalidValue {
                origin: "built-in defaults".to_owned(),
                key: String::new(),
                value: String::new(),
                reason: e.to_string(),
            })?;
        let layers = Layers::load(file, names::CONFIG_ENV_PREFIX, env, Some(schema))?;
        let config: Self = layers.deserialize()?;
        let mut problems = Vec::new();
        config.nvidia.problems("nvidia.", &mut problems);
        match problems.into_iter().next() {
            Some((key, reason)) => Err(layers.invalid(&key, reason)),
            None => Ok(config),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HAMi's per-node device plugin config (`config.json`, `nodeconfig: [...]`)
// ---------------------------------------------------------------------------------------------

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
    /// `preconfigureddevicememory` MiB: overrides the global `preConfiguredDeviceMemory` (0 =
    /// unset), as HAMi merges its node entries over the global section.
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
    /// `enableNumaTopology`, `false` included.
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
    pub fn parse(file: FileText<'_>) -> Result<Self, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_parse() {
        assert_eq!(
            parse_key_path("nodeconfig[1].limitdelivery"),
            vec![
                Seg::Key("nodeconfig".into()),
                Seg::Index(1),
                Seg::Key("limitdelivery".into())
            ]
        );
        let p = parse_key_path("nodeconfig[1]limitdelivery");
        assert_eq!(render_key_path(&p), "nodeconfig[1].limitdelivery");
        assert_eq!(
            parse_key_path("nvidia.x"),
            vec![Seg::Key("nvidia".into()), Seg::Key("x".into())]
        );
    }

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
        assert_eq!(global.enable_numa_topology, Some(true));
        let nodes = NodeConfigFile::parse(FileText {
            path: Path::new("config.json"),
            text: r#"{"nodeconfig":[{"name":"a","enablenumatopology":false},{"name":"b","enableNumaTopology":true},{"name":"c"}]}"#,
        })
        .unwrap();
        let on = |n: &str| {
            nodes
                .for_node(n)
                .map_or_else(|| global.clone(), |e| global.with_node(&e))
                .enable_numa_topology
        };
        assert_eq!(on("a"), Some(false));
        assert_eq!(on("b"), Some(true));
        assert_eq!(on("c"), Some(true));
        assert_eq!(NvidiaConfig::default().enable_numa_topology, None);
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

    #[test]
    fn fold_ignores_case_and_separators() {
        assert_eq!(fold("limitDelivery"), fold("limit_delivery"));
        assert_eq!(fold("defaultGPUNum"), fold("DEFAULT_GPU_NUM"));
    }
}

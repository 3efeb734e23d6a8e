//! HAMi's global device config (`device-config.yaml`): the `nvidia:` section, typed once for both
//! programs. Its keys are declared in two parts, each once: [`NvidiaAdmission`], what admission
//! reads (the webhook's `nvidia:` section; the device plugin reads `resourceCountName` of it too),
//! and [`NvidiaPlugin`], what the device plugin reads (and HAMi's scheduler's keys, accepted). The
//! two parts are one flat section in the file ([`NvidiaConfig`]).

use serde::{Deserialize, Serialize};

use super::FileText;
use super::layer::{Layers, check_log_level, check_scaling, schema_of};
use super::node::NodeConfigEntry;
use hami_shared::names;
use hami_shared::values::{CorePolicy, LimitDelivery};

/// HAMi's global `device-config.yaml`; only the `nvidia:` section is read, other vendors' sections
/// are ignored. Loaded by [`DeviceConfig::load_from_env`] (each part of the section deserialized
/// from the same layers, so that an error names its key).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(default)]
pub struct DeviceConfig {
    /// The `nvidia:` section.
    pub nvidia: NvidiaConfig,
}

/// The `nvidia:` section of HAMi's `device-config.yaml`, plus `limitDelivery`: both parts, flat
/// (as the file writes them).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct NvidiaConfig {
    /// What admission reads.
    #[serde(flatten)]
    pub admission: NvidiaAdmission,
    /// What the device plugin reads.
    #[serde(flatten)]
    pub plugin: NvidiaPlugin,
}

/// The keys of the `nvidia:` section that admission reads: which resources make a HAMi GPU
/// container, and what it gets. The webhook's `nvidia:` section is this part alone (HAMi's other
/// keys are ignored there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NvidiaAdmission {
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
    /// `gpuCorePolicy`: `default` (nothing set), `force` or `disable` (set as
    /// `GPU_CORE_UTILIZATION_POLICY`); default `default`.
    pub gpu_core_policy: CorePolicy,
    /// `defaultGPUNum`: a container whose limits name the memory, memory-percentage or core
    /// resource but not the count gets `<resourceCountName>: N` (0: nothing added). Default 1.
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: u32,
    /// `overwriteEnv`: every container of a HAMi pod that gets no GPU gets
    /// `NVIDIA_VISIBLE_DEVICES=none`. Default false.
    pub overwrite_env: bool,
}

impl Default for NvidiaAdmission {
    fn default() -> Self {
        Self {
            resource_count_name: names::RESOURCE_GPU.to_owned(),
            resource_memory_name: names::RESOURCE_GPU_MEM.to_owned(),
            resource_memory_percentage_name: names::RESOURCE_GPU_MEM_PERCENTAGE.to_owned(),
            resource_core_name: names::RESOURCE_GPU_CORES.to_owned(),
            resource_priority_name: names::RESOURCE_PRIORITY.to_owned(),
            gpu_core_policy: CorePolicy::Default,
            default_gpu_num: 1,
            overwrite_env: false,
        }
    }
}

impl NvidiaAdmission {
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

/// The keys of the `nvidia:` section that the device plugin reads (how a node's GPUs are shared
/// and their limits delivered), and HAMi's scheduler's keys, accepted so that HAMi's file loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NvidiaPlugin {
    /// `defaultMemory` MiB when a pod names none; default 0 (the whole device).
    pub default_memory: u64,
    /// `defaultCores` percent when a pod names none, 0..=100; default 0 (no core limit).
    pub default_cores: u32,
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

impl Default for NvidiaPlugin {
    fn default() -> Self {
        Self {
            default_memory: 0,
            default_cores: 0,
            memory_factor: 1,
            device_split_count: 10,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            disable_core_limit: false,
            lib_cuda_log_level: None,
            runtime_class_name: String::new(),
            limit_delivery: None,
            pre_configured_device_memory: 0,
            enable_numa_topology: None,
        }
    }
}

impl NvidiaPlugin {
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
}

impl NvidiaConfig {
    /// These settings with a node's overrides applied (split count, scalings, log level).
    /// `limitdelivery` is not applied here: the node's and this global value both go to
    /// [`hami_shared::values::resolve_limit_delivery`], which reports which level decided.
    pub fn with_node(&self, node: &NodeConfigEntry) -> NvidiaConfig {
        let mut out = self.clone();
        if let Some(v) = node.device_split_count {
            out.plugin.device_split_count = v;
        }
        if let Some(v) = node.device_memory_scaling {
            out.plugin.device_memory_scaling = v;
        }
        if let Some(v) = node.device_core_scaling {
            out.plugin.device_core_scaling = v;
        }
        if let Some(v) = node.lib_cuda_log_level {
            out.plugin.lib_cuda_log_level = Some(v);
        }
        if let Some(v) = node.pre_configured_device_memory {
            out.plugin.pre_configured_device_memory = v;
        }
        // A written value, `false` and `0` included, replaces the global one: what the operator
        // wrote. HAMi v2.10's `readFromConfigFile` (`server.go`) merges with mergo v0.3.16 and
        // `WithOverride`, which skips a pointer to `false` or `0`; where that differs,
        // [`NvidiaConfig::hami_merge_differences`] says so.
        if let Some(v) = node.enable_numa_topology {
            out.plugin.enable_numa_topology = Some(v);
        }
        out
    }

    /// Where [`Self::with_node`] gives `node` a value HAMi v2.10's plugin would not: HAMi merges
    /// a node entry over the global section with mergo v0.3.16 (`mergo.Merge(…,
    /// mergo.WithOverride)` in `readFromConfigFile`, `server.go`), which treats a pointer to
    /// `false` or `0` as empty and keeps the global value. Ours honours the written value (the
    /// zero split count and scalings HAMi would also skip are refused instead, naming the key);
    /// each line names the node, both keys and both results, for a start-up warning.
    pub fn hami_merge_differences(&self, node: &NodeConfigEntry) -> Vec<String> {
        let mut out = Vec::new();
        if node.enable_numa_topology == Some(false)
            && self.plugin.enable_numa_topology == Some(true)
        {
            out.push(format!(
                "node {:?}: enablenumatopology: false overrides nvidia.enableNumaTopology: true, so its kubelet devices carry no NUMA node; HAMi v2.10's plugin kept true here (its merge skips false): remove the global value or the node's to make the two agree",
                node.name
            ));
        }
        let global_memory = self.plugin.pre_configured_device_memory;
        if node.pre_configured_device_memory == Some(0) && global_memory != 0 {
            out.push(format!(
                "node {:?}: preconfigureddevicememory: 0 unsets nvidia.preConfiguredDeviceMemory: {global_memory}, so a GPU whose NVML reports no memory is not advertised; HAMi v2.10's plugin kept {global_memory} here (its merge skips 0): remove the node's value to keep the global one",
                node.name
            ));
        }
        out
    }
}

impl DeviceConfig {
    /// Load from `file` and the given environment.
    pub fn load_from_env<I>(file: Option<FileText<'_>>, env: I) -> crate::Result<Self>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        /// One part of the section, from the same layers.
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Part<T> {
            nvidia: T,
        }
        let schema = schema_of::<Self>()?;
        let layers = Layers::load(file, names::CONFIG_ENV_PREFIX, env, Some(schema))?;
        let admission: Part<NvidiaAdmission> = layers.deserialize()?;
        let plugin: Part<NvidiaPlugin> = layers.deserialize()?;
        let config = Self {
            nvidia: NvidiaConfig {
                admission: admission.nvidia,
                plugin: plugin.nvidia,
            },
        };
        let mut problems = Vec::new();
        config.nvidia.plugin.problems("nvidia.", &mut problems);
        match problems.into_iter().next() {
            Some((key, reason)) => Err(layers.invalid(&key, reason)),
            None => Ok(config),
        }
    }
}

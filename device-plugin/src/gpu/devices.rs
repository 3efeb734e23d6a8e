//! The devices advertised to kubelet, per extended resource: each GPU split into
//! `deviceSplitCount` shares `<uuid>-0 … <uuid>-(n-1)`, or (static MIG) each MIG device once,
//! under its own UUID; with their health and NUMA node. [`advertise`] is the decision: which
//! device goes under which resource for the `MIG_STRATEGY`, which is left out and why.

use serde::Serialize;

use crate::gpu::inventory::{DeviceFilter, Gpu};
use crate::gpu::mig::{MigProfile, MigStrategy, SINGLE_RESOURCE};
/// Why a GPU found on the node is not advertised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedGpu {
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's index.
    pub index: u32,
    /// Why it is left out.
    pub reason: String,
}

/// No GPU left to advertise: a plugin that advertises nothing is an error, not a silent no-op.
#[derive(Debug, thiserror::Error)]
#[error("no GPU to advertise: {found} found{}", describe_skipped(.skipped))]
pub struct NoGpuError {
    /// How many GPUs the inventory reported.
    pub found: usize,
    /// Those left out, with the reason.
    pub skipped: Vec<SkippedGpu>,
}

fn describe_skipped(skipped: &[SkippedGpu]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = skipped
        .iter()
        .map(|s| format!("{} (index {}): {}", s.uuid, s.index, s.reason))
        .collect();
    format!(", all left out: {}", parts.join("; "))
}

/// The devices of one resource: GPUs split into shares, or MIG devices advertised whole.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTable {
    /// What is advertised: GPUs, or MIG devices in the shape of a GPU (UUID `MIG-…`, the MIG
    /// device's memory, its GPU's index, minor and NUMA node, name `<GPU name> MIG <profile>`).
    gpus: Vec<Gpu>,
    /// The physical GPU of each entry (itself for a GPU): health events name physical GPUs.
    parents: Vec<String>,
    split_count: u32,
    numa_topology: bool,
    /// MIG devices: each advertised once, under its UUID.
    whole: bool,
}

/// The memory reason a GPU is left out.
const NO_MEMORY: &str = "NVML reports no memory for this GPU (unified memory, e.g. GB10) and preConfiguredDeviceMemory is not set: set nvidia.preConfiguredDeviceMemory (or the node's preconfigureddevicememory) to its memory in MiB";

impl DeviceTable {
    /// GPUs split into shares (`MIG_STRATEGY=none`): the node's device filter applied, GPUs
    /// without memory left out (see [`advertise`] for `preConfiguredDeviceMemory`). Returns the
    /// table and what was left out; an empty table is an error.
    pub fn build(
        found: Vec<Gpu>,
        filter: &DeviceFilter,
        split_count: u32,
        numa_topology: bool,
    ) -> Result<(Self, Vec<SkippedGpu>), NoGpuError> {
        let total = found.len();
        let mut gpus = Vec::new();
        let mut skipped = Vec::new();
        for gpu in found {
            let reason = if filter.excludes(&gpu) {
                Some(FILTERED)
            } else if gpu.memory_mib == 0 {
                Some(NO_MEMORY)
            } else {
                None
            };
            match reason {
                Some(reason) => skipped.push(SkippedGpu::new(&gpu.uuid, gpu.index, reason)),
                None => gpus.push(gpu),
            }
        }
        if gpus.is_empty() {
            return Err(NoGpuError {
                found: total,
                skipped,
            });
        }
        Ok((Self::shares(gpus, split_count, numa_topology), skipped))
    }

    /// GPUs split into `split_count` shares each.
    pub fn shares(gpus: Vec<Gpu>, split_count: u32, numa_topology: bool) -> Self {
        Self {
            parents: gpus.iter().map(|g| g.uuid.clone()).collect(),
            gpus,
            split_count: split_count.max(1),
            numa_topology,
            whole: false,
        }
    }

    /// MIG devices (as GPU-shaped entries, each with its physical GPU's UUID), advertised once
    /// each, with their NUMA node whenever it is known (HAMi's `GetPluginDevices` does not ask
    /// the NUMA setting for MIG devices).
    pub fn whole(devices: Vec<(Gpu, String)>) -> Self {
        let (gpus, parents) = devices.into_iter().unzip();
        Self {
            gpus,
            parents,
            split_count: 1,
            numa_topology: true,
            whole: true,
        }
    }

    /// The advertised entries, in order: GPUs, or MIG devices in the shape of a GPU.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// The physical GPUs behind the entries, each once, in order.
    pub fn physical_gpus(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for parent in &self.parents {
            if !out.contains(parent) {
                out.push(parent.clone());
            }
        }
        out
    }

    /// Shares per GPU (1 for MIG devices).
    pub fn split_count(&self) -> u32 {
        self.split_count
    }

    /// Whether the entries are MIG devices, advertised whole.
    pub fn is_mig(&self) -> bool {
        self.whole
    }

    /// Whether kubelet devices carry their GPU's NUMA node.
    pub fn numa_topology(&self) -> bool {
        self.numa_topology
    }

    /// Sets the health of the entry with this UUID, or of every entry on the physical GPU with
    /// this UUID; returns whether anything changed.
    pub fn set_health(&mut self, uuid: &str, healthy: bool) -> bool {
        let mut changed = false;
        for (gpu, parent) in self.gpus.iter_mut().zip(&self.parents) {
            if (gpu.uuid == uuid || parent == uuid) && gpu.healthy != healthy {
                gpu.healthy = healthy;
                changed = true;
            }
        }
        changed
    }

    /// The entry behind a kubelet device ID, if it is one of ours.
    pub fn gpu_of(&self, device_id: &str) -> Option<&Gpu> {
        if self.whole {
            return self.gpus.iter().find(|g| g.uuid == device_id);
        }
        let (uuid, share) = split_device_id(device_id)?;
        self.gpus
            .iter()
            .find(|g| g.uuid == uuid && share < self.split_count)
    }
}

const FILTERED: &str = "excluded by filterdevices in the node config";

impl SkippedGpu {
    fn new(uuid: &str, index: u32, reason: &str) -> Self {
        Self {
            uuid: uuid.to_owned(),
            index,
            reason: reason.to_owned(),
        }
    }
}

/// What [`advertise`] needs from the settings.
#[derive(Debug, Clone, Copy)]
pub struct AdvertiseSettings<'a> {
    /// `resourceCountName`: the resource of GPUs split into shares.
    pub resource_name: &'a str,
    /// `filterdevices` of the node's entry.
    pub filter: &'a DeviceFilter,
    /// `deviceSplitCount`.
    pub split_count: u32,
    /// NUMA topology on GPU shares (`--enable-numa-topology`).
    pub numa_topology: bool,
    /// `MIG_STRATEGY`.
    pub mig_strategy: MigStrategy,
    /// `preConfiguredDeviceMemory` MiB (0: unset).
    pub pre_configured_memory_mib: u64,
}

/// One extended resource and its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct AdvertisedResource {
    /// E.g. `nvidia.com/gpu`, `nvidia.com/mig-1g.18gb`.
    pub resource_name: String,
    /// Its devices (never empty).
    pub table: DeviceTable,
}

/// What the node advertises.
#[derive(Debug, Clone, PartialEq)]
pub struct Advertised {
    /// The resources with at least one device: `resourceCountName` first, then MIG resources
    /// by name. Empty when nothing is usable.
    pub resources: Vec<AdvertisedResource>,
    /// GPUs and MIG devices left out, with the reason.
    pub skipped: Vec<SkippedGpu>,
    /// How many GPUs the inventory reported.
    pub found: usize,
}

impl Advertised {
    /// The resource named `name`, if advertised.
    pub fn resource(&self, name: &str) -> Option<&AdvertisedResource> {
        self.resources.iter().find(|r| r.resource_name == name)
    }

    /// Nothing to advertise, as an error (for `inventory`).
    pub fn no_gpu(&self) -> NoGpuError {
        NoGpuError {
            found: self.found,
            skipped: self.skipped.clone(),
        }
    }
}

/// A MIG layout HAMi refuses to start with (its `assertAllMigDevicesAreValid` and resource
/// patterns), naming the GPU or the MIG device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MIG_STRATEGY={strategy}: {message}")]
pub struct MigLayoutError {
    /// The strategy.
    pub strategy: MigStrategy,
    /// What is wrong and what would do.
    pub message: String,
}

fn mig_entry(gpu: &Gpu, mig: &crate::gpu::inventory::MigDevice) -> (Gpu, String) {
    (
        Gpu {
            uuid: mig.uuid.clone(),
            index: gpu.index,
            minor: gpu.minor,
            name: format!("{} MIG {}", gpu.name, mig.profile),
            memory_mib: mig.memory_mib,
            numa_node: gpu.numa_node,
            mig_enabled: true,
            healthy: gpu.healthy && mig.healthy,
            mig_devices: Vec::new(),
        },
        gpu.uuid.clone(),
    )
}

/// Which device goes under which resource, as HAMi v2.10 builds its device map
/// (`rm/device_map.go` `buildDeviceMapFromConfigResources`, then `NewNVMLResourceManagers`'
/// filter, then `getAPIDevices`' memory fallback):
///
/// - `none`: every GPU, MIG mode or not, split into shares under `resourceCountName`;
/// - `single`: with any MIG-enabled GPU, every GPU must be MIG-enabled with at least one MIG
///   device, all of one profile; the MIG devices go under `nvidia.com/gpu`; else as `none`;
/// - `mixed`: GPUs without MIG mode as `none`; each MIG device under
///   `nvidia.com/mig-<profile>`; a MIG-enabled GPU without MIG devices is left out.
///
/// The checks see every GPU; then `filterdevices` leaves out GPUs (by UUID or index) and MIG
/// devices (by UUID only, as HAMi); then a GPU with no memory takes `preConfiguredDeviceMemory`
/// or is left out. Resources left with no device are not advertised.
pub fn advertise(
    found: Vec<Gpu>,
    settings: &AdvertiseSettings<'_>,
) -> Result<Advertised, MigLayoutError> {
    let strategy = settings.mig_strategy;
    let total = found.len();
    let mut skipped = Vec::new();
    let by_mode = ByMigMode::sort(found, strategy)?;
    check_mig_layout(strategy, &by_mode, &mut skipped)?;
    let ByMigMode {
        whole_gpus, mig, ..
    } = by_mode;
    let mut resources = Vec::new();
    resources.extend(shares_resource(whole_gpus, settings, &mut skipped));
    mig_resources(mig, settings, &mut skipped, &mut resources)?;
    Ok(Advertised {
        resources,
        skipped,
        found: total,
    })
}

/// The refusal of a MIG layout the strategy cannot advertise.
fn refuse(strategy: MigStrategy, message: String) -> MigLayoutError {
    MigLayoutError { strategy, message }
}

/// The node's GPUs by how they are advertised, before any filter.
struct ByMigMode {
    /// Advertised whole, in shares: every GPU without MIG mode, and every GPU with `none`.
    whole_gpus: Vec<Gpu>,
    /// Each MIG device (its resource, its entry and its parent's UUID).
    mig: Vec<(String, (Gpu, String))>,
    /// MIG-enabled GPUs without a MIG device (`single` and `mixed` only).
    without_slices: Vec<Gpu>,
}

impl ByMigMode {
    /// Sort `found` by MIG mode; a MIG device whose profile or resource name cannot be read is
    /// refused.
    fn sort(found: Vec<Gpu>, strategy: MigStrategy) -> Result<Self, MigLayoutError> {
        let mut sorted = Self {
            whole_gpus: Vec::new(),
            mig: Vec::new(),
            without_slices: Vec::new(),
        };
        let mig_aware = strategy != MigStrategy::None;
        for gpu in found {
            if !(mig_aware && gpu.mig_enabled) {
                sorted.whole_gpus.push(gpu);
                continue;
            }
            if gpu.mig_devices.is_empty() {
                sorted.without_slices.push(gpu);
                continue;
            }
            for device in &gpu.mig_devices {
                let refuse_device = |e: &dyn std::fmt::Display| {
                    refuse(strategy, format!("MIG device {}: {e}", device.uuid))
                };
                let profile = MigProfile::parse(&device.profile).map_err(|e| refuse_device(&e))?;
                let resource = match strategy {
                    MigStrategy::Mixed => profile
                        .mixed_resource_name()
                        .map_err(|e| refuse_device(&e))?,
                    _ => SINGLE_RESOURCE.to_owned(),
                };
                sorted.mig.push((resource, mig_entry(&gpu, device)));
            }
        }
        Ok(sorted)
    }
}

/// HAMi's `assertAllMigDevicesAreValid`: a MIG-enabled GPU without slices (an error with
/// `single`, left out with `mixed`), then, with `single`, one kind of slice only; then `single`
/// refuses GPUs with and without MIG mode side by side.
fn check_mig_layout(
    strategy: MigStrategy,
    by_mode: &ByMigMode,
    skipped: &mut Vec<SkippedGpu>,
) -> Result<(), MigLayoutError> {
    for gpu in &by_mode.without_slices {
        if strategy == MigStrategy::Single {
            return Err(refuse(
                strategy,
                format!(
                    "GPU {} (index {}) is in MIG mode but has no MIG devices configured: create its MIG devices (nvidia-smi mig -cgi ... -C), or disable MIG mode on it",
                    gpu.uuid, gpu.index
                ),
            ));
        }
        skipped.push(SkippedGpu::new(
            &gpu.uuid,
            gpu.index,
            "MIG mode is enabled but no MIG device is configured on it",
        ));
    }
    if strategy != MigStrategy::Single {
        return Ok(());
    }
    let mig = &by_mode.mig;
    if let Some((_, (first, _))) = mig.first()
        && let Some((_, (other, _))) = mig
            .iter()
            .find(|(_, (m, _))| m.name != first.name || m.memory_mib != first.memory_mib)
    {
        return Err(refuse(
            strategy,
            format!(
                "more than one MIG device type on the node: {} is {} MiB ({}), {} is {} MiB ({}); use MIG_STRATEGY=mixed, or slice every GPU alike",
                first.uuid, first.memory_mib, first.name, other.uuid, other.memory_mib, other.name
            ),
        ));
    }
    if let (Some(plain), Some((_, (_, parent)))) = (by_mode.whole_gpus.first(), mig.first()) {
        return Err(refuse(
            strategy,
            format!(
                "GPU {} is not in MIG mode but GPU {parent} is: all GPUs of the node must have the same MIG mode; use MIG_STRATEGY=mixed",
                plain.uuid
            ),
        ));
    }
    Ok(())
}

/// The whole GPUs' shares under `resourceCountName`: the node's filter, then the memory fallback
/// (HAMi's order); `None` when no GPU is left.
fn shares_resource(
    whole_gpus: Vec<Gpu>,
    settings: &AdvertiseSettings<'_>,
    skipped: &mut Vec<SkippedGpu>,
) -> Option<AdvertisedResource> {
    let mut shares = Vec::new();
    for mut gpu in whole_gpus {
        if settings.filter.excludes(&gpu) {
            skipped.push(SkippedGpu::new(&gpu.uuid, gpu.index, FILTERED));
            continue;
        }
        if gpu.memory_mib == 0 {
            if settings.pre_configured_memory_mib == 0 {
                skipped.push(SkippedGpu::new(&gpu.uuid, gpu.index, NO_MEMORY));
                continue;
            }
            gpu.memory_mib = settings.pre_configured_memory_mib;
        }
        shares.push(gpu);
    }
    (!shares.is_empty()).then(|| AdvertisedResource {
        resource_name: settings.resource_name.to_owned(),
        table: DeviceTable::shares(shares, settings.split_count, settings.numa_topology),
    })
}

/// The MIG devices the node's filter leaves, one resource per name after `resources`.
fn mig_resources(
    mig: Vec<(String, (Gpu, String))>,
    settings: &AdvertiseSettings<'_>,
    skipped: &mut Vec<SkippedGpu>,
    resources: &mut Vec<AdvertisedResource>,
) -> Result<(), MigLayoutError> {
    let mut by_resource: std::collections::BTreeMap<String, Vec<(Gpu, String)>> =
        std::collections::BTreeMap::new();
    for (resource, (entry, parent)) in mig {
        if settings.filter.excludes_mig(&entry.uuid) {
            skipped.push(SkippedGpu::new(&entry.uuid, entry.index, FILTERED));
            continue;
        }
        by_resource
            .entry(resource)
            .or_default()
            .push((entry, parent));
    }
    for (resource_name, devices) in by_resource {
        if resources.iter().any(|r| r.resource_name == resource_name) {
            // Only a resourceCountName spelt like a MIG resource can get here: `single` refuses
            // GPUs with and without MIG mode side by side.
            return Err(refuse(
                settings.mig_strategy,
                format!(
                    "resourceCountName {resource_name} is also the resource of MIG devices: rename it"
                ),
            ));
        }
        resources.push(AdvertisedResource {
            resource_name,
            table: DeviceTable::whole(devices),
        });
    }
    Ok(())
}

/// The kubelet device ID of one share of a GPU.
pub fn device_id(uuid: &str, share: u32) -> String {
    format!("{uuid}-{share}")
}

/// Splits `<uuid>-<share>` into the UUID and the share number.
pub fn split_device_id(device_id: &str) -> Option<(&str, u32)> {
    let (uuid, share) = device_id.rsplit_once('-')?;
    if uuid.is_empty() || share.is_empty() || !share.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((uuid, share.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, index: u32) -> Gpu {
        Gpu {
            uuid: uuid.into(),
            index,
            minor: index,
            name: "NVIDIA H200".into(),
            memory_mib: 143_771,
            numa_node: Some(1),
            mig_enabled: false,
            healthy: true,
            mig_devices: Vec::new(),
        }
    }

    #[test]
    fn splits_each_gpu_into_shares() {
        let (table, skipped) = DeviceTable::build(
            vec![gpu("GPU-a", 0), gpu("GPU-b", 1)],
            &DeviceFilter::default(),
            3,
            false,
        )
        .unwrap();
        assert!(skipped.is_empty());
        let ids: Vec<String> = table.kubelet_devices().into_iter().map(|d| d.id).collect();
        assert_eq!(
            ids,
            [
                "GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-b-1", "GPU-b-2"
            ]
        );
        assert!(
            table
                .kubelet_devices()
                .iter()
                .all(|d| d.health == "Healthy" && d.topology.is_none())
        );
    }

    #[test]
    fn numa_topology_only_when_enabled() {
        let (table, _) =
            DeviceTable::build(vec![gpu("GPU-a", 0)], &DeviceFilter::default(), 1, true).unwrap();
        let topo = table.kubelet_devices()[0].topology.clone().unwrap();
        assert_eq!(topo.nodes[0].id, 1);
    }

    #[test]
    fn filtered_and_memoryless_gpus_are_left_out_and_empty_is_an_error() {
        let mut mig = gpu("GPU-m", 2);
        mig.mig_enabled = true;
        let mut spark = gpu("GPU-s", 3);
        spark.memory_mib = 0;
        let filter = DeviceFilter {
            uuids: vec!["GPU-a".into()],
            indices: vec![1],
        };
        // `MIG_STRATEGY=none`: a MIG-enabled GPU is a GPU like any other, as in HAMi.
        let (table, skipped) = DeviceTable::build(
            vec![gpu("GPU-a", 0), gpu("GPU-b", 1), mig.clone(), spark.clone()],
            &filter,
            2,
            false,
        )
        .unwrap();
        assert_eq!(table.gpus().len(), 1);
        assert_eq!(table.gpus()[0].uuid, "GPU-m");
        assert_eq!(skipped.len(), 3);
        assert!(
            skipped[2].reason.contains("preConfiguredDeviceMemory"),
            "{skipped:?}"
        );
        let err = DeviceTable::build(vec![gpu("GPU-a", 0), gpu("GPU-b", 1)], &filter, 2, false)
            .unwrap_err();
        assert_eq!(err.found, 2);
        let text = err.to_string();
        assert!(
            text.starts_with(
                "no GPU to advertise: 2 found, all left out: GPU-a (index 0): excluded"
            ),
            "{text}"
        );
        let err = DeviceTable::build(vec![], &DeviceFilter::default(), 2, false).unwrap_err();
        assert_eq!(err.to_string(), "no GPU to advertise: 0 found");
    }

    #[test]
    fn mig_devices_are_whole_and_follow_their_gpus_health() {
        let parent = gpu("GPU-p", 0);
        let entry = |uuid: &str| {
            let mut g = gpu(uuid, 0);
            g.mig_enabled = true;
            (g, parent.uuid.clone())
        };
        let mut table = DeviceTable::whole(vec![entry("MIG-1"), entry("MIG-2")]);
        assert!(table.is_mig());
        let ids: Vec<String> = table.kubelet_devices().into_iter().map(|d| d.id).collect();
        assert_eq!(ids, ["MIG-1", "MIG-2"]);
        assert_eq!(
            table.gpu_of("MIG-2").map(|g| g.uuid.as_str()),
            Some("MIG-2")
        );
        assert!(table.gpu_of("MIG-2-0").is_none());
        // One MIG device, by its UUID; then every device of the GPU, by the GPU's.
        assert!(table.set_health("MIG-1", false));
        let health: Vec<String> = table
            .kubelet_devices()
            .into_iter()
            .map(|d| d.health)
            .collect();
        assert_eq!(health, ["Unhealthy", "Healthy"]);
        assert!(table.set_health("GPU-p", false));
        assert!(
            table
                .kubelet_devices()
                .iter()
                .all(|d| d.health == "Unhealthy")
        );
        assert!(!table.set_health("GPU-other", true));
        assert_eq!(table.physical_gpus(), ["GPU-p"]);
    }

    #[test]
    fn health_changes_and_device_ids_map_back() {
        let (mut table, _) =
            DeviceTable::build(vec![gpu("GPU-a-b", 0)], &DeviceFilter::default(), 2, false)
                .unwrap();
        assert!(table.set_health("GPU-a-b", false));
        assert!(!table.set_health("GPU-a-b", false));
        assert!(
            table
                .kubelet_devices()
                .iter()
                .all(|d| d.health == "Unhealthy")
        );
        assert_eq!(table.gpu_of("GPU-a-b-1").map(|g| g.index), Some(0));
        assert!(table.gpu_of("GPU-a-b-2").is_none());
        assert!(table.gpu_of("GPU-a-b").is_none());
        assert_eq!(split_device_id("GPU-x-12"), Some(("GPU-x", 12)));
        assert_eq!(split_device_id("-1"), None);
        assert_eq!(split_device_id("GPU-x-"), None);
    }
}

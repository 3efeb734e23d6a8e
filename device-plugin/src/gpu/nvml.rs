//! The NVML backend of [`GpuInventory`]. `libnvidia-ml.so.1` is loaded at run time, so the binary
//! starts on machines without a GPU; only this backend then fails, with a clear error.
//!
//! Every NVML call of the plugin is in this file (discovery, MIG devices, links and Xid events), so
//! that the rest of the plugin runs and is tested without the driver.

use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use tokio::sync::mpsc;

use crate::gpu::health::{
    self, HealthCheckPolicy, HealthWatch, Registration, UNKNOWN_XID, Wait, XidEvent, XidEventSource,
};
use crate::gpu::inventory::{Gpu, GpuInventory, HealthEvent, InventoryError, MigDevice};
use crate::gpu::mig::{self, MigProfile, SliceShape};
use crate::gpu::topology::{GpuLinks, MAX_NVLINKS, PcieLink, PeerLink};

/// GPUs from NVML.
#[derive(Clone)]
pub struct NvmlInventory {
    nvml: Arc<Nvml>,
    mig_devices: bool,
}

impl std::fmt::Debug for NvmlInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlInventory").finish_non_exhaustive()
    }
}

impl NvmlInventory {
    /// Loads and initialises NVML.
    pub fn init() -> Result<Self, InventoryError> {
        let nvml = Nvml::init().map_err(|e| InventoryError::NvmlUnavailable(e.to_string()))?;
        Ok(Self {
            nvml: Arc::new(nvml),
            mig_devices: false,
        })
    }

    /// Also list the MIG devices of MIG-enabled GPUs (with `MIG_STRATEGY` single or mixed; HAMi
    /// does not look at them with `none`).
    #[must_use]
    pub fn with_mig_devices(mut self, list: bool) -> Self {
        self.mig_devices = list;
        self
    }
}

/// GPU instance profile IDs NVML knows (`NVML_GPU_INSTANCE_PROFILE_COUNT`).
const GPU_INSTANCE_PROFILES: u32 = 0x11;

/// The MIG devices of the GPU at `index` (go-nvlib's `VisitMigDevices`: every slot up to the
/// maximum, empty slots skipped), each with the profile go-nvlib would name.
fn mig_devices_of(
    device: &Device<'_>,
    index: u32,
    parent_minor: u32,
    minors: &mig::MigMinors,
) -> Result<Vec<MigDevice>, InventoryError> {
    let parent_total = device
        .memory_info()
        .map_err(nvml_err("nvmlDeviceGetMemoryInfo", index))?
        .total;
    let profiles: Vec<(u32, SliceShape)> = (0..GPU_INSTANCE_PROFILES)
        .filter_map(|id| device.profile_info(id).ok().map(|p| (id, p)))
        .map(|(id, p)| {
            (
                id,
                SliceShape {
                    slices: p.slice_count,
                    memory_mb: p.memory_size_mb,
                    engines: [p.decoder_count, p.encoder_count, p.jpeg_count, p.ofa_count],
                },
            )
        })
        .collect();
    let slots = device
        .mig_device_count()
        .map_err(nvml_err("nvmlDeviceGetMaxMigDeviceCount", index))?;
    let mut out = Vec::new();
    for slot in 0..slots {
        let mig = match device.mig_device_by_index(slot) {
            Ok(mig) => mig,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(nvml_err("nvmlDeviceGetMigDeviceHandleByIndex", index)(e)),
        };
        let uuid = mig
            .uuid()
            .map_err(nvml_err("nvmlDeviceGetUUID (MIG device)", index))?;
        let attrs = mig
            .attributes()
            .map_err(nvml_err("nvmlDeviceGetAttributes (MIG device)", index))?;
        let memory = mig
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo (MIG device)", index))?;
        let shape = SliceShape {
            slices: attrs.gpu_instance_slice_count,
            memory_mb: attrs.memory_size_mb,
            engines: [
                attrs.shared_decoder_count,
                attrs.shared_encoder_count,
                attrs.shared_jpeg_count,
                attrs.shared_ofa_count,
            ],
        };
        let suffix = mig::match_gpu_instance_profile(shape, &profiles)
            .map_or("", mig::gpu_instance_profile_suffix);
        let profile = MigProfile::new(
            attrs.compute_instance_slice_count,
            attrs.gpu_instance_slice_count,
            mig::mig_memory_gb(parent_total, attrs.memory_size_mb),
            suffix,
        );
        let paths = mig_instance_ids(&mig)
            .and_then(|(gi, ci)| minors.device_paths(parent_minor, gi, ci))
            .unwrap_or_default();
        out.push(MigDevice {
            uuid,
            profile: profile.to_string(),
            memory_mib: memory.total / (1024 * 1024),
            healthy: true,
            index: format!("{index}:{slot}"),
            paths,
        });
    }
    Ok(out)
}

/// The GPU and compute instance IDs of a MIG device handle (`nvmlDeviceGetGpuInstanceId`,
/// `nvmlDeviceGetComputeInstanceId`, which nvml-wrapper 0.13 does not wrap); `None` when the
/// driver lacks either function or answers an error.
#[allow(unsafe_code)]
fn mig_instance_ids(mig: &Device<'_>) -> Option<(u32, u32)> {
    let lib = mig.nvml().lib();
    let (Ok(gpu_instance), Ok(compute_instance)) = (
        lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    ) else {
        return None;
    };
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: the handle comes from `nvmlDeviceGetMigDeviceHandleByIndex` on a live `Nvml`
    // (borrowed by `mig` for the call), and each function writes one `unsigned int` through a
    // pointer to a local that outlives the call, as NVML's header declares.
    let (r1, r2) = unsafe {
        let handle = mig.handle();
        (
            gpu_instance(handle, &mut gi),
            compute_instance(handle, &mut ci),
        )
    };
    // NVML_SUCCESS is 0 (`nvmlReturn_enum_NVML_SUCCESS`).
    (r1 == 0 && r2 == 0).then_some((gi, ci))
}

fn nvml_err(call: &'static str, index: u32) -> impl FnOnce(NvmlError) -> InventoryError {
    move |e| InventoryError::Nvml {
        call,
        index,
        message: e.to_string(),
    }
}

/// NUMA node of a PCI device from sysfs; NVML reports the bus id with an 8-digit domain
/// (`00000000:3B:00.0`) while sysfs uses 4 digits, lower case. `-1` means no NUMA affinity.
fn numa_node(bus_id: &str) -> Option<i64> {
    let lower = bus_id.to_ascii_lowercase();
    let short = lower.get(lower.len().saturating_sub(12)..)?;
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{short}/numa_node")).ok()?;
    text.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

impl GpuInventory for NvmlInventory {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Vec<Gpu>, InventoryError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| InventoryError::NvmlUnavailable(e.to_string()))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", index))?;
            let uuid = device
                .uuid()
                .map_err(nvml_err("nvmlDeviceGetUUID", index))?;
            let name = device
                .name()
                .map_err(nvml_err("nvmlDeviceGetName", index))?;
            let minor = device
                .minor_number()
                .map_err(nvml_err("nvmlDeviceGetMinorNumber", index))?;
            // Unified-memory GPUs (GB10) answer NotSupported: 0, for preConfiguredDeviceMemory
            // (HAMi's `getAPIDevices`).
            let memory_mib = match device.memory_info() {
                Ok(memory) => memory.total / (1024 * 1024),
                Err(NvmlError::NotSupported) => 0,
                Err(e) => return Err(nvml_err("nvmlDeviceGetMemoryInfo", index)(e)),
            };
            let mig_enabled = match device.mig_mode() {
                Ok(mode) => mode.current == 1,
                Err(NvmlError::NotSupported) => false,
                Err(e) => return Err(nvml_err("nvmlDeviceGetMigMode", index)(e)),
            };
            let mig_devices = if mig_enabled && self.mig_devices {
                // Unreadable (no MIG capability nodes): the devices get no paths, and
                // PASS_DEVICE_SPECS=true is then refused at start.
                let minors = std::fs::read_to_string(mig::MIG_MINORS_PATH)
                    .map(|text| mig::MigMinors::parse(&text))
                    .unwrap_or_default();
                mig_devices_of(&device, index, minor, &minors)?
            } else {
                Vec::new()
            };
            let numa = device
                .pci_info()
                .ok()
                .and_then(|pci| numa_node(&pci.bus_id));
            gpus.push(Gpu {
                uuid,
                index,
                minor,
                name,
                memory_mib,
                numa_node: numa,
                mig_enabled,
                healthy: true,
                mig_devices,
            });
        }
        Ok(gpus)
    }

    fn gpu_links(&self) -> Result<Vec<GpuLinks>, InventoryError> {
        nvml_links(&self.nvml)
    }

    fn watch_health(
        &self,
        gpus: &[Gpu],
        policy: &HealthCheckPolicy,
        events: mpsc::UnboundedSender<HealthEvent>,
    ) -> Result<(), InventoryError> {
        if policy.all_disabled() {
            return Ok(());
        }
        let nvml = Arc::clone(&self.nvml);
        let watch = HealthWatch::new(
            gpus.iter().map(|g| g.uuid.clone()).collect(),
            policy.clone(),
        );
        std::thread::Builder::new()
            .name("nvml-health".to_owned())
            .spawn(move || {
                let mut source = NvmlEvents::new(&nvml);
                health::watch_xids(&mut source, &watch, &events);
            })
            .map_err(|e| {
                InventoryError::NvmlUnavailable(format!("cannot start the health thread: {e}"))
            })?;
        Ok(())
    }
}

/// NVML's event set as an [`XidEventSource`]: critical Xid events of the registered GPUs.
struct NvmlEvents<'n> {
    nvml: &'n Nvml,
    set: Option<EventSet<'n>>,
    watched: Vec<String>,
}

impl<'n> NvmlEvents<'n> {
    fn new(nvml: &'n Nvml) -> Self {
        Self {
            nvml,
            set: None,
            watched: Vec::new(),
        }
    }

    fn add(&mut self, uuid: &str) -> Result<(), NvmlError> {
        let device = self.nvml.device_by_uuid(uuid)?;
        let set = match self.set.take() {
            Some(set) => set,
            None => self.nvml.create_event_set()?,
        };
        // nvml-wrapper releases the set when a registration fails.
        let set = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| e.error)?;
        self.set = Some(set);
        Ok(())
    }

    /// After a failed registration released the set: a new set with the GPUs watched so far.
    fn rebuild(&mut self) {
        self.set = None;
        for uuid in self.watched.clone() {
            if let Err(error) = self.add(&uuid) {
                tracing::warn!(gpu = %uuid, %error, "cannot watch this GPU's Xid events again after another GPU's registration failed");
            }
        }
    }
}

impl XidEventSource for NvmlEvents<'_> {
    fn register(&mut self, uuid: &str) -> Registration {
        let supported = match self
            .nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.supported_event_types())
        {
            Ok(supported) => supported,
            Err(e) => return Registration::Failed(e.to_string()),
        };
        if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
            return Registration::NotSupported;
        }
        match self.add(uuid) {
            Ok(()) => {
                self.watched.push(uuid.to_owned());
                Registration::Watching
            }
            Err(NvmlError::NotSupported) => {
                self.rebuild();
                Registration::NotSupported
            }
            Err(e) => {
                self.rebuild();
                Registration::Failed(e.to_string())
            }
        }
    }

    fn wait(&mut self, timeout: Duration) -> Wait {
        let Some(set) = &self.set else {
            std::thread::sleep(timeout);
            return Wait::Timeout;
        };
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        match set.wait(ms) {
            Ok(data) => Wait::Event(XidEvent {
                uuid: data.device.uuid().map_err(|e| e.to_string()),
                critical_xid: data.event_type.contains(EventTypes::CRITICAL_XID_ERROR),
                xid: match data.event_data {
                    Some(XidError::Value(x)) => x,
                    Some(XidError::Unknown) | None => UNKNOWN_XID,
                },
            }),
            Err(NvmlError::Timeout) => Wait::Timeout,
            Err(e) => Wait::Failed(e.to_string()),
        }
    }
}

/// PCI vendor id of NVIDIA (the low 16 bits of NVML's `pciDeviceId`).
const PCI_VENDOR_NVIDIA: u32 = 0x10de;

/// HAMi's `PciInfo.BusID()` (`links.go`): lower case, the 8-digit domain's leading `0000`
/// dropped, so that NVML's own and its remote PCI infos compare equal.
fn bus_id(raw: &str) -> String {
    let id = raw.to_ascii_lowercase();
    if id == "0000" {
        return id;
    }
    id.strip_prefix("0000")
        .map_or_else(|| id.clone(), str::to_owned)
}

/// HAMi's `GetP2PLink`: NVML's common-ancestor level as a PCIe link.
fn pcie_link(level: TopologyLevel) -> PcieLink {
    match level {
        TopologyLevel::Internal => PcieLink::SameBoard,
        TopologyLevel::Single => PcieLink::SingleSwitch,
        TopologyLevel::Multiple => PcieLink::MultiSwitch,
        TopologyLevel::HostBridge => PcieLink::HostBridge,
        TopologyLevel::Node => PcieLink::SameCpu,
        TopologyLevel::System => PcieLink::CrossCpu,
    }
}

/// One GPU's active NVLinks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NvLinks {
    /// The bus id of the device at the far end of each active link (HAMi's
    /// `getAllNvLinkRemotePciInfo`).
    remote: Vec<String>,
    /// Active links whose far end is an NVSwitch (HAMi's `countNvSwitchLinks`).
    to_switch: u32,
}

/// HAMi's `GetNVLink` from `a` to the GPU `b` (bus id `b_bus`): the direct links to `b` when
/// there are 1..=18; else, when both reach NVSwitches, the smaller of their switch-link counts;
/// else none.
fn nvlinks_between(a: &NvLinks, b_bus: &str, b: &NvLinks) -> u32 {
    let direct = u32::try_from(a.remote.iter().filter(|r| *r == b_bus).count()).unwrap_or(u32::MAX);
    if (1..=MAX_NVLINKS).contains(&direct) {
        return direct;
    }
    if a.remote.is_empty() {
        return 0;
    }
    if a.to_switch > 0 && b.to_switch > 0 {
        return a.to_switch.min(b.to_switch);
    }
    0
}

/// Errors HAMi skips a link on (`ERROR_NOT_SUPPORTED`, `ERROR_INVALID_ARGUMENT`).
fn skipped(e: &NvmlError) -> bool {
    matches!(e, NvmlError::NotSupported | NvmlError::InvalidArg)
}

/// The active NVLinks of GPU `index`. A far end that is no GPU of `gpu_buses` and an NVIDIA PCI
/// device is an NVSwitch: nvml-wrapper 0.13's `remote_device_type` returns `Unknown` whatever
/// NVML says (it reads a copy of its output), so HAMi's `nvmlDeviceGetNvLinkRemoteDeviceType`
/// test is made from the remote PCI info instead.
fn nvlinks_of(
    device: &nvml_wrapper::Device<'_>,
    index: u32,
    gpu_buses: &[String],
) -> Result<NvLinks, InventoryError> {
    let mut out = NvLinks::default();
    for link in 0..MAX_NVLINKS {
        let wrapper = device.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) if skipped(&e) => continue,
            Err(e) => return Err(nvml_err("nvmlDeviceGetNvLinkState", index)(e)),
        }
        let remote = match wrapper.remote_pci_info() {
            Ok(pci) => pci,
            Err(e) if skipped(&e) => continue,
            Err(e) => return Err(nvml_err("nvmlDeviceGetNvLinkRemotePciInfo_v2", index)(e)),
        };
        let remote_bus = bus_id(&remote.bus_id);
        if !gpu_buses.contains(&remote_bus) && remote.pci_device_id & 0xffff == PCI_VENDOR_NVIDIA {
            out.to_switch += 1;
        }
        out.remote.push(remote_bus);
    }
    Ok(out)
}

/// Every GPU's links to the others, as HAMi v2.10 `pkg/device/nvidia/links.go`
/// (`deviceListBuilder.build`) reads them from NVML: per ordered pair the PCIe common ancestor
/// and the NVLink count. Any failing NVML call fails the whole list, as in HAMi.
fn nvml_links(nvml: &Nvml) -> Result<Vec<GpuLinks>, InventoryError> {
    let count = nvml
        .device_count()
        .map_err(|e| InventoryError::NvmlUnavailable(e.to_string()))?;
    let mut uuids = Vec::new();
    let mut buses = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(nvml_err("nvmlDeviceGetHandleByIndex", index))?;
        uuids.push(
            device
                .uuid()
                .map_err(nvml_err("nvmlDeviceGetUUID", index))?,
        );
        let pci = device
            .pci_info()
            .map_err(nvml_err("nvmlDeviceGetPciInfo", index))?;
        buses.push(bus_id(&pci.bus_id));
    }
    let mut nvlinks = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(nvml_err("nvmlDeviceGetHandleByIndex", index))?;
        nvlinks.push(nvlinks_of(&device, index, &buses)?);
    }
    let mut out = Vec::new();
    for (i, uuid) in (0..count).zip(&uuids) {
        let mut links = Vec::new();
        for (j, peer) in (0..count).zip(&uuids) {
            if i == j {
                continue;
            }
            let a = nvml
                .device_by_index(i)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", i))?;
            let b = nvml
                .device_by_index(j)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", j))?;
            let level = a
                .topology_common_ancestor(b)
                .map_err(nvml_err("nvmlDeviceGetTopologyCommonAncestor", i))?;
            let (ai, bj) = (i as usize, j as usize);
            links.push(PeerLink {
                peer: peer.clone(),
                pcie: Some(pcie_link(level)),
                nvlinks: nvlinks_between(&nvlinks[ai], &buses[bj], &nvlinks[bj]),
            });
        }
        out.push(GpuLinks {
            uuid: uuid.clone(),
            links,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_as_hamis() {
        assert_eq!(bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        // Exactly HAMi's `TrimPrefix`: a 4-digit domain loses it (both sides alike).
        assert_eq!(bus_id("0000:3b:00.0"), ":3b:00.0");
        assert_eq!(bus_id("0000"), "0000");
        assert_eq!(bus_id(""), "");
    }

    #[test]
    fn nvlink_counts_as_hamis_get_nvlink() {
        let v = |remote: &[&str], to_switch| NvLinks {
            remote: remote.iter().map(|r| (*r).to_owned()).collect(),
            to_switch,
        };
        // Direct links to the peer's bus id.
        let a = v(&["b", "b", "c"], 0);
        assert_eq!(nvlinks_between(&a, "b", &v(&["a", "a"], 0)), 2);
        assert_eq!(nvlinks_between(&a, "d", &v(&["a"], 0)), 0);
        // No active link: none, whatever the peer has.
        assert_eq!(nvlinks_between(&v(&[], 0), "b", &v(&["s"; 18], 18)), 0);
        // Both through NVSwitches: the smaller switch-link count.
        let hgx = v(&["s1"; 18], 18);
        assert_eq!(nvlinks_between(&hgx, "b", &v(&["s1"; 12], 12)), 12);
        assert_eq!(nvlinks_between(&hgx, "b", &hgx), 18);
        // Only one side on switches: none.
        assert_eq!(nvlinks_between(&hgx, "b", &v(&["x"], 0)), 0);
        // More direct links than HAMi counts: the switch rule decides.
        assert_eq!(nvlinks_between(&v(&["b"; 19], 0), "b", &v(&[], 0)), 0);
    }

    #[test]
    fn pcie_levels_as_hamis_get_p2p_link() {
        assert_eq!(pcie_link(TopologyLevel::Internal), PcieLink::SameBoard);
        assert_eq!(pcie_link(TopologyLevel::Single), PcieLink::SingleSwitch);
        assert_eq!(pcie_link(TopologyLevel::Multiple), PcieLink::MultiSwitch);
        assert_eq!(pcie_link(TopologyLevel::HostBridge), PcieLink::HostBridge);
        assert_eq!(pcie_link(TopologyLevel::Node), PcieLink::SameCpu);
        assert_eq!(pcie_link(TopologyLevel::System), PcieLink::CrossCpu);
    }

    #[test]
    fn numa_node_of_a_missing_device_is_none() {
        assert_eq!(numa_node("00000000:FF:1F.7"), None);
        assert_eq!(numa_node(""), None);
    }
}

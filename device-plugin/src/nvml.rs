//! The NVML backend of [`GpuInventory`]. `libnvidia-ml.so.1` is loaded at run time, so the binary
//! starts on machines without a GPU; only this backend then fails, with a clear error.

use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use tokio::sync::mpsc;

use crate::health::{
    self, HealthCheckPolicy, HealthWatch, Registration, UNKNOWN_XID, Wait, XidEvent, XidEventSource,
};
use crate::inventory::{Gpu, GpuInventory, HealthEvent, InventoryError, MigDevice};
use crate::mig::{self, MigProfile, SliceShape};

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
fn mig_devices_of(device: &Device<'_>, index: u32) -> Result<Vec<MigDevice>, InventoryError> {
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
        out.push(MigDevice {
            uuid,
            profile: profile.to_string(),
            memory_mib: memory.total / (1024 * 1024),
            healthy: true,
        });
    }
    Ok(out)
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
                mig_devices_of(&device, index)?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_of_a_missing_device_is_none() {
        assert_eq!(numa_node("00000000:FF:1F.7"), None);
        assert_eq!(numa_node(""), None);
    }
}

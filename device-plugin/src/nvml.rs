//! The NVML backend of [`GpuInventory`]. `libnvidia-ml.so.1` is loaded at run time, so the binary
//! starts on machines without a GPU; only this backend then fails, with a clear error.

use std::sync::Arc;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use tokio::sync::mpsc;

use crate::inventory::{Gpu, GpuInventory, HealthEvent, InventoryError};

/// Xid errors caused by applications, not by the GPU: they do not make a GPU unhealthy (the same
/// list as NVIDIA's and HAMi's plugins: graphics/compute engine exceptions, page faults, preemptive
/// cleanup, video processor exceptions, context switch timeouts).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Env variable (NVIDIA's and HAMi's): `all` or `xids` turns health checks off; otherwise a
/// comma-separated list of further Xids to ignore.
pub const ENV_DISABLE_HEALTHCHECKS: &str = "DP_DISABLE_HEALTHCHECKS";

/// What `DP_DISABLE_HEALTHCHECKS` asks for: `None` = no health checks, else the extra Xids to
/// ignore. Unparsable items are ignored, as NVIDIA's plugin does.
pub fn health_check_policy(value: Option<&str>) -> Option<Vec<u64>> {
    let Some(value) = value else {
        return Some(Vec::new());
    };
    let items: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if items
        .iter()
        .any(|i| i.eq_ignore_ascii_case("all") || i.eq_ignore_ascii_case("xids"))
    {
        return None;
    }
    Some(items.iter().filter_map(|i| i.parse().ok()).collect())
}

/// GPUs from NVML.
#[derive(Clone)]
pub struct NvmlInventory {
    nvml: Arc<Nvml>,
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
        })
    }
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
            let memory = device
                .memory_info()
                .map_err(nvml_err("nvmlDeviceGetMemoryInfo", index))?;
            let mig_enabled = match device.mig_mode() {
                Ok(mode) => mode.current == 1,
                Err(NvmlError::NotSupported) => false,
                Err(e) => return Err(nvml_err("nvmlDeviceGetMigMode", index)(e)),
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
                memory_mib: memory.total / (1024 * 1024),
                numa_node: numa,
                mig_enabled,
                healthy: true,
            });
        }
        Ok(gpus)
    }

    fn watch_health(
        &self,
        gpus: &[Gpu],
        events: mpsc::UnboundedSender<HealthEvent>,
    ) -> Result<(), InventoryError> {
        let setting = std::env::var(ENV_DISABLE_HEALTHCHECKS).ok();
        let Some(ignored) = health_check_policy(setting.as_deref()) else {
            tracing::warn!(env = ENV_DISABLE_HEALTHCHECKS, "GPU health checks disabled");
            return Ok(());
        };
        let nvml = Arc::clone(&self.nvml);
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        std::thread::Builder::new()
            .name("nvml-health".to_owned())
            .spawn(move || watch_xids(&nvml, &uuids, &ignored, &events))
            .map_err(|e| {
                InventoryError::NvmlUnavailable(format!("cannot start the health thread: {e}"))
            })?;
        Ok(())
    }
}

/// Blocks on NVML critical-Xid events; a GPU with a critical, non-application Xid is reported
/// unhealthy (once: like HAMi, it does not come back until the plugin restarts).
fn watch_xids(
    nvml: &Nvml,
    uuids: &[String],
    ignored: &[u64],
    events: &mpsc::UnboundedSender<HealthEvent>,
) {
    let mut set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(error) => {
            tracing::warn!(%error, "NVML event set unavailable; GPU health is not watched");
            return;
        }
    };
    for uuid in uuids {
        let device = match nvml.device_by_uuid(uuid.as_str()) {
            Ok(d) => d,
            Err(error) => {
                tracing::warn!(%uuid, %error, "GPU not found for health watch");
                continue;
            }
        };
        set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(set) => set,
            Err(error) => {
                // The set was released by nvml-wrapper; start a new one for the other GPUs.
                tracing::warn!(%uuid, error = %error.error, "critical Xid events not supported; health not watched for this GPU");
                match nvml.create_event_set() {
                    Ok(set) => set,
                    Err(_) => return,
                }
            }
        };
    }
    let mut reported: Vec<String> = Vec::new();
    while !events.is_closed() {
        let data = match set.wait(5_000) {
            Ok(data) => data,
            Err(NvmlError::Timeout) => continue,
            Err(error) => {
                tracing::warn!(%error, "waiting for NVML events failed; GPU health is no longer watched");
                return;
            }
        };
        let xid = match data.event_data {
            Some(XidError::Value(x)) => Some(x),
            Some(XidError::Unknown) | None => None,
        };
        if xid.is_some_and(|x| APPLICATION_XIDS.contains(&x) || ignored.contains(&x)) {
            continue;
        }
        let Ok(uuid) = data.device.uuid() else {
            continue;
        };
        if reported.contains(&uuid) {
            continue;
        }
        reported.push(uuid.clone());
        let reason = xid.map_or_else(
            || "unknown critical Xid".to_owned(),
            |x| format!("critical Xid {x}"),
        );
        if events
            .send(HealthEvent {
                uuid,
                healthy: false,
                reason,
            })
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disable_healthchecks_setting() {
        assert_eq!(health_check_policy(None), Some(vec![]));
        assert_eq!(health_check_policy(Some("all")), None);
        assert_eq!(health_check_policy(Some("48, XIDS")), None);
        assert_eq!(health_check_policy(Some("48, 79,x")), Some(vec![48, 79]));
    }

    #[test]
    fn numa_node_of_a_missing_device_is_none() {
        assert_eq!(numa_node("00000000:FF:1F.7"), None);
        assert_eq!(numa_node(""), None);
    }
}

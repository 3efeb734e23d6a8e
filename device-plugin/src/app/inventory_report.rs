//! `inventory`: the GPUs found, the kubelet devices and the node annotation that `run` would
//! publish, as JSON or as text for people.

use serde::Serialize;

use super::{AppError, discover, load_settings, node_score, registered_table};
use crate::cli::SourceArgs;
use crate::gpu::devices::{DeviceTable, SkippedGpu};
use crate::gpu::inventory::Gpu;
use crate::gpu::topology;
use crate::kubelet::plugin;
use crate::node_register::{self, ANNOTATION_NODE_NVIDIA_REGISTER};

/// One kubelet device in the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportDevice {
    /// Device ID.
    pub id: String,
    /// `Healthy` / `Unhealthy`.
    pub health: String,
    /// NUMA node, when topology is attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
}

/// What `inventory` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryReport {
    /// `nvml` or `file`.
    pub backend: String,
    /// Every GPU found.
    pub gpus: Vec<Gpu>,
    /// GPUs not advertised, with the reason.
    pub skipped: Vec<SkippedGpu>,
    /// The first advertised resource (`resourceCountName`, unless every GPU is in MIG mode).
    pub resource_name: String,
    /// Its plugin socket's file name.
    pub socket: String,
    /// Shares per GPU.
    pub split_count: u32,
    /// The list `ListAndWatch` would send.
    pub kubelet_devices: Vec<ReportDevice>,
    /// Every advertised resource (the first is the one above; static MIG adds more).
    pub resources: Vec<ReportResource>,
    /// The node annotation key.
    pub node_annotation_key: String,
    /// The node annotation value, exactly as it would be patched.
    pub node_annotation: String,
    /// `hami.io/node-nvidia-score`, exactly as it would be patched (`--enable-topology-score`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_score_annotation: Option<String>,
}

/// One advertised resource in the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportResource {
    /// The extended resource.
    pub resource_name: String,
    /// The plugin socket's file name.
    pub socket: String,
    /// `true` for MIG devices (advertised whole, no HAMi-core).
    pub mig: bool,
    /// The list `ListAndWatch` would send.
    pub kubelet_devices: Vec<ReportDevice>,
}

fn report_devices(table: &DeviceTable) -> Vec<ReportDevice> {
    table
        .kubelet_devices()
        .into_iter()
        .map(|d| ReportDevice {
            id: d.id,
            health: d.health,
            numa_node: d.topology.and_then(|t| t.nodes.first().map(|n| n.id)),
        })
        .collect()
}

/// Builds the `inventory` report.
pub fn inventory_report(source: &SourceArgs) -> crate::Result<InventoryReport> {
    let settings = load_settings(source)?;
    let (inventory, gpus, advertised) = discover(source, &settings)?;
    let Some(first) = advertised.resources.first() else {
        return Err(AppError::NoGpu(advertised.no_gpu()));
    };
    let registered = registered_table(&advertised, &settings);
    let annotation = node_register::register_annotation(&registered, settings.scaling());
    let node_score_annotation =
        node_score(source, inventory.as_ref(), &registered)?.map(|s| s.annotation());
    let resources = advertised
        .resources
        .iter()
        .map(|r| ReportResource {
            resource_name: r.resource_name.clone(),
            socket: plugin::socket_name(&r.resource_name),
            mig: r.table.is_mig(),
            kubelet_devices: report_devices(&r.table),
        })
        .collect();
    Ok(InventoryReport {
        backend: inventory.backend().to_owned(),
        gpus,
        skipped: advertised.skipped.clone(),
        socket: plugin::socket_name(&first.resource_name),
        resource_name: first.resource_name.clone(),
        split_count: first.table.split_count(),
        kubelet_devices: report_devices(&first.table),
        resources,
        node_annotation_key: ANNOTATION_NODE_NVIDIA_REGISTER.to_owned(),
        node_annotation: annotation,
        node_score_annotation,
    })
}

/// The report as text for people.
pub fn render_report(report: &InventoryReport) -> String {
    let mut out = format!("backend: {}\n", report.backend);
    for gpu in &report.gpus {
        out.push_str(&format!(
            "GPU {} {} {} {} MiB numa={} mig={} healthy={}\n",
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.memory_mib,
            gpu.numa_node
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            gpu.mig_enabled,
            gpu.healthy
        ));
        for mig in &gpu.mig_devices {
            out.push_str(&format!(
                "  MIG {} {} {} MiB healthy={}\n",
                mig.uuid, mig.profile, mig.memory_mib, mig.healthy
            ));
        }
    }
    for skipped in &report.skipped {
        out.push_str(&format!(
            "skipped {} (index {}): {}\n",
            skipped.uuid, skipped.index, skipped.reason
        ));
    }
    for resource in &report.resources {
        let per = if resource.mig {
            "MIG devices, no HAMi-core".to_owned()
        } else {
            format!("{} per GPU", report.split_count)
        };
        out.push_str(&format!(
            "resource {} on {}: {} devices ({per})\n",
            resource.resource_name,
            resource.socket,
            resource.kubelet_devices.len(),
        ));
        for device in &resource.kubelet_devices {
            out.push_str(&format!("  {} {}\n", device.id, device.health));
        }
    }
    out.push_str(&format!(
        "{}: {}\n",
        report.node_annotation_key, report.node_annotation
    ));
    if let Some(score) = &report.node_score_annotation {
        out.push_str(&format!(
            "{}: {score}\n",
            topology::ANNOTATION_NODE_NVIDIA_SCORE
        ));
    }
    out
}

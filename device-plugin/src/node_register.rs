//! The node handshake with the HAMi scheduler: the node annotation `hami.io/node-nvidia-register`,
//! a JSON array with one entry per GPU, in the field names, units and `omitempty` rules of HAMi's
//! `DeviceInfo` (v2.10), merge-patched at start and again whenever it differs from what the node
//! carries (checked every 30 s by default, and at once after a health change).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::gpu::devices::DeviceTable;
use crate::gpu::inventory::Gpu;

pub use hami_shared::names::ANNOTATION_NODE_NVIDIA_REGISTER;
/// HAMi's device mode for GPUs shared through HAMi-core.
pub const MODE_HAMI_CORE: &str = "hami-core";

/// One GPU as the HAMi scheduler reads it. Zero, empty and false values are left out, as Go's
/// `omitempty` does, so the bytes match what HAMi's plugin writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeDeviceInfo {
    /// GPU UUID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// NVML index.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub index: u32,
    /// Split count: how many pods may share the GPU.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub count: i32,
    /// Memory in MiB, times the memory scaling.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub devmem: i32,
    /// Cores: 100 times the core scaling.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub devcore: i32,
    /// `NVIDIA-<product>` (the NVML name, prefixed unless it already starts with `NVIDIA`).
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub device_type: String,
    /// NUMA node (0 when unknown).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub numa: i64,
    /// `hami-core`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// Health.
    #[serde(default, skip_serializing_if = "is_false")]
    pub health: bool,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(v: &bool) -> bool {
    !*v
}

/// The scaling the annotation applies, and the node's operating mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaling {
    /// Shares per GPU.
    pub split_count: u32,
    /// `deviceMemoryScaling`.
    pub memory: f64,
    /// `deviceCoreScaling`.
    pub core: f64,
    /// The node's operating mode (`hami-core` unless the node config says otherwise).
    pub mode: &'static str,
}

/// HAMi's device type: the NVML name, prefixed `NVIDIA-` unless it already starts with `NVIDIA`.
pub fn device_type(name: &str) -> String {
    if name.starts_with("NVIDIA") {
        name.to_owned()
    } else {
        format!("NVIDIA-{name}")
    }
}

/// The annotation entry of one GPU. Go converts `float64` to `int32` by truncation, and so do we
/// (`as` also saturates instead of wrapping on absurd values).
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
pub fn device_info(gpu: &Gpu, scaling: Scaling) -> NodeDeviceInfo {
    NodeDeviceInfo {
        id: gpu.uuid.clone(),
        index: gpu.index,
        count: i32::try_from(scaling.split_count).unwrap_or(i32::MAX),
        devmem: (gpu.memory_mib as f64 * scaling.memory) as i32,
        devcore: (scaling.core * 100.0) as i32,
        device_type: device_type(&gpu.name),
        numa: gpu.numa_node.unwrap_or(0),
        mode: scaling.mode.to_owned(),
        health: gpu.healthy,
    }
}

/// The annotation value for the advertised GPUs.
pub fn register_annotation(table: &DeviceTable, scaling: Scaling) -> String {
    let infos: Vec<NodeDeviceInfo> = table
        .gpus()
        .iter()
        .map(|g| device_info(g, scaling))
        .collect();
    // Serialising plain structs of strings and integers cannot fail.
    serde_json::to_string(&infos).unwrap_or_else(|_| "[]".to_owned())
}

/// Settings of the handshake loop.
#[derive(Debug, Clone)]
pub struct NodeRegisterConfig {
    /// This node (`NODE_NAME`).
    pub node_name: String,
    /// How often the node's annotation is compared with ours (HAMi: 30 s).
    pub interval: Duration,
    /// Wait after a failed get/patch (HAMi: 5 s).
    pub retry: Duration,
    /// Scaling applied to the annotation.
    pub scaling: Scaling,
    /// `hami.io/node-nvidia-score`, published with the register annotation when set
    /// (`ENABLE_TOPOLOGY_SCORE`; computed once at start: links do not change while running).
    pub score: Option<String>,
    /// The GPU pairs whose two directions report different P2P links (scored 0). Not empty: a
    /// Warning Event `AsymmetricGPUP2PLink` on the Node, at most once an hour (HAMi v2.10
    /// `plugin/register.go` `RegisterInAnnotation`: `util.EmitNodeWarningEvent(node,
    /// "AsymmetricGPUP2PLink", …, time.Hour)`).
    pub asymmetric_links: Vec<(String, String)>,
}

/// The component name on the plugin's Events.
pub const REPORTING_CONTROLLER: &str = "hami-device-plugin";

/// The plugin's Event recorder on `node_name` (reported by [`REPORTING_CONTROLLER`] from that
/// node): the node register loop's and the allocator's.
pub fn recorder(client: kube::Client, node_name: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            instance: Some(node_name.to_owned()),
        },
    )
}

/// At most `max` bytes of `s`, cut at a character boundary (Events notes are limited to 1 kB).
pub fn truncate_note(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// The reason of the asymmetric-link Event (HAMi's).
pub const REASON_ASYMMETRIC_LINK: &str = "AsymmetricGPUP2PLink";

/// How often the asymmetric-link Event is raised again while the pairs stay asymmetric.
pub const ASYMMETRIC_EVENT_EVERY: Duration = Duration::from_secs(3600);

/// The Event's note: HAMi's text, then the pairs.
pub fn asymmetric_links_note(pairs: &[(String, String)]) -> String {
    let listed: Vec<String> = pairs.iter().map(|(a, b)| format!("{a} <-> {b}")).collect();
    format!(
        "One or more GPU pairs on this node have asymmetric P2P link data; affected pairs scored 0 (possible NVLink hardware or driver issue): {}",
        listed.join(", ")
    )
}

/// A Warning Event on the Node about its asymmetric GPU pairs (best effort: a failure is logged
/// and the next pass tries again).
async fn warn_asymmetric_links(
    recorder: &Recorder,
    node: &Node,
    pairs: &[(String, String)],
) -> bool {
    const MAX_NOTE: usize = 1024;
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        ..ObjectReference::default()
    };
    let mut note = asymmetric_links_note(pairs);
    if note.len() > MAX_NOTE {
        note = truncate_note(&note, MAX_NOTE - 3) + "...";
    }
    let event = Event {
        type_: EventType::Warning,
        reason: REASON_ASYMMETRIC_LINK.to_owned(),
        note: Some(note),
        action: "Score".to_owned(),
        secondary: None,
    };
    match recorder.publish(&event, &reference).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, node = ?reference.name, reason = REASON_ASYMMETRIC_LINK, "cannot record the node Event");
            false
        }
    }
}

/// Makes the node `node_name` (`node`, as just read) carry every `(key, value)` of `desired`; one merge patch of those
/// that differ (HAMi patches the register and score annotations together); returns whether one
/// was sent.
pub async fn patch_annotations(
    nodes: &Api<Node>,
    node_name: &str,
    node: &Node,
    desired: &[(&str, &str)],
) -> Result<bool, kube::Error> {
    let current = node.metadata.annotations.as_ref();
    let changed: serde_json::Map<String, serde_json::Value> = desired
        .iter()
        .filter(|(key, value)| {
            current.and_then(|a| a.get(*key)).map(String::as_str) != Some(*value)
        })
        .map(|(key, value)| ((*key).to_owned(), serde_json::Value::from(*value)))
        .collect();
    if changed.is_empty() {
        return Ok(false);
    }
    let patch = serde_json::json!({ "metadata": { "annotations": changed } });
    nodes
        .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(true)
}

/// Keeps the node annotation current until `shutdown` completes. Errors are logged and retried;
/// they never stop the device plugin (kubelet keeps being served).
pub async fn run_node_register(
    client: kube::Client,
    config: NodeRegisterConfig,
    table: watch::Receiver<DeviceTable>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let metrics = crate::metrics::Metrics::new();
    run_node_register_observed(client, config, table, &metrics, shutdown).await;
}

/// [`run_node_register`], counting patches and failures in `metrics`.
pub async fn run_node_register_observed(
    client: kube::Client,
    config: NodeRegisterConfig,
    mut table: watch::Receiver<DeviceTable>,
    metrics: &crate::metrics::Metrics,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let recorder = recorder(client, &config.node_name);
    let mut asymmetric_warned: Option<tokio::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let desired = register_annotation(&table.borrow_and_update(), config.scaling);
        let mut annotations = vec![(ANNOTATION_NODE_NVIDIA_REGISTER, desired.as_str())];
        if let Some(score) = &config.score {
            annotations.push((
                crate::gpu::topology::ANNOTATION_NODE_NVIDIA_SCORE,
                score.as_str(),
            ));
        }
        // One read of the node a pass, for the annotations and the Event.
        let node = nodes.get(&config.node_name).await;
        if let Ok(node) = &node {
            let due = asymmetric_warned.is_none_or(|t| t.elapsed() >= ASYMMETRIC_EVENT_EVERY);
            if !config.asymmetric_links.is_empty()
                && due
                && warn_asymmetric_links(&recorder, node, &config.asymmetric_links).await
            {
                asymmetric_warned = Some(tokio::time::Instant::now());
            }
        }
        let patched = match node {
            Ok(node) => patch_annotations(&nodes, &config.node_name, &node, &annotations).await,
            Err(error) => Err(error),
        };
        let wait = match patched {
            Ok(patched) => {
                metrics.observe_node_patch(Ok(patched));
                if patched {
                    tracing::info!(node = %config.node_name, annotation = ANNOTATION_NODE_NVIDIA_REGISTER, "node annotation patched");
                }
                config.interval
            }
            Err(error) => {
                metrics.observe_node_patch(Err(()));
                tracing::warn!(node = %config.node_name, %error, retry_s = config.retry.as_secs_f64(), "node annotation not updated");
                config.retry
            }
        };
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(wait) => {}
            changed = table.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::inventory::DeviceFilter;

    fn gpu(uuid: &str, index: u32, name: &str, mib: u64) -> Gpu {
        Gpu {
            uuid: uuid.into(),
            index,
            minor: index,
            name: name.into(),
            memory_mib: mib,
            numa_node: None,
            mig_enabled: false,
            healthy: true,
            mig_devices: Vec::new(),
        }
    }

    #[test]
    fn matches_hamis_example_bytes() {
        let (table, _) = DeviceTable::build(
            vec![gpu("GPU-0", 0, "Tesla P4", 8192)],
            &DeviceFilter::default(),
            5,
            false,
        )
        .unwrap();
        let text = register_annotation(
            &table,
            Scaling {
                split_count: 5,
                memory: 1.0,
                core: 1.0,
                mode: MODE_HAMI_CORE,
            },
        );
        assert_eq!(
            text,
            r#"[{"id":"GPU-0","count":5,"devmem":8192,"devcore":100,"type":"NVIDIA-Tesla P4","mode":"hami-core","health":true}]"#
        );
    }

    #[test]
    fn scaling_numa_index_and_health() {
        let mut second = gpu("GPU-1", 1, "NVIDIA H200", 143_771);
        second.numa_node = Some(1);
        second.healthy = false;
        let (table, _) = DeviceTable::build(
            vec![gpu("GPU-0", 0, "NVIDIA H200", 143_771), second],
            &DeviceFilter::default(),
            10,
            false,
        )
        .unwrap();
        let text = register_annotation(
            &table,
            Scaling {
                split_count: 10,
                memory: 1.5,
                core: 2.0,
                mode: MODE_HAMI_CORE,
            },
        );
        let infos: Vec<NodeDeviceInfo> = serde_json::from_str(&text).unwrap();
        assert_eq!(infos[1].index, 1);
        assert_eq!(infos[1].devmem, 215_656); // 143771 × 1.5 = 215656.5, truncated like Go
        assert_eq!(infos[1].devcore, 200);
        assert_eq!(infos[1].device_type, "NVIDIA H200");
        assert_eq!(infos[1].numa, 1);
        assert!(!infos[1].health);
        assert!(
            !text.contains(r#""health":false"#),
            "false is omitted: {text}"
        );
        assert!(!text.contains(r#""index":0"#), "zero is omitted: {text}");
    }

    #[test]
    fn device_type_prefix() {
        assert_eq!(device_type("Tesla T4"), "NVIDIA-Tesla T4");
        assert_eq!(
            device_type("NVIDIA A100-SXM4-80GB"),
            "NVIDIA A100-SXM4-80GB"
        );
    }
}

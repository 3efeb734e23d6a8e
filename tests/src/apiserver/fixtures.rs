//! Realistic objects: a GPU Node labelled by GPU feature discovery (GFD) and NFD, registered by
//! HAMi, and a defaulted, scheduled GPU Pod — recorded in `tests/fixtures/` — plus generators that
//! vary them (GPU model, memory, count, zone, instance type) for scale tests.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::ApiServerError;

/// A GFD-labelled GPU node as `kubectl get node -o json` shows it (EKS, 8x A100 80GB, HAMi).
pub const GPU_NODE_JSON: &str = include_str!("../../fixtures/gpu-node.json");

/// A scheduled, running HAMi GPU pod as stored by the apiserver (defaults applied).
pub const GPU_POD_JSON: &str = include_str!("../../fixtures/gpu-pod.json");

/// One GPU model as GFD labels it.
#[derive(Debug, Clone, Copy)]
pub struct GpuModel {
    /// `nvidia.com/gpu.product`
    pub product: &'static str,
    /// `nvidia.com/gpu.memory` (MiB)
    pub memory_mib: u64,
    /// `nvidia.com/gpu.count`
    pub count: u32,
    /// `node.kubernetes.io/instance-type`
    pub instance_type: &'static str,
    /// `nvidia.com/gpu.family`
    pub family: &'static str,
    /// `nvidia.com/gpu.compute.major` / `.minor`
    pub compute: (u32, u32),
}

/// The GPU models the node generator cycles through.
pub const GPU_MODELS: &[GpuModel] = &[
    GpuModel {
        product: "NVIDIA-A100-SXM4-80GB",
        memory_mib: 81920,
        count: 8,
        instance_type: "p4de.24xlarge",
        family: "ampere",
        compute: (8, 0),
    },
    GpuModel {
        product: "NVIDIA-H100-80GB-HBM3",
        memory_mib: 81559,
        count: 8,
        instance_type: "p5.48xlarge",
        family: "hopper",
        compute: (9, 0),
    },
    GpuModel {
        product: "Tesla-T4",
        memory_mib: 15360,
        count: 4,
        instance_type: "g4dn.12xlarge",
        family: "turing",
        compute: (7, 5),
    },
    GpuModel {
        product: "NVIDIA-A10G",
        memory_mib: 23028,
        count: 4,
        instance_type: "g5.12xlarge",
        family: "ampere",
        compute: (8, 6),
    },
    GpuModel {
        product: "NVIDIA-L4",
        memory_mib: 23034,
        count: 8,
        instance_type: "g6.48xlarge",
        family: "ada-lovelace",
        compute: (8, 9),
    },
    GpuModel {
        product: "NVIDIA-L40S",
        memory_mib: 46068,
        count: 4,
        instance_type: "g6e.12xlarge",
        family: "ada-lovelace",
        compute: (8, 9),
    },
];

/// Zones the node generator cycles through.
pub const ZONES: &[(&str, &str)] = &[
    ("us-east-1a", "use1-az4"),
    ("us-east-1b", "use1-az6"),
    ("us-east-1c", "use1-az1"),
    ("us-east-1d", "use1-az2"),
];

fn template(
    cell: &'static OnceLock<Result<Value, Arc<serde_json::Error>>>,
    name: &'static str,
    text: &str,
) -> Result<Value, ApiServerError> {
    let parsed = cell.get_or_init(|| {
        let mut v: Value = serde_json::from_str(text).map_err(Arc::new)?;
        // Server-owned fields are set when the object is stored.
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in ["uid", "resourceVersion", "creationTimestamp"] {
                m.remove(k);
            }
        }
        Ok(v)
    });
    parsed
        .clone()
        .map_err(|source| ApiServerError::Fixture { name, source })
}

/// The model and zone the generator gives node number `index`.
pub fn node_profile(index: usize) -> (&'static GpuModel, &'static str) {
    let model = &GPU_MODELS[index % GPU_MODELS.len()];
    let zone = ZONES[(index / GPU_MODELS.len()) % ZONES.len()].0;
    (model, zone)
}

fn hex_uuid(seed: usize, gpu: u32) -> String {
    let x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(gpu).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        x >> 32,
        (x >> 16) & 0xffff,
        x & 0xffff,
        gpu,
        (seed as u64) & 0xffff_ffff_ffff
    )
}

/// The node fixture renamed and varied for node number `index` (model, zone, address), as JSON.
pub fn gpu_node_json(name: &str, index: usize) -> Result<Value, ApiServerError> {
    static CELL: OnceLock<Result<Value, Arc<serde_json::Error>>> = OnceLock::new();
    let mut v = template(&CELL, "gpu-node.json", GPU_NODE_JSON)?;
    let (model, zone) = node_profile(index);
    let ip = format!(
        "10.{}.{}.{}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    );
    set(&mut v, &["metadata", "name"], json!(name));
    for (k, val) in node_labels(name, model, zone) {
        set(&mut v, &["metadata", "labels", k], json!(val));
    }
    set(
        &mut v,
        &["metadata", "annotations", "hami.io/node-nvidia-register"],
        json!(register_annotation(index, model)),
    );
    set(
        &mut v,
        &[
            "metadata",
            "annotations",
            "alpha.kubernetes.io/provided-node-ip",
        ],
        json!(ip),
    );
    set(
        &mut v,
        &["spec", "providerID"],
        json!(format!(
            "aws:///{zone}/i-{:017x}",
            index as u64 * 7919 + 0x0a1b_2c3d
        )),
    );
    let cidr = format!("10.{}.{}.0/24", 128 + ((index >> 8) & 0x7f), index & 0xff);
    set(&mut v, &["spec", "podCIDR"], json!(cidr));
    set(&mut v, &["spec", "podCIDRs"], json!([cidr]));
    set(
        &mut v,
        &["status", "addresses"],
        json!([
            { "type": "InternalIP", "address": ip },
            { "type": "InternalDNS", "address": name },
            { "type": "Hostname", "address": name },
        ]),
    );
    set_gpu_resources(&mut v, model);
    Ok(v)
}

/// Sets the value at `path` (every key but the last must lead to an object).
fn set(v: &mut Value, path: &[&str], value: Value) {
    let mut cur = v;
    for p in &path[..path.len() - 1] {
        cur = &mut cur[*p];
    }
    cur[path[path.len() - 1]] = value;
}

/// The node's labels: host name, instance type, zone and GFD's GPU labels of `model`.
fn node_labels(name: &str, model: &GpuModel, zone: &'static str) -> [(&'static str, String); 14] {
    let zone_id = ZONES
        .iter()
        .find(|(z, _)| *z == zone)
        .map_or("use1-az4", |(_, id)| *id);
    [
        ("kubernetes.io/hostname", name.to_string()),
        (
            "beta.kubernetes.io/instance-type",
            model.instance_type.to_string(),
        ),
        (
            "node.kubernetes.io/instance-type",
            model.instance_type.to_string(),
        ),
        ("nvidia.com/gpu.machine", model.instance_type.to_string()),
        ("failure-domain.beta.kubernetes.io/zone", zone.to_string()),
        ("topology.kubernetes.io/zone", zone.to_string()),
        ("topology.ebs.csi.aws.com/zone", zone.to_string()),
        ("topology.k8s.aws/zone-id", zone_id.to_string()),
        ("nvidia.com/gpu.product", model.product.to_string()),
        ("nvidia.com/gpu.memory", model.memory_mib.to_string()),
        ("nvidia.com/gpu.count", model.count.to_string()),
        ("nvidia.com/gpu.family", model.family.to_string()),
        ("nvidia.com/gpu.compute.major", model.compute.0.to_string()),
        ("nvidia.com/gpu.compute.minor", model.compute.1.to_string()),
    ]
}

/// `hami.io/node-nvidia-register` for node `index`'s GPUs of `model`, as HAMi's plugin writes it.
fn register_annotation(index: usize, model: &GpuModel) -> String {
    (0..model.count)
        .map(|g| {
            format!(
                "{},10,{},100,{},0,true,{g},hami-core:",
                hex_uuid(index, g),
                model.memory_mib,
                model.product
            )
        })
        .collect()
}

/// Capacity and allocatable of HAMi's three resources for the node's GPUs.
fn set_gpu_resources(v: &mut Value, model: &GpuModel) {
    for section in ["capacity", "allocatable"] {
        set(
            v,
            &["status", section, "nvidia.com/gpu"],
            json!((model.count * 10).to_string()),
        );
        set(
            v,
            &["status", section, "nvidia.com/gpucores"],
            json!((model.count * 100).to_string()),
        );
        set(
            v,
            &["status", section, "nvidia.com/gpumem"],
            json!((u64::from(model.count) * model.memory_mib).to_string()),
        );
    }
}

/// The node fixture renamed and varied for node number `index`.
pub fn gpu_node(name: &str, index: usize) -> Result<Node, ApiServerError> {
    serde_json::from_value(gpu_node_json(name, index)?).map_err(|source| ApiServerError::Json {
        kind: "Node".into(),
        source,
    })
}

/// The name the generator gives node number `index` (`gpu-node-00042`).
pub fn node_name(index: usize) -> String {
    format!("gpu-node-{index:05}")
}

/// `n` varied GPU nodes named `gpu-node-00000` ... .
pub fn gpu_nodes(n: usize) -> Result<Vec<Node>, ApiServerError> {
    (0..n).map(|i| gpu_node(&node_name(i), i)).collect()
}

/// The pod fixture renamed, in `namespace`, bound to `node` (or pending and unscheduled when
/// `None`), as JSON.
pub fn gpu_pod_json(
    namespace: &str,
    name: &str,
    node: Option<&str>,
) -> Result<Value, ApiServerError> {
    static CELL: OnceLock<Result<Value, Arc<serde_json::Error>>> = OnceLock::new();
    let mut v = template(&CELL, "gpu-pod.json", GPU_POD_JSON)?;
    v["metadata"]["name"] = json!(name);
    v["metadata"]["namespace"] = json!(namespace);
    match node {
        Some(n) => {
            v["spec"]["nodeName"] = json!(n);
            v["metadata"]["labels"]["hami.io/vgpu-node"] = json!(n);
            v["metadata"]["annotations"]["hami.io/vgpu-node"] = json!(n);
        }
        None => {
            if let Some(spec) = v["spec"].as_object_mut() {
                spec.remove("nodeName");
            }
            if let Some(m) = v["metadata"].as_object_mut() {
                m.remove("annotations");
                m.remove("finalizers");
                if let Some(l) = m.get_mut("labels").and_then(Value::as_object_mut) {
                    l.remove("hami.io/vgpu-node");
                }
            }
            v["status"] = json!({
                "phase": "Pending",
                "conditions": [{ "type": "PodScheduled", "status": "False", "lastProbeTime": null,
                                 "lastTransitionTime": "2026-11-29T08:41:07Z", "reason": "Unschedulable",
                                 "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." }],
                "qosClass": "Burstable",
            });
        }
    }
    Ok(v)
}

/// The pod fixture renamed, in `namespace`, bound to `node` (or pending when `None`).
pub fn gpu_pod(namespace: &str, name: &str, node: Option<&str>) -> Result<Pod, ApiServerError> {
    serde_json::from_value(gpu_pod_json(namespace, name, node)?).map_err(|source| {
        ApiServerError::Json {
            kind: "Pod".into(),
            source,
        }
    })
}

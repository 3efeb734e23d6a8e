//! `hami-device-plugin plan`: the allocation plan of a pod, for operators. Reads a pod (YAML or
//! JSON, as `kubectl get pod -o yaml` prints it, with the scheduler's annotations), plans every
//! container with a pending NVIDIA entry exactly as `Allocate` would, and prints the delivery mode
//! and its source, the envs, the mounts and the limits-file text as JSON. `--write` also creates
//! the directories and publishes the files under the hook path, as `run` would.

use std::path::{Path, PathBuf};

use hami_shared::names;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::allocation::plan::device_list::settings::DeviceListArgs;
use crate::allocation::plan::device_list::{DeviceListSettings, NodeDevices};
use crate::allocation::plan::pod::annotation;
use crate::allocation::plan::{AllocationPlan, AllocationSettings, PlanError, plan_pod};
use crate::allocation::shell::executor::disk::{
    DiskError, execute_plan, probe_host, sweep_containers_dir,
};
use crate::allocation::shell::host_checks::{HostCheckError, device_list_settings};
use crate::gpu::inventory::{FileInventory, GpuInventory, InventoryError};
use crate::settings::{AllocationInputs, PluginSettings, PluginSettingsError};

/// What `plan` is asked (its flags, as the command line parsed them).
#[derive(Debug, Clone)]
pub struct PlanArgs {
    /// The pod, YAML or JSON (`kubectl get pod NAME -o yaml`).
    pub pod: PathBuf,
    /// The node the pod is bound to (selects the node's entry of the node config).
    /// Required (flag or `HAMI_NODE_NAME`).
    pub node: Option<String>,
    /// Global HAMi device config (`device-config.yaml`, `nvidia:` section).
    pub config: Option<PathBuf>,
    /// Per-node config (`config.json` with `nodeconfig: [...]`).
    pub node_config: Option<PathBuf>,
    /// HAMi-core's install directory (`<DIR>/vgpu/containers/...`).
    pub hook_path: PathBuf,
    /// YAML list of GPUs instead of NVML (read only when a device list setting needs the
    /// node's GPUs: DEVICE_ID_STRATEGY=index, PASS_DEVICE_SPECS=true).
    pub inventory: Option<PathBuf>,
    /// Also create the directories and publish the limits files, as `run` would.
    pub write: bool,
    /// How containers learn their devices, as for `run`.
    pub device_list: DeviceListArgs,
    /// The namespaces exempt from parts of the spec checks, as for `run`.
    pub guard: crate::allocation::plan::spec_guard::GuardArgs,
}

/// What `plan` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    /// `namespace/name`.
    pub pod: String,
    /// The node.
    pub node: String,
    /// The settings used.
    pub settings: AllocationSettings,
    /// One plan per container with a pending NVIDIA entry, in allocation order.
    pub containers: Vec<AllocationPlan>,
    /// Paths written with `--write`.
    pub written: Vec<PathBuf>,
    /// Leftover temporary files of an earlier, interrupted `--write` removed before writing.
    pub removed_temporaries: usize,
    /// Why nothing is planned, when `containers` is empty (also printed on stderr).
    pub notes: Vec<String>,
    /// What `run` would log about the device list settings (a setting with no effect, an IMEX
    /// channel skipped, what a CDI strategy relies on).
    pub device_list_notes: Vec<String>,
}

/// Why `plan` failed.
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    /// The pod file could not be read or parsed.
    #[error("{path}: {message}")]
    Pod {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The device config or the node config cannot be used, exactly as `run` would refuse it.
    #[error(transparent)]
    Settings(#[from] PluginSettingsError),
    /// The device list settings cannot be used on this host.
    #[error(transparent)]
    HostCheck(#[from] HostCheckError),
    /// The pod cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `--write` failed.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// No node: neither `--node` nor `HAMI_NODE_NAME` (nor the deprecated `NODE_NAME`).
    #[error("no node: pass --node NODE or set HAMI_NODE_NAME (the node the pod is bound to)")]
    MissingNode,
    /// The node's GPUs are needed (index names, device nodes) and cannot be listed.
    #[error("{needed_by} needs this node's GPUs: {source}")]
    NodeDevices {
        /// The setting.
        needed_by: &'static str,
        /// Why they cannot be listed.
        source: InventoryError,
    },
    /// Leftover temporaries of an earlier `--write` could not be swept.
    #[error(transparent)]
    Sweep(#[from] hami_publish::PublishError),
}

/// The largest pod file `plan` reads: well above the API server's 3 MiB request limit.
pub const MAX_POD_FILE_BYTES: u64 = 8 << 20;
/// The deepest nesting of `[` / `{` a pod file may have (a real Pod is under 20 levels deep).
pub const MAX_POD_FILE_DEPTH: usize = hami_shared::manifest::MAX_FLOW_DEPTH;

/// Reads a pod from YAML or JSON: a document with `kind: Pod`, at most
/// [`MAX_POD_FILE_BYTES`] and nested at most [`MAX_POD_FILE_DEPTH`] deep.
pub fn read_pod(path: &Path) -> Result<Pod, DryRunError> {
    let refuse = |message: String| DryRunError::Pod {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| refuse(e.to_string()))?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_POD_FILE_BYTES + 1),
        &mut text,
    )
    .map_err(|e| refuse(e.to_string()))?;
    if text.len() as u64 > MAX_POD_FILE_BYTES {
        return Err(refuse(format!(
            "larger than {MAX_POD_FILE_BYTES} bytes: not a pod (the API server refuses requests over 3 MiB)"
        )));
    }
    if text.trim().is_empty() {
        return Err(refuse(
            "the file is empty: expected a Pod (kubectl get pod NAME -o yaml)".to_owned(),
        ));
    }
    let depth = hami_shared::manifest::flow_depth(text.as_bytes());
    if depth > MAX_POD_FILE_DEPTH {
        return Err(refuse(format!(
            "nested {depth} levels deep (at most {MAX_POD_FILE_DEPTH}): not a pod"
        )));
    }
    let object: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| DryRunError::Pod {
            path: path.to_path_buf(),
            message: format!("not YAML or JSON: {e}"),
        })?;
    if object.get("kind").and_then(serde_json::Value::as_str) != Some("Pod") {
        return Err(refuse(
            "not a Pod: the document has no `kind: Pod` (kubectl get pod NAME -o yaml)".to_owned(),
        ));
    }
    // The typed pod straight from the user's text, so that an error names the user's line and
    // column. (`nvidia.com/gpu: 1`, a YAML integer, is a valid quantity: kubectl and the API
    // server accept it, and so does k8s-openapi's `Quantity`.)
    serde_yaml_ng::from_str(&text).map_err(|e| DryRunError::Pod {
        path: path.to_path_buf(),
        message: format!("not a Pod: {e}"),
    })
}

/// Runs `plan`, with the `HAMI_NVIDIA__*` variables of `env` over the device config.
pub fn run_plan(
    args: &PlanArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<PlanReport, DryRunError> {
    let node = args
        .node
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(DryRunError::MissingNode)?;
    let pod = read_pod(&args.pod)?;
    // The one way `run` builds its settings too: the same loader, checks and constructor.
    let plugin = PluginSettings::load(
        args.config.as_deref(),
        args.node_config.as_deref(),
        Some(&node),
        env,
    )?;
    let (device_list, device_list_notes) = device_list_settings(&args.device_list)?;
    let node_devices = if device_list.needs_node_devices() {
        node_devices(args, &device_list)?
    } else {
        NodeDevices::default()
    };
    let settings = plugin.allocation_settings(AllocationInputs {
        hook_path: args.hook_path.clone(),
        device_list,
        node_devices,
        guard: args.guard.clone(),
    })?;
    let entry_note = check_entry(args, &pod, &settings)?;
    // HAMi-core as `Allocate` finds it (ours `libvgpu.so`, else HAMi's `libvgpu.so.<version>`).
    let hook = crate::allocation::shell::hook::HookFolder::read(&settings.vgpu_dir());
    // As `Allocate` answers on this machine now: the host's optional device nodes and license.
    let host = probe_host(&settings.license_path());
    let vgpu_dir = settings.vgpu_dir();
    let containers: Vec<AllocationPlan> = plan_pod(&pod, &settings, &hook.libvgpu_host())?
        .into_iter()
        .map(|p| p.with_host(&host, &vgpu_dir))
        .collect();
    let mut notes = if containers.is_empty() {
        why_nothing_is_planned(&pod, &node)
    } else {
        // What `Allocate` would refuse on this machine's hook folder.
        containers
            .iter()
            .filter_map(|p| {
                hook.check_plan(p)
                    .err()
                    .map(|e| format!("Allocate would refuse container {}: {e}", p.container))
            })
            .collect()
    };
    if !containers.is_empty() {
        notes.extend(entry_note);
    }
    let mut written = Vec::new();
    let mut removed_temporaries = 0;
    if args.write {
        // As `run` does at start: an interrupted `plan --write` may have left temporaries.
        removed_temporaries = sweep_containers_dir(&settings)?;
        for plan in &containers {
            let w = execute_plan(plan)?;
            written.extend(w.dir);
            written.extend(w.file);
        }
    }
    Ok(PlanReport {
        pod: crate::allocation::plan::pod_key(&pod),
        node,
        settings,
        containers,
        written,
        removed_temporaries,
        notes,
        device_list_notes,
    })
}

/// `Allocate`'s check of the pod's entries against the node's GPUs, with `--inventory` (the
/// split count and scaling from the device config); without it, a note that it was not made.
fn check_entry(
    args: &PlanArgs,
    pod: &Pod,
    settings: &AllocationSettings,
) -> Result<Option<String>, DryRunError> {
    use crate::allocation::plan::codec::PodDevices;
    use crate::allocation::plan::entry_check::{NodeCapacity, check_pod};
    let Some(value) = annotation(pod, names::ANNOTATION_VGPU_DEVICES_TO_ALLOCATE) else {
        return Ok(None);
    };
    let Some(path) = &args.inventory else {
        return Ok(Some(format!(
            "{} not checked against the node's GPUs (pass --inventory to check it as Allocate does)",
            names::ANNOTATION_VGPU_DEVICES_TO_ALLOCATE
        )));
    };
    let key = crate::allocation::plan::pod_key(pod);
    let devices = PodDevices::decode(value).map_err(|source| PlanError::Codec {
        pod: key.clone(),
        source,
    })?;
    let gpus = FileInventory::new(path)
        .discover()
        .map_err(|source| DryRunError::NodeDevices {
            needed_by: "the entry check",
            source,
        })?;
    let capacity = NodeCapacity::from_gpus(
        &gpus,
        settings.split_count,
        settings.memory_scaling,
        settings.core_scaling,
    );
    check_pod(&devices, &capacity).map_err(|source| PlanError::Entry { pod: key, source })?;
    Ok(None)
}

/// The node's GPUs from `--inventory`, else NVML, as `run` reads them.
fn node_devices(
    args: &PlanArgs,
    device_list: &DeviceListSettings,
) -> Result<NodeDevices, DryRunError> {
    let needed_by = if device_list.id_strategy
        == crate::allocation::plan::device_list::DeviceIdStrategy::Index
    {
        "DEVICE_ID_STRATEGY=index"
    } else {
        "PASS_DEVICE_SPECS=true"
    };
    let wrap = |source| DryRunError::NodeDevices { needed_by, source };
    let gpus = match &args.inventory {
        Some(path) => FileInventory::new(path).discover().map_err(wrap)?,
        None => crate::gpu::nvml::NvmlInventory::init()
            .and_then(|nvml| nvml.discover())
            .map_err(wrap)?,
    };
    Ok(NodeDevices::from_gpus(&gpus))
}

/// Why a pod has nothing for `Allocate` to do, in the words an operator needs.
fn why_nothing_is_planned(pod: &Pod, node: &str) -> Vec<String> {
    use hami_shared::names::{ANNOTATION_VGPU_DEVICES_TO_ALLOCATE, ANNOTATION_VGPU_NODE};
    let annotations = pod.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    let mut notes = Vec::new();
    match get(ANNOTATION_VGPU_DEVICES_TO_ALLOCATE) {
        None => notes.push(format!(
            "the pod has no {ANNOTATION_VGPU_DEVICES_TO_ALLOCATE} annotation: the HAMi scheduler has not assigned it devices (is its schedulerName hami-scheduler, and does it request a HAMi resource?)"
        )),
        Some(v) => notes.push(format!(
            "no {ANNOTATION_VGPU_DEVICES_TO_ALLOCATE} entry names an NVIDIA device any more ({v:?}): every container was already allocated (Allocate erases each entry it serves)"
        )),
    }
    match get(ANNOTATION_VGPU_NODE) {
        Some(n) if n != node => notes.push(format!(
            "the scheduler assigned the pod to node {n:?}, not {node:?} (--node)"
        )),
        None => notes.push(format!("the pod has no {ANNOTATION_VGPU_NODE} annotation")),
        Some(_) => {}
    }
    notes
}

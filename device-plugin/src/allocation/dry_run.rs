//! `hami-device-plugin plan`: the allocation plan of a pod, for operators. Reads a pod (YAML or
//! JSON, as `kubectl get pod -o yaml` prints it, with the scheduler's annotations), plans every
//! container with a pending NVIDIA entry exactly as `Allocate` would, and prints the delivery mode
//! and its source, the envs, the mounts and the limits-file text as JSON. `--write` also creates
//! the directories and publishes the files under the hook path, as `run` would.

use std::path::{Path, PathBuf};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::config::{ConfigError, load_allocation_settings};
use super::executor::disk::{DiskError, execute_plan};
use super::plan::{AllocationPlan, AllocationSettings, PlanError, plan_pod};

/// `plan` flags.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The pod, YAML or JSON (`kubectl get pod NAME -o yaml`).
    #[arg(long, value_name = "FILE")]
    pub pod: PathBuf,
    /// The node the pod is bound to (selects the node's entry of the node config).
    #[arg(long, env = "NODE_NAME", value_name = "NODE")]
    pub node: String,
    /// Global HAMi device config (`device-config.yaml`, `nvidia:` section).
    #[arg(long = "config", env = "HAMI_DEVICE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Per-node config (`config.json` with `nodeconfig: [...]`).
    #[arg(long = "node-config", env = "HAMI_NODE_CONFIG", value_name = "FILE")]
    pub node_config: Option<PathBuf>,
    /// HAMi-core's install directory (`<DIR>/vgpu/containers/...`).
    #[arg(long = "hook-path", env = "HOOK_PATH", default_value = hami_shared::names::DEFAULT_HOOK_PATH, value_name = "DIR")]
    pub hook_path: PathBuf,
    /// Also create the directories and publish the limits files, as `run` would.
    #[arg(long)]
    pub write: bool,
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
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The pod cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `--write` failed.
    #[error(transparent)]
    Disk(#[from] DiskError),
}

/// Reads a pod from YAML or JSON.
pub fn read_pod(path: &Path) -> Result<Pod, DryRunError> {
    let text = std::fs::read_to_string(path).map_err(|e| DryRunError::Pod {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut object: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| DryRunError::Pod {
            path: path.to_path_buf(),
            message: format!("not YAML or JSON: {e}"),
        })?;
    // `nvidia.com/gpu: 1` is an integer in YAML; kubectl and the API server accept it.
    hami_shared::manifest::quantities_as_strings(&mut object);
    serde_json::from_value(object).map_err(|e| DryRunError::Pod {
        path: path.to_path_buf(),
        message: format!("not a Pod: {e}"),
    })
}

/// Runs `plan`.
pub fn run_plan(args: &PlanArgs) -> Result<PlanReport, DryRunError> {
    let pod = read_pod(&args.pod)?;
    let settings = load_allocation_settings(
        args.config.as_deref(),
        args.node_config.as_deref(),
        &args.node,
        &args.hook_path,
    )?;
    let version = env!("CARGO_PKG_VERSION");
    let versioned = settings.libvgpu_host_path(version, true);
    let libvgpu = settings.libvgpu_host_path(version, versioned.is_file());
    let containers = plan_pod(&pod, &settings, &libvgpu)?;
    let mut written = Vec::new();
    if args.write {
        for plan in &containers {
            let w = execute_plan(plan)?;
            written.extend(w.dir);
            written.extend(w.file);
        }
    }
    Ok(PlanReport {
        pod: super::plan::pod_key(&pod),
        node: args.node.clone(),
        settings,
        containers,
        written,
    })
}

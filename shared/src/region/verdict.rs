//! Is the cap in force? The verdict per container and GPU, from the region as read, the limits
//! file's entries and a PID liveness oracle: a pure function the `hami-limits region` command,
//! the device plugin's exporter and the hook installer's all call.
//!
//! What HAMi-core stamps from the limits file (the preload library makes the file's entries the
//! environment HAMi-core reads; `try_create_shrreg` stamps them only when it creates the region):
//!
//! | region field | from the file | as HAMi-core reads it |
//! |---|---|---|
//! | `limit[i]` | `CUDA_DEVICE_MEMORY_LIMIT_<i>`, else `CUDA_DEVICE_MEMORY_LIMIT` | `get_limit_from_env`: `strtoul` base 0 × the last character's `k/m/g` (1024ⁿ); `3000m` = 3145728000 bytes; 0, invalid or overflowing = 0 (no limit) |
//! | `limit[i]`, KAI `gpu-fraction` | `HAMI_GPU_FRACTION` × the node's GPU MiB (the preload library replaces `CUDA_DEVICE_MEMORY_LIMIT` by `floor(fraction × MiB)m` of the smallest GPU the container sees) | needs that GPU's MiB: [`FileLimits::from_entries`]' `gpu_mib`; without it the admission-time value is expected |
//! | `sm_limit[i]` | `CUDA_DEVICE_SM_LIMIT_<i>`, else `CUDA_DEVICE_SM_LIMIT`, else 100 | same parser; 0 or unset stamps 100 |
//! | `priority` | `CUDA_TASK_PRIORITY` | `atoi`, 1 when unset |
//! | `utilization_switch` | not stamped from the file: 1 at creation, then HAMi's monitor | `GPU_CORE_UTILIZATION_POLICY` acts per process: `force` = on, `disable` = off, else the region's switch |

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::error::RegionError;
use super::layout::DEVICE_COUNT;
use super::parse::{ProcSlot, Region};
use crate::hami_core::{atoi, read_limit};
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_CUDA_DEVICE_SM_LIMIT, ENV_CUDA_TASK_PRIORITY,
    ENV_GPU_CORE_UTILIZATION_POLICY, ENV_HAMI_GPU_FRACTION, ENV_HAMI_NODE_GPUS,
};

/// The verdict for a container's GPU (and, worst of them, for the container).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The stamped limits are the file's.
    Capped,
    /// No process has started CUDA: no region file, an empty one, or one being initialised.
    NoRegion,
    /// Neither the file nor the region holds a memory limit: nothing to enforce.
    NoLimit,
    /// Capped, but slots of processes that no longer exist still count against the cap.
    Stale,
    /// The region cannot be read (the reason says why).
    Unreadable,
    /// The stamped limits are not the file's: a first writer with other values.
    Mismatch,
    /// Stamped 0 (no limit) while the file says a limit: HAMi#2125.
    Uncapped,
}

impl Verdict {
    /// Every verdict, for exporters that publish one gauge per label.
    pub const ALL: [Verdict; 7] = [
        Verdict::Capped,
        Verdict::Uncapped,
        Verdict::Mismatch,
        Verdict::NoRegion,
        Verdict::Stale,
        Verdict::Unreadable,
        Verdict::NoLimit,
    ];

    /// The label: `capped`, `uncapped`, `mismatch`, `no-region`, `stale`, `unreadable`, `no-limit`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Capped => "capped",
            Verdict::Uncapped => "uncapped",
            Verdict::Mismatch => "mismatch",
            Verdict::NoRegion => "no-region",
            Verdict::Stale => "stale",
            Verdict::Unreadable => "unreadable",
            Verdict::NoLimit => "no-limit",
        }
    }

    /// True for a verdict an operator must act on.
    pub fn is_problem(self) -> bool {
        matches!(
            self,
            Verdict::Uncapped | Verdict::Mismatch | Verdict::Stale | Verdict::Unreadable
        )
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GPU_CORE_UTILIZATION_POLICY` as HAMi-core reads it (`set_env_utilization_switch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CorePolicyReading {
    /// `force`/`FORCE`: the limiter always on.
    Force,
    /// `disable`/`DISABLE`: the limiter always off.
    Disable,
    /// Anything else or unset: the region's `utilization_switch` decides.
    Default,
}

/// Where the expected memory limit comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "basis", rename_all = "kebab-case")]
pub enum MemoryBasis {
    /// The file's memory keys as written.
    File,
    /// `HAMI_GPU_FRACTION` × the node GPU's MiB, as the preload library computes it.
    PerNodeFraction {
        /// The fraction's text.
        fraction: String,
        /// The GPU's MiB it was applied to.
        gpu_mib: u64,
    },
    /// A `gpu-fraction` file, but the GPU's MiB was not given (or the cap would be below 1 MiB):
    /// the admission-time value is expected.
    AdmissionTime {
        /// The fraction's text.
        fraction: String,
    },
}

/// What HAMi-core would stamp from a limits file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileLimits {
    /// `limit[i]` HAMi-core stamps from the file, bytes; 0 = no limit.
    pub memory: [u64; DEVICE_COUNT],
    /// `CUDA_DEVICE_MEMORY_LIMIT` reads as a limit (applies to every device without its own).
    pub global_memory: bool,
    /// Devices with their own `CUDA_DEVICE_MEMORY_LIMIT_<i>` limit.
    pub indexed: BTreeSet<usize>,
    /// How the memory limit was derived.
    pub memory_basis: MemoryBasis,
    /// `sm_limit[i]` HAMi-core stamps from the file.
    pub sm: [u64; DEVICE_COUNT],
    /// `priority` HAMi-core stamps from the file.
    pub priority: i32,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    pub core_policy: CorePolicyReading,
}

impl FileLimits {
    /// What HAMi-core stamps from `entries` (a parsed limits file's entries, or a container's
    /// environment). `gpu_mib`: the MiB of the smallest GPU the container sees (the node GPU
    /// file's entry for it), needed to expect a KAI `gpu-fraction` container's per-node cap.
    pub fn from_entries(entries: &BTreeMap<String, String>, gpu_mib: Option<u64>) -> Self {
        let get = |k: &str| entries.get(k).map(String::as_str);
        let stamp = |k: &str| get(k).map_or(0, |v| read_limit(v).result);
        let mut global = stamp(ENV_CUDA_DEVICE_MEMORY_LIMIT);
        let mut memory_basis = MemoryBasis::File;
        if let Some(fraction) = get(ENV_HAMI_GPU_FRACTION)
            && let Some(digits) = hami_preload_core::fraction::parse_canonical(fraction.as_bytes())
            && global != 0
            && get(ENV_HAMI_NODE_GPUS)
                .is_some_and(|p| hami_preload_core::decide::is_node_gpus_path(p.as_bytes()))
        {
            let mib = gpu_mib.map_or(0, |m| hami_preload_core::fraction::of_mib(digits, m));
            memory_basis = match gpu_mib {
                Some(gpu_mib) if mib > 0 => {
                    global = mib.saturating_mul(1 << 20);
                    MemoryBasis::PerNodeFraction {
                        fraction: fraction.to_owned(),
                        gpu_mib,
                    }
                }
                _ => MemoryBasis::AdmissionTime {
                    fraction: fraction.to_owned(),
                },
            };
        }
        let sm_global = match stamp(ENV_CUDA_DEVICE_SM_LIMIT) {
            0 => 100,
            v => v,
        };
        let mut memory = [0u64; DEVICE_COUNT];
        let mut sm = [0u64; DEVICE_COUNT];
        let mut indexed = BTreeSet::new();
        for i in 0..DEVICE_COUNT {
            let own = stamp(&format!("{ENV_CUDA_DEVICE_MEMORY_LIMIT}_{i}"));
            if own != 0 {
                indexed.insert(i);
            }
            memory[i] = if own != 0 { own } else { global };
            sm[i] = match stamp(&format!("{ENV_CUDA_DEVICE_SM_LIMIT}_{i}")) {
                0 => sm_global,
                v => v,
            };
        }
        let core_policy = match get(ENV_GPU_CORE_UTILIZATION_POLICY) {
            Some("force" | "FORCE") => CorePolicyReading::Force,
            Some("disable" | "DISABLE") => CorePolicyReading::Disable,
            _ => CorePolicyReading::Default,
        };
        FileLimits {
            memory,
            global_memory: global != 0,
            indexed,
            memory_basis,
            sm,
            priority: get(ENV_CUDA_TASK_PRIORITY).map_or(1, atoi),
            core_policy,
        }
    }
}

/// Whether a slot's process still exists, as the caller can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Liveness {
    /// It exists.
    Alive,
    /// It does not.
    Dead,
    /// Cannot tell (e.g. `hostpid` still 0 and no view of the container's PID namespace).
    Unknown,
}

/// One slot with its liveness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotReport {
    /// Position in `procs[]`.
    pub slot: usize,
    /// `pid`.
    pub pid: i32,
    /// `hostpid`.
    pub hostpid: i32,
    /// `status`.
    pub status: i32,
    /// What the oracle said.
    pub liveness: Liveness,
}

/// One GPU of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuVerdict {
    /// The device index (HAMi-core's, as the container's CUDA numbers them).
    pub index: usize,
    /// The verdict.
    pub verdict: Verdict,
    /// Stamped `limit[i]`, bytes (0 = none).
    pub stamped_limit: u64,
    /// What the file asks HAMi-core to stamp, bytes (0 = none); `None` without a file.
    pub file_limit: Option<u64>,
    /// Stamped `sm_limit[i]`.
    pub stamped_sm: u64,
    /// The file's SM limit as HAMi-core would stamp it; `None` without a file.
    pub file_sm: Option<u64>,
    /// `Σ used[i].total` over the slots, bytes.
    pub used: u64,
    /// Slots using this GPU (`used[i].total` > 0).
    pub processes: usize,
    /// The fields whose stamped value is not the file's (`limit`, `sm_limit`).
    pub mismatched: Vec<&'static str>,
}

/// The utilization switch as stamped, the file's policy, and what a process that read the file
/// does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UtilizationReport {
    /// The region's `utilization_switch`.
    pub stamped_switch: i32,
    /// The file's `GPU_CORE_UTILIZATION_POLICY`; `None` without a file.
    pub file_policy: Option<CorePolicyReading>,
    /// Whether HAMi-core's limiter runs for a process with the file's policy
    /// (`get_utilization_switch`).
    pub limiter_on: bool,
}

/// `priority` as stamped and as the file would stamp it (HAMi's monitor: lower is higher).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PriorityReport {
    /// The region's `priority`.
    pub stamped: i32,
    /// `atoi(CUDA_TASK_PRIORITY)` of the file (1 when unset); `None` without a file.
    pub file: Option<i32>,
}

/// The verdict for one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerVerdict {
    /// The worst of the GPUs' verdicts, or `no-region`/`unreadable`.
    pub verdict: Verdict,
    /// Why, for `no-region` and `unreadable`; for the others the worst GPU's reason.
    pub reason: String,
    /// Per GPU (empty for `no-region` and `unreadable`).
    pub gpus: Vec<GpuVerdict>,
    /// Every slot in `procs[0..proc_num]` with its liveness.
    pub slots: Vec<SlotReport>,
    /// The utilization switch.
    pub utilization: Option<UtilizationReport>,
    /// Stamped `priority` and the file's.
    pub priority: Option<PriorityReport>,
    /// How the file's memory limit was derived.
    pub memory_basis: Option<MemoryBasis>,
}

fn gib(bytes: u64) -> String {
    if bytes == 0 {
        "0 (no limit)".to_owned()
    } else if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// The GPUs to judge: those the file names, every device the container's processes saw when the
/// file has a global limit or there is no file (at least device 0), and any with usage.
fn judged_devices(region: &Region, file: Option<&FileLimits>) -> BTreeSet<usize> {
    let seen = usize::try_from(region.device_num)
        .unwrap_or(DEVICE_COUNT)
        .clamp(1, DEVICE_COUNT);
    let mut devices: BTreeSet<usize> = BTreeSet::new();
    match file {
        Some(f) => {
            devices.extend(f.indexed.iter().copied());
            if f.global_memory || f.indexed.is_empty() {
                devices.extend(0..seen);
            }
        }
        None => devices.extend(0..seen),
    }
    devices.extend((0..DEVICE_COUNT).filter(|d| region.used(*d) > 0));
    devices
}

/// Judge one container: its region as read (`Err` for a file that could not be read or parsed),
/// its limits (`None` when it has no limits file: the stamped limits are reported, not compared),
/// and whether each slot's process exists.
pub fn judge(
    region: Result<&Region, &RegionError>,
    file: Option<&FileLimits>,
    liveness: impl Fn(&ProcSlot) -> Liveness,
) -> ContainerVerdict {
    let region = match region {
        Ok(r) => r,
        Err(e) => {
            return ContainerVerdict {
                verdict: if e.is_no_region() {
                    Verdict::NoRegion
                } else {
                    Verdict::Unreadable
                },
                reason: e.to_string(),
                gpus: Vec::new(),
                slots: Vec::new(),
                utilization: None,
                priority: None,
                memory_basis: file.map(|f| f.memory_basis.clone()),
            };
        }
    };
    let slots: Vec<SlotReport> = region
        .procs
        .iter()
        .map(|p| SlotReport {
            slot: p.slot,
            pid: p.pid,
            hostpid: p.hostpid,
            status: p.status,
            liveness: liveness(p),
        })
        .collect();
    let dead: Vec<i32> = slots
        .iter()
        .filter(|s| s.liveness == Liveness::Dead)
        .map(|s| s.pid)
        .collect();
    let mut worst = (Verdict::Capped, String::new());
    let mut gpus = Vec::new();
    for index in judged_devices(region, file) {
        let stamped_limit = region.limit[index];
        let stamped_sm = region.sm_limit[index];
        let file_limit = file.map(|f| f.memory[index]);
        let file_sm = file.map(|f| f.sm[index]);
        let mut mismatched = Vec::new();
        let (mut verdict, mut reason) = match file_limit {
            None if stamped_limit == 0 => (
                Verdict::NoLimit,
                format!("GPU {index}: stamped no limit; no limits file to compare with"),
            ),
            None => (
                Verdict::Capped,
                format!(
                    "GPU {index}: stamped {}; no limits file to compare with",
                    gib(stamped_limit)
                ),
            ),
            Some(0) if stamped_limit == 0 => (
                Verdict::NoLimit,
                format!("GPU {index}: neither the file nor the region holds a memory limit"),
            ),
            Some(want) if stamped_limit == 0 => (
                Verdict::Uncapped,
                format!(
                    "GPU {index}: stamped 0 (no limit) while the file says {}: a process without the limits created the region",
                    gib(want)
                ),
            ),
            Some(want) if want != stamped_limit => {
                mismatched.push("limit");
                (
                    Verdict::Mismatch,
                    format!(
                        "GPU {index}: stamped {} while the file says {}",
                        gib(stamped_limit),
                        gib(want)
                    ),
                )
            }
            Some(want) => (
                Verdict::Capped,
                format!("GPU {index}: stamped {}", gib(want)),
            ),
        };
        if let Some(want_sm) = file_sm
            && want_sm != stamped_sm
        {
            mismatched.push("sm_limit");
            if matches!(verdict, Verdict::Capped | Verdict::NoLimit) {
                verdict = Verdict::Mismatch;
                reason = format!(
                    "GPU {index}: SM limit stamped {stamped_sm} % while the file says {want_sm} %"
                );
            }
        }
        if verdict == Verdict::Capped && !dead.is_empty() {
            verdict = Verdict::Stale;
            reason = format!(
                "GPU {index}: {} slot(s) of processes that no longer exist (pid {:?}) still count against the cap",
                dead.len(),
                dead
            );
        }
        if verdict > worst.0 || gpus.is_empty() {
            worst = (verdict, reason);
        }
        gpus.push(GpuVerdict {
            index,
            verdict,
            stamped_limit,
            file_limit,
            stamped_sm,
            file_sm,
            used: region.used(index),
            processes: region
                .procs
                .iter()
                .filter(|p| p.used[index].total > 0)
                .count(),
            mismatched,
        });
    }
    let file_policy = file.map(|f| f.core_policy);
    let limiter_on = match file_policy {
        Some(CorePolicyReading::Force) => true,
        Some(CorePolicyReading::Disable) => false,
        _ => region.utilization_switch != 0,
    };
    ContainerVerdict {
        verdict: worst.0,
        reason: worst.1,
        gpus,
        slots,
        utilization: Some(UtilizationReport {
            stamped_switch: region.utilization_switch,
            file_policy,
            limiter_on,
        }),
        priority: Some(PriorityReport {
            stamped: region.priority,
            file: file.map(|f| f.priority),
        }),
        memory_basis: file.map(|f| f.memory_basis.clone()),
    }
}

//! `hami.io/node-nvidia-score`: the GPU-pair communication scores HAMi's topology-aware scheduler
//! policy reads, published beside `hami.io/node-nvidia-register` when `ENABLE_TOPOLOGY_SCORE` is
//! `true` (HAMi's chart sets it when `scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy` is
//! `topology-aware`).
//!
//! The links between GPUs come from NVML ([`crate::gpu::nvml::NvmlInventory`]) or from the inventory
//! file's optional `links` ([`crate::gpu::inventory`]); the score is a pure function of them,
//! [`gpu_scores`], with the rules of HAMi v2.10 `pkg/device/nvidia/calculate_score.go`
//! (`calculateGPUScore`, `calculateGPUPairScore`) and the annotation bytes of Go's `json.Marshal`
//! of its `ListDeviceScore`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The node annotation (HAMi v2.10 `pkg/device/nvidia/device.go` `RegisterGPUPairScore`).
pub const ANNOTATION_NODE_NVIDIA_SCORE: &str = "hami.io/node-nvidia-score";

/// The environment variable HAMi's plugin reads (`register.go` `RegisterInAnnotation`), and ours.
pub const ENV_ENABLE_TOPOLOGY_SCORE: &str = "ENABLE_TOPOLOGY_SCORE";

/// Most NVLinks HAMi counts between two GPUs (`links.go` `nvlinkCountToType`: more is "unknown",
/// no link); also NVML's `NVML_NVLINK_MAX_LINKS`.
pub const MAX_NVLINKS: u32 = 18;

/// The PCIe path between two GPUs: NVML's `nvmlDeviceGetTopologyCommonAncestor` level, named as
/// HAMi's `P2PLinkType` (`links.go` `GetP2PLink`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PcieLink {
    /// `NVML_TOPOLOGY_SYSTEM`: across CPU sockets (`P2PLinkCrossCPU`).
    CrossCpu,
    /// `NVML_TOPOLOGY_NODE`: one NUMA node, several host bridges (`P2PLinkSameCPU`).
    SameCpu,
    /// `NVML_TOPOLOGY_HOSTBRIDGE`: one host bridge (`P2PLinkHostBridge`).
    HostBridge,
    /// `NVML_TOPOLOGY_MULTIPLE`: several PCIe switches, no host bridge (`P2PLinkMultiSwitch`).
    MultiSwitch,
    /// `NVML_TOPOLOGY_SINGLE`: one PCIe switch (`P2PLinkSingleSwitch`).
    SingleSwitch,
    /// `NVML_TOPOLOGY_INTERNAL`: one board, e.g. a Tesla K80 (`P2PLinkSameBoard`).
    SameBoard,
}

impl PcieLink {
    /// The spellings of the inventory file.
    pub const ACCEPTED: &'static str =
        "crossCpu, sameCpu, hostBridge, multiSwitch, singleSwitch, sameBoard";

    /// HAMi's score of the link (`calculateGPUPairScore`).
    pub fn score(self) -> i64 {
        match self {
            Self::CrossCpu => 10,
            Self::SameCpu => 20,
            Self::HostBridge => 30,
            Self::MultiSwitch => 40,
            Self::SingleSwitch => 50,
            Self::SameBoard => 60,
        }
    }
}

/// What one GPU's NVML reports about another (one direction: NVML is asked per ordered pair, and
/// HAMi scores a pair 0 when the two directions disagree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerLink {
    /// The other GPU's UUID.
    pub peer: String,
    /// The PCIe path, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<PcieLink>,
    /// Active NVLinks to it: direct links, or through NVSwitches the smaller of the two GPUs'
    /// switch-link counts (HAMi's `GetNVLink`); 0 for none.
    #[serde(default)]
    pub nvlinks: u32,
}

impl PeerLink {
    /// HAMi's `P2PLink` entries for this direction: the PCIe one when known, the NVLink one when
    /// the count is in 1..=18 (each yields one entry, `links.go` `build`); with their score sum.
    fn entries(&self) -> (usize, i64) {
        let mut count = 0;
        let mut score = 0;
        if let Some(pcie) = self.pcie {
            count += 1;
            score += pcie.score();
        }
        if (1..=MAX_NVLINKS).contains(&self.nvlinks) {
            count += 1;
            score += 100 * i64::from(self.nvlinks);
        }
        (count, score)
    }
}

/// One GPU and what it sees of the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuLinks {
    /// The GPU's UUID.
    pub uuid: String,
    /// Its links to other GPUs (at most one per peer).
    pub links: Vec<PeerLink>,
}

impl GpuLinks {
    fn to(&self, peer: &str) -> Option<&PeerLink> {
        self.links.iter().find(|l| l.peer == peer)
    }
}

/// One entry of the annotation: HAMi's `DeviceScore` (`{"uuid":…,"score":{…}}`); Go marshals
/// the map with its keys sorted, as a `BTreeMap` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceScore {
    /// The GPU.
    pub uuid: String,
    /// The score of every other advertised GPU, by UUID.
    pub score: BTreeMap<String, i64>,
}

/// The scores, and the pairs HAMi would call asymmetric (scored 0; HAMi also raises a node
/// warning Event `AsymmetricGPUP2PLink`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scores {
    /// One entry per advertised GPU, in the order given.
    pub devices: Vec<DeviceScore>,
    /// `(a, b)` with `a` before `b` in that order: the two directions disagree on the number of
    /// links.
    pub asymmetric: Vec<(String, String)>,
}

impl Scores {
    /// The annotation value, byte for byte as Go's `json.Marshal` writes HAMi's
    /// `ListDeviceScore` (`[]` for no GPU).
    pub fn annotation(&self) -> String {
        // Strings and integers in maps and lists: serialising cannot fail.
        serde_json::to_string(&self.devices).unwrap_or_else(|_| "[]".to_owned())
    }
}

/// Why no score could be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// An advertised GPU has no link description (HAMi: `no device with uuid`).
    #[error(
        "GPU {uuid} is advertised but the topology source does not list it (the scores cover every advertised GPU)"
    )]
    MissingGpu {
        /// The GPU.
        uuid: String,
    },
}

/// HAMi's `calculateGPUScore` over the advertised GPUs `advertised` (UUIDs, in the order the
/// annotation lists them) with the links `links` (every GPU NVML sees, or the inventory file's).
/// A pair scores the sum of its link entries from the first GPU's side (PCIe 10..60, NVLink 100
/// each) when both sides report the same number of entries, else 0.
pub fn gpu_scores(advertised: &[&str], links: &[GpuLinks]) -> Result<Scores, TopologyError> {
    // HAMi's `DeviceList.Filter`: every advertised GPU must be known.
    let required: Vec<&GpuLinks> = advertised
        .iter()
        .map(|uuid| {
            links
                .iter()
                .find(|g| g.uuid == *uuid)
                .ok_or_else(|| TopologyError::MissingGpu {
                    uuid: (*uuid).to_owned(),
                })
        })
        .collect::<Result<_, _>>()?;
    let mut out = Scores::default();
    for (i, a) in required.iter().enumerate() {
        let mut score = BTreeMap::new();
        for (j, b) in required.iter().enumerate() {
            if i == j {
                continue;
            }
            let (from_a, value) = a.to(&b.uuid).map_or((0, 0), PeerLink::entries);
            let (from_b, _) = b.to(&a.uuid).map_or((0, 0), PeerLink::entries);
            let pair = if from_a == from_b {
                value
            } else {
                if i < j {
                    out.asymmetric.push((a.uuid.clone(), b.uuid.clone()));
                }
                0
            };
            score.insert(b.uuid.clone(), pair);
        }
        out.devices.push(DeviceScore {
            uuid: a.uuid.clone(),
            score,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(peer: &str, pcie: Option<PcieLink>, nvlinks: u32) -> PeerLink {
        PeerLink {
            peer: peer.to_owned(),
            pcie,
            nvlinks,
        }
    }

    fn gpu(uuid: &str, links: Vec<PeerLink>) -> GpuLinks {
        GpuLinks {
            uuid: uuid.to_owned(),
            links,
        }
    }

    #[test]
    fn hamis_scores_and_json_bytes() {
        // Two GPUs on one PCIe switch with 4 NVLinks, a third across the CPU sockets.
        let links = [
            gpu(
                "GPU-a",
                vec![
                    link("GPU-b", Some(PcieLink::SingleSwitch), 4),
                    link("GPU-c", Some(PcieLink::CrossCpu), 0),
                ],
            ),
            gpu(
                "GPU-b",
                vec![
                    link("GPU-a", Some(PcieLink::SingleSwitch), 4),
                    link("GPU-c", Some(PcieLink::CrossCpu), 0),
                ],
            ),
            gpu(
                "GPU-c",
                vec![
                    link("GPU-a", Some(PcieLink::CrossCpu), 0),
                    link("GPU-b", Some(PcieLink::CrossCpu), 0),
                ],
            ),
        ];
        let scores = gpu_scores(&["GPU-a", "GPU-b", "GPU-c"], &links).unwrap();
        assert!(scores.asymmetric.is_empty());
        assert_eq!(
            scores.annotation(),
            r#"[{"uuid":"GPU-a","score":{"GPU-b":450,"GPU-c":10}},{"uuid":"GPU-b","score":{"GPU-a":450,"GPU-c":10}},{"uuid":"GPU-c","score":{"GPU-a":10,"GPU-b":10}}]"#
        );
        // The order of the annotation is the advertised order; keys stay sorted.
        let reversed = gpu_scores(&["GPU-c", "GPU-a"], &links).unwrap();
        assert_eq!(
            reversed.annotation(),
            r#"[{"uuid":"GPU-c","score":{"GPU-a":10}},{"uuid":"GPU-a","score":{"GPU-c":10}}]"#
        );
    }

    #[test]
    fn every_pcie_level_and_nvlink_count_as_hami_scores_them() {
        let cases = [
            (PcieLink::CrossCpu, 10),
            (PcieLink::SameCpu, 20),
            (PcieLink::HostBridge, 30),
            (PcieLink::MultiSwitch, 40),
            (PcieLink::SingleSwitch, 50),
            (PcieLink::SameBoard, 60),
        ];
        for (pcie, want) in cases {
            assert_eq!(link("x", Some(pcie), 0).entries(), (1, want), "{pcie:?}");
        }
        // 1..=18 NVLinks count 100 each; 0 and more than 18 are no NVLink entry at all.
        assert_eq!(link("x", None, 1).entries(), (1, 100));
        assert_eq!(link("x", None, 18).entries(), (1, 1800));
        assert_eq!(link("x", None, 19).entries(), (0, 0));
        assert_eq!(
            link("x", Some(PcieLink::HostBridge), 12).entries(),
            (2, 1230)
        );
    }

    #[test]
    fn asymmetric_pairs_score_zero_both_ways() {
        // a sees 2 NVLinks to b, b sees none to a: HAMi scores the pair 0 and reports it.
        let links = [
            gpu("GPU-a", vec![link("GPU-b", Some(PcieLink::SameCpu), 2)]),
            gpu("GPU-b", vec![link("GPU-a", Some(PcieLink::SameCpu), 0)]),
        ];
        let scores = gpu_scores(&["GPU-a", "GPU-b"], &links).unwrap();
        assert_eq!(
            scores.annotation(),
            r#"[{"uuid":"GPU-a","score":{"GPU-b":0}},{"uuid":"GPU-b","score":{"GPU-a":0}}]"#
        );
        assert_eq!(scores.asymmetric, [("GPU-a".into(), "GPU-b".into())]);
    }

    #[test]
    fn undescribed_pairs_unadvertised_peers_and_edges() {
        // No description either way: no entries on both sides, a symmetric 0. Links to a GPU
        // that is not advertised (filtered out) are not scored.
        let links = [
            gpu(
                "GPU-a",
                vec![link("GPU-hidden", Some(PcieLink::SameBoard), 6)],
            ),
            gpu("GPU-b", vec![]),
            gpu("GPU-hidden", vec![]),
        ];
        let scores = gpu_scores(&["GPU-a", "GPU-b"], &links).unwrap();
        assert_eq!(
            scores.annotation(),
            r#"[{"uuid":"GPU-a","score":{"GPU-b":0}},{"uuid":"GPU-b","score":{"GPU-a":0}}]"#
        );
        // One GPU: an empty map; none: an empty list (HAMi publishes `[]` too).
        assert_eq!(
            gpu_scores(&["GPU-b"], &links).unwrap().annotation(),
            r#"[{"uuid":"GPU-b","score":{}}]"#
        );
        assert_eq!(gpu_scores(&[], &links).unwrap().annotation(), "[]");
        assert_eq!(
            gpu_scores(&["GPU-z"], &links).unwrap_err(),
            TopologyError::MissingGpu {
                uuid: "GPU-z".into()
            }
        );
    }

    #[test]
    fn hamis_decoder_reads_what_we_write() {
        // HAMi's `DecodePairScores` target: `[{"uuid": string, "score": map[string]int}]`.
        let links = [
            gpu("GPU-a", vec![link("GPU-b", Some(PcieLink::HostBridge), 0)]),
            gpu("GPU-b", vec![link("GPU-a", Some(PcieLink::HostBridge), 0)]),
        ];
        let text = gpu_scores(&["GPU-a", "GPU-b"], &links)
            .unwrap()
            .annotation();
        let decoded: Vec<DeviceScore> = serde_json::from_str(&text).unwrap();
        assert_eq!(decoded[1].score["GPU-a"], 30);
    }
}

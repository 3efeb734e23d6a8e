//! The environment a process ends up with, two ways: through the reference decision
//! ([`crate::decide_on_node`]) and through the preload library's own decision
//! (`hami_preload_core::decide`, applied as `libhami_preload.so` applies it: remove every inherited
//! contract variable, then set each entry, `CUDA_DEVICE_MEMORY_LIMIT` replaced by the per-node
//! cap). Shared by `tests/preload_differential.rs` and the `preload_differential` fuzz target.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::{Decision, NodeView, decide_on_node};
use hami_preload_core::decide::{MibText, PerNode, cap_on_node, parse_node_gpus, read_limits};
use hami_preload_core::keys::is_contract_variable;

/// Name → value.
pub type Env = BTreeMap<Vec<u8>, Vec<u8>>;

/// What one side decided: untouched (with the reason's text) or applied (skipped lines and the
/// per-node step), and the resulting environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `Err(reason)` when untouched, else `(skipped_lines, per_node)`.
    pub decision: Result<(usize, Option<PerNode>), &'static str>,
    /// The environment after.
    pub env: Env,
}

fn to_env(inherited: &[(Vec<u8>, Vec<u8>)]) -> Env {
    inherited.iter().cloned().collect()
}

/// Through the reference.
pub fn reference(
    contents: &[u8],
    truncated: bool,
    inherited: &[(Vec<u8>, Vec<u8>)],
    node: &NodeView<'_>,
) -> Outcome {
    let names = inherited.iter().map(|(n, _)| OsStr::from_bytes(n));
    let mut env = to_env(inherited);
    match decide_on_node(contents, truncated, names, node) {
        Decision::Untouched(why) => Outcome {
            decision: Err(why.as_str()),
            env,
        },
        Decision::Apply(o) => {
            for name in &o.remove {
                env.remove(name.as_bytes());
            }
            for (k, v) in &o.set {
                env.insert(k.as_bytes().to_vec(), v.as_bytes().to_vec());
            }
            Outcome {
                decision: Ok((o.skipped_lines, o.per_node)),
                env,
            }
        }
    }
}

/// Through the library's decision.
pub fn library(
    contents: &[u8],
    truncated: bool,
    inherited: &[(Vec<u8>, Vec<u8>)],
    node: &NodeView<'_>,
) -> Outcome {
    let mut env = to_env(inherited);
    let limits = match read_limits(contents, truncated) {
        Ok(l) => l,
        Err(why) => {
            return Outcome {
                decision: Err(why.as_str()),
                env,
            };
        }
    };
    let per_node = limits.fraction_request(contents).map(|request| {
        let request = match request {
            Ok(r) => r,
            Err(why) => return PerNode::Kept(why),
        };
        let table = match node.node_file.and_then(parse_node_gpus) {
            Ok(t) => t,
            Err(why) => return PerNode::Kept(why),
        };
        match node.devices {
            Ok(visible) => cap_on_node(request.digits, &table, &visible),
            Err(why) => PerNode::Kept(why),
        }
    });
    env.retain(|name, _| !is_contract_variable(name));
    for (i, e) in limits.entries().iter().enumerate() {
        let value = match per_node {
            Some(PerNode::Applied { mib, .. }) if limits.global_memory() == Some(i) => {
                MibText::new(mib).as_bytes().to_vec()
            }
            _ => e.value(contents).to_vec(),
        };
        env.insert(e.key(contents).to_vec(), value);
    }
    Outcome {
        decision: Ok((limits.skipped_lines, per_node)),
        env,
    }
}

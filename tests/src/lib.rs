//! Test support for hami-limits: an in-process Kubernetes API server ([`apiserver`]) that the real
//! `kube` client talks to over HTTP, a fake kubelet ([`kubelet`]) for device plugin tests, and what
//! the real-cluster tests share ([`real`]), Markdown as the documentation tests read it
//! ([`docs`]), a stand-in hook folder ([`hook`]), the device plugin's `run` command in process
//! ([`run_command`]), inventory files ([`inventory`]), a free port and the built binaries for tests
//! that start processes ([`local`]), a Node reflector ([`reflector`]), and
//! a pod read as JSON ([`pod_json`]).

/// This crate's results: each room names its own error (`Result<T, KubeletError>`); a test's own
/// function, which `?`s over several of them, takes the default.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

pub mod apiserver;
pub mod docs;
pub mod hook;
pub mod inventory;
pub mod kubelet;
pub mod local;
pub mod module_graph;
pub mod pod_json;
pub mod real;
pub mod reflector;
pub mod run_command;

//! Test support for hami-limits: an in-process Kubernetes API server ([`apiserver`]) that the real
//! `kube` client talks to over HTTP, a fake kubelet ([`kubelet`]) for device plugin tests, and what
//! the real-cluster tests share ([`real`]), Markdown as the documentation tests read it
//! ([`docs`]), a stand-in hook folder ([`hook`]), and the device plugin's `run` command in process
//! ([`run_command`]).

pub mod apiserver;
pub mod docs;
pub mod hook;
pub mod kubelet;
pub mod module_graph;
pub mod real;
pub mod run_command;

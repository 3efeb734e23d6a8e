//! Test support for hami-limits: an in-process Kubernetes API server ([`apiserver`]) that the real
//! `kube` client talks to over HTTP, a fake kubelet ([`kubelet`]) for device plugin tests, and what
//! the real-cluster tests share ([`real`]), and Markdown as the documentation tests read it
//! ([`docs`]).

pub mod apiserver;
pub mod docs;
pub mod kubelet;
pub mod module_graph;
pub mod real;

//! Test support for hami-limits: an in-process Kubernetes API server ([`apiserver`]) that the real
//! `kube` client talks to over HTTP, and a fake kubelet ([`kubelet`]) for device plugin tests.

pub mod apiserver;
pub mod kubelet;
pub mod module_graph;

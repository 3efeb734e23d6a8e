//! Test support for hami-limits: an in-process Kubernetes API server ([`apiserver`]) that the real
//! `kube` client talks to over HTTP, for integration tests and benchmarks.

pub mod apiserver;

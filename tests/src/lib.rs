//! Crate root (being built).
pub mod kubelet;

//! Crate root (being built).

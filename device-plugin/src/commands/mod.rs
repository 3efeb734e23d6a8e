//! The one-shot commands (each runs, prints, exits; `run` is the long-running one, in
//! [`crate::app`]):
//!
//! - [`install_hook`]: `install-hook`, HAMi-core and the preload library into the hook path, and
//!   the node GPU file;
//! - [`plan`]: `plan`, the allocation plan of a pod, as `Allocate` would make it.

pub mod install_hook;
pub mod plan;

//! The commands besides `run` (in [`crate::app`]): two one-shot ones (each runs, prints, exits)
//! and the hook installer's long-running plugin:
//!
//! - [`install_hook`]: `install-hook`, HAMi-core and the preload library into the hook path, and
//!   the node GPU file;
//! - [`plan`]: `plan`, the allocation plan of a pod, as `Allocate` would make it;
//! - [`serve_preload`]: `serve-preload`, the long-running `hami.io/preload` device plugin of the
//!   hook installer (KAI containers get HAMi-core through it).

pub mod install_hook;
pub mod plan;
pub mod regions;
pub mod serve_preload;

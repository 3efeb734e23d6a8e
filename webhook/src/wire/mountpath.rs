//! Mount paths compared as the container runtime sees them: the one implementation lives in
//! `hami-shared`, so that the webhook and the device plugin's `Allocate` check clean a path alike.

pub use hami_shared::mountpath::{Overlap, clean, overlap, resolve};

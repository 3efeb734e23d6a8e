//! The hami-limits contract, shared by the webhook and the device plugin.
//!
//! - [`names`]: every well-known annotation, label, environment variable and path.
//! - [`values`]: value types (memory MiB, SM %, core policy, task priority, limit delivery) and
//!   [`values::resolve_limit_delivery`].
//! - [`limits_file`]: the `/overrideEnv` file: strict render, tolerant parse with diagnostics.
//! - [`hami_core`]: how HAMi-core really reads memory and SM values, with warnings.
//! - [`node_gpus`]: the node GPU file (minor number, UUID, MiB of each GPU of a node).
//! - [`region`]: HAMi-core's shared region (`usage.cache`): the limits in force, its processes,
//!   and the verdict (is the cap in force?).
//! - [`preload`]: the preload library's part of the contract: the variables it owns, the keys it
//!   exports, the bounds of its reads, the variables a pod may not set.
//! - [`container`], [`mountpath`], [`manifest`]: the per-container key, mount paths as the
//!   runtime cleans them, the nesting guard for pod files.
//!
//! Types and pure functions: the one exception is [`region`]'s bounded, link-refusing read of the
//! files a tenant's processes write (`usage.cache`, and a limits file beside it), kept with the
//! parser it feeds, so that every caller reads them the same way. Writing files is
//! `hami-publish`'s; configuration files and `HAMI_*` variables are `hami-config`'s.
//!
//! ```
//! use hami_shared::limits_file::{LimitsFile, parse};
//! use hami_shared::values::{DeliverySource, LimitDelivery, MemoryLimitMib, SmLimit, resolve_limit_delivery};
//!
//! let mut file = LimitsFile::new();
//! file.set_memory_limit(0, MemoryLimitMib::new(3000)?)?;
//! file.set_sm_limit(SmLimit::new(50)?);
//! file.insert("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/usage.cache")?;
//! assert_eq!(file.render(), hami_shared::limits_file::EXAMPLE);
//! assert!(parse(&file.render()).diagnostics.is_empty());
//! assert!(file.insert("CUDA_DEVICE_MEMORY_LIMIT_1", "04000m").is_err()); // octal to HAMi-core
//!
//! let r = resolve_limit_delivery(Some("env"), None, Some(LimitDelivery::File));
//! assert_eq!((r.delivery, r.source), (LimitDelivery::Env, DeliverySource::PodAnnotation));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod container;
pub mod hami_core;
pub mod limits_file;
pub mod manifest;
pub mod mountpath;
pub mod names;
pub mod node_gpus;
pub mod preload;
pub mod region;
pub mod values;

pub use limits_file::{Diagnostic, LimitsFile, LimitsFileError, ParsedLimitsFile, Severity, parse};
pub use values::{
    CorePolicy, DeliverySource, LimitDelivery, MemoryLimitMib, ResolvedDelivery, SmLimit,
    TaskPriority, ValueError, resolve_limit_delivery,
};

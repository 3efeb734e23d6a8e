//! The hami-limits contract, shared by the webhook and the device plugin.
//!
//! - [`names`]: every well-known annotation, label, environment variable and path.
//! - [`values`]: value types (memory MiB, SM %, core policy, task priority, limit delivery) and
//!   [`values::resolve_limit_delivery`].
//! - [`limits_file`]: the `/overrideEnv` file: strict render, tolerant parse with diagnostics.
//! - [`hami_core`]: how HAMi-core really reads memory and SM values, with warnings.
//! - [`publish`]: atomic publication of a file into a directory, and the leftover sweep.
//! - [`node_gpus`]: the node GPU file (minor number, UUID, MiB of each GPU of a node).
//! - [`region`]: HAMi-core's shared region (`usage.cache`): the limits in force, its processes,
//!   and the verdict (is the cap in force?).
//! - [`config`]: layered configuration and HAMi-compatible device/node config files.
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

pub mod config;
pub mod container;
pub mod hami_core;
pub mod limits_file;
pub mod manifest;
pub mod mountpath;
pub mod names;
pub mod node_gpus;
pub mod preload;
pub mod publish;
pub mod region;
pub mod values;

pub use limits_file::{Diagnostic, LimitsFile, LimitsFileError, ParsedLimitsFile, Severity, parse};
pub use publish::{PublishError, publish_atomic, sweep_temp_files};
pub use values::{
    CorePolicy, DeliverySource, LimitDelivery, MemoryLimitMib, ResolvedDelivery, SmLimit,
    TaskPriority, ValueError, resolve_limit_delivery,
};

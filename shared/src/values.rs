//! Value types of the contract and the limit-delivery resolution.
//!
//! Each type parses only the forms that every party reads the same way, and renders the one form
//! HAMi-core's parser reads unambiguously (see [`crate::hami_core`]).

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What the constructors of this module return.
pub type Result<T, E = ValueError> = std::result::Result<T, E>;

/// A value that is not one of the accepted forms. The message names the value and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// A memory limit of 0 MiB: HAMi-core reads 0 as "no limit".
    #[error("memory limit 0 MiB is not allowed: HAMi-core reads 0 as no limit")]
    ZeroMemory,
    /// A memory limit whose byte count would overflow HAMi-core's `size_t` multiplication.
    #[error("memory limit {mib} MiB is too large (at most {max} MiB)")]
    MemoryTooLarge {
        /// The value given.
        mib: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// A memory limit that is not `<n>m` with n a positive decimal integer without leading zero.
    #[error(
        "memory limit {value:?} is not of the form <n>m (n a positive decimal integer, no leading zero)"
    )]
    InvalidMemory {
        /// The text given.
        value: String,
    },
    /// An SM limit outside 0..=100 or not a decimal integer.
    #[error("SM limit {value:?} is not an integer from 0 to 100")]
    InvalidSmLimit {
        /// The text given.
        value: String,
    },
    /// A core policy that is not one of the three names.
    #[error("core policy {value:?} is not one of: default, force, disable")]
    InvalidCorePolicy {
        /// The text given.
        value: String,
    },
    /// A task priority that is not a decimal 32-bit integer.
    #[error("task priority {value:?} is not a decimal integer")]
    InvalidTaskPriority {
        /// The text given.
        value: String,
    },
    /// A limit delivery that is not exactly `env` or `file`.
    #[error("{value:?} is not one of: env, file")]
    InvalidLimitDelivery {
        /// The text given.
        value: String,
    },
}

/// True when `s` is a non-empty decimal integer without sign and without a superfluous leading zero.
fn is_canonical_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

// ---------------------------------------------------------------------------------------------
// MemoryLimitMib
// ---------------------------------------------------------------------------------------------

/// A GPU memory limit in MiB, never zero. Renders as `<n>m`, the form HAMi-core reads unambiguously.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemoryLimitMib(NonZeroU64);

impl MemoryLimitMib {
    /// Largest MiB count whose byte value still fits HAMi-core's 64-bit `size_t` (`n << 20`).
    pub const MAX: u64 = u64::MAX >> 20;

    /// A limit of `mib` MiB; 0 (no limit for HAMi-core) and values overflowing bytes are refused.
    pub fn new(mib: u64) -> Result<Self> {
        if mib > Self::MAX {
            return Err(ValueError::MemoryTooLarge {
                mib,
                max: Self::MAX,
            });
        }
        NonZeroU64::new(mib).map(Self).ok_or(ValueError::ZeroMemory)
    }

    /// The limit in MiB.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// The limit in bytes, as HAMi-core computes it.
    pub fn bytes(self) -> u64 {
        self.0.get() << 20
    }
}

impl fmt::Display for MemoryLimitMib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}m", self.0)
    }
}

impl FromStr for MemoryLimitMib {
    type Err = ValueError;

    /// Accepts exactly the rendered form `^[1-9][0-9]*m$`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ValueError::InvalidMemory {
            value: s.to_owned(),
        };
        let digits = s.strip_suffix('m').ok_or_else(invalid)?;
        if !is_canonical_decimal(digits) || digits == "0" {
            return if digits == "0" {
                Err(ValueError::ZeroMemory)
            } else {
                Err(invalid())
            };
        }
        let mib: u64 = digits.parse().map_err(|_| invalid())?;
        Self::new(mib)
    }
}

impl Serialize for MemoryLimitMib {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

// ---------------------------------------------------------------------------------------------
// SmLimit
// ---------------------------------------------------------------------------------------------

/// A core (SM) limit in percent, 0..=100. 0 and 100 both mean "no throttling" to HAMi-core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SmLimit(u8);

impl SmLimit {
    /// No core limit (HAMi's convention: `CUDA_DEVICE_SM_LIMIT=0`).
    pub const UNLIMITED: SmLimit = SmLimit(0);

    /// A limit of `percent`; values above 100 are refused.
    pub fn new(percent: u32) -> Result<Self> {
        u8::try_from(percent)
            .ok()
            .filter(|p| *p <= 100)
            .map(Self)
            .ok_or_else(|| ValueError::InvalidSmLimit {
                value: percent.to_string(),
            })
    }

    /// The percentage.
    pub fn get(self) -> u8 {
        self.0
    }

    /// True when HAMi-core throttles (1..=99).
    pub fn throttles(self) -> bool {
        (1..100).contains(&self.0)
    }
}

impl fmt::Display for SmLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for SmLimit {
    type Err = ValueError;

    /// Accepts a bare decimal integer 0..=100 without leading zero (a leading zero is octal to HAMi-core).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ValueError::InvalidSmLimit {
            value: s.to_owned(),
        };
        if !is_canonical_decimal(s) {
            return Err(invalid());
        }
        let n: u32 = s.parse().map_err(|_| invalid())?;
        Self::new(n).map_err(|_| invalid())
    }
}

// ---------------------------------------------------------------------------------------------
// CorePolicy
// ---------------------------------------------------------------------------------------------

/// `GPU_CORE_UTILIZATION_POLICY` / HAMi's `gpuCorePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CorePolicy {
    /// Leave core limiting to the monitor (HAMi's default).
    #[default]
    Default,
    /// Always enforce the core limit.
    Force,
    /// Never enforce the core limit.
    Disable,
}

impl CorePolicy {
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "default, force, disable";

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            CorePolicy::Default => "default",
            CorePolicy::Force => "force",
            CorePolicy::Disable => "disable",
        }
    }
}

impl fmt::Display for CorePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CorePolicy {
    type Err = ValueError;

    /// Exact lowercase names only.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(CorePolicy::Default),
            "force" => Ok(CorePolicy::Force),
            "disable" => Ok(CorePolicy::Disable),
            _ => Err(ValueError::InvalidCorePolicy {
                value: s.to_owned(),
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TaskPriority
// ---------------------------------------------------------------------------------------------

/// `CUDA_TASK_PRIORITY`: an integer read with `atoi` by HAMi-core; lower is higher priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskPriority(pub i32);

impl TaskPriority {
    /// HAMi-core's default when the variable is unset.
    pub const DEFAULT: TaskPriority = TaskPriority(1);

    /// The integer.
    pub fn get(self) -> i32 {
        self.0
    }
}

impl fmt::Display for TaskPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for TaskPriority {
    type Err = ValueError;

    /// A decimal integer with optional leading `-`, no spaces, no `+`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ValueError::InvalidTaskPriority {
            value: s.to_owned(),
        };
        let digits = s.strip_prefix('-').unwrap_or(s);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        s.parse::<i32>().map(TaskPriority).map_err(|_| invalid())
    }
}

// ---------------------------------------------------------------------------------------------
// LimitDelivery and its resolution
// ---------------------------------------------------------------------------------------------

/// How the device plugin delivers limits to HAMi-core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LimitDelivery {
    /// Publish the limits file, mount it at `/overrideEnv`, and still inject the variables (default).
    #[default]
    File,
    /// Inject the environment variables only (HAMi's behaviour before the limits file).
    Env,
}

impl LimitDelivery {
    /// The accepted spellings, as error messages list them.
    pub const ACCEPTED: &'static str = "env, file";

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitDelivery::File => "file",
            LimitDelivery::Env => "env",
        }
    }
}

impl fmt::Display for LimitDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LimitDelivery {
    type Err = ValueError;

    /// Exactly `file` or `env` (no case folding, no trimming: the annotation must be unambiguous).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "file" => Ok(LimitDelivery::File),
            "env" => Ok(LimitDelivery::Env),
            _ => Err(ValueError::InvalidLimitDelivery {
                value: s.to_owned(),
            }),
        }
    }
}

/// Which setting decided the delivery mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliverySource {
    /// The pod annotation `hami.io/limit-delivery`.
    PodAnnotation,
    /// The node's entry in the device plugin's `config.json`.
    NodeConfig,
    /// `nvidia.limitDelivery` in the global device config.
    GlobalConfig,
    /// Nothing set: the default, `file`.
    Default,
}

impl DeliverySource {
    /// A short lowercase name for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliverySource::PodAnnotation => "pod-annotation",
            DeliverySource::NodeConfig => "node-config",
            DeliverySource::GlobalConfig => "global-config",
            DeliverySource::Default => "default",
        }
    }
}

impl fmt::Display for DeliverySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of [`resolve_limit_delivery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDelivery {
    /// The mode to use.
    pub delivery: LimitDelivery,
    /// Which setting decided it.
    pub source: DeliverySource,
    /// The pod annotation's value when it was present but invalid (and therefore ignored); the
    /// caller logs it and raises an Event.
    pub invalid_annotation: Option<String>,
}

/// Resolve the delivery mode: pod annotation > node config > global config > default `file`.
///
/// An invalid annotation value is skipped (falling back to the node/global setting) and reported
/// in [`ResolvedDelivery::invalid_annotation`]; the webhook should have denied it already.
pub fn resolve_limit_delivery(
    annotation: Option<&str>,
    node: Option<LimitDelivery>,
    global: Option<LimitDelivery>,
) -> ResolvedDelivery {
    let mut invalid_annotation = None;
    if let Some(text) = annotation {
        match text.parse::<LimitDelivery>() {
            Ok(delivery) => {
                return ResolvedDelivery {
                    delivery,
                    source: DeliverySource::PodAnnotation,
                    invalid_annotation: None,
                };
            }
            Err(_) => invalid_annotation = Some(text.to_owned()),
        }
    }
    let (delivery, source) = match (node, global) {
        (Some(d), _) => (d, DeliverySource::NodeConfig),
        (None, Some(d)) => (d, DeliverySource::GlobalConfig),
        (None, None) => (LimitDelivery::default(), DeliverySource::Default),
    };
    ResolvedDelivery {
        delivery,
        source,
        invalid_annotation,
    }
}

// ---------------------------------------------------------------------------------------------
// serde: the types read from configuration files deserialize from their text forms, so a bad
// value surfaces as the same message the parser gives.
// ---------------------------------------------------------------------------------------------

macro_rules! serde_via_str {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_via_str!(LimitDelivery);
serde_via_str!(CorePolicy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limit_renders_safe_form() {
        assert_eq!(MemoryLimitMib::new(3000).unwrap().to_string(), "3000m");
        assert_eq!(MemoryLimitMib::new(0), Err(ValueError::ZeroMemory));
        assert!(MemoryLimitMib::new(MemoryLimitMib::MAX).is_ok());
        assert!(MemoryLimitMib::new(MemoryLimitMib::MAX + 1).is_err());
        assert_eq!("3000m".parse::<MemoryLimitMib>().unwrap().get(), 3000);
        for bad in [
            "04000m", "3000", "3000M", "3000Mi", "0m", "m", "", " 1m", "1m ",
        ] {
            assert!(bad.parse::<MemoryLimitMib>().is_err(), "{bad:?}");
        }
        assert_eq!(MemoryLimitMib::new(1).unwrap().bytes(), 1 << 20);
    }

    #[test]
    fn sm_limit_range() {
        assert_eq!(SmLimit::new(100).unwrap().to_string(), "100");
        assert!(SmLimit::new(101).is_err());
        assert_eq!("0".parse::<SmLimit>().unwrap(), SmLimit::UNLIMITED);
        assert!(!SmLimit::UNLIMITED.throttles());
        assert!(SmLimit::new(50).unwrap().throttles());
        for bad in ["050", "-1", "101", "50%", "", "1e2"] {
            assert!(bad.parse::<SmLimit>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn core_policy_and_priority() {
        for p in [CorePolicy::Default, CorePolicy::Force, CorePolicy::Disable] {
            assert_eq!(p.to_string().parse::<CorePolicy>().unwrap(), p);
        }
        let err = "FORCE".parse::<CorePolicy>().unwrap_err().to_string();
        assert_eq!(
            err,
            r#"core policy "FORCE" is not one of: default, force, disable"#
        );
        assert_eq!("-3".parse::<TaskPriority>().unwrap(), TaskPriority(-3));
        assert!("+3".parse::<TaskPriority>().is_err());
        assert!("1.5".parse::<TaskPriority>().is_err());
    }

    #[test]
    fn limit_delivery_is_exact_lowercase() {
        assert_eq!(
            "file".parse::<LimitDelivery>().unwrap(),
            LimitDelivery::File
        );
        assert_eq!("env".parse::<LimitDelivery>().unwrap(), LimitDelivery::Env);
        for bad in ["FILE", "Env", " env", "env ", "", "files"] {
            let err = bad.parse::<LimitDelivery>().unwrap_err();
            assert_eq!(err.to_string(), format!("{bad:?} is not one of: env, file"));
        }
        assert_eq!(LimitDelivery::default(), LimitDelivery::File);
    }

    #[test]
    fn resolution_order() {
        use DeliverySource::*;
        use LimitDelivery::*;
        type Case<'a> = (
            Option<&'a str>,
            Option<LimitDelivery>,
            Option<LimitDelivery>,
            LimitDelivery,
            DeliverySource,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            (None, None, None, File, Default, None),
            (None, None, Some(Env), Env, GlobalConfig, None),
            (None, Some(File), Some(Env), File, NodeConfig, None),
            (None, Some(Env), None, Env, NodeConfig, None),
            (
                Some("env"),
                Some(File),
                Some(File),
                Env,
                PodAnnotation,
                None,
            ),
            (
                Some("file"),
                Some(Env),
                Some(Env),
                File,
                PodAnnotation,
                None,
            ),
            (
                Some("ENV"),
                Some(File),
                Some(Env),
                File,
                NodeConfig,
                Some("ENV"),
            ),
            (Some(""), None, Some(Env), Env, GlobalConfig, Some("")),
            (Some("x"), None, None, File, Default, Some("x")),
        ];
        for (ann, node, global, want, source, invalid) in cases {
            let got = resolve_limit_delivery(*ann, *node, *global);
            assert_eq!(got.delivery, *want, "{ann:?} {node:?} {global:?}");
            assert_eq!(got.source, *source, "{ann:?} {node:?} {global:?}");
            assert_eq!(got.invalid_annotation.as_deref(), *invalid);
        }
    }

    #[test]
    fn serde_uses_text_forms() {
        let d: LimitDelivery = serde_json::from_str("\"env\"").unwrap();
        assert_eq!(d, LimitDelivery::Env);
        let err = serde_json::from_str::<LimitDelivery>("\"Env\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"Env\" is not one of: env, file"), "{err}");
        assert_eq!(
            serde_json::to_string(&CorePolicy::Force).unwrap(),
            "\"force\""
        );
    }
}

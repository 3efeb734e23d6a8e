//! Static MIG: the strategy (`MIG_STRATEGY` none | single | mixed, as HAMi's and NVIDIA's
//! device plugins read it) and MIG profiles (`1g.10gb`, `1c.2g.20gb`, `1g.10gb+me`): their
//! grammar, the resource name each gets under the `mixed` strategy, and the profile name NVML's
//! numbers give (go-nvlib's `MigProfileInfo.String`, which HAMi's plugin uses).
//!
//! Dynamic MIG (HAMi's `operatingmode: mig`, slices created on demand) is not supported: it is
//! refused at start by [`crate::settings::PluginSettings::allocation_settings`].

use std::fmt;

/// The domain NVIDIA's `spec.NewResourceName` puts in front of MIG resource names (not
/// `resourceCountName`'s domain).
const NVIDIA_DOMAIN: &str = "nvidia.com";

/// The resource slices are advertised under with `MIG_STRATEGY=single`: `nvidia.com/gpu`
/// whatever `resourceCountName` says (HAMi's `AddMIGResource("*", "gpu")`).
pub const SINGLE_RESOURCE: &str = hami_shared::names::RESOURCE_GPU;

/// Environment name of `--mig-strategy` (HAMi's `cmd/device-plugin/nvidia/main.go`).
pub const ENV_MIG_STRATEGY: &str = "MIG_STRATEGY";

/// What a MIG strategy or profile written by a person or listed by NVML is not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// `MIG_STRATEGY` is not one of HAMi's strategies.
    #[error("{ENV_MIG_STRATEGY} (--mig-strategy) {0:?} is not one of: {accepted}", accepted = MigStrategy::ACCEPTED)]
    Strategy(String),
    /// Not a MIG profile.
    #[error("{0:?}: {PROFILE_FORMS}")]
    Profile(String),
    /// A profile with an attribute go-nvlib does not write.
    #[error(
        "{profile:?}: attribute {attribute:?} is not one of +me, +me.all, +gfx, -me ({PROFILE_FORMS})"
    )]
    Attribute {
        /// The profile.
        profile: String,
        /// Its attribute suffix.
        attribute: String,
    },
    /// A slice whose compute instance does not span its GPU instance, under `mixed`.
    #[error(
        "MIG profile {profile} has {compute} compute slices of {gpu} GPU slices: with MIG_STRATEGY=mixed only slices whose compute instance spans the whole GPU instance are advertised (HAMi refuses the node too); recreate the slice with one compute instance, or use MIG_STRATEGY=single"
    )]
    PartialCompute {
        /// The profile.
        profile: String,
        /// Its compute slices.
        compute: u32,
        /// Its GPU slices.
        gpu: u32,
    },
}

/// The profiles a [`MigError`] names as accepted.
const PROFILE_FORMS: &str =
    "expected a MIG profile like 1g.10gb, 3g.40gb, 1c.2g.20gb or 1g.10gb+me";

/// How MIG devices are advertised (HAMi v2.10 `rm/device_map.go` `buildDeviceMapFromConfigResources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    /// MIG is ignored: every GPU, MIG-enabled or not, is advertised as a whole GPU split into
    /// shares under `resourceCountName` (HAMi's default).
    #[default]
    None,
    /// Every GPU is MIG-enabled with slices of one profile; the slices are advertised under
    /// `nvidia.com/gpu`, one kubelet device each. A node mixing MIG and non-MIG GPUs, or
    /// profiles, is refused.
    Single,
    /// Non-MIG GPUs under `resourceCountName` (shares); each slice under
    /// `nvidia.com/mig-<profile>`.
    Mixed,
}

impl MigStrategy {
    /// The accepted spellings, exactly as HAMi's `validateFlags` compares them.
    pub const ACCEPTED: &'static str = "none, single, mixed";

    /// The value as written in `MIG_STRATEGY`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Single => "single",
            Self::Mixed => "mixed",
        }
    }
}

impl fmt::Display for MigStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for MigStrategy {
    type Err = MigError;

    /// Case-sensitive, as HAMi's `switch *config.Flags.MigStrategy`.
    fn from_str(value: &str) -> Result<Self, MigError> {
        match value {
            "none" => Ok(Self::None),
            "single" => Ok(Self::Single),
            "mixed" => Ok(Self::Mixed),
            other => Err(MigError::Strategy(other.to_owned())),
        }
    }
}

/// A MIG profile as go-nvlib writes it: `[<C>c.]<G>g.<GB>gb[+attr[,attr]|-attr]`, the compute
/// slices written only when they differ from the GPU slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigProfile {
    compute_slices: u32,
    gpu_slices: u32,
    memory_gb: u32,
    /// `""`, `+me`, `+me.all`, `+gfx`, `-me`, ... as written.
    suffix: String,
}

/// The attributes go-nvlib knows (`AttributeMediaExtensions`, `...All`, `AttributeGraphics`).
const ATTRIBUTES: [&str; 3] = ["me", "me.all", "gfx"];

fn slices(text: &str, unit: char) -> Option<u32> {
    let digits = text.strip_suffix(unit)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

impl MigProfile {
    /// A profile from its parts (what NVML's numbers give).
    pub fn new(compute_slices: u32, gpu_slices: u32, memory_gb: u32, suffix: &str) -> Self {
        Self {
            compute_slices,
            gpu_slices,
            memory_gb,
            suffix: suffix.to_owned(),
        }
    }

    /// Parses a profile; the error says what is wrong and what would be accepted.
    pub fn parse(text: &str) -> Result<Self, MigError> {
        let bad = || MigError::Profile(text.to_owned());
        let (base, suffix) = match text.find(['+', '-']) {
            Some(at) => text.split_at(at),
            None => (text, ""),
        };
        if !suffix.is_empty() {
            let attrs = &suffix[1..];
            let known = !attrs.is_empty() && attrs.split(',').all(|a| ATTRIBUTES.contains(&a));
            if !known {
                return Err(MigError::Attribute {
                    profile: text.to_owned(),
                    attribute: suffix.to_owned(),
                });
            }
        }
        let parts: Vec<&str> = base.split('.').collect();
        let (compute, gpu, memory) = match parts.as_slice() {
            [g, gb] => (None, *g, *gb),
            [c, g, gb] => (Some(*c), *g, *gb),
            _ => return Err(bad()),
        };
        let gpu_slices = slices(gpu, 'g').ok_or_else(bad)?;
        let memory_gb = memory
            .strip_suffix("gb")
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse().ok())
            .ok_or_else(bad)?;
        let compute_slices = match compute {
            Some(c) => slices(c, 'c').ok_or_else(bad)?,
            None => gpu_slices,
        };
        Ok(Self {
            compute_slices,
            gpu_slices,
            memory_gb,
            suffix: suffix.to_owned(),
        })
    }

    /// The resource a slice of this profile is advertised under with `MIG_STRATEGY=mixed`:
    /// `nvidia.com/mig-<profile>` with `+` written `.` (HAMi's `rm.AddDefaultResourcesToConfig`).
    /// Only profiles whose compute and GPU slices agree get a resource there; a slice of any
    /// other profile makes HAMi refuse to start ("does not match any resource patterns").
    pub fn mixed_resource_name(&self) -> Result<String, MigError> {
        if self.compute_slices != self.gpu_slices {
            return Err(MigError::PartialCompute {
                profile: self.to_string(),
                compute: self.compute_slices,
                gpu: self.gpu_slices,
            });
        }
        Ok(format!(
            "{NVIDIA_DOMAIN}/mig-{}",
            self.to_string().replace('+', ".")
        ))
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.compute_slices == self.gpu_slices {
            write!(
                f,
                "{}g.{}gb{}",
                self.gpu_slices, self.memory_gb, self.suffix
            )
        } else {
            write!(
                f,
                "{}c.{}g.{}gb{}",
                self.compute_slices, self.gpu_slices, self.memory_gb, self.suffix
            )
        }
    }
}

/// A slice's memory in the profile's GB, as go-nvlib's `getMigMemorySizeGB` rounds it: the
/// slice's share of the parent in eighths, rounded up, times the parent's GiB rounded up.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
pub fn mig_memory_gb(parent_total_bytes: u64, slice_memory_mb: u64) -> u32 {
    const EIGHTHS: f64 = 8.0;
    const MIB: f64 = 1024.0 * 1024.0;
    const GIB: u64 = 1024 * 1024 * 1024;
    if parent_total_bytes == 0 {
        return 0;
    }
    let share = (slice_memory_mb as f64 * MIB) / parent_total_bytes as f64;
    let share = (share * EIGHTHS).ceil() / EIGHTHS;
    let parent_gb = parent_total_bytes.div_ceil(GIB) as f64;
    (share * parent_gb).round() as u32
}

/// The attribute suffix go-nvlib's `NewMigProfile` derives from a GPU instance profile ID
/// (NVML's `NVML_GPU_INSTANCE_PROFILE_*`): `_REV1` → `+me`, `_ALL_ME` → `+me.all`, `_GFX` →
/// `+gfx`, `_NO_ME` → `-me`, others none.
pub fn gpu_instance_profile_suffix(profile_id: u32) -> &'static str {
    match profile_id {
        0x07 | 0x08 => "+me",
        0x0F | 0x10 => "+me.all",
        0x0A..=0x0C => "+gfx",
        0x0D | 0x0E => "-me",
        _ => "",
    }
}

/// What NVML says of one MIG device and of one GPU instance profile, for telling which profile a
/// device was made from (nvml-wrapper 0.13 has no `nvmlDeviceGetGpuInstanceId`, so the
/// device's attributes are matched against the parent's profiles instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SliceShape {
    /// GPU instance slices.
    pub slices: u32,
    /// Memory in MB (NVML's unit, MiB).
    pub memory_mb: u64,
    /// Decoders, encoders, JPEG and OFA engines.
    pub engines: [u32; 4],
}

/// The first GPU instance profile (in ID order, so a base profile before its variants) whose
/// shape is the device's; `None` when none matches.
pub fn match_gpu_instance_profile(
    device: SliceShape,
    profiles: &[(u32, SliceShape)],
) -> Option<u32> {
    profiles
        .iter()
        .find(|(_, shape)| *shape == device)
        .map(|(id, _)| *id)
}

/// Where the driver lists the minors of the MIG capability device nodes.
pub const MIG_MINORS_PATH: &str = "/proc/driver/nvidia-caps/mig-minors";

/// The minors of `/proc/driver/nvidia-caps/mig-minors` (lines `gpu<G>/gi<I>/access <minor>` and
/// `gpu<G>/gi<I>/ci<C>/access <minor>`; `config`/`monitor` and other lines ignored), keyed by
/// (parent minor, GPU instance, compute instance or `None` for the GPU instance's own node) —
/// HAMi v2.10 `mig/mig.go` `GetMigCapabilityDevicePaths`, as data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors(std::collections::BTreeMap<(u32, u32, Option<u32>), u32>);

impl MigMinors {
    /// Parses the file's text; lines it does not know are skipped, as HAMi's `Sscanf` does.
    pub fn parse(text: &str) -> Self {
        let mut map = std::collections::BTreeMap::new();
        for line in text.lines() {
            let Some((path, minor)) = line.trim().split_once(' ') else {
                continue;
            };
            let Ok(minor) = minor.trim().parse::<u32>() else {
                continue;
            };
            let parts: Vec<&str> = path.split('/').collect();
            let num = |s: &str, prefix: &str| s.strip_prefix(prefix)?.parse::<u32>().ok();
            let key = match parts.as_slice() {
                [gpu, gi, "access"] => num(gpu, "gpu")
                    .zip(num(gi, "gi"))
                    .map(|(g, i)| (g, i, None)),
                [gpu, gi, ci, "access"] => num(gpu, "gpu")
                    .zip(num(gi, "gi"))
                    .zip(num(ci, "ci"))
                    .map(|((g, i), c)| (g, i, Some(c))),
                _ => None,
            };
            if let Some(key) = key {
                map.insert(key, minor);
            }
        }
        Self(map)
    }

    /// A MIG device's nodes (HAMi `nvmlMigDevice.GetPaths`): `/dev/nvidia<parent>`, then the GPU
    /// instance's and the compute instance's `/dev/nvidia-caps/nvidia-cap<minor>`; `None` when
    /// either is not listed (HAMi: "missing MIG GPU instance capability path").
    pub fn device_paths(&self, parent_minor: u32, gi: u32, ci: u32) -> Option<Vec<String>> {
        let gi_minor = self.0.get(&(parent_minor, gi, None))?;
        let ci_minor = self.0.get(&(parent_minor, gi, Some(ci)))?;
        Some(vec![
            format!("/dev/nvidia{parent_minor}"),
            format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"),
            format!("/dev/nvidia-caps/nvidia-cap{ci_minor}"),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_exactly_as_hami_compares_them() {
        assert_eq!("none".parse(), Ok(MigStrategy::None));
        assert_eq!("single".parse(), Ok(MigStrategy::Single));
        assert_eq!("mixed".parse(), Ok(MigStrategy::Mixed));
        assert_eq!(MigStrategy::default(), MigStrategy::None);
        let err = "Mixed".parse::<MigStrategy>().unwrap_err().to_string();
        assert_eq!(
            err,
            "MIG_STRATEGY (--mig-strategy) \"Mixed\" is not one of: none, single, mixed"
        );
    }

    #[test]
    fn profiles_parse_print_and_name_their_mixed_resource() {
        for (text, printed, resource) in [
            ("1g.10gb", "1g.10gb", Some("nvidia.com/mig-1g.10gb")),
            ("7g.141gb", "7g.141gb", Some("nvidia.com/mig-7g.141gb")),
            (
                "1g.10gb+me",
                "1g.10gb+me",
                Some("nvidia.com/mig-1g.10gb.me"),
            ),
            (
                "1g.20gb+me.all",
                "1g.20gb+me.all",
                Some("nvidia.com/mig-1g.20gb.me.all"),
            ),
            (
                "1g.10gb-me",
                "1g.10gb-me",
                Some("nvidia.com/mig-1g.10gb-me"),
            ),
            ("2g.2g.20gb", "2g.20gb", None),
            ("1c.2g.20gb", "1c.2g.20gb", None),
        ] {
            if text == "2g.2g.20gb" {
                assert!(MigProfile::parse(text).is_err());
                continue;
            }
            let p = MigProfile::parse(text).unwrap();
            assert_eq!(p.to_string(), printed);
            assert_eq!(p.mixed_resource_name().ok().as_deref(), resource, "{text}");
        }
        assert_eq!(
            MigProfile::parse("2c.2g.20gb").unwrap().to_string(),
            "2g.20gb"
        );
        let err = MigProfile::parse("1c.2g.20gb")
            .unwrap()
            .mixed_resource_name()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("1c.2g.20gb") && err.contains("MIG_STRATEGY=single"),
            "{err}"
        );
        for bad in [
            "",
            "1g",
            "1g.10",
            "g.10gb",
            "01g.10gb",
            "1g.10gb+xx",
            "1g.10gb+",
            "1x.1g.5gb",
        ] {
            let err = MigProfile::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("expected a MIG profile like 1g.10gb"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn memory_is_rounded_as_go_nvlib_does() {
        // An A100-SXM4-40GB: 40536 MiB; its slices report 4864, 9984, 19968 and 40192 MB.
        let a100 = 40_536_u64 * 1024 * 1024;
        assert_eq!(mig_memory_gb(a100, 4864), 5);
        assert_eq!(mig_memory_gb(a100, 9984), 10);
        assert_eq!(mig_memory_gb(a100, 19_968), 20);
        assert_eq!(mig_memory_gb(a100, 40_192), 40);
        assert_eq!(mig_memory_gb(0, 4864), 0);
    }

    #[test]
    fn profile_ids_give_the_attribute_suffix_and_shapes_pick_the_profile() {
        assert_eq!(gpu_instance_profile_suffix(0x00), "");
        assert_eq!(gpu_instance_profile_suffix(0x07), "+me");
        assert_eq!(gpu_instance_profile_suffix(0x0F), "+me.all");
        assert_eq!(gpu_instance_profile_suffix(0x0B), "+gfx");
        assert_eq!(gpu_instance_profile_suffix(0x0D), "-me");
        let plain = SliceShape {
            slices: 1,
            memory_mb: 4864,
            engines: [0, 0, 0, 0],
        };
        let media = SliceShape {
            engines: [1, 0, 1, 1],
            ..plain
        };
        let profiles = [
            (0x00, plain),
            (0x07, media),
            (0x01, SliceShape { slices: 2, ..plain }),
        ];
        assert_eq!(match_gpu_instance_profile(plain, &profiles), Some(0x00));
        assert_eq!(match_gpu_instance_profile(media, &profiles), Some(0x07));
        assert_eq!(
            match_gpu_instance_profile(SliceShape { slices: 3, ..plain }, &profiles),
            None
        );
    }

    #[test]
    fn mig_minors_give_the_capability_nodes() {
        let minors = MigMinors::parse(
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi2/access 21\nbad line\ngpu1/gi2/ci1/access x\n",
        );
        assert_eq!(
            minors.device_paths(0, 1, 0),
            Some(vec![
                "/dev/nvidia0".to_owned(),
                "/dev/nvidia-caps/nvidia-cap12".to_owned(),
                "/dev/nvidia-caps/nvidia-cap13".to_owned(),
            ])
        );
        // gpu1/gi2 has no parsable compute-instance node: no paths, as HAMi errors.
        assert_eq!(minors.device_paths(1, 2, 1), None);
        assert_eq!(minors.device_paths(0, 2, 0), None);
    }
}

//! How a container is told which GPUs it gets: the device list strategies (`envvar`,
//! `volume-mounts`, `cdi-annotations`, `cdi-cri`), the device ID strategy (`uuid`, `index`),
//! device specs (`PASS_DEVICE_SPECS`), GDRCopy / GDS / MOFED and IMEX channels — HAMi v2.10.0's
//! `getAllocateResponse` and the functions it calls
//! (`pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`), as a pure function:
//! [`answer`] takes the settings, the node's devices and the container's GPU UUIDs and returns
//! the envs, mounts, device specs, annotations and CDI devices. No I/O here.
//!
//! CDI: HAMi generates its own CDI spec (vendor `k8s.device-plugin.nvidia.com`, with nvcdi) at
//! start. hami-device-plugin generates none: it names the devices of the spec the NVIDIA
//! Container Toolkit generates (`nvidia-ctk cdi generate`, or the toolkit's
//! `nvidia-cdi-refresh` service), vendor [`CDI_VENDOR`] (`nvidia.com/gpu=<uuid|index>`, both name
//! forms by default), and `nvidia-ctk cdi generate --mode=gds|mofed|gdrcopy|imex` for the other
//! classes. That spec must exist on the node, or the runtime refuses to create the container.
//!
//! The setting types keep HAMi's names and the comments that quote HAMi's function for each step
//! of [`answer`]; the answer is one pure function of them and is kept beside them.

pub mod settings;

use std::collections::BTreeMap;

use serde::Serialize;

use super::container_response::{PlannedDeviceSpec, PlannedMount};
use crate::gpu::inventory::Gpu;

/// The device list variable (HAMi's `deviceListEnvVar`).
pub const ENV_NVIDIA_VISIBLE_DEVICES: &str = hami_shared::names::ENV_NVIDIA_VISIBLE_DEVICES;
/// IMEX channels for the NVIDIA container runtime (`spec.ImexChannelEnvVar`).
pub const ENV_NVIDIA_IMEX_CHANNELS: &str = "NVIDIA_IMEX_CHANNELS";
/// `GDRCOPY_ENABLED`: the container gets `NVIDIA_GDRCOPY=enabled`.
pub const ENV_NVIDIA_GDRCOPY: &str = "NVIDIA_GDRCOPY";
/// `GDS_ENABLED`: the container gets `NVIDIA_GDS=enabled`.
pub const ENV_NVIDIA_GDS: &str = "NVIDIA_GDS";
/// `MOFED_ENABLED`: the container gets `NVIDIA_MOFED=enabled`.
pub const ENV_NVIDIA_MOFED: &str = "NVIDIA_MOFED";
/// The value of the three variables above.
pub const ENABLED: &str = "enabled";
/// `volume-mounts`: the folder the runtime reads the device list from
/// (`deviceListAsVolumeMountsContainerPathRoot`).
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// `volume-mounts`: what is mounted at each entry (`deviceListAsVolumeMountsHostPath`).
pub const VOLUME_MOUNTS_HOST_PATH: &str = "/dev/null";
/// The vendor of the CDI devices named (the NVIDIA Container Toolkit's spec; HAMi names its own,
/// `k8s.device-plugin.nvidia.com`, which only HAMi's plugin generates).
pub const CDI_VENDOR: &str = "nvidia.com";
/// `CDI_ANNOTATION_PREFIX` default (`cdiapi.AnnotationPrefix`).
pub const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The plugin name in the CDI annotation key (`getCDIDeviceAnnotations`).
pub const CDI_ANNOTATION_PLUGIN: &str = "nvidia-device-plugin";
/// The device nodes every GPU container needs, passed when present (`GetDevicePaths`).
pub const CONTROL_DEVICE_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];
/// Where IMEX channel device nodes live (`imex.GetChannels`).
pub const IMEX_CHANNELS_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// One member of `DEVICE_LIST_STRATEGY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<ids>` (HAMi's default).
    Envvar,
    /// `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and one `/dev/null` mount per
    /// device under it (the runtime's `accept-nvidia-visible-devices-as-volume-mounts`).
    VolumeMounts,
    /// CDI devices in a container annotation (`cdi.k8s.io/...`).
    CdiAnnotations,
    /// CDI devices in the response's `CDIDevices` (kubelet passes them through the CRI).
    CdiCri,
}

impl DeviceListStrategy {
    /// Every strategy, in HAMi's order (`spec.NewDeviceListStrategies`).
    pub const ALL: [Self; 4] = [
        Self::Envvar,
        Self::VolumeMounts,
        Self::CdiAnnotations,
        Self::CdiCri,
    ];

    /// The name in `DEVICE_LIST_STRATEGY`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Envvar => "envvar",
            Self::VolumeMounts => "volume-mounts",
            Self::CdiAnnotations => "cdi-annotations",
            Self::CdiCri => "cdi-cri",
        }
    }

    /// The strategy named `s` (exact, as HAMi compares).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// `cdi-*` (HAMi: `strings.HasPrefix(k, "cdi-")`).
    pub fn is_cdi(self) -> bool {
        matches!(self, Self::CdiAnnotations | Self::CdiCri)
    }
}

/// A non-empty set of device list strategies, in [`DeviceListStrategy::ALL`] order; a strategy
/// named twice counts once (HAMi's map of flags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceListStrategies(Vec<DeviceListStrategy>);

impl DeviceListStrategies {
    /// The set of `list`, or `None` when it is empty (a container would get no device list).
    pub fn new(list: impl IntoIterator<Item = DeviceListStrategy>) -> Option<Self> {
        let mut v: Vec<DeviceListStrategy> = list.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        (!v.is_empty()).then_some(Self(v))
    }

    /// Whether `s` is one of them (`Includes`).
    pub fn includes(&self, s: DeviceListStrategy) -> bool {
        self.0.contains(&s)
    }

    /// Some are CDI (`AnyCDIEnabled`).
    pub fn any_cdi(&self) -> bool {
        self.0.iter().any(|s| s.is_cdi())
    }

    /// All are CDI (`AllCDIEnabled`): no envs, mounts or device specs for the device list.
    pub fn all_cdi(&self) -> bool {
        self.0.iter().all(|s| s.is_cdi())
    }

    /// The strategies.
    pub fn as_slice(&self) -> &[DeviceListStrategy] {
        &self.0
    }
}

impl Default for DeviceListStrategies {
    fn default() -> Self {
        Self(vec![DeviceListStrategy::Envvar])
    }
}

/// `DEVICE_ID_STRATEGY`: how a GPU is named in the device list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceIdStrategy {
    /// Its UUID (`GPU-…`), HAMi's default.
    #[default]
    Uuid,
    /// Its NVML index (`0`, `1`, …).
    Index,
}

impl DeviceIdStrategy {
    /// The name in `DEVICE_ID_STRATEGY`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Uuid => "uuid",
            Self::Index => "index",
        }
    }
}

/// An IMEX channel found at start (`imex.Channel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ImexChannel {
    /// The channel number (HAMi accepts only 0).
    pub id: u32,
}

impl ImexChannel {
    /// `/dev/nvidia-caps-imex-channels/channel<id>`.
    pub fn path(self) -> String {
        format!("{IMEX_CHANNELS_DIR}/channel{}", self.id)
    }
}

/// What the plan needs of one of the node's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDevice {
    /// Its name under `DEVICE_ID_STRATEGY=index` (`rm.Device.Index`).
    pub index: String,
    /// Its device nodes, passed with `PASS_DEVICE_SPECS=true` (`rm.Device.Paths`):
    /// `/dev/nvidia<minor>` for a GPU.
    pub paths: Vec<String>,
}

/// The node's devices by UUID (from the device table, at start).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeDevices(BTreeMap<String, NodeDevice>);

impl NodeDevices {
    /// The entries of whole GPUs — index, and `/dev/nvidia<minor>` (HAMi's
    /// `nvmlDevice.GetPaths`) — and of their MIG devices: `<gpu>:<slot>` and the parent's and
    /// capability nodes where found (`nvmlMigDevice.GetPaths`; none when not found).
    pub fn from_gpus(gpus: &[Gpu]) -> Self {
        let whole = gpus.iter().map(|g| {
            let device = NodeDevice {
                index: g.index.to_string(),
                paths: vec![format!("/dev/nvidia{}", g.minor)],
            };
            (g.uuid.clone(), device)
        });
        let migs = gpus.iter().flat_map(|g| &g.mig_devices).map(|m| {
            let device = NodeDevice {
                index: m.index.clone(),
                paths: m.paths.clone(),
            };
            (m.uuid.clone(), device)
        });
        Self(whole.chain(migs).collect())
    }

    /// Adds (or replaces) a device, e.g. a MIG instance with its capability nodes.
    pub fn insert(&mut self, uuid: impl Into<String>, device: NodeDevice) {
        self.0.insert(uuid.into(), device);
    }

    /// The device with this UUID.
    pub fn get(&self, uuid: &str) -> Option<&NodeDevice> {
        self.0.get(uuid)
    }

    /// No device known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The device list settings, parsed once at start ([`settings::DeviceListArgs::parse`]);
/// `Default` is HAMi's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceListSettings {
    /// `DEVICE_LIST_STRATEGY` (default `envvar`).
    pub strategies: DeviceListStrategies,
    /// `DEVICE_ID_STRATEGY` (default `uuid`).
    pub id_strategy: DeviceIdStrategy,
    /// `PASS_DEVICE_SPECS` (default false).
    pub pass_device_specs: bool,
    /// The host root of the device nodes: `NVIDIA_DEV_ROOT`, else `NVIDIA_DRIVER_ROOT`, else `/`
    /// (absolute, no trailing slash but for `/`).
    pub dev_root: String,
    /// `CDI_ANNOTATION_PREFIX` (default `cdi.k8s.io/`).
    pub cdi_annotation_prefix: String,
    /// `GDRCOPY_ENABLED`.
    pub gdrcopy: bool,
    /// `GDS_ENABLED`.
    pub gds: bool,
    /// `MOFED_ENABLED`.
    pub mofed: bool,
    /// The IMEX channels of `IMEX_CHANNEL_IDS` that exist (found at start).
    pub imex_channels: Vec<ImexChannel>,
}

impl Default for DeviceListSettings {
    fn default() -> Self {
        Self {
            strategies: DeviceListStrategies::default(),
            id_strategy: DeviceIdStrategy::Uuid,
            pass_device_specs: false,
            dev_root: "/".to_owned(),
            cdi_annotation_prefix: DEFAULT_CDI_ANNOTATION_PREFIX.to_owned(),
            gdrcopy: false,
            gds: false,
            mofed: false,
            imex_channels: Vec::new(),
        }
    }
}

impl DeviceListSettings {
    /// Whether [`answer`] needs the node's devices (index names or device nodes).
    pub fn needs_node_devices(&self) -> bool {
        let specs = self.pass_device_specs && !self.strategies.all_cdi();
        specs || self.id_strategy == DeviceIdStrategy::Index
    }
}

impl DeviceListSettings {
    /// At start: every advertised device can be answered under these settings — with
    /// `PASS_DEVICE_SPECS=true` (and a non-CDI strategy) each needs its device nodes. The error
    /// names the keys and the first device that fails.
    pub fn check_devices<'a>(
        &self,
        node: &NodeDevices,
        advertised: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), DeviceListError> {
        if !self.pass_device_specs || self.strategies.all_cdi() {
            return Ok(());
        }
        for uuid in advertised {
            match node.get(uuid) {
                None => {
                    return Err(DeviceListError::UnknownDevice {
                        uuid: uuid.to_owned(),
                        needed_for: "PASS_DEVICE_SPECS=true",
                    });
                }
                Some(d) if d.paths.is_empty() => {
                    return Err(DeviceListError::NoDeviceNodes {
                        uuid: uuid.to_owned(),
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The CDI kinds (`vendor/class`) whose spec the answers name (none without a CDI
    /// strategy).
    pub fn cdi_kinds_named(&self) -> Vec<String> {
        if !self.strategies.any_cdi() {
            return Vec::new();
        }
        let mut kinds = vec![format!("{CDI_VENDOR}/gpu")];
        if !self.imex_channels.is_empty() {
            kinds.push(format!("{CDI_VENDOR}/imex-channel"));
        }
        for (on, class) in [
            (self.gdrcopy, "gdrcopy"),
            (self.gds, "gds"),
            (self.mofed, "mofed"),
        ] {
            if on {
                kinds.push(format!("{CDI_VENDOR}/{class}"));
            }
        }
        kinds
    }
}

/// What the device list adds to a container's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceListAnswer {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Mounts (`volume-mounts`), before the HAMi-core mounts as in HAMi's answer.
    pub mounts: Vec<PlannedMount>,
    /// Device nodes (`PASS_DEVICE_SPECS`).
    pub device_specs: Vec<PlannedDeviceSpec>,
    /// Container annotations (`cdi-annotations`).
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names (`cdi-cri`).
    pub cdi_devices: Vec<String>,
}

/// Why the device list cannot be built; the caller adds the pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceListError {
    /// A device the scheduler assigned is not one of this node's devices, and the setting needs
    /// its index or its device nodes (HAMi silently leaves it out: a container without it).
    #[error(
        "device {uuid} is not one of this node's devices, so {needed_for} cannot be honoured for it"
    )]
    UnknownDevice {
        /// The device's UUID.
        uuid: String,
        /// The setting that needs it.
        needed_for: &'static str,
    },
    /// `PASS_DEVICE_SPECS=true` for a device whose device nodes were not found at start (a MIG
    /// device without its capability nodes): the container would start without access to it.
    #[error(
        "device {uuid} has no known device nodes (for a MIG device: its GPU and compute instance capability nodes were not found in /proc/driver/nvidia-caps/mig-minors), so PASS_DEVICE_SPECS=true cannot be honoured for it"
    )]
    NoDeviceNodes {
        /// The device's UUID.
        uuid: String,
    },
    /// A device ID that is not a valid CDI device name (`[A-Za-z0-9][A-Za-z0-9_.:-]*`, ending
    /// alphanumeric): the runtime would refuse it.
    #[error(
        "device ID {id:?} is not a valid CDI device name (letters, digits, '_', '.', ':', '-'; first and last a letter or digit)"
    )]
    InvalidCdiName {
        /// The ID.
        id: String,
    },
}

/// The device list part of one container's answer (HAMi's `getAllocateResponse`):
/// `uuids` are the container's devices in the scheduler's order, `response_id` makes the CDI
/// annotation key unique (the pod UID: HAMi uses a random UUID per response).
pub fn answer(
    settings: &DeviceListSettings,
    node: &NodeDevices,
    uuids: &[&str],
    response_id: &str,
) -> Result<DeviceListAnswer, DeviceListError> {
    let ids = device_ids(settings, node, uuids)?;
    let mut out = DeviceListAnswer::default();
    let strategies = &settings.strategies;
    if strategies.any_cdi() {
        let devices = cdi_devices(settings, &ids)?;
        if strategies.includes(DeviceListStrategy::CdiAnnotations) && !devices.is_empty() {
            out.annotations =
                cdi_annotations(&settings.cdi_annotation_prefix, response_id, &devices);
        }
        if strategies.includes(DeviceListStrategy::CdiCri) {
            out.cdi_devices = devices;
        }
    }
    // HAMi: "The following modifications are only made if at least one non-CDI device list
    // strategy is selected."
    if strategies.all_cdi() {
        return Ok(out);
    }
    if strategies.includes(DeviceListStrategy::Envvar) {
        // `updateResponseForDeviceListEnvVar`, `updateResponseForImexChannelsEnvVar`.
        out.envs
            .insert(ENV_NVIDIA_VISIBLE_DEVICES.to_owned(), ids.join(","));
        if !settings.imex_channels.is_empty() {
            let channels: Vec<String> = settings
                .imex_channels
                .iter()
                .map(|c| c.id.to_string())
                .collect();
            out.envs
                .insert(ENV_NVIDIA_IMEX_CHANNELS.to_owned(), channels.join(","));
        }
    }
    if strategies.includes(DeviceListStrategy::VolumeMounts) {
        volume_mounts(settings, &ids, &mut out);
    }
    if settings.pass_device_specs {
        out.device_specs = device_specs(settings, node, uuids)?;
    }
    for (on, key) in [
        (settings.gdrcopy, ENV_NVIDIA_GDRCOPY),
        (settings.gds, ENV_NVIDIA_GDS),
        (settings.mofed, ENV_NVIDIA_MOFED),
    ] {
        if on {
            out.envs.insert(key.to_owned(), ENABLED.to_owned());
        }
    }
    Ok(out)
}

/// HAMi's `uniqueDeviceIDsFromAnnotatedDeviceIDs`: the UUIDs (`uuid`) or the NVML indices
/// (`index`, `Devices().Subset(ids).GetIndices()`), each once, in the scheduler's order (HAMi's
/// index order is that of a Go map: the same set, in no fixed order).
fn device_ids(
    settings: &DeviceListSettings,
    node: &NodeDevices,
    uuids: &[&str],
) -> Result<Vec<String>, DeviceListError> {
    let mut ids: Vec<String> = Vec::with_capacity(uuids.len());
    for uuid in uuids {
        let id = match settings.id_strategy {
            DeviceIdStrategy::Uuid => (*uuid).to_owned(),
            DeviceIdStrategy::Index => node
                .get(uuid)
                .ok_or_else(|| DeviceListError::UnknownDevice {
                    uuid: (*uuid).to_owned(),
                    needed_for: "DEVICE_ID_STRATEGY=index",
                })?
                .index
                .clone(),
        };
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// HAMi's `updateResponseForCDI` device list: each GPU as `<vendor>/gpu=<id>`, each IMEX channel
/// as `<vendor>/imex-channel=<id>`, then `gdrcopy=all`, `gds=all`, `mofed=all` when enabled
/// (`cdiHandler.AdditionalDevices`).
fn cdi_devices(
    settings: &DeviceListSettings,
    ids: &[String],
) -> Result<Vec<String>, DeviceListError> {
    let mut devices = Vec::with_capacity(ids.len() + 4);
    for id in ids {
        if !is_cdi_device_name(id) {
            return Err(DeviceListError::InvalidCdiName { id: id.clone() });
        }
        devices.push(qualified_name("gpu", id));
    }
    for channel in &settings.imex_channels {
        devices.push(qualified_name("imex-channel", &channel.id.to_string()));
    }
    for (on, class) in [
        (settings.gdrcopy, "gdrcopy"),
        (settings.gds, "gds"),
        (settings.mofed, "mofed"),
    ] {
        if on {
            devices.push(qualified_name(class, "all"));
        }
    }
    Ok(devices)
}

/// `cdiparser.QualifiedName(vendor, class, name)`.
fn qualified_name(class: &str, name: &str) -> String {
    format!("{CDI_VENDOR}/{class}={name}")
}

/// The CDI spec's device name rule (`parser.ValidateDeviceName`).
fn is_cdi_device_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
    let (Some(first), Some(last)) = (name.chars().next(), name.chars().last()) else {
        return false;
    };
    first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() && name.chars().all(ok)
}

/// HAMi's `getCDIDeviceAnnotations`: `cdiapi.UpdateAnnotations(…, "nvidia-device-plugin", id,
/// devices)` gives `cdi.k8s.io/nvidia-device-plugin_<id>` = the devices joined by `,`; a custom
/// `CDI_ANNOTATION_PREFIX` replaces `cdi.k8s.io/`.
fn cdi_annotations(
    prefix: &str,
    response_id: &str,
    devices: &[String],
) -> BTreeMap<String, String> {
    let key = format!(
        "{prefix}{CDI_ANNOTATION_PLUGIN}_{}",
        response_id.replace('/', "_")
    );
    BTreeMap::from([(key, devices.join(","))])
}

/// HAMi's `updateResponseForDeviceMounts`: the device list variable names the folder, and each
/// device (then each IMEX channel, under `imex/`) is a `/dev/null` mount in it (read-write, as
/// HAMi leaves `ReadOnly` unset).
fn volume_mounts(settings: &DeviceListSettings, ids: &[String], out: &mut DeviceListAnswer) {
    out.envs.insert(
        ENV_NVIDIA_VISIBLE_DEVICES.to_owned(),
        VOLUME_MOUNTS_ROOT.to_owned(),
    );
    let entry = |name: String| PlannedMount {
        container_path: format!("{VOLUME_MOUNTS_ROOT}/{name}"),
        host_path: VOLUME_MOUNTS_HOST_PATH.to_owned(),
        read_only: false,
    };
    out.mounts.extend(ids.iter().cloned().map(entry));
    out.mounts.extend(
        settings
            .imex_channels
            .iter()
            .map(|c| entry(format!("imex/{}", c.id))),
    );
}

/// HAMi's `apiDeviceSpecs`: the control nodes (optional: only those present), each device's
/// nodes, then the IMEX channels; container path as on the host, host path under the dev root,
/// `rw`.
fn device_specs(
    settings: &DeviceListSettings,
    node: &NodeDevices,
    uuids: &[&str],
) -> Result<Vec<PlannedDeviceSpec>, DeviceListError> {
    let spec = |path: &str, optional: bool| PlannedDeviceSpec {
        container_path: path.to_owned(),
        host_path: under_root(&settings.dev_root, path),
        permissions: "rw".to_owned(),
        optional,
    };
    let mut specs: Vec<PlannedDeviceSpec> =
        CONTROL_DEVICE_NODES.iter().map(|p| spec(p, true)).collect();
    for uuid in uuids {
        let device = node
            .get(uuid)
            .ok_or_else(|| DeviceListError::UnknownDevice {
                uuid: (*uuid).to_owned(),
                needed_for: "PASS_DEVICE_SPECS=true",
            })?;
        if device.paths.is_empty() {
            return Err(DeviceListError::NoDeviceNodes {
                uuid: (*uuid).to_owned(),
            });
        }
        for path in &device.paths {
            if !specs.iter().any(|s| &s.container_path == path) {
                specs.push(spec(path, false));
            }
        }
    }
    specs.extend(
        settings
            .imex_channels
            .iter()
            .map(|c| spec(&c.path(), false)),
    );
    Ok(specs)
}

/// Go's `filepath.Join(root, path)` for an absolute, clean `root` and an absolute `path`.
pub fn under_root(root: &str, path: &str) -> String {
    let root = root.trim_end_matches('/');
    format!("{root}/{}", path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_are_a_set_in_hamis_order() {
        use DeviceListStrategy::*;
        let s = DeviceListStrategies::new([CdiCri, Envvar, CdiCri]).unwrap_or_default();
        assert_eq!(s.as_slice(), [Envvar, CdiCri]);
        assert!(s.any_cdi() && !s.all_cdi());
        assert!(DeviceListStrategies::new([]).is_none());
        let cdi = DeviceListStrategies::new([CdiAnnotations, CdiCri]).unwrap_or_default();
        assert!(cdi.all_cdi());
        assert_eq!(
            DeviceListStrategy::parse("volume-mounts"),
            Some(VolumeMounts)
        );
        assert_eq!(DeviceListStrategy::parse("Envvar"), None);
    }

    #[test]
    fn go_join_under_the_dev_root() {
        assert_eq!(under_root("/", "/dev/nvidia0"), "/dev/nvidia0");
        assert_eq!(
            under_root("/run/nvidia/driver", "/dev/nvidiactl"),
            "/run/nvidia/driver/dev/nvidiactl"
        );
    }

    #[test]
    fn cdi_device_names() {
        assert!(is_cdi_device_name(
            "GPU-6e8a1c2d-0000-1111-2222-333344445555"
        ));
        assert!(is_cdi_device_name("0"));
        assert!(is_cdi_device_name("MIG-1:2"));
        for bad in ["", "-a", "a-", "a b", "a/b", "a=b"] {
            assert!(!is_cdi_device_name(bad), "{bad:?}");
        }
    }
}

//! The `hami.io/preload` device plugin: how HAMi-core reaches a KAI container without a
//! `hostPath` volume in the pod.
//!
//! The webhook asks one `hami.io/preload` for each container it preloads
//! (`kai.hookDelivery: device-plugin`); the hook installer serves the resource on the nodes whose
//! hook folder it fills. `Allocate` answers read-only mounts of that folder's files at their own
//! paths (`HOOK/vgpu/libhami_preload.so`, `libvgpu.so`, `node-gpus` when published) and of
//! `HOOK/vgpu/ld.so.preload` at `/etc/ld.so.preload`. Device-plugin mounts are made by kubelet and
//! are not pod volumes, so Pod Security `baseline` (which refuses any `hostPath` volume) admits
//! the pod while still refusing every other host folder; and a pod that asks for the resource can
//! only be scheduled to a node that serves it, where the hook is installed.
//!
//! The resource is a count of slots, each a fake device (`preload-<n>`): one per container holding
//! it. No slot gives more than the others, and the mounts are the same for every container.
//!
//! Before answering, `Allocate` checks the hook folder ([`inspect_hook`]): each file a regular
//! file (not a link) that no one but its owner may write, and `ld.so.preload` exactly what
//! `install-hook` writes for this folder. Anything else fails the container's start with a
//! message naming the file: a preload list naming a library the container does not get would
//! leave it uncapped, with nothing but a loader warning.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use hami_shared::names::{
    LD_SO_PRELOAD_FILE, LD_SO_PRELOAD_PATH, LIBHAMI_PRELOAD_SO, LIBVGPU_SO, NODE_GPUS_FILE,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::commands::install_hook::ld_so_preload_contents;
use crate::kubelet::api::{self, v1beta1};
use crate::kubelet::plugin::ServedPlugin;

pub use crate::regions::slot_id::{SLOT_PREFIX, is_slot};
/// Default number of slots a node advertises: more containers than kubelet's default of 110
/// pods will hold.
pub const DEFAULT_SLOTS: u32 = 1024;
/// Longest `ld.so.preload` read (the real one is two paths).
const MAX_PRELOAD_LIST_BYTES: u64 = 8192;

/// The hook folder as `Allocate` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookFiles {
    /// `HOOK/vgpu`.
    pub vgpu_dir: PathBuf,
    /// Whether `HOOK/vgpu/node-gpus` is published (it is not on a node whose GPUs could not be
    /// listed: the limits file's admission-time cap then stands).
    pub node_gpus: bool,
}

/// Why the hook folder cannot be handed to a container; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum PreloadHookError {
    /// A file the container needs is not there.
    #[error(
        "{path} is missing: the hook folder is not installed (hami-device-plugin install-hook)"
    )]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// Not a regular file (a link, a directory, …).
    #[error("{path} is {what}, not a regular file")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// Writable by others than its owner.
    #[error(
        "{path} has mode {mode:o}: writable by others than its owner, so not handed to containers"
    )]
    Writable {
        /// The file or folder.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Could not be inspected or read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `ld.so.preload` is not what `install-hook` writes for this folder.
    #[error(
        "{path} does not list exactly {expected:?} (what install-hook writes for this folder; found {found:?}): the hook folder and --hook-path disagree"
    )]
    WrongPreloadList {
        /// The file.
        path: PathBuf,
        /// What it holds (at most the first 8 KiB).
        found: String,
        /// What it should hold.
        expected: String,
    },
}

/// What a path is, for messages.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// `path` must exist as a regular file (or, with `dir`, a directory), not a link, writable by its
/// owner only. `Ok(false)` when it does not exist.
fn check_entry(path: &Path, dir: bool) -> Result<bool, PreloadHookError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(PreloadHookError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let right_kind = if dir { meta.is_dir() } else { meta.is_file() };
    if !right_kind {
        return Err(PreloadHookError::NotRegular {
            path: path.to_path_buf(),
            what: kind_of(&meta),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(PreloadHookError::Writable {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(true)
}

/// Inspect `vgpu_dir` (`HOOK/vgpu`) as `Allocate` needs it: the folder and the two libraries and
/// `ld.so.preload` present, `node-gpus` optional, each as [`check_entry`] says, and
/// `ld.so.preload` exactly [`ld_so_preload_contents`] of this folder.
///
/// # Errors
/// [`PreloadHookError`] naming the first file at fault.
pub fn inspect_hook(vgpu_dir: &Path) -> Result<HookFiles, PreloadHookError> {
    if !check_entry(vgpu_dir, true)? {
        return Err(PreloadHookError::Missing {
            path: vgpu_dir.to_path_buf(),
        });
    }
    for name in [LIBHAMI_PRELOAD_SO, LIBVGPU_SO, LD_SO_PRELOAD_FILE] {
        let path = vgpu_dir.join(name);
        if !check_entry(&path, false)? {
            return Err(PreloadHookError::Missing { path });
        }
    }
    let node_gpus = check_entry(&vgpu_dir.join(NODE_GPUS_FILE), false)?;
    let list = vgpu_dir.join(LD_SO_PRELOAD_FILE);
    let read = |source| PreloadHookError::Read {
        path: list.clone(),
        source,
    };
    let mut found = String::new();
    std::fs::File::open(&list)
        .map_err(read)?
        .take(MAX_PRELOAD_LIST_BYTES)
        .read_to_string(&mut found)
        .map_err(read)?;
    let expected = ld_so_preload_contents(vgpu_dir);
    if found != expected {
        return Err(PreloadHookError::WrongPreloadList {
            path: list,
            found,
            expected,
        });
    }
    Ok(HookFiles {
        vgpu_dir: vgpu_dir.to_path_buf(),
        node_gpus,
    })
}

/// The slot devices a node advertises: `preload-0` … `preload-<slots-1>`, all healthy.
#[must_use]
pub fn slot_devices(slots: u32) -> Vec<v1beta1::Device> {
    (0..slots)
        .map(|i| v1beta1::Device {
            id: format!("{SLOT_PREFIX}{i}"),
            health: api::HEALTHY.to_owned(),
            topology: None,
        })
        .collect()
}

/// The read-only mounts a container gets: the libraries and `node-gpus` (when published) at their
/// own paths, and the preload list at `/etc/ld.so.preload`.
#[must_use]
pub fn mounts(hook: &HookFiles) -> Vec<v1beta1::Mount> {
    let at_own_path = |name: &str| {
        let path = hook.vgpu_dir.join(name).display().to_string();
        v1beta1::Mount {
            container_path: path.clone(),
            host_path: path,
            read_only: true,
        }
    };
    let mut mounts = vec![at_own_path(LIBHAMI_PRELOAD_SO), at_own_path(LIBVGPU_SO)];
    if hook.node_gpus {
        mounts.push(at_own_path(NODE_GPUS_FILE));
    }
    mounts.push(v1beta1::Mount {
        container_path: LD_SO_PRELOAD_PATH.to_owned(),
        host_path: hook.vgpu_dir.join(LD_SO_PRELOAD_FILE).display().to_string(),
        read_only: true,
    });
    mounts
}

/// The slot whose region folder a container gets: its lowest slot ID.
#[must_use]
pub fn region_slot(devices_ids: &[String]) -> Option<&str> {
    devices_ids
        .iter()
        .map(String::as_str)
        .min_by(|a, b| crate::regions::slot_id::slot_order(a, b))
}

/// The read-write mount of a slot's region folder (`<regions>/<slot>`) at
/// [`hami_shared::names::KAI_REGION_DIR`].
#[must_use]
pub fn region_mount(regions_dir: &Path, slot: &str) -> v1beta1::Mount {
    v1beta1::Mount {
        container_path: hami_shared::names::KAI_REGION_DIR.to_owned(),
        host_path: regions_dir.join(slot).display().to_string(),
        read_only: false,
    }
}

/// `Allocate`'s answer for `request` over the hook as found: the same read-only mounts for every
/// container and, with `regions_dir`, its slot's region folder read-write; a device ID that is
/// not one of the `slots` is refused, naming it.
///
/// # Errors
/// `InvalidArgument` for an ID that is not ours, or a container asking for none.
pub fn allocate_response(
    hook: &HookFiles,
    slots: u32,
    regions_dir: Option<&Path>,
    request: &v1beta1::AllocateRequest,
) -> Result<v1beta1::AllocateResponse, Status> {
    let mut container_responses = Vec::with_capacity(request.container_requests.len());
    for container in &request.container_requests {
        if container.devices_ids.is_empty() {
            return Err(Status::invalid_argument(
                "a container request with no hami.io/preload device",
            ));
        }
        if let Some(id) = container.devices_ids.iter().find(|id| !is_slot(id, slots)) {
            return Err(Status::invalid_argument(format!(
                "device {id:?} is not advertised by the hami.io/preload plugin ({SLOT_PREFIX}0 … {SLOT_PREFIX}{})",
                slots.saturating_sub(1)
            )));
        }
        let mut mounts = mounts(hook);
        if let Some(dir) = regions_dir
            && let Some(slot) = region_slot(&container.devices_ids)
        {
            mounts.push(region_mount(dir, slot));
        }
        container_responses.push(v1beta1::ContainerAllocateResponse {
            mounts,
            ..Default::default()
        });
    }
    Ok(v1beta1::AllocateResponse {
        container_responses,
    })
}

/// The plugin: the hook folder it hands out and how many slots it advertises.
#[derive(Debug, Clone)]
pub struct PreloadPlugin {
    /// `HOOK/vgpu`.
    pub vgpu_dir: PathBuf,
    /// Slots advertised.
    pub slots: u32,
    /// The slots' region folders (`HOOK/regions`), when KAI containers get one.
    pub regions: Option<Arc<crate::regions::slots::SlotFolders>>,
}

impl ServedPlugin for PreloadPlugin {
    type Service = PreloadService;

    fn options(&self) -> v1beta1::DevicePluginOptions {
        // Every slot is the same: nothing to prefer, nothing to do before a start.
        v1beta1::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: false,
        }
    }

    fn service(self: &Arc<Self>, stop: watch::Receiver<bool>) -> PreloadService {
        PreloadService {
            plugin: Arc::clone(self),
            stop,
        }
    }
}

/// The gRPC service of one bound socket.
#[derive(Debug, Clone)]
pub struct PreloadService {
    plugin: Arc<PreloadPlugin>,
    stop: watch::Receiver<bool>,
}

type SlotStream =
    Pin<Box<dyn Stream<Item = Result<v1beta1::ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl v1beta1::device_plugin_server::DevicePlugin for PreloadService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<v1beta1::Empty>,
    ) -> Result<Response<v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(self.plugin.options()))
    }

    type ListAndWatchStream = SlotStream;

    async fn list_and_watch(
        &self,
        _request: Request<v1beta1::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let first = v1beta1::ListAndWatchResponse {
            devices: slot_devices(self.plugin.slots),
        };
        // The list never changes: send it, then hold the stream open until the socket stops.
        let mut stop = self.stop.clone();
        let end = futures::stream::once(async move {
            let _ = stop.wait_for(|s| *s).await;
            None
        });
        let stream = futures::StreamExt::filter_map(
            futures::StreamExt::chain(futures::stream::once(async move { Some(Ok(first)) }), end),
            |item| async move { item },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<v1beta1::PreferredAllocationResponse>, Status> {
        // Not announced; should kubelet ask anyway, the first available slots.
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| v1beta1::ContainerPreferredAllocationResponse {
                device_i_ds: c
                    .available_device_i_ds
                    .into_iter()
                    .take(usize::try_from(c.allocation_size).unwrap_or(0))
                    .collect(),
            })
            .collect();
        Ok(Response::new(v1beta1::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let request = request.into_inner();
        let hook = inspect_hook(&self.plugin.vgpu_dir).map_err(|error| {
            tracing::error!(%error, "hami.io/preload: container refused");
            Status::failed_precondition(format!(
                "hami.io/preload: HAMi-core cannot be mounted: {error}"
            ))
        })?;
        let regions = self.plugin.regions.as_deref();
        let response = allocate_response(
            &hook,
            self.plugin.slots,
            regions.map(|r| r.regions_dir.as_path()),
            &request,
        )?;
        if let Some(regions) = regions {
            // Only once every ID was checked: each slot's folder made anew, empty.
            for container in &request.container_requests {
                let Some(slot) = region_slot(&container.devices_ids) else {
                    continue;
                };
                crate::regions::slots::prepare_slot(&regions.regions_dir, slot).map_err(
                    |error| {
                        tracing::error!(%error, slot, "hami.io/preload: region folder not made");
                        Status::failed_precondition(format!(
                            "hami.io/preload: the container's region folder cannot be made: {error}"
                        ))
                    },
                )?;
                regions.allocated(slot);
            }
        }
        tracing::info!(
            containers = response.container_responses.len(),
            node_gpus = hook.node_gpus,
            "hami.io/preload: hook mounted"
        );
        Ok(Response::new(response))
    }

    async fn pre_start_container(
        &self,
        _request: Request<v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<v1beta1::PreStartContainerResponse>, Status> {
        Ok(Response::new(v1beta1::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids_are_ours_only_in_range_and_canonical() {
        let devices = slot_devices(3);
        let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["preload-0", "preload-1", "preload-2"]);
        assert!(devices.iter().all(|d| d.health == api::HEALTHY));
        for id in ids {
            assert!(is_slot(id, 3), "{id}");
        }
        for id in [
            "preload-3",
            "preload-",
            "preload-01",
            "preload--1",
            "preload-+1",
            "preload-1 ",
            "GPU-0",
            "",
            "preload-99999999999",
        ] {
            assert!(!is_slot(id, 3), "{id:?}");
        }
        assert!(slot_devices(0).is_empty());
    }

    fn hook(node_gpus: bool) -> HookFiles {
        HookFiles {
            vgpu_dir: PathBuf::from("/usr/local/vgpu"),
            node_gpus,
        }
    }

    fn request(containers: &[&[&str]]) -> v1beta1::AllocateRequest {
        v1beta1::AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| v1beta1::ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn every_container_gets_the_same_read_only_mounts() {
        let response = allocate_response(
            &hook(true),
            4,
            None,
            &request(&[&["preload-0"], &["preload-3", "preload-1"]]),
        )
        .unwrap();
        assert_eq!(response.container_responses.len(), 2);
        let expected = [
            (
                "/usr/local/vgpu/libhami_preload.so",
                "/usr/local/vgpu/libhami_preload.so",
            ),
            ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so"),
            ("/usr/local/vgpu/node-gpus", "/usr/local/vgpu/node-gpus"),
            ("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload"),
        ];
        for c in &response.container_responses {
            let got: Vec<(&str, &str)> = c
                .mounts
                .iter()
                .map(|m| (m.container_path.as_str(), m.host_path.as_str()))
                .collect();
            assert_eq!(got, expected);
            assert!(c.mounts.iter().all(|m| m.read_only));
            // Nothing else: no variables, no devices, no annotations.
            assert!(c.envs.is_empty() && c.devices.is_empty() && c.annotations.is_empty());
        }
        // Without a node GPU file, no mount of it.
        let response =
            allocate_response(&hook(false), 4, None, &request(&[&["preload-2"]])).unwrap();
        assert!(
            !response.container_responses[0]
                .mounts
                .iter()
                .any(|m| m.host_path.ends_with("node-gpus"))
        );
    }

    #[test]
    fn each_container_gets_its_lowest_slots_region_folder_read_write() {
        let regions = Path::new("/usr/local/regions");
        let response = allocate_response(
            &hook(true),
            16,
            Some(regions),
            &request(&[&["preload-0"], &["preload-10", "preload-9"]]),
        )
        .unwrap();
        let region_mounts: Vec<(&str, &str, bool)> = response
            .container_responses
            .iter()
            .map(|c| {
                let m = c.mounts.last().unwrap();
                (m.container_path.as_str(), m.host_path.as_str(), m.read_only)
            })
            .collect();
        assert_eq!(
            region_mounts,
            [
                (
                    "/var/lib/hami-limits/region",
                    "/usr/local/regions/preload-0",
                    false
                ),
                (
                    "/var/lib/hami-limits/region",
                    "/usr/local/regions/preload-9",
                    false
                ),
            ]
        );
        // Every other mount stays read-only.
        for c in &response.container_responses {
            assert_eq!(c.mounts.iter().filter(|m| !m.read_only).count(), 1);
        }
    }

    #[test]
    fn ids_not_ours_are_refused_by_name() {
        let e = allocate_response(
            &hook(true),
            4,
            None,
            &request(&[&["preload-0"], &["GPU-x-0"]]),
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("\"GPU-x-0\""), "{}", e.message());
        let e = allocate_response(&hook(true), 4, None, &request(&[&["preload-4"]])).unwrap_err();
        assert!(
            e.message().contains("preload-0 … preload-3"),
            "{}",
            e.message()
        );
        let e = allocate_response(&hook(true), 4, None, &request(&[&[]])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}

//! The device plugin's container folders: `<HOOK>/vgpu/containers/<pod-uid>_<container>`, each
//! with HAMi-core's `usage.cache` (the region, written by the container's processes) and, beside
//! it, the limits file `<pod-uid>_<container>.limits` this plugin published. Owners come from the
//! plugin's pod cache (UID → namespace and name).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use hami_shared::region::container_dirs;

use super::export::{Folder, FolderSource, LimitsAt};
use super::observe::{Owner, hami_owner};
use crate::allocation::shell::pod_lookup::cache::PodCache;

/// `<HOOK>/vgpu/containers` and the pod cache.
#[derive(Debug)]
pub struct HamiFolders {
    /// `<HOOK>/vgpu/containers`.
    pub containers_dir: PathBuf,
    /// The plugin's view of its node's pods.
    pub pods: Arc<PodCache>,
}

impl HamiFolders {
    /// The owner of the folder `name` (`<pod-uid>_<container>`) among the pods by UID.
    #[must_use]
    pub fn owner_of(name: &str, pods_by_uid: &BTreeMap<String, (String, String)>) -> Option<Owner> {
        hami_owner(name, pods_by_uid)
    }
}

impl FolderSource for HamiFolders {
    fn folders(&self) -> io::Result<Vec<Folder>> {
        let dirs = match container_dirs(&self.containers_dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other?,
        };
        Ok(dirs
            .into_iter()
            .map(|d| Folder {
                name: d.name,
                region: d.region,
                limits: Some(LimitsAt::File(d.limits)),
            })
            .collect())
    }

    fn owners(&self, folders: &[Folder]) -> BTreeMap<String, Owner> {
        let Some(uids) = self.pods.uids() else {
            return BTreeMap::new();
        };
        folders
            .iter()
            .filter_map(|f| hami_owner(&f.name, &uids).map(|o| (f.name.clone(), o)))
            .collect()
    }
}

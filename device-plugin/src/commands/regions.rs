//! `hami-device-plugin regions`: one scan of a node's container folders by the region exporter,
//! printed as the Prometheus text the plugin's `/metrics` serves for them — the same folders,
//! reader, verdicts and collector, without kubelet or the API server. For an operator on the node
//! (`kubectl debug node/…` or a shell there) and for `tests/gpu/run.sh`, which checks the
//! exporter against regions the real HAMi-core wrote.
//!
//! Owners: from `--pods FILE` (`kubectl get pods -o json` of the node), else each folder's pod
//! UID stands for its pod (namespace `-`), since the name is not on disk.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hami_shared::region::container_dirs;

use crate::regions::observe::hami_owner;
use crate::regions::{
    ExportSettings, Folder, FolderSource, LimitsAt, Owner, PidView, RegionExporter,
};

/// What `regions` is asked (its flags, as the command line parsed them).
#[derive(Debug, Clone)]
pub struct RegionsArgs {
    /// The hook path whose `vgpu/containers` folders are read (HOOK as for `run`).
    pub hook_path: PathBuf,
    /// The `node` label of the samples.
    pub node: String,
    /// A PodList (`kubectl get pods -o json`) naming the folders' pods by UID.
    pub pods: Option<PathBuf>,
    /// Whose PIDs a slot's host PID is checked against: `host` (this shell's `/proc`, for a shell
    /// on the node) or `none` (no `stale` verdict).
    pub pids: PidView,
}

/// Why `regions` printed nothing.
#[derive(Debug, thiserror::Error)]
pub enum RegionsError {
    /// The PodList cannot be read or is not one.
    #[error("--pods {path}: {reason}; accepted: the JSON of `kubectl get pods -o json`")]
    Pods {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The folder of container folders cannot be listed.
    #[error("{path}: cannot list the container folders: {source}")]
    List {
        /// `<HOOK>/vgpu/containers`.
        path: String,
        /// Why.
        source: io::Error,
    },
}

impl RegionsError {
    /// Exit status: 2 for a bad flag, 1 for a folder that cannot be read.
    #[must_use]
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Pods { .. } => 2,
            Self::List { .. } => 1,
        }
    }
}

/// `<HOOK>/vgpu/containers`, owners from a PodList or the folder names.
#[derive(Debug)]
struct OfflineFolders {
    containers_dir: PathBuf,
    /// UID → (namespace, name); empty: each folder's UID stands for its pod.
    pods: BTreeMap<String, (String, String)>,
}

impl FolderSource for OfflineFolders {
    fn folders(&self) -> io::Result<Vec<Folder>> {
        Ok(container_dirs(&self.containers_dir)?
            .into_iter()
            .map(|d| Folder {
                name: d.name,
                region: d.region,
                limits: Some(LimitsAt::File(d.limits)),
            })
            .collect())
    }

    fn owners(&self, folders: &[Folder]) -> BTreeMap<String, Owner> {
        folders
            .iter()
            .filter_map(|f| {
                let owner = if self.pods.is_empty() {
                    let uid = f.name.split_once('_')?.0;
                    let by_uid =
                        BTreeMap::from([(uid.to_owned(), ("-".to_owned(), uid.to_owned()))]);
                    hami_owner(&f.name, &by_uid)
                } else {
                    hami_owner(&f.name, &self.pods)
                };
                owner.map(|o| (f.name.clone(), o))
            })
            .collect()
    }
}

/// UID → (namespace, name) of a PodList's items.
fn read_pods(path: &Path) -> Result<BTreeMap<String, (String, String)>, RegionsError> {
    let bad = |reason: String| RegionsError::Pods {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let list: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let items = list["items"]
        .as_array()
        .ok_or_else(|| bad("no items array".to_owned()))?;
    let mut pods = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let meta = &item["metadata"];
        let field = |name: &str| {
            meta[name]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("items[{i}].metadata.{name} is missing")))
        };
        pods.insert(field("uid")?, (field("namespace")?, field("name")?));
    }
    Ok(pods)
}

/// One scan of `<HOOK>/vgpu/containers`, as the exporter's Prometheus text.
///
/// # Errors
/// [`RegionsError`] for a PodList that cannot be read, or a folder that cannot be listed.
pub fn regions(args: &RegionsArgs) -> Result<String, RegionsError> {
    let pods = match &args.pods {
        Some(path) => read_pods(path)?,
        None => BTreeMap::new(),
    };
    let containers_dir = args
        .hook_path
        .join(hami_shared::names::VGPU_DIR)
        .join(hami_shared::names::CONTAINERS_DIR);
    if let Err(source) = std::fs::read_dir(&containers_dir) {
        return Err(RegionsError::List {
            path: containers_dir.display().to_string(),
            source,
        });
    }
    let source = Arc::new(OfflineFolders {
        containers_dir,
        pods,
    });
    let settings = ExportSettings {
        pids: args.pids,
        ..ExportSettings::default()
    };
    let exporter = RegionExporter::new(&args.node, source, settings, None);
    exporter.scan(None);
    let registry = exporter.registry();
    Ok(hami_ops::encode(
        &registry,
        hami_ops::Exposition::Prometheus,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_shared::region::fixture::{FixtureSlot, RegionFixture};
    use hami_shared::region::layout::V1_2;

    const UID: &str = "0b0c0d0e-0000-4000-8000-000000000001";

    /// A hook path with one container folder: its region (`region`: bytes, `None`: empty file)
    /// and a 3000 MiB limits file.
    fn hook(region: Option<Vec<u8>>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let containers = dir.path().join("vgpu/containers");
        let folder = containers.join(format!("{UID}_main"));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("usage.cache"), region.unwrap_or_default()).unwrap();
        std::fs::write(
            containers.join(format!("{UID}_main.limits")),
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nHAMI_LIMITS_FORMAT=1\n",
        )
        .unwrap();
        dir
    }

    fn args(hook: &Path) -> RegionsArgs {
        RegionsArgs {
            hook_path: hook.to_path_buf(),
            node: "n1".to_owned(),
            pods: None,
            pids: PidView::None,
        }
    }

    fn verdict_line(text: &str) -> &str {
        text.lines()
            .find(|l| l.starts_with("hami_limits_region_cap_verdict{"))
            .unwrap_or_else(|| panic!("no verdict in {text}"))
    }

    #[test]
    fn each_verdict_as_the_exporter_serves_it() {
        let slot = FixtureSlot::running(7, 7, 0, 500 << 20, 1500 << 20);
        let mut capped = RegionFixture::new(&V1_2).with_limit_all(0);
        capped.limit[0] = 3000 << 20;
        capped.procs = vec![slot.clone()];
        let mut uncapped = RegionFixture::new(&V1_2);
        uncapped.procs = vec![slot];
        for (region, want) in [
            (None, "no-region"),
            (Some(capped.bytes()), "capped"),
            (Some(uncapped.bytes()), "uncapped"),
        ] {
            let dir = hook(region);
            let text = regions(&args(dir.path())).unwrap();
            let line = verdict_line(&text);
            assert!(line.contains(&format!("verdict=\"{want}\"")), "{line}");
            assert!(
                line.contains(&format!(
                    "podnamespace=\"-\",podname=\"{UID}\",ctrname=\"main\""
                )),
                "{line}"
            );
        }
    }

    #[test]
    fn owners_from_a_pod_list_and_errors_name_the_flag() {
        let dir = hook(None);
        let pods = dir.path().join("pods.json");
        std::fs::write(
            &pods,
            format!(r#"{{"items":[{{"metadata":{{"uid":"{UID}","namespace":"team","name":"train"}}}}]}}"#),
        )
        .unwrap();
        let mut a = args(dir.path());
        a.pods = Some(pods.clone());
        let text = regions(&a).unwrap();
        assert!(verdict_line(&text).contains(r#"podnamespace="team",podname="train""#));
        std::fs::write(&pods, r#"{"items":[{"metadata":{"uid":"x"}}]}"#).unwrap();
        let e = regions(&a).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string()
                .contains("items[0].metadata.namespace is missing"),
            "{e}"
        );
        let e = regions(&args(&dir.path().join("nothing"))).unwrap_err();
        assert_eq!(e.exit_code(), 1);
    }
}

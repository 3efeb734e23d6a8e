//! `hami-device-plugin install-hook`: the pure plan, the installation on real files in temporary
//! directories, and the binary as a user runs it.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use hami_device_plugin::commands::install_hook::{
    EntryKind, FileSource, FoundEntry, GpuListing, GpuSource, InstallHookArgs, InstallHookError,
    InstallPlan, InstallReport, NoNodeGpus, NodeGpusPlan, NodeGpusReport, Outcome, execute,
    install_hook, ld_so_preload_contents, normalise_hook_path, plan_install,
};
use hami_device_plugin::gpu::inventory::{Gpu, GpuInventory, parse_inventory};
use hami_device_plugin::gpu::nvml::NvmlInventory;
use hami_publish::PUBLISHED_MODE;

/// Bytes that pass for a shared object: the ELF magic, then `tag`.
fn elf(tag: &str) -> Vec<u8> {
    let mut bytes = b"\x7fELF\x02\x01\x01\0".to_vec();
    bytes.extend_from_slice(tag.as_bytes());
    bytes
}

/// A temporary directory with `core/` (HAMi-core's folder, holding `core_files`), `preload.so`
/// (the preload library), `gpus.yaml` (the inventory file; empty: no node GPU file, whatever the
/// machine's NVML says) and `hook/` (not created: the hook path).
struct Setup {
    tmp: tempfile::TempDir,
}

impl Setup {
    fn new(core_files: &[(&str, &[u8])]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("core")).unwrap();
        for (name, bytes) in core_files {
            fs::write(tmp.path().join("core").join(name), bytes).unwrap();
        }
        fs::write(tmp.path().join("preload.so"), elf("preload")).unwrap();
        fs::write(tmp.path().join("gpus.yaml"), "[]\n").unwrap();
        Self { tmp }
    }
    fn inventory(&self) -> PathBuf {
        self.tmp.path().join("gpus.yaml")
    }
    fn core(&self) -> PathBuf {
        self.tmp.path().join("core")
    }
    fn preload(&self) -> PathBuf {
        self.tmp.path().join("preload.so")
    }
    fn hook(&self) -> PathBuf {
        self.tmp.path().join("hook")
    }
    fn vgpu(&self) -> PathBuf {
        self.hook().join("vgpu")
    }
    fn args(&self) -> InstallHookArgs {
        InstallHookArgs {
            hami_core_dir: self.core(),
            preload: self.preload(),
            hook_path: self.hook(),
            inventory: Some(self.inventory()),
        }
    }
    fn install(&self) -> Result<InstallReport, InstallHookError> {
        install_hook(&self.args())
    }
    /// The binary with `--hami-core-dir`, `--preload`, `--hook-path` and `extra`.
    fn cli(&self, hook: &Path) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
            .arg("install-hook")
            .arg("--hami-core-dir")
            .arg(self.core())
            .arg("--preload")
            .arg(self.preload())
            .arg("--hook-path")
            .arg(hook)
            .arg("--inventory")
            .arg(self.inventory())
            .env_remove("HOOK_PATH")
            .env_remove("HAMI_HOOK_PATH")
            .env_remove("HAMI_INVENTORY")
            .output()
            .unwrap()
    }
    /// Replaces the inventory file's text.
    fn set_inventory(&self, text: &str) {
        fs::write(self.inventory(), text).unwrap();
    }
    fn node_file(&self) -> PathBuf {
        self.vgpu().join("node-gpus")
    }
    /// The generated list for this hook path, exactly.
    fn expected_list(&self) -> String {
        let vgpu = self.vgpu().display().to_string();
        format!("{vgpu}/libhami_preload.so\n{vgpu}/libvgpu.so\n")
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `HOOK/vgpu/ld.so.preload`, when present, names only regular, non-empty files: a container
/// mounting it never gets a loader error.
fn assert_list_names_existing_libraries(vgpu: &Path) {
    let list = vgpu.join("ld.so.preload");
    let Ok(text) = fs::read_to_string(&list) else {
        return;
    };
    assert!(text.ends_with('\n'), "{text:?}");
    for line in text.lines() {
        let meta = fs::metadata(line).unwrap_or_else(|e| panic!("{line}: {e} (list {text:?})"));
        assert!(meta.is_file() && meta.len() > 0, "{line} (list {text:?})");
    }
}

fn assert_no_temporaries(dir: &Path) {
    let leftovers: Vec<String> = names(dir)
        .into_iter()
        .filter(|n| n.contains(".hami-tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn outcomes(report: &InstallReport) -> Vec<(String, Outcome)> {
    report
        .files
        .iter()
        .map(|f| {
            (
                f.path.file_name().unwrap().to_string_lossy().into_owned(),
                f.outcome,
            )
        })
        .collect()
}

fn all(outcome: Outcome) -> Vec<(String, Outcome)> {
    ["libvgpu.so", "libhami_preload.so", "ld.so.preload"]
        .into_iter()
        .map(|n| (n.to_owned(), outcome))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The pure plan
// ---------------------------------------------------------------------------------------------

/// A GPU source that lists nothing: the plan publishes no node GPU file.
fn no_gpus() -> GpuListing {
    GpuListing::Listed {
        source: GpuSource::Nvml,
        gpus: Vec::new(),
    }
}

fn found(name: &str, kind: EntryKind, symlink: bool, ino: u64) -> FoundEntry {
    FoundEntry {
        name: name.into(),
        path: Path::new("/img/lib").join(name),
        kind,
        symlink,
        identity: (kind != EntryKind::Dangling).then_some((1, ino)),
    }
}

#[test]
fn plan_orders_the_libraries_before_the_list_it_generates() {
    let scan = [
        found("libvgpu.so.v2.10.0", EntryKind::File, false, 7),
        found("ld.so.preload", EntryKind::File, false, 8),
    ];
    let plan = plan_install(
        &scan,
        Path::new("/img/lib"),
        Path::new("/hl/libhami_preload.so"),
        Path::new("/opt/hami/"),
        no_gpus(),
    )
    .unwrap();
    assert_eq!(plan.hook_path, Path::new("/opt/hami"));
    assert_eq!(plan.vgpu_dir, Path::new("/opt/hami/vgpu"));
    assert_eq!(plan.containers_dir, Path::new("/opt/hami/vgpu/containers"));
    let files: Vec<(&Path, &FileSource)> = plan
        .files
        .iter()
        .map(|f| (f.dest.as_path(), &f.source))
        .collect();
    assert_eq!(
        files,
        [
            (
                Path::new("/opt/hami/vgpu/libvgpu.so"),
                &FileSource::Copy("/img/lib/libvgpu.so.v2.10.0".into())
            ),
            (
                Path::new("/opt/hami/vgpu/libhami_preload.so"),
                &FileSource::Copy("/hl/libhami_preload.so".into())
            ),
            (
                Path::new("/opt/hami/vgpu/ld.so.preload"),
                &FileSource::Generated(
                    "/opt/hami/vgpu/libhami_preload.so\n/opt/hami/vgpu/libvgpu.so\n".into()
                )
            ),
        ]
    );
}

#[test]
fn plan_selects_exactly_one_library() {
    let plan = |scan: &[FoundEntry]| {
        plan_install(
            scan,
            Path::new("/img/lib"),
            Path::new("/p.so"),
            Path::new("/usr/local"),
            no_gpus(),
        )
    };
    let source = |scan: &[FoundEntry]| match &plan(scan).unwrap().files[0].source {
        FileSource::Copy(p) => p.clone(),
        other => panic!("{other:?}"),
    };
    // Plain name only.
    assert_eq!(
        source(&[found("libvgpu.so", EntryKind::File, false, 1)]),
        Path::new("/img/lib/libvgpu.so")
    );
    // A symbolic link to the versioned file is the same library: the real name is used.
    assert_eq!(
        source(&[
            found("libvgpu.so", EntryKind::File, true, 1),
            found("libvgpu.so.v2.10.0", EntryKind::File, false, 1),
        ]),
        Path::new("/img/lib/libvgpu.so.v2.10.0")
    );
    // A lone symbolic link to a regular file is followed.
    assert_eq!(
        source(&[found("libvgpu.so.v2.10.0", EntryKind::File, true, 1)]),
        Path::new("/img/lib/libvgpu.so.v2.10.0")
    );
    // Names that are not candidates are ignored.
    assert_eq!(
        source(&[
            found("libvgpu.so.v2.10.0", EntryKind::File, false, 1),
            found("libvgpu.so.", EntryKind::File, false, 2),
            found("libvgpu.sox", EntryKind::File, false, 3),
            found(".libvgpu.so.hami-tmp.1.0.0", EntryKind::File, false, 4),
        ]),
        Path::new("/img/lib/libvgpu.so.v2.10.0")
    );

    let err = plan(&[
        found("libvgpu.so", EntryKind::File, false, 1),
        found("libvgpu.so.v2.10.0", EntryKind::File, false, 2),
    ])
    .unwrap_err();
    assert!(matches!(err, InstallHookError::Ambiguous { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("/img/lib (--hami-core-dir): libvgpu.so, libvgpu.so.v2.10.0;"),
        "{err}"
    );

    let err = plan(&[found("ld.so.preload", EntryKind::File, false, 1)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no HAMi-core library in /img/lib (--hami-core-dir): expected libvgpu.so or one \
         libvgpu.so.<version>; found ld.so.preload"
    );
    let err = plan(&[]).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("found nothing (the directory is empty)"),
        "{err}"
    );

    for kind in [
        EntryKind::Directory,
        EntryKind::Special,
        EntryKind::Dangling,
    ] {
        let err = plan(&[found("libvgpu.so", kind, false, 1)]).unwrap_err();
        assert!(
            matches!(&err, InstallHookError::NotARegularFile { path, .. } if path == Path::new("/img/lib/libvgpu.so")),
            "{kind:?}: {err}"
        );
    }
    // Even beside a good candidate.
    let err = plan(&[
        found("libvgpu.so", EntryKind::Directory, false, 1),
        found("libvgpu.so.v2.10.0", EntryKind::File, false, 2),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("a directory"), "{err}");
}

#[test]
fn hook_path_is_validated_and_normalised() {
    for (given, normal) in [
        ("/usr/local", "/usr/local"),
        ("/usr/local/", "/usr/local"),
        ("/opt//hami/./x//", "/opt/hami/x"),
        ("/", "/"),
    ] {
        assert_eq!(
            normalise_hook_path(Path::new(given)).unwrap(),
            Path::new(normal),
            "{given}"
        );
    }
    assert_eq!(
        ld_so_preload_contents(Path::new("/vgpu")),
        "/vgpu/libhami_preload.so\n/vgpu/libvgpu.so\n"
    );
    for bad in [
        "",
        "usr/local",
        "./hook",
        "/usr/../etc",
        "/usr/local/..",
        "/my hook",
        "/hook\n/etc",
        "/hook\t",
        "/a:b",
    ] {
        let err = normalise_hook_path(Path::new(bad)).unwrap_err();
        assert!(
            matches!(&err, InstallHookError::InvalidHookPath { value, .. } if value == bad),
            "{bad:?}: {err}"
        );
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Installation on real files
// ---------------------------------------------------------------------------------------------

#[test]
fn plain_libvgpu_is_installed_with_0644_files_and_0755_directories() {
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    let report = s.install().unwrap();
    assert_eq!(outcomes(&report), all(Outcome::Installed));
    assert_eq!(report.created_dirs, [s.vgpu(), s.vgpu().join("containers")]);
    assert_eq!(report.removed_temporaries, 0);
    let vgpu = s.vgpu();
    assert_eq!(fs::read(vgpu.join("libvgpu.so")).unwrap(), elf("core"));
    assert_eq!(
        fs::read(vgpu.join("libhami_preload.so")).unwrap(),
        elf("preload")
    );
    assert_eq!(
        fs::read_to_string(vgpu.join("ld.so.preload")).unwrap(),
        s.expected_list()
    );
    for f in ["libvgpu.so", "libhami_preload.so", "ld.so.preload"] {
        assert!(fs::symlink_metadata(vgpu.join(f)).unwrap().is_file(), "{f}");
        assert_eq!(mode(&vgpu.join(f)), 0o644, "{f}");
    }
    assert_eq!(mode(&vgpu), 0o755);
    assert_eq!(mode(&vgpu.join("containers")), 0o755);
    assert_eq!(
        names(&vgpu),
        [
            "containers",
            "ld.so.preload",
            "libhami_preload.so",
            "libvgpu.so"
        ]
    );
    assert_list_names_existing_libraries(&vgpu);
    // The report lines.
    let lines: Vec<String> = report.files.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            format!(
                "installed {}/libvgpu.so (from {}/libvgpu.so, {} bytes)",
                vgpu.display(),
                s.core().display(),
                elf("core").len()
            ),
            format!(
                "installed {}/libhami_preload.so (from {}, {} bytes)",
                vgpu.display(),
                s.preload().display(),
                elf("preload").len()
            ),
            format!(
                "installed {}/ld.so.preload (generated, {} bytes)",
                vgpu.display(),
                s.expected_list().len()
            ),
        ]
    );
}

#[test]
fn hami_folder_with_a_versioned_library_and_a_stale_image_list() {
    // What HAMi's image carries: only the versioned name, and a list for /usr/local.
    let s = Setup::new(&[
        ("libvgpu.so.v2.10.0", &elf("core-2.10")),
        ("ld.so.preload", b"/usr/local/vgpu/libvgpu.so\n"),
    ]);
    let report = s.install().unwrap();
    assert_eq!(outcomes(&report), all(Outcome::Installed));
    assert_eq!(
        report.files[0].from.as_deref(),
        Some(s.core().join("libvgpu.so.v2.10.0").as_path())
    );
    let vgpu = s.vgpu();
    assert_eq!(fs::read(vgpu.join("libvgpu.so")).unwrap(), elf("core-2.10"));
    let list = fs::read_to_string(vgpu.join("ld.so.preload")).unwrap();
    assert_eq!(list, s.expected_list());
    assert!(!list.contains("/usr/local/vgpu"), "{list}");
    // Only the plain name is installed (the plan mounts HOOK/vgpu/libvgpu.so).
    assert!(!vgpu.join("libvgpu.so.v2.10.0").exists());
    assert_list_names_existing_libraries(&vgpu);
}

#[test]
fn symbolic_links_in_the_hami_core_dir_are_followed() {
    let s = Setup::new(&[("libvgpu.so.v2.10.0", &elf("core"))]);
    // libvgpu.so -> libvgpu.so.v2.10.0: one library under two names.
    symlink("libvgpu.so.v2.10.0", s.core().join("libvgpu.so")).unwrap();
    let report = s.install().unwrap();
    assert_eq!(
        report.files[0].from.as_deref(),
        Some(s.core().join("libvgpu.so.v2.10.0").as_path())
    );
    assert_eq!(fs::read(s.vgpu().join("libvgpu.so")).unwrap(), elf("core"));
    // The installed file is a copy, not a link.
    assert!(
        fs::symlink_metadata(s.vgpu().join("libvgpu.so"))
            .unwrap()
            .is_file()
    );

    // A lone link to a file elsewhere; the preload library behind a link too.
    let t = Setup::new(&[]);
    fs::write(t.tmp.path().join("real.so"), elf("linked")).unwrap();
    symlink(
        t.tmp.path().join("real.so"),
        t.core().join("libvgpu.so.v2.11.0"),
    )
    .unwrap();
    fs::rename(t.preload(), t.tmp.path().join("preload-real.so")).unwrap();
    symlink(t.tmp.path().join("preload-real.so"), t.preload()).unwrap();
    t.install().unwrap();
    assert_eq!(
        fs::read(t.vgpu().join("libvgpu.so")).unwrap(),
        elf("linked")
    );
    assert_eq!(
        fs::read(t.vgpu().join("libhami_preload.so")).unwrap(),
        elf("preload")
    );
}

#[test]
fn no_library_and_ambiguous_folders_are_refused_naming_what_was_found() {
    let s = Setup::new(&[("ld.so.preload", b"/usr/local/vgpu/libvgpu.so\n")]);
    let err = s.install().unwrap_err();
    assert!(matches!(err, InstallHookError::NoLibrary { .. }), "{err}");
    assert!(err.to_string().contains(&s.core().display().to_string()));
    assert!(err.to_string().ends_with("found ld.so.preload"), "{err}");
    assert!(!s.hook().exists(), "nothing written");

    let s = Setup::new(&[
        ("libvgpu.so.v2.9.0", &elf("a")),
        ("libvgpu.so.v2.10.0", &elf("b")),
    ]);
    let err = s.install().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("libvgpu.so.v2.10.0, libvgpu.so.v2.9.0"),
        "{text}"
    );
    assert!(!s.hook().exists(), "nothing written");

    let s = Setup::new(&[("libvgpu.so", &elf("a")), ("libvgpu.so.v2.10.0", &elf("b"))]);
    let err = s.install().unwrap_err();
    assert!(
        err.to_string().contains("libvgpu.so, libvgpu.so.v2.10.0"),
        "{err}"
    );
    assert!(!s.hook().exists(), "nothing written");

    // A directory named libvgpu.so.
    let s = Setup::new(&[]);
    fs::create_dir(s.core().join("libvgpu.so")).unwrap();
    let err = s.install().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}/libvgpu.so: a directory, not a regular file",
            s.core().display()
        )
    );
    assert!(!s.hook().exists(), "nothing written");

    // A missing folder.
    let mut args = s.args();
    args.hami_core_dir = s.tmp.path().join("missing");
    let err = install_hook(&args).unwrap_err();
    assert!(
        err.to_string().contains("missing (--hami-core-dir)"),
        "{err}"
    );
}

#[test]
fn bad_sources_are_refused_before_anything_is_written() {
    type Break = fn(&Setup);
    let cases: [(&str, Break, &str); 6] = [
        (
            "core not ELF",
            |s| fs::write(s.core().join("libvgpu.so"), b"#!/bin/sh\n").unwrap(),
            "core/libvgpu.so is not an ELF file",
        ),
        (
            "core empty",
            |s| fs::write(s.core().join("libvgpu.so"), b"").unwrap(),
            "core/libvgpu.so is empty",
        ),
        (
            "preload not ELF",
            |s| fs::write(s.preload(), b"\x7fEL").unwrap(),
            "preload.so is not an ELF file",
        ),
        (
            "preload empty",
            |s| fs::write(s.preload(), b"").unwrap(),
            "preload.so is empty",
        ),
        (
            "preload missing",
            |s| fs::remove_file(s.preload()).unwrap(),
            "cannot read ",
        ),
        (
            "preload a directory",
            |s| {
                fs::remove_file(s.preload()).unwrap();
                fs::create_dir(s.preload()).unwrap();
            },
            "preload.so: a directory, not a regular file",
        ),
    ];
    for (what, break_it, message) in cases {
        let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
        break_it(&s);
        let err = s.install().unwrap_err();
        let text = err.to_string();
        assert!(text.contains(message), "{what}: {text}");
        assert!(
            text.contains(&s.tmp.path().display().to_string()),
            "{what}: names the path: {text}"
        );
        assert_eq!(err.exit_code(), 1, "{what}");
        assert!(!s.hook().exists(), "{what}: nothing written");
    }
}

#[test]
fn a_second_run_is_unchanged_and_an_update_replaces_by_rename() {
    let s = Setup::new(&[("libvgpu.so.v2.10.0", &elf("old"))]);
    s.install().unwrap();
    let vgpu = s.vgpu();
    let inode = |name: &str| fs::metadata(vgpu.join(name)).unwrap().ino();
    let before: Vec<u64> = ["libvgpu.so", "libhami_preload.so", "ld.so.preload"]
        .into_iter()
        .map(inode)
        .collect();

    let report = s.install().unwrap();
    assert_eq!(outcomes(&report), all(Outcome::Unchanged));
    assert!(report.created_dirs.is_empty());
    assert!(report.files[0].to_string().starts_with("unchanged "));
    let after: Vec<u64> = ["libvgpu.so", "libhami_preload.so", "ld.so.preload"]
        .into_iter()
        .map(inode)
        .collect();
    assert_eq!(before, after, "nothing rewritten");
    assert_eq!(
        fs::read_to_string(vgpu.join("ld.so.preload")).unwrap(),
        s.expected_list()
    );

    // A new HAMi-core: only libvgpu.so changes, by rename; a process holding the old file (a
    // running container maps it) still reads the old bytes.
    let mut held = fs::File::open(vgpu.join("libvgpu.so")).unwrap();
    fs::remove_file(s.core().join("libvgpu.so.v2.10.0")).unwrap();
    fs::write(s.core().join("libvgpu.so.v2.11.0"), elf("new")).unwrap();
    let report = s.install().unwrap();
    assert_eq!(
        outcomes(&report),
        [
            ("libvgpu.so".to_owned(), Outcome::Installed),
            ("libhami_preload.so".to_owned(), Outcome::Unchanged),
            ("ld.so.preload".to_owned(), Outcome::Unchanged),
        ]
    );
    assert_ne!(inode("libvgpu.so"), before[0], "replaced, not rewritten");
    assert_eq!(fs::read(vgpu.join("libvgpu.so")).unwrap(), elf("new"));
    let mut old = Vec::new();
    held.read_to_end(&mut old).unwrap();
    assert_eq!(old, elf("old"));

    // Same bytes but the wrong mode, or a symbolic link in its place: installed again.
    fs::set_permissions(
        vgpu.join("libhami_preload.so"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::remove_file(vgpu.join("ld.so.preload")).unwrap();
    fs::write(s.tmp.path().join("list"), s.expected_list()).unwrap();
    symlink(s.tmp.path().join("list"), vgpu.join("ld.so.preload")).unwrap();
    let report = s.install().unwrap();
    assert_eq!(
        outcomes(&report),
        [
            ("libvgpu.so".to_owned(), Outcome::Unchanged),
            ("libhami_preload.so".to_owned(), Outcome::Installed),
            ("ld.so.preload".to_owned(), Outcome::Installed),
        ]
    );
    assert_eq!(mode(&vgpu.join("libhami_preload.so")), 0o644);
    assert!(
        fs::symlink_metadata(vgpu.join("ld.so.preload"))
            .unwrap()
            .is_file()
    );
    assert_eq!(mode(&vgpu.join("ld.so.preload")), 0o644);
}

#[test]
fn an_existing_stale_list_is_replaced_for_this_hook_path() {
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu()).unwrap();
    // What HAMi's vgpu-init would have copied for the default hook path.
    fs::write(
        s.vgpu().join("ld.so.preload"),
        "/usr/local/vgpu/libvgpu.so\n",
    )
    .unwrap();
    let report = s.install().unwrap();
    assert_eq!(report.files[2].outcome, Outcome::Installed);
    assert_eq!(
        fs::read_to_string(s.vgpu().join("ld.so.preload")).unwrap(),
        s.expected_list()
    );
    assert_eq!(report.created_dirs, [s.vgpu().join("containers")]);
}

#[test]
fn leftover_temporaries_are_removed() {
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu()).unwrap();
    for name in [
        ".libvgpu.so.hami-tmp.4242.0.17",
        ".ld.so.preload.hami-tmp.4242.1.18",
    ] {
        fs::write(s.vgpu().join(name), b"\x7fELF half").unwrap();
    }
    // Not ours: left alone.
    fs::write(s.vgpu().join("notes.txt"), b"keep").unwrap();
    let report = s.install().unwrap();
    assert_eq!(report.removed_temporaries, 2);
    assert_no_temporaries(&s.vgpu());
    assert_eq!(
        names(&s.vgpu()),
        [
            "containers",
            "ld.so.preload",
            "libhami_preload.so",
            "libvgpu.so",
            "notes.txt"
        ]
    );
}

#[test]
fn a_failure_after_a_library_leaves_no_list_naming_a_missing_library() {
    // The preload library's final name is taken by a directory: libvgpu.so is installed, the
    // preload library cannot be, and ld.so.preload is never written.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu().join("libhami_preload.so")).unwrap();
    let err = s.install().unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, InstallHookError::Install { path, .. } if *path == s.vgpu().join("libhami_preload.so")),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}/libhami_preload.so", s.vgpu().display())),
        "{text}"
    );
    assert_eq!(fs::read(s.vgpu().join("libvgpu.so")).unwrap(), elf("core"));
    assert!(!s.vgpu().join("ld.so.preload").exists());
    assert_no_temporaries(&s.vgpu());

    // With the list of an earlier (HAMi) installation there: it stays as it was, whole.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu().join("libhami_preload.so")).unwrap();
    fs::write(s.vgpu().join("libvgpu.so"), elf("previous")).unwrap();
    let previous = format!("{}/libvgpu.so\n", s.vgpu().display());
    fs::write(s.vgpu().join("ld.so.preload"), &previous).unwrap();
    s.install().unwrap_err();
    assert_eq!(
        fs::read_to_string(s.vgpu().join("ld.so.preload")).unwrap(),
        previous
    );
    assert_list_names_existing_libraries(&s.vgpu());
    assert_no_temporaries(&s.vgpu());

    // libvgpu.so's final name is a directory: nothing is installed.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu().join("libvgpu.so")).unwrap();
    let err = s.install().unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("{}/libvgpu.so", s.vgpu().display())),
        "{err}"
    );
    assert!(!s.vgpu().join("libhami_preload.so").exists());
    assert!(!s.vgpu().join("ld.so.preload").exists());
    assert_no_temporaries(&s.vgpu());

    // HOOK/vgpu is a regular file: refused before any file is written.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.hook()).unwrap();
    fs::write(s.vgpu(), b"not a directory").unwrap();
    let err = s.install().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{} exists and is not a directory", s.vgpu().display())
    );
    assert_eq!(names(&s.hook()), ["vgpu"]);
}

#[test]
fn execute_runs_a_plan_made_from_a_scan() {
    let s = Setup::new(&[("libvgpu.so.v2.10.0", &elf("core"))]);
    let scan = hami_device_plugin::commands::install_hook::scan_dir(&s.core()).unwrap();
    assert_eq!(scan.len(), 1);
    assert_eq!(scan[0].kind, EntryKind::File);
    assert!(!scan[0].symlink);
    // A trailing slash on the hook path: the list names the normalised paths.
    let hook = format!("{}/", s.hook().display());
    let plan = plan_install(&scan, &s.core(), &s.preload(), Path::new(&hook), no_gpus()).unwrap();
    let report = execute(&plan).unwrap();
    assert_eq!(outcomes(&report), all(Outcome::Installed));
    assert_eq!(
        fs::read_to_string(s.vgpu().join("ld.so.preload")).unwrap(),
        s.expected_list()
    );
}

// ---------------------------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------------------------

#[test]
fn cli_installs_prints_one_line_per_file_and_is_idempotent() {
    let s = Setup::new(&[
        ("libvgpu.so.v2.10.0", &elf("core")),
        ("ld.so.preload", b"/usr/local/vgpu/libvgpu.so\n"),
    ]);
    // A trailing slash is dropped.
    let hook = PathBuf::from(format!("{}/", s.hook().display()));
    let out = s.cli(&hook);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let vgpu = s.vgpu().display().to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with(&format!("installed {vgpu}/libvgpu.so (from ")),
        "{stdout}"
    );
    assert!(lines[0].contains("libvgpu.so.v2.10.0"), "{stdout}");
    assert!(
        lines[1].starts_with(&format!("installed {vgpu}/libhami_preload.so (from ")),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with(&format!("installed {vgpu}/ld.so.preload (generated")),
        "{stdout}"
    );
    assert_eq!(
        fs::read_to_string(s.vgpu().join("ld.so.preload")).unwrap(),
        s.expected_list()
    );
    for f in ["libvgpu.so", "libhami_preload.so", "ld.so.preload"] {
        assert_eq!(mode(&s.vgpu().join(f)), 0o644, "{f}");
    }

    let out = s.cli(&s.hook());
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines.iter().all(|l| l.starts_with("unchanged ")),
        "{stdout}"
    );
}

#[test]
fn cli_failures_exit_non_zero_naming_the_path() {
    // Two versions.
    let s = Setup::new(&[
        ("libvgpu.so.v2.9.0", &elf("a")),
        ("libvgpu.so.v2.10.0", &elf("b")),
    ]);
    let out = s.cli(&s.hook());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libvgpu.so.v2.9.0") && err.contains("libvgpu.so.v2.10.0"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    assert!(!s.hook().exists());

    // A relative hook path: a usage error.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    let out = s.cli(Path::new("relative/hook"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"relative/hook\""), "{err}");

    // A non-ELF preload library.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::write(s.preload(), b"not a library").unwrap();
    let out = s.cli(&s.hook());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{} is not an ELF file", s.preload().display())),
        "{err}"
    );
    assert!(!s.hook().exists());

    // An unwritable destination (root ignores permission bits, so a directory takes the preload
    // library's name): non-zero, the path named, libvgpu.so installed, no ld.so.preload.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu().join("libhami_preload.so")).unwrap();
    let out = s.cli(&s.hook());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}/libhami_preload.so", s.vgpu().display())),
        "{err}"
    );
    assert!(!s.vgpu().join("ld.so.preload").exists());
    assert_list_names_existing_libraries(&s.vgpu());
    assert_no_temporaries(&s.vgpu());

    // HOOK/vgpu is a file.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.hook()).unwrap();
    fs::write(s.vgpu(), b"").unwrap();
    let out = s.cli(&s.hook());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} exists and is not a directory",
            s.vgpu().display()
        )),
        "{err}"
    );
}

#[test]
fn cli_help_explains_the_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .args(["install-hook", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "--hami-core-dir <DIR>",
        "--preload <FILE>",
        "--hook-path <HOOK>",
        "libvgpu.so.<version>",
        "HOOK/vgpu/libhami_preload.so",
        "HOOK/vgpu/ld.so.preload",
        "0644",
        "\\x7fELF",
        "unchanged",
        "--inventory <FILE>",
        "HOOK/vgpu/node-gpus",
        "HAMI_NODE_GPUS_FORMAT=1",
        "NVML",
        "NVIDIA_VISIBLE_DEVICES=all",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    // Listed among the commands.
    let out = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("install-hook"));
}

// ---------------------------------------------------------------------------------------------
// The node GPU file (HOOK/vgpu/node-gpus)
// ---------------------------------------------------------------------------------------------

/// Two GPUs whose minor numbers are not their indices: GPU-aaaa (index 0) is /dev/nvidia3,
/// GPU-bbbb (index 1, minor by default the index) is /dev/nvidia1.
const TWO_GPUS: &str = "\
- {uuid: GPU-aaaa, name: NVIDIA H200, memoryMib: 143771, minor: 3}
- {uuid: GPU-bbbb, name: NVIDIA H100, memoryMib: 81559}
";

/// The node GPU file for [`TWO_GPUS`], exactly: by minor number.
const TWO_GPUS_FILE: &str = "\
HAMI_NODE_GPUS_FORMAT=1
NVIDIA1_MIB=81559
NVIDIA1_UUID=GPU-bbbb
NVIDIA3_MIB=143771
NVIDIA3_UUID=GPU-aaaa
";

fn gpu(uuid: &str, index: u32, minor: u32, memory_mib: u64) -> Gpu {
    Gpu {
        uuid: uuid.into(),
        index,
        minor,
        name: "NVIDIA H200".into(),
        memory_mib,
        numa_node: None,
        mig_enabled: false,
        healthy: true,
        mig_devices: Vec::new(),
    }
}

fn listed(gpus: Vec<Gpu>) -> GpuListing {
    GpuListing::Listed {
        source: GpuSource::InventoryFile("/etc/gpus.yaml".into()),
        gpus,
    }
}

fn plan_with(gpus: GpuListing) -> Result<InstallPlan, InstallHookError> {
    plan_install(
        &[found("libvgpu.so", EntryKind::File, false, 1)],
        Path::new("/img/lib"),
        Path::new("/p.so"),
        Path::new("/opt/hami"),
        gpus,
    )
}

fn dests(plan: &InstallPlan) -> Vec<&Path> {
    plan.files.iter().map(|f| f.dest.as_path()).collect()
}

#[test]
fn plan_publishes_the_node_gpus_after_the_libraries_and_before_the_list() {
    let plan = plan_with(listed(vec![
        gpu("GPU-aaaa", 0, 3, 143_771),
        gpu("GPU-bbbb", 1, 1, 81_559),
    ]))
    .unwrap();
    assert_eq!(
        dests(&plan),
        [
            Path::new("/opt/hami/vgpu/libvgpu.so"),
            Path::new("/opt/hami/vgpu/libhami_preload.so"),
            Path::new("/opt/hami/vgpu/node-gpus"),
            Path::new("/opt/hami/vgpu/ld.so.preload"),
        ],
        "what the list activates goes before the list"
    );
    assert_eq!(
        plan.files[2].source,
        FileSource::Generated(TWO_GPUS_FILE.to_owned())
    );
    let NodeGpusPlan::Publish { path, from, gpus } = &plan.node_gpus else {
        panic!("{:?}", plan.node_gpus)
    };
    assert_eq!(path, Path::new("/opt/hami/vgpu/node-gpus"));
    assert_eq!(from, &GpuSource::InventoryFile("/etc/gpus.yaml".into()));
    let minors: Vec<(u32, &str, u64)> = gpus
        .gpus()
        .map(|g| (g.minor, g.uuid.as_str(), g.memory_mib))
        .collect();
    assert_eq!(minors, [(1, "GPU-bbbb", 81_559), (3, "GPU-aaaa", 143_771)]);
}

#[test]
fn plan_without_a_gpu_list_withdraws_the_node_gpus() {
    let cases = [
        (
            GpuListing::NvmlUnavailable {
                reason: "libloading error".into(),
            },
            NoNodeGpus::NvmlUnavailable("libloading error".into()),
            vec![
                "NVML is not available (libloading error)",
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=utility",
                "pass --inventory FILE (env HAMI_INVENTORY)",
            ],
        ),
        (
            GpuListing::Listed {
                source: GpuSource::Nvml,
                gpus: vec![],
            },
            NoNodeGpus::NoGpu(GpuSource::Nvml),
            vec!["NVML lists no GPU", "NVIDIA_VISIBLE_DEVICES=all"],
        ),
        (
            listed(vec![]),
            NoNodeGpus::NoGpu(GpuSource::InventoryFile("/etc/gpus.yaml".into())),
            vec!["inventory file /etc/gpus.yaml lists no GPU"],
        ),
    ];
    for (listing, expected, needles) in cases {
        let plan = plan_with(listing).unwrap();
        // The libraries and the list as without any node file.
        assert_eq!(
            dests(&plan),
            [
                Path::new("/opt/hami/vgpu/libvgpu.so"),
                Path::new("/opt/hami/vgpu/libhami_preload.so"),
                Path::new("/opt/hami/vgpu/ld.so.preload"),
            ]
        );
        assert_eq!(
            plan.node_gpus,
            NodeGpusPlan::Withdraw {
                path: "/opt/hami/vgpu/node-gpus".into(),
                reason: expected.clone(),
            }
        );
        let warning = expected.to_string();
        assert!(
            warning.ends_with(
                "; until then the preload library keeps the admission-time memory cap of KAI \
                 gpu-fraction containers on this node"
            ),
            "{warning}"
        );
        for needle in needles {
            assert!(warning.contains(needle), "{needle}: {warning}");
        }
    }
}

#[test]
fn plan_refuses_a_gpu_the_file_cannot_hold_naming_it() {
    let big = hami_shared::node_gpus::MAX_MIB + 1;
    let cases = [
        (
            vec![gpu("GPU-aaaa", 0, 255, 1)],
            r#"GPU "GPU-aaaa": minor number 255 is not in 0..=254"#,
        ),
        (
            vec![gpu("GPU-aaaa", 0, 0, big)],
            &*format!(
                r#"GPU "GPU-aaaa" (minor 0): memory {big} MiB is not in 1..={}"#,
                big - 1
            ),
        ),
        (
            vec![gpu("GPU a", 0, 0, 1)],
            r#"GPU with minor 0: UUID "GPU a" is not"#,
        ),
        (
            vec![gpu("GPU-aaaa", 0, 2, 1), gpu("GPU-bbbb", 1, 2, 1)],
            r#"GPUs "GPU-aaaa" and "GPU-bbbb" both have minor number 2"#,
        ),
    ];
    for (gpus, needle) in cases {
        let err = plan_with(listed(gpus)).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, InstallHookError::NodeGpus { path, .. } if path == Path::new("/opt/hami/vgpu/node-gpus")),
            "{text}"
        );
        assert!(
            text.starts_with(
                "cannot write the GPUs of inventory file /etc/gpus.yaml into /opt/hami/vgpu/node-gpus: "
            ),
            "{text}"
        );
        assert!(text.contains(needle), "{needle}: {text}");
        assert_eq!(err.exit_code(), 1);
        assert_eq!(
            err.node_gpus_to_withdraw(),
            Some(Path::new("/opt/hami/vgpu/node-gpus"))
        );
    }

    // A GPU that reports no memory (unified memory, GB10) has no size: it is left out, and a
    // list of only such GPUs publishes nothing.
    let plan = plan_with(listed(vec![gpu("GPU-aaaa", 0, 0, 0)])).unwrap();
    assert_eq!(
        plan.node_gpus,
        NodeGpusPlan::Withdraw {
            path: "/opt/hami/vgpu/node-gpus".into(),
            reason: NoNodeGpus::NoMemory(GpuSource::InventoryFile("/etc/gpus.yaml".into())),
        }
    );
    assert!(
        NoNodeGpus::NoMemory(GpuSource::Nvml)
            .to_string()
            .contains("reports its memory (unified memory, e.g. GB10)")
    );
    let plan = plan_with(listed(vec![
        gpu("GPU-aaaa", 0, 0, 0),
        gpu("GPU-bbbb", 1, 1, 7680),
    ]))
    .unwrap();
    let NodeGpusPlan::Publish { gpus, .. } = &plan.node_gpus else {
        panic!("{plan:?}")
    };
    let uuids: Vec<&str> = gpus.gpus().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-bbbb"]);

    // A source that failed: the error names the entry.
    let failure = parse_inventory(
        Path::new("/etc/gpus.yaml"),
        "- {uuid: GPU-aaaa, name: x, memoryMib: 1, minor: 300}\n",
    )
    .unwrap_err();
    let err = plan_with(GpuListing::Failed(failure)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot list the GPUs for /opt/hami/vgpu/node-gpus: inventory file /etc/gpus.yaml: \
         GPU #0 (\"GPU-aaaa\"): minor 300 is not in 0..=254: give the entry `minor`, the N of its \
         /dev/nvidiaN"
    );
    assert_eq!(
        err.node_gpus_to_withdraw(),
        Some(Path::new("/opt/hami/vgpu/node-gpus"))
    );

    // The hook path and the library are checked first; their errors touch no node file.
    let err = plan_install(
        &[],
        Path::new("/img/lib"),
        Path::new("/p.so"),
        Path::new("/opt/hami"),
        listed(vec![gpu("GPU-aaaa", 0, 255, 1)]),
    )
    .unwrap_err();
    assert!(matches!(err, InstallHookError::NoLibrary { .. }), "{err}");
    assert_eq!(err.node_gpus_to_withdraw(), None);
}

#[test]
fn inventory_gpus_are_published_read_only_atomically_and_usable() {
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    s.set_inventory(TWO_GPUS);
    // A temporary file of an interrupted run, for the node file too.
    fs::create_dir_all(s.vgpu()).unwrap();
    fs::write(
        s.vgpu().join(".node-gpus.hami-tmp.4242.0.1"),
        "HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MI",
    )
    .unwrap();
    let report = s.install().unwrap();
    assert_eq!(report.removed_temporaries, 1);
    assert_eq!(
        outcomes(&report),
        [
            "libvgpu.so",
            "libhami_preload.so",
            "node-gpus",
            "ld.so.preload"
        ]
        .into_iter()
        .map(|n| (n.to_owned(), Outcome::Installed))
        .collect::<Vec<_>>()
    );

    let node = s.node_file();
    let bytes = fs::read(&node).unwrap();
    assert_eq!(String::from_utf8(bytes.clone()).unwrap(), TWO_GPUS_FILE);
    let meta = fs::symlink_metadata(&node).unwrap();
    assert!(meta.is_file(), "a regular file, not a link");
    assert_eq!(
        mode(&node),
        PUBLISHED_MODE,
        "read-only for everyone but its owner"
    );
    assert_eq!(
        meta.uid(),
        fs::metadata(s.vgpu()).unwrap().uid(),
        "owned like the folder"
    );
    assert_no_temporaries(&s.vgpu());
    assert_eq!(
        names(&s.vgpu()),
        [
            "containers",
            "ld.so.preload",
            "libhami_preload.so",
            "libvgpu.so",
            "node-gpus"
        ]
    );
    // What the preload library will read.
    let parsed = hami_shared::node_gpus::parse(&bytes);
    assert!(parsed.usable(), "{:?}", parsed.diagnostics);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    assert_eq!(
        (parsed.mib_for(1), parsed.mib_for(3), parsed.mib_for(0)),
        (Some(81_559), Some(143_771), None)
    );
    assert_eq!(parsed.uuids.get(&3).map(String::as_str), Some("GPU-aaaa"));

    // The report: the node file with its GPUs under it, by minor number.
    let vgpu = s.vgpu().display().to_string();
    let lines = report.lines();
    assert_eq!(
        lines[2..],
        [
            format!(
                "installed {vgpu}/node-gpus (generated from inventory file {}: 2 GPUs, {} bytes)",
                s.inventory().display(),
                TWO_GPUS_FILE.len()
            ),
            "  /dev/nvidia1 GPU-bbbb 81559 MiB".to_owned(),
            "  /dev/nvidia3 GPU-aaaa 143771 MiB".to_owned(),
            format!(
                "installed {vgpu}/ld.so.preload (generated, {} bytes)",
                s.expected_list().len()
            ),
        ]
    );
    assert!(lines[0].starts_with("installed ") && lines[0].contains("/libvgpu.so"));
    assert!(matches!(report.node_gpus, NodeGpusReport::Published { .. }));

    // Again: unchanged, not rewritten.
    let inode = fs::metadata(&node).unwrap().ino();
    let report = s.install().unwrap();
    assert_eq!(report.files[2].outcome, Outcome::Unchanged);
    assert!(report.lines()[2].starts_with(&format!(
        "unchanged {vgpu}/node-gpus (generated from inventory file"
    )));
    assert_eq!(fs::metadata(&node).unwrap().ino(), inode);

    // Another GPU list: replaced by rename; a reader holding the old file reads it whole.
    let mut held = fs::File::open(&node).unwrap();
    s.set_inventory("- {uuid: GPU-cccc, name: Tesla P4, memoryMib: 7680}\n");
    let report = s.install().unwrap();
    assert_eq!(
        outcomes(&report)[2..],
        [
            ("node-gpus".to_owned(), Outcome::Installed),
            ("ld.so.preload".to_owned(), Outcome::Unchanged)
        ]
    );
    assert_ne!(fs::metadata(&node).unwrap().ino(), inode);
    assert_eq!(
        fs::read_to_string(&node).unwrap(),
        "HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=7680\nNVIDIA0_UUID=GPU-cccc\n"
    );
    let mut old = String::new();
    held.read_to_string(&mut old).unwrap();
    assert_eq!(old, TWO_GPUS_FILE);
    assert_eq!(mode(&node), PUBLISHED_MODE);
    assert_no_temporaries(&s.vgpu());
}

#[test]
fn a_run_without_gpus_removes_the_node_file_of_an_earlier_run() {
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    s.set_inventory(TWO_GPUS);
    s.install().unwrap();
    assert!(s.node_file().exists());

    // The inventory now lists no GPU: the libraries and the list stay, the node file goes.
    s.set_inventory("[]\n");
    let report = s.install().unwrap();
    assert_eq!(outcomes(&report), all(Outcome::Unchanged));
    assert_eq!(
        report.node_gpus,
        NodeGpusReport::Withdrawn {
            path: s.node_file(),
            reason: NoNodeGpus::NoGpu(GpuSource::InventoryFile(s.inventory())),
            removed: true,
        }
    );
    assert!(!s.node_file().exists());
    let lines = report.lines();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(
        lines[0],
        format!(
            "removed {} (written by an earlier run; this run has no GPU list)",
            s.node_file().display()
        )
    );
    assert_list_names_existing_libraries(&s.vgpu());

    // Nothing to remove the next time; nothing reported for it.
    let report = s.install().unwrap();
    assert!(matches!(
        report.node_gpus,
        NodeGpusReport::Withdrawn { removed: false, .. }
    ));
    assert_eq!(report.lines().len(), 3);

    // The plan executed directly: NVML unavailable on a node that had a file (a symbolic link in
    // its place is removed too, not followed).
    fs::write(s.tmp.path().join("elsewhere"), TWO_GPUS_FILE).unwrap();
    symlink(s.tmp.path().join("elsewhere"), s.node_file()).unwrap();
    let scan = hami_device_plugin::commands::install_hook::scan_dir(&s.core()).unwrap();
    let plan = plan_install(
        &scan,
        &s.core(),
        &s.preload(),
        &s.hook(),
        GpuListing::NvmlUnavailable {
            reason: "no libnvidia-ml.so.1".into(),
        },
    )
    .unwrap();
    let report = execute(&plan).unwrap();
    assert!(matches!(
        report.node_gpus,
        NodeGpusReport::Withdrawn { removed: true, .. }
    ));
    assert!(fs::symlink_metadata(s.node_file()).is_err());
    assert_eq!(
        fs::read_to_string(s.tmp.path().join("elsewhere")).unwrap(),
        TWO_GPUS_FILE
    );
}

#[test]
fn a_refused_gpu_list_installs_nothing_and_withdraws_the_node_file() {
    for (what, inventory, needle) in [
        (
            "two GPUs with one minor number",
            "- {uuid: GPU-aaaa, name: x, memoryMib: 1, minor: 1}\n- {uuid: GPU-bbbb, name: x, memoryMib: 1}\n",
            r#"GPU #1 ("GPU-bbbb"): minor (by default the index) 1 is also the minor of GPU "GPU-aaaa""#,
        ),
        (
            "more memory than the file can state",
            "- {uuid: GPU-aaaa, name: x, memoryMib: 99999999}\n",
            r#"GPU "GPU-aaaa" (minor 0): memory 99999999 MiB is not in 1..=16777216"#,
        ),
        ("not YAML of GPUs", "gpus: []\n", "inventory file "),
    ] {
        let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
        s.set_inventory(TWO_GPUS);
        s.install().unwrap();
        // A new preload library and a broken GPU list.
        fs::write(s.preload(), elf("preload-2")).unwrap();
        s.set_inventory(inventory);
        let err = s.install().unwrap_err();
        let text = err.to_string();
        assert!(text.contains(needle), "{what}: {text}");
        assert!(
            text.contains(&s.inventory().display().to_string()),
            "{what}: names the file: {text}"
        );
        assert_eq!(err.exit_code(), 1, "{what}");
        assert!(
            !s.node_file().exists(),
            "{what}: the earlier node file is withdrawn"
        );
        assert_eq!(
            fs::read(s.vgpu().join("libhami_preload.so")).unwrap(),
            elf("preload"),
            "{what}: nothing installed"
        );
        assert_eq!(
            fs::read_to_string(s.vgpu().join("ld.so.preload")).unwrap(),
            s.expected_list()
        );
        assert_list_names_existing_libraries(&s.vgpu());
        assert_no_temporaries(&s.vgpu());
    }
}

#[test]
fn a_directory_in_place_of_the_node_file_fails_before_the_list() {
    // Publishing: the libraries are installed, the node file cannot be, and ld.so.preload is
    // never written.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    s.set_inventory(TWO_GPUS);
    fs::create_dir_all(s.node_file()).unwrap();
    let err = s.install().unwrap_err();
    assert!(
        matches!(&err, InstallHookError::Install { path, .. } if *path == s.node_file()),
        "{err}"
    );
    assert!(s.vgpu().join("libhami_preload.so").exists());
    assert!(!s.vgpu().join("ld.so.preload").exists());
    assert_no_temporaries(&s.vgpu());

    // Withdrawing: it cannot be removed; the error names it and nothing is installed.
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.node_file()).unwrap();
    let err = s.install().unwrap_err();
    assert!(
        matches!(&err, InstallHookError::Withdraw { path, .. } if *path == s.node_file()),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with(&format!("cannot remove {}: ", s.node_file().display())),
        "{err}"
    );
    assert!(!s.vgpu().join("libvgpu.so").exists());
    assert!(!s.vgpu().join("ld.so.preload").exists());
}

#[test]
fn cli_publishes_the_node_file_from_an_inventory_and_lists_its_gpus() {
    let s = Setup::new(&[("libvgpu.so.v2.10.0", &elf("core"))]);
    s.set_inventory(TWO_GPUS);
    let out = s.cli(&s.hook());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let vgpu = s.vgpu().display().to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{stdout}");
    assert_eq!(
        lines[2..5],
        [
            format!(
                "installed {vgpu}/node-gpus (generated from inventory file {}: 2 GPUs, {} bytes)",
                s.inventory().display(),
                TWO_GPUS_FILE.len()
            ),
            "  /dev/nvidia1 GPU-bbbb 81559 MiB".to_owned(),
            "  /dev/nvidia3 GPU-aaaa 143771 MiB".to_owned(),
        ]
    );
    assert!(
        lines[5].starts_with(&format!("installed {vgpu}/ld.so.preload")),
        "{stdout}"
    );
    assert_eq!(fs::read_to_string(s.node_file()).unwrap(), TWO_GPUS_FILE);
    assert_eq!(mode(&s.node_file()), PUBLISHED_MODE);
    assert_no_temporaries(&s.vgpu());

    // The inventory from HAMI_INVENTORY, as `run` reads it.
    let t = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::write(t.tmp.path().join("env-gpus.yaml"), TWO_GPUS).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .arg("install-hook")
        .arg(format!("--hami-core-dir={}", t.core().display()))
        .arg(format!("--preload={}", t.preload().display()))
        .arg(format!("--hook-path={}", t.hook().display()))
        .env("HAMI_INVENTORY", t.tmp.path().join("env-gpus.yaml"))
        .env_remove("HOOK_PATH")
        .env_remove("HAMI_HOOK_PATH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read_to_string(t.node_file()).unwrap(), TWO_GPUS_FILE);

    // A malformed inventory: exit 1 naming the entry, the earlier node file withdrawn.
    s.set_inventory("- {uuid: GPU-aaaa, name: x, memoryMib: 1, minor: 255}\n");
    let out = s.cli(&s.hook());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "hami-device-plugin: cannot list the GPUs for {vgpu}/node-gpus: inventory file {}: GPU #0 (\"GPU-aaaa\"): minor 255 is not in 0..=254",
            s.inventory().display()
        )),
        "{err}"
    );
    assert!(
        err.contains("removed the node GPU file of an earlier run"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    assert!(!s.node_file().exists());
}

/// Without `--inventory` the GPUs come from NVML: on a GPU machine the file lists them; without
/// NVML the libraries are installed, a stale node file is removed, a warning says what to do, and
/// the exit status is 0.
#[test]
fn cli_without_an_inventory_uses_nvml_or_withdraws_the_node_file() {
    let s = Setup::new(&[("libvgpu.so", &elf("core"))]);
    fs::create_dir_all(s.vgpu()).unwrap();
    fs::write(
        s.node_file(),
        "HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=1\nNVIDIA0_UUID=GPU-stale\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hami-device-plugin"))
        .arg("install-hook")
        .arg("--hami-core-dir")
        .arg(s.core())
        .arg("--preload")
        .arg(s.preload())
        .arg("--hook-path")
        .arg(s.hook())
        .env_remove("HOOK_PATH")
        .env_remove("HAMI_HOOK_PATH")
        .env_remove("HAMI_INVENTORY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        fs::read_to_string(s.vgpu().join("ld.so.preload")).unwrap(),
        s.expected_list()
    );
    match NvmlInventory::init().and_then(|nvml| nvml.discover()) {
        Ok(gpus) if !gpus.is_empty() => {
            eprintln!("NVML available: {} GPU(s) published", gpus.len());
            let bytes = fs::read(s.node_file()).unwrap();
            let parsed = hami_shared::node_gpus::parse(&bytes);
            assert!(parsed.usable(), "{:?}", parsed.diagnostics);
            assert_eq!(parsed.memory_mib.len(), gpus.len());
            for g in &gpus {
                assert_eq!(parsed.mib_for(g.minor), Some(g.memory_mib), "{g:?}");
                assert_eq!(parsed.uuids.get(&g.minor), Some(&g.uuid), "{g:?}");
                assert!(
                    stdout.contains(&format!(
                        "  /dev/nvidia{} {} {} MiB",
                        g.minor, g.uuid, g.memory_mib
                    )),
                    "{stdout}"
                );
            }
            assert!(stdout.contains("(generated from NVML: "), "{stdout}");
            assert_eq!(mode(&s.node_file()), PUBLISHED_MODE);
        }
        listed => {
            eprintln!(
                "NVML unavailable or without GPUs here ({listed:?}): the withdrawal is checked"
            );
            assert!(!s.node_file().exists(), "the stale file is removed");
            assert!(
                stdout.starts_with(&format!("removed {}", s.node_file().display())),
                "{stdout}"
            );
            assert_eq!(stdout.lines().count(), 4, "{stdout}");
            assert!(stderr.contains("no node GPU file published"), "{stderr}");
            assert!(stderr.contains("NVIDIA_VISIBLE_DEVICES=all"), "{stderr}");
            if listed.is_err() {
                assert!(stderr.contains("NVML is not available"), "{stderr}");
                assert!(stderr.contains("--inventory FILE"), "{stderr}");
            }
        }
    }
    assert_no_temporaries(&s.vgpu());
}

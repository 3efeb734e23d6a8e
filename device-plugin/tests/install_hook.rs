//! `hami-device-plugin install-hook`: the pure plan, the installation on real files in temporary
//! directories, and the binary as a user runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use hami_device_plugin::install_hook::{
    EntryKind, FileSource, FoundEntry, InstallHookArgs, InstallHookError, InstallReport, Outcome,
    execute, install_hook, ld_so_preload_contents, normalise_hook_path, plan_install,
};

/// Bytes that pass for a shared object: the ELF magic, then `tag`.
fn elf(tag: &str) -> Vec<u8> {
    let mut bytes = b"\x7fELF\x02\x01\x01\0".to_vec();
    bytes.extend_from_slice(tag.as_bytes());
    bytes
}

/// A temporary directory with `core/` (HAMi-core's folder, holding `core_files`), `preload.so`
/// (the preload library) and `hook/` (not created: the hook path).
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
        Self { tmp }
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
            .env_remove("HOOK_PATH")
            .env_remove("HAMI_HOOK_PATH")
            .output()
            .unwrap()
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
    let scan = hami_device_plugin::install_hook::scan_dir(&s.core()).unwrap();
    assert_eq!(scan.len(), 1);
    assert_eq!(scan[0].kind, EntryKind::File);
    assert!(!scan[0].symlink);
    // A trailing slash on the hook path: the list names the normalised paths.
    let hook = format!("{}/", s.hook().display());
    let plan = plan_install(&scan, &s.core(), &s.preload(), Path::new(&hook)).unwrap();
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

//! The local container images (`scripts/images`, for a real kubelet without a registry) are laid out
//! exactly as the Dockerfile's final stages say: `tests/cluster/images_test.py` reads the stages
//! itself, builds the three project images from stand-in binaries and a fake base rootfs (no cargo
//! build, debootstrap or container engine), and compares paths, modes, owners, contents, user,
//! entrypoint, command and ports; an instruction the script does not interpret must fail it.

use std::path::Path;
use std::process::Command;

#[test]
fn images_follow_the_dockerfile() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new("python3")
        .arg("tests/cluster/images_test.py")
        .current_dir(&root)
        .output()
        .expect("python3 runs tests/cluster/images_test.py");
    assert!(
        output.status.success(),
        "tests/cluster/images_test.py failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every script that uses what cargo built (the release binaries, the preload library, the fuzz
/// targets) finds it where `cargo build` put it: `scripts/target-dir` (cargo's own answer:
/// `CARGO_TARGET_DIR`, `CARGO_BUILD_TARGET_DIR`, a cargo config, else `target/`), never a
/// hard-coded `target/`, which a build with `CARGO_TARGET_DIR` set (as `scripts/cluster`'s honours)
/// leaves stale or empty. `target/` counts only where it starts a path (`$target/`, `<target>/`
/// and `--target-dir` are other things).
#[test]
fn scripts_find_built_files_in_cargos_target_folder() {
    /// The one line allowed: the Dockerfile's build stage runs cargo inside the image build, in its
    /// own folder with no CARGO_TARGET_DIR; `scripts/images` reads that stage's `cp` commands.
    const ALLOWED: &[(&str, &str)] = &[(
        "scripts/images",
        "DOCKERFILE_RELEASE_DIR = \"target/release/\"",
    )];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "scripts",
        "tests/cluster",
        "tests/gpu",
        "bench",
        "examples",
        ".ci",
    ] {
        collect_scripts(&root.join(dir), &mut files);
    }
    assert!(
        files.iter().any(|f| f.ends_with("scripts/images"))
            && files.iter().any(|f| f.ends_with("scripts/build-preload")),
        "the scan found neither scripts/images nor scripts/build-preload: {files:?}"
    );
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text: no script
        };
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            if ALLOWED
                .iter()
                .any(|(f, allowed)| *f == name && line.trim() == *allowed)
            {
                continue;
            }
            if hard_coded_target(line) {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "scripts naming cargo's target folder as target/ (use scripts/target-dir):\n{}",
        found.join("\n")
    );
    // The check itself.
    assert!(hard_coded_target("BIN=$ROOT/target/release/hami-webhook"));
    assert!(hard_coded_target("artifact=\"target/$t/preload/x.so\""));
    assert!(hard_coded_target("os.path.join(ROOT, 'target/release')"));
    assert!(!hard_coded_target(
        "artifact=\"$(scripts/target-dir)/$target/preload/x.so\""
    ));
    assert!(!hard_coded_target(
        "cargo build --target-dir \"$dir\" <target>/fuzz"
    ));
}

/// `target/` starting a path: at the start of the line or after a character that cannot end a
/// name (`/`, a quote, a blank, `=`, `(`, `:`, `,`).
fn hard_coded_target(line: &str) -> bool {
    line.match_indices("target/").any(|(at, _)| {
        line[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || "_$<{-.".contains(c)))
    })
}

/// Shell and Python scripts under `dir` (by extension, or a `#!` first line), recursively.
fn collect_scripts(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_scripts(&path, out);
            continue;
        }
        let by_extension = path
            .extension()
            .is_some_and(|e| e == "sh" || e == "py" || e == "bash");
        let by_shebang = path.extension().is_none()
            && std::fs::read(&path).is_ok_and(|bytes| bytes.starts_with(b"#!"));
        if by_extension || by_shebang {
            out.push(path);
        }
    }
}

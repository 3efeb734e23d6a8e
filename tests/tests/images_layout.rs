//! The local container images (`scripts/images`, for a real kubelet without a registry) are laid out
//! exactly as the Dockerfile's final stages say: `tests/cluster/images_test.py` reads the stages
//! itself, builds the three project images from stand-in binaries and a fake base rootfs (no cargo
//! build, debootstrap or container engine), and compares paths, modes, owners, contents, user,
//! entrypoint, command and ports; an instruction the script does not interpret must fail it.
#![allow(clippy::expect_used)]

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

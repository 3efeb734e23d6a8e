//! What tests that start the workspace's programs as processes share: a free local port and the
//! path of a built binary.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

/// A TCP port on 127.0.0.1 that nothing listens on now (bound to port 0, then released), for a
/// program that takes an address rather than a listener.
///
/// # Panics
/// When no local port can be bound.
#[must_use]
#[allow(clippy::expect_used)]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a local port")
        .port()
}

/// The workspace's built binary `name`, beside the calling test's `deps/` folder.
///
/// # Panics
/// When the test's own path is unknown or the binary is not built.
#[must_use]
#[allow(clippy::expect_used, clippy::panic)]
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lies in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --bins` first (`cargo test --workspace --all-targets`, \
         as scripts/test-all runs it, builds every binary before the tests)",
        path.display()
    );
    path
}

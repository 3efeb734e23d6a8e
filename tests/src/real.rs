//! What the real-cluster tests (`tests/tests/real_cluster.rs`, `tests/tests/real_node.rs`) share:
//! kubectl from the cluster's own build, the node lock's time format, and stopping the cluster
//! (`scripts/cluster down`) on Ctrl-C or SIGTERM.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Command output as text (lossy: kubectl and the scripts print UTF-8).
#[must_use]
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `kubectl --kubeconfig KUBECONFIG ARGS`, with `stdin` written to it when given.
///
/// # Errors
/// When kubectl cannot be started or its input written.
pub fn kubectl(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> std::io::Result<Output> {
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())?;
    }
    drop(child.stdin.take());
    child.wait_with_output()
}

/// RFC 3339 UTC seconds for UNIX time `t` (the format of HAMi's node lock), from `date`.
///
/// # Errors
/// When `date` cannot be run.
pub fn rfc3339(t: u64) -> std::io::Result<String> {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()?;
    Ok(text(&out.stdout).trim().to_owned())
}

/// Ctrl-C or SIGTERM (an interrupted `cargo test`, a CI timeout) stops the cluster too: a thread
/// waits for either, runs `scripts/cluster down` for `dir` (which stops every process recorded in
/// its `pids/`, the node's containers included), and exits with 130.
pub fn stop_on_signal(test: &'static str, cluster_script: PathBuf, dir: PathBuf) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        let _ = writeln!(
            std::io::stderr(),
            "{test}: interrupted; stopping the cluster"
        );
        let _ = Command::new(cluster_script)
            .arg("down")
            .env("HAMI_CLUSTER_DIR", &dir)
            .status();
        std::process::exit(130);
    });
}

//! What the real-cluster tests (`tests/tests/real_cluster/main.rs`, `tests/tests/real_node/main.rs`) share:
//! kubectl from the cluster's own build, the node lock's time format, waiting, the ordered case
//! runner (one cluster for every case), and stopping the cluster (`scripts/cluster down`) on
//! Ctrl-C or SIGTERM.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// The repository's root (this crate is `tests/`).
#[must_use]
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Poll `f` every 200 ms until it holds; panics (failing the case) after `timeout`, naming
/// `what`. Returns how long it took.
pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

/// One case of an ordered scenario: its name and what it runs against the shared cluster.
pub type Case<C> = (&'static str, fn(&mut C));

/// `cargo test -- --list` (and filters): the cases are one ordered scenario, listed, never
/// filtered. True when the arguments asked for the list (it is printed).
#[must_use]
pub fn listed<C>(cases: &[Case<C>]) -> bool {
    if !std::env::args().any(|a| a == "--list") {
        return false;
    }
    let mut out = std::io::stdout();
    for (name, _) in cases {
        let _ = writeln!(out, "{name}: test");
    }
    true
}

/// Plain `cargo test` does not run these suites (a Kubernetes build, and for the node root): unless
/// the arguments hold `--ignored` or `--include-ignored`, every case is reported as libtest reports
/// an `#[ignore = "…"]` test, with `reason`, and the suite is not started. True when it is not to
/// run.
#[must_use]
pub fn ignored_unless_asked<C>(test: &str, cases: &[Case<C>], reason: &str) -> bool {
    if std::env::args().any(|a| a == "--ignored" || a == "--include-ignored") {
        return false;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "\nrunning {} tests", cases.len());
    for (name, _) in cases {
        let _ = writeln!(out, "test {name} ... ignored, {reason}");
    }
    let _ = writeln!(
        out,
        "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; 0 filtered out\n",
        cases.len()
    );
    let _ = writeln!(
        std::io::stderr(),
        "{test}: NOT RUN ({reason}); run it with `cargo test -p hami-tests --test {test} -- --ignored`"
    );
    true
}

/// Run `cases` in order against `cluster`, each caught (a panic fails that case only), printing
/// `test NAME ... ok (S s)` or `... FAILED`. The first case installs what the others need: when it
/// fails, the rest are not run. Returns (passed, names of the failed cases).
pub fn run_cases<C>(test: &str, cases: &[Case<C>], cluster: &mut C) -> (usize, Vec<&'static str>) {
    let mut out = std::io::stdout();
    let mut failed = Vec::new();
    let mut passed = 0;
    for (i, (name, case)) in cases.iter().enumerate() {
        let start = Instant::now();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(cluster))) {
            Ok(()) => {
                passed += 1;
                let _ = writeln!(
                    out,
                    "test {name} ... ok ({:.1} s)",
                    start.elapsed().as_secs_f64()
                );
            }
            Err(_) => {
                let _ = writeln!(out, "test {name} ... FAILED");
                failed.push(*name);
                if i == 0 {
                    let _ = writeln!(
                        out,
                        "{test}: the first case (the install) failed; the other {} cases need it and did not run",
                        cases.len() - 1
                    );
                    break;
                }
            }
        }
    }
    (passed, failed)
}

/// A peer's webhook stood in by a Python script of `tests/cluster/` over HTTPS, started by
/// [`https_stand_in`].
#[derive(Debug)]
pub struct StandIn {
    /// The script's process (recorded in the cluster's `pids/` so that `scripts/cluster down`
    /// stops it whatever happens).
    pub child: Child,
    /// The port it serves on.
    pub port: u16,
    /// Its self-signed certificate, base64, for a webhook configuration's `caBundle`.
    pub ca_bundle: String,
}

/// What [`https_stand_in`] starts.
#[derive(Debug)]
pub struct StandInSpec<'a> {
    /// Where its certificate and key are written.
    pub dir: &'a Path,
    /// Its certificate's subject common name.
    pub common_name: &'a str,
    /// The address it serves on, also its certificate's IP subject alternative name.
    pub ip: &'a str,
    /// The script, then the arguments before `IP PORT CERT KEY`.
    pub script: &'a Path,
    pub before: &'a [&'a str],
    /// Arguments after `IP PORT CERT KEY`.
    pub after: &'a [&'a Path],
    /// Its standard error.
    pub log: &'a Path,
    /// Its process id, for `scripts/cluster down`.
    pub pid_file: &'a Path,
}

/// Start an HTTPS stand-in: a self-signed certificate for `spec.ip` (openssl), then
/// `python3 SCRIPT BEFORE... IP PORT CERT KEY AFTER...` on a free port, returned once it printed
/// `serving`.
///
/// # Errors
/// When openssl or the script cannot be run, fails, or the script does not say `serving`.
pub fn https_stand_in(spec: &StandInSpec<'_>) -> Result<StandIn, String> {
    use base64::Engine as _;
    use std::io::BufRead as _;

    std::fs::create_dir_all(spec.dir).map_err(|e| format!("{}: {e}", spec.dir.display()))?;
    let (cert, key) = (spec.dir.join("tls.crt"), spec.dir.join("tls.key"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
        ])
        .arg(format!("/CN={}", spec.common_name))
        .arg("-addext")
        .arg(format!("subjectAltName=IP:{}", spec.ip))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    if !out.status.success() {
        return Err(format!("openssl req failed: {}", text(&out.stderr)));
    }
    let port = crate::local::free_port();
    let log =
        std::fs::File::create(spec.log).map_err(|e| format!("{}: {e}", spec.log.display()))?;
    let mut child = Command::new("python3")
        .arg(spec.script)
        .args(spec.before)
        .arg(spec.ip)
        .arg(port.to_string())
        .arg(&cert)
        .arg(&key)
        .args(spec.after)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", spec.script.display()))?;
    std::fs::write(spec.pid_file, child.id().to_string())
        .map_err(|e| format!("{}: {e}", spec.pid_file.display()))?;
    let mut ready = String::new();
    if let Some(stdout) = child.stdout.take() {
        std::io::BufReader::new(stdout)
            .read_line(&mut ready)
            .map_err(|e| format!("{}: {e}", spec.script.display()))?;
    }
    if ready.trim() != "serving" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!(
            "{} did not say it was serving (said {ready:?}; its log: {})",
            spec.script.display(),
            spec.log.display()
        ));
    }
    let pem = std::fs::read(&cert).map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(StandIn {
        child,
        port,
        ca_bundle: base64::engine::general_purpose::STANDARD.encode(pem),
    })
}

/// KAI v0.17's MutatingWebhookConfiguration as its operator writes it
/// (`pkg/operator/operands/admission/resources.go`), named `name`, calling `url`.
#[must_use]
pub fn kai_admission_configuration(name: &str, url: &str, ca_bundle: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "admission.run.ai", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
            "clientConfig": {"url": url, "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "matchConditions": [{"name": "scheduler-name-match",
                                 "expression": "object.spec.schedulerName == 'kai-scheduler'"}],
        }],
    })
}

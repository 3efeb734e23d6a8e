//! The README's quick start works as written. The commands are read from the fenced `sh` blocks
//! between `<!-- quickstart:begin -->` and `<!-- quickstart:end -->`:
//!
//! - `cargo run --release -p PKG -- ARGS`: run as `PKG ARGS` with the workspace's built binary
//!   (the same program and arguments; the debug build, so that `cargo test` does not rebuild the
//!   workspace in release), from the repository root, with no `HAMI_*` variable of the caller's
//!   environment: each one-shot command must exit 0 and print something;
//! - `serve --dev`: started with exactly those arguments (only its two addresses moved to free
//!   ports through `HAMI_SERVER__LISTEN` / `HAMI_SERVER__METRICSLISTEN`, so that it can run beside
//!   anything on 9443/9090), its `/readyz` polled until 200, the `curl` it prints run (when curl is
//!   installed) and answered with an AdmissionReview, then stopped with SIGTERM: it must exit 0;
//! - every other command (`scripts/cluster …`, `kubectl …`, the example script) needs root and a
//!   real node, which `tests/tests/real_node/main.rs` builds (far too heavy for this test). So that
//!   these cannot rot silently, each one must be in [`CLUSTER_COMMANDS`] with the file that runs
//!   it and what that file must contain; a README command missing from the table, or a table
//!   entry the README no longer has, fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hami_tests::docs::code_blocks;
use hami_tests::local::{binary, free_port};
use hami_tests::real::{repo, text};

/// The README's cluster commands, where each is exercised, and what that file must contain for it
/// (all of the strings). `tests/tests/real_node/main.rs` runs the quick start's pod as its "quick start"
/// case (`readme_quick_start`) on the node `scripts/cluster up --with-chart` starts.
const CLUSTER_COMMANDS: &[(&str, &str, &[&str])] = &[
    (
        "scripts/cluster up --with-chart",
        "tests/tests/real_node/main.rs",
        &[r#".args(["up", "--with-chart"])"#],
    ),
    // `env` only prints `export KUBECONFIG=…` and `PATH=…`: the tests pass the cluster's
    // admin.kubeconfig and its kubectl themselves rather than eval'ing it, so the sub-command is
    // checked to exist and to print exactly those.
    (
        r#"eval "$(scripts/cluster env)""#,
        "scripts/cluster",
        &[
            "  env)",
            r#"echo "export KUBECONFIG=$dir/admin.kubeconfig""#,
            r#"echo "export PATH=$(cat "$dir/bin"):\$PATH""#,
        ],
    ),
    (
        "kubectl create ns tenant",
        "tests/tests/real_node/main.rs",
        &[
            r#"const TENANT: &str = "tenant";"#,
            r#"n.ok(&["create", "namespace", TENANT], None);"#,
        ],
    ),
    (
        "kubectl -n tenant apply -f examples/node-hami-pod.yaml",
        "tests/tests/real_node/main.rs",
        &[
            r#"repo().join("examples/node-hami-pod.yaml")"#,
            r#"n.ok(&["apply", "-n", TENANT, "-f", "-"], Some(&example));"#,
        ],
    ),
    (
        "examples/node-schedule-as-hami.sh tenant hami-demo",
        "tests/tests/real_node/main.rs",
        &[
            r#"Command::new(repo().join("examples/node-schedule-as-hami.sh"))"#,
            r#".args([TENANT, "hami-demo"])"#,
        ],
    ),
    (
        "kubectl -n tenant exec hami-demo -- env -i /usr/bin/printenv",
        "tests/tests/real_node/main.rs",
        &[
            r#"let mut args = vec!["exec", "-n", TENANT, pod, "--"];"#,
            r#"&["env", "-i", "/usr/bin/printenv"]"#,
            r#""hami-demo","#,
            r#"("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m")"#,
        ],
    ),
    (
        "examples/node-ssh-demo.sh tenant ssh-demo",
        "tests/tests/real_node/sessions.rs",
        &[
            r#"Command::new(repo().join("examples/node-ssh-demo.sh"))"#,
            r#".args([TENANT, "ssh-demo"])"#,
            r#"var(&v, "SSH_CONNECTION").is_some()"#,
        ],
    ),
    (
        "scripts/cluster down",
        "tests/tests/real_node/main.rs",
        &[r#".arg("down")"#],
    ),
];

/// The quick start's commands, one per entry: comments dropped, continuation lines joined, `&&`
/// chains split.
fn quick_start_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let (begin, end) = ("<!-- quickstart:begin -->", "<!-- quickstart:end -->");
    let start = readme
        .find(begin)
        .expect("README.md: no quickstart:begin marker");
    let stop = readme
        .find(end)
        .expect("README.md: no quickstart:end marker");
    assert!(start < stop, "quickstart markers out of order");
    let quick = &readme[start..stop];
    let mut out = Vec::new();
    for block in code_blocks(quick, "sh") {
        let mut pending = String::new();
        for line in block {
            let code = strip_comment(line.text);
            if let Some(head) = code.trim_end().strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(code);
            for part in pending.split(" && ") {
                let part = part.split_whitespace().collect::<Vec<_>>().join(" ");
                if !part.is_empty() {
                    out.push(part);
                }
            }
            pending.clear();
        }
    }
    out
}

/// `line` without a trailing `# comment` (a `#` that starts a word outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}

/// `cargo run --release -p PKG -- ARGS` → (`PKG`, `ARGS`).
fn cargo_run(command: &str) -> Option<(String, Vec<String>)> {
    let words: Vec<&str> = command.split_whitespace().collect();
    if words.first() != Some(&"cargo") {
        return None;
    }
    assert_eq!(
        &words[..3],
        ["cargo", "run", "--release"],
        "unexpected cargo command in the quick start: {command}"
    );
    let p = words.iter().position(|w| *w == "-p").expect("-p PKG");
    let dashes = words.iter().position(|w| *w == "--").expect("-- ARGS");
    Some((
        words[p + 1].to_owned(),
        words[dashes + 1..]
            .iter()
            .map(|w| (*w).to_owned())
            .collect(),
    ))
}

fn hermetic(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("HAMI_")
            || matches!(k.as_str(), "NODE_NAME" | "HOOK_PATH" | "PER_GPU_VRAM_MIB")
        {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(repo())
}

#[test]
fn quick_start_has_the_expected_commands() {
    let commands = quick_start_commands();
    let local = commands.iter().filter(|c| cargo_run(c).is_some()).count();
    assert!(
        local >= 5,
        "only {local} cargo commands found in the quick start: {commands:#?}"
    );
    assert!(
        commands
            .iter()
            .any(|c| c == "cargo run --release -p hami-webhook -- serve --dev"),
        "the quick start's build-and-run command is gone: {commands:#?}"
    );
}

#[test]
fn one_shot_commands_succeed() {
    let mut ran = 0;
    for command in quick_start_commands() {
        let Some((package, args)) = cargo_run(&command) else {
            continue;
        };
        if args.first().is_some_and(|a| a == "serve") {
            continue;
        }
        let out = hermetic(&mut Command::new(binary(&package)))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "README quick start: `{command}` exited {:?}\nstdout:\n{}\nstderr:\n{}",
            out.status.code(),
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            !out.stdout.is_empty(),
            "README quick start: `{command}` printed nothing"
        );
        ran += 1;
    }
    assert!(ran >= 4, "only {ran} one-shot commands ran");
}

/// A plain HTTP/1.0 GET: the status code, or `None` when nothing answers yet.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn serve_dev_starts_answers_and_stops_on_sigterm() {
    let command = quick_start_commands()
        .into_iter()
        .find(|c| cargo_run(c).is_some_and(|(_, a)| a.first().is_some_and(|x| x == "serve")))
        .expect("the quick start has a serve command");
    let (package, args) = cargo_run(&command).unwrap();
    let (listen, metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut child = hermetic(&mut Command::new(binary(&package)))
        .args(&args)
        .env("HAMI_SERVER__LISTEN", &listen)
        .env("HAMI_SERVER__METRICSLISTEN", &metrics)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stop = |child: &mut std::process::Child| {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    // What it prints: the curl command and the metrics address.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    let mut curl = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        printed.push_str(&line);
        if line.trim_start().starts_with("curl --cacert") {
            curl = Some(line.trim().to_owned());
        }
        if line.starts_with("metrics: curl ") {
            break;
        }
    }
    let ready = (|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http_status(&metrics, "/readyz") == Some(200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    })();
    if !ready {
        stop(&mut child);
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        panic!(
            "`{command}`: /readyz on {metrics} never answered 200\nstdout:\n{printed}\nstderr:\n{err}"
        );
    }
    let curl = curl.unwrap_or_else(|| panic!("`{command}` printed no curl command:\n{printed}"));
    assert!(
        curl.contains(&format!(":{}/mutate", listen.rsplit(':').next().unwrap())),
        "the printed curl does not name the server's port: {curl}"
    );
    let has_curl = Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_curl {
        let out = Command::new("sh").args(["-c", &curl]).output().unwrap();
        let body = text(&out.stdout);
        assert!(
            out.status.success()
                && body.contains("\"AdmissionReview\"")
                && body.contains("\"allowed\""),
            "the printed `{curl}` did not get an AdmissionReview: {body}{}",
            text(&out.stderr)
        );
    } else {
        eprintln!("curl is not installed: the printed curl command was not run");
    }

    let status = stop(&mut child);
    let tmp = std::env::temp_dir().join(format!("hami-webhook-dev-{pid}"));
    let _ = std::fs::remove_dir_all(&tmp);
    let status =
        status.unwrap_or_else(|| panic!("`{command}` did not exit within 30 s of SIGTERM"));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        status.success(),
        "`{command}` exited {status} after SIGTERM\nstderr:\n{err}"
    );
}

#[test]
fn cluster_commands_are_exercised_by_the_real_node_tests() {
    let readme: Vec<String> = quick_start_commands()
        .into_iter()
        .filter(|c| cargo_run(c).is_none())
        .collect();
    let mut problems = Vec::new();
    for command in &readme {
        if !CLUSTER_COMMANDS.iter().any(|(c, _, _)| c == command) {
            problems.push(format!(
                "README quick start command `{command}` is not in CLUSTER_COMMANDS: make \
                 tests/tests/real_node/main.rs (or scripts/cluster) run it, then list it here"
            ));
        }
    }
    for (command, file, needles) in CLUSTER_COMMANDS {
        if !readme.iter().any(|c| c == command) {
            problems.push(format!(
                "CLUSTER_COMMANDS lists `{command}`, which the README quick start no longer has"
            ));
        }
        let source = std::fs::read_to_string(repo().join(file)).unwrap();
        for needle in *needles {
            if !source.contains(needle) {
                problems.push(format!(
                    "`{command}`: {file} no longer contains {needle:?} (what runs this command there)"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

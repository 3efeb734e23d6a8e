//! Every session the design names, for real, in a real container of a HAMi pod and of a KAI pod:
//! an SSH login from the host (key authentication, to the pod's address on the node's bridge),
//! `sudo -i`, `sudo -u other -i`, a cron job of the non-root user `other`, `login -f other`,
//! `su -`, `kubectl exec`, `bash -c`, `setsid`, `nohup` and `env -i`. The workload image carries
//! sshd, sudo, cron and login (`scripts/images`); the pod's entrypoint starts sshd and cron, as a
//! user's image would.
//!
//! The pods run in a namespace of `webhook.tenancy.allowHamiCoreEnvNamespaces`, where a container
//! spec may set HAMi-core's variables (HAMi's behaviour), and their spec tries: the HAMi pod sets
//! every memory limit to 99999m, its own core limit and its own shared cache; the KAI pod its own
//! core limit and oversubscription (a KAI container's own memory limit is HAMi's behaviour there:
//! left as is, the operator's choice). Every session must show the limits file's values, and none
//! may show a value of the spec. Both name their own shared cache: the file's (the HAMi folder,
//! the KAI container's slot folder) is the one every session must join. A non-root user's process gets the limits too and can open the shared
//! cache (and HAMi-core's lock) read-write, as HAMi-core does for its region.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    GPU_1, Node, TENANT, bind_in, delete_pod_in, hami_pod, kai_pod, repo, running_in,
    schedule_and_bind_as_hami_in, text, var, vars, wait_for,
};

/// A namespace of `webhook.tenancy.allowHamiCoreEnvNamespaces` (this test's chart values).
pub const ALLOWED_NS: &str = "sessions";

/// The entrypoint of a pod one can log into: the key it is given in `SSH_AUTHORIZED_KEY` for
/// root, host keys, sshd and cron started, its own environment recorded.
const ENTRYPOINT: &str = "printenv > /tmp/entry-env \
    && install -d -m 700 /root/.ssh \
    && printf '%s\\n' \"$SSH_AUTHORIZED_KEY\" > /root/.ssh/authorized_keys \
    && ssh-keygen -A -q && install -d -m 755 /run/sshd && /usr/sbin/sshd && cron \
    && exec sleep infinity";

/// What the HAMi pod's spec tries to set, and the KAI pod's.
const HAMI_SPEC_ENV: &[(&str, &str)] = &[
    ("CUDA_DEVICE_MEMORY_LIMIT", "99999m"),
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "99999m"),
    ("CUDA_DEVICE_SM_LIMIT", "99"),
    ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/spec-own.cache"),
];
const KAI_SPEC_ENV: &[(&str, &str)] = &[
    ("CUDA_DEVICE_SM_LIMIT", "99"),
    ("CUDA_OVERSUBSCRIBE", "true"),
    ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/spec-own.cache"),
];

impl Node {
    /// `kubectl exec` into a pod of namespace `ns`: (exit code, stdout, stderr).
    fn exec_in(&self, ns: &str, pod: &str, cmd: &[&str]) -> (i32, String, String) {
        let mut args = vec!["exec", "-n", ns, pod, "--"];
        args.extend(cmd);
        let out = self.kubectl(&args, None);
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }
}

/// A key pair for root's SSH login, in a folder of its own (removed on drop).
struct SshKey {
    dir: PathBuf,
}

impl SshKey {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hami-ssh-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "hami-limits-test",
                "-f",
            ])
            .arg(dir.join("id"))
            .stdin(Stdio::null())
            .output()
            .expect("ssh-keygen (openssh-client) runs");
        assert!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
        Self { dir }
    }

    fn public(&self) -> String {
        std::fs::read_to_string(self.dir.join("id.pub"))
            .unwrap()
            .trim()
            .to_owned()
    }

    fn private(&self) -> PathBuf {
        self.dir.join("id")
    }
}

impl Drop for SshKey {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ssh root@ip COMMAND` with the key: (exit code, stdout, stderr).
fn ssh(key: &Path, ip: &str, command: &str) -> (i32, String, String) {
    let out = Command::new("ssh")
        .arg("-i")
        .arg(key)
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
            &format!("root@{ip}"),
            command,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("ssh (openssh-client) runs");
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// A pod of the workload image one can log into, in `ALLOWED_NS`, its spec setting `spec_env`.
fn session_pod(mut pod: Value, key: &SshKey, spec_env: &[(&str, &str)]) -> Value {
    pod["metadata"]["namespace"] = json!(ALLOWED_NS);
    let container = &mut pod["spec"]["containers"][0];
    container["command"] = json!(["sh", "-c", ENTRYPOINT]);
    let mut env = vec![json!({"name": "SSH_AUTHORIZED_KEY", "value": key.public()})];
    env.extend(spec_env.iter().map(|(k, v)| json!({"name": k, "value": v})));
    container["env"] = json!(env);
    // Ready once sshd listens.
    container["readinessProbe"] = json!({"tcpSocket": {"port": 22}, "periodSeconds": 1});
    pod
}

/// The limits file's (`/overrideEnv`) variables that the preload library exports, in the
/// container.
fn file_values(n: &Node, pod: &str) -> Vec<(String, String)> {
    let (code, body, err) = n.exec_in(ALLOWED_NS, pod, &["cat", "/overrideEnv"]);
    assert_eq!(code, 0, "{pod}: cat /overrideEnv: {err}");
    let values: Vec<(String, String)> = vars(&body)
        .into_iter()
        .filter(|(k, _)| hami_shared::preload::is_exported_key(k))
        .collect();
    assert!(
        values
            .iter()
            .any(|(k, _)| k.starts_with("CUDA_DEVICE_MEMORY_LIMIT")),
        "{pod}: no memory limit in /overrideEnv:\n{body}"
    );
    values
}

/// One session's environment: every value of the file, none of the spec's, and (when given)
/// the user it runs as.
fn assert_session(
    pod: &str,
    session: &str,
    out: &str,
    file: &[(String, String)],
    spec_env: &[(&str, &str)],
    user: Option<&str>,
) {
    let v = vars(&out.replace('\r', ""));
    for (key, value) in file {
        assert_eq!(
            var(&v, key),
            Some(value.as_str()),
            "{pod}: {session}: {key} is not the file's {value}:\n{out}"
        );
    }
    for (key, value) in spec_env {
        assert!(
            !v.iter().any(|(_, got)| got == value),
            "{pod}: {session}: the spec's {key}={value} shows:\n{out}"
        );
    }
    if let Some(user) = user {
        assert_eq!(
            var(&v, "LOGNAME"),
            Some(user),
            "{pod}: {session}: not a session of {user}:\n{out}"
        );
    }
    println!("  {pod}: {session}: the file's values, none of the spec's");
}

/// Every session in `pod`, from the host (SSH) and through `kubectl exec`.
fn every_session(n: &Node, pod: &str, key: &SshKey, spec_env: &[(&str, &str)]) {
    let p = n.get("pod", Some(ALLOWED_NS), pod);
    let ip = p["status"]["podIP"].as_str().unwrap_or_default().to_owned();
    assert!(ip.starts_with("10.244.0."), "{pod}: pod IP {ip:?}");
    let file = file_values(n, pod);
    let cache = file
        .iter()
        .find(|(k, _)| k == "CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .map(|(_, v)| v.clone());
    // The cron job first: cron runs it at the next minute.
    let (code, _, err) = n.exec_in(
        ALLOWED_NS,
        pod,
        &[
            "sh",
            "-c",
            "echo '* * * * * /usr/bin/printenv > /tmp/cron-other.tmp && mv /tmp/cron-other.tmp /tmp/cron-other.env' \
             | crontab -u other -",
        ],
    );
    assert_eq!(code, 0, "{pod}: crontab -u other: {err}");

    // An SSH login from the host, and what a user does in it.
    let private = key.private();
    let mut last = (0, String::new(), String::new());
    wait_for(
        &format!("an SSH login to {pod} at {ip}"),
        Duration::from_secs(30),
        || {
            last = ssh(&private, &ip, "printenv");
            last.0 == 0
        },
    );
    assert_session(
        pod,
        "ssh root@pod printenv",
        &last.1,
        &file,
        spec_env,
        Some("root"),
    );
    if let Some(cache) = &cache {
        assert_eq!(
            var(&vars(&last.1), "CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            Some(cache.as_str()),
            "{pod}: the SSH login's shared cache"
        );
    }
    for (session, command, user) in [
        ("ssh: sudo -i", "sudo -i printenv", Some("root")),
        (
            "ssh: sudo -u other -i",
            "sudo -u other -i printenv",
            Some("other"),
        ),
        ("ssh: su -", "su - -c printenv", Some("root")),
        ("ssh: su - other", "su - other -c printenv", Some("other")),
        ("ssh: bash -c", "bash -c printenv", None),
        ("ssh: setsid", "setsid -w printenv", None),
        ("ssh: nohup", "nohup printenv 2>/dev/null", None),
        ("ssh: env -i", "env -i /usr/bin/printenv", None),
        (
            "ssh: login -f other (on a terminal)",
            "printf 'printenv > /tmp/login-ssh.env; exit\\n' | script -qec 'login -f other' /dev/null \
             >/dev/null && cat /tmp/login-ssh.env",
            Some("other"),
        ),
    ] {
        let (code, out, err) = ssh(&private, &ip, command);
        assert_eq!(code, 0, "{pod}: {session}: {out}{err}");
        assert_session(pod, session, &out, &file, spec_env, user);
    }

    // kubectl exec, and what a user does there.
    for (session, command, user) in [
        ("kubectl exec printenv", "exec printenv", None),
        ("kubectl exec: bash -c", "exec bash -c printenv", None),
        ("kubectl exec: setsid", "exec setsid -w printenv", None),
        (
            "kubectl exec: nohup",
            "exec nohup printenv 2>/dev/null",
            None,
        ),
        ("kubectl exec: su -", "exec su - -c printenv", Some("root")),
        (
            "kubectl exec: sudo -i",
            "exec sudo -i printenv",
            Some("root"),
        ),
        (
            "kubectl exec: sudo -u other -i",
            "exec sudo -u other -i printenv",
            Some("other"),
        ),
        (
            "kubectl exec: login -f other (on a terminal)",
            "printf 'printenv > /tmp/login-exec.env; exit\\n' | script -qec 'login -f other' /dev/null \
             >/dev/null && cat /tmp/login-exec.env",
            Some("other"),
        ),
        (
            "the entrypoint (sshd's and cron's parent)",
            "cat /tmp/entry-env",
            None,
        ),
    ] {
        let (code, out, err) = n.exec_in(ALLOWED_NS, pod, &["sh", "-c", command]);
        assert_eq!(code, 0, "{pod}: {session}: {out}{err}");
        assert_session(pod, session, &out, &file, spec_env, user);
    }

    // A non-root user's process: the limits, and HAMi-core's region opened read-write and
    // created if missing (bash's <> is open(O_RDWR|O_CREAT), as HAMi-core opens it). A script
    // file: `sudo -i` hands its command to the login shell with `$` unescaped.
    let region = "#!/bin/bash\n\
                  cache=${CUDA_DEVICE_MEMORY_SHARED_CACHE:-/tmp/cudevshr.cache}\n\
                  exec 3<>\"$cache\" && echo \"region: $cache\" || exit 1\n\
                  if [ -e /tmp/vgpulock ]; then exec 4<>/tmp/vgpulock/lock && echo 'lock: /tmp/vgpulock/lock' || exit 1; fi\n\
                  id -u && printenv\n";
    let (code, _, err) = n.exec_in(
        ALLOWED_NS,
        pod,
        &[
            "sh",
            "-c",
            "printf '%s' \"$1\" > /tmp/region.sh && chmod 755 /tmp/region.sh",
            "sh",
            region,
        ],
    );
    assert_eq!(code, 0, "{pod}: writing /tmp/region.sh: {err}");
    let (code, out, err) = n.exec_in(
        ALLOWED_NS,
        pod,
        &["sudo", "-u", "other", "-i", "/tmp/region.sh"],
    );
    assert_eq!(
        code, 0,
        "{pod}: user other cannot open the shared region: {out}{err}"
    );
    assert!(
        out.lines().any(|l| l == "1000"),
        "{pod}: not uid 1000:\n{out}"
    );
    if let Some(cache) = &cache {
        assert!(
            out.contains(&format!("region: {cache}\n")),
            "{pod}: other's region is not the file's {cache}:\n{out}"
        );
    }
    assert_session(
        pod,
        "user other's process",
        &out,
        &file,
        spec_env,
        Some("other"),
    );

    // The cron job of `other` ran within a minute (and a bit).
    let mut cron = String::new();
    wait_for(
        &format!("{pod}: other's cron job"),
        Duration::from_secs(90),
        || {
            let (code, out, _) = n.exec_in(ALLOWED_NS, pod, &["cat", "/tmp/cron-other.env"]);
            cron = out;
            code == 0
        },
    );
    assert_session(
        pod,
        "cron job of user other",
        &cron,
        &file,
        spec_env,
        Some("other"),
    );
}

fn wait_running_in(n: &Node, ns: &str, name: &str) {
    wait_for(
        &format!("pod {ns}/{name} Running and Ready (sshd listening)"),
        Duration::from_secs(90),
        || running_in(n, ns, name),
    );
}

/// The namespace where a spec may set HAMi-core's variables, Pod Security baseline as the
/// tenant's.
pub fn allowed_namespace(n: &mut Node) {
    n.ok(&["create", "namespace", ALLOWED_NS], None);
    n.ok(
        &[
            "label",
            "namespace",
            ALLOWED_NS,
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        None,
    );
}

pub fn sessions_in_a_hami_pod(n: &mut Node) {
    let key = SshKey::new("hami");
    let pod = session_pod(hami_pod("sessions-hami", 3000, 30), &key, HAMI_SPEC_ENV);
    let out = n.create(&pod);
    assert!(out.status.success(), "{}", text(&out.stderr));
    schedule_and_bind_as_hami_in(n, ALLOWED_NS, "sessions-hami", GPU_1, 3000, 30);
    wait_running_in(n, ALLOWED_NS, "sessions-hami");
    let file = file_values(n, "sessions-hami");
    assert_eq!(
        var(&file, "CUDA_DEVICE_MEMORY_LIMIT_0"),
        Some("3000m"),
        "{file:?}"
    );
    every_session(n, "sessions-hami", &key, HAMI_SPEC_ENV);
    delete_pod_in(n, ALLOWED_NS, "sessions-hami");
}

pub fn sessions_in_a_kai_pod(n: &mut Node) {
    let key = SshKey::new("kai");
    let pod = session_pod(
        kai_pod("sessions-kai", json!({"gpu-memory": "3000"})),
        &key,
        KAI_SPEC_ENV,
    );
    let out = n.create(&pod);
    assert!(out.status.success(), "{}", text(&out.stderr));
    bind_in(n, ALLOWED_NS, "sessions-kai");
    wait_running_in(n, ALLOWED_NS, "sessions-kai");
    let file = file_values(n, "sessions-kai");
    assert_eq!(
        var(&file, "CUDA_DEVICE_MEMORY_LIMIT"),
        Some("3000m"),
        "{file:?}"
    );
    assert_eq!(
        var(&file, "CUDA_DEVICE_MEMORY_SHARED_CACHE"),
        Some(hami_shared::names::KAI_SHARED_CACHE),
        "{file:?}"
    );
    every_session(n, "sessions-kai", &key, KAI_SPEC_ENV);
    delete_pod_in(n, ALLOWED_NS, "sessions-kai");
}

/// The README's quick start: `examples/node-ssh-demo.sh tenant ssh-demo` logs into a HAMi pod
/// over SSH and prints its environment.
pub fn readme_ssh_demo(n: &mut Node) {
    let path = format!(
        "{}:{}",
        n.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(repo().join("examples/node-ssh-demo.sh"))
        .args([TENANT, "ssh-demo"])
        .env("KUBECONFIG", n.dir.join("admin.kubeconfig"))
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "examples/node-ssh-demo.sh: {stdout}{}",
        text(&out.stderr)
    );
    let v = vars(&stdout);
    assert_eq!(
        var(&v, "CUDA_DEVICE_MEMORY_LIMIT_0"),
        Some("3000m"),
        "{stdout}"
    );
    assert_eq!(var(&v, "CUDA_DEVICE_SM_LIMIT"), Some("30"), "{stdout}");
    assert_eq!(var(&v, "LOGNAME"), Some("root"), "{stdout}");
    assert!(
        var(&v, "SSH_CONNECTION").is_some(),
        "not an SSH session: {stdout}"
    );
    super::delete_pod(n, "ssh-demo");
}

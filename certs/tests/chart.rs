//! The Helm chart, rendered by real Helm (`charts/tests/render.py`, PyPI `helm-python-sdk`), parsed
//! manifest by manifest into `k8s-openapi` types. A kind this test does not know fails, and so does
//! any field a type does not know (every object must serialize back to exactly what was rendered).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_enum_variant
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const NS: &str = "hami-system";
const PREFIX: &str = "hl-hami-limits";
const HAMI_RESOURCES: [&str; 5] = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
];

/// cert-manager's kinds, typed here (k8s-openapi has no CRDs); unknown fields are refused.
mod cert_manager {
    use super::*;

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Issuer {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: IssuerSpec,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct IssuerSpec {
        pub self_signed: BTreeMap<String, Value>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Certificate {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: CertificateSpec,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct CertificateSpec {
        pub secret_name: String,
        pub duration: String,
        pub renew_before: String,
        pub common_name: String,
        pub dns_names: Vec<String>,
        pub usages: Vec<String>,
        pub private_key: PrivateKey,
        pub issuer_ref: IssuerRef,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PrivateKey {
        pub algorithm: String,
        pub size: u32,
        pub rotation_policy: String,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct IssuerRef {
        pub name: String,
        pub kind: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub group: Option<String>,
    }
}

#[derive(Debug, Clone)]
enum Manifest {
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    ConfigMap(ConfigMap),
    DaemonSet(DaemonSet),
    Deployment(Deployment),
    Service(Service),
    PodDisruptionBudget(PodDisruptionBudget),
    MutatingWebhookConfiguration(MutatingWebhookConfiguration),
    Job(Job),
    CronJob(CronJob),
    Issuer(cert_manager::Issuer),
    Certificate(cert_manager::Certificate),
}

/// Deserializes `value` as `T` and checks that serializing it gives `value` back: a field `T` does
/// not know would be dropped and show up here.
fn strict<T: serde::de::DeserializeOwned + Serialize>(value: &Value, origin: &str) -> T {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| {
        panic!(
            "{origin}: does not deserialize as {}: {e}",
            std::any::type_name::<T>()
        )
    });
    let back = serde_json::to_value(&typed).unwrap();
    if &back != value {
        panic!(
            "{origin}: {} drops or changes fields\nrendered:   {}\nround trip: {}",
            std::any::type_name::<T>(),
            serde_json::to_string(value).unwrap(),
            serde_json::to_string(&back).unwrap()
        );
    }
    typed
}

fn parse_manifest(value: &Value, origin: &str) -> Manifest {
    let api_version = value["apiVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("{origin}: no apiVersion"));
    let kind = value["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("{origin}: no kind"));
    match (api_version, kind) {
        ("v1", "ServiceAccount") => Manifest::ServiceAccount(strict(value, origin)),
        ("v1", "ConfigMap") => Manifest::ConfigMap(strict(value, origin)),
        ("v1", "Service") => Manifest::Service(strict(value, origin)),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            Manifest::ClusterRole(strict(value, origin))
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            Manifest::ClusterRoleBinding(strict(value, origin))
        }
        ("rbac.authorization.k8s.io/v1", "Role") => Manifest::Role(strict(value, origin)),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            Manifest::RoleBinding(strict(value, origin))
        }
        ("apps/v1", "DaemonSet") => Manifest::DaemonSet(strict(value, origin)),
        ("apps/v1", "Deployment") => Manifest::Deployment(strict(value, origin)),
        ("policy/v1", "PodDisruptionBudget") => {
            Manifest::PodDisruptionBudget(strict(value, origin))
        }
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            Manifest::MutatingWebhookConfiguration(strict(value, origin))
        }
        ("batch/v1", "Job") => Manifest::Job(strict(value, origin)),
        ("batch/v1", "CronJob") => Manifest::CronJob(strict(value, origin)),
        ("cert-manager.io/v1", "Issuer") => Manifest::Issuer(strict(value, origin)),
        ("cert-manager.io/v1", "Certificate") => Manifest::Certificate(strict(value, origin)),
        (api_version, kind) => panic!("{origin}: unknown kind {api_version}/{kind}"),
    }
}

fn manifest_value(m: &Manifest) -> Value {
    match m {
        Manifest::ServiceAccount(x) => serde_json::to_value(x),
        Manifest::ClusterRole(x) => serde_json::to_value(x),
        Manifest::ClusterRoleBinding(x) => serde_json::to_value(x),
        Manifest::Role(x) => serde_json::to_value(x),
        Manifest::RoleBinding(x) => serde_json::to_value(x),
        Manifest::ConfigMap(x) => serde_json::to_value(x),
        Manifest::DaemonSet(x) => serde_json::to_value(x),
        Manifest::Deployment(x) => serde_json::to_value(x),
        Manifest::Service(x) => serde_json::to_value(x),
        Manifest::PodDisruptionBudget(x) => serde_json::to_value(x),
        Manifest::MutatingWebhookConfiguration(x) => serde_json::to_value(x),
        Manifest::Job(x) => serde_json::to_value(x),
        Manifest::CronJob(x) => serde_json::to_value(x),
        Manifest::Issuer(x) => serde_json::to_value(x),
        Manifest::Certificate(x) => serde_json::to_value(x),
    }
    .unwrap()
}

trait Kind: Sized {
    fn pick(m: &Manifest) -> Option<&Self>;
    fn meta(&self) -> &ObjectMeta;
    fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }
}

macro_rules! kind {
    ($($variant:ident => $ty:ty),* $(,)?) => {$(
        impl Kind for $ty {
            fn pick(m: &Manifest) -> Option<&Self> {
                match m { Manifest::$variant(x) => Some(x), _ => None }
            }
            fn meta(&self) -> &ObjectMeta { &self.metadata }
        }
    )*};
}
kind! {
    ServiceAccount => ServiceAccount, ClusterRole => ClusterRole, ClusterRoleBinding => ClusterRoleBinding,
    Role => Role, RoleBinding => RoleBinding, ConfigMap => ConfigMap, DaemonSet => DaemonSet,
    Deployment => Deployment, Service => Service, PodDisruptionBudget => PodDisruptionBudget,
    MutatingWebhookConfiguration => MutatingWebhookConfiguration, Job => Job, CronJob => CronJob,
    Issuer => cert_manager::Issuer, Certificate => cert_manager::Certificate,
}

#[derive(Debug)]
struct Scenario {
    name: String,
    manifests: Vec<Manifest>,
    values: Value,
}

impl Scenario {
    fn all<T: Kind>(&self) -> Vec<&T> {
        self.manifests.iter().filter_map(T::pick).collect()
    }

    fn get<T: Kind>(&self, name: &str) -> &T {
        let found: Vec<&T> = self
            .all::<T>()
            .into_iter()
            .filter(|t| t.name() == name)
            .collect();
        match found.as_slice() {
            [one] => one,
            _ => panic!(
                "{}: expected exactly one {} named {name}, found {}",
                self.name,
                std::any::type_name::<T>(),
                found.len()
            ),
        }
    }

    fn config_data(&self, name: &str, key: &str) -> String {
        let cm: &ConfigMap = self.get(name);
        cm.data
            .as_ref()
            .and_then(|d| d.get(key))
            .cloned()
            .unwrap_or_else(|| panic!("{name} has no {key}"))
    }

    /// The `nvidia:` section of the device plugin's device-config.yaml.
    fn device_config(&self) -> Value {
        let text = self.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
        let v: Value = serde_yaml_ng::from_str(&text).unwrap();
        v["nvidia"].clone()
    }

    fn webhook_settings(&self) -> Value {
        serde_yaml_ng::from_str(&self.config_data(&format!("{PREFIX}-webhook"), "webhook.yaml"))
            .unwrap()
    }

    fn node_config(&self) -> Value {
        serde_json::from_str(&self.config_data(&format!("{PREFIX}-node-config"), "config.json"))
            .unwrap()
    }

    fn webhook_config(&self) -> &MutatingWebhookConfiguration {
        self.get(PREFIX)
    }
}

#[derive(Debug)]
struct Rendered {
    _dir: tempfile::TempDir,
    scenarios: BTreeMap<String, Scenario>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn load_scenario(dir: &Path) -> Scenario {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let mut manifests = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "yaml"))
    {
        let text = std::fs::read_to_string(file).unwrap();
        let file_name = file.file_name().unwrap().to_string_lossy();
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{name}/{file_name}: document {i} is not YAML: {e}"));
            if value.is_null() {
                continue; // a document that rendered to comments only
            }
            manifests.push(parse_manifest(
                &value,
                &format!("{name}/{file_name} document {i}"),
            ));
        }
    }
    let values =
        serde_json::from_str(&std::fs::read_to_string(dir.join("values.json")).unwrap()).unwrap();
    Scenario {
        name,
        manifests,
        values,
    }
}

/// Runs `charts/tests/render.py` once per test binary (lint, schema checks, every scenario).
fn rendered() -> &'static Rendered {
    static RENDERED: OnceLock<Rendered> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let python = std::env::var("HAMI_CHART_PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let script = repo_root().join("charts/tests/render.py");
        let out = Command::new(&python).arg(&script).arg(dir.path()).output().unwrap_or_else(|e| {
            panic!(
                "cannot run {python} {}: {e}; install with: pip install -r scripts/requirements-test.txt",
                script.display()
            )
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "charts/tests/render.py failed ({}):\n{stdout}\n{stderr}\n(needs: pip install -r scripts/requirements-test.txt)",
            out.status
        );
        eprintln!("{stdout}");
        let mut scenarios = BTreeMap::new();
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let s = load_scenario(&path);
                scenarios.insert(s.name.clone(), s);
            }
        }
        Rendered { _dir: dir, scenarios }
    })
}

fn scenario(name: &str) -> &'static Scenario {
    rendered()
        .scenarios
        .get(name)
        .unwrap_or_else(|| panic!("render.py did not render scenario {name}"))
}

fn pod_spec_of_deployment(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn pod_spec_of_daemonset(d: &DaemonSet) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// `group/resource:verb[resourceNames]` for every combination a rule grants.
fn rule_set(rules: &[PolicyRule]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in rules {
        let names = r
            .resource_names
            .as_ref()
            .map(|n| n.join(","))
            .unwrap_or_default();
        for group in r.api_groups.iter().flatten() {
            for resource in r.resources.iter().flatten() {
                for verb in &r.verbs {
                    out.insert(format!("{group}/{resource}:{verb}[{names}]"));
                }
            }
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn annotations(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations.clone().unwrap_or_default()
}

#[test]
fn every_scenario_renders_only_known_kinds_with_unique_names() {
    let r = rendered();
    let expected = [
        "cert-manager",
        "cert-manager-issuer",
        "custom-names",
        "default",
        "device-plugin-only",
        "env-delivery",
        "hook-installer",
        "ignore-no-conditions",
        "kai",
        "kai-only",
        "per-gpu-vram",
        "per-node",
        "webhook-only",
    ];
    assert_eq!(
        r.scenarios.keys().map(String::as_str).collect::<Vec<_>>(),
        expected
    );
    for s in r.scenarios.values() {
        assert!(!s.manifests.is_empty(), "{}: nothing rendered", s.name);
        let mut seen = BTreeSet::new();
        for m in &s.manifests {
            let v = manifest_value(m);
            let key = format!(
                "{}/{}/{}",
                v["kind"], v["metadata"]["namespace"], v["metadata"]["name"]
            );
            assert!(seen.insert(key.clone()), "{}: duplicate {key}", s.name);
            let ns = v["metadata"]["namespace"].as_str();
            assert!(
                ns.is_none() || ns == Some(NS),
                "{}: {key} outside the release namespace",
                s.name
            );
            let labels = &v["metadata"]["labels"];
            assert_eq!(
                labels["app.kubernetes.io/instance"], "hl",
                "{}: {key} lacks instance label",
                s.name
            );
            assert_eq!(labels["app.kubernetes.io/part-of"], "hami-limits");
        }
    }
    let total: usize = r.scenarios.values().map(|s| s.manifests.len()).sum();
    eprintln!(
        "parsed {total} manifests in {} scenarios",
        r.scenarios.len()
    );
}

#[test]
fn every_reference_resolves_and_every_container_is_locked_down() {
    for s in rendered().scenarios.values() {
        let accounts: BTreeSet<&str> = s.all::<ServiceAccount>().iter().map(|a| a.name()).collect();
        let maps: BTreeSet<&str> = s.all::<ConfigMap>().iter().map(|a| a.name()).collect();
        let mut specs: Vec<(&str, &PodSpec)> = Vec::new();
        for d in s.all::<Deployment>() {
            specs.push((d.name(), pod_spec_of_deployment(d)));
        }
        for d in s.all::<DaemonSet>() {
            specs.push((d.name(), pod_spec_of_daemonset(d)));
        }
        for j in s.all::<Job>() {
            specs.push((
                j.name(),
                j.spec.as_ref().unwrap().template.spec.as_ref().unwrap(),
            ));
        }
        for c in s.all::<CronJob>() {
            let job = c.spec.as_ref().unwrap().job_template.spec.as_ref().unwrap();
            specs.push((c.name(), job.template.spec.as_ref().unwrap()));
        }
        for (owner, spec) in specs {
            let sa = spec.service_account_name.as_deref().unwrap();
            assert!(
                accounts.contains(sa),
                "{}: {owner} uses missing ServiceAccount {sa}",
                s.name
            );
            for v in spec.volumes.iter().flatten() {
                if let Some(cm) = &v.config_map {
                    assert!(
                        maps.contains(cm.name.as_str()),
                        "{}: {owner} mounts missing ConfigMap {}",
                        s.name,
                        cm.name
                    );
                }
            }
            for c in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                for m in c.volume_mounts.iter().flatten() {
                    assert!(
                        spec.volumes.iter().flatten().any(|v| v.name == m.name),
                        "{}: {owner}/{} mounts undeclared volume {}",
                        s.name,
                        c.name,
                        m.name
                    );
                }
                let sc = c
                    .security_context
                    .as_ref()
                    .unwrap_or_else(|| panic!("{owner}/{}: no securityContext", c.name));
                assert_eq!(
                    sc.read_only_root_filesystem,
                    Some(true),
                    "{}: {owner}/{}",
                    s.name,
                    c.name
                );
                assert_eq!(
                    sc.allow_privilege_escalation,
                    Some(false),
                    "{}: {owner}/{}",
                    s.name,
                    c.name
                );
                let caps = sc.capabilities.as_ref();
                assert_eq!(
                    caps.and_then(|c| c.drop.as_deref()),
                    Some(&["ALL".to_owned()][..]),
                    "{}: {owner}/{}",
                    s.name,
                    c.name
                );
                if c.name != "device-plugin" {
                    assert!(
                        caps.and_then(|c| c.add.as_ref()).is_none(),
                        "{}: {owner}/{} adds capabilities",
                        s.name,
                        c.name
                    );
                }
                assert!(
                    c.resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.contains_key("memory")),
                    "{}: {owner}/{}: no memory limit",
                    s.name,
                    c.name
                );
            }
        }
        let roles: BTreeSet<&str> = s.all::<Role>().iter().map(|a| a.name()).collect();
        for b in s.all::<RoleBinding>() {
            assert!(
                roles.contains(b.role_ref.name.as_str()),
                "{}: RoleBinding to missing Role",
                s.name
            );
            for subject in b.subjects.iter().flatten() {
                assert!(
                    accounts.contains(subject.name.as_str()),
                    "{}: binds missing SA {}",
                    s.name,
                    subject.name
                );
            }
        }
        let cluster_roles: BTreeSet<&str> =
            s.all::<ClusterRole>().iter().map(|a| a.name()).collect();
        for b in s.all::<ClusterRoleBinding>() {
            assert!(
                cluster_roles.contains(b.role_ref.name.as_str()),
                "{}: binding to missing ClusterRole",
                s.name
            );
            for subject in b.subjects.iter().flatten() {
                assert!(
                    accounts.contains(subject.name.as_str()),
                    "{}: binds missing SA {}",
                    s.name,
                    subject.name
                );
                assert_eq!(subject.namespace.as_deref(), Some(NS));
            }
        }
    }
}

#[test]
fn webhook_deployment_is_hardened_and_probed() {
    let s = scenario("default");
    let d: &Deployment = s.get(&format!("{PREFIX}-webhook"));
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = pod_spec_of_deployment(d);
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let anti = pod
        .affinity
        .as_ref()
        .unwrap()
        .pod_anti_affinity
        .as_ref()
        .unwrap();
    let term = &anti
        .preferred_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        term.pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert_eq!(
        term.pod_affinity_term
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels,
        spec.selector.match_labels,
        "anti-affinity selects the webhook's own pods"
    );
    let c = container(pod, "webhook");
    assert_eq!(
        c.args.as_deref().unwrap(),
        ["serve", "--config=/etc/hami-limits/webhook.yaml"]
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref().unwrap(),
        ["ALL"]
    );
    let res = c.resources.as_ref().unwrap();
    assert!(res.requests.as_ref().unwrap().contains_key("cpu"));
    let ports: BTreeMap<_, _> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("https".to_owned(), 9443), ("metrics".to_owned(), 9090)])
    );
    for (probe, path) in [
        (c.liveness_probe.as_ref(), "/healthz"),
        (c.readiness_probe.as_ref(), "/readyz"),
    ] {
        let get = probe.unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            IntOrString::String("metrics".into()),
            "probes use the metrics port"
        );
    }
    // The settings file the webhook reads listens where the container ports say.
    let settings = s.webhook_settings();
    assert_eq!(settings["server"]["listen"], "0.0.0.0:9443");
    assert_eq!(settings["server"]["metricsListen"], "0.0.0.0:9090");
    assert_eq!(settings["server"]["tlsCert"], "/tls/tls.crt");
    assert_eq!(settings["server"]["tlsKey"], "/tls/tls.key");
    assert_eq!(settings["server"]["bodyLimitBytes"], 8_388_608);
    // Only the serving pair reaches the webhook, never ca.key.
    let tls = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "tls")
        .unwrap()
        .secret
        .as_ref()
        .unwrap();
    assert_eq!(
        tls.secret_name.as_deref(),
        Some("hl-hami-limits-webhook-tls")
    );
    let keys: Vec<_> = tls.items.iter().flatten().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["tls.crt", "tls.key"]);
    assert_eq!(tls.default_mode, Some(0o440));
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "tls")
        .unwrap();
    assert_eq!(mount.mount_path, "/tls");

    let pdb: &PodDisruptionBudget = s.get(&format!("{PREFIX}-webhook"));
    let pdb_spec = pdb.spec.as_ref().unwrap();
    assert_eq!(pdb_spec.min_available, Some(IntOrString::Int(1)));
    assert_eq!(
        pdb_spec.selector.as_ref().unwrap().match_labels,
        spec.selector.match_labels
    );

    let svc: &Service = s.get(&format!("{PREFIX}-webhook"));
    let svc_spec = svc.spec.as_ref().unwrap();
    assert_eq!(svc_spec.selector, spec.selector.match_labels);
    let https = svc_spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https"))
        .unwrap();
    assert_eq!(https.port, 443);
    assert_eq!(https.target_port, Some(IntOrString::String("https".into())));
}

#[test]
fn one_replica_gets_no_pdb_that_would_block_drains() {
    let s = scenario("ignore-no-conditions");
    assert!(s.all::<PodDisruptionBudget>().is_empty());
    let d: &Deployment = s.get(&format!("{PREFIX}-webhook"));
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
}

#[test]
fn mutating_webhook_configuration_defaults() {
    let s = scenario("default");
    let mwc = s.webhook_config();
    let hooks = mwc.webhooks.as_ref().unwrap();
    assert_eq!(hooks.len(), 1);
    let w = &hooks[0];
    assert_eq!(w.admission_review_versions, ["v1"]);
    assert_eq!(w.side_effects, "None");
    assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(w.timeout_seconds, Some(10));
    assert_eq!(w.reinvocation_policy.as_deref(), Some("IfNeeded"));
    let rules = w.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].operations.as_deref().unwrap(), ["CREATE"]);
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    assert_eq!(rules[0].api_groups.as_deref().unwrap(), [""]);
    let svc = w.client_config.service.as_ref().unwrap();
    assert_eq!(svc.name, format!("{PREFIX}-webhook"));
    assert_eq!(svc.namespace, NS);
    assert_eq!(svc.path.as_deref(), Some("/mutate"));
    assert_eq!(svc.port, Some(443));
    assert!(
        w.client_config.ca_bundle.is_none(),
        "offline render: certgen's patch Job fills caBundle"
    );
    assert!(annotations(&mwc.metadata).is_empty());

    let ns_sel = w
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    let by_key: BTreeMap<_, _> = ns_sel.iter().map(|e| (e.key.as_str(), e)).collect();
    let names = by_key["kubernetes.io/metadata.name"];
    assert_eq!(names.operator, "NotIn");
    assert_eq!(names.values.as_deref().unwrap(), [NS, "kube-system"]);
    assert_eq!(by_key["hami.io/webhook"].operator, "NotIn");
    assert_eq!(
        by_key["hami.io/webhook"].values.as_deref().unwrap(),
        ["ignore"]
    );
    let obj_sel = w
        .object_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(obj_sel.len(), 1);
    assert_eq!(obj_sel[0].key, "hami.io/webhook");
    assert_eq!(obj_sel[0].operator, "NotIn");
    assert_eq!(obj_sel[0].values.as_deref().unwrap(), ["ignore"]);

    let conditions = w.match_conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 1);
    let expr = &conditions[0].expression;
    for needle in [
        "'gpu-memory'",
        "'gpu-fraction'",
        "'hami.io/limit-delivery'",
        "initContainers",
        "requests",
        "limits",
    ] {
        assert!(
            expr.contains(needle),
            "matchConditions lacks {needle}: {expr}"
        );
    }
    for r in HAMI_RESOURCES {
        assert!(
            expr.contains(&format!("'{r}'")),
            "matchConditions lacks resource {r}"
        );
    }
    assert_eq!(
        expr.matches('(').count(),
        expr.matches(')').count(),
        "unbalanced CEL: {expr}"
    );
}

#[test]
fn ignore_policy_without_match_conditions_and_extra_exclusions() {
    let s = scenario("ignore-no-conditions");
    let w = &s.webhook_config().webhooks.as_ref().unwrap()[0];
    assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(w.timeout_seconds, Some(5));
    assert!(w.match_conditions.is_none());
    let exprs = w
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(
        exprs[0].values.as_deref().unwrap(),
        [NS, "kube-system", "monitoring"]
    );
    assert!(s.all::<CronJob>().is_empty(), "renewal disabled");
    assert_eq!(s.all::<Job>().len(), 2, "hook Jobs stay");
}

#[test]
fn certgen_hooks_create_before_and_patch_after() {
    let s = scenario("default");
    let create: &Job = s.get(&format!("{PREFIX}-certgen-create"));
    let patch: &Job = s.get(&format!("{PREFIX}-certgen-patch"));
    let a = annotations(&create.metadata);
    assert_eq!(a["helm.sh/hook"], "pre-install,pre-upgrade");
    assert_eq!(a["helm.sh/hook-weight"], "-10");
    let b = annotations(&patch.metadata);
    assert_eq!(b["helm.sh/hook"], "post-install,post-upgrade");
    let spec = create
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(
        container(spec, "create").args.as_deref().unwrap(),
        [
            "create",
            "--namespace=hami-system",
            "--secret-name=hl-hami-limits-webhook-tls",
            "--service=hl-hami-limits-webhook",
            "--cluster-domain=cluster.local",
            "--ca-days=3650",
            "--cert-days=365",
            "--renew-before-days=30",
        ]
    );
    let pspec = patch.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        container(pspec, "patch").args.as_deref().unwrap(),
        [
            "patch",
            "--namespace=hami-system",
            "--secret-name=hl-hami-limits-webhook-tls",
            "--webhook-name=hl-hami-limits"
        ]
    );
    assert_eq!(
        spec.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    // The certificate is made for the Service the MutatingWebhookConfiguration calls.
    let svc = s.webhook_config().webhooks.as_ref().unwrap()[0]
        .client_config
        .service
        .clone()
        .unwrap();
    assert!(
        container(spec, "create")
            .args
            .as_ref()
            .unwrap()
            .contains(&format!("--service={}", svc.name))
    );

    // Its RBAC exists before the Jobs run (a hook with a lower weight) and names only its objects.
    let hook_name = format!("{PREFIX}-certgen-hook");
    for m in &s.manifests {
        let v = manifest_value(m);
        if v["metadata"]["name"] == hook_name.as_str() {
            let ann = &v["metadata"]["annotations"];
            assert_eq!(
                ann["helm.sh/hook"], "pre-install,pre-upgrade,post-install,post-upgrade",
                "{}",
                v["kind"]
            );
            assert!(
                ann["helm.sh/hook-weight"]
                    .as_str()
                    .unwrap()
                    .parse::<i32>()
                    .unwrap()
                    < -10
            );
        }
    }
    let role: &Role = s.get(&hook_name);
    assert_eq!(
        rule_set(role.rules.as_deref().unwrap()),
        set(&[
            "/secrets:create[]",
            "/secrets:get[hl-hami-limits-webhook-tls]",
            "/secrets:update[hl-hami-limits-webhook-tls]"
        ])
    );
    let cr: &ClusterRole = s.get(&hook_name);
    assert_eq!(
        rule_set(cr.rules.as_deref().unwrap()),
        set(&[
            "admissionregistration.k8s.io/mutatingwebhookconfigurations:get[hl-hami-limits]",
            "admissionregistration.k8s.io/mutatingwebhookconfigurations:update[hl-hami-limits]",
        ])
    );

    // Renewal CronJob: create then patch, with its own (non-hook) identity and the same rights.
    let cron: &CronJob = s.get(&format!("{PREFIX}-certgen-renew"));
    let cspec = cron.spec.as_ref().unwrap();
    assert_eq!(cspec.concurrency_policy.as_deref(), Some("Forbid"));
    let pod = cspec
        .job_template
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(
        pod.init_containers.as_ref().unwrap()[0]
            .args
            .as_ref()
            .unwrap()[0],
        "create"
    );
    assert_eq!(pod.containers[0].args.as_ref().unwrap()[0], "patch");
    let renew = format!("{PREFIX}-certgen-renew");
    assert!(annotations(s.get::<ServiceAccount>(&renew).meta()).is_empty());
    assert_eq!(
        rule_set(s.get::<Role>(&renew).rules.as_deref().unwrap()),
        rule_set(role.rules.as_deref().unwrap())
    );
}

#[test]
fn cert_manager_replaces_certgen() {
    let s = scenario("cert-manager");
    assert!(
        s.all::<Job>().is_empty() && s.all::<CronJob>().is_empty(),
        "no certgen with cert-manager"
    );
    assert!(
        s.all::<Role>().is_empty(),
        "no certgen RBAC with cert-manager"
    );
    let svc = format!("{PREFIX}-webhook");
    let cert: &cert_manager::Certificate = s.get(&svc);
    assert_eq!(cert.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(cert.spec.secret_name, "hl-hami-limits-webhook-tls");
    assert_eq!(
        cert.spec.dns_names,
        [
            svc.clone(),
            format!("{svc}.{NS}"),
            format!("{svc}.{NS}.svc"),
            format!("{svc}.{NS}.svc.cluster.local")
        ]
    );
    assert!(cert.spec.usages.contains(&"server auth".to_owned()));
    let issuer: &cert_manager::Issuer = s.get(&cert.spec.issuer_ref.name);
    assert!(issuer.spec.self_signed.is_empty());
    assert_eq!(cert.spec.issuer_ref.kind, "Issuer");
    let mwc = s.webhook_config();
    assert_eq!(
        annotations(&mwc.metadata)["cert-manager.io/inject-ca-from"],
        format!("{NS}/{}", cert.name())
    );
    let d: &Deployment = s.get(&svc);
    let tls = pod_spec_of_deployment(d)
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "tls")
        .unwrap();
    assert_eq!(
        tls.secret.as_ref().unwrap().secret_name.as_deref(),
        Some(cert.spec.secret_name.as_str())
    );

    let s = scenario("cert-manager-issuer");
    assert!(
        s.all::<cert_manager::Issuer>().is_empty(),
        "an existing issuer is used as is"
    );
    let cert: &cert_manager::Certificate = s.get(&svc);
    assert_eq!(cert.spec.issuer_ref.name, "corp-ca");
    assert_eq!(cert.spec.issuer_ref.kind, "ClusterIssuer");
    assert_eq!(cert.spec.secret_name, "custom-tls");
}

#[test]
fn device_plugin_daemonset_and_least_privilege_rbac() {
    let s = scenario("default");
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    assert_eq!(pod.node_selector.as_ref().unwrap()["gpu"], "on");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(
        pod.tolerations
            .as_ref()
            .unwrap()
            .iter()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu"))
    );
    let c = container(pod, "device-plugin");
    assert_eq!(
        c.args.as_deref().unwrap(),
        [
            "run",
            "--config=/etc/hami-limits/device-config/device-config.yaml",
            "--node-config=/etc/hami-limits/node-config/config.json",
            "--kubelet-dir=/var/lib/kubelet/device-plugins",
        ]
    );
    let env: BTreeMap<_, _> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e))
        .collect();
    let node = env["NODE_NAME"]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(node.field_path, "spec.nodeName");
    assert_eq!(env["HOOK_PATH"].value.as_deref(), Some("/usr/local"));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref().unwrap(), ["ALL"]);
    assert_eq!(
        caps.add.as_deref().unwrap(),
        ["DAC_OVERRIDE", "FOWNER"],
        "only what the folders need"
    );

    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let kubelet = volumes["device-plugins"].host_path.as_ref().unwrap();
    assert_eq!(kubelet.path, "/var/lib/kubelet/device-plugins");
    let hook = volumes["hami-core"].host_path.as_ref().unwrap();
    assert_eq!(hook.path, "/usr/local/vgpu");
    assert_eq!(hook.type_.as_deref(), Some("DirectoryOrCreate"));
    let mounts: BTreeMap<_, _> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m))
        .collect();
    assert_eq!(
        mounts["device-plugins"].mount_path,
        "/var/lib/kubelet/device-plugins"
    );
    assert_eq!(
        mounts["hami-core"].mount_path, "/usr/local/vgpu",
        "container paths equal host paths"
    );
    assert_eq!(mounts["device-config"].read_only, Some(true));

    assert_installs_hook(s, pod, "/usr/local");

    let cr: &ClusterRole = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(
        rule_set(cr.rules.as_deref().unwrap()),
        set(&[
            "/pods:get[]",
            "/pods:list[]",
            "/pods:watch[]",
            "/pods:patch[]",
            "/nodes:get[]",
            "/nodes:patch[]",
            "/events:create[]",
            "events.k8s.io/events:create[]",
        ])
    );
    let wr: &ClusterRole = s.get(&format!("{PREFIX}-webhook"));
    assert_eq!(
        rule_set(wr.rules.as_deref().unwrap()),
        set(&["/nodes:get[]", "/nodes:list[]", "/nodes:watch[]"])
    );
}

#[test]
fn device_config_defaults_and_env_delivery() {
    let s = scenario("default");
    let nvidia = s.device_config();
    assert_eq!(nvidia["limitDelivery"], "file");
    assert_eq!(nvidia["gpuCorePolicy"], "default");
    assert_eq!(nvidia["resourceCountName"], "nvidia.com/gpu");
    assert_eq!(nvidia["resourceMemoryName"], "nvidia.com/gpumem");
    assert_eq!(
        nvidia["resourceMemoryPercentageName"],
        "nvidia.com/gpumem-percentage"
    );
    assert_eq!(nvidia["resourceCoreName"], "nvidia.com/gpucores");
    assert_eq!(nvidia["resourcePriorityName"], "nvidia.com/priority");
    assert_eq!(nvidia["deviceSplitCount"], 10);
    assert_eq!(nvidia["deviceMemoryScaling"], 1);
    assert_eq!(nvidia["disableCoreLimit"], false);
    assert!(
        nvidia.get("libCudaLogLevel").is_none(),
        "unset unless configured"
    );
    assert_eq!(s.node_config(), json!({"nodeconfig": []}));
    // The webhook reads the same nvidia section.
    assert_eq!(s.webhook_settings()["nvidia"], nvidia);

    let env = scenario("env-delivery");
    assert_eq!(env.device_config()["limitDelivery"], "env");
    // A config change rolls the plugin.
    let checksum = |sc: &Scenario| {
        let ds: &DaemonSet = sc.get(&format!("{PREFIX}-device-plugin"));
        annotations(
            ds.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap(),
        )["checksum/config"]
            .clone()
    };
    assert_ne!(checksum(s), checksum(env));
}

#[test]
fn per_node_overrides_render_into_config_json() {
    let s = scenario("per-node");
    assert_eq!(
        s.device_config()["limitDelivery"],
        "env",
        "global env, canary node file"
    );
    let cfg = s.node_config();
    let entries = cfg["nodeconfig"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0],
        json!({"name": "gpu-canary-1", "limitdelivery": "file"})
    );
    assert_eq!(entries[1]["name"], "gpu-a100-7");
    assert_eq!(entries[1]["operatingmode"], "hami-core");
    assert_eq!(entries[1]["devicesplitcount"], 4);
    assert_eq!(entries[1]["devicememoryscaling"], 1.5);
    assert_eq!(entries[1]["libcudaloglevel"], 2);
    assert_eq!(
        entries[1]["filterdevices"],
        json!({"uuid": ["GPU-0d9e7f3a"], "index": [3]})
    );
    assert_eq!(entries[1]["enablegetpreferredallocation"], true);
    assert_eq!(entries[1]["limitdelivery"], "file");
    assert_eq!(
        entries,
        s.values["devicePlugin"]["nodeConfig"]
            .as_array()
            .unwrap()
            .as_slice()
    );
}

#[test]
fn kai_settings_and_per_gpu_vram() {
    let default = scenario("default").webhook_settings();
    assert_eq!(default["schedulerName"], "hami-scheduler");
    assert_eq!(default["denyPrivilegedGpuContainers"], true);
    assert_eq!(default["kai"]["schedulerNames"], json!(["kai-scheduler"]));
    assert_eq!(default["kai"]["hookPath"], "/usr/local/vgpu");
    assert_eq!(default["kai"]["preloadContainers"], "fraction");
    assert_eq!(default["kai"]["limitDelivery"], "file");
    assert!(
        default["kai"].get("perGpuVramMib").is_none(),
        "detection from node labels by default"
    );

    let vram = scenario("per-gpu-vram").webhook_settings();
    assert_eq!(vram["kai"]["perGpuVramMib"], 81920);

    let kai = scenario("kai").webhook_settings();
    assert_eq!(
        kai["kai"]["schedulerNames"],
        json!(["kai-scheduler", "kai-scheduler-batch"])
    );
    assert_eq!(kai["kai"]["hookPath"], "/opt/vgpu");
    assert_eq!(kai["kai"]["preloadContainers"], "all");
    assert_eq!(kai["kai"]["limitDelivery"], "env");
}

#[test]
fn custom_resource_names_reach_config_and_match_conditions() {
    let s = scenario("custom-names");
    let nvidia = s.device_config();
    assert_eq!(nvidia["resourceCountName"], "example.com/vgpu");
    assert_eq!(nvidia["gpuCorePolicy"], "force");
    assert_eq!(nvidia["libCudaLogLevel"], 3);
    assert_eq!(nvidia["deviceMemoryScaling"], 2);
    assert_eq!(s.webhook_settings()["nvidia"], nvidia);
    let expr = &s.webhook_config().webhooks.as_ref().unwrap()[0]
        .match_conditions
        .as_ref()
        .unwrap()[0]
        .expression;
    assert!(expr.contains("'example.com/vgpu'") && expr.contains("'example.com/vgpu-memory'"));
    assert!(!expr.contains("'nvidia.com/gpu'"));
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
    let hook = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "hami-core")
        .unwrap();
    assert_eq!(hook.host_path.as_ref().unwrap().path, "/opt/hami/vgpu");
    let c = container(pod, "device-plugin");
    let env = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "HOOK_PATH")
        .unwrap();
    assert_eq!(env.value.as_deref(), Some("/opt/hami"));
    assert_eq!(
        s.webhook_settings()["kai"]["hookPath"],
        "/opt/hami/vgpu",
        "KAI pods get the plugin's HAMi-core"
    );
}

#[test]
fn components_can_be_installed_alone() {
    let s = scenario("webhook-only");
    assert!(s.all::<DaemonSet>().is_empty());
    assert_eq!(s.all::<Deployment>().len(), 1);
    let s = scenario("device-plugin-only");
    assert!(s.all::<Deployment>().is_empty());
    assert!(s.all::<MutatingWebhookConfiguration>().is_empty());
    assert!(
        s.all::<Job>().is_empty(),
        "no certificates without the webhook"
    );
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    assert!(pod.init_containers.is_none(), "hamiCore.install: false");
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .all(|v| v.name != "hami-core-image"),
        "no hand-off folder without the init containers"
    );
}

/// Where the device plugin image carries the preload library: the chart's `--preload` and the
/// Dockerfile's `COPY` must both say it.
fn preload_in_image() -> String {
    format!(
        "/usr/local/lib/hami-limits/{}",
        hami_shared::names::LIBHAMI_PRELOAD_SO
    )
}

/// HAMi-core is installed in two steps: `copy-hami-core` (HAMi's image, only `sh` and `cp`) copies
/// HAMi's library folder into an emptyDir, then `install-hook` (our image) installs from it into
/// `<hook>/vgpu` on the host, mounted at the same path (ld.so.preload names the libraries by the
/// path workloads see).
fn assert_installs_hook(s: &Scenario, pod: &PodSpec, hook: &str) {
    let name = &s.name;
    let vgpu = format!("{}/vgpu", hook.trim_end_matches('/'));
    let inits: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        inits,
        ["copy-hami-core", "install-hook"],
        "{name}: copy first, then install"
    );

    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let handoff = volumes["hami-core-image"]
        .empty_dir
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: hami-core-image is not an emptyDir"));
    assert_eq!(handoff.medium, None, "{name}: on disk, not in memory");
    assert!(handoff.size_limit.is_some(), "{name}: no sizeLimit");
    let host = volumes["hami-core"]
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: hami-core is not a hostPath"));
    assert_eq!(host.path, vgpu, "{name}");
    assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"), "{name}");
    let mounts = |c: &Container| -> BTreeMap<String, (String, bool)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                (
                    m.name.clone(),
                    (m.mount_path.clone(), m.read_only == Some(true)),
                )
            })
            .collect()
    };

    let copy = container(pod, "copy-hami-core");
    assert_eq!(
        copy.image.as_deref(),
        Some("projecthami/hami:v2.10.0"),
        "{name}"
    );
    assert_eq!(
        copy.command.as_deref().unwrap(),
        ["/bin/sh", "-c"],
        "{name}: HAMi's image is assumed to have sh and cp only"
    );
    let script = &copy.args.as_ref().unwrap()[0];
    assert!(
        script.contains(r#"cp -RPf "$HAMI_CORE_SOURCE_DIR/." /hami-core/"#),
        "{name}: the whole folder, links kept as links: {script}"
    );
    let env: BTreeMap<_, _> = copy
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert_eq!(
        env,
        BTreeMap::from([
            ("HAMI_CORE_SOURCE_DIR", Some("/k8s-vgpu/lib/nvidia")),
            ("NVIDIA_VISIBLE_DEVICES", Some("void")),
        ]),
        "{name}"
    );
    assert_eq!(
        mounts(copy),
        BTreeMap::from([(
            "hami-core-image".to_owned(),
            ("/hami-core".to_owned(), false)
        )]),
        "{name}: HAMi's image never sees the host folder"
    );

    let install = container(pod, "install-hook");
    assert_eq!(
        install.image.as_deref(),
        Some("ghcr.io/hami-limits/hami-device-plugin:0.1.0"),
        "{name}: the device plugin image"
    );
    assert!(
        install.command.is_none(),
        "{name}: the image's entrypoint, hami-device-plugin"
    );
    assert_eq!(
        install.args.as_deref().unwrap(),
        [
            "install-hook".to_owned(),
            "--hami-core-dir=/hami-core".to_owned(),
            format!("--preload={}", preload_in_image()),
            format!("--hook-path={hook}"),
        ],
        "{name}"
    );
    assert_eq!(
        mounts(install),
        BTreeMap::from([
            (
                "hami-core-image".to_owned(),
                ("/hami-core".to_owned(), true)
            ),
            ("hami-core".to_owned(), (vgpu.clone(), false)),
        ]),
        "{name}: container path = host path"
    );

    for c in [copy, install] {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            sc.run_as_user,
            Some(0),
            "{name}/{}: the host folder is root's",
            c.name
        );
        assert_eq!(sc.privileged, None, "{name}/{}", c.name);
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref().unwrap(), ["ALL"], "{name}/{}", c.name);
        assert!(caps.add.is_none(), "{name}/{}: no capability", c.name);
    }
}

#[test]
fn device_plugin_init_containers_install_hami_core_and_the_preload_library() {
    let mut checked = 0;
    for s in rendered().scenarios.values() {
        let Some(ds) = s
            .all::<DaemonSet>()
            .into_iter()
            .find(|d| d.name() == format!("{PREFIX}-device-plugin"))
        else {
            continue;
        };
        if s.values["devicePlugin"]["hamiCore"]["install"] == false {
            continue;
        }
        let hook = s.values["devicePlugin"]["hookPath"].as_str().unwrap();
        assert_installs_hook(s, pod_spec_of_daemonset(ds), hook);
        checked += 1;
    }
    assert!(
        checked >= 3,
        "default, custom-names, hook-installer at least"
    );
    // A non-default hook path reaches the command.
    let s = scenario("hook-installer");
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let args = container(pod_spec_of_daemonset(ds), "install-hook")
        .args
        .clone()
        .unwrap();
    assert_eq!(args.last().unwrap(), "--hook-path=/opt/hami");
}

#[test]
fn hook_installer_is_off_by_default_and_fills_the_folder_kai_pods_mount() {
    let installer = format!("{PREFIX}-hook-installer");
    let mut enabled_in = Vec::new();
    for s in rendered().scenarios.values() {
        let enabled = s.values["hookInstaller"]["enabled"] == true;
        let daemonset = s.all::<DaemonSet>().iter().any(|d| d.name() == installer);
        let account = s
            .all::<ServiceAccount>()
            .iter()
            .any(|a| a.name() == installer);
        assert_eq!(
            (daemonset, account),
            (enabled, enabled),
            "{}: hook installer rendered iff hookInstaller.enabled",
            s.name
        );
        if !enabled {
            continue;
        }
        enabled_in.push(s.name.as_str());
        let values = &s.values["hookInstaller"];
        let ds: &DaemonSet = s.get(&installer);
        let pod = pod_spec_of_daemonset(ds);
        // The folder the webhook mounts into KAI pods is the one the installer fills.
        let kai_dir = s.webhook_settings()["kai"]["hookPath"]
            .as_str()
            .unwrap()
            .to_owned();
        let hook = kai_dir
            .strip_suffix("/vgpu")
            .unwrap_or_else(|| panic!("{}: {kai_dir} does not end in /vgpu", s.name));
        assert_installs_hook(s, pod, hook);

        // No API access.
        let sa: &ServiceAccount = s.get(&installer);
        assert_eq!(sa.automount_service_account_token, Some(false));
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some(installer.as_str())
        );
        // Placement and resources from its values.
        assert_eq!(
            serde_json::to_value(&pod.node_selector).unwrap(),
            values["nodeSelector"],
            "{}",
            s.name
        );
        assert_eq!(
            serde_json::to_value(&pod.tolerations).unwrap(),
            values["tolerations"],
            "{}",
            s.name
        );
        let priority = values["priorityClassName"].as_str().unwrap();
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some(priority).filter(|p| !p.is_empty()),
            "{}",
            s.name
        );
        // The one long-running container only sleeps, unprivileged.
        let [pause] = pod.containers.as_slice() else {
            panic!("{}: one container", s.name)
        };
        assert_eq!(pause.name, "pause");
        let image = &values["pauseImage"];
        assert_eq!(
            pause.image.as_deref(),
            Some(
                format!(
                    "{}:{}",
                    image["repository"].as_str().unwrap(),
                    image["tag"].as_str().unwrap()
                )
                .as_str()
            ),
            "{}",
            s.name
        );
        assert_eq!(
            pause.image_pull_policy.as_deref(),
            image["pullPolicy"].as_str()
        );
        assert!(pause.command.is_none() && pause.args.is_none());
        assert!(
            pause.volume_mounts.is_none(),
            "{}: pause mounts nothing",
            s.name
        );
        let sc = pause.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(65535));
        assert_eq!(
            serde_json::to_value(&pause.resources).unwrap(),
            values["resources"],
            "{}",
            s.name
        );
    }
    assert_eq!(enabled_in, ["hook-installer", "kai-only"]);

    // Defaults: off; when on, GPU Feature Discovery's GPU nodes, tolerating the GPU taint.
    let defaults = &scenario("default").values["hookInstaller"];
    assert_eq!(defaults["enabled"], false);
    assert_eq!(
        defaults["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    assert_eq!(
        defaults["pauseImage"],
        json!({"repository": "registry.k8s.io/pause", "tag": "3.10", "pullPolicy": "IfNotPresent"})
    );

    // Beside the device plugin on a non-default hook path: both install into /opt/hami/vgpu, the
    // folder the webhook mounts into KAI pods.
    let s = scenario("hook-installer");
    assert_eq!(s.webhook_settings()["kai"]["hookPath"], "/opt/hami/vgpu");
    let pod = pod_spec_of_daemonset(s.get(&installer));
    // Helm merges maps: the default label stays unless set to null.
    assert_eq!(
        pod.node_selector.as_ref().unwrap(),
        &BTreeMap::from([
            ("kai.example.com/gpu-pool".to_owned(), "shared".to_owned()),
            ("nvidia.com/gpu.present".to_owned(), "true".to_owned())
        ])
    );
    assert_eq!(
        container(pod, "install-hook")
            .args
            .as_ref()
            .unwrap()
            .last()
            .unwrap(),
        "--hook-path=/opt/hami"
    );
    // A KAI cluster without HAMi: no device plugin, the KAI folder from webhook.kai.hookPath.
    let s = scenario("kai-only");
    assert!(
        s.all::<DaemonSet>()
            .iter()
            .all(|d| d.name() != format!("{PREFIX}-device-plugin"))
    );
    assert_eq!(s.webhook_settings()["kai"]["hookPath"], "/opt/kai/vgpu");
    let pod = pod_spec_of_daemonset(s.get(&installer));
    assert_eq!(
        container(pod, "install-hook")
            .args
            .as_ref()
            .unwrap()
            .last()
            .unwrap(),
        "--hook-path=/opt/kai"
    );
}

#[test]
fn install_hook_args_are_what_its_cli_reads_and_the_image_carries_the_library() {
    use clap::CommandFactory;
    use hami_device_plugin::cli::Cli;
    // The Dockerfile copies the library where `--preload` looks, in the device plugin image.
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    let stage = dockerfile
        .split("\nFROM ")
        .find(|s| s.contains(" AS device-plugin"))
        .expect("Dockerfile has a device-plugin stage");
    assert!(
        stage.lines().any(|l| l.starts_with("COPY --from=")
            && l.trim_end().ends_with(&format!(" {}", preload_in_image()))),
        "the device-plugin stage does not COPY the preload library to {}",
        preload_in_image()
    );

    let cli = Cli::command();
    if cli.find_subcommand("install-hook").is_none() {
        // The sub-command is being added in parallel; the check turns on as soon as it exists.
        eprintln!(
            "hami-device-plugin has no install-hook yet: chart args not checked against its CLI"
        );
        return;
    }
    let mut checked = 0;
    for s in rendered().scenarios.values() {
        for ds in s.all::<DaemonSet>() {
            let Some(c) = pod_spec_of_daemonset(ds)
                .init_containers
                .iter()
                .flatten()
                .find(|c| c.name == "install-hook")
            else {
                continue;
            };
            let args = c.args.clone().unwrap();
            let matches = Cli::command()
                .try_get_matches_from(
                    std::iter::once("hami-device-plugin".to_owned()).chain(args.clone()),
                )
                .unwrap_or_else(|e| {
                    panic!(
                        "{}/{}: hami-device-plugin refuses {args:?}: {e}",
                        s.name,
                        ds.name()
                    )
                });
            let (sub, m) = matches.subcommand().unwrap();
            assert_eq!(sub, "install-hook");
            let hook = args
                .iter()
                .find_map(|a| a.strip_prefix("--hook-path="))
                .unwrap();
            assert_eq!(
                m.try_get_one::<PathBuf>("hook_path").unwrap(),
                Some(&PathBuf::from(hook)),
                "{}/{}",
                s.name,
                ds.name()
            );
            assert_eq!(
                m.try_get_one::<PathBuf>("preload").unwrap(),
                Some(&PathBuf::from(preload_in_image()))
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "only {checked} install-hook containers checked"
    );
}

/// Numbers compare by value (`1` rendered, `1.0` after a round trip through an `f64` field).
fn same(rendered: &Value, loaded: &Value) -> bool {
    match (rendered.as_f64(), loaded.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => rendered == loaded,
    }
}

/// Every key the chart renders is one the loader knows (it serializes back with the same value):
/// a misspelt key would otherwise be ignored silently and its default used.
fn assert_known_keys(origin: &str, rendered: &Value, loaded: &Value) {
    for (key, value) in rendered.as_object().unwrap() {
        let back = loaded
            .get(key)
            .unwrap_or_else(|| panic!("{origin}: key {key} is unknown to the loader"));
        if value.is_object() {
            assert_known_keys(&format!("{origin}.{key}"), value, back);
        } else {
            assert!(
                same(value, back),
                "{origin}.{key}: rendered {value}, loaded {back}"
            );
        }
    }
}

#[test]
fn rendered_device_and_node_configs_load_with_the_plugins_loaders() {
    use hami_shared::config::{DeviceConfig, NodeConfigFile};
    use hami_shared::values::{DeliverySource, LimitDelivery};
    let dir = tempfile::tempdir().unwrap();
    for s in rendered().scenarios.values() {
        if s.all::<ConfigMap>()
            .iter()
            .all(|c| c.name() != format!("{PREFIX}-device-config"))
        {
            continue;
        }
        let device_path = dir.path().join(format!("{}-device-config.yaml", s.name));
        std::fs::write(
            &device_path,
            s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml"),
        )
        .unwrap();
        let device = DeviceConfig::load_from_env(Some(&device_path), std::iter::empty())
            .unwrap_or_else(|e| {
                panic!("{}: device-config.yaml refused by the loader: {e}", s.name)
            });
        let loaded = serde_json::to_value(&device.nvidia).unwrap();
        assert_known_keys(&format!("{}: nvidia", s.name), &s.device_config(), &loaded);

        let node_path = dir.path().join(format!("{}-config.json", s.name));
        std::fs::write(
            &node_path,
            s.config_data(&format!("{PREFIX}-node-config"), "config.json"),
        )
        .unwrap();
        let nodes = NodeConfigFile::load(&node_path)
            .unwrap_or_else(|e| panic!("{}: config.json refused by the loader: {e}", s.name));
        let loaded = serde_json::to_value(&nodes).unwrap();
        for (i, entry) in s.node_config()["nodeconfig"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            assert_known_keys(
                &format!("{}: nodeconfig[{i}]", s.name),
                entry,
                &loaded["nodeconfig"][i],
            );
        }

        // The resolution the rollout section of the README relies on.
        if s.name == "per-node" {
            let canary = nodes.for_node("gpu-canary-1");
            let r = device.nvidia.resolve_limit_delivery(None, canary.as_ref());
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::File, DeliverySource::NodeConfig)
            );
            let r = device
                .nvidia
                .resolve_limit_delivery(None, nodes.for_node("gpu-other").as_ref());
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::Env, DeliverySource::GlobalConfig)
            );
            let r = device
                .nvidia
                .resolve_limit_delivery(Some("env"), canary.as_ref());
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::Env, DeliverySource::PodAnnotation)
            );
        }
        if s.name == "default" {
            let r = device.nvidia.resolve_limit_delivery(None, None);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::File, DeliverySource::GlobalConfig)
            );
        }
    }
}

#[test]
fn rendered_webhook_settings_load_with_the_webhooks_loader() {
    let dir = tempfile::tempdir().unwrap();
    for s in rendered().scenarios.values() {
        if s.all::<ConfigMap>()
            .iter()
            .all(|c| c.name() != format!("{PREFIX}-webhook"))
        {
            continue;
        }
        let path = dir.path().join(format!("{}-webhook.yaml", s.name));
        std::fs::write(
            &path,
            s.config_data(&format!("{PREFIX}-webhook"), "webhook.yaml"),
        )
        .unwrap();
        let settings = hami_webhook::settings::Settings::load(Some(&path))
            .unwrap_or_else(|e| panic!("{}: webhook.yaml refused by hami-webhook: {e}", s.name));
        let loaded = serde_json::to_value(&settings).unwrap();
        let mut rendered = s.webhook_settings();
        // The webhook reads HAMi's whole device config and ignores the keys it has no use for
        // (defaultMemory, deviceSplitCount, ...): compare only the ones it knows.
        let nvidia = rendered.as_object_mut().unwrap().remove("nvidia").unwrap();
        for (key, value) in loaded["nvidia"].as_object().unwrap() {
            assert!(
                same(&nvidia[key], value),
                "{}: nvidia.{key}: rendered {}, loaded {value}",
                s.name,
                nvidia[key]
            );
        }
        assert_known_keys(&format!("{}: webhook.yaml", s.name), &rendered, &loaded);
    }
}

#[test]
fn device_plugin_args_and_env_are_what_its_cli_reads() {
    use clap::{CommandFactory, Parser};
    use hami_device_plugin::cli::{Cli, Command as PluginCommand};
    use hami_device_plugin::nvml::{ENV_DISABLE_HEALTHCHECKS, health_check_policy};
    let run = Cli::command()
        .find_subcommand("run")
        .cloned()
        .expect("hami-device-plugin has `run`");
    // The sub-command's own arguments and the global ones (`--log-format`).
    let top = Cli::command();
    let env_read: BTreeSet<String> = run
        .get_arguments()
        .chain(top.get_arguments().filter(|a| a.is_global_set()))
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    for s in rendered().scenarios.values() {
        for ds in s
            .all::<DaemonSet>()
            .into_iter()
            .filter(|d| d.name() == format!("{PREFIX}-device-plugin"))
        {
            let c = container(pod_spec_of_daemonset(ds), "device-plugin");
            let args = c.args.clone().unwrap();
            let cli = Cli::try_parse_from(
                std::iter::once("hami-device-plugin".to_owned()).chain(args.clone()),
            )
            .unwrap_or_else(|e| panic!("{}: hami-device-plugin refuses {args:?}: {e}", s.name));
            let PluginCommand::Run(run_args) = cli.command else {
                panic!("{}: not `run`", s.name)
            };
            assert_eq!(
                run_args.source.config.as_deref(),
                Some(Path::new(
                    "/etc/hami-limits/device-config/device-config.yaml"
                ))
            );
            assert_eq!(
                run_args.source.node_config.as_deref(),
                Some(Path::new("/etc/hami-limits/node-config/config.json"))
            );
            assert_eq!(
                run_args.kubelet_dir,
                Path::new("/var/lib/kubelet/device-plugins")
            );
            assert!(
                run_args.source.inventory.is_none(),
                "NVML, not an inventory file, in a cluster"
            );
            // Probes and the metrics port: the address the plugin listens on (HAMI_METRICS_LISTEN)
            // is the container's `metrics` port, which both probes use.
            let listen = c
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "HAMI_METRICS_LISTEN")
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| panic!("{}: no HAMI_METRICS_LISTEN", s.name));
            let addr = hami_device_plugin::metrics::parse_listen(&listen)
                .unwrap()
                .unwrap_or_else(|| panic!("{}: metrics off", s.name));
            let metrics_port = c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some("metrics"))
                .map(|p| p.container_port);
            assert_eq!(metrics_port, Some(i32::from(addr.port())), "{}", s.name);
            for (probe, path) in [
                (c.liveness_probe.as_ref(), "/healthz"),
                (c.readiness_probe.as_ref(), "/readyz"),
            ] {
                let get = probe.unwrap().http_get.as_ref().unwrap();
                assert_eq!(get.path.as_deref(), Some(path), "{}", s.name);
                assert_eq!(
                    get.port,
                    IntOrString::String("metrics".into()),
                    "{}",
                    s.name
                );
            }
            // Every variable the chart sets for the plugin is one its CLI reads (the others are
            // for the logger, the NVIDIA runtime, and the NVML health checks).
            for e in c.env.iter().flatten() {
                if e.name == ENV_DISABLE_HEALTHCHECKS {
                    let policy = health_check_policy(e.value.as_deref());
                    assert_eq!(policy, Some(vec![48, 109]), "{}: {e:?}", s.name);
                    continue;
                }
                if matches!(
                    e.name.as_str(),
                    "RUST_LOG" | "NVIDIA_VISIBLE_DEVICES" | "NVIDIA_DRIVER_CAPABILITIES"
                ) {
                    continue;
                }
                assert!(
                    env_read.contains(&e.name),
                    "{}: the plugin does not read {}",
                    s.name,
                    e.name
                );
            }
        }
    }
}

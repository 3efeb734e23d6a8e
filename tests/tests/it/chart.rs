//! The Helm chart, rendered by real Helm (`charts/tests/render.py`, PyPI `helm-python-sdk`), parsed
//! manifest by manifest into `k8s-openapi` types. A kind this test does not know fails, and so does
//! any field a type does not know (every object must serialize back to exactly what was rendered).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
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

/// Prometheus Operator's ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1), the fields
/// the chart renders; unknown fields are refused.
mod prometheus {
    use super::*;

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PrometheusRule {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: RuleSpec,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct RuleSpec {
        pub groups: Vec<RuleGroup>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct RuleGroup {
        pub name: String,
        pub rules: Vec<Rule>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Rule {
        pub alert: String,
        pub expr: String,
        #[serde(rename = "for")]
        pub for_: String,
        pub labels: BTreeMap<String, String>,
        pub annotations: BTreeMap<String, String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ServiceMonitor {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: ServiceMonitorSpec,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ServiceMonitorSpec {
        pub job_label: String,
        pub namespace_selector: NamespaceSelector,
        pub selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
        pub endpoints: Vec<Endpoint>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct NamespaceSelector {
        pub match_names: Vec<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Endpoint {
        pub port: String,
        pub path: String,
        pub scheme: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub interval: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub scrape_timeout: Option<String>,
        pub honor_labels: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub relabelings: Option<Vec<BTreeMap<String, Value>>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub metric_relabelings: Option<Vec<BTreeMap<String, Value>>>,
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
    ValidatingAdmissionPolicy(ValidatingAdmissionPolicy),
    ValidatingAdmissionPolicyBinding(ValidatingAdmissionPolicyBinding),
    Job(Job),
    CronJob(CronJob),
    Issuer(cert_manager::Issuer),
    Certificate(cert_manager::Certificate),
    ServiceMonitor(prometheus::ServiceMonitor),
    PrometheusRule(prometheus::PrometheusRule),
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
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            Manifest::ValidatingAdmissionPolicy(strict(value, origin))
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            Manifest::ValidatingAdmissionPolicyBinding(strict(value, origin))
        }
        ("batch/v1", "Job") => Manifest::Job(strict(value, origin)),
        ("batch/v1", "CronJob") => Manifest::CronJob(strict(value, origin)),
        ("cert-manager.io/v1", "Issuer") => Manifest::Issuer(strict(value, origin)),
        ("cert-manager.io/v1", "Certificate") => Manifest::Certificate(strict(value, origin)),
        ("monitoring.coreos.com/v1", "ServiceMonitor") => {
            Manifest::ServiceMonitor(strict(value, origin))
        }
        ("monitoring.coreos.com/v1", "PrometheusRule") => {
            Manifest::PrometheusRule(strict(value, origin))
        }
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
        Manifest::ValidatingAdmissionPolicy(x) => serde_json::to_value(x),
        Manifest::ValidatingAdmissionPolicyBinding(x) => serde_json::to_value(x),
        Manifest::Job(x) => serde_json::to_value(x),
        Manifest::CronJob(x) => serde_json::to_value(x),
        Manifest::Issuer(x) => serde_json::to_value(x),
        Manifest::Certificate(x) => serde_json::to_value(x),
        Manifest::ServiceMonitor(x) => serde_json::to_value(x),
        Manifest::PrometheusRule(x) => serde_json::to_value(x),
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
    MutatingWebhookConfiguration => MutatingWebhookConfiguration,
    ValidatingAdmissionPolicy => ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding => ValidatingAdmissionPolicyBinding, Job => Job, CronJob => CronJob,
    Issuer => cert_manager::Issuer, Certificate => cert_manager::Certificate,
    ServiceMonitor => prometheus::ServiceMonitor,
    PrometheusRule => prometheus::PrometheusRule,
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

    /// Whether the scenario renders the ConfigMap `name`.
    fn has_config_map(&self, name: &str) -> bool {
        self.all::<ConfigMap>().iter().any(|c| c.name() == name)
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

/// The Python with the chart tests' packages: `HAMI_CHART_PYTHON`, else the project-local
/// `.tools/py` that `scripts/test-all` creates, else `python3`.
fn chart_python() -> String {
    if let Ok(p) = std::env::var("HAMI_CHART_PYTHON") {
        return p;
    }
    let local = repo_root().join(".tools/py/bin/python");
    if local.is_file() {
        return local.display().to_string();
    }
    "python3".to_owned()
}

/// Runs `charts/tests/render.py` once per test binary (lint, schema checks, every scenario).
fn rendered() -> &'static Rendered {
    static RENDERED: OnceLock<Rendered> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let python = chart_python();
        let script = repo_root().join("charts/tests/render.py");
        let out = Command::new(&python).arg(&script).arg(dir.path()).output().unwrap_or_else(|e| {
            panic!(
                "cannot run {python} {}: {e}; scripts/test-all installs the chart tests' Python packages into .tools/py",
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
        "admission-policy-off",
        "allow-lists",
        "cert-manager",
        "cert-manager-issuer",
        "custom-names",
        "default",
        "device-plugin-only",
        "env-delivery",
        "existing-device-config",
        "hami-values",
        "hook-installer",
        "ignore-no-conditions",
        "inventory",
        "inventory-mig",
        "kai",
        "kai-host-path",
        "kai-only",
        "monitor-custom",
        "no-monitor",
        "no-vap-api",
        "overrides",
        "per-gpu-vram",
        "per-node",
        "scheduler-identities",
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
            // deviceConfig.existingConfigMap: a ConfigMap the chart mounts but does not own.
            let external = s.values["deviceConfig"]["existingConfigMap"].as_str();
            for v in spec.volumes.iter().flatten() {
                if let Some(cm) = &v.config_map {
                    assert!(
                        maps.contains(cm.name.as_str()) || external == Some(cm.name.as_str()),
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
    assert_eq!(
        hooks.len(),
        1,
        "CREATE only: the UPDATE rules are the ValidatingAdmissionPolicy's"
    );
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
    // KAI's reservation pods are KAI's: its binding never waits for this webhook.
    assert_eq!(
        names.values.as_deref().unwrap(),
        [NS, "kube-system", "kai-resource-reservation"]
    );
    assert_eq!(by_key["hami.io/webhook"].operator, "NotIn");
    assert_eq!(
        by_key["hami.io/webhook"].values.as_deref().unwrap(),
        ["ignore"]
    );
    assert!(
        w.object_selector.is_none(),
        "a pod's own labels must never skip the review"
    );

    let conditions = w.match_conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 1);
    let expr = &conditions[0].expression;
    for needle in [
        "'gpu-memory'",
        "'gpu-fraction'",
        "'hami.io/limit-delivery'",
        "\"hami.io/bind-phase\"",
        "\"hami.io/vgpu-devices-to-allocate\"",
        "initContainers",
        "requests",
        "limits",
        "'NVIDIA_VISIBLE_DEVICES'",
        "'nvidia-container-devices'",
        "\"hami.io/bind-phase\"",
        "\"hami.io/vgpu-devices-to-allocate\"",
        "object.metadata.labels",
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

/// The two ValidatingAdmissionPolicies (their CEL is evaluated against sample requests by
/// render.py, and by the real API server in real_cluster): who they match, where, and the
/// identities the scheduler-owned annotations belong to, the same list the webhook reads.
#[test]
fn admission_policies_hold_the_update_rules() {
    let plugin = format!("system:serviceaccount:{NS}:{PREFIX}-device-plugin");
    let scheduler = "system:serviceaccount:kube-system:hami-scheduler";
    let s = scenario("default");
    let policies = s.all::<ValidatingAdmissionPolicy>();
    assert_eq!(
        policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        [
            format!("{PREFIX}-pod-annotations"),
            format!("{PREFIX}-device-plugin-pods"),
            format!("{PREFIX}-device-plugin-node"),
            format!("{PREFIX}-device-plugin-events"),
        ]
    );
    for p in &policies {
        let b: &ValidatingAdmissionPolicyBinding = s.get(p.name());
        let spec = b.spec.as_ref().unwrap();
        assert_eq!(spec.policy_name.as_deref(), Some(p.name()));
        assert_eq!(
            spec.validation_actions.as_deref(),
            Some(&["Deny".to_owned()][..])
        );
        assert!(
            spec.match_resources.is_none(),
            "the policy says what it matches"
        );
        let ps = p.spec.as_ref().unwrap();
        assert_eq!(ps.failure_policy.as_deref(), Some("Fail"));
        assert!(ps.param_kind.is_none());
        for v in ps.validations.iter().flatten() {
            assert_eq!(v.reason.as_deref(), Some("Forbidden"), "{}", v.expression);
            assert!(v.message_expression.is_some(), "{}", v.expression);
        }
    }
    let pods = policies[0].spec.as_ref().unwrap();
    let constraints = pods.match_constraints.as_ref().unwrap();
    let rules = constraints.resource_rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].operations.as_deref().unwrap(),
        ["CREATE", "UPDATE"]
    );
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    let excluded = constraints
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(
        excluded.len(),
        1,
        "the webhook's opt-outs are not the policy's"
    );
    assert_eq!(excluded[0].values.as_deref().unwrap(), [NS, "kube-system"]);
    let writers = pods
        .variables
        .iter()
        .flatten()
        .find(|v| v.name == "writers")
        .unwrap();
    let listed: Vec<String> = serde_json::from_str(&writers.expression).unwrap();
    assert_eq!(listed, [scheduler, plugin.as_str()]);
    assert_eq!(
        s.webhook_settings()["tenancy"]["schedulerAnnotationWriters"],
        json!(listed),
        "the webhook (UPDATE fallback, CREATE) reads the same list"
    );

    // One policy per kind of the plugin's writes (each expression type-checked against its kind).
    for (policy, (group, resource, operations)) in policies[1..].iter().zip([
        ("", "pods", &["UPDATE"][..]),
        ("", "nodes", &["UPDATE"][..]),
        ("events.k8s.io", "events", &["CREATE", "UPDATE"][..]),
    ]) {
        let spec = policy.spec.as_ref().unwrap();
        let constraints = spec.match_constraints.as_ref().unwrap();
        assert!(
            constraints.namespace_selector.is_none(),
            "the plugin is narrowed in every namespace, kube-system included"
        );
        let rules = constraints.resource_rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].api_groups.as_deref().unwrap(), [group]);
        assert_eq!(rules[0].resources.as_deref().unwrap(), [resource]);
        assert_eq!(rules[0].operations.as_deref().unwrap(), operations);
        let condition = &spec.match_conditions.as_ref().unwrap()[0];
        assert_eq!(
            condition.expression,
            format!("request.userInfo.username == \"{plugin}\"")
        );
        // Fail closed without the token's node claim.
        let first = &spec.validations.as_ref().unwrap()[0];
        assert_eq!(first.expression, "variables.nodeName != ''");
    }

    // The operator's identities, no device plugin of ours: no node policy, no plugin writer.
    let s = scenario("scheduler-identities");
    let policies = s.all::<ValidatingAdmissionPolicy>();
    assert_eq!(policies.len(), 1);
    assert_eq!(
        s.webhook_settings()["tenancy"]["schedulerAnnotationWriters"],
        json!([
            "system:serviceaccount:hami:hami-scheduler",
            "system:serviceaccount:hami:hami-device-plugin"
        ])
    );
}

/// Without the ValidatingAdmissionPolicy API (Kubernetes before 1.30) or with
/// `admissionPolicy.enabled=false`, the webhook's UPDATE entry enforces the pod rules: its own
/// entry, same service and namespaces, no pod-label opt-out, never reinvoked.
#[test]
fn update_entry_only_where_no_policy_holds_the_update_rules() {
    for name in ["no-vap-api", "admission-policy-off"] {
        let s = scenario(name);
        assert!(s.all::<ValidatingAdmissionPolicy>().is_empty(), "{name}");
        assert!(
            s.all::<ValidatingAdmissionPolicyBinding>().is_empty(),
            "{name}"
        );
        let hooks = s.webhook_config().webhooks.as_ref().unwrap();
        assert_eq!(hooks.len(), 2, "{name}: CREATE and UPDATE");
        update_entry(&hooks[0], &hooks[1]);
    }
}

fn update_entry(
    w: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook,
    u: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook,
) {
    assert_eq!(u.name, "update.hami-limits.hami.io");
    assert_eq!(u.side_effects, "None");
    assert_eq!(u.failure_policy, w.failure_policy);
    assert_eq!(u.timeout_seconds, w.timeout_seconds);
    assert_eq!(u.reinvocation_policy.as_deref(), Some("Never"));
    let rules = u.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].operations.as_deref().unwrap(), ["UPDATE"]);
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    assert_eq!(
        u.client_config.service.as_ref().unwrap().path.as_deref(),
        Some("/mutate")
    );
    assert!(u.client_config.ca_bundle.is_none());
    assert_eq!(u.namespace_selector, w.namespace_selector);
    assert!(
        u.object_selector.is_none(),
        "a pod label must not exempt its updates"
    );
    let conditions = u.match_conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 1);
    for needle in [
        "'limits.hami.io/'",
        "'hami.io/limit-delivery'",
        "\"hami.io/bind-time\"",
        "oldObject",
        "\"hami.io/bind-phase\"",
        "'hami.io/vgpu-node'",
        "oldObject.metadata.labels",
    ] {
        assert!(
            conditions[0].expression.contains(needle),
            "UPDATE matchConditions lacks {needle}: {}",
            conditions[0].expression
        );
    }
}

#[test]
fn ignore_policy_without_match_conditions_and_extra_exclusions() {
    let s = scenario("ignore-no-conditions");
    let w = &s.webhook_config().webhooks.as_ref().unwrap()[0];
    assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(w.timeout_seconds, Some(5));
    assert!(w.match_conditions.is_none());
    assert_eq!(s.webhook_config().webhooks.as_ref().unwrap().len(), 1);
    let exprs = w
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(
        exprs[0].values.as_deref().unwrap(),
        [NS, "kube-system", "monitoring", "kai-resource-reservation"]
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
    assert_eq!(a["helm.sh/hook"], "pre-install,pre-upgrade,pre-rollback");
    assert_eq!(a["helm.sh/hook-weight"], "-10");
    let b = annotations(&patch.metadata);
    // post-rollback: Helm runs the hooks of the revision rolled back to, so even the first
    // revision's patch Job rewrites the caBundle after a rollback to it.
    assert_eq!(b["helm.sh/hook"], "post-install,post-upgrade,post-rollback");
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
                ann["helm.sh/hook"],
                "pre-install,pre-upgrade,pre-rollback,post-install,post-upgrade,post-rollback",
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
            // The region exporter (regionExport).
            "--region-interval=30",
            "--region-scrape-files=32",
            "--region-scrape-budget-ms=500",
        ]
    );
    let env: BTreeMap<_, _> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e))
        .collect();
    let node = env["HAMI_NODE_NAME"]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(node.field_path, "spec.nodeName");
    assert_eq!(env["HAMI_HOOK_PATH"].value.as_deref(), Some("/usr/local"));
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

    assert_installs_hook(s, pod, "/usr/local", &[], &[]);

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
            "events.k8s.io/events:create[]",
            "events.k8s.io/events:patch[]",
        ])
    );
    let wr: &ClusterRole = s.get(&format!("{PREFIX}-webhook"));
    assert_eq!(
        rule_set(wr.rules.as_deref().unwrap()),
        set(&["/nodes:get[]", "/nodes:list[]", "/nodes:watch[]"])
    );
    let mr: &ClusterRole = s.get(&format!("{PREFIX}-vgpu-monitor"));
    assert_eq!(
        rule_set(mr.rules.as_deref().unwrap()),
        set(&["/pods:list[]", "/pods:watch[]"]),
        "HAMi's monitor only reads pods (its two informers)"
    );

    // The plugin's token reaches the plugin container only: no automount, a projected pod-bound
    // token (it carries the node name the node policy checks) mounted where client libraries look.
    let sa: &ServiceAccount = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(sa.automount_service_account_token, Some(false));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let projected = volumes["api-token"].projected.as_ref().unwrap();
    let sources = projected.sources.as_ref().unwrap();
    let token = sources[0].service_account_token.as_ref().unwrap();
    assert_eq!(
        (
            token.path.as_str(),
            token.expiration_seconds,
            token.audience.as_deref()
        ),
        ("token", Some(3607), None)
    );
    assert_eq!(
        sources[1].config_map.as_ref().unwrap().name,
        "kube-root-ca.crt"
    );
    assert_eq!(
        sources[2]
            .downward_api
            .as_ref()
            .unwrap()
            .items
            .as_ref()
            .unwrap()[0]
            .path,
        "namespace"
    );
    for c in pod
        .init_containers
        .iter()
        .flatten()
        .chain(pod.containers.iter())
    {
        let has = c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "api-token");
        assert_eq!(has, c.name == "device-plugin", "{}: api-token", c.name);
    }
    let m = mounts["api-token"];
    assert_eq!(
        (m.mount_path.as_str(), m.read_only),
        ("/var/run/secrets/kubernetes.io/serviceaccount", Some(true))
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
    assert_eq!(nvidia["libCudaLogLevel"], 1, "HAMi's chart default");
    assert_eq!(s.node_config(), json!({"nodeconfig": []}));
    // The webhook reads the same nvidia section.
    assert_eq!(s.webhook_settings()["nvidia"], nvidia);

    let env = scenario("env-delivery");
    assert_eq!(env.device_config()["limitDelivery"], "env");
    assert!(
        env.device_config().get("libCudaLogLevel").is_none(),
        "null leaves LIBCUDA_LOG_LEVEL unset"
    );
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
    // Fail closed: a gpu-fraction pod without a VRAM basis is refused unless the operator opts out.
    assert_eq!(default["kai"]["missingBasis"], "deny");
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
    assert_eq!(kai["kai"]["missingBasis"], "warn");
}

/// `webhook.tenancy` reaches the webhook's `tenancy:` section; the device plugin's own
/// ServiceAccount is always among the scheduler-annotation writers (it erases its entry and sets
/// bind-phase), once, and only when the chart installs the device plugin.
#[test]
fn tenancy_settings_reach_the_webhook() {
    let plugin = format!("system:serviceaccount:hami-system:{PREFIX}-device-plugin");
    let default = scenario("default").webhook_settings();
    assert_eq!(
        default["tenancy"],
        json!({
            "schedulerAnnotationWriters": ["system:serviceaccount:kube-system:hami-scheduler", plugin],
            "allowHamiCoreEnvNamespaces": [],
            "allowVisibleDevicesNamespaces": [],
            "forbidEnvDeliveryNamespaces": [],
            "kaiOptOutNamespaces": [],
        })
    );
    let kai = scenario("kai").webhook_settings();
    assert_eq!(
        kai["tenancy"],
        json!({
            "schedulerAnnotationWriters": [
                "system:serviceaccount:hami-system:hami-scheduler",
                "system:serviceaccount:hami-limits:hami-limits-device-plugin",
                plugin,
            ],
            "allowHamiCoreEnvNamespaces": ["legacy-ml"],
            "allowVisibleDevicesNamespaces": ["gpu-monitoring"],
            "forbidEnvDeliveryNamespaces": ["tenant-a", "tenant-b"],
            "kaiOptOutNamespaces": ["kai-debug"],
        })
    );
    let webhook_only = scenario("webhook-only").webhook_settings();
    assert_eq!(
        webhook_only["tenancy"]["schedulerAnnotationWriters"],
        json!(["system:serviceaccount:kube-system:hami-scheduler"])
    );
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
        .find(|e| e.name == "HAMI_HOOK_PATH")
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
/// The image reference the chart must render for `image` (`{repository, tag, digest}`):
/// `global.imageRegistry` replaces the repository's registry host (or goes in front of a name
/// without one), a digest replaces the tag, an empty tag is the appVersion.
/// `kai.hookDelivery: hostPath`: the one long-running container only sleeps, unprivileged.
fn assert_only_sleeps(s: &Scenario, pause: &Container) {
    let values = &s.values["hookInstaller"];
    assert_eq!(pause.name, "pause");
    let image = &values["pauseImage"];
    assert_eq!(
        pause.image.as_deref(),
        Some(image_ref(&s.values, image).as_str()),
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

/// `kai.hookDelivery: device-plugin`: the long-running container serves `hami.io/preload` from
/// the folder the init containers fill, as root without any capability (the socket goes into
/// kubelet's root-owned folder, which root owns), reading the hook folder only.
fn assert_serves_preload(s: &Scenario, pod: &PodSpec, plugin: &Container, kai_dir: &str) {
    let name = &s.name;
    let values = &s.values["hookInstaller"];
    let kubelet_dir = s.values["devicePlugin"]["kubeletDir"].as_str().unwrap();
    assert_eq!(plugin.name, "preload-plugin");
    assert_eq!(
        plugin.image.as_deref(),
        Some(image_ref(&s.values, &s.values["devicePlugin"]["image"]).as_str()),
        "{name}"
    );
    let hook = kai_dir.strip_suffix("/vgpu").unwrap();
    let slots = values["preloadSlots"].as_u64().unwrap();
    let region = &s.values["regionExport"];
    let pod_resources = values["podResourcesDir"].as_str().unwrap().to_owned();
    assert_eq!(
        plugin.args.as_deref().unwrap(),
        [
            "serve-preload".to_owned(),
            format!("--hook-path={hook}"),
            format!("--kubelet-dir={kubelet_dir}"),
            format!("--slots={slots}"),
            format!("--metrics-listen=0.0.0.0:{}", values["metricsPort"]),
            format!("--pod-resources-socket={pod_resources}/kubelet.sock"),
            format!("--pod-api={}", values["podApi"]),
            format!("--region-interval={}", region["interval"]),
            format!("--region-scrape-files={}", region["scrapeFiles"]),
            format!("--region-scrape-budget-ms={}", region["scrapeBudgetMs"]),
        ],
        "{name}"
    );
    // The flags are what serve-preload reads.
    {
        use clap::Parser;
        let mut argv = vec!["hami-device-plugin".to_owned()];
        argv.extend(plugin.args.clone().unwrap());
        hami_device_plugin::cli::Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{name}: serve-preload refuses its args: {e}"));
    }
    // The node name for the metrics' node label and the pod list.
    assert!(
        plugin
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "HAMI_NODE_NAME"
                && e.value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .map(|f| f.field_path.as_str())
                    == Some("spec.nodeName")),
        "{name}"
    );
    let ports: Vec<(&str, i32)> = plugin
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap_or(""), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [(
            "metrics",
            i32::try_from(values["metricsPort"].as_i64().unwrap()).unwrap()
        )],
        "{name}"
    );
    let sc = plugin.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_user, Some(0), "{name}");
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
    assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
    assert_ne!(sc.privileged, Some(true), "{name}");
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_owned()][..]),
        "{name}"
    );
    assert!(caps.add.is_none(), "{name}: {caps:?}");
    let mounts: Vec<(&str, &str, bool)> = plugin
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.name.as_str(),
                m.mount_path.as_str(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect();
    let regions = format!("{hook}/regions");
    assert_eq!(
        mounts,
        [
            ("device-plugins", kubelet_dir, false),
            ("hami-core", kai_dir, true),
            // The slot folders, written (made anew at Allocate); beside the hook folder, never in
            // it: a hostPath delivery mounts the hook folder into pods.
            ("regions", regions.as_str(), false),
            // kubelet's pod resources socket: List only.
            ("pod-resources", pod_resources.as_str(), true),
        ],
        "{name}"
    );
    for (volume, path, kind) in [
        ("regions", regions.as_str(), "DirectoryOrCreate"),
        ("pod-resources", pod_resources.as_str(), "DirectoryOrCreate"),
    ] {
        let host = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .and_then(|v| v.host_path.as_ref())
            .unwrap_or_else(|| panic!("{name}: no {volume} hostPath volume"));
        assert_eq!(
            (host.path.as_str(), host.type_.as_deref()),
            (path, Some(kind)),
            "{name}"
        );
    }
    // Its metrics: a headless Service on the metrics port.
    let service: &Service = s.get(&format!("{PREFIX}-hook-installer-metrics"));
    let spec = service.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "{name}");
    assert_eq!(
        spec.ports.as_ref().unwrap()[0].port,
        i32::try_from(values["metricsPort"].as_i64().unwrap()).unwrap(),
        "{name}"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "device-plugins")
        .unwrap_or_else(|| panic!("{name}: no device-plugins volume"));
    let host = volume.host_path.as_ref().unwrap();
    assert_eq!(
        (host.path.as_str(), host.type_.as_deref()),
        (kubelet_dir, Some("Directory")),
        "{name}"
    );
    assert_eq!(
        serde_json::to_value(&plugin.resources).unwrap(),
        values["preloadResources"],
        "{name}"
    );
}

fn image_ref(values: &Value, image: &Value) -> String {
    let mut repo = image["repository"].as_str().unwrap().to_owned();
    let registry = values["global"]["imageRegistry"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('/');
    if !registry.is_empty() {
        if let Some((first, rest)) = repo.split_once('/')
            && (first.contains('.') || first.contains(':') || first == "localhost")
        {
            repo = rest.to_owned();
        }
        repo = format!("{registry}/{repo}");
    }
    match image["digest"].as_str().filter(|d| !d.is_empty()) {
        Some(digest) => format!("{repo}@{digest}"),
        None => {
            let tag = image["tag"].as_str().filter(|t| !t.is_empty());
            format!("{repo}:{}", tag.unwrap_or("0.1.0"))
        }
    }
}

/// Where the chart mounts the inventory ConfigMap and the file `--inventory` names.
const INVENTORY_DIR: &str = "/etc/hami-limits/inventory";
const INVENTORY_FILE: &str = "/etc/hami-limits/inventory/inventory.yaml";

impl Scenario {
    /// True when `devicePlugin.inventory` lists GPUs (NVML is then not used).
    fn has_inventory(&self) -> bool {
        self.values["devicePlugin"]["inventory"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    }
}

fn assert_installs_hook(
    s: &Scenario,
    pod: &PodSpec,
    hook: &str,
    extra_args: &[String],
    extra_env: &[Value],
) {
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
        Some(image_ref(&s.values, &s.values["devicePlugin"]["hamiCore"]["image"]).as_str()),
        "{name}"
    );
    if s.values["global"]["imageRegistry"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        assert_eq!(copy.image.as_deref(), Some("projecthami/hami:v2.10.0"));
    }
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
        Some(image_ref(&s.values, &s.values["devicePlugin"]["image"]).as_str()),
        "{name}: the device plugin image"
    );
    assert!(
        install.command.is_none(),
        "{name}: the image's entrypoint, hami-device-plugin"
    );
    let mut expected_args = vec![
        "install-hook".to_owned(),
        "--hami-core-dir=/hami-core".to_owned(),
        format!("--preload={}", preload_in_image()),
        format!("--hook-path={hook}"),
    ];
    // The node GPU file from the inventory when there is one, else from NVML.
    if s.has_inventory() {
        expected_args.push(format!("--inventory={INVENTORY_FILE}"));
    }
    expected_args.extend_from_slice(extra_args);
    assert_eq!(install.args.as_deref().unwrap(), expected_args, "{name}");
    let mut expected_mounts = BTreeMap::from([
        (
            "hami-core-image".to_owned(),
            ("/hami-core".to_owned(), true),
        ),
        ("hami-core".to_owned(), (vgpu.clone(), false)),
    ]);
    if s.has_inventory() {
        expected_mounts.insert("inventory".to_owned(), (INVENTORY_DIR.to_owned(), true));
        let cm = volumes["inventory"]
            .config_map
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: the inventory volume is not a ConfigMap"));
        assert_eq!(cm.name, format!("{PREFIX}-inventory"), "{name}");
        assert!(
            s.has_config_map(&cm.name),
            "{name}: {} not rendered",
            cm.name
        );
    }
    assert_eq!(
        mounts(install),
        expected_mounts,
        "{name}: container path = host path"
    );
    // NVML for the node GPU file (HAMi's image keeps `void`: a copy needs no GPU), then the
    // workload's extraEnv.
    let mut expected_env = vec![
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        json!({"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}),
    ];
    expected_env.extend_from_slice(extra_env);
    let env: Vec<Value> = install
        .env
        .iter()
        .flatten()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(env, expected_env, "{name}: install-hook env");

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
        assert_installs_hook(s, pod_spec_of_daemonset(ds), hook, &[], &[]);
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
        let extra: Vec<String> = serde_json::from_value(values["extraArgs"].clone()).unwrap();
        let extra_env = values["extraEnv"].as_array().unwrap();
        assert_installs_hook(s, pod, hook, &extra, extra_env);
        // The NVIDIA runtime for install-hook's NVML, as the device plugin has it.
        assert_eq!(
            pod.runtime_class_name.as_deref(),
            values["runtimeClassName"]
                .as_str()
                .filter(|r| !r.is_empty()),
            "{}",
            s.name
        );
        // A changed inventory rolls the pods (install-hook publishes the node GPU file from it).
        let template_annotations = ds
            .spec
            .as_ref()
            .and_then(|d| d.template.metadata.as_ref())
            .map(annotations)
            .unwrap_or_default();
        assert_eq!(
            template_annotations.contains_key("checksum/inventory"),
            s.has_inventory(),
            "{}: {template_annotations:?}",
            s.name
        );

        // API access only for the KAI region exporter (hookInstaller.podApi with the preload
        // plugin): list pods (their limits files) and create Events, nothing else.
        let preload = s.webhook_settings()["kai"]["hookDelivery"] == "device-plugin";
        let pod_api = preload && values["podApi"] == true;
        let sa: &ServiceAccount = s.get(&installer);
        assert_eq!(sa.automount_service_account_token, Some(false));
        assert_eq!(
            pod.automount_service_account_token,
            Some(pod_api),
            "{}",
            s.name
        );
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some(installer.as_str())
        );
        let roles: Vec<&ClusterRole> = s
            .all::<ClusterRole>()
            .into_iter()
            .filter(|r| r.name() == installer)
            .collect();
        if pod_api {
            let [role] = roles.as_slice() else {
                panic!("{}: no hook installer ClusterRole", s.name)
            };
            assert_eq!(
                rule_set(role.rules.as_deref().unwrap()),
                set(&[
                    "/pods:list[]",
                    "events.k8s.io/events:create[]",
                    "events.k8s.io/events:patch[]"
                ]),
                "{}",
                s.name
            );
            let binding: &ClusterRoleBinding = s.get(&installer);
            assert_eq!(binding.role_ref.name, installer);
        } else {
            assert!(roles.is_empty(), "{}: a ClusterRole without podApi", s.name);
        }
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
        let [main] = pod.containers.as_slice() else {
            panic!("{}: one container", s.name)
        };
        match s.webhook_settings()["kai"]["hookDelivery"]
            .as_str()
            .unwrap()
        {
            "device-plugin" => assert_serves_preload(s, pod, main, &kai_dir),
            "hostPath" => assert_only_sleeps(s, main),
            other => panic!("{}: kai.hookDelivery {other}", s.name),
        }
    }
    assert_eq!(
        enabled_in,
        [
            "hook-installer",
            "inventory",
            "kai-host-path",
            "kai-only",
            "overrides"
        ]
    );
    assert_eq!(
        scenario("default").values["hookInstaller"]["runtimeClassName"],
        ""
    );

    // KAI pods get HAMi-core through the hook installer's plugin by default; with the hostPath
    // layout it needs no kubelet folder.
    assert_eq!(
        scenario("default").webhook_settings()["kai"]["hookDelivery"],
        "device-plugin"
    );
    assert_eq!(
        scenario("default").values["hookInstaller"]["preloadSlots"],
        1024
    );
    let host_path = pod_spec_of_daemonset(scenario("kai-host-path").get(&installer));
    assert!(
        !host_path
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == "device-plugins"),
        "kai-host-path: the pause-only installer mounts no kubelet folder"
    );

    // Defaults: off; when on, GPU Feature Discovery's GPU nodes, tolerating the GPU taint.
    let defaults = &scenario("default").values["hookInstaller"];
    assert_eq!(defaults["enabled"], false);
    assert_eq!(
        defaults["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    assert_eq!(
        defaults["pauseImage"],
        json!({"repository": "registry.k8s.io/pause", "tag": "3.10", "digest": "", "pullPolicy": "IfNotPresent"})
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

    assert!(
        Cli::command().find_subcommand("install-hook").is_some(),
        "hami-device-plugin has no install-hook sub-command"
    );
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
            assert_eq!(
                m.try_get_one::<PathBuf>("inventory").unwrap(),
                s.has_inventory()
                    .then(|| PathBuf::from(INVENTORY_FILE))
                    .as_ref(),
                "{}/{}",
                s.name,
                ds.name()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "only {checked} install-hook containers checked"
    );
}

/// `devicePlugin.inventory` as the install-hook init containers of both DaemonSets read it: the
/// rendered ConfigMap, at the path `--inventory` names, lists the GPUs with their minor numbers,
/// and install-hook's plan publishes exactly the node GPU file those GPUs make.
#[test]
fn the_rendered_inventory_becomes_the_node_gpu_file() {
    use hami_device_plugin::commands::install_hook::{NodeGpusPlan, list_gpus, plan_node_gpus};
    let s = scenario("inventory");
    let text = s.config_data(&format!("{PREFIX}-inventory"), "inventory.yaml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inventory.yaml");
    std::fs::write(&file, &text).unwrap();
    let plan = plan_node_gpus(
        Path::new("/usr/local/vgpu/node-gpus"),
        list_gpus(Some(&file)),
    )
    .unwrap_or_else(|e| panic!("the chart's inventory is refused: {e}\n{text}"));
    let NodeGpusPlan::Publish { gpus, .. } = plan else {
        panic!("no node GPU file from {text}: {plan:?}")
    };
    assert_eq!(
        gpus.render(),
        "HAMI_NODE_GPUS_FORMAT=1\n\
         NVIDIA1_MIB=143771\n\
         NVIDIA1_UUID=GPU-22222222-bbbb-4000-8000-000000000002\n\
         NVIDIA3_MIB=143771\n\
         NVIDIA3_UUID=GPU-11111111-aaaa-4000-8000-000000000001\n"
    );
    // Both DaemonSets hand it to install-hook, and the plugin reads the same file.
    for ds in [
        format!("{PREFIX}-device-plugin"),
        format!("{PREFIX}-hook-installer"),
    ] {
        let pod = pod_spec_of_daemonset(s.get(&ds));
        let args = container(pod, "install-hook").args.clone().unwrap();
        assert!(
            args.contains(&format!("--inventory={INVENTORY_FILE}")),
            "{ds}: {args:?}"
        );
    }
    let plugin = container(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-plugin",
    );
    assert!(
        plugin
            .args
            .iter()
            .flatten()
            .any(|a| *a == format!("--inventory={INVENTORY_FILE}"))
    );
    // Without devicePlugin.inventory, nothing of it is rendered.
    let d = scenario("hook-installer");
    assert!(!d.has_config_map(&format!("{PREFIX}-inventory")));
}

/// Every key of `devicePlugin.inventory` the schema admits is one the plugin's inventory reader
/// takes: the rendered ConfigMaps of both inventory scenarios parse, with their links (so the
/// topology scores the plugin publishes through the chart are not zero), MIG devices and a GPU
/// without memory.
#[test]
fn the_rendered_inventory_is_what_the_plugins_reader_takes() {
    use hami_device_plugin::gpu::inventory::{FileInventory, GpuInventory, parse_inventory};
    use hami_device_plugin::gpu::topology::gpu_scores;
    let rendered = |name: &str| {
        let s = scenario(name);
        let text = s.config_data(&format!("{PREFIX}-inventory"), "inventory.yaml");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("inventory.yaml");
        std::fs::write(&file, &text).unwrap();
        (s, dir, file, text)
    };

    let (s, _dir, file, text) = rendered("inventory");
    let inventory = FileInventory::new(&file);
    let gpus = inventory
        .discover()
        .unwrap_or_else(|e| panic!("the chart's inventory is refused: {e}\n{text}"));
    let links = inventory
        .gpu_links()
        .unwrap_or_else(|e| panic!("the chart's inventory links are refused: {e}\n{text}"));
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    let scores = gpu_scores(&uuids, &links).unwrap();
    assert!(scores.asymmetric.is_empty(), "{:?}", scores.asymmetric);
    for device in &scores.devices {
        assert!(
            device.score.values().all(|score| *score > 0),
            "{}: {:?} (links {links:?})",
            device.uuid,
            device.score
        );
    }
    // The plugin publishes them: the chart turns topology-aware into ENABLE_TOPOLOGY_SCORE=true.
    let plugin = container(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-plugin",
    );
    assert_eq!(
        env_map(plugin)["ENABLE_TOPOLOGY_SCORE"].value.as_deref(),
        Some("true")
    );

    let (s, _dir, file, text) = rendered("inventory-mig");
    let gpus = parse_inventory(&file, &text)
        .unwrap_or_else(|e| panic!("the chart's inventory is refused: {e}\n{text}"));
    let entries = s.values["devicePlugin"]["inventory"].as_array().unwrap();
    assert_eq!(gpus.len(), entries.len());
    let mig = &gpus[0].mig_devices;
    assert_eq!(mig.len(), 1, "{gpus:?}");
    assert_eq!(
        (mig[0].index.as_str(), mig[0].paths.len()),
        ("0:0", 3),
        "{mig:?}"
    );
    let gb10 = &gpus[1];
    assert_eq!(
        (gb10.memory_mib, gb10.healthy),
        (0, false),
        "no memory reported: preConfiguredDeviceMemory stands in"
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
    use hami_shared::values::{DeliverySource, LimitDelivery, resolve_limit_delivery};
    for s in rendered().scenarios.values() {
        if !s.has_config_map(&format!("{PREFIX}-device-config")) {
            continue;
        }
        // The loaders take the text and a path for their messages; nothing is read from disk.
        let device_path = PathBuf::from(format!("{}/device-config.yaml", s.name));
        let device_text = s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
        let device = DeviceConfig::load_from_env(
            Some(hami_shared::config::FileText {
                path: &device_path,
                text: &device_text,
            }),
            std::iter::empty(),
        )
        .unwrap_or_else(|e| panic!("{}: device-config.yaml refused by the loader: {e}", s.name));
        let loaded = serde_json::to_value(&device.nvidia).unwrap();
        assert_known_keys(&format!("{}: nvidia", s.name), &s.device_config(), &loaded);

        let node_path = PathBuf::from(format!("{}/config.json", s.name));
        let node_text = s.config_data(&format!("{PREFIX}-node-config"), "config.json");
        let nodes = NodeConfigFile::parse(hami_shared::config::FileText {
            path: &node_path,
            text: &node_text,
        })
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

        // The resolution the rollout section of docs/operator-guide.md relies on.
        if s.name == "per-node" {
            let canary = nodes.for_node("gpu-canary-1");
            let global = device.nvidia.plugin.limit_delivery;
            let canary = canary.and_then(|n| n.limit_delivery);
            let r = resolve_limit_delivery(None, canary, global);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::File, DeliverySource::NodeConfig)
            );
            let r = resolve_limit_delivery(
                None,
                nodes.for_node("gpu-other").and_then(|n| n.limit_delivery),
                global,
            );
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::Env, DeliverySource::GlobalConfig)
            );
            let r = resolve_limit_delivery(Some("env"), canary, global);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::Env, DeliverySource::PodAnnotation)
            );
        }
        if s.name == "default" {
            let r = resolve_limit_delivery(None, None, device.nvidia.plugin.limit_delivery);
            assert_eq!(
                (r.delivery, r.source),
                (LimitDelivery::File, DeliverySource::GlobalConfig)
            );
        }
    }
}

/// HAMi's own device-config.yaml (HAMi v2.10.0's chart, default values).
fn hami_device_config() -> PathBuf {
    repo_root().join("tests/fixtures/hami-v2.10.0-device-config.yaml")
}

#[test]
fn hamis_own_device_config_loads_with_the_plugins_and_the_webhooks_loaders() {
    use hami_shared::config::DeviceConfig;
    let path = hami_device_config();
    let text = std::fs::read_to_string(&path).unwrap();
    let device = DeviceConfig::load_from_env(
        Some(hami_shared::config::FileText {
            path: &path,
            text: &text,
        }),
        std::iter::empty(),
    )
    .unwrap_or_else(|e| panic!("the device plugin refuses HAMi's device-config.yaml: {e}"));
    let hami: Value = serde_yaml_ng::from_str(&text).unwrap();
    let n = &device.nvidia;
    assert_eq!(
        (
            n.admission.resource_count_name.as_str(),
            n.plugin.device_split_count
        ),
        (
            hami["nvidia"]["resourceCountName"].as_str().unwrap(),
            hami["nvidia"]["deviceSplitCount"].as_u64().unwrap() as u32
        )
    );
    assert_eq!(n.plugin.lib_cuda_log_level, Some(1));
    // The chart's defaults render what HAMi's chart renders, for every key both write.
    let ours = scenario("default").device_config();
    for (key, value) in ours.as_object().unwrap() {
        if let Some(theirs) = hami["nvidia"].get(key) {
            assert!(
                same(value, theirs),
                "nvidia.{key}: ours {value}, HAMi's {theirs}"
            );
        }
    }
}

/// HAMi v2.10.0's files the defaults below come from (paths in HAMi's repository, tag v2.10.0).
const HAMI_VALUES: &str = "charts/hami/values.yaml";
const HAMI_DEVICE_CONFIGMAP: &str = "charts/hami/templates/scheduler/device-configmap.yaml";
const HAMI_DAEMONSET: &str = "charts/hami/templates/device-plugin/daemonsetnvidia.yaml";

/// A default of ours that HAMi v2.10.0's chart has under the same name (or, where HAMi spells it
/// otherwise, the same setting): HAMi's value, as data, and where HAMi keeps it.
struct HamiDefault {
    /// Our value's path in `charts/hami-limits/values.yaml`.
    ours: &'static str,
    /// HAMi's value's path in `file` (or what writes it there, for a literal of a template).
    hami: &'static str,
    /// The HAMi file.
    file: &'static str,
    /// HAMi's default, as its chart renders it.
    value: Value,
    /// The `nvidia:` key of `device-config.yaml` both charts write it to (compared after our
    /// device plugin's loader has read the rendered file, and against the file HAMi's chart
    /// renders, `tests/fixtures/hami-v2.10.0-device-config.yaml`).
    device_config: Option<&'static str>,
}

fn hami_default(
    ours: &'static str,
    hami: &'static str,
    file: &'static str,
    value: Value,
    device_config: Option<&'static str>,
) -> HamiDefault {
    HamiDefault {
        ours,
        hami,
        file,
        value,
        device_config,
    }
}

/// Every default of `charts/hami-limits/values.yaml` that HAMi v2.10.0's chart shares: each must
/// equal HAMi's.
fn shared_hami_defaults() -> Vec<HamiDefault> {
    let (v, dc, ds) = (HAMI_VALUES, HAMI_DEVICE_CONFIGMAP, HAMI_DAEMONSET);
    vec![
        hami_default(
            "devicePlugin.resourceCountName",
            "resourceName",
            v,
            json!("nvidia.com/gpu"),
            Some("resourceCountName"),
        ),
        hami_default(
            "devicePlugin.resourceMemoryName",
            "resourceMem",
            v,
            json!("nvidia.com/gpumem"),
            Some("resourceMemoryName"),
        ),
        hami_default(
            "devicePlugin.resourceMemoryPercentageName",
            "resourceMemPercentage",
            v,
            json!("nvidia.com/gpumem-percentage"),
            Some("resourceMemoryPercentageName"),
        ),
        hami_default(
            "devicePlugin.resourceCoreName",
            "resourceCores",
            v,
            json!("nvidia.com/gpucores"),
            Some("resourceCoreName"),
        ),
        hami_default(
            "devicePlugin.resourcePriorityName",
            "resourcePriority",
            v,
            json!("nvidia.com/priority"),
            Some("resourcePriorityName"),
        ),
        hami_default(
            "devicePlugin.defaultGpuNum",
            "nvidia.defaultGPUNum (a literal)",
            dc,
            json!(1),
            Some("defaultGPUNum"),
        ),
        hami_default(
            "devicePlugin.overwriteEnv",
            "scheduler.overwriteEnv",
            v,
            json!(false),
            Some("overwriteEnv"),
        ),
        hami_default(
            "devicePlugin.deviceSplitCount",
            "devicePlugin.deviceSplitCount",
            v,
            json!(10),
            Some("deviceSplitCount"),
        ),
        hami_default(
            "devicePlugin.deviceMemoryScaling",
            "devicePlugin.deviceMemoryScaling",
            v,
            json!(1),
            Some("deviceMemoryScaling"),
        ),
        hami_default(
            "devicePlugin.deviceCoreScaling",
            "devicePlugin.deviceCoreScaling",
            v,
            json!(1),
            Some("deviceCoreScaling"),
        ),
        hami_default(
            "devicePlugin.gpuCorePolicy",
            "devices.nvidia.gpuCorePolicy",
            v,
            json!("default"),
            Some("gpuCorePolicy"),
        ),
        hami_default(
            "devicePlugin.libCudaLogLevel",
            "devices.nvidia.libCudaLogLevel",
            v,
            json!(1),
            Some("libCudaLogLevel"),
        ),
        hami_default(
            "devicePlugin.disableCoreLimit",
            "devicePlugin.disablecorelimit (--disable-core-limit)",
            v,
            json!(false),
            Some("disableCoreLimit"),
        ),
        hami_default(
            "devicePlugin.enableNumaTopology",
            "devicePlugin.enableNumaTopology",
            v,
            json!(false),
            Some("enableNumaTopology"),
        ),
        hami_default(
            "devicePlugin.preConfiguredDeviceMemory",
            "devicePlugin.preConfiguredDeviceMemory",
            v,
            json!(0),
            Some("preConfiguredDeviceMemory"),
        ),
        hami_default(
            "devicePlugin.runtimeClassName",
            "devicePlugin.runtimeClassName",
            v,
            json!(""),
            Some("runtimeClassName"),
        ),
        hami_default(
            "devicePlugin.migStrategy",
            "devicePlugin.migStrategy",
            v,
            json!("none"),
            None,
        ),
        hami_default(
            "devicePlugin.deviceListStrategy",
            "devicePlugin.deviceListStrategy",
            v,
            json!("envvar"),
            None,
        ),
        hami_default(
            "devicePlugin.passDeviceSpecsEnabled",
            "devicePlugin.passDeviceSpecsEnabled",
            v,
            json!(false),
            None,
        ),
        hami_default(
            "devicePlugin.nvidiaHookPath",
            "devicePlugin.nvidiaHookPath",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.nvidiaDriverRoot",
            "devicePlugin.nvidiaDriverRoot",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.gdrcopyEnabled",
            "devicePlugin.gdrcopyEnabled",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.gdsEnabled",
            "devicePlugin.gdsEnabled",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.mofedEnabled",
            "devicePlugin.mofedEnabled",
            v,
            Value::Null,
            None,
        ),
        hami_default(
            "devicePlugin.hookPath",
            "global.gpuHookPath",
            v,
            json!("/usr/local"),
            None,
        ),
        hami_default(
            "devicePlugin.kubeletDir",
            "devicePlugin.pluginPath",
            v,
            json!("/var/lib/kubelet/device-plugins"),
            None,
        ),
        hami_default(
            "devicePlugin.nodeSelector",
            "devicePlugin.nvidiaNodeSelector",
            v,
            json!({"gpu": "on"}),
            None,
        ),
        hami_default(
            "devicePlugin.priorityClassName",
            "priorityClassName (a literal)",
            ds,
            json!("system-node-critical"),
            None,
        ),
        hami_default(
            "devicePlugin.podAnnotations",
            "devicePlugin.podAnnotations",
            v,
            json!({}),
            None,
        ),
        hami_default(
            "devicePlugin.updateStrategy.maxUnavailable",
            "devicePlugin.updateStrategy.rollingUpdate.maxUnavailable",
            v,
            json!(1),
            None,
        ),
        hami_default(
            "devicePlugin.enabled",
            "devicePlugin.enabled",
            v,
            json!(true),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.resyncInterval",
            "devicePlugin.monitor.resyncInterval",
            v,
            json!("5m"),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.port",
            "the vgpu-monitor's containerPort (a literal)",
            ds,
            json!(9394),
            None,
        ),
        hami_default(
            "devicePlugin.hamiCore.image.repository",
            "devicePlugin.image.repository",
            v,
            json!("projecthami/hami"),
            None,
        ),
        hami_default(
            "devicePlugin.hamiCore.image.tag",
            "global.imageTag",
            v,
            json!("v2.10.0"),
            None,
        ),
        hami_default(
            "devicePlugin.hamiCore.image.pullPolicy",
            "devicePlugin.image.pullPolicy",
            v,
            json!("IfNotPresent"),
            None,
        ),
        hami_default(
            "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy",
            "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy",
            v,
            json!("spread"),
            None,
        ),
        hami_default(
            "webhook.enabled",
            "scheduler.admissionWebhook.enabled",
            v,
            json!(true),
            None,
        ),
        hami_default(
            "webhook.schedulerName",
            "schedulerName",
            v,
            json!("hami-scheduler"),
            None,
        ),
        hami_default(
            "global.imageRegistry",
            "global.imageRegistry",
            v,
            json!(""),
            None,
        ),
        hami_default(
            "imagePullSecrets",
            "global.imagePullSecrets",
            v,
            json!([]),
            None,
        ),
        hami_default("nameOverride", "nameOverride", v, json!(""), None),
        hami_default("fullnameOverride", "fullnameOverride", v, json!(""), None),
    ]
}

/// Defaults of ours that differ from HAMi v2.10.0's under the same name: each is listed, with its
/// reason, in docs/drop-in.md ("Chart defaults that differ from HAMi's").
fn different_hami_defaults() -> Vec<HamiDefault> {
    let v = HAMI_VALUES;
    let sys_admin = json!({"drop": ["ALL"], "add": ["SYS_ADMIN"]});
    vec![
        hami_default(
            "devicePlugin.tolerations",
            "devicePlugin.tolerations",
            v,
            json!([]),
            None,
        ),
        hami_default(
            "devicePlugin.resources",
            "devicePlugin.resources",
            v,
            json!({}),
            None,
        ),
        hami_default(
            "devicePlugin.extraArgs",
            "devicePlugin.extraArgs",
            v,
            json!(["-v=4"]),
            None,
        ),
        hami_default(
            "devicePlugin.securityContext",
            "devicePlugin.securityContext",
            v,
            json!({"privileged": true, "allowPrivilegeEscalation": true, "capabilities": sys_admin}),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.extraArgs",
            "devicePlugin.monitor.extraArgs",
            v,
            json!(["-v=4"]),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.resources",
            "devicePlugin.monitor.resources",
            v,
            json!({}),
            None,
        ),
        hami_default(
            "devicePlugin.monitor.securityContext",
            "devicePlugin.monitor.securityContext",
            v,
            json!({"allowPrivilegeEscalation": false, "capabilities": sys_admin}),
            None,
        ),
        hami_default(
            "webhook.reinvocationPolicy",
            "scheduler.admissionWebhook.reinvocationPolicy",
            v,
            json!("Never"),
            None,
        ),
        hami_default(
            "webhook.failurePolicy",
            "scheduler.admissionWebhook.failurePolicy",
            v,
            json!("Ignore"),
            None,
        ),
    ]
}

/// The value at a dotted path of our `values.yaml`; a missing key fails, naming it.
fn our_default<'a>(values: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(values, |v, key| {
        v.get(key)
            .unwrap_or_else(|| panic!("charts/hami-limits/values.yaml has no {path} (at {key})"))
    })
}

#[test]
fn chart_defaults_are_hamis_or_listed_as_differences() {
    use hami_shared::config::DeviceConfig;
    let text = std::fs::read_to_string(repo_root().join("charts/hami-limits/values.yaml")).unwrap();
    let values: Value = serde_yaml_ng::from_str(&text).unwrap();
    // What our device plugin makes of the rendered default device-config.yaml.
    let s = scenario("default");
    let path = PathBuf::from("default/device-config.yaml");
    let rendered = s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
    let loaded = DeviceConfig::load_from_env(
        Some(hami_shared::config::FileText {
            path: &path,
            text: &rendered,
        }),
        std::iter::empty(),
    )
    .unwrap();
    let loaded = serde_json::to_value(&loaded.nvidia).unwrap();
    let hami_file: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(hami_device_config()).unwrap()).unwrap();

    let mut wrong = Vec::new();
    for d in shared_hami_defaults() {
        let ours = our_default(&values, d.ours);
        if !same(&d.value, ours) {
            wrong.push(format!(
                "{}: ours {ours}, HAMi's {} ({} in HAMi's {}): make it HAMi's or move it to the differences (and docs/drop-in.md)",
                d.ours, d.value, d.hami, d.file
            ));
        }
        let Some(key) = d.device_config else { continue };
        let read = loaded.get(key).unwrap_or(&Value::Null);
        if !same(&d.value, read) {
            wrong.push(format!(
                "{}: the device plugin reads nvidia.{key} = {read} from the rendered default device-config.yaml, HAMi's chart renders {}",
                d.ours, d.value
            ));
        }
        if let Some(theirs) = hami_file["nvidia"].get(key) {
            assert!(
                same(&d.value, theirs),
                "{}: this table says HAMi renders nvidia.{key} = {}, HAMi's rendered file has {theirs}",
                d.ours,
                d.value
            );
        }
    }

    let drop_in = std::fs::read_to_string(repo_root().join("docs/drop-in.md")).unwrap();
    let listed = hami_tests::docs::section(&drop_in, "Chart defaults that differ from HAMi's")
        .expect("docs/drop-in.md has a section \"Chart defaults that differ from HAMi's\"");
    let listed: BTreeSet<String> = hami_tests::docs::table_rows(&listed)
        .iter()
        .flat_map(|row| hami_tests::docs::code_spans(&row.cells[0]))
        .collect();
    let differences = different_hami_defaults();
    for d in &differences {
        let ours = our_default(&values, d.ours);
        if same(&d.value, ours) {
            wrong.push(format!(
                "{}: now HAMi's {} ({} in HAMi's {}): move it to the shared defaults and out of docs/drop-in.md's differences",
                d.ours, d.value, d.hami, d.file
            ));
        }
        if !listed.contains(d.ours) {
            wrong.push(format!(
                "{}: differs from HAMi's {} ({}) but docs/drop-in.md's \"Chart defaults that differ from HAMi's\" does not list it",
                d.ours, d.hami, d.value
            ));
        }
    }
    for key in &listed {
        assert!(
            differences.iter().any(|d| d.ours == key),
            "docs/drop-in.md lists {key} as a default that differs from HAMi's; this test's table does not"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `libCudaLogLevel` lands where HAMi v2.10.0's plugin puts it (`server.go`: `LIBCUDA_LOG_LEVEL`
/// in `Allocate`'s environment of every non-MIG container when set): with the chart's default,
/// every allocation's environment and limits file carry `LIBCUDA_LOG_LEVEL=1`; with `null`
/// neither does; a MIG device gets no HAMi-core variable at all.
#[test]
fn the_default_log_level_reaches_every_allocation_and_its_limits_file() {
    use hami_device_plugin::allocation::codec::ContainerDevice;
    use hami_device_plugin::allocation::plan::{AllocationSettings, plan_container};
    use hami_shared::config::DeviceConfig;
    let settings = |name: &str| {
        let s = scenario(name);
        let path = PathBuf::from(format!("{name}/device-config.yaml"));
        let text = s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml");
        let device = DeviceConfig::load_from_env(
            Some(hami_shared::config::FileText {
                path: &path,
                text: &text,
            }),
            std::iter::empty(),
        )
        .unwrap();
        AllocationSettings::for_node(&device.nvidia, None, Path::new("/usr/local"))
    };
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]}
    }))
    .unwrap();
    let device = |uuid: &str| ContainerDevice {
        uuid: uuid.into(),
        kind: "NVIDIA".into(),
        memory_mib: 3000,
        cores: 30,
        extra: vec![],
    };
    let plan = |settings: &AllocationSettings, uuid: &str| {
        plan_container(
            &pod,
            0,
            &[device(uuid)],
            Some(1),
            settings,
            Path::new("/usr/local/vgpu/libvgpu.so"),
        )
        .unwrap()
    };

    let default = settings("default");
    assert_eq!(default.lib_cuda_log_level, Some(1));
    let p = plan(&default, "GPU-a");
    assert_eq!(
        p.envs.get("LIBCUDA_LOG_LEVEL").map(String::as_str),
        Some("1")
    );
    let file = &p
        .limits_file
        .as_ref()
        .expect("file delivery by default")
        .text;
    assert!(file.contains("\nLIBCUDA_LOG_LEVEL=1\n"), "{file}");
    for (key, value) in file.lines().filter_map(|l| l.split_once('=')) {
        assert!(
            hami_shared::hami_core::check_entry(key, value).is_empty(),
            "the limits file holds {key}={value}, which HAMi-core reads otherwise: {file}"
        );
    }
    let mig = plan(&default, "MIG-11111111-aaaa-4000-8000-000000000001");
    assert!(!mig.envs.contains_key("LIBCUDA_LOG_LEVEL") && mig.limits_file.is_none());

    let unset = settings("env-delivery");
    assert_eq!(unset.lib_cuda_log_level, None);
    let p = plan(&unset, "GPU-a");
    assert!(!p.envs.contains_key("LIBCUDA_LOG_LEVEL"), "{:?}", p.envs);
    assert!(p.limits_file.is_none(), "env delivery");
}

#[test]
fn rendered_webhook_settings_load_with_the_webhooks_loader() {
    let dir = tempfile::tempdir().unwrap();
    for s in rendered().scenarios.values() {
        if !s.has_config_map(&format!("{PREFIX}-webhook")) {
            continue;
        }
        let path = dir.path().join(format!("{}-webhook.yaml", s.name));
        let mut text = s.config_data(&format!("{PREFIX}-webhook"), "webhook.yaml");
        let existing = s.values["deviceConfig"]["existingConfigMap"] != "";
        if existing {
            // The mounted ConfigMap is HAMi's: its file as HAMi's chart renders it.
            let mounted = "deviceConfigFile: /etc/hami-device-config/device-config.yaml";
            assert!(text.contains(mounted), "{}: {text}", s.name);
            text = text.replace(
                mounted,
                &format!("deviceConfigFile: {}", hami_device_config().display()),
            );
        }
        std::fs::write(&path, text).unwrap();
        // `load` returns the settings and the deprecation notices: the chart uses no old name.
        let (settings, notices) =
            hami_webhook::policy::settings::Settings::load_from_env(Some(&path), std::env::vars())
                .unwrap_or_else(|e| {
                    panic!("{}: webhook.yaml refused by hami-webhook: {e}", s.name)
                });
        assert!(notices.is_empty(), "{}: {notices:?}", s.name);
        let loaded = serde_json::to_value(&settings).unwrap();
        let mut rendered = s.webhook_settings();
        // The webhook reads HAMi's whole device config and ignores the keys it has no use for
        // (defaultMemory, deviceSplitCount, ...): compare only the ones it knows.
        let nvidia = if existing {
            let object = rendered.as_object_mut().unwrap();
            assert!(!object.contains_key("nvidia"), "{}: two sources", s.name);
            object.remove("deviceConfigFile").unwrap();
            let hami: Value =
                serde_yaml_ng::from_str(&std::fs::read_to_string(hami_device_config()).unwrap())
                    .unwrap();
            hami["nvidia"].clone()
        } else {
            rendered.as_object_mut().unwrap().remove("nvidia").unwrap()
        };
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
    use hami_device_plugin::gpu::health::{ENV_DISABLE_HEALTHCHECKS, HealthCheckPolicy};
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
            assert_eq!(
                run_args.source.inventory.as_deref(),
                s.has_inventory().then_some(Path::new(INVENTORY_FILE)),
                "{}: NVML, unless devicePlugin.inventory lists GPUs",
                s.name
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
            // for the logger and the NVIDIA runtime).
            for e in c.env.iter().flatten() {
                if e.name == ENV_DISABLE_HEALTHCHECKS {
                    let policy = HealthCheckPolicy::new(e.value.as_deref(), None);
                    assert!(
                        !policy.all_disabled() && policy.is_disabled(48) && policy.is_disabled(109),
                        "{}: {e:?}",
                        s.name
                    );
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

/// `Allocate`'s allow-lists reach the plugin as the variables its CLI reads, comma-joined; by
/// default neither is set (every namespace refused).
#[test]
fn allocate_allow_lists_reach_the_plugin() {
    use clap::Parser;
    use hami_device_plugin::cli::{Cli, Command as PluginCommand};
    let env_of = |scenario: &str| -> BTreeMap<String, String> {
        let s = &rendered().scenarios[scenario];
        let ds = s
            .all::<DaemonSet>()
            .into_iter()
            .find(|d| d.name() == format!("{PREFIX}-device-plugin"))
            .unwrap();
        container(pod_spec_of_daemonset(ds), "device-plugin")
            .env
            .iter()
            .flatten()
            .filter(|e| e.name.starts_with("HAMI_ALLOW_"))
            .map(|e| (e.name.clone(), e.value.clone().unwrap()))
            .collect()
    };
    assert!(env_of("default").is_empty());
    let env = env_of("allow-lists");
    assert_eq!(
        env,
        BTreeMap::from([
            (
                "HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES".to_owned(),
                "hami-legacy,research".to_owned()
            ),
            (
                "HAMI_ALLOW_PRIVILEGED_NAMESPACES".to_owned(),
                "trusted".to_owned()
            ),
        ])
    );
    // What the plugin makes of them (the flags carry the same values as the variables).
    let cli = Cli::try_parse_from([
        "hami-device-plugin",
        "run",
        "--allow-hami-core-env-namespaces",
        &env["HAMI_ALLOW_HAMI_CORE_ENV_NAMESPACES"],
        "--allow-privileged-namespaces",
        &env["HAMI_ALLOW_PRIVILEGED_NAMESPACES"],
    ])
    .unwrap();
    let PluginCommand::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(
        run.allocate.guard.allow_hami_core_env_namespaces,
        ["hami-legacy", "research"]
    );
    assert_eq!(run.allocate.guard.allow_privileged_namespaces, ["trusted"]);
}

/// No scenario renders a caBundle (empty or not): the certgen patch Job (post-install,
/// post-upgrade, post-rollback), the renewal CronJob or cert-manager's cainjector is its only
/// writer, so no revision's manifest holds it and a rollback to the first revision (whose install
/// could not know the CA) leaves the live caBundle alone.
#[test]
fn no_scenario_renders_a_ca_bundle() {
    let mut checked = 0;
    for s in rendered().scenarios.values() {
        for mwc in s.all::<MutatingWebhookConfiguration>() {
            for w in mwc.webhooks.iter().flatten() {
                assert!(
                    w.client_config.ca_bundle.is_none(),
                    "{}: {} renders a caBundle",
                    s.name,
                    mwc.name()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} webhook configurations");
}

/// The device plugin's metrics port has a headless Service, and each ServiceMonitor scrapes the
/// `metrics` port of exactly one Service whose pods listen there.
#[test]
fn service_monitors_scrape_the_metrics_ports() {
    for s in rendered().scenarios.values() {
        if s.values["devicePlugin"]["enabled"] == true {
            let svc: &Service = s.get(&format!("{PREFIX}-device-plugin-metrics"));
            let spec = svc.spec.as_ref().unwrap();
            assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "{}", s.name);
            let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
            assert_eq!(
                spec.selector.as_ref(),
                ds.spec.as_ref().unwrap().selector.match_labels.as_ref(),
                "{}",
                s.name
            );
            let port = &spec.ports.as_ref().unwrap()[0];
            assert_eq!(
                i64::from(port.port),
                s.values["devicePlugin"]["metricsPort"].as_i64().unwrap()
            );
            assert_eq!(
                port.target_port,
                Some(IntOrString::String("metrics".into()))
            );
        }
        let monitors = s.all::<prometheus::ServiceMonitor>();
        let mut expected = ["devicePlugin", "webhook"]
            .iter()
            .filter(|c| {
                s.values[**c]["enabled"] == true
                    && s.values[**c]["serviceMonitor"]["enabled"] == true
            })
            .count();
        // The hook installer's preload-plugin (the KAI containers' regions).
        if s.values["hookInstaller"]["enabled"] == true
            && s.values["hookInstaller"]["serviceMonitor"]["enabled"] == true
            && s.webhook_settings()["kai"]["hookDelivery"] == "device-plugin"
        {
            expected += 1;
        }
        // HAMi's vGPU monitor (a DaemonSet of its own) is scraped with the plugin.
        if s.values["devicePlugin"]["enabled"] == true
            && s.values["devicePlugin"]["serviceMonitor"]["enabled"] == true
            && s.values["devicePlugin"]["monitor"]["enabled"] == true
        {
            expected += 1;
        }
        assert_eq!(monitors.len(), expected, "{}", s.name);
        for m in monitors {
            let wanted = m.spec.selector.match_labels.as_ref().unwrap();
            let services: Vec<&Service> = s
                .all::<Service>()
                .into_iter()
                .filter(|svc| {
                    let labels = svc.metadata.labels.as_ref().unwrap();
                    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
                })
                .collect();
            assert_eq!(services.len(), 1, "{}: {}", s.name, m.name());
            let monitor = m.name() == format!("{PREFIX}-vgpu-monitor");
            let ports: Vec<(&str, &str)> = m
                .spec
                .endpoints
                .iter()
                .map(|e| (e.port.as_str(), e.path.as_str()))
                .collect();
            let expected: &[(&str, &str)] = if monitor {
                &[("monitor", "/metrics")]
            } else {
                &[("metrics", "/metrics")]
            };
            assert_eq!(ports, expected, "{}: {}", s.name, m.name());
            for (port, _) in ports {
                assert!(
                    services[0]
                        .spec
                        .as_ref()
                        .unwrap()
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| p.name.as_deref() == Some(port)),
                    "{}: {} selects a Service without a {port} port",
                    s.name,
                    m.name()
                );
            }
            assert_eq!(m.spec.namespace_selector.match_names, [NS]);
        }
    }
    let s = scenario("overrides");
    let m: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(
        m.metadata.labels.as_ref().unwrap()["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(m.spec.endpoints[0].interval.as_deref(), Some("1m"));
}

/// Scenario `overrides`: per-workload labels, annotations, security overlays (the chart's
/// hardening kept), extra arguments and environment, mirror registry, digests, pull secret.
#[test]
fn overrides_reach_every_workload_and_keep_the_hardening() {
    let s = scenario("overrides");
    let mut specs: Vec<(String, &k8s_openapi::api::core::v1::PodTemplateSpec)> = Vec::new();
    for d in s.all::<Deployment>() {
        specs.push((d.name().to_owned(), &d.spec.as_ref().unwrap().template));
    }
    for d in s.all::<DaemonSet>() {
        specs.push((d.name().to_owned(), &d.spec.as_ref().unwrap().template));
    }
    for j in s.all::<Job>() {
        specs.push((j.name().to_owned(), &j.spec.as_ref().unwrap().template));
    }
    for c in s.all::<CronJob>() {
        let job = c.spec.as_ref().unwrap().job_template.spec.as_ref().unwrap();
        specs.push((c.name().to_owned(), &job.template));
    }
    assert_eq!(specs.len(), 7);
    for (owner, template) in specs {
        let meta = template.metadata.as_ref().unwrap();
        let labels = meta.labels.as_ref().unwrap();
        let component = labels["app.kubernetes.io/component"].as_str();
        // HAMi's vGPU monitor, a DaemonSet of its own, takes the device plugin's pod overrides.
        let (section, owned_by) = match component {
            "webhook" => (&s.values["webhook"], component),
            "device-plugin" => (&s.values["devicePlugin"], component),
            "vgpu-monitor" => (&s.values["devicePlugin"], "device-plugin"),
            "hook-installer" => (&s.values["hookInstaller"], component),
            "certgen" => (&s.values["certs"]["certgen"], component),
            other => panic!("{owner}: component {other}: podLabels overrode a selector label"),
        };
        assert_eq!(labels["team.example.com/owner"], owned_by, "{owner}");
        assert_eq!(
            annotations(meta)["policy.example.com/owner"],
            owned_by,
            "{owner}"
        );
        let pod = template.spec.as_ref().unwrap();
        assert_eq!(
            pod.image_pull_secrets.as_ref().unwrap()[0].name,
            "mirror-pull",
            "{owner}"
        );
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            psc.se_linux_options.as_ref().unwrap().type_.as_deref(),
            Some("spc_t"),
            "{owner}"
        );
        assert_eq!(psc.supplemental_groups.as_deref(), Some(&[4242][..]));
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault",
            "{owner}: the chart's seccomp profile kept"
        );
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(
                sc.se_linux_options.as_ref().unwrap().level.as_deref(),
                Some("s0"),
                "{owner}/{}",
                c.name
            );
            assert_eq!(
                sc.app_armor_profile.as_ref().unwrap().type_,
                "RuntimeDefault"
            );
            assert!(
                c.image
                    .as_deref()
                    .unwrap()
                    .starts_with("registry.example.com:5000/mirror/"),
                "{owner}/{}: {:?}",
                c.name,
                c.image
            );
        }
        // extraEnv is appended to the container that takes the workload's extra settings (the
        // monitor has its own, devicePlugin.monitor.extraEnv).
        if component == "vgpu-monitor" {
            continue;
        }
        let target = match component {
            "hook-installer" => "install-hook",
            "certgen" => pod.containers[0].name.as_str(),
            other => other,
        };
        let env: Vec<Value> = container(pod, target)
            .env
            .iter()
            .flatten()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        let extra = section["extraEnv"].as_array().unwrap();
        assert!(env.ends_with(extra), "{owner}/{target}: {env:?}");
    }
}

fn env_map(c: &Container) -> BTreeMap<&str, &k8s_openapi::api::core::v1::EnvVar> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e))
        .collect()
}

fn volume<'a>(pod: &'a PodSpec, name: &str) -> &'a k8s_openapi::api::core::v1::Volume {
    pod.volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

/// HAMi's vGPU monitor beside the plugin (HAMi v2.10.0 `charts/hami/templates/device-plugin/
/// daemonsetnvidia.yaml`, container `vgpu-monitor`): the command, the environment its code reads
/// (`HOOK_PATH`, `NODE_NAME`, `HAMI_RESYNC_INTERVAL`), the per-container folders it scans, its
/// port on the metrics Service, and nothing of the host it does not use.
#[test]
fn vgpu_monitor_runs_apart_from_the_plugin_with_what_it_reads() {
    let s = scenario("default");
    let plugin = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin")));
    assert_eq!(
        plugin
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["device-plugin"],
        "the monitor never shares the plugin's pod (nor its token)"
    );
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-vgpu-monitor"));
    let pod = pod_spec_of_daemonset(ds);
    assert_eq!(
        pod.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["vgpu-monitor"]
    );
    assert!(pod.init_containers.is_none());
    // Its own ServiceAccount (list and watch pods only), on the plugin's nodes.
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(format!("{PREFIX}-vgpu-monitor").as_str())
    );
    assert_eq!(pod.node_selector, plugin.node_selector);
    assert_eq!(pod.tolerations, plugin.tolerations);
    assert_eq!(pod.priority_class_name, plugin.priority_class_name);
    assert_eq!(pod.runtime_class_name, plugin.runtime_class_name);
    let m = container(pod, "vgpu-monitor");
    assert_eq!(
        m.image.as_deref(),
        Some("projecthami/hami:v2.10.0"),
        "hamiCore.image"
    );
    assert_eq!(m.command.as_deref().unwrap(), ["vGPUmonitor"]);
    assert_eq!(m.args.as_deref().unwrap(), ["--metrics-bind-address=:9394"]);
    let env = env_map(m);
    let node = env["NODE_NAME"].value_from.as_ref().unwrap();
    assert_eq!(node.field_ref.as_ref().unwrap().field_path, "spec.nodeName");
    // The monitor scans $HOOK_PATH/containers: HOOK_PATH is the vgpu folder itself.
    assert_eq!(env["HOOK_PATH"].value.as_deref(), Some("/usr/local/vgpu"));
    assert_eq!(env["HAMI_RESYNC_INTERVAL"].value.as_deref(), Some("5m"));
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"].value.as_deref(), Some("all"));
    assert_eq!(
        env["NVIDIA_DRIVER_CAPABILITIES"].value.as_deref(),
        Some("utility")
    );
    let ports: Vec<(&str, i32)> = m
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports, [("monitor", 9394)]);
    let plugin_ports: Vec<i32> = container(plugin, "device-plugin")
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(plugin_ports, [9396], "the plugin moved off HAMi's 9394");
    // Mounts: the per-container folders read-write (feedback writes, dead folders removed), an
    // emptyDir /tmp (its MIG lock folder); never the library folder.
    let mounts: Vec<(&str, &str, Option<bool>)> = m
        .volume_mounts
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v.mount_path.as_str(), v.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("hami-containers", "/usr/local/vgpu/containers", None),
            ("monitor-tmp", "/tmp", None)
        ]
    );
    let host = volume(pod, "hami-containers").host_path.as_ref().unwrap();
    assert_eq!(
        (host.path.as_str(), host.type_.as_deref()),
        ("/usr/local/vgpu/containers", Some("DirectoryOrCreate"))
    );
    assert!(volume(pod, "monitor-tmp").empty_dir.is_some());
    // No host namespaces: v2.10.0 reads no /proc, /sys or runtime socket.
    assert_eq!(pod.host_pid, None);
    assert_eq!(pod.host_network, None);
    let sc = m.security_context.as_ref().unwrap();
    assert_eq!(
        (sc.run_as_user, sc.privileged, sc.allow_privilege_escalation),
        (Some(0), Some(false), Some(false))
    );
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref().unwrap(), ["ALL"]);
    assert!(
        caps.add.is_none(),
        "the monitor (UID 0) owns what it reads and removes: root's folders, usage.cache 0666"
    );
    // A headless Service of its own carries its port.
    let svc: &Service = s.get(&format!("{PREFIX}-vgpu-monitor"));
    assert_eq!(
        svc.spec.as_ref().unwrap().selector.as_ref(),
        ds.spec.as_ref().unwrap().selector.match_labels.as_ref()
    );
    let ports: Vec<(&str, i32, IntOrString)> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.as_deref().unwrap(),
                p.port,
                p.target_port.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("monitor", 9394, IntOrString::String("monitor".into()))]
    );
}

#[test]
fn vgpu_monitor_can_be_turned_off_or_tuned() {
    let s = scenario("no-monitor");
    let name = format!("{PREFIX}-vgpu-monitor");
    assert!(s.all::<DaemonSet>().iter().all(|d| d.name() != name));
    assert!(s.all::<Service>().iter().all(|d| d.name() != name));
    assert!(s.all::<ServiceAccount>().iter().all(|d| d.name() != name));
    assert!(s.all::<ClusterRole>().iter().all(|d| d.name() != name));
    let svc: &Service = s.get(&format!("{PREFIX}-device-plugin-metrics"));
    let names: Vec<&str> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["metrics"]);
    let sm: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-device-plugin"));
    assert_eq!(sm.spec.endpoints.len(), 1);
    assert_eq!(s.all::<prometheus::ServiceMonitor>().len(), 1);

    let s = scenario("monitor-custom");
    let pod = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-vgpu-monitor")));
    let m = container(pod, "vgpu-monitor");
    assert_eq!(m.image.as_deref(), Some("mirror.example.com/hami:v2.10.1"));
    assert_eq!(m.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        m.args.as_deref().unwrap(),
        [
            "--metrics-bind-address=:9500",
            "-v=4",
            "--legacy-metrics=true"
        ]
    );
    let env = env_map(m);
    assert_eq!(env["HOOK_PATH"].value.as_deref(), Some("/opt/hami/vgpu"));
    assert_eq!(env["HAMI_RESYNC_INTERVAL"].value.as_deref(), Some("90s"));
    assert_eq!(env["KLOG_V"].value.as_deref(), Some("4"));
    assert_eq!(
        m.volume_mounts.as_ref().unwrap()[0].mount_path,
        "/opt/hami/vgpu/containers"
    );
    let sc = m.security_context.as_ref().unwrap();
    assert_eq!(
        sc.se_linux_options.as_ref().unwrap().type_.as_deref(),
        Some("spc_t")
    );
    assert_eq!(sc.read_only_root_filesystem, Some(true), "hardening kept");
    assert_eq!(
        m.ports.as_ref().unwrap()[0].container_port,
        9500,
        "monitor.port"
    );
    let plugin = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin")));
    assert_eq!(
        container(plugin, "device-plugin").ports.as_ref().unwrap()[0].container_port,
        9394,
        "the plugin may take 9394 when the monitor is elsewhere"
    );
    for (service, port) in [
        (format!("{PREFIX}-device-plugin-metrics"), 9394),
        (format!("{PREFIX}-vgpu-monitor"), 9500),
    ] {
        let svc: &Service = s.get(&service);
        let ports: Vec<i32> = svc
            .spec
            .as_ref()
            .unwrap()
            .ports
            .iter()
            .flatten()
            .map(|p| p.port)
            .collect();
        assert_eq!(ports, [port], "{service}");
    }
    for (monitor, port) in [("device-plugin", "metrics"), ("vgpu-monitor", "monitor")] {
        let sm: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-{monitor}"));
        let endpoints: Vec<&str> = sm.spec.endpoints.iter().map(|e| e.port.as_str()).collect();
        assert_eq!(endpoints, [port], "{monitor}");
    }
}

/// deviceConfig.existingConfigMap: HAMi's ConfigMap is mounted into both binaries, the chart's is
/// not rendered, and the webhook's file points at the mounted copy instead of holding `nvidia:`.
#[test]
fn an_existing_device_config_map_replaces_the_rendered_one() {
    let s = scenario("existing-device-config");
    assert!(
        !s.has_config_map(&format!("{PREFIX}-device-config")),
        "a second source of truth was rendered"
    );
    let check_volume = |pod: &PodSpec| {
        let cm = volume(pod, "device-config").config_map.as_ref().unwrap();
        assert_eq!(cm.name, "hami-scheduler-device");
        let items: Vec<(&str, &str)> = cm
            .items
            .iter()
            .flatten()
            .map(|i| (i.key.as_str(), i.path.as_str()))
            .collect();
        assert_eq!(items, [("device-config.yaml", "device-config.yaml")]);
    };
    let plugin = pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin")));
    check_volume(plugin);
    assert!(
        container(plugin, "device-plugin")
            .args
            .as_ref()
            .unwrap()
            .contains(&"--config=/etc/hami-limits/device-config/device-config.yaml".to_owned())
    );
    let webhook = pod_spec_of_deployment(s.get(&format!("{PREFIX}-webhook")));
    check_volume(webhook);
    let mount = container(webhook, "webhook")
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "device-config")
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/hami-device-config", Some(true))
    );
    let settings = s.webhook_settings();
    assert_eq!(
        settings["deviceConfigFile"],
        "/etc/hami-device-config/device-config.yaml"
    );
    assert!(settings.get("nvidia").is_none());
    // Without it, nothing of this.
    let s = scenario("default");
    let webhook = pod_spec_of_deployment(s.get(&format!("{PREFIX}-webhook")));
    assert!(
        webhook
            .volumes
            .iter()
            .flatten()
            .all(|v| v.name != "device-config")
    );
    assert!(s.webhook_settings().get("deviceConfigFile").is_none());
    let cm = volume(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-config",
    )
    .config_map
    .as_ref()
    .unwrap();
    assert_eq!(cm.name, format!("{PREFIX}-device-config"));
    assert!(cm.items.is_none());
}

/// The three values HAMi's scheduler reads are not rendered; the two the webhook applies are.
#[test]
fn device_config_holds_only_what_our_binaries_read() {
    let nvidia = scenario("default").device_config();
    for gone in ["defaultMemory", "defaultCores", "memoryFactor"] {
        assert!(nvidia.get(gone).is_none(), "{gone} rendered");
    }
    assert_eq!(nvidia["defaultGPUNum"], 1);
    assert_eq!(nvidia["overwriteEnv"], false);
    let settings = scenario("default").webhook_settings();
    assert_eq!(settings["nvidia"]["defaultGPUNum"], 1);
}

fn device_plugin_container(s: &Scenario) -> &Container {
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    container(pod_spec_of_daemonset(ds), "device-plugin")
}

/// HAMi v2.10's devicePlugin values under HAMi's names become what HAMi's DaemonSet
/// (`daemonsetnvidia.yaml`) and device config (`device-configmap.yaml`) make of them: the
/// variables its plugin reads (strings and booleans only when set, as HAMi's `typeIs` guards),
/// `ENABLE_TOPOLOGY_SCORE=true` for the topology-aware policy, the driver root at /driver-root,
/// `enableNumaTopology` in the device config and `enablenumatopology` in the node config.
#[test]
fn hamis_device_plugin_values_become_hamis_variables_and_keys() {
    let value = |c: &Container, name: &str| {
        env_map(c)
            .get(name)
            .map(|e| e.value.clone().unwrap_or_default())
    };
    let default = device_plugin_container(scenario("default"));
    for (name, want) in [
        ("MIG_STRATEGY", Some("none")),
        ("DEVICE_LIST_STRATEGY", Some("envvar")),
        ("PASS_DEVICE_SPECS", Some("false")),
        ("NVIDIA_DRIVER_ROOT", None),
        ("NVIDIA_CDI_HOOK_PATH", None),
        ("GDRCOPY_ENABLED", None),
        ("GDS_ENABLED", None),
        ("MOFED_ENABLED", None),
        ("ENABLE_TOPOLOGY_SCORE", None),
    ] {
        assert_eq!(value(default, name).as_deref(), want, "default: {name}");
    }
    assert_eq!(
        scenario("default").device_config()["enableNumaTopology"],
        false
    );
    assert!(
        scenario("default")
            .device_config()
            .get("preConfiguredDeviceMemory")
            .is_none()
    );

    let s = scenario("hami-values");
    let c = device_plugin_container(s);
    for (name, want) in [
        ("MIG_STRATEGY", "single"),
        ("DEVICE_LIST_STRATEGY", "volume-mounts,cdi-annotations"),
        ("PASS_DEVICE_SPECS", "true"),
        ("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver"),
        (
            "NVIDIA_CDI_HOOK_PATH",
            "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        ),
        ("GDRCOPY_ENABLED", "true"),
        ("GDS_ENABLED", "false"),
        ("MOFED_ENABLED", "true"),
        ("ENABLE_TOPOLOGY_SCORE", "true"),
    ] {
        assert_eq!(value(c, name).as_deref(), Some(want), "hami-values: {name}");
    }
    let ds: &DaemonSet = s.get(&format!("{PREFIX}-device-plugin"));
    let pod = pod_spec_of_daemonset(ds);
    let root = volume(pod, "driver-root").host_path.as_ref().unwrap();
    assert_eq!(
        (root.path.as_str(), root.type_.as_deref()),
        ("/run/nvidia/driver", Some("Directory"))
    );
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "driver-root")
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/driver-root", Some(true))
    );
    assert!(
        !pod_spec_of_daemonset(scenario("default").get(&format!("{PREFIX}-device-plugin")))
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == "driver-root")
    );
    assert_eq!(s.device_config()["enableNumaTopology"], true);
    assert_eq!(
        s.node_config()["nodeconfig"][0],
        json!({"name": "gpu-numa-off", "enablenumatopology": false})
    );
    // The files as the plugin reads them: on by default, off on the node that says so.
    let dir = tempfile::tempdir().unwrap();
    let global = dir.path().join("device-config.yaml");
    std::fs::write(
        &global,
        s.config_data(&format!("{PREFIX}-device-config"), "device-config.yaml"),
    )
    .unwrap();
    let nodes = dir.path().join("config.json");
    std::fs::write(
        &nodes,
        s.config_data(&format!("{PREFIX}-node-config"), "config.json"),
    )
    .unwrap();
    let numa = |node: &str| {
        hami_device_plugin::settings::PluginSettings::load(
            Some(&global),
            Some(&nodes),
            Some(node),
            std::env::vars(),
        )
        .unwrap()
        .numa_topology
    };
    assert!(numa("gpu-a"));
    assert!(!numa("gpu-numa-off"));
}

/// HAMi-core's lock folder is the host's `/tmp/vgpulock` in the plugin (HAMi mounts the host's
/// whole `/tmp`), so that the folder and `lock` file the plugin makes are what containers bind;
/// the rest of the plugin's `/tmp` stays private.
#[test]
fn the_plugin_sees_the_hosts_vgpulock() {
    for s in rendered().scenarios.values() {
        let Some(ds) = s
            .all::<DaemonSet>()
            .into_iter()
            .find(|d| d.name() == format!("{PREFIX}-device-plugin"))
        else {
            continue;
        };
        let pod = pod_spec_of_daemonset(ds);
        let host = volume(pod, "vgpulock").host_path.as_ref().unwrap();
        assert_eq!(
            (host.path.as_str(), host.type_.as_deref()),
            ("/tmp/vgpulock", Some("DirectoryOrCreate")),
            "{}",
            s.name
        );
        let c = container(pod, "device-plugin");
        let mounts: Vec<(&str, &str)> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.mount_path.starts_with("/tmp"))
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("tmp", "/tmp"),
                ("vgpulock", hami_shared::names::VGPU_LOCK_PATH)
            ],
            "{}",
            s.name
        );
        assert!(volume(pod, "tmp").empty_dir.is_some(), "{}", s.name);
    }
}

/// The region metrics of KAI nodes are scraped like the device plugin's, and the documented alert
/// is rendered only when asked for, on the metric and label the exporters publish.
#[test]
fn region_exporter_service_monitor_and_alert() {
    let s = scenario("hook-installer");
    let sm: &prometheus::ServiceMonitor = s.get(&format!("{PREFIX}-hook-installer"));
    assert_eq!(
        sm.metadata.labels.as_ref().unwrap()["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(sm.spec.endpoints[0].port, "metrics");
    let rule: &prometheus::PrometheusRule = s.get(&format!("{PREFIX}-region"));
    assert_eq!(
        rule.metadata.labels.as_ref().unwrap()["role"],
        "alert-rules"
    );
    let [group] = rule.spec.groups.as_slice() else {
        panic!("one rule group")
    };
    let [alert] = group.rules.as_slice() else {
        panic!("one rule")
    };
    assert_eq!(alert.alert, "HamiGpuContainerUncapped");
    assert_eq!(
        alert.expr,
        r#"sum by (node) (hami_limits_region_cap_verdict{verdict="uncapped"}) > 0"#
    );
    assert_eq!(alert.for_, "5m");
    assert_eq!(alert.labels["severity"], "warning");
    assert!(alert.annotations["summary"].contains("{{ $labels.node }}"));
    // The docs show the same rule.
    let guide = std::fs::read_to_string(repo_root().join("docs/operator-guide.md")).unwrap();
    assert!(
        guide.contains(&alert.expr),
        "docs/operator-guide.md lacks {}",
        alert.expr
    );
    // Off by default; the interval reaches both exporters.
    for other in rendered().scenarios.values() {
        let alerting = other.values["regionExport"]["alert"]["enabled"] == true;
        assert_eq!(
            !other.all::<prometheus::PrometheusRule>().is_empty(),
            alerting,
            "{}",
            other.name
        );
    }
    let plugin = container(
        pod_spec_of_daemonset(s.get(&format!("{PREFIX}-device-plugin"))),
        "device-plugin",
    );
    assert!(
        plugin
            .args
            .iter()
            .flatten()
            .any(|a| a == "--region-interval=15"),
        "{:?}",
        plugin.args
    );
    // The metric and label the alert reads are the exporters' own.
    let text =
        std::fs::read_to_string(repo_root().join("device-plugin/src/regions/export.rs")).unwrap();
    assert!(text.contains("pub const PREFIX: &str = \"hami_limits_region\";"));
    assert!(text.contains("\"cap_verdict\""));
}

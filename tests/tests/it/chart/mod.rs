//! The Helm chart, rendered by real Helm (`charts/tests/render.py`, PyPI `helm-python-sdk`), parsed
//! manifest by manifest into `k8s-openapi` types. A kind this test does not know fails, and so does
//! any field a type does not know (every object must serialize back to exactly what was rendered).
//!
//! This module holds the harness (every scenario rendered once, the typed manifests, the helpers
//! several checks use); the checks sit in one submodule per workload.

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

/// HAMi's own device-config.yaml (HAMi v2.10.0's chart, default values).
fn hami_device_config() -> PathBuf {
    repo_root().join("tests/fixtures/hami-v2.10.0-device-config.yaml")
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

mod certs;
mod device_plugin;
mod hami_defaults;
mod hook;
mod manifests;
mod monitoring;
mod policy;
mod webhook;

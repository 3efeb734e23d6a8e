//! The chart rendered by real Helm against the in-process API server, after `hami-certgen create`:
//! Helm's `lookup` finds the Secret, so an upgrade carries the CA as the caBundle from the first
//! moment (no window without one before the post-upgrade patch Job), and `patch` then has nothing
//! to change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use hami_certgen::cluster::{self, PatchOutcome};
use hami_certgen::secret::CreateSettings;
use hami_tests::apiserver::{ApiServer, Fault, RequestMatch, RequestRecord, Verb};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde::Deserialize;
use serde_json::Value;
use time::{Duration, OffsetDateTime};

const NS: &str = "hami-system";
const RELEASE: &str = "hl";
const PREFIX: &str = "hl-hami-limits";

fn render_live(url: &str, out: &Path) {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/py/bin/python");
    let python = std::env::var("HAMI_CHART_PYTHON").unwrap_or_else(|_| {
        if local.is_file() {
            local.display().to_string()
        } else {
            "python3".to_owned()
        }
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/tests/render_live.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(url)
        .arg(out)
        .arg(RELEASE)
        .arg(NS)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python}: {e}; scripts/test-all installs the chart tests' Python packages into .tools/py")
        });
    assert!(
        output.status.success(),
        "render_live.py failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn rendered_webhook_config(out: &Path) -> MutatingWebhookConfiguration {
    let text = std::fs::read_to_string(out.join("mutatingwebhook.yaml")).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

fn settings() -> CreateSettings {
    CreateSettings {
        namespace: NS.into(),
        service: format!("{PREFIX}-webhook"),
        secret_name: format!("{PREFIX}-webhook-tls"),
        cluster_domain: "cluster.local".into(),
        ca_days: 3650,
        cert_days: 365,
        renew_before_days: 30,
    }
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn find<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str, name: &str) -> T {
    let doc = docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"));
    serde_json::from_value(doc.clone()).unwrap()
}

fn verb_name(verb: Verb) -> &'static str {
    match verb {
        Verb::Get => "get",
        Verb::List => "list",
        Verb::Watch => "watch",
        Verb::Create => "create",
        Verb::Update => "update",
        Verb::Patch => "patch",
        Verb::Delete => "delete",
        Verb::DeleteCollection => "deletecollection",
        Verb::Discovery => "discovery",
    }
}

fn allows(rules: &[PolicyRule], group: &str, request: &RequestRecord) -> bool {
    let resource = request.resource.as_deref().unwrap_or_default();
    rules.iter().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|res| res == resource)
            && r.verbs.iter().any(|v| v == verb_name(request.verb))
            && match (&r.resource_names, &request.name) {
                (None, _) => true,
                (Some(names), Some(name)) => names.contains(name),
                (Some(names), None) => names.is_empty(),
            }
    })
}

/// Every request `hami-certgen` makes — first install, a no-op rerun, a renewal, a CA rotation, a
/// lost race, `patch` — is allowed by the Role and ClusterRole the chart gives its Jobs, which name
/// the one Secret and the one MutatingWebhookConfiguration.
#[tokio::test]
async fn certgen_needs_nothing_beyond_the_charts_rbac() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = server.url().to_owned();
    let out = dir.path().to_owned();
    tokio::task::spawn_blocking(move || render_live(&url, &out))
        .await
        .unwrap();
    let docs = documents(&dir.path().join("certgen.yaml"));
    for identity in [
        format!("{PREFIX}-certgen-hook"),
        format!("{PREFIX}-certgen-renew"),
    ] {
        let role: Role = find(&docs, "Role", &identity);
        let cluster_role: ClusterRole = find(&docs, "ClusterRole", &identity);
        assert_eq!(role.metadata.namespace.as_deref(), Some(NS));

        let server = ApiServer::start().await.unwrap();
        server.seed(&rendered_webhook_config(dir.path())).unwrap();
        let s = settings();
        cluster::create(server.client(), &s).await.unwrap();
        cluster::create(server.client(), &s).await.unwrap();
        cluster::patch(server.client(), NS, &s.secret_name, PREFIX)
            .await
            .unwrap();
        // A renewal that first loses a race, then a CA rotation.
        let mut short = s.clone();
        short.cert_days = 400;
        short.renew_before_days = 390;
        server.fail_next(
            RequestMatch::new(Verb::Update, "secrets"),
            1,
            Fault::Status(409),
        );
        cluster::create(server.client(), &short).await.unwrap();
        let old = hami_certgen::pki::new_bundle(
            &s.dns_names(),
            3660,
            3655,
            OffsetDateTime::now_utc() - Duration::days(3650),
        )
        .unwrap();
        let mut stored = server
            .get::<Secret>(Some(NS), &s.secret_name)
            .unwrap()
            .unwrap();
        stored = hami_certgen::secret::render(&old, &s, Some(&stored));
        server.seed(&stored).unwrap();
        cluster::create(server.client(), &s).await.unwrap();
        cluster::patch(server.client(), NS, &s.secret_name, PREFIX)
            .await
            .unwrap();

        let requests: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| r.verb != Verb::Discovery)
            .collect();
        assert!(requests.len() >= 10, "{requests:?}");
        for r in &requests {
            let allowed = match r.resource.as_deref() {
                Some("secrets") => {
                    r.namespace.as_deref() == Some(NS)
                        && allows(role.rules.as_deref().unwrap(), "", r)
                }
                Some("mutatingwebhookconfigurations") => allows(
                    cluster_role.rules.as_deref().unwrap(),
                    "admissionregistration.k8s.io",
                    r,
                ),
                _ => false,
            };
            assert!(
                allowed,
                "{identity}: {:?} {} {:?}/{:?} is not allowed by the chart's RBAC",
                r.verb, r.path, r.namespace, r.name
            );
        }
    }
}

#[tokio::test]
async fn upgrade_render_carries_the_certgen_ca_as_ca_bundle() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    // Before certgen ran (a first install): nothing to look up, no caBundle.
    let url = server.url().to_owned();
    let first = dir.path().join("first");
    let out = first.clone();
    tokio::task::spawn_blocking(move || render_live(&url, &out))
        .await
        .unwrap();
    let mwc = rendered_webhook_config(&first);
    assert!(
        mwc.webhooks.as_ref().unwrap()[0]
            .client_config
            .ca_bundle
            .is_none()
    );

    // certgen's pre-install Job, with the arguments the chart gives it.
    let settings = settings();
    cluster::create(server.client(), &settings).await.unwrap();
    let secret = server
        .get::<Secret>(Some(NS), &settings.secret_name)
        .unwrap()
        .unwrap();
    let ca = secret.data.as_ref().unwrap()["ca.crt"].0.clone();

    let url = server.url().to_owned();
    let second = dir.path().join("second");
    let out = second.clone();
    tokio::task::spawn_blocking(move || render_live(&url, &out))
        .await
        .unwrap();
    let mwc = rendered_webhook_config(&second);
    let bundle = mwc.webhooks.as_ref().unwrap()[0]
        .client_config
        .ca_bundle
        .clone();
    assert_eq!(
        bundle.map(|b| b.0),
        Some(ca.clone()),
        "upgrade render carries the stored CA"
    );

    // Applied as Helm would, the post-upgrade patch Job has nothing left to do.
    server.seed(&mwc).unwrap();
    let outcome = cluster::patch(server.client(), NS, &settings.secret_name, PREFIX)
        .await
        .unwrap();
    assert_eq!(outcome, PatchOutcome::Unchanged);
}

//! The chart rendered by real Helm against the in-process API server, before and after
//! `hami-certgen create`: the RBAC the chart gives certgen covers every request it makes, and no
//! revision renders a caBundle, so upgrades and a rollback to the first revision keep the one
//! `hami-certgen patch` wrote.

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

/// Helm's client-side three-way merge (Helm 3, and Helm 4 without server-side apply) of one
/// object: a field the previous revision's manifest set and the next one does not is removed; a
/// field the next one sets takes its value; every other live field is kept. Lists of objects with
/// a `name` (the `webhooks` list) merge element by element, as the strategic merge patch does.
fn three_way(original: &Value, modified: &Value, live: &Value) -> Value {
    match (original, modified, live) {
        (_, Value::Object(m), Value::Object(l)) => {
            let empty = serde_json::Map::new();
            let o = original.as_object().unwrap_or(&empty);
            let mut out = l.clone();
            for key in o.keys().filter(|k| !m.contains_key(*k)) {
                out.remove(key);
            }
            for (key, value) in m {
                let merged = three_way(
                    o.get(key).unwrap_or(&Value::Null),
                    value,
                    l.get(key).unwrap_or(&Value::Null),
                );
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        (_, Value::Array(m), Value::Array(l)) if m.iter().all(|e| e.get("name").is_some()) => {
            let by_name = |list: &[Value], name: &Value| {
                list.iter().find(|e| e.get("name") == Some(name)).cloned()
            };
            let o = original.as_array().cloned().unwrap_or_default();
            Value::Array(
                m.iter()
                    .map(|e| {
                        let name = &e["name"];
                        match by_name(l, name) {
                            Some(live) => {
                                three_way(&by_name(&o, name).unwrap_or(Value::Null), e, &live)
                            }
                            None => e.clone(),
                        }
                    })
                    .collect(),
            )
        }
        (_, modified, _) => modified.clone(),
    }
}

fn ca_bundle_of(live: &Value) -> Option<&str> {
    live["webhooks"][0]["clientConfig"]["caBundle"].as_str()
}

/// `helm rollback` to the first revision keeps the caBundle. Revision 1 is rendered before
/// certgen ran (nothing to look up), revision 2 after it (the Secret exists): neither holds a
/// caBundle, so the three-way merge of an upgrade and of a rollback leaves the one `hami-certgen
/// patch` wrote; the rolled-back-to revision's post-rollback patch then has nothing to change. The
/// same merge with a revision that did render the CA (the chart's former `lookup`) removes it on
/// the rollback: the hazard this guards against.
#[tokio::test]
async fn rollback_to_the_first_revision_keeps_the_ca_bundle() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    // Revision 1: a first install, before certgen ran.
    let url = server.url().to_owned();
    let first = dir.path().join("first");
    let out = first.clone();
    tokio::task::spawn_blocking(move || render_live(&url, &out))
        .await
        .unwrap();
    let rev1 = serde_json::to_value(rendered_webhook_config(&first)).unwrap();
    assert!(ca_bundle_of(&rev1).is_none());

    // The install: the pre-install create Job, the object, the post-install patch Job.
    let settings = settings();
    cluster::create(server.client(), &settings).await.unwrap();
    server.seed_json(rev1.clone()).unwrap();
    cluster::patch(server.client(), NS, &settings.secret_name, PREFIX)
        .await
        .unwrap();
    let secret = server
        .get::<Secret>(Some(NS), &settings.secret_name)
        .unwrap()
        .unwrap();
    let ca = secret.data.as_ref().unwrap()["ca.crt"].0.clone();
    let live = || {
        server
            .get_json::<MutatingWebhookConfiguration>(None, PREFIX)
            .unwrap()
    };
    let encoded = serde_json::to_value(k8s_openapi::ByteString(ca.clone())).unwrap();
    assert_eq!(
        ca_bundle_of(&live()),
        encoded.as_str(),
        "patched at install"
    );

    // Revision 2: an upgrade rendered with the Secret in place still holds no caBundle.
    let url = server.url().to_owned();
    let second = dir.path().join("second");
    let out = second.clone();
    tokio::task::spawn_blocking(move || render_live(&url, &out))
        .await
        .unwrap();
    let rev2 = serde_json::to_value(rendered_webhook_config(&second)).unwrap();
    assert!(
        ca_bundle_of(&rev2).is_none(),
        "the chart renders no caBundle"
    );
    for (what, from, to) in [
        ("upgrade 1 -> 2", &rev1, &rev2),
        ("rollback 2 -> 1", &rev2, &rev1),
    ] {
        let next = three_way(from, to, &live());
        server.seed_json(next).unwrap();
        assert_eq!(
            ca_bundle_of(&live()),
            encoded.as_str(),
            "{what} removed or changed the caBundle"
        );
    }
    // The post-rollback patch Job of revision 1 finds nothing to do.
    let outcome = cluster::patch(server.client(), NS, &settings.secret_name, PREFIX)
        .await
        .unwrap();
    assert_eq!(outcome, PatchOutcome::Unchanged);

    // The hazard: had revision 2 rendered the CA, rolling back to revision 1 would strip it.
    let mut with_ca = rev2.clone();
    with_ca["webhooks"][0]["clientConfig"]["caBundle"] = encoded.clone();
    let stripped = three_way(&with_ca, &rev1, &live());
    assert!(ca_bundle_of(&stripped).is_none());
    // ... and the post-rollback patch Job is what would put it back.
    server.seed_json(stripped).unwrap();
    let outcome = cluster::patch(server.client(), NS, &settings.secret_name, PREFIX)
        .await
        .unwrap();
    assert_ne!(outcome, PatchOutcome::Unchanged);
    assert_eq!(ca_bundle_of(&live()), encoded.as_str());
}

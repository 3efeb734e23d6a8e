//! `hami-certgen create` and `patch` against the in-process API server (`hami_tests::apiserver`):
//! real HTTP, real kube client, optimistic concurrency, injected faults; plus the binary itself
//! through a kubeconfig that points at the server.

use std::collections::BTreeMap;
use std::process::Command;

use hami_certgen::cluster::{self, CreateOutcome, FIELD_MANAGER, PatchOutcome};
use hami_certgen::pki;
use hami_certgen::secret::{CreateSettings, Reason};
use hami_tests::apiserver::{ApiServer, Fault, RequestMatch, Verb};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use time::{Duration, OffsetDateTime};

const NS: &str = "hami-system";
const SECRET: &str = "hami-limits-webhook-tls";
const SERVICE: &str = "hami-limits-webhook";
const CONFIG: &str = "hami-limits";

fn settings() -> CreateSettings {
    CreateSettings {
        namespace: NS.into(),
        service: SERVICE.into(),
        secret_name: SECRET.into(),
        cluster_domain: "cluster.local".into(),
        ca_days: 3650,
        cert_days: 365,
        renew_before_days: 30,
    }
}

fn data(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

fn stored_secret(server: &ApiServer) -> Secret {
    server
        .get::<Secret>(Some(NS), SECRET)
        .unwrap()
        .expect("secret stored")
}

fn writes(server: &ApiServer, resource: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.resource.as_deref() == Some(resource)
                && matches!(r.verb, Verb::Create | Verb::Update | Verb::Patch)
                && r.fault.is_none()
        })
        .count()
}

fn webhook_config(bundles: &[Option<&[u8]>]) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(CONFIG.into()),
            ..Default::default()
        },
        webhooks: Some(
            bundles
                .iter()
                .enumerate()
                .map(|(i, b)| MutatingWebhook {
                    name: format!("w{i}.hami-limits.hami.io"),
                    admission_review_versions: vec!["v1".into()],
                    side_effects: "None".into(),
                    client_config: WebhookClientConfig {
                        service: Some(ServiceReference {
                            name: SERVICE.into(),
                            namespace: NS.into(),
                            path: Some("/mutate".into()),
                            port: Some(443),
                        }),
                        ca_bundle: b.map(|b| ByteString(b.to_vec())),
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

#[tokio::test]
async fn create_makes_a_valid_secret_then_keeps_it() {
    let server = ApiServer::start().await.unwrap();
    let outcome = cluster::create(server.client(), &settings()).await.unwrap();
    assert_eq!(outcome, CreateOutcome::Created);

    let secret = stored_secret(&server);
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let keys: Vec<_> = secret.data.as_ref().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);
    let leaf = pki::inspect("tls.crt", &data(&secret, "tls.crt")).unwrap();
    assert_eq!(
        leaf.dns_names,
        [
            "hami-limits-webhook",
            "hami-limits-webhook.hami-system",
            "hami-limits-webhook.hami-system.svc",
            "hami-limits-webhook.hami-system.svc.cluster.local"
        ]
    );
    pki::verify_signed_by(&data(&secret, "tls.crt"), &data(&secret, "ca.crt")).unwrap();
    let post = server
        .requests()
        .into_iter()
        .find(|r| r.verb == Verb::Create)
        .unwrap();
    assert!(
        post.query
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("fieldManager={FIELD_MANAGER}"))
    );

    // Idempotent: a second run reads, keeps, and writes nothing.
    server.clear_requests();
    let version = secret.metadata.resource_version.clone();
    assert_eq!(
        cluster::create(server.client(), &settings()).await.unwrap(),
        CreateOutcome::Kept
    );
    assert_eq!(writes(&server, "secrets"), 0);
    assert_eq!(stored_secret(&server).metadata.resource_version, version);
}

#[tokio::test]
async fn expiring_serving_certificate_is_renewed_under_the_same_ca() {
    let server = ApiServer::start().await.unwrap();
    // A bundle made 340 days ago: the serving certificate has 25 days left, inside the 30-day window.
    let then = OffsetDateTime::now_utc() - Duration::days(340);
    let old = pki::new_bundle(&settings().dns_names(), 3650, 365, then).unwrap();
    let mut seeded = hami_certgen::secret::render(&old, &settings(), None);
    seeded
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert("team".into(), "gpu".into());
    server.seed(&seeded).unwrap();

    let outcome = cluster::create(server.client(), &settings()).await.unwrap();
    assert_eq!(
        outcome,
        CreateOutcome::Updated {
            reason: Reason::ServingExpiring,
            new_ca: false
        }
    );
    let secret = stored_secret(&server);
    assert_eq!(
        data(&secret, "ca.crt"),
        old.ca.cert_pem,
        "the CA is kept, so caBundle stays valid"
    );
    assert_eq!(data(&secret, "ca.key"), old.ca.key_pem);
    assert_ne!(data(&secret, "tls.crt"), old.serving.cert_pem);
    let leaf = pki::inspect("tls.crt", &data(&secret, "tls.crt")).unwrap();
    assert!(leaf.not_after > OffsetDateTime::now_utc() + Duration::days(360));
    pki::verify_signed_by(&data(&secret, "tls.crt"), &old.ca.cert_pem).unwrap();
    assert_eq!(
        secret.metadata.labels.as_ref().unwrap()["team"],
        "gpu",
        "existing metadata kept"
    );
    assert_eq!(
        secret.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "hami-certgen"
    );
}

#[tokio::test]
async fn a_secret_without_its_ca_key_is_rebuilt_with_a_new_ca() {
    let server = ApiServer::start().await.unwrap();
    let bundle = pki::new_bundle(
        &settings().dns_names(),
        3650,
        365,
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    let mut secret = hami_certgen::secret::render(&bundle, &settings(), None);
    secret.data.as_mut().unwrap().remove("ca.key");
    server.seed(&secret).unwrap();
    match cluster::create(server.client(), &settings()).await.unwrap() {
        CreateOutcome::Updated {
            reason: Reason::Unreadable(why),
            new_ca: true,
        } => {
            assert!(why.contains("ca.key"), "{why}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let stored = stored_secret(&server);
    assert_ne!(data(&stored, "ca.crt"), bundle.ca.cert_pem);
    pki::verify_signed_by(&data(&stored, "tls.crt"), &data(&stored, "ca.crt")).unwrap();
}

#[tokio::test]
async fn ca_rotation_keeps_the_outgoing_ca_trusted_until_it_expires() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&webhook_config(&[None])).unwrap();
    // A CA made ten years ago with ten days left: inside the 30-day window.
    let then = OffsetDateTime::now_utc() - Duration::days(3650);
    let old = pki::new_bundle(&settings().dns_names(), 3660, 3655, then).unwrap();
    server
        .seed(&hami_certgen::secret::render(&old, &settings(), None))
        .unwrap();
    cluster::patch(server.client(), NS, SECRET, CONFIG)
        .await
        .unwrap();

    let outcome = cluster::create(server.client(), &settings()).await.unwrap();
    assert_eq!(
        outcome,
        CreateOutcome::Updated {
            reason: Reason::CaExpiring,
            new_ca: true
        }
    );
    let trust = data(&stored_secret(&server), "ca.crt");
    let blocks = pki::certificate_blocks(&trust);
    assert_eq!(blocks.len(), 2, "new CA, then the outgoing one");
    assert_eq!(blocks[1], old.ca.cert_pem);
    pki::verify_signed_by(&data(&stored_secret(&server), "tls.crt"), &trust).unwrap();

    // The caBundle trusts both: the webhook may still present the old serving certificate until
    // kubelet refreshes its Secret volume.
    assert_eq!(
        cluster::patch(server.client(), NS, SECRET, CONFIG)
            .await
            .unwrap(),
        PatchOutcome::Patched { webhooks: 1 }
    );
    let stored = server
        .get::<MutatingWebhookConfiguration>(None, CONFIG)
        .unwrap()
        .unwrap();
    let bundle = &stored.webhooks.as_ref().unwrap()[0].client_config.ca_bundle;
    assert_eq!(bundle.as_ref().unwrap().0, trust.as_bytes());
}

#[tokio::test]
async fn settings_that_would_renew_on_every_run_are_refused() {
    let server = ApiServer::start().await.unwrap();
    let mut s = settings();
    s.cert_days = 10;
    let err = cluster::create(server.client(), &s)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--cert-days=10 must be greater than --renew-before-days=30"),
        "{err}"
    );
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.resource.as_deref() != Some("secrets")),
        "nothing read or written"
    );
}

#[tokio::test]
async fn lost_races_are_re_read_and_retried() {
    let server = ApiServer::start().await.unwrap();
    // Another Job created the Secret between our read and our create.
    server.fail_next(
        RequestMatch::new(Verb::Create, "secrets"),
        1,
        Fault::Status(409),
    );
    assert_eq!(
        cluster::create(server.client(), &settings()).await.unwrap(),
        CreateOutcome::Created
    );
    let creates = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Create)
        .count();
    assert_eq!(creates, 2, "one refused, one written");

    // An update that loses to a concurrent writer is planned again from a fresh read.
    let then = OffsetDateTime::now_utc() - Duration::days(340);
    let old = pki::new_bundle(&settings().dns_names(), 3650, 365, then).unwrap();
    server
        .seed(&hami_certgen::secret::render(&old, &settings(), None))
        .unwrap();
    server.clear_requests();
    server.fail_next(
        RequestMatch::new(Verb::Update, "secrets"),
        2,
        Fault::Status(409),
    );
    let outcome = cluster::create(server.client(), &settings()).await.unwrap();
    assert!(
        matches!(outcome, CreateOutcome::Updated { new_ca: false, .. }),
        "{outcome:?}"
    );
    let gets = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Get)
        .count();
    assert_eq!(gets, 3, "a fresh read before every attempt");
}

#[tokio::test]
async fn endless_conflicts_and_other_errors_fail_with_the_object_named() {
    let server = ApiServer::start().await.unwrap();
    server.fail_next(
        RequestMatch::new(Verb::Create, "secrets"),
        100,
        Fault::Status(409),
    );
    let err = cluster::create(server.client(), &settings())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "writing Secret hami-system/hami-limits-webhook-tls: gave up after 5 conflicting updates"
    );

    server.clear_faults();
    server.fail_next(
        RequestMatch::new(Verb::Create, "secrets"),
        1,
        Fault::Status(500),
    );
    let err = cluster::create(server.client(), &settings())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("writing Secret hami-system/hami-limits-webhook-tls: "),
        "{err}"
    );
    assert!(server.get::<Secret>(Some(NS), SECRET).unwrap().is_none());
}

#[tokio::test]
async fn patch_writes_the_ca_into_every_webhook_once() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&webhook_config(&[None, Some(b"stale")]))
        .unwrap();
    cluster::create(server.client(), &settings()).await.unwrap();
    let ca = data(&stored_secret(&server), "ca.crt");

    let outcome = cluster::patch(server.client(), NS, SECRET, CONFIG)
        .await
        .unwrap();
    assert_eq!(outcome, PatchOutcome::Patched { webhooks: 2 });
    let stored = server
        .get::<MutatingWebhookConfiguration>(None, CONFIG)
        .unwrap()
        .unwrap();
    for w in stored.webhooks.as_ref().unwrap() {
        assert_eq!(
            w.client_config.ca_bundle.as_ref().unwrap().0,
            ca.as_bytes(),
            "{}",
            w.name
        );
        assert_eq!(
            w.client_config.service.as_ref().unwrap().name,
            SERVICE,
            "the rest is untouched"
        );
    }

    server.clear_requests();
    assert_eq!(
        cluster::patch(server.client(), NS, SECRET, CONFIG)
            .await
            .unwrap(),
        PatchOutcome::Unchanged
    );
    assert_eq!(writes(&server, "mutatingwebhookconfigurations"), 0);

    // A replaced CA (the Secret rebuilt) is written on the next patch.
    server.remove::<Secret>(Some(NS), SECRET);
    cluster::create(server.client(), &settings()).await.unwrap();
    let new_ca = data(&stored_secret(&server), "ca.crt");
    assert_ne!(new_ca, ca);
    server.fail_next(
        RequestMatch::new(Verb::Update, "mutatingwebhookconfigurations"),
        1,
        Fault::Status(409),
    );
    assert_eq!(
        cluster::patch(server.client(), NS, SECRET, CONFIG)
            .await
            .unwrap(),
        PatchOutcome::Patched { webhooks: 2 }
    );
    let stored = server
        .get::<MutatingWebhookConfiguration>(None, CONFIG)
        .unwrap()
        .unwrap();
    let bundle = &stored.webhooks.as_ref().unwrap()[1].client_config.ca_bundle;
    assert_eq!(bundle.as_ref().unwrap().0, new_ca.as_bytes());
}

#[tokio::test]
async fn patch_errors_name_what_is_missing() {
    let server = ApiServer::start().await.unwrap();
    let err = cluster::patch(server.client(), NS, SECRET, CONFIG)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("reading Secret hami-system/hami-limits-webhook-tls: "),
        "{err}"
    );

    cluster::create(server.client(), &settings()).await.unwrap();
    let err = cluster::patch(server.client(), NS, SECRET, CONFIG)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("reading MutatingWebhookConfiguration hami-limits: "),
        "{err}"
    );

    server.seed(&webhook_config(&[])).unwrap();
    let err = cluster::patch(server.client(), NS, SECRET, CONFIG)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MutatingWebhookConfiguration hami-limits has no webhooks to patch"
    );

    let empty = Secret {
        metadata: ObjectMeta {
            name: Some("empty".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    server.seed(&empty).unwrap();
    let err = cluster::patch(server.client(), NS, "empty", CONFIG)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "Secret hami-system/empty: key ca.crt is missing or empty"
    );
}

/// The binary, as the chart's hook Jobs run it, with a kubeconfig pointing at the test server.
#[tokio::test]
async fn binary_create_then_patch_through_kubeconfig() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&webhook_config(&[None])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
            server.url()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let kubeconfig = kubeconfig.clone();
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_hami-certgen"))
                .args(&args)
                .env("KUBECONFIG", &kubeconfig)
                .env_remove("KUBERNETES_SERVICE_HOST")
                .output()
                .unwrap()
        })
    };
    let create = [
        "create",
        "--namespace",
        NS,
        "--service",
        SERVICE,
        "--secret-name",
        SECRET,
    ];
    let out = run(&create).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "secret hami-system/hami-limits-webhook-tls: created\n"
    );
    let out = run(&create).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "secret hami-system/hami-limits-webhook-tls: valid, kept\n"
    );

    let out = run(&[
        "patch",
        "--namespace",
        NS,
        "--secret-name",
        SECRET,
        "--webhook-name",
        CONFIG,
    ])
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "mutatingwebhookconfiguration hami-limits: caBundle written to 1 webhook(s)\n"
    );
    let stored = server
        .get::<MutatingWebhookConfiguration>(None, CONFIG)
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref()
            .unwrap()
            .0,
        data(&stored_secret(&server), "ca.crt").as_bytes()
    );

    let out = run(&[
        "patch",
        "--namespace",
        NS,
        "--secret-name",
        SECRET,
        "--webhook-name",
        "nope",
    ])
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("hami-certgen: reading MutatingWebhookConfiguration nope: "),
        "{stderr}"
    );
}

#[test]
fn binary_local_writes_pem_files_and_rejects_bad_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hami-certgen"))
        .args(["local", "--out"])
        .arg(dir.path())
        .args(["--dns", "localhost", "127.0.0.1", "--cert-days", "7"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(listed.len(), 4);
    let crt = std::fs::read_to_string(dir.path().join("tls.crt")).unwrap();
    let ca = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
    pki::verify_signed_by(&crt, &ca).unwrap();
    let info = pki::inspect("tls.crt", &crt).unwrap();
    assert!(info.not_after < OffsetDateTime::now_utc() + Duration::days(8));

    let out = Command::new(env!("CARGO_BIN_EXE_hami-certgen"))
        .args(["local", "--out", "/tmp/x", "--dns", "a", "--cert-days", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cert-days"));
    let out = Command::new(env!("CARGO_BIN_EXE_hami-certgen"))
        .args(["local", "--out", "/tmp/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--dns is required");
}

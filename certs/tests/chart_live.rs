//! The chart rendered by real Helm against the in-process API server, after `hami-certgen create`:
//! Helm's `lookup` finds the Secret, so an upgrade carries the CA as the caBundle from the first
//! moment (no window without one before the post-upgrade patch Job), and `patch` then has nothing
//! to change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use hami_certgen::cluster::{self, PatchOutcome};
use hami_certgen::secret::CreateSettings;
use hami_tests::apiserver::ApiServer;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;

const NS: &str = "hami-system";
const RELEASE: &str = "hl";
const PREFIX: &str = "hl-hami-limits";

fn render_live(url: &str, out: &Path) {
    let python = std::env::var("HAMI_CHART_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/tests/render_live.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(url)
        .arg(out)
        .arg(RELEASE)
        .arg(NS)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python}: {e}; pip install -r scripts/requirements-test.txt")
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
    let settings = CreateSettings {
        namespace: NS.into(),
        service: format!("{PREFIX}-webhook"),
        secret_name: format!("{PREFIX}-webhook-tls"),
        cluster_domain: "cluster.local".into(),
        ca_days: 3650,
        cert_days: 365,
        renew_before_days: 30,
    };
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

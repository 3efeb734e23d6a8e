//! Pure caBundle update of a MutatingWebhookConfiguration.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

use crate::error::CertgenError;

/// Sets `clientConfig.caBundle` of every webhook to `ca_pem`.
///
/// Returns `Ok(None)` when every webhook already carries exactly this bundle (nothing to write), and
/// an error when the configuration has no webhooks: a patch that changes nothing there would leave
/// the operator believing the webhook is trusted.
pub fn with_ca_bundle(
    config: &MutatingWebhookConfiguration,
    ca_pem: &[u8],
) -> Result<Option<MutatingWebhookConfiguration>, CertgenError> {
    let name = config.metadata.name.clone().unwrap_or_default();
    let webhooks = config.webhooks.as_deref().unwrap_or_default();
    if webhooks.is_empty() {
        return Err(CertgenError::NoWebhooks { name });
    }
    if webhooks.iter().all(|w| {
        w.client_config
            .ca_bundle
            .as_ref()
            .is_some_and(|b| b.0 == ca_pem)
    }) {
        return Ok(None);
    }
    let mut updated = config.clone();
    updated.metadata.managed_fields = None;
    for webhook in updated.webhooks.iter_mut().flatten() {
        webhook.client_config.ca_bundle = Some(ByteString(ca_pem.to_vec()));
    }
    Ok(Some(updated))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn config(bundles: &[Option<&[u8]>]) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some("hami-limits".into()),
                ..Default::default()
            },
            webhooks: Some(
                bundles
                    .iter()
                    .enumerate()
                    .map(|(i, b)| MutatingWebhook {
                        name: format!("w{i}.hami.io"),
                        client_config: WebhookClientConfig {
                            ca_bundle: b.map(|b| ByteString(b.to_vec())),
                            ..Default::default()
                        },
                        admission_review_versions: vec!["v1".into()],
                        side_effects: "None".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn every_webhook_gets_the_bundle() {
        let updated = with_ca_bundle(&config(&[None, Some(b"old")]), b"new")
            .unwrap()
            .unwrap();
        let bundles: Vec<_> = updated
            .webhooks
            .unwrap()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.unwrap().0)
            .collect();
        assert_eq!(bundles, vec![b"new".to_vec(), b"new".to_vec()]);
    }

    #[test]
    fn already_patched_is_a_no_op() {
        assert!(
            with_ca_bundle(&config(&[Some(b"ca"), Some(b"ca")]), b"ca")
                .unwrap()
                .is_none()
        );
        assert!(
            with_ca_bundle(&config(&[Some(b"ca"), Some(b"cb")]), b"ca")
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn no_webhooks_is_an_error() {
        let err = with_ca_bundle(&config(&[]), b"ca").unwrap_err().to_string();
        assert_eq!(
            err,
            "MutatingWebhookConfiguration hami-limits has no webhooks to patch"
        );
    }
}

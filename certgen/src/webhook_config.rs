//! Pure caBundle update of a MutatingWebhookConfiguration.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

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

/// The Secret with `config` as an owner, so that deleting the configuration (`helm uninstall`:
/// the chart renders it, certgen makes the Secret) lets the garbage collector delete the Secret.
///
/// Returns `None` when the Secret already names this configuration (same UID); an owner reference
/// to an earlier configuration of the same name (deleted and made again: another UID) is replaced,
/// since one to an object that no longer exists would have the Secret collected. Other owners are
/// kept. `None` as well when the configuration has no UID (not read from a server).
#[must_use]
pub fn secret_owned_by(secret: &Secret, config: &MutatingWebhookConfiguration) -> Option<Secret> {
    let uid = config.metadata.uid.clone()?;
    let name = config.metadata.name.clone()?;
    let owners = secret
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    if owners
        .iter()
        .any(|o| o.kind == "MutatingWebhookConfiguration" && o.uid == uid)
    {
        return None;
    }
    let mut updated = secret.clone();
    updated.metadata.managed_fields = None;
    let mut kept: Vec<OwnerReference> = owners
        .iter()
        .filter(|o| !(o.kind == "MutatingWebhookConfiguration" && o.name == name))
        .cloned()
        .collect();
    kept.push(OwnerReference {
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "MutatingWebhookConfiguration".into(),
        name,
        uid,
        controller: None,
        block_owner_deletion: None,
    });
    updated.metadata.owner_references = Some(kept);
    Some(updated)
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

    fn owned(uid: Option<&str>) -> MutatingWebhookConfiguration {
        let mut c = config(&[None]);
        c.metadata.uid = uid.map(str::to_owned);
        c
    }

    fn secret_with(owners: Vec<OwnerReference>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("tls".into()),
                owner_references: if owners.is_empty() {
                    None
                } else {
                    Some(owners)
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_secret_is_owned_by_the_configuration_once() {
        let s = secret_owned_by(&secret_with(vec![]), &owned(Some("u1"))).unwrap();
        let refs = s.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(
            (
                refs[0].kind.as_str(),
                refs[0].name.as_str(),
                refs[0].uid.as_str()
            ),
            ("MutatingWebhookConfiguration", "hami-limits", "u1")
        );
        assert_eq!(refs[0].api_version, "admissionregistration.k8s.io/v1");
        assert_eq!(refs[0].block_owner_deletion, None);
        let again = secret_with(refs);
        assert!(secret_owned_by(&again, &owned(Some("u1"))).is_none());
    }

    #[test]
    fn a_reference_to_an_earlier_configuration_is_replaced_and_others_kept() {
        let s = secret_with(vec![
            owner("MutatingWebhookConfiguration", "hami-limits", "old"),
            owner("ConfigMap", "keep-me", "c1"),
        ]);
        let refs = secret_owned_by(&s, &owned(Some("new")))
            .unwrap()
            .metadata
            .owner_references
            .unwrap();
        let uids: Vec<&str> = refs.iter().map(|o| o.uid.as_str()).collect();
        assert_eq!(uids, ["c1", "new"]);
    }

    #[test]
    fn a_configuration_without_uid_changes_nothing() {
        assert!(secret_owned_by(&secret_with(vec![]), &owned(None)).is_none());
    }
}

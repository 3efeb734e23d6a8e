//! The kube I/O around the pure decisions: read, decide, write, retry on conflicts.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use time::OffsetDateTime;
use tracing::info;

use crate::error::CertgenError;
use crate::secret::{self, CreateSettings, Reason, SecretPlan};
use crate::webhook_config;

/// How many times a write that lost a race (HTTP 409) is re-planned from a fresh read. Two helm hook
/// Jobs (an upgrade racing a rollback) are the realistic worst case.
const MAX_ATTEMPTS: u32 = 5;

/// Field manager recorded on every write, so `kubectl get -o yaml --show-managed-fields` (and Helm's
/// server-side apply) can tell certgen's fields (caBundle, the Secret data) from the chart's.
pub const FIELD_MANAGER: &str = "hami-certgen";

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

fn kube_err(action: String) -> impl FnOnce(kube::Error) -> CertgenError {
    move |source| CertgenError::Kube { action, source }
}

/// What `create` did.
#[derive(Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The Secret was valid and was left as it was.
    Kept,
    /// The Secret was created.
    Created,
    /// The Secret was rewritten; `new_ca` says whether the CA changed (then `patch` must run).
    Updated { reason: Reason, new_ca: bool },
}

/// `hami-certgen create`: makes sure the Secret holds a valid CA and serving certificate.
pub async fn create(
    client: Client,
    settings: &CreateSettings,
) -> Result<CreateOutcome, CertgenError> {
    settings.validate()?;
    let secrets: Api<Secret> = Api::namespaced(client, &settings.namespace);
    let what = format!("Secret {}/{}", settings.namespace, settings.secret_name);
    for attempt in 1..=MAX_ATTEMPTS {
        let existing = secrets
            .get_opt(&settings.secret_name)
            .await
            .map_err(kube_err(format!("reading {what}")))?;
        let (bundle, new_ca, reason) =
            match secret::plan(existing.as_ref(), settings, OffsetDateTime::now_utc())? {
                SecretPlan::Keep => {
                    info!(secret = %what, "certificate valid beyond the renewal window; kept");
                    return Ok(CreateOutcome::Kept);
                }
                SecretPlan::Write {
                    bundle,
                    new_ca,
                    reason,
                } => (bundle, new_ca, reason),
            };
        let object = secret::render(&bundle, settings, existing.as_ref());
        let result = match &existing {
            None => secrets.create(&post_params(), &object).await,
            Some(_) => {
                secrets
                    .replace(&settings.secret_name, &post_params(), &object)
                    .await
            }
        };
        match result {
            Ok(_) => {
                info!(secret = %what, %reason, new_ca, "certificate written");
                return Ok(match existing {
                    None => CreateOutcome::Created,
                    Some(_) => CreateOutcome::Updated { reason, new_ca },
                });
            }
            Err(e) if is_conflict(&e) => {
                info!(secret = %what, attempt, "another writer changed the Secret; re-reading");
            }
            Err(e) => return Err(kube_err(format!("writing {what}"))(e)),
        }
    }
    Err(CertgenError::Conflict {
        action: format!("writing {what}"),
        attempts: MAX_ATTEMPTS,
    })
}

/// What `patch` did.
#[derive(Debug, PartialEq, Eq)]
pub enum PatchOutcome {
    /// Every webhook already carried this CA.
    Unchanged,
    /// The caBundle of `webhooks` webhooks was written.
    Patched { webhooks: usize },
}

/// `hami-certgen patch`: copies `ca.crt` of the Secret into every webhook of the configuration.
pub async fn patch(
    client: Client,
    namespace: &str,
    secret_name: &str,
    webhook_name: &str,
) -> Result<PatchOutcome, CertgenError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets.get(secret_name).await.map_err(kube_err(format!(
        "reading Secret {namespace}/{secret_name}"
    )))?;
    let ca = secret::ca_certificate(&secret)?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client);
    let what = format!("MutatingWebhookConfiguration {webhook_name}");
    for attempt in 1..=MAX_ATTEMPTS {
        let current = configs
            .get(webhook_name)
            .await
            .map_err(kube_err(format!("reading {what}")))?;
        let Some(updated) = webhook_config::with_ca_bundle(&current, &ca)? else {
            info!(config = %what, "caBundle already current");
            own_secret(&secrets, secret_name, &current).await?;
            return Ok(PatchOutcome::Unchanged);
        };
        let webhooks = updated.webhooks.as_ref().map_or(0, Vec::len);
        match configs
            .replace(webhook_name, &post_params(), &updated)
            .await
        {
            Ok(written) => {
                info!(config = %what, webhooks, "caBundle written");
                own_secret(&secrets, secret_name, &written).await?;
                return Ok(PatchOutcome::Patched { webhooks });
            }
            Err(e) if is_conflict(&e) => {
                info!(config = %what, attempt, "configuration changed while patching; re-reading");
            }
            Err(e) => return Err(kube_err(format!("writing {what}"))(e)),
        }
    }
    Err(CertgenError::Conflict {
        action: format!("writing {what}"),
        attempts: MAX_ATTEMPTS,
    })
}

/// Makes the configuration an owner of the Secret (see [`webhook_config::secret_owned_by`]), so
/// that `helm uninstall`, which deletes the configuration, leaves no Secret behind.
async fn own_secret(
    secrets: &Api<Secret>,
    secret_name: &str,
    config: &MutatingWebhookConfiguration,
) -> Result<(), CertgenError> {
    let what = format!("Secret {secret_name}");
    for attempt in 1..=MAX_ATTEMPTS {
        let secret = secrets
            .get(secret_name)
            .await
            .map_err(kube_err(format!("reading {what}")))?;
        let Some(updated) = webhook_config::secret_owned_by(&secret, config) else {
            return Ok(());
        };
        match secrets.replace(secret_name, &post_params(), &updated).await {
            Ok(_) => {
                info!(secret = %what, "owned by the webhook configuration (deleted with it)");
                return Ok(());
            }
            Err(e) if is_conflict(&e) => {
                info!(secret = %what, attempt, "the Secret changed while setting its owner; re-reading");
            }
            Err(e) => return Err(kube_err(format!("writing {what}"))(e)),
        }
    }
    Err(CertgenError::Conflict {
        action: format!("writing {what}"),
        attempts: MAX_ATTEMPTS,
    })
}

//! `hami.io/limit-delivery`: absent, `env` or `file`; anything else is denied, so that a typo never
//! silently becomes the node's default mode. `env` is denied in the namespaces of
//! `tenancy.forbidEnvDeliveryNamespaces` (there a pod may not leave its login sessions uncapped).

use hami_shared::names::ANNOTATION_LIMIT_DELIVERY;
use hami_shared::values::LimitDelivery;

use crate::policy::mutation::{Denial, PodMutation};
use crate::policy::tenancy::TenancySettings;

/// The pod's `hami.io/limit-delivery`, parsed (`None` when absent): the one parse of it on a
/// review, carried to the KAI mutation. A value present and not exactly `env` or `file` is denied,
/// and so is `env` where `tenancy` forbids it.
///
/// # Errors
/// [`Denial`] naming the pod, the annotation and the value (and the setting).
pub fn validate(
    m: &PodMutation<'_, '_>,
    tenancy: &TenancySettings,
) -> Result<Option<LimitDelivery>, Denial> {
    let delivery = m
        .pod()
        .annotation(ANNOTATION_LIMIT_DELIVERY)
        .map(parse)
        .transpose()
        .map_err(|reason| m.deny(reason))?;
    if delivery == Some(LimitDelivery::Env)
        && let Some(reason) = forbidden(m.namespace(), tenancy)
    {
        return Err(m.deny(reason));
    }
    Ok(delivery)
}

/// Why `env` delivery is refused in `namespace`, if it is: the one message, on CREATE and UPDATE.
#[must_use]
pub fn forbidden(namespace: Option<&str>, tenancy: &TenancySettings) -> Option<String> {
    tenancy.forbids_env_delivery(namespace).then(|| {
        format!(
            "annotation {ANNOTATION_LIMIT_DELIVERY}=\"env\" is not allowed in namespace {:?} (tenancy.forbidEnvDeliveryNamespaces): there every process of a GPU container is capped through the limits file; remove the annotation or set it to \"file\"",
            namespace.unwrap_or("")
        )
    })
}

/// A `hami.io/limit-delivery` value that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "annotation {ANNOTATION_LIMIT_DELIVERY}={value:?} is not one of: {accepted}",
    accepted = LimitDelivery::ACCEPTED
)]
pub struct DeliveryError {
    /// The annotation's value.
    pub value: String,
}

/// An annotation value parsed, or why it is refused: the one message of a bad value, on CREATE
/// ([`validate`]) and on UPDATE ([`crate::policy::update`]).
///
/// # Errors
/// [`DeliveryError`], naming the annotation, the value and the accepted forms.
pub fn parse(value: &str) -> Result<LimitDelivery, DeliveryError> {
    value.parse().map_err(|_| DeliveryError {
        value: value.to_owned(),
    })
}

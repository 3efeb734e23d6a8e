//! `hami.io/limit-delivery`: absent, `env` or `file`; anything else is denied, so that a typo never
//! silently becomes the node's default mode.

use hami_shared::names::ANNOTATION_LIMIT_DELIVERY;
use hami_shared::values::LimitDelivery;

use crate::policy::mutation::{Denial, PodMutation};

/// The pod's `hami.io/limit-delivery`, parsed (`None` when absent): the one parse of it on a
/// review, carried to the KAI mutation. A value present and not exactly `env` or `file` is denied.
///
/// # Errors
/// [`Denial`] naming the pod, the annotation and the value.
pub fn validate(m: &PodMutation<'_, '_>) -> Result<Option<LimitDelivery>, Denial> {
    m.pod()
        .annotation(ANNOTATION_LIMIT_DELIVERY)
        .map(parse)
        .transpose()
        .map_err(|reason| m.deny(reason))
}

/// An annotation value parsed, or why it is refused: the one message of a bad value, on CREATE
/// ([`validate`]) and on UPDATE ([`crate::policy::update`]).
///
/// # Errors
/// The reason, naming the annotation, the value and the accepted forms.
pub fn parse(value: &str) -> Result<LimitDelivery, String> {
    value.parse().map_err(|_| {
        format!(
            "annotation {ANNOTATION_LIMIT_DELIVERY}={value:?} is not one of: {}",
            LimitDelivery::ACCEPTED
        )
    })
}

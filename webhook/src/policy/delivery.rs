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
    match m.pod().annotation(ANNOTATION_LIMIT_DELIVERY) {
        None => Ok(None),
        Some(value) => match value.parse::<LimitDelivery>() {
            Ok(delivery) => Ok(Some(delivery)),
            Err(_) => Err(m.deny(format_args!(
                "annotation {ANNOTATION_LIMIT_DELIVERY}={value:?} is not one of: {}",
                LimitDelivery::ACCEPTED
            ))),
        },
    }
}

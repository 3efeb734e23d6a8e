//! `hami.io/limit-delivery`: absent, `env` or `file`; anything else is denied, so that a typo never
//! silently becomes the node's default mode.

use hami_shared::names::ANNOTATION_LIMIT_DELIVERY;
use hami_shared::values::LimitDelivery;

use crate::mutation::{Denial, PodMutation};

/// Deny a pod whose `hami.io/limit-delivery` is present and not exactly `env` or `file`.
///
/// # Errors
/// [`Denial`] naming the pod, the annotation and the value.
pub fn validate(m: &PodMutation<'_, '_>) -> Result<(), Denial> {
    match m.pod().annotation(ANNOTATION_LIMIT_DELIVERY) {
        None => Ok(()),
        Some(value) => match value.parse::<LimitDelivery>() {
            Ok(_) => Ok(()),
            Err(_) => Err(m.deny(format_args!(
                "annotation {ANNOTATION_LIMIT_DELIVERY}={value:?} is not one of: {}",
                LimitDelivery::ACCEPTED
            ))),
        },
    }
}

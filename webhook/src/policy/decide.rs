//! The admission decision: pure, synchronous, no I/O, no lock, no counter.
//!
//! [`decide`] checks the request envelope and runs each policy over one parsed pod:
//!
//! 0. [`crate::policy::tenancy::scheduler_owned`] — remove the HAMi scheduler's annotations (every
//!    pod);
//! 1. [`crate::policy::delivery`] — validate `hami.io/limit-delivery` (every pod);
//!    [`crate::policy::tenancy::visible_devices`] — no container names its own GPUs (every pod);
//! 2. [`crate::policy::hami`] — HAMi GPU pods: task priority, core policy, scheduler, privileged check;
//! 3. [`crate::policy::kai`] — KAI fractional pods: HAMi-core preload, memory cap, limits files.
//!
//! An `UPDATE` goes to [`crate::policy::update`] instead: the webhook-owned annotations are frozen,
//! the scheduler's are written only by the identities the operator names.
//!
//! A policy reads the pod through [`PodMutation::pod`], asks for changes through
//! [`PodMutation::patch`], adds warnings with [`PodMutation::warn`], records what the shell should
//! count with [`PodMutation::observe`], and returns a [`Denial`] to stop the pod. The types live
//! in [`crate::policy::mutation`], below the policies.

use crate::policy::basis::VramBasis;
use crate::policy::mutation::{Decision, Denial, PodMutation};
use crate::policy::settings::Settings;
use crate::policy::tenancy::{scheduler_owned, visible_devices};
use crate::policy::{delivery, hami, kai, update};
use crate::wire::pod::Pod;
use crate::wire::review::AdmissionRequest;

/// Decide one admission request; `vram` is the per-GPU VRAM basis for `gpu-fraction` pods (a
/// read-only snapshot: the decision takes no lock).
///
/// `CREATE` of a core/v1 Pod is decided by the policies; `UPDATE` by [`crate::policy::update`] (the
/// webhook-owned annotations are frozen; never a patch). Any other operation or resource is
/// allowed unchanged (answering them harmlessly keeps a misregistration from blocking the
/// cluster). A `CREATE` without an object, or an `UPDATE` without both objects, is
/// [`Decision::Invalid`].
#[must_use]
pub fn decide(
    request: &AdmissionRequest<'_>,
    settings: &Settings,
    vram: &dyn VramBasis,
) -> Decision {
    if let Some(kind) = &request.kind
        && !(kind.group.is_empty() && kind.kind == "Pod")
    {
        return Decision::allow();
    }
    match request.operation.as_deref() {
        Some("CREATE") => {}
        Some("UPDATE") => {
            let (Some(pod), Some(old)) = (&request.object, &request.old_object) else {
                return Decision::Invalid {
                    message: "invalid AdmissionReview: request.object and request.oldObject are required for UPDATE".to_owned(),
                };
            };
            return update::review(
                pod,
                old,
                request.namespace.as_deref(),
                request.username(),
                &settings.tenancy,
            );
        }
        Some(_) => return Decision::allow(),
        None => {
            return Decision::Invalid {
                message: "invalid AdmissionReview: request.operation is missing".to_owned(),
            };
        }
    }
    let Some(pod) = &request.object else {
        return Decision::Invalid {
            message: "invalid AdmissionReview: request.object is missing for CREATE".to_owned(),
        };
    };
    decide_pod(pod, request.namespace.as_deref(), settings, vram)
}

/// Decide the creation of `pod`. Each policy runs in turn; the first denial wins.
#[must_use]
pub fn decide_pod(
    pod: &Pod<'_>,
    request_namespace: Option<&str>,
    settings: &Settings,
    vram: &dyn VramBasis,
) -> Decision {
    let mut m = PodMutation::new(pod, request_namespace);
    if is_kai_internal(m.namespace(), &settings.kai) {
        return Decision::allow();
    }
    scheduler_owned::strip(&mut m);
    let result = delivery::validate(&m, &settings.tenancy).and_then(|delivery| {
        let kai_fraction = kai::fraction_entries(pod, &settings.kai);
        let allowed = settings.tenancy.allows_visible_devices(m.namespace());
        visible_devices::check(&m, kai_fraction.as_ref(), allowed)?;
        hami::mutate(&mut m, settings)?;
        kai::mutate(&mut m, settings, vram, delivery)
    });
    match result {
        Ok(()) => m.into_decision(),
        Err(Denial { message }) => Decision::Deny { message },
    }
}

/// A pod in KAI's reservation namespace: KAI's binder made it (tenants cannot create pods there
/// unless the operator lets them), and its binding waits for it.
fn is_kai_internal(namespace: Option<&str>, kai: &crate::policy::kai::KaiSettings) -> bool {
    !kai.reservation_namespace.is_empty() && namespace == Some(kai.reservation_namespace.as_str())
}

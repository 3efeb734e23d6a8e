//! The admission decision: pure, synchronous, no I/O.
//!
//! [`decide`] checks the request envelope and runs each decision module over one parsed pod:
//!
//! 1. [`crate::delivery`] — validate `hami.io/limit-delivery` (every pod);
//! 2. [`crate::hami`] — HAMi GPU pods: task priority, core policy, scheduler, privileged check.
//!
//! A module reads the pod through [`PodMutation::pod`], asks for changes through
//! [`PodMutation::patch`], adds warnings with [`PodMutation::warn`], and returns a [`Denial`] to stop
//! the pod. Further modules (KAI) plug in the same way in [`decide_pod`].

use crate::patch::{PatchOp, PodPatch};
use crate::pod::Pod;
use crate::review::AdmissionRequest;
use crate::settings::Settings;
use crate::{delivery, hami};

/// The answer to one admission request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admit the pod, with `patch` applied (empty: unchanged) and `warnings` shown to the user.
    Allow {
        patch: Vec<PatchOp>,
        warnings: Vec<String>,
    },
    /// Refuse the pod; `message` names the pod and says why.
    Deny { message: String },
    /// The request itself is unusable (e.g. a CREATE without an object).
    Invalid { message: String },
}

impl Decision {
    /// Admit unchanged, no warnings.
    #[must_use]
    pub fn allow() -> Self {
        Self::Allow {
            patch: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The outcome label for metrics.
    #[must_use]
    pub fn outcome(&self) -> crate::review::Outcome {
        use crate::review::Outcome;
        match self {
            Self::Allow { patch, .. } if patch.is_empty() => Outcome::Allowed,
            Self::Allow { .. } => Outcome::Patched,
            Self::Deny { .. } => Outcome::Denied,
            Self::Invalid { .. } => Outcome::Invalid,
        }
    }
}

/// A module's refusal of the pod. The message already names the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub message: String,
}

/// One pod under decision: the pod, the changes asked for so far, and the warnings.
#[derive(Debug)]
pub struct PodMutation<'p, 'a> {
    pod: &'p Pod<'a>,
    request_namespace: Option<&'p str>,
    /// The changes asked for so far.
    pub patch: PodPatch<'p, 'a>,
    warnings: Vec<String>,
}

impl<'p, 'a> PodMutation<'p, 'a> {
    /// Start deciding `pod`; `request_namespace` is the request's namespace, used when the object
    /// carries none (pods created through a namespaced URL).
    #[must_use]
    pub fn new(pod: &'p Pod<'a>, request_namespace: Option<&'p str>) -> Self {
        Self {
            pod,
            request_namespace,
            patch: PodPatch::new(pod),
            warnings: Vec::new(),
        }
    }

    /// The pod as it was received.
    #[must_use]
    pub fn pod(&self) -> &'p Pod<'a> {
        self.pod
    }

    /// `<namespace>/<name>` (or `generateName`) for messages.
    #[must_use]
    pub fn pod_name(&self) -> String {
        self.pod.display_name(self.request_namespace)
    }

    /// A denial whose message starts with `pod <ns>/<name>: `.
    #[must_use]
    pub fn deny(&self, reason: impl std::fmt::Display) -> Denial {
        Denial {
            message: format!("pod {}: {reason}", self.pod_name()),
        }
    }

    /// Add a warning (shown by kubectl). Duplicates are dropped.
    pub fn warn(&mut self, warning: String) {
        if !self.warnings.contains(&warning) {
            self.warnings.push(warning);
        }
    }

    /// The warnings so far.
    #[must_use]
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The decision: the patch and warnings.
    #[must_use]
    pub fn into_decision(self) -> Decision {
        Decision::Allow {
            patch: self.patch.into_ops(),
            warnings: self.warnings,
        }
    }
}

/// Decide one admission request.
///
/// Only `CREATE` of a core/v1 Pod is decided; any other operation or resource is allowed unchanged
/// (the webhook is registered for pod CREATE; answering others harmlessly keeps a misregistration
/// from blocking the cluster). A `CREATE` without an object is [`Decision::Invalid`].
#[must_use]
pub fn decide(request: &AdmissionRequest<'_>, settings: &Settings) -> Decision {
    if let Some(kind) = &request.kind
        && !(kind.group.is_empty() && kind.kind == "Pod")
    {
        return Decision::allow();
    }
    match request.operation.as_deref() {
        Some("CREATE") => {}
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
    decide_pod(pod, request.namespace.as_deref(), settings)
}

/// Decide the creation of `pod`. Each module runs in turn; the first denial wins.
#[must_use]
pub fn decide_pod(pod: &Pod<'_>, request_namespace: Option<&str>, settings: &Settings) -> Decision {
    let mut m = PodMutation::new(pod, request_namespace);
    let result = delivery::validate(&m)
        .and_then(|()| hami::mutate(&mut m, settings))
        .and_then(|()| crate::kai::mutate(&mut m, settings));
    match result {
        Ok(()) => m.into_decision(),
        Err(Denial { message }) => Decision::Deny { message },
    }
}

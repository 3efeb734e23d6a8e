//! What a decision is made of, below every policy: the [`Decision`] returned, the [`Denial`] a
//! policy raises, the [`PodMutation`] a policy works on and the [`Observation`]s it reports.
//!
//! The policies ([`crate::policy::delivery`], [`crate::policy::hami`], [`crate::policy::kai`]) import this module and
//! [`crate::policy::decide`] imports them: nothing here imports a policy, so the house has no circle.

use crate::policy::basis::SkipReason;
use crate::wire::patch::{MAX_PATCH_BYTES, PatchOp, PodPatch};
use crate::wire::pod::Pod;
use crate::wire::review::Answer;

/// The answer to one admission request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admit the pod, with `patch` applied (empty: unchanged) and `warnings` shown to the user.
    Allow {
        patch: Vec<PatchOp>,
        warnings: Vec<String>,
        /// The limits files the downward-API volume will project (KAI `file` delivery), for
        /// `hami-webhook mutate` and tests: no need to read them back out of the patch.
        limits_files: Vec<ProjectedFile>,
        /// What happened, for the shell to count (the decision bumps no counter itself).
        observations: Vec<Observation>,
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
            limits_files: Vec::new(),
            observations: Vec::new(),
        }
    }

    /// What the AdmissionReview response says of this decision.
    #[must_use]
    pub fn answer(&self) -> Answer<'_> {
        match self {
            Self::Allow {
                patch, warnings, ..
            } => Answer::Allow { patch, warnings },
            Self::Deny { message } => Answer::Deny { message },
            Self::Invalid { message } => Answer::Invalid { message },
        }
    }

    /// The outcome label for metrics.
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Allow { patch, .. } if patch.is_empty() => Outcome::Allowed,
            Self::Allow { .. } => Outcome::Patched,
            Self::Deny { .. } => Outcome::Denied,
            Self::Invalid { .. } => Outcome::Invalid,
        }
    }

    /// The observations of an admitted pod (none for a denial).
    #[must_use]
    pub fn observations(&self) -> &[Observation] {
        match self {
            Self::Allow { observations, .. } => observations,
            Self::Deny { .. } | Self::Invalid { .. } => &[],
        }
    }
}

/// How a review ended, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Allowed, nothing changed.
    Allowed,
    /// Allowed with a non-empty patch.
    Patched,
    /// Denied by policy.
    Denied,
    /// The review itself was unusable (no request, no uid, wrong kind or version, bad object).
    Invalid,
}

impl Outcome {
    /// Lowercase label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Patched => "patched",
            Self::Denied => "denied",
            Self::Invalid => "invalid",
        }
    }
}

/// One limits file a decision projects into a container at `/overrideEnv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectedFile {
    /// The container name.
    pub container: String,
    /// The file's text.
    pub text: String,
}

/// Where a KAI pod's memory limit came from (metric label `limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KaiLimit {
    /// `gpu-memory`.
    GpuMemory,
    /// `gpu-fraction` of the per-GPU VRAM basis.
    GpuFraction,
    /// No cap: the basis was missing (see [`Observation::KaiCapSkipped`]).
    None,
}

impl KaiLimit {
    /// Metric label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GpuMemory => "gpu-memory",
            Self::GpuFraction => "gpu-fraction",
            Self::None => "none",
        }
    }

    /// Every value, for metric initialisation.
    pub const ALL: [KaiLimit; 3] = [Self::GpuMemory, Self::GpuFraction, Self::None];
}

/// Something a decision saw that the shell counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Observation {
    /// A KAI pod was mutated, with its limit from this source.
    KaiPod(KaiLimit),
    /// A `gpu-fraction` pod got no cap, for this reason.
    KaiCapSkipped(SkipReason),
}

/// A module's refusal of the pod. The message already names the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub message: String,
}

/// One pod under decision: the pod, the changes asked for so far, the warnings, the projected
/// files and the observations.
#[derive(Debug)]
pub struct PodMutation<'p, 'a> {
    pod: &'p Pod<'a>,
    request_namespace: Option<&'p str>,
    /// The changes asked for so far.
    pub patch: PodPatch<'p, 'a>,
    warnings: Vec<String>,
    /// Distinct warnings past [`MAX_WARNINGS`], counted only.
    more_warnings: usize,
    limits_files: Vec<ProjectedFile>,
    observations: Vec<Observation>,
}

/// The most warnings one response carries (the API server shows them all to the user).
pub const MAX_WARNINGS: usize = 16;

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
            more_warnings: 0,
            limits_files: Vec::new(),
            observations: Vec::new(),
        }
    }

    /// The pod as it was received.
    #[must_use]
    pub fn pod(&self) -> &'p Pod<'a> {
        self.pod
    }

    /// The pod's namespace for the settings that are per namespace: the request's (the API server
    /// took it from the URL and checked the object against it), else the object's (offline).
    #[must_use]
    pub fn namespace(&self) -> Option<&'p str> {
        self.request_namespace
            .filter(|n| !n.is_empty())
            .or(self.pod.metadata.namespace.as_deref())
            .filter(|n| !n.is_empty())
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

    /// Add a warning (shown by kubectl). Duplicates are dropped; past [`MAX_WARNINGS`] they are
    /// only counted (a pod of many containers could otherwise carry megabytes of them).
    pub fn warn(&mut self, warning: String) {
        if self.warnings.contains(&warning) {
            return;
        }
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(warning);
        } else {
            self.more_warnings += 1;
        }
    }

    /// A denial for a pod whose patch would pass [`MAX_PATCH_BYTES`].
    #[must_use]
    pub fn deny_patch_too_large(&self) -> Denial {
        let containers = self.pod.all_containers().count();
        self.deny(format_args!(
            "the changes hami-limits must make to its {containers} containers and init containers take more than {} KiB of JSONPatch ({MAX_PATCH_BYTES} bytes: etcd's default request limit, so the pod could not be stored); use fewer containers, or give them fewer GPU settings to add",
            MAX_PATCH_BYTES / 1024
        ))
    }

    /// [`Err`] once the patch is over budget, for loops over containers to stop early.
    ///
    /// # Errors
    /// [`Self::deny_patch_too_large`].
    pub fn check_patch_size(&self) -> Result<(), Denial> {
        if self.patch.over_budget() {
            Err(self.deny_patch_too_large())
        } else {
            Ok(())
        }
    }

    /// The warnings so far.
    #[must_use]
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Record a limits file the pod will have projected.
    pub fn project(&mut self, file: ProjectedFile) {
        self.limits_files.push(file);
    }

    /// Record something for the shell to count.
    pub fn observe(&mut self, observation: Observation) {
        self.observations.push(observation);
    }

    /// The decision: the patch, warnings, files and observations; a denial when the patch went
    /// over [`MAX_PATCH_BYTES`].
    #[must_use]
    pub fn into_decision(mut self) -> Decision {
        if self.patch.over_budget() {
            return Decision::Deny {
                message: self.deny_patch_too_large().message,
            };
        }
        if self.more_warnings > 0 {
            self.warnings.push(format!(
                "and {} more warnings (only the first {MAX_WARNINGS} are shown)",
                self.more_warnings
            ));
        }
        Decision::Allow {
            patch: self.patch.into_ops(),
            warnings: self.warnings,
            limits_files: self.limits_files,
            observations: self.observations,
        }
    }
}

//! What a decision is made of, below every policy: the [`Decision`] returned, the [`Denial`] a
//! policy raises, the [`PodMutation`] a policy works on and the [`Observation`]s it reports.
//!
//! The policies ([`crate::delivery`], [`crate::hami`], [`crate::kai`]) import this module and
//! [`crate::decide`] imports them: nothing here imports a policy, so the house has no circle.

use crate::basis::SkipReason;
use crate::patch::{PatchOp, PodPatch};
use crate::pod::Pod;

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
    limits_files: Vec<ProjectedFile>,
    observations: Vec<Observation>,
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
            limits_files: Vec::new(),
            observations: Vec::new(),
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

    /// Record a limits file the pod will have projected.
    pub fn project(&mut self, file: ProjectedFile) {
        self.limits_files.push(file);
    }

    /// Record something for the shell to count.
    pub fn observe(&mut self, observation: Observation) {
        self.observations.push(observation);
    }

    /// The decision: the patch, warnings, files and observations.
    #[must_use]
    pub fn into_decision(self) -> Decision {
        Decision::Allow {
            patch: self.patch.into_ops(),
            warnings: self.warnings,
            limits_files: self.limits_files,
            observations: self.observations,
        }
    }
}

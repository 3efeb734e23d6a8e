//! The Kubernetes wire types, below every decision: the borrowed [`pod`] view, the JSONPatch
//! [`patch`] a decision builds, the AdmissionReview [`review`] read and answered, and the
//! [`mountpath`] rule (a mount path compared as kubelet cleans it). Nothing here imports
//! [`crate::policy`] or [`crate::shell`].

pub mod mountpath;
pub mod patch;
pub mod pod;
pub mod review;

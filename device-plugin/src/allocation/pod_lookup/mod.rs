//! Finding the pod kubelet is allocating for, for `Allocate` and `GetPreferredAllocation` alike:
//!
//! - [`pod`]: what makes a pod the one (node lock holder, HAMi's pending-pod test) and the
//!   [`pod::Candidate`] that carries its devices annotation, decoded once per call (pure);
//! - [`cache`]: the watch-fed view of this node's pods, read first;
//! - [`locator`]: the node lock, then the pod (the view, else the API server), and
//!   [`locator::KubePendingPod`] for `GetPreferredAllocation`.
//!
//! Imports go one way: `locator` → `cache` → `pod` → the device codec.

pub mod cache;
pub mod locator;
pub mod pod;

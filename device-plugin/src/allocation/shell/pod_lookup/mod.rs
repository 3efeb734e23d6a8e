//! Finding the pod kubelet is allocating for, for `Allocate` and `GetPreferredAllocation` alike:
//!
//! - [`cache`]: the watch-fed view of this node's pods, read first;
//! - [`locator`]: the node lock, then the pod (the view, else the API server), and
//!   [`locator::KubePendingPod`] for `GetPreferredAllocation`.
//!
//! What makes a pod the one (node lock holder, HAMi's pending-pod test, its decoded devices) is
//! pure and lives in [`crate::allocation::plan::pod`]. Imports go one way: `locator` → `cache` →
//! `plan::pod` → the device codec.

pub mod cache;
pub mod locator;

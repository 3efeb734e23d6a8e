//! The HAMi scheduler's pod annotations (and its `hami.io/vgpu-node` label) belong to the
//! scheduler: the device plugin's `Allocate` reads from them which GPUs, how much memory and
//! which share of the cores a container gets, and which pod it is serving.
//!
//! - CREATE ([`strip`]): a pod never keeps them. Each one the pod carries is removed (JSONPatch
//!   `remove`), with one warning naming them, whether or not `spec.nodeName` is preset. Removed,
//!   not refused: a pod restored from a backup carries them legitimately, and without them it is
//!   scheduled by HAMi's scheduler again like any new pod (a pod with a preset `nodeName` and no
//!   entry is refused by `Allocate`: fail closed). Every pod the webhook reviews is stripped, not
//!   only GPU pods: `Allocate` finds the pod it serves by these annotations, not by its resources.
//! - UPDATE ([`review_update`]): only the usernames of `tenancy.schedulerAnnotationWriters` may
//!   add, change or remove them.

use std::collections::BTreeMap;

use hami_shared::names::{SCHEDULER_OWNED_ANNOTATIONS, SCHEDULER_OWNED_LABELS};

use crate::policy::mutation::PodMutation;
use crate::policy::tenancy::settings::TenancySettings;
use crate::wire::pod::{ObjectMeta, StrMap};

/// How many changed keys an UPDATE denial names before it says "and N more".
const NAMED_KEYS: usize = 5;

/// Remove every scheduler-owned annotation and label the pod carries, with one warning naming
/// them. A pod without any is left alone (so a reinvocation after the removal changes nothing).
pub fn strip(m: &mut PodMutation<'_, '_>) {
    let pod = m.pod();
    let annotations: Vec<&str> = SCHEDULER_OWNED_ANNOTATIONS
        .into_iter()
        .filter(|k| pod.annotation(k).is_some())
        .collect();
    let labels: Vec<&str> = SCHEDULER_OWNED_LABELS
        .into_iter()
        .filter(|k| pod.label(k).is_some())
        .collect();
    if annotations.is_empty() && labels.is_empty() {
        return;
    }
    for key in &annotations {
        m.patch.remove_annotation(key);
    }
    for key in &labels {
        m.patch.remove_label(key);
    }
    let mut what = Vec::new();
    if !annotations.is_empty() {
        what.push(format!("annotations {}", annotations.join(", ")));
    }
    if !labels.is_empty() {
        what.push(format!("label {}", labels.join(", ")));
    }
    m.warn(format!(
        "removed the HAMi scheduler's {}: only HAMi's scheduler writes them, when it places the pod (the device plugin trusts them to hand out GPUs); the pod is scheduled like any new pod",
        what.join(" and ")
    ));
}

/// The scheduler-owned entries of `meta` (the last entry of a key wins, as the API server reads
/// JSON), as (`annotation`|`label`, key) → value.
fn owned<'m>(meta: &'m ObjectMeta<'_>) -> BTreeMap<(&'static str, &'m str), &'m str> {
    let pick = |map: Option<&'m StrMap<'_>>, keys: &'static [&'static str], what: &'static str| {
        map.into_iter()
            .flat_map(StrMap::iter)
            .filter(move |(k, _)| keys.contains(k))
            .map(move |(k, v)| ((what, k), v))
    };
    pick(
        meta.annotations.as_ref(),
        &SCHEDULER_OWNED_ANNOTATIONS,
        "annotation",
    )
    .chain(pick(meta.labels.as_ref(), &SCHEDULER_OWNED_LABELS, "label"))
    .collect()
}

/// The reason an UPDATE from `old` to `new` by `user` is refused, if it adds, changes or removes
/// a scheduler-owned annotation or label and `user` is not in
/// `tenancy.schedulerAnnotationWriters`.
#[must_use]
pub fn review_update(
    new: &ObjectMeta<'_>,
    old: &ObjectMeta<'_>,
    user: Option<&str>,
    tenancy: &TenancySettings,
) -> Option<String> {
    let before = owned(old);
    let after = owned(new);
    let mut changes: Vec<String> = Vec::new();
    for ((what, key), value) in &after {
        match before.get(&(*what, *key)) {
            None => changes.push(format!("adds {what} {key:?}")),
            Some(was) if was != value => changes.push(format!("changes {what} {key:?}")),
            Some(_) => {}
        }
    }
    for (what, key) in before.keys() {
        if !after.contains_key(&(*what, *key)) {
            changes.push(format!("removes {what} {key:?}"));
        }
    }
    if changes.is_empty() || tenancy.may_write_scheduler_annotations(user) {
        return None;
    }
    let more = changes.len().saturating_sub(NAMED_KEYS);
    changes.truncate(NAMED_KEYS);
    let mut list = changes.join(", ");
    if more > 0 {
        list.push_str(&format!(" and {more} more"));
    }
    let user = user.map_or_else(|| "an unknown user".to_owned(), |u| format!("user {u:?}"));
    Some(format!(
        "this update by {user} {list}: the HAMi scheduler's annotations and label tell the device plugin which GPUs and how much of them the pod gets, and only the users in tenancy.schedulerAnnotationWriters ({}) may write them",
        tenancy.scheduler_annotation_writers.join(", ")
    ))
}

//! The `hami.io/preload` slot IDs (`preload-<n>`): what the plugin advertises, what kubelet's
//! pod-resources API reports a container holds, and the name of the slot's region folder.

/// Prefix of the slot device IDs (`preload-0`, `preload-1`, …).
pub const SLOT_PREFIX: &str = "preload-";

/// Whether `id` is one of the `slots` advertised (`preload-<n>`, `n` written without a leading
/// zero).
#[must_use]
pub fn is_slot(id: &str, slots: u32) -> bool {
    id.strip_prefix(SLOT_PREFIX)
        .filter(|n| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && (*n == "0" || !n.starts_with('0'))
        })
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n < slots)
}

/// Slot IDs in numeric order (`preload-2` before `preload-10`).
#[must_use]
pub fn slot_order(a: &str, b: &str) -> std::cmp::Ordering {
    (a.len(), a).cmp(&(b.len(), b))
}

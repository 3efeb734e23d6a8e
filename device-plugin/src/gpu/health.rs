//! GPU health from critical Xid events, as HAMi v2.10's `rm/health.go` (`checkHealth`) decides
//! it: which Xids count ([`HealthCheckPolicy`], from `DP_DISABLE_HEALTHCHECKS` and
//! `DP_ENABLE_HEALTHCHECKS`), and what an event, a failed registration or a failed wait does to
//! the devices ([`watch_xids`]). The events come through [`XidEventSource`]: NVML in production
//! ([`crate::gpu::nvml`]), a fake in tests. Health fails closed: an error marks devices unhealthy,
//! it never ends the watch.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;

/// A change of one GPU's (or MIG device's) health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// The GPU's UUID.
    pub uuid: String,
    /// Its new health.
    pub healthy: bool,
    /// Why, for the log (an Xid number, the inventory file).
    pub reason: String,
}

/// `all` or `xids` turns health checks off; otherwise a comma-separated list of further Xids
/// that do not make a GPU unhealthy (HAMi's and NVIDIA's name).
pub const ENV_DISABLE_HEALTHCHECKS: &str = "DP_DISABLE_HEALTHCHECKS";
/// A comma-separated list of Xids that make a GPU unhealthy even when ignored by default or by
/// `DP_DISABLE_HEALTHCHECKS`; `all` makes every Xid count.
pub const ENV_ENABLE_HEALTHCHECKS: &str = "DP_ENABLE_HEALTHCHECKS";

/// Xid errors caused by applications, not by the GPU: ignored by default (HAMi's `ignoredXids`:
/// graphics engine exception, GPU memory page fault, GPU stopped processing, preemptive cleanup,
/// video processor exception, context switch timeout).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// The Xid NVML reports when it does not know the Xid (`nvmlEventData_t.eventData` 999).
pub const UNKNOWN_XID: u64 = 999;

/// HAMi's key for "all Xids" in its map (`allXIDs = 0`): an Xid `0` in either list means all.
const ALL: u64 = 0;

/// Which Xids make a GPU unhealthy: the two variables read as HAMi's `getHealthCheckXids` reads
/// them (lower-cased, split at `,`, trimmed; `all`/`xids` means every Xid; a malformed item is
/// skipped and reported).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckPolicy {
    /// HAMi's `disabledXIDs` map: `true` = this Xid is ignored.
    disabled: BTreeMap<u64, bool>,
    /// Items that are not Xids: `(variable, item)`.
    malformed: Vec<(&'static str, String)>,
}

impl Default for HealthCheckPolicy {
    fn default() -> Self {
        Self::new(None, None)
    }
}

/// One variable's items, as HAMi's `newHealthCheckXIDs`.
fn xid_items(
    key: &'static str,
    value: Option<&str>,
    malformed: &mut Vec<(&'static str, String)>,
) -> BTreeMap<u64, bool> {
    let mut out = BTreeMap::new();
    let lower = value.unwrap_or_default().to_lowercase();
    for item in lower.split(',') {
        let item = item.trim();
        if item == "all" || item == "xids" {
            return BTreeMap::from([(ALL, true)]);
        }
        if item.is_empty() {
            continue;
        }
        match item.parse::<u64>() {
            Ok(xid) => {
                out.insert(xid, true);
            }
            Err(_) => malformed.push((key, item.to_owned())),
        }
    }
    out
}

impl HealthCheckPolicy {
    /// The policy from the values of `DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS`.
    pub fn new(disable: Option<&str>, enable: Option<&str>) -> Self {
        let mut malformed = Vec::new();
        let mut disabled = xid_items(ENV_DISABLE_HEALTHCHECKS, disable, &mut malformed);
        let enabled = xid_items(ENV_ENABLE_HEALTHCHECKS, enable, &mut malformed);
        for xid in APPLICATION_XIDS {
            disabled.insert(xid, true);
        }
        for xid in enabled.keys() {
            disabled.insert(*xid, false);
        }
        Self {
            disabled,
            malformed,
        }
    }

    /// No health checks at all (`DP_DISABLE_HEALTHCHECKS=all` without `DP_ENABLE_HEALTHCHECKS=all`).
    pub fn all_disabled(&self) -> bool {
        self.disabled.get(&ALL).copied().unwrap_or(false)
    }

    /// Whether an event with this Xid leaves the GPU healthy (HAMi's `IsDisabled`).
    pub fn is_disabled(&self, xid: u64) -> bool {
        if self.disabled.get(&ALL) == Some(&false) {
            return false;
        }
        match self.disabled.get(&xid) {
            Some(disabled) => *disabled,
            None => self.all_disabled(),
        }
    }

    /// The items that are not Xids, `(variable, item)`, for a warning at start.
    pub fn malformed(&self) -> &[(&'static str, String)] {
        &self.malformed
    }
}

/// What registering one GPU for critical Xid events gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Its events will be reported.
    Watching,
    /// The GPU cannot report them (too old): it stays healthy, unwatched, as HAMi leaves it.
    NotSupported,
    /// The GPU could not be found or registered: it is marked unhealthy.
    Failed(String),
}

/// One event from the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// The UUID of the physical GPU the event is about, or why it could not be read.
    pub uuid: Result<String, String>,
    /// A critical Xid event (others are skipped).
    pub critical_xid: bool,
    /// The Xid ([`UNKNOWN_XID`] when NVML does not know it).
    pub xid: u64,
}

/// What one wait gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Nothing happened within the timeout.
    Timeout,
    /// An event.
    Event(XidEvent),
    /// Waiting failed: every watched GPU is marked unhealthy.
    Failed(String),
}

/// A source of critical Xid events for physical GPUs (NVML's event set, or a fake).
pub trait XidEventSource {
    /// Watches the GPU with this UUID.
    fn register(&mut self, uuid: &str) -> Registration;
    /// Waits up to `timeout` for the next event.
    fn wait(&mut self, timeout: Duration) -> Wait;
}

/// What [`watch_xids`] watches and how.
#[derive(Debug, Clone)]
pub struct HealthWatch {
    /// The physical GPUs (UUIDs) behind the advertised devices.
    pub uuids: Vec<String>,
    /// Which Xids count.
    pub policy: HealthCheckPolicy,
    /// One wait's timeout (HAMi: 5 s).
    pub timeout: Duration,
    /// Pause after a failed wait before the next, so that a persistent failure does not spin a
    /// core (HAMi waits again at once).
    pub error_pause: Duration,
}

impl HealthWatch {
    /// HAMi's timing: 5 s waits; a 1 s pause after a failed wait.
    pub fn new(uuids: Vec<String>, policy: HealthCheckPolicy) -> Self {
        Self {
            uuids,
            policy,
            timeout: Duration::from_secs(5),
            error_pause: Duration::from_secs(1),
        }
    }
}

fn unhealthy(uuid: &str, reason: String) -> HealthEvent {
    HealthEvent {
        uuid: uuid.to_owned(),
        healthy: false,
        reason,
    }
}

/// Registers every GPU and turns events into [`HealthEvent`]s on `events` until its receiver is
/// gone (blocking: run it on its own thread). As HAMi's `checkHealth`: a GPU that cannot be
/// registered, every GPU after a failed wait or an event whose GPU cannot be named, and the GPU
/// of a critical Xid that the policy does not ignore become unhealthy; a GPU never becomes
/// healthy again (until the plugin restarts). Events for GPUs not watched are ignored.
pub fn watch_xids(
    source: &mut dyn XidEventSource,
    watch: &HealthWatch,
    events: &mpsc::UnboundedSender<HealthEvent>,
) {
    let send = |event: HealthEvent| events.send(event).is_ok();
    let all = |reason: &str| {
        watch
            .uuids
            .iter()
            .all(|uuid| send(unhealthy(uuid, reason.to_owned())))
    };
    for uuid in &watch.uuids {
        match source.register(uuid) {
            Registration::Watching => {}
            Registration::NotSupported => {
                tracing::warn!(gpu = %uuid, "GPU too old for critical Xid events; its health is not watched");
            }
            Registration::Failed(error) => {
                if !send(unhealthy(
                    uuid,
                    format!("cannot watch its Xid events: {error}"),
                )) {
                    return;
                }
            }
        }
    }
    while !events.is_closed() {
        match source.wait(watch.timeout) {
            Wait::Timeout => {}
            Wait::Failed(error) => {
                tracing::warn!(%error, "waiting for NVML events failed; marking every GPU unhealthy");
                if !all(&format!("waiting for NVML events failed: {error}")) {
                    return;
                }
                std::thread::sleep(watch.error_pause);
            }
            Wait::Event(event) => {
                if !event.critical_xid || watch.policy.is_disabled(event.xid) {
                    continue;
                }
                let uuid = match event.uuid {
                    Ok(uuid) => uuid,
                    Err(error) => {
                        if !all(&format!(
                            "critical Xid {} on a GPU NVML cannot name: {error}",
                            event.xid
                        )) {
                            return;
                        }
                        continue;
                    }
                };
                if !watch.uuids.contains(&uuid) {
                    tracing::info!(gpu = %uuid, xid = event.xid, "ignoring an event for a GPU not advertised");
                    continue;
                }
                if !send(unhealthy(&uuid, format!("critical Xid {}", event.xid))) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn policy_reads_the_two_variables_as_hami_does() {
        let default = HealthCheckPolicy::default();
        assert!(!default.all_disabled());
        for xid in APPLICATION_XIDS {
            assert!(default.is_disabled(xid), "{xid}");
        }
        assert!(!default.is_disabled(48) && !default.is_disabled(UNKNOWN_XID));

        for off in ["all", "XIDS", "48, all", " All "] {
            assert!(
                HealthCheckPolicy::new(Some(off), None).all_disabled(),
                "{off}"
            );
        }
        // HAMi's map uses 0 for "all": an Xid 0 in the list is the same as `all`.
        assert!(HealthCheckPolicy::new(Some("0"), None).all_disabled());
        // Enabling single Xids does not undo `all`.
        assert!(HealthCheckPolicy::new(Some("all"), Some("48")).all_disabled());

        let p = HealthCheckPolicy::new(Some("48, 79,x"), Some("13"));
        assert!(!p.all_disabled());
        assert!(p.is_disabled(48) && p.is_disabled(79) && p.is_disabled(31));
        assert!(!p.is_disabled(13), "re-enabled");
        assert!(!p.is_disabled(94));
        assert_eq!(p.malformed(), [(ENV_DISABLE_HEALTHCHECKS, "x".to_owned())]);

        // `DP_ENABLE_HEALTHCHECKS=all`: every Xid counts, even `DP_DISABLE_HEALTHCHECKS=all`.
        let every = HealthCheckPolicy::new(Some("all"), Some("all"));
        assert!(!every.all_disabled());
        assert!(!every.is_disabled(13) && !every.is_disabled(48));
    }

    /// Scripted events; then timeouts (sleeping briefly, as a real wait would).
    struct Script {
        fail: Vec<&'static str>,
        unsupported: Vec<&'static str>,
        waits: VecDeque<Wait>,
    }

    impl XidEventSource for Script {
        fn register(&mut self, uuid: &str) -> Registration {
            if self.fail.contains(&uuid) {
                Registration::Failed("GPU is lost".to_owned())
            } else if self.unsupported.contains(&uuid) {
                Registration::NotSupported
            } else {
                Registration::Watching
            }
        }
        fn wait(&mut self, _timeout: Duration) -> Wait {
            self.waits.pop_front().unwrap_or_else(|| {
                std::thread::sleep(Duration::from_millis(1));
                Wait::Timeout
            })
        }
    }

    fn xid(uuid: &str, xid: u64) -> Wait {
        Wait::Event(XidEvent {
            uuid: Ok(uuid.to_owned()),
            critical_xid: true,
            xid,
        })
    }

    /// Runs the watch over `script` and returns the events it sent before the receiver closed.
    fn run(
        script: Script,
        uuids: &[&str],
        policy: HealthCheckPolicy,
        expect: usize,
    ) -> Vec<HealthEvent> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let watch = HealthWatch {
            uuids: uuids.iter().map(|u| (*u).to_owned()).collect(),
            policy,
            timeout: Duration::from_millis(1),
            error_pause: Duration::ZERO,
        };
        let thread = std::thread::spawn(move || {
            let mut script = script;
            watch_xids(&mut script, &watch, &tx);
        });
        let mut got = Vec::new();
        while got.len() < expect {
            got.push(rx.blocking_recv().unwrap());
        }
        drop(rx);
        thread.join().unwrap();
        got
    }

    #[test]
    fn events_and_errors_make_gpus_unhealthy() {
        let script = Script {
            fail: vec!["GPU-c"],
            unsupported: vec!["GPU-d"],
            waits: VecDeque::from([
                Wait::Timeout,
                xid("GPU-a", 13), // application Xid: ignored
                Wait::Event(XidEvent {
                    uuid: Ok("GPU-a".into()),
                    critical_xid: false,
                    xid: 48,
                }), // not a critical Xid event: ignored
                xid("GPU-z", 79), // not ours: ignored
                xid("GPU-b", 79),
                Wait::Event(XidEvent {
                    uuid: Err("Unknown".into()),
                    critical_xid: true,
                    xid: 48,
                }),
                Wait::Failed("GPU is lost".into()),
            ]),
        };
        let got = run(
            script,
            &["GPU-a", "GPU-b", "GPU-c", "GPU-d"],
            HealthCheckPolicy::default(),
            10,
        );
        let summary: Vec<(&str, &str)> = got
            .iter()
            .map(|e| {
                assert!(!e.healthy);
                (e.uuid.as_str(), e.reason.as_str())
            })
            .collect();
        assert_eq!(
            summary[0],
            ("GPU-c", "cannot watch its Xid events: GPU is lost")
        );
        assert_eq!(summary[1], ("GPU-b", "critical Xid 79"));
        let named: Vec<&str> = summary[2..6].iter().map(|(u, _)| *u).collect();
        assert_eq!(named, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]);
        assert!(
            summary[2].1.contains("cannot name: Unknown"),
            "{}",
            summary[2].1
        );
        assert!(
            summary[6..]
                .iter()
                .all(|(_, r)| r.contains("waiting for NVML events failed: GPU is lost"))
        );
    }

    #[test]
    fn enabled_application_xids_count() {
        let script = Script {
            fail: vec![],
            unsupported: vec![],
            waits: VecDeque::from([xid("GPU-a", 13), xid("GPU-a", 43)]),
        };
        let got = run(
            script,
            &["GPU-a"],
            HealthCheckPolicy::new(None, Some("43")),
            1,
        );
        assert_eq!(got[0].reason, "critical Xid 43");
    }
}

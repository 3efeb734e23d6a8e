//! Which pods are KAI pods, whether their request is valid, and which containers get HAMi-core.

use hami_shared::names::{
    ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_FRACTION_CONTAINER_NAME, ANNOTATION_GPU_MEMORY,
    ANNOTATION_KAI_RESOURCE_ISOLATOR_INJECT, LABEL_KAI_RESOURCE_ISOLATOR_WEBHOOK,
};

use crate::policy::kai::quantity::{Fraction, parse_gpu_memory};
use crate::policy::kai::settings::{KaiSettings, PreloadContainers};
use crate::policy::mutation::{Denial, PodMutation};
use crate::wire::pod::{ContainerKind, ContainerRef, DEFAULT_SCHEDULER, Pod};

/// The KAI annotations of a selected pod, unvalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRequest<'p> {
    /// `gpu-memory` or `gpu-fraction` (the first one present; both is refused by [`validate`]).
    pub annotation: &'static str,
    /// Its value.
    pub value: &'p str,
    /// The other one, when both are present.
    pub conflicting: Option<&'p str>,
}

/// A valid KAI GPU request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KaiRequest {
    /// `gpu-memory`: MiB.
    Memory(u64),
    /// `gpu-fraction`: a share of one GPU.
    Fraction(Fraction),
}

/// The KAI request of `pod` when it is a KAI pod: it carries `gpu-memory` or `gpu-fraction` and
/// its scheduler is one of `kai.schedulerNames` (any when empty). Whether its own opt-out counts
/// is the caller's to decide ([`opt_out`]).
#[must_use]
pub fn select<'p>(pod: &'p Pod<'_>, kai: &KaiSettings) -> Option<RawRequest<'p>> {
    let memory = pod.annotation(ANNOTATION_GPU_MEMORY);
    let fraction = pod.annotation(ANNOTATION_GPU_FRACTION);
    let (annotation, value, conflicting) = match (memory, fraction) {
        (None, None) => return None,
        (Some(v), other) => (ANNOTATION_GPU_MEMORY, v, other),
        (None, Some(v)) => (ANNOTATION_GPU_FRACTION, v, None),
    };
    if !kai.scheduler_names.is_empty() {
        let scheduler = pod
            .spec
            .scheduler_name
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_SCHEDULER);
        if !kai.scheduler_names.iter().any(|s| s == scheduler) {
            return None;
        }
    }
    Some(RawRequest {
        annotation,
        value,
        conflicting,
    })
}

/// The pod's own KAI opt-out, as KAI-resource-isolator reads it, if it carries one: annotation
/// `kai-resource-isolator.io/inject: "false"` (any case) or label
/// `kai-resource-isolator.io/webhook: ignore`.
#[must_use]
pub fn opt_out(pod: &Pod<'_>) -> Option<String> {
    if let Some(v) = pod
        .annotation(ANNOTATION_KAI_RESOURCE_ISOLATOR_INJECT)
        .filter(|v| v.eq_ignore_ascii_case("false"))
    {
        return Some(format!(
            "annotation {ANNOTATION_KAI_RESOURCE_ISOLATOR_INJECT}={v:?}"
        ));
    }
    (pod.label(LABEL_KAI_RESOURCE_ISOLATOR_WEBHOOK) == Some("ignore"))
        .then(|| format!("label {LABEL_KAI_RESOURCE_ISOLATOR_WEBHOOK}=\"ignore\""))
}

/// The container KAI gives the GPU (and its own entries): the one `gpu-fraction-container-name`
/// names (init containers first), else `containers[0]`.
#[must_use]
pub fn fraction_container(pod: &Pod<'_>) -> Option<ContainerRef> {
    match pod.annotation(ANNOTATION_GPU_FRACTION_CONTAINER_NAME) {
        Some(name) => pod
            .all_containers()
            .find(|(_, c)| c.name == name)
            .map(|(at, _)| at),
        None => (!pod.spec.containers.is_empty()).then_some(ContainerRef {
            kind: ContainerKind::Regular,
            index: 0,
        }),
    }
}

/// Validate the request as KAI's own admission validator does.
///
/// # Errors
/// [`Denial`] naming the pod, the annotation and the value.
pub fn validate(m: &PodMutation<'_, '_>, raw: &RawRequest<'_>) -> Result<KaiRequest, Denial> {
    if let Some(other) = raw.conflicting {
        return Err(m.deny(format_args!(
            "annotations {ANNOTATION_GPU_MEMORY}={:?} and {ANNOTATION_GPU_FRACTION}={other:?} are mutually exclusive; set one",
            raw.value
        )));
    }
    let invalid = |e: &dyn std::fmt::Display| {
        m.deny(format_args!(
            "annotation {}={:?} {e}",
            raw.annotation, raw.value
        ))
    };
    if raw.annotation == ANNOTATION_GPU_MEMORY {
        parse_gpu_memory(raw.value)
            .map(KaiRequest::Memory)
            .map_err(|e| invalid(&e))
    } else {
        Fraction::parse(raw.value)
            .map(KaiRequest::Fraction)
            .map_err(|e| invalid(&e))
    }
}

/// The containers that get the HAMi-core preload.
///
/// # Errors
/// [`Denial`] when `gpu-fraction-container-name` names no container or init container, in
/// either mode.
pub fn preload_targets(
    m: &PodMutation<'_, '_>,
    mode: PreloadContainers,
) -> Result<Vec<ContainerRef>, Denial> {
    let pod = m.pod();
    // all_containers() yields init containers first, as KAI searches them. The name must name a
    // container in both modes (with `all` it selects nothing, but a wrong name is still a wrong
    // request, as KAI's own validator says).
    let named = match pod.annotation(ANNOTATION_GPU_FRACTION_CONTAINER_NAME) {
        Some(name) => match pod.all_containers().find(|(_, c)| c.name == name) {
            Some((at, _)) => Some(at),
            None => {
                const SHOWN: usize = 10;
                let total = pod.all_containers().count();
                let names: Vec<&str> = pod
                    .all_containers()
                    .take(SHOWN)
                    .map(|(_, c)| c.name.as_ref())
                    .collect();
                let more = if total > SHOWN {
                    format!(" and {} more", total - SHOWN)
                } else {
                    String::new()
                };
                return Err(m.deny(format_args!(
                    "annotation {ANNOTATION_GPU_FRACTION_CONTAINER_NAME}={name:?} names no container or init container (the pod has: {}{more})",
                    names.join(", ")
                )));
            }
        },
        None => None,
    };
    match mode {
        PreloadContainers::All => Ok(pod.all_containers().map(|(at, _)| at).collect()),
        PreloadContainers::Fraction => match named {
            Some(at) => Ok(vec![at]),
            None if pod.spec.containers.is_empty() => Ok(Vec::new()),
            None => Ok(vec![ContainerRef {
                kind: ContainerKind::Regular,
                index: 0,
            }]),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: &str) -> Pod<'_> {
        serde_json::from_str(json).unwrap()
    }

    /// (pod json, settings, selected annotation)
    type SelectionCase<'a> = (&'a str, &'a KaiSettings, Option<&'a str>);

    fn assert_selection(cases: &[SelectionCase<'_>]) {
        for (json, settings, expected) in cases {
            let p = pod(json);
            assert_eq!(
                select(&p, settings).map(|r| r.annotation),
                *expected,
                "{json}"
            );
        }
    }

    #[test]
    fn selection_table() {
        let kai = KaiSettings::default();
        let any = KaiSettings {
            scheduler_names: vec![],
            ..KaiSettings::default()
        };
        let two = KaiSettings {
            scheduler_names: vec!["kai-scheduler".into(), "default-scheduler".into()],
            ..KaiSettings::default()
        };
        let cases: &[SelectionCase<'_>] = &[
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                &kai,
                Some("gpu-fraction"),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-memory":"4000"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                &kai,
                Some("gpu-memory"),
            ),
            // The annotation key is what selects, whatever its value (validation comes next).
            (
                r#"{"metadata":{"annotations":{"gpu-memory":""}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                &kai,
                Some("gpu-memory"),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"}},"spec":{"schedulerName":"default-scheduler"}}"#,
                &kai,
                None,
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"}},"spec":{}}"#,
                &kai,
                None,
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"}},"spec":{}}"#,
                &any,
                Some("gpu-fraction"),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"}},"spec":{"schedulerName":"other"}}"#,
                &any,
                Some("gpu-fraction"),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"}},"spec":{}}"#,
                &two,
                Some("gpu-fraction"),
            ),
            (
                r#"{"metadata":{"annotations":{"other":"1"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                &kai,
                None,
            ),
            (
                r#"{"metadata":{},"spec":{"schedulerName":"kai-scheduler"}}"#,
                &kai,
                None,
            ),
        ];
        assert_selection(cases);
    }

    /// The opt-outs: `kai-resource-isolator.io/inject: false` (any case) and the webhook label;
    /// the pod is still selected (whether its opt-out counts is per namespace).
    #[test]
    fn opt_out_table() {
        let kai = KaiSettings::default();
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5","kai-resource-isolator.io/inject":"false"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                Some(r#"annotation kai-resource-isolator.io/inject="false""#),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5","kai-resource-isolator.io/inject":"FALSE"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                Some(r#"annotation kai-resource-isolator.io/inject="FALSE""#),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5","kai-resource-isolator.io/inject":"true"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                None,
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5","kai-resource-isolator.io/inject":"no"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                None,
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"},"labels":{"kai-resource-isolator.io/webhook":"ignore"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                Some(r#"label kai-resource-isolator.io/webhook="ignore""#),
            ),
            (
                r#"{"metadata":{"annotations":{"gpu-fraction":"0.5"},"labels":{"kai-resource-isolator.io/webhook":"x"}},"spec":{"schedulerName":"kai-scheduler"}}"#,
                None,
            ),
        ];
        for (json, expected) in cases {
            let p = pod(json);
            assert!(select(&p, &kai).is_some(), "{json}");
            assert_eq!(opt_out(&p).as_deref(), *expected, "{json}");
        }
    }

    #[test]
    fn validation_messages() {
        let kai = KaiSettings::default();
        let cases: &[(&str, Result<KaiRequest, &str>)] = &[
            (r#""gpu-memory":"04000""#, Ok(KaiRequest::Memory(4000))),
            (
                r#""gpu-fraction":"0.25""#,
                Ok(KaiRequest::Fraction(Fraction::parse("0.25").unwrap())),
            ),
            (
                r#""gpu-memory":"0""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-memory="0" is zero; a GPU memory request must be at least 1 MiB"#,
                ),
            ),
            (
                r#""gpu-memory":"4Gi""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-memory="4Gi" is not a positive decimal integer of MiB (e.g. "4000"; no sign, unit, space or fraction)"#,
                ),
            ),
            (
                r#""gpu-memory":"""#,
                Err(r#"pod ml/train-1: annotation gpu-memory="" is empty"#),
            ),
            (
                r#""gpu-fraction":"1.5""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-fraction="1.5" is not strictly between 0 and 1"#,
                ),
            ),
            (
                r#""gpu-fraction":"0""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-fraction="0" is not strictly between 0 and 1"#,
                ),
            ),
            (
                r#""gpu-fraction":"NaN""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-fraction="NaN" is not a decimal number (e.g. "0.25", ".5", "25e-2"; no unit, space, `_`, hex, NaN or Inf)"#,
                ),
            ),
            (
                r#""gpu-fraction":"-0.5""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-fraction="-0.5" is not strictly between 0 and 1"#,
                ),
            ),
            (
                r#""gpu-fraction":" 0.5""#,
                Err(
                    r#"pod ml/train-1: annotation gpu-fraction=" 0.5" is not a decimal number (e.g. "0.25", ".5", "25e-2"; no unit, space, `_`, hex, NaN or Inf)"#,
                ),
            ),
            (
                r#""gpu-memory":"4000","gpu-fraction":"0.5""#,
                Err(
                    r#"pod ml/train-1: annotations gpu-memory="4000" and gpu-fraction="0.5" are mutually exclusive; set one"#,
                ),
            ),
        ];
        for (annotations, expected) in cases {
            let json = format!(
                r#"{{"metadata":{{"name":"train-1","namespace":"ml","annotations":{{{annotations}}}}},"spec":{{"schedulerName":"kai-scheduler"}}}}"#
            );
            let p = pod(&json);
            let m = PodMutation::new(&p, None);
            let raw = select(&p, &kai).unwrap();
            let got = validate(&m, &raw).map_err(|d| d.message);
            assert_eq!(
                got,
                expected.clone().map_err(str::to_owned),
                "{annotations}"
            );
        }
    }

    #[test]
    fn preload_target_table() {
        let base = r#""initContainers":[{"name":"init-a"},{"name":"shared"}],"containers":[{"name":"main"},{"name":"shared-2"}]"#;
        type Expected = Result<Vec<(ContainerKind, usize)>, &'static str>;
        let cases: &[(&str, PreloadContainers, Expected)] = &[
            (
                "",
                PreloadContainers::Fraction,
                Ok(vec![(ContainerKind::Regular, 0)]),
            ),
            (
                r#","gpu-fraction-container-name":"shared-2""#,
                PreloadContainers::Fraction,
                Ok(vec![(ContainerKind::Regular, 1)]),
            ),
            (
                r#","gpu-fraction-container-name":"shared""#,
                PreloadContainers::Fraction,
                Ok(vec![(ContainerKind::Init, 1)]),
            ),
            (
                r#","gpu-fraction-container-name":"nope""#,
                PreloadContainers::Fraction,
                Err(
                    r#"pod default/p: annotation gpu-fraction-container-name="nope" names no container or init container (the pod has: init-a, shared, main, shared-2)"#,
                ),
            ),
            (
                "",
                PreloadContainers::All,
                Ok(vec![
                    (ContainerKind::Init, 0),
                    (ContainerKind::Init, 1),
                    (ContainerKind::Regular, 0),
                    (ContainerKind::Regular, 1),
                ]),
            ),
            (
                r#","gpu-fraction-container-name":"nope""#,
                PreloadContainers::All,
                Err(
                    r#"pod default/p: annotation gpu-fraction-container-name="nope" names no container or init container (the pod has: init-a, shared, main, shared-2)"#,
                ),
            ),
            (
                r#","gpu-fraction-container-name":"../x""#,
                PreloadContainers::All,
                Err(
                    r#"pod default/p: annotation gpu-fraction-container-name="../x" names no container or init container (the pod has: init-a, shared, main, shared-2)"#,
                ),
            ),
            (
                r#","gpu-fraction-container-name":"main""#,
                PreloadContainers::All,
                Ok(vec![
                    (ContainerKind::Init, 0),
                    (ContainerKind::Init, 1),
                    (ContainerKind::Regular, 0),
                    (ContainerKind::Regular, 1),
                ]),
            ),
        ];
        for (extra, mode, expected) in cases {
            let json = format!(
                r#"{{"metadata":{{"name":"p","namespace":"default","annotations":{{"gpu-fraction":"0.5"{extra}}}}},"spec":{{{base}}}}}"#
            );
            let p = pod(&json);
            let m = PodMutation::new(&p, None);
            let got = preload_targets(&m, *mode)
                .map(|v| v.into_iter().map(|r| (r.kind, r.index)).collect::<Vec<_>>())
                .map_err(|d| d.message);
            assert_eq!(
                got,
                expected.clone().map_err(str::to_owned),
                "{extra} {mode:?}"
            );
        }
    }
}

//! Where a pod can be placed, as the scheduler reads it: `spec.nodeName`, `spec.nodeSelector` and
//! the required node affinity (`requiredDuringSchedulingIgnoredDuringExecution`).
//!
//! Rules (Kubernetes `nodeaffinity` semantics): the node must match every `nodeSelector` entry
//! and, when required affinity is present, at least one of its terms (terms are OR'ed); inside a
//! term every `matchExpressions` and `matchFields` requirement must hold (AND'ed). An empty term
//! matches nothing. `Gt`/`Lt` compare the label as an integer. `matchFields` only knows
//! `metadata.name` (`In`, `NotIn`). Preferred affinity, taints and tolerations do not rule a
//! node out and are ignored here.

use serde::Deserialize;

use crate::wire::pod::Pod;

mod limits;

pub use limits::{AffinityLimits, AffinityTooLarge, TERMS_FIELD};

/// One label or field requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// Label `key` is one of `values`.
    In { key: String, values: Vec<String> },
    /// Label `key` is absent or not one of `values`.
    NotIn { key: String, values: Vec<String> },
    /// Label `key` is present.
    Exists { key: String },
    /// Label `key` is absent.
    DoesNotExist { key: String },
    /// Label `key` is present and, as an integer, greater than `value`.
    Gt { key: String, value: i64 },
    /// Label `key` is present and, as an integer, less than `value`.
    Lt { key: String, value: i64 },
    /// `metadata.name` is one of `values` (`matchFields`).
    NameIn { values: Vec<String> },
    /// `metadata.name` is not one of `values` (`matchFields`).
    NameNotIn { values: Vec<String> },
    /// A requirement no node can satisfy (an unknown operator or field, `Gt` with a value that is
    /// not one integer): the scheduler would place the pod nowhere, so no node is a candidate.
    Never,
}

/// The constraints on a pod's node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// `spec.nodeName`: only this node.
    pub node_name: Option<String>,
    /// `spec.nodeSelector` entries, each an exact label match.
    pub node_selector: Vec<(String, String)>,
    /// Required node affinity terms (OR'ed); `None` when the pod has none.
    pub terms: Option<Vec<Vec<Requirement>>>,
}

/// A node as placement sees it: its name and label lookup.
pub trait NodeView {
    /// `metadata.name`.
    fn name(&self) -> &str;
    /// The value of label `key`.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Placement {
    /// No constraint: any node.
    #[must_use]
    pub fn any() -> Self {
        Self::default()
    }

    /// Whether nothing narrows the node set.
    #[must_use]
    pub fn is_unconstrained(&self) -> bool {
        self.node_name.is_none() && self.node_selector.is_empty() && self.terms.is_none()
    }

    /// Read the pod's placement constraints. A malformed `affinity` is read as far as it goes:
    /// what cannot be read matches no node (never a guess that widens the set).
    #[must_use]
    pub fn of_pod(pod: &Pod<'_>) -> Self {
        let node_name = pod
            .spec
            .node_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
        let node_selector = pod
            .spec
            .node_selector
            .as_ref()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let terms = pod
            .spec
            .affinity
            .and_then(|raw| parse_required_terms(raw.get()));
        Self {
            node_name,
            node_selector,
            terms,
        }
    }

    /// Whether `node` satisfies every constraint.
    pub fn matches(&self, node: &impl NodeView) -> bool {
        if let Some(name) = &self.node_name
            && node.name() != name
        {
            return false;
        }
        if !self
            .node_selector
            .iter()
            .all(|(k, v)| node.label(k) == Some(v.as_str()))
        {
            return false;
        }
        match &self.terms {
            None => true,
            Some(terms) => terms
                .iter()
                .any(|t| !t.is_empty() && t.iter().all(|r| r.matches(node))),
        }
    }
}

impl Requirement {
    /// Whether `node` satisfies this requirement.
    pub fn matches(&self, node: &impl NodeView) -> bool {
        match self {
            Self::In { key, values } => node
                .label(key)
                .is_some_and(|v| values.iter().any(|x| x == v)),
            Self::NotIn { key, values } => node
                .label(key)
                .is_none_or(|v| values.iter().all(|x| x != v)),
            Self::Exists { key } => node.label(key).is_some(),
            Self::DoesNotExist { key } => node.label(key).is_none(),
            Self::Gt { key, value } => label_int(node, key).is_some_and(|n| n > *value),
            Self::Lt { key, value } => label_int(node, key).is_some_and(|n| n < *value),
            Self::NameIn { values } => values.iter().any(|x| x == node.name()),
            Self::NameNotIn { values } => values.iter().all(|x| x != node.name()),
            Self::Never => false,
        }
    }
}

fn label_int(node: &impl NodeView, key: &str) -> Option<i64> {
    node.label(key)?.parse().ok()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AffinityIn {
    #[serde(default)]
    node_affinity: Option<NodeAffinityIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeAffinityIn {
    #[serde(default)]
    required_during_scheduling_ignored_during_execution: Option<NodeSelectorIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeSelectorIn {
    #[serde(default)]
    node_selector_terms: Vec<TermIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TermIn {
    #[serde(default)]
    match_expressions: Option<Vec<ExprIn>>,
    #[serde(default)]
    match_fields: Option<Vec<ExprIn>>,
}

#[derive(Deserialize)]
struct ExprIn {
    #[serde(default)]
    key: String,
    #[serde(default)]
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

/// The required node-affinity terms of an `affinity` object; `None` when it has none. A shape
/// that does not parse is one term no node matches.
fn parse_required_terms(affinity_json: &str) -> Option<Vec<Vec<Requirement>>> {
    let Ok(affinity) = serde_json::from_str::<AffinityIn>(affinity_json) else {
        return Some(vec![vec![Requirement::Never]]);
    };
    let required = affinity
        .node_affinity?
        .required_during_scheduling_ignored_during_execution?;
    Some(
        required
            .node_selector_terms
            .into_iter()
            .map(|t| {
                let mut reqs: Vec<Requirement> = t
                    .match_expressions
                    .unwrap_or_default()
                    .into_iter()
                    .map(label_requirement)
                    .collect();
                reqs.extend(
                    t.match_fields
                        .unwrap_or_default()
                        .into_iter()
                        .map(field_requirement),
                );
                reqs
            })
            .collect(),
    )
}

fn label_requirement(e: ExprIn) -> Requirement {
    let values = e.values.unwrap_or_default();
    let key = e.key;
    match e.operator.as_str() {
        "In" => Requirement::In { key, values },
        "NotIn" => Requirement::NotIn { key, values },
        "Exists" => Requirement::Exists { key },
        "DoesNotExist" => Requirement::DoesNotExist { key },
        op @ ("Gt" | "Lt") => match values.as_slice() {
            [one] => match one.parse::<i64>() {
                Ok(value) if op == "Gt" => Requirement::Gt { key, value },
                Ok(value) => Requirement::Lt { key, value },
                Err(_) => Requirement::Never,
            },
            _ => Requirement::Never,
        },
        _ => Requirement::Never,
    }
}

fn field_requirement(e: ExprIn) -> Requirement {
    if e.key != "metadata.name" {
        return Requirement::Never;
    }
    let values = e.values.unwrap_or_default();
    match e.operator.as_str() {
        "In" => Requirement::NameIn { values },
        "NotIn" => Requirement::NameNotIn { values },
        _ => Requirement::Never,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct N(&'static str, &'static [(&'static str, &'static str)]);
    impl NodeView for N {
        fn name(&self) -> &str {
            self.0
        }
        fn label(&self, key: &str) -> Option<&str> {
            self.1.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
        }
    }

    fn placement(spec: &str) -> Placement {
        let json = format!(r#"{{"spec":{spec}}}"#);
        let pod: Pod<'_> = serde_json::from_str(&json).unwrap();
        Placement::of_pod(&pod)
    }

    const A: N = N("a", &[("zone", "z1"), ("pool", "kai"), ("gen", "8")]);
    const B: N = N("b", &[("zone", "z2"), ("pool", "kai"), ("gen", "9")]);
    const C: N = N("c", &[("zone", "z1")]);

    fn names(p: &Placement) -> String {
        [&A, &B, &C]
            .iter()
            .filter(|n| p.matches(**n))
            .map(|n| n.0)
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn placement_table() {
        let expr = |ops: &str| {
            format!(
                r#"{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":{ops}}}}}}}}}"#
            )
        };
        let cases: Vec<(String, &str)> = vec![
            ("{}".into(), "a,b,c"),
            (r#"{"nodeName":"b"}"#.into(), "b"),
            (r#"{"nodeName":""}"#.into(), "a,b,c"),
            (r#"{"nodeSelector":{"zone":"z1"}}"#.into(), "a,c"),
            (r#"{"nodeSelector":{"zone":"z1","pool":"kai"}}"#.into(), "a"),
            (r#"{"nodeSelector":{"zone":"z9"}}"#.into(), ""),
            (expr(r#"[{"matchExpressions":[{"key":"zone","operator":"In","values":["z2","z3"]}]}]"#), "b"),
            (expr(r#"[{"matchExpressions":[{"key":"pool","operator":"NotIn","values":["kai"]}]}]"#), "c"),
            (expr(r#"[{"matchExpressions":[{"key":"pool","operator":"Exists"}]}]"#), "a,b"),
            (expr(r#"[{"matchExpressions":[{"key":"pool","operator":"DoesNotExist"}]}]"#), "c"),
            (expr(r#"[{"matchExpressions":[{"key":"gen","operator":"Gt","values":["8"]}]}]"#), "b"),
            (expr(r#"[{"matchExpressions":[{"key":"gen","operator":"Lt","values":["9"]}]}]"#), "a"),
            (expr(r#"[{"matchExpressions":[{"key":"gen","operator":"Gt","values":["x"]}]}]"#), ""),
            (expr(r#"[{"matchExpressions":[{"key":"gen","operator":"Gt","values":["1","2"]}]}]"#), ""),
            (expr(r#"[{"matchExpressions":[{"key":"gen","operator":"Bogus"}]}]"#), ""),
            // Terms are OR'ed, expressions AND'ed.
            (expr(r#"[{"matchExpressions":[{"key":"zone","operator":"In","values":["z1"]},{"key":"pool","operator":"Exists"}]},{"matchFields":[{"key":"metadata.name","operator":"In","values":["b"]}]}]"#), "a,b"),
            (expr(r#"[{"matchFields":[{"key":"metadata.name","operator":"NotIn","values":["a"]}]}]"#), "b,c"),
            (expr(r#"[{"matchFields":[{"key":"metadata.uid","operator":"In","values":["a"]}]}]"#), ""),
            // An empty term matches nothing; an empty term list matches nothing.
            (expr(r#"[{}]"#), ""),
            (expr(r#"[]"#), ""),
            // nodeSelector and affinity both apply.
            (format!(r#"{{"nodeSelector":{{"zone":"z1"}},{}"#, &expr(r#"[{"matchExpressions":[{"key":"pool","operator":"Exists"}]}]"#)[1..]), "a"),
            // Preferred-only affinity does not narrow.
            (r#"{"affinity":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[]}}}"#.into(), "a,b,c"),
            (r#"{"affinity":{"podAntiAffinity":{}}}"#.into(), "a,b,c"),
            // Unreadable affinity matches nothing rather than everything.
            (r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":"x"}}}}"#.into(), ""),
        ];
        for (spec, expected) in cases {
            assert_eq!(names(&placement(&spec)), expected, "{spec}");
        }
    }

    fn affinity_of(terms: &str) -> String {
        format!(
            r#"{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":{terms}}}}}}}}}"#
        )
    }

    fn within(spec: &str, limits: &AffinityLimits) -> Result<Placement, String> {
        let json = format!(r#"{{"spec":{spec}}}"#);
        let pod: Pod<'_> = serde_json::from_str(&json).unwrap();
        Placement::of_pod_within(&pod, limits).map_err(|e| e.to_string())
    }

    const LIMITS: AffinityLimits = AffinityLimits {
        terms: 3,
        expressions: 4,
        values: 5,
    };

    #[test]
    fn affinity_over_a_limit_is_named() {
        let values = |n: usize| {
            let v: Vec<String> = (0..n).map(|i| format!("\"v{i}\"")).collect();
            format!("[{}]", v.join(","))
        };
        let expr = |n: usize| format!(r#"{{"key":"k","operator":"NotIn","values":{}}}"#, values(n));
        let cases: Vec<(String, &str)> = vec![
            (
                affinity_of(&format!(
                    r#"[{{"matchExpressions":[{}]}},{{"matchFields":[{},{}]}}]"#,
                    expr(1),
                    expr(2),
                    expr(6)
                )),
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1].matchFields[1].values has 6 values; at most 5 are accepted (setting kai.maxAffinityValues)",
            ),
            (
                affinity_of("[{},{},{},{}]"),
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms has 4 terms; at most 3 are accepted (setting kai.maxAffinityTerms)",
            ),
            (
                affinity_of(&format!(
                    r#"[{{"matchExpressions":[{0},{0},{0}]}},{{"matchFields":[{0},{0}]}}]"#,
                    expr(0)
                )),
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms has 5 matchExpressions and matchFields in all; at most 4 are accepted (setting kai.maxAffinityExpressions)",
            ),
            (
                affinity_of(&format!(
                    r#"[{{"matchExpressions":[{}]}},{{"matchExpressions":[{}]}}]"#,
                    expr(3),
                    expr(3)
                )),
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms has 6 values in all; at most 5 are accepted (setting kai.maxAffinityValues)",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(within(&spec, &LIMITS), Err(message.to_owned()), "{spec}");
        }
    }

    #[test]
    fn affinity_within_the_limits_reads_as_before() {
        let specs = [
            "{}".to_owned(),
            r#"{"nodeSelector":{"zone":"z1"}}"#.to_owned(),
            affinity_of(r#"[{"matchExpressions":[{"key":"zone","operator":"In","values":["z1","z2","z3","z4","z5"]}]},{},{"matchFields":[{"key":"metadata.name","operator":"NotIn","values":[]}]}]"#),
            // Counting accepts what reading refuses (a value that is not a string): the affinity
            // is read, and matches no node, as before.
            affinity_of(r#"[{"matchExpressions":[{"key":"zone","operator":"In","values":[1]}]}]"#),
            // Neither counts nor reads: matches nothing.
            affinity_of(r#""x""#),
            r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":null}}}"#.to_owned(),
            r#"{"affinity":{"podAffinity":{"x":[1,2,3,4,5,6,7]}}}"#.to_owned(),
        ];
        for spec in specs {
            assert_eq!(within(&spec, &LIMITS), Ok(placement(&spec)), "{spec}");
        }
        assert_eq!(
            names(&placement(&affinity_of(
                r#"[{"matchExpressions":[{"key":"zone","operator":"In","values":[1]}]}]"#
            ))),
            ""
        );
    }

    #[test]
    fn unconstrained_only_without_constraints() {
        assert!(placement("{}").is_unconstrained());
        assert!(!placement(r#"{"nodeSelector":{"a":"b"}}"#).is_unconstrained());
    }
}

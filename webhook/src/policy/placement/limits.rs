//! The bounds on a pod's required node affinity (`kai.maxAffinity*`), counted before it is read:
//! the affinity is tenant input, and its size sets what a lookup in the node index costs.

use serde::Deserialize;

use super::Placement;
use crate::wire::pod::Pod;

/// The field path of the required node-affinity terms, for messages.
pub const TERMS_FIELD: &str =
    "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";

/// The most required node affinity a pod whose placement is evaluated may carry (the
/// `kai.maxAffinity*` settings). They bound the cost of one review: every value is looked up once
/// and every term and expression costs a pass over the node index (see the index's complexity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffinityLimits {
    /// `nodeSelectorTerms` entries.
    pub terms: usize,
    /// `matchExpressions` and `matchFields` entries over all terms.
    pub expressions: usize,
    /// `values` entries, in one expression and over all of them.
    pub values: usize,
}

/// A required node affinity over one of [`AffinityLimits`]: the field, how many it has, the limit
/// and the setting that raises it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} has {count} {what}; at most {limit} are accepted (setting {setting})")]
pub struct AffinityTooLarge {
    /// The field path (`spec.affinity…matchExpressions[0].values`).
    pub field: String,
    /// How many entries it has.
    pub count: usize,
    /// What was counted (`values`, `terms`, …).
    pub what: &'static str,
    /// The limit.
    pub limit: usize,
    /// The setting holding the limit.
    pub setting: &'static str,
}

impl Placement {
    /// [`Self::of_pod`], refusing a required node affinity over `limits`. The affinity is counted
    /// first, without keeping any of it (memory and time linear in its size, whatever it holds),
    /// and read only when within the limits.
    ///
    /// # Errors
    /// [`AffinityTooLarge`] naming the first limit exceeded: one expression's values, then the
    /// terms, the expressions and the values over all terms.
    pub fn of_pod_within(pod: &Pod<'_>, limits: &AffinityLimits) -> Result<Self, AffinityTooLarge> {
        if let Some(raw) = pod.spec.affinity
            && let Some(counts) = count_required_terms(raw.get())
        {
            counts.check(limits)?;
        }
        Ok(Self::of_pod(pod))
    }
}

/// What a required node affinity holds, counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    terms: usize,
    expressions: usize,
    values: usize,
    /// The expression with the most values: (term, `matchExpressions` or `matchFields`, index,
    /// values).
    largest: Option<(usize, &'static str, usize, usize)>,
}

impl Counts {
    fn check(&self, limits: &AffinityLimits) -> Result<(), AffinityTooLarge> {
        let over = |field: String, count: usize, what, limit, setting| {
            Err(AffinityTooLarge {
                field,
                count,
                what,
                limit,
                setting,
            })
        };
        if let Some((term, list, index, count)) = self.largest
            && count > limits.values
        {
            return over(
                format!("{TERMS_FIELD}[{term}].{list}[{index}].values"),
                count,
                "values",
                limits.values,
                "kai.maxAffinityValues",
            );
        }
        if self.terms > limits.terms {
            return over(
                TERMS_FIELD.to_owned(),
                self.terms,
                "terms",
                limits.terms,
                "kai.maxAffinityTerms",
            );
        }
        if self.expressions > limits.expressions {
            return over(
                TERMS_FIELD.to_owned(),
                self.expressions,
                "matchExpressions and matchFields in all",
                limits.expressions,
                "kai.maxAffinityExpressions",
            );
        }
        if self.values > limits.values {
            return over(
                TERMS_FIELD.to_owned(),
                self.values,
                "values in all",
                limits.values,
                "kai.maxAffinityValues",
            );
        }
        Ok(())
    }
}

/// Count the required node-affinity terms of an `affinity` object; `None` when it has none or
/// does not parse. The counting types accept every shape the reading types do (values of any
/// type, unknown fields), so an affinity that is read has been counted; one that does not count
/// is not read either (it matches no node, as `parse_required_terms` says).
fn count_required_terms(affinity_json: &str) -> Option<Counts> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Affinity {
        #[serde(default)]
        node_affinity: Option<NodeAffinity>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeAffinity {
        #[serde(default)]
        required_during_scheduling_ignored_during_execution: Option<NodeSelector>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeSelector {
        #[serde(default)]
        node_selector_terms: TermsCount,
    }
    let affinity: Affinity = serde_json::from_str(affinity_json).ok()?;
    Some(
        affinity
            .node_affinity?
            .required_during_scheduling_ignored_during_execution?
            .node_selector_terms
            .0,
    )
}

/// A `nodeSelectorTerms` list, counted as it streams by.
#[derive(Default)]
struct TermsCount(Counts);

/// One term, counted.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TermCount {
    #[serde(default)]
    match_expressions: Option<ExprsCount>,
    #[serde(default)]
    match_fields: Option<ExprsCount>,
}

/// A `matchExpressions` or `matchFields` list: its length, its values, and its largest entry
/// (index, values).
#[derive(Default)]
struct ExprsCount {
    len: usize,
    values: usize,
    largest: Option<(usize, usize)>,
}

/// One expression; only its values are counted.
#[derive(Deserialize)]
struct ExprCount {
    #[serde(default)]
    values: Option<ValuesCount>,
}

/// A `values` list's length.
struct ValuesCount(usize);

impl<'de> Deserialize<'de> for TermsCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TermsCount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of node selector terms")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<TermsCount, A::Error> {
                let mut c = Counts::default();
                while let Some(term) = seq.next_element::<TermCount>()? {
                    let at = c.terms;
                    c.terms += 1;
                    for (list, exprs) in [
                        ("matchExpressions", term.match_expressions),
                        ("matchFields", term.match_fields),
                    ] {
                        let Some(exprs) = exprs else { continue };
                        c.expressions = c.expressions.saturating_add(exprs.len);
                        c.values = c.values.saturating_add(exprs.values);
                        if let Some((index, n)) = exprs.largest
                            && c.largest.is_none_or(|(.., most)| n > most)
                        {
                            c.largest = Some((at, list, index, n));
                        }
                    }
                }
                Ok(TermsCount(c))
            }
        }
        d.deserialize_seq(V)
    }
}

impl<'de> Deserialize<'de> for ExprsCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ExprsCount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of node selector requirements")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ExprsCount, A::Error> {
                let mut c = ExprsCount::default();
                while let Some(expr) = seq.next_element::<ExprCount>()? {
                    let n = expr.values.map_or(0, |v| v.0);
                    if c.largest.is_none_or(|(_, most)| n > most) {
                        c.largest = Some((c.len, n));
                    }
                    c.len += 1;
                    c.values = c.values.saturating_add(n);
                }
                Ok(c)
            }
        }
        d.deserialize_seq(V)
    }
}

impl<'de> Deserialize<'de> for ValuesCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ValuesCount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of values")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ValuesCount, A::Error> {
                let mut n = 0usize;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(ValuesCount(n))
            }
        }
        d.deserialize_seq(V)
    }
}

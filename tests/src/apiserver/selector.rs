//! Label and field selectors with the grammar and matching rules of `k8s.io/apimachinery`
//! (`labels.Parse`, `fields.ParseSelector`): `!=` and `notin` match objects without the key.

use serde_json::Value;

use super::resources::ResourceType;
use super::status::ApiError;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    /// `key` — the label is present.
    Exists(String),
    /// `!key` — the label is absent.
    DoesNotExist(String),
    /// `key=v` or `key==v`.
    Equals(String, String),
    /// `key!=v` (also true when the label is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the label is absent).
    NotIn(String, Vec<String>),
    /// `key>n` (integer comparison).
    GreaterThan(String, i64),
    /// `key<n` (integer comparison).
    LessThan(String, i64),
}

fn valid_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn valid_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn valid_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => valid_dns_subdomain(prefix) && valid_name_part(name),
        None => valid_name_part(key),
    }
}

fn valid_value(v: &str) -> bool {
    v.is_empty() || valid_name_part(v)
}

fn parse_error(text: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {text:?}: {why}"))
}

fn checked_key(key: &str, text: &str) -> Result<String, ApiError> {
    if valid_key(key) {
        Ok(key.to_string())
    } else {
        Err(parse_error(
            text,
            &format!(
                "invalid label key {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            ),
        ))
    }
}

fn checked_value(v: &str, text: &str) -> Result<String, ApiError> {
    if valid_value(v) {
        Ok(v.to_string())
    } else {
        Err(parse_error(text, &format!("invalid label value: {v:?}")))
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Parses a `labelSelector` query value.
pub fn parse_label_selector(s: &str) -> Result<Vec<LabelRequirement>, ApiError> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for raw in split_top_level(s) {
        let text = raw.trim();
        if text.is_empty() {
            return Err(parse_error(
                s,
                "found ',', expected: !, identifier, or 'end of string'",
            ));
        }
        out.push(parse_requirement(text)?);
    }
    Ok(out)
}

fn parse_set(text: &str, inner: &str) -> Result<Vec<String>, ApiError> {
    let mut values = Vec::new();
    for v in inner.split(',') {
        values.push(checked_value(v.trim(), text)?);
    }
    values.sort();
    values.dedup();
    Ok(values)
}

fn parse_requirement(text: &str) -> Result<LabelRequirement, ApiError> {
    if let Some(rest) = text.strip_prefix('!') {
        return Ok(LabelRequirement::DoesNotExist(checked_key(
            rest.trim(),
            text,
        )?));
    }
    if let Some(open) = text.find('(') {
        let Some(inner) = text[open + 1..].strip_suffix(')') else {
            return Err(parse_error(text, "found end of string, expected: ')'"));
        };
        let prefix = text[..open].trim_end();
        let (key, negate) = if let Some(k) = prefix.strip_suffix("notin") {
            (k, true)
        } else if let Some(k) = prefix.strip_suffix("in") {
            (k, false)
        } else {
            return Err(parse_error(text, "expected: in, notin"));
        };
        if !key.ends_with(char::is_whitespace) {
            return Err(parse_error(text, "expected: in, notin"));
        }
        let key = checked_key(key.trim(), text)?;
        let values = parse_set(text, inner)?;
        return Ok(if negate {
            LabelRequirement::NotIn(key, values)
        } else {
            LabelRequirement::In(key, values)
        });
    }
    for (op, ctor) in [("!=", 0u8), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
        if let Some((k, v)) = text.split_once(op) {
            let key = checked_key(k.trim(), text)?;
            let v = v.trim();
            return match ctor {
                0 => Ok(LabelRequirement::NotEquals(key, checked_value(v, text)?)),
                1 => Ok(LabelRequirement::Equals(key, checked_value(v, text)?)),
                _ => {
                    let n: i64 = v.parse().map_err(|_| {
                        parse_error(
                            text,
                            &format!(
                                "for 'Gt', 'Lt' operators, the value must be an integer, got {v:?}"
                            ),
                        )
                    })?;
                    Ok(if ctor == 2 {
                        LabelRequirement::GreaterThan(key, n)
                    } else {
                        LabelRequirement::LessThan(key, n)
                    })
                }
            };
        }
    }
    Ok(LabelRequirement::Exists(checked_key(text, text)?))
}

impl LabelRequirement {
    /// Whether the labels (`metadata.labels`, possibly absent) satisfy this requirement.
    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        match self {
            Self::Exists(k) => get(k).is_some(),
            Self::DoesNotExist(k) => get(k).is_none(),
            Self::Equals(k, v) => get(k) == Some(v.as_str()),
            Self::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Self::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Self::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Self::GreaterThan(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Self::LessThan(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        }
    }
}

/// One field requirement: `field=value`, `field==value` or `field!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// Path in the object JSON.
    path: Vec<&'static str>,
    /// Value when the field is absent (`false` for booleans).
    absent: &'static str,
    value: String,
    negate: bool,
}

/// Parses a `fieldSelector` query value against the fields the resource supports.
pub fn parse_field_selector(rt: &ResourceType, s: &str) -> Result<Vec<FieldRequirement>, ApiError> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for raw in s.split(',') {
        let text = raw.trim();
        let (field, value, negate) = if let Some((f, v)) = text.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = text.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = text.split_once('=') {
            (f, v, false)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{s}'; can't understand '{text}'"
            )));
        };
        let field = field.trim();
        let (path, absent): (Vec<&'static str>, &'static str) = match field {
            "metadata.name" => (vec!["metadata", "name"], ""),
            "metadata.namespace" => (vec!["metadata", "namespace"], ""),
            _ => match rt.field_selectors.iter().find(|(k, _, _)| *k == field) {
                Some((_, path, absent)) => (path.to_vec(), absent),
                None => {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {field}"
                    )));
                }
            },
        };
        out.push(FieldRequirement {
            path,
            absent,
            value: value.trim().to_string(),
            negate,
        });
    }
    Ok(out)
}

impl FieldRequirement {
    /// Whether the object satisfies this requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let mut cur = Some(obj);
        for p in &self.path {
            cur = cur.and_then(|v| v.get(*p));
        }
        let actual = match cur {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => self.absent.to_string(),
        };
        (actual == self.value) != self.negate
    }
}

/// What a list or watch selects: namespace, labels and fields.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only objects in this namespace (namespaced requests).
    pub namespace: Option<String>,
    /// Label requirements (all must hold).
    pub labels: Vec<LabelRequirement>,
    /// Field requirements (all must hold).
    pub fields: Vec<FieldRequirement>,
}

impl Filter {
    /// Whether the filter selects nothing beyond the namespace.
    pub fn selects_all(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether the object passes the filter.
    pub fn matches(&self, obj: &Value) -> bool {
        let meta = obj.get("metadata");
        if let Some(ns) = &self.namespace
            && meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                != Some(ns.as_str())
        {
            return false;
        }
        let labels = meta
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        self.labels.iter().all(|r| r.matches(labels)) && self.fields.iter().all(|f| f.matches(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(s: &str, labels: Value) -> bool {
        let reqs = parse_label_selector(s).unwrap();
        let l = labels.as_object().cloned();
        reqs.iter().all(|r| r.matches(l.as_ref()))
    }

    #[test]
    fn label_grammar_and_semantics() {
        let l = json!({"app": "web", "tier": "gpu", "nvidia.com/gpu.count": "4"});
        assert!(sel("app=web", l.clone()));
        assert!(sel("app==web,tier=gpu", l.clone()));
        assert!(!sel("app!=web", l.clone()));
        assert!(sel("missing!=x", l.clone()));
        assert!(sel("tier in (cpu, gpu)", l.clone()));
        assert!(!sel("tier notin (cpu,gpu)", l.clone()));
        assert!(sel("missing notin (a)", l.clone()));
        assert!(sel("app,!missing", l.clone()));
        assert!(sel(
            "nvidia.com/gpu.count>2,nvidia.com/gpu.count<8",
            l.clone()
        ));
        assert!(!sel("!app", l));
    }

    #[test]
    fn label_errors() {
        assert_eq!(parse_label_selector("a in (b").unwrap_err().code, 400);
        assert_eq!(parse_label_selector("-bad=x").unwrap_err().code, 400);
        assert_eq!(parse_label_selector("a=b,,c").unwrap_err().code, 400);
        assert_eq!(parse_label_selector("a>x").unwrap_err().code, 400);
    }
}

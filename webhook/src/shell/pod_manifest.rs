//! A Pod manifest as people write it (YAML or JSON, `kubectl get pod -o yaml`), read for
//! `hami-webhook mutate` through the same decoder `review` runs on `request.object`.
//!
//! YAML is read once into a generic value and written out as the JSON the API server would send
//! in an AdmissionReview; that JSON is then decoded into the admission view of the Pod exactly as
//! a review's `request.object` is. A second, YAML-specific decoder would disagree with the server
//! on some valid pods (the view keeps `affinity`, `hostPath` and `downwardAPI` as raw JSON, which
//! only a JSON decoder can fill). The user's YAML is read again only to point an error at the
//! user's line and column.

use std::fmt;

use hami_shared::manifest::MAX_FLOW_DEPTH;
use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_path_to_error::Segment;

use crate::wire::pod::Pod;

/// The largest manifest read: the server's default body limit, well above the API server's
/// 3 MiB request limit, so that no valid pod is refused for its size.
pub const MAX_MANIFEST_BYTES: usize = 8 << 20;

/// Why an input is not one Pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Over [`MAX_MANIFEST_BYTES`].
    #[error(
        "the input is {size} bytes, over the {MAX_MANIFEST_BYTES}-byte limit (the API server refuses requests over 3 MiB): not a Pod"
    )]
    TooLarge { size: usize },
    /// Flow collections (`[`, `{`) nested deeper than [`MAX_FLOW_DEPTH`].
    #[error("the input nests [ or {{ {depth} levels deep (at most {MAX_FLOW_DEPTH}): not a Pod")]
    TooDeep { depth: usize },
    /// No document, or only empty ones.
    #[error("the input is empty: expected one Pod, YAML or JSON (kubectl get pod NAME -o yaml)")]
    Empty,
    /// Not YAML (nor JSON), or YAML that no JSON object can hold (a duplicate key, a key that is a
    /// list, an alias expanding past the limit).
    #[error("the input is not YAML or JSON: {0}")]
    Syntax(String),
    /// More than one non-empty YAML document.
    #[error(
        "the input holds {count} YAML documents ({kinds}); mutate reads one Pod: pass one document (kubectl get pod NAME -o yaml)"
    )]
    Documents { count: usize, kinds: String },
    /// A `List` / `PodList`.
    #[error(
        "the input is a {kind} of {items} item(s), not a Pod; mutate reads one Pod: pass one item (kubectl get pod NAME -o yaml)"
    )]
    List { kind: String, items: usize },
    /// Another kind, no kind, or not an object at all.
    #[error("the input is {found}, not a Pod (kind: Pod)")]
    NotAPod { found: String },
    /// `kind: Pod` of an `apiVersion` other than `v1`.
    #[error("the input has apiVersion {0:?}; a Pod is apiVersion: v1")]
    ApiVersion(String),
    /// A Pod whose fields have the wrong shape: the path, the problem and, where the field is in
    /// the user's text, its line and column.
    #[error("not a valid Pod: {0}")]
    Invalid(String),
}

/// One Pod read from a manifest: the object the patch applies to, and its JSON text.
#[derive(Debug, Clone)]
pub struct PodManifest {
    /// The Pod as a JSON value, quantities as strings (as the API server holds them).
    pub object: Value,
    /// `object` as JSON text: what `review` finds as `request.object`.
    pub json: Vec<u8>,
    /// Which YAML document of the input the Pod is (empty documents come before it).
    document: usize,
}

/// Read `input` (YAML or JSON; JSON is YAML) as one Pod.
///
/// # Errors
/// [`ManifestError`] naming what was found where one Pod was expected.
pub fn read(input: &[u8]) -> Result<PodManifest, ManifestError> {
    if input.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge { size: input.len() });
    }
    let depth = hami_shared::manifest::flow_depth(input);
    if depth > MAX_FLOW_DEPTH {
        return Err(ManifestError::TooDeep { depth });
    }
    let mut documents = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_slice(input).enumerate() {
        // Duplicate keys are refused here (as kubectl's strict decoding does), aliases are bounded
        // by the parser's repetition limit and nesting by its recursion limit.
        let value = serde_yaml_ng::Value::deserialize(document)
            .map_err(|e| ManifestError::Syntax(e.to_string()))?;
        // `---` at the end, or between documents, leaves an empty one: kubectl skips it.
        if !value.is_null() {
            documents.push((index, value));
        }
    }
    let (document, mut yaml) = match documents.len() {
        0 => return Err(ManifestError::Empty),
        1 => documents.swap_remove(0),
        count => {
            let kinds = documents
                .iter()
                .map(
                    |(_, d)| match d.get("kind").and_then(serde_yaml_ng::Value::as_str) {
                        Some(kind) => kind.to_owned(),
                        None => "no kind".to_owned(),
                    },
                )
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ManifestError::Documents { count, kinds });
        }
    };
    // `<<: *anchor` merge keys, as Kubernetes' YAML reader applies them.
    yaml.apply_merge()
        .map_err(|e| ManifestError::Syntax(e.to_string()))?;
    let mut object =
        serde_json::to_value(&yaml).map_err(|e| ManifestError::Syntax(e.to_string()))?;
    check_kind(&object)?;
    // `nvidia.com/gpu: 1` is an integer in YAML; kubectl and the API server accept it and the
    // server stores the string, which is what a review carries.
    quantities_as_strings(&mut object);
    let json = serde_json::to_vec(&object).map_err(|e| ManifestError::Syntax(e.to_string()))?;
    Ok(PodManifest {
        object,
        json,
        document,
    })
}

/// `kind: Pod`, `apiVersion: v1` (or none), or what was found instead.
fn check_kind(object: &Value) -> Result<(), ManifestError> {
    let Value::Object(map) = object else {
        let found = match object {
            Value::Array(_) => "a list",
            Value::String(_) => "a string",
            Value::Number(_) => "a number",
            Value::Bool(_) => "a boolean",
            Value::Null | Value::Object(_) => "null",
        };
        return Err(ManifestError::NotAPod {
            found: found.to_owned(),
        });
    };
    match map.get("kind") {
        Some(Value::String(kind)) if kind == "Pod" => {}
        Some(Value::String(kind)) if kind.ends_with("List") => {
            return Err(ManifestError::List {
                kind: kind.clone(),
                items: map
                    .get("items")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len),
            });
        }
        Some(Value::String(kind)) => {
            return Err(ManifestError::NotAPod {
                found: format!("kind {kind:?}"),
            });
        }
        Some(other) => {
            return Err(ManifestError::NotAPod {
                found: format!("kind {other} (not a string)"),
            });
        }
        None => {
            return Err(ManifestError::NotAPod {
                found: "an object with no kind".to_owned(),
            });
        }
    }
    match map.get("apiVersion") {
        None => Ok(()),
        Some(Value::String(v)) if v == "v1" => Ok(()),
        Some(Value::String(v)) => Err(ManifestError::ApiVersion(v.clone())),
        Some(other) => Err(ManifestError::ApiVersion(other.to_string())),
    }
}

impl PodManifest {
    /// The admission view of the Pod, decoded from [`Self::json`] by the decoder `review` runs on
    /// `request.object`. `input` is the text [`read`] read, for errors to point into.
    ///
    /// # Errors
    /// [`ManifestError::Invalid`]: the field's path, the problem and, where the field is in the
    /// user's text, its line and column there.
    pub fn pod(&self, input: &[u8]) -> Result<Pod<'_>, ManifestError> {
        serde_json::from_slice(&self.json).map_err(|_| ManifestError::Invalid(self.locate(input)))
    }

    /// Decode again, tracking the path, and find the field in the user's YAML.
    fn locate(&self, input: &[u8]) -> String {
        let mut json = serde_json::Deserializer::from_slice(&self.json);
        let Err(e) = serde_path_to_error::deserialize::<_, Pod<'_>>(&mut json) else {
            return "the pod could not be read".to_owned();
        };
        let inner = e.inner();
        let full = inner.to_string();
        // Where in the internal JSON is of no use to the user: their own line comes from the YAML.
        let message = full
            .strip_suffix(&format!(
                " at line {} column {}",
                inner.line(),
                inner.column()
            ))
            .unwrap_or(&full);
        let segments: Vec<&Segment> = e.path().iter().collect();
        let located = serde_yaml_ng::Deserializer::from_slice(input)
            .nth(self.document)
            .and_then(|document| {
                match (Locate {
                    path: &segments,
                    message,
                })
                .deserialize(document)
                {
                    // serde_yaml_ng names the path and the node's line and column.
                    Err(found) => Some(found.to_string()),
                    Ok(()) => None,
                }
            });
        located.unwrap_or_else(|| {
            let path = e.path().to_string();
            if path == "." {
                message.to_owned()
            } else {
                format!("{path}: {message}")
            }
        })
    }
}

/// Walks a YAML document down `path` and fails there with `message`: the YAML deserializer then
/// adds the path and the node's line and column. `Ok(())` when the path is not in the document
/// (a merge key, or a field the JSON form gained).
struct Locate<'p> {
    path: &'p [&'p Segment],
    message: &'p str,
}

impl<'de> DeserializeSeed<'de> for Locate<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Locate<'_> {
    fn here<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(self.message))
        } else {
            Ok(())
        }
    }
}

/// A YAML key as the JSON form spells it.
fn key_text(key: &serde_yaml_ng::Value) -> Option<String> {
    match key {
        serde_yaml_ng::Value::String(s) => Some(s.clone()),
        serde_yaml_ng::Value::Number(n) => Some(n.to_string()),
        serde_yaml_ng::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

impl<'de> Visitor<'de> for Locate<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.here()?;
        let (wanted, rest) = match self.path.split_first() {
            Some((Segment::Map { key }, rest)) => (Some(key), rest),
            _ => (None, self.path),
        };
        while let Some(key) = map.next_key::<serde_yaml_ng::Value>()? {
            if wanted.is_some() && key_text(&key).as_ref() == wanted {
                map.next_value_seed(Locate {
                    path: rest,
                    message: self.message,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.here()?;
        let (wanted, rest) = match self.path.split_first() {
            Some((Segment::Seq { index }, rest)) => (Some(*index), rest),
            _ => (None, self.path),
        };
        let mut at = 0usize;
        loop {
            let more = if Some(at) == wanted {
                seq.next_element_seed(Locate {
                    path: rest,
                    message: self.message,
                })?
                .is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            at += 1;
        }
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use de::VariantAccess as _;
        self.here()?;
        let (IgnoredAny, variant) = data.variant::<IgnoredAny>()?;
        variant.newtype_variant::<IgnoredAny>()?;
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.here()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.here()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.here()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.here()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.here()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.here()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.here()
    }
}

/// Turn every number that stands for a resource quantity into its string form, as the API server
/// reads it: `resources.limits` / `resources.requests` of every container, init container and
/// ephemeral container (in a Pod's `spec`, or a pod template's `spec.template.spec`), and
/// `spec.overhead`. Everything else is left as it is.
///
/// kubectl accepts `nvidia.com/gpu: 1` (a YAML integer) where the API's `Quantity` is a string:
/// YAML numbers become JSON numbers, and the API server's `Quantity` unmarshaller accepts them.
/// Typed Rust clients do not, so a manifest is normalised first.
pub fn quantities_as_strings(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec") {
        pod_spec(spec);
        if let Some(template_spec) = spec.get_mut("template").and_then(|t| t.get_mut("spec")) {
            pod_spec(template_spec);
        }
    }
}

fn pod_spec(spec: &mut Value) {
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(Value::Array(containers)) = spec.get_mut(list) {
            for c in containers {
                if let Some(resources) = c.get_mut("resources") {
                    for kind in ["limits", "requests"] {
                        if let Some(map) = resources.get_mut(kind) {
                            numbers_to_strings(map);
                        }
                    }
                }
            }
        }
    }
    if let Some(overhead) = spec.get_mut("overhead") {
        numbers_to_strings(overhead);
    }
}

fn numbers_to_strings(map: &mut Value) {
    if let Value::Object(entries) = map {
        for v in entries.values_mut() {
            if let Value::Number(n) = v {
                *v = Value::String(n.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_err(text: &str) -> String {
        match read(text.as_bytes()) {
            Ok(m) => match m.pod(text.as_bytes()) {
                Ok(_) => panic!("read: {text}"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        }
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: c\n      image: busybox\n";

    #[test]
    fn yaml_and_json_give_the_same_json() {
        let yaml = read(POD.as_bytes()).unwrap();
        let json_text = serde_json::to_vec(&yaml.object).unwrap();
        let json = read(&json_text).unwrap();
        assert_eq!(yaml.json, json.json);
        assert_eq!(yaml.object, json.object);
    }

    #[test]
    fn raw_fields_are_filled_from_yaml() {
        let text = format!(
            "{POD}  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n          - matchExpressions:\n              - {{key: gpu, operator: In, values: [a100]}}\n  volumes:\n    - name: h\n      hostPath: {{path: /data}}\n    - name: d\n      downwardAPI:\n        items:\n          - path: labels\n            fieldRef: {{fieldPath: metadata.labels}}\n"
        );
        let manifest = read(text.as_bytes()).unwrap();
        let pod = manifest.pod(text.as_bytes()).unwrap();
        assert!(pod.spec.affinity.unwrap().get().contains("a100"));
        let volumes = pod.spec.volumes.unwrap();
        assert_eq!(volumes[0].host_path.unwrap().get(), r#"{"path":"/data"}"#);
        assert!(volumes[1].downward_api.unwrap().get().contains("fieldRef"));
    }

    #[test]
    fn what_is_not_one_pod_is_named() {
        assert_eq!(read_err(""), ManifestError::Empty.to_string());
        assert_eq!(
            read_err("# nothing\n---\n"),
            ManifestError::Empty.to_string()
        );
        let two = format!("{POD}---\nkind: Service\n");
        assert!(
            read_err(&two).contains("holds 2 YAML documents (Pod, Service)"),
            "{}",
            read_err(&two)
        );
        // A trailing `---` is not a second document.
        assert!(read(format!("---\n{POD}---\n").as_bytes()).is_ok());
        assert!(
            read_err("apiVersion: v1\nkind: List\nitems: [{kind: Pod}, {kind: Pod}]\n")
                .contains("is a List of 2 item(s), not a Pod")
        );
        assert!(read_err("kind: PodList\nitems: []\n").contains("is a PodList of 0 item(s)"));
        assert!(read_err("kind: Deployment\n").contains(r#"kind "Deployment", not a Pod"#));
        assert!(read_err("metadata: {}\n").contains("an object with no kind"));
        assert!(read_err("kind: 3\n").contains("kind 3 (not a string)"));
        assert!(read_err("[1, 2]\n").contains("is a list, not a Pod"));
        assert!(read_err("just text\n").contains("is a string, not a Pod"));
        assert!(read_err("kind: Pod\napiVersion: v2\n").contains(r#"apiVersion "v2""#));
        assert!(read_err("kind: Pod\nspec: [\n").contains("not YAML or JSON"));
        assert!(read_err("{\"kind\": \"Pod\", \"spec\": {]}").contains("not YAML or JSON"));
        // JSON read as YAML: an empty value is null, which `review` refuses as well.
        assert_eq!(
            read_err("{\"kind\": \"Pod\", \"spec\": }"),
            "not a valid Pod: spec: invalid type: null, expected struct PodSpec at line 1 column 25"
        );
    }

    #[test]
    fn duplicate_keys_are_refused_and_merge_keys_applied() {
        let dup = format!("{POD}metadata:\n  name: q\n");
        let err = read_err(&dup);
        assert!(
            err.contains("duplicate entry with key \"metadata\""),
            "{err}"
        );
        let merged = "kind: Pod\nmetadata:\n  labels: &l {a: b}\n  annotations:\n    <<: *l\n    c: d\nspec: {containers: [{name: c}]}\n";
        let m = read(merged.as_bytes()).unwrap();
        assert_eq!(
            m.object["metadata"]["annotations"],
            serde_json::json!({"a": "b", "c": "d"})
        );
        let pod = m.pod(merged.as_bytes()).unwrap();
        assert_eq!(pod.annotation("a"), Some("b"));
    }

    #[test]
    fn errors_name_the_path_and_the_users_line() {
        let bad = POD.replace("    - name: c\n", "    - name: c\n      env: {name: X}\n");
        let err = read_err(&bad);
        assert_eq!(
            err,
            "not a valid Pod: spec.containers[0].env: invalid type: map, expected a sequence at line 8 column 12"
        );
        // Found through an anchor: the path still names the field.
        let aliased =
            "kind: Pod\nx: &e {name: X}\nspec:\n  containers:\n    - name: c\n      env: *e\n";
        let err = read_err(aliased);
        assert!(
            err.starts_with("not a valid Pod: spec.containers[0].env: invalid type: map"),
            "{err}"
        );
    }

    #[test]
    fn hostile_inputs_are_refused_without_panicking() {
        // Billion laughs.
        let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (i, name) in ["b", "c", "d", "e", "f", "g", "h", "i"].iter().enumerate() {
            let prev = if i == 0 {
                "a".to_owned()
            } else {
                ["b", "c", "d", "e", "f", "g", "h"][i - 1].to_owned()
            };
            laughs.push_str(&format!(
                "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        laughs.push_str("kind: Pod\n");
        assert!(
            read_err(&laughs).contains("not YAML or JSON"),
            "{}",
            read_err(&laughs)
        );
        // Deep nesting, flow and block.
        let deep = format!(
            "kind: Pod\nspec: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(read_err(&deep).contains("nests [ or { 100000 levels deep (at most 256)"));
        let deep = format!("kind: Pod\nspec: {}{}\n", "[".repeat(200), "]".repeat(200));
        assert!(read_err(&deep).contains("recursion limit exceeded"));
        let mut block = String::from("kind: Pod\nspec:\n");
        for depth in 1..2_000 {
            block.push_str(&" ".repeat(depth));
            block.push_str("a:\n");
        }
        assert!(read_err(&block).contains("not YAML or JSON"));
        // Too large.
        let huge = format!(
            "kind: Pod\nmetadata:\n  name: {}\n",
            "a".repeat(MAX_MANIFEST_BYTES)
        );
        assert!(read_err(&huge).contains("over the 8388608-byte limit"));
        // Not UTF-8.
        assert!(matches!(
            read(b"kind: Pod\nmetadata: {name: \xff}\n"),
            Err(ManifestError::Syntax(_))
        ));
        // A key that is a list has no JSON form.
        assert!(
            read_err("kind: Pod\nmetadata:\n  annotations:\n    [a]: b\n")
                .contains("not YAML or JSON")
        );
    }

    #[test]
    fn integer_and_decimal_quantities_become_strings() {
        let mut pod = serde_json::json!({
            "kind": "Pod",
            "spec": {
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 0.5, "memory": "1Gi"}, "requests": {"nvidia.com/gpumem": 3000}}}],
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 2}}}],
                "overhead": {"cpu": 1},
                "nodeSelector": {"n": "1"}
            },
            "metadata": {"labels": {"x": "y"}, "generation": 3}
        });
        quantities_as_strings(&mut pod);
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"],
            serde_json::json!({"nvidia.com/gpu": "1", "cpu": "0.5", "memory": "1Gi"})
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpumem"],
            serde_json::json!("3000")
        );
        assert_eq!(
            pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            serde_json::json!("2")
        );
        assert_eq!(pod["spec"]["overhead"]["cpu"], serde_json::json!("1"));
        assert_eq!(pod["metadata"]["generation"], serde_json::json!(3));
    }
}

//! Manifests as people write them.
//!
//! kubectl accepts `nvidia.com/gpu: 1` (a YAML integer) where the API's `Quantity` is a string:
//! YAML numbers become JSON numbers, and the API server's `Quantity` unmarshaller accepts them.
//! Typed Rust clients do not, so the offline commands normalise a manifest first.

use serde_json::Value;

/// Turn every number that stands for a resource quantity into its string form, as the API server
/// reads it: `resources.limits` / `resources.requests` of every container, init container and
/// ephemeral container (in a Pod's `spec`, or a pod template's `spec.template.spec`), and
/// `spec.overhead`. Everything else is left as it is.
pub fn quantities_as_strings(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec") {
        pod_spec(spec);
        if let Some(template_spec) = spec.get_mut("template").and_then(|t| t.get_mut("spec")) {
            pod_spec(template_spec);
        }
    }
}

/// The deepest nesting of flow collections (`[`, `{`) a manifest reader accepts before parsing:
/// a real Pod is under 20 levels deep, and YAML parsers recurse past the point where they refuse.
pub const MAX_FLOW_DEPTH: usize = 256;

/// The deepest nesting of flow collections (`[`, `{`) outside quoted scalars: a cheap scan that
/// refuses pathological input before a YAML parser reads it. libyaml's flow parsing costs the
/// square of the depth (16,000 levels, 32 KB, take a second unoptimised) even where serde then
/// stops at its recursion limit. A quote opens a scalar only where a token starts, as in YAML: the
/// apostrophe in a plain scalar (`it's`) does not hide the brackets after it.
#[must_use]
pub fn flow_depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut quote) = (0usize, 0usize, None::<u8>);
    let (mut escaped, mut token_start) = (false, true);
    for &b in text {
        // `''` inside a single-quoted scalar is one quote: the second one reopens it.
        let mut closed_single = false;
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if b == b'\\' && q == b'"' {
                    escaped = true;
                } else if b == q {
                    quote = None;
                    closed_single = q == b'\'';
                }
            }
            None => match b {
                b'"' | b'\'' if token_start => quote = Some(b),
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        token_start = closed_single
            || (quote.is_none()
                && matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b',' | b'[' | b'{' | b':'));
    }
    max
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
    use serde_json::json;

    #[test]
    fn flow_depth_counts_brackets_outside_quoted_scalars() {
        assert_eq!(flow_depth(b"a: [[1], {b: [2]}]\n"), 3);
        assert_eq!(flow_depth(b"a: \"[[[\\\"[\"\nb: '[[['\n"), 0);
        assert_eq!(flow_depth(b"{\"a\":\"[\",\"b\":[[]]}"), 3);
        // An apostrophe inside a plain scalar opens nothing.
        assert_eq!(flow_depth(b"a: it's [[[x]]]\n"), 3);
        assert_eq!(flow_depth(b"a: 'it''s [' \nb: [[x]]\n"), 2);
        assert_eq!(flow_depth("[".repeat(300).as_bytes()), 300);
    }

    #[test]
    fn integer_and_decimal_quantities_become_strings() {
        let mut pod = json!({
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
            json!({"nvidia.com/gpu": "1", "cpu": "0.5", "memory": "1Gi"})
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpumem"],
            json!("3000")
        );
        assert_eq!(
            pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            json!("2")
        );
        assert_eq!(pod["spec"]["overhead"]["cpu"], json!("1"));
        assert_eq!(pod["metadata"]["generation"], json!(3));
    }
}

//! A configuration file's text as a JSON value: JSON when the file is named `.json` or its text
//! starts with `{` (unless it is named `.yaml`), YAML otherwise. The top level must be a map; an
//! empty file (or one of comments only) is an empty map.
//!
//! YAML is read as HAMi's files are written: scalar keys (`1:`, `true:`) become text, anchors and
//! aliases resolve, a key given twice in one map is an error, and a number JSON cannot hold
//! (`.inf`, `.nan`) is `null`.

use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value as Json};

use super::{ConfigLoadError, FileText};

/// The file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
}

fn detect_format(path: &Path, text: &str) -> Format {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext.eq_ignore_ascii_case("json")
        || (!ext.eq_ignore_ascii_case("yaml") && text.trim_start().starts_with('{'))
    {
        Format::Json
    } else {
        Format::Yaml
    }
}

/// The file as a JSON map.
pub(crate) fn file_layer(file: FileText<'_>) -> crate::Result<Json> {
    let FileText { path, text } = file;
    let parse_err = |message: String| ConfigLoadError::Parse {
        path: path.to_path_buf(),
        message,
    };
    if text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#')
    }) {
        // Empty, or comments only (an empty ConfigMap key): nothing set.
        return Ok(Json::Object(Map::new()));
    }
    let value = match detect_format(path, text) {
        Format::Json => serde_json::from_str::<Json>(text).map_err(|e| parse_err(e.to_string()))?,
        Format::Yaml => match yaml_document(text).map_err(|e| parse_err(e.to_string()))? {
            None => return Ok(Json::Object(Map::new())),
            Some(value) => value,
        },
    };
    match value {
        Json::Object(_) => Ok(value),
        other => Err(parse_err(format!(
            "invalid type: {}, expected a map",
            Unexpected(&other)
        ))),
    }
}

/// Why a text is not one YAML document.
#[derive(Debug, thiserror::Error)]
enum YamlDocumentError {
    /// Not YAML, or not convertible to JSON.
    #[error("{0}")]
    Syntax(serde_yaml_ng::Error),
    /// More than one document.
    #[error("Got {0} YAML documents, expected 1")]
    Several(usize),
}

/// The one YAML document of `text`, `None` when it has none.
fn yaml_document(text: &str) -> Result<Option<Json>, YamlDocumentError> {
    let mut documents = serde_yaml_ng::Deserializer::from_str(text);
    let Some(first) = documents.next() else {
        return Ok(None);
    };
    let value = YamlToJson
        .deserialize(first)
        .map_err(YamlDocumentError::Syntax)?;
    let more = documents.count();
    if more > 0 {
        return Err(YamlDocumentError::Several(more + 1));
    }
    Ok(Some(value))
}

/// A value as the `config` crate named it in "invalid type" messages.
struct Unexpected<'a>(&'a Json);

impl fmt::Display for Unexpected<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Json::Null => f.write_str("unit value"),
            Json::Bool(b) => write!(f, "boolean `{b}`"),
            Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => write!(f, "64-bit integer `{i}`"),
                (None, Some(u), _) => write!(f, "64-bit unsigned integer `{u}`"),
                (None, None, v) => write!(f, "floating point `{}`", v.unwrap_or(f64::NAN)),
            },
            Json::String(s) => write!(f, "string {s:?}"),
            Json::Array(_) => f.write_str("sequence"),
            Json::Object(_) => f.write_str("map"),
        }
    }
}

/// Any YAML value as JSON.
struct YamlToJson;

impl<'de> DeserializeSeed<'de> for YamlToJson {
    type Value = Json;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for YamlToJson {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
        Ok(Json::Number(i.into()))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
        Ok(Json::Number(u.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Number::from_f64(v).map_or(Json::Null, Json::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(YamlToJson)? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(ScalarKey)? {
            let value = map.next_value_seed(YamlToJson)?;
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "{key:?}: duplicated key in mapping"
                )));
            }
            out.insert(key, value);
        }
        Ok(Json::Object(out))
    }

    /// A value with a tag that is not YAML's own (`!thing value`): the value.
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Json, A::Error> {
        let (_tag, value) = data.variant::<de::IgnoredAny>()?;
        de::VariantAccess::newtype_variant_seed(value, YamlToJson)
    }
}

/// A map key: text, or a number or boolean written as text.
struct ScalarKey;

impl<'de> DeserializeSeed<'de> for ScalarKey {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for ScalarKey {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a text, number or boolean map key")
    }

    fn visit_bool<E>(self, b: bool) -> Result<String, E> {
        Ok(b.to_string())
    }

    fn visit_i64<E>(self, i: i64) -> Result<String, E> {
        Ok(i.to_string())
    }

    fn visit_u64<E>(self, u: u64) -> Result<String, E> {
        Ok(u.to_string())
    }

    fn visit_f64<E>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_str<E>(self, s: &str) -> Result<String, E> {
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, text: &str) -> Result<Json, String> {
        file_layer(FileText {
            path: Path::new(name),
            text,
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn yaml_and_json_to_one_value() {
        let want = serde_json::json!({"nvidia": {"deviceSplitCount": 3, "scaling": 1.5, "on": true, "name": "x", "unset": null}});
        let yaml =
            "nvidia:\n  deviceSplitCount: 3\n  scaling: 1.5\n  on: true\n  name: x\n  unset:\n";
        assert_eq!(parse("d.yaml", yaml).unwrap(), want);
        let json = r#"{"nvidia": {"deviceSplitCount": 3, "scaling": 1.5, "on": true, "name": "x", "unset": null}}"#;
        assert_eq!(parse("d.json", json).unwrap(), want);
        assert_eq!(
            parse("d", json).unwrap(),
            want,
            "text starting with {{ is JSON"
        );
        assert_eq!(parse("d.yaml", json).unwrap(), want, "YAML holds JSON");
        for empty in ["", "  \n", "# comments only\n"] {
            assert_eq!(parse("d.yaml", empty).unwrap(), serde_json::json!({}));
        }
    }

    #[test]
    fn yaml_as_hamis_files_are_written() {
        let v = parse(
            "d.yaml",
            "1: a\ntrue: b\nbase: &b {n: 3}\nref: *b\nbig: .inf\n",
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"1": "a", "true": "b", "base": {"n": 3}, "ref": {"n": 3}, "big": null})
        );
        let twice = parse("d.yaml", "nvidia:\n  x: 1\n  x: 2\n").unwrap_err();
        assert!(
            twice.contains("\"x\": duplicated key in mapping"),
            "{twice}"
        );
    }

    #[test]
    fn not_a_map_or_not_parsable_names_the_file() {
        for (name, text, want) in [
            (
                "d.yaml",
                "5",
                "invalid type: 64-bit integer `5`, expected a map",
            ),
            ("d.yaml", "- a\n", "invalid type: sequence, expected a map"),
            ("d.yaml", "~", "invalid type: unit value, expected a map"),
            ("d.json", "[1]", "invalid type: sequence, expected a map"),
            (
                "d.yaml",
                "a: 1\n---\nb: 2\n",
                "Got 2 YAML documents, expected 1",
            ),
        ] {
            let err = parse(name, text).unwrap_err();
            assert_eq!(
                err,
                format!("cannot parse configuration file {name}: {want}")
            );
        }
        assert!(
            parse("d.json", "{\"a\": ")
                .unwrap_err()
                .starts_with("cannot parse configuration file d.json: EOF while parsing")
        );
        assert!(
            parse("d.yaml", "a: [\n")
                .unwrap_err()
                .starts_with("cannot parse configuration file d.yaml: ")
        );
    }
}

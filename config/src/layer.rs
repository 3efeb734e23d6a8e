//! The layering engine: built-in defaults < a file < `<PREFIX>_*` environment variables, merged as
//! JSON values and deserialized once (`de.rs`). The layers are kept apart so that an error
//! names the layer a bad value came from: the file, or the variable.
//!
//! Pure: the file arrives as text ([`FileText`]) and the environment as name/value pairs; the
//! programs read both at their composition root.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value as Json};

use super::de::{self, DeError, DeErrorKind, Seg, render_key_path};
use super::file::file_layer;
use super::{ConfigLoadError, FileText};
use hami_shared::names;

/// Load `T` from `file` and the environment `env` (`<env_prefix>_KEY__SUBKEY`). Defaults come
/// from `T`'s `#[serde(default)]`. Environment keys arrive lowercased and are matched (ignoring
/// case, `_` and `-`) against the keys the file holds; to reach camelCase keys the file does not
/// hold, use [`load_layered_with_schema`], whose defaults list every key.
pub fn load_layered_from_env<T, I>(
    file: Option<FileText<'_>>,
    env_prefix: &str,
    env: I,
) -> crate::Result<T>
where
    T: DeserializeOwned,
    I: IntoIterator<Item = (String, String)>,
{
    Layers::load(file, env_prefix, env, None)?.deserialize()
}

/// [`load_layered_from_env`] for types with `Default + Serialize`: the serialized defaults are the
/// first layer and tell which spelling each key has, so `HAMI_NVIDIA__LIMIT_DELIVERY` (or
/// `limitdelivery` in a file) reaches the field `limitDelivery`.
pub fn load_layered_with_schema<T, I>(
    file: Option<FileText<'_>>,
    env_prefix: &str,
    env: I,
) -> crate::Result<T>
where
    T: DeserializeOwned + Serialize + Default,
    I: IntoIterator<Item = (String, String)>,
{
    Layers::load(file, env_prefix, env, Some(schema_of::<T>()?))?.deserialize()
}

/// `T::default()` serialized: the first layer, and the spelling of every key.
pub(crate) fn schema_of<T: Serialize + Default>() -> crate::Result<Json> {
    serde_json::to_value(T::default()).map_err(|e| ConfigLoadError::InvalidValue {
        origin: "built-in defaults".to_owned(),
        key: String::new(),
        value: String::new(),
        reason: e.to_string(),
    })
}

/// The layers of one load, kept apart so that an error can name the layer a value came from.
#[derive(Debug)]
pub(crate) struct Layers {
    defaults: Json,
    file: Option<(std::path::PathBuf, Json)>,
    env: Json,
    /// Same shape as `env`, holding the variable name at each leaf.
    env_names: Json,
}

fn fold(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Rename keys to the schema's spelling where they match ignoring case, `_` and `-`.
fn normalize(value: Json, schema: Option<&Json>) -> Json {
    match value {
        Json::Object(map) => {
            let schema_map = schema.and_then(Json::as_object);
            let mut out = Map::new();
            for (k, v) in map {
                let canonical = schema_map
                    .and_then(|s| s.keys().find(|c| fold(c) == fold(&k)).cloned())
                    .unwrap_or(k);
                let child_schema = schema_map.and_then(|s| s.get(&canonical));
                out.insert(canonical, normalize(v, child_schema));
            }
            Json::Object(out)
        }
        Json::Array(items) => {
            let item_schema = schema.and_then(Json::as_array).and_then(|a| a.first());
            Json::Array(
                items
                    .into_iter()
                    .map(|v| normalize(v, item_schema))
                    .collect(),
            )
        }
        other => other,
    }
}

/// Deep merge: objects merge key by key, anything else replaces.
fn merge(base: &mut Json, over: Json) {
    match (base, over) {
        (Json::Object(b), Json::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, over) => *slot = over,
    }
}

fn insert_path(root: &mut Json, path: &[String], leaf: Json) {
    let mut cur = root;
    for seg in path {
        if !cur.is_object() {
            *cur = Json::Object(Map::new());
        }
        let Json::Object(map) = cur else { return };
        cur = map.entry(seg.clone()).or_insert(Json::Null);
    }
    *cur = leaf;
}

/// Parse a key path, `a.b[1].c` (also `a.b[1]c`, an index followed by a key without a dot).
pub(crate) fn parse_key_path(key: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in key.split('.') {
        let mut rest = part;
        if let Some(i) = rest.find('[') {
            if i > 0 {
                out.push(Seg::Key(rest[..i].to_owned()));
            }
            rest = &rest[i..];
            while let Some(stripped) = rest.strip_prefix('[') {
                let Some(end) = stripped.find(']') else { break };
                if let Ok(n) = stripped[..end].parse() {
                    out.push(Seg::Index(n));
                }
                rest = &stripped[end + 1..];
            }
            if !rest.is_empty() {
                out.push(Seg::Key(rest.trim_start_matches('.').to_owned()));
            }
        } else if !rest.is_empty() {
            out.push(Seg::Key(rest.to_owned()));
        }
    }
    out
}

fn lookup<'a>(root: &'a Json, path: &[Seg]) -> Option<&'a Json> {
    let mut cur = root;
    for seg in path {
        cur = match seg {
            Seg::Key(k) => cur.get(k)?,
            Seg::Index(i) => cur.get(*i)?,
        };
    }
    Some(cur)
}

/// The environment layer: `<prefix>_A__B=v` as `{"a": {"b": "v"}}` (keys lowercased), and the
/// same shape holding each variable's name.
fn env_layers<I>(env_prefix: &str, env: I) -> (Json, Json)
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut values = Json::Object(Map::new());
    let mut var_names = Json::Object(Map::new());
    let prefix = format!("{env_prefix}_");
    let mut vars: Vec<(String, String)> = env.into_iter().collect();
    vars.sort();
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let path: Vec<String> = rest
            .split(names::CONFIG_ENV_SEPARATOR)
            .map(str::to_lowercase)
            .collect();
        if path.iter().any(String::is_empty) {
            continue;
        }
        insert_path(&mut values, &path, Json::String(value));
        insert_path(&mut var_names, &path, Json::String(name));
    }
    (values, var_names)
}

impl Layers {
    pub(crate) fn load<I>(
        file: Option<FileText<'_>>,
        env_prefix: &str,
        env: I,
        schema: Option<Json>,
    ) -> crate::Result<Self>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let schema = schema.unwrap_or_else(|| Json::Object(Map::new()));
        let file = match file {
            Some(f) => Some((
                f.path.to_path_buf(),
                normalize(file_layer(f)?, Some(&schema)),
            )),
            None => None,
        };
        let (env_layer, env_names) = env_layers(env_prefix, env);
        // Environment keys arrive lowercased; spell them as the defaults or, failing that, the
        // file does, so `HAMI_X__SCHEDULER_NAME` reaches a `schedulerName` the file holds.
        let mut env_schema = schema.clone();
        if let Some((_, f)) = &file {
            merge(&mut env_schema, f.clone());
        }
        Ok(Self {
            env: normalize(env_layer, Some(&env_schema)),
            env_names: normalize(env_names, Some(&env_schema)),
            defaults: schema,
            file,
        })
    }

    fn merged(&self) -> Json {
        let mut merged = self.defaults.clone();
        if let Some((_, f)) = &self.file {
            merge(&mut merged, f.clone());
        }
        merge(&mut merged, self.env.clone());
        merged
    }

    pub(crate) fn deserialize<T: DeserializeOwned>(&self) -> crate::Result<T> {
        de::deserialize(self.merged()).map_err(|e| self.explain(e))
    }

    /// Which layer set `path`, and the value it set (JSON).
    fn origin_of(&self, path: &[Seg]) -> (String, String) {
        if let Some(Json::String(var)) = lookup(&self.env_names, path) {
            let value = lookup(&self.env, path)
                .map(Json::to_string)
                .unwrap_or_default();
            return (format!("environment variable {var}"), value);
        }
        if let Some((file, layer)) = &self.file
            && let Some(v) = lookup(layer, path)
        {
            return (file.display().to_string(), v.to_string());
        }
        let value = lookup(&self.defaults, path)
            .map(Json::to_string)
            .unwrap_or_default();
        let origin = match &self.file {
            Some((file, _)) => file.display().to_string(),
            None => "built-in defaults".to_owned(),
        };
        (origin, value)
    }

    fn invalid_at(&self, path: &[Seg], reason: String) -> ConfigLoadError {
        let (origin, value) = self.origin_of(path);
        ConfigLoadError::InvalidValue {
            origin,
            key: render_key_path(path),
            value,
            reason,
        }
    }

    /// `key` (`nvidia.deviceSplitCount`, `nodeconfig[1].devicesplitcount`) holds a value that is
    /// not accepted, for `reason`.
    pub(crate) fn invalid(&self, key: &str, reason: String) -> ConfigLoadError {
        self.invalid_at(&parse_key_path(key), reason)
    }

    fn explain(&self, e: DeError) -> ConfigLoadError {
        let DeError { mut path, kind } = e;
        let reason = match kind {
            DeErrorKind::Type { expected } => format!("expected {}", friendly_expected(expected)),
            DeErrorKind::Message(message) => message,
            DeErrorKind::Missing(field) => {
                path.push(Seg::Key(field.to_owned()));
                "a value is required".to_owned()
            }
        };
        self.invalid_at(&path, reason)
    }
}

// Range checks of the schemas, after the deserialization: `(key, reason)` per problem.

/// A scaling must be a finite number above 0.
pub(crate) fn check_scaling(problems: &mut Vec<(String, String)>, key: String, v: f64) {
    if !(v.is_finite() && v > 0.0) {
        problems.push((key, "expected a number greater than 0".to_owned()));
    }
}

/// HAMi-core's log levels are 0 to 4.
pub(crate) fn check_log_level(problems: &mut Vec<(String, String)>, key: String, v: u8) {
    if v > 4 {
        problems.push((key, "expected a log level from 0 to 4".to_owned()));
    }
}

/// The loader's type names ([`super::de`]'s `invalid_type`) as accepted forms for people.
fn friendly_expected(expected: &str) -> String {
    match expected {
        "a boolean" => "a boolean (true or false)".to_owned(),
        "a floating point" => "a number".to_owned(),
        other if other.contains("unsigned") => "a non-negative integer".to_owned(),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_parse() {
        assert_eq!(
            parse_key_path("nodeconfig[1].limitdelivery"),
            vec![
                Seg::Key("nodeconfig".into()),
                Seg::Index(1),
                Seg::Key("limitdelivery".into())
            ]
        );
        let p = parse_key_path("nodeconfig[1]limitdelivery");
        assert_eq!(render_key_path(&p), "nodeconfig[1].limitdelivery");
        assert_eq!(
            parse_key_path("nvidia.x"),
            vec![Seg::Key("nvidia".into()), Seg::Key("x".into())]
        );
    }

    #[test]
    fn fold_ignores_case_and_separators() {
        assert_eq!(fold("limitDelivery"), fold("limit_delivery"));
        assert_eq!(fold("defaultGPUNum"), fold("DEFAULT_GPU_NUM"));
    }

    #[test]
    fn environment_pairs_become_a_layer_with_their_names() {
        let (values, var_names) = env_layers(
            "HAMI",
            [
                ("HAMI_NVIDIA__LIMIT_DELIVERY", "env"),
                ("HAMI_X", "1"),
                ("HAMI___BAD", "ignored"),
                ("OTHER", "ignored"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        assert_eq!(
            values,
            serde_json::json!({"nvidia": {"limit_delivery": "env"}, "x": "1"})
        );
        assert_eq!(
            var_names,
            serde_json::json!({"nvidia": {"limit_delivery": "HAMI_NVIDIA__LIMIT_DELIVERY"}, "x": "HAMI_X"})
        );
    }
}

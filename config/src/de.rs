//! The merged layers (a JSON value) deserialized into typed settings, with the conversions the
//! configuration has always allowed, so that environment strings reach numbers and booleans:
//!
//! - integers from integers, from floats (rounded), from booleans (0/1) and from text that parses
//!   (`"10"`, `"+5"`; `true`/`on`/`yes` are 1, `false`/`off`/`no` 0);
//! - numbers from any number, boolean or text that parses as one;
//! - booleans from booleans, numbers (non-zero is true) and the text `1`, `true`, `on`, `yes`, `0`,
//!   `false`, `off`, `no` (any case);
//! - text from text, numbers and booleans;
//! - an option is `None` only for `null`; an enum from its variant's name (or a one-key map).
//!
//! These are the rules of the `config` crate (`config::Value`'s deserializer), which loaded the
//! layers before: kept to the letter, so that no file or variable that loaded then is refused now.
//! Every error carries the key path at which it arose ([`DeError::path`]).

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde_json::{Number, Value as Json};

/// One step of a key path: a map key or a list index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    /// `a` in `a.b`.
    Key(String),
    /// `1` in `list[1]`.
    Index(usize),
}

/// `a.b[1].c`.
pub(crate) fn render_key_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// What went wrong at [`DeError::path`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeErrorKind {
    /// A value of a type that does not convert; `expected` in serde's words.
    Type {
        /// `"an integer"`, `"a boolean"`, `"an unsigned 32 bit integer"`...
        expected: &'static str,
    },
    /// A value's own parser refused it, or serde's (unknown field, invalid type of a struct...).
    Message(String),
    /// A field without `#[serde(default)]` that no layer sets.
    Missing(&'static str),
}

/// A deserialization error and the key path it arose at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeError {
    /// Outermost first once [`deserialize`] returns (built innermost first).
    pub path: Vec<Seg>,
    /// What went wrong.
    pub kind: DeErrorKind,
}

impl DeError {
    fn new(kind: DeErrorKind) -> Self {
        Self {
            path: Vec::new(),
            kind,
        }
    }

    fn invalid_type(expected: &'static str) -> Self {
        Self::new(DeErrorKind::Type { expected })
    }

    fn at(mut self, seg: Seg) -> Self {
        self.path.push(seg);
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DeErrorKind::Type { expected } => write!(f, "expected {expected}")?,
            DeErrorKind::Message(m) => f.write_str(m)?,
            DeErrorKind::Missing(field) => write!(f, "missing field {field:?}")?,
        }
        if !self.path.is_empty() {
            // `path` is outermost-first once `deserialize` returns the error.
            write!(f, " at {}", render_key_path(&self.path))?;
        }
        Ok(())
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::new(DeErrorKind::Message(msg.to_string()))
    }

    fn missing_field(field: &'static str) -> Self {
        Self::new(DeErrorKind::Missing(field))
    }
}

/// `T` from the merged layers.
pub(crate) fn deserialize<T: de::DeserializeOwned>(value: Json) -> Result<T, DeError> {
    T::deserialize(Value(value)).map_err(|mut e| {
        e.path.reverse();
        e
    })
}

/// A JSON number as the `config` crate classified it: signed when it fits, else unsigned, else
/// floating point.
enum Num {
    I64(i64),
    U64(u64),
    F64(f64),
}

fn classify(n: &Number) -> Num {
    if let Some(i) = n.as_i64() {
        Num::I64(i)
    } else if let Some(u) = n.as_u64() {
        Num::U64(u)
    } else {
        Num::F64(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// The words `config` accepts for a boolean inside an integer or a number.
fn word_number(s: &str) -> Option<u8> {
    match s.to_lowercase().as_str() {
        "true" | "on" | "yes" => Some(1),
        "false" | "off" | "no" => Some(0),
        _ => None,
    }
}

/// One value of the merged layers.
struct Value(Json);

impl Value {
    fn into_bool(self) -> Result<bool, DeError> {
        match self.0 {
            Json::Bool(b) => Ok(b),
            Json::Number(n) => Ok(match classify(&n) {
                Num::I64(i) => i != 0,
                Num::U64(u) => u != 0,
                Num::F64(f) => f != 0.0,
            }),
            Json::String(s) => match s.to_lowercase().as_str() {
                "1" | "true" | "on" | "yes" => Ok(true),
                "0" | "false" | "off" | "no" => Ok(false),
                _ => Err(DeError::invalid_type("a boolean")),
            },
            Json::Null | Json::Object(_) | Json::Array(_) => {
                Err(DeError::invalid_type("a boolean"))
            }
        }
    }

    fn into_int(self) -> Result<i64, DeError> {
        const WIDE: &str = "a signed 64 bit or less integer";
        match self.0 {
            Json::Number(n) => match classify(&n) {
                Num::I64(i) => Ok(i),
                Num::U64(u) => i64::try_from(u).map_err(|_| DeError::invalid_type(WIDE)),
                // As `config`: rounded, saturating.
                #[allow(clippy::cast_possible_truncation)]
                Num::F64(f) => Ok(f.round() as i64),
            },
            Json::String(s) => match word_number(&s) {
                Some(w) => Ok(i64::from(w)),
                None => s.parse().map_err(|_| DeError::invalid_type("an integer")),
            },
            Json::Bool(b) => Ok(i64::from(b)),
            Json::Null | Json::Object(_) | Json::Array(_) => {
                Err(DeError::invalid_type("an integer"))
            }
        }
    }

    fn into_uint(self) -> Result<u64, DeError> {
        const WIDE: &str = "an unsigned 64 bit or less integer";
        match self.0 {
            Json::Number(n) => match classify(&n) {
                Num::I64(i) => u64::try_from(i).map_err(|_| DeError::invalid_type(WIDE)),
                Num::U64(u) => Ok(u),
                // As `config`: rounded, saturating (a negative number is 0).
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Num::F64(f) => Ok(f.round() as u64),
            },
            Json::String(s) => match word_number(&s) {
                Some(w) => Ok(u64::from(w)),
                None => s.parse().map_err(|_| DeError::invalid_type("an integer")),
            },
            Json::Bool(b) => Ok(u64::from(b)),
            Json::Null | Json::Object(_) | Json::Array(_) => {
                Err(DeError::invalid_type("an integer"))
            }
        }
    }

    fn into_float(self) -> Result<f64, DeError> {
        match self.0 {
            #[allow(clippy::cast_precision_loss)]
            Json::Number(n) => Ok(match classify(&n) {
                Num::I64(i) => i as f64,
                Num::U64(u) => u as f64,
                Num::F64(f) => f,
            }),
            Json::String(s) => match word_number(&s) {
                Some(w) => Ok(f64::from(w)),
                None => s
                    .parse()
                    .map_err(|_| DeError::invalid_type("a floating point")),
            },
            Json::Bool(b) => Ok(if b { 1.0 } else { 0.0 }),
            Json::Null | Json::Object(_) | Json::Array(_) => {
                Err(DeError::invalid_type("a floating point"))
            }
        }
    }

    fn into_string(self) -> Result<String, DeError> {
        match self.0 {
            Json::String(s) => Ok(s),
            Json::Bool(b) => Ok(b.to_string()),
            Json::Number(n) => Ok(match classify(&n) {
                Num::I64(i) => i.to_string(),
                Num::U64(u) => u.to_string(),
                Num::F64(f) => f.to_string(),
            }),
            Json::Null | Json::Object(_) | Json::Array(_) => Err(DeError::invalid_type("a string")),
        }
    }
}

macro_rules! integer {
    ($method:ident, $visit:ident, $t:ty, $convert:ident, $expected:literal) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let n = self.$convert()?;
            let n = <$t>::try_from(n).map_err(|_| DeError::invalid_type($expected))?;
            visitor.$visit(n)
        }
    };
}

impl<'de> de::Deserializer<'de> for Value {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Json::Null => visitor.visit_unit(),
            Json::Bool(b) => visitor.visit_bool(b),
            Json::Number(n) => match classify(&n) {
                Num::I64(i) => visitor.visit_i64(i),
                Num::U64(u) => visitor.visit_u64(u),
                Num::F64(f) => visitor.visit_f64(f),
            },
            Json::String(s) => visitor.visit_string(s),
            Json::Array(items) => visitor.visit_seq(SeqAccess {
                items: items.into_iter().enumerate(),
            }),
            Json::Object(map) => visitor.visit_map(MapAccess {
                entries: map.into_iter(),
                value: None,
            }),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_bool(self.into_bool()?)
    }

    integer!(
        deserialize_i8,
        visit_i8,
        i8,
        into_int,
        "a signed 8 bit integer"
    );
    integer!(
        deserialize_i16,
        visit_i16,
        i16,
        into_int,
        "a signed 16 bit integer"
    );
    integer!(
        deserialize_i32,
        visit_i32,
        i32,
        into_int,
        "a signed 32 bit integer"
    );
    integer!(
        deserialize_i64,
        visit_i64,
        i64,
        into_int,
        "a signed 64 bit integer"
    );
    integer!(
        deserialize_u8,
        visit_u8,
        u8,
        into_uint,
        "an unsigned 8 bit integer"
    );
    integer!(
        deserialize_u16,
        visit_u16,
        u16,
        into_uint,
        "an unsigned 16 bit integer"
    );
    integer!(
        deserialize_u32,
        visit_u32,
        u32,
        into_uint,
        "an unsigned 32 bit integer"
    );
    integer!(
        deserialize_u64,
        visit_u64,
        u64,
        into_uint,
        "an unsigned 64 bit integer"
    );

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        #[allow(clippy::cast_possible_truncation)]
        visitor.visit_f32(self.into_float()? as f32)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_f64(self.into_float()?)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_string(self.into_string()?)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_string(self.into_string()?)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Json::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let structural = || {
            de::Error::custom(format!(
                "value of enum {name} should be represented by either string or table with exactly one key"
            ))
        };
        let (variant, content) = match self.0 {
            Json::String(s) => (s, None),
            Json::Object(map) if map.len() == 1 => match map.into_iter().next() {
                Some((k, v)) => (k, Some(v)),
                None => return Err(structural()),
            },
            _ => return Err(structural()),
        };
        if !variants.contains(&variant.as_str()) {
            return Err(de::Error::custom(format!(
                "enum {name} does not have variant constructor {variant}"
            )));
        }
        visitor.visit_enum(EnumAccess {
            variant,
            content,
            name,
        })
    }

    serde::forward_to_deserialize_any! {
        char seq bytes byte_buf map struct unit identifier ignored_any unit_struct tuple_struct
        tuple
    }
}

struct SeqAccess {
    items: std::iter::Enumerate<std::vec::IntoIter<Json>>,
}

impl<'de> de::SeqAccess<'de> for SeqAccess {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            Some((i, v)) => seed
                .deserialize(Value(v))
                .map(Some)
                .map_err(|e| e.at(Seg::Index(i))),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapAccess {
    entries: serde_json::map::IntoIter,
    value: Option<(String, Json)>,
}

impl<'de> de::MapAccess<'de> for MapAccess {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let parsed = seed.deserialize(Value(Json::String(key.clone())))?;
        self.value = Some((key, value));
        Ok(Some(parsed))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some((key, value)) = self.value.take() else {
            return Err(de::Error::custom("a map value without its key"));
        };
        seed.deserialize(Value(value))
            .map_err(|e| e.at(Seg::Key(key)))
    }
}

struct EnumAccess {
    variant: String,
    content: Option<Json>,
    name: &'static str,
}

impl<'de> de::EnumAccess<'de> for EnumAccess {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let variant: de::value::StrDeserializer<'_, DeError> =
            self.variant.as_str().into_deserializer();
        let value = seed.deserialize(variant)?;
        Ok((value, self))
    }
}

impl EnumAccess {
    /// The content of `{variant: content}`; the variant's name alone has none.
    fn content(self) -> Result<Value, DeError> {
        self.content.map(Value).ok_or_else(|| {
            de::Error::custom(format!(
                "enum {}: variant {} needs a value: write it as {{{}: ...}}",
                self.name, self.variant, self.variant
            ))
        })
    }
}

impl<'de> de::VariantAccess<'de> for EnumAccess {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self.content()?)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self.content()?, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_map(self.content()?, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Typed {
        count: u32,
        ratio: f64,
        on: bool,
        name: String,
        level: Option<u8>,
        list: Vec<u16>,
    }

    fn typed(v: Json) -> Result<Typed, DeError> {
        deserialize(v)
    }

    #[test]
    fn environment_text_reaches_numbers_and_booleans() {
        let t = typed(serde_json::json!({
            "count": "10", "ratio": "1.5", "on": "YES", "name": 7, "level": "3", "list": ["1", 2.4, true]
        }))
        .unwrap();
        assert_eq!(
            t,
            Typed {
                count: 10,
                ratio: 1.5,
                on: true,
                name: "7".into(),
                level: Some(3),
                list: vec![1, 2, 1]
            }
        );
        let t = typed(serde_json::json!({
            "count": 1.6, "ratio": 2, "on": 0, "name": 2.5, "level": null, "list": []
        }))
        .unwrap();
        assert_eq!(
            (t.count, t.ratio, t.on, t.name.as_str(), t.level),
            (2, 2.0, false, "2.5", None)
        );
    }

    #[test]
    fn errors_carry_the_key_path_and_the_expected_form() {
        let base = serde_json::json!({"count": 1, "ratio": 1, "on": true, "name": "", "level": null, "list": [1, "x"]});
        let err = typed(base).unwrap_err();
        assert_eq!(err.path, [Seg::Key("list".into()), Seg::Index(1)]);
        assert_eq!(
            err.kind,
            DeErrorKind::Type {
                expected: "an integer"
            }
        );
        let err = typed(serde_json::json!({"count": -1})).unwrap_err();
        assert_eq!(
            err.kind,
            DeErrorKind::Type {
                expected: "an unsigned 64 bit or less integer"
            }
        );
        let err = typed(serde_json::json!({"count": 5_000_000_000_u64})).unwrap_err();
        assert_eq!(
            err.kind,
            DeErrorKind::Type {
                expected: "an unsigned 32 bit integer"
            }
        );
        let err = typed(serde_json::json!({"count": 1, "on": "maybe"})).unwrap_err();
        assert_eq!(render_key_path(&err.path), "on");
        assert_eq!(
            err.kind,
            DeErrorKind::Type {
                expected: "a boolean"
            }
        );
        let err = typed(serde_json::json!({"count": 1, "ratio": 1, "on": true})).unwrap_err();
        assert_eq!(err.kind, DeErrorKind::Missing("name"));
    }

    #[test]
    fn enums_by_variant_name() {
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(rename_all = "lowercase")]
        enum Mode {
            Plain,
            Sized(u8),
        }
        assert_eq!(
            deserialize::<Mode>(serde_json::json!("plain")).unwrap(),
            Mode::Plain
        );
        assert_eq!(
            deserialize::<Mode>(serde_json::json!({"sized": "4"})).unwrap(),
            Mode::Sized(4)
        );
        let err = deserialize::<Mode>(serde_json::json!("Plain")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "enum Mode does not have variant constructor Plain"
        );
        assert!(deserialize::<Mode>(serde_json::json!("sized")).is_err());
        assert!(deserialize::<Mode>(serde_json::json!(3)).is_err());
    }
}

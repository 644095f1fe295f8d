//! The request body's JSON, read strictly: an object that repeats a key is refused, not
//! resolved by taking the last value (the canonical request hash assumes I-JSON, where keys
//! are unique, and two readers of the same bytes must never see two different calls).

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::ObolError;

/// The body as a JSON value: malformed JSON is a parse error (-32700), a repeated key an
/// invalid request (-32600).
pub fn parse(body: &[u8]) -> Result<Value, ObolError> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let value = Strict
        .deserialize(&mut reader)
        .and_then(|value| reader.end().map(|()| value));
    value.map_err(|error| match error.classify() {
        serde_json::error::Category::Data => ObolError::InvalidRequest(error.to_string()),
        _ => ObolError::Parse(error.to_string()),
    })
}

/// A JSON value whose objects have unique keys.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // serde_json never hands a parser a non-finite double.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut values = Vec::with_capacity(items.size_hint().unwrap_or(0).min(4096));
        while let Some(value) = items.next_element_seed(Strict)? {
            values.push(value);
        }
        Ok(Value::Array(values))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if map.contains_key(&key) {
                // The key is the client's; it is not echoed.
                return Err(de::Error::custom("a JSON object repeats one of its keys"));
            }
            let value = entries.next_value_seed(Strict)?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parsing_agrees_with_serde_json_on_unique_keys() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a.b","arguments":{"x":[1,2.5,-3,1e300,"s",null,true,{"y":{}}]}}}"#,
            r#"[]"#,
            r#"0.1"#,
            r#"18446744073709551615"#,
            r#"-9223372036854775808"#,
            r#""\u00e9\ud83d\ude00""#,
        ] {
            let strict = parse(text.as_bytes()).unwrap();
            let lenient: Value = serde_json::from_str(text).unwrap();
            assert_eq!(strict, lenient, "{text}");
        }
    }

    #[test]
    fn a_repeated_key_is_an_invalid_request_and_broken_json_a_parse_error() {
        for text in [
            r#"{"method":"tools/list","method":"tools/call"}"#,
            r#"{"params":{"arguments":{"amount":1,"amount":100000}}}"#,
            r#"[{"a":1,"a":1}]"#,
        ] {
            let error = parse(text.as_bytes()).unwrap_err();
            assert!(
                matches!(error, ObolError::InvalidRequest(_)),
                "{text}: {error:?}"
            );
            assert!(!error.to_string().contains("amount"), "{error}");
        }
        for text in [r#"{"a":1"#, r#"{"a":1} x"#, "", r#"{"a":nul}"#] {
            assert!(
                matches!(parse(text.as_bytes()), Err(ObolError::Parse(_))),
                "{text}"
            );
        }
    }
}

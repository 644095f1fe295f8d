//! What `prepare` receives: the call's arguments and the connection's non-secret facts.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::PrepareError;
use crate::url::UrlBuilder;

/// A call's arguments: a JSON object the host has already validated against the tool's
/// input schema. The getters still check types, so a schema that is looser than the code
/// produces a clear [`PrepareError::InvalidArguments`] rather than a panic.
#[derive(Clone, Debug, PartialEq)]
pub struct Arguments {
    text: String,
    object: Map<String, Value>,
}

impl Arguments {
    /// Parses the arguments text; anything but a JSON object is invalid.
    pub fn from_json_text(text: impl Into<String>) -> Result<Arguments, PrepareError> {
        let text = text.into();
        match serde_json::from_str(&text) {
            Ok(Value::Object(object)) => Ok(Arguments { text, object }),
            Ok(_) => Err(PrepareError::invalid("arguments must be a JSON object")),
            Err(error) => Err(PrepareError::invalid(format!(
                "arguments are not valid JSON: {error}"
            ))),
        }
    }

    /// The arguments exactly as the host sent them.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn as_object(&self) -> &Map<String, Value> {
        &self.object
    }

    /// The argument's value; an explicit `null` counts as absent.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.object.get(name).filter(|value| !value.is_null())
    }

    /// All arguments as a typed value through serde.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, PrepareError> {
        serde_json::from_str(&self.text).map_err(|error| PrepareError::invalid(error.to_string()))
    }

    pub fn required_str(&self, name: &str) -> Result<&str, PrepareError> {
        self.optional_str(name)?.ok_or_else(|| missing(name))
    }

    pub fn optional_str(&self, name: &str) -> Result<Option<&str>, PrepareError> {
        self.get(name)
            .map(|value| value.as_str().ok_or_else(|| wrong_type(name, "a string")))
            .transpose()
    }

    pub fn required_i64(&self, name: &str) -> Result<i64, PrepareError> {
        self.optional_i64(name)?.ok_or_else(|| missing(name))
    }

    /// An integer argument; `5.0` and `"5"` are refused, as JSON Schema's `integer` would.
    pub fn optional_i64(&self, name: &str) -> Result<Option<i64>, PrepareError> {
        self.get(name)
            .map(|value| value.as_i64().ok_or_else(|| wrong_type(name, "an integer")))
            .transpose()
    }

    pub fn optional_bool(&self, name: &str) -> Result<Option<bool>, PrepareError> {
        self.get(name)
            .map(|value| value.as_bool().ok_or_else(|| wrong_type(name, "a boolean")))
            .transpose()
    }

    /// A list of strings, e.g. labels.
    pub fn optional_str_list(&self, name: &str) -> Result<Option<Vec<&str>>, PrepareError> {
        self.get(name)
            .map(|value| {
                value
                    .as_array()
                    .and_then(|items| items.iter().map(Value::as_str).collect())
                    .ok_or_else(|| wrong_type(name, "a list of strings"))
            })
            .transpose()
    }
}

fn missing(name: &str) -> PrepareError {
    PrepareError::invalid(format!("missing required argument `{name}`"))
}

fn wrong_type(name: &str, expected: &str) -> PrepareError {
    PrepareError::invalid(format!("argument `{name}` must be {expected}"))
}

/// The non-secret facts of the connection a call runs on. Credentials are never here: the
/// host adds them to the request after `prepare` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionFacts {
    /// The vendor origin and path prefix, e.g. `https://api.stripe.com`. The host refuses
    /// requests outside it.
    pub base_url: String,
    /// Operator-configured settings (account ids, regions, ...), in the operator's order.
    pub settings: Vec<(String, String)>,
}

impl ConnectionFacts {
    /// Facts without settings, for tests.
    pub fn new(base_url: impl Into<String>) -> ConnectionFacts {
        ConnectionFacts {
            base_url: base_url.into(),
            settings: Vec::new(),
        }
    }

    /// Adds a setting, for tests.
    pub fn with_setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// The first setting of that name.
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(setting, _)| setting == name)
            .map(|(_, value)| value.as_str())
    }

    /// A URL builder starting at the base URL.
    pub fn url(&self) -> UrlBuilder {
        UrlBuilder::new(&self.base_url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    fn arguments(value: Value) -> Arguments {
        Arguments::from_json_text(value.to_string()).unwrap()
    }

    fn message(error: PrepareError) -> String {
        match error {
            PrepareError::InvalidArguments(message) => message,
            PrepareError::UnknownTool => panic!("unexpected unknown tool"),
        }
    }

    #[test]
    fn only_json_objects_are_arguments() {
        assert!(message(Arguments::from_json_text("[1]").unwrap_err()).contains("JSON object"));
        assert!(message(Arguments::from_json_text("{").unwrap_err()).contains("not valid JSON"));
        let args = Arguments::from_json_text(r#"{"a": 1}"#).unwrap();
        assert_eq!(args.text(), r#"{"a": 1}"#);
        assert_eq!(args.as_object().len(), 1);
    }

    #[test]
    fn getters_return_present_values() {
        let args = arguments(json!({
            "s": "x", "n": -3, "b": true, "l": ["a", "b"], "nothing": null
        }));
        assert_eq!(args.required_str("s"), Ok("x"));
        assert_eq!(args.required_i64("n"), Ok(-3));
        assert_eq!(args.optional_bool("b"), Ok(Some(true)));
        assert_eq!(args.optional_str_list("l"), Ok(Some(vec!["a", "b"])));
        assert_eq!(args.optional_str("nothing"), Ok(None));
        assert_eq!(args.optional_i64("absent"), Ok(None));
    }

    #[test]
    fn getters_name_the_argument_and_the_problem() {
        let args = arguments(json!({"s": 1, "n": 5.5, "l": ["a", 2], "nothing": null}));
        assert_eq!(
            message(args.required_str("charge").unwrap_err()),
            "missing required argument `charge`"
        );
        assert_eq!(
            message(args.required_str("nothing").unwrap_err()),
            "missing required argument `nothing`"
        );
        assert_eq!(
            message(args.required_str("s").unwrap_err()),
            "argument `s` must be a string"
        );
        assert_eq!(
            message(args.required_i64("n").unwrap_err()),
            "argument `n` must be an integer"
        );
        assert_eq!(
            message(args.optional_str_list("l").unwrap_err()),
            "argument `l` must be a list of strings"
        );
    }

    #[test]
    fn parse_deserializes_typed_arguments() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Refund {
            charge: String,
            amount: Option<u64>,
        }
        let args = arguments(json!({"charge": "ch_1", "amount": 5}));
        assert_eq!(
            args.parse::<Refund>(),
            Ok(Refund {
                charge: "ch_1".into(),
                amount: Some(5)
            })
        );
        let error = message(arguments(json!({})).parse::<Refund>().unwrap_err());
        assert!(error.contains("missing field `charge`"), "{error}");
    }

    #[test]
    fn settings_are_looked_up_by_name() {
        let facts = ConnectionFacts::new("http://h/")
            .with_setting("owner", "octo")
            .with_setting("owner", "second");
        assert_eq!(facts.setting("owner"), Some("octo"));
        assert_eq!(facts.setting("repo"), None);
        assert_eq!(facts.url().path("x").build().unwrap(), "http://h/x");
    }
}

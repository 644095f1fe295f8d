//! Catalog brokers (spec/idempotency.md, "Why broker retries are disabled"): the host's own
//! knowledge of each broker a federated tool may run through. A profile says how the broker's
//! retries are turned off (applied by the outbound hop last on every attempt, over anything
//! the component set) and where the broker's record of a call is read, for the receipt's
//! `broker_attested` evidence. The component only names the broker; it cannot say either.
//!
//! The built-in profiles model the brokers' shapes as the tests' mock brokers serve them:
//! Nango's proxy takes a `Retries` header (0 = none); a Composio-shaped execute API takes a
//! `retries` field in its JSON body and answers its execution log id at `/log_id`. An operator
//! whose broker differs overrides the directive per connection (`retry_off`).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::catalog::{Broker, JsonPointer};

/// What turns a broker's retries off.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOff {
    Header {
        name: HeaderName,
        value: HeaderValue,
    },
    /// Set in the JSON request body (a request without a JSON object body is refused).
    BodyField { pointer: JsonPointer, value: Value },
}

/// Where the broker's record id of a call is read from its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordAt {
    Header(HeaderName),
    /// An RFC 6901 pointer into the JSON answer; the value must be a string or a number.
    BodyField(String),
}

/// Everything the host knows of one broker on one connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub broker: Broker,
    pub retry_off: RetryOff,
    pub record_at: Option<RecordAt>,
}

impl Profile {
    /// The built-in profile of a broker.
    pub fn builtin(broker: Broker) -> Profile {
        match broker {
            Broker::Nango => Profile {
                broker,
                retry_off: RetryOff::Header {
                    name: HeaderName::from_static("retries"),
                    value: HeaderValue::from_static("0"),
                },
                record_at: None,
            },
            Broker::Composio => Profile {
                broker,
                retry_off: RetryOff::BodyField {
                    pointer: JsonPointer::parse("/retries").expect("a valid pointer"),
                    value: Value::from(0),
                },
                record_at: Some(RecordAt::BodyField("/log_id".into())),
            },
        }
    }

    /// The broker's record id in an answer, when the profile says where it is and it is there.
    /// Bounded: an id longer than 128 characters is not one.
    pub fn record_id(&self, headers: &[(String, String)], body: &[u8]) -> Option<String> {
        let id = match self.record_at.as_ref()? {
            RecordAt::Header(name) => headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name.as_str()))
                .map(|(_, v)| v.clone()),
            RecordAt::BodyField(pointer) => {
                let json: Value = serde_json::from_slice(body).ok()?;
                match json.pointer(pointer)? {
                    Value::String(text) => Some(text.clone()),
                    Value::Number(number) => Some(number.to_string()),
                    _ => None,
                }
            }
        }?;
        let printable = id.chars().all(|c| c.is_ascii_graphic());
        (!id.is_empty() && id.len() <= 128 && printable).then_some(id)
    }

    /// Applies the retry-off directive to a request the component prepared: last, so that
    /// nothing the component set can undo it.
    pub fn apply(&self, headers: &mut HeaderMap, body: &mut Option<Vec<u8>>) -> Result<(), String> {
        match &self.retry_off {
            RetryOff::Header { name, value } => {
                headers.insert(name.clone(), value.clone());
                Ok(())
            }
            RetryOff::BodyField { pointer, value } => {
                let mut json: Value = body
                    .as_deref()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .filter(Value::is_object)
                    .ok_or_else(|| {
                        format!(
                            "the {} broker's retries are turned off in the JSON body, but the request has no JSON object body",
                            self.broker.label()
                        )
                    })?;
                pointer.set(&mut json, value.clone())?;
                *body = Some(serde_json::to_vec(&json).map_err(|e| e.to_string())?);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directive_overrides_what_the_component_set() {
        let nango = Profile::builtin(Broker::Nango);
        let mut headers = HeaderMap::new();
        headers.insert("retries", HeaderValue::from_static("5"));
        let mut body = None;
        nango.apply(&mut headers, &mut body).unwrap();
        assert_eq!(headers["retries"], "0");
        assert_eq!(headers.get_all("retries").iter().count(), 1);

        let composio = Profile::builtin(Broker::Composio);
        let mut body = Some(br#"{"arguments":{"a":1},"retries":3}"#.to_vec());
        composio.apply(&mut HeaderMap::new(), &mut body).unwrap();
        let sent: Value = serde_json::from_slice(&body.unwrap()).unwrap();
        assert_eq!(sent["retries"], Value::from(0));
        assert_eq!(sent["arguments"]["a"], Value::from(1));
        assert!(composio.apply(&mut HeaderMap::new(), &mut None).is_err());
    }

    #[test]
    fn the_record_id_is_read_only_where_the_profile_says() {
        let composio = Profile::builtin(Broker::Composio);
        assert_eq!(
            composio.record_id(&[], br#"{"log_id":"log_42","successful":true}"#),
            Some("log_42".into())
        );
        assert_eq!(composio.record_id(&[], br#"{"id":"log_42"}"#), None);
        assert_eq!(composio.record_id(&[], b"not json"), None);
        let long = format!(r#"{{"log_id":"{}"}}"#, "x".repeat(200));
        assert_eq!(composio.record_id(&[], long.as_bytes()), None);
        let nango = Profile::builtin(Broker::Nango);
        assert_eq!(nango.record_id(&[("x-id".into(), "1".into())], b"{}"), None);
    }
}

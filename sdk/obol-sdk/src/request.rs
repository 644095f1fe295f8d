//! What `prepare` returns: one HTTP request for the host to send.

use serde_json::Value;

use crate::url::percent_encode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

/// A request template. The host checks its URL against the connection's origin, adds
/// credentials and (where the EffectSpec says so) the idempotency key, then sends it once.
///
/// ```
/// use obol_sdk::{Form, OutboundRequest};
///
/// let request = OutboundRequest::post("https://api.example.com/v1/refunds")
///     .form(Form::new().field("charge", "ch_1").optional_field("amount", Some(500)));
/// assert_eq!(request.body.as_deref(), Some(&b"charge=ch_1&amount=500"[..]));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboundRequest {
    pub method: Method,
    pub url: String,
    /// Name-value pairs in order; a name may repeat.
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

impl OutboundRequest {
    pub fn new(method: Method, url: impl Into<String>) -> OutboundRequest {
        OutboundRequest {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn get(url: impl Into<String>) -> OutboundRequest {
        OutboundRequest::new(Method::Get, url)
    }

    pub fn post(url: impl Into<String>) -> OutboundRequest {
        OutboundRequest::new(Method::Post, url)
    }

    pub fn put(url: impl Into<String>) -> OutboundRequest {
        OutboundRequest::new(Method::Put, url)
    }

    pub fn patch(url: impl Into<String>) -> OutboundRequest {
        OutboundRequest::new(Method::Patch, url)
    }

    pub fn delete(url: impl Into<String>) -> OutboundRequest {
        OutboundRequest::new(Method::Delete, url)
    }

    /// Adds a header. Never add credentials: the component has none, the host adds them.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets raw body bytes and their `Content-Type`.
    pub fn body(self, content_type: &str, body: impl Into<Vec<u8>>) -> OutboundRequest {
        let mut request = self.header("Content-Type", content_type);
        request.body = Some(body.into());
        request
    }

    /// Sets a JSON body (`application/json`).
    pub fn json(self, body: &Value) -> OutboundRequest {
        // serde_json's own writer, not `Display` (see the structured output in `guest`).
        let bytes = serde_json::to_vec(body).expect("a JSON value always serializes");
        self.body("application/json", bytes)
    }

    /// Sets a form body (`application/x-www-form-urlencoded`).
    pub fn form(self, form: Form) -> OutboundRequest {
        self.body("application/x-www-form-urlencoded", form.encode())
    }
}

/// An `application/x-www-form-urlencoded` body, built field by field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Form {
    fields: Vec<(String, String)>,
}

impl Form {
    pub fn new() -> Form {
        Form::default()
    }

    pub fn field(mut self, name: &str, value: impl std::fmt::Display) -> Form {
        self.fields.push((name.to_owned(), value.to_string()));
        self
    }

    /// Adds the field when there is a value, so optional arguments stay absent.
    pub fn optional_field(self, name: &str, value: Option<impl std::fmt::Display>) -> Form {
        match value {
            Some(value) => self.field(name, value),
            None => self,
        }
    }

    /// Encodes spaces as `%20` rather than `+`; every form decoder reads both.
    pub fn encode(&self) -> String {
        self.fields
            .iter()
            .map(|(name, value)| format!("{}={}", percent_encode(name), percent_encode(value)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_body_sets_the_content_type() {
        let request = OutboundRequest::patch("http://h/x").json(&json!({"state": "closed"}));
        assert_eq!(request.method, Method::Patch);
        assert_eq!(
            request.headers,
            vec![("Content-Type".to_owned(), "application/json".to_owned())]
        );
        let body: Value = serde_json::from_slice(request.body.as_deref().unwrap()).unwrap();
        assert_eq!(body, json!({"state": "closed"}));
    }

    #[test]
    fn form_fields_are_encoded_in_order() {
        let form = Form::new()
            .field("charge", "ch_1")
            .optional_field("amount", None::<i64>)
            .field("reason", "requested by customer&more")
            .field("metadata[order]", 7);
        assert_eq!(
            form.encode(),
            "charge=ch_1&reason=requested%20by%20customer%26more&metadata%5Border%5D=7"
        );
        assert_eq!(Form::new().encode(), "");
        let request = OutboundRequest::post("http://h").form(form);
        assert_eq!(request.headers[0].1, "application/x-www-form-urlencoded");
    }

    #[test]
    fn every_method_has_a_constructor() {
        let methods = [
            OutboundRequest::get("u").method,
            OutboundRequest::post("u").method,
            OutboundRequest::put("u").method,
            OutboundRequest::patch("u").method,
            OutboundRequest::delete("u").method,
        ];
        assert_eq!(
            methods,
            [
                Method::Get,
                Method::Post,
                Method::Put,
                Method::Patch,
                Method::Delete
            ]
        );
        let request = OutboundRequest::get("u").header("Accept", "application/json");
        assert_eq!(request.body, None);
        assert_eq!(request.headers.len(), 1);
    }
}

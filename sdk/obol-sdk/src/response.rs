//! What `interpret` receives (the vendor's response) and returns (MCP content).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::InterpretError;

/// The vendor's HTTP response, as the host received it, less the headers the gateway keeps:
/// `Set-Cookie` (a session is a secret) and the hop-by-hop ones (`Connection`, `Keep-Alive`,
/// `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`), which describe the
/// gateway's connection, not the answer. Header names arrive in lower case, a name's values
/// together at its first place, and headers whose value is not visible ASCII are left out.
/// `obol harness` gives a component a fixture's or a test's headers by the same rule.
///
/// `interpret` does not decide success: the host has already classified the status with
/// the tool's EffectSpec. The status is here so error bodies can be rendered helpfully.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl VendorResponse {
    /// A response with a body and no headers, for tests.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> VendorResponse {
        VendorResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// The first header of that name, compared case-insensitively as HTTP requires.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, InterpretError> {
        std::str::from_utf8(&self.body)
            .map_err(|_| InterpretError::malformed("response body is not UTF-8"))
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<Value, InterpretError> {
        self.json_as()
    }

    /// The body deserialized through serde. The error says where parsing failed, never
    /// what the body contained.
    pub fn json_as<T: DeserializeOwned>(&self) -> Result<T, InterpretError> {
        serde_json::from_slice(&self.body).map_err(|error| {
            InterpretError::malformed(format!(
                "response body is not the expected JSON ({:?} at line {} column {})",
                error.classify(),
                error.line(),
                error.column()
            ))
        })
    }
}

/// One piece of MCP content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    Text(String),
    Image { mime_type: String, data: Vec<u8> },
}

/// What the agent sees: content, and optionally structured output (`structuredContent`),
/// which the host validates against the tool's output schema.
///
/// ```
/// use obol_sdk::ToolOutput;
/// use serde_json::json;
///
/// let output = ToolOutput::text("Refund re_1 succeeded").structured(json!({"id": "re_1"}));
/// assert_eq!(output.structured, Some(json!({"id": "re_1"})));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    pub content: Vec<Content>,
    pub structured: Option<Value>,
}

impl ToolOutput {
    /// Output made of one text item.
    pub fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput::default().and_text(text)
    }

    /// Adds a text item.
    pub fn and_text(mut self, text: impl Into<String>) -> ToolOutput {
        self.content.push(Content::Text(text.into()));
        self
    }

    /// Adds an image item.
    pub fn and_image(mut self, mime_type: impl Into<String>, data: Vec<u8>) -> ToolOutput {
        self.content.push(Content::Image {
            mime_type: mime_type.into(),
            data,
        });
        self
    }

    /// Sets the structured output; MCP expects a JSON object here.
    ///
    /// To pass on part of the vendor's JSON, move it out of the parsed body
    /// (`body.get_mut("data").map(Value::take)`) rather than naming it inside `json!`, which
    /// serializes what it borrows into a new value, string by string.
    pub fn structured(mut self, value: Value) -> ToolOutput {
        self.structured = Some(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_bodies_parse_and_garbage_is_malformed() {
        let ok = VendorResponse::new(200, r#"{"id": "re_1"}"#);
        assert_eq!(ok.json(), Ok(json!({"id": "re_1"})));
        assert!(ok.is_success());

        let garbage = VendorResponse::new(502, "<html>secret-ish</html>");
        assert!(!garbage.is_success());
        let Err(InterpretError::MalformedResponse(message)) = garbage.json() else {
            panic!("garbage parsed");
        };
        assert!(message.contains("line 1 column 1"), "{message}");
        assert!(
            !message.contains("secret"),
            "the body leaked into {message}"
        );
    }

    #[test]
    fn text_requires_utf8_and_headers_ignore_case() {
        let mut response = VendorResponse::new(200, vec![0xff, 0xfe]);
        response
            .headers
            .push(("Content-Type".into(), "text/plain".into()));
        assert!(response.text().is_err());
        assert_eq!(response.header("content-type"), Some("text/plain"));
        assert_eq!(VendorResponse::new(200, "hi").text(), Ok("hi"));
    }

    #[test]
    fn output_builder_keeps_content_in_order() {
        let output = ToolOutput::text("a")
            .and_image("image/png", vec![1, 2])
            .and_text("b")
            .structured(json!({"k": 1}));
        assert_eq!(
            output.content,
            vec![
                Content::Text("a".into()),
                Content::Image {
                    mime_type: "image/png".into(),
                    data: vec![1, 2]
                },
                Content::Text("b".into()),
            ]
        );
        assert_eq!(output.structured, Some(json!({"k": 1})));
    }
}

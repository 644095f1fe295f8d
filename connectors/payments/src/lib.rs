//! `stripe`: refunds and charges on a Stripe-shaped API.
//!
//! * `create_refund` — POST `/v1/refunds` (form body); destructive, deduplicated by the
//!   vendor through the `Idempotency-Key` header the host sets.
//! * `charges.list` — GET `/v1/charges`; a read.
//!
//! The base URL comes from the connection (`https://api.stripe.com` in production, a mock
//! vendor on loopback in tests). The component never sees the API key: the host adds
//! `Authorization` after `prepare` returns.

use obol_sdk::{
    Arguments, ConnectionFacts, Connector, EffectSpec, Form, InterpretError, Manifest,
    OutboundRequest, PrepareError, Propagation, Status, Tool, ToolOutput, VendorResponse,
};
use serde_json::{Map, Value, json};

const CREATE_REFUND: &str = "create_refund";
const LIST_CHARGES: &str = "charges.list";

/// The gateway's tests build a second version (`--features next`) to hot-upgrade to.
#[cfg(not(feature = "next"))]
const VERSION: &str = env!("CARGO_PKG_VERSION");
#[cfg(feature = "next")]
const VERSION: &str = "0.2.0-next";

/// Stripe's own page size bounds for list endpoints.
const DEFAULT_LIMIT: i64 = 10;
const MAX_LIMIT: i64 = 100;

pub struct Payments;

impl Connector for Payments {
    fn manifest() -> Manifest {
        Manifest::new("stripe", VERSION)
            .tool(create_refund_tool())
            .tool(list_charges_tool())
    }

    fn prepare(
        tool: &str,
        arguments: Arguments,
        connection: ConnectionFacts,
    ) -> Result<OutboundRequest, PrepareError> {
        match tool {
            CREATE_REFUND => prepare_refund(&arguments, &connection),
            LIST_CHARGES => prepare_list_charges(&arguments, &connection),
            _ => Err(PrepareError::UnknownTool),
        }
    }

    fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError> {
        if tool != CREATE_REFUND && tool != LIST_CHARGES {
            return Err(InterpretError::UnknownTool);
        }
        if !response.is_success() {
            return vendor_error(&response);
        }
        match tool {
            CREATE_REFUND => interpret_refund(&response),
            _ => interpret_charge_list(&response),
        }
    }
}

obol_sdk::export!(Payments);

fn create_refund_tool() -> Tool {
    // Stripe deduplicates POSTs on `Idempotency-Key`, so the host's key makes a retry safe;
    // that is also why 500 and the gateway errors are retryable here. 409 (a request with the
    // same key is in flight) stays unknown: it proves nothing about the first attempt.
    let effect = EffectSpec::write()
        .destructive()
        .propagation(Propagation::Header("Idempotency-Key"))
        .accepted([Status::SUCCESS])
        .definitely_rejected([Status::range(400, 404), Status::code(422)])
        .retryable([429, 500, 502, 503, 504].map(Status::code));
    Tool::new(CREATE_REFUND, effect)
        .description(
            "Refund a charge, fully or partly. Money goes back to the customer; \
             this cannot be undone.",
        )
        .input_schema(json!({
            "type": "object",
            "properties": {
                "charge": {
                    "type": "string",
                    "pattern": "^ch_",
                    "description": "The charge to refund, e.g. ch_3MmlLrLkdIwHu7ix0snN0B15."
                },
                "amount": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Amount in the smallest currency unit (cents). \
                                    Defaults to the whole remaining charge."
                },
                "reason": {
                    "type": "string",
                    "enum": ["duplicate", "fraudulent", "requested_by_customer"]
                }
            },
            "required": ["charge"],
            "additionalProperties": false
        }))
        .output_schema(json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "charge": {"type": "string"},
                "amount": {"type": "integer"},
                "status": {"type": "string"}
            },
            "required": ["id", "charge", "amount", "status"]
        }))
}

fn list_charges_tool() -> Tool {
    Tool::new(LIST_CHARGES, EffectSpec::read())
        .description("List recent charges, newest first, optionally for one customer.")
        .input_schema(json!({
            "type": "object",
            "properties": {
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LIMIT,
                    "default": DEFAULT_LIMIT
                },
                "customer": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Only charges of this customer, e.g. cus_NffrFeUfNV2Hib."
                }
            },
            "additionalProperties": false
        }))
        .output_schema(json!({
            "type": "object",
            "properties": {
                "data": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"id": {"type": "string"}},
                        "required": ["id"]
                    }
                },
                "has_more": {"type": "boolean"}
            },
            "required": ["data", "has_more"]
        }))
}

fn prepare_refund(
    arguments: &Arguments,
    connection: &ConnectionFacts,
) -> Result<OutboundRequest, PrepareError> {
    let charge = arguments.required_str("charge")?;
    if !charge.starts_with("ch_") {
        return Err(PrepareError::invalid(
            "`charge` must be a charge id (ch_...)",
        ));
    }
    let amount = arguments.optional_i64("amount")?;
    if amount.is_some_and(|amount| amount < 1) {
        return Err(PrepareError::invalid("`amount` must be at least 1"));
    }
    let form = Form::new()
        .field("charge", charge)
        .optional_field("amount", amount)
        .optional_field("reason", arguments.optional_str("reason")?);
    let url = connection.url().path("v1/refunds").build()?;
    Ok(OutboundRequest::post(url).form(form))
}

fn prepare_list_charges(
    arguments: &Arguments,
    connection: &ConnectionFacts,
) -> Result<OutboundRequest, PrepareError> {
    let limit = arguments.optional_i64("limit")?.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(PrepareError::invalid(format!(
            "`limit` must be between 1 and {MAX_LIMIT}"
        )));
    }
    let url = connection
        .url()
        .path("v1/charges")
        .query("limit", limit)
        .optional_query("customer", arguments.optional_str("customer")?)
        .build()?;
    Ok(OutboundRequest::get(url))
}

fn interpret_refund(response: &VendorResponse) -> Result<ToolOutput, InterpretError> {
    let refund = response.json()?;
    let id = string_field(&refund, "id")?;
    let charge = string_field(&refund, "charge")?;
    let status = string_field(&refund, "status")?;
    let amount = refund["amount"]
        .as_i64()
        .ok_or_else(|| InterpretError::malformed("refund `amount` is not an integer"))?;
    let currency = refund["currency"].as_str().unwrap_or_default();
    Ok(ToolOutput::text(format!(
        "Refund {id} of {amount} {currency} for charge {charge}: {status}"
    ))
    .structured(json!({"id": id, "charge": charge, "amount": amount, "status": status})))
}

fn interpret_charge_list(response: &VendorResponse) -> Result<ToolOutput, InterpretError> {
    let mut list = response.json()?;
    // Moved out of the parsed list into the structured output, not copied: `json!` would
    // serialize the array into a new value, string by string.
    // `get_mut`, not `list["data"]`: indexing a body that is not an object mutably panics.
    let Some(Value::Array(charges)) = list.get_mut("data").map(Value::take) else {
        return Err(InterpretError::malformed("list `data` is not an array"));
    };
    let has_more = list["has_more"]
        .as_bool()
        .ok_or_else(|| InterpretError::malformed("list `has_more` is not a boolean"))?;
    let mut text = format!("{} charge(s)", charges.len());
    for charge in &charges {
        let id = string_field(charge, "id")?;
        text.push_str(&format!(
            "\n- {id}: {} {} {}",
            charge["amount"],
            charge["currency"].as_str().unwrap_or_default(),
            charge["status"].as_str().unwrap_or_default(),
        ));
    }
    if has_more {
        text.push_str("\nMore charges exist; this list is not complete.");
    }
    let mut structured = Map::new();
    structured.insert("data".into(), Value::Array(charges));
    structured.insert("has_more".into(), Value::Bool(has_more));
    Ok(ToolOutput::text(text).structured(Value::Object(structured)))
}

/// Renders Stripe's `{"error": {"message": ...}}` for a status the host did not accept, so
/// the agent learns why; structured output is left out because it would not match the
/// output schema.
fn vendor_error(response: &VendorResponse) -> Result<ToolOutput, InterpretError> {
    let message = response
        .json()
        .ok()
        .and_then(|body| body["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "no error message".to_owned());
    Ok(ToolOutput::text(format!(
        "Stripe answered HTTP {}: {message}",
        response.status
    )))
}

fn string_field<'a>(object: &'a Value, name: &str) -> Result<&'a str, InterpretError> {
    object[name]
        .as_str()
        .ok_or_else(|| InterpretError::malformed(format!("`{name}` is not a string")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ConnectionFacts {
        ConnectionFacts::new("http://127.0.0.1:4242")
    }

    fn prepare(tool: &str, arguments: Value) -> Result<OutboundRequest, PrepareError> {
        Payments::prepare(
            tool,
            Arguments::from_json_text(arguments.to_string()).unwrap(),
            facts(),
        )
    }

    #[test]
    fn manifest_passes_the_sdk_checks() {
        let manifest = Payments::manifest();
        assert_eq!(manifest.check(), Ok(()));
        assert_eq!(manifest.name, "stripe");
        let refund = &manifest.tools[0].effect;
        assert!(refund.destructive);
        assert_eq!(refund.propagation, Propagation::Header("Idempotency-Key"));
        for ambiguous in [408, 409, 425] {
            let classified = [
                &refund.accepted,
                &refund.definitely_rejected,
                &refund.retryable,
            ]
            .iter()
            .any(|class| class.iter().any(|status| status.contains(ambiguous)));
            assert!(!classified, "{ambiguous} must stay unknown");
        }
        assert_eq!(manifest.tools[1].effect, EffectSpec::read());
    }

    #[test]
    fn refund_is_a_form_post() {
        let request = prepare(
            CREATE_REFUND,
            json!({"charge": "ch_1", "amount": 500, "reason": "duplicate"}),
        )
        .unwrap();
        assert_eq!(request.method, obol_sdk::Method::Post);
        assert_eq!(request.url, "http://127.0.0.1:4242/v1/refunds");
        assert_eq!(
            request.body.as_deref(),
            Some(&b"charge=ch_1&amount=500&reason=duplicate"[..])
        );
        assert!(
            request
                .headers
                .iter()
                .all(|(name, _)| name != "Authorization")
        );
    }

    #[test]
    fn refund_arguments_are_checked() {
        let not_a_charge = prepare(CREATE_REFUND, json!({"charge": "py_1"}));
        assert!(matches!(
            not_a_charge,
            Err(PrepareError::InvalidArguments(_))
        ));
        let zero = prepare(CREATE_REFUND, json!({"charge": "ch_1", "amount": 0}));
        assert!(matches!(zero, Err(PrepareError::InvalidArguments(_))));
        let only_charge = prepare(CREATE_REFUND, json!({"charge": "ch_1"})).unwrap();
        assert_eq!(only_charge.body.as_deref(), Some(&b"charge=ch_1"[..]));
        assert_eq!(prepare("refund", json!({})), Err(PrepareError::UnknownTool));
    }

    #[test]
    fn charge_list_defaults_and_encodes_the_query() {
        let default = prepare(LIST_CHARGES, json!({})).unwrap();
        assert_eq!(default.url, "http://127.0.0.1:4242/v1/charges?limit=10");
        assert_eq!(default.body, None);
        let filtered = prepare(LIST_CHARGES, json!({"limit": 3, "customer": "cus_1 x"})).unwrap();
        assert_eq!(
            filtered.url,
            "http://127.0.0.1:4242/v1/charges?limit=3&customer=cus_1%20x"
        );
        let too_many = prepare(LIST_CHARGES, json!({"limit": 101}));
        assert!(matches!(too_many, Err(PrepareError::InvalidArguments(_))));
    }

    #[test]
    fn refund_response_becomes_structured_output() {
        let body = json!({
            "id": "re_1", "object": "refund", "amount": 500, "charge": "ch_1",
            "currency": "usd", "status": "succeeded"
        });
        let output =
            Payments::interpret(CREATE_REFUND, VendorResponse::new(200, body.to_string())).unwrap();
        assert_eq!(
            output.structured,
            Some(json!({"id": "re_1", "charge": "ch_1", "amount": 500, "status": "succeeded"}))
        );
        assert_eq!(
            output.content,
            vec![obol_sdk::Content::Text(
                "Refund re_1 of 500 usd for charge ch_1: succeeded".into()
            )]
        );
        let truncated = VendorResponse::new(200, r#"{"id": "re_1"}"#);
        assert!(matches!(
            Payments::interpret(CREATE_REFUND, truncated),
            Err(InterpretError::MalformedResponse(_))
        ));
    }

    #[test]
    fn a_list_without_an_array_of_charges_is_malformed() {
        for body in [
            r#"[]"#,
            r#""list""#,
            r#"{"data": {}, "has_more": false}"#,
            "{}",
        ] {
            let response = VendorResponse::new(200, body.to_owned());
            assert!(
                matches!(
                    Payments::interpret(LIST_CHARGES, response),
                    Err(InterpretError::MalformedResponse(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn charge_list_keeps_the_charges() {
        let body = json!({
            "object": "list", "url": "/v1/charges", "has_more": true,
            "data": [{"id": "ch_1", "object": "charge", "amount": 100, "currency": "usd",
                      "status": "succeeded"}]
        });
        let output =
            Payments::interpret(LIST_CHARGES, VendorResponse::new(200, body.to_string())).unwrap();
        // Every charge whole, and nothing of the list's envelope but `has_more`.
        assert_eq!(
            output.structured,
            Some(json!({"data": body["data"], "has_more": true}))
        );
    }

    #[test]
    fn vendor_errors_are_explained_without_structured_output() {
        let body = json!({"error": {"type": "invalid_request_error", "message": "No such charge"}});
        let output =
            Payments::interpret(CREATE_REFUND, VendorResponse::new(404, body.to_string())).unwrap();
        assert_eq!(output.structured, None);
        assert_eq!(
            output.content,
            vec![obol_sdk::Content::Text(
                "Stripe answered HTTP 404: No such charge".into()
            )]
        );
        assert_eq!(
            Payments::interpret("nope", VendorResponse::new(200, "{}")),
            Err(InterpretError::UnknownTool)
        );
    }
}

//! `nango`: a CRM's contacts through a Nango-shaped proxy (a federated route).
//!
//! Every call is `POST|GET {base}/proxy/<provider path>` with the connection's
//! `Connection-Id` and `Provider-Config-Key` (settings `connection_id`, `provider_config_key`);
//! the broker adds the provider's credentials and calls the provider. The component names the
//! broker and nothing else about it: the host turns the broker's retries off on every attempt
//! and never propagates its idempotency key (the broker builds the vendor request).
//!
//! * `contacts.create` — POST `/proxy/crm/v3/objects/contacts`; a write.
//! * `contacts.get` — GET `/proxy/crm/v3/objects/contacts/{id}`; a read.
//! * `contacts.delete` — DELETE `/proxy/crm/v3/objects/contacts/{id}`; destructive.

use obol_sdk::{
    Arguments, Broker, ConnectionFacts, Connector, EffectSpec, InterpretError, Manifest,
    OutboundRequest, PrepareError, Propagation, Route, Tool, ToolOutput, VendorResponse,
};
use serde_json::json;

const CREATE: &str = "contacts.create";
const GET: &str = "contacts.get";
const DELETE: &str = "contacts.delete";

pub struct Nango;

fn federated(effect: EffectSpec) -> EffectSpec {
    effect
        .route(Route::Federated(Broker::Nango))
        .propagation(Propagation::None)
}

impl Connector for Nango {
    fn manifest() -> Manifest {
        Manifest::new("nango", env!("CARGO_PKG_VERSION"))
            .tool(
                Tool::new(CREATE, federated(EffectSpec::write()))
                    .description("Create a CRM contact through the Nango proxy.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {
                            "email": {"type": "string", "minLength": 3},
                            "name": {"type": "string"}
                        },
                        "required": ["email"],
                        "additionalProperties": false
                    })),
            )
            .tool(
                Tool::new(DELETE, federated(EffectSpec::write().destructive()))
                    .description("Delete a CRM contact through the Nango proxy. It cannot be undone.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {"id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}},
                        "required": ["id"],
                        "additionalProperties": false
                    })),
            )
            .tool(
                Tool::new(GET, federated(EffectSpec::read()))
                    .description("Read a CRM contact through the Nango proxy.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {"id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}},
                        "required": ["id"],
                        "additionalProperties": false
                    })),
            )
    }

    fn prepare(
        tool: &str,
        arguments: Arguments,
        connection: ConnectionFacts,
    ) -> Result<OutboundRequest, PrepareError> {
        let setting = |name: &str| {
            connection.setting(name).map(str::to_owned).ok_or_else(|| {
                PrepareError::invalid(format!("the connection has no `{name}` setting"))
            })
        };
        let (connection_id, config_key) =
            (setting("connection_id")?, setting("provider_config_key")?);
        let request = match tool {
            CREATE => {
                let url = connection
                    .url()
                    .path("proxy/crm/v3/objects/contacts")
                    .build()?;
                OutboundRequest::post(url).json(&json!({ "properties": {
                    "email": arguments.required_str("email")?,
                    "name": arguments.optional_str("name")?,
                }}))
            }
            GET | DELETE => {
                let url = connection
                    .url()
                    .path("proxy/crm/v3/objects/contacts")
                    .segment(arguments.required_str("id")?)
                    .build()?;
                match tool {
                    GET => OutboundRequest::get(url),
                    _ => OutboundRequest::delete(url),
                }
            }
            _ => return Err(PrepareError::UnknownTool),
        };
        Ok(request
            .header("Connection-Id", connection_id)
            .header("Provider-Config-Key", config_key))
    }

    fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError> {
        if ![CREATE, GET, DELETE].contains(&tool) {
            return Err(InterpretError::UnknownTool);
        }
        let body = response.json()?;
        let id = body["id"].as_str().unwrap_or_default().to_owned();
        let text = if response.is_success() {
            format!("contact {id}")
        } else {
            format!(
                "the provider answered {} through the broker",
                response.status
            )
        };
        Ok(ToolOutput::text(text).structured(body))
    }
}

obol_sdk::export!(Nango);

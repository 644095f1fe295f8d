//! `composio`: actions through a Composio-shaped execute API (a federated route).
//!
//! A call is `POST {base}/api/v3/tools/execute/<ACTION>` with `{"user_id", "arguments"}`; the
//! broker runs the action against the vendor and answers 200 with `successful`, `data`,
//! `error` and the id of its execution log. A 200 with `"successful": false` is not a
//! success: the tool's EffectSpec says so declaratively (a body rule), so the host classifies
//! it `unknown` (the action may have half-run) without asking this component. The host, not
//! the component, turns the broker's retries off and reads its log id for the receipt.
//!
//! * `github.create_issue` — action `GITHUB_CREATE_AN_ISSUE`; a write.
//! * `github.get_repo` — action `GITHUB_GET_A_REPOSITORY`; a read.

use obol_sdk::{
    Arguments, Broker, ConnectionFacts, Connector, EffectSpec, InterpretError, Manifest,
    OutboundRequest, Outcome, PrepareError, Propagation, Route, Tool, ToolOutput, VendorResponse,
};
use serde_json::{Value, json};

const CREATE_ISSUE: (&str, &str) = ("github.create_issue", "GITHUB_CREATE_AN_ISSUE");
const GET_REPO: (&str, &str) = ("github.get_repo", "GITHUB_GET_A_REPOSITORY");

pub struct Composio;

fn federated(effect: EffectSpec) -> EffectSpec {
    effect
        .route(Route::Federated(Broker::Composio))
        .propagation(Propagation::None)
        .body_rule("/successful", "false", Outcome::Unknown)
}

fn action(tool: &str) -> Option<&'static str> {
    [CREATE_ISSUE, GET_REPO]
        .into_iter()
        .find(|(name, _)| *name == tool)
        .map(|(_, action)| action)
}

impl Connector for Composio {
    fn manifest() -> Manifest {
        let repo = json!({"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,100}$"});
        Manifest::new("composio", env!("CARGO_PKG_VERSION"))
            .tool(
                Tool::new(CREATE_ISSUE.0, federated(EffectSpec::write()))
                    .description("Open a GitHub issue through Composio.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {
                            "owner": repo, "repo": repo,
                            "title": {"type": "string", "minLength": 1},
                            "body": {"type": "string"}
                        },
                        "required": ["owner", "repo", "title"],
                        "additionalProperties": false
                    })),
            )
            .tool(
                Tool::new(GET_REPO.0, federated(EffectSpec::read()))
                    .description("Read a GitHub repository through Composio.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {"owner": repo, "repo": repo},
                        "required": ["owner", "repo"],
                        "additionalProperties": false
                    })),
            )
    }

    fn prepare(
        tool: &str,
        arguments: Arguments,
        connection: ConnectionFacts,
    ) -> Result<OutboundRequest, PrepareError> {
        let action = action(tool).ok_or(PrepareError::UnknownTool)?;
        let user = connection
            .setting("user_id")
            .ok_or_else(|| PrepareError::invalid("the connection has no `user_id` setting"))?;
        let url = connection
            .url()
            .path("api/v3/tools/execute")
            .segment(action)
            .build()?;
        Ok(OutboundRequest::post(url).json(&json!({
            "user_id": user,
            "arguments": Value::Object(arguments.as_object().clone()),
        })))
    }

    fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError> {
        action(tool).ok_or(InterpretError::UnknownTool)?;
        let body = response.json()?;
        let text = match (&body["successful"], &body["error"]) {
            (Value::Bool(true), _) => "done".to_owned(),
            (_, Value::String(error)) => format!("the action failed: {error}"),
            _ => format!("the broker answered {}", response.status),
        };
        Ok(ToolOutput::text(text).structured(body["data"].clone()))
    }
}

obol_sdk::export!(Composio);

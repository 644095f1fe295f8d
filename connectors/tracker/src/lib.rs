//! `tracker`: issues on a GitHub-Issues-shaped API.
//!
//! * `issues.create` — POST `/repos/{owner}/{repo}/issues`; a write the vendor cannot
//!   deduplicate (GitHub has no idempotency key), declared as such.
//! * `issues.get` — GET `/repos/{owner}/{repo}/issues/{number}`; a read.
//! * `issues.close` — PATCH the issue to `{"state": "closed"}`; destructive.
//!
//! `owner` and `repo` come from the arguments or, when absent, from the connection
//! settings of the same names, so an operator can bind a connection to one repository.

use obol_sdk::{
    Arguments, ConnectionFacts, Connector, EffectSpec, InterpretError, Manifest, OutboundRequest,
    PrepareError, Tool, ToolOutput, UrlBuilder, VendorResponse,
};
use serde_json::{Map, Value, json};

const CREATE: &str = "issues.create";
const GET: &str = "issues.get";
const CLOSE: &str = "issues.close";

/// The gateway's tests build a second version (`--features next`) that says which it is.
#[cfg(not(feature = "next"))]
const VERSION: &str = env!("CARGO_PKG_VERSION");
#[cfg(feature = "next")]
const VERSION: &str = "0.2.0-next";

/// GitHub's recommended media type; the host adds credentials and the user agent.
const ACCEPT: &str = "application/vnd.github+json";

pub struct Tracker;

impl Connector for Tracker {
    fn manifest() -> Manifest {
        // GitHub offers no idempotency key, so both writes keep `EffectSpec::write()`'s
        // honest `Propagation::Unsupported`; policy decides whether that is acceptable.
        Manifest::new("tracker", VERSION)
            .tool(
                Tool::new(CREATE, EffectSpec::write())
                    .description("Open a new issue in a repository.")
                    .input_schema(input_schema(
                        json!({
                            "title": {"type": "string", "minLength": 1},
                            "body": {"type": "string", "description": "Markdown text."},
                            "labels": {"type": "array", "items": {"type": "string"}}
                        }),
                        &["title"],
                    ))
                    .output_schema(issue_schema()),
            )
            .tool(
                Tool::new(GET, EffectSpec::read())
                    .description("Read one issue: its title, state and link.")
                    .input_schema(input_schema(issue_number(), &["number"]))
                    .output_schema(issue_schema()),
            )
            .tool(
                Tool::new(CLOSE, EffectSpec::write().destructive())
                    .description("Close an issue.")
                    .input_schema(input_schema(issue_number(), &["number"]))
                    .output_schema(issue_schema()),
            )
    }

    fn prepare(
        tool: &str,
        arguments: Arguments,
        connection: ConnectionFacts,
    ) -> Result<OutboundRequest, PrepareError> {
        let request = match tool {
            CREATE => {
                let mut issue = Map::new();
                issue.insert("title".into(), arguments.required_str("title")?.into());
                if let Some(body) = arguments.optional_str("body")? {
                    issue.insert("body".into(), body.into());
                }
                if let Some(labels) = arguments.optional_str_list("labels")? {
                    issue.insert("labels".into(), labels.into());
                }
                let url = repository_url(&arguments, &connection)?.path("issues");
                OutboundRequest::post(url.build()?).json(&Value::Object(issue))
            }
            GET => OutboundRequest::get(issue_url(&arguments, &connection)?),
            CLOSE => OutboundRequest::patch(issue_url(&arguments, &connection)?)
                .json(&json!({"state": "closed"})),
            _ => return Err(PrepareError::UnknownTool),
        };
        Ok(request.header("Accept", ACCEPT))
    }

    fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError> {
        let verb = match tool {
            CREATE => "Created",
            GET => "Issue",
            CLOSE => "Closed",
            _ => return Err(InterpretError::UnknownTool),
        };
        if !response.is_success() {
            return Ok(vendor_error(&response));
        }
        let issue = issue_summary(&response.json()?)?;
        let text = format!(
            "{verb} #{}: {} ({}) {}",
            issue["number"],
            issue["title"].as_str().unwrap_or_default(),
            issue["state"].as_str().unwrap_or_default(),
            issue["url"].as_str().unwrap_or_default(),
        );
        #[cfg(feature = "next")]
        let text = format!("{text} [tracker {VERSION}]");
        Ok(ToolOutput::text(text).structured(issue))
    }
}

obol_sdk::export!(Tracker);

/// An object schema with optional `owner`/`repo` (the connection settings fill them in).
fn input_schema(properties: Value, required: &[&str]) -> Value {
    let mut all = json!({
        "owner": {"type": "string", "minLength": 1,
                  "description": "Defaults to the connection's `owner` setting."},
        "repo": {"type": "string", "minLength": 1,
                 "description": "Defaults to the connection's `repo` setting."}
    });
    if let (Some(all), Value::Object(properties)) = (all.as_object_mut(), properties) {
        all.extend(properties);
    }
    json!({
        "type": "object",
        "properties": all,
        "required": required,
        "additionalProperties": false
    })
}

fn issue_number() -> Value {
    json!({"number": {"type": "integer", "minimum": 1}})
}

fn issue_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "number": {"type": "integer"},
            "title": {"type": "string"},
            "state": {"type": "string", "enum": ["open", "closed"]},
            "url": {"type": "string"}
        },
        "required": ["number", "title", "state", "url"]
    })
}

/// An argument, else the connection setting of the same name.
fn argument_or_setting<'a>(
    arguments: &'a Arguments,
    connection: &'a ConnectionFacts,
    name: &str,
) -> Result<&'a str, PrepareError> {
    match arguments.optional_str(name)? {
        Some(value) => Ok(value),
        None => connection.setting(name).ok_or_else(|| {
            PrepareError::invalid(format!(
                "`{name}` is required: pass it, or set `{name}` on the connection"
            ))
        }),
    }
}

fn repository_url(
    arguments: &Arguments,
    connection: &ConnectionFacts,
) -> Result<UrlBuilder, PrepareError> {
    let owner = argument_or_setting(arguments, connection, "owner")?;
    let repo = argument_or_setting(arguments, connection, "repo")?;
    Ok(connection.url().path("repos").segment(owner).segment(repo))
}

fn issue_url(arguments: &Arguments, connection: &ConnectionFacts) -> Result<String, PrepareError> {
    let number = arguments.required_i64("number")?;
    if number < 1 {
        return Err(PrepareError::invalid("`number` must be at least 1"));
    }
    repository_url(arguments, connection)?
        .path("issues")
        .segment(number)
        .build()
}

/// `{number, title, state, url}` from a GitHub issue; `url` is the page a person opens
/// (`html_url`), falling back to the API `url`.
fn issue_summary(issue: &Value) -> Result<Value, InterpretError> {
    let number = issue["number"]
        .as_i64()
        .ok_or_else(|| InterpretError::malformed("issue `number` is not an integer"))?;
    let title = issue["title"]
        .as_str()
        .ok_or_else(|| InterpretError::malformed("issue `title` is not a string"))?;
    let state = issue["state"]
        .as_str()
        .filter(|state| matches!(*state, "open" | "closed"))
        .ok_or_else(|| InterpretError::malformed("issue `state` is neither open nor closed"))?;
    let url = issue["html_url"]
        .as_str()
        .or_else(|| issue["url"].as_str())
        .ok_or_else(|| InterpretError::malformed("issue has no `html_url` or `url`"))?;
    Ok(json!({"number": number, "title": title, "state": state, "url": url}))
}

/// GitHub's `{"message": ...}` for a status the host did not accept; no structured output,
/// since it would not match the output schema.
fn vendor_error(response: &VendorResponse) -> ToolOutput {
    let message = response
        .json()
        .ok()
        .and_then(|body| body["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "no error message".to_owned());
    ToolOutput::text(format!(
        "The tracker answered HTTP {}: {message}",
        response.status
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use obol_sdk::{Method, Propagation};

    fn facts() -> ConnectionFacts {
        ConnectionFacts::new("http://127.0.0.1:9000")
            .with_setting("owner", "octo")
            .with_setting("repo", "hello")
    }

    fn prepare(tool: &str, arguments: Value) -> Result<OutboundRequest, PrepareError> {
        Tracker::prepare(
            tool,
            Arguments::from_json_text(arguments.to_string()).unwrap(),
            facts(),
        )
    }

    fn json_body(request: &OutboundRequest) -> Value {
        serde_json::from_slice(request.body.as_deref().unwrap()).unwrap()
    }

    #[test]
    fn manifest_declares_honest_effects() {
        let manifest = Tracker::manifest();
        assert_eq!(manifest.check(), Ok(()));
        let effects: Vec<_> = manifest.tools.iter().map(|tool| &tool.effect).collect();
        assert_eq!(effects[0].propagation, Propagation::Unsupported);
        assert!(!effects[0].destructive);
        assert_eq!(*effects[1], EffectSpec::read());
        assert!(effects[2].destructive);
        assert_eq!(effects[2].propagation, Propagation::Unsupported);
        assert!(manifest.tools[1].output_schema.is_some());
    }

    #[test]
    fn create_posts_only_the_given_fields_to_the_default_repository() {
        let request = prepare(CREATE, json!({"title": "Bug", "labels": ["p1"]})).unwrap();
        assert_eq!(request.method, Method::Post);
        assert_eq!(request.url, "http://127.0.0.1:9000/repos/octo/hello/issues");
        assert_eq!(
            json_body(&request),
            json!({"title": "Bug", "labels": ["p1"]})
        );
        assert!(request.headers.contains(&("Accept".into(), ACCEPT.into())));
    }

    #[test]
    fn arguments_override_settings_and_are_encoded() {
        let request = prepare(GET, json!({"owner": "a b", "repo": "r", "number": 7})).unwrap();
        assert_eq!(request.url, "http://127.0.0.1:9000/repos/a%20b/r/issues/7");
        assert_eq!(request.body, None);
        let climbing = prepare(GET, json!({"owner": "..", "repo": "r", "number": 7}));
        assert!(matches!(climbing, Err(PrepareError::InvalidArguments(_))));
    }

    #[test]
    fn missing_repository_is_an_invalid_argument() {
        let result = Tracker::prepare(
            GET,
            Arguments::from_json_text(r#"{"number": 1}"#).unwrap(),
            ConnectionFacts::new("http://h"),
        );
        let Err(PrepareError::InvalidArguments(message)) = result else {
            panic!("{result:?}");
        };
        assert!(message.contains("`owner` is required"), "{message}");
    }

    #[test]
    fn close_patches_the_state() {
        let request = prepare(CLOSE, json!({"number": 3})).unwrap();
        assert_eq!(request.method, Method::Patch);
        assert_eq!(
            request.url,
            "http://127.0.0.1:9000/repos/octo/hello/issues/3"
        );
        assert_eq!(json_body(&request), json!({"state": "closed"}));
        assert_eq!(
            prepare("issues.delete", json!({})),
            Err(PrepareError::UnknownTool)
        );
    }

    #[test]
    fn issue_responses_match_the_output_schema() {
        let issue = json!({
            "id": 1, "number": 7, "title": "Bug", "state": "open",
            "url": "https://api.github.com/repos/octo/hello/issues/7",
            "html_url": "https://github.com/octo/hello/issues/7"
        });
        let output = Tracker::interpret(GET, VendorResponse::new(200, issue.to_string())).unwrap();
        assert_eq!(
            output.structured,
            Some(json!({
                "number": 7, "title": "Bug", "state": "open",
                "url": "https://github.com/octo/hello/issues/7"
            }))
        );
        let odd_state = json!({"number": 7, "title": "Bug", "state": "merged", "url": "u"});
        assert!(matches!(
            Tracker::interpret(GET, VendorResponse::new(200, odd_state.to_string())),
            Err(InterpretError::MalformedResponse(_))
        ));
    }

    #[test]
    fn vendor_errors_are_text_only() {
        let output = Tracker::interpret(
            CLOSE,
            VendorResponse::new(404, r#"{"message":"Not Found"}"#),
        )
        .unwrap();
        assert_eq!(output.structured, None);
        assert_eq!(
            output.content,
            vec![obol_sdk::Content::Text(
                "The tracker answered HTTP 404: Not Found".into()
            )]
        );
    }
}

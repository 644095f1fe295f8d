//! MCP clients: rmcp's real Streamable HTTP client, and a raw HTTP client for the transport
//! checks no well-behaved client would ever produce.

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
    ProtocolVersion, Tool,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceError, ServiceExt};
use serde_json::{Map, Value};

/// rmcp's client, connected with a bearer key and pinned to protocol 2025-11-25.
pub struct McpClient {
    service: RunningService<RoleClient, ClientConfig>,
}

impl McpClient {
    pub async fn connect(url: &str, token: &str) -> McpClient {
        Self::try_connect(url, token).await.unwrap()
    }

    pub async fn try_connect(url: &str, token: &str) -> Result<McpClient, String> {
        Self::connect_with_headers(url, token, &[]).await
    }

    /// A client whose every request carries `headers` (e.g. one `Idempotency-Key`).
    pub async fn with_key(url: &str, token: &str, idempotency_key: &str) -> McpClient {
        Self::connect_with_headers(url, token, &[("idempotency-key", idempotency_key)])
            .await
            .unwrap()
    }

    pub async fn connect_with_headers(
        url: &str,
        token: &str,
        headers: &[(&str, &str)],
    ) -> Result<McpClient, String> {
        let headers = headers
            .iter()
            .map(|(n, v)| {
                (
                    axum::http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    axum::http::HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect();
        let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
            .auth_header(token)
            .custom_headers(headers);
        let transport = StreamableHttpClientTransport::from_config(config);
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("obol-e2e", "0.1.0"),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25);
        let service = info.serve(transport).await.map_err(|e| e.to_string())?;
        Ok(McpClient { service })
    }

    /// rmcp's client in discover mode, at protocol 2026-07-28: no `initialize`, no session;
    /// every request carries its own `_meta` and headers.
    pub async fn connect_discover(url: &str, token: &str) -> McpClient {
        use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
        let config =
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token);
        let transport = StreamableHttpClientTransport::from_config(config);
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("obol-e2e", "0.1.0"),
        );
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        let service = info
            .serve_with_lifecycle(transport, lifecycle)
            .await
            .unwrap();
        McpClient { service }
    }

    /// rmcp's client itself, for what the helpers do not cover.
    pub fn service(&self) -> &RunningService<RoleClient, ClientConfig> {
        &self.service
    }

    pub fn protocol_version(&self) -> String {
        self.service
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default()
    }

    pub async fn list_tools(&self) -> Vec<Tool> {
        self.service.list_all_tools().await.unwrap()
    }

    pub async fn tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .list_tools()
            .await
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        names.sort();
        names
    }

    pub async fn call(&self, name: &str, arguments: Value) -> Result<CallToolResult, ServiceError> {
        let arguments: Map<String, Value> = match arguments {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => panic!("arguments must be an object, not {other}"),
        };
        self.service
            .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments))
            .await
    }

    /// Calls a tool that must fail with a JSON-RPC error; returns (code, message, data).
    pub async fn call_err(&self, name: &str, arguments: Value) -> (i32, String, Option<Value>) {
        match self.call(name, arguments).await {
            Err(ServiceError::McpError(error)) => {
                (error.code.0, error.message.to_string(), error.data)
            }
            other => panic!("expected a JSON-RPC error from {name}, got {other:?}"),
        }
    }

    /// A call the tool refused as a tool execution error (`isError: true`, such as arguments
    /// it cannot accept): its text and its `_meta.obol`.
    pub async fn call_refused(&self, name: &str, arguments: Value) -> (String, Value) {
        let result = self
            .call(name, arguments)
            .await
            .unwrap_or_else(|e| panic!("expected a tool error result from {name}, got {e:?}"));
        assert_eq!(result.is_error, Some(true), "{result:?}");
        let text = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n");
        let meta = result
            .meta
            .as_ref()
            .map(|m| Value::Object(m.0.clone()))
            .unwrap_or_default();
        (text, meta["obol"].clone())
    }

    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

/// Plain HTTP against `/mcp`, for the status matrix.
pub struct RawMcp {
    pub url: String,
    pub http: reqwest::Client,
}

/// A response read whole: status, headers and the SSE body's JSON-RPC message.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The JSON-RPC message carried in the single SSE event.
    pub fn message(&self) -> Value {
        let data = self
            .body
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no SSE data line in {:?}", self.body));
        serde_json::from_str(data).unwrap()
    }

    pub fn error_code(&self) -> i64 {
        self.message()["error"]["code"].as_i64().unwrap()
    }

    pub fn error_type(&self) -> String {
        self.message()["error"]["data"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

impl RawMcp {
    pub fn new(url: &str) -> RawMcp {
        RawMcp {
            url: url.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// A POST with the headers a good client sends, plus `extra` (which may override them).
    pub async fn post(
        &self,
        token: Option<&str>,
        session: Option<&str>,
        body: &str,
        extra: &[(&str, &str)],
    ) -> RawResponse {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let mut built = request.body(body.to_owned()).build().unwrap();
        for (name, value) in extra {
            built.headers_mut().insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                reqwest::header::HeaderValue::from_str(value).unwrap(),
            );
        }
        read(self.http.execute(built).await.unwrap()).await
    }

    /// A POST with exactly `headers`, appended in order (so a header may repeat), for the
    /// malformed-header rows no well-behaved client produces.
    pub async fn post_exact(&self, headers: &[(&str, &str)], body: &str) -> RawResponse {
        let mut request = self.http.post(&self.url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read(request.body(body.to_owned()).send().await.unwrap()).await
    }

    /// `initialize` at `version`; returns the session id and the response.
    pub async fn initialize(&self, token: &str, version: &str) -> (String, RawResponse) {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        });
        let response = self.post(Some(token), None, &body.to_string(), &[]).await;
        let session = response
            .header("mcp-session-id")
            .unwrap_or_default()
            .to_owned();
        (session, response)
    }

    pub async fn request(
        &self,
        token: &str,
        session: &str,
        id: i64,
        method: &str,
        params: Value,
    ) -> RawResponse {
        let body =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.post(Some(token), Some(session), &body.to_string(), &[])
            .await
    }
}

pub async fn read(response: reqwest::Response) -> RawResponse {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.unwrap_or_default();
    RawResponse {
        status,
        headers,
        body,
    }
}

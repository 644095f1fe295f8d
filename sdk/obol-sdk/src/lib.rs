//! Write Obol connectors: WebAssembly components that *describe* a vendor's tools and
//! *translate* between MCP and the vendor's HTTP API, while the host *acts* (sends the
//! request, adds credentials and idempotency keys, classifies outcomes, retries).
//!
//! A connector implements [`Connector`] and exports it with [`export!`]:
//!
//! ```
//! use obol_sdk::serde_json::json;
//! use obol_sdk::{
//!     Arguments, ConnectionFacts, Connector, EffectSpec, InterpretError, Manifest,
//!     OutboundRequest, PrepareError, Tool, ToolOutput, VendorResponse,
//! };
//!
//! struct Weather;
//!
//! impl Connector for Weather {
//!     fn manifest() -> Manifest {
//!         Manifest::new("weather", env!("CARGO_PKG_VERSION")).tool(
//!             Tool::new("forecast", EffectSpec::read())
//!                 .description("Today's forecast for a city.")
//!                 .input_schema(json!({
//!                     "type": "object",
//!                     "properties": {"city": {"type": "string", "minLength": 1}},
//!                     "required": ["city"],
//!                 }))
//!                 .output_schema(json!({
//!                     "type": "object",
//!                     "properties": {"summary": {"type": "string"}},
//!                     "required": ["summary"],
//!                 })),
//!         )
//!     }
//!
//!     fn prepare(
//!         tool: &str,
//!         arguments: Arguments,
//!         connection: ConnectionFacts,
//!     ) -> Result<OutboundRequest, PrepareError> {
//!         match tool {
//!             "forecast" => {
//!                 let city = arguments.required_str("city")?;
//!                 let url = connection.url().path("v1/forecast").query("city", city).build()?;
//!                 Ok(OutboundRequest::get(url))
//!             }
//!             _ => Err(PrepareError::UnknownTool),
//!         }
//!     }
//!
//!     fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError> {
//!         match tool {
//!             "forecast" => {
//!                 let body = response.json()?;
//!                 let summary = body["summary"]
//!                     .as_str()
//!                     .ok_or_else(|| InterpretError::malformed("`summary` is missing"))?;
//!                 Ok(ToolOutput::text(summary).structured(json!({"summary": summary})))
//!             }
//!             _ => Err(InterpretError::UnknownTool),
//!         }
//!     }
//! }
//!
//! obol_sdk::export!(Weather);
//!
//! // The same functions run natively in `cargo test`, without a host:
//! let request = Weather::prepare(
//!     "forecast",
//!     Arguments::from_json_text(r#"{"city": "São Paulo"}"#)?,
//!     ConnectionFacts::new("https://api.weather.example"),
//! )?;
//! assert_eq!(request.url, "https://api.weather.example/v1/forecast?city=S%C3%A3o%20Paulo");
//! assert_eq!(Weather::manifest().check(), Ok(()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate is a `cdylib` (add `[lib] crate-type = ["cdylib", "rlib"]`), and
//! `cargo build --release --target wasm32-wasip2` emits the component.
//!
//! # Layout
//!
//! * [`Connector`] and [`export!`]: what an author implements and how it is exported.
//! * `manifest`: [`Manifest`] and [`Tool`], the connector's self-description.
//! * `effect`: [`EffectSpec`], [`Status`], [`Propagation`], [`Route`]: what a tool does, in the
//!   terms the host enforces.
//! * `call`: [`Arguments`] and [`ConnectionFacts`], what `prepare` receives.
//! * `url`: [`UrlBuilder`] and [`percent_encode`], URLs without a URL crate.
//! * `request`: [`OutboundRequest`], [`Method`], [`Form`], what `prepare` returns.
//! * `response`: [`VendorResponse`] in, [`ToolOutput`] and [`Content`] out of `interpret`.
//! * `error`: [`PrepareError`], [`InterpretError`].
//! * [`log`]: the one import a component has.
//! * [`bindings`]: the raw `wit-bindgen` bindings of `obol:connector@0.2.0`, for authors who
//!   want the contract's own types.
//! * `guest`: the adapter from the generated `Guest` trait to [`Connector`].
//! * `arena`: the component's allocator, a bump arena for its first allocations (the
//!   default `arena` feature; turn it off to bring a global allocator of your own).

#[cfg(any(
    test,
    all(
        feature = "arena",
        target_arch = "wasm32",
        not(target_feature = "atomics")
    )
))]
#[allow(unsafe_code)]
mod arena;
mod call;
mod effect;
mod error;
mod guest;
pub mod log;
mod manifest;
mod request;
mod response;
mod url;

/// The raw bindings of the `connector` world of `obol:connector@0.2.0`.
// Generated code: the canonical ABI glue is unsafe by nature, and `_export_prepare_cabi`
// takes one argument per flattened core value.
#[allow(unsafe_code, clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "connector",
        path: "../../wit/since_v0.2.0",
        pub_export_macro: true,
        // The SDK's own `export!` is the public one; the generated macro is its back end.
        export_macro_name: "__export_connector",
        default_bindings_module: "obol_sdk::bindings",
    });
}

pub use call::{Arguments, ConnectionFacts};
pub use effect::{BodyRule, Broker, EffectSpec, Outcome, Propagation, Route, Status};
pub use error::{InterpretError, PrepareError};
pub use manifest::{Manifest, ManifestError, Tool};
pub use request::{Form, Method, OutboundRequest};
pub use response::{Content, ToolOutput, VendorResponse};
pub use url::{UrlBuilder, percent_encode};

#[cfg(all(
    feature = "arena",
    target_arch = "wasm32",
    not(target_feature = "atomics")
))]
#[global_allocator]
// 256 KiB: all a payments call allocates fits (none of it reached dlmalloc under callgrind),
// and it is small beside the 1 MiB stack every instance starts with.
static ALLOCATOR: arena::Arena<{ 256 << 10 }> = arena::Arena::new();

/// Re-exported so a connector needs no direct dependency for `json!` and `Value`.
pub use serde_json;

/// A connector: a stateless translator between MCP calls and one vendor's HTTP API.
///
/// The functions take no `self`: the host runs every tool call in a fresh instance, so
/// nothing survives between calls. One call's `interpret` may run in the instance its
/// `prepare` ran in, or in a fresh one: it must not rely on either. Match on the tool name and return
/// `Err(PrepareError::UnknownTool)` / `Err(InterpretError::UnknownTool)` for any other.
pub trait Connector {
    /// Describes the connector. Called once, when the host loads the component.
    fn manifest() -> Manifest;

    /// Turns a call into one request template. `arguments` has already been validated by
    /// the host against the tool's input schema.
    fn prepare(
        tool: &str,
        arguments: Arguments,
        connection: ConnectionFacts,
    ) -> Result<OutboundRequest, PrepareError>;

    /// Turns the vendor's response into MCP content. The host, not this function, decides
    /// whether the call succeeded: it classifies the status with the tool's EffectSpec.
    fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError>;
}

/// Exports a [`Connector`] as the component's implementation of the `connector` world.
///
/// Use it once, at the crate root: `obol_sdk::export!(MyConnector);`. Outside WebAssembly
/// it only checks that the type is a `Connector`, so native tests link no stray symbols.
#[macro_export]
macro_rules! export {
    ($connector:ty) => {
        #[cfg(target_arch = "wasm32")]
        // The generated export glue is unsafe by nature; the author's crate may deny it.
        #[allow(unsafe_code)]
        const _: () = {
            // The generated macro takes an identifier, not a type, hence the alias.
            type ObolAdapter = $crate::__private::Adapter<$connector>;
    $crate::bindings::__export_connector!(ObolAdapter with_types_in $crate::bindings);
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = $crate::__private::assert_connector::<$connector>();
    };
}

#[doc(hidden)]
pub mod __private {
    pub use crate::guest::Adapter;

    pub const fn assert_connector<T: crate::Connector>() {}
}

#[cfg(test)]
mod tests {
    use super::bindings::{self, Guest};
    use super::*;
    use serde_json::json;

    struct Echo;

    impl Connector for Echo {
        fn manifest() -> Manifest {
            Manifest::new("echo", "0.0.0").tool(Tool::new("say", EffectSpec::read()))
        }

        fn prepare(
            tool: &str,
            arguments: Arguments,
            connection: ConnectionFacts,
        ) -> Result<OutboundRequest, PrepareError> {
            if tool != "say" {
                return Err(PrepareError::UnknownTool);
            }
            let url = connection
                .url()
                .segment(connection.setting("room").unwrap_or("lobby"))
                .build()?;
            Ok(OutboundRequest::post(url).json(&json!({"said": arguments.required_str("text")?})))
        }

        fn interpret(tool: &str, response: VendorResponse) -> Result<ToolOutput, InterpretError> {
            match tool {
                "say" => Ok(ToolOutput::text(response.text()?).structured(response.json()?)),
                _ => Err(InterpretError::UnknownTool),
            }
        }
    }

    export!(Echo);

    fn facts() -> bindings::ConnectionFacts {
        bindings::ConnectionFacts {
            base_url: "http://h/".into(),
            settings: vec![("room".into(), "a b".into())],
        }
    }

    #[test]
    fn the_adapter_converts_a_whole_call() {
        let manifest = Adapter::manifest();
        assert_eq!(manifest.name, "echo");
        assert_eq!(manifest.tools[0].input_schema, r#"{"type":"object"}"#);

        // JSON text leaves the guest compact, escaped where JSON requires and nowhere else.
        let arguments = r#"{"text":"hi \"you\"\n\u00e9"}"#;
        let request = Adapter::prepare("say".into(), arguments.into(), facts()).unwrap();
        assert_eq!(request.url, "http://h/a%20b");
        assert_eq!(
            request.body.as_deref(),
            Some(r#"{"said":"hi \"you\"\né"}"#.as_bytes())
        );

        let output = Adapter::interpret(
            "say".into(),
            bindings::VendorResponse {
                status: 200,
                headers: vec![],
                body: br#"{"a": [1.5, "\u0001\/", {}]}"#.to_vec(),
            },
        )
        .unwrap();
        assert_eq!(
            output.structured.as_deref(),
            Some(r#"{"a":[1.5,"\u0001/",{}]}"#)
        );
    }

    #[test]
    fn the_adapter_refuses_bad_arguments_and_unknown_tools() {
        let invalid = Adapter::prepare("say".into(), "[]".into(), facts()).unwrap_err();
        assert!(
            matches!(invalid, bindings::PrepareError::InvalidArguments(m) if m.contains("JSON object"))
        );
        let missing = Adapter::prepare("say".into(), "{}".into(), facts()).unwrap_err();
        assert!(
            matches!(missing, bindings::PrepareError::InvalidArguments(m) if m.contains("`text`"))
        );
        let unknown = Adapter::prepare("other".into(), "{}".into(), facts()).unwrap_err();
        assert!(matches!(unknown, bindings::PrepareError::UnknownTool));
        let response = bindings::VendorResponse {
            status: 200,
            headers: vec![],
            body: b"not json".to_vec(),
        };
        let malformed = Adapter::interpret("say".into(), response).unwrap_err();
        assert!(matches!(
            malformed,
            bindings::InterpretError::MalformedResponse(_)
        ));
    }

    type Adapter = guest::Adapter<Echo>;
}

//! The outbound hop: the one place a request leaves the gateway.
//!
//! *Architecture Invariant:* the component proposes a request template; this module decides
//! whether it may be sent. The URL must stay on the connection's origin, host-owned headers
//! cannot be set by the guest, credentials are added here and only here (marked sensitive),
//! redirects are never followed, and the response body is capped while it streams in.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header::{ACCEPT, CONTENT_LENGTH};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::CertificateDer;

use crate::catalog::{HOST_OWNED_HEADERS, Propagation};
use crate::config::{BaseUrl, OutboundConfig, SecretRef, SecretSource};
use crate::error::ObolError;
use crate::listener::lanes;
use crate::runtime::wit;

/// A request that passed every check and carries everything the host adds.
#[derive(Debug, Clone)]
pub struct Prepared {
    method: Method,
    url: reqwest::Url,
    /// The same URL as the HTTP client takes it.
    uri: Uri,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
}

impl Prepared {
    /// Checks a guest's request template against the connection and adds the host's parts:
    /// the idempotency key (as the EffectSpec propagates it) and the credential.
    pub fn new(
        template: wit::OutboundRequest,
        base_url: &BaseUrl,
        propagation: &Propagation,
        idempotency_key: Option<&str>,
        secret: Option<&SecretRef>,
        broker: Option<&crate::broker::Profile>,
    ) -> Result<Prepared, ObolError> {
        let url = base_url.parse_request_url(&template.url).map_err(|_| {
            ObolError::InvalidOutboundRequest("the request URL does not parse".into())
        })?;
        if url.origin() != base_url.url().origin()
            || !url.username().is_empty()
            || url.password().is_some()
        {
            return Err(ObolError::EgressDenied);
        }
        let method = match template.method {
            wit::Method::Get => Method::GET,
            wit::Method::Post => Method::POST,
            wit::Method::Put => Method::PUT,
            wit::Method::Patch => Method::PATCH,
            wit::Method::Delete => Method::DELETE,
        };
        let mut headers = HeaderMap::new();
        for header in template.headers {
            let name = HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| {
                ObolError::InvalidOutboundRequest(format!("invalid header name {:?}", header.name))
            })?;
            let reserved_by_spec = matches!(propagation, Propagation::Header(p) if *p == name);
            let reserved_by_secret =
                secret.is_some_and(|s| s.header.eq_ignore_ascii_case(name.as_str()));
            if HOST_OWNED_HEADERS.contains(&name.as_str()) || reserved_by_spec || reserved_by_secret
            {
                return Err(ObolError::InvalidOutboundRequest(format!(
                    "header {name} is set by the gateway, not the connector"
                )));
            }
            let value = HeaderValue::from_str(&header.value).map_err(|_| {
                ObolError::InvalidOutboundRequest(format!("invalid value for header {name}"))
            })?;
            headers.append(name, value);
        }
        // A key propagated in the credential's header would be overwritten by the credential:
        // the vendor would never see it, while the gateway counted on its deduplication.
        if let (Propagation::Header(name), Some(secret)) = (propagation, secret)
            && secret.header.eq_ignore_ascii_case(name.as_str())
        {
            return Err(ObolError::InvalidOutboundRequest(format!(
                "the tool propagates the idempotency key in {name}, which carries the connection's credential"
            )));
        }
        let mut body = template.body;
        if let Some(key) = idempotency_key {
            match propagation {
                Propagation::Header(name) => {
                    let value = HeaderValue::from_str(key).map_err(|_| ObolError::Internal)?;
                    headers.insert(name.clone(), value);
                }
                Propagation::BodyField(pointer) => {
                    let mut json: serde_json::Value = body
                        .as_deref()
                        .and_then(|b| serde_json::from_slice(b).ok())
                        .ok_or_else(|| {
                            ObolError::InvalidOutboundRequest(format!(
                                "the tool propagates the idempotency key in body field {}, but the body is not JSON",
                                pointer.as_str()
                            ))
                        })?;
                    pointer
                        .set(&mut json, key.into())
                        .map_err(ObolError::InvalidOutboundRequest)?;
                    body = Some(serde_json::to_vec(&json).map_err(|_| ObolError::Internal)?);
                }
                Propagation::None | Propagation::Unsupported => {}
            }
        }
        if let Some(secret) = secret {
            let (name, value) = credential_header(secret)?;
            headers.insert(name, value);
        }
        // Last, over anything the component set: the broker must not retry on its own.
        if let Some(profile) = broker {
            profile
                .apply(&mut headers, &mut body)
                .map_err(ObolError::InvalidOutboundRequest)?;
        }
        let uri = Uri::try_from(url.as_str()).map_err(|_| {
            ObolError::InvalidOutboundRequest("the request URL does not parse".into())
        })?;
        Ok(Prepared {
            method,
            url,
            uri,
            headers,
            body,
        })
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// `scheme://host:port` of the destination (non-secret: query strings are left out).
    pub fn origin(&self) -> String {
        origin_of(&self.url)
    }
}

/// `url`'s origin as `Url::origin` serialises it: the port only when it is not the scheme's
/// default. Built from the parsed URL's own parts for http and https, the schemes a
/// connection has, not through `origin()`'s copies of them and its `format!`.
fn origin_of(url: &reqwest::Url) -> String {
    let (scheme, Some(host)) = (url.scheme(), url.host_str()) else {
        return url.origin().ascii_serialization();
    };
    if scheme != "http" && scheme != "https" {
        return url.origin().ascii_serialization();
    }
    let mut origin = String::with_capacity(scheme.len() + 3 + host.len() + 6);
    origin.push_str(scheme);
    origin.push_str("://");
    origin.push_str(host);
    if let Some(port) = url.port() {
        origin.push(':');
        origin.push_str(&port.to_string());
    }
    origin
}

/// Reads the credential and renders it as a sensitive header. Read per call, so rotating a
/// file or variable takes effect without a restart; the value never enters an error.
pub(crate) fn credential_header(
    secret: &SecretRef,
) -> Result<(HeaderName, HeaderValue), ObolError> {
    let raw = match &secret.source {
        SecretSource::Env(var) => std::env::var(var).ok(),
        SecretSource::File(path) => std::fs::read_to_string(path).ok(),
    };
    let Some(raw) = raw.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) else {
        tracing::warn!(source = ?secret_label(secret), "connection credential is unavailable");
        return Err(ObolError::CredentialUnavailable);
    };
    let text = match &secret.scheme {
        Some(scheme) => format!("{scheme} {raw}"),
        None => raw,
    };
    let name = HeaderName::from_bytes(secret.header.as_bytes())
        .map_err(|_| ObolError::CredentialUnavailable)?;
    let mut value = HeaderValue::from_str(&text).map_err(|_| ObolError::CredentialUnavailable)?;
    value.set_sensitive(true);
    Ok((name, value))
}

/// Names where a secret lives without revealing it.
fn secret_label(secret: &SecretRef) -> String {
    match &secret.source {
        SecretSource::Env(var) => format!("env:{var}"),
        SecretSource::File(path) => format!("file:{}", path.display()),
    }
}

/// What came back from the vendor.
#[derive(Debug)]
pub struct VendorReply {
    pub status: u16,
    pub headers: Vec<wit::Header>,
    pub body: Vec<u8>,
}

/// How an attempt ended, in the terms the retry rules need.
#[derive(Debug)]
pub enum AttemptOutcome {
    Responded(VendorReply),
    /// Provably nothing was sent (e.g. connection refused).
    NotSent,
    /// The request may have reached the vendor; its effect is unknown.
    SentNoReply,
    /// The vendor answered with more than the cap allows.
    TooLarge {
        status: u16,
    },
}

/// The client a vendor is reached with: hyper-util's pooled client over TCP or TLS. Not
/// reqwest (which the MCP upstreams keep): its layers parse the URL twice more on every
/// request and run proxy and redirect machinery the vendor hop refuses anyway (ADR-0076).
type VendorClient = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Which certificates a vendor's TLS certificate may chain to.
#[derive(Debug, Clone)]
pub(crate) enum Trust {
    /// The system's roots, read the way the platform's own clients read them.
    System,
    /// The system's roots and these (the tests' own certificate authority).
    #[cfg_attr(not(test), allow(dead_code))]
    SystemAnd(Vec<CertificateDer<'static>>),
}

/// The HTTP clients every vendor is reached with.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// A client for each lane, then one for callers off the lanes. A pooled connection is
    /// driven by the runtime that opened it: a call reusing a connection another lane opened
    /// would hand its request and the reply across threads (ADR-0060).
    clients: Arc<[VendorClient]>,
    /// From the request's start to its response's last byte, connecting included.
    request_timeout: Duration,
    max_response_bytes: usize,
}

/// The egress rules the MCP upstreams' client follows; the vendor hop's own client
/// ([`vendor_client`]) follows the same ones.
fn egress(config: &OutboundConfig) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        // A redirect could leave the connection's origin after the check above.
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(config.connect_timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        // The outbound hop must not pick up proxies from the environment: that would
        // route vendor credentials through a host the operator did not name.
        .no_proxy()
}

/// How long an idle connection to a vendor or upstream is kept for the next call.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// TCP keepalive on vendor connections, as reqwest sets it: a vendor that vanished without
/// closing is noticed on an idle pooled connection instead of on the next call's request.
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// A vendor client with the egress rules. hyper-util's client follows no redirects and reads
/// no proxy settings from the environment by construction; the connect deadline is the
/// connector's, the request deadline [`Outbound::send`]'s.
fn vendor_client(config: &OutboundConfig, tls: &rustls::ClientConfig) -> VendorClient {
    let mut tcp = HttpConnector::new();
    // The TLS layer below takes https URLs; plain http ones pass through it.
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(config.connect_timeout));
    tcp.set_nodelay(true);
    tcp.set_keepalive(Some(TCP_KEEPALIVE));
    tcp.set_keepalive_interval(Some(TCP_KEEPALIVE));
    tcp.set_keepalive_retries(Some(3));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(tcp);
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .build(connector)
}

/// The TLS settings of every vendor connection: rustls with its aws-lc-rs provider (as
/// reqwest builds it for the upstreams), certificates checked by the platform verifier.
fn tls_config(trust: Trust) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = match trust {
        Trust::System => rustls_platform_verifier::Verifier::new(provider.clone())?,
        Trust::SystemAnd(roots) => {
            rustls_platform_verifier::Verifier::new_with_extra_roots(roots, provider.clone())?
        }
    };
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// The client MCP upstreams are reached on: the same egress rules, with a deadline between
/// reads rather than on the whole response, since an upstream's event stream stays open.
/// Each call still has its deadline (the pool's); response sizes are capped by rmcp's limits.
pub fn streaming_client(config: &OutboundConfig) -> anyhow::Result<reqwest::Client> {
    Ok(egress(config)
        .read_timeout(config.request_timeout)
        .build()?)
}

impl Outbound {
    pub fn new(config: &OutboundConfig) -> anyhow::Result<Outbound> {
        Outbound::for_lanes(config, lanes::count(), Trust::System)
    }

    pub(crate) fn for_lanes(
        config: &OutboundConfig,
        lanes: usize,
        trust: Trust,
    ) -> anyhow::Result<Outbound> {
        let tls = tls_config(trust)?;
        let clients = (0..=lanes).map(|_| vendor_client(config, &tls)).collect();
        Ok(Outbound {
            clients,
            request_timeout: config.request_timeout,
            max_response_bytes: config.max_response_bytes,
        })
    }

    /// The calling lane's client, whose pooled connections that lane drives.
    fn client(&self) -> &VendorClient {
        let own = lanes::current().map_or(0, |lane| lane + 1);
        self.clients.get(own).unwrap_or(&self.clients[0])
    }

    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// Sends exactly one attempt. A deadline that passes after the connection was made may
    /// have let the request through, so it is `SentNoReply`; a connection that could not be
    /// made (refused, its own deadline, a TLS handshake that failed) is `NotSent`.
    pub async fn send(&self, request: Prepared) -> AttemptOutcome {
        tokio::time::timeout(self.request_timeout, self.attempt(request))
            .await
            .unwrap_or(AttemptOutcome::SentNoReply)
    }

    async fn attempt(&self, prepared: Prepared) -> AttemptOutcome {
        let mut request = Request::new(Full::new(
            prepared.body.map_or_else(Bytes::new, Bytes::from),
        ));
        *request.method_mut() = prepared.method;
        *request.uri_mut() = prepared.uri;
        *request.headers_mut() = prepared.headers;
        // What reqwest sent by default, kept: some vendors' front ends refuse a request
        // without an Accept header.
        request
            .headers_mut()
            .entry(ACCEPT)
            .or_insert(HeaderValue::from_static("*/*"));
        let response = match self.client().request(request).await {
            Ok(response) => response,
            Err(error) if error.is_connect() => {
                // The operator's one clue to a vendor that is down or whose certificate the
                // gateway does not trust (the caller sees only `upstream_unreachable`).
                tracing::warn!(
                    origin = %prepared.url.origin().ascii_serialization(),
                    "could not connect to the vendor, nothing was sent: {}",
                    causes(&error)
                );
                return AttemptOutcome::NotSent;
            }
            Err(_) => return AttemptOutcome::SentNoReply,
        };
        let status = response.status().as_u16();
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|len| len.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.max_response_bytes as u64) {
            return AttemptOutcome::TooLarge { status };
        }
        let headers = component_headers(response.headers());
        let mut incoming = response.into_body();
        let mut body = Vec::new();
        while let Some(frame) = incoming.frame().await {
            let Ok(frame) = frame else {
                return AttemptOutcome::SentNoReply;
            };
            // Trailers are not part of the answer a component gets.
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            if body.len() + chunk.len() > self.max_response_bytes {
                return AttemptOutcome::TooLarge { status };
            }
            body.extend_from_slice(&chunk);
        }
        AttemptOutcome::Responded(VendorReply {
            status,
            headers,
            body,
        })
    }
}

/// An error and what caused it, outermost first: hyper's own message says only "client
/// error (Connect)"; the cause says refused, timed out, or which certificate check failed.
/// Neither holds the request's headers, so no credential.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}

/// A vendor's response headers as the component gets them: in the map's order (each name's
/// values together, at its first place), without the names [`reaches_the_component`] keeps
/// out or values that are not visible ASCII (the WIT contract's header values are strings).
/// `obol harness` feeds a test's or fixture's headers through here too, so a connector's
/// tests see what its calls will.
pub(crate) fn component_headers(headers: &HeaderMap) -> Vec<wit::Header> {
    headers
        .iter()
        .filter(|(name, _)| reaches_the_component(name))
        .filter_map(|(name, value)| {
            Some(wit::Header {
                name: name.as_str().to_owned(),
                value: value.to_str().ok()?.to_owned(),
            })
        })
        .collect()
}

/// Whether a vendor's response header is passed to the component (the SDK's
/// `VendorResponse` documents the rule for connector authors). Cookies are sessions, a secret
/// the component must not hold. Hop-by-hop headers describe the gateway's own connection to
/// the vendor, not the answer (RFC 9110, 7.6.1, and `Trailer`, whose fields the component
/// never gets), and each header passed is two strings copied into the guest on every call.
/// A fixed list: names a `Connection` header lists are not parsed, so a vendor cannot hide a
/// header a connector needs by naming it there.
fn reaches_the_component(name: &HeaderName) -> bool {
    const HOP_BY_HOP: [&str; 7] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    let name = name.as_str();
    !name.starts_with("set-cookie") && !HOP_BY_HOP.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Propagation;
    use crate::listener::lanes::Lanes;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{mpsc, oneshot};

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        #![proptest_config(crate::properties::config())]

        /// A request's origin is pinned in its claim's fingerprint: it is spelled as the url
        /// crate spells it, whatever the host's form and the port.
        #[test]
        fn origins_are_spelled_as_the_url_crate_spells_them(
            scheme in proptest::sample::select(vec!["http", "https", "HTTP", "ftp", "ws"]),
            host in proptest::prop_oneof![
                "[a-zA-Z0-9-]{1,12}(\\.[a-z]{2,5}){0,2}",
                proptest::prelude::any::<[u8; 4]>()
                    .prop_map(|b| std::net::Ipv4Addr::from(b).to_string()),
                proptest::prelude::any::<[u16; 8]>()
                    .prop_map(|w| format!("[{}]", std::net::Ipv6Addr::from(w))),
                proptest::prelude::Just("xn--bcher-kva.example".to_owned()),
                proptest::prelude::Just("Bücher.example".to_owned()),
            ],
            port in proptest::option::of(proptest::prop_oneof![
                proptest::prelude::Just(80u16),
                proptest::prelude::Just(443u16),
                proptest::prelude::any::<u16>(),
            ]),
        ) {
            let port = port.map(|port| format!(":{port}")).unwrap_or_default();
            let Ok(url) = reqwest::Url::parse(&format!("{scheme}://{host}{port}/v1/x?q=1")) else {
                return Ok(());
            };
            proptest::prop_assert_eq!(origin_of(&url), url.origin().ascii_serialization());
        }
    }

    /// A vendor on loopback that answers every request on a kept-alive connection and reports
    /// the client port of the connection each request came on.
    async fn vendor() -> (BaseUrl, mpsc::UnboundedReceiver<u16>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base =
            BaseUrl::parse(&format!("http://{}/api", listener.local_addr().unwrap())).unwrap();
        let (report, reported) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, peer)) = listener.accept().await {
                let report = report.clone();
                tokio::spawn(async move {
                    let mut pending = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while let Ok(n @ 1..) = socket.read(&mut buffer).await {
                        pending.extend_from_slice(&buffer[..n]);
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            pending.drain(..end + 4);
                            let _ = report.send(peer.port());
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if socket.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (base, reported)
    }

    #[tokio::test]
    async fn each_lane_reuses_the_vendor_connections_it_opened() {
        let (base, mut ports) = vendor().await;
        let config = test_config();
        let outbound = Outbound::for_lanes(&config, 2, Trust::System).unwrap();
        let lanes = Lanes::with(2).unwrap();
        // Two requests in turn on one lane, which the first connection holds; then two on
        // the other lane, while the first lane's connection sits idle in a pool.
        let mut holds = Vec::new();
        for _ in 0..2 {
            let (done, finished) = oneshot::channel();
            let (hold, held) = oneshot::channel::<()>();
            let (outbound, base) = (outbound.clone(), base.clone());
            lanes.serve(async move {
                for _ in 0..2 {
                    let request = wit::OutboundRequest {
                        method: wit::Method::Get,
                        url: format!("{}/x", base.url().as_str().trim_end_matches('/')),
                        headers: Vec::new(),
                        body: None,
                    };
                    let prepared =
                        Prepared::new(request, &base, &Propagation::None, None, None, None)
                            .unwrap();
                    let outcome = outbound.send(prepared).await;
                    assert!(
                        matches!(outcome, AttemptOutcome::Responded(_)),
                        "{outcome:?}"
                    );
                }
                let _ = done.send(());
                let _ = held.await;
            });
            finished.await.unwrap();
            holds.push(hold);
        }
        let ports: Vec<u16> = (0..4).map(|_| ports.try_recv().unwrap()).collect();
        assert_eq!(ports[0], ports[1], "a lane opened a second connection");
        assert_eq!(ports[2], ports[3], "a lane opened a second connection");
        assert_ne!(
            ports[0], ports[2],
            "the second lane reused the connection the first lane opened and drives"
        );
    }

    /// Cookies are sessions, and hop-by-hop headers describe the gateway's connection to the
    /// vendor: neither reaches the component; the vendor's own headers do.
    #[tokio::test]
    async fn the_component_sees_the_vendors_headers_but_not_cookies_or_hop_by_hop_ones() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base =
            BaseUrl::parse(&format!("http://{}/api", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let Ok(n @ 1..) = socket.read(&mut buffer).await else {
                    return;
                };
                request.extend_from_slice(&buffer[..n]);
            }
            let answer = "HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\n\
                          set-cookie: session=s3cr3t\r\nrequest-id: req_1\r\n\
                          proxy-connection: keep-alive\r\ncontent-type: application/json\r\n\
                          transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
            socket.write_all(answer.as_bytes()).await.unwrap();
            let _ = socket.read(&mut buffer).await;
        });
        let config = test_config();
        let outbound = Outbound::for_lanes(&config, 1, Trust::System).unwrap();
        let lanes = Lanes::with(1).unwrap();
        let (done, outcome) = oneshot::channel();
        lanes.serve(async move {
            let request = wit::OutboundRequest {
                method: wit::Method::Get,
                url: format!("{}/x", base.url().as_str().trim_end_matches('/')),
                headers: Vec::new(),
                body: None,
            };
            let prepared =
                Prepared::new(request, &base, &Propagation::None, None, None, None).unwrap();
            let _ = done.send(outbound.send(prepared).await);
        });
        let AttemptOutcome::Responded(reply) = outcome.await.unwrap() else {
            panic!("the vendor's answer was not read");
        };
        let mut names: Vec<&str> = reply.headers.iter().map(|h| h.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "request-id"]);
        assert_eq!(reply.body, b"{}");
    }

    /// A vendor on loopback that speaks HTTPS with a certificate for 127.0.0.1 issued by the
    /// tests' own certificate authority (tests/fixtures/tls/, valid for a century), and
    /// reports the head of every request it reads.
    async fn tls_vendor() -> (BaseUrl, mpsc::UnboundedReceiver<String>) {
        let acceptor = tls_acceptor(Vec::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base =
            BaseUrl::parse(&format!("https://{}/api", listener.local_addr().unwrap())).unwrap();
        let (report, reported) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, report) = (acceptor.clone(), report.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let mut pending = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while let Ok(n @ 1..) = tls.read(&mut buffer).await {
                        pending.extend_from_slice(&buffer[..n]);
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = pending.drain(..end + 4).collect();
                            let _ = report.send(String::from_utf8_lossy(&head).into_owned());
                            let answer =
                                b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n{\"tls\":true}";
                            if tls.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (base, reported)
    }

    /// The TLS side of the tests' HTTPS vendors, offering `alpn` in the handshake.
    fn tls_acceptor(alpn: Vec<Vec<u8>>) -> tokio_rustls::TlsAcceptor {
        use rustls::pki_types::PrivateKeyDer;
        let chain = vec![
            CertificateDer::from_pem_slice(include_bytes!(
                "../../../tests/fixtures/tls/vendor.pem"
            ))
            .unwrap(),
        ];
        let key = PrivateKeyDer::from_pem_slice(include_bytes!(
            "../../../tests/fixtures/tls/vendor-key.pem"
        ))
        .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = alpn;
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    /// An HTTPS vendor that speaks only HTTP/2 (offered by ALPN, as vendors' front ends do)
    /// and reports the version of every request it serves.
    async fn h2_vendor() -> (BaseUrl, mpsc::UnboundedReceiver<axum::http::Version>) {
        let acceptor = tls_acceptor(vec![b"h2".to_vec()]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base =
            BaseUrl::parse(&format!("https://{}/api", listener.local_addr().unwrap())).unwrap();
        let (report, reported) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, report) = (acceptor.clone(), report.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request: Request<_>| {
                        let _ = report.send(request.version());
                        async {
                            Ok::<_, std::convert::Infallible>(axum::http::Response::new(Full::new(
                                Bytes::from_static(b"{\"h2\":true}"),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        (base, reported)
    }

    /// The system's roots and the tests' own authority, which issued the HTTPS vendors'.
    fn tests_authority() -> Trust {
        let ca =
            CertificateDer::from_pem_slice(include_bytes!("../../../tests/fixtures/tls/ca.pem"))
                .unwrap();
        Trust::SystemAnd(vec![ca])
    }

    fn test_config() -> OutboundConfig {
        OutboundConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            max_response_bytes: 1 << 20,
            upstream_list_timeout: Duration::from_secs(5),
        }
    }

    /// One attempt at `GET {base}/x` from a client that trusts `trust`.
    async fn get(base: &BaseUrl, trust: Trust) -> AttemptOutcome {
        let outbound = Outbound::for_lanes(&test_config(), 1, trust).unwrap();
        let request = wit::OutboundRequest {
            method: wit::Method::Get,
            url: format!("{}/x", base.url().as_str().trim_end_matches('/')),
            headers: Vec::new(),
            body: None,
        };
        let prepared = Prepared::new(request, base, &Propagation::None, None, None, None).unwrap();
        outbound.send(prepared).await
    }

    #[tokio::test]
    async fn a_vendor_on_https_is_reached_when_its_certificate_chains_to_a_trusted_root() {
        let (base, mut heads) = tls_vendor().await;
        let outcome = get(&base, tests_authority()).await;
        let AttemptOutcome::Responded(reply) = outcome else {
            panic!("the HTTPS vendor's answer was not read: {outcome:?}");
        };
        assert_eq!(
            (reply.status, reply.body.as_slice()),
            (200, &b"{\"tls\":true}"[..])
        );
        let head = heads.try_recv().unwrap();
        assert!(head.starts_with("GET /api/x HTTP/1.1\r\n"), "{head}");
        let host = format!("host: {}\r\n", base.url().authority());
        assert!(head.to_ascii_lowercase().contains(&host), "{head}");
    }

    /// A vendor that offers HTTP/2 in the handshake is spoken to in HTTP/2, as reqwest did.
    #[tokio::test]
    async fn a_vendor_offering_http2_is_spoken_to_in_http2() {
        let (base, mut versions) = h2_vendor().await;
        let outcome = get(&base, tests_authority()).await;
        let AttemptOutcome::Responded(reply) = outcome else {
            panic!("the HTTP/2 vendor's answer was not read: {outcome:?}");
        };
        assert_eq!(
            (reply.status, reply.body.as_slice()),
            (200, &b"{\"h2\":true}"[..])
        );
        assert_eq!(versions.try_recv().unwrap(), axum::http::Version::HTTP_2);
    }

    /// A certificate no trusted root vouches for fails the handshake: nothing was sent, so
    /// the attempt is `NotSent` (the key stays reusable, nothing is counted as an attempt).
    #[tokio::test]
    async fn a_vendor_whose_certificate_no_root_vouches_for_gets_no_request() {
        let (base, mut heads) = tls_vendor().await;
        let outcome = get(&base, Trust::System).await;
        assert!(matches!(outcome, AttemptOutcome::NotSent), "{outcome:?}");
        assert!(heads.try_recv().is_err(), "the vendor read a request");
    }

    fn template(url: &str, headers: &[(&str, &str)], body: Option<&str>) -> wit::OutboundRequest {
        wit::OutboundRequest {
            method: wit::Method::Post,
            url: url.into(),
            headers: headers
                .iter()
                .map(|(n, v)| wit::Header {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
            body: body.map(|b| b.as_bytes().to_vec()),
        }
    }

    fn base() -> BaseUrl {
        BaseUrl::parse("http://127.0.0.1:4242/api").unwrap()
    }

    #[test]
    fn only_the_connection_origin_is_reachable() {
        for foreign in [
            "http://127.0.0.1:4243/api/x",
            "https://127.0.0.1:4242/api/x",
            "http://localhost:4242/api/x",
            "http://203.0.113.7/steal",
            "http://user:pw@127.0.0.1:4242/api/x",
        ] {
            let result = Prepared::new(
                template(foreign, &[], None),
                &base(),
                &Propagation::None,
                None,
                None,
                None,
            );
            assert_eq!(result.unwrap_err(), ObolError::EgressDenied, "{foreign}");
        }
        let same = Prepared::new(
            template("http://127.0.0.1:4242/other/path?q=1", &[], None),
            &base(),
            &Propagation::None,
            None,
            None,
            None,
        );
        assert!(same.is_ok());
    }

    #[test]
    fn host_owned_headers_cannot_be_set_by_the_guest() {
        let propagation = Propagation::Header(HeaderName::from_static("idempotency-key"));
        for header in [
            "Authorization",
            "cookie",
            "Host",
            "Idempotency-Key",
            "x-obol-upstream-authorization",
        ] {
            let result = Prepared::new(
                template("http://127.0.0.1:4242/api", &[(header, "x")], None),
                &base(),
                &propagation,
                Some("idt_k"),
                None,
                None,
            );
            assert!(
                matches!(result, Err(ObolError::InvalidOutboundRequest(_))),
                "{header}: {result:?}"
            );
        }
    }

    #[test]
    fn the_key_is_propagated_exactly_as_declared() {
        let url = "http://127.0.0.1:4242/api";
        let header = Propagation::Header(HeaderName::from_static("idempotency-key"));
        let prepared = Prepared::new(
            template(url, &[], None),
            &base(),
            &header,
            Some("idt_abc"),
            None,
            None,
        )
        .unwrap();
        assert_eq!(prepared.headers["idempotency-key"], "idt_abc");

        let body_field =
            Propagation::BodyField(crate::catalog::JsonPointer::parse("/meta/key").unwrap());
        let prepared = Prepared::new(
            template(url, &[], Some(r#"{"a":1}"#)),
            &base(),
            &body_field,
            Some("idt_abc"),
            None,
            None,
        )
        .unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(prepared.body.as_ref().unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"a": 1, "meta": {"key": "idt_abc"}})
        );

        for silent in [Propagation::None, Propagation::Unsupported] {
            let prepared = Prepared::new(
                template(url, &[], None),
                &base(),
                &silent,
                Some("idt_abc"),
                None,
                None,
            )
            .unwrap();
            assert!(prepared.headers.is_empty(), "{silent:?}");
        }
    }

    #[test]
    fn credentials_are_sensitive_and_never_in_errors() {
        // A variable nothing sets: the credential is unavailable.
        let var = "OBOL_TEST_SECRET_NEVER_SET";
        let secret = SecretRef {
            source: SecretSource::Env(var.into()),
            header: "Authorization".into(),
            scheme: Some("Bearer".into()),
        };
        let missing = Prepared::new(
            template("http://127.0.0.1:4242/api", &[], None),
            &base(),
            &Propagation::None,
            None,
            Some(&secret),
            None,
        );
        assert_eq!(missing.unwrap_err(), ObolError::CredentialUnavailable);

        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "sk_live_hidden\n").unwrap();
        let secret = SecretRef {
            source: SecretSource::File(file.path().to_owned()),
            header: "Authorization".into(),
            scheme: Some("Bearer".into()),
        };
        let prepared = Prepared::new(
            template("http://127.0.0.1:4242/api", &[], None),
            &base(),
            &Propagation::None,
            None,
            Some(&secret),
            None,
        )
        .unwrap();
        let value = &prepared.headers["authorization"];
        assert_eq!(value, "Bearer sk_live_hidden");
        assert!(value.is_sensitive());
        assert!(!format!("{prepared:?}").contains("sk_live_hidden"));
    }
}

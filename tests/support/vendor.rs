//! A mock vendor: a real HTTP server on loopback that records every request and answers
//! from a script, so a test can assert exactly what the vendor saw.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One request as the vendor received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body: body.to_string().into_bytes(),
            delay: Duration::ZERO,
        }
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct Script {
    seen: Vec<Seen>,
    replies: HashMap<String, Reply>,
}

#[derive(Clone)]
pub struct MockVendor {
    pub address: SocketAddr,
    /// `http`, or `https` for [`MockVendor::start_tls`].
    scheme: &'static str,
    script: Arc<Mutex<Script>>,
}

impl MockVendor {
    pub async fn start() -> MockVendor {
        let (script, app, listener, address) = MockVendor::listening().await;
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        MockVendor {
            address,
            scheme: "http",
            script,
        }
    }

    /// The same vendor over HTTPS, with a certificate for 127.0.0.1 issued by the tests' own
    /// certificate authority (`tests/fixtures/tls/ca.pem`), which no system trusts.
    pub async fn start_tls() -> MockVendor {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = vec![
            CertificateDer::from_pem_slice(include_bytes!("../fixtures/tls/vendor.pem")).unwrap(),
        ];
        let key = PrivateKeyDer::from_pem_slice(include_bytes!("../fixtures/tls/vendor-key.pem"))
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let (script, app, listener, address) = MockVendor::listening().await;
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here, before any request.
                    let Ok(stream) = acceptor.accept(socket).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        MockVendor {
            address,
            scheme: "https",
            script,
        }
    }

    /// A script, the app answering from it, and a listener on loopback for it.
    async fn listening() -> (
        Arc<Mutex<Script>>,
        Router,
        tokio::net::TcpListener,
        SocketAddr,
    ) {
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        (script, app, listener, address)
    }

    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.address)
    }

    /// Answer requests to `path` with `reply` from now on.
    pub fn on(&self, path: &str, reply: Reply) {
        self.script
            .lock()
            .unwrap()
            .replies
            .insert(path.to_owned(), reply);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }

    pub fn count(&self, path: &str) -> usize {
        self.seen().iter().filter(|s| s.path == path).count()
    }
}

async fn answer(
    State(script): State<Arc<Mutex<Script>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let seen = Seen {
        method: method.to_string(),
        path: path.clone(),
        query: uri.query().unwrap_or_default().to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body: body.to_vec(),
    };
    let scripted = {
        let mut script = script.lock().unwrap();
        script.seen.push(seen.clone());
        script.replies.get(&path).cloned()
    };
    let reply = scripted.unwrap_or_else(|| default_reply(&seen));
    tokio::time::sleep(reply.delay).await;
    let status = StatusCode::from_u16(reply.status).unwrap();
    (status, [("content-type", "application/json")], reply.body).into_response()
}

/// Plausible vendor answers for the first-party connectors' routes.
fn default_reply(seen: &Seen) -> Reply {
    let path = seen.path.as_str();
    if path == "/v1/refunds" {
        return Reply::json(
            200,
            json!({"id": "re_mock1", "object": "refund", "amount": 500, "charge": "ch_mock", "currency": "usd", "status": "succeeded"}),
        );
    }
    if path == "/v1/charges" {
        return Reply::json(
            200,
            json!({"object": "list", "has_more": false, "data": [
                {"id": "ch_1", "object": "charge", "amount": 1000, "currency": "usd", "status": "succeeded"},
                {"id": "ch_2", "object": "charge", "amount": 2000, "currency": "usd", "status": "succeeded"}
            ]}),
        );
    }
    if path.contains("/issues/") && seen.method == "GET" {
        return Reply::json(
            200,
            json!({"number": 7, "title": "Crash on start", "state": "open", "url": "https://tracker.example/o/r/issues/7", "html_url": "https://tracker.example/o/r/issues/7"}),
        );
    }
    if path.ends_with("/issues") {
        return Reply::json(
            201,
            json!({"number": 8, "title": "New", "state": "open", "url": "https://tracker.example/o/r/issues/8", "html_url": "https://tracker.example/o/r/issues/8"}),
        );
    }
    // `/echo`, `/peek` and anything else: echo the body back.
    let body = if seen.body.is_empty() {
        b"{}".to_vec()
    } else {
        seen.body.clone()
    };
    Reply {
        status: 200,
        body,
        delay: Duration::ZERO,
    }
}

/// One step of a [`ScriptedVendor`].
#[derive(Debug, Clone)]
pub enum Step {
    /// Answer the next request with this status and JSON body, after `delay`.
    Answer {
        status: u16,
        body: Value,
        delay: Duration,
    },
    /// Stop listening: every later connection is refused, so provably nothing more is sent.
    Close,
}

impl Step {
    pub fn answer(status: u16, body: Value) -> Step {
        Step::Answer {
            status,
            body,
            delay: Duration::ZERO,
        }
    }
}

/// A vendor on loopback that follows a script, one step per request, and counts every
/// request it read. Each answer closes its connection, so the next request connects anew
/// (and is refused once the script says `Close`). After the script, requests get 200 `{}`.
#[derive(Clone)]
pub struct ScriptedVendor {
    pub address: SocketAddr,
    received: Arc<std::sync::atomic::AtomicUsize>,
}

impl ScriptedVendor {
    pub async fn start(script: Vec<Step>) -> ScriptedVendor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let vendor = ScriptedVendor {
            address: listener.local_addr().unwrap(),
            received: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        };
        vendor.serve(listener, script);
        vendor
    }

    /// Listens again on the same address (after a `Close`), following `script`.
    pub async fn reopen(&self, script: Vec<Step>) {
        let listener = tokio::net::TcpListener::bind(self.address).await.unwrap();
        self.serve(listener, script);
    }

    fn serve(&self, listener: tokio::net::TcpListener, script: Vec<Step>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let counter = Arc::clone(&self.received);
        tokio::spawn(async move {
            let mut steps = script.into_iter();
            loop {
                let step = steps.next().unwrap_or(Step::answer(200, json!({})));
                let (status, body, delay) = match step {
                    Step::Close => return,
                    Step::Answer {
                        status,
                        body,
                        delay,
                    } => (status, body, delay),
                };
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                // Read the head and the declared body, then count the request as received.
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = body.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// How many requests reached the vendor.
    pub fn received(&self) -> usize {
        self.received.load(std::sync::atomic::Ordering::SeqCst)
    }
}

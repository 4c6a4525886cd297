//! A deliberately small HTTP/1.1 server for `/metrics` and the read-only web page: GET and HEAD only, a bounded
//! number of connections, bounded time to send headers, to answer and to stay connected. It is not the gRPC port:
//! nothing here authenticates, so nothing here may change state or show a secret (scripts, environments, keys).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Connections served at once; more are closed at accept. A dashboard and a Prometheus or two need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections one peer address may hold at once: a client that opens many and sends nothing (slowloris) takes at
/// most this many of the slots, and the dashboard and Prometheus on other hosts keep theirs.
pub const MAX_CONNECTIONS_PER_PEER: usize = 8;
/// A client that has not sent its request headers after this long is disconnected (slowloris). Prometheus and a
/// browser send theirs at once.
pub const HEADER_READ_TIMEOUT_MS: u64 = 2_000;
/// A handler that has not answered after this long gets a 503 (a replica stuck on a lock must not pile up calls).
pub const RESPONSE_TIMEOUT_MS: u64 = 10_000;
/// A keep-alive connection is closed after this long, whatever it does, so none holds a slot forever.
pub const CONNECTION_LIFETIME_MS: u64 = 120_000;
/// Longer request targets are refused: every route here is short.
pub const MAX_TARGET_BYTES: usize = 2_048;

/// What a handler sees of a request: only GETs reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub path: String,
    /// The raw query string, without `?` (empty when none).
    pub query: String,
}

impl Request {
    /// The value of `name` in the query string (`?job=12`), undecoded: the routes take numbers and names only.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.split('&').filter_map(|pair| pair.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Bytes,
}

impl Response {
    pub fn ok(content_type: &'static str, body: impl Into<Bytes>) -> Response {
        Response { status: 200, content_type, body: body.into() }
    }

    pub fn json(body: impl Into<Bytes>) -> Response {
        Response::ok("application/json", body)
    }

    /// A plain-text error whose body says what to do about it.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        let mut text = message.into();
        text.push('\n');
        Response { status, content_type: "text/plain; charset=utf-8", body: Bytes::from(text) }
    }
}

pub type ResponseFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

/// Routes requests; one per process.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> ResponseFuture;
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen for HTTP on {addr}: {message}")]
    Listen { addr: String, message: String },
}

/// Binds `addr` (`IP:port`); port 0 picks a free one (tests).
pub async fn bind(addr: &str) -> Result<TcpListener, HttpError> {
    let parsed: std::net::SocketAddr = addr
        .parse()
        .map_err(|e: std::net::AddrParseError| HttpError::Listen { addr: addr.to_string(), message: e.to_string() })?;
    TcpListener::bind(parsed).await.map_err(|e| HttpError::Listen { addr: addr.to_string(), message: e.to_string() })
}

/// How long a handler may take; tests shorten it.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub response_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { response_timeout_ms: RESPONSE_TIMEOUT_MS }
    }
}

/// Serves until `shutdown` turns true.
pub async fn serve(listener: TcpListener, handler: Arc<dyn Handler>, shutdown: watch::Receiver<bool>) {
    serve_with(listener, handler, Limits::default(), shutdown).await
}

/// Open connections per peer address; an entry exists only while its peer holds a connection, so there are at most
/// [`MAX_CONNECTIONS`] of them.
#[derive(Default)]
struct Peers(Mutex<HashMap<IpAddr, usize>>);

/// One peer's hold on a connection, given back when the connection ends.
struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    fn acquire(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = self.0.lock().expect("peers poisoned");
        let count = open.entry(ip).or_insert(0);
        if *count >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *count += 1;
        Some(PeerSlot { peers: self.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().expect("peers poisoned");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

pub async fn serve_with(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers = Arc::new(Peers::default());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: back off instead of spinning.
                tracing::warn!("HTTP accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The peer's limit first: a peer at its limit must not also take a global slot.
        let Some(peer_slot) = peers.acquire(peer.ip()) else {
            tracing::warn!(%peer, "HTTP connection refused: {MAX_CONNECTIONS_PER_PEER} already open from this address");
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "HTTP connection refused: {MAX_CONNECTIONS} already open");
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let service = service_fn(move |request| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(answer(handler.as_ref(), limits, request).await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS))
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_millis(CONNECTION_LIFETIME_MS), connection).await;
        });
    }
}

async fn answer(
    handler: &dyn Handler,
    limits: Limits,
    request: hyper::Request<Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let head = request.method() == Method::HEAD;
    let response = if request.method() != Method::GET && !head {
        Response::error(405, "only GET and HEAD are served here; changes go through the drover CLI")
    } else if request.uri().to_string().len() > MAX_TARGET_BYTES {
        Response::error(414, format!("request target longer than {MAX_TARGET_BYTES} bytes"))
    } else {
        let uri = request.uri();
        let request = Request { path: uri.path().to_string(), query: uri.query().unwrap_or("").to_string() };
        let timeout_ms = limits.response_timeout_ms;
        match tokio::time::timeout(Duration::from_millis(timeout_ms), handler.handle(request)).await {
            Ok(response) => response,
            Err(_) => Response::error(503, format!("no answer within {timeout_ms} ms; try again")),
        }
    };
    to_hyper(response, head)
}

fn to_hyper(response: Response, head: bool) -> hyper::Response<Full<Bytes>> {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let length = response.body.len();
    let body = if head { Bytes::new() } else { response.body };
    let mut out = hyper::Response::new(Full::new(body));
    *out.status_mut() = status;
    let headers = out.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(response.content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    // Every answer is a snapshot of a moving cluster.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // The page loads only its own script and style and talks only to its own origin; it cannot be framed.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Echo;

    impl Handler for Echo {
        fn handle(&self, request: Request) -> ResponseFuture {
            Box::pin(async move {
                match request.path.as_str() {
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Response::error(500, "unreachable")
                    }
                    _ => Response::ok("text/plain", format!("{} {:?}", request.path, request.param("job"))),
                }
            })
        }
    }

    async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    async fn started() -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve_with(listener, Arc::new(Echo), Limits { response_timeout_ms: 200 }, stopped));
        (addr, stop)
    }

    #[tokio::test]
    async fn a_get_reaches_the_handler_with_its_query_and_the_answer_carries_the_safety_headers() {
        let (addr, _stop) = started().await;
        let reply = exchange(addr, "GET /job?job=12&x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.ends_with("/job Some(\"12\")"), "{reply}");
        for header in ["cache-control: no-store", "x-content-type-options: nosniff", "x-frame-options: DENY"] {
            assert!(reply.to_ascii_lowercase().contains(&header.to_ascii_lowercase()), "{header} missing: {reply}");
        }
    }

    #[tokio::test]
    async fn anything_but_get_and_head_is_refused_without_reaching_the_handler() {
        let (addr, _stop) = started().await;
        let reply =
            exchange(addr, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
        assert!(reply.contains("only GET and HEAD"), "{reply}");
        let head = exchange(addr, "HEAD /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "a HEAD carries no body: {head}");
    }

    #[tokio::test]
    async fn an_oversized_target_is_refused() {
        let (addr, _stop) = started().await;
        let long = "a".repeat(MAX_TARGET_BYTES + 1);
        let reply = exchange(addr, &format!("GET /{long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).await;
        assert!(reply.starts_with("HTTP/1.1 414"), "{reply}");
    }

    #[tokio::test]
    async fn a_handler_that_hangs_gets_a_503_instead_of_holding_the_client() {
        let (addr, _stop) = started().await;
        let reply = exchange(addr, "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    }

    /// Issue 28, finding 11: 64 connections with unfinished headers from one address made `/metrics` unreachable
    /// for everyone. Now one address holds at most [`MAX_CONNECTIONS_PER_PEER`]; another address is served, and
    /// the stalled ones are dropped once the header deadline passes.
    #[tokio::test]
    async fn a_peer_that_opens_every_connection_and_sends_nothing_starves_nobody_else() {
        let (addr, _stop) = started().await;
        let mut stalled = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            stalled.push(stream);
        }
        // Another host (another loopback address) is still answered.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut other = socket.connect(addr).await.unwrap();
        other.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut reply = String::new();
        tokio::time::timeout(Duration::from_secs(10), other.read_to_string(&mut reply)).await.unwrap().unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
        // The stalled connections beyond the peer's limit were closed at once, the others at the header deadline.
        let mut closed = 0;
        for stream in &mut stalled {
            let mut buf = [0u8; 256];
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await;
            if matches!(read, Ok(Ok(_)) | Ok(Err(_))) {
                closed += 1;
            }
        }
        assert_eq!(closed, MAX_CONNECTIONS, "every stalled connection was closed within the header deadline");
    }

    #[tokio::test]
    async fn the_query_parameter_lookup_takes_exact_names() {
        let request = Request { path: "/".into(), query: "jobs=1&job=2".into() };
        assert_eq!(request.param("job"), Some("2"));
        assert_eq!(request.param("node"), None);
    }
}

//! The client side: a reloadable client identity and a connector for tonic channels.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::client::Resumption;
use rustls_pki_types::ServerName;
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

use super::material::{CurrentCert, CurrentServerVerifier, Shared, provider, spawn_reloader};
use super::{Role, RoleKind, TlsError, TlsFiles};

/// How often an open connection is pinged, and how long a ping may go unanswered before the connection counts as
/// dead.
pub const KEEPALIVE_INTERVAL_MS: u64 = 1_000;
pub const KEEPALIVE_TIMEOUT_MS: u64 = 1_000;

/// A client's TLS: its certificate (presented to servers) and the CA it trusts, reloadable like [`super::ServerTls`].
/// Channels made from it pick up reloaded material on their next connection. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    shared: Arc<Shared>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").field("material", &self.shared).finish()
    }
}

impl ClientTls {
    pub fn load(files: TlsFiles) -> Result<ClientTls, TlsError> {
        Ok(ClientTls { shared: Shared::load(files)? })
    }

    /// Re-reads the files; Ok(true) if new material is now in use. On error the previous material stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.shared.reload_if_changed()
    }

    /// Polls the files every `interval` until every clone is dropped. Needs a tokio runtime.
    pub fn spawn_reloader(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        spawn_reloader(&self.shared, interval)
    }

    /// The role in this client's own current certificate.
    pub fn role(&self) -> Option<Role> {
        self.shared.current().role.clone()
    }

    /// A rustls client configuration over the current material: TLS 1.3, ALPN h2, our certificate presented, the
    /// server verified against the CA and the dialled name, and against `expect` when set.
    pub fn rustls_config(&self, expect: Option<RoleKind>) -> Result<Arc<ClientConfig>, TlsError> {
        let verifier = CurrentServerVerifier { shared: self.shared.clone(), expect };
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous() // "dangerous" only because the verifier is ours; it delegates to webpki, then adds checks
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_cert_resolver(Arc::new(CurrentCert(self.shared.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        // A resumed session skips certificate checks, so a rotated-out server could be trusted again; see the
        // server side for why this costs little.
        config.resumption = Resumption::disabled();
        Ok(Arc::new(config))
    }

    /// A connector for `addr` (HOST:PORT), for callers that tune their own [`Endpoint`]:
    /// `endpoint.connect_with_connector_lazy(tls.connector(...)?)`.
    pub fn connector(
        &self,
        addr: &str,
        local_ip: Option<IpAddr>,
        connect_timeout: Duration,
        expect: Option<RoleKind>,
    ) -> Result<TlsConnector, TlsError> {
        let server_name = server_name(addr)?;
        Ok(TlsConnector {
            config: self.rustls_config(expect)?,
            addr: Arc::from(addr),
            server_name,
            local_ip,
            connect_timeout,
        })
    }

    /// A lazy channel to `addr` (HOST:PORT): nothing is dialled until the first call, and a broken connection is
    /// re-dialled (with the then-current material). `local_ip` binds the source address (multi-homed nodes);
    /// `connect_timeout` bounds TCP connect plus handshake; `expect` refuses servers whose certificate has another
    /// role kind.
    pub fn channel(
        &self,
        addr: &str,
        local_ip: Option<IpAddr>,
        connect_timeout: Duration,
        expect: Option<RoleKind>,
    ) -> Result<Channel, TlsError> {
        self.channel_with(addr, local_ip, connect_timeout, expect, true)
    }

    /// A channel for one long session whose own messages prove the peer alive both ways (an agent's session:
    /// a heartbeat a second, answered by a lease, and the agent gives the leader up after three silent
    /// heartbeats): no HTTP/2 pings. On the leader each ping is a TLS record in and one out, about as dear as a
    /// heartbeat, so with them every idle agent cost the leader a second message a second (measured: 31 µs of
    /// leader CPU per agent per second, half of all it spent on 10,000 agents).
    pub fn session_channel(
        &self,
        addr: &str,
        local_ip: Option<IpAddr>,
        connect_timeout: Duration,
        expect: Option<RoleKind>,
    ) -> Result<Channel, TlsError> {
        self.channel_with(addr, local_ip, connect_timeout, expect, false)
    }

    fn channel_with(
        &self,
        addr: &str,
        local_ip: Option<IpAddr>,
        connect_timeout: Duration,
        expect: Option<RoleKind>,
        pings: bool,
    ) -> Result<Channel, TlsError> {
        let connector = self.connector(addr, local_ip, connect_timeout, expect)?;
        // "http": the connector already speaks TLS; tonic must not try to add its own.
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| TlsError::BadAddress { addr: addr.to_owned(), reason: e.to_string() })?
            .connect_timeout(connect_timeout);
        // HTTP/2 pings find a connection whose peer went silent (a replica cut off by the network or frozen)
        // within about two seconds, and fail the calls waiting on it so that they go elsewhere: without them a
        // call on a black-holed connection waits for its whole timeout, and the next call takes the same
        // dead connection again. A live peer answers pings however busy its handlers are.
        let endpoint = if pings {
            endpoint
                .http2_keep_alive_interval(Duration::from_millis(KEEPALIVE_INTERVAL_MS))
                .keep_alive_timeout(Duration::from_millis(KEEPALIVE_TIMEOUT_MS))
                .keep_alive_while_idle(true)
        } else {
            endpoint
        };
        Ok(endpoint.connect_with_connector_lazy(connector))
    }
}

/// The name to verify the server's certificate against: the host part of HOST:PORT, an IP address or a DNS name.
fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
    let bad = |reason: &str| TlsError::BadAddress { addr: addr.to_owned(), reason: reason.to_owned() };
    let uri: Uri = format!("http://{addr}").parse().map_err(|_| bad("not a host and port"))?;
    if uri.path() != "/" || uri.query().is_some() || addr.contains('@') {
        return Err(bad("unexpected characters after the port"));
    }
    uri.port_u16().ok_or_else(|| bad("no port"))?;
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ServerName::try_from(host.to_owned()).map_err(|_| bad("the host is neither an IP address nor a DNS name"))
}

/// Dials TCP and runs the TLS handshake: a tower `Service<Uri>` for
/// [`Endpoint::connect_with_connector_lazy`]. The URI tonic passes is ignored; the address was fixed (and
/// validated) when the connector was made.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    addr: Arc<str>,
    server_name: ServerName<'static>,
    local_ip: Option<IpAddr>,
    connect_timeout: Duration,
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector").field("addr", &self.addr).field("local_ip", &self.local_ip).finish()
    }
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let timeout = this.connect_timeout;
            match tokio::time::timeout(timeout, this.connect()).await {
                Ok(result) => result,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {} timed out after {timeout:?} (TCP connect and TLS handshake)", this.addr),
                )),
            }
        })
    }
}

impl TlsConnector {
    async fn connect(&self) -> io::Result<TokioIo<TlsStream<TcpStream>>> {
        let tcp = self.tcp_connect().await?;
        // Without TCP_NODELAY a small request can wait ~40 ms for the server's delayed ACK (Nagle).
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {} failed: {e}", self.addr)))?;
        Ok(TokioIo::new(tls))
    }

    /// Tries each resolved address in turn (of the local address's family, when one is bound).
    async fn tcp_connect(&self) -> io::Result<TcpStream> {
        let context = |e: io::Error| io::Error::new(e.kind(), format!("connecting to {}: {e}", self.addr));
        let mut last_err = None;
        for target in tokio::net::lookup_host(&*self.addr).await.map_err(context)? {
            if self.local_ip.is_some_and(|ip| ip.is_ipv4() != target.is_ipv4()) {
                continue;
            }
            match self.dial(target).await {
                Ok(stream) => return Ok(stream),
                Err(err) => last_err = Some(err),
            }
        }
        Err(context(last_err.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address of the local address's family")
        })))
    }

    async fn dial(&self, target: SocketAddr) -> io::Result<TcpStream> {
        let socket = if target.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        if let Some(ip) = self.local_ip {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        socket.connect(target).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host_part() {
        assert_eq!(server_name("ctl1.example:7000").unwrap(), ServerName::try_from("ctl1.example").unwrap());
        assert_eq!(
            server_name("10.1.2.3:7000").unwrap(),
            ServerName::IpAddress("10.1.2.3".parse::<IpAddr>().unwrap().into())
        );
        assert_eq!(server_name("[::1]:7000").unwrap(), ServerName::IpAddress("::1".parse::<IpAddr>().unwrap().into()));
    }

    #[test]
    fn addresses_without_a_port_or_with_junk_are_refused() {
        for addr in ["ctl1.example", "ctl1:7000/path", "user@ctl1:7000", "", ":7000", "ctl 1:7000"] {
            assert!(matches!(server_name(addr), Err(TlsError::BadAddress { .. })), "{addr:?}");
        }
    }
}

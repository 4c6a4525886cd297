//! The server side: a reloadable rustls configuration and an accept loop for tonic's `serve_with_incoming`.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::NoServerSessionStorage;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

use super::material::{CurrentCert, CurrentClientVerifier, Shared, provider, spawn_reloader};
use super::{Role, TlsError, TlsFiles};

/// Handshakes in progress at once. Beyond this, new connections wait in the kernel's backlog: a flood of slow
/// handshakes costs a bounded amount of memory and never stalls established connections.
pub const MAX_HANDSHAKES_IN_FLIGHT: usize = 256;
/// A client that has not finished its handshake by then is dropped, freeing its slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Established connections waiting for tonic to pick them up.
const READY_QUEUE: usize = 64;

/// A server's TLS: built once from files; [`ServerTls::reload_if_changed`] swaps certificate, key and CA under
/// the running server. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    shared: Arc<Shared>,
    config: Arc<ServerConfig>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").field("material", &self.shared).finish()
    }
}

impl ServerTls {
    /// Loads the files and builds the server configuration: TLS 1.3, ALPN h2, client certificates required.
    pub fn load(files: TlsFiles) -> Result<ServerTls, TlsError> {
        let shared = Shared::load(files)?;
        // Every peer is a Drover binary built on rustls, so TLS 1.2's extra surface buys nothing.
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(Arc::new(CurrentClientVerifier(shared.clone())))
            .with_cert_resolver(Arc::new(CurrentCert(shared.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        // No session resumption: a resumed session skips certificate checks, which would let a client whose CA was
        // just rotated out back in. gRPC connections are long-lived, so full handshakes cost little.
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(ServerTls { shared, config: Arc::new(config) })
    }

    /// Re-reads the files; Ok(true) if new material is now in use. On error the previous material stays (and the
    /// error, naming the file, has been logged).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.shared.reload_if_changed()
    }

    /// Calls [`ServerTls::reload_if_changed`] every `interval` (at least [`super::MIN_RELOAD_INTERVAL`]) until every
    /// clone of this `ServerTls` is dropped. Needs a tokio runtime.
    pub fn spawn_reloader(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        spawn_reloader(&self.shared, interval)
    }

    /// The role in this server's own current certificate.
    pub fn role(&self) -> Option<Role> {
        self.shared.current().role.clone()
    }

    pub fn files(&self) -> &TlsFiles {
        self.shared.files()
    }

    /// The rustls configuration, for servers not fed by [`incoming`].
    pub fn rustls_config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }
}

/// Accepts TCP connections on `listener` and yields those that complete a mutual-TLS handshake, for
/// `tonic::transport::Server::serve_with_incoming`. Handshakes run concurrently (at most
/// [`MAX_HANDSHAKES_IN_FLIGHT`], each within [`HANDSHAKE_TIMEOUT`]), so a slow or hostile client never blocks the
/// accept loop; failed handshakes are logged at debug and dropped, never yielded. The accept loop stops when the
/// stream is dropped. Needs a tokio runtime.
pub fn incoming(
    listener: TcpListener,
    tls: ServerTls,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static {
    let (ready_tx, ready_rx) = mpsc::channel(READY_QUEUE);
    tokio::spawn(accept_loop(listener, TlsAcceptor::from(tls.config), ready_tx));
    ReceiverStream::new(ready_rx)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<Result<TlsStream<TcpStream>, io::Error>>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES_IN_FLIGHT));
    loop {
        // Take a slot before accepting, so excess connections wait in the kernel's backlog, not in our memory.
        let slot = tokio::select! {
            _ = ready.closed() => return,
            slot = slots.clone().acquire_owned() => match slot { Ok(slot) => slot, Err(_) => return },
        };
        let (tcp, peer) = tokio::select! {
            _ = ready.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Usually EMFILE/ENFILE or a connection reset before accept: back off, never spin.
                    tracing::warn!(error = %err, "TLS listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Without TCP_NODELAY a small reply can wait ~40 ms for the peer's delayed ACK (Nagle).
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %err, "cannot set TCP_NODELAY");
        }
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(slot);
            match handshake {
                Ok(Ok(stream)) => {
                    let _ = ready.send(Ok(stream)).await; // an error means the server is gone
                }
                Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

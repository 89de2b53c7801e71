//! The REST API over TLS: [`TlsListener`], an axum listener whose
//! connections arrive already through their TLS handshake.
//!
//! Handshakes run on tasks of their own, each bounded by
//! [`sluice_flight::tls::HANDSHAKE`], and at most [`HANDSHAKES`] at once,
//! so a client that opens a connection and says nothing holds one task
//! for a while, never the accept loop. A failed handshake (a plain-text
//! client, a client that does not trust the certificate) is logged at
//! debug level and dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use datafusion::common::runtime::SpawnedTask;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;

/// Handshakes in progress at once, at most.
pub const HANDSHAKES: usize = 256;

/// See the module docs.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    /// The accept loop, aborted when the listener is dropped.
    _accepting: SpawnedTask<()>,
}

impl TlsListener {
    /// TLS with `config` on the connections `tcp` accepts.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let accepting = SpawnedTask::spawn(accept_loop(tcp, TlsAcceptor::from(config), tx));
        Ok(Self {
            ready,
            local,
            _accepting: accepting,
        })
    }
}

/// Accepts TCP connections and hands each to a handshake task, until the
/// listener is dropped.
async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(HANDSHAKES));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match tcp.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was
                // accepted: wait a moment rather than spin.
                tracing::debug!("REST accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        sluice_base::task::detach(async move {
            let shake =
                tokio::time::timeout(sluice_flight::tls::HANDSHAKE, acceptor.accept(stream)).await;
            drop(slot);
            match shake {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!("REST TLS handshake with {peer}: {e}"),
                Err(_) => tracing::debug!("REST TLS handshake with {peer}: timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop ended (it only does when dropped): no more
            // connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

//! What every node process does with its ports: binding and TLS, the
//! Flight server's settings (window, Nagle off), the REST listener, the
//! tokens it accepts (reloaded on SIGHUP), and stopping on Ctrl-C or
//! SIGTERM.

use axum::serve::ListenerExt;
use sluice_access::{Audit, Auth};
use sluice_flight::{ClientCerts, Tls};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::cli::Cli;

/// Resolves on Ctrl-C or SIGTERM.
/// How long `serve` waits for open streams to end once told to stop.
pub(super) const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// A Flight server builder with HTTP/2 windows sized for bulk tensors
/// (h2's default 64 KiB stream window stalls a stream of multi-MiB
/// messages on every round trip).
pub(super) fn flight_builder() -> Server {
    Server::builder()
        .initial_stream_window_size(Some(FLIGHT_WINDOW))
        .initial_connection_window_size(Some(2 * FLIGHT_WINDOW))
        .http2_adaptive_window(Some(true))
}

/// A listener's connections for tonic, with Nagle's algorithm off.
/// tonic applies `Server::tcp_nodelay` only to a listener it binds
/// itself, not to one handed to `serve_with_incoming`: without this, a
/// small answer written after another (an action's result after its
/// headers, a stream's trailers) waited for the peer's delayed ACK, up
/// to 40 ms on Linux, whenever two calls shared a connection's turn.
pub(super) fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The HTTP/2 flow-control window of a Flight stream.
pub(super) const FLIGHT_WINDOW: u32 = 8 << 20;

pub(super) async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}

/// A listener for `what` on `addr`: plain text only on loopback, unless
/// this process serves TLS (`--tls-cert`) or is told `--insecure`.
pub(super) async fn listen(
    cli: &Cli,
    tls: Option<&Tls>,
    addr: &str,
    what: &str,
) -> anyhow::Result<TcpListener> {
    let listener = bind(addr).await?;
    let at = listener.local_addr()?;
    if !at.ip().is_loopback() && !tls.is_some_and(Tls::serves) && !cli.insecure {
        anyhow::bail!(
            "refusing to serve {what} in plain text on {at}, which is not loopback: give \
             --tls-cert and --tls-key (`sluice certs` makes them), listen on 127.0.0.1, \
             or pass --insecure on a network you trust"
        );
    }
    Ok(listener)
}

/// `builder` serving TLS when this process has a certificate, asking
/// callers for one of the cluster's as `client_certs` says.
pub(super) fn with_tls(
    builder: Server,
    tls: Option<&Tls>,
    client_certs: ClientCerts,
) -> anyhow::Result<Server> {
    match tls.filter(|t| t.serves()) {
        Some(t) => {
            Ok(builder.tls_config(t.tonic_server(client_certs).map_err(anyhow::Error::msg)?)?)
        }
        None => Ok(builder),
    }
}

/// `scheme://addr`, the TLS scheme when this process serves TLS.
pub(super) fn location(
    tls: Option<&Tls>,
    plain: &str,
    secure: &str,
    addr: std::net::SocketAddr,
) -> String {
    let scheme = if tls.is_some_and(Tls::serves) {
        secure
    } else {
        plain
    };
    format!("{scheme}://{addr}")
}

/// Serves the REST API `app` on `rest` (over TLS when this process has a
/// certificate) until the process is told to stop.
pub(super) async fn serve_rest(
    rest: TcpListener,
    app: axum::Router,
    tls: Option<&Tls>,
) -> anyhow::Result<()> {
    // With connect info: a trainer's ranks go to a compute node beside it.
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    match tls.filter(|t| t.serves()) {
        Some(t) => {
            let config = t.rustls_server().map_err(anyhow::Error::msg)?;
            // `tap_io`: the listener axum knows the peer address of.
            let tls_rest = crate::rest::tls::TlsListener::new(rest, config)?.tap_io(|_| {});
            axum::serve(tls_rest, app)
                .with_graceful_shutdown(shutdown())
                .await?;
        }
        None => {
            // Nagle's algorithm off, as on the TLS listener and Flight's.
            let rest = rest.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(rest, app)
                .with_graceful_shutdown(shutdown())
                .await?;
        }
    }
    Ok(())
}

/// The tokens a server accepts: `given` (every scope) and the tokens
/// file's (`--tokens`), read again on SIGHUP; refusals go to the audit
/// log (`--audit-log`).
pub(super) fn accepted_tokens(cli: &Cli, given: &[String]) -> anyhow::Result<Auth> {
    let audit = match &cli.audit_log {
        Some(path) => Audit::to(path).map_err(anyhow::Error::msg)?,
        None => Audit::default(),
    };
    let auth = Auth::new(given.iter().cloned(), cli.tokens.as_deref(), audit)
        .map_err(anyhow::Error::msg)?;
    if cli.tokens.is_some() {
        reload_on_sighup(auth.clone());
    }
    Ok(auth)
}

/// Reads the tokens file again at each SIGHUP, until the process ends.
pub(super) fn reload_on_sighup(auth: Auth) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        eprintln!("warning: no SIGHUP: the tokens file is read only at start");
        return;
    };
    sluice_base::task::detach(async move {
        while hup.recv().await.is_some() {
            match auth.reload() {
                Ok(n) => eprintln!("tokens file read again: {n} token(s)"),
                Err(e) => eprintln!("error: {e}; the tokens in use are kept"),
            }
        }
    });
}

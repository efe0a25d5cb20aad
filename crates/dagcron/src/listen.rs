//! The API's listener, plain or TLS, with the limits that keep a hostile or
//! broken client from holding the server: at most [`Limits::per_address`]
//! connections from one address (more are closed at once), a client that
//! says nothing, or sends its HTTP/1 headers too slowly, is dropped after
//! [`Limits::header_timeout`], and a shutdown waits for open connections
//! (agents' streams, log followers, slow clients) at most
//! [`Limits::close_grace`] before it drops them, whatever the peers do.
//!
//! Every request carries the peer's address (`ConnectInfo`), and over TLS
//! whether the peer presented a client certificate.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The limits of one listener.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connections open at once from one client address.
    pub(crate) per_address: usize,
    /// How long a new connection may take to send its first bytes (its
    /// TLS handshake, or its HTTP/1 request headers).
    pub(crate) header_timeout: Duration,
    /// How long a shutdown waits for open connections to finish.
    pub(crate) close_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            per_address: 512,
            header_timeout: Duration::from_secs(10),
            close_grace: Duration::from_secs(5),
        }
    }
}

/// The count of open connections per address; a slot is given back when
/// its guard goes.
#[derive(Clone, Default)]
struct Open(Arc<Mutex<HashMap<IpAddr, usize>>>);

struct Slot(Open, IpAddr);

impl Open {
    fn take(&self, ip: IpAddr, max: usize) -> Option<Slot> {
        let mut open = self.0.lock().expect("connections lock");
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot(self.clone(), ip))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.0.0.lock().expect("connections lock");
        if let Some(n) = open.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown`, then
/// lets open connections finish for at most the close grace.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: CancellationToken,
    limits: Limits,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let open = Open::default();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait, go on.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let Some(slot) = open.take(peer.ip(), limits.per_address) else {
            tracing::debug!(%peer, "too many connections from this address: closed");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        connections.spawn(async move {
            let _slot = slot;
            let wait = limits.header_timeout;
            match acceptor {
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(wait, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "no TLS handshake in time: closed");
                            return;
                        }
                    };
                    // A client that presented a certificate (the verifier checked it).
                    let certified = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .is_some_and(|c| !c.is_empty());
                    connection(tls, peer, certified, app, watcher, wait).await;
                }
                None => {
                    // A client that says nothing is not kept waiting for.
                    let mut first = [0u8; 1];
                    if !matches!(tokio::time::timeout(wait, tcp.peek(&mut first)).await, Ok(Ok(n)) if n > 0)
                    {
                        tracing::debug!(%peer, "nothing received in time: closed");
                        return;
                    }
                    connection(tcp, peer, false, app, watcher, wait).await;
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.close_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            open = connections.len(),
            "connections still open after the close grace: dropped"
        );
    }
    connections.abort_all();
    Ok(())
}

/// Serves HTTP/1 or HTTP/2 on one connection.
async fn connection<I>(
    io: I,
    peer: SocketAddr,
    certified: bool,
    app: axum::Router,
    watcher: Watcher,
    header_timeout: Duration,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
            if certified {
                req.extensions_mut()
                    .insert(dagcron_agents::ClientCertificate);
            }
            app.clone().oneshot(req.map(axum::body::Body::new))
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

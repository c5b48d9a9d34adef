//! HTTP connections served on threads of their own, each with a single-threaded runtime.
//!
//! On tokio's work-stealing runtime every readiness event woke a second worker thread to look
//! for work to steal, which found none and slept again, and a call's tasks moved between the
//! two threads: measured, threads sleeping and waking one another were about a fifth of a
//! governed read's CPU at one client, and one worker thread instead of two cut the CPU per
//! read by about a third at eight. Here the listener's accept loop (on the main runtime) deals
//! each connection to one of a fixed set of threads (one per worker of the main runtime by
//! default), and everything a connection's requests do — the call, its group commit when it
//! leads one, the upstream connection it drives — runs on that thread, which sleeps only when
//! none of its connections has anything to do. A connection is the unit: its requests are
//! answered in order anyway, so nothing is lost by keeping it on one thread, and connections
//! spread over the threads as they arrive.
//!
//! Shutting down is axum's graceful shutdown: no connection is accepted once `shutdown` is
//! cancelled, each connection finishes the request it is answering, and the threads end once
//! every connection has closed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Serves `app` on the connections `listener` accepts, dealt over `threads` threads, until
/// `shutdown` is cancelled and every connection has closed. Each request carries its peer's
/// address as `ConnectInfo<SocketAddr>`.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
    threads: usize,
) -> io::Result<()> {
    let lanes = Lanes::start(threads.max(1))?;
    // As axum's `serve`: the connections wait for `signal` to close (every receiver gone), and
    // the server for `close` to (every connection gone).
    let (signal, signal_rx) = watch::channel(());
    let (close, close_rx) = watch::channel(());
    let mut next = 0usize;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        // An SSE response goes out in several small writes (the stream's first event, then the
        // JSON-RPC response), and with Nagle's algorithm the second waits for the client's
        // delayed ACK: a client that keeps its connection alive (the official Python and
        // TypeScript SDKs do) waited 40 ms on every call after its first (measured with curl
        // over one connection: 1 ms, then 43 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a connection");
        }
        let tcp = match tcp.into_std() {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "a connection could not be handed to its thread");
                continue;
            }
        };
        let lane = &lanes.handles[next % lanes.handles.len()];
        next = next.wrapping_add(1);
        let (app, signal, close) = (app.clone(), signal.clone(), close_rx.clone());
        lane.spawn(async move {
            // Registered with this thread's runtime, which polls it from now on.
            match TcpStream::from_std(tcp) {
                Ok(tcp) => serve_connection(tcp, peer, app, signal).await,
                Err(e) => tracing::debug!(error = %e, "a connection could not be registered"),
            }
            drop(close);
        });
    }
    drop(signal_rx);
    drop(close_rx);
    drop(listener);
    close.closed().await;
    lanes.stop();
    Ok(())
}

/// One connection, served until it closes; it finishes what it is answering and closes once
/// `signal` has no receiver left.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    app: Router,
    signal: watch::Sender<()>,
) {
    let service = app.map_request(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req.map(Body::new)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service));
    let mut conn = std::pin::pin!(conn);
    let mut signalled = std::pin::pin!(signal.closed());
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::trace!(error = %e, "a connection ended with an error");
                }
                break;
            }
            () = &mut signalled => conn.as_mut().graceful_shutdown(),
        }
    }
}

/// An accept that failed: a connection reset before it was taken is nothing; anything else
/// (out of file descriptors) is logged and waited out for a second, as axum does.
async fn accept_failed(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The threads connections are served on, each running a single-threaded runtime until it is
/// told to stop.
struct Lanes {
    handles: Vec<tokio::runtime::Handle>,
    stops: Vec<oneshot::Sender<()>>,
}

impl Lanes {
    fn start(n: usize) -> io::Result<Lanes> {
        let mut lanes = Lanes {
            handles: Vec::with_capacity(n),
            stops: Vec::with_capacity(n),
        };
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            lanes.handles.push(runtime.handle().clone());
            lanes.stops.push(stop);
            std::thread::Builder::new()
                .name(format!("toolgate-http-{i}"))
                .spawn(move || {
                    let _ = runtime.block_on(stopped);
                })?;
        }
        Ok(lanes)
    }

    /// Ends the threads; what their runtimes still hold is dropped with them.
    fn stop(self) {
        drop(self.stops);
    }
}

//! Kept-alive HTTP/1.1 connections to one upstream, each driven by the call that uses it.
//!
//! A pooled client (hyper's own) runs every connection in a task of its own: a call hands its
//! request to that task and is woken when the answer has been read, two thread hand-offs per
//! call, which measured more than the writing and reading they carry. Here the call that checks
//! a connection out polls it itself while it waits for its answer, so the request is written
//! and the answer read in the call's own task. Between calls a connection waits in the pool,
//! polled by no one; at check-out it is polled once, so a close by the upstream (or the rest of
//! an answer's body) is seen before it is used, and a connection that is not ready at once is
//! closed rather than waited for.
//!
//! A request that found its connection closed before a byte of it was written is sent again
//! on a new connection (as hyper's pooled client does): the upstream cannot have seen it. Once
//! written, it is never sent again here; what the caller makes of a lost answer is its own.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::Poll;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::header::{HOST, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;

use crate::hop::{QuickAck, dial};

type Conn = Connection<TokioIo<QuickAck>, Full<Bytes>>;

/// Connections kept idle per thread at most; more are closed when their call is done.
const MAX_IDLE: usize = 256;

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made: nothing was sent.
    Connect(String),
    /// The request was (or may have been) written, and the connection failed before its answer.
    Lost(hyper::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "{e}"),
            SendError::Lost(e) => write!(f, "{e}"),
        }
    }
}

/// A connection and its sending half.
struct Kept {
    send: SendRequest<Full<Bytes>>,
    /// `None` once it has ended.
    conn: Option<Pin<Box<Conn>>>,
}

/// The kept connections to one upstream (`http` only).
pub(crate) struct Conns {
    uri: Uri,
    host: HeaderValue,
    idle_for: Duration,
    /// Idle connections by the thread that dialled them: a connection is registered with
    /// that thread's runtime, which is told when it can be read, so a call on another thread
    /// would be woken through it (see `crate::lanes`).
    idle: Mutex<HashMap<ThreadId, Vec<(Kept, Instant)>>>,
}

impl Conns {
    /// Connections to the origin of `uri`, each kept at most `idle_for` between calls.
    pub(crate) fn new(uri: &Uri, idle_for: Duration) -> Option<Conns> {
        let authority = uri.authority()?;
        Some(Conns {
            uri: uri.clone(),
            host: HeaderValue::from_str(authority.as_str()).ok()?,
            idle_for,
            idle: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `req` (whose URI is the upstream's, as rmcp posts to it) and gives its response to
    /// `read`, driving the connection until `read` is done; then keeps the connection for the
    /// next call if it can serve one.
    pub(crate) async fn exchange<T>(
        &self,
        mut req: Request<Full<Bytes>>,
        read: impl AsyncFnOnce(Response<Incoming>) -> T,
    ) -> Result<T, SendError> {
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse::<Uri>()
            .expect("a path from a parsed URI");
        *req.uri_mut() = path;
        req.headers_mut().insert(HOST, self.host.clone());
        let (mut kept, response) = match self.checkout().await {
            Some(mut kept) => match send(&mut kept, req).await {
                Ok(r) => (kept, r),
                // Closed by the upstream before a byte was written: a new connection.
                Err(Unsent(req)) => self.send_on_new(req).await?,
            },
            None => self.send_on_new(req).await?,
        };
        let response = response.map_err(SendError::Lost)?;
        let out = drive(&mut kept.conn, read(response)).await;
        self.check_in(kept).await;
        Ok(out)
    }

    /// Sends `req` on a new connection and waits for the response's head.
    async fn send_on_new(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(Kept, Result<Response<Incoming>, hyper::Error>), SendError> {
        let mut kept = self.dial().await?;
        match send(&mut kept, req).await {
            Ok(r) => Ok((kept, r)),
            Err(Unsent(_)) => Err(SendError::Connect(
                "a new connection closed before the request was written".into(),
            )),
        }
    }

    /// An idle connection ready for a request, if one is kept.
    async fn checkout(&self) -> Option<Kept> {
        loop {
            let (mut kept, since) = self
                .idle
                .lock()
                .expect("idle connections")
                .get_mut(&std::thread::current().id())?
                .pop()?;
            if since.elapsed() >= self.idle_for {
                continue;
            }
            if ready_now(&mut kept).await {
                return Some(kept);
            }
        }
    }

    /// A new connection to the upstream.
    async fn dial(&self) -> Result<Kept, SendError> {
        let io = dial(&self.uri)
            .await
            .map_err(|e| SendError::Connect(e.to_string()))?;
        let (send, conn) = http1::handshake(io)
            .await
            .map_err(|e| SendError::Connect(e.to_string()))?;
        Ok(Kept {
            send,
            conn: Some(Box::pin(conn)),
        })
    }

    /// Keeps `kept` for the next call if it is still open (it is polled once first, so the end
    /// of the answer just read is taken in).
    async fn check_in(&self, mut kept: Kept) {
        let open = poll_fn(|cx| {
            Poll::Ready(match kept.conn.as_mut() {
                Some(conn) => conn.as_mut().poll(cx).is_pending(),
                None => false,
            })
        })
        .await;
        if !open || kept.send.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().expect("idle connections");
        let mine = idle.entry(std::thread::current().id()).or_default();
        if mine.len() < MAX_IDLE {
            mine.push((kept, Instant::now()));
        }
    }
}

/// A request handed back because its connection could not take it (nothing was written).
struct Unsent(Request<Full<Bytes>>);

/// Sends `req` on `kept` and waits for the response's head, driving the connection.
async fn send(
    kept: &mut Kept,
    req: Request<Full<Bytes>>,
) -> Result<Result<Response<Incoming>, hyper::Error>, Unsent> {
    let Kept { send, conn } = kept;
    match drive(conn, send.try_send_request(req)).await {
        Ok(response) => Ok(Ok(response)),
        Err(mut e) => match e.take_message() {
            Some(req) => Err(Unsent(req)),
            None => Ok(Err(e.into_error())),
        },
    }
}

/// Whether `kept` can take a request now: its connection polled once (it takes in whatever
/// the upstream sent meanwhile, a close included) and found open and idle.
async fn ready_now(kept: &mut Kept) -> bool {
    let Kept { send, conn } = kept;
    poll_fn(|cx| {
        let open = match conn.as_mut() {
            Some(c) => c.as_mut().poll(cx).is_pending(),
            None => false,
        };
        Poll::Ready(open && matches!(send.poll_ready(cx), Poll::Ready(Ok(()))))
    })
    .await
}

/// Runs `work`, polling the connection beside it (first, so what it reads is there for `work`
/// in the same turn). A connection that ends is let go; `work` then learns of it from hyper.
async fn drive<T>(conn: &mut Option<Pin<Box<Conn>>>, work: impl Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    if let Some(c) = conn.as_mut() {
        tokio::select! {
            biased;
            ended = c.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "an upstream connection ended");
                }
                *conn = None;
            }
            out = work.as_mut() => return out,
        }
    }
    work.await
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A plain HTTP/1.1 server that answers every request with its body, counting connections
    /// and requests; with `close_after_each`, it closes each connection after its answer (as
    /// an upstream whose keep-alive timeout has passed does).
    async fn echo_server(close_after_each: bool) -> (Uri, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/mcp", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (conns, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (c, r) = (conns.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let (mut tcp, _) = listener.accept().await.unwrap();
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let Some(body) = read_request(&mut tcp, &mut buf).await else {
                            return;
                        };
                        r.fetch_add(1, Ordering::SeqCst);
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        tcp.write_all(head.as_bytes()).await.unwrap();
                        tcp.write_all(&body).await.unwrap();
                        if close_after_each {
                            return;
                        }
                    }
                });
            }
        });
        (uri, conns, requests)
    }

    /// One request's body, read from `tcp` (`None`: the connection closed).
    async fn read_request(tcp: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    let body = buf[end + 4..end + 4 + len].to_vec();
                    buf.drain(..end + 4 + len);
                    return Some(body);
                }
            }
            let n = tcp.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn post(conns: &Conns, uri: &Uri, body: &'static str) -> String {
        let req = Request::post(uri.clone())
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let read = async |r: Response<Incoming>| r.into_body().collect().await.unwrap().to_bytes();
        let bytes = conns.exchange(req, read).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn calls_one_after_another_share_one_connection() {
        let (uri, opened, requests) = echo_server(false).await;
        let conns = Conns::new(&uri, Duration::from_secs(60)).unwrap();
        for body in ["one", "two", "three"] {
            assert_eq!(post(&conns, &uri, body).await, body);
        }
        assert_eq!(opened.load(Ordering::SeqCst), 1, "one kept connection");
        assert_eq!(requests.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_replaced_and_each_call_sent_once() {
        let (uri, opened, requests) = echo_server(true).await;
        let conns = Conns::new(&uri, Duration::from_secs(60)).unwrap();
        assert_eq!(post(&conns, &uri, "one").await, "one");
        // Give the close time to arrive before the next call checks the connection out.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(post(&conns, &uri, "two").await, "two");
        assert_eq!(
            opened.load(Ordering::SeqCst),
            2,
            "a new connection for the second call"
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "each call reached the upstream once"
        );
    }

    #[tokio::test]
    async fn an_upstream_nobody_listens_on_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uri: Uri = format!("http://{}/mcp", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        let conns = Conns::new(&uri, Duration::from_secs(60)).unwrap();
        let req = Request::post(uri.clone())
            .body(Full::new(Bytes::new()))
            .unwrap();
        let read = async |_: Response<Incoming>| ();
        assert!(matches!(
            conns.exchange(req, read).await,
            Err(SendError::Connect(_))
        ));
    }
}

//! Connections: hyper's HTTP/1.1 (keep-alive, chunked bodies, 16 KiB heads) on tokio,
//! at most `--max-connections` at once (past that a 503 and close), each within
//! `--client-timeout` for its heads (hyper's header timeout, which also closes a kept-alive
//! connection left idle: a 408 where part of a request had come, quietly otherwise) and for
//! every write the client leaves unread. SIGTERM or Ctrl-C: stop accepting, answer new
//! requests 503, finish the requests in flight, and interrupt those still running at
//! `--shutdown-timeout`.

use super::Shared;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

/// Bytes of a request's line and headers together (hyper's read buffer; past it, 431).
const MAX_HEAD_BYTES: usize = 16 << 10;

/// Accepts connections until a stop signal, then drains.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    s: Arc<Shared>,
    max_connections: usize,
    shutdown_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(max_connections));
    // Refusals answered at once; past these, a connection is closed unanswered.
    let refusals = Arc::new(Semaphore::new(64));
    let mut stop = std::pin::pin!(stop_signal());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors, say: wait rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let conn = connection(stream, app.clone(), &s, &graceful);
                tokio::spawn(async move {
                    conn.await;
                    drop(permit);
                });
            }
            Err(_) => {
                s.metrics.rejected.inc();
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        refuse(stream).await;
                        drop(permit);
                    });
                }
            }
        }
    }
    drop(listener);
    drain(&s, graceful, shutdown_timeout).await;
}

/// After a stop signal: the requests in flight end by themselves within `timeout`, or
/// are interrupted then (and end within moments: the engine checks between tokens). The
/// drain ends when every connection has closed or no request has been in flight for half
/// a second (a connection that never sent a request does not hold it).
async fn drain(s: &Shared, graceful: GracefulShutdown, timeout: Duration) {
    s.start_draining();
    let _ = writeln!(
        std::io::stderr(),
        "dflash serve: stopping; {} requests in flight (at most {:.0} s)",
        s.queue.len(),
        timeout.as_secs_f64()
    );
    tokio::select! {
        _ = graceful.shutdown() => return,
        _ = no_requests_for(s, Duration::from_millis(500)) => return,
        _ = tokio::time::sleep(timeout) => {}
    }
    s.queue.interrupt_all();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        no_requests_for(s, Duration::from_millis(500)),
    )
    .await;
}

/// Returns once no request has been queued or running for `quiet`.
async fn no_requests_for(s: &Shared, quiet: Duration) {
    let step = Duration::from_millis(50);
    let mut since = tokio::time::Instant::now();
    loop {
        if s.queue.len() > 0 {
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
        tokio::time::sleep(step).await;
    }
}

/// One connection, served until it closes.
fn connection(
    stream: TcpStream,
    app: Router,
    s: &Arc<Shared>,
    graceful: &GracefulShutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let _ = stream.set_nodelay(true);
    // A second descriptor of the socket, to write the 408 after hyper has let it go.
    let spare = std::os::fd::AsFd::as_fd(&stream)
        .try_clone_to_owned()
        .ok()
        .map(std::net::TcpStream::from);
    let partial = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(Socket {
        stream,
        stall: s.client_timeout,
        stalled: None,
        partial: partial.clone(),
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(s.client_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(io, TowerToHyperService::new(app));
    let conn = graceful.watch(conn);
    let s = s.clone();
    async move {
        s.metrics.connections.inc();
        s.metrics.connections_opened.inc();
        if let (Err(e), Some(mut spare)) = (conn.await, spare) {
            // A head cut off by the timeout; an idle kept-alive connection closes quietly.
            if e.is_timeout() && partial.load(Ordering::Relaxed) {
                let message = "the request did not arrive in time (--client-timeout)";
                let _ = spare.write_all(&raw_error(408, "Request Timeout", "Timeout", message));
            }
        }
        s.metrics.connections.dec();
    }
}

/// A whole response written raw (hyper has let the connection go, or never had it).
fn raw_error(status: u16, reason: &str, code: &str, message: &str) -> Vec<u8> {
    let body = super::routes::error_body(status, code, message).to_string();
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A connection past `--max-connections`: a 503, then what the client still sends is
/// read and dropped (2 s, 1 MiB at most) so that closing does not reset the answer away.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let busy = raw_error(503, "Service Unavailable", "Busy", "too many connections");
        stream.write_all(&busy).await?;
        stream.shutdown().await?;
        let mut buf = vec![0u8; 16 << 10];
        let mut total = 0;
        while total < 1 << 20 {
            match stream.read(&mut buf).await? {
                0 => break,
                n => total += n,
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// The stop signal: SIGTERM or Ctrl-C (SIGINT).
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut t) => {
                t.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// The socket, with a bound on how long a write may wait for a client that reads
/// nothing: past `stall`, the write fails and hyper closes the connection.
struct Socket {
    stream: TcpStream,
    stall: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    /// Whether bytes came since the last response was written (part of a request).
    partial: Arc<AtomicBool>,
}

impl Socket {
    fn pending_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let stall = self.stall;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(std::io::ErrorKind::TimedOut.into())
    }

    /// Bytes of a response went out: what came before was a whole request.
    fn response_bytes(&self, r: &Poll<std::io::Result<usize>>) {
        if matches!(r, Poll::Ready(Ok(n)) if *n > 0) {
            self.partial.store(false, Ordering::Relaxed);
        }
    }

    fn wrote<T>(
        &mut self,
        r: Poll<std::io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.pending_write(cx).map(Err),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.partial.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.response_bytes(&r);
        self.wrote(r, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.wrote(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.response_bytes(&r);
        self.wrote(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

//! The agent's metrics over HTTP: `GET /metrics` answered with the exposition text,
//! nothing else served.
//!
//! A scrape is one small request, so this is a bounded responder rather than an HTTP
//! stack: at most [`MAX_CONNECTIONS`] connections at once (another is closed at once),
//! a request head of at most [`MAX_HEAD`] bytes read within [`READ_TIMEOUT`], one
//! answer per connection, then the connection is closed. It must never hold up the
//! agent: the text is rendered by the caller's function (a short lock of the agent's
//! state), and every socket operation is bounded in time.

use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// The longest request head read.
pub const MAX_HEAD: usize = 8 << 10;
/// How long a client may take to send its request, and to take the answer.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The exposition format's content type (OpenMetrics text, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serve `listener` until the task is dropped: `GET /metrics` gets `render()`.
pub async fn serve(listener: TcpListener, render: Arc<dyn Fn() -> String + Send + Sync>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors: wait for some to be given back.
                debug!(error = %e, "metrics: cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue; // over the cap: dropping the stream closes it
        };
        let render = render.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(READ_TIMEOUT * 2, answer(stream, &*render)).await;
            drop(permit);
        });
    }
}

/// Read one request head and answer it.
async fn answer(mut stream: TcpStream, render: &(dyn Fn() -> String + Send + Sync)) {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = match tokio::time::timeout(READ_TIMEOUT, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return,
        };
        head.extend_from_slice(buf.get(..n).unwrap_or_default());
        if head.len() > MAX_HEAD {
            let _ = respond(&mut stream, "431 Request Header Fields Too Large", "", "").await;
            return;
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut words = line.split(|b| *b == b' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next());
    let path = target.map(|t| t.split(|b| *b == b'?').next().unwrap_or_default());
    let (status, ctype, body) = match (method, path) {
        (b"GET" | b"HEAD", Some(b"/metrics")) => ("200 OK", CONTENT_TYPE, render()),
        (b"GET" | b"HEAD", Some(b"/")) => (
            "200 OK",
            "text/plain; charset=utf-8",
            "apm agent: metrics at /metrics\n".to_owned(),
        ),
        (b"GET" | b"HEAD", _) => ("404 Not Found", "text/plain; charset=utf-8", String::new()),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            String::new(),
        ),
    };
    let body = if method == b"HEAD" { "" } else { body.as_str() };
    let _ = respond(&mut stream, status, ctype, body).await;
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !ctype.is_empty() {
        out.push_str(&format!("Content-Type: {ctype}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    tokio::time::timeout(READ_TIMEOUT, stream.write_all(out.as_bytes()))
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("send");
        let mut out = String::new();
        // A request the responder stops reading may end in a reset: what came is kept.
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn metrics_are_served_and_nothing_else() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let task = tokio::spawn(serve(l, Arc::new(|| "apm_up 1\n# EOF\n".to_owned())));
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains(CONTENT_TYPE) && ok.ends_with("apm_up 1\n# EOF\n"),
            "{ok}"
        );
        let nope = get(addr, "GET /secret HTTP/1.1\r\n\r\n").await;
        assert!(nope.starts_with("HTTP/1.1 404"), "{nope}");
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let huge = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(MAX_HEAD)
        );
        let big = get(addr, &huge).await;
        assert!(big.is_empty() || big.starts_with("HTTP/1.1 431"), "{big}");
        task.abort();
    }
}

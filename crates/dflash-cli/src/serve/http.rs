//! The little HTTP/1.1 `dflash serve` needs, on std's TcpStream: one request per
//! connection (`Connection: close`), bodies by Content-Length only, bounded header and
//! body sizes and a read timeout; JSON responses, OpenAI's error object, and
//! server-sent events for streaming.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Bytes of the request line and headers together.
const MAX_HEAD_BYTES: usize = 16 << 10;

pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// A request the server answers with an error status before routing it.
#[derive(Debug)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

fn http_error(status: u16, message: impl Into<String>) -> HttpError {
    HttpError {
        status,
        message: message.into(),
    }
}

/// A reader of the connection that ends the whole request at a deadline: each read
/// waits at most for the time left (a client trickling a byte at a time gets no more).
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        s.read(buf)
    }
}

/// Reads one request within `timeout` in all (else 408): its line and headers (at most
/// `MAX_HEAD_BYTES`) and a body of at most `max_body` bytes given by Content-Length.
pub fn read_request(
    stream: &TcpStream,
    max_body: usize,
    timeout: Duration,
) -> Result<Request, HttpError> {
    let mut reader = BufReader::new(Deadline {
        stream,
        until: Instant::now() + timeout,
    });
    let mut head_bytes = 0;
    let mut content_length = None;
    let mut request_line = None;
    loop {
        let mut line = Vec::new();
        let left = (MAX_HEAD_BYTES - head_bytes) as u64;
        let n = (&mut reader)
            .take(left)
            .read_until(b'\n', &mut line)
            .map_err(read_failed)?;
        head_bytes += n;
        if !line.ends_with(b"\n") {
            return Err(match n as u64 == left {
                true => http_error(431, "the request head is over 16 KiB"),
                false => http_error(400, "the connection closed before the request was complete"),
            });
        }
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        if request_line.is_none() {
            request_line = Some(line.to_string());
            continue;
        }
        header(line, &mut content_length)?;
    }
    let request_line = request_line.unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(http_error(
            400,
            format!("a malformed request line {request_line:?}"),
        ));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(http_error(505, format!("{version} is not supported")));
    }
    let length = content_length.unwrap_or(0);
    if length > max_body {
        return Err(http_error(
            413,
            format!(
                "the body is {length} bytes, over the server's limit of {max_body} (--max-body)"
            ),
        ));
    }
    // Grown as bytes arrive, not allocated from the header's claim.
    let mut body = Vec::new();
    (&mut reader)
        .take(length as u64)
        .read_to_end(&mut body)
        .map_err(read_failed)?;
    if body.len() < length {
        return Err(http_error(
            400,
            format!("the body ended after {} of {length} bytes", body.len()),
        ));
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    Ok(Request {
        method: method.to_string(),
        path,
        body,
    })
}

/// One header line: Content-Length strictly (digits only, once, no space before the
/// colon, as RFC 9112 asks), a refusal of chunked bodies, the rest ignored.
fn header(line: &str, content_length: &mut Option<usize>) -> Result<(), HttpError> {
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| http_error(400, format!("a malformed header line {line:?}")))?;
    if name.is_empty() || name.ends_with([' ', '\t']) {
        return Err(http_error(400, format!("a malformed header name {name:?}")));
    }
    match name.to_ascii_lowercase().as_str() {
        "content-length" => {
            let v = value.trim();
            let n = v
                .parse::<usize>()
                .ok()
                .filter(|_| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| http_error(400, format!("Content-Length {v:?} is not a number")))?;
            if content_length.replace(n).is_some_and(|old| old != n) {
                return Err(http_error(400, "two different Content-Length headers"));
            }
        }
        "transfer-encoding" => {
            return Err(http_error(
                411,
                "chunked request bodies are not supported; send Content-Length",
            ))
        }
        _ => {}
    }
    Ok(())
}

fn read_failed(e: std::io::Error) -> HttpError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            http_error(408, "the request did not arrive in time")
        }
        _ => http_error(400, format!("reading the request: {e}")),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// A whole JSON response.
pub fn write_json(
    mut stream: &TcpStream,
    status: u16,
    v: &serde_json::Value,
) -> std::io::Result<()> {
    let body = v.to_string();
    write!(
        stream,
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        reason(status),
        body.len()
    )?;
    stream.flush()
}

/// OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(status: u16, code: &str, message: &str) -> serde_json::Value {
    let kind = match status {
        400..=499 => "invalid_request_error",
        503 => "server_busy",
        _ => "server_error",
    };
    serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

pub fn write_error(
    stream: &TcpStream,
    status: u16,
    code: &str,
    message: &str,
) -> std::io::Result<()> {
    write_json(stream, status, &error_body(status, code, message))
}

/// The head of a server-sent-events response; the events follow, and the body ends when
/// the connection closes.
pub fn start_events(mut stream: &TcpStream) -> std::io::Result<()> {
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    stream.flush()
}

/// One event (`data: ...`), sent at once.
pub fn write_event(mut stream: &TcpStream, data: &str) -> std::io::Result<()> {
    write!(stream, "data: {data}\n\n")?;
    stream.flush()
}

/// Whether the client has closed the connection. It sends nothing after its request,
/// so bytes found now are dropped and the end of the stream (or a reset) means it went
/// away; a client that half-closes after its request is taken as gone too (documented
/// in `dflash serve --help`).
pub fn client_gone(mut stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut buf = [0u8; 4096];
    let gone = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break true,
        }
    };
    let _ = stream.set_nonblocking(false);
    gone
}

/// After answering a request that was not read to its end: stops sending, then reads
/// and drops what the client still sends (for 2 s, at most 1 MiB, in all), so that closing
/// does not reset the connection before the client has read the answer.
pub fn linger(mut stream: &TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let until = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 16 << 10];
    let mut total = 0;
    while total < 1 << 20 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

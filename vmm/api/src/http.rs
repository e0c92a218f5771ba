//! HTTP/1.1 framing for the control socket: requests parsed with `httparse`, bodies bounded,
//! answers always JSON. A connection carries requests one after another (HTTP/1.1 keep-alive)
//! until the client asks to close (`Connection: close`, as `pvmm-ctl` and curl's one-shot
//! requests do), sends something malformed, or is silent for [`IO_TIMEOUT`]: a balancer that
//! asks every tick then pays for no connection, and pvmm for no thread, per request.
//!
//! The bounds are what keep a hostile or broken client to the cost of its own connection: the
//! head and the body are each read into a buffer of fixed maximum size, and a connection that
//! stalls is dropped after [`IO_TIMEOUT`].

use std::io::{Read, Write};
use std::time::Duration;

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest request body accepted: far above any valid request (255 vCPU assignments are
/// about 12 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most headers in one request.
const MAX_HEADERS: usize = 32;
/// A client that sends or reads nothing for this long loses its connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Read chunk size.
const READ_CHUNK: usize = 4096;

/// A request as the router sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// Method, as sent (`GET`, `PUT`, ...).
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// The body (empty when none).
    pub body: Vec<u8>,
    /// Whether the connection stays open for another request: HTTP/1.1 without
    /// `Connection: close`, and nothing sent past this request (pvmm answers one request at
    /// a time; a client that pipelines gets its first answer and the connection closed).
    pub keep_alive: bool,
}

/// An answer: status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpResponse {
    /// HTTP status code.
    pub status: u16,
    /// The JSON body.
    pub body: serde_json::Value,
    /// Methods the path allows (sent as `Allow` with 405).
    pub allow: Option<&'static str>,
}

impl HttpResponse {
    /// A response with `status` and `body`.
    pub fn new(status: u16, body: serde_json::Value) -> Self {
        Self {
            status,
            body,
            allow: None,
        }
    }

    /// An error answer: `{"error": message}`.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Self::new(status, serde_json::json!({ "error": message.into() }))
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub enum ReadFailure {
    /// The client closed or stalled before a whole request arrived: nothing to answer.
    Gone,
    /// The request is malformed or too big: answer with this and close.
    Bad(HttpResponse),
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Reads one request from `stream`.
pub fn read_request(stream: &mut impl Read) -> Result<HttpRequest, ReadFailure> {
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let (head_len, method, path, content_length, wants_more) = loop {
        if read_more(stream, &mut buf, MAX_HEAD_BYTES + MAX_BODY_BYTES)? == 0 {
            return Err(ReadFailure::Gone);
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let length = content_length(req.headers)?;
                let method = req.method.unwrap_or_default().to_string();
                let target = req.path.unwrap_or_default();
                let path = target.split('?').next().unwrap_or_default().to_string();
                let close = req.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("connection")
                        && std::str::from_utf8(h.value)
                            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("close"))
                });
                let wants_more = req.version == Some(1) && !close;
                break (n, method, path, length, wants_more);
            }
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
                return Err(bad(format!("request head over {MAX_HEAD_BYTES} bytes")))
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(bad(format!("malformed HTTP request: {e}"))),
        }
    };
    if content_length > MAX_BODY_BYTES {
        return Err(bad(format!(
            "request body of {content_length} bytes is over the {MAX_BODY_BYTES}-byte limit"
        )));
    }
    let total = head_len + content_length;
    while buf.len() < total {
        if read_more(stream, &mut buf, total)? == 0 {
            return Err(ReadFailure::Gone);
        }
    }
    let pipelined = buf.len() > total;
    buf.truncate(total);
    Ok(HttpRequest {
        method,
        path,
        body: buf.split_off(head_len),
        keep_alive: wants_more && !pipelined,
    })
}

fn bad(message: String) -> ReadFailure {
    ReadFailure::Bad(HttpResponse::error(400, message))
}

/// Reads what is available, up to `limit` bytes in `buf` in all; 0 at end of stream.
fn read_more(
    stream: &mut impl Read,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<usize, ReadFailure> {
    let room = limit.saturating_sub(buf.len()).clamp(1, READ_CHUNK);
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        match stream.read(&mut chunk[..room]) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Timeouts and resets: the client is gone or stalled; drop the connection.
            Err(_) => return Err(ReadFailure::Gone),
        }
    }
}

fn content_length(headers: &[httparse::Header<'_>]) -> Result<usize, ReadFailure> {
    let mut length = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad(
                "chunked request bodies are not supported; send Content-Length".into(),
            ));
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| bad("Content-Length is not a number".into()))?;
            if length.is_some_and(|l| l != value) {
                return Err(bad("conflicting Content-Length headers".into()));
            }
            length = Some(value);
        }
    }
    Ok(length.unwrap_or(0))
}

/// Writes `response` in one piece and flushes, saying whether the connection stays open;
/// errors mean the client went away, which costs nothing.
pub fn write_response(
    stream: &mut impl Write,
    response: &HttpResponse,
    keep_alive: bool,
) -> std::io::Result<()> {
    let mut body = response.body.to_string();
    body.push('\n');
    let allow = response
        .allow
        .map(|a| format!("Allow: {a}\r\n"))
        .unwrap_or_default();
    // One buffer, one write: `write!` straight to the socket sends each piece of the format
    // in its own system call.
    let text = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{allow}Connection: {}\r\n\r\n{body}",
        response.status,
        reason_phrase(response.status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" },
    );
    stream.write_all(text.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes in fixed-size pieces, as a socket may.
    struct Trickle<'a> {
        data: &'a [u8],
        piece: usize,
    }
    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.piece.min(out.len()).min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn read_all(data: &[u8], piece: usize) -> Result<HttpRequest, ReadFailure> {
        read_request(&mut Trickle { data, piece })
    }

    #[test]
    fn a_put_with_a_body_arrives_whole_in_any_pieces() {
        let raw = b"PUT /v1/policy?x=1 HTTP/1.1\r\nHost: localhost\r\nContent-Length: 26\r\n\r\n{\"policy\":\"performance\"}\r\nEXTRA";
        for piece in [1, 3, 7, 4096] {
            let r = read_all(raw, piece).unwrap();
            assert_eq!(r.method, "PUT");
            assert_eq!(r.path, "/v1/policy");
            assert_eq!(r.body, b"{\"policy\":\"performance\"}\r\n");
        }
    }

    #[test]
    fn limits_and_malformed_heads_are_400() {
        let status = |r: Result<HttpRequest, ReadFailure>| match r {
            Err(ReadFailure::Bad(resp)) => resp.status,
            other => panic!("{other:?}"),
        };
        let big = format!(
            "PUT /v1/policy HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        assert_eq!(status(read_all(big.as_bytes(), 4096)), 400);
        let head = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD_BYTES + 10));
        assert_eq!(status(read_all(head.as_bytes(), 4096)), 400);
        assert_eq!(status(read_all(b"\x01\x02 nonsense\r\n\r\n", 4096)), 400);
        let chunked = b"PUT /v1/policy HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(status(read_all(chunked, 4096)), 400);
        let two = b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab";
        assert_eq!(status(read_all(two, 4096)), 400);
    }

    #[test]
    fn a_client_that_leaves_early_is_just_gone() {
        assert!(matches!(read_all(b"", 1), Err(ReadFailure::Gone)));
        assert!(matches!(
            read_all(b"GET /v1/vm HTTP/1.1\r\n", 5),
            Err(ReadFailure::Gone)
        ));
        let short = b"PUT /v1/policy HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        assert!(matches!(read_all(short, 4096), Err(ReadFailure::Gone)));
    }

    #[test]
    fn responses_are_framed_json() {
        let mut out = Vec::new();
        let mut r = HttpResponse::error(405, "no");
        r.allow = Some("GET");
        write_response(&mut out, &r, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Connection: close\r\n"), "{text}");
        assert!(
            text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{text}"
        );
        assert!(text.contains("Allow: GET\r\n"));
        assert!(text.contains("Content-Length: 15\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{\"error\":\"no\"}\n"));
    }

    #[test]
    fn http_1_1_keeps_the_connection_unless_asked_or_pipelined() {
        let one = |raw: &[u8]| read_all(raw, 4096).map(|r| r.keep_alive).ok();
        assert_eq!(one(b"GET /v1/vm HTTP/1.1\r\n\r\n"), Some(true));
        assert_eq!(
            one(b"GET /v1/vm HTTP/1.1\r\nConnection: Close\r\n\r\n"),
            Some(false)
        );
        assert_eq!(one(b"GET /v1/vm HTTP/1.0\r\n\r\n"), Some(false));
        assert_eq!(
            one(b"GET /v1/vm HTTP/1.1\r\n\r\nGET /v1/vm HTTP/1.1\r\n\r\n"),
            Some(false)
        );
        let mut out = Vec::new();
        write_response(
            &mut out,
            &HttpResponse::new(200, serde_json::json!({})),
            true,
        )
        .unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("Connection: keep-alive\r\n"));
    }
}

//! `dflash serve` over HTTP on 127.0.0.1: the answers equal `dflash generate`'s (whole,
//! streamed, raw completions, on one kept-alive connection, chunked bodies), bad
//! requests get 4xx with OpenAI's error object, a full queue answers 429 while every
//! accepted request gets its whole, correct answer, a client that disconnects interrupts
//! its request, the API key, CORS and the metrics, and SIGTERM drains.

use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::testutil::{cached_model, random_weights, tiny_config, write_gguf};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running server, stopped when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(model: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args([
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--port",
            "0",
            "--device",
            "cpu",
        ])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    Server { child, port }
}

fn tiny_model() -> PathBuf {
    let d = std::env::temp_dir().join(format!("dflash-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let c = tiny_config(Arch::Qwen2);
    let path = d.join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 3), GgmlType::Q8_0),
    )
    .unwrap();
    path
}

/// One HTTP request: (status, body).
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

fn post(port: u16, path: &str, v: &Value) -> (u16, Value) {
    let (status, body) = http(port, "POST", path, v.to_string().as_bytes());
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The events of a streamed answer (the `data:` payloads, `[DONE]` last).
fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

/// `dflash generate`'s greedy text on the CPU engine.
fn generate(model: &Path, how: &str, text: &str, n: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(["generate", "--model", model.to_str().unwrap(), how, text])
        .args([
            "--max-new-tokens",
            &n.to_string(),
            "--device",
            "cpu",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string()
}

fn chat(content: &str, n: usize) -> Value {
    json!({"model": "any", "messages": [{"role": "user", "content": content}], "max_tokens": n, "temperature": 0})
}

#[test]
fn answers_equal_generate_whole_streamed_and_raw() {
    let model = tiny_model();
    let srv = serve(&model, &[]);
    let want = generate(&model, "--chat", "say the hello", 8);
    let (status, v) = post(srv.port, "/v1/chat/completions", &chat("say the hello", 8));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["model"], "tiny");
    // Streamed: the role chunk, the pieces, the finish chunk with usage, [DONE].
    let mut req = chat("say the hello", 8);
    req["stream"] = json!(true);
    let (status, body) = http(
        srv.port,
        "POST",
        "/v1/chat/completions",
        req.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    let ev = events(&body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, want);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 8);
    // /v1/completions: the raw prompt, not the chat template.
    let (status, v) = post(
        srv.port,
        "/v1/completions",
        &json!({"prompt": "the hello", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0]["text"],
        generate(&model, "--prompt", "the hello", 6).as_str()
    );
    let (_, models) = http(srv.port, "GET", "/v1/models", b"");
    assert_eq!(
        serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"],
        "tiny"
    );
    let (_, health) = http(srv.port, "GET", "/health", b"");
    assert_eq!(
        serde_json::from_str::<Value>(&health).unwrap()["requests"]["served"],
        3
    );
    // One kept-alive connection: a chunked body, then a Content-Length one, the same answer.
    let mut conn = BufReader::new(TcpStream::connect(("127.0.0.1", srv.port)).unwrap());
    let body = chat("say the hello", 8).to_string();
    let (half, rest) = body.split_at(body.len() / 2);
    write!(
        conn.get_mut(),
        "POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{half}\r\n{:x}\r\n{rest}\r\n0\r\n\r\n",
        half.len(),
        rest.len()
    )
    .unwrap();
    let (status, v) = read_response(&mut conn);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    write!(
        conn.get_mut(),
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (status, v) = read_response(&mut conn);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
}

/// One response with a Content-Length body from a kept-alive connection: (status, JSON).
fn read_response(conn: &mut BufReader<TcpStream>) -> (u16, Value) {
    let mut line = String::new();
    conn.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut length = 0;
    loop {
        let mut h = String::new();
        conn.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[test]
fn bad_requests_get_4xx_with_openai_error_objects() {
    let model = tiny_model();
    let srv = serve(&model, &["--max-body", "2000", "--context", "64"]);
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "POST",
            "/v1/chat/completions",
            b"{not json".to_vec(),
            400,
            "not JSON",
        ),
        (
            "POST",
            "/v1/chat/completions",
            b"[1, 2]".to_vec(),
            400,
            "JSON object",
        ),
        (
            "POST",
            "/v1/chat/completions",
            br#"{"messages": []}"#.to_vec(),
            400,
            "empty",
        ),
        (
            "POST",
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "temperature": -1}"#.to_vec(),
            400,
            "temperature",
        ),
        (
            "POST",
            "/v1/completions",
            format!(r#"{{"prompt": "{}"}}"#, "hello ".repeat(100)).into_bytes(),
            400,
            "context",
        ),
        (
            "POST",
            "/v1/completions",
            br#"{"max_tokens": 4}"#.to_vec(),
            400,
            "prompt",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![b' '; 3000],
            413,
            "limit",
        ),
        ("GET", "/v1/chat/completions", vec![], 405, "not allowed"),
        ("GET", "/v2/anything", vec![], 404, "no route"),
    ];
    for (method, path, body, status, says) in cases {
        let (got, text) = http(srv.port, method, path, &body);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: {text}"));
        assert_eq!(got, status, "{method} {path}: {text}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{method} {path}: {message}");
        assert!(v["error"]["type"].is_string());
    }
    // A head that never ends, and then the server still answers.
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    s.write_all(format!("GET /health HTTP/1.1\r\nX: {}\r\n", "a".repeat(20_000)).as_bytes())
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    assert_eq!(http(srv.port, "GET", "/health", b"").0, 200);
}

/// SmolLM2 decodes slowly enough on the CPU that requests overlap.
fn smollm2() -> Option<PathBuf> {
    let p = cached_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_none() && std::env::var_os("DFLASH_REQUIRE_MODELS").is_some() {
        panic!("SmolLM2 is required (DFLASH_REQUIRE_MODELS)");
    }
    p
}

/// `n` clients at once, each asking for the same greedy answer: (status, text, seconds)
/// each.
fn clients(port: u16, n: usize, tokens: usize) -> Vec<(u16, String, f64)> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                let (status, v) = post(
                    port,
                    "/v1/chat/completions",
                    &chat("Write a haiku about rain.", tokens),
                );
                (
                    status,
                    v["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    t.elapsed().as_secs_f64(),
                )
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The figures of one concurrency run, printed as a JSON line: requests, answered and
/// correct, refused with 429, and the latency percentiles of the answered ones.
fn print_figures(queue: usize, got: &[(u16, String, f64)], want: &str) {
    let mut ok: Vec<f64> = got.iter().filter(|g| g.0 == 200).map(|g| g.2).collect();
    ok.sort_by(f64::total_cmp);
    let pct = |p: f64| ok[((ok.len() - 1) as f64 * p).round() as usize];
    println!(
        "{}",
        json!({
            "queue": queue, "requests": got.len(), "answered": ok.len(),
            "all_correct": got.iter().filter(|g| g.0 == 200).all(|g| g.1 == want),
            "rejected_429": got.iter().filter(|g| g.0 == 429).count(),
            "p50_s": pct(0.5), "p99_s": pct(0.99),
        })
    );
}

#[test]
fn concurrent_clients_queue_in_order_or_get_429() {
    let Some(model) = smollm2() else { return };
    let want = generate(&model, "--chat", "Write a haiku about rain.", 24);
    // A queue for all: every request gets its whole, correct answer.
    let srv = serve(&model, &["--queue", "8"]);
    let got = clients(srv.port, 6, 24);
    print_figures(8, &got, &want);
    for (status, text, _) in &got {
        assert_eq!((*status, text.as_str()), (200, want.as_str()));
    }
    drop(srv);
    // A queue of 1: one waits while one runs (a request arriving before the engine took
    // the first from the queue finds it full), the rest are refused at once with 429.
    let srv = serve(&model, &["--queue", "1"]);
    let got = clients(srv.port, 6, 48);
    let want48 = generate(&model, "--chat", "Write a haiku about rain.", 48);
    print_figures(1, &got, &want48);
    let ok: Vec<_> = got.iter().filter(|g| g.0 == 200).collect();
    let busy = got.iter().filter(|g| g.0 == 429).count();
    assert_eq!(ok.len() + busy, 6, "{got:?}");
    assert!(busy >= 1 && !ok.is_empty(), "{got:?}");
    assert!(ok.iter().all(|g| g.1 == want48), "{got:?}");
    let (_, health) = http(srv.port, "GET", "/health", b"");
    let h: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(h["requests"]["rejected"], busy as u64);
}

#[test]
fn a_client_that_disconnects_interrupts_its_request() {
    let Some(model) = smollm2() else { return };
    let srv = serve(&model, &[]);
    let mut req = chat("Tell me a long story.", 2000);
    req["stream"] = json!(true);
    let body = req.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    s.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    drop(s);
    // Interrupted within moments (2000 tokens would take a minute), and the engine is free.
    let t = std::time::Instant::now();
    loop {
        let (_, health) = http(srv.port, "GET", "/health", b"");
        if serde_json::from_str::<Value>(&health).unwrap()["requests"]["interrupted"] == 1 {
            break;
        }
        assert!(t.elapsed().as_secs() < 20, "not interrupted: {health}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (status, v) = post(srv.port, "/v1/chat/completions", &chat("Hi", 4));
    assert_eq!(
        (status, v["usage"]["completion_tokens"].clone()),
        (200, json!(4))
    );
}

/// Sends `head` raw, then `trickle` one byte every 300 ms; the status line of the answer.
fn raw_status(port: u16, head: &str, trickle: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    for b in trickle.bytes() {
        std::thread::sleep(std::time::Duration::from_millis(300));
        if s.write_all(&[b]).is_err() {
            break;
        }
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or("").to_string()
}

#[test]
fn slow_and_malformed_heads_are_refused_in_bounded_time() {
    let model = tiny_model();
    let srv = serve(&model, &["--client-timeout", "2"]);
    // A head trickled a byte at a time: 408 at the 2 s deadline, not per byte.
    let t = std::time::Instant::now();
    let status = raw_status(
        srv.port,
        "GET /health HTTP/1.1\r\n",
        &"X-Slow: a\r\n".repeat(3),
    );
    assert!(status.starts_with("HTTP/1.1 408"), "{status}");
    assert!(t.elapsed().as_secs_f64() < 8.0, "{:?}", t.elapsed());
    // A kept-alive connection left idle past the timeout is closed without a word (a 408
    // there could be taken for the answer to a request sent at that moment).
    let mut conn = BufReader::new(TcpStream::connect(("127.0.0.1", srv.port)).unwrap());
    conn.get_mut()
        .write_all(b"GET /health HTTP/1.1\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut conn).0, 200);
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).unwrap();
    assert_eq!(String::from_utf8_lossy(&rest), "");
    for (head, code) in [
        (
            "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "400",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "400",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nContent-Length : 5\r\n\r\n",
            "400",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "400",
        ),
        ("GET /health HTTP/2.0\r\n\r\n", "400"),
        ("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", "200"),
    ] {
        let status = raw_status(srv.port, head, "");
        assert!(
            status.starts_with(&format!("HTTP/1.1 {code}")),
            "{head:?}: {status}"
        );
    }
    assert_eq!(http(srv.port, "GET", "/health", b"").0, 200);
    // Out of range timeouts are usage errors.
    let out = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args([
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--client-timeout",
            "NaN",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A raw request's whole response (the server closes after it).
fn raw(port: u16, request: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn the_api_key_cors_and_metrics() {
    let model = tiny_model();
    let srv = serve(
        &model,
        &[
            "--api-key",
            "sk-test",
            "--cors-origin",
            "http://app.example",
        ],
    );
    let models = |auth: &str| {
        raw(
            srv.port,
            &format!("GET /v1/models HTTP/1.1\r\n{auth}Connection: close\r\n\r\n"),
        )
    };
    let refused = models("");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{refused}"
    );
    assert!(models("Authorization: Bearer sk-nope\r\n").starts_with("HTTP/1.1 401"));
    let ok = models("Authorization: Bearer sk-test\r\n");
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("\"tiny\""),
        "{ok}"
    );
    // /health and /metrics need no key.
    assert_eq!(http(srv.port, "GET", "/health", b"").0, 200);
    // A preflight from the allowed origin, then from another.
    let preflight = |origin: &str| {
        raw(
            srv.port,
            &format!(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"
            ),
        )
        .to_ascii_lowercase()
    };
    let allowed = preflight("http://app.example");
    assert!(allowed.starts_with("http/1.1 200"), "{allowed}");
    assert!(
        allowed.contains("access-control-allow-origin: http://app.example"),
        "{allowed}"
    );
    assert!(allowed.contains("authorization"), "{allowed}");
    assert!(!preflight("http://evil.example").contains("access-control-allow-origin"));
    // Every response above counted by route and status.
    assert_metrics(
        srv.port,
        &[
            "dflash_http_responses_total{route=\"/v1/models\",status=\"401\"} 2",
            "dflash_http_responses_total{route=\"/v1/models\",status=\"200\"} 1",
            "dflash_http_responses_total{route=\"/health\",status=\"200\"} 1",
            "dflash_requests_in_flight 0",
        ],
    );
    // A generation's figures.
    let (status, v) = post_with_key(srv.port, &chat("say the hello", 8), "sk-test");
    assert_eq!(status, 200, "{v}");
    assert_metrics(
        srv.port,
        &[
            "dflash_completion_tokens_total 8",
            "dflash_time_to_first_token_seconds_count 1",
            "dflash_decode_tokens_per_second_count 1",
            "dflash_requests_served_total 1",
        ],
    );
}

/// `/metrics` has each of `lines`.
fn assert_metrics(port: u16, lines: &[&str]) {
    let metrics = raw(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    for line in lines {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

fn post_with_key(port: u16, v: &Value, key: &str) -> (u16, Value) {
    let body = v.to_string();
    let out = raw(
        port,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Starts a streamed completion (counting, which goes on and on) and reads until its
/// first piece arrives.
fn start_stream(port: u16, tokens: usize) -> BufReader<TcpStream> {
    let req = json!({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": tokens, "temperature": 0, "stream": true});
    let body = req.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "no answer");
    }
    r
}

/// The rest of a stream's events, and the finish reason of its last chunk.
fn finish_of(mut r: BufReader<TcpStream>) -> (Vec<String>, Value) {
    let mut rest = String::new();
    let _ = r.read_to_string(&mut rest);
    let ev = events(&rest);
    let last = ev
        .iter()
        .rev()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .map(|c| c["choices"][0]["finish_reason"].clone())
        .unwrap_or(Value::Null);
    (ev, last)
}

fn stop(srv: &mut Server) -> std::time::Instant {
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    std::time::Instant::now()
}

#[test]
fn sigterm_finishes_the_requests_in_flight_then_interrupts_them_at_the_deadline() {
    let Some(model) = smollm2() else { return };
    // A request in flight finishes whole; new connections are refused; the server exits 0.
    let mut srv = serve(&model, &[]);
    let stream = start_stream(srv.port, 48);
    // A connection that never sends a request does not hold the stop.
    let _idle = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    let t = stop(&mut srv);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        TcpStream::connect(("127.0.0.1", srv.port)).is_err(),
        "still accepting"
    );
    let (ev, finish) = finish_of(stream);
    assert_eq!(
        (ev.last().map(String::as_str), finish),
        (Some("[DONE]"), json!("length"))
    );
    assert!(srv.child.wait().unwrap().success());
    let took = t.elapsed().as_secs_f64();
    println!("drained one request in {took:.2} s");
    assert!(took < 10.0, "stopped after {took:.1} s");
    // Past --shutdown-timeout the request is interrupted and ends cleanly.
    let mut srv = serve(&model, &["--shutdown-timeout", "1"]);
    let stream = start_stream(srv.port, 2000);
    let t = stop(&mut srv);
    let (ev, finish) = finish_of(stream);
    assert_eq!(
        (ev.last().map(String::as_str), finish),
        (Some("[DONE]"), json!("abort"))
    );
    assert!(srv.child.wait().unwrap().success());
    let took = t.elapsed().as_secs_f64();
    assert!(took < 5.0, "stopped after {took:.1} s");
}

#[test]
fn clients_that_leave_the_queue_free_their_places() {
    let Some(model) = smollm2() else { return };
    // One place runs, one waits.
    let srv = serve(&model, &["--queue", "1"]);
    let running = start_stream(srv.port, 2000);
    // Clients that queue and leave at once, many times the queue's bound.
    let body = chat("Hi", 4).to_string();
    for _ in 0..10 {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Their places are free again: only the running request holds one.
    let t = std::time::Instant::now();
    loop {
        let (_, health) = http(srv.port, "GET", "/health", b"");
        let h: Value = serde_json::from_str(&health).unwrap();
        if h["requests"]["in_flight"] == 1 && h["requests"]["queued"] == 0 {
            break;
        }
        assert!(t.elapsed().as_secs() < 10, "places still taken: {health}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A new request takes the waiting place and is answered once the running one leaves.
    let waiting =
        std::thread::spawn(move || post(srv.port, "/v1/chat/completions", &chat("Hi", 4)));
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(running);
    let (status, v) = waiting.join().unwrap();
    assert_eq!(
        (status, v["usage"]["completion_tokens"].clone()),
        (200, json!(4)),
        "{v}"
    );
}

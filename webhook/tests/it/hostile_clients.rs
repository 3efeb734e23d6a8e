//! One client must not stop the webhook: the real server (in process on port 0, and the real
//! binary for SIGTERM) against real TLS clients over loopback that stall at every stage — a TCP
//! connection that never starts TLS, a ClientHello cut short, a TLS connection that sends nothing,
//! `P`, `PR` or 23 of the 24 bytes of the HTTP/2 preface, half a request line, an idle HTTP/2
//! connection, idle keep-alive connections, stalled request bodies. Checked: a well-formed review
//! from another connection is answered correctly while they stall; the server closes each of them
//! (asserted within a generous bound against a short configured timeout, never a latency
//! threshold); SIGTERM with idle connections open exits long before the grace period. And
//! readiness does not wait for the node list.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hami_tests::local::free_port;
use hami_webhook::policy::settings::Settings;
use hami_webhook::shell::dev_mode::{DevCerts, generate_localhost};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::support;
use support::{Body, DEADLINE, Server, client_config, full, ops_get, start_in, wait_for};

const PLAIN_POD: &str = include_str!("../fixtures/plain-pod.json");
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn start(certs: &DevCerts, tweak: impl FnOnce(&mut Settings)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), certs);
    let mut settings = Settings::default();
    settings.server.shutdown_grace_seconds = 10;
    tweak(&mut settings);
    start_in(dir, settings).await
}

/// The value of the metric line starting with `name ` (labels included in `name`).
async fn metric(ops: SocketAddr, name: &str) -> f64 {
    let (_, body) = ops_get(ops, "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

async fn wait_metric(ops: SocketAddr, name: &str, want: impl Fn(f64) -> bool) {
    let name = name.to_owned();
    wait_for(ops, "/metrics", move |_, body| {
        body.lines().any(|l| {
            l.strip_prefix(name.as_str())
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(&want)
        })
    })
    .await;
}

async fn tls(addr: SocketAddr, ca: &str, alpn: &[u8]) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(client_config(ca, &[alpn], false))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// Read until the server closes (EOF, a TLS close, or a reset). Panics after DEADLINE.
async fn closed_by_server(mut io: impl AsyncRead + Unpin, what: &str) {
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(end, io.read(&mut buf)).await {
            Err(_) => panic!("{what}: still open after {DEADLINE:?}"),
            Ok(Ok(0) | Err(_)) => return,
            // An HTTP/2 SETTINGS or GOAWAY, an HTTP 408: keep reading to the close.
            Ok(Ok(_)) => {}
        }
    }
}

/// A client connection that stalls in one way; `closed` completes when the server closes it.
struct Stalled {
    what: String,
    closed: JoinHandle<()>,
    /// Kept open (dropping it would end the stalled body).
    _hold: Option<Box<dyn std::any::Any + Send>>,
}

/// Every kind of connection that holds no request, opened against `addr`.
async fn open_idle_kinds(addr: SocketAddr, ca: &str) -> Vec<Stalled> {
    let mut out = Vec::new();
    let mut raw = |what: &str, io: Box<dyn AsyncRead + Unpin + Send>| {
        let what = what.to_owned();
        let w = what.clone();
        out.push(Stalled {
            what,
            closed: tokio::spawn(async move { closed_by_server(io, &w).await }),
            _hold: None,
        });
    };
    // TCP only: the TLS handshake never starts.
    raw(
        "tcp, no ClientHello",
        Box::new(TcpStream::connect(addr).await.unwrap()),
    );
    // A ClientHello cut short: the handshake never completes.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&[0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03])
        .await
        .unwrap();
    raw("partial ClientHello", Box::new(tcp));
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let name = String::from_utf8_lossy(alpn).into_owned();
        raw(
            &format!("TLS ({name}), nothing sent"),
            Box::new(tls(addr, ca, alpn).await),
        );
        for n in [1, 2, 23] {
            let mut s = tls(addr, ca, alpn).await;
            s.write_all(&PREFACE[..n]).await.unwrap();
            s.flush().await.unwrap();
            raw(&format!("TLS ({name}), {n} preface bytes"), Box::new(s));
        }
    }
    let mut s = tls(addr, ca, b"http/1.1").await;
    s.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    s.flush().await.unwrap();
    raw("HTTP/1.1, half the headers", Box::new(s));
    // An HTTP/2 connection (preface, SETTINGS) that never opens a stream.
    let (send, conn) = hyper::client::conn::http2::handshake::<_, _, Body>(
        TokioExecutor::new(),
        TokioIo::new(tls(addr, ca, b"h2").await),
    )
    .await
    .unwrap();
    out.push(Stalled {
        what: "HTTP/2, no stream".to_owned(),
        closed: tokio::spawn(async move {
            let _ = conn.await;
        }),
        _hold: Some(Box::new(send)),
    });
    out
}

/// `n` requests whose headers arrive and whose body stalls: over HTTP/1.1 (one per connection)
/// and over one HTTP/2 connection (one stream each), alternately.
async fn open_stalled_bodies(addr: SocketAddr, ca: &str, n: usize) -> Vec<Stalled> {
    let mut out = Vec::new();
    let (h2, conn) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        TokioIo::new(tls(addr, ca, b"h2").await),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for i in 0..n {
        if i % 2 == 0 {
            let mut s = tls(addr, ca, b"http/1.1").await;
            s.write_all(
                b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n{\"apiVersion\":",
            )
            .await
            .unwrap();
            s.flush().await.unwrap();
            out.push(Stalled {
                what: format!("HTTP/1.1 stalled body {i}"),
                closed: tokio::spawn(async move { closed_by_server(s, "stalled body").await }),
                _hold: None,
            });
        } else {
            let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
            tx.unbounded_send(Ok(Frame::data(Bytes::from_static(b"{\"apiVersion\":"))))
                .unwrap();
            let req = Request::post("https://localhost/mutate")
                .header("content-type", "application/json")
                .body(BodyExt::boxed(StreamBody::new(rx)))
                .unwrap();
            let mut h2 = h2.clone();
            h2.ready().await.unwrap();
            let response = h2.send_request(req);
            out.push(Stalled {
                what: format!("HTTP/2 stalled body {i}"),
                closed: tokio::spawn(async move {
                    // The server answers 408 once its request timeout passes.
                    let _ = response.await;
                }),
                _hold: Some(Box::new(tx)),
            });
        }
    }
    out
}

/// A well-formed review on a fresh connection of its own, over `alpn`.
async fn good_review(addr: SocketAddr, ca: &str, alpn: &[u8]) -> Value {
    let io = TokioIo::new(tls(addr, ca, alpn).await);
    let req = Request::post("https://localhost/mutate")
        .header("content-type", "application/json")
        .body(full(PLAIN_POD))
        .unwrap();
    let resp = if alpn == b"h2" {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        send.ready().await.unwrap();
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

fn assert_allowed(out: &Value) {
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1", "{out}");
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert_eq!(
        out["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002",
        "{out}"
    );
}

async fn all_closed(stalled: Vec<Stalled>) {
    for s in stalled {
        tokio::time::timeout(DEADLINE, s.closed)
            .await
            .unwrap_or_else(|_| panic!("{}: not closed by the server", s.what))
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stalled_connection_is_closed_within_the_idle_timeout_while_reviews_go_on() {
    let certs = generate_localhost().unwrap();
    let server = start(&certs, |s| {
        s.server.idle_timeout_seconds = 1;
        s.server.tls_handshake_timeout_seconds = 1;
        s.server.request_timeout_seconds = 1;
    })
    .await;
    let ca = certs.ca_pem.as_str();
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.extend(open_idle_kinds(server.addr, ca).await);
    }
    stalled.extend(open_stalled_bodies(server.addr, ca, 8).await);
    // Idle keep-alive connections after one review each, HTTP/1.1 and HTTP/2.
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let io = TokioIo::new(tls(server.addr, ca, alpn).await);
        let req = || {
            Request::post("https://localhost/mutate")
                .header("content-type", "application/json")
                .body(full(PLAIN_POD))
                .unwrap()
        };
        let (closed, hold): (JoinHandle<()>, Box<dyn std::any::Any + Send>) = if alpn == b"h2" {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            let closed = tokio::spawn(async move {
                let _ = conn.await;
            });
            send.ready().await.unwrap();
            assert_eq!(send.send_request(req()).await.unwrap().status(), 200);
            (closed, Box::new(send))
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            let closed = tokio::spawn(async move {
                let _ = conn.await;
            });
            assert_eq!(send.send_request(req()).await.unwrap().status(), 200);
            (closed, Box::new(send))
        };
        stalled.push(Stalled {
            what: format!("{} keep-alive, idle", String::from_utf8_lossy(alpn)),
            closed,
            _hold: Some(hold),
        });
    }
    // While they stall, reviews from other connections are answered.
    assert_allowed(&good_review(server.addr, ca, b"h2").await);
    assert_allowed(&good_review(server.addr, ca, b"http/1.1").await);
    // And the server closes every one of them (timeouts of 1 s; the bound is DEADLINE).
    all_closed(stalled).await;
    wait_metric(
        server.ops,
        r#"hami_webhook_connections_closed_total{reason="idle"}"#,
        |v| v >= 40.0,
    )
    .await;
    wait_metric(
        server.ops,
        r#"hami_webhook_http_errors_total{code="408"}"#,
        |v| v >= 8.0,
    )
    .await;
    wait_metric(server.ops, "hami_webhook_connections_open", |v| v == 0.0).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_do_not_hold_the_review_slots() {
    let certs = generate_localhost().unwrap();
    // Nothing times out during the test: a review that waited for a stalled body's slot would
    // wait 600 s and fail the test's DEADLINE.
    let server = start(&certs, |s| {
        s.server.max_concurrent_requests = 8;
        s.server.request_timeout_seconds = 600;
        s.server.idle_timeout_seconds = 600;
    })
    .await;
    let ca = certs.ca_pem.as_str();
    let stalled = open_stalled_bodies(server.addr, ca, 16).await;
    wait_metric(server.ops, "hami_webhook_admission_in_flight", |v| {
        v >= 16.0
    })
    .await;
    assert_allowed(&good_review(server.addr, ca, b"h2").await);
    assert_allowed(&good_review(server.addr, ca, b"http/1.1").await);
    // The stalled ones are still there: the reviews did not wait for them.
    assert!(metric(server.ops, "hami_webhook_admission_in_flight").await >= 16.0);
    // The clients go away (their reading tasks hold the sockets).
    for s in stalled {
        s.closed.abort();
    }
    wait_metric(server.ops, "hami_webhook_admission_in_flight", |v| v == 0.0).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_never_lock_a_client_out_at_max_connections() {
    let certs = generate_localhost().unwrap();
    // No timeout helps during the test: only eviction can let the review in.
    let server = start(&certs, |s| {
        s.server.max_connections = 24;
        s.server.idle_timeout_seconds = 600;
        s.server.tls_handshake_timeout_seconds = 600;
    })
    .await;
    let ca = certs.ca_pem.as_str();
    let mut stalled = open_idle_kinds(server.addr, ca).await;
    while stalled.len() < 24 {
        let s = tls(server.addr, ca, b"h2").await;
        let what = format!("TLS, nothing sent {}", stalled.len());
        let w = what.clone();
        stalled.push(Stalled {
            what,
            closed: tokio::spawn(async move { closed_by_server(s, &w).await }),
            _hold: None,
        });
    }
    wait_metric(server.ops, "hami_webhook_connections_open", |v| v == 24.0).await;
    for _ in 0..3 {
        assert_allowed(&good_review(server.addr, ca, b"h2").await);
        assert_allowed(&good_review(server.addr, ca, b"http/1.1").await);
    }
    // (A review's connection, closed by its client, frees its slot for the next one.)
    wait_metric(
        server.ops,
        r#"hami_webhook_connections_closed_total{reason="evicted"}"#,
        |v| v >= 1.0,
    )
    .await;
    assert!(metric(server.ops, "hami_webhook_connections_open").await <= 24.0);
    // The first ones opened went first.
    let first = stalled.remove(0);
    tokio::time::timeout(DEADLINE, first.closed)
        .await
        .unwrap_or_else(|_| panic!("{}: not evicted", first.what))
        .unwrap();
    server.stop().await;
}

fn write_pair(dir: &Path, certs: &DevCerts) {
    std::fs::write(dir.join("tls.crt"), &certs.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &certs.key_pem).unwrap();
}

/// The binary: SIGTERM with idle keep-alive and header-less connections open exits at once,
/// not at the end of the (60 s) grace period; an in-flight review still finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_idle_connections_exits_promptly() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = generate_localhost().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), &certs);
    let (port, ops_port) = (free_port(), free_port());
    let config = dir.path().join("webhook.yaml");
    std::fs::write(
        &config,
        format!(
            "server:\n  listen: 127.0.0.1:{port}\n  metricsListen: 127.0.0.1:{ops_port}\n  tlsCert: {}\n  tlsKey: {}\n  shutdownGraceSeconds: 60\n  idleTimeoutSeconds: 600\n",
            dir.path().join("tls.crt").display(),
            dir.path().join("tls.key").display()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hami-webhook"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ops = SocketAddr::from(([127, 0, 0, 1], ops_port));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while TcpStream::connect(ops).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(ops, "/readyz", |s, _| s == StatusCode::OK).await;
    let ca = certs.ca_pem.as_str();
    let mut held = open_idle_kinds(addr, ca).await;
    // Keep-alive connections that served a review and now idle.
    for alpn in [&b"http/1.1"[..], b"h2"] {
        for _ in 0..4 {
            let io = TokioIo::new(tls(addr, ca, alpn).await);
            let req = Request::post("https://localhost/mutate")
                .header("content-type", "application/json")
                .body(full(PLAIN_POD))
                .unwrap();
            let closed = if alpn == b"h2" {
                let (mut send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                        .await
                        .unwrap();
                let closed = tokio::spawn(async move {
                    let _ = conn.await;
                });
                send.ready().await.unwrap();
                assert_eq!(send.send_request(req).await.unwrap().status(), 200);
                held.push(Stalled {
                    what: "h2 keep-alive".into(),
                    closed,
                    _hold: Some(Box::new(send)),
                });
                continue;
            } else {
                let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                let closed = tokio::spawn(async move {
                    let _ = conn.await;
                });
                assert_eq!(send.send_request(req).await.unwrap().status(), 200);
                (closed, send)
            };
            held.push(Stalled {
                what: "http/1.1 keep-alive".into(),
                closed: closed.0,
                _hold: Some(Box::new(closed.1)),
            });
        }
    }
    // One review in flight: its body arrives in two parts, the second after SIGTERM.
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
    let half = PLAIN_POD.len() / 2;
    tx.unbounded_send(Ok(Frame::data(Bytes::from(&PLAIN_POD.as_bytes()[..half]))))
        .unwrap();
    let io = TokioIo::new(tls(addr, ca, b"h2").await);
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    send.ready().await.unwrap();
    let in_flight = send.send_request(
        Request::post("https://localhost/mutate")
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(rx)))
            .unwrap(),
    );
    let in_flight = tokio::spawn(in_flight);
    wait_metric(ops, "hami_webhook_admission_in_flight", |v| v == 1.0).await;

    let pid = child.id().unwrap().to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    // The idle connections are closed at once, while the in-flight review is still open.
    all_closed(held).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "waits for the in-flight review"
    );
    tx.unbounded_send(Ok(Frame::data(Bytes::from(&PLAIN_POD.as_bytes()[half..]))))
        .unwrap();
    drop(tx);
    let resp = tokio::time::timeout(DEADLINE, in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_allowed(&serde_json::from_slice(&body).unwrap());
    // Exits well before the 60 s grace period (DEADLINE is 20 s).
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("exits before the grace period ends")
        .unwrap();
    assert!(status.success(), "{status}");
}

/// Readiness is the certificate's alone: the binary, watching nodes with no reachable API server,
/// is ready, reports the failing watch in its metrics, and answers reviews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_while_nodes_cannot_be_listed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = generate_localhost().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), &certs);
    let (mut child, addr, ops) = start_binary(dir.path(), &[], &[("RUST_LOG", "off")], false).await;
    wait_metric(ops, "hami_webhook_kai_node_watch_failing", |v| v == 1.0).await;
    let (status, body) = ops_get(ops, "/readyz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));
    assert_eq!(metric(ops, "hami_webhook_kai_node_watch_synced").await, 0.0);
    // `serve` restarted itself (same pid) with glibc's mmap threshold fixed, so that freed
    // request bodies leave no resident memory behind.
    let environ = std::fs::read(format!("/proc/{}/environ", child.id().unwrap())).unwrap();
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|v| v == b"GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072"),
        "{}",
        String::from_utf8_lossy(&environ)
    );
    assert_allowed(&good_review(addr, &certs.ca_pem, b"h2").await);
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

/// The real binary, `serve` on free loopback ports with the pair in `dir`, no cluster (neither
/// in-cluster variables nor a kubeconfig), `extra` flags and `env`; returns once the ops port
/// listens: the child, the admission address and the ops address.
async fn start_binary(
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    capture_stderr: bool,
) -> (tokio::process::Child, SocketAddr, SocketAddr) {
    let (port, ops_port) = (free_port(), free_port());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_hami-webhook"));
    command
        .arg("serve")
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--metrics-listen=127.0.0.1:{ops_port}"))
        .arg(format!("--tls-cert={}", dir.join("tls.crt").display()))
        .arg(format!("--tls-key={}", dir.join("tls.key").display()))
        .args(extra)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .env("HOME", dir)
        .env_remove("GLIBC_TUNABLES")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    if capture_stderr {
        command.stderr(std::process::Stdio::piped());
    }
    let child = command.spawn().unwrap();
    let ops = SocketAddr::from(([127, 0, 0, 1], ops_port));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while TcpStream::connect(ops).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, SocketAddr::from(([127, 0, 0, 1], port)), ops)
}

/// POSTs `body` to `/mutate` over HTTP/1.1 on a fresh connection; the status and the body.
async fn post(addr: SocketAddr, ca: &str, body: String) -> (StatusCode, Bytes) {
    let io = TokioIo::new(tls(addr, ca, b"http/1.1").await);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = Request::post("https://localhost/mutate")
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// The binary's JSON logs at debug level: every admission log line names the request's uid, and
/// each review gets one access-log line (`admission review`: uid, outcome, sizes, time); a request
/// refused before review gets `admission request refused` with its HTTP status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admission_log_line_names_the_request_uid() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = generate_localhost().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), &certs);
    let (child, addr, ops) = start_binary(
        dir.path(),
        &["--per-gpu-vram-mib=16384"],
        &[
            ("HAMI_LOG_FORMAT", "json"),
            ("RUST_LOG", "hami_webhook=debug"),
        ],
        true,
    )
    .await;
    wait_for(ops, "/readyz", |s, _| s == StatusCode::OK).await;
    let ca = certs.ca_pem.as_str();

    let plain: Value = serde_json::from_str(PLAIN_POD).unwrap();
    let plain_uid = plain["request"]["uid"].as_str().unwrap().to_owned();
    let (status, _) = post(addr, ca, PLAIN_POD.to_owned()).await;
    assert_eq!(status, StatusCode::OK);

    let mut denied: Value =
        serde_json::from_str(include_str!("../fixtures/hami-pod.json")).unwrap();
    denied["request"]["uid"] = "deny-uid-0001".into();
    denied["request"]["object"]["spec"]["containers"][0]["securityContext"] =
        serde_json::json!({"privileged": true});
    let (status, answer) = post(addr, ca, denied.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");

    let (status, _) = post(addr, ca, "not json".to_owned()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let mut child = child;
    child.start_kill().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let find = |message: &str, uid: &str| {
        lines
            .iter()
            .find(|l| l["message"] == message && l["uid"] == uid)
            .cloned()
            .unwrap_or_else(|| panic!("no {message:?} line for uid {uid:?} in {lines:#?}"))
    };
    let access = find("admission review", &plain_uid);
    assert_eq!(access["level"], "DEBUG", "{access}");
    assert_eq!(access["outcome"], "allowed", "{access}");
    assert!(
        access["elapsed_us"].is_u64() && access["response_bytes"].is_u64(),
        "{access}"
    );
    let warned = find("admission denied", "deny-uid-0001");
    assert!(
        warned["reason"].as_str().unwrap().contains("privileged"),
        "{warned}"
    );
    assert_eq!(
        find("admission review", "deny-uid-0001")["outcome"],
        "denied"
    );
    // Every line about a review names its uid.
    for l in &lines {
        if l["message"] == "admission review" || l["message"] == "admission denied" {
            assert!(l["uid"].as_str().is_some_and(|u| !u.is_empty()), "{l}");
        }
    }
    let refused = lines
        .iter()
        .find(|l| l["message"] == "admission request refused")
        .unwrap_or_else(|| panic!("no refusal line in {lines:#?}"));
    assert_eq!(refused["code"], 400, "{refused}");
}

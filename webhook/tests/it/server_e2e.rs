//! End to end over TLS, in process: the real server on port 0, real TLS clients (HTTP/1.1 and h2).
//! Every wait is for a condition (a readiness answer, a metric value), bounded by a deadline.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hami_webhook::policy::settings::Settings;
use hami_webhook::shell::dev_mode::{DevCerts, generate_localhost};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::support;
use support::{Body, DEADLINE, Server, client_config, full, install_provider, spawn_in, start_in};

const PLAIN_POD: &str = include_str!("../fixtures/plain-pod.json");
const HAMI_POD: &str = include_str!("../fixtures/hami-pod.json");
const KAI_POD: &str = include_str!("../fixtures/kai-fraction-small.json");

/// Write the certificate and key the way a Secret volume does: files behind a `..data` symlink
/// that is swapped atomically to a new timestamped directory.
fn write_secret(dir: &Path, generation: u32, cert: &str, key: &str) {
    let data = dir.join(format!("..gen{generation}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("tls.crt"), cert).unwrap();
    std::fs::write(data.join("tls.key"), key).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..gen{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).unwrap();
        }
    }
}

async fn start(certs: &DevCerts, tweak: impl FnOnce(&mut Settings)) -> Server {
    install_provider();
    let dir = tempfile::tempdir().unwrap();
    write_secret(dir.path(), 0, &certs.cert_pem, &certs.key_pem);
    let mut settings = Settings::default();
    settings.server.cert_reload_interval_seconds = 1;
    settings.server.shutdown_grace_seconds = 10;
    tweak(&mut settings);
    start_in(dir, settings).await
}

/// A TLS connection: the negotiated ALPN, the server's leaf certificate, and a request sender.
struct Conn {
    send: Sender,
    alpn: Option<Vec<u8>>,
    leaf: Vec<u8>,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

async fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> std::io::Result<Conn> {
    let tcp = TcpStream::connect(addr).await?;
    let tls = TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    let (_, session) = tls.get_ref();
    let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    let leaf = session.peer_certificates().unwrap()[0].to_vec();
    let io = TokioIo::new(tls);
    let send = if alpn.as_deref() == Some(b"h2") {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        Sender::H2(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        Sender::H1(send)
    };
    Ok(Conn { send, alpn, leaf })
}

impl Conn {
    async fn post(&mut self, content_type: Option<&str>, body: Body) -> (StatusCode, Bytes) {
        self.post_declared(content_type, None, body).await
    }

    async fn post_declared(
        &mut self,
        content_type: Option<&str>,
        content_length: Option<usize>,
        body: Body,
    ) -> (StatusCode, Bytes) {
        let mut req = Request::post("https://localhost/mutate");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        if let Some(n) = content_length {
            req = req.header("content-length", n);
        }
        let req = req.body(body).unwrap();
        let resp = match &mut self.send {
            Sender::H1(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await.unwrap()
            }
            Sender::H2(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await.unwrap()
            }
        };
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    }

    async fn review(&mut self, review: &str) -> Value {
        let (status, body) = self
            .post(Some("application/json"), full(review.to_owned()))
            .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }
}

fn leaf_der(cert_pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_h2_answer_v1_and_v1beta1() {
    let certs = generate_localhost().unwrap();
    let server = start(&certs, |_| {}).await;
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let mut conn = connect(server.addr, client_config(&certs.ca_pem, &[alpn], false))
            .await
            .unwrap();
        assert_eq!(conn.alpn.as_deref(), Some(alpn));
        let out = conn.review(PLAIN_POD).await;
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(
            out["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert!(out["response"].get("patch").is_none());
        let out = conn.review(HAMI_POD).await;
        assert_eq!(out["response"]["patchType"], "JSONPatch");
        let beta = HAMI_POD.replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1");
        let out = conn.review(&beta).await;
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1beta1");
        assert_eq!(out["response"]["allowed"], true);
    }
    // No ALPN at all (a plain TLS client): HTTP/1.1.
    let mut conn = connect(server.addr, client_config(&certs.ca_pem, &[], false))
        .await
        .unwrap();
    assert_eq!(conn.alpn, None);
    assert_eq!(conn.review(PLAIN_POD).await["response"]["allowed"], true);
    server
        .wait_metric(r#"hami_webhook_admission_requests_total{outcome="allowed"} 3"#)
        .await;
    server
        .wait_metric(r#"hami_webhook_admission_requests_total{outcome="patched"} 4"#)
        .await;
    server.stop().await;
}

/// The pod a CREATE review's answer makes of `review`'s object.
fn patched(review: &Value, answer: &Value) -> Value {
    use base64::Engine as _;
    let mut pod = review["request"]["object"].clone();
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

/// An UPDATE review of `old` to `new`.
fn update_review(old: &Value, new: &Value) -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-update", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ml-team", "operation": "UPDATE", "object": new, "oldObject": old}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_may_not_touch_the_owned_limits_annotations() {
    let certs = generate_localhost().unwrap();
    let server = start(&certs, |s| s.kai.per_gpu_vram_mib = Some(16384)).await;
    let mut conn = connect(server.addr, client_config(&certs.ca_pem, &[b"h2"], false))
        .await
        .unwrap();
    let create: Value = serde_json::from_str(KAI_POD).unwrap();
    let answer = conn.review(KAI_POD).await;
    let pod = patched(&create, &answer);
    let key = "limits.hami.io/train";
    assert!(pod["metadata"]["annotations"][key].is_string());
    // Unchanged, or another annotation changed: allowed, no patch.
    let mut labelled = pod.clone();
    labelled["metadata"]["annotations"]["team"] = json!("a");
    for new in [&pod, &labelled] {
        let out = conn.review(&update_review(&pod, new)).await;
        assert_eq!(out["response"]["uid"], "u-update");
        assert_eq!(out["response"]["allowed"], true, "{out}");
        assert!(out["response"].get("patch").is_none(), "{out}");
    }
    // Raised, removed, or added: denied, naming the key.
    let mut raised = pod.clone();
    raised["metadata"]["annotations"][key] =
        json!("CUDA_DEVICE_MEMORY_LIMIT=999999m\nHAMI_LIMITS_FORMAT=1\n");
    let mut removed = pod.clone();
    removed["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(key);
    let mut added = pod.clone();
    added["metadata"]["annotations"]["limits.hami.io/other"] = json!("x");
    for (new, verb, named) in [
        (&raised, "changes", key),
        (&removed, "removes", key),
        (&added, "adds", "limits.hami.io/other"),
    ] {
        let out = conn.review(&update_review(&pod, new)).await;
        assert_eq!(out["response"]["allowed"], false, "{out}");
        assert_eq!(out["response"]["status"]["code"], 403, "{out}");
        let message = out["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("this update {verb} {named:?}")),
            "{message}"
        );
    }
    // An invalid limit-delivery set by an update is refused too.
    let mut delivery = pod.clone();
    delivery["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("FILE");
    let out = conn.review(&update_review(&pod, &delivery)).await;
    assert_eq!(out["response"]["allowed"], false, "{out}");
    server
        .wait_metric(r#"hami_webhook_admission_requests_total{outcome="denied"} 4"#)
        .await;
    server.stop().await;
}

/// A `gpu-fraction` pod and no per-GPU VRAM basis (the server has no node watch here): refused
/// by default, counted in no metric of skipped caps; admitted uncapped with the opt-out
/// `kai.missingBasis: warn`, with a warning the client prints, counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fraction_pod_without_a_basis_is_denied_by_default_and_counted_when_opted_out() {
    let certs = generate_localhost().unwrap();
    let server = start(&certs, |_| {}).await;
    let mut conn = connect(server.addr, client_config(&certs.ca_pem, &[b"h2"], false))
        .await
        .unwrap();
    let out = conn.review(KAI_POD).await;
    assert_eq!(out["response"]["allowed"], false, "{out}");
    let message = out["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message
            .contains("kai.missingBasis is deny, so the pod is refused rather than run uncapped"),
        "{message}"
    );
    server
        .wait_metric(r#"hami_webhook_admission_requests_total{outcome="denied"} 1"#)
        .await;
    let (_, metrics) = server.ops_get("/metrics").await;
    for line in [
        r#"hami_webhook_kai_fraction_caps_skipped_total{reason="no-source"} 0"#,
        r#"hami_webhook_kai_pods_total{limit="none"} 0"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}:\n{metrics}");
    }
    server.stop().await;

    let server = start(&certs, |s| {
        s.kai.missing_basis = hami_webhook::policy::kai::MissingBasis::Warn;
    })
    .await;
    let mut conn = connect(server.addr, client_config(&certs.ca_pem, &[b"h2"], false))
        .await
        .unwrap();
    let create: Value = serde_json::from_str(KAI_POD).unwrap();
    let answer = conn.review(KAI_POD).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let warnings = answer["response"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{answer}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("GPU memory cap skipped (kai.missingBasis is warn)"),
        "{answer}"
    );
    let pod = patched(&create, &answer);
    assert_eq!(
        pod["metadata"]["annotations"]["limits.hami.io/train"],
        "HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-source\n"
    );
    server
        .wait_metric(r#"hami_webhook_kai_fraction_caps_skipped_total{reason="no-source"} 1"#)
        .await;
    server
        .wait_metric(r#"hami_webhook_kai_pods_total{limit="none"} 1"#)
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_documented_answers_and_the_server_keeps_serving() {
    let certs = generate_localhost().unwrap();
    let server = start(&certs, |s| s.server.body_limit_bytes = 64 * 1024).await;
    let mut conn = connect(
        server.addr,
        client_config(&certs.ca_pem, &[b"http/1.1"], false),
    )
    .await
    .unwrap();
    let json = Some("application/json");
    let cases: Vec<(Option<&str>, Body, StatusCode, &str)> = vec![
        (json, full("not json"), StatusCode::BAD_REQUEST, "not JSON"),
        (
            json,
            full(&PLAIN_POD[..100]),
            StatusCode::BAD_REQUEST,
            "not JSON",
        ),
        (json, full(""), StatusCode::BAD_REQUEST, "empty"),
        (
            Some("text/plain"),
            full(PLAIN_POD),
            StatusCode::BAD_REQUEST,
            "application/json",
        ),
        (
            None,
            full(PLAIN_POD),
            StatusCode::BAD_REQUEST,
            "application/json",
        ),
    ];
    for (ct, body, status, needle) in cases {
        let (got, text) = conn.post(ct, body).await;
        let text = String::from_utf8_lossy(&text);
        assert_eq!(got, status, "{text}");
        assert!(text.contains(needle), "{text}");
    }
    // Too large, declared: refused from the header, before the body is read. The body stream stays
    // open so that the client never writes what the server will not read.
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
    tx.unbounded_send(Ok(Frame::data(Bytes::from_static(b"{"))))
        .unwrap();
    let (got, text) = conn
        .post_declared(json, Some(100 * 1024), BodyExt::boxed(StreamBody::new(rx)))
        .await;
    assert_eq!(got, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(String::from_utf8_lossy(&text).contains("exceeds the limit of 65536 bytes"));
    drop(tx);
    // Too large, chunked (no Content-Length): cut off once the limit is passed.
    let mut conn = connect(
        server.addr,
        client_config(&certs.ca_pem, &[b"http/1.1"], false),
    )
    .await
    .unwrap();
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
    for _ in 0..9 {
        tx.unbounded_send(Ok(Frame::data(Bytes::from(vec![b' '; 8192]))))
            .unwrap();
    }
    let (got, _) = conn.post(json, BodyExt::boxed(StreamBody::new(rx))).await;
    assert_eq!(got, StatusCode::PAYLOAD_TOO_LARGE);
    drop(tx);

    // JSON that is not a usable review: HTTP 200 with an invalid (or allowed) AdmissionReview.
    let mut conn = connect(
        server.addr,
        client_config(&certs.ca_pem, &[b"http/1.1"], false),
    )
    .await
    .unwrap();
    let wrong_kind = PLAIN_POD.replacen("\"kind\":\"AdmissionReview\"", "\"kind\":\"Pod\"", 1);
    let no_uid = PLAIN_POD.replacen("\"uid\":\"705ab4f5-6393-11e8-b7cc-42010a800002\",", "", 1);
    let mut no_object: Value = serde_json::from_str(PLAIN_POD).unwrap();
    no_object["request"]
        .as_object_mut()
        .unwrap()
        .remove("object");
    let mut delete: Value = serde_json::from_str(PLAIN_POD).unwrap();
    delete["request"]["operation"] = json!("DELETE");
    delete["request"]["oldObject"] = delete["request"]["object"].take();
    let reviews = [
        (wrong_kind, false, "is not AdmissionReview"),
        (no_uid, false, "request.uid is missing"),
        (no_object.to_string(), false, "request.object is missing"),
        (delete.to_string(), true, ""),
    ];
    for (review, allowed, needle) in reviews {
        let out = conn.review(&review).await;
        assert_eq!(out["response"]["allowed"], allowed, "{out}");
        if !allowed {
            assert_eq!(out["response"]["status"]["code"], 400);
            let message = out["response"]["status"]["message"].as_str().unwrap();
            assert!(message.contains(needle), "{message}");
        }
    }
    // Still serving, on the same connection and on a new one.
    assert_eq!(conn.review(PLAIN_POD).await["response"]["allowed"], true);
    let mut fresh = connect(server.addr, client_config(&certs.ca_pem, &[b"h2"], false))
        .await
        .unwrap();
    assert_eq!(fresh.review(HAMI_POD).await["response"]["allowed"], true);
    server
        .wait_metric(r#"hami_webhook_http_errors_total{code="413"} 2"#)
        .await;
    server
        .wait_metric(r#"hami_webhook_admission_requests_total{outcome="invalid"} 3"#)
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_keeps_connections_and_refuses_broken_files() {
    let first = generate_localhost().unwrap();
    let second = generate_localhost().unwrap();
    let server = start(&first, |_| {}).await;
    server
        .wait_metric(r#"hami_webhook_certificate_reloads_total{result="success"} 1"#)
        .await;
    let mut old = connect(
        server.addr,
        client_config(&first.ca_pem, &[b"http/1.1"], false),
    )
    .await
    .unwrap();
    assert_eq!(old.leaf, leaf_der(&first.cert_pem));
    assert_eq!(old.review(PLAIN_POD).await["response"]["allowed"], true);

    // Kubernetes-style swap of the ..data symlink to a new certificate.
    write_secret(server.dir.path(), 1, &second.cert_pem, &second.key_pem);
    server
        .wait_metric(r#"hami_webhook_certificate_reloads_total{result="success"} 2"#)
        .await;
    // The open connection continues.
    assert_eq!(old.review(HAMI_POD).await["response"]["allowed"], true);
    // A new handshake gets the new certificate (and fails against the old CA).
    let new = connect(server.addr, client_config(&second.ca_pem, &[b"h2"], false))
        .await
        .unwrap();
    assert_eq!(new.leaf, leaf_der(&second.cert_pem));
    assert!(
        connect(server.addr, client_config(&first.ca_pem, &[b"h2"], false))
            .await
            .is_err()
    );

    // A broken certificate, and a key that does not match: both keep the current one.
    write_secret(
        server.dir.path(),
        2,
        "-----BEGIN CERTIFICATE-----\nnope\n",
        &second.key_pem,
    );
    server
        .wait_metric(r#"hami_webhook_certificate_reloads_total{result="failure"} 1"#)
        .await;
    write_secret(server.dir.path(), 3, &second.cert_pem, &first.key_pem);
    server
        .wait_metric(r#"hami_webhook_certificate_reloads_total{result="failure"} 2"#)
        .await;
    let mut still = connect(
        server.addr,
        client_config(&second.ca_pem, &[b"http/1.1"], false),
    )
    .await
    .unwrap();
    assert_eq!(still.leaf, leaf_der(&second.cert_pem));
    assert_eq!(still.review(PLAIN_POD).await["response"]["allowed"], true);
    let (status, _) = server.ops_get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_is_accepted_and_tls_1_1_refused() {
    let certs = generate_localhost().unwrap();
    let server = start(&certs, |_| {}).await;
    let mut conn = connect(
        server.addr,
        client_config(&certs.ca_pem, &[b"http/1.1"], true),
    )
    .await
    .unwrap();
    assert_eq!(conn.review(PLAIN_POD).await["response"]["allowed"], true);

    // A TLS 1.1 ClientHello (legacy_version 0x0302, no supported_versions extension).
    let mut hello = vec![0x03, 0x02];
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // session id
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]); // cipher suites
    hello.extend_from_slice(&[0x01, 0x00]); // compression: null
    let mut handshake = vec![0x01, 0x00];
    handshake.extend_from_slice(&u16::try_from(hello.len()).unwrap().to_be_bytes());
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 0x03, 0x02];
    record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend_from_slice(&handshake);
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, tcp.read_to_end(&mut answer)).await;
    // A fatal alert record (0x15, level 2), never a ServerHello (0x16).
    assert_eq!(answer.first(), Some(&0x15), "{answer:?}");
    assert_eq!(answer.get(5), Some(&2), "{answer:?}");
    server
        .wait_metric("hami_webhook_tls_handshake_failures_total 1")
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_requests() {
    let certs = generate_localhost().unwrap();
    let mut server = start(&certs, |_| {}).await;
    let mut conn = connect(
        server.addr,
        client_config(&certs.ca_pem, &[b"http/1.1"], false),
    )
    .await
    .unwrap();
    // A request whose body arrives in two parts: the server is mid-request in between.
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
    let half = PLAIN_POD.len() / 2;
    tx.unbounded_send(Ok(Frame::data(Bytes::from(&PLAIN_POD.as_bytes()[..half]))))
        .unwrap();
    let body = BodyExt::boxed(StreamBody::new(rx));
    let request = tokio::spawn(async move { conn.post(Some("application/json"), body).await });
    server
        .wait_metric("hami_webhook_admission_in_flight 1")
        .await;

    let _ = server.stop.take().unwrap().send(());
    // New connections are refused once the listener is closed.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while TcpStream::connect(server.addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "listener still open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !server.task.is_finished(),
        "waits for the in-flight request"
    );
    tx.unbounded_send(Ok(Frame::data(Bytes::from(&PLAIN_POD.as_bytes()[half..]))))
        .unwrap();
    drop(tx);
    let (status, body) = tokio::time::timeout(DEADLINE, request)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(out["response"]["allowed"], true);
    tokio::time::timeout(DEADLINE, &mut server.task)
        .await
        .expect("server stops after the in-flight request")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_a_certificate_loads() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.server.cert_reload_interval_seconds = 1;
    let server = spawn_in(dir, settings).await;
    let body = server
        .wait_for(|s, _| s == StatusCode::SERVICE_UNAVAILABLE, "/readyz")
        .await;
    assert!(body.contains("certificate"), "{body}");
    assert_eq!(server.ops_get("/healthz").await.0, StatusCode::OK);
    let certs = generate_localhost().unwrap();
    write_secret(server.dir.path(), 0, &certs.cert_pem, &certs.key_pem);
    server.wait_for(|s, _| s == StatusCode::OK, "/readyz").await;
    let mut conn = connect(server.addr, client_config(&certs.ca_pem, &[b"h2"], false))
        .await
        .unwrap();
    assert_eq!(conn.review(PLAIN_POD).await["response"]["allowed"], true);
    server.stop().await;
}

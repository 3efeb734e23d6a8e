//! What the webhook's server tests share: the in-process server on port 0 with its certificate
//! files in a temporary folder, the plain-HTTP probes, TLS client configs. Each server test module
//! (`server_e2e`, `hostile_clients`) uses a part.

pub mod offline_online;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hami_webhook::policy::settings::Settings;
use hami_webhook::shell::server::{CertSource, run};
use hami_webhook::shell::vram::{KaiMetrics, VramSource};
use http::{Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, pem::PemObject};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Generous: every wait is for a condition; this only bounds a failing test.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client trusting `ca_pem`, offering `alpn`; TLS 1.2 only when `tls12_only`.
pub fn client_config(ca_pem: &str, alpn: &[&[u8]], tls12_only: bool) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12_only {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// GET `path` on the plain-HTTP port `ops`.
pub async fn ops_get(ops: SocketAddr, path: &str) -> (StatusCode, String) {
    let tcp = TcpStream::connect(ops).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "localhost")
        .body(full(""))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Polls `path` on `ops` until `check(status, body)` holds; the last body.
pub async fn wait_for(
    ops: SocketAddr,
    path: &str,
    check: impl Fn(StatusCode, &str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = ops_get(ops, path).await;
        if check(status, &body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition on {path} not reached; last: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running in-process server and what a test needs to talk to it.
pub struct Server {
    pub addr: SocketAddr,
    pub ops: SocketAddr,
    /// Holds `tls.crt` and `tls.key` (the test writes them before [`start_in`]).
    pub dir: tempfile::TempDir,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<()>,
}

/// Serves `settings` on loopback port 0 with the certificate files `dir/tls.crt`, `dir/tls.key`
/// (no VRAM basis); returns once `/readyz` answers 200.
pub async fn start_in(dir: tempfile::TempDir, settings: Settings) -> Server {
    let server = spawn_in(dir, settings).await;
    wait_for(server.ops, "/readyz", |s, _| s == StatusCode::OK).await;
    server
}

/// [`start_in`] without waiting for readiness (the files may not exist yet).
pub async fn spawn_in(dir: tempfile::TempDir, settings: Settings) -> Server {
    install_provider();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ops = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, ops_addr) = (listener.local_addr().unwrap(), ops.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let source = CertSource::Files {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    let task = tokio::spawn(async move {
        run(
            Arc::new(settings),
            VramSource::None,
            KaiMetrics::default(),
            listener,
            ops,
            source,
            async move {
                let _ = stopped.await;
            },
        )
        .await
        .unwrap();
    });
    Server {
        addr,
        ops: ops_addr,
        dir,
        stop: Some(stop),
        task,
    }
}

impl Server {
    /// GET `path` on the plain-HTTP port.
    pub async fn ops_get(&self, path: &str) -> (StatusCode, String) {
        ops_get(self.ops, path).await
    }

    /// Polls `path` until `check(status, body)` holds; the last body.
    pub async fn wait_for(&self, check: impl Fn(StatusCode, &str) -> bool, path: &str) -> String {
        wait_for(self.ops, path, check).await
    }

    /// Waits until `/metrics` has the line `line`, exactly.
    pub async fn wait_metric(&self, line: &str) {
        let line = line.to_owned();
        self.wait_for(
            move |s, body| s == StatusCode::OK && body.lines().any(|l| l == line),
            "/metrics",
        )
        .await;
    }

    /// Stops the server (as on SIGTERM) and waits for it to end.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("server stops")
            .unwrap();
    }
}

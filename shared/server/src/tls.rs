//! TLS for the gRPC listener, optionally mutual, with certificates that rotate without a restart.
//!
//! The server terminates TLS itself (rustls, ring) instead of through tonic's `tls_config`, which
//! builds one configuration at start and keeps it for the life of the process. Here the PEM files
//! are read again every `reload_interval_secs`; when their contents changed and they load (the key
//! matches the certificate, the CA bundle parses), new connections get the new configuration.
//! Files that changed but do not load — a certificate written before its key, a truncated file —
//! leave the previous configuration in place and are tried again at the next look; the log says
//! so. Connections already open keep the certificate they were made with.
//!
//! With `client_ca_file`, every client must present a certificate signed by one of its CAs
//! (mutual TLS); without it, any client that trusts the server's certificate may connect (and
//! bearer tokens, `ENGRAM_AUTH__TOKENS_FILE`, decide what it may do).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::{Stream, StreamExt as _};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// `grpc.tls.*`: set `cert_file` and `key_file` to serve TLS only.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct TlsSettings {
    /// The server's certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CAs (PEM) whose client certificates are accepted; set, a client without one is refused.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are read again for a rotation.
    #[serde(default = "default_reload_interval_secs")]
    #[garde(range(min = 1, max = 86_400))]
    pub reload_interval_secs: u64,
    /// A client that has not finished its handshake after this long is dropped.
    #[serde(default = "default_handshake_timeout_secs")]
    #[garde(range(min = 1, max = 600))]
    pub handshake_timeout_secs: u64,
}

fn default_reload_interval_secs() -> u64 {
    30
}

fn default_handshake_timeout_secs() -> u64 {
    10
}

/// The current server configuration; each new connection takes the latest.
#[derive(Clone)]
pub struct TlsConfigWatch {
    current: watch::Receiver<Arc<ServerConfig>>,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for TlsConfigWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfigWatch")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

impl TlsConfigWatch {
    /// Loads the files (an error names the file that does not load) and starts the task that
    /// reloads them when they change; it ends when the watch is dropped.
    pub fn start(settings: &TlsSettings) -> anyhow::Result<Self> {
        // Each look reads the files once and parses those very bytes, so what was loaded is
        // exactly what the next look compares with.
        let mut loaded = TlsFiles::read(settings)?;
        let (publish, current) = watch::channel(load(settings, &loaded)?);
        let handshake_timeout = Duration::from_secs(settings.handshake_timeout_secs);
        let settings = settings.clone();
        tokio::spawn(async move {
            let mut ticks =
                tokio::time::interval(Duration::from_secs(settings.reload_interval_secs));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            while !publish.is_closed() {
                ticks.tick().await;
                // Unreadable (mid-rotation, say) or unchanged: look again later.
                let Ok(now) = TlsFiles::read(&settings) else {
                    continue;
                };
                if now == loaded {
                    continue;
                }
                match load(&settings, &now) {
                    Ok(config) => {
                        publish.send_replace(config);
                        loaded = now;
                        tracing::info!(
                            cert = %settings.cert_file.display(),
                            "tls: certificate files changed; new connections use them"
                        );
                    }
                    Err(error) => tracing::warn!(
                        error = format!("{error:#}"),
                        "tls: certificate files changed but do not load; keeping the previous ones"
                    ),
                }
            }
        });
        Ok(Self {
            current,
            handshake_timeout,
        })
    }

    /// TLS connections from `tcp`: handshakes run side by side, and one that fails (a plaintext
    /// client, an unknown CA, no client certificate under mutual TLS) or takes too long is
    /// dropped without holding up the others.
    pub fn accept<S, E>(
        self,
        tcp: S,
    ) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> + Send
    where
        S: Stream<Item = Result<TcpStream, E>> + Send,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        /// Handshakes in progress at once.
        const HANDSHAKES: usize = 256;
        let handshake_timeout = self.handshake_timeout;
        tcp.map(move |connection| {
            let acceptor = TlsAcceptor::from(self.current.borrow().clone());
            async move {
                let tcp = match connection {
                    Ok(tcp) => tcp,
                    Err(error) => {
                        tracing::debug!(error = %error.into(), "tls: cannot accept a connection");
                        return None;
                    }
                };
                let peer = tcp.peer_addr().ok();
                match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => Some(Ok(tls)),
                    Ok(Err(error)) => {
                        tracing::debug!(?peer, %error, "tls: handshake failed");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(?peer, "tls: handshake timed out");
                        None
                    }
                }
            }
        })
        .buffer_unordered(HANDSHAKES)
        .filter_map(futures::future::ready)
    }
}

/// The files' bytes.
#[derive(PartialEq, Eq)]
struct TlsFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    fn read(settings: &TlsSettings) -> anyhow::Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(Self {
            cert: read(&settings.cert_file)?,
            key: read(&settings.key_file)?,
            client_ca: settings.client_ca_file.as_deref().map(read).transpose()?,
        })
    }
}

fn certificates(pem: &[u8], path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("cannot read certificates from {}", path.display()))?;
    anyhow::ensure!(
        !certificates.is_empty(),
        "{} holds no PEM certificate",
        path.display()
    );
    Ok(certificates)
}

/// The server configuration `files` describe (`settings` names them in errors).
fn load(settings: &TlsSettings, files: &TlsFiles) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&files.cert, &settings.cert_file)?;
    let key = PrivateKeyDer::from_pem_slice(&files.key).with_context(|| {
        format!(
            "cannot read a private key from {}",
            settings.key_file.display()
        )
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .context("tls: no protocol version")?;
    let builder = match (&settings.client_ca_file, &files.client_ca) {
        (Some(path), Some(bundle)) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(bundle, path)? {
                roots
                    .add(certificate)
                    .with_context(|| format!("{} holds an unusable CA", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("cannot verify clients with {}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).with_context(|| {
        format!(
            "{} and {} do not make a certificate and its key",
            settings.cert_file.display(),
            settings.key_file.display()
        )
    })?;
    // gRPC is HTTP/2; tonic's clients refuse a connection that did not agree on it.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

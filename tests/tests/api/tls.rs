//! TLS on the gRPC listener (`grpc.tls`): a client that trusts the server's CA and presents a
//! certificate of an accepted CA is served; a plaintext client, a client without a certificate
//! and one whose certificate another CA signed are refused; new certificate files are picked up
//! without a restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use engram_e2e::Sandbox;
use engram_proto::engram::v1::retrieval_service_client::RetrievalServiceClient;
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::helpers::new_scope;
use crate::retrieval::query;

/// A certificate authority of the test's own.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn authority(name: &str) -> Authority {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let pem = params.self_signed(&key).expect("a CA certificate").pem();
    Authority {
        issuer: Issuer::new(params, key),
        pem,
    }
}

/// A certificate `authority` signed, and its key (PEM).
fn certificate(
    authority: &Authority,
    names: &[&str],
    purpose: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = KeyPair::generate().expect("a key");
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .expect("parameters");
    params.extended_key_usages = vec![purpose];
    let certificate = params
        .signed_by(&key, &authority.issuer)
        .expect("a signed certificate");
    (certificate.pem(), key.serialize_pem())
}

/// Replaces a file in one step (a reader never sees half of it).
fn write(path: &Path, contents: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, contents).expect("writable");
    std::fs::rename(&partial, path).expect("renamable");
}

/// The server's files, signed by `authority`, which is also the CA its clients need.
fn install(dir: &Path, authority: &Authority) -> engram_server::TlsSettings {
    let (cert, key) = certificate(
        authority,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let paths: [PathBuf; 3] = [
        dir.join("server.pem"),
        dir.join("server.key"),
        dir.join("clients-ca.pem"),
    ];
    write(&paths[0], &cert);
    write(&paths[1], &key);
    write(&paths[2], &authority.pem);
    engram_server::TlsSettings {
        cert_file: paths[0].clone(),
        key_file: paths[1].clone(),
        client_ca_file: Some(paths[2].clone()),
        reload_interval_secs: 1,
        handshake_timeout_secs: 5,
    }
}

/// Whether a RetrieveMemory over TLS (trusting `trusted_ca`, presenting `identity`) is served.
async fn served(port: u16, trusted_ca: &str, identity: Option<&(String, String)>) -> bool {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trusted_ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let Ok(channel) = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("an endpoint")
        .tls_config(tls)
        .expect("a TLS configuration")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
    else {
        return false;
    };
    let mut client = RetrievalServiceClient::new(channel);
    client
        .retrieve_memory(query(&new_scope("work"), "what do I like"))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_trusted_clients_refuses_others_and_rotates_without_a_restart() {
    let sandbox = Sandbox::start().await;
    let dir = tempfile::tempdir().expect("a directory");
    let first = authority("Engram test CA 1");
    let settings = install(dir.path(), &first);
    let service = sandbox
        .start_retrieval_with_tls(settings)
        .await
        .expect("retrieval starts with TLS");
    let port = service.addr.port();
    let client = certificate(&first, &["client"], ExtendedKeyUsagePurpose::ClientAuth);

    assert!(
        served(port, &first.pem, Some(&client)).await,
        "a trusted client is served"
    );

    let plaintext = async {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("an endpoint")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .ok()?;
        RetrievalServiceClient::new(channel)
            .retrieve_memory(query(&new_scope("work"), "what do I like"))
            .await
            .ok()
    };
    assert!(plaintext.await.is_none(), "plaintext is refused");
    assert!(
        !served(port, &first.pem, None).await,
        "a client without a certificate is refused"
    );
    let stranger = authority("Someone else's CA");
    let stranger_client = certificate(&stranger, &["client"], ExtendedKeyUsagePurpose::ClientAuth);
    assert!(
        !served(port, &first.pem, Some(&stranger_client)).await,
        "a certificate of another CA is refused"
    );

    // Rotation: new files from a second CA; the running service takes them up.
    let second = authority("Engram test CA 2");
    install(dir.path(), &second);
    let rotated = certificate(&second, &["client"], ExtendedKeyUsagePurpose::ClientAuth);
    let mut picked_up = false;
    for _ in 0..100 {
        if served(port, &second.pem, Some(&rotated)).await {
            picked_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        picked_up,
        "the new certificate and CA are served without a restart"
    );
    assert!(
        !served(port, &second.pem, Some(&client)).await,
        "a client certificate of the old CA is no longer accepted"
    );
    assert!(
        !served(port, &first.pem, Some(&rotated)).await,
        "the server no longer presents the old certificate"
    );

    // Files that do not load (a key that is not the certificate's) keep the current ones.
    let (_, other_key) = certificate(&second, &["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    write(&dir.path().join("server.key"), &other_key);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        served(port, &second.pem, Some(&rotated)).await,
        "a broken rotation keeps the last good certificate"
    );
    service.stop().await.expect("stops cleanly");
}

/// Connects as the services do (`engram_server::database::connect`, migrations included).
async fn connect(url: &str) -> anyhow::Result<sqlx::PgPool> {
    engram_server::database::connect(&engram_server::DatabaseSettings {
        url: secrecy::SecretString::from(url.to_owned()),
        min_connections: 1,
        max_connections: 2,
        connect_timeout_secs: 5,
        run_migrations: true,
        schema_wait_secs: 0,
        synchronous_commit: engram_server::SynchronousCommit::On,
    })
    .await
}

/// Stands in for a server's TLS listener: accepts TLS with `cert`/`key` on a port of its own and
/// forwards the decrypted bytes to `upstream` (the local Postgres or RabbitMQ, which speak
/// plaintext here). With `postgres`, it first answers Postgres' in-protocol SSLRequest with
/// "S", as a Postgres with SSL on does.
async fn tls_terminator(
    upstream: std::net::SocketAddr,
    cert: &str,
    key: &str,
    postgres: bool,
) -> u16 {
    use rustls::pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let certs = vec![rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if postgres {
                    // SSLRequest: length 8, code 80877103.
                    let mut request = [0u8; 8];
                    if client.read_exact(&mut request).await.is_err()
                        || request != [0, 0, 0, 8, 4, 210, 22, 47]
                    {
                        return;
                    }
                    if client.write_all(b"S").await.is_err() {
                        return;
                    }
                }
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
            });
        }
    });
    port
}

fn address_of(url: &str) -> std::net::SocketAddr {
    let url = url::Url::parse(url).expect("a URL");
    format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port().expect("a port")
    )
    .parse()
    .expect("an IP address and port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_is_reached_over_tls_verified_with_the_configured_ca() {
    let database = engram_testkit::TestDatabase::create()
        .await
        .expect("a test database");
    let ca = authority("Engram test database CA");
    let (cert, key) = certificate(&ca, &["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    let port = tls_terminator(address_of(database.url()), &cert, &key, true).await;
    let dir = tempfile::tempdir().expect("a directory");
    let ca_file = dir.path().join("ca.pem");
    write(&ca_file, &ca.pem);
    let other = authority("Someone else's database CA");
    let other_file = dir.path().join("other.pem");
    write(&other_file, &other.pem);
    let url = |mode: &str, ca_file: &Path| {
        let mut url = url::Url::parse(database.url()).expect("a URL");
        url.set_host(Some("localhost")).unwrap();
        url.set_port(Some(port)).unwrap();
        url.query_pairs_mut()
            .append_pair("sslmode", mode)
            .append_pair("sslrootcert", &ca_file.display().to_string());
        url.to_string()
    };

    let pool = connect(&url("verify-full", &ca_file))
        .await
        .expect("the services connect and migrate over verified TLS");
    let memories: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&pool)
        .await
        .expect("the schema is there");
    assert_eq!(memories, 0);
    pool.close().await;

    let refused = connect(&url("verify-full", &other_file)).await;
    assert!(
        refused.is_err(),
        "a server certificate of another CA is refused"
    );

    // The local Postgres itself has no TLS: asked for it, the client does not fall back.
    let mut direct = url::Url::parse(database.url()).expect("a URL");
    direct.query_pairs_mut().append_pair("sslmode", "require");
    let error = format!(
        "{:#}",
        connect(direct.as_str()).await.expect_err("no TLS there")
    );
    assert!(error.contains("server does not support TLS"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_is_reached_over_amqps_verified_with_the_configured_ca() {
    let amqp = std::env::var("ENGRAM_AMQP__URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let ca = authority("Engram test broker CA");
    let (cert, key) = certificate(&ca, &["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    let port = tls_terminator(address_of(&amqp), &cert, &key, false).await;
    let dir = tempfile::tempdir().expect("a directory");
    let ca_file = dir.path().join("ca.pem");
    write(&ca_file, &ca.pem);
    let mut url = url::Url::parse(&amqp).expect("a URL");
    url.set_scheme("amqps").unwrap();
    url.set_host(Some("localhost")).unwrap();
    url.set_port(Some(port)).unwrap();
    let topology = engram_bus::Topology::new(format!("tls-test-{}", uuid::Uuid::new_v4()));

    let tls = engram_bus::BusTls {
        ca_file: Some(ca_file.clone()),
    };
    let bus = engram_bus::Bus::connect_with_tls(url.as_str(), topology.clone(), &tls)
        .await
        .expect("amqps with the configured CA");
    bus.declare(&[]).await.expect("the broker answers over TLS");

    let web_roots = engram_bus::Bus::connect(url.as_str(), topology.clone()).await;
    assert!(
        web_roots.is_err(),
        "without the CA, the private certificate is refused"
    );
    let missing = engram_bus::BusTls {
        ca_file: Some(dir.path().join("nowhere.pem")),
    };
    let error = engram_bus::Bus::connect_with_tls(url.as_str(), topology.clone(), &missing)
        .await
        .err()
        .expect("no CA file, no connection")
        .to_string();
    assert!(error.contains("nowhere.pem"), "{error}");
    let not_a_bundle = dir.path().join("empty.pem");
    write(&not_a_bundle, "no certificate here\n");
    let empty = engram_bus::BusTls {
        ca_file: Some(not_a_bundle),
    };
    let error = engram_bus::Bus::connect_with_tls(url.as_str(), topology.clone(), &empty)
        .await
        .err()
        .expect("a CA file without a certificate is refused")
        .to_string();
    assert!(error.contains("no PEM certificate"), "{error}");
}

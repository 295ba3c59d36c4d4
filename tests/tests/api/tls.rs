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

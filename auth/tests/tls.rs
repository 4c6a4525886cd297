//! Mutual TLS end to end: a real tonic server (the standard gRPC health service) on 127.0.0.1, fed by
//! `drover_auth::tls::incoming`, and clients dialling it through `ClientTls::channel`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_auth::tls::{
    ClientTls, Pem, Role, RoleKind, ServerTls, TlsFiles, generate_ca, incoming, issue, peer_role, write_pem,
};
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A cluster CA and the directory its files live in.
struct Pki {
    dir: tempfile::TempDir,
    ca: Pem,
}

impl Pki {
    fn new() -> Pki {
        Pki { dir: tempfile::tempdir().unwrap(), ca: generate_ca("drover test CA").unwrap() }
    }

    /// Issues a certificate for `role` (valid for localhost and 127.0.0.1) and installs it with the CA as `name`.
    fn install(&self, name: &str, role: &Role) -> TlsFiles {
        let leaf = issue(&self.ca, role, &["localhost".into()], &[LOCALHOST], 1).unwrap();
        install_files(self.dir.path(), name, &self.ca, &leaf)
    }
}

fn install_files(dir: &Path, name: &str, ca: &Pem, leaf: &Pem) -> TlsFiles {
    let files = TlsFiles {
        ca: dir.join(format!("{name}-ca.pem")),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&files.ca, &ca.cert_pem).unwrap();
    write_pem(leaf, &files.cert, &files.key, 0o600).unwrap();
    files
}

/// A running health server that records the role of every caller it serves.
struct TestServer {
    addr: String,
    tls: ServerTls,
    callers: Arc<Mutex<Vec<Role>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_server(files: TlsFiles) -> TestServer {
    let tls = ServerTls::load(files).unwrap();
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let callers = Arc::new(Mutex::new(Vec::new()));
    let seen = callers.clone();
    let (_reporter, health) = tonic_health::server::health_reporter();
    // The interceptor is where a real service would authorize: here it only records who called.
    let health = tonic::service::interceptor::InterceptedService::new(health, move |req: tonic::Request<()>| {
        let role = peer_role(&req)?;
        seen.lock().unwrap().push(role);
        Ok(req)
    });
    let incoming = incoming(listener, tls.clone());
    let task = tokio::spawn(async move {
        Server::builder().add_service(health).serve_with_incoming(incoming).await.unwrap();
    });
    TestServer { addr, tls, callers, task }
}

async fn health_check(channel: Channel) -> Result<(), String> {
    let mut client = HealthClient::new(channel);
    let call = client.check(HealthCheckRequest { service: String::new() });
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(format!("{status:?}")),
        Err(_) => panic!("the call hung instead of failing"),
    }
}

async fn call_as(files: TlsFiles, server: &TestServer, expect: Option<RoleKind>) -> Result<(), String> {
    let client = ClientTls::load(files).unwrap();
    health_check(client.channel(&server.addr, None, CONNECT_TIMEOUT, expect).unwrap()).await
}

#[tokio::test]
async fn a_client_with_a_cluster_certificate_is_served_and_the_server_sees_its_role() {
    let pki = Pki::new();
    let server = start_server(pki.install("ctl", &Role::Controller(1))).await;

    let login = pki.install("login", &Role::Client("login1".into()));
    call_as(login, &server, Some(RoleKind::Controller)).await.expect("served");
    let agent = pki.install("agent", &Role::Agent("gpu-7".into()));
    call_as(agent, &server, Some(RoleKind::Controller)).await.expect("served");

    assert_eq!(*server.callers.lock().unwrap(), [Role::Client("login1".into()), Role::Agent("gpu-7".into())]);
    assert_eq!(server.tls.role(), Some(Role::Controller(1)));
}

#[tokio::test]
async fn a_client_from_the_local_address_it_binds_is_served() {
    let pki = Pki::new();
    let server = start_server(pki.install("ctl", &Role::Controller(1))).await;
    let client = ClientTls::load(pki.install("login", &Role::Client("login1".into()))).unwrap();
    let channel = client.channel(&server.addr, Some(LOCALHOST), CONNECT_TIMEOUT, None).unwrap();
    health_check(channel).await.expect("served");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let pki = Pki::new();
    let server = start_server(pki.install("ctl", &Role::Controller(1))).await;
    // tonic's own TLS client trusts our CA but presents no certificate.
    let anonymous =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&pki.ca.cert_pem)).domain_name("localhost");
    let connect = |config: ClientTlsConfig| async {
        let endpoint = Endpoint::from_shared(format!("https://{}", server.addr)).unwrap().tls_config(config).unwrap();
        match endpoint.connect().await {
            Ok(channel) => health_check(channel).await,
            Err(err) => Err(format!("connect: {err:?}")),
        }
    };
    assert!(connect(anonymous.clone()).await.is_err(), "no certificate, no service");

    // The same client with a certificate gets through, so the refusal was about the certificate.
    let leaf = issue(&pki.ca, &Role::Client("h".into()), &[], &[], 1).unwrap();
    connect(anonymous.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem))).await.expect("served");
    assert_eq!(*server.callers.lock().unwrap(), [Role::Client("h".into())]);
}

#[tokio::test]
async fn a_client_whose_certificate_comes_from_another_ca_is_refused() {
    let pki = Pki::new();
    let server = start_server(pki.install("ctl", &Role::Controller(1))).await;
    // The impostor trusts the cluster's CA (so it accepts the server) but its own certificate is self-made.
    let rogue_ca = generate_ca("rogue CA").unwrap();
    let rogue_leaf = issue(&rogue_ca, &Role::Client("login1".into()), &[], &[], 1).unwrap();
    let impostor = install_files(pki.dir.path(), "impostor", &pki.ca, &rogue_leaf);

    assert!(call_as(impostor, &server, None).await.is_err());
    assert!(server.callers.lock().unwrap().is_empty(), "the impostor was never served");
}

#[tokio::test]
async fn a_node_expecting_a_controller_refuses_a_server_holding_an_agent_certificate() {
    let pki = Pki::new();
    let server = start_server(pki.install("agent", &Role::Agent("gpu-7".into()))).await;
    let node = pki.install("node", &Role::Agent("gpu-8".into()));

    let err = call_as(node.clone(), &server, Some(RoleKind::Controller)).await.unwrap_err();
    assert!(err.contains("WrongRole"), "the cause is the role: {err}");
    call_as(node.clone(), &server, Some(RoleKind::Agent)).await.expect("an agent is what it is");
    call_as(node, &server, None).await.expect("no expectation, no role check");
}

#[tokio::test]
async fn a_server_whose_name_does_not_match_the_dialled_host_is_refused() {
    let pki = Pki::new();
    // Valid for other-host only: dialling 127.0.0.1 must fail hostname verification.
    let leaf = issue(&pki.ca, &Role::Controller(1), &["other-host".into()], &[], 1).unwrap();
    let server = start_server(install_files(pki.dir.path(), "ctl", &pki.ca, &leaf)).await;
    let err = call_as(pki.install("login", &Role::Client("h".into())), &server, None).await.unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
}

#[tokio::test]
async fn a_rotated_ca_takes_effect_on_reload_without_restarting_the_server() {
    let old = Pki::new();
    let server_files = old.install("ctl", &Role::Controller(1));
    let server = start_server(server_files.clone()).await;
    let old_client = old.install("old-client", &Role::Client("login1".into()));
    call_as(old_client.clone(), &server, None).await.expect("served before the rotation");

    // The operator replaces the server's files with material from a new CA; the server reloads in place.
    let new = Pki::new();
    let new_leaf = issue(&new.ca, &Role::Controller(1), &["localhost".into()], &[LOCALHOST], 1).unwrap();
    std::fs::write(&server_files.ca, &new.ca.cert_pem).unwrap();
    write_pem(&new_leaf, &server_files.cert, &server_files.key, 0o600).unwrap();
    assert!(server.tls.reload_if_changed().expect("the new files are valid"), "new material in use");
    assert!(!server.tls.reload_if_changed().unwrap(), "nothing changed since");

    let new_client = new.install("new-client", &Role::Client("login2".into()));
    call_as(new_client, &server, None).await.expect("a client of the new CA is served");
    assert!(call_as(old_client, &server, None).await.is_err(), "a client of the old CA is refused");

    // Even an old-CA client that already trusts the new CA is refused: the server's verifier changed, too.
    let bundle = format!("{}{}", old.ca.cert_pem, new.ca.cert_pem);
    let old_leaf = issue(&old.ca, &Role::Client("login1".into()), &[], &[], 1).unwrap();
    let straddler = install_files(old.dir.path(), "straddler", &old.ca, &old_leaf);
    std::fs::write(&straddler.ca, bundle).unwrap();
    assert!(call_as(straddler, &server, None).await.is_err());

    assert_eq!(*server.callers.lock().unwrap(), [Role::Client("login1".into()), Role::Client("login2".into())]);
}

#[tokio::test]
async fn the_reloader_notices_new_files_by_itself() {
    let pki = Pki::new();
    let files = pki.install("ctl", &Role::Controller(1));
    let server = start_server(files.clone()).await;
    let _reloader = server.tls.spawn_reloader(Duration::from_millis(100));

    let leaf = issue(&pki.ca, &Role::Controller(2), &["localhost".into()], &[LOCALHOST], 1).unwrap();
    write_pem(&leaf, &files.cert, &files.key, 0o600).unwrap();
    for _ in 0..100 {
        if server.tls.role() == Some(Role::Controller(2)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the reloader did not pick up the new certificate within 5 s");
}

#[tokio::test]
async fn broken_replacement_files_leave_the_server_serving_with_its_old_material() {
    let pki = Pki::new();
    let files = pki.install("ctl", &Role::Controller(1));
    let server = start_server(files.clone()).await;
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    let err = server.tls.reload_if_changed().unwrap_err();
    assert!(err.to_string().contains("ctl.pem"), "names the file: {err}");
    call_as(pki.install("login", &Role::Client("h".into())), &server, None).await.expect("still served");
}

#[tokio::test]
async fn a_silent_connection_does_not_hold_up_other_clients() {
    let pki = Pki::new();
    let server = start_server(pki.install("ctl", &Role::Controller(1))).await;
    // Connects and never starts a handshake.
    let _silent = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    let started = std::time::Instant::now();
    call_as(pki.install("login", &Role::Client("h".into())), &server, None).await.expect("served");
    assert!(started.elapsed() < Duration::from_secs(2), "served in {:?}", started.elapsed());
}

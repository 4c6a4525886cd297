//! Security stories on a real local cluster: identity comes from the kernel (through drover-authd), never from the
//! client; users touch only their own jobs; roles gate operators' and administrators' powers; every port needs a
//! certificate from the cluster's CA, and each service only the right kind of peer.
//!
//! Two users, Alice (uid 60001) and Bob (uid 60002), exist only as uids: the test runs the CLI as them (it must
//! run as root to switch users; CI does), and the kernel reports those uids to drover-authd. Nothing in the
//! requests says who is asking.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Output;
use std::time::{Duration, Instant};

use drover_auth::credential::{CREDENTIAL_METADATA_KEY, Identity, now_ms, sign};
use drover_auth::{ClusterKey, RoleKind};
use drover_cli::local::{LocalCluster, UpOptions};
use drover_client::relay::{self, RelayAttempt};
use drover_proto::v1::agent_gateway_client::AgentGatewayClient;
use drover_proto::v1::agent_service_client::AgentServiceClient;
use drover_proto::v1::drover_service_client::DroverServiceClient;
use drover_proto::v1::raft_service_client::RaftServiceClient;
use drover_proto::v1::{
    ClusterStatusRequest, GetJobRequest, ListJobsRequest, RaftRequest, StepRequest, SubmitJobRequest,
};
use tonic::transport::Channel;

mod common;

use common::{Shell, setup};

const ALICE: u32 = 60_001;
const BOB: u32 = 60_002;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Shell {
    /// A Slurm command run as `uid` (the kernel's word: the process really runs as that uid).
    fn run_as(&self, uid: u32, name: &str, args: &[&str]) -> Output {
        self.command(name, args).env("ALICE_SECRET", "hunter2").uid(uid).gid(uid).output().expect("command runs")
    }

    fn ok_as(&self, uid: u32, name: &str, args: &[&str]) -> String {
        let out = self.run_as(uid, name, args);
        assert!(out.status.success(), "uid {uid}: {name} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn denied_as(&self, uid: u32, name: &str, args: &[&str]) -> String {
        let out = self.run_as(uid, name, args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            !out.status.success() || text.contains("denied"),
            "uid {uid}: {name} {args:?} should be refused: {text}"
        );
        text
    }
}

/// The cluster's key, as the test (root) can read it: to sign credentials the way authd would, or to forge them.
fn cluster_key(cluster: &LocalCluster) -> ClusterKey {
    ClusterKey::load(&cluster.dir.join("pki/cluster.key")).unwrap()
}

fn token(key: &ClusterKey, uid: u32) -> String {
    sign(key, &Identity { uid, gid: uid, user: format!("u{uid}") }, "testhost", now_ms(), 60_000)
}

/// A TLS channel with the cluster's client certificate (what any process on a cluster host can use).
fn client_channel(cluster: &LocalCluster, addr: &str, expect: RoleKind) -> Channel {
    let config = cluster.client_config().unwrap();
    drover_auth::ClientTls::load(config.tls_files())
        .unwrap()
        .channel(addr, None, Duration::from_secs(2), Some(expect))
        .unwrap()
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(CREDENTIAL_METADATA_KEY, token.parse().unwrap());
    request
}

fn spec_json(uid: u32, user: &str, environment: Vec<(String, String)>) -> Vec<u8> {
    let spec = drover_state::JobSpec {
        name: "mine".into(),
        user: user.into(),
        uid,
        gid: uid,
        script: "#!/bin/sh\nsleep 300\n".into(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        work_dir: "/tmp".into(),
        environment: environment.into(),
        ..drover_state::JobSpec::default()
    };
    serde_json::to_vec(&spec).unwrap()
}

/// A one-node cluster whose shell's working directory every uid may use, for stories run as Alice and Bob; `None`
/// (the story says SKIPPED) without root, which switching uids needs.
fn two_user_cluster() -> Option<(tempfile::TempDir, drover_cli::local::LocalCluster, Shell)> {
    if !is_root() {
        eprintln!("SKIPPED: this story runs commands as other uids, which needs root (CI runs as root)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (cluster, sh) = setup(dir.path(), UpOptions { agents: 1, gpus_per_agent: 2, ..UpOptions::default() });
    std::fs::set_permissions(&sh.cwd, std::fs::Permissions::from_mode(0o777)).unwrap();
    Some((dir, cluster, sh))
}

#[test]
fn two_users_touch_only_their_own_jobs_and_roles_gate_the_rest() {
    let Some((_dir, cluster, sh)) = two_user_cluster() else { return };

    // The kernel says who each of them is.
    assert!(sh.ok_as(ALICE, "drover", &["whoami"]).contains("uid=60001"));
    assert!(sh.ok_as(BOB, "drover", &["whoami"]).contains("uid=60002 gid=60002 user=60002 adminlevel=None"));

    // Alice's job runs as Alice on the node.
    let id = sh.ok_as(ALICE, "sbatch", &["--parsable", "--wrap", "id -u > whoami.txt; sleep 300"]).trim().to_string();
    let start = Instant::now();
    while std::fs::read_to_string(sh.cwd.join("whoami.txt")).map(|s| s.trim().is_empty()).unwrap_or(true) {
        assert!(start.elapsed() < Duration::from_secs(20), "Alice's job never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::read_to_string(sh.cwd.join("whoami.txt")).unwrap().trim(), "60001");

    // Bob can see that the job exists, but cannot cancel, signal, hold or read it.
    assert!(sh.ok_as(BOB, "squeue", &["-h", "-o", "%i %u"]).contains(&format!("{id} 60001")));
    for (name, args) in [
        ("scancel", vec![id.as_str()]),
        ("scancel", vec!["--signal=USR1", id.as_str()]),
        ("scontrol", vec!["hold", id.as_str()]),
        ("scontrol", vec!["write", "batch_script", id.as_str(), "-"]),
    ] {
        let text = sh.denied_as(BOB, name, &args);
        assert!(text.contains("Access/permission denied"), "{name} {args:?}: {text}");
    }
    assert!(sh.ok_as(ALICE, "scontrol", &["write", "batch_script", &id, "-"]).contains("id -u > whoami.txt"));

    // Bob is no operator or administrator: no drains, no partition changes, no membership changes.
    let text = sh.denied_as(BOB, "scontrol", &["update", "nodename=node01", "state=drain", "reason=mine"]);
    assert!(text.contains("needs AdminLevel=Operator"), "{text}");
    let text = sh.denied_as(BOB, "scontrol", &["update", "partitionname=gpu", "maxtime=1:00:00"]);
    assert!(text.contains("needs AdminLevel=Administrator"), "{text}");
    let text = sh.denied_as(BOB, "drover", &["cluster", "add-replica", "9", "127.0.0.1:9"]);
    assert!(text.contains("needs AdminLevel=Administrator"), "{text}");
    let text = sh.denied_as(BOB, "drover", &["admin", "grant", "60002", "admin"]);
    assert!(text.contains("needs AdminLevel=Administrator"), "{text}");
    let text = sh.denied_as(BOB, "drover", &["audit"]);
    assert!(text.contains("needs AdminLevel=Operator"), "{text}");

    // Root makes Bob an operator: now he drains the node and cancels Alice's job, and the audit log says so.
    sh.ok("drover", &["admin", "grant", "60002", "operator"]);
    assert!(sh.ok_as(BOB, "drover", &["whoami"]).contains("adminlevel=Operator"));
    sh.ok_as(BOB, "scontrol", &["update", "nodename=node01", "state=drain", "reason=fan"]);
    sh.ok_as(BOB, "scancel", &[id.as_str()]);
    let audit = sh.ok_as(BOB, "drover", &["audit"]);
    let lines: Vec<&str> = audit.lines().skip(1).collect();
    assert!(lines.iter().any(|l| l.contains("set_role") && l.split_whitespace().nth(2) == Some("0")), "{audit}");
    assert!(lines.iter().any(|l| l.contains("drain_nodes") && l.contains("60002") && l.contains("fan")), "{audit}");
    // Still not an administrator.
    let text = sh.denied_as(BOB, "scontrol", &["update", "partitionname=gpu", "maxtime=1:00:00"]);
    assert!(text.contains("needs AdminLevel=Administrator"), "{text}");
    drop(cluster);
}

/// A QOS that preempts other users' jobs is an administrator's grant, not a user's choice (issue 28, finding 5):
/// as Slurm's association QOS lists, a user may use only the QOS their account allows (`normal` until an
/// administrator grants more), at submit and through `scontrol update job QOS=`.
#[test]
fn a_user_may_use_only_the_qos_their_account_was_granted() {
    let Some((_dir, cluster, sh)) = two_user_cluster() else { return };
    sh.ok("drover", &["qos", "add", "urgent", "--priority", "1000", "--preempt", "normal"]);
    sh.ok("drover", &["account", "add", "physics", "--users", "60001"]);

    let refused = |uid: u32| {
        let out = sh.run_as(uid, "sbatch", &["-q", "urgent", "--hold", "--wrap", "true"]);
        assert!(!out.status.success(), "uid {uid} used QOS urgent");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = refused(ALICE);
    assert!(err.contains("Invalid qos specification: urgent: account physics allows only QOS normal"), "{err}");

    // Granted to physics: Alice may use it; Bob, charging root, still may not, nor switch his job to it.
    sh.ok("drover", &["account", "modify", "physics", "--qos", "normal,urgent"]);
    let alices = sh.ok_as(ALICE, "sbatch", &["--parsable", "-q", "urgent", "--hold", "--wrap", "true"]);
    let shown = sh.ok("scontrol", &["show", "job", alices.trim()]);
    assert!(shown.contains("QOS=urgent"), "{shown}");
    let err = refused(BOB);
    assert!(err.contains("account root allows only QOS normal"), "{err}");
    let bobs = sh.ok_as(BOB, "sbatch", &["--parsable", "--hold", "--wrap", "true"]).trim().to_string();
    let text = sh.denied_as(BOB, "scontrol", &["update", &format!("jobid={bobs}"), "qos=urgent"]);
    assert!(text.contains("account root allows only QOS normal"), "{text}");
    assert!(sh.ok("scontrol", &["show", "job", &bobs]).contains("QOS=normal"));
    // An administrator may set any QOS on a job.
    sh.ok("scontrol", &["update", &format!("jobid={bobs}"), "qos=urgent"]);
    assert!(sh.ok("scontrol", &["show", "job", &bobs]).contains("QOS=urgent"));
    // sacctmgr shows each association's QOS as the controllers enforce it.
    let assoc = sh.ok("sacctmgr", &["-nP", "show", "assoc", "format=account,user,qos"]);
    assert!(assoc.lines().any(|l| l == "physics|60001|normal,urgent"), "{assoc}");
    assert!(assoc.lines().any(|l| l == "root||normal"), "{assoc}");
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_missing_credential_is_refused_and_a_claimed_uid_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::up(&dir.path().join("c"), UpOptions::default()).unwrap();
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let key = cluster_key(&cluster);
    let leader = leader_addr_async(&cluster).await;
    let mut api = DroverServiceClient::new(client_channel(&cluster, &leader, RoleKind::Controller));

    // A job whose spec claims root, sent with Alice's credential, is Alice's job. The spec goes as JSON here, as
    // clients before the binary codec sent it: the controller still reads that.
    let alice = token(&key, ALICE);
    let secret = vec![("ALICE_SECRET".to_string(), "hunter2".to_string())];
    let request = SubmitJobRequest { spec: spec_json(0, "root", secret), request_id: String::new() };
    let id = api.submit_job(with_token(request, &alice)).await.unwrap().into_inner().job_id;
    // Bytes that are neither codec's are refused, naming the problem.
    let garbage = SubmitJobRequest { spec: vec![0xC1, 0xFF, 0x00], request_id: String::new() };
    let refused = api.submit_job(with_token(garbage, &alice)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().starts_with("malformed job spec"), "{}", refused.message());
    let reply = api.get_job(with_token(GetJobRequest { job_id: id, ..Default::default() }, &alice)).await.unwrap();
    let job: drover_state::Job = serde_json::from_slice(&reply.into_inner().job_json).unwrap();
    assert_eq!((job.spec.uid, job.spec.user.as_str()), (ALICE, "u60001"), "the credential decides, not the spec");
    assert!(job.spec.environment.iter().any(|(k, _)| k == "ALICE_SECRET"), "Alice sees her own environment");

    // Bob sees the job but not Alice's environment or script (Slurm's PrivateData).
    let bob = token(&key, BOB);
    let list = ListJobsRequest { job_ids: vec![id], ..Default::default() };
    let reply = api.list_jobs(with_token(list, &bob)).await.unwrap().into_inner();
    let jobs: Vec<drover_state::Job> = serde_json::from_slice(&reply.jobs_json).unwrap();
    assert_eq!(jobs.len(), 1);
    assert!(jobs[0].spec.environment.is_empty(), "another user's environment is not shown");
    let script = GetJobRequest { job_id: id, with_script: true, ..Default::default() };
    let denied = api.get_job(with_token(script, &bob)).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);

    // A credential edited to say uid 0 keeps its old signature: refused.
    let (payload, signature) = alice.split_once('.').unwrap();
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims: serde_json::Value = serde_json::from_slice(&engine.decode(payload).unwrap()).unwrap();
    claims["uid"] = 0.into();
    let forged = format!("{}.{signature}", engine.encode(serde_json::to_vec(&claims).unwrap()));
    // One signed with another cluster's key: refused too. And none at all.
    let foreign = token(&ClusterKey::generate(), 0);
    for (credential, why) in
        [(Some(forged), "not signed with this cluster's key"), (Some(foreign), "different cluster key")]
    {
        let status = api.cluster_status(with_token(ClusterStatusRequest::default(), &credential.unwrap())).await;
        let status = status.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains(why), "{}", status.message());
    }
    let status = api.list_jobs(ListJobsRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(status.message().contains("no user credential"), "{}", status.message());
}

async fn leader_addr_async(cluster: &LocalCluster) -> String {
    let status = cluster.client().unwrap().cluster_status().await.unwrap();
    status.replicas.iter().find(|r| r.role == "leader").unwrap().address.clone()
}

/// A TLS client that trusts the cluster's CA but presents no certificate of its own (or one from another CA).
fn channel_without_cluster_certificate(cluster: &LocalCluster, addr: &str, foreign: bool) -> Channel {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let ca = std::fs::read_to_string(cluster.dir.join("pki/ca.pem")).unwrap();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("127.0.0.1");
    if foreign {
        let other_ca = drover_auth::tls::generate_ca("someone else's CA").unwrap();
        let pem = drover_auth::tls::issue(&other_ca, &drover_auth::Role::Client("x".into()), &[], &[], 30).unwrap();
        tls = tls.identity(Identity::from_pem(pem.cert_pem, pem.key_pem));
    }
    Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(tls).unwrap().connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_port_refuses_a_client_without_a_cluster_certificate_and_services_refuse_the_wrong_role() {
    let dir = tempfile::tempdir().unwrap();
    let options = UpOptions { agents: 1, ..UpOptions::default() };
    let cluster = LocalCluster::up(&dir.path().join("c"), options).unwrap();
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    cluster.wait_agents(Duration::from_secs(30)).await.unwrap();
    let key = cluster_key(&cluster);
    let root = token(&key, 0);
    let controllers: Vec<String> = cluster.addresses().split(',').map(str::to_string).collect();
    let agent = cluster.processes.iter().find(|p| p.role == "agent").unwrap().address.clone();

    for addr in controllers.iter().chain([&agent]) {
        for foreign in [false, true] {
            // No certificate, or one from another CA: the TLS handshake fails, whatever the service.
            let channel = channel_without_cluster_certificate(&cluster, addr, foreign);
            let mut api = DroverServiceClient::new(channel.clone());
            let err = api.cluster_status(with_token(ClusterStatusRequest::default(), &root)).await.unwrap_err();
            assert!(
                matches!(
                    err.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
                ),
                "{addr} (foreign={foreign}): {err:?}"
            );
            let mut steps = AgentServiceClient::new(channel.clone());
            assert!(steps.launch_step(with_token(StepRequest { json: b"{}".to_vec() }, &root)).await.is_err());
            let mut raft = RaftServiceClient::new(channel);
            assert!(raft.vote(RaftRequest { data: b"{}".to_vec() }).await.is_err());
        }
        // A plain (non-TLS) connection gets nowhere either.
        let plain = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
        let mut api = DroverServiceClient::new(plain);
        assert!(api.cluster_status(with_token(ClusterStatusRequest::default(), &root)).await.is_err(), "{addr}");
    }

    // With the cluster's client certificate, a client still may not speak Raft or pose as an agent.
    let channel = client_channel(&cluster, &controllers[0], RoleKind::Controller);
    let mut raft = RaftServiceClient::new(channel.clone());
    let err = raft.vote(RaftRequest { data: b"{}".to_vec() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let mut gateway = AgentGatewayClient::new(channel.clone());
    let (_tx, rx) = tokio::sync::mpsc::channel::<drover_proto::v1::AgentEnvelope>(1);
    let err = gateway.session(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    // ... while the client API serves it (with a credential).
    let mut api = DroverServiceClient::new(channel);
    assert!(api.cluster_status(with_token(ClusterStatusRequest::default(), &root)).await.is_ok());
}

/// The host's relay forwards each caller's own credential and has none of its own to lend. A call without one is
/// refused by the relay itself; a forged one is refused by the controllers, and the caller hears why; and a
/// retry under the same request id, through the relay or directly, is the same job, so a command that falls back
/// after a relay died mid-call never submits twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_forwards_each_callers_own_credential_and_lends_none() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::up(&dir.path().join("c"), UpOptions::default()).unwrap();
    cluster.wait_ready(Duration::from_secs(30)).await.unwrap();
    let key = cluster_key(&cluster);
    let socket = cluster.dir.join("relay.sock");
    let spec = drover_client::encode_spec(&drover_cli::local::trivial_spec()).unwrap();
    let alice = token(&key, ALICE);

    // Alice's submission through the relay is Alice's job.
    let attempt = relay::submit(&socket, &alice, spec.clone(), "alice-1");
    let RelayAttempt::Submitted(id) = attempt else { panic!("the relay did not submit: {attempt:?}") };
    let leader = leader_addr_async(&cluster).await;
    let mut api = DroverServiceClient::new(client_channel(&cluster, &leader, RoleKind::Controller));
    let reply = api.get_job(with_token(GetJobRequest { job_id: id, ..Default::default() }, &alice)).await.unwrap();
    let job: drover_state::Job = serde_json::from_slice(&reply.into_inner().job_json).unwrap();
    assert_eq!(job.spec.uid, ALICE, "the relay's caller owns the job, not the relay");

    // The same request id again, through the relay and then directly: the first job, not a second.
    let again = relay::submit(&socket, &alice, spec.clone(), "alice-1");
    assert!(matches!(again, RelayAttempt::Submitted(same) if same == id), "{again:?}");
    let direct = SubmitJobRequest { spec: spec.clone(), request_id: "alice-1".into() };
    let reply = api.submit_job(with_token(direct, &alice)).await.unwrap().into_inner();
    assert_eq!((reply.job_id, reply.duplicate), (id, true));

    // No credential: the relay refuses before sending anything (it must not lend its host's identity).
    let refused = relay::submit(&socket, "", spec.clone(), "anonymous");
    let RelayAttempt::Refused(e) = refused else { panic!("an anonymous submission was not refused: {refused:?}") };
    assert!(e.to_string().contains("none of its own"), "{e}");

    // A credential signed with another key: the controllers refuse it, and the caller hears why.
    let forged =
        sign(&ClusterKey::generate(), &Identity { uid: 0, gid: 0, user: "root".into() }, "x", now_ms(), 60_000);
    let attempt = relay::submit(&socket, &forged, spec, "forged");
    let RelayAttempt::Refused(e) = attempt else { panic!("a forged credential went through: {attempt:?}") };
    assert!(e.to_string().contains("not signed with this cluster's key"), "{e}");

    // One job in all.
    let list = ListJobsRequest::default();
    let reply = api.list_jobs(with_token(list, &alice)).await.unwrap().into_inner();
    let jobs: Vec<drover_state::Job> = serde_json::from_slice(&reply.jobs_json).unwrap();
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    drop(cluster);
}

/// `sbatch` hands its submission to the host's relay and needs no TLS of its own for it; without the relay it
/// submits straight to the leader.
#[test]
fn sbatch_submits_through_the_hosts_relay_and_directly_when_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, sh) = setup(dir.path(), UpOptions::default());
    // A configuration whose TLS files do not exist: only through the relay (which has its own) can it submit.
    let real = std::fs::read_to_string(cluster.dir.join("client.toml")).unwrap();
    let no_tls: String = real
        .lines()
        .map(
            |l| if l.starts_with("cert = ") { "cert = \"/nonexistent/client.pem\"".to_string() } else { l.to_string() },
        )
        .collect::<Vec<_>>()
        .join("\n");
    let no_tls_path = dir.path().join("no-tls.toml");
    std::fs::write(&no_tls_path, no_tls).unwrap();
    let through_relay =
        sh.command("sbatch", &["--parsable", "--wrap=true"]).env("DROVER_CONFIG", &no_tls_path).output().unwrap();
    assert!(through_relay.status.success(), "{}", String::from_utf8_lossy(&through_relay.stderr));
    // The same configuration told there is no relay must load its own TLS files, and cannot.
    let direct = sh
        .command("sbatch", &["--parsable", "--wrap=true"])
        .env("DROVER_CONFIG", &no_tls_path)
        .env(drover_client::RELAY_SOCKET_ENV, "")
        .output()
        .unwrap();
    assert!(!direct.status.success());
    assert!(String::from_utf8_lossy(&direct.stderr).contains("/nonexistent/client.pem"));
    // A typed refusal reads the same through the relay as directly.
    let relayed = sh.err("sbatch", &["-p", "nope", "--wrap=true"]);
    assert!(relayed.contains("invalid partition name specified: \"nope\""), "{relayed}");

    // The relay stops (and removes its socket): sbatch goes to the leader itself.
    let relay_id = cluster.processes.iter().find(|p| p.role == "relayd").unwrap().id;
    cluster.signal(relay_id, libc::SIGTERM).unwrap();
    assert!(!cluster.dir.join("relay.sock").exists(), "a stopped relay leaves no socket to try");
    let id = sh.submit(&["--wrap=true"]);
    assert!(sh.ok("squeue", &["-h", "-o", "%i"]).lines().any(|l| l.trim() == id.to_string()));
}

/// A session to the leader as agent `node`, with a certificate the cluster's CA issued for it (what a compromised
/// node holds): the sender for its messages and the controller's answers.
async fn agent_session(
    cluster: &LocalCluster,
    node: &str,
    register: drover_proto::wire::AgentMessage,
) -> Result<
    (
        tokio::sync::mpsc::Sender<drover_proto::v1::AgentEnvelope>,
        tonic::Streaming<drover_proto::v1::ControllerEnvelope>,
    ),
    tonic::Status,
> {
    let pki = cluster.pki().unwrap();
    let (cert, key) = pki
        .issue(&format!("{node}-rogue"), &drover_auth::Role::Agent(node.into()), &[], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    let files = drover_auth::TlsFiles { ca: cluster.dir.join("pki/ca.pem"), cert, key };
    let leader = leader_addr_async(cluster).await;
    let channel = drover_auth::ClientTls::load(files)
        .unwrap()
        .channel(&leader, None, Duration::from_secs(2), Some(RoleKind::Controller))
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(drover_proto::v1::AgentEnvelope { json: drover_proto::wire::encode(&register) }).await.unwrap();
    let response = AgentGatewayClient::new(channel).session(tokio_stream::wrappers::ReceiverStream::new(rx)).await?;
    Ok((tx, response.into_inner()))
}

/// A node speaks only for itself (issue 28, findings 8 and 9). With a valid agent certificate for node02, a rogue
/// agent reports the end of a job that runs on node01: the job runs on, and only node01's own report ends it. And a
/// node that registers a host a shell would read (`x; touch FILE`) is refused: the host would go into `MASTER_ADDR`
/// and the operators' fence command.
#[test]
fn an_agent_speaks_only_for_its_own_node_and_registers_only_a_real_host() {
    use drover_proto::wire::{AgentMessage, ControllerMessage, decode};
    let dir = tempfile::tempdir().unwrap();
    // `setup` retries a start that a saturated machine made miss its election.
    let (cluster, sh) = setup(dir.path(), UpOptions { agents: 2, gpus_per_agent: 1, ..UpOptions::default() });
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = cluster.client().unwrap();
        let nodes = client.list_nodes(false).await.unwrap();
        let node02 = nodes.iter().find(|n| n.info.name == "node02").unwrap().info.clone();
        let state = async |id: u64| client.get_job(id, false, false).await.unwrap().0.state;
        let id = sh.submit(&["-w", "node01", "--gres=gpu:1", "-o", "rogue.out", "--wrap", "sleep 4; echo done"]);
        let running = Instant::now();
        while state(id).await != drover_state::JobState::Running {
            assert!(running.elapsed() < Duration::from_secs(20), "job {id} never ran");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let (tx, mut answers) = agent_session(
            &cluster,
            "node02",
            AgentMessage::Register { info: node02, running: Vec::new(), feature_level: drover_state::feature::LEVEL },
        )
        .await
        .unwrap();
        let welcome = answers.message().await.unwrap().unwrap();
        assert!(matches!(decode(&welcome.json).unwrap(), ControllerMessage::Welcome { .. }));
        let end = drover_state::JobEnd { exit_code: 0, ..Default::default() };
        let report = AgentMessage::JobEnded { job_id: id, incarnation: 0, end };
        tx.send(drover_proto::v1::AgentEnvelope { json: drover_proto::wire::encode(&report) }).await.unwrap();
        // The leader never acknowledges the report, and the job runs on until node01 says it ended.
        let acked = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(message)) = answers.message().await {
                if matches!(decode(&message.json), Ok(ControllerMessage::EndAcked { job_id, .. }) if job_id == id) {
                    return true;
                }
            }
            false
        })
        .await;
        assert_ne!(acked, Ok(true), "the rogue report was acknowledged");
        assert_eq!(state(id).await, drover_state::JobState::Running, "ended by node02's word");
        drop(tx);
        let finished = Instant::now();
        while state(id).await == drover_state::JobState::Running {
            assert!(finished.elapsed() < Duration::from_secs(30), "job {id} never ended");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(state(id).await, drover_state::JobState::Completed);
        assert_eq!(std::fs::read_to_string(sh.cwd.join("rogue.out")).unwrap().trim(), "done", "it ran to its end");

        let pwned = dir.path().join("pwned");
        let info = drover_state::NodeInfo {
            name: "node03".into(),
            host: format!("127.0.0.1; touch {}", pwned.display()),
            agent_addr: "127.0.0.1:1".into(),
            ..Default::default()
        };
        let err = agent_session(
            &cluster,
            "node03",
            AgentMessage::Register { info, running: Vec::new(), feature_level: drover_state::feature::LEVEL },
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("neither an IP address nor a DNS host name"), "{}", err.message());
        let nodes = client.list_nodes(false).await.unwrap();
        assert!(nodes.iter().all(|n| n.info.name != "node03"), "never registered");
        assert!(!pwned.exists());
    });
}

/// Issue 28, finding 12: a credential is good only for its audience. srun gets one per step from the controllers and
/// only that reaches the nodes, so a node can replay nothing to the controllers: the step credential is refused
/// there, and by the agents for any other step; the user's own token (for the controllers) is refused by the agents.
#[test]
fn a_step_credential_opens_its_step_on_its_nodes_and_nothing_else() {
    use drover_proto::wire::{StepLaunch, encode};
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = setup(dir.path(), UpOptions { agents: 1, ..UpOptions::default() });
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = cluster.client().unwrap();
        let id = sh.submit(&["--gres=gpu:1", "--wrap", "sleep 60"]);
        let running = Instant::now();
        while client.get_job(id, false, false).await.unwrap().0.state != drover_state::JobState::Running {
            assert!(running.elapsed() < Duration::from_secs(20), "job {id} never ran");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (step, credential) = client.create_step(id, "true", &["node01".to_string()], 1).await.unwrap();

        // At the controllers, the step's credential is no one's.
        let controllers: Vec<String> = cluster.addresses().split(',').map(str::to_string).collect();
        let mut api = DroverServiceClient::new(client_channel(&cluster, &controllers[0], RoleKind::Controller));
        let err = api.cluster_status(with_token(ClusterStatusRequest::default(), &credential)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
        assert!(err.message().contains(&format!("issued for job step {id}.{step} but presented to the controllers")));

        // At the agent: the user's own token is refused, so is the credential for another step, and this step's opens.
        let agent = cluster.processes.iter().find(|p| p.role == "agent").unwrap().address.clone();
        let launch = |step_id: u32| StepLaunch {
            job_id: id,
            step_id,
            argv: vec!["true".into()],
            env: Vec::new(),
            cwd: "/".into(),
            nodes: vec!["node01".into()],
            node_index: 0,
            tasks_per_node: vec![1],
            output: None,
            error: None,
            unbuffered: false,
            stdin: Default::default(),
            container: None,
        };
        let mut steps = AgentServiceClient::new(client_channel(&cluster, &agent, RoleKind::Agent));
        let own = token(&cluster_key(&cluster), 0);
        for (token, step_id, presented) in [(&own, step, "the controllers"), (&credential, step + 1, "job step")] {
            let request = with_token(StepRequest { json: encode(&launch(step_id)) }, token);
            let Err(err) = steps.launch_step(request).await else { panic!("{presented}: accepted") };
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
            assert!(err.message().contains("credential issued for"), "{presented}: {}", err.message());
        }
        let request = with_token(StepRequest { json: encode(&launch(step)) }, &credential);
        let mut events = steps.launch_step(request).await.unwrap().into_inner();
        while events.message().await.unwrap().is_some() {}
        sh.ok("scancel", &[&id.to_string()]);
    });
}

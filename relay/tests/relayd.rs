//! The `drover-relayd` binary as a host runs it: its socket, a second copy on the same socket, what a caller
//! hears when the cluster cannot be reached, and a clean stop.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_auth::credential::{ClusterKey, Identity, now_ms, sign};
use drover_client::relay::{self, RelayAttempt};
use drover_proto::v1::relay_reply::Outcome;
use prost::Message;

mod common;

use common::host_config;

fn relayd(config: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drover-relayd"));
    command.arg("--config").arg(config).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what} did not happen within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_serves_every_user_refuses_a_second_copy_reports_an_unreachable_cluster_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = host_config(dir.path());
    let socket = dir.path().join("relay.sock");
    let mut relay = Running(relayd(&config).spawn().unwrap());
    wait_for("the relay's socket", Duration::from_secs(10), || socket.exists());
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o666, "every local user may call");

    // A second relay on the same socket refuses to start, naming the one already there.
    let second = relayd(&config).output().unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("another drover-relayd is serving"), "{said}");

    // The cluster is not there: the caller hears which controllers were tried, as a direct call would say.
    let token = sign(&ClusterKey::generate(), &Identity { uid: 1, gid: 1, user: "u".into() }, "h", now_ms(), 60_000);
    let spec = drover_client::encode_spec(&drover_cli::local::trivial_spec()).unwrap();
    let attempt = relay::submit(&socket, &token, spec, "r-1");
    let RelayAttempt::Refused(e) = attempt else {
        panic!("expected the cluster's absence to be reported: {attempt:?}")
    };
    assert!(e.to_string().contains("cannot reach the Drover cluster: tried 127.0.0.1:1"), "{e}");

    // A caller that speaks the protocol but sends a broken request hears what is wrong with it ...
    let mut broken = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    broken.write_all(b"DRL1\0\0\0\x03\xff\xff\xff").unwrap();
    let mut answer = Vec::new();
    broken.read_to_end(&mut answer).unwrap();
    let reply = drover_proto::v1::RelayReply::decode(&answer[4..]).unwrap();
    let Some(Outcome::Refused(refusal)) = reply.outcome else { panic!("{reply:?}") };
    assert_eq!(tonic::Code::from_i32(refusal.code), tonic::Code::InvalidArgument);
    assert!(refusal.message.contains("malformed frame"), "{}", refusal.message);
    // ... while one that speaks another protocol (an older sbatch's HTTP/2) is not answered at all, so that it
    // falls back to submitting directly; the relay carries on serving.
    let mut old = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    old.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    // Closed with the rest of the preface unread: a reset, or an end with nothing in it.
    match old.read_to_end(&mut answer) {
        Ok(_) => assert!(answer.is_empty(), "{answer:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let attempt =
        relay::submit(&socket, &token, drover_client::encode_spec(&drover_cli::local::trivial_spec()).unwrap(), "r-2");
    assert!(matches!(attempt, RelayAttempt::Refused(_)), "{attempt:?}");

    // SIGTERM: it stops and takes its socket with it, so no command tries a dead one.
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(relay.0.id() as i32, libc::SIGTERM) };
    let status = relay.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists());
}

#[test]
fn a_relay_without_its_configuration_or_tls_files_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let missing = relayd(&dir.path().join("nope.toml")).output().unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nope.toml"));

    let config = host_config(dir.path());
    let text = std::fs::read_to_string(&config).unwrap().replace("client.pem", "gone.pem");
    std::fs::write(&config, text).unwrap();
    let no_tls = relayd(&config).output().unwrap();
    assert!(!no_tls.status.success());
    assert!(
        String::from_utf8_lossy(&no_tls.stderr).contains("gone.pem"),
        "{}",
        String::from_utf8_lossy(&no_tls.stderr)
    );
}

/// The relay logs as every Drover daemon does: `DROVER_LOG_FORMAT=json` gives one JSON object per line for a log
/// pipeline (it used to set up its own text-only logger and ignore the variable).
#[test]
fn a_relay_asked_for_json_logs_writes_one_json_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = host_config(dir.path());
    let socket = dir.path().join("relay.sock");
    let relay = relayd(&config).env("DROVER_LOG_FORMAT", "json").spawn().unwrap();
    wait_for("the relay's socket", Duration::from_secs(10), || socket.exists());
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(relay.id() as i32, libc::SIGTERM) };
    let output = relay.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.iter().any(|l| l.contains("relaying submissions")), "{stderr}");
    for line in lines {
        let event: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(event.get("level").is_some(), "{line}");
    }
}

/// The relay's resident memory in KiB (VmRSS).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A hostile local user (finding 7 of the node-security review): 150 connections each announce a 16 MiB request
/// and send 4 MiB of it, then stall. Before the byte budget the relay allocated what each header announced and
/// grew past 2 GB; now it holds at most its budget (64 MiB) of request bytes, refuses the rest as busy, and one
/// user gets at most 64 of its connections.
#[test]
fn callers_that_announce_large_requests_and_stall_cannot_grow_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let config = host_config(dir.path());
    let socket = dir.path().join("relay.sock");
    let relay = Running(relayd(&config).spawn().unwrap());
    wait_for("the relay's socket", Duration::from_secs(10), || socket.exists());
    let before = rss_kib(relay.0.id());

    let sent_mib = 4;
    let piece = vec![0x5au8; 1 << 20];
    let mut open = Vec::new();
    let (mut refused, mut closed) = (0, 0);
    for _ in 0..150 {
        let mut caller = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        caller.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut header = drover_client::relay::MAGIC.to_vec();
        header.extend_from_slice(&(16u32 << 20).to_be_bytes());
        let written = caller.write_all(&header).and_then(|_| (0..sent_mib).try_for_each(|_| caller.write_all(&piece)));
        match written {
            Ok(()) => open.push(caller),
            // The relay answered busy and closed, or closed a connection over the user's share.
            Err(_) => closed += 1,
        }
    }
    // Callers past the budget hear a typed refusal, not silence.
    for caller in &mut open {
        caller.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut first = [0u8; 4];
        if let Ok(4) = caller.read(&mut first) {
            refused += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let grown_mib = rss_kib(relay.0.id()).saturating_sub(before) >> 10;
    eprintln!(
        "150 stalled 16 MiB requests: {} left open, {refused} refused busy, {closed} closed; relay grew {grown_mib} MiB",
        open.len()
    );
    assert!(grown_mib <= 64 + 32, "the relay grew {grown_mib} MiB holding stalled requests");
    assert!(refused + closed >= 150 - 64, "one user held more than its 64 connections");
    drop(open);
}

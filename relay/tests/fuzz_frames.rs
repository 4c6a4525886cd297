//! The relay's frames, fuzzed as `apply` is: whatever a local caller writes to `drover-relayd`'s socket (another
//! protocol, a broken header, a length that lies, a mangled request), the relay answers with a well-formed reply
//! frame or not at all, never dies, and goes on serving real commands. Every local user may open the socket, so
//! every byte sequence is a possible input.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_client::relay::{self, MAGIC, RelayAttempt};
use drover_proto::v1::{RelayReply, RelayRequest, SubmitJobRequest};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;

mod common;

use common::host_config;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A request a real sbatch could send, without a credential (so the relay refuses it at once rather than trying
/// the absent cluster): the base the fuzzer mangles.
fn real_request() -> Vec<u8> {
    let spec = drover_client::encode_spec(&drover_cli::local::trivial_spec()).unwrap();
    let submit = SubmitJobRequest { spec, request_id: "fuzz".into() };
    relay::encode_request(&RelayRequest { credential: String::new(), submit: Some(submit) })
}

/// What a caller writes: the magic (usually right), a length (usually true, sometimes a lie), a body (a mangled
/// real request or any bytes); or any bytes at all.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let magic = prop_oneof![3 => Just(MAGIC.to_vec()), 1 => prop::collection::vec(any::<u8>(), 0..5)];
    let body = prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        1 => (any::<prop::sample::Index>(), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6))
            .prop_map(|(cut, flips)| {
                let mut body = real_request()[MAGIC.len() + 4..].to_vec();
                for (at, byte) in flips {
                    let i = at.index(body.len());
                    body[i] = byte;
                }
                body.truncate(cut.index(body.len() + 1));
                body
            }),
    ];
    let length = prop_oneof![2 => Just(None), 1 => any::<u32>().prop_map(Some), 1 => (0u32..512).prop_map(Some)];
    let framed = (magic, length, body).prop_map(|(mut out, length, body)| {
        let len = length.unwrap_or(body.len() as u32);
        out.extend(len.to_be_bytes());
        out.extend(body);
        out
    });
    prop_oneof![4 => framed, 1 => prop::collection::vec(any::<u8>(), 0..64)]
}

/// Sends `bytes`, says it is done, and reads what comes back (the relay closes every connection after one
/// exchange).
fn exchange(socket: &Path, bytes: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The relay may close before reading everything (a bad magic): a broken pipe is its answer, not ours.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

#[test]
fn whatever_a_local_caller_writes_the_relay_answers_well_or_not_at_all_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = host_config(dir.path());
    let socket = dir.path().join("relay.sock");
    let mut relayd = Command::new(env!("CARGO_BIN_EXE_drover-relayd"));
    relayd.arg("--config").arg(&config).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let running = std::sync::Mutex::new(Running(relayd.spawn().unwrap()));
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "the relay's socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut runner = TestRunner::new(Config { cases: 300, failure_persistence: None, ..Config::default() });
    let answered = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&frame(), |bytes| {
            let answer = exchange(&socket, &bytes);
            if !answer.is_empty() {
                // A reply frame: its length, then exactly that many bytes of a RelayReply.
                prop_assert!(answer.len() >= 4, "{answer:?}");
                let len = u32::from_be_bytes(answer[..4].try_into().unwrap()) as usize;
                prop_assert_eq!(len, answer.len() - 4);
                prop_assert!(RelayReply::decode(&answer[4..]).is_ok());
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let alive = running.lock().unwrap().0.try_wait().unwrap().is_none();
            prop_assert!(alive, "the relay died on {bytes:?}");
            Ok(())
        })
        .unwrap();
    assert!(answered.into_inner() > 0, "no fuzzed request was answered: the fuzzer never spoke the protocol");

    // Still serving: a real submission with a credential reaches the (absent) cluster and the caller hears so.
    let token = drover_auth::credential::sign(
        &drover_auth::ClusterKey::generate(),
        &drover_auth::credential::Identity { uid: 1, gid: 1, user: "u".into() },
        "h",
        drover_auth::credential::now_ms(),
        60_000,
    );
    let spec = drover_client::encode_spec(&drover_cli::local::trivial_spec()).unwrap();
    let attempt = relay::submit(&socket, &token, spec, "after-fuzz");
    let RelayAttempt::Refused(e) = attempt else { panic!("the relay stopped serving: {attempt:?}") };
    assert!(e.to_string().contains("cannot reach the Drover cluster"), "{e}");
}

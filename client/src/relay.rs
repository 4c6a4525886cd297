//! A submission through the host's relay (`drover-relayd`): the relay's local protocol, and a short-lived
//! command's side of it.
//!
//! A new process that talks to the leader itself pays for its TLS files, a TCP connection and a mutual-TLS
//! handshake on every `sbatch`: most of what one costs, apart from the commit. The relay keeps one connection open
//! and forwards each submission on it with the caller's own credential; the command only opens a Unix socket.
//! When the relay is not there (not installed, stopped, crashed mid-call) the command submits directly under the
//! same request id, so a submission the relay did forward before it died is never made twice.
//!
//! The local protocol is one request frame and one reply frame per connection (see `RelayRequest` in
//! drover.proto), not gRPC. Over gRPC, the hop to the relay (HTTP/2's preface and settings, its stream and header
//! machinery on both sides, a tokio runtime in the command) took 0.64 ms of a 3 ms `sbatch` at p50, more than the
//! relay's own forwarding work; a frame needs one write and one read on each side, with blocking I/O in the
//! command.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use drover_proto::v1::relay_reply::Outcome;
use drover_proto::v1::{RelayRefusal, RelayReply, RelayRequest, SubmitJobReply, SubmitJobRequest};
use prost::Message;
use tonic::{Code, Status};

use crate::{ClientError, DEFAULT_DEADLINE_MS};

/// What a request starts with: the protocol and its version. Anything else (an HTTP/2 preface from an `sbatch`
/// older than the relay, a stray client) is not answered.
pub const MAGIC: [u8; 4] = *b"DRL1";
/// The largest request the relay reads: the controllers' own limit on a request.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;
/// The largest reply a command reads: a job id, or a refusal with its message and typed details.
pub const MAX_REPLY_BYTES: usize = 1 << 20;
/// How long sending the request may take: the relay is on this host, so anything slower means it is stuck, and
/// the direct path is the better bet.
const SEND_TIMEOUT_MS: u64 = 500;
/// The relay's own retries across controllers take up to the client deadline; a little more for the hop.
const CALL_TIMEOUT_MS: u64 = DEFAULT_DEADLINE_MS + 1_000;

/// What became of a submission offered to the relay.
#[derive(Debug)]
pub enum RelayAttempt {
    /// Committed: the job id.
    Submitted(u64),
    /// The cluster (or the relay, for a malformed request) refused it: the final answer, as a direct call would
    /// have had it.
    Refused(ClientError),
    /// No relay answered (why, for a log line): submit directly, with the same request id.
    Unavailable(String),
}

/// A frame that cannot be read: the protocol's errors, each naming what was wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("not the relay protocol (it starts with {0:?}, not \"DRL1\"): an sbatch older than this drover-relayd?")]
    Magic([u8; 4]),
    #[error("a frame of {len} bytes is over the {limit}-byte limit")]
    TooLong { len: usize, limit: usize },
    #[error("a malformed frame: {0}")]
    Malformed(String),
}

/// The request frame: the magic, the length, the message.
pub fn encode_request(request: &RelayRequest) -> Vec<u8> {
    let mut frame = MAGIC.to_vec();
    frame.extend(frame_of(request));
    frame
}

/// The reply frame: the length, the message.
pub fn encode_reply(reply: &RelayReply) -> Vec<u8> {
    frame_of(reply)
}

fn frame_of(message: &impl Message) -> Vec<u8> {
    let body = message.encode_to_vec();
    let len = u32::try_from(body.len()).expect("a relay message is far below 4 GiB");
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend(body);
    frame
}

/// Checks a request's first four bytes.
pub fn check_magic(first: [u8; 4]) -> Result<(), FrameError> {
    if first == MAGIC { Ok(()) } else { Err(FrameError::Magic(first)) }
}

/// The length a frame's header announces, if it is within `limit`.
pub fn frame_len(header: [u8; 4], limit: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > limit { Err(FrameError::TooLong { len, limit }) } else { Ok(len) }
}

/// Decodes a request's message (after its header).
pub fn decode_request(body: &[u8]) -> Result<RelayRequest, FrameError> {
    RelayRequest::decode(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// The reply that carries `status` to the caller as a direct call would have had it: code, message, details.
pub fn refusal(status: &Status) -> RelayReply {
    RelayReply {
        outcome: Some(Outcome::Refused(RelayRefusal {
            code: status.code() as i32,
            message: status.message().to_string(),
            details: status.details().to_vec(),
        })),
    }
}

/// The reply for a committed submission.
pub fn submitted(reply: SubmitJobReply) -> RelayReply {
    RelayReply { outcome: Some(Outcome::Submitted(reply)) }
}

/// Offers one encoded submission to the relay on `socket`, with the caller's credential `token`. Blocking: a
/// command has nothing else to do meanwhile, and needs no runtime for it.
pub fn submit(socket: &Path, token: &str, spec: Vec<u8>, request_id: &str) -> RelayAttempt {
    let unavailable = |why: String| RelayAttempt::Unavailable(format!("{}: {why}", socket.display()));
    let request = RelayRequest {
        credential: token.to_string(),
        submit: Some(SubmitJobRequest { spec, request_id: request_id.to_string() }),
    };
    let frame = encode_request(&request);
    if frame.len() > MAX_REQUEST_BYTES + 8 {
        // The relay would not read it; the direct path's own limit gives the caller its answer.
        return unavailable(format!("the submission is {} bytes, over the relay's limit", frame.len()));
    }
    let reply = match exchange(socket, &frame) {
        Ok(reply) => reply,
        // Not running, gone mid-call, or not a relay: the direct path, under the same request id.
        Err(e) => return unavailable(e.to_string()),
    };
    match reply.outcome {
        Some(Outcome::Submitted(reply)) => RelayAttempt::Submitted(reply.job_id),
        Some(Outcome::Refused(refusal)) => {
            let status = Status::with_details(Code::from_i32(refusal.code), refusal.message, refusal.details.into());
            // The relay's own limit on submissions in flight: the direct path is not limited by it.
            if status.code() == Code::ResourceExhausted {
                return unavailable(status.message().to_string());
            }
            RelayAttempt::Refused(ClientError::from_status(&status))
        }
        None => unavailable("the relay's reply has no outcome".to_string()),
    }
}

/// Sends `frame` and reads the one reply.
fn exchange(socket: &Path, frame: &[u8]) -> io::Result<RelayReply> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_write_timeout(Some(Duration::from_millis(SEND_TIMEOUT_MS)))?;
    stream.set_read_timeout(Some(Duration::from_millis(CALL_TIMEOUT_MS)))?;
    stream.write_all(frame)?;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => io::Error::new(e.kind(), "the relay closed the connection without answering"),
        _ => e,
    })?;
    let len = frame_len(header, MAX_REPLY_BYTES).map_err(io::Error::other)?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    RelayReply::decode(body.as_slice()).map_err(|e| io::Error::other(FrameError::Malformed(e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn request() -> RelayRequest {
        RelayRequest {
            credential: "token".into(),
            submit: Some(SubmitJobRequest { spec: vec![1, 2, 3], request_id: "r-1".into() }),
        }
    }

    /// A request frame reads back as it was sent; its header names the protocol and the length.
    #[test]
    fn a_request_frame_round_trips() {
        let frame = encode_request(&request());
        check_magic(frame[..4].try_into().unwrap()).unwrap();
        let len = frame_len(frame[4..8].try_into().unwrap(), MAX_REQUEST_BYTES).unwrap();
        assert_eq!(len, frame.len() - 8);
        assert_eq!(decode_request(&frame[8..]).unwrap(), request());
    }

    /// What the relay refuses to read, each with a reason: another protocol (an HTTP/2 preface), a length over
    /// the limit, bytes that are not the message.
    #[test]
    fn the_wrong_protocol_an_oversized_frame_and_garbage_are_named() {
        let e = check_magic(*b"PRI ").unwrap_err();
        assert!(e.to_string().contains("older than this drover-relayd"), "{e}");
        let e = frame_len(((MAX_REQUEST_BYTES + 1) as u32).to_be_bytes(), MAX_REQUEST_BYTES).unwrap_err();
        assert_eq!(e, FrameError::TooLong { len: MAX_REQUEST_BYTES + 1, limit: MAX_REQUEST_BYTES });
        assert!(matches!(decode_request(&[0xff, 0xff, 0xff]), Err(FrameError::Malformed(_))));
    }

    /// A fake relay on a real socket: it answers `reply` (or closes at once when `None`) and returns the request
    /// it read.
    fn fake_relay(dir: &Path, reply: Option<RelayReply>) -> (std::path::PathBuf, std::thread::JoinHandle<Vec<u8>>) {
        let path = dir.join("relay.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = [0u8; 8];
            stream.read_exact(&mut head).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(head[4..].try_into().unwrap()) as usize];
            stream.read_exact(&mut body).unwrap();
            if let Some(reply) = reply {
                stream.write_all(&encode_reply(&reply)).unwrap();
            }
            body
        });
        (path, handle)
    }

    /// The three answers a command acts on: a job id; a refusal, typed as a direct call's would be; and a relay
    /// that went away without answering, which sends the command down the direct path.
    #[test]
    fn a_command_hears_the_job_the_typed_refusal_or_that_no_relay_answered() {
        let dir = tempfile::tempdir().unwrap();
        let (path, relay) = fake_relay(dir.path(), Some(submitted(SubmitJobReply { job_id: 42, duplicate: false })));
        let attempt = submit(&path, "token", vec![1, 2, 3], "r-1");
        assert!(matches!(attempt, RelayAttempt::Submitted(42)), "{attempt:?}");
        assert_eq!(decode_request(&relay.join().unwrap()).unwrap(), request());
        std::fs::remove_file(&path).unwrap();

        let refused = drover_state::CommandError::InvalidPartition { name: "nope".into(), known: "gpu".into() };
        let status = Status::with_details(
            Code::FailedPrecondition,
            refused.to_string(),
            drover_proto::command_error_details(&refused).into(),
        );
        let (path, relay) = fake_relay(dir.path(), Some(refusal(&status)));
        let attempt = submit(&path, "token", vec![1, 2, 3], "r-1");
        assert!(matches!(&attempt, RelayAttempt::Refused(ClientError::Rejected(e)) if *e == refused), "{attempt:?}");
        relay.join().unwrap();
        std::fs::remove_file(&path).unwrap();

        let (path, relay) = fake_relay(dir.path(), Some(refusal(&Status::resource_exhausted("busy"))));
        let attempt = submit(&path, "token", vec![1, 2, 3], "r-1");
        assert!(matches!(&attempt, RelayAttempt::Unavailable(why) if why.contains("busy")), "{attempt:?}");
        relay.join().unwrap();
        std::fs::remove_file(&path).unwrap();

        let (path, relay) = fake_relay(dir.path(), None);
        let attempt = submit(&path, "token", vec![1, 2, 3], "r-1");
        let RelayAttempt::Unavailable(why) = attempt else { panic!("{attempt:?}") };
        assert!(why.contains("closed the connection without answering"), "{why}");
        relay.join().unwrap();

        let attempt = submit(&dir.path().join("none.sock"), "token", vec![], "r-1");
        assert!(matches!(attempt, RelayAttempt::Unavailable(_)), "{attempt:?}");
    }
}

//! The one write path: every writer (the client API, the agent hub, the scheduling loop, leader duties) proposes
//! commands here, and gets back the state machine's reply or a typed status a client can act on.
//!
//! The leader's clock stamps each entry here, once, so `apply` never reads one (replicas apply the same time).

use std::time::Duration;

use drover_proto::LEADER_HINT_KEY;
use drover_state::{Command, CommandError, Reply, Request};
use openraft::error::{ClientWriteError, RaftError};
use tonic::Status;

use crate::runtime::now_ms;
use crate::types::{Raft, TypeConfig};

/// How long a write may wait for a quorum before the caller is told to retry.
pub const WRITE_TIMEOUT_MS: u64 = 3_000;

/// Commits one command on this replica (which must lead) and returns its reply; a refusal from `apply` becomes
/// a status carrying the typed [`CommandError`] in its details (see [`command_error_status`]).
pub async fn propose(raft: &Raft, command: Command) -> Result<Reply, Status> {
    propose_checked(raft, command).await?.map_err(|e| command_error_status(&e))
}

/// Like [`propose`], but keeps a refusal from `apply` apart from a failure to commit at all.
pub async fn propose_checked(raft: &Raft, command: Command) -> Result<Result<Reply, CommandError>, Status> {
    let write = raft.client_write(Request { time_ms: now_ms(), command });
    let result = tokio::time::timeout(Duration::from_millis(WRITE_TIMEOUT_MS), write).await.map_err(|_| {
        Status::unavailable(format!(
            "the write was not committed within {WRITE_TIMEOUT_MS} ms: this replica cannot reach a quorum; retry or try another controller"
        ))
    })?;
    result.map(|response| response.data).map_err(write_error)
}

/// A refused command as a gRPC status: the code says what kind of refusal it is, the message says it in words,
/// and the details carry the `CommandError` itself, so clients match on the type, never on the text.
pub fn command_error_status(e: &CommandError) -> Status {
    let code = match e {
        CommandError::InvalidJobId { .. } => tonic::Code::NotFound,
        CommandError::PermissionDenied { .. } | CommandError::NotAuthorized { .. } => tonic::Code::PermissionDenied,
        CommandError::NotInitialized | CommandError::TooManyJobs { .. } => tonic::Code::Unavailable,
        _ => tonic::Code::InvalidArgument,
    };
    Status::with_details(code, e.to_string(), drover_proto::command_error_details(e).into())
}

/// "Ask the leader instead", with its address in the `x-drover-leader` metadata when this replica knows it.
pub fn not_leader(addr: Option<&str>) -> Status {
    match addr {
        Some(addr) => {
            let mut status = Status::failed_precondition(format!("not the leader; the leader is at {addr}"));
            name_leader(status.metadata_mut(), addr);
            status
        }
        None => Status::unavailable("no leader is elected at the moment (election in progress or no quorum); retry"),
    }
}

/// Names the leader in a reply's or refusal's `x-drover-leader` metadata, so the client's next call goes there.
pub fn name_leader(metadata: &mut tonic::metadata::MetadataMap, addr: &str) {
    if let Ok(value) = addr.parse() {
        metadata.insert(LEADER_HINT_KEY, value);
    }
}

/// A write Raft did not take: lost leadership sends the caller to the leader; a stopped replica sends it elsewhere.
pub fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Status {
    if let Some(f) = e.forward_to_leader() {
        return not_leader(f.leader_node.as_ref().map(|n| n.addr.as_str()));
    }
    match e {
        RaftError::Fatal(f) => Status::unavailable(format!("this controller replica has stopped: {f}")),
        RaftError::APIError(api) => Status::failed_precondition(api.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_its_type_in_the_status_details() {
        let error = CommandError::PermissionDenied { id: 7, owner: 1000, requester: 1001 };
        let status = command_error_status(&error);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.message(), error.to_string());
        assert_eq!(drover_proto::command_error_of(&status), Some(error));
    }

    #[test]
    fn a_status_without_details_has_no_command_error() {
        assert_eq!(drover_proto::command_error_of(&not_leader(Some("127.0.0.1:1"))), None);
        assert_eq!(drover_proto::command_error_of(&Status::internal("x")), None);
    }
}

//! Drover's wire contract, generated from `proto/drover.proto`.
#![allow(clippy::all)]

pub mod v1 {
    tonic::include_proto!("drover.v1");
}

/// The metadata key a follower uses to name the leader when it cannot forward.
pub const LEADER_HINT_KEY: &str = "x-drover-leader";

pub mod backup;
pub mod wire;

/// This build as `drover cluster version` reports it: the workspace version, the highest feature level it
/// understands (`drover_state::feature`) and the data format it writes.
pub fn this_build() -> v1::SoftwareVersion {
    v1::SoftwareVersion {
        binary_version: env!("CARGO_PKG_VERSION").to_string(),
        feature_level: drover_state::feature::LEVEL,
        state_format_version: drover_state::FORMAT_VERSION,
    }
}

/// Tags the details of a status that carries a refused command, so other details are never misread as one.
const COMMAND_ERROR_TAG: &[u8] = b"drover.CommandError/json:";

/// The details of a status for a command `apply` refused: the typed error, so a client matches on its type.
pub fn command_error_details(e: &drover_state::CommandError) -> Vec<u8> {
    let mut details = COMMAND_ERROR_TAG.to_vec();
    details.extend(serde_json::to_vec(e).expect("a CommandError always serializes"));
    details
}

/// The typed error a status carries, if a controller refused the command (`None` for transport errors, lost
/// leadership, or a controller older than the typed details).
pub fn command_error_of(status: &tonic::Status) -> Option<drover_state::CommandError> {
    command_error_from_details(status.details())
}

/// The typed error in a per-job outcome's details (see [`command_error_details`]).
pub fn command_error_from_details(details: &[u8]) -> Option<drover_state::CommandError> {
    serde_json::from_slice(details.strip_prefix(COMMAND_ERROR_TAG)?).ok()
}

//! Drover's wire contract, generated from `proto/drover.proto`.
#![allow(clippy::all)]

pub mod v1 {
    tonic::include_proto!("drover.v1");
}

/// The metadata key a follower uses to name the leader when it cannot forward.
pub const LEADER_HINT_KEY: &str = "x-drover-leader";

pub mod wire;

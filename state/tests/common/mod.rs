//! What the `apply` stories share: alice, a timestamped request, a 4-GPU node and alice's training job.
#![allow(dead_code)] // each test binary uses its own subset

use drover_state::{Command, GpuInfo, JobSpec, NodeInfo, Request};

pub const ALICE: u32 = 1001;

/// `command` as the leader stamps it at `time_ms`.
pub fn at(time_ms: u64, command: Command) -> Request {
    Request { time_ms, command }
}

/// A node with 64 CPUs and 4 GPUs (indices 0-3).
pub fn gpu_node(name: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        cpus: 64,
        gpus: (0..4).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
        ..NodeInfo::default()
    }
}

/// Alice's job: `nodes` nodes, one task and `gpus_per_node` GPUs on each.
pub fn alice_job(nodes: u32, gpus_per_node: u32) -> JobSpec {
    JobSpec {
        name: "train".into(),
        user: "alice".into(),
        uid: ALICE,
        gid: ALICE,
        script: "#!/bin/sh\n".into(),
        min_nodes: nodes,
        max_nodes: nodes,
        cpus_per_task: 1,
        ntasks_per_node: Some(1),
        gpus_per_node,
        submit_dir: "/home/alice".into(),
        ..JobSpec::default()
    }
}

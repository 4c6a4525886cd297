//! Quality of service: a priority factor and limits per user and per account (`sacctmgr add qos`).

use serde::{Deserialize, Serialize};

/// The QOS a job gets without `--qos`; it always exists.
pub const DEFAULT_QOS: &str = "normal";
/// Most QOS a cluster holds.
pub const MAX_QOS: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Qos {
    pub name: String,
    /// Feeds the QOS priority factor (normalized by the largest QOS priority).
    pub priority: u32,
    /// `MaxJobsPerUser`, `MaxTRESPerUser=gres/gpu=N`, and the same per account. `None` = no limit.
    pub max_jobs_per_user: Option<u32>,
    pub max_gpus_per_user: Option<u32>,
    pub max_jobs_per_account: Option<u32>,
    pub max_gpus_per_account: Option<u32>,
    /// `MaxWall`: the longest time limit a job of this QOS may ask for.
    pub max_wall_s: Option<u64>,
    pub description: String,
    /// Slurm's `Preempt=`: QOS whose requeue-able running jobs this QOS's jobs may preempt
    /// (`PreemptMode=REQUEUE`: they are warned, stopped and requeued, and resume from their checkpoints).
    pub preempt: Vec<String>,
    /// Slurm's `PreemptExemptTime`: a job of this QOS that started less than this long ago is not preempted.
    pub preempt_exempt_time_s: Option<u64>,
    /// The progress timeout of this QOS's jobs that set none (`--progress-timeout`), in seconds.
    pub progress_timeout_s: Option<u64>,
}

impl Qos {
    pub fn normal() -> Qos {
        Qos { name: DEFAULT_QOS.to_string(), ..Qos::default() }
    }
}

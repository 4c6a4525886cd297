//! Slurm's multifactor priority: a weighted sum of factors in [0, 1], with the breakdown kept for `sprio`.

use serde::{Deserialize, Serialize};

use crate::model::{PendingJob, PriorityWeights};

/// One job's factors (each in [0, 1]) and the weighted total, as `sprio -l` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorityBreakdown {
    pub age: f64,
    pub fairshare: f64,
    pub job_size: f64,
    pub partition: f64,
    pub qos: f64,
    /// Sum of weight × factor, rounded down like Slurm's integer priority.
    pub priority: u64,
}

/// Cluster-wide normalizers a factor needs, computed once per pass.
#[derive(Clone, Copy, Debug)]
pub struct PriorityContext {
    pub now_s: u64,
    pub total_gpus: u64,
    pub max_partition_tier: u32,
    pub max_qos_priority: u32,
}

impl PriorityBreakdown {
    /// `fairshare` is the account's factor from the fair-share tree; `partition_tier` and `qos_priority` come
    /// from the job's partition and QOS.
    pub fn compute(
        job: &PendingJob,
        weights: &PriorityWeights,
        ctx: &PriorityContext,
        fairshare: f64,
        partition_tier: u32,
        qos_priority: u32,
    ) -> Self {
        let age_s = ctx.now_s.saturating_sub(job.submit_s);
        let age =
            if weights.max_age_s == 0 { 1.0 } else { (age_s.min(weights.max_age_s)) as f64 / weights.max_age_s as f64 };
        let size = if ctx.total_gpus == 0 {
            0.0
        } else {
            (job.total_gpus().min(ctx.total_gpus)) as f64 / ctx.total_gpus as f64
        };
        let job_size = if weights.favor_small { 1.0 - size } else { size };
        let partition = if ctx.max_partition_tier == 0 {
            0.0
        } else {
            f64::from(partition_tier) / f64::from(ctx.max_partition_tier)
        };
        let qos =
            if ctx.max_qos_priority == 0 { 0.0 } else { f64::from(qos_priority) / f64::from(ctx.max_qos_priority) };
        let fairshare = fairshare.clamp(0.0, 1.0);
        let total = f64::from(weights.age) * age
            + f64::from(weights.fairshare) * fairshare
            + f64::from(weights.job_size) * job_size
            + f64::from(weights.partition) * partition
            + f64::from(weights.qos) * qos;
        Self { age, fairshare, job_size, partition, qos, priority: total.floor() as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_are_normalized_and_weighted() {
        let w = PriorityWeights {
            age: 100,
            fairshare: 1000,
            job_size: 10,
            partition: 1,
            qos: 0,
            max_age_s: 1000,
            favor_small: false,
        };
        let ctx = PriorityContext { now_s: 2000, total_gpus: 16, max_partition_tier: 2, max_qos_priority: 0 };
        let job = PendingJob::simple(1, 1500, 1, 8, 60);
        let b = PriorityBreakdown::compute(&job, &w, &ctx, 0.5, 1, 0);
        assert_eq!(b.age, 0.5);
        assert_eq!(b.job_size, 0.5);
        assert_eq!(b.partition, 0.5);
        assert_eq!(b.priority, 50 + 500 + 5);
        // Age saturates at max age.
        let old = PendingJob::simple(2, 0, 1, 8, 60);
        assert_eq!(PriorityBreakdown::compute(&old, &w, &ctx, 0.0, 0, 0).age, 1.0);
    }
}

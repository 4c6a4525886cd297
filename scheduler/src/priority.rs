//! Slurm's multifactor priority: a weighted sum of factors in [0, 1], with the breakdown kept for `sprio`.

use serde::{Deserialize, Serialize};

use crate::fxhash::FxMap;
use crate::model::{PendingJob, PriorityWeights, SHORT_FACTOR_MAX_GPU_S, SHORT_FACTOR_UNIT_GPU_S};

/// One job's factors (each in [0, 1]) and the weighted total, as `sprio -l` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorityBreakdown {
    pub age: f64,
    pub fairshare: f64,
    pub job_size: f64,
    pub partition: f64,
    pub qos: f64,
    /// The short-job factor (see [`PriorityWeights::short`]).
    #[serde(default)]
    pub short: f64,
    /// The job's nice value, already subtracted from `priority`.
    #[serde(default)]
    pub nice: i32,
    /// Sum of weight × factor, rounded down like Slurm's integer priority, minus nice (never below 0); after
    /// `scontrol top` ([`apply_top`]) it is the value the job was given within its user's set.
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

/// What a job's own priority factors depend on, copied out of the [`PendingJob`] (so a pass can recompute a
/// breakdown from a few packed fields instead of re-reading the whole, randomly placed job).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobFactors {
    pub submit_s: u64,
    pub total_gpus: u64,
    pub time_limit_s: u64,
    pub nice: i32,
}

impl JobFactors {
    pub fn of(job: &PendingJob) -> Self {
        Self { submit_s: job.submit_s, total_gpus: job.total_gpus(), time_limit_s: job.time_limit_s, nice: job.nice }
    }
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
        Self::from_factors(&JobFactors::of(job), weights, ctx, fairshare, partition_tier, qos_priority)
    }

    /// [`Self::compute`] from the job's [`JobFactors`]: the same arithmetic, so the same bits.
    #[inline]
    pub fn from_factors(
        job: &JobFactors,
        weights: &PriorityWeights,
        ctx: &PriorityContext,
        fairshare: f64,
        partition_tier: u32,
        qos_priority: u32,
    ) -> Self {
        let age_s = ctx.now_s.saturating_sub(job.submit_s);
        let age =
            if weights.max_age_s == 0 { 1.0 } else { (age_s.min(weights.max_age_s)) as f64 / weights.max_age_s as f64 };
        let size =
            if ctx.total_gpus == 0 { 0.0 } else { (job.total_gpus.min(ctx.total_gpus)) as f64 / ctx.total_gpus as f64 };
        let job_size = if weights.favor_small { 1.0 - size } else { size };
        let partition = if ctx.max_partition_tier == 0 {
            0.0
        } else {
            f64::from(partition_tier) / f64::from(ctx.max_partition_tier)
        };
        let qos =
            if ctx.max_qos_priority == 0 { 0.0 } else { f64::from(qos_priority) / f64::from(ctx.max_qos_priority) };
        let fairshare = fairshare.clamp(0.0, 1.0);
        let short = if weights.short == 0 { 0.0 } else { short_factor_of(job.total_gpus, job.time_limit_s) };
        let total = f64::from(weights.age) * age
            + f64::from(weights.short) * short
            + f64::from(weights.fairshare) * fairshare
            + f64::from(weights.job_size) * job_size
            + f64::from(weights.partition) * partition
            + f64::from(weights.qos) * qos;
        // Every term is >= 0 (or NaN, which both give 0), so truncating rounds down exactly like `floor`, which
        // is a libm call on baseline x86-64 and a pass computes it twice per job.
        let priority = (total as u64).saturating_add_signed(-i64::from(job.nice));
        Self { age, fairshare, job_size, partition, qos, short, nice: job.nice, priority }
    }
}

/// The short-job factor: 1 - ln(1 + a/u) / ln(1 + max/u), clamped to [0, 1], where a is the job's requested
/// GPU-seconds (GPUs × time limit; a GPU-less job counts as one GPU), u = [`SHORT_FACTOR_UNIT_GPU_S`] and
/// max = [`SHORT_FACTOR_MAX_GPU_S`]. Logarithmic, so a 10-minute job is as far ahead of a 100-minute one as that is
/// of a 1,000-minute one.
pub fn short_factor(job: &PendingJob) -> f64 {
    short_factor_of(job.total_gpus(), job.time_limit_s)
}

/// [`short_factor`] of a job asking for `total_gpus` GPUs for `time_limit_s`.
pub fn short_factor_of(total_gpus: u64, time_limit_s: u64) -> f64 {
    let area = total_gpus.max(1).saturating_mul(time_limit_s) as f64;
    let unit = SHORT_FACTOR_UNIT_GPU_S as f64;
    let f = 1.0 - (area / unit).ln_1p() / (SHORT_FACTOR_MAX_GPU_S as f64 / unit).ln_1p();
    f.clamp(0.0, 1.0)
}

/// `scontrol top`: within each user who has topped jobs, permutes that user's priority values so the topped jobs
/// hold the highest ones (higher `top_rank` first) and the user's other jobs keep their relative order with the
/// values left. Each user keeps the same multiset of values, so no one gains against other users; users without a
/// topped job are untouched. `priorities[i]` belongs to `jobs[i]`.
pub fn apply_top(jobs: &[PendingJob], priorities: &mut [u64]) {
    debug_assert_eq!(jobs.len(), priorities.len());
    let mut by_user: FxMap<&str, Vec<usize>> = FxMap::default();
    for j in jobs.iter().filter(|j| j.top_rank != 0) {
        by_user.entry(j.user.as_str()).or_default();
    }
    if by_user.is_empty() {
        return;
    }
    for (i, j) in jobs.iter().enumerate() {
        if let Some(v) = by_user.get_mut(j.user.as_str()) {
            v.push(i);
        }
    }
    // Users are disjoint, so the order the groups are visited in does not matter.
    for group in by_user.values_mut() {
        let mut values: Vec<u64> = group.iter().map(|&i| priorities[i]).collect();
        values.sort_unstable_by(|a, b| b.cmp(a));
        // Topped first by rank; then (rank 0) everyone in the order the pass would use without top.
        group.sort_unstable_by(|&a, &b| {
            let (ja, jb) = (&jobs[a], &jobs[b]);
            jb.top_rank
                .cmp(&ja.top_rank)
                .then(priorities[b].cmp(&priorities[a]))
                .then(ja.submit_s.cmp(&jb.submit_s))
                .then(ja.id.cmp(&jb.id))
                .then(a.cmp(&b))
        });
        for (&i, v) in group.iter().zip(values) {
            priorities[i] = v;
        }
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
            short: 0,
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

    #[test]
    fn nice_is_subtracted_and_saturates() {
        let w = PriorityWeights { age: 0, fairshare: 1000, job_size: 0, partition: 0, qos: 0, ..Default::default() };
        let ctx = PriorityContext { now_s: 0, total_gpus: 8, max_partition_tier: 0, max_qos_priority: 0 };
        let mut job = PendingJob::simple(1, 0, 1, 1, 60);
        assert_eq!(PriorityBreakdown::compute(&job, &w, &ctx, 1.0, 0, 0).priority, 1000);
        job.nice = 300;
        let b = PriorityBreakdown::compute(&job, &w, &ctx, 1.0, 0, 0);
        assert_eq!((b.priority, b.nice), (700, 300));
        job.nice = 5000;
        assert_eq!(PriorityBreakdown::compute(&job, &w, &ctx, 1.0, 0, 0).priority, 0);
        job.nice = -50;
        assert_eq!(PriorityBreakdown::compute(&job, &w, &ctx, 1.0, 0, 0).priority, 1050);
    }

    #[test]
    fn top_permutes_within_the_user() {
        let mut jobs: Vec<PendingJob> = (1..=5).map(|id| PendingJob::simple(id, id, 1, 1, 60)).collect();
        jobs[4].user = "other".into();
        jobs[2].top_rank = 1; // alice's lowest job
        let mut p = vec![50, 40, 10, 30, 45];
        apply_top(&jobs, &mut p);
        // The topped job takes the user's best value; the rest keep their order (50 > 40 > 30) below it.
        assert_eq!(p, vec![40, 30, 50, 10, 45]);
        // Two topped jobs: the higher rank first.
        jobs[3].top_rank = 2;
        let mut p = vec![50, 40, 10, 30, 45];
        apply_top(&jobs, &mut p);
        assert_eq!(p, vec![30, 10, 40, 50, 45]);
        // Nobody topped: unchanged.
        let plain: Vec<PendingJob> = (1..=3).map(|id| PendingJob::simple(id, 0, 1, 1, 60)).collect();
        let mut p = vec![1, 2, 3];
        apply_top(&plain, &mut p);
        assert_eq!(p, vec![1, 2, 3]);
    }

    #[test]
    fn short_factor_falls_with_requested_gpu_seconds() {
        let f = |gpus: u32, limit_s: u64| short_factor(&PendingJob::simple(1, 0, 1, gpus, limit_s));
        assert_eq!(f(1, 1), 1.0 - (1.0f64 / 60.0).ln_1p() / ((SHORT_FACTOR_MAX_GPU_S / 60) as f64).ln_1p());
        assert!(f(1, 600) > f(1, 3600) && f(1, 3600) > f(1, 36_000) && f(1, 36_000) > f(8, 36_000));
        // Same GPU-seconds, same factor; a GPU-less job counts as one GPU.
        assert_eq!(f(2, 1800), f(1, 3600));
        assert_eq!(f(0, 3600), f(1, 3600));
        // Log scale: each tenfold step costs the same.
        let step = |a: u64| f(1, a) - f(1, 10 * a);
        assert!((step(600) - step(6000)).abs() < 0.01);
        assert_eq!(f(64, 7 * 24 * 3600), 0.0);
        assert_eq!(f(64, 30 * 24 * 3600), 0.0);
        // Off unless weighted.
        let ctx = PriorityContext { now_s: 0, total_gpus: 8, max_partition_tier: 0, max_qos_priority: 0 };
        let plain = PriorityBreakdown::compute(
            &PendingJob::simple(1, 0, 1, 1, 60),
            &PriorityWeights::default(),
            &ctx,
            0.0,
            0,
            0,
        );
        assert_eq!(plain.short, 0.0);
    }

    #[test]
    fn short_first_orders_short_before_long_of_the_same_age() {
        let w = PriorityWeights::short_first();
        let ctx = PriorityContext { now_s: 1000, total_gpus: 256, max_partition_tier: 1, max_qos_priority: 0 };
        let p = |gpus: u32, limit_s: u64| {
            PriorityBreakdown::compute(&PendingJob::simple(1, 0, 1, gpus, limit_s), &w, &ctx, 0.5, 1, 0).priority
        };
        assert!(p(1, 600) > p(1, 6 * 3600));
        assert!(p(1, 6 * 3600) > p(8, 6 * 3600));
        assert!(p(8, 600) > p(8, 7 * 24 * 3600));
    }

    #[test]
    fn short_first_ages_a_long_job_ahead_of_any_newer_job_after_the_bound() {
        // The bound: short-job weight / age per second = 200 / (36,500 / 365 days) = 2 days.
        let w = PriorityWeights::short_first();
        let per_s = f64::from(w.age) / w.max_age_s as f64;
        let bound_s = (f64::from(w.short) / per_s).ceil() as u64;
        assert_eq!(bound_s, 2 * 24 * 3600);
        let now_s = 40 * 24 * 3600;
        let ctx = PriorityContext { now_s, total_gpus: 256, max_partition_tier: 1, max_qos_priority: 0 };
        let prio = |j: &PendingJob| PriorityBreakdown::compute(j, &w, &ctx, 0.5, 1, 0).priority;
        // The largest request the factor knows (64 GPUs for a week, factor 0), submitted at 0...
        let big = PendingJob::simple(1, 0, 8, 8, 7 * 24 * 3600);
        // ...against the smallest (factor ~1) submitted any time after the bound: the old job is ahead.
        for submit_s in [bound_s + 1, bound_s + 3600, now_s / 2, now_s] {
            let tiny = PendingJob::simple(2, submit_s, 1, 1, 1);
            assert!(prio(&big) > prio(&tiny), "submitted at {submit_s}");
        }
        // Within the bound the short job may go first (that is the point of the factor).
        let early = PendingJob::simple(3, bound_s / 2, 1, 1, 1);
        assert!(prio(&early) > prio(&big));
        // Age has not saturated even after 40 days (a saturated age would tie old jobs).
        assert!(PriorityBreakdown::compute(&big, &w, &ctx, 0.5, 1, 0).age < 1.0);
    }
}

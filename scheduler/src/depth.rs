//! The queue depth of a pass: at most `depth` pending jobs, the highest in priority, enter the pass's view (Slurm's
//! `bf_max_job_test` and `default_queue_depth` bound its passes the same way). The leader copies pending jobs
//! into the view one at a time and offers each here; a million pending jobs then cost the pass the memory and the
//! time of `depth` of them. The rest keep their place and their pending reason until they rank within the depth.
//!
//! The rank is the priority a pass would give the job ([`PriorityBreakdown::compute`], from the same fair-share
//! tree, partition tiers and QOS priorities), then the pass's own tie-breaks (older first, then lower id). A job
//! an owner topped (`scontrol top`) always ranks first: the pass gives it its owner's highest priority values.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use crate::ScheduleError;
use crate::fairshare::FairShareTree;
use crate::model::{ClusterView, JobId, PendingJob, SchedulerConfig};
use crate::priority::{PriorityBreakdown, PriorityContext};

/// The `depth` highest-ranked of the pending jobs offered so far.
pub struct TopPending {
    depth: usize,
    config: SchedulerConfig,
    ctx: PriorityContext,
    fairshare: HashMap<String, f64>,
    partition_tiers: HashMap<String, u32>,
    qos_priorities: HashMap<String, u32>,
    /// A min-heap on rank: its top is the job the next better offer displaces.
    kept: BinaryHeap<Reverse<Ranked>>,
}

/// A job and the key it ranks by.
struct Ranked {
    /// (topped, priority, earlier submission, lower id): larger ranks higher.
    key: (bool, u64, Reverse<u64>, Reverse<JobId>),
    job: PendingJob,
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

impl TopPending {
    /// `view` holds everything but the pending jobs: its nodes, partitions, QOS and the fair-share tree of its
    /// accounts decide the ranks. `depth` is at least 1.
    pub fn new(view: &ClusterView, config: &SchedulerConfig, depth: usize) -> Result<TopPending, ScheduleError> {
        let tree = FairShareTree::new(&view.accounts)?;
        let fairshare = view.accounts.iter().map(|a| (a.name.clone(), tree.factor(&a.name))).collect();
        let ctx = PriorityContext {
            now_s: view.now_s,
            total_gpus: view.nodes.iter().map(|n| u64::from(n.gpus_total)).sum(),
            max_partition_tier: view.partitions.iter().map(|p| p.priority_tier).max().unwrap_or(0),
            max_qos_priority: view.qos.iter().map(|q| q.priority).max().unwrap_or(0),
        };
        Ok(TopPending {
            depth: depth.max(1),
            config: config.clone(),
            ctx,
            fairshare,
            partition_tiers: view.partitions.iter().map(|p| (p.name.clone(), p.priority_tier)).collect(),
            qos_priorities: view.qos.iter().map(|q| (q.name.clone(), q.priority)).collect(),
            kept: BinaryHeap::new(),
        })
    }

    /// Keeps `job` if it ranks among the `depth` best offered so far (dropping the lowest kept one if full).
    pub fn offer(&mut self, job: PendingJob) {
        let key = self.key(&job);
        if self.kept.len() >= self.depth {
            let lowest = &self.kept.peek().expect("depth is at least 1").0;
            if key <= lowest.key {
                return;
            }
            self.kept.pop();
        }
        self.kept.push(Reverse(Ranked { key, job }));
    }

    fn key(&self, job: &PendingJob) -> (bool, u64, Reverse<u64>, Reverse<JobId>) {
        let fairshare = self.fairshare.get(job.account.as_str()).copied().unwrap_or(0.0);
        let tier = self.partition_tiers.get(job.partition.as_str()).copied().unwrap_or(0);
        let qos = self.qos_priorities.get(job.qos.as_str()).copied().unwrap_or(0);
        let b = PriorityBreakdown::compute(job, &self.config.weights, &self.ctx, fairshare, tier, qos);
        (job.top_rank != 0, b.priority, Reverse(job.submit_s), Reverse(job.id))
    }

    /// How many jobs are kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// The kept jobs, in id order (the order the view lists pending jobs in).
    pub fn into_jobs(self) -> Vec<PendingJob> {
        // Into the heap's own buffer where the layouts allow (std collects in place): the kept jobs are most of the
        // view's memory, and a second copy of them would double the pass's peak.
        let mut jobs: Vec<PendingJob> = self.kept.into_vec().into_iter().map(|Reverse(r)| r.job).collect();
        jobs.sort_unstable_by_key(|j| j.id);
        jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Account, Node, Partition, PartitionState, PreemptMode, Topology};

    fn view(accounts: Vec<Account>) -> ClusterView {
        ClusterView {
            now_s: 10_000,
            nodes: vec![Node {
                name: "n1".into(),
                gpus_total: 8,
                free_gpus: (0..8).collect(),
                cpus_total: 64,
                cpus_free: 64,
                mem_total_mb: 0,
                mem_free_mb: 0,
                partitions: vec!["gpu".into()],
                features: Vec::new(),
                gpu_type: None,
                topology: Topology::default(),
                schedulable: true,
                spare: false,
            }],
            partitions: vec![Partition {
                name: "gpu".into(),
                max_time_s: None,
                priority_tier: 1,
                state: PartitionState::Up,
                preempt_mode: PreemptMode::Off,
            }],
            accounts,
            ..ClusterView::default()
        }
    }

    fn job(id: JobId, submit_s: u64, account: &str) -> PendingJob {
        PendingJob { account: account.into(), partition: "gpu".into(), ..PendingJob::simple(id, submit_s, 1, 1, 60) }
    }

    /// Of many offers, the `depth` a pass would rank first are kept, listed by id: older first when priorities
    /// tie on everything but age, a topped job whatever its rank, and an account's fair share counts.
    #[test]
    fn the_depth_keeps_the_jobs_a_pass_would_rank_first() {
        let mut config = SchedulerConfig::default();
        config.weights.max_age_s = 10_000;
        let mut top = TopPending::new(&view(Vec::new()), &config, 3).unwrap();
        for id in 1..=100 {
            // Job 1 is the newest, job 100 the oldest.
            top.offer(job(id, 10_000 - id * 10, "root"));
        }
        let ids: Vec<JobId> = top.into_jobs().iter().map(|j| j.id).collect();
        assert_eq!(ids, [98, 99, 100], "the three oldest");

        let mut top = TopPending::new(&view(Vec::new()), &config, 3).unwrap();
        for id in 1..=100 {
            let mut j = job(id, 10_000 - id * 10, "root");
            if id == 5 {
                j.top_rank = 1;
            }
            top.offer(j);
        }
        let ids: Vec<JobId> = top.into_jobs().iter().map(|j| j.id).collect();
        assert_eq!(ids, [5, 99, 100], "a topped job is kept");

        // Two accounts with equal shares, one of which used the cluster: the other's jobs rank first.
        let account = |name: &str, parent: Option<&str>, usage: f64| Account {
            name: name.into(),
            parent: parent.map(Into::into),
            shares: 1,
            usage_gpu_s: usage,
        };
        let accounts =
            vec![account("root", None, 0.0), account("busy", Some("root"), 1.0e9), account("idle", Some("root"), 0.0)];
        let mut top = TopPending::new(&view(accounts), &SchedulerConfig::default(), 2).unwrap();
        for id in 1..=10 {
            top.offer(job(id, 9_000, if id <= 8 { "busy" } else { "idle" }));
        }
        let ids: Vec<JobId> = top.into_jobs().iter().map(|j| j.id).collect();
        assert_eq!(ids, [9, 10]);
    }
}

//! Goodput through `State::apply` alone: the cluster's and the accounts' sums move as incarnations end (node
//! failure after a checkpoint, preemption, `scontrol requeue`, clean runs), agree with the per-job figures
//! `sacct` computes from the archived records, and survive a restore.

use drover_state::goodput::{self, GoodputTotals};
use drover_state::{
    AccountUpdate, AdminOp, Allocation, Change, ClusterConfig, Command, Job, JobEnd, JobSpec, JobState, NodeAllocation,
    Reply, Request, State,
};

mod common;

use common::{ALICE, alice_job, gpu_node};

const S: u64 = 1_000;

/// Applies `command` at `time_s`, keeping the jobs it archived.
struct Cluster {
    state: State,
    archived: Vec<Job>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster::with(ClusterConfig::default())
    }

    fn with(config: ClusterConfig) -> Cluster {
        let mut c = Cluster { state: State::default(), archived: Vec::new() };
        c.apply(0, Command::InitCluster { config });
        for name in ["n1", "n2", "n3", "n4"] {
            c.apply(1, Command::RegisterNode { info: gpu_node(name), running: Vec::new() });
        }
        for name in ["physics", "bio"] {
            let op = AdminOp::AddAccount(AccountUpdate { name: name.into(), ..AccountUpdate::default() });
            c.apply(2, Command::Admin { op, by_uid: 0 });
        }
        c
    }

    fn apply(&mut self, time_s: u64, command: Command) -> Vec<Change> {
        let applied = self.state.apply(&Request { time_ms: time_s * S, command });
        applied.response.clone().unwrap_or_else(|e| panic!("{e}"));
        self.state.check_invariants();
        for change in &applied.changes {
            if let Change::ArchiveJob(job) = change {
                self.archived.push((**job).clone());
            }
        }
        applied.changes
    }

    /// A job of `gpus` GPUs on each of `nodes` nodes, charging `account`.
    fn submit(&mut self, nodes: u32, gpus: u32, account: &str) -> u64 {
        let spec = JobSpec { account: Some(account.into()), ..alice_job(nodes, gpus) };
        let applied = self
            .state
            .apply(&Request { time_ms: 3 * S, command: Command::SubmitJob { spec: Box::new(spec), request_id: None } });
        match applied.response {
            Ok(Reply::Submitted { job_id, .. }) => job_id,
            other => panic!("{other:?}"),
        }
    }

    /// Starts job `id` on `nodes`, with its GPUs 0.. of each.
    fn start(&mut self, id: u64, nodes: &[&str], time_s: u64) {
        let gpus = self.state.job(id).unwrap().spec.gpus_per_node;
        let shares = nodes
            .iter()
            .map(|n| NodeAllocation { node: n.to_string(), gpus: (0..gpus).collect(), cpus: 1, tasks: 1, mem_mb: 0 })
            .collect();
        let plan = Command::ApplyPlan { allocations: vec![Allocation { job_id: id, nodes: shares }], reasons: vec![] };
        self.apply(time_s, plan);
        assert_eq!(self.state.job(id).unwrap().state, JobState::Running);
    }

    fn checkpoint(&mut self, id: u64, time_s: u64) {
        let incarnation = self.state.job(id).unwrap().incarnation;
        let path = format!("/ckpt/{id}/{time_s}");
        self.apply(time_s, Command::RecordCheckpoint { job_id: id, incarnation, path, step: None, by_uid: ALICE });
    }

    fn end(&mut self, id: u64, time_s: u64) {
        let incarnation = self.state.job(id).unwrap().incarnation;
        self.apply(time_s, Command::JobEnded { job_id: id, incarnation, end: JobEnd::default() });
    }
}

fn account(state: &State, name: &str) -> GoodputTotals {
    *state.account_goodput().find(|(n, _)| *n == name).unwrap().1
}

#[test]
fn the_cluster_and_its_accounts_count_gpu_time_lost_to_failures_and_preemption_as_incarnations_end() {
    let mut c = Cluster::new();
    assert_eq!(c.state.goodput_since_ms(), Some(0), "counted since the cluster's initialization");
    // physics: 2 nodes × 4 GPUs. It checkpoints 100 s into its run and n1 dies 50 s later: 8 × 50 GPU-s lost.
    // It waits 30 s, restarts on n2 and n3 and completes.
    let big = c.submit(2, 4, "physics");
    c.start(big, &["n1", "n2"], 100);
    c.checkpoint(big, 150);
    c.checkpoint(big, 200);
    let changes = c.apply(250, Command::NodeDown { name: "n1".into(), reason: "Not responding".into(), epoch: None });
    assert_eq!(changes.iter().filter(|ch| matches!(ch, Change::Meta(_))).count(), 1, "the sums are written once");
    let totals = *c.state.goodput_totals();
    assert_eq!((totals.allocated_gpu_ms, totals.lost_to_failures_gpu_ms), (8 * 150 * S, 8 * 50 * S));
    assert_eq!((totals.ended_incarnations, totals.failed_incarnations), (1, 1));
    let record = &c.state.job(big).unwrap().history[0];
    assert_eq!((record.gpus, record.last_checkpoint_ms), (8, Some(200 * S)));
    // n2's agent confirms the old tasks are gone (its GPUs stay held until then).
    c.apply(260, Command::ReleaseLingering { node: "n2".into(), keys: vec![(big, 0)], usage: vec![] });
    c.start(big, &["n2", "n3"], 280);
    assert_eq!(c.state.goodput_totals().down_after_failures_ms, 30 * S, "down from the failure to the restart");
    c.end(big, 400);

    // bio: 2 GPUs, checkpoints at 290 s, is preempted at 300 s and ends 10 s later: 2 × 20 GPU-s lost to
    // preemption. It comes back and completes.
    let small = c.submit(1, 2, "bio");
    c.start(small, &["n4"], 260);
    c.checkpoint(small, 290);
    c.apply(300, Command::PreemptJobs { victims: vec![small], for_job: 99 });
    c.end(small, 310);
    c.start(small, &["n4"], 320);
    c.end(small, 420);

    // bio again: requeued by its owner (no loss, no failure), then a clean run.
    let polite = c.submit(1, 1, "bio");
    c.start(polite, &["n4"], 430);
    c.apply(440, Command::RequeueJobs { ids: vec![polite], by_uid: ALICE, hold: false });
    c.end(polite, 450);
    c.start(polite, &["n4"], 460);
    c.end(polite, 560);

    let totals = *c.state.goodput_totals();
    let expected = GoodputTotals {
        allocated_gpu_ms: (8 * 150 + 8 * 120 + 2 * 50 + 2 * 100 + 20 + 100) * S,
        lost_to_failures_gpu_ms: 8 * 50 * S,
        lost_to_preemption_gpu_ms: 2 * 20 * S,
        ended_incarnations: 6,
        failed_incarnations: 1,
        preempted_incarnations: 1,
        down_after_failures_ms: 30 * S,
    };
    assert_eq!(totals, expected);
    let ratio = totals.effective_ratio().unwrap();
    assert!((ratio - 2140.0 / 2580.0).abs() < 1e-12, "{ratio}");

    // Per account, the same sums split.
    let physics = account(&c.state, "physics");
    assert_eq!((physics.allocated_gpu_ms, physics.lost_gpu_ms(), physics.failed_incarnations), (2160 * S, 400 * S, 1));
    let bio = account(&c.state, "bio");
    assert_eq!((bio.lost_to_preemption_gpu_ms, bio.preempted_incarnations, bio.ended_incarnations), (40 * S, 1, 4));

    // The per-job figures (what sacct shows, from the archived records) add up to the cluster's.
    assert_eq!(c.archived.len(), 3);
    let mut summed = GoodputTotals::default();
    for job in &c.archived {
        summed.add(&goodput::of_job(job, 0));
    }
    assert_eq!(summed, totals);
    let big_job = c.archived.iter().find(|j| j.id == big).unwrap();
    assert_eq!(goodput::of_job(big_job, 0).lost_to_failures_gpu_ms, 8 * 50 * S);

    // The sums are part of the persisted state.
    let restored = State::restore(c.state.records());
    assert_eq!(restored.goodput_totals(), c.state.goodput_totals());
    assert_eq!(account(&restored, "bio"), bio);
}

#[test]
fn a_failure_without_any_checkpoint_loses_the_whole_incarnation_and_a_clean_run_loses_nothing() {
    let mut c = Cluster::new();
    let id = c.submit(1, 4, "physics");
    c.start(id, &["n1"], 10);
    c.apply(70, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None });
    let totals = *c.state.goodput_totals();
    assert_eq!((totals.allocated_gpu_ms, totals.lost_to_failures_gpu_ms), (4 * 60 * S, 4 * 60 * S));
    assert_eq!(totals.effective_ratio(), Some(0.0));

    let mut clean = Cluster::new();
    let id = clean.submit(1, 4, "physics");
    clean.start(id, &["n1"], 10);
    clean.checkpoint(id, 20);
    clean.end(id, 70);
    assert_eq!(clean.state.goodput_totals().effective_ratio(), Some(1.0));
    assert_eq!(clean.state.goodput_totals().lost_gpu_ms(), 0);
}

#[test]
fn a_job_over_the_requeue_limit_counts_its_last_incarnation_once() {
    let mut c = Cluster::with(ClusterConfig { max_batch_requeue: 0, ..ClusterConfig::default() });
    let id = c.submit(1, 2, "physics");
    c.start(id, &["n1"], 10);
    c.apply(20, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None });
    assert!(c.state.job(id).is_none(), "archived as NODE_FAIL");
    let totals = *c.state.goodput_totals();
    assert_eq!((totals.allocated_gpu_ms, totals.ended_incarnations, totals.failed_incarnations), (20 * S, 1, 1));
    assert_eq!(goodput::of_job(&c.archived[0], 0), totals);
}

#[test]
fn records_written_before_goodput_was_kept_still_decode() {
    // An incarnation record and a meta record as format 3 wrote them, without the new fields.
    let record: drover_state::IncarnationRecord = serde_json::from_str(
        r#"{"incarnation":0,"start_ms":1,"end_ms":2,"nodes":"n1","state":"NodeFail","reason":"x","resumed_from":null}"#,
    )
    .unwrap();
    assert_eq!((record.gpus, record.last_checkpoint_ms), (0, None));
    let meta: drover_state::Meta =
        serde_json::from_str(r#"{"format_version":3,"next_job_id":7,"config":null,"next_dedup_seq":0}"#).unwrap();
    assert_eq!((meta.goodput, meta.goodput_since_ms), (GoodputTotals::default(), None));
    let job: Job = serde_json::from_str(&serde_json::to_string(&Job::default()).unwrap()).unwrap();
    assert!(job.dropped_goodput.is_none());
}

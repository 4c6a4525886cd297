//! Stories for what Drover does beyond requeue: a job that stops making progress is requeued as hung; GPU errors
//! take the remedy their XID names (one GPU drained, not the node); failures are charged to nodes and the worst are
//! quarantined; a requeued job avoids the nodes it failed on; a checkpoint that proves bad gives way to the one
//! before. Through `State::apply` alone, on the log's time.

use drover_state::node::{GpuFault, XidAction};
use drover_state::{
    Allocation, ClusterConfig, Command, CommandError, JobEnd, JobSpec, JobState, NodeAllocation, Reply, State,
};

mod common;

use common::{ALICE, alice_job, at, gpu_node};

const MIN: u64 = 60_000;

fn cluster() -> State {
    let mut state = State::default();
    let mut config = ClusterConfig::default();
    config.resilience.early_failure_s = 300;
    config.resilience.checkpoint_fallback_s = 600;
    state.apply(&at(0, Command::InitCluster { config }));
    for name in ["n1", "n2", "n3"] {
        state.apply(&at(1, Command::RegisterNode { info: gpu_node(name), running: Vec::new() })).response.unwrap();
    }
    state
}

fn submit(state: &mut State, spec: JobSpec) -> u64 {
    match state.apply(&at(10, Command::SubmitJob { spec: Box::new(spec), request_id: None })).response {
        Ok(Reply::Submitted { job_id, .. }) => job_id,
        other => panic!("{other:?}"),
    }
}

fn watched(minutes: u32) -> JobSpec {
    JobSpec { progress_timeout_s: Some(minutes * 60), ..alice_job(1, 2) }
}

/// Starts job `id` on `node` with `gpus`.
fn start_on(state: &mut State, id: u64, node: &str, gpus: &[u32], time_ms: u64) {
    let share = NodeAllocation { node: node.into(), gpus: gpus.to_vec(), cpus: 1, tasks: 1, mem_mb: 0 };
    let plan = Command::ApplyPlan { allocations: vec![Allocation { job_id: id, nodes: vec![share] }], reasons: vec![] };
    match state.apply(&at(time_ms, plan)).response {
        Ok(Reply::Planned { started, refused }) => assert_eq!(started, vec![id], "refused: {refused:?}"),
        other => panic!("{other:?}"),
    }
    state.check_invariants();
}

fn incarnation(state: &State, id: u64) -> u64 {
    state.job(id).unwrap().incarnation
}

fn end(state: &mut State, id: u64, end: JobEnd, time_ms: u64) {
    let incarnation = incarnation(state, id);
    state.apply(&at(time_ms, Command::JobEnded { job_id: id, incarnation, end })).response.unwrap();
    state.check_invariants();
}

fn progress(state: &mut State, id: u64, step: u64, time_ms: u64) -> Result<Reply, CommandError> {
    let incarnation = incarnation(state, id);
    let command = Command::RecordProgress { job_id: id, incarnation, step: Some(step), by_uid: ALICE };
    state.apply(&at(time_ms, command)).response
}

fn hung(state: &mut State, id: u64, time_ms: u64) -> Result<Reply, CommandError> {
    let incarnation = incarnation(state, id);
    state.apply(&at(time_ms, Command::JobHung { job_id: id, incarnation })).response
}

fn checkpoint(state: &mut State, id: u64, path: &str, time_ms: u64) {
    let incarnation = incarnation(state, id);
    let command = Command::RecordCheckpoint { job_id: id, incarnation, path: path.into(), step: None, by_uid: ALICE };
    state.apply(&at(time_ms, command)).response.unwrap();
}

fn fault(state: &mut State, node: &str, gpu: u32, xid: u64, action: XidAction, time_ms: u64) {
    let fault = GpuFault { gpu, xid: Some(xid), action, reason: format!("xid {xid}") };
    let command = Command::GpuFault { node: node.into(), fault };
    state.apply(&at(time_ms, command)).response.unwrap();
    state.check_invariants();
}

#[test]
fn a_job_without_progress_for_its_timeout_is_requeued_as_hung_and_its_nodes_are_charged() {
    let mut state = cluster();
    let id = submit(&mut state, watched(10));
    start_on(&mut state, id, "n1", &[0, 1], 20);
    assert_eq!(state.job(id).unwrap().hung_at_ms(), Some(20 + 10 * MIN), "the deadline runs from the start");

    progress(&mut state, id, 100, 5 * MIN).unwrap();
    assert_eq!(state.job(id).unwrap().hung_at_ms(), Some(15 * MIN), "progress moves the deadline");
    // A decision taken on an older view (before the report committed) is refused on the log's time.
    let early = hung(&mut state, id, 12 * MIN).unwrap_err();
    assert!(early.to_string().contains("reported progress"), "{early}");
    assert_eq!(state.job(id).unwrap().state, JobState::Running);

    hung(&mut state, id, 15 * MIN).unwrap();
    let job = state.job(id).unwrap();
    let order = job.requeue.as_deref().expect("told to stop and come back");
    assert!(order.reason.starts_with("Hung: no progress for 600 s, last step 100"), "{}", order.reason);
    assert_eq!(job.state, JobState::Completing, "its warning signal, SIGTERM, KillWait, SIGKILL, then back");
    // The same decision from a new leader after a failover changes nothing: the job is already stopping.
    assert!(hung(&mut state, id, 15 * MIN + 500).is_err());
    assert_eq!(state.nodes["n1"].failures.len(), 1, "charged once");

    end(&mut state, id, JobEnd { signal: 15, ..JobEnd::default() }, 16 * MIN);
    let job = state.job(id).unwrap();
    assert_eq!((job.state, job.incarnation, job.failures), (JobState::Pending, 1, 1));
    assert_eq!(job.history[0].state, JobState::Requeued);
    assert!(job.history[0].reason.starts_with("Hung"), "{}", job.history[0].reason);
    assert_eq!(job.avoid_nodes(), ["n1".to_string()], "the next incarnation goes elsewhere");
    assert_eq!(job.progress(), None, "the new incarnation has reported nothing yet");
    assert_eq!(job.progress_timeout_s(), Some(600), "the timeout stays with the job");
}

#[test]
fn progress_timeouts_come_from_the_job_its_qos_its_partition_or_the_cluster() {
    let mut state = State::default();
    let mut config = ClusterConfig::default();
    config.resilience.progress_timeout_s = Some(3_600);
    config.partitions[0].progress_timeout_s = Some(1_800);
    state.apply(&at(0, Command::InitCluster { config }));
    let from_partition = submit(&mut state, alice_job(1, 1));
    assert_eq!(state.job(from_partition).unwrap().progress_timeout_s(), Some(1_800));
    let own = submit(&mut state, watched(5));
    assert_eq!(state.job(own).unwrap().progress_timeout_s(), Some(300));
    let off = submit(&mut state, JobSpec { progress_timeout_s: Some(0), ..alice_job(1, 1) });
    assert_eq!(state.job(off).unwrap().progress_timeout_s(), None, "UNLIMITED turns detection off");
    let qos = drover_state::Qos { progress_timeout_s: Some(900), ..drover_state::Qos::normal() };
    let put = Command::Admin { op: drover_state::AdminOp::PutQos { qos, create: false }, by_uid: 0 };
    state.apply(&at(5, put)).response.unwrap();
    let from_qos = submit(&mut state, alice_job(1, 1));
    assert_eq!(state.job(from_qos).unwrap().progress_timeout_s(), Some(900), "the QOS's, before the partition's");

    let mut bare = State::default();
    bare.apply(&at(0, Command::InitCluster { config: ClusterConfig::default() }));
    let plain = submit(&mut bare, alice_job(1, 1));
    assert!(bare.job(plain).unwrap().resilience.is_none(), "no timeout anywhere: nothing is kept per job");
}

#[test]
fn a_suspended_job_is_never_hung_and_a_checkpoint_counts_as_progress() {
    let mut state = cluster();
    let id = submit(&mut state, watched(10));
    start_on(&mut state, id, "n1", &[0, 1], 0);
    checkpoint(&mut state, id, "/ckpt/a", 8 * MIN);
    assert_eq!(state.job(id).unwrap().hung_at_ms(), Some(18 * MIN));
    state.apply(&at(9 * MIN, Command::SuspendJobs { ids: vec![id], by_uid: 0, suspend: true })).response.unwrap();
    assert_eq!(state.job(id).unwrap().hung_at_ms(), None);
    assert!(hung(&mut state, id, 60 * MIN).is_err());
}

#[test]
fn each_xid_remedy_takes_its_own_action() {
    let mut state = cluster();
    let a = submit(&mut state, alice_job(1, 2));
    let b = submit(&mut state, alice_job(1, 2));
    start_on(&mut state, a, "n1", &[0, 1], 20);
    start_on(&mut state, b, "n1", &[2, 3], 20);

    // Restart the application: only the job on that GPU is requeued; the node and GPU stay in service.
    fault(&mut state, "n1", 1, 13, XidAction::RestartApp, 100);
    assert!(state.job(a).unwrap().requeue.is_some());
    assert!(state.job(b).unwrap().requeue.is_none(), "the job on the other GPUs runs on");
    assert!(!state.nodes["n1"].drain && state.nodes["n1"].drained_gpus.is_empty());
    end(&mut state, a, JobEnd { signal: 15, ..JobEnd::default() }, 200);

    // Reset the GPU: that GPU alone leaves service; a 1-GPU job still fits on the node's free ones.
    fault(&mut state, "n1", 0, 48, XidAction::ResetGpu, 300);
    assert!(!state.nodes["n1"].drain);
    assert_eq!(state.nodes["n1"].free_gpus().collect::<Vec<_>>(), vec![1]);
    fault(&mut state, "n1", 0, 48, XidAction::ResetGpu, 301);
    assert_eq!(state.nodes["n1"].failures.len(), 2, "a repeated report of the same fault is charged once");
    let c = submit(&mut state, alice_job(1, 1));
    let refused = Command::ApplyPlan {
        allocations: vec![Allocation {
            job_id: c,
            nodes: vec![NodeAllocation { node: "n1".into(), gpus: vec![0], cpus: 1, tasks: 1, mem_mb: 0 }],
        }],
        reasons: vec![],
    };
    match state.apply(&at(400, refused)).response {
        Ok(Reply::Planned { started, refused }) => {
            assert!(started.is_empty());
            assert!(refused[0].1.to_string().contains("drained"), "{:?}", refused);
        }
        other => panic!("{other:?}"),
    }
    start_on(&mut state, c, "n1", &[1], 410);
    // The agent reset it: back in service. An operator's drain is not the agent's to lift.
    state.apply(&at(500, Command::GpusReset { node: "n1".into(), gpus: vec![0] })).response.unwrap();
    assert!(state.nodes["n1"].drained_gpus.is_empty());

    // Reboot the node / replace the hardware: the node is drained and its jobs requeued.
    fault(&mut state, "n2", 3, 79, XidAction::RebootNode, 600);
    assert!(state.nodes["n2"].drain && state.nodes["n2"].reason.contains("node reboot required"));
    fault(&mut state, "n3", 2, 64, XidAction::Hardware, 600);
    assert!(state.nodes["n3"].reason.contains("replace the GPU"), "{}", state.nodes["n3"].reason);
    state.check_invariants();
}

#[test]
fn an_operator_drains_and_returns_one_gpu() {
    let mut state = cluster();
    let drain = |drain, by_uid| Command::DrainGpus {
        node: "n2".into(),
        gpus: vec![3],
        drain,
        reason: "fan noise".into(),
        by_uid,
    };
    let denied = state.apply(&at(5, drain(true, ALICE))).response.unwrap_err();
    assert!(matches!(denied, CommandError::NotAuthorized { .. }), "{denied}");
    state.apply(&at(5, drain(true, 0))).response.unwrap();
    assert_eq!(state.nodes["n2"].free_gpus().count(), 3);
    state.apply(&at(6, Command::GpusReset { node: "n2".into(), gpus: vec![3] })).response.unwrap();
    assert_eq!(state.nodes["n2"].free_gpus().count(), 3, "the agent cannot lift an operator's drain");
    state.apply(&at(7, drain(false, 0))).response.unwrap();
    assert_eq!(state.nodes["n2"].free_gpus().count(), 4);
    let bad = Command::DrainGpus { node: "n2".into(), gpus: vec![9], drain: true, reason: "x".into(), by_uid: 0 };
    assert!(state.apply(&at(8, bad)).response.unwrap_err().to_string().contains("no GPU 9"));
}

#[test]
fn a_node_that_kills_three_users_jobs_is_quarantined_with_its_evidence_and_resuming_forgives_it() {
    let mut state = cluster();
    // One user's broken script failing again and again says nothing about the node: counted once.
    for round in 0..3u64 {
        let id = submit(&mut state, alice_job(1, 2));
        start_on(&mut state, id, "n1", &[0, 1], round * MIN);
        end(&mut state, id, JobEnd { exit_code: 1, ..JobEnd::default() }, round * MIN + 10_000);
    }
    assert_eq!(state.nodes["n1"].failures.len(), 3);
    assert!(!state.nodes["n1"].drain, "one user's early failures count once");
    // Three users' jobs dying early on the same node do.
    for round in 0..3u64 {
        let uid = ALICE + round as u32;
        let id = submit(&mut state, JobSpec { uid, user: format!("user{uid}").into(), ..alice_job(1, 2) });
        start_on(&mut state, id, "n2", &[0, 1], round * MIN);
        // Dies 30 s in, on its own: a lemon kills jobs early.
        end(&mut state, id, JobEnd { exit_code: 1, ..JobEnd::default() }, round * MIN + 30_000);
        let quarantined = state.nodes["n2"].drain;
        assert_eq!(quarantined, round == 2, "round {round}");
    }
    let reason = &state.nodes["n2"].reason;
    assert!(reason.starts_with("quarantined: 3 failures in 24 h: job"), "{reason}");
    assert!(reason.contains("failed (1:0) 30 s after starting"), "{reason}");

    // A job that ran for an hour before failing is not the node's doing.
    let long = submit(&mut state, alice_job(1, 2));
    start_on(&mut state, long, "n3", &[0, 1], 0);
    end(&mut state, long, JobEnd { exit_code: 1, ..JobEnd::default() }, 60 * MIN);
    assert!(state.nodes["n3"].failures.is_empty());

    let resume = Command::DrainNodes {
        names: vec!["n2".into()],
        drain: false,
        reason: String::new(),
        by_uid: 0,
        requeue_jobs: false,
    };
    state.apply(&at(100 * MIN, resume)).response.unwrap();
    assert!(state.nodes["n2"].failures.is_empty(), "repaired: forgiven");
}

#[test]
fn one_job_failing_again_and_again_does_not_quarantine_a_node() {
    let mut state = cluster();
    let id = submit(&mut state, watched(10));
    for round in 0..4u64 {
        start_on(&mut state, id, "n1", &[0, 1], round * 20 * MIN);
        hung(&mut state, id, round * 20 * MIN + 10 * MIN).unwrap();
        end(&mut state, id, JobEnd { signal: 9, ..JobEnd::default() }, round * 20 * MIN + 11 * MIN);
    }
    assert_eq!(state.nodes["n1"].failures.len(), 4);
    assert!(!state.nodes["n1"].drain, "four charges, one job: the job is the suspect, not the node");
}

#[test]
fn a_job_that_fails_right_after_resuming_falls_back_to_the_previous_checkpoint() {
    let mut state = cluster();
    let id = submit(&mut state, alice_job(1, 2));
    start_on(&mut state, id, "n1", &[0, 1], 0);
    checkpoint(&mut state, id, "/ckpt/100", 30 * MIN);
    checkpoint(&mut state, id, "/ckpt/200", 60 * MIN);
    state.apply(&at(61 * MIN, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None }));
    assert_eq!(state.job(id).unwrap().resume_from().unwrap().path, "/ckpt/200");

    // Incarnation 1 loads /ckpt/200 and crashes 40 s in: the checkpoint is suspect, not the job.
    start_on(&mut state, id, "n2", &[0, 1], 62 * MIN);
    end(&mut state, id, JobEnd { exit_code: 1, ..JobEnd::default() }, 62 * MIN + 40_000);
    let job = state.job(id).expect("restarted, not FAILED");
    assert_eq!((job.state, job.incarnation), (JobState::Pending, 2));
    assert_eq!(job.resume_from().unwrap().path, "/ckpt/100", "the one before");
    assert!(job.checkpoint_is_bad("/ckpt/200"));
    let record = job.history.last().unwrap();
    assert_eq!(record.state, JobState::Failed);
    assert!(
        record.reason.contains("/ckpt/200, now marked bad; the next incarnation resumes from /ckpt/100"),
        "{}",
        record.reason
    );
    assert!(state.nodes["n2"].failures.is_empty(), "a bad checkpoint is not the node's failure");

    // Incarnation 2 crashes too: no good checkpoint is left, so the job ends FAILED with the reason.
    start_on(&mut state, id, "n3", &[0, 1], 70 * MIN);
    end(&mut state, id, JobEnd { exit_code: 1, ..JobEnd::default() }, 70 * MIN + 10_000);
    assert!(state.job(id).is_none(), "no loop: archived");
}

#[test]
fn an_operator_invalidates_a_checkpoint_by_hand() {
    let mut state = cluster();
    let id = submit(&mut state, alice_job(1, 2));
    start_on(&mut state, id, "n1", &[0, 1], 0);
    checkpoint(&mut state, id, "/ckpt/1", MIN);
    checkpoint(&mut state, id, "/ckpt/2", 2 * MIN);
    let invalidate =
        |path: Option<&str>| Command::InvalidateCheckpoint { job_id: id, path: path.map(Into::into), by_uid: ALICE };
    state.apply(&at(3 * MIN, invalidate(None))).response.unwrap();
    let job = state.job(id).unwrap();
    assert!(job.checkpoint_is_bad("/ckpt/2") && !job.checkpoint_is_bad("/ckpt/1"));
    let unknown = state.apply(&at(3 * MIN, invalidate(Some("/ckpt/9")))).response.unwrap_err();
    assert!(unknown.to_string().contains("no checkpoint \"/ckpt/9\""), "{unknown}");
    let other = Command::InvalidateCheckpoint { job_id: id, path: None, by_uid: 4242 };
    assert!(matches!(state.apply(&at(3 * MIN, other)).response, Err(CommandError::PermissionDenied { .. })));
    state.apply(&at(4 * MIN, Command::RequeueJobs { ids: vec![id], by_uid: ALICE, hold: false })).response.unwrap();
    end(&mut state, id, JobEnd::default(), 5 * MIN);
    assert_eq!(state.job(id).unwrap().resume_from().unwrap().path, "/ckpt/1");
}

#[test]
fn old_records_without_the_new_fields_still_decode() {
    let node: drover_state::Node = serde_json::from_str(
        r#"{"info":{"name":"n1","agent_addr":"","host":"","cpus":1,"memory_mb":0,"gpus":[],"gpu_type":"","partitions":[],"features":[],"topology":{},"version":""},"health":"Up","drain":false,"reason":"","since_ms":0,"allocated_gpus":{},"allocated_cpus":0,"jobs":[]}"#,
    )
    .unwrap();
    assert!(node.drained_gpus.is_empty() && node.failures.is_empty());
    let order: drover_state::RequeueOrder =
        serde_json::from_str(r#"{"kind":"NodeFailure","hold":null,"reason":"x"}"#).unwrap();
    assert!(order.blame.is_empty());
}

#[test]
fn scontrol_reboot_asap_drains_waits_for_the_node_to_empty_and_returns_it_in_its_next_state() {
    use drover_state::node::NextState;
    let mut state = cluster();
    let id = submit(&mut state, alice_job(1, 2));
    start_on(&mut state, id, "n1", &[0, 1], 20);
    let reboot = |names: &[&str], asap, next_state, by_uid| Command::RebootNodes {
        names: names.iter().map(|n| n.to_string()).collect(),
        asap,
        next_state,
        reason: String::new(),
        by_uid,
    };
    let denied = state.apply(&at(30, reboot(&["n1"], true, None, ALICE))).response.unwrap_err();
    assert!(matches!(denied, CommandError::NotAuthorized { .. }), "{denied}");
    state.apply(&at(30, reboot(&["n1"], true, Some(NextState::Resume), 0))).response.unwrap();
    let n1 = &state.nodes["n1"];
    assert!(n1.drain && n1.reason == "Reboot ASAP" && !n1.schedulable());
    assert_eq!(state.job(id).unwrap().state, JobState::Running, "ASAP waits for its jobs: they are not killed");
    // The agent cannot have rebooted while a job runs there.
    let early = state.apply(&at(40, Command::NodeRebooted { node: "n1".into(), id: 30 })).response.unwrap_err();
    assert!(early.to_string().contains("still runs jobs"), "{early}");
    end(&mut state, id, JobEnd::default(), 50);
    let stale = state.apply(&at(60, Command::NodeRebooted { node: "n1".into(), id: 29 })).response.unwrap_err();
    assert!(stale.to_string().contains("no pending reboot 29"), "{stale}");
    state.apply(&at(60, Command::NodeRebooted { node: "n1".into(), id: 30 })).response.unwrap();
    assert!(state.nodes["n1"].schedulable(), "back in service: nextstate=RESUME");

    // Without ASAP the node is not drained, only kept from new jobs; nextstate=DOWN brings it back drained.
    state.apply(&at(70, reboot(&["n2"], false, Some(NextState::Down), 0))).response.unwrap();
    assert!(!state.nodes["n2"].drain && !state.nodes["n2"].schedulable());
    state.apply(&at(80, Command::NodeRebooted { node: "n2".into(), id: 70 })).response.unwrap();
    assert!(state.nodes["n2"].drain && state.nodes["n2"].reason.contains("nextstate=DOWN"));
    // cancel_reboot lifts an ASAP order's own drain and the pending reboot.
    state.apply(&at(90, reboot(&["n3"], true, None, 0))).response.unwrap();
    state.apply(&at(91, Command::CancelReboot { names: vec!["n3".into()], by_uid: 0 })).response.unwrap();
    assert!(state.nodes["n3"].schedulable() && state.nodes["n3"].reboot.is_none());
    let unknown = state.apply(&at(92, reboot(&["n9"], true, None, 0))).response.unwrap_err();
    assert!(matches!(unknown, CommandError::InvalidNodeName { .. }), "{unknown}");
}

#[test]
fn a_drained_node_that_goes_down_keeps_its_drain_reason_through_its_return() {
    let mut state = cluster();
    let drain = Command::DrainNodes {
        names: vec!["n1".into()],
        drain: true,
        reason: "quarantined: 3 failures in 24 h".into(),
        by_uid: 0,
        requeue_jobs: false,
    };
    state.apply(&at(5, drain)).response.unwrap();
    state.apply(&at(6, Command::NodeDown { name: "n1".into(), reason: "Not responding".into(), epoch: None }));
    assert_eq!(state.nodes["n1"].reason, "quarantined: 3 failures in 24 h", "Slurm keeps a drain's reason too");
    state.apply(&at(7, Command::RegisterNode { info: gpu_node("n1"), running: Vec::new() })).response.unwrap();
    assert!(state.nodes["n1"].drain && state.nodes["n1"].reason.starts_with("quarantined"));
    // An undrained node that goes down says why, and forgets it when it returns.
    state.apply(&at(8, Command::NodeDown { name: "n2".into(), reason: "Not responding".into(), epoch: None }));
    assert_eq!(state.nodes["n2"].reason, "Not responding");
}

#[test]
fn a_hung_job_that_may_not_come_back_ends_failed_with_the_reason() {
    let mut state = cluster();
    let id = submit(&mut state, JobSpec { requeue: Some(false), ..watched(10) });
    start_on(&mut state, id, "n1", &[0, 1], 0);
    hung(&mut state, id, 10 * MIN).unwrap();
    assert_eq!(state.job(id).unwrap().hung_at_ms(), None, "stopping: never judged again");
    let ended = Command::JobEnded { job_id: id, incarnation: 0, end: JobEnd { signal: 15, ..JobEnd::default() } };
    let applied = state.apply(&at(11 * MIN, ended));
    applied.response.unwrap();
    let archived = applied.changes.iter().find_map(|c| match c {
        drover_state::Change::ArchiveJob(job) => Some(job.clone()),
        _ => None,
    });
    let job = archived.expect("ended for good, not requeued");
    assert_eq!((job.state, job.incarnation), (JobState::Failed, 0));
    assert!(job.message.as_deref().unwrap_or_default().starts_with("Hung: no progress for 600 s"), "{:?}", job.message);
}

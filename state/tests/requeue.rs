//! Stories for incarnations that end without the job ending: node failure, fencing, `scontrol requeue`,
//! preemption, GPU faults, the requeue limit, `--no-kill`, and the checkpoints the next incarnation resumes from.
//! Through `State::apply` alone.

use drover_state::{
    Allocation, ClusterConfig, Command, CommandError, JobEnd, JobSpec, JobState, NodeAllocation, PendingReason, Reply,
    State,
};

mod common;

use common::{ALICE, alice_job, at, gpu_node};

fn cluster(max_batch_requeue: u32) -> State {
    let mut state = State::default();
    let config = ClusterConfig { max_batch_requeue, ..ClusterConfig::default() };
    state.apply(&at(0, Command::InitCluster { config }));
    for name in ["n1", "n2", "n3"] {
        state.apply(&at(1, Command::RegisterNode { info: gpu_node(name), running: Vec::new() })).response.unwrap();
    }
    state
}

fn spec(nodes: u32) -> JobSpec {
    alice_job(nodes, 2)
}

fn submit(state: &mut State, spec: JobSpec) -> u64 {
    match state.apply(&at(10, Command::SubmitJob { spec: Box::new(spec), request_id: None })).response {
        Ok(Reply::Submitted { job_id, .. }) => job_id,
        other => panic!("{other:?}"),
    }
}

/// Starts job `id` on `nodes`, GPUs 0 and 1 of each.
fn start(state: &mut State, id: u64, nodes: &[&str], time_ms: u64) {
    let shares = nodes
        .iter()
        .map(|n| NodeAllocation { node: n.to_string(), gpus: vec![0, 1], cpus: 1, tasks: 1, mem_mb: 0 })
        .collect();
    let plan = Command::ApplyPlan { allocations: vec![Allocation { job_id: id, nodes: shares }], reasons: vec![] };
    match state.apply(&at(time_ms, plan)).response {
        Ok(Reply::Planned { started, refused }) => assert_eq!(started, vec![id], "refused: {refused:?}"),
        other => panic!("{other:?}"),
    }
    state.check_invariants();
}

fn end(state: &mut State, id: u64, end: JobEnd, time_ms: u64) {
    let incarnation = state.job(id).unwrap().incarnation;
    state.apply(&at(time_ms, Command::JobEnded { job_id: id, incarnation, end })).response.unwrap();
    state.check_invariants();
}

fn record(state: &mut State, id: u64, incarnation: u64, path: &str, step: u64) -> Result<Reply, CommandError> {
    let command =
        Command::RecordCheckpoint { job_id: id, incarnation, path: path.into(), step: Some(step), by_uid: ALICE };
    state.apply(&at(50, command)).response
}

#[test]
fn a_fenced_incarnation_is_a_node_failure_and_the_next_one_resumes_from_its_checkpoint() {
    let mut state = cluster(5);
    let id = submit(&mut state, spec(1));
    assert_eq!(state.job(id).unwrap().checkpoint_dir(), format!("/home/alice/.drover/checkpoints/{id}/0"));
    start(&mut state, id, &["n1"], 20);
    record(&mut state, id, 0, "/ckpt/step-40", 40).unwrap();
    // The agent fenced (the controllers were gone longer than its lease) and killed the tasks with SIGKILL.
    end(&mut state, id, JobEnd { signal: 9, fenced: true, ..JobEnd::default() }, 100);
    let job = state.job(id).expect("requeued, not FAILED");
    assert_eq!((job.state, job.incarnation, job.restart_count, job.failures), (JobState::Pending, 1, 1, 1));
    assert_eq!(job.resume_from().map(|c| (c.path.as_str(), c.step)), Some(("/ckpt/step-40", Some(40))));
    assert_eq!(job.checkpoint_dir(), format!("/home/alice/.drover/checkpoints/{id}/1"));
    let ended = &job.history[0];
    assert_eq!((ended.incarnation, ended.state, ended.nodes.as_str()), (0, JobState::NodeFail, "n1"));
    assert!(ended.reason.contains("fenced"), "{}", ended.reason);
    // The zombie of incarnation 0 can no longer record anything; incarnation 1 can once it runs.
    let err = record(&mut state, id, 0, "/ckpt/step-41", 41).unwrap_err();
    assert!(matches!(err, CommandError::StaleReport { .. }), "{err}");
    start(&mut state, id, &["n2"], 120);
    record(&mut state, id, 1, "/ckpt/step-60", 60).unwrap();
    assert_eq!(state.job(id).unwrap().resume_from(), None, "its own checkpoint is not one it resumes from");
}

#[test]
fn a_job_that_fails_too_often_stays_failed() {
    let mut state = cluster(2);
    let id = submit(&mut state, spec(1));
    for round in 0..3u64 {
        start(&mut state, id, &["n1"], 100 + round * 100);
        state
            .apply(&at(150 + round * 100, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None }));
        state.check_invariants();
        let info = state.nodes["n1"].info.clone();
        state.apply(&at(160 + round * 100, Command::RegisterNode { info, running: Vec::new() })).response.unwrap();
        if round < 2 {
            assert_eq!(state.job(id).unwrap().state, JobState::Pending, "round {round}: requeued");
        }
    }
    assert!(state.job(id).is_none(), "the third failure is over max_batch_requeue = 2: archived");
}

#[test]
fn scontrol_requeue_stops_the_job_and_brings_it_back_and_requeuehold_holds_it() {
    let mut state = cluster(5);
    let id = submit(&mut state, spec(1));
    start(&mut state, id, &["n1"], 20);
    let requeue = |hold| Command::RequeueJobs { ids: vec![id], by_uid: ALICE, hold };
    state.apply(&at(30, requeue(false))).response.unwrap();
    let job = state.job(id).unwrap();
    assert_eq!(job.state, JobState::Completing);
    assert!(job.stopping(), "the agent stops its tasks");
    assert_eq!(state.nodes["n1"].allocated_gpus.len(), 2, "GPUs held until the tasks are gone");
    end(&mut state, id, JobEnd { signal: 15, ..JobEnd::default() }, 40);
    let job = state.job(id).unwrap();
    assert_eq!((job.state, job.incarnation, job.failures), (JobState::Pending, 1, 0), "a request is no failure");
    assert_eq!(job.history[0].state, JobState::Requeued);
    assert!(state.nodes["n1"].allocated_gpus.is_empty());

    start(&mut state, id, &["n2"], 50);
    state.apply(&at(60, requeue(true))).response.unwrap();
    end(&mut state, id, JobEnd::default(), 70);
    let job = state.job(id).unwrap();
    assert!(job.held && job.reason == PendingReason::RequeuedHeld, "requeuehold: back in the queue, held");
    assert_eq!(job.reason.name(), "job_requeued_in_held_state", "Slurm's words for it");

    // A pending job is not running: nothing to requeue. A --no-requeue job may not be requeued.
    let Ok(Reply::Jobs(outcomes)) = state.apply(&at(80, requeue(false))).response else { panic!() };
    assert!(matches!(outcomes[0].result, Err(CommandError::NotRunning { .. })));
    let stubborn = submit(&mut state, JobSpec { requeue: Some(false), ..spec(1) });
    start(&mut state, stubborn, &["n3"], 90);
    let refused = Command::RequeueJobs { ids: vec![stubborn], by_uid: ALICE, hold: false };
    let Ok(Reply::Jobs(outcomes)) = state.apply(&at(95, refused)).response else { panic!() };
    assert!(outcomes[0].result.as_ref().unwrap_err().to_string().contains("--no-requeue"));
}

#[test]
fn a_cancel_during_a_requeue_ends_the_job() {
    let mut state = cluster(5);
    let id = submit(&mut state, spec(1));
    start(&mut state, id, &["n1"], 20);
    state.apply(&at(30, Command::RequeueJobs { ids: vec![id], by_uid: ALICE, hold: false })).response.unwrap();
    state.apply(&at(31, Command::CancelJobs { ids: vec![id], by_uid: ALICE })).response.unwrap();
    end(&mut state, id, JobEnd { signal: 15, ..JobEnd::default() }, 40);
    assert!(state.job(id).is_none(), "cancelled, not requeued");
}

#[test]
fn preempted_jobs_end_and_come_back_as_preempted_incarnations() {
    let mut state = cluster(5);
    let victim = submit(&mut state, spec(1));
    start(&mut state, victim, &["n1"], 20);
    let reply = state.apply(&at(30, Command::PreemptJobs { victims: vec![victim, 999], for_job: 7 })).response;
    assert_eq!(reply, Ok(Reply::Preempted { jobs: vec![victim] }));
    // Preempting it again (the next scheduling pass) changes nothing.
    let again = state.apply(&at(31, Command::PreemptJobs { victims: vec![victim], for_job: 7 }));
    assert_eq!(again.response, Ok(Reply::Preempted { jobs: vec![] }));
    assert!(again.changes.is_empty());
    end(&mut state, victim, JobEnd { signal: 15, ..JobEnd::default() }, 40);
    let job = state.job(victim).unwrap();
    assert_eq!((job.state, job.failures), (JobState::Pending, 0));
    assert_eq!(job.history[0].state, JobState::Preempted);
    assert!(job.history[0].reason.contains("preempted by job 7"));
}

#[test]
fn gpus_on_surviving_nodes_stay_held_until_their_agent_confirms_the_old_tasks_are_gone() {
    let mut state = cluster(5);
    let id = submit(&mut state, spec(2));
    start(&mut state, id, &["n1", "n2"], 20);
    state.apply(&at(30, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None })).response.unwrap();
    state.check_invariants();
    assert_eq!(state.job(id).unwrap().state, JobState::Pending, "requeued");
    // n2's tasks of incarnation 0 may still be dying: its GPUs are not free for anyone.
    let n2 = &state.nodes["n2"];
    assert_eq!(n2.lingering.len(), 1);
    assert_eq!((n2.lingering[0].job, n2.lingering[0].incarnation, n2.lingering[0].gpus.clone()), (id, 0, vec![0, 1]));
    assert_eq!(n2.free_gpus().collect::<Vec<_>>(), vec![2, 3]);
    let other = submit(&mut state, JobSpec { nodelist: vec!["n2".into()].into(), ..spec(1) });
    let plan = Command::ApplyPlan {
        allocations: vec![Allocation {
            job_id: other,
            nodes: vec![NodeAllocation { node: "n2".into(), gpus: vec![0, 1], cpus: 1, tasks: 1, mem_mb: 0 }],
        }],
        reasons: vec![],
    };
    let Ok(Reply::Planned { refused, .. }) = state.apply(&at(40, plan)).response else { panic!() };
    assert!(matches!(refused[0].1, drover_state::AllocationRefusal::GpuLingers { .. }), "{refused:?}");
    // The agent on n2 confirms; a stale or repeated confirmation changes nothing.
    let release = |keys| Command::ReleaseLingering { node: "n2".into(), keys, usage: Vec::new() };
    assert!(state.apply(&at(50, release(vec![(id, 5)]))).changes.is_empty());
    state.apply(&at(51, release(vec![(id, 0)]))).response.unwrap();
    assert!(state.nodes["n2"].lingering.is_empty());
    start(&mut state, other, &["n2"], 60);
    end(&mut state, other, JobEnd::default(), 65);
    // A node that goes down takes what lingered there with it.
    let long = submit(&mut state, spec(2));
    start(&mut state, long, &["n2", "n3"], 70);
    end(&mut state, long, JobEnd::default(), 80);
    assert_eq!(state.nodes["n3"].lingering.len(), 1, "the batch node reported; n3 has to confirm");
    state.apply(&at(90, Command::NodeDown { name: "n3".into(), reason: "lost".into(), epoch: None })).response.unwrap();
    state.check_invariants();
    assert!(state.nodes["n3"].lingering.is_empty());
}

#[test]
fn no_kill_keeps_a_job_on_its_remaining_nodes_unless_its_first_node_fails() {
    let mut state = cluster(5);
    let id = submit(&mut state, JobSpec { no_kill: true, ..spec(3) });
    start(&mut state, id, &["n1", "n2", "n3"], 20);
    state.apply(&at(30, Command::NodeDown { name: "n3".into(), reason: "lost".into(), epoch: None })).response.unwrap();
    state.check_invariants();
    let job = state.job(id).unwrap();
    assert_eq!(
        (job.state, job.nodes.to_vec(), job.incarnation),
        (JobState::Running, vec!["n1".into(), "n2".into()], 0)
    );
    state.apply(&at(40, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None })).response.unwrap();
    state.check_invariants();
    assert_eq!(state.job(id).unwrap().state, JobState::Pending, "its first node (the batch script's) failed");
}

#[test]
fn a_gpu_fault_drains_the_node_and_requeues_its_jobs() {
    let mut state = cluster(5);
    let id = submit(&mut state, spec(1));
    start(&mut state, id, &["n1"], 20);
    let drain = Command::DrainNodes {
        names: vec!["n1".into()],
        drain: true,
        reason: "GPU 1: XID 79 (fallen off the bus)".into(),
        by_uid: 0,
        requeue_jobs: true,
    };
    state.apply(&at(30, drain)).response.unwrap();
    let job = state.job(id).unwrap();
    assert!(job.stopping() && job.state == JobState::Completing);
    end(&mut state, id, JobEnd { signal: 15, ..JobEnd::default() }, 40);
    let job = state.job(id).unwrap();
    assert_eq!((job.state, job.failures), (JobState::Pending, 1));
    assert!(job.history[0].reason.contains("XID 79"), "{}", job.history[0].reason);
    assert_eq!(state.nodes["n1"].state_name(), "DRAINED");
}

#[test]
fn steps_are_recorded_with_their_ends_bounded_and_begin_again_with_each_incarnation() {
    use drover_state::StepStart;
    let mut state = cluster(5);
    let id = submit(&mut state, spec(2));
    start(&mut state, id, &["n1", "n2"], 20);
    let create = |state: &mut State, nodes: &[&str], time_ms: u64| {
        let step = StepStart { name: "python".into(), nodes: nodes.iter().map(|n| n.to_string()).collect(), tasks: 2 };
        state.apply(&at(time_ms, Command::CreateStep { job_id: id, by_uid: ALICE, step: Some(step) })).response
    };
    let end_step = |state: &mut State, step_id: u32, exit_code: i32, time_ms: u64| {
        let command = Command::EndStep { job_id: id, step_id, exit_code, signal: 0, cancelled: false, by_uid: ALICE };
        state.apply(&at(time_ms, command)).response.unwrap()
    };
    assert_eq!(create(&mut state, &["n1", "n2"], 30), Ok(Reply::Step { step_id: 0 }));
    assert_eq!(create(&mut state, &["n2"], 31), Ok(Reply::Step { step_id: 1 }));
    let err = create(&mut state, &["n3"], 32).unwrap_err();
    assert!(err.to_string().contains("n3 is not one of job"), "{err}");
    end_step(&mut state, 0, 0, 40);
    end_step(&mut state, 1, 3, 41);
    end_step(&mut state, 1, 0, 42); // a repeated report changes nothing
    let steps = &state.job(id).unwrap().steps;
    assert_eq!((steps[0].start_ms, steps[0].end.unwrap().end_ms), (30, 40), "times from the log");
    assert_eq!(steps[0].state(JobState::Running), JobState::Completed);
    assert_eq!((steps[1].end.unwrap().exit_code, steps[1].state(JobState::Running)), (3, JobState::Failed));

    // A step still running when its job ends reads as cancelled with it.
    assert_eq!(create(&mut state, &["n1"], 50), Ok(Reply::Step { step_id: 2 }));
    let open = state.job(id).unwrap().steps[2].clone();
    assert_eq!(
        (open.state(JobState::Running), open.state(JobState::Timeout)),
        (JobState::Running, JobState::Cancelled)
    );

    // A job that runs steps in a loop keeps the newest records only.
    for t in 0..drover_state::job::MAX_STEP_RECORDS as u64 + 10 {
        create(&mut state, &["n1"], 60 + t).unwrap();
    }
    let steps = &state.job(id).unwrap().steps;
    assert_eq!(steps.len(), drover_state::job::MAX_STEP_RECORDS);
    assert!(steps.iter().all(|s| s.id >= 2), "the ended ones gave way first");

    // The next incarnation starts with no steps and numbers them from 0 again.
    let requeue = Command::RequeueJobs { ids: vec![id], by_uid: ALICE, hold: false };
    state.apply(&at(2_000, requeue)).response.unwrap();
    end(&mut state, id, JobEnd { exit_code: 0, signal: 15, ..JobEnd::default() }, 2_001);
    // n2 still holds the last incarnation's GPUs: the next one waits until n2 confirms its tasks gone (issue 36).
    let early = Command::ApplyPlan {
        allocations: vec![Allocation {
            job_id: id,
            nodes: ["n1", "n3"]
                .iter()
                .map(|n| NodeAllocation { node: n.to_string(), gpus: vec![0, 1], cpus: 1, tasks: 1, mem_mb: 0 })
                .collect(),
        }],
        reasons: vec![],
    };
    match state.apply(&at(2_005, early)).response {
        Ok(Reply::Planned { started, refused }) => {
            assert!(started.is_empty());
            assert!(matches!(refused[0].1, drover_state::AllocationRefusal::EarlierIncarnationLingers), "{refused:?}");
        }
        other => panic!("{other:?}"),
    }
    let release = Command::ReleaseLingering { node: "n2".into(), keys: vec![(id, 0)], usage: Vec::new() };
    state.apply(&at(2_006, release)).response.unwrap();
    start(&mut state, id, &["n1", "n3"], 2_010);
    assert!(state.job(id).unwrap().steps.is_empty());
    assert_eq!(create(&mut state, &["n1"], 2_020), Ok(Reply::Step { step_id: 0 }));
}

/// `scontrol suspend`/`resume`: only an operator may; the job keeps its GPUs and shows SUSPENDED, its time limit
/// stops while it is, and a requeued incarnation starts unsuspended.
#[test]
fn a_suspended_job_keeps_its_allocation_and_its_time_limit_moves_by_the_time_stopped() {
    let mut state = cluster(5);
    let id = submit(&mut state, JobSpec { time_limit_s: Some(60), ..spec(1) });
    let suspend = |suspend, by_uid| Command::SuspendJobs { ids: vec![id], by_uid, suspend };
    let outcome = |state: &mut State, time_ms, command| match state.apply(&at(time_ms, command)).response {
        Ok(Reply::Jobs(outcomes)) => outcomes[0].result.clone(),
        other => panic!("{other:?}"),
    };
    // Pending: nothing to suspend.
    assert!(matches!(outcome(&mut state, 15, suspend(true, 0)), Err(CommandError::NotSuspendable { .. })));
    start(&mut state, id, &["n1"], 20);
    let refused = state.apply(&at(25, suspend(true, ALICE))).response;
    assert!(matches!(refused, Err(CommandError::NotAuthorized { .. })), "{refused:?}");

    outcome(&mut state, 1_000, suspend(true, 0)).unwrap();
    let job = state.job(id).unwrap();
    assert_eq!((job.state, job.shown_state()), (JobState::Running, JobState::Suspended));
    assert_eq!(job.limit_end_ms(), None, "the limit does not run while suspended");
    assert_eq!(state.nodes["n1"].allocated_gpus.len(), 2, "it keeps its GPUs");
    assert!(matches!(outcome(&mut state, 1_500, suspend(true, 0)), Err(CommandError::NotSuspendable { .. })));

    outcome(&mut state, 6_000, suspend(false, 0)).unwrap();
    let job = state.job(id).unwrap();
    assert_eq!(job.shown_state(), JobState::Running);
    assert_eq!(job.limit_end_ms(), Some(20 + 60_000 + 5_000), "five seconds suspended, five seconds later");

    // A requeue starts the next incarnation with none of it.
    outcome(&mut state, 7_000, suspend(true, 0)).unwrap();
    state.apply(&at(8_000, Command::RequeueJobs { ids: vec![id], by_uid: 0, hold: false })).response.unwrap();
    end(&mut state, id, JobEnd { signal: 15, ..JobEnd::default() }, 9_000);
    let job = state.job(id).unwrap();
    assert_eq!(job.suspension, None);
}

/// `scontrol requeue` of a COMPLETED batch job, as Slurm's: the leader proposes the history's record; the job
/// comes back PENDING as its next incarnation, out of the history, with its goodput counted once; a second
/// request finds it active; a --no-requeue job and a stranger are refused.
#[test]
fn a_finished_batch_job_requeued_comes_back_as_its_next_incarnation() {
    let mut state = cluster(5);
    let id = submit(&mut state, spec(1));
    start(&mut state, id, &["n1"], 20);
    let ended = state.apply(&at(40, Command::JobEnded { job_id: id, incarnation: 0, end: JobEnd::default() }));
    let Some(drover_state::Change::ArchiveJob(record)) =
        ended.changes.iter().find(|c| matches!(c, drover_state::Change::ArchiveJob(_)))
    else {
        panic!("archived: {:?}", ended.changes)
    };
    let record = record.clone();
    let goodput = state.meta.goodput;
    let requeue = |by_uid| Command::RequeueFinished { job: record.clone(), by_uid, hold: false };
    let outcome = |state: &mut State, time_ms, command| match state.apply(&at(time_ms, command)) {
        drover_state::Applied { response: Ok(Reply::Jobs(o)), changes } => (o[0].result.clone(), changes),
        other => panic!("{other:?}"),
    };

    let (refused, _) = outcome(&mut state, 50, requeue(4_242));
    assert!(matches!(refused, Err(CommandError::PermissionDenied { .. })), "{refused:?}");
    let (result, changes) = outcome(&mut state, 60, requeue(ALICE));
    result.unwrap();
    assert!(changes.contains(&drover_state::Change::UnarchiveJob(id)), "out of the history");
    let job = state.job(id).unwrap();
    assert_eq!((job.state, job.incarnation, job.restart_count), (JobState::Pending, 1, 1));
    assert_eq!(job.history[0].state, JobState::Completed, "the finished incarnation, in its history");
    assert_eq!((job.end_time_ms, job.start_time_ms), (None, None));
    assert_eq!(state.meta.goodput, goodput, "counted once, when it ended");
    state.check_invariants();
    let (again, _) = outcome(&mut state, 70, requeue(ALICE));
    assert!(matches!(again, Err(CommandError::NotRunning { .. })), "{again:?}");

    let stubborn = JobSpec { requeue: Some(false), ..spec(1) };
    let other = submit(&mut state, stubborn);
    start(&mut state, other, &["n2"], 80);
    let ended = state.apply(&at(90, Command::JobEnded { job_id: other, incarnation: 0, end: JobEnd::default() }));
    let Some(drover_state::Change::ArchiveJob(record)) =
        ended.changes.iter().find(|c| matches!(c, drover_state::Change::ArchiveJob(_)))
    else {
        panic!()
    };
    let command = Command::RequeueFinished { job: record.clone(), by_uid: ALICE, hold: false };
    let (refused, _) = outcome(&mut state, 95, command);
    assert!(matches!(refused, Err(CommandError::InvalidRequest(_))), "{refused:?}");
}

#[test]
fn a_requeued_container_job_restarts_in_the_image_digest_its_first_incarnation_ran() {
    use drover_state::container::{ContainerSpec, ImageRef, ImageTag, RegistryImage};
    let mut state = cluster(5);
    let image = ImageRef::parse("nvcr.io#nvidia/pytorch:24.05-py3").unwrap();
    let container = ContainerSpec { image: Some(image.clone()), ..ContainerSpec::default() };
    let id = submit(&mut state, JobSpec { container: Some(Box::new(container)), ..spec(1) });
    let plain = submit(&mut state, spec(1));
    start(&mut state, id, &["n1"], 20);
    let digest = |byte: &str| format!("sha256:{}", byte.repeat(32));
    let record = |state: &mut State, incarnation, digest: String| {
        state.apply(&at(30, Command::RecordImage { job_id: id, incarnation, digest })).response
    };
    // What the node reports is checked: a digest, for the current incarnation, of a job with an image.
    assert!(matches!(record(&mut state, 0, "latest".into()), Err(CommandError::InvalidRequest(_))));
    assert!(matches!(record(&mut state, 1, digest("aa")), Err(CommandError::StaleReport { .. })));
    let other = Command::RecordImage { job_id: plain, incarnation: 0, digest: digest("aa") };
    assert!(matches!(state.apply(&at(30, other)).response, Err(CommandError::InvalidRequest(_))));
    record(&mut state, 0, digest("aa")).unwrap();
    record(&mut state, 0, digest("bb")).unwrap();
    let pinned = |state: &State| state.job(id).unwrap().spec.container.as_ref().unwrap().pinned_digest.clone();
    assert_eq!(pinned(&state), Some(digest("aa")), "the first report pins; a later one changes nothing");

    state.apply(&at(40, Command::RequeueJobs { ids: vec![id], by_uid: ALICE, hold: false })).response.unwrap();
    let container = state.job(id).unwrap().spec.container.clone().unwrap();
    let ImageRef::Registry(r) = image else { unreachable!() };
    let expected = RegistryImage { reference: ImageTag::Digest(digest("aa")), ..r };
    assert_eq!(
        container.image_to_run(),
        Some(ImageRef::Registry(expected)),
        "the next incarnation runs the same image"
    );
    assert_eq!(container.image.unwrap().to_string(), "nvcr.io#nvidia/pytorch:24.05-py3", "what was asked stays shown");
}

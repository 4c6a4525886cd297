//! The node-facing wire, fuzzed as `apply` is.
//!
//! - The step port: whatever a caller with a valid step credential sends (any argv, environment, node list, task
//!   counts, output patterns, job and step numbers; and any bytes at all), the agent answers with a refusal or a
//!   launch it can justify, and never panics. A panic in the handler would drop the caller's connection without a
//!   word at best; an overflow in rank arithmetic wraps in release builds.
//! - The session: whatever assignments, lingering lists, leases and signals a leader (or a confused one) sends,
//!   the agent's reconcile passes never panic, and no task is started for a job it was not assigned, nor as root on
//!   a cluster that does not allow root jobs. (The controller's side of the session ends in `apply`, which
//!   `state/tests/fuzz_apply.rs` fuzzes with every command an agent's messages become.)

use std::sync::Arc;

use drover_agent::node::{AssignmentUpdate, NodeAgent};
use drover_agent::steps::StepServer;
use drover_auth::credential::{CREDENTIAL_METADATA_KEY, Identity, now_ms, sign, sign_for, step_audience};
use drover_proto::v1::StepRequest;
use drover_proto::v1::agent_service_server::AgentService;
use drover_proto::wire::SignalTarget;
use drover_proto::wire::{Assignment, StepLaunch, encode};
use drover_state::{Job, JobSpec, JobState, NodeAllocation};
use proptest::prelude::*;

mod common;

/// Job 7 runs on this node (n1) as uid 60001, with GPU 1.
const JOB: u64 = 7;
const OWNER: u32 = 60_001;

fn node() -> (tempfile::TempDir, Arc<NodeAgent>) {
    let dir = tempfile::tempdir().unwrap();
    // The supervisor is /bin/false: a launch that passes every check fails to start, and nothing runs.
    let agent = common::agent(dir.path(), "", "/bin/false".into());
    let job = Job {
        id: JOB,
        state: JobState::Running,
        nodes: vec!["n1".to_string()].into(),
        allocation: vec![NodeAllocation { node: "n1".into(), gpus: vec![1], cpus: 1, tasks: 1, mem_mb: 0 }].into(),
        spec: JobSpec { uid: OWNER, gid: OWNER, user: "alice".into(), ..JobSpec::default() },
        ..Job::default()
    };
    let assignment = Assignment { job, hosts: vec!["127.0.0.1".into()], node_index: 0, script: None };
    agent.set_assignments(AssignmentUpdate { jobs: vec![assignment], applied_index: 1, ..AssignmentUpdate::default() });
    (dir, agent)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["n1", "n2", "", "/", "..", "/etc/passwd", "%j.%t.out", "%x/../../x", "true"])
            .prop_map(String::from),
        1 => "\\PC{0,24}",
    ]
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![3 => 0u32..4, 1 => Just(u32::MAX), 1 => Just(u32::MAX / 2 + 1), 1 => any::<u32>()]
}

fn launch() -> impl Strategy<Value = StepLaunch> {
    let job = prop_oneof![4 => Just(JOB), 1 => any::<u64>()];
    // Mostly node lists a real srun could send (names paired with task counts), sometimes lists that disagree.
    let node_name = prop_oneof![3 => Just("n1".to_string()), 1 => Just("n2".to_string()), 1 => text()];
    let layout =
        (prop::collection::vec((node_name, count()), 0..4), prop::option::of(count())).prop_map(|(pairs, extra)| {
            let (nodes, mut tasks): (Vec<String>, Vec<u32>) = pairs.into_iter().unzip();
            tasks.extend(extra);
            (nodes, tasks)
        });
    let lists = (prop::collection::vec(text(), 0..3), prop::collection::vec((text(), text()), 0..3), layout);
    let index = prop_oneof![4 => 0u32..4, 1 => count()];
    let rest = (prop::option::of(text()), prop::option::of(text()), any::<bool>(), index, text());
    (job, 0u32..4, lists, rest).prop_map(
        |(job_id, step_id, (argv, env, (nodes, tasks_per_node)), (output, error, unbuffered, node_index, cwd))| {
            StepLaunch {
                job_id,
                step_id,
                argv,
                env,
                cwd,
                nodes,
                node_index,
                tasks_per_node,
                output,
                error,
                unbuffered,
                stdin: Default::default(),
                container: None,
            }
        },
    )
}

/// A request as a caller sends it: its credential (the step's own, usually; another uid's, another step's, or the
/// user's authd token sometimes) and its bytes (the launch encoded, or mangled).
fn request(
    agent: &NodeAgent,
    launch: &StepLaunch,
    uid: u32,
    audience_step: u32,
    bytes: Option<Vec<u8>>,
) -> tonic::Request<StepRequest> {
    let identity = Identity { uid, gid: uid, user: "someone".into() };
    let token = if audience_step == u32::MAX {
        sign(&agent.key, &identity, "h", now_ms(), 60_000)
    } else {
        sign_for(&agent.key, &identity, "ctl", now_ms(), 60_000, &step_audience(launch.job_id, audience_step))
    };
    let json = bytes.unwrap_or_else(|| encode(launch));
    let mut request = tonic::Request::new(StepRequest { json });
    request.metadata_mut().insert(CREDENTIAL_METADATA_KEY, token.parse().unwrap());
    request
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_step_port_refuses_or_justifies_every_launch_and_never_panics(
        launch in launch(),
        uid in prop_oneof![4 => Just(OWNER), 1 => Just(60_002u32), 1 => Just(0u32)],
        audience in prop_oneof![4 => Just(None), 1 => Just(Some(u32::MAX)), 1 => (0u32..4).prop_map(Some)],
        mangle in prop::option::weighted(0.2, (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 0..8))),
    ) {
        let (_dir, agent) = node();
        let bytes = mangle.map(|(at, junk)| {
            let mut bytes = encode(&launch);
            let cut = at.index(bytes.len() + 1);
            bytes.truncate(cut);
            bytes.extend(junk);
            bytes
        });
        let mangled = bytes.is_some();
        let audience = audience.unwrap_or(launch.step_id);
        let request = request(&agent, &launch, uid, audience, bytes);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answer = runtime.block_on(StepServer(agent.clone()).launch_step(request));
        if answer.is_ok() {
            // Accepted only what a real srun of this job's owner would send for this node.
            prop_assert!(!mangled);
            prop_assert_eq!(audience, launch.step_id);
            prop_assert_eq!(launch.job_id, JOB);
            prop_assert!(uid == OWNER || uid == 0);
            prop_assert_eq!(launch.nodes.get(launch.node_index as usize).map(String::as_str), Some("n1"));
            prop_assert_eq!(launch.tasks_per_node.len(), launch.nodes.len());
            prop_assert!(!launch.argv.is_empty());
        }
    }
}

/// The case the fuzzer found: the counts of the nodes before this one overflow a rank. It panicked the handler
/// (debug) or wrapped the ranks (release); now it is refused as malformed.
#[test]
fn task_counts_that_overflow_a_rank_are_refused() {
    let (_dir, agent) = node();
    let launch = StepLaunch {
        job_id: JOB,
        step_id: 0,
        argv: vec!["true".into()],
        env: vec![],
        cwd: "/".into(),
        nodes: vec!["n1".into(), "n1".into()],
        node_index: 1,
        tasks_per_node: vec![u32::MAX, 5],
        output: None,
        error: None,
        unbuffered: false,
        stdin: Default::default(),
        container: None,
    };
    let request = request(&agent, &launch, OWNER, 0, None);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let Err(refused) = runtime.block_on(StepServer(agent.clone()).launch_step(request)) else {
        panic!("launched with overflowing task counts")
    };
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("task counts overflow"), "{}", refused.message());
}

fn job(id: u64, uid: u32, gpus: Vec<u32>, node_index: u32) -> Assignment {
    let job = Job {
        id,
        incarnation: id % 3,
        state: JobState::Running,
        nodes: vec!["n1".to_string(), "n2".to_string()].into(),
        allocation: vec![NodeAllocation { node: "n1".into(), gpus, cpus: 1, tasks: 1, mem_mb: 0 }].into(),
        spec: JobSpec { uid, gid: uid, user: "alice".into(), script: "#!/bin/sh\ntrue\n".into(), ..JobSpec::default() },
        ..Job::default()
    };
    Assignment { job, hosts: vec!["127.0.0.1".into()], node_index, script: Some("#!/bin/sh\ntrue\n".into()) }
}

fn update() -> impl Strategy<Value = AssignmentUpdate> {
    let assignment =
        (0u64..6, prop_oneof![3 => Just(OWNER), 1 => Just(0u32)], prop::collection::vec(0u32..4, 0..3), 0u32..3)
            .prop_map(|(id, uid, gpus, node_index)| job(id, uid, gpus, node_index));
    let key = (0u64..6, 0u64..3);
    (
        prop::collection::vec(assignment, 0..4),
        0u64..6,
        prop::collection::vec(key.clone(), 0..3),
        any::<bool>(),
        0u64..3,
        prop::collection::vec((key, prop::collection::vec(0u32..4, 0..3)), 0..3),
    )
        .prop_map(|(jobs, applied_index, lingering, allow_root_jobs, epoch, lingering_gpus)| AssignmentUpdate {
            jobs,
            applied_index,
            lingering,
            allow_root_jobs,
            epoch,
            lingering_gpus,
            cluster_name: String::new(),
            reboot: None,
        })
}

#[derive(Debug, Clone)]
enum SessionEvent {
    Assignments(AssignmentUpdate),
    Lease { epoch: u64, ms: u64 },
    Signal { job: u64, incarnation: u64, signal: i32, target: u8 },
    Acked { job: u64, incarnation: u64 },
    Reconcile,
}

fn event() -> impl Strategy<Value = SessionEvent> {
    prop_oneof![
        3 => update().prop_map(SessionEvent::Assignments),
        2 => (0u64..3, prop_oneof![Just(0u64), Just(5_000u64)]).prop_map(|(epoch, ms)| SessionEvent::Lease { epoch, ms }),
        1 => (0u64..6, 0u64..3, prop_oneof![Just(0), Just(10), Just(15), any::<i32>()], 0u8..3)
            .prop_map(|(job, incarnation, signal, target)| SessionEvent::Signal { job, incarnation, signal, target }),
        1 => (0u64..6, 0u64..3).prop_map(|(job, incarnation)| SessionEvent::Acked { job, incarnation }),
        3 => Just(SessionEvent::Reconcile),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn whatever_a_leader_sends_the_agent_starts_only_what_it_was_assigned(events in prop::collection::vec(event(), 1..12)) {
        let (_dir, agent) = node();
        let (outbox, _messages) = tokio::sync::mpsc::channel(1_024);
        agent.connected(outbox, agent.timing());
        // Every way each incarnation was assigned (its uid, and whether root jobs were allowed then), from the
        // updates the agent takes (it ignores ones older than the newest it has).
        let mut ever: std::collections::HashMap<(u64, u64), Vec<(u32, bool)>> = Default::default();
        ever.insert((JOB, 0), vec![(OWNER, false)]);
        let mut newest = 1;
        for event in events {
            match event {
                SessionEvent::Assignments(update) => {
                    if update.applied_index >= newest {
                        newest = update.applied_index;
                        for a in &update.jobs {
                            let ways = ever.entry((a.job.id, a.job.incarnation)).or_default();
                            ways.push((a.job.spec.uid, update.allow_root_jobs));
                        }
                    }
                    agent.set_assignments(update);
                }
                SessionEvent::Lease { epoch, ms } => {
                    agent.renew(std::time::Instant::now() + std::time::Duration::from_millis(ms), epoch)
                }
                SessionEvent::Signal { job, incarnation, signal, target } => {
                    let target = [SignalTarget::Steps, SignalTarget::Batch, SignalTarget::Full][target as usize];
                    agent.signal_job((job, incarnation), signal, target);
                }
                SessionEvent::Acked { job, incarnation } => agent.acked((job, incarnation)),
                SessionEvent::Reconcile => agent.reconcile(),
            }
        }
        agent.reconcile();
        let _ = agent.running_shares();
        let _ = agent.problems();
        for dir in agent.task_dirs() {
            let ways = ever.get(&dir.key);
            prop_assert!(ways.is_some(), "a task of {:?}, never assigned", dir.key);
            if ways.unwrap().iter().all(|(uid, root_allowed)| *uid == 0 && !root_allowed) {
                // Refused before anything ran: the task's record says why, and no launch was handed over.
                let refused = match drover_agent::supervise::status(&dir.path) {
                    drover_agent::supervise::TaskStatus::Finished(result) => {
                        result.error.is_some_and(|e| e.contains("may not run as root"))
                    }
                    _ => false,
                };
                prop_assert!(refused, "a root task of {:?} on a cluster that allows none", dir.key);
                prop_assert!(!dir.path.join("launch.json").exists(), "a root launch was written for {:?}", dir.key);
            }
        }
    }
}

//! What an agent accepts from leaders: assignments never older than ones it already has (a new leader that has
//! not applied everything committed before its election would otherwise make it kill running jobs as strays),
//! and a lease only as an answer to a heartbeat, from the time that heartbeat was sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_agent::node::{AssignmentUpdate, NodeAgent};
use drover_proto::wire::Assignment;
use drover_state::Job;

mod common;

fn agent(dir: &std::path::Path) -> Arc<NodeAgent> {
    common::agent(dir, "", "/bin/false".into())
}

fn assignment(id: u64) -> Assignment {
    Assignment { job: Job { id, ..Job::default() }, hosts: vec!["127.0.0.1".into()], node_index: 1, script: None }
}

#[test]
fn assignments_older_than_the_newest_seen_are_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    agent.set_assignments(AssignmentUpdate {
        jobs: vec![assignment(7)],
        applied_index: 100,
        lingering: Vec::new(),
        ..AssignmentUpdate::default()
    });
    assert!(agent.assignment(7).is_some());
    // A leader that has not caught up sends its older state, without job 7: not acted upon.
    agent.set_assignments(AssignmentUpdate {
        jobs: Vec::new(),
        applied_index: 90,
        lingering: Vec::new(),
        ..AssignmentUpdate::default()
    });
    assert!(agent.assignment(7).is_some(), "job 7 must not become a stray because of a stale leader");
    // A leader at least as current says job 7 is gone: now it is.
    agent.set_assignments(AssignmentUpdate {
        jobs: Vec::new(),
        applied_index: 101,
        lingering: Vec::new(),
        ..AssignmentUpdate::default()
    });
    assert!(agent.assignment(7).is_none());
}

#[test]
fn the_lease_lives_on_disk_for_the_supervisors_and_a_restarted_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    assert!(!agent.lease_valid(), "no lease before a leader grants one");
    agent.renew(Instant::now() + Duration::from_secs(30), 0);
    assert!(agent.lease_valid());
    assert!(!drover_agent::lease::expired(&agent.lease_path()), "the supervisors see it");
    drop(agent);
    // A restarted agent holds the same lease (its tasks kept running under it).
    let again = self::agent(tmp.path());
    assert!(again.lease_valid());
}

/// Issue 36, the agent's half of the fencing rule: a task starts only under a lease of the registration epoch its
/// assignments are for, and only once this session's assignments arrived.
#[test]
fn tasks_start_only_under_a_lease_of_the_epoch_their_assignments_are_for() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    assert!(agent.may_start_tasks().unwrap_err().to_string().contains("no lease"));
    agent.renew(Instant::now() + Duration::from_secs(30), 2);
    assert!(
        agent.may_start_tasks().unwrap_err().to_string().contains("assignments"),
        "not before the assignments arrive"
    );
    // Assignments of the node's previous registration (a leader that had not seen it come back).
    agent.set_assignments(AssignmentUpdate { applied_index: 1, epoch: 1, ..AssignmentUpdate::default() });
    let refused = agent.may_start_tasks().unwrap_err().to_string();
    assert!(refused.contains("registration 2") && refused.contains("registration 1"), "{refused}");
    agent.set_assignments(AssignmentUpdate { applied_index: 2, epoch: 2, ..AssignmentUpdate::default() });
    assert!(agent.may_start_tasks().is_ok());
}

/// A task of an earlier incarnation that may still run keeps its GPUs: a registration lists it, and no task of
/// another incarnation starts on them until it is gone.
#[test]
fn a_task_that_may_still_run_keeps_its_gpus_until_it_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    let dir = agent.tasks_dir.join("1.0.batch");
    let launch = drover_agent::supervise::TaskLaunch {
        stdin: None,
        node: String::new(),
        container: None,
        argv: vec!["/bin/sleep".into(), "30".into()],
        env: Vec::new(),
        cwd: "/".into(),
        // SAFETY: getters that cannot fail.
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        user: String::new(),
        stdout: "/dev/null".into(),
        stderr: None,
        append: false,
        lease_file: None,
        make_dirs: Vec::new(),
        cgroup: None,
        gpus: vec![0],
        journal: None,
        // The tests run as root or as themselves; as root, a task of their own uid is a root task.
        allow_root: true,
    };
    drover_agent::supervise::spawn(std::path::Path::new(env!("CARGO_BIN_EXE_drover-agent")), &dir, &launch).unwrap();
    let running = agent.running_shares();
    assert_eq!(running, [drover_state::RunningShare { job: 1, incarnation: 0, gpus: vec![0] }]);
    let held = agent.gpus_free_for((2, 0), &[0, 1], &agent.task_dirs()).unwrap_err().to_string();
    assert!(held.contains("GPU 0") && held.contains("job 1 incarnation 0"), "{held}");
    assert!(agent.gpus_free_for((2, 0), &[1], &agent.task_dirs()).is_ok(), "GPU 1 is free");
    assert!(agent.gpus_free_for((1, 0), &[0], &agent.task_dirs()).is_ok(), "its own incarnation shares them");
    // Signalled once the task has started (the supervisor writes its pid right after the exec).
    let deadline = Instant::now() + Duration::from_secs(10);
    while drover_agent::supervise::signal(&dir, libc::SIGKILL).is_err() {
        assert!(Instant::now() < deadline, "the task never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    while agent.gpus_free_for((2, 0), &[0], &agent.task_dirs()).is_err() {
        assert!(Instant::now() < deadline, "the killed task's GPU was never free");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(agent.running_shares().is_empty());
}

/// `--gpu-freq`: a job's GPUs on this node get the clocks it asked for before it starts, the node's other GPUs
/// keep their defaults, and once the job has left the node (the leader no longer lists it) its GPUs are back at
/// their defaults, as Slurm resets them after a job.
#[test]
fn a_jobs_gpu_clocks_are_set_while_it_is_here_and_reset_once_it_has_left() {
    use drover_state::job::{ClockLevel, GpuFreq};
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    let defaults = agent.gpu_clocks(0).unwrap();
    assert_eq!(agent.gpu_clocks(1).unwrap(), defaults);
    let mut job = assignment(7);
    job.job.spec.gpu_freq =
        Some(Box::new(GpuFreq { graphics: Some(ClockLevel::Low), memory: Some(ClockLevel::Medium), verbose: false }));
    job.job.allocation = vec![
        drover_state::NodeAllocation::default(),
        drover_state::NodeAllocation { gpus: vec![1], ..Default::default() },
    ]
    .into();
    agent.set_assignments(AssignmentUpdate { jobs: vec![job], applied_index: 10, ..AssignmentUpdate::default() });
    agent.reconcile();
    let set = agent.gpu_clocks(1).unwrap();
    assert_eq!((set.memory_mhz, set.graphics_mhz), (1593, 345), "the middle memory clock, the lowest graphics one");
    assert_eq!(agent.gpu_clocks(0).unwrap(), defaults, "a GPU the job does not hold keeps its clocks");
    agent.reconcile();
    assert_eq!(agent.gpu_clocks(1).unwrap(), set, "set once, kept while the job is here");
    agent.set_assignments(AssignmentUpdate { jobs: Vec::new(), applied_index: 11, ..AssignmentUpdate::default() });
    agent.reconcile();
    assert_eq!(agent.gpu_clocks(1).unwrap(), defaults, "back to the defaults once the job has left");
}

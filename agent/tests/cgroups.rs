//! Job cgroups through a real agent: the CPUs it picks for each job (disjoint, compact, the same for every task of
//! a job, none when too few are free), the usage it reports when a job is released, and the cgroups it removes once
//! the leader no longer lists the job. Needs root and a cgroup hierarchy with cpuset; skipped otherwise, saying so.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_agent::node::{AssignmentUpdate, NodeAgent, Timing};
use drover_agent::supervise::{self, TaskStatus};
use drover_proto::wire::{AgentMessage, Assignment, StepLaunch};
use drover_state::{Job, JobSpec, NodeAllocation};

mod common;

const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn agent(dir: &Path, subdir: &str) -> Arc<NodeAgent> {
    common::agent(dir, &format!("memory_cgroup = {subdir:?}\n"), env!("CARGO_BIN_EXE_drover-agent").into())
}

/// An interactive allocation (no batch script to start) of `cpus` CPUs on n1, run as nobody.
fn assignment(id: u64, cpus: u32) -> Assignment {
    let spec = JobSpec { uid: NOBODY, gid: NOBODY, interactive: true, work_dir: "/tmp".into(), ..JobSpec::default() };
    let share = NodeAllocation { node: "n1".into(), gpus: Vec::new(), cpus, tasks: 1, mem_mb: 64 };
    let job = Job { id, spec, nodes: vec!["n1".into()].into(), allocation: vec![share].into(), ..Job::default() };
    Assignment { job, hosts: vec!["127.0.0.1".into()], node_index: 0, script: None }
}

/// Runs one task of a step of `a` on the agent and returns what it printed.
fn run_step(agent: &NodeAgent, a: &Assignment, step_id: u32, script: &str) -> String {
    let launch = StepLaunch {
        job_id: a.job.id,
        step_id,
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/tmp".into(),
        nodes: vec!["n1".into()],
        node_index: 0,
        tasks_per_node: vec![1],
        output: None,
        error: None,
        unbuffered: false,
        stdin: Default::default(),
        container: None,
    };
    // Both read ends stay open while the task runs: a FIFO nobody reads fails the task at once.
    let task = agent.launch_step_task(a, &launch, 0, 0).unwrap();
    let (dir, out) = (task.dir, task.stdout);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match supervise::status(&dir) {
            TaskStatus::Finished(result) => {
                assert_eq!(result.exit_code, 0, "{result:?}");
                break;
            }
            TaskStatus::Lost(why) => panic!("task lost: {why}"),
            TaskStatus::Running { .. } => {}
        }
        assert!(Instant::now() < deadline, "the task in {} did not end", dir.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The output comes back through a pipe (non-blocking), which the ended task has closed: read it to its end.
    let mut out = out.expect("the output comes back to srun");
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut out, &mut text).unwrap();
    String::from_utf8(text).unwrap()
}

/// What `nproc; grep Cpus_allowed_list` prints for a task on `cpus`.
fn sees(cpus: &str) -> String {
    let count = drover_agent::cgroup::parse_cpu_list(cpus).unwrap().len();
    format!("{count}\nCpus_allowed_list:\t{cpus}\n")
}

const SHOW_CPUS: &str = "nproc; grep Cpus_allowed_list /proc/self/status";

#[test]
fn the_agent_pins_each_job_to_cpus_of_its_own_reports_its_usage_and_cleans_up() {
    if !is_root() {
        return eprintln!("SKIPPED: job cgroups need root");
    }
    let tmp = tempfile::tempdir().unwrap();
    let subdir = format!("drover-test/agent-{}", std::process::id());
    let agent = agent(tmp.path(), &subdir);
    let Some(root) = agent.cgroup.clone() else { return eprintln!("SKIPPED: no memory cgroup on this host") };
    let Some((all, _)) = drover_agent::cgroup::cpu_pool(&root, (0, 0)) else {
        return eprintln!("SKIPPED: tasks cannot be pinned to CPUs on this host");
    };
    let (outbox, mut sent) = tokio::sync::mpsc::channel(16);
    let timing = Timing { heartbeat_ms: 1_000, fence_after_ms: 30_000, kill_wait_ms: 1_000, allow_root_jobs: false };
    agent.connected(outbox, timing);
    agent.renew(Instant::now() + Duration::from_secs(60), 0);
    let everything = all.len() as u32;
    let jobs = vec![assignment(1, 1), assignment(2, 1), assignment(3, everything)];
    agent.set_assignments(AssignmentUpdate {
        jobs: jobs.clone(),
        applied_index: 1,
        lingering: Vec::new(),
        ..AssignmentUpdate::default()
    });

    // One CPU each, the lowest first; a later step of the same job is on the same CPU.
    let first = drover_agent::cgroup::format_cpu_list(&[*all.first().unwrap()]);
    assert_eq!(run_step(&agent, &jobs[0], 0, SHOW_CPUS), sees(&first));
    assert_eq!(run_step(&agent, &jobs[0], 1, SHOW_CPUS), sees(&first), "every task of the job alike");
    let everything_list = drover_agent::cgroup::format_cpu_list(&all.iter().copied().collect::<Vec<_>>());
    if all.len() > 1 {
        let second = drover_agent::cgroup::format_cpu_list(&[*all.iter().nth(1).unwrap()]);
        assert_eq!(run_step(&agent, &jobs[1], 0, SHOW_CPUS), sees(&second), "not the first job's CPU");
        // The third job holds every CPU, some of which are pinned to the others: it runs, unpinned.
        assert_eq!(run_step(&agent, &jobs[2], 0, SHOW_CPUS), sees(&everything_list), "unpinned, not failed");
    }

    // Job 1 ended; its node lingers until the agent confirms, with its usage. Jobs 2 and 3 are gone entirely.
    agent.set_assignments(AssignmentUpdate {
        jobs: Vec::new(),
        applied_index: 2,
        lingering: vec![(1, 0)],
        ..AssignmentUpdate::default()
    });
    agent.reconcile();
    let Ok(AgentMessage::Released { keys, usage }) = sent.try_recv() else { panic!("no release sent") };
    assert_eq!(keys, [(1, 0)]);
    assert_eq!(usage.len(), 1, "{usage:?}");
    let (key, measured) = usage[0];
    assert_eq!(key, (1, 0));
    assert!(measured.mem_peak_kb.is_some_and(|kb| kb > 0), "{measured:?}");
    // CPU time is counted on v2 always, on v1 where the host has a cpuacct hierarchy.
    let counts_cpu = root.cpuacct.is_some() || root.hierarchy == drover_agent::cgroup::Hierarchy::V2;
    assert_eq!(measured.cpu_ms.is_some(), counts_cpu, "{measured:?}");
    assert!(root.path.join("job_1.0").is_dir(), "kept while the leader still lists the job here");
    assert!(!root.path.join("job_2.0").exists() && !root.path.join("job_3.0").exists(), "ended jobs' cgroups go");
    // Released: the next look (at most once a second) removes job 1's cgroups too.
    agent.set_assignments(AssignmentUpdate {
        jobs: Vec::new(),
        applied_index: 3,
        lingering: Vec::new(),
        ..AssignmentUpdate::default()
    });
    std::thread::sleep(Duration::from_millis(1_100));
    agent.reconcile();
    assert!(drover_agent::cgroup::job_keys(&root).is_empty(), "{:?}", drover_agent::cgroup::job_keys(&root));
    for base in std::iter::once(&root.path).chain(&root.cpuacct).chain(&root.cpuset) {
        let _ = std::fs::remove_dir(base);
        let _ = std::fs::remove_dir(base.parent().unwrap());
    }
}

//! Jobs really running on node agents: real controllers and agents (simulated GPUs) on loopback, driven through
//! Slurm's commands as a user would.

use std::time::{Duration, Instant};

use drover_cli::local::UpOptions;

mod common;

use common::{Shell, setup};

/// What these stories ask of a shell beyond running commands.
impl Shell {
    /// `sacct -P` fields of one job.
    fn acct(&self, id: u64, fields: &str) -> Vec<String> {
        let out = self.ok("sacct", &["-X", "-j", &id.to_string(), "-n", "-P", "-o", fields]);
        out.trim().split('|').map(str::to_string).collect()
    }

    /// Waits until the job reaches a state that is not PENDING/RUNNING/COMPLETING, and returns it.
    fn wait_done(&self, id: u64, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let state = self.acct(id, "State").remove(0);
            if !["PENDING", "RUNNING", "COMPLETING", ""].contains(&state.as_str()) {
                return state;
            }
            assert!(start.elapsed() < timeout, "job {id} still {state} after {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_state(&self, id: u64, want: &str, timeout: Duration) {
        let start = Instant::now();
        while self.acct(id, "State")[0] != want {
            assert!(start.elapsed() < timeout, "job {id} never became {want}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.cwd.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }
}

fn two_agents() -> UpOptions {
    UpOptions { agents: 2, gpus_per_agent: 4, kill_wait_ms: 1_000, ..UpOptions::default() }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

#[test]
fn a_two_node_job_runs_eight_ranks_that_meet_at_one_master() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), two_agents());
    // Another job first takes one GPU on node01, so the big job's GPUs there must avoid it.
    let blocker = sh.submit(&["--gres=gpu:1", "-J", "blocker", "--wrap", "sleep 30"]);
    sh.wait_state(blocker, "RUNNING", Duration::from_secs(20));
    let blocker_node = sh.acct(blocker, "NodeList").remove(0);
    std::fs::write(
        sh.cwd.join("train.sh"),
        "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=4 --gres=gpu:3 -J ranks -o ranks-%j.out\n\
         srun bash -c 'echo \"task RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE NODE=$SLURMD_NODENAME CUDA=$CUDA_VISIBLE_DEVICES MASTER=$MASTER_ADDR:$MASTER_PORT NODELIST=$SLURM_JOB_NODELIST PROCID=$SLURM_PROCID\"'\n\
         srun drover rendezvous\n\
         echo \"batch done NODELIST=$SLURM_JOB_NODELIST NNODES=$SLURM_NNODES TASKS=$SLURM_TASKS_PER_NODE\"\n",
    )
    .unwrap();
    let id = sh.submit(&["train.sh"]);
    assert_eq!(sh.wait_done(id, Duration::from_secs(60)), "COMPLETED", "{}", sh.read(&format!("ranks-{id}.out")));
    let out = sh.read(&format!("ranks-{id}.out"));
    let tasks: Vec<&str> = out.lines().filter(|l| l.starts_with("task ")).collect();
    assert_eq!(tasks.len(), 8, "{out}");
    let mut ranks: Vec<u32> = tasks.iter().map(|l| field(l, "RANK").parse().unwrap()).collect();
    ranks.sort();
    assert_eq!(ranks, (0..8).collect::<Vec<_>>(), "every rank exactly once");
    let masters: std::collections::BTreeSet<&str> = tasks.iter().map(|l| field(l, "MASTER")).collect();
    assert_eq!(masters.len(), 1, "one MASTER_ADDR:MASTER_PORT for all ranks: {masters:?}");
    for line in &tasks {
        assert_eq!(field(line, "WORLD_SIZE"), "8");
        assert_eq!(field(line, "NODELIST"), "node[01-02]");
        assert_eq!(field(line, "PROCID"), field(line, "RANK"));
        let rank: u32 = field(line, "RANK").parse().unwrap();
        assert_eq!(field(line, "NODE"), if rank < 4 { "node01" } else { "node02" }, "block distribution");
        assert_eq!(field(line, "LOCAL_RANK"), (rank % 4).to_string());
        let cuda = field(line, "CUDA");
        assert_eq!(cuda.split(',').count(), 3, "three GPUs per node: {line}");
        if field(line, "NODE") == blocker_node {
            assert!(!cuda.split(',').any(|g| g == "0"), "{blocker_node}'s GPU 0 belongs to the blocker: {line}");
        }
    }
    assert_eq!(out.lines().filter(|l| l.contains("met rank 0") || l.contains("all 8 ranks met")).count(), 8, "{out}");
    assert!(out.contains("batch done NODELIST=node[01-02] NNODES=2 TASKS=4(x2)"), "{out}");
    let acct = sh.acct(id, "JobID,State,ExitCode,NodeList,AllocTRES");
    assert_eq!(acct[1..], ["COMPLETED", "0:0", "node[01-02]", "billing=8,cpu=8,gres/gpu=6,node=2"]);
    sh.ok("scancel", &[&blocker.to_string()]);
    assert_eq!(sh.wait_done(blocker, Duration::from_secs(20)), "CANCELLED by 0");
}

#[test]
fn cancel_timeout_a_missing_program_and_a_deleted_script() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), two_agents());
    // scancel: SIGTERM reaches the script, which gets to say goodbye.
    let cancelled = sh.submit(&[
        "-o",
        "cancel.out",
        "--wrap",
        "trap 'echo got TERM; exit 143' TERM; echo started; sleep 60 & wait",
    ]);
    sh.wait_state(cancelled, "RUNNING", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    sh.ok("scancel", &[&cancelled.to_string()]);
    assert_eq!(sh.wait_done(cancelled, Duration::from_secs(20)), "CANCELLED by 0");
    assert!(sh.read("cancel.out").contains("got TERM"), "{}", sh.read("cancel.out"));

    // --time: ended as TIMEOUT the same way.
    let timed = sh.submit(&[
        "-t",
        "0:02",
        "-o",
        "timeout.out",
        "--wrap",
        "trap 'echo time is up; exit 1' TERM; sleep 60 & wait",
    ]);
    assert_eq!(sh.wait_done(timed, Duration::from_secs(30)), "TIMEOUT");
    assert!(sh.read("timeout.out").contains("time is up"));

    // scancel --signal: delivered, the job goes on.
    let signalled =
        sh.submit(&["-o", "usr1.out", "--wrap", "trap 'echo got USR1' USR1; for i in $(seq 100); do sleep 0.1; done"]);
    sh.wait_state(signalled, "RUNNING", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    // As in Slurm: by default a signal goes to the job's steps, not the batch shell; -b reaches the shell.
    sh.ok("scancel", &["--signal=USR1", &signalled.to_string()]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!std::fs::read_to_string(sh.cwd.join("usr1.out")).unwrap_or_default().contains("got USR1"));
    sh.ok("scancel", &["-b", "--signal=USR1", &signalled.to_string()]);
    assert_eq!(sh.wait_done(signalled, Duration::from_secs(30)), "COMPLETED");
    assert_eq!(sh.read("usr1.out").matches("got USR1").count(), 1);

    // A missing executable: FAILED, and the error file says why.
    let missing = sh.submit(&["-e", "missing.err", "-o", "missing.out", "--wrap", "/opt/no/such/program --flag"]);
    assert_eq!(sh.wait_done(missing, Duration::from_secs(20)), "FAILED");
    assert_eq!(sh.acct(missing, "ExitCode")[0], "127:0");
    // --wrap runs under /bin/sh (dash here, as in Slurm), which says "not found".
    let said = sh.read("missing.err");
    assert!(said.contains("/opt/no/such/program: not found"), "{said}");

    // The script file is deleted right after submission: the stored copy runs.
    std::fs::write(
        sh.cwd.join("gone.sh"),
        "#!/bin/bash\n#SBATCH -o gone.out\necho \"ran from the stored copy in $PWD\"\n",
    )
    .unwrap();
    let gone = sh.submit(&["--hold", "gone.sh"]);
    std::fs::remove_file(sh.cwd.join("gone.sh")).unwrap();
    sh.ok("scontrol", &["release", &gone.to_string()]);
    assert_eq!(sh.wait_done(gone, Duration::from_secs(20)), "COMPLETED");
    assert!(sh.read("gone.out").contains("ran from the stored copy"));

    // An impossible request is refused at submit, in Slurm's words.
    let out = sh.run("sbatch", &["--gres=gpu:5", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Requested node configuration is not available"));

    // srun outside a job makes its own allocation and returns the worst exit code.
    let out = sh
        .run("srun", &["-N", "2", "--ntasks-per-node=2", "bash", "-c", "echo rank=$SLURM_PROCID; exit $SLURM_PROCID"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("rank=")).count(), 4, "{text}");

    // srun's standard input reaches every task, on both nodes, then end of file (Slurm's default --input=all);
    // --input=0 gives it to task 0 alone, --input=none to none.
    let input: String = (0..5_000).map(|i| format!("line {i}\n")).collect();
    for (mode, readers) in [("all", 4), ("0", 1), ("none", 0)] {
        let mut child = sh
            .command(
                "srun",
                &[
                    "-N",
                    "2",
                    "--ntasks-per-node=2",
                    &format!("--input={mode}"),
                    "sh",
                    "-c",
                    "echo $SLURM_PROCID $(wc -l)",
                ],
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let feed = input.clone();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(feed.as_bytes());
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        assert!(out.status.success(), "--input={mode}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let full = text.lines().filter(|l| l.ends_with(" 5000")).count();
        let empty = text.lines().filter(|l| l.ends_with(" 0")).count();
        assert_eq!((full, empty), (readers, 4 - readers), "--input={mode}:\n{text}");
    }
}

#[test]
fn an_agent_restart_leaves_tasks_running_and_reports_their_end() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, sh) = setup(dir.path(), two_agents());
    let id = sh.submit(&["-o", "upgrade.out", "--wrap", "echo before $$; sleep 3; echo after $$"]);
    sh.wait_state(id, "RUNNING", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let (_, agent) = cluster.agents()[0].clone();
    cluster.kill(agent).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sh.acct(id, "State")[0], "RUNNING", "the job outlives its agent");
    cluster.start(agent).unwrap();
    assert_eq!(sh.wait_done(id, Duration::from_secs(30)), "COMPLETED");
    let out = sh.read("upgrade.out");
    let pids: Vec<&str> = out.lines().map(|l| l.split_whitespace().nth(1).unwrap()).collect();
    assert_eq!(pids.len(), 2, "{out}");
    assert_eq!(pids[0], pids[1], "the same process ran from start to end: {out}");
}

#[test]
fn a_leader_failover_during_a_job_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, sh) = setup(dir.path(), two_agents());
    let id = sh.submit(&["-N", "2", "--gres=gpu:4", "-o", "failover.out", "--wrap", "sleep 2; srun hostname"]);
    sh.wait_state(id, "RUNNING", Duration::from_secs(20));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_ready(Duration::from_secs(10))).unwrap();
    cluster.kill(leader).unwrap();
    // Submissions during and after the failover are all kept and all run.
    let more: Vec<u64> = (0..4).map(|_| sh.submit(&["--gres=gpu:1", "--wrap", "true"])).collect();
    assert_eq!(sh.wait_done(id, Duration::from_secs(40)), "COMPLETED", "{}", sh.read("failover.out"));
    assert_eq!(sh.read("failover.out").lines().count(), 2, "srun ran on both nodes after the failover");
    for job in more {
        assert_eq!(sh.wait_done(job, Duration::from_secs(30)), "COMPLETED");
    }
}

#[test]
fn a_dead_node_requeues_its_job_on_a_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let options =
        UpOptions { agent_heartbeat_ms: 200, agent_fence_after_ms: 1_000, node_timeout_ms: 2_000, ..two_agents() };
    let (mut cluster, sh) = setup(dir.path(), options);
    let id = sh.submit(&[
        "--gres=gpu:4",
        "-o",
        "requeue-%j.out",
        "--open-mode=append",
        "--wrap",
        "echo restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME; if [ ${SLURM_RESTART_COUNT:-0} = 0 ]; then sleep 60; fi",
    ]);
    sh.wait_state(id, "RUNNING", Duration::from_secs(20));
    let node = sh.acct(id, "NodeList").remove(0);
    // The node dies: its agent and every task on it.
    drover_cli::local::fence_node(&mut cluster, &node).unwrap();
    assert_eq!(sh.wait_done(id, Duration::from_secs(40)), "COMPLETED");
    let acct = sh.acct(id, "Restarts,NodeList");
    assert_eq!(acct[0], "1", "requeued once");
    assert_ne!(acct[1], node, "restarted on the other node");
    let sinfo = sh.ok("sinfo", &["-R", "-h"]);
    assert!(sinfo.contains("Not responding") && sinfo.contains(&node), "{sinfo}");
    assert!(sh.read(&format!("requeue-{id}.out")).contains("restart=1 on"));
}

#[test]
fn an_agent_cut_off_from_every_controller_kills_its_tasks_before_its_node_is_declared_down() {
    let dir = tempfile::tempdir().unwrap();
    let options =
        UpOptions { agent_heartbeat_ms: 200, agent_fence_after_ms: 1_500, node_timeout_ms: 3_000, ..two_agents() };
    let (mut cluster, sh) = setup(dir.path(), options);
    let id = sh.submit(&["--no-requeue", "--wrap", "echo $$ > task.pid; exec sleep 120"]);
    sh.wait_state(id, "RUNNING", Duration::from_secs(20));
    let pid_file = sh.cwd.join("task.pid");
    let start = Instant::now();
    while !pid_file.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "the task never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let alive = |pid: i32| unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid);
    assert!(alive(pid));
    // Every controller freezes: the agent hears no leader.
    for id in [1, 2, 3] {
        cluster.signal(id, libc::SIGSTOP).unwrap();
    }
    // The fence comes 1.5 s after the last word from a leader; allow a slow machine some slack.
    let frozen = Instant::now();
    while alive(pid) && frozen.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let fenced = !alive(pid);
    for id in [1, 2, 3] {
        cluster.signal(id, libc::SIGCONT).unwrap();
    }
    assert!(fenced, "the task must be dead once the agent fenced itself (1.5 s without a leader)");
    // The controllers come back: the fence was a node failure, not the job's (a --no-requeue job ends NODE_FAIL;
    // before, the kill was reported as an ordinary SIGKILL and the job ended FAILED). It never runs twice.
    assert_eq!(sh.wait_done(id, Duration::from_secs(30)), "NODE_FAIL");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

#[test]
fn an_agent_whose_gpus_disagree_with_its_config_is_drained_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let options = UpOptions { agents: 1, gpus_per_agent: 4, agent_expected_gpus: Some(8), ..UpOptions::default() };
    let (_cluster, sh) = setup(dir.path(), options);
    let start = Instant::now();
    loop {
        // %E at its natural width: sinfo -R's default column cuts reasons at 20 characters, as Slurm's does.
        let reasons = sh.ok("sinfo", &["-R", "-h", "-o", "%E %N"]);
        if reasons.contains("config expects 8 GPUs but found 4") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no drain reason: {reasons}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(sh.ok("sinfo", &["-h"]).contains("drain"));
}

#[test]
fn ctrl_c_on_srun_stops_its_tasks_and_cancels_its_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), two_agents());
    let mut srun = sh
        .command("srun", &["-J", "interactive", "bash", "-c", "echo $$ > srun-task.pid; exec sleep 60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = sh.cwd.join("srun-task.pid");
    let start = Instant::now();
    while std::fs::read_to_string(&pid_file).map_or(true, |s| s.trim().is_empty()) {
        assert!(start.elapsed() < Duration::from_secs(20), "the step never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let task: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    unsafe { libc::kill(srun.id() as i32, libc::SIGINT) };
    let status = srun.wait().unwrap();
    assert_eq!(status.code(), Some(130), "srun exits as interrupted");
    let id = 1; // srun's allocation is the first job of this cluster
    assert_eq!(sh.wait_done(id, Duration::from_secs(20)), "CANCELLED by 0");
    let start = Instant::now();
    while unsafe { libc::kill(task, 0) } == 0 && !is_zombie(task) {
        assert!(start.elapsed() < Duration::from_secs(10), "the step's task outlived srun");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nodelist_exclude_constraint_and_exclusive_steer_placement() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), two_agents());
    let pinned = sh.submit(&["-w", "node02", "--gres=gpu:1", "--wrap", "true"]);
    let avoided = sh.submit(&["-x", "node01", "--gres=gpu:1", "--wrap", "true"]);
    assert_eq!(sh.wait_done(pinned, Duration::from_secs(20)), "COMPLETED");
    assert_eq!(sh.wait_done(avoided, Duration::from_secs(20)), "COMPLETED");
    assert_eq!(sh.acct(pinned, "NodeList")[0], "node02");
    assert_eq!(sh.acct(avoided, "NodeList")[0], "node02");

    // --exclusive takes the whole node: all 4 GPUs, and nothing else runs there until it ends.
    let whole = sh.submit(&["--exclusive", "-w", "node01", "--gres=gpu:1", "--wrap", "sleep 3"]);
    sh.wait_state(whole, "RUNNING", Duration::from_secs(20));
    assert_eq!(sh.acct(whole, "AllocTRES")[0], "billing=64,cpu=64,gres/gpu=4,node=1");
    let waiting = sh.submit(&["-w", "node01", "--gres=gpu:1", "--wrap", "true"]);
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(sh.acct(waiting, "State")[0], "PENDING", "node01 is held exclusively");
    assert_eq!(sh.wait_done(waiting, Duration::from_secs(30)), "COMPLETED");
    assert_eq!(sh.acct(whole, "State")[0], "COMPLETED");

    // Requests no node can meet are refused at submit, naming the problem.
    let out = sh.run("sbatch", &["-C", "nvlink", "--wrap", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Requested node configuration is not available"));
    let out = sh.run("sbatch", &["-w", "gpu99", "--wrap", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Invalid node name specified: gpu99"));
    let out = sh.run("sbatch", &["-C", "a|b", "--wrap", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("only AND constraints are supported"));
}

#[test]
fn sprio_and_squeue_start_show_the_schedulers_view_of_waiting_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), two_agents());
    let running = sh.submit(&["-N", "2", "--gres=gpu:4", "-t", "10:00", "--wrap", "sleep 30"]);
    sh.wait_state(running, "RUNNING", Duration::from_secs(20));
    let waiting = sh.submit(&["-N", "2", "--gres=gpu:4", "-t", "5:00", "-J", "next", "--wrap", "true"]);
    let start = Instant::now();
    let line = loop {
        let out = sh.ok("squeue", &["--start", "-h", "-j", &waiting.to_string()]);
        if !out.contains("N/A") && out.contains("(Resources)") {
            break out;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no expected start: {out}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(line.contains("next") && line.contains(" PD "), "{line}");
    let sprio = sh.ok("sprio", &["-j", &waiting.to_string()]);
    let lines: Vec<&str> = sprio.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["JOBID", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS"]
    );
    let row: Vec<u64> = lines[1].split_whitespace().map(|v| v.parse().unwrap()).collect();
    assert_eq!(row[0], waiting);
    assert!(row[1] > 0 && row[1] >= row[2..].iter().sum::<u64>().saturating_sub(5), "{sprio}");
}

/// `--signal=B:USR1@3` with a 6 s limit: the batch shell hears USR1 about 3 s in, then TIMEOUT at 6 s.
#[test]
fn a_warning_signal_comes_ahead_of_the_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), UpOptions { agents: 1, kill_wait_ms: 1_000, ..UpOptions::default() });
    // bash, for $SECONDS (a --wrap script runs under /bin/sh, as Slurm's).
    let script = "#!/bin/bash\ntrap 'echo warned at $SECONDS' USR1; for i in $(seq 300); do sleep 0.1; done\n";
    std::fs::write(sh.cwd.join("warn.sh"), script).unwrap();
    let id = sh.submit(&["--signal=B:USR1@3", "-t", "0:06", "-o", "warn.out", "warn.sh"]);
    assert_eq!(sh.wait_done(id, Duration::from_secs(40)), "TIMEOUT");
    let out = sh.read("warn.out");
    let at: Vec<u32> = out.lines().filter_map(|l| l.strip_prefix("warned at ")?.trim().parse().ok()).collect();
    assert_eq!(at.len(), 1, "one warning: {out}");
    assert!((2..=4).contains(&at[0]), "about 3 s before the 6 s limit: {out}");
}

#[test]
fn a_job_over_its_memory_request_ends_out_of_memory_and_one_within_it_completes() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIPPED: agents confine memory in cgroups only when run as root");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), UpOptions { agents: 1, kill_wait_ms: 1_000, ..UpOptions::default() });
    // `tail` holds the whole "line" of zeros: 400 MiB against a 64 MiB request.
    let hog = sh.submit(&["--mem=64M", "-o", "hog.out", "--wrap", "head -c 400M /dev/zero | tail"]);
    let fine = sh.submit(&["--mem=64M", "-o", "fine.out", "--wrap", "head -c 16M /dev/zero | tail | wc -c"]);
    assert_eq!(sh.wait_done(hog, Duration::from_secs(40)), "OUT_OF_MEMORY");
    assert_eq!(sh.wait_done(fine, Duration::from_secs(40)), "COMPLETED");
    assert_eq!(sh.read("fine.out").trim(), (16 << 20).to_string());
    assert_eq!(sh.acct(hog, "ReqMem,State"), ["64M", "OUT_OF_MEMORY"]);
    let shown = sh.ok("scontrol", &["show", "job", &hog.to_string()]);
    assert!(shown.contains("JobState=OUT_OF_MEMORY") && shown.contains("MinMemoryNode=64M"), "{shown}");
    // A request no node can hold is refused at submission, naming memory.
    let err = sh.err("sbatch", &["--mem=100T", "--wrap", "true"]);
    assert!(err.to_lowercase().contains("mem"), "{err}");
}

#[test]
fn sacct_lists_the_batch_step_and_each_srun_step_with_its_own_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), two_agents());
    let script = "srun -N 2 -n 2 true; srun -N 1 -n 1 sh -c 'exit 3'; exit 0";
    let id = sh.submit(&["-N", "2", "--ntasks-per-node=1", "--wrap", script]);
    assert_eq!(sh.wait_done(id, Duration::from_secs(40)), "COMPLETED");
    let rows = sh.ok("sacct", &["-j", &id.to_string(), "-n", "-P", "-o", "JobID,JobName,State,ExitCode,NNodes,NTasks"]);
    let want = [
        format!("{id}|wrap|COMPLETED|0:0|2|"),
        format!("{id}.batch|batch|COMPLETED|0:0|1|"),
        format!("{id}.0|true|COMPLETED|0:0|2|2"),
        format!("{id}.1|sh|FAILED|3:0|1|1"),
    ];
    assert_eq!(rows.lines().collect::<Vec<_>>(), want, "{rows}");
    // A step named alone, as snakemake asks for the reason of a failure.
    let one = sh.ok("sacct", &["-j", &format!("{id}.1"), "-n", "-P", "-o", "JobID,State"]);
    assert_eq!(one.trim(), format!("{id}.1|FAILED"));
    assert_eq!(sh.ok("sacct", &["-X", "-j", &id.to_string(), "-n", "-P", "-o", "JobID"]).trim(), id.to_string());
}

/// A one-replica cluster (`local up --controllers 1`, a laptop or a test bed) is its own quorum: its leader must
/// renew the nodes' leases, or every job is killed when the first lease runs out.
#[test]
fn a_single_controller_renews_leases_so_a_job_outlives_the_first_lease() {
    let dir = tempfile::tempdir().unwrap();
    let options = UpOptions {
        controllers: 1,
        agents: 1,
        gpus_per_agent: 1,
        agent_heartbeat_ms: 200,
        agent_fence_after_ms: 1_000,
        node_timeout_ms: 1_500,
        kill_wait_ms: 500,
        ..UpOptions::default()
    };
    let (_cluster, sh) = setup(dir.path(), options);
    let id = sh.submit(&["--gres=gpu:1", "--wrap", "sleep 3; echo survived > lease.txt"]);
    assert_eq!(sh.wait_done(id, Duration::from_secs(30)), "COMPLETED", "three leases later, still running");
    assert_eq!(sh.read("lease.txt").trim(), "survived");
    assert_eq!(sh.acct(id, "Restarts")[0], "0", "never fenced, never requeued");
}

/// Test clusters share one host, and every one has a `node01` with a simulated GPU 0: a job running in one must not
/// look like a holder of another's GPU 0 (the agent starts a task only on GPUs no process holds). CI once kept two
/// stories' jobs waiting behind a third story's training run on its own `node01`.
#[test]
fn a_job_in_another_cluster_on_the_same_host_does_not_hold_this_clusters_gpus() {
    let one_gpu = || UpOptions { controllers: 1, agents: 1, gpus_per_agent: 1, ..UpOptions::default() };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_a, sh_a) = setup(dir_a.path(), one_gpu());
    let (_b, sh_b) = setup(dir_b.path(), one_gpu());
    let busy = sh_a.submit(&["--gres=gpu:1", "--wrap", "sleep 300"]);
    sh_a.wait_state(busy, "RUNNING", Duration::from_secs(20));
    // The task itself runs (not only its allocation): its output names its GPU.
    let id = sh_b.submit(&["--gres=gpu:1", "-o", "b.out", "--wrap", "echo gpu=$CUDA_VISIBLE_DEVICES"]);
    assert_eq!(sh_b.wait_done(id, Duration::from_secs(30)), "COMPLETED");
    assert_eq!(sh_b.read("b.out").trim(), "gpu=0");
    sh_a.ok("scancel", &[&busy.to_string()]);
}

/// When `salloc`'s command ends, a step it left behind may ignore SIGTERM and live until the node's KillWait runs
/// out. The GPUs it holds go to nobody else until that node's agent has seen it gone: the next job is RUNNING only
/// once the old step's process has died (issue 28, finding 6; before, the first node's GPUs were free at once).
#[test]
fn an_allocations_gpus_go_to_the_next_job_only_after_its_stubborn_step_has_died() {
    let dir = tempfile::tempdir().unwrap();
    let options = UpOptions { agents: 1, gpus_per_agent: 1, kill_wait_ms: 3_000, ..UpOptions::default() };
    let (_cluster, sh) = setup(dir.path(), options);
    let step = "trap '' TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done\n";
    std::fs::write(sh.cwd.join("stubborn.sh"), step).unwrap();
    // srun's output goes elsewhere: it outlives salloc, and the story must not wait for it to close salloc's pipes.
    let command = "srun sh stubborn.sh >srun.out 2>&1 & while [ ! -s stubborn.pid ]; do sleep 0.1; done";
    let out = sh.run("salloc", &["--gres=gpu:1", "sh", "-c", command]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pid: i32 = sh.read("stubborn.pid").trim().parse().unwrap();
    let next = sh.submit(&["--gres=gpu:1", "--wrap", "true"]);
    // The step is still alive (it ignored SIGTERM) ...
    let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let mut saw_alive = false;
    loop {
        let state = sh.acct(next, "State").remove(0);
        if state != "PENDING" {
            // ... and the next job got the GPU only after it died.
            assert!(!alive(pid), "job {next} is {state} while the allocation's step {pid} still runs on its GPU");
            break;
        }
        saw_alive |= alive(pid);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(saw_alive, "the step outlived its allocation for a while (KillWait), or the story proves nothing");
    assert_eq!(sh.wait_done(next, Duration::from_secs(30)), "COMPLETED");
}

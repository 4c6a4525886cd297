//! The scheduler's commands end to end: job arrays, dependencies, accounts and fair-share, QOS limits, advance
//! reservations, `scontrol top` and `--gpus`, through Slurm's command names against real controllers and agents
//! (simulated GPUs) on loopback.

use std::path::Path;
use std::time::{Duration, Instant};

use drover_cli::local::{LocalCluster, UpOptions};

mod common;

use common::Shell;

impl Shell {
    /// `drover SUBCOMMAND ...` (accounts, QOS).
    fn drover(&self, args: &[&str]) -> std::process::Output {
        self.command("drover", args).output().expect("drover runs")
    }

    fn drover_ok(&self, args: &[&str]) -> String {
        let out = self.drover(args);
        assert!(out.status.success(), "drover {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// `sacct -P` rows (`-o fields`) of a job or array, one per job.
    fn acct_rows(&self, id: &str, fields: &str) -> Vec<Vec<String>> {
        let out = self.ok("sacct", &["-X", "-j", id, "-n", "-P", "-o", fields]);
        out.lines().map(|l| l.split('|').map(str::to_string).collect()).collect()
    }

    fn state(&self, id: &str) -> String {
        self.acct_rows(id, "State").first().map(|r| r[0].clone()).unwrap_or_default()
    }

    fn wait_for(&self, what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < timeout, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_done(&self, id: &str, timeout: Duration) -> String {
        let mut last = String::new();
        self.wait_for(&format!("job {id} to end"), timeout, || {
            last = self.state(id);
            !["PENDING", "RUNNING", "COMPLETING", ""].contains(&last.as_str())
        });
        last
    }

    /// squeue's reason for one pending job.
    fn reason(&self, id: &str) -> String {
        self.ok("squeue", &["-h", "-r", "-j", id, "-o", "%r"]).trim().to_string()
    }
}

fn setup(dir: &Path, agents: usize, gpus: u32) -> (LocalCluster, Shell) {
    common::setup(dir, UpOptions { agents, gpus_per_agent: gpus, kill_wait_ms: 1_000, ..UpOptions::default() })
}

#[test]
fn a_throttled_array_runs_every_task_at_most_two_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), 1, 8);
    let script = "#!/bin/sh\n#SBATCH --array=0-5%2\n#SBATCH --gres=gpu:1\necho task=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID count=$SLURM_ARRAY_TASK_COUNT\nsleep 1\n";
    std::fs::write(sh.cwd.join("array.sh"), script).unwrap();
    let id = sh.submit(&["array.sh"]);
    // Pending tasks share one squeue line, as Slurm prints them.
    let queue = sh.ok("squeue", &["-h", "-o", "%i %r"]);
    assert!(queue.lines().any(|l| l.starts_with(&format!("{id}_[")) && l.contains("%2]")), "{queue}");
    let mut most_running = 0;
    sh.wait_for("the array to finish", Duration::from_secs(60), || {
        let rows = sh.acct_rows(&id.to_string(), "State");
        let running = rows.iter().filter(|r| r[0] == "RUNNING").count();
        most_running = most_running.max(running);
        rows.len() == 6 && rows.iter().all(|r| r[0] == "COMPLETED")
    });
    assert!(most_running <= 2, "{most_running} tasks ran at once under %2");
    let rows = sh.acct_rows(&id.to_string(), "JobID,State");
    let ids: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let want: Vec<String> = (0..6).map(|t| format!("{id}_{t}")).collect();
    assert_eq!(ids, want);
    for t in 0..6 {
        let out = std::fs::read_to_string(sh.cwd.join(format!("slurm-{id}_{t}.out"))).unwrap();
        assert_eq!(out.trim(), format!("task={t} of {id} count=6"));
    }
    // One task can be named on its own.
    assert_eq!(sh.acct_rows(&format!("{id}_4"), "JobID")[0][0], format!("{id}_4"));
    let shown = sh.ok("scontrol", &["show", "job", &format!("{id}_3")]);
    assert!(shown.contains(&format!("ArrayJobId={id} ArrayTaskId=3 ArrayTaskThrottle=2")), "{shown}");

    // scancel of one task leaves the others; scancel of the array id takes them all.
    let held = sh.submit(&["--array=1-3", "--hold", "--wrap", "true"]);
    sh.ok("scancel", &[&format!("{held}_2")]);
    assert!(sh.state(&format!("{held}_2")).starts_with("CANCELLED"));
    assert_eq!(sh.state(&format!("{held}_1")), "PENDING");
    sh.ok("scancel", &[&held.to_string()]);
    let rows = sh.acct_rows(&held.to_string(), "State");
    assert!(rows.len() == 3 && rows.iter().all(|r| r[0].starts_with("CANCELLED")), "{rows:?}");
    // An array task that never was: nothing to cancel, which Slurm 22.05 answers with success and silence.
    let none = sh.run("scancel", &[&format!("{held}_9")]);
    assert!(none.status.success() && none.stderr.is_empty(), "{none:?}");
    let said = String::from_utf8(sh.run("scancel", &["-v", &format!("{held}_9")]).stderr).unwrap();
    assert!(said.contains(&format!("Kill job error on job id {held}_9: Invalid job id specified")), "{said}");

    // Waiting tasks show their array ids in sprio too.
    let wide = sh.submit(&["--array=0-2", "--gres=gpu:8", "-t", "1:00", "--wrap", "sleep 5"]);
    sh.wait_for("sprio rows for the waiting tasks", Duration::from_secs(10), || {
        let out = sh.ok("sprio", &["-h", "-j", &wide.to_string()]);
        out.contains(&format!("{wide}_1")) && out.contains(&format!("{wide}_2"))
    });
    sh.ok("scancel", &[&wide.to_string()]);
}

#[test]
fn dependencies_hold_jobs_until_their_targets_end_the_right_way() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), 1, 4);
    let first = sh.submit(&["--wrap", "sleep 2"]);
    let after_ok = sh.submit(&["-d", &format!("afterok:{first}"), "--wrap", "true"]);
    let on_fail = sh.submit(&["-d", &format!("afternotok:{first}"), "--wrap", "true"]);
    sh.wait_for("the Dependency reason", Duration::from_secs(10), || sh.reason(&after_ok.to_string()) == "Dependency");
    let shown = sh.ok("scontrol", &["show", "job", &after_ok.to_string()]);
    assert!(shown.contains(&format!("Dependency=afterok:{first}")), "{shown}");
    assert_eq!(sh.wait_done(&after_ok.to_string(), Duration::from_secs(30)), "COMPLETED");
    sh.wait_for("DependencyNeverSatisfied", Duration::from_secs(10), || {
        sh.reason(&on_fail.to_string()) == "DependencyNeverSatisfied"
    });
    let failing = sh.submit(&["--wrap", "exit 3"]);
    let cleanup = sh.submit(&["-d", &format!("afternotok:{failing}"), "--wrap", "true"]);
    let doomed = sh.submit(&["--kill-on-invalid-dep=yes", "-d", &format!("afterok:{failing}"), "--wrap", "true"]);
    assert_eq!(sh.wait_done(&cleanup.to_string(), Duration::from_secs(30)), "COMPLETED");
    // --kill-on-invalid-dep=yes: cancelled once its dependency can never hold, as Slurm shows it.
    assert_eq!(sh.wait_done(&doomed.to_string(), Duration::from_secs(10)), "CANCELLED");
    let shown = sh.ok("scontrol", &["show", "job", &doomed.to_string()]);
    assert!(shown.contains("JobState=CANCELLED Reason=DependencyNeverSatisfied"), "{shown}");
    // singleton: the second job of the same name waits for the first.
    let one = sh.submit(&["-J", "solo", "-d", "singleton", "--wrap", "sleep 2"]);
    let two = sh.submit(&["-J", "solo", "-d", "singleton", "--wrap", "true"]);
    sh.wait_for("the singleton to wait", Duration::from_secs(10), || sh.reason(&two.to_string()) == "Dependency");
    assert_eq!(sh.state(&one.to_string()), "RUNNING");
    assert_eq!(sh.wait_done(&two.to_string(), Duration::from_secs(30)), "COMPLETED");
    let err = sh.err("sbatch", &["-d", "afterok:999999", "--wrap", "true"]);
    assert!(err.contains("Job dependency problem: job 999999 does not exist"), "{err}");

    // A pending job's request changes with scontrol update, checked like a submission.
    let held = sh.submit(&["--hold", "-t", "10:00", "--wrap", "true"]);
    let dep = format!("Dependency=afterok:{failing}");
    sh.ok("scontrol", &["update", &format!("jobid={held}"), "TimeLimit=5:00", "Nice=5", &dep]);
    let shown = sh.ok("scontrol", &["show", "job", &held.to_string()]);
    assert!(shown.contains(&format!("Dependency=afterok:{failing}")) && shown.contains("Nice=5"), "{shown}");
    assert!(shown.contains("TimeLimit=00:05:00"), "scontrol pads its times as Slurm's does: {shown}");
    let err = sh.err("scontrol", &["update", &format!("jobid={held}"), "QOS=gold"]);
    assert!(err.contains("Invalid qos specification: gold"), "{err}");
    sh.ok("scancel", &[&held.to_string()]);
}

#[test]
fn accounts_qos_and_fairshare_through_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), 1, 4);
    sh.drover_ok(&["account", "add", "physics", "--fairshare", "3"]);
    sh.drover_ok(&["account", "add", "bio"]);
    sh.drover_ok(&["account", "add", "lattice", "--parent", "physics", "--users", "root"]);
    let err = String::from_utf8(sh.drover(&["account", "add", "physics"]).stderr).unwrap();
    assert!(err.contains("account physics already exists"), "{err}");
    let tree = sh.drover_ok(&["account", "list"]);
    assert!(tree.contains(" physics") && tree.contains("  lattice"), "{tree}");

    let err = sh.err("sbatch", &["-A", "nope", "--wrap", "true"]);
    assert!(err.contains("Invalid account or account/partition combination specified: nope"), "{err}");
    // A job without --account charges the account listing its user.
    let job = sh.submit(&["--gres=gpu:2", "--wrap", "sleep 1"]);
    assert_eq!(sh.wait_done(&job.to_string(), Duration::from_secs(30)), "COMPLETED");
    assert_eq!(sh.acct_rows(&job.to_string(), "Account")[0][0], "lattice");
    let shares = sh.ok("sshare", &["-P", "-n"]);
    let row = |name: &str| -> Vec<String> {
        let line = shares
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name}|")))
            .unwrap_or_else(|| panic!("{shares}"));
        line.split('|').map(|c| c.trim().to_string()).collect()
    };
    assert_eq!(row("physics")[2], "3");
    assert!((row("physics")[3].parse::<f64>().unwrap() - 0.75).abs() < 1e-6, "{shares}");
    assert!(row("lattice")[4].parse::<f64>().unwrap() >= 2.0, "two GPUs for a second were charged: {shares}");
    assert!(row("bio")[6].parse::<f64>().unwrap() > row("lattice")[6].parse::<f64>().unwrap(), "{shares}");

    // A QOS limit of one running job per user: the second waits with Slurm's reason.
    sh.drover_ok(&["qos", "add", "small", "--max-jobs-per-user", "1", "--priority", "10"]);
    let listed = sh.drover_ok(&["qos", "list"]);
    assert!(listed.contains("small") && listed.contains("normal"), "{listed}");
    let a = sh.submit(&["-q", "small", "-A", "bio", "--wrap", "sleep 3"]);
    let b = sh.submit(&["-q", "small", "-A", "bio", "--wrap", "true"]);
    sh.wait_for("the QOS limit reason", Duration::from_secs(10), || {
        sh.reason(&b.to_string()) == "QOSMaxJobsPerUserLimit"
    });
    assert_eq!(sh.state(&a.to_string()), "RUNNING");
    assert_eq!(sh.wait_done(&b.to_string(), Duration::from_secs(30)), "COMPLETED");
    let err = sh.err("sbatch", &["-q", "gold", "--wrap", "true"]);
    assert!(err.contains("Invalid qos specification: gold"), "{err}");

    // Partitions change their tier, limits and allow lists at run time.
    sh.ok("scontrol", &["update", "partitionname=gpu", "prioritytier=2", "allowqos=small", "maxtresperjob=gres/gpu=2"]);
    let shown = sh.ok("scontrol", &["show", "partition", "gpu"]);
    assert!(shown.contains("AllowQos=small") && shown.contains("PriorityTier=2"), "{shown}");
    assert!(shown.contains("MaxTRESPerJob=gres/gpu=2"), "{shown}");
    let err = sh.err("sbatch", &["-A", "bio", "--wrap", "true"]);
    assert!(err.contains("partition gpu allows only QOS small"), "{err}");
    let err = sh.err("sbatch", &["-A", "bio", "-q", "small", "--gres=gpu:4", "--wrap", "true"]);
    assert!(err.contains("over partition gpu's MaxTRESPerJob of gres/gpu=2"), "{err}");
    // --gpus-per-task multiplies by the tasks on a node.
    let per_task = sh.submit(&[
        "-A",
        "bio",
        "-q",
        "small",
        "-n",
        "2",
        "--gpus-per-task=1",
        "--wrap",
        "echo $SLURM_GPUS_ON_NODE $SLURM_GPUS_PER_TASK",
    ]);
    assert_eq!(sh.wait_done(&per_task.to_string(), Duration::from_secs(30)), "COMPLETED");
    let out = std::fs::read_to_string(sh.cwd.join(format!("slurm-{per_task}.out"))).unwrap();
    assert_eq!(out.trim(), "2 1");
}

#[test]
fn a_reservation_keeps_its_node_for_its_users() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), 2, 4);
    let out = sh.ok(
        "scontrol",
        &[
            "create",
            "reservation",
            "ReservationName=big_run",
            "StartTime=now",
            "Duration=60",
            "Nodes=node01",
            "Users=someone_else",
        ],
    );
    assert!(out.contains("Reservation created: big_run"), "{out}");
    let table = sh.ok("sinfo", &["-T"]);
    assert!(table.contains("big_run") && table.contains("ACTIVE") && table.contains("node01"), "{table}");
    let shown = sh.ok("scontrol", &["show", "reservation", "big_run"]);
    assert!(shown.contains("Nodes=node01 NodeCnt=1") && shown.contains("Users=someone_else"), "{shown}");
    // Outsiders' jobs go around the reserved node, and cannot name the reservation.
    let outside = sh.submit(&["-N", "1", "--gres=gpu:4", "--wrap", "true"]);
    assert_eq!(sh.wait_done(&outside.to_string(), Duration::from_secs(30)), "COMPLETED");
    assert_eq!(sh.acct_rows(&outside.to_string(), "NodeList")[0][0], "node02");
    let err = sh.err("sbatch", &["--reservation=big_run", "--wrap", "true"]);
    assert!(err.contains("Requested reservation is invalid: big_run: Access denied"), "{err}");
    let blocked = sh.submit(&["-w", "node01", "--wrap", "true"]);
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(sh.state(&blocked.to_string()), "PENDING", "node01 is reserved");
    // Its users get in; an overlapping reservation is refused.
    sh.ok("scontrol", &["update", "ReservationName=big_run", "Users=someone_else,root"]);
    // A job must end inside the reservation: it states a time limit shorter than the reservation.
    let inside = sh.submit(&["--reservation=big_run", "-t", "5", "--gres=gpu:1", "--wrap", "true"]);
    assert_eq!(sh.wait_done(&inside.to_string(), Duration::from_secs(30)), "COMPLETED");
    assert_eq!(sh.acct_rows(&inside.to_string(), "NodeList")[0][0], "node01");
    let err = sh.err(
        "scontrol",
        &[
            "create",
            "reservation",
            "ReservationName=clash",
            "StartTime=now",
            "Duration=10",
            "Nodes=node01",
            "Users=root",
        ],
    );
    assert!(err.contains("Requested nodes are busy"), "{err}");
    sh.ok("scontrol", &["delete", "ReservationName=big_run"]);
    assert_eq!(sh.wait_done(&blocked.to_string(), Duration::from_secs(30)), "COMPLETED");
    assert!(sh.ok("scontrol", &["show", "reservation"]).contains("No reservations in the system"));
}

#[test]
fn gpus_spread_over_nodes_and_top_reorders_a_users_queue() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), 2, 4);
    // --gpus=8 on 4-GPU nodes: two nodes of four.
    let wide = sh.submit(&["--gpus=8", "--wrap", "echo $SLURM_JOB_NUM_NODES $SLURM_GPUS_ON_NODE"]);
    assert_eq!(sh.wait_done(&wide.to_string(), Duration::from_secs(30)), "COMPLETED");
    assert!(sh.acct_rows(&wide.to_string(), "AllocTRES")[0][0].contains("gres/gpu=8"));
    let out = std::fs::read_to_string(sh.cwd.join(format!("slurm-{wide}.out"))).unwrap();
    assert_eq!(out.trim(), "2 4");
    let err = sh.err("sbatch", &["--gpus=7", "--wrap", "true"]);
    assert!(err.contains("cannot be spread evenly"), "{err}");

    // Fill the cluster, queue two whole-cluster jobs, then top the later one: it starts first.
    let blocker = sh.submit(&["-N", "2", "--gres=gpu:4", "-t", "5:00", "--wrap", "sleep 30"]);
    sh.wait_for("the blocker to run", Duration::from_secs(20), || sh.state(&blocker.to_string()) == "RUNNING");
    let early = sh.submit(&["-N", "2", "--gres=gpu:4", "-t", "1:00", "--wrap", "sleep 5"]);
    let late = sh.submit(&["-N", "2", "--gres=gpu:4", "-t", "1:00", "--wrap", "sleep 5"]);
    sh.ok("scontrol", &["top", &late.to_string()]);
    let priority = |id: u64| -> u64 {
        let out = sh.ok("sprio", &["-h", "-j", &id.to_string()]);
        out.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0)
    };
    sh.wait_for("top to show in sprio", Duration::from_secs(10), || {
        priority(late) >= priority(early) && priority(late) > 0
    });
    sh.ok("scancel", &[&blocker.to_string()]);
    sh.wait_for("a queued job to start", Duration::from_secs(20), || {
        sh.state(&late.to_string()) == "RUNNING" || sh.state(&early.to_string()) == "RUNNING"
    });
    assert_eq!(sh.state(&late.to_string()), "RUNNING", "the topped job starts first");
    assert_eq!(sh.state(&early.to_string()), "PENDING");
    sh.ok("scancel", &[&early.to_string(), &late.to_string()]);
}

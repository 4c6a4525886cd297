//! Beyond requeue, on a real local cluster with simulated GPUs (fault files): a job that stops making progress is
//! requeued as hung and resumes from its checkpoint on another node; each XID remedy takes its own action (the
//! job alone, one GPU, the node); a node that kills job after job is quarantined; a job that fails right after
//! resuming falls back to the checkpoint before; a failing health-check program drains its node.

use std::time::Duration;

use drover_cli::local::UpOptions;

mod common;

use common::{Shell, setup};

/// Fast timing, two nodes of two GPUs.
fn options() -> UpOptions {
    UpOptions {
        agents: 2,
        gpus_per_agent: 2,
        agent_heartbeat_ms: 200,
        agent_fence_after_ms: 1_500,
        node_timeout_ms: 2_500,
        kill_wait_ms: 1_000,
        agent_fault_files: true,
        ..UpOptions::default()
    }
}

/// Counts to 20 (0.1 s a step), touches the progress marker each step, records a checkpoint every 5 steps (and
/// says so with `drover progress`), resumes from `DROVER_RESUME_FROM`. `HOOK` runs after each step.
const COUNTER: &str = r#"#!/bin/bash
trap 'echo "warned ${SLURM_RESTART_COUNT:-0}" >> warned.log' USR1
step=0
if [ -n "$DROVER_RESUME_FROM" ]; then step=$(cat "$DROVER_RESUME_FROM"); fi
echo "start ${SLURM_RESTART_COUNT:-0} $step $SLURMD_NODENAME $SLURM_JOB_GPUS $DROVER_RESUME_FROM" >> steps.log
while [ "$step" -lt 20 ]; do
  step=$((step + 1))
  sleep 0.1
  echo "$step" > "$DROVER_CHECKPOINT_DIR/PROGRESS"
  if [ $((step % 5)) -eq 0 ]; then
    f="$DROVER_CHECKPOINT_DIR/step-$step"
    echo "$step" > "$f.tmp" && mv "$f.tmp" "$f"
    drover checkpoint record "$f" --step "$step"
    drover progress --step "$step"
  fi
  HOOK
done
echo "done ${SLURM_RESTART_COUNT:-0} $step $SLURMD_NODENAME" >> steps.log
"#;

impl Shell {
    fn counter(&self, hook: &str, args: &[&str]) -> u64 {
        std::fs::write(self.cwd.join("counter.sh"), COUNTER.replace("HOOK", hook)).unwrap();
        let mut all = vec!["-N", "1", "--gres=gpu:1", "-o", "counter.out", "-e", "counter.out"];
        all.extend_from_slice(args);
        all.push("counter.sh");
        self.submit(&all)
    }

    fn wait_for(&self, what: &str, timeout: Duration, mut done: impl FnMut(&Shell) -> bool) {
        let deadline = std::time::Instant::now() + timeout;
        while !done(self) {
            if std::time::Instant::now() >= deadline {
                let queue = self.ok("squeue", &["-a", "-o", "%i %T %r %N"]);
                let nodes = self.ok("scontrol", &["show", "node"]);
                panic!("timed out waiting for {what}; log:\n{}\nqueue:\n{queue}\nnodes:\n{nodes}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn state(&self, id: u64) -> String {
        let out = self.ok("sacct", &["-X", "-j", &id.to_string(), "-n", "-P", "-o", "State"]);
        out.split_whitespace().next().unwrap_or_default().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.cwd.join("steps.log")).unwrap_or_default()
    }

    /// The `start` lines: (incarnation, step resumed at, node, GPUs, checkpoint).
    fn starts(&self) -> Vec<Vec<String>> {
        self.log()
            .lines()
            .filter(|l| l.starts_with("start "))
            .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
            .collect()
    }

    fn show_job(&self, id: u64) -> String {
        self.ok("scontrol", &["show", "job", &id.to_string()])
    }

    fn show_node(&self, node: &str) -> String {
        self.ok("scontrol", &["show", "node", node])
    }
}

#[test]
fn a_job_that_stops_making_progress_is_warned_requeued_as_hung_and_resumes_elsewhere_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), options());
    // Incarnation 0 hangs at step 12 (after its checkpoint at 10), as a rank stuck in a collective would.
    let hang =
        r#"if [ "$step" -eq 12 ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then while true; do sleep 0.2; done; fi"#;
    let id = sh.counter(hang, &["--progress-timeout=0:03", "--signal=B:USR1@1"]);
    sh.wait_for("a first step", Duration::from_secs(30), |sh| sh.log().contains("start 0"));
    sh.wait_for("progress shown", Duration::from_secs(30), |sh| {
        let show = sh.show_job(id);
        show.contains("ProgressTimeout=00:00:03") && !show.contains("LastProgress=Unknown")
    });
    let squeue = sh.ok("squeue", &["-h", "-j", &id.to_string(), "-O", "JobID,LastProgress,ProgressStep"]);
    assert!(squeue.split_whitespace().count() == 3, "{squeue}");
    sh.wait_for("the job to complete", Duration::from_secs(60), |sh| sh.state(id) == "COMPLETED");

    let starts = sh.starts();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_eq!(starts[1][1], "10", "resumed from the checkpoint at step 10: {starts:?}");
    assert_ne!(starts[0][2], starts[1][2], "the next incarnation avoids the node it hung on: {starts:?}");
    let show = sh.show_job(id);
    assert!(show.contains("Restart[0]=State:REQUEUED") && show.contains("Reason:Hung:_no_progress_for"), "{show}");
    let warned = std::fs::read_to_string(sh.cwd.join("warned.log")).unwrap_or_default();
    assert_eq!(warned.trim(), "warned 0", "the warning signal first (a framework dumps its stacks)");
    // The hang is charged to the node it happened on.
    assert!(sh.show_node(&starts[0][2]).contains("job_1_hung"), "{}", sh.show_node(&starts[0][2]));
}

#[test]
fn each_xid_remedy_takes_its_own_action() {
    let dir = tempfile::tempdir().unwrap();
    let reset = dir.path().join("reset.sh");
    // The reset takes 2 s, so the drained GPU can be seen; it records which GPU it reset.
    std::fs::write(&reset, format!("#!/bin/sh\nsleep 2\necho \"$1\" >> {}\n", dir.path().join("reset.log").display()))
        .unwrap();
    std::fs::set_permissions(&reset, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let command = format!("gpu_reset_command = \"{} {{gpu}}\"", reset.display());
    let (cluster, sh) = setup(dir.path(), UpOptions { agent_toml: vec![command.clone(), command], ..options() });
    let slow = "sleep 0.5";

    // Restart the application (XID 13): the job on that GPU alone is requeued; its node stays in service.
    let a = sh.counter(slow, &["-w", "node01"]);
    sh.wait_for("job a running", Duration::from_secs(30), |sh| sh.log().contains("start 0"));
    let gpu = sh.starts()[0][3].clone();
    std::fs::write(cluster.fault_file("node01"), format!("{gpu} xid 13\n")).unwrap();
    sh.wait_for("job a requeued", Duration::from_secs(30), |sh| sh.starts().len() == 2);
    assert!(sh.ok("sinfo", &["-R", "-h"]).trim().is_empty(), "no node drained");
    assert!(sh.show_job(a).contains("XID_13"), "{}", sh.show_job(a));
    sh.ok("scancel", &[&a.to_string()]);

    // Reset the GPU (XID 48): that GPU alone is drained; a 1-GPU job runs on the node's other GPU meanwhile;
    // once idle it is reset and returns.
    std::fs::write(cluster.fault_file("node02"), "0 xid 48\n").unwrap();
    sh.wait_for("GPU 0 drained", Duration::from_secs(20), |sh| sh.show_node("node02").contains("DrainedGpu[0]"));
    assert!(!sh.show_node("node02").contains("State=DRAIN"), "{}", sh.show_node("node02"));
    sh.wait_for("GPU 0 reset and back", Duration::from_secs(20), |sh| {
        !sh.show_node("node02").contains("DrainedGpu[0]")
    });
    let resets = std::fs::read_to_string(dir.path().join("reset.log")).unwrap();
    assert_eq!(resets.trim(), "0", "the reset command ran once, for GPU 0");

    // Hardware (XID 64): the node is drained and stays so.
    std::fs::write(cluster.fault_file("node02"), "0 xid 48\n1 xid 64\n").unwrap();
    sh.wait_for("node02 drained", Duration::from_secs(20), |sh| {
        sh.ok("sinfo", &["-R", "-h", "-o", "%E"]).contains("replace the GPU")
    });
}

#[test]
fn one_bad_gpu_leaves_the_other_in_service() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = setup(dir.path(), options());
    // No reset command: the GPU stays out until an operator returns it.
    std::fs::write(cluster.fault_file("node01"), "1 xid 48\n").unwrap();
    sh.wait_for("GPU 1 drained", Duration::from_secs(20), |sh| sh.show_node("node01").contains("DrainedGpu[1]"));
    let id = sh.counter("", &["-w", "node01"]);
    sh.wait_for("the job to complete", Duration::from_secs(30), |sh| sh.state(id) == "COMPLETED");
    assert_eq!(sh.starts()[0][3], "0", "it got the GPU still in service");
    sh.ok("drover", &["node", "gpus", "resume", "node01", "1"]);
    assert!(!sh.show_node("node01").contains("DrainedGpu"), "{}", sh.show_node("node01"));
    let refused = sh.err("drover", &["node", "gpus", "drain", "node01", "7", "--reason", "x"]);
    assert!(refused.contains("no GPU 7"), "{refused}");
}

#[test]
fn a_node_that_kills_three_jobs_is_quarantined_with_its_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = setup(dir.path(), options());
    let mut faults = String::new();
    for n in 0..3 {
        let script = "#!/bin/sh\necho $SLURM_JOB_GPUS > gpu.$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}\nsleep 60\n";
        std::fs::write(sh.cwd.join("victim.sh"), script).unwrap();
        let id = sh.submit(&["-w", "node01", "--gres=gpu:1", "-o", "/dev/null", "victim.sh"]);
        let marker = sh.cwd.join(format!("gpu.{id}.0"));
        sh.wait_for("the job running", Duration::from_secs(30), |_| marker.exists());
        // Its GPU throws an error (XID 13): the job is requeued and the node charged.
        faults.push_str(&format!("{} xid 13\n", std::fs::read_to_string(&marker).unwrap().trim()));
        std::fs::write(cluster.fault_file("node01"), &faults).unwrap();
        sh.wait_for("the job requeued", Duration::from_secs(30), |sh| {
            sh.ok("sacct", &["-X", "-j", &id.to_string(), "-n", "-P", "-o", "Restarts"]).trim() != "0"
        });
        sh.ok("scancel", &[&id.to_string()]);
        if n < 2 {
            std::thread::sleep(Duration::from_millis(500));
            assert!(!sh.ok("sinfo", &["-R", "-h"]).contains("node01"), "after job {n}");
        }
    }
    sh.wait_for("node01 quarantined", Duration::from_secs(20), |sh| {
        let reason = sh.ok("sinfo", &["-R", "-h", "-o", "%E"]);
        reason.contains("quarantined: 3 failures in 24 h") && reason.contains("XID 13")
    });
    assert!(sh.show_node("node01").contains("RecentFailures="), "{}", sh.show_node("node01"));
    sh.ok("scontrol", &["update", "nodename=node01", "state=resume"]);
    assert!(!sh.show_node("node01").contains("RecentFailures"), "resumed: forgiven");
}

#[test]
fn a_job_that_fails_right_after_resuming_falls_back_to_the_checkpoint_before() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, sh) = setup(dir.path(), options());
    // Incarnation 1 cannot load the checkpoint at step 10 (it crashes at once); the one at step 5 is fine.
    let hook = "sleep 0.2";
    let script_prefix = r#"if [[ "$DROVER_RESUME_FROM" == */step-10 ]]; then echo "cannot load $DROVER_RESUME_FROM" >> steps.log; exit 1; fi"#;
    let script = COUNTER.replace("HOOK", hook).replacen("step=0\n", &format!("step=0\n{script_prefix}\n"), 1);
    std::fs::write(sh.cwd.join("counter.sh"), script).unwrap();
    let id = sh.submit(&["-N", "1", "--gres=gpu:1", "-o", "counter.out", "-e", "counter.out", "counter.sh"]);
    sh.wait_for("the checkpoint at 10", Duration::from_secs(30), |sh| sh.show_job(id).contains("CheckpointStep=10"));
    let node = sh.starts()[0][2].clone();
    std::fs::write(cluster.fault_file(&node), "0 xid 79\n1 xid 79\n").unwrap();
    sh.wait_for("the job to complete", Duration::from_secs(60), |sh| sh.state(id) == "COMPLETED");

    // Incarnation 1 died before its first line; incarnation 2 resumed from step 5.
    let starts = sh.starts();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_eq!((starts[1][0].as_str(), starts[1][1].as_str()), ("2", "5"), "{starts:?}");
    assert!(sh.log().contains("cannot load") && sh.log().contains("/step-10"), "{}", sh.log());
    let show = sh.show_job(id);
    assert!(show.contains("BadCheckpoints=") && show.contains("/step-10"), "{show}");
    assert!(show.contains("Restart[1]=State:FAILED") && show.contains("now_marked_bad"), "{show}");
}

#[test]
fn a_failing_health_check_drains_its_node_and_its_job_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let check = dir.path().join("nhc.sh");
    let sick = dir.path().join("sick");
    std::fs::write(
        &check,
        format!(
            "#!/bin/sh\nif [ -e {} ]; then echo 'ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted'; exit 1; fi\n",
            sick.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&check, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let toml = format!("health_check_program = {:?}\nhealth_check_interval_s = 1", check.display().to_string());
    let (_cluster, sh) = setup(dir.path(), UpOptions { agent_toml: vec![String::new(), toml], ..options() });
    let id = sh.submit(&["-w", "node02", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 30"]);
    sh.wait_for("the job running", Duration::from_secs(30), |sh| sh.state(id) == "RUNNING");
    std::fs::write(&sick, "").unwrap();
    sh.wait_for("node02 drained", Duration::from_secs(20), |sh| {
        sh.ok("sinfo", &["-R", "-h", "-o", "%E"]).contains("health check: check_fs_mount: /scratch not mounted")
    });
    assert_eq!(sh.state(id), "RUNNING", "a drain, not a kill: the job runs on");
    sh.ok("scancel", &[&id.to_string()]);
}

#[test]
fn scontrol_reboot_asap_waits_for_the_node_to_empty_then_runs_the_reboot_program_and_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("reboot.sh");
    let rebooted = dir.path().join("rebooted");
    std::fs::write(&program, format!("#!/bin/sh\necho rebooted >> {}\n", rebooted.display())).unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let toml = format!("reboot_program = {:?}", program.display().to_string());
    let (_cluster, sh) = setup(dir.path(), UpOptions { agent_toml: vec![toml], ..options() });
    let busy = sh.submit(&["-w", "node01", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 3"]);
    sh.wait_for("the job running", Duration::from_secs(30), |sh| sh.state(busy) == "RUNNING");
    sh.ok("scontrol", &["reboot", "ASAP", "nextstate=RESUME", "reason=new driver", "node01"]);
    let show = sh.show_node("node01");
    assert!(show.contains("+DRAIN+REBOOT_REQUESTED") && show.contains("RebootRequested=ASAP"), "{show}");
    let waiting = sh.submit(&["-w", "node01", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true"]);
    std::thread::sleep(Duration::from_secs(1));
    assert!(!rebooted.exists(), "not while a job runs there");
    assert_eq!(sh.state(waiting), "PENDING", "no new job on a node waiting for its reboot");
    sh.wait_for("the reboot and the node back", Duration::from_secs(30), |sh| {
        let show = sh.show_node("node01");
        !show.contains("REBOOT") && !show.contains("DRAIN")
    });
    assert_eq!(std::fs::read_to_string(&rebooted).unwrap().lines().count(), 1, "the program ran once");
    assert_eq!(sh.state(busy), "COMPLETED", "ASAP let the running job finish");
    sh.wait_for("the waiting job to run", Duration::from_secs(30), |sh| sh.state(waiting) == "COMPLETED");
    let refused = sh.err("scontrol", &["reboot", "nextstate=LATER", "node01"]);
    assert!(refused.contains("Invalid nextstate"), "{refused}");
}

//! The Slurm personalities, driven as a user would: the `drover` binary under Slurm's names, against a real
//! local cluster.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use drover_cli::local::{LocalCluster, UpOptions};

mod common;

use common::Shell;

fn setup(dir: &Path) -> (LocalCluster, Shell) {
    let extra = "[cluster]\ncluster_name = \"test\"\n[[cluster.partitions]]\nname = \"gpu\"\ndefault = true\nmax_time_s = 86400\nmax_nodes = 4\n[[cluster.partitions]]\nname = \"debug\"\nmax_time_s = 600\n";
    let cluster =
        LocalCluster::up(&dir.join("cluster"), UpOptions { extra_toml: extra.into(), ..UpOptions::default() }).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(cluster.wait_ready(Duration::from_secs(30))).unwrap();
    let shell = Shell::install(dir, &cluster);
    (cluster, shell)
}

#[test]
fn a_user_submits_inspects_holds_and_cancels_jobs_with_slurm_commands() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path());
    std::fs::write(
        sh.cwd.join("train.sh"),
        "#!/bin/bash\n#SBATCH -J pretrain\n#SBATCH --nodes=2 --gres=gpu:8\n#SBATCH -t 1-00:00:00\nsrun python train.py\n",
    )
    .unwrap();
    assert_eq!(sh.ok("sbatch", &["train.sh"]), "Submitted batch job 1\n");
    assert_eq!(sh.ok("sbatch", &["--parsable", "-p", "debug", "-t", "5", "--wrap", "hostname"]), "2\n");
    // The script file may vanish: the controller stored its text.
    std::fs::remove_file(sh.cwd.join("train.sh")).unwrap();

    let queue = sh.ok("squeue", &[]);
    let lines: Vec<&str> = queue.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    );
    // With no node agents in this cluster, the scheduler (once it has looked) says no node can hold the job.
    let reason_ok = lines[1].contains("(None)") || lines[1].contains("(ReqNodeNotAvail)");
    assert!(lines[1].contains("pretrain") && lines[1].contains(" PD ") && reason_ok, "{queue}");
    assert_eq!(
        sh.ok("squeue", &["-h", "-o", "%i %P %j %l %D", "-j", "1,2"]),
        "1 gpu pretrain 1-00:00:00 2\n2 debug wrap 5:00 1\n"
    );

    let show = sh.ok("scontrol", &["show", "job", "1"]);
    assert!(show.starts_with("JobId=1 JobName=pretrain\n"), "{show}");
    assert!(show.contains("JobState=PENDING") && show.contains("TRES=cpu=2,node=2,gres/gpu=16"), "{show}");

    // As Slurm: root's `hold` is an administrator's hold, `uhold` the user's.
    sh.ok("scontrol", &["hold", "2"]);
    assert_eq!(sh.ok("squeue", &["-h", "-o", "%i %r", "-j", "2"]), "2 JobHeldAdmin\n");
    sh.ok("scontrol", &["release", "2"]);
    sh.ok("scontrol", &["uhold", "2"]);
    assert_eq!(sh.ok("squeue", &["-h", "-o", "%i %r", "-j", "2"]), "2 JobHeldUser\n");
    sh.ok("scontrol", &["release", "2"]);
    sh.ok("scancel", &["2"]);
    assert_eq!(sh.ok("squeue", &["-h", "-o", "%i"]), "1\n");
    // As Slurm 22.05: cancelling a job that has ended, or never was, succeeds and says nothing unless asked.
    let again = sh.run("scancel", &["2"]);
    assert!(again.status.success() && again.stderr.is_empty(), "{again:?}");
    let said = String::from_utf8(sh.run("scancel", &["-v", "2", "999"]).stderr).unwrap();
    assert_eq!(
        said,
        "scancel: Terminating job 2\nscancel: error: Kill job error on job id 2: Job/step already completing or completed\n\
         scancel: Terminating job 999\nscancel: error: Kill job error on job id 999: Invalid job id specified\n"
    );
    let signalled = sh.run("scancel", &["--signal=USR1", "999"]);
    assert_eq!(signalled.status.code(), Some(1), "a signal for a job that is not there is an error, as in Slurm");
    assert_eq!(sh.ok("scontrol", &["show", "hostnames", "gpu[01-02],login"]), "gpu01\ngpu02\nlogin\n");
}

#[test]
fn bad_submissions_are_refused_with_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path());
    std::fs::write(sh.cwd.join("bad.sh"), "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --nodes=two\necho\n").unwrap();
    let err = sh.err("sbatch", &["bad.sh"]);
    assert!(err.contains("line 3") && err.contains("--nodes") && err.contains("two"), "{err}");
    let err = sh.err("sbatch", &["--frobnicate", "--wrap", "true"]);
    assert!(err.contains("--frobnicate"), "{err}");
    let err = sh.err("sbatch", &["-t", "2-00:00:00", "-p", "debug", "--wrap", "true"]);
    assert!(err.contains("Requested time limit is invalid") && err.contains("debug"), "{err}");
    let err = sh.err("sbatch", &["-p", "nope", "--wrap", "true"]);
    assert!(err.contains("invalid partition name specified: \"nope\""), "{err}");
    // Exit statuses and wording as Slurm 22.05's: a wrong option is 255, the controllers' refusal 1 and says so.
    assert_eq!(sh.run("sbatch", &["--frobnicate", "--wrap", "true"]).status.code(), Some(255));
    assert_eq!(sh.run("sbatch", &["-N", "abc", "--wrap", "true"]).status.code(), Some(255));
    let refused = sh.run("sbatch", &["-p", "nope", "--wrap", "true"]);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8(refused.stderr).unwrap();
    assert!(said.starts_with("sbatch: error: Batch job submission failed: "), "{said}");
    assert_eq!(sh.run("sbatch", &["nosuchfile.sh"]).status.code(), Some(1), "an unreadable script, as in Slurm");
    let err = sh.err("sbatch", &["-N", "8", "--wrap", "true"]);
    assert!(err.contains("Node count specification invalid"), "{err}");
    std::fs::write(sh.cwd.join("huge.sh"), format!("#!/bin/bash\n{}", "#".repeat(5 << 20))).unwrap();
    let err = sh.err("sbatch", &["huge.sh"]);
    assert!(err.contains("limit"), "{err}");
    assert_eq!(sh.ok("squeue", &["-h"]), "", "nothing refused was queued");
    let err = Shell { controllers: "127.0.0.1:9".into(), ..sh }.err("squeue", &[]);
    assert!(err.contains("127.0.0.1:9"), "the error lists the addresses tried: {err}");
}

/// Runs `drover local down` on a detached cluster's directory when the test ends, however it ends.
struct DownOnDrop(std::path::PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_drover")).args(["local", "down", "--dir"]).arg(&self.0).output();
    }
}

#[test]
fn local_up_prints_the_export_line_and_local_down_stops_everything() {
    let dir = tempfile::tempdir().unwrap();
    let drover = env!("CARGO_BIN_EXE_drover");
    // A failed assertion below must not leave a detached cluster running after its directory is gone.
    let _down_on_exit = DownOnDrop(dir.path().join("c"));
    let up = Command::new(drover)
        .args(["local", "up", "--controllers", "3", "--dir"])
        .arg(dir.path().join("c"))
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let line = String::from_utf8(up.stdout).unwrap();
    let exports = line.trim().strip_prefix("export ").expect("export line");
    let (config, addrs) = exports.split_once(' ').expect("two variables");
    let config = config.strip_prefix("DROVER_CONFIG=").expect("DROVER_CONFIG first");
    let addrs = addrs.strip_prefix("DROVER_CONTROLLERS=").expect("then DROVER_CONTROLLERS");
    let status = Command::new(drover)
        .env("DROVER_CONFIG", config)
        .args(["--controllers", addrs, "cluster", "status", "--json"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let roles: Vec<&str> = doc["replicas"].as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(roles.iter().filter(|r| **r == "leader").count(), 1, "{doc}");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("c/cluster.json")).unwrap()).unwrap();
    let pids: Vec<i32> =
        file["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_i64().unwrap() as i32).collect();
    let down = Command::new(drover).args(["local", "down", "--dir"]).arg(dir.path().join("c")).output().unwrap();
    assert!(down.status.success());
    std::thread::sleep(Duration::from_millis(200));
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z"),
            "pid {pid} still running"
        );
    }
}

#[test]
fn an_administrator_changes_a_partition_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path());
    sh.ok("scontrol", &["update", "partitionname=debug", "state=drain"]);
    assert!(sh.ok("scontrol", &["show", "partition", "debug"]).contains("State=DRAIN"));
    let refused = sh.err("sbatch", &["-p", "debug", "--wrap", "true"]);
    assert!(refused.contains("partition debug is in state DRAIN"), "{refused}");
    // MaxTime was 10 minutes; lift it and reopen.
    sh.ok("scontrol", &["update", "partitionname=debug", "state=up", "maxtime=UNLIMITED", "default=yes"]);
    let show = sh.ok("scontrol", &["show", "partition", "debug"]);
    assert!(show.contains("Default=YES") && show.contains("State=UP") && show.contains("MaxTime=UNLIMITED"), "{show}");
    assert_eq!(sh.ok("sbatch", &["--parsable", "-t", "2-00:00:00", "--wrap", "true"]).trim(), "1");
    assert!(sh.ok("squeue", &["-h", "-o", "%P"]).contains("debug"), "jobs without -p now go to the new default");
    let bad = sh.err("scontrol", &["update", "partitionname=nope", "state=down"]);
    assert!(bad.contains("invalid partition name specified: \"nope\""), "{bad}");
    let bad = sh.err("scontrol", &["update", "partitionname=gpu", "state=sideways"]);
    assert!(bad.contains("Invalid partition state"), "{bad}");
    // The update that once crashed every replica for good: refused with the reason, and the cluster serves on.
    let bad = sh.err("scontrol", &["update", "partitionname=gpu", "nodes=]["]);
    assert!(bad.contains("unbalanced brackets in hostlist"), "{bad}");
    assert_eq!(sh.ok("sbatch", &["--parsable", "--wrap", "true"]).trim(), "2");
    assert!(sh.ok("scontrol", &["show", "partition", "gpu"]).contains("State=UP"));
}

/// `sacct -P` fields of one job (State second), once it has left PENDING/RUNNING/COMPLETING (within 20 s).
fn finished(sh: &Shell, id: u64, fields: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let out = sh.ok("sacct", &["-j", &id.to_string(), "-n", "-X", "-P", "-o", fields]).trim().to_string();
        let state = out.split('|').nth(1).unwrap_or_default();
        if !["PENDING", "RUNNING", "COMPLETING", ""].contains(&state) {
            return out;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "job {id} still {state}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_operator_reads_the_nodes_with_sinfo_in_slurms_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = common::setup(dir.path(), UpOptions { agents: 2, gpus_per_agent: 4, ..UpOptions::default() });
    // Both nodes idle in the default partition: one line, the partition starred.
    let summary = sh.ok("sinfo", &[]);
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines[0], "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST", "{summary}");
    assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["gpu*", "up", "infinite", "2", "idle", "node[01-02]"]);
    assert_eq!(sh.ok("sinfo", &["-h", "-o", "%G %c %D"]), "gpu:h200:4 64 2\n");

    // A job on node01 and a drained node02: three states, each where a poller looks for it.
    let job = sh.submit(&["-w", "node01", "--gres=gpu:2", "--wrap", "sleep 60"]);
    sh.ok("scontrol", &["update", "nodename=node02", "state=drain", "reason=bad fan"]);
    let start = std::time::Instant::now();
    while sh.ok("sinfo", &["-h", "-N", "-o", "%N %t"]) != "node01 mix\nnode02 drain\n" {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", sh.ok("sinfo", &["-N"]));
        std::thread::sleep(Duration::from_millis(100));
    }
    let reasons = sh.ok("sinfo", &["-R"]);
    let lines: Vec<&str> = reasons.lines().collect();
    assert_eq!(lines[0], "REASON               USER      TIMESTAMP           NODELIST");
    assert!(lines[1].starts_with("bad fan              root      20") && lines[1].ends_with(" node02"), "{reasons}");
    assert_eq!(lines.len(), 2, "only the drained node has a reason: {reasons}");
    assert_eq!(
        sh.ok("sinfo", &["-h", "-N", "-O", "NodeList:8,StateLong:10,GresUsed:22,CPUsState:12,Reason:0"]),
        "node01  mixed     gpu:h200:2(IDX:0-1)   1/63/0/64   none\nnode02  drained   gpu:h200:0(IDX:N/A)   0/0/64/64   bad fan\n"
    );
    assert_eq!(sh.ok("sinfo", &["-h", "-s", "-o", "%P %F"]), "gpu* 1/0/1/2\n");
    assert_eq!(sh.ok("sinfo", &["-h", "-t", "drain", "-o", "%N"]), "node02\n");
    // With no srun step running, sstat shows the batch step; no usage is sampled while it runs.
    assert_eq!(
        sh.ok("sstat", &["-j", &job.to_string(), "-n", "-P", "-o", "JobID,Nodelist,NTasks,MaxRSS"]),
        format!("{job}.batch|node01|1|\n")
    );
    let err = sh.err("sinfo", &["-t", "sideways"]);
    assert!(err.starts_with("sinfo: error: Bad state string: \"sideways\"\n"), "{err}");
    sh.ok("scancel", &[&job.to_string()]);
}

#[test]
fn a_user_runs_steps_inside_an_salloc_allocation_which_ends_with_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = common::setup(dir.path(), UpOptions { agents: 2, gpus_per_agent: 4, ..UpOptions::default() });
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout).unwrap();
    let script = "echo $SLURM_JOB_ID $SLURM_NNODES $SLURM_JOB_NODELIST $SLURM_NTASKS; srun hostname";
    let out = sh.run("salloc", &["-N", "2", "--ntasks-per-node=1", "--gres=gpu:1", "sh", "-c", script]);
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{stderr}");
    // The command saw the allocation, and srun inside ran a step on both of its nodes.
    assert_eq!(stdout, format!("1 2 node[01-02] 2\n{host}{host}"), "{stderr}");
    assert!(stderr.contains("salloc: Granted job allocation 1\n"), "{stderr}");
    assert!(stderr.ends_with("salloc: Relinquishing job allocation 1\n"), "{stderr}");
    assert_eq!(finished(&sh, 1, "JobName,State,ExitCode,NNodes"), "interactive|COMPLETED|0:0|2");

    // An allocation kept without a shell takes steps from srun --jobid, from anywhere, until it is cancelled.
    let out = sh.run("salloc", &["--no-shell", "-N", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let step = ["--jobid=2", "--overlap", "--gpu-freq=low", "sh", "-c", "echo $SLURM_JOB_ID $SLURM_STEP_ID"];
    let stepped = sh.run("srun", &step);
    let stderr = String::from_utf8_lossy(&stepped.stderr);
    assert_eq!(String::from_utf8(stepped.stdout).unwrap(), "2 0\n", "{stderr}");
    // Clocks are the job's: a step's own --gpu-freq is said to change nothing, not dropped in silence.
    assert!(stderr.contains("srun: warning: --gpu-freq is ignored for a step"), "{stderr}");
    sh.ok("scancel", &["2"]);

    // The command's exit status is salloc's, and the allocation's.
    let out = sh.run("salloc", &["-J", "fails", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(finished(&sh, 3, "JobName,State,ExitCode"), "fails|FAILED|3:0");

    // SIGTERM to salloc releases the allocation and stops the command.
    let mut salloc = sh
        .command("salloc", &["sleep", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(salloc.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("Granted job allocation 4") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0, "salloc ended before the grant");
    }
    let started = std::time::Instant::now();
    unsafe { libc::kill(salloc.id() as i32, libc::SIGTERM) };
    let status = salloc.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "the command was stopped at once");
    assert_eq!(status.code(), Some(1), "a command killed by SIGTERM: salloc exits 1, as Slurm's does");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(rest.contains("salloc: Relinquishing job allocation 4"), "{rest}");
    let state = finished(&sh, 4, "JobID,State");
    assert!(state.starts_with("4|CANCELLED"), "{state}");
}

/// With Drover's short_first profile configured, `sprio` adds a SHORT column (Slurm has none; it stays hidden
/// while the weight is 0) and the columns still add up to the priority, so a user sees why the short job leads.
#[test]
fn sprio_shows_the_short_job_factor_when_the_short_first_profile_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let extra =
        "[cluster.scheduler]\nweight_short = 200\nweight_age = 36500\nmax_age_s = 31536000\nweight_job_size = 0\n";
    let cluster =
        LocalCluster::up(&dir.path().join("cluster"), UpOptions { extra_toml: extra.into(), ..UpOptions::default() })
            .unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(cluster.wait_ready(Duration::from_secs(30))).unwrap();
    let sh = Shell::install(dir.path(), &cluster);
    let long = sh.submit(&["--gres=gpu:8", "-t", "2-00:00:00", "--wrap", "true"]);
    let short = sh.submit(&["--gres=gpu:1", "-t", "10", "--wrap", "true"]);
    let started = std::time::Instant::now();
    let sprio = loop {
        let out = sh.ok("sprio", &[]);
        if out.lines().count() >= 3 {
            break out;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no priorities yet: {out}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines: Vec<&str> = sprio.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["JOBID", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS", "SHORT"]
    );
    let row = |id: u64| -> Vec<u64> {
        let line = lines.iter().find(|l| l.split_whitespace().next() == Some(&id.to_string())).expect("a row");
        line.split_whitespace().map(|v| v.parse().unwrap()).collect()
    };
    let (long, short) = (row(long), row(short));
    assert!(short[7] > long[7], "the short request scores higher: {sprio}");
    assert!(short[1] > long[1], "and leads the queue: {sprio}");
    for r in [&long, &short] {
        let parts: u64 = r[2..].iter().sum();
        assert!(r[1] <= parts && parts <= r[1] + 6, "the columns add up to the priority: {sprio}");
    }
}

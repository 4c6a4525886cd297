//! Issue 14's stories on a real local cluster: a job never spans sites unless it asks (`--multi-site`), and a
//! large job that loses a node restarts at once on its survivors plus a hot spare.

use std::time::{Duration, Instant};

use drover_cli::local::UpOptions;

mod common;

use common::{Shell, setup};

impl Shell {
    fn wait_for(&self, what: &str, timeout: Duration, mut done: impl FnMut(&Shell) -> bool) {
        let start = Instant::now();
        while !done(self) {
            if start.elapsed() > timeout {
                let queue = self.ok("squeue", &["-o", "%i %T %r %N"]);
                let nodes = self.ok("sinfo", &["-N", "-o", "%N %T"]);
                panic!("{what} did not happen within {timeout:?}\n{queue}\n{nodes}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// squeue's `%T|%r|%N` for one job (empty once it left the queue).
    fn queue_line(&self, id: u64) -> String {
        self.ok("squeue", &["-h", "-j", &id.to_string(), "-o", "%T|%r|%N"]).trim().to_string()
    }

    fn show_job(&self, id: u64) -> String {
        self.ok("scontrol", &["show", "job", &id.to_string()])
    }
}

/// Four agents of one GPU each, their config lines given.
fn options(agent_toml: &[&str]) -> UpOptions {
    UpOptions {
        agents: 4,
        gpus_per_agent: 1,
        kill_wait_ms: 1_000,
        agent_heartbeat_ms: 200,
        agent_fence_after_ms: 1_500,
        node_timeout_ms: 2_500,
        agent_toml: agent_toml.iter().map(|t| t.to_string()).collect(),
        ..UpOptions::default()
    }
}

fn expand(nodes: &str) -> Vec<String> {
    drover_state::hostlist::expand_hostlist(nodes).unwrap()
}

#[test]
fn a_job_larger_than_any_site_waits_with_a_clear_reason_unless_it_asks_for_multi_site() {
    let dir = tempfile::tempdir().unwrap();
    let site = |s: &str| format!("topology = {{ site = {s:?} }}");
    let (a, b) = (site("a"), site("b"));
    let (_cluster, sh) = setup(dir.path(), options(&[&a, &a, &b, &b]));
    let node = sh.ok("scontrol", &["show", "node", "node03"]);
    assert!(node.contains("Topology=site=b"), "{node}");

    // Three nodes without --multi-site: no site has three, so it waits and says why.
    let stays = sh.submit(&["-N", "3", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300"]);
    sh.wait_for("the multi-site reason", Duration::from_secs(20), |sh| {
        sh.queue_line(stays) == "PENDING|MultiSiteRequired|"
    });
    let show = sh.show_job(stays);
    assert!(show.contains("Reason=MultiSiteRequired") && show.contains("MultiSite=no"), "{show}");
    assert!(show.contains("ReasonDetail=") && show.contains("more nodes than any one site has"), "{show}");
    assert!(show.contains("--multi-site"), "the detail says what to do: {show}");

    // The same job asking for it, as a directive in its script: it runs, on both sites.
    std::fs::write(sh.cwd.join("wide.sh"), "#!/bin/bash\n#SBATCH --multi-site\n#SBATCH -N 3\nsleep 300\n").unwrap();
    let spans = sh.submit(&["--gres=gpu:1", "-o", "/dev/null", "wide.sh"]);
    sh.wait_for("the multi-site job running", Duration::from_secs(20), |sh| {
        sh.queue_line(spans).starts_with("RUNNING|")
    });
    let nodes = expand(sh.queue_line(spans).rsplit('|').next().unwrap());
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    let on_a = nodes.iter().filter(|n| ["node01", "node02"].contains(&n.as_str())).count();
    assert!((1..3).contains(&on_a), "it spans both sites: {nodes:?}");
    assert!(sh.show_job(spans).contains("MultiSite=yes"));
    // The first job still waits: its flag is what let the second one run.
    assert_eq!(sh.queue_line(stays), "PENDING|MultiSiteRequired|");
    sh.ok("scancel", &[&stays.to_string(), &spans.to_string()]);
}

#[test]
fn a_large_job_that_loses_a_node_restarts_at_once_on_the_survivors_and_a_hot_spare() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, sh) = setup(dir.path(), options(&["", "", "", "spare = true"]));
    // node04 registered as a spare (its agent's config); sinfo gives the pool a line of its own.
    assert_eq!(sh.ok("sinfo", &["-h", "-t", "spare", "-o", "%N %t"]).trim(), "node04 spare");
    assert!(sh.ok("scontrol", &["show", "node", "node04"]).contains("Spare=yes"));
    assert!(sh.ok("scontrol", &["show", "node", "node01"]).contains("Spare=no"));
    // Operators take a node out of the pool and put it back; a bad value is refused, naming itself.
    sh.ok("scontrol", &["update", "nodename=node04", "spare=no"]);
    assert!(sh.ok("scontrol", &["show", "node", "node04"]).contains("Spare=no"));
    let err = sh.err("scontrol", &["update", "nodename=node04", "spare=maybe"]);
    assert!(err.contains("Invalid spare value \"maybe\""), "{err}");
    sh.ok("scontrol", &["update", "nodename=node04", "spare=yes"]);
    assert!(sh.ok("scontrol", &["show", "node", "node04"]).contains("Spare=yes"));

    // A three-node job runs on the three normal nodes; a fourth one-node job does not take the spare.
    let big = sh.submit(&["-N", "3", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300"]);
    sh.wait_for("the big job running", Duration::from_secs(20), |sh| sh.queue_line(big).starts_with("RUNNING|"));
    assert_eq!(sh.queue_line(big), "RUNNING|None|node[01-03]");
    let small = sh.submit(&["--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300"]);
    sh.wait_for("the small job's reason", Duration::from_secs(20), |sh| {
        sh.queue_line(small).starts_with("PENDING|Resources")
    });

    // node02 dies. The job is requeued after the node failure and restarts on node01, node03 and the spare,
    // without waiting for node02 (which never comes back), and ahead of the small job (which cannot take a
    // survivor while the other's GPUs are still being released).
    drover_cli::local::fence_node(&mut cluster, "node02").unwrap();
    let killed = Instant::now();
    sh.wait_for("the restart on the spare", Duration::from_secs(30), |sh| {
        sh.queue_line(big) == "RUNNING|None|node[01,03-04]"
    });
    eprintln!("node killed -> job running again with the spare: {:?}", killed.elapsed());
    let show = sh.show_job(big);
    assert!(show.contains("Restarts=1") && show.contains("Restart[0]=State:NODE_FAIL"), "{show}");
    // The spare has become one of the job's nodes: the pool is empty until an operator refills it.
    assert!(sh.ok("scontrol", &["show", "node", "node04"]).contains("Spare=no"));
    assert_eq!(sh.ok("sinfo", &["-h", "-t", "spare", "-o", "%N"]).trim(), "");
    assert!(sh.queue_line(small).starts_with("PENDING|"), "the small job got neither the spare nor a survivor");
    sh.ok("scancel", &[&big.to_string(), &small.to_string()]);
}

//! Job cgroups end to end: a two-node job's tasks see only the CPUs their job holds, and sacct shows what they
//! used on both nodes (the batch node reports its share with the end, the other node as it releases the job).
//! Needs root (agents make cgroups only then); skipped otherwise, saying so.

use std::time::{Duration, Instant};

use drover_cli::local::UpOptions;

mod common;

use common::{Shell, setup};

/// `sacct -P` fields of one job.
fn acct(sh: &Shell, id: u64, fields: &str) -> Vec<String> {
    let out = sh.ok("sacct", &["-X", "-j", &id.to_string(), "-n", "-P", "-o", fields]);
    out.trim().split('|').map(str::to_string).collect()
}

/// Seconds of a `TotalCPU` value (`MM:SS.mmm`, `00:MM:SS` or `HH:MM:SS`).
fn cpu_seconds(total_cpu: &str) -> f64 {
    total_cpu.split(':').fold(0.0, |sum, part| sum * 60.0 + part.parse::<f64>().unwrap_or(0.0))
}

#[test]
fn a_two_node_jobs_tasks_see_only_their_cpus_and_sacct_shows_what_both_nodes_measured() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIPPED: agents make job cgroups only when run as root");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, sh) = setup(dir.path(), UpOptions { agents: 2, kill_wait_ms: 1_000, ..UpOptions::default() });
    // One task of one CPU per node; only the second node works hard, so its figure is told apart from the first's.
    let spin = "if [ \"$SLURM_NODEID\" = 1 ]; then i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done; fi; nproc";
    let script = format!("srun sh -c '{spin}'");
    let id = sh.submit(&["-N", "2", "--ntasks-per-node=1", "-c", "1", "-o", "job.out", "--wrap", &script]);
    let start = Instant::now();
    while !["COMPLETED", "FAILED"].contains(&acct(&sh, id, "State")[0].as_str()) {
        assert!(start.elapsed() < Duration::from_secs(60), "job {id} did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = std::fs::read_to_string(sh.cwd.join("job.out")).unwrap();
    assert_eq!(acct(&sh, id, "State,ExitCode"), ["COMPLETED", "0:0"], "{out}");
    let pins = std::path::Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists()
        || std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").is_ok_and(|c| c.contains("cpuset"));
    if pins {
        assert_eq!(out.lines().collect::<Vec<_>>(), ["1", "1"], "each node's task sees the job's one CPU there");
    }
    // The second node's share arrives after the end, with its release.
    let [total_cpu, max_rss, tres] = loop {
        let got = acct(&sh, id, "TotalCPU,MaxRSS,TRESUsageInTot");
        if cpu_seconds(&got[0]) >= 0.2 || start.elapsed() > Duration::from_secs(60) {
            break <[String; 3]>::try_from(got).unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("sacct: TotalCPU={total_cpu} MaxRSS={max_rss} TRESUsageInTot={tres}; job output {out:?}");
    assert!(cpu_seconds(&total_cpu) >= 0.2, "the second node's busy loop is counted: {total_cpu:?}");
    assert!(max_rss.ends_with('K') || max_rss.ends_with('M'), "{max_rss:?}");
    assert!(tres.starts_with("cpu=00:00:") && tres.contains(",mem="), "{tres:?}");
}

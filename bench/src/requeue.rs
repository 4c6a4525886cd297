//! `drover-bench requeue`: a node dies under a checkpointing job; how long until the job runs elsewhere from its
//! checkpoint. With the controllers' default timing (a 5 s lease, nodes declared down after 8 s), and with a fence
//! command (a stand-in for a BMC power-off), which lets the leader declare a silent node down as soon as the
//! command succeeds. `--fault xid`: the job's GPU falls off the bus (XID 79) instead; `--fault hang`: the job stops
//! making progress (`--progress-timeout`), and the figure is from its last progress to its next incarnation's first
//! step.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use drover_testkit::local::{LocalCluster, UpOptions};

/// The job: a step every 0.1 s, a checkpoint every 5 steps, resumes from `DROVER_RESUME_FROM`. Each step is logged
/// with its incarnation and the time, which is what the benchmark reads.
const COUNTER: &str = r#"#!/bin/bash
step=0
if [ -n "$DROVER_RESUME_FROM" ]; then step=$(cat "$DROVER_RESUME_FROM"); fi
while [ "$step" -lt 100000 ]; do
  step=$((step + 1))
  sleep 0.1
  if [ -e hang ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then while true; do sleep 1; done; fi
  echo "$step" > "$DROVER_CHECKPOINT_DIR/PROGRESS"
  echo "step ${SLURM_RESTART_COUNT:-0} $step $(date +%s%N) $SLURMD_NODENAME" >> steps.log
  if [ $((step % 5)) -eq 0 ]; then
    f="$DROVER_CHECKPOINT_DIR/step-$step"; echo "$step" > "$f"
    drover checkpoint record "$f" --step "$step"
  fi
done
"#;

/// What goes wrong under the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// The node dies (its agent and tasks are killed).
    Node,
    /// The job's GPU falls off the bus (XID 79, injected through the simulated GPUs' fault file).
    Xid,
    /// The job stops making progress (`--progress-timeout` of [`HANG_TIMEOUT`]).
    Hang,
}

/// The progress timeout of the hang runs, as `sbatch` spells it, and in seconds.
const HANG_TIMEOUT: (&str, f64) = ("0:30", 30.0);

pub async fn requeue(runs: usize, fence: bool, fault: Fault, dir: PathBuf) -> anyhow::Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let what = match fault {
        Fault::Node => "node killed",
        Fault::Xid => "XID 79 on the job's GPU",
        Fault::Hang => "last progress of a hung job",
    };
    let mut times = Vec::new();
    for run in 0..runs {
        let took = one_run(fence, fault, &dir.join(format!("run{run}"))).await?;
        println!(
            "run {run}: {what} -> job stepping again elsewhere, from its checkpoint, after {:.2} s",
            took.as_secs_f64()
        );
        times.push(took);
    }
    times.sort();
    let p50 = times[times.len() / 2];
    let max = *times.last().expect("at least one run");
    println!(
        "bench requeue ({}, {what}): {runs} runs, p50 {:.2} s, max {:.2} s{}",
        if fence { "fence command" } else { "default timing" },
        p50.as_secs_f64(),
        max.as_secs_f64(),
        if fault == Fault::Hang {
            format!(" (the progress timeout is {} s of it)", HANG_TIMEOUT.1)
        } else {
            String::new()
        }
    );
    Ok(())
}

async fn one_run(fence: bool, fault: Fault, dir: &Path) -> anyhow::Result<Duration> {
    // The `drover` binary beside this one: its `sbatch`, `local fence` and, on the jobs' PATH, `drover checkpoint`.
    let exe = drover_testkit::local::find_binary("drover")?;
    let mut extra = String::new();
    if fence {
        // `drover local fence` powers a local node off (SIGKILLs its agent and its tasks), as a BMC would.
        extra =
            format!("[agents]\nfence_command = \"{} local fence --dir {} {{node}}\"\n", exe.display(), dir.display());
    }
    // The controllers' production defaults (`AgentTiming::default()` in drover-controller), not the local
    // cluster's quicker ones.
    let options = UpOptions {
        agents: 2,
        gpus_per_agent: 1,
        agent_heartbeat_ms: 1_000,
        agent_fence_after_ms: 5_000,
        node_timeout_ms: 8_000,
        kill_wait_ms: 1_000,
        extra_toml: extra,
        agent_fault_files: fault == Fault::Xid,
        ..UpOptions::default()
    };
    let mut cluster = LocalCluster::up(dir, options)?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    cluster.wait_agents(Duration::from_secs(30)).await?;
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join("count.sh"), COUNTER)?;
    let path = format!("{}:/usr/bin:/bin", exe.parent().context("the drover binary's directory")?.display());
    let timeout = format!("--progress-timeout={}", HANG_TIMEOUT.0);
    let mut args = vec!["sbatch", "--parsable", "--gres=gpu:1", "-o", "count.out"];
    if fault == Fault::Hang {
        args.push(&timeout);
    }
    args.push("count.sh");
    let submitted = Command::new(&exe)
        .args(&args)
        .current_dir(&work)
        .env("DROVER_CONFIG", dir.join("client.toml"))
        .env("DROVER_CONTROLLERS", cluster.addresses())
        .env("PATH", path)
        .output()?;
    if !submitted.status.success() {
        bail!("sbatch failed: {}", String::from_utf8_lossy(&submitted.stderr));
    }
    let log = work.join("steps.log");
    wait_until(Duration::from_secs(60), || last_step(&log).is_some_and(|(restart, step)| restart == 0 && step >= 7))?;
    let node = std::fs::read_to_string(&log)?
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(4).map(str::to_string))
        .context("the job's node")?;
    let killed_ns = match fault {
        Fault::Node => {
            // The node dies: its agent and its tasks.
            drover_testkit::local::fence_node(&mut cluster, &node)?;
            SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos()
        }
        Fault::Xid => {
            std::fs::write(cluster.fault_file(&node), "0 xid 79\n")?;
            SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos()
        }
        Fault::Hang => {
            // The job stops at its next step; its last progress is its last logged step.
            std::fs::write(work.join("hang"), "")?;
            std::thread::sleep(Duration::from_millis(500));
            lines(&log).last().map(|(_, _, t)| *t).context("the job's last step")?
        }
    };
    let resumed_ns = {
        let mut found = None;
        wait_until(Duration::from_secs(120), || {
            found = first_step_of(&log, 1);
            found.is_some()
        })?;
        found.expect("found above")
    };
    cluster.down()?;
    Ok(Duration::from_nanos(u64::try_from(resumed_ns.saturating_sub(killed_ns)).unwrap_or(u64::MAX)))
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn lines(log: &Path) -> Vec<(u32, u64, u128)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.get(1)?.parse().ok()?, w.get(2)?.parse().ok()?, w.get(3)?.parse().ok()?))
        })
        .collect()
}

fn last_step(log: &Path) -> Option<(u32, u64)> {
    lines(log).last().map(|(r, s, _)| (*r, *s))
}

/// When incarnation `restart` logged its first step.
fn first_step_of(log: &Path, restart: u32) -> Option<u128> {
    lines(log).into_iter().find(|(r, _, _)| *r == restart).map(|(_, _, t)| t)
}

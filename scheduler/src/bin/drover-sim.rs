//! Trace-driven simulation in virtual time over the ElasticFlow traces, driving the same `schedule` function the
//! leader runs. Usage: `drover-sim TRACE.csv... [--policy fifo|slurm|drover|all] [--gpus N]`.
//!
//! Mapping: 8 GPUs per node; cluster04 has 1024 GPUs (128 nodes), every other trace 512 (64 nodes). A job asking
//! n <= 8 GPUs is one node with n GPUs; n > 8 is ceil(n/8) nodes with 8 GPUs each. Durations are exact and used as
//! time limits. Priority is submit order for every policy (all weights zero), so the policies differ only in
//! what they let pass a blocked job.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::ExitCode;

use drover_scheduler::synth::node;
use drover_scheduler::{
    ClusterView, Partition, PartitionState, PendingJob, PriorityWeights, Qos, RunningJob, SchedulerConfig, schedule,
};

const GPUS_PER_NODE: u32 = 8;
/// Slurm's bf_interval default.
const SLURM_BF_INTERVAL_S: u64 = 30;
/// Slurm's bf_max_job_test default.
const SLURM_BF_MAX_JOB_TEST: usize = 500;
/// Bounded slowdown's lower bound on runtime.
const SLOWDOWN_BOUND_S: u64 = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Policy {
    Fifo,
    Slurm,
    Drover,
}

struct TraceJob {
    submit_s: u64,
    duration_s: u64,
    nodes: u32,
    gpus_per_node: u32,
}

struct Stats {
    jobs: usize,
    skipped: usize,
    avg_wait_s: f64,
    p99_wait_s: u64,
    avg_bsld: f64,
    util: f64,
    makespan_s: u64,
    passes: u64,
    wall_s: f64,
}

fn load(path: &Path) -> Result<Vec<TraceJob>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut jobs = Vec::new();
    for (lineno, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 4 {
            return Err(format!("{}:{}: expected 4 columns", path.display(), lineno + 1));
        }
        let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{}:{}: {e}", path.display(), lineno + 1));
        let (submit_s, duration_s, gpus) = (num(f[1])?, num(f[2])?, num(f[3])? as u32);
        let (nodes, gpus_per_node) =
            if gpus <= GPUS_PER_NODE { (1, gpus) } else { (gpus.div_ceil(GPUS_PER_NODE), GPUS_PER_NODE) };
        jobs.push(TraceJob { submit_s, duration_s: duration_s.max(1), nodes, gpus_per_node });
    }
    jobs.sort_by_key(|j| j.submit_s); // stable: file order breaks ties
    Ok(jobs)
}

fn simulate(jobs: &[TraceJob], cluster_gpus: u32, policy: Policy) -> Stats {
    let started = std::time::Instant::now();
    let n_nodes = (cluster_gpus / GPUS_PER_NODE) as usize;
    let mut view = ClusterView {
        now_s: 0,
        nodes: (0..n_nodes).map(|i| node(i, GPUS_PER_NODE)).collect(),
        partitions: vec![Partition {
            name: "gpu".into(),
            max_time_s: None,
            priority_tier: 1,
            state: PartitionState::Up,
        }],
        qos: vec![Qos::unlimited("normal", 0)],
        ..ClusterView::default()
    };
    let weights = PriorityWeights { age: 0, fairshare: 0, job_size: 0, partition: 0, qos: 0, ..Default::default() };
    let fifo = SchedulerConfig { weights: weights.clone(), backfill: false, ..SchedulerConfig::default() };
    let slurm_bf = SchedulerConfig {
        weights: weights.clone(),
        backfill: true,
        max_reservations: SLURM_BF_MAX_JOB_TEST,
        max_backfill_jobs: Some(SLURM_BF_MAX_JOB_TEST),
    };
    let drover = SchedulerConfig { weights, ..SchedulerConfig::default() };
    let node_index: HashMap<String, usize> = view.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();

    let skipped = jobs.iter().filter(|j| j.nodes as usize > n_nodes).count();
    let runnable: Vec<(u64, &TraceJob)> =
        jobs.iter().enumerate().filter(|(_, j)| j.nodes as usize <= n_nodes).map(|(i, j)| (i as u64, j)).collect();
    let mut next_submit = 0usize;
    let mut completions: BTreeMap<(u64, u64), ()> = BTreeMap::new();
    let mut waits: Vec<u64> = Vec::with_capacity(runnable.len());
    let mut bsld_sum = 0.0;
    let mut busy_gpu_s: u128 = 0;
    let mut last_end_s = 0u64;
    let mut next_bf_s = 0u64;
    let mut passes = 0u64;
    let first_submit_s = runnable.first().map_or(0, |(_, j)| j.submit_s);

    loop {
        let t_submit = runnable.get(next_submit).map(|(_, j)| j.submit_s);
        let t_done = completions.keys().next().map(|&(t, _)| t);
        let t_bf = (policy == Policy::Slurm && !view.pending.is_empty()).then_some(next_bf_s);
        let Some(now) = [t_submit, t_done, t_bf].into_iter().flatten().min() else { break };
        view.now_s = now;
        while let Some((&(t, id), _)) = completions.first_key_value() {
            if t > now {
                break;
            }
            completions.pop_first();
            if let Some(pos) = view.running.iter().position(|r| r.id == id) {
                let r = view.running.swap_remove(pos);
                for (name, gpus) in r.alloc {
                    if let Some(&ni) = node_index.get(&name) {
                        view.nodes[ni].free_gpus.extend(gpus);
                    }
                }
            }
        }
        while let Some(&(id, j)) = runnable.get(next_submit) {
            if j.submit_s > now {
                break;
            }
            view.pending.push(PendingJob::simple(id, j.submit_s, j.nodes, j.gpus_per_node, j.duration_s));
            next_submit += 1;
        }
        let configs: Vec<&SchedulerConfig> = match policy {
            Policy::Fifo => vec![&fifo],
            Policy::Drover => vec![&drover],
            Policy::Slurm if now >= next_bf_s => {
                next_bf_s = (now / SLURM_BF_INTERVAL_S + 1) * SLURM_BF_INTERVAL_S;
                vec![&fifo, &slurm_bf]
            }
            Policy::Slurm => vec![&fifo],
        };
        for config in configs {
            if view.pending.is_empty() {
                break;
            }
            passes += 1;
            let plan = match schedule(&view, config) {
                Ok(p) => p,
                Err(e) => panic!("the simulator builds only valid views: {e}"),
            };
            let mut started: HashSet<u64> = HashSet::with_capacity(plan.starts.len());
            for (id, alloc) in plan.starts {
                let (_, j) = runnable[runnable.partition_point(|(i, _)| *i < id)];
                for (name, gpus) in &alloc {
                    if let Some(&ni) = node_index.get(name) {
                        view.nodes[ni].free_gpus.retain(|g| !gpus.contains(g));
                    }
                }
                let wait = now - j.submit_s;
                waits.push(wait);
                let run = j.duration_s;
                bsld_sum += ((wait + run) as f64 / run.max(SLOWDOWN_BOUND_S) as f64).max(1.0);
                busy_gpu_s += u128::from(j.nodes * j.gpus_per_node) * u128::from(run);
                last_end_s = last_end_s.max(now + run);
                completions.insert((now + run, id), ());
                view.running.push(RunningJob {
                    id,
                    user: "user".into(),
                    account: "root".into(),
                    qos: "normal".into(),
                    alloc,
                    start_s: now,
                    time_limit_s: run,
                    exclusive: false,
                    reservation: None,
                    array_id: None,
                });
                started.insert(id);
            }
            view.pending.retain(|p| !started.contains(&p.id));
        }
    }
    let n = waits.len();
    let mut sorted = waits.clone();
    sorted.sort_unstable();
    let makespan_s = last_end_s.saturating_sub(first_submit_s);
    Stats {
        jobs: n,
        skipped,
        avg_wait_s: waits.iter().sum::<u64>() as f64 / n.max(1) as f64,
        p99_wait_s: sorted.get((n * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0),
        avg_bsld: bsld_sum / n.max(1) as f64,
        util: busy_gpu_s as f64 / (f64::from(cluster_gpus) * makespan_s.max(1) as f64),
        makespan_s,
        passes,
        wall_s: started.elapsed().as_secs_f64(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut policies = vec![Policy::Fifo, Policy::Slurm, Policy::Drover];
    let mut traces = Vec::new();
    let mut gpus_override: Option<u32> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--gpus" {
            // A smaller cluster than the trace's, to see the policies under contention.
            match it.next().and_then(|g| g.parse().ok()) {
                Some(g) => gpus_override = Some(g),
                None => {
                    eprintln!("--gpus needs a number");
                    return ExitCode::FAILURE;
                }
            }
        } else if a == "--policy" {
            policies = match it.next().map(String::as_str) {
                Some("fifo") => vec![Policy::Fifo],
                Some("slurm") => vec![Policy::Slurm],
                Some("drover") => vec![Policy::Drover],
                Some("all") => policies,
                other => {
                    eprintln!("unknown policy {other:?}");
                    return ExitCode::FAILURE;
                }
            };
        } else {
            traces.push(a.clone());
        }
    }
    if traces.is_empty() {
        eprintln!("usage: drover-sim TRACE.csv... [--policy fifo|slurm|drover|all]");
        return ExitCode::FAILURE;
    }
    println!(
        "| trace | GPUs | policy | jobs | avg wait (s) | p99 wait (s) | avg bsld (10 s) | GPU util | makespan (s) | passes | sim wall (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for path in traces {
        let path = Path::new(&path);
        let jobs = match load(path) {
            Ok(j) => j,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
        let gpus = gpus_override.unwrap_or(if name.contains("cluster04") { 1024 } else { 512 });
        for &policy in &policies {
            let s = simulate(&jobs, gpus, policy);
            let skipped = if s.skipped > 0 { format!(" ({} too big)", s.skipped) } else { String::new() };
            println!(
                "| {name} | {gpus} | {policy:?} | {}{skipped} | {:.0} | {} | {:.2} | {:.1}% | {} | {} | {:.1} |",
                s.jobs,
                s.avg_wait_s,
                s.p99_wait_s,
                s.avg_bsld,
                s.util * 100.0,
                s.makespan_s,
                s.passes,
                s.wall_s
            );
        }
    }
    ExitCode::SUCCESS
}

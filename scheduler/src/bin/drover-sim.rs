//! Trace-driven simulation in virtual time over the ElasticFlow traces, driving the same `schedule` function the
//! leader runs. Usage: `drover-sim TRACE.csv... [--policy fifo|slurm|drover|all] [--gpus N] [--estimates F]
//! [--seed N]`, Drover's weights `[--drover-weights short-first|default|basic] [--short-weight W] [--age-weight W]
//! [--max-age-s S] [--job-size-weight W] [--favor-small]`, and for preemption `--preempt [--high-qos-frac F]
//! [--ckpt-interval-s S] [--restart-overhead-s S] [--kill-wait-s S] [--exempt-s S] [--depth N]` (see SIMULATION.md).
//!
//! Mapping: 8 GPUs per node; cluster04 has 1024 GPUs (128 nodes), every other trace 512 (64 nodes). A job asking
//! n <= 8 GPUs is one node with n GPUs; n > 8 is ceil(n/8) nodes with 8 GPUs each. Durations are exact and used as
//! time limits, unless `--estimates F`: then each job asks for its runtime × a seeded factor in [1, F], rounded up
//! to a whole hour, and still ends after its runtime. Fifo and Slurm-like use Slurm 22.05's default priority
//! (priority/basic: submit order, all weights zero); Drover its `short_first` profile (or `--drover-weights`).
//! With `--preempt`, a seeded fraction of the jobs is in QOS "high" (QOS weight
//! 1,000: they go first) that may preempt QOS "normal"; every policy sees the same jobs and priorities, with and
//! without preemption. A preempted job keeps running for KillWait, loses the work since its last checkpoint,
//! is requeued with its submit time, and restarts later with a restart overhead.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::ExitCode;

use drover_scheduler::synth::{XorShift, node};
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

/// A policy and whether it preempts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Variant {
    policy: Policy,
    preempt: bool,
}

impl Variant {
    fn name(self) -> String {
        format!("{:?}{}", self.policy, if self.preempt { "+preempt" } else { "" })
    }
}

/// The preemption workload and its costs; `None` in [`Sim::qos`]: the plain trace, as before.
#[derive(Clone, Copy, Debug)]
struct QosWorkload {
    high_frac: f64,
    seed: u64,
    ckpt_interval_s: u64,
    restart_overhead_s: u64,
    kill_wait_s: u64,
    /// PreemptExemptTime of QOS normal.
    exempt_s: Option<u64>,
}

#[derive(Clone, Debug)]
struct Sim {
    qos: Option<QosWorkload>,
    /// Drover's reservation depth (default: the library's).
    depth: Option<usize>,
    /// Drover's priority weights (default: the `short_first` profile).
    drover_weights: PriorityWeights,
    /// Time limits as users give them: runtime × a seeded factor in [1, max], rounded up to a whole hour. None:
    /// the exact runtime.
    estimates: Option<Estimates>,
}

#[derive(Clone, Copy, Debug)]
struct Estimates {
    max_factor: f64,
    seed: u64,
}

struct TraceJob {
    submit_s: u64,
    duration_s: u64,
    /// The time limit the job asks for (the duration itself unless `--estimates`).
    limit_s: u64,
    nodes: u32,
    gpus_per_node: u32,
}

/// A job's progress through the simulation.
#[derive(Clone, Default)]
struct JobState {
    high: bool,
    /// Useful work still to do.
    remaining_s: u64,
    /// Overhead of the next (or current) run: 0 at first, the restart overhead after a preemption.
    overhead_s: u64,
    run_start_s: u64,
    pending_since_s: u64,
    waited_s: u64,
}

#[derive(Default)]
struct Stats {
    jobs: usize,
    skipped: usize,
    avg_wait_s: f64,
    p99_wait_s: u64,
    max_wait_s: u64,
    avg_jct_s: f64,
    avg_bsld: f64,
    /// Average bounded slowdown of high-QOS and normal-QOS jobs.
    bsld_high: f64,
    bsld_normal: f64,
    util: f64,
    makespan_s: u64,
    preemptions: u64,
    lost_gpu_h: f64,
    passes: u64,
    wall_s: f64,
}

/// A trace that cannot be read, with the file and line to look at.
#[derive(Debug, thiserror::Error)]
enum TraceError {
    #[error("{}: {cause}", path.display())]
    Read { path: std::path::PathBuf, cause: std::io::Error },
    #[error("{}:{line}: expected 4 columns", path.display())]
    Columns { path: std::path::PathBuf, line: usize },
    #[error("{}:{line}: {cause}", path.display())]
    Number { path: std::path::PathBuf, line: usize, cause: std::num::ParseIntError },
}

fn load(path: &Path) -> Result<Vec<TraceJob>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|cause| TraceError::Read { path: path.to_path_buf(), cause })?;
    let mut jobs = Vec::new();
    for (lineno, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 4 {
            return Err(TraceError::Columns { path: path.to_path_buf(), line: lineno + 1 });
        }
        let num = |s: &str| {
            s.parse::<u64>().map_err(|cause| TraceError::Number { path: path.to_path_buf(), line: lineno + 1, cause })
        };
        let (submit_s, duration_s, gpus) = (num(f[1])?, num(f[2])?, num(f[3])? as u32);
        let (nodes, gpus_per_node) =
            if gpus <= GPUS_PER_NODE { (1, gpus) } else { (gpus.div_ceil(GPUS_PER_NODE), GPUS_PER_NODE) };
        let duration_s = duration_s.max(1);
        jobs.push(TraceJob { submit_s, duration_s, limit_s: duration_s, nodes, gpus_per_node });
    }
    jobs.sort_by_key(|j| j.submit_s); // stable: file order breaks ties
    Ok(jobs)
}

/// Over-estimated time limits: each job's runtime × a factor uniform in [1, max] (seeded, per trace position),
/// rounded up to a whole hour, as users round `--time`. The job still ends after its real runtime.
fn overestimate(jobs: &mut [TraceJob], e: Estimates) {
    // A different stream from the QOS draw's, which uses the plain seed.
    let mut rng = XorShift::new(e.seed ^ 0x9E37_79B9_7F4A_7C15);
    for j in jobs {
        let u = rng.below(1_000_001) as f64 / 1e6;
        let limit = (j.duration_s as f64 * (1.0 + u * (e.max_factor - 1.0))).ceil() as u64;
        j.limit_s = limit.div_ceil(3600).max(1) * 3600;
    }
}

/// The scheduler configurations the policies run with, and how long a preempted job takes to die.
struct Configs {
    fifo: SchedulerConfig,
    slurm_bf: SchedulerConfig,
    drover: SchedulerConfig,
    kill_wait_s: u64,
}

/// The cluster (nodes of [`GPUS_PER_NODE`] GPUs, one partition, QOS) and the configurations `variant` runs with.
fn setup(cluster_gpus: u32, variant: Variant, sim: &Sim) -> (ClusterView, Configs) {
    let n_nodes = (cluster_gpus / GPUS_PER_NODE) as usize;
    let mut view = ClusterView {
        now_s: 0,
        nodes: (0..n_nodes).map(|i| node(i, GPUS_PER_NODE)).collect(),
        partitions: vec![Partition {
            name: "gpu".into(),
            max_time_s: None,
            priority_tier: 1,
            state: PartitionState::Up,
            preempt_mode: Default::default(),
        }],
        qos: vec![Qos::unlimited("normal", 0)],
        ..ClusterView::default()
    };
    // Slurm 22.05 out of the box: priority/basic, i.e. submit order (all weights zero).
    let mut weights = PriorityWeights { age: 0, fairshare: 0, job_size: 0, partition: 0, qos: 0, ..Default::default() };
    let mut drover_weights = sim.drover_weights.clone();
    let kill_wait_s = sim.qos.map_or(SchedulerConfig::default().kill_wait_s, |q| q.kill_wait_s);
    if let Some(q) = sim.qos {
        // High-QOS jobs go first (QOS factor) and may preempt normal ones; the rest is submit order.
        let mut high = Qos::unlimited("high", 1);
        high.preempt = vec!["normal".into()];
        view.qos.push(high);
        view.qos[0].preempt_exempt_time_s = q.exempt_s;
        weights.qos = 1_000;
        drover_weights.qos = drover_weights.qos.max(1_000);
    }
    let base = SchedulerConfig { weights, preemption: variant.preempt, kill_wait_s, ..SchedulerConfig::default() };
    let fifo = SchedulerConfig { backfill: false, ..base.clone() };
    let slurm_bf = SchedulerConfig {
        backfill: true,
        max_reservations: SLURM_BF_MAX_JOB_TEST,
        max_backfill_jobs: Some(SLURM_BF_MAX_JOB_TEST),
        ..base.clone()
    };
    let drover = SchedulerConfig {
        weights: drover_weights,
        max_reservations: sim.depth.unwrap_or(base.max_reservations),
        ..base
    };
    (view, Configs { fifo, slurm_bf, drover, kill_wait_s })
}

/// What the statistics are made of, summed as jobs end.
#[derive(Default)]
struct Tally {
    waits: Vec<u64>,
    bsld_sum: f64,
    jct_sum: f64,
    bsld_high: f64,
    n_high: usize,
    bsld_normal: f64,
    n_normal: usize,
    busy_gpu_s: u128,
    lost_gpu_s: u128,
    preemptions: u64,
    last_end_s: u64,
    passes: u64,
}

/// One policy's run over one trace, in virtual time.
struct Run<'t> {
    policy: Policy,
    qos: Option<QosWorkload>,
    view: ClusterView,
    configs: Configs,
    node_index: HashMap<String, usize>,
    /// The jobs that fit the cluster, by trace position.
    runnable: Vec<(u64, &'t TraceJob)>,
    state: Vec<JobState>,
    next_submit: usize,
    /// (time, job): run ends, and preempted jobs' KillWait ends.
    completions: BTreeMap<(u64, u64), ()>,
    kills: BTreeMap<(u64, u64), ()>,
    next_bf_s: u64,
    tally: Tally,
}

impl<'t> Run<'t> {
    fn trace(&self, id: u64) -> &'t TraceJob {
        self.runnable[self.runnable.partition_point(|(i, _)| *i < id)].1
    }

    /// Takes a running job off the cluster, its GPUs free again.
    fn release(&mut self, id: u64) -> Option<RunningJob> {
        let pos = self.view.running.iter().position(|r| r.id == id)?;
        let r = self.view.running.swap_remove(pos);
        for (name, gpus) in &r.alloc {
            if let Some(&ni) = self.node_index.get(name) {
                self.view.nodes[ni].free_gpus.extend(gpus);
            }
        }
        Some(r)
    }

    /// The next event: a submission, a run's end, a KillWait's end, or (Slurm-like) a backfill interval.
    fn next_event(&self) -> Option<u64> {
        let t_submit = self.runnable.get(self.next_submit).map(|(_, j)| j.submit_s);
        let t_done = self.completions.keys().next().map(|&(t, _)| t);
        let t_kill = self.kills.keys().next().map(|&(t, _)| t);
        let t_bf = (self.policy == Policy::Slurm && !self.view.pending.is_empty()).then_some(self.next_bf_s);
        [t_submit, t_done, t_kill, t_bf].into_iter().flatten().min()
    }

    /// Runs that end by `now`: each job's wait, completion time and slowdown are tallied.
    fn complete_due(&mut self, now: u64) {
        while let Some((&(t, id), _)) = self.completions.first_key_value() {
            if t > now {
                break;
            }
            self.completions.pop_first();
            if self.release(id).is_some() {
                let j = self.trace(id);
                let s = &self.state[id as usize];
                let tally = &mut self.tally;
                let jct = now - j.submit_s;
                tally.waits.push(s.waited_s);
                let bsld = (jct as f64 / j.duration_s.max(SLOWDOWN_BOUND_S) as f64).max(1.0);
                tally.bsld_sum += bsld;
                tally.jct_sum += jct as f64;
                if s.high {
                    (tally.bsld_high, tally.n_high) = (tally.bsld_high + bsld, tally.n_high + 1);
                } else {
                    (tally.bsld_normal, tally.n_normal) = (tally.bsld_normal + bsld, tally.n_normal + 1);
                }
                tally.last_end_s = tally.last_end_s.max(now);
            }
        }
    }

    /// Preempted jobs whose KillWait ends by `now`: the work since their last checkpoint is lost, and they queue
    /// again with their submit time.
    fn kill_due(&mut self, now: u64) {
        while let Some((&(t, id), _)) = self.kills.first_key_value() {
            if t > now {
                break;
            }
            self.kills.pop_first();
            // It may have finished within its KillWait.
            let Some(r) = self.release(id) else { continue };
            let j = self.trace(id);
            let q = self.qos.expect("only the QOS workload preempts");
            let s = &mut self.state[id as usize];
            self.completions.remove(&(s.run_start_s + s.overhead_s + s.remaining_s, id));
            // Work since the last checkpoint, and the restart overhead it had paid, are lost.
            let ran = now - r.start_s;
            let worked = ran.saturating_sub(s.overhead_s).min(s.remaining_s);
            let saved = worked.checked_div(q.ckpt_interval_s).map_or(0, |k| k * q.ckpt_interval_s);
            s.remaining_s -= saved;
            s.overhead_s = q.restart_overhead_s;
            s.pending_since_s = now;
            let gpus = u128::from(j.nodes * j.gpus_per_node);
            self.tally.lost_gpu_s += gpus * u128::from(ran - saved);
            self.tally.busy_gpu_s += gpus * u128::from(ran);
            let limit = s.overhead_s + j.limit_s - (j.duration_s - s.remaining_s);
            let mut p = PendingJob::simple(id, j.submit_s, j.nodes, j.gpus_per_node, limit);
            p.qos = qos_name(s.high).into();
            self.view.pending.push(p);
        }
    }

    /// Jobs submitted by `now` join the queue.
    fn submit_due(&mut self, now: u64) {
        while let Some(&(id, j)) = self.runnable.get(self.next_submit) {
            if j.submit_s > now {
                break;
            }
            let s = &mut self.state[id as usize];
            s.pending_since_s = j.submit_s;
            let mut p = PendingJob::simple(id, j.submit_s, j.nodes, j.gpus_per_node, j.limit_s);
            p.qos = qos_name(s.high).into();
            self.view.pending.push(p);
            self.next_submit += 1;
        }
    }

    /// The policy's passes at `now` (Slurm-like: its main pass, and a backfill pass every bf_interval), each plan
    /// applied before the next pass.
    fn schedule_at(&mut self, now: u64) {
        let backfill_too = match self.policy {
            Policy::Slurm if now >= self.next_bf_s => {
                self.next_bf_s = (now / SLURM_BF_INTERVAL_S + 1) * SLURM_BF_INTERVAL_S;
                true
            }
            _ => false,
        };
        for pass in 0..1 + usize::from(backfill_too) {
            if self.view.pending.is_empty() {
                break;
            }
            self.tally.passes += 1;
            let config = match (self.policy, pass) {
                (Policy::Fifo, _) | (Policy::Slurm, 0) => &self.configs.fifo,
                (Policy::Slurm, _) => &self.configs.slurm_bf,
                (Policy::Drover, _) => &self.configs.drover,
            };
            let plan = match schedule(&self.view, config) {
                Ok(p) => p,
                Err(e) => panic!("the simulator builds only valid views: {e}"),
            };
            self.apply(plan, now);
        }
    }

    /// Starts the plan's jobs and marks its preemptions' victims.
    fn apply(&mut self, plan: drover_scheduler::Plan, now: u64) {
        let priority: HashMap<u64, u64> = plan.priorities.iter().map(|(id, b)| (*id, b.priority)).collect();
        let mut started: HashSet<u64> = HashSet::with_capacity(plan.starts.len());
        for (id, alloc) in plan.starts {
            for (name, gpus) in &alloc {
                if let Some(&ni) = self.node_index.get(name) {
                    self.view.nodes[ni].free_gpus.retain(|g| !gpus.contains(g));
                }
            }
            let trace = self.trace(id);
            let s = &mut self.state[id as usize];
            s.waited_s += now - s.pending_since_s;
            s.run_start_s = now;
            let run = s.overhead_s + s.remaining_s;
            // The limit it asked for (what the scheduler plans with); it ends after its real run.
            let limit = s.overhead_s + trace.limit_s - (trace.duration_s - s.remaining_s);
            self.completions.insert((now + run, id), ());
            self.view.running.push(RunningJob {
                id,
                user: "user".into(),
                account: "root".into(),
                qos: qos_name(s.high).into(),
                alloc,
                start_s: now,
                time_limit_s: limit,
                exclusive: false,
                reservation: None,
                array_id: None,
                partition: "gpu".into(),
                requeueable: true,
                priority: priority.get(&id).copied().unwrap_or(0),
                preempting: false,
                preempted_for: None,
            });
            started.insert(id);
        }
        self.view.pending.retain(|p| !started.contains(&p.id));
        for p in plan.preemptions {
            if let Some(r) = self.view.running.iter_mut().find(|r| r.id == p.victim) {
                r.preempting = true;
                r.preempted_for = Some(p.for_job);
                self.kills.insert((now + self.configs.kill_wait_s, p.victim), ());
                self.tally.preemptions += 1;
            }
        }
    }

    fn stats(mut self, skipped: usize, cluster_gpus: u32, wall_s: f64) -> Stats {
        // Completed runs' GPU time (preempted runs were counted when they ended).
        for (id, j) in &self.runnable {
            let s = &self.state[*id as usize];
            self.tally.busy_gpu_s += u128::from(j.nodes * j.gpus_per_node) * u128::from(s.overhead_s + s.remaining_s);
        }
        let t = &self.tally;
        let first_submit_s = self.runnable.first().map_or(0, |(_, j)| j.submit_s);
        let n = t.waits.len();
        let mut sorted = t.waits.clone();
        sorted.sort_unstable();
        let makespan_s = t.last_end_s.saturating_sub(first_submit_s);
        Stats {
            jobs: n,
            skipped,
            avg_wait_s: t.waits.iter().sum::<u64>() as f64 / n.max(1) as f64,
            p99_wait_s: sorted.get((n * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0),
            max_wait_s: sorted.last().copied().unwrap_or(0),
            avg_jct_s: t.jct_sum / n.max(1) as f64,
            avg_bsld: t.bsld_sum / n.max(1) as f64,
            bsld_high: t.bsld_high / t.n_high.max(1) as f64,
            bsld_normal: t.bsld_normal / t.n_normal.max(1) as f64,
            util: t.busy_gpu_s as f64 / (f64::from(cluster_gpus) * makespan_s.max(1) as f64),
            makespan_s,
            preemptions: t.preemptions,
            lost_gpu_h: t.lost_gpu_s as f64 / 3600.0,
            passes: t.passes,
            wall_s,
        }
    }
}

fn qos_name(high: bool) -> &'static str {
    if high { "high" } else { "normal" }
}

fn simulate(jobs: &[TraceJob], cluster_gpus: u32, variant: Variant, sim: &Sim) -> Stats {
    let started = std::time::Instant::now();
    let (view, configs) = setup(cluster_gpus, variant, sim);
    let n_nodes = view.nodes.len();
    let node_index: HashMap<String, usize> = view.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
    let skipped = jobs.iter().filter(|j| j.nodes as usize > n_nodes).count();
    let runnable: Vec<(u64, &TraceJob)> =
        jobs.iter().enumerate().filter(|(_, j)| j.nodes as usize <= n_nodes).map(|(i, j)| (i as u64, j)).collect();
    let mut state: Vec<JobState> =
        jobs.iter().map(|j| JobState { remaining_s: j.duration_s, ..Default::default() }).collect();
    if let Some(q) = sim.qos {
        // A deterministic, seeded choice per trace position: the same jobs are high for every policy.
        let mut rng = XorShift::new(q.seed);
        for s in &mut state {
            s.high = (rng.below(1_000_000) as f64) < q.high_frac * 1e6;
        }
    }
    let waits = Vec::with_capacity(runnable.len());
    let mut run = Run {
        policy: variant.policy,
        qos: sim.qos,
        view,
        configs,
        node_index,
        runnable,
        state,
        next_submit: 0,
        completions: BTreeMap::new(),
        kills: BTreeMap::new(),
        next_bf_s: 0,
        tally: Tally { waits, ..Tally::default() },
    };
    while let Some(now) = run.next_event() {
        run.view.now_s = now;
        run.complete_due(now);
        run.kill_due(now);
        run.submit_due(now);
        run.schedule_at(now);
    }
    run.stats(skipped, cluster_gpus, started.elapsed().as_secs_f64())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match Options::parse(&args) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if o.traces.is_empty() {
        eprintln!("usage: drover-sim TRACE.csv... [--policy fifo|slurm|drover|all] [--gpus N] [--preempt ...]");
        return ExitCode::FAILURE;
    }
    let estimates = o.estimates.map(|max_factor| Estimates { max_factor, seed: o.q.seed });
    let sim = Sim { qos: o.preempt.then_some(o.q), depth: o.depth, drover_weights: o.drover_weights, estimates };
    print_weights(&sim);
    // With preemption: Slurm-like and Drover, each without and with it (FIFO only when asked for).
    let variants: Vec<Variant> = if o.preempt {
        let policies = if o.policy_given { o.policies } else { vec![Policy::Slurm, Policy::Drover] };
        policies.iter().flat_map(|&policy| [false, true].map(|preempt| Variant { policy, preempt })).collect()
    } else {
        o.policies.iter().map(|&policy| Variant { policy, preempt: false }).collect()
    };
    print_header(&sim);
    for path in o.traces {
        let path = Path::new(&path);
        let mut jobs = match load(path) {
            Ok(j) => j,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(e) = sim.estimates {
            overestimate(&mut jobs, e);
        }
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
        let gpus = o.gpus_override.unwrap_or(if name.contains("cluster04") { 1024 } else { 512 });
        for &variant in &variants {
            let s = simulate(&jobs, gpus, variant, &sim);
            print_row(name, gpus, variant, &s, sim.qos.is_some());
        }
    }
    ExitCode::SUCCESS
}

/// The command line.
struct Options {
    policies: Vec<Policy>,
    policy_given: bool,
    traces: Vec<String>,
    gpus_override: Option<u32>,
    preempt: bool,
    q: QosWorkload,
    depth: Option<usize>,
    drover_weights: PriorityWeights,
    estimates: Option<f64>,
}

impl Options {
    /// Reads the arguments; a bad one is reported and is the exit code.
    fn parse(args: &[String]) -> Result<Options, ExitCode> {
        let mut o = Options {
            policies: vec![Policy::Fifo, Policy::Slurm, Policy::Drover],
            policy_given: false,
            traces: Vec::new(),
            gpus_override: None,
            preempt: false,
            q: QosWorkload {
                high_frac: 0.2,
                seed: 1,
                ckpt_interval_s: 1_800,
                restart_overhead_s: 120,
                kill_wait_s: SchedulerConfig::default().kill_wait_s,
                exempt_s: None,
            },
            depth: None,
            drover_weights: PriorityWeights::short_first(),
            estimates: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |what: &str| -> Result<f64, ExitCode> {
                match it.next().and_then(|g| g.parse::<f64>().ok()) {
                    Some(v) if v >= 0.0 => Ok(v),
                    _ => {
                        eprintln!("{what} needs a number");
                        Err(ExitCode::FAILURE)
                    }
                }
            };
            let parsed = match a.as_str() {
                // A smaller cluster than the trace's, to see the policies under contention.
                "--gpus" => num("--gpus").map(|g| o.gpus_override = Some(g as u32)),
                "--preempt" => {
                    o.preempt = true;
                    Ok(())
                }
                "--high-qos-frac" => num("--high-qos-frac").map(|f| o.q.high_frac = f.min(1.0)),
                "--seed" => num("--seed").map(|s| o.q.seed = s as u64),
                "--ckpt-interval-s" => num("--ckpt-interval-s").map(|s| o.q.ckpt_interval_s = s as u64),
                "--restart-overhead-s" => num("--restart-overhead-s").map(|s| o.q.restart_overhead_s = s as u64),
                "--kill-wait-s" => num("--kill-wait-s").map(|s| o.q.kill_wait_s = s as u64),
                "--exempt-s" => num("--exempt-s").map(|s| o.q.exempt_s = Some(s as u64)),
                "--depth" => num("--depth").map(|d| o.depth = Some(d as usize)),
                // Over-estimated time limits: runtime × U[1, F], rounded up to an hour (seeded by --seed).
                "--estimates" => num("--estimates").map(|f| o.estimates = Some(f.max(1.0))),
                // Drover's weights: a profile, then single weights over it (for sweeps).
                "--drover-weights" => {
                    o.drover_weights = match it.next().map(String::as_str) {
                        Some("short-first") => PriorityWeights::short_first(),
                        Some("default") => PriorityWeights::default(),
                        Some("basic") => PriorityWeights {
                            age: 0,
                            fairshare: 0,
                            job_size: 0,
                            partition: 0,
                            qos: 0,
                            ..Default::default()
                        },
                        other => {
                            eprintln!("unknown weights {other:?} (short-first, default, basic)");
                            return Err(ExitCode::FAILURE);
                        }
                    };
                    Ok(())
                }
                "--short-weight" => num("--short-weight").map(|w| o.drover_weights.short = w as u32),
                "--age-weight" => num("--age-weight").map(|w| o.drover_weights.age = w as u32),
                "--max-age-s" => num("--max-age-s").map(|w| o.drover_weights.max_age_s = w as u64),
                "--job-size-weight" => num("--job-size-weight").map(|w| o.drover_weights.job_size = w as u32),
                "--favor-small" => {
                    o.drover_weights.favor_small = true;
                    Ok(())
                }
                "--policy" => {
                    o.policy_given = true;
                    o.policies = match it.next().map(String::as_str) {
                        Some("fifo") => vec![Policy::Fifo],
                        Some("slurm") => vec![Policy::Slurm],
                        Some("drover") => vec![Policy::Drover],
                        Some("all") => vec![Policy::Fifo, Policy::Slurm, Policy::Drover],
                        other => {
                            eprintln!("unknown policy {other:?}");
                            return Err(ExitCode::FAILURE);
                        }
                    };
                    Ok(())
                }
                _ => {
                    o.traces.push(a.clone());
                    Ok(())
                }
            };
            parsed?;
        }
        Ok(o)
    }
}

/// Drover's weights and how time limits are made, above the table.
fn print_weights(sim: &Sim) {
    let w = &sim.drover_weights;
    println!(
        "Drover weights: age {} (max age {} s), fairshare {}, job size {}{}, partition {}, qos {}, short {}; time limits: {}",
        w.age,
        w.max_age_s,
        w.fairshare,
        w.job_size,
        if w.favor_small { " (favor small)" } else { "" },
        w.partition,
        w.qos,
        w.short,
        match sim.estimates {
            Some(e) => format!("runtime x U[1, {}] rounded up to the hour (seed {})", e.max_factor, e.seed),
            None => "exact".into(),
        }
    );
    println!();
}

/// The table's header (its columns differ with preemption).
fn print_header(sim: &Sim) {
    if let Some(q) = sim.qos {
        println!(
            "high-QOS fraction {} (seed {}), checkpoint every {} s, restart overhead {} s, KillWait {} s, exempt {:?} s, depth {:?}",
            q.high_frac, q.seed, q.ckpt_interval_s, q.restart_overhead_s, q.kill_wait_s, q.exempt_s, sim.depth
        );
        println!();
        println!(
            "| trace | GPUs | policy | jobs | avg JCT (s) | avg bsld (10 s) | bsld high / normal | avg wait (s) | max wait (s) | preemptions | GPU-h lost | GPU util | passes | sim wall (s) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    } else {
        println!(
            "| trace | GPUs | policy | jobs | avg wait (s) | p99 wait (s) | max wait (s) | avg bsld (10 s) | GPU util | makespan (s) | passes | sim wall (s) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
}

/// One policy's row.
fn print_row(name: &str, gpus: u32, variant: Variant, s: &Stats, with_qos: bool) {
    let skipped = if s.skipped > 0 { format!(" ({} too big)", s.skipped) } else { String::new() };
    let policy = variant.name();
    if with_qos {
        println!(
            "| {name} | {gpus} | {policy} | {}{skipped} | {:.0} | {:.2} | {:.2} / {:.2} | {:.0} | {} | {} | {:.0} | {:.1}% | {} | {:.1} |",
            s.jobs,
            s.avg_jct_s,
            s.avg_bsld,
            s.bsld_high,
            s.bsld_normal,
            s.avg_wait_s,
            s.max_wait_s,
            s.preemptions,
            s.lost_gpu_h,
            s.util * 100.0,
            s.passes,
            s.wall_s
        );
    } else {
        println!(
            "| {name} | {gpus} | {policy} | {}{skipped} | {:.0} | {} | {} | {:.2} | {:.1}% | {} | {} | {:.1} |",
            s.jobs,
            s.avg_wait_s,
            s.p99_wait_s,
            s.max_wait_s,
            s.avg_bsld,
            s.util * 100.0,
            s.makespan_s,
            s.passes,
            s.wall_s
        );
    }
}

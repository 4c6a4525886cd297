//! Deterministic simulation of a Drover controller cluster.
//!
//! The real replica code — openraft `Raft`, our RocksDB `LogStore` and `StateMachineStore`, the state machine,
//! the leader's scheduling loop and leader duties, and the client write path (`propose::propose_checked`) — runs on
//! one thread of a tokio runtime with a paused clock. Replicas talk through a simulated network
//! ([`network`]) that carries openraft's messages as JSON with seeded delays (so reordering), losses, one-way and
//! symmetric partitions; a seeded fault schedule crashes replicas (Raft shut down, restarted from its RocksDB
//! directory) while simulated users submit and cancel jobs and simulated agents register their nodes, run what
//! they are assigned, and report ends and released holds with the commands real agents cause.
//!
//! Everything random comes from the seed: the network's, the workload's and the faults' RNGs, and openraft's own
//! (election timeouts), which `drover_controller::runtime::enter_simulation` seeds. Blocking store work runs
//! inline on that thread, and the clock stamped into entries is the paused runtime clock. So a seed replays
//! exactly: the same trace, message for message ([`SimReport::trace_hash`]).
//!
//! Judged per run: the [`crate::checker`] promises over what users and agents saw (no acknowledged job lost on
//! any replica, no job id given twice, no GPU used by two running incarnations, terminal states stay terminal,
//! every job finishes within `settle_ms` after the faults heal), and, sampled every
//! [`SAMPLE_MS`] on every replica, the applied state: no GPU allocated to two jobs, the state's own invariants,
//! and state machine safety (replicas at the same applied index hold the same state).
//!
//! Running it:
//! - CI: `cargo test -p drover-chaos --test sim` runs a bounded number of seeds.
//! - Soak: `DROVER_SIM_SEEDS=1000 cargo test -p drover-chaos --release --test sim -- --nocapture --exact soak`
//!   (`DROVER_SIM_FIRST_SEED` picks where to start; the `soak` profile: more jobs, a longer fault phase).
//! - Replay one seed, as a failure prints it: `DROVER_SIM_SEED=N DROVER_SIM_PROFILE=ci|soak cargo test -p
//!   drover-chaos --test sim -- --nocapture --exact replay`; `DROVER_SIM_TRACE=FILE` also writes the whole trace
//!   there (diff two runs' files to find where they part).
//!
//! Agents are cut off now and then: the leader's real `AgentHub` liveness loop declares a silent node down
//! (its jobs requeued) while the simulated agent fences itself first, killing its tasks once it has not reached
//! a leader with a fresh quorum for `fence_after_ms`, as the real agent's lease does; the checker then sees
//! whether two incarnations of a job ever ran at once.
//!
//! [`PlantedBug`]s show the harness can fail: every disk wiped (acknowledged jobs lost), agents that never
//! fence (a GPU used by two incarnations).
//!
//! Not simulated: the gRPC/TLS transport itself and the agent session stream (a simulated agent heartbeats
//! with `AgentHub::seen`, reads the leader's applied state, and writes the commands a session would commit),
//! and power loss (a crash keeps what RocksDB had written, as a process crash does).

mod network;
mod trace;
mod workload;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_controller::config::AgentTiming;
use drover_controller::leader::agents::AgentHub;
use drover_controller::leader::leader_duties;
use drover_controller::leader::scheduling::{Insights, scheduling_loop};
use drover_controller::propose::Proposer;
use drover_controller::runtime::enter_simulation;
use drover_controller::store::{LogStore, StateMachineStore, open_db};
use drover_controller::types::{Raft, ReplicaNode};
use drover_state::{ClusterConfig, JobState};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::checker::{Bounds, Violation, check};
use crate::history::{EventKind, History};
use network::{Conditions, Net, Replica, SimNetwork, lock, new_net};

/// How often the oracle samples every replica's applied state.
pub const SAMPLE_MS: u64 = 50;
/// The wall-clock time the simulation's start stands for (entries carry plausible epoch times).
const EPOCH_MS: u64 = 1_767_225_600_000;
/// Link delays when no fault is active.
const BASE_MAX_DELAY_MS: u64 = 5;
/// Attempts (10 simulated ms apart) to reopen a crashed replica's RocksDB while its old handles are dropped.
const REOPEN_ATTEMPTS: u32 = 300;

/// A bug planted on purpose, to show the simulation can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// Halfway through the fault phase every replica loses its disk and the cluster is bootstrapped afresh: the
    /// jobs acknowledged before must show up as lost.
    WipeAllDisks,
    /// Agents never fence themselves: a cut-off agent's tasks run on while the leader requeues its jobs
    /// elsewhere, and a job must show up running two incarnations at once.
    AgentsNeverFence,
}

/// Which faults the schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Faults {
    None,
    /// Replica crashes, partitions (symmetric and one-way), message loss, delays, and agents cut off.
    All,
    /// Only agents cut off, under a stable leader: long cuts then outlast the leader's node timeout, so nodes
    /// are declared down and their jobs requeued (with every fault kind, leader changes keep restarting the
    /// timeout's grace period and that is rare).
    AgentsOnly,
}

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub replicas: u64,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Submissions the user makes.
    pub jobs: u64,
    /// Faults are injected during this many simulated ms from the start; then everything heals.
    pub fault_phase_ms: u64,
    /// After healing, every acknowledged job must be terminal within this many simulated ms (liveness).
    pub settle_ms: u64,
    pub faults: Faults,
    /// Node-return drills ([`return_drills`]) on top of the fault schedule: an agent cut off past its lease with
    /// jobs placed on it, brought back while the controllers elect a leader. Off, a seed's schedule is what it
    /// was before the drills existed (the regression seeds replay that way).
    pub return_drills: bool,
    pub planted: Option<PlantedBug>,
    /// Hang detection and quarantine under the faults: a quarter of the jobs have a 1 s progress timeout, their
    /// batch tasks report progress, and a third of those hang in their first incarnation; a node charged twice is
    /// quarantined, and an operator resumes quarantined nodes. Off, a seed's schedule is what it was before (the
    /// fencing-race seeds replay that way).
    pub hangs: bool,
    /// Which of [`SimOptions::profile`]'s shapes this is, so a failure prints the command that replays it.
    pub profile: &'static str,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            replicas: 3,
            nodes: 3,
            gpus_per_node: 8,
            jobs: 24,
            // Room for one node-return drill: a cut past `node_timeout_ms` (8 s) and the election around its end.
            fault_phase_ms: DRILL_PERIOD_MS,
            settle_ms: 40_000,
            faults: Faults::All,
            return_drills: true,
            planted: None,
            hangs: true,
            profile: "ci",
        }
    }
}

impl SimOptions {
    /// The named shapes: `ci` (the default: a few seeds must fit in a CI minute), `soak` (more jobs, a longer
    /// fault phase, two node-return drills), and `soak-no-drills`: the soak as it was before the drills, where the
    /// fencing-race seeds of issue 36 were found (they replay there).
    pub fn profile(name: &str) -> Option<SimOptions> {
        match name {
            "ci" => Some(SimOptions::default()),
            "soak" => Some(SimOptions {
                jobs: 60,
                fault_phase_ms: 2 * DRILL_PERIOD_MS,
                profile: "soak",
                ..SimOptions::default()
            }),
            "soak-no-drills" => Some(SimOptions {
                jobs: 60,
                fault_phase_ms: 30_000,
                return_drills: false,
                hangs: false,
                profile: "soak-no-drills",
                ..SimOptions::default()
            }),
            _ => None,
        }
    }
}

/// What one seed did and what broke.
#[derive(Debug, Clone)]
pub struct SimReport {
    pub seed: u64,
    pub profile: &'static str,
    /// A hash of every delivered message, client and agent observation and fault, with its simulated time.
    pub trace_hash: u64,
    pub trace_events: u64,
    pub violations: Vec<String>,
    pub acked: usize,
    pub delivered: u64,
    pub lost: u64,
    /// Snapshots sent to a replica that lagged too far behind the leader's log.
    pub snapshots: u64,
    /// Agents that found their node declared down and registered again.
    pub reregistrations: u64,
    /// Incarnations requeued as hung, and quarantined nodes the operator resumed.
    pub hangs: u64,
    pub quarantines: u64,
    pub faults: u64,
    pub sim_ms: u64,
    /// The last trace lines, for a failure report.
    pub tail: Vec<String>,
}

impl SimReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// A failure report: the seed, how to replay it, what broke, and the end of the trace.
    pub fn failure_text(&self) -> String {
        let mut out = format!(
            "seed {} failed ({} violations); replay: {}\n",
            self.seed,
            self.violations.len(),
            replay_command(self.seed, self.profile)
        );
        for v in self.violations.iter().take(20) {
            out.push_str(&format!("  - {v}\n"));
        }
        out.push_str("last trace lines:\n");
        for line in self.tail.iter().rev().take(40).rev() {
            out.push_str(&format!("    {line}\n"));
        }
        out
    }
}

/// The command that reruns `seed` of `profile` alone, printing its trace's end.
pub fn replay_command(seed: u64, profile: &str) -> String {
    format!(
        "DROVER_SIM_SEED={seed} DROVER_SIM_PROFILE={profile} cargo test -p drover-chaos --test sim -- --nocapture --exact replay"
    )
}

/// Runs the seeds in `seeds` one after another and returns their reports.
pub fn run_seeds(seeds: std::ops::Range<u64>, options: &SimOptions) -> Vec<SimReport> {
    seeds.map(|seed| run_seed(seed, options)).collect()
}

thread_local! {
    /// Panics on the simulation thread (in any replica's task), collected as violations.
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn install_panic_recorder() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.borrow_mut().push(info.to_string()));
            previous(info);
        }));
    });
}

/// Runs one seed to the end and judges it. Never panics on the cluster's account: a panic anywhere in the run
/// is a violation.
pub fn run_seed(seed: u64, options: &SimOptions) -> SimReport {
    install_panic_recorder();
    PANICS.with(|p| p.borrow_mut().clear());
    // RAM-backed when available: the stores fsync on every append, and only simulated time matters here.
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() { base.to_path_buf() } else { std::env::temp_dir() };
    let root = match tempfile::Builder::new().prefix("drover-sim-").tempdir_in(&base) {
        Ok(dir) => dir,
        Err(e) => {
            return failed_to_start(seed, options, format!("cannot make a data directory in {}: {e}", base.display()));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build() {
        Ok(rt) => rt,
        Err(e) => return failed_to_start(seed, options, format!("cannot build the runtime: {e}")),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(simulate(seed, options, root.path()))
    }));
    // Dropping the runtime cancels whatever replica tasks are left before their directories go.
    drop(runtime);
    let mut report = match result {
        Ok(report) => report,
        Err(_) => failed_to_start(seed, options, "the simulation itself panicked".into()),
    };
    let panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    report.violations.extend(panics.into_iter().map(|p| format!("panic: {p}")));
    report
}

fn failed_to_start(seed: u64, options: &SimOptions, why: String) -> SimReport {
    SimReport {
        seed,
        profile: options.profile,
        trace_hash: 0,
        trace_events: 0,
        violations: vec![why],
        acked: 0,
        delivered: 0,
        lost: 0,
        snapshots: 0,
        reregistrations: 0,
        hangs: 0,
        quarantines: 0,
        faults: 0,
        sim_ms: 0,
        tail: Vec::new(),
    }
}

/// A run commits a few hundred entries: snapshots this often (keeping few entries after them) make replicas that
/// were down or cut off catch up by snapshot too, through the real snapshot builder, transfer and install.
const SNAPSHOT_AFTER_ENTRIES: u64 = 60;

/// The production timing (`RaftTuning::default`), with frequent snapshots (see [`SNAPSHOT_AFTER_ENTRIES`]).
fn raft_config() -> Arc<openraft::Config> {
    let tuning = drover_controller::config::RaftTuning::default();
    let config = openraft::Config {
        cluster_name: "drover-sim".into(),
        heartbeat_interval: tuning.heartbeat_interval_ms,
        election_timeout_min: tuning.election_timeout_min_ms,
        election_timeout_max: tuning.election_timeout_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_AFTER_ENTRIES),
        max_in_snapshot_log_to_keep: 5,
        ..Default::default()
    };
    Arc::new(config.validate().expect("the simulation's raft settings are valid"))
}

/// Starts (or restarts) replica `id` from its data directory, as `Controller::start` does minus gRPC.
async fn start_replica(net: &Net, id: u64) -> anyhow::Result<()> {
    let dir = lock(net).data_dirs[&id].clone();
    let mut attempt = 0;
    let db = loop {
        match open_db(&dir) {
            Ok(db) => break db,
            // The crashed incarnation's last handles are dropped as its cancelled tasks unwind.
            Err(e) if attempt < REOPEN_ATTEMPTS => {
                attempt += 1;
                if attempt == REOPEN_ATTEMPTS {
                    anyhow::bail!("replica {id}: cannot reopen its store: {e}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("replica {id}: cannot reopen its store: {e}")),
        }
    };
    let sm = StateMachineStore::open(db.clone()).map_err(|e| anyhow::anyhow!("replica {id}: state machine: {e}"))?;
    let view = sm.view();
    let network = SimNetwork { from: id, net: net.clone() };
    let raft = Raft::new(id, raft_config(), network, LogStore::new(db), sm)
        .await
        .map_err(|e| anyhow::anyhow!("replica {id}: raft: {e}"))?;
    let timing = AgentTiming::default();
    let proposer = Proposer::new(raft.clone());
    let hub = AgentHub::new(id, proposer.clone(), view.clone(), timing, raft_config().election_timeout_min);
    let tasks = vec![
        tokio::spawn(leader_duties(proposer.clone(), view.clone(), id, lock(net).cluster.clone())),
        tokio::spawn(scheduling_loop(proposer.clone(), view.clone(), id, Insights::default())),
        tokio::spawn(drover_controller::leader::agents::leader_loops(hub.clone())),
    ];
    let mut net = lock(net);
    net.trace.record(format_args!("replica {id} started"), &[]);
    net.replicas.insert(id, Replica { raft, proposer, view, hub, tasks });
    Ok(())
}

async fn crash_replica(net: &Net, id: u64) {
    let Some(replica) = lock(net).replicas.remove(&id) else { return };
    lock(net).trace.record(format_args!("replica {id} crashed"), &[]);
    for task in &replica.tasks {
        task.abort();
    }
    let _ = replica.raft.shutdown().await;
}

/// What `server::bootstrap` does once every founder answered that it is fresh: the lowest id initializes.
async fn initialize(net: &Net, ids: &[u64]) -> anyhow::Result<()> {
    let raft =
        lock(net).replicas.get(&ids[0]).map(|r| r.raft.clone()).ok_or_else(|| anyhow::anyhow!("replica 1 is down"))?;
    let members: BTreeMap<u64, ReplicaNode> =
        ids.iter().map(|id| (*id, ReplicaNode { addr: format!("sim-replica-{id}") })).collect();
    raft.initialize(members).await.map_err(|e| anyhow::anyhow!("initialize: {e}"))
}

/// What the oracle learned from sampling the replicas.
#[derive(Default)]
struct Oracle {
    /// Applied index -> (digest of the state there, the replica that first showed it).
    digests: BTreeMap<u64, (u64, u64)>,
    violations: Vec<String>,
    /// The newest applied index the observer read job states at: it never reads an older state.
    observed_index: u64,
    observed: BTreeMap<u64, String>,
}

impl Oracle {
    fn violation(&mut self, v: String) {
        // Bounded: a broken run repeats itself every sample.
        if self.violations.len() < 100 && !self.violations.contains(&v) {
            self.violations.push(v);
        }
    }
}

fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// One sample: every live replica's applied state is checked, and the freshest leader's job states observed.
fn sample(net: &Net, oracle: &mut Oracle) {
    let replicas: Vec<(u64, drover_controller::store::StateView)> =
        lock(net).replicas.iter().map(|(id, r)| (*id, r.view.clone())).collect();
    for (id, view) in &replicas {
        let applied = view.read();
        let Some(index) = applied.last_applied.as_ref().map(|l| l.index()) else { continue };
        let state = &applied.state;
        let mut holders: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for job in state.jobs.values().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
            for share in &job.allocation {
                for gpu in &share.gpus {
                    if let Some(other) = holders.insert((share.node.as_str(), *gpu), job.id) {
                        oracle.violation(format!(
                            "replica {id} at index {index}: GPU {gpu} on {} allocated to jobs {other} and {}",
                            share.node, job.id
                        ));
                    }
                }
            }
        }
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| state.check_invariants())).is_err() {
            oracle.violation(format!("replica {id} at index {index}: the state's invariants fail (see the panic)"));
        }
        let bytes = serde_json::to_vec(&(&state.meta, &state.jobs, &state.nodes)).expect("state serializes");
        let d = digest(&bytes);
        match oracle.digests.get(&index) {
            Some((known, first)) if *known != d => oracle.violation(format!(
                "state machine safety: replicas {first} and {id} hold different states at applied index {index}"
            )),
            Some(_) => {}
            None => {
                oracle.digests.insert(index, (d, *id));
            }
        }
    }
    observe(net, oracle);
}

/// Reads every acknowledged job's state on the leader, if its applied state is no older than the last one read,
/// and records the changes (the checker's terminal-state and liveness promises read these).
fn observe(net: &Net, oracle: &mut Oracle) {
    let Some(leader) = workload::leader(net) else { return };
    let view = leader.view;
    let index = view.read().last_applied.as_ref().map_or(0, |l| l.index());
    if index < oracle.observed_index {
        return;
    }
    oracle.observed_index = index;
    let jobs: Vec<u64> = crate::history::acked_jobs(&lock(net).events).collect();
    for job in jobs {
        let state = match view.job(job) {
            Ok(Some(j)) => j.state.name().to_string(),
            Ok(None) => continue,
            Err(e) => {
                oracle.violation(format!("reading job {job}: {e}"));
                continue;
            }
        };
        if oracle.observed.get(&job) != Some(&state) {
            oracle.observed.insert(job, state.clone());
            lock(net).event(EventKind::StateObserved { job, state });
        }
    }
}

/// Faults waiting to be undone, by simulated ms.
enum Pending {
    Restart(u64),
    Unblock(Vec<(u64, u64)>),
    ResetLoss,
    ResetDelay,
    Reconnect(String),
}

/// The fault phase: until `options.fault_phase_ms`, a fault every 0.1-1.2 s (seeded), each undone after it
/// lasts; returns how many started and those still to undo. The order of the random draws is the schedule's
/// identity: a seed replays only while it stays the same.
async fn fault_phase(
    net: &Net,
    seed: u64,
    options: &SimOptions,
    ids: &[u64],
    oracle: &Arc<Mutex<Oracle>>,
    setup_errors: &mut Vec<String>,
    started: tokio::time::Instant,
) -> (u64, Vec<(u64, Pending)>) {
    // The simulation's clock, from its start (not the phase's).
    let now_ms = || started.elapsed().as_millis() as u64;
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x6661_756c_7473);
    let mut pending: Vec<(u64, Pending)> = Vec::new();
    let mut faults = 0u64;
    let mut wiped = false;
    let minority = (options.replicas - 1) / 2;
    while now_ms() < options.fault_phase_ms {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1_200))).await;
        let now = now_ms();
        let (due, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(at, _)| *at <= now);
        pending = later;
        for (_, p) in due {
            undo(net, p, setup_errors).await;
        }
        if options.planted == Some(PlantedBug::WipeAllDisks) && !wiped && now >= options.fault_phase_ms / 2 {
            wiped = true;
            wipe_all(net, ids, setup_errors).await;
            oracle.lock().expect("oracle lock").digests.clear();
            oracle.lock().expect("oracle lock").observed_index = 0;
            continue;
        }
        let kind = match options.faults {
            Faults::None => continue,
            Faults::All => rng.random_range(0..6),
            Faults::AgentsOnly => 5,
        };
        // A node-return drill needs a leader that stays until its node is declared down: no replica fault then
        // (the numbers below are still drawn, so the rest of the schedule does not shift).
        let drill_running = lock(net).conditions.drill_running;
        let node = format!("gpu{:02}", rng.random_range(1..=options.nodes));
        let a = ids[rng.random_range(0..ids.len())];
        let b = ids[rng.random_range(0..ids.len())];
        let lasts_ms = rng.random_range(100..3_000);
        let (down, a_live) = {
            let net = lock(net);
            (ids.len() - net.replicas.len(), net.replicas.contains_key(&a))
        };
        let name = match kind {
            0..=4 if drill_running => continue,
            0 if down < minority as usize && a_live => {
                crash_replica(net, a).await;
                pending.push((now + lasts_ms, Pending::Restart(a)));
                format!("crash replica {a} for {lasts_ms} ms")
            }
            1 => {
                let links: Vec<(u64, u64)> = ids.iter().filter(|x| **x != a).flat_map(|x| [(a, *x), (*x, a)]).collect();
                lock(net).conditions.blocked.extend(links.iter().copied());
                pending.push((now + lasts_ms, Pending::Unblock(links)));
                format!("isolate replica {a} for {lasts_ms} ms")
            }
            2 if a != b => {
                lock(net).conditions.blocked.insert((a, b));
                pending.push((now + lasts_ms, Pending::Unblock(vec![(a, b)])));
                format!("cut link {a}->{b} one way for {lasts_ms} ms")
            }
            3 => {
                let permille = rng.random_range(50..400);
                lock(net).conditions.loss_permille = permille;
                pending.push((now + lasts_ms, Pending::ResetLoss));
                format!("lose {permille}/1000 messages for {lasts_ms} ms")
            }
            4 => {
                let max = rng.random_range(20..300);
                lock(net).conditions.max_delay_ms = max;
                pending.push((now + lasts_ms, Pending::ResetDelay));
                format!("delay messages up to {max} ms for {lasts_ms} ms")
            }
            // Long enough, sometimes, for the agent to fence itself and the leader to declare its node down.
            // One cut per agent at a time: an overlapping one's heal would end the longer one early.
            5 if !lock(net).conditions.agents_cut.contains(&node) => {
                let lasts_ms = rng.random_range(500..12_000);
                lock(net).conditions.agents_cut.insert(node.clone());
                pending.push((now + lasts_ms, Pending::Reconnect(node.clone())));
                format!("cut agent {node} off for {lasts_ms} ms")
            }
            _ => continue,
        };
        faults += 1;
        lock(net).event(EventKind::FaultStarted { name });
    }
    (faults, pending)
}

/// Heals everything: links, loss, delays, and restarts whoever is down.
async fn heal_all(net: &Net, pending: Vec<(u64, Pending)>, ids: &[u64], setup_errors: &mut Vec<String>) {
    for (_, p) in pending {
        undo(net, p, setup_errors).await;
    }
    lock(net).conditions = Conditions { max_delay_ms: BASE_MAX_DELAY_MS, ..Conditions::default() };
    for id in ids {
        if !lock(net).replicas.contains_key(id)
            && let Err(e) = start_replica(net, *id).await
        {
            setup_errors.push(e.to_string());
        }
    }
    lock(net).event(EventKind::FaultHealed { name: "all".into() });
}

async fn simulate(seed: u64, options: &SimOptions, root: &Path) -> SimReport {
    let _simulated = enter_simulation(seed, EPOCH_MS);
    let started = tokio::time::Instant::now();
    let now_ms = || started.elapsed().as_millis() as u64;
    let ids: Vec<u64> = (1..=options.replicas).collect();
    let dirs: BTreeMap<u64, PathBuf> = ids.iter().map(|id| (*id, root.join(format!("replica-{id}")))).collect();
    let net = new_net(seed, dirs, Conditions { max_delay_ms: BASE_MAX_DELAY_MS, ..Conditions::default() });
    lock(&net).cluster = sim_cluster(options);
    let mut setup_errors = Vec::new();
    for id in &ids {
        if let Err(e) = start_replica(&net, *id).await {
            setup_errors.push(e.to_string());
        }
    }
    if let Err(e) = initialize(&net, &ids).await {
        setup_errors.push(e.to_string());
    }

    let oracle = Arc::new(Mutex::new(Oracle::default()));
    let sampler = {
        let (net, oracle) = (net.clone(), oracle.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(SAMPLE_MS)).await;
                sample(&net, &mut oracle.lock().expect("oracle lock"));
            }
        })
    };
    let until_ms = options.fault_phase_ms + options.settle_ms;
    let client = tokio::spawn(workload::client(net.clone(), seed, options.jobs, options.gpus_per_node, options.hangs));
    let operator = options.hangs.then(|| tokio::spawn(workload::operator(net.clone())));
    let agents: Vec<_> = (1..=options.nodes)
        .map(|n| {
            let fences = options.planted != Some(PlantedBug::AgentsNeverFence);
            let name = format!("gpu{n:02}");
            tokio::spawn(workload::agent(net.clone(), seed, name, options.gpus_per_node, until_ms, fences))
        })
        .collect();

    let drills = options.return_drills.then(|| {
        tokio::spawn(return_drills(net.clone(), seed, options.nodes, options.fault_phase_ms, options.gpus_per_node))
    });

    let (faults, pending) = fault_phase(&net, seed, options, &ids, &oracle, &mut setup_errors, started).await;
    if let Some(drills) = drills {
        drills.abort();
    }
    heal_all(&net, pending, &ids, &mut setup_errors).await;

    // The settle phase: wait for every acknowledged job to end and every replica to catch up.
    let healed_ms = now_ms();
    while now_ms() < healed_ms + options.settle_ms {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if client.is_finished() && settled(&net) {
            break;
        }
    }
    let sim_ms = now_ms();
    client.abort();
    if let Some(operator) = operator {
        operator.abort();
    }
    for a in &agents {
        a.abort();
    }
    sampler.abort();
    let mut oracle = std::mem::take(&mut *oracle.lock().expect("oracle lock"));
    sample(&net, &mut oracle);

    let violations = judge(&net, &ids, options, setup_errors, oracle);
    let hangs = count_hangs(&net);
    for id in &ids {
        crash_replica(&net, *id).await;
    }
    let net = lock(&net);
    net.trace.write_full();
    SimReport {
        seed,
        profile: options.profile,
        trace_hash: net.trace.hash(),
        trace_events: net.trace.events,
        violations,
        acked: net.events.iter().filter(|e| matches!(e.kind, EventKind::SubmitAcked { .. })).count(),
        delivered: net.delivered,
        lost: net.lost,
        snapshots: net.snapshots_received,
        reregistrations: net.reregistrations,
        hangs,
        quarantines: net.quarantines_resumed,
        faults,
        sim_ms,
        tail: net.trace.tail(),
    }
}

/// The cluster the simulation configures: with hangs, quarantine after two charges (so it happens within a seed);
/// without, none, as before quarantine existed.
fn sim_cluster(options: &SimOptions) -> ClusterConfig {
    let mut cluster = ClusterConfig::default();
    cluster.resilience.quarantine_failures = if options.hangs { 2 } else { 0 };
    cluster
}

/// How far apart node-return drills start (each needs a cut past `node_timeout_ms` and an election after it).
const DRILL_PERIOD_MS: u64 = 16_000;

/// The node-return drills: the path the fencing race of issue 36 hid in, exercised on purpose. Every
/// [`DRILL_PERIOD_MS`] of the fault phase: an agent not already cut off is cut off, and a job that only that node
/// may run is submitted at once, so the leader places it there while the node cannot hear it (an assignment in
/// flight). Once the leader decides the node is lost (its lease ran out long before), one of three endings, so
/// that the node returns while the controllers elect a new leader with the decision at every stage:
/// - the leader is isolated at once (its `NodeDown` may be uncommitted) and the agent returns during the election;
/// - the agent returns at once, and the leader is isolated a moment later;
/// - the decision commits first, then the leader is isolated and the agent returns during the election.
///
/// The ordinary schedule starts no replica fault while a drill runs, so the leader stays long enough to decide.
async fn return_drills(net: Net, seed: u64, nodes: u32, fault_phase_ms: u64, gpus_per_node: u32) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7265_7475_726e);
    let started = tokio::time::Instant::now();
    let now_ms = || started.elapsed().as_millis() as u64;
    let give_up_ms = AgentTiming::default().node_timeout_ms + 6_000;
    for round in 0u64.. {
        let cut_at = round * DRILL_PERIOD_MS + rng.random_range(500..2_000);
        let ending = rng.random_range(0..3u32);
        let pause_ms = rng.random_range(0..1_500);
        let isolate_ms = rng.random_range(500..2_500);
        let node = format!("gpu{:02}", rng.random_range(1..=nodes));
        if cut_at + give_up_ms > fault_phase_ms {
            return;
        }
        tokio::time::sleep(Duration::from_millis(cut_at.saturating_sub(now_ms()))).await;
        {
            let mut net = lock(&net);
            if net.conditions.agents_cut.contains(&node) {
                continue;
            }
            net.conditions.drill_running = true;
            net.conditions.agents_cut.insert(node.clone());
            net.event(EventKind::FaultStarted { name: format!("drill: cut agent {node} off") });
        }
        workload::submit_pinned(&net, &node, round, gpus_per_node).await;
        // Until the leader decides the node is lost (or the drill gives up on it).
        while now_ms() < cut_at + give_up_ms {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if workload::leader(&net).is_some_and(|l| l.hub.is_condemned(&node)) {
                break;
            }
        }
        let isolate = |net: &Net| {
            let Some(leader) = workload::leader_id(net) else { return };
            let mut net = lock(net);
            let others: Vec<u64> = net.data_dirs.keys().copied().filter(|x| *x != leader).collect();
            net.conditions.drill_blocked.extend(others.iter().flat_map(|x| [(leader, *x), (*x, leader)]));
            net.event(EventKind::FaultStarted { name: format!("drill: isolate leader {leader} for {isolate_ms} ms") });
        };
        let reconnect = |net: &Net| {
            let mut net = lock(net);
            net.conditions.agents_cut.remove(&node);
            net.event(EventKind::FaultHealed { name: format!("drill: agent {node} reconnected") });
        };
        match ending {
            0 => {
                isolate(&net);
                tokio::time::sleep(Duration::from_millis(pause_ms.min(isolate_ms))).await;
                reconnect(&net);
                tokio::time::sleep(Duration::from_millis(isolate_ms - pause_ms.min(isolate_ms))).await;
            }
            1 => {
                reconnect(&net);
                tokio::time::sleep(Duration::from_millis(pause_ms / 5)).await;
                isolate(&net);
                tokio::time::sleep(Duration::from_millis(isolate_ms)).await;
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                isolate(&net);
                tokio::time::sleep(Duration::from_millis(isolate_ms / 2)).await;
                reconnect(&net);
                tokio::time::sleep(Duration::from_millis(isolate_ms - isolate_ms / 2)).await;
            }
        }
        let mut net = lock(&net);
        net.conditions.drill_blocked.clear();
        net.conditions.drill_running = false;
        net.event(EventKind::FaultHealed { name: "drill: leader reconnected".into() });
    }
}

async fn undo(net: &Net, pending: Pending, errors: &mut Vec<String>) {
    match pending {
        Pending::Restart(id) => {
            if !lock(net).replicas.contains_key(&id)
                && let Err(e) = start_replica(net, id).await
            {
                errors.push(e.to_string());
            }
        }
        Pending::Unblock(links) => {
            let mut net = lock(net);
            for link in links {
                net.conditions.blocked.remove(&link);
            }
        }
        Pending::ResetLoss => lock(net).conditions.loss_permille = 0,
        Pending::ResetDelay => lock(net).conditions.max_delay_ms = BASE_MAX_DELAY_MS,
        Pending::Reconnect(node) => {
            lock(net).conditions.agents_cut.remove(&node);
        }
    }
}

/// The planted bug: every replica loses its disk, and the cluster is bootstrapped afresh.
async fn wipe_all(net: &Net, ids: &[u64], errors: &mut Vec<String>) {
    lock(net).event(EventKind::FaultStarted { name: "wipe every replica's disk".into() });
    for id in ids {
        crash_replica(net, *id).await;
    }
    // Let the crashed replicas' cancelled tasks drop their store handles.
    tokio::time::sleep(Duration::from_millis(10)).await;
    for id in ids {
        let dir = lock(net).data_dirs[id].clone();
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            errors.push(format!("wiping {}: {e}", dir.display()));
        }
        if let Err(e) = start_replica(net, *id).await {
            errors.push(e.to_string());
        }
    }
    if let Err(e) = initialize(net, ids).await {
        errors.push(e.to_string());
    }
}

/// Every acknowledged job is terminal on the leader, nothing lingers, and every replica applied as far.
/// Incarnations the first replica's state records as requeued for a hang, over every acknowledged job.
fn count_hangs(net: &Net) -> u64 {
    let events = lock(net).events.clone();
    let Some(view) = lock(net).replicas.values().next().map(|r| r.view.clone()) else { return 0 };
    let mut hangs = 0;
    for id in crate::history::acked_jobs(&events) {
        if let Ok(Some(job)) = view.job(id) {
            hangs += job.history.iter().filter(|h| h.reason.starts_with("Hung")).count() as u64;
        }
    }
    hangs
}

fn settled(net: &Net) -> bool {
    let Some(leader) = workload::leader(net) else { return false };
    let view = leader.view;
    let acked: BTreeSet<u64> = crate::history::acked_jobs(&lock(net).events).collect();
    let leader_index = {
        let applied = view.read();
        if applied.state.nodes.values().any(|n| !n.lingering.is_empty() || !n.jobs.is_empty()) {
            return false;
        }
        applied.last_applied.as_ref().map(|l| l.index())
    };
    let all_terminal =
        acked.iter().all(|id| matches!(view.job(*id), Ok(Some(j)) if crate::checker::is_terminal(j.state.name())));
    let caught_up =
        lock(net).replicas.values().all(|r| r.view.read().last_applied.as_ref().map(|l| l.index()) == leader_index);
    all_terminal && caught_up
}

/// The verdict: setup errors, the oracle's findings, and the checker's over the history with each replica's
/// final listing (losses are judged per replica; the other promises once).
fn judge(net: &Net, ids: &[u64], options: &SimOptions, setup: Vec<String>, oracle: Oracle) -> Vec<String> {
    let mut out = setup;
    out.extend(oracle.violations);
    let events = lock(net).events.clone();
    let acked: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::SubmitAcked { job, .. } => Some(job),
            _ => None,
        })
        .collect();
    let bounds = Bounds { finish_within_ms: Some(options.settle_ms) };
    for (n, id) in ids.iter().enumerate() {
        let Some(view) = lock(net).replicas.get(id).map(|r| r.view.clone()) else {
            out.push(format!("replica {id} is down at the end"));
            continue;
        };
        let mut jobs: Vec<(u64, String)> = Vec::new();
        for job in &acked {
            if let Ok(Some(j)) = view.job(*job) {
                jobs.push((*job, j.state.name().to_string()));
            }
        }
        let mut history = History { events: events.clone() };
        let at_ms = history.events.last().map_or(0, |e| e.at_ms);
        history.events.push(crate::history::Event { at_ms, kind: EventKind::FinalJobs { jobs } });
        for v in check(&history, bounds) {
            if n == 0 || matches!(v, Violation::Lost { .. } | Violation::NoFinalListing) {
                out.push(format!("replica {id}'s final listing: {v}"));
            }
        }
    }
    out
}

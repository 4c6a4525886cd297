//! The simulated users and agents. They drive the real client write path (`propose::propose_checked` on the replica
//! that believes it leads, as the gRPC handler does) with the commands users and agents cause, and record what
//! they saw as a `history` the checker judges.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use std::sync::Arc;

use drover_controller::leader::agents::{AgentHub, NoLease};
use drover_controller::propose::{Proposer, propose_checked};
use drover_controller::store::StateView;
use drover_proto::wire::ControllerMessage;
use drover_state::{Command, GpuInfo, JobEnd, JobSpec, NodeHealth, NodeInfo, Reply, RunningShare};
use openraft::async_runtime::WatchReceiver;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::network::{Net, lock};
use crate::history::EventKind;

/// The progress timeout of the watched jobs (seconds).
const PROGRESS_TIMEOUT_S: u32 = 1;
/// How often a watched task that is not hung reports progress (simulated ms).
const PROGRESS_EVERY_MS: u64 = 300;
/// How often the simulated operator resumes quarantined nodes (simulated ms).
const OPERATOR_EVERY_MS: u64 = 2_000;

/// The uid every simulated job runs as (not root: root jobs are refused by default).
const SIM_UID: u32 = 1000;
/// How often an agent looks at its assignments (stands for the leader's push on its heartbeat stream).
const AGENT_POLL_MS: u64 = 50;
/// Retries of one write before the writer gives up on it (each costs at most the commit timeout).
const MAX_WRITE_ATTEMPTS: u32 = 200;
/// Pause between retries while there is no leader or the write failed.
const RETRY_MS: u64 = 100;

/// The replica that believes it leads with the newest term (a deposed leader in a minority may still believe
/// it leads: writes there time out, as they would for a real client).
pub fn leader(net: &Net) -> Option<Leader> {
    let net = lock(net);
    let id = newest_leader(&net)?;
    let r = &net.replicas[&id];
    Some(Leader { proposer: r.proposer.clone(), view: r.view.clone(), hub: r.hub.clone() })
}

/// The id of the replica that believes it leads with the newest term.
pub fn leader_id(net: &Net) -> Option<u64> {
    newest_leader(&lock(net))
}

fn newest_leader(net: &super::network::NetState) -> Option<u64> {
    net.replicas
        .iter()
        .filter_map(|(id, r)| {
            let m = r.raft.metrics().borrow_watched().clone();
            (m.current_leader == Some(*id)).then_some((m.current_term, *id))
        })
        .max()
        .map(|(_, id)| id)
}

/// Operations of drill submissions are numbered from here (the user's count from 0).
const DRILL_OPS: u64 = 1_000_000;

/// A node-return drill's submission: a job only `node` may run (`-w node`), submitted as the node is cut off so
/// that the leader places it there while the node cannot hear it. Recorded like the user's submissions.
pub async fn submit_pinned(net: &Net, node: &str, round: u64, gpus_per_node: u32) {
    let op = DRILL_OPS + round;
    let spec = JobSpec {
        name: format!("drill-{round}").into(),
        user: "sim".into(),
        uid: SIM_UID,
        gid: SIM_UID,
        script: "#!/bin/sh\ntrain\n".into(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        gpus_per_node: gpus_per_node.div_ceil(2),
        nodelist: vec![node.to_string()].into(),
        ..JobSpec::default()
    };
    let command = Command::SubmitJob { spec: Box::new(spec), request_id: Some(format!("sim-op-{op}")) };
    lock(net).event(EventKind::SubmitSent { op });
    let event = match write(net, command).await {
        Outcome::Committed(Reply::Submitted { job_id, .. }) => EventKind::SubmitAcked { op, job: job_id },
        Outcome::Committed(other) => EventKind::SubmitFailed { op, error: format!("unexpected reply {other:?}") },
        Outcome::Refused(error) | Outcome::GaveUp(error) => EventKind::SubmitFailed { op, error },
    };
    lock(net).event(event);
}

/// Handles on the replica that believes it leads.
pub struct Leader {
    pub proposer: Proposer,
    pub view: StateView,
    pub hub: Arc<AgentHub>,
}

/// What one write came to.
enum Outcome {
    Committed(Reply),
    Refused(String),
    GaveUp(String),
}

/// Commits `command` through whichever replica leads, retrying (with the same command, so a submission's
/// request id makes a retry return the first job) until it commits, is refused, or the attempts run out.
async fn write(net: &Net, command: Command) -> Outcome {
    let mut last_error = String::from("no leader");
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let Some(Leader { proposer, .. }) = leader(net) else {
            tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
            continue;
        };
        match propose_checked(&proposer, command.clone()).await {
            Ok(Ok(reply)) => return Outcome::Committed(reply),
            Ok(Err(refusal)) => return Outcome::Refused(refusal.to_string()),
            Err(status) => {
                last_error = status.message().to_string();
                tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
            }
        }
    }
    Outcome::GaveUp(last_error)
}

fn spec(rng: &mut SmallRng, op: u64, gpus_per_node: u32, hangs: bool) -> JobSpec {
    // One job in five spans two nodes: its second node's share lingers until that node's agent lets it go.
    let nodes = if rng.random_range(0..5) == 0 { 2 } else { 1 };
    // With hangs, one job in four is watched (from the op, not the seeded stream: the schedule stays the same).
    let progress_timeout_s = (hangs && op % 4 == 1).then_some(PROGRESS_TIMEOUT_S);
    JobSpec {
        progress_timeout_s,
        name: format!("sim-{op}").into(),
        user: "sim".into(),
        uid: SIM_UID,
        gid: SIM_UID,
        script: "#!/bin/sh\ntrain\n".into(),
        min_nodes: nodes,
        max_nodes: nodes,
        cpus_per_task: 1,
        gpus_per_node: rng.random_range(1..=gpus_per_node),
        ..JobSpec::default()
    }
}

/// One user: submits `jobs` jobs at seeded intervals, and cancels an acknowledged one now and then.
pub async fn client(net: Net, seed: u64, jobs: u64, gpus_per_node: u32, hangs: bool) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x636c_6965_6e74);
    let mut acked: Vec<u64> = Vec::new();
    for op in 0..jobs {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..400))).await;
        if !acked.is_empty() && rng.random_range(0..10) == 0 {
            let job = acked[rng.random_range(0..acked.len())];
            let outcome = write(&net, Command::CancelJobs { ids: vec![job], by_uid: SIM_UID }).await;
            let what = match outcome {
                Outcome::Committed(_) => "committed".to_string(),
                Outcome::Refused(e) => format!("refused: {e}"),
                Outcome::GaveUp(e) => format!("gave up: {e}"),
            };
            lock(&net).trace.record(format_args!("client cancel {job} {what}"), &[]);
        }
        let command = Command::SubmitJob {
            spec: Box::new(spec(&mut rng, op, gpus_per_node, hangs)),
            request_id: Some(format!("sim-op-{op}")),
        };
        lock(&net).event(EventKind::SubmitSent { op });
        let event = match write(&net, command).await {
            Outcome::Committed(Reply::Submitted { job_id, .. }) => {
                acked.push(job_id);
                EventKind::SubmitAcked { op, job: job_id }
            }
            Outcome::Committed(other) => EventKind::SubmitFailed { op, error: format!("unexpected reply {other:?}") },
            Outcome::Refused(error) | Outcome::GaveUp(error) => EventKind::SubmitFailed { op, error },
        };
        lock(&net).event(event);
    }
}

/// The operator: every [`OPERATOR_EVERY_MS`], resumes the nodes quarantine drained (they were "repaired"), so
/// the cluster never runs out of nodes while the hang and quarantine paths are exercised under faults.
pub async fn operator(net: Net) {
    loop {
        tokio::time::sleep(Duration::from_millis(OPERATOR_EVERY_MS)).await;
        let quarantined: Vec<String> = {
            let Some(Leader { view, .. }) = leader(&net) else { continue };
            let applied = view.read();
            for n in applied.state.nodes.values().filter(|n| n.drain) {
                lock(&net).trace.record(format_args!("operator sees {} drained: {}", n.info.name, n.reason), &[]);
            }
            applied
                .state
                .nodes
                .values()
                .filter(|n| n.drain && n.reason.starts_with("quarantined"))
                .map(|n| n.info.name.clone())
                .collect()
        };
        if quarantined.is_empty() {
            continue;
        }
        let names = quarantined.clone();
        let command =
            Command::DrainNodes { names, drain: false, reason: String::new(), by_uid: 0, requeue_jobs: false };
        let outcome = write(&net, command).await;
        let committed = matches!(outcome, Outcome::Committed(_));
        let mut net = lock(&net);
        if committed {
            net.quarantines_resumed += quarantined.len() as u64;
        }
        net.trace.record(format_args!("operator resumed quarantined {quarantined:?}: {committed}"), &[]);
    }
}

/// The inventory a simulated node registers.
fn node_info(name: &str, gpus: u32) -> NodeInfo {
    NodeInfo {
        name: name.to_string(),
        agent_addr: format!("{name}:7000"),
        host: name.to_string(),
        cpus: 64,
        memory_mb: 0,
        gpus: (0..gpus)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{name}-{index}"),
                name: "SIM-GPU".into(),
                memory_mb: 80_000,
                pci_bus_id: format!("0000:{index:02x}:00.0"),
            })
            .collect(),
        gpu_type: String::new(),
        partitions: Vec::new(),
        features: Vec::new(),
        topology: BTreeMap::new(),
        version: "sim".into(),
        spare: false,
    }
}

/// Killed by a cancel: the end the batch node reports.
const SIGTERM: i32 = 15;
/// The longest a simulated task takes to die once told to stop (its SIGTERM handler, then `KillWait`'s SIGKILL):
/// the window in which a stale task still holds its GPUs.
const MAX_STOP_MS: u64 = 2_000;

/// One job's share on this node, as the leader's assignments say.
struct Assigned {
    /// This node runs the batch script, so it reports the job's end.
    batch: bool,
    /// Cancelled: the tasks must stop.
    stopping: bool,
    gpus: Vec<u32>,
    /// It has a progress timeout.
    watched: bool,
}

/// A task the agent runs: one incarnation's share on this node.
struct Task {
    /// Simulated ms at which the task exits by itself (only the batch node's exit ends the job).
    exits_at_ms: u64,
    batch: bool,
    gpus: Vec<u32>,
    /// Told to stop: it is gone at this simulated ms (until then it still holds its GPUs).
    dies_at_ms: Option<u64>,
    /// A watched batch task that is not hung reports progress at this simulated ms next.
    progress_at_ms: Option<u64>,
}

/// What one agent knows, shared between its main loop and its lease check.
#[derive(Default)]
struct AgentState {
    /// Every task that may still hold its GPUs: running, or told to stop and not dead yet.
    running: BTreeMap<(u64, u64), Task>,
    /// Ended here (exited, stopped or fenced): never started again.
    done: BTreeSet<(u64, u64)>,
    /// Ends the batch node still has to get acknowledged, oldest first.
    reports: Vec<((u64, u64), JobEnd)>,
    /// Until when (simulated ms) the node holds a lease, and the registration epoch it is for.
    lease_until_ms: u64,
    lease_epoch: u64,
}

impl AgentState {
    /// What a registration lists as still running here.
    fn running_shares(&self) -> Vec<RunningShare> {
        self.running
            .iter()
            .map(|(key, task)| RunningShare { job: key.0, incarnation: key.1, gpus: task.gpus.clone() })
            .collect()
    }

    /// A task of another incarnation that still holds one of `gpus`.
    fn gpu_holder(&self, key: (u64, u64), gpus: &[u32]) -> Option<(u64, u64)> {
        self.running.iter().find(|(k, t)| **k != key && t.gpus.iter().any(|g| gpus.contains(g))).map(|(k, _)| *k)
    }
}

/// How often the agent checks its lease (the real agent checks on every reconcile pass).
const LEASE_CHECK_MS: u64 = 50;
/// The signal a fenced task dies of.
const SIGKILL: i32 = 9;

/// The lease, as its own task so that no write in flight delays it: once the lease has run out, every task is
/// killed (as the supervisors do) and its end kept to report when the agent is back.
async fn lease(net: Net, name: String, state: Arc<std::sync::Mutex<AgentState>>, started: tokio::time::Instant) {
    loop {
        tokio::time::sleep(Duration::from_millis(LEASE_CHECK_MS)).await;
        let now_ms = started.elapsed().as_millis() as u64;
        let mut state = state.lock().expect("agent state lock");
        if now_ms < state.lease_until_ms || state.running.is_empty() {
            continue;
        }
        let AgentState { running, done, reports, .. } = &mut *state;
        for (key, task) in std::mem::take(running) {
            done.insert(key);
            lock(&net).event(EventKind::IncarnationEnded { job: key.0, incarnation: key.1, node: name.clone() });
            if task.batch {
                reports.push((key, JobEnd { signal: SIGKILL, fenced: true, ..JobEnd::default() }));
            }
        }
        lock(&net).trace.record(format_args!("agent {name} fenced itself"), &[]);
    }
}

/// Registers through whichever replica leads (none while the agent is cut off), listing what still runs here,
/// as a real agent does when it opens a session. The epoch of the registration, once one is accepted, and
/// whether it brought the node back from DOWN.
async fn register(net: &Net, name: &str, gpus: u32, running: Vec<RunningShare>) -> Option<(u64, bool)> {
    if lock(net).conditions.agents_cut.contains(name) {
        return None;
    }
    let Leader { hub, view, .. } = leader(net)?;
    let was_down = view.read().state.nodes.get(name).is_some_and(|n| n.health == NodeHealth::Down);
    match hub.register(&node_info(name, gpus), &running).await {
        Ok(epoch) => Some((epoch, was_down)),
        Err(status) => {
            lock(net).trace.record(format_args!("agent {name} register failed: {}", status.message()), &[]);
            None
        }
    }
}

/// One node's agent, playing the real agent's part of the protocol against the leader's real `AgentHub`:
/// registers (listing what still runs), heartbeats for leases (`AgentHub::heartbeat`), takes the leader's
/// assignments (`AgentHub::assignments`, once the leader has caught up), and starts a task only as the real
/// agent does: under a lease of the epoch the assignments are for, and on GPUs no task of another incarnation
/// still holds. It stops what is no longer assigned (a stopped task dies up to [`MAX_STOP_MS`] later, holding its
/// GPUs until then), reports the batch node's ends (`JobEnded`), confirms ended incarnations gone
/// (`ReleaseLingering`), fences itself when its lease runs out, and registers again when its session's epoch is
/// over. Stops at `until_ms`.
/// `fences`: false only for a planted bug (see `PlantedBug::AgentsNeverFence`).
pub async fn agent(net: Net, seed: u64, name: String, gpus: u32, until_ms: u64, fences: bool) {
    let mut rng = SmallRng::seed_from_u64(seed ^ fnv_name(&name));
    let started = tokio::time::Instant::now();
    let now_ms = || started.elapsed().as_millis() as u64;
    let state = Arc::new(std::sync::Mutex::new(AgentState::default()));
    let lease_task = fences.then(|| tokio::spawn(lease(net.clone(), name.clone(), state.clone(), started)));
    // The session: the epoch it registered in, whether its assignments arrived, and the newest applied index seen.
    let mut epoch: Option<u64> = None;
    let mut seen_index = 0u64;
    while now_ms() < until_ms {
        tokio::time::sleep(Duration::from_millis(AGENT_POLL_MS)).await;
        if lock(&net).conditions.agents_cut.contains(&name) {
            // The session breaks with the link; the next one registers anew.
            epoch = None;
            continue;
        }
        let Some(session_epoch) = epoch else {
            let running = state.lock().expect("agent state lock").running_shares();
            if let Some((e, back_from_down)) = register(&net, &name, gpus, running).await {
                epoch = Some(e);
                let mut net = lock(&net);
                if back_from_down {
                    net.reregistrations += 1;
                }
                net.trace.record(format_args!("agent {name} registered (epoch {e})"), &[]);
            }
            continue;
        };
        let (message, caught_up) = {
            // Not kept past this block: a held view keeps a crashed replica's store open.
            let Some(Leader { hub, .. }) = leader(&net) else { continue };
            match hub.heartbeat(&name, session_epoch) {
                Ok(lease_ms) => {
                    let mut state = state.lock().expect("agent state lock");
                    state.lease_until_ms = now_ms() + lease_ms;
                    state.lease_epoch = session_epoch;
                }
                Err(NoLease::Reregister(why)) => {
                    // The leader closes the session; the agent registers again, listing what still runs.
                    lock(&net).trace.record(format_args!("agent {name} must register again: {why}"), &[]);
                    epoch = None;
                    continue;
                }
                Err(_) => {}
            }
            let caught_up = hub.is_caught_up();
            (caught_up.then(|| hub.assignments(&name)), caught_up)
        };
        // A leader that has not caught up sends no assignments.
        let Some(ControllerMessage::Assignments { jobs, applied_index, epoch: assigned_epoch, .. }) =
            message.filter(|_| caught_up)
        else {
            continue;
        };
        // A new leader may not have applied what the last one had: an older view would look as if jobs had ended.
        if applied_index < seen_index {
            continue;
        }
        seen_index = applied_index;
        if assigned_epoch != session_epoch {
            // Declared down, or registered anew: the leader closes this session.
            epoch = None;
            continue;
        }
        let assigned = assigned_here(&jobs, &name);
        let lingering: Vec<(u64, u64)> = {
            let Some(Leader { view, .. }) = leader(&net) else { continue };
            let applied = view.read();
            applied.state.nodes.get(&name).map(|n| n.lingering.iter().map(|l| (l.job, l.incarnation)).collect())
        }
        .unwrap_or_default();
        let (reports, gone, progress) = {
            let mut guard = state.lock().expect("agent state lock");
            let (reports, gone) =
                guard.advance(now_ms(), (&assigned, assigned_epoch), lingering, &mut rng, (&net, &name));
            (reports, gone, guard.due_progress(now_ms()))
        };
        send_reports(&net, &name, &state, reports, gone).await;
        for (job_id, incarnation) in progress {
            let command = Command::RecordProgress { job_id, incarnation, step: None, by_uid: 0 };
            // A report lost to a fault is simply not made: the next one comes a moment later.
            let _ = write_once(&net, &name, command).await;
        }
    }
    if let Some(task) = lease_task {
        task.abort();
    }
}

/// The node's share of each job assigned to it, by (job, incarnation).
fn assigned_here(jobs: &[drover_proto::wire::Assignment], name: &str) -> BTreeMap<(u64, u64), Assigned> {
    jobs.iter()
        .map(|a| {
            let gpus =
                a.job.allocation.iter().find(|share| share.node == name).map(|s| s.gpus.clone()).unwrap_or_default();
            let watched = a.job.progress_timeout_s().is_some();
            (
                (a.job.id, a.job.incarnation),
                Assigned { batch: a.node_index == 0, stopping: a.cancelled(), gpus, watched },
            )
        })
        .collect()
}

/// Job ends a batch node reports, by (job, incarnation), oldest first.
type Ends = Vec<((u64, u64), JobEnd)>;

impl AgentState {
    /// One poll's work on the node, under the lock: start what is assigned and may start (a lease of the
    /// assignments' epoch, GPUs no other incarnation holds), stop what is no longer assigned, end what exited or
    /// died; returns the ends to report and the lingering incarnations that are gone from here.
    fn advance(
        &mut self,
        now: u64,
        (assigned, assigned_epoch): (&BTreeMap<(u64, u64), Assigned>, u64),
        lingering: Vec<(u64, u64)>,
        rng: &mut SmallRng,
        (net, name): (&Net, &str),
    ) -> (Ends, Vec<(u64, u64)>) {
        let may_start = now < self.lease_until_ms && self.lease_epoch == assigned_epoch;
        for (key, a) in assigned {
            if self.running.contains_key(key) || self.done.contains(key) {
                continue;
            }
            if a.stopping {
                // Cancelled before it started here: nothing to kill, but the batch node says it is gone.
                self.done.insert(*key);
                if a.batch {
                    self.reports.push((*key, JobEnd { signal: SIGTERM, ..JobEnd::default() }));
                }
                continue;
            }
            if !may_start {
                continue;
            }
            if let Some(holder) = self.gpu_holder(*key, &a.gpus) {
                lock(net).trace.record(format_args!("agent {name}: {key:?} waits for {holder:?}'s GPUs"), &[]);
                continue;
            }
            let mut exits_at_ms = now + rng.random_range(100..3_000);
            // A watched job's first incarnation hangs for one job in three (decided by its id, not the seeded
            // stream): it neither exits nor reports progress until it is stopped.
            let hangs = a.watched && key.1 == 0 && key.0 % 3 == 0;
            if hangs {
                exits_at_ms = u64::MAX;
            }
            let progress_at_ms = (a.watched && a.batch && !hangs).then_some(now);
            let task = Task { exits_at_ms, batch: a.batch, gpus: a.gpus.clone(), dies_at_ms: None, progress_at_ms };
            self.running.insert(*key, task);
            lock(net).event(EventKind::IncarnationStarted {
                job: key.0,
                incarnation: key.1,
                node: name.to_string(),
                gpus: a.gpus.clone(),
            });
        }
        // Stop what is no longer assigned (requeued, ended by its batch node) or is stopping: it dies a little
        // later, as a real task does after its SIGTERM.
        for (key, task) in self.running.iter_mut() {
            if task.dies_at_ms.is_none() && assigned.get(key).is_none_or(|a| a.stopping) {
                task.dies_at_ms = Some(now + rng.random_range(0..MAX_STOP_MS));
            }
        }
        let ended: Vec<(u64, u64)> = self
            .running
            .iter()
            .filter(|(_, task)| task.dies_at_ms.map_or(task.exits_at_ms, |at| at.min(task.exits_at_ms)) <= now)
            .map(|(key, _)| *key)
            .collect();
        for key in ended {
            let task = self.running.remove(&key).expect("listed above");
            self.done.insert(key);
            lock(net).event(EventKind::IncarnationEnded { job: key.0, incarnation: key.1, node: name.to_string() });
            if let Some(a) = assigned.get(&key).filter(|_| task.batch) {
                let signal = if a.stopping { SIGTERM } else { 0 };
                self.reports.push((key, JobEnd { signal, ..JobEnd::default() }));
            }
        }
        let gone: Vec<(u64, u64)> = lingering.into_iter().filter(|key| !self.running.contains_key(key)).collect();
        (std::mem::take(&mut self.reports), gone)
    }

    /// The watched tasks due to report progress now (each reports again [`PROGRESS_EVERY_MS`] later).
    fn due_progress(&mut self, now: u64) -> Vec<(u64, u64)> {
        let mut due = Vec::new();
        for (key, task) in self.running.iter_mut().filter(|(_, t)| t.dies_at_ms.is_none()) {
            if let Some(at) = task.progress_at_ms.filter(|at| *at <= now) {
                task.progress_at_ms = Some(at.max(now) + PROGRESS_EVERY_MS);
                due.push(*key);
            }
        }
        due
    }
}

/// Sends the ends the batch node has to report (one attempt each per poll; what does not commit waits for the
/// next) and confirms gone what lingers here and no longer runs.
async fn send_reports(
    net: &Net,
    name: &str,
    state: &std::sync::Mutex<AgentState>,
    reports: Ends,
    gone: Vec<(u64, u64)>,
) {
    // Reports go out one attempt per pass; one that does not commit waits for the next pass.
    let mut unsent = Vec::new();
    for (key, end) in reports {
        let command = Command::JobEnded { job_id: key.0, incarnation: key.1, end: end.clone() };
        let what = match write_once(net, name, command).await {
            Outcome::Committed(reply) => format!("committed: {reply:?}"),
            Outcome::Refused(e) => format!("refused: {e}"),
            Outcome::GaveUp(e) => {
                unsent.push((key, end));
                format!("not committed: {e}")
            }
        };
        lock(net).trace.record(format_args!("agent {name} reported {key:?} ended: {what}"), &[]);
    }
    if !unsent.is_empty() {
        let mut guard = state.lock().expect("agent state lock");
        unsent.append(&mut guard.reports);
        guard.reports = unsent;
    }
    // Confirm gone what lingers here and no longer runs.
    if !gone.is_empty() {
        let command = Command::ReleaseLingering { node: name.to_string(), keys: gone, usage: Vec::new() };
        if let Outcome::GaveUp(e) = write_once(net, name, command).await {
            lock(net).trace.record(format_args!("agent {name} release not committed: {e}"), &[]);
        }
    }
}

/// One attempt of an agent's write, through whichever replica leads (none while the agent is cut off).
async fn write_once(net: &Net, agent: &str, command: Command) -> Outcome {
    if lock(net).conditions.agents_cut.contains(agent) {
        return Outcome::GaveUp("cut off".into());
    }
    let Some(Leader { proposer, .. }) = leader(net) else { return Outcome::GaveUp("no leader".into()) };
    match propose_checked(&proposer, command).await {
        Ok(Ok(reply)) => Outcome::Committed(reply),
        Ok(Err(refusal)) => Outcome::Refused(refusal.to_string()),
        Err(status) => Outcome::GaveUp(status.message().to_string()),
    }
}

fn fnv_name(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

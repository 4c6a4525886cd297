//! The simulated users and agents. They drive the real client write path (`propose::propose_checked` on the replica
//! that believes it leads, as the gRPC handler does) with the commands users and agents cause, and record what
//! they saw as a `history` the checker judges.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use std::sync::Arc;

use drover_controller::config::AgentTiming;
use drover_controller::leader::agents::AgentHub;
use drover_controller::propose::{Proposer, propose_checked};
use drover_controller::store::StateView;
use drover_state::{Command, GpuInfo, JobEnd, JobSpec, JobState, NodeHealth, NodeInfo, Reply};
use openraft::async_runtime::WatchReceiver;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::network::{Net, lock};
use crate::history::EventKind;

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
    net.replicas
        .iter()
        .filter_map(|(id, r)| {
            let m = r.raft.metrics().borrow_watched().clone();
            (m.current_leader == Some(*id)).then_some((m.current_term, *id, r))
        })
        .max_by_key(|(term, id, _)| (*term, *id))
        .map(|(_, _, r)| Leader { proposer: r.proposer.clone(), view: r.view.clone(), hub: r.hub.clone() })
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
    write_as(net, None, command).await
}

/// `write` from an agent: while the agent is cut off its attempts reach nobody (it keeps retrying, as a real
/// agent keeps a report until it is acknowledged).
async fn write_as(net: &Net, agent: Option<&str>, command: Command) -> Outcome {
    let mut last_error = String::from("no leader");
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let cut = agent.is_some_and(|name| lock(net).conditions.agents_cut.contains(name));
        let leader = if cut { None } else { leader(net) };
        let Some(Leader { proposer, .. }) = leader else {
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

fn spec(rng: &mut SmallRng, op: u64, gpus_per_node: u32) -> JobSpec {
    // One job in five spans two nodes: its second node's share lingers until that node's agent lets it go.
    let nodes = if rng.random_range(0..5) == 0 { 2 } else { 1 };
    JobSpec {
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
pub async fn client(net: Net, seed: u64, jobs: u64, gpus_per_node: u32) {
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
            spec: Box::new(spec(&mut rng, op, gpus_per_node)),
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

/// One job's share on this node, as the leader's state assigns it.
struct Assigned {
    /// This node runs the batch script, so it reports the job's end.
    batch: bool,
    /// Cancelled: the tasks must stop.
    stopping: bool,
    gpus: Vec<u32>,
}

/// A task the agent runs: one incarnation's share on this node.
struct Task {
    /// Simulated ms at which the task exits by itself (only the batch node's exit ends the job).
    exits_at_ms: u64,
    batch: bool,
}

/// What one agent knows, shared between its main loop and its lease check.
#[derive(Default)]
struct AgentState {
    running: BTreeMap<(u64, u64), Task>,
    /// Ended here (exited, stopped or fenced): never started again.
    done: BTreeSet<(u64, u64)>,
    /// Ends the batch node still has to get acknowledged, oldest first.
    reports: Vec<((u64, u64), JobEnd)>,
    /// Simulated ms of the last heartbeat a leader with a fresh quorum answered.
    last_contact_ms: u64,
}

/// How often the agent checks its lease (the real agent checks on every reconcile pass).
const LEASE_CHECK_MS: u64 = 50;
/// The signal a fenced task dies of.
const SIGKILL: i32 = 9;

/// The lease, as its own task so that no write in flight delays it: once no leader with a fresh quorum has
/// answered for `fence_after_ms`, every task is killed and its end kept to report when the agent is back.
async fn lease(net: Net, name: String, state: Arc<std::sync::Mutex<AgentState>>, started: tokio::time::Instant) {
    let fence_after_ms = AgentTiming::default().fence_after_ms;
    loop {
        tokio::time::sleep(Duration::from_millis(LEASE_CHECK_MS)).await;
        let now_ms = started.elapsed().as_millis() as u64;
        let mut state = state.lock().expect("agent state lock");
        if now_ms.saturating_sub(state.last_contact_ms) <= fence_after_ms || state.running.is_empty() {
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

/// One node's agent: registers, heartbeats to the leader's `AgentHub`, runs what the leader's applied state
/// assigns it, reports the batch node's ends (`JobEnded`), confirms ended incarnations gone
/// (`ReleaseLingering`), fences itself when cut off, and registers again if its node was declared down.
/// Stops at `until_ms`.
/// `fences`: false only for a planted bug (see `PlantedBug::AgentsNeverFence`).
pub async fn agent(net: Net, seed: u64, name: String, gpus: u32, until_ms: u64, fences: bool) {
    let mut rng = SmallRng::seed_from_u64(seed ^ fnv_name(&name));
    let started = tokio::time::Instant::now();
    let now_ms = || started.elapsed().as_millis() as u64;
    loop {
        match write_as(&net, Some(&name), Command::RegisterNode { info: node_info(&name, gpus) }).await {
            Outcome::Committed(_) => break,
            Outcome::Refused(e) | Outcome::GaveUp(e) => {
                lock(&net).trace.record(format_args!("agent {name} register failed: {e}"), &[]);
                tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
            }
        }
        if now_ms() > until_ms {
            return;
        }
    }
    let state = Arc::new(std::sync::Mutex::new(AgentState { last_contact_ms: now_ms(), ..AgentState::default() }));
    let lease_task = fences.then(|| tokio::spawn(lease(net.clone(), name.clone(), state.clone(), started)));
    let mut seen_index = 0u64;
    while now_ms() < until_ms {
        tokio::time::sleep(Duration::from_millis(AGENT_POLL_MS)).await;
        if lock(&net).conditions.agents_cut.contains(&name) {
            continue;
        }
        let (assigned, lingering, down) = {
            // Not kept past this block: a held view keeps a crashed replica's store open.
            let Some(Leader { view, hub, .. }) = leader(&net) else { continue };
            // Real leaders grant leases only while a quorum acknowledged them within the election timeout.
            if !hub.quorum_is_fresh() {
                continue;
            }
            hub.seen(&name);
            state.lock().expect("agent state lock").last_contact_ms = now_ms();
            let applied = view.read();
            // A new leader may not have applied what the last one had: an older view would look as if jobs
            // had ended. Real agents skip such assignments by their applied index too.
            let index = applied.last_applied.as_ref().map_or(0, |l| l.index());
            if index < seen_index {
                continue;
            }
            seen_index = index;
            let state = &applied.state;
            let Some(node) = state.nodes.get(&name) else { continue };
            // COMPLETING (cancelled while running): its tasks must stop, and its batch node reports them gone.
            let assigned: BTreeMap<(u64, u64), Assigned> = node
                .jobs
                .iter()
                .filter_map(|id| state.jobs.get(id))
                .filter(|job| matches!(job.state, JobState::Running | JobState::Completing))
                .map(|job| {
                    let gpus =
                        job.allocation.iter().find(|a| a.node == name).map(|a| a.gpus.clone()).unwrap_or_default();
                    let assigned = Assigned {
                        batch: job.nodes.first() == Some(&name),
                        stopping: job.state == JobState::Completing,
                        gpus,
                    };
                    ((job.id, job.incarnation), assigned)
                })
                .collect();
            let lingering: Vec<(u64, u64)> = node.lingering.iter().map(|l| (l.job, l.incarnation)).collect();
            (assigned, lingering, node.health == NodeHealth::Down)
        };
        if down {
            // Declared down while cut off: a returning agent registers again, which brings the node back up.
            if let Outcome::Committed(_) =
                write_as(&net, Some(&name), Command::RegisterNode { info: node_info(&name, gpus) }).await
            {
                let mut net = lock(&net);
                net.reregistrations += 1;
                net.trace.record(format_args!("agent {name} registered again"), &[]);
            }
            continue;
        }
        let (reports, gone) = {
            let mut guard = state.lock().expect("agent state lock");
            let AgentState { running, done, reports, .. } = &mut *guard;
            for (key, a) in &assigned {
                if running.contains_key(key) || done.contains(key) {
                    continue;
                }
                if a.stopping {
                    // Cancelled before it started here: nothing to kill, but the batch node says it is gone.
                    done.insert(*key);
                    if a.batch {
                        reports.push((*key, JobEnd { signal: SIGTERM, ..JobEnd::default() }));
                    }
                    continue;
                }
                let exits_at_ms = now_ms() + rng.random_range(100..3_000);
                running.insert(*key, Task { exits_at_ms, batch: a.batch });
                lock(&net).event(EventKind::IncarnationStarted {
                    job: key.0,
                    incarnation: key.1,
                    node: name.clone(),
                    gpus: a.gpus.clone(),
                });
            }
            // Stop what is no longer assigned (requeued, ended by its batch node) or is stopping, and what exited.
            let now = now_ms();
            let ended: Vec<(u64, u64)> = running
                .iter()
                .filter(|(key, task)| assigned.get(key).is_none_or(|a| a.stopping) || task.exits_at_ms <= now)
                .map(|(key, _)| *key)
                .collect();
            for key in ended {
                let task = running.remove(&key).expect("listed above");
                done.insert(key);
                lock(&net).event(EventKind::IncarnationEnded { job: key.0, incarnation: key.1, node: name.clone() });
                if let Some(a) = assigned.get(&key).filter(|_| task.batch) {
                    let signal = if a.stopping { SIGTERM } else { 0 };
                    reports.push((key, JobEnd { signal, ..JobEnd::default() }));
                }
            }
            let gone: Vec<(u64, u64)> = lingering.into_iter().filter(|key| !running.contains_key(key)).collect();
            (std::mem::take(reports), gone)
        };
        // Reports go out one attempt per pass; one that does not commit waits for the next pass.
        let mut unsent = Vec::new();
        for (key, end) in reports {
            let command = Command::JobEnded { job_id: key.0, incarnation: key.1, end: end.clone() };
            let what = match write_once(&net, &name, command).await {
                Outcome::Committed(reply) => format!("committed: {reply:?}"),
                Outcome::Refused(e) => format!("refused: {e}"),
                Outcome::GaveUp(e) => {
                    unsent.push((key, end));
                    format!("not committed: {e}")
                }
            };
            lock(&net).trace.record(format_args!("agent {name} reported {key:?} ended: {what}"), &[]);
        }
        if !unsent.is_empty() {
            let mut guard = state.lock().expect("agent state lock");
            unsent.append(&mut guard.reports);
            guard.reports = unsent;
        }
        // Confirm gone what lingers here and no longer runs.
        if !gone.is_empty() {
            let command = Command::ReleaseLingering { node: name.clone(), keys: gone, usage: Vec::new() };
            if let Outcome::GaveUp(e) = write_once(&net, &name, command).await {
                lock(&net).trace.record(format_args!("agent {name} release not committed: {e}"), &[]);
            }
        }
    }
    if let Some(task) = lease_task {
        task.abort();
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

//! `drover-bench jobs` and `drover-bench heartbeats`: the node-agent figures of BENCHMARKS.md. Like the other
//! benches, each starts its own local cluster and prints one summary line per measurement.

use crate::rss_kib;
use crate::sim_jobs::{SessionJobs, SimJobs};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use drover_client::{Client, JobFilter};
use drover_proto::LEADER_HINT_KEY;
use drover_proto::v1::agent_gateway_client::AgentGatewayClient;
use drover_proto::v1::{AgentEnvelope, ControllerEnvelope};
use drover_proto::wire::{AgentMessage, ControllerMessage, decode, encode};
use drover_state::{ExportPolicy, GpuInfo, JobSpec, JobState, NodeHealth, NodeInfo};
use hdrhistogram::Histogram;
// tonic re-exports tokio-stream for generated code; using it keeps this crate's dependency list unchanged.
use drover_auth::ClientTls;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use drover_testkit::local::{LocalCluster, UpOptions};

/// How often the jobs bench asks whether every job has ended (the resolution of its end-to-end figure).
const POLL_MS: u64 = 20;
/// The jobs bench gives up when no job has ended for this long (a stuck agent, a lost job).
const NO_PROGRESS_S: u64 = 60;
/// Simulated agents registering at once: each registration is one Raft commit, and a thundering herd of 2,000
/// would measure the ramp, not the steady state.
const RAMP_CONCURRENCY: usize = 64;
/// Reconnections in progress at once (each is a TCP connection, a TLS handshake and a registration).
const RECONNECT_CONCURRENCY: usize = 2_048;
/// Attempts to open one simulated session (a redirect to the leader counts as one).
const OPEN_ATTEMPTS: u32 = 5;
/// One attempt to connect and register may take this long (the registration waits for its commit).
const OPEN_TIMEOUT_S: u64 = 30;
/// Heartbeats queued towards the leader per simulated agent; a full outbox means the leader stopped reading.
const SIM_OUTBOX: usize = 8;
/// Heartbeats awaiting their `Alive` per simulated agent (older ones are not timed).
const SIM_IN_FLIGHT: usize = 64;

/// A trivial one-GPU `--wrap true` job whose files stay in `work_dir` and whose output goes nowhere.
pub(crate) fn true_job(work_dir: &Path) -> JobSpec {
    let dir = work_dir.display().to_string();
    JobSpec {
        work_dir: dir.clone().into(),
        submit_dir: dir.into(),
        stdout: Some("/dev/null".into()),
        export: ExportPolicy::None,
        ..drover_testkit::local::trivial_spec()
    }
}

/// The leader's id and address, as the cluster reports them.
pub(crate) async fn leader_of(client: &Client) -> anyhow::Result<(u64, String, u64)> {
    let status = client.cluster_status().await?;
    let leader = status.replicas.iter().find(|r| r.role == "leader").context("the cluster reports no leader")?;
    Ok((leader.id, leader.address.clone(), leader.last_log_index))
}

/// A client that asks the leader first: a follower learns of commits a Raft heartbeat later, which would blur a
/// 20 ms poll.
fn leader_first_client(cluster: &LocalCluster, leader: &str, deadline: Duration) -> anyhow::Result<Client> {
    let mut addresses: Vec<String> = cluster.addresses().split(',').map(str::to_string).collect();
    addresses.sort_by_key(|a| a != leader);
    Ok(cluster.client_at(&addresses.join(","))?.with_deadline(deadline))
}

pub async fn jobs(count: usize, gpus: u32, clients: usize, cgroups: bool, dir: PathBuf) -> anyhow::Result<()> {
    if count == 0 || clients == 0 || gpus == 0 {
        bail!("--count, --clients and --gpus must be at least 1");
    }
    let options = UpOptions { agents: 1, gpus_per_agent: gpus, agent_cgroups: cgroups, ..UpOptions::default() };
    let cluster = LocalCluster::up(&dir, options)?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    cluster.wait_agents(Duration::from_secs(30)).await?;
    let work_dir = cluster.dir.join("work");
    std::fs::create_dir_all(&work_dir)?;
    let client = Arc::new(cluster.client()?);
    let (_, leader_addr, _) = leader_of(&client).await?;
    let poller = leader_first_client(&cluster, &leader_addr, Duration::from_secs(2))?;
    println!("bench jobs: {count} one-GPU `true` jobs, {clients} submitting clients, 1 agent x {gpus} GPUs");

    let first_submission = Instant::now();
    let submitted = submit_count(&client, &true_job(&work_dir), count, clients).await?;
    let submit_s = first_submission.elapsed().as_secs_f64();
    println!(
        "submission: {} jobs acknowledged in {submit_s:.2} s ({:.1}/s)",
        submitted.len(),
        submitted.len() as f64 / submit_s
    );

    // Every job is submitted; the state holds active jobs only, so an empty one means every job has ended.
    let mut last_active = u64::MAX;
    let mut progress_at = Instant::now();
    loop {
        if let Ok(status) = poller.cluster_status().await {
            let active = status.pending_jobs + status.running_jobs;
            if active == 0 {
                break;
            }
            if active < last_active {
                last_active = active;
                progress_at = Instant::now();
            }
        }
        if progress_at.elapsed() > Duration::from_secs(NO_PROGRESS_S) {
            bail!(
                "no job ended for {NO_PROGRESS_S} s with {last_active} still active; see the logs in {}",
                cluster.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let total_s = first_submission.elapsed().as_secs_f64();

    let filter = JobFilter { include_finished: true, limit: 0, ..Default::default() };
    let (jobs, truncated) = client.list_jobs(&filter).await?;
    let ours: HashSet<u64> = submitted.iter().copied().collect();
    let mut states: BTreeMap<&'static str, usize> = BTreeMap::new();
    for job in jobs.iter().filter(|j| ours.contains(&j.id)) {
        *states.entry(job.state.name()).or_default() += 1;
    }
    let found: usize = states.values().sum();
    let completed = states.get(JobState::Completed.name()).copied().unwrap_or(0);
    let verdict = if found == count && completed == count && jobs.len() == count {
        "all COMPLETED".to_string()
    } else {
        let by_state: Vec<String> = states.iter().map(|(s, n)| format!("{s}={n}")).collect();
        let example = jobs
            .iter()
            .find(|j| j.state != JobState::Completed)
            .map(|j| format!("; e.g. job {}: exit {} {}", j.id, j.exit_code, j.message.as_deref().unwrap_or("")))
            .unwrap_or_default();
        format!(
            "NOT all COMPLETED: {} jobs listed{}, {found} of the {count} submitted: {}{example}",
            jobs.len(),
            if truncated { " (truncated)" } else { "" },
            by_state.join(" ")
        )
    };
    // The leader's own stamps (same clock on one machine) bound the figure without the poll's 20 ms resolution.
    let stamped = jobs.iter().filter_map(|j| j.end_time_ms).max().zip(jobs.iter().map(|j| j.submit_time_ms).min());
    let stamped =
        stamped.map(|(end, start)| format!("; leader's stamps: {:.2} s", end.saturating_sub(start) as f64 / 1e3));
    println!(
        "jobs: {count} one-GPU jobs through 1 agent x {gpus} GPUs: {total_s:.2} s first submission to last completion = {:.1} jobs/s ({verdict}){}",
        count as f64 / total_s,
        stamped.unwrap_or_default()
    );
    drop(cluster);
    Ok(())
}

/// Submits `count` copies of `spec` from `clients` concurrent loops; the acknowledged ids. Clients take job
/// numbers from one counter, so exactly `count` are submitted however the work divides.
async fn submit_count(client: &Arc<Client>, spec: &JobSpec, count: usize, clients: usize) -> anyhow::Result<Vec<u64>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.min(count) {
        let (client, next, spec) = (client.clone(), next.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < count {
                ids.push(client.submit(&spec).await?);
            }
            anyhow::Ok(ids)
        }));
    }
    let mut submitted = Vec::with_capacity(count);
    for t in tasks {
        submitted.extend(t.await??);
    }
    Ok(submitted)
}

/// Raises this process's open-file limit towards `want` (capped by the hard limit) before the cluster starts,
/// so the controllers inherit it too: every simulated agent holds one connection here and one on the leader.
fn raise_nofile(want: libc::rlim_t) -> libc::rlim_t {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        let target = want.min(limit.rlim_max);
        if limit.rlim_cur < target {
            limit.rlim_cur = target;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            }
        }
    }
    limit.rlim_cur
}

/// utime + stime of a process (`self` or a pid), in clock ticks.
pub(crate) fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it start with the state (field 3).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

pub(crate) fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// What every simulated agent shares: where to go, when to beat, and the counters the summary reads.
pub(crate) struct Sim {
    /// Issues each simulated agent a certificate for its node name, as a real one has.
    pki: drover_testkit::pki::Pki,
    /// Every controller; the leader first.
    controllers: Vec<String>,
    heartbeat: Duration,
    /// Agent i beats at `epoch + i/N` of an interval, so the load is spread evenly over each interval.
    epoch: Instant,
    agents: usize,
    /// Bounds sessions being opened at once for the first registration ...
    ramp: tokio::sync::Semaphore,
    /// ... and for reconnections.
    reconnect: tokio::sync::Semaphore,
    registered: AtomicUsize,
    /// Agents that never registered, or gave up reconnecting.
    failed: AtomicUsize,
    /// Sessions that ended after registering (the leader closed them, or they broke) ...
    lost: AtomicUsize,
    /// ... and sessions opened again after that, as a real agent does.
    reconnected: AtomicUsize,
    heartbeats: AtomicU64,
    alive: AtomicU64,
    outbox_full: AtomicU64,
    /// Only heartbeats answered inside the measurement window are timed.
    measuring: AtomicBool,
    /// Heartbeat → `Alive` round trip (µs).
    round_trip: Mutex<Histogram<u64>>,
    first_error: Mutex<Option<String>>,
    /// Leases that ran out before the next renewal arrived: a real agent kills its node's tasks then (its lease
    /// file stops every supervisor), so each one is a fenced node, counted rather than hidden.
    fenced: AtomicU64,
    /// Reconnections start after a uniformly random pause below this (ms), as a real agent's do.
    reconnect_jitter_ms: u64,
    /// The leader kill in progress (0: none yet), bumped just before each SIGKILL, and when it happened.
    round: AtomicU64,
    killed_at: Mutex<Option<Instant>>,
    /// Per kill: (round, time from the kill until the agent's lease was renewed by the new leader).
    renewals: Mutex<Vec<(u64, Duration)>>,
    /// Per kill: (round, time from the kill until a session was opened again): the reconnect storm's shape.
    reopened: Mutex<Vec<(u64, Duration)>>,
    /// `drover-bench short-jobs`: the agents run what they are assigned (report each job's end, confirm its
    /// release), instead of only holding it.
    jobs: Option<SimJobs>,
}

impl Sim {
    /// `agents` simulated agents of `controllers` (the leader first), beating every `heartbeat`.
    pub(crate) fn new(
        pki: drover_testkit::pki::Pki,
        controllers: Vec<String>,
        heartbeat: Duration,
        agents: usize,
        reconnect_jitter_ms: u64,
        jobs: Option<SimJobs>,
    ) -> Sim {
        Sim {
            pki,
            controllers,
            heartbeat,
            epoch: Instant::now(),
            agents,
            ramp: tokio::sync::Semaphore::new(RAMP_CONCURRENCY),
            reconnect: tokio::sync::Semaphore::new(RECONNECT_CONCURRENCY),
            registered: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            lost: AtomicUsize::new(0),
            reconnected: AtomicUsize::new(0),
            heartbeats: AtomicU64::new(0),
            alive: AtomicU64::new(0),
            outbox_full: AtomicU64::new(0),
            measuring: AtomicBool::new(false),
            round_trip: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")),
            first_error: Mutex::new(None),
            fenced: AtomicU64::new(0),
            reconnect_jitter_ms,
            round: AtomicU64::new(0),
            killed_at: Mutex::new(None),
            renewals: Mutex::new(Vec::new()),
            reopened: Mutex::new(Vec::new()),
            jobs,
        }
    }

    /// Agents registered so far, and those that gave up.
    pub(crate) fn registration(&self) -> (usize, usize) {
        (self.registered.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }

    pub(crate) fn jobs(&self) -> Option<&SimJobs> {
        self.jobs.as_ref()
    }

    /// Leases that ran out before their renewal.
    pub(crate) fn fenced(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    pub(crate) fn note_error(&self, why: String) {
        self.first_error.lock().expect("first_error poisoned").get_or_insert(why);
    }

    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error.lock().expect("first_error poisoned").clone()
    }

    /// The kill in progress, if `at` (a session's opening, a renewal) came after it.
    fn round_after(&self, at: Instant) -> Option<(u64, Duration)> {
        let round = self.round.load(Ordering::Acquire);
        let killed_at = (*self.killed_at.lock().expect("killed_at poisoned"))?;
        (round > 0 && at >= killed_at).then(|| (round, at - killed_at))
    }
}

/// One simulated agent's lease, kept across its sessions as the real agent keeps it in its state directory.
#[derive(Default)]
struct SimLease {
    /// When the lease runs out: a renewal runs from when the heartbeat it answers was sent.
    until: Option<Instant>,
    /// The last kill after which this agent's lease was renewed (each is counted once).
    renewed_round: u64,
}

impl SimLease {
    /// A `Lease` answering a heartbeat sent at `sent` arrived now on a session opened at `opened`.
    fn renew(&mut self, sim: &Sim, sent: Instant, lease_ms: u64, opened: Instant) {
        let now = Instant::now();
        if self.until.is_some_and(|until| now > until) {
            sim.fenced.fetch_add(1, Ordering::Relaxed);
        }
        let until = sent + Duration::from_millis(lease_ms);
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
        // Only a session opened after the kill speaks for the new leader (an answer in flight from the old one
        // proves nothing).
        if let Some((round, _)) = sim.round_after(opened)
            && round > self.renewed_round
            && let Some((_, since_kill)) = sim.round_after(now)
        {
            self.renewed_round = round;
            sim.renewals.lock().expect("renewals poisoned").push((round, since_kill));
        }
    }
}

/// A pause in [0, bound) ms that differs between agents and between their attempts (no RNG needed: a hash).
fn jitter(i: usize, attempt: u64, bound_ms: u64) -> Duration {
    if bound_ms == 0 {
        return Duration::ZERO;
    }
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ attempt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    Duration::from_millis(x % bound_ms)
}

pub(crate) fn sim_node(i: usize) -> NodeInfo {
    let name = format!("sim{i:04}");
    let gpus = (0..8)
        .map(|index| GpuInfo {
            index,
            uuid: format!("GPU-{name}-{index}"),
            name: "NVIDIA H200".into(),
            memory_mb: 143_771,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
        })
        .collect();
    NodeInfo {
        name,
        agent_addr: "127.0.0.1:1".into(),
        host: "127.0.0.1".into(),
        cpus: 64,
        memory_mb: 1 << 20,
        gpus,
        gpu_type: "h200".into(),
        ..Default::default()
    }
}

fn envelope(message: &AgentMessage) -> AgentEnvelope {
    AgentEnvelope { json: encode(message) }
}

enum Open {
    Redirect(String),
    Failed(String),
}

type SimSession =
    (AgentGatewayClient<Channel>, tokio::sync::mpsc::Sender<AgentEnvelope>, Streaming<ControllerEnvelope>);

/// Connects (its own connection and certificate, as a real agent has) and registers; the leader answers once the
/// node is committed.
async fn open_session(tls: &ClientTls, addr: &str, info: &NodeInfo) -> Result<SimSession, Open> {
    let channel = tls
        .session_channel(addr, None, Duration::from_millis(2_000), Some(drover_auth::RoleKind::Controller))
        .map_err(|e| Open::Failed(format!("cannot connect to {addr}: {e}")))?;
    let mut client = AgentGatewayClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(SIM_OUTBOX);
    tx.try_send(envelope(&AgentMessage::Register {
        info: info.clone(),
        running: Vec::new(),
        feature_level: drover_state::feature::LEVEL,
    }))
    .expect("a new outbox has room");
    match client.session(ReceiverStream::new(rx)).await {
        Ok(response) => Ok((client, tx, response.into_inner())),
        Err(status) => match status.metadata().get(LEADER_HINT_KEY).and_then(|v| v.to_str().ok()) {
            Some(leader) if status.code() == Code::FailedPrecondition => Err(Open::Redirect(leader.to_string())),
            _ => Err(Open::Failed(format!("{addr}: {:?} {}", status.code(), status.message()))),
        },
    }
}

/// Opens a session within the ramp's bound: the leader first, following its hints, then every controller in turn.
async fn open_bounded(
    sim: &Sim,
    tls: &ClientTls,
    addr: &mut String,
    (i, info): (usize, &NodeInfo),
    again: bool,
) -> anyhow::Result<SimSession> {
    // The first registrations go through the ramp; reconnections model separate hosts, bounded only so that
    // this one process does not hold more handshakes than it can drive.
    let bound = if again { &sim.reconnect } else { &sim.ramp };
    let _permit = bound.acquire().await.expect("the semaphores are never closed");
    let mut last = String::new();
    // A reconnection retries as the real agent does (agent/src/session.rs): every controller in turn, and after a
    // round with no leader a pause that doubles from 100 ms to 1.6 s, drawn in [half, whole]; it never gives up
    // within the bench's 60 s. The first registration gives up after OPEN_ATTEMPTS.
    let (attempts, started) = (if again { u32::MAX } else { OPEN_ATTEMPTS }, Instant::now());
    let (mut failures, mut empty_rounds) = (0usize, 0u32);
    for attempt in 0..attempts {
        if again && started.elapsed() > Duration::from_secs(60) {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(OPEN_TIMEOUT_S), open_session(tls, addr, info)).await {
            Ok(Ok(session)) => return Ok(session),
            Ok(Err(Open::Redirect(leader))) => *addr = leader,
            Ok(Err(Open::Failed(why))) => {
                last = why;
                let next = sim.controllers.iter().position(|c| c == addr).map_or(0, |p| p + 1);
                *addr = sim.controllers[next % sim.controllers.len()].clone();
                if !again {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    continue;
                }
                failures += 1;
                if failures.is_multiple_of(sim.controllers.len()) {
                    let round_ms = (100u64 << empty_rounds.min(8)).min(1_600);
                    empty_rounds += 1;
                    let pause = Duration::from_millis(round_ms / 2) + jitter(i, u64::from(attempt), round_ms / 2 + 1);
                    tokio::time::sleep(pause).await;
                }
            }
            Err(_) => last = format!("{addr}: no answer to the registration within {OPEN_TIMEOUT_S} s"),
        }
    }
    anyhow::bail!("{}: {last}", info.name)
}

/// One simulated agent: register, heartbeat until `stop` while draining everything the leader sends, and open a
/// new session when one ends (as a real agent does, so a lost session shows as a count, not as a node down).
pub(crate) async fn sim_agent(sim: Arc<Sim>, i: usize, mut stop: tokio::sync::watch::Receiver<bool>) {
    let info = sim_node(i);
    let issued = sim.pki.issue(&info.name, &drover_auth::Role::Agent(info.name.clone()), &[], &[]);
    let tls =
        issued.and_then(|(cert, key)| Ok(ClientTls::load(drover_auth::TlsFiles { ca: sim.pki.ca_path(), cert, key })?));
    let tls = match tls {
        Ok(tls) => tls,
        Err(e) => {
            sim.note_error(format!("{}: no certificate: {e}", info.name));
            sim.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let mut addr = sim.controllers[0].clone();
    let mut registered = false;
    let mut lease = SimLease::default();
    let mut sessions = 0u64;
    loop {
        if registered {
            // As a real agent: a pause with jitter, so that thousands of agents losing their leader at once do
            // not all knock on the next one in the same millisecond.
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(jitter(i, sessions, sim.reconnect_jitter_ms)) => {}
            }
        }
        sessions += 1;
        let opened = tokio::select! {
            _ = stop.changed() => return,
            opened = open_bounded(&sim, &tls, &mut addr, (i, &info), registered) => opened,
        };
        let (_client, tx, inbound) = match opened {
            Ok(session) => session,
            Err(why) => {
                sim.note_error(why.to_string());
                sim.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let opened_at = Instant::now();
        if registered {
            sim.reconnected.fetch_add(1, Ordering::Relaxed);
            if let Some(reopened) = sim.round_after(opened_at) {
                sim.reopened.lock().expect("reopened poisoned").push(reopened);
            }
        } else {
            registered = true;
            sim.registered.fetch_add(1, Ordering::Relaxed);
        }
        match beat(&sim, i, (tx, inbound, opened_at), &mut lease, &mut stop).await {
            None => {
                // The bench ends: a lease already run out by now was never renewed.
                if lease.until.is_some_and(|until| Instant::now() > until) {
                    sim.fenced.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            Some(why) => {
                sim.lost.fetch_add(1, Ordering::Relaxed);
                sim.note_error(format!("{}: {why}", info.name));
            }
        }
    }
}

/// Heartbeats on one session until `stop` (None) or until the session ends (why).
async fn beat(
    sim: &Sim,
    i: usize,
    (tx, mut inbound, opened): (tokio::sync::mpsc::Sender<AgentEnvelope>, Streaming<ControllerEnvelope>, Instant),
    lease: &mut SimLease,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<String> {
    // The first beat is this agent's next slot on the shared schedule.
    let phase = sim.epoch + sim.heartbeat.mul_f64(i as f64 / sim.agents as f64);
    let behind = Instant::now().saturating_duration_since(phase).as_nanos();
    let period = sim.heartbeat.as_nanos().max(1);
    let first = phase + Duration::from_nanos((behind.div_ceil(period) * period) as u64);
    // A session opened again beats at once, as the real agent's does (its ticker's first tick is immediate):
    // the lease is renewed as soon as the new leader can, not at the agent's next slot.
    let first = if lease.until.is_some() { Instant::now() } else { first };
    let mut ticker = tokio::time::interval_at(first.into(), sim.heartbeat);
    // A stalled bench process must not make up for lost time with a burst the leader never sees in reality.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // (seq, sent) of the heartbeats awaiting their answer: a refused lease has none, so answers match by seq.
    let mut in_flight: VecDeque<(u64, Instant)> = VecDeque::with_capacity(SIM_IN_FLIGHT);
    let mut seq = 0u64;
    let mut running = SessionJobs::default();
    loop {
        tokio::select! {
            _ = stop.changed() => return None,
            _ = ticker.tick() => {
                seq += 1;
                let heartbeat = envelope(&AgentMessage::Heartbeat {
                    seq,
                    problems: Vec::new(),
                    gpu_faults: Vec::new(),
                    gpus_reset: Vec::new(),
                    progress: Vec::new(),
                    health_check: None,
                    rebooted: None,
                });
                if tx.try_send(heartbeat).is_ok() {
                    sim.heartbeats.fetch_add(1, Ordering::Relaxed);
                    if in_flight.len() == SIM_IN_FLIGHT {
                        in_flight.pop_front();
                    }
                    in_flight.push_back((seq, Instant::now()));
                } else {
                    sim.outbox_full.fetch_add(1, Ordering::Relaxed);
                }
            }
            message = inbound.message() => {
                let why = match message {
                    Ok(Some(envelope)) => match decode::<ControllerMessage>(&envelope.json) {
                        Ok(ControllerMessage::Lease { seq: answered, lease_ms, .. }) => {
                            sim.alive.fetch_add(1, Ordering::Relaxed);
                            while in_flight.front().is_some_and(|(s, _)| *s < answered) {
                                in_flight.pop_front();
                            }
                            if let Some((_, sent)) = in_flight.pop_front().filter(|(s, _)| *s == answered) {
                                lease.renew(sim, sent, lease_ms, opened);
                                if sim.measuring.load(Ordering::Relaxed) {
                                    let us = sent.elapsed().as_micros() as u64;
                                    let _ = sim.round_trip.lock().expect("round_trip poisoned").record(us.max(1));
                                }
                            }
                            continue;
                        }
                        // Welcome, Assignments, EndAcked: the simulation drains them, or runs its assignments.
                        Ok(message) => {
                            if let Some(jobs) = &sim.jobs {
                                jobs.on_message(message, &tx, &mut running);
                            }
                            continue;
                        }
                        Err(e) => format!("undecodable message: {e}"),
                    },
                    Ok(None) => "the leader closed the session".to_string(),
                    Err(status) => format!("session broke: {:?} {}", status.code(), status.message()),
                };
                return Some(why);
            }
        }
    }
}

/// `drover-bench heartbeats`: simulated agents (each its own mTLS connection and certificate, a real lease that
/// fences as the agent's does) heartbeating on one leader; optionally one long 8-GPU job per node, and leader
/// kills under submission load with every lease's renewal timed.
#[derive(clap::Args)]
pub struct HeartbeatArgs {
    #[arg(long, default_value_t = 2_000)]
    agents: usize,
    #[arg(long, default_value_t = 5_000)]
    heartbeat_ms: u64,
    /// The measured window (leader CPU per heartbeat).
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    /// Controller replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// The agents' lease (`fence_after_ms`); default: the production 5 s, or 3 heartbeats when that is longer.
    #[arg(long)]
    fence_after_ms: Option<u64>,
    /// `node_timeout_ms`; default: the production 8 s, or the lease plus a heartbeat when that is longer.
    #[arg(long)]
    node_timeout_ms: Option<u64>,
    /// Give every node one running 8-GPU job before the window (nothing runs it: the simulated agents hold
    /// their assignments, so a node declared down shows as a requeued job).
    #[arg(long)]
    jobs: bool,
    /// After the window, SIGKILL the leader this many times under submission load, each time timing until every
    /// agent's lease is renewed by the new leader.
    #[arg(long, default_value_t = 0)]
    kills: usize,
    /// Clients submitting throughout the kills.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Each simulated agent waits a random pause below this before reconnecting (ms); the real agent's bound is
    /// 500 ms (or one heartbeat, if shorter).
    #[arg(long, default_value_t = 500)]
    reconnect_jitter_ms: u64,
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub async fn heartbeats(args: HeartbeatArgs, dir: PathBuf) -> anyhow::Result<()> {
    let HeartbeatArgs { agents, heartbeat_ms, duration_s, .. } = args;
    if agents == 0 || heartbeat_ms == 0 || duration_s == 0 || args.replicas == 0 {
        bail!("--agents, --heartbeat-ms, --duration-s and --replicas must be at least 1");
    }
    let nofile = raise_nofile(65_536.max(agents as libc::rlim_t * 2 + 4_096));
    if nofile < agents as libc::rlim_t + 1_024 {
        bail!("the open-file limit is {nofile} (hard limit); {agents} simulated agents need about {}", agents + 1_024);
    }
    let fence_after_ms = args.fence_after_ms.unwrap_or((3 * heartbeat_ms).max(5_000));
    let node_timeout_ms = args.node_timeout_ms.unwrap_or((fence_after_ms + heartbeat_ms).max(8_000));
    if node_timeout_ms <= fence_after_ms {
        bail!(
            "--node-timeout-ms must be longer than the lease (--fence-after-ms), or a node is declared down while its jobs may run"
        );
    }
    let options = UpOptions {
        controllers: args.replicas,
        agents: 0,
        agent_heartbeat_ms: heartbeat_ms,
        agent_fence_after_ms: fence_after_ms,
        node_timeout_ms,
        ..UpOptions::default()
    };
    let mut cluster = LocalCluster::up(&dir, options)?;
    let first_leader = cluster.wait_ready(Duration::from_secs(30)).await?;
    let client = Arc::new(cluster.client()?);
    let (_, leader_addr, log_before_ramp) = leader_of(&client).await?;
    let mut controllers: Vec<String> = cluster.addresses().split(',').map(str::to_string).collect();
    controllers.sort_by_key(|a| *a != leader_addr);
    println!(
        "bench heartbeats: {agents} simulated agents, one heartbeat every {heartbeat_ms} ms each, lease \
         {fence_after_ms} ms, node timeout {node_timeout_ms} ms, {} replicas, {duration_s} s window; leader replica \
         {first_leader}; open-file limit {nofile}",
        args.replicas
    );

    let sim = Arc::new(Sim::new(
        cluster.pki()?,
        controllers,
        Duration::from_millis(heartbeat_ms),
        agents,
        args.reconnect_jitter_ms,
        None,
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ramp_start = Instant::now();
    let tasks: Vec<_> = (0..agents).map(|i| tokio::spawn(sim_agent(sim.clone(), i, stop_rx.clone()))).collect();
    // Every task ends up registered or failed: its attempts are bounded and each is under a timeout.
    while sim.registered.load(Ordering::Relaxed) + sim.failed.load(Ordering::Relaxed) < agents {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ramp_s = ramp_start.elapsed().as_secs_f64();
    let (ramp_leader, _, log_after_ramp) = leader_of(&client).await?;
    let registered = sim.registered.load(Ordering::Relaxed);
    let lost_in_ramp = sim.lost.load(Ordering::Relaxed);
    println!(
        "registration: {registered} of {agents} agents registered in {ramp_s:.2} s ({RAMP_CONCURRENCY} at a time, \
         {:.0}/s); leader log +{} entries{}{}",
        registered as f64 / ramp_s,
        log_after_ramp.saturating_sub(log_before_ramp),
        if ramp_leader == first_leader { String::new() } else { format!("; LEADER CHANGED to replica {ramp_leader}") },
        if lost_in_ramp > 0 { format!("; {lost_in_ramp} sessions lost") } else { String::new() },
    );
    if registered == 0 {
        bail!("no simulated agent registered; see the controller logs in {}", cluster.dir.display());
    }
    let job_ids = if args.jobs { one_job_per_node(&client, &cluster, registered).await? } else { BTreeMap::new() };

    tokio::time::sleep(2 * sim.heartbeat).await;
    // The leader now, which is the one measured (a change during the ramp is reported above).
    let (leader, _, log_before) = leader_of(&client).await?;
    let pid = cluster.process(leader).and_then(|p| p.pid).context("the leader has no recorded pid")?;
    let m = measure_window(&sim, pid, duration_s).await;
    let (leader_after, _, log_after) = leader_of(&client).await?;
    let names: HashSet<String> = (0..agents).map(|i| sim_node(i).name).collect();
    let nodes = client.list_nodes(false).await?;
    let up = nodes.iter().filter(|n| names.contains(&n.info.name) && n.health == NodeHealth::Up).count();
    let log_entries = log_after as i64 - log_before as i64;
    print_window(&sim, &m, (leader, leader_after), (registered, agents, up), (heartbeat_ms, log_entries));
    if args.kills > 0 {
        failovers(&sim, &mut cluster, &client, (args.kills, args.clients), registered, (fence_after_ms, &names))
            .await?;
    }
    if args.jobs {
        print_jobs(&client, &job_ids).await?;
    }

    let _ = stop_tx.send(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    for task in tasks {
        let _ = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), task).await;
    }
    println!(
        "leases: {} ran out before their renewal (each would have fenced its node's jobs)",
        sim.fenced.load(Ordering::Relaxed)
    );
    drop(cluster);
    Ok(())
}

/// Submits one long 8-GPU job per simulated node and waits until every one runs.
async fn one_job_per_node(
    client: &Arc<Client>,
    cluster: &LocalCluster,
    nodes: usize,
) -> anyhow::Result<BTreeMap<u64, u64>> {
    let work_dir = cluster.dir.join("work");
    std::fs::create_dir_all(&work_dir)?;
    let spec = JobSpec { gpus_per_node: 8, name: "long".into(), ..true_job(&work_dir) };
    let started = Instant::now();
    let ids = submit_count(client, &spec, nodes, 16).await?;
    let ours: HashSet<u64> = ids.iter().copied().collect();
    loop {
        let status = client.cluster_status().await?;
        if status.running_jobs as usize >= nodes {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("{} of {nodes} jobs running after 300 s", status.running_jobs);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "jobs: {nodes} 8-GPU jobs submitted and running on {nodes} nodes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Each job's incarnation now: a requeue later shows as a higher one.
    let (jobs, _) = client.list_jobs(&JobFilter { include_finished: true, limit: 0, ..Default::default() }).await?;
    Ok(jobs.iter().filter(|j| ours.contains(&j.id)).map(|j| (j.id, j.incarnation)).collect())
}

/// Whether every long job still runs in its first incarnation: a node declared down, or a fenced one reported
/// as failed, shows here as a requeue.
async fn print_jobs(client: &Client, started: &BTreeMap<u64, u64>) -> anyhow::Result<()> {
    let (jobs, _) = client.list_jobs(&JobFilter { include_finished: true, limit: 0, ..Default::default() }).await?;
    let mine: Vec<_> = jobs.iter().filter(|j| started.contains_key(&j.id)).collect();
    let first = |j: &&drover_state::Job| started.get(&j.id) == Some(&j.incarnation);
    let running_first = mine.iter().filter(|j| j.state == JobState::Running && first(j)).count();
    let restarted = mine.iter().filter(|j| !first(j)).count();
    println!(
        "long jobs: {running_first} of {} running in their first incarnation, {restarted} restarted, {} missing",
        started.len(),
        started.len() - mine.len()
    );
    Ok(())
}

/// SIGKILLs the leader `kills` times under `clients` submitting, each time once every agent's lease was renewed
/// after the previous kill; prints per kill the renewals (p50/p99/max from the kill), the reconnect storm's peak,
/// and at the end the nodes declared down and the leases that ran out.
async fn failovers(
    sim: &Arc<Sim>,
    cluster: &mut LocalCluster,
    client: &Arc<Client>,
    (kills, clients): (usize, usize),
    registered: usize,
    (fence_after_ms, names): (u64, &HashSet<String>),
) -> anyhow::Result<()> {
    let fenced_before = sim.fenced.load(Ordering::Relaxed);
    let on_kill = {
        let sim = sim.clone();
        move || {
            *sim.killed_at.lock().expect("killed_at poisoned") = Some(Instant::now());
            sim.round.fetch_add(1, Ordering::Release);
        }
    };
    // Between kills: until every agent renewed after the last one (or the lease's length twice over, when some
    // never do: those are counted), then until every replica is back in a settled cluster (a leader killed while
    // the last one's replacement is still catching up leaves no quorum, which is another drill), then a heartbeat
    // more.
    let wait_renewed = {
        let (sim, client) = (sim.clone(), client.clone());
        move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            let (sim, client) = (sim.clone(), client.clone());
            Box::pin(async move {
                let round = sim.round.load(Ordering::Acquire);
                let waited = Instant::now();
                while waited.elapsed() < Duration::from_millis(2 * fence_after_ms + 10_000) {
                    let renewed =
                        sim.renewals.lock().expect("renewals poisoned").iter().filter(|(r, _)| *r == round).count();
                    if round == 0 || renewed >= registered {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let settling = Instant::now();
                while settling.elapsed() < Duration::from_secs(60) {
                    if let Ok(status) = client.cluster_status().await
                        && status.replicas.iter().all(|r| drover_testkit::local::rejoined(&status, r.id, 10))
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(sim.heartbeat).await;
            })
        }
    };
    let faults = vec![crate::Fault::Leader; kills];
    let hooks = crate::KillHooks { on_kill: &on_kill, before_kill: &wait_renewed };
    let result = crate::kill_under_load(cluster, client.clone(), clients, &faults, Duration::ZERO, &[], hooks).await?;
    wait_renewed().await;
    let renewals = sim.renewals.lock().expect("renewals poisoned").clone();
    let reopened = sim.reopened.lock().expect("reopened poisoned").clone();
    let mut worst = Duration::ZERO;
    for (round, r) in result.rounds.iter().enumerate() {
        let round = round as u64 + 1;
        let times: Vec<Duration> = renewals.iter().filter(|(n, _)| *n == round).map(|(_, d)| *d).collect();
        worst = worst.max(times.iter().copied().max().unwrap_or_default());
        // The storm: sessions opened per 100 ms after the kill, at its busiest.
        let mut per_slot: BTreeMap<u128, usize> = BTreeMap::new();
        for (_, d) in reopened.iter().filter(|(n, _)| *n == round) {
            *per_slot.entry(d.as_millis() / 100).or_default() += 1;
        }
        let peak = per_slot.values().max().copied().unwrap_or(0);
        println!(
            "kill {round:>2}: leader {} -> {}; next ack {:.0} ms; leases renewed {} of {registered}: p50 {:.0} ms, p99 \
             {:.0} ms, max {:.0} ms after the kill; reconnect peak {} sessions/s",
            r.leader_before,
            r.leader_after,
            r.gap.as_secs_f64() * 1e3,
            times.len(),
            crate::percentile_ms(&times, 0.5),
            crate::percentile_ms(&times, 0.99),
            crate::percentile_ms(&times, 1.0),
            peak * 10,
        );
    }
    let nodes = client.list_nodes(false).await?;
    let down = nodes.iter().filter(|n| names.contains(&n.info.name) && n.health != NodeHealth::Up).count();
    println!(
        "failover: {kills} leader kills with {registered} agents: every lease renewed within {:.0} ms of its kill \
         (lease {fence_after_ms} ms); {} leases ran out; {down} nodes not Up; submissions {} acknowledged, {} lost",
        worst.as_secs_f64() * 1e3,
        sim.fenced.load(Ordering::Relaxed) - fenced_before,
        result.acknowledged,
        result.lost,
    );
    Ok(())
}

/// What one measured window saw: CPU ticks of the leader and of this process at its ends, the simulated agents'
/// counters at its ends, its length, and the leader's memory.
struct Window {
    ticks: f64,
    leader_cpu: (Option<u64>, Option<u64>),
    self_cpu: (Option<u64>, Option<u64>),
    /// (heartbeats sent, answered, sessions lost, reopened, outbox full) at its start and end.
    before: (u64, u64, usize, usize, u64),
    after: (u64, u64, usize, usize, u64),
    window_s: f64,
    rss_max_kib: u64,
    rss_end_kib: u64,
}

/// Measures the leader (`pid`) over `duration_s` with every simulated agent heartbeating.
async fn measure_window(sim: &Sim, pid: u32, duration_s: u64) -> Window {
    let ticks = clock_ticks_per_s();
    let (leader_cpu0, self_cpu0) = (cpu_ticks(&pid.to_string()), cpu_ticks("self"));
    let snapshot = |sim: &Sim| {
        (
            sim.heartbeats.load(Ordering::Relaxed),
            sim.alive.load(Ordering::Relaxed),
            sim.lost.load(Ordering::Relaxed),
            sim.reconnected.load(Ordering::Relaxed),
            sim.outbox_full.load(Ordering::Relaxed),
        )
    };
    let before = snapshot(sim);
    sim.measuring.store(true, Ordering::Relaxed);
    let window_start = Instant::now();
    let mut rss_max = rss_kib(pid);
    while window_start.elapsed() < Duration::from_secs(duration_s) {
        let left = Duration::from_secs(duration_s).saturating_sub(window_start.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        rss_max = rss_max.max(rss_kib(pid));
    }
    let (leader_cpu1, self_cpu1) = (cpu_ticks(&pid.to_string()), cpu_ticks("self"));
    let window_s = window_start.elapsed().as_secs_f64();
    sim.measuring.store(false, Ordering::Relaxed);
    let after = snapshot(sim);
    Window {
        ticks,
        leader_cpu: (leader_cpu0, leader_cpu1),
        self_cpu: (self_cpu0, self_cpu1),
        before,
        after,
        window_s,
        rss_max_kib: rss_max,
        rss_end_kib: rss_kib(pid),
    }
}

/// The window's line: the leader's CPU per heartbeat and memory, the round trips, and anything that went wrong.
fn print_window(
    sim: &Sim,
    m: &Window,
    (leader, leader_after): (u64, u64),
    (registered, agents, up): (usize, usize, usize),
    (heartbeat_ms, log_entries): (u64, i64),
) {
    let (ticks, window) = (m.ticks, m.window_s);
    let (before, after) = (m.before, m.after);
    let (sent, answered, lost, reconnected, full) =
        (after.0 - before.0, after.1 - before.1, after.2 - before.2, after.3 - before.3, after.4 - before.4);
    let percent = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}%", b.saturating_sub(a) as f64 / ticks / window * 100.0),
        _ => "n/a".to_string(),
    };
    let (leader_cpu0, leader_cpu1) = m.leader_cpu;
    let leader_cpu_s = leader_cpu0.zip(leader_cpu1).map(|(a, b)| b.saturating_sub(a) as f64 / ticks);
    let per_heartbeat = match leader_cpu_s {
        Some(s) if sent > 0 => format!(" = {:.0} µs per heartbeat", s * 1e6 / sent as f64),
        _ => String::new(),
    };
    let (p50, p99, max) = {
        let h = sim.round_trip.lock().expect("round_trip poisoned");
        let ms = |v: u64| v as f64 / 1e3;
        (ms(h.value_at_quantile(0.5)), ms(h.value_at_quantile(0.99)), ms(h.max()))
    };
    let mut trouble = Vec::new();
    if leader_after != leader {
        trouble.push(format!("LEADER CHANGED in the window: replica {leader}, then {leader_after}"));
    }
    if lost > 0 {
        trouble.push(format!("{lost} sessions ended in the window, {reconnected} reopened"));
    }
    if full > 0 {
        trouble.push(format!("{full} heartbeats not sent (outbox full)"));
    }
    if let Some(e) = sim.first_error() {
        trouble.push(format!("first error: {e}"));
    }
    let trouble = if trouble.is_empty() { String::new() } else { format!("; {}", trouble.join("; ")) };
    println!(
        "heartbeats: {registered} simulated agents x 1 per {heartbeat_ms} ms, {window:.1} s on leader replica {leader}: \
         leader CPU {} of one core{per_heartbeat}, RSS {} MiB (max {} MiB); Raft log +{log_entries} entries; {sent} \
         heartbeats sent ({:.0}/s), {answered} answered (p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms); \
         {up}/{agents} nodes Up; bench process CPU {}{trouble}",
        percent(leader_cpu0, leader_cpu1),
        m.rss_end_kib / 1024,
        m.rss_max_kib / 1024,
        sent as f64 / window,
        percent(m.self_cpu.0, m.self_cpu.1),
    );
}

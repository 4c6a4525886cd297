//! Runs a drill against a [`Target`]: the workload, the fault schedule, a prober that records each replica's role,
//! a poller that records job states; then waits for the workload to finish, takes the final listing, reads the
//! jobs' own logs, and hands the history to the checker and the report.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use drover_client::{Client, ClientConfig, JobFilter};

use crate::checker::{Bounds, Violation, check};
use crate::drill::{Drill, FaultKind, ScheduledFault, TargetSpec};
use crate::history::{EventKind, History};
use crate::recorder::Recorder;
use crate::target::{FaultId, Member, Target};
use crate::workload;

/// How often each replica is asked its role (the timeline's resolution).
const PROBE_EVERY_MS: u64 = 200;
/// How long a fault waits for a leader to aim at.
const LEADER_WAIT_S: u64 = 30;
/// How often the job states are read.
const POLL_EVERY_MS: u64 = 1_000;
/// A replica that does not answer a probe within this long counts as unreachable at that moment. A replica's
/// status answer includes its peers' (each asked with a 1 s bound), so under a partition an answer takes about a
/// second: shorter would paint every replica unreachable.
const PROBE_DEADLINE_MS: u64 = 1_500;

/// What a finished drill leaves: its history, the checker's verdict, and where the files went.
pub struct Outcome {
    pub history: History,
    pub violations: Vec<Violation>,
    pub out_dir: PathBuf,
}

/// Something a fault did that its heal must undo.
enum Undo {
    Start(Member),
    Resume(Member),
    Heal(Vec<FaultId>),
    /// Heal the disk, then start the replica again if it stopped itself.
    Disk(FaultId, u64),
    RemoveReplicas(Vec<u64>),
    Nothing,
}

struct Runner<'a> {
    target: &'a mut dyn Target,
    client: Arc<Client>,
    config: ClientConfig,
    /// How many times each target kind was resolved (agents and followers are taken in turn).
    turns: HashMap<&'static str, usize>,
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Runs `drill` on `target` (already up) and writes `history.jsonl`, `report.txt` and `timeline.svg` to `out_dir`.
pub async fn run(drill: &Drill, target: &mut dyn Target, out_dir: &Path) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let schedule = drill.schedule()?;
    let mut config = ClientConfig::load(&target.client_config())?;
    // As every client does (`ClientConfig::from_environment`): the drill's own clients may get their credentials
    // from another socket than the jobs' (a container cluster's login node, seen from the host).
    if let Some(socket) = std::env::var_os("DROVER_AUTH_SOCKET").filter(|s| !s.is_empty()) {
        config.auth_socket = socket.into();
    }
    let addresses: Vec<String> = target.replica_addresses().into_iter().map(|(_, a)| a).collect();
    let config = config.with_controllers(&addresses.join(","));
    let client = Arc::new(Client::new(&config)?.with_deadline(Duration::from_millis(workload::SUBMIT_DEADLINE_MS)));
    wait_ready(&client, target.agents().len()).await?;

    let recorder = Recorder::new();
    let mut runner = Runner { target, client: client.clone(), config, turns: HashMap::new() };
    let stop_probes = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe_roles(
        runner.config.clone(),
        runner.target.replica_addresses(),
        recorder.clone(),
        stop_probes.clone(),
    ));
    let poller = tokio::spawn(poll_states(client.clone(), recorder.clone(), stop_probes.clone()));

    // The workload, from now on the drill's clock (the schedule's times count from here).
    let logs = runner.target.shared_dir().join("jobs");
    std::fs::create_dir_all(&logs)?;
    std::fs::set_permissions(&logs, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let stop_submitting = Arc::new(AtomicBool::new(false));
    let make_spec = {
        let (w, logs, cfg) = (drill.workload.clone(), logs.clone(), runner.target.client_config());
        let controllers = addresses.join(",");
        Arc::new(move |n: u64| workload::job_spec(&w, n, &logs, &cfg, &controllers))
    };
    let workload_start_ms = recorder.now_ms();
    let submitter = tokio::spawn(workload::submit_loops(
        client.clone(),
        drill.workload.clone(),
        recorder.clone(),
        stop_submitting.clone(),
        make_spec,
    ));

    let workload_end_ms = workload_start_ms + drill.workload.duration_s * 1000;
    play_schedule(&mut runner, schedule, &recorder, workload_start_ms, (&stop_submitting, &stop_probes)).await?;
    let now = recorder.now_ms();
    if workload_end_ms > now {
        tokio::time::sleep(Duration::from_millis(workload_end_ms - now)).await;
    }
    stop_submitting.store(true, Ordering::Relaxed);
    submitter.await?;

    // Liveness: every acknowledged job must end within the bound.
    await_acknowledged(&client, &recorder, Duration::from_secs(drill.bounds.finish_within_s)).await;
    stop_probes.store(true, Ordering::Relaxed);
    let _ = prober.await;
    let _ = poller.await;
    let (jobs, _) = client
        .list_jobs(&JobFilter { include_finished: true, ..Default::default() })
        .await
        .context("the final listing of jobs (the cluster should be whole again by now)")?;
    recorder.record(EventKind::FinalJobs { jobs: jobs.iter().map(|j| (j.id, j.state.name().to_string())).collect() });

    // The jobs' own logs.
    read_job_logs(&logs, &recorder, drill.workload.step_ms as u64)?;
    let history = recorder.history();
    std::fs::write(out_dir.join("history.jsonl"), history.to_json_lines())?;
    let violations = check(&history, Bounds { finish_within_ms: Some(drill.bounds.finish_within_s * 1000) });
    Ok(Outcome { history, violations, out_dir: out_dir.to_path_buf() })
}

/// Injects the schedule's faults and heals them, in time order, on the workload's clock.
async fn play_schedule(
    runner: &mut Runner<'_>,
    schedule: Vec<ScheduledFault>,
    recorder: &Recorder,
    workload_start_ms: u64,
    (stop_submitting, stop_probes): (&AtomicBool, &AtomicBool),
) -> anyhow::Result<()> {
    let mut queue: BTreeMap<(u64, u64), Action> = BTreeMap::new();
    for (seq, fault) in schedule.into_iter().enumerate() {
        queue.insert((workload_start_ms + fault.at_ms, seq as u64 * 2), Action::Start(fault));
    }
    let mut heals_pending = 0usize;
    // How late the schedule runs: an injection or heal that took long (a replica slow to stop) shifts everything
    // after it, so that faults keep their order and spacing. Firing overdue faults at once instead would stack
    // them: a second leader kill before the first heal takes the quorum away, which no drill asked for.
    let mut lag_ms = 0u64;
    loop {
        let next = queue.keys().next().copied();
        let Some(key) = next else { break };
        let now = recorder.now_ms();
        let due = key.0 + lag_ms;
        if due > now {
            tokio::time::sleep(Duration::from_millis(due - now)).await;
        } else {
            lag_ms = now - key.0;
        }
        let action = queue.remove(&key).expect("key just seen");
        match action {
            Action::Start(fault) => {
                let name = runner.describe(&fault);
                match runner.inject(&fault).await {
                    Ok((name, undo)) => {
                        println!("{:>8.1} s  fault: {name}", (recorder.now_ms() - workload_start_ms) as f64 / 1e3);
                        recorder.record(EventKind::FaultStarted { name: name.clone() });
                        // On the unshifted clock, like every key: the fault lasts its full duration from now.
                        let heal_at = (recorder.now_ms() + (fault.heal_ms - fault.at_ms)).saturating_sub(lag_ms);
                        queue.insert((heal_at.max(key.0), key.1 + 1), Action::Heal(name, undo));
                        heals_pending += 1;
                    }
                    Err(e) => {
                        // A fault that cannot be injected makes the drill meaningless: say which and stop.
                        stop_submitting.store(true, Ordering::Relaxed);
                        stop_probes.store(true, Ordering::Relaxed);
                        bail!("injecting {name}: {e:#}");
                    }
                }
            }
            Action::Heal(name, undo) => {
                runner.heal(undo).await.with_context(|| format!("healing {name}"))?;
                println!("{:>8.1} s  healed: {name}", (recorder.now_ms() - workload_start_ms) as f64 / 1e3);
                recorder.record(EventKind::FaultHealed { name });
                heals_pending -= 1;
            }
        }
    }
    debug_assert_eq!(heals_pending, 0);
    Ok(())
}

/// Waits until every acknowledged job has ended, or `bound` has passed (the checker then names what did not).
async fn await_acknowledged(client: &Client, recorder: &Recorder, bound: Duration) {
    let waited = tokio::time::Instant::now();
    loop {
        let acked: Vec<u64> = crate::history::acked_jobs(&recorder.history().events).collect();
        let listing = client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await;
        if let Ok((jobs, _)) = listing {
            let done: std::collections::HashSet<u64> =
                jobs.iter().filter(|j| j.state.is_terminal()).map(|j| j.id).collect();
            if acked.iter().all(|id| done.contains(id)) {
                break;
            }
        }
        if waited.elapsed() > bound {
            println!("the workload did not finish within {} s of the last heal", bound.as_secs());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The jobs' own logs, as events in the history.
fn read_job_logs(logs: &Path, recorder: &Recorder, step_ms: u64) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(logs)? {
        let path = entry?.path();
        let Some(job) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        let Ok(job) = job.parse::<u64>() else { continue };
        let text = std::fs::read_to_string(&path)?;
        for e in workload::events_from_job_log(job, &text, recorder, step_ms) {
            recorder.record_at(e.at_ms, e.kind);
        }
    }
    Ok(())
}

enum Action {
    Start(ScheduledFault),
    Heal(String, Undo),
}

/// Waits until a leader serves and every agent's node is up.
async fn wait_ready(client: &Client, agents: usize) -> anyhow::Result<()> {
    let start = tokio::time::Instant::now();
    // What the last try saw, so a cluster that never comes up says whether no leader answered or which nodes were
    // missing (a CI log is all there is to go on).
    loop {
        let seen = match client.list_nodes(false).await {
            Ok(nodes) => {
                if nodes.iter().filter(|n| n.health == drover_state::NodeHealth::Up).count() >= agents {
                    return Ok(());
                }
                let listed: Vec<String> = nodes.iter().map(|n| format!("{} {:?}", n.info.name, n.health)).collect();
                format!("a leader answered with nodes [{}]", listed.join(", "))
            }
            Err(e) => format!("no leader answered: {e}"),
        };
        if start.elapsed() > Duration::from_secs(60) {
            bail!("the cluster did not elect a leader with all {agents} agents up within 60 s (last try: {seen})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replica `id`'s entry in a status answer, when `id` itself answered: what it says of itself, not what a peer
/// believes of it.
fn self_reported(status: &drover_client::ClusterStatusReply, id: u64) -> Option<&drover_client::ReplicaStatus> {
    if status.answered_by != id {
        return None;
    }
    status.replicas.iter().find(|r| r.id == id)
}

/// Records each replica's role as it reports itself, on every change.
async fn probe_roles(config: ClientConfig, replicas: Vec<(u64, String)>, recorder: Recorder, stop: Arc<AtomicBool>) {
    let mut clients = Vec::new();
    for (id, addr) in &replicas {
        if let Ok(c) = Client::new(&config.with_controllers(addr)) {
            clients.push((*id, Arc::new(c.with_deadline(Duration::from_millis(PROBE_DEADLINE_MS)))));
        }
    }
    let mut last: HashMap<u64, (String, u64)> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let probes = clients.iter().map(|(id, c)| {
            let c = c.clone();
            let id = *id;
            async move { (id, c.cluster_status().await) }
        });
        for (id, status) in futures::future::join_all(probes).await {
            let seen = match status {
                Ok(s) if s.answered_by == id => {
                    self_reported(&s, id).map(|r| (r.role.clone(), r.term)).unwrap_or(("unknown".into(), 0))
                }
                _ => ("unreachable".into(), last.get(&id).map_or(0, |l| l.1)),
            };
            if last.get(&id) != Some(&seen) {
                recorder.record(EventKind::RoleObserved { replica: id, role: seen.0.clone(), term: seen.1 });
                last.insert(id, seen);
            }
        }
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
}

/// Records every job's state as the cluster reports it, on every change.
async fn poll_states(client: Arc<Client>, recorder: Recorder, stop: Arc<AtomicBool>) {
    let mut last: HashMap<u64, &'static str> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok((jobs, _)) = client.list_jobs(&JobFilter { include_finished: true, ..Default::default() }).await {
            for job in jobs {
                let state = job.state.name();
                if last.insert(job.id, state) != Some(state) {
                    recorder.record(EventKind::StateObserved { job: job.id, state: state.to_string() });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_EVERY_MS)).await;
    }
}

impl Runner<'_> {
    fn describe(&self, fault: &ScheduledFault) -> String {
        format!("{:?} {:?}", fault.kind, fault.target)
    }

    /// The current leader, asked of the cluster (a few tries: a fault may just have caused an election).
    /// Every replica is asked at once, with a short deadline each, and the leader of the highest term any of them
    /// reports for itself wins: one slow or restarting replica must not hold the schedule up (a shared client
    /// waited on one for over a minute in a soak, and the faults after it fired late, stacked).
    async fn leader(&self) -> anyhow::Result<u64> {
        let start = tokio::time::Instant::now();
        while start.elapsed() < Duration::from_secs(LEADER_WAIT_S) {
            let asks = self.target.replica_addresses().into_iter().map(|(id, addr)| {
                let config = self.config.with_controllers(&addr);
                async move {
                    let client = Client::new(&config).ok()?.with_deadline(Duration::from_millis(PROBE_DEADLINE_MS));
                    let status = client.cluster_status().await.ok()?;
                    let me = self_reported(&status, id)?;
                    (me.role == "leader").then_some((me.term, id))
                }
            });
            if let Some((_, id)) = futures::future::join_all(asks).await.into_iter().flatten().max() {
                return Ok(id);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no replica said it leads for {LEADER_WAIT_S} s")
    }

    fn turn(&mut self, what: &'static str) -> usize {
        let n = self.turns.entry(what).or_default();
        *n += 1;
        *n - 1
    }

    async fn resolve(&mut self, spec: &TargetSpec) -> anyhow::Result<Member> {
        Ok(match spec {
            TargetSpec::Leader => Member::Replica(self.leader().await?),
            TargetSpec::Follower => {
                let leader = self.leader().await?;
                let followers: Vec<u64> = self.target.replicas().into_iter().filter(|&r| r != leader).collect();
                let n = self.turn("follower");
                Member::Replica(followers[n % followers.len()])
            }
            TargetSpec::Controller(id) => Member::Replica(*id),
            TargetSpec::AnyAgent => {
                let agents = self.target.agents();
                let n = self.turn("agent");
                Member::Agent(agents[n % agents.len()].clone())
            }
            TargetSpec::Agent(name) => Member::Agent(name.clone()),
            TargetSpec::Cluster => bail!("`cluster` names no single process"),
        })
    }

    /// Injects one fault; its name (with whom it hit) and what its heal must undo.
    async fn inject(&mut self, fault: &ScheduledFault) -> anyhow::Result<(String, Undo)> {
        let role = match fault.target {
            TargetSpec::Leader => "leader ",
            TargetSpec::Follower => "follower ",
            _ => "",
        };
        Ok(match fault.kind {
            FaultKind::Kill => {
                let m = self.resolve(&fault.target).await?;
                blocking(|| self.target.kill(&m))?;
                (format!("kill {role}{m}"), Undo::Start(m))
            }
            FaultKind::Pause => {
                let m = self.resolve(&fault.target).await?;
                self.target.pause(&m)?;
                (format!("pause {role}{m}"), Undo::Resume(m))
            }
            FaultKind::Isolate => {
                let m = self.resolve(&fault.target).await?;
                let id = self.target.isolate(&m)?;
                (format!("isolate {role}{m}"), Undo::Heal(vec![id]))
            }
            FaultKind::Partition => {
                let m = self.resolve(&fault.target).await?;
                let Member::Replica(me) = m else { bail!("only a replica can be partitioned") };
                let replicas = self.target.replicas();
                // The minority: the target and, with 5 replicas, one more.
                let minority = replicas.len().div_ceil(2) - 1;
                let mut side_a: Vec<Member> = vec![Member::Replica(me)];
                side_a.extend(replicas.iter().filter(|&&r| r != me).take(minority - 1).map(|&r| Member::Replica(r)));
                let mut side_b: Vec<Member> =
                    replicas.iter().map(|&r| Member::Replica(r)).filter(|r| !side_a.contains(r)).collect();
                let agents = self.target.agents();
                let half = agents.len() / 2;
                side_a.extend(agents[..half].iter().map(|a| Member::Agent(a.clone())));
                side_b.extend(agents[half..].iter().map(|a| Member::Agent(a.clone())));
                let name = format!("partition {role}{{{}}} from {{{}}}", list(&side_a), list(&side_b));
                let one = self.target.block(&side_a, &side_b)?;
                let two = self.target.block(&side_b, &side_a)?;
                (name, Undo::Heal(vec![one, two]))
            }
            FaultKind::OneWay => {
                let m = self.resolve(&fault.target).await?;
                let others: Vec<Member> =
                    self.target.replicas().into_iter().map(Member::Replica).filter(|r| *r != m).collect();
                let id = self.target.block(&others, std::slice::from_ref(&m))?;
                (format!("one-way cut: {role}{m} hears no replica"), Undo::Heal(vec![id]))
            }
            FaultKind::Loss => {
                let id = self.target.loss(fault.loss_percent)?;
                (format!("loss {} % between all members", fault.loss_percent), Undo::Heal(vec![id]))
            }
            FaultKind::Delay => {
                let id = self.target.delay(
                    Duration::from_millis(fault.delay_ms as u64),
                    Duration::from_millis(fault.jitter_ms as u64),
                )?;
                (format!("delay {} ms between all members", fault.delay_ms), Undo::Heal(vec![id]))
            }
            FaultKind::DiskFull => {
                let m = self.resolve(&fault.target).await?;
                let Member::Replica(id) = m else { bail!("only a replica has a data disk here") };
                let fault_id = self.target.fill_disk(id)?;
                (format!("disk full on {role}{m}"), Undo::Disk(fault_id, id))
            }
            FaultKind::RollingRestart => {
                for id in self.target.replicas() {
                    let m = Member::Replica(id);
                    blocking(|| self.target.stop(&m))?;
                    self.target.start(&m)?;
                    self.wait_caught_up(id).await?;
                }
                ("rolling restart of every replica".to_string(), Undo::Nothing)
            }
            FaultKind::Upgrade | FaultKind::Rollback => {
                let previous = fault.kind == FaultKind::Rollback;
                self.roll(previous).await?;
                let build = if previous { "the previous release" } else { "this build" };
                (format!("rolling {} to {build}", if previous { "back" } else { "upgrade" }), Undo::Nothing)
            }
            FaultKind::Finalize => {
                let report = self.client.finalize_upgrade(0).await.context("finalizing the upgrade")?;
                (format!("finalize: feature level {}", report.active_feature_level), Undo::Nothing)
            }
            FaultKind::Membership => {
                let mut added = Vec::new();
                for _ in 0..2 {
                    let (id, addr) = self.target.spawn_replica()?;
                    self.client.add_replica(id, &addr).await.with_context(|| format!("adding replica {id}"))?;
                    added.push(id);
                }
                (format!("membership 3 -> 5 (replicas {added:?} added)"), Undo::RemoveReplicas(added))
            }
        })
    }

    async fn heal(&mut self, undo: Undo) -> anyhow::Result<()> {
        match undo {
            Undo::Start(m) => self.target.start(&m)?,
            Undo::Resume(m) => self.target.resume(&m)?,
            Undo::Heal(ids) => {
                for id in ids {
                    self.target.heal(id)?;
                }
            }
            Undo::Disk(id, replica) => {
                self.target.heal(id)?;
                let m = Member::Replica(replica);
                if !self.target.is_running(&m) {
                    self.target.start(&m)?;
                }
            }
            Undo::RemoveReplicas(ids) => {
                for id in ids {
                    self.client.remove_replica(id).await.with_context(|| format!("removing replica {id}"))?;
                    blocking(|| self.target.retire_replica(id))?;
                }
            }
            Undo::Nothing => {}
        }
        Ok(())
    }

    /// Rolls the cluster to this build (replicas first, then agents) or back to the previous release (agents
    /// first, then replicas: the upgrade in reverse). Replicas go followers first and the leader last (one
    /// election), each caught up before the next; agents one at a time, each back in session before the next.
    async fn roll(&mut self, previous: bool) -> anyhow::Result<()> {
        if previous {
            self.roll_agents(previous).await?;
            self.roll_replicas(previous).await
        } else {
            self.roll_replicas(previous).await?;
            self.roll_agents(previous).await
        }
    }

    async fn roll_replicas(&mut self, previous: bool) -> anyhow::Result<()> {
        let leader = self.leader().await?;
        let mut replicas: Vec<u64> = self.target.replicas().into_iter().filter(|&r| r != leader).collect();
        replicas.push(leader);
        for id in replicas {
            let m = Member::Replica(id);
            blocking(|| self.target.stop(&m))?;
            self.target.set_build(&m, previous)?;
            self.target.start(&m)?;
            self.wait_caught_up(id).await?;
        }
        Ok(())
    }

    async fn roll_agents(&mut self, previous: bool) -> anyhow::Result<()> {
        let want = if previous { drover_testkit::previous::VERSION } else { env!("CARGO_PKG_VERSION") };
        for name in self.target.agents() {
            let m = Member::Agent(name.clone());
            blocking(|| self.target.stop(&m))?;
            self.target.set_build(&m, previous)?;
            self.target.start(&m)?;
            if let Err(why) = self.wait_in_session(&name, want).await {
                // An agent that exits at once (seen once, a 0.1.0 agent beside this build's, its error lost to a
                // log tail of backtrace frames) is started once more, in plain sight on stderr; one that stays up
                // without a session is the drill's failure.
                if self.target.is_running(&m) {
                    return Err(why);
                }
                eprintln!("{why}; starting it once more");
                self.target.start(&m)?;
                self.wait_in_session(&name, want).await?;
            }
        }
        Ok(())
    }

    /// Waits until agent `name` has a session with the leader again, as build `version`. A leader of the previous
    /// release cannot say (it has no version report), so then the wait is a second, well inside the agent's lease.
    async fn wait_in_session(&self, name: &str, version: &str) -> anyhow::Result<()> {
        let start = tokio::time::Instant::now();
        let m = Member::Agent(name.to_string());
        while start.elapsed() < Duration::from_secs(60) {
            if !self.target.is_running(&m) {
                bail!("agent {name} exited right after its restart as {version} (see its log)");
            }
            match self.client.cluster_version().await {
                Ok(report)
                    if report
                        .agents
                        .iter()
                        .any(|a| a.node == name && a.version.as_ref().is_some_and(|v| v.binary_version == version)) =>
                {
                    return Ok(());
                }
                Err(drover_client::ClientError::Unimplemented(_)) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return Ok(());
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        bail!("agent {name} did not open a session as {version} within 60 s of its restart")
    }

    /// Waits until replica `id` answers and has applied what the leader had when it came back.
    async fn wait_caught_up(&self, id: u64) -> anyhow::Result<()> {
        let addr = self.target.replica_addresses().into_iter().find(|(r, _)| *r == id).map(|(_, a)| a);
        let addr = addr.context("a replica without an address")?;
        let own = Client::new(&self.config.with_controllers(&addr))?.with_deadline(Duration::from_millis(500));
        let start = tokio::time::Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if let Ok(s) = own.cluster_status().await
                && self_reported(&s, id).is_some()
                && drover_testkit::local::rejoined(&s, id, 10)
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("replica {id} did not catch up within 60 s of its restart")
    }
}

fn list(members: &[Member]) -> String {
    members.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", ")
}

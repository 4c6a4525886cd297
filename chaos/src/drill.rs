//! A drill as an SRE writes it (`chaos/drills/*.toml`): the cluster's shape, a workload, a schedule of faults
//! (each with a start, a duration and a heal) and the bound within which the workload must finish once the faults
//! have healed. Parsing and the schedule are pure, so a drill's timeline is known before anything runs.

use serde::Deserialize;

/// The longest drill accepted (a soak is 10 minutes; an hour leaves room without letting a typo run for days).
pub const MAX_DURATION_S: u64 = 3_600;
/// Fault occurrences per drill (a leader kill every second for an hour).
pub const MAX_FAULTS: usize = 4_000;
/// Submissions per second the workload may ask for (more measures the client, not the cluster's promises).
pub const MAX_SUBMIT_PER_S: u32 = 500;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Drill {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub cluster: ClusterShape,
    pub workload: Workload,
    #[serde(default)]
    pub bounds: DrillBounds,
    #[serde(default, rename = "fault")]
    pub faults: Vec<FaultSpec>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterShape {
    pub controllers: usize,
    pub agents: usize,
    pub gpus_per_agent: u32,
    /// How long a silent agent keeps its jobs before the leader declares its node down (ms).
    pub node_timeout_ms: u64,
    /// How long an agent that cannot reach a quorum keeps its tasks before it kills them (ms): must be shorter
    /// than `node_timeout_ms`, or a job could run twice.
    pub agent_fence_after_ms: u64,
    /// Which build the replicas and agents start as: this one, or the previous release (an upgrade drill).
    pub build: Build,
}

/// A build the cluster's processes run.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Build {
    /// This build.
    #[default]
    Current,
    /// The previous release (`drover_testkit::previous`: built from its commit on first use).
    Previous,
}

impl Default for ClusterShape {
    fn default() -> Self {
        // 16 simulated GPUs per agent: enough that the default workload fits with room to spare, so a backlog
        // in a drill means a fault, not an overloaded cluster.
        ClusterShape {
            controllers: 3,
            agents: 2,
            gpus_per_agent: 16,
            node_timeout_ms: 6_000,
            agent_fence_after_ms: 3_000,
            build: Build::Current,
        }
    }
}

/// What the clients do while the faults happen.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Submissions go on this long (s); the drill then waits for the jobs to finish.
    pub duration_s: u64,
    /// Submissions per second, over all clients.
    pub submit_per_s: u32,
    #[serde(default = "default_clients")]
    pub clients: u32,
    /// Every job is a counter that takes `steps` steps of `step_ms`, records a checkpoint every
    /// `checkpoint_every` steps, and resumes from its latest checkpoint when requeued.
    #[serde(default = "default_steps")]
    pub steps: u32,
    #[serde(default = "default_step_ms")]
    pub step_ms: u32,
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u32,
    /// GPUs per job, taken in turn.
    #[serde(default = "default_gpus")]
    pub gpus: Vec<u32>,
}

fn default_clients() -> u32 {
    2
}
fn default_steps() -> u32 {
    10
}
fn default_step_ms() -> u32 {
    150
}
fn default_checkpoint_every() -> u32 {
    4
}
fn default_gpus() -> Vec<u32> {
    vec![1, 2]
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DrillBounds {
    /// Once the last fault has healed and the submissions have stopped, every acknowledged job must finish within
    /// this long (s).
    pub finish_within_s: u64,
}

impl Default for DrillBounds {
    fn default() -> Self {
        DrillBounds { finish_within_s: 120 }
    }
}

/// One line of the fault schedule, possibly repeated.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// Who suffers it: `leader`, `follower`, `controller:N`, `agent`, `agent:NAME`, or `cluster` (loss, delay,
    /// rolling restart, membership).
    #[serde(default = "default_target")]
    pub target: String,
    /// Seconds after the workload starts.
    pub at_s: f64,
    /// How long the fault lasts before it heals (s); 0 for faults that heal themselves (a rolling restart).
    #[serde(default)]
    pub duration_s: f64,
    /// Repeat every this many seconds (from `at_s`), `count` times in all.
    #[serde(default)]
    pub every_s: Option<f64>,
    #[serde(default = "default_count")]
    pub count: u32,
    /// `loss`: the share of packets dropped.
    #[serde(default)]
    pub loss_percent: Option<u32>,
    /// `delay`: added one-way latency, and its jitter.
    #[serde(default)]
    pub delay_ms: Option<u32>,
    #[serde(default)]
    pub jitter_ms: Option<u32>,
}

fn default_target() -> String {
    "cluster".into()
}
fn default_count() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL, restarted with its data at the heal.
    Kill,
    /// SIGSTOP, SIGCONT at the heal: a hung process that comes back with stale beliefs.
    Pause,
    /// Every packet to or from it dropped.
    Isolate,
    /// The replicas split in two: the target with a minority of replicas and half of the agents, the rest apart.
    Partition,
    /// Packets from the other replicas to the target are dropped; its own still arrive (it can send, never hear).
    OneWay,
    /// A share of all packets between cluster members dropped at random.
    Loss,
    /// Added latency between cluster members (tc netem).
    Delay,
    /// The replica's data disk fills up; the heal frees it (and restarts the replica if it stopped).
    DiskFull,
    /// Every replica restarted in turn, each back before the next goes (an upgrade).
    RollingRestart,
    /// Two replicas added (3 -> 5), removed again at the heal (5 -> 3).
    Membership,
    /// A rolling upgrade to this build: every replica in turn (followers first, the leader last), each caught up
    /// before the next, then every agent.
    Upgrade,
    /// The same roll back to the previous release (possible until the upgrade is finalized).
    Rollback,
    /// `drover cluster upgrade finalize`: the feature level raised once every replica understands it.
    Finalize,
}

impl FaultKind {
    /// Operations on the whole cluster that end by themselves (no heal, no duration).
    pub fn is_operation(self) -> bool {
        matches!(self, FaultKind::RollingRestart | FaultKind::Upgrade | FaultKind::Rollback | FaultKind::Finalize)
    }
}

/// Who a fault hits, as the drill names it (resolved against the live cluster when the fault starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    Leader,
    Follower,
    Controller(u64),
    AnyAgent,
    Agent(String),
    Cluster,
}

/// One occurrence of a fault on the drill's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledFault {
    pub at_ms: u64,
    pub heal_ms: u64,
    pub kind: FaultKind,
    pub target: TargetSpec,
    pub loss_percent: u32,
    pub delay_ms: u32,
    pub jitter_ms: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    #[error("reading {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: {error}")]
    Toml { path: String, error: toml::de::Error },
    #[error("{0}")]
    Invalid(String),
}

impl Drill {
    pub fn load(path: &std::path::Path) -> Result<Drill, DrillError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| DrillError::Io { path: path.display().to_string(), error })?;
        let drill: Drill =
            toml::from_str(&text).map_err(|error| DrillError::Toml { path: path.display().to_string(), error })?;
        drill.schedule()?;
        Ok(drill)
    }

    /// Every fault occurrence in start order, after checking the drill makes sense.
    pub fn schedule(&self) -> Result<Vec<ScheduledFault>, DrillError> {
        let bad = |m: String| Err(DrillError::Invalid(format!("drill {}: {m}", self.name)));
        let c = &self.cluster;
        if c.controllers != 3 && c.controllers != 5 {
            return bad(format!("cluster.controllers is {}; Drover runs 3 or 5 replicas", c.controllers));
        }
        if c.agents == 0 || c.agents > 16 || c.gpus_per_agent == 0 || c.gpus_per_agent > 64 {
            return bad("cluster.agents must be 1-16 and cluster.gpus_per_agent 1-64".into());
        }
        if c.agent_fence_after_ms + 500 > c.node_timeout_ms {
            return bad(format!(
                "cluster.agent_fence_after_ms ({}) must be at least 500 ms below node_timeout_ms ({}): an agent \
                 must fence itself before its jobs may run elsewhere (the controllers refuse it otherwise)",
                c.agent_fence_after_ms, c.node_timeout_ms
            ));
        }
        let w = &self.workload;
        if w.duration_s == 0 || w.duration_s > MAX_DURATION_S {
            return bad(format!("workload.duration_s must be 1-{MAX_DURATION_S}"));
        }
        if w.submit_per_s == 0 || w.submit_per_s > MAX_SUBMIT_PER_S {
            return bad(format!("workload.submit_per_s must be 1-{MAX_SUBMIT_PER_S}"));
        }
        if w.clients == 0 || w.clients > 64 || w.steps == 0 || w.step_ms == 0 || w.checkpoint_every == 0 {
            return bad("workload.clients must be 1-64, and steps, step_ms, checkpoint_every above 0".into());
        }
        if w.gpus.is_empty() || w.gpus.iter().any(|&g| g == 0 || g > c.gpus_per_agent) {
            return bad(format!("workload.gpus must list job sizes of 1-{} GPUs (one node's)", c.gpus_per_agent));
        }
        let mut out = Vec::new();
        for (index, f) in self.faults.iter().enumerate() {
            let line = format!("fault {} ({:?})", index + 1, f.kind);
            let target = parse_target(&f.target).map_err(|m| DrillError::Invalid(format!("{line}: {m}")))?;
            let wants_cluster = matches!(f.kind, FaultKind::Loss | FaultKind::Delay) || f.kind.is_operation();
            if wants_cluster != (target == TargetSpec::Cluster) && f.kind != FaultKind::Membership {
                return bad(format!(
                    "{line}: target {:?} does not fit; loss, delay, rolling_restart, upgrade, rollback and finalize \
                     take `cluster`, the rest a process",
                    f.target
                ));
            }
            let replica_only = matches!(
                f.kind,
                FaultKind::Partition | FaultKind::OneWay | FaultKind::DiskFull | FaultKind::Membership
            );
            if replica_only && matches!(target, TargetSpec::AnyAgent | TargetSpec::Agent(_)) {
                return bad(format!("{line}: only replicas can be partitioned, cut one way, fill a disk or join"));
            }
            if f.kind == FaultKind::Membership && c.controllers != 3 {
                return bad(format!(
                    "{line}: membership grows 3 replicas to 5 and back; the cluster has {}",
                    c.controllers
                ));
            }
            if !(f.at_s >= 0.0 && f.duration_s >= 0.0 && f.at_s.is_finite() && f.duration_s.is_finite()) {
                return bad(format!("{line}: at_s and duration_s must be non-negative numbers"));
            }
            if f.duration_s == 0.0 && !f.kind.is_operation() {
                return bad(format!("{line}: duration_s must be above 0 (how long until it heals)"));
            }
            let (loss, delay) = (f.loss_percent.unwrap_or(0), f.delay_ms.unwrap_or(0));
            if f.kind == FaultKind::Loss && !(1..=100).contains(&loss) {
                return bad(format!("{line}: loss_percent must be 1-100"));
            }
            if f.kind == FaultKind::Delay && !(1..=10_000).contains(&delay) {
                return bad(format!("{line}: delay_ms must be 1-10000"));
            }
            if f.count == 0 || (f.count > 1 && f.every_s.is_none_or(|e| e.is_nan() || e <= f.duration_s)) {
                return bad(format!("{line}: a repeated fault needs every_s longer than its duration_s"));
            }
            for n in 0..f.count {
                let at_s = f.at_s + f.every_s.unwrap_or(0.0) * n as f64;
                let at_ms = (at_s * 1e3) as u64;
                out.push(ScheduledFault {
                    at_ms,
                    heal_ms: at_ms + (f.duration_s * 1e3) as u64,
                    kind: f.kind,
                    target: target.clone(),
                    loss_percent: loss,
                    delay_ms: delay,
                    jitter_ms: f.jitter_ms.unwrap_or(0),
                });
            }
            if out.len() > MAX_FAULTS {
                return bad(format!("more than {MAX_FAULTS} fault occurrences"));
            }
        }
        if let Some(last) = out.iter().map(|f| f.heal_ms).max()
            && last > MAX_DURATION_S * 1000
        {
            return bad(format!("a fault heals after {MAX_DURATION_S} s"));
        }
        out.sort_by_key(|f| f.at_ms);
        Ok(out)
    }
}

fn parse_target(text: &str) -> anyhow::Result<TargetSpec> {
    Ok(match text {
        "leader" => TargetSpec::Leader,
        "follower" => TargetSpec::Follower,
        "agent" => TargetSpec::AnyAgent,
        "cluster" => TargetSpec::Cluster,
        _ => match text.split_once(':') {
            Some(("controller", id)) => TargetSpec::Controller(
                id.parse().map_err(|_| anyhow::anyhow!("`{text}`: controller:N takes a replica id"))?,
            ),
            Some(("agent", name)) if !name.is_empty() => TargetSpec::Agent(name.to_string()),
            _ => {
                anyhow::bail!("unknown target `{text}` (leader, follower, controller:N, agent, agent:NAME, cluster)");
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEADER_KILL: &str = r#"
        name = "leader-kill"
        [workload]
        duration_s = 30
        submit_per_s = 10
        [[fault]]
        kind = "kill"
        target = "leader"
        at_s = 5
        duration_s = 2
        every_s = 10
        count = 3
    "#;

    #[test]
    fn a_repeated_fault_becomes_one_occurrence_per_period() {
        let drill: Drill = toml::from_str(LEADER_KILL).unwrap();
        let schedule = drill.schedule().unwrap();
        let times: Vec<(u64, u64)> = schedule.iter().map(|f| (f.at_ms, f.heal_ms)).collect();
        assert_eq!(times, vec![(5_000, 7_000), (15_000, 17_000), (25_000, 27_000)]);
        assert!(schedule.iter().all(|f| f.target == TargetSpec::Leader && f.kind == FaultKind::Kill));
        assert_eq!(drill.cluster, ClusterShape::default());
    }

    #[test]
    fn drills_that_cannot_mean_anything_are_refused_with_the_reason() {
        let cases = [
            (LEADER_KILL.replace("every_s = 10", "every_s = 1"), "every_s longer than its duration_s"),
            (LEADER_KILL.replace("\"leader\"", "\"boss\""), "unknown target `boss`"),
            (LEADER_KILL.replace("\"kill\"", "\"loss\""), "does not fit"),
            (LEADER_KILL.replace("duration_s = 2", "duration_s = 0"), "duration_s must be above 0"),
            (format!("{LEADER_KILL}\n[cluster]\ncontrollers = 4\n"), "Drover runs 3 or 5 replicas"),
            (
                format!("{LEADER_KILL}\n[cluster]\nagent_fence_after_ms = 9000\nnode_timeout_ms = 8000\n"),
                "at least 500 ms below node_timeout_ms",
            ),
            (LEADER_KILL.replace("submit_per_s = 10", "submit_per_s = 10\ngpus = [32]"), "1-16 GPUs"),
        ];
        for (text, want) in cases {
            let drill: Drill = toml::from_str(&text).unwrap();
            let err = drill.schedule().unwrap_err().to_string();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        let typo = LEADER_KILL.replace("at_s", "when");
        assert!(toml::from_str::<Drill>(&typo).is_err(), "unknown keys are refused, not ignored");
    }

    #[test]
    fn every_shipped_drill_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("drills");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Drill::load(&path).unwrap_or_else(|e| panic!("{e}"));
                seen += 1;
            }
        }
        assert!(seen >= 12, "only {seen} drills in {}", dir.display());
    }
}

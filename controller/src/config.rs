//! The controller's TOML configuration.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use drover_state::ClusterConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// This replica's id; unique and stable for the life of its data directory.
    pub id: u64,
    /// Where the gRPC server listens (clients, agents and peers share it).
    pub listen: String,
    /// Where `/metrics` and the read-only web page are served over plain HTTP (`IP:port`); off when unset.
    /// Nothing there asks for credentials: bind it to a management network or loopback.
    #[serde(default)]
    pub http_listen: Option<String>,
    /// The address others use to reach this replica; defaults to `listen`.
    #[serde(default)]
    pub advertise: Option<String>,
    pub data_dir: PathBuf,
    /// The replica's async worker threads; default one per core. Replicas that share a host (`drover local up`
    /// runs three on one machine) should split its cores between them: three replicas with a worker per core each
    /// keep waking threads that only contend for the same cores (on two cores, 64 clients committed 9,024-9,213
    /// submissions/s with two workers each, 9,524-9,678/s with one).
    #[serde(default)]
    pub worker_threads: Option<usize>,
    /// The founding members. The lowest id among them initializes a brand-new cluster once every founder is
    /// reachable and none holds data. A replica not listed here waits to be added (`drover cluster add-replica`).
    #[serde(default)]
    pub initial_members: BTreeMap<u64, String>,
    #[serde(default)]
    pub raft: RaftTuning,
    #[serde(default)]
    pub agents: AgentTiming,
    /// The cluster configuration the first leader commits (partitions, limits).
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// The cluster key and this replica's TLS certificate (required: every port is mutual TLS).
    pub security: crate::security::SecurityConfig,
}

/// Raft timing and log-size knobs, with defaults sized for sub-second failover on a LAN.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftTuning {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many entries since the last one (then purge the log behind it).
    pub snapshot_after_entries: u64,
    /// Entries kept behind a snapshot, so that a briefly lagging follower catches up from the log.
    pub keep_entries_after_snapshot: u64,
    /// Replicas that should lead when they can (e.g. those at the site most clients and agents are at), in order
    /// of preference. A leader not listed hands leadership to the first listed voter that has its whole log,
    /// after leading for `preferred_leader_hold_ms`. Empty: any replica leads. Give every replica the same list.
    pub preferred_leaders: Vec<u64>,
    /// How long a leader leads before handing over to a preferred replica: after a failover, a restarted
    /// preferred replica gets the leadership back only once it has shown it stays up, and two replicas whose
    /// lists disagree cannot trade it faster than this.
    pub preferred_leader_hold_ms: u64,
    /// After a leader's crash, survivors campaign in id order this far apart (`leader_watch`): long enough for one
    /// Pre-Vote and vote round to settle before the next survivor tries. A LAN needs a few ms; across sites make
    /// it at least two inter-site RTTs, or campaigns overlap and split the vote.
    pub campaign_stagger_ms: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            // openraft's leader lease equals election_timeout_max: after a crash, `leader_watch` campaigns right
            // at the lease's end, so failover is about one election_timeout_max plus a round (p99 446 ms with
            // these, BENCHMARKS.md). A silent but live leader still costs about two timeouts. 50 ms heartbeats
            // give six chances per lease; no false elections at 64 clients on the 2-core test machine.
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 200,
            election_timeout_max_ms: 300,
            snapshot_after_entries: 20_000,
            keep_entries_after_snapshot: 2_000,
            preferred_leaders: Vec::new(),
            preferred_leader_hold_ms: 3_000,
            campaign_stagger_ms: 25,
        }
    }
}

/// How the leader judges agents. The invariant: a node's lease (renewed by heartbeats that a leader backed by a
/// quorum answers) lasts `fence_after_ms`; when it runs out, the node's tasks are killed (by the agent, and by
/// each task's supervisor if the agent itself is dead or hung), and only later, `node_timeout_ms` after the leader
/// last heard the node, is the node declared down and its jobs requeued. So two incarnations of a job never run
/// at once. See DESIGN's outage policy for the trade-off these numbers make.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentTiming {
    pub heartbeat_ms: u64,
    /// Silence after which the leader commits `NodeDown` (Slurm's `SlurmdTimeout`). A new leader first waits
    /// this long for every node to reconnect.
    pub node_timeout_ms: u64,
    /// A node's lease: its tasks are killed when no leader backed by a quorum renewed it for this long. Also the
    /// longest full controller outage jobs survive (they are requeued from their checkpoints after a longer one).
    pub fence_after_ms: u64,
    /// Between SIGTERM and SIGKILL when a job is cancelled or times out (Slurm's `KillWait`).
    pub kill_wait_ms: u64,
    /// Optional: a command that powers a silent node off (e.g. `ipmitool -H {host}-bmc ... power off`); `{node}`
    /// and `{host}` are substituted. Once it exits 0 the node is declared down at once, without waiting for
    /// `node_timeout_ms`. Split into words as a shell would (quotes group), but run without a shell.
    pub fence_command: Option<String>,
    /// Silence after which the fence command is run.
    pub suspect_after_ms: u64,
    pub fence_command_timeout_ms: u64,
}

impl Default for AgentTiming {
    fn default() -> Self {
        AgentTiming {
            heartbeat_ms: 1_000,
            node_timeout_ms: 8_000,
            fence_after_ms: 5_000,
            kill_wait_ms: 10_000,
            fence_command: None,
            suspect_after_ms: 2_500,
            fence_command_timeout_ms: 30_000,
        }
    }
}

/// The fence command's argv for one node: `template` split into words (shell quoting, no expansion), then `{node}`
/// and `{host}` substituted inside each word.
pub fn fence_argv(template: &str, node: &str, host: &str) -> Result<Vec<String>, FenceCommandError> {
    let words = shlex::split(template).ok_or_else(|| FenceCommandError::UnclosedQuote(template.to_string()))?;
    if words.is_empty() {
        return Err(FenceCommandError::Empty);
    }
    Ok(words.into_iter().map(|w| w.replace("{node}", node).replace("{host}", host)).collect())
}

/// A Raft group has 3 to 7 voters; more preferences than that are a mistake.
pub const MAX_PREFERRED_LEADERS: usize = 7;

/// How much longer than a lease the leader waits before declaring a silent node down: time for the supervisors
/// to notice the lease ran out and for SIGKILL to land, plus clock-rate drift.
pub const FENCE_MARGIN_MS: u64 = 500;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("config file {path} is invalid: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("config file {path} is invalid: {problem}")]
    Setting { path: PathBuf, problem: InvalidSetting },
}

/// A fence command template that cannot be split into words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceCommandError {
    #[error("{0:?} has an unclosed quote")]
    UnclosedQuote(String),
    #[error("the command is empty")]
    Empty,
}

/// A configuration that parses but cannot work; each names the field to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSetting {
    #[error("{field} = {value:?} is not an IP:port address")]
    NotAnAddress { field: &'static str, value: String },
    #[error("initial_members names replica {id} at {listed}, but this replica advertises {advertised}")]
    AdvertiseMismatch { id: u64, listed: String, advertised: String },
    #[error("worker_threads must be at least 1 (leave it out for one per core)")]
    NoWorkers,
    #[error("raft.election_timeout_min_ms must exceed twice raft.heartbeat_interval_ms")]
    ElectionTimeoutTooShort,
    #[error("raft.election_timeout_max_ms must exceed raft.election_timeout_min_ms")]
    ElectionWindowEmpty,
    #[error("raft.preferred_leader_hold_ms must be at least raft.election_timeout_max_ms")]
    PreferredLeaderHoldTooShort,
    #[error("raft.preferred_leaders lists more than {MAX_PREFERRED_LEADERS} replicas")]
    TooManyPreferredLeaders,
    #[error(
        "agents: need heartbeat_ms > 0, fence_after_ms > 2 x heartbeat_ms, and node_timeout_ms >= fence_after_ms + \
         {FENCE_MARGIN_MS} (a node's tasks must be dead before its jobs are requeued)"
    )]
    LeaseTimings,
    #[error("agents: fence_command: {0}")]
    FenceCommand(FenceCommandError),
    #[error("agents: with a fence_command, need suspect_after_ms > 2 x heartbeat_ms and fence_command_timeout_ms > 0")]
    FenceTimings,
}

impl ControllerConfig {
    pub fn load(path: &Path) -> Result<ControllerConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.to_path_buf(), message: e.to_string() })?;
        let config: ControllerConfig = toml::from_str(&text)
            .map_err(|e| ConfigError::Invalid { path: path.to_path_buf(), message: e.to_string() })?;
        config.validate().map_err(|problem| ConfigError::Setting { path: path.to_path_buf(), problem })?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let address = |field: &'static str, value: &str| match value.parse::<std::net::SocketAddr>() {
            Ok(_) => Ok(()),
            Err(_) => Err(InvalidSetting::NotAnAddress { field, value: value.to_string() }),
        };
        address("listen", &self.listen)?;
        if let Some(http) = &self.http_listen {
            address("http_listen", http)?;
        }
        if let Some(addr) = self.initial_members.get(&self.id)
            && *addr != self.advertise_addr()
        {
            return Err(InvalidSetting::AdvertiseMismatch {
                id: self.id,
                listed: addr.clone(),
                advertised: self.advertise_addr(),
            });
        }
        if self.worker_threads == Some(0) {
            return Err(InvalidSetting::NoWorkers);
        }
        let r = &self.raft;
        if r.heartbeat_interval_ms == 0 || r.election_timeout_min_ms <= r.heartbeat_interval_ms * 2 {
            return Err(InvalidSetting::ElectionTimeoutTooShort);
        }
        if r.election_timeout_max_ms <= r.election_timeout_min_ms {
            return Err(InvalidSetting::ElectionWindowEmpty);
        }
        if !r.preferred_leaders.is_empty() && r.preferred_leader_hold_ms < r.election_timeout_max_ms {
            return Err(InvalidSetting::PreferredLeaderHoldTooShort);
        }
        if r.preferred_leaders.len() > MAX_PREFERRED_LEADERS {
            return Err(InvalidSetting::TooManyPreferredLeaders);
        }
        let a = &self.agents;
        if a.heartbeat_ms == 0
            || a.fence_after_ms <= a.heartbeat_ms * 2
            || a.node_timeout_ms < a.fence_after_ms + FENCE_MARGIN_MS
        {
            return Err(InvalidSetting::LeaseTimings);
        }
        if let Some(template) = &a.fence_command {
            fence_argv(template, "node", "host").map_err(InvalidSetting::FenceCommand)?;
        }
        if a.fence_command.is_some() && (a.suspect_after_ms <= a.heartbeat_ms * 2 || a.fence_command_timeout_ms == 0) {
            return Err(InvalidSetting::FenceTimings);
        }
        Ok(())
    }

    pub fn advertise_addr(&self) -> String {
        self.advertise.clone().unwrap_or_else(|| self.listen.clone())
    }

    pub fn openraft_config(&self) -> Result<openraft::Config, openraft::ConfigError> {
        let r = &self.raft;
        let config = openraft::Config {
            cluster_name: self.cluster.cluster_name.clone(),
            heartbeat_interval: r.heartbeat_interval_ms,
            election_timeout_min: r.election_timeout_min_ms,
            election_timeout_max: r.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(r.snapshot_after_entries),
            max_in_snapshot_log_to_keep: r.keep_entries_after_snapshot,
            // Snapshot transfer of a large state must not time out on a slow link.
            install_snapshot_timeout: 60_000,
            ..Default::default()
        };
        config.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's host is substituted inside one word of the fence command, never read by a shell: even a host that
    /// slipped past registration's check stays one argument to the command the operator configured.
    #[test]
    fn the_fence_command_runs_without_a_shell_and_a_host_stays_one_argument() {
        let argv =
            fence_argv("ipmitool -H '{host}-bmc' -U admin chassis power off # {node}", "gpu01", "x; reboot").unwrap();
        assert_eq!(argv, ["ipmitool", "-H", "x; reboot-bmc", "-U", "admin", "chassis", "power", "off"]);
        let argv = fence_argv("/usr/bin/fence --node {node} --host={host}", "gpu01", "$(id)").unwrap();
        assert_eq!(argv, ["/usr/bin/fence", "--node", "gpu01", "--host=$(id)"]);
        assert!(fence_argv("fence 'unclosed", "n", "h").unwrap_err().to_string().contains("unclosed quote"));
        assert_eq!(fence_argv("   ", "n", "h").unwrap_err(), FenceCommandError::Empty);
    }

    /// The example shipped in deploy/ must stay a valid configuration, every documented field included.
    #[test]
    fn the_deployed_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/controller-1.toml");
        let config = ControllerConfig::load(&path).unwrap();
        let debug = config.cluster.partition("debug").unwrap();
        assert_eq!((debug.priority_tier, debug.max_gpus_per_job), (1, Some(8)));
        assert_eq!(config.cluster.scheduler.reservation_depth, 100);
        assert_eq!(config.cluster.fairshare_half_life_s, 7 * 24 * 3600);
        assert_eq!(config.worker_threads, None, "one worker per core unless the operator says otherwise");
    }

    /// A runtime without workers would never run anything: refused when the file is read, naming the field.
    #[test]
    fn zero_worker_threads_is_refused_with_the_fields_name() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/controller-1.toml");
        let mut config = ControllerConfig::load(&path).unwrap();
        config.worker_threads = Some(0);
        let err = config.validate().unwrap_err();
        assert_eq!(err, InvalidSetting::NoWorkers);
        assert!(err.to_string().contains("worker_threads"), "{err}");
        config.worker_threads = Some(1);
        config.validate().unwrap();
    }
}

//! The agent's configuration: a TOML file, or the same settings as flags (flags win).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The node's name (unique in the cluster; what hostlists hold). Defaults to the host name.
    #[serde(default)]
    pub name: String,
    /// Controller addresses (`host:port`); the agent finds the leader among them.
    pub controllers: Vec<String>,
    /// Where the agent's own gRPC server (for `srun`) listens.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The address other nodes and `srun` reach this agent at; defaults to `listen` (with the host below when
    /// listening on all interfaces).
    #[serde(default)]
    pub advertise: Option<String>,
    /// The host jobs use as `MASTER_ADDR` when this node is their first; defaults to the listen IP.
    #[serde(default)]
    pub host: Option<String>,
    /// Task directories (launch files, results) live here; they outlive an agent restart.
    pub state_dir: PathBuf,
    /// CPUs and memory offered to jobs; default: what the machine has.
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub partitions: Vec<String>,
    #[serde(default)]
    pub features: Vec<String>,
    /// Topology labels, e.g. `{ site = "a", rack = "r12", switch = "s3" }`.
    #[serde(default)]
    pub topology: BTreeMap<String, String>,
    #[serde(default)]
    pub gpus: GpuConfig,
    /// Between SIGTERM and SIGKILL when a job is cancelled or times out (Slurm's `KillWait`), until a leader
    /// sends the cluster's value.
    #[serde(default = "default_kill_wait_ms")]
    pub kill_wait_ms: u64,
    /// Overrides of the built-in XID table (`XID ACTION` per line; see `crate::xid`).
    #[serde(default)]
    pub xid_actions: Option<PathBuf>,
    /// Resets one GPU drained for a reset once no task uses it, `{gpu}` standing for its index (split on
    /// whitespace, no shell), e.g. `nvidia-smi --gpu-reset -i {gpu}`. Unset: such GPUs stay drained until an
    /// operator returns them (`drover node gpus resume`).
    #[serde(default)]
    pub gpu_reset_command: Option<String>,
    /// Slurm's RebootProgram: run (split on whitespace, no shell) for `scontrol reboot` once the node is empty,
    /// e.g. `/usr/sbin/reboot`. Unset: a requested reboot waits, and the agent logs why.
    #[serde(default)]
    pub reboot_program: Option<String>,
    /// The cluster key (to verify `srun` users' credentials) and this agent's certificate, whose role must be
    /// `agent/<name>`. Required: the agent speaks mutual TLS only.
    #[serde(default)]
    pub security: Option<drover_auth::SecurityConfig>,
    /// The client configuration jobs on this node use (`DROVER_CONFIG` in their environment); unset: the CLI's
    /// default, /etc/drover/client.toml.
    #[serde(default)]
    pub client_config: Option<PathBuf>,
    /// Confine each job's tasks to the memory it was given (`--mem`...), with a cgroup per job under
    /// `memory_cgroup` (a path relative to the cgroup mount). Needs root; without it memory is scheduled but not
    /// enforced, and the agent logs why.
    #[serde(default = "default_enforce_memory")]
    pub enforce_memory: bool,
    #[serde(default = "default_memory_cgroup")]
    pub memory_cgroup: String,
    /// Pin each job's tasks to as many of the node's CPUs as the job holds here (a cpuset in the job's cgroup),
    /// where the host has the cpuset controller and memory is enforced. Off: tasks run on any CPU.
    #[serde(default = "default_true")]
    pub confine_cpus: bool,
    /// Where `/metrics` is served over plain HTTP (`IP:port`); off when unset. It shows GPU load and health, not
    /// jobs' data, but asks for no credentials: keep it on a management network.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Register as a hot spare: only jobs restarting after a node failure start here (see `scontrol update
    /// nodename=X spare=yes|no`, which overrides this until the setting here changes).
    #[serde(default)]
    pub spare: bool,
    /// Containers (`--container-image`): where images are cached, how large the cache may grow, and more.
    #[serde(default)]
    pub containers: ContainerConfig,
    /// Slurm's `HealthCheckProgram` (e.g. LBNL NHC's `/usr/sbin/nhc`): run as the agent's user with no arguments
    /// and `SLURMD_NODENAME`/`DROVER_NODE` set; a non-zero exit, a signal, a timeout or a failure to start marks
    /// the node unhealthy with the last line it printed as the reason (see `crate::health_check`). Must be an
    /// absolute path: the program runs with a minimal environment and `/` as its working directory. Unset: none.
    #[serde(default)]
    pub health_check_program: Option<PathBuf>,
    /// Seconds between runs (Slurm's `HealthCheckInterval`); 0: no periodic runs (only the one at start, if
    /// `health_check_on_start`). Slurm's default is 0; 300 here is what NHC deployments commonly set, and a
    /// program has to be configured before anything runs at all.
    #[serde(default = "default_health_check_interval_s")]
    pub health_check_interval_s: u64,
    /// The program's whole process group is killed (SIGKILL) after this many seconds and the node reported
    /// unhealthy. Slurm's slurmd uses a fixed 60 s; here it is a setting with that default. Must be at least 1.
    #[serde(default = "default_health_check_timeout_s")]
    pub health_check_timeout_s: u64,
    /// Run the program once at agent start, before registering (as slurmd does), so a node that fails it
    /// registers with the failure as a problem instead of taking jobs first.
    #[serde(default = "default_true")]
    pub health_check_on_start: bool,
}

/// `health_check_interval_s` when unset.
pub const DEFAULT_HEALTH_CHECK_INTERVAL_S: u64 = 300;
/// `health_check_timeout_s` when unset: slurmd's fixed limit.
pub const DEFAULT_HEALTH_CHECK_TIMEOUT_S: u64 = 60;

fn default_health_check_interval_s() -> u64 {
    DEFAULT_HEALTH_CHECK_INTERVAL_S
}

fn default_health_check_timeout_s() -> u64 {
    DEFAULT_HEALTH_CHECK_TIMEOUT_S
}

/// The node's container settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerConfig {
    /// The image store (unpacked images by digest); default `<state_dir>/images`. Put it on a local disk.
    #[serde(default)]
    pub image_store: Option<PathBuf>,
    /// Least recently used images are removed once the store is larger than this (images in use never are).
    #[serde(default = "default_image_store_limit_mb")]
    pub image_store_limit_mb: u64,
    /// Registries spoken to over plain HTTP (`host:port`); loopback ones always may be.
    #[serde(default)]
    pub insecure_registries: Vec<String>,
    /// Size of each container's `/dev/shm`; default half the node's memory (NCCL passes data through it; what is
    /// written there counts against the job's memory).
    #[serde(default)]
    pub shm_mb: Option<u64>,
    /// The CDI spec that says what a container needs for each GPU (`nvidia-ctk cdi generate`); default NVIDIA's
    /// usual places (`/etc/cdi/nvidia.yaml`, `/var/run/cdi/nvidia.yaml`), or a spec of stand-ins on a simulated
    /// node.
    #[serde(default)]
    pub cdi_spec: Option<PathBuf>,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        ContainerConfig {
            image_store: None,
            image_store_limit_mb: default_image_store_limit_mb(),
            insecure_registries: Vec::new(),
            shm_mb: None,
            cdi_spec: None,
        }
    }
}

fn default_image_store_limit_mb() -> u64 {
    200 * 1024
}

fn default_enforce_memory() -> bool {
    true
}

fn default_true() -> bool {
    true
}

fn default_memory_cgroup() -> String {
    crate::cgroup::DEFAULT_SUBDIR.to_string()
}

fn default_kill_wait_ms() -> u64 {
    10_000
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Simulate this many GPUs instead of asking NVML (tests, `drover local up`).
    #[serde(default)]
    pub simulate: Option<u32>,
    /// How many GPUs the node should have (checked against NVML; used when there is no driver).
    #[serde(default)]
    pub count: Option<u32>,
    /// Model name the GPUs should contain (e.g. `H200`); also the `--gres=gpu:TYPE:N` type, lower-cased.
    #[serde(default)]
    pub model: Option<String>,
    /// Simulated backend only: a file of injected faults (`3 xid 79`), re-read on every health poll.
    #[serde(default)]
    pub fault_file: Option<PathBuf>,
}

fn default_listen() -> String {
    "0.0.0.0:6818".to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read agent config {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("agent config {path} is invalid: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("invalid agent setting: {0}")]
    Setting(String),
}

impl AgentConfig {
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.to_path_buf(), message: e.to_string() })?;
        toml::from_str(&text).map_err(|e| ConfigError::Invalid { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Fills defaults from the machine and checks the result.
    pub fn finish(mut self) -> Result<AgentConfig, ConfigError> {
        if self.name.is_empty() {
            self.name = hostname();
        }
        self.check_health_check()?;
        if self.controllers.is_empty() {
            return Err(ConfigError::Setting("no controllers given (controllers = [\"host:port\", ...])".into()));
        }
        if self.security.is_none() {
            return Err(ConfigError::Setting(
                "no [security] section: the agent needs the cluster key and its TLS certificate (key_file, ca, cert, key; see deploy/config/agent.toml)".into(),
            ));
        }
        let listen: std::net::SocketAddr = self
            .listen
            .parse()
            .map_err(|_| ConfigError::Setting(format!("listen = {:?} is not an IP:port address", self.listen)))?;
        if self.host.is_none() {
            self.host = Some(if listen.ip().is_unspecified() { hostname() } else { listen.ip().to_string() });
        }
        // The controllers refuse anything else at registration: say so here, where the operator can fix it.
        if let Some(host) = &self.host {
            drover_state::check_host(host).map_err(|e| ConfigError::Setting(format!("host: {e}")))?;
        }
        if self.cpus.is_none() {
            self.cpus = Some(std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1));
        }
        if self.memory_mb.is_none() {
            self.memory_mb = Some(machine_memory_mb());
        }
        Ok(self)
    }

    /// The health check settings `finish` refuses: a relative program path (it would resolve against whatever
    /// directory the agent was started in, and the program runs with a minimal `PATH`), or a zero timeout.
    pub fn check_health_check(&self) -> Result<(), ConfigError> {
        if let Some(program) = &self.health_check_program
            && !program.is_absolute()
        {
            return Err(ConfigError::Setting(format!(
                "health_check_program = {:?} is not an absolute path (e.g. \"/usr/sbin/nhc\")",
                program.display().to_string()
            )));
        }
        if self.health_check_program.is_some() && self.health_check_timeout_s == 0 {
            return Err(ConfigError::Setting("health_check_timeout_s must be at least 1".into()));
        }
        Ok(())
    }

    pub fn host(&self) -> String {
        self.host.clone().unwrap_or_else(hostname)
    }

    /// The address `srun` dials: `advertise`, else `listen` with the host substituted for a wildcard IP.
    pub fn advertise_addr(&self, bound: std::net::SocketAddr) -> String {
        if let Some(a) = &self.advertise {
            return a.clone();
        }
        if bound.ip().is_unspecified() { format!("{}:{}", self.host(), bound.port()) } else { bound.to_string() }
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn machine_memory_mb() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

//! GPU nodes as the replicated state knows them: the inventory an agent registered, and what is allocated on it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::job::JobId;

/// One GPU as NVML (or the simulated backend) reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GpuInfo {
    /// NVML's index; what `CUDA_VISIBLE_DEVICES` and `SLURM_JOB_GPUS` name.
    pub index: u32,
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: String,
    pub memory_mb: u64,
    pub pci_bus_id: String,
}

/// What an agent registers: everything the allocator and the scheduler need to know about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NodeInfo {
    /// The node's name (`gpu01`): unique in the cluster, what hostlists and `SLURM_JOB_NODELIST` hold.
    pub name: String,
    /// The agent's gRPC address (`srun` launches steps there) ...
    pub agent_addr: String,
    /// ... and the host every other node can reach it by (`MASTER_ADDR` of jobs whose first node this is).
    pub host: String,
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: Vec<GpuInfo>,
    /// The GPU type jobs name in `--gres=gpu:TYPE:N` (e.g. `h200`); empty for untyped.
    pub gpu_type: String,
    /// Partitions this node belongs to (in addition to partitions whose hostlist names it).
    pub partitions: Vec<String>,
    /// `--constraint` features.
    pub features: Vec<String>,
    /// Topology labels (`site`, `rack`, `switch`) for placement.
    pub topology: BTreeMap<String, String>,
    /// The agent's version, for `sinfo`/`scontrol show node`.
    pub version: String,
    /// The agent's `spare = true`: the node registers as a hot spare (see [`Node::spare`]).
    #[serde(default)]
    pub spare: bool,
}

/// The longest host name DNS allows.
const MAX_HOST_LEN: usize = 253;

/// A node's host that is neither an IP address nor a DNS host name (its first 80 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "host {shown:?} is neither an IP address nor a DNS host name (letters, digits, '-' and '.', at most \
     {MAX_HOST_LEN} characters)"
)]
pub struct BadHost {
    pub shown: String,
}

/// Whether `host` is an IP address or a DNS host name (RFC 1123 labels: letters, digits, `-`, not at either end,
/// 1-63 characters each). A node's host goes into `MASTER_ADDR` and the operators' fence command: anything else (a
/// space, `;`, `$(...)`) is refused at registration, not carried into them.
pub fn check_host(host: &str) -> Result<(), BadHost> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || host.len() > MAX_HOST_LEN || !name.split('.').all(label_ok) {
        return Err(BadHost { shown: host.chars().take(80).collect() });
    }
    Ok(())
}

/// Slurm's base node states; `DRAIN` is a flag on top of them (`drain` below), as in Slurm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeHealth {
    /// Registered and heartbeating (as far as the last committed transition says).
    Up,
    /// Declared down by the leader (missed heartbeats) or by an administrator.
    Down,
}

/// One GPU node in the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub info: NodeInfo,
    pub health: NodeHealth,
    /// Set by `scontrol update nodename=X state=drain reason=...` or a failed health check: no new jobs.
    pub drain: bool,
    /// Why the node is down or drained (Slurm's `Reason=`).
    pub reason: String,
    /// When the current state began (leader's stamp).
    pub since_ms: u64,
    /// GPUs held by jobs, by index.
    pub allocated_gpus: BTreeMap<u32, JobId>,
    /// CPUs held by jobs.
    pub allocated_cpus: u32,
    /// Memory held by jobs, in MiB.
    #[serde(default)]
    pub allocated_mem_mb: u64,
    /// Jobs with an allocation on this node.
    pub jobs: BTreeSet<JobId>,
    /// GPUs and CPUs of ended incarnations whose tasks here may still be dying (a multi-node job that lost
    /// another node, was requeued or ended on its first node): held until this node's agent confirms them gone,
    /// or the node is declared down (its lease has then expired), so no new job gets a GPU still in use.
    #[serde(default)]
    pub lingering: Vec<Lingering>,
    /// A hot spare: ordinary placement never uses it; a job restarting after a node failure may
    /// ([`crate::Job::may_use_spares`]), and the node then leaves the pool, becoming a normal node. Set from the
    /// agent's config when the node first registers (or that setting changes), and by
    /// `scontrol update nodename=X spare=yes|no`.
    #[serde(default)]
    pub spare: bool,
    /// The registration epoch: 1 when the node first registers, one more each time a registration brings it back
    /// from DOWN. Leases and assignments name it, and a `NodeDown` decided for an earlier epoch is dropped, so a
    /// node-loss decision about one registration can never take down the next one (see `RegisterNode`).
    #[serde(default)]
    pub epoch: u64,
    /// What the node's container image store holds, as its agent last reported it (`scontrol show node`).
    #[serde(default)]
    pub image_store: Option<ImageStoreSummary>,
    /// GPUs out of service one by one (an XID whose remedy is a GPU reset, or an operator): jobs get the node's
    /// other GPUs meanwhile. By index.
    #[serde(default)]
    pub drained_gpus: BTreeMap<u32, GpuDrain>,
    /// Failures charged to this node (oldest first, at most [`MAX_NODE_FAILURES`]): the evidence for quarantine.
    #[serde(default)]
    pub failures: Vec<NodeFailure>,
    /// `scontrol reboot`: the node takes no new job until its agent has run the reboot program and come back.
    #[serde(default)]
    pub reboot: Option<RebootOrder>,
}

/// A reboot an operator asked for (`scontrol reboot [ASAP] [nextstate=RESUME|DOWN] [reason=...] NODES`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebootOrder {
    /// Names this order (the leader's stamp when it was given): the agent reports this reboot done, not another.
    pub id: u64,
    /// `ASAP`: the node is drained meanwhile (`Reboot ASAP` in `sinfo -R`).
    pub asap: bool,
    pub next_state: Option<NextState>,
    pub reason: String,
    pub by_uid: u32,
}

/// The state a rebooted node returns in (`nextstate=`); unset: as it was before, less the reboot's own drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NextState {
    Resume,
    Down,
}

/// How many failures a node keeps on record.
pub const MAX_NODE_FAILURES: usize = 16;

/// What NVIDIA's XID catalog prescribes for an error, as the agent's XID table says (operators may override it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum XidAction {
    /// Informational: logged, nothing else.
    Ignore,
    /// The application hit it (or caused it): its job is requeued; the GPU and the node stay in service.
    RestartApp,
    /// The GPU needs a reset: drained alone, reset once idle, then returned.
    ResetGpu,
    /// The node needs a reboot: drained, rebooted once empty.
    RebootNode,
    /// The GPU needs replacing: the node is drained and stays drained until an operator resumes it.
    Hardware,
}

impl XidAction {
    pub fn name(self) -> &'static str {
        match self {
            XidAction::Ignore => "ignore",
            XidAction::RestartApp => "restart_app",
            XidAction::ResetGpu => "reset_gpu",
            XidAction::RebootNode => "reboot_node",
            XidAction::Hardware => "hardware",
        }
    }

    pub fn parse(text: &str) -> Option<XidAction> {
        [XidAction::Ignore, XidAction::RestartApp, XidAction::ResetGpu, XidAction::RebootNode, XidAction::Hardware]
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(text.trim()))
    }
}

/// A GPU error as a node's agent classified it with its XID table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFault {
    pub gpu: u32,
    pub xid: Option<u64>,
    pub action: XidAction,
    /// What the XID means (the table's words).
    pub reason: String,
}

/// One GPU out of service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDrain {
    pub reason: String,
    /// Why it was drained: a reset (the agent resets it once idle and it comes back), or an operator (it comes back
    /// only when an operator returns it).
    pub action: XidAction,
    pub since_ms: u64,
}

/// A failure charged to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFailure {
    pub time_ms: u64,
    /// The job that failed with it, if one did.
    pub job: Option<JobId>,
    /// What happened (`node lost`, `XID 79`, `job hung`, `job 12 failed 30 s after starting`).
    pub what: String,
    /// For a job that failed on its own soon after starting: its owner. Such failures count once per user, since
    /// one user's broken script failing again and again says nothing about the node.
    #[serde(default)]
    pub early_exit_of: Option<u32>,
}

/// A node's container image cache: reported by its agent after imports and evictions, not per heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ImageStoreSummary {
    pub images: u32,
    pub bytes: u64,
    pub limit_bytes: u64,
}

/// An incarnation a registering agent still has tasks of on its node, with the GPUs they were given. A node that
/// comes back from DOWN lists them so that their GPUs stay held until the agent confirms the tasks gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RunningShare {
    pub job: JobId,
    pub incarnation: u64,
    pub gpus: Vec<u32>,
}

/// What an ended incarnation still holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lingering {
    pub job: JobId,
    pub incarnation: u64,
    pub gpus: Vec<u32>,
    pub cpus: u32,
    #[serde(default)]
    pub mem_mb: u64,
}

impl Node {
    pub fn new(info: NodeInfo, now_ms: u64) -> Node {
        Node {
            spare: info.spare,
            info,
            health: NodeHealth::Up,
            drain: false,
            reason: String::new(),
            since_ms: now_ms,
            allocated_gpus: BTreeMap::new(),
            allocated_cpus: 0,
            allocated_mem_mb: 0,
            jobs: BTreeSet::new(),
            lingering: Vec::new(),
            epoch: 1,
            image_store: None,
            drained_gpus: BTreeMap::new(),
            failures: Vec::new(),
            reboot: None,
        }
    }

    /// Slurm's state word: `IDLE`, `MIXED`, `ALLOCATED`, `DOWN`, `DRAINING` (drained with jobs), `DRAINED`.
    pub fn state_name(&self) -> &'static str {
        match (self.health, self.drain, self.jobs.is_empty()) {
            (NodeHealth::Down, _, _) => "DOWN",
            (NodeHealth::Up, true, true) => "DRAINED",
            (NodeHealth::Up, true, false) => "DRAINING",
            (NodeHealth::Up, false, true) => "IDLE",
            (NodeHealth::Up, false, false) => {
                let gpus_full = !self.info.gpus.is_empty() && self.free_gpus().next().is_none();
                let cpus_full = self.info.cpus > 0 && self.allocated_cpus >= self.info.cpus;
                let mem_full = self.info.memory_mb > 0 && self.allocated_mem_mb >= self.info.memory_mb;
                if gpus_full || cpus_full || mem_full { "ALLOCATED" } else { "MIXED" }
            }
        }
    }

    /// Whether new work may be placed here (not while a reboot is pending: it waits for the node to empty).
    pub fn schedulable(&self) -> bool {
        self.health == NodeHealth::Up && !self.drain && self.reboot.is_none()
    }

    /// GPUs no job or lingering incarnation holds, and that are in service.
    pub fn free_gpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.info.gpus.iter().map(|g| g.index).filter(|i| !self.gpu_held(*i) && !self.drained_gpus.contains_key(i))
    }

    /// Failures charged here at or after `since_ms`.
    pub fn failures_since(&self, since_ms: u64) -> impl Iterator<Item = &NodeFailure> {
        self.failures.iter().filter(move |f| f.time_ms >= since_ms)
    }

    /// Whether a running job or a lingering incarnation holds GPU `index`.
    pub fn gpu_held(&self, index: u32) -> bool {
        self.allocated_gpus.contains_key(&index) || self.lingering.iter().any(|l| l.gpus.contains(&index))
    }

    pub fn free_cpus(&self) -> u32 {
        let lingering: u32 = self.lingering.iter().map(|l| l.cpus).sum();
        self.info.cpus.saturating_sub(self.allocated_cpus).saturating_sub(lingering)
    }

    /// Memory not held by a job or a lingering incarnation, in MiB. A node that reports no memory
    /// (`memory_mb == 0`) does not track it: see [`Node::tracks_memory`].
    pub fn free_mem_mb(&self) -> u64 {
        let lingering: u64 = self.lingering.iter().map(|l| l.mem_mb).sum();
        self.info.memory_mb.saturating_sub(self.allocated_mem_mb).saturating_sub(lingering)
    }

    /// Whether memory is a consumable resource here (the node reported its size).
    pub fn tracks_memory(&self) -> bool {
        self.info.memory_mb > 0
    }

    /// The MiB a share of `cpus` CPUs and `gpus` GPUs of a job asking for `mem` reserves here.
    pub fn mem_for(&self, mem: Option<crate::model::job::MemRequest>, cpus: u32, gpus: u32) -> u64 {
        match mem {
            Some(request) if self.tracks_memory() => request.on_node(cpus, gpus, self.info.memory_mb),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_addresses_or_dns_names_and_nothing_a_shell_would_read() {
        for ok in ["gpu01", "gpu01.rack3.example.org", "gpu01.example.org.", "10.0.0.7", "::1", "fe80::1", "n-1"] {
            assert!(check_host(ok).is_ok(), "{ok}");
        }
        let long = format!("{}.example", "a".repeat(64));
        for bad in ["", "gpu01; reboot", "$(id)", "a b", "-gpu", "gpu-", "gpu..01", "gpu`x`", "gpu01\n", &long] {
            assert!(check_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn node_state_follows_allocation() {
        let gpus = (0..2).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect();
        let mut node = Node::new(NodeInfo { name: "n1".into(), cpus: 8, gpus, ..NodeInfo::default() }, 0);
        assert_eq!(node.state_name(), "IDLE");
        node.jobs.insert(1);
        node.allocated_gpus.insert(0, 1);
        assert_eq!(node.state_name(), "MIXED");
        node.allocated_gpus.insert(1, 1);
        assert_eq!(node.state_name(), "ALLOCATED");
        node.drain = true;
        assert_eq!(node.state_name(), "DRAINING");
        node.health = NodeHealth::Down;
        assert_eq!(node.state_name(), "DOWN");
    }
}

//! Where a drill runs. The runner only asks a [`Target`] to do things a fault needs (kill, pause, cut off,
//! fill a disk, add a replica), so an SRE can add a target for ssh or systemd hosts next to the local one.

use std::time::Duration;

/// A process of the cluster, as faults name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Member {
    Replica(u64),
    /// A node agent, by node name.
    Agent(String),
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Member::Replica(id) => write!(f, "replica {id}"),
            Member::Agent(name) => write!(f, "agent {name}"),
        }
    }
}

/// A network fault's handle: [`Target::heal`] undoes exactly what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FaultId(pub u64);

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{what}: {message}")]
    Failed { what: String, message: String },
    #[error("{0} is not part of this cluster")]
    Unknown(Member),
}

pub type TargetResult<T> = Result<T, TargetError>;

/// The operations faults are made of. Each is real (a signal, a firewall rule, a full disk), never a flag the
/// cluster could notice and play along with.
pub trait Target: Send {
    /// The replicas now running or stopped (ids), and the agents' node names.
    fn replicas(&self) -> Vec<u64>;
    fn agents(&self) -> Vec<String>;
    /// `host:port` of each replica (clients, including the drill's, use them).
    fn replica_addresses(&self) -> Vec<(u64, String)>;
    /// The client configuration file (TLS and credentials) the drill's clients and jobs use.
    fn client_config(&self) -> std::path::PathBuf;
    /// Where jobs can write logs every node can read (a local directory here; shared storage on real hosts).
    fn shared_dir(&self) -> std::path::PathBuf;

    /// SIGKILL (a crash); [`Target::start`] brings it back with its data.
    fn kill(&mut self, member: &Member) -> TargetResult<()>;
    /// A clean stop (SIGTERM), as an upgrade does it.
    fn stop(&mut self, member: &Member) -> TargetResult<()>;
    fn start(&mut self, member: &Member) -> TargetResult<()>;
    /// Runs a stopped member from this build (`previous` false) or the previous release at its next start.
    fn set_build(&mut self, member: &Member, previous: bool) -> TargetResult<()> {
        let _ = previous;
        Err(TargetError::Failed {
            what: format!("changing the build of {member}"),
            message: "this target runs one build only (upgrade drills run against a local cluster)".into(),
        })
    }
    /// Whether the process is running (a replica whose disk filled up may have stopped itself).
    fn is_running(&self, member: &Member) -> bool;
    /// SIGSTOP / SIGCONT.
    fn pause(&mut self, member: &Member) -> TargetResult<()>;
    fn resume(&mut self, member: &Member) -> TargetResult<()>;

    /// Drops every packet to or from `member`.
    fn isolate(&mut self, member: &Member) -> TargetResult<FaultId>;
    /// Drops packets from each of `from` to each of `to` (one way; call twice for both).
    fn block(&mut self, from: &[Member], to: &[Member]) -> TargetResult<FaultId>;
    /// Drops this share of the packets between members, at random.
    fn loss(&mut self, percent: u32) -> TargetResult<FaultId>;
    /// Adds latency (and jitter) to packets between members.
    fn delay(&mut self, delay: Duration, jitter: Duration) -> TargetResult<FaultId>;
    /// Fills the replica's data disk.
    fn fill_disk(&mut self, replica: u64) -> TargetResult<FaultId>;
    /// Undoes one network or disk fault.
    fn heal(&mut self, fault: FaultId) -> TargetResult<()>;

    /// Starts a new replica process (not yet a member; the drill adds it through the API). Its id and address.
    fn spawn_replica(&mut self) -> TargetResult<(u64, String)>;
    /// Stops a replica for good (after the API removed it).
    fn retire_replica(&mut self, id: u64) -> TargetResult<()>;

    /// Undoes every fault still in place and stops the cluster if the target started it.
    fn teardown(&mut self) -> TargetResult<()>;
}

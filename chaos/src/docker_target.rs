//! The Docker target: a cluster whose replicas and agents are containers of a compose project
//! (`deploy/compose/`). A drill reaches it exactly as it reaches a local one, through [`Target`]; the faults are
//! Docker's own and real:
//!
//! - kill, stop, start, pause, resume: `docker kill` (SIGKILL to the container: a crash of the whole host, its
//!   tasks included), `docker stop`, `docker start`, `docker pause` / `unpause` (the cgroup freezer: a hung host).
//! - isolate: `docker network disconnect` from every network the container is on; the heal reconnects it with
//!   the same fixed address and aliases.
//! - block and loss: iptables rules inside the container's own network namespace (`nsenter -t PID -n`, from the
//!   host: the containers need no capability). A container restarted meanwhile has a fresh namespace, so its
//!   rules are already gone and healing it is a no-op.
//! - delay: tc netem on each of the container's interfaces, where the kernel has `sch_netem`.
//! - Not here: a full data disk (the data is in a Docker volume) and membership changes (they need spare
//!   replica services): such drills fail at once and say so.
//!
//! The cluster is described by a small TOML file (`deploy/compose/setup.sh` writes `chaos-target.toml`): the
//! compose project, the compose service of each replica and agent, the replicas' addresses and the client
//! configuration. Containers are found by compose's own labels (`com.docker.compose.project` and `.service`), so
//! names from compose v1 (`P_S_1`) and v2 (`P-S-1`) both work, or named outright with `container = "..."`.
//! The target does not start or stop the cluster: compose does (see `deploy/compose/drill.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use crate::target::{FaultId, Member, Target, TargetError, TargetResult};

/// `docker stop`'s grace before it SIGKILLs (as compose's `stop_grace_period` in deploy/compose).
const STOP_GRACE_S: u32 = 10;

/// What `chaos-target.toml` says.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    /// The compose project (`docker-compose -p NAME`).
    pub project: String,
    /// The client configuration the drill and its jobs use: the same path on the host and in every agent.
    pub client_config: PathBuf,
    /// Storage shared by the host and every agent at the same path (the jobs' logs).
    pub shared_dir: PathBuf,
    /// A `drover-authd` socket the host's clients can use (the login container's, bind-mounted); the drill uses it
    /// unless `DROVER_AUTH_SOCKET` is set.
    #[serde(default)]
    pub auth_socket: Option<PathBuf>,
    /// The docker CLI to run (default `docker`).
    #[serde(default = "default_docker")]
    pub docker: String,
    #[serde(default, rename = "replica")]
    pub replicas: Vec<ReplicaEntry>,
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentEntry>,
}

fn default_docker() -> String {
    "docker".into()
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReplicaEntry {
    pub id: u64,
    /// The compose service it runs as.
    pub service: String,
    /// `host:port` clients use (the replica's fixed address).
    pub address: String,
    /// The container's name, when not found through compose's labels.
    #[serde(default)]
    pub container: Option<String>,
    /// Informational: the site it stands in.
    #[serde(default)]
    pub site: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    /// The node's name, as the cluster knows it.
    pub name: String,
    pub service: String,
    #[serde(default)]
    pub container: Option<String>,
    #[serde(default)]
    pub site: Option<String>,
}

impl TargetFile {
    pub fn load(path: &Path) -> TargetResult<TargetFile> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            failed(format!("reading {}", path.display()), format!("{e} (deploy/compose/setup.sh writes this file)"))
        })?;
        let file: TargetFile = toml::from_str(&text).map_err(|e| failed(format!("parsing {}", path.display()), e))?;
        file.validate().map_err(|e| failed(format!("checking {}", path.display()), e))?;
        Ok(file)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.project.is_empty() {
            anyhow::bail!("project is empty");
        }
        if self.replicas.is_empty() {
            anyhow::bail!("no [[replica]] entries");
        }
        let mut ids = std::collections::BTreeSet::new();
        for r in &self.replicas {
            if !ids.insert(r.id) {
                anyhow::bail!("replica {} is listed twice", r.id);
            }
            if r.address.parse::<std::net::SocketAddr>().is_err() {
                anyhow::bail!("replica {}: address {:?} is not IP:port", r.id, r.address);
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for a in &self.agents {
            if !names.insert(a.name.as_str()) {
                anyhow::bail!("agent {} is listed twice", a.name);
            }
        }
        Ok(())
    }
}

/// The arguments of `docker ps` that find a compose service's container by compose's labels.
pub fn find_container_args(project: &str, service: &str) -> Vec<String> {
    vec![
        "ps".into(),
        "--all".into(),
        "--filter".into(),
        format!("label=com.docker.compose.project={project}"),
        "--filter".into(),
        format!("label=com.docker.compose.service={service}"),
        "--format".into(),
        "{{.Names}}".into(),
    ]
}

/// The docker arguments of a process-level fault on `container`.
pub fn lifecycle_args(op: Lifecycle, container: &str) -> Vec<String> {
    let mut args: Vec<String> = match op {
        Lifecycle::Kill => vec!["kill".into(), "--signal".into(), "KILL".into()],
        Lifecycle::Stop => vec!["stop".into(), "--time".into(), STOP_GRACE_S.to_string()],
        Lifecycle::Start => vec!["start".into()],
        Lifecycle::Pause => vec!["pause".into()],
        Lifecycle::Unpause => vec!["unpause".into()],
    };
    args.push(container.to_string());
    args
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Kill,
    Stop,
    Start,
    Pause,
    Unpause,
}

/// One network a container is attached to, as `docker inspect` reports it: enough to attach it again as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub network: String,
    /// The fixed address compose asked for (`ipv4_address`), else the one Docker gave it.
    pub ip: String,
    pub aliases: Vec<String>,
}

/// Parses `docker inspect --format '{{.Id}} {{json .NetworkSettings.Networks}}'`. Docker adds the container's
/// short id as an alias by itself, so it is left out of what a reconnect passes.
pub fn parse_attachments(inspect: &str) -> anyhow::Result<Vec<Attachment>> {
    let (id, json) = inspect
        .trim()
        .split_once(' ')
        .ok_or_else(|| anyhow::anyhow!("unexpected docker inspect output {inspect:?}"))?;
    let networks: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(json).map_err(|e| anyhow::anyhow!("docker inspect's networks are not JSON: {e}"))?;
    let mut out = Vec::new();
    for (network, settings) in networks {
        let fixed = settings.pointer("/IPAMConfig/IPv4Address").and_then(|v| v.as_str()).unwrap_or("");
        let given = settings.get("IPAddress").and_then(|v| v.as_str()).unwrap_or("");
        let ip = if fixed.is_empty() { given } else { fixed }.to_string();
        let aliases = settings
            .get("Aliases")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str()).filter(|a| !id.starts_with(a)).map(String::from).collect())
            .unwrap_or_default();
        out.push(Attachment { network, ip, aliases });
    }
    Ok(out)
}

/// `docker network connect` arguments that attach `container` again as `a` describes.
pub fn connect_args(a: &Attachment, container: &str) -> Vec<String> {
    let mut args = vec!["network".to_string(), "connect".into()];
    if !a.ip.is_empty() {
        args.extend(["--ip".into(), a.ip.clone()]);
    }
    for alias in &a.aliases {
        args.extend(["--alias".into(), alias.clone()]);
    }
    args.extend([a.network.clone(), container.to_string()]);
    args
}

pub fn disconnect_args(network: &str, container: &str) -> Vec<String> {
    vec!["network".into(), "disconnect".into(), "--force".into(), network.into(), container.into()]
}

/// `nsenter` arguments that run `command` in process `pid`'s network namespace.
pub fn in_netns(pid: u32, command: &[String]) -> Vec<String> {
    let mut args = vec!["-t".to_string(), pid.to_string(), "-n".into()];
    args.extend(command.iter().cloned());
    args
}

/// An iptables rule (without `-I`/`-D`) dropping what arrives from `sources`.
pub fn drop_from(sources: &[String], extra: &[&str]) -> Vec<String> {
    let mut rule = vec!["INPUT".to_string(), "-s".into(), sources.join(",")];
    rule.extend(extra.iter().map(|s| s.to_string()));
    rule.extend(["-j".into(), "DROP".into()]);
    rule
}

/// The interfaces of a network namespace, from `/proc/PID/net/dev` (all but `lo`).
pub fn interfaces(net_dev: &str) -> Vec<String> {
    net_dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
        .filter(|name| name != "lo")
        .collect()
}

fn failed(what: impl Into<String>, message: impl std::fmt::Display) -> TargetError {
    TargetError::Failed { what: what.into(), message: message.to_string() }
}

/// Runs a command; its stdout, or its stderr as the error.
fn output(program: &str, args: &[String]) -> TargetResult<String> {
    let what = || format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| failed(what(), format!("{e} (is {program} installed and on PATH?)")))?;
    if !out.status.success() {
        return Err(failed(what(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How to undo one piece of a fault.
#[derive(Debug)]
enum Undo {
    /// Attach the container again.
    Connect { container: String, attachment: Attachment },
    /// `iptables -D` this rule in the namespace of this process (if it still runs: a restart took the rule along).
    Rule { pid: u32, rule: Vec<String> },
    /// `tc qdisc del dev IFACE root` in the namespace of this process.
    Netem { pid: u32, iface: String },
}

pub struct DockerTarget {
    file: TargetFile,
    /// Container name of each member.
    containers: BTreeMap<Member, String>,
    faults: BTreeMap<FaultId, Vec<Undo>>,
    next_fault: u64,
}

impl DockerTarget {
    /// Reads the target file and finds every member's container (they must exist: `docker-compose up` first).
    pub fn open(path: &Path) -> TargetResult<DockerTarget> {
        let file = TargetFile::load(path)?;
        output(&file.docker, &["version".into(), "--format".into(), "{{.Server.Version}}".into()]).map_err(|e| {
            failed(
                "docker version",
                format!("the Docker daemon does not answer ({e}); is Docker installed and running?"),
            )
        })?;
        let mut containers = BTreeMap::new();
        let members = file
            .replicas
            .iter()
            .map(|r| (Member::Replica(r.id), &r.service, &r.container))
            .chain(file.agents.iter().map(|a| (Member::Agent(a.name.clone()), &a.service, &a.container)));
        for (member, service, container) in members {
            let name = match container {
                Some(c) => c.clone(),
                None => {
                    let found = output(&file.docker, &find_container_args(&file.project, service))?;
                    let names: Vec<&str> = found.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                    match names[..] {
                        [one] => one.to_string(),
                        [] => {
                            return Err(failed(
                                format!("finding {member}"),
                                format!(
                                    "no container of service {service} in compose project {}: is the cluster up? \
                                     (docker-compose -p {} up -d, or deploy/compose/drill.sh)",
                                    file.project, file.project
                                ),
                            ));
                        }
                        _ => {
                            return Err(failed(
                                format!("finding {member}"),
                                format!(
                                    "service {service} has several containers ({names:?}); name one with container ="
                                ),
                            ));
                        }
                    }
                }
            };
            containers.insert(member, name);
        }
        Ok(DockerTarget { file, containers, faults: BTreeMap::new(), next_fault: 1 })
    }

    /// The authd socket for the host's clients, from the target file.
    pub fn auth_socket(&self) -> Option<&Path> {
        self.file.auth_socket.as_deref()
    }

    /// The container a member runs in.
    pub fn container(&self, member: &Member) -> TargetResult<&str> {
        self.containers.get(member).map(String::as_str).ok_or_else(|| TargetError::Unknown(member.clone()))
    }

    /// Each member's site, where the file gives one.
    pub fn site(&self, member: &Member) -> Option<&str> {
        match member {
            Member::Replica(id) => self.file.replicas.iter().find(|r| r.id == *id)?.site.as_deref(),
            Member::Agent(name) => self.file.agents.iter().find(|a| &a.name == name)?.site.as_deref(),
        }
    }

    fn docker(&self, args: &[String]) -> TargetResult<String> {
        output(&self.file.docker, args)
    }

    fn lifecycle(&mut self, member: &Member, op: Lifecycle) -> TargetResult<()> {
        let container = self.container(member)?.to_string();
        self.docker(&lifecycle_args(op, &container)).map(drop)
    }

    fn attachments(&self, container: &str) -> TargetResult<Vec<Attachment>> {
        let inspect = self.docker(&[
            "inspect".into(),
            "--format".into(),
            "{{.Id}} {{json .NetworkSettings.Networks}}".into(),
            container.into(),
        ])?;
        parse_attachments(&inspect).map_err(|e| failed(format!("reading {container}'s networks"), e))
    }

    /// The pid of a running container's first process (its namespaces are the container's).
    fn pid(&self, member: &Member) -> TargetResult<u32> {
        let container = self.container(member)?;
        let pid = self.docker(&["inspect".into(), "--format".into(), "{{.State.Pid}}".into(), container.into()])?;
        match pid.trim().parse::<u32>() {
            Ok(pid) if pid > 0 => Ok(pid),
            _ => Err(failed(format!("network fault on {member}"), format!("container {container} is not running"))),
        }
    }

    /// Every address of a member, on every network it is attached to.
    fn ips(&self, member: &Member) -> TargetResult<Vec<String>> {
        let container = self.container(member)?;
        Ok(self.attachments(container)?.into_iter().map(|a| a.ip).filter(|ip| !ip.is_empty()).collect())
    }

    fn members(&self) -> Vec<Member> {
        self.containers.keys().cloned().collect()
    }

    fn new_fault(&mut self, undo: Vec<Undo>) -> FaultId {
        let id = FaultId(self.next_fault);
        self.next_fault += 1;
        self.faults.insert(id, undo);
        id
    }

    /// Inserts `rules` (each into the namespace of its pid); on a failure, undoes what went in and says why.
    fn add_rules(&mut self, rules: Vec<(u32, Vec<String>)>) -> TargetResult<FaultId> {
        let mut undo = Vec::new();
        for (pid, rule) in rules {
            let mut cmd = vec!["iptables".to_string(), "-I".into()];
            cmd.extend(rule.iter().cloned());
            if let Err(e) = output("nsenter", &in_netns(pid, &cmd)) {
                let id = self.new_fault(undo);
                let _ = self.heal(id);
                return Err(failed(
                    "iptables in a container's network namespace",
                    format!("{e}; this needs root, nsenter (util-linux) and iptables on the host"),
                ));
            }
            undo.push(Undo::Rule { pid, rule });
        }
        Ok(self.new_fault(undo))
    }

    fn undo(&self, undo: Undo) -> TargetResult<()> {
        match undo {
            Undo::Connect { container, attachment } => {
                let result = self.docker(&connect_args(&attachment, &container));
                match result {
                    // Attached again meanwhile (compose, or an operator): the network is whole, as the heal wants.
                    Err(TargetError::Failed { message, .. }) if message.contains("already exists") => Ok(()),
                    other => other.map(drop),
                }
            }
            Undo::Rule { pid, rule } => {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return Ok(()); // the container restarted: its namespace, and the rule, are gone
                }
                let mut cmd = vec!["iptables".to_string(), "-D".into()];
                cmd.extend(rule);
                output("nsenter", &in_netns(pid, &cmd)).map(drop)
            }
            Undo::Netem { pid, iface } => {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return Ok(());
                }
                let cmd: Vec<String> = ["tc", "qdisc", "del", "dev", iface.as_str(), "root"].map(String::from).into();
                output("nsenter", &in_netns(pid, &cmd)).map(drop)
            }
        }
    }
}

impl Target for DockerTarget {
    fn replicas(&self) -> Vec<u64> {
        self.file.replicas.iter().map(|r| r.id).collect()
    }

    fn agents(&self) -> Vec<String> {
        self.file.agents.iter().map(|a| a.name.clone()).collect()
    }

    fn replica_addresses(&self) -> Vec<(u64, String)> {
        self.file.replicas.iter().map(|r| (r.id, r.address.clone())).collect()
    }

    fn client_config(&self) -> PathBuf {
        self.file.client_config.clone()
    }

    fn shared_dir(&self) -> PathBuf {
        self.file.shared_dir.clone()
    }

    fn kill(&mut self, member: &Member) -> TargetResult<()> {
        self.lifecycle(member, Lifecycle::Kill)
    }

    fn stop(&mut self, member: &Member) -> TargetResult<()> {
        self.lifecycle(member, Lifecycle::Stop)
    }

    fn start(&mut self, member: &Member) -> TargetResult<()> {
        if self.is_running(member) {
            return Ok(());
        }
        self.lifecycle(member, Lifecycle::Start)
    }

    fn is_running(&self, member: &Member) -> bool {
        let Ok(container) = self.container(member) else { return false };
        let state = self.docker(&["inspect".into(), "--format".into(), "{{.State.Running}}".into(), container.into()]);
        // A paused container is running (frozen), as a SIGSTOPped process is.
        state.is_ok_and(|s| s.trim() == "true")
    }

    fn pause(&mut self, member: &Member) -> TargetResult<()> {
        self.lifecycle(member, Lifecycle::Pause)
    }

    fn resume(&mut self, member: &Member) -> TargetResult<()> {
        self.lifecycle(member, Lifecycle::Unpause)
    }

    fn isolate(&mut self, member: &Member) -> TargetResult<FaultId> {
        let container = self.container(member)?.to_string();
        let mut undo = Vec::new();
        for attachment in self.attachments(&container)? {
            if let Err(e) = self.docker(&disconnect_args(&attachment.network, &container)) {
                let id = self.new_fault(undo);
                let _ = self.heal(id);
                return Err(e);
            }
            undo.push(Undo::Connect { container: container.clone(), attachment });
        }
        Ok(self.new_fault(undo))
    }

    fn block(&mut self, from: &[Member], to: &[Member]) -> TargetResult<FaultId> {
        let mut sources = Vec::new();
        for m in from {
            sources.extend(self.ips(m)?);
        }
        let mut rules = Vec::new();
        for m in to {
            rules.push((self.pid(m)?, drop_from(&sources, &[])));
        }
        self.add_rules(rules)
    }

    fn loss(&mut self, percent: u32) -> TargetResult<FaultId> {
        let members = self.members();
        let mut sources = Vec::new();
        for m in &members {
            sources.extend(self.ips(m)?);
        }
        let probability = format!("{:.4}", percent as f64 / 100.0);
        let extra = ["-m", "statistic", "--mode", "random", "--probability", probability.as_str()];
        let mut rules = Vec::new();
        for m in &members {
            rules.push((self.pid(m)?, drop_from(&sources, &extra)));
        }
        self.add_rules(rules)
    }

    fn delay(&mut self, delay: Duration, jitter: Duration) -> TargetResult<FaultId> {
        let mut undo = Vec::new();
        for m in self.members() {
            let pid = self.pid(&m)?;
            let net_dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
                .map_err(|e| failed(format!("reading {m}'s interfaces"), e))?;
            for iface in interfaces(&net_dev) {
                let cmd: Vec<String> = format!(
                    "tc qdisc add dev {iface} root netem delay {}ms {}ms",
                    delay.as_millis(),
                    jitter.as_millis()
                )
                .split_whitespace()
                .map(String::from)
                .collect();
                if let Err(e) = output("nsenter", &in_netns(pid, &cmd)) {
                    let id = self.new_fault(undo);
                    let _ = self.heal(id);
                    return Err(failed(
                        "tc netem",
                        format!("{e}; this kernel has no netem qdisc (module sch_netem), so latency cannot be added"),
                    ));
                }
                undo.push(Undo::Netem { pid, iface });
            }
        }
        Ok(self.new_fault(undo))
    }

    fn fill_disk(&mut self, replica: u64) -> TargetResult<FaultId> {
        Err(failed(
            format!("filling replica {replica}'s disk"),
            "the docker target does not fill disks (the data is in a Docker volume); run disk-full drills with the local target",
        ))
    }

    fn heal(&mut self, fault: FaultId) -> TargetResult<()> {
        let mut first_error = None;
        for undo in self.faults.remove(&fault).unwrap_or_default() {
            if let Err(e) = self.undo(undo) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn spawn_replica(&mut self) -> TargetResult<(u64, String)> {
        Err(failed(
            "starting a new replica",
            "the docker target has no spare replica services; run membership drills with the local target",
        ))
    }

    fn retire_replica(&mut self, id: u64) -> TargetResult<()> {
        Err(failed(format!("retiring replica {id}"), "the docker target does not change membership"))
    }

    /// Undoes the faults still in place and unfreezes paused containers. The cluster itself is compose's to stop.
    fn teardown(&mut self) -> TargetResult<()> {
        let faults: Vec<FaultId> = self.faults.keys().copied().collect();
        let mut first_error = None;
        for fault in faults {
            if let Err(e) = self.heal(fault) {
                first_error.get_or_insert(e);
            }
        }
        for container in self.containers.values() {
            let paused =
                self.docker(&["inspect".into(), "--format".into(), "{{.State.Paused}}".into(), container.clone()]);
            if paused.is_ok_and(|p| p.trim() == "true")
                && let Err(e) = self.docker(&lifecycle_args(Lifecycle::Unpause, container))
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for DockerTarget {
    fn drop(&mut self) {
        // Never leave a container cut off or frozen, whatever happened to the drill.
        let _ = self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
project = "drover3"
client_config = "/var/tmp/d/shared/client.toml"
shared_dir = "/var/tmp/d/shared"
auth_socket = "/var/tmp/d/run/login/auth.sock"

[[replica]]
id = 1
service = "ctl1"
address = "10.213.0.11:7100"
site = "a"

[[replica]]
id = 2
service = "ctl2"
address = "10.213.0.12:7100"
container = "custom-ctl2"

[[agent]]
name = "node01"
service = "node01"
"#;

    #[test]
    fn the_target_file_says_who_is_who() {
        let file: TargetFile = toml::from_str(FILE).unwrap();
        file.validate().unwrap();
        assert_eq!(file.project, "drover3");
        assert_eq!(file.docker, "docker");
        assert_eq!(file.replicas[0].site.as_deref(), Some("a"));
        assert_eq!(file.replicas[1].container.as_deref(), Some("custom-ctl2"));
        assert_eq!(file.agents[0].name, "node01");
        assert_eq!(file.auth_socket.as_deref(), Some(Path::new("/var/tmp/d/run/login/auth.sock")));
    }

    #[test]
    fn a_bad_target_file_is_refused_with_the_reason() {
        let unknown = FILE.replace("shared_dir", "shared_directory");
        assert!(toml::from_str::<TargetFile>(&unknown).unwrap_err().to_string().contains("shared_directory"));
        let twice = FILE.replace("id = 2", "id = 1");
        let err = toml::from_str::<TargetFile>(&twice).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains("replica 1 is listed twice"), "{err}");
        let address = FILE.replace("10.213.0.12:7100", "ctl2");
        let err = toml::from_str::<TargetFile>(&address).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains("not IP:port"), "{err}");
        let err = TargetFile::load(Path::new("/nonexistent/chaos-target.toml")).unwrap_err().to_string();
        assert!(err.contains("setup.sh"), "{err}");
    }

    #[test]
    fn containers_are_found_by_compose_labels() {
        assert_eq!(
            find_container_args("drover3", "ctl1"),
            [
                "ps",
                "--all",
                "--filter",
                "label=com.docker.compose.project=drover3",
                "--filter",
                "label=com.docker.compose.service=ctl1",
                "--format",
                "{{.Names}}"
            ]
        );
    }

    #[test]
    fn process_faults_are_docker_commands_on_the_container() {
        assert_eq!(lifecycle_args(Lifecycle::Kill, "drover3_ctl1_1"), ["kill", "--signal", "KILL", "drover3_ctl1_1"]);
        assert_eq!(lifecycle_args(Lifecycle::Stop, "c"), ["stop", "--time", "10", "c"]);
        assert_eq!(lifecycle_args(Lifecycle::Start, "c"), ["start", "c"]);
        assert_eq!(lifecycle_args(Lifecycle::Pause, "c"), ["pause", "c"]);
        assert_eq!(lifecycle_args(Lifecycle::Unpause, "c"), ["unpause", "c"]);
    }

    #[test]
    fn a_reconnect_restores_the_fixed_address_and_aliases_but_not_the_id_alias() {
        let inspect = r#"4f1e2d3c4b5a69788796a5b4c3d2e1f0 {"drover3_drover":{"IPAMConfig":{"IPv4Address":"10.213.0.11"},"Links":null,"Aliases":["ctl1","4f1e2d3c4b5a"],"IPAddress":"10.213.0.11"},"drover3site_wan":{"IPAMConfig":null,"Aliases":null,"IPAddress":"10.214.0.7"}}"#;
        let a = parse_attachments(inspect).unwrap();
        assert_eq!(
            a,
            [
                Attachment { network: "drover3_drover".into(), ip: "10.213.0.11".into(), aliases: vec!["ctl1".into()] },
                Attachment { network: "drover3site_wan".into(), ip: "10.214.0.7".into(), aliases: vec![] },
            ]
        );
        assert_eq!(
            connect_args(&a[0], "drover3_ctl1_1"),
            ["network", "connect", "--ip", "10.213.0.11", "--alias", "ctl1", "drover3_drover", "drover3_ctl1_1"]
        );
        assert_eq!(
            disconnect_args("drover3_drover", "drover3_ctl1_1"),
            ["network", "disconnect", "--force", "drover3_drover", "drover3_ctl1_1"]
        );
        assert!(parse_attachments("garbage").is_err());
        assert!(parse_attachments("id {not json").is_err());
    }

    #[test]
    fn packet_faults_are_iptables_rules_in_the_containers_namespace() {
        let rule = drop_from(&["10.213.0.11".into(), "10.214.0.11".into()], &[]);
        assert_eq!(rule, ["INPUT", "-s", "10.213.0.11,10.214.0.11", "-j", "DROP"]);
        let mut cmd = vec!["iptables".to_string(), "-I".into()];
        cmd.extend(rule);
        assert_eq!(
            in_netns(4242, &cmd),
            ["-t", "4242", "-n", "iptables", "-I", "INPUT", "-s", "10.213.0.11,10.214.0.11", "-j", "DROP"]
        );
        let lossy =
            drop_from(&["10.0.0.1".into()], &["-m", "statistic", "--mode", "random", "--probability", "0.1000"]);
        assert_eq!(lossy[3..7], ["-m", "statistic", "--mode", "random"]);
    }

    #[test]
    fn interfaces_come_from_the_namespaces_net_dev() {
        let net_dev = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n  eth0:    1234      10    0    0    0     0          0         0     5678      12    0    0    0     0       0          0\n  eth1:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n";
        assert_eq!(interfaces(net_dev), ["eth0", "eth1"]);
    }
}

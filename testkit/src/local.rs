//! `drover local up/down`: a whole cluster on this machine, every process in the background, everything under
//! one directory and described in `DIR/cluster.json`. Tests, benchmarks and the demo drive the same code, so
//! they can also kill, restart, wipe and add replicas.
//!
//! Security is on, as in production, with throwaway material: a CA, a cluster key and a certificate per process
//! under `DIR/pki`, a `drover-authd` on `DIR/auth.sock` issuing user credentials, a `drover-relayd` on
//! `DIR/relay.sock` relaying submissions, and `DIR/client.toml` for
//! clients (`export DROVER_CONFIG=DIR/client.toml`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// One background process of a local cluster, as `cluster.json` records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Process {
    pub role: String,
    pub id: u64,
    pub address: String,
    pub pid: Option<u32>,
    pub data_dir: PathBuf,
    pub log_file: PathBuf,
    pub config: PathBuf,
    /// Controllers: where `/metrics` and the web page are served; agents: where `/metrics` is (loopback addresses
    /// only, like the rest of the local cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// Controllers with `UpOptions::separate_advertise`: where the replica really listens (`address` is what it
    /// advertises, e.g. a WAN-emulating proxy in front of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// The program it runs, when not this build's (the upgrade drill runs the previous release's controllers and
    /// agents, see [`crate::previous`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    pub processes: Vec<Process>,
}

/// Options for `local up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub controllers: usize,
    /// Raft timing override (ms): heartbeat, election min, election max.
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// Snapshot threshold (entries); small values make tests exercise snapshots.
    pub snapshot_after_entries: u64,
    pub keep_entries_after_snapshot: u64,
    /// Extra TOML appended to every controller config (partitions, limits).
    pub extra_toml: String,
    /// Give each replica and each agent its own loopback address instead of 127.0.0.1 (127.A.B.10+ID for
    /// replicas, 127.A.B.100+N for agents, A.B random per cluster), so a test can cut one off with a firewall rule
    /// without touching any other cluster on the machine.
    pub distinct_ips: bool,
    /// Node agents (`node01`, ...), each with this many simulated GPUs and 64 CPUs.
    pub agents: usize,
    pub gpus_per_agent: u32,
    /// The agents' SIGTERM-to-SIGKILL grace (ms).
    pub kill_wait_ms: u64,
    /// The controllers' `[agents]` timing: heartbeat, fence, node timeout (ms).
    pub agent_heartbeat_ms: u64,
    pub agent_fence_after_ms: u64,
    pub node_timeout_ms: u64,
    /// The GPU count the agents' config promises (`[gpus] count`); a value other than `gpus_per_agent` makes
    /// each agent report an inventory mismatch.
    pub agent_expected_gpus: Option<u32>,
    /// Give each agent a fault file (`agent-NODE/faults`, see `fault_file`) to inject GPU faults into.
    pub agent_fault_files: bool,
    /// The agents' `enforce_memory` (job cgroups: memory limits, cpusets, usage counters; they need root).
    /// Off only to measure what the cgroups cost.
    pub agent_cgroups: bool,
    /// `allow_root_jobs` in the cluster configuration. By default a local cluster allows root jobs exactly when
    /// root starts it: its agents then run as root anyway, and nobody else's identity is at stake.
    pub allow_root_jobs: bool,
    /// Per agent, in order (`node01` first): top-level TOML lines added to its config, e.g. topology labels
    /// (`topology = { site = "a" }`) or `spare = true`. Agents beyond the list get none.
    pub agent_toml: Vec<String>,
    /// Each controller listens on a second port of its address and advertises the first (`address` in
    /// `cluster.json`, `DROVER_CONTROLLERS`, the Raft membership), where something else, such as the benchmarks'
    /// WAN proxy (`drover-bench sites`), must forward to `Process::listen`. The certificate is unchanged: same IP.
    pub separate_advertise: bool,
    /// A backup (`drover cluster backup FILE`) every founding replica is restored from before it first starts.
    pub restore: Option<PathBuf>,
    /// A directory with another build's `drover-controller` and `drover-agent` that the replicas and agents run
    /// from their first start (the upgrade drill's previous release); `None`: this build's.
    pub binaries: Option<PathBuf>,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            controllers: 3,
            heartbeat_ms: 50,
            election_min_ms: 200,
            election_max_ms: 300,
            snapshot_after_entries: 20_000,
            keep_entries_after_snapshot: 2_000,
            extra_toml: String::new(),
            distinct_ips: false,
            agents: 0,
            gpus_per_agent: 8,
            kill_wait_ms: 5_000,
            agent_heartbeat_ms: 500,
            agent_fence_after_ms: 5_000,
            node_timeout_ms: 8_000,
            agent_expected_gpus: None,
            agent_fault_files: false,
            agent_cgroups: true,
            // SAFETY: geteuid cannot fail.
            allow_root_jobs: unsafe { libc::geteuid() } == 0,
            agent_toml: Vec::new(),
            separate_advertise: false,
            restore: None,
            binaries: None,
        }
    }
}

pub struct LocalCluster {
    pub dir: PathBuf,
    pub processes: Vec<Process>,
    options: UpOptions,
    /// Kill every process on drop (tests); `local up` detaches instead.
    kill_on_drop: bool,
}

/// A trivial one-GPU job for the current user, as the peer benchmark submits: what tests and benchmarks
/// load a local cluster with.
pub fn trivial_spec() -> drover_state::JobSpec {
    let (user, uid, gid) = crate::identity::current_user();
    drover_state::JobSpec {
        name: "wrap".into(),
        user: user.into(),
        uid,
        gid,
        script: "#!/bin/sh\n# This script was created by sbatch --wrap.\n\ntrue\n".into(),
        work_dir: "/tmp".into(),
        submit_dir: "/tmp".into(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        gpus_per_node: 1,
        ..Default::default()
    }
}

/// Finds a sibling binary: next to this executable, one level up (test binaries live in `deps/`), or on PATH.
pub fn find_binary(name: &str) -> anyhow::Result<PathBuf> {
    let var = format!("{}_BIN", name.to_ascii_uppercase().replace('-', "_"));
    if let Ok(path) = std::env::var(&var) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            if dir.join(name).is_file() {
                return Ok(dir.join(name));
            }
        }
    }
    bail!(
        "cannot find the {name} binary next to {} or on PATH (build it: cargo build -p {name}, or set {var})",
        exe.display()
    )
}

/// A port on `ip` that nothing listens on, for one of a local cluster's processes to listen on.
///
/// The port comes from below the kernel's ephemeral range when the host leaves room there. A port found by binding
/// port 0 comes from that range, and between this check and the process's own bind any outgoing connection on the
/// host may take it as its local port: the replica or agent then cannot listen, and a cluster whose founder is
/// missing never initializes. The test suite saw exactly that ("did not elect a leader within 45s", "the agents did
/// not register"), with many clusters starting beside clients that open connections all the time. Below the range
/// a port is only ever taken by an explicit bind.
fn free_port(ip: &str) -> anyhow::Result<u16> {
    let (low, _) = ephemeral_ports();
    if low > MIN_LOCAL_PORT {
        let span = u64::from((low - MIN_LOCAL_PORT).min(LOCAL_PORT_SPAN));
        let first = low - span as u16;
        for _ in 0..64 {
            let port = first + (next_random() % span) as u16;
            if TcpListener::bind((ip, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = TcpListener::bind((ip, 0)).with_context(|| format!("cannot bind a port on {ip}"))?;
    Ok(listener.local_addr()?.port())
}

/// The lowest port [`free_port`] hands out (well above the ports of common services).
const MIN_LOCAL_PORT: u16 = 10_000;
/// How far below the ephemeral range [`free_port`] looks.
const LOCAL_PORT_SPAN: u16 = 16_384;

/// The kernel's ephemeral port range (Linux's default when it cannot be read).
fn ephemeral_ports() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = text.split_whitespace().filter_map(|p| p.parse::<u16>().ok());
    match (bounds.next(), bounds.next()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => (32_768, 60_999),
    }
}

/// A cheap pseudo-random number, different in every process and call (xorshift over the clock, the process id
/// and a counter): concurrent clusters must not all try the same ports first.
fn next_random() -> u64 {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut x = nanos ^ u64::from(std::process::id()).rotate_left(32) ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

impl LocalCluster {
    /// Writes configs for `options.controllers` founding replicas, starts them, and records `cluster.json`.
    pub fn up(dir: &Path, options: UpOptions) -> anyhow::Result<LocalCluster> {
        if dir.join("cluster.json").exists() {
            bail!(
                "{} already holds a cluster (cluster.json exists); run `drover local down --dir {}` first",
                dir.display(),
                dir.display()
            );
        }
        if ![1, 3, 5, 7].contains(&options.controllers) {
            bail!("--controllers must be 1, 3, 5 or 7 (an odd number keeps a clear majority)");
        }
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        // Every local user may reach the cluster's client files and authd socket (the test stories act as several
        // users); the secrets inside keep their own 0600 modes.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let pki = crate::pki::Pki::create(&dir.join("pki"), "local")?;
        let host = drover_auth::authd::hostname();
        pki.issue("client", &drover_auth::Role::Client(host.clone()), &[host], &[])?;
        let ip_base = if options.distinct_ips { random_ip_base() } else { String::new() };
        std::fs::write(dir.join("ip_base"), &ip_base)?;
        let mut cluster = LocalCluster { dir: dir.clone(), processes: Vec::new(), options, kill_on_drop: true };
        let mut members = BTreeMap::new();
        for id in 1..=cluster.options.controllers as u64 {
            let ip = cluster.ip_of(10 + id);
            members.insert(id, format!("{ip}:{}", free_port(&ip)?));
        }
        cluster.start_host_daemon("authd", AUTHD_ID, "auth.sock", pki.cluster_key_path())?;
        cluster.write_client_config(&members.values().cloned().collect::<Vec<_>>())?;
        for (id, addr) in &members {
            let process = cluster.write_config(*id, addr, &members)?;
            cluster.processes.push(process);
        }
        if let Some(backup) = cluster.options.restore.clone() {
            for id in members.keys() {
                cluster.restore(*id, &backup)?;
            }
        }
        for id in members.keys() {
            cluster.start(*id)?;
        }
        // The host's submission relay, as a production host runs it beside its authd (`sbatch` uses it when up).
        cluster.start_host_daemon("relayd", RELAY_ID, "relay.sock", dir.join("client.toml"))?;
        for _ in 0..cluster.options.agents {
            cluster.add_agent()?;
        }
        cluster.save()?;
        Ok(cluster)
    }

    /// Runs `drover-controller --restore BACKUP` on controller `id`'s (stopped, empty) data directory.
    pub fn restore(&mut self, id: u64, backup: &Path) -> anyhow::Result<()> {
        let config = self.process_mut(id)?.config.clone();
        let output = Command::new(find_binary("drover-controller")?)
            .arg("--config")
            .arg(&config)
            .arg("--restore")
            .arg(backup)
            .output()
            .context("cannot run drover-controller --restore")?;
        if !output.status.success() {
            bail!(
                "restoring replica {id} from {} failed: {}",
                backup.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// Runs `drover-controller --force-new-cluster --confirm-quorum-lost` on controller `id` (stopped); returns
    /// what it printed.
    pub fn force_new_cluster(&mut self, id: u64) -> anyhow::Result<String> {
        let process = self.process_mut(id)?;
        assert!(process.pid.is_none(), "force a new cluster on a stopped replica only");
        let config = process.config.clone();
        let output = Command::new(find_binary("drover-controller")?)
            .arg("--config")
            .arg(&config)
            .args(["--force-new-cluster", "--confirm-quorum-lost"])
            .output()
            .context("cannot run drover-controller --force-new-cluster")?;
        if !output.status.success() {
            bail!("forcing a new cluster on replica {id} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Records and starts one of the host's daemons (`authd`, `relayd`): it serves the Unix socket `DIR/socket`,
    /// logs to `DIR/ROLE.log` and reads `config`.
    fn start_host_daemon(&mut self, role: &str, id: u64, socket: &str, config: PathBuf) -> anyhow::Result<()> {
        self.processes.push(Process {
            role: role.into(),
            id,
            address: self.dir.join(socket).display().to_string(),
            pid: None,
            data_dir: self.dir.clone(),
            log_file: self.dir.join(format!("{role}.log")),
            config,
            http: None,
            listen: None,
            binary: None,
        });
        self.start(id)
    }

    /// Configures and starts one more node agent (`nodeNN`) with simulated GPUs.
    pub fn add_agent(&mut self) -> anyhow::Result<Process> {
        let n = self.processes.iter().filter(|p| p.role == "agent").count() as u64 + 1;
        let id = 100 + n;
        let name = format!("node{n:02}");
        let home = self.dir.join(format!("agent-{name}"));
        std::fs::create_dir_all(&home)?;
        let ip = self.ip_of(100 + n);
        let addr = format!("{ip}:{}", free_port(&ip)?);
        let metrics = format!("{ip}:{}", free_port(&ip)?);
        let controllers: Vec<String> =
            self.processes.iter().filter(|p| p.role == "controller").map(|p| p.address.clone()).collect();
        let pki = self.pki()?;
        let agent_ip: IpAddr = ip.parse()?;
        let (cert, key) = pki.issue(&name, &drover_auth::Role::Agent(name.clone()), &[], &[agent_ip, LOOPBACK])?;
        let toml = format!(
            "name = {name:?}\ncontrollers = {controllers:?}\nlisten = {addr:?}\nmetrics_listen = {metrics:?}\nhost = {ip:?}\nstate_dir = {:?}\ncpus = 64\nmemory_mb = 65536\nkill_wait_ms = {}\nclient_config = {:?}\nmemory_cgroup = {:?}\nenforce_memory = {}\n\n[gpus]\nsimulate = {}\nmodel = \"H200\"\n",
            home.join("state").display().to_string(),
            self.options.kill_wait_ms,
            self.dir.join("client.toml").display().to_string(),
            // Several local clusters share a host, and all have a node01 running job 1: one cgroup tree each.
            format!("drover-local/{:016x}/{name}", fnv1a(self.dir.display().to_string().as_bytes())),
            self.options.agent_cgroups,
            self.options.gpus_per_agent,
        );
        let mut toml = match self.options.agent_toml.get(n as usize - 1) {
            // Top-level keys go before the first table.
            Some(extra) => toml.replacen("\n[gpus]\n", &format!("{}\n\n[gpus]\n", extra.trim_end()), 1),
            None => toml,
        };
        if let Some(count) = self.options.agent_expected_gpus {
            toml.push_str(&format!("count = {count}\n"));
        }
        if self.options.agent_fault_files {
            toml.push_str(&format!("fault_file = {:?}\n", home.join("faults").display().to_string()));
        }
        toml.push_str(&security_section(&pki, &cert, &key));
        let config = home.join("agent.toml");
        std::fs::write(&config, toml)?;
        let process = Process {
            role: "agent".into(),
            id,
            address: addr,
            pid: None,
            data_dir: home.join("state"),
            log_file: home.join("agent.log"),
            config,
            http: Some(metrics),
            listen: None,
            binary: None,
        };
        self.processes.push(process.clone());
        self.start(id)?;
        Ok(process)
    }

    /// The address of process `host` (10+ID for replicas, 100+N for agents): its own when the cluster has
    /// distinct addresses, else 127.0.0.1.
    pub fn ip_of(&self, host: u64) -> String {
        let base = std::fs::read_to_string(self.dir.join("ip_base")).unwrap_or_default();
        if base.is_empty() { "127.0.0.1".to_string() } else { format!("{base}{host}") }
    }

    /// Where a GPU fault is injected into agent `name`'s simulated GPUs (`agent_fault_files`).
    pub fn fault_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("agent-{name}")).join("faults")
    }

    /// The agents' node names and ids.
    pub fn agents(&self) -> Vec<(String, u64)> {
        self.processes.iter().filter(|p| p.role == "agent").map(|p| (format!("node{:02}", p.id - 100), p.id)).collect()
    }

    /// Waits until every agent of this cluster registered and is up.
    pub async fn wait_agents(&self, timeout: Duration) -> anyhow::Result<()> {
        let want = self.agents().len();
        let client = self.client()?.with_deadline(Duration::from_millis(500));
        let start = Instant::now();
        loop {
            if let Ok(nodes) = client.list_nodes(false).await {
                let up = nodes.iter().filter(|n| n.health == drover_state::NodeHealth::Up).count();
                if up >= want {
                    return Ok(());
                }
            }
            if start.elapsed() > timeout {
                bail!("the agents in {} did not register within {timeout:?}; see their logs there", self.dir.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reads `DIR/cluster.json`.
    pub fn load(dir: &Path) -> anyhow::Result<LocalCluster> {
        let path = dir.join("cluster.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("no local cluster in {}", dir.display()))?;
        let file: ClusterFile =
            serde_json::from_str(&text).with_context(|| format!("{} is malformed", path.display()))?;
        Ok(LocalCluster {
            dir: dir.to_path_buf(),
            processes: file.processes,
            options: UpOptions::default(),
            kill_on_drop: false,
        })
    }

    /// Leaves the processes running when this handle is dropped.
    pub fn detach(&mut self) {
        self.kill_on_drop = false;
    }

    pub fn save(&self) -> anyhow::Result<()> {
        let file = ClusterFile { processes: self.processes.clone() };
        let tmp = self.dir.join("cluster.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&file)?)?;
        std::fs::rename(&tmp, self.dir.join("cluster.json"))?;
        Ok(())
    }

    /// The throwaway CA and keys of this cluster.
    pub fn pki(&self) -> anyhow::Result<crate::pki::Pki> {
        crate::pki::Pki::open(&self.dir.join("pki"))
    }

    /// `DIR/client.toml`: how clients on this machine reach and prove themselves to the cluster.
    fn write_client_config(&self, controllers: &[String]) -> anyhow::Result<()> {
        let pki = self.pki()?;
        let config = drover_client::ClientConfig {
            controllers: controllers.to_vec(),
            ca: pki.ca_path(),
            cert: pki.dir.join("client.pem"),
            key: pki.dir.join("client.key"),
            auth_socket: self.dir.join("auth.sock"),
            local_controllers: Vec::new(),
            relay_socket: Some(self.dir.join("relay.sock")),
        };
        let path = self.dir.join("client.toml");
        std::fs::write(&path, toml::to_string(&config)?)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        Ok(())
    }

    /// The client configuration of this cluster, aimed at every controller.
    pub fn client_config(&self) -> anyhow::Result<drover_client::ClientConfig> {
        Ok(drover_client::ClientConfig::load(&self.dir.join("client.toml"))?.with_controllers(&self.addresses()))
    }

    /// A client for this cluster as whoever runs this process, at the given controllers (all of them if empty).
    pub fn client_at(&self, controllers: &str) -> anyhow::Result<drover_client::Client> {
        let config = self.client_config()?;
        let config = if controllers.is_empty() { config } else { config.with_controllers(controllers) };
        Ok(drover_client::Client::new(&config)?)
    }

    /// A client for this cluster, at every controller.
    pub fn client(&self) -> anyhow::Result<drover_client::Client> {
        self.client_at("")
    }

    fn write_config(&self, id: u64, addr: &str, founders: &BTreeMap<u64, String>) -> anyhow::Result<Process> {
        let home = self.dir.join(format!("controller-{id}"));
        std::fs::create_dir_all(&home)?;
        let o = &self.options;
        let ip: IpAddr = addr.parse::<std::net::SocketAddr>()?.ip();
        let pki = self.pki()?;
        let (cert, key) = pki.issue(&format!("controller-{id}"), &drover_auth::Role::Controller(id), &[], &[ip])?;
        let http = format!("{ip}:{}", free_port(&ip.to_string())?);
        let listen = if o.separate_advertise { Some(format!("{ip}:{}", free_port(&ip.to_string())?)) } else { None };
        let mut toml = String::new();
        writeln!(
            toml,
            "id = {id}\nlisten = {:?}\nhttp_listen = {http:?}\ndata_dir = {:?}\nworker_threads = {}\n",
            listen.as_deref().unwrap_or(addr),
            home.join("data").display().to_string(),
            worker_share(founders.len())
        )?;
        if listen.is_some() {
            writeln!(toml, "advertise = {addr:?}\n")?;
        }
        writeln!(toml, "[initial_members]")?;
        for (fid, faddr) in founders {
            writeln!(toml, "{fid} = {faddr:?}")?;
        }
        writeln!(
            toml,
            "\n[agents]\nheartbeat_ms = {}\nfence_after_ms = {}\nnode_timeout_ms = {}\nkill_wait_ms = {}\n",
            o.agent_heartbeat_ms, o.agent_fence_after_ms, o.node_timeout_ms, o.kill_wait_ms
        )?;
        writeln!(
            toml,
            "\n[raft]\nheartbeat_interval_ms = {}\nelection_timeout_min_ms = {}\nelection_timeout_max_ms = {}\nsnapshot_after_entries = {}\nkeep_entries_after_snapshot = {}\n",
            o.heartbeat_ms,
            o.election_min_ms,
            o.election_max_ms,
            o.snapshot_after_entries,
            o.keep_entries_after_snapshot
        )?;
        toml.push_str(&security_section(&pki, &cert, &key));
        let mut table: toml::Table = toml::from_str(&toml)?;
        let extra: toml::Table = toml::from_str(&o.extra_toml)
            .with_context(|| format!("extra controller TOML is invalid: {}", o.extra_toml))?;
        merge_tables(&mut table, extra);
        let cluster = table.entry("cluster").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(cluster) = cluster {
            cluster.entry("allow_root_jobs").or_insert(toml::Value::Boolean(o.allow_root_jobs));
        }
        let config = home.join("controller.toml");
        std::fs::write(&config, toml::to_string(&table)?)?;
        Ok(Process {
            role: "controller".into(),
            id,
            address: addr.to_string(),
            pid: None,
            data_dir: home.join("data"),
            log_file: home.join("controller.log"),
            config,
            http: Some(http),
            listen,
            binary: None,
        })
    }

    fn process_mut(&mut self, id: u64) -> anyhow::Result<&mut Process> {
        self.processes.iter_mut().find(|p| p.id == id).with_context(|| format!("no controller {id}"))
    }

    /// `http://IP:PORT` of each controller's web page and `/metrics`, by id.
    pub fn web_addresses(&self) -> Vec<(u64, String)> {
        self.http_addresses("controller")
    }

    /// `http://IP:PORT` of each process of `role` that serves HTTP, by id.
    pub fn http_addresses(&self, role: &str) -> Vec<(u64, String)> {
        self.processes
            .iter()
            .filter(|p| p.role == role)
            .filter_map(|p| p.http.as_ref().map(|h| (p.id, format!("http://{h}"))))
            .collect()
    }

    pub fn process(&self, id: u64) -> Option<&Process> {
        self.processes.iter().find(|p| p.id == id)
    }

    /// Starts (or restarts) process `id` (a controller, an agent or the authd) with its existing config and data.
    pub fn start(&mut self, id: u64) -> anyhow::Result<()> {
        let role = self.process_mut(id)?.role.clone();
        let default_binary = match (&self.options.binaries, role.as_str()) {
            (Some(dir), "controller" | "agent") => Some(dir.join(bin_name(&role))),
            _ => None,
        };
        let process = self.process_mut(id)?;
        if process.binary.is_none() {
            process.binary = default_binary;
        }
        let bin = match &process.binary {
            Some(binary) => binary.clone(),
            None => find_binary(bin_name(&role))?,
        };
        let process = self.process_mut(id)?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&process.log_file)?;
        let mut cmd = Command::new(bin);
        if role == "authd" {
            cmd.arg("--key").arg(&process.config).arg("--socket").arg(&process.address);
        } else if role == "relayd" {
            cmd.arg("--config").arg(&process.config).arg("--socket").arg(&process.address);
        } else {
            cmd.arg("--config").arg(&process.config);
        }
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        // Its own session: the cluster outlives the `local up` command and the terminal's Ctrl-C.
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("cannot start {}", bin_name(&role)))?;
        process.pid = Some(child.id());
        if role == "authd" || role == "relayd" {
            // Clients need its socket from the first moment; it binds within milliseconds.
            let socket = PathBuf::from(&process.address);
            let start = Instant::now();
            while !socket.exists() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Reap it in the background so a killed replica does not linger as a zombie.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        Ok(())
    }

    /// Runs process `id` from `binary` at its next start (`None`: this build's). Stop it first; the upgrade drill
    /// swaps replicas and agents between releases this way.
    pub fn set_binary(&mut self, id: u64, binary: Option<PathBuf>) -> anyhow::Result<()> {
        let process = self.process_mut(id)?;
        assert!(process.pid.is_none(), "change the binary of a stopped process only");
        process.binary = binary;
        Ok(())
    }

    /// Sends `signal` to controller `id` (SIGKILL for a crash, SIGSTOP to freeze it).
    pub fn signal(&mut self, id: u64, signal: i32) -> anyhow::Result<()> {
        let process = self.process_mut(id)?;
        if let Some(pid) = process.pid {
            // SAFETY: plain kill(2) on a pid we started.
            unsafe { libc::kill(pid as i32, signal) };
        }
        if signal == libc::SIGKILL || signal == libc::SIGTERM {
            let pid = process.pid.take();
            if let Some(pid) = pid {
                wait_gone(pid, Duration::from_secs(10));
            }
        }
        if signal == libc::SIGSTOP
            && let Some(pid) = process.pid
        {
            // kill(2) returns before every thread has stopped: a request sent right after could still be answered.
            wait_stopped(pid, Duration::from_secs(5));
        }
        Ok(())
    }

    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, libc::SIGKILL)
    }

    /// Deletes controller `id`'s data directory (it must be stopped).
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        let process = self.process_mut(id)?;
        assert!(process.pid.is_none(), "wipe a stopped replica only");
        if process.data_dir.exists() {
            std::fs::remove_dir_all(&process.data_dir)?;
        }
        Ok(())
    }

    /// Configures and starts a new, non-founding replica (it waits to be added with add-replica).
    pub fn spawn_extra(&mut self) -> anyhow::Result<(u64, String)> {
        let id = self.processes.iter().filter(|p| p.role == "controller").map(|p| p.id).max().unwrap_or(0) + 1;
        let ip = self.ip_of(10 + id);
        let addr = format!("{ip}:{}", free_port(&ip)?);
        let process = self.write_config(id, &addr, &BTreeMap::new())?;
        self.processes.push(process);
        self.start(id)?;
        self.save()?;
        Ok((id, addr))
    }

    /// `host:port,...` of every controller, for `DROVER_CONTROLLERS`.
    pub fn addresses(&self) -> String {
        self.processes
            .iter()
            .filter(|p| p.role == "controller")
            .map(|p| p.address.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until a leader has committed the cluster configuration (submissions are accepted).
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<u64> {
        let client = self.client()?.with_deadline(Duration::from_millis(500));
        let start = Instant::now();
        loop {
            if let Ok(status) = client.cluster_status().await {
                let leader = status.replicas.iter().find(|r| r.role == "leader");
                if let Some(leader) = leader
                    && status.next_job_id > 0
                    && leader.applied_index >= 2
                {
                    return Ok(leader.id);
                }
            }
            if start.elapsed() > timeout {
                bail!(
                    "the local cluster in {} did not elect a leader within {timeout:?}; see the controller logs there",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every process (SIGTERM, then SIGKILL after 5 s) and removes `cluster.json`.
    pub fn down(&mut self) -> anyhow::Result<()> {
        for process in &mut self.processes {
            if let Some(pid) = process.pid.take() {
                // SAFETY: kill(2) on a recorded pid.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                if !wait_gone(pid, Duration::from_secs(5)) {
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    wait_gone(pid, Duration::from_secs(5));
                }
            }
        }
        // Tasks run under supervisors that outlive their agent by design; a cluster going down takes them too.
        for process in self.processes.iter().filter(|p| p.role == "agent") {
            kill_tasks(&process.data_dir.join("tasks"));
        }
        let _ = std::fs::remove_file(self.dir.join("cluster.json"));
        self.remove_cgroups();
        Ok(())
    }

    /// Removes the agents' job cgroups (best effort: a cgroup goes only once its processes have): v2's tree, or
    /// each v1 hierarchy the agents use (memory, cpuacct for CPU time, cpuset for pinning).
    fn remove_cgroups(&self) {
        let tree = format!("drover-local/{:016x}", fnv1a(self.dir.display().to_string().as_bytes()));
        let v1 = ["memory", "cpuacct", "cpu,cpuacct", "cpuset"].map(|h| format!("/sys/fs/cgroup/{h}"));
        for mount in std::iter::once("/sys/fs/cgroup".to_string()).chain(v1) {
            remove_cgroup_tree(&Path::new(&mount).join(&tree));
        }
    }
}

fn bin_name(role: &str) -> &'static str {
    match role {
        "agent" => "drover-agent",
        "authd" => "drover-authd",
        "relayd" => "drover-relayd",
        _ => "drover-controller",
    }
}

/// `127.A.B.` for a cluster whose processes get addresses of their own: A.B from [`next_random`] (clock, process id),
/// so clusters of concurrent tests do not share addresses (and a test's firewall rules touch only its own).
fn random_ip_base() -> String {
    let mix = next_random();
    format!("127.{}.{}.", 64 + (mix >> 8) % 128, mix % 256)
}

/// The loopback address local processes listen on and their certificates name.
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
/// The authd's entry in `cluster.json`.
const AUTHD_ID: u64 = 90;
/// The relay's entry in `cluster.json`.
const RELAY_ID: u64 = 91;

/// Async workers for each of `replicas` controllers on this one host: the host's cores split between them, at least
/// one each. With a worker per core each, three replicas on two cores committed 9,024-9,213 submissions/s at 64
/// clients; with one each, 9,524-9,678/s (`drover-bench submit --client-threads 2`, same session).
pub fn worker_share(replicas: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / replicas.max(1)).max(1)
}

/// `[security]` for a controller's or an agent's configuration.
fn security_section(pki: &crate::pki::Pki, cert: &Path, key: &Path) -> String {
    format!(
        "\n[security]\nkey_file = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
        pki.cluster_key_path().display().to_string(),
        pki.ca_path().display().to_string(),
        cert.display().to_string(),
        key.display().to_string()
    )
}

/// Merges `extra` into `base`: tables merge key by key, anything else in `extra` replaces what `base` had.
fn merge_tables(base: &mut toml::Table, extra: toml::Table) {
    for (key, value) in extra {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge_tables(b, e),
            (_, value) => drop(base.insert(key, value)),
        }
    }
}

/// "Powers off" a local node, as a BMC would: SIGKILLs its agent and every task and supervisor on it.
pub fn fence_node(cluster: &mut LocalCluster, node: &str) -> anyhow::Result<()> {
    let (_, id) =
        cluster.agents().into_iter().find(|(name, _)| name == node).with_context(|| format!("no node {node}"))?;
    let tasks = cluster.process(id).context("the node's agent")?.data_dir.join("tasks");
    cluster.kill(id)?;
    kill_tasks(&tasks);
    Ok(())
}

/// Kills every task (by process group) and supervisor recorded under an agent's task directory.
pub fn kill_tasks(tasks_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(tasks_dir) else { return };
    for entry in entries.flatten() {
        let first_numbers = |file: &str| -> Vec<i32> {
            std::fs::read_to_string(entry.path().join(file))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        };
        if let [_, pgid, ..] = first_numbers("task.pid")[..]
            && pgid > 1
        {
            // SAFETY: kill(2) on a process group this cluster's agent recorded.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        if let [pid, ..] = first_numbers("supervisor.pid")[..]
            && pid > 1
        {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if self.kill_on_drop {
            for process in &mut self.processes {
                if let Some(pid) = process.pid.take() {
                    // SAFETY: kill(2) on a pid we started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
                if process.role == "agent" {
                    kill_tasks(&process.data_dir.join("tasks"));
                }
            }
            self.remove_cgroups();
        }
    }
}

/// rmdir of a cgroup directory and the cgroups below it, deepest first (cgroup files need no deleting).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Whether `pid` exited within `timeout`.
/// Waits until every thread of `pid` is stopped (state `T` in /proc), or `timeout`.
fn wait_stopped(pid: u32, timeout: Duration) -> bool {
    let stopped = |stat: &str| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with(['T', 't']));
    let start = Instant::now();
    while start.elapsed() < timeout {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
        let all = tasks
            .flatten()
            .all(|task| std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| stopped(&stat)));
        if all {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
            .unwrap_or(false);
        if !alive || zombie {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A stable 64-bit hash (FNV-1a) of a cluster's directory, to name its cgroups.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Whether replica `id`, just restarted, is back in a settled cluster, judged from one `cluster status` (each
/// member's own report): a majority of the members answered, every one that answered follows one leader in one
/// term, and `id` has applied within `lag` entries of that leader. Agreement matters: a leader restarted within
/// its lease comes back claiming its old term while the others are already campaigning, and restarting the next
/// replica then would leave no quorum (the rolling upgrades found that).
pub fn rejoined(status: &drover_client::ClusterStatusReply, id: u64, lag: u64) -> bool {
    let answered: Vec<_> = status.replicas.iter().filter(|r| r.reachable).collect();
    let Some(me) = answered.iter().find(|r| r.id == id) else { return false };
    let Some(leader) = answered.iter().find(|r| r.role == "leader" && r.id == me.leader_id) else { return false };
    answered.len() * 2 > status.replicas.len()
        && answered.iter().all(|r| r.has_leader && r.leader_id == leader.id && r.term == leader.term)
        && me.applied_index + lag >= leader.applied_index
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local cluster's ports come from below the ephemeral range, where no outgoing connection can take one
    /// between the check and the process's own bind; each is free, and two calls rarely agree.
    #[test]
    fn local_cluster_ports_are_free_and_below_the_ephemeral_range() {
        let (low, _) = ephemeral_ports();
        assert!(low > MIN_LOCAL_PORT, "this host's ephemeral range starts at {low}: nothing to test");
        let ports: Vec<u16> = (0..16).map(|_| free_port("127.0.0.1").unwrap()).collect();
        for port in &ports {
            assert!((MIN_LOCAL_PORT..low).contains(port), "{port} is not below the ephemeral range ({low})");
            TcpListener::bind(("127.0.0.1", *port)).unwrap();
        }
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert!(distinct.len() > 8, "{ports:?}");
    }
}

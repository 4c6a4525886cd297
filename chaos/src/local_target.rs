//! The local target: a cluster of real processes on this machine (`drover local up`), each replica and agent on
//! its own loopback address so that iptables can cut exactly one of them off. Faults are real: signals, firewall
//! rules (also random loss through iptables' `statistic` match), tc netem for latency where the kernel has it,
//! and a data disk that really fills (each replica's data directory is its own small tmpfs in disk drills).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use drover_testkit::local::{LocalCluster, UpOptions};

use crate::drill::{Build, ClusterShape};
use crate::target::{FaultId, Member, Target, TargetError, TargetResult};

/// The size of each replica's data disk in disk drills: room for a drill's log and snapshots, small enough
/// to fill in a moment.
const DATA_DISK_BYTES: u64 = 256 << 20;

pub struct LocalTarget {
    cluster: LocalCluster,
    /// The iptables rules (and tc setups, disk fillers) of each fault still in place.
    faults: BTreeMap<FaultId, Vec<Undo>>,
    next_fault: u64,
    /// Data directories mounted as their own tmpfs (unmounted at teardown).
    mounts: Vec<PathBuf>,
    shared: PathBuf,
}

/// How to undo one piece of a fault.
enum Undo {
    /// `iptables -D` these arguments.
    Rule(Vec<String>),
    /// `tc qdisc del dev lo root`.
    Netem,
    /// Remove the file that fills a disk.
    Filler(PathBuf),
}

fn failed(what: impl Into<String>, message: impl std::fmt::Display) -> TargetError {
    TargetError::Failed { what: what.into(), message: message.to_string() }
}

fn run(program: &str, args: &[String]) -> TargetResult<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| failed(format!("{program} {}", args.join(" ")), format!("{e} (is {program} installed?)")))?;
    if !out.status.success() {
        return Err(failed(format!("{program} {}", args.join(" ")), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

impl LocalTarget {
    /// Brings up a cluster of `shape` under `dir` (distinct addresses, so faults can single a process out).
    /// `disk_drill`: each replica's data directory is mounted as its own small tmpfs first.
    pub fn up(dir: &Path, shape: &ClusterShape, disk_drill: bool) -> TargetResult<LocalTarget> {
        let out = Command::new("iptables").args(["-L", "INPUT", "-n"]).output();
        if !out.is_ok_and(|o| o.status.success()) {
            return Err(failed(
                "iptables -L",
                "network faults need iptables and root (apt-get install iptables; run as root)",
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| failed(format!("creating {}", dir.display()), e))?;
        // The cluster records canonical paths; the mounts are compared with them.
        let dir = &dir.canonicalize().map_err(|e| failed(format!("resolving {}", dir.display()), e))?;
        let mut mounts = Vec::new();
        if disk_drill {
            for id in 1..=shape.controllers as u64 + 2 {
                // Where `LocalCluster::up` (under `dir/cluster`) puts each replica's data.
                let data = dir.join("cluster").join(format!("controller-{id}")).join("data");
                std::fs::create_dir_all(&data).map_err(|e| failed(format!("creating {}", data.display()), e))?;
                run(
                    "mount",
                    &[
                        "-t".into(),
                        "tmpfs".into(),
                        "-o".into(),
                        format!("size={DATA_DISK_BYTES}"),
                        "tmpfs".into(),
                        data.display().to_string(),
                    ],
                )?;
                mounts.push(data);
            }
        }
        let options = UpOptions {
            controllers: shape.controllers,
            agents: shape.agents,
            gpus_per_agent: shape.gpus_per_agent,
            distinct_ips: true,
            node_timeout_ms: shape.node_timeout_ms,
            agent_fence_after_ms: shape.agent_fence_after_ms,
            // Heartbeats several times per fence period, so a healthy agent never fences by bad luck.
            agent_heartbeat_ms: (shape.agent_fence_after_ms / 6).max(100),
            kill_wait_ms: 1_000,
            binaries: match shape.build {
                Build::Current => None,
                Build::Previous => Some(
                    drover_testkit::previous::binaries()
                        .map_err(|e| failed("building the previous release", format!("{e:#}")))?,
                ),
            },
            ..UpOptions::default()
        };
        let cluster =
            LocalCluster::up(&dir.join("cluster"), options).map_err(|e| failed("local up", format!("{e:#}")))?;
        let shared = dir.join("shared");
        std::fs::create_dir_all(&shared).map_err(|e| failed(format!("creating {}", shared.display()), e))?;
        std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .map_err(|e| failed("chmod shared", e))?;
        Ok(LocalTarget { cluster, faults: BTreeMap::new(), next_fault: 1, mounts, shared })
    }

    pub fn cluster(&self) -> &LocalCluster {
        &self.cluster
    }

    fn id_of(&self, member: &Member) -> TargetResult<u64> {
        match member {
            Member::Replica(id) if self.cluster.process(*id).is_some_and(|p| p.role == "controller") => Ok(*id),
            Member::Agent(name) => self
                .cluster
                .agents()
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, id)| id)
                .ok_or_else(|| TargetError::Unknown(member.clone())),
            _ => Err(TargetError::Unknown(member.clone())),
        }
    }

    fn ip_of(&self, member: &Member) -> TargetResult<String> {
        Ok(self.cluster.ip_of(match member {
            Member::Replica(id) => 10 + self.id_of(member).map(|_| *id)?,
            Member::Agent(_) => self.id_of(member)?,
        }))
    }

    /// The /24 every member's address is in (`127.A.B.0/24`).
    fn subnet(&self) -> String {
        let ip = self.cluster.ip_of(0);
        format!("{}0/24", ip.strip_suffix('0').unwrap_or(&ip))
    }

    fn add_rules(&mut self, rules: Vec<Vec<String>>) -> TargetResult<FaultId> {
        let id = FaultId(self.next_fault);
        self.next_fault += 1;
        let mut undo = Vec::new();
        for rule in rules {
            let mut args = vec!["-I".to_string()];
            args.extend(rule.iter().cloned());
            if let Err(e) = run("iptables", &args) {
                self.faults.insert(id, undo);
                let _ = self.heal(id);
                return Err(e);
            }
            undo.push(Undo::Rule(rule));
        }
        self.faults.insert(id, undo);
        Ok(id)
    }

    fn signal(&mut self, member: &Member, signal: i32) -> TargetResult<()> {
        let id = self.id_of(member)?;
        self.cluster.signal(id, signal).map_err(|e| failed(format!("signalling {member}"), format!("{e:#}")))
    }
}

fn drop_rule(source: Option<&str>, destination: Option<&str>, extra: &[&str]) -> Vec<String> {
    let mut rule = vec!["INPUT".to_string()];
    if let Some(s) = source {
        rule.extend(["-s".into(), s.to_string()]);
    }
    if let Some(d) = destination {
        rule.extend(["-d".into(), d.to_string()]);
    }
    rule.extend(extra.iter().map(|s| s.to_string()));
    rule.extend(["-j".into(), "DROP".into()]);
    rule
}

/// Takes every free block of the filesystem `path` is on: one allocation of what statvfs says is free, then 4 KiB
/// writes until the disk refuses one (what is left then is below a page), so the replica's next write fails.
fn fill(path: &Path) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs fills the struct we own from a NUL-terminated path.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_dir.as_ptr(), &mut vfs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let free = vfs.f_bavail as u64 * vfs.f_frsize as u64;
    let mut file = std::fs::File::create(path)?;
    // Leave a little for the crumbs below to find the exact end (the filler's own metadata takes some).
    let bulk = free.saturating_sub(1 << 20);
    if bulk > 0 {
        // SAFETY: fallocate on a file we own; real blocks, unlike set_len's hole.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bulk as i64) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    let mut end = bulk;
    let page = [0u8; 4096];
    // Bounded: 1 MiB and the slack of the estimate are a few hundred pages.
    for _ in 0..100_000 {
        use std::io::Seek as _;
        file.seek(std::io::SeekFrom::Start(end))?;
        if file.write_all(&page).and_then(|_| file.sync_data()).is_err() {
            break;
        }
        end += page.len() as u64;
    }
    Ok(())
}

impl Target for LocalTarget {
    fn replicas(&self) -> Vec<u64> {
        self.cluster.processes.iter().filter(|p| p.role == "controller").map(|p| p.id).collect()
    }

    fn agents(&self) -> Vec<String> {
        self.cluster.agents().into_iter().map(|(name, _)| name).collect()
    }

    fn replica_addresses(&self) -> Vec<(u64, String)> {
        self.cluster.processes.iter().filter(|p| p.role == "controller").map(|p| (p.id, p.address.clone())).collect()
    }

    fn client_config(&self) -> PathBuf {
        self.cluster.dir.join("client.toml")
    }

    fn shared_dir(&self) -> PathBuf {
        self.shared.clone()
    }

    fn kill(&mut self, member: &Member) -> TargetResult<()> {
        self.signal(member, libc::SIGKILL)
    }

    fn stop(&mut self, member: &Member) -> TargetResult<()> {
        self.signal(member, libc::SIGTERM)
    }

    fn start(&mut self, member: &Member) -> TargetResult<()> {
        let id = self.id_of(member)?;
        if self.is_running(member) {
            return Ok(());
        }
        self.cluster.start(id).map_err(|e| failed(format!("starting {member}"), format!("{e:#}")))?;
        self.cluster.save().map_err(|e| failed("saving cluster.json", format!("{e:#}")))
    }

    fn set_build(&mut self, member: &Member, previous: bool) -> TargetResult<()> {
        let id = self.id_of(member)?;
        let name = if matches!(member, Member::Agent(_)) { "drover-agent" } else { "drover-controller" };
        let dir = if previous {
            drover_testkit::previous::binaries()
                .map_err(|e| failed("building the previous release", format!("{e:#}")))?
        } else {
            let this = drover_testkit::local::find_binary(name).map_err(|e| failed("finding this build", e))?;
            this.parent().expect("a binary's directory").to_path_buf()
        };
        self.cluster.set_binary(id, Some(dir.join(name))).map_err(|e| failed(format!("setting {member}'s build"), e))
    }

    fn is_running(&self, member: &Member) -> bool {
        let Ok(id) = self.id_of(member) else { return false };
        let Some(pid) = self.cluster.process(id).and_then(|p| p.pid) else { return false };
        // A process that exited but is not reaped yet is a zombie: not running.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        state.is_some_and(|s| s != 'Z' && s != 'X')
    }

    fn pause(&mut self, member: &Member) -> TargetResult<()> {
        self.signal(member, libc::SIGSTOP)
    }

    fn resume(&mut self, member: &Member) -> TargetResult<()> {
        self.signal(member, libc::SIGCONT)
    }

    fn isolate(&mut self, member: &Member) -> TargetResult<FaultId> {
        let ip = self.ip_of(member)?;
        self.add_rules(vec![drop_rule(Some(&ip), None, &[]), drop_rule(None, Some(&ip), &[])])
    }

    fn block(&mut self, from: &[Member], to: &[Member]) -> TargetResult<FaultId> {
        let mut rules = Vec::new();
        for a in from {
            let a = self.ip_of(a)?;
            for b in to {
                rules.push(drop_rule(Some(&a), Some(&self.ip_of(b)?), &[]));
            }
        }
        self.add_rules(rules)
    }

    fn loss(&mut self, percent: u32) -> TargetResult<FaultId> {
        let subnet = self.subnet();
        let probability = format!("{:.4}", percent as f64 / 100.0);
        let extra = ["-m", "statistic", "--mode", "random", "--probability", probability.as_str()];
        self.add_rules(vec![drop_rule(Some(&subnet), Some(&subnet), &extra)])
    }

    fn delay(&mut self, delay: Duration, jitter: Duration) -> TargetResult<FaultId> {
        // A prio qdisc on lo whose third band adds the latency, and a filter that sends only this cluster's
        // packets there: other programs on the machine keep their loopback speed.
        let subnet = self.subnet();
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        run("tc", &args("qdisc add dev lo root handle 1: prio")).map_err(|e| {
            failed("tc", format!("{e}; this kernel has no prio qdisc (sch_prio), so latency cannot be added here"))
        })?;
        let id = FaultId(self.next_fault);
        self.next_fault += 1;
        self.faults.insert(id, vec![Undo::Netem]);
        let netem = format!(
            "qdisc add dev lo parent 1:3 handle 30: netem delay {}ms {}ms",
            delay.as_millis(),
            jitter.as_millis()
        );
        if let Err(e) = run("tc", &args(&netem)) {
            let _ = self.heal(id);
            return Err(failed(
                "tc netem",
                format!("{e}; this kernel has no netem qdisc (module sch_netem), so latency cannot be added here"),
            ));
        }
        let filter = format!("filter add dev lo parent 1:0 protocol ip prio 1 u32 match ip dst {subnet} flowid 1:3");
        if let Err(e) = run("tc", &args(&filter)) {
            let _ = self.heal(id);
            return Err(e);
        }
        Ok(id)
    }

    fn fill_disk(&mut self, replica: u64) -> TargetResult<FaultId> {
        let member = Member::Replica(replica);
        self.id_of(&member)?;
        let data = self.cluster.process(replica).map(|p| p.data_dir.clone()).ok_or(TargetError::Unknown(member))?;
        if !self.mounts.contains(&data) {
            return Err(failed(
                format!("filling replica {replica}'s disk"),
                "its data directory is not a drill disk (the drill must be started with a disk_full fault)",
            ));
        }
        let filler = data.join("drill-filler");
        fill(&filler).map_err(|e| failed(format!("filling {}", data.display()), e))?;
        let id = FaultId(self.next_fault);
        self.next_fault += 1;
        self.faults.insert(id, vec![Undo::Filler(filler)]);
        Ok(id)
    }

    fn heal(&mut self, fault: FaultId) -> TargetResult<()> {
        let mut first_error = None;
        for undo in self.faults.remove(&fault).unwrap_or_default() {
            let result = match undo {
                Undo::Rule(rule) => {
                    let mut args = vec!["-D".to_string()];
                    args.extend(rule);
                    run("iptables", &args)
                }
                Undo::Netem => run("tc", &["qdisc".into(), "del".into(), "dev".into(), "lo".into(), "root".into()]),
                Undo::Filler(path) => {
                    std::fs::remove_file(&path).map_err(|e| failed(format!("removing {}", path.display()), e))
                }
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn spawn_replica(&mut self) -> TargetResult<(u64, String)> {
        self.cluster.spawn_extra().map_err(|e| failed("starting a new replica", format!("{e:#}")))
    }

    fn retire_replica(&mut self, id: u64) -> TargetResult<()> {
        self.cluster.kill(id).map_err(|e| failed(format!("stopping replica {id}"), format!("{e:#}")))?;
        self.cluster.processes.retain(|p| p.id != id);
        self.cluster.save().map_err(|e| failed("saving cluster.json", format!("{e:#}")))
    }

    fn teardown(&mut self) -> TargetResult<()> {
        let faults: Vec<FaultId> = self.faults.keys().copied().collect();
        for fault in faults {
            let _ = self.heal(fault);
        }
        // Paused processes cannot take a SIGTERM: wake them first.
        for p in self.cluster.processes.iter().filter_map(|p| p.pid) {
            // SAFETY: kill(2) on a pid this cluster started.
            unsafe { libc::kill(p as i32, libc::SIGCONT) };
        }
        let result = self.cluster.down().map_err(|e| failed("local down", format!("{e:#}")));
        for mount in self.mounts.drain(..) {
            let _ = run("umount", &["-l".into(), mount.display().to_string()]);
        }
        result
    }
}

impl Drop for LocalTarget {
    fn drop(&mut self) {
        // Never leave firewall rules or a netem qdisc behind, whatever happened to the drill.
        let _ = self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_disk_refuses_the_next_write_and_takes_it_again_once_freed() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: mounting a tmpfs needs root (CI runs as root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().display().to_string();
        run("mount", &["-t".into(), "tmpfs".into(), "-o".into(), "size=16m".into(), "tmpfs".into(), mount.clone()])
            .unwrap();
        let filler = dir.path().join("filler");
        let filled = fill(&filler);
        let write = std::fs::write(dir.path().join("next"), vec![1u8; 8192]);
        std::fs::remove_file(&filler).unwrap();
        let after = std::fs::write(dir.path().join("after"), vec![1u8; 8192]);
        run("umount", &["-l".into(), mount]).unwrap();
        filled.unwrap();
        let err = write.expect_err("a full disk takes no more");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        after.expect("freed, it takes writes again");
    }
}

//! Job cgroups: each job's tasks on a node share one cgroup per hierarchy, as Slurm's task/cgroup plugin does, for
//! three things:
//! - memory confinement: the cgroup's limit is the job's share of the node (`--mem`, `--mem-per-cpu`,
//!   `--mem-per-gpu`); a task that goes over it is killed by the kernel's OOM killer and the job ends
//!   OUT_OF_MEMORY;
//! - CPU pinning: the job's tasks run only on as many CPUs as the job holds on the node (a cpuset), chosen by the
//!   agent among the CPUs no other job here is pinned to ([`choose_cpus`]);
//! - usage accounting: the cgroup counts the CPU time and the peak memory of every process of the job, including
//!   the ones that left the task's process group, so sacct's `TotalCPU`, `MaxRSS` and `TRESUsageIn*` are the
//!   kernel's figures ([`job_usage`]).
//!
//! Both hierarchies are supported, because hosts still run either: cgroup v2 (one unified tree, the memory and
//! cpuset controllers enabled in `cgroup.subtree_control`; CPU time is in every cgroup's `cpu.stat`) and cgroup
//! v1, where memory, cpuacct and cpuset are hierarchies of their own, each with its own directory for the job. The
//! agent picks at start ([`detect`], [`enable_cpuset`]); where there is no memory hierarchy it can write (not
//! root, a read-only /sys) nothing is confined or measured, and the agent says so once in its log. CPU pinning is
//! optional on top: without a cpuset hierarchy, or when a job holds more CPUs than are free to pin, its tasks run
//! unpinned (one warning), never failed for it.
//!
//! Devices: GPU device files are simulated on the nodes this runs on, so jobs are not confined to their GPUs'
//! device files. Where real ones exist, it would go here, beside the cpuset: on v1 the `devices` hierarchy
//! (`devices.deny` of `c 195:* rwm` for every NVIDIA GPU, then `devices.allow` of the job's `/dev/nvidiaN`, plus
//! `nvidiactl`/`nvidia-uvm`), on v2 a BPF_PROG_TYPE_CGROUP_DEVICE program attached to the job's cgroup (v2 has no
//! devices files). Until then GPUs are kept apart by `CUDA_VISIBLE_DEVICES` alone.
//!
//! Layout: `ROOT/job_ID.INCARNATION/` in each hierarchy, where ROOT is `drover` (the agent's `memory_cgroup`)
//! under `/sys/fs/cgroup` (v2) or under each v1 hierarchy's mount. The agent creates the job's cgroups (with the
//! limit and the CPUs) before it starts a task, the supervisor makes sure they exist and moves the task into them
//! between fork and exec (writing `0`, "myself", to each `cgroup.procs`), so no byte the task allocates and no
//! cycle it spends escapes them. The agent reads the job's usage when the job ends on the node, and removes its
//! cgroups once the controllers no longer list the job there ([`remove_job`]): the counters live as long as the
//! cgroup, so it must outlive every task of the job on the node, not just the latest.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use drover_state::MeasuredUsage;

/// Which hierarchy holds the job's memory cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Hierarchy {
    V2,
    V1Memory,
}

/// Where the agent puts its jobs' cgroups.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupRoot {
    /// The memory root (on v2 the only one: every controller is there).
    pub path: PathBuf,
    pub hierarchy: Hierarchy,
    /// v1 only: the root in the cpuacct hierarchy, which counts CPU time (`None` on v2, or where v1 has no
    /// cpuacct hierarchy: then CPU time is not measured).
    #[serde(default)]
    pub cpuacct: Option<PathBuf>,
    /// Where jobs are pinned to CPUs: `path` itself on v2 (the cpuset controller enabled), the root in the cpuset
    /// hierarchy on v1; `None`: jobs are not pinned on this node.
    #[serde(default)]
    pub cpuset: Option<PathBuf>,
}

const V2_MOUNT: &str = "/sys/fs/cgroup";
const V1_MEMORY_MOUNT: &str = "/sys/fs/cgroup/memory";
/// The default `memory_cgroup`: the directory under each mount that holds every job's cgroup.
pub const DEFAULT_SUBDIR: &str = "drover";
/// CPU ids above this are refused as malformed (a cpuset file naming `0-4294967295` must not allocate 4 G ids).
const MAX_CPU_ID: u32 = 1 << 16;

/// Why memory cannot be enforced, or jobs cannot be pinned to CPUs, on this host (the agent then runs jobs
/// without it and says so).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("memory_cgroup {0:?} must be a relative path inside the cgroup mount")]
    BadSubdir(String),
    #[error("no cgroup v2 memory controller at /sys/fs/cgroup and no cgroup v1 memory hierarchy")]
    NoMemoryController,
    #[error("the cgroup v2 tree has no cpuset controller")]
    NoCpusetController,
    #[error("there is no cgroup v1 cpuset hierarchy")]
    NoCpusetHierarchy,
    #[error("cannot {action} {}: {cause}", path.display())]
    Prepare { action: &'static str, path: PathBuf, cause: io::Error },
}

/// Why one job's tasks stay unpinned on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    #[error("the node's CPUs cannot be read from its cpuset")]
    NoPool,
    #[error("it holds {wanted} CPUs here but only {free} of the {all} CPUs the node can pin are free")]
    TooFewFree { wanted: usize, free: usize, all: usize },
}

/// Finds a usable memory cgroup hierarchy (v2 at /sys/fs/cgroup, else v1's memory hierarchy) and creates
/// `subdir` in it (a relative path; `drover` by default, one per agent where several share a host), and on v1
/// also in the cpuacct hierarchy, for CPU time. `Err` says why memory cannot be enforced on this host.
pub fn detect(subdir: &str) -> Result<CgroupRoot, CgroupError> {
    let relative = Path::new(subdir);
    if subdir.is_empty() || relative.is_absolute() || relative.components().any(|c| c.as_os_str() == "..") {
        return Err(CgroupError::BadSubdir(subdir.to_string()));
    }
    let v2_controllers = fs::read_to_string(Path::new(V2_MOUNT).join("cgroup.controllers")).unwrap_or_default();
    let (mount, hierarchy) = if v2_controllers.split_whitespace().any(|c| c == "memory") {
        (Path::new(V2_MOUNT), Hierarchy::V2)
    } else if Path::new(V1_MEMORY_MOUNT).join("memory.limit_in_bytes").exists() {
        (Path::new(V1_MEMORY_MOUNT), Hierarchy::V1Memory)
    } else {
        return Err(CgroupError::NoMemoryController);
    };
    let mut root = CgroupRoot { path: mount.join(relative), hierarchy, cpuacct: None, cpuset: None };
    prepare_root(mount, &root).map_err(|cause| CgroupError::Prepare {
        action: "prepare the memory cgroup",
        path: root.path.clone(),
        cause,
    })?;
    if hierarchy == Hierarchy::V1Memory {
        // CPU time is measured where the host has the hierarchy; memory works without it.
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        root.cpuacct = v1_mount(&mounts, "cpuacct").and_then(|mount| {
            let path = mount.join(relative);
            fs::create_dir_all(&path).ok().map(|()| path)
        });
    }
    Ok(root)
}

/// Turns CPU pinning on for `root` (made by [`detect`] with the same `subdir`): on v2 the cpuset controller is
/// enabled from the mount down to the root; on v1 the root is made in the cpuset hierarchy, each new level given
/// its parent's CPUs and memory nodes (a v1 cpuset without them cannot hold a process). `Err` says why jobs cannot
/// be pinned on this host.
pub fn enable_cpuset(root: &mut CgroupRoot, subdir: &str) -> Result<(), CgroupError> {
    match root.hierarchy {
        Hierarchy::V2 => {
            let controllers = fs::read_to_string(Path::new(V2_MOUNT).join("cgroup.controllers")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "cpuset") {
                return Err(CgroupError::NoCpusetController);
            }
            enable_down(Path::new(V2_MOUNT), &root.path, "cpuset").map_err(|cause| CgroupError::Prepare {
                action: "enable the cpuset controller down to",
                path: root.path.clone(),
                cause,
            })?;
            root.cpuset = Some(root.path.clone());
        }
        Hierarchy::V1Memory => {
            let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
            let mount = v1_mount(&mounts, "cpuset").ok_or(CgroupError::NoCpusetHierarchy)?;
            let path = mount.join(subdir);
            prepare_v1_cpuset(&mount, &path).map_err(|cause| CgroupError::Prepare {
                action: "prepare the cpuset cgroup",
                path: path.clone(),
                cause,
            })?;
            root.cpuset = Some(path);
        }
    }
    Ok(())
}

/// The mount point of the v1 hierarchy that has `controller`, from `/proc/self/mounts` text (`cgroup
/// /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0`: co-mounted controllers count).
fn v1_mount(mounts: &str, controller: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, dir, "cgroup", options, ..] if options.split(',').any(|o| o == controller) => {
                Some(PathBuf::from(unescape_mount(dir)))
            }
            _ => None,
        }
    })
}

/// `/proc/mounts` writes a space in a path as `\040` (and tab, newline, backslash alike).
fn unescape_mount(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// Creates the root and, on v2, enables the memory controller on every level from the mount down to it, so the
/// jobs' cgroups below it have one.
fn prepare_root(mount: &Path, root: &CgroupRoot) -> io::Result<()> {
    fs::create_dir_all(&root.path)?;
    if root.hierarchy == Hierarchy::V2 {
        enable_down(mount, &root.path, "memory")?;
    }
    Ok(())
}

/// Enables `controller` in `cgroup.subtree_control` of the mount and of every level down to `root` (v2).
fn enable_down(mount: &Path, root: &Path, controller: &str) -> io::Result<()> {
    let mut dir = mount.to_path_buf();
    enable(&dir, controller)?;
    let below = root.strip_prefix(mount).map_err(|_| io::Error::other("the root is not under its mount"))?;
    for part in below.components() {
        dir.push(part);
        enable(&dir, controller)?;
    }
    Ok(())
}

fn enable(dir: &Path, controller: &str) -> io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control)?;
    if enabled.split_whitespace().any(|c| c == controller) {
        return Ok(());
    }
    fs::write(&control, format!("+{controller}"))
}

/// Creates the v1 cpuset root level by level, each new level getting its parent's CPUs and memory nodes.
fn prepare_v1_cpuset(mount: &Path, root: &Path) -> io::Result<()> {
    let below = root.strip_prefix(mount).map_err(|_| io::Error::other("the root is not under its mount"))?;
    let mut dir = mount.to_path_buf();
    for part in below.components() {
        let parent = dir.clone();
        dir.push(part);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        inherit_if_empty(&dir, &parent, "cpuset.cpus")?;
        inherit_if_empty(&dir, &parent, "cpuset.mems")?;
    }
    Ok(())
}

/// Copies a cpuset file from the parent when the child's is still empty (a fresh v1 cpuset has none).
fn inherit_if_empty(dir: &Path, parent: &Path, file: &str) -> io::Result<()> {
    if !fs::read_to_string(dir.join(file))?.trim().is_empty() {
        return Ok(());
    }
    fs::write(dir.join(file), fs::read_to_string(parent.join(file))?.trim())
}

/// The name of a job incarnation's cgroup in every hierarchy.
fn job_name(job: u64, incarnation: u64) -> String {
    format!("job_{job}.{incarnation}")
}

/// The job and incarnation a cgroup directory name stands for.
fn parse_job_name(name: &str) -> Option<(u64, u64)> {
    let (job, incarnation) = name.strip_prefix("job_")?.split_once('.')?;
    Some((job.parse().ok()?, incarnation.parse().ok()?))
}

/// A job's cgroups on this node: the directories its tasks join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    /// The memory cgroup; on v2 the job's only one, which is also its cpuset and counts its CPU time.
    pub memory: PathBuf,
    /// v1: the job's cpuacct cgroup, where the host has the hierarchy.
    pub cpuacct: Option<PathBuf>,
    /// v1: the job's cpuset cgroup, when it is pinned. Joining it may fail without failing the task.
    pub cpuset: Option<PathBuf>,
    /// Why the job is not pinned although CPUs were asked for (the cpuset could not be written).
    pub unpinned: Option<String>,
}

impl JobCgroup {
    /// The cgroups a task must join before it runs (memory, and on v1 cpuacct); the v1 cpuset is apart.
    pub fn required(&self) -> Vec<&Path> {
        std::iter::once(self.memory.as_path()).chain(self.cpuacct.as_deref()).collect()
    }
}

/// The job's cgroups on this node, created if missing: the memory limit set when `limit_mb` > 0, and the tasks
/// pinned to `cpus` when not empty and the root pins (a cpuset that cannot be written leaves the job unpinned and
/// says why in `unpinned`). Idempotent: the agent calls it before starting a task and the task's supervisor again
/// (it runs also without an agent), with the same figures.
pub fn create_job(root: &CgroupRoot, job: u64, incarnation: u64, limit_mb: u64, cpus: &[u32]) -> io::Result<JobCgroup> {
    let name = job_name(job, incarnation);
    let memory = root.path.join(&name);
    create_dir(&memory)?;
    if limit_mb > 0 {
        let bytes = limit_mb.saturating_mul(1 << 20).to_string();
        match root.hierarchy {
            Hierarchy::V2 => {
                fs::write(memory.join("memory.max"), &bytes)?;
                // No swap beyond the limit either, where the host has swap accounting.
                let _ = fs::write(memory.join("memory.swap.max"), "0");
            }
            Hierarchy::V1Memory => {
                fs::write(memory.join("memory.limit_in_bytes"), &bytes)?;
                // memsw (memory + swap) must be at least the memory limit; absent without swap accounting.
                let _ = fs::write(memory.join("memory.memsw.limit_in_bytes"), &bytes);
            }
        }
    }
    let cpuacct = match &root.cpuacct {
        Some(base) => {
            let dir = base.join(&name);
            create_dir(&dir)?;
            Some(dir)
        }
        None => None,
    };
    let mut cgroup = JobCgroup { memory, cpuacct, cpuset: None, unpinned: None };
    if let (Some(base), false) = (&root.cpuset, cpus.is_empty()) {
        let list = format_cpu_list(cpus);
        let pinned = match root.hierarchy {
            Hierarchy::V2 => fs::write(cgroup.memory.join("cpuset.cpus"), &list).map(|()| None),
            Hierarchy::V1Memory => {
                let dir = base.join(&name);
                create_dir(&dir)
                    .and_then(|()| inherit_if_empty(&dir, base, "cpuset.mems"))
                    .and_then(|()| fs::write(dir.join("cpuset.cpus"), &list))
                    .map(|()| Some(dir))
            }
        };
        match pinned {
            Ok(dir) => cgroup.cpuset = dir,
            Err(e) => cgroup.unpinned = Some(format!("cannot pin job {job} to CPUs {list}: {e}")),
        }
    }
    Ok(cgroup)
}

fn create_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// The file a process writes `0` into to join the cgroup.
pub fn procs_file(dir: &Path) -> PathBuf {
    dir.join("cgroup.procs")
}

/// How many times the kernel's OOM killer killed a process in the cgroup.
pub fn oom_kills(dir: &Path, hierarchy: Hierarchy) -> u64 {
    let file = match hierarchy {
        Hierarchy::V2 => "memory.events",
        Hierarchy::V1Memory => "memory.oom_control",
    };
    parse_counter(&fs::read_to_string(dir.join(file)).unwrap_or_default(), "oom_kill").unwrap_or(0)
}

/// The value of `key` in a cgroup file of `key value` lines.
fn parse_counter(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// A file holding one number.
fn read_number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What the job's tasks used on this node so far, from its cgroups' counters; `None` when the job has no cgroup
/// here (it ran nothing here, or the node cannot measure). `sampled_peak_bytes` is the largest `memory.current`
/// the agent saw, used on v2 kernels without `memory.peak` (before 5.19); a figure the host cannot give is `None`.
pub fn job_usage(
    root: &CgroupRoot,
    job: u64,
    incarnation: u64,
    sampled_peak_bytes: Option<u64>,
) -> Option<MeasuredUsage> {
    let name = job_name(job, incarnation);
    let memory = root.path.join(&name);
    if !memory.is_dir() {
        return None;
    }
    let (cpu_ns, peak_bytes) = match root.hierarchy {
        Hierarchy::V2 => {
            let stat = fs::read_to_string(memory.join("cpu.stat")).unwrap_or_default();
            let cpu_ns = parse_counter(&stat, "usage_usec").map(|us| us.saturating_mul(1_000));
            (cpu_ns, read_number(&memory.join("memory.peak")).or(sampled_peak_bytes))
        }
        Hierarchy::V1Memory => {
            let cpu_ns = root.cpuacct.as_ref().and_then(|base| read_number(&base.join(&name).join("cpuacct.usage")));
            (cpu_ns, read_number(&memory.join("memory.max_usage_in_bytes")))
        }
    };
    let usage = MeasuredUsage { cpu_ms: cpu_ns.map(|ns| ns / 1_000_000), mem_peak_kb: peak_bytes.map(|b| b / 1024) };
    (!usage.is_empty()).then_some(usage)
}

/// The job's `memory.current` in bytes, where the agent has to sample it for the peak: v2 without `memory.peak`.
pub fn sample_memory(root: &CgroupRoot, job: u64, incarnation: u64) -> Option<u64> {
    let memory = root.path.join(job_name(job, incarnation));
    if root.hierarchy != Hierarchy::V2 || memory.join("memory.peak").exists() {
        return None;
    }
    read_number(&memory.join("memory.current"))
}

/// Every job incarnation that has a cgroup under this root, in any hierarchy.
pub fn job_keys(root: &CgroupRoot) -> BTreeSet<(u64, u64)> {
    let bases = std::iter::once(&root.path).chain(&root.cpuacct).chain(&root.cpuset);
    bases
        .filter_map(|base| fs::read_dir(base).ok())
        .flatten()
        .filter_map(|entry| parse_job_name(entry.ok()?.file_name().to_str()?))
        .collect()
}

/// Whether process `pid` is in the job's memory cgroup (where every task of the job joins before it runs).
pub fn process_in_job(root: &CgroupRoot, job: u64, incarnation: u64, pid: u32) -> bool {
    let members = fs::read_to_string(procs_file(&root.path.join(job_name(job, incarnation)))).unwrap_or_default();
    members.split_whitespace().any(|p| p.parse() == Ok(pid))
}

/// Whether a process is still in the job's cgroup (in any hierarchy): a task of it, or something one left.
pub fn job_has_processes(root: &CgroupRoot, job: u64, incarnation: u64) -> bool {
    let name = job_name(job, incarnation);
    std::iter::once(&root.path).chain(&root.cpuacct).chain(&root.cpuset).any(|base| {
        fs::read_to_string(procs_file(&base.join(&name)))
            .is_ok_and(|members| members.split_whitespace().next().is_some())
    })
}

/// Removes the job's cgroups in every hierarchy; true once all are gone. A cgroup that still holds a process
/// stays (a task of the job is still running, or a process escaped its kill): it is tried again later.
pub fn remove_job(root: &CgroupRoot, job: u64, incarnation: u64) -> io::Result<bool> {
    let name = job_name(job, incarnation);
    let mut gone = true;
    // The v2 cpuset is the memory cgroup itself; removing it twice is harmless (NotFound counts as gone).
    for base in std::iter::once(&root.path).chain(&root.cpuacct).chain(&root.cpuset) {
        gone &= remove_if_empty(&base.join(&name))?;
    }
    Ok(gone)
}

/// Removes an empty cgroup; false (not an error) while a process is still in it.
pub fn remove_if_empty(dir: &Path) -> io::Result<bool> {
    let members = match fs::read_to_string(procs_file(dir)) {
        Ok(members) => members,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    if members.split_whitespace().next().is_some() {
        return Ok(false);
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        // EBUSY: a process joined meanwhile; the next try removes it.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The CPUs jobs can be pinned to on this node (the cpuset root's effective CPUs), and the CPUs other jobs are
/// pinned to now (every job cgroup but `except`'s). `None` where the root does not pin or its CPUs are unreadable.
pub fn cpu_pool(root: &CgroupRoot, except: (u64, u64)) -> Option<(BTreeSet<u32>, BTreeSet<u32>)> {
    let base = root.cpuset.as_ref()?;
    let effective = match root.hierarchy {
        Hierarchy::V2 => "cpuset.cpus.effective",
        Hierarchy::V1Memory => "cpuset.effective_cpus",
    };
    let all = fs::read_to_string(base.join(effective))
        .or_else(|_| fs::read_to_string(base.join("cpuset.cpus")))
        .ok()
        .and_then(|text| parse_cpu_list(&text))?;
    let mut taken = BTreeSet::new();
    for entry in fs::read_dir(base).ok()?.flatten() {
        let Some(key) = entry.file_name().to_str().and_then(parse_job_name) else { continue };
        if key == except {
            continue;
        }
        // A job cgroup without CPUs of its own (v2: an unpinned job) takes none; an unreadable one is
        // counted as taking nothing rather than blocking every later job.
        let cpus = fs::read_to_string(entry.path().join("cpuset.cpus")).unwrap_or_default();
        taken.extend(parse_cpu_list(&cpus).unwrap_or_default());
    }
    Some((all, taken))
}

/// The CPUs the job's cgroup is pinned to already (a later task of the same job joins the same set).
pub fn pinned_cpus(root: &CgroupRoot, job: u64, incarnation: u64) -> Option<Vec<u32>> {
    let dir = root.cpuset.as_ref()?.join(job_name(job, incarnation));
    let cpus = parse_cpu_list(&fs::read_to_string(dir.join("cpuset.cpus")).ok()?)?;
    (!cpus.is_empty()).then(|| cpus.into_iter().collect())
}

/// What to pin a job's tasks here to: the CPUs its cgroup has already (a later task of the job joins the same
/// set), else `wanted` CPUs chosen ([`choose_cpus`]) among those of `pool` (all the node can pin, those other jobs
/// are pinned to) that nobody has. `Err` says why the job stays unpinned; 0 CPUs wanted is no pinning, no error.
pub fn cpus_to_pin(
    existing: Option<Vec<u32>>,
    pool: Option<(BTreeSet<u32>, BTreeSet<u32>)>,
    wanted: usize,
) -> Result<Vec<u32>, PinError> {
    if wanted == 0 {
        return Ok(Vec::new());
    }
    if let Some(cpus) = existing {
        return Ok(cpus);
    }
    let (all, taken) = pool.ok_or(PinError::NoPool)?;
    let free: BTreeSet<u32> = all.difference(&taken).copied().collect();
    choose_cpus(&free, wanted).ok_or(PinError::TooFewFree { wanted, free: free.len(), all: all.len() })
}

/// Chooses `count` CPUs among `free` for one job, deterministically and as compactly as possible: the smallest
/// run of consecutive free CPUs that holds them all (the lowest one of equal size), so that jobs do not fragment
/// the node and a job's CPUs stay neighbours (shared caches); if no run is long enough, whole runs from the longest
/// down (the lowest first among equals), the last one cut to size. `None` when fewer than `count` are free; an
/// empty set for 0.
pub fn choose_cpus(free: &BTreeSet<u32>, count: usize) -> Option<Vec<u32>> {
    if count > free.len() {
        return None;
    }
    let mut runs: Vec<Vec<u32>> = Vec::new();
    for &cpu in free {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|&last| last + 1 == cpu) => run.push(cpu),
            _ => runs.push(vec![cpu]),
        }
    }
    // min_by_key keeps the first of equals: the lowest run of that size.
    if let Some(run) = runs.iter().filter(|run| run.len() >= count).min_by_key(|run| run.len()) {
        return Some(run[..count].to_vec());
    }
    // Stable sort: among equally long runs, the lower keeps its place first.
    runs.sort_by_key(|run| std::cmp::Reverse(run.len()));
    let mut chosen: Vec<u32> = runs.into_iter().flatten().take(count).collect();
    chosen.sort_unstable();
    Some(chosen)
}

/// A kernel CPU list (`0-3,8,10-11`), as in `cpuset.cpus`; `None` if malformed. Empty text is the empty set.
pub fn parse_cpu_list(text: &str) -> Option<BTreeSet<u32>> {
    let mut cpus = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let cpu = part.trim().parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        if first > last || last > MAX_CPU_ID {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

/// The kernel's CPU list form of `cpus` (sorted, consecutive ones as ranges).
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    drover_common::ranges::format_ranges(&sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> BTreeSet<u32> {
        parse_cpu_list(text).unwrap()
    }

    #[test]
    fn oom_kill_counters_are_read_from_either_hierarchy() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_counter(v2, "oom_kill"), Some(2));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
        assert_eq!(parse_counter(v1, "oom_kill"), Some(1));
        assert_eq!(parse_counter("", "oom_kill"), None, "an old kernel without the counter");
        let cpu_stat = "usage_usec 1534\nuser_usec 1000\nsystem_usec 534\nnr_periods 0\n";
        assert_eq!(parse_counter(cpu_stat, "usage_usec"), Some(1534));
    }

    #[test]
    fn cpu_lists_read_and_write_the_kernels_form() {
        assert_eq!(set("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11].into_iter().collect());
        assert_eq!(set(""), BTreeSet::new(), "an unset cpuset");
        assert_eq!(set("\n"), BTreeSet::new());
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-4294967295"), None, "bounded");
        assert_eq!(parse_cpu_list("a"), None);
        assert_eq!(format_cpu_list(&[11, 0, 1, 2, 3, 8, 10]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn cpus_are_chosen_compactly_and_deterministically() {
        let all = set("0-7");
        assert_eq!(choose_cpus(&all, 2), Some(vec![0, 1]), "the lowest CPUs of an idle node");
        assert_eq!(choose_cpus(&all, 8), Some((0..8).collect()));
        assert_eq!(choose_cpus(&all, 9), None, "more than are free");
        assert_eq!(choose_cpus(&all, 0), Some(vec![]));
        // Free: 1, 3-4, 6-8. Two CPUs go into the smallest run that holds them (3-4), not the first or the lowest.
        let holes = set("1,3-4,6-8");
        assert_eq!(choose_cpus(&holes, 2), Some(vec![3, 4]));
        assert_eq!(choose_cpus(&holes, 1), Some(vec![1]), "a single fills the single hole");
        assert_eq!(choose_cpus(&holes, 3), Some(vec![6, 7, 8]));
        // No run is long enough: the longest runs first, so the job spans as few ranges as possible.
        assert_eq!(choose_cpus(&holes, 4), Some(vec![3, 6, 7, 8]));
        assert_eq!(choose_cpus(&holes, 6), Some(vec![1, 3, 4, 6, 7, 8]));
        // Equal runs: the lowest first.
        assert_eq!(choose_cpus(&set("0-1,4-5,8-9"), 2), Some(vec![0, 1]));
        assert_eq!(choose_cpus(&set("0-1,4-5,8-9"), 3), Some(vec![0, 1, 4]));
        // The same input gives the same answer.
        assert_eq!(choose_cpus(&holes, 4), choose_cpus(&holes.clone(), 4));
    }

    #[test]
    fn a_job_is_pinned_beside_the_others_or_not_at_all() {
        let pool = || Some((set("0-3"), set("0-1")));
        assert_eq!(cpus_to_pin(None, pool(), 2), Ok(vec![2, 3]), "the CPUs no other job has");
        assert_eq!(cpus_to_pin(Some(vec![1]), pool(), 2), Ok(vec![1]), "a later task joins the job's set");
        assert_eq!(cpus_to_pin(None, pool(), 0), Ok(vec![]), "a job without CPUs here is not pinned");
        let err = cpus_to_pin(None, pool(), 3).unwrap_err();
        assert_eq!(err, PinError::TooFewFree { wanted: 3, free: 2, all: 4 });
        assert_eq!(err.to_string(), "it holds 3 CPUs here but only 2 of the 4 CPUs the node can pin are free");
        assert!(cpus_to_pin(None, None, 1).is_err(), "no readable cpuset: unpinned");
    }

    #[test]
    fn v1_hierarchies_are_found_in_the_mount_table_even_when_co_mounted() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n\
                      cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0\n\
                      cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n\
                      cgroup /sys/fs/cgroup/my\\040mem cgroup rw,memory 0 0\n";
        assert_eq!(v1_mount(mounts, "cpuacct"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(v1_mount(mounts, "cpu"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(v1_mount(mounts, "cpuset"), Some(PathBuf::from("/sys/fs/cgroup/cpuset")));
        assert_eq!(v1_mount(mounts, "memory"), Some(PathBuf::from("/sys/fs/cgroup/my mem")));
        assert_eq!(v1_mount(mounts, "devices"), None);
    }

    #[test]
    fn job_cgroup_names_round_trip() {
        assert_eq!(parse_job_name(&job_name(12, 3)), Some((12, 3)));
        assert_eq!(parse_job_name("job_12"), None);
        assert_eq!(parse_job_name("cgroup.procs"), None);
    }

    /// Usage is read from a fake v2 and v1 tree (plain directories stand in for cgroupfs).
    #[test]
    fn usage_comes_from_the_hierarchys_counters_and_is_absent_where_unmeasured() {
        let tmp = tempfile::TempDir::new().unwrap();
        let v2 = CgroupRoot { path: tmp.path().join("v2"), hierarchy: Hierarchy::V2, cpuacct: None, cpuset: None };
        assert_eq!(job_usage(&v2, 1, 0, None), None, "no cgroup: nothing measured");
        let dir = v2.path.join("job_1.0");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\n").unwrap();
        fs::write(dir.join("memory.current"), "4096\n").unwrap();
        assert_eq!(sample_memory(&v2, 1, 0), Some(4096), "no memory.peak: the agent samples");
        let sampled = job_usage(&v2, 1, 0, Some(1 << 20)).unwrap();
        assert_eq!(sampled, MeasuredUsage { cpu_ms: Some(2_500), mem_peak_kb: Some(1024) });
        fs::write(dir.join("memory.peak"), "8388608\n").unwrap();
        assert_eq!(sample_memory(&v2, 1, 0), None);
        assert_eq!(job_usage(&v2, 1, 0, Some(1 << 20)).unwrap().mem_peak_kb, Some(8192), "the kernel's peak wins");

        let v1 = CgroupRoot {
            path: tmp.path().join("memory"),
            hierarchy: Hierarchy::V1Memory,
            cpuacct: Some(tmp.path().join("cpuacct")),
            cpuset: None,
        };
        fs::create_dir_all(v1.path.join("job_2.1")).unwrap();
        fs::write(v1.path.join("job_2.1/memory.max_usage_in_bytes"), "1048576\n").unwrap();
        let memory_only = job_usage(&v1, 2, 1, None).unwrap();
        assert_eq!(memory_only, MeasuredUsage { cpu_ms: None, mem_peak_kb: Some(1024) }, "no cpuacct cgroup");
        fs::create_dir_all(tmp.path().join("cpuacct/job_2.1")).unwrap();
        fs::write(tmp.path().join("cpuacct/job_2.1/cpuacct.usage"), "333585098\n").unwrap();
        assert_eq!(job_usage(&v1, 2, 1, None).unwrap().cpu_ms, Some(333));
        assert_eq!(job_keys(&v1), [(2, 1)].into_iter().collect());
    }
}

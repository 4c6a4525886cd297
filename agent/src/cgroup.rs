//! Memory confinement: each job's tasks on a node share one cgroup whose memory limit is the job's share of the
//! node (`--mem`, `--mem-per-cpu`, `--mem-per-gpu`), as Slurm's task/cgroup plugin does. A task that goes over it
//! is killed by the kernel's OOM killer and the job ends OUT_OF_MEMORY.
//!
//! Both hierarchies are supported, because hosts still run either: cgroup v2 (one unified tree, the memory
//! controller enabled in `cgroup.subtree_control`) and cgroup v1's memory hierarchy. The agent picks one at start
//! ([`detect`]); where neither is writable (not root, a read-only /sys) memory is still scheduled but not enforced,
//! and the agent says so once in its log.
//!
//! Layout: `ROOT/job_ID.INCARNATION/`, where ROOT is `drover` (the agent's `memory_cgroup`) under
//! `/sys/fs/cgroup` (v2) or `/sys/fs/cgroup/memory` (v1). The supervisor creates the job's cgroup, sets its limit, and moves the task into it
//! between fork and exec (writing `0`, "myself", to `cgroup.procs`), so no byte the task allocates escapes the
//! limit. The cgroup is removed by the last of the job's supervisors on the node to end.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Which hierarchy a cgroup root belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Hierarchy {
    V2,
    V1Memory,
}

/// Where the agent puts its jobs' cgroups.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupRoot {
    pub path: PathBuf,
    pub hierarchy: Hierarchy,
}

const V2_MOUNT: &str = "/sys/fs/cgroup";
const V1_MEMORY_MOUNT: &str = "/sys/fs/cgroup/memory";
/// The default `memory_cgroup`: the directory under the mount that holds every job's cgroup.
pub const DEFAULT_SUBDIR: &str = "drover";

/// Finds a usable memory cgroup hierarchy (v2 at /sys/fs/cgroup, else v1's memory hierarchy) and creates
/// `subdir` in it (a relative path; `drover` by default, one per agent where several share a host). `Err` says why
/// memory cannot be enforced on this host.
pub fn detect(subdir: &str) -> Result<CgroupRoot, String> {
    let relative = Path::new(subdir);
    if subdir.is_empty() || relative.is_absolute() || relative.components().any(|c| c.as_os_str() == "..") {
        return Err(format!("memory_cgroup {subdir:?} must be a relative path inside the cgroup mount"));
    }
    let v2_controllers = fs::read_to_string(Path::new(V2_MOUNT).join("cgroup.controllers")).unwrap_or_default();
    let (mount, hierarchy) = if v2_controllers.split_whitespace().any(|c| c == "memory") {
        (Path::new(V2_MOUNT), Hierarchy::V2)
    } else if Path::new(V1_MEMORY_MOUNT).join("memory.limit_in_bytes").exists() {
        (Path::new(V1_MEMORY_MOUNT), Hierarchy::V1Memory)
    } else {
        return Err("no cgroup v2 memory controller at /sys/fs/cgroup and no cgroup v1 memory hierarchy".into());
    };
    let root = CgroupRoot { path: mount.join(relative), hierarchy };
    prepare_root(mount, &root).map_err(|e| format!("cannot prepare the memory cgroup {}: {e}", root.path.display()))?;
    Ok(root)
}

/// Creates the root and, on v2, enables the memory controller on every level from the mount down to it, so the
/// jobs' cgroups below it have one.
fn prepare_root(mount: &Path, root: &CgroupRoot) -> io::Result<()> {
    fs::create_dir_all(&root.path)?;
    if root.hierarchy == Hierarchy::V2 {
        let mut dir = mount.to_path_buf();
        enable_memory(&dir)?;
        for part in root.path.strip_prefix(mount).expect("the root is under its mount").components() {
            dir.push(part);
            enable_memory(&dir)?;
        }
    }
    Ok(())
}

fn enable_memory(dir: &Path) -> io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control)?;
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    fs::write(&control, "+memory")
}

/// The job's cgroup on this node, with its memory limit set; created if missing.
pub fn job_cgroup(root: &CgroupRoot, job: u64, incarnation: u64, limit_mb: u64) -> io::Result<PathBuf> {
    let dir = root.path.join(format!("job_{job}.{incarnation}"));
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let bytes = limit_mb.saturating_mul(1 << 20).to_string();
    match root.hierarchy {
        Hierarchy::V2 => {
            fs::write(dir.join("memory.max"), &bytes)?;
            // No swap beyond the limit either, where the host has swap accounting.
            let _ = fs::write(dir.join("memory.swap.max"), "0");
        }
        Hierarchy::V1Memory => {
            fs::write(dir.join("memory.limit_in_bytes"), &bytes)?;
            // memsw (memory + swap) must be at least the memory limit; absent without swap accounting.
            let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), &bytes);
        }
    }
    Ok(dir)
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
    parse_counter(&fs::read_to_string(dir.join(file)).unwrap_or_default(), "oom_kill")
}

/// The value of `key` in a cgroup file of `key value` lines (0 when absent).
fn parse_counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Kills whatever is still in the cgroup and removes it; a no-op (Ok) while another task of the job still runs
/// there, since a cgroup with processes cannot be removed and the last supervisor to leave removes it.
pub fn remove_if_empty(dir: &Path) -> io::Result<bool> {
    let members = fs::read_to_string(procs_file(dir)).unwrap_or_default();
    if members.split_whitespace().next().is_some() {
        return Ok(false);
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        // EBUSY: a task joined meanwhile; it will remove it.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kill_counters_are_read_from_either_hierarchy() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_counter(v2, "oom_kill"), 2);
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
        assert_eq!(parse_counter(v1, "oom_kill"), 1);
        assert_eq!(parse_counter("", "oom_kill"), 0, "an old kernel without the counter");
    }
}

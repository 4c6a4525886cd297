//! One file per command, as the user types it.

pub mod bench;
pub mod bench_agents;
pub mod cluster;
pub mod demo;
pub mod rendezvous;
pub mod sacct;
pub mod sbatch;
pub mod scancel;
pub mod scontrol;
pub mod shims;
pub mod sinfo;
pub mod sprio;
pub mod squeue;
pub mod srun;

/// Milliseconds since the epoch, for display (elapsed times). Never used for replicated state.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Parses job ids as Slurm accepts them: `12`, `12,13`, and (for arrays, later) `12_3` → 12.
pub fn parse_job_ids(args: &[String]) -> Result<Vec<u64>, String> {
    let mut ids = Vec::new();
    for arg in args {
        for part in arg.split(',').filter(|p| !p.is_empty()) {
            let base = part.split('_').next().unwrap_or(part);
            ids.push(base.parse::<u64>().map_err(|_| format!("Invalid job id: {part}"))?);
        }
    }
    Ok(ids)
}

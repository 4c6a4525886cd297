//! The `drover` CLI. Run as `sbatch`, `squeue`, `scancel` or `scontrol` (symlinks from `drover install-shims`)
//! it accepts Slurm's flags and prints Slurm's formats; run as `drover` it also has cluster, local-cluster,
//! demo and bench commands.

pub mod commands;
pub mod connect;
pub mod format;
pub mod identity;
pub mod job_refs;
pub mod local;
pub mod pki;
pub mod sbatch_args;

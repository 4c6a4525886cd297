//! The `drover` CLI. Run under a Slurm command's name (`sbatch`, `srun`, `salloc`, `squeue`, `scancel`,
//! `scontrol`, `sinfo`, `sacct`, `sacctmgr`, `sprio`, `sreport`, `sshare`, `sstat`: the symlinks `drover
//! install-shims` makes, listed in `commands::shims::SHIMS`) it accepts Slurm's flags and prints Slurm's formats;
//! run as `drover` it also has the cluster, local-cluster, account, QOS, admin, audit, checkpoint, certificate and
//! demo commands.

pub mod command;
pub mod commands;
pub mod connect;
pub mod demo;
pub mod format;
pub mod job_refs;
pub mod sbatch_args;
pub mod slurm;

/// The local cluster, its PKI and the current user live in `drover-testkit` (bench and chaos start clusters too);
/// the CLI offers them under its own paths, as before.
pub use drover_testkit::{identity, local, pki};

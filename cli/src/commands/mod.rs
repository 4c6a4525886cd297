//! One file per command, as the user types it.

pub mod account;
pub mod admin;
pub mod cluster;
pub mod rendezvous;
pub mod sacct;
pub mod sacctmgr;
pub mod salloc;
pub mod sbatch;
pub mod scancel;
pub mod scontrol;
pub mod shims;
pub mod sinfo;
pub mod sprio;
pub mod squeue;
pub mod sreport;
pub mod srun;
pub mod sshare;
pub mod sstat;

/// Milliseconds since the epoch, for display (elapsed times). Never used for replicated state.
pub use drover_common::wall::now_ms;

//! `drover install-shims DIR`: symlinks so that Slurm's command names run this binary.

use std::path::Path;

/// The Slurm commands this binary answers to.
pub const SHIMS: [&str; 13] = [
    "sbatch", "squeue", "scancel", "scontrol", "srun", "salloc", "sacct", "sacctmgr", "sinfo", "sprio", "sshare",
    "sstat", "sreport",
];

pub fn install(dir: &Path) -> anyhow::Result<()> {
    let exe = link_all(dir)?;
    for name in SHIMS {
        println!("{} -> {}", dir.join(name).display(), exe.display());
    }
    println!("Add {} to PATH to use Slurm's commands with Drover.", dir.display());
    Ok(())
}

/// Creates (or replaces) the links; returns the binary they point to.
pub fn link_all(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    for name in SHIMS {
        let link = dir.join(name);
        if link.symlink_metadata().is_ok() {
            std::fs::remove_file(&link).map_err(|e| anyhow::anyhow!("cannot replace {}: {e}", link.display()))?;
        }
        std::os::unix::fs::symlink(&exe, &link)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", link.display()))?;
    }
    Ok(exe)
}

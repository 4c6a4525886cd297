//! A user's shell for the multi-process stories: Slurm's command names (the `drover` binary's shims) against a
//! local cluster, run from a work directory.
#![allow(dead_code)] // each test binary uses its own subset

pub mod load;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use drover_cli::local::{LocalCluster, UpOptions};

pub struct Shell {
    pub bin: PathBuf,
    pub controllers: String,
    /// The cluster's client configuration (TLS files, authd socket).
    pub config: PathBuf,
    pub cwd: PathBuf,
}

/// Where the `drover` binary itself is (jobs run `drover rendezvous`).
pub fn drover_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_drover")).parent().unwrap().to_path_buf()
}

/// A local cluster with its agents registered, and a shell for it.
///
/// Starting is tried twice: on a machine saturated by parallel test clusters an election can miss its window (or
/// a port picked as free is taken meanwhile). Only the start is retried, never a story's assertions.
pub fn setup(dir: &Path, options: UpOptions) -> (LocalCluster, Shell) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut last_error = None;
    for attempt in 0..2 {
        let mut cluster = LocalCluster::up(&dir.join(format!("cluster{attempt}")), options.clone()).unwrap();
        let ready = rt.block_on(async {
            cluster.wait_ready(Duration::from_secs(45)).await?;
            cluster.wait_agents(Duration::from_secs(45)).await
        });
        match ready {
            Ok(()) => {
                let shell = Shell::install(dir, &cluster);
                return (cluster, shell);
            }
            Err(e) => {
                eprintln!("local cluster start {attempt} failed: {e:#}");
                let _ = cluster.down();
                last_error = Some(e);
            }
        }
    }
    panic!("the local cluster did not start twice: {:#}", last_error.expect("set on failure"));
}

impl Shell {
    /// `sbatch --parsable ...`: the new job's id.
    pub fn submit(&self, args: &[&str]) -> u64 {
        let mut all = vec!["--parsable"];
        all.extend_from_slice(args);
        self.ok("sbatch", &all).trim().parse().expect("a job id")
    }

    /// Installs the shims under `dir/bin` and makes `dir/work` the working directory.
    pub fn install(dir: &Path, cluster: &LocalCluster) -> Shell {
        let bin = dir.join("bin");
        let out = Command::new(env!("CARGO_BIN_EXE_drover")).arg("install-shims").arg(&bin).output().unwrap();
        assert!(out.status.success());
        let cwd = dir.join("work");
        std::fs::create_dir_all(&cwd).unwrap();
        Shell { bin, controllers: cluster.addresses(), config: cluster.dir.join("client.toml"), cwd }
    }

    /// A Slurm command by name (the shims), or `drover` itself, set up to reach this cluster from the work
    /// directory.
    pub fn command(&self, name: &str, args: &[&str]) -> Command {
        let program = if name == "drover" { env!("CARGO_BIN_EXE_drover").into() } else { self.bin.join(name) };
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(&self.cwd)
            .env("DROVER_CONTROLLERS", &self.controllers)
            .env("DROVER_CONFIG", &self.config)
            .env("PATH", format!("{}:{}:/usr/bin:/bin", self.bin.display(), drover_dir().display()))
            .env_remove("SLURM_JOB_ID");
        command
    }

    pub fn run(&self, name: &str, args: &[&str]) -> Output {
        self.command(name, args).output().expect("command runs")
    }

    pub fn ok(&self, name: &str, args: &[&str]) -> String {
        let out = self.run(name, args);
        assert!(out.status.success(), "{name} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn err(&self, name: &str, args: &[&str]) -> String {
        let out = self.run(name, args);
        assert!(!out.status.success(), "{name} {args:?} should fail");
        String::from_utf8(out.stderr).unwrap()
    }
}

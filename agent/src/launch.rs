//! Starting tasks: a job's batch script on its first node, and the tasks of `srun` steps. Each runs under its own
//! supervisor (see `supervise`), as the job's user, with the job's environment (Slurm, torch, checkpoints), under
//! the node's lease.

use std::path::{Path, PathBuf};

use drover_proto::wire::Assignment;

use crate::env::{Placement, StepPlacement, task_environment};
use drover_common::wall::now_ms;

use crate::node::NodeAgent;
use crate::patterns::{PatternContext, expand_output_path};
use crate::supervise::{self, TaskCgroup, TaskLaunch, TaskResult};

/// A root job on a cluster that does not allow them.
#[derive(Debug, thiserror::Error)]
#[error("jobs may not run as root on this cluster (allow_root_jobs is off)")]
pub struct RootRefused;

/// Why one task of an srun step did not start here; srun shows it to the user as the step's refusal.
#[derive(Debug, thiserror::Error)]
pub enum StepLaunchError {
    #[error(transparent)]
    Root(#[from] RootRefused),
    #[error(transparent)]
    NotNow(#[from] crate::node::NotNow),
    #[error("cannot create {}: {cause}", dir.display())]
    ControlDir { dir: PathBuf, cause: std::io::Error },
    #[error("cannot create the task's directory in {}: {cause}", dir.display())]
    WorkDir { dir: PathBuf, cause: std::io::Error },
    #[error(transparent)]
    Supervise(#[from] supervise::SuperviseError),
}

impl NodeAgent {
    /// Root jobs only where the cluster allows them (the leader says so in its welcome); checked here too, so a
    /// confused or compromised controller cannot make a root agent run one.
    fn may_run_as(&self, uid: u32) -> Result<(), RootRefused> {
        if uid == 0 && !self.timing().allow_root_jobs {
            return Err(RootRefused);
        }
        Ok(())
    }

    pub(crate) fn launch_batch(&self, a: &Assignment) {
        let key = (a.job.id, a.job.incarnation);
        let _span = tracing::info_span!("job", id = key.0, incarnation = key.1).entered();
        let dir = self.batch_dir(key);
        let spec = &a.job.spec;
        // The control files are root's; the script, readable by its owner alone, is in the job's own `work`.
        if let Err(e) = crate::userfile::make_control_dir(&dir) {
            tracing::error!(job = key.0, "cannot create {}: {e}", dir.display());
            return;
        }
        if let Err(refused) = self.may_run_as(spec.uid) {
            write_failed_result(&dir, &refused.to_string());
            return;
        }
        let script = a.script.clone().unwrap_or_default();
        let written = crate::userfile::make_work_dir(&dir, spec.uid, spec.gid, Some(script.as_bytes()));
        let script_path = dir.join(crate::userfile::WORK_DIR).join("script");
        let ctx = PatternContext {
            job_id: a.job.id,
            user: &spec.user,
            job_name: &spec.name,
            node: &self.info.name,
            node_id: 0,
            task_id: None,
            step: Some("batch".to_string()),
            restart_count: a.job.restart_count,
            array_job_id: a.job.array.as_deref().map(|x| x.array_job_id),
            array_task_id: a.job.array.as_deref().map(|x| x.task_id),
        };
        let work_dir = if spec.work_dir.is_empty() { "/".to_string() } else { spec.work_dir.to_string() };
        // Slurm's default names array tasks' output by array and task.
        let default_out = if a.job.array.is_some() { "slurm-%A_%a.out" } else { "slurm-%j.out" };
        let stdout = expand_output_path(spec.stdout.as_deref().unwrap_or(default_out), &ctx, &work_dir);
        let stderr = spec.stderr.as_deref().map(|p| expand_output_path(p, &ctx, &work_dir));
        let gpus = a.job.allocation.first().map(|s| s.gpus.clone()).unwrap_or_default();
        let placement = Placement {
            job: &a.job,
            hosts: &a.hosts,
            node_index: 0,
            node_name: &self.info.name,
            gpus: &gpus,
            step: None,
            controllers: &self.config.controllers.join(","),
            client_config: &self.client_config_path(),
            cluster_name: &self.cluster_name(),
        };
        let mut argv = interpreter_argv(&script);
        argv.push(script_path.display().to_string());
        argv.extend(spec.script_args.iter().cloned());
        let launch = TaskLaunch {
            argv,
            env: self.with_gpu_environment(task_environment(&placement, spec.exported_environment())),
            cwd: work_dir,
            uid: spec.uid,
            gid: spec.gid,
            user: spec.user.to_string(),
            stdout,
            stderr,
            append: spec.open_append,
            lease_file: Some(self.lease_path().display().to_string()),
            // The incarnation's own checkpoint directory, made as the job's user (never as root, in a directory
            // the user controls).
            make_dirs: vec![a.job.checkpoint_dir()],
            cgroup: self.task_cgroup(a),
            gpus: gpus.clone(),
            journal: Some(self.journal_path().display().to_string()),
            allow_root: self.timing().allow_root_jobs,
            stdin: None,
            node: self.info.name.clone(),
            container: spec
                .container
                .as_deref()
                .map(|c| self.container_launch(a, &gpus, c, "batch", Some(script_path.display().to_string()), true)),
        };
        let started = written
            .map_err(|e| e.to_string())
            .and_then(|_| supervise::spawn(&self.exe, &dir, &launch).map_err(|e| e.to_string()));
        match started {
            Ok(pid) => tracing::info!(job = key.0, incarnation = key.1, pid, "batch script started"),
            Err(message) => {
                tracing::error!(job = key.0, "batch script could not start: {message}");
                write_failed_result(&dir, &message);
            }
        }
    }

    /// Starts one task of a step (`srun`); its output goes to files in its directory unless the step names its own.
    pub fn launch_step_task(
        &self,
        a: &Assignment,
        launch: &drover_proto::wire::StepLaunch,
        rank: u32,
        local_rank: u32,
    ) -> Result<StepTask, StepLaunchError> {
        let key = (a.job.id, a.job.incarnation);
        let dir = self.tasks_dir.join(format!("{}.{}.{}.{}", key.0, key.1, launch.step_id, rank));
        let spec = &a.job.spec;
        self.may_run_as(spec.uid)?;
        self.may_start_tasks()?;
        let gpus = a.job.allocation.get(a.node_index as usize).map(|s| s.gpus.clone()).unwrap_or_default();
        // Never beside a task of an earlier incarnation that still holds these GPUs (it is being stopped).
        self.wait_for_gpus(key, &gpus)?;
        crate::userfile::make_control_dir(&dir)
            .map_err(|cause| StepLaunchError::ControlDir { dir: dir.clone(), cause })?;
        // Output streamed back to srun goes through FIFOs in the task's own directory, which the task opens as its
        // user: the agent holds the read ends, and a task that writes faster than srun reads waits.
        // srun's standard input reaches the task through one more FIFO, which the agent writes.
        let input = launch.stdin.reaches(rank);
        let mut streams: Vec<&str> = match (&launch.output, &launch.error) {
            (Some(_), _) => vec![],
            (None, Some(_)) => vec!["stdout"],
            (None, None) => vec!["stdout", "stderr"],
        };
        let outputs = streams.len();
        if input {
            streams.push(crate::userfile::STDIN_FIFO);
        }
        let (work, mut ends) = crate::userfile::make_step_work_dir(&dir, spec.uid, spec.gid, &streams)
            .map_err(|cause| StepLaunchError::WorkDir { dir: dir.clone(), cause })?;
        let stdin = if input { ends.pop() } else { None };
        let streamed_err = (outputs == 2).then(|| ends.pop()).flatten();
        let streamed_out = ends.pop();
        let stdin_path = input.then(|| work.join(crate::userfile::STDIN_FIFO).display().to_string());
        let ctx = PatternContext {
            job_id: a.job.id,
            user: &spec.user,
            job_name: &spec.name,
            node: &self.info.name,
            node_id: a.node_index,
            task_id: Some(rank),
            step: Some(launch.step_id.to_string()),
            restart_count: a.job.restart_count,
            array_job_id: a.job.array.as_deref().map(|x| x.array_job_id),
            array_task_id: a.job.array.as_deref().map(|x| x.task_id),
        };
        let cwd = if launch.cwd.is_empty() { spec.work_dir.to_string() } else { launch.cwd.clone() };
        let (stdout, stderr) = match (&launch.output, &launch.error) {
            (Some(out), err) => {
                (expand_output_path(out, &ctx, &cwd), err.as_deref().map(|p| expand_output_path(p, &ctx, &cwd)))
            }
            (None, Some(err)) => (work.join("stdout").display().to_string(), Some(expand_output_path(err, &ctx, &cwd))),
            (None, None) => {
                (work.join("stdout").display().to_string(), Some(work.join("stderr").display().to_string()))
            }
        };
        let placement = Placement {
            job: &a.job,
            hosts: &a.hosts,
            node_index: a.node_index,
            node_name: &self.info.name,
            gpus: &gpus,
            step: Some(StepPlacement {
                step_id: launch.step_id,
                nodes: &launch.nodes,
                tasks_per_node: &launch.tasks_per_node,
                rank,
                local_rank,
            }),
            controllers: &self.config.controllers.join(","),
            client_config: &self.client_config_path(),
            cluster_name: &self.cluster_name(),
        };
        // The step's own container, else the job's (an allocation's `salloc --container-image`).
        let container = launch.container.as_deref().or(spec.container.as_deref());
        let task = TaskLaunch {
            argv: launch.argv.clone(),
            env: self.with_gpu_environment(task_environment(&placement, launch.env.clone())),
            cwd,
            uid: spec.uid,
            gid: spec.gid,
            user: spec.user.to_string(),
            stdout,
            stderr,
            append: spec.open_append,
            lease_file: Some(self.lease_path().display().to_string()),
            // A container binds the job's checkpoints in, so they must exist (the batch step makes them otherwise).
            make_dirs: if container.is_some() { vec![a.job.checkpoint_dir()] } else { Vec::new() },
            cgroup: self.task_cgroup(a),
            gpus: gpus.clone(),
            journal: Some(self.journal_path().display().to_string()),
            allow_root: self.timing().allow_root_jobs,
            stdin: stdin_path,
            node: self.info.name.clone(),
            container: container.map(|c| {
                let unnamed = format!("step-{}", launch.step_id);
                self.container_launch(a, &gpus, c, &unnamed, None, local_rank == 0)
            }),
        };
        supervise::spawn(&self.exe, &dir, &task)?;
        Ok(StepTask { dir, stdout: streamed_out, stderr: streamed_err, stdin })
    }
}

impl NodeAgent {
    /// What a task's supervisor needs to run it in its container: the node's image store, the container's own
    /// directory (per job and name, or per step), `/dev/shm`'s size, the job's GPU devices and checkpoints.
    fn container_launch(
        &self,
        a: &Assignment,
        gpus: &[u32],
        spec: &drover_state::container::ContainerSpec,
        unnamed: &str,
        script: Option<String>,
        save_here: bool,
    ) -> crate::container::ContainerLaunch {
        let settings = &self.config.containers;
        let store = settings.image_store.clone().unwrap_or_else(|| self.config.state_dir.join("images"));
        let name = spec.name.as_deref().map_or_else(|| unnamed.to_string(), |n| format!("named-{n}"));
        let dir = self.containers_dir((a.job.id, a.job.incarnation)).join(name);
        let shm_mb = settings.shm_mb.unwrap_or(self.info.memory_mb / 2);
        // Through the node's CDI spec; without one, the NVIDIA driver's usual device nodes.
        let (cdi, cdi_error) = match (&settings.cdi_spec, gpus.is_empty()) {
            (Some(path), false) => match crate::cdi::CdiSpec::load(path).and_then(|s| s.edits_for(gpus)) {
                Ok(edits) => (Some(edits), None),
                Err(e) => (None, Some(e.to_string())),
            },
            _ => (None, None),
        };
        let mut devices: Vec<String> = Vec::new();
        if cdi.is_none() && !gpus.is_empty() {
            devices.extend(gpus.iter().map(|g| format!("/dev/nvidia{g}")));
            devices.extend(
                ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"].iter().map(|d| format!("/dev/{d}")),
            );
        }
        let checkpoints = format!("{}/{}", a.job.checkpoint_root.trim_end_matches('/'), a.job.id);
        crate::container::ContainerLaunch {
            spec: spec.clone(),
            store: store.display().to_string(),
            store_limit_bytes: settings.image_store_limit_mb.saturating_mul(1 << 20),
            insecure_registries: settings.insecure_registries.clone(),
            dir: dir.display().to_string(),
            shm_bytes: shm_mb.saturating_mul(1 << 20),
            devices,
            // Every incarnation's checkpoints: DROVER_RESUME_FROM names an earlier one's.
            binds: vec![checkpoints],
            script,
            save_here,
            cdi,
            cdi_error,
            hidden_gpus: {
                let held = self.info.gpus.iter().filter(|g| gpus.contains(&g.index)).map(|g| g.pci_bus_id.as_str());
                crate::container::hidden_gpu_entries(Path::new("/proc/driver/nvidia/gpus"), &held.collect::<Vec<_>>())
            },
        }
    }

    /// The job's cgroups for its tasks here, where the node has cgroups: its memory limit (when it holds memory
    /// here) and its CPUs (when the node pins). The cgroups are made now, while no other job is choosing CPUs, so
    /// the next job to choose sees these CPUs taken.
    fn task_cgroup(&self, a: &Assignment) -> Option<TaskCgroup> {
        let root = self.cgroup.clone()?;
        let key = (a.job.id, a.job.incarnation);
        let share = a.job.allocation.get(a.node_index as usize);
        let limit_mb = share.map_or(0, |s| s.mem_mb);
        let wanted = share.map_or(0, |s| s.cpus) as usize;
        let _choosing = self.cpu_choice.lock().expect("CPU choice lock poisoned");
        let cpus = self.cpus_for(&root, key, wanted);
        match crate::cgroup::create_job(&root, key.0, key.1, limit_mb, &cpus) {
            Ok(created) => {
                if let Some(why) = created.unpinned {
                    self.warn_unpinned(key, &why);
                }
            }
            // The supervisor tries again, and fails the task with the reason if it cannot either.
            Err(e) => tracing::warn!(job = key.0, "cannot create the job's cgroup under {}: {e}", root.path.display()),
        }
        Some(TaskCgroup { root, job: key.0, incarnation: key.1, limit_mb, cpus })
    }

    /// The CPUs to pin the job's tasks here to (`cgroup::cpus_to_pin`); empty when the node does not pin, or the
    /// job is left unpinned (said once per job: a job left unpinned stays so, so all its tasks here are alike).
    fn cpus_for(&self, root: &crate::cgroup::CgroupRoot, key: crate::node::JobKey, wanted: usize) -> Vec<u32> {
        if root.cpuset.is_none() || self.is_unpinned(key) {
            return Vec::new();
        }
        let existing = crate::cgroup::pinned_cpus(root, key.0, key.1);
        let pool = if wanted > 0 { crate::cgroup::cpu_pool(root, key) } else { None };
        match crate::cgroup::cpus_to_pin(existing, pool, wanted) {
            Ok(cpus) => cpus,
            Err(why) => {
                self.warn_unpinned(key, &why);
                Vec::new()
            }
        }
    }
}

/// One started task of a step: its directory, the read ends of its streamed output and the write end of its input.
pub struct StepTask {
    pub dir: PathBuf,
    pub stdout: Option<std::fs::File>,
    pub stderr: Option<std::fs::File>,
    pub stdin: Option<std::fs::File>,
}

/// Records a launch that failed before a supervisor existed, as the supervisor would have.
pub(crate) fn write_failed_result(dir: &Path, message: &str) {
    let now = now_ms();
    let result = TaskResult {
        exit_code: supervise::EXIT_SETUP_FAILED,
        signal: 0,
        started_ms: now,
        ended_ms: now,
        cpu_ms: 0,
        max_rss_kb: 0,
        error: Some(message.to_string()),
        fenced: false,
        oom: false,
    };
    let json = serde_json::to_vec(&result).expect("results serialize");
    let tmp = dir.join("result.json.tmp");
    if std::fs::write(&tmp, json).and_then(|_| std::fs::rename(&tmp, dir.join(supervise::RESULT_FILE))).is_err() {
        tracing::error!("cannot record the failed launch in {}", dir.display());
    }
}

/// How the batch script is started: by the interpreter its `#!` line names (with the one argument a kernel would
/// pass, `#!/usr/bin/env python3`), as Slurm's exec of the script does; `--wrap` scripts say `#!/bin/sh`. A script
/// without one (sbatch refuses those) falls back to bash.
fn interpreter_argv(script: &str) -> Vec<String> {
    let first = script.lines().next().unwrap_or_default();
    let Some(line) = first.strip_prefix("#!").map(str::trim).filter(|l| !l.is_empty()) else {
        return vec!["/bin/bash".to_string()];
    };
    match line.split_once([' ', '\t']) {
        Some((interpreter, arg)) if !arg.trim().is_empty() => vec![interpreter.to_string(), arg.trim().to_string()],
        _ => vec![line.split_whitespace().next().unwrap_or(line).to_string()],
    }
}

#[cfg(test)]
mod tests {
    use super::interpreter_argv;

    #[test]
    fn a_batch_script_runs_under_the_interpreter_its_first_line_names() {
        assert_eq!(interpreter_argv("#!/bin/sh\n# wrap\ntrue\n"), ["/bin/sh"]);
        assert_eq!(interpreter_argv("#!/usr/bin/env python3\nprint(1)\n"), ["/usr/bin/env", "python3"]);
        assert_eq!(interpreter_argv("#! /bin/bash -l\n"), ["/bin/bash", "-l"]);
        assert_eq!(interpreter_argv("echo no interpreter\n"), ["/bin/bash"]);
    }
}

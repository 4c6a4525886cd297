//! A submission: the checks a job must pass (limits, partition, account, QOS, reservation, dependencies), what
//! the spec leaves open resolved, and the job (or each task of an array) entering the queue.

use crate::command::{Reply, Response};
use crate::error::CommandError;
use crate::model::account::{Account, ROOT_ACCOUNT};
use crate::model::config::ClusterConfig;
use crate::model::job::{ArrayTask, Job, JobId, JobSpec, JobState, PendingReason};
use crate::model::qos::DEFAULT_QOS;
use crate::model::role::AdminLevel;
use crate::slurm_time::format_time_limit;
use crate::state::{Change, DEDUP_CAPACITY, MAX_DEPENDENCIES, Resolved, State};

impl State {
    /// Checks a submission against the configuration and limits without changing anything, and resolves what
    /// the spec leaves open. The leader calls it before proposing (to answer bad requests without a log entry);
    /// `apply` calls it again, authoritatively.
    pub fn validate_submit(&self, spec: &JobSpec) -> Result<Resolved, CommandError> {
        self.validate_job(spec, self.level_of(spec.uid) >= AdminLevel::Operator)
    }

    /// The submit checks; `any_qos`: the job may use any QOS its partition allows (an operator's choice).
    pub(crate) fn validate_job(&self, spec: &JobSpec, any_qos: bool) -> Result<Resolved, CommandError> {
        let config = self.config().ok_or(CommandError::NotInitialized)?;
        let tasks = check_sizes(spec, &config.limits)?;
        self.check_request(spec, config, tasks)?;
        let partition = match &spec.partition {
            Some(name) => config.partition(name).ok_or_else(|| CommandError::InvalidPartition {
                name: name.to_string(),
                known: config.partitions.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(","),
            })?,
            None => config.default_partition(),
        };
        if !partition.state.accepts_jobs() {
            return Err(CommandError::PartitionClosed { name: partition.name.clone(), state: partition.state });
        }
        let (min_nodes, gpus_per_node, time_limit_s) = self.check_partition_limits(spec, partition)?;
        let account = self.resolve_account(spec, partition)?;
        let qos = self.resolve_qos(spec, partition, &account, any_qos, time_limit_s)?;
        self.admits_to_reservation(spec, &account)?;
        let mut sized = spec.clone();
        sized.min_nodes = min_nodes;
        sized.max_nodes = spec.max_nodes.max(min_nodes);
        sized.gpus_per_node = gpus_per_node;
        self.check_satisfiable(&sized, &partition.name)?;
        let dependency_state = self.judge_submission(&spec.dependency)?;
        let submit_dir = if spec.submit_dir.is_empty() { &spec.work_dir } else { &spec.submit_dir };
        let checkpoint_root = config.checkpoint_root(partition, submit_dir);
        Ok(Resolved {
            checkpoint_root,
            partition: partition.name.clone(),
            time_limit_s,
            account,
            qos,
            min_nodes,
            max_nodes: sized.max_nodes,
            gpus_per_node,
            dependency_state,
        })
    }

    /// What the request asks of the cluster and its submitter: room in the queue, sane counts, and the rights a
    /// negative nice or a root job need. `tasks` is how many jobs it makes (an array's task count).
    pub(crate) fn check_request(&self, spec: &JobSpec, config: &ClusterConfig, tasks: u64) -> Result<(), CommandError> {
        let limits = &config.limits;
        if self.jobs.len() as u64 + tasks > limits.max_active_jobs {
            return Err(CommandError::TooManyJobs { active: self.jobs.len() as u64 });
        }
        if spec.min_nodes == 0 || spec.max_nodes < spec.min_nodes {
            return Err(CommandError::InvalidRequest(format!(
                "node count {}-{} is not a valid range",
                spec.min_nodes, spec.max_nodes
            )));
        }
        if spec.cpus_per_task == 0 || spec.ntasks == Some(0) || spec.ntasks_per_node == Some(0) {
            return Err(CommandError::InvalidRequest("task and cpu counts must be at least 1".to_string()));
        }
        if spec.nice < 0 && self.level_of(spec.uid) < AdminLevel::Operator {
            return Err(CommandError::InvalidRequest(format!(
                "--nice={}: only an operator or administrator may raise a job's priority with a negative nice",
                spec.nice
            )));
        }
        if spec.uid == 0 && !config.allow_root_jobs {
            return Err(CommandError::InvalidRequest(
                "jobs may not run as root on this cluster; submit as an ordinary user (an administrator can allow it with allow_root_jobs = true in [cluster])".to_string(),
            ));
        }
        let active = self.active_jobs_of(spec.uid);
        if active + tasks > limits.max_jobs_per_user {
            return Err(CommandError::TooManyUserJobs {
                user: spec.user.to_string(),
                active,
                limit: limits.max_jobs_per_user,
            });
        }
        spec.check_bounds().map_err(|e| CommandError::InvalidRequest(e.to_string()))?;
        if spec.dependency.len() > MAX_DEPENDENCIES {
            return Err(CommandError::DependencyProblem(format!("at most {MAX_DEPENDENCIES} dependencies per job")));
        }
        Ok(())
    }

    /// The partition's node, GPU and time limits against the request: the node count and GPUs per node once
    /// `--gpus` is spread, and the time limit the job gets.
    pub(crate) fn check_partition_limits(
        &self,
        spec: &JobSpec,
        partition: &crate::model::config::Partition,
    ) -> Result<(u32, u32, Option<u64>), CommandError> {
        let (min_nodes, gpus_per_node) = self.spread_gpus(spec, &partition.name)?;
        if let Some(max) = partition.max_nodes
            && min_nodes > max
        {
            return Err(CommandError::TooManyNodes { requested: min_nodes, partition: partition.name.clone(), max });
        }
        let gpus = u64::from(min_nodes) * u64::from(gpus_per_node);
        if let Some(max) = partition.max_gpus_per_job
            && gpus > u64::from(max)
        {
            return Err(CommandError::NodeConfigUnavailable(format!(
                "{gpus} GPUs requested, over partition {}'s MaxTRESPerJob of gres/gpu={max}",
                partition.name
            )));
        }
        let time_limit_s = spec.time_limit_s.or(partition.default_time_s).or(partition.max_time_s);
        if let Some(max) = partition.max_time_s {
            let requested = time_limit_s.unwrap_or(u64::MAX);
            if requested > max {
                return Err(CommandError::TimeLimitExceeded {
                    requested: format_time_limit(time_limit_s),
                    partition: partition.name.clone(),
                    max: format_time_limit(Some(max)),
                });
            }
        }
        Ok((min_nodes, gpus_per_node, time_limit_s))
    }

    /// `--reservation`: it exists and admits the user or the job's account.
    pub(crate) fn admits_to_reservation(&self, spec: &JobSpec, account: &str) -> Result<(), CommandError> {
        let Some(name) = &spec.reservation else { return Ok(()) };
        let invalid = |why: String| CommandError::InvalidReservation { name: name.to_string(), why };
        let r = self.reservations.get(&**name).ok_or_else(|| invalid("no such reservation".to_string()))?;
        if !r.admits(&spec.user, account) {
            return Err(invalid(format!("Access denied: neither user {} nor account {account} may use it", spec.user)));
        }
        Ok(())
    }

    /// `--gpus=N` without `--nodes`: as few nodes as the partition's largest node allows, the GPUs spread evenly.
    pub(crate) fn spread_gpus(&self, spec: &JobSpec, partition: &str) -> Result<(u32, u32), CommandError> {
        let Some(total) = spec.gpus_total else { return Ok((spec.min_nodes, spec.gpus_per_node)) };
        let largest = self
            .nodes
            .values()
            .filter(|n| self.node_in_partition(&n.info, partition))
            .filter(|n| spec.gpu_type.as_ref().is_none_or(|t| n.info.gpu_type.eq_ignore_ascii_case(t)))
            .map(|n| n.info.gpus.len() as u32)
            .max()
            .unwrap_or(0);
        if total == 0 || largest == 0 {
            return Ok((spec.min_nodes, total));
        }
        let nodes = total.div_ceil(largest).max(spec.min_nodes);
        if total % nodes != 0 {
            return Err(CommandError::NodeConfigUnavailable(format!(
                "--gpus={total} cannot be spread evenly over {nodes} nodes of at most {largest} GPUs in partition {partition}; use --nodes with --gpus-per-node"
            )));
        }
        Ok((nodes, total / nodes))
    }

    /// The account a job charges: `--account`, else the first account listing the user, else `root`. Once
    /// accounts are defined, the account must exist and admit the user, and the partition must allow it.
    pub(crate) fn resolve_account(
        &self,
        spec: &JobSpec,
        partition: &crate::model::config::Partition,
    ) -> Result<String, CommandError> {
        let default = || {
            let listed =
                self.accounts.values().find(|a| a.name != ROOT_ACCOUNT && a.users.iter().any(|u| *u == spec.user));
            listed.map_or_else(|| ROOT_ACCOUNT.to_string(), |a| a.name.clone())
        };
        let account = spec.account.as_deref().map_or_else(default, str::to_string);
        let invalid = |why: String| CommandError::InvalidAccount { name: account.clone(), why };
        if !self.accounts.is_empty() {
            match self.accounts.get(&account) {
                None => return Err(invalid("no such account (drover account list shows them)".to_string())),
                Some(a) if !a.admits(&spec.user) => {
                    return Err(invalid(format!("user {} is not a member of it", spec.user)));
                }
                Some(_) => {}
            }
        }
        if !partition.allow_accounts.is_empty() && !partition.allow_accounts.contains(&account) {
            return Err(invalid(format!(
                "partition {} allows only accounts {}",
                partition.name,
                partition.allow_accounts.join(",")
            )));
        }
        Ok(account)
    }

    /// The nearest account from `account` up to root for which `has` holds (the tree is acyclic; the walk is
    /// bounded all the same).
    pub(crate) fn nearest_account(&self, account: &str, has: impl Fn(&Account) -> bool) -> Option<&Account> {
        let mut at = self.accounts.get(account);
        for _ in 0..=crate::model::account::MAX_ACCOUNTS {
            let a = at?;
            if has(a) {
                return Some(a);
            }
            at = a.parent.as_deref().and_then(|p| self.accounts.get(p));
        }
        None
    }

    /// The QOS jobs charging `account` may use: Slurm's association `QOS=` list, inherited down the account tree;
    /// `normal` alone where no account up to root lists any (as Slurm's root association starts). An operator's
    /// jobs may use any QOS.
    pub fn allowed_qos(&self, account: &str) -> Vec<String> {
        self.nearest_account(account, |a| !a.qos.is_empty())
            .map_or_else(|| vec![DEFAULT_QOS.to_string()], |a| a.qos.clone())
    }

    /// The QOS of a job charging `account` that names none: Slurm's `DefaultQOS`, inherited; else `normal`.
    pub fn default_qos(&self, account: &str) -> String {
        self.nearest_account(account, |a| !a.default_qos.is_empty())
            .map_or_else(|| DEFAULT_QOS.to_string(), |a| a.default_qos.clone())
    }

    /// The job's QOS: `--qos`, else its account's default. It must exist, be one the partition allows and, unless
    /// `any_qos` (an operator asks), one the job's account allows: a QOS that preempts others or lifts limits is
    /// an administrator's grant, not a user's choice.
    pub(crate) fn resolve_qos(
        &self,
        spec: &JobSpec,
        partition: &crate::model::config::Partition,
        account: &str,
        any_qos: bool,
        time_limit_s: Option<u64>,
    ) -> Result<String, CommandError> {
        let name = spec.qos.as_deref().map_or_else(|| self.default_qos(account), str::to_string);
        let invalid = |why: String| CommandError::InvalidQos { name: name.clone(), why };
        let qos = self.qos_named(&name).ok_or_else(|| invalid("no such QOS".to_string()))?;
        if !any_qos {
            let allowed = self.allowed_qos(account);
            if !allowed.contains(&name) {
                return Err(invalid(format!(
                    "account {account} allows only QOS {} (an administrator grants more: drover account modify {account} --qos ...)",
                    allowed.join(",")
                )));
            }
        }
        if !partition.allow_qos.is_empty() && !partition.allow_qos.contains(&name) {
            return Err(invalid(format!(
                "partition {} allows only QOS {}",
                partition.name,
                partition.allow_qos.join(",")
            )));
        }
        if let Some(max) = qos.max_wall_s
            && time_limit_s.is_none_or(|t| t > max)
        {
            return Err(invalid(format!(
                "time limit {} exceeds its MaxWall of {}",
                format_time_limit(time_limit_s),
                format_time_limit(Some(max))
            )));
        }
        Ok(name)
    }

    pub(crate) fn submit(
        &mut self,
        spec: &JobSpec,
        request_id: Option<&str>,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        if let Some(rid) = request_id
            && let Some(&job_id) = self.dedup.get(rid)
        {
            return Ok(Reply::Submitted { job_id, duplicate: true });
        }
        let resolved = self.validate_submit(spec)?;
        let first = self.meta.next_job_id;
        let mut stored_spec = spec.clone();
        let script = std::mem::take(&mut stored_spec.script);
        let environment = std::mem::take(&mut stored_spec.environment);
        stored_spec.min_nodes = resolved.min_nodes;
        stored_spec.max_nodes = resolved.max_nodes;
        stored_spec.gpus_per_node = resolved.gpus_per_node;
        // Each task is its own job; the task list itself is not copied into every one of them.
        let array = stored_spec.array.take();
        let tasks: Vec<Option<Box<ArrayTask>>> = match &array {
            None => vec![None],
            Some(a) => {
                let (task_min, task_max) = (a.task_ids[0], *a.task_ids.last().expect("checked non-empty"));
                let task_count = a.task_ids.len() as u32;
                a.task_ids
                    .iter()
                    .map(|&task_id| {
                        let max_running = a.max_running;
                        Some(Box::new(ArrayTask {
                            array_job_id: first,
                            task_id,
                            task_count,
                            task_min,
                            task_max,
                            max_running,
                        }))
                    })
                    .collect()
            }
        };
        changes.push(Change::PutScript { id: first, script });
        if !environment.is_empty() {
            changes.push(Change::PutEnvironment { id: first, environment: environment.to_vec() });
        }
        // The job's own progress timeout, else its QOS's, its partition's, the cluster's.
        let config = self.config().expect("validated");
        let progress_timeout_s = spec
            .progress_timeout_s
            .map(u64::from)
            .or_else(|| self.qos.get(resolved.qos.as_str()).and_then(|q| q.progress_timeout_s))
            .or_else(|| config.partition(&resolved.partition).and_then(|p| p.progress_timeout_s))
            .or(config.resilience.progress_timeout_s)
            .filter(|s| *s > 0);
        let resilience = progress_timeout_s
            .map(|s| Box::new(crate::model::job::Resilience { progress_timeout_s: Some(s), ..Default::default() }));
        for (offset, array) in tasks.into_iter().enumerate() {
            let id = first + offset as u64;
            let job = Box::new(Job {
                id,
                spec: stored_spec.clone(),
                partition: resolved.partition.as_str().into(),
                time_limit_s: resolved.time_limit_s,
                state: JobState::Pending,
                reason: if spec.hold { PendingReason::JobHeldUser } else { PendingReason::None },
                held: spec.hold,
                submit_time_ms: now_ms,
                account: resolved.account.as_str().into(),
                qos: resolved.qos.as_str().into(),
                checkpoint_root: resolved.checkpoint_root.as_str().into(),
                array,
                dependency_state: resolved.dependency_state.clone().into(),
                resilience: resilience.clone(),
                ..Job::default()
            });
            self.index_dependencies(&job);
            changes.push(Change::PutJob(job.clone()));
            self.insert_active(job);
        }
        self.meta.next_job_id = first + array.map_or(1, |a| a.task_ids.len() as u64);
        if let Some(rid) = request_id {
            self.remember_request(rid, first, changes);
        }
        changes.push(Change::Meta(self.meta.clone()));
        Ok(Reply::Submitted { job_id: first, duplicate: false })
    }

    pub(crate) fn remember_request(&mut self, request_id: &str, job_id: JobId, changes: &mut Vec<Change>) {
        let seq = self.meta.next_dedup_seq;
        self.meta.next_dedup_seq += 1;
        self.dedup.insert(request_id.to_string(), job_id);
        self.dedup_order.push_back((seq, request_id.to_string()));
        changes.push(Change::PutDedup { request_id: request_id.to_string(), job_id, seq });
        while self.dedup_order.len() > DEDUP_CAPACITY {
            let (old_seq, old_id) = self.dedup_order.pop_front().expect("len checked above");
            self.dedup.remove(&old_id);
            changes.push(Change::DeleteDedup { request_id: old_id, seq: old_seq });
        }
    }
}

/// The request's size against the cluster's limits (script, environment, array), and how many jobs it makes.
fn check_sizes(spec: &JobSpec, limits: &crate::model::config::Limits) -> Result<u64, CommandError> {
    let script_bytes = spec.script.len() as u64;
    if script_bytes > limits.max_script_bytes {
        return Err(CommandError::ScriptTooLarge { size_bytes: script_bytes, limit_bytes: limits.max_script_bytes });
    }
    let env_bytes: u64 = spec.environment.iter().map(|(k, v)| (k.len() + v.len() + 2) as u64).sum();
    if env_bytes > limits.max_environment_bytes {
        return Err(CommandError::EnvironmentTooLarge {
            size_bytes: env_bytes,
            limit_bytes: limits.max_environment_bytes,
        });
    }
    let Some(array) = &spec.array else { return Ok(1) };
    let max = limits.max_array_size;
    if array.task_ids.is_empty() {
        return Err(CommandError::InvalidRequest("--array names no task ids".to_string()));
    }
    if let Some(id) = array.task_ids.iter().find(|&&id| id >= max) {
        return Err(CommandError::InvalidRequest(format!(
            "--array task id {id} is not below the cluster's MaxArraySize of {max}"
        )));
    }
    if !array.task_ids.windows(2).all(|w| w[0] < w[1]) {
        return Err(CommandError::InvalidRequest("--array task ids must be sorted and unique".into()));
    }
    if array.max_running == Some(0) {
        return Err(CommandError::InvalidRequest("--array's %N limit must be at least 1".into()));
    }
    Ok(array.task_ids.len() as u64)
}

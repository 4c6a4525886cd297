//! The running half of a job's life, and the nodes it runs on: registration, plans, ends, node failure.
//!
//! Kept apart from `state.rs` (submission, cancel, hold) because it is where the invariant that matters most
//! lives: a GPU is held by at most one job, and every hold is released exactly once, whichever way the job ends.

use crate::command::{Allocation, JobEnd, Reply, Response, StepStart};

/// Counts one lingering hold of `job` more (`delta` 1) or less (-1) in the state's derived index.
fn count_lingering(counts: &mut std::collections::HashMap<JobId, u32>, job: JobId, delta: i32) {
    if delta > 0 {
        *counts.entry(job).or_default() += 1;
        return;
    }
    let count = counts.get_mut(&job).expect("a lingering hold that was counted");
    *count -= 1;
    if *count == 0 {
        counts.remove(&job);
    }
}

/// The longest step name kept (a program path can be long; the record is replicated).
const MAX_STEP_NAME: usize = 256;
/// Incarnations a registration may list as still running (a node runs a few dozen at most; more is garbage).
pub const MAX_RUNNING_SHARES: usize = 1_024;
use crate::error::{AllocationRefusal, CommandError};
use crate::model::job::{
    Job, JobId, JobState, MAX_STEP_RECORDS, MeasuredUsage, NodeAllocation, NodeUsage, PendingReason, RequeueKind,
    RequeueOrder, StepEnd, StepRecord,
};
use crate::model::node::{Lingering, Node, NodeHealth, NodeInfo, RunningShare};
use crate::state::{Change, State};
use crate::thin_str::ThinStr;

impl State {
    /// An agent registers its node. A new node starts at epoch 1; one coming back from DOWN starts a new epoch,
    /// and what its agent says still runs there (`running`: tasks of incarnations the cluster has moved on from,
    /// which the agent is about to kill) lingers, holding its GPUs until the agent confirms the tasks gone. A
    /// registration of a node that is up keeps its epoch: nothing about its jobs changed.
    pub(crate) fn register_node(
        &mut self,
        info: &NodeInfo,
        running: &[RunningShare],
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        if info.name.is_empty() || info.name.len() > 64 || info.name.contains(|c: char| c == ',' || c.is_whitespace()) {
            return Err(CommandError::InvalidNodeName { name: info.name.clone() });
        }
        let mut node = match self.nodes.remove(&info.name) {
            Some(mut node) => {
                if node.health == NodeHealth::Down {
                    node.health = NodeHealth::Up;
                    node.since_ms = now_ms;
                    node.epoch += 1;
                    if !node.drain {
                        node.reason.clear();
                    }
                }
                if node.info.spare != info.spare {
                    // The agent's `spare` setting changed; otherwise an operator's `scontrol update` stands.
                    node.spare = info.spare;
                }
                node.info = info.clone();
                node
            }
            None => Node::new(info.clone(), now_ms),
        };
        for key in self.hold_what_still_runs(&mut node, running) {
            count_lingering(&mut self.lingering_jobs, key.0, 1);
        }
        changes.push(Change::PutNode(node.clone()));
        self.nodes.insert(info.name.clone(), node);
        Ok(Reply::Nothing)
    }

    /// Registers the GPUs of incarnations a returning agent still runs as lingering on its node. Only what the
    /// state does not already account for: a current incarnation holds its allocation already (here, or, if the
    /// agent runs it where it was not placed, its tasks are strays the agent stops unasked), an incarnation that
    /// already lingers holds its GPUs, and a GPU some job holds, or that is not in the inventory, is never held
    /// twice.
    /// Returns the incarnations it added.
    fn hold_what_still_runs(&self, node: &mut Node, running: &[RunningShare]) -> Vec<(JobId, u64)> {
        let mut added = Vec::new();
        for share in running.iter().take(MAX_RUNNING_SHARES) {
            let key = (share.job, share.incarnation);
            let current = self
                .jobs
                .get(&share.job)
                .is_some_and(|j| j.incarnation == share.incarnation && !j.allocation.is_empty());
            if current || node.lingering.iter().any(|l| (l.job, l.incarnation) == key) {
                continue;
            }
            let mut gpus: Vec<u32> = Vec::new();
            for gpu in &share.gpus {
                let known = node.info.gpus.iter().any(|g| g.index == *gpu);
                if known && !node.gpu_held(*gpu) && !gpus.contains(gpu) {
                    gpus.push(*gpu);
                }
            }
            node.lingering.push(Lingering { job: share.job, incarnation: share.incarnation, gpus, cpus: 0, mem_mb: 0 });
            added.push(key);
        }
        added
    }

    pub(crate) fn node_down(
        &mut self,
        name: &str,
        reason: &str,
        epoch: Option<u64>,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let node = self.nodes.get_mut(name).ok_or_else(|| CommandError::InvalidNodeName { name: name.to_string() })?;
        if let Some(epoch) = epoch
            && epoch != node.epoch
        {
            // Decided about an earlier registration: the node has come back since, under a lease of its new
            // epoch, and may be running what it was given then.
            return Err(CommandError::StaleNodeEpoch { node: name.to_string(), epoch, current: node.epoch });
        }
        if node.health == NodeHealth::Down {
            return Ok(Reply::Nothing);
        }
        node.health = NodeHealth::Down;
        // A drained node keeps its drain's reason, as Slurm's does ("Not responding" only where there is none):
        // it is what must be fixed before the node is resumed, and it outlives the node's return.
        if !node.drain || node.reason.is_empty() {
            node.reason = reason.to_string();
        }
        node.since_ms = now_ms;
        // Whatever lingered here is gone: a node is declared down only after its agent's lease expired, and its
        // supervisors kill their tasks when it does. (What a returning agent still finds running, it lists when
        // it registers again, and that lingers anew.)
        for l in std::mem::take(&mut node.lingering) {
            count_lingering(&mut self.lingering_jobs, l.job, -1);
        }
        let jobs: Vec<JobId> = node.jobs.iter().copied().collect();
        for &id in &jobs {
            self.end_on_node_failure(id, name, now_ms, changes);
        }
        // Charged when it cost jobs: a node lost while idle hurt no one (and a drill restarting agents is no lemon).
        if let Some(first) = jobs.first() {
            self.charge_failure(name, Some(*first), format!("node lost ({reason})"), now_ms, changes);
        }
        let node = self.nodes[name].clone();
        changes.push(Change::PutNode(node));
        Ok(Reply::Nothing)
    }

    /// Frees what an incarnation holds. Its share on `freed_node` (the node that reported its end, or the node
    /// that failed) and on nodes that are down is free at once; on every other node it lingers until that node's
    /// agent confirms the incarnation's tasks are gone (`ReleaseLingering`), so no GPU is handed out while a
    /// task may still be using it. The nodes are written to `changes`.
    pub(crate) fn release_allocation(
        &mut self,
        job: &Job,
        freed_node: Option<&str>,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) {
        self.charge_usage(job, now_ms, changes);
        for share in &job.allocation {
            let node = self.nodes.get_mut(&share.node).expect("an allocation names a known node");
            for gpu in &share.gpus {
                let holder = node.allocated_gpus.remove(gpu);
                assert_eq!(holder, Some(job.id), "GPU {gpu} on {} was not held by job {}", share.node, job.id);
            }
            node.allocated_cpus = node.allocated_cpus.checked_sub(share.cpus).expect("CPU count underflow");
            node.allocated_mem_mb = node.allocated_mem_mb.checked_sub(share.mem_mb).expect("memory count underflow");
            assert!(node.jobs.remove(&job.id), "node {} did not list job {}", share.node, job.id);
            let freed = freed_node == Some(share.node.as_str()) || node.health == NodeHealth::Down;
            if !freed && (!share.gpus.is_empty() || share.cpus > 0 || share.mem_mb > 0) {
                count_lingering(&mut self.lingering_jobs, job.id, 1);
                node.lingering.push(Lingering {
                    job: job.id,
                    incarnation: job.incarnation,
                    gpus: share.gpus.clone(),
                    cpus: share.cpus,
                    mem_mb: share.mem_mb,
                });
            }
            changes.push(Change::PutNode(node.clone()));
        }
    }

    /// An agent confirmed that these ended incarnations have no task left on its node, and said what their tasks
    /// used there. The usage of an incarnation that still lingered is added to its finished job's record (once:
    /// the hold is gone after this, so a repeated confirmation adds nothing); that of a job active again (requeued,
    /// now a later incarnation) is dropped, as are figures for keys that did not linger here.
    pub(crate) fn release_lingering(
        &mut self,
        name: &str,
        keys: &[(JobId, u64)],
        usage: &[((JobId, u64), MeasuredUsage)],
        changes: &mut Vec<Change>,
    ) -> Response {
        let node = self.nodes.get_mut(name).ok_or_else(|| CommandError::InvalidNodeName { name: name.to_string() })?;
        let released: Vec<(JobId, u64)> =
            node.lingering.iter().map(|l| (l.job, l.incarnation)).filter(|key| keys.contains(key)).collect();
        if released.is_empty() {
            return Ok(Reply::Nothing);
        }
        node.lingering.retain(|l| !released.contains(&(l.job, l.incarnation)));
        for (job, _) in &released {
            count_lingering(&mut self.lingering_jobs, *job, -1);
        }
        changes.push(Change::PutNode(node.clone()));
        for &(key, measured) in usage {
            if released.contains(&key) && !measured.is_empty() && !self.jobs.contains_key(&key.0) {
                let usage = NodeUsage { node: name.to_string(), usage: measured };
                changes.push(Change::AddNodeUsage { job_id: key.0, incarnation: key.1, usage });
            }
        }
        Ok(Reply::Nothing)
    }

    /// Charges the GPU-seconds an incarnation used to its account (decayed; see `account`). Nothing is charged
    /// while no account tree is defined.
    fn charge_usage(&mut self, job: &Job, now_ms: u64, changes: &mut Vec<Change>) {
        let Some(start_ms) = job.start_time_ms else { return };
        let half_life_s = self.config().map_or(0, |c| c.fairshare_half_life_s);
        let Some(account) = self.accounts.get_mut(job.account.as_str()) else { return };
        let gpus = job.allocated_gpus() as u32;
        let gpu_s = crate::model::account::decayed_gpu_seconds(gpus, start_ms / 1_000, now_ms / 1_000, half_life_s);
        account.charge(gpu_s, now_ms / 1_000, half_life_s);
        changes.push(Change::PutObject(crate::model::registry::Object::Account(account.clone())));
    }

    pub(crate) fn drain_nodes(
        &mut self,
        names: &[String],
        drain: bool,
        reason: &str,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        if let Some(unknown) = names.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CommandError::InvalidNodeName { name: unknown.clone() });
        }
        if drain && reason.trim().is_empty() {
            return Err(CommandError::InvalidRequest("you must specify a reason when draining a node".to_string()));
        }
        for name in names {
            let node = self.nodes.get_mut(name).expect("checked above");
            node.drain = drain;
            node.reason = if drain { reason.to_string() } else { String::new() };
            node.since_ms = now_ms;
            if !drain {
                // Resumed by an operator, who looked at it: its charged failures are forgiven, or a repaired lemon
                // would be quarantined again at its next single failure.
                node.failures.clear();
            }
            changes.push(Change::PutNode(node.clone()));
        }
        Ok(Reply::Nothing)
    }

    pub(crate) fn apply_plan(
        &mut self,
        allocations: &[Allocation],
        reasons: &[(JobId, PendingReason)],
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let mut started = Vec::new();
        let mut refused = Vec::new();
        for allocation in allocations {
            match self.check_allocation(allocation) {
                Ok(()) => {
                    self.start_job(allocation, now_ms, changes);
                    started.push(allocation.job_id);
                }
                Err(why) => refused.push((allocation.job_id, why)),
            }
        }
        for (id, reason) in reasons {
            if let Some(job) = self.jobs.get_mut(id)
                && job.state == JobState::Pending
                && !job.held
                && job.reason != *reason
            {
                job.reason = *reason;
                changes.push(Change::PutJob(job.clone()));
            }
        }
        Ok(Reply::Planned { started, refused })
    }

    /// Whether an allocation still fits the current state exactly as planned.
    fn check_allocation(&self, allocation: &Allocation) -> Result<(), AllocationRefusal> {
        use AllocationRefusal as R;
        let job = self.jobs.get(&allocation.job_id).ok_or(R::Gone)?;
        if job.state != JobState::Pending || job.held {
            return Err(R::NotStartable { state: job.state, held: job.held });
        }
        if self.earlier_incarnation_lingers(job.id) {
            return Err(R::EarlierIncarnationLingers);
        }
        let count = allocation.nodes.len() as u32;
        if count < job.spec.min_nodes || count > job.spec.max_nodes {
            return Err(R::NodeCount { planned: count, min: job.spec.min_nodes, max: job.spec.max_nodes });
        }
        for (i, share) in allocation.nodes.iter().enumerate() {
            let node_name = || share.node.clone();
            if allocation.nodes[..i].iter().any(|other| other.node == share.node) {
                return Err(R::NodeTwice { node: node_name() });
            }
            let node = self.nodes.get(&share.node).ok_or_else(|| R::UnknownNode { node: node_name() })?;
            if !node.schedulable() {
                return Err(R::NodeUnschedulable { node: node_name(), state: node.state_name().to_string() });
            }
            if node.spare && !job.may_use_spares() {
                return Err(R::HotSpare { node: node_name() });
            }
            if !job.spec.accepts_node(&share.node, &node.info.features) {
                return Err(R::NotAccepted { node: node_name() });
            }
            if job.spec.exclusive {
                // A whole node: no other job on it, and every GPU to this one.
                if !node.jobs.is_empty() || share.gpus.len() != node.info.gpus.len() {
                    return Err(R::NotWhole { node: node_name() });
                }
            } else if let Some(other) = node.jobs.iter().find(|id| self.jobs.get(id).is_some_and(|j| j.spec.exclusive))
            {
                return Err(R::HeldExclusively { node: node_name(), holder: *other });
            }
            // An exclusive job takes every GPU in service (a drained one stays out).
            let in_service = node.info.gpus.len().saturating_sub(node.drained_gpus.len()) as u32;
            let wanted = if job.spec.exclusive { in_service } else { job.spec.gpus_per_node };
            if share.gpus.len() as u32 != wanted {
                let (planned, asked) = (share.gpus.len() as u32, job.spec.gpus_per_node);
                return Err(R::GpuCount { node: node_name(), planned, asked });
            }
            for (k, &gpu) in share.gpus.iter().enumerate() {
                if !node.info.gpus.iter().any(|g| g.index == gpu) || share.gpus[..k].contains(&gpu) {
                    return Err(R::NoSuchGpu { node: node_name(), gpu });
                }
                if let Some(&holder) = node.allocated_gpus.get(&gpu) {
                    return Err(R::GpuHeld { node: node_name(), gpu, holder });
                }
                if node.gpu_held(gpu) {
                    return Err(R::GpuLingers { node: node_name(), gpu });
                }
                if node.drained_gpus.contains_key(&gpu) {
                    return Err(R::GpuDrained { node: node_name(), gpu });
                }
            }
            if share.cpus > node.free_cpus() {
                return Err(R::Cpus { node: node_name(), planned: share.cpus, free: node.free_cpus() });
            }
            let mem = node.mem_for(job.spec.mem_request(), share.cpus, share.gpus.len() as u32);
            if share.mem_mb != mem {
                return Err(R::MemoryMismatch { node: node_name(), planned: share.mem_mb, asked: mem });
            }
            if share.mem_mb > node.free_mem_mb() {
                return Err(R::Memory { node: node_name(), planned: share.mem_mb, free: node.free_mem_mb() });
            }
        }
        Ok(())
    }

    fn start_job(&mut self, allocation: &Allocation, now_ms: u64, changes: &mut Vec<Change>) {
        let id = allocation.job_id;
        for share in &allocation.nodes {
            let node = self.nodes.get_mut(&share.node).expect("checked");
            for gpu in &share.gpus {
                node.allocated_gpus.insert(*gpu, id);
            }
            node.allocated_cpus += share.cpus;
            node.allocated_mem_mb += share.mem_mb;
            node.jobs.insert(id);
            // A spare taken by a restarting job joins the normal nodes: the pool shrinks until refilled.
            node.spare = false;
            changes.push(Change::PutNode(node.clone()));
        }
        // A restart after a failure: the job was down from the failed incarnation's end until now.
        let job = &self.jobs[&id];
        if let Some(failed) = job.history.last().filter(|h| h.incarnation + 1 == job.incarnation) {
            let down_ms =
                crate::apply::goodput::down_ms(failed.state, failed.end_ms, now_ms, crate::apply::goodput::ALL_TIME);
            let down = crate::apply::goodput::GoodputTotals { down_after_failures_ms: down_ms, ..Default::default() };
            let account = job.account_name().to_string();
            self.count_goodput(&account, &down, now_ms, changes);
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        job.state = JobState::Running;
        job.reason = PendingReason::None;
        job.start_time_ms = Some(now_ms);
        job.allocation = allocation.nodes.clone().into();
        job.nodes = allocation.nodes.iter().map(|n| n.node.clone()).collect();
        job.next_step_id = 0;
        job.steps.clear();
        // Usage is per incarnation: an earlier one's figures do not describe this one.
        job.node_usage.clear();
        changes.push(Change::PutJob(job.clone()));
    }

    pub(crate) fn job_ended(
        &mut self,
        id: JobId,
        incarnation: u64,
        end: &JobEnd,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let Some(job) = self.jobs.get(&id) else {
            return Err(CommandError::StaleReport { id, incarnation, why: "the job is no longer active".to_string() });
        };
        if job.incarnation != incarnation || !matches!(job.state, JobState::Running | JobState::Completing) {
            return Err(CommandError::StaleReport {
                id,
                incarnation,
                why: format!("the job is {} in incarnation {}", job.state.name(), job.incarnation),
            });
        }
        let mut job = self.remove_active(id).expect("checked");
        // The batch node reports the end: its tasks are gone; the job's other nodes confirm theirs. An allocation's
        // end reported by its client says nothing of any node's tasks: every node confirms.
        let reporter = job.nodes.first().cloned().filter(|_| !end.by_client);
        self.release_allocation(&job, reporter.as_deref(), now_ms, changes);
        job.exit_code = end.exit_code;
        job.exit_signal = end.signal;
        job.usage = end.usage;
        // A job told to end keeps the reason it was told for (a hang) unless the node has something to say.
        if end.message.is_some() || job.ending.is_none() {
            job.message = end.message.as_deref().map(ThinStr::from);
        }
        // The batch node's figures; the other nodes' follow as they release the job (`release_lingering`).
        job.node_usage.clear();
        if let (Some(measured), Some(node)) = (end.measured, reporter) {
            job.record_node_usage(&node, measured);
        }
        if let Some(state) = job.ending.take() {
            job.requeue = None;
            self.archive(job, state, now_ms, changes);
            return Ok(Reply::Nothing);
        }
        if end.fenced {
            // Its node lost the controllers for longer than its lease and killed the tasks: a node failure, not
            // the job's own failure.
            let reason = "its node lost contact with the controllers and fenced its tasks".to_string();
            let blame = job.nodes.first().cloned().into_iter().collect();
            self.fail_incarnation(job, reason, blame, now_ms, changes);
            return Ok(Reply::Nothing);
        }
        if let Some(order) = job.requeue.take() {
            self.requeue(job, *order, now_ms, changes);
            return Ok(Reply::Nothing);
        }
        if end.timed_out {
            // Slurm's job is TIMEOUT from the moment its limit is reached, and the batch script's exit, which comes
            // after (its answer to the SIGTERM), no longer sets the job's exit code: TIMEOUT reads 0:0.
            job.exit_code = 0;
            job.exit_signal = 0;
        }
        let state = match () {
            () if end.timed_out => JobState::Timeout,
            () if end.oom => JobState::OutOfMemory,
            () if end.exit_code == 0 && end.signal == 0 => JobState::Completed,
            () => JobState::Failed,
        };
        if state == JobState::Failed {
            // A failure right after resuming: the checkpoint is suspect, and the one before is tried (the requeue
            // limit ends the loop). Otherwise, a failure soon after starting is charged to the job's nodes.
            let window_ms = self.fallback_window_ms();
            match crate::apply::resilience::distrust_fresh_checkpoint(&mut job, window_ms, now_ms, "failed") {
                Some(note) if job.resume_from().is_some() && job.requeueable() => {
                    let reason = format!("failed ({}:{}): {note}", job.exit_code, job.exit_signal);
                    let order = RequeueOrder {
                        kind: RequeueKind::Fallback,
                        hold: None,
                        reason,
                        preempted_for: None,
                        blame: Vec::new(),
                    };
                    self.requeue(job, order, now_ms, changes);
                    return Ok(Reply::Nothing);
                }
                Some(note) => job.message = Some(note.into()),
                None => self.charge_early_failure(&job, now_ms, changes),
            }
        }
        self.archive(job, state, now_ms, changes);
        Ok(Reply::Nothing)
    }

    /// Cancelling a job that holds nodes: it shows COMPLETING until its batch node reports the tasks gone, so its
    /// GPUs are never given away while its processes may still use them.
    pub(crate) fn cancel_running(&mut self, id: JobId, by_uid: u32, changes: &mut Vec<Change>) {
        let job = self.jobs.get_mut(&id).expect("checked by the caller");
        job.state = JobState::Completing;
        job.ending = Some(JobState::Cancelled);
        job.requeue = None;
        job.cancelled_by = Some(by_uid);
        changes.push(Change::PutJob(job.clone()));
    }

    pub(crate) fn create_step(
        &mut self,
        id: JobId,
        by_uid: u32,
        start: Option<&StepStart>,
        time_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let job = self.active_job(id, by_uid)?;
        if job.state != JobState::Running {
            return Err(CommandError::NotRunning { id, state: job.state, cancelling: false });
        }
        if let Some(start) = start
            && let Some(stranger) = start.nodes.iter().find(|n| !job.nodes.contains(n))
        {
            return Err(CommandError::InvalidRequest(format!(
                "step nodes must be the job's own: {stranger} is not one of job {id}'s nodes"
            )));
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        let step_id = job.next_step_id;
        job.next_step_id += 1;
        if let Some(start) = start {
            if job.steps.len() >= MAX_STEP_RECORDS {
                // The oldest ended step gives way; if every one still runs, the oldest of all.
                let oldest = job.steps.iter().position(|s| s.end.is_some()).unwrap_or(0);
                job.steps.remove(oldest);
            }
            job.steps.push(StepRecord {
                id: step_id,
                name: start.name.chars().take(MAX_STEP_NAME).collect(),
                nodes: start.nodes.clone(),
                tasks: start.tasks,
                start_ms: time_ms,
                end: None,
            });
        }
        changes.push(Change::PutJob(job.clone()));
        Ok(Reply::Step { step_id })
    }

    /// `srun` reports its step's end. A job that has ended meanwhile (or a step it does not know) is left alone:
    /// the step's row then reads as ended with its job.
    pub(crate) fn end_step(
        &mut self,
        id: JobId,
        step_id: u32,
        end: StepEnd,
        by_uid: u32,
        changes: &mut Vec<Change>,
    ) -> Response {
        let Ok(job) = self.active_job(id, by_uid) else {
            return Ok(Reply::Nothing);
        };
        if job.steps.iter().all(|s| s.id != step_id || s.end.is_some()) {
            return Ok(Reply::Nothing);
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        let step = job.steps.iter_mut().find(|s| s.id == step_id).expect("checked");
        step.end = Some(end);
        changes.push(Change::PutJob(job.clone()));
        Ok(Reply::Nothing)
    }

    /// Whether `node` belongs to `partition` (its hostlist, or the partitions the node registered with).
    pub fn node_in_partition(&self, node: &NodeInfo, partition: &str) -> bool {
        let Some(p) = self.config().and_then(|c| c.partition(partition)) else { return false };
        if node.partitions.iter().any(|n| n == partition) {
            return true;
        }
        if p.nodes.is_empty() {
            return node.partitions.is_empty();
        }
        crate::hostlist::expand_hostlist(&p.nodes).map(|hosts| hosts.contains(&node.name)).unwrap_or(false)
    }

    /// Refuses, at submit, a request that no registered node of the partition could ever hold (Slurm's
    /// "Requested node configuration is not available"). Before any node registers, everything is accepted.
    pub(crate) fn check_satisfiable(
        &self,
        job: &crate::model::job::JobSpec,
        partition: &str,
    ) -> Result<(), CommandError> {
        let in_partition = |n: &&Node| self.node_in_partition(&n.info, partition);
        if !self.nodes.values().any(|n| in_partition(&n)) {
            return Ok(());
        }
        let per_node_tasks = job.max_tasks_per_node(job.min_nodes);
        let cpus = per_node_tasks.saturating_mul(job.cpus_per_task);
        if let Some(unknown) = job.nodelist.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CommandError::InvalidNodeName { name: unknown.clone() });
        }
        let fits = |n: &&Node| {
            n.info.gpus.len() as u32 >= job.gpus_per_node
                && (n.info.cpus == 0 || n.info.cpus >= cpus)
                && (!n.tracks_memory() || n.mem_for(job.mem_request(), cpus, job.gpus_per_node) <= n.info.memory_mb)
                && job.gpu_type.as_ref().is_none_or(|t| n.info.gpu_type.eq_ignore_ascii_case(t))
                && job.accepts_node(&n.info.name, &n.info.features)
        };
        // Enough fit: counting stops there. Every submission is checked here, by the leader before it proposes and
        // by every replica as it applies, and counting every node made that 11 % of the leader's CPU at 2,000
        // nodes and 1,000 submissions/s (it grows with the cluster). Only a refusal needs the whole count.
        let enough = job.min_nodes as usize;
        if self.nodes.values().filter(in_partition).filter(fits).take(enough).count() >= enough {
            return Ok(());
        }
        let members: Vec<&Node> = self.nodes.values().filter(in_partition).collect();
        let fitting = members.iter().copied().filter(fits).count() as u32;
        let most_gpus = members.iter().map(|n| n.info.gpus.len()).max().unwrap_or(0);
        let most_mem = members.iter().map(|n| n.info.memory_mb).max().unwrap_or(0);
        let mem = match job.mem_request() {
            Some(crate::model::job::MemRequest::PerNode(0)) => " and all the memory".to_string(),
            Some(request) => format!(" and {} MiB of memory", request.on_node(cpus, job.gpus_per_node, 0)),
            None => String::new(),
        };
        Err(CommandError::NodeConfigUnavailable(format!(
            "{} node(s) with {} GPU(s){}{}, {cpus} CPU(s){} each requested; partition {partition} has {} node(s), {fitting} of them big enough and allowed by --nodelist/--exclude/--constraint (at most {most_gpus} GPUs and {most_mem} MiB per node)",
            job.min_nodes,
            job.gpus_per_node,
            job.gpu_type.as_ref().map(|t| format!(" of type {t}")).unwrap_or_default(),
            if job.constraint.is_empty() {
                String::new()
            } else {
                format!(" with features {}", job.constraint.join("&"))
            },
            mem,
            members.len(),
        )))
    }
}

/// A node's share in the allocation of `job`, if it has one.
pub fn share_on<'a>(job: &'a Job, node: &str) -> Option<&'a NodeAllocation> {
    job.allocation.iter().find(|a| a.node == node)
}

impl State {
    /// Checks that nodes and jobs agree on every hold: each GPU a node lists is held by an active job whose
    /// allocation names it, and each job's allocation is recorded on its nodes. Panics with the first mismatch.
    pub fn check_invariants(&self) {
        for node in self.nodes.values() {
            for (gpu, holder) in &node.allocated_gpus {
                let job = self
                    .jobs
                    .get(holder)
                    .unwrap_or_else(|| panic!("{} GPU {gpu}: holder {holder} gone", node.info.name));
                let share = share_on(job, &node.info.name).expect("holder has a share on the node");
                assert!(share.gpus.contains(gpu), "{} GPU {gpu} not in job {holder}'s share", node.info.name);
            }
            let cpus: u32 =
                node.jobs.iter().map(|id| share_on(&self.jobs[id], &node.info.name).map_or(0, |s| s.cpus)).sum();
            assert_eq!(cpus, node.allocated_cpus, "{} CPU count", node.info.name);
            let mem: u64 =
                node.jobs.iter().map(|id| share_on(&self.jobs[id], &node.info.name).map_or(0, |s| s.mem_mb)).sum();
            assert_eq!(mem, node.allocated_mem_mb, "{} memory count", node.info.name);
            // A lingering GPU is held by that ended incarnation alone: by no running job, by no other incarnation.
            let mut lingering_gpus = std::collections::BTreeSet::new();
            for l in &node.lingering {
                for gpu in &l.gpus {
                    assert!(lingering_gpus.insert(*gpu), "{} GPU {gpu} lingers twice", node.info.name);
                    assert!(
                        !node.allocated_gpus.contains_key(gpu),
                        "{} GPU {gpu} lingers and is allocated",
                        node.info.name
                    );
                }
                assert!(
                    self.jobs.get(&l.job).is_none_or(|j| j.incarnation != l.incarnation || j.allocation.is_empty()),
                    "job {} incarnation {} both runs and lingers on {}",
                    l.job,
                    l.incarnation,
                    node.info.name
                );
            }
            if node.health == NodeHealth::Down {
                assert!(node.lingering.is_empty(), "down node {} keeps lingering holds", node.info.name);
            }
        }
        let mut lingering_jobs = std::collections::HashMap::new();
        for l in self.nodes.values().flat_map(|n| &n.lingering) {
            *lingering_jobs.entry(l.job).or_insert(0u32) += 1;
        }
        assert_eq!(lingering_jobs, self.lingering_jobs, "the lingering-jobs index");
        // A job that never started: its stored dependency verdicts agree with judging them afresh (where the target
        // is still known), and the reverse index lists it under every target it names. (A requeued job passed its
        // dependencies once and keeps them; an `after` that held stays held even if its target is requeued.)
        for job in self.jobs.values().filter(|j| j.state == JobState::Pending && j.incarnation == 0) {
            assert_eq!(job.dependency_state.len(), job.spec.dependency.len(), "job {} verdict count", job.id);
            for (dep, stored) in job.spec.dependency.iter().zip(&job.dependency_state) {
                let kept = dep.kind == crate::model::job::DependencyKind::After
                    && *stored == crate::model::job::DepState::Satisfied;
                if dep.kind == crate::model::job::DependencyKind::Singleton || kept {
                    continue;
                }
                if let Some(now) = self.judge(dep) {
                    assert_eq!(now, *stored, "job {} dependency {dep:?}", job.id);
                }
                assert!(self.dependents.get(&dep.job).is_some_and(|s| s.contains(&job.id)), "job {} unindexed", job.id);
            }
        }
        for (target, waiting) in &self.dependents {
            for id in waiting {
                let job = self.jobs.get(id).unwrap_or_else(|| panic!("index lists gone job {id} under {target}"));
                assert_eq!(job.state, JobState::Pending, "index lists non-pending job {id}");
            }
        }
        for job in self.jobs.values() {
            assert_eq!(job.allocation.is_empty(), job.state == JobState::Pending, "job {} allocation vs state", job.id);
            for share in &job.allocation {
                let node = &self.nodes[&share.node];
                assert!(node.jobs.contains(&job.id), "job {} missing on {}", job.id, share.node);
                for gpu in &share.gpus {
                    assert_eq!(
                        node.allocated_gpus.get(gpu),
                        Some(&job.id),
                        "job {} GPU {gpu} on {}",
                        job.id,
                        share.node
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::command::{Command, Request};
    use crate::first_fit::first_fit;
    use crate::model::config::ClusterConfig;
    use crate::model::job::{Dependency, DependencyKind, JobSpec};
    use crate::model::node::GpuInfo;

    fn at(time_ms: u64, command: Command) -> Request {
        Request { time_ms, command }
    }

    fn node(name: &str, gpus: u32) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            cpus: 64,
            gpus: (0..gpus).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
            ..NodeInfo::default()
        }
    }

    fn cluster(nodes: &[(&str, u32)]) -> State {
        let mut state = State::default();
        state.apply(&at(0, Command::InitCluster { config: ClusterConfig::default() }));
        for (name, gpus) in nodes {
            state
                .apply(&at(1, Command::RegisterNode { info: node(name, *gpus), running: Vec::new() }))
                .response
                .unwrap();
        }
        state
    }

    fn job(nodes: u32, gpus: u32, tasks_per_node: u32) -> JobSpec {
        JobSpec {
            name: "train".into(),
            uid: 1000,
            min_nodes: nodes,
            max_nodes: nodes,
            ntasks_per_node: Some(tasks_per_node),
            cpus_per_task: 1,
            gpus_per_node: gpus,
            script: "#!/bin/bash\n".into(),
            ..JobSpec::default()
        }
    }

    fn submit(state: &mut State, spec: JobSpec) -> JobId {
        match state.apply(&at(2, Command::SubmitJob { spec: Box::new(spec), request_id: None })).response {
            Ok(Reply::Submitted { job_id, .. }) => job_id,
            other => panic!("submit failed: {other:?}"),
        }
    }

    fn schedule(state: &mut State, time_ms: u64) -> Vec<JobId> {
        let plan = first_fit(state, 1000);
        let reply =
            state.apply(&at(time_ms, Command::ApplyPlan { allocations: plan.allocations, reasons: plan.reasons }));
        state.check_invariants();
        match reply.response {
            Ok(Reply::Planned { started, .. }) => started,
            other => panic!("{other:?}"),
        }
    }

    fn end(state: &mut State, id: JobId, exit_code: i32) -> Response {
        let incarnation = state.job(id).map_or(0, |j| j.incarnation);
        let end = JobEnd { exit_code, ..JobEnd::default() };
        let response = state.apply(&at(50, Command::JobEnded { job_id: id, incarnation, end })).response;
        state.check_invariants();
        response
    }

    #[test]
    fn measured_usage_is_recorded_per_node_once_and_only_for_the_incarnation_that_used_it() {
        let mut state = cluster(&[("gpu01", 4), ("gpu02", 4), ("gpu03", 4)]);
        let id = submit(&mut state, job(3, 4, 1));
        schedule(&mut state, 10);
        let measured = |cpu_ms, mem_peak_kb| MeasuredUsage { cpu_ms: Some(cpu_ms), mem_peak_kb: Some(mem_peak_kb) };
        // The batch node (gpu01) measures its share and reports it with the end.
        let end = JobEnd { measured: Some(measured(1_500, 4_096)), ..JobEnd::default() };
        let applied = state.apply(&at(20, Command::JobEnded { job_id: id, incarnation: 0, end }));
        let Some(Change::ArchiveJob(done)) = applied.changes.iter().find(|c| matches!(c, Change::ArchiveJob(_))) else {
            panic!("{:?}", applied.changes)
        };
        assert_eq!(done.node_usage, [NodeUsage { node: "gpu01".into(), usage: measured(1_500, 4_096) }]);
        // The other nodes report theirs as they release the ended incarnation (gpu03 measured no memory).
        let release = |node: &str, usage| Command::ReleaseLingering {
            node: node.into(),
            keys: vec![(id, 0)],
            usage: vec![((id, 0), usage)],
        };
        let applied = state.apply(&at(21, release("gpu02", measured(2_000, 8_192))));
        let added = NodeUsage { node: "gpu02".into(), usage: measured(2_000, 8_192) };
        assert!(applied.changes.contains(&Change::AddNodeUsage { job_id: id, incarnation: 0, usage: added }));
        let cpu_only = MeasuredUsage { cpu_ms: Some(500), mem_peak_kb: None };
        let applied = state.apply(&at(22, release("gpu03", cpu_only)));
        assert_eq!(applied.changes.iter().filter(|c| matches!(c, Change::AddNodeUsage { .. })).count(), 1);
        // A repeated confirmation (the agent retries until the hold is gone) adds nothing twice.
        let again = state.apply(&at(23, release("gpu02", measured(9_999, 1))));
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        state.check_invariants();

        // The history record, amended as the store does it: CPU sums over nodes, MaxRSS is the largest peak.
        let mut record = done.clone();
        record.record_node_usage("gpu02", measured(2_000, 8_192));
        record.record_node_usage("gpu03", cpu_only);
        assert!(!record.record_node_usage("gpu02", measured(1, 1)), "one figure per node");
        assert!(!record.record_node_usage("elsewhere", measured(1, 1)), "only nodes of the allocation");
        assert_eq!(record.measured_cpu_ms(), Some(4_000));
        assert_eq!(record.measured_max_rss_kb(), Some(8_192));
        assert_eq!(record.measured_total_rss_kb(), Some(12_288));
        assert_eq!(record.measured_ave_rss_kb(), Some(6_144));
        assert_eq!(Job::default().measured_cpu_ms(), None, "nothing measured: no figure, not zero");

        // A requeued job's older incarnation: its lingering nodes' figures are dropped, not mixed into the new one.
        let again = submit(&mut state, job(2, 4, 1));
        schedule(&mut state, 30);
        let nodes = state.job(again).unwrap().nodes.clone();
        state.apply(&at(31, Command::NodeDown { name: nodes[0].clone(), reason: "test".into(), epoch: None }));
        assert_eq!(state.job(again).unwrap().incarnation, 1, "requeued");
        let late = Command::ReleaseLingering {
            node: nodes[1].clone(),
            keys: vec![(again, 0)],
            usage: vec![((again, 0), measured(1, 1))],
        };
        let applied = state.apply(&at(32, late));
        assert!(!applied.changes.iter().any(|c| matches!(c, Change::AddNodeUsage { .. })), "{:?}", applied.changes);
        assert!(state.job(again).unwrap().node_usage.is_empty());
    }

    #[test]
    fn a_two_node_job_gets_disjoint_gpus_and_block_distributed_tasks() {
        let mut state = cluster(&[("gpu01", 4), ("gpu02", 4)]);
        let big = submit(&mut state, job(2, 4, 4));
        let small = submit(&mut state, job(1, 1, 1));
        assert_eq!(schedule(&mut state, 10), vec![big], "the 2x4 job fills both nodes; the small one waits");
        let running = state.job(big).unwrap();
        assert_eq!(running.state, JobState::Running);
        assert_eq!(running.nodes, ["gpu01", "gpu02"]);
        assert_eq!(running.allocation[0].gpus, [0, 1, 2, 3]);
        assert_eq!(running.allocation[1].tasks, 4);
        assert_eq!(state.job(small).unwrap().reason, PendingReason::Resources);
        assert_eq!(state.nodes["gpu01"].state_name(), "ALLOCATED");
        end(&mut state, big, 0).unwrap();
        assert!(state.job(big).is_none(), "a finished job leaves the active table");
        assert_eq!(schedule(&mut state, 60), vec![small]);
        assert_eq!(state.nodes["gpu01"].state_name(), "MIXED");
    }

    #[test]
    fn a_stale_plan_never_double_books_a_gpu() {
        let mut state = cluster(&[("gpu01", 2)]);
        let a = submit(&mut state, job(1, 2, 1));
        let b = submit(&mut state, job(1, 2, 1));
        let stale = first_fit(&state, 10);
        schedule(&mut state, 10);
        // The same plan again, and a plan giving job b the GPUs job a holds.
        let mut forged = stale.allocations.clone();
        forged[0].job_id = b;
        let reply = state.apply(&at(11, Command::ApplyPlan { allocations: forged, reasons: vec![] }));
        let Ok(Reply::Planned { started, refused }) = reply.response else { panic!() };
        assert!(started.is_empty());
        assert!(matches!(refused[0].1, AllocationRefusal::GpuHeld { holder, .. } if holder == a), "{refused:?}");
        state.check_invariants();
    }

    #[test]
    fn cancelling_a_running_job_holds_its_gpus_until_the_tasks_are_gone() {
        let mut state = cluster(&[("gpu01", 1)]);
        let id = submit(&mut state, job(1, 1, 1));
        schedule(&mut state, 10);
        state.apply(&at(20, Command::CancelJobs { ids: vec![id], by_uid: 1000 }));
        assert_eq!(state.job(id).unwrap().state, JobState::Completing);
        let next = submit(&mut state, job(1, 1, 1));
        assert!(schedule(&mut state, 21).is_empty(), "the GPU is still held while the job completes");
        let applied = state.apply(&at(
            30,
            Command::JobEnded { job_id: id, incarnation: 0, end: JobEnd { signal: 15, ..JobEnd::default() } },
        ));
        let Some(Change::ArchiveJob(done)) = applied.changes.iter().find(|c| matches!(c, Change::ArchiveJob(_))) else {
            panic!("{:?}", applied.changes)
        };
        assert_eq!((done.state, done.exit_signal), (JobState::Cancelled, 15));
        assert_eq!(schedule(&mut state, 31), vec![next]);
    }

    /// `salloc` ends its allocation through the controllers, not through a node: a step that ignores SIGTERM may
    /// still run on any node, the first included, so every node's GPUs stay held until that node's agent says the
    /// allocation's tasks are gone (issue 28, finding 6).
    #[test]
    fn an_allocation_ended_by_its_client_holds_every_nodes_gpus_until_each_node_confirms() {
        let mut state = cluster(&[("gpu01", 1), ("gpu02", 1)]);
        let alloc = submit(&mut state, JobSpec { interactive: true, ..job(2, 1, 1) });
        schedule(&mut state, 10);
        let end = JobEnd { by_client: true, ..JobEnd::default() };
        state.apply(&at(20, Command::JobEnded { job_id: alloc, incarnation: 0, end })).response.unwrap();
        state.check_invariants();
        let next = submit(&mut state, job(1, 1, 1));
        assert!(schedule(&mut state, 21).is_empty(), "no GPU is free while the allocation's tasks may run");
        let release =
            |node: &str| Command::ReleaseLingering { node: node.into(), keys: vec![(alloc, 0)], usage: Vec::new() };
        state.apply(&at(30, release("gpu01"))).response.unwrap();
        assert_eq!(schedule(&mut state, 31), vec![next], "gpu01's agent confirmed");
        assert_eq!(state.job(next).unwrap().nodes, ["gpu01"]);
        assert_eq!(state.nodes["gpu02"].lingering.len(), 1, "gpu02 has not confirmed yet");
        state.apply(&at(40, release("gpu02"))).response.unwrap();
        assert!(state.nodes["gpu02"].lingering.is_empty());
        state.check_invariants();
    }

    #[test]
    fn a_failed_node_requeues_its_jobs_as_a_new_incarnation_and_refuses_old_reports() {
        let mut state = cluster(&[("gpu01", 8), ("gpu02", 8)]);
        let requeued = submit(&mut state, job(1, 8, 1));
        let mut no_requeue = job(1, 8, 1);
        no_requeue.requeue = Some(false);
        let failing = submit(&mut state, no_requeue);
        schedule(&mut state, 10);
        state.apply(&at(20, Command::NodeDown { name: "gpu01".into(), reason: "Not responding".into(), epoch: None }));
        state.apply(&at(21, Command::NodeDown { name: "gpu02".into(), reason: "Not responding".into(), epoch: None }));
        state.check_invariants();
        let job = state.job(requeued).unwrap();
        assert_eq!((job.state, job.restart_count, job.incarnation), (JobState::Pending, 1, 1));
        assert!(state.job(failing).is_none(), "--no-requeue ends as NODE_FAIL");
        let stale =
            state.apply(&at(22, Command::JobEnded { job_id: requeued, incarnation: 0, end: JobEnd::default() }));
        assert!(matches!(stale.response, Err(CommandError::StaleReport { .. })));
        assert_eq!(state.nodes["gpu01"].state_name(), "DOWN");
        assert_eq!(first_fit(&state, 10).reasons, vec![(requeued, PendingReason::ReqNodeNotAvail)]);
        state.apply(&at(30, Command::RegisterNode { info: node("gpu02", 8), running: Vec::new() }));
        assert_eq!(schedule(&mut state, 31), vec![requeued], "the requeued job restarts on the node that came back");
        assert_eq!(state.job(requeued).unwrap().nodes, ["gpu02"]);
    }

    /// The fencing race (issue 36): a node-loss decision about one registration must not take down the next,
    /// and a node that comes back with a task of an incarnation the cluster moved on from keeps that task's GPUs
    /// held until its agent confirms it gone.
    #[test]
    fn a_node_down_for_an_old_epoch_is_refused_and_a_returning_nodes_stale_tasks_hold_their_gpus() {
        let mut state = cluster(&[("gpu01", 8)]);
        assert_eq!(state.nodes["gpu01"].epoch, 1, "a new node starts at epoch 1");
        let id = submit(&mut state, job(1, 4, 1));
        schedule(&mut state, 10);
        let down = |epoch| Command::NodeDown { name: "gpu01".into(), reason: "Not responding".into(), epoch };
        state.apply(&at(20, down(Some(1)))).response.unwrap();
        assert_eq!(state.job(id).unwrap().incarnation, 1, "requeued as a new incarnation");
        // The agent comes back with incarnation 0 still running on GPUs 0-3 (it was about to kill it).
        let running = vec![RunningShare { job: id, incarnation: 0, gpus: vec![0, 1, 2, 3, 3, 99] }];
        state.apply(&at(30, Command::RegisterNode { info: node("gpu01", 8), running })).response.unwrap();
        state.check_invariants();
        let back = &state.nodes["gpu01"];
        assert_eq!(back.epoch, 2, "coming back from DOWN starts a new epoch");
        assert_eq!(back.lingering.len(), 1);
        assert_eq!(back.lingering[0].gpus, [0, 1, 2, 3], "each GPU once, only GPUs the node has");
        // The same decision arriving late (proposed before the node came back) is refused, and changes nothing.
        let stale = state.apply(&at(31, down(Some(1)))).response;
        assert_eq!(stale, Err(CommandError::StaleNodeEpoch { node: "gpu01".into(), epoch: 1, current: 2 }));
        assert_eq!(state.nodes["gpu01"].state_name(), "IDLE");
        // The next incarnation waits until the old one is confirmed gone; another job gets the GPUs no stale task
        // holds, and the old task's GPUs stay out of reach.
        let other = submit(&mut state, job(1, 4, 1));
        assert_eq!(schedule(&mut state, 32), vec![other], "job {id} waits for its incarnation 0");
        assert_eq!(state.job(other).unwrap().allocation[0].gpus, [4, 5, 6, 7]);
        let early = state.apply(&at(
            33,
            Command::ApplyPlan {
                allocations: vec![Allocation {
                    job_id: id,
                    nodes: vec![NodeAllocation {
                        node: "gpu01".into(),
                        gpus: vec![0, 1, 2, 3],
                        cpus: 1,
                        tasks: 1,
                        mem_mb: 0,
                    }],
                }],
                reasons: Vec::new(),
            },
        ));
        assert!(matches!(early.response, Ok(Reply::Planned { ref started, .. }) if started.is_empty()), "{early:?}");
        let keys = vec![(id, 0)];
        state
            .apply(&at(34, Command::ReleaseLingering { node: "gpu01".into(), keys, usage: Vec::new() }))
            .response
            .unwrap();
        assert_eq!(schedule(&mut state, 35), vec![id], "confirmed gone: the next incarnation starts");
        assert_eq!(state.job(id).unwrap().allocation[0].gpus, [0, 1, 2, 3]);
        // A registration of a node that is up keeps its epoch.
        state.apply(&at(36, Command::RegisterNode { info: node("gpu01", 8), running: Vec::new() })).response.unwrap();
        assert_eq!(state.nodes["gpu01"].epoch, 2);
    }

    #[test]
    fn an_impossible_request_is_refused_with_slurms_words() {
        let mut state = cluster(&[("gpu01", 8)]);
        let response =
            state.apply(&at(2, Command::SubmitJob { spec: Box::new(job(1, 9, 1)), request_id: None })).response;
        let err = response.unwrap_err();
        assert!(err.to_string().starts_with("Requested node configuration is not available"), "{err}");
        let response =
            state.apply(&at(2, Command::SubmitJob { spec: Box::new(job(2, 1, 1)), request_id: None })).response;
        assert!(matches!(response, Err(CommandError::NodeConfigUnavailable(_))));
    }

    #[test]
    fn apply_refuses_plans_that_break_nodelist_exclude_or_exclusive() {
        let mut state = cluster(&[("gpu01", 4), ("gpu02", 4)]);
        let mut pinned = job(1, 1, 1);
        pinned.exclude = vec!["gpu01".into()].into();
        let pinned = submit(&mut state, pinned);
        let share =
            |node: &str, gpus: Vec<u32>| NodeAllocation { node: node.into(), gpus, cpus: 1, tasks: 1, mem_mb: 0 };
        let forged = Allocation { job_id: pinned, nodes: vec![share("gpu01", vec![0])] };
        let reply = state.apply(&at(3, Command::ApplyPlan { allocations: vec![forged], reasons: vec![] }));
        let Ok(Reply::Planned { refused, .. }) = reply.response else { panic!() };
        assert!(matches!(&refused[0].1, AllocationRefusal::NotAccepted { node } if node == "gpu01"), "{refused:?}");

        let mut whole = job(1, 1, 1);
        whole.exclusive = true;
        let whole = submit(&mut state, whole);
        let partial = Allocation { job_id: whole, nodes: vec![share("gpu02", vec![0])] };
        let reply = state.apply(&at(4, Command::ApplyPlan { allocations: vec![partial], reasons: vec![] }));
        let Ok(Reply::Planned { refused, .. }) = reply.response else { panic!() };
        assert!(matches!(&refused[0].1, AllocationRefusal::NotWhole { node } if node == "gpu02"), "{refused:?}");
        let all = Allocation { job_id: whole, nodes: vec![share("gpu02", vec![0, 1, 2, 3])] };
        state.apply(&at(5, Command::ApplyPlan { allocations: vec![all], reasons: vec![] }));
        assert_eq!(state.job(whole).unwrap().state, JobState::Running);
        let other = submit(&mut state, job(1, 1, 1));
        state.apply(&at(
            6,
            Command::DrainNodes {
                names: vec!["gpu01".into()],
                drain: true,
                reason: "x".into(),
                by_uid: 0,
                requeue_jobs: false,
            },
        ));
        let shared = Allocation { job_id: other, nodes: vec![share("gpu02", vec![])] };
        let reply = state.apply(&at(7, Command::ApplyPlan { allocations: vec![shared], reasons: vec![] }));
        let Ok(Reply::Planned { refused, .. }) = reply.response else { panic!() };
        assert!(matches!(refused[0].1, AllocationRefusal::HeldExclusively { .. }), "{refused:?}");
        state.check_invariants();
    }

    #[test]
    fn draining_needs_a_reason_and_stops_new_work() {
        let mut state = cluster(&[("gpu01", 8)]);
        let drain = |reason: &str| Command::DrainNodes {
            names: vec!["gpu01".into()],
            drain: true,
            reason: reason.into(),
            by_uid: 0,
            requeue_jobs: false,
        };
        assert!(state.apply(&at(3, drain(""))).response.is_err());
        state.apply(&at(3, drain("bad GPU 3"))).response.unwrap();
        let id = submit(&mut state, job(1, 1, 1));
        assert!(schedule(&mut state, 4).is_empty());
        assert_eq!(state.job(id).unwrap().reason, PendingReason::ReqNodeNotAvail);
        assert_eq!(state.nodes["gpu01"].state_name(), "DRAINED");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Submit { nodes: u32, gpus: u32, dep: Option<(usize, u8)>, tasks: u32 },
        Schedule,
        End { pick: usize, exit_code: i32 },
        Cancel { pick: usize },
        Down { node: usize },
        Up { node: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u32..3, 0u32..5, proptest::option::of((any::<usize>(), 0u8..4)), 0u32..3)
                .prop_map(|(nodes, gpus, dep, tasks)| Op::Submit { nodes, gpus, dep, tasks }),
            Just(Op::Schedule),
            (any::<usize>(), 0i32..2).prop_map(|(pick, exit_code)| Op::End { pick, exit_code }),
            any::<usize>().prop_map(|pick| Op::Cancel { pick }),
            (0usize..3).prop_map(|node| Op::Down { node }),
            (0usize..3).prop_map(|node| Op::Up { node }),
        ]
    }

    proptest! {
        /// Whatever happens, in any order, no GPU is ever held twice and every hold is released with its job.
        #[test]
        fn no_gpu_is_ever_double_booked(ops in proptest::collection::vec(op(), 1..80)) {
            let names = ["n1", "n2", "n3"];
            let mut state = cluster(&[("n1", 4), ("n2", 4), ("n3", 4)]);
            for (t, op) in ops.into_iter().enumerate() {
                let t = 100 + t as u64;
                let active: Vec<JobId> = state.jobs.keys().copied().collect();
                match op {
                    Op::Submit { nodes, gpus, dep, tasks } => {
                        let mut spec = job(nodes, gpus, 1);
                        if let Some((pick, kind)) = dep && state.meta.next_job_id > 1 {
                            let kinds = [DependencyKind::After, DependencyKind::AfterOk, DependencyKind::AfterAny, DependencyKind::AfterNotOk];
                            let target = 1 + (pick as u64 % (state.meta.next_job_id - 1));
                            spec.dependency = vec![Dependency { kind: kinds[kind as usize], job: target, task: None }].into();
                        }
                        if tasks > 0 {
                            spec.array = Some(crate::model::job::ArraySpec { task_ids: (0..=tasks).collect(), max_running: None });
                        }
                        let _ = state.apply(&at(t, Command::SubmitJob { spec: Box::new(spec), request_id: None }));
                    }
                    Op::Schedule => { schedule(&mut state, t); }
                    Op::End { pick, exit_code } if !active.is_empty() => { let _ = end(&mut state, active[pick % active.len()], exit_code); }
                    Op::Cancel { pick } if !active.is_empty() => { state.apply(&at(t, Command::CancelJobs { ids: vec![active[pick % active.len()]], by_uid: 0 })); }
                    Op::Down { node: i } => { state.apply(&at(t, Command::NodeDown { name: names[i].into(), reason: "test".into(), epoch: None })); }
                    Op::Up { node: i } => { state.apply(&at(t, Command::RegisterNode { info: node(names[i], 4), running: Vec::new() })); }
                    _ => {}
                }
                state.check_invariants();
                let held: usize = state.nodes.values().map(|n| n.allocated_gpus.len()).sum();
                let allocated: usize = state.jobs.values().map(|j| j.allocated_gpus()).sum();
                prop_assert_eq!(held, allocated);
            }
        }
    }
}

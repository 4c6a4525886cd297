//! What Drover does beyond requeue when hardware or software goes wrong: hung jobs (no progress within their
//! timeout), GPU errors by their XID's remedy (one GPU drained, not the node), failures charged to nodes with
//! the worst quarantined, and checkpoints that prove bad replaced by the one before.
//!
//! Every decision here is taken on the log's time and re-checked on apply: a leader that proposed `JobHung` from a
//! stale view (a progress report committed meanwhile, or a new leader repeating the old one's proposal after a
//! failover) finds the job not hung, or already stopping, and the entry changes nothing.

use crate::command::{Reply, Response};
use crate::error::CommandError;
use crate::model::job::{
    Checkpoint, Job, JobId, JobState, MAX_AVOID_NODES, MAX_BAD_CHECKPOINTS, MAX_EARLIER_CHECKPOINTS, Progress,
    RequeueKind, RequeueOrder,
};
use crate::model::node::{GpuDrain, GpuFault, MAX_NODE_FAILURES, NextState, NodeFailure, RebootOrder, XidAction};
use crate::model::role::AdminLevel;
use crate::state::{Change, State};

/// The longest reason text a GPU fault or a quarantine writes (an agent's report is bounded again here).
const MAX_REASON_BYTES: usize = 400;

/// How many failures a quarantine reason lists as its evidence.
const MAX_EVIDENCE: usize = 5;

impl State {
    /// `drover progress [--step N]` (or the agent, for the progress marker): the incarnation is alive.
    pub(crate) fn record_progress(
        &mut self,
        id: JobId,
        incarnation: u64,
        step: Option<u64>,
        by_uid: u32,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let job = self.job_at_incarnation(id, incarnation, by_uid, ": only it may report progress")?;
        if job.state != JobState::Running {
            return Err(CommandError::NotRunning { id, state: job.state, cancelling: job.ending.is_some() });
        }
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.resilience_mut().progress = Some(Progress { incarnation, time_ms: now_ms, step });
        changes.push(Change::PutJob(job.clone()));
        Ok(Reply::Nothing)
    }

    /// The leader saw no progress from a job within its timeout. Re-checked on the log's time: the job is requeued
    /// (its warning signal first, then SIGTERM, KillWait, SIGKILL) with reason `Hung`, and its nodes are charged.
    pub(crate) fn job_hung(&mut self, id: JobId, incarnation: u64, now_ms: u64, changes: &mut Vec<Change>) -> Response {
        let job = self.job_at_incarnation(id, incarnation, 0, "")?;
        let Some(hung_at_ms) = job.hung_at_ms() else {
            return Err(CommandError::InvalidRequest(format!(
                "job {id} is not a running job with a progress timeout (or is already stopping)"
            )));
        };
        if now_ms < hung_at_ms {
            return Err(CommandError::InvalidRequest(format!(
                "job {id} reported progress: it is hung only from {hung_at_ms} ms"
            )));
        }
        let silent_s = (now_ms - job.last_progress_ms().unwrap_or(now_ms)) / 1_000;
        let nodes: Vec<String> = job.nodes.to_vec();
        let last = job.progress().and_then(|p| p.step).map(|s| format!(", last step {s}")).unwrap_or_default();
        let mut reason = format!("Hung: no progress for {silent_s} s{last}");
        // A hang right after resuming may be the checkpoint's doing, not the nodes': they are not blamed then.
        let suspect = self.checkpoint_is_suspect(id, now_ms);
        if let Some(note) = self.distrust_fresh_checkpoint(id, now_ms, "hung", changes) {
            reason.push_str("; ");
            reason.push_str(&note);
        }
        let blame = if suspect { Vec::new() } else { nodes.clone() };
        if self.jobs.get(&id).is_some_and(|j| j.requeueable()) {
            let order = RequeueOrder { kind: RequeueKind::Hung, hold: None, reason, preempted_for: None, blame };
            self.order_requeue(id, order, changes);
        } else {
            // `--no-requeue` or an interactive allocation: it cannot come back, so it ends FAILED with the reason
            // (its tasks stopped like a cancelled job's), rather than holding its GPUs hung until its time limit.
            let job = self.jobs.get_mut(&id).expect("checked by job_at_incarnation");
            job.state = JobState::Completing;
            job.ending = Some(JobState::Failed);
            job.message = Some(reason.into());
            changes.push(Change::PutJob(job.clone()));
        }
        for node in nodes.iter().filter(|_| !suspect) {
            self.charge_failure(
                node,
                Some(id),
                format!("job {id} hung ({silent_s} s without progress)"),
                now_ms,
                changes,
            );
        }
        Ok(Reply::Nothing)
    }

    /// A node's agent reported a GPU error and the remedy its XID table gives. `RestartApp` requeues the jobs on
    /// that GPU and keeps the node; `ResetGpu` drains that GPU alone (the agent resets it once idle and reports it
    /// back); `RebootNode` and `Hardware` drain the node. Each charges the node with a failure.
    pub(crate) fn gpu_fault(
        &mut self,
        node: &str,
        fault: &GpuFault,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let GpuFault { gpu, xid, action, ref reason } = *fault;
        let entry = self.nodes.get(node).ok_or_else(|| CommandError::InvalidNodeName { name: node.to_string() })?;
        if !entry.info.gpus.iter().any(|g| g.index == gpu) {
            return Err(CommandError::InvalidRequest(format!("node {node} has no GPU {gpu}")));
        }
        if action == XidAction::Ignore {
            return Ok(Reply::Nothing);
        }
        let what = match xid {
            Some(code) => format!("GPU {gpu}: XID {code} ({})", bounded(reason)),
            None => format!("GPU {gpu}: {}", bounded(reason)),
        };
        let holders: Vec<JobId> = entry.allocated_gpus.get(&gpu).copied().into_iter().collect();
        let everyone: Vec<JobId> = entry.jobs.iter().copied().collect();
        match action {
            XidAction::Ignore => unreachable!("returned above"),
            XidAction::RestartApp => {}
            XidAction::ResetGpu => {
                let entry = self.nodes.get_mut(node).expect("checked above");
                if entry.drained_gpus.contains_key(&gpu) {
                    // The same fault reported again (a new leader, a lost acknowledgement): charged once.
                    return Ok(Reply::Nothing);
                }
                let drain = GpuDrain { reason: format!("{what}; reset pending"), action, since_ms: now_ms };
                entry.drained_gpus.insert(gpu, drain);
                changes.push(Change::PutNode(entry.clone()));
            }
            XidAction::RebootNode | XidAction::Hardware => {
                let entry = self.nodes.get_mut(node).expect("checked above");
                if entry.drain {
                    return Ok(Reply::Nothing);
                }
                let remedy = if action == XidAction::Hardware {
                    "hardware fault: replace the GPU, then resume the node"
                } else {
                    "node reboot required"
                };
                entry.drain = true;
                entry.reason = format!("{what}; {remedy}");
                entry.since_ms = now_ms;
                changes.push(Change::PutNode(entry.clone()));
            }
        }
        let stopped = if matches!(action, XidAction::RebootNode | XidAction::Hardware) { everyone } else { holders };
        // An application error (restart the app) says nothing against the node: its job may come back to it.
        let blame = if action == XidAction::RestartApp { Vec::new() } else { vec![node.to_string()] };
        for id in &stopped {
            let order = RequeueOrder {
                kind: RequeueKind::NodeFailure,
                hold: None,
                reason: format!("node {node} {what}"),
                preempted_for: None,
                blame: blame.clone(),
            };
            self.order_requeue(*id, order, changes);
        }
        self.charge_failure(node, stopped.first().copied(), what, now_ms, changes);
        Ok(Reply::Nothing)
    }

    /// Takes GPUs out of service one by one, or returns them (an operator; or the agent, after a reset).
    pub(crate) fn drain_gpus(
        &mut self,
        node: &str,
        gpus: &[u32],
        drain: bool,
        reason: &str,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        let entry = self.nodes.get_mut(node).ok_or_else(|| CommandError::InvalidNodeName { name: node.to_string() })?;
        if let Some(missing) = gpus.iter().find(|g| !entry.info.gpus.iter().any(|info| info.index == **g)) {
            return Err(CommandError::InvalidRequest(format!("node {node} has no GPU {missing}")));
        }
        if drain && reason.trim().is_empty() {
            return Err(CommandError::InvalidRequest("a reason is required to drain a GPU".to_string()));
        }
        let mut changed = false;
        for &gpu in gpus {
            if drain {
                let drained = GpuDrain { reason: bounded(reason), action: XidAction::Hardware, since_ms: now_ms };
                changed |= entry.drained_gpus.insert(gpu, drained).is_none();
            } else {
                changed |= entry.drained_gpus.remove(&gpu).is_some();
            }
        }
        if changed {
            changes.push(Change::PutNode(entry.clone()));
        }
        Ok(Reply::Nothing)
    }

    /// The agent reset these GPUs (drained for a reset) and finds them healthy: back in service. GPUs an operator
    /// drained are not the agent's to return.
    pub(crate) fn gpus_reset(&mut self, node: &str, gpus: &[u32], changes: &mut Vec<Change>) -> Response {
        let entry = self.nodes.get_mut(node).ok_or_else(|| CommandError::InvalidNodeName { name: node.to_string() })?;
        let before = entry.drained_gpus.len();
        entry.drained_gpus.retain(|gpu, drain| !(gpus.contains(gpu) && drain.action == XidAction::ResetGpu));
        if entry.drained_gpus.len() != before {
            changes.push(Change::PutNode(entry.clone()));
        }
        Ok(Reply::Nothing)
    }

    /// `drover checkpoint invalidate JOB [PATH]`: never resume from this checkpoint (by default the one the next
    /// incarnation would resume from).
    pub(crate) fn invalidate_checkpoint(
        &mut self,
        id: JobId,
        path: Option<&str>,
        by_uid: u32,
        changes: &mut Vec<Change>,
    ) -> Response {
        let job = self.active_job(id, by_uid)?;
        let chosen = match path {
            Some(path) => job.checkpoints().find(|c| c.path == path).map(|c| c.path.clone()).ok_or_else(|| {
                CommandError::InvalidRequest(format!("job {id} has no checkpoint {path:?} on record"))
            })?,
            // The next resume's choice: from the next incarnation's point of view, every kept one counts.
            None => job
                .checkpoints()
                .find(|c| !job.checkpoint_is_bad(&c.path))
                .map(|c| c.path.clone())
                .ok_or_else(|| CommandError::InvalidRequest(format!("job {id} has no good checkpoint on record")))?,
        };
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        mark_bad(job, &chosen);
        changes.push(Change::PutJob(job.clone()));
        Ok(Reply::Nothing)
    }

    /// Keeps the previous latest checkpoint among the earlier ones when a new one is recorded.
    pub(crate) fn push_checkpoint(job: &mut Job, checkpoint: Checkpoint) {
        if let Some(previous) = job.checkpoint.take()
            && previous.path != checkpoint.path
        {
            let earlier = &mut job.resilience_mut().earlier_checkpoints;
            earlier.retain(|c| c.path != previous.path && c.path != checkpoint.path);
            earlier.insert(0, *previous);
            earlier.truncate(MAX_EARLIER_CHECKPOINTS);
        }
        job.checkpoint = Some(Box::new(checkpoint));
    }

    /// The cluster's checkpoint fallback window, in ms (0: off).
    pub(crate) fn fallback_window_ms(&self) -> u64 {
        self.config().map_or(0, |c| c.resilience.checkpoint_fallback_s).saturating_mul(1_000)
    }

    /// Whether the job's current incarnation resumed from a checkpoint within the cluster's fallback window.
    fn checkpoint_is_suspect(&self, id: JobId, now_ms: u64) -> bool {
        self.jobs.get(&id).is_some_and(|job| suspect(job, self.fallback_window_ms(), now_ms))
    }

    /// [`distrust_fresh_checkpoint`] for an active job.
    fn distrust_fresh_checkpoint(
        &mut self,
        id: JobId,
        now_ms: u64,
        how: &str,
        changes: &mut Vec<Change>,
    ) -> Option<String> {
        let window_ms = self.fallback_window_ms();
        let job = self.jobs.get_mut(&id)?;
        let note = distrust_fresh_checkpoint(job, window_ms, now_ms, how)?;
        changes.push(Change::PutJob(job.clone()));
        Some(note)
    }

    /// Charges a failure to a node, and quarantines (drains) it once its failures within the window reach the
    /// cluster's threshold. Repeated charges for one job count once, and early exits once per user: one bad job,
    /// or one user's broken script, does not quarantine a node.
    pub(crate) fn charge_failure(
        &mut self,
        node: &str,
        job: Option<JobId>,
        what: String,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) {
        self.charge(node, NodeFailure { time_ms: now_ms, job, what: bounded(&what), early_exit_of: None }, changes);
    }

    fn charge(&mut self, node: &str, failure: NodeFailure, changes: &mut Vec<Change>) {
        let settings = self.config().map(|c| c.resilience.clone()).unwrap_or_default();
        let now_ms = failure.time_ms;
        let Some(entry) = self.nodes.get_mut(node) else { return };
        if entry.failures.len() >= MAX_NODE_FAILURES {
            entry.failures.remove(0);
        }
        entry.failures.push(failure);
        if settings.quarantine_failures > 0 && !entry.drain {
            let since_ms = now_ms.saturating_sub(settings.quarantine_window_s.saturating_mul(1_000));
            let mut counted: Vec<&NodeFailure> = Vec::new();
            for failure in entry.failures_since(since_ms) {
                let repeated = match failure.early_exit_of {
                    Some(user) => counted.iter().any(|c| c.early_exit_of == Some(user)),
                    None => failure.job.is_some() && counted.iter().any(|c| c.job == failure.job),
                };
                if !repeated {
                    counted.push(failure);
                }
            }
            let count = counted.len();
            let evidence: Vec<String> = counted.iter().rev().take(MAX_EVIDENCE).map(|f| f.what.clone()).collect();
            if count >= settings.quarantine_failures as usize {
                let hours = settings.quarantine_window_s as f64 / 3600.0;
                entry.drain = true;
                entry.reason =
                    bounded(&format!("quarantined: {count} failures in {hours:.0} h: {}", evidence.join("; ")));
                entry.since_ms = now_ms;
            }
        }
        changes.push(Change::PutNode(entry.clone()));
    }

    /// A job that failed on its own soon after it started: its nodes are charged (a lemon node kills jobs early).
    pub(crate) fn charge_early_failure(&mut self, job: &Job, now_ms: u64, changes: &mut Vec<Change>) {
        let window_ms = self.config().map_or(0, |c| c.resilience.early_failure_s).saturating_mul(1_000);
        let Some(start) = job.start_time_ms else { return };
        let ran_ms = now_ms.saturating_sub(start);
        if window_ms == 0 || ran_ms >= window_ms {
            return;
        }
        let (code, signal) = (job.exit_code, job.exit_signal);
        for node in job.nodes.iter() {
            let what = format!("job {} failed ({code}:{signal}) {} s after starting", job.id, ran_ms / 1_000);
            let failure = NodeFailure { time_ms: now_ms, job: Some(job.id), what, early_exit_of: Some(job.spec.uid) };
            self.charge(node, failure, changes);
        }
    }

    /// `scontrol reboot`: each node takes no new job until it has rebooted; with ASAP it is also drained (Slurm's
    /// `Reboot ASAP`). A node that is down reboots when its agent comes back. A new order replaces a pending one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reboot_nodes(
        &mut self,
        names: &[String],
        asap: bool,
        next_state: Option<NextState>,
        reason: &str,
        by_uid: u32,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Response {
        if let Some(unknown) = names.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CommandError::InvalidNodeName { name: unknown.clone() });
        }
        if names.is_empty() {
            return Err(CommandError::InvalidRequest("no node named to reboot".to_string()));
        }
        for name in names {
            let node = self.nodes.get_mut(name).expect("checked above");
            let reason = if reason.is_empty() && asap { "Reboot ASAP".to_string() } else { bounded(reason) };
            if asap && !node.drain {
                node.drain = true;
                node.reason = reason.clone();
                node.since_ms = now_ms;
            }
            node.reboot = Some(RebootOrder { id: now_ms, asap, next_state, reason, by_uid });
            changes.push(Change::PutNode(node.clone()));
        }
        Ok(Reply::Nothing)
    }

    /// `scontrol cancel_reboot`: the pending reboot is dropped, and the drain an ASAP order made with it.
    pub(crate) fn cancel_reboot(&mut self, names: &[String], changes: &mut Vec<Change>) -> Response {
        if let Some(unknown) = names.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CommandError::InvalidNodeName { name: unknown.clone() });
        }
        for name in names {
            let node = self.nodes.get_mut(name).expect("checked above");
            if let Some(order) = node.reboot.take() {
                if order.asap && node.drain && node.reason == order.reason {
                    node.drain = false;
                    node.reason.clear();
                }
                changes.push(Change::PutNode(node.clone()));
            }
        }
        Ok(Reply::Nothing)
    }

    /// The node's agent ran the reboot program for order `id` and registered again: the node returns in the
    /// order's next state (RESUME: in service, whatever drained it; DOWN: drained with the order's reason; unset:
    /// as before, less the reboot's own drain). Its charged failures are forgiven with a RESUME, as an operator's
    /// resume forgives them. A report for another order (a newer one was given meanwhile) is refused.
    pub(crate) fn node_rebooted(&mut self, name: &str, id: u64, now_ms: u64, changes: &mut Vec<Change>) -> Response {
        let node = self.nodes.get_mut(name).ok_or_else(|| CommandError::InvalidNodeName { name: name.to_string() })?;
        let Some(order) = node.reboot.clone().filter(|o| o.id == id) else {
            return Err(CommandError::InvalidRequest(format!("node {name} has no pending reboot {id}")));
        };
        if !node.jobs.is_empty() {
            return Err(CommandError::InvalidRequest(format!("node {name} still runs jobs: it cannot have rebooted")));
        }
        node.reboot = None;
        node.since_ms = now_ms;
        match order.next_state {
            Some(NextState::Resume) => {
                node.drain = false;
                node.reason.clear();
                node.failures.clear();
            }
            // Drover has no administrative DOWN (a registering agent brings its node up): the node returns drained
            // with the order's reason, out of service until an operator resumes it, which is what DOWN is for.
            Some(NextState::Down) => {
                node.drain = true;
                node.reason =
                    if order.reason.is_empty() { "Reboot complete: nextstate=DOWN".to_string() } else { order.reason };
            }
            None if order.asap && node.reason == order.reason => {
                node.drain = false;
                node.reason.clear();
            }
            None => {}
        }
        changes.push(Change::PutNode(node.clone()));
        Ok(Reply::Nothing)
    }

    /// Whether `uid` may return GPUs to service or drain them.
    pub(crate) fn may_drain_gpus(&self, uid: u32) -> Result<(), CommandError> {
        self.require_level(uid, AdminLevel::Operator, "draining or returning GPUs")
    }
}

/// Whether `job`'s current incarnation resumed from a checkpoint less than `window_ms` ago.
fn suspect(job: &Job, window_ms: u64, now_ms: u64) -> bool {
    window_ms > 0
        && job.resume_from().is_some()
        && job.start_time_ms.is_some_and(|start| now_ms.saturating_sub(start) < window_ms)
}

/// An incarnation that failed (`how`) soon after resuming from a checkpoint: that checkpoint is marked bad, so the
/// next incarnation resumes from the one before. Returns what to add to the reason (`None`: not suspect).
pub(crate) fn distrust_fresh_checkpoint(job: &mut Job, window_ms: u64, now_ms: u64, how: &str) -> Option<String> {
    if !suspect(job, window_ms, now_ms) {
        return None;
    }
    let bad = job.resume_from()?.path.clone();
    let ran_s = now_ms.saturating_sub(job.start_time_ms.unwrap_or(now_ms)) / 1_000;
    mark_bad(job, &bad);
    let next = match job.resume_from() {
        Some(c) => format!("the next incarnation resumes from {}", c.path),
        None => "no earlier checkpoint is left".to_string(),
    };
    Some(format!("it {how} {ran_s} s after resuming from {bad}, now marked bad; {next}"))
}

/// Sets the nodes a requeued job should avoid.
pub(crate) fn avoid(job: &mut Job, nodes: &[String]) {
    if nodes.is_empty() {
        return;
    }
    let avoid = &mut job.resilience_mut().avoid_nodes;
    avoid.clear();
    avoid.extend(nodes.iter().take(MAX_AVOID_NODES).cloned());
}

fn mark_bad(job: &mut Job, path: &str) {
    let bad = &mut job.resilience_mut().bad_checkpoints;
    if !bad.iter().any(|b| b == path) {
        if bad.len() >= MAX_BAD_CHECKPOINTS {
            bad.remove(0);
        }
        bad.push(path.to_string());
    }
}

fn bounded(text: &str) -> String {
    if text.len() <= MAX_REASON_BYTES {
        return text.to_string();
    }
    let mut end = MAX_REASON_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

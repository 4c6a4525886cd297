//! How incarnations end when the job does not: node failure, fencing, `scontrol requeue`, preemption, GPU faults;
//! and the checkpoints that let the next incarnation resume.
//!
//! A requeued job keeps its id and becomes a new incarnation (`incarnation + 1`): every report, checkpoint record
//! and task directory names its incarnation, so anything an older one says or does afterwards is refused or
//! killed. Failures (not requests or preemptions) count towards the cluster's `max_batch_requeue`, after which the
//! job stays NODE_FAIL instead of crashing again and again on bad hardware.

use crate::apply::goodput::{self, ALL_TIME, GoodputTotals, Incarnation};
use crate::command::{Reply, Response};
use crate::error::CommandError;
use crate::hostlist::compress_hostlist;
use crate::model::job::{
    Checkpoint, IncarnationRecord, Job, JobId, JobState, MAX_HISTORY, MAX_PATH_BYTES, PendingReason, RequeueKind,
    RequeueOrder,
};
use crate::model::role::AdminLevel;
use crate::state::{Change, State};

pub use crate::model::config::DEFAULT_MAX_BATCH_REQUEUE;

impl Job {
    /// Whether it may go back to the queue (`--no-requeue` and interactive allocations may not).
    pub fn requeueable(&self) -> bool {
        self.spec.requeue != Some(false) && !self.spec.interactive
    }
}

impl State {
    /// A job lost `node`: cancelled if it was being cancelled; with `--no-kill`, it carries on without a node that
    /// is not its first; otherwise its incarnation failed (requeued, or NODE_FAIL).
    pub(crate) fn end_on_node_failure(&mut self, id: JobId, node: &str, now_ms: u64, changes: &mut Vec<Change>) {
        let job = self.jobs.get(&id).expect("a node's job is active");
        if job.ending.is_none()
            && job.spec.no_kill
            && job.nodes.len() > 1
            && job.nodes.first().map(String::as_str) != Some(node)
        {
            self.shrink(id, node, changes);
            return;
        }
        let mut job = self.remove_active(id).expect("checked above");
        self.release_allocation(&job, Some(node), now_ms, changes);
        job.message = Some(format!("node {node} failed").into());
        if let Some(state) = job.ending.take() {
            job.requeue = None;
            self.archive(job, state, now_ms, changes);
            return;
        }
        self.fail_incarnation(job, format!("node {node} failed"), vec![node.to_string()], now_ms, changes);
    }

    /// `--no-kill`: the job keeps its other nodes; the failed one's share is simply gone (the node is down).
    fn shrink(&mut self, id: JobId, node: &str, changes: &mut Vec<Change>) {
        let job = self.jobs.get_mut(&id).expect("checked by the caller");
        let share = job.allocation.iter().position(|a| a.node == node).map(|i| job.allocation.remove(i));
        job.nodes.retain(|n| n != node);
        job.message = Some(format!("node {node} failed; --no-kill: running on {} node(s)", job.nodes.len()).into());
        let job = job.clone();
        changes.push(Change::PutJob(job.clone()));
        if let Some(share) = share {
            let n = self.nodes.get_mut(node).expect("the failed node is known");
            for gpu in &share.gpus {
                n.allocated_gpus.remove(gpu);
            }
            n.allocated_cpus = n.allocated_cpus.saturating_sub(share.cpus);
            n.allocated_mem_mb = n.allocated_mem_mb.saturating_sub(share.mem_mb);
            n.jobs.remove(&id);
        }
    }

    /// An incarnation ended because its node failed (lost, fenced, faulty GPU): requeued if the job allows it
    /// and has not failed too often, NODE_FAIL otherwise. The allocation is already released.
    pub(crate) fn fail_incarnation(
        &mut self,
        mut job: Box<Job>,
        reason: String,
        blame: Vec<String>,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) {
        if !job.requeueable() {
            job.message = Some(reason.into());
            self.archive(job, JobState::NodeFail, now_ms, changes);
            return;
        }
        let order = RequeueOrder { kind: RequeueKind::NodeFailure, hold: None, reason, preempted_for: None, blame };
        self.requeue(job, order, now_ms, changes);
    }

    /// Puts an ended incarnation's job back in the queue as the next incarnation (or ends it for good when a
    /// failure exceeds the requeue limit). The allocation is already released.
    pub(crate) fn requeue(&mut self, mut job: Box<Job>, order: RequeueOrder, now_ms: u64, changes: &mut Vec<Change>) {
        let limit = self.config().map_or(DEFAULT_MAX_BATCH_REQUEUE, |c| c.max_batch_requeue);
        self.record_incarnation(&mut job, order.kind.state(), &order.reason, now_ms, true, changes);
        crate::apply::resilience::avoid(&mut job, &order.blame);
        if order.kind.is_failure() {
            job.failures += 1;
            if job.failures > limit {
                job.message = Some(
                    format!(
                        "{}; not requeued: it failed {} times, over the cluster's max_batch_requeue of {limit}",
                        order.reason, job.failures
                    )
                    .into(),
                );
                self.archive(job, JobState::NodeFail, now_ms, changes);
                return;
            }
        }
        job.message = Some(order.reason.into());
        self.begin_next_incarnation(job, order.hold, changes);
    }

    /// Back in the queue as the next incarnation, held with `hold` or not.
    fn begin_next_incarnation(&mut self, mut job: Box<Job>, hold: Option<PendingReason>, changes: &mut Vec<Change>) {
        job.state = JobState::Pending;
        job.reason = hold.unwrap_or(PendingReason::None);
        job.held = hold.is_some();
        job.restart_count += 1;
        job.incarnation += 1;
        job.start_time_ms = None;
        job.allocation.clear();
        job.nodes.clear();
        job.requeue = None;
        job.next_step_id = 0;
        job.steps.clear();
        job.suspension = None;
        changes.push(Change::PutJob(job.clone()));
        self.insert_active(job);
    }

    /// `scontrol requeue` of a finished batch job, as Slurm's: back to PENDING as its next incarnation (its
    /// finished one joins its history; its goodput was counted when it ended). `job` is the history's record,
    /// which the leader read; one requeued already (active again) is refused.
    pub(crate) fn requeue_finished(
        &mut self,
        job: &Job,
        by_uid: u32,
        hold: bool,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let id = job.id;
        if let Some(active) = self.jobs.get(&id) {
            return Err(CommandError::NotRunning { id, state: active.state, cancelling: false });
        }
        if !job.state.is_terminal() {
            return Err(CommandError::InvalidRequest(format!("job {id}'s record is not of a finished job")));
        }
        let privileged = self.level_of(by_uid) >= AdminLevel::Operator;
        if by_uid != job.spec.uid && !privileged {
            return Err(CommandError::PermissionDenied { id, owner: job.spec.uid, requester: by_uid });
        }
        if !job.requeueable() {
            return Err(CommandError::InvalidRequest(format!(
                "Requeue of job {id} is disabled: it was submitted with --no-requeue (or is an interactive allocation)"
            )));
        }
        let mut job = Box::new(job.clone());
        let reason = format!("requeued by uid {by_uid} after it ended {}", job.state.name());
        let (ended_as, ended_ms) = (job.state, job.end_time_ms.unwrap_or(now_ms));
        self.record_incarnation(&mut job, ended_as, &reason, ended_ms, false, changes);
        job.end_time_ms = None;
        job.exit_code = 0;
        job.exit_signal = 0;
        job.cancelled_by = None;
        job.ending = None;
        job.message = Some(reason.into());
        let held = match (hold, by_uid != job.spec.uid && privileged) {
            (false, _) => None,
            (true, true) => Some(PendingReason::JobHeldAdmin),
            (true, false) => Some(PendingReason::RequeuedHeld),
        };
        changes.push(Change::UnarchiveJob(id));
        self.index_dependencies(&job);
        self.begin_next_incarnation(job, held, changes);
        Ok(())
    }

    /// Appends how the current incarnation ended to the job's history (bounded, oldest dropped first, its goodput
    /// kept in `dropped_goodput`), and counts its goodput in the cluster's and its account's sums (unless
    /// `count` is false: a finished job's was counted as it ended).
    fn record_incarnation(
        &mut self,
        job: &mut Job,
        state: JobState,
        reason: &str,
        now_ms: u64,
        count: bool,
        changes: &mut Vec<Change>,
    ) {
        let record = IncarnationRecord {
            incarnation: job.incarnation,
            start_ms: job.start_time_ms,
            end_ms: now_ms,
            nodes: compress_hostlist(&job.nodes),
            state,
            reason: reason.to_string(),
            resumed_from: job.resume_from().map(|c| c.path.clone()),
            gpus: job.allocated_gpus() as u32,
            last_checkpoint_ms: job.incarnation_checkpoint_ms(),
        };
        if count && let Some(ended) = Incarnation::of_record(&record) {
            self.count_goodput(job.account_name(), &ended.totals(ALL_TIME, now_ms), now_ms, changes);
        }
        if job.history.len() >= MAX_HISTORY {
            let dropped = job.history.remove(0);
            if let Some(inc) = Incarnation::of_record(&dropped) {
                let next_start_ms = job.history.first().unwrap_or(&record).start_ms.unwrap_or(dropped.end_ms);
                let totals = job.dropped_goodput.get_or_insert_default();
                totals.add(&inc.totals(ALL_TIME, now_ms));
                totals.down_after_failures_ms +=
                    goodput::down_ms(dropped.state, dropped.end_ms, next_start_ms, ALL_TIME);
            }
        }
        job.history.push(record);
    }

    /// Ends a job for good: out of the active table, into the accounting history. Its last incarnation's goodput
    /// is counted here, unless `requeue` recorded it already (a failure past the requeue limit).
    pub(crate) fn archive(&mut self, mut job: Box<Job>, state: JobState, now_ms: u64, changes: &mut Vec<Change>) {
        job.state = state;
        job.end_time_ms = Some(now_ms);
        if let Some(last) = Incarnation::current(&job) {
            self.count_goodput(job.account_name(), &last.totals(ALL_TIME, now_ms), now_ms, changes);
        }
        changes.push(Change::ArchiveJob(job));
    }

    /// Adds an ended incarnation's goodput (or a down time) to the cluster's sums and to its account's, if the
    /// account is defined. The meta record is written once at the end of `apply`.
    pub(crate) fn count_goodput(&mut self, account: &str, add: &GoodputTotals, now_ms: u64, changes: &mut Vec<Change>) {
        if add.is_zero() {
            return;
        }
        self.meta.goodput.add(add);
        self.meta.goodput_since_ms.get_or_insert(now_ms);
        if let Some(account) = self.accounts.get_mut(account) {
            account.goodput.add(add);
            changes.push(Change::PutObject(crate::model::registry::Object::Account(account.clone())));
        }
    }

    /// `scontrol requeue` / `requeuehold`: a running job is told to end (with its `--signal` warning, then
    /// SIGTERM, KillWait, SIGKILL) and goes back to the queue once its tasks are gone.
    pub(crate) fn request_requeue(
        &mut self,
        id: JobId,
        by_uid: u32,
        hold: bool,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        if !job.requeueable() {
            return Err(CommandError::InvalidRequest(format!(
                "Requeue of job {id} is disabled: it was submitted with --no-requeue (or is an interactive allocation)"
            )));
        }
        if job.ending.is_some() {
            return Err(CommandError::NotRunning { id, state: JobState::Completing, cancelling: true });
        }
        if job.requeue.is_some() {
            return Ok(());
        }
        if job.state != JobState::Running {
            return Err(CommandError::NotRunning { id, state: job.state, cancelling: false });
        }
        let held = match (hold, by_uid != job.spec.uid && self.level_of(by_uid) >= AdminLevel::Operator) {
            (false, _) => None,
            (true, true) => Some(PendingReason::JobHeldAdmin),
            (true, false) => Some(PendingReason::RequeuedHeld),
        };
        let reason = format!("requeued by uid {by_uid}");
        let order =
            RequeueOrder { kind: RequeueKind::Requested, hold: held, reason, preempted_for: None, blame: Vec::new() };
        self.order_requeue(id, order, changes);
        Ok(())
    }

    /// Tells a running job to stop and come back (a no-op for one already stopping).
    pub(crate) fn order_requeue(&mut self, id: JobId, order: RequeueOrder, changes: &mut Vec<Change>) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        if job.state != JobState::Running || job.stopping() || !job.requeueable() {
            return false;
        }
        job.state = JobState::Completing;
        job.requeue = Some(Box::new(order));
        changes.push(Change::PutJob(job.clone()));
        true
    }

    /// The scheduler chose these running jobs to make room for `for_job` (PreemptMode=REQUEUE).
    pub(crate) fn preempt(&mut self, victims: &[JobId], for_job: JobId, changes: &mut Vec<Change>) -> Response {
        let mut preempted = Vec::new();
        for &id in victims {
            let reason = format!("preempted by job {for_job}");
            let order = RequeueOrder {
                kind: RequeueKind::Preempted,
                hold: None,
                reason,
                preempted_for: Some(for_job),
                blame: Vec::new(),
            };
            if self.order_requeue(id, order, changes) {
                preempted.push(id);
            }
        }
        Ok(Reply::Preempted { jobs: preempted })
    }

    /// A node's GPUs failed their health check: it is drained, and its requeue-able jobs are stopped (with their
    /// warning signal) and requeued elsewhere, from their checkpoints.
    pub(crate) fn requeue_jobs_on(&mut self, node: &str, reason: &str, changes: &mut Vec<Change>) {
        let ids: Vec<JobId> = self.nodes.get(node).map(|n| n.jobs.iter().copied().collect()).unwrap_or_default();
        for id in ids {
            let why = format!("node {node} drained: {reason}");
            let order = RequeueOrder {
                kind: RequeueKind::NodeFailure,
                hold: None,
                reason: why,
                preempted_for: None,
                blame: vec![node.to_string()],
            };
            self.order_requeue(id, order, changes);
        }
    }

    /// `drover checkpoint record PATH [--step N]` (or the agent, for a job's marker file): the latest checkpoint,
    /// with the incarnation that wrote it. A record from any other incarnation than the current one is refused:
    /// a zombie incarnation can never replace what the next one resumes from.
    pub(crate) fn record_checkpoint(
        &mut self,
        id: JobId,
        checkpoint: Checkpoint,
        by_uid: u32,
        changes: &mut Vec<Change>,
    ) -> Response {
        let (incarnation, path) = (checkpoint.incarnation, checkpoint.path.as_str());
        let job = self.job_at_incarnation(id, incarnation, by_uid, ": only it may record checkpoints")?;
        if !matches!(job.state, JobState::Running | JobState::Completing) {
            return Err(CommandError::NotRunning { id, state: job.state, cancelling: false });
        }
        if path.is_empty() || !path.starts_with('/') || path.len() > MAX_PATH_BYTES || path.contains('\0') {
            return Err(CommandError::InvalidRequest(format!(
                "checkpoint path {path:?} must be an absolute path of at most {MAX_PATH_BYTES} bytes"
            )));
        }
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        State::push_checkpoint(job, checkpoint);
        changes.push(Change::PutJob(job.clone()));
        Ok(Reply::Nothing)
    }

    /// The digest a job's container image resolved to on its node: pinned the first time (later reports, and
    /// later incarnations', change nothing), so that a requeue restarts in the same image, as a checkpoint
    /// written by one image may not load in another.
    pub(crate) fn record_image(
        &mut self,
        id: JobId,
        incarnation: u64,
        digest: &str,
        changes: &mut Vec<Change>,
    ) -> Response {
        self.job_at_incarnation(id, incarnation, 0, "")?;
        if !crate::container::is_digest(digest) {
            return Err(CommandError::InvalidRequest(format!(
                "image digest {digest:?} is not sha256: and 64 lower-case hex digits"
            )));
        }
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        let Some(container) = job.spec.container.as_mut().filter(|c| c.image.is_some()) else {
            return Err(CommandError::InvalidRequest(format!("job {id} runs in no container image")));
        };
        if container.pinned_digest.is_none() {
            container.pinned_digest = Some(digest.to_string());
            changes.push(Change::PutJob(job.clone()));
        }
        Ok(Reply::Nothing)
    }
}

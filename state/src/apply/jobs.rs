//! What users and operators do to jobs already in the queue: cancel, hold and release, top, and update a pending
//! job's request (checked again like a submission).

use crate::command::{JobOutcome, Reply};
use crate::error::CommandError;
use crate::model::job::{Job, JobId, JobState, PendingReason};
use crate::model::role::AdminLevel;
use crate::slurm_time::format_time_limit;
use crate::state::{Change, State};

impl State {
    pub(crate) fn for_each_job(
        &mut self,
        ids: &[JobId],
        mut op: impl FnMut(&mut State, JobId) -> Result<(), CommandError>,
    ) -> Reply {
        Reply::Jobs(ids.iter().map(|&id| JobOutcome { id, result: op(self, id) }).collect())
    }

    /// The job for an operation, or why there is none: finished (archived) ids are below the counter.
    pub(crate) fn active_job(&self, id: JobId, by_uid: u32) -> Result<&Job, CommandError> {
        let Some(job) = self.jobs.get(&id) else {
            if id > 0 && id < self.meta.next_job_id {
                return Err(CommandError::AlreadyFinished { id });
            }
            return Err(CommandError::InvalidJobId { id });
        };
        if by_uid != job.spec.uid && self.level_of(by_uid) < AdminLevel::Operator {
            return Err(CommandError::PermissionDenied { id, owner: job.spec.uid, requester: by_uid });
        }
        Ok(job)
    }

    /// An active job `by_uid` may act on, at incarnation `incarnation`: a report (a checkpoint, progress, an image)
    /// from any other incarnation is stale, and refused so that a zombie can never speak for the job. `what` ends
    /// the refusal: "only it may record checkpoints".
    pub(crate) fn job_at_incarnation(
        &self,
        id: JobId,
        incarnation: u64,
        by_uid: u32,
        what: &str,
    ) -> Result<&Job, CommandError> {
        let job = self.active_job(id, by_uid)?;
        if job.incarnation != incarnation {
            let why = format!("the job is at incarnation {}{what}", job.incarnation);
            return Err(CommandError::StaleReport { id, incarnation, why });
        }
        Ok(job)
    }

    pub(crate) fn cancel(
        &mut self,
        id: JobId,
        by_uid: u32,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        match job.state {
            // Already ending: a cancel wins over a requeue in progress (the job will not come back).
            JobState::Completing if job.ending.is_none() => {
                self.cancel_running(id, by_uid, changes);
                return Ok(());
            }
            JobState::Completing => return Ok(()),
            JobState::Pending => {}
            _ => {
                self.cancel_running(id, by_uid, changes);
                return Ok(());
            }
        }
        let mut job = self.remove_active(id).expect("checked by active_job");
        job.state = JobState::Cancelled;
        // The reason it was waiting stays, as Slurm's does (a held job cancelled still reads JobHeldUser).
        job.end_time_ms = Some(now_ms);
        job.cancelled_by = Some(by_uid);
        changes.push(Change::ArchiveJob(job));
        Ok(())
    }

    /// `scontrol update jobid=...` on a pending job: the changed request goes through the submit checks again. A
    /// running job may change its time limit, name and comment, as in Slurm. Only root may raise a time limit (or
    /// lift it); anyone may lower their own.
    pub(crate) fn update_job(
        &mut self,
        id: JobId,
        by_uid: u32,
        update: &crate::command::JobUpdate,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        let running = matches!(job.state, JobState::Running | JobState::Suspended);
        if job.state != JobState::Pending && !(running && update.fits_a_running_job()) {
            return Err(CommandError::NotPending { id, state: job.state });
        }
        let mut spec = job.spec.clone();
        let new_limit = if update.time_unlimited { Some(None) } else { update.time_limit_s.map(Some) };
        if let Some(limit) = new_limit {
            let raises = match (limit, job.time_limit_s) {
                (None, Some(_)) => true,
                (Some(new), Some(old)) => new > old,
                _ => false,
            };
            if raises && self.level_of(by_uid) < AdminLevel::Operator {
                return Err(CommandError::InvalidRequest(format!(
                    "job {id}: only an operator or administrator may raise a time limit (lowering it is allowed)"
                )));
            }
            spec.time_limit_s = limit;
        }
        if let Some(name) = &update.name {
            spec.name = name.clone().into();
        }
        if let Some(comment) = &update.comment {
            spec.comment = Some(comment.clone().into());
        }
        if let Some(partition) = &update.partition {
            spec.partition = Some(partition.clone().into());
        }
        if running {
            spec.check_bounds().map_err(|e| CommandError::InvalidRequest(e.to_string()))?;
            // Its resources are held already: nothing to check again but who may raise the limit (above). The
            // agents end it at the new limit, counted from its start, as they read the job record.
            let job = self.jobs.get_mut(&id).expect("checked by active_job");
            job.time_limit_s = spec.time_limit_s;
            job.spec = spec;
            changes.push(Change::PutJob(job.clone()));
            return Ok(());
        }
        if let Some(nice) = update.nice {
            spec.nice = nice;
        }
        if let Some(qos) = &update.qos {
            spec.qos = Some(qos.clone().into());
        }
        if let Some((deps, any)) = &update.dependency {
            if deps.iter().any(|d| d.job == id) {
                return Err(CommandError::DependencyProblem(format!("job {id} cannot depend on itself")));
            }
            spec.dependency = deps.clone().into();
            spec.dependency_any = *any;
        }
        // The checks see one job fewer: this one is being replaced, not added.
        let mut resolved = {
            let old = self.remove_active(id).expect("checked by active_job");
            // A QOS the job already had stays (an administrator may have granted it); a new one must be allowed.
            let any_qos = update.qos.is_none()
                || self.level_of(by_uid) >= AdminLevel::Operator
                || self.level_of(spec.uid) >= AdminLevel::Operator;
            let checked = self.validate_job(&spec, any_qos);
            self.insert_active(old);
            checked?
        };
        // The submit checks give a job without --time the partition's default; UNLIMITED asked for explicitly must
        // fit under the partition's MaxTime and the QOS's MaxWall instead.
        if new_limit == Some(None) {
            let partition = self.config().and_then(|c| c.partition(&resolved.partition));
            let qos_wall = self.qos_named(&resolved.qos).and_then(|q| q.max_wall_s);
            if let Some(max) = partition.and_then(|p| p.max_time_s).or(qos_wall) {
                return Err(CommandError::TimeLimitExceeded {
                    requested: "UNLIMITED".to_string(),
                    partition: resolved.partition,
                    max: format_time_limit(Some(max)),
                });
            }
            resolved.time_limit_s = None;
        }
        let old_targets: Vec<JobId> = self.jobs[&id].spec.dependency.iter().map(|d| d.job).collect();
        self.unindex(id, &old_targets);
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.spec = spec;
        job.time_limit_s = resolved.time_limit_s;
        job.qos = resolved.qos.into();
        job.partition = resolved.partition.as_str().into();
        job.dependency_state = resolved.dependency_state.into();
        let job = job.clone();
        self.index_dependencies(&job);
        changes.push(Change::PutJob(job));
        Ok(())
    }

    /// `scontrol suspend`/`resume` of one job (the caller checked the operator's level): a running job's tasks
    /// stop where they are and go on later; the time suspended is added to its time limit.
    pub(crate) fn suspend(
        &mut self,
        id: JobId,
        by_uid: u32,
        suspend: bool,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        if job.state != JobState::Running || job.stopping() {
            return Err(CommandError::NotSuspendable { id, state: job.shown_state(), suspend });
        }
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        let suspension = job.suspension.get_or_insert_default();
        match (suspend, suspension.since_ms) {
            (true, None) => suspension.since_ms = Some(now_ms),
            (false, Some(since)) => {
                suspension.total_ms = suspension.total_ms.saturating_add(now_ms.saturating_sub(since));
                suspension.since_ms = None;
            }
            // Slurm's words: suspending a suspended job, resuming a running one.
            (_, _) => return Err(CommandError::NotSuspendable { id, state: job.shown_state(), suspend }),
        }
        changes.push(Change::PutJob(job.clone()));
        Ok(())
    }

    /// `scontrol top`: the job moves ahead of its owner's other pending jobs (and only those).
    pub(crate) fn top(&mut self, id: JobId, by_uid: u32, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        if job.state != JobState::Pending {
            return Err(CommandError::NotPending { id, state: job.state });
        }
        if job.held {
            return Err(CommandError::HeldPendingRelease { id });
        }
        self.meta.next_top_rank += 1;
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.top_rank = self.meta.next_top_rank;
        changes.push(Change::PutJob(job.clone()));
        changes.push(Change::Meta(self.meta.clone()));
        Ok(())
    }

    /// `scontrol hold`/`uhold` (`hold` is `Some(user_hold)`) and `release` (`None`). An operator's `hold` is an
    /// administrator's hold (Slurm's `JobHeldAdmin`), which the job's owner cannot release; `uhold` is always
    /// the user's hold.
    pub(crate) fn set_hold(
        &mut self,
        id: JobId,
        hold: Option<Option<bool>>,
        by_uid: u32,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        // Slurm answers a hold or release of a running job with success and changes nothing that matters.
        if matches!(job.state, JobState::Running | JobState::Suspended | JobState::Completing) {
            return Ok(());
        }
        if job.state != JobState::Pending {
            return Err(CommandError::NotPending { id, state: job.state });
        }
        let privileged = self.level_of(by_uid) >= AdminLevel::Operator;
        let admin_placed = match hold {
            Some(Some(user_hold)) => privileged && !user_hold,
            // Entries from before `hold` and `uhold` were told apart.
            Some(None) => privileged && by_uid != job.spec.uid,
            None => false,
        };
        let hold = hold.is_some();
        if !hold && job.reason == PendingReason::JobHeldAdmin && !privileged {
            return Err(CommandError::AdminHold { id });
        }
        // A hold never lowers one already there: the owner's `hold` on an administrator's hold (placed by
        // `hold` or `requeuehold`) would otherwise turn it into a user hold the owner may release.
        let admin_hold = admin_placed || job.reason == PendingReason::JobHeldAdmin;
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.held = hold;
        job.reason = match (hold, admin_hold) {
            (false, _) => PendingReason::None,
            (true, true) => PendingReason::JobHeldAdmin,
            (true, false) => PendingReason::JobHeldUser,
        };
        changes.push(Change::PutJob(job.clone()));
        Ok(())
    }
}

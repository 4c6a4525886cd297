//! `--dependency` bookkeeping inside `apply`: each pending job's entries are re-judged whenever a job they name
//! starts or ends, so the scheduler only reads a stored verdict.
//!
//! Finished jobs leave memory for the accounting history, so the state keeps a bounded table of recent fates
//! (the `FATE_CAPACITY` highest finished ids): enough to judge a dependency on a job that just ended. It is
//! derived from the history on restore by the same rule, so every replica holds the same table.

use std::collections::BTreeSet;

use crate::PendingReason;
use crate::error::CommandError;
pub use crate::model::fate::{FATE_CAPACITY, Fate};
use crate::model::job::{ArrayTask, DepState, Dependency, DependencyKind, Job, JobId, JobState};
use crate::state::{Change, State};

/// One covered job, as a dependency sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fact {
    Pending,
    Started,
    Ended { ok: bool },
}

impl State {
    /// The array's task count, from any of its tasks still known (active or in the fate table).
    fn array_task_count(&self, array_id: JobId) -> Option<u32> {
        let active = self.jobs.range(array_id..).next().and_then(|(_, j)| j.array.as_deref().copied());
        let finished = self.fates.range(array_id..).next().and_then(|(_, f)| f.array);
        [active, finished].into_iter().flatten().find(|a| a.array_job_id == array_id).map(|a| a.task_count)
    }

    fn fact(&self, id: JobId) -> Option<(Fact, Option<ArrayTask>)> {
        if let Some(job) = self.jobs.get(&id) {
            let fact = if job.state == JobState::Pending { Fact::Pending } else { Fact::Started };
            return Some((fact, job.array.as_deref().copied()));
        }
        self.fates.get(&id).map(|f| (Fact::Ended { ok: f.succeeded }, f.array))
    }

    /// The facts of every job a dependency covers, or `None` when none of them is known any more.
    fn facts(&self, dep: &Dependency) -> Option<Vec<Fact>> {
        let Some(count) = self.array_task_count(dep.job) else {
            // A plain job (or an array task named by its own id).
            return match (dep.task, self.fact(dep.job)) {
                (None, Some((fact, _))) => Some(vec![fact]),
                _ => None,
            };
        };
        let mut facts = Vec::new();
        for id in dep.job..dep.job.saturating_add(u64::from(count)) {
            match self.fact(id) {
                Some((fact, Some(task))) if dep.task.is_none_or(|t| t == task.task_id) => facts.push(fact),
                // A task too old to remember: Slurm treats a purged dependency as satisfied.
                None if dep.task.is_none() => facts.push(Fact::Ended { ok: true }),
                _ => {}
            }
        }
        (!facts.is_empty()).then_some(facts)
    }

    /// Judges one dependency now; `None` when its target is unknown.
    pub(crate) fn judge(&self, dep: &Dependency) -> Option<DepState> {
        if dep.kind == DependencyKind::Singleton {
            return Some(DepState::Waiting);
        }
        let facts = self.facts(dep)?;
        let ended = facts.iter().all(|f| matches!(f, Fact::Ended { .. }));
        let failed = facts.iter().any(|f| matches!(f, Fact::Ended { ok: false }));
        Some(match dep.kind {
            DependencyKind::After if facts.iter().all(|f| *f != Fact::Pending) => DepState::Satisfied,
            DependencyKind::AfterAny if ended => DepState::Satisfied,
            DependencyKind::AfterOk if failed => DepState::Never,
            DependencyKind::AfterOk if ended => DepState::Satisfied,
            DependencyKind::AfterNotOk if ended && failed => DepState::Satisfied,
            DependencyKind::AfterNotOk if ended => DepState::Never,
            _ => DepState::Waiting,
        })
    }

    /// The verdicts for a new submission, refusing targets that do not exist or are forgotten.
    pub(crate) fn judge_submission(&self, deps: &[Dependency]) -> Result<Vec<DepState>, CommandError> {
        deps.iter()
            .map(|dep| {
                if dep.kind == DependencyKind::Singleton {
                    return Ok(DepState::Waiting);
                }
                let shown = match dep.task {
                    Some(t) => format!("{}_{t}", dep.job),
                    None => dep.job.to_string(),
                };
                self.judge(dep).ok_or_else(|| {
                    let why = if dep.job == 0 || dep.job >= self.meta.next_job_id {
                        format!("job {shown} does not exist")
                    } else {
                        format!("job {shown} ended too long ago for its result to be known (sacct -j {shown} shows it)")
                    };
                    CommandError::DependencyProblem(why)
                })
            })
            .collect()
    }

    pub(crate) fn index_dependencies(&mut self, job: &Job) {
        for dep in job.spec.dependency.iter().filter(|d| d.kind != DependencyKind::Singleton) {
            self.dependents.entry(dep.job).or_default().insert(job.id);
        }
    }

    pub(crate) fn unindex(&mut self, id: JobId, targets: &[JobId]) {
        for target in targets {
            if let Some(set) = self.dependents.get_mut(target) {
                set.remove(&id);
                if set.is_empty() {
                    self.dependents.remove(target);
                }
            }
        }
    }

    pub(crate) fn remember_fate(&mut self, id: JobId, fate: Fate) {
        self.fates.insert(id, fate);
        while self.fates.len() > FATE_CAPACITY {
            self.fates.pop_first();
        }
    }

    /// After a command: record the fates of jobs that ended, re-judge the dependencies of pending jobs whose
    /// targets started or ended in it (their new verdicts join `changes`), and cancel the jobs that asked for it
    /// (`--kill-on-invalid-dep=yes`) once their dependencies can never hold, as Slurm does. A job cancelled so is
    /// itself a fate others may wait on, so this repeats until a round cancels nothing; each round that goes on
    /// ends at least one active job, so it stops.
    pub(crate) fn track_dependencies(&mut self, changes: &mut Vec<Change>, now_ms: u64) {
        let mut from = 0;
        loop {
            self.rejudge(changes, from);
            let doomed = self.doomed(&changes[from..]);
            from = changes.len();
            if doomed.is_empty() {
                return;
            }
            for id in doomed {
                self.cancel_never_satisfied(id, now_ms, changes);
            }
        }
    }

    /// Pending jobs written by `changes` that asked to be cancelled and whose dependencies can never hold now.
    fn doomed(&self, changes: &[Change]) -> BTreeSet<JobId> {
        changes
            .iter()
            .filter_map(|c| if let Change::PutJob(job) = c { Some(job.id) } else { None })
            .filter(|id| {
                self.jobs.get(id).is_some_and(|job| {
                    job.state == JobState::Pending
                        && job.spec.kill_on_invalid_dep
                        && combine(&job.dependency_state, job.spec.dependency_any) == DepState::Never
                })
            })
            .collect()
    }

    /// Ends a pending job whose dependencies can never hold: CANCELLED, with the reason Slurm gives.
    fn cancel_never_satisfied(&mut self, id: JobId, now_ms: u64, changes: &mut Vec<Change>) {
        let Some(mut job) = self.remove_active(id) else { return };
        job.state = JobState::Cancelled;
        job.reason = PendingReason::DependencyNeverSatisfied;
        job.end_time_ms = Some(now_ms);
        changes.push(Change::ArchiveJob(job));
    }

    /// Records the fates of jobs that ended in `changes[from..]`, and re-judges the dependencies of pending jobs
    /// whose targets started or ended there (their new verdicts join `changes`).
    fn rejudge(&mut self, changes: &mut Vec<Change>, from: usize) {
        // What each started or ended job means for dependencies; collected first (no clones of whole jobs: this
        // runs on every entry, plans with a thousand starts included).
        let mut keys = BTreeSet::new();
        let mut fates = Vec::new();
        let mut left_queue = Vec::new();
        for change in &changes[from..] {
            let job = match change {
                Change::ArchiveJob(job) => job,
                Change::PutJob(job) if job.state != JobState::Pending => job,
                _ => continue,
            };
            if job.state.is_terminal() {
                fates.push((job.id, Fate::of(job)));
            }
            if !job.spec.dependency.is_empty() {
                left_queue.push((job.id, job.spec.dependency.iter().map(|d| d.job).collect::<Vec<_>>()));
            }
            keys.insert(job.id);
            if let Some(a) = job.array.as_deref() {
                keys.insert(a.array_job_id);
            }
        }
        for (id, fate) in fates {
            self.remember_fate(id, fate);
        }
        for (id, targets) in left_queue {
            self.unindex(id, &targets);
        }
        if self.dependents.is_empty() {
            return;
        }
        let waiting: BTreeSet<JobId> =
            keys.iter().filter_map(|k| self.dependents.get(k)).flat_map(|set| set.iter().copied()).collect();
        for id in waiting {
            let Some(job) = self.jobs.get(&id) else { continue };
            let verdicts: Vec<DepState> = job
                .spec
                .dependency
                .iter()
                .zip(&job.dependency_state)
                .map(|(dep, old)| self.judge(dep).unwrap_or(*old))
                .collect();
            if verdicts[..] != job.dependency_state[..] {
                let job = self.jobs.get_mut(&id).expect("listed above");
                job.dependency_state = verdicts.into();
                changes.push(Change::PutJob(job.clone()));
            }
        }
    }
}

/// All entries must hold (Slurm's `,`), or any one (`?`).
pub fn combine(states: &[DepState], any: bool) -> DepState {
    if states.is_empty() {
        return DepState::Satisfied;
    }
    let has = |s: DepState| states.contains(&s);
    match any {
        false if has(DepState::Never) => DepState::Never,
        false if states.iter().all(|s| *s == DepState::Satisfied) => DepState::Satisfied,
        true if has(DepState::Satisfied) => DepState::Satisfied,
        true if states.iter().all(|s| *s == DepState::Never) => DepState::Never,
        _ => DepState::Waiting,
    }
}

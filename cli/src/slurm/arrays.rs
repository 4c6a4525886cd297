//! Pending array tasks as Slurm shows them: one record for the tasks not yet split off (`123_[1-3]` in squeue,
//! `ArrayTaskId=1-3` in scontrol), since Slurm keeps them as one job until a task starts.

use drover_state::{Job, JobState};

/// One record of a listing.
pub enum Row<'a> {
    Job(&'a Job),
    /// Pending tasks of one array, waiting for the same reason: one record, as Slurm prints them (unless asked
    /// for one per task, squeue's `-r`).
    Group {
        first: &'a Job,
        task_ids: Vec<u32>,
    },
}

/// `jobs` (in id order) as records: consecutive pending tasks of an array with the same reason grouped.
pub fn rows(jobs: &[Job], one_per_task: bool) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = Vec::new();
    for job in jobs {
        let groupable = !one_per_task && job.state == JobState::Pending && job.array.is_some();
        if groupable
            && let Some(Row::Group { first, task_ids }) = rows.last_mut()
            && first.array.as_deref().map(|a| a.array_job_id) == job.array.as_deref().map(|a| a.array_job_id)
            && first.reason == job.reason
        {
            task_ids.push(job.array.as_deref().expect("checked").task_id);
            continue;
        }
        rows.push(match (groupable, job.array.as_deref().copied()) {
            (true, Some(a)) => Row::Group { first: job, task_ids: vec![a.task_id] },
            _ => Row::Job(job),
        });
    }
    rows
}

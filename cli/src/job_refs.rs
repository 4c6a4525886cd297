//! Job ids as users type them to `scancel`, `scontrol`, `squeue -j` and `sacct -j`: `12`, `12,13`, `12_3`,
//! `12_[1-5,7]`. An array's id stands for all of its tasks, as in Slurm. Each task is a job of its own inside
//! Drover, so references are resolved to concrete job ids with one listing.

use drover_client::{Client, JobFilter};
use drover_state::Job;
use drover_state::array::{JobRef, parse_job_ref};

/// Splits `12,13_[1,3],14` at the commas outside brackets.
pub fn split_refs(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for arg in args {
        let mut depth = 0i32;
        let mut current = String::new();
        for c in arg.chars() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => {
                    if !current.is_empty() {
                        out.push(std::mem::take(&mut current));
                    }
                    continue;
                }
                _ => {}
            }
            current.push(c);
        }
        if !current.is_empty() {
            out.push(current);
        }
    }
    out
}

/// Parses every reference (refusing a malformed one with Slurm's words).
pub fn parse_refs(args: &[String]) -> Result<Vec<JobRef>, drover_state::array::InvalidJobRef> {
    split_refs(args).iter().map(|r| parse_job_ref(r)).collect()
}

/// The base ids to ask the controllers about.
pub fn base_ids(refs: &[JobRef]) -> Vec<u64> {
    let mut ids: Vec<u64> = refs
        .iter()
        .map(|r| match r {
            JobRef::Job(id) | JobRef::Task(id, _) | JobRef::Tasks(id, _) => *id,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Array tasks named that are not among the jobs listed, in Slurm's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid job id specified: {0}")]
pub struct NoSuchTask(pub String);

/// Picks the jobs each reference names out of `jobs` (a listing for `base_ids`). A plain id that matches
/// nothing is kept as it is, so the controller answers for it ("Invalid job id", "already finished"); a task
/// that matches nothing is an error.
pub fn select(refs: &[JobRef], jobs: &[Job]) -> Result<Vec<u64>, NoSuchTask> {
    let mut out = Vec::new();
    for r in refs {
        let before = out.len();
        let (base, tasks): (u64, Option<Vec<u32>>) = match r {
            JobRef::Job(id) => (*id, None),
            JobRef::Task(id, t) => (*id, Some(vec![*t])),
            JobRef::Tasks(id, ts) => (*id, Some(ts.clone())),
        };
        for job in jobs {
            let hit = match (&tasks, job.array.as_deref().copied()) {
                (None, None) => job.id == base,
                (None, Some(a)) => a.array_job_id == base,
                (Some(ts), Some(a)) => a.array_job_id == base && ts.contains(&a.task_id),
                (Some(_), None) => false,
            };
            if hit {
                out.push(job.id);
            }
        }
        match (&tasks, out.len() == before) {
            (None, true) => out.push(base),
            (Some(ts), true) => {
                let shown = ts.iter().map(|t| format!("{base}_{t}")).collect::<Vec<_>>().join(",");
                return Err(NoSuchTask(shown));
            }
            _ => {}
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Whether a listed job is one the references name (for `squeue -j` and `sacct -j`, which list by base id).
pub fn names(refs: &[JobRef], job: &Job) -> bool {
    refs.is_empty() || select(refs, std::slice::from_ref(job)).is_ok_and(|ids| ids.contains(&job.id))
}

/// Resolves references against the cluster (finished jobs too, when `include_finished`).
pub async fn resolve(client: &Client, args: &[String], include_finished: bool) -> anyhow::Result<Vec<u64>> {
    let refs = parse_refs(args).map_err(|e| anyhow::anyhow!(e))?;
    let filter = JobFilter { ids: base_ids(&refs), include_finished, ..JobFilter::default() };
    let (jobs, _) = client.list_jobs(&filter).await?;
    Ok(select(&refs, &jobs)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_state::ArrayTask;

    fn job(id: u64, array: Option<(u64, u32)>) -> Job {
        let array = array.map(|(array_job_id, task_id)| ArrayTask {
            array_job_id,
            task_id,
            task_count: 3,
            task_min: 0,
            task_max: 4,
            max_running: None,
        });
        Job { id, array: array.map(Box::new), ..Job::default() }
    }

    #[test]
    fn an_array_id_names_every_task_and_a_task_id_only_that_task() {
        let jobs = vec![job(10, Some((10, 0))), job(11, Some((10, 2))), job(12, Some((10, 4))), job(13, None)];
        let refs = parse_refs(&["10".into()]).unwrap();
        assert_eq!(select(&refs, &jobs).unwrap(), vec![10, 11, 12]);
        let refs = parse_refs(&["10_4,13".into()]).unwrap();
        assert_eq!(select(&refs, &jobs).unwrap(), vec![12, 13]);
        let refs = parse_refs(&["10_[0,2]".into()]).unwrap();
        assert_eq!(select(&refs, &jobs).unwrap(), vec![10, 11]);
        let refs = parse_refs(&["10_7".into()]).unwrap();
        assert_eq!(select(&refs, &jobs).unwrap_err().to_string(), "Invalid job id specified: 10_7");
        let refs = parse_refs(&["99".into()]).unwrap();
        assert_eq!(select(&refs, &jobs).unwrap(), vec![99], "unknown plain ids go to the controller as they are");
    }

    #[test]
    fn commas_inside_brackets_do_not_split() {
        assert_eq!(split_refs(&["1,2_[3,4],5".into()]), vec!["1", "2_[3,4]", "5"]);
    }
}

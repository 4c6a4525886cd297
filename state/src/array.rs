//! Job arrays: Slurm's `--array` syntax (`0-15:4%2`), the compressed task list `squeue` prints (`[0-3,7%2]`), and
//! job references that may name array tasks (`123`, `123_4`, `123_[1-5,7]`), as `scancel` and `scontrol` take them.
//!
//! Pure functions: no state, no I/O.

use crate::model::job::{ArraySpec, JobId};
use drover_common::ranges::{RangeError, parse_ranges};

/// What is wrong with an `--array` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    #[error("the value is empty")]
    Empty,
    #[error("\"%\" must be followed by the most tasks to run at once, e.g. 0-15%4")]
    LimitMissing,
    #[error("\"%{0}\" is not a task limit; expected %N with N at least 1")]
    LimitNotANumber(String),
    #[error("%0 would let no task run; the limit after % must be at least 1")]
    LimitZero,
    #[error("no task ids before %{0}")]
    NoTaskIds(String),
    #[error(transparent)]
    TaskIds(#[from] RangeError),
}

/// An `--array` value that does not parse, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --array value {text:?}: {problem}")]
pub struct InvalidArray {
    pub text: String,
    pub problem: ArrayError,
}

/// A job reference that names no job (Slurm's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid job id specified: {0}")]
pub struct InvalidJobRef(pub String);

/// The largest `MaxArraySize` Slurm allows; task ids in a job reference (`123_[...]`) must be below it.
pub const SLURM_MAX_ARRAY_SIZE: u32 = 4_000_001;

/// Parses `--array`: comma-separated entries `N`, `N-M` or `N-M:STEP`, then an optional `%N` limit on the tasks
/// running at once (N at least 1). Every id must be below `max_tasks` (Slurm's `MaxArraySize`). The ids come back
/// sorted and without duplicates.
///
/// The error is one line naming the problem: `invalid --array value "5-1": range end 1 is below its start 5`.
pub fn parse_array_spec(text: &str, max_tasks: u32) -> Result<ArraySpec, InvalidArray> {
    parse_array_value(text, max_tasks).map_err(|problem| InvalidArray { text: text.to_string(), problem })
}

/// [`parse_array_spec`] with the error holding only the problem (`range end 1 is below its start 5`), for callers
/// that wrap it in a message of their own (the option as the user spelled it, `-a`).
pub fn parse_array_value(text: &str, max_tasks: u32) -> Result<ArraySpec, ArrayError> {
    if text.is_empty() {
        return Err(ArrayError::Empty);
    }
    let (body, limit) = match text.split_once('%') {
        Some((body, limit)) => (body, Some(limit)),
        None => (text, None),
    };
    let max_running = match limit {
        None => None,
        Some("") => return Err(ArrayError::LimitMissing),
        Some(limit) if !is_digits(limit) => return Err(ArrayError::LimitNotANumber(limit.to_string())),
        Some(limit) => match limit.parse::<u32>() {
            Ok(0) => return Err(ArrayError::LimitZero),
            Ok(n) => Some(n),
            // More than u32 can hold: no limit could be tighter than the array itself.
            Err(_) => Some(u32::MAX),
        },
    };
    if body.is_empty() {
        return Err(ArrayError::NoTaskIds(limit.unwrap_or_default().to_string()));
    }
    let task_ids = parse_ranges(body, "task id", max_tasks, "MaxArraySize")?;
    Ok(ArraySpec { task_ids: task_ids.into(), max_running })
}

/// Slurm's compressed form of a task list, as `squeue` prints a pending array's tasks: `[0-3,7,9-10%2]`. The
/// brackets are always there; `%N` only when a limit is given. `ids` should be sorted and unique (as
/// [`ArraySpec::task_ids`] is); runs of consecutive ids become `N-M`.
pub fn format_task_ids(ids: &[u32], max_running: Option<u32>) -> String {
    let mut out = String::from("[");
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut j = i;
        while j + 1 < ids.len() && ids[j].checked_add(1) == Some(ids[j + 1]) {
            j += 1;
        }
        if i > 0 {
            out.push(',');
        }
        if j > i {
            out.push_str(&format!("{start}-{}", ids[j]));
        } else {
            out.push_str(&start.to_string());
        }
        i = j + 1;
    }
    if let Some(n) = max_running {
        out.push_str(&format!("%{n}"));
    }
    out.push(']');
    out
}

/// A job named on a command line (`scancel`, `scontrol`): a whole job (or every task of an array), one array
/// task, or a set of tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRef {
    /// `123`.
    Job(JobId),
    /// `123_4`.
    Task(JobId, u32),
    /// `123_[1-5,7]` (also `123_[0-9:3]`): sorted, unique; a single bracketed id (`123_[4]`) is a one-element set.
    Tasks(JobId, Vec<u32>),
}

/// Parses `123`, `123_4` or `123_[1-5,7]` (entries as in `--array`, steps allowed, no `%`). Job ids start at 1;
/// bracketed task ids must be below [`SLURM_MAX_ARRAY_SIZE`]. The error is Slurm's:
/// `Invalid job id specified: {text}`.
pub fn parse_job_ref(text: &str) -> Result<JobRef, InvalidJobRef> {
    let bad = || InvalidJobRef(text.to_string());
    let (job, task) = match text.split_once('_') {
        Some((job, task)) => (job, Some(task)),
        None => (text, None),
    };
    if !is_digits(job) {
        return Err(bad());
    }
    let job: JobId = match job.parse() {
        Ok(0) | Err(_) => return Err(bad()),
        Ok(id) => id,
    };
    let Some(task) = task else {
        return Ok(JobRef::Job(job));
    };
    if let Some(inner) = task.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        if inner.is_empty() || inner.contains('%') {
            return Err(bad());
        }
        let ids = parse_ranges(inner, "task id", SLURM_MAX_ARRAY_SIZE, "MaxArraySize").map_err(|_| bad())?;
        return Ok(JobRef::Tasks(job, ids));
    }
    if !is_digits(task) {
        return Err(bad());
    }
    task.parse().map(|t| JobRef::Task(job, t)).map_err(|_| bad())
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<u32> {
        parse_array_spec(text, 1001).unwrap_or_else(|e| panic!("{text:?}: {e}")).task_ids.to_vec()
    }

    fn err(text: &str) -> String {
        match parse_array_spec(text, 1001) {
            Ok(spec) => panic!("{text:?} should fail, got {spec:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn ranges_lists_and_steps() {
        assert_eq!(ids("0-15"), (0..=15).collect::<Vec<_>>());
        assert_eq!(ids("0,6,16-20"), vec![0, 6, 16, 17, 18, 19, 20]);
        assert_eq!(ids("0-15:4"), vec![0, 4, 8, 12]);
        assert_eq!(ids("1-5,10"), vec![1, 2, 3, 4, 5, 10]);
        assert_eq!(ids("7"), vec![7]);
        assert_eq!(ids("3-3"), vec![3]);
        assert_eq!(ids("0-10:20"), vec![0]);
        assert_eq!(ids("1-7:3"), vec![1, 4, 7]);
        assert_eq!(ids("1000"), vec![1000]);
        assert_eq!(ids("007"), vec![7]);
    }

    #[test]
    fn sorted_and_unique() {
        assert_eq!(ids("10,1-3,2,3-4,0"), vec![0, 1, 2, 3, 4, 10]);
        assert_eq!(ids("5,5,5"), vec![5]);
        // Many overlapping entries stay bounded by the unique ids.
        let text = vec!["0-1000"; 50].join(",");
        assert_eq!(ids(&text).len(), 1001);
    }

    #[test]
    fn max_running() {
        let spec = parse_array_spec("0-15%4", 1001).unwrap();
        assert_eq!(spec, ArraySpec { task_ids: (0..=15).collect(), max_running: Some(4) });
        assert_eq!(parse_array_spec("1,3%1", 1001).unwrap().max_running, Some(1));
        assert_eq!(parse_array_spec("1-3", 1001).unwrap().max_running, None);
        assert_eq!(parse_array_spec("1%99999999999", 1001).unwrap().max_running, Some(u32::MAX));
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(err("5-1"), "invalid --array value \"5-1\": range end 1 is below its start 5");
        assert_eq!(err("0-5000"), "invalid --array value \"0-5000\": task id 5000 is not below MaxArraySize 1001");
        assert_eq!(err("1001"), "invalid --array value \"1001\": task id 1001 is not below MaxArraySize 1001");
        assert!(err("99999999999999999999999").contains("task id 99999999999999999999999 is not below"));
        assert_eq!(err("0-15:0"), "invalid --array value \"0-15:0\": step 0 in \"0-15:0\" must be at least 1");
        assert_eq!(
            err("0-15%0"),
            "invalid --array value \"0-15%0\": %0 would let no task run; the limit after % must be at least 1"
        );
        assert!(err("0-15%").contains("\"%\" must be followed by"));
        assert!(err("0-15%x").contains("\"%x\" is not a task limit"));
        assert!(err("0-15%-1").contains("is not a task limit"));
        assert!(err("0-15%2%3").contains("is not a task limit"));
        assert!(err("%4").contains("no task ids before %4"));
        assert!(err("").contains("the value is empty"));
        for bad in ["1,,2", ",1", "1,"] {
            assert!(err(bad).contains("an entry is empty"), "{bad}");
        }
        for bad in ["-1", "1-", "a", "1-b", "1 - 2", "+3", "1-2-3", "[1-3]", " 1"] {
            let msg = err(bad);
            assert!(msg.starts_with(&format!("invalid --array value {bad:?}: ")), "{msg}");
            assert!(msg.contains("is not a task id or range; expected N, N-M or N-M:STEP"), "{bad}: {msg}");
        }
        assert!(err("5:2").contains("has a step but no range"));
        assert!(err("1-5:x").contains("has a bad step \"x\""));
        assert!(err("1-5:2:3").contains("has a bad step"));
        // One line, always.
        assert!(!err("1,,2").contains('\n'));
    }

    #[test]
    fn value_errors_have_no_prefix() {
        assert_eq!(parse_array_value("5-1", 1001).unwrap_err().to_string(), "range end 1 is below its start 5");
        assert_eq!(parse_array_value("4", 4).unwrap_err().to_string(), "task id 4 is not below MaxArraySize 4");
        assert_eq!(parse_array_value("3", 4).unwrap().task_ids, vec![3]);
    }

    #[test]
    fn formatting() {
        assert_eq!(format_task_ids(&[0, 1, 2, 3, 7, 9, 10], Some(2)), "[0-3,7,9-10%2]");
        assert_eq!(format_task_ids(&[5], None), "[5]");
        assert_eq!(format_task_ids(&[5], Some(1)), "[5%1]");
        assert_eq!(format_task_ids(&[0, 2, 4], None), "[0,2,4]");
        assert_eq!(format_task_ids(&[1, 2], None), "[1-2]");
        assert_eq!(format_task_ids(&[], None), "[]");
        assert_eq!(format_task_ids(&[u32::MAX - 1, u32::MAX], None), format!("[{}-{}]", u32::MAX - 1, u32::MAX));
    }

    #[test]
    fn format_round_trips_through_parse() {
        for text in ["0-15", "0,6,16-32", "0-15:4", "1-5,10", "3", "0-2,4-6:2,100-101"] {
            let spec = parse_array_spec(text, 1001).unwrap();
            let formatted = format_task_ids(&spec.task_ids, spec.max_running);
            let inner = formatted.trim_start_matches('[').trim_end_matches(']');
            assert_eq!(parse_array_spec(inner, 1001).unwrap(), spec, "{text} -> {formatted}");
        }
    }

    #[test]
    fn job_refs() {
        assert_eq!(parse_job_ref("123"), Ok(JobRef::Job(123)));
        assert_eq!(parse_job_ref("123_4"), Ok(JobRef::Task(123, 4)));
        assert_eq!(parse_job_ref("123_0"), Ok(JobRef::Task(123, 0)));
        assert_eq!(parse_job_ref("123_[1-5,7]"), Ok(JobRef::Tasks(123, vec![1, 2, 3, 4, 5, 7])));
        assert_eq!(parse_job_ref("123_[0-9:3]"), Ok(JobRef::Tasks(123, vec![0, 3, 6, 9])));
        assert_eq!(parse_job_ref("123_[4]"), Ok(JobRef::Tasks(123, vec![4])));
        assert_eq!(parse_job_ref("123_[7,1]"), Ok(JobRef::Tasks(123, vec![1, 7])));
    }

    #[test]
    fn bad_job_refs() {
        for bad in [
            "",
            "0",
            "abc",
            "-1",
            "12a",
            "123_",
            "_4",
            "123_x",
            "123_[]",
            "123_[1-5",
            "123_1-5]",
            "123_[5-1]",
            "123_[1%2]",
            "123_4_5",
            "123_[1,,2]",
            " 123",
            "123 ",
            "99999999999999999999999",
            "123_4294967296",
            "123_[4000001]",
            "123_[1-2]x",
        ] {
            assert_eq!(
                parse_job_ref(bad).map_err(|e| e.to_string()),
                Err(format!("Invalid job id specified: {bad}")),
                "{bad:?}"
            );
        }
        assert_eq!(parse_job_ref("123_[4000000]"), Ok(JobRef::Tasks(123, vec![4_000_000])));
    }
}

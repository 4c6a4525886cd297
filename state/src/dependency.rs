//! Slurm's `--dependency` syntax (`afterok:12:13,afterany:5_3`, `singleton`), both ways.
//!
//! Pure functions: whether a dependency holds is the scheduler's business, not this module's.

use std::collections::HashSet;

use crate::model::job::{Dependency, DependencyKind, JobId};

/// The dependency types Drover supports, as they are spelled in the syntax.
pub const SUPPORTED_DEPENDENCY_TYPES: &str = "after, afterok, afterany, afternotok, singleton";

/// Parses `--dependency`: entries `TYPE:JOB[:JOB...]` (each `JOB` is `N` or `N_TASK`, one array task) or
/// `singleton`, joined by `,` (all must hold; `any` = false) or by `?` (any one suffices; `any` = true). Mixing
/// the two separators is an error, as in Slurm. Types are matched case-insensitively. A bare job id (`123`) is
/// Slurm's old form and means `afterany:123`. An empty text means no dependencies.
///
/// Not supported, and refused with a message saying so: time delays (`after:7+60`) and the types `aftercorr`,
/// `afterburstbuffer` and `expand`.
///
/// The error is one line: `invalid --dependency value "afterok:x": "x" is not a job id; ...`.
pub fn parse_dependency(text: &str) -> Result<(Vec<Dependency>, bool), InvalidDependency> {
    parse_dependency_value(text).map_err(|problem| InvalidDependency { text: text.to_string(), problem })
}

/// A `--dependency` value that cannot be read, with the value as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --dependency value {text:?}: {problem}")]
pub struct InvalidDependency {
    pub text: String,
    pub problem: DependencyProblem,
}

/// What is wrong inside a dependency value; each message says what would be accepted instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DependencyProblem {
    #[error(
        "\",\" and \"?\" cannot be mixed: join entries with \",\" when all must hold, or with \"?\" when any one \
         suffices"
    )]
    MixedSeparators,
    #[error("an entry is empty (a doubled, leading or trailing separator?)")]
    EmptyEntry,
    #[error(
        "{entry:?} has no dependency type; expected TYPE:JOB[:JOB...] with TYPE one of {SUPPORTED_DEPENDENCY_TYPES}"
    )]
    NoType { entry: String },
    #[error("dependency type {name:?} is not supported; supported: {SUPPORTED_DEPENDENCY_TYPES}")]
    UnsupportedType { name: String },
    #[error("singleton takes no job ids (got {entry:?}); write it alone: singleton")]
    SingletonWithIds { entry: String },
    #[error("{kind} needs at least one job id: {kind}:JOB[:JOB...]")]
    NoJobIds { kind: &'static str },
    #[error("time delays ({text:?}, after:JOB+MINUTES) are not supported; drop the +MINUTES part, or use --begin")]
    TimeDelay { text: String },
    #[error("a job id is empty; {JOB_ID_FORMS}")]
    EmptyJobId,
    #[error("{text:?} is not a job id; {JOB_ID_FORMS}")]
    NotAJobId { text: String },
    #[error("job id {text} is too large")]
    JobIdTooLarge { text: String },
    #[error("job id 0 is not valid; job ids start at 1")]
    JobIdZero,
    #[error("array task id {text} is too large")]
    TaskIdTooLarge { text: String },
}

const JOB_ID_FORMS: &str = "expected JOB or JOB_TASK (e.g. 123 or 123_4)";

/// [`parse_dependency`] with the error holding only the problem, for callers that wrap it in a message of their
/// own (`-d`, or `scontrol update Dependency=`).
pub fn parse_dependency_value(text: &str) -> Result<(Vec<Dependency>, bool), DependencyProblem> {
    if text.is_empty() {
        return Ok((Vec::new(), false));
    }
    let any = text.contains('?');
    if any && text.contains(',') {
        return Err(DependencyProblem::MixedSeparators);
    }
    let mut deps: Vec<Dependency> = Vec::new();
    // Repeats are dropped, first one kept. A set, not `deps.contains`: a 4 MiB script's `#SBATCH -d afterok:1:2:...`
    // holds some 500,000 ids, and checking each against the list took minutes (quadratic).
    let mut seen: HashSet<Dependency> = HashSet::new();
    for entry in text.split([',', '?']) {
        for dep in parse_entry(entry)? {
            if seen.insert(dep.clone()) {
                deps.push(dep);
            }
        }
    }
    Ok((deps, any))
}

/// One entry: `singleton`, `TYPE:JOB[:JOB...]`, or a bare `JOB` (old form of `afterany`).
fn parse_entry(entry: &str) -> Result<Vec<Dependency>, DependencyProblem> {
    if entry.is_empty() {
        return Err(DependencyProblem::EmptyEntry);
    }
    let mut parts = entry.split(':');
    let name = parts.next().unwrap_or_default();
    let ids: Vec<&str> = parts.collect();
    if name.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        if !ids.is_empty() {
            return Err(DependencyProblem::NoType { entry: entry.to_string() });
        }
        let (job, task) = job_id(name)?;
        return Ok(vec![Dependency { kind: DependencyKind::AfterAny, job, task }]);
    }
    let kind = match name.to_ascii_lowercase().as_str() {
        "after" => DependencyKind::After,
        "afterok" => DependencyKind::AfterOk,
        "afterany" => DependencyKind::AfterAny,
        "afternotok" => DependencyKind::AfterNotOk,
        "singleton" => DependencyKind::Singleton,
        "" => return Err(DependencyProblem::NoType { entry: entry.to_string() }),
        _ => return Err(DependencyProblem::UnsupportedType { name: name.to_string() }),
    };
    if kind == DependencyKind::Singleton {
        if !ids.is_empty() {
            return Err(DependencyProblem::SingletonWithIds { entry: entry.to_string() });
        }
        return Ok(vec![Dependency { kind, job: 0, task: None }]);
    }
    if ids.is_empty() {
        return Err(DependencyProblem::NoJobIds { kind: kind.name() });
    }
    ids.into_iter().map(|id| job_id(id).map(|(job, task)| Dependency { kind, job, task })).collect()
}

/// `N` or `N_TASK`, with N at least 1.
fn job_id(text: &str) -> Result<(JobId, Option<u32>), DependencyProblem> {
    if text.contains('+') {
        return Err(DependencyProblem::TimeDelay { text: text.to_string() });
    }
    if text.is_empty() {
        return Err(DependencyProblem::EmptyJobId);
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (job, task) = match text.split_once('_') {
        Some((job, task)) => (job, Some(task)),
        None => (text, None),
    };
    if !digits(job) || task.is_some_and(|t| !digits(t)) {
        return Err(DependencyProblem::NotAJobId { text: text.to_string() });
    }
    let job: JobId = job.parse().map_err(|_| DependencyProblem::JobIdTooLarge { text: job.to_string() })?;
    if job == 0 {
        return Err(DependencyProblem::JobIdZero);
    }
    let task = match task {
        Some(t) => Some(t.parse::<u32>().map_err(|_| DependencyProblem::TaskIdTooLarge { text: t.to_string() })?),
        None => None,
    };
    Ok((job, task))
}

/// The form `scontrol show job` prints: `afterok:12,afterany:5_3,singleton` (joined with `?` when any one
/// suffices), `(null)` when there are none.
pub fn format_dependency(deps: &[Dependency], any: bool) -> String {
    if deps.is_empty() {
        return "(null)".to_string();
    }
    let entries: Vec<String> = deps
        .iter()
        .map(|dep| match (dep.kind, dep.task) {
            (DependencyKind::Singleton, _) => "singleton".to_string(),
            (kind, Some(task)) => format!("{}:{}_{task}", kind.name(), dep.job),
            (kind, None) => format!("{}:{}", kind.name(), dep.job),
        })
        .collect();
    entries.join(if any { "?" } else { "," })
}

/// The dependencies as Slurm 22.05 shows a job's (`scontrol show job`, `squeue %E`): those still waiting marked
/// `(unfulfilled)`, those that can never hold `(failed)`, satisfied ones left out, and `(null)` once none is left.
/// `states` is the job's `dependency_state` (an entry it lacks counts as waiting).
pub fn format_dependency_status(deps: &[Dependency], any: bool, states: &[crate::model::job::DepState]) -> String {
    use crate::model::job::DepState;
    let entries: Vec<String> = deps
        .iter()
        .enumerate()
        .filter_map(|(i, dep)| {
            let mark = match states.get(i).copied().unwrap_or_default() {
                DepState::Satisfied => return None,
                DepState::Waiting => "unfulfilled",
                DepState::Never => "failed",
            };
            Some(format!("{}({mark})", format_dependency(std::slice::from_ref(dep), false)))
        })
        .collect();
    if entries.is_empty() { "(null)".to_string() } else { entries.join(if any { "?" } else { "," }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(kind: DependencyKind, job: JobId, task: Option<u32>) -> Dependency {
        Dependency { kind, job, task }
    }

    fn ok(text: &str) -> (Vec<Dependency>, bool) {
        parse_dependency(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn err(text: &str) -> String {
        match parse_dependency(text) {
            Ok(parsed) => panic!("{text:?} should fail, got {parsed:?}"),
            Err(e) => e.to_string(),
        }
    }

    use DependencyKind::*;

    #[test]
    fn all_types() {
        assert_eq!(ok("afterok:12:13"), (vec![dep(AfterOk, 12, None), dep(AfterOk, 13, None)], false));
        assert_eq!(ok("afterok:12_3"), (vec![dep(AfterOk, 12, Some(3))], false));
        assert_eq!(ok("afterany:5,afternotok:6"), (vec![dep(AfterAny, 5, None), dep(AfterNotOk, 6, None)], false));
        assert_eq!(ok("after:7"), (vec![dep(After, 7, None)], false));
        assert_eq!(ok("singleton"), (vec![dep(Singleton, 0, None)], false));
        assert_eq!(
            ok("afterok:1,singleton,afterany:2_0:3"),
            (
                vec![dep(AfterOk, 1, None), dep(Singleton, 0, None), dep(AfterAny, 2, Some(0)), dep(AfterAny, 3, None)],
                false
            )
        );
    }

    #[test]
    fn any_separator() {
        assert_eq!(ok("afterok:1?afternotok:2"), (vec![dep(AfterOk, 1, None), dep(AfterNotOk, 2, None)], true));
        assert_eq!(ok("afterok:1:2"), (vec![dep(AfterOk, 1, None), dep(AfterOk, 2, None)], false));
    }

    #[test]
    fn case_bare_ids_duplicates_and_empty() {
        assert_eq!(ok("AfterOK:4"), (vec![dep(AfterOk, 4, None)], false));
        assert_eq!(ok("SINGLETON"), (vec![dep(Singleton, 0, None)], false));
        assert_eq!(ok("12,13_1"), (vec![dep(AfterAny, 12, None), dep(AfterAny, 13, Some(1))], false));
        assert_eq!(ok("afterok:4:4,afterok:4"), (vec![dep(AfterOk, 4, None)], false));
        assert_eq!(ok(""), (vec![], false));
    }

    #[test]
    fn errors_name_the_problem() {
        let msg = err("afterok:1,afterany:2?after:3");
        assert!(msg.starts_with(
            "invalid --dependency value \"afterok:1,afterany:2?after:3\": \",\" and \"?\" cannot be mixed"
        ));
        let msg = err("after:7+60");
        assert!(msg.contains("time delays (\"7+60\", after:JOB+MINUTES) are not supported"), "{msg}");
        for unknown in ["aftercorr:5", "expand:5", "afterburstbuffer:5", "befor:1"] {
            let msg = err(unknown);
            let name = unknown.split(':').next().unwrap();
            assert!(msg.contains(&format!("dependency type {name:?} is not supported")), "{msg}");
            assert!(msg.ends_with("supported: after, afterok, afterany, afternotok, singleton"), "{msg}");
        }
        assert!(err("afterok:0").contains("job id 0 is not valid; job ids start at 1"));
        assert!(err("afterok:-1").contains("\"-1\" is not a job id"));
        assert!(err("afterok:abc").contains("\"abc\" is not a job id; expected JOB or JOB_TASK"));
        assert!(err("afterok:1_").contains("\"1_\" is not a job id"));
        assert!(err("afterok:1_x").contains("\"1_x\" is not a job id"));
        assert!(err("afterok:12_[1-3]").contains("is not a job id"));
        assert!(err("afterok:99999999999999999999999").contains("too large"));
        assert!(err("afterok:1_99999999999").contains("array task id 99999999999 is too large"));
        assert!(err("afterok").contains("afterok needs at least one job id: afterok:JOB[:JOB...]"));
        assert!(err("afterok:").contains("a job id is empty"));
        assert!(err("afterok:1:").contains("a job id is empty"));
        assert!(err("afterok:1,").contains("an entry is empty"));
        assert!(err(",afterok:1").contains("an entry is empty"));
        assert!(err("afterok:1??afterok:2").contains("an entry is empty"));
        assert!(err("singleton:5").contains("singleton takes no job ids"));
        assert!(err(":5").contains("has no dependency type"));
        assert!(err("5:6").contains("has no dependency type"));
        assert!(!err("afterok:1,").contains('\n'));
    }

    /// Half a million job ids (what a 4 MiB script's `#SBATCH -d` line holds) parse in linear time: the repeat
    /// check once compared every id with every earlier one.
    #[test]
    fn many_job_ids_parse_without_quadratic_work() {
        let ids: Vec<String> = (1..=500_000).map(|n| n.to_string()).collect();
        let (deps, _) = ok(&format!("afterok:{}:1:2", ids.join(":")));
        assert_eq!(deps.len(), 500_000);
        assert_eq!((deps[0].job, deps[499_999].job), (1, 500_000));
    }

    #[test]
    fn value_errors_have_no_prefix() {
        assert_eq!(parse_dependency_value("afterok:0").unwrap_err(), DependencyProblem::JobIdZero);
        assert_eq!(DependencyProblem::JobIdZero.to_string(), "job id 0 is not valid; job ids start at 1");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_dependency(&[], false), "(null)");
        assert_eq!(format_dependency(&[], true), "(null)");
        let deps = [dep(AfterOk, 12, None), dep(AfterAny, 5, Some(3)), dep(Singleton, 0, None)];
        assert_eq!(format_dependency(&deps, false), "afterok:12,afterany:5_3,singleton");
        assert_eq!(format_dependency(&deps, true), "afterok:12?afterany:5_3?singleton");
        assert_eq!(format_dependency(&[dep(After, 1, None), dep(AfterNotOk, 2, None)], false), "after:1,afternotok:2");
    }

    #[test]
    fn format_round_trips_through_parse() {
        for text in ["afterok:12,afterany:5_3,singleton", "after:1?afternotok:2", "singleton"] {
            let (deps, any) = ok(text);
            assert_eq!(format_dependency(&deps, any), text);
        }
    }

    #[test]
    fn a_jobs_dependencies_show_what_is_left_as_slurm_shows_them() {
        use crate::model::job::DepState::{Never, Satisfied, Waiting};
        let (deps, any) = ok("afterok:12,afterany:5_3,singleton");
        assert_eq!(
            format_dependency_status(&deps, any, &[]),
            "afterok:12(unfulfilled),afterany:5_3(unfulfilled),singleton(unfulfilled)"
        );
        assert_eq!(
            format_dependency_status(&deps, any, &[Satisfied, Never, Waiting]),
            "afterany:5_3(failed),singleton(unfulfilled)"
        );
        assert_eq!(format_dependency_status(&deps, any, &[Satisfied, Satisfied, Satisfied]), "(null)");
        assert_eq!(format_dependency_status(&[], false, &[]), "(null)");
    }
}

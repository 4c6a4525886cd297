//! `--dependency` evaluation. The scheduler itself only reads a per-job [`DependencyState`]; the caller
//! computes it from the replicated job table with [`evaluate`], so the pass stays a pure function of its view.

use serde::{Deserialize, Serialize};

use crate::model::{DependencyState, JobId};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dependency {
    AfterOk(JobId),
    AfterAny(JobId),
    AfterNotOk(JobId),
    /// Only one job with this name and user runs at a time.
    Singleton,
}

/// What the state knows about another job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobFate {
    Unfinished,
    Succeeded,
    Failed,
    /// Purged from the state (too old): Slurm treats a missing dependency as satisfied.
    Unknown,
}

/// Combines all dependencies (Slurm's `,` = all must hold). `singleton_blocked` says whether another job with the
/// same name and user is running or ahead in the queue.
pub fn evaluate(deps: &[Dependency], fate: impl Fn(JobId) -> JobFate, singleton_blocked: bool) -> DependencyState {
    let mut state = DependencyState::Satisfied;
    for d in deps {
        let s = match *d {
            Dependency::AfterOk(j) => match fate(j) {
                JobFate::Unfinished => DependencyState::Waiting,
                JobFate::Succeeded | JobFate::Unknown => DependencyState::Satisfied,
                JobFate::Failed => DependencyState::NeverSatisfied,
            },
            Dependency::AfterNotOk(j) => match fate(j) {
                JobFate::Unfinished => DependencyState::Waiting,
                JobFate::Failed | JobFate::Unknown => DependencyState::Satisfied,
                JobFate::Succeeded => DependencyState::NeverSatisfied,
            },
            Dependency::AfterAny(j) => match fate(j) {
                JobFate::Unfinished => DependencyState::Waiting,
                _ => DependencyState::Satisfied,
            },
            Dependency::Singleton => {
                if singleton_blocked {
                    DependencyState::Waiting
                } else {
                    DependencyState::Satisfied
                }
            }
        };
        state = match (state, s) {
            (DependencyState::NeverSatisfied, _) | (_, DependencyState::NeverSatisfied) => {
                DependencyState::NeverSatisfied
            }
            (DependencyState::Waiting, _) | (_, DependencyState::Waiting) => DependencyState::Waiting,
            _ => DependencyState::Satisfied,
        };
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combines_dependencies() {
        let fate = |j: JobId| match j {
            1 => JobFate::Succeeded,
            2 => JobFate::Failed,
            _ => JobFate::Unfinished,
        };
        assert_eq!(evaluate(&[Dependency::AfterOk(1)], fate, false), DependencyState::Satisfied);
        assert_eq!(evaluate(&[Dependency::AfterOk(2)], fate, false), DependencyState::NeverSatisfied);
        assert_eq!(
            evaluate(&[Dependency::AfterNotOk(2), Dependency::AfterAny(3)], fate, false),
            DependencyState::Waiting
        );
        assert_eq!(evaluate(&[Dependency::Singleton], fate, true), DependencyState::Waiting);
        assert_eq!(evaluate(&[], fate, true), DependencyState::Satisfied);
    }
}

//! What the dependency bookkeeping keeps in the state (finished jobs' fates, the reverse index of dependents),
//! apart from the handlers that keep it (`crate::apply::dependents`), which sit above the state.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::job::{ArrayTask, Job, JobId};

/// How many finished jobs' fates are remembered (Slurm forgets a job after `MinJobAge`, 300 s by default;
/// this covers far more than that at any realistic rate).
pub const FATE_CAPACITY: usize = 100_000;

/// How a finished job ended, as dependencies need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fate {
    pub succeeded: bool,
    pub array: Option<ArrayTask>,
}

impl Fate {
    pub fn of(job: &Job) -> Fate {
        Fate { succeeded: job.succeeded(), array: job.array.as_deref().copied() }
    }
}

/// The reverse index: target id (as written in `--dependency`) to the pending jobs naming it. Derived, never
/// persisted.
pub(crate) type Dependents = BTreeMap<JobId, BTreeSet<JobId>>;

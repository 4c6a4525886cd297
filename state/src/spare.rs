//! Hot-spare nodes: a pool that ordinary placement leaves alone, so that a large job losing a node restarts at
//! once on its surviving nodes plus spares instead of waiting for a full set of free nodes.
//!
//! Who may take a spare: a pending job whose last incarnation ended in `NODE_FAIL` (its node died, was fenced, or
//! failed a GPU health check: [`crate::model::job::RequeueKind::NodeFailure`]). Not a job requeued by request or by
//! preemption: those chose to stop (or lost to a higher priority), and letting them jump the queue onto reserved
//! nodes would turn the pool into a way around the queue. Not a fresh job either, however large: the pool exists
//! so that a failure costs a restart, not a wait in the queue. A spare a job starts on leaves the pool (apply clears
//! the flag): it has become one of the job's nodes, and an operator refills the pool, e.g. with the repaired node.

use crate::error::CommandError;
use crate::model::job::{Job, JobState};
use crate::state::{Change, State};

/// Most nodes one `spare=` update names (like any node list in a command, bounded).
pub const MAX_SPARE_UPDATE_NODES: usize = 4_096;

impl Job {
    /// Whether the scheduler may start this job on hot spares (see the module docs).
    pub fn may_use_spares(&self) -> bool {
        self.state == JobState::Pending
            && self.restart_count > 0
            && self.history.last().is_some_and(|h| h.state == JobState::NodeFail)
    }
}

impl State {
    pub(crate) fn set_node_spare(
        &mut self,
        names: &[String],
        spare: bool,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        if names.is_empty() {
            return Err(CommandError::InvalidRequest("spare=: name at least one node".into()));
        }
        if names.len() > MAX_SPARE_UPDATE_NODES {
            return Err(CommandError::InvalidRequest(format!(
                "spare=: {} nodes named, over the limit of {MAX_SPARE_UPDATE_NODES}",
                names.len()
            )));
        }
        if let Some(unknown) = names.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CommandError::InvalidNodeName { name: unknown.clone() });
        }
        for name in names {
            let node = self.nodes.get_mut(name).expect("checked above");
            if node.spare != spare {
                node.spare = spare;
                changes.push(Change::PutNode(node.clone()));
            }
        }
        Ok(())
    }
}

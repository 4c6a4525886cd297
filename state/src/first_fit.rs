//! The interim allocator: first fit in job-id order. The leader runs it over an immutable view of the state
//! and commits the result as one `ApplyPlan`; `apply` re-checks it. The scheduler library replaces it.

use std::collections::BTreeMap;

use crate::command::Allocation;
use crate::model::job::{Job, JobId, JobState, NodeAllocation, PendingReason};
use crate::model::node::Node;
use crate::state::State;

/// What one pass decided.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub allocations: Vec<Allocation>,
    /// Pending reasons that changed.
    pub reasons: Vec<(JobId, PendingReason)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty() && self.reasons.is_empty()
    }
}

/// Free capacity of one node during a pass.
struct Free {
    gpus: Vec<u32>,
    cpus: u32,
    mem_mb: u64,
}

/// Pending reasons are refreshed for at most this many jobs per pass, in queue order (Slurm's main scheduler
/// likewise looks at a bounded queue depth); jobs further back keep their reason until they move up. Without a
/// bound, a flood of submissions would cost one reason update per job, and a pass would walk the whole queue.
pub const MAX_REASON_UPDATES: usize = 1_000;

/// Places pending jobs in id order on the first nodes that fit, at most `max_allocations` of them.
pub fn first_fit(state: &State, max_allocations: usize) -> Plan {
    let mut free: BTreeMap<&str, Free> = state
        .nodes
        .values()
        // Hot spares are only for jobs restarting after a node failure, which the scheduler library places.
        .filter(|n| n.schedulable() && !n.spare)
        .map(|n| {
            (n.info.name.as_str(), Free { gpus: n.free_gpus().collect(), cpus: n.free_cpus(), mem_mb: n.free_mem_mb() })
        })
        .collect();
    let mut plan = Plan::default();
    let mut membership: BTreeMap<(&str, &str), bool> = BTreeMap::new();
    // Whether any node can take any more work (nodes that declare no CPU count never run out of CPUs).
    let has_room = |free: &BTreeMap<&str, Free>| {
        free.iter().any(|(name, f)| !f.gpus.is_empty() || f.cpus > 0 || state.nodes[*name].info.cpus == 0)
    };
    let mut room = has_room(&free);
    for (examined, job) in state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending && !j.held && !state.earlier_incarnation_lingers(j.id))
        .enumerate()
    {
        let can_place = room && plan.allocations.len() < max_allocations;
        if examined >= MAX_REASON_UPDATES && !can_place {
            break;
        }
        if can_place && let Some(nodes) = place(state, job, &mut free, &mut membership) {
            plan.allocations.push(Allocation { job_id: job.id, nodes });
            room = has_room(&free);
            continue;
        }
        if examined < MAX_REASON_UPDATES && plan.allocations.len() < max_allocations {
            let reason = blocked_reason(state, job);
            if reason != job.reason {
                plan.reasons.push((job.id, reason));
            }
        }
    }
    plan
}

fn place<'a>(
    state: &'a State,
    job: &'a Job,
    free: &mut BTreeMap<&'a str, Free>,
    membership: &mut BTreeMap<(&'a str, &'a str), bool>,
) -> Option<Vec<NodeAllocation>> {
    let spec = &job.spec;
    let tasks = spec.tasks_per_node(spec.min_nodes);
    let mut chosen: Vec<&str> = Vec::new();
    for (name, capacity) in free.iter() {
        if chosen.len() as u32 == spec.min_nodes {
            break;
        }
        let node = &state.nodes[*name];
        let cpus = tasks[chosen.len()].saturating_mul(spec.cpus_per_task);
        let fits = !spec.exclusive
            && spec.accepts_node(name, &node.info.features)
            && capacity.gpus.len() as u32 >= spec.gpus_per_node
            && (node.info.cpus == 0 || capacity.cpus >= cpus)
            && (!node.tracks_memory() || capacity.mem_mb >= node.mem_for(spec.mem_request(), cpus, spec.gpus_per_node))
            && spec.gpu_type.as_ref().is_none_or(|t| node.info.gpu_type.eq_ignore_ascii_case(t))
            && *membership
                .entry((name, job.partition.as_str()))
                .or_insert_with(|| state.node_in_partition(&node.info, &job.partition));
        if fits {
            chosen.push(name);
        }
    }
    if (chosen.len() as u32) < spec.min_nodes {
        return None;
    }
    let shares = chosen
        .iter()
        .zip(tasks)
        .map(|(name, tasks)| {
            let capacity = free.get_mut(name).expect("chosen from free");
            // Lowest indices first, so a node's GPUs fill in order and big jobs find whole nodes.
            let gpus: Vec<u32> = capacity.gpus.drain(..spec.gpus_per_node as usize).collect();
            let node = &state.nodes[*name];
            let cpus = if node.info.cpus == 0 { 0 } else { tasks * spec.cpus_per_task };
            let mem_mb = node.mem_for(spec.mem_request(), cpus, spec.gpus_per_node);
            capacity.cpus -= cpus;
            capacity.mem_mb -= mem_mb;
            NodeAllocation { node: name.to_string(), gpus, cpus, tasks, mem_mb }
        })
        .collect();
    Some(shares)
}

/// Slurm's wording: `Resources` when nodes exist that could run the job once freed, `ReqNodeNotAvail` when the
/// only nodes that could are down or drained.
fn blocked_reason(state: &State, job: &Job) -> PendingReason {
    let could_fit = |n: &&Node| {
        n.schedulable()
            && n.info.gpus.len() as u32 >= job.spec.gpus_per_node
            && state.node_in_partition(&n.info, &job.partition)
    };
    if (state.nodes.values().filter(could_fit).count() as u32) < job.spec.min_nodes {
        PendingReason::ReqNodeNotAvail
    } else {
        PendingReason::Resources
    }
}

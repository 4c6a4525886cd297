//! Judges a drill's [`History`] against what Drover promises under faults. A pure function of the history: the
//! same history always gets the same verdict.
//!
//! The promises, each a [`Violation`] when broken:
//! - every acknowledged submission exists when the drill ends, and no job id is given twice;
//! - no GPU is held by two running incarnations at any moment, and a job runs at most one incarnation at a time;
//! - a job seen in a terminal state (COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, DEADLINE) is never seen
//!   in another state afterwards (NODE_FAIL and PREEMPTED are not terminal here: a requeue follows them);
//! - an incarnation resumes from a checkpoint no older than the newest one acknowledged before it started;
//! - liveness: once the last fault has healed and the last submission was sent, every acknowledged job reaches a
//!   terminal state within a bound.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::history::{Event, EventKind, History};

/// The bounds the drill sets.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bounds {
    /// After the last fault heals (or the start, without faults), every acknowledged job must be seen terminal
    /// within this long. `None`: liveness is not judged (a drill that ends with jobs still meant to run).
    pub finish_within_ms: Option<u64>,
}

/// One broken promise, with what is needed to find it in the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The drill recorded no final listing, so losses cannot be judged.
    NoFinalListing,
    /// An acknowledged submission is not in the final listing.
    Lost { op: u64, job: u64, acked_ms: u64 },
    /// Two operations were acknowledged with the same job id.
    DuplicateJobId { job: u64, ops: (u64, u64) },
    /// One operation was acknowledged twice with different job ids.
    AckedTwice { op: u64, jobs: (u64, u64) },
    /// A GPU held by two running incarnations at once.
    GpuHeldTwice { node: String, gpu: u32, first: (u64, u64), second: (u64, u64), at_ms: u64 },
    /// Two incarnations of one job running at once.
    TwoIncarnations { job: u64, incarnations: (u64, u64), at_ms: u64 },
    /// A job seen terminal, then seen in another state.
    TerminalLeft { job: u64, from: String, to: String, at_ms: u64 },
    /// An incarnation resumed from an older checkpoint (or from scratch) although a newer one was acknowledged.
    StaleResume { job: u64, incarnation: u64, from_step: Option<u64>, acked_step: u64, at_ms: u64 },
    /// An acknowledged job not seen terminal by the liveness deadline.
    Unfinished { job: u64, last_state: Option<String>, deadline_ms: u64 },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NoFinalListing => write!(f, "no final job listing was recorded: losses cannot be judged"),
            Violation::Lost { op, job, acked_ms } => {
                write!(f, "job {job} (operation {op}, acknowledged at {acked_ms} ms) is missing from the final listing")
            }
            Violation::DuplicateJobId { job, ops } => {
                write!(f, "job id {job} was given to two submissions (operations {} and {})", ops.0, ops.1)
            }
            Violation::AckedTwice { op, jobs } => {
                write!(f, "operation {op} was acknowledged twice, as job {} and as job {}", jobs.0, jobs.1)
            }
            Violation::GpuHeldTwice { node, gpu, first, second, at_ms } => write!(
                f,
                "GPU {gpu} on {node} held by job {} incarnation {} and job {} incarnation {} at {at_ms} ms",
                first.0, first.1, second.0, second.1
            ),
            Violation::TwoIncarnations { job, incarnations, at_ms } => {
                write!(f, "job {job} ran incarnations {} and {} at once at {at_ms} ms", incarnations.0, incarnations.1)
            }
            Violation::TerminalLeft { job, from, to, at_ms } => {
                write!(f, "job {job} was {from}, then {to} at {at_ms} ms: a terminal state was left")
            }
            Violation::StaleResume { job, incarnation, from_step, acked_step, at_ms } => write!(
                f,
                "job {job} incarnation {incarnation} resumed from {} at {at_ms} ms, but step {acked_step} had been \
                 acknowledged",
                from_step.map_or("scratch".to_string(), |s| format!("step {s}"))
            ),
            Violation::Unfinished { job, last_state, deadline_ms } => write!(
                f,
                "job {job} was not seen finished by {deadline_ms} ms (last seen {})",
                last_state.as_deref().unwrap_or("never")
            ),
        }
    }
}

/// Whether a job in `state` has ended for good (Slurm's names; `CANCELLED by 0` counts as CANCELLED).
pub fn is_terminal(state: &str) -> bool {
    let base = state.split_whitespace().next().unwrap_or_default().trim_end_matches('+');
    matches!(base, "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "OUT_OF_MEMORY" | "DEADLINE" | "BOOT_FAIL")
}

/// Every broken promise in `history`, in the order found (acknowledgements, then placement, then states,
/// resumes and liveness).
pub fn check(history: &History, bounds: Bounds) -> Vec<Violation> {
    let mut violations = Vec::new();
    check_acknowledged(&history.events, &mut violations);
    check_placement(&history.events, &mut violations);
    check_terminal_states(&history.events, &mut violations);
    check_resumes(&history.events, &mut violations);
    if let Some(within) = bounds.finish_within_ms {
        check_liveness(&history.events, within, &mut violations);
    }
    violations
}

/// The acknowledged submissions: op -> (job, when).
fn acknowledged(events: &[Event]) -> BTreeMap<u64, (u64, u64)> {
    let mut acked = BTreeMap::new();
    for e in events {
        if let EventKind::SubmitAcked { op, job } = e.kind {
            acked.entry(op).or_insert((job, e.at_ms));
        }
    }
    acked
}

fn final_listing(events: &[Event]) -> Option<HashMap<u64, &str>> {
    events.iter().rev().find_map(|e| match &e.kind {
        EventKind::FinalJobs { jobs } => Some(jobs.iter().map(|(id, state)| (*id, state.as_str())).collect()),
        _ => None,
    })
}

fn check_acknowledged(events: &[Event], out: &mut Vec<Violation>) {
    let mut by_op: HashMap<u64, u64> = HashMap::new();
    let mut by_job: HashMap<u64, u64> = HashMap::new();
    for e in events {
        let EventKind::SubmitAcked { op, job } = e.kind else { continue };
        match by_op.get(&op) {
            Some(&first) if first != job => out.push(Violation::AckedTwice { op, jobs: (first, job) }),
            Some(_) => continue, // the same answer twice (a retried read of one reply)
            None => {
                by_op.insert(op, job);
            }
        }
        match by_job.get(&job) {
            Some(&other) if other != op => out.push(Violation::DuplicateJobId { job, ops: (other, op) }),
            Some(_) => {}
            None => {
                by_job.insert(job, op);
            }
        }
    }
    let Some(listing) = final_listing(events) else {
        out.push(Violation::NoFinalListing);
        return;
    };
    for (op, (job, acked_ms)) in acknowledged(events) {
        if !listing.contains_key(&job) {
            out.push(Violation::Lost { op, job, acked_ms });
        }
    }
}

/// Replays starts and ends in time order: a start finds a GPU, or a job, still held by another incarnation.
/// An incarnation that never reports its end holds on to the end of the history (a lost end is suspicious too).
fn check_placement(events: &[Event], out: &mut Vec<Violation>) {
    // (node, gpu) -> the (job, incarnation) holding it; job -> incarnation -> nodes it runs on.
    let mut gpus: HashMap<(&str, u32), (u64, u64)> = HashMap::new();
    let mut running: HashMap<u64, BTreeMap<u64, Vec<&str>>> = HashMap::new();
    for e in events {
        match &e.kind {
            EventKind::IncarnationStarted { job, incarnation, node, gpus: held } => {
                let me = (*job, *incarnation);
                for &gpu in held {
                    match gpus.get(&(node.as_str(), gpu)) {
                        Some(&holder) if holder != me => out.push(Violation::GpuHeldTwice {
                            node: node.clone(),
                            gpu,
                            first: holder,
                            second: me,
                            at_ms: e.at_ms,
                        }),
                        _ => {
                            gpus.insert((node.as_str(), gpu), me);
                        }
                    }
                }
                let incarnations = running.entry(*job).or_default();
                if let Some(&other) = incarnations.keys().find(|&&i| i != *incarnation) {
                    out.push(Violation::TwoIncarnations {
                        job: *job,
                        incarnations: (other, *incarnation),
                        at_ms: e.at_ms,
                    });
                }
                incarnations.entry(*incarnation).or_default().push(node.as_str());
            }
            EventKind::IncarnationEnded { job, incarnation, node } => {
                gpus.retain(|&(n, _), holder| !(n == node.as_str() && *holder == (*job, *incarnation)));
                if let Some(incarnations) = running.get_mut(job) {
                    if let Some(nodes) = incarnations.get_mut(incarnation) {
                        nodes.retain(|n| *n != node.as_str());
                        if nodes.is_empty() {
                            incarnations.remove(incarnation);
                        }
                    }
                    if incarnations.is_empty() {
                        running.remove(job);
                    }
                }
            }
            _ => {}
        }
    }
}

fn check_terminal_states(events: &[Event], out: &mut Vec<Violation>) {
    // job -> the terminal state it was first seen in.
    let mut ended: HashMap<u64, String> = HashMap::new();
    let mut judge = |job: u64, state: &str, at_ms: u64| match ended.get(&job) {
        Some(from) if !same_terminal(from, state) => {
            out.push(Violation::TerminalLeft { job, from: from.clone(), to: state.to_string(), at_ms });
        }
        Some(_) => {}
        None if is_terminal(state) => {
            ended.insert(job, state.to_string());
        }
        None => {}
    };
    for e in events {
        match &e.kind {
            EventKind::StateObserved { job, state } => judge(*job, state, e.at_ms),
            EventKind::FinalJobs { jobs } => jobs.iter().for_each(|(job, state)| judge(*job, state, e.at_ms)),
            _ => {}
        }
    }
}

/// The same terminal state, whatever its decorations (`CANCELLED by 0` and `CANCELLED+` are one).
fn same_terminal(a: &str, b: &str) -> bool {
    let base = |s: &str| s.split_whitespace().next().unwrap_or_default().trim_end_matches('+').to_string();
    base(a) == base(b)
}

fn check_resumes(events: &[Event], out: &mut Vec<Violation>) {
    // job -> the newest acknowledged step so far (of any earlier incarnation).
    let mut acked: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in events {
        match e.kind {
            EventKind::CheckpointAcked { job, incarnation, step } => {
                let entry = acked.entry(job).or_insert((step, incarnation));
                if step > entry.0 {
                    *entry = (step, incarnation);
                }
            }
            EventKind::Resumed { job, incarnation, from_step } => {
                if let Some(&(step, by)) = acked.get(&job)
                    && by < incarnation
                    && from_step.is_none_or(|from| from < step)
                {
                    out.push(Violation::StaleResume { job, incarnation, from_step, acked_step: step, at_ms: e.at_ms });
                }
            }
            _ => {}
        }
    }
}

fn check_liveness(events: &[Event], within_ms: u64, out: &mut Vec<Violation>) {
    // The bound runs from the later of the last heal and the last submission: the workload is part of what must
    // finish, and a job sent after the heal cannot have finished before it was sent.
    let healed_ms = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::FaultHealed { .. } | EventKind::SubmitSent { .. }))
        .map(|e| e.at_ms)
        .max()
        .or_else(|| events.first().map(|e| e.at_ms))
        .unwrap_or(0);
    let deadline_ms = healed_ms.saturating_add(within_ms);
    let mut finished: HashMap<u64, u64> = HashMap::new();
    let mut last: HashMap<u64, String> = HashMap::new();
    for e in events {
        let mut see = |job: u64, state: &str| {
            if is_terminal(state) {
                finished.entry(job).or_insert(e.at_ms);
            }
            last.insert(job, state.to_string());
        };
        match &e.kind {
            EventKind::StateObserved { job, state } => see(*job, state),
            EventKind::FinalJobs { jobs } => jobs.iter().for_each(|(job, state)| see(*job, state)),
            _ => {}
        }
    }
    for (job, _) in acknowledged(events).into_values() {
        if finished.get(&job).is_none_or(|&at| at > deadline_ms) {
            out.push(Violation::Unfinished { job, last_state: last.get(&job).cloned(), deadline_ms });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at_ms: u64, kind: EventKind) -> Event {
        Event { at_ms, kind }
    }

    fn started(at_ms: u64, job: u64, incarnation: u64, node: &str, gpus: &[u32]) -> Event {
        at(at_ms, EventKind::IncarnationStarted { job, incarnation, node: node.into(), gpus: gpus.to_vec() })
    }

    fn ended(at_ms: u64, job: u64, incarnation: u64, node: &str) -> Event {
        at(at_ms, EventKind::IncarnationEnded { job, incarnation, node: node.into() })
    }

    fn state(at_ms: u64, job: u64, state: &str) -> Event {
        at(at_ms, EventKind::StateObserved { job, state: state.into() })
    }

    /// A drill where job 1 is requeued from a checkpoint after its node is killed, job 2 runs on the same GPUs
    /// afterwards, and everything finishes after the heal: every promise kept.
    fn clean() -> Vec<Event> {
        vec![
            at(0, EventKind::SubmitSent { op: 1 }),
            at(5, EventKind::SubmitAcked { op: 1, job: 1 }),
            at(6, EventKind::SubmitSent { op: 2 }),
            at(7, EventKind::SubmitFailed { op: 2, error: "leader lost".into() }),
            at(8, EventKind::SubmitSent { op: 3 }),
            at(9, EventKind::SubmitAcked { op: 3, job: 2 }),
            started(10, 1, 0, "n1", &[0, 1]),
            state(11, 1, "RUNNING"),
            at(20, EventKind::CheckpointAcked { job: 1, incarnation: 0, step: 100 }),
            at(30, EventKind::FaultStarted { name: "kill n1".into() }),
            ended(31, 1, 0, "n1"),
            state(32, 1, "NODE_FAIL"),
            started(40, 1, 1, "n2", &[0, 1]),
            at(41, EventKind::Resumed { job: 1, incarnation: 1, from_step: Some(100) }),
            started(42, 2, 0, "n1", &[0, 1]),
            at(50, EventKind::FaultHealed { name: "kill n1".into() }),
            ended(60, 1, 1, "n2"),
            ended(61, 2, 0, "n1"),
            state(62, 1, "COMPLETED"),
            state(63, 2, "CANCELLED by 1000"),
            at(70, EventKind::FinalJobs { jobs: vec![(1, "COMPLETED".into()), (2, "CANCELLED+".into())] }),
        ]
    }

    fn verdict(events: Vec<Event>) -> Vec<Violation> {
        check(&History { events }, Bounds { finish_within_ms: Some(100) })
    }

    #[test]
    fn a_drill_that_kept_every_promise_has_no_violation() {
        assert_eq!(verdict(clean()), []);
    }

    #[test]
    fn a_lost_acknowledged_job_is_caught_and_a_failed_submission_is_not_one() {
        let mut events = clean();
        events.retain(|e| !matches!(e.kind, EventKind::FinalJobs { .. }));
        events.push(at(70, EventKind::FinalJobs { jobs: vec![(1, "COMPLETED".into())] }));
        let found = verdict(events);
        assert!(found.contains(&Violation::Lost { op: 3, job: 2, acked_ms: 9 }), "{found:?}");
        assert_eq!(found[0].to_string(), "job 2 (operation 3, acknowledged at 9 ms) is missing from the final listing");
        let mut events = clean();
        events.retain(|e| !matches!(e.kind, EventKind::FinalJobs { .. }));
        assert!(check(&History { events }, Bounds::default()).contains(&Violation::NoFinalListing));
    }

    #[test]
    fn a_job_id_given_twice_is_caught() {
        let mut events = clean();
        events.insert(9, at(9, EventKind::SubmitAcked { op: 4, job: 1 }));
        events.insert(10, at(9, EventKind::SubmitAcked { op: 3, job: 3 }));
        let found = verdict(events);
        assert!(found.contains(&Violation::DuplicateJobId { job: 1, ops: (1, 4) }), "{found:?}");
        assert!(found.contains(&Violation::AckedTwice { op: 3, jobs: (2, 3) }), "{found:?}");
    }

    #[test]
    fn a_gpu_held_by_two_incarnations_is_caught() {
        // Job 2 starts on n1's GPU 1 before job 1's first incarnation there is gone: a double booking.
        let mut events = clean();
        events.insert(6, started(9, 2, 0, "n1", &[1]));
        let found = verdict(events);
        let twice = found.iter().find(|v| matches!(v, Violation::GpuHeldTwice { .. })).expect("caught");
        assert_eq!(twice.to_string(), "GPU 1 on n1 held by job 2 incarnation 0 and job 1 incarnation 0 at 10 ms");
    }

    #[test]
    fn two_incarnations_of_one_job_running_at_once_are_caught() {
        // The double run of a partition: the new incarnation starts while the fenced one still runs.
        let mut events = clean();
        let end =
            events.iter().position(|e| matches!(e.kind, EventKind::IncarnationEnded { job: 1, incarnation: 0, .. }));
        let moved = events.remove(end.unwrap());
        events.insert(14, Event { at_ms: 45, ..moved });
        events.sort_by_key(|e| e.at_ms);
        let found = verdict(events);
        assert!(found.contains(&Violation::TwoIncarnations { job: 1, incarnations: (0, 1), at_ms: 40 }), "{found:?}");
    }

    #[test]
    fn leaving_a_terminal_state_is_caught_and_a_requeue_after_node_fail_is_not() {
        let mut events = clean();
        events.insert(19, state(64, 1, "RUNNING"));
        events.sort_by_key(|e| e.at_ms);
        let found = verdict(events);
        assert_eq!(
            found,
            [Violation::TerminalLeft { job: 1, from: "COMPLETED".into(), to: "RUNNING".into(), at_ms: 64 }],
            "NODE_FAIL then RUNNING earlier in the same history is a requeue, not a violation"
        );
    }

    #[test]
    fn resuming_from_an_older_checkpoint_or_from_scratch_is_caught() {
        for from_step in [Some(90), None] {
            let events = clean()
                .into_iter()
                .map(|e| match e.kind {
                    EventKind::Resumed { job, incarnation, .. } => {
                        at(e.at_ms, EventKind::Resumed { job, incarnation, from_step })
                    }
                    _ => e,
                })
                .collect();
            let found = verdict(events);
            assert_eq!(
                found,
                [Violation::StaleResume { job: 1, incarnation: 1, from_step, acked_step: 100, at_ms: 41 }]
            );
        }
    }

    #[test]
    fn a_job_not_finished_within_the_bound_after_the_heal_is_caught() {
        let mut events = clean();
        for e in &mut events {
            if let EventKind::StateObserved { job: 1, state } = &e.kind
                && state == "COMPLETED"
            {
                e.at_ms = 62;
            }
        }
        let found = check(&History { events: events.clone() }, Bounds { finish_within_ms: Some(5) });
        // Healed at 50: job 1 finished at 62, job 2 was first seen terminal at 63; both after 55.
        assert_eq!(
            found,
            [
                Violation::Unfinished { job: 1, last_state: Some("COMPLETED".into()), deadline_ms: 55 },
                Violation::Unfinished { job: 2, last_state: Some("CANCELLED+".into()), deadline_ms: 55 },
            ]
        );
        assert_eq!(check(&History { events }, Bounds::default()), [], "no bound, no liveness verdict");
    }

    mod generated {
        use proptest::prelude::*;

        use super::*;

        /// Jobs run one after another on one node's GPUs, each incarnation ending before the next starts: a
        /// well-behaved cluster whatever the sizes and timings.
        fn sequential(jobs: Vec<(u8, u8)>) -> Vec<Event> {
            let mut events = Vec::new();
            let mut t = 0;
            let mut listing = Vec::new();
            for (i, (incarnations, gpus)) in jobs.iter().enumerate() {
                let job = i as u64 + 1;
                events.push(at(t, EventKind::SubmitAcked { op: job, job }));
                for incarnation in 0..u64::from(*incarnations) {
                    t += 1;
                    events.push(started(t, job, incarnation, "n1", &(0..u32::from(*gpus)).collect::<Vec<_>>()));
                    t += 1;
                    events.push(ended(t, job, incarnation, "n1"));
                }
                t += 1;
                events.push(state(t, job, "COMPLETED"));
                listing.push((job, "COMPLETED".to_string()));
            }
            events.push(at(t + 1, EventKind::FinalJobs { jobs: listing }));
            events
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

            #[test]
            fn well_behaved_histories_pass_and_one_overlap_planted_anywhere_is_caught(
                jobs in prop::collection::vec((1u8..4, 1u8..8), 2..20),
                pick in any::<prop::sample::Index>(),
            ) {
                let events = sequential(jobs);
                prop_assert_eq!(check(&History { events: events.clone() }, Bounds::default()), vec![]);
                // Drop one end: the next start on that GPU (if any) overlaps it.
                let ends: Vec<usize> = events.iter().enumerate()
                    .filter(|(_, e)| matches!(e.kind, EventKind::IncarnationEnded { .. })).map(|(i, _)| i).collect();
                let drop = ends[pick.index(ends.len())];
                let is_last = drop == *ends.last().unwrap();
                let mut planted = events;
                planted.remove(drop);
                let found = check(&History { events: planted }, Bounds::default());
                prop_assert_eq!(found.is_empty(), is_last, "{:?}", found);
            }
        }
    }
}

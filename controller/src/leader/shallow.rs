//! Shallow passes: between two deep passes over a long queue, the leader fills the GPUs that free up by scheduling
//! only the best-ranked pending jobs (Slurm's event-triggered quick scheduling, bounded by its
//! `default_queue_depth`, beside its periodic backfill over the whole queue).
//!
//! Why: a deep pass copies and ranks every pending job, and the loop then pauses eight times as long as the pass
//! took (a ninth of a core; see `scheduling`). With 50,000 short jobs pending on 64 GPUs a deep pass took about
//! 50 ms, so freed GPUs were refilled only every 450 ms: offered 2,500 jobs/s, the cluster sustained 476/s at first
//! and 122/s as the queue grew. A shallow pass costs what its window and the running jobs cost, not the queue.
//!
//! What a shallow pass may start, and why that keeps the deep pass's promises:
//! - The deep pass ranks every pending job. The shortlist keeps that order for the jobs that waited only for
//!   GPUs or for higher-ranked jobs (reasons `Resources` and `Priority`), and lists every job it reserved GPUs for.
//! - A shallow pass offers the scheduler the first [`WINDOW`] of those still pending, every reserved one, every
//!   running job and every node. The reserved jobs get their reservations again, so nothing backfills onto GPUs
//!   they were promised; jobs further down the shortlist do not start until the window reaches them.
//! - Jobs submitted since the deep pass are offered only once the shortlist has run dry (they would rank behind
//!   it, give or take a second of age). Jobs a dependency, hold, begin time, limit or partition kept back wait
//!   for the next deep pass, as they did before shallow passes existed.
//! - A shallow pass commits starts only: pending reasons, `sprio`'s table and preemption stay the deep pass's.
//!
//! Priorities move between two deep passes (fair-share usage grows as jobs run), so a shallow pass may start the
//! window's jobs in an order the next deep pass would not quite pick; the error lasts one deep pass at most.

use std::collections::{BTreeSet, HashSet};

use drover_scheduler as sched;
use drover_state::{DependencyKind, State};

use super::planner::{self, Hold};

/// Pending jobs a shallow pass offers the scheduler at most (besides the reserved ones): enough to refill a few
/// hundred freed GPUs per pass, small enough that a pass costs well under a millisecond on the scheduler's side.
pub const WINDOW: usize = 256;
/// A deep pass that ranked fewer pending jobs than this leaves no shortlist: every pass over such a queue is deep,
/// and cheap (a few milliseconds).
pub const SHALLOW_FROM_PENDING: usize = 2_048;
/// Shortlist entries a shallow pass looks at, at most (entries no longer pending are skipped on the way).
const VISITS: usize = 8 * WINDOW;

/// What a deep pass leaves for the shallow passes after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shortlist {
    /// Jobs that waited for GPUs or for higher-ranked jobs, in the deep pass's scheduling order, less those seen
    /// gone since.
    ranked: Vec<u64>,
    /// Jobs holding a backfill reservation.
    reserved: Vec<u64>,
    /// Jobs above this id came after the deep pass (or after the shallow passes that started them).
    newer_than: u64,
}

impl Shortlist {
    /// The shortlist of a deep pass's plan, or none when the pass ranked fewer than [`SHALLOW_FROM_PENDING`] jobs.
    pub fn of_plan(plan: &sched::Plan) -> Option<Shortlist> {
        if plan.priorities.len() < SHALLOW_FROM_PENDING {
            return None;
        }
        let waiting: HashSet<u64> = plan
            .reasons
            .iter()
            .filter(|(_, r)| matches!(r, sched::Reason::Resources | sched::Reason::Priority))
            .map(|(id, _)| *id)
            .collect();
        let ranked = plan.priorities.iter().map(|(id, _)| *id).filter(|id| waiting.contains(id)).collect();
        let seen = plan.priorities.iter().map(|(id, _)| *id).chain(plan.starts.iter().map(|(id, _)| *id));
        Some(Shortlist {
            ranked,
            reserved: plan.expected_start.iter().map(|(id, _)| *id).collect(),
            newer_than: seen.max().unwrap_or(0),
        })
    }

    /// How many shortlisted jobs may still be pending.
    pub fn remaining(&self) -> usize {
        self.ranked.len()
    }

    /// The view of a shallow pass, and its settings (preemption off), copied out of the live state `per_lock` jobs
    /// at a time like the deep pass's view: nodes, lingering releases, reservations and partitions as the deep
    /// pass sees them; the running jobs, found through the nodes they hold; and as pending jobs the window.
    pub fn view_in_chunks(
        &mut self,
        with_state: impl Fn(Hold, &mut dyn FnMut(&State)),
        now_ms: u64,
        per_lock: usize,
    ) -> (sched::ClusterView, sched::SchedulerConfig) {
        let per_lock = per_lock.max(1);
        let mut base = None;
        with_state(Hold::Other, &mut |state| {
            let running: BTreeSet<u64> = state.nodes.values().flat_map(|n| n.jobs.iter().copied()).collect();
            base = Some((
                planner::view_without_jobs(state, now_ms),
                planner::scheduler_config(state),
                planner::half_life_s(state),
                running,
            ));
        });
        let (mut view, mut config, half_life_s, running) = base.expect("with_state calls back once");
        // Preempting is the deep pass's: it needs every pending job's rank.
        config.preemption = false;
        let mut totals = planner::AccountTotals::default();
        let running: Vec<u64> = running.into_iter().collect();
        for chunk in running.chunks(per_lock) {
            with_state(Hold::Jobs, &mut |state| {
                for job in chunk.iter().filter_map(|id| state.jobs.get(id)) {
                    if let Some(r) = planner::running_job(job, now_ms) {
                        view.running.push(r);
                        totals.add(job, now_ms, half_life_s);
                    }
                }
            });
        }
        view.pending = self.window_in_chunks(&with_state, per_lock, &mut totals);
        with_state(Hold::Other, &mut |state| view.accounts = planner::account_tree_from(state, now_ms, &totals));
        planner::relax_avoidance(&mut view);
        (view, config)
    }

    /// The window's pending jobs in id order (the order views list them in): the first [`WINDOW`] shortlisted jobs
    /// still pending and free to start, the reserved ones, then, once the shortlist is dry, newer submissions.
    fn window_in_chunks(
        &mut self,
        with_state: &impl Fn(Hold, &mut dyn FnMut(&State)),
        per_lock: usize,
        totals: &mut planner::AccountTotals,
    ) -> Vec<sched::PendingJob> {
        let mut taken: Vec<sched::PendingJob> = Vec::new();
        let mut ids = HashSet::new();
        // Whether the job may be offered (it may have been already).
        let mut offer = |job: &drover_state::Job, taken: &mut Vec<sched::PendingJob>| -> bool {
            let Some(p) = eligible(job) else { return false };
            if ids.insert(p.id) {
                // A pending job only names its account (for the implicit flat tree); the time is not read.
                totals.add(job, 0, 0);
                taken.push(p);
            }
            true
        };
        // The shortlist from its top. Entries no longer pending, or kept back since the deep pass (held, a
        // dependency), leave it: the shortlist only shrinks until the next deep pass, so each pass looks at most at
        // `VISITS` entries however many started below the top.
        let limit = VISITS.min(self.ranked.len());
        let mut gone = vec![false; limit];
        let mut i = 0;
        while i < limit && taken.len() < WINDOW {
            let end = (i + per_lock).min(limit);
            with_state(Hold::Jobs, &mut |state| {
                while i < end && taken.len() < WINDOW {
                    match state.jobs.get(&self.ranked[i]).filter(|j| planner::pending_state(j)) {
                        Some(job) => gone[i] = !offer(job, &mut taken),
                        None => gone[i] = true,
                    }
                    i += 1;
                }
            });
        }
        let mut k = 0;
        self.ranked.retain(|_| {
            k += 1;
            !gone.get(k - 1).copied().unwrap_or(false)
        });
        // Every reserved job, wherever it ranks: its reservation must be in the pass.
        for chunk in self.reserved.chunks(per_lock) {
            with_state(Hold::Jobs, &mut |state| {
                for job in chunk.iter().filter_map(|id| state.jobs.get(id)).filter(|j| planner::pending_state(j)) {
                    offer(job, &mut taken);
                }
            });
        }
        if self.remaining() == 0 {
            self.newer_in_chunks(with_state, per_lock, &mut taken, &mut offer);
        }
        taken.sort_unstable_by_key(|j| j.id);
        taken
    }

    /// Submissions newer than the deep pass, in id order, until the window is full.
    fn newer_in_chunks(
        &mut self,
        with_state: &impl Fn(Hold, &mut dyn FnMut(&State)),
        per_lock: usize,
        taken: &mut Vec<sched::PendingJob>,
        offer: &mut impl FnMut(&drover_state::Job, &mut Vec<sched::PendingJob>) -> bool,
    ) {
        let mut visited = 0;
        let mut from = self.newer_than.saturating_add(1);
        let mut gone_prefix = true;
        while taken.len() < WINDOW && visited < VISITS {
            let mut seen = 0;
            with_state(Hold::Jobs, &mut |state| {
                for (id, job) in state.jobs.range(from..).take(per_lock.min(VISITS - visited)) {
                    seen += 1;
                    from = id + 1;
                    let offered = planner::pending_state(job) && offer(job, taken);
                    // Jobs at the front that are no longer pending, or kept back, are passed until the next deep
                    // pass.
                    gone_prefix &= !offered;
                    if gone_prefix {
                        self.newer_than = *id;
                    }
                    if taken.len() >= WINDOW {
                        break;
                    }
                }
            });
            visited += seen;
            if seen == 0 {
                break;
            }
        }
    }
}

/// The job as a pending job of a shallow pass, if it is pending and nothing but GPUs keeps it waiting: no hold, no
/// dependency left (a `singleton` one is judged against the whole queue, which only a deep pass walks).
fn eligible(job: &drover_state::Job) -> Option<sched::PendingJob> {
    if job.spec.dependency.iter().any(|d| d.kind == DependencyKind::Singleton) {
        return None;
    }
    planner::pending_job(job, &planner::Singletons::new())
        .filter(|p| !p.held && p.dependency == sched::DependencyState::Satisfied)
}

#[cfg(test)]
mod tests {
    use drover_state::{ClusterConfig, Command, JobEnd, Reply};

    use super::super::planner::tests::{at, job, node, submit};
    use super::*;

    /// Four nodes of 8 GPUs, each GPU running a one-GPU job for 600 s.
    fn full_cluster() -> (State, Vec<u64>) {
        let mut state = State::default();
        let config = ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() };
        state.apply(&at(0, Command::InitCluster { config }));
        for name in ["n1", "n2", "n3", "n4"] {
            let info = node(name, 8, "s1");
            state.apply(&at(1, Command::RegisterNode { info, running: Vec::new() })).response.unwrap();
        }
        let running: Vec<u64> = (0..32).map(|_| submit(&mut state, job(1, 1, 600), 1_000)).collect();
        let plan = deep_plan(&state, 1_000);
        assert_eq!(starts(&mut state, &plan, 1_000).len(), 32);
        (state, running)
    }

    fn deep_plan(state: &State, now_ms: u64) -> sched::Plan {
        let (view, config) = planner::view_in_chunks(|_, copy| copy(state), now_ms, usize::MAX);
        sched::schedule(&view, &config).unwrap()
    }

    fn shallow_plan(list: &mut Shortlist, state: &State, now_ms: u64) -> sched::Plan {
        // Three jobs per hold: the window is gathered across holds of the lock like the deep pass's view.
        let (view, config) = list.view_in_chunks(|_, copy| copy(state), now_ms, 3);
        sched::schedule(&view, &config).unwrap()
    }

    /// Commits a plan's starts as the leader does; the ids started.
    fn starts(state: &mut State, plan: &sched::Plan, now_ms: u64) -> Vec<u64> {
        let allocations = planner::allocations_of(state, plan);
        if allocations.is_empty() {
            return Vec::new();
        }
        let command = Command::ApplyPlan { allocations, reasons: Vec::new() };
        match state.apply(&at(now_ms, command)).response {
            Ok(Reply::Planned { started, refused }) => {
                assert!(refused.is_empty(), "{refused:?}");
                state.check_invariants();
                started
            }
            other => panic!("{other:?}"),
        }
    }

    fn end(state: &mut State, ids: &[u64], now_ms: u64) {
        for &job_id in ids {
            let ended = Command::JobEnded { job_id, incarnation: 0, end: JobEnd::default() };
            state.apply(&at(now_ms, ended)).response.unwrap();
        }
    }

    /// A long queue of one-GPU jobs on a full cluster: when GPUs free up, a shallow pass starts the jobs a deep pass
    /// would (the best ranked: here the oldest), pass after pass, skipping a job held since the deep pass; jobs
    /// submitted since are offered once the shortlist is dry.
    #[test]
    fn shallow_passes_start_what_a_deep_pass_would_until_the_shortlist_is_dry() {
        let (mut state, running) = full_cluster();
        let queued: Vec<u64> =
            (0..SHALLOW_FROM_PENDING as u64 + 40).map(|i| submit(&mut state, job(1, 1, 600), 2_000 + i)).collect();
        let mut list = Shortlist::of_plan(&deep_plan(&state, 5_000)).expect("a long queue leaves a shortlist");
        assert_eq!(list.remaining(), queued.len(), "every queued job waits for GPUs");
        // The first queued job is held after the deep pass; eight GPUs free up.
        let by_uid = 0;
        state.apply(&at(5_500, Command::HoldJobs { ids: vec![queued[0]], by_uid, user_hold: None })).response.unwrap();
        end(&mut state, &running[..8], 6_000);
        let shallow = shallow_plan(&mut list, &state, 6_000);
        let deep = deep_plan(&state, 6_000);
        assert_eq!(shallow.starts, deep.starts, "the same starts, on the same GPUs");
        assert_eq!(shallow.starts.iter().map(|(id, _)| *id).collect::<Vec<_>>(), queued[1..9]);
        assert!(shallow.preemptions.is_empty());
        assert_eq!(starts(&mut state, &shallow, 6_000), queued[1..9]);
        // The started ones, and the held one, left the shortlist: the next pass looks further down.
        end(&mut state, &running[8..16], 7_000);
        let next = shallow_plan(&mut list, &state, 7_000);
        assert_eq!(next.starts.iter().map(|(id, _)| *id).collect::<Vec<_>>(), queued[9..17]);
        assert_eq!(starts(&mut state, &next, 7_000), queued[9..17]);
        // New submissions wait behind the shortlist, then get offered once it is dry.
        let newer: Vec<u64> = (0..4).map(|i| submit(&mut state, job(1, 1, 600), 8_000 + i)).collect();
        state.apply(&at(8_100, Command::CancelJobs { ids: queued[17..].to_vec(), by_uid })).response.unwrap();
        end(&mut state, &running[16..20], 9_000);
        // A pass looks at `VISITS` entries at most: this one passes over cancelled ones only.
        assert!(shallow_plan(&mut list, &state, 9_000).starts.is_empty());
        assert!(list.remaining() > 0);
        let dry = shallow_plan(&mut list, &state, 9_000);
        assert_eq!(list.remaining(), 0, "every shortlisted job started, was cancelled or held");
        assert_eq!(dry.starts.iter().map(|(id, _)| *id).collect::<Vec<_>>(), newer);
    }

    /// A job the deep pass reserved GPUs for keeps them: a shallow pass does not backfill a job that would delay it,
    /// as the deep pass would not, even though the reserved job ranks far beyond the window.
    #[test]
    fn a_shallow_pass_keeps_the_reservations_of_the_deep_pass() {
        let (mut state, running) = full_cluster();
        // Ranked first by its age: the whole cluster, for an hour.
        let big = submit(&mut state, job(4, 8, 3_600), 1_500);
        let queued: Vec<u64> =
            (0..SHALLOW_FROM_PENDING as u64).map(|i| submit(&mut state, job(1, 1, 3_600), 2_000 + i)).collect();
        let plan = deep_plan(&state, 5_000);
        assert!(plan.expected_start_of(big).is_some(), "the big job holds a reservation");
        let mut list = Shortlist::of_plan(&plan).unwrap();
        end(&mut state, &running[..4], 6_000);
        // Hour-long jobs on the four free GPUs would delay the big job's start at 600 s: neither pass starts them.
        let deep = deep_plan(&state, 6_000);
        assert!(deep.starts.is_empty(), "{:?}", deep.starts);
        let shallow = shallow_plan(&mut list, &state, 6_000);
        assert!(shallow.starts.is_empty(), "{:?}", shallow.starts);
        assert_eq!(shallow.expected_start_of(big), deep.expected_start_of(big));
        // A short job, submitted since, would fit before the reservation; the shortlist is not dry, so it waits for
        // the deep pass (which starts it).
        let short = submit(&mut state, job(1, 1, 60), 6_500);
        assert!(shallow_plan(&mut list, &state, 7_000).starts.is_empty());
        assert_eq!(deep_plan(&state, 7_000).starts.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [short]);
        assert!(queued.iter().all(|id| state.jobs[id].state == drover_state::JobState::Pending));
    }

    /// A short queue leaves no shortlist: every pass over it stays deep.
    #[test]
    fn a_short_queue_leaves_no_shortlist() {
        let (mut state, _) = full_cluster();
        for i in 0..10 {
            submit(&mut state, job(1, 1, 600), 2_000 + i);
        }
        assert_eq!(Shortlist::of_plan(&deep_plan(&state, 5_000)), None);
    }
}

//! The leader's scheduling loop: after every applied change (and on a slow tick), run one pass of the scheduler
//! library over a view of the state and commit the plan as one `ApplyPlan` entry, which `apply` re-validates.

use std::time::Duration;

use std::sync::{Arc, RwLock};

use drover_proto::wire::JobInsight;
use drover_scheduler::SchedulerConfig;
use drover_state::Command;
// tokio's clock, not std's: the simulation pauses it.
use openraft::async_runtime::WatchReceiver;
use tokio::time::Instant;

use super::{planner, shallow};
use crate::propose::{Proposer, propose};
use crate::store::StateView;

/// Passes run at most this often; bursts of submissions and ends share a pass.
const MIN_PASS_INTERVAL_MS: u64 = 2;
/// After a long pass the loop also waits this many times as long as the pass took, so scheduling a huge queue
/// takes at most a ninth of one core from the leader's other work (commits, reads, agent sessions). At half a
/// core (waiting once the pass time), 64 clients submitting into a queue of tens of thousands of pending jobs
/// committed 3,650/s, against 6,570/s with no passes at all: the passes' CPU, and `apply` waiting for the state
/// lock while a pass copies its view, were what held the write path back. At a quarter of a core (three times)
/// the same load committed 8,902-8,973/s, at a ninth 9,192-9,407/s. The price is reaction time on huge queues
/// only: a pass over 90,000 pending jobs takes about 40 ms, so the next one starts about 0.36 s later (Slurm's
/// backfill considers its whole queue every 30 s by default). A pass over a small queue takes well under a
/// millisecond, so there jobs still start within a few milliseconds of a change.
const PAUSE_PER_PASS_TIME: u32 = 8;
/// Jobs copied into a pass's view, and pending reasons checked against the state, per hold of the state lock
/// (a few milliseconds at most).
const JOBS_PER_LOCK: usize = crate::store::JOBS_PER_READ;
/// A pass runs at least this often, even without changes (time moves reservations and ages priorities).
const IDLE_PASS_INTERVAL_MS: u64 = 1_000;
/// A plan that only changes pending reasons is committed at most this often; one that starts or preempts a job
/// is committed at once. Each submission that cannot start at once changed its job's reason (from none), and
/// committing that right after the submission doubled the log entries, fsyncs and replication rounds of a
/// stream of submissions: 300 sequential `sbatch` through the relay ran at 240-241/s with a reason entry after
/// each and 265-270/s with them held back 200 ms (alternating runs, same build). A reason is a few hundred
/// milliseconds late at most; Slurm, too, sets most reasons in its periodic scheduling cycle.
const REASONS_INTERVAL_MS: u64 = 200;

/// What the scheduling loop tells the rest of the replica: the latest pass's view of pending jobs (`sprio`,
/// `squeue --start`; on the leader only) and how long passes take, deep and shallow (`/metrics`).
#[derive(Clone)]
pub struct Insights {
    latest: Arc<RwLock<InsightTable>>,
    pass_seconds: drover_observe::prometheus_client::metrics::histogram::Histogram,
    shallow_pass_seconds: drover_observe::prometheus_client::metrics::histogram::Histogram,
}

impl Default for Insights {
    fn default() -> Self {
        Insights {
            latest: Arc::default(),
            pass_seconds: drover_observe::metrics::duration_histogram(),
            shallow_pass_seconds: drover_observe::metrics::duration_histogram(),
        }
    }
}

impl Insights {
    pub fn latest(&self) -> std::sync::RwLockReadGuard<'_, InsightTable> {
        self.latest.read().expect("insights lock poisoned")
    }

    fn replace(&self, insights: InsightTable) {
        *self.latest.write().expect("insights lock poisoned") = insights;
    }

    /// Wall time of each scheduling pass on this replica, including the plan's translation into commands.
    pub fn pass_seconds(&self) -> &drover_observe::prometheus_client::metrics::histogram::Histogram {
        &self.pass_seconds
    }

    /// Wall time of each shallow pass (see `shallow`), up to its commit.
    pub fn shallow_pass_seconds(&self) -> &drover_observe::prometheus_client::metrics::histogram::Histogram {
        &self.shallow_pass_seconds
    }
}

/// The latest pass's insight into every pending job, sorted by job id. One compact row per job: with a million
/// pending jobs, a hash map of the wire type held 178 MiB on the leader (two buckets of 88 bytes per job); these
/// rows take 48 bytes each.
#[derive(Debug, Default)]
pub struct InsightTable {
    rows: Vec<InsightRow>,
}

/// A job's priority and its weighted factors (each a weight, a `u32`, times a factor in 0..=1, so it fits; the
/// conversion saturates), and its expected start (`NO_START`: none).
/// `InsightRow::expected_start_s` of a job with no reservation.
const NO_START: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InsightRow {
    job_id: u64,
    priority: u64,
    expected_start_s: u64,
    age: u32,
    fairshare: u32,
    job_size: u32,
    partition: u32,
    qos: u32,
    short: u32,
}

impl InsightRow {
    fn to_wire(self) -> JobInsight {
        JobInsight {
            job_id: self.job_id,
            priority: self.priority,
            age: self.age.into(),
            fairshare: self.fairshare.into(),
            job_size: self.job_size.into(),
            partition: self.partition.into(),
            qos: self.qos.into(),
            short: self.short.into(),
            expected_start_s: (self.expected_start_s != NO_START).then_some(self.expected_start_s),
        }
    }
}

impl InsightTable {
    /// Slurm prints each factor multiplied by its weight.
    fn of_plan(plan: &drover_scheduler::Plan, config: &SchedulerConfig) -> InsightTable {
        let w = &config.weights;
        let weighted = |weight: u32, factor: f64| (f64::from(weight) * factor).round() as u32;
        let mut rows: Vec<InsightRow> = plan
            .priorities
            .iter()
            .map(|(id, p)| InsightRow {
                job_id: *id,
                priority: p.priority,
                expected_start_s: NO_START,
                age: weighted(w.age, p.age),
                fairshare: weighted(w.fairshare, p.fairshare),
                job_size: weighted(w.job_size, p.job_size),
                partition: weighted(w.partition, p.partition),
                qos: weighted(w.qos, p.qos),
                short: weighted(w.short, p.short),
            })
            .collect();
        rows.sort_unstable_by_key(|r| r.job_id);
        rows.dedup_by_key(|r| r.job_id);
        let mut table = InsightTable { rows };
        let mut unprioritized = Vec::new();
        for (id, start_s) in &plan.expected_start {
            match table.position(*id) {
                Ok(i) => table.rows[i].expected_start_s = *start_s,
                Err(_) => unprioritized.push(InsightRow {
                    job_id: *id,
                    priority: 0,
                    expected_start_s: *start_s,
                    age: 0,
                    fairshare: 0,
                    job_size: 0,
                    partition: 0,
                    qos: 0,
                    short: 0,
                }),
            }
        }
        if !unprioritized.is_empty() {
            table.rows.extend(unprioritized);
            table.rows.sort_unstable_by_key(|r| r.job_id);
            table.rows.dedup_by_key(|r| r.job_id);
        }
        table
    }

    fn position(&self, job_id: u64) -> Result<usize, usize> {
        self.rows.binary_search_by_key(&job_id, |r| r.job_id)
    }

    pub fn get(&self, job_id: u64) -> Option<JobInsight> {
        self.position(job_id).ok().map(|i| self.rows[i].to_wire())
    }

    /// The first `limit` jobs by id.
    pub fn first(&self, limit: usize) -> Vec<JobInsight> {
        self.rows.iter().take(limit).map(|r| r.to_wire()).collect()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Paces plans that only change pending reasons (see [`REASONS_INTERVAL_MS`]). Pure: the loop gives it the time.
#[derive(Debug, Default)]
struct ReasonPacer {
    /// When reasons were last committed.
    last: Option<Instant>,
    /// When reasons held back are due: the loop then runs a pass even if nothing changed.
    due: Option<Instant>,
}

/// What to do with a pass's commands.
#[derive(Debug, PartialEq, Eq)]
enum Pace {
    Commit,
    /// Only reasons changed, and reasons were committed less than the interval ago: drop these commands and run
    /// a pass again (which recomputes them) at this moment.
    HoldUntil(Instant),
}

impl ReasonPacer {
    fn pace(&mut self, commands: &[Command], now: Instant) -> Pace {
        let reasons = commands.iter().any(|c| matches!(c, Command::ApplyPlan { reasons, .. } if !reasons.is_empty()));
        if !reasons {
            return Pace::Commit;
        }
        let only_reasons =
            commands.iter().all(|c| matches!(c, Command::ApplyPlan { allocations, .. } if allocations.is_empty()));
        let due = self.last.map(|last| last + Duration::from_millis(REASONS_INTERVAL_MS));
        match due {
            Some(due) if only_reasons && now < due => {
                self.due = Some(due);
                Pace::HoldUntil(due)
            }
            _ => {
                self.last = Some(now);
                self.due = None;
                Pace::Commit
            }
        }
    }

    /// How long the loop may wait for a change before it runs a pass anyway: `idle`, or less when reasons are
    /// due sooner.
    fn wait(&self, now: Instant, idle: Duration) -> Duration {
        self.due.map_or(idle, |due| due.saturating_duration_since(now).min(idle))
    }

    /// The loop woke without a change. Whatever was due gets its pass now, if this replica still leads; one that
    /// no longer leads must not keep waking (its due time has passed, and would read as "now" forever).
    fn woke(&mut self) {
        self.due = None;
    }
}

/// Which pass the loop runs when something changed. Pure: the loop gives it the time.
#[derive(Debug, Default)]
struct PassPacer {
    /// After a deep pass over a long queue (one that left a shortlist): when the next deep pass may run. Until
    /// then, changes get shallow passes.
    deep_after: Option<Instant>,
    /// A shallow pass ran since the last deep pass: a deep one is owed at `deep_after`, changes or not (reasons and
    /// `sprio`'s table come only from deep passes).
    deep_owed: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum PassKind {
    Deep,
    Shallow,
}

impl PassPacer {
    fn next(&self, now: Instant) -> PassKind {
        match self.deep_after {
            Some(after) if now < after => PassKind::Shallow,
            _ => PassKind::Deep,
        }
    }

    /// A deep pass took `took`, ending at `now`: how long the loop sleeps before it looks for changes again. A short
    /// queue sleeps out the whole pause; after a long one, shallow passes may run during it.
    fn after_deep(&mut self, now: Instant, took: Duration, shortlisted: bool) -> Duration {
        let pause = pause_after(took);
        self.deep_owed = false;
        self.deep_after = shortlisted.then_some(now + pause);
        if shortlisted { Duration::from_millis(MIN_PASS_INTERVAL_MS) } else { pause }
    }

    /// A shallow pass took `took`: it, too, takes at most a ninth of a core.
    fn after_shallow(&mut self, took: Duration) -> Duration {
        self.deep_owed = true;
        pause_after(took)
    }

    /// How long the loop may wait for a change: `wait`, or less when a deep pass is owed sooner.
    fn wait(&self, now: Instant, wait: Duration) -> Duration {
        match self.deep_after {
            Some(after) if self.deep_owed => wait.min(after.saturating_duration_since(now)),
            _ => wait,
        }
    }
}

/// The pause after a pass that took `took` (see [`PAUSE_PER_PASS_TIME`]).
fn pause_after(took: Duration) -> Duration {
    (took * PAUSE_PER_PASS_TIME).max(Duration::from_millis(MIN_PASS_INTERVAL_MS))
}

pub async fn scheduling_loop(proposer: Proposer, view: StateView, id: u64, latest: Insights) {
    let mut metrics = proposer.raft().metrics();
    let mut planned_at: Option<u64> = None;
    let mut pacer = ReasonPacer::default();
    let mut passes = PassPacer::default();
    let mut shortlist: Option<shallow::Shortlist> = None;
    loop {
        let (leading, applied) = {
            let m = metrics.borrow_watched();
            (m.current_leader == Some(id), m.last_applied.as_ref().map(|l| l.index()))
        };
        if !leading {
            // A new term starts from a deep pass.
            (passes, shortlist) = (PassPacer::default(), None);
        }
        if leading && applied != planned_at {
            planned_at = applied;
            // tokio's clock, not std's: under the simulation's paused clock the pauses must not depend on how fast
            // the host ran the pass.
            let pass_started = Instant::now();
            let pause = match (passes.next(pass_started), shortlist.take()) {
                (PassKind::Shallow, Some(list)) => {
                    let took;
                    (shortlist, took) = shallow_pass(&proposer, &view, list).await;
                    latest.shallow_pass_seconds.observe(took.as_secs_f64());
                    passes.after_shallow(took)
                }
                _ => {
                    let (commands, list) = deep_pass(&view, &latest).await;
                    let took = pass_started.elapsed();
                    latest.pass_seconds.observe(took.as_secs_f64());
                    if pacer.pace(&commands, Instant::now()) == Pace::Commit {
                        commit(&proposer, commands).await;
                    }
                    shortlist = list;
                    passes.after_deep(Instant::now(), took, shortlist.is_some())
                }
            };
            tokio::time::sleep(pause).await;
            continue;
        }
        let now = Instant::now();
        let wait = passes.wait(now, pacer.wait(now, Duration::from_millis(IDLE_PASS_INTERVAL_MS)));
        tokio::select! {
            // In order, not at random: the same events give the same passes (the simulation replays seeds).
            biased;
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(wait) => {
                planned_at = None;
                pacer.woke();
            }
        }
    }
}

async fn commit(proposer: &Proposer, commands: Vec<Command>) {
    for command in commands {
        if let Err(e) = propose(proposer, command).await {
            tracing::warn!("committing a plan failed: {}", e.message());
        }
    }
}

/// One deep pass: every pending job (up to the queue depth) ranked and planned. Gives the plan's commands and, over
/// a long queue, the shortlist for the shallow passes until the next one.
async fn deep_pass(view: &StateView, latest: &Insights) -> (Vec<Command>, Option<shallow::Shortlist>) {
    let (pass_view, pass_latest) = (view.clone(), latest.clone());
    // Read here, on the async side: the simulation's clock is this thread's.
    let now_ms = crate::runtime::now_ms();
    // A pass over a large queue takes milliseconds to a few hundred: keep it off the async workers.
    crate::runtime::run_blocking(move || {
        // The state lock is held only to copy the view out, a bounded number of jobs at a time: neither the copy
        // nor the pass itself may stall `apply`.
        let (cluster, config) = planner::view_in_chunks(|_, copy| copy(&pass_view.read().state), now_ms, JOBS_PER_LOCK);
        match drover_scheduler::schedule(&cluster, &config) {
            Ok(plan) => {
                pass_latest.replace(InsightTable::of_plan(&plan, &config));
                let commands =
                    planner::commands_in_chunks(|translate| translate(&pass_view.read().state), &plan, JOBS_PER_LOCK);
                (commands, shallow::Shortlist::of_plan(&plan))
            }
            Err(e) => {
                tracing::error!("scheduling pass failed: {e}");
                (Vec::new(), None)
            }
        }
    })
    .await
    .unwrap_or_default()
}

/// One shallow pass over `list`'s window (see `shallow`): commits its starts, gives the shortlist back with how long
/// the pass took before its commit (what the pause after it is for: the commit waits, it does not compute).
async fn shallow_pass(
    proposer: &Proposer,
    view: &StateView,
    mut list: shallow::Shortlist,
) -> (Option<shallow::Shortlist>, Duration) {
    let pass_view = view.clone();
    let started = Instant::now();
    let now_ms = crate::runtime::now_ms();
    let ran = crate::runtime::run_blocking(move || {
        let (cluster, config) = list.view_in_chunks(|_, copy| copy(&pass_view.read().state), now_ms, JOBS_PER_LOCK);
        let allocations = match drover_scheduler::schedule(&cluster, &config) {
            Ok(plan) => planner::allocations_of(&pass_view.read().state, &plan),
            Err(e) => {
                tracing::error!("shallow scheduling pass failed: {e}");
                Vec::new()
            }
        };
        (list, allocations)
    })
    .await;
    let took = started.elapsed();
    // A pass that could not run leaves no shortlist: the next pass is deep.
    let Ok((list, allocations)) = ran else { return (None, took) };
    if !allocations.is_empty() {
        commit(proposer, vec![Command::ApplyPlan { allocations, reasons: Vec::new() }]).await;
    }
    (Some(list), took)
}

#[cfg(test)]
mod tests {
    use drover_scheduler::{Plan, PriorityBreakdown};
    use drover_state::{Allocation, PendingReason};

    use super::*;

    /// Reasons alone wait for the interval; a start goes at once and carries the reasons with it; nothing to
    /// commit is nothing to pace.
    #[test]
    fn plans_with_only_reasons_are_committed_once_per_interval_and_starts_never_wait() {
        let reasons = || vec![Command::ApplyPlan { allocations: vec![], reasons: vec![(1, PendingReason::Resources)] }];
        let start = || {
            vec![Command::ApplyPlan {
                allocations: vec![Allocation { job_id: 2, nodes: vec![] }],
                reasons: vec![(1, PendingReason::Priority)],
            }]
        };
        let interval = Duration::from_millis(REASONS_INTERVAL_MS);
        let t0 = Instant::now();
        let mut pacer = ReasonPacer::default();
        assert_eq!(pacer.pace(&reasons(), t0), Pace::Commit, "the first reasons go at once");
        let soon = t0 + interval / 4;
        assert_eq!(pacer.pace(&reasons(), soon), Pace::HoldUntil(t0 + interval));
        assert_eq!(pacer.pace(&[], soon), Pace::Commit, "an empty plan is not held");
        assert_eq!(pacer.pace(&start(), soon), Pace::Commit, "a start is never held, reasons or not");
        // The start carried reasons: the interval runs from it.
        assert_eq!(pacer.pace(&reasons(), soon + interval / 2), Pace::HoldUntil(soon + interval));
        assert_eq!(pacer.pace(&reasons(), soon + interval), Pace::Commit);
    }

    /// The loop wakes for held reasons when they are due, and only once: a replica that lost leadership in
    /// between runs no pass, and must go back to waiting the idle interval rather than wake again at once.
    #[test]
    fn held_reasons_wake_the_loop_once_when_due() {
        let idle = Duration::from_millis(IDLE_PASS_INTERVAL_MS);
        let interval = Duration::from_millis(REASONS_INTERVAL_MS);
        let reasons = vec![Command::ApplyPlan { allocations: vec![], reasons: vec![(1, PendingReason::Resources)] }];
        let t0 = Instant::now();
        let mut pacer = ReasonPacer::default();
        assert_eq!(pacer.wait(t0, idle), idle, "nothing held: the idle interval");
        assert_eq!(pacer.pace(&reasons, t0), Pace::Commit);
        assert_eq!(pacer.wait(t0, idle), idle, "committed: nothing held");
        let soon = t0 + interval / 4;
        assert_eq!(pacer.pace(&reasons, soon), Pace::HoldUntil(t0 + interval));
        assert_eq!(pacer.wait(soon, idle), interval - interval / 4, "held: wake when due");
        assert_eq!(pacer.wait(t0 + 2 * interval, idle), Duration::ZERO, "overdue: wake now");
        pacer.woke();
        assert_eq!(pacer.wait(t0 + 2 * interval, idle), idle, "woken once: back to the idle interval");
        assert_eq!(pacer.pace(&reasons, t0 + 2 * interval), Pace::Commit, "the pass after waking commits them");
    }

    /// Over a short queue the loop sleeps out each deep pass's pause. Over a long one it runs shallow passes in
    /// the pause, each paying its own ninth of a core, and owes a deep pass when the pause ends, changes or not.
    #[test]
    fn shallow_passes_fill_a_long_queues_pause_and_a_deep_pass_follows_it() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut passes = PassPacer::default();
        assert_eq!(passes.next(t0), PassKind::Deep, "the first pass is deep");
        // A short queue: sleep the whole pause (8 times 5 ms), no shallow pass.
        assert_eq!(passes.after_deep(t0, ms(5), false), ms(40));
        assert_eq!(passes.next(t0 + ms(1)), PassKind::Deep);
        // A long queue: back within the minimum interval; changes get shallow passes until the pause is over.
        assert_eq!(passes.after_deep(t0, ms(50), true), ms(MIN_PASS_INTERVAL_MS));
        assert_eq!(passes.wait(t0, ms(1_000)), ms(1_000), "no deep pass owed: wait for a change");
        assert_eq!(passes.next(t0 + ms(10)), PassKind::Shallow);
        assert_eq!(passes.after_shallow(ms(1)), ms(8), "a shallow pass pays its own pause");
        assert_eq!(passes.wait(t0 + ms(100), ms(1_000)), ms(300), "a deep pass is owed when the pause ends");
        assert_eq!(passes.wait(t0 + ms(500), ms(1_000)), Duration::ZERO, "overdue");
        assert_eq!(passes.next(t0 + ms(400)), PassKind::Deep);
        passes.after_deep(t0 + ms(450), ms(1), false);
        assert_eq!(passes.wait(t0 + ms(460), ms(1_000)), ms(1_000), "paid: nothing owed");
    }

    /// `sprio` and `squeue --start` read the latest pass's table: each job's weighted factors and its reservation,
    /// found by id, listed in id order. A job with a reservation but no priority row still shows its start.
    #[test]
    fn the_insight_table_answers_by_id_in_id_order() {
        let breakdown = |priority, age| PriorityBreakdown { age, fairshare: 0.5, priority, ..Default::default() };
        let plan = Plan {
            priorities: vec![(30, breakdown(900, 1.0)), (10, breakdown(500, 0.25)), (20, breakdown(700, 0.0))],
            expected_start: vec![(20, 1_700_000_000), (40, 1_700_000_100)],
            ..Plan::default()
        };
        let mut config = SchedulerConfig::default();
        config.weights.age = 1_000;
        config.weights.fairshare = 2_000;
        let table = InsightTable::of_plan(&plan, &config);
        assert_eq!(table.len(), 4);
        let ten = table.get(10).unwrap();
        assert_eq!((ten.priority, ten.age, ten.fairshare, ten.expected_start_s), (500, 250, 1_000, None));
        assert_eq!(table.get(20).unwrap().expected_start_s, Some(1_700_000_000));
        let forty = table.get(40).unwrap();
        assert_eq!((forty.priority, forty.expected_start_s), (0, Some(1_700_000_100)));
        assert_eq!(table.get(15), None);
        let ids: Vec<u64> = table.first(3).iter().map(|i| i.job_id).collect();
        assert_eq!(ids, [10, 20, 30]);
        // A million pending jobs: 48 MB of rows (a hash map of the wire type took 178 MiB).
        assert_eq!(std::mem::size_of::<InsightRow>(), 48);
    }
}

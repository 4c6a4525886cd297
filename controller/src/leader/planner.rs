//! The leader's planner: turns the replicated state into the scheduler library's view, runs one pass, and turns
//! its plan into an `ApplyPlan` command (which `apply` re-validates, so a stale plan never double-books).
//!
//! Pure: the same state and `now_ms` give the same command. No I/O, no clock.

use std::collections::{BTreeSet, HashMap};

use drover_scheduler as sched;
use drover_state::account::ROOT_ACCOUNT;
use drover_state::dependents::combine;
use drover_state::first_fit::MAX_REASON_UPDATES;
use drover_state::{
    Allocation, Command, DepState, DependencyKind, JobState, NodeAllocation, PendingReason, State, job::MemRequest,
};

/// Stand-in for `--time=UNLIMITED` in the scheduler's timeline (it needs an end to reserve around).
const UNLIMITED_S: u64 = 365 * 24 * 3600;
/// Most job starts in one plan entry (bounds the entry's size and the apply's latency).
pub const MAX_PLAN_ALLOCATIONS: usize = 1_000;
/// CPU count the scheduler sees for a node that declares none (CPUs are then not a constraint there).
const UNDECLARED_CPUS: u32 = 1 << 20;

/// The pass settings the replicated configuration asks for.
pub fn scheduler_config(state: &State) -> sched::SchedulerConfig {
    let s = state.config().map(|c| c.scheduler.clone()).unwrap_or_default();
    sched::SchedulerConfig {
        weights: sched::PriorityWeights {
            age: s.weight_age,
            fairshare: s.weight_fairshare,
            job_size: s.weight_job_size,
            partition: s.weight_partition,
            qos: s.weight_qos,
            max_age_s: s.max_age_s,
            favor_small: s.favor_small,
            short: s.weight_short,
        },
        max_reservations: s.reservation_depth as usize,
        ..sched::SchedulerConfig::default()
    }
}

/// The scheduler's view of `state` at `now_ms`.
pub fn view(state: &State, now_ms: u64) -> sched::ClusterView {
    view_in_chunks(|_, copy| copy(state), now_ms, usize::MAX).0
}

/// What one hold of the state lock in a chunked copy is for: a bounded run of jobs, or everything else (before the
/// jobs and after them), which must not walk the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    Jobs,
    Other,
}

/// The same view, and the pass settings, copied out of the live state `jobs_per_lock` jobs at a time:
/// `with_state` takes the state lock for one call each time, so the lock is released in between. Copying a million
/// pending jobs takes about a second, and `apply` waits for the lock: held for the whole copy, every pass over a
/// large queue stalled all commits (60 ms at p99 with 40,000 pending jobs). Whatever is summed over all jobs (the
/// accounts' running usage, the names jobs charge, the `singleton` table) is gathered chunk by chunk too: walked
/// in one hold, those sums held the lock for a third of a second at a million jobs, and with `apply` waiting for
/// it every reader queued behind (the lock favours writers), both async workers stopped, and the leader's
/// heartbeats with them: followers elected a new leader.
///
/// Jobs copied at different moments may disagree slightly (a job that ended after its node was copied still looks
/// busy there); the plan is a proposal that `apply` re-validates, so a stale part costs at most a refused start,
/// never a double booking.
pub fn view_in_chunks(
    with_state: impl Fn(Hold, &mut dyn FnMut(&State)),
    now_ms: u64,
    jobs_per_lock: usize,
) -> (sched::ClusterView, sched::SchedulerConfig) {
    let jobs_per_lock = jobs_per_lock.max(1);
    let mut base = None;
    with_state(Hold::Other, &mut |state| {
        let depth = state.config().map_or(drover_state::config::DEFAULT_QUEUE_DEPTH, |c| c.scheduler.queue_depth);
        let over_depth = state.jobs.len() > depth as usize;
        base = Some((view_without_jobs(state, now_ms), scheduler_config(state), half_life_s(state), depth, over_depth))
    });
    let (mut view, config, half_life_s, depth, over_depth) = base.expect("with_state calls back once");
    let singletons = singletons_in_chunks(&with_state, jobs_per_lock);
    let mut totals = AccountTotals::default();
    if !over_depth {
        for_each_job_in_chunks(&with_state, jobs_per_lock, |job| {
            if let Some(running) = running_job(job, now_ms) {
                view.running.push(running);
            } else if let Some(pending) = pending_job(job, &singletons) {
                view.pending.push(pending);
            }
            totals.add(job, now_ms, half_life_s);
        });
        with_state(Hold::Other, &mut |state| view.accounts = account_tree_from(state, now_ms, &totals));
        relax_avoidance(&mut view);
        return (view, config);
    }
    // More active jobs than the depth: the fair-share tree ranks the pending ones, so it comes first (one walk for
    // the accounts' usage), then only the `depth` best pending jobs are kept while copying.
    for_each_job_in_chunks(&with_state, jobs_per_lock, |job| totals.add(job, now_ms, half_life_s));
    with_state(Hold::Other, &mut |state| view.accounts = account_tree_from(state, now_ms, &totals));
    match sched::depth::TopPending::new(&view, &config, depth as usize) {
        Ok(mut top) => {
            for_each_job_in_chunks(&with_state, jobs_per_lock, |job| {
                if let Some(running) = running_job(job, now_ms) {
                    view.running.push(running);
                } else if let Some(pending) = pending_job(job, &singletons) {
                    top.offer(pending);
                }
            });
            view.pending = top.into_jobs();
            relax_avoidance(&mut view);
        }
        // A tree the pass would refuse too (it reports why); the view is left without pending jobs.
        Err(e) => tracing::warn!("cannot rank the pending jobs for this pass: {e}"),
    }
    (view, config)
}

/// Every active job in id order, `per_lock` per hold of the state lock, each hold marked as one for jobs.
fn for_each_job_in_chunks(
    with_state: &impl Fn(Hold, &mut dyn FnMut(&State)),
    per_lock: usize,
    f: impl FnMut(&drover_state::Job),
) {
    crate::store::for_each_job_in_chunks(|walk| with_state(Hold::Jobs, walk), per_lock, f)
}

/// Everything in the view but the active jobs and what is summed over them (nodes, lingering releases,
/// reservations, QOS, partitions).
pub(super) fn view_without_jobs(state: &State, now_ms: u64) -> sched::ClusterView {
    let config = state.config().cloned().unwrap_or_default();
    let nodes = state
        .nodes
        .values()
        .map(|n| {
            let cpus = if n.info.cpus == 0 { UNDECLARED_CPUS } else { n.info.cpus };
            sched::Node {
                name: n.info.name.clone(),
                // GPUs in service: a drained GPU is neither free nor part of an exclusive job's whole node.
                gpus_total: n.info.gpus.len().saturating_sub(n.drained_gpus.len()) as u32,
                free_gpus: n.free_gpus().collect(),
                cpus_total: cpus,
                // CPUs still held by ended incarnations (lingering) are not free either.
                cpus_free: cpus.saturating_sub(n.allocated_cpus + n.lingering.iter().map(|l| l.cpus).sum::<u32>()),
                mem_total_mb: n.info.memory_mb,
                mem_free_mb: n.free_mem_mb(),
                partitions: config
                    .partitions
                    .iter()
                    .filter(|p| state.node_in_partition(&n.info, &p.name))
                    .map(|p| p.name.clone())
                    .collect(),
                features: n.info.features.clone(),
                gpu_type: Some(n.info.gpu_type.clone()).filter(|t| !t.is_empty()),
                topology: sched::Topology {
                    site: n.info.topology.get("site").cloned().unwrap_or_default(),
                    rack: n.info.topology.get("rack").cloned().unwrap_or_default(),
                    switch: n.info.topology.get("switch").cloned().unwrap_or_default(),
                },
                schedulable: n.schedulable(),
                spare: n.spare,
            }
        })
        .collect();
    let reservations = state
        .reservations
        .values()
        .filter(|r| !r.ended_at(now_ms))
        .map(|r| sched::AdvanceReservation {
            name: r.name.clone(),
            nodes: r.nodes.clone(),
            gpu_count: r.gpu_count,
            start_s: r.start_ms / 1_000,
            duration_s: r.end_ms.map(|end| (end.saturating_sub(r.start_ms)) / 1_000),
            users: r.users.clone(),
            accounts: r.accounts.clone(),
            flags: r
                .flags
                .iter()
                .filter(|f| **f == drover_state::ReservationFlag::Maint)
                .map(|_| sched::ReservationFlag::Maint)
                .collect(),
        })
        .collect();
    let qos: Vec<sched::Qos> = state.all_qos().iter().map(sched_qos).collect();
    let partitions = config
        .partitions
        .iter()
        .map(|p| sched::Partition {
            name: p.name.clone(),
            max_time_s: p.max_time_s,
            priority_tier: p.priority_tier,
            state: p.state,
            preempt_mode: p.preempt_mode,
        })
        .collect();
    sched::ClusterView {
        now_s: now_ms / 1_000,
        nodes,
        running: lingering(state, now_ms),
        pending: Vec::new(),
        partitions,
        // From the jobs: see `view_in_chunks`.
        accounts: Vec::new(),
        reservations,
        qos,
    }
}

/// How long the job has spent suspended in this incarnation, the current suspension included (ms).
fn stopped_ms(job: &drover_state::Job, now_ms: u64) -> u64 {
    job.suspended_total_ms() + job.suspended_since().map_or(0, |since| now_ms.saturating_sub(since))
}

/// An active job as the view's running job, if it holds an allocation.
pub(super) fn running_job(job: &drover_state::Job, now_ms: u64) -> Option<sched::RunningJob> {
    if job.allocation.is_empty() {
        return None;
    }
    Some(sched::RunningJob {
        id: job.id,
        user: job.spec.user.clone(),
        account: job.account_name().into(),
        qos: job.qos_name().into(),
        alloc: job.allocation.iter().map(|a| (a.node.clone(), a.gpus.clone())).collect(),
        start_s: job.start_time_ms.unwrap_or(now_ms) / 1_000,
        // Its limit moves by the time it spent stopped (`scontrol suspend`), and while it is stopped its end moves
        // with the clock: the scheduler's reservations behind it must not count on GPUs it still holds.
        time_limit_s: job
            .time_limit_s
            .map_or(UNLIMITED_S, |limit_s| limit_s.saturating_add(stopped_ms(job, now_ms) / 1_000)),
        exclusive: job.spec.exclusive,
        reservation: job.spec.reservation.as_deref().map(Into::into),
        array_id: job.array.as_deref().map(|a| a.array_job_id),
        partition: job.partition.clone(),
        // Only requeue-able jobs are ever preempted: they come back, from their checkpoints.
        requeueable: job.requeueable() && !job.stopping(),
        priority: 0,
        // A job already told to end (preempted, requeued, cancelled) frees its GPUs within KillWait.
        preempting: job.stopping(),
        preempted_for: job.requeue.as_ref().and_then(|r| r.preempted_for),
    })
}

/// Prefixes a node name a pending job avoids (rather than excludes) in the view being built; no node name holds it.
const AVOID_MARK: &str = "\u{1}avoid:";

/// A requeued job avoids the nodes its failed incarnation was charged on, unless the other nodes of its partition
/// could never hold it (too few with enough GPUs in service): then it may go back to them. Avoided nodes become
/// plain exclusions, or are dropped.
pub(super) fn relax_avoidance(view: &mut sched::ClusterView) {
    for job in view.pending.iter_mut().filter(|j| j.exclude.iter().any(|n| n.starts_with(AVOID_MARK))) {
        let avoided: Vec<String> =
            job.exclude.iter().filter_map(|n| n.strip_prefix(AVOID_MARK)).map(str::to_string).collect();
        job.exclude.retain(|n| !n.starts_with(AVOID_MARK));
        let elsewhere = view
            .nodes
            .iter()
            .filter(|n| n.schedulable && !n.spare && n.partitions.iter().any(|p| p.as_str() == job.partition.as_str()))
            .filter(|n| !job.exclude.contains(&n.name) && !avoided.contains(&n.name))
            .filter(|n| job.nodelist.is_empty() || job.nodelist.contains(&n.name))
            .filter(|n| n.gpus_total >= job.gpus_per_node)
            .count();
        if elsewhere >= job.nodes as usize {
            job.exclude.extend(avoided);
        }
    }
}

/// An active job as the view's pending job, if it is pending (and holds nothing: a job being requeued is not
/// pending yet). Others are not the scheduler's.
pub(super) fn pending_job(job: &drover_state::Job, singleton_blocked: &Singletons) -> Option<sched::PendingJob> {
    if !pending_state(job) {
        return None;
    }
    let spec = &job.spec;
    let per_node_tasks = spec.max_tasks_per_node(spec.min_nodes);
    Some(sched::PendingJob {
        id: job.id,
        submit_s: job.submit_time_ms / 1_000,
        user: spec.user.clone(),
        account: job.account_name().into(),
        partition: job.partition.clone(),
        qos: job.qos_name().into(),
        nodes: spec.min_nodes,
        gpus_per_node: spec.gpus_per_node,
        cpus_per_node: per_node_tasks.saturating_mul(spec.cpus_per_task),
        mem_per_node_mb: match spec.mem_request() {
            None => 0,
            Some(MemRequest::PerNode(0)) => sched::ALL_MEMORY,
            Some(request) => request.on_node(per_node_tasks.saturating_mul(spec.cpus_per_task), spec.gpus_per_node, 0),
        },
        gpu_type: spec.gpu_type.as_deref().map(Into::into),
        time_limit_s: job.time_limit_s.unwrap_or(UNLIMITED_S),
        exclusive: spec.exclusive,
        constraint: spec.constraint.to_vec(),
        nodelist: spec.nodelist.to_vec(),
        // The nodes its last failed incarnation was charged on come after the user's own exclusions, marked by
        // `AVOID_MARK`, so that `relax_avoidance` can take them back when nothing else could hold the job.
        exclude: spec
            .exclude
            .iter()
            .cloned()
            .chain(job.avoid_nodes().iter().map(|n| format!("{AVOID_MARK}{n}")))
            .collect(),
        reservation: spec.reservation.as_deref().map(Into::into),
        held: job.held,
        dependency: dependency_of(job, singleton_blocked),
        allow_multi_site: spec.multi_site,
        nice: spec.nice,
        top_rank: job.top_rank,
        array: job
            .array
            .as_deref()
            .and_then(|a| a.max_running.map(|max_running| sched::ArrayLimit { array_id: a.array_job_id, max_running })),
        // Rounded up: a job never starts before the second it asked for.
        begin_s: spec.begin_ms.map_or(0, |ms| ms.div_ceil(1_000)),
        may_use_spares: job.may_use_spares(),
    })
}

/// Whether the job waits to start: pending and holding nothing (a job being requeued is not pending yet).
pub(super) fn pending_state(job: &drover_state::Job) -> bool {
    job.state == JobState::Pending && job.allocation.is_empty()
}

/// GPUs of ended incarnations still being released on their nodes, as running work the scheduler expects gone
/// just after now (it treats an overdue job the same way). Without them, those GPUs would look held for good: a job
/// restarting after a node failure could reserve none of its survivors' GPUs while they are released, and a job
/// behind it could backfill onto the first survivor freed. Never preemptable, and charged to no QOS or array.
fn lingering(state: &State, now_ms: u64) -> Vec<sched::RunningJob> {
    let mut out = Vec::new();
    for node in state.nodes.values().filter(|n| !n.lingering.is_empty()) {
        // Only GPUs the view shows as held and by nothing else (an inventory that changed since, or a GPU listed
        // twice, would make the pass refuse the whole view).
        let mut seen = BTreeSet::new();
        for l in &node.lingering {
            let gpus: Vec<u32> = l
                .gpus
                .iter()
                .copied()
                .filter(|g| {
                    node.info.gpus.iter().any(|i| i.index == *g)
                        && !node.allocated_gpus.contains_key(g)
                        && seen.insert(*g)
                })
                .collect();
            if gpus.is_empty() {
                continue;
            }
            out.push(sched::RunningJob {
                id: l.job,
                user: String::new().into(),
                account: String::new().into(),
                qos: String::new().into(),
                alloc: vec![(node.info.name.clone(), gpus)],
                start_s: now_ms / 1_000,
                time_limit_s: 0,
                exclusive: false,
                reservation: None,
                array_id: None,
                partition: String::new().into(),
                requeueable: false,
                priority: 0,
                preempting: false,
                preempted_for: None,
            });
        }
    }
    out
}

fn sched_qos(q: &drover_state::Qos) -> sched::Qos {
    sched::Qos {
        name: q.name.clone(),
        priority: q.priority,
        max_jobs_per_user: q.max_jobs_per_user,
        max_gpus_per_user: q.max_gpus_per_user,
        max_jobs_per_account: q.max_jobs_per_account,
        max_gpus_per_account: q.max_gpus_per_account,
        preempt: q.preempt.clone(),
        preempt_exempt_time_s: q.preempt_exempt_time_s,
    }
}

/// The fair-share tree as the scheduler sees it at `now_ms`: each account's committed usage decayed to now,
/// plus what its running jobs used so far (also decayed), so a long job weighs on its account while it runs.
/// Without a defined tree, every account jobs name is an equal child of root with no usage.
pub fn account_tree(state: &State, now_ms: u64) -> Vec<sched::Account> {
    account_tree_in_chunks(|_, walk| walk(state), now_ms, usize::MAX)
}

/// The same tree with the jobs walked `per_lock` per hold of the state lock (see `view_in_chunks`).
fn account_tree_in_chunks(
    with_state: impl Fn(Hold, &mut dyn FnMut(&State)),
    now_ms: u64,
    per_lock: usize,
) -> Vec<sched::Account> {
    let mut half_life = 0;
    with_state(Hold::Other, &mut |state| half_life = half_life_s(state));
    let mut totals = AccountTotals::default();
    for_each_job_in_chunks(&with_state, per_lock, |job| totals.add(job, now_ms, half_life));
    let mut tree = Vec::new();
    with_state(Hold::Other, &mut |state| tree = account_tree_from(state, now_ms, &totals));
    tree
}

pub(super) fn half_life_s(state: &State) -> u64 {
    state.config().map_or(0, |c| c.fairshare_half_life_s)
}

/// What the fair-share tree needs from the active jobs: the accounts they charge (the implicit flat tree, when no
/// account is defined) and the decayed usage of the running ones, per account.
#[derive(Default)]
pub(super) struct AccountTotals {
    names: BTreeSet<String>,
    running_gpu_s: HashMap<String, f64>,
}

impl AccountTotals {
    pub(super) fn add(&mut self, job: &drover_state::Job, now_ms: u64, half_life_s: u64) {
        let name = job.account_name();
        if !self.names.contains(name) {
            self.names.insert(name.to_string());
        }
        if job.allocation.is_empty() {
            return;
        }
        let now_s = now_ms / 1_000;
        let start_s = job.start_time_ms.unwrap_or(now_ms) / 1_000;
        let usage = sched::fairshare::decayed_usage(job.allocated_gpus() as u32, start_s, now_s, now_s, half_life_s);
        match self.running_gpu_s.get_mut(name) {
            Some(sum) => *sum += usage,
            None => drop(self.running_gpu_s.insert(name.to_string(), usage)),
        }
    }
}

/// The fair-share tree: the defined accounts with their decayed usage plus their running jobs', or without any
/// defined, a flat tree of the accounts the jobs charge.
pub(super) fn account_tree_from(state: &State, now_ms: u64, totals: &AccountTotals) -> Vec<sched::Account> {
    let now_s = now_ms / 1_000;
    if state.accounts.is_empty() {
        let mut tree = vec![sched::Account { name: ROOT_ACCOUNT.into(), parent: None, shares: 1, usage_gpu_s: 0.0 }];
        tree.extend(totals.names.iter().filter(|a| *a != ROOT_ACCOUNT).map(|name| sched::Account {
            name: name.clone(),
            parent: Some(ROOT_ACCOUNT.into()),
            shares: 1,
            usage_gpu_s: 0.0,
        }));
        return tree;
    }
    let half_life_s = half_life_s(state);
    state
        .accounts
        .values()
        .map(|a| sched::Account {
            name: a.name.clone(),
            parent: a.parent.clone(),
            shares: a.shares,
            usage_gpu_s: sched::fairshare::decay(a.usage_gpu_s, now_s.saturating_sub(a.usage_at_s), half_life_s)
                + totals.running_gpu_s.get(a.name.as_str()).copied().unwrap_or(0.0),
        })
        .collect()
}

/// `sshare`'s rows, from the same tree and the same arithmetic the scheduler uses, the jobs walked `per_lock` per
/// hold of the state lock: `sinfo` and `sshare` ask for them, and must not hold off `apply` for a walk over every
/// job.
pub fn share_rows(
    with_state: impl Fn(Hold, &mut dyn FnMut(&State)),
    now_ms: u64,
    per_lock: usize,
) -> Vec<drover_proto::wire::ShareRow> {
    let rows = sched::fairshare::share_report(&account_tree_in_chunks(with_state, now_ms, per_lock));
    rows.into_iter()
        .map(|r| drover_proto::wire::ShareRow {
            account: r.account,
            parent: r.parent,
            depth: r.depth,
            raw_shares: r.raw_shares,
            norm_shares: r.norm_shares,
            raw_usage: r.raw_usage,
            norm_usage: r.norm_usage,
            effective_usage: r.effective_usage,
            fairshare: r.fairshare,
        })
        .collect()
}

/// Per (user, job name): the lowest id of a pending job and whether one has started, for `singleton`.
pub(super) type Singletons = HashMap<(compact_str::CompactString, compact_str::CompactString), (u64, bool)>;

/// The `singleton` table, walked chunk by chunk: only when some job asks for `singleton` (one cheap sweep finds
/// out), since the table holds an entry per user and job name in the queue.
fn singletons_in_chunks(with_state: &impl Fn(Hold, &mut dyn FnMut(&State)), per_lock: usize) -> Singletons {
    let mut out = Singletons::new();
    let mut wanted = false;
    for_each_job_in_chunks(with_state, per_lock, |job| {
        wanted |= job.spec.dependency.iter().any(|d| d.kind == DependencyKind::Singleton)
    });
    if wanted {
        for_each_job_in_chunks(with_state, per_lock, |job| {
            let entry = out.entry((job.spec.user.clone(), job.spec.name.clone())).or_insert((u64::MAX, false));
            if job.state == JobState::Pending {
                entry.0 = entry.0.min(job.id);
            } else {
                entry.1 = true;
            }
        });
    }
    out
}

/// The job's `--dependency` verdict: the stored ones, with `singleton` judged against the queue now (blocked
/// while another job of the same user and name runs or waits ahead of it).
fn dependency_of(job: &drover_state::Job, singletons: &Singletons) -> sched::DependencyState {
    if job.spec.dependency.is_empty() {
        return sched::DependencyState::Satisfied;
    }
    let verdicts: Vec<DepState> = job
        .spec
        .dependency
        .iter()
        .zip(job.dependency_state.iter().chain(std::iter::repeat(&DepState::Waiting)))
        .map(|(dep, stored)| {
            if dep.kind != DependencyKind::Singleton {
                return *stored;
            }
            let key = (job.spec.user.clone(), job.spec.name.clone());
            let (first_pending, started) = singletons.get(&key).copied().unwrap_or((u64::MAX, false));
            if started || first_pending < job.id { DepState::Waiting } else { DepState::Satisfied }
        })
        .collect();
    match combine(&verdicts, job.spec.dependency_any) {
        DepState::Satisfied => sched::DependencyState::Satisfied,
        DepState::Waiting => sched::DependencyState::Waiting,
        DepState::Never => sched::DependencyState::NeverSatisfied,
    }
}

/// The plan as commands: one `ApplyPlan` (starts and reasons), and one `PreemptJobs` per job that preempts.
pub fn commands(state: &State, plan: &sched::Plan) -> Vec<Command> {
    commands_in_chunks(|translate| translate(state), plan, usize::MAX)
}

/// [`commands`] over the live state, `per_lock` of the plan's pending reasons per call of `with_state` (one hold
/// of the state lock each): a plan over a million pending jobs lists a reason for each, and checking them all
/// under one hold stalled `apply` as the view's copy did.
pub fn commands_in_chunks(
    with_state: impl Fn(&mut dyn FnMut(&State)),
    plan: &sched::Plan,
    per_lock: usize,
) -> Vec<Command> {
    let mut allocations = Vec::new();
    with_state(&mut |state| allocations = allocations_of(state, plan));
    let mut reasons = Vec::new();
    for chunk in plan.reasons.chunks(per_lock.max(1)) {
        if reasons.len() >= MAX_REASON_UPDATES {
            break;
        }
        with_state(&mut |state| changed_reasons(state, chunk, &mut reasons));
    }
    let mut out = Vec::new();
    if !allocations.is_empty() || !reasons.is_empty() {
        out.push(Command::ApplyPlan { allocations, reasons });
    }
    let mut by_preemptor: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    for p in &plan.preemptions {
        by_preemptor.entry(p.for_job).or_default().push(p.victim);
    }
    out.extend(by_preemptor.into_iter().map(|(for_job, victims)| Command::PreemptJobs { victims, for_job }));
    out
}

/// The reasons in `planned` that differ from the jobs' current ones, appended to `out` until it holds
/// `MAX_REASON_UPDATES`.
fn changed_reasons(state: &State, planned: &[(u64, sched::Reason)], out: &mut Vec<(u64, PendingReason)>) {
    for (id, r) in planned {
        if out.len() >= MAX_REASON_UPDATES {
            return;
        }
        let Some(job) = state.jobs.get(id) else { continue };
        let r = *r;
        if job.state == JobState::Pending && !job.held && job.reason != r {
            out.push((*id, r));
        }
    }
}

/// Turns a plan into the command to commit: starts with their tasks and CPUs per node, and the pending reasons
/// that changed (at most `MAX_REASON_UPDATES`, in the plan's priority order). `None` when nothing changes.
pub fn command(state: &State, plan: &sched::Plan) -> Option<Command> {
    let allocations = allocations_of(state, plan);
    let mut reasons = Vec::new();
    changed_reasons(state, &plan.reasons, &mut reasons);
    if allocations.is_empty() && reasons.is_empty() {
        return None;
    }
    Some(Command::ApplyPlan { allocations, reasons })
}

/// The plan's starts (at most `MAX_PLAN_ALLOCATIONS`) with their tasks, CPUs and memory per node. A job whose
/// earlier incarnation still lingers somewhere does not start yet (`apply` would refuse it): it stays in the pass
/// all the same, so the nodes it is planned on are kept for it, not backfilled, until its old tasks are gone.
pub(super) fn allocations_of(state: &State, plan: &sched::Plan) -> Vec<Allocation> {
    plan.starts
        .iter()
        .take(MAX_PLAN_ALLOCATIONS)
        .filter(|(id, _)| !state.earlier_incarnation_lingers(*id))
        .filter_map(|(id, nodes)| {
            let job = state.jobs.get(id)?;
            let tasks = job.spec.tasks_per_node(nodes.len() as u32);
            let shares = nodes
                .iter()
                .zip(tasks)
                .map(|((node, gpus), tasks)| {
                    let declared = state.nodes.get(node).map_or(0, |n| n.info.cpus);
                    let cpus = match (declared, job.spec.exclusive) {
                        (0, _) => 0,
                        // An exclusive job holds the whole node, CPUs included.
                        (all, true) => all,
                        (_, false) => tasks.saturating_mul(job.spec.cpus_per_task),
                    };
                    let mem_mb =
                        state.nodes.get(node).map_or(0, |n| n.mem_for(job.spec.mem_request(), cpus, gpus.len() as u32));
                    NodeAllocation { node: node.clone(), gpus: gpus.clone(), cpus, tasks, mem_mb }
                })
                .collect();
            Some(Allocation { job_id: *id, nodes: shares })
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use drover_state::{ClusterConfig, GpuInfo, JobSpec, NodeInfo, Reply, Request};

    use super::*;

    pub(in crate::leader) fn at(time_ms: u64, command: Command) -> Request {
        Request { time_ms, command }
    }

    pub(in crate::leader) fn node(name: &str, gpus: u32, switch: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            cpus: 64,
            gpus: (0..gpus).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
            topology: [("switch".to_string(), switch.to_string())].into(),
            ..NodeInfo::default()
        }
    }

    pub(in crate::leader) fn job(nodes: u32, gpus: u32, time_s: u64) -> JobSpec {
        JobSpec {
            name: "j".into(),
            user: "alice".into(),
            min_nodes: nodes,
            max_nodes: nodes,
            cpus_per_task: 1,
            gpus_per_node: gpus,
            time_limit_s: Some(time_s),
            script: "#!/bin/sh\n".into(),
            ..JobSpec::default()
        }
    }

    /// Runs passes and commits their plans, as the leader does.
    fn schedule(state: &mut State, now_ms: u64) -> Vec<u64> {
        let plan = sched::schedule(&view(state, now_ms), &sched::SchedulerConfig::default()).unwrap();
        let Some(command) = command(state, &plan) else { return Vec::new() };
        let applied = state.apply(&at(now_ms, command));
        state.check_invariants();
        match applied.response {
            Ok(Reply::Planned { started, refused }) => {
                assert!(refused.is_empty(), "a fresh plan is never refused: {refused:?}");
                started
            }
            other => panic!("{other:?}"),
        }
    }

    fn cluster() -> State {
        let mut state = State::default();
        let config = ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() };
        state.apply(&at(0, Command::InitCluster { config }));
        for (name, switch) in [("n1", "s1"), ("n2", "s2"), ("n3", "s1"), ("n4", "s2")] {
            state
                .apply(&at(1, Command::RegisterNode { info: node(name, 8, switch), running: Vec::new() }))
                .response
                .unwrap();
        }
        state
    }

    pub(in crate::leader) fn submit(state: &mut State, spec: JobSpec, time_ms: u64) -> u64 {
        match state.apply(&at(time_ms, Command::SubmitJob { spec: Box::new(spec), request_id: None })).response {
            Ok(Reply::Submitted { job_id, .. }) => job_id,
            other => panic!("{other:?}"),
        }
    }

    /// Copies the view with `per_lock` jobs per hold. Holds that are not for jobs get `jobless`, the state with its
    /// jobs removed: whatever they compute must not need the jobs (a walk over all of them in one hold stalled
    /// the leader at a million jobs). Returns the view, the config and the count of holds.
    fn chunked_view(
        state: &State,
        jobless: &State,
        per_lock: usize,
    ) -> (sched::ClusterView, sched::SchedulerConfig, usize) {
        let holds = std::cell::Cell::new(0);
        let (view, config) = view_in_chunks(
            |hold, copy| {
                holds.set(holds.get() + 1);
                copy(if hold == Hold::Jobs { state } else { jobless })
            },
            3_000,
            per_lock,
        );
        (view, config, holds.get())
    }

    #[test]
    fn a_view_copied_in_chunks_is_the_view_copied_at_once_and_releases_the_lock_between_chunks() {
        let mut state = cluster();
        for i in 0..23 {
            let mut spec = job(1, 1 + i % 4, 600);
            if i % 5 == 0 {
                // `singleton` is judged against the whole queue, whichever chunk a job lands in.
                spec.dependency =
                    vec![drover_state::Dependency { kind: DependencyKind::Singleton, job: 0, task: None }].into();
            }
            submit(&mut state, spec, 1_000 + i as u64);
        }
        schedule(&mut state, 2_000);
        assert!(state.jobs.values().any(|j| !j.allocation.is_empty()), "some jobs run");
        assert!(state.jobs.values().any(|j| j.state == JobState::Pending), "some jobs wait");
        let whole = view(&state, 3_000);
        assert_eq!(whole.accounts, account_tree(&state, 3_000), "the tree, summed over the jobs at once");
        assert!(whole.pending.iter().any(|j| j.dependency == sched::DependencyState::Waiting), "a singleton waits");
        let mut jobless = state.clone();
        jobless.jobs.clear();
        for per_lock in [1, 4, 22, 23, 24, 1_000] {
            let (chunked, config, holds) = chunked_view(&state, &jobless, per_lock);
            assert_eq!(chunked, whole, "{per_lock} jobs per lock");
            assert_eq!(config, scheduler_config(&state));
            // Two holds for everything but the jobs; the jobs, a chunk per hold (the last one short or empty),
            // swept twice with a `singleton` in the queue (once to find out, once for the table), then once more.
            assert_eq!(holds, 2 + 3 * (23 / per_lock + 1), "{per_lock} jobs per lock");
        }
        // With accounts defined, running jobs' usage is summed per account, chunk by chunk, the same way.
        for name in ["root", "physics"] {
            let parent = (name != "root").then(|| "root".to_string());
            let account = drover_state::Account { name: name.into(), parent, shares: 1, ..Default::default() };
            state.accounts.insert(name.into(), account.clone());
            jobless.accounts.insert(name.into(), account);
        }
        for job in state.jobs.values_mut().filter(|j| j.id % 2 == 0) {
            job.account = "physics".into();
        }
        let whole = view(&state, 3_000);
        assert_eq!(whole.accounts, account_tree(&state, 3_000));
        assert!(
            whole.accounts.iter().all(|a| a.usage_gpu_s > 0.0),
            "both accounts have running jobs: {:?}",
            whole.accounts
        );
        assert_eq!(chunked_view(&state, &jobless, 4).0, whole);
        let at_once = share_rows(|_, walk| walk(&state), 3_000, usize::MAX);
        let chunked = share_rows(|hold, walk| walk(if hold == Hold::Jobs { &state } else { &jobless }), 3_000, 4);
        assert_eq!(chunked, at_once, "sshare's rows, the jobs walked in chunks");
        // The plan's translation into commands, checked a chunk of reasons per hold, is the same as at once.
        let plan = sched::schedule(&whole, &scheduler_config(&state)).unwrap();
        assert!(!plan.reasons.is_empty());
        let at_once = commands(&state, &plan);
        assert!(!at_once.is_empty(), "the waiting jobs' reasons change");
        for per_lock in [1, 4, 1_000] {
            assert_eq!(commands_in_chunks(|translate| translate(&state), &plan, per_lock), at_once, "{per_lock}");
        }
    }

    /// Past the queue depth, a pass sees only the pending jobs it would rank first (here the two oldest, and a
    /// newer one whose negative nice lifts it above them), while running jobs are all in the view; a queue within
    /// the depth is copied whole.
    #[test]
    fn past_the_queue_depth_a_pass_sees_only_the_best_ranked_pending_jobs() {
        let mut state = State::default();
        let mut config = ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() };
        config.scheduler.queue_depth = 4;
        state.apply(&at(0, Command::InitCluster { config }));
        for (name, switch) in [("n1", "s1"), ("n2", "s2"), ("n3", "s1"), ("n4", "s2")] {
            state
                .apply(&at(1, Command::RegisterNode { info: node(name, 8, switch), running: Vec::new() }))
                .response
                .unwrap();
        }
        let running = submit(&mut state, job(1, 8, 600), 1_000);
        assert_eq!(schedule(&mut state, 1_500), [running]);
        // Each needs all four nodes, so none starts while `running` runs.
        let waiting: Vec<u64> = (0..10).map(|i| submit(&mut state, job(4, 8, 600), 2_000 + i * 1_000)).collect();
        let favoured = submit(&mut state, JobSpec { nice: -1_000, ..job(4, 8, 600) }, 20_000);
        let whole = view(&state, 30_000);
        let pending: Vec<u64> = whole.pending.iter().map(|j| j.id).collect();
        assert_eq!(pending, [waiting[0], waiting[1], waiting[2], favoured]);
        assert_eq!(whole.running.iter().map(|j| j.id).collect::<Vec<_>>(), [running], "every running job");
        // The count of active jobs (not a walk over them) is what an `Other` hold reads to choose the path.
        let chunked = view_in_chunks(|_, copy| copy(&state), 30_000, 3);
        assert_eq!(chunked.0, whole, "the same, copied a chunk per hold");
        // Within the depth, the queue is copied whole.
        state.apply(&at(31_000, Command::CancelJobs { ids: waiting[2..].to_vec(), by_uid: 0 })).response.unwrap();
        let pending: Vec<u64> = view(&state, 32_000).pending.iter().map(|j| j.id).collect();
        assert_eq!(pending, [waiting[0], waiting[1], favoured]);
    }

    #[test]
    fn a_two_node_job_stays_under_one_switch_and_small_jobs_pack() {
        let mut state = cluster();
        let small = submit(&mut state, job(1, 2, 600), 1_000);
        schedule(&mut state, 2_000);
        let on = state.job(small).unwrap().nodes[0].clone();
        let pair = submit(&mut state, job(2, 8, 600), 3_000);
        let second_small = submit(&mut state, job(1, 2, 600), 3_000);
        schedule(&mut state, 4_000);
        let pair_nodes = &state.job(pair).unwrap().nodes;
        let switch = |n: &str| state.nodes[n].info.topology["switch"].clone();
        assert_eq!(switch(&pair_nodes[0]), switch(&pair_nodes[1]), "{pair_nodes:?} span two switches");
        assert_eq!(state.job(second_small).unwrap().nodes[0], on, "a small job fills the partly used node");
    }

    #[test]
    fn backfill_starts_a_short_job_but_not_one_that_would_delay_the_big_one() {
        let mut state = cluster();
        // 3 of 4 nodes busy for an hour; a 4-node job must wait for them; one node is free now.
        for _ in 0..3 {
            submit(&mut state, job(1, 8, 3_600), 1_000);
        }
        schedule(&mut state, 1_000);
        let big = submit(&mut state, job(4, 8, 3_600), 2_000);
        let long = submit(&mut state, job(1, 8, 7_200), 3_000);
        let short = submit(&mut state, job(1, 8, 600), 4_000);
        let started = schedule(&mut state, 5_000);
        assert_eq!(started, vec![short], "only the job that ends before the big one's reserved start may backfill");
        assert_eq!(state.job(big).unwrap().reason, PendingReason::Resources);
        assert_ne!(state.job(long).unwrap().state, JobState::Running);
    }

    #[test]
    fn memory_is_held_like_gpus_and_a_job_waits_for_it() {
        let mut state = State::default();
        let config = ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() };
        state.apply(&at(0, Command::InitCluster { config }));
        let info = NodeInfo { memory_mb: 64 * 1024, ..node("n1", 8, "s1") };
        state.apply(&at(1, Command::RegisterNode { info, running: Vec::new() })).response.unwrap();
        let mem = |m| JobSpec { mem: Some(m), ..job(1, 1, 600) };
        // 40 GiB, then 4 GiB per GPU on 4 GPUs (16 GiB): both fit in 64 GiB; a third 40 GiB job does not.
        let first = submit(&mut state, mem(MemRequest::PerNode(40 * 1024)), 1_000);
        let per_gpu = submit(&mut state, JobSpec { gpus_per_node: 4, ..mem(MemRequest::PerGpu(4 * 1024)) }, 1_000);
        let third = submit(&mut state, mem(MemRequest::PerNode(40 * 1024)), 1_000);
        let mut started = schedule(&mut state, 2_000);
        started.sort_unstable();
        assert_eq!(started, vec![first, per_gpu]);
        assert_eq!(state.nodes["n1"].allocated_mem_mb, 56 * 1024);
        assert_eq!(state.job(per_gpu).unwrap().allocation[0].mem_mb, 16 * 1024);
        assert_eq!(state.job(third).unwrap().reason, PendingReason::Resources, "3 GPUs are free, the memory is not");
        // --mem=0 takes the whole node's memory, so it waits for the node to empty.
        let whole = submit(&mut state, mem(MemRequest::PerNode(0)), 3_000);
        assert!(schedule(&mut state, 4_000).is_empty());
        assert_ne!(state.job(whole).unwrap().state, JobState::Running);
        // A request no node could ever hold is refused at submit, naming the memory.
        let refused = state.apply(&at(
            5_000,
            Command::SubmitJob { spec: Box::new(mem(MemRequest::PerNode(65 * 1024))), request_id: None },
        ));
        let err = refused.response.unwrap_err().to_string();
        assert!(err.contains("66560 MiB of memory") && err.contains("65536 MiB per node"), "{err}");
    }

    #[test]
    fn a_job_with_a_begin_time_waits_for_it_with_reason_begin_time() {
        let mut state = cluster();
        let later = submit(&mut state, JobSpec { begin_ms: Some(60_000), ..job(1, 1, 600) }, 1_000);
        assert!(schedule(&mut state, 2_000).is_empty());
        assert_eq!(state.job(later).unwrap().reason, PendingReason::BeginTime);
        assert_eq!(schedule(&mut state, 60_000), vec![later]);
    }

    /// Issue 14's restart: a 3-node job loses n2; it restarts on its survivors n1 and n3 plus the spare n4 as soon
    /// as their GPUs are released, and a later job does not take n3 while n1 is still being released.
    #[test]
    fn a_job_that_lost_a_node_restarts_on_its_survivors_and_a_spare_and_nothing_backfills_in_between() {
        let mut state = State::default();
        let config = ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() };
        state.apply(&at(0, Command::InitCluster { config }));
        for (name, spare) in [("n1", false), ("n2", false), ("n3", false), ("n4", true)] {
            let info = NodeInfo { spare, ..node(name, 8, "s1") };
            state.apply(&at(1, Command::RegisterNode { info, running: Vec::new() })).response.unwrap();
        }
        let big = submit(&mut state, job(3, 8, 3_600), 1_000);
        assert_eq!(schedule(&mut state, 2_000), vec![big]);
        assert_eq!(state.job(big).unwrap().nodes, ["n1", "n2", "n3"], "the spare is left alone");
        state
            .apply(&at(3_000, Command::NodeDown { name: "n2".into(), reason: "lost".into(), epoch: None }))
            .response
            .unwrap();
        let small = submit(&mut state, job(1, 8, 600), 4_000);
        let release = |state: &mut State, node: &str, time_ms| {
            let keys = vec![(big, 0)];
            let command = Command::ReleaseLingering { node: node.into(), keys, usage: Vec::new() };
            state.apply(&at(time_ms, command)).response.unwrap();
        };
        // n3 confirms first; n1's GPUs are still being released.
        release(&mut state, "n3", 5_000);
        assert!(schedule(&mut state, 6_000).is_empty(), "nothing takes n3 from the restarting job");
        assert_eq!(state.job(big).unwrap().reason, PendingReason::Resources);
        release(&mut state, "n1", 7_000);
        assert_eq!(schedule(&mut state, 8_000), vec![big]);
        assert_eq!(state.job(big).unwrap().nodes, ["n1", "n3", "n4"]);
        assert!(!state.nodes["n4"].spare, "the spare it took is a normal node now");
        assert_ne!(state.job(small).unwrap().state, JobState::Running);
    }

    /// The whole loop, replicated state included: usage charged in `apply` when jobs end, decayed, read back into
    /// the next view. Two accounts with shares 2:1 that both keep a backlog end up with GPU time close to 2:1.
    #[test]
    fn fair_share_through_the_replicated_state_converges_to_the_shares() {
        let mut state = State::default();
        let config = ClusterConfig { fairshare_half_life_s: 3_600, allow_root_jobs: true, ..ClusterConfig::default() };
        state.apply(&at(0, Command::InitCluster { config }));
        for (name, switch) in [("n1", "s1"), ("n2", "s2"), ("n3", "s1"), ("n4", "s2")] {
            state
                .apply(&at(1, Command::RegisterNode { info: node(name, 8, switch), running: Vec::new() }))
                .response
                .unwrap();
        }
        for (account, shares, user) in [("big", 2, "alice"), ("small", 1, "bob")] {
            let update = drover_state::AccountUpdate {
                name: account.into(),
                shares: Some(shares),
                add_users: vec![user.into()],
                ..Default::default()
            };
            let op = drover_state::AdminOp::AddAccount(update);
            state.apply(&at(2, Command::Admin { op, by_uid: 0 })).response.unwrap();
        }
        let (step_ms, run_ms) = (60_000u64, 300_000u64);
        let mut started_at: HashMap<u64, u64> = HashMap::new();
        let mut gpu_s: HashMap<String, u64> = HashMap::new();
        let steps = 12 * 60; // twelve virtual hours, a pass a minute
        for step in 0..steps {
            let now = 10_000 + step * step_ms;
            // Each user keeps 40 one-GPU jobs waiting.
            for user in ["alice", "bob"] {
                let waiting = state.jobs.values().filter(|j| j.spec.user == user && j.state == JobState::Pending);
                for _ in waiting.count()..40 {
                    submit(&mut state, JobSpec { user: user.into(), ..job(1, 1, 600) }, now);
                }
            }
            // Jobs run five minutes.
            let done: Vec<u64> = started_at.iter().filter(|(_, t)| now >= **t + run_ms).map(|(id, _)| *id).collect();
            for id in done {
                started_at.remove(&id);
                let end = drover_state::JobEnd::default();
                state.apply(&at(now, Command::JobEnded { job_id: id, incarnation: 0, end })).response.unwrap();
            }
            for id in schedule(&mut state, now) {
                started_at.insert(id, now);
                // Count the second half only, after the start-up transient.
                if step >= steps / 2 {
                    *gpu_s.entry(state.job(id).unwrap().account.to_string()).or_default() += run_ms / 1_000;
                }
            }
        }
        let ratio = gpu_s["big"] as f64 / gpu_s["small"] as f64;
        assert!((1.7..2.3).contains(&ratio), "GPU time big:small = {ratio:.2} ({gpu_s:?}), shares 2:1");
        assert!(state.accounts["big"].usage_gpu_s > state.accounts["small"].usage_gpu_s);
    }

    /// A suspended job's end moves with its suspension, as its time limit does: the scheduler's view of it ends
    /// that much later (here a 100 s job suspended for 30 s, then still stopped 20 s later).
    #[test]
    fn a_suspended_jobs_expected_end_moves_by_the_time_it_was_stopped() {
        let mut job = drover_state::Job {
            id: 5,
            time_limit_s: Some(100),
            start_time_ms: Some(1_000_000),
            allocation: vec![drover_state::NodeAllocation { node: "a".into(), gpus: vec![0], ..Default::default() }]
                .into(),
            ..drover_state::Job::default()
        };
        assert_eq!(running_job(&job, 1_010_000).unwrap().time_limit_s, 100, "never suspended");
        job.suspension = Some(Box::new(drover_state::job::Suspension { since_ms: None, total_ms: 30_000 }));
        assert_eq!(running_job(&job, 1_050_000).unwrap().time_limit_s, 130, "suspended 30 s, resumed");
        job.suspension = Some(Box::new(drover_state::job::Suspension { since_ms: Some(1_060_000), total_ms: 30_000 }));
        assert_eq!(running_job(&job, 1_080_000).unwrap().time_limit_s, 150, "and stopped again for 20 s so far");
        job.time_limit_s = None;
        assert_eq!(running_job(&job, 1_080_000).unwrap().time_limit_s, UNLIMITED_S);
    }
}

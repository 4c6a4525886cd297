//! One scheduling pass: priority order, start-now with best-fit placement, backfill reservations for blocked jobs.
//!
//! Every pending job is tried for "start now" against the availability profiles, which already hold the
//! reservations of higher-priority blocked jobs; so a job that starts now can never delay them. Blocked jobs up to
//! `max_reservations` get a reservation at their earliest start.
//!
//! Cost: start-now is O(log nodes) for a job that fits the first node it tries, and O(1) once the partition has
//! too few nodes with enough free GPUs (per-partition counts by free-GPU level), plus a per-shape memo of the
//! shortest time limit that already failed (resources only shrink within a pass). A reservation without node
//! filters evaluates only the nodes whose lower-bound start (a lazy heap shared by the pass) can still be among the
//! earliest; other reservations scan the partition's nodes once, multi-node searches then re-evaluate only a few
//! nodes per round. Per-job facts are resolved once in view order and gathered into priority order (sorted as packed
//! integer keys), so the main loop reads them sequentially; scratch buffers are dropped as soon as they are used.
//!
//! A blocked job whose QOS or partition may preempt others then looks for victims (see [`preempt`]); with nothing
//! configured that costs one branch per blocked job.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::fxhash::FxMap;

pub mod preempt;

use crate::error::ScheduleError;
use crate::fairshare::FairShareTree;
use crate::model::{
    ClusterView, DependencyState, JobId, PartitionState, PendingJob, PriorityWeights, Qos, RunningJob, SchedulerConfig,
    Topology, mem_needed,
};
use crate::placement::{Candidate, choose_nodes, lowest_gpus};
use crate::plan::{NodeAlloc, Plan, Preemption, Reason};
use crate::priority::{JobFactors, PriorityBreakdown, PriorityContext, apply_top};
use crate::profile::Profile;

/// GPUs per node the bit masks can hold.
const MAX_GPUS_PER_NODE: u32 = 64;
/// Partitions and features are bit masks.
const MAX_DISTINCT_BITS: usize = 64;
/// Rounds of the multi-node earliest-start search before giving up on a reservation for that job.
const MAX_EARLIEST_START_ROUNDS: usize = 256;

/// Per-node state of a pass.
struct NodeRt {
    total: u32,
    free_mask: u64,
    cpus_free: u32,
    mem_total: u64,
    mem_free: u64,
    part_mask: u64,
    feature_mask: u64,
    /// 0: no type; otherwise an interned GPU type.
    gpu_type: u32,
    site: u32,
    rack: u32,
    switch: u32,
    /// Up, undrained and not a hot spare: ordinary placement may use it.
    schedulable: bool,
    /// Up, undrained and a hot spare: only jobs that may use spares ([`Req::may_use_spares`]) start on it.
    spare: bool,
    /// Free GPUs for jobs outside any advance reservation.
    general: Profile,
    /// Per advance reservation on this node: its reserved GPUs not yet used by its own jobs.
    resv: Vec<(usize, Profile)>,
    /// `general` at now, clamped at 0; the key of the per-partition free-GPU index.
    avail_now: u32,
}

/// A set of node indices (one partition, one free-GPU level): O(1) insert and remove, ascending iteration that
/// skips empty 64-node blocks through a summary word per 4,096 nodes.
#[derive(Clone)]
struct NodeBits {
    words: Vec<u64>,
    summary: Vec<u64>,
}

impl NodeBits {
    fn new(nodes: usize) -> Self {
        let w = nodes.div_ceil(64);
        Self { words: vec![0; w], summary: vec![0; w.div_ceil(64)] }
    }

    fn insert(&mut self, i: u32) {
        let w = (i / 64) as usize;
        self.words[w] |= 1 << (i % 64);
        self.summary[w / 64] |= 1 << (w % 64);
    }

    fn remove(&mut self, i: u32) {
        let w = (i / 64) as usize;
        self.words[w] &= !(1 << (i % 64));
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
    }

    /// Members in ascending order.
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.summary
            .iter()
            .enumerate()
            .flat_map(|(si, &s)| Bits(s).map(move |b| si * 64 + b as usize))
            .flat_map(move |w| Bits(self.words[w]).map(move |b| (w * 64) as u32 + b))
    }
}

/// The set bits of a word, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let b = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(b)
    }
}

/// What makes two jobs interchangeable for "can it start now" except the time limit.
#[derive(Clone, Copy, PartialEq, Eq)]
struct ShapeKey {
    partition: usize,
    nodes: u32,
    gpus_per_node: u32,
    cpus_per_node: u32,
    mem_per_node_mb: u64,
    gpu_type: u32,
    features: u64,
    exclusive: bool,
    multi_site: bool,
    spares: bool,
}

/// Hashed as four words rather than field by field: the pass looks up every pending job's shape, and the Fx hash
/// costs a multiply per word. Equal keys write equal words, as `Hash` requires.
impl std::hash::Hash for ShapeKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let flags = u64::from(self.exclusive) | u64::from(self.multi_site) << 1 | u64::from(self.spares) << 2;
        h.write_u64(u64::from(self.nodes) | u64::from(self.gpus_per_node) << 32);
        h.write_u64(u64::from(self.cpus_per_node) | u64::from(self.gpu_type) << 32);
        h.write_u64(self.mem_per_node_mb ^ self.features.rotate_left(29));
        h.write_u64(self.partition as u64 | flags << 61);
    }
}

impl ShapeKey {
    /// A few bits of the key, mixed cheaply: the slot of [`ShapeIndex`]'s cache.
    fn slot(&self) -> usize {
        let x = self.nodes
            ^ self.gpus_per_node.rotate_left(3)
            ^ self.cpus_per_node.rotate_left(6)
            ^ self.gpu_type.rotate_left(9)
            ^ (self.mem_per_node_mb ^ self.features) as u32
            ^ (self.partition as u32).rotate_left(12);
        x as usize % SHAPE_CACHE_SLOTS
    }
}

const SHAPE_CACHE_SLOTS: usize = 64;

/// Shape ids in first-seen order: a map, with a small direct-mapped cache in front of it. A queue has few shapes,
/// and finding a job's among them by one comparison instead of a hash lookup took a fifth of resolving 100k jobs.
#[derive(Default)]
struct ShapeIndex {
    map: FxMap<ShapeKey, u32>,
    cache: Vec<Option<(ShapeKey, u32)>>,
}

impl ShapeIndex {
    /// The key's id, and whether it is new (then it got the next id, `len` before the call).
    fn id(&mut self, key: ShapeKey) -> (u32, bool) {
        if self.cache.is_empty() {
            self.cache = vec![None; SHAPE_CACHE_SLOTS];
        }
        let slot = &mut self.cache[key.slot()];
        if let Some((k, id)) = slot
            && *k == key
        {
            return (*id, false);
        }
        let next = self.map.len() as u32;
        let id = *self.map.entry(key).or_insert(next);
        *slot = Some((key, id));
        (id, id == next)
    }
}

/// Min-heap of (lower bound of the earliest start, node). Its own small type rather than a `BinaryHeap`:
/// [`BoundsWalk`] reads its array in order, which needs the layout (the children of `i` at `2i + 1` and `2i + 2`,
/// none smaller than `i`) that `BinaryHeap` does not promise.
#[derive(Clone, Default)]
struct StartBounds {
    heap: Vec<(u64, u32)>,
}

impl StartBounds {
    fn from_vec(heap: Vec<(u64, u32)>) -> Self {
        let mut h = Self { heap };
        for i in (0..h.heap.len() / 2).rev() {
            h.sift_down(i);
        }
        h
    }

    fn as_slice(&self) -> &[(u64, u32)] {
        &self.heap
    }

    fn peek(&self) -> Option<(u64, u32)> {
        self.heap.first().copied()
    }

    fn pop(&mut self) -> Option<(u64, u32)> {
        let last = self.heap.pop()?;
        let Some(top) = self.heap.first_mut() else { return Some(last) };
        let min = std::mem::replace(top, last);
        self.sift_down(0);
        Some(min)
    }

    fn push(&mut self, x: (u64, u32)) {
        self.heap.push(x);
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent] <= self.heap[i] {
                break;
            }
            self.heap.swap(parent, i);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.heap.len() && self.heap[l] < self.heap[m] {
                m = l;
            }
            if r < self.heap.len() && self.heap[r] < self.heap[m] {
                m = r;
            }
            if m == i {
                return;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }
}

/// A shared [`StartBounds`] heap read in ascending order without copying or changing it, merged with the exact
/// earliest starts a search pushes: the same sequence of (key, node, exact) minima as popping a private copy that
/// holds both. The shared heap's array is itself a heap, so a small heap over its frontier (entries whose parent
/// was taken) always holds its smallest entry not yet taken; each node is in the shared heap once, so no two
/// entries tie and the frontier order is the full one.
struct BoundsWalk<'h> {
    shared: &'h [(u64, u32)],
    /// (key, node, exact, position in `shared`; unused for exact entries).
    heap: BinaryHeap<Reverse<(u64, u32, bool, usize)>>,
}

impl<'h> BoundsWalk<'h> {
    fn new(shared: &'h [(u64, u32)]) -> Self {
        let mut heap = BinaryHeap::new();
        if let Some(&(k, i)) = shared.first() {
            heap.push(Reverse((k, i, false, 0)));
        }
        Self { shared, heap }
    }

    fn peek(&self) -> Option<(u64, u32, bool)> {
        self.heap.peek().map(|&Reverse((k, i, exact, _))| (k, i, exact))
    }

    fn pop(&mut self) -> Option<(u64, u32, bool)> {
        let Reverse((k, i, exact, pos)) = self.heap.pop()?;
        if !exact {
            for c in [2 * pos + 1, 2 * pos + 2] {
                if let Some(&(ck, ci)) = self.shared.get(c) {
                    self.heap.push(Reverse((ck, ci, false, c)));
                }
            }
        }
        Some((k, i, exact))
    }

    fn push_exact(&mut self, e: u64, i: u32) {
        self.heap.push(Reverse((e, i, true, usize::MAX)));
    }
}

/// Sentinel for "no memoized shape".
const NO_SHAPE: u32 = u32::MAX;
/// Sentinel for "no such index" in [`JobPre`].
const NONE: u32 = u32::MAX;
const NO_PARTITION: u8 = u8::MAX;

/// What the QOS and job-array limits count: running jobs and their GPUs per (user, QOS) and per (account, QOS),
/// and running tasks per job array, each including the jobs this pass has started so far.
#[derive(Default)]
struct Usage {
    user: FxMap<(u32, u32), (u64, u64)>,
    account: FxMap<(u32, u32), (u64, u64)>,
    array: Vec<u32>,
}

impl Usage {
    /// Why the job may not start now because of a limit (before looking at resources), if it may not.
    fn limit_reason(&self, pj: &JobPre, qos: &[Qos]) -> Option<Reason> {
        if pj.array != NONE && self.array[pj.array as usize] >= pj.array_max {
            return Some(Reason::JobArrayTaskLimit);
        }
        if pj.q_limited == NONE {
            return None;
        }
        let q = &qos[pj.q_limited as usize];
        let over = |limit: Option<u32>, used: u64, more: u64| limit.is_some_and(|m| used + more > u64::from(m));
        let (jobs, gpus) = self.user.get(&(pj.user, pj.q_limited)).copied().unwrap_or_default();
        if over(q.max_jobs_per_user, jobs, 1) {
            return Some(Reason::QOSMaxJobsPerUserLimit);
        }
        if over(q.max_gpus_per_user, gpus, pj.total_gpus) {
            return Some(Reason::QOSMaxGRESPerUser);
        }
        let (jobs, gpus) = self.account.get(&(pj.account, pj.q_limited)).copied().unwrap_or_default();
        if over(q.max_jobs_per_account, jobs, 1) {
            return Some(Reason::QOSMaxJobsPerAccountLimit);
        }
        if over(q.max_gpus_per_account, gpus, pj.total_gpus) {
            return Some(Reason::QOSMaxGRESPerAccount);
        }
        None
    }

    /// Counts a job (running, or started by this pass) against its limits.
    fn add(&mut self, q_limited: u32, user: u32, account: u32, array: u32, gpus: u64) {
        if array != NONE {
            self.array[array as usize] += 1;
        }
        if q_limited != NONE {
            for (map, who) in [(&mut self.user, user), (&mut self.account, account)] {
                let e = map.entry((who, q_limited)).or_default();
                e.0 += 1;
                e.1 += gpus;
            }
        }
    }
}

/// What placement needs of a job, copied out of the `PendingJob` (for a memoized shape, out of the shape) so the
/// hot path does not touch the large, randomly ordered job structs.
#[derive(Clone, Copy)]
struct Req {
    nodes: u32,
    gpus_per_node: u32,
    cpus_per_node: u32,
    mem_per_node_mb: u64,
    time_limit_s: u64,
    exclusive: bool,
    allow_multi_site: bool,
    may_use_spares: bool,
}

impl Req {
    fn of(job: &PendingJob) -> Self {
        Self {
            nodes: job.nodes,
            gpus_per_node: job.gpus_per_node,
            cpus_per_node: job.cpus_per_node,
            mem_per_node_mb: job.mem_per_node_mb,
            time_limit_s: job.time_limit_s,
            exclusive: job.exclusive,
            allow_multi_site: job.allow_multi_site,
            may_use_spares: job.may_use_spares,
        }
    }
}

/// Per job shape: what the pass learned about it.
struct ShapeMemo {
    /// The shape's requirements; `time_limit_s` is the first job's and is replaced per job.
    req: Req,
    /// The shortest time limit with which this shape failed to start now (u64::MAX: none yet).
    failed_limit: u64,
    /// Whether the shape fits the partition's nodes at all (None) or why not, once computed.
    never: Option<Option<Reason>>,
}

/// The per-job facts the main loop needs, resolved once in view order and then gathered into priority order, so
/// the main loop reads them sequentially instead of chasing 100k random indices. Kept at 56 bytes: two copies of
/// it per job are most of a pass's scratch memory, and fresh memory costs page faults.
#[derive(Clone, Copy)]
struct JobPre {
    /// Index into `view.pending`.
    idx: u32,
    id: u64,
    time_limit_s: u64,
    total_gpus: u64,
    /// A reason that needs no pass state (held, dependency, partition, limits).
    early: Option<Reason>,
    /// Partition index (partitions are at most 64), or NO_PARTITION.
    p: u8,
    /// QOS index when that QOS has per-user or per-account limits, else NONE.
    q_limited: u32,
    /// Interned user and account when `q_limited` is set.
    user: u32,
    account: u32,
    /// Interned job array of a throttled task, else NONE; and its throttle.
    array: u32,
    array_max: u32,
    /// Index into the shape memo, or NO_SHAPE.
    shape: u32,
    /// Whether its QOS or partition may preempt anything: 0 no; otherwise its QOS index + 1, or `u16::MAX` when
    /// that does not fit (or the QOS is unknown) and the preemption check looks it up by name.
    preempt_q: u16,
}

const _: () = assert!(std::mem::size_of::<JobPre>() <= 56);

impl JobPre {
    /// The job's requirements: its memoized shape's, with its own time limit, or its own.
    fn req(&self, job: &PendingJob, shapes: &[ShapeMemo]) -> Req {
        match self.shape {
            NO_SHAPE => Req::of(job),
            s => Req { time_limit_s: self.time_limit_s, ..shapes[s as usize].req },
        }
    }
}

struct Resv {
    start_s: u64,
    end_s: u64,
    users: Vec<String>,
    accounts: Vec<String>,
}

/// A job's static node filter, resolved to indices.
struct Filter {
    part_bit: u64,
    features: u64,
    gpu_type: u32,
    /// Sorted node indices; empty: no `--nodelist`.
    nodelist: Vec<u32>,
    /// Sorted node indices.
    exclude: Vec<u32>,
}

impl Filter {
    /// Whether ordinary placement may use the node for the job.
    fn admits(&self, idx: u32, n: &NodeRt) -> bool {
        n.schedulable && self.matches(idx, n)
    }

    /// Whether the node is a usable hot spare for the job.
    fn admits_spare(&self, idx: u32, n: &NodeRt) -> bool {
        n.spare && self.matches(idx, n)
    }

    /// The job's static requirements only, whatever the node's state.
    fn matches(&self, idx: u32, n: &NodeRt) -> bool {
        n.part_mask & self.part_bit != 0
            && n.feature_mask & self.features == self.features
            && (self.gpu_type == 0 || n.gpu_type == self.gpu_type)
            && (self.nodelist.is_empty() || self.nodelist.binary_search(&idx).is_ok())
            && self.exclude.binary_search(&idx).is_err()
    }
}

pub struct Pass<'a> {
    view: &'a ClusterView,
    config: &'a SchedulerConfig,
    now_s: u64,
    nodes: Vec<NodeRt>,
    node_index: FxMap<&'a str, u32>,
    node_names: NodeNames,
    part_index: FxMap<&'a str, usize>,
    /// Per partition, per avail_now level: the nodes at that level, for best-fit scans in (level, node) order.
    part_free: Vec<Vec<NodeBits>>,
    /// Per partition: number of nodes at each avail_now level (0..=64), for O(1) "not enough anywhere".
    part_levels: Vec<[u32; MAX_GPUS_PER_NODE as usize + 1]>,
    part_nodes: Vec<Vec<u32>>,
    /// Per partition: its usable hot spares, in view order (kept out of the indexes above).
    part_spares: Vec<Vec<u32>>,
    /// Per partition: whether all its nodes are on one site (then a multi-node search needs no per-site split).
    part_one_site: Vec<bool>,
    feature_index: FxMap<&'a str, u32>,
    gpu_type_index: FxMap<&'a str, u32>,
    resv_index: FxMap<&'a str, usize>,
    resvs: Vec<Resv>,
    /// Per (partition, GPUs needed): a min-heap of (lower bound of the earliest start, node) for single-node
    /// reservations. Profiles only lose GPUs during a pass, so a key, once exact, stays a lower bound; stale keys
    /// are refreshed when they surface. Built on first use.
    start_bounds: FxMap<(usize, i32), StartBounds>,
    /// Preemption state; None when nothing may preempt (see [`preempt`]).
    preempt: Option<preempt::Preempt<'a>>,
}

/// What [`Pass::run`] resolves per job before placing any, in view order (see `Pass::resolve_jobs`).
struct Resolved<'a> {
    pre: Vec<JobPre>,
    /// The sort key's priority and submit time (the rest of it is in `pre`) and what the plan's breakdown is
    /// recomputed from once the order is known.
    prio: Vec<PrioRec>,
    ctx: PriorityContext,
    shapes: Vec<ShapeMemo>,
    shape_filters: Vec<Filter>,
    /// Whether any job was moved up by `scontrol top`.
    any_top: bool,
    /// The ranges of the sort keys before `scontrol top`, taken while resolving.
    bounds: OrderBounds,
    qos_index: FxMap<&'a str, usize>,
    /// Per QOS: whether it has limits (only those need usage counts).
    qos_limited: Vec<bool>,
    /// Users and accounts, interned for the QOS limits (running jobs' too); job arrays for their throttles.
    user_ids: FxMap<&'a str, u32>,
    account_ids: FxMap<&'a str, u32>,
    array_ids: FxMap<u64, u32>,
}

/// What ordering a job and its breakdown in the plan need besides its [`JobPre`], in view order. Half the size of a
/// [`PriorityBreakdown`]: storing the breakdowns in view order and gathering them into priority order cost more
/// (6 MiB written, then read back at random, at 100k jobs) than computing them again in priority order.
#[derive(Clone, Copy)]
struct PrioRec {
    /// Computed while resolving; replaced by `priority_order` after `scontrol top`.
    priority: u64,
    submit_s: u64,
    fairshare: f64,
    qos_priority: u32,
    nice: i32,
}

/// The main loop's state as it walks the jobs in priority order.
struct Walk<'a> {
    usage: Usage,
    plan: Plan,
    /// Preemptors that claimed their windows before the walk, and when they start.
    claimed: FxMap<JobId, u64>,
    preempt: Option<preempt::Preempt<'a>>,
    shapes: Vec<ShapeMemo>,
    shape_filters: Vec<Filter>,
    blocked_in_partition: Vec<bool>,
    any_blocked: bool,
    /// Jobs that reached the resource checks (Slurm's bf_max_job_test counts these).
    examined: usize,
    reservations_made: usize,
}

/// A reason a job waits that needs no pass state: held, not yet eligible, its dependencies, its partition.
fn early_reason(view: &ClusterView, job: &PendingJob, p: Option<usize>, now_s: u64) -> Option<Reason> {
    if job.held {
        return Some(Reason::JobHeldUser);
    }
    if job.begin_s > now_s {
        return Some(Reason::BeginTime);
    }
    match job.dependency {
        DependencyState::Satisfied => {}
        DependencyState::Waiting => return Some(Reason::Dependency),
        DependencyState::NeverSatisfied => return Some(Reason::DependencyNeverSatisfied),
    }
    let Some(p) = p else {
        return Some(Reason::ReqNodeNotAvail);
    };
    let part = &view.partitions[p];
    if part.state != PartitionState::Up {
        return Some(Reason::PartitionDown);
    }
    if part.max_time_s.is_some_and(|m| job.time_limit_s > m) {
        return Some(Reason::PartitionTimeLimit);
    }
    if job.nodes == 0 || job.time_limit_s == 0 {
        return Some(Reason::ReqNodeNotAvail);
    }
    None
}

/// The jobs in the order the pass visits them (partition tier, priority after `scontrol top`, submit time, id),
/// and each one's priority breakdown for the plan.
fn priority_order(
    view: &ClusterView,
    weights: &PriorityWeights,
    pre: Vec<JobPre>,
    mut prio: Vec<PrioRec>,
    ctx: &PriorityContext,
    any_top: bool,
    bounds: &OrderBounds,
) -> (Vec<JobPre>, Vec<(u64, PriorityBreakdown)>) {
    let tier_of = |p: u8| if p == NO_PARTITION { 0 } else { view.partitions[p as usize].priority_tier };
    let factors = |pj: &JobPre, r: &PrioRec| JobFactors {
        submit_s: r.submit_s,
        total_gpus: pj.total_gpus,
        time_limit_s: pj.time_limit_s,
        nice: r.nice,
    };
    if any_top {
        // `scontrol top` permutes priority values within users, after they are computed and before ordering.
        let mut topped: Vec<u64> = prio.iter().map(|r| r.priority).collect();
        apply_top(&view.pending, &mut topped);
        for (r, p) in prio.iter_mut().zip(topped) {
            r.priority = p;
        }
    }
    // The key reads `pre` only for what orders anything: the tier when tiers differ, the id when ids do not
    // ascend with the view index (when they do, the index orders the same). Tiers and ids are the same after
    // `scontrol top`, so the ranges taken before it tell.
    let single_tier = bounds.range.and_then(|(lo, hi)| (lo.tier == hi.tier).then_some(lo.tier));
    let ids_ascend = !bounds.descending_seen;
    let key = |i: usize| OrderKey {
        tier: single_tier.unwrap_or_else(|| tier_of(pre[i].p)),
        priority: prio[i].priority,
        // Only read from the big, strided jobs when someone was topped at all.
        top_rank: if any_top { view.pending[i].top_rank } else { 0 },
        submit_s: prio[i].submit_s,
        id: if ids_ascend { i as u64 } else { pre[i].id },
    };
    let order = if any_top {
        scheduling_order(view.pending.len(), key)
    } else {
        // Nobody topped: the ranges taken above are the key's.
        scheduling_order_within(view.pending.len(), key, bounds)
    };
    // Gathers into priority order, each in its own tight loop (which keeps many of its random loads in flight; a
    // loop that also computes the breakdown waits on nearly every load). Each big buffer is dropped as soon as it
    // is used, so the next one can reuse its memory.
    let sorted: Vec<JobPre> = order.iter().map(|&i| pre[i as usize]).collect();
    drop(pre);
    let prio: Vec<PrioRec> = order.iter().map(|&i| prio[i as usize]).collect();
    drop(order);
    // The breakdown is recomputed from the same inputs with the same arithmetic, so it is the one the sort key's
    // priority came from.
    let priorities = sorted
        .iter()
        .zip(&prio)
        .map(|(pj, r)| {
            let mut b = PriorityBreakdown::from_factors(
                &factors(pj, r),
                weights,
                ctx,
                r.fairshare,
                tier_of(pj.p),
                r.qos_priority,
            );
            // After `scontrol top`.
            b.priority = r.priority;
            (pj.id, b)
        })
        .collect();
    (sorted, priorities)
}

/// What running jobs already count against QOS limits and array throttles.
fn running_usage<'a>(
    view: &'a ClusterView,
    qos_index: &FxMap<&'a str, usize>,
    qos_limited: &[bool],
    user_ids: &mut FxMap<&'a str, u32>,
    account_ids: &mut FxMap<&'a str, u32>,
    array_ids: &FxMap<u64, u32>,
) -> Usage {
    let mut usage = Usage { array: vec![0; array_ids.len()], ..Usage::default() };
    for job in &view.running {
        let q = qos_index.get(job.qos.as_str()).copied().filter(|&q| qos_limited[q]);
        // Only arrays with a throttled task pending matter.
        let array = job.array_id.and_then(|a| array_ids.get(&a).copied()).unwrap_or(NONE);
        if q.is_none() && array == NONE {
            continue;
        }
        let (user, account) = match q {
            Some(_) => (intern(user_ids, job.user.as_str()), intern(account_ids, job.account.as_str())),
            None => (NONE, NONE),
        };
        let gpus = job.alloc.iter().map(|(_, g)| g.len() as u64).sum::<u64>();
        usage.add(q.map_or(NONE, |q| q as u32), user, account, array, gpus);
    }
    usage
}

/// String equality, inlined for the short names of accounts, partitions and QOS: resolving compares three per
/// job with the previous job's, and a call to `memcmp` each cost more than the comparison.
#[inline]
fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 16 {
        return a == b;
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// Asks the CPU to start loading `x` (every cache line of it) now. Loops over big arrays call it a few
/// elements ahead: resolving reads every pending job (5 cache lines each, 30 MB at 100k jobs) and waited on memory
/// for most of its time, which the hardware prefetcher did not hide. Elsewhere (and off x86-64) it does nothing.
#[inline]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = (x as *const T).cast::<i8>();
        let size = std::mem::size_of::<T>();
        for off in (0..size).step_by(64).chain(std::iter::once(size.saturating_sub(1))) {
            // SAFETY: a prefetch is only a hint; it never faults, and the address is inside a live reference.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(off)) };
        }
    }
}

/// Dense ids for names (or other keys) in first-seen order.
fn intern<K: std::hash::Hash + Eq>(ids: &mut FxMap<K, u32>, key: K) -> u32 {
    let next = ids.len() as u32;
    *ids.entry(key).or_insert(next)
}

/// What orders the queue: Slurm's partition tier (high first), then priority (high first), then the latest
/// `scontrol top` (so a topped job also wins a tie, e.g. against its owner's equally old jobs, whose priority values
/// it takes), then submit time and job id (old / low first). The view index breaks the remaining ties, so the order
/// is total and deterministic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OrderKey {
    tier: u32,
    priority: u64,
    top_rank: u64,
    submit_s: u64,
    id: u64,
}

fn order_cmp(a: &(OrderKey, u32), b: &(OrderKey, u32)) -> std::cmp::Ordering {
    let ((ka, ia), (kb, ib)) = (a, b);
    kb.tier
        .cmp(&ka.tier)
        .then(kb.priority.cmp(&ka.priority))
        .then(kb.top_rank.cmp(&ka.top_rank))
        .then(ka.submit_s.cmp(&kb.submit_s))
        .then(ka.id.cmp(&kb.id))
        .then(ia.cmp(ib))
}

/// View indices in scheduling order (see [`OrderKey`]).
///
/// Every field is stored relative to its minimum (or maximum, for the descending ones) in as few bits as its range
/// needs, and the sort is over plain integers, several times faster than the tuple comparator at 100k jobs. When
/// the ids ascend with the view index (a view lists pending jobs by id), the id adds nothing to the index that
/// breaks the last ties and is left out; a real queue's key then fits one u64, whose sort is about twice as fast
/// again as the u128 one. Keys that do not fit a u128 fall back to the comparator; all give the same order.
fn scheduling_order(n: usize, key: impl Fn(usize) -> OrderKey) -> Vec<u32> {
    let mut bounds = OrderBounds::default();
    for i in 0..n {
        bounds.add(&key(i));
    }
    scheduling_order_within(n, key, &bounds)
}

/// The ranges of the [`OrderKey`]s of jobs `0..n`, in view order.
#[derive(Default)]
struct OrderBounds {
    /// (min, max) of the keys so far; None before the first.
    range: Option<(OrderKey, OrderKey)>,
    /// Whether some id was not above the one before it. If not, the ids strictly ascend with the index, and "lower
    /// id first" and "lower index first" agree.
    descending_seen: bool,
    last_id: Option<u64>,
}

impl OrderBounds {
    /// Takes the next job's key (in view order).
    fn add(&mut self, k: &OrderKey) {
        self.descending_seen |= self.last_id.is_some_and(|p| p >= k.id);
        self.last_id = Some(k.id);
        let (lo, hi) = self.range.get_or_insert((*k, *k));
        (lo.tier, hi.tier) = (lo.tier.min(k.tier), hi.tier.max(k.tier));
        (lo.priority, hi.priority) = (lo.priority.min(k.priority), hi.priority.max(k.priority));
        (lo.top_rank, hi.top_rank) = (lo.top_rank.min(k.top_rank), hi.top_rank.max(k.top_rank));
        (lo.submit_s, hi.submit_s) = (lo.submit_s.min(k.submit_s), hi.submit_s.max(k.submit_s));
        (lo.id, hi.id) = (lo.id.min(k.id), hi.id.max(k.id));
    }
}

/// [`scheduling_order`] with the keys' ranges already known.
fn scheduling_order_within(n: usize, key: impl Fn(usize) -> OrderKey, bounds: &OrderBounds) -> Vec<u32> {
    let Some((lo, hi)) = bounds.range else { return Vec::new() };
    let ascending = !bounds.descending_seen;
    let (min_t, max_t, min_p, max_p, min_r, max_r) =
        (lo.tier, hi.tier, lo.priority, hi.priority, lo.top_rank, hi.top_rank);
    let (min_s, max_s, min_id, max_id) = (lo.submit_s, hi.submit_s, lo.id, hi.id);
    let bits = |range: u64| u64::BITS - range.leading_zeros();
    let bt = bits(u64::from(max_t - min_t));
    let bp = bits(max_p - min_p);
    let br = bits(max_r - min_r);
    let bs = bits(max_s - min_s);
    let bid = if ascending { 0 } else { bits(max_id - min_id) };
    let bi = bits(n as u64 - 1);
    let total = bt + bp + br + bs + bid + bi;
    let pack = |i: usize| {
        let k = key(i);
        let mut x = u128::from(max_t - k.tier);
        x = (x << bp) | u128::from(max_p - k.priority);
        x = (x << br) | u128::from(max_r - k.top_rank);
        x = (x << bs) | u128::from(k.submit_s - min_s);
        if bid > 0 {
            x = (x << bid) | u128::from(k.id - min_id);
        }
        (x << bi) | i as u128
    };
    let mask = (1u128 << bi) - 1;
    if total <= u64::BITS {
        let mut packed: Vec<u64> = (0..n).map(|i| pack(i) as u64).collect();
        if !radix_sort_above(&mut packed, bi, total) {
            sort_by_high_bits(&mut packed, bs + bid + bi);
        }
        packed.iter().map(|&x| (u128::from(x) & mask) as u32).collect()
    } else if total <= u128::BITS {
        let mut packed: Vec<u128> = (0..n).map(pack).collect();
        packed.sort_unstable();
        packed.iter().map(|&x| (x & mask) as u32).collect()
    } else {
        let mut v: Vec<(OrderKey, u32)> = (0..n).map(|i| (key(i), i as u32)).collect();
        v.sort_unstable_by(order_cmp);
        v.iter().map(|&(_, i)| i).collect()
    }
}

/// The nodes' names, copied into one buffer: every start copies its nodes' names into the plan, and reading them
/// from a few contiguous KiB rather than from each node's own allocation in the view saves a cache miss a start.
struct NodeNames {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<usize>,
}

impl NodeNames {
    fn with_capacity(nodes: usize) -> Self {
        Self { text: String::with_capacity(nodes * 8), ends: Vec::with_capacity(nodes) }
    }

    fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }

    fn get(&self, i: u32) -> &str {
        let i = i as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// Whether node `i` exists and is called `name`.
    fn is(&self, i: u32, name: &str) -> bool {
        (i as usize) < self.ends.len() && self.get(i) == name
    }
}

/// Sorts keys whose lowest `sorted_low` bits already ascend in the input order (the packed view index) and
/// whose other bits span at most `total`: a stable counting sort per digit above the index, least significant
/// first, so equal digits keep the index order and the result is the fully sorted one. Two passes of up to 16
/// bits cover a queue's priorities and submit times, about twice as fast as bucketing by priority and sorting
/// each bucket. False (keys untouched) when that needs more passes, or the input is too small to pay for the
/// tables.
fn radix_sort_above(keys: &mut Vec<u64>, sorted_low: u32, total: u32) -> bool {
    const MAX_DIGIT_BITS: u32 = 16;
    const MAX_PASSES: u32 = 2;
    let span = total.saturating_sub(sorted_low);
    let passes = span.div_ceil(MAX_DIGIT_BITS);
    if keys.len() < 4096 || passes > MAX_PASSES {
        return false;
    }
    if passes == 0 {
        // Only the index: already in order.
        return true;
    }
    let width = span.div_ceil(passes);
    let mask = (1u64 << width) - 1;
    let mut out = vec![0u64; keys.len()];
    let mut next = vec![0u32; 1 << width];
    for pass in 0..passes {
        let shift = sorted_low + pass * width;
        let digit = |k: u64| ((k >> shift) & mask) as usize;
        next.fill(0);
        for &k in keys.iter() {
            next[digit(k)] += 1;
        }
        let mut at = 0u32;
        for slot in next.iter_mut() {
            let count = *slot;
            *slot = at;
            at += count;
        }
        for &k in keys.iter() {
            let slot = &mut next[digit(k)];
            out[*slot as usize] = k;
            *slot += 1;
        }
        std::mem::swap(keys, &mut out);
    }
    true
}

/// Sorts keys whose bits from `low` up take few values (a queue's tiers and priorities): one counting pass into
/// a bucket per high value, then each (small) bucket sorted on its own, about twice as fast as sorting the whole
/// at 100k jobs. Integers have one sorted order, so the result is the same as `sort_unstable`'s.
fn sort_by_high_bits(keys: &mut [u64], low: u32) {
    const MAX_BUCKETS: u64 = 1 << 16;
    let high = |k: u64| if low >= u64::BITS { 0 } else { k >> low };
    let top = if keys.len() < 4096 { None } else { keys.iter().map(|&k| high(k)).max() };
    let Some(top) = top.filter(|&t| t < MAX_BUCKETS) else {
        keys.sort_unstable();
        return;
    };
    let mut start = vec![0usize; top as usize + 2];
    for &k in keys.iter() {
        start[high(k) as usize + 1] += 1;
    }
    for b in 1..start.len() {
        start[b] += start[b - 1];
    }
    let mut out = vec![0u64; keys.len()];
    let mut next = start.clone();
    for &k in keys.iter() {
        let b = high(k) as usize;
        out[next[b]] = k;
        next[b] += 1;
    }
    for w in start.windows(2) {
        out[w[0]..w[1]].sort_unstable();
    }
    keys.copy_from_slice(&out);
}

/// The nodes as a pass works on them, and the dense ids their names, features and GPU types got (the first stage
/// of [`Pass::new`]).
struct NodeTables<'a> {
    nodes: Vec<NodeRt>,
    node_index: FxMap<&'a str, u32>,
    node_names: NodeNames,
    feature_index: FxMap<&'a str, u32>,
    gpu_type_index: FxMap<&'a str, u32>,
}

impl<'a> NodeTables<'a> {
    /// Checks each node of the view and turns it into bit masks and ids, before any job is placed on it.
    fn build(view: &'a ClusterView, part_index: &FxMap<&'a str, usize>) -> Result<Self, ScheduleError> {
        let now_s = view.now_s;
        let mut feature_index: FxMap<&str, u32> = FxMap::default();
        let mut gpu_type_index: FxMap<&str, u32> = FxMap::default();
        let mut topo_index: FxMap<(&str, &str, &str), u32> = FxMap::default();
        let mut node_index = FxMap::with_capacity_and_hasher(view.nodes.len(), Default::default());
        let mut node_names = NodeNames::with_capacity(view.nodes.len());
        let mut nodes = Vec::with_capacity(view.nodes.len());
        let mut prev_topo: Option<(&Topology, (u32, u32, u32))> = None;
        let mut prev_parts: Option<(&[String], u64)> = None;
        let mut prev_features: Option<(&[String], u64)> = None;
        for (i, n) in view.nodes.iter().enumerate() {
            if node_index.insert(n.name.as_str(), i as u32).is_some() {
                return Err(ScheduleError::Duplicate { kind: "node", name: n.name.clone() });
            }
            node_names.push(&n.name);
            let free_mask = free_mask_of(n)?;
            // Like topology, partition and feature lists repeat from node to node; the masks are reused then.
            let part_mask = match prev_parts {
                Some((pp, m)) if pp == n.partitions.as_slice() => m,
                _ => {
                    let mut m = 0u64;
                    for p in &n.partitions {
                        // A node may list a partition the view does not define (being created); it is not used.
                        if let Some(&pi) = part_index.get(p.as_str()) {
                            m |= 1 << pi;
                        }
                    }
                    m
                }
            };
            prev_parts = Some((n.partitions.as_slice(), part_mask));
            let feature_mask = match prev_features {
                Some((pf, m)) if pf == n.features.as_slice() => m,
                _ => {
                    let mut m = 0u64;
                    for f in &n.features {
                        let next = feature_index.len() as u32;
                        let fi = *feature_index.entry(f.as_str()).or_insert(next);
                        if fi as usize >= MAX_DISTINCT_BITS {
                            return Err(ScheduleError::TooManyDistinct { kind: "features", max: MAX_DISTINCT_BITS });
                        }
                        m |= 1 << fi;
                    }
                    m
                }
            };
            prev_features = Some((n.features.as_slice(), feature_mask));
            let gpu_type = match &n.gpu_type {
                Some(t) => {
                    let next = gpu_type_index.len() as u32 + 1;
                    *gpu_type_index.entry(t.as_str()).or_insert(next)
                }
                None => 0,
            };
            let t = &n.topology;
            let mut intern = |key: (&'a str, &'a str, &'a str)| {
                let next = topo_index.len() as u32;
                *topo_index.entry(key).or_insert(next)
            };
            // Neighbouring nodes nearly always share a switch: reusing the previous node's ids skips three hash
            // lookups (same ids, as the previous node interned them).
            let (site, rack, switch) = match prev_topo {
                Some((pt, ids)) if pt == t => ids,
                _ => (
                    intern((t.site.as_str(), "", "")),
                    intern((t.site.as_str(), t.rack.as_str(), "")),
                    intern((t.site.as_str(), t.rack.as_str(), t.switch.as_str())),
                ),
            };
            prev_topo = Some((t, (site, rack, switch)));
            nodes.push(NodeRt {
                total: n.gpus_total,
                free_mask,
                cpus_free: n.cpus_free,
                mem_total: n.mem_total_mb,
                mem_free: n.mem_free_mb,
                part_mask,
                feature_mask,
                gpu_type,
                site,
                rack,
                switch,
                schedulable: n.schedulable && !n.spare,
                spare: n.schedulable && n.spare,
                general: Profile::new(now_s, free_mask.count_ones() as i32),
                resv: Vec::new(),
                avail_now: 0,
            });
        }
        Ok(NodeTables { nodes, node_index, node_names, feature_index, gpu_type_index })
    }
}

/// A node's free GPUs as a bit mask, refusing a node with more GPUs than a mask holds or a free GPU it lacks.
fn free_mask_of(n: &crate::model::Node) -> Result<u64, ScheduleError> {
    if n.gpus_total > MAX_GPUS_PER_NODE {
        return Err(ScheduleError::TooManyGpus { node: n.name.clone(), gpus: n.gpus_total, max: MAX_GPUS_PER_NODE });
    }
    let mut free_mask = 0u64;
    for &g in &n.free_gpus {
        if g >= n.gpus_total || free_mask & (1 << g) != 0 {
            return Err(ScheduleError::BadGpuIndex { node: n.name.clone(), index: g });
        }
        free_mask |= 1 << g;
    }
    Ok(free_mask)
}

/// When a running job gives its GPUs back, as the pass plans with them: at its expected end. One still running
/// past it is about to be killed: it gives them back "just after now", so nothing is planned onto GPUs it still
/// holds. One being preempted gives them back within KillWait; while preemption is on, only to preemptors (see
/// `preempt`).
struct Release {
    now_s: u64,
    kill_at: u64,
    preempting: bool,
    /// Preemptors still waiting in this view for their victims to end, sorted.
    waiting: Vec<JobId>,
}

impl Release {
    fn new(view: &ClusterView, config: &SchedulerConfig, preempting: bool) -> Release {
        let now_s = view.now_s;
        let kill_at = now_s.saturating_add(config.kill_wait_s.max(1));
        let waiting: Vec<JobId> = if preempting {
            let mut targets: Vec<JobId> = view.running.iter().filter_map(|r| r.preempted_for).collect();
            targets.sort_unstable();
            targets.dedup();
            let mut waiting: Vec<JobId> =
                view.pending.iter().map(|p| p.id).filter(|id| targets.binary_search(id).is_ok()).collect();
            waiting.sort_unstable();
            waiting
        } else {
            Vec::new()
        };
        Release { now_s, kill_at, preempting, waiting }
    }

    fn at(&self, job: &RunningJob) -> u64 {
        let (now_s, kill_at) = (self.now_s, self.kill_at);
        let end_s = job.expected_end_s();
        if job.preempting && !(self.preempting && preempt::Preempt::holds_back(job)) {
            end_s.min(kill_at).max(now_s + 1)
        } else if job.preempting && job.preempted_for.is_some_and(|f| self.waiting.binary_search(&f).is_ok()) {
            // Held back for its waiting preemptor even when its time limit runs out first: released to
            // everyone only after `kill_at`, or a job ahead of the preemptor could take the GPUs it was
            // killed for, and the preemptor would preempt again in the next pass.
            end_s.max(kill_at + 1)
        } else {
            end_s.max(now_s + 1)
        }
    }
}

/// Running jobs hold their GPUs on the profiles until they give them back; the preemption state learns who holds
/// what.
fn place_running<'a>(
    view: &'a ClusterView,
    part_index: &FxMap<&'a str, usize>,
    (node_index, node_names): (&FxMap<&'a str, u32>, &NodeNames),
    nodes: &mut [NodeRt],
    preempt: &mut Option<preempt::Preempt<'a>>,
    release: &Release,
) -> Result<(), ScheduleError> {
    let now_s = view.now_s;
    let preempting = preempt.is_some();
    // Running jobs are often listed in node order: the node after the last one found is tried first (names are
    // unique, so an equal name is that node), a compare in the compact name buffer instead of a hash lookup
    // that compares against the name in the view.
    let mut guess = 0u32;
    for job in &view.running {
        let end_s = release.at(job);
        let mut held = Vec::new();
        for (name, gpus) in &job.alloc {
            let ni = if node_names.is(guess, name) {
                guess
            } else {
                let Some(&ni) = node_index.get(name.as_str()) else {
                    return Err(ScheduleError::Unknown { kind: "node of a running job", name: name.clone() });
                };
                ni
            };
            guess = ni + 1;
            let node = &mut nodes[ni as usize];
            for &g in gpus {
                if g >= node.total || node.free_mask & (1 << g) != 0 {
                    return Err(ScheduleError::BadGpuIndex { node: name.clone(), index: g });
                }
            }
            node.general.add(end_s, u64::MAX, gpus.len() as i32);
            let mut taken = gpus.len() as i32;
            if job.exclusive {
                // It owns the node's other GPUs too until it ends.
                let rest = node.free_mask.count_ones() as i32;
                node.free_mask = 0;
                node.general.add(now_s, end_s, -rest);
                taken += rest;
            }
            if preempting && taken > 0 {
                held.push((ni, taken));
            }
        }
        if let Some(pre) = preempt.as_mut() {
            pre.add_running(job, part_index, end_s, held);
        }
    }
    if let Some(pre) = preempt.as_mut() {
        pre.seal(view);
    }
    Ok(())
}

/// Advance reservations: their GPUs leave the general profile for their window and become a separate capacity
/// that only their own jobs draw from; a running job inside one holds the reservation's GPUs, not the general
/// ones.
fn carve_reservations<'a>(
    view: &'a ClusterView,
    node_index: &FxMap<&'a str, u32>,
    nodes: &mut [NodeRt],
    release: &Release,
) -> Result<(FxMap<&'a str, usize>, Vec<Resv>), ScheduleError> {
    let now_s = view.now_s;
    let mut resv_index = FxMap::default();
    let mut resvs = Vec::with_capacity(view.reservations.len());
    for (ri, r) in view.reservations.iter().enumerate() {
        if resv_index.insert(r.name.as_str(), ri).is_some() {
            return Err(ScheduleError::Duplicate { kind: "reservation", name: r.name.clone() });
        }
        let (start_s, end_s) = (r.start_s, r.end_s());
        resvs.push(Resv { start_s, end_s, users: r.users.clone(), accounts: r.accounts.clone() });
        if end_s <= now_s {
            continue;
        }
        let grant = |node: &mut NodeRt, gpus: u32| {
            node.general.add(start_s, end_s, -(gpus as i32));
            let mut p = Profile::new(now_s, 0);
            p.add(start_s, end_s, gpus as i32);
            node.resv.push((ri, p));
        };
        if !r.nodes.is_empty() {
            for name in &r.nodes {
                let Some(&ni) = node_index.get(name.as_str()) else {
                    return Err(ScheduleError::Unknown { kind: "node of a reservation", name: name.clone() });
                };
                let node = &mut nodes[ni as usize];
                let total = node.total;
                grant(node, total);
            }
        } else if let Some(count) = r.gpu_count {
            // A GPU-count reservation is pinned to the first schedulable nodes in view order, whole nodes first
            // used up: deterministic, and it keeps the reserved GPUs together.
            let mut left = count;
            for node in nodes.iter_mut().filter(|n| n.schedulable) {
                if left == 0 {
                    break;
                }
                let take = left.min(node.total);
                grant(node, take);
                left -= take;
            }
        }
    }
    for job in &view.running {
        let Some(rname) = &job.reservation else { continue };
        let Some(&ri) = resv_index.get(rname.as_str()) else { continue };
        let (rs, re) = (resvs[ri].start_s, resvs[ri].end_s);
        let end_s = release.at(job);
        for (name, gpus) in &job.alloc {
            let Some(&ni) = node_index.get(name.as_str()) else { continue };
            let node = &mut nodes[ni as usize];
            let g = gpus.len() as i32;
            // Its GPUs were counted both as busy and as reserved; they are the reservation's.
            node.general.add(rs.max(now_s), re.min(end_s), g);
            if let Some((_, p)) = node.resv.iter_mut().find(|(r, _)| *r == ri) {
                p.add(now_s, end_s, -g);
            }
        }
    }
    Ok((resv_index, resvs))
}

/// Per partition, the indexes a placement searches: nodes by GPUs free now, level counts, its nodes and spares,
/// and whether it lies on one site.
struct PartitionIndexes {
    part_free: Vec<Vec<NodeBits>>,
    part_levels: Vec<[u32; MAX_GPUS_PER_NODE as usize + 1]>,
    part_nodes: Vec<Vec<u32>>,
    part_spares: Vec<Vec<u32>>,
    part_one_site: Vec<bool>,
}

impl PartitionIndexes {
    /// Also settles each node's GPUs free now, once running jobs and reservations are on its profile.
    fn build(view: &ClusterView, nodes: &mut [NodeRt]) -> PartitionIndexes {
        let now_s = view.now_s;
        let max_level = nodes.iter().map(|n| n.total).max().unwrap_or(0) as usize;
        let mut part_free = vec![vec![NodeBits::new(nodes.len()); max_level + 1]; view.partitions.len()];
        let mut part_levels = vec![[0u32; MAX_GPUS_PER_NODE as usize + 1]; view.partitions.len()];
        let mut part_nodes = vec![Vec::new(); view.partitions.len()];
        let mut part_spares = vec![Vec::new(); view.partitions.len()];
        for (i, node) in nodes.iter_mut().enumerate() {
            node.avail_now = node.general.value_at(now_s).max(0) as u32;
            if node.spare {
                for (p, spares) in part_spares.iter_mut().enumerate() {
                    if node.part_mask & (1 << p) != 0 {
                        spares.push(i as u32);
                    }
                }
            }
            if !node.schedulable {
                continue;
            }
            for (p, levels) in part_free.iter_mut().enumerate() {
                if node.part_mask & (1 << p) != 0 {
                    levels[node.avail_now as usize].insert(i as u32);
                    part_levels[p][node.avail_now as usize] += 1;
                    part_nodes[p].push(i as u32);
                }
            }
        }
        let part_one_site = part_nodes
            .iter()
            .map(|ns| ns.first().is_none_or(|&f| ns.iter().all(|&i| nodes[i as usize].site == nodes[f as usize].site)))
            .collect();
        PartitionIndexes { part_free, part_levels, part_nodes, part_spares, part_one_site }
    }
}

impl<'a> Pass<'a> {
    pub fn new(view: &'a ClusterView, config: &'a SchedulerConfig) -> Result<Self, ScheduleError> {
        let now_s = view.now_s;
        let mut part_index = FxMap::default();
        for (i, p) in view.partitions.iter().enumerate() {
            if part_index.insert(p.name.as_str(), i).is_some() {
                return Err(ScheduleError::Duplicate { kind: "partition", name: p.name.clone() });
            }
        }
        if part_index.len() > MAX_DISTINCT_BITS {
            return Err(ScheduleError::TooManyDistinct { kind: "partitions", max: MAX_DISTINCT_BITS });
        }
        let NodeTables { mut nodes, node_index, node_names, feature_index, gpu_type_index } =
            NodeTables::build(view, &part_index)?;
        let mut preempt = preempt::Preempt::new(view, config, &part_index, nodes.len());
        let release = Release::new(view, config, preempt.is_some());
        place_running(view, &part_index, (&node_index, &node_names), &mut nodes, &mut preempt, &release)?;
        let (resv_index, resvs) = carve_reservations(view, &node_index, &mut nodes, &release)?;
        let PartitionIndexes { part_free, part_levels, part_nodes, part_spares, part_one_site } =
            PartitionIndexes::build(view, &mut nodes);
        Ok(Self {
            view,
            config,
            now_s,
            part_one_site,
            nodes,
            node_index,
            node_names,
            part_index,
            part_free,
            part_levels,
            part_nodes,
            part_spares,
            feature_index,
            gpu_type_index,
            resv_index,
            resvs,
            start_bounds: FxMap::default(),
            preempt,
        })
    }

    /// Runs the pass and returns the plan.
    pub fn run(mut self) -> Result<Plan, ScheduleError> {
        let view = self.view;
        let resolved = self.resolve_jobs()?;
        let Resolved { pre, prio, ctx, shapes, shape_filters, any_top, bounds, qos_index, qos_limited, .. } = resolved;
        let (mut user_ids, mut account_ids, array_ids) = (resolved.user_ids, resolved.account_ids, resolved.array_ids);
        let (pre, priorities) = priority_order(view, &self.config.weights, pre, prio, &ctx, any_top, &bounds);
        let usage = running_usage(view, &qos_index, &qos_limited, &mut user_ids, &mut account_ids, &array_ids);
        let plan = Plan {
            starts: Vec::new(),
            reasons: Vec::with_capacity(view.pending.len()),
            expected_start: Vec::new(),
            priorities,
            preemptions: Vec::new(),
        };
        let mut walk = Walk {
            usage,
            plan,
            claimed: FxMap::default(),
            preempt: self.preempt.take(),
            shapes,
            shape_filters,
            blocked_in_partition: vec![false; view.partitions.len()],
            any_blocked: false,
            examined: 0,
            reservations_made: 0,
        };
        self.claim_windows(&pre, &mut walk);
        for pj in &pre {
            if let Some(reason) = self.place(pj, &mut walk) {
                walk.plan.reasons.push((pj.id, reason));
            }
        }
        Ok(walk.plan)
    }

    /// Everything per job that does not depend on what the pass has done so far, resolved in view order (the
    /// main loop goes in priority order and would otherwise chase every job's strings at random): what the priority
    /// factors need, a reason that needs no pass state, QOS and array interning, and the memoized shape.
    fn resolve_jobs(&self) -> Result<Resolved<'a>, ScheduleError> {
        let view = self.view;
        let now_s = self.now_s;
        let weights = &self.config.weights;
        let tree = FairShareTree::new(&view.accounts)?;
        let qos_index: FxMap<&str, usize> = view.qos.iter().enumerate().map(|(i, q)| (q.name.as_str(), i)).collect();
        let ctx = PriorityContext {
            now_s,
            total_gpus: self.nodes.iter().map(|n| u64::from(n.total)).sum(),
            max_partition_tier: view.partitions.iter().map(|p| p.priority_tier).max().unwrap_or(0),
            max_qos_priority: view.qos.iter().map(|q| q.priority).max().unwrap_or(0),
        };
        // Fair-share factors once per account, not per job.
        let mut fs_cache: FxMap<&str, f64> = FxMap::default();
        // In front of it, the last account seen in each of a few slots (by length and first byte): one string
        // compare instead of hashing the name and probing, per job.
        let mut fs_recent: [Option<(&str, f64)>; 16] = [None; 16];
        let mut r = Resolved {
            pre: Vec::with_capacity(view.pending.len()),
            prio: Vec::with_capacity(view.pending.len()),
            ctx,
            shapes: Vec::new(),
            shape_filters: Vec::new(),
            any_top: false,
            bounds: OrderBounds::default(),
            // Only a QOS with a limit needs usage counts.
            qos_limited: view.qos.iter().map(Qos::has_limits).collect(),
            qos_index,
            user_ids: FxMap::default(),
            account_ids: FxMap::default(),
            array_ids: FxMap::default(),
        };
        let mut shape_index = ShapeIndex::default();
        // Consecutive jobs mostly share partition and QOS: comparing with the previous job's names is cheaper than
        // hashing them again.
        let mut prev_part: Option<(&str, Option<usize>)> = None;
        let mut prev_qos: Option<(&str, Option<usize>)> = None;
        for (i, job) in view.pending.iter().enumerate() {
            // Four jobs ahead measured best (eight was slower).
            if let Some(ahead) = view.pending.get(i + 4) {
                prefetch(ahead);
            }
            let account = job.account.as_str();
            let slot = &mut fs_recent[(account.len() + usize::from(account.bytes().next().unwrap_or(0))) % 16];
            let fs = match *slot {
                Some((name, fs)) if same_str(name, account) => fs,
                _ => {
                    let fs = *fs_cache.entry(account).or_insert_with(|| tree.factor(account));
                    *slot = Some((account, fs));
                    fs
                }
            };
            let p = match prev_part {
                Some((name, p)) if same_str(name, job.partition.as_str()) => p,
                _ => self.part_index.get(job.partition.as_str()).copied(),
            };
            prev_part = Some((job.partition.as_str(), p));
            let q = match prev_qos {
                Some((name, q)) if same_str(name, job.qos.as_str()) => q,
                _ => r.qos_index.get(job.qos.as_str()).copied(),
            };
            prev_qos = Some((job.qos.as_str(), q));
            let qos_prio = q.map_or(0, |q| view.qos[q].priority);
            let tier = p.map_or(0, |p| view.partitions[p].priority_tier);
            let factors = JobFactors {
                submit_s: job.submit_s,
                total_gpus: job.total_gpus(),
                time_limit_s: job.time_limit_s,
                nice: job.nice,
            };
            // The priority and the sort key's ranges are taken here, while the job is in cache: a loop of their
            // own over the resolved records re-read 10 MB and cost more than the divisions it overlapped.
            let priority = PriorityBreakdown::from_factors(&factors, weights, &r.ctx, fs, tier, qos_prio).priority;
            r.bounds.add(&OrderKey { tier, priority, top_rank: 0, submit_s: job.submit_s, id: job.id });
            r.prio.push(PrioRec {
                priority,
                submit_s: job.submit_s,
                fairshare: fs,
                qos_priority: qos_prio,
                nice: job.nice,
            });
            let early = early_reason(view, job, p, now_s);
            let q_limited = q.filter(|&q| r.qos_limited[q]);
            let preempt_q = match (&self.preempt, p) {
                (Some(pre), Some(p)) if pre.may_preempt_some(q, p) => match q {
                    Some(q) if q + 1 < usize::from(u16::MAX) => q as u16 + 1,
                    _ => u16::MAX,
                },
                _ => 0,
            };
            r.any_top |= job.top_rank != 0;
            let (array, array_max) = match job.array {
                Some(a) => (intern(&mut r.array_ids, a.array_id), a.max_running),
                None => (NONE, u32::MAX),
            };
            let shape = match (early, p) {
                (None, Some(p)) => self.shape_of(job, p, &mut shape_index, &mut r),
                _ => NO_SHAPE,
            };
            r.pre.push(JobPre {
                idx: i as u32,
                id: job.id,
                time_limit_s: job.time_limit_s,
                total_gpus: job.total_gpus(),
                early,
                p: p.map_or(NO_PARTITION, |p| p as u8),
                q_limited: q_limited.map_or(NONE, |q| q as u32),
                user: if q_limited.is_some() { intern(&mut r.user_ids, job.user.as_str()) } else { NONE },
                account: if q_limited.is_some() { intern(&mut r.account_ids, job.account.as_str()) } else { NONE },
                array,
                array_max,
                shape,
                preempt_q,
            });
        }
        Ok(r)
    }

    /// The memoized shape of a job that could be placed (no node list, exclusions or advance reservation), made
    /// on first sight; else NO_SHAPE.
    fn shape_of(&self, job: &PendingJob, p: usize, shape_index: &mut ShapeIndex, r: &mut Resolved<'a>) -> u32 {
        if job.reservation.is_some() {
            return NO_SHAPE;
        }
        // Without node filters (nearly every job) the key needs no `Filter`, and one is only made for a new shape:
        // moving it around for every job was a visible part of resolving.
        let plain =
            job.constraint.is_empty() && job.gpu_type.is_none() && job.nodelist.is_empty() && job.exclude.is_empty();
        let (filter, gpu_type, features) = if plain {
            (None, 0, 0)
        } else {
            let Some(filter) = self.filter(job, p) else { return NO_SHAPE };
            if !filter.nodelist.is_empty() || !filter.exclude.is_empty() {
                return NO_SHAPE;
            }
            let (gpu_type, features) = (filter.gpu_type, filter.features);
            (Some(filter), gpu_type, features)
        };
        let key = ShapeKey {
            partition: p,
            nodes: job.nodes,
            gpus_per_node: job.gpus_per_node,
            cpus_per_node: job.cpus_per_node,
            mem_per_node_mb: job.mem_per_node_mb,
            gpu_type,
            features,
            exclusive: job.exclusive,
            multi_site: job.allow_multi_site,
            spares: job.may_use_spares,
        };
        let (shape, new) = shape_index.id(key);
        if new {
            r.shapes.push(ShapeMemo { req: Req::of(job), failed_limit: u64::MAX, never: None });
            r.shape_filters.push(filter.or_else(|| self.filter(job, p)).expect("a plain filter always resolves"));
        }
        shape
    }

    /// Preemptors whose victims are already ending for them take their windows before anyone else is placed
    /// (see `Pass::claim`); in their turn they only report it.
    fn claim_windows(&mut self, pre: &[JobPre], walk: &mut Walk<'a>) {
        let view = self.view;
        let Some(pre_state) = walk.preempt.as_mut() else { return };
        if !pre_state.any_waiting() {
            return;
        }
        for pj in pre {
            if pj.early.is_some() || pj.preempt_q == 0 || !pre_state.waits_for_victims(pj.id) {
                continue;
            }
            if walk.usage.limit_reason(pj, &view.qos).is_some() {
                continue;
            }
            let job = &view.pending[pj.idx as usize];
            if job.reservation.is_some() {
                continue;
            }
            let p = pj.p as usize;
            let shape = (pj.shape != NO_SHAPE).then_some(pj.shape as usize);
            let req = pj.req(job, &walk.shapes);
            let own_filter;
            let filter = match shape {
                Some(s) => &walk.shape_filters[s],
                None => {
                    let Some(f) = self.filter(job, p) else { continue };
                    own_filter = f;
                    &own_filter
                }
            };
            if let Some(t) = self.claim(pre_state, (job, pj.id, pj.preempt_q), &req, filter, p) {
                walk.claimed.insert(pj.id, t);
            }
        }
    }

    /// Whether a job's turn reaches the resource checks, or the reason it waits without them: an early reason, a
    /// window its preemptor already claimed, strict priority order, the backfill depth, a QOS limit.
    fn admit(&self, pj: &JobPre, walk: &mut Walk<'a>) -> Result<(), Reason> {
        let config = self.config;
        if let Some(r) = pj.early {
            return Err(r);
        }
        let p = pj.p as usize;
        // (Nearly always empty: then no hash per job.)
        if !walk.claimed.is_empty()
            && let Some(&t) = walk.claimed.get(&pj.id)
        {
            // Slurm shows a job waiting for its preempted jobs to end as waiting for resources.
            walk.plan.expected_start.push((pj.id, t));
            walk.any_blocked = true;
            walk.blocked_in_partition[p] = true;
            return Err(Reason::Resources);
        }
        if !config.backfill && walk.any_blocked {
            // Strict priority order: nothing passes a blocked job.
            return Err(Reason::Priority);
        }
        if config.max_backfill_jobs.is_some_and(|m| walk.examined >= m) {
            return Err(Reason::Priority);
        }
        // Counts only jobs that reach the resource checks, like Slurm's bf_max_job_test.
        walk.examined = walk.examined.saturating_add(1);
        // Over a limit: it waits without a reservation (it could not use one).
        match walk.usage.limit_reason(pj, &self.view.qos) {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }

    /// One job's turn in priority order: it starts now (None: its start is in the plan), or gets the reason it
    /// waits, with a reservation of its earliest start when backfill makes one.
    fn place(&mut self, pj: &JobPre, walk: &mut Walk<'a>) -> Option<Reason> {
        let view = self.view;
        let config = self.config;
        let now_s = self.now_s;
        if let Err(r) = self.admit(pj, walk) {
            return Some(r);
        }
        let p = pj.p as usize;
        let job = &view.pending[pj.idx as usize];
        // A memoized shape has no node list or exclusions and no advance reservation.
        let shape = (pj.shape != NO_SHAPE).then_some(pj.shape as usize);
        let req = pj.req(job, &walk.shapes);
        let own_filter;
        let filter = match shape {
            Some(s) => &walk.shape_filters[s],
            None => {
                let Some(f) = self.filter(job, p) else {
                    return Some(Reason::ReqNodeNotAvail);
                };
                own_filter = f;
                &own_filter
            }
        };

        if shape.is_none()
            && let Some(rname) = &job.reservation
        {
            let Some(&ri) = self.resv_index.get(rname.as_str()) else {
                return Some(Reason::Reservation);
            };
            let r = &self.resvs[ri];
            let allowed = (r.users.is_empty() && r.accounts.is_empty())
                || r.users.iter().any(|u| *u == job.user)
                || r.accounts.iter().any(|a| *a == job.account);
            if !allowed || now_s < r.start_s || now_s >= r.end_s {
                return Some(Reason::Reservation);
            }
            return match self.try_start_in_reservation(&req, filter, ri) {
                Some(alloc) => {
                    walk.usage.add(pj.q_limited, pj.user, pj.account, pj.array, pj.total_gpus);
                    walk.plan.starts.push((pj.id, alloc));
                    None
                }
                None => {
                    walk.any_blocked = true;
                    Some(Reason::Reservation)
                }
            };
        }

        // Resources only shrink within a pass: a shape that failed with a time limit fails with any longer one.
        let known_fail = shape.is_some_and(|s| walk.shapes[s].failed_limit <= pj.time_limit_s);
        if !known_fail {
            let now = self.try_start_now(&req, filter, p);
            // A job restarting after a node failure takes hot spares rather than wait for normal nodes.
            let now = match now {
                None if req.may_use_spares => self.try_start_with_spares(&req, filter, p),
                now => now,
            };
            if let Some(alloc) = now {
                walk.usage.add(pj.q_limited, pj.user, pj.account, pj.array, pj.total_gpus);
                walk.plan.starts.push((pj.id, alloc));
                return None;
            }
            if let Some(s) = shape {
                walk.shapes[s].failed_limit = walk.shapes[s].failed_limit.min(pj.time_limit_s);
            }
        }
        walk.any_blocked = true;
        let never = match shape {
            Some(s) => match walk.shapes[s].never {
                Some(c) => c,
                None => {
                    let c = self.never_reason(&req, filter, p);
                    walk.shapes[s].never = Some(c);
                    c
                }
            },
            None => self.never_reason(&req, filter, p),
        };
        if let Some(r) = never {
            return Some(r);
        }
        let first = !walk.blocked_in_partition[p];
        walk.blocked_in_partition[p] = true;
        // Its earliest start on the profiles, when the preemption check already computed it.
        let mut earliest = None;
        if pj.preempt_q != 0
            && let Some(pre) = walk.preempt.as_mut()
        {
            match self.try_preempt(pre, (job, pj.id, pj.preempt_q), &req, filter, p, shape) {
                preempt::Outcome::Reserved { t, victims } => {
                    walk.plan.expected_start.push((pj.id, t));
                    walk.plan
                        .preemptions
                        .extend(victims.into_iter().map(|victim| Preemption { victim, for_job: pj.id }));
                    // Slurm shows a job waiting for its preempted jobs to end as waiting for resources.
                    return Some(Reason::Resources);
                }
                preempt::Outcome::Normal(e) => earliest = e,
            }
        }
        if config.backfill && walk.reservations_made < config.max_reservations {
            walk.reservations_made += 1;
            if let Some((t, chosen)) = earliest.unwrap_or_else(|| self.find_earliest(&req, filter, p)) {
                self.take_window(&req, &chosen, t);
                walk.plan.expected_start.push((pj.id, t));
            }
        }
        Some(if first { Reason::Resources } else { Reason::Priority })
    }

    /// Resolves the job's static node filter; None when it names an unknown node, feature or GPU type (then no
    /// node can ever match).
    fn filter(&self, job: &PendingJob, p: usize) -> Option<Filter> {
        let part_bit = 1 << p;
        if job.constraint.is_empty() && job.gpu_type.is_none() && job.nodelist.is_empty() && job.exclude.is_empty() {
            // The common case, without the lookups and sorts below.
            return Some(Filter { part_bit, features: 0, gpu_type: 0, nodelist: Vec::new(), exclude: Vec::new() });
        }
        let mut features = 0u64;
        for f in &job.constraint {
            features |= 1 << *self.feature_index.get(f.as_str())?;
        }
        let gpu_type = match &job.gpu_type {
            Some(t) => *self.gpu_type_index.get(t.as_str())?,
            None => 0,
        };
        let resolve = |names: &[String]| -> Option<Vec<u32>> {
            let mut v: Vec<u32> =
                names.iter().map(|n| self.node_index.get(n.as_str()).copied()).collect::<Option<_>>()?;
            v.sort_unstable();
            Some(v)
        };
        let nodelist = resolve(&job.nodelist)?;
        // Unknown excluded nodes are harmless: they are excluded anyway.
        let mut exclude: Vec<u32> =
            job.exclude.iter().filter_map(|n| self.node_index.get(n.as_str()).copied()).collect();
        exclude.sort_unstable();
        Some(Filter { part_bit, features, gpu_type, nodelist, exclude })
    }

    /// GPUs the job needs on this node.
    fn need_on(job: &Req, node: &NodeRt) -> u32 {
        if job.exclusive { node.total.max(job.gpus_per_node) } else { job.gpus_per_node }
    }

    fn candidate(&self, idx: u32, free: i32) -> Candidate {
        let n = &self.nodes[idx as usize];
        Candidate { node: idx, site: n.site, rack: n.rack, switch: n.switch, free }
    }

    /// Whether all of `nodes` sit on one site.
    fn one_site(&self, nodes: &[u32]) -> bool {
        let mut sites = nodes.iter().map(|&i| self.nodes[i as usize].site);
        let first = sites.next();
        sites.all(|s| Some(s) == first)
    }

    /// None when the job could start on its partition's usable nodes once they are free; otherwise why it cannot:
    /// [`Reason::MultiSiteRequired`] or [`Reason::SiteNodesNotAvail`] when it would fit only across sites without
    /// `--multi-site`, else [`Reason::ReqNodeNotAvail`].
    fn never_reason(&self, job: &Req, filter: &Filter, p: usize) -> Option<Reason> {
        if self.could_ever_fit(job, filter, p) {
            return None;
        }
        if job.nodes > 1
            && !job.allow_multi_site
            && self.could_ever_fit(&Req { allow_multi_site: true, ..*job }, filter, p)
        {
            // Whether any one site has enough nodes at all, counting down, drained and spare ones.
            let mut per_site: FxMap<u32, u32> = FxMap::default();
            for (i, n) in self.nodes.iter().enumerate() {
                if filter.matches(i as u32, n) && n.total >= Self::need_on(job, n) {
                    *per_site.entry(n.site).or_default() += 1;
                }
            }
            let largest = per_site.values().copied().max().unwrap_or(0);
            return Some(if largest < job.nodes { Reason::MultiSiteRequired } else { Reason::SiteNodesNotAvail });
        }
        Some(Reason::ReqNodeNotAvail)
    }

    fn could_ever_fit(&self, job: &Req, filter: &Filter, p: usize) -> bool {
        let fits = |i: u32| {
            let n = &self.nodes[i as usize];
            (filter.admits(i, n) || (job.may_use_spares && filter.admits_spare(i, n)))
                && n.total >= Self::need_on(job, n)
        };
        let spares: &[u32] = if job.may_use_spares { &self.part_spares[p] } else { &[] };
        let mut usable = self.part_nodes[p].iter().chain(spares);
        if job.nodes == 1 {
            // One node: any node that fits will do, no placement needed.
            return usable.any(|&i| fits(i));
        }
        // `choose_nodes` places the job iff some switch, rack or site holds enough of the nodes, or any nodes do
        // when it may span sites; switches and racks lie within one site, so counting per site says the same, and
        // can stop at the first site (or node total) that reaches the job's size instead of collecting them all.
        let want = job.nodes;
        let mut per_site: FxMap<u32, u32> = FxMap::default();
        let mut total = 0u32;
        for &i in usable {
            if !fits(i) {
                continue;
            }
            total += 1;
            let on_site = per_site.entry(self.nodes[i as usize].site).or_default();
            *on_site += 1;
            if *on_site >= want || (job.allow_multi_site && total >= want) {
                return true;
            }
        }
        false
    }

    fn try_start_now(&mut self, job: &Req, filter: &Filter, p: usize) -> Option<Vec<NodeAlloc>> {
        let n_nodes = job.nodes as usize;
        let g = job.gpus_per_node;
        let min_level = if job.exclusive { g.max(1) } else { g };
        if min_level > MAX_GPUS_PER_NODE {
            return None;
        }
        let enough: u32 = self.part_levels[p][min_level as usize..].iter().sum();
        if (enough as usize) < n_nodes {
            return None;
        }
        let end_s = self.now_s.saturating_add(job.time_limit_s);
        let mut cands = Vec::new();
        let levels = &self.part_free[p];
        let by_level = (min_level as usize..levels.len()).flat_map(|l| levels[l].iter().map(move |i| (l as u32, i)));
        let mut single = None;
        for (avail, idx) in by_level {
            let n = &self.nodes[idx as usize];
            if avail < Self::need_on(job, n) || !filter.admits(idx, n) || !self.free_now(job, n, end_s) {
                continue;
            }
            if n_nodes == 1 {
                // The set is ordered by (free GPUs, node): the first that fits is the best fit, the one
                // `choose_nodes` would pick (taken without a candidate list and a result to allocate).
                single = Some(idx);
                break;
            }
            cands.push(self.candidate(idx, avail as i32));
        }
        if let Some(idx) = single {
            return Some(self.commit_now(job, &[idx], None));
        }
        let chosen = choose_nodes(&cands, n_nodes, job.allow_multi_site)?;
        Some(self.commit_now(job, &chosen, None))
    }

    /// Whether the node has what the job needs free from now until `end_s` (its static filter checked apart).
    fn free_now(&self, job: &Req, n: &NodeRt, end_s: u64) -> bool {
        let need = Self::need_on(job, n);
        n.free_mask.count_ones() >= need
            && n.cpus_free >= job.cpus_per_node
            && n.mem_free >= mem_needed(job.mem_per_node_mb, n.mem_total)
            && n.general.min_over(self.now_s, end_s) >= need as i32
            && !(need == 0 && self.in_advance_reservation(n, end_s))
    }

    /// Start-now for a job that may use hot spares, once the normal nodes alone could not start it: the free normal
    /// nodes plus as few spares as placement allows (the first `k` usable spares in view order, the smallest `k`
    /// that works), so the pool is not spent on what normal nodes cover. Placement rules (sites included) are
    /// unchanged.
    fn try_start_with_spares(&mut self, job: &Req, filter: &Filter, p: usize) -> Option<Vec<NodeAlloc>> {
        let end_s = self.now_s.saturating_add(job.time_limit_s);
        let spares: Vec<u32> = self.part_spares[p]
            .iter()
            .copied()
            .filter(|&i| {
                let n = &self.nodes[i as usize];
                filter.admits_spare(i, n) && self.free_now(job, n, end_s)
            })
            .collect();
        if spares.is_empty() {
            return None;
        }
        let normals: Vec<Candidate> = self.part_nodes[p]
            .iter()
            .copied()
            .filter(|&i| {
                let n = &self.nodes[i as usize];
                filter.admits(i, n) && n.avail_now >= Self::need_on(job, n) && self.free_now(job, n, end_s)
            })
            .map(|i| self.candidate(i, self.nodes[i as usize].avail_now as i32))
            .collect();
        let n_nodes = job.nodes as usize;
        let with = |k: usize| -> Option<Vec<u32>> {
            if normals.len() + k < n_nodes {
                return None;
            }
            let mut cands = normals.clone();
            // A spare is packed after normal nodes of its switch (it looks fuller than any of them).
            cands.extend(spares[..k].iter().map(|&s| self.candidate(s, MAX_GPUS_PER_NODE as i32 + 1)));
            choose_nodes(&cands, n_nodes, job.allow_multi_site)
        };
        // More candidates never undo a placement, so the fewest spares that work is a binary search.
        let (mut lo, mut best) = (n_nodes.saturating_sub(normals.len()).max(1), (spares.len(), with(spares.len())?));
        while lo < best.0 {
            let mid = lo + (best.0 - lo) / 2;
            match with(mid) {
                Some(chosen) => best = (mid, chosen),
                None => lo = mid + 1,
            }
        }
        Some(self.commit_now(job, &best.1, None))
    }

    /// Whether an advance reservation holds part of the node during `[now, end_s)`. GPU jobs see that in the
    /// profile; a GPU-less job would not, so it is checked explicitly.
    fn in_advance_reservation(&self, n: &NodeRt, end_s: u64) -> bool {
        n.resv.iter().any(|&(ri, _)| self.resvs[ri].start_s < end_s && self.now_s < self.resvs[ri].end_s)
    }

    fn try_start_in_reservation(&mut self, job: &Req, filter: &Filter, ri: usize) -> Option<Vec<NodeAlloc>> {
        let end_s = self.now_s.saturating_add(job.time_limit_s);
        if end_s > self.resvs[ri].end_s {
            // It would outlive the reservation. (GPU jobs fail the room check below anyway; this also keeps
            // GPU-less jobs inside it.)
            return None;
        }
        let mut cands = Vec::new();
        for (idx, n) in self.nodes.iter().enumerate() {
            let idx = idx as u32;
            let Some((_, rp)) = n.resv.iter().find(|(r, _)| *r == ri) else { continue };
            let need = Self::need_on(job, n) as i32;
            // Reserved capacity left, minus what overrunning work outside the reservation still holds.
            let room = rp.min_over(self.now_s, end_s) + n.general.min_over(self.now_s, end_s).min(0);
            if !filter.admits(idx, n)
                || room < need
                || (n.free_mask.count_ones() as i32) < need
                || n.cpus_free < job.cpus_per_node
                || n.mem_free < mem_needed(job.mem_per_node_mb, n.mem_total)
            {
                continue;
            }
            cands.push(self.candidate(idx, room));
        }
        let chosen = choose_nodes(&cands, job.nodes as usize, job.allow_multi_site)?;
        Some(self.commit_now(job, &chosen, Some(ri)))
    }

    /// Takes the GPUs now: concrete indices from the free masks (lowest first) and the window from the profiles.
    fn commit_now(&mut self, job: &Req, chosen: &[u32], resv: Option<usize>) -> Vec<NodeAlloc> {
        let now_s = self.now_s;
        let end_s = now_s.saturating_add(job.time_limit_s);
        let mut alloc = Vec::with_capacity(chosen.len());
        for &idx in chosen {
            let n = &mut self.nodes[idx as usize];
            let need = Self::need_on(job, n);
            // Candidates were checked against the mask, so this always finds enough bits.
            let gpus = lowest_gpus(n.free_mask, need).unwrap_or_default();
            for &b in &gpus {
                n.free_mask &= !(1u64 << b);
            }
            n.cpus_free = n.cpus_free.saturating_sub(job.cpus_per_node);
            n.mem_free = n.mem_free.saturating_sub(mem_needed(job.mem_per_node_mb, n.mem_total));
            match resv {
                None => n.general.add(now_s, end_s, -(need as i32)),
                Some(ri) => {
                    if let Some((_, p)) = n.resv.iter_mut().find(|(r, _)| *r == ri) {
                        p.add(now_s, end_s, -(need as i32));
                    }
                }
            }
            self.refresh_level(idx);
            alloc.push((self.node_names.get(idx).to_string(), gpus));
        }
        alloc
    }

    /// Re-files a node in the per-partition free-GPU index after its profile at `now` changed.
    fn refresh_level(&mut self, idx: u32) {
        let n = &mut self.nodes[idx as usize];
        let new = n.general.value_at(self.now_s).max(0) as u32;
        let old = n.avail_now;
        if new == old || !n.schedulable {
            n.avail_now = new;
            return;
        }
        n.avail_now = new;
        let mask = n.part_mask;
        for p in 0..self.part_free.len() {
            if mask & (1 << p) != 0 {
                self.part_free[p][old as usize].remove(idx);
                self.part_free[p][new as usize].insert(idx);
                self.part_levels[p][old as usize] -= 1;
                self.part_levels[p][new as usize] += 1;
            }
        }
    }

    /// The job's earliest start on the profiles and the nodes it would take then (a reservation takes them with
    /// [`Self::take_window`], so later jobs cannot delay it).
    fn find_earliest(&mut self, job: &Req, filter: &Filter, p: usize) -> Option<(u64, Vec<u32>)> {
        let dur_s = job.time_limit_s;
        let plain = filter.features == 0
            && filter.gpu_type == 0
            && filter.nodelist.is_empty()
            && filter.exclude.is_empty()
            && !job.exclusive
            && !job.may_use_spares;
        if job.nodes == 1 && plain {
            let (t, i) = self.earliest_single(p, job.gpus_per_node as i32, dur_s)?;
            return Some((t, vec![i]));
        }
        if job.nodes > 1 && plain && (job.allow_multi_site || self.part_one_site[p]) {
            return self.earliest_multi_plain(p, job.gpus_per_node as i32, dur_s, job.nodes as usize);
        }
        let mut nodes: Vec<u32> = Vec::with_capacity(self.part_nodes[p].len());
        nodes.extend(self.part_nodes[p].iter().copied().filter(|&i| {
            let n = &self.nodes[i as usize];
            filter.admits(i, n) && n.total >= Self::need_on(job, n)
        }));
        if job.may_use_spares {
            // Its reservation may hold spares too, or a job behind it could backfill onto the normal nodes it
            // is about to restart on (while the survivors' GPUs are still being released) and make it wait.
            nodes.extend(self.part_spares[p].iter().copied().filter(|&i| {
                let n = &self.nodes[i as usize];
                filter.admits_spare(i, n) && n.total >= Self::need_on(job, n)
            }));
            nodes.sort_unstable();
        }
        let (t, chosen) = if job.nodes == 1 {
            let mut best: Option<(u64, u32)> = None;
            for &i in &nodes {
                let n = &self.nodes[i as usize];
                if let Some(e) = n.general.earliest_fit(self.now_s, dur_s, Self::need_on(job, n) as i32)
                    && best.is_none_or(|b| (e, i) < b)
                {
                    best = Some((e, i));
                }
            }
            let (t, i) = best?;
            (t, vec![i])
        } else if job.allow_multi_site || self.one_site(&nodes) {
            // A single site needs no per-site split (and no copy of the node list).
            self.earliest_multi(job, &nodes)?
        } else {
            // One search per site; the earliest wins.
            let mut sites: Vec<u32> = nodes.iter().map(|&i| self.nodes[i as usize].site).collect();
            sites.sort_unstable();
            sites.dedup();
            let mut best: Option<(u64, Vec<u32>)> = None;
            for s in sites {
                let group: Vec<u32> = nodes.iter().copied().filter(|&i| self.nodes[i as usize].site == s).collect();
                if let Some((t, c)) = self.earliest_multi(job, &group)
                    && best.as_ref().is_none_or(|(bt, _)| t < *bt)
                {
                    best = Some((t, c));
                }
            }
            best?
        };
        Some((t, chosen))
    }

    /// Takes the job's GPUs on `chosen` for its window from `t` (a reservation, or now).
    fn take_window(&mut self, job: &Req, chosen: &[u32], t: u64) {
        let end_s = t.saturating_add(job.time_limit_s);
        for &i in chosen {
            let n = &mut self.nodes[i as usize];
            let need = Self::need_on(job, n) as i32;
            n.general.add(t, end_s, -need);
            if t <= self.now_s {
                self.refresh_level(i);
            }
        }
    }

    /// The shared lower-bound heap of a (partition, GPUs needed), built on first use (see `start_bounds`).
    fn start_bounds(&mut self, p: usize, need: i32) -> &mut StartBounds {
        let (now_s, nodes) = (self.now_s, &self.nodes);
        self.start_bounds.entry((p, need)).or_insert_with(|| {
            StartBounds::from_vec(
                self.part_nodes[p]
                    .iter()
                    .filter_map(|&i| nodes[i as usize].general.first_at_least(now_s, need).map(|t| (t, i)))
                    .collect(),
            )
        })
    }

    /// [`Self::earliest_multi`] over all of a partition's nodes for a job without node filters, with the same
    /// answer, but lazily: nodes are visited in order of a lower bound of their earliest fit (the shared
    /// `start_bounds` heap), so only those that can still be among the `want` earliest are evaluated, not every
    /// node of the partition.
    ///
    /// Each round needs the `want` smallest exact earliest fits from `t`. A heap entry is either a lower bound or
    /// exact for the current `t`; an exact value `e >= t` stays exact when `t` grows to at most `e`, and lower
    /// bounds stay lower bounds (earliest fits only grow with `t`, and GPUs are only taken during a pass).
    fn earliest_multi_plain(&mut self, p: usize, need: i32, dur_s: u64, want: usize) -> Option<(u64, Vec<u32>)> {
        self.start_bounds(p, need);
        // The exact values below belong to this search's `t`; the shared heap keeps bounds only, and is read in
        // order without being copied (most searches look at a small part of it).
        let mut heap = BoundsWalk::new(self.start_bounds.get(&(p, need))?.as_slice());
        let fit = |i: u32, t: u64| self.nodes[i as usize].general.earliest_fit(t, dur_s, need);
        let mut t = self.now_s;
        let mut smallest: Vec<(u64, u32)> = Vec::with_capacity(want);
        for _ in 0..MAX_EARLIEST_START_ROUNDS {
            // The `want` smallest exact earliest fits, in ascending order.
            while smallest.len() < want {
                let (k, i, exact) = heap.pop()?; // fewer than `want` nodes fit at all
                if exact {
                    smallest.push((k, i));
                } else if let Some(e) = fit(i, t) {
                    heap.push_exact(e, i);
                }
            }
            let tn = smallest[want - 1].0;
            if tn == t {
                // Every node that fits at t: these, and any still in the heap whose bound allows t.
                let mut at_t: Vec<u32> = smallest.iter().map(|&(_, i)| i).collect();
                while let Some((k, i, exact)) = heap.peek() {
                    if k > t {
                        break;
                    }
                    heap.pop();
                    let e = if exact { Some(k) } else { fit(i, t) };
                    match e {
                        Some(e) if e == t => at_t.push(i),
                        Some(e) => heap.push_exact(e, i),
                        None => {}
                    }
                }
                let cands: Vec<Candidate> =
                    at_t.iter().map(|&i| self.candidate(i, self.nodes[i as usize].general.value_at(t))).collect();
                return choose_nodes(&cands, want, true).map(|chosen| (t, chosen));
            }
            t = tn;
            // Fits earlier than the new t must be searched again from it; the others are still exact.
            for (e, i) in smallest.drain(..) {
                let e = if e >= t { Some(e) } else { fit(i, t) };
                if let Some(e) = e {
                    heap.push_exact(e, i);
                }
            }
        }
        None
    }

    /// The (earliest start, node) minimum over the partition's nodes for a single-node job without node filters
    /// other than the partition: the same answer as scanning every node, but it only evaluates nodes whose lower
    /// bound is not already beaten.
    fn earliest_single(&mut self, p: usize, need: i32, dur_s: u64) -> Option<(u64, u32)> {
        let now_s = self.now_s;
        self.start_bounds(p, need);
        let nodes = &self.nodes;
        let heap = self.start_bounds.get_mut(&(p, need))?;
        let mut best: Option<(u64, u32)> = None;
        let mut keep = Vec::new();
        while let Some((key, i)) = heap.peek() {
            // Every node still in the heap starts at (key, i) or later.
            if best.is_some_and(|b| (key, i) > b) {
                break;
            }
            heap.pop();
            let prof = &nodes[i as usize].general;
            match prof.first_at_least(now_s, need) {
                // It never has enough again in this pass.
                None => continue,
                Some(lb) if lb > key => {
                    heap.push((lb, i));
                    continue;
                }
                Some(_) => {}
            }
            if let Some(e) = prof.earliest_fit(now_s, dur_s, need)
                && best.is_none_or(|b| (e, i) < b)
            {
                best = Some((e, i));
            }
            keep.push((key, i));
        }
        for x in keep {
            heap.push(x);
        }
        best
    }

    /// Earliest time `n` of `nodes` are all free for the job's whole window, and which nodes.
    fn earliest_multi(&self, job: &Req, nodes: &[u32]) -> Option<(u64, Vec<u32>)> {
        let want = job.nodes as usize;
        if nodes.len() < want {
            return None;
        }
        let mut t = self.now_s;
        let fit = |i: u32, t: u64| {
            let n = &self.nodes[i as usize];
            n.general.earliest_fit(t, job.time_limit_s, Self::need_on(job, n) as i32)
        };
        let mut es: Vec<(u64, u32)> = Vec::with_capacity(nodes.len());
        es.extend(nodes.iter().filter_map(|&i| fit(i, t).map(|e| (e, i))));
        for _ in 0..MAX_EARLIEST_START_ROUNDS {
            if es.len() < want {
                return None;
            }
            let (_, &mut (tn, _), _) = es.select_nth_unstable(want - 1);
            if tn == t {
                let cands: Vec<Candidate> = es
                    .iter()
                    .filter(|&&(e, _)| e == t)
                    .map(|&(_, i)| self.candidate(i, self.nodes[i as usize].general.value_at(t)))
                    .collect();
                if let Some(chosen) = choose_nodes(&cands, want, true) {
                    return Some((t, chosen));
                }
                return None;
            }
            t = tn;
            // A node whose earliest fit from the old t is at or after the new t has that same earliest fit from the
            // new t; only the (fewer than `want`) nodes that fit earlier need a new search. Nodes that never fit
            // from an earlier time never fit from a later one.
            es.retain_mut(|(e, i)| {
                if *e >= t {
                    return true;
                }
                match fit(*i, t) {
                    Some(e2) => {
                        *e = e2;
                        true
                    }
                    None => false,
                }
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{
        AdvanceReservation, ArrayLimit, DependencyState, PartitionState, PendingJob, PriorityWeights, SchedulerConfig,
    };
    use crate::plan::Reason;
    use crate::schedule;
    use crate::synth::{cluster, occupy};

    fn job(id: u64, nodes: u32, gpus: u32, limit_s: u64) -> PendingJob {
        PendingJob::simple(id, 0, nodes, gpus, limit_s)
    }

    /// All priority weights zero: jobs go in submit order, then id order, which keeps scenarios readable.
    fn cfg() -> SchedulerConfig {
        let weights = PriorityWeights { age: 0, fairshare: 0, job_size: 0, partition: 0, qos: 0, ..Default::default() };
        SchedulerConfig { weights, ..SchedulerConfig::default() }
    }

    #[test]
    fn topology_four_node_job_stays_under_one_switch() {
        // 48 nodes, 3 switches of 16. Free whole nodes: 3 under sw0, 5 under sw1, 16 under sw2.
        let mut v = cluster(48, 8);
        v.now_s = 1_000;
        for i in 0..48 {
            let free = match i / 16 {
                0 => i % 16 < 3,
                1 => i % 16 < 5,
                _ => true,
            };
            if !free {
                occupy(&mut v, 10_000 + i as u64, i, &[0], 0, 5_000);
            }
        }
        v.pending.push(job(1, 4, 8, 100));
        let plan = schedule(&v, &cfg()).unwrap();
        let alloc = plan.start_of(1).expect("starts");
        let names: Vec<&str> = alloc.iter().map(|(n, _)| n.as_str()).collect();
        // The smallest switch that holds it whole is sw1 (nodes 16..21), leaving sw2 whole for bigger jobs.
        assert_eq!(names, ["n00016", "n00017", "n00018", "n00019"]);
        assert!(alloc.iter().all(|(_, g)| g == &(0..8).collect::<Vec<u32>>()));
    }

    #[test]
    fn fragmentation_one_gpu_job_goes_to_partly_used_node() {
        let mut v = cluster(3, 8);
        v.now_s = 10;
        occupy(&mut v, 100, 1, &[0, 1, 2, 4, 5], 0, 1_000);
        occupy(&mut v, 101, 2, &[0], 0, 1_000);
        v.pending.push(job(1, 1, 1, 100));
        v.pending.push(job(2, 1, 3, 100));
        let plan = schedule(&v, &cfg()).unwrap();
        // Node 1 has 3 free (3, 6, 7): the best fit; lowest free index first.
        assert_eq!(plan.start_of(1), Some(&[("n00001".to_string(), vec![3])][..]));
        // Then a 3-GPU job: node 1 has 2 left, node 2 has 7, node 0 has 8: node 2.
        assert_eq!(plan.start_of(2), Some(&[("n00002".to_string(), vec![1, 2, 3])][..]));
    }

    #[test]
    fn backfill_starts_only_what_cannot_delay_the_reservation() {
        let mut v = cluster(2, 8);
        v.now_s = 0;
        occupy(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5], 0, 100); // node 0: 2 free until t=100
        occupy(&mut v, 101, 1, &[0, 1, 2, 3], 0, 1_000); // node 1: 4 free until t=1000
        v.pending.push(job(1, 1, 8, 500)); // top job: needs a whole node -> node 0 at t=100
        v.pending.push(job(2, 1, 2, 50)); // ends before t=100: backfills on node 0
        v.pending.push(job(3, 1, 2, 500)); // would delay job 1 on node 0: goes to node 1
        v.pending.push(job(4, 1, 4, 500)); // nothing left without delaying job 1
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.expected_start_of(1), Some(100));
        assert_eq!(plan.reason_of(1), Some(Reason::Resources));
        assert_eq!(plan.start_of(2).map(|a| a[0].0.as_str()), Some("n00000"));
        assert_eq!(plan.start_of(3).map(|a| a[0].0.as_str()), Some("n00001"));
        assert_eq!(plan.reason_of(4), Some(Reason::Priority));
        assert_eq!(plan.expected_start_of(4), Some(500)); // node 1 once job 3 ends

        // FIFO without backfill: nothing passes job 1.
        let fifo = SchedulerConfig { backfill: false, ..cfg() };
        let plan = schedule(&v, &fifo).unwrap();
        assert!(plan.starts.is_empty());
        assert_eq!(plan.reason_of(2), Some(Reason::Priority));
    }

    #[test]
    fn multi_node_job_gets_an_expected_start() {
        let mut v = cluster(4, 8);
        occupy(&mut v, 100, 0, &[0], 0, 300);
        occupy(&mut v, 101, 1, &[0], 0, 200);
        occupy(&mut v, 102, 2, &[0], 0, 400);
        occupy(&mut v, 103, 3, &[0], 0, 100);
        v.pending.push(job(1, 3, 8, 50));
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.expected_start_of(1), Some(300));
    }

    #[test]
    fn advance_reservation_is_honoured() {
        let mut v = cluster(2, 8);
        v.now_s = 100;
        v.reservations.push(AdvanceReservation {
            name: "maint".into(),
            nodes: vec!["n00000".into()],
            gpu_count: None,
            start_s: 100,
            duration_s: Some(1_000),
            users: vec!["alice".into()],
            accounts: Vec::new(),
            flags: Vec::new(),
        });
        v.reservations.push(AdvanceReservation {
            name: "later".into(),
            nodes: vec!["n00001".into()],
            gpu_count: None,
            start_s: 500,
            duration_s: None,
            users: Vec::new(),
            accounts: Vec::new(),
            flags: Vec::new(),
        });
        let mut inside = job(1, 1, 8, 100);
        inside.user = "alice".into();
        inside.reservation = Some("maint".into());
        let mut stranger = job(2, 1, 1, 100);
        stranger.reservation = Some("maint".into());
        let mut waits = job(3, 1, 1, 100);
        waits.reservation = Some("later".into());
        v.pending.extend([inside, stranger, waits, job(4, 1, 8, 300), job(5, 1, 8, 500)]);
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.start_of(1).map(|a| a[0].0.as_str()), Some("n00000"));
        assert_eq!(plan.reason_of(2), Some(Reason::Reservation));
        assert_eq!(plan.reason_of(3), Some(Reason::Reservation));
        // Job 4 ends before "later" begins on node 1; job 5 would run into it, and node 0 is reserved.
        assert_eq!(plan.start_of(4).map(|a| a[0].0.as_str()), Some("n00001"));
        assert_eq!(plan.reason_of(5), Some(Reason::Resources));
        assert_eq!(plan.expected_start_of(5), Some(1_100));
    }

    #[test]
    fn pending_reasons() {
        let mut v = cluster(1, 8);
        v.partitions.push(crate::model::Partition {
            name: "down".into(),
            max_time_s: None,
            priority_tier: 1,
            state: PartitionState::Down,
            preempt_mode: Default::default(),
        });
        v.qos[0].max_gpus_per_user = Some(4);
        let mut held = job(1, 1, 1, 10);
        held.held = true;
        let mut dep = job(2, 1, 1, 10);
        dep.dependency = DependencyState::Waiting;
        let mut down = job(3, 1, 1, 10);
        down.partition = "down".into();
        let greedy = job(4, 1, 5, 10);
        let mut nowhere = job(5, 1, 1, 10);
        nowhere.nodelist = vec!["ghost".into()];
        let too_big = job(6, 2, 1, 10);
        let ok = job(7, 1, 4, 10);
        let over = job(8, 1, 1, 10);
        v.pending.extend([held, dep, down, greedy, nowhere, too_big, ok, over]);
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.reason_of(1), Some(Reason::JobHeldUser));
        assert_eq!(plan.reason_of(2), Some(Reason::Dependency));
        assert_eq!(plan.reason_of(3), Some(Reason::PartitionDown));
        assert_eq!(plan.reason_of(4), Some(Reason::QOSMaxGRESPerUser));
        assert_eq!(plan.reason_of(5), Some(Reason::ReqNodeNotAvail));
        assert_eq!(plan.reason_of(6), Some(Reason::ReqNodeNotAvail));
        assert!(plan.start_of(7).is_some());
        assert_eq!(plan.reason_of(8), Some(Reason::QOSMaxGRESPerUser));
        assert_eq!(plan.priorities.len(), 8);
    }

    #[test]
    fn exclusive_takes_whole_node() {
        let mut v = cluster(2, 4);
        occupy(&mut v, 100, 0, &[0], 0, 1_000);
        let mut ex = job(1, 1, 1, 10);
        ex.exclusive = true;
        v.pending.extend([ex, job(2, 1, 1, 10)]);
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.start_of(1), Some(&[("n00001".to_string(), vec![0, 1, 2, 3])][..]));
        assert_eq!(plan.start_of(2).map(|a| a[0].0.as_str()), Some("n00000"));
    }

    fn task(id: u64, array_id: u64, max_running: u32) -> PendingJob {
        let mut j = job(id, 1, 1, 100);
        j.array = Some(ArrayLimit { array_id, max_running });
        j
    }

    #[test]
    fn array_throttle_counts_running_and_started_tasks() {
        let mut v = cluster(4, 8);
        occupy(&mut v, 50, 0, &[0], 0, 1_000);
        v.running[0].array_id = Some(7);
        // Array 7 (%3, one task running) and array 8 (%1), all of which fit right now.
        v.pending.extend((1..=6).map(|id| task(id, 7, 3)));
        v.pending.extend((11..=13).map(|id| task(id, 8, 1)));
        let plan = schedule(&v, &cfg()).unwrap();
        let started: Vec<u64> = plan.starts.iter().map(|(id, _)| *id).collect();
        assert_eq!(started, [1, 2, 11]);
        for id in [3, 4, 5, 6, 12, 13] {
            assert_eq!(plan.reason_of(id), Some(Reason::JobArrayTaskLimit));
            assert_eq!(plan.expected_start_of(id), None, "a throttled task holds no reservation");
        }
        assert_eq!(Reason::JobArrayTaskLimit.name(), "JobArrayTaskLimit");
    }

    #[test]
    fn per_account_qos_limits() {
        let mut v = cluster(4, 8);
        v.qos[0].max_jobs_per_account = Some(3);
        v.qos[0].max_gpus_per_account = Some(6);
        occupy(&mut v, 50, 0, &[0], 0, 1_000); // account "root", 1 GPU, QOS normal
        let mut jobs = Vec::new();
        for (id, user, account, gpus) in
            [(1, "u1", "root", 2), (2, "u2", "root", 4), (3, "u3", "root", 1), (4, "u1", "other", 2)]
        {
            let mut j = job(id, 1, gpus, 100);
            j.user = user.into();
            j.account = account.into();
            jobs.push(j);
        }
        v.pending.extend(jobs);
        let plan = schedule(&v, &cfg()).unwrap();
        // Account root: the running job (1 GPU) + job 1 (2 GPUs); job 2 would make 7 > 6 GPUs; job 3 makes 3 jobs
        // and 4 GPUs, exactly the job limit.
        assert!(plan.start_of(1).is_some());
        assert_eq!(plan.reason_of(2), Some(Reason::QOSMaxGRESPerAccount));
        assert!(plan.start_of(3).is_some());
        assert!(plan.start_of(4).is_some(), "another account is not limited by root's usage");
        let mut more = v.clone();
        more.pending = vec![job(5, 1, 1, 100), job(6, 1, 1, 100), job(7, 1, 1, 100)];
        let plan = schedule(&more, &cfg()).unwrap();
        assert!(plan.start_of(5).is_some() && plan.start_of(6).is_some());
        assert_eq!(plan.reason_of(7), Some(Reason::QOSMaxJobsPerAccountLimit));
        assert_eq!(plan.expected_start_of(7), None);
    }

    #[test]
    fn nice_and_top_reorder_the_queue() {
        // One GPU free: only the first job in priority order starts.
        let mut v = cluster(1, 1);
        v.now_s = 100;
        let weights = PriorityWeights {
            age: 1_000,
            fairshare: 0,
            job_size: 0,
            partition: 0,
            qos: 0,
            max_age_s: 100,
            favor_small: false,
            short: 0,
        };
        let config = SchedulerConfig { weights, ..cfg() };
        let mut a = job(1, 1, 1, 10); // age 100 -> 1000
        let mut b = job(2, 1, 1, 10);
        b.submit_s = 50; // age 50 -> 500
        a.nice = 600; // 1000 - 600 = 400 < 500
        v.pending = vec![a.clone(), b.clone()];
        let plan = schedule(&v, &config).unwrap();
        assert!(plan.start_of(2).is_some());
        assert_eq!(plan.priorities[0].1.priority, 500);
        assert_eq!((plan.priorities[1].1.priority, plan.priorities[1].1.nice), (400, 600));

        // Same user, no nice: topping job 2 swaps the two values and so the order.
        a.nice = 0;
        b.top_rank = 1;
        v.pending = vec![a, b];
        let plan = schedule(&v, &config).unwrap();
        assert!(plan.start_of(2).is_some());
        assert_eq!(plan.priorities[0], (2, plan.priorities[0].1.clone()));
        assert_eq!(plan.priorities[0].1.priority, 1000);
        assert_eq!(plan.priorities[1].1.priority, 500);
    }

    #[test]
    fn short_first_profile_starts_short_jobs_first_and_ages_long_ones_ahead() {
        // One GPU free: only the first job in priority order starts.
        let mut v = cluster(1, 1);
        v.now_s = 1_000;
        let config = SchedulerConfig::short_first();
        let long = job(1, 1, 1, 24 * 3600);
        let short = job(2, 1, 1, 600);
        v.pending = vec![long.clone(), short.clone()];
        // Submit order starts the long one (same submit time, lower id); short-first the short one.
        assert!(schedule(&v, &cfg()).unwrap().start_of(1).is_some());
        let plan = schedule(&v, &config).unwrap();
        assert!(plan.start_of(2).is_some());
        assert!(plan.priorities[0].1.short > plan.priorities[1].1.short);
        // After the aging bound (2 days), a new short job no longer passes it.
        v.now_s = 3 * 24 * 3600;
        let mut new_short = short;
        new_short.submit_s = v.now_s;
        v.pending = vec![long, new_short];
        assert!(schedule(&v, &config).unwrap().start_of(1).is_some());
    }

    #[test]
    fn scheduling_order_packed_matches_comparator() {
        use super::{OrderKey, order_cmp, scheduling_order};
        let mut rng = crate::synth::XorShift::new(3);
        // Field ranges that pack into a u64, into a u128, and into neither (the comparator); ids in any order or
        // ascending with the view index (then they are left out of the packed key).
        for (range, ascending) in [(20, false), (1 << 20, false), (u64::MAX, false), (20, true), (1 << 20, true)] {
            let mut keys: Vec<OrderKey> = (0..500)
                .map(|_| {
                    let big = |r: &mut crate::synth::XorShift, small: u64| match range {
                        u64::MAX => r.next_u64(),
                        20 => r.below(small),
                        _ => r.below(range),
                    };
                    OrderKey {
                        tier: rng.below(3) as u32,
                        priority: big(&mut rng, 20),
                        top_rank: if rng.below(4) == 0 { big(&mut rng, 5) } else { 0 },
                        submit_s: big(&mut rng, 20),
                        id: big(&mut rng, 20),
                    }
                })
                .collect();
            if ascending {
                // Ids ascending with the view index.
                for (i, k) in keys.iter_mut().enumerate() {
                    k.id = 7 + 3 * i as u64;
                }
            }
            let mut want: Vec<(OrderKey, u32)> = keys.iter().enumerate().map(|(i, &k)| (k, i as u32)).collect();
            want.sort_by(order_cmp);
            let want: Vec<u32> = want.iter().map(|&(_, i)| i).collect();
            assert_eq!(scheduling_order(keys.len(), |i| keys[i]), want, "range={range} ascending={ascending}");
        }
        assert!(scheduling_order(0, |_| unreachable!()).is_empty());
    }

    #[test]
    fn bucketed_sort_matches_sort_unstable() {
        let mut rng = crate::synth::XorShift::new(11);
        // Few high values (the bucketed path), one value only, and too many to bucket; short inputs sort directly.
        for (n, high_values, low) in [(10_000, 300, 20), (10_000, 1, 20), (10_000, 1 << 20, 20), (100, 5, 8)] {
            let keys: Vec<u64> =
                (0..n).map(|_| rng.below(high_values) << low | rng.below(1 << low)).collect::<Vec<_>>();
            let mut want = keys.clone();
            want.sort_unstable();
            let mut got = keys;
            super::sort_by_high_bits(&mut got, low as u32);
            assert_eq!(got, want, "n={n} high_values={high_values}");
        }
    }

    #[test]
    fn radix_sort_matches_sort_unstable() {
        let mut rng = crate::synth::XorShift::new(13);
        // (n, bits above the index): one pass, two uneven passes, two full ones, too many, too short.
        for (n, above) in [(10_000u64, 12u32), (10_000, 23), (5_000, 32), (10_000, 40), (100, 10)] {
            let index_bits = u64::BITS - (n - 1).leading_zeros();
            let keys: Vec<u64> = (0..n).map(|i| rng.below(1 << above) << index_bits | i).collect();
            let mut want = keys.clone();
            want.sort_unstable();
            let mut got = keys.clone();
            if super::radix_sort_above(&mut got, index_bits, index_bits + above) {
                assert_eq!(got, want, "n={n} above={above}");
            } else {
                assert_eq!(got, keys, "n={n} above={above}: untouched when it declines");
                assert!(n < 4096 || above > 32);
            }
        }
    }

    #[test]
    fn start_bounds_pop_and_walk_in_order() {
        use super::{BoundsWalk, StartBounds};
        let mut rng = crate::synth::XorShift::new(5);
        let entries: Vec<(u64, u32)> = (0..300).map(|i| (rng.below(50), i)).collect();
        let mut heap = StartBounds::from_vec(entries[..200].to_vec());
        for &e in &entries[200..] {
            heap.push(e);
        }
        let mut sorted = entries.clone();
        sorted.sort_unstable();
        // Walking leaves the heap as it is and merges pushed exact entries in order.
        let mut walk = BoundsWalk::new(heap.as_slice());
        walk.push_exact(7, 1_000);
        let mut walked = Vec::new();
        while let Some((k, i, exact)) = walk.pop() {
            walked.push((k, i, exact));
        }
        let mut want: Vec<(u64, u32, bool)> = sorted.iter().map(|&(k, i)| (k, i, false)).collect();
        want.push((7, 1_000, true));
        want.sort_unstable();
        assert_eq!(walked, want);
        let popped: Vec<(u64, u32)> = std::iter::from_fn(|| heap.pop()).collect();
        assert_eq!(popped, sorted);
        assert_eq!(heap.peek(), None);
    }

    #[test]
    fn lazy_multi_node_search_matches_the_full_scan() {
        use super::{Pass, Req};
        let config = cfg();
        let (mut found, mut later) = (0, 0);
        for seed in 0..40 {
            let v = crate::synth::bench_view(64, 200, seed + 1);
            let mut pass = Pass::new(&v, &config).unwrap();
            let mut rng = crate::synth::XorShift::new(seed + 99);
            for _ in 0..30 {
                let req = Req {
                    nodes: 2 + rng.below(6) as u32,
                    gpus_per_node: rng.below(9) as u32,
                    cpus_per_node: 0,
                    mem_per_node_mb: 0,
                    time_limit_s: 600 * (1 + rng.below(100)),
                    exclusive: false,
                    allow_multi_site: false,
                    may_use_spares: false,
                };
                let nodes: Vec<u32> = pass.part_nodes[0].clone();
                let full = pass.earliest_multi(&req, &nodes);
                let lazy = pass.earliest_multi_plain(0, req.gpus_per_node as i32, req.time_limit_s, req.nodes as usize);
                assert_eq!(full, lazy, "seed {seed} {:?}", (req.nodes, req.gpus_per_node, req.time_limit_s));
                // Take the window, as a reservation would, so later searches see a busier profile.
                if let Some((t, chosen)) = full {
                    found += 1;
                    later += usize::from(t > v.now_s);
                    pass.take_window(&req, &chosen, t);
                }
            }
        }
        assert!(found > 600 && later > 300, "{found} found, {later} in the future");
    }

    /// `sites` nodes per site (8 GPUs each), sites named a, b, ...; every node under its own switch.
    fn sites(per_site: &[usize]) -> crate::model::ClusterView {
        let mut v = cluster(per_site.iter().sum(), 8);
        let mut i = 0;
        for (s, &count) in per_site.iter().enumerate() {
            for _ in 0..count {
                v.nodes[i].topology.site = ((b'a' + s as u8) as char).to_string();
                i += 1;
            }
        }
        v
    }

    #[test]
    fn a_multi_node_job_spans_sites_only_when_it_asks() {
        // Two sites of two nodes: three nodes exist only across them.
        let mut v = sites(&[2, 2]);
        v.pending.push(job(1, 3, 8, 100));
        let plan = schedule(&v, &cfg()).unwrap();
        assert!(plan.start_of(1).is_none());
        assert_eq!(plan.reason_of(1), Some(Reason::MultiSiteRequired), "no site has 3 nodes at all");
        v.pending[0].allow_multi_site = true;
        let plan = schedule(&v, &cfg()).unwrap();
        let on: Vec<&str> = plan.start_of(1).expect("starts across sites").iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(on.len(), 3);
        // It still fills one site first: both of site a's nodes, one of b's.
        assert!(on.contains(&"n00000") && on.contains(&"n00001"), "{on:?}");
    }

    #[test]
    fn a_job_that_fits_one_site_only_once_its_nodes_return_says_so() {
        // Site a has 3 nodes, one of them down; site b has 2: 3 nodes are up only across the sites.
        let mut v = sites(&[3, 2]);
        v.nodes[2].schedulable = false;
        v.pending.push(job(1, 3, 8, 100));
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.reason_of(1), Some(Reason::SiteNodesNotAvail));
        v.nodes[2].schedulable = true;
        assert!(schedule(&v, &cfg()).unwrap().start_of(1).is_some(), "site a holds it once its node is back");
        // A job that cannot fit even across sites keeps Slurm's reason.
        let mut v = sites(&[2, 2]);
        v.pending.push(PendingJob { allow_multi_site: true, ..job(1, 5, 8, 100) });
        assert_eq!(schedule(&v, &cfg()).unwrap().reason_of(1), Some(Reason::ReqNodeNotAvail));
        // Busy nodes are not a site problem: a job that fits one site waits for Resources as before.
        let mut v = sites(&[3, 3]);
        occupy(&mut v, 100, 0, &[0], 0, 1_000);
        occupy(&mut v, 101, 3, &[0], 0, 1_000);
        v.pending.push(job(1, 3, 8, 100));
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.reason_of(1), Some(Reason::Resources));
    }

    #[test]
    fn a_normal_job_never_lands_on_a_spare() {
        let mut v = cluster(4, 8);
        v.nodes[3].spare = true;
        v.pending.push(job(1, 4, 8, 100));
        for id in 2..=5 {
            v.pending.push(job(id, 1, 8, 100));
        }
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.reason_of(1), Some(Reason::ReqNodeNotAvail), "3 normal nodes never hold 4");
        let used: Vec<&str> = plan.starts.iter().flat_map(|(_, a)| a.iter().map(|(n, _)| n.as_str())).collect();
        assert_eq!(used.len(), 3, "{used:?}");
        assert!(!used.contains(&"n00003"), "{used:?}");
        assert_eq!(plan.reason_of(5), Some(Reason::Resources), "it waits for a normal node");
        // Reservations and backfill plan on normal nodes only, too.
        assert!(plan.expected_start_of(5).is_some_and(|t| t >= 100));
    }

    #[test]
    fn a_job_restarting_after_a_node_failure_takes_a_spare_when_normal_nodes_are_too_few() {
        // 3 normal nodes, one of them busy for an hour, and a spare.
        let mut v = cluster(4, 8);
        v.nodes[3].spare = true;
        occupy(&mut v, 100, 0, &[0], 0, 3_600);
        v.pending.push(job(1, 3, 8, 100));
        let plan = schedule(&v, &cfg()).unwrap();
        assert!(plan.start_of(1).is_none(), "an ordinary job waits for the busy node");
        v.pending[0].may_use_spares = true;
        let plan = schedule(&v, &cfg()).unwrap();
        let on: Vec<&str> = plan.start_of(1).expect("starts at once").iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(on, ["n00001", "n00002", "n00003"]);
    }

    #[test]
    fn a_job_restarting_after_a_node_failure_uses_no_spare_it_does_not_need_and_waits_when_spares_are_short() {
        let mut v = cluster(5, 8);
        v.nodes[3].spare = true;
        v.nodes[4].spare = true;
        v.pending.push(PendingJob { may_use_spares: true, ..job(1, 3, 8, 100) });
        let plan = schedule(&v, &cfg()).unwrap();
        let on: Vec<&str> = plan.start_of(1).unwrap().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(on, ["n00000", "n00001", "n00002"], "normal nodes first");
        // Two normal nodes busy: one free normal node and two spares make three; one spare more than needed
        // is left in the pool.
        occupy(&mut v, 100, 0, &[0], 0, 3_600);
        occupy(&mut v, 101, 1, &[0], 0, 3_600);
        v.pending[0] = PendingJob { may_use_spares: true, ..job(1, 2, 8, 100) };
        let plan = schedule(&v, &cfg()).unwrap();
        let on: Vec<&str> = plan.start_of(1).unwrap().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(on, ["n00002", "n00003"], "one spare, the first");
        // Four nodes with only one normal one free: it waits on normal nodes like before, spares untouched.
        v.pending[0] = PendingJob { may_use_spares: true, ..job(1, 4, 8, 100) };
        let plan = schedule(&v, &cfg()).unwrap();
        assert!(plan.start_of(1).is_none());
        assert_eq!(plan.reason_of(1), Some(Reason::Resources));
    }

    #[test]
    fn a_restarting_job_takes_the_fewest_spares_in_view_order() {
        // One normal node free (n0; n1 busy), four spares n2..n5: a 3-node restart takes n0, n2 and n3.
        let mut v = cluster(6, 8);
        for i in 2..6 {
            v.nodes[i].spare = true;
        }
        occupy(&mut v, 100, 1, &[0], 0, 3_600);
        v.pending.push(PendingJob { may_use_spares: true, ..job(1, 3, 8, 100) });
        let plan = schedule(&v, &cfg()).unwrap();
        let on: Vec<&str> = plan.start_of(1).unwrap().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(on, ["n00000", "n00002", "n00003"]);
        // With the spares on another site than the free normal node, it keeps to one site: three spares.
        for i in 2..6 {
            v.nodes[i].topology.site = "b".into();
        }
        let plan = schedule(&v, &cfg()).unwrap();
        let on: Vec<&str> = plan.start_of(1).unwrap().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(on, ["n00002", "n00003", "n00004"]);
    }

    #[test]
    fn a_job_restarting_after_a_node_failure_reserves_spares_so_nothing_backfills_in_its_way() {
        // n0 free, n1 busy for 100 s (its GPUs still being released), n2 down, n3 a spare.
        let mut v = cluster(4, 8);
        v.nodes[2].schedulable = false;
        v.nodes[3].spare = true;
        occupy(&mut v, 100, 1, &(0..8).collect::<Vec<u32>>(), 0, 100);
        v.pending.push(PendingJob { may_use_spares: true, ..job(1, 3, 8, 1_000) });
        v.pending.push(job(2, 1, 8, 1_000));
        let plan = schedule(&v, &cfg()).unwrap();
        assert!(plan.start_of(1).is_none());
        assert_eq!(plan.expected_start_of(1), Some(100), "n0, n1 and the spare at n1's end");
        assert!(plan.start_of(2).is_none(), "the later job may not take n0 for longer than that");
    }

    #[test]
    fn deterministic() {
        let v = crate::synth::bench_view(200, 2_000, 7);
        let a = schedule(&v, &cfg()).unwrap();
        let b = schedule(&v, &cfg()).unwrap();
        assert_eq!(a, b);
        assert!(!a.starts.is_empty() && !a.expected_start.is_empty());
    }
}

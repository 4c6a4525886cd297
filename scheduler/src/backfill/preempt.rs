//! Preemption with requeue: Slurm's `PreemptType=preempt/qos` and `preempt/partition_prio` with
//! `PreemptMode=REQUEUE`.
//!
//! A pending job that failed to start for lack of resources (not for a limit, hold, dependency, reservation or
//! partition state) may preempt running jobs when its QOS lists theirs in [`crate::Qos::preempt`], or when its
//! partition has [`crate::PreemptMode::Requeue`] and theirs has a lower `priority_tier`. Victims must be
//! requeue-able, not already ending, not in an advance reservation, and past their QOS's `preempt_exempt_time_s`.
//!
//! If the job cannot start by `kill_at = now + max(kill_wait_s, 1)` anyway, the pass looks for a placement (the
//! same node rules as a reservation) that fits over `[kill_at, kill_at + time limit)` once some victims are gone,
//! with the fewest victims, then the lowest-priority ones, then the most recently started (least lost work); the
//! set is irredundant: without any one of its victims no placement fits. The job does not start in this pass: it
//! holds a reservation at `kill_at` on the chosen nodes and waits with reason `Resources`.
//!
//! GPUs of jobs already ending (`preempting`) come back at `kill_at`, but only for the job they are being
//! preempted for (`preempted_for`), or, when that job is not pending or unknown, for jobs that may preempt them;
//! every other job sees them busy until the victim's own expected end. So the next pass re-reserves them for the
//! same job without preempting again, and nothing else takes them first. Taking victims' GPUs never makes a
//! profile rise, which keeps the pass's other bounds valid; what a reservation leaves of them stays usable by the
//! next job (exactly over the reservation's window, undercounted after it).
//!
//! Cost: nothing when no QOS preempts and no partition requeues. Otherwise at most [`MAX_PREEMPTOR_TRIES`] jobs
//! per pass run the search (plus jobs whose own victims are still ending), each over the nodes holding victims
//! (single-node jobs) or the partition's nodes (multi-node jobs).

use super::{Filter, NONE, NodeRt, Pass, Req};
use crate::fxhash::FxMap;
use crate::model::{ClusterView, JobId, PendingJob, PreemptMode, RunningJob, SchedulerConfig};
use crate::placement::{Candidate, choose_nodes};

/// Most jobs per pass that search for victims (jobs whose victims are already ending for them do not count).
pub const MAX_PREEMPTOR_TRIES: usize = 128;
/// Node evaluations per pass after which no more jobs search for victims (jobs whose victims are already ending
/// for them still do): about 20 searches of multi-node jobs over a 10,000-node partition.
pub const MAX_PREEMPT_WORK: usize = 200_000;
/// Up to this many candidate victims on one node, the cheapest smallest set is found by enumeration; beyond it,
/// greedily (largest first, then dropping the most expensive while it still fits).
const MAX_ENUMERATED: usize = 10;

/// Where a running job stands as a possible victim of this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VictimState {
    /// May be chosen.
    Candidate,
    /// Already ending (a view's `preempting` job, or chosen earlier in this pass), for this job if known.
    Ending(Option<JobId>),
}

struct Victim {
    id: JobId,
    /// QOS and partition indices, or NONE when the view does not define them.
    qos: u32,
    part: u32,
    priority: u64,
    start_s: u64,
    /// The nodes it holds GPUs on (what it holds on each is in [`Preempt::by_node`]).
    nodes: Vec<u32>,
    state: VictimState,
}

/// GPUs handed back early: (when the general profile gets them back anyway, how many).
type Early = (u64, i32);
/// A candidate victim on one node: (victim, its end, GPUs it frees there).
type OnNode = (u32, u64, i32);

/// The job looking for victims: id, QOS index (or NONE) and partition index.
#[derive(Clone, Copy)]
struct Who {
    id: JobId,
    q: u32,
    p: u32,
}

/// A victim's GPUs on one node.
#[derive(Clone, Copy)]
struct Slot {
    v: u32,
    /// When the general profile gets them back.
    end_s: u64,
    gpus: i32,
    /// A preemptor's reservation already counts on them.
    used: bool,
}

/// What a victim set costs, compared field by field in this order: fewer victims, then lower priorities, then
/// less run time lost; ids break ties where costs are compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    victims: usize,
    /// The victims' priorities, summed.
    priority: u128,
    /// The run time they lose, summed.
    lost_s: u128,
}

pub(super) struct Preempt<'a> {
    pub(super) kill_at: u64,
    now_s: u64,
    qos_index: FxMap<&'a str, u32>,
    /// Per QOS: the (sorted) QOS indices it may preempt.
    qos_targets: Vec<Vec<u32>>,
    part_requeue: Vec<bool>,
    part_tier: Vec<u32>,
    /// Whether some QOS lists this QOS (so its jobs can be victims by QOS).
    qos_targeted: Vec<bool>,
    /// The highest tier of a requeueing partition (jobs of lower tiers can be victims by tier).
    max_requeue_tier: Option<u32>,
    exempt_s: Vec<Option<u64>>,
    victims: Vec<Victim>,
    /// Per node: the victims holding GPUs there.
    by_node: Vec<Vec<Slot>>,
    /// Nodes with victims, ascending.
    victim_nodes: Vec<u32>,
    /// Nodes with victims already ending, ascending.
    ending_nodes: Vec<u32>,
    /// Candidate victims, cheapest first (lowest priority, then most recently started, then id).
    order: Vec<u32>,
    /// Nodes the searches of this pass have looked at (bounded by [`MAX_PREEMPT_WORK`]).
    work: std::cell::Cell<usize>,
    /// Jobs some ending victim is being preempted for, and whether they are pending in this view.
    ending_for: FxMap<JobId, bool>,
    /// Per (preemptor QOS, partition): whether any victim is preemptible by it.
    class_ok: FxMap<(u32, u32), bool>,
    /// Per (shape, QOS, partition): the shortest time limit whose search found no placement at all.
    failed: FxMap<(u32, u32, u32), u64>,
    budget: usize,
    tries: usize,
}

/// What the pass does with a blocked job after looking at preemption.
pub(super) enum Outcome {
    /// The ordinary path; with the job's earliest start on the profiles when it was already computed.
    Normal(Option<Option<(u64, Vec<u32>)>>),
    /// Reserved at `kill_at`, preempting these running jobs (none: GPUs already ending for it suffice).
    Reserved { t: u64, victims: Vec<JobId> },
}

impl<'a> Preempt<'a> {
    /// The preemption state of a pass, or None when nothing can preempt (the pass is then exactly as without it).
    pub(super) fn new(
        view: &'a ClusterView,
        config: &SchedulerConfig,
        part_index: &FxMap<&'a str, usize>,
        n_nodes: usize,
    ) -> Option<Self> {
        let any = view.qos.iter().any(|q| !q.preempt.is_empty())
            || view.partitions.iter().any(|p| p.preempt_mode == PreemptMode::Requeue);
        if !config.preemption || !any {
            return None;
        }
        let qos_index: FxMap<&str, u32> =
            view.qos.iter().enumerate().map(|(i, q)| (q.name.as_str(), i as u32)).collect();
        let mut qos_targeted = vec![false; view.qos.len()];
        let qos_targets: Vec<Vec<u32>> = view
            .qos
            .iter()
            .map(|q| {
                let mut t: Vec<u32> = q
                    .preempt
                    .iter()
                    // A QOS never preempts itself (sacctmgr refuses that too).
                    .filter(|name| **name != q.name)
                    .filter_map(|name| qos_index.get(name.as_str()).copied())
                    .collect();
                t.sort_unstable();
                t.dedup();
                for &j in &t {
                    qos_targeted[j as usize] = true;
                }
                t
            })
            .collect();
        let part_requeue: Vec<bool> = view.partitions.iter().map(|p| p.preempt_mode == PreemptMode::Requeue).collect();
        let part_tier: Vec<u32> = view.partitions.iter().map(|p| p.priority_tier).collect();
        let max_requeue_tier =
            view.partitions.iter().filter(|p| p.preempt_mode == PreemptMode::Requeue).map(|p| p.priority_tier).max();
        debug_assert_eq!(part_index.len(), view.partitions.len());
        Some(Self {
            kill_at: view.now_s.saturating_add(config.kill_wait_s.max(1)),
            now_s: view.now_s,
            qos_index,
            qos_targets,
            part_requeue,
            part_tier,
            qos_targeted,
            max_requeue_tier,
            exempt_s: view.qos.iter().map(|q| q.preempt_exempt_time_s).collect(),
            victims: Vec::new(),
            by_node: vec![Vec::new(); n_nodes],
            victim_nodes: Vec::new(),
            ending_nodes: Vec::new(),
            order: Vec::new(),
            work: std::cell::Cell::new(0),
            ending_for: FxMap::default(),
            class_ok: FxMap::default(),
            failed: FxMap::default(),
            budget: config.max_preemptions,
            tries: MAX_PREEMPTOR_TRIES,
        })
    }

    /// Whether a running job's GPUs are held back for preemptors (it is ending and not in an advance reservation):
    /// then the general profile gets them back at its own expected end, not at `kill_at`.
    pub(super) fn holds_back(job: &RunningJob) -> bool {
        job.preempting && job.reservation.is_none()
    }

    /// Records a running job as a possible victim, or as ending, if it is either. `held`: (node, GPUs it takes
    /// from the general profile there), `end_s`: when the profile gets them back.
    pub(super) fn add_running(
        &mut self,
        job: &RunningJob,
        part_index: &FxMap<&'a str, usize>,
        end_s: u64,
        held: Vec<(u32, i32)>,
    ) {
        if job.reservation.is_some() || held.is_empty() {
            return;
        }
        let qos = self.qos_index.get(job.qos.as_str()).copied().unwrap_or(NONE);
        let part = part_index.get(job.partition.as_str()).map_or(NONE, |&p| p as u32);
        let state = if job.preempting {
            if end_s <= self.kill_at {
                return; // it is gone by then for everyone
            }
            if let Some(f) = job.preempted_for {
                self.ending_for.insert(f, false);
            }
            VictimState::Ending(job.preempted_for)
        } else {
            let by_qos = qos != NONE && self.qos_targeted[qos as usize];
            let by_tier = part != NONE && self.max_requeue_tier.is_some_and(|t| self.part_tier[part as usize] < t);
            let exempt =
                qos != NONE && self.exempt_s[qos as usize].is_some_and(|x| self.now_s < job.start_s.saturating_add(x));
            if !job.requeueable || exempt || !(by_qos || by_tier) {
                return;
            }
            VictimState::Candidate
        };
        let v = self.victims.len() as u32;
        for &(ni, g) in &held {
            if self.by_node[ni as usize].is_empty() {
                self.victim_nodes.push(ni);
            }
            self.by_node[ni as usize].push(Slot { v, end_s, gpus: g, used: false });
        }
        self.victims.push(Victim {
            id: job.id,
            qos,
            part,
            priority: job.priority,
            start_s: job.start_s,
            nodes: held.into_iter().map(|(n, _)| n).collect(),
            state,
        });
    }

    /// Finishes setup once every running job is recorded.
    pub(super) fn seal(&mut self, view: &ClusterView) {
        self.victim_nodes.sort_unstable();
        self.ending_nodes = self
            .victims
            .iter()
            .filter(|v| v.state != VictimState::Candidate)
            .flat_map(|v| v.nodes.iter().copied())
            .collect();
        self.ending_nodes.sort_unstable();
        self.ending_nodes.dedup();
        self.order = (0..self.victims.len() as u32)
            .filter(|&v| self.victims[v as usize].state == VictimState::Candidate)
            .collect();
        let mut order = std::mem::take(&mut self.order);
        order.sort_by_key(|&v| self.order_key(v));
        self.order = order;
        if !self.ending_for.is_empty() {
            for job in &view.pending {
                if let Some(p) = self.ending_for.get_mut(&job.id) {
                    *p = true;
                }
            }
        }
    }

    /// Whether some pending job of the view waits for victims already ending for it.
    pub(super) fn any_waiting(&self) -> bool {
        self.ending_for.values().any(|&pending| pending)
    }

    /// Whether `job` is pending and victims are already ending for it (at the start of the pass: a job that
    /// chooses victims in this pass answers true afterwards).
    pub(super) fn waits_for_victims(&self, job: JobId) -> bool {
        self.ending_for.get(&job) == Some(&true)
    }

    /// Whether jobs of QOS `q` (None: unknown) in partition `p` may preempt anyone at all by the rules.
    pub(super) fn may_preempt_some(&self, q: Option<usize>, p: usize) -> bool {
        q.is_some_and(|q| !self.qos_targets[q].is_empty()) || self.part_requeue[p]
    }

    /// Whether a job of QOS `q` in partition `p` may preempt `v` by the QOS or partition rules.
    fn may(&self, Who { q, p, .. }: Who, v: &Victim) -> bool {
        let by_qos = q != NONE && v.qos != NONE && self.qos_targets[q as usize].binary_search(&v.qos).is_ok();
        let by_tier = self.part_requeue[p as usize]
            && v.part != NONE
            && self.part_tier[v.part as usize] < self.part_tier[p as usize];
        by_qos || by_tier
    }

    /// Whether the job may use the GPUs `v` gives back early (or choose it).
    fn usable(&self, who: Who, v: &Victim) -> bool {
        match v.state {
            VictimState::Candidate => self.may(who, v),
            VictimState::Ending(Some(f)) if f == who.id => true,
            VictimState::Ending(Some(f)) if self.ending_for.get(&f) == Some(&true) => false,
            VictimState::Ending(_) => self.may(who, v),
        }
    }

    fn class_ok(&mut self, who: Who) -> bool {
        if let Some(&ok) = self.class_ok.get(&(who.q, who.p)) {
            return ok;
        }
        let ok = self.victims.iter().any(|v| self.may(who, v));
        self.class_ok.insert((who.q, who.p), ok);
        ok
    }

    /// On node `i`, for the job: the (end, GPUs) it gets back early from victims already ending, and the
    /// candidate victims it may choose.
    fn on_node(&self, i: u32, who: Who) -> (Vec<Early>, Vec<OnNode>) {
        let (mut ending, mut cands) = (Vec::new(), Vec::new());
        self.fill_on_node(i, who, &mut ending, &mut cands);
        (ending, cands)
    }

    /// [`Self::on_node`] into reused buffers.
    fn fill_on_node(&self, i: u32, who: Who, ending: &mut Vec<Early>, cands: &mut Vec<OnNode>) {
        ending.clear();
        cands.clear();
        for slot in &self.by_node[i as usize] {
            if slot.used {
                continue;
            }
            let v = &self.victims[slot.v as usize];
            if !self.usable(who, v) {
                continue;
            }
            match v.state {
                VictimState::Candidate => cands.push((slot.v, slot.end_s, slot.gpus)),
                VictimState::Ending(_) => ending.push((slot.end_s, slot.gpus)),
            }
        }
    }

    /// Whether node `i` holds victims ending for some other job that is pending in this view.
    fn earmarked_elsewhere(&self, i: u32, who: Who) -> bool {
        self.by_node[i as usize].iter().any(|s| match self.victims[s.v as usize].state {
            VictimState::Ending(Some(f)) => f != who.id && self.ending_for.get(&f) == Some(&true),
            _ => false,
        })
    }

    /// What victim `v` frees on node `i` early, unless a reservation already used it.
    fn early_on(&self, i: u32, v: u32) -> Option<Early> {
        self.by_node[i as usize].iter().find(|s| s.v == v && !s.used).map(|s| (s.end_s, s.gpus))
    }

    /// After a reservation at `kill_at` took `need` GPUs on node `i` covered first by the ending slots `who` may
    /// use there: takes `need` from those slots, latest end first. Over the window that leaves exactly what the
    /// reservation did not need (at a time `t` the slots still counting are those ending after `t`, which absorb
    /// the take first); after the window it leaves less than is really there, which is safe (a profile never
    /// rises). Taking the whole slots instead hid the surplus: a preemptor after a job that needed one of a
    /// victim's three GPUs found none and waited hours for GPUs that were free at `kill_at`.
    fn consume(&mut self, i: u32, who: Who, need: i32) {
        let mut slots: Vec<usize> = (0..self.by_node[i as usize].len())
            .filter(|&k| {
                let s = &self.by_node[i as usize][k];
                let v = &self.victims[s.v as usize];
                !s.used && matches!(v.state, VictimState::Ending(_)) && self.usable(who, v)
            })
            .collect();
        slots.sort_by_key(|&k| std::cmp::Reverse(self.by_node[i as usize][k].end_s));
        let mut left = need;
        for k in slots {
            if left <= 0 {
                break;
            }
            let s = &mut self.by_node[i as usize][k];
            let take = left.min(s.gpus);
            s.gpus -= take;
            left -= take;
            s.used = s.gpus == 0;
        }
    }

    fn cost(&self, set: &[u32]) -> Cost {
        let prio = set.iter().map(|&v| u128::from(self.victims[v as usize].priority)).sum();
        let lost = set.iter().map(|&v| u128::from(self.now_s.saturating_sub(self.victims[v as usize].start_s))).sum();
        Cost { victims: set.len(), priority: prio, lost_s: lost }
    }

    /// The victim order when costs tie: lower priority, then most recently started, then lower id.
    fn order_key(&self, v: u32) -> (u64, std::cmp::Reverse<u64>, JobId) {
        let v = &self.victims[v as usize];
        (v.priority, std::cmp::Reverse(v.start_s), v.id)
    }

    /// The cheapest smallest set of `cands` (victim, end, GPUs) that makes node `n` fit `need` over `[from, to)`
    /// on top of `ending`; with the node's GPUs over the window then. None if all of them are not enough.
    fn best_on_node(
        &self,
        n: &NodeRt,
        (from, to): (u64, u64),
        need: i32,
        ending: &[Early],
        cands: &mut [OnNode],
    ) -> Option<(Vec<u32>, i32)> {
        cands.sort_by_key(|c| self.order_key(c.0));
        let mut extra: Vec<(u64, i32)> = Vec::with_capacity(ending.len() + cands.len());
        let mut have = |set: &mut dyn Iterator<Item = &OnNode>| {
            extra.clear();
            extra.extend_from_slice(ending);
            extra.extend(set.map(|&(_, e, g)| (e, g)));
            n.general.min_over_plus(from, to, &extra)
        };
        if have(&mut cands.iter()) < need {
            return None;
        }
        if cands.len() <= MAX_ENUMERATED {
            for k in 1..=cands.len() {
                let mut best: Option<(Cost, Vec<u32>, i32)> = None;
                let mut idx: Vec<usize> = (0..k).collect();
                loop {
                    let h = have(&mut idx.iter().map(|&i| &cands[i]));
                    if h >= need {
                        let set: Vec<u32> = idx.iter().map(|&i| cands[i].0).collect();
                        let c = self.cost(&set);
                        if best.as_ref().is_none_or(|(bc, _, _)| c < *bc) {
                            best = Some((c, set, h));
                        }
                    }
                    // Next combination in lexicographic order.
                    let Some(j) = (0..k).rev().find(|&j| idx[j] < cands.len() - k + j) else { break };
                    idx[j] += 1;
                    for l in j + 1..k {
                        idx[l] = idx[l - 1] + 1;
                    }
                }
                if let Some((_, set, h)) = best {
                    return Some((set, h));
                }
            }
            return None;
        }
        // Many small victims: largest first until it fits, then drop the most expensive ones it can do without.
        let mut by_size: Vec<usize> = (0..cands.len()).collect();
        by_size.sort_by_key(|&i| (std::cmp::Reverse(cands[i].2), i));
        let mut chosen: Vec<usize> = Vec::new();
        for i in by_size {
            chosen.push(i);
            if have(&mut chosen.iter().map(|&i| &cands[i])) >= need {
                break;
            }
        }
        chosen.sort_unstable();
        for pos in (0..chosen.len()).rev() {
            let without: Vec<usize> = chosen.iter().enumerate().filter(|&(p, _)| p != pos).map(|(_, &i)| i).collect();
            if have(&mut without.iter().map(|&i| &cands[i])) >= need {
                chosen = without;
            }
        }
        let h = have(&mut chosen.iter().map(|&i| &cands[i]));
        Some((chosen.iter().map(|&i| cands[i].0).collect(), h))
    }
}

/// A node that fits the job once its own set of victims is gone.
#[derive(Clone)]
struct NodeOption {
    node: u32,
    cost: Cost,
    set: Vec<u32>,
    have: i32,
}

impl<'a> Pass<'a> {
    /// After `job` failed to start now for lack of resources: preempts for it if it may and must.
    /// `job` comes with its id and `JobPre::preempt_q` (non-zero), so that the common early exits do not touch it.
    pub(super) fn try_preempt(
        &mut self,
        pre: &mut Preempt<'a>,
        (job, id, preempt_q): (&PendingJob, JobId, u16),
        req: &Req,
        filter: &Filter,
        p: usize,
        shape: Option<usize>,
    ) -> Outcome {
        if req.gpus_per_node == 0 && !req.exclusive {
            return Outcome::Normal(None);
        }
        // Its own victims are ending: it must get their GPUs back whatever the budgets.
        let own = !pre.ending_for.is_empty() && pre.ending_for.contains_key(&id);
        let spent = pre.tries == 0 || pre.budget == 0 || pre.work.get() >= MAX_PREEMPT_WORK;
        if spent && !own {
            return Outcome::Normal(None);
        }
        let q = match preempt_q {
            u16::MAX => pre.qos_index.get(job.qos.as_str()).copied().unwrap_or(NONE),
            q => u32::from(q) - 1,
        };
        let p32 = p as u32;
        let who = Who { id, q, p: p32 };
        if !pre.class_ok(who) {
            return Outcome::Normal(None);
        }
        if !own {
            pre.tries -= 1;
            if let Some(s) = shape
                && pre.failed.get(&(s as u32, q, p32)).is_some_and(|&l| l <= req.time_limit_s)
            {
                return Outcome::Normal(None);
            }
        }
        let earliest = self.find_earliest(req, filter, p);
        if earliest.as_ref().is_some_and(|(t, _)| *t <= pre.kill_at) {
            // It starts by the time victims would be gone anyway.
            return Outcome::Normal(Some(earliest));
        }
        let Some((chosen, set)) = self.preempt_search(pre, who, req, filter) else {
            if let (Some(s), false) = (shape, own) {
                // Resources only shrink and victims only get used during a pass.
                let e = pre.failed.entry((s as u32, q, p32)).or_insert(u64::MAX);
                *e = (*e).min(req.time_limit_s);
            }
            return Outcome::Normal(Some(earliest));
        };
        // A job whose victims are still ending waits for them: it never adds more (its window may have moved
        // into another reservation as `kill_at` moves on with each pass).
        if set.len() > pre.budget || (own && !set.is_empty()) {
            return Outcome::Normal(Some(earliest));
        }
        pre.budget -= set.len();
        let mut victims: Vec<JobId> = Vec::with_capacity(set.len());
        for &v in &set {
            let v = &mut pre.victims[v as usize];
            v.state = VictimState::Ending(Some(id));
            victims.push(v.id);
            pre.ending_nodes.extend(v.nodes.iter().copied());
        }
        pre.ending_nodes.sort_unstable();
        pre.ending_nodes.dedup();
        if !set.is_empty() {
            pre.ending_for.insert(id, true);
        }
        self.take_at_kill(pre, who, req, &chosen);
        victims.sort_unstable();
        Outcome::Reserved { t: pre.kill_at, victims }
    }

    /// Takes the job's window at `kill_at` on the chosen nodes, covered first by what ends there for it.
    fn take_at_kill(&mut self, pre: &mut Preempt<'a>, who: Who, req: &Req, chosen: &[u32]) {
        let (from, to) = (pre.kill_at, pre.kill_at.saturating_add(req.time_limit_s));
        for &i in chosen {
            let need = Self::need_on(req, &self.nodes[i as usize]) as i32;
            let (ending, _) = pre.on_node(i, who);
            self.nodes[i as usize].general.take_covered(from, to, need, &ending);
            pre.consume(i, who, need);
        }
    }

    /// Before any other job is placed: a pending job whose victims are already ending for it takes its window at
    /// `kill_at` on their nodes (and on others it needs beside them) when that fits without more victims; the
    /// time it is reserved for, or None when it does not fit (it then goes through the pass in its turn).
    ///
    /// Jobs ahead of it in priority would otherwise be placed first, and what they take can change between passes
    /// (a victim ending for a job that has since started elsewhere leaves its GPUs to everyone): one of them could
    /// take what the preemptor counted on, and it would wait long past `kill_at` while other jobs lost their work
    /// for it (found by `the_next_pass_does_not_preempt_again`). Its victims' nodes come first, then nodes no
    /// other waiting preemptor counts on.
    pub(super) fn claim(
        &mut self,
        pre: &mut Preempt<'a>,
        (job, id, preempt_q): (&PendingJob, JobId, u16),
        req: &Req,
        filter: &Filter,
        p: usize,
    ) -> Option<u64> {
        if (req.gpus_per_node == 0 && !req.exclusive) || !pre.waits_for_victims(id) {
            return None;
        }
        let q = match preempt_q {
            u16::MAX => pre.qos_index.get(job.qos.as_str()).copied().unwrap_or(NONE),
            q => u32::from(q) - 1,
        };
        let who = Who { id, q, p: p as u32 };
        let window = (pre.kill_at, pre.kill_at.saturating_add(req.time_limit_s));
        let own = |i: u32| {
            pre.by_node[i as usize]
                .iter()
                .any(|s| !s.used && pre.victims[s.v as usize].state == VictimState::Ending(Some(id)))
        };
        let nodes: &[u32] = if req.nodes == 1 { &pre.ending_nodes } else { &self.part_nodes[p] };
        let mut cands: Vec<Candidate> = Vec::new();
        let (mut ending, mut unused) = (Vec::new(), Vec::new());
        let mut has_own = false;
        for &i in nodes {
            let n = &self.nodes[i as usize];
            let need = Self::need_on(req, n);
            if !filter.admits(i, n) || n.total < need {
                continue;
            }
            pre.fill_on_node(i, who, &mut ending, &mut unused);
            let have = n.general.min_over_plus(window.0, window.1, &ending);
            if have < need as i32 {
                continue;
            }
            // Lower `free` is preferred by the placement: its own victims' nodes, then nodes nobody counts on; ties
            // go to the lower node, not to the fuller one, because the jobs that start between passes change how
            // full nodes are, and the next pass should find the same nodes again.
            let rank = if own(i) {
                has_own = true;
                0
            } else if pre.earmarked_elsewhere(i, who) {
                2
            } else {
                1
            };
            cands.push(self.candidate(i, rank));
        }
        if !has_own {
            return None;
        }
        let chosen = choose_nodes(&cands, req.nodes as usize, req.allow_multi_site)?;
        self.take_at_kill(pre, who, req, &chosen);
        Some(pre.kill_at)
    }

    /// A placement at `kill_at` and the victims it needs (empty: GPUs already ending for the job suffice): the
    /// nodes that could host the job and what each would cost (`gather`), the cheapest placement over them
    /// (`pick`), then only the victims it cannot do without (`trim`).
    fn preempt_search(&self, pre: &Preempt<'a>, who: Who, req: &Req, filter: &Filter) -> Option<(Vec<u32>, Vec<u32>)> {
        let window = (pre.kill_at, pre.kill_at.saturating_add(req.time_limit_s));
        let (free, options) = self.gather(pre, who, req, filter, window);
        let (chosen, mut set) = self.pick(pre, who, (req, filter), window, &free, options)?;
        set.sort_unstable();
        set.dedup();
        if set.is_empty() {
            return Some((chosen, set));
        }
        let (chosen, mut set) = self.trim(pre, who, (req, filter), &free, chosen, set)?;
        // Victims with no GPUs on the final nodes are not needed by it.
        set.retain(|&v| pre.victims[v as usize].nodes.iter().any(|i| chosen.contains(i)));
        Some((chosen, set))
    }

    /// The nodes that fit the job over `window` with what already ends for it (`free`), and for the others the
    /// cheapest victims that would make them fit (`options`). One node: GPUs already ending for it first, then one
    /// victim, then several on one node. Several nodes: every node of the partition.
    fn gather(
        &self,
        pre: &Preempt<'a>,
        who: Who,
        req: &Req,
        filter: &Filter,
        window: (u64, u64),
    ) -> (Vec<Candidate>, Vec<NodeOption>) {
        let want = req.nodes as usize;
        let p = who.p as usize;
        let mut free: Vec<Candidate> = Vec::new();
        let mut options: Vec<NodeOption> = Vec::new();
        let (mut ending, mut cands): (Vec<Early>, Vec<OnNode>) = (Vec::new(), Vec::new());
        let work = std::cell::Cell::new(0usize);
        // Node `i`'s GPUs for the job with what already ends for it, when it may host the job at all; fills
        // `ending` and `cands`.
        let look = |i: u32, ending: &mut Vec<Early>, cands: &mut Vec<OnNode>| -> Option<(i32, i32)> {
            work.set(work.get() + 1);
            let n = &self.nodes[i as usize];
            let need = Self::need_on(req, n);
            if !filter.admits(i, n) || n.total < need {
                return None;
            }
            pre.fill_on_node(i, who, ending, cands);
            Some((n.general.min_over_plus(window.0, window.1, ending), need as i32))
        };
        if want == 1 {
            // It fits no node by kill_at without preemption (or the caller would not be here): only GPUs that
            // end early can help. First, those already ending for it.
            for &i in &pre.ending_nodes {
                if let Some((base, need)) = look(i, &mut ending, &mut cands)
                    && base >= need
                {
                    free.push(self.candidate(i, base));
                }
            }
            if free.is_empty() {
                // One victim: the cheapest whose absence makes one of its nodes fit.
                'one: for &v in &pre.order {
                    let vic = &pre.victims[v as usize];
                    if vic.state != VictimState::Candidate || !pre.may(who, vic) {
                        continue;
                    }
                    for &i in &vic.nodes {
                        let Some(early) = pre.early_on(i, v) else { continue };
                        let Some((_, need)) = look(i, &mut ending, &mut cands) else { continue };
                        ending.push(early);
                        let have = self.nodes[i as usize].general.min_over_plus(window.0, window.1, &ending);
                        if have >= need {
                            options.push(NodeOption { node: i, cost: pre.cost(&[v]), set: vec![v], have });
                            break 'one;
                        }
                    }
                }
            }
            if free.is_empty() && options.is_empty() {
                // Several victims on one node.
                for &i in &pre.victim_nodes {
                    let Some((base, need)) = look(i, &mut ending, &mut cands) else { continue };
                    if base < need
                        && let Some(o) = self.best_option(pre, i, window, need, &mut ending, &mut cands)
                    {
                        options.push(o);
                    }
                }
            }
        } else {
            for &i in &self.part_nodes[p] {
                if pre.by_node[i as usize].is_empty() {
                    // Nothing ends early here: only the profile counts.
                    work.set(work.get() + 1);
                    let n = &self.nodes[i as usize];
                    let need = Self::need_on(req, n);
                    if filter.admits(i, n) && n.total >= need {
                        let base = n.general.min_over(window.0, window.1);
                        if base >= need as i32 {
                            free.push(self.candidate(i, base));
                        }
                    }
                    continue;
                }
                let Some((base, need)) = look(i, &mut ending, &mut cands) else { continue };
                if base >= need {
                    free.push(self.candidate(i, base));
                } else if let Some(o) = self.best_option(pre, i, window, need, &mut ending, &mut cands) {
                    options.push(o);
                }
            }
        }
        pre.work.set(pre.work.get() + work.get());
        (free, options)
    }

    /// The cheapest placement over the gathered nodes, and the victims it takes.
    fn pick(
        &self,
        pre: &Preempt<'a>,
        who: Who,
        (req, filter): (&Req, &Filter),
        window: (u64, u64),
        free: &[Candidate],
        options: Vec<NodeOption>,
    ) -> Option<(Vec<u32>, Vec<u32>)> {
        let want = req.nodes as usize;
        let multi = req.allow_multi_site;
        let picked = if want == 1 {
            if free.is_empty() {
                let best = options.iter().min_by(|a, b| (a.cost, &a.set, a.node).cmp(&(b.cost, &b.set, b.node)))?;
                (vec![best.node], best.set.clone())
            } else {
                // Leave alone, when it can, a node whose ending GPUs another pending job preempted for: that job
                // counted on the GPUs ending there beside its own victims, and taking those would make it
                // wait after all while its victims are killed.
                let clear: Vec<Candidate> =
                    free.iter().filter(|c| !pre.earmarked_elsewhere(c.node, who)).cloned().collect();
                let pool: &[Candidate] = if clear.is_empty() { free } else { &clear };
                (choose_nodes(pool, 1, multi)?, Vec::new())
            }
        } else {
            // The cheapest options (and every one with a multi-node victim, which may free several nodes) are
            // nearly always enough; all of them only when those hold no placement (e.g. sites apart).
            let keep = 8 * want + 64;
            let spans = |o: &NodeOption| o.set.iter().any(|&v| pre.victims[v as usize].nodes.len() > 1);
            if options.len() > keep {
                // Chosen by index and cloned after, not before: a 10k-node partition has thousands of options.
                // (Each node has one option, so (cost, node) orders them totally and the kept set is unique.)
                let (mut top, mut single): (Vec<usize>, Vec<usize>) =
                    (0..options.len()).partition(|&k| spans(&options[k]));
                single.select_nth_unstable_by(keep, |&a, &b| {
                    (options[a].cost, options[a].node).cmp(&(options[b].cost, options[b].node))
                });
                single.truncate(keep);
                top.extend(single);
                let mut top: Vec<NodeOption> = top.into_iter().map(|k| options[k].clone()).collect();
                top.sort_by_key(|o| o.node);
                match self.cover(pre, who, (req, filter), window, free, top) {
                    Some(found) => found,
                    None => self.cover(pre, who, (req, filter), window, free, options)?,
                }
            } else {
                self.cover(pre, who, (req, filter), window, free, options)?
            }
        };
        Some(picked)
    }

    /// Irredundant: drops the most expensive victim whose absence still leaves a placement, until none can go;
    /// the placement is chosen again when any went.
    fn trim(
        &self,
        pre: &Preempt<'a>,
        who: Who,
        (req, filter): (&Req, &Filter),
        free: &[Candidate],
        mut chosen: Vec<u32>,
        mut set: Vec<u32>,
    ) -> Option<(Vec<u32>, Vec<u32>)> {
        let want = req.nodes as usize;
        let p = who.p as usize;
        let touched: Vec<u32> = {
            let mut t: Vec<u32> = set.iter().flat_map(|&v| pre.victims[v as usize].nodes.iter().copied()).collect();
            t.sort_unstable();
            t.dedup();
            t
        };
        let mut free_nodes: Vec<u32> = free.iter().map(|c| c.node).collect();
        free_nodes.sort_unstable();
        let multi = req.allow_multi_site;
        // On one site, any `want` candidates hold a placement; otherwise ask the placement itself.
        let by_count = multi || self.part_one_site[p];
        let exists = |extra: &[Candidate]| {
            if by_count {
                free.len() + extra.len() >= want
            } else {
                choose_nodes(&[free, extra].concat(), want, multi).is_some()
            }
        };
        let mut dropped_any = false;
        loop {
            let mut by_cost = set.clone();
            by_cost.sort_by_key(|&v| std::cmp::Reverse(pre.order_key(v)));
            let mut dropped = false;
            for v in by_cost {
                let rest: Vec<u32> = set.iter().copied().filter(|&x| x != v).collect();
                if exists(&self.fitting_with(pre, who, (req, filter), &free_nodes, &touched, &rest)) {
                    set = rest;
                    dropped = true;
                    break;
                }
            }
            if !dropped {
                break;
            }
            dropped_any = true;
        }
        if dropped_any {
            let extra = self.fitting_with(pre, who, (req, filter), &free_nodes, &touched, &set);
            chosen = choose_nodes(&[free, &extra[..]].concat(), want, multi)?;
        }
        Some((chosen, set))
    }

    /// Node `i`'s cheapest smallest victim set among `cands` (one victim, the common case, without allocating
    /// more than the answer).
    fn best_option(
        &self,
        pre: &Preempt<'a>,
        i: u32,
        window: (u64, u64),
        need: i32,
        ending: &mut Vec<Early>,
        cands: &mut [OnNode],
    ) -> Option<NodeOption> {
        let n = &self.nodes[i as usize];
        let (set, have) = match *cands {
            [] => return None,
            [(v, e, g)] => {
                ending.push((e, g));
                let have = n.general.min_over_plus(window.0, window.1, ending);
                ending.pop();
                if have < need {
                    return None;
                }
                (vec![v], have)
            }
            _ => pre.best_on_node(n, window, need, ending, cands)?,
        };
        Some(NodeOption { node: i, cost: pre.cost(&set), set, have })
    }

    /// GPUs node `i` has over `window` for the job with the victims `gone` gone (besides what already ends for
    /// it); None if the node cannot host it at all.
    fn node_have(
        &self,
        pre: &Preempt<'a>,
        who: Who,
        (req, filter): (&Req, &Filter),
        window: (u64, u64),
        i: u32,
        gone: &[u32],
    ) -> Option<(i32, i32)> {
        let n = &self.nodes[i as usize];
        let need = Self::need_on(req, n);
        if !filter.admits(i, n) || n.total < need {
            return None;
        }
        let (mut extra, _) = pre.on_node(i, who);
        extra.extend(gone.iter().filter_map(|&v| pre.early_on(i, v)));
        Some((n.general.min_over_plus(window.0, window.1, &extra), need as i32))
    }

    /// Victims for a multi-node job, greedily like a set cover: each round adds the node option with the fewest
    /// new victims per node it makes fit (a multi-node victim can free several), then the cheapest, until the
    /// fitting nodes hold a placement. Options are re-priced when a chosen victim also frees their node.
    fn cover(
        &self,
        pre: &Preempt<'a>,
        who: Who,
        job: (&Req, &Filter),
        window: (u64, u64),
        free: &[Candidate],
        mut options: Vec<NodeOption>,
    ) -> Option<(Vec<u32>, Vec<u32>)> {
        let (req, _) = job;
        let (want, multi) = (req.nodes as usize, req.allow_multi_site);
        let mut gone: Vec<u32> = Vec::new();
        let slot: FxMap<u32, usize> = options.iter().enumerate().map(|(k, o)| (o.node, k)).collect();
        let by_count = multi || self.part_one_site[who.p as usize];
        loop {
            let fitted = options.iter().filter(|o| o.set.is_empty()).count();
            if !by_count || free.len() + fitted >= want {
                let mut cands: Vec<Candidate> = free.to_vec();
                cands.extend(options.iter().filter(|o| o.set.is_empty()).map(|o| self.candidate(o.node, o.have)));
                if let Some(chosen) = choose_nodes(&cands, want, multi) {
                    return Some((chosen, gone));
                }
            }
            // (victims, nodes gained, cost, set, node) of the best option so far.
            let mut best: Option<(usize, usize, Cost, usize)> = None;
            for (k, o) in options.iter().enumerate().filter(|(_, o)| !o.set.is_empty()) {
                let spans = o.set.iter().any(|&v| pre.victims[v as usize].nodes.len() > 1);
                let gained = if !spans {
                    1
                } else {
                    let mut with = gone.clone();
                    with.extend_from_slice(&o.set);
                    let mut nodes: Vec<u32> =
                        o.set.iter().flat_map(|&v| pre.victims[v as usize].nodes.iter().copied()).collect();
                    nodes.sort_unstable();
                    nodes.dedup();
                    nodes
                        .into_iter()
                        .filter(|&i| slot.get(&i).is_some_and(|&s| !options[s].set.is_empty()))
                        .filter(|&i| self.node_have(pre, who, job, window, i, &with).is_some_and(|(h, need)| h >= need))
                        .count()
                        .max(1)
                };
                let better = match best {
                    None => true,
                    Some((bv, bg, bc, bk)) => {
                        // Fewer victims per node gained (cross-multiplied), then cost, then set and node.
                        let (l, r) = (o.set.len() * bg, bv * gained);
                        l < r || (l == r && (o.cost, &o.set, o.node) < (bc, &options[bk].set, options[bk].node))
                    }
                };
                if better {
                    best = Some((o.set.len(), gained, o.cost, k));
                }
            }
            let (_, _, _, k) = best?;
            let added = std::mem::take(&mut options[k].set);
            gone.extend_from_slice(&added);
            // Re-price every option on a node the new victims free GPUs on.
            let mut nodes: Vec<u32> =
                added.iter().flat_map(|&v| pre.victims[v as usize].nodes.iter().copied()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            for i in nodes {
                let Some(&s) = slot.get(&i) else { continue };
                let n = &self.nodes[i as usize];
                let need = Self::need_on(req, n) as i32;
                let (mut ending, cands) = pre.on_node(i, who);
                ending.extend(gone.iter().filter_map(|&v| pre.early_on(i, v)));
                let mut cands: Vec<OnNode> = cands.into_iter().filter(|c| !gone.contains(&c.0)).collect();
                let base = n.general.min_over_plus(window.0, window.1, &ending);
                let o = &mut options[s];
                if base >= need {
                    (o.set, o.have, o.cost) = (Vec::new(), base, Cost::default());
                } else if let Some((set, have)) = pre.best_on_node(n, window, need, &ending, &mut cands) {
                    o.cost = pre.cost(&set);
                    (o.set, o.have) = (set, have);
                }
            }
        }
    }

    /// The nodes among `touched` (other than the `free` ones, sorted) that fit the job with exactly the victims
    /// `set` gone (besides what already ends for it).
    fn fitting_with(
        &self,
        pre: &Preempt<'a>,
        who: Who,
        (req, filter): (&Req, &Filter),
        free: &[u32],
        touched: &[u32],
        set: &[u32],
    ) -> Vec<Candidate> {
        let window = (pre.kill_at, pre.kill_at.saturating_add(req.time_limit_s));
        let mut out = Vec::new();
        for &i in touched {
            if free.binary_search(&i).is_ok() {
                continue;
            }
            let n = &self.nodes[i as usize];
            let need = Self::need_on(req, n);
            if !filter.admits(i, n) || n.total < need {
                continue;
            }
            let (mut extra, _) = pre.on_node(i, who);
            extra.extend(set.iter().filter_map(|&v| pre.early_on(i, v)));
            let have = n.general.min_over_plus(window.0, window.1, &extra);
            if have >= need as i32 {
                out.push(self.candidate(i, have));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{
        ClusterView, Partition, PartitionState, PendingJob, PreemptMode, PriorityWeights, Qos, SchedulerConfig,
    };
    use crate::plan::{Preemption, Reason};
    use crate::schedule;
    use crate::synth::{cluster, occupy};

    const NOW: u64 = 10_000;

    fn cfg() -> SchedulerConfig {
        let weights = PriorityWeights { age: 0, fairshare: 0, job_size: 0, partition: 0, qos: 0, ..Default::default() };
        SchedulerConfig { weights, ..SchedulerConfig::default() }
    }

    /// `nodes` × 8 GPUs, QOS "high" may preempt "normal".
    fn base(nodes: usize) -> ClusterView {
        let mut v = cluster(nodes, 8);
        v.now_s = NOW;
        let mut high = Qos::unlimited("high", 10);
        high.preempt = vec!["normal".into()];
        v.qos.push(high);
        v
    }

    /// A requeue-able normal-QOS job on `node` holding `gpus`, started at `start_s`, ending in a day.
    fn victim(v: &mut ClusterView, id: u64, node: usize, gpus: &[u32], start_s: u64, priority: u64) {
        occupy(v, id, node, gpus, start_s, 86_400);
        let r = v.running.last_mut().unwrap();
        r.requeueable = true;
        r.priority = priority;
    }

    fn high(id: u64, nodes: u32, gpus: u32) -> PendingJob {
        let mut j = PendingJob::simple(id, NOW, nodes, gpus, 3_600);
        j.qos = "high".into();
        j
    }

    fn pre(victim: u64, for_job: u64) -> Preemption {
        Preemption { victim, for_job }
    }

    /// Marks the plan's victims as the controller would: ending, for their preemptor.
    fn mark(v: &mut ClusterView, plan: &crate::Plan) {
        for p in &plan.preemptions {
            let r = v.running.iter_mut().find(|r| r.id == p.victim).unwrap();
            r.preempting = true;
            r.preempted_for = Some(p.for_job);
        }
    }

    #[test]
    fn cheapest_fewest_victims_and_a_reservation_at_kill_wait() {
        let mut v = base(2);
        // Node 0: two 4-GPU jobs; node 1: one 8-GPU job of higher priority.
        victim(&mut v, 100, 0, &[0, 1, 2, 3], 5_000, 1);
        victim(&mut v, 101, 0, &[4, 5, 6, 7], 6_000, 1);
        victim(&mut v, 102, 1, &(0..8).collect::<Vec<_>>(), 9_000, 50);
        v.pending.push(high(1, 1, 8));
        let plan = schedule(&v, &cfg()).unwrap();
        // One victim beats two, even of higher priority.
        assert_eq!(plan.preemptions, [pre(102, 1)]);
        assert_eq!(plan.reason_of(1), Some(Reason::Resources));
        assert_eq!(plan.expected_start_of(1), Some(NOW + 30));
        assert!(plan.starts.is_empty());

        // A 4-GPU job: one victim either way; the lowest priority, then the most recently started.
        v.pending = vec![high(2, 1, 4)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.preemptions, [pre(101, 2)]);
        v.running[1].priority = 2;
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.preemptions, [pre(100, 2)]);
    }

    #[test]
    fn who_may_be_preempted() {
        let mut v = base(1);
        v.qos.push(Qos::unlimited("other", 0));
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 1);
        v.pending.push(high(1, 1, 8));
        let preempted = |v: &ClusterView| !schedule(v, &cfg()).unwrap().preemptions.is_empty();
        assert!(preempted(&v));
        let mut w = v.clone();
        w.running[0].requeueable = false;
        assert!(!preempted(&w), "not requeue-able");
        let mut w = v.clone();
        w.running[0].qos = "other".into();
        assert!(!preempted(&w), "a QOS it may not preempt");
        let mut w = v.clone();
        w.running[0].qos = "high".into();
        w.qos[1].preempt.push("high".into());
        assert!(!preempted(&w), "a QOS never preempts itself");
        let mut w = v.clone();
        w.qos[0].preempt_exempt_time_s = Some(6_000);
        assert!(!preempted(&w), "started 5,000 s ago, exempt for 6,000 s");
        w.qos[0].preempt_exempt_time_s = Some(4_000);
        assert!(preempted(&w));
        let mut w = v.clone();
        w.pending[0].qos = "normal".into();
        assert!(!preempted(&w), "normal may not preempt");
        let mut w = v.clone();
        w.running[0].reservation = Some("r".into());
        assert!(!preempted(&w), "jobs inside an advance reservation are not victims");
        let off = SchedulerConfig { preemption: false, ..cfg() };
        assert!(schedule(&v, &off).unwrap().preemptions.is_empty());
        let mut w = v.clone();
        w.pending[0].held = true;
        assert!(!preempted(&w), "held");
        let mut w = v.clone();
        w.pending[0].gpus_per_node = 0;
        assert!(!preempted(&w), "no GPUs needed");
        let mut w = v.clone();
        w.qos[1].max_jobs_per_user = Some(0);
        assert!(!preempted(&w), "over a QOS limit");
        let mut w = v.clone();
        w.pending[0].gpu_type = Some("h100".into());
        assert!(!preempted(&w), "no node of its GPU type");
        // It ends by the time a victim would be gone: no preemption.
        let mut w = v.clone();
        w.running[0].time_limit_s = NOW + 20 - 5_000;
        assert!(!preempted(&w));
        assert_eq!(schedule(&w, &cfg()).unwrap().expected_start_of(1), Some(NOW + 20));
    }

    #[test]
    fn only_victims_on_nodes_it_can_use() {
        let mut v = base(3);
        v.nodes[0].gpu_type = Some("a100".into());
        v.nodes[1].gpu_type = Some("h100".into());
        v.nodes[2].gpu_type = Some("h100".into());
        v.nodes[2].features = vec!["ib".into()];
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0); // cheapest, wrong type
        victim(&mut v, 101, 1, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 5); // right type, no feature
        victim(&mut v, 102, 2, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 9);
        let mut j = high(1, 1, 8);
        j.gpu_type = Some("h100".into());
        v.pending.push(j.clone());
        assert_eq!(schedule(&v, &cfg()).unwrap().preemptions, [pre(101, 1)]);
        j.constraint = vec!["ib".into()];
        v.pending = vec![j];
        assert_eq!(schedule(&v, &cfg()).unwrap().preemptions, [pre(102, 1)]);
    }

    #[test]
    fn partition_tiers() {
        let mut v = base(2);
        v.qos.truncate(1);
        v.partitions = vec![
            Partition {
                name: "low".into(),
                max_time_s: None,
                priority_tier: 1,
                state: PartitionState::Up,
                preempt_mode: PreemptMode::Off,
            },
            Partition {
                name: "high".into(),
                max_time_s: None,
                priority_tier: 2,
                state: PartitionState::Up,
                preempt_mode: PreemptMode::Requeue,
            },
        ];
        for n in &mut v.nodes {
            n.partitions = vec!["low".into(), "high".into()];
        }
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0);
        victim(&mut v, 101, 1, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0);
        v.running[0].partition = "low".into();
        v.running[1].partition = "high".into();
        let mut j = PendingJob::simple(1, NOW, 1, 8, 100);
        j.partition = "high".into();
        let mut low = j.clone();
        low.id = 2;
        low.partition = "low".into();
        v.pending = vec![j, low];
        let plan = schedule(&v, &cfg()).unwrap();
        // Only the lower tier's job; the low partition's job preempts nobody.
        assert_eq!(plan.preemptions, [pre(100, 1)]);
        // Without Requeue on the high partition, nothing.
        v.partitions[1].preempt_mode = PreemptMode::Off;
        assert!(schedule(&v, &cfg()).unwrap().preemptions.is_empty());
    }

    #[test]
    fn next_pass_reserves_the_ending_gpus_without_preempting_again() {
        let mut v = base(2);
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0);
        victim(&mut v, 101, 1, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 1);
        // A big normal job ahead of the preemptor (older) that cannot preempt, and the preemptor.
        let mut big = PendingJob::simple(7, 0, 1, 8, 100);
        big.qos = "normal".into();
        v.pending = vec![big, high(1, 1, 8)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.preemptions, [pre(100, 1)]);
        let t1 = plan.expected_start_of(1);
        mark(&mut v, &plan);
        for step in [1, 10, 29] {
            v.now_s = NOW + step;
            let plan = schedule(&v, &cfg()).unwrap();
            assert!(plan.preemptions.is_empty(), "pass at +{step}: {:?}", plan.preemptions);
            assert_eq!(plan.expected_start_of(1), Some(v.now_s + 30));
            assert_eq!(plan.reason_of(1), Some(Reason::Resources));
            // The normal job ahead still waits for a natural end, not for the preempted GPUs.
            assert_eq!(plan.expected_start_of(7), Some(5_000 + 86_400));
        }
        assert_eq!(t1, Some(NOW + 30));
        // Without `preempted_for`, the GPUs still go to a job that may preempt, not to the normal job.
        for r in &mut v.running {
            r.preempted_for = None;
        }
        let plan = schedule(&v, &cfg()).unwrap();
        assert!(plan.preemptions.is_empty());
        assert_eq!(plan.expected_start_of(1), Some(v.now_s + 30));
        // With preemption off, ending jobs' GPUs are free at kill-wait for everyone.
        let off = SchedulerConfig { preemption: false, ..cfg() };
        let plan = schedule(&v, &off).unwrap();
        assert_eq!(plan.expected_start_of(7), Some(v.now_s + 30));
    }

    #[test]
    fn another_preemptor_does_not_take_gpus_ending_for_someone_else() {
        let mut v = base(2);
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0);
        victim(&mut v, 101, 1, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 1);
        v.pending = vec![high(1, 1, 8)];
        let plan = schedule(&v, &cfg()).unwrap();
        mark(&mut v, &plan);
        // A second preemptor arrives ahead of the first (older): it must preempt the other job, not take job
        // 1's GPUs.
        let mut first = high(2, 1, 8);
        first.submit_s = 0;
        v.pending.push(first);
        v.now_s += 5;
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.preemptions, [pre(101, 2)]);
        assert_eq!(plan.expected_start_of(1), Some(v.now_s + 30));
    }

    #[test]
    fn multi_node_victims_and_preemptors() {
        let mut v = base(4);
        // A 2-node victim on nodes 0-1 (one victim for two nodes) and single-node victims on 2 and 3.
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 9);
        v.running[0].alloc.push(("n00001".into(), (0..8).collect()));
        v.nodes[1].free_gpus.clear();
        victim(&mut v, 101, 2, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0);
        victim(&mut v, 102, 3, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 0);
        v.pending = vec![high(1, 2, 8)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.preemptions, [pre(100, 1)]);
        // A one-node job only needs one of the single-node jobs (cheaper than the big one).
        v.pending = vec![high(2, 1, 8)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.victims_of(2).len(), 1);
        assert!(plan.victims_of(2)[0] != 100);
        // A 3-node job: the 2-node victim plus one more.
        v.pending = vec![high(3, 3, 8)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.victims_of(3).len(), 2);
        assert!(plan.victims_of(3).contains(&100));
    }

    #[test]
    fn budget_and_partly_free_nodes() {
        let mut v = base(1);
        victim(&mut v, 100, 0, &[0, 1], 5_000, 0);
        victim(&mut v, 101, 0, &[2, 3], 5_000, 0);
        victim(&mut v, 102, 0, &[4, 5], 5_000, 0);
        // GPUs 6 and 7 are free: a 6-GPU job needs two victims.
        v.pending = vec![high(1, 1, 6)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.victims_of(1).len(), 2);
        let one = SchedulerConfig { max_preemptions: 1, ..cfg() };
        let plan = schedule(&v, &one).unwrap();
        assert!(plan.preemptions.is_empty());
        assert_eq!(plan.reason_of(1), Some(Reason::Resources));
        // The later preemptor gets nothing the first one's victims free.
        v.pending = vec![high(1, 1, 6), high(2, 1, 2)];
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.victims_of(1).len(), 2);
        assert_eq!(plan.victims_of(2).len(), 1);
    }

    #[test]
    fn views_configs_and_plans_from_before_preemption_still_load() {
        let mut v = base(1);
        victim(&mut v, 100, 0, &[0, 1, 2, 3, 4, 5, 6, 7], 5_000, 3);
        v.pending.push(high(1, 1, 8));
        let strip = |x: &mut serde_json::Value, keys: &[&str]| {
            for k in keys {
                x.as_object_mut().unwrap().remove(*k);
            }
        };
        let mut json = serde_json::to_value(&v).unwrap();
        for r in json["running"].as_array_mut().unwrap() {
            strip(r, &["partition", "requeueable", "priority", "preempting", "preempted_for"]);
        }
        for p in json["partitions"].as_array_mut().unwrap() {
            strip(p, &["preempt_mode"]);
        }
        for q in json["qos"].as_array_mut().unwrap() {
            strip(q, &["preempt", "preempt_exempt_time_s"]);
        }
        let old: ClusterView = serde_json::from_value(json).unwrap();
        let r = &old.running[0];
        assert!(r.partition.is_empty() && !r.requeueable && !r.preempting && r.preempted_for.is_none());
        assert_eq!(old.partitions[0].preempt_mode, PreemptMode::Off);
        assert!(old.qos.iter().all(|q| q.preempt.is_empty() && q.preempt_exempt_time_s.is_none()));
        let mut json = serde_json::to_value(SchedulerConfig::default()).unwrap();
        strip(&mut json, &["preemption", "kill_wait_s", "max_preemptions"]);
        assert_eq!(serde_json::from_value::<SchedulerConfig>(json).unwrap(), SchedulerConfig::default());
        let plan = schedule(&v, &cfg()).unwrap();
        assert_eq!(plan.preemptions, [pre(100, 1)]);
        let mut json = serde_json::to_value(&plan).unwrap();
        strip(&mut json, &["preemptions"]);
        assert!(serde_json::from_value::<crate::Plan>(json).unwrap().preemptions.is_empty());
    }

    #[test]
    fn deterministic_and_identical_without_configuration() {
        let v = crate::synth::bench_view(300, 3_000, 5);
        // Nothing configured: the same plan as with preemption off.
        let off = SchedulerConfig { preemption: false, ..cfg() };
        assert_eq!(schedule(&v, &cfg()).unwrap(), schedule(&v, &off).unwrap());
        let mut w = v.clone();
        let mut high = Qos::unlimited("high", 10);
        high.preempt = vec!["normal".into()];
        w.qos.push(high);
        for (i, r) in w.running.iter_mut().enumerate() {
            r.requeueable = i % 3 != 0;
            r.priority = (i % 7) as u64;
        }
        for j in w.pending.iter_mut().filter(|j| j.id % 5 == 0) {
            j.qos = "high".into();
        }
        let a = schedule(&w, &cfg()).unwrap();
        assert!(!a.preemptions.is_empty());
        assert!(a.preemptions.len() <= 64);
        assert_eq!(a, schedule(&w, &cfg()).unwrap());
    }
}

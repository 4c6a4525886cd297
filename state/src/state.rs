//! `State`: the in-memory part of the replicated state, and the deterministic `apply`.
//!
//! Active jobs (pending, running) live here; a job that reaches a terminal state is handed to the storage layer
//! as `Change::ArchiveJob` and leaves memory, so memory grows with the active queue, not with history.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::apply::goodput::GoodputTotals;
use crate::model::account::Account;
use crate::model::audit::{AUDIT_CAPACITY, AuditEntry};
use crate::model::fate::{Dependents, Fate};
use crate::model::job::DepState;
use crate::model::qos::{DEFAULT_QOS, Qos};
use crate::model::registry::Object;
use crate::model::reservation::Reservation;
use crate::model::role::{AdminLevel, RoleGrant};
use crate::thin_str::ThinStr;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Reply, Request, Response};
use crate::error::CommandError;
use crate::model::config::{ClusterConfig, Limit, PartitionUpdate};
use crate::model::job::{Job, JobId, JobState, StepEnd};
use crate::model::node::Node;
use crate::slurm_time::format_time_limit;

/// How many client request ids are remembered for deduplicating retried submissions. A client retries within
/// seconds; 100k covers minutes of submissions at full rate.
pub const DEDUP_CAPACITY: usize = 100_000;
/// Most `--dependency` entries one job may name.
pub const MAX_DEPENDENCIES: usize = 100;

/// What `validate_submit` resolves from a spec against the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub partition: String,
    pub time_limit_s: Option<u64>,
    pub account: String,
    pub qos: String,
    /// Node count and GPUs per node (`--gpus=N` spread over the fewest nodes).
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub gpus_per_node: u32,
    pub dependency_state: Vec<DepState>,
    /// Where its incarnations keep their checkpoints.
    pub checkpoint_root: String,
}

/// The small, always-written part of the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub format_version: u32,
    /// The next job id to hand out. Slurm starts at 1.
    pub next_job_id: JobId,
    pub config: Option<ClusterConfig>,
    /// Sequence numbers for the dedup table's FIFO eviction.
    pub next_dedup_seq: u64,
    /// `scontrol top` stamps: a later top ranks above an earlier one.
    #[serde(default)]
    pub next_top_rank: u64,
    /// The next audit entry's id (entries are numbered from 1).
    #[serde(default)]
    pub next_audit_id: u64,
    /// The cluster's goodput sums, updated as each incarnation ends (see `State::goodput_totals`).
    #[serde(default)]
    pub goodput: GoodputTotals,
    /// Since when `goodput` counts: the cluster's initialization, or for data written before it was kept, the
    /// first incarnation end after the upgrade (earlier ones are not in it).
    #[serde(default)]
    pub goodput_since_ms: Option<u64>,
    /// The cluster's active feature level (`feature`; 0, in data from before levels existed, is the base level).
    /// Left out of the record while at the base level, so a replica rolled back to a build from before feature
    /// levels still reads the meta of a cluster that never finalized an upgrade.
    #[serde(default, skip_serializing_if = "crate::feature::is_base")]
    pub feature_level: u32,
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            format_version: crate::FORMAT_VERSION,
            next_job_id: 1,
            config: None,
            next_dedup_seq: 0,
            next_top_rank: 0,
            next_audit_id: 1,
            goodput: GoodputTotals::default(),
            goodput_since_ms: None,
            feature_level: 0,
        }
    }
}

/// One record the storage layer must write, atomically with the others of the same entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Meta(Meta),
    /// An active job, inserted or updated.
    PutJob(Box<Job>),
    /// The script text, stored once per job at submit.
    PutScript {
        id: JobId,
        script: ThinStr,
    },
    /// The captured submit environment (`--export`), stored once per job at submit beside the script and, like
    /// it, kept out of the in-memory job: under `--export=ALL` it is the submitting shell's whole environment,
    /// often several KiB, which would be most of a pending job's memory. Only the launch reads it.
    PutEnvironment {
        id: JobId,
        environment: Vec<(String, String)>,
    },
    /// A job that became terminal: remove from the active table, add to the accounting history.
    ArchiveJob(Box<Job>),
    /// A node of a finished job reported what the job's tasks used there (after the job was archived, since a
    /// job ends when its batch node reports): add it to the job's history record, if that record is still of
    /// `incarnation` and has no figure from `usage.node` yet (`Job::record_node_usage`).
    AddNodeUsage {
        job_id: JobId,
        incarnation: u64,
        usage: crate::model::job::NodeUsage,
    },
    PutDedup {
        request_id: String,
        job_id: JobId,
        seq: u64,
    },
    DeleteDedup {
        request_id: String,
        seq: u64,
    },
    /// A node, inserted or updated (nodes are never deleted: a dead node stays DOWN with its reason).
    PutNode(Node),
    /// An account, QOS or reservation, inserted or updated; and one removed, by its key (`Object::key`).
    PutObject(Object),
    DeleteObject(String),
    /// An administrative change, appended to the audit log; and the oldest entry dropped, by id.
    PutAudit(AuditEntry),
    DeleteAudit(u64),
    /// A finished job requeued (`scontrol requeue` of a COMPLETED batch job): out of the accounting history, as
    /// the `PutJob` beside it makes it active again.
    UnarchiveJob(JobId),
}

/// What one `apply` produced: the answer for the proposer and the records to persist.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub response: Response,
    pub changes: Vec<Change>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    pub meta: Meta,
    /// Active jobs by id (ordered, so listings and snapshots are deterministic).
    pub jobs: BTreeMap<JobId, Box<Job>>,
    /// Registered nodes by name.
    pub nodes: BTreeMap<String, Node>,
    pub(crate) dedup: HashMap<String, JobId>,
    pub(crate) dedup_order: VecDeque<(u64, String)>,
    /// The fair-share tree (empty: no accounts defined, every job charges an implicit flat tree).
    pub accounts: BTreeMap<String, Account>,
    /// QOS by name (`normal` is implicit until defined).
    pub qos: BTreeMap<String, Qos>,
    pub reservations: BTreeMap<String, Reservation>,
    /// Operators and administrators by uid (everyone else is an ordinary user; root is always an administrator).
    pub roles: BTreeMap<u32, RoleGrant>,
    /// Active (pending or running) jobs per owner uid, for MaxSubmitJobs; derived from `jobs`.
    pub(crate) active_per_uid: HashMap<u32, u64>,
    /// Per job id, how many lingering holds (on any node, of any incarnation) it has; derived from `nodes`. A job
    /// listed here does not start: an earlier incarnation of it may still run somewhere.
    pub(crate) lingering_jobs: HashMap<JobId, u32>,
    /// Recent finished jobs' fates, for dependencies (see `dependents`).
    pub(crate) fates: BTreeMap<JobId, Fate>,
    pub(crate) dependents: Dependents,
}

/// Everything `State::restore` rebuilds the state from.
#[derive(Debug, Default)]
pub struct Records {
    pub meta: Meta,
    /// Boxed as the state holds them, so a restart moves each job once.
    pub jobs: Vec<Box<Job>>,
    pub nodes: Vec<Node>,
    /// Dedup entries in sequence order.
    pub dedup: Vec<(u64, String, JobId)>,
    pub objects: Vec<Object>,
    /// The newest finished jobs (at least the `FATE_CAPACITY` highest ids of the history, in any order).
    pub finished: Vec<Job>,
}

impl State {
    /// Rebuilds the state from persisted records (in any order of jobs; dedup entries in sequence order).
    pub fn restore(records: Records) -> State {
        let Records { meta, jobs, nodes, dedup, objects, finished } = records;
        let mut state = State { meta, ..State::default() };
        for node in nodes {
            for l in &node.lingering {
                *state.lingering_jobs.entry(l.job).or_default() += 1;
            }
            state.nodes.insert(node.info.name.clone(), node);
        }
        for job in &jobs {
            assert!(!job.state.is_terminal(), "restored active job {} is terminal", job.id);
            if job.state == JobState::Pending {
                state.index_dependencies(job);
            }
        }
        // Built in one go from the sorted jobs, the tree's nodes come out full: inserted one by one in id order,
        // every split left a half-empty node behind (about 15 MB more at a million jobs, and slower).
        state.jobs = jobs.into_iter().map(|job| (job.id, job)).collect();
        for job in state.jobs.values() {
            *state.active_per_uid.entry(job.spec.uid).or_default() += 1;
        }
        for (seq, request_id, job_id) in dedup {
            state.dedup.insert(request_id.clone(), job_id);
            state.dedup_order.push_back((seq, request_id));
        }
        for object in objects {
            state.put_object(object);
        }
        for job in finished {
            state.remember_fate(job.id, Fate::of(&job));
        }
        state
    }

    /// Every QOS, `normal` included even before anyone defines it (it always exists).
    pub fn all_qos(&self) -> Vec<Qos> {
        let mut all: Vec<Qos> = self.qos.values().cloned().collect();
        if !self.qos.contains_key(DEFAULT_QOS) {
            all.insert(0, Qos::normal());
        }
        all
    }

    fn put_object(&mut self, object: Object) {
        match object {
            Object::Account(a) => drop(self.accounts.insert(a.name.clone(), a)),
            Object::Qos(q) => drop(self.qos.insert(q.name.clone(), q)),
            Object::Reservation(r) => drop(self.reservations.insert(r.name.clone(), r)),
            Object::Role(g) => drop(self.roles.insert(g.uid, g)),
        }
    }

    /// Everything needed to rebuild this state with `restore` (tests and snapshots use it).
    pub fn records(&self) -> Records {
        Records {
            meta: self.meta.clone(),
            jobs: self.jobs.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            dedup: self.dedup_entries().map(|(s, r, j)| (s, r.to_string(), j)).collect(),
            objects: self
                .accounts
                .values()
                .cloned()
                .map(Object::Account)
                .chain(self.qos.values().cloned().map(Object::Qos))
                .chain(self.reservations.values().cloned().map(Object::Reservation))
                .chain(self.roles.values().cloned().map(Object::Role))
                .collect(),
            finished: Vec::new(),
        }
    }

    pub fn config(&self) -> Option<&ClusterConfig> {
        self.meta.config.as_ref()
    }

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id).map(|job| &**job)
    }

    /// Whether some node still holds an ended incarnation of job `id` (its tasks there not yet confirmed gone):
    /// the job's next incarnation waits for that, so that two incarnations of a job never run at once.
    pub fn earlier_incarnation_lingers(&self, id: JobId) -> bool {
        self.lingering_jobs.contains_key(&id)
    }

    /// The whole cluster's goodput: GPU time allocated to incarnations that ended, GPU time they lost to failures
    /// and to preemption, their counts, and the down time after failures (definitions in `crate::apply::goodput`).
    /// Kept in the replicated state and updated in `apply` as each incarnation ends, so reading it costs nothing
    /// (metrics, the web page); running incarnations are not in it until they end. Counted since
    /// [`State::goodput_since_ms`].
    pub fn goodput_totals(&self) -> &GoodputTotals {
        &self.meta.goodput
    }

    /// Since when [`State::goodput_totals`] counts (the leader's stamp); `None` until the first incarnation ends
    /// on a cluster upgraded from data that did not keep it.
    pub fn goodput_since_ms(&self) -> Option<u64> {
        self.meta.goodput_since_ms
    }

    /// Per account of the fair-share tree, the same sums as [`State::goodput_totals`], by account name. Only
    /// accounts defined with `sacctmgr`/`drover account` have them (with none defined, jobs charge an implicit
    /// `root` that keeps no record); `sreport cluster goodput` computes per-account figures for any time window
    /// from the job history instead.
    pub fn account_goodput(&self) -> impl Iterator<Item = (&str, &GoodputTotals)> {
        self.accounts.iter().map(|(name, a)| (name.as_str(), &a.goodput))
    }

    /// Dedup entries in eviction order, for snapshots.
    pub fn dedup_entries(&self) -> impl Iterator<Item = (u64, &str, JobId)> {
        self.dedup_order.iter().map(|(seq, id)| (*seq, id.as_str(), self.dedup[id]))
    }

    /// Applies one committed request. Deterministic: the same state and request give the same result on every
    /// replica. Refused commands change nothing and answer the error.
    pub fn apply(&mut self, request: &Request) -> Applied {
        let mut changes = Vec::new();
        let goodput_before = (self.meta.goodput, self.meta.goodput_since_ms);
        let response = match &request.command {
            Command::InitCluster { config } => Ok(self.init_cluster(config, request.time_ms, &mut changes)),
            Command::SubmitJob { spec, request_id } => {
                self.submit(spec, request_id.as_deref(), request.time_ms, &mut changes)
            }
            Command::CancelJobs { ids, by_uid } => {
                Ok(self.for_each_job(ids, |s, id| s.cancel(id, *by_uid, request.time_ms, &mut changes)))
            }
            Command::HoldJobs { ids, by_uid, user_hold } => {
                Ok(self.for_each_job(ids, |s, id| s.set_hold(id, Some(*user_hold), *by_uid, &mut changes)))
            }
            Command::ReleaseJobs { ids, by_uid } => {
                Ok(self.for_each_job(ids, |s, id| s.set_hold(id, None, *by_uid, &mut changes)))
            }
            Command::RegisterNode { info, running } => self.register_node(info, running, request.time_ms, &mut changes),
            Command::NodeDown { name, reason, epoch } => {
                self.node_down(name, reason, *epoch, request.time_ms, &mut changes)
            }
            Command::DrainNodes { names, drain, reason, by_uid, requeue_jobs } => self
                .require_level(*by_uid, AdminLevel::Operator, "draining or resuming nodes")
                .and_then(|()| self.drain_nodes(names, *drain, reason, request.time_ms, &mut changes))
                .inspect(|_| {
                    if *drain && *requeue_jobs {
                        names.iter().for_each(|n| self.requeue_jobs_on(n, reason, &mut changes));
                    }
                }),
            Command::ApplyPlan { allocations, reasons } => {
                self.apply_plan(allocations, reasons, request.time_ms, &mut changes)
            }
            Command::JobEnded { job_id, incarnation, end } => {
                self.job_ended(*job_id, *incarnation, end, request.time_ms, &mut changes)
            }
            Command::CreateStep { job_id, by_uid, step } => {
                self.create_step(*job_id, *by_uid, step.as_ref(), request.time_ms, &mut changes)
            }
            Command::EndStep { job_id, step_id, exit_code, signal, cancelled, by_uid } => {
                let end =
                    StepEnd { end_ms: request.time_ms, exit_code: *exit_code, signal: *signal, cancelled: *cancelled };
                self.end_step(*job_id, *step_id, end, *by_uid, &mut changes)
            }
            Command::UpdatePartition { update, by_uid } => self
                .require_level(*by_uid, AdminLevel::Administrator, "updating a partition")
                .and_then(|()| self.update_partition(update, &mut changes)),
            Command::Admin { op, by_uid } => self.admin(op, *by_uid, request.time_ms, &mut changes),
            Command::TopJobs { ids, by_uid } => Ok(self.for_each_job(ids, |s, id| s.top(id, *by_uid, &mut changes))),
            Command::SuspendJobs { ids, by_uid, suspend } => self
                .require_level(
                    *by_uid,
                    AdminLevel::Operator,
                    if *suspend { "suspending a job" } else { "resuming a job" },
                )
                .map(|()| {
                    self.for_each_job(ids, |s, id| s.suspend(id, *by_uid, *suspend, request.time_ms, &mut changes))
                }),
            Command::UpdateJob { id, by_uid, update } => {
                self.update_job(*id, *by_uid, update, &mut changes).map(|()| Reply::Nothing)
            }
            Command::RequeueJobs { ids, by_uid, hold } => {
                Ok(self.for_each_job(ids, |s, id| s.request_requeue(id, *by_uid, *hold, &mut changes)))
            }
            Command::RequeueFinished { job, by_uid, hold } => {
                let id = job.id;
                let result = self.requeue_finished(job, *by_uid, *hold, request.time_ms, &mut changes);
                Ok(Reply::Jobs(vec![crate::command::JobOutcome { id, result }]))
            }
            Command::PreemptJobs { victims, for_job } => self.preempt(victims, *for_job, &mut changes),
            Command::RecordCheckpoint { job_id, incarnation, path, step, by_uid } => {
                let checkpoint = crate::model::job::Checkpoint {
                    path: path.clone(),
                    step: *step,
                    incarnation: *incarnation,
                    time_ms: request.time_ms,
                };
                self.record_checkpoint(*job_id, checkpoint, *by_uid, &mut changes)
            }
            Command::RecordImage { job_id, incarnation, digest } => {
                self.record_image(*job_id, *incarnation, digest, &mut changes)
            }
            Command::RecordImageStore { node, summary } => self.record_image_store(node, summary, &mut changes),
            Command::ReleaseLingering { node, keys, usage } => self.release_lingering(node, keys, usage, &mut changes),
            Command::RecordAudit { by_uid, .. } => self
                .require_level(*by_uid, AdminLevel::Administrator, "recording an audit entry")
                .map(|()| Reply::Nothing),
            command @ (Command::RecordProgress { .. }
            | Command::JobHung { .. }
            | Command::GpuFault { .. }
            | Command::DrainGpus { .. }
            | Command::GpusReset { .. }
            | Command::InvalidateCheckpoint { .. }
            | Command::RebootNodes { .. }
            | Command::CancelReboot { .. }
            | Command::NodeRebooted { .. }) => self.apply_resilience(command, request.time_ms, &mut changes),
            Command::SetFeatureLevel { level, by_uid } => self
                .require_level(*by_uid, AdminLevel::Administrator, "finalizing an upgrade")
                .and_then(|()| self.set_feature_level(*level, &mut changes)),
        };
        debug_assert!(response.is_ok() || changes.is_empty(), "a refused command changed the state");
        if response.is_ok()
            && let Some((uid, action, detail)) = audited(&request.command)
        {
            self.audit(uid, action, detail, request.time_ms, &mut changes);
        }
        self.track_dependencies(&mut changes, request.time_ms);
        if (self.meta.goodput, self.meta.goodput_since_ms) != goodput_before {
            // Once per entry, however many incarnations ended in it (a node with many jobs going down), unless
            // the entry already wrote the meta as it is now.
            let written = changes.iter().rev().find_map(|c| if let Change::Meta(m) = c { Some(m) } else { None });
            if written != Some(&self.meta) {
                changes.push(Change::Meta(self.meta.clone()));
            }
        }
        Applied { response, changes }
    }

    /// The cluster's active feature level: what the log may carry (see `feature`).
    pub fn feature_level(&self) -> u32 {
        crate::feature::effective(self.meta.feature_level)
    }

    fn set_feature_level(&mut self, level: u32, changes: &mut Vec<Change>) -> Response {
        let active = self.feature_level();
        let refuse = |why: String| Err(CommandError::FeatureLevel { requested: level, why });
        if level < active {
            return refuse(format!("the cluster is already at level {active}, and a finalized level never goes back"));
        }
        if level > crate::feature::LEVEL {
            // The leader asked every member first; the store stops a replica before it applies a level its build
            // does not know, so every replica that gets here decides alike.
            return refuse(format!("this build understands levels up to {}", crate::feature::LEVEL));
        }
        if level > active {
            self.meta.feature_level = level;
            changes.push(Change::Meta(self.meta.clone()));
        }
        Ok(Reply::Nothing)
    }

    /// A node's agent reported what its container image store holds.
    fn record_image_store(
        &mut self,
        node: &str,
        summary: &crate::model::node::ImageStoreSummary,
        changes: &mut Vec<Change>,
    ) -> Response {
        let entry = self.nodes.get_mut(node).ok_or_else(|| CommandError::InvalidNodeName { name: node.to_string() })?;
        if entry.image_store != Some(*summary) {
            entry.image_store = Some(*summary);
            changes.push(Change::PutNode(entry.clone()));
        }
        Ok(Reply::Nothing)
    }

    /// The commands of hang detection, GPU faults and drains, checkpoint fallback and reboots (`apply` for them).
    fn apply_resilience(&mut self, command: &Command, now_ms: u64, changes: &mut Vec<Change>) -> Response {
        match command {
            Command::RecordProgress { job_id, incarnation, step, by_uid } => {
                self.record_progress(*job_id, *incarnation, *step, *by_uid, now_ms, changes)
            }
            Command::JobHung { job_id, incarnation } => self.job_hung(*job_id, *incarnation, now_ms, changes),
            Command::GpuFault { node, fault } => self.gpu_fault(node, fault, now_ms, changes),
            Command::DrainGpus { node, gpus, drain, reason, by_uid } => {
                self.may_drain_gpus(*by_uid).and_then(|()| self.drain_gpus(node, gpus, *drain, reason, now_ms, changes))
            }
            Command::GpusReset { node, gpus } => self.gpus_reset(node, gpus, changes),
            Command::InvalidateCheckpoint { job_id, path, by_uid } => {
                self.invalidate_checkpoint(*job_id, path.as_deref(), *by_uid, changes)
            }
            Command::RebootNodes { names, asap, next_state, reason, by_uid } => self
                .require_level(*by_uid, AdminLevel::Operator, "rebooting nodes")
                .and_then(|()| self.reboot_nodes(names, *asap, *next_state, reason, *by_uid, now_ms, changes)),
            Command::CancelReboot { names, by_uid } => self
                .require_level(*by_uid, AdminLevel::Operator, "cancelling node reboots")
                .and_then(|()| self.cancel_reboot(names, changes)),
            Command::NodeRebooted { node, id } => self.node_rebooted(node, *id, now_ms, changes),
            _ => unreachable!("apply routes only these commands here"),
        }
    }

    /// Checks a command against this state without changing it, so the leader can refuse bad input with no log
    /// entry. Submissions get the full submit checks; administrative commands are tried on a copy of the small
    /// part of the state they change (configuration, nodes, registry: never the job table), so a check that
    /// needs the jobs (an account still in use) is left to `apply`, which decides on the state it commits on.
    pub fn precheck(&self, command: &Command, now_ms: u64) -> Result<(), CommandError> {
        match command {
            Command::SubmitJob { spec, .. } => self.validate_submit(spec).map(drop),
            Command::UpdatePartition { .. }
            | Command::Admin { .. }
            | Command::DrainNodes { .. }
            | Command::DrainGpus { .. }
            | Command::RebootNodes { .. }
            | Command::CancelReboot { .. }
            | Command::SetFeatureLevel { .. }
            | Command::RecordAudit { .. } => {
                let mut trial = State {
                    meta: self.meta.clone(),
                    nodes: self.nodes.clone(),
                    accounts: self.accounts.clone(),
                    qos: self.qos.clone(),
                    reservations: self.reservations.clone(),
                    roles: self.roles.clone(),
                    ..State::default()
                };
                trial.apply(&Request { time_ms: now_ms, command: command.clone() }).response.map(drop)
            }
            _ => Ok(()),
        }
    }

    /// The caller's administrative level: root is always an administrator.
    pub fn level_of(&self, uid: u32) -> AdminLevel {
        if uid == 0 {
            return AdminLevel::Administrator;
        }
        self.roles.get(&uid).map_or(AdminLevel::None, |g| g.level)
    }

    /// Refuses unless `uid` holds at least `needed`.
    pub fn require_level(&self, uid: u32, needed: AdminLevel, what: &str) -> Result<(), CommandError> {
        if self.level_of(uid) >= needed {
            return Ok(());
        }
        Err(CommandError::NotAuthorized { uid, what: what.to_string(), needed })
    }

    /// Appends an audit entry (and drops the oldest beyond the capacity).
    fn audit(&mut self, uid: u32, action: &str, detail: String, now_ms: u64, changes: &mut Vec<Change>) {
        let id = self.meta.next_audit_id.max(1);
        self.meta.next_audit_id = id + 1;
        let detail = AuditEntry::bounded_detail(detail);
        changes.push(Change::PutAudit(AuditEntry { id, time_ms: now_ms, uid, action: action.to_string(), detail }));
        if id > AUDIT_CAPACITY {
            changes.push(Change::DeleteAudit(id - AUDIT_CAPACITY));
        }
        changes.push(Change::Meta(self.meta.clone()));
    }

    /// Adds an active job, keeping the per-owner count.
    /// Jobs are boxed in the table: a B-tree leaf then holds 11 pointers rather than 11 whole jobs, which with
    /// ids arriving in order (every leaf split leaves the old leaf about half full) doubled a pending job's memory.
    pub(crate) fn insert_active(&mut self, job: Box<Job>) {
        *self.active_per_uid.entry(job.spec.uid).or_default() += 1;
        if let Some(old) = self.jobs.insert(job.id, job) {
            self.forget_owner(old.spec.uid);
        }
    }

    /// Removes an active job (it ends, or is replaced), keeping the per-owner count.
    pub(crate) fn remove_active(&mut self, id: JobId) -> Option<Box<Job>> {
        let job = self.jobs.remove(&id)?;
        self.forget_owner(job.spec.uid);
        Some(job)
    }

    fn forget_owner(&mut self, uid: u32) {
        if let Some(count) = self.active_per_uid.get_mut(&uid) {
            *count -= 1;
            if *count == 0 {
                self.active_per_uid.remove(&uid);
            }
        }
    }

    /// Active jobs owned by `uid`.
    pub fn active_jobs_of(&self, uid: u32) -> u64 {
        self.active_per_uid.get(&uid).copied().unwrap_or(0)
    }

    fn init_cluster(&mut self, config: &ClusterConfig, now_ms: u64, changes: &mut Vec<Change>) -> Reply {
        if self.meta.config.is_some() {
            return Reply::Initialized { already: true };
        }
        self.meta.config = Some(config.clone().normalized());
        self.meta.next_job_id = self.meta.next_job_id.max(config.first_job_id);
        self.meta.goodput_since_ms = Some(now_ms);
        changes.push(Change::Meta(self.meta.clone()));
        Reply::Initialized { already: false }
    }

    fn update_partition(&mut self, update: &PartitionUpdate, changes: &mut Vec<Change>) -> Response {
        let config = self.meta.config.as_mut().ok_or(CommandError::NotInitialized)?;
        let known = config.partitions.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(",");
        let Some(index) = config.partitions.iter().position(|p| p.name == update.name) else {
            return Err(CommandError::InvalidPartition { name: update.name.clone(), known });
        };
        if let Some(nodes) = &update.nodes {
            crate::hostlist::expand_hostlist(nodes)
                .map_err(|e| CommandError::InvalidRequest(format!("Nodes={nodes}: {e}")))?;
        }
        let p = &mut config.partitions[index];
        let new_max = update.max_time_s.map_or(p.max_time_s, Limit::value);
        if let (Some(Limit::At(default)), Some(max)) = (update.default_time_s, new_max)
            && default > max
        {
            return Err(CommandError::InvalidRequest(format!(
                "DefaultTime {} exceeds MaxTime {}",
                format_time_limit(Some(default)),
                format_time_limit(Some(max))
            )));
        }
        if let Some(state) = update.state {
            p.state = state;
        }
        if let Some(nodes) = &update.nodes {
            p.nodes = nodes.clone();
        }
        if let Some(v) = update.max_time_s {
            p.max_time_s = v.value();
        }
        if let Some(v) = update.default_time_s {
            p.default_time_s = v.value();
        }
        if let Some(v) = update.max_nodes {
            p.max_nodes = v.value();
        }
        if let Some(v) = update.max_gpus_per_job {
            p.max_gpus_per_job = v.value();
        }
        if let Some(v) = update.priority_tier {
            p.priority_tier = v;
        }
        let all = |list: &Vec<String>| {
            if list.iter().any(|a| a.eq_ignore_ascii_case("ALL")) { Vec::new() } else { list.clone() }
        };
        if let Some(v) = &update.allow_accounts {
            p.allow_accounts = all(v);
        }
        if let Some(v) = &update.allow_qos {
            p.allow_qos = all(v);
        }
        if let Some(mode) = update.preempt_mode {
            p.preempt_mode = mode;
        }
        if update.make_default {
            for (i, other) in config.partitions.iter_mut().enumerate() {
                other.default = i == index;
            }
        }
        changes.push(Change::Meta(self.meta.clone()));
        Ok(Reply::Nothing)
    }
}

/// Which committed commands enter the audit log, by whom, and how they are described.
fn audited(command: &Command) -> Option<(u32, &str, String)> {
    let json = |v: &dyn erased::Json| v.to_json();
    match command {
        Command::UpdatePartition { update, by_uid } => Some((*by_uid, "update_partition", json(update))),
        Command::DrainNodes { names, drain, reason, by_uid, .. } => {
            let action = if *drain { "drain_nodes" } else { "resume_nodes" };
            Some((*by_uid, action, format!("nodes={} reason={reason:?}", names.join(","))))
        }
        Command::DrainGpus { node, gpus, drain, reason, by_uid } => {
            let action = if *drain { "drain_gpus" } else { "return_gpus" };
            Some((*by_uid, action, format!("node={node} gpus={gpus:?} reason={reason:?}")))
        }
        Command::RebootNodes { names, asap, next_state, reason, by_uid } => Some((
            *by_uid,
            "reboot_nodes",
            format!("nodes={} asap={asap} nextstate={next_state:?} reason={reason:?}", names.join(",")),
        )),
        Command::CancelReboot { names, by_uid } => {
            Some((*by_uid, "cancel_reboot", format!("nodes={}", names.join(","))))
        }
        Command::InvalidateCheckpoint { job_id, path, by_uid } => {
            Some((*by_uid, "invalidate_checkpoint", format!("job={job_id} path={path:?}")))
        }
        Command::Admin { op, by_uid } => Some((*by_uid, op.kind(), json(op))),
        Command::RecordAudit { by_uid, action, detail } => Some((*by_uid, action.as_str(), detail.clone())),
        Command::SetFeatureLevel { level, by_uid } => Some((*by_uid, "finalize_upgrade", format!("level={level}"))),
        _ => None,
    }
}

/// JSON for audit details without making `audited` generic over each payload type.
mod erased {
    pub trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Partition, PartitionState};
    use crate::model::job::{JobSpec, PendingReason};

    fn request(time_ms: u64, command: Command) -> Request {
        Request { time_ms, command }
    }

    fn initialized() -> State {
        let mut state = State::default();
        let config = ClusterConfig {
            partitions: vec![
                Partition { max_time_s: Some(3600), max_nodes: Some(4), ..Partition::fallback() },
                Partition {
                    name: "closed".into(),
                    default: false,
                    state: PartitionState::Drain,
                    ..Partition::fallback()
                },
            ],
            ..ClusterConfig::default()
        };
        state.apply(&request(1, Command::InitCluster { config }));
        state
    }

    fn spec(uid: u32) -> Box<JobSpec> {
        Box::new(JobSpec {
            name: "train".into(),
            user: "alice".into(),
            uid,
            script: "#!/bin/bash\necho hi\n".into(),
            min_nodes: 1,
            max_nodes: 1,
            cpus_per_task: 1,
            ..JobSpec::default()
        })
    }

    fn submit(state: &mut State, time_ms: u64, spec: Box<JobSpec>, rid: Option<&str>) -> Response {
        state.apply(&request(time_ms, Command::SubmitJob { spec, request_id: rid.map(str::to_string) })).response
    }

    #[test]
    fn submissions_get_sequential_ids_and_the_leaders_time() {
        let mut state = initialized();
        assert_eq!(submit(&mut state, 100, spec(1000), None), Ok(Reply::Submitted { job_id: 1, duplicate: false }));
        assert_eq!(submit(&mut state, 200, spec(1000), None), Ok(Reply::Submitted { job_id: 2, duplicate: false }));
        let job = state.job(2).unwrap();
        assert_eq!(job.submit_time_ms, 200);
        assert_eq!(job.state, JobState::Pending);
        assert_eq!(job.partition, "gpu");
        assert_eq!(job.time_limit_s, Some(3600), "no --time takes the partition's limit");
        assert!(job.spec.script.is_empty(), "the script is stored apart from the in-memory job");
    }

    #[test]
    fn the_submit_environment_is_stored_once_beside_the_script_not_in_the_job() {
        let mut state = initialized();
        let environment: Vec<(String, String)> = vec![("PATH".into(), "/usr/bin".into()), ("HOME".into(), "/h".into())];
        let mut job_spec = spec(1000);
        job_spec.environment = environment.clone().into();
        job_spec.array = Some(crate::model::job::ArraySpec { task_ids: vec![0, 1, 2].into(), max_running: None });
        let applied = state.apply(&request(5, Command::SubmitJob { spec: job_spec, request_id: None }));
        assert_eq!(applied.response, Ok(Reply::Submitted { job_id: 1, duplicate: false }));
        let stored: Vec<&Change> =
            applied.changes.iter().filter(|c| matches!(c, Change::PutEnvironment { .. })).collect();
        assert_eq!(stored, [&Change::PutEnvironment { id: 1, environment }], "once per array, under its id");
        for id in 1..=3 {
            let job = state.job(id).unwrap();
            assert!(job.spec.environment.is_empty(), "job {id} holds no copy of the environment");
            assert_eq!(job.script_id(), 1);
        }
        // A job submitted with no environment (`--export=NONE` captures none) stores nothing.
        let applied = state.apply(&request(6, Command::SubmitJob { spec: spec(1000), request_id: None }));
        assert!(!applied.changes.iter().any(|c| matches!(c, Change::PutEnvironment { .. })));
    }

    #[test]
    fn a_retried_submission_returns_the_first_id_and_creates_nothing() {
        let mut state = initialized();
        submit(&mut state, 1, spec(1), Some("req-a")).unwrap();
        let again = state.apply(&request(2, Command::SubmitJob { spec: spec(1), request_id: Some("req-a".into()) }));
        assert_eq!(again.response, Ok(Reply::Submitted { job_id: 1, duplicate: true }));
        assert!(again.changes.is_empty());
        assert_eq!(state.jobs.len(), 1);
    }

    #[test]
    fn refused_submissions_change_nothing_and_say_why() {
        let mut state = initialized();
        let before = state.clone();
        let mut bad = spec(1);
        bad.partition = Some("nope".into());
        let err = submit(&mut state, 1, bad, None).unwrap_err();
        assert!(err.to_string().contains("invalid partition name specified: \"nope\""), "{err}");
        let mut long = spec(1);
        long.time_limit_s = Some(7200);
        let err = submit(&mut state, 1, long, None).unwrap_err();
        assert!(err.to_string().contains("exceeds partition gpu's MaxTime of 1:00:00"), "{err}");
        let mut wide = spec(1);
        wide.min_nodes = 5;
        wide.max_nodes = 5;
        assert!(matches!(submit(&mut state, 1, wide, None), Err(CommandError::TooManyNodes { .. })));
        let mut closed = spec(1);
        closed.partition = Some("closed".into());
        assert!(matches!(submit(&mut state, 1, closed, None), Err(CommandError::PartitionClosed { .. })));
        let mut huge = spec(1);
        huge.script = "#".repeat(5 * 1024 * 1024).into();
        assert!(matches!(submit(&mut state, 1, huge, None), Err(CommandError::ScriptTooLarge { .. })));
        assert_eq!(state, before);
    }

    #[test]
    fn submit_before_init_is_refused() {
        let mut state = State::default();
        assert_eq!(submit(&mut state, 1, spec(1), None), Err(CommandError::NotInitialized));
    }

    #[test]
    fn cancel_archives_the_job_and_checks_the_owner() {
        let mut state = initialized();
        submit(&mut state, 1, spec(1000), None).unwrap();
        let denied = state.apply(&request(2, Command::CancelJobs { ids: vec![1], by_uid: 2000 }));
        assert!(matches!(
            &denied.response,
            Ok(Reply::Jobs(o)) if matches!(o[0].result, Err(CommandError::PermissionDenied { .. }))
        ));
        let done = state.apply(&request(3, Command::CancelJobs { ids: vec![1, 99], by_uid: 1000 }));
        let Ok(Reply::Jobs(outcomes)) = done.response else { panic!() };
        assert_eq!(outcomes[0].result, Ok(()));
        assert_eq!(outcomes[1].result, Err(CommandError::InvalidJobId { id: 99 }));
        assert!(state.job(1).is_none());
        let Change::ArchiveJob(archived) = &done.changes[0] else { panic!() };
        assert_eq!((archived.state, archived.end_time_ms), (JobState::Cancelled, Some(3)));
        let again = state.apply(&request(4, Command::CancelJobs { ids: vec![1], by_uid: 0 }));
        assert!(
            matches!(&again.response, Ok(Reply::Jobs(o)) if o[0].result == Err(CommandError::AlreadyFinished { id: 1 }))
        );
    }

    #[test]
    fn hold_and_release_set_the_reason() {
        let mut state = initialized();
        submit(&mut state, 1, spec(7), None).unwrap();
        state.apply(&request(2, Command::HoldJobs { ids: vec![1], by_uid: 7, user_hold: Some(false) }));
        assert_eq!(state.job(1).unwrap().reason, PendingReason::JobHeldUser);
        state.apply(&request(3, Command::ReleaseJobs { ids: vec![1], by_uid: 0 }));
        assert!(!state.job(1).unwrap().held);
    }

    /// Finding 4 of the node-security review: the owner's own `hold` turned an administrator's hold into a user
    /// hold, which the owner then released.
    #[test]
    fn an_owner_cannot_turn_an_administrators_hold_into_their_own() {
        let mut state = initialized();
        submit(&mut state, 1, spec(7), None).unwrap();
        state
            .apply(&request(2, Command::HoldJobs { ids: vec![1], by_uid: 0, user_hold: Some(false) }))
            .response
            .unwrap();
        assert_eq!(state.job(1).unwrap().reason, PendingReason::JobHeldAdmin);
        state.apply(&request(3, Command::HoldJobs { ids: vec![1], by_uid: 7, user_hold: Some(false) }));
        assert_eq!(state.job(1).unwrap().reason, PendingReason::JobHeldAdmin, "still the administrator's hold");
        let released = state.apply(&request(4, Command::ReleaseJobs { ids: vec![1], by_uid: 7 })).response;
        assert!(
            matches!(&released, Ok(Reply::Jobs(o)) if matches!(o[0].result, Err(CommandError::AdminHold { id: 1 }))),
            "the owner released an administrator's hold: {released:?}"
        );
        assert!(state.job(1).unwrap().held);
        state.apply(&request(5, Command::ReleaseJobs { ids: vec![1], by_uid: 0 })).response.unwrap();
        assert!(!state.job(1).unwrap().held);
    }

    #[test]
    fn a_partition_changes_at_run_time_and_bad_updates_change_nothing() {
        let mut state = initialized();
        let down = PartitionUpdate { name: "gpu".into(), state: Some(PartitionState::Drain), ..Default::default() };
        state.apply(&request(2, Command::UpdatePartition { update: down, by_uid: 0 })).response.unwrap();
        assert!(matches!(submit(&mut state, 3, spec(1), None), Err(CommandError::PartitionClosed { .. })));
        let before = state.clone();
        let bad = PartitionUpdate { name: "nope".into(), ..Default::default() };
        assert!(state.apply(&request(4, Command::UpdatePartition { update: bad, by_uid: 0 })).response.is_err());
        let bad = PartitionUpdate { name: "gpu".into(), nodes: Some("gpu[1-".into()), ..Default::default() };
        assert!(state.apply(&request(5, Command::UpdatePartition { update: bad, by_uid: 0 })).response.is_err());
        assert_eq!(state, before);
        let open = PartitionUpdate {
            name: "gpu".into(),
            state: Some(PartitionState::Up),
            max_time_s: Some(Limit::Unlimited),
            make_default: true,
            ..Default::default()
        };
        state.apply(&request(6, Command::UpdatePartition { update: open, by_uid: 0 })).response.unwrap();
        let mut long = spec(1);
        long.time_limit_s = Some(30 * 24 * 3600);
        assert!(submit(&mut state, 7, long, None).is_ok(), "MaxTime is UNLIMITED now");
    }

    /// The defect that took the whole cluster down: this update was committed unchecked and `apply` panicked on
    /// every replica, and again on each restart. It must be a refusal that changes nothing.
    #[test]
    fn a_malformed_partition_nodelist_is_refused_not_a_crash() {
        let mut state = initialized();
        let before = state.clone();
        let bad = PartitionUpdate { name: "gpu".into(), nodes: Some("][".into()), ..Default::default() };
        let refused = state.apply(&request(2, Command::UpdatePartition { update: bad, by_uid: 0 })).response;
        assert!(matches!(&refused, Err(CommandError::InvalidRequest(m)) if m.contains("Nodes=][")), "{refused:?}");
        assert_eq!(state, before);
    }

    #[test]
    fn init_cluster_happens_once() {
        let mut state = initialized();
        let second = state.apply(&request(9, Command::InitCluster { config: ClusterConfig::default() }));
        assert_eq!(second.response, Ok(Reply::Initialized { already: true }));
        assert!(second.changes.is_empty());
        assert!(state.config().unwrap().partition("closed").is_some());
    }

    #[test]
    fn the_dedup_table_is_bounded() {
        let mut state = initialized();
        for i in 0..(DEDUP_CAPACITY + 10) {
            let mut changes = Vec::new();
            state.remember_request(&format!("r{i}"), i as u64, &mut changes);
        }
        assert_eq!(state.dedup.len(), DEDUP_CAPACITY);
        assert!(!state.dedup.contains_key("r0"));
        assert!(state.dedup.contains_key(&format!("r{}", DEDUP_CAPACITY + 9)));
    }

    #[test]
    fn restore_gives_back_an_equal_state() {
        let mut state = initialized();
        for i in 0..5 {
            submit(&mut state, i, spec(1), Some(&format!("req{i}"))).unwrap();
        }
        let restored = State::restore(state.records());
        assert_eq!(restored, state);
    }
}

//! `State`: the in-memory part of the replicated state, and the deterministic `apply`.
//!
//! Active jobs (pending, running) live here; a job that reaches a terminal state is handed to the storage layer
//! as `Change::ArchiveJob` and leaves memory, so memory grows with the active queue, not with history.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::account::{Account, ROOT_ACCOUNT};
use crate::audit::{AUDIT_CAPACITY, AuditEntry};
use crate::fate::{Dependents, Fate};
use crate::goodput::GoodputTotals;
use crate::job::{ArrayTask, DepState};
use crate::qos::{DEFAULT_QOS, Qos};
use crate::registry::Object;
use crate::reservation::Reservation;
use crate::role::{AdminLevel, RoleGrant};
use crate::thin_str::ThinStr;

use serde::{Deserialize, Serialize};

use crate::command::{Command, JobOutcome, Reply, Request, Response};
use crate::config::{ClusterConfig, Limit, PartitionUpdate};
use crate::error::CommandError;
use crate::job::{Job, JobId, JobSpec, JobState, PendingReason, StepEnd};
use crate::node::Node;
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
        usage: crate::job::NodeUsage,
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
    dedup: HashMap<String, JobId>,
    dedup_order: VecDeque<(u64, String)>,
    /// The fair-share tree (empty: no accounts defined, every job charges an implicit flat tree).
    pub accounts: BTreeMap<String, Account>,
    /// QOS by name (`normal` is implicit until defined).
    pub qos: BTreeMap<String, Qos>,
    pub reservations: BTreeMap<String, Reservation>,
    /// Operators and administrators by uid (everyone else is an ordinary user; root is always an administrator).
    pub roles: BTreeMap<u32, RoleGrant>,
    /// Active (pending or running) jobs per owner uid, for MaxSubmitJobs; derived from `jobs`.
    active_per_uid: HashMap<u32, u64>,
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
    /// and to preemption, their counts, and the down time after failures (definitions in `crate::goodput`).
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
            Command::HoldJobs { ids, by_uid } => {
                Ok(self.for_each_job(ids, |s, id| s.set_hold(id, true, *by_uid, &mut changes)))
            }
            Command::ReleaseJobs { ids, by_uid } => {
                Ok(self.for_each_job(ids, |s, id| s.set_hold(id, false, *by_uid, &mut changes)))
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
            Command::UpdateJob { id, by_uid, update } => {
                self.update_job(*id, *by_uid, update, &mut changes).map(|()| Reply::Nothing)
            }
            Command::RequeueJobs { ids, by_uid, hold } => {
                Ok(self.for_each_job(ids, |s, id| s.request_requeue(id, *by_uid, *hold, &mut changes)))
            }
            Command::PreemptJobs { victims, for_job } => self.preempt(victims, *for_job, &mut changes),
            Command::RecordCheckpoint { job_id, incarnation, path, step, by_uid } => {
                let checkpoint = crate::job::Checkpoint {
                    path: path.clone(),
                    step: *step,
                    incarnation: *incarnation,
                    time_ms: request.time_ms,
                };
                self.record_checkpoint(*job_id, checkpoint, *by_uid, &mut changes)
            }
            Command::ReleaseLingering { node, keys, usage } => self.release_lingering(node, keys, usage, &mut changes),
            Command::RecordAudit { by_uid, .. } => self
                .require_level(*by_uid, AdminLevel::Administrator, "recording an audit entry")
                .map(|()| Reply::Nothing),
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

    /// Checks a submission against the configuration and limits without changing anything, and resolves what
    /// the spec leaves open. The leader calls it before proposing (to answer bad requests without a log entry);
    /// `apply` calls it again, authoritatively.
    pub fn validate_submit(&self, spec: &JobSpec) -> Result<Resolved, CommandError> {
        self.validate_job(spec, self.level_of(spec.uid) >= AdminLevel::Operator)
    }

    /// The submit checks; `any_qos`: the job may use any QOS its partition allows (an operator's choice).
    fn validate_job(&self, spec: &JobSpec, any_qos: bool) -> Result<Resolved, CommandError> {
        let config = self.config().ok_or(CommandError::NotInitialized)?;
        let tasks = check_sizes(spec, &config.limits)?;
        self.check_request(spec, config, tasks)?;
        let partition = match &spec.partition {
            Some(name) => config.partition(name).ok_or_else(|| CommandError::InvalidPartition {
                name: name.to_string(),
                known: config.partitions.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(","),
            })?,
            None => config.default_partition(),
        };
        if !partition.state.accepts_jobs() {
            return Err(CommandError::PartitionClosed { name: partition.name.clone(), state: partition.state });
        }
        let (min_nodes, gpus_per_node, time_limit_s) = self.check_partition_limits(spec, partition)?;
        let account = self.resolve_account(spec, partition)?;
        let qos = self.resolve_qos(spec, partition, &account, any_qos, time_limit_s)?;
        self.admits_to_reservation(spec, &account)?;
        let mut sized = spec.clone();
        sized.min_nodes = min_nodes;
        sized.max_nodes = spec.max_nodes.max(min_nodes);
        sized.gpus_per_node = gpus_per_node;
        self.check_satisfiable(&sized, &partition.name)?;
        let dependency_state = self.judge_submission(&spec.dependency)?;
        let submit_dir = if spec.submit_dir.is_empty() { &spec.work_dir } else { &spec.submit_dir };
        let checkpoint_root = config.checkpoint_root(partition, submit_dir);
        Ok(Resolved {
            checkpoint_root,
            partition: partition.name.clone(),
            time_limit_s,
            account,
            qos,
            min_nodes,
            max_nodes: sized.max_nodes,
            gpus_per_node,
            dependency_state,
        })
    }

    /// What the request asks of the cluster and its submitter: room in the queue, sane counts, and the rights a
    /// negative nice or a root job need. `tasks` is how many jobs it makes (an array's task count).
    fn check_request(&self, spec: &JobSpec, config: &ClusterConfig, tasks: u64) -> Result<(), CommandError> {
        let limits = &config.limits;
        if self.jobs.len() as u64 + tasks > limits.max_active_jobs {
            return Err(CommandError::TooManyJobs { active: self.jobs.len() as u64 });
        }
        if spec.min_nodes == 0 || spec.max_nodes < spec.min_nodes {
            return Err(CommandError::InvalidRequest(format!(
                "node count {}-{} is not a valid range",
                spec.min_nodes, spec.max_nodes
            )));
        }
        if spec.cpus_per_task == 0 || spec.ntasks == Some(0) || spec.ntasks_per_node == Some(0) {
            return Err(CommandError::InvalidRequest("task and cpu counts must be at least 1".to_string()));
        }
        if spec.nice < 0 && self.level_of(spec.uid) < AdminLevel::Operator {
            return Err(CommandError::InvalidRequest(format!(
                "--nice={}: only an operator or administrator may raise a job's priority with a negative nice",
                spec.nice
            )));
        }
        if spec.uid == 0 && !config.allow_root_jobs {
            return Err(CommandError::InvalidRequest(
                "jobs may not run as root on this cluster; submit as an ordinary user (an administrator can allow it with allow_root_jobs = true in [cluster])".to_string(),
            ));
        }
        let active = self.active_jobs_of(spec.uid);
        if active + tasks > limits.max_jobs_per_user {
            return Err(CommandError::TooManyUserJobs {
                user: spec.user.to_string(),
                active,
                limit: limits.max_jobs_per_user,
            });
        }
        spec.check_bounds().map_err(CommandError::InvalidRequest)?;
        if spec.dependency.len() > MAX_DEPENDENCIES {
            return Err(CommandError::DependencyProblem(format!("at most {MAX_DEPENDENCIES} dependencies per job")));
        }
        Ok(())
    }

    /// The partition's node, GPU and time limits against the request: the node count and GPUs per node once
    /// `--gpus` is spread, and the time limit the job gets.
    fn check_partition_limits(
        &self,
        spec: &JobSpec,
        partition: &crate::config::Partition,
    ) -> Result<(u32, u32, Option<u64>), CommandError> {
        let (min_nodes, gpus_per_node) = self.spread_gpus(spec, &partition.name)?;
        if let Some(max) = partition.max_nodes
            && min_nodes > max
        {
            return Err(CommandError::TooManyNodes { requested: min_nodes, partition: partition.name.clone(), max });
        }
        let gpus = u64::from(min_nodes) * u64::from(gpus_per_node);
        if let Some(max) = partition.max_gpus_per_job
            && gpus > u64::from(max)
        {
            return Err(CommandError::NodeConfigUnavailable(format!(
                "{gpus} GPUs requested, over partition {}'s MaxTRESPerJob of gres/gpu={max}",
                partition.name
            )));
        }
        let time_limit_s = spec.time_limit_s.or(partition.default_time_s).or(partition.max_time_s);
        if let Some(max) = partition.max_time_s {
            let requested = time_limit_s.unwrap_or(u64::MAX);
            if requested > max {
                return Err(CommandError::TimeLimitExceeded {
                    requested: format_time_limit(time_limit_s),
                    partition: partition.name.clone(),
                    max: format_time_limit(Some(max)),
                });
            }
        }
        Ok((min_nodes, gpus_per_node, time_limit_s))
    }

    /// `--reservation`: it exists and admits the user or the job's account.
    fn admits_to_reservation(&self, spec: &JobSpec, account: &str) -> Result<(), CommandError> {
        let Some(name) = &spec.reservation else { return Ok(()) };
        let invalid = |why: String| CommandError::InvalidReservation { name: name.to_string(), why };
        let r = self.reservations.get(&**name).ok_or_else(|| invalid("no such reservation".to_string()))?;
        if !r.admits(&spec.user, account) {
            return Err(invalid(format!("Access denied: neither user {} nor account {account} may use it", spec.user)));
        }
        Ok(())
    }

    /// `--gpus=N` without `--nodes`: as few nodes as the partition's largest node allows, the GPUs spread evenly.
    fn spread_gpus(&self, spec: &JobSpec, partition: &str) -> Result<(u32, u32), CommandError> {
        let Some(total) = spec.gpus_total else { return Ok((spec.min_nodes, spec.gpus_per_node)) };
        let largest = self
            .nodes
            .values()
            .filter(|n| self.node_in_partition(&n.info, partition))
            .filter(|n| spec.gpu_type.as_ref().is_none_or(|t| n.info.gpu_type.eq_ignore_ascii_case(t)))
            .map(|n| n.info.gpus.len() as u32)
            .max()
            .unwrap_or(0);
        if total == 0 || largest == 0 {
            return Ok((spec.min_nodes, total));
        }
        let nodes = total.div_ceil(largest).max(spec.min_nodes);
        if total % nodes != 0 {
            return Err(CommandError::NodeConfigUnavailable(format!(
                "--gpus={total} cannot be spread evenly over {nodes} nodes of at most {largest} GPUs in partition {partition}; use --nodes with --gpus-per-node"
            )));
        }
        Ok((nodes, total / nodes))
    }

    /// The account a job charges: `--account`, else the first account listing the user, else `root`. Once
    /// accounts are defined, the account must exist and admit the user, and the partition must allow it.
    fn resolve_account(&self, spec: &JobSpec, partition: &crate::config::Partition) -> Result<String, CommandError> {
        let default = || {
            let listed =
                self.accounts.values().find(|a| a.name != ROOT_ACCOUNT && a.users.iter().any(|u| *u == spec.user));
            listed.map_or_else(|| ROOT_ACCOUNT.to_string(), |a| a.name.clone())
        };
        let account = spec.account.as_deref().map_or_else(default, str::to_string);
        let invalid = |why: String| CommandError::InvalidAccount { name: account.clone(), why };
        if !self.accounts.is_empty() {
            match self.accounts.get(&account) {
                None => return Err(invalid("no such account (drover account list shows them)".to_string())),
                Some(a) if !a.admits(&spec.user) => {
                    return Err(invalid(format!("user {} is not a member of it", spec.user)));
                }
                Some(_) => {}
            }
        }
        if !partition.allow_accounts.is_empty() && !partition.allow_accounts.contains(&account) {
            return Err(invalid(format!(
                "partition {} allows only accounts {}",
                partition.name,
                partition.allow_accounts.join(",")
            )));
        }
        Ok(account)
    }

    /// The nearest account from `account` up to root for which `has` holds (the tree is acyclic; the walk is
    /// bounded all the same).
    fn nearest_account(&self, account: &str, has: impl Fn(&Account) -> bool) -> Option<&Account> {
        let mut at = self.accounts.get(account);
        for _ in 0..=crate::account::MAX_ACCOUNTS {
            let a = at?;
            if has(a) {
                return Some(a);
            }
            at = a.parent.as_deref().and_then(|p| self.accounts.get(p));
        }
        None
    }

    /// The QOS jobs charging `account` may use: Slurm's association `QOS=` list, inherited down the account tree;
    /// `normal` alone where no account up to root lists any (as Slurm's root association starts). An operator's
    /// jobs may use any QOS.
    pub fn allowed_qos(&self, account: &str) -> Vec<String> {
        self.nearest_account(account, |a| !a.qos.is_empty())
            .map_or_else(|| vec![DEFAULT_QOS.to_string()], |a| a.qos.clone())
    }

    /// The QOS of a job charging `account` that names none: Slurm's `DefaultQOS`, inherited; else `normal`.
    pub fn default_qos(&self, account: &str) -> String {
        self.nearest_account(account, |a| !a.default_qos.is_empty())
            .map_or_else(|| DEFAULT_QOS.to_string(), |a| a.default_qos.clone())
    }

    /// The job's QOS: `--qos`, else its account's default. It must exist, be one the partition allows and, unless
    /// `any_qos` (an operator asks), one the job's account allows: a QOS that preempts others or lifts limits is
    /// an administrator's grant, not a user's choice.
    fn resolve_qos(
        &self,
        spec: &JobSpec,
        partition: &crate::config::Partition,
        account: &str,
        any_qos: bool,
        time_limit_s: Option<u64>,
    ) -> Result<String, CommandError> {
        let name = spec.qos.as_deref().map_or_else(|| self.default_qos(account), str::to_string);
        let invalid = |why: String| CommandError::InvalidQos { name: name.clone(), why };
        let qos = self.qos_named(&name).ok_or_else(|| invalid("no such QOS".to_string()))?;
        if !any_qos {
            let allowed = self.allowed_qos(account);
            if !allowed.contains(&name) {
                return Err(invalid(format!(
                    "account {account} allows only QOS {} (an administrator grants more: drover account modify {account} --qos ...)",
                    allowed.join(",")
                )));
            }
        }
        if !partition.allow_qos.is_empty() && !partition.allow_qos.contains(&name) {
            return Err(invalid(format!(
                "partition {} allows only QOS {}",
                partition.name,
                partition.allow_qos.join(",")
            )));
        }
        if let Some(max) = qos.max_wall_s
            && time_limit_s.is_none_or(|t| t > max)
        {
            return Err(invalid(format!(
                "time limit {} exceeds its MaxWall of {}",
                format_time_limit(time_limit_s),
                format_time_limit(Some(max))
            )));
        }
        Ok(name)
    }

    fn submit(&mut self, spec: &JobSpec, request_id: Option<&str>, now_ms: u64, changes: &mut Vec<Change>) -> Response {
        if let Some(rid) = request_id
            && let Some(&job_id) = self.dedup.get(rid)
        {
            return Ok(Reply::Submitted { job_id, duplicate: true });
        }
        let resolved = self.validate_submit(spec)?;
        let first = self.meta.next_job_id;
        let mut stored_spec = spec.clone();
        let script = std::mem::take(&mut stored_spec.script);
        let environment = std::mem::take(&mut stored_spec.environment);
        stored_spec.min_nodes = resolved.min_nodes;
        stored_spec.max_nodes = resolved.max_nodes;
        stored_spec.gpus_per_node = resolved.gpus_per_node;
        // Each task is its own job; the task list itself is not copied into every one of them.
        let array = stored_spec.array.take();
        let tasks: Vec<Option<Box<ArrayTask>>> = match &array {
            None => vec![None],
            Some(a) => {
                let (task_min, task_max) = (a.task_ids[0], *a.task_ids.last().expect("checked non-empty"));
                let task_count = a.task_ids.len() as u32;
                a.task_ids
                    .iter()
                    .map(|&task_id| {
                        let max_running = a.max_running;
                        Some(Box::new(ArrayTask {
                            array_job_id: first,
                            task_id,
                            task_count,
                            task_min,
                            task_max,
                            max_running,
                        }))
                    })
                    .collect()
            }
        };
        changes.push(Change::PutScript { id: first, script });
        if !environment.is_empty() {
            changes.push(Change::PutEnvironment { id: first, environment: environment.to_vec() });
        }
        for (offset, array) in tasks.into_iter().enumerate() {
            let id = first + offset as u64;
            let job = Box::new(Job {
                id,
                spec: stored_spec.clone(),
                partition: resolved.partition.as_str().into(),
                time_limit_s: resolved.time_limit_s,
                state: JobState::Pending,
                reason: if spec.hold { PendingReason::JobHeldUser } else { PendingReason::None },
                held: spec.hold,
                submit_time_ms: now_ms,
                account: resolved.account.as_str().into(),
                qos: resolved.qos.as_str().into(),
                checkpoint_root: resolved.checkpoint_root.as_str().into(),
                array,
                dependency_state: resolved.dependency_state.clone().into(),
                ..Job::default()
            });
            self.index_dependencies(&job);
            changes.push(Change::PutJob(job.clone()));
            self.insert_active(job);
        }
        self.meta.next_job_id = first + array.map_or(1, |a| a.task_ids.len() as u64);
        if let Some(rid) = request_id {
            self.remember_request(rid, first, changes);
        }
        changes.push(Change::Meta(self.meta.clone()));
        Ok(Reply::Submitted { job_id: first, duplicate: false })
    }

    fn remember_request(&mut self, request_id: &str, job_id: JobId, changes: &mut Vec<Change>) {
        let seq = self.meta.next_dedup_seq;
        self.meta.next_dedup_seq += 1;
        self.dedup.insert(request_id.to_string(), job_id);
        self.dedup_order.push_back((seq, request_id.to_string()));
        changes.push(Change::PutDedup { request_id: request_id.to_string(), job_id, seq });
        while self.dedup_order.len() > DEDUP_CAPACITY {
            let (old_seq, old_id) = self.dedup_order.pop_front().expect("len checked above");
            self.dedup.remove(&old_id);
            changes.push(Change::DeleteDedup { request_id: old_id, seq: old_seq });
        }
    }

    fn for_each_job(
        &mut self,
        ids: &[JobId],
        mut op: impl FnMut(&mut State, JobId) -> Result<(), CommandError>,
    ) -> Reply {
        Reply::Jobs(ids.iter().map(|&id| JobOutcome { id, result: op(self, id) }).collect())
    }

    /// The job for an operation, or why there is none: finished (archived) ids are below the counter.
    pub(crate) fn active_job(&self, id: JobId, by_uid: u32) -> Result<&Job, CommandError> {
        let Some(job) = self.jobs.get(&id) else {
            if id > 0 && id < self.meta.next_job_id {
                return Err(CommandError::AlreadyFinished { id });
            }
            return Err(CommandError::InvalidJobId { id });
        };
        if by_uid != job.spec.uid && self.level_of(by_uid) < AdminLevel::Operator {
            return Err(CommandError::PermissionDenied { id, owner: job.spec.uid, requester: by_uid });
        }
        Ok(job)
    }

    fn cancel(&mut self, id: JobId, by_uid: u32, now_ms: u64, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        match job.state {
            // Already ending: a cancel wins over a requeue in progress (the job will not come back).
            JobState::Completing if job.ending.is_none() => {
                self.cancel_running(id, by_uid, changes);
                return Ok(());
            }
            JobState::Completing => return Ok(()),
            JobState::Pending => {}
            _ => {
                self.cancel_running(id, by_uid, changes);
                return Ok(());
            }
        }
        let mut job = self.remove_active(id).expect("checked by active_job");
        job.state = JobState::Cancelled;
        job.reason = PendingReason::None;
        job.end_time_ms = Some(now_ms);
        job.cancelled_by = Some(by_uid);
        changes.push(Change::ArchiveJob(job));
        Ok(())
    }

    /// `scontrol update jobid=...` on a pending job: the changed request goes through the submit checks again.
    /// As in Slurm, only root may raise a time limit (or lift it); anyone may lower their own.
    fn update_job(
        &mut self,
        id: JobId,
        by_uid: u32,
        update: &crate::command::JobUpdate,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        if job.state != JobState::Pending {
            return Err(CommandError::NotPending { id, state: job.state });
        }
        let mut spec = job.spec.clone();
        let new_limit = if update.time_unlimited { Some(None) } else { update.time_limit_s.map(Some) };
        if let Some(limit) = new_limit {
            let raises = match (limit, job.time_limit_s) {
                (None, Some(_)) => true,
                (Some(new), Some(old)) => new > old,
                _ => false,
            };
            if raises && self.level_of(by_uid) < AdminLevel::Operator {
                return Err(CommandError::InvalidRequest(format!(
                    "job {id}: only an operator or administrator may raise a time limit (lowering it is allowed)"
                )));
            }
            spec.time_limit_s = limit;
        }
        if let Some(nice) = update.nice {
            spec.nice = nice;
        }
        if let Some(qos) = &update.qos {
            spec.qos = Some(qos.clone().into());
        }
        if let Some((deps, any)) = &update.dependency {
            if deps.iter().any(|d| d.job == id) {
                return Err(CommandError::DependencyProblem(format!("job {id} cannot depend on itself")));
            }
            spec.dependency = deps.clone().into();
            spec.dependency_any = *any;
        }
        // The checks see one job fewer: this one is being replaced, not added.
        let mut resolved = {
            let old = self.remove_active(id).expect("checked by active_job");
            // A QOS the job already had stays (an administrator may have granted it); a new one must be allowed.
            let any_qos = update.qos.is_none()
                || self.level_of(by_uid) >= AdminLevel::Operator
                || self.level_of(spec.uid) >= AdminLevel::Operator;
            let checked = self.validate_job(&spec, any_qos);
            self.insert_active(old);
            checked?
        };
        // The submit checks give a job without --time the partition's default; UNLIMITED asked for explicitly must
        // fit under the partition's MaxTime and the QOS's MaxWall instead.
        if new_limit == Some(None) {
            let partition = self.config().and_then(|c| c.partition(&resolved.partition));
            let qos_wall = self.qos_named(&resolved.qos).and_then(|q| q.max_wall_s);
            if let Some(max) = partition.and_then(|p| p.max_time_s).or(qos_wall) {
                return Err(CommandError::TimeLimitExceeded {
                    requested: "UNLIMITED".to_string(),
                    partition: resolved.partition,
                    max: format_time_limit(Some(max)),
                });
            }
            resolved.time_limit_s = None;
        }
        let old_targets: Vec<JobId> = self.jobs[&id].spec.dependency.iter().map(|d| d.job).collect();
        self.unindex(id, &old_targets);
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.spec = spec;
        job.time_limit_s = resolved.time_limit_s;
        job.qos = resolved.qos.into();
        job.dependency_state = resolved.dependency_state.into();
        let job = job.clone();
        self.index_dependencies(&job);
        changes.push(Change::PutJob(job));
        Ok(())
    }

    /// `scontrol top`: the job moves ahead of its owner's other pending jobs (and only those).
    fn top(&mut self, id: JobId, by_uid: u32, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        if job.state != JobState::Pending {
            return Err(CommandError::NotPending { id, state: job.state });
        }
        self.meta.next_top_rank += 1;
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.top_rank = self.meta.next_top_rank;
        changes.push(Change::PutJob(job.clone()));
        changes.push(Change::Meta(self.meta.clone()));
        Ok(())
    }

    /// `scontrol hold`/`release`. A hold placed by an operator on someone else's job is an administrator's hold
    /// (Slurm's `JobHeldAdmin`), which its owner cannot release.
    fn set_hold(&mut self, id: JobId, hold: bool, by_uid: u32, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        let job = self.active_job(id, by_uid)?;
        if job.state != JobState::Pending {
            return Err(CommandError::NotPending { id, state: job.state });
        }
        let privileged = self.level_of(by_uid) >= AdminLevel::Operator;
        if !hold && job.reason == PendingReason::JobHeldAdmin && !privileged {
            return Err(CommandError::AdminHold { id });
        }
        // A hold never lowers one already there: the owner's `hold` on an administrator's hold (placed by
        // `hold` or `requeuehold`) would otherwise turn it into a user hold the owner may release.
        let admin_hold = (by_uid != job.spec.uid && privileged) || job.reason == PendingReason::JobHeldAdmin;
        let job = self.jobs.get_mut(&id).expect("checked by active_job");
        job.held = hold;
        job.reason = match (hold, admin_hold) {
            (false, _) => PendingReason::None,
            (true, true) => PendingReason::JobHeldAdmin,
            (true, false) => PendingReason::JobHeldUser,
        };
        changes.push(Change::PutJob(job.clone()));
        Ok(())
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
        Command::Admin { op, by_uid } => Some((*by_uid, op.kind(), json(op))),
        Command::RecordAudit { by_uid, action, detail } => Some((*by_uid, action.as_str(), detail.clone())),
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

/// The request's size against the cluster's limits (script, environment, array), and how many jobs it makes.
fn check_sizes(spec: &JobSpec, limits: &crate::config::Limits) -> Result<u64, CommandError> {
    let script_bytes = spec.script.len() as u64;
    if script_bytes > limits.max_script_bytes {
        return Err(CommandError::ScriptTooLarge { size_bytes: script_bytes, limit_bytes: limits.max_script_bytes });
    }
    let env_bytes: u64 = spec.environment.iter().map(|(k, v)| (k.len() + v.len() + 2) as u64).sum();
    if env_bytes > limits.max_environment_bytes {
        return Err(CommandError::EnvironmentTooLarge {
            size_bytes: env_bytes,
            limit_bytes: limits.max_environment_bytes,
        });
    }
    let Some(array) = &spec.array else { return Ok(1) };
    let max = limits.max_array_size;
    if array.task_ids.is_empty() {
        return Err(CommandError::InvalidRequest("--array names no task ids".to_string()));
    }
    if let Some(id) = array.task_ids.iter().find(|&&id| id >= max) {
        return Err(CommandError::InvalidRequest(format!(
            "--array task id {id} is not below the cluster's MaxArraySize of {max}"
        )));
    }
    if !array.task_ids.windows(2).all(|w| w[0] < w[1]) {
        return Err(CommandError::InvalidRequest("--array task ids must be sorted and unique".into()));
    }
    if array.max_running == Some(0) {
        return Err(CommandError::InvalidRequest("--array's %N limit must be at least 1".into()));
    }
    Ok(array.task_ids.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Partition, PartitionState};

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
        job_spec.array = Some(crate::job::ArraySpec { task_ids: vec![0, 1, 2].into(), max_running: None });
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
        state.apply(&request(2, Command::HoldJobs { ids: vec![1], by_uid: 7 }));
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
        state.apply(&request(2, Command::HoldJobs { ids: vec![1], by_uid: 0 })).response.unwrap();
        assert_eq!(state.job(1).unwrap().reason, PendingReason::JobHeldAdmin);
        state.apply(&request(3, Command::HoldJobs { ids: vec![1], by_uid: 7 }));
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

//! Stories for the replicated registry (accounts, QOS, reservations), job arrays, dependencies and `top`,
//! through `State::apply` alone: no network, no disk, no clock.

use drover_state::{
    AccountUpdate, AdminOp, Allocation, ArraySpec, ClusterConfig, Command, CommandError, DepState, Dependency,
    DependencyKind, GpuInfo, JobEnd, JobSpec, JobState, JobUpdate, NodeAllocation, NodeInfo, Qos, Reply, Request,
    Reservation, State,
};

fn at(time_ms: u64, command: Command) -> Request {
    Request { time_ms, command }
}

fn cluster() -> State {
    let mut state = State::default();
    state.apply(&at(0, Command::InitCluster { config: ClusterConfig::default() }));
    for name in ["n1", "n2"] {
        let info = NodeInfo {
            name: name.into(),
            cpus: 64,
            gpus: (0..8).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
            ..NodeInfo::default()
        };
        state.apply(&at(1, Command::RegisterNode { info, running: Vec::new() })).response.unwrap();
    }
    state
}

fn spec(user: &str) -> JobSpec {
    JobSpec {
        name: "train".into(),
        user: user.into(),
        uid: 1000,
        script: "#!/bin/sh\n".into(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        gpus_per_node: 1,
        time_limit_s: Some(600),
        ..JobSpec::default()
    }
}

fn submit(state: &mut State, spec: JobSpec) -> Result<u64, CommandError> {
    match state.apply(&at(10, Command::SubmitJob { spec: Box::new(spec), request_id: None })).response? {
        Reply::Submitted { job_id, .. } => Ok(job_id),
        other => panic!("{other:?}"),
    }
}

fn admin(state: &mut State, op: AdminOp) -> Result<Reply, CommandError> {
    let before = state.clone();
    let result = state.apply(&at(20, Command::Admin { op, by_uid: 0 })).response;
    if result.is_err() {
        assert_eq!(*state, before, "a refused admin command changed the state");
    }
    result
}

fn start(state: &mut State, id: u64, node: &str, gpu: u32, time_ms: u64) {
    let allocation = Allocation {
        job_id: id,
        nodes: vec![NodeAllocation { node: node.into(), gpus: vec![gpu], cpus: 1, tasks: 1, mem_mb: 0 }],
    };
    let applied = state.apply(&at(time_ms, Command::ApplyPlan { allocations: vec![allocation], reasons: vec![] }));
    assert!(matches!(applied.response, Ok(Reply::Planned { ref started, .. }) if started == &vec![id]));
}

fn end(state: &mut State, id: u64, exit_code: i32, time_ms: u64) {
    let end = JobEnd { exit_code, ..JobEnd::default() };
    state.apply(&at(time_ms, Command::JobEnded { job_id: id, incarnation: 0, end })).response.unwrap();
}

#[test]
fn accounts_form_a_tree_that_submissions_must_respect() {
    let mut state = cluster();
    // Before any account exists, anything goes (no accounting enforcement, like Slurm without slurmdbd).
    assert!(submit(&mut state, JobSpec { account: Some("whatever".into()), ..spec("alice") }).is_ok());
    let add = |name: &str, parent: Option<&str>, users: &[&str]| {
        AdminOp::AddAccount(AccountUpdate {
            name: name.into(),
            parent: parent.map(str::to_string),
            shares: Some(2),
            add_users: users.iter().map(|u| u.to_string()).collect(),
            ..AccountUpdate::default()
        })
    };
    admin(&mut state, add("physics", None, &["alice"])).unwrap();
    admin(&mut state, add("lattice", Some("physics"), &[])).unwrap();
    assert!(state.accounts.contains_key("root"), "the root is created with the first account");
    let err = admin(&mut state, add("x", Some("nope"), &[])).unwrap_err();
    assert!(err.to_string().contains("nope: no such account"), "{err}");
    let cycle = AdminOp::ModifyAccount(AccountUpdate {
        name: "physics".into(),
        parent: Some("lattice".into()),
        ..AccountUpdate::default()
    });
    assert!(admin(&mut state, cycle).unwrap_err().to_string().contains("cannot become its parent"));
    // Now accounts are enforced: unknown accounts and non-members are refused; the default is the user's account.
    let err = submit(&mut state, JobSpec { account: Some("whatever".into()), ..spec("alice") }).unwrap_err();
    assert!(err.to_string().starts_with("Invalid account or account/partition combination specified"), "{err}");
    let err = submit(&mut state, JobSpec { account: Some("physics".into()), ..spec("bob") }).unwrap_err();
    assert!(err.to_string().contains("user bob is not a member"), "{err}");
    let id = submit(&mut state, spec("alice")).unwrap();
    assert_eq!(state.job(id).unwrap().account, "physics");
    let err = admin(&mut state, AdminOp::DeleteAccount("physics".into())).unwrap_err();
    assert!(err.to_string().contains("child account lattice"), "{err}");
    // Non-root may not change the tree.
    let denied = state.apply(&at(30, Command::Admin { op: add("chem", None, &[]), by_uid: 1000 }));
    assert!(matches!(denied.response, Err(CommandError::NotAuthorized { .. })));
}

#[test]
fn finished_gpu_time_is_charged_to_the_account_with_decay() {
    let mut state = cluster();
    let op = AdminOp::AddAccount(AccountUpdate { name: "ml".into(), ..AccountUpdate::default() });
    admin(&mut state, op).unwrap();
    let id = submit(&mut state, JobSpec { account: Some("ml".into()), ..spec("alice") }).unwrap();
    start(&mut state, id, "n1", 0, 1_000_000);
    end(&mut state, id, 0, 1_000_000 + 3_600_000);
    let ml = &state.accounts["ml"];
    // One GPU for an hour with a 7-day half-life: just under 3600 GPU-seconds.
    assert!(ml.usage_gpu_s > 3_590.0 && ml.usage_gpu_s < 3_600.0, "{}", ml.usage_gpu_s);
    assert_eq!(ml.usage_at_s, 1_000 + 3_600);
}

#[test]
fn qos_and_partition_allow_lists_are_checked_at_submit() {
    let mut state = cluster();
    let err = submit(&mut state, JobSpec { qos: Some("high".into()), ..spec("alice") }).unwrap_err();
    assert_eq!(err.to_string(), "Invalid qos specification: high: no such QOS");
    let qos = Qos { name: "high".into(), priority: 100, max_wall_s: Some(300), ..Qos::default() };
    admin(&mut state, AdminOp::PutQos { qos, create: true }).unwrap();
    let err = submit(&mut state, JobSpec { qos: Some("high".into()), ..spec("alice") }).unwrap_err();
    assert!(err.to_string().contains("account root allows only QOS normal"), "{err}");
    let grant =
        AccountUpdate { name: "root".into(), qos: Some(vec!["normal".into(), "high".into()]), ..Default::default() };
    admin(&mut state, AdminOp::ModifyAccount(grant)).unwrap();
    let err = submit(&mut state, JobSpec { qos: Some("high".into()), ..spec("alice") }).unwrap_err();
    assert!(err.to_string().contains("exceeds its MaxWall of 5:00"), "{err}");
    let ok = JobSpec { qos: Some("high".into()), time_limit_s: Some(300), ..spec("alice") };
    let id = submit(&mut state, ok).unwrap();
    assert_eq!(state.job(id).unwrap().qos, "high");
    assert!(admin(&mut state, AdminOp::DeleteQos("normal".into())).is_err(), "normal always exists");
    assert!(admin(&mut state, AdminOp::DeleteQos("high".into())).unwrap_err().to_string().contains("1 pending"));
    state.apply(&at(30, Command::CancelJobs { ids: vec![id], by_uid: 0 })).response.unwrap();
    let err = admin(&mut state, AdminOp::DeleteQos("high".into())).unwrap_err();
    assert!(err.to_string().contains("account root allows QOS high"), "{err}");
    let update = drover_state::PartitionUpdate {
        name: "gpu".into(),
        allow_qos: Some(vec!["high".into()]),
        ..Default::default()
    };
    state.apply(&at(40, Command::UpdatePartition { update, by_uid: 0 })).response.unwrap();
    let err = submit(&mut state, spec("alice")).unwrap_err();
    assert!(err.to_string().contains("partition gpu allows only QOS high"), "{err}");
}

/// Issue 28, finding 5: a QOS that preempts others is an administrator's grant. Slurm's association QOS lists,
/// inherited down the account tree: a user may use only what their account (or its nearest ancestor with a list)
/// allows, `normal` alone until anything is granted; a default QOS applies to jobs that name none; `scontrol update
/// job QOS=` is held to the same list; operators may use any QOS.
#[test]
fn a_user_may_use_only_the_qos_their_account_allows_at_submit_and_at_update() {
    let mut state = cluster();
    let urgent = Qos { name: "urgent".into(), priority: 1_000, preempt: vec!["normal".into()], ..Qos::default() };
    admin(&mut state, AdminOp::PutQos { qos: urgent, create: true }).unwrap();
    let add = |name: &str, parent: Option<&str>, users: &[&str]| {
        AdminOp::AddAccount(AccountUpdate {
            name: name.into(),
            parent: parent.map(Into::into),
            add_users: users.iter().map(|u| u.to_string()).collect(),
            ..AccountUpdate::default()
        })
    };
    admin(&mut state, add("physics", None, &[])).unwrap();
    admin(&mut state, add("lattice", Some("physics"), &["alice"])).unwrap();
    admin(&mut state, add("chem", None, &["bob"])).unwrap();
    let with_qos = |user: &str, qos: &str| JobSpec { qos: Some(qos.into()), ..spec(user) };

    // Nothing granted: normal only, for everyone.
    let err = submit(&mut state, with_qos("alice", "urgent")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Invalid qos specification: urgent: account lattice allows only QOS normal (an administrator grants more: drover account modify lattice --qos ...)"
    );
    // Granted to physics: lattice inherits it, chem does not.
    let grant = |name: &str, qos: &[&str], default: Option<&str>| {
        AdminOp::ModifyAccount(AccountUpdate {
            name: name.into(),
            qos: Some(qos.iter().map(|q| q.to_string()).collect()),
            default_qos: default.map(Into::into),
            ..AccountUpdate::default()
        })
    };
    admin(&mut state, grant("physics", &["normal", "urgent"], None)).unwrap();
    let id = submit(&mut state, with_qos("alice", "urgent")).unwrap();
    assert_eq!(state.job(id).unwrap().qos, "urgent");
    let err = submit(&mut state, with_qos("bob", "urgent")).unwrap_err();
    assert!(err.to_string().contains("account chem allows only QOS normal"), "{err}");

    // The same list holds for scontrol update job QOS=, for the owner; an operator may set any QOS.
    let bobs = submit(&mut state, spec("bob")).unwrap();
    let to_urgent = JobUpdate { qos: Some("urgent".into()), ..Default::default() };
    let update = |by_uid| Command::UpdateJob { id: bobs, by_uid, update: to_urgent.clone() };
    let err = state.apply(&at(40, update(1000))).response.unwrap_err();
    assert!(err.to_string().contains("account chem allows only QOS normal"), "{err}");
    assert_eq!(state.job(bobs).unwrap().qos, "normal");
    state.apply(&at(41, update(0))).response.unwrap();
    assert_eq!(state.job(bobs).unwrap().qos, "urgent");
    // ... and an operator's own jobs may use any QOS.
    let grant_role =
        drover_state::RoleGrant { uid: 2000, user: "carol".into(), level: drover_state::AdminLevel::Operator };
    admin(&mut state, AdminOp::SetRole(grant_role)).unwrap();
    submit(&mut state, JobSpec { uid: 2000, ..with_qos("carol", "urgent") }).unwrap();

    // A default QOS must be one the account allows, and applies to jobs that name none.
    let err = admin(&mut state, grant("chem", &[], Some("urgent"))).unwrap_err();
    assert!(err.to_string().contains("account chem allows only QOS normal"), "{err}");
    let err = admin(&mut state, grant("chem", &["nonesuch"], None)).unwrap_err();
    assert!(err.to_string().contains("nonesuch: no such QOS"), "{err}");
    admin(&mut state, grant("lattice", &[], Some("urgent"))).unwrap();
    let id = submit(&mut state, spec("alice")).unwrap();
    assert_eq!(state.job(id).unwrap().qos, "urgent", "lattice's default");
}

#[test]
fn reservations_are_validated_and_admit_only_their_users() {
    let mut state = cluster();
    let r = Reservation {
        name: "maint".into(),
        nodes: vec!["n1".into()],
        start_ms: 100_000,
        end_ms: Some(200_000),
        users: vec!["alice".into()],
        ..Reservation::default()
    };
    admin(&mut state, AdminOp::CreateReservation(r.clone())).unwrap();
    let overlapping = Reservation { name: "other".into(), ..r.clone() };
    let err = admin(&mut state, AdminOp::CreateReservation(overlapping)).unwrap_err();
    assert!(err.to_string().contains("Requested nodes are busy: n1 is in reservation maint"), "{err}");
    let nobody = Reservation { name: "x".into(), nodes: vec!["n2".into()], users: vec![], ..r.clone() };
    assert!(admin(&mut state, AdminOp::CreateReservation(nobody)).unwrap_err().to_string().contains("Users="));
    let backwards = Reservation { name: "y".into(), nodes: vec!["n2".into()], end_ms: Some(50_000), ..r.clone() };
    assert!(admin(&mut state, AdminOp::CreateReservation(backwards)).is_err());
    let unknown = Reservation { name: "z".into(), nodes: vec!["n9".into()], ..r.clone() };
    assert!(matches!(
        admin(&mut state, AdminOp::CreateReservation(unknown)),
        Err(CommandError::InvalidNodeName { .. })
    ));

    let err = submit(&mut state, JobSpec { reservation: Some("maint".into()), ..spec("bob") }).unwrap_err();
    assert!(err.to_string().contains("Access denied"), "{err}");
    assert!(submit(&mut state, JobSpec { reservation: Some("maint".into()), ..spec("alice") }).is_ok());
    admin(&mut state, AdminOp::DeleteReservation("maint".into())).unwrap();
    assert!(state.reservations.is_empty());
}

#[test]
fn an_array_becomes_one_job_per_task_with_consecutive_ids() {
    let mut state = cluster();
    let array = ArraySpec { task_ids: vec![0, 2, 4, 6].into(), max_running: Some(2) };
    let first = submit(&mut state, JobSpec { array: Some(array), ..spec("alice") }).unwrap();
    let tasks: Vec<_> = (first..first + 4).map(|id| state.job(id).unwrap().clone()).collect();
    assert_eq!(
        tasks.iter().map(|j| j.display_id()).collect::<Vec<_>>(),
        vec![format!("{first}_0"), format!("{first}_2"), format!("{first}_4"), format!("{first}_6")]
    );
    assert!(tasks.iter().all(|j| j.script_id() == first && j.spec.array.is_none()));
    assert_eq!(tasks[3].array.as_deref().unwrap().max_running, Some(2));
    assert_eq!(submit(&mut state, spec("alice")).unwrap(), first + 4, "the next job follows the array's ids");
    let too_big = ArraySpec { task_ids: vec![5_000].into(), max_running: None };
    let err = submit(&mut state, JobSpec { array: Some(too_big), ..spec("alice") }).unwrap_err();
    assert!(err.to_string().contains("MaxArraySize of 1001"), "{err}");
}

#[test]
fn dependencies_are_judged_when_their_targets_start_and_end() {
    let mut state = cluster();
    let a = submit(&mut state, spec("alice")).unwrap();
    let dep = |kind, job| Dependency { kind, job, task: None };
    let ok = submit(&mut state, JobSpec { dependency: vec![dep(DependencyKind::AfterOk, a)].into(), ..spec("alice") })
        .unwrap();
    let not_ok =
        submit(&mut state, JobSpec { dependency: vec![dep(DependencyKind::AfterNotOk, a)].into(), ..spec("alice") })
            .unwrap();
    let after = submit(&mut state, JobSpec { dependency: vec![dep(DependencyKind::After, a)].into(), ..spec("alice") })
        .unwrap();
    assert_eq!(state.job(ok).unwrap().dependency_state, vec![DepState::Waiting]);
    start(&mut state, a, "n1", 0, 1_000);
    assert_eq!(state.job(after).unwrap().dependency_state, vec![DepState::Satisfied], "after: the target started");
    assert_eq!(state.job(ok).unwrap().dependency_state, vec![DepState::Waiting]);
    end(&mut state, a, 3, 2_000);
    assert_eq!(state.job(ok).unwrap().dependency_state, vec![DepState::Never], "afterok on a failed job");
    assert_eq!(state.job(not_ok).unwrap().dependency_state, vec![DepState::Satisfied]);
    // A dependency on a job that already ended is judged from the remembered fate.
    let late =
        submit(&mut state, JobSpec { dependency: vec![dep(DependencyKind::AfterAny, a)].into(), ..spec("alice") });
    assert_eq!(state.job(late.unwrap()).unwrap().dependency_state, vec![DepState::Satisfied]);
    let err =
        submit(&mut state, JobSpec { dependency: vec![dep(DependencyKind::AfterOk, 999)].into(), ..spec("alice") });
    assert_eq!(err.unwrap_err().to_string(), "Job dependency problem: job 999 does not exist");
    // The verdicts survive a restart: the fate table is rebuilt from the finished jobs.
    let mut records = state.records();
    records.finished = vec![drover_state::Job { id: a, state: JobState::Failed, exit_code: 3, ..Default::default() }];
    let restored = State::restore(records);
    assert_eq!(restored, state);
}

#[test]
fn kill_on_invalid_dep_cancels_what_can_never_run_and_what_waits_on_it() {
    // As Slurm 22.05 does with --kill-on-invalid-dep=yes (tried on its peer): the job is CANCELLED with reason
    // DependencyNeverSatisfied once a dependency can never hold, and a job waiting on it with afterok follows.
    let mut state = cluster();
    let a = submit(&mut state, spec("alice")).unwrap();
    let on = |kind, job| vec![Dependency { kind, job, task: None }].into();
    let kill = |kind, job| JobSpec { dependency: on(kind, job), kill_on_invalid_dep: true, ..spec("alice") };
    let b = submit(&mut state, kill(DependencyKind::AfterOk, a)).unwrap();
    let c = submit(&mut state, kill(DependencyKind::AfterOk, b)).unwrap();
    let d = submit(&mut state, kill(DependencyKind::AfterAny, b)).unwrap();
    let stays = submit(&mut state, JobSpec { dependency: on(DependencyKind::AfterOk, a), ..spec("alice") }).unwrap();
    start(&mut state, a, "n1", 0, 1_000);
    assert_eq!(state.job(b).unwrap().state, JobState::Pending, "nothing is decided while the target runs");
    let end = JobEnd { exit_code: 3, ..JobEnd::default() };
    let applied = state.apply(&at(2_000, Command::JobEnded { job_id: a, incarnation: 0, end }));
    applied.response.unwrap();
    let archived = |id| {
        applied.changes.iter().find_map(|c| match c {
            drover_state::Change::ArchiveJob(job) if job.id == id => Some(job.clone()),
            _ => None,
        })
    };
    for id in [b, c] {
        assert!(state.job(id).is_none(), "job {id} left the queue");
        let job = archived(id).expect("archived in the same entry");
        assert_eq!(job.state, JobState::Cancelled);
        assert_eq!(job.reason, drover_state::PendingReason::DependencyNeverSatisfied);
        assert_eq!(job.end_time_ms, Some(2_000), "cancelled in the entry that decided it");
    }
    assert_eq!(state.job(d).unwrap().dependency_state, vec![DepState::Satisfied], "afterany: b ended");
    assert_eq!(state.job(stays).unwrap().dependency_state, vec![DepState::Never], "without the option it waits");
    // Submitted after the verdict: cancelled in its own submission.
    let late = submit(&mut state, kill(DependencyKind::AfterOk, a)).unwrap();
    assert!(state.job(late).is_none());
}

#[test]
fn afterok_on_an_array_waits_for_every_task() {
    let mut state = cluster();
    let array = ArraySpec { task_ids: vec![0, 1].into(), max_running: None };
    let first = submit(&mut state, JobSpec { array: Some(array), ..spec("alice") }).unwrap();
    let dep = Dependency { kind: DependencyKind::AfterOk, job: first, task: None };
    let waiting = submit(&mut state, JobSpec { dependency: vec![dep].into(), ..spec("alice") }).unwrap();
    let one = Dependency { kind: DependencyKind::AfterOk, job: first, task: Some(1) };
    let on_task = submit(&mut state, JobSpec { dependency: vec![one].into(), ..spec("alice") }).unwrap();
    start(&mut state, first, "n1", 0, 1_000);
    start(&mut state, first + 1, "n1", 1, 1_000);
    end(&mut state, first + 1, 0, 2_000);
    assert_eq!(state.job(on_task).unwrap().dependency_state, vec![DepState::Satisfied]);
    assert_eq!(state.job(waiting).unwrap().dependency_state, vec![DepState::Waiting], "task 0 still runs");
    end(&mut state, first, 0, 3_000);
    assert_eq!(state.job(waiting).unwrap().dependency_state, vec![DepState::Satisfied]);
}

#[test]
fn top_is_for_pending_jobs_of_their_owner() {
    let mut state = cluster();
    let a = submit(&mut state, spec("alice")).unwrap();
    let b = submit(&mut state, spec("alice")).unwrap();
    let top = |state: &mut State, id, uid| {
        let applied = state.apply(&at(50, Command::TopJobs { ids: vec![id], by_uid: uid }));
        match applied.response {
            Ok(Reply::Jobs(outcomes)) => outcomes[0].result.clone(),
            other => panic!("{other:?}"),
        }
    };
    top(&mut state, b, 1000).unwrap();
    top(&mut state, a, 1000).unwrap();
    assert!(state.job(a).unwrap().top_rank > state.job(b).unwrap().top_rank, "the latest top ranks first");
    assert!(matches!(top(&mut state, a, 2000), Err(CommandError::PermissionDenied { .. })));
    start(&mut state, a, "n1", 0, 1_000);
    assert!(matches!(top(&mut state, a, 1000), Err(CommandError::NotPending { .. })));
}

#[test]
fn partition_limits_tiers_and_allowed_accounts_change_at_run_time() {
    let mut state = cluster();
    let update = drover_state::PartitionUpdate {
        name: "gpu".into(),
        max_gpus_per_job: Some(drover_state::Limit::At(4)),
        priority_tier: Some(3),
        allow_accounts: Some(vec!["physics".into()]),
        ..Default::default()
    };
    state.apply(&at(5, Command::UpdatePartition { update, by_uid: 0 })).response.unwrap();
    let p = state.config().unwrap().partition("gpu").unwrap().clone();
    assert_eq!((p.max_gpus_per_job, p.priority_tier), (Some(4), 3));
    let wide = JobSpec { min_nodes: 2, max_nodes: 2, gpus_per_node: 4, account: Some("physics".into()), ..spec("a") };
    let err = submit(&mut state, wide).unwrap_err();
    assert!(err.to_string().contains("8 GPUs requested, over partition gpu's MaxTRESPerJob of gres/gpu=4"), "{err}");
    let err = submit(&mut state, spec("a")).unwrap_err();
    assert!(err.to_string().contains("partition gpu allows only accounts physics"), "{err}");
    assert!(submit(&mut state, JobSpec { account: Some("physics".into()), ..spec("a") }).is_ok());
    let open = drover_state::PartitionUpdate {
        name: "gpu".into(),
        allow_accounts: Some(vec!["ALL".into()]),
        max_gpus_per_job: Some(drover_state::Limit::Unlimited),
        ..Default::default()
    };
    state.apply(&at(6, Command::UpdatePartition { update: open, by_uid: 0 })).response.unwrap();
    assert!(submit(&mut state, spec("a")).is_ok(), "ALL clears the list");
}

#[test]
fn gpus_total_is_spread_over_the_fewest_nodes() {
    let mut state = cluster();
    let id = submit(&mut state, JobSpec { gpus_per_node: 0, gpus_total: Some(16), ..spec("a") }).unwrap();
    let job = state.job(id).unwrap();
    assert_eq!((job.spec.min_nodes, job.spec.gpus_per_node), (2, 8));
    let err = submit(&mut state, JobSpec { gpus_per_node: 0, gpus_total: Some(15), ..spec("a") }).unwrap_err();
    assert!(err.to_string().contains("--gpus=15 cannot be spread evenly over 2 nodes"), "{err}");
    let err = submit(&mut state, JobSpec { gpus_per_node: 0, gpus_total: Some(24), ..spec("a") }).unwrap_err();
    assert!(err.to_string().starts_with("Requested node configuration is not available"), "{err}");
}

#[test]
fn a_pending_jobs_request_can_be_updated_and_is_checked_again() {
    let mut state = cluster();
    let a = submit(&mut state, spec("alice")).unwrap();
    let b = submit(&mut state, spec("alice")).unwrap();
    let update = |state: &mut State, id, uid, update: drover_state::JobUpdate| {
        let before = state.clone();
        let r = state.apply(&at(60, Command::UpdateJob { id, by_uid: uid, update })).response;
        if r.is_err() {
            assert_eq!(*state, before, "a refused update changed the state");
        }
        r
    };
    // Owners lower their limits and set nice and dependencies; only an operator or administrator raises a limit.
    let lower = drover_state::JobUpdate { time_limit_s: Some(300), nice: Some(10), ..Default::default() };
    update(&mut state, b, 1000, lower).unwrap();
    assert_eq!((state.job(b).unwrap().time_limit_s, state.job(b).unwrap().spec.nice), (Some(300), 10));
    let raise = drover_state::JobUpdate { time_limit_s: Some(900), ..Default::default() };
    assert!(
        update(&mut state, b, 1000, raise.clone())
            .unwrap_err()
            .to_string()
            .contains("only an operator or administrator")
    );
    update(&mut state, b, 0, raise).unwrap();
    let dep = Dependency { kind: DependencyKind::AfterOk, job: a, task: None };
    let deps = drover_state::JobUpdate { dependency: Some((vec![dep], false)), ..Default::default() };
    update(&mut state, b, 1000, deps).unwrap();
    assert_eq!(state.job(b).unwrap().dependency_state, vec![DepState::Waiting]);
    end_of_a_fails(&mut state, a);
    assert_eq!(state.job(b).unwrap().dependency_state, vec![DepState::Never], "the new dependency is tracked");
    let bad = drover_state::JobUpdate { qos: Some("gold".into()), ..Default::default() };
    assert!(matches!(update(&mut state, b, 1000, bad), Err(CommandError::InvalidQos { .. })));
    let selfish = Dependency { kind: DependencyKind::AfterAny, job: b, task: None };
    let selfish = drover_state::JobUpdate { dependency: Some((vec![selfish], false)), ..Default::default() };
    assert!(update(&mut state, b, 1000, selfish).is_err());
    let other_user = drover_state::JobUpdate { nice: Some(1), ..Default::default() };
    assert!(matches!(update(&mut state, b, 2000, other_user), Err(CommandError::PermissionDenied { .. })));
}

fn end_of_a_fails(state: &mut State, a: u64) {
    start(state, a, "n1", 0, 1_000);
    end(state, a, 1, 2_000);
}

//! Stories for who may do what, through `State::apply` alone. The uids here are the ones the controller verified
//! from each caller's credential; the state machine decides with them and the replicated roles.
//!
//! Alice (uid 1001) and Bob (uid 1002) are ordinary users; Olga (uid 2001) becomes an operator and Ada (uid 2002)
//! an administrator; root (uid 0) is always an administrator.

use drover_state::{
    AdminLevel, AdminOp, Change, ClusterConfig, Command, CommandError, GpuInfo, JobSpec, NodeInfo, PartitionUpdate,
    PendingReason, Qos, Reply, Request, RoleGrant, State,
};

const ALICE: u32 = 1001;
const BOB: u32 = 1002;
const OLGA: u32 = 2001;
const ADA: u32 = 2002;

fn at(time_ms: u64, command: Command) -> Request {
    Request { time_ms, command }
}

fn cluster(config: ClusterConfig) -> State {
    let mut state = State::default();
    state.apply(&at(0, Command::InitCluster { config }));
    let info = NodeInfo {
        name: "n1".into(),
        cpus: 64,
        gpus: (0..8).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
        ..NodeInfo::default()
    };
    state.apply(&at(1, Command::RegisterNode { info, running: Vec::new() })).response.unwrap();
    grant(&mut state, 0, OLGA, AdminLevel::Operator).unwrap();
    grant(&mut state, 0, ADA, AdminLevel::Administrator).unwrap();
    state
}

fn grant(state: &mut State, by_uid: u32, uid: u32, level: AdminLevel) -> Result<Reply, CommandError> {
    let op = AdminOp::SetRole(RoleGrant { uid, user: format!("u{uid}"), level });
    state.apply(&at(5, Command::Admin { op, by_uid })).response
}

fn spec(uid: u32) -> JobSpec {
    JobSpec {
        name: "train".into(),
        user: format!("u{uid}").into(),
        uid,
        gid: uid,
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

/// The outcome for the one job a job command named.
fn one(state: &mut State, command: Command) -> Result<(), CommandError> {
    match state.apply(&at(20, command)).response? {
        Reply::Jobs(outcomes) => outcomes.into_iter().next().expect("one outcome").result,
        other => panic!("{other:?}"),
    }
}

/// Applies a command that must be refused, and checks that it changed nothing.
fn refused(state: &mut State, command: Command) -> CommandError {
    let before = state.clone();
    let applied = state.apply(&at(30, command));
    assert!(applied.changes.is_empty(), "a refused command wrote {:?}", applied.changes);
    assert_eq!(*state, before);
    applied.response.expect_err("should be refused")
}

#[test]
fn users_touch_only_their_own_jobs_and_operators_touch_any() {
    let mut state = cluster(ClusterConfig::default());
    let job = submit(&mut state, spec(ALICE)).unwrap();
    for command in [
        Command::CancelJobs { ids: vec![job], by_uid: BOB },
        Command::HoldJobs { ids: vec![job], by_uid: BOB, user_hold: Some(false) },
        Command::TopJobs { ids: vec![job], by_uid: BOB },
    ] {
        let err = one(&mut state, command).unwrap_err();
        assert_eq!(err, CommandError::PermissionDenied { id: job, owner: ALICE, requester: BOB });
    }
    let update = Command::UpdateJob { id: job, by_uid: BOB, update: Default::default() };
    assert!(matches!(refused(&mut state, update), CommandError::PermissionDenied { .. }));
    let step = Command::CreateStep { job_id: job, by_uid: BOB, step: None };
    assert!(matches!(refused(&mut state, step), CommandError::PermissionDenied { .. }));

    // The operator holds Alice's job: an administrator's hold, which Alice cannot lift.
    one(&mut state, Command::HoldJobs { ids: vec![job], by_uid: OLGA, user_hold: Some(false) }).unwrap();
    assert_eq!(state.job(job).unwrap().reason, PendingReason::JobHeldAdmin);
    let err = one(&mut state, Command::ReleaseJobs { ids: vec![job], by_uid: ALICE }).unwrap_err();
    assert_eq!(err, CommandError::AdminHold { id: job });
    one(&mut state, Command::ReleaseJobs { ids: vec![job], by_uid: OLGA }).unwrap();
    // Her own hold she lifts herself.
    one(&mut state, Command::HoldJobs { ids: vec![job], by_uid: ALICE, user_hold: Some(false) }).unwrap();
    assert_eq!(state.job(job).unwrap().reason, PendingReason::JobHeldUser);
    one(&mut state, Command::ReleaseJobs { ids: vec![job], by_uid: ALICE }).unwrap();
    // An operator may cancel anyone's job.
    one(&mut state, Command::CancelJobs { ids: vec![job], by_uid: OLGA }).unwrap();
    assert!(state.job(job).is_none());
}

#[test]
fn only_operators_drain_and_only_administrators_change_the_cluster() {
    let mut state = cluster(ClusterConfig::default());
    let drain = |by_uid| Command::DrainNodes {
        names: vec!["n1".into()],
        drain: true,
        reason: "fan".into(),
        by_uid,
        requeue_jobs: false,
    };
    let err = refused(&mut state, drain(ALICE));
    assert!(
        matches!(&err, CommandError::NotAuthorized { needed, .. } if *needed == drover_state::AdminLevel::Operator),
        "{err}"
    );
    assert!(err.to_string().contains("drover admin grant"), "the message says how to get the right: {err}");
    state.apply(&at(40, drain(OLGA))).response.unwrap();
    assert!(state.nodes["n1"].drain);

    let partition = |by_uid| Command::UpdatePartition {
        update: PartitionUpdate {
            name: "gpu".into(),
            max_nodes: Some(drover_state::Limit::At(1)),
            ..Default::default()
        },
        by_uid,
    };
    for uid in [ALICE, OLGA] {
        let err = refused(&mut state, partition(uid));
        assert!(
            matches!(&err, CommandError::NotAuthorized { needed, .. } if *needed == drover_state::AdminLevel::Administrator),
            "{err}"
        );
    }
    state.apply(&at(41, partition(ADA))).response.unwrap();

    let qos = |by_uid| Command::Admin {
        op: AdminOp::PutQos { qos: Qos { name: "fast".into(), ..Qos::default() }, create: true },
        by_uid,
    };
    assert!(matches!(refused(&mut state, qos(OLGA)), CommandError::NotAuthorized { .. }));
    state.apply(&at(42, qos(ADA))).response.unwrap();

    // Roles themselves: only administrators grant them, and root cannot be demoted.
    assert!(matches!(
        grant(&mut state, OLGA, ALICE, AdminLevel::Administrator),
        Err(CommandError::NotAuthorized { .. })
    ));
    assert!(grant(&mut state, ADA, 0, AdminLevel::None).is_err());
    grant(&mut state, ADA, OLGA, AdminLevel::None).unwrap();
    assert_eq!(state.level_of(OLGA), AdminLevel::None);
    assert!(matches!(refused(&mut state, drain(OLGA)), CommandError::NotAuthorized { .. }));
    assert_eq!(state.level_of(0), AdminLevel::Administrator);
}

#[test]
fn every_administrative_change_is_in_the_audit_log_with_who_and_when() {
    let mut state = cluster(ClusterConfig::default());
    let drain = Command::DrainNodes {
        names: vec!["n1".into()],
        drain: true,
        reason: "fan".into(),
        by_uid: OLGA,
        requeue_jobs: false,
    };
    let applied = state.apply(&at(77, drain));
    let audits: Vec<_> = applied
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::PutAudit(entry) => Some(entry.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(audits.len(), 1);
    let entry = &audits[0];
    assert_eq!((entry.uid, entry.action.as_str(), entry.time_ms), (OLGA, "drain_nodes", 77));
    assert!(entry.detail.contains("nodes=n1") && entry.detail.contains("fan"), "{}", entry.detail);
    // The grants made while setting up were audited too, so this entry's id follows theirs.
    assert_eq!(entry.id, 3);
    // A refused change leaves no audit entry (it changed nothing); an ordinary job command leaves none either.
    let applied = state.apply(&at(
        78,
        Command::DrainNodes {
            names: vec!["n1".into()],
            drain: false,
            reason: String::new(),
            by_uid: ALICE,
            requeue_jobs: false,
        },
    ));
    assert!(applied.response.is_err() && applied.changes.is_empty());
    let job = submit(&mut state, spec(ALICE)).unwrap();
    let applied = state.apply(&at(79, Command::CancelJobs { ids: vec![job], by_uid: ALICE }));
    assert!(!applied.changes.iter().any(|c| matches!(c, Change::PutAudit(_))));
    // Membership changes happen outside the state machine and are recorded after the fact, by administrators.
    let record = |by_uid| Command::RecordAudit { by_uid, action: "add_replica".into(), detail: "id=4".into() };
    assert!(matches!(refused(&mut state, record(ALICE)), CommandError::NotAuthorized { .. }));
    let applied = state.apply(&at(80, record(ADA)));
    assert!(
        applied.changes.iter().any(|c| matches!(c, Change::PutAudit(e) if e.action == "add_replica" && e.uid == ADA))
    );
}

#[test]
fn root_jobs_need_the_cluster_to_allow_them() {
    let mut state = cluster(ClusterConfig::default());
    let err = submit(&mut state, spec(0)).unwrap_err();
    assert!(err.to_string().contains("may not run as root"), "{err}");
    let mut state = cluster(ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() });
    submit(&mut state, spec(0)).unwrap();
}

#[test]
fn one_user_cannot_fill_the_queue() {
    let mut config = ClusterConfig::default();
    config.limits.max_jobs_per_user = 3;
    let mut state = cluster(config);
    let ids: Vec<u64> = (0..3).map(|_| submit(&mut state, spec(ALICE)).unwrap()).collect();
    let err = submit(&mut state, spec(ALICE)).unwrap_err();
    assert_eq!(err, CommandError::TooManyUserJobs { user: format!("u{ALICE}"), active: 3, limit: 3 });
    // Others are unaffected, and a finished job makes room again.
    submit(&mut state, spec(BOB)).unwrap();
    one(&mut state, Command::CancelJobs { ids: vec![ids[0]], by_uid: ALICE }).unwrap();
    submit(&mut state, spec(ALICE)).unwrap();
    // The count survives a restart from the persisted records.
    let restored = State::restore(state.records());
    assert_eq!((restored.active_jobs_of(ALICE), restored.active_jobs_of(BOB)), (3, 1));
}

#[test]
fn oversized_or_malformed_fields_are_refused_by_name() {
    let mut state = cluster(ClusterConfig::default());
    let mut long = spec(ALICE);
    long.work_dir = "/".repeat(5_000).into();
    assert!(submit(&mut state, long).unwrap_err().to_string().contains("--chdir"));
    let mut bad_env = spec(ALICE);
    bad_env.environment = vec![("A=B".into(), "x".into())].into();
    assert!(submit(&mut state, bad_env).unwrap_err().to_string().contains("environment"));
    let mut many = spec(ALICE);
    many.exclude = (0..5_000).map(|i| format!("n{i}")).collect();
    assert!(submit(&mut state, many).unwrap_err().to_string().contains("--exclude"));
    let mut nul = spec(ALICE);
    nul.name = "a\0b".into();
    assert!(submit(&mut state, nul).unwrap_err().to_string().contains("NUL"));
}

#[test]
fn bad_administrative_input_is_refused_before_it_reaches_the_log() {
    let state = cluster(ClusterConfig::default());
    // The update that once crashed every replica: the leader now refuses it without proposing anything.
    let bad = Command::UpdatePartition {
        update: PartitionUpdate { name: "gpu".into(), nodes: Some("][".into()), ..Default::default() },
        by_uid: 0,
    };
    let err = state.precheck(&bad, 100).unwrap_err();
    assert!(err.to_string().contains("Nodes=]["), "{err}");
    let unauthorized = Command::UpdatePartition {
        update: PartitionUpdate { name: "gpu".into(), ..Default::default() },
        by_uid: ALICE,
    };
    assert!(matches!(state.precheck(&unauthorized, 100), Err(CommandError::NotAuthorized { .. })));
    let unknown_node = Command::DrainNodes {
        names: vec!["nope".into()],
        drain: true,
        reason: "x".into(),
        by_uid: 0,
        requeue_jobs: false,
    };
    assert!(matches!(state.precheck(&unknown_node, 100), Err(CommandError::InvalidNodeName { .. })));
    assert!(state.precheck(&Command::SubmitJob { spec: Box::new(spec(0)), request_id: None }, 100).is_err());
    assert_eq!(state.precheck(&Command::SubmitJob { spec: Box::new(spec(ALICE)), request_id: None }, 100), Ok(()));
}

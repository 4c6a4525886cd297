//! Fuzzing `apply` with arbitrary commands: whatever a client, an agent or a confused leader puts in the log, every
//! replica must refuse it cleanly or apply it whole. A panic in `apply` stops every replica, and again at each
//! restart when the entry replays: the cluster is gone. So, for any sequence of commands, with any field values:
//! no panic; a refused command changes nothing; the holds on GPUs and CPUs stay consistent (`check_invariants`).
//!
//! proptest rather than cargo-fuzz (stable toolchain); the case count is bounded so CI runs it on every change.

use drover_state::first_fit::first_fit;
use drover_state::{
    AccountUpdate, AdminLevel, AdminOp, Allocation, ArraySpec, ClusterConfig, Command, Dependency, DependencyKind,
    GpuInfo, JobEnd, JobSpec, JobUpdate, Limit, MeasuredUsage, NodeAllocation, NodeInfo, PartitionState,
    PartitionUpdate, PendingReason, Qos, Request, Reservation, ReservationFlag, ReservationUpdate, RoleGrant,
    RunningShare, State,
};
use proptest::prelude::*;

/// Names a cluster knows, mixed with hostile ones (brackets, commas, empty, long, unicode).
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["n1", "n2", "n3", "gpu", "normal", "physics", "root", "r1"]).prop_map(String::from),
        2 => hostlist(),
        1 => "\\PC{0,40}",
        1 => Just(String::new()),
    ]
}

/// Hostlist-like text: brackets, ranges and commas in every order, where parsers break.
fn hostlist() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["n", "[", "]", "1", "07", "-", ",", "x"]), 0..9)
        .prop_map(|t| t.concat())
}

/// Mostly an administrator (so admin commands get past the permission check to their parsers), sometimes anyone.
fn admin_uid() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(0u32), 1 => uid()]
}

fn names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(name(), 0..4)
}

fn job_id() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..12, 1 => any::<u64>()]
}

fn uid() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(1001), Just(1002), Just(2001), any::<u32>()]
}

fn time_ms() -> impl Strategy<Value = u64> {
    // Leaders' clocks differ: time may go backwards between entries, or be absurd.
    prop_oneof![8 => 1_000_000u64..1_100_000, 1 => Just(0u64), 1 => any::<u64>()]
}

fn dependency() -> impl Strategy<Value = Dependency> {
    let kinds = vec![
        DependencyKind::After,
        DependencyKind::AfterOk,
        DependencyKind::AfterAny,
        DependencyKind::AfterNotOk,
        DependencyKind::Singleton,
    ];
    (prop::sample::select(kinds), job_id(), prop::option::of(0u32..5)).prop_map(|(kind, job, task)| Dependency {
        kind,
        job,
        task,
    })
}

fn spec() -> impl Strategy<Value = JobSpec> {
    // Sizes mostly small, sometimes absurd (a request for 4 billion nodes must be refused, not allocated for).
    let count = || prop_oneof![8 => 0u32..4, 1 => any::<u32>()];
    let size = (count(), count(), count(), prop_oneof![Just(1u32), 0u32..100, any::<u32>()], prop::option::of(count()));
    let limits = (prop::option::of(prop_oneof![1u64..10_000, any::<u64>()]), any::<i32>(), prop::option::of(0u32..20));
    let names_part =
        (prop::option::of(name()), prop::option::of(name()), prop::option::of(name()), prop::option::of(name()));
    let lists = (names(), names(), names(), prop::collection::vec(dependency(), 0..3), any::<bool>());
    let array = prop::option::of((prop::collection::vec(0u32..2_000, 0..6), prop::option::of(0u32..4)));
    let flags = (any::<bool>(), any::<bool>(), prop::option::of(any::<bool>()), any::<bool>(), uid(), any::<bool>());
    (size, limits, names_part, lists, array, flags).prop_map(
        |(
            (min_nodes, max_nodes, gpus_per_node, cpus_per_task, ntasks_per_node),
            (time_limit_s, nice, gpus_total),
            (partition, qos, account, reservation),
            (nodelist, exclude, constraint, dependency, dependency_any),
            array,
            (exclusive, interactive, requeue, hold, uid, no_kill),
        )| JobSpec {
            name: "fuzz".into(),
            user: format!("u{uid}").into(),
            uid,
            gid: uid,
            script: "#!/bin/sh\ntrue\n".into(),
            min_nodes,
            max_nodes,
            gpus_per_node,
            cpus_per_task,
            ntasks_per_node,
            time_limit_s,
            nice,
            gpus_total,
            partition: partition.map(Into::into),
            qos: qos.map(Into::into),
            account: account.map(Into::into),
            reservation: reservation.map(Into::into),
            nodelist: nodelist.into(),
            exclude: exclude.into(),
            constraint: constraint.into(),
            dependency: dependency.into(),
            dependency_any,
            array: array.map(|(task_ids, max_running)| ArraySpec { task_ids: task_ids.into(), max_running }),
            exclusive,
            interactive,
            requeue,
            hold,
            no_kill,
            ..JobSpec::default()
        },
    )
}

fn node_info() -> impl Strategy<Value = NodeInfo> {
    (name(), prop_oneof![Just(64u32), 0u32..8, any::<u32>()], prop::collection::vec(0u32..10, 0..10), names(), names())
        .prop_map(|(name, cpus, gpus, partitions, features)| NodeInfo {
            name,
            cpus,
            gpus: gpus.into_iter().map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
            partitions,
            features,
            ..NodeInfo::default()
        })
}

fn allocation() -> impl Strategy<Value = Allocation> {
    let share = (name(), prop::collection::vec(0u32..10, 0..5), prop_oneof![0u32..4, any::<u32>()], 0u32..4)
        .prop_map(|(node, gpus, cpus, tasks)| NodeAllocation { node, gpus, cpus, tasks, mem_mb: 0 });
    (job_id(), prop::collection::vec(share, 0..3)).prop_map(|(job_id, nodes)| Allocation { job_id, nodes })
}

fn limit<T: std::fmt::Debug + Clone + Copy + 'static>(
    values: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<Limit<T>>> {
    prop::option::of(prop_oneof![Just(Limit::Unlimited), values.prop_map(Limit::At)])
}

fn partition_update() -> impl Strategy<Value = PartitionUpdate> {
    let states = vec![PartitionState::Up, PartitionState::Down, PartitionState::Drain, PartitionState::Inactive];
    (
        prop_oneof![3 => Just("gpu".to_string()), 1 => name()],
        prop::option::of(prop::sample::select(states)),
        prop::option::of(prop_oneof![3 => hostlist(), 1 => name()]),
        limit(any::<u64>()),
        limit(any::<u64>()),
        limit(any::<u32>()),
        any::<bool>(),
        limit(any::<u32>()),
        prop::option::of(any::<u32>()),
        prop::option::of(names()),
    )
        .prop_map(
            |(name, state, nodes, max_time_s, default_time_s, max_nodes, make_default, max_gpus, tier, allow)| {
                PartitionUpdate {
                    name,
                    state,
                    nodes,
                    max_time_s,
                    default_time_s,
                    max_nodes,
                    make_default,
                    max_gpus_per_job: max_gpus,
                    priority_tier: tier,
                    preempt_mode: tier.map(|t| {
                        if t % 2 == 0 { drover_state::PreemptMode::Requeue } else { drover_state::PreemptMode::Off }
                    }),
                    allow_accounts: allow.clone(),
                    allow_qos: allow,
                }
            },
        )
}

fn account_update() -> impl Strategy<Value = AccountUpdate> {
    let qos = (prop::option::of(names()), prop::option::of(name()));
    (name(), prop::option::of(name()), prop::option::of(0u32..5), names(), names(), qos).prop_map(
        |(name, parent, shares, add_users, remove_users, (qos, default_qos))| AccountUpdate {
            name,
            parent,
            shares,
            description: None,
            add_users,
            remove_users,
            qos,
            default_qos,
        },
    )
}

fn admin_op() -> impl Strategy<Value = AdminOp> {
    let qos = (name(), any::<u32>(), prop::option::of(any::<u64>()), prop::option::of(0u32..3)).prop_map(
        |(name, priority, max_wall_s, max_jobs_per_user)| Qos {
            name,
            priority,
            max_wall_s,
            max_jobs_per_user,
            ..Qos::default()
        },
    );
    let flags =
        prop::collection::vec(prop::sample::select(vec![ReservationFlag::Maint, ReservationFlag::Ignore]), 0..2);
    let reservation = (
        name(),
        names(),
        prop::option::of(0u32..40),
        time_ms(),
        prop::option::of(time_ms()),
        names(),
        names(),
        flags.clone(),
    )
        .prop_map(|(name, nodes, gpu_count, start_ms, end_ms, users, accounts, flags)| Reservation {
            name,
            nodes,
            gpu_count,
            start_ms,
            end_ms,
            users,
            accounts,
            flags,
            partition: None,
        });
    let update = (
        name(),
        prop::option::of(names()),
        prop::option::of(0u32..40),
        prop::option::of(time_ms()),
        prop::option::of(time_ms()),
        any::<bool>(),
        prop::option::of(names()),
        prop::option::of(flags),
    )
        .prop_map(|(name, nodes, gpu_count, start_ms, end_ms, end_open, users, flags)| ReservationUpdate {
            name,
            nodes,
            gpu_count,
            start_ms,
            end_ms,
            end_open,
            users: users.clone(),
            accounts: users,
            flags,
        });
    let levels = vec![AdminLevel::None, AdminLevel::Operator, AdminLevel::Administrator];
    let role =
        (uid(), name(), prop::sample::select(levels)).prop_map(|(uid, user, level)| RoleGrant { uid, user, level });
    prop_oneof![
        account_update().prop_map(AdminOp::AddAccount),
        account_update().prop_map(AdminOp::ModifyAccount),
        name().prop_map(AdminOp::DeleteAccount),
        (qos, any::<bool>()).prop_map(|(qos, create)| AdminOp::PutQos { qos, create }),
        name().prop_map(AdminOp::DeleteQos),
        reservation.prop_map(AdminOp::CreateReservation),
        update.prop_map(AdminOp::UpdateReservation),
        name().prop_map(AdminOp::DeleteReservation),
        role.prop_map(AdminOp::SetRole),
    ]
}

fn job_update() -> impl Strategy<Value = JobUpdate> {
    (
        prop::option::of(any::<u64>()),
        any::<bool>(),
        prop::option::of(any::<i32>()),
        prop::option::of(name()),
        prop::option::of((prop::collection::vec(dependency(), 0..3), any::<bool>())),
        prop::option::of(name()),
        prop::option::of(name()),
        prop::option::of(name()),
    )
        .prop_map(|(time_limit_s, time_unlimited, nice, qos, dependency, name, comment, partition)| JobUpdate {
            time_limit_s,
            time_unlimited,
            nice,
            qos,
            dependency,
            name,
            comment,
            partition,
        })
}

fn measured() -> impl Strategy<Value = MeasuredUsage> {
    (prop::option::of(any::<u64>()), prop::option::of(any::<u64>()))
        .prop_map(|(cpu_ms, mem_peak_kb)| MeasuredUsage { cpu_ms, mem_peak_kb })
}

fn job_end() -> impl Strategy<Value = JobEnd> {
    (
        any::<i32>(),
        any::<i32>(),
        any::<bool>(),
        prop::option::of("\\PC{0,20}"),
        any::<bool>(),
        prop::option::of(measured()),
    )
        .prop_map(|(exit_code, signal, timed_out, message, fenced, measured)| JobEnd {
            exit_code,
            signal,
            timed_out,
            message,
            fenced,
            measured,
            ..JobEnd::default()
        })
}

/// What a registering agent says still runs: real and made-up jobs, old and current incarnations, GPUs in and
/// out of the inventory, repeated.
fn running_share() -> impl Strategy<Value = RunningShare> {
    (job_id(), 0u64..3, prop::collection::vec(0u32..6, 0..5)).prop_map(|(job, incarnation, gpus)| RunningShare {
        job,
        incarnation,
        gpus,
    })
}

/// What the fuzzer does: mostly arbitrary commands, plus valid plans so that jobs really run and end.
#[derive(Debug, Clone)]
enum Step {
    Raw(Box<Command>),
    /// A plan the first-fit allocator computes from the current state (a leader's honest plan).
    HonestPlan,
}

fn command() -> impl Strategy<Value = Command> {
    let ids = || prop::collection::vec(job_id(), 0..4);
    prop_oneof![
        3 => (spec(), prop::option::of("[a-z]{1,4}")).prop_map(|(spec, request_id)| Command::SubmitJob { spec: Box::new(spec), request_id }),
        1 => (ids(), uid()).prop_map(|(ids, by_uid)| Command::CancelJobs { ids, by_uid }),
        1 => (ids(), uid(), prop::option::of(any::<bool>())).prop_map(|(ids, by_uid, user_hold)| Command::HoldJobs { ids, by_uid, user_hold }),
        1 => (ids(), uid(), any::<bool>()).prop_map(|(ids, by_uid, suspend)| Command::SuspendJobs { ids, by_uid, suspend }),
        1 => (ids(), uid()).prop_map(|(ids, by_uid)| Command::ReleaseJobs { ids, by_uid }),
        1 => (ids(), uid()).prop_map(|(ids, by_uid)| Command::TopJobs { ids, by_uid }),
        1 => (node_info(), prop::collection::vec(running_share(), 0..3)).prop_map(|(info, running)| Command::RegisterNode { info, running }),
        1 => (name(), "\\PC{0,10}", prop::option::of(0u64..4)).prop_map(|(name, reason, epoch)| Command::NodeDown { name, reason, epoch }),
        1 => (names(), any::<bool>(), "\\PC{0,10}", uid()).prop_map(|(names, drain, reason, by_uid)| Command::DrainNodes { names, drain, reason, by_uid, requeue_jobs: drain }),
        2 => (prop::collection::vec(allocation(), 0..3), prop::collection::vec((job_id(), Just(PendingReason::Resources)), 0..3))
            .prop_map(|(allocations, reasons)| Command::ApplyPlan { allocations, reasons }),
        2 => (job_id(), prop_oneof![0u64..3, any::<u64>()], job_end()).prop_map(|(job_id, incarnation, end)| Command::JobEnded { job_id, incarnation, end }),
        1 => (partition_update(), admin_uid()).prop_map(|(update, by_uid)| Command::UpdatePartition { update, by_uid }),
        1 => (job_id(), uid(), prop::option::of((name(), names(), 0u32..8))).prop_map(|(job_id, by_uid, step)| Command::CreateStep {
            job_id, by_uid, step: step.map(|(name, nodes, tasks)| drover_state::StepStart { name, nodes, tasks }) }),
        1 => (job_id(), 0u32..3, -1i32..3, 0i32..10, any::<bool>(), uid()).prop_map(|(job_id, step_id, exit_code, signal, cancelled, by_uid)|
            Command::EndStep { job_id, step_id, exit_code, signal, cancelled, by_uid }),
        2 => (admin_op(), admin_uid()).prop_map(|(op, by_uid)| Command::Admin { op, by_uid }),
        1 => (job_id(), uid(), job_update()).prop_map(|(id, by_uid, update)| Command::UpdateJob { id, by_uid, update }),
        1 => (uid(), name(), "\\PC{0,10}").prop_map(|(by_uid, action, detail)| Command::RecordAudit { by_uid, action, detail }),
        1 => Just(Command::InitCluster { config: ClusterConfig::default() }),
        2 => (ids(), uid(), any::<bool>()).prop_map(|(ids, by_uid, hold)| Command::RequeueJobs { ids, by_uid, hold }),
        1 => (ids(), job_id()).prop_map(|(victims, for_job)| Command::PreemptJobs { victims, for_job }),
        1 => (job_id(), prop_oneof![0u64..3, any::<u64>()], prop_oneof![Just("/ckpt/a".to_string()), name()], prop::option::of(any::<u64>()), uid())
            .prop_map(|(job_id, incarnation, path, step, by_uid)| Command::RecordCheckpoint { job_id, incarnation, path, step, by_uid }),
        1 => (name(), any::<u32>(), any::<u64>()).prop_map(|(node, images, bytes)| Command::RecordImageStore {
            node,
            summary: drover_state::node::ImageStoreSummary { images, bytes, limit_bytes: bytes / 2 },
        }),
        1 => (job_id(), 0u64..3, prop_oneof![Just(format!("sha256:{}", "ab".repeat(32))), name()])
            .prop_map(|(job_id, incarnation, digest)| Command::RecordImage { job_id, incarnation, digest }),
        1 => (name(), prop::collection::vec((job_id(), 0u64..3), 0..3), prop::collection::vec(((job_id(), 0u64..3), measured()), 0..3))
            .prop_map(|(node, keys, usage)| Command::ReleaseLingering { node, keys, usage }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![6 => command().prop_map(|c| Step::Raw(Box::new(c))), 1 => Just(Step::HonestPlan)]
}

fn cluster() -> State {
    let mut state = State::default();
    let config = ClusterConfig { allow_root_jobs: true, ..ClusterConfig::default() };
    state.apply(&Request { time_ms: 1, command: Command::InitCluster { config } });
    for name in ["n1", "n2", "n3"] {
        let info = NodeInfo {
            name: name.into(),
            cpus: 64,
            gpus: (0..4).map(|index| GpuInfo { index, ..GpuInfo::default() }).collect(),
            ..NodeInfo::default()
        };
        state
            .apply(&Request { time_ms: 2, command: Command::RegisterNode { info, running: Vec::new() } })
            .response
            .unwrap();
    }
    state
}

/// 400 cases in the test suite; `FUZZ_CASES=100000 cargo test -p drover-state --test fuzz_apply` for a soak.
fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(400)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn apply_never_panics_and_refusals_change_nothing(steps in prop::collection::vec((step(), time_ms()), 1..50)) {
        let mut state = cluster();
        for (step, time_ms) in steps {
            let command = match step {
                Step::Raw(command) => *command,
                Step::HonestPlan => {
                    let plan = first_fit(&state, 100);
                    Command::ApplyPlan { allocations: plan.allocations, reasons: plan.reasons }
                }
            };
            let before = state.clone();
            let applied = state.apply(&Request { time_ms, command: command.clone() });
            if applied.response.is_err() {
                prop_assert!(applied.changes.is_empty(), "refused {command:?} wrote {:?}", applied.changes);
                prop_assert!(state == before, "refused {command:?} changed the state");
            }
            state.check_invariants();
            // What was persisted rebuilds the same state (a replica restarting from disk agrees with one that
            // did not): compare everything but the derived dependency tables, which need the history.
            let restored = State::restore(state.records());
            prop_assert_eq!(&restored.jobs, &state.jobs);
            prop_assert_eq!(&restored.nodes, &state.nodes);
            prop_assert_eq!(&restored.roles, &state.roles);
        }
    }
}

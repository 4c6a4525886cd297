//! Hot-spare nodes in the replicated state: how a node becomes a spare (agent config, `scontrol update`), that
//! `apply` keeps ordinary jobs off spares even from a stale plan, and that a spare taken by a job restarting after
//! a node failure leaves the pool.

use drover_state::{
    AdminOp, Allocation, ClusterConfig, Command, CommandError, JobState, NodeAllocation, NodeInfo, Reply, State,
};

mod common;

use common::{ALICE, alice_job, at, gpu_node};

fn info(name: &str, spare: bool) -> NodeInfo {
    NodeInfo { spare, ..gpu_node(name) }
}

/// n1 and n2 normal, n3 registered as a spare by its agent's config.
fn cluster() -> State {
    let mut state = State::default();
    state.apply(&at(0, Command::InitCluster { config: ClusterConfig::default() }));
    for (name, spare) in [("n1", false), ("n2", false), ("n3", true)] {
        state.apply(&at(1, Command::RegisterNode { info: info(name, spare), running: Vec::new() })).response.unwrap();
    }
    state
}

fn submit(state: &mut State) -> u64 {
    let spec = alice_job(1, 2);
    match state.apply(&at(10, Command::SubmitJob { spec: Box::new(spec), request_id: None })).response {
        Ok(Reply::Submitted { job_id, .. }) => job_id,
        other => panic!("{other:?}"),
    }
}

/// Plans job `id` on `node`; the ids started and the refusals.
fn plan(
    state: &mut State,
    id: u64,
    node: &str,
    time_ms: u64,
) -> (Vec<u64>, Vec<(u64, drover_state::AllocationRefusal)>) {
    let share = NodeAllocation { node: node.into(), gpus: vec![0, 1], cpus: 1, tasks: 1, mem_mb: 0 };
    let plan = Command::ApplyPlan { allocations: vec![Allocation { job_id: id, nodes: vec![share] }], reasons: vec![] };
    let out = match state.apply(&at(time_ms, plan)).response {
        Ok(Reply::Planned { started, refused }) => (started, refused),
        other => panic!("{other:?}"),
    };
    state.check_invariants();
    out
}

fn set_spare(state: &mut State, names: &[&str], spare: bool, by_uid: u32) -> Result<Reply, CommandError> {
    let op = AdminOp::SetNodeSpare { names: names.iter().map(|n| n.to_string()).collect(), spare };
    state.apply(&at(20, Command::Admin { op, by_uid })).response
}

#[test]
fn only_a_job_restarting_after_a_node_failure_starts_on_a_spare_which_then_leaves_the_pool() {
    let mut state = cluster();
    assert!(state.nodes["n3"].spare && !state.nodes["n1"].spare);
    let id = submit(&mut state);
    assert!(!state.job(id).unwrap().may_use_spares(), "a fresh job");
    // A stale or wrong plan putting an ordinary job on a spare is refused, naming why.
    let (started, refused) = plan(&mut state, id, "n3", 30);
    assert!(started.is_empty());
    assert!(matches!(&refused[0].1, drover_state::AllocationRefusal::HotSpare { node } if node == "n3"), "{refused:?}");
    assert_eq!(plan(&mut state, id, "n1", 40).0, vec![id]);
    // Its node dies: it is requeued after a node failure and may now take the spare.
    state.apply(&at(50, Command::NodeDown { name: "n1".into(), reason: "lost".into(), epoch: None })).response.unwrap();
    let job = state.job(id).unwrap();
    assert_eq!((job.state, job.restart_count), (JobState::Pending, 1));
    assert!(job.may_use_spares());
    assert_eq!(plan(&mut state, id, "n3", 60).0, vec![id]);
    assert!(!state.nodes["n3"].spare, "a spare taken by a job becomes a normal node");
    assert!(!state.job(id).unwrap().may_use_spares(), "running");
}

#[test]
fn operators_mark_spares_and_an_agent_restart_keeps_their_choice() {
    let mut state = cluster();
    set_spare(&mut state, &["n1", "n2"], true, 0).unwrap();
    assert!(state.nodes["n1"].spare && state.nodes["n2"].spare);
    set_spare(&mut state, &["n3"], false, 0).unwrap();
    assert!(!state.nodes["n3"].spare);
    // n3's agent re-registers with the same config (spare = true): the operator's "no" stands ...
    state.apply(&at(30, Command::RegisterNode { info: info("n3", true), running: Vec::new() })).response.unwrap();
    assert!(!state.nodes["n3"].spare);
    // ... until the agent's setting itself changes.
    state.apply(&at(31, Command::RegisterNode { info: info("n3", false), running: Vec::new() })).response.unwrap();
    state.apply(&at(32, Command::RegisterNode { info: info("n3", true), running: Vec::new() })).response.unwrap();
    assert!(state.nodes["n3"].spare);
    // Clear errors, and nothing changes on one.
    let err = set_spare(&mut state, &["n1", "nope"], false, 0).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    assert!(state.nodes["n1"].spare, "a refused command changes nothing");
    let err = set_spare(&mut state, &[], true, 0).unwrap_err();
    assert!(err.to_string().contains("at least one node"), "{err}");
    let many: Vec<String> = (0..=drover_state::spare::MAX_SPARE_UPDATE_NODES).map(|i| format!("n{i}")).collect();
    let op = AdminOp::SetNodeSpare { names: many, spare: false };
    let err = state.apply(&at(21, Command::Admin { op, by_uid: 0 })).response.unwrap_err();
    assert!(err.to_string().contains("over the limit of 4096"), "{err}");
    assert!(set_spare(&mut state, &["n1"], false, ALICE).is_err(), "ordinary users may not");
    assert!(state.nodes["n1"].spare);
}

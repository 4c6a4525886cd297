//! The batching write path (`propose::Proposer`) on a real one-replica Raft over RocksDB: proposals that arrive
//! together are committed together, and every proposer still gets its own answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use drover_controller::propose::{Proposer, propose, propose_checked};
use drover_controller::store::{LogStore, StateMachineStore, StateView, open_db};
use drover_controller::types::{Raft, ReplicaNode, TypeConfig, Vote};
use drover_state::{ClusterConfig, Command, CommandError, JobOutcome, JobSpec, Reply};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};

/// A one-replica cluster never calls its network; a call would mean the test set up something else.
struct NoPeers;

struct NoPeer;

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeer;
    async fn new_client(&mut self, _target: u64, _node: &ReplicaNode) -> NoPeer {
        NoPeer
    }
}

fn unreachable<E>() -> E
where
    E: From<Unreachable<TypeConfig>>,
{
    Unreachable::new(&std::io::Error::other("a one-replica cluster has no peers")).into()
}

impl RaftNetworkV2<TypeConfig> for NoPeer {
    type SnapshotData = drover_controller::store::SnapshotFile;

    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(unreachable())
    }

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: openraft::alias::SnapshotOf<TypeConfig, Self::SnapshotData>,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        Err(unreachable())
    }
}

/// One replica that leads (after `initialize`), with the cluster configuration committed.
async fn one_replica(dir: &std::path::Path) -> (Raft, Proposer, StateView) {
    let db = open_db(dir).expect("open db");
    let sm = StateMachineStore::open(db.clone()).expect("state machine");
    let view = sm.view();
    let config =
        Arc::new(openraft::Config { cluster_name: "batching".into(), ..Default::default() }.validate().unwrap());
    let raft = Raft::new(1, config, NoPeers, LogStore::new(db), sm).await.expect("raft");
    raft.initialize(BTreeMap::from([(1, ReplicaNode { addr: "127.0.0.1:1".into() })])).await.expect("initialize");
    raft.wait(Some(Duration::from_secs(10))).current_leader(1, "leads").await.expect("becomes leader");
    let proposer = Proposer::new(raft.clone());
    propose(&proposer, Command::InitCluster { config: ClusterConfig::default() }).await.expect("init cluster");
    (raft, proposer, view)
}

fn spec(name: String) -> Box<JobSpec> {
    Box::new(JobSpec {
        name: name.into(),
        user: "alice".into(),
        uid: 1000,
        gid: 1000,
        script: "#!/bin/sh\ntrue\n".into(),
        work_dir: "/tmp".into(),
        submit_dir: "/tmp".into(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        ..JobSpec::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_that_arrive_together_each_get_their_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (raft, proposer, view) = one_replica(dir.path()).await;
    // The state machine's own applied index, not Raft's metrics: those are published a moment after an apply, so
    // they could still miss the cluster's init entry here and count it among the 300 below.
    let applied_index = |view: &StateView| view.read().last_applied.map_or(0, |id| id.index);
    let before = applied_index(&view);

    // 300 writers at once: more than one batch's worth arrives while the pipeline is busy.
    let writers: Vec<_> = (0..300)
        .map(|i| {
            let proposer = proposer.clone();
            tokio::spawn(async move {
                let name = format!("job-{i}");
                let command = Command::SubmitJob { spec: spec(name.clone()), request_id: Some(format!("req-{i}")) };
                (name, propose(&proposer, command).await)
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for writer in writers {
        let (name, reply) = writer.await.unwrap();
        let Ok(Reply::Submitted { job_id, duplicate: false }) = reply else { panic!("{name}: {reply:?}") };
        // The answer is this writer's own: the job it names is the one this writer submitted.
        assert_eq!(view.read().state.jobs[&job_id].spec.name, name, "answer routed to the wrong proposer");
        assert!(ids.insert(job_id), "job id {job_id} answered twice");
    }
    assert_eq!(ids.len(), 300);
    // Every answer came after its entry was applied, and nothing else proposes.
    let after = applied_index(&view);
    assert_eq!(after - before, 300, "one log entry per proposal, however they were batched");
    raft.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_proposal_is_answered_and_a_refusal_keeps_its_type() {
    let dir = tempfile::tempdir().unwrap();
    let (raft, proposer, _view) = one_replica(dir.path()).await;
    let submitted =
        propose(&proposer, Command::SubmitJob { spec: spec("lone".into()), request_id: Some("r".into()) }).await;
    let Ok(Reply::Submitted { job_id, .. }) = submitted else { panic!("{submitted:?}") };
    // A retry of the same request finds the same job (the property a timed-out batch relies on).
    let again =
        propose(&proposer, Command::SubmitJob { spec: spec("lone".into()), request_id: Some("r".into()) }).await;
    assert!(matches!(again, Ok(Reply::Submitted { job_id: j, duplicate: true }) if j == job_id), "{again:?}");
    // Someone else's job: `apply` refuses it, and the refusal comes back typed, not as a failed commit.
    let refused = propose_checked(&proposer, Command::CancelJobs { ids: vec![job_id], by_uid: 1001 }).await;
    let Ok(Ok(Reply::Jobs(outcomes))) = &refused else { panic!("{refused:?}") };
    assert!(
        matches!(outcomes[..], [JobOutcome { id, result: Err(CommandError::PermissionDenied { .. }) }] if id == job_id),
        "{refused:?}"
    );
    raft.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_to_a_stopped_replica_are_told_to_go_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (raft, proposer, _view) = one_replica(dir.path()).await;
    raft.shutdown().await.unwrap();
    let status = propose(&proposer, Command::SubmitJob { spec: spec("late".into()), request_id: None })
        .await
        .expect_err("a stopped replica commits nothing");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

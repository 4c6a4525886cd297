//! What an agent accepts from leaders: assignments never older than ones it already has (a new leader that has
//! not applied everything committed before its election would otherwise make it kill running jobs as strays),
//! and a lease only as an answer to a heartbeat, from the time that heartbeat was sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_agent::node::NodeAgent;
use drover_proto::wire::Assignment;
use drover_state::Job;

mod common;

fn agent(dir: &std::path::Path) -> Arc<NodeAgent> {
    common::agent(dir, "", "/bin/false".into())
}

fn assignment(id: u64) -> Assignment {
    Assignment { job: Job { id, ..Job::default() }, hosts: vec!["127.0.0.1".into()], node_index: 1, script: None }
}

#[test]
fn assignments_older_than_the_newest_seen_are_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    agent.set_assignments(vec![assignment(7)], 100, Vec::new(), false);
    assert!(agent.assignment(7).is_some());
    // A leader that has not caught up sends its older state, without job 7: not acted upon.
    agent.set_assignments(Vec::new(), 90, Vec::new(), false);
    assert!(agent.assignment(7).is_some(), "job 7 must not become a stray because of a stale leader");
    // A leader at least as current says job 7 is gone: now it is.
    agent.set_assignments(Vec::new(), 101, Vec::new(), false);
    assert!(agent.assignment(7).is_none());
}

#[test]
fn the_lease_lives_on_disk_for_the_supervisors_and_a_restarted_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = agent(tmp.path());
    assert!(!agent.lease_valid(), "no lease before a leader grants one");
    agent.renew(Instant::now() + Duration::from_secs(30));
    assert!(agent.lease_valid());
    assert!(!drover_agent::lease::expired(&agent.lease_path()), "the supervisors see it");
    drop(agent);
    // A restarted agent holds the same lease (its tasks kept running under it).
    let again = self::agent(tmp.path());
    assert!(again.lease_valid());
}

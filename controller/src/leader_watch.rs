//! Faster failover when the leader's process is gone.
//!
//! Raft alone notices a dead leader only by silence: each follower waits its randomized election timeout, and the
//! first candidate is usually turned away because the other followers still hold the old leader's lease (openraft's
//! lease is `election_timeout_max`), so a second round wins, about two timeouts after the crash. But a crashed or
//! killed leader also leaves evidence: its port refuses connections. A follower that has heard nothing for two
//! heartbeats checks that port; when it is refused, the lowest-id surviving voter campaigns as soon as its own lease
//! on the old leader has run out (plus a margin for the others'), and the first round wins.
//!
//! Safety never rests on this: it only starts an ordinary election, with a Pre-Vote round that a quorum still
//! holding a live leader's lease refuses. A leader that is alive but silent (frozen, cut off by a firewall that
//! drops packets) still accepts connections or times out, so it is left to the election timeout as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use crate::config::RaftTuning;
use crate::runtime::now_ms;
use crate::types::Raft;

/// How long the port check may take; a dead host's port does not answer at all, which is not evidence.
const PROBE_TIMEOUT_MS: u64 = 100;
/// Campaign this long after our own lease on the old leader ran out, so the other followers' leases (renewed by
/// the same heartbeat, delivered a few ms apart) have run out too.
const LEASE_MARGIN_MS: u64 = 20;

/// When this replica last accepted entries or a heartbeat from a leader (ms on `runtime::now_ms`'s clock).
#[derive(Clone, Default)]
pub struct LastHeard(Arc<AtomicU64>);

impl LastHeard {
    pub fn now(&self) {
        self.0.store(now_ms(), Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Whether nothing listens at `addr` any more: the connection is refused outright.
async fn refuses_connections(addr: &str) -> bool {
    let connect = tokio::net::TcpStream::connect(addr);
    matches!(
        tokio::time::timeout(Duration::from_millis(PROBE_TIMEOUT_MS), connect).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Runs for the replica's lifetime (see the module's comment).
pub async fn watch(raft: Raft, id: u64, heard: LastHeard, tuning: RaftTuning) {
    let heartbeat_ms = tuning.heartbeat_interval_ms.max(1);
    let mut metrics = raft.metrics();
    loop {
        tokio::time::sleep(Duration::from_millis(heartbeat_ms)).await;
        let (leader, leader_addr, first_survivor) = {
            let m = metrics.borrow_watched();
            if m.running_state.is_err() {
                return;
            }
            let Some(leader) = m.current_leader.filter(|l| *l != id) else { continue };
            let membership = m.membership_config.membership();
            let Some(node) = membership.get_node(&leader) else { continue };
            // Two early candidates would split the vote: only the lowest-id voter other than the leader goes early.
            let first_survivor = membership.voter_ids().filter(|v| *v != leader).min();
            (leader, node.addr.clone(), first_survivor)
        };
        if first_survivor != Some(id) {
            continue;
        }
        let last = heard.get();
        if now_ms().saturating_sub(last) < 2 * heartbeat_ms || !refuses_connections(&leader_addr).await {
            continue;
        }
        let campaign_at = last + tuning.election_timeout_max_ms + LEASE_MARGIN_MS;
        tokio::time::sleep(Duration::from_millis(campaign_at.saturating_sub(now_ms()))).await;
        let still_gone = heard.get() == last && metrics.borrow_watched().current_leader == Some(leader);
        if still_gone {
            tracing::info!(leader, %leader_addr, "the leader's port refuses connections: campaigning at its lease's end");
            if raft.trigger().elect(true).await.is_err() {
                return;
            }
            // One early campaign per loss; the election timeout takes over if it fails.
            let _ =
                tokio::time::timeout(Duration::from_millis(tuning.election_timeout_max_ms), metrics.changed()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_closed_port_counts_as_a_dead_leader() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        assert!(!refuses_connections(&addr).await, "a listening port is alive");
        drop(listener);
        assert!(refuses_connections(&addr).await, "a closed port refuses");
    }
}

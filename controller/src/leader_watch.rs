//! Faster failover when the leader's process is gone.
//!
//! Raft alone notices a dead leader only by silence: each follower waits its randomized election timeout, and the
//! first candidate is usually turned away because the other followers still hold the old leader's lease (openraft's
//! lease is `election_timeout_max`), so a second round wins, about two timeouts after the crash. But a crashed or
//! killed leader also leaves evidence: its port refuses connections. A follower that has heard nothing for two
//! heartbeats checks that port; when it is refused, the survivors campaign by hand, in id order spaced a little
//! apart, starting as soon as the old leader's lease has run out (plus a margin), with their own election timers held
//! off meanwhile (those fire inside the lease, start a candidate the others refuse, and split the next round). The
//! first survivor with an up-to-date log wins in one round.
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
const LEASE_MARGIN_MS: u64 = 10;

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
        let (leader, leader_addr, rank) = {
            let m = metrics.borrow_watched();
            if m.running_state.is_err() {
                return;
            }
            let Some(leader) = m.current_leader.filter(|l| *l != id) else { continue };
            let membership = m.membership_config.membership();
            let Some(node) = membership.get_node(&leader) else { continue };
            let Some(rank) = membership.voter_ids().filter(|v| *v != leader).position(|v| v == id) else { continue };
            (leader, node.addr.clone(), rank as u64)
        };
        let last = heard.get();
        if now_ms().saturating_sub(last) < 2 * heartbeat_ms || !refuses_connections(&leader_addr).await {
            continue;
        }
        // Our own timer would fire inside the lease and start a candidate without a Pre-Vote, which the others
        // refuse and which then splits the next round: campaign by hand instead, survivors in id order, spaced
        // so that one round settles before the next survivor tries (the first may hold a shorter log, which the
        // others refuse to elect).
        raft.runtime_config().elect(false);
        // A replica that has not heard from the leader for longer (just restarted, say) holds no lease: it goes now.
        let lease_end = (last + tuning.election_timeout_max_ms + LEASE_MARGIN_MS).max(now_ms());
        // Between one survivor's campaign and the next one's: a Pre-Vote and a vote round (a few ms on a LAN).
        let campaign_at = lease_end + rank * tuning.campaign_stagger_ms;
        let give_up_at = campaign_at + tuning.election_timeout_max_ms;
        tracing::info!(leader, %leader_addr, rank, "the leader's port refuses connections: campaigning at its lease's end");
        let mut campaigned = false;
        while metrics.borrow_watched().current_leader == Some(leader) && heard.get() == last {
            let now = now_ms();
            if now >= give_up_at {
                break;
            }
            if !campaigned && now >= campaign_at {
                campaigned = true;
                tracing::info!(leader, rank, "campaigning for the dead leader's place");
                if raft.trigger().elect(true).await.is_err() {
                    return;
                }
            }
            let next = if campaigned { give_up_at } else { campaign_at };
            let left = Duration::from_millis(next.saturating_sub(now).max(1));
            if matches!(tokio::time::timeout(left, metrics.changed()).await, Ok(Err(_))) {
                return;
            }
        }
        // Whatever happened, the election timeout works as usual again.
        raft.runtime_config().elect(true);
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

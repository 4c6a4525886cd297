//! Leader placement: a leader that is not among `raft.preferred_leaders` hands leadership to the first preferred
//! voter that holds its whole log. Operators spreading replicas over sites put the leader where most clients and
//! agents are, so a commit costs one round trip within that site plus one to the nearest other site.
//!
//! Safety is Raft's: the transfer is openraft's TransferLeader (the target campaigns at once, with a log at least
//! as long as the leader's), so the worst a bad preference can do is cost an election every hold period.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use crate::types::{LogId, Raft};

/// How often a leader that should hand over looks again (a preferred replica catching up, say).
const CHECK_INTERVAL_MS: u64 = 250;

/// The replica to hand leadership to: the first of `preferred` that is a voter and has acknowledged every entry
/// of the leader's log (`None` when this leader is itself preferred, or no preferred replica is ready).
pub fn handover_target(
    me: u64,
    preferred: &[u64],
    voters: &[u64],
    matched: &BTreeMap<u64, Option<LogId>>,
    last_log_index: u64,
) -> Option<u64> {
    if preferred.contains(&me) {
        return None;
    }
    preferred.iter().copied().find(|id| holds_whole_log(*id, voters, matched, last_log_index))
}

/// Whether `id` is a voter that has acknowledged the leader's log up to `last_log_index`.
fn holds_whole_log(id: u64, voters: &[u64], matched: &BTreeMap<u64, Option<LogId>>, last_log_index: u64) -> bool {
    voters.contains(&id) && matched.get(&id).and_then(|m| m.as_ref()).is_some_and(|m| m.index() >= last_log_index)
}

/// The voter a leader that stops on purpose hands over to: a preferred voter that has acknowledged its whole log,
/// else the other voter furthest along (under load no follower has the very last entry at any instant; openraft's
/// transfer stops new proposals and the target waits until its log holds the leader's last entry before it
/// campaigns). `None` in a one-member cluster.
pub fn shutdown_target(
    me: u64,
    preferred: &[u64],
    voters: &[u64],
    matched: &BTreeMap<u64, Option<LogId>>,
    last_log_index: u64,
) -> Option<u64> {
    let matched_index = |id: &u64| matched.get(id).and_then(|m| m.as_ref()).map_or(0, |m| m.index());
    preferred
        .iter()
        .copied()
        .find(|id| *id != me && holds_whole_log(*id, voters, matched, last_log_index))
        .or_else(|| voters.iter().copied().filter(|id| *id != me).max_by_key(|id| (matched_index(id), u64::MAX - id)))
}

/// Hands leadership to [`shutdown_target`] if this replica leads, and waits (at most `wait_ms`) until another
/// replica leads. Without it, stopping a leader costs the cluster its lease and an election timeout with nobody
/// leading (or, restarted within its lease, the same leader back in its old term while the others wait for a
/// different one); with it, the target campaigns at once (openraft's TransferLeader: once its log holds the
/// leader's last entry, so Raft's safety is untouched) and clients and agents find it within a round trip.
/// Returns the new leader, if it moved in time.
pub async fn hand_over_before_stopping(raft: &Raft, me: u64, preferred: &[u64], wait_ms: u64) -> Option<u64> {
    let m = raft.metrics().borrow_watched().clone();
    if m.current_leader != Some(me) {
        return None;
    }
    let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
    let matched = m.replication.clone().unwrap_or_default();
    let target = shutdown_target(me, preferred, &voters, &matched, m.last_log_index.unwrap_or(0))?;
    tracing::info!(target, "stopping: handing leadership over first");
    raft.trigger().transfer_leader(target).await.ok()?;
    let mut metrics = raft.metrics();
    let moved = tokio::time::timeout(Duration::from_millis(wait_ms), async {
        loop {
            let leader = metrics.borrow_watched().current_leader;
            if leader.is_some_and(|l| l != me) {
                return leader;
            }
            if metrics.changed().await.is_err() {
                return None;
            }
        }
    })
    .await;
    match moved {
        Ok(Some(leader)) => {
            tracing::info!(leader, "leadership handed over");
            Some(leader)
        }
        _ => {
            tracing::warn!(target, wait_ms, "leadership did not move in time; stopping anyway");
            None
        }
    }
}

/// Runs for the life of the replica; does nothing unless this replica leads and is not preferred.
pub async fn prefer_leaders(raft: Raft, id: u64, preferred: Vec<u64>, hold_ms: u64) {
    if preferred.is_empty() || preferred.contains(&id) {
        return;
    }
    let mut metrics = raft.metrics();
    let mut leading_since: Option<tokio::time::Instant> = None;
    loop {
        let m = metrics.borrow_watched().clone();
        if m.current_leader != Some(id) {
            leading_since = None;
            if metrics.changed().await.is_err() {
                return;
            }
            continue;
        }
        let since = *leading_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= Duration::from_millis(hold_ms) {
            let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
            let matched = m.replication.clone().unwrap_or_default();
            let last = m.last_log_index.unwrap_or(0);
            if let Some(target) = handover_target(id, &preferred, &voters, &matched, last) {
                tracing::info!(target, "handing leadership to a preferred replica (raft.preferred_leaders)");
                if raft.trigger().transfer_leader(target).await.is_err() {
                    return;
                }
                // Whatever came of it, not again before another hold period.
                leading_since = Some(tokio::time::Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(CHECK_INTERVAL_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(index: u64) -> Option<LogId> {
        Some(openraft::testing::log_id::<crate::types::TypeConfig>(1, 1, index))
    }

    #[test]
    fn a_stopping_leader_hands_over_to_a_caught_up_voter_preferred_ones_first() {
        let matched: BTreeMap<u64, Option<LogId>> =
            [(1, log_id(10)), (2, log_id(9)), (3, log_id(10)), (4, log_id(10)), (5, log_id(10))].into();
        let voters = [1, 2, 3, 4];
        assert_eq!(shutdown_target(1, &[], &voters, &matched, 10), Some(3), "2 lags behind");
        assert_eq!(shutdown_target(1, &[4], &voters, &matched, 10), Some(4), "a preferred replica first");
        assert_eq!(shutdown_target(1, &[5], &voters, &matched, 10), Some(3), "5 is no voter (a learner)");
        assert_eq!(shutdown_target(1, &[1], &voters, &matched, 10), Some(3), "never itself");
        assert_eq!(shutdown_target(1, &[], &[1], &matched, 10), None, "alone");
        assert_eq!(shutdown_target(1, &[4], &voters, &matched, 11), Some(3), "nobody holds it all: the furthest along");
        let behind: BTreeMap<u64, Option<LogId>> = [(2, log_id(7)), (3, None), (4, log_id(8))].into();
        assert_eq!(shutdown_target(1, &[], &voters, &behind, 10), Some(4));
    }

    #[test]
    fn a_leader_hands_over_only_to_a_preferred_voter_that_has_its_whole_log() {
        let matched: BTreeMap<u64, Option<LogId>> = [(1, log_id(10)), (2, log_id(10)), (3, log_id(9))].into();
        let voters = [1, 2, 3];
        // 3 is preferred but one entry behind: not yet; 2 is next in preference and caught up.
        assert_eq!(handover_target(1, &[3], &voters, &matched, 10), None);
        assert_eq!(handover_target(1, &[3, 2], &voters, &matched, 10), Some(2));
        // A preferred leader stays; a preferred replica that is not a voter (a learner) is skipped.
        assert_eq!(handover_target(2, &[2, 3], &voters, &matched, 10), None);
        assert_eq!(handover_target(1, &[4, 2], &voters, &matched, 10), Some(2));
        // No preference named a ready replica: stay.
        assert_eq!(handover_target(1, &[], &voters, &matched, 10), None);
        assert_eq!(handover_target(1, &[5], &voters, &[(5, log_id(10))].into(), 10), None);
    }
}

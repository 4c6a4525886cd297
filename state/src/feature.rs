//! Feature levels: what the replicated log may carry.
//!
//! Replicas are upgraded one at a time, so for a while a cluster runs two builds, and until an operator
//! finalizes the upgrade it must stay possible to roll every replica back. A build therefore writes nothing an
//! older replica cannot read — no new command, no new enum variant, no new field in use — until the cluster's
//! *active* feature level, a replicated value, says every replica understands it. The level only rises, by the
//! `SetFeatureLevel` command that `drover cluster upgrade finalize` proposes once the leader has heard from every
//! member that it understands the level; from then on, going back to a build below it is refused (the data
//! directory says why). The on-disk `FORMAT_VERSION` is a separate, older guard: it changes only when a build
//! rewrites data so that older builds cannot open it at all.
//!
//! How each kind of change is kept readable before finalizing:
//! - a new command or enum variant: the leader refuses to propose it below its level ([`require`]);
//! - a new trailing field of a replicated struct: written only when it holds a value (`skip_serializing_if`,
//!   which keeps every earlier position), and given a value only at its level; builds of level 2 and later also
//!   skip trailing fields they do not know ([`crate::tolerant`]), so from level 2 on a field can be *added*
//!   without breaking older readers (what they cannot do is keep it).

use crate::error::CommandError;

/// The level of every build before feature levels existed (and of a cluster that never finalized an upgrade).
pub const BASE_LEVEL: u32 = 1;

/// The highest level this build understands.
pub const LEVEL: u32 = 2;

/// One feature level: what it lets the cluster write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    pub level: u32,
    pub name: &'static str,
    pub summary: &'static str,
}

/// Every level this build knows, lowest first.
pub const LEVELS: [Level; 2] = [
    Level { level: 1, name: "base", summary: "everything up to and including backup, restore and forced new clusters" },
    Level {
        level: 2,
        name: "feature-levels",
        summary: "the replicated feature level itself (`drover cluster upgrade finalize`), and replicas that skip \
                  record fields they do not know, so later levels may add fields to replicated records",
    },
];

/// The level an entry, record or message that uses `feature` needs, and a refusal naming it when the cluster's
/// active level is below.
pub fn require(active: u32, needed: u32, feature: &str) -> Result<(), CommandError> {
    if active >= needed {
        return Ok(());
    }
    Err(CommandError::FeatureNotFinalized { feature: feature.to_string(), needed, active })
}

/// The description of `level`, if this build knows it.
pub fn describe(level: u32) -> Option<&'static Level> {
    LEVELS.iter().find(|l| l.level == level)
}

/// Whether a recorded level is the base level (the meta leaves it out then; see `Meta::feature_level`).
pub fn is_base(recorded: &u32) -> bool {
    *recorded <= BASE_LEVEL
}

/// The active level recorded in the state's meta (0 before feature levels existed reads as the base level).
pub fn effective(recorded: u32) -> u32 {
    recorded.max(BASE_LEVEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_levels_are_numbered_in_order_and_end_at_this_builds() {
        for (i, level) in LEVELS.iter().enumerate() {
            assert_eq!(level.level, i as u32 + BASE_LEVEL);
        }
        assert_eq!(LEVELS.last().unwrap().level, LEVEL);
    }

    fn finalize(state: &mut crate::State, level: u32, by_uid: u32) -> crate::Applied {
        let command = crate::Command::SetFeatureLevel { level, by_uid };
        state.apply(&crate::Request { time_ms: 1_700_000_000_000, command })
    }

    #[test]
    fn finalizing_raises_the_level_once_for_administrators_and_never_lowers_it() {
        let mut state = crate::State::default();
        assert_eq!(state.feature_level(), BASE_LEVEL, "a cluster starts at the base level");
        let refused = finalize(&mut state, 2, 1000);
        assert!(matches!(refused.response, Err(CommandError::NotAuthorized { .. })), "{:?}", refused.response);
        let done = finalize(&mut state, 2, 0);
        assert!(done.response.is_ok());
        assert_eq!(state.feature_level(), 2);
        assert!(done.changes.iter().any(|c| matches!(c, crate::Change::Meta(m) if m.feature_level == 2)));
        let again = finalize(&mut state, 2, 0);
        assert!(again.response.is_ok(), "finalizing the active level again is a no-op");
        assert!(again.changes.iter().all(|c| !matches!(c, crate::Change::Meta(m) if m.feature_level != 2)));
        let lower = finalize(&mut state, 1, 0).response.unwrap_err().to_string();
        assert!(lower.contains("never goes back"), "{lower}");
        let unknown = finalize(&mut state, LEVEL + 1, 0).response.unwrap_err().to_string();
        assert!(unknown.contains(&format!("levels up to {LEVEL}")), "{unknown}");
        assert_eq!(state.feature_level(), 2);
    }

    /// 0.1.0's meta record, read as 0.1.0 reads it (strictly: a field more is an error).
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct MetaOf010 {
        format_version: u32,
        next_job_id: u64,
        config: Option<crate::ClusterConfig>,
        next_dedup_seq: u64,
        next_top_rank: u64,
        next_audit_id: u64,
        goodput: crate::GoodputTotals,
        goodput_since_ms: Option<u64>,
    }

    #[test]
    fn the_meta_reads_in_the_build_before_levels_until_the_cluster_finalizes() {
        let meta = crate::Meta { next_job_id: 42, ..crate::Meta::default() };
        let bytes = crate::codec::encode(&meta).unwrap();
        let old: MetaOf010 = rmp_serde::from_slice(&bytes[1..]).expect("0.1.0 reads an unfinalized meta");
        assert_eq!(old.next_job_id, 42);
        let finalized = crate::Meta { feature_level: 2, ..meta };
        let bytes = crate::codec::encode(&finalized).unwrap();
        assert!(rmp_serde::from_slice::<MetaOf010>(&bytes[1..]).is_err(), "past finalizing, 0.1.0 cannot read it");
        assert_eq!(crate::codec::decode::<crate::Meta>(&bytes).unwrap(), finalized);
    }

    #[test]
    fn a_feature_above_the_active_level_is_refused_with_what_to_do() {
        assert!(require(2, 2, "x").is_ok());
        let err = require(1, 2, "recording agent versions").unwrap_err().to_string();
        assert!(err.contains("recording agent versions") && err.contains("finalize"), "{err}");
    }
}

//! The replicated audit log: every administrative change (partitions, reservations, accounts, QOS, roles, node
//! drains, replica membership), who made it and when, committed in the same entry as the change itself so the two
//! can never disagree. `drover audit` reads it. Kept on disk only (like the accounting history), bounded.

use serde::{Deserialize, Serialize};

/// How many entries are kept; the oldest are dropped first. Years of changes at human rates.
pub const AUDIT_CAPACITY: u64 = 100_000;
/// The longest `detail` kept (a reservation with a long user list is summarised, not stored whole).
pub const MAX_AUDIT_DETAIL_BYTES: usize = 2_048;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Sequential from 1, from the replicated counter.
    pub id: u64,
    /// The leader's stamp of the entry that made the change.
    pub time_ms: u64,
    /// The verified uid that asked (0 for the controllers' own housekeeping, e.g. draining a node whose GPU failed).
    pub uid: u32,
    /// What kind of change (`update_partition`, `create_reservation`, `set_role`, `drain_nodes`, `add_replica`...).
    pub action: String,
    /// The request, as JSON or a summary, at most [`MAX_AUDIT_DETAIL_BYTES`].
    pub detail: String,
}

impl AuditEntry {
    /// Cuts `detail` to the limit on a character boundary.
    pub fn bounded_detail(mut detail: String) -> String {
        if detail.len() > MAX_AUDIT_DETAIL_BYTES {
            let mut cut = MAX_AUDIT_DETAIL_BYTES - 3;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
            detail.push_str("...");
        }
        detail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_details_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_AUDIT_DETAIL_BYTES);
        let cut = AuditEntry::bounded_detail(long);
        assert!(cut.len() <= MAX_AUDIT_DETAIL_BYTES && cut.ends_with("..."));
        assert_eq!(AuditEntry::bounded_detail("short".into()), "short");
    }
}

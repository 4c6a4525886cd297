//! Who may do what beyond their own jobs: Slurm's `AdminLevel` (None, Operator, Administrator), granted per uid
//! in the replicated state (`drover admin grant`, `sacctmgr modify user ... set adminlevel=...`).
//!
//! The uid a command carries is the one the controller verified from the caller's credential, never a field the
//! client filled in; uid 0 (root, and the controllers' own housekeeping) is always an administrator.

use serde::{Deserialize, Serialize};

/// Slurm's administrative levels, weakest first (so `>=` reads as "at least").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub enum AdminLevel {
    /// An ordinary user: their own jobs only.
    #[default]
    None,
    /// Operators control any job (cancel, signal, hold, requeue, update) and drain or resume nodes.
    Operator,
    /// Administrators also change partitions, reservations, accounts, QOS, roles and replica membership.
    Administrator,
}

impl AdminLevel {
    /// Slurm's spelling, as `sacctmgr show user` prints it.
    pub fn name(self) -> &'static str {
        match self {
            AdminLevel::None => "None",
            AdminLevel::Operator => "Operator",
            AdminLevel::Administrator => "Administrator",
        }
    }

    /// Parses Slurm's names (and the short forms `operator`, `admin`), case-insensitively.
    pub fn parse(text: &str) -> Option<AdminLevel> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" | "user" => Some(AdminLevel::None),
            "operator" | "oper" => Some(AdminLevel::Operator),
            "administrator" | "admin" => Some(AdminLevel::Administrator),
            _ => None,
        }
    }
}

/// A grant of an administrative level to one uid (the name is what the granting admin called it, for display).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleGrant {
    pub uid: u32,
    pub user: String,
    pub level: AdminLevel,
}

/// The most grants the state holds: roles are for a handful of staff, not every user.
pub const MAX_ROLE_GRANTS: usize = 1_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_order_from_weakest_and_parse_slurms_names() {
        assert!(AdminLevel::Administrator > AdminLevel::Operator && AdminLevel::Operator > AdminLevel::None);
        for level in [AdminLevel::None, AdminLevel::Operator, AdminLevel::Administrator] {
            assert_eq!(AdminLevel::parse(level.name()), Some(level));
        }
        assert_eq!(AdminLevel::parse(" ADMIN "), Some(AdminLevel::Administrator));
        assert_eq!(AdminLevel::parse("root"), None);
    }
}

//! Advance reservations (`scontrol create reservation`): capacity set aside for some users or accounts over a
//! window of time, for a multi-week run's dedicated nodes or a maintenance.

use serde::{Deserialize, Serialize};

/// Most reservations a cluster holds at once (ended ones are purged when a new one is created).
pub const MAX_RESERVATIONS: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReservationFlag {
    /// Maintenance: the nodes are expected to be down; nothing else changes in placement.
    Maint,
    /// Jobs outside the reservation may not use its nodes even before it starts if they would overlap it
    /// (always true in Drover; accepted for Slurm compatibility).
    Ignore,
}

impl ReservationFlag {
    pub fn name(self) -> &'static str {
        match self {
            ReservationFlag::Maint => "MAINT",
            ReservationFlag::Ignore => "IGNORE_JOBS",
        }
    }

    pub fn parse(text: &str) -> Option<ReservationFlag> {
        match text.to_ascii_uppercase().as_str() {
            "MAINT" => Some(ReservationFlag::Maint),
            "IGNORE_JOBS" => Some(ReservationFlag::Ignore),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Reservation {
    pub name: String,
    /// Whole nodes (expanded names). Empty when the reservation holds a GPU count instead.
    pub nodes: Vec<String>,
    /// `TRES=gres/gpu=N`: GPUs set aside on nodes the scheduler chooses.
    pub gpu_count: Option<u32>,
    pub start_ms: u64,
    /// `None`: open-ended (until deleted).
    pub end_ms: Option<u64>,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub flags: Vec<ReservationFlag>,
    /// `PartitionName=`: only for information (`scontrol show reservation`).
    pub partition: Option<String>,
}

impl Reservation {
    /// Whether a job of `user` charging `account` may run inside it.
    pub fn admits(&self, user: &str, account: &str) -> bool {
        self.users.iter().any(|u| u == user) || self.accounts.iter().any(|a| a == account)
    }

    pub fn active_at(&self, now_ms: u64) -> bool {
        self.start_ms <= now_ms && self.end_ms.is_none_or(|end| now_ms < end)
    }

    pub fn ended_at(&self, now_ms: u64) -> bool {
        self.end_ms.is_some_and(|end| end <= now_ms)
    }
}

/// `scontrol update reservation`: the fields to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ReservationUpdate {
    pub name: String,
    pub nodes: Option<Vec<String>>,
    pub gpu_count: Option<u32>,
    pub start_ms: Option<u64>,
    /// `Some(None)` cannot cross JSON; an open end is `end_open`.
    pub end_ms: Option<u64>,
    pub end_open: bool,
    pub users: Option<Vec<String>>,
    pub accounts: Option<Vec<String>>,
    pub flags: Option<Vec<ReservationFlag>>,
}

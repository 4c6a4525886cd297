//! Fair-share accounts: a tree with shares, and each account's decayed GPU usage, as `sacctmgr` and `sshare` know
//! them. Replicated: every change is a command, and usage is charged in `apply` when an allocation is released.

use serde::{Deserialize, Serialize};

/// The account every tree hangs from; it always exists (implicitly, until one is added).
pub const ROOT_ACCOUNT: &str = "root";
/// Most accounts a cluster holds: every pass walks the tree, and `sshare` prints it whole.
pub const MAX_ACCOUNTS: usize = 10_000;
/// Most users one account lists.
pub const MAX_ACCOUNT_USERS: usize = 10_000;

/// One account of the fair-share tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Account {
    pub name: String,
    /// `None` only for `root`; every other account has a parent that exists.
    pub parent: Option<String>,
    /// Raw shares, relative to the siblings (Slurm's `Fairshare=`).
    pub shares: u32,
    /// Users allowed to charge this account. Empty: anyone may (`--account` still has to name it).
    pub users: Vec<String>,
    pub description: String,
    /// GPU-seconds charged directly to this account, decayed with the cluster's half-life to `usage_at_s`.
    /// Running jobs are not in it: the scheduler adds their usage so far when it builds a view.
    pub usage_gpu_s: f64,
    pub usage_at_s: u64,
    /// GPU time its jobs' incarnations held and lost (not decayed), counted as each incarnation ends; see
    /// `crate::apply::goodput` and `State::account_goodput`.
    #[serde(default)]
    pub goodput: crate::model::goodput_totals::GoodputTotals,
    /// Slurm's association `QOS=`: the QOS jobs charging this account may use. Empty: as its parent allows (and
    /// `normal` alone where no account up to root lists any). See `State::allowed_qos`.
    #[serde(default)]
    pub qos: Vec<String>,
    /// Slurm's `DefaultQOS=`: the QOS of a job that names none (empty: as its parent's, else `normal`).
    #[serde(default)]
    pub default_qos: String,
}

impl Default for Account {
    fn default() -> Self {
        Account {
            name: String::new(),
            parent: Some(ROOT_ACCOUNT.to_string()),
            shares: 1,
            users: Vec::new(),
            description: String::new(),
            usage_gpu_s: 0.0,
            usage_at_s: 0,
            goodput: crate::model::goodput_totals::GoodputTotals::default(),
            qos: Vec::new(),
            default_qos: String::new(),
        }
    }
}

impl Account {
    pub fn root() -> Account {
        Account { name: ROOT_ACCOUNT.to_string(), parent: None, ..Account::default() }
    }

    /// Whether `user` may run jobs under this account.
    pub fn admits(&self, user: &str) -> bool {
        self.users.is_empty() || self.users.iter().any(|u| u == user)
    }

    /// Adds `gpu_s` GPU-seconds at `now_s`, decaying what was there first (`half_life_s` 0 = no decay).
    /// Floating point in `apply` is deterministic here: every replica runs the same binary on the same inputs.
    pub fn charge(&mut self, gpu_s: f64, now_s: u64, half_life_s: u64) {
        let elapsed_s = now_s.saturating_sub(self.usage_at_s);
        self.usage_gpu_s = decay(self.usage_gpu_s, elapsed_s, half_life_s) + gpu_s;
        self.usage_at_s = self.usage_at_s.max(now_s);
    }
}

pub use drover_common::decay::decay;

/// GPU-seconds of `gpus` GPUs held from `start_s` to `end_s`, each second decayed to `end_s` (the closed form of
/// the integral, so a ten-day job charged at its end counts its first days at their decayed weight). The same
/// arithmetic as the scheduler's view of running jobs (`drover_common::decay`).
pub fn decayed_gpu_seconds(gpus: u32, start_s: u64, end_s: u64, half_life_s: u64) -> f64 {
    drover_common::decay::decayed_usage(f64::from(gpus), start_s, end_s, end_s, half_life_s)
}

/// `drover account add|modify`: the fields to set (`None` leaves one as it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct AccountUpdate {
    pub name: String,
    pub parent: Option<String>,
    pub shares: Option<u32>,
    pub description: Option<String>,
    /// Users to add to / remove from the account's list.
    pub add_users: Vec<String>,
    pub remove_users: Vec<String>,
    /// The QOS list to set (`Some(vec![])` clears it: the account then allows what its parent does).
    pub qos: Option<Vec<String>>,
    /// The default QOS to set (`Some("")` clears it).
    pub default_qos: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_halves_every_half_life_and_charges_add_up() {
        let mut a = Account { name: "a".into(), ..Account::default() };
        a.charge(100.0, 1_000, 3_600);
        a.charge(0.0, 1_000 + 3_600, 3_600);
        assert!((a.usage_gpu_s - 50.0).abs() < 1e-9, "{}", a.usage_gpu_s);
        a.charge(10.0, 1_000 + 3_600, 3_600);
        assert!((a.usage_gpu_s - 60.0).abs() < 1e-9);
    }

    #[test]
    fn a_long_job_is_charged_its_decayed_integral() {
        // Numerical integration of 8 GPUs over 10 days, decayed to the end with a 7-day half-life.
        let (gpus, span_s, h) = (8u32, 10 * 86_400u64, 7 * 86_400u64);
        let numeric: f64 = (0..span_s).step_by(60).map(|t| 8.0 * 60.0 * decay(1.0, span_s - t, h)).sum();
        let closed = decayed_gpu_seconds(gpus, 0, span_s, h);
        assert!((closed - numeric).abs() / numeric < 1e-3, "{closed} vs {numeric}");
        assert!(closed < 8.0 * span_s as f64);
        assert_eq!(decayed_gpu_seconds(2, 10, 20, 0), 20.0);
    }
}

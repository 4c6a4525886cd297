//! Classic Slurm fair-share: usage in GPU-seconds with half-life decay, and F = 2^(-UE/S) over the account tree.

use std::collections::HashMap;

use crate::error::ScheduleError;
use crate::model::{Account, RunningJob};

/// Usage decayed over `elapsed_s` with the given half-life: `usage * 2^(-elapsed/half_life)`.
/// A zero half-life means "no memory": all past usage is forgotten.
pub fn decay(usage: f64, elapsed_s: u64, half_life_s: u64) -> f64 {
    if half_life_s == 0 {
        return if elapsed_s == 0 { usage } else { 0.0 };
    }
    usage * (-(elapsed_s as f64) / half_life_s as f64).exp2()
}

/// Usage after `elapsed_s` of decay during which `gpus` GPUs were busy the whole time.
///
/// Usage accrued at time `s` within the interval has decayed by `elapsed - s` at its end, so the new usage is
/// `gpus * ∫_0^elapsed 2^(-(elapsed - s)/h) ds = gpus * h/ln2 * (1 - 2^(-elapsed/h))`. This makes accrual
/// independent of how often the leader charges usage (one 1-hour step equals sixty 1-minute steps).
pub fn accrue(usage: f64, gpus: u64, elapsed_s: u64, half_life_s: u64) -> f64 {
    let decayed = decay(usage, elapsed_s, half_life_s);
    if half_life_s == 0 {
        return decayed;
    }
    let h = half_life_s as f64;
    // -expm1 keeps precision when elapsed << half-life (1 - 2^-x would cancel to zero).
    let gained =
        gpus as f64 * h / std::f64::consts::LN_2 * -(-(elapsed_s as f64) * std::f64::consts::LN_2 / h).exp_m1();
    decayed + gained
}

/// Decays every account over `[from_s, to_s)` and charges the running jobs' GPU-seconds in that interval to
/// their accounts. Running jobs must have been running for the whole interval or from their start inside it.
pub fn charge_interval(accounts: &mut [Account], running: &[RunningJob], from_s: u64, to_s: u64, half_life_s: u64) {
    let elapsed_s = to_s.saturating_sub(from_s);
    let mut gpus_by_account: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for job in running {
        let start_s = job.start_s.max(from_s);
        let end_s = job.expected_end_s().min(to_s);
        if start_s >= end_s {
            continue;
        }
        let gpus: u64 = job.alloc.iter().map(|(_, g)| g.len() as u64).sum();
        gpus_by_account.entry(job.account.as_str()).or_default().push((gpus, end_s - start_s));
    }
    for account in accounts.iter_mut() {
        let mut usage = decay(account.usage_gpu_s, elapsed_s, half_life_s);
        if let Some(parts) = gpus_by_account.get(account.name.as_str()) {
            for &(gpus, busy_s) in parts {
                // A job busy for only part of the interval: charge it as if it ran at the end (its usage then
                // decays less); exact for whole-interval jobs, a slight over-charge otherwise.
                usage += accrue(0.0, gpus, busy_s, half_life_s);
            }
        }
        account.usage_gpu_s = usage;
    }
}

/// Per-account fair-share numbers, for `sshare` and the priority factor.
#[derive(Clone, Debug, PartialEq)]
pub struct FairShare {
    pub account: String,
    /// S: product of the account's share fractions among its siblings down from the root.
    pub norm_shares: f64,
    /// U: usage of the account's subtree over the whole tree's usage.
    pub norm_usage: f64,
    /// UE: U plus the parent's excess effective usage, apportioned by shares.
    pub effective_usage: f64,
    /// F = 2^(-UE/S), in [0, 1]; 0 for an account with no shares.
    pub factor: f64,
}

/// The fair-share tree for one pass.
#[derive(Clone, Debug, Default)]
pub struct FairShareTree {
    by_name: HashMap<String, FairShare>,
}

impl FairShareTree {
    /// Builds the tree. Accounts name their parent; exactly the accounts with `parent: None` are roots.
    pub fn new(accounts: &[Account]) -> Result<Self, ScheduleError> {
        let index: HashMap<&str, usize> = accounts.iter().enumerate().map(|(i, a)| (a.name.as_str(), i)).collect();
        if index.len() != accounts.len() {
            return Err(ScheduleError::Duplicate { kind: "account", name: duplicate_name(accounts) });
        }
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); accounts.len()];
        let mut roots = Vec::new();
        for (i, a) in accounts.iter().enumerate() {
            match &a.parent {
                None => roots.push(i),
                Some(p) => match index.get(p.as_str()) {
                    Some(&pi) => children[pi].push(i),
                    None => {
                        return Err(ScheduleError::Unknown { kind: "parent account", name: p.clone() });
                    }
                },
            }
        }
        // Subtree usage, children before parents (post-order), with a visit count to catch cycles.
        let mut subtree_usage = vec![0.0; accounts.len()];
        let mut order = Vec::with_capacity(accounts.len());
        let mut stack: Vec<(usize, bool)> = roots.iter().rev().map(|&r| (r, false)).collect();
        while let Some((i, expanded)) = stack.pop() {
            if expanded {
                subtree_usage[i] =
                    accounts[i].usage_gpu_s.max(0.0) + children[i].iter().map(|&c| subtree_usage[c]).sum::<f64>();
                continue;
            }
            order.push(i);
            stack.push((i, true));
            stack.extend(children[i].iter().rev().map(|&c| (c, false)));
        }
        if order.len() != accounts.len() {
            let stray = (0..accounts.len()).find(|i| !order.contains(i)).map_or_else(String::new, |i| {
                accounts[i].name.clone() // unreachable from a root: part of a cycle
            });
            return Err(ScheduleError::AccountCycle { name: stray });
        }
        let total_usage: f64 = roots.iter().map(|&r| subtree_usage[r]).sum();
        let root_shares: f64 = roots.iter().map(|&r| f64::from(accounts[r].shares)).sum();

        let mut by_name = HashMap::with_capacity(accounts.len());
        let mut stack: Vec<(usize, f64, f64, f64, f64)> = Vec::new(); // (idx, sibling shares, parent S, parent U, parent UE)
        for &r in &roots {
            stack.push((r, root_shares, 1.0, 0.0, 0.0));
        }
        while let Some((i, sibling_shares, parent_s, parent_u, parent_ue)) = stack.pop() {
            let a = &accounts[i];
            let local = if sibling_shares > 0.0 { f64::from(a.shares) / sibling_shares } else { 0.0 };
            let s = parent_s * local;
            let u = if total_usage > 0.0 { subtree_usage[i] / total_usage } else { 0.0 };
            // Slurm's classic effective usage: UE = U + (UE_parent - U_parent) * S_local. For top-level accounts
            // the parent is the whole cluster (U = UE), so UE = U.
            let ue = u + (parent_ue - parent_u) * local;
            let factor = if s > 0.0 { (-ue / s).exp2() } else { 0.0 };
            by_name.insert(
                a.name.clone(),
                FairShare { account: a.name.clone(), norm_shares: s, norm_usage: u, effective_usage: ue, factor },
            );
            let child_shares: f64 = children[i].iter().map(|&c| f64::from(accounts[c].shares)).sum();
            for &c in &children[i] {
                stack.push((c, child_shares, s, u, ue));
            }
        }
        Ok(Self { by_name })
    }

    pub fn get(&self, account: &str) -> Option<&FairShare> {
        self.by_name.get(account)
    }

    /// Fair-share factor of an account; an account the tree does not know gets 0 (lowest priority, but it can run).
    pub fn factor(&self, account: &str) -> f64 {
        self.by_name.get(account).map_or(0.0, |f| f.factor)
    }
}

fn duplicate_name(accounts: &[Account]) -> String {
    let mut seen = std::collections::HashSet::new();
    accounts.iter().find(|a| !seen.insert(a.name.as_str())).map_or_else(String::new, |a| a.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct(name: &str, parent: Option<&str>, shares: u32, usage: f64) -> Account {
        Account { name: name.into(), parent: parent.map(Into::into), shares, usage_gpu_s: usage }
    }

    #[test]
    fn decay_halves_per_half_life() {
        assert!((decay(100.0, 3600, 3600) - 50.0).abs() < 1e-9);
        assert!((decay(100.0, 7200, 3600) - 25.0).abs() < 1e-9);
        assert_eq!(decay(100.0, 0, 3600), 100.0);
        assert_eq!(decay(100.0, 5, 0), 0.0);
    }

    #[test]
    fn accrue_is_step_independent() {
        let h = 7 * 24 * 3600;
        let once = accrue(10.0, 8, 3600, h);
        let mut many = 10.0;
        for _ in 0..60 {
            many = accrue(many, 8, 60, h);
        }
        assert!((once - many).abs() < 1e-6 * once, "{once} vs {many}");
        // Without decay (huge half-life) accrual is just gpus * seconds.
        assert!((accrue(0.0, 8, 3600, u64::MAX / 4) - 8.0 * 3600.0).abs() < 1e-3);
    }

    #[test]
    fn factor_is_one_without_usage_and_half_at_fair_use() {
        let t = FairShareTree::new(&[
            acct("root", None, 1, 0.0),
            acct("a", Some("root"), 2, 0.0),
            acct("b", Some("root"), 1, 0.0),
        ])
        .unwrap();
        assert_eq!(t.factor("a"), 1.0);
        let t = FairShareTree::new(&[
            acct("root", None, 1, 0.0),
            acct("a", Some("root"), 2, 200.0),
            acct("b", Some("root"), 1, 100.0),
        ])
        .unwrap();
        // Each used exactly its share: UE = S, F = 1/2.
        assert!((t.factor("a") - 0.5).abs() < 1e-9);
        assert!((t.factor("b") - 0.5).abs() < 1e-9);
        assert_eq!(t.factor("nobody"), 0.0);
    }

    #[test]
    fn overuse_lowers_factor_and_propagates_down() {
        let t = FairShareTree::new(&[
            acct("root", None, 1, 0.0),
            acct("a", Some("root"), 1, 0.0),
            acct("a1", Some("a"), 1, 300.0),
            acct("b", Some("root"), 1, 100.0),
        ])
        .unwrap();
        assert!(t.factor("a") < t.factor("b"));
        let a1 = t.get("a1").unwrap();
        assert!((a1.norm_shares - 0.5).abs() < 1e-9);
        assert!((a1.norm_usage - 0.75).abs() < 1e-9);
    }

    #[test]
    fn rejects_cycles_and_unknown_parents() {
        assert!(matches!(
            FairShareTree::new(&[acct("a", Some("b"), 1, 0.0), acct("b", Some("a"), 1, 0.0)]),
            Err(ScheduleError::AccountCycle { .. })
        ));
        assert!(matches!(FairShareTree::new(&[acct("a", Some("zz"), 1, 0.0)]), Err(ScheduleError::Unknown { .. })));
    }
}

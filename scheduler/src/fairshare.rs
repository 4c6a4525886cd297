//! Classic Slurm fair-share: usage in GPU-seconds with half-life decay, and F = 2^(-UE/S) over the account tree.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::ScheduleError;
use crate::model::{Account, RunningJob};

pub use drover_common::decay::decay;

/// Usage after `elapsed_s` of decay during which `gpus` GPUs were busy the whole time (see
/// [`drover_common::decay::decayed_usage`]: accrual does not depend on how often the leader charges usage).
pub fn accrue(usage: f64, gpus: u64, elapsed_s: u64, half_life_s: u64) -> f64 {
    decay(usage, elapsed_s, half_life_s)
        + drover_common::decay::decayed_usage(gpus as f64, 0, elapsed_s, elapsed_s, half_life_s)
}

/// GPU-seconds of `gpus` GPUs busy over `[start_s, end_s]`, each second decayed to `now_s`.
pub fn decayed_usage(gpus: u32, start_s: u64, end_s: u64, now_s: u64, half_life_s: u64) -> f64 {
    drover_common::decay::decayed_usage(f64::from(gpus), start_s, end_s, now_s, half_life_s)
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
#[derive(Clone, Debug, Default, PartialEq)]
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
        let tree = Tree::compute(accounts)?;
        let by_name = accounts.iter().zip(tree.numbers).map(|(a, f)| (a.name.clone(), f)).collect();
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

/// One `sshare` row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareRow {
    pub account: String,
    pub parent: Option<String>,
    /// 0 for a root; `sshare` indents by it.
    pub depth: u32,
    pub raw_shares: u32,
    /// S (see [`FairShare::norm_shares`]).
    pub norm_shares: f64,
    /// Decayed GPU-seconds of the account's whole subtree.
    pub raw_usage: f64,
    pub norm_usage: f64,
    pub effective_usage: f64,
    /// F, the account's fair-share factor.
    pub fairshare: f64,
}

/// The rows `sshare` prints: depth-first in tree order, roots and each account's children sorted by name, with the
/// numbers the pass uses for priorities (the same computation). An invalid tree (duplicate names, unknown parent,
/// cycle), which no pass would accept either, gives no rows.
pub fn share_report(accounts: &[Account]) -> Vec<ShareRow> {
    let Ok(tree) = Tree::compute(accounts) else { return Vec::new() };
    let by_name = |v: &mut Vec<usize>| v.sort_by(|&a, &b| accounts[a].name.cmp(&accounts[b].name));
    let mut roots = tree.roots.clone();
    by_name(&mut roots);
    let mut rows = Vec::with_capacity(accounts.len());
    let mut stack: Vec<(usize, u32)> = roots.iter().rev().map(|&r| (r, 0)).collect();
    while let Some((i, depth)) = stack.pop() {
        let (a, f) = (&accounts[i], &tree.numbers[i]);
        rows.push(ShareRow {
            account: a.name.clone(),
            parent: a.parent.clone(),
            depth,
            raw_shares: a.shares,
            norm_shares: f.norm_shares,
            raw_usage: tree.subtree_usage[i],
            norm_usage: f.norm_usage,
            effective_usage: f.effective_usage,
            fairshare: f.factor,
        });
        let mut kids = tree.children[i].clone();
        by_name(&mut kids);
        stack.extend(kids.iter().rev().map(|&c| (c, depth + 1)));
    }
    rows
}

/// The classic fair-share arithmetic over the account tree, indexed like the input accounts.
struct Tree {
    roots: Vec<usize>,
    /// In input order (the sums below run in that order, so the numbers do not depend on how a report sorts).
    children: Vec<Vec<usize>>,
    subtree_usage: Vec<f64>,
    numbers: Vec<FairShare>,
}

impl Tree {
    fn compute(accounts: &[Account]) -> Result<Self, ScheduleError> {
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

        let mut numbers: Vec<Option<FairShare>> = vec![None; accounts.len()];
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
            numbers[i] =
                Some(FairShare { account: a.name.clone(), norm_shares: s, norm_usage: u, effective_usage: ue, factor });
            let child_shares: f64 = children[i].iter().map(|&c| f64::from(accounts[c].shares)).sum();
            for &c in &children[i] {
                stack.push((c, child_shares, s, u, ue));
            }
        }
        // Every account is reachable (checked above), so every one got its numbers.
        let numbers = numbers.into_iter().map(Option::unwrap_or_default).collect();
        Ok(Self { roots, children, subtree_usage, numbers })
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
        // Half-life 0: no decay at all.
        assert_eq!(decay(100.0, 5, 0), 100.0);
    }

    #[test]
    fn decayed_usage_matches_numeric_integration() {
        let (g, h) = (8, 3_600);
        for (start, end, now) in [(0, 7_200, 7_200), (1_000, 4_000, 10_000), (5, 6, 6), (0, 86_400, 90_000)] {
            let closed = decayed_usage(g, start, end, now, h);
            // Midpoint rule, one-second steps: each second's usage decayed to `now`.
            let numeric: f64 =
                (start..end).map(|t| f64::from(g) * (-((now as f64 - (t as f64 + 0.5)) / h as f64)).exp2()).sum();
            assert!((closed - numeric).abs() <= 1e-6 * numeric.max(1.0), "{start}..{end}@{now}: {closed} vs {numeric}");
        }
        // No half-life: plain GPU-seconds, whenever it is read.
        assert_eq!(decayed_usage(4, 100, 400, 1_000_000, 0), 1_200.0);
        assert_eq!(decayed_usage(4, 400, 100, 1_000, h), 0.0);
        // Charging in two pieces equals charging once.
        let whole = decayed_usage(g, 0, 1_000, 5_000, h);
        let parts = decayed_usage(g, 0, 400, 5_000, h) + decayed_usage(g, 400, 1_000, 5_000, h);
        assert!((whole - parts).abs() < 1e-9 * whole);
    }

    #[test]
    fn share_report_is_in_tree_order_and_shares_add_up() {
        let accounts = [
            acct("zeta", Some("root"), 1, 10.0),
            acct("root", None, 1, 0.0),
            acct("alpha", Some("root"), 3, 30.0),
            acct("a2", Some("alpha"), 1, 5.0),
            acct("a1", Some("alpha"), 2, 0.0),
        ];
        let rows = share_report(&accounts);
        let names: Vec<(&str, u32)> = rows.iter().map(|r| (r.account.as_str(), r.depth)).collect();
        assert_eq!(names, [("root", 0), ("alpha", 1), ("a1", 2), ("a2", 2), ("zeta", 1)]);
        let row = |n: &str| rows.iter().find(|r| r.account == n).unwrap();
        assert!((row("alpha").norm_shares + row("zeta").norm_shares - row("root").norm_shares).abs() < 1e-12);
        assert!((row("a1").norm_shares + row("a2").norm_shares - row("alpha").norm_shares).abs() < 1e-12);
        assert_eq!(row("alpha").raw_usage, 35.0);
        assert_eq!(row("root").raw_usage, 45.0);
        // The same numbers the pass uses.
        let tree = FairShareTree::new(&accounts).unwrap();
        for r in &rows {
            assert_eq!(r.fairshare, tree.factor(&r.account));
            assert_eq!(r.effective_usage, tree.get(&r.account).unwrap().effective_usage);
        }
        assert!(share_report(&[acct("a", Some("ghost"), 1, 0.0)]).is_empty());
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

//! Topology-aware node choice: fewest switches, then fewest racks, never across sites unless asked;
//! among equals, best fit (the nodes left with the fewest free GPUs).

use crate::fxhash::FxMap;

/// A node that can take the job over the whole window, with what it has free then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node: u32,
    pub site: u32,
    pub rack: u32,
    pub switch: u32,
    /// Free GPUs on the node at the job's start; lower is preferred (it packs partly used nodes first).
    pub free: i32,
}

/// Picks `n` of the candidates, or None if they cannot host the job (too few, or too few on one site when
/// `allow_multi_site` is false). Deterministic: ties break on the lower id.
pub fn choose_nodes(cands: &[Candidate], n: usize, allow_multi_site: bool) -> Option<Vec<u32>> {
    if n == 0 || cands.len() < n {
        return None;
    }
    if n == 1 {
        return cands.iter().min_by_key(|c| (c.free, c.node)).map(|c| vec![c.node]);
    }
    // The smallest group that still holds the whole job, at the tightest level first: a job that fits under
    // one switch should not take a switch another job needs whole.
    let levels: [fn(&Candidate) -> u32; 3] = [|c| c.switch, |c| c.rack, |c| c.site];
    for level in levels {
        let mut counts: FxMap<u32, usize> = FxMap::default();
        for c in cands {
            *counts.entry(level(c)).or_default() += 1;
        }
        let best = counts.iter().filter(|&(_, &k)| k >= n).min_by_key(|&(&g, &k)| (k, g)).map(|(&g, _)| g);
        if let Some(g) = best {
            let group: Vec<Candidate> = cands.iter().copied().filter(|c| level(c) == g).collect();
            return Some(pack(&group, n));
        }
    }
    if allow_multi_site { Some(pack(cands, n)) } else { None }
}

/// Takes `n` nodes filling the biggest sites, racks and switches first (so the job spans as few as possible),
/// best fit within a switch.
fn pack(group: &[Candidate], n: usize) -> Vec<u32> {
    let mut site_n: FxMap<u32, usize> = FxMap::default();
    let mut rack_n: FxMap<u32, usize> = FxMap::default();
    let mut switch_n: FxMap<u32, usize> = FxMap::default();
    for c in group {
        *site_n.entry(c.site).or_default() += 1;
        *rack_n.entry(c.rack).or_default() += 1;
        *switch_n.entry(c.switch).or_default() += 1;
    }
    let mut sorted = group.to_vec();
    sorted.sort_by_key(|c| {
        (
            std::cmp::Reverse(site_n[&c.site]),
            c.site,
            std::cmp::Reverse(rack_n[&c.rack]),
            c.rack,
            std::cmp::Reverse(switch_n[&c.switch]),
            c.switch,
            c.free,
            c.node,
        )
    });
    sorted.into_iter().take(n).map(|c| c.node).collect()
}

/// The lowest `count` set bits of `mask` (GPU indices), or None if it has fewer.
pub fn lowest_gpus(mask: u64, count: u32) -> Option<Vec<u32>> {
    if mask.count_ones() < count {
        return None;
    }
    let mut m = mask;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        out.push(m.trailing_zeros());
        m &= m - 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(node: u32, site: u32, rack: u32, switch: u32, free: i32) -> Candidate {
        Candidate { node, site, rack, switch, free }
    }

    #[test]
    fn single_node_best_fit() {
        let cands = [c(0, 0, 0, 0, 8), c(1, 0, 0, 0, 3), c(2, 0, 0, 0, 3)];
        assert_eq!(choose_nodes(&cands, 1, false), Some(vec![1]));
    }

    #[test]
    fn prefers_one_switch_then_smallest_fitting() {
        // switch 0: 3 nodes, switch 1: 5 nodes, switch 2: 4 nodes -> a 4-node job takes switch 2.
        let mut cands = Vec::new();
        for i in 0..3 {
            cands.push(c(i, 0, 0, 0, 8));
        }
        for i in 3..8 {
            cands.push(c(i, 0, 0, 1, 8));
        }
        for i in 8..12 {
            cands.push(c(i, 0, 1, 2, 8));
        }
        assert_eq!(choose_nodes(&cands, 4, false), Some(vec![8, 9, 10, 11]));
        // 6 nodes: no switch holds it; rack 0 (8 nodes) does: switch 1 whole, then one from switch 0.
        assert_eq!(choose_nodes(&cands, 6, false), Some(vec![3, 4, 5, 6, 7, 0]));
    }

    #[test]
    fn never_spans_sites_unless_asked() {
        let cands = [c(0, 0, 0, 0, 8), c(1, 1, 1, 1, 8)];
        assert_eq!(choose_nodes(&cands, 2, false), None);
        assert_eq!(choose_nodes(&cands, 2, true), Some(vec![0, 1]));
    }

    #[test]
    fn lowest_gpus_first() {
        assert_eq!(lowest_gpus(0b1011_0100, 3), Some(vec![2, 4, 5]));
        assert_eq!(lowest_gpus(0b1, 2), None);
        assert_eq!(lowest_gpus(0, 0), Some(vec![]));
    }
}

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
        if let Some(g) = Counts::of(cands, level).smallest_holding(n) {
            let group: Vec<Candidate> = cands.iter().copied().filter(|c| level(c) == g).collect();
            return Some(pack(&group, n));
        }
    }
    if allow_multi_site { Some(pack(cands, n)) } else { None }
}

/// Candidates per group id at one level. The pass interns sites, racks and switches densely, so a table indexed
/// by id is the common case (a hash map per level was most of a multi-node start at 10k nodes); ids much larger
/// than the candidate count fall back to a map.
enum Counts {
    Dense(Vec<u32>),
    Sparse(FxMap<u32, u32>),
}

impl Counts {
    fn of(cands: &[Candidate], level: fn(&Candidate) -> u32) -> Self {
        let max = cands.iter().map(level).max().unwrap_or(0) as usize;
        if max <= 4 * cands.len() + 1024 {
            let mut dense = vec![0u32; max + 1];
            for c in cands {
                dense[level(c) as usize] += 1;
            }
            Counts::Dense(dense)
        } else {
            let mut sparse: FxMap<u32, u32> = FxMap::default();
            for c in cands {
                *sparse.entry(level(c)).or_default() += 1;
            }
            Counts::Sparse(sparse)
        }
    }

    fn get(&self, g: u32) -> u32 {
        match self {
            Counts::Dense(d) => d[g as usize],
            Counts::Sparse(m) => m[&g],
        }
    }

    /// The group with the fewest candidates that still has `n`, the lower id among equals. (Count and id are
    /// unique per group, so the answer does not depend on the order the groups are visited in.)
    fn smallest_holding(&self, n: usize) -> Option<u32> {
        let holds = |k: u32| k as usize >= n;
        match self {
            Counts::Dense(d) => {
                d.iter().enumerate().filter(|&(_, &k)| holds(k)).min_by_key(|&(g, &k)| (k, g)).map(|(g, _)| g as u32)
            }
            Counts::Sparse(m) => m.iter().filter(|&(_, &k)| holds(k)).min_by_key(|&(&g, &k)| (k, g)).map(|(&g, _)| g),
        }
    }
}

/// Takes `n` nodes filling the biggest sites, racks and switches first (so the job spans as few as possible),
/// best fit within a switch.
fn pack(group: &[Candidate], n: usize) -> Vec<u32> {
    let site_n = Counts::of(group, |c| c.site);
    let rack_n = Counts::of(group, |c| c.rack);
    let switch_n = Counts::of(group, |c| c.switch);
    let mut sorted = group.to_vec();
    sorted.sort_by_key(|c| {
        (
            std::cmp::Reverse(site_n.get(c.site)),
            c.site,
            std::cmp::Reverse(rack_n.get(c.rack)),
            c.rack,
            std::cmp::Reverse(switch_n.get(c.switch)),
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
    fn large_group_ids_choose_as_small_ones() {
        // The same topology with ids far beyond the candidate count (counted in a map, not a table).
        let mut small = Vec::new();
        for i in 0..40 {
            small.push(c(i, i / 20, i / 10, i / 3, (i % 5) as i32));
        }
        let big: Vec<Candidate> = small
            .iter()
            .map(|x| Candidate {
                site: x.site * 1_000_003,
                rack: x.rack * 1_000_003,
                switch: x.switch * 1_000_003,
                ..*x
            })
            .collect();
        for n in 2..=25 {
            for multi in [false, true] {
                assert_eq!(choose_nodes(&small, n, multi), choose_nodes(&big, n, multi), "n={n}");
            }
        }
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

//! Availability timeline of one node: free GPUs as a step function of time.
//!
//! Running jobs release GPUs at their expected end; planned reservations take them for a window. A node rarely
//! has more than a handful of steps, so a sorted `Vec` beats any tree here, and every query is one linear walk.

/// Step function `t -> free GPUs`, defined from `origin_s` to infinity. `steps[i] = (t, v)`: value `v` from `t`
/// until the next step. Values may go negative when reservations overlap already-running work (the view was
/// already overcommitted); callers treat negative as "nothing free".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    steps: Vec<(u64, i32)>,
}

impl Profile {
    pub fn new(origin_s: u64, free: i32) -> Self {
        // Room for a few steps up front: a busy node gets one per running job and reservation, and growing a
        // one-element Vec step by step was a visible share of building 10,000 profiles.
        let mut steps = Vec::with_capacity(4);
        steps.push((origin_s, free));
        Self { steps }
    }

    pub fn origin_s(&self) -> u64 {
        self.steps[0].0
    }

    pub fn steps(&self) -> &[(u64, i32)] {
        &self.steps
    }

    /// Index of the step containing `t` (clamped to the first step for `t` before the origin).
    fn index_at(&self, t: u64) -> usize {
        // Most queries of a pass are from its `now`, inside the first step: answered without the search.
        if self.steps.get(1).is_none_or(|&(s, _)| s > t) {
            return 0;
        }
        // partition_point: first step strictly after t; the one before it contains t.
        self.steps.partition_point(|&(s, _)| s <= t).saturating_sub(1)
    }

    pub fn value_at(&self, t: u64) -> i32 {
        self.steps[self.index_at(t)].1
    }

    /// Makes sure a step starts exactly at `t` (t >= origin), returning its index.
    fn split_at(&mut self, t: u64) -> usize {
        let i = self.index_at(t);
        if self.steps[i].0 == t {
            return i;
        }
        let v = self.steps[i].1;
        self.steps.insert(i + 1, (t, v));
        i + 1
    }

    /// Adds `delta` over `[from_s, to_s)`; `to_s == u64::MAX` means forever.
    pub fn add(&mut self, from_s: u64, to_s: u64, delta: i32) {
        let from_s = from_s.max(self.origin_s());
        if from_s >= to_s || delta == 0 {
            return;
        }
        let a = self.split_at(from_s);
        let b = if to_s == u64::MAX { self.steps.len() } else { self.split_at(to_s) };
        for step in &mut self.steps[a..b] {
            step.1 += delta;
        }
        self.merge_equal();
    }

    /// Drops steps that repeat the previous value, so the profile stays as short as the information in it.
    fn merge_equal(&mut self) {
        self.steps.dedup_by(|later, earlier| later.1 == earlier.1);
    }

    /// Minimum value over `[from_s, to_s)`.
    pub fn min_over(&self, from_s: u64, to_s: u64) -> i32 {
        let mut i = self.index_at(from_s);
        let mut m = self.steps[i].1;
        i += 1;
        while i < self.steps.len() && self.steps[i].0 < to_s {
            m = m.min(self.steps[i].1);
            i += 1;
        }
        m
    }

    /// Minimum over `[from_s, to_s)` of the value plus `extra`: each `(end_s, delta)` (delta >= 0) adds `delta`
    /// at every time before `end_s` (GPUs a preempted job would hand back early).
    ///
    /// Within one step the extra only shrinks with time, so the step's minimum is at its last second, where
    /// exactly the deltas with `end_s >=` the step's end still count.
    pub fn min_over_plus(&self, from_s: u64, to_s: u64, extra: &[(u64, i32)]) -> i32 {
        let mut i = self.index_at(from_s);
        let mut m = i32::MAX;
        loop {
            let seg_end = self.steps.get(i + 1).map_or(u64::MAX, |&(t, _)| t).min(to_s);
            let bonus: i32 = extra.iter().filter(|&&(e, _)| e >= seg_end).map(|&(_, d)| d).sum();
            m = m.min(self.steps[i].1 + bonus);
            i += 1;
            if i >= self.steps.len() || self.steps[i].0 >= to_s {
                return m;
            }
        }
    }

    /// Takes `need` over `[from_s, to_s)` where `extra` (as in [`Self::min_over_plus`]) covers what it can: the
    /// value drops by `need - min(need, extra at t)`. It never rises, so whatever a pass derived from the profile
    /// (lower bounds of earliest starts, failed start-now shapes) stays valid.
    pub fn take_covered(&mut self, from_s: u64, to_s: u64, need: i32, extra: &[(u64, i32)]) {
        let mut cuts: Vec<u64> = extra.iter().map(|&(e, _)| e).filter(|&e| e > from_s && e < to_s).collect();
        cuts.push(to_s);
        cuts.sort_unstable();
        cuts.dedup();
        let mut a = from_s;
        for b in cuts {
            // For t in [a, b) the deltas still counting are exactly those ending at b or later.
            let covered: i32 = extra.iter().filter(|&&(e, _)| e >= b).map(|&(_, d)| d).sum();
            self.add(a, b, -(need - covered.min(need)).max(0));
            a = b;
        }
    }

    /// Earliest `t >= from_s` at which the value is at least `need` (for any duration): a lower bound of
    /// [`Self::earliest_fit`] that only grows as GPUs are taken. None if never.
    pub fn first_at_least(&self, from_s: u64, need: i32) -> Option<u64> {
        let from_s = from_s.max(self.origin_s());
        let i = self.index_at(from_s);
        self.steps[i..].iter().find(|&&(_, v)| v >= need).map(|&(t, _)| t.max(from_s))
    }

    /// Earliest `s >= from_s` such that the value is at least `need` over all of `[s, s + duration_s)`.
    /// None if never (the last step stays below `need`).
    pub fn earliest_fit(&self, from_s: u64, duration_s: u64, need: i32) -> Option<u64> {
        let mut s = from_s.max(self.origin_s());
        let mut i = self.index_at(s);
        loop {
            let (_, v) = self.steps[i];
            let seg_end = self.steps.get(i + 1).map_or(u64::MAX, |&(t, _)| t);
            if v < need {
                // The window cannot include this step: the earliest candidate is right after it.
                if seg_end == u64::MAX {
                    return None;
                }
                s = seg_end;
            } else if seg_end >= s.saturating_add(duration_s) {
                return Some(s);
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_query() {
        let mut p = Profile::new(0, 4);
        p.add(10, 20, -3);
        assert_eq!(p.value_at(5), 4);
        assert_eq!(p.value_at(10), 1);
        assert_eq!(p.value_at(19), 1);
        assert_eq!(p.value_at(20), 4);
        assert_eq!(p.min_over(0, 10), 4);
        assert_eq!(p.min_over(0, 11), 1);
        assert_eq!(p.min_over(20, u64::MAX), 4);
        p.add(10, 20, 3);
        assert_eq!(p.steps(), &[(0, 4)]);
    }

    #[test]
    fn earliest_fit_skips_dips() {
        let mut p = Profile::new(0, 2);
        p.add(0, 50, -2); // busy until 50
        p.add(60, 70, -1); // a reservation dips to 1 in [60, 70)
        assert_eq!(p.earliest_fit(0, 10, 2), Some(50));
        assert_eq!(p.earliest_fit(0, 11, 2), Some(70));
        assert_eq!(p.earliest_fit(0, 100, 1), Some(50));
        assert_eq!(p.earliest_fit(0, 1, 3), None);
        p.add(80, u64::MAX, -2);
        assert_eq!(p.earliest_fit(0, 20, 2), None);
        assert_eq!(p.earliest_fit(0, 10, 2), Some(50));
        assert_eq!(p.first_at_least(0, 2), Some(50));
        assert_eq!(p.first_at_least(55, 1), Some(55));
        assert_eq!(p.first_at_least(0, 3), None);
    }

    #[test]
    fn min_over_plus_and_take_covered() {
        // 8 GPUs; a victim holds 4 until 100 (given back then); a reservation takes 2 in [50, 60).
        let mut p = Profile::new(0, 4);
        p.add(100, u64::MAX, 4);
        p.add(50, 60, -2);
        assert_eq!(p.min_over_plus(10, 200, &[]), 2);
        // With the victim gone from 10: 8 everywhere but the reservation.
        assert_eq!(p.min_over_plus(10, 200, &[(100, 4)]), 6);
        assert_eq!(p.min_over_plus(10, 50, &[(100, 4)]), 8);
        // An extra ending inside a step counts only before it: [60, 100) then [100, ..) is the same step value.
        assert_eq!(p.min_over_plus(60, 200, &[(80, 4)]), 4);
        assert_eq!(p.min_over_plus(60, 80, &[(80, 4)]), 8);
        // Take 6 over [10, 200) with the victim's 4 covering until 100: 2 from the profile before 100, 6 after.
        let mut q = p.clone();
        q.take_covered(10, 200, 6, &[(100, 4)]);
        assert_eq!(q.value_at(20), 2);
        assert_eq!(q.value_at(55), 0);
        assert_eq!(q.value_at(150), 2);
        assert_eq!(q.value_at(200), 8);
        // Never rises, even when the extra covers more than needed.
        let mut r = p.clone();
        r.take_covered(10, 200, 2, &[(300, 8)]);
        assert_eq!(r, p);
    }
}

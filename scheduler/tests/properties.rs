//! Property tests over random clusters and queues: no double booking, backfill never delays a reservation,
//! advance reservations never violated.

use std::collections::{HashMap, HashSet};

use drover_scheduler::synth::{XorShift, cluster, occupy};
use drover_scheduler::{
    AdvanceReservation, ArrayLimit, ClusterView, PendingJob, PriorityWeights, Reason, RunningJob, SchedulerConfig,
    schedule,
};
use proptest::prelude::*;

fn config() -> SchedulerConfig {
    let weights = PriorityWeights { age: 0, fairshare: 0, job_size: 0, partition: 0, qos: 0, ..Default::default() };
    SchedulerConfig { weights, ..SchedulerConfig::default() }
}

/// A random cluster of 1..24 nodes with random busy GPUs, a random queue, and maybe one advance reservation.
fn random_view(seed: u64, with_reservation: bool) -> ClusterView {
    let mut rng = XorShift::new(seed);
    let nodes = 1 + rng.below(24) as usize;
    let gpus = 1 + rng.below(8) as u32;
    let mut v = cluster(nodes, gpus);
    v.now_s = 1_000;
    let mut id = 1;
    for i in 0..nodes {
        let busy = rng.below(u64::from(gpus) + 1) as u32;
        if busy > 0 {
            let held: Vec<u32> = (0..gpus).filter(|_| rng.below(2) == 0).take(busy as usize).collect();
            if !held.is_empty() {
                occupy(&mut v, 10_000 + id, i, &held, 1_000 - rng.below(500), 100 + rng.below(2_000));
                id += 1;
            }
        }
    }
    if with_reservation && nodes > 1 {
        let k = 1 + rng.below(nodes as u64 / 2) as usize;
        v.reservations.push(AdvanceReservation {
            name: "r".into(),
            nodes: (0..k).map(|i| v.nodes[i].name.clone()).collect(),
            gpu_count: None,
            start_s: 1_000 + rng.below(1_000),
            duration_s: if rng.below(3) == 0 { None } else { Some(100 + rng.below(2_000)) },
            users: vec!["vip".into()],
            accounts: Vec::new(),
            flags: Vec::new(),
        });
    }
    for j in 0..(1 + rng.below(40)) {
        let n = 1 + if rng.below(4) == 0 { rng.below(4) as u32 } else { 0 };
        let g = rng.below(u64::from(gpus) + 1) as u32;
        let mut job = PendingJob::simple(j + 1, rng.below(1_000), n, g, 10 + rng.below(3_000));
        job.exclusive = rng.below(10) == 0;
        if with_reservation && rng.below(4) == 0 {
            job.user = "vip".into();
            job.reservation = Some("r".into());
        }
        v.pending.push(job);
    }
    v
}

/// A roomy cluster (many small jobs fit in one pass) with job arrays, per-account QOS limits, several users and
/// accounts, nice values and topped jobs; some array tasks and accounts already have running jobs.
fn limits_view(seed: u64) -> ClusterView {
    let mut rng = XorShift::new(seed);
    let mut v = cluster(2 + rng.below(10) as usize, 8);
    v.now_s = 10_000;
    v.qos[0].max_jobs_per_account = (rng.below(2) == 0).then(|| 1 + rng.below(8) as u32);
    v.qos[0].max_gpus_per_account = (rng.below(2) == 0).then(|| 1 + rng.below(24) as u32);
    let accounts = ["acct0", "acct1", "acct2"];
    let running = rng.below(4);
    for r in 0..running {
        let node = rng.below(v.nodes.len() as u64) as usize;
        occupy(&mut v, 90_000 + r, node, &[0], 9_000, 5_000);
        let job = v.running.last_mut().unwrap();
        job.account = accounts[rng.below(3) as usize].into();
        job.array_id = (rng.below(2) == 0).then(|| 1_000 + rng.below(3));
    }
    for j in 0..(1 + rng.below(60)) {
        let mut job = PendingJob::simple(j + 1, rng.below(10_000), 1, rng.below(3) as u32, 10 + rng.below(3_000));
        job.user = format!("u{}", rng.below(4));
        job.account = accounts[rng.below(3) as usize].into();
        job.nice = rng.below(200) as i32 - 50;
        if rng.below(5) == 0 {
            job.top_rank = 1 + rng.below(3);
        }
        if rng.below(2) == 0 {
            // Three arrays; a task's throttle is its array's.
            let a = rng.below(3);
            job.array = Some(ArrayLimit { array_id: 1_000 + a, max_running: 1 + a as u32 * 2 });
        }
        v.pending.push(job);
    }
    v
}

/// Weights that make priorities differ between jobs (age and fair-share), unlike [`config`].
fn weighted() -> SchedulerConfig {
    let weights = PriorityWeights {
        age: 10_000,
        fairshare: 0,
        job_size: 0,
        partition: 0,
        qos: 0,
        max_age_s: 10_000,
        favor_small: false,
    };
    SchedulerConfig { weights, ..SchedulerConfig::default() }
}

/// The view after the plan's starts have begun at `now`.
fn apply(v: &ClusterView, plan: &drover_scheduler::Plan) -> ClusterView {
    let mut next = v.clone();
    for (id, alloc) in &plan.starts {
        let job = v.pending.iter().find(|p| p.id == *id).expect("planned job is pending");
        for (name, gpus) in alloc {
            let n = next.nodes.iter_mut().find(|n| &n.name == name).expect("planned node exists");
            n.free_gpus.retain(|g| !gpus.contains(g));
        }
        next.running.push(RunningJob {
            id: *id,
            user: job.user.clone(),
            account: job.account.clone(),
            qos: job.qos.clone(),
            alloc: alloc.clone(),
            start_s: v.now_s,
            time_limit_s: job.time_limit_s,
            exclusive: job.exclusive,
            reservation: job.reservation.clone(),
            array_id: job.array.map(|a| a.array_id),
        });
        next.pending.retain(|p| p.id != *id);
    }
    next
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn no_gpu_is_double_booked(seed in any::<u64>()) {
        let v = random_view(seed, true);
        let plan = schedule(&v, &config()).unwrap();
        let mut used: HashSet<(String, u32)> = HashSet::new();
        for r in &v.running {
            for (n, gs) in &r.alloc {
                for &g in gs {
                    prop_assert!(used.insert((n.clone(), g)));
                }
            }
        }
        for (id, alloc) in &plan.starts {
            let job = v.pending.iter().find(|p| p.id == *id).unwrap();
            prop_assert_eq!(alloc.len(), job.nodes as usize);
            for (n, gs) in alloc {
                let node = v.nodes.iter().find(|x| &x.name == n).unwrap();
                let want = if job.exclusive { node.gpus_total } else { job.gpus_per_node };
                prop_assert_eq!(gs.len() as u32, want);
                for &g in gs {
                    prop_assert!(g < node.gpus_total);
                    prop_assert!(used.insert((n.clone(), g)), "GPU {}:{} booked twice", n, g);
                }
            }
        }
    }

    #[test]
    fn backfill_never_delays_a_reservation(seed in any::<u64>()) {
        // Start everything the plan starts (backfilled jobs included); the next pass must give every reserved
        // job the same or an earlier start.
        let v = random_view(seed, false);
        let plan = schedule(&v, &config()).unwrap();
        let after = schedule(&apply(&v, &plan), &config()).unwrap();
        // Only the single-node jobs ahead of the first multi-node reservation: the multi-node search may pick
        // different (equally early) nodes on the smaller free set, which can shift reservations behind it.
        let mut prefix = Vec::new();
        for (id, t) in &plan.expected_start {
            let job = v.pending.iter().find(|p| p.id == *id).unwrap();
            prefix.push((*id, *t));
            if job.nodes > 1 {
                break;
            }
        }
        for (id, t) in prefix {
            let later = after.expected_start_of(id);
            let starts_now = after.start_of(id).is_some();
            prop_assert!(starts_now || later.is_some_and(|l| l <= t), "job {} reserved at {} now {:?}", id, t, later);
        }
        // And with the lowest started job removed from the queue, the reservations of the jobs ahead of it (the
        // ones it was backfilled past) are unchanged.
        if let Some((last, _)) = plan.starts.last() {
            let rank = |id: u64| plan.priorities.iter().position(|(j, _)| *j == id).unwrap();
            let mut without = v.clone();
            without.pending.retain(|p| p.id != *last);
            let p2 = schedule(&without, &config()).unwrap();
            for (id, t) in plan.expected_start.iter().filter(|(id, _)| rank(*id) < rank(*last)) {
                prop_assert_eq!(p2.expected_start_of(*id), Some(*t));
            }
        }
    }

    #[test]
    fn advance_reservations_are_never_violated(seed in any::<u64>()) {
        let v = random_view(seed, true);
        let plan = schedule(&v, &config()).unwrap();
        let Some(r) = v.reservations.first() else { return Ok(()) };
        let (rs, re) = (r.start_s, r.end_s());
        for (id, alloc) in &plan.starts {
            let job = v.pending.iter().find(|p| p.id == *id).unwrap();
            let (js, je) = (v.now_s, v.now_s + job.time_limit_s);
            for (n, _) in alloc {
                let reserved = r.nodes.contains(n);
                if job.reservation.is_some() {
                    prop_assert!(reserved && js >= rs && je <= re, "job {} outside its reservation", id);
                } else if reserved {
                    prop_assert!(je <= rs || js >= re, "job {} on reserved node {} during it", id, n);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn array_throttle_is_never_exceeded(seed in any::<u64>()) {
        let v = limits_view(seed);
        let plan = schedule(&v, &weighted()).unwrap();
        let limit: HashMap<u64, u32> =
            v.pending.iter().filter_map(|j| j.array).map(|a| (a.array_id, a.max_running)).collect();
        let mut count: HashMap<u64, u32> = HashMap::new();
        for r in &v.running {
            if let Some(a) = r.array_id {
                *count.entry(a).or_default() += 1;
            }
        }
        let before = count.clone();
        for (id, _) in &plan.starts {
            let job = v.pending.iter().find(|p| p.id == *id).unwrap();
            if let Some(a) = job.array {
                let c = count.entry(a.array_id).or_default();
                *c += 1;
                prop_assert!(*c <= a.max_running, "array {} runs {} > {}", a.array_id, c, a.max_running);
            }
        }
        for (a, c) in &count {
            // Started tasks never push an array over its throttle (running ones may already be over it).
            if let Some(&max) = limit.get(a) {
                prop_assert!(*c <= max.max(before.get(a).copied().unwrap_or(0)));
            }
        }
        for (id, r) in &plan.reasons {
            if *r == Reason::JobArrayTaskLimit {
                prop_assert!(plan.expected_start_of(*id).is_none(), "throttled task {} holds a reservation", id);
            }
        }
    }

    #[test]
    fn per_account_qos_limits_hold(seed in any::<u64>()) {
        let v = limits_view(seed);
        let plan = schedule(&v, &weighted()).unwrap();
        let q = &v.qos[0];
        let mut used: HashMap<&str, (u32, u32)> = HashMap::new();
        for r in &v.running {
            let e = used.entry(r.account.as_str()).or_default();
            e.0 += 1;
            e.1 += r.alloc.iter().map(|(_, g)| g.len() as u32).sum::<u32>();
        }
        for (id, alloc) in &plan.starts {
            let job = v.pending.iter().find(|p| p.id == *id).unwrap();
            let e = used.entry(job.account.as_str()).or_default();
            e.0 += 1;
            e.1 += alloc.iter().map(|(_, g)| g.len() as u32).sum::<u32>();
            prop_assert!(q.max_jobs_per_account.is_none_or(|m| e.0 <= m), "account {} runs {} jobs", job.account, e.0);
            prop_assert!(q.max_gpus_per_account.is_none_or(|m| e.1 <= m), "account {} holds {} GPUs", job.account, e.1);
        }
        for (id, r) in &plan.reasons {
            if matches!(r, Reason::QOSMaxJobsPerAccountLimit | Reason::QOSMaxGRESPerAccount) {
                prop_assert!(plan.expected_start_of(*id).is_none());
            }
        }
    }

    #[test]
    fn top_permutes_only_within_the_user(seed in any::<u64>()) {
        let v = limits_view(seed);
        let mut untopped = v.clone();
        for j in &mut untopped.pending {
            j.top_rank = 0;
        }
        let prio = |v: &ClusterView| -> HashMap<u64, u64> {
            schedule(v, &weighted()).unwrap().priorities.into_iter().map(|(id, b)| (id, b.priority)).collect()
        };
        let (with, without) = (prio(&v), prio(&untopped));
        let mut users: HashMap<&str, (Vec<u64>, Vec<u64>)> = HashMap::new();
        for j in &v.pending {
            let e = users.entry(j.user.as_str()).or_default();
            e.0.push(with[&j.id]);
            e.1.push(without[&j.id]);
        }
        let topped: HashSet<&str> = v.pending.iter().filter(|j| j.top_rank != 0).map(|j| j.user.as_str()).collect();
        for j in &v.pending {
            if !topped.contains(j.user.as_str()) {
                prop_assert_eq!(with[&j.id], without[&j.id], "job {} of an untopped user changed", j.id);
            }
        }
        for (user, (mut a, mut b)) in users {
            a.sort_unstable();
            b.sort_unstable();
            prop_assert_eq!(a, b, "user {}'s priority values changed", user);
        }
        // A topped job is at least as high as every untopped job of its user.
        for j in v.pending.iter().filter(|j| j.top_rank != 0) {
            for k in v.pending.iter().filter(|k| k.user == j.user && k.top_rank == 0) {
                prop_assert!(with[&j.id] >= with[&k.id]);
            }
        }
    }

    #[test]
    fn nice_lowers_priority(seed in any::<u64>()) {
        let mut v = limits_view(seed);
        for j in &mut v.pending {
            j.top_rank = 0;
        }
        let mut plain = v.clone();
        for j in &mut plain.pending {
            j.nice = 0;
        }
        let a = schedule(&v, &weighted()).unwrap();
        let b = schedule(&plain, &weighted()).unwrap();
        let base: HashMap<u64, u64> = b.priorities.iter().map(|(id, p)| (*id, p.priority)).collect();
        for (id, p) in &a.priorities {
            let nice = v.pending.iter().find(|j| j.id == *id).unwrap().nice;
            prop_assert_eq!(p.priority, base[id].saturating_add_signed(-i64::from(nice)));
            prop_assert_eq!(p.nice, nice);
        }
    }
}

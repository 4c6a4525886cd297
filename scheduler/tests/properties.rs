//! Property tests over random clusters and queues: no double booking, backfill never delays a reservation,
//! advance reservations never violated.

use std::collections::HashSet;

use drover_scheduler::synth::{XorShift, cluster, occupy};
use drover_scheduler::{
    AdvanceReservation, ClusterView, PendingJob, PriorityWeights, RunningJob, SchedulerConfig, schedule,
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

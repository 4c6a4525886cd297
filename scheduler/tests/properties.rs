//! Property tests over random clusters and queues: no double booking, backfill never delays a reservation,
//! advance reservations never violated.

use std::collections::{HashMap, HashSet};

use drover_scheduler::synth::{XorShift, cluster, occupy};
use drover_scheduler::{
    AdvanceReservation, ArrayLimit, ClusterView, Partition, PartitionState, PendingJob, PreemptMode, PriorityWeights,
    Qos, Reason, RunningJob, SchedulerConfig, schedule,
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
        job.user = format!("u{}", rng.below(4)).into();
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
        short: 0,
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
            partition: job.partition.clone(),
            requeueable: false,
            priority: 0,
            preempting: false,
            preempted_for: None,
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

/// A busy cluster for preemption: QOS "high" may preempt "normal" and "low", "normal" sometimes "low" (with an
/// exempt time sometimes); sometimes a higher-tier partition "prio" with `PreemptMode::Requeue` over some nodes.
/// Running jobs of every QOS, mostly requeue-able, some exclusive or on two nodes; pending jobs of every QOS. With
/// `ending`, some running jobs are already being preempted (for a pending job, or for nobody known).
fn preempt_view(seed: u64, ending: bool) -> ClusterView {
    let mut rng = XorShift::new(seed);
    let nodes = 1 + rng.below(10) as usize;
    let gpus = 1 + rng.below(8) as u32;
    let mut v = cluster(nodes, gpus);
    let now = 100_000;
    v.now_s = now;
    if rng.below(2) == 0 {
        v.qos[0].preempt = vec!["low".into()];
    }
    if rng.below(3) == 0 {
        v.qos[0].preempt_exempt_time_s = Some(rng.below(4_000));
    }
    let mut high = Qos::unlimited("high", 10);
    high.preempt = vec!["normal".into(), "low".into()];
    v.qos.push(high);
    v.qos.push(Qos::unlimited("low", 0));
    let tiers = rng.below(2) == 0;
    if tiers {
        v.partitions.push(Partition {
            name: "prio".into(),
            max_time_s: None,
            priority_tier: 2,
            state: PartitionState::Up,
            preempt_mode: PreemptMode::Requeue,
        });
        for n in &mut v.nodes {
            if rng.below(3) != 0 {
                n.partitions.push("prio".into());
            }
        }
    }
    let qos = ["normal", "high", "low"];
    let mut id = 10_000;
    let tag = |r: &mut RunningJob, rng: &mut XorShift, in_prio: bool| {
        r.qos = qos[rng.below(3) as usize].into();
        r.requeueable = rng.below(5) != 0;
        r.priority = rng.below(50);
        r.partition = if in_prio && rng.below(3) == 0 { "prio".into() } else { "gpu".into() };
    };
    for i in 0..nodes {
        let in_prio = v.nodes[i].partitions.len() > 1;
        if v.nodes[i].free_gpus.is_empty() {
            continue; // the second node of a two-node job
        }
        // Sometimes a two-node job over this node and the next, both whole.
        if i + 1 < nodes && rng.below(6) == 0 {
            let all: Vec<u32> = (0..gpus).collect();
            occupy(&mut v, id, i, &all, now - rng.below(5_000), 100 + rng.below(20_000));
            v.nodes[i + 1].free_gpus.clear();
            let next = v.nodes[i + 1].name.clone();
            let r = v.running.last_mut().unwrap();
            r.alloc.push((next, all));
            tag(r, &mut rng, in_prio);
            id += 1;
            continue;
        }
        let mut free = v.nodes[i].free_gpus.clone();
        while !free.is_empty() && rng.below(5) != 0 {
            let k = 1 + rng.below(free.len() as u64) as usize;
            let exclusive = k == free.len() && free.len() == gpus as usize && rng.below(3) == 0;
            let held: Vec<u32> = if exclusive { free.drain(..1).collect() } else { free.drain(..k).collect() };
            occupy(&mut v, id, i, &held, now - rng.below(5_000), 100 + rng.below(20_000));
            let r = v.running.last_mut().unwrap();
            tag(r, &mut rng, in_prio);
            if exclusive {
                r.exclusive = true;
                free.clear();
            }
            id += 1;
        }
    }
    let pending = 1 + rng.below(10);
    for j in 0..pending {
        let n = if rng.below(4) == 0 { 2 + rng.below(2) as u32 } else { 1 };
        let mut job = PendingJob::simple(
            j + 1,
            rng.below(100_000),
            n,
            1 + rng.below(u64::from(gpus)) as u32,
            10 + rng.below(5_000),
        );
        job.qos = qos[[1, 1, 0, 0, 2][rng.below(5) as usize]].into();
        job.exclusive = rng.below(10) == 0;
        if tiers && rng.below(3) == 0 {
            job.partition = "prio".into();
        }
        v.pending.push(job);
    }
    if ending {
        for r in &mut v.running {
            if rng.below(4) == 0 {
                r.preempting = true;
                r.preempted_for = match rng.below(3) {
                    0 => None,
                    1 => Some(1 + rng.below(pending)),
                    _ => Some(999_999), // a job no longer pending
                };
            }
        }
    }
    v
}

/// Whether `job` may preempt `r` by the QOS or partition-tier rules (ignoring requeue-ability and exemption).
fn may_preempt(v: &ClusterView, job: &PendingJob, r: &RunningJob) -> bool {
    let by_qos = job.qos != r.qos && v.qos.iter().any(|q| q.name == job.qos && q.preempt.iter().any(|p| *p == r.qos));
    let part = |name: &str| v.partitions.iter().find(|p| p.name == name);
    let by_tier = match (part(&job.partition), part(&r.partition)) {
        (Some(jp), Some(rp)) => jp.preempt_mode == PreemptMode::Requeue && rp.priority_tier < jp.priority_tier,
        _ => false,
    };
    by_qos || by_tier
}

/// The view at `at` (the preemptor's reservation time) with only `job` pending, after the jobs in `gone` and
/// every job that ends by then are gone. Ending jobs the preemptor may not use stay until their own end.
fn view_at(v: &ClusterView, at: u64, job: &PendingJob, gone: &[u64]) -> ClusterView {
    let mut w = v.clone();
    w.now_s = at;
    w.pending = vec![job.clone()];
    let (keep, drop): (Vec<RunningJob>, Vec<RunningJob>) = w.running.drain(..).partition(|r| {
        let ended = r.expected_end_s() <= at || gone.contains(&r.id);
        let released = r.preempting && (r.preempted_for == Some(job.id) || may_preempt(v, job, r));
        !(ended || released)
    });
    w.running = keep;
    for r in drop {
        for (name, gpus) in r.alloc {
            let n = w.nodes.iter_mut().find(|n| n.name == name).unwrap();
            n.free_gpus.extend(gpus);
            n.free_gpus.sort_unstable();
        }
    }
    w
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn no_preemption_without_victims_or_configuration(seed in any::<u64>()) {
        // Nothing configured: no preemptions, and the same plan as with preemption switched off.
        let off = SchedulerConfig { preemption: false, ..config() };
        for v in [random_view(seed, true), limits_view(seed)] {
            let plan = schedule(&v, &config()).unwrap();
            prop_assert!(plan.preemptions.is_empty());
            prop_assert_eq!(&plan, &schedule(&v, &off).unwrap());
            // Configured, but no running job is requeue-able: still the same plan.
            let mut w = v.clone();
            let mut high = Qos::unlimited("high", 0);
            high.preempt = vec!["normal".into()];
            w.qos.push(high);
            for j in w.pending.iter_mut().filter(|j| j.id % 2 == 0) {
                j.qos = "high".into();
            }
            let a = schedule(&w, &config()).unwrap();
            prop_assert!(a.preemptions.is_empty());
            prop_assert_eq!(&a, &schedule(&w, &off).unwrap());
        }
    }

    #[test]
    fn victims_follow_the_rules(seed in any::<u64>(), ending in any::<bool>()) {
        let v = preempt_view(seed, ending);
        let cfg = config();
        let plan = schedule(&v, &cfg).unwrap();
        prop_assert_eq!(&plan, &schedule(&v, &cfg).unwrap(), "deterministic");
        prop_assert!(plan.preemptions.len() <= cfg.max_preemptions);
        let mut seen = HashSet::new();
        for p in &plan.preemptions {
            prop_assert!(seen.insert(p.victim), "victim {} chosen twice", p.victim);
            let r = v.running.iter().find(|r| r.id == p.victim).expect("victims are running");
            let job = v.pending.iter().find(|j| j.id == p.for_job).expect("preemptors are pending");
            prop_assert!(r.requeueable && !r.preempting && r.reservation.is_none());
            prop_assert!(may_preempt(&v, job, r), "job {} may not preempt {}", job.id, r.id);
            let q = v.qos.iter().find(|q| q.name == r.qos).unwrap();
            prop_assert!(q.preempt_exempt_time_s.is_none_or(|x| v.now_s >= r.start_s + x), "exempt victim");
            prop_assert!(plan.start_of(job.id).is_none());
            prop_assert_eq!(plan.reason_of(job.id), Some(Reason::Resources));
            prop_assert_eq!(plan.expected_start_of(job.id), Some(v.now_s + cfg.kill_wait_s));
            // A victim holds GPUs on a node the preemptor may use.
            let usable = r.alloc.iter().any(|(n, _)| {
                let node = v.nodes.iter().find(|x| &x.name == n).unwrap();
                node.partitions.iter().any(|p| *p == job.partition)
            });
            prop_assert!(usable);
        }
    }

    #[test]
    fn victims_are_enough_and_each_is_needed(seed in any::<u64>(), ending in any::<bool>()) {
        // Each preemptor alone in the queue (so no other job's reservation is in its way).
        let v = preempt_view(seed, ending);
        let cfg = config();
        let at = v.now_s + cfg.kill_wait_s;
        for job in &v.pending {
            let mut alone = v.clone();
            alone.pending = vec![job.clone()];
            let plan = schedule(&alone, &cfg).unwrap();
            let victims = plan.victims_of(job.id);
            if victims.is_empty() {
                continue;
            }
            // With the victims gone (and what ends by then), it starts at the reservation's time.
            let after = schedule(&view_at(&alone, at, job, &victims), &cfg).unwrap();
            prop_assert!(after.start_of(job.id).is_some(), "job {} does not fit without {:?}", job.id, victims);
            // Minimal: without any one of them gone, it does not.
            for &keep in &victims {
                let fewer: Vec<u64> = victims.iter().copied().filter(|&x| x != keep).collect();
                let plan = schedule(&view_at(&alone, at, job, &fewer), &cfg).unwrap();
                prop_assert!(plan.start_of(job.id).is_none(), "job {} fits without preempting {}", job.id, keep);
            }
        }
    }

    #[test]
    fn the_next_pass_does_not_preempt_again(seed in any::<u64>(), ending in any::<bool>(), later in 0u64..30) {
        next_pass_check(seed, ending, later, Check::NoNewVictims)?;
    }
}

/// What [`next_pass_check`] asserts.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// No preemptor of the first pass chooses victims again (any view: a job never costs other jobs their work
    /// twice).
    NoNewVictims,
    /// And in the same second each is still reserved by `kill_at` (or starts). The planner aims at it but does not
    /// promise it: a pass places jobs greedily and does not remember where it placed a preemptor, so when the
    /// world changes between passes (a victim ending for a job that started elsewhere leaves its GPUs to
    /// everyone) a job ahead may take what one counted on. On fresh seeds it holds in all but about 1 in 10,000
    /// views (`preemptors_are_reserved_by_kill_at_on_fresh_seeds`, BENCHMARKS.md); so it is checked on a fixed
    /// set of views, where it must hold, rather than on random ones, where CI would fail by chance.
    ReservedByKillAt,
}

/// `the_next_pass_does_not_preempt_again` for one input (also replayed for seeds it once failed on).
fn next_pass_check(seed: u64, ending: bool, later: u64, check: Check) -> Result<(), TestCaseError> {
    let v = preempt_view(seed, ending);
    let cfg = config();
    let plan = schedule(&v, &cfg).unwrap();
    // The controller starts what the plan starts and marks the victims as ending, for their preemptor.
    let mut next = apply(&v, &plan);
    for p in &plan.preemptions {
        let r = next.running.iter_mut().find(|r| r.id == p.victim).unwrap();
        r.preempting = true;
        r.preempted_for = Some(p.for_job);
    }
    // Passes re-run while the victims are ending (same second, or a little later with nothing else ending).
    let quiet = next.running.iter().all(|r| r.expected_end_s() <= v.now_s || r.expected_end_s() > v.now_s + later);
    next.now_s = if quiet { v.now_s + later } else { v.now_s };
    let again = schedule(&next, &cfg).unwrap();
    let preemptors: HashSet<u64> = plan.preemptions.iter().map(|p| p.for_job).collect();
    for p in &again.preemptions {
        prop_assert!(!preemptors.contains(&p.for_job), "job {} preempts again: {:?}", p.for_job, again.preemptions);
    }
    for &job in &preemptors {
        // In the same second: reserved by the time its victims are gone (or earlier, or it even starts, when
        // GPUs free up another way: other jobs' preemptors here may have started elsewhere). Later,
        // `now + kill_wait` has moved on and its window may run into another reservation.
        let t = again.expected_start_of(job);
        let by = next.now_s + cfg.kill_wait_s;
        let ok = again.start_of(job).is_some() || t.is_some_and(|t| t <= by);
        prop_assert!(check == Check::NoNewVictims || next.now_s > v.now_s || ok, "job {} reserved at {:?}", job, t);
    }
    Ok(())
}

/// The preemption properties above are not vacuous: their views preempt often, sometimes several victims for
/// one job, sometimes for multi-node jobs, and with jobs already ending.
#[test]
fn preempt_views_exercise_preemption() {
    let (mut plans, mut multi_victim, mut multi_node, mut reserved_ending) = (0, 0, 0, 0);
    for seed in 0..400 {
        let v = preempt_view(seed, seed % 2 == 0);
        let plan = schedule(&v, &config()).unwrap();
        plans += usize::from(!plan.preemptions.is_empty());
        let preemptors: HashSet<u64> = plan.preemptions.iter().map(|p| p.for_job).collect();
        for &j in &preemptors {
            multi_victim += usize::from(plan.victims_of(j).len() > 1);
            multi_node += usize::from(v.pending.iter().find(|p| p.id == j).unwrap().nodes > 1);
        }
        // Jobs whose victims were already ending and that reserved without preempting more.
        reserved_ending += v
            .pending
            .iter()
            .filter(|p| v.running.iter().any(|r| r.preempted_for == Some(p.id)))
            .filter(|p| plan.victims_of(p.id).is_empty() && plan.expected_start_of(p.id) == Some(v.now_s + 30))
            .count();
    }
    println!("{plans} plans preempt; {multi_victim} multi-victim; {multi_node} multi-node; {reserved_ending} reuse");
    assert!(plans > 150 && multi_victim > 20 && multi_node > 20 && reserved_ending > 8);
}

/// Found by `the_next_pass_does_not_preempt_again`: job 1 preempted a victim on a node where another job's GPU was
/// already ending (for a job no longer pending), counting on both. In the next pass job 4, ahead of it, could use
/// ending GPUs on either of two nodes and took that one, so job 1 waited an hour while its victim was killed.
#[test]
fn a_job_leaves_a_preemptors_node_alone_when_another_would_do() {
    let v = preempt_view(11616507634832963097, true);
    let cfg = config();
    let plan = schedule(&v, &cfg).unwrap();
    assert!(!plan.victims_of(1).is_empty(), "job 1 preempts");
    let mut next = apply(&v, &plan);
    for p in &plan.preemptions {
        let r = next.running.iter_mut().find(|r| r.id == p.victim).unwrap();
        r.preempting = true;
        r.preempted_for = Some(p.for_job);
    }
    let again = schedule(&next, &cfg).unwrap();
    assert_eq!(again.expected_start_of(1), Some(v.now_s + cfg.kill_wait_s));
    assert_eq!(again.expected_start_of(4), Some(v.now_s + cfg.kill_wait_s), "and job 4 still gets its GPU then");
}

/// Found by `the_next_pass_does_not_preempt_again`: a victim whose time limit ran out before the (moving)
/// `kill_at` was released to everyone in the next pass, so a job ahead took its GPUs and its preemptor preempted
/// another job. Victims of a waiting preemptor are now held for it until `kill_at` whatever their limit.
#[test]
fn a_victim_that_would_end_anyway_stays_held_for_its_preemptor() {
    next_pass_check(10429518826659784653, true, 3, Check::ReservedByKillAt).unwrap();
}

/// The other side of the rule above: GPUs ending for a preemptor that is no longer waiting go to everyone at
/// their end (found by `victims_are_enough_and_each_is_needed` on a first version that held them back too).
#[test]
fn gpus_ending_for_no_waiting_preemptor_are_everyones_at_their_end() {
    let v = preempt_view(6481400564984635038, true);
    let cfg = config();
    let at = v.now_s + cfg.kill_wait_s;
    for job in &v.pending {
        let mut alone = v.clone();
        alone.pending = vec![job.clone()];
        let victims = schedule(&alone, &cfg).unwrap().victims_of(job.id);
        for &keep in &victims {
            let fewer: Vec<u64> = victims.iter().copied().filter(|&x| x != keep).collect();
            let plan = schedule(&view_at(&alone, at, job, &fewer), &cfg).unwrap();
            assert!(plan.start_of(job.id).is_none(), "job {} fits without preempting {keep}", job.id);
        }
    }
}

/// Found by `the_next_pass_does_not_preempt_again` in CI: job 9 preempted for GPUs on three nodes, one of them
/// general GPUs ending at `now + 1`. In the next pass, GPUs ending for job 2 (which had started elsewhere) were
/// everyone's, so job 3, ahead of job 9, could start at `kill_at` and took that node; and job 5, taking one of
/// three GPUs ending on another node, hid the other two. Job 9 waited over an hour. Now a preemptor whose victims
/// are ending claims its window before other jobs are placed, and a reservation leaves what it does not need of
/// a victim's GPUs to the next job.
#[test]
fn a_preemptor_keeps_its_window_when_a_job_ahead_gains_gpus() {
    next_pass_check(15877303077129629482, true, 0, Check::ReservedByKillAt).unwrap();
}

/// Spreads consecutive numbers over the seed space (as random seeds would be), deterministically.
fn spread(k: u64) -> u64 {
    k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// [`Check::ReservedByKillAt`] over a fixed set of views: every preemptor of the first pass is reserved by
/// `kill_at` in the next one.
#[test]
fn preemptors_are_reserved_by_kill_at_in_the_next_pass() {
    for k in 1..=3_000 {
        for ending in [false, true] {
            next_pass_check(spread(k), ending, 0, Check::ReservedByKillAt).unwrap();
            next_pass_check(spread(k), ending, k % 30, Check::ReservedByKillAt).unwrap();
        }
    }
}

/// [`Check::ReservedByKillAt`] on fresh seeds, counting the views where a preemptor waits past `kill_at`:
/// `DROVER_PREEMPT_FIRST=N DROVER_PREEMPT_VIEWS=100000 cargo test --release -p drover-scheduler --test properties
/// -- --ignored --nocapture fresh_seeds`. Fails above 1 check in 10,000: the planner before preemptors claimed
/// their windows first missed 137-180 per million, this one 5-25 (BENCHMARKS.md).
#[test]
#[ignore = "a long sweep over fresh seeds, run by hand"]
fn preemptors_are_reserved_by_kill_at_on_fresh_seeds() {
    let var = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let first = var("DROVER_PREEMPT_FIRST", 1_000_000);
    let views = var("DROVER_PREEMPT_VIEWS", 10_000);
    let mut missed = 0u64;
    for k in first..first + views {
        for ending in [false, true] {
            for later in [0, k % 30] {
                if let Err(e) = next_pass_check(spread(k), ending, later, Check::ReservedByKillAt) {
                    missed += 1;
                    println!("seed {} (k {k}) ending {ending} later {later}: {e}", spread(k));
                }
            }
        }
    }
    let checks = views * 4;
    println!("{missed} of {checks} checks missed kill_at ({} per million)", missed * 1_000_000 / checks.max(1));
    assert!(missed * 10_000 <= checks, "too many preemptors wait past kill_at");
}

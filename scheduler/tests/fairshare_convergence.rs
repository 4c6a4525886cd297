//! Two accounts with shares 2:1, both always busy: over many virtual hours their GPU-seconds converge to 2:1.

use drover_scheduler::fairshare::charge_interval;
use drover_scheduler::synth::cluster;
use drover_scheduler::{Account, PendingJob, PriorityWeights, RunningJob, SchedulerConfig, schedule};

#[test]
fn fair_share_converges_to_shares_under_contention() {
    const JOB_S: u64 = 600;
    const HALF_LIFE_S: u64 = 6 * 3600;
    const HORIZON_S: u64 = 72 * 3600;
    let mut v = cluster(4, 8); // 32 GPUs
    v.accounts = vec![
        Account { name: "root".into(), parent: None, shares: 1, usage_gpu_s: 0.0 },
        Account { name: "a".into(), parent: Some("root".into()), shares: 2, usage_gpu_s: 0.0 },
        Account { name: "b".into(), parent: Some("root".into()), shares: 1, usage_gpu_s: 0.0 },
    ];
    let weights =
        PriorityWeights { age: 0, fairshare: 100_000, job_size: 0, partition: 0, qos: 0, ..Default::default() };
    let config = SchedulerConfig { weights, ..SchedulerConfig::default() };
    let mut next_id = 1u64;
    let mut used = [0u64; 2];
    let mut last_charge_s = 0;
    let mut t = 0;
    while t < HORIZON_S {
        v.now_s = t;
        // Charge the last minute's running GPU-seconds (with decay), then give back the GPUs of jobs that ended.
        charge_interval(&mut v.accounts, &v.running, last_charge_s, t, HALF_LIFE_S);
        let (done, still): (Vec<RunningJob>, Vec<RunningJob>) =
            v.running.drain(..).partition(|r| r.expected_end_s() <= t);
        last_charge_s = t;
        v.running = still;
        for r in &done {
            for (name, gpus) in &r.alloc {
                let n = v.nodes.iter_mut().find(|n| &n.name == name).unwrap();
                n.free_gpus.extend(gpus);
            }
        }
        // Both accounts always have a deep queue of 1-GPU jobs.
        for (acct, _) in [("a", 0), ("b", 1)] {
            while v.pending.iter().filter(|p| p.account == acct).count() < 40 {
                let mut j = PendingJob::simple(next_id, t, 1, 1, JOB_S);
                j.account = acct.into();
                v.pending.push(j);
                next_id += 1;
            }
        }
        let plan = schedule(&v, &config).unwrap();
        for (id, alloc) in plan.starts {
            let pos = v.pending.iter().position(|p| p.id == id).unwrap();
            let job = v.pending.swap_remove(pos);
            for (name, gpus) in &alloc {
                let n = v.nodes.iter_mut().find(|n| &n.name == name).unwrap();
                n.free_gpus.retain(|g| !gpus.contains(g));
            }
            used[usize::from(job.account == "b")] += JOB_S * alloc.iter().map(|(_, g)| g.len() as u64).sum::<u64>();
            v.running.push(RunningJob {
                id,
                user: job.user,
                account: job.account,
                qos: job.qos,
                alloc,
                start_s: t,
                time_limit_s: JOB_S,
                exclusive: false,
                reservation: None,
                array_id: None,
                partition: job.partition,
                requeueable: false,
                priority: 0,
                preempting: false,
                preempted_for: None,
            });
        }
        t += 60;
    }
    let ratio = used[0] as f64 / used[1] as f64;
    assert!((ratio - 2.0).abs() <= 0.2, "GPU-seconds a:b = {ratio:.3} (want 2 ± 10%)");
}

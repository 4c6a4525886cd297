//! Prints one hash per plan over many synthetic workloads, one line each: a performance change to the pass must
//! leave every line unchanged (run it before and after, then `diff` the outputs).
//!
//! `cargo run --release -p drover-scheduler --example plan_hashes [quick]`

use std::hash::{DefaultHasher, Hash, Hasher};

use drover_scheduler::synth::{XorShift, bench_view, with_preemption};
use drover_scheduler::{
    AdvanceReservation, ArrayLimit, ClusterView, DependencyState, Partition, PartitionState, Qos, SchedulerConfig,
    schedule,
};

/// The plan, serialized (floats included, bit for bit through their shortest decimal form), hashed.
fn plan_hash(view: &ClusterView, config: &SchedulerConfig) -> (u64, usize, usize) {
    let plan = schedule(view, config).expect("valid view");
    let json = serde_json::to_string(&plan).expect("serializable plan");
    let mut h = DefaultHasher::new();
    json.hash(&mut h);
    (h.finish(), plan.starts.len(), plan.expected_start.len())
}

/// A bench view with the rarer features mixed in: node features and GPU types, a second partition, several
/// sites, drained nodes and hot spares, jobs with constraints, node lists, exclusions, exclusive and multi-site
/// jobs, held and dependent jobs, arrays, limited QOS, an advance reservation, `scontrol top`.
fn rich_view(nodes: usize, pending: usize, seed: u64) -> ClusterView {
    let mut v = bench_view(nodes, pending, seed);
    let mut rng = XorShift::new(seed ^ 0x9e37_79b9);
    v.partitions.push(Partition {
        name: "small".into(),
        max_time_s: Some(7_200),
        priority_tier: 2,
        state: PartitionState::Up,
        preempt_mode: Default::default(),
    });
    let mut limited = Qos::unlimited("limited", 5);
    limited.max_jobs_per_user = Some(3);
    limited.max_gpus_per_account = Some(200);
    v.qos.push(limited);
    let sites = 1 + seed % 3;
    for (i, n) in v.nodes.iter_mut().enumerate() {
        n.topology.site = format!("s{}", (i as u64 * sites) / nodes as u64);
        if i % 3 == 0 {
            n.features.push("ib".into());
        }
        if i % 5 == 0 {
            n.gpu_type = Some("h100".into());
        } else if i % 7 == 0 {
            n.gpu_type = Some("a100".into());
        }
        if i % 4 == 0 {
            n.partitions.push("small".into());
        }
        match rng.below(40) {
            0 => n.schedulable = false,
            1 => n.spare = true,
            _ => {}
        }
    }
    if nodes >= 8 {
        v.reservations.push(AdvanceReservation {
            name: "r".into(),
            nodes: (0..nodes / 8).map(|i| v.nodes[i * 3 % nodes].name.clone()).collect(),
            gpu_count: None,
            start_s: v.now_s + rng.below(7_200),
            duration_s: Some(3_600 + rng.below(20_000)),
            users: vec!["u1".into()],
            accounts: Vec::new(),
            flags: Vec::new(),
        });
    }
    let names: Vec<String> = v.nodes.iter().map(|n| n.name.clone()).collect();
    for j in v.pending.iter_mut() {
        match rng.below(60) {
            0 => j.constraint.push("ib".into()),
            1 => j.gpu_type = Some("h100".into()),
            2 => j.gpu_type = Some("a100".into()),
            3 => j.nodelist.push(names[rng.below(names.len() as u64) as usize].clone()),
            4 => j.exclude.push(names[rng.below(names.len() as u64) as usize].clone()),
            5 => j.exclusive = true,
            6 => j.allow_multi_site = true,
            7 => j.held = true,
            8 => j.dependency = DependencyState::Waiting,
            9 => j.array = Some(ArrayLimit { array_id: 1 + rng.below(5), max_running: 1 + rng.below(4) as u32 }),
            10 => j.qos = "limited".into(),
            11 => j.partition = "small".into(),
            12 => j.reservation = Some("r".into()),
            13 => j.top_rank = 1 + rng.below(3),
            14 => j.may_use_spares = true,
            15 => j.nice = rng.below(100) as i32,
            16 => j.begin_s = v.now_s + 100,
            17 => j.cpus_per_node = 8 + rng.below(64) as u32,
            18 => j.mem_per_node_mb = 1024 * rng.below(600),
            19 => j.partition = "missing".into(),
            _ => {}
        }
    }
    v
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let configs = [
        SchedulerConfig::default(),
        SchedulerConfig { max_reservations: 2_000, ..SchedulerConfig::default() },
        SchedulerConfig { backfill: false, ..SchedulerConfig::default() },
        SchedulerConfig { max_backfill_jobs: Some(500), ..SchedulerConfig::default() },
    ];
    let sizes: &[(usize, usize)] = if quick {
        &[(16, 40), (300, 2_000), (2_000, 20_000)]
    } else {
        &[(16, 40), (64, 500), (300, 2_000), (2_000, 20_000), (10_000, 100_000)]
    };
    let mut count = 0;
    for &(nodes, pending) in sizes {
        let seeds: u64 = if nodes >= 10_000 {
            2
        } else if nodes >= 2_000 {
            3
        } else {
            6
        };
        for seed in 1..=seeds {
            for variant in 0..4 {
                let mut v =
                    if variant < 2 { bench_view(nodes, pending, seed) } else { rich_view(nodes, pending, seed) };
                if variant % 2 == 1 {
                    with_preemption(&mut v, 5);
                }
                for (ci, c) in configs.iter().enumerate() {
                    let (h, starts, reserved) = plan_hash(&v, c);
                    println!(
                        "{nodes} {pending} seed={seed} variant={variant} config={ci} {h:016x} {starts} {reserved}"
                    );
                    count += 1;
                }
            }
        }
    }
    eprintln!("{count} plans");
}

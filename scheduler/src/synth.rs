//! Deterministic synthetic clusters and queues for tests, benchmarks and the simulator (no `rand` needed).

use crate::model::{Account, ClusterView, Node, Partition, PartitionState, PendingJob, Qos, RunningJob, Topology};

/// xorshift64*: small, fast, and the same sequence on every platform for a seed.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A node named `n{i:05}` with `gpus` GPUs, all free, in partition "gpu": 16 nodes per switch, 4 switches per
/// rack, one site.
pub fn node(i: usize, gpus: u32) -> Node {
    Node {
        name: format!("n{i:05}"),
        gpus_total: gpus,
        free_gpus: (0..gpus).collect(),
        cpus_total: 64,
        cpus_free: 64,
        mem_total_mb: 512 * 1024,
        mem_free_mb: 512 * 1024,
        partitions: vec!["gpu".into()],
        features: Vec::new(),
        gpu_type: None,
        topology: Topology { site: "s0".into(), rack: format!("r{}", i / 64), switch: format!("sw{}", i / 16) },
        schedulable: true,
        spare: false,
    }
}

/// An empty cluster of `nodes` × `gpus` with one UP partition "gpu", a root account and a "normal" QOS.
pub fn cluster(nodes: usize, gpus: u32) -> ClusterView {
    ClusterView {
        now_s: 0,
        nodes: (0..nodes).map(|i| node(i, gpus)).collect(),
        running: Vec::new(),
        pending: Vec::new(),
        partitions: vec![Partition {
            name: "gpu".into(),
            max_time_s: None,
            priority_tier: 1,
            state: PartitionState::Up,
            preempt_mode: Default::default(),
        }],
        accounts: vec![Account { name: "root".into(), parent: None, shares: 1, usage_gpu_s: 0.0 }],
        reservations: Vec::new(),
        qos: vec![Qos::unlimited("normal", 0)],
    }
}

/// Marks `gpus` on `node` busy by a running job ending at `start_s + time_limit_s`.
pub fn occupy(view: &mut ClusterView, id: u64, node: usize, gpus: &[u32], start_s: u64, time_limit_s: u64) {
    let n = &mut view.nodes[node];
    n.free_gpus.retain(|g| !gpus.contains(g));
    view.running.push(RunningJob {
        id,
        user: "user".into(),
        account: "root".into(),
        qos: "normal".into(),
        alloc: vec![(n.name.clone(), gpus.to_vec())],
        start_s,
        time_limit_s,
        exclusive: false,
        reservation: None,
        array_id: None,
        partition: "gpu".into(),
        requeueable: false,
        priority: 0,
        preempting: false,
        preempted_for: None,
    });
}

/// The benchmark state: `nodes` × 8 GPUs, about half of the GPUs busy with running jobs ending within 24 h, and
/// `pending` jobs of mixed shapes (mostly 1–8 GPUs on one node, some 2–8 node jobs of 8 GPUs).
pub fn bench_view(nodes: usize, pending: usize, seed: u64) -> ClusterView {
    let mut rng = XorShift::new(seed);
    let mut view = cluster(nodes, 8);
    view.now_s = 1_000_000;
    let accounts = ["a", "b", "c", "d"];
    for a in accounts {
        view.accounts.push(Account { name: a.into(), parent: Some("root".into()), shares: 1, usage_gpu_s: 0.0 });
    }
    let mut id = 1u64;
    for i in 0..nodes {
        // 0..=8 busy GPUs per node, mean 4.
        let busy = rng.below(9) as u32;
        if busy > 0 {
            let gpus: Vec<u32> = (0..busy).collect();
            let start_s = view.now_s - rng.below(3600);
            occupy(&mut view, id, i, &gpus, start_s, 3600 + rng.below(86_400));
            id += 1;
        }
    }
    for k in 0..pending {
        let shape = rng.below(100);
        let (n, g) = match shape {
            0..=49 => (1, 1),
            50..=69 => (1, 2),
            70..=84 => (1, 4),
            85..=94 => (1, 8),
            _ => (2 + rng.below(7) as u32, 8),
        };
        let mut job = PendingJob::simple(id, view.now_s - rng.below(86_400), n, g, 600 * (1 + rng.below(48)));
        job.account = accounts[k % accounts.len()].into();
        job.user = format!("u{}", k % 97).into();
        view.pending.push(job);
        id += 1;
    }
    for (i, a) in view.accounts.iter_mut().enumerate() {
        a.usage_gpu_s = (i as f64) * 1e6;
    }
    view
}

/// Preemption on a view: QOS "high" may preempt "normal", every `high_every`-th pending job (by id) is in it, and
/// every running job is requeue-able with a spread of priorities.
pub fn with_preemption(view: &mut ClusterView, high_every: u64) {
    let mut high = Qos::unlimited("high", 10);
    high.preempt = vec!["normal".into()];
    view.qos.push(high);
    for (i, r) in view.running.iter_mut().enumerate() {
        r.requeueable = true;
        r.priority = (i % 100) as u64;
    }
    for j in view.pending.iter_mut().filter(|j| j.id % high_every.max(1) == 0) {
        j.qos = "high".into();
    }
}

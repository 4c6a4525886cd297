//! `drover-bench ettr`: Llama 3 405B's published failures, replayed under Drover's recovery and under Slurm's
//! defaults, reported as ETTR (effective training time ratio) and GPU-hours lost per root cause.
//!
//! The run: Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4: 16,384 H100s for 54 days, 466 interruptions,
//! 47 planned and 419 unexpected, root causes in its Table 5. ETTR is productive training time over wall-clock time
//! (Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", HPCA 2025). The
//! wall time is fixed at 54 days, so ETTR = productive / 54 days and every other second is charged to one row.
//!
//! The model, in one place (each number is a named constant below, with where it comes from):
//! - Unexpected faults arrive as a Poisson process in wall-clock time (hardware breaks whether or not the job is
//!   running), the cause drawn from Table 5; each shows as an XID crash, a node loss, a hang or an application crash.
//! - An interruption costs: the work since the last checkpoint, then detection, the requeue delay, the wait for
//!   enough healthy nodes (the job needs 2,048; spares cover nodes in repair) and the restart. A fault that lands
//!   while the job is still recovering starts a new interruption: the time the first one had used stays its cost.
//!   Under both policies the faulty node is drained for repair (Slurm by a health check or an operator); software
//!   faults restart on the same nodes. A planned interruption checkpoints first and costs only the restart.
//! - The job is rigid: 2,048 nodes or none. With few spares it waits for repairs while faults keep arriving, so
//!   ETTR falls steeply below about 10 spares for both policies (about 0.77 at 8, 0.3 at 4, with the defaults): the
//!   edge of this model, not a measurement.
//! - Lemon nodes: a share of the node-hardware faults come from a few nodes whose defect survives a reset. A lemon
//!   fails, is reset, comes back and fails again until it is pulled: by Drover's quarantine (3 failures in 24 h),
//!   or, under Slurm, by an operator after a fixed number of failures. A lemon in service is taken to be in the
//!   job (which holds 2,048 of the 2,064 nodes). Other nodes are not tracked one by one: three faults within a day
//!   on one of them are vanishingly rare at 419 faults over 2,048 nodes and 54 days.
//! - Both policies replay the same draws per seed (faults, their symptoms, repair times), so the difference is only
//!   detection, requeue delay, hang handling and quarantine, plus noise in the work lost: it follows each
//!   policy's own checkpoint timeline (a checkpoint every interval after each restart), so rows with few
//!   interruptions differ a little by chance. The simulation is a pure function of (parameters,
//!   seed): the generator below is SplitMix64, kept here rather than `rand`'s `StdRng`, whose algorithm may change
//!   between releases; a seed's figures stay the same for as long as this file does. Nothing reads the clock.

use anyhow::ensure;
use clap::Args;

// ---------------------------------------------------------------------------------------------------------------
// The run (Meta 2024, section 3.3.4).

/// 16,384 H100 GPUs in 8-GPU hosts.
const JOB_NODES: usize = 2_048;
const GPUS_PER_NODE: f64 = 8.0;
/// The snapshot period the paper's interruption counts cover.
const WALL_DAYS: f64 = 54.0;
/// Unexpected interruptions over those 54 days; equals the sum of Table 5's counts (checked by a test).
const UNEXPECTED_INTERRUPTIONS: f64 = 419.0;
/// Planned interruptions (automated maintenance: firmware, configuration or dataset updates).
const PLANNED_INTERRUPTIONS: f64 = 47.0;

const HOUR_S: f64 = 3_600.0;
const MIN_S: f64 = 60.0;

// ---------------------------------------------------------------------------------------------------------------
// Drover's recovery.

/// The agent polls NVML once a second and sees a task exit at once: an XID crash or an application crash is
/// reported within a second.
const DROVER_CRASH_DETECT_S: f64 = 1.0;
/// A silent node's lease runs out after `fence_after_ms` (5 s: `AgentTiming` default in controller/src/config.rs);
/// its tasks are dead by then.
const DROVER_FENCE_AFTER_S: f64 = 5.0;
/// Then the leader notices and declares it down (NodeDown): budgeted at 5 s, 10 s from the last heartbeat in all.
/// The controller's default `node_timeout_ms` declares it at 8 s, so the budget is 2 s on the safe side.
const DROVER_NODE_DOWN_DETECT_S: f64 = 5.0;
/// Drover requeues a job the moment its node is declared down or its task fails: no hold.
const DROVER_REQUEUE_DELAY_S: f64 = 0.0;
/// `--progress-timeout` (min): a job that reports no progress for this long is called hung and requeued.
const DEFAULT_PROGRESS_TIMEOUT_MIN: f64 = 10.0;
/// The second progress timeout the report always shows.
const ALT_PROGRESS_TIMEOUT_MIN: f64 = 5.0;
/// `ResilienceSettings` defaults (state/src/model/config.rs): a node charged with 3 failures within 24 h is drained.
const QUARANTINE_FAILURES: usize = 3;
const QUARANTINE_WINDOW_S: f64 = 24.0 * HOUR_S;

// ---------------------------------------------------------------------------------------------------------------
// Slurm's defaults.

/// A dead task is seen at once: assumes `srun --kill-on-bad-exit=1` (common for training jobs), so the first rank
/// to die ends the step; without it the other ranks would sit until the NCCL timeout.
const SLURM_CRASH_DETECT_S: f64 = 1.0;
/// slurm.conf `SlurmdTimeout` default: a silent node is set DOWN (and its job requeued) after 300 s.
const SLURMD_TIMEOUT_S: f64 = 300.0;
/// slurm.conf `AuthInfo` `cred_expire` default, 120 s: "This also controls how long a requeued job must wait
/// before starting again" (the job is held until its BeginTime).
const SLURM_REQUEUE_DELAY_S: f64 = 120.0;
/// A hung job crashes when PyTorch's NCCL watchdog fires: 30 min is `default_pg_timeout` before torch 2.2 and
/// DeepSpeed's default, and what many launchers pass explicitly. Torch >= 2.2 defaults NCCL process groups to
/// 10 min (pytorch PRs 110947, 113094): the report shows that row too.
const DEFAULT_NCCL_TIMEOUT_MIN: f64 = 30.0;
const TORCH_2_2_NCCL_TIMEOUT_MIN: f64 = 10.0;

// ---------------------------------------------------------------------------------------------------------------
// Both.

/// Idle healthy nodes beyond the job's 2,048: Drover's hot spares; under Slurm the same nodes sit idle and the
/// requeued job may take any of them. The job waits for a repair only when more nodes are out than this.
const DEFAULT_SPARES: usize = 16;
/// Checkpoint interval (min); the work lost per interruption is the time since the last one.
const DEFAULT_CHECKPOINT_MIN: f64 = 30.0;
/// Training stalled per checkpoint write: 0 with asynchronous checkpointing (the state is copied to host memory
/// and written in the background; the copy is not charged).
const CHECKPOINT_STALL_S: f64 = 0.0;
/// Scheduling, launch, NCCL initialization and checkpoint load on 2,048 nodes (min); the same for both.
const DEFAULT_RESTART_MIN: f64 = 5.0;
/// A node that needs a GPU reset or a reboot is back after this long.
const REPAIR_RESET_S: f64 = 15.0 * MIN_S;
/// A node that needs a part replaced (GPU, NIC, PSU...) is back after 24 to 72 h, uniformly.
const REPAIR_REPLACE_MIN_S: f64 = 24.0 * HOUR_S;
const REPAIR_REPLACE_MAX_S: f64 = 72.0 * HOUR_S;
/// Share of GPU crashes (faulty GPU, HBM3, SRAM, GSP) that end in a part swap; the rest come back after a reset.
/// NVIDIA's XID catalog prescribes a reset or reboot first for most of them and an RMA when they recur; Meta
/// publishes no split. It only matters when more nodes are in repair than there are spares.
const GPU_REPLACE_SHARE: f64 = 0.5;
/// Share of network switch/cable faults that take the node out for a swap rather than a reseat.
const NETWORK_REPLACE_SHARE: f64 = 0.5;
/// Share of software bugs that deadlock (ranks stop, nothing exits) rather than crash: no published figure.
const SOFTWARE_HANG_SHARE: f64 = 0.25;
/// Share of network switch/cable faults that stall collectives (the node still heartbeats on its front-end
/// network) rather than cut the node off.
const NETWORK_HANG_SHARE: f64 = 0.5;

// ---------------------------------------------------------------------------------------------------------------
// Lemon nodes.

/// Share of the nodes that are lemons (1% of 2,048: 20 nodes).
const LEMON_NODE_SHARE: f64 = 0.01;
/// Share of node-hardware faults (GPU, NIC, other host parts) that come from lemons, repeats included, when
/// nothing pulls them early: Table 5's counts are taken to be that baseline.
const LEMON_SHARE_OF_HW_FAULTS: f64 = 0.2;
/// A lemon back from its reset fails again after this long in service, on average (exponential).
const LEMON_REFAIL_MEAN_S: f64 = 4.0 * HOUR_S;
/// Without quarantine, an operator pulls a lemon for a part swap once it has broken the job this many times.
const LEMON_FAILURES_UNTIL_OPERATOR: usize = 6;

// ---------------------------------------------------------------------------------------------------------------
// Causes.

/// How a fault shows itself to the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Manifest {
    /// The process dies and an XID is logged on the node.
    XidCrash,
    /// The node stops heartbeating.
    NodeLoss,
    /// Ranks stop making progress; nothing exits.
    Hang,
    /// The process exits non-zero.
    AppCrash,
}

impl Manifest {
    fn label(self) -> &'static str {
        match self {
            Manifest::XidCrash => "XID crash",
            Manifest::NodeLoss => "node loss",
            Manifest::Hang => "hang",
            Manifest::AppCrash => "app crash",
        }
    }
}

/// One root cause of Table 5 and how it behaves here.
struct Cause {
    name: &'static str,
    /// Interruptions in Table 5.
    count: u32,
    /// How it shows when it does not hang.
    shows_as: Manifest,
    /// Share that shows as a hang instead.
    hang_share: f64,
    /// `None`: nothing is wrong with the node (software), the job restarts on the same nodes. `Some(share)`: the
    /// node leaves service, for a part swap with this probability, else for a reset or reboot.
    replace_share: Option<f64>,
    /// A fault of the node's own hardware, which a lemon can have.
    node_hardware: bool,
}

/// Table 5 of Meta (2024), by count. The paper prints 30.1% for the 148 faulty-GPU interruptions, but 148/419 is
/// 35.3%, and only 35.3% makes the column sum to 100%: the counts are used. The last seven rows of the table
/// (SSD 3, power supply 3, chassis 2, IO expansion board 2, CPU 2, system memory 2; dependency 2) are grouped.
const CAUSES: [Cause; 13] = [
    Cause {
        name: "Faulty GPU",
        count: 148,
        shows_as: Manifest::XidCrash,
        hang_share: 0.0,
        replace_share: Some(GPU_REPLACE_SHARE),
        node_hardware: true,
    },
    Cause {
        name: "GPU HBM3 memory",
        count: 72,
        shows_as: Manifest::XidCrash,
        hang_share: 0.0,
        replace_share: Some(GPU_REPLACE_SHARE),
        node_hardware: true,
    },
    Cause {
        name: "Software bug",
        count: 54,
        shows_as: Manifest::AppCrash,
        hang_share: SOFTWARE_HANG_SHARE,
        replace_share: None,
        node_hardware: false,
    },
    Cause {
        name: "Network switch/cable",
        count: 35,
        shows_as: Manifest::NodeLoss,
        hang_share: NETWORK_HANG_SHARE,
        replace_share: Some(NETWORK_REPLACE_SHARE),
        node_hardware: false,
    },
    // Unplanned host maintenance: an urgent fix, then a reboot.
    Cause {
        name: "Host maintenance",
        count: 32,
        shows_as: Manifest::NodeLoss,
        hang_share: 0.0,
        replace_share: Some(0.0),
        node_hardware: false,
    },
    Cause {
        name: "GPU SRAM memory",
        count: 19,
        shows_as: Manifest::XidCrash,
        hang_share: 0.0,
        replace_share: Some(GPU_REPLACE_SHARE),
        node_hardware: true,
    },
    Cause {
        name: "GPU system processor",
        count: 17,
        shows_as: Manifest::XidCrash,
        hang_share: 0.0,
        replace_share: Some(GPU_REPLACE_SHARE),
        node_hardware: true,
    },
    Cause {
        name: "NIC",
        count: 7,
        shows_as: Manifest::NodeLoss,
        hang_share: 0.0,
        replace_share: Some(1.0),
        node_hardware: true,
    },
    // Root cause unknown: seen only as the watchdog firing, so nothing to repair.
    Cause {
        name: "NCCL watchdog timeouts",
        count: 7,
        shows_as: Manifest::Hang,
        hang_share: 1.0,
        replace_share: None,
        node_hardware: false,
    },
    // Modelled as a stall (a rank wedged on corrupted state); the GPU is swapped once found.
    Cause {
        name: "Silent data corruption",
        count: 6,
        shows_as: Manifest::Hang,
        hang_share: 1.0,
        replace_share: Some(1.0),
        node_hardware: true,
    },
    Cause {
        name: "GPU thermal interface + sensor",
        count: 6,
        shows_as: Manifest::XidCrash,
        hang_share: 0.0,
        replace_share: Some(1.0),
        node_hardware: true,
    },
    Cause {
        name: "Other host hardware",
        count: 14,
        shows_as: Manifest::NodeLoss,
        hang_share: 0.0,
        replace_share: Some(1.0),
        node_hardware: true,
    },
    Cause {
        name: "Dependency",
        count: 2,
        shows_as: Manifest::AppCrash,
        hang_share: 0.0,
        replace_share: None,
        node_hardware: false,
    },
];

/// The accounting slot of planned interruptions, after the causes.
const PLANNED: usize = CAUSES.len();
const SLOTS: usize = CAUSES.len() + 1;

impl Cause {
    /// "XID crash", or "app crash 75% / hang 25%".
    fn shows(&self) -> String {
        match self.hang_share {
            s if s <= 0.0 => self.shows_as.label().to_string(),
            s if s >= 1.0 => Manifest::Hang.label().to_string(),
            s => format!("{} {:.0}% / hang {:.0}%", self.shows_as.label(), (1.0 - s) * 100.0, s * 100.0),
        }
    }

    /// Weight in the stream of ordinary (non-lemon) faults: lemons take their share of node-hardware faults.
    fn ordinary_weight(&self, lemon_share: f64) -> f64 {
        let count = f64::from(self.count);
        if self.node_hardware { count * (1.0 - lemon_share) } else { count }
    }

    /// Weight among lemon faults.
    fn lemon_weight(&self) -> f64 {
        if self.node_hardware { f64::from(self.count) } else { 0.0 }
    }
}

fn table_5_total() -> f64 {
    CAUSES.iter().map(|c| f64::from(c.count)).sum()
}

// ---------------------------------------------------------------------------------------------------------------
// Parameters and policies.

/// Everything a run depends on besides the seed.
#[derive(Clone, Debug)]
struct Params {
    wall_s: f64,
    /// Unexpected interruptions expected over the wall time, lemon repeats included (Table 5's baseline).
    unexpected: f64,
    planned: f64,
    spares: usize,
    checkpoint_s: f64,
    checkpoint_stall_s: f64,
    restart_s: f64,
    progress_timeout_s: f64,
    nccl_timeout_s: f64,
    lemon_nodes: usize,
    lemon_share_of_hw: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            wall_s: WALL_DAYS * 24.0 * HOUR_S,
            unexpected: UNEXPECTED_INTERRUPTIONS,
            planned: PLANNED_INTERRUPTIONS,
            spares: DEFAULT_SPARES,
            checkpoint_s: DEFAULT_CHECKPOINT_MIN * MIN_S,
            checkpoint_stall_s: CHECKPOINT_STALL_S,
            restart_s: DEFAULT_RESTART_MIN * MIN_S,
            progress_timeout_s: DEFAULT_PROGRESS_TIMEOUT_MIN * MIN_S,
            nccl_timeout_s: DEFAULT_NCCL_TIMEOUT_MIN * MIN_S,
            lemon_nodes: lemon_count(),
            lemon_share_of_hw: LEMON_SHARE_OF_HW_FAULTS,
        }
    }
}

fn lemon_count() -> usize {
    (JOB_NODES as f64 * LEMON_NODE_SHARE).round() as usize
}

/// How a scheduler reacts to each kind of fault.
#[derive(Clone, Debug)]
struct Policy {
    crash_detect_s: f64,
    node_loss_detect_s: f64,
    hang_detect_s: f64,
    requeue_delay_s: f64,
    quarantine: bool,
}

impl Policy {
    fn drover(p: &Params) -> Policy {
        Policy {
            crash_detect_s: DROVER_CRASH_DETECT_S,
            node_loss_detect_s: DROVER_FENCE_AFTER_S + DROVER_NODE_DOWN_DETECT_S,
            // The NCCL watchdog still runs inside the job: a progress timeout longer than it changes nothing.
            hang_detect_s: p.progress_timeout_s.min(p.nccl_timeout_s),
            requeue_delay_s: DROVER_REQUEUE_DELAY_S,
            quarantine: true,
        }
    }

    fn slurm(p: &Params) -> Policy {
        Policy {
            crash_detect_s: SLURM_CRASH_DETECT_S,
            node_loss_detect_s: SLURMD_TIMEOUT_S,
            hang_detect_s: p.nccl_timeout_s,
            requeue_delay_s: SLURM_REQUEUE_DELAY_S,
            quarantine: false,
        }
    }

    fn detect_s(&self, shows_as: Manifest) -> f64 {
        match shows_as {
            Manifest::XidCrash | Manifest::AppCrash => self.crash_detect_s,
            Manifest::NodeLoss => self.node_loss_detect_s,
            Manifest::Hang => self.hang_detect_s,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The draws: one scenario per seed, shared by both policies.

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and fixed forever.
struct Rng(u64);

impl Rng {
    /// Independent streams per (seed, purpose), so that changing how many planned interruptions there are does not
    /// reshuffle the faults.
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(mix64(seed ^ mix64(stream.wrapping_add(0x5EED))))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        // 1 - u is in (0, 1]: ln never sees 0.
        -mean * (1.0 - self.unit()).ln()
    }

    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }

    /// An index drawn with probability proportional to its weight; `None` when all weights are zero.
    fn weighted(&mut self, weights: &[f64]) -> Option<usize> {
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return None;
        }
        let mut x = self.unit() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return Some(i);
            }
            x -= w;
        }
        weights.iter().rposition(|w| *w > 0.0)
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const STREAM_FAULTS: u64 = 1;
const STREAM_PLANNED: u64 = 2;
const STREAM_LEMONS: u64 = 3;

/// An ordinary fault: one node (not a lemon) breaks once.
#[derive(Clone, Debug, PartialEq)]
struct Fault {
    at_s: f64,
    cause: usize,
    shows_as: Manifest,
    /// How long the node is out once the fault is detected; `None`: it stays in service.
    repair_s: Option<f64>,
}

/// A lemon acting up: it fails, is reset, fails again, until it is pulled.
#[derive(Clone, Debug, PartialEq)]
struct Episode {
    at_s: f64,
    /// One defect, one symptom: every failure of the episode has the same cause and shows the same way.
    cause: usize,
    shows_as: Manifest,
    /// Which of the lemons in service it is, as a fraction of their number.
    pick: f64,
    /// Time in service after each reset before the next failure.
    refail_after_s: Vec<f64>,
    /// How long the final part swap takes.
    replace_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Scenario {
    faults: Vec<Fault>,
    planned: Vec<f64>,
    episodes: Vec<Episode>,
}

impl Scenario {
    fn draw(p: &Params, seed: u64) -> Scenario {
        Scenario {
            faults: draw_faults(p, &mut Rng::new(seed, STREAM_FAULTS)),
            planned: poisson_times(&mut Rng::new(seed, STREAM_PLANNED), p.planned, p.wall_s),
            episodes: draw_episodes(p, &mut Rng::new(seed, STREAM_LEMONS)),
        }
    }
}

/// Arrival times of a Poisson process expecting `expected` events over `[0, wall_s)`.
fn poisson_times(rng: &mut Rng, expected: f64, wall_s: f64) -> Vec<f64> {
    let mut times = Vec::new();
    if expected <= 0.0 {
        return times;
    }
    let mean_gap = wall_s / expected;
    let mut t = rng.exponential(mean_gap);
    while t < wall_s {
        times.push(t);
        t += rng.exponential(mean_gap);
    }
    times
}

fn draw_shows_as(rng: &mut Rng, cause: &Cause) -> Manifest {
    if rng.unit() < cause.hang_share { Manifest::Hang } else { cause.shows_as }
}

fn draw_replace_s(rng: &mut Rng) -> f64 {
    rng.uniform(REPAIR_REPLACE_MIN_S, REPAIR_REPLACE_MAX_S)
}

fn draw_faults(p: &Params, rng: &mut Rng) -> Vec<Fault> {
    let weights: Vec<f64> = CAUSES.iter().map(|c| c.ordinary_weight(p.lemon_share_of_hw)).collect();
    let expected = p.unexpected * weights.iter().sum::<f64>() / table_5_total();
    let times = poisson_times(rng, expected, p.wall_s);
    let mut faults = Vec::with_capacity(times.len());
    for at_s in times {
        let Some(cause) = rng.weighted(&weights) else { break };
        let c = &CAUSES[cause];
        let shows_as = draw_shows_as(rng, c);
        // Both draws are made whether used or not, so one fault's draws never shift the next one's.
        let (swap, replace_s) = (rng.unit(), draw_replace_s(rng));
        let repair_s = c.replace_share.map(|share| if swap < share { replace_s } else { REPAIR_RESET_S });
        faults.push(Fault { at_s, cause, shows_as, repair_s });
    }
    faults
}

fn draw_episodes(p: &Params, rng: &mut Rng) -> Vec<Episode> {
    let weights: Vec<f64> = CAUSES.iter().map(Cause::lemon_weight).collect();
    // Lemon faults expected at baseline, spread over episodes of LEMON_FAILURES_UNTIL_OPERATOR failures each.
    let lemon_faults = p.unexpected * p.lemon_share_of_hw * weights.iter().sum::<f64>() / table_5_total();
    let expected = if p.lemon_nodes == 0 { 0.0 } else { lemon_faults / LEMON_FAILURES_UNTIL_OPERATOR as f64 };
    let times = poisson_times(rng, expected, p.wall_s);
    let mut episodes = Vec::with_capacity(times.len());
    for at_s in times {
        let Some(cause) = rng.weighted(&weights) else { break };
        let shows_as = draw_shows_as(rng, &CAUSES[cause]);
        let pick = rng.unit();
        let refail_after_s = (1..LEMON_FAILURES_UNTIL_OPERATOR).map(|_| rng.exponential(LEMON_REFAIL_MEAN_S)).collect();
        let replace_s = draw_replace_s(rng);
        episodes.push(Episode { at_s, cause, shows_as, pick, refail_after_s, replace_s });
    }
    episodes
}

// ---------------------------------------------------------------------------------------------------------------
// The outcome of one run under one policy.

/// Time lost to one cause over a run, by phase (seconds of the whole job).
#[derive(Clone, Debug, Default, PartialEq)]
struct Loss {
    interruptions: u32,
    /// Work done since the last checkpoint, thrown away.
    lost_work_s: f64,
    /// From the fault until the scheduler knows.
    detection_s: f64,
    requeue_s: f64,
    /// Waiting for enough healthy nodes.
    wait_s: f64,
    restart_s: f64,
}

impl Loss {
    fn total_s(&self) -> f64 {
        self.lost_work_s + self.detection_s + self.requeue_s + self.wait_s + self.restart_s
    }

    fn add(&mut self, other: &Loss) {
        self.interruptions += other.interruptions;
        self.lost_work_s += other.lost_work_s;
        self.detection_s += other.detection_s;
        self.requeue_s += other.requeue_s;
        self.wait_s += other.wait_s;
        self.restart_s += other.restart_s;
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Outcome {
    wall_s: f64,
    productive_s: f64,
    /// Training stalled by checkpoint writes.
    stall_s: f64,
    /// Per cause, then planned interruptions at [`PLANNED`].
    by_slot: Vec<Loss>,
    lemon_failures: u32,
    /// Lemon failures after the first of their episode: what quarantine is for.
    lemon_repeats: u32,
    quarantined: u32,
    /// Episodes that found no lemon still defective and in service.
    averted_episodes: u32,
}

impl Outcome {
    fn ettr(&self) -> f64 {
        self.productive_s / self.wall_s
    }

    fn lost_s(&self) -> f64 {
        self.by_slot.iter().map(Loss::total_s).sum::<f64>() + self.stall_s
    }
}

fn gpu_hours(job_s: f64) -> f64 {
    job_s * JOB_NODES as f64 * GPUS_PER_NODE / HOUR_S
}

// ---------------------------------------------------------------------------------------------------------------
// The simulation.

/// A recovery under way: the phase boundaries, in wall-clock seconds.
#[derive(Clone, Debug)]
struct Recovery {
    slot: usize,
    start: f64,
    detected: f64,
    requeued: f64,
    nodes_ready: f64,
    resumed: f64,
}

#[derive(Clone, Debug)]
enum Job {
    /// Training since `since`; checkpoints every `checkpoint_s` of training from there.
    Running {
        since: f64,
    },
    Down(Recovery),
}

#[derive(Clone, Debug, Default)]
struct Lemon {
    defective: bool,
    /// Out of service (reset, or part swap) until then.
    out_until: f64,
    episode: Option<usize>,
    failures_in_episode: usize,
    failure_times: Vec<f64>,
    next_failure: Option<f64>,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Fault(usize),
    Planned,
    EpisodeStart(usize),
    LemonFails(usize),
}

struct Sim<'a> {
    p: &'a Params,
    policy: &'a Policy,
    scenario: &'a Scenario,
    job: Job,
    /// When each ordinary node now out of service comes back.
    repairs: Vec<f64>,
    lemons: Vec<Lemon>,
    out: Outcome,
}

/// One run of `scenario` under `policy`.
fn simulate(p: &Params, policy: &Policy, scenario: &Scenario) -> Outcome {
    let mut sim = Sim::new(p, policy, scenario);
    let fixed = fixed_events(scenario);
    let mut next = 0;
    loop {
        let lemon = sim.next_lemon_failure();
        let (t, event) = match (fixed.get(next), lemon) {
            (Some(&(a, _)), Some((b, k))) if b < a => (b, Event::LemonFails(k)),
            (Some(&(a, event)), _) => {
                next += 1;
                (a, event)
            }
            (None, Some((b, k))) => (b, Event::LemonFails(k)),
            (None, None) => break,
        };
        if t >= p.wall_s {
            break;
        }
        sim.step(t, event);
    }
    sim.finish()
}

/// The scenario's events in time order (lemon repeats are added as the run unfolds).
fn fixed_events(scenario: &Scenario) -> Vec<(f64, Event)> {
    let faults = scenario.faults.iter().enumerate().map(|(i, f)| (f.at_s, Event::Fault(i)));
    let planned = scenario.planned.iter().map(|t| (*t, Event::Planned));
    let episodes = scenario.episodes.iter().enumerate().map(|(i, e)| (e.at_s, Event::EpisodeStart(i)));
    let mut events: Vec<(f64, Event)> = faults.chain(planned).chain(episodes).collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    events
}

impl<'a> Sim<'a> {
    fn new(p: &'a Params, policy: &'a Policy, scenario: &'a Scenario) -> Sim<'a> {
        Sim {
            p,
            policy,
            scenario,
            job: Job::Running { since: 0.0 },
            repairs: Vec::new(),
            lemons: vec![Lemon { defective: true, ..Lemon::default() }; p.lemon_nodes],
            out: Outcome {
                wall_s: p.wall_s,
                productive_s: 0.0,
                stall_s: 0.0,
                by_slot: vec![Loss::default(); SLOTS],
                lemon_failures: 0,
                lemon_repeats: 0,
                quarantined: 0,
                averted_episodes: 0,
            },
        }
    }

    fn next_lemon_failure(&self) -> Option<(f64, usize)> {
        let due = self.lemons.iter().enumerate().filter_map(|(k, l)| l.next_failure.map(|t| (t, k)));
        due.min_by(|a, b| a.0.total_cmp(&b.0))
    }

    fn step(&mut self, t: f64, event: Event) {
        self.advance(t);
        // Events come in time order and every later query looks at or after `t`: repairs done by now are done.
        self.repairs.retain(|&back| back > t);
        match event {
            Event::Fault(i) => self.ordinary_fault(t, i),
            Event::Planned => self.planned(t),
            Event::EpisodeStart(e) => self.episode_starts(t, e),
            Event::LemonFails(k) => {
                self.lemons[k].next_failure = None;
                self.lemon_fails(t, k);
            }
        }
    }

    /// Ends a finished recovery: the job has been training since it resumed.
    fn advance(&mut self, t: f64) {
        if let Job::Down(rec) = &self.job
            && rec.resumed <= t
        {
            let rec = rec.clone();
            self.charge(&rec, rec.resumed);
            self.job = Job::Running { since: rec.resumed };
        }
    }

    /// Charges a recovery's phases up to `until` (a later fault may cut it short) to its slot.
    fn charge(&mut self, rec: &Recovery, until: f64) {
        let span = |a: f64, b: f64| (b.min(until) - a).max(0.0);
        let loss = &mut self.out.by_slot[rec.slot];
        loss.detection_s += span(rec.start, rec.detected);
        loss.requeue_s += span(rec.detected, rec.requeued);
        loss.wait_s += span(rec.requeued, rec.nodes_ready);
        loss.restart_s += span(rec.nodes_ready, rec.resumed);
    }

    /// Closes the current state at `t`. Training: checkpointed work is productive, the rest is returned as lost,
    /// or counted productive when `saved` (a checkpoint is taken just before). Recovering: charged up to `t`.
    fn close(&mut self, t: f64, saved: bool) -> f64 {
        match self.job.clone() {
            Job::Running { since } => {
                let (productive, stall, unsaved) = training(t - since, self.p.checkpoint_s, self.p.checkpoint_stall_s);
                self.out.productive_s += productive;
                self.out.stall_s += stall;
                if saved {
                    self.out.productive_s += unsaved;
                    0.0
                } else {
                    unsaved
                }
            }
            Job::Down(rec) => {
                self.charge(&rec, t);
                0.0
            }
        }
    }

    /// An unexpected interruption begins at `t`: returns when the scheduler knows.
    fn interrupt(&mut self, t: f64, cause: usize, shows_as: Manifest) -> f64 {
        let lost = self.close(t, false);
        let loss = &mut self.out.by_slot[cause];
        loss.interruptions += 1;
        loss.lost_work_s += lost;
        t + self.policy.detect_s(shows_as)
    }

    /// Requeue (after `hold_s`), wait for nodes, restart. Node repairs must be registered first.
    fn recover(&mut self, slot: usize, start: f64, detected: f64, hold_s: f64) {
        let requeued = detected + hold_s;
        let nodes_ready = self.nodes_ready_at(requeued);
        let resumed = nodes_ready + self.p.restart_s;
        self.job = Job::Down(Recovery { slot, start, detected, requeued, nodes_ready, resumed });
    }

    fn ordinary_fault(&mut self, t: f64, i: usize) {
        let fault = &self.scenario.faults[i];
        let detected = self.interrupt(t, fault.cause, fault.shows_as);
        if let Some(repair_s) = fault.repair_s {
            // The node is drained once the failure is known, and repaired from then.
            self.repairs.push(detected + repair_s);
        }
        self.recover(fault.cause, t, detected, self.policy.requeue_delay_s);
    }

    /// Checkpoint, stop, restart: only the restart is lost. One landing during a recovery is absorbed by it.
    fn planned(&mut self, t: f64) {
        if matches!(self.job, Job::Down(_)) {
            return;
        }
        self.close(t, true);
        self.out.by_slot[PLANNED].interruptions += 1;
        // An operator's restart, not a requeue after a failure: no hold under either policy.
        self.recover(PLANNED, t, t, 0.0);
    }

    fn episode_starts(&mut self, t: f64, e: usize) {
        let candidates: Vec<usize> = (0..self.lemons.len())
            .filter(|&k| {
                let l = &self.lemons[k];
                l.defective && l.episode.is_none() && l.out_until <= t
            })
            .collect();
        if candidates.is_empty() {
            self.out.averted_episodes += 1;
            return;
        }
        let pick = (self.scenario.episodes[e].pick * candidates.len() as f64) as usize;
        let k = candidates[pick.min(candidates.len() - 1)];
        self.lemons[k].episode = Some(e);
        self.lemons[k].failures_in_episode = 0;
        self.lemon_fails(t, k);
    }

    fn lemon_fails(&mut self, t: f64, k: usize) {
        let Some(e) = self.lemons[k].episode else { return };
        let episode = &self.scenario.episodes[e];
        let detected = self.interrupt(t, episode.cause, episode.shows_as);
        self.out.lemon_failures += 1;
        let lemon = &mut self.lemons[k];
        lemon.failures_in_episode += 1;
        if lemon.failures_in_episode > 1 {
            self.out.lemon_repeats += 1;
        }
        lemon.failure_times.push(t);
        let recent = lemon.failure_times.iter().filter(|&&f| f > t - QUARANTINE_WINDOW_S).count();
        let quarantined = self.policy.quarantine && recent >= QUARANTINE_FAILURES;
        if quarantined {
            self.out.quarantined += 1;
        }
        if quarantined || lemon.failures_in_episode >= LEMON_FAILURES_UNTIL_OPERATOR {
            // Pulled for a part swap: it comes back sound.
            lemon.defective = false;
            lemon.episode = None;
            lemon.out_until = detected + episode.replace_s;
        } else {
            // A reset clears the symptom, not the defect.
            lemon.out_until = detected + REPAIR_RESET_S;
            lemon.next_failure = Some(lemon.out_until + episode.refail_after_s[lemon.failures_in_episode - 1]);
        }
        self.recover(episode.cause, t, detected, self.policy.requeue_delay_s);
    }

    /// The first time from `t` at which the job's nodes are all healthy: at once while a spare is free, else when
    /// enough repairs are done.
    fn nodes_ready_at(&self, t: f64) -> f64 {
        let repairs = self.repairs.iter().copied();
        let mut out: Vec<f64> = repairs.chain(self.lemons.iter().map(|l| l.out_until)).filter(|&b| b > t).collect();
        // Nodes out beyond the spares are what the job lacks; it waits for that many to come back.
        let missing = out.len().saturating_sub(self.p.spares);
        if missing == 0 {
            return t;
        }
        out.sort_by(f64::total_cmp);
        out.get(missing - 1).copied().unwrap_or(t)
    }

    /// The run ends at the wall time: work since the last checkpoint counts (the run stops, it does not fail).
    fn finish(mut self) -> Outcome {
        let end = self.p.wall_s;
        self.advance(end);
        self.close(end, true);
        self.out
    }
}

/// Splits `elapsed` seconds of training into (checkpointed work, checkpoint stalls, work since the last
/// checkpoint). A cycle is `interval` of work, then `stall` while the checkpoint is written.
fn training(elapsed: f64, interval: f64, stall: f64) -> (f64, f64, f64) {
    let cycle = interval + stall;
    let cycles = (elapsed / cycle).floor();
    let rest = elapsed - cycles * cycle;
    let unsaved = rest.min(interval);
    (cycles * interval, cycles * stall + (rest - unsaved), unsaved)
}

// ---------------------------------------------------------------------------------------------------------------
// The command.

#[derive(Args, Debug, Clone)]
pub struct EttrArgs {
    /// First seed; run i uses seed + i.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seeds to run, each a full 54-day replay under every policy.
    #[arg(long, default_value_t = 20)]
    pub runs: u64,
    /// Drover's progress timeout (minutes): a job with no progress this long is called hung and requeued. The
    /// report also shows 5 minutes.
    #[arg(long, default_value_t = DEFAULT_PROGRESS_TIMEOUT_MIN)]
    pub progress_timeout_min: f64,
    /// Healthy idle nodes beyond the job's 2,048 (Drover's hot spares; idle nodes Slurm may hand out too).
    #[arg(long, default_value_t = DEFAULT_SPARES)]
    pub spares: usize,
    /// Checkpoint interval (minutes).
    #[arg(long, default_value_t = DEFAULT_CHECKPOINT_MIN)]
    pub checkpoint_min: f64,
    /// Restart overhead (minutes): scheduling, launch, NCCL init, checkpoint load.
    #[arg(long, default_value_t = DEFAULT_RESTART_MIN)]
    pub restart_min: f64,
    /// The job's NCCL watchdog timeout (minutes): when a hang ends under Slurm. The report also shows 10 minutes.
    #[arg(long, default_value_t = DEFAULT_NCCL_TIMEOUT_MIN)]
    pub nccl_timeout_min: f64,
}

pub fn ettr(args: &EttrArgs) -> anyhow::Result<()> {
    let p = params(args)?;
    let seeds: Vec<u64> = (0..args.runs).map(|i| args.seed.wrapping_add(i)).collect();
    let report = Report::run(&p, &seeds);
    print!("{}", report.render(&p, &seeds));
    Ok(())
}

fn params(args: &EttrArgs) -> anyhow::Result<Params> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    let positive = |x: f64| x.is_finite() && x > 0.0;
    ensure!(positive(args.progress_timeout_min), "--progress-timeout-min must be a positive number of minutes");
    ensure!(positive(args.checkpoint_min), "--checkpoint-min must be a positive number of minutes");
    ensure!(positive(args.nccl_timeout_min), "--nccl-timeout-min must be a positive number of minutes");
    ensure!(
        args.restart_min.is_finite() && args.restart_min >= 0.0,
        "--restart-min must be zero or a positive number of minutes"
    );
    Ok(Params {
        spares: args.spares,
        checkpoint_s: args.checkpoint_min * MIN_S,
        restart_s: args.restart_min * MIN_S,
        progress_timeout_s: args.progress_timeout_min * MIN_S,
        nccl_timeout_s: args.nccl_timeout_min * MIN_S,
        ..Params::default()
    })
}

/// One policy's outcomes over all seeds.
struct Variant {
    policy: &'static str,
    label: String,
    /// `key=value` closing its summary line.
    setting: String,
    outcomes: Vec<Outcome>,
}

impl Variant {
    fn ettrs(&self) -> impl Iterator<Item = f64> + '_ {
        self.outcomes.iter().map(Outcome::ettr)
    }

    fn mean_ettr(&self) -> f64 {
        self.ettrs().sum::<f64>() / self.outcomes.len() as f64
    }

    fn min_ettr(&self) -> f64 {
        self.ettrs().fold(f64::INFINITY, f64::min)
    }

    fn mean_lost_gpu_h(&self) -> f64 {
        gpu_hours(self.outcomes.iter().map(Outcome::lost_s).sum::<f64>()) / self.outcomes.len() as f64
    }

    /// Per-slot losses summed over the seeds.
    fn slot_totals(&self) -> Vec<Loss> {
        let mut totals = vec![Loss::default(); SLOTS];
        for o in &self.outcomes {
            for (total, loss) in totals.iter_mut().zip(&o.by_slot) {
                total.add(loss);
            }
        }
        totals
    }

    fn mean_of(&self, f: impl Fn(&Outcome) -> f64) -> f64 {
        self.outcomes.iter().map(f).sum::<f64>() / self.outcomes.len() as f64
    }
}

/// A row of the phase table: its name and what it sums.
type Phase = (&'static str, fn(&Loss) -> f64);

struct Report {
    /// Drover at the configured progress timeout, and Slurm at the configured NCCL timeout, first; then the
    /// alternative settings.
    drover: Variant,
    slurm: Variant,
    others: Vec<Variant>,
}

impl Report {
    fn run(p: &Params, seeds: &[u64]) -> Report {
        let scenarios: Vec<Scenario> = seeds.iter().map(|&s| Scenario::draw(p, s)).collect();
        let run = |policy: &'static str, label: String, setting: String, pol: Policy| Variant {
            policy,
            label,
            setting,
            outcomes: scenarios.iter().map(|sc| simulate(p, &pol, sc)).collect(),
        };
        let drover_at = |minutes: f64| {
            let q = Params { progress_timeout_s: minutes * MIN_S, ..p.clone() };
            run(
                "drover",
                format!("Drover, progress timeout {} min", fmt_min(minutes)),
                format!("progress_timeout_min={}", fmt_min(minutes)),
                Policy::drover(&q),
            )
        };
        let slurm_at = |minutes: f64, note: &str| {
            let q = Params { nccl_timeout_s: minutes * MIN_S, ..p.clone() };
            run(
                "slurm",
                format!("Slurm defaults, NCCL timeout {} min{note}", fmt_min(minutes)),
                format!("nccl_timeout_min={}", fmt_min(minutes)),
                Policy::slurm(&q),
            )
        };
        let progress_min = p.progress_timeout_s / MIN_S;
        let nccl_min = p.nccl_timeout_s / MIN_S;
        let mut others = Vec::new();
        if progress_min != ALT_PROGRESS_TIMEOUT_MIN {
            others.push(drover_at(ALT_PROGRESS_TIMEOUT_MIN));
        }
        if nccl_min != TORCH_2_2_NCCL_TIMEOUT_MIN {
            others.push(slurm_at(TORCH_2_2_NCCL_TIMEOUT_MIN, " (torch >= 2.2 default)"));
        }
        Report { drover: drover_at(progress_min), slurm: slurm_at(nccl_min, ""), others }
    }

    fn render(&self, p: &Params, seeds: &[u64]) -> String {
        let mut s = String::new();
        let first = seeds.first().copied().unwrap_or_default();
        let last = seeds.last().copied().unwrap_or_default();
        s += "## ETTR: Llama 3 405B's 54-day pretraining run (16,384 H100s), replayed\n\n";
        s += &format!(
            "Seeds {first}..={last} ({} runs); per seed both policies replay the same faults. Wall time fixed at {} days; \
             ETTR = productive time / wall time. Figures are means per run.\n\n",
            seeds.len(),
            fmt_num(p.wall_s / (24.0 * HOUR_S), 0)
        );
        s += &self.cause_table();
        s += &self.phase_table();
        s += &self.ettr_table();
        s += &self.lemon_line(p);
        for v in [&self.drover, &self.slurm].into_iter().chain(&self.others) {
            s += &format!(
                "ettr policy={} mean={:.4} min={:.4} gpu_hours_lost={:.0} {}\n",
                v.policy,
                v.mean_ettr(),
                v.min_ettr(),
                v.mean_lost_gpu_h(),
                v.setting
            );
        }
        s += "\n";
        s += &assumptions(p);
        s
    }

    fn cause_table(&self) -> String {
        let runs = self.drover.outcomes.len() as f64;
        let (d, sl) = (self.drover.slot_totals(), self.slurm.slot_totals());
        let mut s = String::from(
            "| Cause (Table 5 count) | Shows as | Interruptions Drover | Interruptions Slurm | Drover GPU-h lost | \
             Slurm GPU-h lost |\n|---|---|---:|---:|---:|---:|\n",
        );
        let row = |name: String, shows: String, d: &Loss, sl: &Loss| {
            format!(
                "| {name} | {shows} | {} | {} | {} | {} |\n",
                fmt_num(f64::from(d.interruptions) / runs, 1),
                fmt_num(f64::from(sl.interruptions) / runs, 1),
                fmt_num(gpu_hours(d.total_s()) / runs, 0),
                fmt_num(gpu_hours(sl.total_s()) / runs, 0),
            )
        };
        for (i, c) in CAUSES.iter().enumerate() {
            s += &row(format!("{} ({})", c.name, c.count), c.shows(), &d[i], &sl[i]);
        }
        s +=
            &row(format!("Planned ({PLANNED_INTERRUPTIONS})"), "checkpoint, restart".into(), &d[PLANNED], &sl[PLANNED]);
        let stall = |v: &Variant| fmt_num(gpu_hours(v.mean_of(|o| o.stall_s)), 0);
        s += &format!("| Checkpoint write stalls | | | | {} | {} |\n", stall(&self.drover), stall(&self.slurm));
        let total = |slots: &[Loss]| {
            let mut t = Loss::default();
            slots.iter().for_each(|l| t.add(l));
            t
        };
        let (dt, st) = (total(&d), total(&sl));
        s += &format!(
            "| **Total** | | {} | {} | {} | {} |\n\n",
            fmt_num(f64::from(dt.interruptions) / runs, 1),
            fmt_num(f64::from(st.interruptions) / runs, 1),
            fmt_num(self.drover.mean_lost_gpu_h(), 0),
            fmt_num(self.slurm.mean_lost_gpu_h(), 0),
        );
        s
    }

    fn phase_table(&self) -> String {
        let runs = self.drover.outcomes.len() as f64;
        let sum =
            |v: &Variant, f: fn(&Loss) -> f64| fmt_num(gpu_hours(v.slot_totals().iter().map(f).sum::<f64>()) / runs, 0);
        let phases: [Phase; 5] = [
            ("Work since the last checkpoint", |l| l.lost_work_s),
            ("Detection (until the scheduler knows)", |l| l.detection_s),
            ("Requeue delay", |l| l.requeue_s),
            ("Waiting for healthy nodes", |l| l.wait_s),
            ("Restart (schedule, launch, NCCL init, checkpoint load)", |l| l.restart_s),
        ];
        let mut s = String::from("| Where the GPU-hours went | Drover | Slurm |\n|---|---:|---:|\n");
        for (name, f) in phases {
            s += &format!("| {name} | {} | {} |\n", sum(&self.drover, f), sum(&self.slurm, f));
        }
        let stall = |v: &Variant| fmt_num(gpu_hours(v.mean_of(|o| o.stall_s)), 0);
        s += &format!("| Checkpoint write stalls | {} | {} |\n\n", stall(&self.drover), stall(&self.slurm));
        s
    }

    fn ettr_table(&self) -> String {
        let mut s = String::from("| Policy | ETTR mean | ETTR min | GPU-h lost (mean) |\n|---|---:|---:|---:|\n");
        for v in [&self.drover, &self.slurm].into_iter().chain(&self.others) {
            s += &format!(
                "| {} | {:.4} | {:.4} | {} |\n",
                v.label,
                v.mean_ettr(),
                v.min_ettr(),
                fmt_num(v.mean_lost_gpu_h(), 0)
            );
        }
        s + "\n"
    }

    fn lemon_line(&self, p: &Params) -> String {
        let per_run = |v: &Variant, f: fn(&Outcome) -> u32| fmt_num(v.mean_of(|o| f64::from(f(o))), 1);
        format!(
            "Lemon nodes ({} of {}): lemon failures per run Drover {} (repeats {}, quarantined {}), Slurm {} (repeats \
             {}).\n\n",
            p.lemon_nodes,
            fmt_num((JOB_NODES + p.spares) as f64, 0),
            per_run(&self.drover, |o| o.lemon_failures),
            per_run(&self.drover, |o| o.lemon_repeats),
            per_run(&self.drover, |o| o.quarantined),
            per_run(&self.slurm, |o| o.lemon_failures),
            per_run(&self.slurm, |o| o.lemon_repeats),
        )
    }
}

/// The assumptions, each constant with its value, as a markdown list.
fn assumptions(p: &Params) -> String {
    let h = |s: f64| format!("{} h", fmt_num(s / HOUR_S, 0));
    let m = |s: f64| format!("{} min", fmt_min(s / MIN_S));
    let sec = |s: f64| format!("{} s", fmt_num(s, 0));
    let pct = |x: f64| format!("{}%", fmt_num(x * 100.0, 0));
    let items = [
        ("Job", format!("{} nodes x {} GPUs, {} days wall time (fixed)", JOB_NODES, GPUS_PER_NODE, WALL_DAYS)),
        (
            "Interruptions",
            format!(
                "{} unexpected (Poisson in wall time, cause from Table 5) + {} planned (Poisson, cost = restart only)",
                p.unexpected, p.planned
            ),
        ),
        ("DROVER_CRASH_DETECT_S (NVML poll, task exit)", sec(DROVER_CRASH_DETECT_S)),
        (
            "DROVER_FENCE_AFTER_S + DROVER_NODE_DOWN_DETECT_S (node loss)",
            sec(DROVER_FENCE_AFTER_S + DROVER_NODE_DOWN_DETECT_S),
        ),
        ("DROVER_REQUEUE_DELAY_S", sec(DROVER_REQUEUE_DELAY_S)),
        ("Drover progress timeout (hang; capped by the NCCL timeout)", m(p.progress_timeout_s)),
        (
            "QUARANTINE_FAILURES / QUARANTINE_WINDOW_S (Drover only)",
            format!("{QUARANTINE_FAILURES} in {}", h(QUARANTINE_WINDOW_S)),
        ),
        ("SLURM_CRASH_DETECT_S (srun --kill-on-bad-exit)", sec(SLURM_CRASH_DETECT_S)),
        ("SLURMD_TIMEOUT_S (node loss)", sec(SLURMD_TIMEOUT_S)),
        ("SLURM_REQUEUE_DELAY_S (cred_expire)", sec(SLURM_REQUEUE_DELAY_S)),
        ("NCCL timeout (hang under Slurm)", m(p.nccl_timeout_s)),
        ("Spares (idle healthy nodes, both)", p.spares.to_string()),
        ("Checkpoint interval", m(p.checkpoint_s)),
        ("CHECKPOINT_STALL_S (async checkpointing)", sec(p.checkpoint_stall_s)),
        ("Restart overhead (both)", m(p.restart_s)),
        ("REPAIR_RESET_S", m(REPAIR_RESET_S)),
        ("REPAIR_REPLACE_MIN_S..MAX_S (uniform)", format!("{}..{}", h(REPAIR_REPLACE_MIN_S), h(REPAIR_REPLACE_MAX_S))),
        ("GPU_REPLACE_SHARE (GPU crashes needing a part swap)", pct(GPU_REPLACE_SHARE)),
        ("NETWORK_REPLACE_SHARE", pct(NETWORK_REPLACE_SHARE)),
        ("SOFTWARE_HANG_SHARE", pct(SOFTWARE_HANG_SHARE)),
        ("NETWORK_HANG_SHARE", pct(NETWORK_HANG_SHARE)),
        ("LEMON_NODE_SHARE", format!("{} ({} nodes)", pct(LEMON_NODE_SHARE), p.lemon_nodes)),
        ("LEMON_SHARE_OF_HW_FAULTS (baseline, repeats included)", pct(p.lemon_share_of_hw)),
        ("LEMON_REFAIL_MEAN_S (in service after a reset)", h(LEMON_REFAIL_MEAN_S)),
        ("LEMON_FAILURES_UNTIL_OPERATOR (without quarantine)", LEMON_FAILURES_UNTIL_OPERATOR.to_string()),
    ];
    let mut s = String::from("### Assumptions\n\n");
    for (name, value) in items {
        s += &format!("- {name}: {value}\n");
    }
    s
}

/// Minutes without a trailing `.0`.
fn fmt_min(minutes: f64) -> String {
    if minutes.fract() == 0.0 { format!("{minutes:.0}") } else { format!("{minutes}") }
}

/// `decimals` places, thousands separated by commas.
fn fmt_num(x: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, x.abs());
    let (int, frac) = text.split_once('.').map_or((text.as_str(), None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    let sign = if x < 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') { "-" } else { "" };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

// ---------------------------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(name: &str) -> usize {
        CAUSES.iter().position(|c| c.name == name).expect("a cause of Table 5")
    }

    fn both(p: &Params, scenario: &Scenario) -> (Outcome, Outcome) {
        (simulate(p, &Policy::drover(p), scenario), simulate(p, &Policy::slurm(p), scenario))
    }

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn table_5_counts_add_up_to_the_419_unexpected_interruptions() {
        assert_eq!(table_5_total(), UNEXPECTED_INTERRUPTIONS);
    }

    #[test]
    fn the_same_seed_replays_the_same_run_and_another_seed_does_not() {
        let p = Params::default();
        let (a, b) = (Scenario::draw(&p, 42), Scenario::draw(&p, 42));
        assert_eq!(a, b);
        assert_eq!(both(&p, &a), both(&p, &b));

        let other = Scenario::draw(&p, 43);
        assert_ne!(a, other);
        let (d42, s42) = both(&p, &a);
        let (d43, s43) = both(&p, &other);
        assert_ne!(d42.ettr(), d43.ettr());
        assert_ne!(s42.ettr(), s43.ettr());
    }

    #[test]
    fn without_interruptions_both_policies_train_all_the_time() {
        let p = Params { unexpected: 0.0, planned: 0.0, ..Params::default() };
        let scenario = Scenario::draw(&p, 1);
        assert_eq!(scenario, Scenario::default());
        let (drover, slurm) = both(&p, &scenario);
        for o in [drover, slurm] {
            assert_eq!(o.ettr(), 1.0);
            assert_eq!(o.lost_s(), 0.0);
        }
    }

    #[test]
    fn lost_gpu_hours_add_up_per_cause_and_match_ettr() {
        // A checkpoint stall too, so that every term of the sum is exercised.
        let p = Params { checkpoint_stall_s: 20.0, ..Params::default() };
        for seed in 1..=3 {
            let scenario = Scenario::draw(&p, seed);
            let (drover, slurm) = both(&p, &scenario);
            for o in [drover, slurm] {
                let per_cause: f64 = o.by_slot.iter().map(|l| gpu_hours(l.total_s())).sum();
                let lost = per_cause + gpu_hours(o.stall_s);
                assert!(close(lost, gpu_hours(o.lost_s()), 1e-9));
                let from_ettr = gpu_hours(o.wall_s) * (1.0 - o.ettr());
                assert!(close(lost, from_ettr, 1e-9), "lost {lost} GPU-h, ETTR says {from_ettr}");
                assert!(o.ettr() > 0.5 && o.ettr() < 1.0);
            }
        }
    }

    #[test]
    fn a_planned_interruption_costs_both_the_restart_only() {
        let p = Params { unexpected: 0.0, planned: 0.0, ..Params::default() };
        let scenario = Scenario { planned: vec![1_000.0], ..Scenario::default() };
        let (drover, slurm) = both(&p, &scenario);
        let expected = Loss { interruptions: 1, restart_s: p.restart_s, ..Loss::default() };
        assert_eq!(drover.by_slot[PLANNED], expected);
        assert_eq!(slurm.by_slot[PLANNED], expected);
        assert_eq!(drover.productive_s, p.wall_s - p.restart_s);
    }

    /// One hang 1,000 s into the run (checkpoints every 30 min, so all 1,000 s are lost), nothing else.
    fn one_hang() -> (Params, Scenario) {
        let p = Params { unexpected: 0.0, planned: 0.0, ..Params::default() };
        let hang =
            Fault { at_s: 1_000.0, cause: cause("NCCL watchdog timeouts"), shows_as: Manifest::Hang, repair_s: None };
        (p, Scenario { faults: vec![hang], ..Scenario::default() })
    }

    #[test]
    fn a_hang_costs_slurm_the_nccl_timeout_and_drover_the_progress_timeout() {
        let (p, scenario) = one_hang();
        let slot = scenario.faults[0].cause;
        let (drover, slurm) = both(&p, &scenario);

        let expected_drover = Loss {
            interruptions: 1,
            lost_work_s: 1_000.0,
            detection_s: 10.0 * MIN_S,
            requeue_s: 0.0,
            wait_s: 0.0,
            restart_s: 5.0 * MIN_S,
        };
        let expected_slurm = Loss { detection_s: 30.0 * MIN_S, requeue_s: 120.0, ..expected_drover.clone() };
        assert_eq!(drover.by_slot[slot], expected_drover);
        assert_eq!(slurm.by_slot[slot], expected_slurm);
        assert_eq!(drover.productive_s, p.wall_s - expected_drover.total_s());
        assert_eq!(slurm.productive_s, p.wall_s - expected_slurm.total_s());

        let five = Params { progress_timeout_s: 5.0 * MIN_S, ..p.clone() };
        assert_eq!(simulate(&five, &Policy::drover(&five), &scenario).by_slot[slot].detection_s, 5.0 * MIN_S);
        // The NCCL watchdog still fires inside a Drover job: a longer progress timeout does not stretch a hang.
        let long = Params { progress_timeout_s: 60.0 * MIN_S, ..p };
        assert_eq!(simulate(&long, &Policy::drover(&long), &scenario).by_slot[slot].detection_s, 30.0 * MIN_S);
    }

    #[test]
    fn a_node_loss_waits_for_its_repair_only_when_no_spare_is_free() {
        let p = Params { unexpected: 0.0, planned: 0.0, ..Params::default() };
        let lost = Fault {
            at_s: 1_000.0,
            cause: cause("Host maintenance"),
            shows_as: Manifest::NodeLoss,
            repair_s: Some(REPAIR_RESET_S),
        };
        let scenario = Scenario { faults: vec![lost], ..Scenario::default() };
        let slot = scenario.faults[0].cause;
        let (drover, slurm) = both(&p, &scenario);
        assert_eq!(drover.by_slot[slot].detection_s, 10.0);
        assert_eq!(slurm.by_slot[slot].detection_s, 300.0);
        assert_eq!(drover.by_slot[slot].wait_s, 0.0);

        let no_spares = Params { spares: 0, ..p };
        let (drover, slurm) = both(&no_spares, &scenario);
        // The node is back 15 min after detection; Slurm's 120 s hold runs inside that wait.
        assert_eq!(drover.by_slot[slot].wait_s, REPAIR_RESET_S);
        assert_eq!(slurm.by_slot[slot].wait_s, REPAIR_RESET_S - 120.0);
    }

    #[test]
    fn quarantine_spares_drover_the_lemons_repeat_failures() {
        let p = Params::default();
        let (mut drover_repeats, mut slurm_repeats, mut quarantined) = (0, 0, 0);
        for seed in 1..=10 {
            let (drover, slurm) = both(&p, &Scenario::draw(&p, seed));
            drover_repeats += drover.lemon_repeats;
            slurm_repeats += slurm.lemon_repeats;
            quarantined += drover.quarantined;
            assert_eq!(slurm.quarantined, 0);
        }
        assert!(quarantined > 0);
        assert!(drover_repeats < slurm_repeats, "Drover {drover_repeats} repeats, Slurm {slurm_repeats}");
    }

    #[test]
    fn training_splits_into_checkpointed_work_stalls_and_unsaved_work() {
        assert_eq!(training(1_000.0, 1_800.0, 0.0), (0.0, 0.0, 1_000.0));
        assert_eq!(training(4_000.0, 1_800.0, 0.0), (3_600.0, 0.0, 400.0));
        // Cycles of 1,800 s of work then 100 s of writing: 3,800 s in, two checkpoints are done.
        assert_eq!(training(3_850.0, 1_800.0, 100.0), (3_600.0, 200.0, 50.0));
        // Caught mid-write: the write is a stall, the cycle's work is still unsaved.
        assert_eq!(training(1_850.0, 1_800.0, 100.0), (0.0, 50.0, 1_800.0));
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(fmt_num(1_234_567.0, 0), "1,234,567");
        assert_eq!(fmt_num(419.0, 1), "419.0");
        assert_eq!(fmt_num(-12_345.34, 1), "-12,345.3");
    }
}

//! What a pending job costs a replica: heap bytes per job in the live state (after `apply`ing the submissions,
//! as a follower holds them), and the time to decode one stored record (what a restart pays per job).
//!
//! `cargo bench -p drover-state --bench job_memory [-- JOBS]` (default 200,000). Two specs: the trivial one
//! `drover-bench state` submits, and a typical training job (its own name, partition, account, output path, a
//! constraint and two exported variables).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use drover_state::config::{ClusterConfig, Limits};
use drover_state::{Command, Job, JobSpec, Request, State, codec};

/// Live heap bytes, as the program asked for them (malloc's own rounding and headers come on top).
struct Counting;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's pointer and layout, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes glibc's malloc has handed out and not got back, its own headers and rounding included: what the
/// state costs in RSS, short of fragmentation.
fn malloc_in_use() -> i64 {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    unsafe { libc::mallinfo2() }.uordblks as i64
}

fn trivial(_n: u64) -> JobSpec {
    JobSpec {
        name: "wrap".into(),
        user: "alice".into(),
        uid: 1001,
        gid: 1001,
        script: "#!/bin/sh\n# This script was created by sbatch --wrap.\n\ntrue\n".into(),
        work_dir: "/tmp".into(),
        submit_dir: "/tmp".into(),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        gpus_per_node: 1,
        ..JobSpec::default()
    }
}

fn typical(n: u64) -> JobSpec {
    JobSpec {
        name: format!("llama-sweep-lr{n}").into(),
        partition: Some("gpu".into()),
        account: Some("root".into()),
        stdout: Some("/home/alice/runs/%x-%j.out".into()),
        constraint: vec!["h100".into()].into(),
        environment: vec![("PATH".into(), "/usr/bin:/bin".into()), ("HOME".into(), "/home/alice".into())].into(),
        time_limit_s: Some(4 * 3600),
        work_dir: "/home/alice/llama".into(),
        submit_dir: "/home/alice/llama".into(),
        min_nodes: 2,
        max_nodes: 2,
        gpus_per_node: 8,
        ..trivial(n)
    }
}

fn measure(label: &str, jobs: u64, spec_of: fn(u64) -> JobSpec) {
    let mut state = State::default();
    let limits = Limits { max_jobs_per_user: jobs + 1, ..Limits::default() };
    let mut config = ClusterConfig { limits, ..ClusterConfig::default() };
    if let Some(p) = config.partitions.first_mut() {
        p.name = "gpu".into();
    }
    state.apply(&Request { time_ms: 1, command: Command::InitCluster { config } });
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let malloc_before = malloc_in_use();
    let started = Instant::now();
    for n in 0..jobs {
        let command = Command::SubmitJob { spec: Box::new(spec_of(n)), request_id: None };
        state.apply(&Request { time_ms: 1_000 + n, command }).response.expect("submit");
    }
    let apply_s = started.elapsed().as_secs_f64();
    // Each command was dropped after its apply: what is left is the state's.
    let grown = LIVE_BYTES.load(Ordering::Relaxed) - before;
    let malloc_grown = malloc_in_use() - malloc_before;
    let job: &Job = state.job(jobs / 2).expect("a job in the middle");
    let record = codec::encode(job).expect("encode");
    let decode_rounds = 200_000;
    let started = Instant::now();
    for _ in 0..decode_rounds {
        let decoded: Job = codec::decode(std::hint::black_box(&record)).expect("decode");
        std::hint::black_box(decoded);
    }
    let decode_ns = started.elapsed().as_nanos() as f64 / decode_rounds as f64;
    // The same record read strictly, as builds before feature levels read it (no skipping of unknown trailing
    // fields): what the tolerant reader costs.
    let started = Instant::now();
    for _ in 0..decode_rounds {
        let decoded: Job = rmp_serde::from_slice(std::hint::black_box(&record[1..])).expect("decode");
        std::hint::black_box(decoded);
    }
    let strict_ns = started.elapsed().as_nanos() as f64 / decode_rounds as f64;
    println!(
        "{label:>8}: {jobs} pending jobs: {:.0} MiB of malloc'd memory, {:.0} bytes per job ({:.0} asked for; Job \
         inline {} bytes); record {} bytes, decoded in {decode_ns:.0} ns ({strict_ns:.0} ns \
         strictly); apply {:.1} µs per submission",
        malloc_grown as f64 / (1 << 20) as f64,
        malloc_grown as f64 / jobs as f64,
        grown as f64 / jobs as f64,
        std::mem::size_of::<Job>(),
        record.len(),
        apply_s * 1e6 / jobs as f64,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; the first number among the arguments is the job count.
    let jobs = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200_000);
    measure("trivial", jobs, trivial);
    measure("typical", jobs, typical);
}

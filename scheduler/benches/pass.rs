//! One full scheduling pass (priority + backfill + placement) at 1k / 10k / 100k pending jobs on 10,000 nodes ×
//! 8 GPUs with about half the GPUs busy. A counting global allocator reports the memory of the view and the peak
//! extra memory of one pass. `pass_10k_nodes_preempt`: the same views with preemption configured (every fifth
//! pending job in a QOS that may preempt the others, every running job requeue-able).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use drover_scheduler::synth::{bench_view, with_preemption};
use drover_scheduler::{SchedulerConfig, schedule};

struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only adds counters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const NODES: usize = 10_000;

fn memory_report() {
    for pending in [1_000, 10_000, 100_000] {
        let before = LIVE_BYTES.load(Ordering::Relaxed);
        let view = bench_view(NODES, pending, 42);
        let view_bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
        let base = LIVE_BYTES.load(Ordering::Relaxed);
        PEAK_BYTES.store(base, Ordering::Relaxed);
        let plan = schedule(&view, &SchedulerConfig::default()).expect("valid view");
        let pass_peak = PEAK_BYTES.load(Ordering::Relaxed) - base;
        println!(
            "memory: pending={pending} view={:.1} MiB pass_peak_extra={:.1} MiB starts={} reserved={} waiting={}",
            view_bytes as f64 / (1 << 20) as f64,
            pass_peak as f64 / (1 << 20) as f64,
            plan.starts.len(),
            plan.expected_start.len(),
            plan.reasons.len()
        );
    }
}

fn pass(c: &mut Criterion) {
    memory_report();
    let mut group = c.benchmark_group("pass_10k_nodes");
    group.sample_size(10);
    for pending in [1_000, 10_000, 100_000] {
        let view = bench_view(NODES, pending, 42);
        let config = SchedulerConfig::default();
        group.bench_with_input(BenchmarkId::from_parameter(pending), &view, |b, v| {
            b.iter(|| schedule(v, &config).expect("valid view"))
        });
    }
    group.finish();
    let mut group = c.benchmark_group("pass_10k_nodes_preempt");
    group.sample_size(10);
    for pending in [10_000, 100_000] {
        let mut view = bench_view(NODES, pending, 42);
        with_preemption(&mut view, 5);
        let config = SchedulerConfig::default();
        group.bench_with_input(BenchmarkId::from_parameter(pending), &view, |b, v| {
            b.iter(|| schedule(v, &config).expect("valid view"))
        });
    }
    group.finish();
}

criterion_group!(benches, pass);
criterion_main!(benches);

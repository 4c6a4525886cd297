//! The small version of the short-jobs run (issue 33): one-GPU jobs submitted at a fixed rate through 8 simulated
//! agents of 8 GPUs that run what they are assigned (report each end, confirm each release), on a 3-replica
//! cluster with the production lease. Every acknowledged job must end up complete in the accounting store that
//! `sacct` reads (COMPLETED, with start, end and node), none refused, and no agent's lease may run out meanwhile,
//! lookups of thousands of finished jobs included.
//!
//! The bench binary is the harness (`drover-bench short-jobs`; BENCHMARKS.md has 1,000 jobs/s for 5 minutes in
//! release builds); this test holds it to its promises, not to its rate.

mod common;

#[test]
fn every_short_job_is_complete_in_accounting_and_no_lease_runs_out() {
    let (stdout, stderr) = common::run_bench(&["short-jobs", "--rate", "100", "--duration-s", "5", "--clients", "4"]);
    let number_after = |prefix: &str| -> u64 {
        let line =
            stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line:\n{stdout}"));
        line[prefix.len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    let acknowledged = number_after("offered: ");
    assert!(acknowledged >= 400, "{acknowledged} of 500 offered were acknowledged:\n{stdout}");
    assert_eq!(number_after("accounting: "), acknowledged, "{stdout}");
    for line in [
        ", 0 refused;",
        &format!("of {acknowledged} acknowledged jobs complete in the accounting store"),
        "0 incomplete, 0 missing",
        "leases: 0 ran out before their renewal",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from the bench's report:\n{stdout}\n{stderr}");
    }
}

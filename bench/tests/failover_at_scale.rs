//! The small version of the failover-at-scale run (issue 33): 200 simulated agents, each with its own mutual-TLS
//! session, a real lease and one running 8-GPU job, heartbeat once a second on a 3-replica cluster with the
//! production lease (5 s) and node timeout (8 s). The leader is SIGKILLed twice under submission load; every
//! agent must find the new leader and have its lease renewed before it runs out, so no node fences its jobs, no
//! node is declared down, no job restarts and no acknowledged submission is lost.
//!
//! The bench binary is the harness (`drover-bench heartbeats`, BENCHMARKS.md has the 1,000-10,000 agent runs);
//! this test holds it to the promises, not to its timings. 200, not 500: the test profile's session path costs
//! about 5.5 times the release build's per message (573 against 103 µs of leader CPU per heartbeat), and with the
//! simulated agents on the same two cores 500 debug-built sessions took the renewals to the lease's edge.
//! Release builds keep every lease at 1,000 agents through 10 kills (BENCHMARKS.md).

mod common;

#[test]
fn two_hundred_agents_keep_every_lease_through_two_leader_kills() {
    let (stdout, stderr) = common::run_bench(&[
        "heartbeats",
        "--agents",
        "200",
        "--heartbeat-ms",
        "1000",
        "--duration-s",
        "3",
        "--jobs",
        "--kills",
        "2",
        "--clients",
        "2",
    ]);
    for line in [
        "registration: 200 of 200 agents registered",
        "jobs: 200 8-GPU jobs submitted and running on 200 nodes",
        "leases renewed 200 of 200",
        "0 leases ran out; 0 nodes not Up;",
        " acknowledged, 0 lost",
        "long jobs: 200 of 200 running in their first incarnation, 0 restarted, 0 missing",
        "leases: 0 ran out before their renewal",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from the bench's report:\n{stdout}\n{stderr}");
    }
    // Both kills are reported, each with every lease renewed.
    assert_eq!(stdout.matches("leases renewed 200 of 200").count(), 2, "{stdout}");
}

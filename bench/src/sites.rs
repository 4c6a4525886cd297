//! `drover-bench sites` (issue 14): 5 replicas over 3 sites (a, a, b, b, c for ids 1-5), every connection
//! between sites delayed by the userspace WAN emulator (`wan.rs`). Measures, from clients at one site: sequential
//! submission latency, elections while at rest, leader failover (SIGKILL), and the loss of whole sites.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use drover_testkit::local::{LocalCluster, UpOptions, trivial_spec};
use hdrhistogram::Histogram;

use crate::wan::{Route, Wan};
use crate::{Fault, KillHooks, KillResult, kill_under_load, percentile_ms};

/// The site of replica `id` (1-based): two at a, two at b, one at c. Any one site holds at most two of the five,
/// so the other three are a quorum.
const SITES: [&str; 5] = ["a", "a", "b", "b", "c"];
/// How long a leader leads before handing over to a preferred replica (the controllers' default).
const PREFERRED_HOLD_MS: u64 = 3_000;

#[derive(Args, Debug, Clone)]
pub struct SitesArgs {
    /// Round-trip time between two sites (ms); within a site there is no added delay. 0 still goes through the
    /// proxies, for a baseline with the same hops.
    #[arg(long, default_value_t = 20)]
    pub rtt_ms: u64,
    /// The site of the benchmark's clients.
    #[arg(long, default_value = "a")]
    pub client_site: String,
    /// The site whose replicas should lead (`raft.preferred_leaders`): a = 1,2; b = 3,4; c = 5.
    #[arg(long, default_value = "a")]
    pub leader_site: String,
    /// Sequential submissions (one client) for the latency figures.
    #[arg(long, default_value_t = 200)]
    pub submissions: usize,
    /// A quiet period (s) watched for elections before the latency run.
    #[arg(long, default_value_t = 10)]
    pub rest_s: u64,
    /// Leader SIGKILLs for the failover figures (0: none).
    #[arg(long, default_value_t = 10)]
    pub kills: usize,
    /// Concurrent submit loops during the kills.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Sites lost whole (both replicas SIGKILLed at once), one after the other, after the leader kills.
    #[arg(long, value_delimiter = ',', default_value = "b,a")]
    pub lose_sites: Vec<String>,
    /// Raft heartbeat (ms); default: the rule in `timing`, scaled with the RTT.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    #[arg(long)]
    pub election_min_ms: Option<u64>,
    #[arg(long)]
    pub election_max_ms: Option<u64>,
    /// Between survivors' campaigns after a leader's crash (ms); default 25 + 2 x RTT (`timing`).
    #[arg(long)]
    pub campaign_stagger_ms: Option<u64>,
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Raft timing for an inter-site RTT: (heartbeat, election min, election max, campaign stagger) in ms.
///
/// openraft gives every AppendEntries and heartbeat RPC `heartbeat_interval` to answer, so a heartbeat must
/// outlast a round trip plus a follower's fsync with room for a loaded machine: 50 ms + 2 x RTT. The election
/// timeout keeps at least four heartbeats per election (and the LAN default of 200 ms as a floor), the maximum
/// half as much again. After a crash, survivors campaign one after the other, 25 ms + 2 x RTT apart, so that a
/// Pre-Vote and a vote round (two RTTs) settle before the next one starts. RTT 0 gives the LAN defaults
/// (50/200/300, 25).
pub fn timing(rtt_ms: u64) -> (u64, u64, u64, u64) {
    let heartbeat = 50 + 2 * rtt_ms;
    let min = (4 * heartbeat).max(200);
    (heartbeat, min, min * 3 / 2, 25 + 2 * rtt_ms)
}

fn site_replicas(site: &str) -> Vec<u64> {
    (1..=SITES.len() as u64).filter(|id| SITES[*id as usize - 1] == site).collect()
}

/// The highest Raft term any replica reports (0 when none answers): a change between two readings is an election.
async fn term(client: &drover_client::Client) -> u64 {
    client.cluster_status().await.map(|s| s.replicas.iter().map(|r| r.term).max().unwrap_or(0)).unwrap_or(0)
}

/// Waits until one of `preferred` leads (the controllers hand leadership over after `PREFERRED_HOLD_MS`).
async fn wait_leader_in(cluster: &LocalCluster, preferred: &[u64], timeout: Duration) -> anyhow::Result<u64> {
    let start = Instant::now();
    loop {
        let leader = cluster.wait_ready(timeout).await?;
        if preferred.contains(&leader) {
            return Ok(leader);
        }
        if start.elapsed() > timeout {
            anyhow::bail!("replica {leader} still leads after {timeout:?}; the preferred ones are {preferred:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn sites(args: SitesArgs, dir: PathBuf) -> anyhow::Result<()> {
    let (heartbeat, election_min, election_max, stagger) = {
        let (h, min, max, stagger) = timing(args.rtt_ms);
        (
            args.heartbeat_ms.unwrap_or(h),
            args.election_min_ms.unwrap_or(min),
            args.election_max_ms.unwrap_or(max),
            args.campaign_stagger_ms.unwrap_or(stagger),
        )
    };
    let preferred = site_replicas(&args.leader_site);
    anyhow::ensure!(!preferred.is_empty(), "--leader-site must be a, b or c");
    let lose: Vec<String> = args.lose_sites.iter().filter(|s| !s.is_empty()).cloned().collect();
    for site in &lose {
        anyhow::ensure!(!site_replicas(site).is_empty(), "--lose-sites: no site {site:?} (a, b or c)");
    }
    let options = UpOptions {
        controllers: SITES.len(),
        distinct_ips: true,
        separate_advertise: true,
        heartbeat_ms: heartbeat,
        election_min_ms: election_min,
        election_max_ms: election_max,
        extra_toml: format!(
            "[raft]\npreferred_leaders = {preferred:?}\npreferred_leader_hold_ms = {PREFERRED_HOLD_MS}\ncampaign_stagger_ms = {stagger}\n"
        ),
        ..UpOptions::default()
    };
    let mut cluster = LocalCluster::up(&dir, options)?;
    let mut routes = Vec::new();
    for p in cluster.processes.iter().filter(|p| p.role == "controller") {
        let upstream = p.listen.as_deref().unwrap_or(&p.address);
        routes.push(Route {
            listen: p.address.parse()?,
            upstream: upstream.parse()?,
            site: SITES[p.id as usize - 1].to_string(),
        });
    }
    let _wan = Wan::start(&routes, &args.client_site, Duration::from_millis(args.rtt_ms));
    println!(
        "bench sites: 5 replicas at sites {SITES:?}, RTT {} ms between sites, clients at site {}, preferred leaders {preferred:?} (site {}); raft heartbeat {heartbeat} ms, election timeout {election_min}-{election_max} ms, campaign stagger {stagger} ms",
        args.rtt_ms, args.client_site, args.leader_site
    );
    cluster.wait_ready(Duration::from_secs(60)).await?;
    let leader = wait_leader_in(&cluster, &preferred, Duration::from_secs(30)).await?;
    let client = Arc::new(cluster.client()?);

    // At rest: no election may happen without a fault.
    let term_before = term(&client).await;
    tokio::time::sleep(Duration::from_secs(args.rest_s)).await;
    let term_rest = term(&client).await;

    let (hist, rate) = sequential_submissions(&client, args.submissions).await?;
    let term_after = term(&client).await;
    let leader_after = cluster.wait_ready(Duration::from_secs(30)).await?;
    println!(
        "rest: {} s, elections {} (term {term_before} -> {term_rest}); latency run: elections {}, leader {leader} -> {leader_after}",
        args.rest_s,
        term_rest.saturating_sub(term_before),
        term_after.saturating_sub(term_rest)
    );
    println!(
        "sequential submit, leader {leader} at site {}: p50={:.1} ms p90={:.1} ms p99={:.1} ms max={:.1} ms ({rate:.0}/s, {} submissions)",
        SITES[leader as usize - 1],
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.9) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
        hist.max() as f64 / 1e3,
        args.submissions
    );

    if args.kills == 0 && lose.is_empty() {
        return Ok(());
    }
    // Failover and site loss under load. Between rounds: time for a restarted replica to catch up, then for
    // leadership to go back to a preferred replica (`kill_under_load` waits for one).
    let mut faults = vec![Fault::Leader; args.kills];
    faults.extend(lose.iter().map(|site| Fault::Replicas(site_replicas(site))));
    let settle = Duration::from_millis(1_500);
    let result =
        kill_under_load(&mut cluster, client.clone(), args.clients, &faults, settle, &preferred, KillHooks::none())
            .await?;
    print_rounds(&result, &args, &lose);
    println!(
        "acknowledged={} lost={} duplicate_ids={}; elections in all: term {term_before} -> {}",
        result.acknowledged,
        result.lost,
        result.duplicates,
        term(&client).await
    );
    Ok(())
}

/// Sequential submissions from one client, after a warm-up that finds the leader and opens the connection: each
/// one's latency in µs, and the rate.
async fn sequential_submissions(
    client: &drover_client::Client,
    submissions: usize,
) -> anyhow::Result<(Histogram<u64>, f64)> {
    let spec = trivial_spec();
    for _ in 0..10 {
        client.submit(&spec).await?;
    }
    let mut hist = Histogram::<u64>::new(3)?;
    let started = Instant::now();
    for _ in 0..submissions {
        let t = Instant::now();
        client.submit(&spec).await?;
        hist.record(t.elapsed().as_micros() as u64)?;
    }
    Ok((hist, submissions as f64 / started.elapsed().as_secs_f64()))
}

/// The leader kills' and the site losses' figures, a line each.
fn print_rounds(result: &KillResult, args: &SitesArgs, lose: &[String]) {
    let (kills, losses) = result.rounds.split_at(args.kills);
    if !kills.is_empty() {
        let gaps: Vec<Duration> = kills.iter().map(|r| r.gap).collect();
        let new_sites: Vec<&str> = kills.iter().map(|r| SITES[r.leader_after as usize - 1]).collect();
        println!(
            "failover: {} leader kills, {} clients at site {}: next ack p50={:.0} ms p99={:.0} ms max={:.0} ms; new leader's site: {}",
            kills.len(),
            args.clients,
            args.client_site,
            percentile_ms(&gaps, 0.5),
            percentile_ms(&gaps, 0.99),
            percentile_ms(&gaps, 1.0),
            new_sites.join(",")
        );
    }
    for (site, round) in lose.iter().zip(losses) {
        println!(
            "site {site} lost (replicas {:?}; leader was {} at site {}): next ack after {:.0} ms, leader now {} at site {}",
            round.killed,
            round.leader_before,
            SITES[round.leader_before as usize - 1],
            round.gap.as_secs_f64() * 1e3,
            round.leader_after,
            SITES[round.leader_after as usize - 1]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_is_the_lan_default_at_zero_rtt_and_grows_with_it() {
        assert_eq!(timing(0), (50, 200, 300, 25));
        assert_eq!(timing(20), (90, 360, 540, 65));
        assert_eq!(timing(50), (150, 600, 900, 125));
    }

    #[test]
    fn no_site_holds_a_quorum_and_losing_any_leaves_one() {
        for site in ["a", "b", "c"] {
            let lost = site_replicas(site).len();
            assert!(lost >= 1 && SITES.len() - lost > SITES.len() / 2, "losing {site} leaves no quorum");
        }
    }
}

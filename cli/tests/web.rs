//! What an operator sees: every controller serves `/metrics` and a read-only web page over plain HTTP. The page is
//! checked in a real headless browser (Chromium from the OS packages), since it is drawn by its own script.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use drover_cli::local::UpOptions;

mod common;

use common::setup;

/// A GET over a plain socket: the body of a 200, or a panic naming what came back instead.
fn get(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = TcpStream::connect(host).unwrap_or_else(|e| panic!("cannot connect to {host}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "GET {url}: {head}\n{body}");
    body.to_string()
}

/// The value of one series in a Prometheus text exposition (`name{labels}` exactly as written).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(start.elapsed() < timeout, "{what} did not happen within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Chromium's headless shell from the OS packages (`apt-get install chromium-headless-shell`, or `chromium`).
fn browser() -> String {
    for candidate in ["chromium-headless-shell", "chromium", "chromium-browser"] {
        if Command::new(candidate).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return candidate.to_string();
        }
    }
    panic!("the web page test needs a headless Chromium: apt-get install chromium-headless-shell (.ci/run does)")
}

/// The page's DOM once its script has drawn `view` ("overview" or "job"): the browser runs it for real, against
/// the replica's HTTP port.
fn rendered(browser: &str, url: &str, view: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    wait_for(&format!("{url} rendered as {view}"), Duration::from_secs(60), || {
        let out = Command::new(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(["--virtual-time-budget=5000", "--dump-dom", url])
            .output()
            .expect("the browser runs");
        let dom = String::from_utf8_lossy(&out.stdout).to_string();
        dom.contains(&format!("data-loaded=\"{view}\"")).then_some(dom)
    })
}

/// Every `drover_*` series the shipped Grafana dashboard queries is one a controller or an agent exports, so
/// the dashboard cannot silently go blank after a rename.
fn dashboard_names_exist(expositions: &[String]) {
    let mut exported = std::collections::BTreeSet::new();
    for text in expositions {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                exported.insert(name.to_string());
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_count", "_sum"],
                    _ => &[],
                };
                for suffix in suffixes {
                    exported.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/drover.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("drover_") {
                let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                assert!(exported.contains(&name), "panel {:?} queries {name}, which nothing exports", panel["title"]);
                queried += 1;
                rest = &rest[at + name.len()..];
            }
        }
    }
    assert!(queried >= 20, "the dashboard queries {queried} series");
}

#[test]
fn every_replica_serves_metrics_and_a_web_page_that_a_real_browser_draws_even_with_the_leader_gone() {
    let browser = browser();
    // Every process of this cluster logs JSON (it inherits the variable), checked at the end.
    // SAFETY: no other thread of this test process reads the environment yet.
    unsafe { std::env::set_var("DROVER_LOG_FORMAT", "json") };
    let dir = tempfile::tempdir().unwrap();
    let options = UpOptions { agents: 1, gpus_per_agent: 2, agent_fault_files: true, ..UpOptions::default() };
    let (mut cluster, sh) = setup(dir.path(), options);
    let web = cluster.web_addresses();
    assert_eq!(web.len(), 3, "every controller serves HTTP: {web:?}");

    // A running job whose name would be markup if the page parsed it, with a checkpoint; and a held job.
    let checkpoint = sh.cwd.join("ckpt-7");
    std::fs::write(&checkpoint, "7").unwrap();
    let script = format!("drover checkpoint record {} --step 7 && sleep 120", checkpoint.display());
    let running = sh.submit(&["--gres=gpu:1", "-J", "<img src=x onerror=alert(1)>", "--wrap", &script]);
    let held = sh.submit(&["--gres=gpu:1", "--hold", "-J", "held-one", "--wrap", "true"]);

    // Metrics: one leader, the job running with its checkpoint, the held one pending for its reason.
    let leader =
        wait_for("the leader's metrics to show the running job and its checkpoint", Duration::from_secs(30), || {
            web.iter().find_map(|(id, url)| {
                let m = get(&format!("{url}/metrics"));
                let ready = sample(&m, "drover_raft_is_leader") == Some(1.0)
                    && sample(&m, "drover_jobs{state=\"RUNNING\"}") == Some(1.0)
                    && sample(&m, "drover_running_jobs_without_checkpoint") == Some(0.0);
                ready.then_some(*id)
            })
        });
    let leader_url = web.iter().find(|(id, _)| *id == leader).map(|(_, url)| url.clone()).unwrap();
    let m = get(&format!("{leader_url}/metrics"));
    assert_eq!(sample(&m, "drover_pending_jobs{reason=\"JobHeldUser\"}"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "drover_gpus"), Some(2.0), "{m}");
    assert_eq!(sample(&m, "drover_gpus_allocated"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "drover_agent_sessions"), Some(1.0), "{m}");
    assert!(sample(&m, "drover_agent_heartbeats_total").unwrap() >= 1.0, "{m}");
    assert!(sample(&m, "drover_scheduler_pass_seconds_count").unwrap() >= 1.0, "{m}");
    assert!(sample(&m, "drover_checkpoint_age_max_seconds").unwrap() < 120.0, "{m}");
    assert_eq!(sample(&m, "drover_jobs_submitted_total"), Some(2.0), "{m}");
    assert_eq!(sample(&m, "drover_goodput_failed_incarnations_total"), Some(0.0), "{m}");
    assert_eq!(sample(&m, "drover_goodput_lost_gpu_hours{cause=\"failure\"}"), Some(0.0), "{m}");
    for (id, url) in &web {
        let m = get(&format!("{url}/metrics"));
        assert_eq!(sample(&m, "drover_raft_voters"), Some(3.0), "replica {id}: {m}");
        assert_eq!(sample(&m, "drover_raft_leader_id"), Some(leader as f64), "replica {id}: {m}");
        assert_eq!(sample(&m, "drover_raft_leader_changes_total"), Some(1.0), "replica {id} saw one leader: {m}");
        assert_eq!(sample(&m, "drover_raft_is_leader"), Some(f64::from(u8::from(*id == leader))), "{m}");
        assert!(m.ends_with("# EOF\n"), "an OpenMetrics exposition ends with # EOF");
    }

    // The agent's metrics: the GPU the job holds, and its load as the GPU backend reads it (the simulated one
    // reads what the fault file sets, as NVML reads a busy GPU).
    let (_, agent_url) = cluster.http_addresses("agent").into_iter().next().expect("the agent serves /metrics");
    std::fs::write(cluster.fault_file("node01"), "0 util 87\n1 util 87\n").unwrap();
    let m = wait_for("the agent's metrics to show the busy GPU", Duration::from_secs(20), || {
        let m = get(&format!("{agent_url}/metrics"));
        (sample(&m, "drover_gpu_utilization_ratio{node=\"node01\",gpu=\"1\"}") == Some(0.87)).then_some(m)
    });
    let allocated: Vec<f64> = (0..2)
        .filter_map(|gpu| sample(&m, &format!("drover_gpu_allocated{{node=\"node01\",gpu=\"{gpu}\"}}")))
        .collect();
    assert_eq!(allocated.iter().sum::<f64>(), 1.0, "one of the two GPUs is held by the running job: {m}");
    assert_eq!(sample(&m, "drover_agent_connected"), Some(1.0), "{m}");
    dashboard_names_exist(&[get(&format!("{leader_url}/metrics")), m.clone()]);
    assert!(sample(&m, "drover_agent_heartbeats_sent_total").unwrap() >= 1.0, "{m}");
    assert!(sample(&m, "drover_agent_lease_remaining_seconds").unwrap() > 0.0, "{m}");

    // The page, from a follower: replicas, the node, the queue, and the job's name shown as text, not markup.
    let (follower, follower_url) = web.iter().find(|(id, _)| *id != leader).cloned().unwrap();
    let dom = rendered(&browser, &format!("{follower_url}/"), "overview");
    assert!(dom.contains(&format!("as replica {follower} has applied it")), "{dom}");
    for id in 1..=3 {
        assert!(dom.contains(&format!("data-replica=\"{id}\"")), "replica {id} listed: {dom}");
    }
    assert!(dom.contains(">leader</td>"), "{dom}");
    assert!(dom.contains("data-node=\"node01\""), "{dom}");
    assert!(dom.contains(&format!("data-job=\"{running}\"")) && dom.contains(&format!("data-job=\"{held}\"")), "{dom}");
    assert!(dom.contains("&lt;img src=x onerror=alert(1)&gt;"), "the job's name is shown as text: {dom}");
    assert!(!dom.contains("<img src=\"x\""), "the job's name must never become an element: {dom}");
    assert!(dom.contains(">JobHeldUser</td>"), "{dom}");
    assert!(dom.contains("data-account=\"TOTAL\""), "the goodput table has its total row: {dom}");

    // The job's timeline shows its checkpoint.
    let dom = rendered(&browser, &format!("{follower_url}/#job={running}"), "job");
    assert!(dom.contains("checkpoint (step 7) recorded by incarnation"), "{dom}");
    // The page is unauthenticated: no path of the user's (a checkpoint's names the submit directory).
    assert!(!dom.contains("ckpt-7") && !dom.contains(sh.cwd.to_str().unwrap()), "a path on the public page: {dom}");
    let api = get(&format!("{follower_url}/api/job?id={running}"));
    assert!(!api.contains("ckpt-7"), "a path in the public API: {api}");
    assert!(dom.contains("data-kind=\"current\""), "{dom}");
    assert!(dom.contains("<dt>Goodput</dt>"), "the job's goodput is shown: {dom}");
    assert!(dom.contains(&format!("job {running} as replica {follower} has applied it")), "{dom}");

    // With the leader killed, a survivor's page still draws, naming the dead replica unreachable.
    cluster.kill(leader).unwrap();
    let (survivor, survivor_url) = web.iter().find(|(id, _)| *id != leader).cloned().unwrap();
    wait_for("a survivor to report the killed leader unreachable", Duration::from_secs(20), || {
        let overview = get(&format!("{survivor_url}/api/overview"));
        let json: serde_json::Value = serde_json::from_str(&overview).unwrap();
        let replicas = json["replicas"].as_array().unwrap();
        let dead = replicas.iter().any(|r| r["id"] == leader && r["role"] == "unreachable");
        let new_leader = replicas.iter().any(|r| r["role"] == "leader");
        (dead && new_leader).then_some(())
    });
    let dom = rendered(&browser, &format!("{survivor_url}/"), "overview");
    assert!(dom.contains(">unreachable</td>"), "{dom}");
    assert!(dom.contains(&format!("as replica {survivor} has applied it")), "{dom}");

    // JSON logs: the agent's line about starting the job is inside the job's span, with its id and incarnation.
    let agent_log = std::fs::read_to_string(cluster.dir.join("agent-node01").join("agent.log")).unwrap();
    let started = agent_log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["fields"]["message"] == "batch script started" && event["fields"]["job"] == running)
        .unwrap_or_else(|| panic!("no JSON event for job {running}'s start in the agent's log:\n{agent_log}"));
    assert_eq!(started["span"]["name"], "job", "{started}");
    assert_eq!(started["span"]["id"], running, "{started}");
    assert!(started["span"]["incarnation"].is_u64(), "{started}");
    let controller_log = std::fs::read_to_string(&cluster.process(leader).unwrap().log_file).unwrap();
    let first = controller_log.lines().next().unwrap_or_default();
    assert!(serde_json::from_str::<serde_json::Value>(first).is_ok(), "the controller logs JSON: {first}");

    // Only reads: anything else is refused.
    let mut stream = TcpStream::connect(survivor_url.trim_start_matches("http://")).unwrap();
    write!(stream, "DELETE /api/job?id={running} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
}

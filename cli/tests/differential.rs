//! Slurm fidelity measured against Slurm itself: every scenario of `tests/differential/scenarios/` runs, with the
//! same shell script, against a real Slurm 22.05 (Debian's `slurm-wlm`, started privately by
//! `tests/differential/slurm.sh`) and against a local Drover cluster through the shims, and what a user or a
//! client library sees (exit codes, stdout, stderr, states, environments, output files; whatever the script
//! prints) must agree once ids, times and directories are normalized.
//!
//! A scenario that does not agree is either an *intended* difference (`intended.toml`, with the reason) or a
//! *known divergence* still to be fixed (`divergent.toml`, with what differs). Anything else fails the test, as
//! does a listed scenario that now agrees (the lists only ever shrink to the truth) and a `RESULTS.md` that no
//! longer matches the run (`DROVER_DIFF_BLESS=1` rewrites it). `DROVER_DIFF_ONLY=TEXT[,TEXT...]` runs the scenarios
//! whose name contains one of them and checks nothing but prints every difference: the way to write new scenarios.
//!
//! Scenarios run one at a time on each system (the two systems side by side), each on an idle cluster and in a
//! directory of its own, so a scenario sees the whole node as the other system does. Needs root (slurmd runs
//! jobs as their user; so do Drover's agents); skipped otherwise, saying so.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use drover_cli::local::UpOptions;

/// What both clusters are: one node `node01` with 64 CPUs and 8 GPUs, partitions `gpu` (default, no time limit)
/// and `debug` (10 minutes), cluster `diff`, job ids from 1000 (so an id never reads like a count).
const DROVER_CONFIG: &str = "[cluster]\ncluster_name = \"diff\"\nfirst_job_id = 1000\n\
    [[cluster.partitions]]\nname = \"gpu\"\ndefault = true\n\
    [[cluster.partitions]]\nname = \"debug\"\nmax_time_s = 600\n";

/// A scenario's script is killed after this long (a hung command is a divergence, not a hung suite).
const SCENARIO_TIMEOUT_S: u64 = 180;

/// Ids a scenario's jobs may take above the next id before it ran (arrays take one per task in Drover).
const IDS_PER_SCENARIO: u64 = 400;

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential")
}

/// One scenario: a shell snippet from a `scenarios/AREA.sh` file, after `#% NAME`.
#[derive(Debug, Clone)]
struct Scenario {
    area: String,
    name: String,
    body: String,
}

fn load_scenarios() -> Vec<Scenario> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(here().join("scenarios"))
        .expect("tests/differential/scenarios")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    files.sort();
    let mut scenarios: Vec<Scenario> = Vec::new();
    for file in files {
        let area = file.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("#% ") {
                let name = name.trim().to_string();
                assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                    "scenario name {name:?} in {area}.sh: letters, digits, - and _ only"
                );
                scenarios.push(Scenario { area: area.clone(), name, body: String::new() });
            } else if let Some(current) = scenarios.last_mut().filter(|s| s.area == area) {
                current.body.push_str(line);
                current.body.push('\n');
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for s in &scenarios {
        assert!(seen.insert(s.name.clone()), "scenario {} is named twice", s.name);
    }
    scenarios
}

/// One of the two systems: how its commands are reached.
struct Target {
    label: &'static str,
    env: Vec<(String, String)>,
    root: PathBuf,
}

impl Target {
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env_clear();
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command
    }

    /// Runs a short shell command line (cleanup, ids), returning its stdout.
    fn sh(&self, line: &str, cwd: &Path) -> String {
        let out = self.command("bash").arg("-c").arg(line).current_dir(cwd).output().expect("bash runs");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn next_job_id(&self) -> u64 {
        let config = self.sh("scontrol show config", &self.root);
        config
            .lines()
            .find_map(|l| l.strip_prefix("NEXT_JOB_ID").map(|v| v.trim().trim_start_matches('=').trim().to_string()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{}: no NEXT_JOB_ID in scontrol show config:\n{config}", self.label))
    }

    /// Cancels whatever a scenario left and waits until the queue is empty, so the next one starts idle.
    fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let active = self.sh("squeue -h -o %i 2>/dev/null", &self.root);
            if active.trim().is_empty() {
                return;
            }
            self.sh("scancel -u \"$(id -un)\" 2>/dev/null; true", &self.root);
            assert!(Instant::now() < deadline, "{}: jobs still active after a minute:\n{active}", self.label);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn run(&self, scenario: &Scenario, attempt: usize) -> String {
        let dir = self.root.join(format!("{}.{attempt}", scenario.name));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("scenario.sh");
        let prelude = std::fs::read_to_string(here().join("prelude.sh")).unwrap();
        std::fs::write(&script, format!("{prelude}\n# --- {}\n{}", scenario.name, scenario.body)).unwrap();
        let floor = self.next_job_id();
        let out = self
            .command("timeout")
            .args(["-s", "KILL", &SCENARIO_TIMEOUT_S.to_string(), "bash", "scenario.sh"])
            .current_dir(&dir)
            .output()
            .expect("timeout runs");
        let mut raw = String::from_utf8_lossy(&out.stdout).to_string();
        raw.push_str(&String::from_utf8_lossy(&out.stderr));
        if out.status.code() == Some(137) {
            raw.push_str(&format!("[scenario killed after {SCENARIO_TIMEOUT_S} s]\n"));
        }
        std::fs::write(dir.join("raw.txt"), &raw).unwrap();
        self.settle();
        let normalized = normalize(&raw, floor, &dir);
        std::fs::write(dir.join("normalized.txt"), &normalized).unwrap();
        normalized
    }
}

/// What differs between runs of the same thing: job ids (each replaced by `J1`, `J2`, ... in the order they first
/// appear, so `J1_3` and `J2.batch` keep their shape), the scenario's directory, and wall-clock times.
fn normalize(raw: &str, floor: u64, dir: &Path) -> String {
    let text = raw.replace(&dir.display().to_string(), "<dir>");
    let mut ids: HashMap<u64, usize> = HashMap::new();
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let token: String = chars[start..i].iter().collect();
            let before = if start > 0 { Some(chars[start - 1]) } else { None };
            // A step or array index after a dot or underscore, or digits inside a word, are not job ids.
            let standalone = !matches!(before, Some(c) if c == '.' || c == '_' || c.is_ascii_alphabetic());
            match token.parse::<u64>() {
                Ok(n) if standalone && n >= floor && n < floor + IDS_PER_SCENARIO && token.len() <= 10 => {
                    let next = ids.len() + 1;
                    let k = *ids.entry(n).or_insert(next);
                    out.push_str(&format!("J{k}"));
                }
                _ => out.push_str(&token),
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    mask_times(&out)
}

/// `2026-12-06T18:30:00` (and Slurm's `CANCELLED AT` stamps) read `<time>`.
fn mask_times(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let shape = b"dddd-dd-ddTdd:dd:dd";
    while i < b.len() {
        let fits = i + shape.len() <= b.len()
            && shape
                .iter()
                .zip(&b[i..i + shape.len()])
                .all(|(s, c)| if *s == b'd' { c.is_ascii_digit() } else { s == c });
        if fits {
            out.push_str("<time>");
            i += shape.len();
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// An entry of `intended.toml` or `divergent.toml`: why the scenario differs, and whether only its error
/// messages may (`stderr_only = true`: every other line, exit codes included, must still agree).
#[derive(Debug, Clone)]
struct Listing {
    why: String,
    stderr_only: bool,
}

fn load_list(file: &str) -> BTreeMap<String, Listing> {
    let path = here().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let table: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    table
        .into_iter()
        .map(|(name, v)| {
            let why =
                v.get("why").and_then(|w| w.as_str()).unwrap_or_else(|| panic!("{file}: [{name}] needs why = \"...\""));
            let stderr_only = v.get("stderr_only").and_then(|w| w.as_bool()).unwrap_or(false);
            (name, Listing { why: why.to_string(), stderr_only })
        })
        .collect()
}

/// The output without its stderr lines (`! ...`, see `run` in prelude.sh).
fn without_stderr(output: &str) -> String {
    output.lines().filter(|l| !l.starts_with("! ")).collect::<Vec<_>>().join("\n")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Equal,
    Intended,
    KnownDivergent,
    NewDivergent,
    /// Listed as intended or divergent but agrees: the list is stale.
    StaleListing,
}

fn start_slurm(dir: &Path) -> Target {
    let port = free_port_pair();
    let slurm_dir = dir.join("slurm");
    let status = Command::new("bash")
        .arg(here().join("slurm.sh"))
        .args(["start", &slurm_dir.display().to_string(), &port.to_string()])
        .status()
        .expect("bash runs");
    assert!(status.success(), "the private Slurm did not start (logs under {})", slurm_dir.join("log").display());
    let root = dir.join("runs-slurm");
    std::fs::create_dir_all(&root).unwrap();
    let mut env = base_env();
    env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into()));
    env.push(("SLURM_CONF".into(), slurm_dir.join("slurm.conf").display().to_string()));
    Target { label: "slurm", env, root }
}

/// Two free consecutive ports (slurmctld's and slurmd's).
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < 65000 && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free consecutive ports");
}

fn base_env() -> Vec<(String, String)> {
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    vec![
        ("HOME".into(), std::env::var("HOME").unwrap_or_else(|_| "/root".into())),
        ("USER".into(), user.clone()),
        ("LOGNAME".into(), user),
        ("SHELL".into(), "/bin/bash".into()),
        ("LANG".into(), "C".into()),
        ("TZ".into(), "UTC".into()),
    ]
}

#[test]
fn drover_agrees_with_slurm_on_every_scenario_but_the_listed_ones() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIPPED: the differential suite runs Slurm's daemons and jobs as users, so it needs root");
    }
    assert!(
        Path::new("/usr/sbin/slurmctld").exists() && Path::new("/usr/sbin/slurmd").exists(),
        "the differential suite needs Slurm 22.05: apt-get install -y slurm-wlm (.ci/run does)"
    );
    let only = std::env::var("DROVER_DIFF_ONLY").ok();
    let scenarios: Vec<Scenario> = load_scenarios()
        .into_iter()
        .filter(|s| only.as_ref().is_none_or(|o| o.split(',').any(|o| s.name.contains(o))))
        .collect();
    let dir = tempfile::Builder::new().prefix("differential").tempdir().unwrap();
    let keep = std::env::var("DROVER_DIFF_KEEP").is_ok();

    let slurm = start_slurm(dir.path());
    let slurm_dir = dir.path().join("slurm");
    let _stop_slurm = Defer(move || {
        let _ = Command::new("bash").arg(here().join("slurm.sh")).arg("stop").arg(&slurm_dir).status();
    });
    let options = UpOptions { controllers: 1, agents: 1, extra_toml: DROVER_CONFIG.into(), ..UpOptions::default() };
    let (_cluster, shell) = common::setup(&dir.path().join("drover"), options);
    let mut env = base_env();
    env.push((
        "PATH".into(),
        format!(
            "{}:{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            shell.bin.display(),
            common::drover_dir().display()
        ),
    ));
    env.push(("DROVER_CONTROLLERS".into(), shell.controllers.clone()));
    env.push(("DROVER_CONFIG".into(), shell.config.display().to_string()));
    let drover_root = dir.path().join("runs-drover");
    std::fs::create_dir_all(&drover_root).unwrap();
    let drover = Target { label: "drover", env, root: drover_root };

    let intended = load_list("intended.toml");
    let divergent = load_list("divergent.toml");
    let mut results: Vec<(Scenario, Verdict, String)> = Vec::new();
    let started = Instant::now();
    for scenario in &scenarios {
        let mut attempt = 0;
        let (verdict, diff) = loop {
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| slurm.run(scenario, attempt));
                let b = s.spawn(|| drover.run(scenario, attempt));
                (a.join().unwrap(), b.join().unwrap())
            });
            let listed = intended.contains_key(&scenario.name) || divergent.contains_key(&scenario.name);
            let verdict = match (a == b, listed) {
                (true, false) => Verdict::Equal,
                (true, true) => Verdict::StaleListing,
                (false, _) => match intended.get(&scenario.name) {
                    Some(l) if l.stderr_only && without_stderr(&a) != without_stderr(&b) => Verdict::NewDivergent,
                    Some(_) => Verdict::Intended,
                    None if listed => Verdict::KnownDivergent,
                    None => Verdict::NewDivergent,
                },
            };
            // One more try for a verdict the lists did not expect: a scenario that races its own jobs must not
            // decide the suite by chance (and a flaky one shows as a diff that changes between runs).
            if attempt == 0 && matches!(verdict, Verdict::NewDivergent | Verdict::StaleListing) && only.is_none() {
                attempt += 1;
                continue;
            }
            break (verdict, unified(&a, &b));
        };
        eprintln!("{:?} {} ({:.0} s)", verdict, scenario.name, started.elapsed().as_secs_f64());
        if verdict == Verdict::NewDivergent {
            // Here as well as in the final panic: a CI log that keeps only part of the output keeps this part.
            eprintln!("{diff}");
        }
        results.push((scenario.clone(), verdict, diff));
    }
    if keep {
        eprintln!("runs kept under {}", dir.keep().display());
    }

    let mut report = String::new();
    for (s, verdict, diff) in &results {
        if *verdict != Verdict::Equal {
            report.push_str(&format!("=== {} ({}.sh): {:?}\n{diff}\n", s.name, s.area, verdict));
        }
    }
    let report_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("differential-report.txt");
    std::fs::write(&report_path, &report).unwrap();
    if only.is_some() {
        eprintln!("{report}");
        return;
    }
    let mut problems = Vec::new();
    for name in intended.keys().chain(divergent.keys()) {
        if !scenarios.iter().any(|s| &s.name == name) {
            problems.push(format!("{name} is listed but no scenario has that name"));
        }
    }
    for (s, verdict, diff) in &results {
        match verdict {
            Verdict::NewDivergent => problems.push(format!("{} differs from Slurm:\n{diff}", s.name)),
            Verdict::StaleListing => problems.push(format!("{} agrees with Slurm now: take it off the list", s.name)),
            _ => {}
        }
    }
    let page = results_page(&results, &intended, &divergent);
    let page_path = here().join("RESULTS.md");
    if std::env::var("DROVER_DIFF_BLESS").is_ok() {
        std::fs::write(&page_path, &page).unwrap();
    } else if std::fs::read_to_string(&page_path).unwrap_or_default() != page {
        problems.push("RESULTS.md does not match this run: rerun with DROVER_DIFF_BLESS=1".to_string());
    }
    assert!(problems.is_empty(), "{}\n(full report: {})", problems.join("\n"), report_path.display());
}

/// The compatibility page: per area, how many scenarios agree, differ on purpose (and why) and differ still.
fn results_page(
    results: &[(Scenario, Verdict, String)],
    intended: &BTreeMap<String, Listing>,
    divergent: &BTreeMap<String, Listing>,
) -> String {
    let count = |v: Verdict| results.iter().filter(|r| r.1 == v).count();
    let mut page = String::from(
        "# Drover beside Slurm 22.05: the differential suite's result\n\n\
         Generated by `cargo nextest run -p drover-cli --test differential` (`DROVER_DIFF_BLESS=1` rewrites it; the \
         test fails when it is stale). Each scenario is a shell script in `scenarios/`, run against a real Slurm \
         22.05 and a local Drover cluster; outputs are compared after job ids, times and directories are \
         normalized.\n\n",
    );
    page.push_str(&format!(
        "**{} scenarios: {} equal, {} intended differences, {} divergences still to fix.**\n\n",
        results.len(),
        count(Verdict::Equal),
        count(Verdict::Intended),
        count(Verdict::KnownDivergent) + count(Verdict::NewDivergent)
    ));
    page.push_str("| Area | Scenarios | Equal | Intended | Divergent |\n|---|---|---|---|---|\n");
    let mut areas: Vec<&str> = results.iter().map(|r| r.0.area.as_str()).collect();
    areas.dedup();
    for area in areas {
        let of = |v: Verdict| results.iter().filter(|r| r.0.area == area && r.1 == v).count();
        let all = results.iter().filter(|r| r.0.area == area).count();
        let div = of(Verdict::KnownDivergent) + of(Verdict::NewDivergent);
        page.push_str(&format!("| {area} | {all} | {} | {} | {div} |\n", of(Verdict::Equal), of(Verdict::Intended)));
    }
    let section = |page: &mut String, title: &str, verdict: Verdict, list: &BTreeMap<String, Listing>| {
        let rows: Vec<_> = results.iter().filter(|r| r.1 == verdict).collect();
        if !rows.is_empty() {
            page.push_str(&format!("\n## {title}\n\n"));
            for (s, _, _) in rows {
                page.push_str(&format!(
                    "- `{}` ({}): {}\n",
                    s.name,
                    s.area,
                    list.get(&s.name).map_or("", |l| l.why.as_str())
                ));
            }
        }
    };
    section(&mut page, "Intended differences", Verdict::Intended, intended);
    section(&mut page, "Divergences still to fix", Verdict::KnownDivergent, divergent);
    page
}

/// A line diff of the two outputs (`-` Slurm, `+` Drover), enough to read what differs.
fn unified(slurm: &str, drover: &str) -> String {
    let a: Vec<&str> = slurm.lines().collect();
    let b: Vec<&str> = drover.lines().collect();
    // Longest common subsequence over lines: outputs are short (a few hundred lines at most).
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!("  {}\n", a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+ {}\n", b[j]));
            j += 1;
        } else {
            out.push_str(&format!("- {}\n", a[i]));
            i += 1;
        }
    }
    out
}

struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

#[test]
fn ids_times_and_directories_are_normalized_and_nothing_else() {
    let dir = Path::new("/tmp/x/run");
    let raw = "Submitted batch job 1204\nJobId=1204 ArrayJobId=1203 NumCPUs=2 node01\n1204_3 1204.batch 2.1204 \
               2026-12-06T18:30:00 /tmp/x/run/out 999 1604\n";
    assert_eq!(
        normalize(raw, 1200, dir),
        "Submitted batch job J1\nJobId=J1 ArrayJobId=J2 NumCPUs=2 node01\nJ1_3 J1.batch 2.1204 <time> <dir>/out 999 1604\n"
    );
    assert_eq!(unified("a\nb\nc\n", "a\nx\nc\n"), "  a\n+ x\n- b\n  c\n");
}

//! `sreport`: reports over the accounting history. Drover has one report of its own, `sreport cluster goodput`:
//! per account and for the whole cluster, GPU time allocated in a window, GPU time lost to failures and to
//! preemption (since each such incarnation's last checkpoint), their counts, the down time after failures and
//! the effective training time ratio (`Goodput`), as `drover_state::goodput` defines them.
//!
//! Follows Slurm 22.05's sreport: `ENTITY REPORT [Start=TIME] [End=TIME] [Accounts=..] [Users=..] [Format=..]`
//! (case-insensitive keywords, Slurm's time forms), the banner naming the window and the unit, `-t` for the unit
//! (Minutes by default, Hours, Seconds; whole numbers, rounded down), `-n`, `-p`, `-P`. The default window is
//! Slurm's: yesterday from midnight to midnight. Figures are computed from each job's incarnations clipped to
//! the window (not rolled up per hour, so times are not rounded to the hour). Rows: one per account with usage
//! in the window, then the cluster's total as account `TOTAL`.

use crate::command::Common;
use clap::Parser;
use drover_state::goodput::{self, GoodputTotals, Window};

use crate::slurm::fields::{FieldDef, Kind, Layout, def, header, parse_fields_in, row};
use crate::slurm::time::{local_midnight, parse_time};
use Kind::{Number, Text};

/// The goodput report's columns.
const FIELDS: &[FieldDef] = &[
    def("Cluster", 9, Text),
    def("Account", 15, Text),
    def("Allocated", 10, Number),
    def("LostFailures", 12, Number),
    def("LostPreempt", 11, Number),
    def("Failures", 8, Number),
    def("Preempts", 8, Number),
    def("DownTime", 10, Number),
    def("Goodput", 7, Number),
];
const DEFAULT_FIELDS: &str = "Cluster,Account,Allocated,LostFailures,LostPreempt,Failures,Preempts,DownTime,Goodput";
/// Jobs read at most (the server caps too).
const MAX_JOBS: u32 = 100_000;
/// The account name of the cluster-wide row.
pub const TOTAL_ROW: &str = "TOTAL";

#[derive(Parser, Debug)]
#[command(name = "sreport", about = "Reports from Drover's accounting history", disable_version_flag = true)]
struct Args {
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// Fields separated by `|`, each followed by one.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    /// Fields separated by `|`, none after the last.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// The unit of GPU time: Minutes (default), Hours or Seconds.
    #[arg(short = 't', long = "time-format", alias = "time_format")]
    time_format: Option<String>,
    /// The TRES reported: only `gres/gpu` (Drover's goodput is GPU time).
    #[arg(short = 'T', long = "tres")]
    tres: Option<String>,
    /// Accepted for compatibility (one cluster).
    #[arg(short = 'M', long = "cluster", alias = "clusters")]
    clusters: Option<String>,
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[command(flatten)]
    common: Common,
    /// `cluster goodput [Start=TIME] [End=TIME] [Accounts=A,B] [Users=U,V] [Format=F,G]`.
    words: Vec<String>,
}

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("sreport", sreport(args).map(|()| 0))
}

/// The unit GPU time is printed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Seconds,
    Minutes,
    Hours,
}

impl Unit {
    /// `-t` as Slurm matches it: any prefix, case-insensitive.
    fn parse(text: &str) -> anyhow::Result<Unit> {
        let lower = text.to_ascii_lowercase();
        let is = |word: &str| !lower.is_empty() && word.starts_with(&lower);
        match () {
            () if is("seconds") => Ok(Unit::Seconds),
            () if is("minutes") => Ok(Unit::Minutes),
            () if is("hours") => Ok(Unit::Hours),
            () => anyhow::bail!("unknown time format {text:?}: the goodput report takes Seconds, Minutes or Hours"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Unit::Seconds => "Seconds",
            Unit::Minutes => "Minutes",
            Unit::Hours => "Hours",
        }
    }

    /// GPU-ms in this unit, rounded down.
    fn of(self, gpu_ms: u64) -> u64 {
        gpu_ms
            / match self {
                Unit::Seconds => 1_000,
                Unit::Minutes => 60_000,
                Unit::Hours => 3_600_000,
            }
    }
}

/// What the words after the options ask for.
#[derive(Debug, PartialEq, Eq)]
struct Report {
    window: Window,
    accounts: Vec<String>,
    users: Vec<String>,
    format: String,
}

/// `cluster goodput key=value ...`, as of `now_s`.
fn parse_report(words: &[String], now_s: u64) -> anyhow::Result<Report> {
    let word = |i: usize| words.get(i).map(|w| w.to_ascii_lowercase()).unwrap_or_default();
    let (entity, report) = (word(0), word(1));
    if entity.len() < 2 || !"cluster".starts_with(&entity) {
        anyhow::bail!(
            "Not valid report {:?}: Drover's sreport knows `cluster goodput` (see `sreport cluster goodput --help`)",
            words.first().map(String::as_str).unwrap_or("")
        );
    }
    if report.is_empty() || !"goodput".starts_with(&report) {
        anyhow::bail!("Not valid report {:?} for cluster: Drover's sreport knows `cluster goodput`", word(1));
    }
    // Slurm's default: yesterday, midnight to midnight (local time).
    let today_ms = local_midnight(now_s).max(0) as u64 * 1_000;
    let yesterday_ms = local_midnight(now_s.saturating_sub(86_400)).max(0) as u64 * 1_000;
    let mut window = Window { start_ms: yesterday_ms, end_ms: today_ms };
    let mut report = Report { window, accounts: Vec::new(), users: Vec::new(), format: DEFAULT_FIELDS.into() };
    let list = |v: &str| v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>();
    for w in &words[2..] {
        let Some((key, value)) = w.split_once('=') else { anyhow::bail!("Unknown condition: {w}") };
        let key = key.to_ascii_lowercase();
        let time = || parse_time(value, now_s, true).map(|s| s as u64 * 1_000).map_err(|e| anyhow::anyhow!(e));
        match key.as_str() {
            "start" | "starttime" => window.start_ms = time()?,
            "end" | "endtime" => window.end_ms = time()?,
            "accounts" | "account" | "acct" | "accts" => report.accounts = list(value),
            "users" | "user" => report.users = list(value),
            "format" => report.format = value.to_string(),
            "clusters" | "cluster" => {}
            _ => anyhow::bail!("Unknown condition: {w}"),
        }
    }
    if window.start_ms >= window.end_ms {
        anyhow::bail!(
            "Start time ({}) requested is after end time ({}).",
            crate::format::format_timestamp(Some(window.start_ms)),
            crate::format::format_timestamp(Some(window.end_ms))
        );
    }
    report.window = window;
    Ok(report)
}

fn sreport(args: &[String]) -> anyhow::Result<()> {
    let args: Args = crate::command::parse_args("sreport", args)?;
    let _ = (&args.clusters, args.verbose);
    if args.version {
        println!("{}", crate::format::version_line());
        return Ok(());
    }
    if let Some(tres) = &args.tres
        && !tres.eq_ignore_ascii_case("gres/gpu")
    {
        anyhow::bail!("the goodput report counts GPU time only: -T gres/gpu (not {tres:?})");
    }
    let unit = args.time_format.as_deref().map(Unit::parse).transpose()?.unwrap_or(Unit::Minutes);
    let now_ms = super::now_ms();
    let report = parse_report(&args.words, now_ms / 1_000)?;
    let fields = parse_fields_in(&report.format, FIELDS)?;
    let layout = if args.parsable || args.parsable2 {
        Layout::Parsable { delimiter: "|".into(), trailing: !args.parsable2 }
    } else {
        Layout::Columns
    };
    let filter = drover_client::JobFilter {
        users: report.users.clone(),
        include_finished: true,
        limit: MAX_JOBS,
        ..Default::default()
    };
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let (jobs, truncated) = rt.block_on(client.list_jobs(&filter))?;
    let cluster = rt.block_on(client.nodes_and_config(false))?.1.map(|c| c.cluster_name).unwrap_or_default();
    let rows = by_account(&jobs, &report, now_ms);
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&banner(report.window, unit));
        out.push_str(&header(&fields, &layout));
    }
    for (account, totals) in &rows {
        let values: Vec<String> = fields.iter().map(|f| value(f.name(), &cluster, account, totals, unit)).collect();
        out.push_str(&row(&fields, &values, &layout));
    }
    print!("{out}");
    if truncated {
        eprintln!("sreport: warning: only the newest {MAX_JOBS} jobs were read; the figures are incomplete");
    }
    Ok(())
}

/// Per account with anything in the window (sorted by name), then the whole cluster's as [`TOTAL_ROW`].
fn by_account(jobs: &[drover_state::Job], report: &Report, now_ms: u64) -> Vec<(String, GoodputTotals)> {
    let mut accounts: std::collections::BTreeMap<String, GoodputTotals> = Default::default();
    let mut total = GoodputTotals::default();
    for job in jobs {
        let account = job.account_name();
        if !report.accounts.is_empty() && !report.accounts.iter().any(|a| a.eq_ignore_ascii_case(account)) {
            continue;
        }
        let figures = goodput::of_job_in(job, report.window, now_ms);
        if figures.is_zero() {
            continue;
        }
        accounts.entry(account.to_string()).or_default().add(&figures);
        total.add(&figures);
    }
    accounts.into_iter().chain(std::iter::once((TOTAL_ROW.to_string(), total))).collect()
}

/// Slurm's banner: the window (its last second inclusive) and the unit.
fn banner(window: Window, unit: Unit) -> String {
    let line = "-".repeat(80);
    let (start, end) = (
        crate::format::format_timestamp(Some(window.start_ms)),
        crate::format::format_timestamp(Some(window.end_ms.saturating_sub(1_000))),
    );
    format!("{line}\nCluster Goodput {start} - {end}\nUsage reported in GPU {}\n{line}\n", unit.name())
}

fn value(field: &str, cluster: &str, account: &str, t: &GoodputTotals, unit: Unit) -> String {
    match field {
        "Cluster" => cluster.to_string(),
        "Account" => account.to_string(),
        "Allocated" => unit.of(t.allocated_gpu_ms).to_string(),
        "LostFailures" => unit.of(t.lost_to_failures_gpu_ms).to_string(),
        "LostPreempt" => unit.of(t.lost_to_preemption_gpu_ms).to_string(),
        "Failures" => t.failed_incarnations.to_string(),
        "Preempts" => t.preempted_incarnations.to_string(),
        "DownTime" => crate::format::clock(t.down_after_failures_ms / 1_000),
        "Goodput" => t.effective_ratio().map(crate::slurm::fields::ratio).unwrap_or_default(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_state::{IncarnationRecord, Job, JobState, NodeAllocation};

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    /// A finished job of `account` on 4 GPUs, its first incarnation lost to a node failure 60 s after its
    /// checkpoint, the second completed.
    fn job(id: u64, account: &str, base_s: u64) -> Job {
        let failed = IncarnationRecord {
            incarnation: 0,
            start_ms: Some(base_s * 1_000),
            end_ms: (base_s + 600) * 1_000,
            nodes: "n1".into(),
            state: JobState::NodeFail,
            reason: String::new(),
            resumed_from: None,
            gpus: 4,
            last_checkpoint_ms: Some((base_s + 540) * 1_000),
        };
        Job {
            id,
            account: account.into(),
            state: JobState::Completed,
            incarnation: 1,
            start_time_ms: Some((base_s + 660) * 1_000),
            end_time_ms: Some((base_s + 1_260) * 1_000),
            allocation: vec![NodeAllocation { node: "n2".into(), gpus: vec![0, 1, 2, 3], ..Default::default() }].into(),
            history: vec![failed].into(),
            ..Job::default()
        }
    }

    #[test]
    fn the_report_and_its_conditions_parse_as_slurm_words() {
        let now_s = 1_800_000_000;
        let r =
            parse_report(&words("Cluster Goodput Start=uts1700000000 End=uts1700003600 Accounts=a,b"), now_s).unwrap();
        assert_eq!(r.window, Window { start_ms: 1_700_000_000_000, end_ms: 1_700_003_600_000 });
        assert_eq!(r.accounts, ["a", "b"]);
        let default = parse_report(&words("clus good"), now_s).unwrap();
        let day_ms = default.window.end_ms - default.window.start_ms;
        assert!((82_800_000..=90_000_000).contains(&day_ms), "yesterday, a whole day (23-25 h with DST): {day_ms}");
        assert!(default.window.end_ms <= now_s * 1_000);
        assert!(parse_report(&words("cluster utilization"), now_s).unwrap_err().to_string().contains("goodput"));
        assert!(parse_report(&words("cluster goodput bogus=1"), now_s).is_err());
        let err = parse_report(&words("cluster goodput start=uts1700003600 end=uts1700000000"), now_s).unwrap_err();
        assert!(err.to_string().starts_with("Start time ("), "{err}");
        assert_eq!(Unit::parse("h").unwrap(), Unit::Hours);
        assert_eq!(Unit::parse("Sec").unwrap(), Unit::Seconds);
        assert!(Unit::parse("percent").is_err());
    }

    #[test]
    fn rows_are_per_account_with_the_cluster_total_last() {
        let jobs = [job(1, "physics", 0), job(2, "bio", 0), job(3, "physics", 100_000)];
        let report = Report {
            window: Window { start_ms: 0, end_ms: 10_000_000 },
            accounts: Vec::new(),
            users: Vec::new(),
            format: DEFAULT_FIELDS.into(),
        };
        let rows = by_account(&jobs, &report, 20_000_000);
        let names: Vec<&str> = rows.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(names, ["bio", "physics", "TOTAL"], "job 3 ran after the window");
        let fields = parse_fields_in(DEFAULT_FIELDS, FIELDS).unwrap();
        let p2 = Layout::Parsable { delimiter: "|".into(), trailing: false };
        let lines: Vec<String> = rows
            .iter()
            .map(|(a, t)| {
                let values: Vec<String> = fields.iter().map(|f| value(f.name(), "c1", a, t, Unit::Seconds)).collect();
                row(&fields, &values, &p2)
            })
            .collect();
        // 4 GPUs × (600 + 600) s held, 4 × 60 s lost, down 60 s: 1 − 240/4800 kept.
        assert_eq!(lines[0], "c1|bio|4800|240|0|1|0|00:01:00|0.9500\n");
        assert_eq!(lines[2], "c1|TOTAL|9600|480|0|2|0|00:02:00|0.9500\n");
        assert_eq!(
            header(&fields, &p2),
            "Cluster|Account|Allocated|LostFailures|LostPreempt|Failures|Preempts|DownTime|Goodput\n"
        );
        let only = Report { accounts: vec!["PHYSICS".into()], ..report };
        assert_eq!(by_account(&jobs, &only, 20_000_000).len(), 2, "physics and the total of what was asked");
        let banner = banner(Window { start_ms: 0, end_ms: 3_600_000 }, Unit::Minutes);
        assert!(banner.contains("Usage reported in GPU Minutes"), "{banner}");
    }
}

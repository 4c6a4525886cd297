//! What a drill shows, computed from its history alone (so a saved `history.jsonl` can be reported again):
//! a summary table (faults, operations, acknowledgements, losses, availability, failover times) and a timeline
//! picture (SVG: each replica's role, the faults, submission throughput and running jobs over time).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::checker::Violation;
use crate::history::{Event, EventKind, History};

/// The numbers of one drill.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub faults: usize,
    /// Fault names by their first word (`kill`, `isolate`, ...), with counts.
    pub fault_kinds: BTreeMap<String, usize>,
    pub submitted: usize,
    pub acknowledged: usize,
    pub failed: usize,
    pub lost: usize,
    pub violations: usize,
    pub jobs_finished: usize,
    /// Incarnations after the first (requeues that ran), checkpoints acknowledged, resumes from a checkpoint.
    pub restarts: usize,
    pub checkpoints: usize,
    pub resumes_from_checkpoint: usize,
    /// Share of the workload window during which submissions were being acknowledged (see [`Summary::of`] for
    /// what counts as a gap).
    pub availability: f64,
    pub longest_gap_ms: u64,
    /// For each fault that hit the leader: ms from the fault to the first acknowledgement of a submission sent
    /// after it.
    pub failovers_ms: Vec<u64>,
    pub duration_ms: u64,
}

/// Ack gaps longer than this are downtime, whatever the offered rate.
pub const MIN_GAP_THRESHOLD_MS: u64 = 500;

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl Summary {
    /// The numbers of `history`. Downtime is any gap between acknowledgements longer than three times their
    /// median spacing (at least [`MIN_GAP_THRESHOLD_MS`]): a workload's own rhythm is not an outage.
    pub fn of(history: &History, violations: &[Violation]) -> Summary {
        let events = &history.events;
        let mut sent: HashMap<u64, u64> = HashMap::new();
        let mut acks: Vec<(u64, u64)> = Vec::new(); // (acked at, sent at)
        let mut failed = 0;
        let mut faults = Vec::new();
        let mut fault_kinds = BTreeMap::new();
        let (mut restarts, mut checkpoints, mut resumes) = (0, 0, 0);
        let mut finished = 0;
        for e in events {
            match &e.kind {
                EventKind::SubmitSent { op } => {
                    sent.insert(*op, e.at_ms);
                }
                EventKind::SubmitAcked { op, .. } => acks.push((e.at_ms, sent.get(op).copied().unwrap_or(e.at_ms))),
                EventKind::SubmitFailed { .. } => failed += 1,
                EventKind::FaultStarted { name } => {
                    faults.push((e.at_ms, name.clone()));
                    *fault_kinds.entry(name.split_whitespace().next().unwrap_or("?").to_string()).or_insert(0) += 1;
                }
                EventKind::IncarnationStarted { incarnation, .. } if *incarnation > 0 => restarts += 1,
                EventKind::CheckpointAcked { .. } => checkpoints += 1,
                EventKind::Resumed { from_step: Some(_), .. } => resumes += 1,
                EventKind::FinalJobs { jobs } => {
                    finished = jobs.iter().filter(|(_, s)| crate::checker::is_terminal(s)).count();
                }
                _ => {}
            }
        }
        acks.sort_unstable();
        let mut spacing: Vec<u64> = acks.windows(2).map(|w| w[1].0 - w[0].0).collect();
        spacing.sort_unstable();
        let gap_threshold_ms = MIN_GAP_THRESHOLD_MS.max(3 * spacing.get(spacing.len() / 2).copied().unwrap_or(0));
        let window = (sent.values().min().copied(), sent.values().max().copied());
        let (mut down_ms, mut longest) = (0u64, 0u64);
        if let (Some(first), Some(last)) = window {
            let mut previous = first;
            for &(acked, _) in acks.iter().filter(|(a, _)| *a <= last) {
                let gap = acked.saturating_sub(previous);
                if gap > gap_threshold_ms {
                    down_ms += gap;
                }
                longest = longest.max(gap);
                previous = previous.max(acked);
            }
            let tail = last.saturating_sub(previous);
            if tail > gap_threshold_ms {
                down_ms += tail;
            }
            longest = longest.max(tail);
        }
        let span = window.1.unwrap_or(0).saturating_sub(window.0.unwrap_or(0)).max(1);
        let failovers_ms = faults
            .iter()
            .filter(|(_, name)| name.contains(" leader "))
            .filter_map(|(at, _)| acks.iter().filter(|(_, s)| s >= at).map(|(a, _)| a - at).min())
            .collect();
        Summary {
            faults: faults.len(),
            fault_kinds,
            submitted: sent.len(),
            acknowledged: acks.len(),
            failed,
            lost: violations.iter().filter(|v| matches!(v, Violation::Lost { .. })).count(),
            violations: violations.len(),
            jobs_finished: finished,
            restarts,
            checkpoints,
            resumes_from_checkpoint: resumes,
            availability: 1.0 - down_ms as f64 / span as f64,
            longest_gap_ms: longest,
            failovers_ms,
            duration_ms: events.last().map_or(0, |e| e.at_ms),
        }
    }

    /// The table the runner prints.
    pub fn table(&self, name: &str, violations: &[Violation]) -> String {
        let mut s = String::new();
        let kinds: Vec<String> = self.fault_kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        let mut failovers = self.failovers_ms.clone();
        failovers.sort_unstable();
        let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v} ms"));
        let rows = [
            ("drill", name.to_string()),
            ("duration", format!("{:.1} s", self.duration_ms as f64 / 1e3)),
            ("faults injected", format!("{} ({})", self.faults, kinds.join(", "))),
            (
                "submissions",
                format!(
                    "{} sent, {} acknowledged, {} failed or unknown",
                    self.submitted, self.acknowledged, self.failed
                ),
            ),
            ("lost acknowledged", self.lost.to_string()),
            ("jobs finished", self.jobs_finished.to_string()),
            (
                "restarts",
                format!(
                    "{} incarnations after the first, {} from a checkpoint",
                    self.restarts, self.resumes_from_checkpoint
                ),
            ),
            ("checkpoints acked", self.checkpoints.to_string()),
            ("availability", format!("{:.2} % (longest gap {} ms)", self.availability * 100.0, self.longest_gap_ms)),
            (
                "failover",
                format!(
                    "p50 {} p99 {} max {} (n={})",
                    ms(percentile(&failovers, 50.0)),
                    ms(percentile(&failovers, 99.0)),
                    ms(failovers.last().copied()),
                    failovers.len()
                ),
            ),
            (
                "invariants",
                if violations.is_empty() { "all kept".to_string() } else { format!("{} VIOLATED", violations.len()) },
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(s, "{k:<20} {v}");
        }
        for v in violations.iter().take(50) {
            let _ = writeln!(s, "  - {v}");
        }
        if violations.len() > 50 {
            let _ = writeln!(s, "  ... and {} more (see history.jsonl)", violations.len() - 50);
        }
        s
    }
}

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 110.0;
const RIGHT: f64 = 20.0;
const ROW: f64 = 22.0;
const CHART: f64 = 90.0;

fn role_colour(role: &str) -> &'static str {
    match role {
        "leader" => "#2e7d32",
        "follower" => "#90caf9",
        "candidate" => "#ffb300",
        "learner" => "#ce93d8",
        "unreachable" => "#e57373",
        _ => "#bdbdbd",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// What the timeline draws, gathered from the history: each replica's roles over time, the faults (start, heal,
/// name), acknowledgements per second, and +1/-1 steps of running incarnations in time order.
struct Timeline {
    roles: BTreeMap<u64, Vec<(u64, String)>>,
    faults: Vec<(u64, Option<u64>, String)>,
    acks_per_s: BTreeMap<u64, u64>,
    running: Vec<(u64, i64)>,
}

impl Timeline {
    fn of(events: &[Event]) -> Timeline {
        let mut roles: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
        let mut faults: Vec<(u64, Option<u64>, String)> = Vec::new();
        let mut acks_per_s: BTreeMap<u64, u64> = BTreeMap::new();
        let mut running: Vec<(u64, i64)> = Vec::new();
        for e in events {
            match &e.kind {
                EventKind::RoleObserved { replica, role, .. } => {
                    roles.entry(*replica).or_default().push((e.at_ms, role.clone()))
                }
                EventKind::FaultStarted { name } => faults.push((e.at_ms, None, name.clone())),
                EventKind::FaultHealed { name } => {
                    if let Some(f) = faults.iter_mut().find(|f| f.1.is_none() && &f.2 == name) {
                        f.1 = Some(e.at_ms);
                    }
                }
                EventKind::SubmitAcked { .. } => *acks_per_s.entry(e.at_ms / 1000).or_default() += 1,
                EventKind::IncarnationStarted { .. } => running.push((e.at_ms, 1)),
                EventKind::IncarnationEnded { .. } => running.push((e.at_ms, -1)),
                _ => {}
            }
        }
        running.sort_unstable();
        Timeline { roles, faults, acks_per_s, running }
    }
}

/// The running-incarnations chart: a step line from the +1/-1 steps.
fn running_chart(s: &mut String, running: &[(u64, i64)], x: &dyn Fn(u64) -> f64, chart2_y: f64, end_ms: u64) {
    let mut level = 0i64;
    let mut steps = vec![format!("{:.1},{:.1}", x(0), chart2_y + CHART)];
    let max_running = running
        .iter()
        .scan(0i64, |l, (_, d)| {
            *l += d;
            Some(*l)
        })
        .max()
        .unwrap_or(1)
        .max(1);
    let yv = |v: i64| chart2_y + CHART - v.max(0) as f64 / max_running as f64 * CHART;
    for (at, d) in running {
        steps.push(format!("{:.1},{:.1}", x(*at), yv(level)));
        level += d;
        steps.push(format!("{:.1},{:.1}", x(*at), yv(level)));
    }
    steps.push(format!("{:.1},{:.1}", x(end_ms), yv(level)));
    chart_frame(s, chart2_y, &format!("running jobs (max {max_running})"));
    let _ =
        writeln!(s, r##"<polyline fill="none" stroke="#6a1b9a" stroke-width="1.5" points="{}"/>"##, steps.join(" "));
}

/// The timeline as an SVG document.
pub fn timeline_svg(history: &History, title: &str) -> String {
    let events = &history.events;
    let end_ms = events.last().map_or(1, |e| e.at_ms).max(1);
    let x = |ms: u64| LEFT + (ms as f64 / end_ms as f64) * (WIDTH - LEFT - RIGHT);
    let Timeline { roles, faults, acks_per_s, running } = Timeline::of(events);
    let replicas_y = 60.0;
    let chart1_y = replicas_y + roles.len() as f64 * ROW + 40.0;
    let chart2_y = chart1_y + CHART + 40.0;
    let height = chart2_y + CHART + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>"#, escape(title));
    // Legend.
    for (i, role) in ["leader", "follower", "candidate", "learner", "unreachable"].iter().enumerate() {
        let lx = LEFT + i as f64 * 110.0;
        let _ = writeln!(s, r#"<rect x="{lx}" y="30" width="12" height="12" fill="{}"/>"#, role_colour(role));
        let _ = writeln!(s, r#"<text x="{}" y="40">{role}</text>"#, lx + 16.0);
    }
    let _ = writeln!(
        s,
        r##"<rect x="{}" y="30" width="12" height="12" fill="#ef5350" fill-opacity="0.25"/>"##,
        LEFT + 550.0
    );
    let _ = writeln!(s, r#"<text x="{}" y="40">fault</text>"#, LEFT + 566.0);
    // Faults: shaded across everything below the legend.
    for (i, (start, healed, name)) in faults.iter().enumerate() {
        let (x0, x1) = (x(*start), x(healed.unwrap_or(end_ms)).max(x(*start) + 1.5));
        let _ = writeln!(
            s,
            r##"<rect x="{x0:.1}" y="{replicas_y}" width="{:.1}" height="{:.1}" fill="#ef5350" fill-opacity="0.25"><title>{}</title></rect>"##,
            x1 - x0,
            height - replicas_y - 30.0,
            escape(name)
        );
        if faults.len() <= 12 {
            let _ = writeln!(
                s,
                r##"<text x="{x0:.1}" y="{:.1}" font-size="9" fill="#b71c1c">{}</text>"##,
                replicas_y - 4.0 - (i % 2) as f64 * 9.0,
                escape(&name.chars().take(28).collect::<String>())
            );
        }
    }
    // Replica rows.
    for (row, (replica, seen)) in roles.iter().enumerate() {
        let y = replicas_y + row as f64 * ROW;
        let _ = writeln!(s, r#"<text x="8" y="{:.1}">replica {replica}</text>"#, y + 15.0);
        for (i, (at, role)) in seen.iter().enumerate() {
            let until = seen.get(i + 1).map_or(end_ms, |n| n.0);
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{role}</title></rect>"#,
                x(*at),
                (x(until) - x(*at)).max(0.5),
                ROW - 4.0,
                role_colour(role)
            );
        }
    }
    // Throughput.
    let max_acks = acks_per_s.values().copied().max().unwrap_or(1).max(1);
    chart_frame(&mut s, chart1_y, &format!("acks/s (max {max_acks})"));
    let points: Vec<String> = (0..=end_ms / 1000)
        .map(|sec| {
            let v = acks_per_s.get(&sec).copied().unwrap_or(0);
            format!("{:.1},{:.1}", x(sec * 1000 + 500), chart1_y + CHART - v as f64 / max_acks as f64 * CHART)
        })
        .collect();
    let _ =
        writeln!(s, r##"<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{}"/>"##, points.join(" "));
    // Running incarnations.
    running_chart(&mut s, &running, &x, chart2_y, end_ms);
    // Time axis.
    let tick_s = [1, 2, 5, 10, 20, 30, 60, 120, 300].into_iter().find(|t| end_ms / 1000 / t <= 12).unwrap_or(600);
    let axis_y = chart2_y + CHART + 18.0;
    for t in (0..=end_ms / 1000).step_by(tick_s as usize) {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{axis_y}" text-anchor="middle">{t} s</text>"#, x(t * 1000));
    }
    s.push_str("</svg>\n");
    s
}

fn chart_frame(s: &mut String, y: f64, label: &str) {
    let _ = writeln!(s, r#"<text x="8" y="{:.1}">{}</text>"#, y + CHART / 2.0, escape(label));
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{y}" width="{}" height="{CHART}" fill="none" stroke="#9e9e9e"/>"##,
        WIDTH - LEFT - RIGHT
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Event;

    fn at(at_ms: u64, kind: EventKind) -> Event {
        Event { at_ms, kind }
    }

    /// Ten submissions a second; the leader is killed at 2 s, nothing is acknowledged until 2.8 s.
    fn drill() -> History {
        let mut events = Vec::new();
        for op in 0..50u64 {
            let sent = op * 100;
            events.push(at(sent, EventKind::SubmitSent { op }));
            if !(19..28).contains(&op) {
                events.push(at(sent + 5, EventKind::SubmitAcked { op, job: op + 1 }));
            } else if op < 27 {
                events.push(at(2_805 + op, EventKind::SubmitFailed { op, error: "no leader".into() }));
            } else {
                events.push(at(2_805, EventKind::SubmitAcked { op, job: op + 1 }));
            }
        }
        events.push(at(2_000, EventKind::FaultStarted { name: "kill leader replica 1".into() }));
        events.push(at(2_500, EventKind::FaultHealed { name: "kill leader replica 1".into() }));
        events.push(at(0, EventKind::RoleObserved { replica: 1, role: "leader".into(), term: 1 }));
        events.push(at(2_100, EventKind::RoleObserved { replica: 1, role: "unreachable".into(), term: 1 }));
        events.push(at(6_000, EventKind::FinalJobs { jobs: vec![] }));
        events.sort_by_key(|e| e.at_ms);
        History { events }
    }

    #[test]
    fn the_summary_measures_the_gap_a_leader_kill_leaves() {
        let summary = Summary::of(&drill(), &[]);
        assert_eq!((summary.submitted, summary.acknowledged, summary.failed), (50, 42, 8));
        // Submissions sent at 2.7 s are the first acknowledged after the kill at 2 s: at 2.805 s.
        assert_eq!(summary.failovers_ms, vec![805]);
        // Acks at 1.805 s, then 2.805 s: a one-second gap in a 4.9 s window.
        assert_eq!(summary.longest_gap_ms, 1_000);
        assert!((summary.availability - (1.0 - 1_000.0 / 4_900.0)).abs() < 1e-9, "{}", summary.availability);
        let table = summary.table("leader-kill", &[]);
        assert!(table.contains("failover             p50 805 ms p99 805 ms max 805 ms (n=1)"), "{table}");
        assert!(table.contains("invariants           all kept"), "{table}");
    }

    #[test]
    fn the_timeline_draws_each_replica_and_each_fault() {
        let svg = timeline_svg(&drill(), "leader-kill <test>");
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("leader-kill &lt;test&gt;"));
        assert!(svg.contains("<title>kill leader replica 1</title>"));
        assert!(svg.contains(">replica 1</text>"));
        assert_eq!(svg.matches("<title>leader</title>").count(), 1);
        assert_eq!(svg.matches("<title>unreachable</title>").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}

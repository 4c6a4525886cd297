//! Slurm's output formats: `squeue -o` field specs, timestamps, and hostlists.

use drover_state::hostlist::compress_hostlist;
use drover_state::slurm_time::{format_duration, format_time_limit};
use drover_state::{Job, JobState, PendingReason};

/// `squeue`'s default format.
pub const SQUEUE_DEFAULT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

/// One `%[-][.]WIDTH X` item of a format string, or literal text.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Text(String),
    Field { code: char, width: Option<usize>, right: bool, truncate: bool },
}

fn parse_format(format: &str) -> Result<Vec<Item>, String> {
    let mut items = Vec::new();
    let mut chars = format.chars().peekable();
    let mut text = String::new();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        if !text.is_empty() {
            items.push(Item::Text(std::mem::take(&mut text)));
        }
        // Slurm: "%.10M" right-justifies in 10 columns; "%10M" left-justifies; both truncate to the width.
        let mut right = false;
        if chars.peek() == Some(&'-') {
            chars.next();
        }
        if chars.peek() == Some(&'.') {
            chars.next();
            right = true;
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let code = chars.next().ok_or_else(|| format!("format {format:?} ends inside a % field"))?;
        if !FIELD_CODES.contains(code) {
            return Err(format!(
                "invalid field %{code} in format {format:?}; supported: %{}",
                FIELD_CODES.chars().map(String::from).collect::<Vec<_>>().join(" %")
            ));
        }
        let width = digits.parse().ok();
        items.push(Item::Field { code, width, right, truncate: width.is_some() });
    }
    if !text.is_empty() {
        items.push(Item::Text(text));
    }
    Ok(items)
}

const FIELD_CODES: &str = "iAjPutTMlLDRNrCbVSeaZoqQgUhBFKEvy";

/// The header text of a field (as Slurm prints it).
fn header(code: char) -> &'static str {
    match code {
        'i' | 'A' => "JOBID",
        'j' => "NAME",
        'P' => "PARTITION",
        'u' => "USER",
        't' => "ST",
        'T' => "STATE",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'R' => "NODELIST(REASON)",
        'N' => "NODELIST",
        'r' => "REASON",
        'C' => "CPUS",
        'b' => "TRES_PER_NODE",
        'V' => "SUBMIT_TIME",
        'S' => "START_TIME",
        'e' => "END_TIME",
        'a' => "ACCOUNT",
        'Z' => "WORK_DIR",
        'o' => "COMMAND",
        'q' => "QOS",
        'Q' => "PRIORITY",
        'g' => "GROUP",
        'U' => "UID",
        'h' => "OVER_SUBSCRIBE",
        'B' => "EXEC_HOST",
        'F' => "ARRAY_JOB_ID",
        'K' => "ARRAY_TASK_ID",
        'E' => "DEPENDENCY",
        'v' => "RESERVATION",
        'y' => "NICE",
        _ => "?",
    }
}

/// Formats job output with a Slurm-style format string.
#[derive(Debug)]
pub struct JobFormatter {
    items: Vec<Item>,
}

impl JobFormatter {
    pub fn new(format: &str) -> Result<JobFormatter, String> {
        Ok(JobFormatter { items: parse_format(format)? })
    }

    pub fn header(&self) -> String {
        self.render(|code| header(code).to_string())
    }

    pub fn line(&self, job: &Job, now_ms: u64) -> String {
        self.render(|code| field(job, code, now_ms))
    }

    /// A line for a group of pending array tasks, shown as one (`123_[4-99%8]`), as squeue does.
    pub fn group_line(&self, job: &Job, now_ms: u64, id: &str, task_ids: &str) -> String {
        self.render(|code| match code {
            'i' => id.to_string(),
            'K' => task_ids.to_string(),
            _ => field(job, code, now_ms),
        })
    }

    fn render(&self, value: impl Fn(char) -> String) -> String {
        let mut out = String::new();
        for item in &self.items {
            match item {
                Item::Text(t) => out.push_str(t),
                Item::Field { code, width, right, truncate } => {
                    let mut v = value(*code);
                    if let Some(w) = width {
                        if *truncate && v.chars().count() > *w {
                            v = v.chars().take(*w).collect();
                        }
                        if *right {
                            out.push_str(&format!("{v:>w$}", w = *w));
                        } else {
                            out.push_str(&format!("{v:<w$}", w = *w));
                        }
                    } else {
                        out.push_str(&v);
                    }
                }
            }
        }
        out.trim_end().to_string()
    }
}

/// Time the job has run (or ran).
pub fn elapsed_s(job: &Job, now_ms: u64) -> u64 {
    match (job.start_time_ms, job.end_time_ms) {
        (Some(start), Some(end)) => end.saturating_sub(start) / 1000,
        (Some(start), None) => now_ms.saturating_sub(start) / 1000,
        _ => 0,
    }
}

/// Slurm's reason text: `(Reason)` for pending jobs, the node list otherwise.
fn reason_or_nodes(job: &Job) -> String {
    if job.state == JobState::Pending {
        let reason = match &job.reason {
            PendingReason::None => "None",
            r => r.name(),
        };
        format!("({reason})")
    } else {
        compress_hostlist(&job.nodes)
    }
}

fn field(job: &Job, code: char, now_ms: u64) -> String {
    let spec = &job.spec;
    match code {
        'i' => job.display_id(),
        'A' => job.id.to_string(),
        'F' => job.array.map_or_else(|| job.id.to_string(), |a| a.array_job_id.to_string()),
        'K' => job.array.map_or_else(|| "N/A".to_string(), |a| a.task_id.to_string()),
        'E' => drover_state::dependency::format_dependency(&spec.dependency, spec.dependency_any),
        'v' => spec.reservation.clone().unwrap_or_else(|| "(null)".into()),
        'y' => spec.nice.to_string(),
        'j' => spec.name.clone(),
        'P' => job.partition.clone(),
        'u' => spec.user.clone(),
        't' => job.state.short().to_string(),
        'T' => job.state.name().to_string(),
        'M' => format_duration(elapsed_s(job, now_ms)),
        'l' => format_time_limit(job.time_limit_s),
        'L' => match job.time_limit_s {
            Some(limit) => format_duration(limit.saturating_sub(elapsed_s(job, now_ms))),
            None => "UNLIMITED".into(),
        },
        'D' => {
            if job.nodes.is_empty() {
                spec.min_nodes.to_string()
            } else {
                job.nodes.len().to_string()
            }
        }
        'R' => reason_or_nodes(job),
        'N' => compress_hostlist(&job.nodes),
        'r' => job.reason.name().to_string(),
        'C' => (spec.total_tasks() * spec.cpus_per_task).to_string(),
        'b' => {
            if spec.gpus_per_node == 0 {
                "N/A".into()
            } else {
                match &spec.gpu_type {
                    Some(t) => format!("gres/gpu:{t}:{}", spec.gpus_per_node),
                    None => format!("gres/gpu:{}", spec.gpus_per_node),
                }
            }
        }
        'V' => format_timestamp(Some(job.submit_time_ms)),
        'S' => format_timestamp(job.start_time_ms),
        'e' => format_timestamp(job.end_time_ms),
        'a' => job.account_name().to_string(),
        'Z' => spec.work_dir.clone(),
        'o' => spec.name.clone(),
        'q' => job.qos_name().to_string(),
        'Q' => {
            if job.held {
                "0".into()
            } else {
                "1".into()
            }
        }
        'g' => spec.gid.to_string(),
        'U' => spec.uid.to_string(),
        'h' => "OK".into(),
        'B' => job.nodes.first().cloned().unwrap_or_else(|| "n/a".into()),
        _ => String::new(),
    }
}

/// Slurm's timestamp format (`2026-12-02T10:15:00`, local time), or `N/A`.
pub fn format_timestamp(ms: Option<u64>) -> String {
    let Some(ms) = ms else { return "N/A".into() };
    let secs = (ms / 1000) as libc::time_t;
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r writes only into `tm`.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return "N/A".into();
    }
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_strings_parse_widths_and_justification() {
        let f = JobFormatter::new("%.5i|%-4j|%t%%").unwrap();
        assert_eq!(f.header(), "JOBID|NAME|ST%");
        assert!(JobFormatter::new("%Y").unwrap_err().contains("invalid field %Y"));
    }

    #[test]
    fn the_default_header_matches_slurm() {
        let f = JobFormatter::new(SQUEUE_DEFAULT).unwrap();
        assert_eq!(f.header(), "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)");
    }
}

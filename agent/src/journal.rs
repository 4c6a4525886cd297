//! The node's task journal: one line per task start and end, appended by the supervisors themselves.
//!
//! It is the node's own record of what ran on which GPUs and when, independent of the agent and the controllers:
//! an operator reads it to answer "what held GPU 3 at 02:14?", and the fencing stories read every node's journal
//! to check that no job ran two incarnations at once and no GPU had two holders. A `start` is written once the
//! task has started; an `end` once the task's main process and everything it left behind are reaped, that is,
//! once nothing of the task can hold its GPUs any more.
//!
//! The journal lives in the agent's state directory (root's, never the job's). Lines are small JSON objects
//! appended with `O_APPEND` in one `write`, so lines of concurrent supervisors never interleave. When it grows
//! past [`MAX_JOURNAL_BYTES`] it is rotated once (`journal.1`), so it is bounded.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The journal's name in the agent's state directory.
pub const JOURNAL_FILE: &str = "journal";
/// Size after which the journal is rotated to `journal.1` (the previous `journal.1` is dropped).
pub const MAX_JOURNAL_BYTES: u64 = 64 << 20;
/// The longest journal read back (a rotated one and the current one at most).
const MAX_READ_BYTES: u64 = 2 * MAX_JOURNAL_BYTES;

/// What happened to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JournalEvent {
    Start,
    End,
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub event: JournalEvent,
    pub job: u64,
    pub incarnation: u64,
    /// `batch`, or `STEP.RANK` for a step's task.
    pub task: String,
    /// The GPUs the task was given on this node.
    pub gpus: Vec<u32>,
    /// Wall clock, milliseconds since the Unix epoch (comparable across the nodes of one host, and across hosts
    /// as far as their clocks agree).
    pub wall_ms: u64,
    /// `CLOCK_BOOTTIME` milliseconds: exact order on this host, immune to clock steps.
    pub boot_ms: u64,
}

/// Appends `entry` to the journal at `path` (rotating it first if it is too large).
pub fn append(path: &Path, entry: &JournalEntry) -> io::Result<()> {
    if fs::metadata(path).is_ok_and(|m| m.len() > MAX_JOURNAL_BYTES) {
        // Two supervisors may both rotate: the second renames a fresh, small journal over the first's `.1`,
        // which loses at most a few lines of history, never the journal's bound.
        let _ = fs::rename(path, path.with_extension("1"));
    }
    let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut file =
        OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)?;
    file.write_all(&line)
}

/// Every entry of the journal at `path` (the rotated part first), skipping lines that do not parse (a line cut
/// by a full disk).
pub fn read(path: &Path) -> io::Result<Vec<JournalEntry>> {
    let mut entries = Vec::new();
    for part in [path.with_extension("1"), path.to_path_buf()] {
        let text = match fs::metadata(&part) {
            Ok(m) if m.len() > MAX_READ_BYTES => {
                return Err(io::Error::other(format!("{} is too large", part.display())));
            }
            Ok(_) => fs::read_to_string(&part)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        entries.extend(text.lines().filter_map(|line| serde_json::from_str(line).ok()));
    }
    Ok(entries)
}

/// One task's time on one node, as its journal tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    pub node: String,
    pub job: u64,
    pub incarnation: u64,
    pub task: String,
    pub gpus: Vec<u32>,
    pub from_ms: u64,
    /// `None`: no end recorded (still running, or its supervisor died).
    pub to_ms: Option<u64>,
}

/// The tasks' intervals in one node's journal (starts paired with the ends of the same task).
pub fn intervals(node: &str, entries: &[JournalEntry]) -> Vec<Interval> {
    let mut open: Vec<Interval> = Vec::new();
    let mut done = Vec::new();
    for e in entries {
        let same = |i: &Interval| i.job == e.job && i.incarnation == e.incarnation && i.task == e.task;
        match e.event {
            JournalEvent::Start => open.push(Interval {
                node: node.to_string(),
                job: e.job,
                incarnation: e.incarnation,
                task: e.task.clone(),
                gpus: e.gpus.clone(),
                from_ms: e.wall_ms,
                to_ms: None,
            }),
            JournalEvent::End => {
                if let Some(at) = open.iter().position(same) {
                    let mut interval = open.remove(at);
                    interval.to_ms = Some(e.wall_ms);
                    done.push(interval);
                }
            }
        }
    }
    done.extend(open);
    done
}

/// The promises the journals of a cluster's nodes must keep, checked: no job ran two incarnations at once (on any
/// nodes), and no GPU of a node was held by two incarnations at once. A task with no recorded end counts as
/// running until `now_ms`. Times are wall-clock, so across hosts this is as exact as their clocks agree.
pub fn violations(journals: &[(String, Vec<JournalEntry>)], now_ms: u64) -> Vec<String> {
    let all: Vec<Interval> = journals.iter().flat_map(|(node, entries)| intervals(node, entries)).collect();
    let overlap =
        |a: &Interval, b: &Interval| a.from_ms < b.to_ms.unwrap_or(now_ms) && b.from_ms < a.to_ms.unwrap_or(now_ms);
    let mut out = Vec::new();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.job == b.job && a.incarnation != b.incarnation && overlap(a, b) {
                out.push(format!(
                    "job {} ran incarnations {} (on {}, {}..{:?}) and {} (on {}, {}..{:?}) at once",
                    a.job, a.incarnation, a.node, a.from_ms, a.to_ms, b.incarnation, b.node, b.from_ms, b.to_ms
                ));
            }
            let shared: Vec<u32> = a.gpus.iter().copied().filter(|g| b.gpus.contains(g)).collect();
            if a.node == b.node
                && (a.job, a.incarnation) != (b.job, b.incarnation)
                && !shared.is_empty()
                && overlap(a, b)
            {
                out.push(format!(
                    "GPU(s) {shared:?} on {} held by job {} incarnation {} ({}..{:?}) and job {} incarnation {} \
                     ({}..{:?}) at once",
                    a.node, a.job, a.incarnation, a.from_ms, a.to_ms, b.job, b.incarnation, b.from_ms, b.to_ms
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(event: JournalEvent, job: u64) -> JournalEntry {
        JournalEntry { event, job, incarnation: 0, task: "batch".into(), gpus: vec![0, 1], wall_ms: 1, boot_ms: 2 }
    }

    #[test]
    fn entries_are_appended_and_read_back_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        append(&path, &entry(JournalEvent::Start, 1)).unwrap();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"event\":\"st").unwrap();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"\n").unwrap();
        append(&path, &entry(JournalEvent::End, 1)).unwrap();
        let read = read(&path).unwrap();
        assert_eq!(read, vec![entry(JournalEvent::Start, 1), entry(JournalEvent::End, 1)]);
    }

    fn at(event: JournalEvent, job: u64, incarnation: u64, gpus: &[u32], wall_ms: u64) -> JournalEntry {
        JournalEntry { event, job, incarnation, task: "batch".into(), gpus: gpus.to_vec(), wall_ms, boot_ms: wall_ms }
    }

    #[test]
    fn overlapping_incarnations_and_shared_gpus_are_found_and_back_to_back_ones_are_not() {
        use JournalEvent::{End, Start};
        // Job 1 incarnation 0 on n1 ends at 10; incarnation 1 on n2 starts at 10: fine. Job 2 on n1 gets GPU 0
        // at 10, when job 1 let it go: fine.
        let n1 = vec![at(Start, 1, 0, &[0], 0), at(End, 1, 0, &[0], 10), at(Start, 2, 0, &[0], 10)];
        let n2 = vec![at(Start, 1, 1, &[0], 10), at(End, 1, 1, &[0], 20)];
        let clean = vec![("n1".to_string(), n1.clone()), ("n2".to_string(), n2)];
        assert_eq!(violations(&clean, 30), Vec::<String>::new());
        // Incarnation 1 starts at 9, before 0 ended: two at once. Job 3 takes GPU 0 while job 2 still runs.
        let n2 = vec![at(Start, 1, 1, &[1], 9), at(End, 1, 1, &[1], 20)];
        let mut n1 = n1;
        n1.push(at(Start, 3, 0, &[0, 1], 15));
        let broken = vec![("n1".to_string(), n1), ("n2".to_string(), n2)];
        let found = violations(&broken, 30);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].contains("job 1 ran incarnations 0"), "{found:#?}");
        assert!(found[1].contains("GPU(s) [0] on n1 held by job 2 incarnation 0"), "{found:#?}");
    }

    #[test]
    fn a_link_in_place_of_the_journal_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep\n").unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(append(&path, &entry(JournalEvent::Start, 1)).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep\n");
    }
}

//! The checkpoint marker file: for frameworks that cannot run `drover checkpoint record`, a job writes
//! `$DROVER_CHECKPOINT_DIR/LATEST` (`PATH [STEP]`, a path relative to that directory or absolute) after each
//! finished checkpoint, and the agent records it for the job's incarnation.
//!
//! The agent reads the file as root from a directory the job's user controls, so it refuses anything but a small
//! regular file owned by that user, opened without following a symbolic link: a job cannot make the agent read,
//! and publish in its record, a file the user may not read.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::time::SystemTime;

use drover_state::Job;

/// The marker's name in the incarnation's checkpoint directory.
pub const MARKER_FILE: &str = "LATEST";
/// The progress marker's name there: any write to it is progress (`--progress-timeout`); it may hold the step.
pub const PROGRESS_FILE: &str = "PROGRESS";
/// Its largest accepted size.
const MAX_MARKER_BYTES: u64 = 4_096;

/// What the marker looked like when last read: a new write changes one or the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    modified: SystemTime,
    len: u64,
}

/// A checkpoint a marker names: its absolute path and step.
pub type Record = (String, Option<u64>);

/// Reads `job`'s marker if it changed since `previous`: `None` when absent or unchanged; otherwise what was seen,
/// and the checkpoint it names (`None` if the file is not acceptable, which is logged).
pub fn read(job: &Job, previous: Option<&Seen>) -> Option<(Seen, Option<Record>)> {
    let dir = job.checkpoint_dir();
    let (seen, text) = read_file(job, MARKER_FILE, previous)?;
    Some((seen, text.and_then(|text| parse(&text, &dir))))
}

/// Reads `job`'s progress marker if it changed since `previous`: what was seen, and `Some(step)` when the change
/// counts as progress (`step` is the number the file holds, if any); `None` inside when the file is not acceptable.
pub fn read_progress(job: &Job, previous: Option<&Seen>) -> Option<(Seen, Option<Option<u64>>)> {
    let (seen, text) = read_file(job, PROGRESS_FILE, previous)?;
    Some((seen, text.map(|text| text.split_whitespace().next().and_then(|w| w.parse().ok()))))
}

/// One of the job's marker files, if it changed since `previous`: what was seen, and its text (`None` if the file
/// is not a small regular file of the job's user, which is logged).
fn read_file(job: &Job, name: &str, previous: Option<&Seen>) -> Option<(Seen, Option<String>)> {
    let dir = job.checkpoint_dir();
    let path = format!("{dir}/{name}");
    let mut file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path).ok()?;
    let meta = file.metadata().ok()?;
    let seen = Seen { modified: meta.modified().ok()?, len: meta.len() };
    if previous == Some(&seen) {
        return None;
    }
    if !meta.is_file() || meta.len() > MAX_MARKER_BYTES || meta.uid() != job.spec.uid {
        let what = if name == MARKER_FILE { "checkpoint" } else { "progress" };
        tracing::warn!(job = job.id, %path, "ignoring the {what} marker: not a small regular file of the job's user");
        return Some((seen, None));
    }
    let mut text = String::new();
    if file.by_ref().take(MAX_MARKER_BYTES).read_to_string(&mut text).is_err() {
        return Some((seen, None));
    }
    Some((seen, Some(text)))
}

/// `PATH [STEP]`: a relative path is taken from the checkpoint directory.
fn parse(text: &str, dir: &str) -> Option<Record> {
    let mut words = text.split_whitespace();
    let path = words.next()?;
    let step = match words.next() {
        Some(word) => Some(word.parse().ok()?),
        None => None,
    };
    let path = if path.starts_with('/') { path.to_string() } else { format!("{dir}/{path}") };
    Some((path, step))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(root: &std::path::Path) -> Job {
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let mut job =
            Job { id: 7, incarnation: 2, checkpoint_root: root.display().to_string().into(), ..Job::default() };
        job.spec.uid = uid;
        job
    }

    #[test]
    fn a_marker_names_a_checkpoint_once_per_change() {
        let tmp = tempfile::tempdir().unwrap();
        let job = job(tmp.path());
        std::fs::create_dir_all(job.checkpoint_dir()).unwrap();
        assert!(read(&job, None).is_none(), "no marker yet");
        let marker = format!("{}/{MARKER_FILE}", job.checkpoint_dir());
        std::fs::write(&marker, "step-40.pt 40\n").unwrap();
        let (seen, record) = read(&job, None).unwrap();
        assert_eq!(record, Some((format!("{}/step-40.pt", job.checkpoint_dir()), Some(40))));
        assert!(read(&job, Some(&seen)).is_none(), "unchanged: nothing new");
        std::fs::write(&marker, "/shared/ckpt/final\n").unwrap();
        let (_, record) = read(&job, Some(&seen)).unwrap();
        assert_eq!(record, Some(("/shared/ckpt/final".to_string(), None)));
    }

    #[test]
    fn a_symbolic_link_or_garbage_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let job = job(tmp.path());
        std::fs::create_dir_all(job.checkpoint_dir()).unwrap();
        let marker = format!("{}/{MARKER_FILE}", job.checkpoint_dir());
        std::os::unix::fs::symlink("/etc/passwd", &marker).unwrap();
        assert!(read(&job, None).is_none(), "a link is not followed");
        std::fs::remove_file(&marker).unwrap();
        std::fs::write(&marker, "ckpt notanumber\n").unwrap();
        assert_eq!(read(&job, None).unwrap().1, None);
    }
}

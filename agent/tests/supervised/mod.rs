//! What the stories that run real supervisors share: reading a task's supervisor log, and waiting for its end.

use std::path::Path;
use std::time::{Duration, Instant};

use drover_agent::supervise::{self, TaskResult, TaskStatus};

/// How long a task may take in these stories before one fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// What the supervisor logged, for failure messages.
pub fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(supervise::SUPERVISOR_LOG)).unwrap_or_default()
}

/// Polls `status` the way a (restarted) agent does, until the task has finished.
pub fn wait_finished(dir: &Path) -> TaskResult {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match supervise::status(dir) {
            TaskStatus::Finished(result) => return result,
            TaskStatus::Lost(why) => panic!("task lost: {why}; supervisor log:\n{}", log_of(dir)),
            TaskStatus::Running { .. } => {}
        }
        assert!(Instant::now() < deadline, "task in {} still running; supervisor log:\n{}", dir.display(), log_of(dir));
        std::thread::sleep(Duration::from_millis(20));
    }
}

//! The write end of a step task's input FIFO (srun's standard input, see `steps::StepServer::step_input`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::supervise::{self, TaskStatus};

/// A task that has not taken its input for this long while it runs is given no more (its end closed); the input
/// of a task that never reads it does not hold srun up for ever.
const INPUT_STALL_MS: u64 = 60_000;
/// How long closing a step's input waits for a task that has not opened it yet (its supervisor starting).
const INPUT_OPEN_WAIT_MS: u64 = 10_000;

/// The write end of one task's input FIFO.
pub(crate) struct InputEnd {
    dir: PathBuf,
    end: std::fs::File,
}

impl InputEnd {
    pub(crate) fn new(dir: PathBuf, end: std::fs::File) -> InputEnd {
        InputEnd { dir, end }
    }

    /// Writes all of `data`, waiting while the pipe is full and the task runs; false once the task is gone (or
    /// stalled past [`INPUT_STALL_MS`]): its input is closed.
    pub(crate) fn write_all(&mut self, mut data: &[u8]) -> bool {
        use std::io::Write;
        let mut stalled_since = Instant::now();
        while !data.is_empty() {
            match self.end.write(data) {
                Ok(n) => {
                    data = &data[n..];
                    stalled_since = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                    if !supervise::may_be_running(&self.dir)
                        || stalled_since.elapsed() > Duration::from_millis(INPUT_STALL_MS)
                    {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Closes the write end once the task has opened its side (a FIFO nobody holds loses what it buffers), so the
    /// task reads everything written, then end of file.
    pub(crate) fn close(self) {
        // The supervisor records the task's pid after the spawn, by which time the task holds its stdin.
        let deadline = Instant::now() + Duration::from_millis(INPUT_OPEN_WAIT_MS);
        while !self.dir.join(supervise::TASK_PID_FILE).exists()
            && matches!(supervise::status(&self.dir), TaskStatus::Running { .. })
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

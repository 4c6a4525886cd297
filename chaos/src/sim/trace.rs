//! The run's trace: every delivered message, client outcome, agent report and fault, with its simulated time,
//! folded into one hash (two runs of a seed must agree on it) and the latest lines kept for a failure report.

use std::collections::VecDeque;
use std::fmt;

/// Lines kept for printing when a seed fails; older ones are only in the hash.
const TAIL_LINES: usize = 200;

pub struct Trace {
    /// FNV-1a over every event: stable across builds and platforms, unlike std's hasher.
    hash: u64,
    pub events: u64,
    tail: VecDeque<String>,
    started: tokio::time::Instant,
    /// Every line with its payload's hash, when `DROVER_SIM_TRACE` names a file to write them to (to diff two
    /// runs that should agree).
    full: Option<Vec<String>>,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            hash: FNV_OFFSET,
            events: 0,
            tail: VecDeque::new(),
            started: tokio::time::Instant::now(),
            full: std::env::var_os("DROVER_SIM_TRACE").map(|_| Vec::new()),
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

impl Trace {
    /// Simulated microseconds since the run started (paused time: identical in every replay).
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    pub fn record(&mut self, what: fmt::Arguments<'_>, payload: &[u8]) {
        let line = format!("{:>10}us {what} ({} bytes)", self.now_us(), payload.len());
        self.hash = fnv(fnv(self.hash, line.as_bytes()), payload);
        self.events += 1;
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        if let Some(full) = &mut self.full {
            full.push(format!("{line} {:016x}", fnv(FNV_OFFSET, payload)));
        }
        self.tail.push_back(line);
    }

    /// Writes the full trace to the file `DROVER_SIM_TRACE` names, if it does (best effort: a debugging aid).
    pub fn write_full(&self) {
        if let (Some(full), Some(path)) = (&self.full, std::env::var_os("DROVER_SIM_TRACE")) {
            let _ = std::fs::write(path, full.join("\n"));
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }
}

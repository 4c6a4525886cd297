//! The drill's one clock and its event log. Every source (client loops, the status prober, the fault schedule,
//! the jobs' own logs read at the end) stamps events with milliseconds since the drill began on the machine's
//! wall clock: the jobs run on this machine and stamp their lines with the same clock (`date +%s%3N`).

use std::sync::{Arc, Mutex};

use crate::history::{Event, EventKind, History};

/// Events recorded live; past this the drill stops recording (and says so) rather than grow without bound.
pub const MAX_LIVE_EVENTS: usize = 5_000_000;

#[derive(Clone)]
pub struct Recorder {
    /// Unix time of the drill's start, ms.
    pub epoch_ms: u64,
    events: Arc<Mutex<Vec<Event>>>,
}

pub use drover_common::wall::now_ms as unix_ms;

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder { epoch_ms: unix_ms(), events: Arc::new(Mutex::new(Vec::new())) }
    }

    /// Now on the drill's clock.
    pub fn now_ms(&self) -> u64 {
        unix_ms().saturating_sub(self.epoch_ms)
    }

    /// A Unix time in ms (a job's log line) on the drill's clock.
    pub fn from_unix_ms(&self, unix_ms: u64) -> u64 {
        unix_ms.saturating_sub(self.epoch_ms)
    }

    pub fn record(&self, kind: EventKind) {
        self.record_at(self.now_ms(), kind);
    }

    pub fn record_at(&self, at_ms: u64, kind: EventKind) {
        let mut events = self.events.lock().expect("recorder poisoned");
        if events.len() < MAX_LIVE_EVENTS {
            events.push(Event { at_ms, kind });
        }
    }

    pub fn len(&self) -> usize {
        self.events.lock().expect("recorder poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything so far, in time order (sources record out of order by a few ms; the sort is stable, so one
    /// source's events keep their order).
    pub fn history(&self) -> History {
        let mut events = self.events.lock().expect("recorder poisoned").clone();
        events.sort_by_key(|e| e.at_ms);
        History { events }
    }
}

//! What a drill records: one event per line (JSON), each stamped with the recorder's clock in ms.
//!
//! Sources differ in what they can vouch for, so each event says only what its source saw: a client saw its own
//! operations and their acknowledgements, an agent (or a task's log) saw an incarnation start and end on its node
//! with the GPUs it held, a job's own log saw which checkpoint it resumed from, the drill saw its faults.

use std::io::BufRead;

use serde::{Deserialize, Serialize};

/// One observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The recorder's clock, ms (one clock for the whole drill: the checker compares times across sources).
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// A client sent a submission (`op` is the client's own operation number, unique in the drill).
    SubmitSent {
        op: u64,
    },
    /// The cluster acknowledged it with a job id: from here on the job must never be lost.
    SubmitAcked {
        op: u64,
        job: u64,
    },
    /// The client got an error or no answer: the submission may or may not exist (neither is a violation).
    SubmitFailed {
        op: u64,
        error: String,
    },
    /// An incarnation of a job started its tasks on a node, holding these GPUs there.
    IncarnationStarted {
        job: u64,
        incarnation: u64,
        node: String,
        gpus: Vec<u32>,
    },
    /// That incarnation's tasks on that node are gone (ended, killed, fenced).
    IncarnationEnded {
        job: u64,
        incarnation: u64,
        node: String,
    },
    /// The cluster acknowledged a checkpoint of the job at this training step.
    CheckpointAcked {
        job: u64,
        incarnation: u64,
        step: u64,
    },
    /// An incarnation started from this checkpoint step (`None`: from scratch).
    Resumed {
        job: u64,
        incarnation: u64,
        from_step: Option<u64>,
    },
    /// A client read the job's state (squeue/sacct), e.g. `RUNNING`, `COMPLETED`.
    StateObserved {
        job: u64,
        state: String,
    },
    /// A fault began (`name` as the drill file calls it) / ended.
    FaultStarted {
        name: String,
    },
    FaultHealed {
        name: String,
    },
    /// A replica answered a status probe with this role and term ("unreachable" when it did not answer):
    /// the timeline's leader rows. The checker does not judge these.
    RoleObserved {
        replica: u64,
        role: String,
        term: u64,
    },
    /// The final listing after the drill: every job the cluster knows, with its state.
    FinalJobs {
        jobs: Vec<(u64, String)>,
    },
}

/// A drill's events in recording order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub events: Vec<Event>,
}

/// The job ids acknowledged to clients in `events`, in the order acknowledged.
pub fn acked_jobs(events: &[Event]) -> impl Iterator<Item = u64> + '_ {
    events.iter().filter_map(|e| match e.kind {
        EventKind::SubmitAcked { job, .. } => Some(job),
        _ => None,
    })
}

/// What is wrong with a recorded history file.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("reading the history: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {error} (each line is one JSON event with \"at_ms\" and \"event\")")]
    Malformed { line: usize, error: serde_json::Error },
    #[error("line {line}: time goes backwards ({at_ms} ms after {previous_ms} ms); one recorder clock is needed")]
    OutOfOrder { line: usize, at_ms: u64, previous_ms: u64 },
    #[error("more than {max} events; split the drill or raise the limit")]
    TooLong { max: usize },
}

/// A history longer than this is refused rather than held in memory (a 10-minute soak records far fewer).
pub const MAX_EVENTS: usize = 10_000_000;

impl History {
    /// Reads JSON lines (blank lines skipped); events must come in time order.
    pub fn read(reader: impl BufRead) -> Result<History, HistoryError> {
        let mut events: Vec<Event> = Vec::new();
        for (index, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let event: Event =
                serde_json::from_str(&line).map_err(|error| HistoryError::Malformed { line: index + 1, error })?;
            if let Some(previous) = events.last()
                && event.at_ms < previous.at_ms
            {
                return Err(HistoryError::OutOfOrder {
                    line: index + 1,
                    at_ms: event.at_ms,
                    previous_ms: previous.at_ms,
                });
            }
            if events.len() == MAX_EVENTS {
                return Err(HistoryError::TooLong { max: MAX_EVENTS });
            }
            events.push(event);
        }
        Ok(History { events })
    }

    /// One JSON line per event, as [`History::read`] reads them.
    pub fn to_json_lines(&self) -> String {
        self.events.iter().map(|e| serde_json::to_string(e).expect("events serialize") + "\n").collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_round_trips_through_json_lines_and_bad_lines_are_named() {
        let history = History {
            events: vec![
                Event { at_ms: 1, kind: EventKind::SubmitSent { op: 7 } },
                Event { at_ms: 2, kind: EventKind::SubmitAcked { op: 7, job: 42 } },
                Event { at_ms: 3, kind: EventKind::FinalJobs { jobs: vec![(42, "COMPLETED".into())] } },
            ],
        };
        let text = history.to_json_lines();
        assert!(text.starts_with(r#"{"at_ms":1,"event":"submit_sent","op":7}"#), "{text}");
        assert_eq!(History::read(text.as_bytes()).unwrap(), history);

        let err = History::read("\n{\"at_ms\":1}\n".as_bytes()).unwrap_err();
        assert!(err.to_string().starts_with("line 2: "), "{err}");
        let backwards =
            "{\"at_ms\":5,\"event\":\"submit_sent\",\"op\":1}\n{\"at_ms\":4,\"event\":\"submit_sent\",\"op\":2}\n";
        let err = History::read(backwards.as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "line 2: time goes backwards (4 ms after 5 ms); one recorder clock is needed");
    }
}

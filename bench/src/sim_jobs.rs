//! What a simulated agent does with the jobs it is assigned (`drover-bench short-jobs`): reports each end once
//! its run time has passed and confirms each release, as a real agent does, and records how long each job took
//! from its submission to reaching the agent. Kept apart from `agents.rs` (the sessions) and `short_jobs.rs` (the
//! bench), which both use it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use drover_proto::v1::AgentEnvelope;
use drover_proto::wire::{AgentMessage, ControllerMessage, encode};
use drover_state::{JobEnd, JobId};
use hdrhistogram::Histogram;
use tokio::sync::mpsc::Sender;

/// What the simulated agents do with their assignments, and what they saw of the loop.
pub struct SimJobs {
    run: Duration,
    /// `EndAcked` answers received: the ends the leader committed.
    pub(crate) acked: AtomicU64,
    /// A job's submission (the leader's stamp) to its assignment reaching the agent, µs: the scheduling loop
    /// (pass, start committed, pushed), measured under the load.
    pub(crate) to_agent: Mutex<Histogram<u64>>,
}

/// One session's view of its jobs: what it has reported, so each end and release goes once per session (a new
/// session reports again whatever the leader still lists, as a real agent does).
#[derive(Default)]
pub struct SessionJobs {
    reported: HashSet<(JobId, u64)>,
    released: HashSet<(JobId, u64)>,
}

impl SimJobs {
    pub fn new(run: Duration) -> SimJobs {
        SimJobs {
            run,
            acked: AtomicU64::new(0),
            to_agent: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")),
        }
    }

    /// Acts on one message from the leader: runs new assignments (their end is reported after the run time),
    /// confirms lingering incarnations gone (their GPUs are free again only then), counts acknowledgements.
    pub fn on_message(&self, message: ControllerMessage, tx: &Sender<AgentEnvelope>, session: &mut SessionJobs) {
        match message {
            ControllerMessage::Assignments { jobs, lingering, .. } => {
                let now_ms = wall_ms();
                let listed: HashSet<(JobId, u64)> = jobs.iter().map(|a| (a.job.id, a.job.incarnation)).collect();
                for assignment in jobs.iter().filter(|a| a.node_index == 0 && !a.cancelled()) {
                    let key = (assignment.job.id, assignment.job.incarnation);
                    if !session.reported.insert(key) {
                        continue;
                    }
                    let waited_us = now_ms.saturating_sub(assignment.job.submit_time_ms) * 1_000;
                    let _ = self.to_agent.lock().expect("to_agent poisoned").record(waited_us.max(1));
                    let (tx, run) = (tx.clone(), self.run);
                    tokio::spawn(async move {
                        if !run.is_zero() {
                            tokio::time::sleep(run).await;
                        }
                        let end = AgentMessage::JobEnded { job_id: key.0, incarnation: key.1, end: JobEnd::default() };
                        let _ = tx.send(AgentEnvelope { json: encode(&end) }).await;
                    });
                }
                // Forget what the leader no longer lists, so the sets stay as small as the node's jobs.
                session.reported.retain(|key| listed.contains(key));
                let new: Vec<(JobId, u64)> =
                    lingering.iter().copied().filter(|key| !session.released.contains(key)).collect();
                session.released.retain(|key| lingering.contains(key));
                if !new.is_empty() {
                    session.released.extend(new.iter().copied());
                    let released = AgentMessage::Released { keys: new, usage: Vec::new() };
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let _ = tx.send(AgentEnvelope { json: encode(&released) }).await;
                    });
                }
            }
            ControllerMessage::EndAcked { .. } => {
                self.acked.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

//! `AgentService`: `srun` starts a step's tasks on this node and receives their output and exits.

use std::io::Read;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_proto::v1::agent_service_server::AgentService;
use drover_proto::v1::{Empty, StepEvent as StepEnvelope, StepInputChunk, StepRequest};
use drover_proto::wire::{StepEvent, StepLaunch, decode, encode};
use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::node::NodeAgent;
use crate::step_input::InputEnd;
use crate::supervise::{self, TaskStatus};

/// Output is polled this often.
const POLL_MS: u64 = 20;
/// At most this much output per event.
const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// At most this many chunks of output are read per poll, all tasks together (4 MiB): up to 200 MB/s streamed,
/// and when srun is slower the channel to it holds the polls back, and the pipes hold the tasks back.
const MAX_DRAIN_CHUNKS_PER_POLL: usize = 64;
/// Most tasks of one step on one node.
const MAX_TASKS_PER_NODE: u32 = 1_024;
/// Largest chunk of srun's input accepted in one message.
const MAX_INPUT_CHUNK_BYTES: usize = 64 * 1024;

pub struct StepServer(pub Arc<NodeAgent>);

type EventStream = Pin<Box<dyn Stream<Item = Result<StepEnvelope, Status>> + Send>>;

/// One task being followed.
struct Followed {
    rank: u32,
    dir: PathBuf,
    /// The read ends of the FIFOs its output streams through (none where the step names its own files).
    out: Option<OutputPipe>,
    err: Option<OutputPipe>,
    done: bool,
}

/// A FIFO's read end and what was read from it but not sent yet (the end of a line still being written).
struct OutputPipe {
    end: std::fs::File,
    pending: Vec<u8>,
}

impl OutputPipe {
    fn new(end: std::fs::File) -> OutputPipe {
        OutputPipe { end, pending: Vec::new() }
    }

    /// What the task wrote since the last call, at most one chunk: up to the last newline unless `whole` (or the
    /// chunk is full). `None`: nothing to send now. Never blocks: the read end is non-blocking, and a writer that
    /// is ahead waits in the pipe, not in this process's memory or on the node's disk.
    fn read(&mut self, whole: bool) -> Option<String> {
        if self.pending.len() < MAX_CHUNK_BYTES {
            let mut buf = vec![0u8; MAX_CHUNK_BYTES - self.pending.len()];
            // 0 bytes: no writer (yet, or any more); WouldBlock: nothing written since. Either way, nothing new.
            if let Ok(n) = self.end.read(&mut buf) {
                self.pending.extend_from_slice(&buf[..n]);
            }
        }
        let keep = if whole || self.pending.len() >= MAX_CHUNK_BYTES {
            self.pending.len()
        } else {
            self.pending.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
        };
        if keep == 0 {
            return None;
        }
        let text: Vec<u8> = self.pending.drain(..keep).collect();
        Some(String::from_utf8_lossy(&text).into_owned())
    }
}

#[tonic::async_trait]
impl AgentService for StepServer {
    type LaunchStepStream = EventStream;

    async fn launch_step(&self, request: Request<StepRequest>) -> Result<Response<EventStream>, Status> {
        let agent = self.0.clone();
        // Who launches: the kernel-verified user behind the credential, never a field of the request.
        let caller =
            drover_auth::credential::identity_from_request(&agent.key, &request, drover_auth::credential::now_ms())?;
        let launch: StepLaunch =
            decode(&request.into_inner().json).map_err(|e| Status::invalid_argument(e.to_string()))?;
        // The controllers' credential for this very step (srun gets it when the step is created); the user's own
        // token never comes here, so this node has none to replay to the controllers.
        let audience = drover_auth::credential::step_audience(launch.job_id, launch.step_id);
        drover_auth::credential::check_audience(&caller, &audience)
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        let me = &agent.info.name;
        let assignment = agent.assignment(launch.job_id).ok_or_else(|| {
            Status::failed_precondition(format!("job {} has no allocation on node {me}", launch.job_id))
        })?;
        if assignment.cancelled() {
            return Err(Status::failed_precondition(format!("job {} is being cancelled", launch.job_id)));
        }
        if caller.uid != 0 && caller.uid != assignment.job.spec.uid {
            return Err(Status::permission_denied(format!(
                "Access/permission denied: job {} belongs to uid {}, not {}",
                launch.job_id, assignment.job.spec.uid, caller.uid
            )));
        }
        if launch.nodes.get(launch.node_index as usize) != Some(me)
            || launch.tasks_per_node.len() != launch.nodes.len()
            || launch.argv.is_empty()
        {
            return Err(Status::invalid_argument(format!("malformed step for node {me}")));
        }
        let Some(ranks) = launch.ranks_here() else {
            return Err(Status::invalid_argument(format!("malformed step for node {me}: its task counts overflow")));
        };
        if ranks.len() as u32 > MAX_TASKS_PER_NODE {
            return Err(Status::invalid_argument(format!("at most {MAX_TASKS_PER_NODE} tasks per node")));
        }
        let started = {
            let agent = agent.clone();
            let launch = launch.clone();
            tokio::task::spawn_blocking(move || {
                let mut followed = Vec::new();
                let mut inputs = Vec::new();
                for (local, rank) in ranks.clone().enumerate() {
                    let task = agent.launch_step_task(&assignment, &launch, rank, local as u32)?;
                    if let Some(end) = task.stdin {
                        inputs.push(InputEnd::new(task.dir.clone(), end));
                    }
                    followed.push(Followed {
                        rank,
                        dir: task.dir,
                        out: task.stdout.map(OutputPipe::new),
                        err: task.stderr.map(OutputPipe::new),
                        done: false,
                    });
                }
                if !inputs.is_empty() {
                    agent.step_inputs.lock().expect("step inputs lock").insert((launch.job_id, launch.step_id), inputs);
                }
                Ok::<_, crate::launch::StepLaunchError>(followed)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?
        };
        let followed = started.map_err(|message| Status::failed_precondition(format!("on {me}: {message}")))?;
        let (tx, rx) = mpsc::channel::<StepEvent>(256);
        let kill_wait = Duration::from_millis(agent.timing().kill_wait_ms);
        let inputs = (agent.clone(), (launch.job_id, launch.step_id));
        tokio::spawn(async move {
            follow(followed, tx, launch.unbuffered, kill_wait).await;
            // The step is over here (or srun gone): input no task will read is dropped.
            inputs.0.step_inputs.lock().expect("step inputs lock").remove(&inputs.1);
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let stream = futures::StreamExt::map(stream, |e| Ok(StepEnvelope { json: encode(&e) }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn step_input(&self, request: Request<Streaming<StepInputChunk>>) -> Result<Response<Empty>, Status> {
        let agent = self.0.clone();
        let caller =
            drover_auth::credential::identity_from_request(&agent.key, &request, drover_auth::credential::now_ms())?;
        let mut stream = request.into_inner();
        let mut step: Option<(u64, u32)> = None;
        while let Some(chunk) = stream.message().await? {
            let key = (chunk.job_id, chunk.step_id);
            match step {
                Some(current) if current != key => {
                    return Err(Status::invalid_argument("every chunk of a step's input names the same step"));
                }
                Some(_) => {}
                None => {
                    // The same credential as the launch: this step's, for its job's owner (or root).
                    let audience = drover_auth::credential::step_audience(key.0, key.1);
                    drover_auth::credential::check_audience(&caller, &audience)
                        .map_err(|e| Status::unauthenticated(e.to_string()))?;
                    let owner = agent.assignment(key.0).map(|a| a.job.spec.uid);
                    if caller.uid != 0 && owner != Some(caller.uid) {
                        return Err(Status::permission_denied(format!(
                            "Access/permission denied: job {} is not uid {}'s",
                            key.0, caller.uid
                        )));
                    }
                    step = Some(key);
                }
            }
            if chunk.data.len() > MAX_INPUT_CHUNK_BYTES {
                return Err(Status::invalid_argument(format!(
                    "input chunks are at most {MAX_INPUT_CHUNK_BYTES} bytes"
                )));
            }
            if chunk.data.is_empty() {
                continue;
            }
            let agent = agent.clone();
            tokio::task::spawn_blocking(move || feed(&agent, key, &chunk.data))
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        if let Some(key) = step {
            let agent = agent.clone();
            tokio::task::spawn_blocking(move || {
                let ends = agent.step_inputs.lock().expect("step inputs lock").remove(&key).unwrap_or_default();
                for end in ends {
                    end.close();
                }
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        }
        Ok(Response::new(Empty {}))
    }
}

/// Writes one chunk of srun's input to every task of the step here that still takes it. The ends are taken out
/// of the registry while written (a full pipe may wait), so the step's end can still drop what is left.
fn feed(agent: &NodeAgent, key: (u64, u32), data: &[u8]) {
    let Some(mut ends) = agent.step_inputs.lock().expect("step inputs lock").remove(&key) else { return };
    ends.retain_mut(|end| end.write_all(data));
    if !ends.is_empty() {
        agent.step_inputs.lock().expect("step inputs lock").insert(key, ends);
    }
}

/// Streams output and exits until every task ended; if `srun` goes away, stops the tasks.
async fn follow(mut tasks: Vec<Followed>, tx: mpsc::Sender<StepEvent>, unbuffered: bool, kill_wait: Duration) {
    loop {
        let (events, tasks_back) = tokio::task::spawn_blocking(move || {
            let mut events = Vec::new();
            let mut drain_budget = MAX_DRAIN_CHUNKS_PER_POLL;
            for task in tasks.iter_mut().filter(|t| !t.done) {
                let finished = match supervise::status(&task.dir) {
                    TaskStatus::Running { .. } => None,
                    TaskStatus::Finished(r) => Some((r.exit_code, r.signal)),
                    TaskStatus::Lost(_) => Some((1, 0)),
                };
                let whole = finished.is_some() || unbuffered;
                let mut drained = true;
                for (stream, stderr) in [(&mut task.out, false), (&mut task.err, true)] {
                    if let Some(stream) = stream {
                        // Whatever is in the pipe, within this poll's budget (all tasks together): a flood
                        // (`srun yes`) reaches srun a bounded share at a time while the writer waits, and never sits
                        // in the agent's memory whole. A finished task's exit waits until its output is drained.
                        loop {
                            if drain_budget == 0 {
                                drained = false;
                                break;
                            }
                            let Some(text) = stream.read(whole) else { break };
                            events.push(StepEvent::Output { rank: task.rank, stderr, text });
                            drain_budget -= 1;
                        }
                    }
                }
                // Its exit goes after all of its output: once drained (the rest comes with the next polls).
                if let Some((exit_code, signal)) = finished
                    && drained
                {
                    task.done = true;
                    events.push(StepEvent::Exited { rank: task.rank, exit_code, signal });
                }
            }
            (events, tasks)
        })
        .await
        .expect("output poll panicked");
        tasks = tasks_back;
        // While output flows, poll again at once (the pipes hold their writers back meanwhile); idle, every POLL_MS.
        let flowing = events.iter().any(|e| matches!(e, StepEvent::Output { .. }));
        for event in events {
            if tx.send(event).await.is_err() {
                stop_all(&tasks, kill_wait).await;
                return;
            }
        }
        if tasks.iter().all(|t| t.done) {
            return;
        }
        let pause = Duration::from_millis(if flowing { 0 } else { POLL_MS });
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = tx.closed() => {
                stop_all(&tasks, kill_wait).await;
                return;
            }
        }
    }
}

/// `srun` was interrupted or lost: SIGTERM, then SIGKILL after the grace period.
async fn stop_all(tasks: &[Followed], kill_wait: Duration) {
    tracing::info!(tasks = tasks.len(), "srun went away; stopping its tasks");
    let dirs: Vec<PathBuf> = tasks.iter().filter(|t| !t.done).map(|t| t.dir.clone()).collect();
    let deadline = Instant::now() + kill_wait;
    let _ = tokio::task::spawn_blocking(move || {
        for dir in &dirs {
            let _ = supervise::signal(dir, libc::SIGTERM);
        }
        while Instant::now() < deadline {
            if dirs.iter().all(|d| !matches!(supervise::status(d), TaskStatus::Running { .. })) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for dir in &dirs {
            let _ = supervise::signal(dir, libc::SIGKILL);
        }
    })
    .await;
}

//! The drill's workload: clients submitting checkpointing jobs at a steady rate, and the jobs themselves, which
//! write what they do (start, every step, every acknowledged checkpoint, end) to a log per job on shared storage.
//! Those logs are the tasks' own testimony: the checker judges placement and resumes from them, not from what
//! the controllers say happened.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use drover_client::Client;
use drover_state::JobSpec;

use crate::drill::Workload;
use crate::history::{Event, EventKind};
use crate::recorder::Recorder;

/// How long one submission may take before the client gives up and records it as failed (unknown outcome).
pub const SUBMIT_DEADLINE_MS: u64 = 10_000;

/// The job every drill runs: counts to `STEPS`, a step every `STEP_S`, records a checkpoint every `EVERY`
/// steps, resumes from `DROVER_RESUME_FROM`. Each log line is one `echo >>` (one write(2)), so lines from two
/// incarnations, were there ever two, interleave whole.
const JOB_SCRIPT: &str = r#"#!/bin/bash
log="$DRILL_LOG_DIR/$SLURM_JOB_ID.log"
inc=${SLURM_RESTART_COUNT:-0}
step=0
from=-
if [ -n "$DROVER_RESUME_FROM" ] && [ -f "$DROVER_RESUME_FROM" ]; then step=$(cat "$DROVER_RESUME_FROM"); from=$step; fi
echo "start $inc $(date +%s%3N) $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none} $from" >> "$log"
while [ "$step" -lt "$DRILL_STEPS" ]; do
  sleep "$DRILL_STEP_S"
  step=$((step + 1))
  echo "step $inc $(date +%s%3N) $SLURMD_NODENAME $step" >> "$log"
  if [ $((step % DRILL_EVERY)) -eq 0 ]; then
    f="$DROVER_CHECKPOINT_DIR/step-$step"
    echo "$step" > "$f.tmp" && mv "$f.tmp" "$f"
    if drover checkpoint record "$f" --step "$step" >/dev/null 2>&1; then
      echo "ckpt $inc $(date +%s%3N) $SLURMD_NODENAME $step" >> "$log"
    fi
  fi
done
echo "end $inc $(date +%s%3N) $SLURMD_NODENAME" >> "$log"
"#;

/// The job spec for drill job number `n`.
pub fn job_spec(workload: &Workload, n: u64, logs: &Path, client_config: &Path, controllers: &str) -> JobSpec {
    let (user, uid, gid) = drover_testkit::identity::current_user();
    let gpus = workload.gpus[(n as usize) % workload.gpus.len()];
    let drover_dir =
        std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.display().to_string())).unwrap_or_default();
    let path = format!("{drover_dir}:{}", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()));
    let dir = logs.display().to_string();
    JobSpec {
        name: format!("drill-{n}").into(),
        user: user.into(),
        uid,
        gid,
        script: JOB_SCRIPT.into(),
        work_dir: dir.clone().into(),
        submit_dir: dir.into(),
        stdout: Some("/dev/null".into()),
        stderr: Some(logs.join("%j.err").display().to_string().into()),
        min_nodes: 1,
        max_nodes: 1,
        cpus_per_task: 1,
        gpus_per_node: gpus,
        requeue: Some(true),
        environment: vec![
            ("PATH".into(), path),
            ("DROVER_CONFIG".into(), client_config.display().to_string()),
            ("DROVER_CONTROLLERS".into(), controllers.to_string()),
            ("DRILL_LOG_DIR".into(), logs.display().to_string()),
            ("DRILL_STEPS".into(), workload.steps.to_string()),
            ("DRILL_STEP_S".into(), format!("{:.3}", workload.step_ms as f64 / 1e3)),
            ("DRILL_EVERY".into(), workload.checkpoint_every.to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// Submits at `workload.submit_per_s` over `workload.clients` loops until `stop`, recording every operation.
/// Each client sends its next submission at its next slot, or at once if it is behind (a slow answer does not
/// lower the offered load for long, which is what exposes an unavailable cluster).
pub async fn submit_loops(
    client: Arc<Client>,
    workload: Workload,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
    make_spec: Arc<dyn Fn(u64) -> JobSpec + Send + Sync>,
) {
    let ops = Arc::new(AtomicU64::new(1));
    let period = Duration::from_secs_f64(workload.clients as f64 / workload.submit_per_s as f64);
    let mut tasks = Vec::new();
    for c in 0..workload.clients {
        let (client, recorder, stop, ops, make_spec) =
            (client.clone(), recorder.clone(), stop.clone(), ops.clone(), make_spec.clone());
        tasks.push(tokio::spawn(async move {
            // Spread the clients over the period rather than all at once.
            tokio::time::sleep(period.mul_f64(c as f64 / workload.clients as f64)).await;
            let mut next = tokio::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let op = ops.fetch_add(1, Ordering::Relaxed);
                let spec = make_spec(op);
                recorder.record(EventKind::SubmitSent { op });
                match client.submit(&spec).await {
                    Ok(job) => recorder.record(EventKind::SubmitAcked { op, job }),
                    Err(e) => recorder.record(EventKind::SubmitFailed { op, error: e.to_string() }),
                }
                next += period;
                tokio::time::sleep_until(next.max(tokio::time::Instant::now())).await;
                if next < tokio::time::Instant::now() - period * 4 {
                    next = tokio::time::Instant::now();
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// What one job's log says, as history events (times on the drill's clock). An incarnation that logged no end
/// (it was killed or fenced) ends at its last line plus one step: had it lived longer, it would have logged
/// another step.
pub fn events_from_job_log(job: u64, text: &str, recorder: &Recorder, step_ms: u64) -> Vec<Event> {
    let mut out = Vec::new();
    // (incarnation, node) -> (last line's time, ended cleanly)
    let mut open: std::collections::BTreeMap<(u64, String), u64> = Default::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(&what), Some(inc), Some(at), Some(node)) = (
            f.first(),
            f.get(1).and_then(|s| s.parse::<u64>().ok()),
            f.get(2).and_then(|s| s.parse::<u64>().ok()),
            f.get(3).map(|s| s.to_string()),
        ) else {
            continue; // a torn line (its job was killed mid-write): the lines around it still count
        };
        let at_ms = recorder.from_unix_ms(at);
        match what {
            "start" => {
                let gpus = f.get(4).map(|g| g.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_default();
                let from_step = f.get(5).and_then(|s| s.parse().ok());
                out.push(Event {
                    at_ms,
                    kind: EventKind::IncarnationStarted { job, incarnation: inc, node: node.clone(), gpus },
                });
                out.push(Event { at_ms, kind: EventKind::Resumed { job, incarnation: inc, from_step } });
                open.insert((inc, node), at_ms);
            }
            "step" => {
                open.insert((inc, node), at_ms);
            }
            "ckpt" => {
                if let Some(step) = f.get(4).and_then(|s| s.parse().ok()) {
                    out.push(Event { at_ms, kind: EventKind::CheckpointAcked { job, incarnation: inc, step } });
                }
                open.insert((inc, node), at_ms);
            }
            "end" => {
                open.remove(&(inc, node.clone()));
                out.push(Event { at_ms, kind: EventKind::IncarnationEnded { job, incarnation: inc, node } });
            }
            _ => {}
        }
    }
    for ((incarnation, node), last_ms) in open {
        out.push(Event { at_ms: last_ms + step_ms, kind: EventKind::IncarnationEnded { job, incarnation, node } });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_log_becomes_incarnations_checkpoints_and_resumes() {
        let mut recorder = Recorder::new();
        recorder.epoch_ms = 1_000_000;
        let log = "start 0 1000100 node01 2,3 -\nstep 0 1000300 node01 1\nckpt 0 1000350 node01 1\n\
                   step 0 1000500 node01 2\nstep 0 10\nstart 1 1002000 node02 0,1 1\nstep 1 1002200 node02 2\n\
                   end 1 1002300 node02\n";
        let events = events_from_job_log(7, log, &recorder, 200);
        let kinds: Vec<(u64, EventKind)> = events.into_iter().map(|e| (e.at_ms, e.kind)).collect();
        let node = |n: &str| n.to_string();
        assert_eq!(
            kinds,
            vec![
                (100, EventKind::IncarnationStarted { job: 7, incarnation: 0, node: node("node01"), gpus: vec![2, 3] }),
                (100, EventKind::Resumed { job: 7, incarnation: 0, from_step: None }),
                (350, EventKind::CheckpointAcked { job: 7, incarnation: 0, step: 1 }),
                (
                    2000,
                    EventKind::IncarnationStarted { job: 7, incarnation: 1, node: node("node02"), gpus: vec![0, 1] }
                ),
                (2000, EventKind::Resumed { job: 7, incarnation: 1, from_step: Some(1) }),
                (2300, EventKind::IncarnationEnded { job: 7, incarnation: 1, node: node("node02") }),
                // Incarnation 0 logged no end: it ends one step after its last line.
                (700, EventKind::IncarnationEnded { job: 7, incarnation: 0, node: node("node01") }),
            ]
        );
    }
}

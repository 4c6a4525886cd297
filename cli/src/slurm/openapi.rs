//! Jobs as Slurm 22.05's `squeue --json` prints them (the `openapi/v0.0.38` data parser): the document's
//! `meta`, `errors` and `jobs`, every key of Slurm's job object present. Values Drover has come from the job;
//! what Drover has no notion of reads as Slurm writes it for a job that does not use it (`""`, `0`, `null`).

use drover_state::hostlist::compress_hostlist;
use drover_state::job::MemRequest;
use drover_state::{Job, JobState};
use serde_json::{Value, json};

use crate::format::{Tres, group_name, job_reason, tres_per_job, tres_per_node, tres_per_task};

/// The Slurm release whose interface Drover implements (as `sbatch --version` reports it).
const RELEASE: (u32, u32, u32) = (22, 5, 11);

/// The whole document for `jobs` (one record per job, or per group of pending array tasks, as squeue's lines).
pub fn jobs_document(jobs: &[Value]) -> Value {
    let (major, minor, micro) = RELEASE;
    json!({
        "meta": {
            "plugin": { "type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38" },
            "Slurm": {
                "version": { "major": major, "micro": micro, "minor": minor },
                "release": format!("{major}.{minor:02}.{micro}"),
            },
        },
        "errors": [],
        "jobs": jobs,
    })
}

/// One job's object. `group` is the task range of a group of pending array tasks (`2-3%2`), shown as one
/// record whose `job_id` is the array's and `array_task_id` is null, as Slurm's.
pub fn job_object(job: &Job, cluster: &str, group: Option<&str>) -> Value {
    let facts = Facts::of(job);
    let mut object = identity_fields(job, &facts, cluster, group);
    if let Some(map) = object.as_object_mut() {
        for part in [placement_fields(job, &facts, group), time_and_tres_fields(job, &facts)] {
            if let Value::Object(fields) = part {
                map.extend(fields);
            }
        }
        if let Some(resources) = job_resources(job, &facts) {
            map.insert("job_resources".into(), resources);
        }
    }
    object
}

/// What several fields derive from.
struct Facts {
    running: bool,
    held: bool,
    requested: Tres,
    allocated: Option<Tres>,
}

impl Facts {
    fn of(job: &Job) -> Facts {
        Facts {
            running: !job.nodes.is_empty(),
            held: job.held && job.state == JobState::Pending,
            requested: Tres::requested(job),
            allocated: Tres::allocated(job),
        }
    }
}

/// Seconds since the epoch, 0 for none (as Slurm writes an unset time).
fn secs(ms: Option<u64>) -> u64 {
    ms.map_or(0, |ms| ms / 1000)
}

/// slurmctld's TRES string (`cpu=2,mem=16000M,node=1,billing=2`).
fn tres_str(t: &Tres) -> String {
    let mut parts = vec![format!("cpu={}", t.cpu)];
    if t.mem_mb > 0 {
        parts.push(format!("mem={}M", t.mem_mb));
    }
    parts.push(format!("node={}", t.node));
    parts.push(format!("billing={}", t.cpu));
    if t.gpus > 0 {
        parts.push(format!("gres/gpu={}", t.gpus));
    }
    parts.join(",")
}

/// The nodes, cores and memory a running job holds (absent while it holds none).
fn job_resources(job: &Job, f: &Facts) -> Option<Value> {
    let t = f.allocated.as_ref()?;
    let nodes: Vec<Value> = job
        .allocation
        .iter()
        .map(|a| json!({ "nodename": a.node.as_str(), "cpus_used": 0, "memory_used": 0, "memory_allocated": a.mem_mb }))
        .collect();
    Some(json!({
        "nodes": compress_hostlist(&job.nodes),
        "allocated_cores": t.cpu,
        "allocated_hosts": job.nodes.len(),
        "allocated_nodes": nodes,
    }))
}

/// Ids, owner's request flags, dependency, exit code, times of eligibility and end.
fn identity_fields(job: &Job, f: &Facts, cluster: &str, group: Option<&str>) -> Value {
    let s = &job.spec;
    let (running, held, allocated) = (f.running, f.held, &f.allocated);
    let array = job.array.as_deref();
    let end_s = match (job.end_time_ms, job.limit_end_ms()) {
        (Some(end), _) => end / 1000,
        (None, Some(limit_end)) if running => limit_end / 1000,
        _ => 0,
    };
    let dependency =
        drover_state::dependency::format_dependency_status(&s.dependency, s.dependency_any, &job.dependency_state);
    json!({
        "account": job.account_name(),
        "accrue_time": if held { 0 } else { secs(Some(job.submit_time_ms)) },
        "admin_comment": "",
        "array_job_id": array.map_or(0, |a| a.array_job_id),
        "array_task_id": if group.is_some() { Value::Null } else { array.map_or(Value::Null, |a| json!(a.task_id)) },
        "array_max_tasks": array.and_then(|a| a.max_running).unwrap_or(0),
        "array_task_string": group.unwrap_or(""),
        "association_id": 0,
        "batch_features": "",
        "batch_flag": !s.interactive,
        "batch_host": if running { job.nodes[0].as_str() } else { "" },
        "flags": if job.start_time_ms.is_some() { json!(["JOB_WAS_RUNNING"]) } else { json!([]) },
        "burst_buffer": "",
        "burst_buffer_state": "",
        "cluster": cluster,
        "cluster_features": "",
        "command": "",
        "comment": s.comment.as_deref().unwrap_or(""),
        "container": "",
        "contiguous": false,
        "core_spec": null,
        "thread_spec": null,
        "cores_per_socket": null,
        "billable_tres": allocated.as_ref().map_or(Value::Null, |t| json!(t.cpu as f64)),
        "cpus_per_task": if s.cpus_per_task != 1 { json!(s.cpus_per_task) } else { Value::Null },
        "cpu_frequency_minimum": null,
        "cpu_frequency_maximum": null,
        "cpu_frequency_governor": null,
        "cpus_per_tres": "",
        "deadline": 0,
        "delay_boot": 0,
        "dependency": if dependency == "(null)" { String::new() } else { dependency },
        "derived_exit_code": 0,
        "eligible_time": if held { 0 } else { secs(Some(job.submit_time_ms)) },
        "end_time": end_s,
        "excluded_nodes": "",
        "exit_code": (job.exit_code << 8) | job.exit_signal,
        "features": "",
    })
}

/// Where it runs and what it asked for: GPUs, group, state, nodes, tasks, CPUs, memory.
fn placement_fields(job: &Job, f: &Facts, group: Option<&str>) -> Value {
    let s = &job.spec;
    let (running, requested, allocated) = (f.running, &f.requested, &f.allocated);
    let array = job.array.as_deref();
    let gres_detail: Vec<String> = job
        .allocation
        .iter()
        .filter(|a| !a.gpus.is_empty())
        .map(|a| {
            let idx: Vec<String> = a.gpus.iter().map(u32::to_string).collect();
            format!("gpu:{}(IDX:{})", a.gpus.len(), idx.join(","))
        })
        .collect();
    json!({
        "federation_origin": "",
        "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": gres_detail,
        "group_id": s.gid,
        "group_name": group_name(s.gid),
        "job_id": if group.is_some() { array.map_or(job.id, |a| a.array_job_id) } else { job.id },
        "job_state": job.shown_state().name(),
        "last_sched_evaluation": secs(Some(job.submit_time_ms)),
        "licenses": "",
        "max_cpus": 0,
        "max_nodes": 0,
        "mcs_label": "",
        "memory_per_tres": "",
        "name": s.name.as_str(),
        "nodes": if running { compress_hostlist(&job.nodes) } else { String::new() },
        "nice": if s.nice != 0 { json!(s.nice) } else { Value::Null },
        "tasks_per_core": null,
        "tasks_per_node": s.ntasks_per_node.unwrap_or(0),
        "tasks_per_socket": null,
        "tasks_per_board": 0,
        "cpus": requested.cpu,
        "node_count": allocated.as_ref().map_or(requested.node, |t| t.node),
        // Slurm's array records carry the task count sbatch set (1); a plain job without -n has none.
        "tasks": s.ntasks.or(array.map(|_| 1)).map_or(Value::Null, |n| json!(n)),
        "het_job_id": 0,
        "het_job_id_set": "",
        "het_job_offset": 0,
        "partition": job.partition.as_str(),
        "prefer": "",
        "memory_per_node": match s.mem_request() { Some(MemRequest::PerNode(mb)) => json!(mb), _ => Value::Null },
        "memory_per_cpu": match s.mem_request() { Some(MemRequest::PerCpu(mb)) => json!(mb), _ => Value::Null },
        "minimum_cpus_per_node": 1,
        "minimum_tmp_disk_per_node": 0,
        "preempt_time": 0,
    })
}

/// Priority, requeue, reason, times, time limit, TRES, owner and directory.
fn time_and_tres_fields(job: &Job, f: &Facts) -> Value {
    let s = &job.spec;
    let (held, requested, allocated) = (f.held, &f.requested, &f.allocated);
    json!({
        "pre_sus_time": 0,
        "priority": if held { 0 } else { 1 },
        "profile": null,
        "qos": job.qos_name(),
        "reboot": false,
        "required_nodes": "",
        "requeue": s.requeue.unwrap_or(true),
        "resize_time": 0,
        "restart_cnt": job.restarts(),
        "resv_name": s.reservation.as_deref().unwrap_or(""),
        "shared": null,
        "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
        "sockets_per_board": 0,
        "sockets_per_node": null,
        "start_time": secs(job.start_time_ms),
        "state_description": "",
        "state_reason": job_reason(job),
        "standard_error": "",
        "standard_input": "/dev/null",
        "standard_output": "",
        "submit_time": secs(Some(job.submit_time_ms)),
        "suspend_time": secs(job.suspended_since()),
        "system_comment": "",
        "time_limit": job.time_limit_s.map_or(Value::Null, |t| json!(t / 60)),
        "time_minimum": 0,
        "threads_per_core": null,
        "tres_bind": "",
        "tres_freq": "",
        "tres_per_job": tres_per_job(job).unwrap_or_default(),
        "tres_per_node": tres_per_node(job).unwrap_or_default(),
        "tres_per_socket": "",
        "tres_per_task": tres_per_task(job).unwrap_or_default(),
        "tres_req_str": tres_str(requested),
        "tres_alloc_str": allocated.as_ref().map(tres_str).unwrap_or_default(),
        "user_id": s.uid,
        "user_name": s.user.as_str(),
        "wckey": s.wckey.as_deref().unwrap_or(""),
        "current_working_directory": s.work_dir.as_str(),
    })
}

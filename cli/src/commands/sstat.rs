//! `sstat -j JOB[.STEP] [-o FIELDS] [-p|-P] [-n] [-a]`: the status of running job steps, in Slurm 22.05's
//! columns and parsable layouts (the print_fields of `sacct`).
//!
//! What Drover can say, and what it cannot: the controllers know which jobs run where, that a batch job's batch
//! step runs on its first node, and which `srun` steps were started and have not ended (step records, kept
//! through the log). Agents sample no usage while tasks run (CPU time and peak memory reach the controllers
//! when a job ends, for `sacct`). So sstat reports running steps with their ids, nodes and task counts, and
//! leaves every usage field (MaxRSS, AveCPU, the TRES usage strings, ...) empty rather than print numbers it
//! does not have.

use crate::command::Common;
use clap::Parser;
use drover_state::hostlist::compress_hostlist;
use drover_state::{Job, JobState};

use crate::slurm::fields::{FieldDef, Kind, Layout, def, header, help_format_in, parse_fields_in, row};

/// Slurm 22.05's default fields (`STAT_FIELDS`).
const DEFAULT_FIELDS: &str = "jobid,maxvmsize,maxvmsizenode,maxvmsizetask,avevmsize,maxrss,maxrssnode,maxrsstask,averss,maxpages,maxpagesnode,maxpagestask,avepages,mincpu,mincpunode,mincputask,avecpu,ntasks,avecpufreq,reqcpufreqmin,reqcpufreqmax,reqcpufreqgov,consumedenergy,maxdiskread,maxdiskreadnode,maxdiskreadtask,avediskread,maxdiskwrite,maxdiskwritenode,maxdiskwritetask,avediskwrite,tresusageinave,tresusageinmax,tresusageinmaxn,tresusageinmaxt,tresusageinmin,tresusageinminn,tresusageinmint,tresusageintot,tresusageoutave,tresusageoutmax,tresusageoutmaxn,tresusageoutmaxt,tresusageoutmin,tresusageoutminn,tresusageoutmint,tresusageouttot";
/// `-i` (`--pidformat`): the fields added.
const PID_FIELDS: &str = "jobid,nodelist,pids";
/// The most jobs and steps one invocation asks about.
const MAX_STEPS: usize = 1_000;

use Kind::{Number, Text};

/// Slurm 22.05's sstat fields, in its order (a prefix picks the first match).
const FIELDS: &[FieldDef] = &[
    def("AveCPU", 10, Text),
    def("AveCPUFreq", 10, Text),
    def("AveDiskRead", 12, Text),
    def("AveDiskWrite", 12, Text),
    def("AvePages", 10, Text),
    def("AveRSS", 10, Text),
    def("AveVMSize", 10, Text),
    def("ConsumedEnergy", 14, Text),
    def("ConsumedEnergyRaw", 17, Number),
    def("JobID", -12, Text),
    def("MaxDiskRead", 12, Text),
    def("MaxDiskReadNode", 15, Text),
    def("MaxDiskReadTask", 15, Number),
    def("MaxDiskWrite", 12, Text),
    def("MaxDiskWriteNode", 16, Text),
    def("MaxDiskWriteTask", 16, Number),
    def("MaxPages", 8, Text),
    def("MaxPagesNode", 12, Text),
    def("MaxPagesTask", 14, Number),
    def("MaxRSS", 10, Text),
    def("MaxRSSNode", 10, Text),
    def("MaxRSSTask", 10, Number),
    def("MaxVMSize", 10, Text),
    def("MaxVMSizeNode", 14, Text),
    def("MaxVMSizeTask", 14, Number),
    def("MinCPU", 10, Text),
    def("MinCPUNode", 10, Text),
    def("MinCPUTask", 10, Number),
    def("Nodelist", 20, Text),
    def("NTasks", 8, Number),
    def("Pids", 20, Text),
    def("ReqCPUFreq", 10, Text),
    def("ReqCPUFreqMin", 13, Text),
    def("ReqCPUFreqMax", 13, Text),
    def("ReqCPUFreqGov", 13, Text),
    def("TRESUsageInAve", 14, Text),
    def("TRESUsageInMax", 14, Text),
    def("TRESUsageInMaxNode", 18, Text),
    def("TRESUsageInMaxTask", 18, Text),
    def("TRESUsageInMin", 14, Text),
    def("TRESUsageInMinNode", 18, Text),
    def("TRESUsageInMinTask", 18, Text),
    def("TRESUsageInTot", 14, Text),
    def("TRESUsageOutAve", 15, Text),
    def("TRESUsageOutMax", 15, Text),
    def("TRESUsageOutMaxNode", 19, Text),
    def("TRESUsageOutMaxTask", 19, Text),
    def("TRESUsageOutMin", 15, Text),
    def("TRESUsageOutMinNode", 19, Text),
    def("TRESUsageOutMinTask", 19, Text),
    def("TRESUsageOutTot", 15, Text),
];

#[derive(Parser, Debug)]
#[command(name = "sstat", disable_help_flag = true, disable_version_flag = true, about = "Status of running job steps")]
struct Args {
    /// Every step, the batch step included (else only the steps `srun` started).
    #[arg(short = 'a', long = "allsteps")]
    all_steps: bool,
    /// The field names.
    #[arg(short = 'e', long = "helpformat")]
    helpformat: bool,
    #[arg(short = 'h', long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Job ids, each `JOB` or `JOB.STEP` (comma-separated, repeatable).
    #[arg(short = 'j', long = "jobs")]
    jobs: Vec<String>,
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// Fields (comma-separated names or prefixes, `%N` sets a width).
    #[arg(short = 'o', long = "format", alias = "fields")]
    format: Vec<String>,
    /// The node and process ids of each step.
    #[arg(short = 'i', long = "pidformat")]
    pidformat: bool,
    /// `|` after every field.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    /// `|` between fields.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    #[arg(long = "noconvert")]
    noconvert: bool,
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[arg(long = "usage")]
    usage: bool,
    #[command(flatten)]
    common: Common,
    /// A job list given without `-j`.
    #[arg(hide = true)]
    operands: Vec<String>,
}

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("sstat", sstat(args))
}

/// A step asked about: `12`, `12.batch`, `12.3`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepRef {
    job: u64,
    step: Option<String>,
}

fn parse_steps(lists: &[String]) -> anyhow::Result<Vec<StepRef>> {
    let mut steps = Vec::new();
    for item in lists.iter().flat_map(|l| l.split(',')).filter(|s| !s.is_empty()) {
        let (job, step) = match item.split_once('.') {
            Some((job, step)) => (job, Some(step.to_string())),
            None => (item, None),
        };
        let job = job.parse().map_err(|_| anyhow::anyhow!("Bad job/step specified: {item}"))?;
        if step.as_deref().is_some_and(|s| !matches!(s, "batch" | "extern") && s.parse::<u32>().is_err()) {
            anyhow::bail!("Bad job/step specified: {item}");
        }
        steps.push(StepRef { job, step });
        if steps.len() > MAX_STEPS {
            anyhow::bail!("more than {MAX_STEPS} jobs and steps asked for");
        }
    }
    Ok(steps)
}

fn sstat(args: &[String]) -> anyhow::Result<i32> {
    let args: Args = crate::command::parse_args("sstat", args)?;
    if args.version {
        println!("{}", crate::format::version_line());
        return Ok(0);
    }
    if args.usage {
        println!("Usage: sstat [options] -j <job(.stepid)>\n       Use --help for help");
        return Ok(0);
    }
    if args.helpformat {
        print!("{}", help_format_in(FIELDS));
        return Ok(0);
    }
    let _ = (args.noconvert, args.verbose);
    let mut spec = args.format.join(",");
    if args.pidformat {
        spec = if spec.is_empty() { PID_FIELDS.to_string() } else { format!("{PID_FIELDS},{spec}") };
    }
    let fields = parse_fields_in(if spec.is_empty() { DEFAULT_FIELDS } else { &spec }, FIELDS)?;
    let mut lists = args.jobs.clone();
    lists.extend(args.operands.first().cloned());
    let steps = parse_steps(&lists)?;
    if steps.is_empty() {
        anyhow::bail!("You didn't give me any jobs to stat.");
    }
    let layout = match (args.parsable, args.parsable2) {
        (_, true) => Layout::Parsable { delimiter: "|".into(), trailing: false },
        (true, false) => Layout::Parsable { delimiter: "|".into(), trailing: true },
        _ => Layout::Columns,
    };
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&header(&fields, &layout));
    }
    for wanted in &steps {
        let job = match rt.block_on(client.get_job(wanted.job, false, false)) {
            Ok((job, _)) => job,
            Err(drover_client::ClientError::NotFound(_)) => {
                eprintln!("sstat: error: couldn't get steps for job {}", wanted.job);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match running_steps(&job, wanted, args.all_steps) {
            Ok(found) => {
                for step in found {
                    let values: Vec<String> = fields.iter().map(|f| value(f.name(), &job, &step)).collect();
                    out.push_str(&row(&fields, &values, &layout));
                }
            }
            Err(message) => eprintln!("sstat: error: {message}"),
        }
    }
    print!("{out}");
    // As Slurm's sstat: steps not found running are errors on stderr, not a failed run.
    Ok(0)
}

/// A step sstat can vouch for: its id (`batch`, `0`), where it runs and how many tasks it has.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    id: String,
    nodes: String,
    tasks: u32,
}

/// No step of the job answers the request, in Slurm's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NoSteps {
    #[error("No steps running for job {0}")]
    Running(u64),
    #[error("{0}.{1} not found running.")]
    Step(u64, String),
}

/// The steps of `job` that answer `wanted`, or Slurm's error when none does. Without a step named, the running
/// `srun` steps (and the batch step with `-a`, or when no `srun` step runs, so that the job is not shown empty).
fn running_steps(job: &Job, wanted: &StepRef, all_steps: bool) -> Result<Vec<Step>, NoSteps> {
    let id = job.id;
    let not_running = || match &wanted.step {
        None => NoSteps::Running(id),
        Some(step) => NoSteps::Step(id, step.clone()),
    };
    if job.state != JobState::Running {
        return Err(not_running());
    }
    let batch = (!job.spec.interactive).then(|| Step { id: "batch".into(), nodes: job.nodes[0].clone(), tasks: 1 });
    let sruns = job.steps.iter().filter(|s| s.end.is_none()).map(|s| Step {
        id: s.id.to_string(),
        nodes: compress_hostlist(&s.nodes),
        tasks: s.tasks,
    });
    let found: Vec<Step> = match wanted.step.as_deref() {
        None => {
            let sruns: Vec<Step> = sruns.collect();
            let with_batch = all_steps || sruns.is_empty();
            batch.filter(|_| with_batch).into_iter().chain(sruns).collect()
        }
        Some("batch") => batch.into_iter().collect(),
        Some(step) => sruns.filter(|s| s.id == step).collect(),
    };
    if found.is_empty() { Err(not_running()) } else { Ok(found) }
}

/// A field's value for one step: what Drover knows, empty for the usage it does not sample while tasks run.
fn value(field: &str, job: &Job, step: &Step) -> String {
    match field {
        "JobID" => format!("{}.{}", job.id, step.id),
        "Nodelist" => step.nodes.clone(),
        "NTasks" => step.tasks.to_string(),
        // No frequency was asked for (Slurm prints its NO_VAL so).
        "ReqCPUFreq" | "ReqCPUFreqMin" | "ReqCPUFreqMax" | "ReqCPUFreqGov" => "Unknown".to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use drover_state::JobSpec;

    use super::*;

    fn running(interactive: bool) -> Job {
        Job {
            id: 12,
            state: JobState::Running,
            spec: JobSpec { interactive, ..JobSpec::default() },
            nodes: vec!["node01".into(), "node02".into()].into(),
            next_step_id: 2,
            ..Job::default()
        }
    }

    #[test]
    fn job_and_step_lists_parse_as_slurm_takes_them() {
        let steps = parse_steps(&["12,13.batch".to_string(), "14.0".to_string()]).unwrap();
        assert_eq!(steps[1], StepRef { job: 13, step: Some("batch".into()) });
        assert_eq!(steps.len(), 3);
        assert!(parse_steps(&["12.x".to_string()]).unwrap_err().to_string().contains("Bad job/step specified: 12.x"));
    }

    #[test]
    fn running_srun_steps_are_reported_and_the_batch_step_with_a_or_alone() {
        use drover_state::{StepEnd, StepRecord};
        let whole = StepRef { job: 12, step: None };
        let ids = |steps: Vec<Step>| steps.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(running_steps(&running(false), &whole, false).unwrap()), ["batch"], "no srun step runs");
        let record =
            |id, end| StepRecord { id, name: "app".into(), nodes: vec!["node02".into()], tasks: 4, start_ms: 0, end };
        let ended = StepEnd { end_ms: 5, exit_code: 0, signal: 0, cancelled: false };
        let job = Job { steps: vec![record(0, Some(ended)), record(1, None)].into(), ..running(false) };
        assert_eq!(ids(running_steps(&job, &whole, false).unwrap()), ["1"]);
        assert_eq!(ids(running_steps(&job, &whole, true).unwrap()), ["batch", "1"]);
        let one = running_steps(&job, &StepRef { job: 12, step: Some("1".into()) }, false).unwrap();
        assert_eq!(one, [Step { id: "1".into(), nodes: "node02".into(), tasks: 4 }]);
        let done = StepRef { job: 12, step: Some("0".into()) };
        assert_eq!(running_steps(&job, &done, false).unwrap_err().to_string(), "12.0 not found running.");
        assert_eq!(running_steps(&running(true), &whole, false).unwrap_err(), NoSteps::Running(12));
        let finished = Job { state: JobState::Completed, ..running(false) };
        assert_eq!(running_steps(&finished, &whole, false).unwrap_err().to_string(), "No steps running for job 12");
    }

    #[test]
    fn known_fields_have_values_and_usage_fields_stay_empty() {
        let fields = parse_fields_in("jobid,nodelist,ntasks,maxrss,avecpu", FIELDS).unwrap();
        let job = running(false);
        let step = Step { id: "batch".into(), nodes: "node01".into(), tasks: 1 };
        let values: Vec<String> = fields.iter().map(|f| value(f.name(), &job, &step)).collect();
        assert_eq!(values, ["12.batch", "node01", "1", "", ""]);
        let layout = Layout::Parsable { delimiter: "|".into(), trailing: false };
        assert_eq!(row(&fields, &values, &layout), "12.batch|node01|1||\n");
        assert_eq!(header(&fields, &layout), "JobID|Nodelist|NTasks|MaxRSS|AveCPU\n");
        let bogus = parse_fields_in("bogus", FIELDS).map(|_| ()).unwrap_err();
        assert_eq!(bogus.to_string(), "Invalid field requested: \"bogus\"");
    }
}

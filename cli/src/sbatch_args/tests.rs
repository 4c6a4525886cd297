use super::*;
use crate::slurm::time::{ACCEPTED_DATE_FORMATS, civil_from_days, days_from_civil};
use drover_state::job::{ArraySpec, Dependency, DependencyKind, ExportPolicy, MemRequest};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn ctx() -> SubmitContext {
    SubmitContext {
        user: "alice".into(),
        uid: 1000,
        gid: 100,
        cwd: "/home/alice/work".into(),
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), "/home/alice".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ],
        // Tuesday 2026-03-10, 14:30:15 local time, one hour east of UTC.
        now_ms: NOW_MS,
        utc_offset_s: 3_600,
        sbatch_env: true,
        submission: None,
    }
}

/// 2026-03-10T13:30:15Z.
const NOW_MS: u64 = 1_773_149_415_000;

const SCRIPT: &str = "#!/bin/bash\necho hi\n";

/// Parses the command line and builds with `script` (or none for --wrap).
fn submit(list: &[&str], script: Option<&str>) -> Result<ParsedSubmit, SbatchError> {
    let cmd = parse_command_line(&args(list))?;
    build_spec(&cmd, script, &ctx())
}

fn spec(list: &[&str], script: &str) -> JobSpec {
    submit(list, Some(script)).unwrap_or_else(|e| panic!("{list:?}: {e}")).spec
}

fn cmd_err(list: &[&str]) -> String {
    match parse_command_line(&args(list)) {
        Ok(cmd) => panic!("{list:?} should fail, got {cmd:?}"),
        Err(e) => e.to_string(),
    }
}

fn script_err(script: &str) -> SbatchError {
    let cmd = parse_command_line(&args(&["job.sh"])).unwrap();
    build_spec(&cmd, Some(script), &ctx()).expect_err("should fail")
}

fn warnings(list: &[&str]) -> Vec<String> {
    submit(list, Some(SCRIPT)).unwrap_or_else(|e| panic!("{list:?}: {e}")).warnings
}

// ---- defaults ----

#[test]
fn defaults_for_a_script_file() {
    let parsed = submit(&["dir/train.sh"], Some(SCRIPT)).unwrap();
    assert!(!parsed.parsable);
    assert_eq!(parsed.script_path.as_deref(), Some("dir/train.sh"));
    let s = parsed.spec;
    assert_eq!(s.name, "train.sh");
    assert_eq!(s.partition, None);
    assert_eq!(s.account, None);
    assert_eq!((s.user.as_str(), s.uid, s.gid), ("alice", 1000, 100));
    assert_eq!(s.script, SCRIPT);
    assert!(s.script_args.is_empty());
    assert_eq!(s.work_dir, "/home/alice/work");
    assert_eq!(s.submit_dir, "/home/alice/work");
    assert_eq!((s.stdout, s.stderr), (None, None));
    assert_eq!((s.min_nodes, s.max_nodes), (1, 1));
    assert_eq!((s.ntasks, s.ntasks_per_node), (None, None));
    assert_eq!(s.cpus_per_task, 1);
    assert_eq!((s.gpus_per_node, s.gpu_type), (0, None));
    assert_eq!(s.time_limit_s, None);
    assert_eq!(s.requeue, None);
    assert!(!s.hold);
    assert_eq!(s.export, ExportPolicy::All);
    assert_eq!(s.environment, ctx().env);
    assert_eq!((s.qos, s.reservation, s.nice), (None, None, 0));
    assert_eq!((s.dependency.to_vec(), s.dependency_any), (vec![], false));
    assert_eq!(s.array, None);
    assert_eq!((s.gpus_total, s.gpus_per_task), (None, None));
}

#[test]
fn name_defaults_to_base_name() {
    assert_eq!(spec(&["/abs/path/run.sbatch"], SCRIPT).name, "run.sbatch");
    assert_eq!(spec(&["run"], SCRIPT).name, "run");
}

#[test]
fn script_from_stdin_is_named_sbatch() {
    let parsed = submit(&["-N", "2"], Some(SCRIPT)).unwrap();
    assert_eq!(parsed.spec.name, "sbatch");
    assert_eq!(parsed.script_path, None);
    assert_eq!(parsed.spec.min_nodes, 2);
}

#[test]
fn no_script_and_no_wrap() {
    let err = submit(&["-N", "2"], None).unwrap_err();
    assert_eq!(err, SbatchError::NoScript);
    assert_eq!(err.to_string(), "no batch script given; pass a script file or --wrap");
}

// ---- every flag form ----

#[test]
fn every_value_option_in_every_form() {
    // (long, short, value, check)
    type Check = fn(&JobSpec) -> bool;
    let cases: &[(&str, Option<&str>, &str, Check)] = &[
        ("job-name", Some("J"), "myjob", |s| s.name == "myjob"),
        ("partition", Some("p"), "gpu", |s| s.partition.as_deref() == Some("gpu")),
        ("account", Some("A"), "proj1", |s| s.account.as_deref() == Some("proj1")),
        ("nodes", Some("N"), "3", |s| (s.min_nodes, s.max_nodes) == (3, 3)),
        ("ntasks", Some("n"), "16", |s| s.ntasks == Some(16)),
        ("ntasks-per-node", None, "8", |s| s.ntasks_per_node == Some(8)),
        ("cpus-per-task", Some("c"), "4", |s| s.cpus_per_task == 4),
        ("gres", None, "gpu:2", |s| s.gpus_per_node == 2 && s.gpu_type.is_none()),
        ("gpus-per-node", None, "h100:8", |s| s.gpus_per_node == 8 && s.gpu_type.as_deref() == Some("h100")),
        ("time", Some("t"), "1:30:00", |s| s.time_limit_s == Some(5400)),
        ("output", Some("o"), "out-%j.txt", |s| s.stdout.as_deref() == Some("out-%j.txt")),
        ("error", Some("e"), "err-%j.txt", |s| s.stderr.as_deref() == Some("err-%j.txt")),
        ("chdir", Some("D"), "/scratch", |s| s.work_dir == "/scratch"),
        ("export", None, "NONE", |s| s.export == ExportPolicy::None && s.environment.is_empty()),
        ("array", Some("a"), "1-3%2", |s| {
            s.array == Some(ArraySpec { task_ids: vec![1, 2, 3].into(), max_running: Some(2) })
        }),
        ("dependency", Some("d"), "afterok:12_3", |s| {
            s.dependency == [Dependency { kind: DependencyKind::AfterOk, job: 12, task: Some(3) }] && !s.dependency_any
        }),
        ("qos", Some("q"), "high", |s| s.qos.as_deref() == Some("high")),
        ("reservation", None, "maint", |s| s.reservation.as_deref() == Some("maint")),
        ("gpus", Some("G"), "a100:4", |s| {
            s.gpus_total == Some(4) && s.gpus_per_node == 0 && s.gpu_type.as_deref() == Some("a100")
        }),
        ("mem", None, "4G", |s| s.mem == Some(MemRequest::PerNode(4096))),
        ("mem-per-cpu", None, "2000", |s| s.mem == Some(MemRequest::PerCpu(2000))),
        ("tasks-per-node", None, "4", |s| s.ntasks_per_node == Some(4)),
        ("time-min", None, "30", |s| s.time_min_s == Some(1800)),
        ("begin", Some("b"), "now+60", |s| s.begin_ms == Some(NOW_MS + 60_000)),
        ("deadline", None, "now+1hour", |s| s.deadline_ms == Some(NOW_MS + 3_600_000)),
        ("wckey", None, "proj", |s| s.wckey.as_deref() == Some("proj")),
        ("comment", None, "a note", |s| s.comment.as_deref() == Some("a note")),
        ("signal", None, "USR1@90", |s| s.signal.is_some_and(|w| w.before_s == 90)),
    ];
    for (long, short, value, check) in cases {
        let mut forms = vec![vec![format!("--{long}={value}")], vec![format!("--{long}"), value.to_string()]];
        if let Some(short) = short {
            forms.push(vec![format!("-{short}{value}")]);
            forms.push(vec![format!("-{short}"), value.to_string()]);
        }
        for mut form in forms {
            form.push("job.sh".to_string());
            let cmd = parse_command_line(&form).unwrap_or_else(|e| panic!("{form:?}: {e}"));
            assert_eq!(cmd.script_path.as_deref(), Some("job.sh"), "{form:?}");
            let s = build_spec(&cmd, Some(SCRIPT), &ctx()).unwrap().spec;
            assert!(check(&s), "{form:?} gave {s:?}");
        }
    }
}

/// Issue 30: Slurm's sbatch answers --version/-V, --help/-h and --usage with exit 0 and submits nothing (checked
/// against Debian's Slurm 22.05); Drover refused them as unknown options.
#[test]
fn version_help_and_usage_print_instead_of_submitting() {
    let line = |args: &[&str]| parse_command_line(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).unwrap();
    assert_eq!(line(&["--version"]).info, Some(Info::Version));
    assert_eq!(line(&["-V"]).info, Some(Info::Version));
    assert_eq!(line(&["-Q", "-h", "job.sh"]).info, Some(Info::Help), "before the script, with other options");
    assert_eq!(line(&["--usage", "--version"]).info, Some(Info::Usage), "the first one wins");
    assert_eq!(line(&["job.sh", "--version"]).info, None, "after the script: the script's own argument");
    assert!(Info::Version.text().starts_with("slurm 22.05"));
    assert!(Info::Help.text().contains("--job-name/-J"));
    // A directive cannot make sbatch print and submit nothing.
    let parsed = build_spec(&line(&[]), Some("#!/bin/sh\n#SBATCH --version\ntrue\n"), &ctx()).unwrap();
    assert_eq!(parsed.spec.name, "sbatch");
}

#[test]
fn value_less_flags() {
    let s = spec(&["--requeue", "job.sh"], SCRIPT);
    assert_eq!(s.requeue, Some(true));
    let s = spec(&["--no-requeue", "job.sh"], SCRIPT);
    assert_eq!(s.requeue, Some(false));
    let s = spec(&["--requeue", "--no-requeue", "job.sh"], SCRIPT);
    assert_eq!(s.requeue, Some(false));
    assert!(spec(&["--hold", "job.sh"], SCRIPT).hold);
    assert!(spec(&["-H", "job.sh"], SCRIPT).hold);
    let parsed = submit(&["--parsable", "job.sh"], Some(SCRIPT)).unwrap();
    assert!(parsed.parsable);
    assert!(parse_command_line(&args(&["--parsable", "x.sh"])).unwrap().parsable);
}

#[test]
fn bundled_short_flags() {
    let s = spec(&["-HJname", "job.sh"], SCRIPT);
    assert!(s.hold);
    assert_eq!(s.name, "name");
    let s = spec(&["-Hp", "debug", "job.sh"], SCRIPT);
    assert!(s.hold);
    assert_eq!(s.partition.as_deref(), Some("debug"));
}

#[test]
fn separate_value_may_start_with_a_dash() {
    // getopt takes the next argument as the value, whatever it looks like.
    let s = spec(&["-J", "-weird-", "job.sh"], SCRIPT);
    assert_eq!(s.name, "-weird-");
    let s = spec(&["--time", "-1", "job.sh"], SCRIPT);
    assert_eq!(s.time_limit_s, None);
}

#[test]
fn value_may_contain_equals_signs() {
    let s = spec(&["--job-name=a=b", "job.sh"], SCRIPT);
    assert_eq!(s.name, "a=b");
}

#[test]
fn later_options_override_earlier_ones() {
    let s = spec(&["-N", "2", "--nodes=4", "-p", "a", "-p", "b", "job.sh"], SCRIPT);
    assert_eq!((s.min_nodes, s.max_nodes), (4, 4));
    assert_eq!(s.partition.as_deref(), Some("b"));
}

#[test]
fn ignored_options_are_accepted_dropped_and_warned_about() {
    let cmd = parse_command_line(&args(&["--mail-type=END,FAIL", "--mail-user", "a@b.c", "job.sh"])).unwrap();
    assert_eq!(cmd.options.len(), 2);
    assert!(cmd.options.iter().all(|o| matches!(o, SbatchOption::Ignored { .. })));
    let parsed = build_spec(&cmd, Some(SCRIPT), &ctx()).unwrap();
    assert_eq!(parsed.spec, spec(&["job.sh"], SCRIPT));
    // One warning per option, even though both say the same.
    assert_eq!(
        parsed.warnings,
        ["--mail-type is ignored: Drover sends no mail", "--mail-user is ignored: Drover sends no mail"]
    );
    assert!(cmd_err(&["--mail-type"]).contains("--mail-type requires a value"));
    // Asking for no mail is what Drover does anyway.
    assert!(warnings(&["--mail-type=NONE", "job.sh"]).is_empty());
}

#[test]
fn command_line_keeps_options_in_order() {
    let cmd = parse_command_line(&args(&["-N2", "-t", "10", "--hold", "-N", "1-3", "x.sh", "a"])).unwrap();
    assert_eq!(
        cmd.options,
        vec![
            SbatchOption::Nodes { min: 2, max: 2 },
            SbatchOption::TimeLimit(Some(600)),
            SbatchOption::Hold,
            SbatchOption::Nodes { min: 1, max: 3 },
        ]
    );
    assert_eq!(cmd.script_path.as_deref(), Some("x.sh"));
    assert_eq!(cmd.script_args, args(&["a"]));
    assert_eq!(cmd.wrap, None);
    assert!(!cmd.parsable);
}

// ---- values ----

#[test]
fn node_ranges() {
    let s = spec(&["-N", "2-4", "job.sh"], SCRIPT);
    assert_eq!((s.min_nodes, s.max_nodes), (2, 4));
    let s = spec(&["-N", "3-3", "job.sh"], SCRIPT);
    assert_eq!((s.min_nodes, s.max_nodes), (3, 3));
}

#[test]
fn bad_node_counts() {
    let msg = cmd_err(&["--nodes=two", "job.sh"]);
    assert_eq!(msg, "invalid --nodes value \"two\": expected a number or MIN-MAX");
    let msg = cmd_err(&["-N", "4-2", "job.sh"]);
    assert_eq!(msg, "invalid -N value \"4-2\": the minimum node count 4 is more than the maximum 2");
    assert!(cmd_err(&["-N0", "job.sh"]).contains("at least 1"));
    assert!(cmd_err(&["-N", "0-2", "job.sh"]).contains("at least 1"));
    for bad in ["", "-2", "2-", "1-2-3", "+2", "99999999999", "2.5", " 2"] {
        let msg = cmd_err(&["--nodes", bad, "job.sh"]);
        assert!(msg.starts_with(&format!("invalid --nodes value {bad:?}")), "{bad:?}: {msg}");
    }
}

#[test]
fn bad_counts() {
    assert_eq!(cmd_err(&["-n", "0"]), "invalid -n value \"0\": must be at least 1");
    assert_eq!(cmd_err(&["--cpus-per-task=0"]), "invalid --cpus-per-task value \"0\": must be at least 1");
    assert_eq!(cmd_err(&["--ntasks-per-node=0"]), "invalid --ntasks-per-node value \"0\": must be at least 1");
    assert_eq!(cmd_err(&["-c", "four"]), "invalid -c value \"four\": expected a positive whole number");
    assert!(cmd_err(&["-n", "-3"]).contains("expected a positive whole number"));
    assert!(cmd_err(&["-n", "4294967296"]).contains("expected a positive whole number"));
}

#[test]
fn ntasks_and_per_node_may_disagree() {
    let s = spec(&["-N", "2", "-n", "3", "--ntasks-per-node", "8", "job.sh"], SCRIPT);
    assert_eq!((s.ntasks, s.ntasks_per_node), (Some(3), Some(8)));
}

#[test]
fn gres_forms() {
    let g = |v: &str| {
        let s = spec(&["--gres", v, "job.sh"], SCRIPT);
        (s.gpus_per_node, s.gpu_type)
    };
    assert_eq!(g("gpu"), (1, None));
    assert_eq!(g("gpu:4"), (4, None));
    assert_eq!(g("gpu:0"), (0, None));
    assert_eq!(g("gpu:a100:2"), (2, Some("a100".into())));
    assert_eq!(g("gpu:h100"), (1, Some("h100".into())));
    assert_eq!(g("none"), (0, None));
    assert_eq!(g("gpu:nvidia_h100-80gb:8"), (8, Some("nvidia_h100-80gb".into())));
}

#[test]
fn gres_errors_name_the_problem() {
    let msg = cmd_err(&["--gres=gpu:2,nic:1"]);
    assert!(msg.starts_with("invalid --gres value \"gpu:2,nic:1\""), "{msg}");
    assert!(msg.contains("not \"nic\""), "{msg}");
    let msg = cmd_err(&["--gres=mps:100"]);
    assert!(msg.contains("not \"mps\""), "{msg}");
    let msg = cmd_err(&["--gres=gpu:1,gpu:2"]);
    assert!(msg.contains("more than once"), "{msg}");
    for bad in ["gpu:", "gpu:a:b", "gpu:1:2:3", "gpu:a100:", "gpu:a100:-1", "gpu:,", ",gpu", "GPU:1"] {
        let msg = cmd_err(&["--gres", bad]);
        assert!(msg.starts_with(&format!("invalid --gres value {bad:?}")), "{bad:?}: {msg}");
    }
}

#[test]
fn gpus_per_node_forms() {
    let s = spec(&["--gpus-per-node=4", "job.sh"], SCRIPT);
    assert_eq!((s.gpus_per_node, s.gpu_type), (4, None));
    let s = spec(&["--gpus-per-node", "a100:2", "job.sh"], SCRIPT);
    assert_eq!((s.gpus_per_node, s.gpu_type.as_deref()), (2, Some("a100")));
    for bad in ["four", "a100", "a100:", ":2", "a b:2", "-1"] {
        let msg = cmd_err(&["--gpus-per-node", bad]);
        assert_eq!(msg, format!("invalid --gpus-per-node value {bad:?}: expected COUNT or TYPE:COUNT"));
    }
}

#[test]
fn gres_and_gpus_per_node_last_wins() {
    let s = spec(&["--gres=gpu:a100:2", "--gpus-per-node=8", "job.sh"], SCRIPT);
    assert_eq!((s.gpus_per_node, s.gpu_type), (8, None));
    let s = spec(&["--gpus-per-node=8", "--gres=gpu:a100:2", "job.sh"], SCRIPT);
    assert_eq!((s.gpus_per_node, s.gpu_type.as_deref()), (2, Some("a100")));
}

// ---- --gpus and --gpus-per-task ----

fn gpus_of(list: &[&str]) -> (u32, Option<String>, Option<u32>, Option<u32>) {
    let mut full = list.to_vec();
    full.push("job.sh");
    let s = spec(&full, SCRIPT);
    (s.gpus_per_node, s.gpu_type.map(String::from), s.gpus_total, s.gpus_per_task)
}

fn build_err(list: &[&str], script: &str) -> SbatchError {
    submit(list, Some(script)).expect_err("should fail")
}

#[test]
fn gpus_total_with_and_without_nodes() {
    assert_eq!(gpus_of(&["--gpus=8"]), (0, None, Some(8), None));
    assert_eq!(gpus_of(&["-G", "h100:16"]), (0, Some("h100".into()), Some(16), None));
    assert_eq!(gpus_of(&["-N", "2", "--gpus=8"]), (4, None, None, None));
    assert_eq!(gpus_of(&["--gpus=8", "-N", "2"]), (4, None, None, None));
    assert_eq!(gpus_of(&["-N", "1", "-G8"]), (8, None, None, None));
    // A node range leaves the spread to the controller.
    assert_eq!(gpus_of(&["-N", "1-2", "--gpus=8"]), (0, None, Some(8), None));
    // --nodes in a directive counts too.
    let s = spec(&["--gpus=a100:6", "job.sh"], "#!/bin/sh\n#SBATCH -N 3\n");
    assert_eq!((s.gpus_per_node, s.gpu_type.as_deref(), s.gpus_total), (2, Some("a100"), None));
    assert_eq!(gpus_of(&["--gpus=0"]), (0, None, None, None));
}

#[test]
fn gpus_total_must_divide_evenly() {
    let err = build_err(&["-N", "2", "--gpus=5", "job.sh"], SCRIPT);
    assert_eq!(err, SbatchError::Conflict("--gpus=5 cannot be spread evenly over 2 nodes; use --gpus-per-node".into()));
    assert_eq!(err.to_string(), "--gpus=5 cannot be spread evenly over 2 nodes; use --gpus-per-node");
    let err = build_err(&["job.sh"], "#!/bin/sh\n#SBATCH -N 4\n#SBATCH -G a100:6\n");
    assert_eq!(err.to_string(), "--gpus=6 cannot be spread evenly over 4 nodes; use --gpus-per-node");
}

#[test]
fn gpus_per_task() {
    assert_eq!(gpus_of(&["-n", "4", "--gpus-per-task=1"]), (4, None, None, Some(1)));
    assert_eq!(gpus_of(&["--gpus-per-task=h100:2", "-n", "3"]), (6, Some("h100".into()), None, Some(2)));
    // Block distribution: 5 tasks on 2 nodes is 3 + 2, so each node needs room for 3.
    assert_eq!(gpus_of(&["-N", "2", "-n", "5", "--gpus-per-task=2"]), (6, None, None, Some(2)));
    assert_eq!(gpus_of(&["-N", "2", "--ntasks-per-node=4", "--gpus-per-task=1"]), (4, None, None, Some(1)));
    let s = spec(&["--gpus-per-task=1", "job.sh"], "#!/bin/sh\n#SBATCH --ntasks=2\n");
    assert_eq!((s.gpus_per_node, s.gpus_per_task), (2, Some(1)));
    let err = build_err(&["--gpus-per-task=1", "job.sh"], SCRIPT);
    assert_eq!(err.to_string(), "--gpus-per-task=1 requires a task count: give --ntasks or --ntasks-per-node");
    let err = build_err(&["-n", "2", "--gpus-per-task=4294967295", "job.sh"], SCRIPT);
    assert!(err.to_string().contains("too many GPUs"), "{err}");
    for bad in ["x", "a100:", ":1", "-1"] {
        let msg = cmd_err(&["--gpus-per-task", bad]);
        assert_eq!(msg, format!("invalid --gpus-per-task value {bad:?}: expected COUNT or TYPE:COUNT"));
        let msg = cmd_err(&["-G", bad]);
        assert_eq!(msg, format!("invalid -G value {bad:?}: expected COUNT or TYPE:COUNT"));
    }
}

/// `--gpus-per-task` with a huge `--nodes` once listed the tasks of every node to find the busiest one: a
/// 16 GiB allocation (an abort) for `-N 4294967295`. The busiest node is now computed.
#[test]
fn gpus_per_task_with_huge_node_counts_does_not_list_every_node() {
    let n = u32::MAX.to_string();
    let s = spec(&["-N", &n, "--ntasks-per-node=3", "--gpus-per-task=2", "job.sh"], SCRIPT);
    assert_eq!((s.gpus_per_node, s.gpus_per_task), (6, Some(2)));
    let s = spec(&["-N", &n, "-n", "5", "--gpus-per-task=2", "job.sh"], SCRIPT);
    assert_eq!(s.gpus_per_node, 2);
    let s = spec(&["-N", &format!("1-{n}"), "-n", &n, "--gpus-per-task=1", "job.sh"], SCRIPT);
    assert_eq!(s.gpus_per_node, u32::MAX);
    assert!(matches!(
        build_err(&["-N", "2", "-n", &n, "--gpus-per-task=2"], SCRIPT),
        SbatchError::Conflict(msg) if msg.contains("too many GPUs")
    ));
}

/// The computed busiest node matches the listed distribution.
#[test]
fn most_tasks_on_a_node_matches_the_distribution() {
    for nodes in 0..6 {
        for ntasks in [None, Some(1), Some(4), Some(7), Some(13)] {
            for per_node in [None, Some(1), Some(3)] {
                let spec = JobSpec {
                    min_nodes: nodes,
                    max_nodes: nodes,
                    ntasks,
                    ntasks_per_node: per_node,
                    ..JobSpec::default()
                };
                let listed = spec.tasks_per_node(spec.min_nodes).into_iter().max().unwrap_or(1);
                assert_eq!(most_tasks_on_a_node(&spec), listed, "{nodes} {ntasks:?} {per_node:?}");
            }
        }
    }
}

#[test]
fn last_gpu_option_wins() {
    assert_eq!(gpus_of(&["--gpus=8", "--gpus-per-node=2"]), (2, None, None, None));
    assert_eq!(gpus_of(&["--gpus-per-node=a100:2", "--gpus=4"]), (0, None, Some(4), None));
    assert_eq!(gpus_of(&["-n", "4", "--gpus-per-task=1", "--gres=gpu:v100:2"]), (2, Some("v100".into()), None, None));
    assert_eq!(gpus_of(&["-n", "4", "--gres=gpu:2", "--gpus-per-task=1"]), (4, None, None, Some(1)));
    assert_eq!(gpus_of(&["-N", "2", "-n", "2", "--gpus-per-task=1", "--gpus=6"]), (3, None, None, None));
    // The command line's option beats a directive's, whatever their kinds.
    let s = spec(&["--gpus-per-node=1", "job.sh"], "#!/bin/sh\n#SBATCH --gpus=8\n");
    assert_eq!((s.gpus_per_node, s.gpus_total), (1, None));
    // An overridden --gpus-per-task no longer needs a task count.
    assert_eq!(gpus_of(&["--gpus-per-task=1", "--gres=none"]), (0, None, None, None));
}

// ---- --array, --dependency, --qos, --reservation, --nice ----

#[test]
fn array_values_and_errors() {
    let s = spec(&["--array=0-15:4%2", "job.sh"], SCRIPT);
    assert_eq!(s.array, Some(ArraySpec { task_ids: vec![0, 4, 8, 12].into(), max_running: Some(2) }));
    let s = spec(&["-a", "7,1-2,2", "job.sh"], SCRIPT);
    assert_eq!(s.array.unwrap().task_ids, vec![1, 2, 7]);
    assert_eq!(spec(&["-a1000", "job.sh"], SCRIPT).array.unwrap().task_ids, vec![1000]);
    assert_eq!(spec(&["-Ha", "3", "job.sh"], SCRIPT).array.unwrap().task_ids, vec![3]);
    assert_eq!(cmd_err(&["-a", "5-1"]), "invalid -a value \"5-1\": range end 1 is below its start 5");
    assert_eq!(
        cmd_err(&["--array=0-1001"]),
        "invalid --array value \"0-1001\": task id 1001 is not below MaxArraySize 1001"
    );
    assert!(cmd_err(&["--array=1-3%0"]).contains("%0 would let no task run"));
    assert!(cmd_err(&["--array=1,,3"]).contains("an entry is empty"));
    assert_eq!(cmd_err(&["--array="]), "invalid --array value \"\": the value is empty");
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --array=1-3\n");
    assert_eq!(s.array.unwrap().task_ids, vec![1, 2, 3]);
    // Later wins entirely.
    let s = spec(&["--array=1-3%1", "--array=5", "job.sh"], SCRIPT);
    assert_eq!(s.array, Some(ArraySpec { task_ids: vec![5].into(), max_running: None }));
    let err = script_err("#!/bin/sh\n#SBATCH -a 3-2\n");
    assert_eq!(
        err.to_string(),
        "script line 2: invalid -a value \"3-2\": range end 2 is below its start 3 (in \"#SBATCH -a 3-2\")"
    );
}

#[test]
fn dependency_values_and_errors() {
    use DependencyKind::*;
    let d = |kind, job, task| Dependency { kind, job, task };
    let s = spec(&["--dependency=afterok:12:13,afterany:5_3,singleton", "job.sh"], SCRIPT);
    assert_eq!(
        s.dependency,
        vec![d(AfterOk, 12, None), d(AfterOk, 13, None), d(AfterAny, 5, Some(3)), d(Singleton, 0, None)]
    );
    assert!(!s.dependency_any);
    let s = spec(&["-d", "afterok:1?afternotok:2", "job.sh"], SCRIPT);
    assert_eq!((s.dependency.to_vec(), s.dependency_any), (vec![d(AfterOk, 1, None), d(AfterNotOk, 2, None)], true));
    // Later wins entirely, the any flag included.
    let s = spec(&["-d", "after:1?after:2", "-d", "after:3", "job.sh"], SCRIPT);
    assert_eq!((s.dependency.to_vec(), s.dependency_any), (vec![d(After, 3, None)], false));
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --dependency=singleton\n");
    assert_eq!(s.dependency, vec![d(Singleton, 0, None)]);
    let msg = cmd_err(&["-d", "aftercorr:5"]);
    assert_eq!(
        msg,
        "invalid -d value \"aftercorr:5\": dependency type \"aftercorr\" is not supported; supported: after, \
         afterok, afterany, afternotok, singleton"
    );
    assert!(cmd_err(&["--dependency=after:7+60"]).contains("time delays"));
    assert!(cmd_err(&["--dependency=afterok:1,afterok:2?afterok:3"]).contains("cannot be mixed"));
    assert!(cmd_err(&["--dependency=afterok:0"]).contains("job ids start at 1"));
    assert_eq!(cmd_err(&["--dependency="]), "invalid --dependency value \"\": the value is empty");
}

#[test]
fn qos_and_reservation() {
    let s = spec(&["-q", "low", "--reservation", "r1", "job.sh"], "#!/bin/sh\n#SBATCH --qos=high\n");
    assert_eq!((s.qos.as_deref(), s.reservation.as_deref()), (Some("low"), Some("r1")));
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --qos=high --reservation=maint\n");
    assert_eq!((s.qos.as_deref(), s.reservation.as_deref()), (Some("high"), Some("maint")));
    assert_eq!(cmd_err(&["--qos="]), "invalid --qos value \"\": the value is empty");
    assert_eq!(cmd_err(&["--reservation"]), "option --reservation requires a value");
}

#[test]
fn nice_takes_an_optional_value() {
    assert_eq!(spec(&["--nice", "job.sh"], SCRIPT).nice, 100);
    assert_eq!(spec(&["--nice=50", "job.sh"], SCRIPT).nice, 50);
    assert_eq!(spec(&["--nice=-5", "job.sh"], SCRIPT).nice, -5);
    assert_eq!(spec(&["--nice=+7", "job.sh"], SCRIPT).nice, 7);
    assert_eq!(spec(&["--nice=0", "job.sh"], SCRIPT).nice, 0);
    assert_eq!(spec(&["--nice=2147483645", "job.sh"], SCRIPT).nice, MAX_NICE);
    assert_eq!(spec(&["--nice=-2147483645", "job.sh"], SCRIPT).nice, -MAX_NICE);
    // getopt's optional argument: a separate word is not the value but the next argument (here the script).
    let parsed = submit(&["--nice", "50", "job.sh"], Some(SCRIPT)).unwrap();
    assert_eq!(parsed.spec.nice, 100);
    assert_eq!(parsed.script_path.as_deref(), Some("50"));
    assert_eq!(parsed.spec.script_args, args(&["job.sh"]));
    let cmd = parse_command_line(&args(&["--nice", "-N", "2"])).unwrap();
    assert_eq!(cmd.options, vec![SbatchOption::Nice(100), SbatchOption::Nodes { min: 2, max: 2 }]);
    // Directives.
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --nice\n").nice, 100);
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --nice=-3\n").nice, -3);
    assert_eq!(spec(&["--nice=1", "job.sh"], "#!/bin/sh\n#SBATCH --nice\n").nice, 1);
    let err = script_err("#!/bin/sh\n#SBATCH --nice 5\n");
    assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::UnexpectedArgument { .. }, .. }));
    // Errors.
    let range = "the nice value must lie between -2147483645 and 2147483645";
    assert_eq!(cmd_err(&["--nice=2147483646"]), format!("invalid --nice value \"2147483646\": {range}"));
    assert_eq!(
        cmd_err(&["--nice=-99999999999999999999"]),
        format!("invalid --nice value \"-99999999999999999999\": {range}")
    );
    assert!(cmd_err(&["--nice=-9223372036854775808"]).ends_with(range));
    for bad in ["abc", "1.5", "-", "--1", "5x", " 5"] {
        let msg = cmd_err(&[&format!("--nice={bad}")]);
        let expected = "expected a whole number, optionally negative (e.g. --nice=50)";
        assert_eq!(msg, format!("invalid --nice value {bad:?}: {expected}"));
    }
    assert_eq!(cmd_err(&["--nice="]), "invalid --nice value \"\": the value is empty");
}

#[test]
fn time_values() {
    assert_eq!(spec(&["-t", "30", "job.sh"], SCRIPT).time_limit_s, Some(1800));
    assert_eq!(spec(&["-t", "2-00:00:00", "job.sh"], SCRIPT).time_limit_s, Some(2 * 86_400));
    assert_eq!(spec(&["-t", "UNLIMITED", "job.sh"], SCRIPT).time_limit_s, None);
    let msg = cmd_err(&["--time=2h", "job.sh"]);
    assert!(msg.starts_with("invalid --time value \"2h\": \"2h\" is not a whole number"), "{msg}");
    assert!(msg.contains("days-hours:minutes:seconds"), "{msg}");
}

#[test]
fn chdir_resolution() {
    assert_eq!(spec(&["-D", "/abs", "job.sh"], SCRIPT).work_dir, "/abs");
    assert_eq!(spec(&["-D", "sub/dir", "job.sh"], SCRIPT).work_dir, "/home/alice/work/sub/dir");
    assert_eq!(spec(&["-D", "./sub", "job.sh"], SCRIPT).work_dir, "/home/alice/work/sub");
    assert_eq!(spec(&["-D", ".", "job.sh"], SCRIPT).work_dir, "/home/alice/work");
    assert_eq!(spec(&["-D", "../x", "job.sh"], SCRIPT).work_dir, "/home/alice/work/../x");
    let s = spec(&["--chdir=rel", "job.sh"], SCRIPT);
    assert_eq!(s.submit_dir, "/home/alice/work");
    let mut c = ctx();
    c.cwd = "/".into();
    let cmd = parse_command_line(&args(&["-D", "tmp", "job.sh"])).unwrap();
    assert_eq!(build_spec(&cmd, Some(SCRIPT), &c).unwrap().spec.work_dir, "/tmp");
}

// ---- export ----

#[test]
fn export_all_and_none() {
    let s = spec(&["--export=ALL", "job.sh"], SCRIPT);
    assert_eq!(s.export, ExportPolicy::All);
    assert_eq!(s.environment, ctx().env);
    let s = spec(&["--export=all", "job.sh"], SCRIPT);
    assert_eq!(s.export, ExportPolicy::All);
    let s = spec(&["--export", "none", "job.sh"], SCRIPT);
    assert_eq!(s.export, ExportPolicy::None);
    assert!(s.environment.is_empty());
}

#[test]
fn export_named_variables() {
    let s = spec(&["--export=HOME,PATH,MISSING", "job.sh"], SCRIPT);
    assert_eq!(s.export, ExportPolicy::Vars { all: false, names: args(&["HOME", "PATH", "MISSING"]).into() });
    // In the submit environment's order; absent names are skipped.
    assert_eq!(
        s.environment,
        vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), "/home/alice".into()),
            ("SLURM_EXPORT_ENV".into(), "HOME,PATH,MISSING".into()),
        ]
    );
}

#[test]
fn export_all_with_assignments() {
    let s = spec(&["--export=ALL,HOME=/tmp,NEW=1,LANG", "job.sh"], SCRIPT);
    assert_eq!(s.export, ExportPolicy::Vars { all: true, names: args(&["HOME", "NEW", "LANG"]).into() });
    assert_eq!(
        s.environment,
        vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("NEW".into(), "1".into()),
            ("SLURM_EXPORT_ENV".into(), "ALL,HOME=/tmp,NEW=1,LANG".into()),
        ]
    );
}

#[test]
fn export_list_with_assignments() {
    let s = spec(&["--export=PATH,FOO=bar,EMPTY=", "job.sh"], SCRIPT);
    assert_eq!(s.export, ExportPolicy::Vars { all: false, names: args(&["PATH", "FOO", "EMPTY"]).into() });
    assert_eq!(
        s.environment,
        vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("FOO".into(), "bar".into()),
            ("EMPTY".into(), "".into()),
            ("SLURM_EXPORT_ENV".into(), "PATH,FOO=bar,EMPTY=".into()),
        ]
    );
}

#[test]
fn export_quoted_values_may_hold_commas() {
    let s = spec(&["--export=ALL,LIST='a,b',X=\"c d\"", "job.sh"], SCRIPT);
    let env = s.environment;
    assert!(env.contains(&("LIST".into(), "a,b".into())), "{env:?}");
    assert!(env.contains(&("X".into(), "c d".into())), "{env:?}");
}

#[test]
fn export_errors() {
    let msg = cmd_err(&["--export=NONE,FOO"]);
    assert!(msg.contains("NONE cannot be combined"), "{msg}");
    assert!(cmd_err(&["--export="]).contains("the value is empty"));
    assert!(cmd_err(&["--export=,"]).contains("expected ALL, NONE"));
    assert!(cmd_err(&["--export==x"]).contains("is not a variable name"));
    assert!(cmd_err(&["--export=A B"]).contains("is not a variable name"));
    assert!(cmd_err(&["--export=X='a"]).contains("unmatched ' quote"));
}

#[test]
fn last_export_wins_entirely() {
    let s = spec(&["--export=ALL,FOO=1", "--export=HOME", "job.sh"], SCRIPT);
    assert_eq!(s.environment, vec![("HOME".into(), "/home/alice".into()), ("SLURM_EXPORT_ENV".into(), "HOME".into())]);
}

// ---- script args and positional handling ----

#[test]
fn everything_after_the_script_is_script_args() {
    let parsed = submit(&["-N", "2", "job.sh", "--nodes=9", "-J", "x", "plain"], Some(SCRIPT)).unwrap();
    assert_eq!(parsed.spec.script_args, args(&["--nodes=9", "-J", "x", "plain"]));
    assert_eq!(parsed.spec.min_nodes, 2);
    assert_eq!(parsed.spec.name, "job.sh");
}

#[test]
fn double_dash_ends_options() {
    let cmd = parse_command_line(&args(&["-N", "2", "--", "-weird.sh", "a"])).unwrap();
    assert_eq!(cmd.script_path.as_deref(), Some("-weird.sh"));
    assert_eq!(cmd.script_args, args(&["a"]));
    let cmd = parse_command_line(&args(&["--"])).unwrap();
    assert_eq!(cmd.script_path, None);
}

#[test]
fn lone_dash_is_a_positional() {
    let cmd = parse_command_line(&args(&["-"])).unwrap();
    assert_eq!(cmd.script_path.as_deref(), Some("-"));
}

// ---- command-line errors ----

#[test]
fn unknown_options() {
    // sbatch has no --x11 (salloc and srun do).
    let msg = cmd_err(&["--x11", "job.sh"]);
    assert!(msg.starts_with("unrecognized option \"--x11\"; supported options: --job-name/-J,"), "{msg}");
    assert!(msg.contains("--gpus-per-node"), "{msg}");
    for listed in ["--array/-a", "--dependency/-d", "--qos/-q", "--reservation", "--nice", "--gpus/-G"] {
        assert!(msg.contains(listed), "{listed}: {msg}");
    }
    assert!(msg.contains("--gpus-per-task"), "{msg}");
    for listed in ["--mem", "--mem-per-gpu", "--cpus-per-gpu", "--begin/-b", "--time-min", "--wckey", "--comment"] {
        assert!(msg.contains(listed), "{listed}: {msg}");
    }
    // Only what Drover acts on is listed; hidden aliases neither.
    for unlisted in ["mail-type", "gpu-bind", "--uid", "--test-only", "--tasks-per-node", "ntasks-per-tres"] {
        assert!(!msg.contains(unlisted), "{unlisted}: {msg}");
    }
    assert!(cmd_err(&["-Z", "job.sh"]).starts_with("unrecognized option \"-Z\""));
    assert!(cmd_err(&["-HX"]).starts_with("unrecognized option \"-X\""));
    // No abbreviations.
    assert!(cmd_err(&["--part=gpu"]).starts_with("unrecognized option \"--part\""));
}

#[test]
fn missing_values() {
    assert_eq!(cmd_err(&["--nodes"]), "option --nodes requires a value");
    assert_eq!(cmd_err(&["-N"]), "option -N requires a value");
    assert_eq!(cmd_err(&["-H", "-J"]), "option -J requires a value");
    assert_eq!(cmd_err(&["--wrap"]), "option --wrap requires a value");
    assert_eq!(cmd_err(&["--job-name="]), "invalid --job-name value \"\": the value is empty");
}

#[test]
fn unexpected_values() {
    assert_eq!(cmd_err(&["--hold=yes"]), "option --hold takes no value, but was given \"yes\"");
    assert!(cmd_err(&["--parsable=1"]).contains("--parsable takes no value"));
}

// ---- --wrap ----

#[test]
fn wrap_generates_the_script() {
    let parsed = submit(&["--wrap=srun hostname", "-N", "2"], None).unwrap();
    assert_eq!(parsed.spec.script, "#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsrun hostname\n");
    assert_eq!(parsed.spec.name, "wrap");
    assert_eq!(parsed.spec.min_nodes, 2);
    assert_eq!(parsed.script_path, None);
    let parsed = submit(&["--wrap", "echo a; echo b", "-J", "named"], None).unwrap();
    assert_eq!(parsed.spec.name, "named");
    assert!(parsed.spec.script.contains("\necho a; echo b\n"));
}

#[test]
fn wrap_ignores_script_text() {
    let parsed = submit(&["--wrap=true"], Some("#!/bin/sh\n#SBATCH -N 5\n")).unwrap();
    assert_eq!(parsed.spec.min_nodes, 1);
    assert_eq!(parsed.spec.script, wrap_script("true"));
}

#[test]
fn wrap_with_a_script_is_an_error() {
    let err = parse_command_line(&args(&["--wrap=ls", "job.sh"])).unwrap_err();
    assert_eq!(err, SbatchError::WrapWithScript { arg: "job.sh".into() });
    assert!(err.to_string().contains("not permitted with --wrap"));
    assert!(cmd_err(&["--wrap=", "x"]).contains("expected a command to run"));
}

// ---- directives ----

#[test]
fn directives_apply() {
    let script = "#!/bin/bash\n#SBATCH --job-name=fromscript\n#SBATCH -N 2-3\n#SBATCH -p gpu --gres=gpu:a100:4\n\
                  #SBATCH --time=10 --hold\n#SBATCH --export=NONE\nsrun x\n";
    let s = spec(&["job.sh"], script);
    assert_eq!(s.name, "fromscript");
    assert_eq!((s.min_nodes, s.max_nodes), (2, 3));
    assert_eq!(s.partition.as_deref(), Some("gpu"));
    assert_eq!((s.gpus_per_node, s.gpu_type.as_deref()), (4, Some("a100")));
    assert_eq!(s.time_limit_s, Some(600));
    assert!(s.hold);
    assert!(s.environment.is_empty());
    assert_eq!(s.script, script);
}

#[test]
fn command_line_overrides_directives() {
    let script = "#!/bin/bash\n#SBATCH -J fromscript\n#SBATCH -N 2-3\n#SBATCH -t 10\n#SBATCH -p a\n";
    let s = spec(&["-N", "5", "--job-name=cli", "job.sh"], script);
    assert_eq!(s.name, "cli");
    assert_eq!((s.min_nodes, s.max_nodes), (5, 5));
    // Not overridden: the directive stays.
    assert_eq!(s.time_limit_s, Some(600));
    assert_eq!(s.partition.as_deref(), Some("a"));
}

#[test]
fn later_directives_override_earlier_ones() {
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH -N 2\n#SBATCH -N 4\n");
    assert_eq!(s.min_nodes, 4);
}

#[test]
fn parsable_in_a_directive() {
    let parsed = submit(&["job.sh"], Some("#!/bin/sh\n#SBATCH --parsable\n")).unwrap();
    assert!(parsed.parsable);
}

#[test]
fn directives_stop_at_first_command() {
    let script = "#!/bin/bash\n\n# a comment\n   # indented comment\n#SBATCH -N 2\n\t\n\
                  module load cuda\n#SBATCH -N 7\n#SBATCH --bogus\n";
    assert_eq!(spec(&["job.sh"], script).min_nodes, 2);
}

#[test]
fn only_column_zero_sbatch_counts() {
    let script = "#!/bin/bash\n  #SBATCH -N 3\n# SBATCH -N 4\n#sbatch -N 5\n##SBATCH -N 6\n";
    assert_eq!(spec(&["job.sh"], script).min_nodes, 1);
}

#[test]
fn directive_words_quotes_escapes_and_comments() {
    let script = "#!/bin/bash\n#SBATCH -J \"my job\" -N 2 # two nodes\n#SBATCH --comment='a # b'\n\
                  #SBATCH -o out\\ file#x\n#SBATCH --job-name='x y'z\n";
    let s = spec(&["job.sh"], script);
    assert_eq!(s.name, "x yz");
    assert_eq!(s.min_nodes, 2);
    assert_eq!(s.stdout.as_deref(), Some("out file"));
    assert_eq!(directive_words(" -J \"a b\"  -N 2").unwrap(), args(&["-J", "a b", "-N", "2"]));
    assert_eq!(directive_words("").unwrap(), Vec::<String>::new());
    assert_eq!(directive_words("  # only a comment").unwrap(), Vec::<String>::new());
    assert_eq!(directive_words("-J ''").unwrap(), args(&["-J", ""]));
}

#[test]
fn empty_directive_is_fine() {
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH\n#SBATCH   \n#SBATCH -N 2\n").min_nodes, 2);
}

#[test]
fn directive_errors_name_line_and_text() {
    let err = script_err("#!/bin/bash\n#SBATCH -J ok\n#SBATCH --nodes=two\necho\n");
    assert_eq!(
        err.to_string(),
        "script line 3: invalid --nodes value \"two\": expected a number or MIN-MAX (in \"#SBATCH --nodes=two\")"
    );
    let err = script_err("#!/bin/bash\n\n#SBATCH --x11=all\n");
    assert!(err.to_string().starts_with("script line 3: unrecognized option \"--x11\""), "{err}");
    assert!(err.to_string().ends_with("(in \"#SBATCH --x11=all\")"), "{err}");
    let err = script_err("#!/bin/bash\n#SBATCH -N\n");
    assert_eq!(err.to_string(), "script line 2: option -N requires a value (in \"#SBATCH -N\")");
    let err = script_err("#!/bin/bash\n#SBATCH -J \"open\n");
    assert_eq!(err.to_string(), "script line 2: unmatched \" quote (in \"#SBATCH -J \\\"open\")");
    let err = script_err("#!/bin/bash\n#SBATCH -N 2 extra\n");
    assert_eq!(
        err,
        SbatchError::Directive {
            line: 2,
            text: "#SBATCH -N 2 extra".into(),
            error: OptionError::UnexpectedArgument { arg: "extra".into() }
        }
    );
    let err = script_err("#!/bin/bash\n#SBATCH --wrap=ls\n");
    assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::WrapInScript, .. }));
    let err = script_err("#!/bin/bash\n#SBATCH -- x\n");
    assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::UnexpectedArgument { .. }, .. }));
    let err = script_err("#!/bin/bash\n#SBATCH -t 2h\n");
    assert!(err.to_string().starts_with("script line 2: invalid -t value \"2h\""), "{err}");
}

#[test]
fn directive_errors_even_when_command_line_overrides() {
    // Slurm parses every directive, so a broken one fails even if the command line sets the same option.
    let cmd = parse_command_line(&args(&["-N", "2", "job.sh"])).unwrap();
    let err = build_spec(&cmd, Some("#!/bin/sh\n#SBATCH -N x\n"), &ctx()).unwrap_err();
    assert!(matches!(err, SbatchError::Directive { line: 2, .. }));
}

// ---- script checks ----

#[test]
fn script_must_start_with_shebang() {
    let err = script_err("echo hi\n");
    assert_eq!(err, SbatchError::NotABatchScript);
    assert!(err.to_string().starts_with(
        "This does not look like a batch script.  The first line must start with #! followed by the path to \
         an interpreter."
    ));
    assert_eq!(script_err(" #!/bin/sh\n"), SbatchError::NotABatchScript);
    assert_eq!(script_err("#SBATCH -N 2\n#!/bin/sh\n"), SbatchError::NotABatchScript);
}

#[test]
fn empty_and_blank_scripts() {
    assert_eq!(script_err(""), SbatchError::EmptyScript);
    assert_eq!(script_err(" \n\t\n"), SbatchError::WhitespaceScript);
}

#[test]
fn dos_line_breaks() {
    let err = script_err("#!/bin/sh\n#SBATCH -N 2\r\necho\r\n");
    assert_eq!(err, SbatchError::DosLineBreaks { line: 2 });
    assert!(err.to_string().contains("dos2unix"));
}

#[test]
fn script_size_limit() {
    let mut big = String::from("#!/bin/sh\n");
    big.push_str(&"#".repeat(MAX_SCRIPT_BYTES - big.len()));
    assert_eq!(big.len(), MAX_SCRIPT_BYTES);
    let cmd = parse_command_line(&args(&["job.sh"])).unwrap();
    assert!(build_spec(&cmd, Some(&big), &ctx()).is_ok());
    big.push('\n');
    let err = build_spec(&cmd, Some(&big), &ctx()).unwrap_err();
    assert_eq!(err, SbatchError::ScriptTooLarge { size: MAX_SCRIPT_BYTES + 1, limit: MAX_SCRIPT_BYTES });
    assert_eq!(err.to_string(), "batch script is 4194305 bytes, over the limit of 4194304 bytes (4 MiB)");
    // --wrap is held to the same limit.
    let huge = "x".repeat(MAX_SCRIPT_BYTES);
    let cmd = parse_command_line(&[format!("--wrap={huge}")]).unwrap();
    assert!(matches!(build_spec(&cmd, None, &ctx()), Err(SbatchError::ScriptTooLarge { .. })));
}

#[test]
fn script_without_trailing_newline() {
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH -N 3");
    assert_eq!(s.min_nodes, 3);
}

#[test]
fn shebang_only_script() {
    let s = spec(&["job.sh"], "#!/bin/sh");
    assert_eq!(s.script, "#!/bin/sh");
}

// ---- memory ----

fn mem_of(list: &[&str]) -> Option<MemRequest> {
    let mut full = list.to_vec();
    full.push("job.sh");
    spec(&full, SCRIPT).mem
}

#[test]
fn memory_sizes_take_slurms_units() {
    use MemRequest::*;
    assert_eq!(mem_of(&[]), None);
    assert_eq!(mem_of(&["--mem=500"]), Some(PerNode(500)));
    assert_eq!(mem_of(&["--mem", "4G"]), Some(PerNode(4096)));
    assert_eq!(mem_of(&["--mem=4g"]), Some(PerNode(4096)));
    assert_eq!(mem_of(&["--mem=4GB"]), Some(PerNode(4096)));
    assert_eq!(mem_of(&["--mem=4gb"]), Some(PerNode(4096)));
    assert_eq!(mem_of(&["--mem=16384M"]), Some(PerNode(16384)));
    assert_eq!(mem_of(&["--mem=8mb"]), Some(PerNode(8)));
    assert_eq!(mem_of(&["--mem=2T"]), Some(PerNode(2 << 20)));
    assert_eq!(mem_of(&["--mem=+5"]), Some(PerNode(5)));
    // K rounds up to whole MiB.
    assert_eq!(mem_of(&["--mem=1024K"]), Some(PerNode(1)));
    assert_eq!(mem_of(&["--mem=1025k"]), Some(PerNode(2)));
    assert_eq!(mem_of(&["--mem=1K"]), Some(PerNode(1)));
    assert_eq!(mem_of(&["--mem=0K"]), Some(PerNode(0)));
    // 0 is all of each node's memory.
    assert_eq!(mem_of(&["--mem=0"]), Some(PerNode(0)));
    assert_eq!(mem_of(&["--mem-per-cpu=2G"]), Some(PerCpu(2048)));
    assert_eq!(mem_of(&["--gres=gpu:1", "--mem-per-gpu=40G"]), Some(PerGpu(40960)));
    let largest = "8796093022207T"; // 2^63 - 2^20 MiB
    assert_eq!(mem_of(&["--mem", largest]), Some(PerNode(MAX_MEM_MB - (1 << 20) + 1)));
    assert_eq!(mem_of(&["--mem=9223372036854775807"]), Some(PerNode(MAX_MEM_MB)));
}

#[test]
fn bad_memory_sizes_say_what_is_accepted() {
    let expected = "expected a whole number with an optional unit K, M, G or T (MiB when none), e.g. 4G";
    for bad in ["G", "4X", "4GiB", "4 G", "-1", "1.5G", "4B", "B", "4GBB", "0x10", " 4"] {
        assert_eq!(cmd_err(&["--mem", bad]), format!("invalid --mem value {bad:?}: {expected}"), "{bad:?}");
    }
    assert_eq!(cmd_err(&["--mem-per-cpu="]), "invalid --mem-per-cpu value \"\": the value is empty");
    let too_large = "the size is too large (at most 9223372036854775807 MiB)";
    for huge in [
        "9223372036854775808",
        "8796093022208T",
        "9007199254740992G",
        "18446744073709551616",
        "99999999999999999999999K",
    ] {
        assert_eq!(cmd_err(&["--mem-per-gpu", huge]), format!("invalid --mem-per-gpu value {huge:?}: {too_large}"));
    }
}

#[test]
fn memory_options_exclude_one_another_as_in_slurm() {
    use MemRequest::*;
    let exclusive = "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive";
    let err = build_err(&["--mem=4G", "--mem-per-cpu=1G", "job.sh"], SCRIPT);
    assert_eq!(err, SbatchError::Conflict(exclusive.into()));
    // The script counts as the command line here: Slurm refuses a script's --mem with a --mem-per-cpu given
    // to sbatch, rather than letting one win.
    let err = build_err(&["--mem-per-cpu=1G", "job.sh"], "#!/bin/sh\n#SBATCH --mem=4G\n");
    assert_eq!(err.to_string(), exclusive);
    // The same option again: the last wins.
    assert_eq!(mem_of(&["--mem=1G", "--mem=2G"]), Some(PerNode(2048)));
    assert_eq!(spec(&["--mem=2G", "job.sh"], "#!/bin/sh\n#SBATCH --mem=8G\n").mem, Some(PerNode(2048)));
}

#[test]
fn mem_per_gpu_needs_gpus() {
    let err = build_err(&["--mem-per-gpu=10G", "job.sh"], SCRIPT);
    assert_eq!(err.to_string(), "--mem-per-gpu needs GPUs: give --gpus, --gpus-per-node, --gpus-per-task or --gres");
    assert!(build_err(&["--gres=gpu:0", "--mem-per-gpu=10G", "job.sh"], SCRIPT).to_string().contains("needs GPUs"));
    // A job total the controller spreads later is GPUs too.
    assert_eq!(mem_of(&["--gpus=16", "--mem-per-gpu=10G"]), Some(MemRequest::PerGpu(10240)));
}

// ---- --cpus-per-gpu and --ntasks-per-gpu ----

#[test]
fn cpus_per_gpu_shares_each_gpus_cpus_among_the_nodes_tasks() {
    let cpus = |list: &[&str]| {
        let mut full = list.to_vec();
        full.push("job.sh");
        let s = spec(&full, SCRIPT);
        (s.cpus_per_task, s.cpus_per_gpu)
    };
    // One task per node (the default) gets all of its node's CPUs for GPUs.
    assert_eq!(cpus(&["--gres=gpu:4", "--cpus-per-gpu=8"]), (32, Some(8)));
    assert_eq!(cpus(&["--cpus-per-gpu=8", "--gpus-per-node=4", "--ntasks-per-node=4"]), (8, Some(8)));
    // 10 CPUs over 3 tasks: each gets 4.
    assert_eq!(cpus(&["-n", "3", "--gpus-per-node=2", "--cpus-per-gpu=5"]), (4, Some(5)));
    // Tasks in blocks: 3 tasks on 2 nodes is 2 + 1; the busier node's tasks share its 32 CPUs.
    assert_eq!(cpus(&["-N", "2", "-n", "3", "--gres=gpu:4", "--cpus-per-gpu=8"]), (16, Some(8)));
    // --gpus-per-task: GPUs per node follow the tasks first.
    assert_eq!(cpus(&["-n", "2", "--gpus-per-task=2", "--cpus-per-gpu=3"]), (6, Some(3)));
    // A job total not yet spread: its CPUs shared by all of its tasks, or by one task per node.
    assert_eq!(cpus(&["--gpus=8", "--cpus-per-gpu=4", "-n", "4"]), (8, Some(4)));
    assert_eq!(cpus(&["--gpus=8", "--cpus-per-gpu=4"]), (32, Some(4)));
    // --gpus over a fixed node count is per node.
    assert_eq!(cpus(&["-N", "2", "--gpus=8", "--cpus-per-gpu=4"]), (16, Some(4)));
}

#[test]
fn cpus_per_gpu_conflicts_and_edges() {
    let exclusive = "--cpus-per-gpu is mutually exclusive with --cpus-per-task";
    assert_eq!(build_err(&["-c", "2", "--gres=gpu:1", "--cpus-per-gpu=4", "job.sh"], SCRIPT).to_string(), exclusive);
    assert_eq!(
        build_err(&["--gres=gpu:1", "-c", "2", "job.sh"], "#!/bin/sh\n#SBATCH --cpus-per-gpu=4\n").to_string(),
        exclusive
    );
    // Without GPUs there is nothing to multiply: a warning, and the default one CPU per task.
    let parsed = submit(&["--cpus-per-gpu=4", "job.sh"], Some(SCRIPT)).unwrap();
    assert_eq!(parsed.spec.cpus_per_task, 1);
    assert_eq!(parsed.warnings, ["--cpus-per-gpu=4 has no effect: the job asks for no GPUs"]);
    assert_eq!(cmd_err(&["--cpus-per-gpu=0"]), "invalid --cpus-per-gpu value \"0\": must be at least 1");
    let err = build_err(&["--gpus-per-node=100000", "--cpus-per-gpu=4294967295", "job.sh"], SCRIPT);
    assert!(err.to_string().contains("too many CPUs per task"), "{err}");
}

fn tasks_of(list: &[&str]) -> (Option<u32>, Option<u32>, u32, Option<u32>, Option<u32>) {
    let mut full = list.to_vec();
    full.push("job.sh");
    let s = spec(&full, SCRIPT);
    (s.ntasks, s.ntasks_per_node, s.gpus_per_node, s.gpus_total, s.ntasks_per_gpu)
}

#[test]
fn ntasks_per_gpu_with_gpus_sets_the_tasks() {
    // N tasks for each GPU of each node.
    assert_eq!(tasks_of(&["-N", "2", "--gpus-per-node=4", "--ntasks-per-gpu=2"]), (None, Some(8), 4, None, Some(2)));
    assert_eq!(tasks_of(&["--gres=gpu:a100:8", "--ntasks-per-gpu=1"]), (None, Some(8), 8, None, Some(1)));
    // An --ntasks that agrees stays; one that does not is replaced, as Slurm does, with a warning.
    assert_eq!(
        tasks_of(&["-N", "2", "-n", "16", "--gres=gpu:4", "--ntasks-per-gpu=2"]),
        (Some(16), Some(8), 4, None, Some(2))
    );
    let parsed = submit(&["-N", "2", "-n", "5", "--gres=gpu:4", "--ntasks-per-gpu=2", "job.sh"], Some(SCRIPT)).unwrap();
    assert_eq!((parsed.spec.ntasks, parsed.spec.ntasks_per_node), (Some(16), Some(8)));
    assert_eq!(
        parsed.warnings,
        ["--ntasks=5 is replaced by 16: --ntasks-per-gpu=2 times the job's GPUs, as Slurm does"]
    );
    // A job total: N tasks per GPU of it.
    assert_eq!(tasks_of(&["--gpus=8", "--ntasks-per-gpu=2"]), (Some(16), None, 0, Some(8), Some(2)));
    // Slurm's hidden --ntasks-per-tres is the same thing.
    assert_eq!(tasks_of(&["--gpus-per-node=2", "--ntasks-per-tres=3"]), (None, Some(6), 2, None, Some(3)));
}

#[test]
fn ntasks_per_gpu_without_gpus_asks_for_them() {
    // One GPU for every N tasks, a job total (the controller spreads it) ...
    assert_eq!(tasks_of(&["-n", "8", "--ntasks-per-gpu=2"]), (Some(8), None, 0, Some(4), Some(2)));
    // ... or per node, when --nodes is fixed.
    assert_eq!(tasks_of(&["-N", "2", "-n", "8", "--ntasks-per-gpu=2"]), (Some(8), None, 2, None, Some(2)));
    // --nodes alone: N tasks per node, hence one GPU per node.
    assert_eq!(tasks_of(&["-N", "2", "--ntasks-per-gpu=3"]), (Some(6), None, 1, None, Some(3)));
    let err = build_err(&["-n", "7", "--ntasks-per-gpu=2", "job.sh"], SCRIPT);
    assert_eq!(err.to_string(), "--ntasks=7 has to be a multiple of --ntasks-per-gpu=2");
    let err = build_err(&["-N", "4", "-n", "6", "--ntasks-per-gpu=2", "job.sh"], SCRIPT);
    assert_eq!(err.to_string(), "--gpus=3 cannot be spread evenly over 4 nodes; use --gpus-per-node");
    let err = build_err(&["--ntasks-per-gpu=2", "job.sh"], SCRIPT);
    assert!(err.to_string().starts_with("--ntasks-per-gpu=2 needs GPUs"), "{err}");
}

#[test]
fn ntasks_per_gpu_refuses_what_slurm_refuses() {
    let err = |list: &[&str]| build_err(list, SCRIPT).to_string();
    assert_eq!(
        err(&["--ntasks-per-node=2", "--gres=gpu:2", "--ntasks-per-gpu=1", "job.sh"]),
        "--ntasks-per-node is mutually exclusive with --ntasks-per-gpu"
    );
    assert_eq!(
        err(&["-n", "2", "--gpus-per-task=1", "--gres=gpu:2", "--ntasks-per-gpu=1", "job.sh"]),
        "--gpus-per-task is mutually exclusive with --ntasks-per-gpu"
    );
    assert_eq!(
        err(&["-N", "1-2", "--gres=gpu:2", "--ntasks-per-gpu=1", "job.sh"]),
        "--ntasks-per-gpu cannot be used with a node range (--nodes=MIN-MAX)"
    );
    assert!(err(&["--gpus-per-node=65536", "--ntasks-per-gpu=65536", "job.sh"]).contains("too many tasks"));
}

// ---- --wckey, --comment, --time-min ----

#[test]
fn wckey_comment_and_time_min_are_recorded() {
    let s = spec(&["--wckey=ml", "--comment", "sweep 3 of 8", "--time-min=1:00:00", "-t", "4:00:00", "job.sh"], SCRIPT);
    assert_eq!((s.wckey.as_deref(), s.comment.as_deref()), (Some("ml"), Some("sweep 3 of 8")));
    assert_eq!((s.time_min_s, s.time_limit_s), (Some(3600), Some(4 * 3600)));
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --comment=\"from the script\" --time-min=2-0\n");
    assert_eq!((s.comment.as_deref(), s.time_min_s), (Some("from the script"), Some(2 * 86_400)));
    // UNLIMITED (or 0) is no minimum, as for --time.
    assert_eq!(spec(&["--time-min=UNLIMITED", "job.sh"], SCRIPT).time_min_s, None);
    assert_eq!(spec(&["--time-min=0", "-t", "10", "job.sh"], SCRIPT).time_min_s, None);
    // Without --time the partition's limit applies, which only the controller knows.
    assert_eq!(spec(&["--time-min=90", "job.sh"], SCRIPT).time_min_s, Some(5400));
}

#[test]
fn time_min_errors() {
    assert_eq!(
        build_err(&["--time-min=2:00:00", "-t", "60", "job.sh"], SCRIPT).to_string(),
        "--time-min (2:00:00) is longer than --time (1:00:00)"
    );
    let msg = cmd_err(&["--time-min=1h"]);
    assert!(msg.starts_with("invalid --time-min value \"1h\": \"1h\" is not a whole number"), "{msg}");
    assert_eq!(cmd_err(&["--wckey="]), "invalid --wckey value \"\": the value is empty");
}

// ---- --begin and --deadline ----

/// Milliseconds since the epoch of a local time in the test context (UTC+1).
fn local_ms(date: (i64, i64, i64), clock: (i64, i64, i64)) -> u64 {
    let (y, mo, d) = date;
    let (h, mi, s) = clock;
    ((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - 3600) * 1000) as u64
}

fn begin(value: &str) -> u64 {
    spec(&[&format!("--begin={value}"), "job.sh"], SCRIPT).begin_ms.unwrap_or_else(|| panic!("{value}"))
}

const TODAY: (i64, i64, i64) = (2026, 3, 10);
const TOMORROW: (i64, i64, i64) = (2026, 3, 11);

#[test]
fn the_calendar_arithmetic_matches_known_dates() {
    for (date, days) in [
        ((1970, 1, 1), 0),
        ((1969, 12, 31), -1),
        ((2000, 2, 29), 11_016),
        ((2000, 3, 1), 11_017),
        ((2024, 12, 31), 20_088),
        ((2026, 3, 10), 20_522),
        ((2100, 3, 1), 47_541),
    ] {
        assert_eq!(days_from_civil(date.0, date.1, date.2), days, "{date:?}");
        assert_eq!(civil_from_days(days), date);
    }
    assert_eq!(local_ms(TODAY, (14, 30, 15)), NOW_MS);
}

#[test]
fn begin_at_a_time_of_day_is_the_next_one() {
    // Now is 14:30:15 local.
    assert_eq!(begin("16:00"), local_ms(TODAY, (16, 0, 0)));
    assert_eq!(begin("14:31"), local_ms(TODAY, (14, 31, 0)));
    assert_eq!(begin("23:59:59"), local_ms(TODAY, (23, 59, 59)));
    // Not after the current minute: tomorrow (Slurm compares hours and minutes only).
    assert_eq!(begin("14:30:59"), local_ms(TOMORROW, (14, 30, 59)));
    assert_eq!(begin("9:05"), local_ms(TOMORROW, (9, 5, 0)));
    assert_eq!(begin("00:00"), local_ms(TOMORROW, (0, 0, 0)));
    // AM and PM, with or without a space, in any case.
    assert_eq!(begin("4:00 PM"), local_ms(TODAY, (16, 0, 0)));
    assert_eq!(begin("4:00pm"), local_ms(TODAY, (16, 0, 0)));
    assert_eq!(begin("12:00 pm"), local_ms(TOMORROW, (12, 0, 0)));
    assert_eq!(begin("12:15am"), local_ms(TOMORROW, (0, 15, 0)));
    assert_eq!(begin("11:00 AM"), local_ms(TOMORROW, (11, 0, 0)));
    // Named times.
    assert_eq!(begin("midnight"), local_ms(TOMORROW, (0, 0, 0)));
    assert_eq!(begin("noon"), local_ms(TOMORROW, (12, 0, 0)));
    assert_eq!(begin("fika"), local_ms(TODAY, (15, 0, 0)));
    assert_eq!(begin("teatime"), local_ms(TODAY, (16, 0, 0)));
    assert_eq!(begin("NOON"), local_ms(TOMORROW, (12, 0, 0)));
}

#[test]
fn begin_on_a_day() {
    // A day alone is its midnight, even today's (already past: the job is eligible at once).
    assert_eq!(begin("today"), local_ms(TODAY, (0, 0, 0)));
    assert_eq!(begin("tomorrow"), local_ms(TOMORROW, (0, 0, 0)));
    assert_eq!(begin("tomorrow 10:00"), local_ms(TOMORROW, (10, 0, 0)));
    assert_eq!(begin("teatime tomorrow"), local_ms(TOMORROW, (16, 0, 0)));
    assert_eq!(begin("today 9:00"), local_ms(TODAY, (9, 0, 0)));
    assert_eq!(begin("2026-01-20T12:34:00"), local_ms((2026, 1, 20), (12, 34, 0)));
    assert_eq!(begin("2026-01-20T12:34"), local_ms((2026, 1, 20), (12, 34, 0)));
    assert_eq!(begin("2027-12-01"), local_ms((2027, 12, 1), (0, 0, 0)));
    assert_eq!(begin("2027-12-1 18:00"), local_ms((2027, 12, 1), (18, 0, 0)));
    // Without a year: this year if still ahead, else next year.
    assert_eq!(begin("0315"), local_ms((2026, 3, 15), (0, 0, 0)));
    assert_eq!(begin("03/15"), local_ms((2026, 3, 15), (0, 0, 0)));
    assert_eq!(begin("3/15"), local_ms((2026, 3, 15), (0, 0, 0)));
    assert_eq!(begin("03.15"), local_ms((2026, 3, 15), (0, 0, 0)));
    assert_eq!(begin("03/09"), local_ms((2027, 3, 9), (0, 0, 0)));
    // Today's date at midnight has passed: next year, as in Slurm.
    assert_eq!(begin("0310"), local_ms((2027, 3, 10), (0, 0, 0)));
    assert_eq!(begin("03/10-16:00"), local_ms((2026, 3, 10), (16, 0, 0)));
    // Two-digit years; 00 counts as no year, as in Slurm.
    assert_eq!(begin("031527"), local_ms((2027, 3, 15), (0, 0, 0)));
    assert_eq!(begin("03/15/27"), local_ms((2027, 3, 15), (0, 0, 0)));
    assert_eq!(begin("03.15.27"), local_ms((2027, 3, 15), (0, 0, 0)));
    assert_eq!(begin("03/15/00"), local_ms((2026, 3, 15), (0, 0, 0)));
    // A day past the month's end rolls over, as mktime does: February 31 is March 3.
    assert_eq!(begin("2027-02-31"), local_ms((2027, 3, 3), (0, 0, 0)));
}

#[test]
fn begin_relative_to_now() {
    assert_eq!(begin("now"), NOW_MS);
    assert_eq!(begin("now+60"), NOW_MS + 60_000);
    assert_eq!(begin("now+60seconds"), NOW_MS + 60_000);
    assert_eq!(begin("now+1second"), NOW_MS + 1_000);
    assert_eq!(begin("now+90minutes"), NOW_MS + 90 * 60_000);
    assert_eq!(begin("now+1hour"), NOW_MS + 3_600_000);
    assert_eq!(begin("now+2HOURS"), NOW_MS + 7_200_000);
    assert_eq!(begin("now + 2 days"), NOW_MS + 2 * 86_400_000);
    assert_eq!(begin("now+1week"), NOW_MS + 7 * 86_400_000);
    assert_eq!(begin("now-1hour"), NOW_MS - 3_600_000);
    assert_eq!(begin("uts1800000000"), 1_800_000_000_000);
    // The short option.
    assert_eq!(spec(&["-b", "now+5minutes", "job.sh"], SCRIPT).begin_ms, Some(NOW_MS + 300_000));
}

#[test]
fn begin_uses_the_submitters_utc_offset() {
    let mut c = ctx();
    c.utc_offset_s = -5 * 3600;
    let cmd = parse_command_line(&args(&["--begin=16:00", "job.sh"])).unwrap();
    // 16:00 at UTC-5 is 21:00 UTC; now there is 09:30 so it is today.
    let utc = days_from_civil(2026, 3, 10) * 86_400 + 21 * 3600;
    assert_eq!(build_spec(&cmd, Some(SCRIPT), &c).unwrap().spec.begin_ms, Some(utc as u64 * 1000));
}

#[test]
fn bad_begin_values_are_refused() {
    for bad in [
        "now+1h",
        "now+",
        "now+hours",
        "nowish",
        "now+1hour30minutes",
        "tomorow",
        "25:00",
        "10:60",
        "10:5",
        "10:00:61",
        "13:00pm",
        "1:00 xm",
        "13/01",
        "00/10",
        "03/32",
        "2026-1-20",
        "2026-13-01",
        "03/15/2027",
        "12pm",
        "uts5",
        "uts",
        "  ",
        "-",
        "T",
        "next friday",
    ] {
        let msg = cmd_err(&["--begin", bad]);
        assert!(msg.starts_with(&format!("invalid --begin value {bad:?}: ")), "{bad:?}: {msg}");
        assert!(msg.ends_with(ACCEPTED_DATE_FORMATS), "{bad:?}: {msg}");
    }
    // Slurm's scan skips a capital T as the date/time separator, so a capitalized word is not a keyword.
    assert!(cmd_err(&["--begin=Today"]).contains("unexpected \"oday\""));
    assert!(cmd_err(&["--deadline=now+1fortnight"]).starts_with("invalid --deadline value"));
    let err = build_err(&["--begin=1969-12-31", "job.sh"], SCRIPT);
    assert_eq!(err.to_string(), "--begin names a time before 1970 or beyond any calendar");
}

#[test]
fn deadline_must_not_precede_begin() {
    let s = spec(&["--begin=now+1hour", "--deadline=tomorrow", "job.sh"], SCRIPT);
    assert_eq!((s.begin_ms, s.deadline_ms), (Some(NOW_MS + 3_600_000), Some(local_ms(TOMORROW, (0, 0, 0)))));
    let s = spec(&["--deadline=now+2days", "job.sh"], SCRIPT);
    assert_eq!((s.begin_ms, s.deadline_ms), (None, Some(NOW_MS + 2 * 86_400_000)));
    let err = build_err(&["--begin=tomorrow", "--deadline=now+1hour", "job.sh"], SCRIPT);
    assert_eq!(err.to_string(), "Incompatible begin and deadline time specification: --deadline is before --begin");
    // In a directive too, with the same clock.
    let s = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --begin=now+10minutes\n");
    assert_eq!(s.begin_ms, Some(NOW_MS + 600_000));
}

// ---- options Drover does not act on ----

#[test]
fn unused_options_warn_and_take_their_values_as_getopt_does() {
    // (argv before the script, the one warning)
    let cases: &[(&[&str], &str)] = &[
        (&["--gpu-bind=closest"], "--gpu-bind is ignored: every task sees all of the job's GPUs on its node"),
        (&["--gpu-bind", "single:1"], "--gpu-bind is ignored"),
        (&["--distribution=block:cyclic"], "--distribution is ignored: tasks are laid out in blocks"),
        (&["-m", "cyclic"], "--distribution is ignored"),
        (&["-mcyclic"], "--distribution is ignored"),
        (&["--hint", "nomultithread"], "--hint is ignored: Drover does not bind tasks to cores"),
        (&["--mcs-label=g"], "--mcs-label is ignored"),
        (&["--profile=task"], "--profile is ignored"),
        (&["--acctg-freq", "task=30"], "--acctg-freq is ignored"),
        (&["--propagate"], "--propagate is ignored"),
        (&["--propagate=STACK,CORE"], "--propagate is ignored"),
        (&["--get-user-env"], "--get-user-env is ignored"),
        (&["--get-user-env=10L"], "--get-user-env is ignored"),
        (&["--tmp=100G"], "--tmp is ignored: Drover does not track local disk space"),
        (&["--ntasks-per-core=1"], "--ntasks-per-core is ignored"),
        (&["--ntasks-per-socket", "2"], "--ntasks-per-socket is ignored"),
        (&["--cores-per-socket=8"], "--cores-per-socket is ignored"),
        (&["--sockets-per-node=2"], "--sockets-per-node is ignored"),
        (&["--threads-per-core=1"], "--threads-per-core is ignored"),
        (&["-B", "2:8:1"], "--extra-node-info is ignored"),
        (&["-S", "2"], "--core-spec is ignored"),
        (&["--thread-spec=2"], "--thread-spec is ignored"),
        (&["--mincpus=16"], "--mincpus is ignored"),
        (&["--switches=1@10:00"], "--switches is ignored"),
        (&["--power=level"], "--power is ignored"),
        (&["-L", "matlab:1"], "--licenses is ignored: Drover tracks no licenses"),
        (&["--licenses=a,b"], "--licenses is ignored"),
        (&["--spread-job"], "--spread-job is ignored"),
        (&["--use-min-nodes"], "--use-min-nodes is ignored"),
        (&["--overcommit"], "--overcommit is ignored"),
        (&["-O"], "--overcommit is ignored"),
        (&["--export-file=vars.env"], "--export-file is ignored: the variables in that file are not loaded"),
        (&["--priority=TOP"], "--priority is ignored: only an operator may set a job's priority"),
        (&["--delay-boot=10"], "--delay-boot is ignored: Drover never reboots nodes for a job"),
        (&["--reboot"], "--reboot is ignored"),
        (&["--cpu-freq=high"], "--cpu-freq is ignored"),
        (&["--network=x"], "--network is ignored"),
        (&["--mem-bind=local"], "--mem-bind is ignored"),
        (&["--gres-flags=enforce-binding"], "--gres-flags is ignored"),
        (&["--prefer=a100"], "--prefer is ignored"),
        (&["--contiguous"], "--contiguous is ignored"),
        (&["--batch=feature"], "--batch is ignored"),
        (&["--cluster-constraint=x"], "--cluster-constraint is ignored"),
        (&["--context=unconfined_u"], "--context is ignored"),
        (&["--wait-all-nodes=1"], "--wait-all-nodes is ignored"),
        (&["--verbose"], "--verbose is ignored: Drover's sbatch has no verbose output"),
        (&["-vv"], "--verbose is ignored"),
        (&["--exclusive=user"], "--exclusive=user is treated as --exclusive: the job's nodes run no other job"),
        (&["--exclusive=MCS"], "--exclusive=mcs is treated as --exclusive"),
        (&["--oversubscribe"], "--oversubscribe only lifts --exclusive: Drover never oversubscribes CPUs or GPUs"),
        (&["-s"], "--oversubscribe only lifts --exclusive"),
    ];
    let plain = spec(&["job.sh"], SCRIPT);
    for (list, warning) in cases {
        let mut full = list.to_vec();
        full.extend(["job.sh", "arg"]);
        let parsed = submit(&full, Some(SCRIPT)).unwrap_or_else(|e| panic!("{list:?}: {e}"));
        // The script is still the script: an optional value was not taken from the next word.
        assert_eq!(parsed.script_path.as_deref(), Some("job.sh"), "{list:?}");
        assert_eq!(parsed.spec.script_args, ["arg"], "{list:?}");
        assert_eq!(parsed.warnings.len(), 1, "{list:?}: {:?}", parsed.warnings);
        assert!(parsed.warnings[0].starts_with(warning), "{list:?}: {:?}", parsed.warnings);
        // And nothing else about the job changed (bar the exclusive flag).
        let mut s = parsed.spec;
        s.exclusive = false;
        s.script_args.clear();
        assert_eq!(s, plain, "{list:?}");
    }
}

#[test]
fn unused_options_in_directives_and_silent_ones() {
    let parsed =
        submit(&["job.sh"], Some("#!/bin/sh\n#SBATCH --hint=compute_bound -m block\n#SBATCH --hint=x\n")).unwrap();
    // Each warning once.
    assert_eq!(
        parsed.warnings,
        [
            "--hint is ignored: Drover does not bind tasks to cores",
            "--distribution is ignored: tasks are laid out in blocks, filling one node after another"
        ]
    );
    // What Drover does anyway needs no warning.
    for quiet in [
        &["--ignore-pbs"][..],
        &["--kill-on-invalid-dep=no"],
        &["--mail-type=none"],
        &["--clusters="],
        &["-M", ""],
        &["--input=/dev/null"],
        &["--exclusive"],
        &["--exclusive=exclusive"],
    ] {
        let mut full = quiet.to_vec();
        full.push("job.sh");
        assert_eq!(warnings(&full), Vec::<String>::new(), "{quiet:?}");
    }
    // Value-less ones refuse a value; some values are still checked.
    assert_eq!(cmd_err(&["--reboot=yes"]), "option --reboot takes no value, but was given \"yes\"");
    assert_eq!(
        cmd_err(&["--kill-on-invalid-dep=maybe"]),
        "invalid --kill-on-invalid-dep value \"maybe\": expected yes or no"
    );
    assert_eq!(cmd_err(&["--hint"]), "option --hint requires a value");
}

#[test]
fn exclusive_takes_an_optional_mode() {
    assert!(spec(&["--exclusive", "job.sh"], SCRIPT).exclusive);
    assert!(spec(&["--exclusive=user", "job.sh"], SCRIPT).exclusive);
    assert!(!spec(&["--exclusive=oversubscribe", "job.sh"], SCRIPT).exclusive);
    // The later of --exclusive and --oversubscribe wins, as both set Slurm's one sharing field.
    assert!(!spec(&["--exclusive", "-s", "job.sh"], SCRIPT).exclusive);
    assert!(spec(&["-s", "--exclusive", "job.sh"], SCRIPT).exclusive);
    assert!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --exclusive\n").exclusive);
    // getopt's optional value: `--exclusive user` leaves `user` as the script.
    assert_eq!(submit(&["--exclusive", "user"], Some(SCRIPT)).unwrap().script_path.as_deref(), Some("user"));
    assert_eq!(
        cmd_err(&["--exclusive=node"]),
        "invalid --exclusive value \"node\": expected user, mcs or oversubscribe (or no value)"
    );
}

#[test]
fn multi_site_comes_from_the_flag_a_directive_or_its_variable() {
    assert!(!spec(&["-N", "3", "job.sh"], SCRIPT).multi_site, "one site by default");
    assert!(spec(&["--multi-site", "job.sh"], SCRIPT).multi_site);
    assert!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --multi-site\n").multi_site);
    assert!(with_env(&[("SBATCH_MULTI_SITE", "1")], &["job.sh"], SCRIPT).unwrap().spec.multi_site);
    assert!(!with_env(&[("SBATCH_MULTI_SITE", "0")], &["job.sh"], SCRIPT).unwrap().spec.multi_site);
    assert!(cmd_err(&["--multi-site=yes"]).contains("--multi-site"));
}

#[test]
fn no_kill_takes_set_off_or_no() {
    assert!(spec(&["-k", "job.sh"], SCRIPT).no_kill);
    assert!(spec(&["--no-kill=set", "job.sh"], SCRIPT).no_kill);
    assert!(!spec(&["--no-kill=off", "job.sh"], SCRIPT).no_kill);
    // A later =off undoes an earlier one.
    assert!(!spec(&["--no-kill=off", "job.sh"], "#!/bin/sh\n#SBATCH --no-kill\n").no_kill);
    assert_eq!(cmd_err(&["--no-kill=yes"]), "invalid --no-kill value \"yes\": expected set, off or no (or no value)");
}

#[test]
fn options_drover_refuses() {
    let cases: &[(&[&str], &str)] = &[
        (&["--uid=0"], "--uid: only root may submit as another user; Drover takes the user from your credential"),
        (&["--gid", "wheel"], "--gid: only root may submit as another group"),
        (&["--test-only"], "--test-only: not supported yet"),
        (&["--clusters=other"], "--clusters: Drover runs a single cluster"),
        (&["-M", "a,b"], "-M: Drover runs a single cluster"),
        (&["--cluster=x"], "--cluster: Drover runs a single cluster"),
        (&["-i", "input.txt"], "-i: not supported: a batch script's stdin is /dev/null"),
        (&["--gpus-per-socket=1"], "--gpus-per-socket: not supported"),
        (&["--bb=capacity=1G"], "--bb: burst buffers are not supported"),
        (&["--bbf=bb.conf"], "--bbf: burst buffers are not supported"),
        (&["--container=/img"], "--container: Slurm's OCI bundles (--container=PATH) are not supported"),
        (&["-F", "hosts"], "-F: not supported; list the nodes with --nodelist"),
    ];
    for (list, error) in cases {
        let mut full = list.to_vec();
        full.push("job.sh");
        let msg = cmd_err(&full);
        assert!(msg.starts_with(error), "{list:?}: {msg}");
    }
    // Even bundled, and in a directive.
    assert!(cmd_err(&["-HF", "hosts"]).starts_with("-F: not supported"), "{}", cmd_err(&["-HF", "hosts"]));
    let err = script_err("#!/bin/sh\n#SBATCH --uid=root\n");
    assert!(matches!(err, SbatchError::Directive { line: 2, error: OptionError::Refused { .. }, .. }), "{err}");
}

// ---- --quiet ----

#[test]
fn quiet_is_read_from_the_command_line_only() {
    let parsed = submit(&["-Q", "--hint=x", "job.sh"], Some(SCRIPT)).unwrap();
    // The warnings are still there; sbatch does not print them.
    assert!(parsed.quiet);
    assert_eq!(parsed.warnings.len(), 1);
    assert!(submit(&["--quiet", "--parsable", "job.sh"], Some(SCRIPT)).unwrap().quiet);
    let parsed = submit(&["job.sh"], Some("#!/bin/sh\n#SBATCH -Q\n")).unwrap();
    assert!(!parsed.quiet);
    assert_eq!(parsed.warnings, ["--quiet in a #SBATCH line has no effect; give it on the command line"]);
    assert_eq!(cmd_err(&["-Q", "-v", "job.sh"]), "don't specify both --verbose (-v) and --quiet (-Q)");
    assert_eq!(cmd_err(&["-vQ"]), "don't specify both --verbose (-v) and --quiet (-Q)");
}

// ---- input environment variables ----

fn with_env(vars: &[(&str, &str)], list: &[&str], script: &str) -> Result<ParsedSubmit, SbatchError> {
    let mut c = ctx();
    c.env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    build_spec(&parse_command_line(&args(list))?, Some(script), &c)
}

#[test]
fn environment_variables_set_options() {
    let vars = [
        ("SBATCH_PARTITION", "gpu"),
        ("SBATCH_ACCOUNT", "proj"),
        ("SBATCH_JOB_NAME", "from-env"),
        ("SBATCH_TIMELIMIT", "2:00:00"),
        ("SBATCH_GPUS_PER_NODE", "h100:4"),
        ("SBATCH_MEM_PER_GPU", "80G"),
        ("SBATCH_CPUS_PER_GPU", "12"),
        ("SBATCH_QOS", "high"),
        ("SBATCH_RESERVATION", "r1"),
        ("SBATCH_WCKEY", "wk"),
        ("SBATCH_CONSTRAINT", "ib"),
        ("SBATCH_ARRAY_INX", "0-3%2"),
        ("SBATCH_OUTPUT", "out-%j"),
        ("SBATCH_ERROR", "err-%j"),
        ("SBATCH_OPEN_MODE", "append"),
        ("SBATCH_SIGNAL", "USR1@120"),
        ("SBATCH_REQUEUE", "1"),
        ("SBATCH_NO_KILL", ""),
        ("SBATCH_EXCLUSIVE", ""),
    ];
    let s = with_env(&vars, &["job.sh"], SCRIPT).unwrap().spec;
    assert_eq!(
        (s.partition.as_deref(), s.account.as_deref(), s.name.as_str()),
        (Some("gpu"), Some("proj"), "from-env")
    );
    assert_eq!((s.time_limit_s, s.gpus_per_node, s.gpu_type.as_deref()), (Some(7200), 4, Some("h100")));
    assert_eq!((s.mem, s.cpus_per_task, s.cpus_per_gpu), (Some(MemRequest::PerGpu(80 * 1024)), 48, Some(12)));
    assert_eq!(
        (s.qos.as_deref(), s.reservation.as_deref(), s.wckey.as_deref()),
        (Some("high"), Some("r1"), Some("wk"))
    );
    assert_eq!(s.constraint, ["ib"]);
    assert_eq!(s.array, Some(ArraySpec { task_ids: vec![0, 1, 2, 3].into(), max_running: Some(2) }));
    assert_eq!((s.stdout.as_deref(), s.stderr.as_deref(), s.open_append), (Some("out-%j"), Some("err-%j"), true));
    assert_eq!(s.signal.map(|w| w.before_s), Some(120));
    assert_eq!((s.requeue, s.no_kill, s.exclusive), (Some(true), true, true));
    // The variables themselves still reach the job (--export=ALL).
    assert!(s.environment.contains(&("SBATCH_PARTITION".into(), "gpu".into())));
}

#[test]
fn command_line_beats_environment_beats_script() {
    let script = "#!/bin/sh\n#SBATCH -p from-script -t 10 -J script-name\n";
    let vars = [("SBATCH_PARTITION", "from-env"), ("SBATCH_TIMELIMIT", "20")];
    let s = with_env(&vars, &["job.sh"], script).unwrap().spec;
    assert_eq!(
        (s.partition.as_deref(), s.time_limit_s, s.name.as_str()),
        (Some("from-env"), Some(1200), "script-name")
    );
    let s = with_env(&vars, &["-p", "from-cli", "job.sh"], script).unwrap().spec;
    assert_eq!((s.partition.as_deref(), s.time_limit_s), (Some("from-cli"), Some(1200)));
    // SBATCH_EXPORT=NONE, overridden by --export on the command line.
    let s = with_env(&[("SBATCH_EXPORT", "NONE")], &["job.sh"], SCRIPT).unwrap().spec;
    assert!(s.environment.is_empty());
    let s = with_env(&[("SBATCH_EXPORT", "NONE")], &["--export=HOME", "job.sh"], SCRIPT).unwrap().spec;
    let exported = vec![("HOME".to_string(), "/home/alice".to_string()), ("SLURM_EXPORT_ENV".into(), "HOME".into())];
    assert_eq!(s.environment, exported);
}

#[test]
fn environment_variables_apply_in_slurms_order() {
    // SBATCH_GPUS comes after SBATCH_GRES in Slurm's table, wherever they stand in the environment.
    let s = with_env(&[("SBATCH_GPUS", "8"), ("SBATCH_GRES", "gpu:2")], &["job.sh"], SCRIPT).unwrap().spec;
    assert_eq!((s.gpus_per_node, s.gpus_total), (0, Some(8)));
    // A duplicate name: the first, as getenv finds it.
    let s = with_env(&[("SBATCH_QOS", "a"), ("SBATCH_QOS", "b")], &["job.sh"], SCRIPT).unwrap().spec;
    assert_eq!(s.qos.as_deref(), Some("a"));
}

#[test]
fn memory_variables_give_way_to_options() {
    use MemRequest::*;
    let mem = |vars: &[(&str, &str)], list: &[&str], script: &str| with_env(vars, list, script).map(|p| p.spec.mem);
    // An option of any kind, in the script or on the command line, overrides the variables.
    assert_eq!(mem(&[("SBATCH_MEM_PER_CPU", "1G")], &["--mem=4G", "job.sh"], SCRIPT), Ok(Some(PerNode(4096))));
    assert_eq!(
        mem(&[("SBATCH_MEM_PER_NODE", "1G")], &["job.sh"], "#!/bin/sh\n#SBATCH --mem-per-cpu=2G\n"),
        Ok(Some(PerCpu(2048)))
    );
    assert_eq!(mem(&[("SBATCH_MEM_PER_NODE", "1G")], &["job.sh"], SCRIPT), Ok(Some(PerNode(1024))));
    // Two kinds among the variables alone are an error.
    let err = mem(&[("SBATCH_MEM_PER_NODE", "1G"), ("SBATCH_MEM_PER_CPU", "1G")], &["job.sh"], SCRIPT).unwrap_err();
    assert_eq!(
        err.to_string(),
        "SBATCH_MEM_PER_NODE, SBATCH_MEM_PER_CPU, and SBATCH_MEM_PER_GPU are mutually exclusive"
    );
    assert_eq!(
        mem(&[("SBATCH_MEM_PER_NODE", "1G"), ("SBATCH_MEM_PER_CPU", "1G")], &["--mem=2G", "job.sh"], SCRIPT),
        Ok(Some(PerNode(2048)))
    );
}

#[test]
fn flag_variables_follow_slurms_truth_rules() {
    let requeue = |value: &str| with_env(&[("SBATCH_REQUEUE", value)], &["job.sh"], SCRIPT).unwrap().spec.requeue;
    for on in ["", "1", "yes", "YES", "-1", "007"] {
        assert_eq!(requeue(on), Some(true), "{on:?}");
    }
    for off in ["0", "no", "true", "000"] {
        assert_eq!(requeue(off), None, "{off:?}");
    }
    let s = with_env(&[("SBATCH_NO_REQUEUE", "1"), ("SBATCH_REQUEUE", "1")], &["job.sh"], SCRIPT).unwrap().spec;
    // SBATCH_REQUEUE comes later in Slurm's table.
    assert_eq!(s.requeue, Some(true));
    // Optional values: empty is no value.
    let s = with_env(&[("SBATCH_EXCLUSIVE", "user")], &["job.sh"], SCRIPT).unwrap();
    assert!(s.spec.exclusive);
    assert_eq!(s.warnings.len(), 1);
    let s = with_env(&[("SBATCH_NO_KILL", "off")], &["job.sh"], SCRIPT).unwrap().spec;
    assert!(!s.no_kill);
    // SBATCH_WAIT waits, unless it says no.
    assert!(with_env(&[("SBATCH_WAIT", "1")], &["job.sh"], SCRIPT).unwrap().wait);
    assert!(!with_env(&[("SBATCH_WAIT", "0")], &["job.sh"], SCRIPT).unwrap().wait);
}

#[test]
fn bad_or_empty_variables() {
    let err = with_env(&[("SBATCH_MEM_PER_CPU", "4X")], &["job.sh"], SCRIPT).unwrap_err();
    assert!(matches!(&err, SbatchError::Environment { var, .. } if var == "SBATCH_MEM_PER_CPU"));
    assert!(
        err.to_string().starts_with("environment variable SBATCH_MEM_PER_CPU: invalid --mem-per-cpu value \"4X\""),
        "{err}"
    );
    let err = with_env(&[("SLURM_CLUSTERS", "other")], &["job.sh"], SCRIPT).unwrap_err();
    assert!(err.to_string().starts_with("environment variable SLURM_CLUSTERS: --clusters:"), "{err}");
    // Empty says nothing.
    let s = with_env(&[("SBATCH_PARTITION", ""), ("SBATCH_TIMELIMIT", "")], &["job.sh"], SCRIPT).unwrap().spec;
    assert_eq!((s.partition, s.time_limit_s), (None, None));
    // Warned options warn from the environment too.
    let parsed = with_env(&[("SLURM_HINT", "nomultithread")], &["job.sh"], SCRIPT).unwrap();
    assert_eq!(parsed.warnings, ["--hint is ignored: Drover does not bind tasks to cores"]);
}

#[test]
fn only_sbatch_reads_sbatch_variables() {
    let mut c = ctx();
    c.sbatch_env = false;
    c.env.push(("SBATCH_PARTITION".into(), "gpu".into()));
    c.env.push(("SBATCH_WAIT".into(), "1".into()));
    let cmd = parse_command_line(&args(&["job.sh"])).unwrap();
    assert_eq!(build_spec(&cmd, Some(SCRIPT), &c).unwrap().spec.partition, None);
}

// ---- directive scanning, as Slurm's ----

#[test]
fn old_slurm_prefix_is_read_with_a_warning() {
    let parsed = submit(&["job.sh"], Some("#!/bin/sh\n#SLURM -N 2\n#SBATCH -J x\n#SLURM -t 5\n")).unwrap();
    assert_eq!((parsed.spec.min_nodes, parsed.spec.time_limit_s), (2, Some(300)));
    assert_eq!(
        parsed.warnings,
        ["script line 2: change #SLURM to #SBATCH in your script, and check the options are valid in sbatch"]
    );
}

#[test]
fn directives_stop_where_slurm_stops() {
    // C whitespace (vertical tab, form feed) before a comment keeps the scan going ...
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n\x0b# c\n\x0c\n#SBATCH -N 2\n").min_nodes, 2);
    // ... but a no-break space is not C whitespace: that line is a command.
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n\u{a0}# c\n#SBATCH -N 2\n").min_nodes, 1);
    // Inside a directive only C whitespace separates words.
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH -J a\u{a0}b\x0b-N\x0c3\n").name, "a\u{a0}b");
    assert_eq!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH -J a\u{a0}b\x0b-N\x0c3\n").min_nodes, 3);
}

#[test]
fn heterogeneous_jobs_are_refused_clearly() {
    let err = script_err("#!/bin/sh\n#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 2\n");
    assert_eq!(
        err.to_string(),
        "script line 3: heterogeneous jobs (#SBATCH hetjob) are not supported; submit the components as \
         separate jobs (in \"#SBATCH hetjob\")"
    );
    assert!(matches!(
        script_err("#!/bin/sh\n#SBATCH packjob\n"),
        SbatchError::Directive { error: OptionError::HetJob { .. }, .. }
    ));
}

#[test]
fn input_variables_are_applied_in_slurms_order() {
    // Slurm 22.05's sbatch reads its input variables in this order (src/sbatch/opt.c, env_vars[]); where two
    // options replace each other the later variable wins. Drover's own SBATCH_MULTI_SITE and SBATCH_PROGRESS_TIMEOUT come last. The one
    // difference: SBATCH_WAIT4SWITCH is read beside SBATCH_REQ_SWITCH, as both only make --switches warn.
    let expected = [
        "SBATCH_IGNORE_PBS",
        "SBATCH_ACCOUNT",
        "SBATCH_ARRAY_INX",
        "SBATCH_ACCTG_FREQ",
        "SBATCH_BATCH",
        "SBATCH_BURST_BUFFER",
        "SBATCH_CLUSTER_CONSTRAINT",
        "SBATCH_CLUSTERS",
        "SLURM_CLUSTERS",
        "SBATCH_CONTAINER",
        "SBATCH_CONSTRAINT",
        "SBATCH_CORE_SPEC",
        "SBATCH_CPU_FREQ_REQ",
        "SBATCH_CPUS_PER_GPU",
        "SBATCH_DEBUG",
        "SBATCH_DELAY_BOOT",
        "SBATCH_DISTRIBUTION",
        "SBATCH_EXCLUSIVE",
        "SBATCH_EXPORT",
        "SBATCH_GET_USER_ENV",
        "SBATCH_GRES",
        "SBATCH_GRES_FLAGS",
        "SBATCH_GPUS",
        "SBATCH_GPU_BIND",
        "SBATCH_GPU_FREQ",
        "SBATCH_GPUS_PER_NODE",
        "SBATCH_GPUS_PER_SOCKET",
        "SBATCH_GPUS_PER_TASK",
        "SLURM_HINT",
        "SBATCH_HINT",
        "SBATCH_JOB_NAME",
        "SBATCH_MEM_BIND",
        "SBATCH_MEM_PER_CPU",
        "SBATCH_MEM_PER_GPU",
        "SBATCH_MEM_PER_NODE",
        "SBATCH_NETWORK",
        "SBATCH_NO_KILL",
        "SBATCH_NO_REQUEUE",
        "SBATCH_OPEN_MODE",
        "SBATCH_OVERCOMMIT",
        "SBATCH_PARTITION",
        "SBATCH_POWER",
        "SBATCH_PROFILE",
        "SBATCH_QOS",
        "SBATCH_REQ_SWITCH",
        "SBATCH_WAIT4SWITCH",
        "SBATCH_REQUEUE",
        "SBATCH_RESERVATION",
        "SBATCH_SIGNAL",
        "SBATCH_SPREAD_JOB",
        "SBATCH_THREAD_SPEC",
        "SBATCH_THREADS_PER_CORE",
        "SBATCH_TIMELIMIT",
        "SBATCH_USE_MIN_NODES",
        "SBATCH_WAIT",
        "SBATCH_WAIT_ALL_NODES",
        "SBATCH_WCKEY",
        "SBATCH_ERROR",
        "SBATCH_INPUT",
        "SBATCH_OUTPUT",
        "SBATCH_MULTI_SITE",
        "SBATCH_PROGRESS_TIMEOUT",
    ];
    let read: Vec<&str> = env_options().map(|(var, _)| var).collect();
    assert_eq!(read, expected);
}

#[test]
fn kill_on_invalid_dep_asks_for_cancellation_when_a_dependency_can_never_hold() {
    assert!(spec(&["--kill-on-invalid-dep=yes", "job.sh"], SCRIPT).kill_on_invalid_dep);
    assert!(spec(&["job.sh"], "#!/bin/sh\n#SBATCH --kill-on-invalid-dep=YES\n").kill_on_invalid_dep);
    assert!(!spec(&["--kill-on-invalid-dep=yes", "--kill-on-invalid-dep=no", "job.sh"], SCRIPT).kill_on_invalid_dep);
    assert!(!spec(&["job.sh"], SCRIPT).kill_on_invalid_dep, "Slurm's default: stay pending");
    assert_eq!(warnings(&["--kill-on-invalid-dep=yes", "job.sh"]), Vec::<String>::new());
    // Slurm's sbatch reads no SBATCH_KILL_ON_INVALID_DEP (tried on its peer: the job stayed pending).
    let s = with_env(&[("SBATCH_KILL_ON_INVALID_DEP", "yes")], &["job.sh"], SCRIPT).unwrap().spec;
    assert!(!s.kill_on_invalid_dep);
}

/// `--gpu-freq` as Slurm 22.05's sbatch reads it (tried on its peer): a value it refuses is refused, before anything
/// is sent; `SBATCH_GPU_FREQ` stands for it and the command line wins.
#[test]
fn gpu_freq_asks_for_gpu_clocks() {
    use drover_state::job::{ClockLevel, GpuFreq};
    let freq = spec(&["--gpu-freq=medium,memory=high", "job.sh"], SCRIPT).gpu_freq.map(|f| *f);
    assert_eq!(
        freq,
        Some(GpuFreq { graphics: Some(ClockLevel::Medium), memory: Some(ClockLevel::High), verbose: false })
    );
    let from_script = spec(&["job.sh"], "#!/bin/sh\n#SBATCH --gpu-freq=450\n").gpu_freq.map(|f| *f);
    assert_eq!(from_script.and_then(|f| f.graphics), Some(ClockLevel::Mhz(450)));
    assert_eq!(spec(&["job.sh"], SCRIPT).gpu_freq, None);
    assert_eq!(warnings(&["--gpu-freq=low", "job.sh"]), Vec::<String>::new());
    let s = with_env(&[("SBATCH_GPU_FREQ", "low")], &["--gpu-freq=high", "job.sh"], SCRIPT).unwrap().spec;
    assert_eq!(s.gpu_freq.and_then(|f| f.graphics), Some(ClockLevel::High));
    assert!(cmd_err(&["--gpu-freq=HIGH"]).starts_with("invalid --gpu-freq value \"HIGH\": expected"));
    assert!(cmd_err(&["--gpu-freq="]).starts_with("invalid --gpu-freq value \"\""));
}

// ---- pyxis's container options ----

#[test]
fn pyxis_options_build_the_jobs_container_with_paths_resolved_where_the_job_runs() {
    use drover_state::container::{ImageRef, MountSource};
    // In a directive `#` starts a comment, as in Slurm: pyxis's users escape it or write docker's form.
    let script = "#!/bin/sh\n#SBATCH --container-image=nvcr.io\\#nvidia/pytorch:24.05-py3\n#SBATCH --container-mounts=/data:/data:ro,ckpt:/ckpt\ntrain\n";
    let job = spec(
        &[
            "--chdir=run",
            "--container-name=dev",
            "--container-remap-root",
            "--container-env=HF_HOME,WANDB_KEY",
            "job.sh",
        ],
        script,
    );
    let c = job.container.expect("a container");
    assert_eq!(c.image, Some(ImageRef::parse("nvcr.io#nvidia/pytorch:24.05-py3").unwrap()));
    assert_eq!(c.mounts.len(), 2);
    assert!(c.mounts[0].readonly);
    assert_eq!(c.mounts[1].source, MountSource::Path("/home/alice/work/run/ckpt".into()), "relative to --chdir");
    assert_eq!((c.name.as_deref(), c.remap_root, c.readonly), (Some("dev"), true, false));
    assert_eq!(c.env, ["HF_HOME", "WANDB_KEY"]);

    // The command line wins over the script; the last of a pair wins.
    let job = spec(
        &[
            "--container-image=./img.sqsh",
            "--container-readonly",
            "--container-writable",
            "--no-container-remap-root",
            "job.sh",
        ],
        script,
    );
    let c = job.container.unwrap();
    assert_eq!(c.image, Some(ImageRef::File("/home/alice/work/img.sqsh".into())));
    assert!(!c.readonly && !c.remap_root);
    assert!(spec(&["--container-mounts=/a:/b", "job.sh"], SCRIPT).container.is_none(), "mounts alone: no container");
}

#[test]
fn bad_container_options_are_refused_with_the_reason() {
    for (list, wanted) in [
        (&["--container-image=Ubuntu"][..], "invalid --container-image value \"Ubuntu\""),
        (&["--container-mounts=/a:b"], "must be an absolute path"),
        (&["--container-mounts=/a:/b:rshared"], "propagation is not offered"),
        (&["--container-workdir=rel"], "absolute path"),
        (&["--container-env=1BAD"], "variable name"),
        (
            &["--container-foo=1"],
            "unrecognized container option \"--container-foo\"; the container options are pyxis's",
        ),
    ] {
        let mut full = list.to_vec();
        full.push("job.sh");
        let msg = cmd_err(&full);
        assert!(msg.contains(wanted), "{list:?}: {msg}");
    }
    let err = submit(&["--container-name=../x", "--container-image=ubuntu", "job.sh"], Some(SCRIPT)).unwrap_err();
    assert!(err.to_string().contains("a name is"), "{err}");
}

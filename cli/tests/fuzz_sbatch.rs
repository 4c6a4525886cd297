//! Bounded fuzzing (proptest, stable Rust: no cargo-fuzz) of `sbatch`'s command line and `#SBATCH` directive
//! parser, and of the job references `scancel`/`scontrol`/`squeue -j` take.
//!
//! Each target runs a fixed number of cases in the normal test suite. Inputs are fully arbitrary (any argv, any
//! script text) and grammar-aware: real option names in every spelling (`--opt=value`, `--opt value`, `-Xvalue`,
//! `-X value`, bundles, `--`), with values near what each option accepts (counts at the edges of u32, GPU specs,
//! time limits, `--begin` dates, memory sizes, arrays, dependencies, hostlists, export lists with quotes), scripts
//! made of `#SBATCH` lines with quotes, escapes and comments, and `SBATCH_*` input environment variables under any
//! clock and UTC offset. Whatever the input, parsing and building the job return `Ok` or `Err`: a panic, an
//! integer overflow (debug builds panic on it) or an allocation sized by the input is a defect.

use drover_cli::job_refs::{base_ids, names, parse_refs, select, split_refs};
use drover_cli::sbatch_args::{CommandLine, SubmitContext, build_spec, env_options, parse_command_line};
use drover_state::{ArrayTask, Job};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per target: enough to reach the deep paths, few enough for a debug build on two cores.
const CASES: u32 = 2_000;

fn config() -> Config {
    // No regression files: a failure prints its minimal input, which belongs in a named unit test by the parser.
    Config { cases: CASES, failure_persistence: None, ..Config::default() }
}

const SCRIPT: &str = "#!/bin/sh\necho hi\n";

fn ctx() -> SubmitContext {
    SubmitContext {
        user: "alice".into(),
        uid: 1000,
        gid: 100,
        cwd: "/home/alice".into(),
        env: vec![("PATH".into(), "/usr/bin".into()), ("HOME".into(), "/home/alice".into())],
        // 2026-03-10T13:30:15Z, at UTC+1.
        now_ms: 1_773_149_415_000,
        utc_offset_s: 3_600,
        sbatch_env: true,
        submission: None,
    }
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Every long option sbatch knows, and a few it does not.
const LONG: &[&str] = &[
    "job-name",
    "partition",
    "account",
    "nodes",
    "ntasks",
    "ntasks-per-node",
    "cpus-per-task",
    "gres",
    "gpus-per-node",
    "gpus",
    "gpus-per-task",
    "array",
    "dependency",
    "qos",
    "reservation",
    "nice",
    "time",
    "output",
    "error",
    "chdir",
    "export",
    "open-mode",
    "exclusive",
    "constraint",
    "nodelist",
    "exclude",
    "requeue",
    "no-requeue",
    "hold",
    "parsable",
    "wrap",
    "mail-type",
    "mail-user",
    "comment",
    "mem",
    "mem-per-cpu",
    "mem-per-gpu",
    "cpus-per-gpu",
    "ntasks-per-gpu",
    "ntasks-per-tres",
    "tasks-per-node",
    "wckey",
    "time-min",
    "begin",
    "deadline",
    "signal",
    "no-kill",
    "oversubscribe",
    "quiet",
    "verbose",
    "gpu-bind",
    "distribution",
    "hint",
    "get-user-env",
    "propagate",
    "kill-on-invalid-dep",
    "licenses",
    "priority",
    "uid",
    "wait",
    "test-only",
    "clusters",
    "input",
    "gpus-per-socket",
    "x11",
    "node",
    "",
    "NODES",
    "gpus=",
];

/// Every short option, and a few that do not exist.
const SHORT: &[char] = &[
    'J', 'p', 'A', 'N', 'n', 'c', 'G', 'a', 'd', 'q', 't', 'o', 'e', 'D', 'C', 'w', 'x', 'H', 'b', 'k', 'm', 'L', 'O',
    's', 'Q', 'v', 'W', 'M', 'i', 'F', 'S', 'B', 'z', 'é', '-',
];

/// Digit runs: small counts, the edges of u32/i32/u64, and runs too long for any integer.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u32..20).prop_map(|n| n.to_string()),
        2 => proptest::sample::select(&[
            "0", "1", "2147483645", "2147483646", "2147483647", "2147483648", "-2147483648", "4294967295",
            "4294967296", "9223372036854775807", "18446744073709551615", "18446744073709551616", "-1", "+5", "007",
        ][..]).prop_map(str::to_string),
        1 => "[0-9]{1,12}",
        1 => "[0-9]{19,40}",
    ]
}

/// Values near what the options accept, and some that are nothing like it.
fn value() -> impl Strategy<Value = String> {
    let gpu_type = proptest::sample::select(&["a100", "h100", "h100-80gb", "a.b_c", "", "gpu", "é", "a b"][..]);
    prop_oneof![
        4 => number(),
        2 => (number(), number()).prop_map(|(a, b)| format!("{a}-{b}")),
        2 => (gpu_type.clone(), number()).prop_map(|(t, n)| format!("{t}:{n}")),
        2 => (gpu_type.clone(), number()).prop_map(|(t, n)| format!("gpu:{t}:{n}")),
        1 => number().prop_map(|n| format!("gpu:{n}")),
        1 => gpu_type.prop_map(|t| format!("gpu:{t}")),
        4 => proptest::sample::select(&[
            "", "-", "--", "gpu", "none", "NONE", "ALL", "gpu,gpu", "gpu:1,", ",gpu", "mem:1", "UNLIMITED", "1-2:3:4",
            "0-15:4%2", "1-3%0", "0-1001", "afterok:1:2", "afterok:1?afterany:2", "singleton", "after:1+5",
            "afterok:99999999999999999999", "gpu[01-04,07],login", "a[1-999999999]", "][", "a[1-2", "a&b", "a|b",
            "ALL,A=1,B", "A='x,y',B=\"z\"", "'unterminated", "=x", "A B", "append", "truncate", "T", "a=b=c",
            "\u{0}", "日本語", "\u{202e}rtl", "\\", "#", "'", "\"",
        ][..]).prop_map(str::to_string),
        3 => time_value(),
        2 => (number(), proptest::sample::select(&["", "K", "m", "G", "tb", "B", "x", " G"][..]))
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        1 => proptest::sample::select(
            &["user", "mcs", "oversubscribe", "yes", "no", "off", "set", "NONE", "/dev/null"][..],
        ).prop_map(str::to_string),
        1 => "[-0-9:%,_\\[\\]?a-z]{0,12}",
        1 => any::<String>(),
    ]
}

/// `--begin`/`--deadline` values: Slurm's forms, their edges, and near misses.
fn time_value() -> impl Strategy<Value = String> {
    let keyword = proptest::sample::select(
        &["now", "today", "tomorrow", "midnight", "noon", "fika", "teatime", "Today", "uts", "T", "-", " ", "am", "PM"]
            [..],
    );
    let unit = proptest::sample::select(&["", "seconds", "minute", "hours", "day", "weeks", "h", " days"][..]);
    prop_oneof![
        2 => (number(), unit.clone()).prop_map(|(n, u)| format!("now+{n}{u}")),
        1 => (number(), unit).prop_map(|(n, u)| format!("now-{n}{u}")),
        2 => (0u32..30, 0u32..70, proptest::option::of(0u32..70), proptest::sample::select(&["", " am", "pm", " PM"][..]))
            .prop_map(|(h, m, s, ap)| match s {
                Some(s) => format!("{h}:{m:02}:{s:02}{ap}"),
                None => format!("{h}:{m:02}{ap}"),
            }),
        2 => ((0u32..10000), (0u32..14), (0u32..33)).prop_map(|(y, m, d)| format!("{y:04}-{m:02}-{d:02}T12:00")),
        2 => ((0u32..14), (0u32..33), (0u32..100), proptest::sample::select(&["/", ".", ""][..]))
            .prop_map(|(m, d, y, sep)| format!("{m:02}{sep}{d:02}{sep}{y:02}")),
        1 => number().prop_map(|n| format!("uts{n}")),
        2 => proptest::collection::vec(keyword, 1..4).prop_map(|w| w.concat()),
        1 => "[0-9:/.+ TtAaPpMmnowdy-]{0,16}",
    ]
}

/// One option (or non-option) as it appears in argv: one or two words.
fn option_words(long: &'static [&'static str], value: BoxedStrategy<String>) -> impl Strategy<Value = Vec<String>> {
    let name = proptest::sample::select(long);
    let short = proptest::sample::select(SHORT);
    prop_oneof![
        4 => (name.clone(), value.clone()).prop_map(|(n, v)| vec![format!("--{n}={v}")]),
        3 => (name.clone(), value.clone()).prop_map(|(n, v)| vec![format!("--{n}"), v]),
        1 => name.prop_map(|n| vec![format!("--{n}")]),
        2 => (short.clone(), value.clone()).prop_map(|(c, v)| vec![format!("-{c}{v}")]),
        2 => (short.clone(), value).prop_map(|(c, v)| vec![format!("-{c}"), v]),
        1 => proptest::collection::vec(short, 1..4).prop_map(|cs| vec![format!("-{}", cs.into_iter().collect::<String>())]),
        1 => proptest::sample::select(&["--", "-", "job.sh", "", "--=x", "---", "-H", "--hold", "--parsable"][..])
            .prop_map(|w| vec![w.to_string()]),
    ]
}

fn argv() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(option_words(LONG, value().boxed()), 0..8).prop_map(|words| words.concat())
}

/// Counts for the resource options: small ones, and the largest ones that still parse (which multiply past u32
/// and size anything listed per node or per task).
fn count() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0u32..10).prop_map(|n| n.to_string()),
        3 => proptest::sample::select(&[
            "4294967295", "4294967294", "2147483648", "2147483647", "65536", "65537", "1000000", "4294967296",
        ][..]).prop_map(str::to_string),
        1 => any::<u32>().prop_map(|n| n.to_string()),
    ]
}

/// `--name=value` or `--name value`.
fn long_option(name: &str, value: String, joined: bool) -> Vec<String> {
    if joined { vec![format!("--{name}={value}")] } else { vec![format!("--{name}"), value] }
}

/// Resource options (`--nodes`, `--ntasks`, `--ntasks-per-node`, `--cpus-per-task`, two GPU options,
/// `--ntasks-per-gpu`, `--cpus-per-gpu`, `--mem-per-gpu`, each present half the time) with count-like values, in
/// any order: the combinations `build_spec` multiplies and divides.
fn resource_argv() -> impl Strategy<Value = Vec<String>> {
    let plain = |name: &'static str| {
        let nodes_range = name == "nodes";
        proptest::option::of((count(), count(), any::<bool>(), any::<bool>())).prop_map(move |v| {
            v.map(|(a, b, range, joined)| {
                long_option(name, if nodes_range && range { format!("{a}-{b}") } else { a }, joined)
            })
        })
    };
    let gpu = || {
        let name = proptest::sample::select(&["gres", "gpus-per-node", "gpus", "gpus-per-task"][..]);
        let prefix = proptest::sample::select(&["", "a100:", "gpu:", "gpu:a100:"][..]);
        proptest::option::of((name, prefix, count(), any::<bool>()))
            .prop_map(|v| v.map(|(name, prefix, n, joined)| long_option(name, format!("{prefix}{n}"), joined)))
    };
    (
        plain("nodes"),
        plain("ntasks"),
        plain("ntasks-per-node"),
        plain("cpus-per-task"),
        gpu(),
        gpu(),
        plain("ntasks-per-gpu"),
        plain("cpus-per-gpu"),
        proptest::option::of((count(), any::<bool>()))
            .prop_map(|v| v.map(|(n, joined)| long_option("mem-per-gpu", n, joined))),
    )
        .prop_map(|(a, b, c, d, e, f, g, h, i)| [a, b, c, d, e, f, g, h, i].into_iter().flatten().collect::<Vec<_>>())
        .prop_shuffle()
        .prop_map(|options| options.concat())
}

/// Builds the job from `cmd` with `script` (and with no script at all), which must not panic.
fn build_all_ways(cmd: &CommandLine, script: &str) {
    let _ = build_spec(cmd, Some(script), &ctx());
    let _ = build_spec(cmd, None, &ctx());
}

/// A script's text, with `#SBATCH` lines made of option words, quotes, escapes and comments.
fn directive_script() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        6 => option_words(LONG, value().boxed()).prop_map(|w| w.join(" ")),
        1 => proptest::sample::select(&["'", "\"", "\\", "#", "# comment", "'a b'", "\"--job-name=a b\"", "\\ ", "\t"][..])
            .prop_map(str::to_string),
    ];
    let directive = proptest::collection::vec(word, 0..4).prop_map(|w| format!("#SBATCH {}", w.join(" ")));
    let line = prop_oneof![
        6 => directive,
        1 => proptest::sample::select(&["", "# comment", "#SBATCH", "#SBATCH--hold", " #SBATCH -H", "echo hi", "\r", "#!/bin/bash"][..])
            .prop_map(str::to_string),
        1 => "\\PC{0,20}",
    ];
    (
        proptest::sample::select(&["#!/bin/sh", "#!", "", "echo", "#!/bin/sh\r"][..]),
        proptest::collection::vec(line, 0..6),
    )
        .prop_map(|(first, lines)| format!("{first}\n{}\n", lines.join("\n")))
}

/// Words a `#SBATCH` line carries unchanged: no whitespace, quotes, backslashes or `#`, and no `--` or
/// positional (both refused in directives, accepted on the command line). Nor anything that may be `--quiet` or
/// `--verbose`: Slurm reads those on the command line only (where giving both is an error), so a directive
/// holding both is fine.
fn plain_word(word: &str) -> bool {
    !word.is_empty()
        && word != "--"
        && !word.chars().any(|c| c.is_whitespace() || c == '\'' || c == '"' || c == '\\' || c == '#')
        && !word.contains(['Q', 'v'])
        && !word.contains("quiet")
        && !word.contains("verbose")
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sbatch_never_panics_on_arbitrary_argv(args in proptest::collection::vec(any::<String>(), 0..8)) {
        if let Ok(cmd) = parse_command_line(&args) {
            build_all_ways(&cmd, SCRIPT);
        }
    }

    #[test]
    fn sbatch_never_panics_on_optionlike_argv(args in argv()) {
        if let Ok(cmd) = parse_command_line(&args) {
            build_all_ways(&cmd, SCRIPT);
        }
    }

    #[test]
    fn sbatch_never_panics_on_resource_options(args in resource_argv()) {
        if let Ok(cmd) = parse_command_line(&args) {
            build_all_ways(&cmd, SCRIPT);
        }
    }

    #[test]
    fn sbatch_never_panics_on_arbitrary_scripts(script in any::<String>(), stdin in any::<bool>()) {
        let cmd = parse_command_line(&strings(if stdin { &[] } else { &["job.sh"] })).expect("plain command line");
        build_all_ways(&cmd, &script);
    }

    #[test]
    fn sbatch_never_panics_on_directive_scripts(script in directive_script(), args in argv()) {
        let cmd = parse_command_line(&strings(&["job.sh"])).expect("plain command line");
        build_all_ways(&cmd, &script);
        // The command line's options applied over the directives.
        if let Ok(mut cmd) = parse_command_line(&args) {
            cmd.wrap = None;
            build_all_ways(&cmd, &script);
        }
    }

    /// The same options give the same job whether they come on the command line or in a `#SBATCH` line.
    #[test]
    fn directives_and_command_line_agree(args in argv().prop_map(|a| a.into_iter().filter(|w| plain_word(w)).collect::<Vec<_>>())) {
        let from_args = parse_command_line(&args)
            .ok()
            .filter(|cmd| cmd.script_path.is_none() && cmd.wrap.is_none())
            .map(|cmd| build_spec(&cmd, Some(SCRIPT), &ctx()));
        let script = format!("#!/bin/sh\n#SBATCH {}\necho hi\n", args.join(" "));
        let from_script = build_spec(&CommandLine::default(), Some(&script), &ctx());
        match (from_args, from_script) {
            (Some(Ok(a)), Ok(mut s)) => {
                prop_assert_eq!(a.parsable, s.parsable);
                // The scripts differ by the directive line itself.
                s.spec.script = a.spec.script.clone();
                prop_assert_eq!(a.spec, s.spec, "{:?}", args);
            }
            (Some(Err(_)) | None, Err(_)) => {}
            (a, s) => prop_assert!(false, "{args:?}: command line {a:?}, directive {s:?}"),
        }
    }
    /// `SBATCH_*` variables with any of the values options take (or anything), under any clock and UTC offset,
    /// together with options on the command line and in the script.
    #[test]
    fn sbatch_never_panics_on_input_environment_variables(
        vars in proptest::collection::vec((proptest::sample::select(env_options().collect::<Vec<_>>()), value()), 0..6),
        args in argv(),
        script in directive_script(),
        now_ms in prop_oneof![Just(1_773_149_415_000u64), any::<u64>()],
        utc_offset_s in prop_oneof![Just(3_600i32), -50_400i32..50_400, any::<i32>()],
    ) {
        let mut c = ctx();
        c.env.extend(vars.into_iter().map(|((name, _), value)| (name.to_string(), value)));
        c.now_ms = now_ms;
        c.utc_offset_s = utc_offset_s;
        if let Ok(mut cmd) = parse_command_line(&args) {
            let _ = build_spec(&cmd, Some(SCRIPT), &c);
            cmd.wrap = None;
            let _ = build_spec(&cmd, Some(&script), &c);
        }
    }
}

// ---- job references ----

/// `12`, `12_3`, `12_[1-5,7]`, in lists, with brackets and commas out of place.
fn job_ref_args() -> impl Strategy<Value = Vec<String>> {
    let piece = prop_oneof![
        4 => number(),
        2 => (number(), number()).prop_map(|(j, t)| format!("{j}_{t}")),
        2 => (number(), "[-0-9,:%]{0,10}").prop_map(|(j, t)| format!("{j}_[{t}]")),
        2 => proptest::sample::select(&[",", "[", "]", "_", "_[", "]]", "[[", "", " ", "é"][..]).prop_map(str::to_string),
    ];
    let arg = proptest::collection::vec(piece, 0..6).prop_map(|p| p.concat());
    proptest::collection::vec(arg, 0..4)
}

fn jobs() -> impl Strategy<Value = Vec<Job>> {
    let array = proptest::option::of((0u64..20, 0u32..10));
    proptest::collection::vec((0u64..20, array), 0..8).prop_map(|jobs| {
        jobs.into_iter()
            .map(|(id, array)| Job {
                id,
                array: array.map(|(array_job_id, task_id)| {
                    Box::new(ArrayTask {
                        array_job_id,
                        task_id,
                        task_count: 10,
                        task_min: 0,
                        task_max: 9,
                        max_running: None,
                    })
                }),
                ..Job::default()
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn job_refs_never_panic_on_arbitrary_args(args in proptest::collection::vec(any::<String>(), 0..4)) {
        let _ = split_refs(&args);
        let _ = parse_refs(&args);
    }

    #[test]
    fn job_refs_never_panic_on_reflike_args(args in job_ref_args(), jobs in jobs()) {
        // Splitting never loses or invents a character other than the separating commas.
        let kept: usize = split_refs(&args).iter().map(|r| r.chars().count()).sum();
        prop_assert!(kept <= args.iter().map(|a| a.chars().count()).sum::<usize>());
        if let Ok(refs) = parse_refs(&args) {
            let _ = base_ids(&refs);
            let _ = select(&refs, &jobs);
            for job in &jobs {
                let _ = names(&refs, job);
            }
        }
    }
}

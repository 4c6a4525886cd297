//! Bounded fuzzing (proptest, stable Rust: no cargo-fuzz) of the text parsers that take user input: hostlists,
//! Slurm time limits, `--array` specs, job references and `--dependency` specs.
//!
//! Each target runs a fixed number of cases in the normal test suite. Two kinds of input: fully arbitrary strings,
//! and grammar-aware ones built from the parsers' own tokens (digits, brackets, commas, dashes, colons, `%`, `_`,
//! runs of digits too large for any integer) that reach past the first syntax check. Whatever the input, a parser
//! returns `Ok` or `Err`: a panic, an integer overflow (debug builds panic on it) or an unbounded allocation is a
//! defect. Where a parser has a printer, the printed form must parse back to the same value.

use std::collections::{BTreeSet, HashSet};

use drover_state::array::{JobRef, SLURM_MAX_ARRAY_SIZE, format_task_ids, parse_array_spec, parse_job_ref};
use drover_state::dependency::{format_dependency, parse_dependency};
use drover_state::hostlist::{compress_hostlist, expand_hostlist};
use drover_state::slurm_time::{TimeFormatProblem, format_duration, format_time_limit, parse_time_limit};
use drover_state::{ArraySpec, Dependency, DependencyKind};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per target: enough to reach the deep paths, few enough for a debug build on two cores.
const CASES: u32 = 2_000;

fn config() -> Config {
    // No regression files: a failure prints its minimal input, which belongs in a named unit test by the parser.
    Config { cases: CASES, failure_persistence: None, ..Config::default() }
}

/// Text made of `tokens`, with a few arbitrary characters mixed in.
fn token_text(tokens: &'static [&'static str], max_len: usize) -> impl Strategy<Value = String> {
    let token = prop_oneof![
        8 => proptest::sample::select(tokens).prop_map(str::to_string),
        2 => number_text(),
        1 => any::<char>().prop_map(String::from),
    ];
    proptest::collection::vec(token, 0..max_len).prop_map(|parts| parts.concat())
}

/// `base` with up to three random edits (none a quarter of the time) (insert, delete or replace one character, or double a slice), the
/// inserted characters drawn from `alphabet`: near-valid input that gets past the first checks and then breaks.
fn mutated(base: impl Strategy<Value = String>, alphabet: &'static [char]) -> impl Strategy<Value = String> {
    let edit = (any::<usize>(), 0u8..4, proptest::sample::select(alphabet));
    (base, proptest::collection::vec(edit, 0..4)).prop_map(|(base, edits)| {
        let mut chars: Vec<char> = base.chars().collect();
        for (at, op, c) in edits {
            let at = at % (chars.len() + 1);
            match op {
                0 => chars.insert(at, c),
                1 if at < chars.len() => {
                    chars.remove(at);
                }
                2 if at < chars.len() => chars[at] = c,
                _ => {
                    let slice: Vec<char> = chars[at..].iter().take(6).copied().collect();
                    chars.splice(at..at, slice);
                }
            }
        }
        chars.into_iter().collect()
    })
}

/// Joins 1..`max` items from `item` with `sep` (separators drawn from it when it has several).
fn joined(
    item: impl Strategy<Value = String>,
    seps: &'static [&'static str],
    max: usize,
) -> impl Strategy<Value = String> {
    proptest::collection::vec((item, proptest::sample::select(seps)), 1..max).prop_map(|parts| {
        let mut out = String::new();
        for (i, (part, sep)) in parts.into_iter().enumerate() {
            if i > 0 {
                out.push_str(sep);
            }
            out.push_str(&part);
        }
        out
    })
}

/// `A-B`: mostly in order (`B` at least `A`), sometimes any two numbers.
fn number_range() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0u32..40, 0u32..40).prop_map(|(a, d)| format!("{a}-{}", a + d)),
        1 => (small_number(), small_number()).prop_map(|(a, b)| format!("{a}-{b}")),
    ]
}

/// Small numbers (most of the time), so structured input stays cheap to expand.
fn small_number() -> impl Strategy<Value = String> {
    prop_oneof![8 => (0u32..40).prop_map(|n| n.to_string()), 1 => "0[0-9]{1,3}", 1 => number_text()]
}

/// Digit runs: small numbers, numbers at the edges of u32/u64, and runs too long for any integer type.
fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9]{1,3}",
        1 => "0{1,25}[0-9]{0,3}",
        1 => "[0-9]{8,11}",
        1 => "[0-9]{18,21}",
        1 => "[0-9]{25,60}",
        1 => proptest::sample::select(&[
            "4294967295", "4294967296", "18446744073709551615", "18446744073709551616", "213503982334601",
            "4000000", "4000001", "1000", "1001", "65535",
        ][..]).prop_map(str::to_string),
    ]
}

// ---- hostlists ----

const HOSTLIST_TOKENS: &[&str] = &[
    "gpu",
    "node",
    "n",
    "a-b",
    "x.y",
    "_",
    "[",
    "]",
    ",",
    "-",
    "0",
    "1",
    "01",
    "007",
    "9",
    "10",
    "[1-3]",
    "[01-04,07]",
    "[3-1]",
    "[]",
    "[,]",
    "[-]",
    "[1-]",
    "[-1]",
    "]]",
    "[[",
    " ",
    "é",
    "日本",
    "\u{0}",
];

/// A plausible host name: letters, then maybe `-`/`.`/`_` parts, then maybe a (zero-padded) number.
fn host_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z][a-z._-]{0,5}[0-9]{0,4}",
        1 => "[a-z]{1,3}[0-9]{15,22}",
        1 => "[0-9]{1,4}",
        1 => "[a-z]{1,2}[0-9]{1,2}[a-z]{1,2}[0-9]{0,2}",
    ]
}

const HOSTLIST_CHARS: &[char] = &['[', ']', ',', '-', '0', '9', 'a', '.', ' ', 'é'];

/// Hostlists as users write them, `gpu[01-04,07]x,login`: names with at most one bracket group of ranges.
fn hostlist_text() -> impl Strategy<Value = String> {
    let range = prop_oneof![small_number(), number_range()];
    let item = prop_oneof![
        host_name(),
        ("[a-z]{0,4}", joined(range, &[","], 4), "[a-z.]{0,2}").prop_map(|(p, r, x)| format!("{p}[{r}]{x}")),
    ];
    let list = joined(item, &[","], 5);
    mutated(list, HOSTLIST_CHARS)
}

fn as_set(hosts: &[String]) -> BTreeSet<String> {
    hosts.iter().cloned().collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn hostlist_expand_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = expand_hostlist(&text);
    }

    #[test]
    fn hostlist_expand_never_panics_on_hostlike_text(
        text in prop_oneof![hostlist_text(), token_text(HOSTLIST_TOKENS, 16)],
    ) {
        if let Ok(hosts) = expand_hostlist(&text) {
            // Whatever expands must survive compressing and expanding again: same hosts, none lost or invented.
            let again = expand_hostlist(&compress_hostlist(&hosts));
            prop_assert_eq!(again.map(|h| as_set(&h)), Ok(as_set(&hosts)), "{:?}", text);
        }
    }

    #[test]
    fn hostlist_compress_never_panics(hosts in proptest::collection::vec(any::<String>(), 0..8)) {
        let _ = compress_hostlist(&hosts);
    }

    #[test]
    fn hostlist_compress_then_expand_round_trips(hosts in proptest::collection::btree_set(host_name(), 1..24)) {
        let hosts: Vec<String> = hosts.into_iter().collect();
        let text = compress_hostlist(&hosts);
        let mut back = expand_hostlist(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        back.sort();
        // Exactly the hosts given: no duplicates either.
        prop_assert_eq!(&back, &hosts, "{:?}", text);
    }

    /// With repeats and names that differ only in zero padding (`a1`, `a01`): the same set comes back, and a
    /// numbered name (the ones compression groups) comes back once, however often it was given.
    #[test]
    fn hostlist_compress_with_repeats_then_expand_round_trips(
        hosts in proptest::collection::vec(
            prop_oneof![host_name(), proptest::sample::select(&["a1", "a01", "a001", "a2", "a02", "b"][..]).prop_map(str::to_string)],
            1..24,
        ),
    ) {
        let text = compress_hostlist(&hosts);
        let back = expand_hostlist(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert_eq!(as_set(&back), as_set(&hosts), "{:?}", text);
        let numbered = |h: &&String| (1..=18).contains(&h.chars().rev().take_while(char::is_ascii_digit).count());
        let unique_numbered = as_set(&hosts).iter().filter(numbered).count();
        prop_assert_eq!(back.iter().filter(numbered).count(), unique_numbered, "{:?}", text);
    }
}

// ---- time limits ----

const TIME_TOKENS: &[&str] =
    &["-", ":", "0", "1", "59", "60", "24", "-1", " ", "UNLIMITED", "infinite", "+", ".", "1-", ":00", "00:"];

const TIME_CHARS: &[char] = &['-', ':', '0', '9', ' ', '+', 'x'];

/// Time limits in every accepted form, fields from [`number_text`].
fn time_text() -> impl Strategy<Value = String> {
    let clock = joined(small_number(), &[":"], 5).boxed();
    let text = prop_oneof![clock.clone(), (small_number(), clock).prop_map(|(d, c)| format!("{d}-{c}"))];
    mutated(text, TIME_CHARS)
}

/// (days, hours, minutes, seconds) to seconds, or `None` when it does not fit in a u64.
fn total(d: u64, h: u64, m: u64, s: u64) -> Option<u64> {
    d.checked_mul(24)?.checked_add(h)?.checked_mul(60)?.checked_add(m)?.checked_mul(60)?.checked_add(s)
}

/// Field values: mostly realistic, some at u64's edge so the arithmetic overflows.
fn time_field() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..100, 1 => any::<u64>(), 1 => (u64::MAX / 86_400 - 2)..=u64::MAX]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn time_parse_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_time_limit(&text);
    }

    #[test]
    fn time_parse_never_panics_on_timelike_text(text in prop_oneof![time_text(), token_text(TIME_TOKENS, 10)]) {
        if let Ok(Some(secs)) = parse_time_limit(&text) {
            prop_assert_eq!(parse_time_limit(&format_duration(secs)), Ok(Some(secs)));
        }
    }

    /// Every accepted format, with any field values: the sum when it fits, [`TimeFormatProblem::Overflow`] when
    /// it does not, never a wrapped value.
    #[test]
    fn time_fields_add_up_or_overflow(d in time_field(), h in time_field(), m in time_field(), s in time_field(),
                                      form in 0usize..6) {
        let (text, expected) = match form {
            0 => (format!("{m}"), total(0, 0, m, 0)),
            1 => (format!("{m}:{s}"), total(0, 0, m, s)),
            2 => (format!("{h}:{m}:{s}"), total(0, h, m, s)),
            3 => (format!("{d}-{h}"), total(d, h, 0, 0)),
            4 => (format!("{d}-{h}:{m}"), total(d, h, m, 0)),
            _ => (format!("{d}-{h}:{m}:{s}"), total(d, h, m, s)),
        };
        match (parse_time_limit(&text), expected) {
            (Ok(got), Some(want)) => prop_assert_eq!(got, (want != 0).then_some(want), "{:?}", text),
            (Err(e), None) => prop_assert_eq!(e.problem, TimeFormatProblem::Overflow, "{:?}", text),
            (got, want) => prop_assert!(false, "{text:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn time_format_then_parse_round_trips(limit in proptest::option::of(1u64..)) {
        prop_assert_eq!(parse_time_limit(&format_time_limit(limit)), Ok(limit));
    }
}

// ---- arrays and job references ----

const ARRAY_TOKENS: &[&str] =
    &["0", "1", "7", "15", "-", ",", ":", "%", "_", "[", "]", "0-15", "0-15:4", "%2", "%0", "1-5,10", ":0", " ", "+"];

const ARRAY_CHARS: &[char] = &['-', ',', ':', '%', '_', '[', ']', '0', '9', ' '];

/// `--array` values: `N`, `N-M`, `N-M:S` entries, joined by commas, maybe a `%N` limit.
fn array_text() -> impl Strategy<Value = String> {
    let entry = prop_oneof![
        small_number(),
        number_range(),
        (number_range(), small_number()).prop_map(|(r, s)| format!("{r}:{s}")),
    ];
    let spec = (joined(entry, &[","], 5), proptest::option::of(small_number())).prop_map(|(body, limit)| match limit {
        Some(n) => format!("{body}%{n}"),
        None => body,
    });
    mutated(spec, ARRAY_CHARS)
}

/// Job references: `N`, `N_T`, `N_[entries]`.
fn job_ref_text() -> impl Strategy<Value = String> {
    let reference = prop_oneof![
        small_number(),
        (small_number(), small_number()).prop_map(|(j, t)| format!("{j}_{t}")),
        (small_number(), array_text()).prop_map(|(j, a)| format!("{j}_[{a}]")),
    ];
    mutated(reference, ARRAY_CHARS)
}

/// The `max_tasks` a caller may pass: none allowed, tiny, sbatch's default, Slurm's largest.
fn max_tasks() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => proptest::sample::select(&[0u32, 1, 7][..]),
        4 => proptest::sample::select(&[1001, SLURM_MAX_ARRAY_SIZE][..]),
    ]
}

/// Sorted unique task ids below `max`, at least one.
fn task_ids(max: u32) -> impl Strategy<Value = Vec<u32>> {
    let dense = proptest::collection::btree_set(0..max.min(64), 1..20);
    let sparse = proptest::collection::btree_set(0..max, 1..20);
    prop_oneof![dense, sparse].prop_map(|ids| ids.into_iter().collect())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn array_parse_never_panics_on_arbitrary_text(text in any::<String>(), max in max_tasks()) {
        let _ = parse_array_spec(&text, max);
    }

    #[test]
    fn array_parse_never_panics_on_arraylike_text(
        text in prop_oneof![array_text(), token_text(ARRAY_TOKENS, 12)],
        max in max_tasks(),
    ) {
        if let Ok(spec) = parse_array_spec(&text, max) {
            prop_assert!(spec.task_ids.iter().all(|&id| id < max), "{text:?}: {spec:?}");
            prop_assert!(spec.task_ids.windows(2).all(|w| w[0] < w[1]), "{text:?}: not sorted and unique");
            // What squeue prints parses back to the same spec.
            let printed = format_task_ids(&spec.task_ids, spec.max_running);
            let inner = printed.strip_prefix('[').and_then(|p| p.strip_suffix(']')).unwrap_or(&printed);
            prop_assert_eq!(parse_array_spec(inner, max), Ok(spec), "{:?} -> {:?}", text, printed);
        }
    }

    #[test]
    fn array_format_then_parse_round_trips(
        (max, ids) in max_tasks().prop_filter("some ids allowed", |&m| m > 0).prop_flat_map(|m| (Just(m), task_ids(m))),
        max_running in proptest::option::of(1u32..),
    ) {
        let printed = format_task_ids(&ids, max_running);
        let inner = &printed[1..printed.len() - 1];
        prop_assert_eq!(parse_array_spec(inner, max), Ok(ArraySpec { task_ids: ids.into(), max_running }), "{:?}", printed);
    }

    #[test]
    fn job_ref_parse_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_job_ref(&text);
    }

    #[test]
    fn job_ref_parse_never_panics_on_reflike_text(text in prop_oneof![job_ref_text(), token_text(ARRAY_TOKENS, 12)]) {
        let _ = parse_job_ref(&text);
    }

    #[test]
    fn job_ref_format_then_parse_round_trips(
        job in prop_oneof![1u64..1000, 1u64..],
        form in 0usize..3,
        task in any::<u32>(),
        ids in task_ids(SLURM_MAX_ARRAY_SIZE),
    ) {
        let (text, expected) = match form {
            0 => (job.to_string(), JobRef::Job(job)),
            1 => (format!("{job}_{task}"), JobRef::Task(job, task)),
            _ => (format!("{job}_{}", format_task_ids(&ids, None)), JobRef::Tasks(job, ids)),
        };
        prop_assert_eq!(parse_job_ref(&text), Ok(expected), "{:?}", text);
    }
}

// ---- dependencies ----

const DEPENDENCY_TOKENS: &[&str] = &[
    "afterok",
    "afterany",
    "after",
    "afternotok",
    "singleton",
    "AfterOK",
    "aftercorr",
    "expand",
    ":",
    ",",
    "?",
    "_",
    "+",
    "1",
    "12",
    "0",
    "-1",
    "[1-3]",
    " ",
];

const DEPENDENCY_CHARS: &[char] = &[':', ',', '?', '_', '+', '0', '9', '[', ' '];

/// `--dependency` values: `TYPE:JOB[_TASK]...` entries, `singleton` or bare ids, joined by `,` or `?`.
fn dependency_text() -> impl Strategy<Value = String> {
    let job = prop_oneof![small_number(), (small_number(), small_number()).prop_map(|(j, t)| format!("{j}_{t}"))];
    let kind = proptest::sample::select(&["after", "afterok", "afterany", "afternotok", "AfterOK", "aftercorr"][..]);
    let entry = prop_oneof![
        4 => (kind, joined(job.clone(), &[":"], 4)).prop_map(|(k, jobs)| format!("{k}:{jobs}")),
        1 => Just("singleton".to_string()),
        1 => job,
    ];
    let text = joined(entry, &[",", "?"], 5);
    mutated(text, DEPENDENCY_CHARS)
}

fn dependency() -> impl Strategy<Value = Dependency> {
    let kind = proptest::sample::select(
        &[
            DependencyKind::After,
            DependencyKind::AfterOk,
            DependencyKind::AfterAny,
            DependencyKind::AfterNotOk,
            DependencyKind::Singleton,
        ][..],
    );
    (kind, prop_oneof![1u64..100, 1u64..], proptest::option::of(any::<u32>())).prop_map(|(kind, job, task)| {
        if kind == DependencyKind::Singleton {
            Dependency { kind, job: 0, task: None }
        } else {
            Dependency { kind, job, task }
        }
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn dependency_parse_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_dependency(&text);
    }

    #[test]
    fn dependency_parse_never_panics_on_dependencylike_text(
        text in prop_oneof![dependency_text(), token_text(DEPENDENCY_TOKENS, 12)],
    ) {
        if let Ok((deps, any)) = parse_dependency(&text)
            && !deps.is_empty()
        {
            let (again, any_again) = parse_dependency(&format_dependency(&deps, any))
                .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            prop_assert_eq!(again, deps.clone(), "{:?}", text);
            // One entry prints without a separator, so "any" survives only with two or more.
            prop_assert_eq!(any_again, any && deps.len() > 1, "{:?}", text);
        }
    }

    #[test]
    fn dependency_format_then_parse_round_trips(deps in proptest::collection::vec(dependency(), 1..8), any in any::<bool>()) {
        let mut seen = HashSet::new();
        let deps: Vec<Dependency> = deps.into_iter().filter(|d| seen.insert(d.clone())).collect();
        let any = any && deps.len() > 1;
        let text = format_dependency(&deps, any);
        prop_assert_eq!(parse_dependency(&text), Ok((deps, any)), "{:?}", text);
    }
}

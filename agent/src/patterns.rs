//! Slurm's filename patterns for `--output`, `--error` and `--input` (`slurm-%j.out`, `%x-%A_%3a.log`, ...).
//!
//! This follows Slurm's own expansion (`expand_stdio_fields` in `src/common/print_fields.c`, and the "FILENAME
//! PATTERN" section of sbatch(1)) rather than a reading of the man page alone, because users move job scripts between
//! Slurm and Drover and expect the very same file names:
//!
//! | code | expands to |
//! |------|------------|
//! | `%%` | `%` |
//! | `%A` | the array's master job id; the job id for a job that is not part of an array |
//! | `%a` | the array task index; `4294967294` (Slurm's `NO_VAL`) for a job that is not part of an array |
//! | `%b` | the array task index modulo 10 (`4` outside an array, as Slurm's `NO_VAL % 10`) |
//! | `%J` | `jobid.stepid` for a numbered step, just the job id for the batch script and other special steps |
//! | `%j` | the job id; for an array task that is the task's own job id, not the master's |
//! | `%N` | the node's (short) name |
//! | `%n` | the node's index within the job (0 for the first node) |
//! | `%r` | how many times the job has been restarted (requeued) |
//! | `%s` | the step id; `batch` for the batch script |
//! | `%t` | the task id (rank) within the step; 0 when there is none |
//! | `%u` | the user name |
//! | `%x` | the job name |
//!
//! A number between `%` and the letter zero-pads numeric values to that width (at most 10, as in Slurm): `%4j` turns
//! job 128 into `0128`. The width is ignored for text (`%N`, `%u`, `%x`, `%s` when it is `batch`).
//!
//! Anything else after `%` is kept as written (`%q` stays `%q`, `%3q` stays `%3q`), including `%S` (Slurm's SLUID,
//! which Drover does not have). A backslash anywhere in the pattern turns expansion off for the whole pattern, and
//! every backslash is removed: `out\%j` names the file `out%j`.
//!
//! One deliberate difference: a lone `%` at the very end is kept (`out%` stays `out%`); Slurm silently drops it, which
//! only hides a typo.

/// What a pattern can refer to, for one task of one job on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatternContext<'a> {
    /// The job's own id (for an array task, the task's id, not the master's).
    pub job_id: u64,
    pub user: &'a str,
    pub job_name: &'a str,
    /// The node's short name, as in the node list.
    pub node: &'a str,
    /// The node's index among the job's nodes (0 for the first).
    pub node_id: u32,
    /// The task's rank within its step; `None` expands to 0 (the batch script is task 0).
    pub task_id: Option<u32>,
    /// The array's master job id, `None` for a job outside an array.
    pub array_job_id: Option<u64>,
    /// The index of this task in its array, `None` for a job outside an array.
    pub array_task_id: Option<u32>,
    /// The step: `None` (or `Some("batch")`) for the batch script, `Some("0")`, `Some("1")`, ... for numbered steps,
    /// `Some("extern")` and the like for other special steps.
    pub step: Option<String>,
    /// How many times the job was requeued.
    pub restart_count: u32,
}

/// Slurm prints its `NO_VAL` (0xfffffffe) for `%a` outside an array; scripts that parse such names expect it.
const NO_VAL: u32 = 0xffff_fffe;

/// Slurm caps the zero-padding width at 10 digits (the width of a 32-bit number).
const MAX_WIDTH: usize = 10;

/// Expands the codes of a filename pattern (see the module documentation for the table).
pub fn expand_pattern(pattern: &str, ctx: &PatternContext) -> String {
    // Slurm: a single backslash anywhere means "take this name literally", and the backslashes go away.
    if pattern.contains('\\') {
        return pattern.chars().filter(|&c| c != '\\').collect();
    }

    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(d);
            chars.next();
        }
        let Some(code) = chars.next() else {
            // A trailing `%` or `%12`: nothing to expand, keep it as written (see the module docs).
            out.push('%');
            out.push_str(&digits);
            break;
        };
        if code == '%' && digits.is_empty() {
            out.push('%');
            continue;
        }
        // All-digit widths beyond u64 still mean "as wide as allowed", as Slurm's strtoul saturates.
        let width = if digits.is_empty() { 0 } else { digits.parse::<usize>().unwrap_or(MAX_WIDTH).min(MAX_WIDTH) };
        match expand_code(code, width, ctx) {
            Some(text) => out.push_str(&text),
            None => {
                out.push('%');
                out.push_str(&digits);
                out.push(code);
            }
        }
    }
    out
}

/// Expands a pattern into the path of an output file: a relative pattern is relative to the job's working
/// directory, as in Slurm, so the supervisor (which runs elsewhere) gets an absolute path.
pub fn expand_output_path(pattern: &str, ctx: &PatternContext, work_dir: &str) -> String {
    let expanded = expand_pattern(pattern, ctx);
    if pattern.starts_with('/') {
        expanded
    } else if work_dir.ends_with('/') {
        format!("{work_dir}{expanded}")
    } else {
        format!("{work_dir}/{expanded}")
    }
}

/// The expansion of one code, or `None` when Slurm does not know it (the caller keeps it as written).
fn expand_code(code: char, width: usize, ctx: &PatternContext) -> Option<String> {
    let num = |n: u64| format!("{n:0width$}");
    let step = ctx.step.as_deref().filter(|s| *s != "batch");
    let numbered_step = step.filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    Some(match code {
        'A' => num(ctx.array_job_id.filter(|&id| id != 0).unwrap_or(ctx.job_id)),
        'a' => num(u64::from(ctx.array_task_id.unwrap_or(NO_VAL))),
        'b' => num(u64::from(ctx.array_task_id.unwrap_or(NO_VAL) % 10)),
        'j' => num(ctx.job_id),
        'J' => match numbered_step {
            Some(s) => format!("{}.{s}", num(ctx.job_id)),
            None => num(ctx.job_id),
        },
        'N' => ctx.node.to_string(),
        'n' => num(u64::from(ctx.node_id)),
        'r' => num(u64::from(ctx.restart_count)),
        's' => match (numbered_step, step) {
            (Some(s), _) => s.parse::<u64>().map(num).unwrap_or_else(|_| s.to_string()),
            (None, Some(special)) => special.to_string(),
            (None, None) => "batch".to_string(),
        },
        't' => num(u64::from(ctx.task_id.unwrap_or(0))),
        'u' => ctx.user.to_string(),
        'x' => ctx.job_name.to_string(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> PatternContext<'static> {
        PatternContext {
            job_id: 128,
            user: "alice",
            job_name: "train-llm",
            node: "gpu07",
            node_id: 2,
            task_id: Some(3),
            array_job_id: None,
            array_task_id: None,
            step: None,
            restart_count: 0,
        }
    }

    fn array_task() -> PatternContext<'static> {
        PatternContext { job_id: 1207, array_job_id: Some(1200), array_task_id: Some(7), ..job() }
    }

    #[test]
    fn the_default_output_name_is_the_job_id() {
        assert_eq!(expand_pattern("slurm-%j.out", &job()), "slurm-128.out");
    }

    #[test]
    fn each_code_expands_to_its_field() {
        let ctx = job();
        assert_eq!(expand_pattern("%u", &ctx), "alice");
        assert_eq!(expand_pattern("%x", &ctx), "train-llm");
        assert_eq!(expand_pattern("%N", &ctx), "gpu07");
        assert_eq!(expand_pattern("%n", &ctx), "2");
        assert_eq!(expand_pattern("%t", &ctx), "3");
        assert_eq!(expand_pattern("%r", &PatternContext { restart_count: 2, ..job() }), "2");
        assert_eq!(expand_pattern("%x-%j-%N-%t.log", &ctx), "train-llm-128-gpu07-3.log");
    }

    #[test]
    fn a_job_outside_an_array_prints_its_own_id_and_slurms_no_val() {
        let ctx = job();
        assert_eq!(expand_pattern("%A", &ctx), "128");
        assert_eq!(expand_pattern("%a", &ctx), "4294967294");
        assert_eq!(expand_pattern("%b", &ctx), "4");
    }

    #[test]
    fn an_array_task_has_the_master_id_in_a_and_its_own_id_in_j() {
        let ctx = array_task();
        assert_eq!(expand_pattern("%A_%a.out", &ctx), "1200_7.out");
        assert_eq!(expand_pattern("%j", &ctx), "1207");
        assert_eq!(expand_pattern("%b", &PatternContext { array_task_id: Some(23), ..array_task() }), "3");
    }

    #[test]
    fn the_batch_script_is_step_batch_and_has_no_step_in_big_j() {
        let ctx = job();
        assert_eq!(expand_pattern("%s", &ctx), "batch");
        assert_eq!(expand_pattern("%J", &ctx), "128");
        let explicit = PatternContext { step: Some("batch".into()), ..job() };
        assert_eq!(expand_pattern("%s %J", &explicit), "batch 128");
    }

    #[test]
    fn a_numbered_step_appears_in_s_and_big_j() {
        let ctx = PatternContext { step: Some("0".into()), ..job() };
        assert_eq!(expand_pattern("job%J.out", &ctx), "job128.0.out");
        assert_eq!(expand_pattern("%s", &ctx), "0");
        assert_eq!(expand_pattern("%3s", &ctx), "000");
    }

    #[test]
    fn a_special_step_is_named_in_s_but_not_appended_by_big_j() {
        let ctx = PatternContext { step: Some("extern".into()), ..job() };
        assert_eq!(expand_pattern("%s", &ctx), "extern");
        assert_eq!(expand_pattern("%5s", &ctx), "extern");
        assert_eq!(expand_pattern("%J", &ctx), "128");
    }

    #[test]
    fn no_task_id_is_task_zero() {
        assert_eq!(expand_pattern("%t", &PatternContext { task_id: None, ..job() }), "0");
    }

    #[test]
    fn a_width_zero_pads_numbers_like_the_man_page_examples() {
        let ctx = job();
        assert_eq!(expand_pattern("job%4j.out", &ctx), "job0128.out");
        assert_eq!(expand_pattern("job%2j-%2t.out", &PatternContext { task_id: Some(0), ..job() }), "job128-00.out");
        assert_eq!(expand_pattern("%3t", &ctx), "003");
        assert_eq!(expand_pattern("%5j", &ctx), "00128");
        assert_eq!(expand_pattern("%3n", &ctx), "002");
        assert_eq!(expand_pattern("%4A_%3a", &array_task()), "1200_007");
        assert_eq!(expand_pattern("%6J", &PatternContext { step: Some("1".into()), ..job() }), "000128.1");
        // A width no wider than the number changes nothing.
        assert_eq!(expand_pattern("%2j %0j", &ctx), "128 128");
    }

    #[test]
    fn the_width_is_capped_at_ten_digits() {
        assert_eq!(expand_pattern("%12j", &job()), "0000000128");
        assert_eq!(expand_pattern("%99999999999999999999999j", &job()), "0000000128");
    }

    #[test]
    fn a_width_does_not_pad_text() {
        let ctx = job();
        assert_eq!(expand_pattern("%8N", &ctx), "gpu07");
        assert_eq!(expand_pattern("%8u", &ctx), "alice");
        assert_eq!(expand_pattern("%12x", &ctx), "train-llm");
    }

    #[test]
    fn double_percent_is_one_percent_and_is_not_expanded_again() {
        let ctx = job();
        assert_eq!(expand_pattern("100%%", &ctx), "100%");
        assert_eq!(expand_pattern("%%j", &ctx), "%j");
        assert_eq!(expand_pattern("%%%j", &ctx), "%128");
    }

    #[test]
    fn unknown_codes_are_kept_as_written() {
        let ctx = job();
        assert_eq!(expand_pattern("out%q.log", &ctx), "out%q.log");
        assert_eq!(expand_pattern("out%3q.log", &ctx), "out%3q.log");
        assert_eq!(expand_pattern("%S", &ctx), "%S");
        assert_eq!(expand_pattern("%é%j", &ctx), "%é128");
    }

    #[test]
    fn a_trailing_percent_or_width_is_kept() {
        let ctx = job();
        assert_eq!(expand_pattern("out%", &ctx), "out%");
        assert_eq!(expand_pattern("out%12", &ctx), "out%12");
    }

    #[test]
    fn a_backslash_disables_every_code_and_is_removed() {
        let ctx = job();
        assert_eq!(expand_pattern(r"out\%j.log", &ctx), "out%j.log");
        assert_eq!(expand_pattern(r"%x-\%j", &ctx), "%x-%j");
        assert_eq!(expand_pattern(r"a\\b", &ctx), "ab");
    }

    #[test]
    fn a_pattern_without_codes_is_unchanged() {
        assert_eq!(expand_pattern("/scratch/alice/out.txt", &job()), "/scratch/alice/out.txt");
        assert_eq!(expand_pattern("", &job()), "");
    }

    #[test]
    fn relative_output_paths_land_in_the_working_directory() {
        let ctx = job();
        assert_eq!(expand_output_path("slurm-%j.out", &ctx, "/home/alice/run"), "/home/alice/run/slurm-128.out");
        assert_eq!(expand_output_path("slurm-%j.out", &ctx, "/home/alice/"), "/home/alice/slurm-128.out");
        assert_eq!(expand_output_path("/logs/%u/%j.out", &ctx, "/home/alice"), "/logs/alice/128.out");
        assert_eq!(expand_output_path(r"o\%j", &ctx, "/w"), "/w/o%j");
    }
}

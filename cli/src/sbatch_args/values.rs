//! Checking option values, as Slurm's `sbatch` reads them: each function takes the flag as the user spelled it
//! (for the error) and the value, and returns the checked value or an [`OptionError`] that names both.

use drover_state::job::{ArraySpec, Dependency, ExportPolicy};
use drover_state::{array, dependency, slurm_time};

use super::{MAX_ARRAY_SIZE, MAX_MEM_MB, MAX_NICE, OptionError};
use crate::slurm::time::{ACCEPTED_DATE_FORMATS, TimeSpec};

pub(super) fn invalid(flag: &str, value: &str, expected: impl Into<String>) -> OptionError {
    OptionError::InvalidValue { flag: flag.to_string(), value: value.to_string(), expected: expected.into() }
}

pub(super) fn parse_array(flag: &str, value: &str) -> Result<ArraySpec, OptionError> {
    array::parse_array_value(value, MAX_ARRAY_SIZE).map_err(|e| invalid(flag, value, e.to_string()))
}

/// The entries, and whether any one suffices (`?`) rather than all (`,`).
pub(super) fn parse_dependency(flag: &str, value: &str) -> Result<(Vec<Dependency>, bool), OptionError> {
    dependency::parse_dependency_value(value).map_err(|e| invalid(flag, value, e.to_string()))
}

/// `--time`, `--time-min`: seconds, `None` for UNLIMITED.
pub(super) fn parse_limit(flag: &str, value: &str) -> Result<Option<u64>, OptionError> {
    slurm_time::parse_time_limit(value).map_err(|e| {
        invalid(flag, value, format!("{}; accepted formats: {}", e.problem, slurm_time::ACCEPTED_TIME_FORMATS))
    })
}

/// `--begin`, `--deadline`: placed in time later, against the submission's clock.
pub(super) fn parse_date(flag: &str, value: &str) -> Result<TimeSpec, OptionError> {
    TimeSpec::parse(value)
        .map_err(|problem| invalid(flag, value, format!("{problem}; accepted formats: {ACCEPTED_DATE_FORMATS}")))
}

pub(super) fn parse_signal(flag: &str, value: &str) -> Result<drover_state::WarnSignal, OptionError> {
    drover_state::signal::parse_warn_signal(value).map_err(|e| invalid(flag, value, e.to_string()))
}

/// Slurm's `--no-kill[=set|off|no]`.
pub(super) fn parse_no_kill(flag: &str, value: &str) -> Result<bool, OptionError> {
    match value.to_ascii_lowercase().as_str() {
        "set" => Ok(true),
        "off" | "no" => Ok(false),
        _ => Err(invalid(flag, value, "expected set, off or no (or no value)")),
    }
}

/// Whether output is appended (`append`) rather than truncated.
pub(super) fn parse_open_mode(flag: &str, value: &str) -> Result<bool, OptionError> {
    match value.to_ascii_lowercase().as_str() {
        "append" | "a" => Ok(true),
        "truncate" | "t" => Ok(false),
        _ => Err(invalid(flag, value, "expected append or truncate")),
    }
}

/// Features, all required (`a&b`).
pub(super) fn parse_constraint(flag: &str, value: &str) -> Result<Vec<String>, OptionError> {
    if value.contains(['|', '[', ']', '*']) {
        return Err(invalid(flag, value, "only AND constraints are supported (features joined with &)"));
    }
    Ok(value.split(['&', ',']).map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect())
}

/// `--nodelist`, `--exclude`: a hostlist, expanded.
pub(super) fn parse_hosts(flag: &str, value: &str) -> Result<Vec<String>, OptionError> {
    drover_state::hostlist::expand_hostlist(value).map_err(|e| invalid(flag, value, e.to_string()))
}

// The options below are accepted only with the values that ask for what Drover does anyway. Their values are
// not otherwise checked (Slurm checks some, but none of them changes what Drover runs).

pub(super) fn mail_type_note(value: &str) -> &'static str {
    if value.eq_ignore_ascii_case("NONE") { "" } else { "Drover sends no mail" }
}

/// `yes` or `no`, in any case.
pub(super) fn parse_yes_no(flag: &str, value: &str) -> Result<bool, OptionError> {
    match value.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(invalid(flag, value, "expected yes or no")),
    }
}

/// `--clusters`: only an empty list (this cluster) is accepted.
pub(super) fn check_clusters(flag: &str, value: &str) -> Result<(), OptionError> {
    if value.is_empty() {
        return Ok(());
    }
    Err(OptionError::Refused {
        flag: flag.to_string(),
        reason: "Drover runs a single cluster; federation (submitting to other clusters) is not supported",
    })
}

/// `--input`: only `/dev/null`, where a batch script's stdin already comes from.
pub(super) fn check_input(flag: &str, value: &str) -> Result<(), OptionError> {
    if value == "/dev/null" {
        return Ok(());
    }
    Err(OptionError::Refused {
        flag: flag.to_string(),
        reason: "not supported: a batch script's stdin is /dev/null; redirect it inside the script",
    })
}

/// A count made of digits only, fitting in u32.
pub(super) fn count(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

pub(super) fn positive(flag: &str, value: &str) -> Result<u32, OptionError> {
    match count(value) {
        Some(0) => Err(invalid(flag, value, "must be at least 1")),
        Some(n) => Ok(n),
        None => Err(invalid(flag, value, "expected a positive whole number")),
    }
}

/// A memory size as Slurm's `str_to_mbytes` reads it, in MiB: digits (an optional leading `+`), then an optional
/// unit `K`, `M`, `G` or `T` in either case, optionally followed by `B`. No unit means MiB; `K` rounds up.
pub(super) fn parse_mem_size(flag: &str, value: &str) -> Result<u64, OptionError> {
    const EXPECTED: &str = "expected a whole number with an optional unit K, M, G or T (MiB when none), e.g. 4G";
    let unsigned = value.strip_prefix('+').unwrap_or(value);
    let digits_end = unsigned.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(unsigned.len());
    let (digits, unit) = unsigned.split_at(digits_end);
    if digits.is_empty() {
        return Err(invalid(flag, value, EXPECTED));
    }
    let unit = unit.to_ascii_uppercase();
    let unit = match unit.as_str() {
        "" => "M",
        "B" => return Err(invalid(flag, value, EXPECTED)),
        u => u.strip_suffix('B').unwrap_or(u),
    };
    let too_large = || invalid(flag, value, format!("the size is too large (at most {MAX_MEM_MB} MiB)"));
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    let mb = match unit {
        "K" => Some(n.div_ceil(1024)),
        "M" => Some(n),
        "G" => n.checked_mul(1 << 10),
        "T" => n.checked_mul(1 << 20),
        _ => return Err(invalid(flag, value, EXPECTED)),
    };
    mb.filter(|mb| *mb <= MAX_MEM_MB).ok_or_else(too_large)
}

/// `N` or `MIN-MAX`: the least and the most nodes.
pub(super) fn parse_nodes(flag: &str, value: &str) -> Result<(u32, u32), OptionError> {
    const EXPECTED: &str = "expected a number or MIN-MAX";
    let (min, max) = match value.split_once('-') {
        Some((lo, hi)) => (count(lo), count(hi)),
        None => (count(value), count(value)),
    };
    let (Some(min), Some(max)) = (min, max) else {
        return Err(invalid(flag, value, EXPECTED));
    };
    if min == 0 || max == 0 {
        return Err(invalid(flag, value, "node counts must be at least 1"));
    }
    if min > max {
        return Err(invalid(flag, value, format!("the minimum node count {min} is more than the maximum {max}")));
    }
    Ok((min, max))
}

/// A GPU type name: letters, digits, `_`, `-`, `.`.
pub(super) fn valid_type(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// GPUs per node and their type.
pub(super) fn parse_gres(flag: &str, value: &str) -> Result<(u32, Option<String>), OptionError> {
    if value.eq_ignore_ascii_case("none") {
        return Ok((0, None));
    }
    const EXPECTED: &str = "expected gpu, gpu:COUNT, gpu:TYPE or gpu:TYPE:COUNT";
    let mut found = None;
    for entry in value.split(',') {
        let mut parts = entry.split(':');
        let name = parts.next().unwrap_or_default();
        if name != "gpu" {
            let expected = if name.is_empty() {
                format!("an entry is empty; {EXPECTED}")
            } else {
                format!("only gpu resources are supported, not {name:?}; {EXPECTED}")
            };
            return Err(invalid(flag, value, expected));
        }
        let rest: Vec<&str> = parts.collect();
        let parsed = match rest.as_slice() {
            [] => Some((1, None)),
            [n] if count(n).is_some() => count(n).map(|n| (n, None)),
            [t] if valid_type(t) => Some((1, Some(t.to_string()))),
            [t, n] if valid_type(t) => count(n).map(|n| (n, Some(t.to_string()))),
            _ => None,
        };
        let Some((per_node, gpu_type)) = parsed else {
            return Err(invalid(flag, value, format!("{entry:?} is malformed; {EXPECTED}")));
        };
        if found.is_some() {
            return Err(invalid(flag, value, "gpu is listed more than once; give one gpu entry"));
        }
        found = Some((per_node, gpu_type));
    }
    Ok(found.expect("split yields at least one entry"))
}

/// `COUNT` or `TYPE:COUNT` (`--gpus-per-node`, `--gpus`, `--gpus-per-task`).
pub(super) fn parse_gpu_count(flag: &str, value: &str) -> Result<(u32, Option<String>), OptionError> {
    const EXPECTED: &str = "expected COUNT or TYPE:COUNT";
    let parsed = match value.split_once(':') {
        Some((t, n)) if valid_type(t) => count(n).map(|n| (n, Some(t.to_string()))),
        Some(_) => None,
        None => count(value).map(|n| (n, None)),
    };
    parsed.ok_or_else(|| invalid(flag, value, EXPECTED))
}

/// `--nice=N`: a whole number, optionally signed, within ±[`MAX_NICE`].
pub(super) fn parse_nice(flag: &str, value: &str) -> Result<i32, OptionError> {
    let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(flag, value, "expected a whole number, optionally negative (e.g. --nice=50)"));
    }
    match value.parse::<i64>() {
        Ok(n) if (-i64::from(MAX_NICE)..=i64::from(MAX_NICE)).contains(&n) => Ok(n as i32),
        _ => Err(invalid(flag, value, format!("the nice value must lie between -{MAX_NICE} and {MAX_NICE}"))),
    }
}

/// Splits on commas outside single or double quotes, dropping the quote characters.
pub(super) fn split_export(value: &str) -> Result<Vec<String>, char> {
    let mut entries = vec![String::new()];
    let mut quote: Option<char> = None;
    for c in value.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => entries.last_mut().expect("non-empty").push(c),
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == ',' => entries.push(String::new()),
            None => entries.last_mut().expect("non-empty").push(c),
        }
    }
    match quote {
        Some(q) => Err(q),
        None => Ok(entries),
    }
}

/// The policy, and the `VAR=value` entries that add to or override the captured environment.
pub(super) fn parse_export(flag: &str, value: &str) -> Result<(ExportPolicy, Vec<(String, String)>), OptionError> {
    const EXPECTED: &str = "expected ALL, NONE, or a comma list of VAR and VAR=value entries (optionally with ALL)";
    let entries = split_export(value).map_err(|q| invalid(flag, value, format!("unmatched {q} quote; {EXPECTED}")))?;
    let entries: Vec<String> = entries.into_iter().filter(|e| !e.is_empty()).collect();
    if entries.is_empty() {
        return Err(invalid(flag, value, EXPECTED));
    }
    let is = |e: &str, word: &str| e.eq_ignore_ascii_case(word);
    if entries.len() == 1 && is(&entries[0], "ALL") {
        return Ok((ExportPolicy::All, Vec::new()));
    }
    if entries.len() == 1 && is(&entries[0], "NONE") {
        return Ok((ExportPolicy::None, Vec::new()));
    }
    let mut all = false;
    let mut names: Vec<String> = Vec::new();
    let mut set: Vec<(String, String)> = Vec::new();
    for entry in &entries {
        if is(entry, "ALL") {
            all = true;
            continue;
        }
        if is(entry, "NONE") {
            return Err(invalid(
                flag,
                value,
                "NONE cannot be combined with other entries; use --export=NONE alone, or list the variables to pass",
            ));
        }
        let (name, val) = match entry.split_once('=') {
            Some((name, val)) => (name, Some(val)),
            None => (entry.as_str(), None),
        };
        if name.is_empty() || name.chars().any(|c| c.is_whitespace()) {
            return Err(invalid(flag, value, format!("{entry:?} is not a variable name; {EXPECTED}")));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        if let Some(val) = val {
            match set.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = val.to_string(),
                None => set.push((name.to_string(), val.to_string())),
            }
        }
    }
    Ok((ExportPolicy::Vars { all, names: names.into() }, set))
}

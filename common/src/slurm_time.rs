//! Slurm's time-limit text: parsing `--time` values and printing durations the way `squeue` does.
//!
//! Pure functions over strings and integers; no clock.

use std::fmt;

/// The formats [`parse_time_limit`] accepts, as listed in every [`TimeFormatError`].
pub const ACCEPTED_TIME_FORMATS: &str = "minutes, minutes:seconds, hours:minutes:seconds, days-hours, \
     days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED";

/// What was wrong with a time-limit text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeFormatProblem {
    /// The text was empty (or only whitespace).
    Empty,
    /// A leading `-` (other than the literal `-1`, which means UNLIMITED).
    Negative,
    /// A field that is empty or not made of ASCII digits only; holds the field.
    NotANumber(String),
    /// More `-` or `:` separators than any accepted format has.
    TooManyFields,
    /// The total does not fit in 64-bit seconds.
    Overflow,
}

impl fmt::Display for TimeFormatProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeFormatProblem::Empty => write!(f, "the value is empty"),
            TimeFormatProblem::Negative => write!(f, "negative time limits are not allowed (use UNLIMITED or -1)"),
            TimeFormatProblem::NotANumber(part) if part.is_empty() => write!(f, "a field is empty"),
            TimeFormatProblem::NotANumber(part) => write!(f, "{part:?} is not a whole number"),
            TimeFormatProblem::TooManyFields => write!(f, "too many fields"),
            TimeFormatProblem::Overflow => write!(f, "the value is too large"),
        }
    }
}

/// A `--time` value that is none of Slurm's formats. The message names the text, says what is wrong with it,
/// and lists the accepted formats.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid time limit {text:?}: {problem}; accepted formats: {ACCEPTED_TIME_FORMATS}")]
pub struct TimeFormatError {
    /// The text as given.
    pub text: String,
    pub problem: TimeFormatProblem,
}

/// Parses a Slurm `--time` value into seconds.
///
/// Accepted, as Slurm's `time_str2secs` does: `minutes`, `minutes:seconds`, `hours:minutes:seconds`, `days-hours`,
/// `days-hours:minutes`, `days-hours:minutes:seconds`. Like Slurm, no field is range-checked (`90` minutes,
/// `1:90:00` and `0-36` are all accepted and simply add up). Returns `Ok(None)` for "no limit": `UNLIMITED`,
/// `INFINITE`, `-1` (case-insensitive), and any value that adds up to zero (Slurm's `--time=0`).
///
/// Unlike Slurm, every field must be present: `1-` or `5:` is an error rather than a silent zero.
pub fn parse_time_limit(text: &str) -> Result<Option<u64>, TimeFormatError> {
    let fail = |problem| TimeFormatError { text: text.to_string(), problem };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(fail(TimeFormatProblem::Empty));
    }
    if trimmed == "-1" || trimmed.eq_ignore_ascii_case("UNLIMITED") || trimmed.eq_ignore_ascii_case("INFINITE") {
        return Ok(None);
    }
    if trimmed.starts_with('-') {
        return Err(fail(TimeFormatProblem::Negative));
    }

    let (days, clock) = match trimmed.split_once('-') {
        Some((days, rest)) => (Some(days), rest),
        None => (None, trimmed),
    };
    let number = |part: &str| -> Result<u64, TimeFormatError> {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            // A second dash lands here as part of a field ("1-2-3"): report it as too many fields.
            if part.contains('-') {
                return Err(fail(TimeFormatProblem::TooManyFields));
            }
            return Err(fail(TimeFormatProblem::NotANumber(part.to_string())));
        }
        part.parse::<u64>().map_err(|_| fail(TimeFormatProblem::Overflow))
    };
    let fields: Vec<&str> = clock.split(':').collect();
    if fields.len() > 3 {
        return Err(fail(TimeFormatProblem::TooManyFields));
    }
    let values = fields.iter().map(|part| number(part)).collect::<Result<Vec<u64>, _>>()?;

    // Express everything as (days, hours, minutes, seconds).
    let (d, h, m, s) = match days {
        Some(days) => {
            let d = number(days)?;
            match values.as_slice() {
                [h] => (d, *h, 0, 0),
                [h, m] => (d, *h, *m, 0),
                [h, m, s] => (d, *h, *m, *s),
                _ => unreachable!("1 to 3 fields"),
            }
        }
        None => match values.as_slice() {
            [m] => (0, 0, *m, 0),
            [m, s] => (0, 0, *m, *s),
            [h, m, s] => (0, *h, *m, *s),
            _ => unreachable!("1 to 3 fields"),
        },
    };
    let total = d
        .checked_mul(24)
        .and_then(|x| x.checked_add(h))
        .and_then(|x| x.checked_mul(60))
        .and_then(|x| x.checked_add(m))
        .and_then(|x| x.checked_mul(60))
        .and_then(|x| x.checked_add(s))
        .ok_or_else(|| fail(TimeFormatProblem::Overflow))?;
    Ok(if total == 0 { None } else { Some(total) })
}

/// A duration as `squeue` prints its `TIME` and `TIME_LIMIT` columns (Slurm's `secs2time_str`):
/// `M:SS` under an hour, `H:MM:SS` under a day, `D-HH:MM:SS` from a day on.
pub fn format_duration(secs: u64) -> String {
    let seconds = secs % 60;
    let minutes = (secs / 60) % 60;
    let hours = (secs / 3600) % 24;
    let days = secs / 86_400;
    if days > 0 {
        format!("{days}-{hours:02}:{minutes:02}:{seconds:02}")
    } else if hours > 0 {
        format!("{hours}:{minutes:02}:{seconds:02}")
    } else {
        format!("{minutes}:{seconds:02}")
    }
}

/// A time limit as `squeue` prints it: [`format_duration`], or `UNLIMITED` for `None`.
pub fn format_time_limit(limit: Option<u64>) -> String {
    match limit {
        Some(secs) => format_duration(secs),
        None => "UNLIMITED".to_string(),
    }
}

/// A duration as `scontrol show` prints its times (`RunTime`, `TimeLimit`, `MaxTime`): always `HH:MM:SS`, and
/// `D-HH:MM:SS` from a day on (Slurm's `secs2time_str`, where squeue's columns use the short form).
pub fn format_duration_long(secs: u64) -> String {
    let (days, hours, minutes, seconds) = (secs / 86_400, (secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    if days > 0 {
        format!("{days}-{hours:02}:{minutes:02}:{seconds:02}")
    } else {
        format!("{hours:02}:{minutes:02}:{seconds:02}")
    }
}

/// A time limit as `scontrol show` prints it: [`format_duration_long`], or `UNLIMITED` for `None`.
pub fn format_time_limit_long(limit: Option<u64>) -> String {
    limit.map_or_else(|| "UNLIMITED".to_string(), format_duration_long)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_pads_what_squeue_shortens() {
        assert_eq!(format_duration(90), "1:30");
        assert_eq!(format_duration_long(90), "00:01:30");
        assert_eq!(format_duration_long(5400), "01:30:00");
        assert_eq!(format_duration_long(93_780), "1-02:03:00");
        assert_eq!(format_time_limit_long(None), "UNLIMITED");
    }

    fn ok(text: &str) -> Option<u64> {
        parse_time_limit(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    fn problem(text: &str) -> TimeFormatProblem {
        match parse_time_limit(text) {
            Ok(v) => panic!("{text:?} should be rejected, got {v:?}"),
            Err(e) => {
                assert_eq!(e.text, text);
                e.problem
            }
        }
    }

    #[test]
    fn minutes() {
        assert_eq!(ok("1"), Some(60));
        assert_eq!(ok("30"), Some(1800));
        assert_eq!(ok("90"), Some(5400));
        assert_eq!(ok("007"), Some(420));
    }

    #[test]
    fn minutes_seconds() {
        assert_eq!(ok("5:07"), Some(307));
        assert_eq!(ok("0:30"), Some(30));
        assert_eq!(ok("1:90"), Some(150));
    }

    #[test]
    fn hours_minutes_seconds() {
        assert_eq!(ok("1:00:00"), Some(3600));
        assert_eq!(ok("2:30:15"), Some(2 * 3600 + 30 * 60 + 15));
        // Slurm does not range-check fields; they simply add up.
        assert_eq!(ok("1:90:00"), Some(3600 + 90 * 60));
        assert_eq!(ok("48:00:00"), Some(48 * 3600));
    }

    #[test]
    fn days_hours() {
        assert_eq!(ok("1-0"), Some(86_400));
        assert_eq!(ok("2-12"), Some(2 * 86_400 + 12 * 3600));
        assert_eq!(ok("0-36"), Some(36 * 3600));
    }

    #[test]
    fn days_hours_minutes() {
        assert_eq!(ok("1-2:30"), Some(86_400 + 2 * 3600 + 30 * 60));
    }

    #[test]
    fn days_hours_minutes_seconds() {
        assert_eq!(ok("1-02:03:04"), Some(86_400 + 2 * 3600 + 3 * 60 + 4));
        assert_eq!(ok("7-00:00:00"), Some(7 * 86_400));
    }

    #[test]
    fn unlimited_spellings() {
        for text in ["UNLIMITED", "unlimited", "Unlimited", "INFINITE", "infinite", "-1", " -1 "] {
            assert_eq!(ok(text), None, "{text:?}");
        }
    }

    #[test]
    fn zero_means_no_limit() {
        for text in ["0", "0:00", "0:0:0", "0-0", "0-00:00:00", "000"] {
            assert_eq!(ok(text), None, "{text:?}");
        }
    }

    #[test]
    fn surrounding_whitespace_is_ignored() {
        assert_eq!(ok(" 10 "), Some(600));
    }

    #[test]
    fn empty_is_rejected() {
        assert_eq!(problem(""), TimeFormatProblem::Empty);
        assert_eq!(problem("   "), TimeFormatProblem::Empty);
    }

    #[test]
    fn negative_is_rejected() {
        assert_eq!(problem("-5"), TimeFormatProblem::Negative);
        assert_eq!(problem("-1:00"), TimeFormatProblem::Negative);
        assert_eq!(problem("-2"), TimeFormatProblem::Negative);
    }

    #[test]
    fn non_digits_are_rejected() {
        assert_eq!(problem("ten"), TimeFormatProblem::NotANumber("ten".into()));
        assert_eq!(problem("1h"), TimeFormatProblem::NotANumber("1h".into()));
        assert_eq!(problem("1:x"), TimeFormatProblem::NotANumber("x".into()));
        assert_eq!(problem("+5"), TimeFormatProblem::NotANumber("+5".into()));
        assert_eq!(problem("1.5"), TimeFormatProblem::NotANumber("1.5".into()));
        assert_eq!(problem("1 0"), TimeFormatProblem::NotANumber("1 0".into()));
        assert_eq!(problem("x-1"), TimeFormatProblem::NotANumber("x".into()));
        assert_eq!(problem("١٢"), TimeFormatProblem::NotANumber("١٢".into()));
    }

    #[test]
    fn empty_fields_are_rejected() {
        for text in ["1-", "5:", ":5", "1::2", "1-:00", "-"] {
            let p = problem(text);
            assert!(
                matches!(p, TimeFormatProblem::NotANumber(ref s) if s.is_empty()) || p == TimeFormatProblem::Negative,
                "{text:?}: {p:?}"
            );
        }
    }

    #[test]
    fn too_many_fields_are_rejected() {
        assert_eq!(problem("1:2:3:4"), TimeFormatProblem::TooManyFields);
        assert_eq!(problem("1-2:3:4:5"), TimeFormatProblem::TooManyFields);
        assert_eq!(problem("1-2-3"), TimeFormatProblem::TooManyFields);
        assert_eq!(problem("1-2:3-4"), TimeFormatProblem::TooManyFields);
    }

    #[test]
    fn colon_before_dash_is_rejected() {
        // "1:2-3": the days field would be "1:2".
        assert!(matches!(problem("1:2-3"), TimeFormatProblem::NotANumber(_)));
    }

    #[test]
    fn overflow_is_rejected() {
        assert_eq!(problem("99999999999999999999999"), TimeFormatProblem::Overflow);
        assert_eq!(problem(&u64::MAX.to_string()), TimeFormatProblem::Overflow);
        assert_eq!(problem(&format!("{}-0", u64::MAX / 86_400 + 1)), TimeFormatProblem::Overflow);
        assert_eq!(problem(&format!("1:{}", u64::MAX)), TimeFormatProblem::Overflow);
        // The largest number of seconds still fits.
        assert_eq!(ok(&format!("0:{}", u64::MAX)), Some(u64::MAX));
    }

    #[test]
    fn error_message_names_text_and_formats() {
        let msg = parse_time_limit("2h").unwrap_err().to_string();
        assert!(msg.contains("\"2h\""), "{msg}");
        assert!(msg.contains("\"2h\" is not a whole number"), "{msg}");
        for format in [
            "minutes",
            "minutes:seconds",
            "hours:minutes:seconds",
            "days-hours",
            "days-hours:minutes",
            "days-hours:minutes:seconds",
            "UNLIMITED",
        ] {
            assert!(msg.contains(format), "{msg} lacks {format}");
        }
        let msg = parse_time_limit("").unwrap_err().to_string();
        assert!(msg.starts_with("invalid time limit \"\": the value is empty"), "{msg}");
    }

    #[test]
    fn formats_like_squeue() {
        assert_eq!(format_duration(0), "0:00");
        assert_eq!(format_duration(7), "0:07");
        assert_eq!(format_duration(307), "5:07");
        assert_eq!(format_duration(3599), "59:59");
        assert_eq!(format_duration(3600), "1:00:00");
        assert_eq!(format_duration(3661), "1:01:01");
        assert_eq!(format_duration(86_399), "23:59:59");
        assert_eq!(format_duration(86_400), "1-00:00:00");
        assert_eq!(format_duration(2 * 86_400 + 3 * 3600 + 4 * 60 + 5), "2-03:04:05");
        assert_eq!(format_duration(400 * 86_400), "400-00:00:00");
    }

    #[test]
    fn formats_time_limits() {
        assert_eq!(format_time_limit(None), "UNLIMITED");
        assert_eq!(format_time_limit(Some(1800)), "30:00");
        assert_eq!(format_time_limit(Some(86_400)), "1-00:00:00");
    }

    #[test]
    fn round_trips() {
        let samples = [
            1,
            59,
            60,
            61,
            307,
            3599,
            3600,
            3601,
            86_399,
            86_400,
            86_401,
            90_061,
            7 * 86_400,
            365 * 86_400 + 1,
            u64::MAX / 2,
            u64::MAX,
        ];
        for secs in samples {
            let text = format_duration(secs);
            assert_eq!(ok(&text), Some(secs), "{secs} -> {text:?}");
            assert_eq!(format_time_limit(ok(&text)), text);
        }
        assert_eq!(ok(&format_time_limit(None)), None);
    }

    #[test]
    fn round_trips_exhaustively_over_two_days() {
        for secs in (1..2 * 86_400 + 5).step_by(7) {
            assert_eq!(ok(&format_duration(secs)), Some(secs), "{secs}");
        }
    }

    proptest::proptest! {
        #[test]
        fn round_trips_any_duration(secs in 1u64..) {
            proptest::prop_assert_eq!(parse_time_limit(&format_duration(secs)).unwrap(), Some(secs));
        }

        #[test]
        fn never_panics(text in "\\PC{0,20}") {
            let _ = parse_time_limit(&text);
        }

        #[test]
        fn never_panics_on_time_like_text(text in "[-0-9:]{0,12}") {
            let _ = parse_time_limit(&text);
        }
    }
}

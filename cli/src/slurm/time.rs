//! Time as Slurm's commands read and write it: one reader of Slurm's `parse_time` forms ([`TimeSpec`]) for every
//! command that takes a time (`sbatch --begin/--deadline`, `sacct -S/-E`, `sreport`, `scontrol ... StartTime=`),
//! `ctime(3)` lines, the local clock and midnight.
//!
//! Parsing and placing in time are apart: `sbatch` places a time at the submitter's UTC offset (pure, so tests fix
//! it; a daylight-saving change before the time is not accounted for), the reporting commands in this host's
//! zone through the C library, as Slurm does ([`Zone`]). Errors name the byte Slurm names (`pos=`), checked
//! against Slurm 22.05 itself.

use drover_common::wall::now_ms;

/// The time now (ms since the epoch) and the local UTC offset (seconds) at that time, for `--begin` and
/// `--deadline`, which Slurm reads in local time.
pub fn local_clock() -> (u64, i32) {
    let now_ms = now_ms();
    let secs = (now_ms / 1_000) as libc::time_t;
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r reads `secs` and writes only into `tm`.
    let offset = if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() { 0 } else { tm.tm_gmtoff };
    (now_ms, i32::try_from(offset).unwrap_or(0))
}

/// `-l`'s first line: the time, as `ctime(3)` writes it (`Tue Jun 30 21:49:08 2026`).
pub fn ctime(now_ms: u64) -> String {
    let secs = (now_ms / 1000) as libc::time_t;
    let mut buf = [0 as libc::c_char; 64];
    // SAFETY: ctime_r writes at most 26 bytes into `buf`, which holds 64.
    let text = unsafe { libc::ctime_r(&secs, buf.as_mut_ptr()) };
    if text.is_null() {
        return String::new();
    }
    // SAFETY: on success ctime_r leaves a NUL-terminated string in `buf`.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().trim_end().to_string()
}

/// Local time of `secs` (seconds since the epoch).
pub(crate) fn local_tm(secs: i64) -> libc::tm {
    let t = secs as libc::time_t;
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r writes only into `tm`.
    unsafe { libc::localtime_r(&t, &mut tm) };
    tm
}

/// Local `tm` fields back to seconds since the epoch (daylight saving as the zone says), -1 if impossible.
pub fn mktime(year: i32, month: i32, mday: i32, hour: i32, minute: i32, second: i32) -> i64 {
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = year;
    tm.tm_mon = month;
    tm.tm_mday = mday;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    tm.tm_sec = second;
    tm.tm_isdst = -1;
    // SAFETY: mktime reads and normalizes only `tm`.
    #[allow(clippy::useless_conversion)] // time_t is not i64 on every target
    let t = i64::from(unsafe { libc::mktime(&mut tm) });
    t
}

/// The start of the local day holding `now_s`, in seconds since the epoch.
pub fn local_midnight(now_s: u64) -> i64 {
    let tm = local_tm(now_s as i64);
    mktime(tm.tm_year, tm.tm_mon, tm.tm_mday, 0, 0, 0)
}

/// Where a time without a zone lies: at a fixed offset from UTC (pure: `sbatch` resolves `--begin` against the
/// submitter's offset at submission, which tests can fix) or in this host's zone, daylight saving included (what
/// `sacct`, `sreport` and `scontrol` do, through the C library as Slurm does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// Seconds east of UTC.
    Offset(i32),
    Local,
}

impl Zone {
    /// The date and time of day at `s` seconds since the epoch.
    fn civil(self, s: i64) -> Option<Civil> {
        match self {
            Zone::Offset(off) => Some(Civil::from_seconds(s.checked_add(i64::from(off))?)),
            Zone::Local => {
                let tm = local_tm(s);
                Some(Civil {
                    year: i64::from(tm.tm_year) + 1900,
                    month: i64::from(tm.tm_mon),
                    mday: i64::from(tm.tm_mday),
                    hour: i64::from(tm.tm_hour),
                    minute: i64::from(tm.tm_min),
                    second: i64::from(tm.tm_sec),
                })
            }
        }
    }

    /// Seconds since the epoch of a date and time of day; a day past the month's end rolls over into the next
    /// month, as with `mktime` (`02/31` is March 2 or 3).
    fn epoch(self, c: Civil) -> Option<i64> {
        match self {
            Zone::Offset(off) => {
                let days = days_from_civil(c.year, c.month + 1, 1) + c.mday - 1;
                let local = days.checked_mul(86_400)?.checked_add(c.hour * 3_600 + c.minute * 60 + c.second)?;
                local.checked_sub(i64::from(off))
            }
            Zone::Local => {
                let field = |v: i64| i32::try_from(v).ok();
                let t = mktime(
                    field(c.year - 1900)?,
                    field(c.month)?,
                    field(c.mday)?,
                    field(c.hour)?,
                    field(c.minute)?,
                    field(c.second)?,
                );
                (t != -1).then_some(t)
            }
        }
    }
}

/// Why a time did not parse, and where (the byte offset Slurm reports as `pos=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeError {
    /// May be -1, as Slurm prints it for a one-digit month 0 at the start.
    pub pos: i64,
    pub problem: String,
    /// Nothing was given at all (Slurm's `parse_time` reads that as time 0).
    pub empty: bool,
}

impl TimeError {
    fn at(pos: i64, problem: &str) -> TimeError {
        TimeError { pos, problem: problem.to_string(), empty: false }
    }
}

impl std::fmt::Display for TimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.problem)
    }
}

/// A time Slurm's `parse_time` refuses, and where in the text it gave up (Slurm's `pos=`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid time specification (pos={pos}): {text}")]
pub struct InvalidTime {
    pub pos: i64,
    pub text: String,
}

/// Slurm's `parse_time` (src/common/parse_time.c) in this host's zone: every form [`TimeSpec::parse`] reads,
/// `past` resolving a date or time of day without the rest toward the past (`sacct`, `sreport`) rather than the
/// future (`scontrol ... StartTime=`). The error is Slurm's line: `Invalid time specification (pos=N): TEXT`;
/// nothing at all is time 0, as in Slurm.
pub fn parse_time(text: &str, now_s: u64, past: bool) -> Result<i64, InvalidTime> {
    let bad = |pos: i64| InvalidTime { pos, text: text.to_string() };
    match TimeSpec::parse(text) {
        // Slurm reports a date `mktime` refuses at the end of the text.
        Ok(spec) => spec
            .resolve(i64::try_from(now_s).unwrap_or(i64::MAX), Zone::Local, past)
            .ok_or_else(|| bad(text.find('\n').unwrap_or(text.len()) as i64)),
        Err(e) if e.empty => Ok(0),
        Err(e) => Err(bad(e.pos)),
    }
}

/// The forms [`TimeSpec::parse`] accepts, as listed in its errors.
pub const ACCEPTED_DATE_FORMATS: &str = "HH:MM[:SS] [AM|PM], midnight, noon, fika, teatime, today, tomorrow, \
     MMDD[YY], MM/DD[/YY], MM.DD[.YY], YYYY-MM-DD[THH:MM[:SS]], now[+COUNT[seconds|minutes|hours|days|weeks]]";

/// The furthest `now+COUNT` may reach either way: ten thousand years, well past any calendar date Slurm prints.
const MAX_DELTA_S: i64 = 10_000 * 366 * 86_400;

/// A `--begin` or `--deadline` value, checked but not yet placed in time: that needs the clock and the local
/// UTC offset, which only [`build_spec`] has (from [`SubmitContext`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeSpec(TimeAt);

#[derive(Debug, Clone, PartialEq, Eq)]
enum TimeAt {
    /// `uts<seconds>`: an absolute time.
    Epoch(i64),
    /// The parts in the order given; each later one overrides the fields it sets, as in Slurm's `parse_time`.
    Parts(Vec<TimePart>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimePart {
    Today,
    Tomorrow,
    /// `now` plus this many seconds: sets the date and the time.
    Now(i64),
    /// A time of day (`HH:MM[:SS]`, `noon`, ...).
    Clock {
        hour: i64,
        minute: i64,
        second: i64,
    },
    /// A date; `month` counts from 0. `year` is `None` for `MMDD` without `YY` (or with `YY` = `00`, as in Slurm),
    /// which leaves the year as it was, or picks it.
    Date {
        month: i64,
        mday: i64,
        year: Option<i64>,
    },
}

/// C's `isspace` in the C locale (Slurm's parsers use it, and Rust's whitespace is wider).
pub(crate) fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn starts_with_ci(text: &[u8], word: &str) -> bool {
    text.len() >= word.len() && text[..word.len()].eq_ignore_ascii_case(word.as_bytes())
}

/// `now+COUNT[unit]` units, matched in this order (so `seconds` before `second`), case-insensitive (`--begin`
/// and sacct's `-S/-E` read the same forms).
pub(crate) const DELTA_UNITS: &[(&str, i64)] = &[
    ("seconds", 1),
    ("second", 1),
    ("minutes", 60),
    ("minute", 60),
    ("hours", 3_600),
    ("hour", 3_600),
    ("days", 86_400),
    ("day", 86_400),
    ("weeks", 604_800),
    ("week", 604_800),
];

impl TimeSpec {
    /// Parses a value as Slurm's `parse_time` does: a scan over the text in which blanks, `-` and `T` separate,
    /// keywords (`today`, `now+1hour`, `noon`, ...) and numbers (`16:00`, `0120`, `2026-01-20`) each set some of
    /// the date and time fields, a later one overriding an earlier one. Slurm's quirks are kept: a capital `T`
    /// is a separator, so `Today` or `TOMORROW` is refused; `MM/DD/YYYY` is refused (the year has two digits);
    /// a year `00` means no year.
    pub fn parse(text: &str) -> Result<TimeSpec, TimeError> {
        // C strings end at NUL, and Slurm's scan stops at a newline.
        let b = text.as_bytes();
        let b = &b[..b.iter().position(|&c| c == 0 || c == b'\n').unwrap_or(b.len())];
        if starts_with_ci(b, "uts") {
            let digits = std::str::from_utf8(&b[3..]).unwrap_or_default();
            let uts = digits.strip_prefix('+').unwrap_or(digits);
            return match uts.bytes().all(|c| c.is_ascii_digit()).then(|| uts.parse::<i64>().ok()).flatten() {
                Some(s) if s >= 1_000_000 => Ok(TimeSpec(TimeAt::Epoch(s))),
                _ => Err(TimeError::at(0, "uts must be followed by seconds since the epoch (at least 1000000)")),
            };
        }
        let at = |i: usize| b.get(i).copied().unwrap_or(0);
        let unexpected = |i: usize| match b.get(i..) {
            Some(rest) if !rest.is_empty() => format!("unexpected {:?}", String::from_utf8_lossy(rest)),
            _ => "it ends too early".to_string(),
        };
        let fail = |pos: i64, problem: String| TimeError { pos, problem, empty: false };
        let mut parts = Vec::new();
        let mut pos = 0;
        while pos < b.len() {
            let c = b[pos];
            if c == b' ' || c == b'\t' || c == b'-' || c == b'T' {
                pos += 1;
                continue;
            }
            let rest = &b[pos..];
            let keyword = [
                ("today", Some(TimePart::Today)),
                ("tomorrow", Some(TimePart::Tomorrow)),
                ("midnight", Some(TimePart::Clock { hour: 0, minute: 0, second: 0 })),
                ("noon", Some(TimePart::Clock { hour: 12, minute: 0, second: 0 })),
                ("fika", Some(TimePart::Clock { hour: 15, minute: 0, second: 0 })),
                ("teatime", Some(TimePart::Clock { hour: 16, minute: 0, second: 0 })),
                ("now", None),
            ]
            .into_iter()
            .find(|(word, _)| starts_with_ci(rest, word));
            match keyword {
                Some((word, Some(part))) => {
                    parts.push(part);
                    pos += word.len();
                    continue;
                }
                Some((_, None)) => {
                    let mut i = pos + 3;
                    let delta = loop {
                        match at(i) {
                            sign @ (b'+' | b'-') => {
                                let expected = || {
                                    format!("{}; expected now+COUNT[seconds|minutes|hours|days|weeks]", unexpected(i))
                                };
                                let (delta, end) = match now_delta(b, i + 1) {
                                    Ok(found) => found,
                                    Err(Some(at)) => return Err(fail(at, expected())),
                                    // Slurm adds the sign's index to where `now` began.
                                    Err(None) => return Err(fail((pos + i) as i64, expected())),
                                };
                                i = end;
                                break if sign == b'-' { -delta } else { delta };
                            }
                            b' ' | b'\t' => i += 1,
                            0 => break 0,
                            _ => return Err(fail((pos + i) as i64, unexpected(i))),
                        }
                    };
                    parts.push(TimePart::Now(delta));
                    pos = i;
                    continue;
                }
                None => {}
            }
            if !c.is_ascii_digit() {
                return Err(fail(pos as i64, unexpected(pos)));
            }
            let (part, end) = if at(pos + 1) == b':' || at(pos + 2) == b':' {
                clock_at(b, pos).map_err(|at| fail(at, format!("{} in a time of day HH:MM[:SS]", unexpected(pos))))?
            } else {
                date_at(b, pos).map_err(|at| fail(at, format!("{} in a date", unexpected(pos))))?
            };
            parts.push(part);
            pos = end;
        }
        if parts.is_empty() {
            return Err(TimeError { pos: 0, problem: "no date or time given".to_string(), empty: true });
        }
        Ok(TimeSpec(TimeAt::Parts(parts)))
    }

    /// Seconds since the epoch: the parts applied to the date and time at `now_s` in `zone`, a date or time of
    /// day without the rest taken as the next one (`--begin`) or, `past`, the last one (`sacct -S`). `None` when
    /// the result lies before 1970 (or beyond any calendar).
    pub fn resolve(&self, now_s: i64, zone: Zone, past: bool) -> Option<i64> {
        let parts = match &self.0 {
            TimeAt::Epoch(s) => return Some(*s),
            TimeAt::Parts(parts) => parts,
        };
        let now = zone.civil(now_s)?;
        let (mut hour, mut minute, mut second) = (None, 0, 0);
        let mut date: Option<(i64, i64)> = None;
        let mut year: Option<i64> = None;
        for part in parts {
            match *part {
                TimePart::Today => (date, year) = (Some((now.month, now.mday)), Some(now.year)),
                TimePart::Tomorrow => {
                    let t = zone.civil(now_s.checked_add(86_400)?)?;
                    (date, year) = (Some((t.month, t.mday)), Some(t.year));
                }
                TimePart::Now(delta) => {
                    let t = zone.civil(now_s.checked_add(delta)?)?;
                    (date, year) = (Some((t.month, t.mday)), Some(t.year));
                    (hour, minute, second) = (Some(t.hour), t.minute, t.second);
                }
                TimePart::Clock { hour: h, minute: m, second: s } => (hour, minute, second) = (Some(h), m, s),
                TimePart::Date { month, mday, year: y } => {
                    date = Some((month, mday));
                    year = y.or(year);
                }
            }
        }
        let hour = match (hour, date) {
            (None, None) => return None,
            // A date alone is its midnight.
            (None, Some(_)) => {
                (minute, second) = (0, 0);
                0
            }
            (Some(h), _) => h,
        };
        // A time of day alone is today's looking back; looking ahead, the next one: today if it is after the
        // current minute, else tomorrow.
        let (month, mday) = match date {
            Some(date) => date,
            None if past || (hour, minute) > (now.hour, now.minute) => {
                year = year.or(Some(now.year));
                (now.month, now.mday)
            }
            None => {
                let t = zone.civil(now_s.checked_add(86_400)?)?;
                year = year.or(Some(t.year));
                (t.month, t.mday)
            }
        };
        // A date without a year: looking back, this year's unless its month is still to come (then last
        // year's); looking ahead, this year's if it is after now (to the minute), else next year's.
        let year = year.unwrap_or(if past {
            if month > now.month { now.year - 1 } else { now.year }
        } else if (month, mday, hour, minute) > (now.month, now.mday, now.hour, now.minute) {
            now.year
        } else {
            now.year + 1
        });
        zone.epoch(Civil { year, month, mday, hour, minute, second }).filter(|s| *s > 0)
    }
}

/// `COUNT[unit]` after `now+` (Slurm's `_get_delta`): blanks anywhere, digits, then an optional unit that ends
/// it. Returns the seconds and the index after what it read; or where Slurm reports the error (the byte before
/// the one it could not read; `None` when no digit came at all, reported at the sign).
fn now_delta(b: &[u8], mut i: usize) -> Result<(i64, usize), Option<i64>> {
    let mut count: i64 = 0;
    let mut digits = 0;
    let too_far = |i: usize| Some(i as i64 - 1);
    while i < b.len() {
        if is_c_space(b[i]) {
            i += 1;
            continue;
        }
        if let Some((unit, multiplier)) = DELTA_UNITS.iter().find(|(unit, _)| starts_with_ci(&b[i..], unit)) {
            count = count.checked_mul(*multiplier).ok_or(too_far(i))?;
            i += unit.len();
            break;
        }
        if !b[i].is_ascii_digit() {
            return Err(too_far(i));
        }
        count = count.checked_mul(10).and_then(|c| c.checked_add(i64::from(b[i] - b'0'))).ok_or(too_far(i))?;
        digits += 1;
        i += 1;
    }
    if digits == 0 {
        return Err(None);
    }
    if count > MAX_DELTA_S {
        return Err(too_far(i));
    }
    Ok((count, i))
}

fn clock_at(b: &[u8], pos: usize) -> Result<(TimePart, usize), i64> {
    // The error offsets are Slurm's (`pos=` in its message): where the scan stood, or the start of a field
    // that is out of range.
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let digit = |i: usize| at(i).is_ascii_digit().then(|| i64::from(at(i) - b'0')).ok_or(i as i64);
    let back = |o: usize| o as i64 - 2;
    let mut o = pos;
    let mut hour = digit(o)?;
    o += 1;
    if at(o) != b':' {
        hour = hour * 10 + digit(o)?;
        o += 1;
    }
    if hour > 23 {
        return Err(back(o));
    }
    if at(o) != b':' {
        return Err(o as i64);
    }
    o += 1;
    let minute = digit(o)? * 10 + digit(o + 1)?;
    o += 2;
    if minute > 59 {
        return Err(back(o));
    }
    let mut second = 0;
    if at(o) == b':' {
        o += 1;
        second = digit(o)? * 10 + digit(o + 1)?;
        o += 2;
        if second > 59 {
            return Err(back(o));
        }
    }
    while is_c_space(at(o)) {
        o += 1;
    }
    let rest = b.get(o..).unwrap_or_default();
    if starts_with_ci(rest, "pm") {
        hour += 12;
        hour = match hour {
            24 => 12,
            h if h > 23 => return Err(o as i64),
            h => h,
        };
        o += 2;
    } else if starts_with_ci(rest, "am") {
        hour = match hour {
            12 => 0,
            h if h > 11 => return Err(o as i64),
            h => h,
        };
        o += 2;
    }
    Ok((TimePart::Clock { hour, minute, second }, o))
}

fn date_at(b: &[u8], pos: usize) -> Result<(TimePart, usize), i64> {
    // The error offsets are Slurm's, as in `clock_at`.
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let digit = |i: usize| at(i).is_ascii_digit().then(|| i64::from(at(i) - b'0'));
    let back = |o: usize| o as i64 - 2;
    // One or two digits from `o`; Slurm takes the first as it is (the caller checked it, or it fails the range).
    let one_or_two = |o: &mut usize| -> i64 {
        let mut n = i64::from(at(*o)) - i64::from(b'0');
        *o += 1;
        if let Some(d) = digit(*o) {
            n = n * 10 + d;
            *o += 1;
        }
        n
    };
    let mut o = pos;
    if b.len() >= pos + 7 && at(pos + 4) == b'-' && at(pos + 7) == b'-' {
        let mut year = 0;
        for _ in 0..4 {
            year = year * 10 + digit(o).ok_or(o as i64)?;
            o += 1;
        }
        o += 1;
        let month = one_or_two(&mut o);
        if !(1..=12).contains(&month) {
            return Err(back(o));
        }
        o += 1;
        digit(o).ok_or(o as i64)?;
        let mday = one_or_two(&mut o);
        if !(1..=31).contains(&mday) {
            return Err(back(o));
        }
        return Ok((TimePart::Date { month: month - 1, mday, year: Some(year) }, o));
    }
    let month = one_or_two(&mut o);
    if !(1..=12).contains(&month) {
        return Err(back(o));
    }
    if matches!(at(o), b'.' | b'/') {
        o += 1;
    }
    digit(o).ok_or(o as i64)?;
    let mday = one_or_two(&mut o);
    if !(1..=31).contains(&mday) {
        return Err(back(o));
    }
    if matches!(at(o), b'.' | b'/') {
        o += 1;
    }
    let mut yy = 0;
    if let Some(d) = digit(o) {
        yy = d * 10 + digit(o + 1).ok_or(o as i64 + 1)?;
        o += 2;
    }
    let year = (yy != 0).then_some(2000 + yy);
    Ok((TimePart::Date { month: month - 1, mday, year }, o))
}

/// A local date and time of day; `month` counts from 0.
struct Civil {
    year: i64,
    month: i64,
    mday: i64,
    hour: i64,
    minute: i64,
    second: i64,
}

impl Civil {
    fn from_seconds(s: i64) -> Civil {
        let (days, secs) = (s.div_euclid(86_400), s.rem_euclid(86_400));
        let (year, month, mday) = civil_from_days(days);
        Civil { year, month: month - 1, mday, hour: secs / 3_600, minute: secs / 60 % 60, second: secs % 60 }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1-12), after Howard Hinnant's algorithm.
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`]: `(year, month 1-12, day)`.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_slurms_forms() {
        let now = mktime(126, 5, 15, 12, 30, 0) as u64; // 2026-06-15 12:30:00 local
        let t = |text: &str| parse_time(text, now, true).unwrap();
        assert_eq!(t("now"), now as i64);
        assert_eq!(t("now-1hour"), now as i64 - 3_600);
        assert_eq!(t("now+2days"), now as i64 + 2 * 86_400);
        assert_eq!(t("now-30"), now as i64 - 30);
        assert_eq!(t("2026-06-01T10:00"), mktime(126, 5, 1, 10, 0, 0));
        assert_eq!(t("2026-06-01T10:00:30"), mktime(126, 5, 1, 10, 0, 30));
        assert_eq!(t("2026-06-01"), mktime(126, 5, 1, 0, 0, 0));
        assert_eq!(t("midnight"), mktime(126, 5, 15, 0, 0, 0));
        assert_eq!(t("today"), mktime(126, 5, 15, 0, 0, 0));
        assert_eq!(t("10:15"), mktime(126, 5, 15, 10, 15, 0));
        assert_eq!(t("2:15pm"), mktime(126, 5, 15, 14, 15, 0));
        assert_eq!(t("0601"), mktime(126, 5, 1, 0, 0, 0));
        assert_eq!(t("12/31"), mktime(125, 11, 31, 0, 0, 0), "a later month is last year's, looking back");
        assert_eq!(t("06/01/25"), mktime(125, 5, 1, 0, 0, 0));
        assert_eq!(t("06/01/00"), mktime(126, 5, 1, 0, 0, 0), "year 00 is no year (Slurm's _get_date)");
        assert_eq!(t("uts1800000000"), 1_800_000_000);
        assert_eq!(
            parse_time("sideways", now, true).unwrap_err().to_string(),
            "Invalid time specification (pos=0): sideways"
        );
        assert!(parse_time("now+1fortnight", now, true).is_err());
        assert!(parse_time("25:00", now, true).is_err());
    }

    #[test]
    fn reservation_times_are_slurms_times() {
        let now = mktime(126, 5, 15, 12, 30, 0) as u64;
        let t = |text: &str| parse_time(text, now, false).unwrap();
        assert_eq!(t("now"), now as i64);
        assert_eq!(t("now+30minutes"), now as i64 + 1_800);
        assert_eq!(t("NOW+2hours"), now as i64 + 7_200);
        assert_eq!(t("now+1days"), now as i64 + 86_400);
        assert_eq!(t("2026-12-03T10:00:00"), mktime(126, 11, 3, 10, 0, 0));
        assert_eq!(t("10:15"), mktime(126, 5, 16, 10, 15, 0), "a time already past today is tomorrow's, looking ahead");
    }

    /// What Slurm 22.05's `sacct -S TEXT` printed for each (Debian's packages, on the peer this repository's
    /// tests compare with): the same place in every error, and the same texts accepted.
    #[test]
    fn errors_name_the_place_slurm_names() {
        let now = mktime(126, 11, 6, 7, 24, 0) as u64;
        for (text, pos) in [
            ("now+1fortnight", 4),
            ("sideways", 0),
            ("25:00", 0),
            ("2026-6-01", 0),
            ("06/01/2025", 8),
            ("Today", 1),
            ("2026-13-01", 5),
            ("13:00pm", 5),
            ("now+", 3),
            ("now x", 4),
            ("12:61", 3),
            ("12:30:99", 6),
            ("1:5", 3),
            ("0/5", -1),
            ("13/01", 0),
            ("06/32", 3),
            ("2026-12-32", 8),
            ("2026-12-x1", 8),
            ("06/01/2", 7),
            ("10:00 xm", 6),
            ("2026-12-01T10:00:61", 17),
            ("tomorrow 25:00", 9),
        ] {
            assert_eq!(
                parse_time(text, now, true).unwrap_err().to_string(),
                format!("Invalid time specification (pos={pos}): {text}")
            );
        }
        for text in ["12/31", "noon tomorrow", "now-2days", "teatime"] {
            assert!(parse_time(text, now, true).is_ok(), "{text}");
        }
    }
}

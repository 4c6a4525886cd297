//! Time as Slurm's commands read and write it, in the local zone: Slurm's `parse_time` (every command that takes
//! a time: `sacct -S/-E`, `sreport`, `scontrol ... StartTime=`), `ctime(3)` lines, the local clock and midnight.
//!
//! `sbatch --begin/--deadline` still parse with their own pure reader (`crate::sbatch_args::TimeSpec`, resolved
//! against an explicit UTC offset so a submission is reproducible in tests); folding it into this one is the last
//! step of having one time parser.

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
fn local_tm(secs: i64) -> libc::tm {
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

/// Slurm's `parse_time` (src/common/parse_time.c): `today`, `tomorrow`, `midnight`, `noon`, `fika`, `teatime`,
/// `HH:MM[:SS][AM|PM]`, `MMDD[YY]`, `MM/DD[/YY]`, `MM.DD[.YY]`, `YYYY-MM-DD[THH:MM[:SS]]`,
/// `now[{+|-}COUNT[seconds|minutes|hours|days|weeks]]` and `utsSECONDS`, in local time. `past` resolves a
/// time or date without a year toward the past (sacct) rather than the future (`--begin`). The error is Slurm's
/// line: `Invalid time specification (pos=N): TEXT`.
pub fn parse_time(text: &str, now_s: u64, past: bool) -> Result<i64, String> {
    let b = text.as_bytes();
    let bad = |pos: usize| format!("Invalid time specification (pos={pos}): {text}");
    let starts = |pos: usize, word: &str| {
        b.len() >= pos + word.len() && b[pos..pos + word.len()].eq_ignore_ascii_case(word.as_bytes())
    };
    if starts(0, "uts") {
        return match text[3..].parse::<i64>() {
            Ok(uts) if uts >= 1_000_000 => Ok(uts),
            _ => Err(bad(0)),
        };
    }
    let now = now_s as i64;
    let now_tm = local_tm(now);
    let (mut hour, mut minute, mut second) = (-1, -1, 0);
    let (mut month, mut mday, mut year) = (-1, -1, -1);
    let digit = |pos: usize| b.get(pos).filter(|c| c.is_ascii_digit()).map(|c| i32::from(c - b'0'));
    let mut pos = 0;
    while pos < b.len() && b[pos] != b'\n' {
        let c = b[pos];
        if c == b' ' || c == b'\t' || c == b'-' || c == b'T' {
            pos += 1;
            continue;
        }
        let mut set_date = |tm: &libc::tm| {
            month = tm.tm_mon;
            mday = tm.tm_mday;
            year = tm.tm_year;
        };
        if starts(pos, "today") {
            set_date(&now_tm);
            pos += 5;
            continue;
        }
        if starts(pos, "tomorrow") {
            set_date(&local_tm(now + 86_400));
            pos += 8;
            continue;
        }
        let named = [("midnight", 0), ("noon", 12), ("fika", 15), ("teatime", 16)];
        if let Some((word, h)) = named.iter().find(|(w, _)| starts(pos, w)) {
            (hour, minute, second) = (*h, 0, 0);
            pos += word.len();
            continue;
        }
        if starts(pos, "now") {
            let mut i = pos + 3;
            let mut delta: i64 = 0;
            loop {
                match b.get(i) {
                    Some(sign @ (b'+' | b'-')) => {
                        let (count, next) = parse_delta(b, i).ok_or_else(|| bad(i))?;
                        delta = if *sign == b'-' { -count } else { count };
                        i = next;
                        break;
                    }
                    Some(b' ' | b'\t') => i += 1,
                    None | Some(b'\n') => break,
                    Some(_) => return Err(bad(i)),
                }
            }
            let later = local_tm(now + delta);
            set_date(&later);
            (hour, minute, second) = (later.tm_hour, later.tm_min, later.tm_sec);
            pos = i;
            continue;
        }
        if !c.is_ascii_digit() {
            return Err(bad(pos));
        }
        if b.get(pos + 1) == Some(&b':') || b.get(pos + 2) == Some(&b':') {
            // HH:MM[:SS] [AM|PM]
            let mut p = pos;
            let mut hr = digit(p).ok_or_else(|| bad(p))?;
            p += 1;
            if b.get(p) != Some(&b':') {
                hr = hr * 10 + digit(p).ok_or_else(|| bad(p))?;
                p += 1;
            }
            if hr > 23 || b.get(p) != Some(&b':') {
                return Err(bad(p));
            }
            p += 1;
            let min =
                digit(p).and_then(|a| digit(p + 1).map(|b| a * 10 + b)).filter(|m| *m <= 59).ok_or_else(|| bad(p))?;
            p += 2;
            let mut sec = 0;
            if b.get(p) == Some(&b':') {
                p += 1;
                sec = digit(p)
                    .and_then(|a| digit(p + 1).map(|b| a * 10 + b))
                    .filter(|s| *s <= 59)
                    .ok_or_else(|| bad(p))?;
                p += 2;
            }
            while matches!(b.get(p), Some(b' ' | b'\t')) {
                p += 1;
            }
            if starts(p, "pm") {
                hr += 12;
                if hr == 24 {
                    hr = 12;
                } else if hr > 23 {
                    return Err(bad(p));
                }
                p += 2;
            } else if starts(p, "am") {
                if hr == 12 {
                    hr = 0;
                } else if hr > 11 {
                    return Err(bad(p));
                }
                p += 2;
            }
            (hour, minute, second) = (hr, min, sec);
            pos = p;
            continue;
        }
        // A date: YYYY-MM-DD, or MMDD[YY], MM/DD[/YY], MM.DD[.YY].
        let mut p = pos;
        let two = |p: &mut usize| -> Option<i32> {
            let mut v = digit(*p)?;
            *p += 1;
            if let Some(d) = digit(*p) {
                v = v * 10 + d;
                *p += 1;
            }
            Some(v)
        };
        if b.len() >= pos + 8 && b[pos + 4] == b'-' && b.get(pos + 7) == Some(&b'-') {
            let yr = (0..4).try_fold(0, |acc, k| digit(pos + k).map(|d| acc * 10 + d)).ok_or_else(|| bad(pos))?;
            p += 5;
            let mon = two(&mut p).filter(|m| (1..=12).contains(m)).ok_or_else(|| bad(p))?;
            p += 1;
            let day = two(&mut p).filter(|d| (1..=31).contains(d)).ok_or_else(|| bad(p))?;
            (month, mday, year) = (mon - 1, day, yr - 1900);
            pos = p;
            continue;
        }
        let mon = two(&mut p).filter(|m| (1..=12).contains(m)).ok_or_else(|| bad(p))?;
        if matches!(b.get(p), Some(b'.' | b'/')) {
            p += 1;
        }
        let day = two(&mut p).filter(|d| (1..=31).contains(d)).ok_or_else(|| bad(p))?;
        if matches!(b.get(p), Some(b'.' | b'/')) {
            p += 1;
        }
        // A two-digit year; `00` is no year, as in Slurm's _get_date (`if (yr) *year = yr + 100`).
        let yr = match digit(p) {
            Some(a) => {
                let b2 = digit(p + 1).ok_or_else(|| bad(p + 1))?;
                p += 2;
                if a * 10 + b2 == 0 { -1 } else { a * 10 + b2 + 100 }
            }
            None => -1,
        };
        (month, mday) = (mon - 1, day);
        if yr != -1 {
            year = yr;
        }
        pos = p;
    }
    if hour == -1 && month == -1 {
        return Ok(0);
    }
    if hour == -1 {
        (hour, minute) = (0, 0);
    } else if month == -1 {
        let later = past || hour > now_tm.tm_hour || (hour == now_tm.tm_hour && minute > now_tm.tm_min);
        let day = if later { now_tm } else { local_tm(now + 86_400) };
        (month, mday, year) = (day.tm_mon, day.tm_mday, day.tm_year);
    }
    if year == -1 {
        year = if past {
            if month > now_tm.tm_mon { now_tm.tm_year - 1 } else { now_tm.tm_year }
        } else if (month, mday, hour, minute) > (now_tm.tm_mon, now_tm.tm_mday, now_tm.tm_hour, now_tm.tm_min) {
            now_tm.tm_year
        } else {
            now_tm.tm_year + 1
        };
    }
    match mktime(year, month, mday, hour, minute, second) {
        -1 => Err(bad(pos)),
        t => Ok(t),
    }
}

/// `+COUNT[unit]` after `now`, from the sign at `sign`: the seconds and the index after it.
fn parse_delta(b: &[u8], sign: usize) -> Option<(i64, usize)> {
    let mut i = sign + 1;
    let mut count: i64 = 0;
    let mut digits = 0;
    while i < b.len() && b[i] != b'\n' {
        if b[i] == b' ' || b[i] == b'\t' {
            i += 1;
            continue;
        }
        if let Some((unit, mult)) = crate::sbatch_args::DELTA_UNITS
            .iter()
            .find(|(u, _)| b.len() >= i + u.len() && b[i..i + u.len()].eq_ignore_ascii_case(u.as_bytes()))
        {
            count = count.checked_mul(*mult)?;
            i += unit.len();
            break;
        }
        if b[i].is_ascii_digit() {
            count = count.checked_mul(10)?.checked_add(i64::from(b[i] - b'0'))?;
            digits += 1;
            i += 1;
            continue;
        }
        return None;
    }
    (digits > 0).then_some((count, i))
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
        assert_eq!(parse_time("sideways", now, true).unwrap_err(), "Invalid time specification (pos=0): sideways");
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
}

//! The wall clock, read in one place: for the processes' edges (credential expiry, display, journals, leases on
//! disk), never for the replicated state, whose time comes from the log.

/// Milliseconds since the Unix epoch on this host's clock (0 if the clock is before 1970; `u64::MAX` far beyond).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `ms` as this host's local time the way Slurm writes timestamps (`2026-12-06T21:30:00`), or `None` where the
/// C library cannot convert it.
pub fn local_iso(ms: u64) -> Option<String> {
    let secs = (ms / 1000) as libc::time_t;
    // SAFETY: tm is plain data that localtime_r fills.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r reads `secs` and writes only into `tm`.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return None;
    }
    Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    ))
}

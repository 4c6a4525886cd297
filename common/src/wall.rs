//! The wall clock, read in one place: for the processes' edges (credential expiry, display, journals, leases on
//! disk), never for the replicated state, whose time comes from the log.

/// Milliseconds since the Unix epoch on this host's clock (0 if the clock is before 1970; `u64::MAX` far beyond).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

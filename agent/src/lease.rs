//! The node's lease, on disk where every task's supervisor can see it.
//!
//! The agent renews the lease whenever a leader backed by a quorum answers its heartbeat, and writes its expiry
//! to `STATE_DIR/lease`. Each supervisor checks that file while its task runs and kills the task the moment the
//! lease has expired. So no task outlives its node's lease, even when the agent itself has crashed or hangs
//! (supervisors outlive the agent by design): by the time the leader declares the node down and requeues its
//! jobs, their tasks are dead.
//!
//! Times are `CLOCK_BOOTTIME` milliseconds: the same clock for every process on the host, never set back, and
//! still running while the host is suspended.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The lease file's name in the agent's state directory.
pub const LEASE_FILE: &str = "lease";
/// How often a supervisor without a pidfd (an old kernel) looks at its task and the lease.
pub const CHECK_INTERVAL_MS: u64 = 100;
/// The longest a supervisor sleeps between two looks at the lease (a renewal moves the expiry it sleeps to).
pub const MAX_CHECK_INTERVAL_MS: u64 = 1_000;

/// Milliseconds of `CLOCK_BOOTTIME`.
pub fn boottime_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer; CLOCK_BOOTTIME exists on every Linux the agent supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
    ts.tv_sec as u64 * 1_000 + ts.tv_nsec as u64 / 1_000_000
}

/// The lease's expiry as a boot-clock time, from an `Instant` of this process.
pub fn to_boottime_ms(at: Instant) -> u64 {
    let now = Instant::now();
    let now_ms = boottime_ms();
    if at >= now {
        now_ms + (at - now).as_millis() as u64
    } else {
        now_ms.saturating_sub((now - at).as_millis() as u64)
    }
}

/// The `Instant` of a boot-clock time (a restarted agent takes over the lease its predecessor held).
pub fn from_boottime_ms(expires_ms: u64) -> Instant {
    let now = Instant::now();
    let now_ms = boottime_ms();
    if expires_ms >= now_ms {
        now + Duration::from_millis(expires_ms - now_ms)
    } else {
        now.checked_sub(Duration::from_millis(now_ms - expires_ms)).unwrap_or(now)
    }
}

/// Writes the expiry atomically (a reader sees the old or the new value, never half of one).
pub fn write(path: &Path, expires_boottime_ms: u64) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{expires_boottime_ms}\n"))?;
    std::fs::rename(&tmp, path)
}

/// The expiry in the file, if it holds one.
pub fn read(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().parse().ok()
}

/// Whether the lease in `path` has expired. An unreadable lease counts as expired: a task runs only under a
/// lease the agent wrote.
pub fn expired(path: &Path) -> bool {
    read(path).is_none_or(|expires| boottime_ms() >= expires)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_and_a_missing_one_counts_as_expired() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEASE_FILE);
        assert!(expired(&path), "no file: expired");
        write(&path, boottime_ms() + 60_000).unwrap();
        assert!(!expired(&path));
        write(&path, boottime_ms().saturating_sub(1)).unwrap();
        assert!(expired(&path));
        std::fs::write(&path, "garbage").unwrap();
        assert!(expired(&path), "unreadable: expired");
    }

    #[test]
    fn instants_and_boot_clock_times_convert_both_ways() {
        let at = Instant::now() + Duration::from_secs(5);
        let back = from_boottime_ms(to_boottime_ms(at));
        let diff = if back > at { back - at } else { at - back };
        assert!(diff < Duration::from_millis(5), "{diff:?}");
    }
}

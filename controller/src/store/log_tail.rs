//! The newest entries of the Raft log, decoded, in memory.
//!
//! Every entry is read back soon after it is appended: by the leader's replication to each follower, and by the
//! state machine on every replica when it applies it. Read from RocksDB, each of those reads built an iterator
//! (a reference on every memtable and table file) and decoded the entries again: at 64 clients submitting, the
//! iterators alone were about 6 % of the leader's CPU. The tail answers those reads from the entries as they
//! were appended. It is a cache, never the record: an entry is in the tail only after its write to RocksDB
//! succeeded, and whatever the tail does not hold is read from disk as before.

use std::collections::VecDeque;

use openraft::entry::RaftEntry;

use crate::types::Entry;

/// The most entries the tail keeps. Readers lag the newest entry by one replication or apply batch, a few
/// hundred entries under load; a follower further behind reads from disk.
pub const MAX_TAIL_ENTRIES: usize = 4_096;
/// The most encoded bytes the tail keeps (decoded, entries take about two to three times as much memory).
pub const MAX_TAIL_BYTES: usize = 4 * 1024 * 1024;

/// A suffix of the log: consecutive entries ending at the last one appended.
///
/// Invariant: when not empty, `entries` are consecutive by index and hold the same entries as the stored log at
/// those indexes, and the last of them is the stored log's last entry.
#[derive(Default)]
pub struct LogTail {
    /// Each entry with its encoded size.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl LogTail {
    /// Records entries just written to the log (consecutive, in order, with their encoded sizes). Entries that
    /// do not follow the tail's last one start a new tail: the stored log is the authority on what lies between.
    pub fn appended(&mut self, entries: impl IntoIterator<Item = (Entry, usize)>) {
        for (entry, size) in entries {
            let index = entry.index();
            match (self.first_index(), self.last_index()) {
                (_, Some(last)) if index == last + 1 => {}
                // Overwriting: what followed the overwritten entry is gone from the log too.
                (Some(first), Some(last)) if first <= index && index <= last => self.truncate_from(index),
                _ => self.clear(),
            }
            self.bytes += size;
            self.entries.push_back((entry, size));
            while self.entries.len() > MAX_TAIL_ENTRIES || (self.bytes > MAX_TAIL_BYTES && self.entries.len() > 1) {
                self.pop_front();
            }
        }
    }

    /// The log dropped every entry from `index` on.
    pub fn truncate_from(&mut self, index: u64) {
        while self.last_index().is_some_and(|last| last >= index) {
            let (_, size) = self.entries.pop_back().expect("not empty");
            self.bytes -= size;
        }
    }

    /// The log dropped every entry up to and including `index`.
    pub fn purge_through(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            self.pop_front();
        }
    }

    /// The entries from `start` on while `wanted` accepts their index (at most `limit`), or `None` when the tail
    /// does not begin at or before `start`: the caller then reads the stored log. Reading past the last entry
    /// returns what there is, as the stored log would.
    pub fn read(&self, start: u64, limit: usize, wanted: impl Fn(u64) -> bool) -> Option<Vec<Entry>> {
        let first = self.first_index()?;
        let last = self.last_index()?;
        if start < first {
            return None;
        }
        if start > last {
            return Some(Vec::new());
        }
        let offset = usize::try_from(start - first).expect("tail offsets fit in memory");
        Some(
            self.entries
                .range(offset..)
                .map(|(entry, _)| entry)
                .take_while(|entry| wanted(entry.index()))
                .take(limit)
                .cloned()
                .collect(),
        )
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }

    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(entry, _)| entry.index())
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(entry, _)| entry.index())
    }

    #[cfg(test)]
    fn indexes(&self) -> Vec<u64> {
        self.entries.iter().map(|(entry, _)| entry.index()).collect()
    }
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry;
    use openraft::vote::RaftLeaderId;

    use super::*;
    use crate::types::LogId;

    fn entry(term: u64, index: u64) -> (Entry, usize) {
        let log_id = LogId::new(openraft::vote::leader_id_adv::CommittedLeaderId::new(term, 1), index);
        (Entry::new_blank(log_id), 100)
    }

    fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<(Entry, usize)> {
        indexes.map(|i| entry(term, i)).collect()
    }

    #[test]
    fn reads_inside_the_tail_come_from_it_and_reads_before_it_go_to_disk() {
        let mut tail = LogTail::default();
        tail.appended(entries(1, 10..=20));
        let read = tail.read(12, 100, |i| i < 15).expect("in the tail");
        assert_eq!(read.iter().map(|e| e.index()).collect::<Vec<_>>(), vec![12, 13, 14]);
        assert_eq!(tail.read(18, 100, |_| true).expect("in the tail").len(), 3, "up to the last entry");
        assert_eq!(tail.read(25, 100, |_| true), Some(Vec::new()), "past the end: nothing, as on disk");
        assert_eq!(tail.read(9, 100, |_| true), None, "before the tail: the caller reads the disk");
        assert_eq!(tail.read(10, 2, |_| true).expect("in the tail").len(), 2, "the read limit holds");
    }

    #[test]
    fn an_overwrite_drops_what_followed_the_overwritten_entry() {
        let mut tail = LogTail::default();
        tail.appended(entries(1, 1..=10));
        // A new leader's entry 6 replaces the old 6..=10 (openraft truncates first; the tail copes either way).
        tail.appended(vec![entry(2, 6)]);
        assert_eq!(tail.indexes(), vec![1, 2, 3, 4, 5, 6]);
        let six = &tail.read(6, 1, |_| true).expect("in the tail")[0];
        assert_eq!(six.log_id(), entry(2, 6).0.log_id(), "the new entry, not the old one");
        tail.truncate_from(4);
        assert_eq!(tail.indexes(), vec![1, 2, 3]);
    }

    #[test]
    fn a_gap_starts_a_new_tail_and_a_purge_drops_the_front() {
        let mut tail = LogTail::default();
        tail.appended(entries(1, 1..=5));
        tail.appended(vec![entry(1, 9)]);
        assert_eq!(tail.indexes(), vec![9], "entries 6..=8 are not known here: only the disk has them");
        assert_eq!(tail.read(7, 10, |_| true), None);
        tail.appended(entries(1, 10..=12));
        tail.purge_through(10);
        assert_eq!(tail.indexes(), vec![11, 12]);
        tail.purge_through(100);
        assert_eq!(tail.indexes(), Vec::<u64>::new());
        assert_eq!(tail.read(11, 10, |_| true), None, "an empty tail sends every read to disk");
    }

    #[test]
    fn the_tail_keeps_a_bounded_number_of_entries_and_bytes() {
        let mut tail = LogTail::default();
        tail.appended((1..=(MAX_TAIL_ENTRIES as u64 + 10)).map(|i| entry(1, i)));
        assert_eq!(tail.entries.len(), MAX_TAIL_ENTRIES);
        assert_eq!(tail.first_index(), Some(11), "the oldest went first");
        let mut tail = LogTail::default();
        let big = MAX_TAIL_BYTES / 4 + 1;
        tail.appended((1..=8).map(|i| (entry(1, i).0, big)));
        assert!(tail.bytes <= MAX_TAIL_BYTES, "{} bytes kept", tail.bytes);
        assert_eq!(tail.indexes(), vec![6, 7, 8]);
        // One entry larger than the whole budget is still kept: the newest entry is always readable.
        tail.appended(vec![(entry(1, 9).0, MAX_TAIL_BYTES * 2)]);
        assert_eq!(tail.indexes(), vec![9]);
    }
}

//! Snapshot files: a point-in-time copy of every state machine record, built from a RocksDB snapshot and
//! streamed to replicas that fell behind the purged log.
//!
//! Layout: `MAGIC`, then records `[family u8][key len u32 BE][key][value len u32 BE][value]`, then a trailer
//! `[0xFF][record count u64 BE]` so that a truncated file is detected instead of installed.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::db::SM_FAMILIES;

const MAGIC: &[u8; 12] = b"DROVERSNAP1\n";
const TRAILER: u8 = 0xFF;
/// No record key or value in a snapshot may exceed this (the script limit is 4 MiB; leave room).
const MAX_RECORD_BYTES: u32 = 64 * 1024 * 1024;

/// A snapshot on disk. openraft moves it around as the state machine's `SnapshotData`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    pub path: PathBuf,
}

/// Writes records to a new snapshot file.
pub struct SnapshotWriter {
    out: BufWriter<File>,
    count: u64,
}

impl SnapshotWriter {
    pub fn create(path: &Path) -> io::Result<SnapshotWriter> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        out.write_all(MAGIC)?;
        Ok(SnapshotWriter { out, count: 0 })
    }

    pub fn record(&mut self, family: u8, key: &[u8], value: &[u8]) -> io::Result<()> {
        assert!((family as usize) < SM_FAMILIES.len(), "unknown family {family}");
        self.out.write_all(&[family])?;
        self.out.write_all(&(key.len() as u32).to_be_bytes())?;
        self.out.write_all(key)?;
        self.out.write_all(&(value.len() as u32).to_be_bytes())?;
        self.out.write_all(value)?;
        self.count += 1;
        Ok(())
    }

    /// Writes the trailer and fsyncs: a snapshot is only offered once it is durable.
    pub fn finish(mut self) -> io::Result<u64> {
        self.out.write_all(&[TRAILER])?;
        self.out.write_all(&self.count.to_be_bytes())?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(self.count)
    }
}

/// One record: column family index, key, value.
pub type Record = (u8, Vec<u8>, Vec<u8>);

/// Reads a snapshot file record by record.
pub struct SnapshotReader {
    input: BufReader<File>,
    count: u64,
    path: PathBuf,
}

fn invalid(path: &Path, what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("snapshot {}: {what}", path.display()))
}

impl SnapshotReader {
    pub fn open(path: &Path) -> io::Result<SnapshotReader> {
        let mut input = BufReader::with_capacity(1 << 20, File::open(path)?);
        let mut magic = [0u8; 12];
        input.read_exact(&mut magic).map_err(|_| invalid(path, "too short"))?;
        if &magic != MAGIC {
            return Err(invalid(path, "not a Drover snapshot of this format version"));
        }
        Ok(SnapshotReader { input, count: 0, path: path.to_path_buf() })
    }

    fn read_u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.input.read_exact(&mut b).map_err(|_| invalid(&self.path, "truncated record"))?;
        Ok(u32::from_be_bytes(b))
    }

    fn read_bytes(&mut self) -> io::Result<Vec<u8>> {
        let len = self.read_u32()?;
        if len > MAX_RECORD_BYTES {
            return Err(invalid(&self.path, "record larger than the format allows"));
        }
        let mut buf = vec![0u8; len as usize];
        self.input.read_exact(&mut buf).map_err(|_| invalid(&self.path, "truncated record"))?;
        Ok(buf)
    }

    /// The next record, or `None` after a valid trailer. A missing trailer or a count mismatch is an error.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        let mut family = [0u8; 1];
        self.input.read_exact(&mut family).map_err(|_| invalid(&self.path, "missing trailer (truncated file)"))?;
        if family[0] == TRAILER {
            let mut b = [0u8; 8];
            self.input.read_exact(&mut b).map_err(|_| invalid(&self.path, "truncated trailer"))?;
            if u64::from_be_bytes(b) != self.count {
                return Err(invalid(&self.path, "record count does not match the trailer"));
            }
            return Ok(None);
        }
        if family[0] as usize >= SM_FAMILIES.len() {
            return Err(invalid(&self.path, "unknown column family"));
        }
        let key = self.read_bytes()?;
        let value = self.read_bytes()?;
        self.count += 1;
        Ok(Some((family[0], key, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_truncation_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let mut w = SnapshotWriter::create(&path).unwrap();
        w.record(0, b"k1", b"v1").unwrap();
        w.record(3, &7u64.to_be_bytes(), b"{}").unwrap();
        assert_eq!(w.finish().unwrap(), 2);
        let mut r = SnapshotReader::open(&path).unwrap();
        assert_eq!(r.next_record().unwrap(), Some((0, b"k1".to_vec(), b"v1".to_vec())));
        assert!(r.next_record().unwrap().is_some());
        assert_eq!(r.next_record().unwrap(), None);

        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let mut r = SnapshotReader::open(&path).unwrap();
        let err = (0..3).find_map(|_| r.next_record().err()).expect("truncation must be an error");
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

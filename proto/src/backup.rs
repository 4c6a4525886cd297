//! The backup file: what `drover cluster backup FILE` writes and `drover-controller --restore FILE` reads.
//!
//! ```text
//! MAGIC                      "DROVERBACKUP1\n"
//! header length              u32 BE, at most MAX_HEADER_BYTES
//! header                     JSON (`BackupHeader`): where in the log the state is, who took it, its format
//! body                       the state machine's records in the snapshot transfer format (a replica's
//!                            `DROVERSNAP1` stream: records, then a trailer with their count)
//! checksum                   SHA-256 of everything before it
//! ```
//!
//! The leader writes the whole stream, checksum included, as it streams it; the client writes it to a temporary
//! file, syncs it, checks it again from disk and only then renames it into place. A restore checks the checksum
//! over the whole file before it touches the data directory, so a flipped byte or a cut file is refused, never
//! half-restored. Lives in the wire crate because both ends (the controller that writes and restores, the CLI
//! that verifies) read it.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

pub const BACKUP_MAGIC: &[u8; 14] = b"DROVERBACKUP1\n";
/// The header is a few hundred bytes; anything far larger is not a header.
pub const MAX_HEADER_BYTES: u32 = 1 << 20;
const CHECKSUM_BYTES: u64 = 32;
/// The backup file layout this build writes and reads.
pub const BACKUP_FORMAT: u32 = 1;

/// What a backup says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The file layout (`BACKUP_FORMAT`).
    pub backup_format: u32,
    /// The state records' format (`drover_state::FORMAT_VERSION` of the replica that took it): a newer build
    /// restores any version it can read in a data directory.
    pub state_format_version: u32,
    /// The last log entry the state includes.
    pub last_log_index: u64,
    pub last_log_term: u64,
    /// The replicas of the cluster it was taken from (id -> address), for the record.
    pub replicas: Vec<(u64, String)>,
    /// The replica that took it, and when (its wall clock, ms since the epoch; informational only).
    pub taken_by: u64,
    pub taken_at_ms: u64,
    /// The controller binary's version.
    pub binary_version: String,
}

#[derive(Debug, Error)]
pub enum BackupFileError {
    #[error("backup {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a Drover backup (no DROVERBACKUP1 header)")]
    NotABackup { path: PathBuf },
    #[error("backup {path} is damaged: {what}. Use another backup; this one cannot be restored.")]
    Damaged { path: PathBuf, what: String },
    #[error(
        "backup {path} has layout {found}; this build reads layout {BACKUP_FORMAT}. Restore it with the release that took it."
    )]
    Layout { path: PathBuf, found: u32 },
}

/// Writes a backup: `start` the header, then the body through `Write`, then `finish` appends the checksum.
pub struct BackupWriter<W: Write> {
    out: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> BackupWriter<W> {
    pub fn start(out: W, header: &BackupHeader) -> io::Result<BackupWriter<W>> {
        let json = serde_json::to_vec(header).map_err(io::Error::other)?;
        let mut writer = BackupWriter { out, hash: Sha256::new(), bytes: 0 };
        writer.write_all(BACKUP_MAGIC)?;
        writer.write_all(&(json.len() as u32).to_be_bytes())?;
        writer.write_all(&json)?;
        Ok(writer)
    }

    /// Appends the checksum and flushes; returns the file's size in bytes and its checksum (hex).
    pub fn finish(mut self) -> io::Result<(u64, String)> {
        let digest = self.hash.finalize_reset();
        self.out.write_all(&digest)?;
        self.out.flush()?;
        Ok((self.bytes + CHECKSUM_BYTES, hex(&digest)))
    }
}

impl<W: Write> Write for BackupWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A verified backup: its header, where its body lies in the file, its checksum.
#[derive(Debug, Clone)]
pub struct VerifiedBackup {
    pub header: BackupHeader,
    pub body_offset: u64,
    pub body_len: u64,
    pub sha256: String,
    pub file_bytes: u64,
}

/// Reads the whole file: magic, header, and the checksum over everything. Nothing is trusted before this passes.
pub fn verify_backup(path: &Path) -> Result<VerifiedBackup, BackupFileError> {
    let io_err = |source| BackupFileError::Io { path: path.to_path_buf(), source };
    let damaged = |what: &str| BackupFileError::Damaged { path: path.to_path_buf(), what: what.to_string() };
    let file = File::open(path).map_err(io_err)?;
    let file_bytes = file.metadata().map_err(io_err)?.len();
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut magic = [0u8; BACKUP_MAGIC.len()];
    if input.read_exact(&mut magic).is_err() || &magic != BACKUP_MAGIC {
        return Err(BackupFileError::NotABackup { path: path.to_path_buf() });
    }
    let mut len = [0u8; 4];
    input.read_exact(&mut len).map_err(|_| damaged("cut off inside its header"))?;
    let header_len = u32::from_be_bytes(len);
    if header_len > MAX_HEADER_BYTES {
        return Err(damaged("its header length is impossible"));
    }
    let body_offset = BACKUP_MAGIC.len() as u64 + 4 + header_len as u64;
    if file_bytes < body_offset + CHECKSUM_BYTES {
        return Err(damaged("cut off before its checksum"));
    }
    let mut json = vec![0u8; header_len as usize];
    input.read_exact(&mut json).map_err(|_| damaged("cut off inside its header"))?;
    let mut hash = Sha256::new();
    hash.update(magic);
    hash.update(len);
    hash.update(&json);
    let mut left = file_bytes - body_offset - CHECKSUM_BYTES;
    let body_len = left;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        input.read_exact(&mut buf[..n]).map_err(io_err)?;
        hash.update(&buf[..n]);
        left -= n as u64;
    }
    let mut stored = [0u8; CHECKSUM_BYTES as usize];
    input.read_exact(&mut stored).map_err(io_err)?;
    let digest = hash.finalize();
    if digest.as_slice() != stored {
        return Err(damaged("its SHA-256 checksum does not match its contents (a changed or cut file)"));
    }
    let header: BackupHeader = serde_json::from_slice(&json).map_err(|e| damaged(&format!("bad header: {e}")))?;
    if header.backup_format != BACKUP_FORMAT {
        return Err(BackupFileError::Layout { path: path.to_path_buf(), found: header.backup_format });
    }
    Ok(VerifiedBackup { header, body_offset, body_len, sha256: hex(&digest), file_bytes })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> BackupHeader {
        BackupHeader {
            backup_format: BACKUP_FORMAT,
            state_format_version: 7,
            last_log_index: 42,
            last_log_term: 3,
            replicas: vec![(1, "127.0.0.1:1".into())],
            taken_by: 1,
            taken_at_ms: 1,
            binary_version: "0.1.0".into(),
        }
    }

    fn write(path: &Path, body: &[u8]) -> (u64, String) {
        let mut writer = BackupWriter::start(File::create(path).unwrap(), &header()).unwrap();
        writer.write_all(body).unwrap();
        writer.finish().unwrap()
    }

    #[test]
    fn a_backup_verifies_and_finds_its_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        let (bytes, sha) = write(&path, b"the records");
        let verified = verify_backup(&path).unwrap();
        assert_eq!((verified.file_bytes, verified.sha256), (bytes, sha));
        assert_eq!(verified.header, header());
        let all = std::fs::read(&path).unwrap();
        let body = &all[verified.body_offset as usize..][..verified.body_len as usize];
        assert_eq!(body, b"the records");
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        write(&path, b"the records");
        let good = std::fs::read(&path).unwrap();
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            std::fs::write(&path, &bad).unwrap();
            let err = verify_backup(&path).expect_err("a flipped byte must be refused");
            assert!(
                matches!(err, BackupFileError::NotABackup { .. } | BackupFileError::Damaged { .. }),
                "byte {at}: {err}"
            );
            std::fs::write(&path, &good[..at]).unwrap();
            assert!(verify_backup(&path).is_err(), "a file cut at {at} must be refused");
        }
    }

    #[test]
    fn other_files_are_named_as_not_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.txt");
        std::fs::write(&path, "hello").unwrap();
        let err = verify_backup(&path).unwrap_err();
        assert!(err.to_string().contains("is not a Drover backup"), "{err}");
    }
}

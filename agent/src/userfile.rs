//! Files a job's user controls, as the root agent touches them: the node's privilege boundary in code.
//!
//! The agent runs as root; a job does not. Anything in a place the job's user can write may be a symbolic link to
//! a file the user may not read (`/etc/shadow`), a FIFO that blocks a reader forever, or a huge file. So the agent
//! never opens such a path by name alone: it opens it without following a final symbolic link, without blocking,
//! and then checks on the open descriptor that it is a regular file owned by the job's user. A file the user could
//! not have made fails the check, so the agent can only ever read back what the user could read themselves.
//!
//! Task directories are split the same way (see `crate::launch`): the task's control files (its launch, pid,
//! result and log files) live in a directory only root may write, and everything the task itself writes (its
//! script, the output streamed back to `srun`) in a `work` directory inside it that belongs to the job's user.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Whether this process runs as root (then it hands files to the job's user; a test agent runs as that user).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The task's own directory inside a task directory: the job's user's, mode 0700.
pub const WORK_DIR: &str = "work";
/// Mode of a task directory (the control files): root's; others may pass through to `work` (their own) but not
/// list or read anything.
pub const CONTROL_DIR_MODE: u32 = 0o711;
/// Capacity asked for each pipe a step's output streams through.
const STREAM_PIPE_BYTES: libc::c_int = 256 << 10;

/// Opens `path` for reading as a file the user `uid` owns: no symbolic link followed at the last component, no
/// blocking on a FIFO, and refused unless it is a regular file owned by `uid`.
pub fn open_owned_by(path: &Path, uid: u32) -> io::Result<File> {
    let file =
        OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(format!("{} is not a regular file", path.display())));
    }
    if meta.uid() != uid {
        return Err(io::Error::other(format!(
            "{} belongs to uid {}, not the job's uid {uid}",
            path.display(),
            meta.uid()
        )));
    }
    Ok(file)
}

/// Creates a task directory for control files: root's, mode [`CONTROL_DIR_MODE`] (also when it already existed,
/// so a directory an older agent handed to a user is taken back).
pub fn make_control_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(CONTROL_DIR_MODE).create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    if is_root() && meta.uid() != 0 {
        std::os::unix::fs::lchown(dir, Some(0), Some(0))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(CONTROL_DIR_MODE))
}

/// Creates `control/work` for the job's user (mode 0700) and, if `script` is given, the file `work/script` in it
/// (mode 0700), written before the directory is handed over, so nothing the user does can redirect the write.
/// Returns the work directory.
pub fn make_work_dir(control: &Path, uid: u32, gid: u32, script: Option<&[u8]>) -> io::Result<std::path::PathBuf> {
    let (work, ()) = make_work_dir_with(control, uid, gid, |work| {
        let Some(text) = script else { return Ok(()) };
        use std::io::Write;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(work.join("script"))?;
        file.write_all(text)?;
        if is_root() {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        Ok(())
    })?;
    Ok(work)
}

/// The name of a step task's input FIFO among [`make_step_work_dir`]'s streams.
pub const STDIN_FIFO: &str = "stdin";

/// Creates `control/work` for the job's user with a FIFO per name in `streams` (`stdout`, `stderr`: the output
/// streamed back to `srun`), made and opened for reading (without blocking) before the directory is handed over.
/// A pipe, not a file: the task's writes wait while the agent (and `srun` behind it) has not read what came
/// before, so a step's output never piles up on the node's disk. Returns the work directory and the read ends, in
/// the order of `streams`.
pub fn make_step_work_dir(
    control: &Path,
    uid: u32,
    gid: u32,
    streams: &[&str],
) -> io::Result<(std::path::PathBuf, Vec<File>)> {
    make_work_dir_with(control, uid, gid, |work| {
        let mut ends = Vec::with_capacity(streams.len());
        for name in streams {
            let path = work.join(name);
            let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::other(format!("{} has a NUL byte", path.display())))?;
            // SAFETY: a valid C string; mkfifo only creates a node (it fails if anything is there, link or not).
            if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // The agent reads the task's output FIFOs; it writes the input one (`stdin`), opened for reading too,
            // which Linux allows on a FIFO without waiting for the other side (the task opens it later).
            let end = OpenOptions::new()
                .read(true)
                .write(*name == STDIN_FIFO)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&path)?;
            if !std::os::unix::fs::FileTypeExt::is_fifo(&end.metadata()?.file_type()) {
                return Err(io::Error::other(format!("{} is not the FIFO just made", path.display())));
            }
            if is_root() {
                std::os::unix::fs::fchown(&end, Some(uid), Some(gid))?;
            }
            // A larger pipe than the default 64 KiB, so a fast writer waits less between the agent's reads; best
            // effort (the kernel caps what one user's pipes may hold).
            // SAFETY: fcntl on a descriptor we own; F_SETPIPE_SZ changes only the pipe's capacity.
            unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&end), libc::F_SETPIPE_SZ, STREAM_PIPE_BYTES) };
            ends.push(end);
        }
        Ok(ends)
    })
}

/// `control/work`, made by root (mode 0700), `fill`ed while it is still root's, then handed to `uid`.
fn make_work_dir_with<T>(
    control: &Path,
    uid: u32,
    gid: u32,
    fill: impl FnOnce(&Path) -> io::Result<T>,
) -> io::Result<(std::path::PathBuf, T)> {
    let work = control.join(WORK_DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&work) {
        Ok(()) => {}
        // A task directory is made once; a second launch into it is refused elsewhere. An existing work directory
        // is only reused if it is a real directory of this user.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(&work)?;
            if !meta.is_dir() || (meta.uid() != uid && meta.uid() != 0) {
                return Err(io::Error::other(format!("{} is not the job's own directory", work.display())));
            }
        }
        Err(e) => return Err(e),
    }
    let filled = fill(&work)?;
    if is_root() {
        std::os::unix::fs::lchown(&work, Some(uid), Some(gid))?;
    }
    Ok((work, filled))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> u32 {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn only_a_regular_file_of_the_user_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out");
        std::fs::write(&file, b"mine\n").unwrap();
        assert!(open_owned_by(&file, me()).is_ok());
        let err = open_owned_by(&file, me() + 1).unwrap_err().to_string();
        assert!(err.contains("not the job's uid"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert!(open_owned_by(&link, me()).is_err(), "a link is not followed");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path; mkfifo only creates a node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = open_owned_by(&fifo, me()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "a FIFO neither blocks nor is read: {err}");
    }

    #[test]
    fn the_script_is_written_before_the_work_directory_is_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("1.0.batch");
        make_control_dir(&control).unwrap();
        let work = make_work_dir(&control, me(), me(), Some(b"#!/bin/sh\n")).unwrap();
        assert_eq!(std::fs::read(work.join("script")).unwrap(), b"#!/bin/sh\n");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&control), mode(&work), mode(&work.join("script"))), (0o711, 0o700, 0o700));
        // A second script into the same directory is refused rather than overwritten.
        assert!(make_work_dir(&control, me(), me(), Some(b"other")).is_err());
    }
}

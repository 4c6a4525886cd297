//! The submitting host as Slurm's commands record it in a job: its name (`SLURM_SUBMIT_HOST`) and the submitting
//! process's scheduling priority (`SLURM_PRIO_PROCESS`).

/// This host's name (`localhost` when the C library cannot tell).
pub fn host_name() -> String {
    let mut buf = [0 as libc::c_char; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into `buf`.
    if unsafe { libc::gethostname(buf.as_mut_ptr(), buf.len()) } != 0 {
        return "localhost".to_string();
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within `buf` (forced above).
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// This process's nice value, as Slurm's commands read it with getpriority for `SLURM_PRIO_PROCESS`.
pub fn nice_value() -> i32 {
    // SAFETY: getpriority has no memory-safety preconditions; who = 0 is this process.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

/// What a submission records of where it came from: the host's name and the process's nice value.
pub fn submission() -> (String, i32) {
    (host_name(), nice_value())
}
